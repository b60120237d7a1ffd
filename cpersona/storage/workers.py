"""Long-lived threads that run the blocking database work of async callers (:meth:`Database.run`).

Every tool call's database work runs off the event loop, on one of these
threads. ``anyio.to_thread.run_sync`` did that before; per call it yields to
the loop once before starting, takes a capacity-limiter token (another
checkpoint when tokens run short), opens a cancel scope, looks up its worker
deque in a run variable and prunes idle workers. For a 0.5 ms store that
bookkeeping was a visible share of the loop thread's time (bench/recall_ab.py
splits a call's CPU by thread). Here a call is one queue put from the loop, and
one ``call_soon_threadsafe`` back when the work is done.

What is kept from the anyio path:

- at most ``size`` threads per pool; past that, jobs wait in the queue in
  arrival order, holding no thread (readers and writers have pools of their
  own, so writers queued behind the write lock never take a reader's thread);
- the job runs in a copy of the caller's context (contextvars: the ACL's
  principal, the environment overlay);
- a cancelled caller still waits for its job to finish: a thread cannot be
  stopped halfway through a write, and the caller must not go on (or the
  server exit) while its transaction is open. The cancellation is delivered
  once the job is done.

Threads start on demand and stay (daemon threads: a process that never closes
its database is not kept alive by them); :meth:`WorkerPool.close` (from
``Database.close``) lets the queued and running jobs finish and ends them.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")

# A job: the function, its arguments, the caller's context, the future and loop to settle.
_Job = tuple[Callable[..., Any], tuple[Any, ...], contextvars.Context, "asyncio.Future[Any]", asyncio.AbstractEventLoop]
_STOP = None
CLOSE_WAIT_SECONDS = 5.0


class WorkerPool:
    """Up to ``size`` threads named ``{name}-{n}`` taking jobs from one FIFO queue."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        # Threads waiting for a job none has been promised to, and queued jobs no thread was promised for.
        self._idle = 0
        self._waiting = 0

    @property
    def threads(self) -> int:
        """How many threads this pool has started (for checks and tests)."""
        return len(self._threads)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on one of the pool's threads; the caller's task waits without blocking its loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._submit((fn, args, contextvars.copy_context(), future, loop))
        # Shielded as anyio.to_thread.run_sync shields it: the job runs on whatever
        # happens, so a cancellation waits for it and is delivered at the caller's next step.
        with anyio.CancelScope(shield=True):
            return await future

    def _submit(self, job: _Job) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1  # that thread takes this job
            elif len(self._threads) < self.size:
                thread = threading.Thread(
                    target=self._serve, args=(self._jobs,), name=f"{self.name}-{len(self._threads) + 1}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            else:
                self._waiting += 1  # the next thread to finish takes it
            self._jobs.put(job)

    def _serve(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        while True:
            job = jobs.get()
            if job is _STOP:
                return
            fn, args, context, future, loop = job
            result: Any = None
            error: BaseException | None = None
            try:
                result = context.run(fn, *args)
            except BaseException as exc:  # noqa: BLE001 — handed to the caller, as a direct call would raise it
                error = exc
            # Idle before the caller hears back: a sequential caller's next job comes
            # straight after, and must find this thread rather than start another.
            with self._lock:
                if jobs is self._jobs:  # else closed meanwhile: this queue's next item is a stop
                    if self._waiting:
                        self._waiting -= 1  # a queued job is this thread's next
                    else:
                        self._idle += 1
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop closed while the job ran: nobody waits for it
                pass
            del job, fn, args, context, future, result, error

    def close(self, wait: float = CLOSE_WAIT_SECONDS) -> None:
        """Let the queued and running jobs finish (up to ``wait`` s) and end the threads.

        A later :meth:`run` starts new threads (a database closed and used again).
        """
        with self._lock:
            threads, jobs = self._threads, self._jobs
            self._threads, self._jobs, self._idle, self._waiting = [], queue.SimpleQueue(), 0, 0
        for _ in threads:
            jobs.put(_STOP)  # after every job queued so far
        current = threading.current_thread()
        deadline = time.monotonic() + wait  # one wait for all: a stuck job must not cost it per thread
        for thread in threads:
            if thread is not current:
                thread.join(max(0.0, deadline - time.monotonic()))


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if isinstance(error, StopIteration):
        # A future refuses StopIteration (set_exception raises TypeError, and the caller
        # would wait for ever); it reaches the caller as anyio hands it on.
        wrapped = RuntimeError("the job raised StopIteration")
        wrapped.__cause__ = error
        error = wrapped
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
