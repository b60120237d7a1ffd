"""CPersona schema v13: the base tables, FTS5 trigram indexes and their triggers.

This revision is the layout every CPersona 2.5 database has (spec storage.md §4.7,
§4.5, §4.6), so a fresh database and an adopted one are the same thing from here
on. Databases that existed before Alembic are not created by this revision: they
are brought to v13 by the adoption ladder in cpersona.storage.migrate and then
stamped at this revision (spec IMPL-2).

The DDL is written out as text, not generated from the ORM, because its exact
form is part of the contract: the 2.5 line opens these files too, and the FTS
triggers are compared by their SQL text (spec MV-7). The DDL constants below are
also read by the adoption ladder, so there is one copy of the v13 layout.

Revision ID: 0001_v13
Revises:
"""

from __future__ import annotations

# alembic's op is imported inside each function that runs under Alembic: the server
# reads this module's DDL constants on every start (cpersona.storage.migrate,
# repair on boot) without loading Alembic when the database is already at head.

revision = "0001_v13"
down_revision = None
branch_labels = None
depends_on = None

SCHEMA_VERSION = 13

# spec storage.md §4.7, tables and the three indexes the table DDL carries.
BASE_TABLES_DDL = (
    """CREATE TABLE IF NOT EXISTS schema_version (
  version     INTEGER PRIMARY KEY,
  applied_at  TEXT NOT NULL DEFAULT (datetime('now')))""",
    """CREATE TABLE IF NOT EXISTS memories (
  id                INTEGER PRIMARY KEY AUTOINCREMENT,
  agent_id          TEXT    NOT NULL,
  project_id        TEXT    NOT NULL DEFAULT '',
  msg_id            TEXT    NOT NULL DEFAULT '',
  content           TEXT    NOT NULL,
  source            TEXT    NOT NULL DEFAULT '{}',
  timestamp         TEXT    NOT NULL,
  metadata          TEXT    NOT NULL DEFAULT '{}',
  embedding         BLOB,
  channel           TEXT    NOT NULL DEFAULT '',
  recall_count      INTEGER NOT NULL DEFAULT 0,
  last_recalled_at  TEXT,
  locked            INTEGER NOT NULL DEFAULT 0,
  created_at        TEXT    NOT NULL DEFAULT (datetime('now')))""",
    "CREATE INDEX IF NOT EXISTS idx_memories_agent  ON memories (agent_id, created_at DESC)",
    "CREATE INDEX IF NOT EXISTS idx_memories_msg_id ON memories (agent_id, msg_id)",
    """CREATE TABLE IF NOT EXISTS profiles (
  id          INTEGER PRIMARY KEY AUTOINCREMENT,
  agent_id    TEXT NOT NULL,
  project_id  TEXT NOT NULL DEFAULT '',
  user_id     TEXT NOT NULL DEFAULT '',
  content     TEXT NOT NULL,
  updated_at  TEXT NOT NULL DEFAULT (datetime('now')),
  UNIQUE (agent_id, user_id))""",
    """CREATE TABLE IF NOT EXISTS episodes (
  id          INTEGER PRIMARY KEY AUTOINCREMENT,
  agent_id    TEXT    NOT NULL,
  project_id  TEXT    NOT NULL DEFAULT '',
  summary     TEXT    NOT NULL,
  keywords    TEXT    NOT NULL DEFAULT '',
  embedding   BLOB,
  start_time  TEXT,
  end_time    TEXT,
  resolved    INTEGER NOT NULL DEFAULT 0,
  channel     TEXT    NOT NULL DEFAULT '',
  created_at  TEXT    NOT NULL DEFAULT (datetime('now')))""",
    "CREATE INDEX IF NOT EXISTS idx_episodes_agent ON episodes (agent_id, created_at DESC)",
    """CREATE TABLE IF NOT EXISTS pending_memory_tasks (
  id          INTEGER PRIMARY KEY AUTOINCREMENT,
  task_type   TEXT    NOT NULL,
  agent_id    TEXT    NOT NULL,
  project_id  TEXT    NOT NULL DEFAULT '',
  payload     TEXT    NOT NULL,
  retries     INTEGER NOT NULL DEFAULT 0,
  created_at  TEXT    NOT NULL DEFAULT (datetime('now')))""",
)

# spec storage.md §4.6: indexes the reference creates in ladder steps v6 / v10.
CHANNEL_INDEXES_DDL = (
    "CREATE INDEX IF NOT EXISTS idx_memories_agent_channel ON memories (agent_id, channel, created_at DESC)",
    "CREATE INDEX IF NOT EXISTS idx_episodes_agent_channel ON episodes (agent_id, channel, created_at DESC)",
)

# spec DB-5 / DB-6: the dedup indexes; on an adopted database they may fail.
DEDUP_INDEXES_DDL = (
    "CREATE UNIQUE INDEX IF NOT EXISTS idx_memories_dedup_content ON memories (agent_id, project_id, channel, content)",
    "CREATE UNIQUE INDEX IF NOT EXISTS idx_memories_dedup_msg_id"
    " ON memories (agent_id, project_id, msg_id) WHERE msg_id != ''",
)

# spec MV-10: the isolation indexes, created after the ladder on every boot.
ISOLATION_INDEXES_DDL = (
    "CREATE INDEX IF NOT EXISTS idx_memories_isolation ON memories (agent_id, project_id, created_at DESC)",
    "CREATE INDEX IF NOT EXISTS idx_episodes_isolation ON episodes (agent_id, project_id, created_at DESC)",
)

# spec DB-2.
FTS_TABLES_DDL = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS memories_fts USING fts5("
    "content, content = memories, content_rowid = id, tokenize = 'trigram')",
    "CREATE VIRTUAL TABLE IF NOT EXISTS episodes_fts USING fts5("
    "summary, keywords, content = episodes, content_rowid = id, tokenize = 'trigram')",
)

# spec DB-3, v13 forms. The update triggers are scoped to the text columns and
# guarded by a change test so that recall's counter bumps never touch FTS.
FTS_TRIGGERS_DDL = (
    """CREATE TRIGGER IF NOT EXISTS memories_fts_ai AFTER INSERT ON memories BEGIN
  INSERT INTO memories_fts (rowid, content) VALUES (new.id, new.content);
END""",
    """CREATE TRIGGER IF NOT EXISTS memories_fts_ad AFTER DELETE ON memories BEGIN
  INSERT INTO memories_fts (memories_fts, rowid, content) VALUES ('delete', old.id, old.content);
END""",
    """CREATE TRIGGER IF NOT EXISTS memories_fts_au AFTER UPDATE OF content ON memories
WHEN old.content <> new.content BEGIN
  INSERT INTO memories_fts (memories_fts, rowid, content) VALUES ('delete', old.id, old.content);
  INSERT INTO memories_fts (rowid, content) VALUES (new.id, new.content);
END""",
    """CREATE TRIGGER IF NOT EXISTS episodes_ai AFTER INSERT ON episodes BEGIN
  INSERT INTO episodes_fts (rowid, summary, keywords) VALUES (new.id, new.summary, new.keywords);
END""",
    """CREATE TRIGGER IF NOT EXISTS episodes_ad AFTER DELETE ON episodes BEGIN
  INSERT INTO episodes_fts (episodes_fts, rowid, summary, keywords)
  VALUES ('delete', old.id, old.summary, old.keywords);
END""",
    """CREATE TRIGGER IF NOT EXISTS episodes_au AFTER UPDATE OF summary, keywords ON episodes
WHEN old.summary <> new.summary OR old.keywords <> new.keywords BEGIN
  INSERT INTO episodes_fts (episodes_fts, rowid, summary, keywords)
  VALUES ('delete', old.id, old.summary, old.keywords);
  INSERT INTO episodes_fts (rowid, summary, keywords) VALUES (new.id, new.summary, new.keywords);
END""",
)

FTS_TRIGGER_NAMES = (
    "memories_fts_ai",
    "memories_fts_ad",
    "memories_fts_au",
    "episodes_ai",
    "episodes_ad",
    "episodes_au",
)
FTS_TABLE_NAMES = ("memories_fts", "episodes_fts")
BASE_TABLE_NAMES = ("pending_memory_tasks", "episodes", "profiles", "memories", "schema_version")


def fts_enabled() -> bool:
    """Whether this run creates FTS objects (spec DB-4).

    The server passes its setting in ``config.attributes["fts_enabled"]``; the
    alembic CLI falls back to the environment variable.
    """
    from alembic import op

    from cpersona.storage.migrate import fts_setting

    return fts_setting(op.get_context().config)


# ---------------------------------------------------------------------------
# PostgreSQL (CPERSONA_DATABASE_URL): the same tables, columns and defaults in
# PostgreSQL's words. Timestamps stay TEXT in SQLite's 'YYYY-MM-DD HH:MM:SS'
# UTC form so every reader compares them as it does on SQLite; ids come from
# sequences, which never hand out a deleted id again (spec VF-8). FTS5 is
# replaced by pg_trgm GIN indexes, which serve the same any-3-character
# substring lookups (CJK included) for ILIKE and word_similarity.

PG_NOW = "to_char(timezone('UTC', now()), 'YYYY-MM-DD HH24:MI:SS')"

PG_BASE_TABLES_DDL = (
    f"""CREATE TABLE IF NOT EXISTS schema_version (
  version     INTEGER PRIMARY KEY,
  applied_at  TEXT NOT NULL DEFAULT {PG_NOW})""",
    f"""CREATE TABLE IF NOT EXISTS memories (
  id                BIGSERIAL PRIMARY KEY,
  agent_id          TEXT    NOT NULL,
  project_id        TEXT    NOT NULL DEFAULT '',
  msg_id            TEXT    NOT NULL DEFAULT '',
  content           TEXT    NOT NULL,
  source            TEXT    NOT NULL DEFAULT '{{}}',
  timestamp         TEXT    NOT NULL,
  metadata          TEXT    NOT NULL DEFAULT '{{}}',
  embedding         BYTEA,
  channel           TEXT    NOT NULL DEFAULT '',
  recall_count      INTEGER NOT NULL DEFAULT 0,
  last_recalled_at  TEXT,
  locked            INTEGER NOT NULL DEFAULT 0,
  created_at        TEXT    NOT NULL DEFAULT {PG_NOW})""",
    "CREATE INDEX IF NOT EXISTS idx_memories_agent  ON memories (agent_id, created_at)",
    "CREATE INDEX IF NOT EXISTS idx_memories_msg_id ON memories (agent_id, msg_id)",
    f"""CREATE TABLE IF NOT EXISTS profiles (
  id          BIGSERIAL PRIMARY KEY,
  agent_id    TEXT NOT NULL,
  project_id  TEXT NOT NULL DEFAULT '',
  user_id     TEXT NOT NULL DEFAULT '',
  content     TEXT NOT NULL,
  updated_at  TEXT NOT NULL DEFAULT {PG_NOW},
  UNIQUE (agent_id, user_id))""",
    f"""CREATE TABLE IF NOT EXISTS episodes (
  id          BIGSERIAL PRIMARY KEY,
  agent_id    TEXT    NOT NULL,
  project_id  TEXT    NOT NULL DEFAULT '',
  summary     TEXT    NOT NULL,
  keywords    TEXT    NOT NULL DEFAULT '',
  embedding   BYTEA,
  start_time  TEXT,
  end_time    TEXT,
  resolved    INTEGER NOT NULL DEFAULT 0,
  channel     TEXT    NOT NULL DEFAULT '',
  created_at  TEXT    NOT NULL DEFAULT {PG_NOW})""",
    "CREATE INDEX IF NOT EXISTS idx_episodes_agent ON episodes (agent_id, created_at)",
    f"""CREATE TABLE IF NOT EXISTS pending_memory_tasks (
  id          BIGSERIAL PRIMARY KEY,
  task_type   TEXT    NOT NULL,
  agent_id    TEXT    NOT NULL,
  project_id  TEXT    NOT NULL DEFAULT '',
  payload     TEXT    NOT NULL,
  retries     INTEGER NOT NULL DEFAULT 0,
  created_at  TEXT    NOT NULL DEFAULT {PG_NOW})""",
)

# A B-tree entry is limited to about 2.7 kB, so the content dedup index is over
# md5(content): the same rule (one row per exact text in a bucket) for texts of
# any length. The msg_id index is the same as on SQLite.
PG_DEDUP_INDEXES_DDL = (
    "CREATE UNIQUE INDEX IF NOT EXISTS idx_memories_dedup_content"
    " ON memories (agent_id, project_id, channel, md5(content))",
    DEDUP_INDEXES_DDL[1],
)


# PostgreSQL reflects an index column's direction and the models state none
# (SQLite's reflection cannot report it), so the PostgreSQL indexes are
# ascending: a B-tree serves "agent = X ORDER BY created_at DESC" by scanning
# backwards, at the same cost.
def _ascending(ddl: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(statement.replace(" DESC)", ")") for statement in ddl)


PG_CHANNEL_INDEXES_DDL = _ascending(CHANNEL_INDEXES_DDL)
PG_ISOLATION_INDEXES_DDL = _ascending(ISOLATION_INDEXES_DDL)

PG_TRGM_INDEXES_DDL = (
    "CREATE INDEX IF NOT EXISTS idx_memories_content_trgm ON memories USING gin (content gin_trgm_ops)",
    "CREATE INDEX IF NOT EXISTS idx_episodes_summary_trgm ON episodes USING gin (summary gin_trgm_ops)",
    "CREATE INDEX IF NOT EXISTS idx_episodes_keywords_trgm ON episodes USING gin (keywords gin_trgm_ops)",
)


# Two total functions the PostgreSQL search needs where SQLite has json_valid /
# json_extract and julianday: NULL for input they cannot read, never an error,
# so one malformed row cannot fail a whole search.
PG_FUNCTIONS_DDL = (
    """CREATE OR REPLACE FUNCTION cpersona_source_id(src text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  RETURN (src::jsonb) ->> 'id';
EXCEPTION WHEN others THEN
  RETURN NULL;
END $$""",
    """CREATE OR REPLACE FUNCTION cpersona_instant(stamp text) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN CASE WHEN stamp ~ '(Z|[+-][0-9]{2}:?[0-9]{2})$' THEN stamp::timestamptz
              ELSE (stamp::timestamp AT TIME ZONE 'UTC') END;
EXCEPTION WHEN others THEN
  RETURN NULL;
END $$""",
)
PG_FUNCTION_NAMES = ("cpersona_source_id(text)", "cpersona_instant(text)")


def is_postgres() -> bool:
    from alembic import op

    return op.get_bind().dialect.name == "postgresql"


def _upgrade_postgres() -> None:
    from alembic import op

    op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    for ddl in (
        *PG_BASE_TABLES_DDL,
        *PG_CHANNEL_INDEXES_DDL,
        *PG_DEDUP_INDEXES_DDL,
        *PG_ISOLATION_INDEXES_DDL,
        *PG_TRGM_INDEXES_DDL,
        *PG_FUNCTIONS_DDL,
    ):
        op.execute(ddl)
    op.execute(f"INSERT INTO schema_version (version) VALUES ({SCHEMA_VERSION}) ON CONFLICT DO NOTHING")


def upgrade() -> None:
    from alembic import op

    if is_postgres():
        _upgrade_postgres()
        return
    for ddl in (
        *BASE_TABLES_DDL,
        *CHANNEL_INDEXES_DDL,
        *DEDUP_INDEXES_DDL,
        *ISOLATION_INDEXES_DDL,
    ):
        op.execute(ddl)
    if fts_enabled():
        for ddl in (*FTS_TABLES_DDL, *FTS_TRIGGERS_DDL):
            op.execute(ddl)
    # spec IMPL-1 / DB-1: the version marker the reference reads, in the same
    # transaction as the objects it describes.
    op.execute(f"INSERT OR IGNORE INTO schema_version (version) VALUES ({SCHEMA_VERSION})")


def downgrade() -> None:
    from alembic import op

    if is_postgres():
        # The pg_trgm extension stays: other databases objects may use it.
        for name in BASE_TABLE_NAMES:
            op.execute(f"DROP TABLE IF EXISTS {name} CASCADE")
        for name in PG_FUNCTION_NAMES:
            op.execute(f"DROP FUNCTION IF EXISTS {name}")
        return
    for name in FTS_TRIGGER_NAMES:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    for name in FTS_TABLE_NAMES:
        op.execute(f"DROP TABLE IF EXISTS {name}")
    # Dropping a table drops its indexes with it.
    for name in BASE_TABLE_NAMES:
        op.execute(f"DROP TABLE IF EXISTS {name}")
