"""Revisions 0003 (association tables) and 0004 (record nodes): layout, clean-up triggers, carrying.

Every test runs on a real SQLite file migrated to head; rows are written with
raw SQL as any writer (ours, an import, the reference) would write them, so the
triggers — not our services — are what is under test.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from alembic import command

from cpersona.services.graph.associations import declare_associations
from cpersona.services.records.memories import store
from cpersona.services.portability import export_memories, import_memories
from cpersona.services.graph.traverse import traverse
from cpersona.storage.engine import Database, open_sqlite
from cpersona.storage.migrate import alembic_config, head_revision, upgrade

from conftest import make_app

REFERENCE_BIN = Path("/work/ref-venv/bin/cpersona")
STAMP = "2026-11-30T04:01:11.432103+00:00"


def q(db: Database, sql: str, params: tuple = ()) -> list[tuple]:
    with db.read() as session:
        return [tuple(r) for r in session.connection().exec_driver_sql(sql, params).fetchall()]


def w(db: Database, sql: str, params: tuple = ()) -> int:
    with db.write_connection() as conn:
        return conn.exec_driver_sql(sql, params).lastrowid


def columns(db: Database, table: str) -> list[tuple]:
    # (name, type, notnull, default, pk position)
    return [(r[1], r[2], r[3], r[4], r[5]) for r in q(db, f"PRAGMA table_info({table})")]


def memory(db: Database, content: str, agent: str = "rc") -> int:
    return w(
        db,
        "INSERT INTO memories (agent_id, content, timestamp) VALUES (?, ?, '2026-01-01T00:00:00+00:00')",
        (agent, content),
    )


def episode(db: Database, summary: str, agent: str = "rc") -> int:
    return w(db, "INSERT INTO episodes (agent_id, summary) VALUES (?, ?)", (agent, summary))


def entity(db: Database, name: str, agent: str = "rc") -> int:
    return w(
        db,
        "INSERT INTO entities (agent_id, name, normalized, declared_by, created_at) VALUES (?, ?, ?, 'agent', ?)",
        (agent, name, name.lower(), STAMP),
    )


def relation(db: Database, subject: tuple[str, int], predicate: str, obj: tuple[str, int], anchor: str = "") -> int:
    return w(
        db,
        "INSERT INTO relations (agent_id, subject_kind, subject_id, predicate, object_kind, object_id, "
        "anchor_ref, declared_by, declared_at) VALUES ('rc', ?, ?, ?, ?, ?, ?, 'agent', ?)",
        (*subject, predicate, *obj, anchor, STAMP),
    )


def mention(db: Database, entity_id: int, ref: str) -> None:
    w(
        db,
        "INSERT INTO entity_mentions (entity_id, ref, declared_by, created_at) VALUES (?, ?, 'agent', ?)",
        (entity_id, ref, STAMP),
    )


def node(db: Database, kind: str, parent: int, index: int, start: int, end: int) -> None:
    w(
        db,
        'INSERT INTO record_nodes (parent_kind, parent_id, node_index, start_char, end_char, token_count, "window") '
        "VALUES (?, ?, ?, ?, ?, 1, 8)",
        (kind, parent, index, start, end),
    )


def relation_ids(db: Database) -> list[int]:
    return [r[0] for r in q(db, "SELECT id FROM relations ORDER BY id")]


# -- layout ----------------------------------------------------------------------------------


def test_association_tables_have_the_26_layout(db: Database) -> None:  # spec storage §6.2, LR-5
    assert columns(db, "entities") == [
        ("id", "INTEGER", 0, None, 1),
        ("agent_id", "TEXT", 1, None, 0),
        ("project_id", "TEXT", 1, "''", 0),
        ("channel", "TEXT", 1, "''", 0),
        ("name", "TEXT", 1, None, 0),
        ("normalized", "TEXT", 1, None, 0),
        ("declared_by", "TEXT", 1, None, 0),
        ("created_at", "TEXT", 1, None, 0),
    ]
    assert columns(db, "entity_aliases") == [
        ("entity_id", "INTEGER", 1, None, 1),
        ("alias", "TEXT", 1, None, 0),
        ("normalized", "TEXT", 1, None, 2),
    ]
    assert columns(db, "entity_mentions") == [
        ("entity_id", "INTEGER", 1, None, 1),
        ("ref", "TEXT", 1, None, 2),
        ("declared_by", "TEXT", 1, None, 0),
        ("created_at", "TEXT", 1, None, 0),
    ]
    assert columns(db, "relations") == [
        ("id", "INTEGER", 0, None, 1),
        ("agent_id", "TEXT", 1, None, 0),
        ("project_id", "TEXT", 1, "''", 0),
        ("channel", "TEXT", 1, "''", 0),
        ("subject_kind", "TEXT", 1, None, 0),
        ("subject_id", "INTEGER", 1, None, 0),
        ("predicate", "TEXT", 1, None, 0),
        ("object_kind", "TEXT", 1, None, 0),
        ("object_id", "INTEGER", 1, None, 0),
        ("anchor_ref", "TEXT", 1, "''", 0),
        ("declared_by", "TEXT", 1, None, 0),
        ("declared_at", "TEXT", 1, None, 0),
    ]
    indexes = {
        r[0]: r[1]
        for r in q(
            db, "SELECT name, tbl_name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_autoindex%'"
        )
    }
    assert {
        k: v for k, v in indexes.items() if v in ("entities", "entity_aliases", "entity_mentions", "relations")
    } == {
        "idx_entity_aliases_normalized": "entity_aliases",
        "idx_entity_mentions_ref": "entity_mentions",
        "idx_relations_subject": "relations",
        "idx_relations_object": "relations",
        "idx_relations_anchor": "relations",
    }
    # the two unique keys
    e = entity(db, "Mina")
    with pytest.raises(Exception, match="UNIQUE"):
        entity(db, "Mina")
    relation(db, ("entity", e), "owns", ("entity", e), "mem:4")
    with pytest.raises(Exception, match="UNIQUE"):
        relation(db, ("entity", e), "owns", ("entity", e), "mem:4")
    relation(db, ("entity", e), "owns", ("entity", e), "")  # another anchor: another relation


def test_record_nodes_table_has_the_26_layout(db: Database) -> None:  # spec storage §6.1
    assert columns(db, "record_nodes") == [
        ("parent_kind", "TEXT", 1, None, 1),
        ("parent_id", "INTEGER", 1, None, 2),
        ("node_index", "INTEGER", 1, None, 3),
        ("start_char", "INTEGER", 1, None, 0),
        ("end_char", "INTEGER", 1, None, 0),
        ("token_count", "INTEGER", 1, None, 0),
        ("window", "INTEGER", 1, None, 0),
        ("embedding", "BLOB", 0, None, 0),
        ("embedding_model", "TEXT", 1, "''", 0),
    ]
    assert [
        r[0]
        for r in q(
            db,
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'record_nodes' "
            "AND name NOT LIKE 'sqlite_autoindex%'",
        )
    ] == []


def test_later_revisions_claim_no_schema_version(db: Database) -> None:  # spec README decision 8, LR-4
    assert q(db, "SELECT version FROM schema_version") == [(13,)]
    assert q(db, "SELECT version_num FROM alembic_version") == [(head_revision(),)]


def test_downgrade_below_the_association_revisions_and_back(db: Database) -> None:
    m = memory(db, "kept")
    with db.write_connection() as conn:
        command.downgrade(alembic_config(conn), "0002_unversioned_indexes")
    tables = {r[0] for r in q(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not tables & {"entities", "entity_aliases", "entity_mentions", "relations", "record_nodes"}
    assert not [
        r
        for r in q(db, "SELECT name FROM sqlite_master WHERE type = 'trigger'")
        if r[0].startswith(("associations_", "record_nodes_"))
    ]
    w(db, "DELETE FROM memories WHERE id = ?", (m,))  # no trigger left pointing at a dropped table
    upgrade(db)
    assert q(db, "SELECT version_num FROM alembic_version") == [(head_revision(),)]
    entity(db, "back again")


# -- clean-up triggers (LR-1, LR-2, LR-3) -----------------------------------------------------


def test_deleting_a_memory_removes_its_mentions_and_every_relation_naming_it(db: Database) -> None:  # LR-2
    m1, m2, keep = memory(db, "one"), memory(db, "two"), memory(db, "three")
    e1, e2 = entity(db, "Atlas"), entity(db, "Postgres")
    mention(db, e1, f"mem:{m1}")
    mention(db, e2, f"mem:{keep}")
    as_subject = relation(db, ("mem", m1), "supports", ("mem", m2))
    as_object = relation(db, ("mem", m2), "corrects", ("mem", m1))
    as_anchor = relation(db, ("entity", e1), "uses", ("entity", e2), f"mem:{m1}")
    survivor = relation(db, ("entity", e1), "uses", ("entity", e2), f"mem:{keep}")
    assert {as_subject, as_object, as_anchor} < set(relation_ids(db))

    w(db, "DELETE FROM memories WHERE id = ?", (m1,))
    assert q(db, "SELECT entity_id, ref FROM entity_mentions") == [(e2, f"mem:{keep}")]
    assert relation_ids(db) == [survivor]
    # LR-3: entities outlive their last mention
    assert q(db, "SELECT count(*) FROM entities") == [(2,)]


def test_deleting_an_episode_removes_its_mentions_and_relations(db: Database) -> None:  # LR-2
    ep = episode(db, "a summary")
    m = memory(db, "same id space, other kind")
    e = entity(db, "Q")
    mention(db, e, f"ep:{ep}")
    mention(db, e, f"mem:{m}")
    relation(db, ("ep", ep), "supersedes", ("mem", m))
    anchored = relation(db, ("entity", e), "p", ("entity", e), f"ep:{ep}")
    kept = relation(db, ("mem", m), "supports", ("mem", m))
    w(db, "DELETE FROM episodes WHERE id = ?", (ep,))
    assert q(db, "SELECT ref FROM entity_mentions") == [(f"mem:{m}",)]
    assert relation_ids(db) == [kept]
    assert anchored not in relation_ids(db)


def test_deleting_an_entity_removes_its_aliases_mentions_and_relations(db: Database) -> None:  # LR-2
    m = memory(db, "note")
    e1, e2, e3 = entity(db, "A"), entity(db, "B"), entity(db, "C")
    w(db, "INSERT INTO entity_aliases (entity_id, alias, normalized) VALUES (?, 'a1', 'a1'), (?, 'b1', 'b1')", (e1, e2))
    mention(db, e1, f"mem:{m}")
    mention(db, e2, f"mem:{m}")
    relation(db, ("entity", e1), "p", ("entity", e2))
    relation(db, ("entity", e3), "p", ("entity", e1))
    kept = relation(db, ("entity", e2), "p", ("entity", e3))
    w(db, "DELETE FROM entities WHERE id = ?", (e1,))
    assert q(db, "SELECT entity_id FROM entity_aliases") == [(e2,)]
    assert q(db, "SELECT entity_id FROM entity_mentions") == [(e2,)]
    assert relation_ids(db) == [kept]


def test_editing_a_record_keeps_its_declarations(db: Database) -> None:  # §1: a text edit touches none
    m = memory(db, "before")
    e = entity(db, "A")
    mention(db, e, f"mem:{m}")
    r = relation(db, ("mem", m), "supports", ("mem", m), f"mem:{m}")
    w(db, "UPDATE memories SET content = 'after' WHERE id = ?", (m,))
    assert q(db, "SELECT count(*) FROM entity_mentions") == [(1,)]
    assert relation_ids(db) == [r]


def test_nodes_follow_their_parent(db: Database) -> None:  # LR-1
    m, other = memory(db, "0123456789"), memory(db, "abcdefghij")
    ep = episode(db, "episode text")
    for kind, parent in (("mem", m), ("mem", other), ("ep", ep)):
        node(db, kind, parent, 0, 0, 5)
        node(db, kind, parent, 1, 5, 10)

    def count(kind: str, parent: int) -> int:
        return q(db, "SELECT count(*) FROM record_nodes WHERE parent_kind = ? AND parent_id = ?", (kind, parent))[0][0]

    # only a real text change removes them; counters and unchanged text do not
    w(db, "UPDATE memories SET recall_count = 3, content = content WHERE id = ?", (m,))
    assert count("mem", m) == 2
    w(db, "UPDATE memories SET content = 'changed!!!' WHERE id = ?", (m,))
    assert count("mem", m) == 0 and count("mem", other) == 2
    w(db, "UPDATE episodes SET keywords = 'k', summary = summary WHERE id = ?", (ep,))
    assert count("ep", ep) == 2
    w(db, "UPDATE episodes SET summary = 'new summary' WHERE id = ?", (ep,))
    assert count("ep", ep) == 0
    w(db, "DELETE FROM memories WHERE id = ?", (other,))
    assert q(db, "SELECT count(*) FROM record_nodes") == [(0,)]
    node(db, "ep", ep, 0, 0, 3)
    w(db, "DELETE FROM episodes WHERE id = ?", (ep,))
    assert q(db, "SELECT count(*) FROM record_nodes") == [(0,)]


# -- carrying (CA-1, CA-2) ---------------------------------------------------------------------


def _declare_sample(app) -> None:
    store(app, agent_id="rc", content="Kirari maintains the MizEye vision module")
    store(app, agent_id="rc", content="MizEye depends on OpenCV", project_id="P")
    declare_associations(
        app,
        agent_id="rc",
        anchor_ref="mem:1",
        associations={
            "entities": [{"name": "MizEye", "aliases": ["mizeye", "ミズアイ"]}, {"name": "Kirari"}],
            "relations": [
                {"subject": "Kirari", "predicate": "Maintains", "object": "MizEye"},
                {"subject": "mem:2", "predicate": "supports", "object": "mem:1"},
            ],
        },
    )
    declare_associations(
        app,
        agent_id="rc",
        anchor_ref="mem:2",
        project_id="P",
        associations={
            "entities": [{"name": "OpenCV"}],
            "relations": [{"subject": "MizEye", "predicate": "depends on", "object": "OpenCV"}],
        },
    )


def test_export_then_import_carries_the_graph(db: Database, tmp_path: Path) -> None:  # spec CA-1, CA-2
    app = make_app(db)
    _declare_sample(app)
    out = tmp_path / "graph.jsonl"
    assert export_memories(app, agent_id="rc", output_path=str(out))["ok"] is True
    kinds = [json.loads(line)["_type"] for line in out.read_text().splitlines()[1:]]
    assert kinds.count("entity") == 3 and kinds.count("mention") == 3 and kinds.count("relation") == 3

    target = open_sqlite(tmp_path / "target" / "t.db")
    upgrade(target)
    try:
        other = make_app(target)
        store(other, agent_id="rc", content="an older memory shifts every id by one")
        answer = import_memories(other, input_path=str(out))
        assert answer["ok"] is True
        assert answer["associations"] == {"entities": 3, "mentions": 3, "relations": 3}
        before = traverse(app, agent_id="rc", entity="mizeye")
        after = traverse(other, agent_id="rc", entity="mizeye")
        # the same graph, its record refs re-pointed to the rows that now hold them
        assert [(e["name"], e["hops"], e.get("aliases")) for e in after["entities"]] == [
            (e["name"], e["hops"], e.get("aliases")) for e in before["entities"]
        ]
        assert {m for e in after["entities"] for m in e.get("mentions", [])} == {"mem:2", "mem:3"}
        assert [r["predicate"] for r in after["relations"]] == [r["predicate"] for r in before["relations"]]
        rows = q(
            target,
            "SELECT subject_kind, subject_id, predicate, object_kind, object_id FROM relations "
            "WHERE subject_kind = 'mem'",
        )
        assert rows == [("mem", 3, "supports", "mem", 2)]
        # carrying twice writes once
        again = import_memories(other, input_path=str(out))
        assert q(target, "SELECT count(*) FROM relations") == [(3,)]
        assert again["ok"] is True
    finally:
        target.close()


def _reference_call(env: dict[str, str], tool: str, arguments: dict) -> dict:
    """One tool call to the reference over stdio (a black box: never imported)."""
    process = subprocess.Popen(
        [str(REFERENCE_BIN)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:

        def send(message: dict) -> None:
            process.stdin.write(json.dumps(message) + "\n")
            process.stdin.flush()

        def answer(wanted: int) -> dict:
            while True:
                line = process.stdout.readline()
                assert line, "the reference closed its output"
                message = json.loads(line)
                if message.get("id") == wanted:
                    return message

        send(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"},
                },
            }
        )
        answer(0)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}})
        return json.loads(answer(1)["result"]["content"][0]["text"])
    finally:
        process.stdin.close()
        process.wait(timeout=30)


@pytest.mark.skipif(not REFERENCE_BIN.exists(), reason="the reference CPersona 2.6.14 is not installed here")
def test_the_reference_opens_our_database_and_reads_our_graph(db: Database, tmp_path: Path) -> None:  # LR-5
    app = make_app(db)
    _declare_sample(app)
    ours = traverse(app, agent_id="rc", entity="mizeye")
    copy = tmp_path / "copy.db"
    db.close()
    for suffix in ("", "-wal", "-shm"):
        src = Path(str(db.path) + suffix)
        if src.exists():
            shutil.copyfile(src, str(copy) + suffix)
    env = {**os.environ, "CPERSONA_DB_PATH": str(copy), "CPERSONA_UPDATE_CHECK": "false"}
    theirs = _reference_call(env, "traverse", {"agent_id": "rc", "entity": "mizeye"})
    assert theirs == ours
    # it kept our tables (CREATE … IF NOT EXISTS found them compatible) and stamped its own version
    conn = sqlite3.connect(copy)
    try:
        assert conn.execute("SELECT count(*) FROM relations").fetchone() == (3,)
        assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] > 13
    finally:
        conn.close()
