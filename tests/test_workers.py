"""The threads Database.run hands async callers' database work to (storage/workers.py).

The brief's rule: database work never runs on the event loop's thread. These
check the pool itself: off the loop, at most ``size`` threads with the rest
queued in order, the caller's context carried over, a cancelled caller held
until its job is done, readers never queued behind writers, and close().
"""

from __future__ import annotations

import contextvars
import threading
import time

import anyio
import pytest

from cpersona.storage.engine import READ_THREADS, WRITE_THREADS, open_sqlite
from cpersona.storage.workers import WorkerPool

pytestmark = pytest.mark.anyio

LIVENESS = 10.0  # seconds a blocked helper may wait on a loaded machine; never a timing assertion


async def test_jobs_run_off_the_loop_thread_and_return_their_value():
    pool = WorkerPool("t", 2)
    try:
        loop_thread = threading.get_ident()
        ran_on = await pool.run(threading.get_ident)
        assert ran_on != loop_thread
        assert await pool.run(lambda a, b: a + b, 2, 3) == 5
    finally:
        pool.close()


async def test_an_exception_reaches_the_caller():
    pool = WorkerPool("t", 1)

    def fail() -> None:
        raise ValueError("from the worker")

    try:
        with pytest.raises(ValueError, match="from the worker"):
            await pool.run(fail)
        assert await pool.run(lambda: "still serving") == "still serving"
    finally:
        pool.close()


def test_a_stray_stopiteration_is_an_error_not_a_hang():
    # asyncio futures refuse StopIteration: handed over as is, the caller would wait for ever
    # (shielded, so no timeout of its own could end the wait). The caller runs on a loop of
    # its own in a daemon thread, so a hang fails this test instead of hanging the run.
    pool = WorkerPool("t", 1)
    outcome: list[BaseException] = []

    async def caller() -> None:
        try:
            await pool.run(next, iter(()))
        except BaseException as exc:  # noqa: BLE001 — what reached the caller is the assertion
            outcome.append(exc)

    thread = threading.Thread(target=anyio.run, args=(caller,), daemon=True)
    thread.start()
    thread.join(LIVENESS)
    assert not thread.is_alive(), "the caller never heard back"
    assert isinstance(outcome[0], RuntimeError) and "StopIteration" in str(outcome[0])
    pool.close()


async def test_sequential_calls_reuse_one_thread():
    pool = WorkerPool("t", 4)
    try:
        # 300 calls: the next job is submitted the moment the last one is answered, so a thread
        # that counted itself idle only after answering would lose that race now and then.
        names = {await pool.run(lambda: threading.current_thread().name) for _ in range(300)}
        assert names == {"t-1"} and pool.threads == 1
    finally:
        pool.close()


async def test_no_more_than_size_threads_and_the_rest_wait_in_order():
    pool = WorkerPool("t", 2)
    release = threading.Event()
    started: list[int] = []
    lock = threading.Lock()

    def job(n: int) -> int:
        with lock:
            started.append(n)
        release.wait(LIVENESS)
        return n

    try:
        results: dict[int, int] = {}

        async def call(n: int) -> None:
            results[n] = await pool.run(job, n)

        async with anyio.create_task_group() as tg:
            for n in range(5):
                tg.start_soon(call, n)
                await anyio.sleep(0)  # submitted in this order
            deadline = time.monotonic() + LIVENESS
            while len(started) < 2 and time.monotonic() < deadline:
                await anyio.sleep(0.01)
            assert sorted(started) == [0, 1] and pool.threads == 2  # two threads, three jobs queued
            release.set()
        assert results == {n: n for n in range(5)}
        assert started[2:] == [2, 3, 4] and pool.threads == 2
    finally:
        release.set()
        pool.close()


async def test_the_callers_context_variables_reach_the_job():
    var: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")
    pool = WorkerPool("t", 1)
    try:
        var.set("caller")
        assert await pool.run(var.get) == "caller"
    finally:
        pool.close()


async def test_a_cancelled_caller_waits_for_its_job_before_the_cancellation_lands():
    pool = WorkerPool("t", 1)
    release = threading.Event()
    finished = threading.Event()
    seen: dict[str, bool] = {}

    def job() -> str:
        release.wait(LIVENESS)
        finished.set()
        return "done"

    async def caller(scope_holder: list[anyio.CancelScope]) -> None:
        with anyio.CancelScope() as scope:
            scope_holder.append(scope)
            try:
                await pool.run(job)
            finally:
                seen["job finished when the caller moved on"] = finished.is_set()
            seen["returned normally"] = True  # the cancellation is delivered at the next step, not here

    try:
        holder: list[anyio.CancelScope] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller, holder)
            await anyio.sleep(0.05)
            holder[0].cancel()
            await anyio.sleep(0.05)
            assert "job finished when the caller moved on" not in seen  # still waiting for the thread
            release.set()
        assert seen["job finished when the caller moved on"] is True
    finally:
        release.set()
        pool.close()


async def test_close_lets_running_work_finish_and_a_later_call_starts_afresh():
    pool = WorkerPool("t", 1)
    release = threading.Event()
    done: list[str] = []

    def job() -> None:
        release.wait(LIVENESS)
        done.append("job")

    async with anyio.create_task_group() as tg:
        tg.start_soon(pool.run, job)
        await anyio.sleep(0.05)
        closer = threading.Thread(target=pool.close)
        closer.start()
        await anyio.sleep(0.05)
        assert done == []  # close() is waiting for the job
        release.set()
    closer.join(LIVENESS)
    assert done == ["job"] and pool.threads == 0
    assert await pool.run(lambda: "again") == "again"
    pool.close()


async def test_writers_queued_behind_the_write_lock_leave_readers_their_threads(tmp_path):
    # issue 13 item 5: a read must not wait for a thread while every writer thread is blocked.
    db = open_sqlite(tmp_path / "w.db")
    release = threading.Event()

    def blocked_writer() -> None:
        release.wait(LIVENESS)

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(WRITE_THREADS + 3):
                tg.start_soon(lambda: db.run(blocked_writer, writes=True))
            await anyio.sleep(0.05)
            with anyio.fail_after(LIVENESS):
                assert await db.run(lambda: "read", writes=False) == "read"
            assert db._writers.threads == WRITE_THREADS and db._readers.threads == 1
            release.set()
    finally:
        release.set()
        db.close()
    assert READ_THREADS >= 2
