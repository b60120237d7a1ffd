"""import-db: copying a CPersona 2.6 database into ours (spec README decision 9, storage §6)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any

import pytest
import sqlean
from sqlalchemy import text

from conftest import legacy_fixture
from cpersona.services.app import App
from cpersona.services.portability import import_db
from cpersona.storage.engine import Database
from cpersona.storage.migrate import TooNewDatabase, open_and_upgrade

V13_FIXTURE = "cpersona-2.5.12-v13-dev.db"
VEC = struct.pack("<4f", 0.5, 0.25, -1.0, 2.0)

# storage.md §6.2, verbatim layout (v15): what a 2.6 database holds and what
# our association revision will create (decision 8).
GRAPH_DDL = """
CREATE TABLE IF NOT EXISTS entities (
  id INTEGER PRIMARY KEY AUTOINCREMENT, agent_id TEXT NOT NULL,
  project_id TEXT NOT NULL DEFAULT '', channel TEXT NOT NULL DEFAULT '',
  name TEXT NOT NULL, normalized TEXT NOT NULL, declared_by TEXT NOT NULL,
  created_at TEXT NOT NULL, UNIQUE (agent_id, project_id, channel, normalized));
CREATE TABLE IF NOT EXISTS entity_aliases (
  entity_id INTEGER NOT NULL, alias TEXT NOT NULL, normalized TEXT NOT NULL,
  PRIMARY KEY (entity_id, normalized));
CREATE INDEX IF NOT EXISTS idx_entity_aliases_normalized ON entity_aliases (normalized);
CREATE TABLE IF NOT EXISTS entity_mentions (
  entity_id INTEGER NOT NULL, ref TEXT NOT NULL, declared_by TEXT NOT NULL,
  created_at TEXT NOT NULL, PRIMARY KEY (entity_id, ref));
CREATE INDEX IF NOT EXISTS idx_entity_mentions_ref ON entity_mentions (ref);
CREATE TABLE IF NOT EXISTS relations (
  id INTEGER PRIMARY KEY AUTOINCREMENT, agent_id TEXT NOT NULL,
  project_id TEXT NOT NULL DEFAULT '', channel TEXT NOT NULL DEFAULT '',
  subject_kind TEXT NOT NULL, subject_id INTEGER NOT NULL, predicate TEXT NOT NULL,
  object_kind TEXT NOT NULL, object_id INTEGER NOT NULL, anchor_ref TEXT NOT NULL DEFAULT '',
  declared_by TEXT NOT NULL, declared_at TEXT NOT NULL,
  UNIQUE (agent_id, project_id, channel, subject_kind, subject_id, predicate,
          object_kind, object_id, anchor_ref));
CREATE INDEX IF NOT EXISTS idx_relations_subject ON relations (subject_kind, subject_id);
CREATE INDEX IF NOT EXISTS idx_relations_object  ON relations (object_kind, object_id);
CREATE INDEX IF NOT EXISTS idx_relations_anchor  ON relations (anchor_ref);
CREATE TRIGGER IF NOT EXISTS associations_entities_ad AFTER DELETE ON entities BEGIN
  DELETE FROM entity_aliases  WHERE entity_id = old.id;
  DELETE FROM entity_mentions WHERE entity_id = old.id;
  DELETE FROM relations WHERE (subject_kind = 'entity' AND subject_id = old.id)
                           OR (object_kind  = 'entity' AND object_id  = old.id);
END;
CREATE TRIGGER IF NOT EXISTS associations_memories_ad AFTER DELETE ON memories BEGIN
  DELETE FROM entity_mentions WHERE ref = 'mem:' || old.id;
  DELETE FROM relations WHERE (subject_kind = 'mem' AND subject_id = old.id)
     OR (object_kind = 'mem' AND object_id = old.id) OR anchor_ref = 'mem:' || old.id;
END;
CREATE TRIGGER IF NOT EXISTS associations_episodes_ad AFTER DELETE ON episodes BEGIN
  DELETE FROM entity_mentions WHERE ref = 'ep:' || old.id;
  DELETE FROM relations WHERE (subject_kind = 'ep' AND subject_id = old.id)
     OR (object_kind = 'ep' AND object_id = old.id) OR anchor_ref = 'ep:' || old.id;
END;
"""

# storage.md §6.4 / §6.6: the other 2.6 objects a source may carry.
LATER_26_DDL = """
ALTER TABLE memories ADD COLUMN embedding_model TEXT NOT NULL DEFAULT '';
ALTER TABLE episodes ADD COLUMN embedding_model TEXT NOT NULL DEFAULT '';
CREATE TABLE IF NOT EXISTS folders (id INTEGER PRIMARY KEY AUTOINCREMENT, agent_id TEXT NOT NULL,
  project_id TEXT NOT NULL DEFAULT '', parent_id INTEGER NOT NULL DEFAULT 0, name TEXT NOT NULL,
  normalized TEXT NOT NULL, declared_by TEXT NOT NULL, created_at TEXT NOT NULL,
  UNIQUE (agent_id, project_id, parent_id, normalized));
CREATE TABLE IF NOT EXISTS folder_members (ref TEXT PRIMARY KEY, folder_id INTEGER NOT NULL,
  declared_by TEXT NOT NULL, declared_at TEXT NOT NULL);
"""

STAMP = "2026-11-30T04:01:03.873861+00:00"


def add_graph_tables(execute: Any) -> None:
    """Create the §6.2 association tables through ``execute(sql)`` (idempotent)."""
    for statement in _statements(GRAPH_DDL):
        execute(statement)


def _statements(ddl: str) -> list[str]:
    # Split on ';' at line ends, keeping trigger bodies (whose ';' end inner lines) whole.
    out, current = [], []
    for line in ddl.strip().splitlines():
        current.append(line)
        joined = "\n".join(current).strip()
        if joined.endswith(";") and (not joined.upper().startswith("CREATE TRIGGER") or joined.endswith("END;")):
            out.append(joined)
            current = []
    return out


def add_graph_tables_to(db: Database) -> None:
    if not db.is_sqlite:  # the DDL is SQLite's; PostgreSQL's migrations already made these tables
        return
    with db.write_connection() as conn:
        add_graph_tables(lambda sql: conn.exec_driver_sql(sql))


def make_26_database(tmp_path: Path) -> Path:
    """The v13 fixture turned into a 2.6-layout file (schema_version 21) with a graph."""
    path = legacy_fixture(V13_FIXTURE, tmp_path)
    path.chmod(0o600)
    con = sqlean.connect(str(path))
    con.isolation_level = None
    add_graph_tables(con.execute)
    for statement in _statements(LATER_26_DDL):
        con.execute(statement)
    con.execute("INSERT INTO schema_version (version) VALUES (21)")
    (first,) = con.execute("SELECT min(id) FROM memories WHERE agent_id = 'agent-a'").fetchone()
    con.execute("UPDATE memories SET embedding = ?, embedding_model = 'e5-small' WHERE id = ?", (VEC, first))
    rows = [
        "INSERT INTO entities VALUES (1, 'agent-a', '', '', 'Alice', 'alice', 'agent', '{s}')",
        "INSERT INTO entities VALUES (2, 'agent-a', '', '', 'ingestion pipeline', 'ingestion pipeline', 'agent', '{s}')",
        "INSERT INTO entity_aliases VALUES (1, 'A.', 'a.')",
        "INSERT INTO entity_mentions VALUES (1, 'mem:{m}', 'agent', '{s}')",
        "INSERT INTO entity_mentions VALUES (2, 'ep:1', 'operator', '{s}')",
        "INSERT INTO relations VALUES (1, 'agent-a', '', '', 'entity', 1, 'owns', 'entity', 2, 'mem:{m}', 'agent', '{s}')",
        "INSERT INTO relations VALUES (2, 'agent-a', '', '', 'mem', {m}, 'corrects', 'ep', 1, '', 'agent', '{s}')",
        "INSERT INTO pending_memory_tasks (task_type, agent_id, payload) VALUES ('build_nodes', 'agent-a', '{{}}')",
        "INSERT INTO folders VALUES (1, 'agent-a', '', 0, 'Ops', 'ops', 'agent', '{s}')",
    ]
    for sql in rows:
        con.execute(sql.format(s=STAMP, m=first))
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def scalar(db: Database, sql: str, **params: Any) -> Any:
    with db.read() as session:
        return session.execute(text(sql), params).scalar()


def test_fixture_is_a_26_database_our_server_refuses(tmp_path: Path) -> None:
    # spec README decision 9: a 2.6 file is never opened in place
    path = make_26_database(tmp_path)
    before = digest(path)
    with pytest.raises(TooNewDatabase):
        open_and_upgrade(path)
    assert digest(path) == before


def test_import_db_copies_everything_and_leaves_the_source_byte_identical(
    app: App, db: Database, tmp_path: Path
) -> None:
    source = make_26_database(tmp_path)
    before = digest(source)
    answer = import_db(app, str(source))
    assert digest(source) == before
    assert answer["ok"] is True, answer
    assert answer["source"] == str(source.resolve())
    assert answer["source_schema_version"] == 21
    assert answer["memories"] == {"copied": 72, "skipped": 0}
    assert answer["episodes"] == {"copied": 3, "skipped": 0}
    assert answer["profiles"] == {"copied": 3}
    # spec CA-2: the declared graph is copied into our association tables (revision 0003)
    assert answer["associations"] == {"entities": 2, "mentions": 2, "relations": 2}
    assert answer["not_copied"] == {"pending_tasks": 1, "folders": 1}
    assert scalar(db, "SELECT count(*) FROM memories WHERE agent_id = ''") == 24
    assert scalar(db, "SELECT count(*) FROM pending_memory_tasks") == 0

    compare = (
        "agent_id, project_id, channel, msg_id, content, source, timestamp, metadata, "
        "embedding, recall_count, last_recalled_at, locked, created_at"
    )
    con = sqlean.connect(f"file:{source}?mode=ro", uri=True)
    theirs = sorted(con.execute(f"SELECT {compare} FROM memories").fetchall(), key=repr)
    their_episodes = sorted(
        con.execute("SELECT agent_id, summary, keywords, resolved, created_at FROM episodes").fetchall()
    )
    their_profiles = sorted(con.execute("SELECT agent_id, user_id, content, updated_at FROM profiles").fetchall())
    con.close()
    with db.read() as session:
        ours = sorted((tuple(r) for r in session.execute(text(f"SELECT {compare} FROM memories"))), key=repr)
        our_episodes = sorted(
            tuple(r)
            for r in session.execute(text("SELECT agent_id, summary, keywords, resolved, created_at FROM episodes"))
        )
        our_profiles = sorted(
            tuple(r) for r in session.execute(text("SELECT agent_id, user_id, content, updated_at FROM profiles"))
        )
    assert ours == theirs
    assert our_episodes == their_episodes
    assert our_profiles == their_profiles
    assert scalar(db, "SELECT count(*) FROM memories WHERE embedding = :v", v=VEC) == 1
    assert digest(source) == before


def test_import_db_twice_copies_nothing_the_second_time(app: App, db: Database, tmp_path: Path) -> None:
    source = make_26_database(tmp_path)
    import_db(app, str(source))
    again = import_db(app, str(source))
    assert again["memories"] == {"copied": 0, "skipped": 72}
    assert again["episodes"] == {"copied": 0, "skipped": 3}
    assert scalar(db, "SELECT count(*) FROM memories") == 72


def test_import_db_carries_the_graph_when_our_tables_exist(app: App, db: Database, tmp_path: Path) -> None:
    # spec CA-2: refs point at the rows that now hold the records (ids differ)
    add_graph_tables_to(db)
    with db.write() as session:  # shift our ids so a copied ref cannot be right by accident
        for i in range(5):
            session.execute(
                text("INSERT INTO memories (agent_id, content, timestamp) VALUES ('x', :c, '')"), {"c": f"filler {i}"}
            )
    source = make_26_database(tmp_path)
    con = sqlean.connect(f"file:{source}?mode=ro", uri=True)
    ref = con.execute("SELECT ref FROM entity_mentions WHERE entity_id = 1").fetchone()[0]
    content = con.execute("SELECT content FROM memories WHERE id = ?", (int(ref[4:]),)).fetchone()[0]
    con.close()

    answer = import_db(app, str(source))
    assert answer["associations"] == {"entities": 2, "mentions": 2, "relations": 2}
    new_id = scalar(db, "SELECT id FROM memories WHERE content = :c AND agent_id = 'agent-a'", c=content)
    episode_id = scalar(db, "SELECT min(id) FROM episodes")
    assert new_id != int(ref[4:])
    with db.read() as session:
        mentions = sorted(session.execute(text("SELECT ref, declared_by FROM entity_mentions")).all())
        relations = session.execute(
            text(
                "SELECT subject_kind, subject_id, predicate, object_kind, object_id, anchor_ref "
                "FROM relations ORDER BY id"
            )
        ).all()
        aliases = session.execute(text("SELECT alias, normalized FROM entity_aliases")).all()
        entities = session.execute(text("SELECT id, name, normalized FROM entities ORDER BY id")).all()
    assert mentions == sorted([(f"mem:{new_id}", "agent"), (f"ep:{episode_id}", "operator")])
    owner, pipeline = entities[0].id, entities[1].id
    assert [tuple(r) for r in relations] == [
        ("entity", owner, "owns", "entity", pipeline, f"mem:{new_id}"),
        ("mem", new_id, "corrects", "ep", episode_id, ""),
    ]
    assert [tuple(a) for a in aliases] == [("A.", "a.")]
    # carrying twice writes once (insert-or-ignore)
    again = import_db(app, str(source))
    assert again["associations"] == {"entities": 2, "mentions": 2, "relations": 2}
    assert scalar(db, "SELECT count(*) FROM relations") == 2
    assert scalar(db, "SELECT count(*) FROM entities") == 2


def test_import_db_refusals(app: App, db: Database, tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    assert import_db(app, str(missing)) == {"ok": False, "error": f"File not found: {missing}"}
    assert import_db(app, str(tmp_path))["error"] == f"not a regular file: {tmp_path}"
    junk = tmp_path / "junk.db"
    junk.write_text("not a database at all, just text " * 100)
    answer = import_db(app, str(junk))
    assert answer["ok"] is False and "junk.db" in answer["error"]
    empty = tmp_path / "empty.db"
    sqlean.connect(str(empty)).execute("CREATE TABLE t (x)").connection.close()
    assert import_db(app, str(empty))["error"].endswith(
        "is not a CPersona database (no memories/episodes/profiles tables)"
    )
    assert "own database" in import_db(app, str(db.path))["error"]
    assert scalar(db, "SELECT count(*) FROM memories") == 0


def test_import_db_is_all_or_nothing(app: App, db: Database, tmp_path: Path) -> None:
    # One write transaction: a failure half-way leaves our database as it was.
    with db.write_connection() as conn:
        conn.exec_driver_sql(
            "CREATE TRIGGER refuse_episodes BEFORE INSERT ON episodes BEGIN SELECT RAISE(ABORT, 'disk said no'); END"
        )
    answer = import_db(app, str(make_26_database(tmp_path)))
    assert answer == {"ok": False, "error": "import-db aborted and rolled back: disk said no"}
    assert scalar(db, "SELECT count(*) FROM memories") == 0
