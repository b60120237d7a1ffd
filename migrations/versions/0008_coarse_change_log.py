"""Change log of the coarse vector index, for process-held copies of it (issue 17).

SQLite: ``coarse_changes`` (one entry per insert / delete / update of a
``memories_coarse`` or ``episodes_coarse`` row, by key, AUTOINCREMENT
sequence) and the stored triggers on the two coarse tables that write it
(``cpersona.storage.coarse_sqlite``, the single copy of the DDL). A process
that holds the index in memory (``cpersona.storage.vector_index_sqlite``)
follows other processes' writes by reading the entries past its watermark.
The triggers call no extension function, so a writer without sqlite-vec can
still write the file. Nothing is backfilled: a copy is loaded from the coarse
tables themselves, with the log's head read in the same snapshot.

PostgreSQL: nothing here (pgvector's own indexes serve that engine).

Recorded in ``alembic_version`` only; ``schema_version`` stays 13 (decision 8).

Revision ID: 0008_coarse_change_log
Revises: 0007_coarse_index
"""

from __future__ import annotations

from cpersona.storage import coarse_sqlite

revision = "0008_coarse_change_log"
down_revision = "0007_coarse_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from alembic import op

    if op.get_bind().dialect.name != "sqlite":
        return
    for ddl in (*coarse_sqlite.CHANGE_LOG_DDL, *coarse_sqlite.CHANGE_LOG_TRIGGERS_DDL):
        op.execute(ddl)


def downgrade() -> None:
    from alembic import op

    if op.get_bind().dialect.name != "sqlite":
        return
    for name in coarse_sqlite.CHANGE_LOG_TRIGGER_NAMES:
        op.execute(f"DROP TRIGGER IF EXISTS main.{name}")
    op.execute(f"DROP TABLE IF EXISTS {coarse_sqlite.CHANGE_LOG}")
