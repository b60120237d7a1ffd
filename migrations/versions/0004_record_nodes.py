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

TRIGGER_NAMES = (
    "record_nodes_memories_ad", "record_nodes_memories_au", "record_nodes_episodes_ad", "record_nodes_episodes_au",
)


def upgrade() -> None:
    for ddl in (TABLE_DDL, *TRIGGERS_DDL):
        op.execute(ddl)


def downgrade() -> None:
    for name in TRIGGER_NAMES:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.execute("DROP TABLE IF EXISTS record_nodes")
