"""Change log of memories and episodes, for process-held near vector windows on PostgreSQL (issue 17).

PostgreSQL: ``vector_changes`` (one entry per inserted, deleted or truncated
row and per update of a column the held copy reads, with the writing
transaction's id), ``vector_change_state`` (the first xid pruning may have
removed), and the triggers on ``memories`` and ``episodes`` that write it
(``cpersona.storage.vector_near_postgres``, the single copy of the DDL). A
process that holds the near window (vector_near_postgres.NearIndex) follows
other servers' writes through it. Nothing is backfilled: a copy is loaded
from the tables themselves, with the snapshot it was read in.

SQLite: nothing here (revision 0008's ``coarse_changes`` serves that engine).

Recorded in ``alembic_version`` only; ``schema_version`` stays 13 (decision 8).

Revision ID: 0009_vector_change_log
Revises: 0008_coarse_change_log
"""

from __future__ import annotations

from cpersona.storage import vector_near_postgres as near

revision = "0009_vector_change_log"
down_revision = "0008_coarse_change_log"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from alembic import op

    if op.get_bind().dialect.name != "postgresql":
        return
    for ddl in near.CHANGE_LOG_DDL:
        op.execute(ddl)
    for table in ("memories", "episodes"):
        for ddl in near.triggers_ddl(table):
            op.execute(ddl)


def downgrade() -> None:
    from alembic import op

    if op.get_bind().dialect.name != "postgresql":
        return
    for table in ("memories", "episodes"):
        for name in near.trigger_names(table):
            op.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
    for function in near.DROP_FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {function}")
    op.execute(f"DROP TABLE IF EXISTS {near.CHANGE_STATE}")
    op.execute(f"DROP TABLE IF EXISTS {near.CHANGE_LOG}")
