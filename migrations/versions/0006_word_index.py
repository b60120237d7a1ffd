"""Word indexes: a second, word-level lexical index beside the trigram one (issue 14).

The trigram index finds any substring of 3 or more characters, in any script,
but it cannot find a word of one or two characters (``Q1``, ``AI``, ``5k``),
and it ranks "runs" and "running" as unrelated. These tables index the same
text word by word (FTS5 ``unicode61``, Porter stemming, diacritics folded):
recall fuses their ranking with the trigram one for Latin-script queries.
Trigram stays for CJK text, identifiers and substrings.

SQLite: two external-content FTS5 tables over ``memories.content`` and
``episodes.summary`` + ``keywords``, filled from the rows already there
(``'rebuild'``) and kept equal by six triggers written like the trigram ones
(the update triggers fire only when the indexed text changes, so counter
bumps never touch the index). Like the trigram objects they exist only while
full-text search is enabled (DB-4); a later boot with it enabled creates and
fills them (``migrate.repair_on_boot``).

PostgreSQL: ``tsvector`` expression GIN indexes with the ``english`` text
search configuration (stemming and stop words), always in step with the rows,
so neither a backfill nor a trigger is needed.

Recorded in ``alembic_version`` only; ``schema_version`` stays 13 (decision 8).

Revision ID: 0006_word_index
Revises: 0005_embedding_identity
"""

from __future__ import annotations

# alembic's op is imported inside the functions Alembic runs: every boot reads
# this module's DDL (cpersona.storage.migrate, repair on boot) without Alembic.

from cpersona.storage.migrate import fts_setting
from cpersona.storage.search_words import pg_word_vector

revision = "0006_word_index"
down_revision = "0005_embedding_identity"
branch_labels = None
depends_on = None

WORD_TOKENIZER = "porter unicode61 remove_diacritics 2"

WORD_TABLES_DDL = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS memories_words USING fts5("
    f"content, content = memories, content_rowid = id, tokenize = '{WORD_TOKENIZER}')",
    "CREATE VIRTUAL TABLE IF NOT EXISTS episodes_words USING fts5("
    f"summary, keywords, content = episodes, content_rowid = id, tokenize = '{WORD_TOKENIZER}')",
)
WORD_TABLE_NAMES = ("memories_words", "episodes_words")

WORD_TRIGGERS_DDL = (
    """CREATE TRIGGER IF NOT EXISTS memories_words_ai AFTER INSERT ON memories BEGIN
  INSERT INTO memories_words (rowid, content) VALUES (new.id, new.content);
END""",
    """CREATE TRIGGER IF NOT EXISTS memories_words_ad AFTER DELETE ON memories BEGIN
  INSERT INTO memories_words (memories_words, rowid, content) VALUES ('delete', old.id, old.content);
END""",
    """CREATE TRIGGER IF NOT EXISTS memories_words_au AFTER UPDATE OF content ON memories
WHEN old.content <> new.content BEGIN
  INSERT INTO memories_words (memories_words, rowid, content) VALUES ('delete', old.id, old.content);
  INSERT INTO memories_words (rowid, content) VALUES (new.id, new.content);
END""",
    """CREATE TRIGGER IF NOT EXISTS episodes_words_ai AFTER INSERT ON episodes BEGIN
  INSERT INTO episodes_words (rowid, summary, keywords) VALUES (new.id, new.summary, new.keywords);
END""",
    """CREATE TRIGGER IF NOT EXISTS episodes_words_ad AFTER DELETE ON episodes BEGIN
  INSERT INTO episodes_words (episodes_words, rowid, summary, keywords)
  VALUES ('delete', old.id, old.summary, old.keywords);
END""",
    """CREATE TRIGGER IF NOT EXISTS episodes_words_au AFTER UPDATE OF summary, keywords ON episodes
WHEN old.summary <> new.summary OR old.keywords <> new.keywords BEGIN
  INSERT INTO episodes_words (episodes_words, rowid, summary, keywords)
  VALUES ('delete', old.id, old.summary, old.keywords);
  INSERT INTO episodes_words (rowid, summary, keywords) VALUES (new.id, new.summary, new.keywords);
END""",
)
WORD_TRIGGER_NAMES = (
    "memories_words_ai",
    "memories_words_ad",
    "memories_words_au",
    "episodes_words_ai",
    "episodes_words_ad",
    "episodes_words_au",
)

# PostgreSQL: the expressions recall's word search uses (storage/search_words.py),
# so the planner serves it from these indexes.
PG_WORD_INDEXES_DDL = (
    f"CREATE INDEX IF NOT EXISTS idx_memories_words ON memories USING gin ({pg_word_vector('mem')})",
    f"CREATE INDEX IF NOT EXISTS idx_episodes_words ON episodes USING gin ({pg_word_vector('ep')})",
)
PG_WORD_INDEX_NAMES = ("idx_memories_words", "idx_episodes_words")


def _is_postgres() -> bool:
    from alembic import op

    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    from alembic import op

    if _is_postgres():
        for ddl in PG_WORD_INDEXES_DDL:
            op.execute(ddl)
        return
    if not fts_setting(op.get_context().config):
        return
    for ddl in (*WORD_TABLES_DDL, *WORD_TRIGGERS_DDL):
        op.execute(ddl)
    for name in WORD_TABLE_NAMES:  # rows stored before this revision: read from the content tables
        op.execute(f"INSERT INTO {name} ({name}) VALUES ('rebuild')")


def downgrade() -> None:
    from alembic import op

    if _is_postgres():
        for name in PG_WORD_INDEX_NAMES:
            op.execute(f"DROP INDEX IF EXISTS {name}")
        return
    for name in WORD_TRIGGER_NAMES:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    for name in WORD_TABLE_NAMES:
        op.execute(f"DROP TABLE IF EXISTS {name}")
