"""Declared associations: entities, their aliases and mentions, and relations.

The layout is the 2.6 line's v15 step, character for character (spec
storage.md §6.2), so that ``import-db`` copies a 2.6 database's graph straight
across and a database of ours opens unchanged under the reference (LR-5: its
``CREATE … IF NOT EXISTS`` would silently keep a table of any other shape).
The three triggers keep a declaration from outliving its endpoints (LR-2):
deleting a memory or episode removes the mentions and relations that name it,
deleting an entity removes its aliases, mentions and relations. A text edit
touches none of them.

One liberty with the text: the relations' UNIQUE clause is on one line. SQLite
reads both spellings alike, but SQLAlchemy's reflection of unique constraints
does not look past a line break, and Alembic would then report the constraint
as missing (the no-drift check of spec IMPL-4).

Recorded in ``alembic_version`` only: ``schema_version`` stays 13, because 15 is
the 2.6 line's number for a database that also has record nodes and more
(spec README decision 8, LR-4).

Revision ID: 0003_associations
Revises: 0002_unversioned_indexes
"""

from __future__ import annotations

from alembic import op

revision = "0003_associations"
down_revision = "0002_unversioned_indexes"
branch_labels = None
depends_on = None

TABLES_DDL = (
    """CREATE TABLE IF NOT EXISTS entities (
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  agent_id     TEXT NOT NULL,
  project_id   TEXT NOT NULL DEFAULT '',
  channel      TEXT NOT NULL DEFAULT '',
  name         TEXT NOT NULL,
  normalized   TEXT NOT NULL,
  declared_by  TEXT NOT NULL,
  created_at   TEXT NOT NULL,
  UNIQUE (agent_id, project_id, channel, normalized))""",
    """CREATE TABLE IF NOT EXISTS entity_aliases (
  entity_id   INTEGER NOT NULL,
  alias       TEXT    NOT NULL,
  normalized  TEXT    NOT NULL,
  PRIMARY KEY (entity_id, normalized))""",
    "CREATE INDEX IF NOT EXISTS idx_entity_aliases_normalized ON entity_aliases (normalized)",
    """CREATE TABLE IF NOT EXISTS entity_mentions (
  entity_id    INTEGER NOT NULL,
  ref          TEXT    NOT NULL,
  declared_by  TEXT    NOT NULL,
  created_at   TEXT    NOT NULL,
  PRIMARY KEY (entity_id, ref))""",
    "CREATE INDEX IF NOT EXISTS idx_entity_mentions_ref ON entity_mentions (ref)",
    """CREATE TABLE IF NOT EXISTS relations (
  id            INTEGER PRIMARY KEY AUTOINCREMENT,
  agent_id      TEXT    NOT NULL,
  project_id    TEXT    NOT NULL DEFAULT '',
  channel       TEXT    NOT NULL DEFAULT '',
  subject_kind  TEXT    NOT NULL,
  subject_id    INTEGER NOT NULL,
  predicate     TEXT    NOT NULL,
  object_kind   TEXT    NOT NULL,
  object_id     INTEGER NOT NULL,
  anchor_ref    TEXT    NOT NULL DEFAULT '',
  declared_by   TEXT    NOT NULL,
  declared_at   TEXT    NOT NULL,
  UNIQUE (agent_id, project_id, channel, subject_kind, subject_id, predicate, object_kind, object_id, anchor_ref))""",
    "CREATE INDEX IF NOT EXISTS idx_relations_subject ON relations (subject_kind, subject_id)",
    "CREATE INDEX IF NOT EXISTS idx_relations_object  ON relations (object_kind, object_id)",
    "CREATE INDEX IF NOT EXISTS idx_relations_anchor  ON relations (anchor_ref)",
)

TRIGGERS_DDL = (
    """CREATE TRIGGER IF NOT EXISTS associations_entities_ad AFTER DELETE ON entities BEGIN
  DELETE FROM entity_aliases  WHERE entity_id = old.id;
  DELETE FROM entity_mentions WHERE entity_id = old.id;
  DELETE FROM relations
   WHERE (subject_kind = 'entity' AND subject_id = old.id)
      OR (object_kind  = 'entity' AND object_id  = old.id);
END""",
    """CREATE TRIGGER IF NOT EXISTS associations_memories_ad AFTER DELETE ON memories BEGIN
  DELETE FROM entity_mentions WHERE ref = 'mem:' || old.id;
  DELETE FROM relations
   WHERE (subject_kind = 'mem' AND subject_id = old.id)
      OR (object_kind  = 'mem' AND object_id  = old.id)
      OR anchor_ref = 'mem:' || old.id;
END""",
    """CREATE TRIGGER IF NOT EXISTS associations_episodes_ad AFTER DELETE ON episodes BEGIN
  DELETE FROM entity_mentions WHERE ref = 'ep:' || old.id;
  DELETE FROM relations
   WHERE (subject_kind = 'ep' AND subject_id = old.id)
      OR (object_kind  = 'ep' AND object_id  = old.id)
      OR anchor_ref = 'ep:' || old.id;
END""",
)

# PostgreSQL: the same tables with sequence ids, and the same cascades as
# trigger functions (a PostgreSQL trigger runs a function, not a body).
# Ids that name a row are BIGINT like the ids themselves.
PG_TABLES_DDL = tuple(
    ddl.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY").replace(
        " INTEGER NOT NULL", " BIGINT NOT NULL"
    )
    for ddl in TABLES_DDL
)

PG_TRIGGERS_DDL = (
    """CREATE OR REPLACE FUNCTION associations_entities_ad() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM entity_aliases  WHERE entity_id = old.id;
  DELETE FROM entity_mentions WHERE entity_id = old.id;
  DELETE FROM relations
   WHERE (subject_kind = 'entity' AND subject_id = old.id)
      OR (object_kind  = 'entity' AND object_id  = old.id);
  RETURN NULL;
END $$""",
    "CREATE TRIGGER associations_entities_ad AFTER DELETE ON entities"
    " FOR EACH ROW EXECUTE FUNCTION associations_entities_ad()",
    """CREATE OR REPLACE FUNCTION associations_memories_ad() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM entity_mentions WHERE ref = 'mem:' || old.id;
  DELETE FROM relations
   WHERE (subject_kind = 'mem' AND subject_id = old.id)
      OR (object_kind  = 'mem' AND object_id  = old.id)
      OR anchor_ref = 'mem:' || old.id;
  RETURN NULL;
END $$""",
    "CREATE TRIGGER associations_memories_ad AFTER DELETE ON memories"
    " FOR EACH ROW EXECUTE FUNCTION associations_memories_ad()",
    """CREATE OR REPLACE FUNCTION associations_episodes_ad() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM entity_mentions WHERE ref = 'ep:' || old.id;
  DELETE FROM relations
   WHERE (subject_kind = 'ep' AND subject_id = old.id)
      OR (object_kind  = 'ep' AND object_id  = old.id)
      OR anchor_ref = 'ep:' || old.id;
  RETURN NULL;
END $$""",
    "CREATE TRIGGER associations_episodes_ad AFTER DELETE ON episodes"
    " FOR EACH ROW EXECUTE FUNCTION associations_episodes_ad()",
)

TABLE_NAMES = ("entities", "entity_aliases", "entity_mentions", "relations")
TRIGGER_NAMES = ("associations_entities_ad", "associations_memories_ad", "associations_episodes_ad")


def _is_postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    for ddl in (*PG_TABLES_DDL, *PG_TRIGGERS_DDL) if _is_postgres() else (*TABLES_DDL, *TRIGGERS_DDL):
        op.execute(ddl)


def downgrade() -> None:
    if _is_postgres():
        for name, table in zip(TRIGGER_NAMES, ("entities", "memories", "episodes")):
            op.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
            op.execute(f"DROP FUNCTION IF EXISTS {name}()")
        for name in TABLE_NAMES:
            op.execute(f"DROP TABLE IF EXISTS {name}")
        return
    for name in TRIGGER_NAMES:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    for name in TABLE_NAMES:  # their indexes go with them
        op.execute(f"DROP TABLE IF EXISTS {name}")
