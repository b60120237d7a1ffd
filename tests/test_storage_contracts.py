"""Storage and recall contract points that no other test module pins down.

Each test names the spec point it checks; all run on a real SQLite file.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import sqlite3
import stat
import struct
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.schema import CreateTable

from conftest import make_app
from cpersona.config import load_settings
from cpersona.embedding.client import build_embedder
from cpersona.mcp.dispatch import Outcome
from cpersona.mcp.results import to_result
from cpersona.services.app import App
from cpersona.services.graph.associations import declare_associations
from cpersona.services.portability import export_memories, import_memories
from cpersona.services.recall.confidence import TimeSpan, memory_time_span, row_confidence
from cpersona.services.recall.service import recall
from cpersona.services.records.admin import lock_memory
from cpersona.services.records.episodes import archive_episode
from cpersona.services.records.memories import store
from cpersona.storage.engine import Database, open_sqlite
from cpersona.storage.migrate import open_and_upgrade, upgrade
from cpersona.storage.models import Memory
from cpersona.storage.models_associations import RecordNode
from cpersona.storage.scope import Scope
from cpersona.storage.search import open_search
from cpersona.storage.search_sqlite import SqliteSearch
from embed_server import EmbedServer, embed_text

REPO = Path(__file__).resolve().parent.parent
TOP = 1 / 61  # a first place on one list under rrf with K = 60
OLD_STAMP = "2026-06-02T00:00:00+00:00"  # months before any wall-clock "now" these tests run at
ISO_MICRO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}\+00:00$")


def rows(db: Database, sql: str) -> list[tuple]:
    with db.read() as session:
        return [tuple(r) for r in session.execute(text(sql))]


def add_memories(db: Database, *values: dict) -> None:
    defaults = {"agent_id": "a", "timestamp": OLD_STAMP, "source": '{"type": "Agent", "id": "a", "name": ""}'}
    with db.write() as session:
        session.execute(insert(Memory), [{**defaults, **v} for v in values])


def filler(db: Database, n: int) -> None:
    """Rows no test query matches, so a deep gate lets a halved first place through."""
    add_memories(db, *({"content": f"filler note number {i}"} for i in range(n)))


# -- files (storage §1) ---------------------------------------------------------------------


def test_one_wal_file_and_restoring_the_db_file_restores_every_memory(tmp_path: Path) -> None:  # spec FS-1
    path = tmp_path / "live" / "cpersona.db"
    db = open_and_upgrade(path)
    try:
        app = make_app(db)
        ids = [store(app, agent_id="a", content=f"remember item {i}")["id"] for i in range(3)]
        assert rows(db, "PRAGMA journal_mode") == [("wal",)]
        assert Path(f"{path}-wal").exists() and Path(f"{path}-shm").exists()
    finally:
        db.close()
    restored = tmp_path / "restored" / "cpersona.db"
    restored.parent.mkdir()
    shutil.copyfile(path, restored)  # the .db alone, without -wal / -shm
    conn = sqlite3.connect(restored)
    try:
        assert conn.execute("SELECT id, content FROM memories ORDER BY id").fetchall() == [
            (i, f"remember item {n}") for n, i in enumerate(ids)
        ]
    finally:
        conn.close()


def test_created_database_is_owner_only_and_an_existing_mode_is_kept(tmp_path: Path, caplog) -> None:  # spec FS-4
    path = tmp_path / "new-dir" / "cpersona.db"
    db = open_and_upgrade(path)
    try:
        store(make_app(db), agent_id="a", content="anything at all")
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(Path(f"{path}-wal").stat().st_mode) == 0o600  # inherited from the .db
    finally:
        db.close()
    path.chmod(0o644)
    with caplog.at_level("WARNING"):
        open_sqlite(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # never changed
    assert "readable by group or others" in caplog.text


# -- connections (storage §2) ---------------------------------------------------------------


def test_connection_pragmas_and_no_declared_foreign_keys(db: Database) -> None:  # spec PG-2, MV-5
    with db.write_connection() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    with db.read() as session:
        assert session.execute(text("PRAGMA busy_timeout")).scalar() == 5000
        tables = [r[0] for r in session.execute(text("SELECT name FROM sqlite_master WHERE type = 'table'"))]
        declared = {t: session.execute(text(f'PRAGMA foreign_key_list("{t}")')).fetchall() for t in tables}
    assert tables and all(not fks for fks in declared.values()), declared


def test_sqlite_has_fts5_with_the_trigram_tokenizer(db: Database) -> None:  # spec PG-6
    with db.write_connection() as conn:
        version = tuple(int(p) for p in conn.exec_driver_sql("SELECT sqlite_version()").scalar().split("."))
        assert version >= (3, 34)
        conn.exec_driver_sql("CREATE VIRTUAL TABLE temp.probe USING fts5(c, tokenize = 'trigram')")
        conn.exec_driver_sql("INSERT INTO temp.probe (c) VALUES ('substring search')")
        assert conn.exec_driver_sql("SELECT count(*) FROM temp.probe WHERE probe MATCH 'bstri'").scalar() == 1
        conn.exec_driver_sql("DROP TABLE temp.probe")


def _schema_fingerprint(path: Path) -> tuple:
    conn = sqlite3.connect(path)
    try:
        return (
            sorted(conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall(), key=repr),
            conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall(),
            conn.execute("SELECT version_num FROM alembic_version").fetchall(),
            conn.execute("PRAGMA user_version").fetchall(),
        )
    finally:
        conn.close()


def test_report_only_checkup_creates_and_alters_nothing(db: Database, tmp_path: Path) -> None:  # spec PG-5
    # a database the report will find broken: a report-only run must not repair it
    with db.write_connection() as conn:
        conn.exec_driver_sql("DROP TRIGGER episodes_ai")
        conn.exec_driver_sql("DELETE FROM schema_version")
    db.close()
    before = _schema_fingerprint(db.path)
    report = subprocess.run(
        [sys.executable, "-m", "cpersona.checkup", "--db", str(db.path), "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert report.stdout and json.loads(report.stdout)["checks_run"], report.stderr
    assert _schema_fingerprint(db.path) == before
    missing = tmp_path / "absent" / "none.db"
    gone = subprocess.run(
        [sys.executable, "-m", "cpersona.checkup", "--db", str(missing)], capture_output=True, text=True, cwd=tmp_path
    )
    assert gone.returncode != 0 and "database not found" in gone.stderr
    assert not missing.exists() and not missing.parent.exists()


# -- value formats (storage §3) -------------------------------------------------------------


def test_declaration_stamps_are_iso_utc_with_microseconds(app: App, db: Database) -> None:  # spec VF-3
    note = store(app, agent_id="a", content="Mina owns the Atlas ledger")["id"]
    answer = declare_associations(
        app,
        agent_id="a",
        anchor_ref=f"mem:{note}",
        associations={
            "entities": [{"name": "Mina"}, {"name": "Atlas"}],
            "relations": [{"subject": "Mina", "predicate": "owns", "object": "Atlas"}],
        },
    )
    assert answer["ok"] is True, answer
    stamps = [r[0] for r in rows(db, "SELECT created_at FROM entities")]
    stamps += [r[0] for r in rows(db, "SELECT created_at FROM entity_mentions")]
    stamps += [r[0] for r in rows(db, "SELECT declared_at FROM relations")]
    assert len(stamps) >= 4  # two entities, at least one mention, one relation
    assert all(ISO_MICRO_UTC.match(s) for s in stamps), stamps


def test_flags_are_integer_zero_or_one(app: App, db: Database) -> None:  # spec VF-6
    store(app, agent_id="a", content="an ordinary note")
    lock_memory(app, memory_id=store(app, agent_id="a", content="a pinned note")["id"])
    archive_episode(app, agent_id="a", summary="open episode")
    archive_episode(app, agent_id="a", summary="closed episode", resolved=True)
    assert rows(db, "SELECT typeof(locked), locked FROM memories ORDER BY id") == [("integer", 0), ("integer", 1)]
    assert rows(db, "SELECT typeof(resolved), resolved FROM episodes ORDER BY id") == [("integer", 0), ("integer", 1)]


# -- layout (storage §4.6, §5) --------------------------------------------------------------


def test_readers_do_not_depend_on_column_position(tmp_path: Path) -> None:  # spec DB-7
    from test_migrations import V1_DDL  # the oldest layout: every later column is added by ALTER

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(V1_DDL)
    conn.execute(
        "INSERT INTO memories (agent_id, msg_id, content, timestamp) "
        "VALUES ('a', 'm1', 'deployment runbook for staging', '2024-01-01T00:00:00+00:00')"
    )
    conn.commit()
    conn.close()
    fresh = open_and_upgrade(tmp_path / "fresh.db")
    adopted = open_and_upgrade(path)
    try:
        order = lambda d: [r[1] for r in rows(d, "PRAGMA table_info(memories)")]  # noqa: E731
        assert order(adopted) != order(fresh) and sorted(order(adopted)) == sorted(order(fresh))
        app = make_app(adopted)
        lock_memory(app, memory_id=store(app, agent_id="a", content="second note", project_id="p", channel="c")["id"])
        out = tmp_path / "out.jsonl"
        assert export_memories(app, agent_id="a", output_path=str(out))["ok"] is True
        memories = [json.loads(line) for line in out.read_text().splitlines()][1:]
        assert [(m["msg_id"], m["content"], m["project_id"], m["channel"], m["locked"]) for m in memories] == [
            ("m1", "deployment runbook for staging", "", "", 0),
            ("", "second note", "p", "c", 1),
        ]
        found = recall(app, agent_id="a", query="deployment runbook", project_id="")["messages"]
        assert [m["content"] for m in found] == ["deployment runbook for staging"]
    finally:
        fresh.close()
        adopted.close()


def test_chat_channels_from_old_releases_are_kept(tmp_path: Path) -> None:  # spec MV-2
    from test_migrations import _v11_database

    path = tmp_path / "v11.db"
    _v11_database(path)
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO memories (agent_id, content, timestamp, channel) VALUES ('a', 'old chat row', 't', 'chat')"
    )
    conn.commit()
    conn.close()
    db = open_and_upgrade(path)
    try:
        upgrade(db)
        assert rows(db, "SELECT channel FROM memories") == [("chat",)]
    finally:
        db.close()


def test_migrations_never_use_batch_mode() -> None:  # spec IMPL-3
    versions = sorted((REPO / "migrations" / "versions").glob("*.py"))
    assert len([v for v in versions if v.name[0].isdigit()]) >= 4
    for version in versions:
        source = version.read_text(encoding="utf-8")
        assert "batch_alter_table" not in source and "recreate=" not in source, version.name


def test_record_nodes_window_column_is_quoted() -> None:  # spec IMPL-5
    ddl = str(CreateTable(RecordNode.__table__).compile(dialect=sqlite_dialect.dialect()))
    assert '"window" INTEGER' in ddl
    assert RecordNode.__table__.c["window"].name.quote is True
    assert '"window"' in str(select(RecordNode.window).compile(dialect=sqlite_dialect.dialect()))


def test_vectors_are_little_endian_float32_blobs_in_the_row(
    db: Database, embed_server: EmbedServer
) -> None:  # spec IMPL-6, VF-5
    settings = load_settings(
        {
            "CPERSONA_DB_PATH": str(db.path),
            "CPERSONA_EMBEDDING_MODE": "http",
            "CPERSONA_EMBEDDING_URL": embed_server.url,
        }
    )
    app = App(db=db, settings=settings, embedder=build_embedder(settings))
    try:
        content = "the payments service rotates its secrets every ninety days"
        memory_id = store(app, agent_id="a", content=content)["id"]
    finally:
        app.embedder.close()
    (blob,) = rows(db, f"SELECT embedding FROM memories WHERE id = {memory_id}")[0]
    expected = np.asarray(embed_text(content), dtype="<f4")
    assert len(blob) == 4 * expected.size
    assert struct.unpack(f"<{expected.size}f", blob) == tuple(expected.tolist())
    # sqlite-vec's scalar functions read the same column as a float32 vector
    assert rows(db, f"SELECT vec_length(embedding) FROM memories WHERE id = {memory_id}") == [(expected.size,)]
    # no vec0 table replaces the column
    assert rows(db, "SELECT name FROM sqlite_master WHERE sql LIKE '%USING vec0%'") == []


# -- export files (storage §6, §8) ----------------------------------------------------------


def test_derived_record_nodes_are_not_exported(app: App, db: Database, tmp_path: Path) -> None:  # spec LR-6
    note = store(app, agent_id="a", content="a note with nodes")["id"]
    with db.write() as session:
        session.execute(
            insert(RecordNode),
            [
                {
                    "parent_kind": "mem",
                    "parent_id": note,
                    "node_index": 0,
                    "start_char": 0,
                    "end_char": 6,
                    "token_count": 2,
                    "window": 512,
                    "embedding": struct.pack("<2f", 0.25, 0.5),
                    "embedding_model": "m",
                }
            ],
        )
    assert (
        declare_associations(
            app, agent_id="a", anchor_ref=f"mem:{note}", associations={"entities": [{"name": "Atlas"}]}
        )["ok"]
        is True
    )
    out = tmp_path / "out.jsonl"
    assert export_memories(app, agent_id="a", output_path=str(out), include_embeddings=True)["ok"] is True
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {line["_type"] for line in lines} == {"header", "memory", "entity", "mention"}  # associations travel
    node_blob = base64.b64encode(struct.pack("<2f", 0.25, 0.5)).decode()
    assert node_blob not in out.read_text() and "node" not in json.dumps(lines[0])


@pytest.mark.parametrize("version", ["cpersona-export/1.0", "cpersona-export/1.2", "cpersona-export/7.3"])
def test_reader_accepts_every_export_version(app: App, db: Database, tmp_path: Path, version: str) -> None:  # spec JL-3
    source = tmp_path / "in.jsonl"
    header = {
        "_type": "header",
        "version": version,
        "agent_id": "a",
        "memory_count": 1,
        "episode_count": 1,
        "has_profile": False,
        "profile_count": 0,
    }
    records = [
        header,
        {"_type": "memory", "agent_id": "a", "content": "imported memory", "project_id": ""},
        {"_type": "episode", "agent_id": "a", "summary": "imported episode", "project_id": ""},
        {"_type": "some_future_record", "payload": 1},
    ]
    source.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    answer = import_memories(app, input_path=str(source))
    assert answer["ok"] is True and answer["imported_memories"] == 1, answer
    assert rows(db, "SELECT content FROM memories") == [("imported memory",)]
    assert rows(db, "SELECT summary FROM episodes") == [("imported episode",)]


# -- recall (memory-and-recall) -------------------------------------------------------------


def test_pattern_over_50000_bytes_is_not_run(db: Database) -> None:  # spec KW-2
    add_memories(db, {"content": "y" * 49_999})
    search = SqliteSearch(db, fts_enabled=False)  # the LIKE arm
    # the pattern is %query%: 49,998 + 2 bytes runs, one byte more does not
    assert [h.record.id for h in search.keyword_memories(Scope("a"), "y" * 49_998, 10).hits] == [1]
    assert search.keyword_memories(Scope("a"), "y" * 49_999, 10).hits == []
    # counted in UTF-8 bytes, not characters
    add_memories(db, {"content": "é" * 25_000})
    assert search.keyword_memories(Scope("a"), "é" * 24_999, 10).hits != []
    assert search.keyword_memories(Scope("a"), "é" * 25_000, 10).hits == []


def test_archiving_moves_the_penalty_boundary_of_its_own_scope(db: Database, app: App) -> None:  # spec AE-6
    filler(db, 100)
    add_memories(db, {"content": "alpha memory"})

    def rrf() -> float:
        (row,) = recall(app, agent_id="a", query="alpha", project_id="", deep=True)["messages"]
        return row["match_reason"]["rrf"]

    assert rrf() == TOP  # no episode yet: no boundary
    assert archive_episode(app, agent_id="a", summary="elsewhere", project_id="other")["ok"] is True
    assert rrf() == TOP  # another project's boundary does not apply
    assert archive_episode(app, agent_id="a", summary="here")["ok"] is True
    assert rrf() == pytest.approx(TOP * 0.5)  # archived now: months after the memory, the floor


def test_future_rows_never_age_and_widen_the_span(db: Database) -> None:  # spec FT-3
    settings = load_settings({"CPERSONA_DB_PATH": str(db.path)})
    now = datetime.now(timezone.utc).replace(microsecond=0)  # stamps are read at millisecond precision
    future = now + timedelta(days=30)

    def score(stamp: datetime, span: TimeSpan) -> float:
        return row_confidence(settings, now=now, span=span, cosine=None, stamp=stamp.isoformat()).score

    narrow = TimeSpan(now - timedelta(hours=100), now)
    assert score(future, narrow) == score(now, narrow)  # max(0, now - timestamp): no negative age
    add_memories(
        db,
        {"content": "old", "timestamp": (now - timedelta(hours=100)).isoformat()},
        {"content": "current", "timestamp": now.isoformat()},
    )
    assert memory_time_span(open_search(db), Scope("a")).range_hours == pytest.approx(100)
    add_memories(db, {"content": "from the future", "timestamp": future.isoformat()})
    wide = memory_time_span(open_search(db), Scope("a"))
    assert wide.newest == future and wide.range_hours == pytest.approx(100 + 30 * 24)
    old = now - timedelta(hours=100)
    assert score(old, wide) > score(old, narrow)  # decay flattened for every other row


def test_scores_are_full_precision_json_numbers(db: Database, app: App) -> None:  # spec G-8
    filler(db, 100)
    add_memories(db, {"content": "alpha memory"})
    payload = recall(app, agent_id="a", query="alpha", deep=True)
    wire = json.loads(to_result(Outcome(payload)).content[0].text)
    (row,) = wire["messages"]
    assert row["match_reason"]["rrf"] == TOP and isinstance(row["match_reason"]["rrf"], float)
    assert repr(TOP) in to_result(Outcome(payload)).content[0].text  # every digit, not rounded
    assert all(isinstance(v, (int, float)) for k, v in row["match_reason"].items() if k in ("rrf", "bm25", "cosine"))
    stored = json.loads(to_result(Outcome(store(app, agent_id="a", content="a new note"))).content[0].text)
    assert type(stored["id"]) is int  # ids are numbers on the wire, not strings
