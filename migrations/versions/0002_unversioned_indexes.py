"""The three indexes the reference creates on every boot without a version (spec storage.md §6.7).

Databases adopted from later 2.5 builds already carry them, and the reference's
health checks look for them by name and definition (health.md R-26, "warn"), so
fresh databases get them too. They do not change any answer, only speed
(embedding backfill scans and time-span queries). schema_version is not touched:
it stays 13 (spec README decision 8).

Revision ID: 0002_unversioned_indexes
Revises: 0001_v13
"""

from __future__ import annotations

from alembic import op

revision = "0002_unversioned_indexes"
down_revision = "0001_v13"
branch_labels = None
depends_on = None

INDEXES_DDL = (
    "CREATE INDEX IF NOT EXISTS idx_memories_lost_embedding ON memories (id) WHERE embedding IS NULL",
    "CREATE INDEX IF NOT EXISTS idx_episodes_lost_embedding ON episodes (id) WHERE embedding IS NULL",
    "CREATE INDEX IF NOT EXISTS idx_memories_span ON memories (agent_id, timestamp, project_id, channel)",
)
INDEX_NAMES = ("idx_memories_lost_embedding", "idx_episodes_lost_embedding", "idx_memories_span")


def upgrade() -> None:
    for ddl in INDEXES_DDL:
        op.execute(ddl)


def downgrade() -> None:
    for name in INDEX_NAMES:
        op.execute(f"DROP INDEX IF EXISTS {name}")
