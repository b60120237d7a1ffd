"""Several server processes on one database (spec PG-4, issue 8: "many server processes on one
database; no lost update on lock / update / delete races, dedup enforced by unique indexes").

Each test starts real, separate Python processes (this file run as a script) against the test's
database — PostgreSQL, and the same race on one SQLite file where two processes share it — holds
them at a start line, lets them race through the service functions, and then checks every answer
against the rows left behind: an answer that says a write happened must be visible, one that says
it was refused must have changed nothing, and dedup must leave one row per key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

pytestmark = pytest.mark.both_backends

ROUNDS = 25
WORKER_TIMEOUT = 180  # seconds; a hung writer lock would show up as a timeout, not a pass


# -- the worker (runs in its own interpreter) --------------------------------------------------


def _work(op: str, app: Any, ids: list[int]) -> list[Any]:
    from cpersona.services.records.admin import delete_memory, lock_memory, update_memory
    from cpersona.services.records.memories import store
    from cpersona.services.recall.counters import bump_recall_counters

    if op == "store_same":  # every process stores the same texts, and the same caller ids
        return [store(app, agent_id="race", content=f"shared text {i}")["result"] for i in range(ROUNDS)] + [
            store(app, agent_id="race", id=f"msg-{i}", content=f"by id {i} from {os.getpid()}")["result"]
            for i in range(ROUNDS)
        ]
    if op == "update":
        return [update_memory(app, memory_id=i, agent_id="race", content=f"edited {i}").get("ok", False) for i in ids]
    if op == "delete":
        return [delete_memory(app, memory_id=i, agent_id="race").get("ok", False) for i in ids]
    if op == "lock":
        return [lock_memory(app, memory_id=i, agent_id="race").get("ok", False) for i in ids]
    if op == "bump":  # the counter write every counted recall makes (spec §5.9.5)
        for _ in range(ROUNDS):
            bump_recall_counters(app, ids)
        return []
    raise ValueError(op)


def _worker_main(op: str, go_file: str, ids: str) -> None:
    from cpersona.config import load_settings
    from cpersona.services.app import App
    from cpersona.storage.engine import open_database

    settings = load_settings(dict(os.environ))
    db = open_database(settings)
    app = App(db=db, settings=settings)
    with db.read() as session:  # connect before the start line, so the race is the writes
        session.execute(text("SELECT 1"))
    Path(f"{go_file}.ready.{os.getpid()}").touch()
    deadline = time.monotonic() + WORKER_TIMEOUT
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise SystemExit("never started")
        time.sleep(0.002)
    answers = _work(op, app, [int(i) for i in ids.split(",") if i])
    db.close()
    print(json.dumps(answers))


# -- the test side -----------------------------------------------------------------------------


def race(db: Any, tmp_path: Path, *jobs: tuple[str, list[int]]) -> list[list[Any]]:
    """Run one process per (op, ids) job against ``db`` from a common start; their answers, in job order."""
    from conftest import db_settings_env

    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPERSONA_")}
    env.update(db_settings_env(db))
    env["CPERSONA_EMBEDDING_MODE"] = "none"
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, op, str(go), ",".join(map(str, ids))],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for op, ids in jobs
    ]
    deadline = time.monotonic() + WORKER_TIMEOUT
    while len(list(tmp_path.glob("go.ready.*"))) < len(procs):  # every interpreter imported and connected
        assert all(p.poll() is None for p in procs), [p.communicate()[1][-2000:] for p in procs if p.poll()]
        assert time.monotonic() < deadline, "workers never got ready"
        time.sleep(0.01)
    go.touch()
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=WORKER_TIMEOUT)
        assert proc.returncode == 0, err[-2000:]
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    return outputs


def rows(db: Any, sql: str) -> list[tuple]:
    with db.read() as session:
        return [tuple(r) for r in session.execute(text(sql))]


def seed(app: Any, count: int, word: str = "seed") -> list[int]:
    from cpersona.services.records.memories import store

    return [store(app, agent_id="race", content=f"{word} {i}")["id"] for i in range(count)]


def test_concurrent_stores_of_the_same_content_keep_one_row(db, tmp_path):  # spec ST dedup, PG-4
    answers = race(db, tmp_path, ("store_same", []), ("store_same", []), ("store_same", []))
    by_text = rows(db, "SELECT content, COUNT(*) FROM memories WHERE content LIKE 'shared text %' GROUP BY content")
    assert len(by_text) == ROUNDS and all(n == 1 for _, n in by_text)
    by_id = rows(db, "SELECT msg_id, COUNT(*) FROM memories WHERE msg_id LIKE 'msg-%' GROUP BY msg_id")
    assert len(by_id) == ROUNDS and all(n == 1 for _, n in by_id)
    # Exactly one process was told "stored" for each text and each caller id; the others were told it was a copy.
    for i in range(2 * ROUNDS):
        told = [a[i] for a in answers]
        assert told.count("stored") == 1, (i, told)
        assert set(told) <= {"stored", "skipped"}, (i, told)


def test_update_racing_delete_never_resurrects_a_row(db, app, tmp_path):  # spec UM, DM, PG-4
    ids = seed(app, ROUNDS)
    updated, deleted = race(db, tmp_path, ("update", ids), ("delete", ids))
    assert all(deleted), deleted  # an edit never blocks a delete
    # Whichever came first, no edit wrote a row back after its delete.
    assert rows(db, "SELECT COUNT(*) FROM memories") == [(0,)]
    assert len(updated) == ROUNDS and all(isinstance(ok, bool) for ok in updated)


def test_lock_racing_update_and_delete_obeys_the_lock(db, app, tmp_path):  # spec LK-1..LK-3, PG-4
    ids = seed(app, ROUNDS)
    locked, updated, deleted = race(db, tmp_path, ("lock", ids), ("update", ids), ("delete", ids))
    remaining = dict(rows(db, "SELECT id, content FROM memories"))
    flags = dict(rows(db, "SELECT id, locked FROM memories"))
    for i, memory_id in enumerate(ids):
        if deleted[i]:
            # Deleted before the lock landed: the lock then found nothing to lock.
            assert memory_id not in remaining and not locked[i]
            continue
        # The delete was refused: only because the lock came first, so the row is there and locked.
        assert locked[i] and flags[memory_id] == 1
        # An edit that answered ok is in the row; one that was refused changed nothing.
        expected = f"edited {memory_id}" if updated[i] else f"seed {i}"
        assert remaining[memory_id] == expected, (memory_id, updated[i], remaining[memory_id])


def test_concurrent_recall_count_bumps_are_not_lost(db, app, tmp_path):  # spec §5.9.5, PG-4
    ids = seed(app, 3)
    race(db, tmp_path, ("bump", ids), ("bump", ids), ("bump", ids))
    # Three processes bumped each counter ROUNDS times: no bump overwrote another's.
    assert rows(db, "SELECT id, recall_count FROM memories ORDER BY id") == [(i, 3 * ROUNDS) for i in ids]


if __name__ == "__main__":
    _worker_main(*sys.argv[1:4])
