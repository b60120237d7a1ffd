"""The DB-persisted task queue: enqueue, the worker thread, retries, pause, restart, status.

Real SQLite files throughout; the worker is the real thread, and a "restart"
is a second Database + App opened on the same file.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import insert, select

from conftest import make_app
from cpersona.services.operations import tasks
from cpersona.services.app import App
from cpersona.services.records.profiles import get_profile
from cpersona.services.operations.tasks import (
    TaskFailed,
    complete_task,
    enqueue,
    get_queue_status,
    register_handler,
    start_task_queue,
)
from cpersona.storage.engine import open_sqlite
from cpersona.storage.models import Episode, PendingMemoryTask

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def raw_task(app: App, task_type: str, payload: str, agent_id: str = "a", retries: int = 0) -> int:
    with app.db.write() as session:
        return session.execute(
            insert(PendingMemoryTask)
            .values(task_type=task_type, agent_id=agent_id, payload=payload, retries=retries)
            .returning(PendingMemoryTask.id)
        ).scalar_one()


def pending(app: App) -> list[tuple[int, str, int]]:
    with app.db.read() as session:
        return [
            tuple(r)
            for r in session.execute(
                select(PendingMemoryTask.id, PendingMemoryTask.task_type, PendingMemoryTask.retries).order_by(
                    PendingMemoryTask.id
                )
            ).all()
        ]


class Recorder:
    """Test handlers that note what they saw; ``fail`` decides per task whether to fail."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any, int]] = []
        self.lock = threading.Lock()

    def handler(self, fail: Callable[[tasks.Task], bool] = lambda task: False) -> tasks.Handler:
        def run(app: App, task: tasks.Task) -> dict[str, Any]:
            with self.lock:
                self.seen.append((task.task_type, task.payload, task.retries))
            if fail(task):
                raise TaskFailed("not today")
            return {"ok": True}

        return run


@pytest.fixture
def recorder() -> Recorder:
    saved = dict(tasks._HANDLERS)
    yield Recorder()
    tasks._HANDLERS.clear()
    tasks._HANDLERS.update(saved)


@pytest.fixture
def fast_app(db):
    app = make_app(db, TASK_RETRY_DELAY="0")
    yield app
    app.task_queue.stop()


# --- get_queue_status (§11.4) ---------------------------------------------------------------


def test_status_counts_every_agents_rows(app):  # spec Q-9
    assert get_queue_status(app) == {"enabled": True, "pending": 0, "max_retries": 3, "retry_delay": 30}
    raw_task(app, "update_profile", '"p"', agent_id="a")
    raw_task(app, "update_profile", '"p"', agent_id="b")
    assert get_queue_status(app)["pending"] == 2


def test_status_when_disabled_counts_nothing(db):  # spec Q-9
    app = make_app(db, TASK_QUEUE_ENABLED="false", TASK_MAX_RETRIES="5", TASK_RETRY_DELAY="7")
    raw_task(app, "update_profile", '"p"')
    assert get_queue_status(app) == {"enabled": False, "pending": 0, "max_retries": 5, "retry_delay": 7}
    assert start_task_queue(app) is None  # spec Q-2: no worker either


# --- enqueue ----------------------------------------------------------------------------------


def test_enqueue_commits_and_rolls_back_with_the_callers_transaction(fast_app, recorder):
    register_handler("probe", recorder.handler())
    with pytest.raises(RuntimeError):
        with fast_app.db.write() as session:
            enqueue(fast_app, session, "probe", agent_id="a", payload={"n": 1})
            raise RuntimeError("the caller's write failed")
    assert pending(fast_app) == []

    with fast_app.db.write() as session:
        task_id = enqueue(fast_app, session, "probe", agent_id="a", payload={"n": "日本語"}, project_id="p")
    with fast_app.db.read() as session:
        row = session.get(PendingMemoryTask, task_id)
        assert (row.task_type, row.agent_id, row.project_id, row.retries) == ("probe", "a", "p", 0)
        assert json.loads(row.payload) == {"n": "日本語"}


def test_a_running_worker_is_woken_by_a_commit(fast_app, recorder):  # spec Q-2
    register_handler("probe", recorder.handler())
    start_task_queue(fast_app)
    wait_for(lambda: fast_app.task_queue.running)
    with fast_app.db.write() as session:
        enqueue(fast_app, session, "probe", agent_id="a", payload=[1, 2])
    wait_for(lambda: recorder.seen == [("probe", [1, 2], 0)] and pending(fast_app) == [], timeout=5)


# --- the worker (§11.3) -------------------------------------------------------------------------


def test_start_drains_what_an_earlier_process_left_in_fifo_order(db_path, recorder):  # spec §11.1, Q-2, Q-3
    first = open_sqlite(db_path)
    from cpersona.storage.migrate import upgrade

    upgrade(first)
    before = make_app(first)
    with before.db.write() as session:  # queued, never run: the process "crashes"
        for n, agent in enumerate(["b", "a", "c"]):
            enqueue(before, session, "probe", agent_id=agent, payload=n)
    first.close()

    register_handler("probe", recorder.handler())
    second = open_sqlite(db_path)
    after = make_app(second, TASK_RETRY_DELAY="0")
    try:
        start_task_queue(after)
        wait_for(lambda: len(recorder.seen) == 3 and pending(after) == [])
        assert [payload for _, payload, _ in recorder.seen] == [0, 1, 2]  # by id, across agents
    finally:
        after.task_queue.stop()
        second.close()


def test_bad_payload_and_unknown_type_are_deleted_and_the_drain_goes_on(fast_app, recorder):  # spec Q-4
    register_handler("probe", recorder.handler())
    raw_task(fast_app, "probe", "{not json")
    raw_task(fast_app, "no_such_type", "{}")
    raw_task(fast_app, "probe", '"fine"')
    assert fast_app.task_queue.drain() == 3
    assert recorder.seen == [("probe", "fine", 0)]
    assert pending(fast_app) == []


def test_a_failing_task_gets_max_retries_attempts_then_is_dropped(fast_app, recorder):  # spec Q-6
    register_handler("flaky", recorder.handler(fail=lambda task: True))
    register_handler("probe", recorder.handler())
    raw_task(fast_app, "flaky", '"x"')
    raw_task(fast_app, "probe", '"after"')
    fast_app.task_queue.drain()
    # The head waits: the second task runs only after the first was given up.
    assert recorder.seen == [("flaky", "x", 0), ("flaky", "x", 1), ("flaky", "x", 2), ("probe", "after", 0)]
    assert pending(fast_app) == []


def test_handler_answering_ok_false_counts_as_a_failure(fast_app, recorder):  # spec Q-6
    attempts = []
    register_handler("soft", lambda app, task: attempts.append(task.retries) or {"ok": False, "error": "nope"})
    raw_task(fast_app, "soft", "{}")
    fast_app.task_queue.drain()
    assert attempts == [0, 1, 2]


def test_retries_wait_the_configured_delay(db, recorder):  # spec Q-6
    app = make_app(db, TASK_RETRY_DELAY="1", TASK_MAX_RETRIES="3")
    register_handler("flaky", recorder.handler(fail=lambda task: task.retries < 2))
    raw_task(app, "flaky", "{}")
    started = time.monotonic()
    app.task_queue.drain()
    elapsed = time.monotonic() - started
    assert [r for _, _, r in recorder.seen] == [0, 1, 2]
    assert 2.0 <= elapsed < 5.0
    assert pending(app) == []  # succeeded on the third attempt


def test_a_failed_retry_count_survives_a_restart(db_path, recorder):  # spec §11.1, Q-6
    from cpersona.storage.migrate import upgrade

    database = open_sqlite(db_path)
    upgrade(database)
    app = make_app(database, TASK_RETRY_DELAY="30")
    register_handler("flaky", recorder.handler(fail=lambda task: True))
    raw_task(app, "flaky", "{}")
    queue = start_task_queue(app)
    wait_for(lambda: pending(app) and pending(app)[0][2] == 1)  # one attempt, now sleeping 30 s
    assert queue.stop(timeout=5.0)  # spec Q-7: shutdown does not wait out the retry delay
    database.close()

    database = open_sqlite(db_path)
    again = make_app(database, TASK_RETRY_DELAY="0")
    try:
        again.task_queue.drain()
        assert [r for _, _, r in recorder.seen] == [0, 1, 2]  # three attempts in all, across the restart
    finally:
        database.close()


def test_failed_derived_work_yields_to_waiting_legacy_work(fast_app, recorder):  # spec Q-6
    register_handler("build_nodes", recorder.handler(fail=lambda task: task.retries == 0), derived=True)
    register_handler("probe", recorder.handler())
    derived_id = raw_task(fast_app, "build_nodes", '"d"')
    raw_task(fast_app, "probe", '"legacy"')
    fast_app.task_queue.drain()
    assert recorder.seen == [("build_nodes", "d", 0), ("probe", "legacy", 0), ("build_nodes", "d", 1)]
    assert pending(fast_app) == []
    assert derived_id  # moved to the tail means a new id; nothing of it is left


def test_a_paused_sessions_task_is_deleted_but_derived_work_runs(fast_app, recorder):  # spec Q-5, P-13
    from cpersona.services.operations import pause

    register_handler("probe", recorder.handler())
    register_handler("build_nodes", recorder.handler(), derived=True)
    with fast_app.db.write() as session:
        enqueue(fast_app, session, "probe", agent_id="a", payload="paused-session", session_key="s1")
        enqueue(fast_app, session, "probe", agent_id="a", payload="other-session", session_key="s2")
        enqueue(fast_app, session, "probe", agent_id="a", payload="keyless")
        enqueue(fast_app, session, "build_nodes", agent_id="a", payload="derived", session_key="s1")
    pause.pause_persistence(fast_app, ttl_seconds=600, session_key="s1")
    fast_app.task_queue.drain()
    assert [p for _, p, _ in recorder.seen] == ["other-session", "keyless", "derived"]
    assert pending(fast_app) == []  # deleted, not deferred

    pause.pause_persistence(fast_app, ttl_seconds=600)  # the keyless bucket
    raw_task(fast_app, "probe", '"unattributed"')  # e.g. left by an earlier process
    fast_app.task_queue.drain()
    assert [p for _, p, _ in recorder.seen][-1] == "derived" and pending(fast_app) == []


def test_the_worker_survives_a_drain_that_raises(fast_app, recorder, monkeypatch):  # spec Q-7
    register_handler("probe", recorder.handler())
    queue = fast_app.task_queue
    real_head = queue._head
    calls = {"n": 0}

    def flaky_head():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("database went away")
        return real_head()

    monkeypatch.setattr(queue, "_head", flaky_head)
    start_task_queue(fast_app)
    wait_for(lambda: calls["n"] >= 1)
    with fast_app.db.write() as session:
        enqueue(fast_app, session, "probe", agent_id="a", payload="after the crash")
    wait_for(lambda: [p for _, p, _ in recorder.seen] == ["after the crash"])
    assert queue.running


def test_complete_task_makes_work_and_removal_one_transaction(fast_app):  # spec §11.2, Q-8
    def archive(app: App, task: tasks.Task) -> None:
        with app.db.write() as session:
            if not complete_task(session, task.id):
                return  # the row vanished (e.g. delete_agent_data): write nothing
            session.add(Episode(agent_id=task.agent_id, summary=task.payload))

    register_handler("atomic", archive)
    raw_task(fast_app, "atomic", '"kept"')
    fast_app.task_queue.drain()

    vanished = raw_task(fast_app, "atomic", '"lost"')
    head = fast_app.task_queue._head()
    with fast_app.db.write() as session:
        complete_task(session, vanished)  # deleted while the worker held the row
    fast_app.task_queue._process(head)
    with fast_app.db.read() as session:
        assert session.scalars(select(Episode.summary)).all() == ["kept"]


# --- the legacy task types (§11.2) ------------------------------------------------------------


def test_legacy_update_profile_is_applied(fast_app):  # spec §11.2
    raw_task(fast_app, "update_profile", json.dumps("likes tea"), agent_id="kai")
    fast_app.task_queue.drain()
    assert get_profile(fast_app, agent_id="kai") == {"profile": "likes tea"}
    assert pending(fast_app) == []


def test_legacy_archive_episode_history_cannot_be_summarised_and_is_dropped(fast_app):  # spec §11.2, Q-1, Q-6
    raw_task(fast_app, "archive_episode", json.dumps([{"role": "user", "content": "hi"}]), agent_id="kai")
    fast_app.task_queue.drain()
    assert pending(fast_app) == []
    with fast_app.db.read() as session:
        assert session.scalars(select(Episode.id)).all() == []


def test_stop_is_prompt_when_idle(fast_app):  # spec Q-7
    queue = start_task_queue(fast_app)
    wait_for(lambda: queue.running)
    started = time.monotonic()
    assert queue.stop()
    assert time.monotonic() - started < 1.0


# --- the tool declaration ------------------------------------------------------------------------


def test_description_names_depth_and_retry_settings():  # spec §14
    from cpersona.mcp.tools import default_registry

    description = default_registry().get("get_queue_status").description
    for fact in ("pending", "enabled", "max_retries", "retry_delay", "restart"):
        assert fact in description


@pytest.mark.anyio
async def test_get_queue_status_through_the_facade(app):  # spec §11.4
    from cpersona.mcp.dispatch import call_tool
    from cpersona.mcp.gates import GateChain
    from cpersona.mcp.tools import default_registry

    raw_task(app, "update_profile", '"p"')
    outcome = await call_tool(app, default_registry(), GateChain(), "get_queue_status", {"unknown": 1})
    assert not outcome.is_error
    assert outcome.payload == {"enabled": True, "pending": 1, "max_retries": 3, "retry_delay": 30}
