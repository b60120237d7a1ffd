"""The background task queue: work that must survive a crash or a restart (spec admin-and-safety §11).

Rows live in ``pending_memory_tasks``, so a task is durable the moment the
transaction that queued it commits. One worker thread per process drains the
table in id order (global FIFO, Q-3):

    start                  → drain everything already queued (Q-2)
    enqueue + commit       → the worker wakes and drains again
    bad JSON payload       → row deleted, logged (Q-4)
    no handler for type    → row deleted, logged (Q-4)
    bucket of the enqueuing session paused → row deleted (Q-5; derived work excepted)
    handler succeeds       → row deleted
    handler fails          → dropped after CPERSONA_TASK_MAX_RETRIES attempts, or
                             moved behind waiting non-derived work (derived only), or
                             retried after CPERSONA_TASK_RETRY_DELAY seconds (Q-6)

Handlers are registered per ``task_type`` with :func:`register_handler`. A
handler is ``fn(app, task) -> dict | None``; raising, or answering ``ok:false``
or ``error``, is a failure. "Derived" handlers rebuild something from records
already stored (record nodes, ...): they are idempotent, never dropped by a
pause, and yield the head of the queue to legacy work when they fail.

A handler that must make its own work and the task's removal one transaction
calls :func:`complete_task` inside its write transaction: it deletes the row
and says whether the row was still there (a row deleted meanwhile, e.g. by
``delete_agent_data``, means the work must not be written, Q-8).
"""

from __future__ import annotations

import importlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from cpersona.services.app import App
from cpersona.services.operations.pause import pause_state
from cpersona.services.requests import Request
from cpersona.storage.repositories.tasks import TaskRepository, wake_after_commit

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

ATTRIBUTION_CAP = 4096  # task id → session key entries remembered
IDLE_POLL_SECONDS = 60.0  # also picks up rows another process queued
SHUTDOWN_WAIT_SECONDS = 5.0
KEYLESS = ""

# Modules that register handlers when imported; each is loaded (if it exists)
# before a drain works its first row, so no queued type is mistaken for unknown. The queue sits
# below the records it works on, so it names them here instead of importing them.
HANDLER_MODULES = ("cpersona.services.records.nodes", "cpersona.services.records.profiles")


@dataclass(frozen=True, slots=True)
class Task:
    """One queued row as a handler sees it (payload already decoded)."""

    id: int
    task_type: str
    agent_id: str
    project_id: str
    payload: Any
    retries: int
    created_at: str


Handler = Callable[[App, Task], "dict[str, Any] | None"]


@dataclass(frozen=True, slots=True)
class _Registered:
    fn: Handler
    derived: bool


_HANDLERS: dict[str, _Registered] = {}


def register_handler(task_type: str, fn: Handler, *, derived: bool = False) -> None:
    """Run ``fn`` for queued rows of ``task_type`` (a later registration replaces an earlier one)."""
    _HANDLERS[task_type] = _Registered(fn, derived)


class TaskFailed(Exception):
    """A handler's way of saying "not done, try again later"."""


# -- producing ---------------------------------------------------------------------------


def enqueue(
    app: App,
    session: Session | Connection,
    task_type: str,
    *,
    agent_id: str,
    payload: Any,
    project_id: str = "",
    session_key: str = "",
) -> int:
    """Queue a task inside the caller's write transaction; returns its id.

    The row commits or rolls back with the caller's work. The worker is woken
    only after that commit, so it never looks before the row is visible.
    """
    task_id = TaskRepository(session).add(task_type, agent_id, project_id, json.dumps(payload, ensure_ascii=False))
    queue = app.task_queue
    queue.attribute(task_id, session_key)
    # The worker is woken after the commit, so it never looks before the row is visible.
    wake_after_commit(session, queue)
    return task_id


def complete_task(session: Session | Connection, task_id: int) -> bool:
    """Delete the task row in the caller's transaction; False when it was already gone."""
    return TaskRepository(session).remove(task_id)


# -- the tool -----------------------------------------------------------------------------


def get_queue_status(app: App) -> dict[str, Any]:
    """:func:`answer_get_queue_status` for a library caller."""
    return answer_get_queue_status(app, Request())


def answer_get_queue_status(app: App, args: Request) -> dict[str, Any]:
    """Queue depth (every agent's rows) and the retry settings (spec Q-9); the tool takes no arguments."""
    settings = app.settings
    pending = 0
    if settings.task_queue_enabled:
        with app.db.read() as session:
            pending = TaskRepository(session).count()
    return {
        "enabled": settings.task_queue_enabled,
        "pending": pending,
        "max_retries": settings.task_max_retries,
        "retry_delay": settings.task_retry_delay,
    }


# -- consuming ------------------------------------------------------------------------------


def start_task_queue(app: App) -> TaskQueue | None:
    """Start the worker when CPERSONA_TASK_QUEUE_ENABLED is on (Q-2); None otherwise."""
    if not app.settings.task_queue_enabled:
        return None
    queue = app.task_queue
    queue.start()
    return queue


def _load_handler_modules() -> None:
    for name in HANDLER_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module exists but something it imports does not
                raise


class _Step:
    NEXT = "next"  # the head row is settled; look at the new head
    WAIT = "wait"  # the head failed and stays; sleep the retry delay first


class TaskQueue:
    """The worker: one daemon thread draining the table, woken by enqueues."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._attribution: OrderedDict[int, str] = OrderedDict()
        self._attribution_lock = threading.Lock()
        self._drain_lock = threading.Lock()

    # attribution: which session's pause governs a task; in-process only
    def attribute(self, task_id: int, session_key: str) -> None:
        key = (session_key or "").strip()
        if key in ("", "transport"):
            return  # unattributed rows already belong to the keyless bucket
        with self._attribution_lock:
            self._attribution[task_id] = key
            while len(self._attribution) > ATTRIBUTION_CAP:
                self._attribution.popitem(last=False)

    def _session_of(self, task_id: int, *, forget: bool = False) -> str:
        with self._attribution_lock:
            if forget:
                return self._attribution.pop(task_id, KEYLESS)
            return self._attribution.get(task_id, KEYLESS)

    # lifecycle
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._wake.set()  # drain whatever is already queued
        self._thread = threading.Thread(target=self._loop, name="cpersona-task-queue", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = SHUTDOWN_WAIT_SECONDS) -> bool:
        """Ask the worker to stop and wait up to ``timeout`` seconds; True if it ended.

        A handler already running is not interrupted (a thread cannot be
        cancelled); the daemon thread then ends with the process.
        """
        self._stop.set()
        self._wake.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        # Queued work is background work: its reads and writes take the small-cache connections.
        with self.app.db.background():
            self._loop_until_stopped()

    def _loop_until_stopped(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(IDLE_POLL_SECONDS)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.drain()
            except Exception:  # noqa: BLE001 — Q-7: log, re-arm, never die silently
                log.exception("task queue drain failed; the worker keeps running")

    # draining
    def drain(self) -> int:
        """Work the queue until it is empty or the worker is stopped; returns rows settled."""
        settled = 0
        with self._drain_lock:
            while not self._stop.is_set():
                head = self._head()
                if head is None:
                    return settled
                # Only a row needs its handler: an empty queue (the usual start) loads none of them.
                _load_handler_modules()
                step = self._process(head)
                if step == _Step.NEXT:
                    settled += 1
                elif self._stop.wait(self.app.settings.task_retry_delay):
                    break
        return settled

    def _head(self) -> Any:
        with self.app.db.read() as session:
            return TaskRepository(session).head()

    def _process(self, row: Any) -> str:
        registered = _HANDLERS.get(row.task_type)
        if registered is None:
            log.warning("task %d: unknown task type %r; deleted", row.id, row.task_type)
            return self._settle(row.id)
        try:
            payload = json.loads(row.payload)
        except (TypeError, ValueError):
            log.warning("task %d (%s): payload is not valid JSON; deleted", row.id, row.task_type)
            return self._settle(row.id)
        if not registered.derived and self._paused(self._session_of(row.id)):
            log.info("task %d (%s): its session is paused (no-persist); deleted", row.id, row.task_type)
            return self._settle(row.id)

        task = Task(row.id, row.task_type, row.agent_id, row.project_id, payload, row.retries, row.created_at)
        problem = self._run(registered, task)
        if problem is None:
            return self._settle(row.id)
        return self._after_failure(row, registered, problem)

    def _run(self, registered: _Registered, task: Task) -> str | None:
        """None when the handler succeeded, else why it did not."""
        try:
            answer = registered.fn(self.app, task)
        except Exception as exc:  # noqa: BLE001 — a failing task must not stop the worker
            log.warning(
                "task %d (%s) failed: %s", task.id, task.task_type, exc, exc_info=not isinstance(exc, TaskFailed)
            )
            return str(exc) or type(exc).__name__
        if isinstance(answer, dict) and (answer.get("ok") is False or "error" in answer):
            return str(answer.get("error") or answer.get("reason") or "the handler answered ok:false")
        return None

    def _after_failure(self, row: Any, registered: _Registered, problem: str) -> str:
        attempts = row.retries + 1
        if attempts >= self.app.settings.task_max_retries:
            log.warning("task %d (%s) dropped after %d attempts: %s", row.id, row.task_type, attempts, problem)
            return self._settle(row.id)
        with self.app.db.write() as session:
            if registered.derived and self._legacy_waiting(session):
                # Derived work is rebuildable; it must not hold up older, one-off work.
                tasks = TaskRepository(session)
                new_id = tasks.add(
                    row.task_type,
                    row.agent_id,
                    row.project_id,
                    row.payload,
                    retries=attempts,
                    created_at=row.created_at,
                )
                tasks.remove(row.id)
                self.attribute(new_id, self._session_of(row.id, forget=True))
                return _Step.NEXT
            TaskRepository(session).set_retries(row.id, attempts)
        return _Step.WAIT

    def _legacy_waiting(self, session: Session) -> bool:
        derived = [name for name, reg in _HANDLERS.items() if reg.derived]
        return TaskRepository(session).any_other_than(derived)

    def _settle(self, task_id: int) -> str:
        with self.app.db.write() as session:
            complete_task(session, task_id)
        self._session_of(task_id, forget=True)
        return _Step.NEXT

    def _paused(self, session_key: str) -> bool:
        return pause_state(self.app, session_key).paused


# -- handlers for rows older versions left behind (Q-1) ----------------------------------------


def _legacy_archive_episode(app: App, task: Task) -> dict[str, Any] | None:
    """The payload is a conversation history the server once summarised itself.

    Server-side summarisation was removed (episodes arrive pre-summarised), so
    no history payload yields a summary any more: the task fails until its
    retries run out, and the row is then dropped with a log line (spec §11.2).
    """
    raise TaskFailed(
        "no summary: server-side episode summarisation was removed; "
        "archive the episode again with a caller-computed summary"
    )


register_handler("archive_episode", _legacy_archive_episode)
