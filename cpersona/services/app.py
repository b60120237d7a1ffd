"""What every service function is handed: the database, the settings, the clock,
and the per-process services the server builds on first use.

Service functions are plain Python: ``fn(app, **arguments) -> dict``. They take
the tool's arguments by name (already checked against the tool's JSON schema by
the MCP facade, unknown keys dropped), do the memory logic over the storage
layer and return the response object the spec describes. They never import the
MCP SDK, so tests call them directly on a real database.

Every per-process service (calibration state, the pause map, the task queue,
...) is a typed attribute of :class:`App`, declared below and built here on
first read. Building on first read keeps start-up cheap (no module behind a
service is imported until something needs it) and keeps side effects (an
``atexit`` hook, an installation probe) out of processes that never use the
service. This module is the composition root of the services layer: it is the
one place that imports the service packages to build their objects, while
they import :class:`App` for its type.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from cpersona.config import Settings
from cpersona.storage.engine import Database

if TYPE_CHECKING:
    from cpersona.embedding.client import Embedder
    from cpersona.embedding.remote import RemoteIndex
    from cpersona.embedding.tokens import TokenReporter
    from cpersona.services.calibration.state import CalibrationState
    from cpersona.services.operating_context import ContextCache
    from cpersona.services.operations.pause import PauseBuckets
    from cpersona.services.operations.tasks import TaskQueue
    from cpersona.services.operations.update_check import NoticeMemory, UpdateChecker
    from cpersona.services.recall.advisory import AdvisoryMemory, EmbeddingHealth
    from cpersona.services.recall.counters import CounterBacklog
    from cpersona.services.records.backfill import BackfillWorker

T = TypeVar("T")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class _Built(dict[str, Any]):
    """The services an App has built so far, shared with every copy of it.

    The pause gate runs a paused caller's read on a copy of the App
    (``dataclasses.replace(app, writes_paused=True)``); the copy must see the
    same queue, pause map and calibration, so they live here, not on the copy.
    """

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.RLock()


class OnFirstUse(Generic[T]):
    """An :class:`App` attribute built by ``build(app)`` on first read, once per App.

    Assigning the attribute replaces the service (tests hand in their own);
    :meth:`if_built` reads it without building it, for callers to whom a
    service nobody has started means "nothing to do".
    """

    def __init__(self, build: Callable[[App], T]) -> None:
        self._build = build
        self._name = build.__name__

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, app: None, owner: type) -> OnFirstUse[T]: ...
    @overload
    def __get__(self, app: App, owner: type) -> T: ...
    def __get__(self, app: App | None, owner: type) -> T | OnFirstUse[T]:
        if app is None:
            return self
        built = app._built
        if self._name in built:  # entries are never removed, so no lock on this path
            return built[self._name]
        with built.lock:
            if self._name not in built:
                built[self._name] = self._build(app)
            return built[self._name]

    def __set__(self, app: App, value: T) -> None:
        app._built[self._name] = value

    def if_built(self, app: App) -> T | None:
        return app._built.get(self._name)


# -- how each service is built (imports stay inside: see the module docstring) ---------------


def _calibration(app: App) -> CalibrationState:
    from cpersona.services.calibration.state import CalibrationState

    return CalibrationState()


def _embedding_health(app: App) -> EmbeddingHealth:
    from cpersona.services.recall.advisory import EmbeddingHealth

    return EmbeddingHealth()


def _recall_advisory(app: App) -> AdvisoryMemory:
    from cpersona.services.recall.advisory import AdvisoryMemory

    return AdvisoryMemory()


def _recall_counters(app: App) -> CounterBacklog:
    from cpersona.services.recall.counters import CounterBacklog

    return CounterBacklog.for_app(app)  # registers the flush at exit


def _token_reporter(app: App) -> TokenReporter | None:
    from cpersona.embedding.tokens import build_token_reporter

    return build_token_reporter(app.embedder)


def _remote_index(app: App) -> RemoteIndex | None:
    if app.settings.vector_search_mode != "remote":
        return None
    from cpersona.embedding.remote import build_remote_index

    return build_remote_index(app.settings, app.embedder)


def _backfill(app: App) -> BackfillWorker:
    from cpersona.services.records.backfill import BackfillWorker

    return BackfillWorker(app)


def _operating_context(app: App) -> ContextCache:
    from cpersona.services.operating_context import ContextCache

    return ContextCache()


def _pause_buckets(app: App) -> PauseBuckets:
    from cpersona.services.operations.pause import PauseBuckets

    return PauseBuckets()


def _task_queue(app: App) -> TaskQueue:
    from cpersona.services.operations.tasks import TaskQueue

    return TaskQueue(app)


def _update_checker(app: App) -> UpdateChecker:
    from cpersona.services.operations.update_check import UpdateChecker

    return UpdateChecker(app)  # probes how cpersona was installed


def _update_notices(app: App) -> NoticeMemory:
    from cpersona.services.operations.update_check import NoticeMemory

    return NoticeMemory()


@dataclass
class App:
    db: Database
    settings: Settings
    # Injected so tests can move time; everything that reads "now" asks here.
    clock: Callable[[], datetime] = utc_now
    # The embedding client; None while CPERSONA_EMBEDDING_MODE is "none".
    # Callers embed BEFORE taking the write lock (spec PG-4).
    embedder: Embedder | None = None
    # True on the App a call runs with while the caller's no-persist bucket is
    # paused (set by cpersona.mcp.pause_gate): a read must then skip its
    # incidental writes, such as recall counters (spec P-12).
    writes_paused: bool = False
    # True when callers reach this App over streamable HTTP: they are not the
    # machine's user, so export/import paths are confined to the database's
    # exports/ directory unless CPERSONA_EXPORT_DIR names one (spec decision 12).
    # Set once, where the server is built for that transport (cli.serve).
    remote_callers: bool = False
    _built: _Built = field(default_factory=_Built, repr=False, compare=False)

    # The live calibrated thresholds, gates and betas (services/calibration/state.py).
    calibration = OnFirstUse(_calibration)
    # Whether the embedding backend answers (spec §5.17), and who was told it does not.
    embedding_health = OnFirstUse(_embedding_health)
    recall_advisory = OnFirstUse(_recall_advisory)
    # Recall counts waiting for the write lock (services/recall/counters.py).
    recall_counters = OnFirstUse(_recall_counters)
    # The embedding backend's token report; None when the mode has none (OV-1).
    token_reporter = OnFirstUse(_token_reporter)
    # The remote vector index client; None outside CPERSONA_VECTOR_SEARCH_MODE=remote.
    remote_index = OnFirstUse(_remote_index)
    # The vector backfill worker. Only the serving process builds it (start_backfill):
    # until then recall triggers no background repair, see if_built.
    backfill = OnFirstUse(_backfill)
    # The parsed operating-context file, re-read when the file changes (OC-3).
    operating_context = OnFirstUse(_operating_context)
    # The no-persist pause map (services/operations/pause.py).
    pause_buckets = OnFirstUse(_pause_buckets)
    # The background task queue (built, not started: start_task_queue starts it).
    task_queue = OnFirstUse(_task_queue)
    # The update check (UP-2) and who has seen its notice on recall (UP-10).
    update_checker = OnFirstUse(_update_checker)
    update_notices = OnFirstUse(_update_notices)

    def now_iso(self) -> str:
        """Server default stamp: ISO-8601 UTC with microseconds (spec VF-2)."""
        return self.clock().isoformat(timespec="microseconds")
