"""export_memories / import_memories over real SQLite files (spec admin-and-safety §6-§7, storage §8)."""

from __future__ import annotations

import base64
import json
import os
import struct
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from conftest import LEGACY_DIR
from sqlalchemy import select, text

from conftest import make_app, refuse_inserts
from cpersona.services.app import App
from cpersona.services.portability import (
    export_memories,
    import_memories,
    paused_import_body,
    vet_import,
)
from cpersona.services.portability import jsonl as jsonl_module
from cpersona.services.responses import ToolFailure
from cpersona.storage.engine import Database, open_sqlite
from cpersona.storage.migrate import upgrade
from cpersona.storage.models import Episode, Memory, Profile

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

LEGACY = LEGACY_DIR  # tests/fixtures/legacy
ONE_AGENT = LEGACY / "export-2.6.14-dev.jsonl"
ALL_AGENTS = LEGACY / "export-2.6.14-dev-all-agents.jsonl"

VEC = struct.pack("<3f", 0.25, -1.5, 3.0)

MEMORY_COLUMNS = (
    "agent_id",
    "project_id",
    "channel",
    "msg_id",
    "content",
    "source",
    "timestamp",
    "metadata",
    "embedding",
    "recall_count",
    "last_recalled_at",
    "locked",
    "created_at",
)
EPISODE_COLUMNS = (
    "agent_id",
    "project_id",
    "channel",
    "summary",
    "keywords",
    "embedding",
    "start_time",
    "end_time",
    "resolved",
    "created_at",
)
PROFILE_COLUMNS = ("agent_id", "user_id", "project_id", "content", "updated_at")


# --- helpers ------------------------------------------------------------------


@pytest.fixture
def fresh(tmp_path: Path) -> Database:
    """A second, empty database (the restore target)."""
    database = open_sqlite(tmp_path / "restore" / "fresh.db")
    upgrade(database)
    yield database
    database.close()


def add(db: Database, model: type, **values: Any) -> int:
    with db.write() as session:
        row = model(**values)
        session.add(row)
        session.flush()
        return row.id


def add_memory(db: Database, **values: Any) -> int:
    base = {"agent_id": "alice", "content": "a memory", "timestamp": "2026-01-01T00:00:00+00:00"}
    return add(db, Memory, **{**base, **values})


def rows(db: Database, table: str, columns: tuple[str, ...]) -> list[tuple]:
    with db.read() as session:
        found = session.execute(text(f"SELECT {', '.join(columns)} FROM {table}")).all()
    return sorted((tuple(r) for r in found), key=repr)


def count(db: Database, table: str, where: str = "1=1", **params: Any) -> int:
    with db.read() as session:
        return session.execute(text(f"SELECT count(*) FROM {table} WHERE {where}"), params).scalar_one()


def write_jsonl(path: Path, *records: Any, header: dict | None = None) -> Path:
    with path.open("w", encoding="utf-8") as out:
        if header is not None:
            out.write(json.dumps({"_type": "header", "version": "cpersona-export/1.1", **header}) + "\n")
        for record in records:
            out.write((record if isinstance(record, str) else json.dumps(record)) + "\n")
    return path


def mem(content: str, **values: Any) -> dict[str, Any]:
    return {"_type": "memory", "agent_id": "alice", "content": content, "project_id": "", **values}


def seed_mixed_corpus(db: Database) -> None:
    """Rows on every axis, with every column that must survive a round trip."""
    add_memory(
        db,
        agent_id="alice",
        project_id="home",
        msg_id="m-1",
        content="Alice's cat is Miso 🐈",
        source='{"type": "Agent", "id": "alice", "name": ""}',
        metadata_='{"k": [1, 2]}',
        locked=1,
        recall_count=7,
        last_recalled_at="2026-11-30 04:00:00",
        created_at="2025-01-02 03:04:05",
        embedding=VEC,
    )
    add_memory(
        db,
        agent_id="",
        channel="discord",
        content="a row of the empty-agent bucket",
        source="not json {",
        metadata_='{"a": NaN}',
        created_at="2025-02-03 04:05:06",
    )
    add_memory(
        db,
        agent_id="bob",
        project_id="work",
        channel="slack",
        content="line one\u2028still the same line",
        timestamp="2099-01-01T00:00:00Z",
    )
    add(
        db,
        Episode,
        agent_id="alice",
        project_id="home",
        summary="Talked about Miso.",
        keywords="cat miso",
        start_time="2026-01-01T09:00:00+00:00",
        end_time="2026-01-01T10:00:00+00:00",
        resolved=1,
        created_at="2025-03-04 05:06:07",
        embedding=VEC,
    )
    add(db, Episode, agent_id="", channel="discord", summary="Empty-agent session.")
    add(db, Profile, agent_id="alice", content="Likes cats.", updated_at="2025-04-05 06:07:08")
    add(db, Profile, agent_id="", user_id="u-1", project_id="p", content="Default profile.")


def read_file(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]


# --- export -------------------------------------------------------------------


def test_round_trip_restores_every_row_and_column(app: App, db: Database, fresh: Database, tmp_path: Path) -> None:
    # spec JL-9: export -> import into an empty store restores every record with
    # its isolation axes, locked, recall counters, created_at and vectors.
    seed_mixed_corpus(db)
    out = tmp_path / "dump.jsonl"
    exported = export_memories(app, agent_id="", output_path=str(out), include_embeddings=True)
    assert exported == {"ok": True, "path": str(out), "memories": 3, "episodes": 2, "profiles": 2}

    restored = import_memories(make_app(fresh), input_path=str(out))
    assert restored["ok"] is True
    assert (restored["imported_memories"], restored["imported_episodes"]) == (3, 2)
    assert restored["profile_updated"] is True
    assert rows(fresh, "memories", MEMORY_COLUMNS) == rows(db, "memories", MEMORY_COLUMNS)
    assert rows(fresh, "episodes", EPISODE_COLUMNS) == rows(db, "episodes", EPISODE_COLUMNS)
    assert rows(fresh, "profiles", PROFILE_COLUMNS) == rows(db, "profiles", PROFILE_COLUMNS)


def test_export_file_format_header_order_and_framing(app: App, db: Database, tmp_path: Path) -> None:
    # spec JL-1 framing, JL-2 order, JL-4 exact counts, EX-8 / JL-5 non-JSON columns.
    seed_mixed_corpus(db)
    out = tmp_path / "dump.jsonl"
    export_memories(app, agent_id="", output_path=str(out))
    raw = out.read_text(encoding="utf-8")
    assert raw.endswith("\n") and "\\u" not in raw.split("\n")[1]  # non-ASCII unescaped
    assert "🐈" in raw and "\u2028" in raw
    records = read_file(out)
    header = records[0]
    assert header["_type"] == "header" and header["version"] == "cpersona-export/1.1"
    assert header["agent_id"] == ""
    kinds = [r["_type"] for r in records[1:]]
    assert kinds == ["memory"] * 3 + ["episode"] * 2 + ["profile"] * 2
    assert (header["memory_count"], header["episode_count"], header["profile_count"]) == (3, 2, 2)
    assert header["has_profile"] is True
    assert (header["entity_count"], header["mention_count"], header["relation_count"]) == (0, 0, 0)
    memories = records[1:4]
    assert [m["id"] for m in memories] == sorted(m["id"] for m in memories)
    assert memories[0]["source"] == {"type": "Agent", "id": "alice", "name": ""}
    assert memories[0]["locked"] == 1 and memories[0]["recall_count"] == 7
    # EX-7: no vectors unless asked
    assert all("embedding_b64" not in r for r in records)
    # EX-8: a column that is not JSON travels verbatim beside {}
    empty_agent = memories[1]
    assert empty_agent["source"] == {} and empty_agent["source_text"] == "not json {"
    assert empty_agent["metadata"] == {} and empty_agent["metadata_text"] == '{"a": NaN}'
    assert [p["agent_id"] for p in records[6:]] == ["", "alice"]  # ascending agent_id
    assert records[4]["resolved"] is True


def test_export_of_one_agent_and_of_an_unknown_agent(app: App, db: Database, tmp_path: Path) -> None:
    # spec §6: agent_id "" = every agent; otherwise exactly that agent (AX-2: '' is
    # never a wildcard for other agents on reads, but export's "" means all).
    seed_mixed_corpus(db)
    out = tmp_path / "alice.jsonl"
    answer = export_memories(app, agent_id="alice", output_path=str(out), include_embeddings=True)
    assert (answer["memories"], answer["episodes"], answer["profiles"]) == (1, 1, 1)
    records = read_file(out)
    assert {r["agent_id"] for r in records[1:]} == {"alice"}
    assert records[0]["agent_id"] == "alice"
    # spec EX-7 / JL-6: the vector as base64 of the stored blob, with its label
    assert base64.b64decode(records[1]["embedding_b64"]) == VEC
    assert records[1]["embedding_model"] == ""

    nobody = tmp_path / "nobody.jsonl"
    answer = export_memories(app, agent_id="nobody", output_path=str(nobody))
    assert (answer["memories"], answer["episodes"], answer["profiles"]) == (0, 0, 0)
    assert [r["_type"] for r in read_file(nobody)] == ["header"]


def test_export_counts_come_from_one_snapshot(
    app: App, db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # spec EX-6 / JL-4: a write committed while the export pages through the
    # table is neither counted nor written; header counts equal the records.
    for i in range(5):
        add_memory(db, content=f"memory {i}")
    monkeypatch.setattr("cpersona.storage.repositories.snapshot.PAGE_SIZE", 2)
    original = jsonl_module.memory_record
    calls = {"n": 0}

    def write_during_export(row: Any, include: bool) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            add_memory(db, content="written while the export runs")
        return original(row, include)

    monkeypatch.setattr(jsonl_module, "memory_record", write_during_export)
    out = tmp_path / "snap.jsonl"
    assert export_memories(app, agent_id="alice", output_path=str(out))["memories"] == 5
    records = read_file(out)
    assert records[0]["memory_count"] == 5
    assert [r["content"] for r in records[1:]] == [f"memory {i}" for i in range(5)]
    assert count(db, "memories") == 6


def test_export_replaces_atomically_and_cleans_up_on_failure(
    app: App, db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # spec EX-5: temp file in the same directory, renamed only when complete; on
    # failure the previous file is untouched and no temporary file remains.
    add_memory(db, content="first")
    out = tmp_path / "deep" / "er" / "dump.jsonl"
    assert export_memories(app, agent_id="", output_path=str(out))["ok"] is True
    assert (out.stat().st_mode & 0o777) == 0o600
    assert (out.parent.stat().st_mode & 0o777) == (out.parent.parent.stat().st_mode & 0o777) == 0o700
    before = out.read_bytes()

    def broken(row: Any, include: bool) -> dict[str, Any]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jsonl_module, "memory_record", broken)
    answer = export_memories(app, agent_id="", output_path=str(out))
    assert answer == {"ok": False, "error": f"could not write {out}: No space left on device"}
    assert out.read_bytes() == before
    assert os.listdir(out.parent) == ["dump.jsonl"]


def test_export_onto_a_directory_is_a_clear_error(app: App, tmp_path: Path) -> None:
    # The reference crashes here ({"error": "[Errno 21] ..."}); we answer ok:false.
    target = tmp_path / "adir"
    target.mkdir()
    answer = export_memories(app, agent_id="", output_path=str(target))
    assert answer["ok"] is False and str(target) in answer["error"]
    assert os.listdir(target) == [] and sorted(os.listdir(tmp_path)) == ["adir", "mem"]


# --- path confinement ---------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "dump\x00.jsonl", "../dump.jsonl", "out/../../x.jsonl", "a\\..\\b"])
def test_paths_rejected_without_export_dir(app: App, bad: str) -> None:
    # spec EX-1 (empty, NUL), EX-3 (a `..` segment), EX-4 (message)
    assert export_memories(app, agent_id="", output_path=bad) == {
        "ok": False,
        "error": f"output_path rejected (path traversal or outside export dir): {bad}",
    }
    assert import_memories(app, input_path=bad) == {
        "ok": False,
        "error": f"input_path rejected (path traversal or outside export dir): {bad}",
    }


def test_dots_inside_a_name_are_not_traversal(app: App, tmp_path: Path) -> None:
    # spec EX-3: only a segment that is exactly ".." is refused
    out = tmp_path / "a..b.jsonl"
    assert export_memories(app, agent_id="", output_path=str(out))["path"] == str(out)


def test_export_dir_confines_and_resolves(db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # spec EX-2: the resolved path must be inside CPERSONA_EXPORT_DIR; EX-9: the
    # answer's path is the resolved one.
    root = tmp_path / "exports"
    root.mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    app = make_app(db, EXPORT_DIR=str(root))
    monkeypatch.chdir(root)

    answer = export_memories(app, agent_id="", output_path="sub/dump.jsonl")
    assert answer["ok"] is True and answer["path"] == str(root / "sub" / "dump.jsonl")
    assert (root / "sub" / "dump.jsonl").is_file()
    inside_via_dots = str(root / "sub" / ".." / "ok.jsonl")  # resolves inside: allowed
    assert export_memories(app, agent_id="", output_path=inside_via_dots)["path"] == str(root / "ok.jsonl")
    for bad in (str(outside / "x.jsonl"), "escape/x.jsonl", str(root) + "-sibling/x.jsonl", "../x.jsonl"):
        answer = export_memories(app, agent_id="", output_path=bad)
        assert answer == {"ok": False, "error": f"output_path rejected (path traversal or outside export dir): {bad}"}
    assert not list(outside.iterdir())
    assert import_memories(app, input_path="escape/x.jsonl")["error"].startswith("input_path rejected")


def test_import_vetting_messages(db: Database, tmp_path: Path) -> None:
    # spec IM-1
    app = make_app(db, MAX_IMPORT_BYTES="200")
    missing = tmp_path / "missing.jsonl"
    assert import_memories(app, input_path=str(missing)) == {"ok": False, "error": f"File not found: {missing}"}
    assert import_memories(app, input_path=str(tmp_path)) == {
        "ok": False,
        "error": f"input_path is not a regular file: {tmp_path}",
    }
    big = write_jsonl(tmp_path / "big.jsonl", *[mem(f"memory number {i}") for i in range(10)])
    assert import_memories(app, input_path=str(big)) == {
        "ok": False,
        "error": f"input file exceeds CPERSONA_MAX_IMPORT_BYTES (200): {big}",
    }
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes(b'{"_type": "memory", "agent_id": "a", "content": "caf\xe9"}\n')
    answer = import_memories(app, input_path=str(latin))
    assert answer["ok"] is False and answer["error"].startswith(f"could not read {latin}: ")
    # the facade's pre-gate vetting raises the same refusals
    with pytest.raises(ToolFailure, match="File not found"):
        vet_import(app, str(missing))
    assert count(db, "memories") == 0


# --- importing the reference's exports ----------------------------------------


@pytest.mark.parametrize("fixture", [ONE_AGENT, ALL_AGENTS], ids=["one-agent", "all-agents"])
def test_reference_exports_import_losslessly(app: App, db: Database, fixture: Path) -> None:
    # spec JL-9 with files written by CPersona 2.6.14; decision 7: rows of the
    # empty-agent bucket are kept (the reference refuses them).
    records = read_file(fixture)
    header = records[0]
    answer = import_memories(app, input_path=str(fixture))
    assert answer["ok"] is True
    assert answer["imported_memories"] == header["memory_count"] == count(db, "memories")
    assert answer["imported_episodes"] == header["episode_count"] == count(db, "episodes")
    assert count(db, "profiles") == header["profile_count"]
    assert answer["skipped_memories"] == answer["skipped_episodes"] == 0
    # spec CA-2: the declared graph comes along (revision 0003 created its tables)
    assert answer["associations"] == {
        "entities": header["entity_count"],
        "mentions": header["mention_count"],
        "relations": header["relation_count"],
    }
    assert not any("were not restored" in e for e in answer.get("errors", []))

    expected = [r for r in records if r["_type"] == "memory"]
    with db.read() as session:
        stored = session.execute(select(Memory).order_by(Memory.id)).scalars().all()
        for record, row in zip(expected, stored, strict=True):
            assert (row.agent_id, row.project_id, row.channel, row.msg_id) == (
                record["agent_id"],
                record["project_id"],
                record["channel"],
                record["msg_id"],
            )
            assert (row.content, row.timestamp, row.created_at) == (
                record["content"],
                record["timestamp"],
                record["created_at"],
            )
            assert (row.locked, row.recall_count, row.last_recalled_at) == (
                record["locked"],
                record["recall_count"],
                record["last_recalled_at"],
            )
            assert json.loads(row.source) == record["source"]
            assert json.loads(row.metadata_) == record["metadata"]
        episodes = session.execute(select(Episode).order_by(Episode.id)).scalars().all()
        for record, row in zip([r for r in records if r["_type"] == "episode"], episodes, strict=True):
            assert (row.agent_id, row.summary, row.keywords, row.resolved, row.created_at) == (
                record["agent_id"],
                record["summary"],
                record["keywords"],
                int(record["resolved"]),
                record["created_at"],
            )
        profiles = {(p.agent_id, p.user_id): p for p in session.execute(select(Profile)).scalars()}
        for record in (r for r in records if r["_type"] == "profile"):
            got = profiles[(record["agent_id"], record["user_id"])]
            assert (got.content, got.updated_at) == (record["content"], record["updated_at"])
    if fixture == ALL_AGENTS:
        assert count(db, "memories", "agent_id = ''") == 24
        assert count(db, "episodes", "agent_id = ''") == 1
        assert count(db, "profiles", "agent_id = ''") == 1


def test_reimport_is_a_no_op(app: App, db: Database) -> None:
    # spec IM-15: the second import of the same file imports nothing
    import_memories(app, input_path=str(ALL_AGENTS))
    before = (rows(db, "memories", MEMORY_COLUMNS), rows(db, "episodes", EPISODE_COLUMNS))
    again = import_memories(app, input_path=str(ALL_AGENTS))
    assert (again["imported_memories"], again["skipped_memories"]) == (0, 72)
    assert (again["imported_episodes"], again["skipped_episodes"]) == (0, 3)
    assert (rows(db, "memories", MEMORY_COLUMNS), rows(db, "episodes", EPISODE_COLUMNS)) == before


def test_target_agent_id_rewrites_every_record(app: App, db: Database) -> None:
    # spec IM-4: a non-empty target_agent_id writes every record under it; the
    # profile key (agent, user_id) then repeats and only the first applies (IM-8).
    answer = import_memories(app, input_path=str(ALL_AGENTS), target_agent_id="zz")
    assert count(db, "memories") == count(db, "memories", "agent_id = 'zz'") == answer["imported_memories"]
    # the three agents stored the same texts in the same buckets: collapsed by dedup
    assert answer["imported_memories"] + answer["skipped_memories"] == 72
    assert answer["skipped_memories"] > 0
    assert count(db, "profiles") == 1
    assert sum("only the first one is applied" in e for e in answer["errors"]) == 2


# --- dry run ------------------------------------------------------------------


def test_dry_run_writes_nothing_and_counts_like_a_real_run(
    app: App, db: Database, fresh: Database, tmp_path: Path
) -> None:
    # spec IM-14: counts equal a real run's, within-file duplicates included.
    add_memory(db, content="already here")
    source = write_jsonl(
        tmp_path / "in.jsonl",
        mem("already here"),
        mem("new one", msg_id="x-1"),
        mem("new one again", msg_id="x-1"),
        mem("new two"),
        mem("new two"),
        {"_type": "episode", "agent_id": "alice", "summary": "ep", "project_id": ""},
        {"_type": "episode", "agent_id": "alice", "summary": "ep", "project_id": ""},
        {"_type": "profile", "agent_id": "alice", "content": "p", "updated_at": "2026-01-01 00:00:00"},
    )
    before = rows(db, "memories", MEMORY_COLUMNS)
    dry = import_memories(app, input_path=str(source), dry_run=True)
    assert rows(db, "memories", MEMORY_COLUMNS) == before
    assert count(db, "episodes") == count(db, "profiles") == 0
    real = import_memories(app, input_path=str(source))
    assert dry == {**real, "dry_run": True}
    assert (real["imported_memories"], real["skipped_memories"]) == (2, 3)
    assert (real["imported_episodes"], real["skipped_episodes"]) == (1, 1)


# --- bad input ----------------------------------------------------------------


def test_malformed_lines_are_reported_and_the_rest_imports(app: App, db: Database, tmp_path: Path) -> None:
    # spec IM-3 / IM-4 / IM-5 / §7.3 example: per-line errors with 1-based line
    # numbers; nothing else is affected and no half-written row remains.
    source = write_jsonl(
        tmp_path / "in.jsonl",
        mem("first"),  # line 1
        "this is not json",  # line 2
        "[1, 2]",  # line 3
        {"_type": "weird"},  # line 4
        {"_type": "memory", "content": "no agent"},  # line 5
        mem("int agent", agent_id=7),  # line 6
        mem("bad count", recall_count="many"),  # line 7
        mem(12345),  # line 8
        {"note": "no _type: ignored silently"},  # line 9
        "",  # line 10 (blank)
        mem("last"),  # line 11
    )
    answer = import_memories(app, input_path=str(source))
    assert answer["ok"] is True
    assert answer["errors"] == [
        "Line 2: invalid JSON: Expecting value: line 1 column 1 (char 0)",
        "Line 3: not a JSON object",
        "Line 4: unknown type 'weird'",
        "Line 5: memory missing agent_id",
        "Line 6: memory agent_id is not a string; it was not imported",
        "Line 7: memory recall_count is not a number; it was not imported",
        "Line 8: memory content is not a string; it was not imported",
    ]
    assert (answer["imported_memories"], answer["skipped_memories"]) == (2, 2)
    assert [r[0] for r in rows(db, "memories", ("content",))] == ["first", "last"]


def test_a_number_too_long_to_read_refuses_only_its_line(app: App, db: Database, tmp_path: Path) -> None:
    # spec IM-3: a line the JSON parser refuses is reported with the parser's
    # message and skipped; an integer longer than Python converts (4300 digits)
    # used to stop the whole import instead.
    source = write_jsonl(
        tmp_path / "in.jsonl",
        mem("first"),
        '{"_type": "memory", "agent_id": "alice", "content": "x", "id": ' + "1" * 5000 + "}",
        mem("last"),
    )
    answer = import_memories(app, input_path=str(source))
    assert answer["ok"] is True and answer["imported_memories"] == 2
    assert len(answer["errors"]) == 1
    assert answer["errors"][0].startswith("Line 2: invalid JSON: Exceeds the limit (4300 digits)")


def test_truncated_file_aborts_before_anything_is_written(app: App, db: Database, tmp_path: Path) -> None:
    # spec IM-10 / JL-4: header counts that disagree with the file = truncation.
    source = write_jsonl(
        tmp_path / "cut.jsonl",
        mem("one"),
        "{not json",
        header={"memory_count": 3, "episode_count": 1, "profile_count": 1},
    )
    for dry_run, prefix in (
        (False, "import aborted and rolled back"),
        (True, "import aborted (dry run — nothing was written)"),
    ):
        answer = import_memories(app, input_path=str(source), dry_run=dry_run)
        assert answer == {
            "ok": False,
            "error": f"{prefix}: file truncated or inconsistent: header declares 3 memories / "
            "1 episodes / 1 profiles, file contains 1 / 0 / 0",
            "dry_run": dry_run,
            "imported_memories": 0,
            "skipped_memories": 0,
            "imported_episodes": 0,
            "skipped_episodes": 0,
            "profile_updated": False,
            "errors": [
                "Line 3: invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
            ],
        }
    assert count(db, "memories") == 0


def test_header_without_counts_and_file_without_header_are_accepted(app: App, db: Database, tmp_path: Path) -> None:
    # spec JL-4: an absent count key is not checked; a hand-written file needs no header
    source = write_jsonl(tmp_path / "a.jsonl", mem("one"), header={"agent_id": ""})
    assert import_memories(app, input_path=str(source))["imported_memories"] == 1
    source = write_jsonl(tmp_path / "b.jsonl", mem("two"))
    assert import_memories(app, input_path=str(source))["imported_memories"] == 1


def test_sanitiser_and_cap(db: Database, tmp_path: Path) -> None:
    # spec IM-6.1 (empty: skipped silently), IM-6.2 (annotation-only: skipped +
    # error), IM-6.4 (cap cut reported only for rows actually stored)
    app = make_app(db, MAX_CONTENT_LENGTH="10")
    source = write_jsonl(
        tmp_path / "in.jsonl",
        mem(""),
        mem("[Memory from bob] "),
        mem("[Memory from bob]  kept text"),
        mem("0123456789abcdef"),
        mem("0123456789 and more"),
    )
    answer = import_memories(app, input_path=str(source))
    assert answer["errors"] == [
        "Line 2: memory content is empty after sanitization; it was not imported",
        "Line 4: memory content exceeded the 10-character cap and was truncated",
    ]
    assert (answer["imported_memories"], answer["skipped_memories"]) == (2, 3)
    assert sorted(r[0] for r in rows(db, "memories", ("content",))) == ["0123456789", "kept text"]


def test_vectors_are_checked(app: App, db: Database, tmp_path: Path) -> None:
    # spec JL-6 / IM-6.5: a bad vector does not refuse the row, it drops the vector
    good = base64.b64encode(struct.pack("<2f", 1.0, 2.0)).decode()
    nan = base64.b64encode(struct.pack("<2f", 1.0, float("nan"))).decode()
    source = write_jsonl(
        tmp_path / "in.jsonl",
        mem("good", embedding_b64=good, embedding_model="m"),
        mem("nan", embedding_b64=nan),
        mem("short", embedding_b64="AAAA"),
        mem("garbage", embedding_b64="!!!"),
        mem("empty", embedding_b64=""),
    )
    answer = import_memories(app, input_path=str(source))
    assert answer["imported_memories"] == 5
    assert answer["errors"] == [
        "Line 2: memory embedding_b64 holds non-finite values; it was imported without a vector",
        "Line 3: memory embedding_b64 is not a whole number of float32 values; it was imported without a vector",
        "Line 4: memory embedding_b64 is not valid base64; it was imported without a vector",
        "Line 5: memory embedding_b64 is not a whole number of float32 values; it was imported without a vector",
    ]
    stored = dict(rows(db, "memories", ("content", "embedding")))
    assert stored == {"good": struct.pack("<2f", 1.0, 2.0), "nan": None, "short": None, "garbage": None, "empty": None}


def test_tolerances_of_the_format(app: App, db: Database, tmp_path: Path) -> None:
    # spec JL-8: nulls read as empty, flags by truthiness, counters from strings
    # and integral floats, keywords as a list; non-finite JSON numbers -> null (IM-6.5)
    source = write_jsonl(
        tmp_path / "in.jsonl",
        '{"_type": "memory", "agent_id": "a", "content": "c1", "msg_id": null, "project_id": null,'
        ' "channel": null, "timestamp": null, "locked": "yes", "recall_count": "12",'
        ' "metadata": {"x": NaN, "y": [Infinity]}, "source": null}',
        mem(
            "c2", agent_id="a", recall_count=3.0, locked=0, source_text="raw <source>", metadata_text="raw {metadata"
        ),  # spec JL-5: stored back verbatim
        {"_type": "episode", "agent_id": "a", "summary": "s", "keywords": ["a", "b"], "resolved": 1, "project_id": ""},
    )
    answer = import_memories(app, input_path=str(source))
    assert answer.get("errors") is None and answer["imported_memories"] == 2
    assert rows(db, "memories", ("content", "msg_id", "timestamp", "locked", "recall_count", "source", "metadata")) == [
        ("c1", "", "", 1, 12, "{}", '{"x": null, "y": [null]}'),
        ("c2", "", "", 0, 3, "raw <source>", "raw {metadata"),
    ]
    assert rows(db, "episodes", ("keywords", "resolved")) == [("a b", 1)]


def test_missing_created_at_becomes_now(app: App, db: Database, tmp_path: Path) -> None:
    # spec JL-8: a missing created_at/updated_at becomes the server clock (VF-1 shape)
    app.clock = lambda: datetime(2026, 11, 30, 4, 5, 6, 789, tzinfo=timezone.utc)
    source = write_jsonl(tmp_path / "in.jsonl", mem("c"), {"_type": "profile", "agent_id": "alice", "content": "p"})
    import_memories(app, input_path=str(source))
    assert rows(db, "memories", ("created_at",)) == [("2026-11-30 04:05:06",)]
    assert rows(db, "profiles", ("updated_at",)) == [("2026-11-30 04:05:06",)]


def test_surrogates_refuse_only_their_line(app: App, db: Database, tmp_path: Path) -> None:
    # spec IM-5: a string with an unencodable surrogate refuses its line
    source = write_jsonl(
        tmp_path / "in.jsonl", '{"_type": "memory", "agent_id": "a", "content": "x\\ud800"}', mem("fine")
    )
    answer = import_memories(app, input_path=str(source))
    assert answer["errors"] == ["Line 1: memory content holds an unpaired surrogate; it was not imported"]
    assert rows(db, "memories", ("content",)) == [("fine",)]


def test_future_timestamps_are_kept_and_counted(app: App, db: Database, tmp_path: Path) -> None:
    # spec IM-12: imported in every mode, counted; the allowance is honoured
    app.clock = lambda: datetime(2026, 1, 1, tzinfo=timezone.utc)
    source = write_jsonl(
        tmp_path / "in.jsonl",
        mem("far future", timestamp="2099-01-01T00:00:00Z"),
        mem("inside allowance", timestamp="2026-01-01T00:05:00+00:00"),
        mem("just past", timestamp="2026-01-01T00:05:01+00:00"),
        mem("julian day", timestamp="2488069.5"),  # FT-1: SQLite reads it (year 2099)
        mem("unreadable", timestamp="not-a-date"),
        {"_type": "episode", "agent_id": "a", "summary": "e", "end_time": "2099-01-01", "project_id": ""},
    )
    answer = import_memories(app, input_path=str(source), dry_run=True)
    assert (answer["future_timestamps"], answer["future_episode_timestamps"]) == (3, 1)
    answer = import_memories(app, input_path=str(source))
    assert (answer["future_timestamps"], answer["future_episode_timestamps"]) == (3, 1)
    assert count(db, "memories") == 5
    assert "future_timestamps" not in import_memories(app, input_path=str(source))


def test_profiles_first_in_file_wins_and_newer_stored_is_kept(app: App, db: Database, tmp_path: Path) -> None:
    # spec IM-8
    add(db, Profile, agent_id="b", content="stored, newer", updated_at="2027-01-01 00:00:00")
    source = write_jsonl(
        tmp_path / "in.jsonl",
        {"_type": "profile", "agent_id": "a", "content": ""},
        {"_type": "profile", "agent_id": "a", "content": "first", "updated_at": "2026-01-01 00:00:00"},
        {"_type": "profile", "agent_id": "a", "content": "second"},
        {"_type": "profile", "agent_id": "b", "content": "older", "updated_at": "2026-06-01T00:00:00+00:00"},
    )
    answer = import_memories(app, input_path=str(source))
    assert answer["profile_updated"] is True
    assert answer["errors"] == [
        "Line 1: profile has no content; the existing profile was kept",
        "Line 3: profile for agent 'a' and user_id '' already came from Line 2; only the first one is applied",
        "Line 4: the stored profile for agent 'b' is newer than this one "
        "(2027-01-01 00:00:00 > 2026-06-01T00:00:00+00:00); the stored profile was kept",
    ]
    assert rows(db, "profiles", ("agent_id", "content")) == [("a", "first"), ("b", "stored, newer")]


def test_records_without_project_go_to_the_global_pool(app: App, db: Database, tmp_path: Path) -> None:
    # spec IM-11: only for export-headed files, one summary line
    record = {"_type": "memory", "agent_id": "a", "content": "old export row"}
    source = write_jsonl(tmp_path / "in.jsonl", record, header={"agent_id": ""})
    answer = import_memories(app, input_path=str(source))
    assert rows(db, "memories", ("project_id",)) == [("",)]
    assert answer["errors"] == [
        "1 memory and 0 episode records had no project_id (an export from before that axis "
        "was exported); they were restored into the global pool"
    ]
    plain = write_jsonl(tmp_path / "plain.jsonl", {**record, "content": "hand-written"})
    assert "errors" not in import_memories(app, input_path=str(plain))


def test_error_list_is_capped(app: App, db: Database, tmp_path: Path) -> None:
    # spec IM-16: at most 100 listed, then a count of the rest
    source = write_jsonl(tmp_path / "in.jsonl", *["nope"] * 130, mem("survivor"))
    answer = import_memories(app, input_path=str(source))
    assert len(answer["errors"]) == 101
    assert answer["errors"][-1] == "30 more errors were not listed"
    assert answer["imported_memories"] == 1


def test_only_newline_splits_lines(app: App, db: Database, tmp_path: Path) -> None:
    # spec JL-1: U+2028/U+2029/U+0085 inside a JSON string are not line breaks
    content = "a\u2028b\u2029c\x85d"
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(mem(content), ensure_ascii=False) + "\r\n", encoding="utf-8")
    assert import_memories(app, input_path=str(source))["imported_memories"] == 1
    assert rows(db, "memories", ("content",)) == [(content,)]


def test_paused_body_matches_the_spec() -> None:
    # spec §9.5: what a paused, non-dry import answers before the facade's keys
    assert paused_import_body() == {
        "ok": True,
        "dry_run": True,
        "imported_memories": 0,
        "skipped_memories": 0,
        "imported_episodes": 0,
        "skipped_episodes": 0,
        "profile_updated": False,
    }


# --- declared graph (where the association tables exist) ----------------------


def _declare(db: Database, sql: str, **params: Any) -> None:
    with db.write() as session:
        session.execute(text(sql), params)


def test_graph_export_and_import_repoint_refs(app: App, db: Database, fresh: Database, tmp_path: Path) -> None:
    # spec CA-1 / CA-2 / IM-9 / JL-7: file ids are the source's; import maps them
    # to the rows that now hold the records.
    from test_import_db import STAMP, add_graph_tables_to

    add_graph_tables_to(db)
    add_graph_tables_to(fresh)
    m1 = add_memory(db, content="Mina owns the ledger.")
    e1 = add(db, Episode, agent_id="alice", summary="Ledger review.")
    _declare(
        db,
        "INSERT INTO entities (agent_id, name, normalized, declared_by, created_at) "
        "VALUES ('alice', 'Mina', 'mina', 'agent', :s)",
        s=STAMP,
    )
    _declare(db, "INSERT INTO entity_aliases VALUES (1, 'mina-san', 'mina-san')")
    _declare(db, "INSERT INTO entity_mentions VALUES (1, :r, 'agent', :s)", r=f"mem:{m1}", s=STAMP)
    _declare(
        db,
        "INSERT INTO relations (agent_id, subject_kind, subject_id, predicate, object_kind, "
        "object_id, anchor_ref, declared_by, declared_at) VALUES "
        "('alice', 'entity', 1, 'reviewed', 'ep', :e, :r, 'agent', :s)",
        e=e1,
        r=f"mem:{m1}",
        s=STAMP,
    )
    out = tmp_path / "graph.jsonl"
    answer = export_memories(app, agent_id="alice", output_path=str(out))
    assert answer["associations"] == {"entities": 1, "mentions": 1, "relations": 1}
    records = read_file(out)
    assert (records[0]["entity_count"], records[0]["mention_count"], records[0]["relation_count"]) == (1, 1, 1)
    assert [r["_type"] for r in records[1:]] == ["memory", "episode", "entity", "mention", "relation"]
    assert records[3]["aliases"] == ["mina-san"] and "normalized" not in records[3]

    for i in range(3):  # shift the target's ids
        add_memory(fresh, content=f"filler {i}")
    target = make_app(fresh)
    dry = import_memories(target, input_path=str(out), dry_run=True)
    real = import_memories(target, input_path=str(out))
    assert real["associations"] == {"entities": 1, "mentions": 1, "relations": 1}
    assert dry == {**real, "dry_run": True}
    new_mem = rows(fresh, "memories", ("id", "content"))
    new_m1 = next(i for i, c in new_mem if c == "Mina owns the ledger.")
    new_e1 = rows(fresh, "episodes", ("id",))[0][0]
    assert new_m1 != m1
    assert rows(fresh, "entity_mentions", ("ref",)) == [(f"mem:{new_m1}",)]
    assert rows(fresh, "relations", ("subject_kind", "predicate", "object_kind", "object_id", "anchor_ref")) == [
        ("entity", "reviewed", "ep", new_e1, f"mem:{new_m1}")
    ]
    assert rows(fresh, "entity_aliases", ("alias", "normalized")) == [("mina-san", "mina-san")]
    again = import_memories(target, input_path=str(out))  # carrying twice writes once
    assert again["associations"] == {"entities": 1, "mentions": 1, "relations": 1}
    assert count(fresh, "relations") == count(fresh, "entity_mentions") == count(fresh, "entities") == 1


def test_graph_items_that_cannot_be_carried_are_summarised(app: App, db: Database, tmp_path: Path) -> None:
    # spec IM-9: items naming a record that was not restored, and aliases that
    # already name another entity in scope, are dropped with one summary line.
    from test_import_db import add_graph_tables_to

    add_graph_tables_to(db)
    _declare(
        db,
        "INSERT INTO entities (agent_id, name, normalized, declared_by, created_at) "
        "VALUES ('alice', 'Bob', 'bob', 'agent', 'x')",
    )
    source = write_jsonl(
        tmp_path / "in.jsonl",
        mem("kept", id=10),
        mem("", id=11),  # empty: not restored, so nothing may point at it
        {
            "_type": "entity",
            "id": 5,
            "agent_id": "alice",
            "project_id": "",
            "channel": "",
            "name": "Robert",
            "declared_by": "agent",
            "created_at": "t",
            "aliases": ["bob", "Rob"],
        },
        {"_type": "mention", "entity": 5, "ref": "mem:10", "declared_by": "agent", "created_at": "t"},
        {"_type": "mention", "entity": 5, "ref": "mem:11", "declared_by": "agent", "created_at": "t"},
        {"_type": "mention", "entity": 99, "ref": "mem:10", "declared_by": "agent", "created_at": "t"},
    )
    answer = import_memories(app, input_path=str(source))
    assert answer["associations"] == {"entities": 1, "mentions": 1, "relations": 0}
    assert answer["errors"] == [
        "3 association items were not carried (0 entities, 2 mentions, 0 relations, 1 aliases): "
        "they name a record or entity that was not restored, are malformed, or the alias "
        "already names another entity in scope"
    ]
    assert rows(db, "entity_aliases", ("alias",)) == [("Rob",)]


def test_import_is_all_or_nothing(app: App, db: Database, tmp_path: Path) -> None:
    # spec IM-13: a real run is one transaction; a failure rolls every line back
    refuse_inserts(db, "memories", "disk said no", when=("content", "poison"))
    source = write_jsonl(tmp_path / "in.jsonl", mem("one"), mem("two"), mem("poison"), mem("four"))
    answer = import_memories(app, input_path=str(source))
    assert answer == {
        "ok": False,
        "error": "import aborted and rolled back: database error: disk said no",
        "dry_run": False,
        "imported_memories": 0,
        "skipped_memories": 0,
        "imported_episodes": 0,
        "skipped_episodes": 0,
        "profile_updated": False,
    }
    assert count(db, "memories") == 0


def test_reexport_of_a_reference_file_is_line_identical(app: App, db: Database, tmp_path: Path) -> None:
    # spec JL-1 / JL-2 / §8: the format must stay writable for the reference —
    # restoring its export and exporting again gives the same lines, byte for
    # byte (ids coincide on an empty store), the graph lines included (CA-1).
    if not ONE_AGENT.exists():
        pytest.skip("fixture not available")
    import_memories(app, input_path=str(ONE_AGENT))
    out = tmp_path / "again.jsonl"
    export_memories(app, agent_id="agent-a", output_path=str(out))
    theirs = [line for line in ONE_AGENT.read_text(encoding="utf-8").split("\n")[1:] if line]
    assert {json.loads(line)["_type"] for line in theirs} >= {"memory", "entity", "relation"}
    ours = out.read_text(encoding="utf-8").split("\n")[1:-1]
    assert ours == theirs
