"""Record nodes: the overflow tree of records longer than the embedding window.

The layout is the 2.6 line's v14 step (spec storage.md §6.1), so the reference
opens our file unchanged (LR-5). Nodes hold offsets and vectors, never text, and
are derived: the four triggers delete a record's nodes when the record is
deleted or its text changes (LR-1), so a node can never describe text that is
no longer there; a rebuild is queued by the writer, not by the database.

Recorded in ``alembic_version`` only; ``schema_version`` stays 13 (decision 8).

Revision ID: 0004_record_nodes
Revises: 0003_associations
"""

from __future__ import annotations

from alembic import op

revision = "0004_record_nodes"
down_revision = "0003_associations"
branch_labels = None
depends_on = None

TABLE_DDL = """CREATE TABLE IF NOT EXISTS record_nodes (
  parent_kind      TEXT    NOT NULL,
  parent_id        INTEGER NOT NULL,
  node_index       INTEGER NOT NULL,
  start_char       INTEGER NOT NULL,
  end_char         INTEGER NOT NULL,
  token_count      INTEGER NOT NULL,
  "window"         INTEGER NOT NULL,
  embedding        BLOB,
  embedding_model  TEXT    NOT NULL DEFAULT '',
  PRIMARY KEY (parent_kind, parent_id, node_index))"""

TRIGGERS_DDL = (
    """CREATE TRIGGER IF NOT EXISTS record_nodes_memories_ad AFTER DELETE ON memories BEGIN
  DELETE FROM record_nodes WHERE parent_kind = 'mem' AND parent_id = old.id;
END""",
    """CREATE TRIGGER IF NOT EXISTS record_nodes_memories_au AFTER UPDATE OF content ON memories
WHEN old.content <> new.content BEGIN
  DELETE FROM record_nodes WHERE parent_kind = 'mem' AND parent_id = old.id;
END""",
    """CREATE TRIGGER IF NOT EXISTS record_nodes_episodes_ad AFTER DELETE ON episodes BEGIN
  DELETE FROM record_nodes WHERE parent_kind = 'ep' AND parent_id = old.id;
END""",
    """CREATE TRIGGER IF NOT EXISTS record_nodes_episodes_au AFTER UPDATE OF summary ON episodes
WHEN old.summary <> new.summary BEGIN
  DELETE FROM record_nodes WHERE parent_kind = 'ep' AND parent_id = old.id;
END""",
)

# PostgreSQL: BYTEA for the vector, and the four cascades as trigger functions.
PG_TABLE_DDL = TABLE_DDL.replace("BLOB", "BYTEA").replace("parent_id        INTEGER", "parent_id        BIGINT")


def _pg_trigger(name: str, event: str, table: str, kind: str, when: str = "") -> tuple[str, str]:
    return (
        f"""CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM record_nodes WHERE parent_kind = '{kind}' AND parent_id = old.id;
  RETURN NULL;
END $$""",
        f"CREATE TRIGGER {name} AFTER {event} ON {table} FOR EACH ROW"
        + (f" WHEN ({when})" if when else "")
        + f" EXECUTE FUNCTION {name}()",
    )


PG_TRIGGERS_DDL = (
    *_pg_trigger("record_nodes_memories_ad", "DELETE", "memories", "mem"),
    *_pg_trigger(
        "record_nodes_memories_au", "UPDATE OF content", "memories", "mem", "old.content IS DISTINCT FROM new.content"
    ),
    *_pg_trigger("record_nodes_episodes_ad", "DELETE", "episodes", "ep"),
    *_pg_trigger(
        "record_nodes_episodes_au", "UPDATE OF summary", "episodes", "ep", "old.summary IS DISTINCT FROM new.summary"
    ),
)
_PG_TRIGGER_TABLES = ("memories", "memories", "episodes", "episodes")

TRIGGER_NAMES = (
    "record_nodes_memories_ad",
    "record_nodes_memories_au",
    "record_nodes_episodes_ad",
    "record_nodes_episodes_au",
)


def _is_postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    for ddl in (PG_TABLE_DDL, *PG_TRIGGERS_DDL) if _is_postgres() else (TABLE_DDL, *TRIGGERS_DDL):
        op.execute(ddl)


def downgrade() -> None:
    if _is_postgres():
        for name, table in zip(TRIGGER_NAMES, _PG_TRIGGER_TABLES):
            op.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
            op.execute(f"DROP FUNCTION IF EXISTS {name}()")
        op.execute("DROP TABLE IF EXISTS record_nodes")
        return
    for name in TRIGGER_NAMES:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.execute("DROP TABLE IF EXISTS record_nodes")
