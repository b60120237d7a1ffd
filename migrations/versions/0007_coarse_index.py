"""Coarse vector index: the sign bits of every stored vector, for a far list over the whole corpus (issue 17).

SQLite: two WITHOUT ROWID tables, ``memories_coarse`` and ``episodes_coarse``,
holding each quantisable vector's sign bits (sqlite-vec
``vec_quantize_binary``) beside copies of the isolation columns, filled from
the rows already there and kept equal by six triggers
(``cpersona.storage.coarse_sqlite``, the single copy of the DDL).

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

# Module-level, so the schema_objects health check (services/health/integrity.py)
# knows the triggers' canonical text, as it knows every revision's.
TRIGGERS_DDL = coarse_sqlite.TRIGGERS_DDL


def upgrade() -> None:
    from alembic import op

    if op.get_bind().dialect.name != "sqlite":
        return
    for ddl in (*coarse_sqlite.TABLES_DDL, *TRIGGERS_DDL, *coarse_sqlite.BACKFILL):
        op.execute(ddl)


def downgrade() -> None:
    from alembic import op

    if op.get_bind().dialect.name != "sqlite":
        return
    for name in coarse_sqlite.TRIGGER_NAMES:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    for name in coarse_sqlite.TABLE_NAMES:
        op.execute(f"DROP TABLE IF EXISTS {name}")
