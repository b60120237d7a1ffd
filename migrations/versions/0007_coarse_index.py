"""Coarse vector index: the sign bits of every stored vector, for a far list over the whole corpus (issue 17).

SQLite: two WITHOUT ROWID tables, ``memories_coarse`` and ``episodes_coarse``,
holding each quantisable vector's sign bits (sqlite-vec
``vec_quantize_binary``) beside copies of the isolation columns, filled from
the rows already there. No trigger is stored: the triggers that keep the
index in step call sqlite-vec, so each of our connections creates them TEMP
(``cpersona.storage.coarse_sqlite``, the single copy of the DDL), and a writer
without the extension can still write the file. A pre-release build of this
revision stored them; they are dropped here.

PostgreSQL: nothing here (pgvector's own indexes serve that engine).

Recorded in ``alembic_version`` only; ``schema_version`` stays 13 (decision 8).

Revision ID: 0007_coarse_index
Revises: 0006_word_index
"""

from __future__ import annotations

from cpersona.storage import coarse_sqlite

revision = "0007_coarse_index"
down_revision = "0006_word_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from alembic import op

    if op.get_bind().dialect.name != "sqlite":
        return
    for name in coarse_sqlite.TRIGGER_NAMES:
        op.execute(f"DROP TRIGGER IF EXISTS main.{name}")
    for ddl in (*coarse_sqlite.TABLES_DDL, *coarse_sqlite.BACKFILL):
        op.execute(ddl)


def downgrade() -> None:
    from alembic import op

    if op.get_bind().dialect.name != "sqlite":
        return
    for name in coarse_sqlite.TRIGGER_NAMES:  # this connection's; the others drop theirs at checkout
        op.execute(f"DROP TRIGGER IF EXISTS temp.{name}")
    for name in coarse_sqlite.TABLE_NAMES:
        op.execute(f"DROP TABLE IF EXISTS {name}")
