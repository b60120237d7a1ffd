"""Several writers on one SQLite file, in real processes (issue 13 items 3 and 5).

- A long import or merge commits in batches, so a store from another process
  lands between two batches instead of failing with "database is locked".
- kill -9 in the middle of an import or a move leaves a consistent prefix
  (whole rows, each with its full-text entry), and running it again completes it.
- A writer waits for the lock past SQLite's 5 s busy handler, up to
  CPERSONA_WRITE_LOCK_WAIT_SECONDS, then answers one clear sentence.
- Over HTTP, writers queued behind the lock do not take the threads a recall needs.

The workers are this file run as a script (``python tests/test_write_contention.py MODE ...``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROWS = 8000
MERGE_ROWS = 2000
BATCH = 250  # storage.engine.BATCH_ROWS
MARK = "kiwimarker"
TIMEOUT = 240  # seconds a worker may take on a loaded machine; liveness only


# -- the workers (run in their own interpreter) ------------------------------------------------


def _app() -> Any:
    from cpersona.config import load_settings
    from cpersona.services.app import App
    from cpersona.storage.migrate import open_database_and_upgrade

    settings = load_settings(dict(os.environ))
    return App(db=open_database_and_upgrade(settings), settings=settings)


def _wait_for(path: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while path != "-" and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)


def _worker(mode: str, *args: str) -> None:
    app = _app()
    if mode == "import":
        from cpersona.services.portability.importer import import_memories

        _wait_for(args[2] if len(args) > 2 else "-")  # the other writer is up
        Path(args[1]).touch()  # "the import starts now"
        print(json.dumps(import_memories(app, input_path=args[0])), flush=True)
    elif mode == "merge":
        from cpersona.services.portability.merge import merge_memories

        _wait_for(args[4] if len(args) > 4 else "-")
        Path(args[3]).touch()
        print(
            json.dumps(merge_memories(app, source_agent_id=args[0], target_agent_id=args[1], mode=args[2])), flush=True
        )
    elif mode == "stores":  # say "ready", wait for the bulk writer to start, then store every 50 ms
        from cpersona.services.records.memories import store

        count = int(args[1])
        Path(args[2]).touch()
        _wait_for(args[0])
        answers = []
        for i in range(count):
            answer = store(app, agent_id="writer", content=f"interleaved store number {i}")
            answers.append({"ok": answer.get("ok"), "error": answer.get("error")})
            time.sleep(0.05)
        print(json.dumps(answers), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode}")


def _hold_lock(db_path: str, release_file: str, max_seconds: str) -> None:
    """Hold SQLite's write lock (BEGIN IMMEDIATE) until release_file appears."""
    import sqlean

    conn = sqlean.connect(db_path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("held", flush=True)
    deadline = time.monotonic() + float(max_seconds)
    while not os.path.exists(release_file) and time.monotonic() < deadline:
        time.sleep(0.02)
    conn.execute("COMMIT")
    print("released", flush=True)


# -- the harness --------------------------------------------------------------------------------


def _env(db: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    env.update({"CPERSONA_DB_PATH": str(db), "CPERSONA_UPDATE_CHECK": "false", **extra})
    return env


def _spawn(db: Path, *args: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        env=_env(db, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _answer(proc: subprocess.Popen[str]) -> Any:
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _fresh_db(tmp_path: Path) -> Path:
    db = tmp_path / "shared.db"
    subprocess.run(
        [sys.executable, "-c", "import tests.test_write_contention as t; t._app()"],
        env={**_env(db), "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        check=True,
        timeout=TIMEOUT,
    )
    return db


def _bulk_file(tmp_path: Path, rows: int, agent: str = "bulk", graph: bool = False) -> Path:
    path = tmp_path / f"{agent}.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for i in range(rows):
            out.write(
                json.dumps(
                    {
                        "_type": "memory",
                        "id": i + 1,
                        "agent_id": agent,
                        "msg_id": f"m{i:05d}",
                        "content": f"{MARK} row {i:05d} of the bulk file",
                    }
                )
                + "\n"
            )
        if graph:
            out.write(
                json.dumps(
                    {"_type": "entity", "id": 1, "agent_id": agent, "name": "Kiwi Harbour", "aliases": ["the harbour"]}
                )
                + "\n"
            )
            out.write(json.dumps({"_type": "mention", "entity": 1, "ref": "mem:1"}) + "\n")
            out.write(json.dumps({"_type": "mention", "entity": 1, "ref": f"mem:{rows}"}) + "\n")
            out.write(
                json.dumps(
                    {
                        "_type": "relation",
                        "agent_id": agent,
                        "subject_kind": "mem",
                        "subject_id": 1,
                        "predicate": "precedes",
                        "object_kind": "mem",
                        "object_id": rows,
                    }
                )
                + "\n"
            )
    return path


def _query(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    import sqlean

    conn = sqlean.connect(f"file:{db}?mode=ro", uri=True)
    try:
        conn.execute("PRAGMA busy_timeout=5000")
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _count(db: Path, agent: str) -> int:
    return _query(db, "SELECT count(*) FROM memories WHERE agent_id = ?", agent)[0][0]


def _indexed(db: Path, agent: str) -> int:
    """Rows of ``agent`` the full-text index finds by the marker word (every row holds it)."""
    return _query(
        db,
        "SELECT count(*) FROM memories m WHERE m.agent_id = ? AND m.id IN "
        "(SELECT rowid FROM memories_fts WHERE memories_fts MATCH ?)",
        agent,
        f'"{MARK}"',
    )[0][0]


def _kill_when(db: Path, proc: subprocess.Popen[str], agent: str, at_least: int) -> None:
    """kill -9 the worker once ``agent`` holds at least ``at_least`` committed rows."""
    deadline = time.monotonic() + TIMEOUT
    while _count(db, agent) < at_least:
        assert proc.poll() is None, f"the worker finished before {at_least} rows were committed: {proc.stderr.read()}"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


# -- item 3: bulk writes in batches ------------------------------------------------------------


def test_a_store_from_another_process_lands_between_import_batches(tmp_path: Path) -> None:
    db = _fresh_db(tmp_path)
    started, ready = tmp_path / "import-started", tmp_path / "writer-ready"
    writer = _spawn(db, "stores", str(started), "20", str(ready))
    importer = _spawn(db, "import", str(_bulk_file(tmp_path, ROWS)), str(started), str(ready))
    imported, stores = _answer(importer), _answer(writer)

    assert imported["ok"] and imported["imported_memories"] == ROWS and imported["skipped_memories"] == 0
    assert all(s["ok"] for s in stores), stores  # the old single transaction: "database is locked" after 5 s
    # Ordering, not timing: some stored row got an id below the import's last row,
    # so the stores committed while the import was still writing.
    first_store = _query(db, "SELECT min(id) FROM memories WHERE agent_id = 'writer'")[0][0]
    last_import = _query(db, "SELECT max(id) FROM memories WHERE agent_id = 'bulk'")[0][0]
    assert first_store < last_import
    assert _count(db, "bulk") == _indexed(db, "bulk") == ROWS


def test_a_store_from_another_process_lands_between_merge_batches(tmp_path: Path) -> None:
    db = _fresh_db(tmp_path)
    _answer(_spawn(db, "import", str(_bulk_file(tmp_path, MERGE_ROWS, agent="src")), str(tmp_path / "seeded")))
    started, ready = tmp_path / "merge-started", tmp_path / "writer-ready"
    writer = _spawn(db, "stores", str(started), "20", str(ready))
    merger = _spawn(db, "merge", "src", "dst", "copy", str(started), str(ready))
    merged, stores = _answer(merger), _answer(writer)

    assert merged["ok"] and merged["merged_memories"] == MERGE_ROWS
    assert all(s["ok"] for s in stores), stores
    first_store = _query(db, "SELECT min(id) FROM memories WHERE agent_id = 'writer'")[0][0]
    last_copy = _query(db, "SELECT max(id) FROM memories WHERE agent_id = 'dst'")[0][0]
    assert first_store < last_copy


def test_kill_9_mid_import_keeps_whole_batches_and_a_rerun_completes_them(tmp_path: Path) -> None:
    db = _fresh_db(tmp_path)
    path = _bulk_file(tmp_path, ROWS, graph=True)
    worker = _spawn(db, "import", str(path), str(tmp_path / "started"))
    _kill_when(db, worker, "bulk", 3 * BATCH)

    kept = _count(db, "bulk")
    assert 0 < kept < ROWS  # the old single transaction: 0 until the whole file was in
    assert kept % BATCH == 0  # whole batches only
    # The prefix is exactly the file's first rows, each with its full-text entry.
    msg_ids = [r[0] for r in _query(db, "SELECT msg_id FROM memories WHERE agent_id = 'bulk' ORDER BY id")]
    assert msg_ids == [f"m{i:05d}" for i in range(kept)]
    assert _indexed(db, "bulk") == kept

    rerun = _answer(_spawn(db, "import", str(path), str(tmp_path / "again")))
    assert rerun["ok"], rerun
    assert (rerun["imported_memories"], rerun["skipped_memories"]) == (ROWS - kept, kept)
    assert rerun["associations"] == {"entities": 1, "mentions": 2, "relations": 1}
    assert _count(db, "bulk") == _indexed(db, "bulk") == ROWS
    assert _query(db, "SELECT count(*) FROM entity_mentions")[0][0] == 2
    assert _query(db, "SELECT count(*) FROM relations")[0][0] == 1

    third = _answer(_spawn(db, "import", str(path), str(tmp_path / "third")))  # IM-15
    assert (third["imported_memories"], third["skipped_memories"]) == (0, ROWS)


def test_kill_9_mid_move_keeps_a_consistent_prefix_and_a_rerun_completes_it(tmp_path: Path) -> None:
    db = _fresh_db(tmp_path)
    _answer(
        _spawn(db, "import", str(_bulk_file(tmp_path, MERGE_ROWS, agent="src", graph=True)), str(tmp_path / "seeded"))
    )
    contents = {r[0] for r in _query(db, "SELECT content FROM memories WHERE agent_id = 'src'")}
    worker = _spawn(db, "merge", "src", "dst", "move", str(tmp_path / "started"))
    _kill_when(db, worker, "dst", 2 * BATCH)

    at_src = {r[0] for r in _query(db, "SELECT content FROM memories WHERE agent_id = 'src'")}
    at_dst = {r[0] for r in _query(db, "SELECT content FROM memories WHERE agent_id = 'dst'")}
    assert 0 < len(at_dst) < MERGE_ROWS  # the old single transaction: nothing at dst until the end
    assert at_src | at_dst == contents  # nothing lost
    # A moved row left the source in the batch that copied it; only the first row,
    # which the relation ties to the last one, waits at the source for it.
    assert at_src & at_dst == {f"{MARK} row 00000 of the bulk file"}
    assert _indexed(db, "dst") == len(at_dst)
    # The source's declarations on its remaining rows are intact.
    assert _query(db, "SELECT count(*) FROM relations WHERE agent_id = 'src'")[0][0] == 1

    rerun = _answer(_spawn(db, "merge", "src", "dst", "move", str(tmp_path / "again")))
    assert rerun["ok"], rerun
    assert rerun["merged_memories"] + rerun["skipped_memories"] == len(at_src)
    assert rerun["merged_memories"] == len(at_src - at_dst)
    assert {r[0] for r in _query(db, "SELECT content FROM memories WHERE agent_id = 'dst'")} == contents
    assert _indexed(db, "dst") == MERGE_ROWS
    # The relation and both mentions reached the target, re-pointed to its rows.
    first, last = (
        _query(db, "SELECT id FROM memories WHERE agent_id = 'dst' AND msg_id = ?", m)[0][0]
        for m in ("m00000", f"m{MERGE_ROWS - 1:05d}")
    )
    assert _query(db, "SELECT subject_id, object_id FROM relations WHERE agent_id = 'dst'") == [(first, last)]
    refs = {
        r[0]
        for r in _query(
            db, "SELECT m.ref FROM entity_mentions m JOIN entities e ON e.id = m.entity_id WHERE e.agent_id = 'dst'"
        )
    }
    assert refs == {f"mem:{first}", f"mem:{last}"}


# -- over HTTP: the lock wait and the threads -------------------------------------------------

TOKEN = "contention-token"


def _holder(db: Path, release: Path, max_seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "hold", str(db), str(release), str(max_seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.anyio
async def test_a_writer_waits_past_the_busy_handler_then_answers_one_sentence(tmp_path: Path) -> None:
    from test_http_transport import HttpServer, mcp_call

    patient = HttpServer(tmp_path, CPERSONA_AUTH_TOKEN=TOKEN)
    hasty = HttpServer(tmp_path, CPERSONA_AUTH_TOKEN=TOKEN, CPERSONA_WRITE_LOCK_WAIT_SECONDS="2")
    try:
        holder = _holder(patient.db_path, tmp_path / "never", 8)
        try:
            refused = await mcp_call(hasty.url, TOKEN, "store", {"agent_id": "a", "content": "refused while busy"})
            # 8 s of a held lock: past SQLite's 5 s busy handler, inside the default 30 s wait.
            waited = await mcp_call(patient.url, TOKEN, "store", {"agent_id": "a", "content": "stored after waiting"})
        finally:
            holder.wait(timeout=60)
    finally:
        patient.stop()
        hasty.stop()
    busy = (
        "the database is busy: another writer has held the database for more than 2 s; nothing was written, "
        "retry in a moment"
    )
    # store refuses in its own shape (spec G-6): result/reason, no error key
    assert refused == {"ok": False, "result": "rejected", "reason": busy}
    assert waited["ok"] is True, waited
    assert [r[0] for r in _query(patient.db_path, "SELECT content FROM memories")] == ["stored after waiting"]


@pytest.mark.anyio
async def test_a_recall_answers_while_many_stores_wait_for_the_lock(tmp_path: Path) -> None:
    """45 stores queue behind another process's write lock; a recall from another client still answers.

    Ordering, not timing: the recall answers while the lock is still held and
    before any store has answered (on the old code the stores held every worker
    thread, and the recall's counter update waited for the lock too).
    """
    import anyio

    from test_http_transport import HttpServer, mcp_call

    # Confidence on: a counted recall also writes its counters (spec §5.9.5).
    server = HttpServer(
        tmp_path, CPERSONA_AUTH_TOKEN=TOKEN, CPERSONA_WRITE_LOCK_WAIT_SECONDS="120", CPERSONA_CONFIDENCE_ENABLED="true"
    )
    release = tmp_path / "release"
    events: list[str] = []
    answers: list[dict[str, Any]] = []
    try:
        seeded = await mcp_call(
            server.url,
            TOKEN,
            "store",
            {"agent_id": "reader", "content": "the lighthouse keeper polished the brass lamp"},
        )
        assert seeded["ok"]
        holder = _holder(server.db_path, release, 150)
        try:

            async def one_store(i: int) -> None:
                answer = await mcp_call(server.url, TOKEN, "store", {"agent_id": "w", "content": f"queued store {i}"})
                events.append("store")
                answers.append(answer)

            async with anyio.create_task_group() as tg:
                for i in range(45):
                    tg.start_soon(one_store, i)
                await anyio.sleep(3)  # every store has reached the server and waits for the lock
                with anyio.fail_after(60):  # liveness bound, far above 0.2 s; the ordering is the check
                    recalled = await mcp_call(
                        server.url, TOKEN, "recall", {"agent_id": "reader", "query": "lighthouse brass lamp"}
                    )
                events.append("recall")
                still_held = holder.poll() is None
                release.touch()
        finally:
            release.touch()
            holder.wait(timeout=60)
        deadline = time.monotonic() + 60  # the deferred counter lands once the lock frees
        while (counted := _query(server.db_path, "SELECT recall_count FROM memories WHERE agent_id = 'reader'")) != [
            (1,)
        ] and time.monotonic() < deadline:
            await anyio.sleep(0.1)
    finally:
        server.stop()
    assert "lighthouse keeper" in json.dumps(recalled), recalled
    assert still_held and events[0] == "recall", events[:5]
    assert len(answers) == 45 and all(a["ok"] for a in answers), [a for a in answers if not a["ok"]][:2]
    # The recall's counter update waited in the background and was not lost.
    assert counted == [(1,)]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if sys.argv[1] == "hold":
        _hold_lock(*sys.argv[2:])
    else:
        _worker(sys.argv[1], *sys.argv[2:])
