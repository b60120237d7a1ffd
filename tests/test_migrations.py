"""Migrations: the v13 layout, upgrade-on-start, adoption of CPersona files, refusal.

Every test runs on a real SQLite file. Legacy files are built with the stdlib
sqlite3 module (as an older CPersona would have left them) or copied from the
fixtures in tests/fixtures/legacy, then opened through cpersona.storage.migrate.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from cpersona.storage.engine import Database, open_sqlite
from cpersona.storage.migrate import (
    REFERENCE_VERSION,
    V13_REVISION,
    MigrationError,
    TooNewDatabase,
    alembic_config,
    head_revision,
    open_and_upgrade,
    probe_version,
    upgrade,
)
from cpersona.storage.models import Base

from conftest import legacy_fixture

REPO = Path(__file__).resolve().parents[1]
V10_FIXTURE = "cpersona-2.4.34-v10-dev.db"
V13_FIXTURE = "cpersona-2.5.12-v13-dev.db"

# spec storage.md §4.7 / §4.6 / §4.5
V13_TABLES = {"schema_version", "memories", "episodes", "profiles", "pending_memory_tasks"}
FTS_TABLES = {"memories_fts", "episodes_fts"}
FTS_SHADOW = {f"{t}_{s}" for t in FTS_TABLES for s in ("data", "idx", "docsize", "config")}
V13_INDEXES = {
    "idx_memories_agent",
    "idx_memories_msg_id",
    "idx_memories_agent_channel",
    "idx_memories_isolation",
    "idx_memories_dedup_content",
    "idx_memories_dedup_msg_id",
    "idx_episodes_agent",
    "idx_episodes_agent_channel",
    "idx_episodes_isolation",
}
# spec storage.md §6.7, revision 0002
UNVERSIONED_INDEXES = {"idx_memories_lost_embedding", "idx_episodes_lost_embedding", "idx_memories_span"}
# spec storage.md §6.2 / §6.1, revisions 0003 (associations), 0004 (record nodes), 0005 (embedding identity)
LATER_TABLES = {"entities", "entity_aliases", "entity_mentions", "relations", "record_nodes", "embedding_identity"}
LATER_INDEXES = {
    "idx_entity_aliases_normalized",
    "idx_entity_mentions_ref",
    "idx_relations_subject",
    "idx_relations_object",
    "idx_relations_anchor",
}
LATER_TRIGGERS = {
    "associations_entities_ad",
    "associations_memories_ad",
    "associations_episodes_ad",
    "record_nodes_memories_ad",
    "record_nodes_memories_au",
    "record_nodes_episodes_ad",
    "record_nodes_episodes_au",
}
# revision 0006: the word indexes, full-text objects like the trigram ones (kept only with FTS on)
WORD_TABLES = {"memories_words", "episodes_words"}
WORD_SHADOW = {f"{t}_{s}" for t in WORD_TABLES for s in ("data", "idx", "docsize", "config")}
WORD_TRIGGERS = {f"{t}_words_{e}" for t in ("memories", "episodes") for e in ("ai", "ad", "au")}
# revision 0007: the coarse vector index (derived, raw DDL). Its triggers are TEMP, per connection
# (storage/coarse_sqlite.py), so the file's schema has none.
COARSE_TABLES = {"memories_coarse", "episodes_coarse"}
# revision 0008: the coarse index's change log, and the stored triggers on the coarse tables that
# write it (they call no extension function; storage/vector_index_sqlite.py reads the log).
COARSE_LOG_TABLES = {"coarse_changes"}
COARSE_TABLES |= COARSE_LOG_TABLES
LATER_TABLES |= COARSE_TABLES
LATER_TRIGGERS |= {f"{t}_coarse_log_{e}" for t in ("memories", "episodes") for e in ("ai", "ad", "au")}
HEAD_INDEXES = V13_INDEXES | UNVERSIONED_INDEXES | LATER_INDEXES
V13_TRIGGERS = {
    "memories_fts_ai",
    "memories_fts_ad",
    "memories_fts_au",
    "episodes_ai",
    "episodes_ad",
    "episodes_au",
}


# ---------------------------------------------------------------------------
# helpers


def _load_v13_revision():
    path = REPO / "migrations" / "versions" / "0001_v13_base.py"
    spec = importlib.util.spec_from_file_location("v13_revision_for_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


V13 = _load_v13_revision()


def q(db: Database, sql: str, params: dict | tuple = ()) -> list[tuple]:
    with db.read() as session:
        return [tuple(r) for r in session.connection().exec_driver_sql(sql, params).fetchall()]


def w(db: Database, sql: str, params: dict | tuple = ()) -> None:
    with db.write_connection() as conn:
        conn.exec_driver_sql(sql, params)


def objects(db: Database, kind: str) -> set[str]:
    return {r[0] for r in q(db, "SELECT name FROM sqlite_master WHERE type = ?", (kind,))}


def raw(path: Path) -> sqlite3.Connection:
    """A stdlib connection, as an older CPersona build would have used."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    return conn


def raw_counts(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        return {
            t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t in ("memories", "episodes", "profiles", "pending_memory_tasks")
        }
    finally:
        conn.close()


def counts(db: Database) -> dict[str, int]:
    return {
        t: q(db, f"SELECT COUNT(*) FROM {t}")[0][0]
        for t in ("memories", "episodes", "profiles", "pending_memory_tasks")
    }


def fts_ids(db: Database, table: str, term: str) -> list[int]:
    return [r[0] for r in q(db, f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rowid", (f'"{term}"',))]


def fts_integrity_ok(db: Database) -> None:
    # 'integrity-check' with rank 1 also compares the index with the content table.
    for table in FTS_TABLES:
        w(db, f"INSERT INTO {table} ({table}, rank) VALUES ('integrity-check', 1)")


def insert_memory(db: Database, content: str, **cols: object) -> int:
    values = {"agent_id": "a", "content": content, "timestamp": "2026-01-01T00:00:00+00:00", **cols}
    names = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    with db.write_connection() as conn:
        return conn.exec_driver_sql(
            f"INSERT INTO memories ({names}) VALUES ({marks}) RETURNING id", tuple(values.values())
        ).scalar_one()


def fingerprint(path: Path) -> tuple[str, int, int]:
    data = path.read_bytes()
    st = path.stat()
    return hashlib.sha256(data).hexdigest(), st.st_mtime_ns, st.st_size


def include_name(db_conn):
    virtual = {
        r[0]
        for r in db_conn.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type='table' AND sql LIKE 'CREATE VIRTUAL TABLE%'"
        )
    }

    def _include(name, type_, parent_names):
        if type_ != "table" or name is None:
            return True
        if name.startswith("sqlite_") or name in COARSE_TABLES:  # derived like FTS: raw DDL, not modelled
            return False
        return not (name in virtual or any(name.startswith(v + "_") for v in virtual))

    return _include


# ---------------------------------------------------------------------------
# fresh database


def test_fresh_upgrade_creates_exactly_the_v13_objects(db: Database) -> None:
    # spec DB-1, DB-2, DB-3, §4.6, §4.7
    tables = objects(db, "table")
    assert tables - {"sqlite_sequence", "alembic_version"} == (
        V13_TABLES | FTS_TABLES | FTS_SHADOW | LATER_TABLES | WORD_TABLES | WORD_SHADOW
    )
    assert "memories_fts_content" not in tables  # external content: no copy of the text (DB-2)
    user_indexes = {i for i in objects(db, "index") if not i.startswith("sqlite_autoindex")}
    assert user_indexes == HEAD_INDEXES
    assert objects(db, "trigger") == V13_TRIGGERS | LATER_TRIGGERS | WORD_TRIGGERS
    assert q(db, "SELECT version FROM schema_version") == [(REFERENCE_VERSION,)]
    assert q(db, "SELECT version_num FROM alembic_version") == [(head_revision(),)]
    assert q(db, "PRAGMA user_version") == [(0,)]  # spec PG-3
    assert q(db, "PRAGMA journal_mode") == [("wal",)]  # spec PG-1


def test_fresh_tables_have_the_v13_columns_and_defaults(db: Database) -> None:
    # spec §4.2: name, type, not-null and default of every memories column
    cols = {r[1]: (r[2], r[3], r[4], r[5]) for r in q(db, "PRAGMA table_info(memories)")}
    assert cols == {
        "id": ("INTEGER", 0, None, 1),
        "agent_id": ("TEXT", 1, None, 0),
        "project_id": ("TEXT", 1, "''", 0),
        "msg_id": ("TEXT", 1, "''", 0),
        "content": ("TEXT", 1, None, 0),
        "source": ("TEXT", 1, "'{}'", 0),
        "timestamp": ("TEXT", 1, None, 0),
        "metadata": ("TEXT", 1, "'{}'", 0),
        "embedding": ("BLOB", 0, None, 0),
        "channel": ("TEXT", 1, "''", 0),
        "recall_count": ("INTEGER", 1, "0", 0),
        "last_recalled_at": ("TEXT", 0, None, 0),
        "locked": ("INTEGER", 1, "0", 0),
        "created_at": ("TEXT", 1, "datetime('now')", 0),
    }
    # spec §4.4: profiles unique on (agent_id, user_id) only
    w(db, "INSERT INTO profiles (agent_id, project_id, content) VALUES ('a', 'p1', 'x')")
    with pytest.raises(Exception, match="UNIQUE"):
        w(db, "INSERT INTO profiles (agent_id, project_id, content) VALUES ('a', 'p2', 'y')")
    # spec VF-8: AUTOINCREMENT, a deleted id is never reused
    first = insert_memory(db, "first row")
    w(db, "DELETE FROM memories WHERE id = ?", (first,))
    assert insert_memory(db, "second row") == first + 1


def test_triggers_and_fts_tables_are_the_v13_forms(db: Database) -> None:
    # spec DB-2, DB-3: trigram tokenizer; update triggers scoped and guarded
    sql = dict(q(db, "SELECT name, sql FROM sqlite_master WHERE type IN ('table', 'trigger')"))
    assert "tokenize = 'trigram'" in sql["memories_fts"]
    assert "content = memories" in sql["memories_fts"]
    assert "tokenize = 'trigram'" in sql["episodes_fts"]
    assert "AFTER UPDATE OF content ON memories" in sql["memories_fts_au"]
    assert "WHEN old.content <> new.content" in sql["memories_fts_au"]
    assert "AFTER UPDATE OF summary, keywords ON episodes" in sql["episodes_au"]
    assert "WHEN old.summary <> new.summary OR old.keywords <> new.keywords" in sql["episodes_au"]


def test_fts_finds_english_and_japanese_substrings(db: Database) -> None:
    # spec DB-2 (trigram: any 3+ character substring matches)
    en = insert_memory(db, "The deploy script lives in tools/deploy.sh")
    jp = insert_memory(db, "会議は毎週火曜日の午前10時に行われます")
    insert_memory(db, "unrelated note")
    assert fts_ids(db, "memories_fts", "ploy scr") == [en]
    assert fts_ids(db, "memories_fts", "火曜日") == [jp]
    w(
        db,
        "INSERT INTO episodes (agent_id, summary, keywords) VALUES ('a', 'Planning session', 'freeze hotfix')",
    )
    assert len(fts_ids(db, "episodes_fts", "otfi")) == 1
    # delete and content-update triggers keep the index in step
    w(db, "UPDATE memories SET content = 'rewritten text' WHERE id = ?", (en,))
    assert fts_ids(db, "memories_fts", "ploy scr") == []
    assert fts_ids(db, "memories_fts", "ewritt") == [en]
    w(db, "DELETE FROM memories WHERE id = ?", (jp,))
    assert fts_ids(db, "memories_fts", "火曜日") == []
    fts_integrity_ok(db)


def _fts_segments(db: Database) -> list[tuple]:
    return q(db, "SELECT id, block FROM memories_fts_data ORDER BY id")


def test_recall_bump_does_not_rewrite_fts_postings(db: Database) -> None:
    # spec DB-3: bumping recall_count / last_recalled_at must not touch the index
    mid = insert_memory(db, "a memory that recall keeps hitting")
    before = _fts_segments(db)
    for _ in range(3):
        w(
            db,
            "UPDATE memories SET recall_count = recall_count + 1, last_recalled_at = datetime('now') WHERE id = ?",
            (mid,),
        )
    w(db, "UPDATE memories SET content = content WHERE id = ?", (mid,))  # no change: guarded
    assert _fts_segments(db) == before
    # control: a real content change does write postings, so the probe can see a rewrite
    w(db, "UPDATE memories SET content = 'a memory with new words' WHERE id = ?", (mid,))
    assert _fts_segments(db) != before


def test_unscoped_legacy_trigger_would_have_rewritten_postings(db: Database) -> None:
    # Control for the test above (spec MV-1): the v11 trigger form fires on any column.
    w(db, "DROP TRIGGER memories_fts_au")
    w(
        db,
        "CREATE TRIGGER memories_fts_au AFTER UPDATE ON memories BEGIN "
        "INSERT INTO memories_fts (memories_fts, rowid, content) VALUES ('delete', old.id, old.content); "
        "INSERT INTO memories_fts (rowid, content) VALUES (new.id, new.content); END",
    )
    mid = insert_memory(db, "a memory that recall keeps hitting")
    before = _fts_segments(db)
    w(db, "UPDATE memories SET recall_count = recall_count + 1 WHERE id = ?", (mid,))
    assert _fts_segments(db) != before


def test_upgrade_is_idempotent_and_schema_version_stays_13(db: Database) -> None:
    # spec README decision 8; DB-1 (rows never deleted, no new row for our revisions); IMPL-1, IMPL-7
    mid = insert_memory(db, "kept across restarts")
    upgrade(db)
    upgrade(db)
    assert q(db, "SELECT version FROM schema_version") == [(13,)]
    assert fts_ids(db, "memories_fts", "across rest") == [mid]


def test_downgrade_to_base_and_back(db: Database) -> None:
    with db.write_connection() as conn:
        command.downgrade(alembic_config(conn), "base")
    left = {t for t in objects(db, "table") if not t.startswith("sqlite_")}
    assert left == {"alembic_version"}
    assert objects(db, "trigger") == set()
    upgrade(db)
    assert V13_TABLES | FTS_TABLES | LATER_TABLES | WORD_TABLES <= objects(db, "table")
    assert objects(db, "trigger") == V13_TRIGGERS | LATER_TRIGGERS | WORD_TRIGGERS
    assert q(db, "SELECT version FROM schema_version") == [(13,)]


def assert_no_model_drift(db: Database) -> None:
    with db.engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={"include_name": include_name(conn), "compare_type": True, "compare_server_default": True},
        )
        assert compare_metadata(context, Base.metadata) == []


def test_models_match_the_migrated_schema(db: Database) -> None:
    # spec IMPL-4: FTS shadow tables and sqlite_sequence are excluded, nothing else differs
    assert_no_model_drift(db)


def test_fts_disabled_then_enabled(db_path: Path) -> None:
    # spec DB-4: no FTS objects when disabled; MV-12: enabling later creates and fills them
    db = open_sqlite(db_path)
    try:
        upgrade(db, fts_enabled=False)
        assert objects(db, "trigger") == LATER_TRIGGERS
        assert not ((FTS_TABLES | WORD_TABLES) & objects(db, "table"))
        mid = insert_memory(db, "written while keyword search was off")
        upgrade(db, fts_enabled=True)
        assert objects(db, "trigger") == V13_TRIGGERS | LATER_TRIGGERS | WORD_TRIGGERS
        assert fts_ids(db, "memories_fts", "keyword sea") == [mid]
        assert fts_ids(db, "memories_words", "searching") == [mid]  # the word index is filled too (stemmed)
        assert q(db, "PRAGMA user_version") == [(0,)]
        fts_integrity_ok(db)
    finally:
        db.close()


def test_pending_rebuild_bit_is_honoured(db: Database) -> None:
    # spec PG-3, MV-7, MV-9: bit 0 of user_version asks for a full FTS rebuild
    mid = insert_memory(db, "lost from the index")
    w(db, "INSERT INTO memories_fts (memories_fts) VALUES ('delete-all')")
    assert fts_ids(db, "memories_fts", "from the ind") == []
    w(db, "PRAGMA user_version = 1")
    upgrade(db)
    assert fts_ids(db, "memories_fts", "from the ind") == [mid]
    assert q(db, "PRAGMA user_version") == [(0,)]


def test_missing_dedup_index_is_recreated_on_boot(db: Database) -> None:
    # spec DB-6 / MV-10: the 2.6 line retries the dedup indexes on every boot
    w(db, "DROP INDEX idx_memories_dedup_msg_id")
    upgrade(db)
    assert "idx_memories_dedup_msg_id" in objects(db, "index")


# ---------------------------------------------------------------------------
# probing and refusal


def test_probe_version(tmp_path: Path) -> None:
    assert probe_version(tmp_path / "missing.db") is None
    empty = tmp_path / "empty.db"
    empty.touch()
    assert probe_version(empty) is None
    assert probe_version(legacy_fixture(V10_FIXTURE, tmp_path)) == 10
    assert probe_version(legacy_fixture(V13_FIXTURE, tmp_path)) == 13


def _make_too_new(tmp_path: Path, version: int) -> Path:
    path = legacy_fixture(V13_FIXTURE, tmp_path)
    conn = raw(path)
    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
    conn.close()
    assert not Path(f"{path}-wal").exists()  # the last close checkpointed
    return path


@pytest.mark.parametrize("version", [14, 21, 99])
def test_too_new_database_is_refused_and_left_untouched(tmp_path: Path, version: int) -> None:
    # spec README decision 9, MV-14, MV-15
    path = _make_too_new(tmp_path, version)
    before = fingerprint(path)
    with pytest.raises(TooNewDatabase) as caught:
        open_and_upgrade(path)
    message = str(caught.value)
    assert str(version) in message
    # the exact next command, naming its target (issue 13 item 8; the command exists)
    target = Path(path).with_name(f"{Path(path).stem}-cpersona.db")
    assert f"`CPERSONA_DB_PATH={target} cpersona import-db {path}`" in message
    assert f"then serve it with CPERSONA_DB_PATH={target}" in message
    assert "until that command exists" not in message
    assert caught.value.version == version
    assert fingerprint(path) == before
    assert not Path(f"{path}-wal").exists() and not Path(f"{path}-shm").exists()


def test_upgrade_refuses_too_new_even_when_already_opened(tmp_path: Path) -> None:
    # upgrade() re-checks inside its write transaction (a racing writer, or a caller
    # that skipped open_and_upgrade): nothing is written.
    path = _make_too_new(tmp_path, 21)
    db = open_sqlite(path)
    try:
        with pytest.raises(TooNewDatabase):
            upgrade(db)
        tables = objects(db, "table")
        assert "alembic_version" not in tables
        assert q(db, "SELECT MAX(version) FROM schema_version") == [(21,)]
    finally:
        db.close()


def test_database_of_a_newer_cpersona_revision_is_refused(db: Database) -> None:
    w(db, "UPDATE alembic_version SET version_num = 'ffff_from_the_future'")
    with pytest.raises(TooNewDatabase, match="ffff_from_the_future"):
        upgrade(db)


def test_our_database_stamped_by_a_26_build_is_still_upgraded(db: Database, caplog) -> None:
    # Both schema_version and alembic_version: ours (decision 9 refuses only files
    # that never were); the 2.6 stamp is kept, a warning names it.
    w(db, "INSERT INTO schema_version (version) VALUES (21)")
    upgrade(db)
    assert q(db, "SELECT version_num FROM alembic_version") == [(head_revision(),)]
    assert q(db, "SELECT version FROM schema_version ORDER BY version") == [(13,), (21,)]
    assert "2.6 build" in caplog.text


def test_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"this is not sqlite at all, just some text that is long enough" * 20)
    before = fingerprint(path)
    with pytest.raises(MigrationError, match=f"^{path} is not a SQLite database$"):
        open_and_upgrade(path)
    assert fingerprint(path) == before


# ---------------------------------------------------------------------------
# adoption of existing CPersona databases


def _assert_adopted(db: Database) -> None:
    assert q(db, "SELECT version_num FROM alembic_version") == [(head_revision(),)]
    assert q(db, "SELECT MAX(version) FROM schema_version") == [(13,)]
    assert V13_TRIGGERS <= objects(db, "trigger")
    au = q(db, "SELECT sql FROM sqlite_master WHERE name = 'memories_fts_au'")[0][0]
    assert "AFTER UPDATE OF content" in au and "WHEN old.content <> new.content" in au
    assert HEAD_INDEXES <= objects(db, "index")
    assert q(db, "PRAGMA user_version") == [(0,)]
    fts_integrity_ok(db)
    assert_no_model_drift(db)


@pytest.mark.parametrize("fixture,version", [(V10_FIXTURE, 10), (V13_FIXTURE, 13)])
def test_adopt_legacy_fixture_keeps_every_row(tmp_path: Path, fixture: str, version: int) -> None:
    # spec MV-13, IMPL-2, MV-6 (existing tables not altered), MV-11 (stamp), IMPL-1 (schema_version
    # beside alembic_version); the fixtures hold no duplicates, so the v12 collapse removes nothing
    path = legacy_fixture(fixture, tmp_path)
    before = raw_counts(path)
    conn = sqlite3.connect(path)
    known = conn.execute("SELECT rowid FROM memories_fts WHERE memories_fts MATCH '\"AWS_PROFILE\"'").fetchall()
    jp = conn.execute("SELECT rowid FROM memories_fts WHERE memories_fts MATCH '\"火曜日\"'").fetchall()
    rows = conn.execute("SELECT * FROM memories ORDER BY id").fetchall()
    conn.close()
    assert known and jp

    db = open_and_upgrade(path)
    try:
        assert counts(db) == before
        assert fts_ids(db, "memories_fts", "AWS_PROFILE") == [r[0] for r in known]
        assert fts_ids(db, "memories_fts", "火曜日") == [r[0] for r in jp]
        assert len(fts_ids(db, "episodes_fts", "deadlo")) == before["episodes"]
        # no memory text or column rewritten (MV-13)
        assert q(db, "SELECT * FROM memories ORDER BY id") == rows
        versions = [r[0] for r in q(db, "SELECT version FROM schema_version ORDER BY version")]
        assert versions == sorted({version, 13})
        _assert_adopted(db)
    finally:
        db.close()

    # a second start is a plain upgrade of our own database
    db = open_and_upgrade(path)
    try:
        assert counts(db) == before
        _assert_adopted(db)
    finally:
        db.close()


def test_v10_adoption_fixes_stale_triggers(tmp_path: Path) -> None:
    # spec MV-1, MV-7: the v10 episodes_au fired on any column; after adoption a
    # resolved-flag update leaves the episode index alone
    db = open_and_upgrade(legacy_fixture(V10_FIXTURE, tmp_path))
    try:
        before = q(db, "SELECT id, block FROM episodes_fts_data ORDER BY id")
        w(db, "UPDATE episodes SET resolved = 1")
        assert q(db, "SELECT id, block FROM episodes_fts_data ORDER BY id") == before
    finally:
        db.close()


V1_DDL = """
CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL DEFAULT (datetime('now')));
CREATE TABLE memories (
  id INTEGER PRIMARY KEY AUTOINCREMENT, agent_id TEXT NOT NULL, msg_id TEXT NOT NULL DEFAULT '',
  content TEXT NOT NULL, source TEXT NOT NULL DEFAULT '{}', timestamp TEXT NOT NULL,
  metadata TEXT NOT NULL DEFAULT '{}', embedding BLOB, created_at TEXT NOT NULL DEFAULT (datetime('now')));
CREATE INDEX idx_memories_agent ON memories(agent_id, created_at DESC);
CREATE TABLE profiles (
  id INTEGER PRIMARY KEY AUTOINCREMENT, agent_id TEXT NOT NULL, user_id TEXT NOT NULL DEFAULT '',
  content TEXT NOT NULL, updated_at TEXT NOT NULL DEFAULT (datetime('now')), UNIQUE(agent_id, user_id));
CREATE TABLE episodes (
  id INTEGER PRIMARY KEY AUTOINCREMENT, agent_id TEXT NOT NULL, summary TEXT NOT NULL,
  keywords TEXT NOT NULL DEFAULT '', embedding BLOB, start_time TEXT, end_time TEXT,
  created_at TEXT NOT NULL DEFAULT (datetime('now')));
CREATE TABLE pending_memory_tasks (
  id INTEGER PRIMARY KEY AUTOINCREMENT, task_type TEXT NOT NULL, agent_id TEXT NOT NULL,
  payload TEXT NOT NULL, retries INTEGER NOT NULL DEFAULT 0,
  created_at TEXT NOT NULL DEFAULT (datetime('now')));
CREATE VIRTUAL TABLE episodes_fts USING fts5(summary, keywords, content=episodes, content_rowid=id);
CREATE TRIGGER episodes_ai AFTER INSERT ON episodes BEGIN
  INSERT INTO episodes_fts(rowid, summary, keywords) VALUES (new.id, new.summary, new.keywords); END;
CREATE TRIGGER episodes_ad AFTER DELETE ON episodes BEGIN
  INSERT INTO episodes_fts(episodes_fts, rowid, summary, keywords)
  VALUES ('delete', old.id, old.summary, old.keywords); END;
CREATE TRIGGER episodes_au AFTER UPDATE ON episodes BEGIN
  INSERT INTO episodes_fts(episodes_fts, rowid, summary, keywords)
  VALUES ('delete', old.id, old.summary, old.keywords);
  INSERT INTO episodes_fts(rowid, summary, keywords) VALUES (new.id, new.summary, new.keywords); END;
"""


def test_v1_database_without_version_rows_adopts(tmp_path: Path) -> None:
    # spec MV-3 (no schema_version rows = version 0), §5.1 steps v3 … v13 all run; MV-11 (stamped 13)
    path = tmp_path / "v1.db"
    conn = raw(path)
    conn.executescript(V1_DDL)
    conn.execute(
        "INSERT INTO memories (agent_id, msg_id, content, timestamp) VALUES "
        "('a', 'm1', 'deployment runbook for staging', '2024-01-01T00:00:00Z'), "
        "('a', '', '日本語のメモです', '2024-01-02T00:00:00Z')"
    )
    conn.execute("INSERT INTO episodes (agent_id, summary, keywords) VALUES ('a', 'retro meeting', 'retro')")
    conn.execute("INSERT INTO profiles (agent_id, content) VALUES ('a', 'likes tea')")
    conn.execute("INSERT INTO pending_memory_tasks (task_type, agent_id, payload) VALUES ('update_profile', 'a', '{}')")
    conn.close()
    assert probe_version(path) == 0

    db = open_and_upgrade(path)
    try:
        assert counts(db) == {"memories": 2, "episodes": 1, "profiles": 1, "pending_memory_tasks": 1}
        mem_cols = {r[1] for r in q(db, "PRAGMA table_info(memories)")}
        assert {"channel", "recall_count", "last_recalled_at", "locked", "project_id"} <= mem_cols
        ep_cols = {r[1] for r in q(db, "PRAGMA table_info(episodes)")}
        assert {"resolved", "project_id", "channel"} <= ep_cols
        assert "project_id" in {r[1] for r in q(db, "PRAGMA table_info(profiles)")}
        assert "project_id" in {r[1] for r in q(db, "PRAGMA table_info(pending_memory_tasks)")}
        # added columns carry the v13 defaults (existing rows join the global pool)
        assert q(db, "SELECT project_id, channel, recall_count, locked FROM memories") == [("", "", 0, 0)] * 2
        # FTS is now trigram: substrings inside words match, for both tables
        assert len(fts_ids(db, "memories_fts", "ployme")) == 1
        assert len(fts_ids(db, "memories_fts", "日本語")) == 1
        assert len(fts_ids(db, "episodes_fts", "etro mee")) == 1
        assert "trigram" in q(db, "SELECT sql FROM sqlite_master WHERE name = 'episodes_fts'")[0][0]
        assert q(db, "SELECT version FROM schema_version") == [(13,)]
        _assert_adopted(db)
    finally:
        db.close()


def _v11_database(path: Path) -> None:
    """A v11 database: v13 tables without the dedup indexes, v11 trigger forms."""
    conn = raw(path)
    for ddl in (*V13.BASE_TABLES_DDL, *V13.CHANNEL_INDEXES_DDL, *V13.FTS_TABLES_DDL, *V13.FTS_TRIGGERS_DDL):
        conn.execute(ddl)
    conn.execute("DROP TRIGGER memories_fts_au")
    conn.execute(
        "CREATE TRIGGER memories_fts_au AFTER UPDATE ON memories BEGIN "
        "INSERT INTO memories_fts (memories_fts, rowid, content) VALUES ('delete', old.id, old.content); "
        "INSERT INTO memories_fts (rowid, content) VALUES (new.id, new.content); END"
    )
    conn.execute("INSERT INTO schema_version (version) VALUES (11)")
    conn.close()


def _add(conn: sqlite3.Connection, rows: list[tuple]) -> None:
    conn.executemany(
        "INSERT INTO memories (id, agent_id, content, msg_id, locked, timestamp) VALUES (?, ?, ?, ?, ?, 't')", rows
    )


def test_v12_collapse_deletes_unlocked_duplicates_only(tmp_path: Path) -> None:
    # spec MV-4, DB-5
    path = tmp_path / "v11.db"
    _v11_database(path)
    conn = raw(path)
    _add(
        conn,
        [
            (1, "a", "dup", "", 0),
            (2, "a", "dup", "", 0),
            (3, "a", "dup", "", 0),
            (4, "a", "kept locked", "", 1),
            (5, "a", "kept locked", "", 0),
            (6, "a", "six", "m1", 0),
            (7, "a", "seven", "m1", 0),
            (8, "a", "eight", "m1", 1),
            (9, "b", "dup", "", 0),  # other agent: not a duplicate
        ],
    )
    conn.close()

    db = open_and_upgrade(path)
    try:
        assert q(db, "SELECT id, content, msg_id, locked FROM memories ORDER BY id") == [
            (1, "dup", "", 0),
            (4, "kept locked", "", 1),
            (6, "six", "", 0),
            (7, "seven", "", 0),
            (8, "eight", "m1", 1),
            (9, "dup", "", 0),
        ]
        assert {"idx_memories_dedup_content", "idx_memories_dedup_msg_id"} <= objects(db, "index")
        assert fts_ids(db, "memories_fts", "dup") == [1, 9]
        _assert_adopted(db)
    finally:
        db.close()


def test_v12_locked_duplicates_block_the_index_but_not_adoption(tmp_path: Path) -> None:
    # spec MV-4 (locked rows never touched), DB-6 (index failure is not fatal)
    path = tmp_path / "v11.db"
    _v11_database(path)
    conn = raw(path)
    _add(conn, [(1, "a", "same words", "", 0), (2, "a", "same words", "", 1)])
    conn.close()

    db = open_and_upgrade(path)
    try:
        assert q(db, "SELECT id, locked FROM memories ORDER BY id") == [(1, 0), (2, 1)]
        indexes = objects(db, "index")
        assert "idx_memories_dedup_content" not in indexes
        assert "idx_memories_dedup_msg_id" in indexes
        assert q(db, "SELECT version_num FROM alembic_version") == [(head_revision(),)]
        assert q(db, "SELECT MAX(version) FROM schema_version") == [(13,)]
    finally:
        db.close()


def test_adoption_that_fails_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    # spec MV-11: a ladder step that raises rolls the whole boot back (MV-8: no stamp), and the
    # caller gets a clear error rather than a half-adopted file.
    path = tmp_path / "broken.db"
    conn = raw(path)
    conn.executescript(V1_DDL)
    # a view named like a column-less table makes the v3 ALTER fail
    conn.execute("DROP TABLE episodes")
    conn.execute("CREATE VIEW episodes AS SELECT 1 AS id, 'x' AS summary, '' AS keywords")
    conn.close()
    with pytest.raises(MigrationError):
        open_and_upgrade(path)
    conn = sqlite3.connect(path)
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "alembic_version" not in names
        assert "memories_fts" not in names
        assert conn.execute("SELECT COUNT(*) FROM schema_version").fetchone() == (0,)
    finally:
        conn.close()


def test_adoption_is_one_transaction_with_the_alembic_stamp(tmp_path: Path, monkeypatch) -> None:
    # A failure after the ladder, the stamp and the Alembic upgrade (here: in the
    # every-boot repair that follows them) rolls all of it back; the v10 file keeps
    # its rows, its version and its old triggers.
    import cpersona.storage.migrate as migrate

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("simulated crash after the stamp")

    monkeypatch.setattr(migrate, "repair_on_boot", fail)
    path = legacy_fixture(V10_FIXTURE, tmp_path)
    before = raw_counts(path)
    with pytest.raises(RuntimeError, match="simulated crash"):
        open_and_upgrade(path)
    conn = sqlite3.connect(path)
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "alembic_version" not in names
        assert "memories_fts_au" not in names  # v10 had none; MV-7 would have created it
        assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone() == (10,)
    finally:
        conn.close()
    assert raw_counts(path) == before


# ---------------------------------------------------------------------------
# tooling


def _alembic(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("alembic")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPERSONA_")}
    return subprocess.run(
        [str(exe), "-c", str(REPO / "alembic.ini"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_alembic_cli_upgrade_and_check(tmp_path: Path) -> None:
    target = tmp_path / "cli.db"
    done = _alembic("-x", f"db={target}", "upgrade", "head", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    checked = _alembic("-x", f"db={target}", "check", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr + checked.stdout
    assert "No new upgrade operations detected" in checked.stdout + checked.stderr
    conn = sqlite3.connect(target)
    try:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == (head_revision(),)
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(13,)]
    finally:
        conn.close()


def test_alembic_cli_will_not_touch_an_unadopted_database(tmp_path: Path) -> None:
    path = legacy_fixture(V10_FIXTURE, tmp_path)
    before = raw_counts(path)
    done = _alembic("-x", f"db={path}", "upgrade", "head", cwd=tmp_path)
    assert done.returncode != 0
    assert "not yet adopted" in done.stderr + done.stdout
    assert raw_counts(path) == before
    assert probe_version(path) == 10


def test_v13_revision_is_the_first(tmp_path: Path) -> None:
    assert V13.revision == V13_REVISION and V13.down_revision is None
