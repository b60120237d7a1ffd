"""Recall counters (spec §5.9.5): counted without making a read wait for writers.

A recall is a read; its counter update is the only write it makes. Waiting for
the write lock there would put every recall behind a long import or a queue of
stores (issue 13 item 5). So a recall takes the lock only if it is free right
now; otherwise its increments join a per-process backlog that one background
thread applies as soon as the lock frees, and every later counted recall
writes whatever is waiting too. Counts are exact — only when they land is
deferred. A process that exits normally writes its backlog on the way out,
waiting at most EXIT_WAIT_SECONDS for the lock (the thread itself never holds
an exit up).
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections import Counter
from collections.abc import Sequence
from datetime import timezone

from cpersona.services.app import App
from cpersona.storage.errors import DatabaseBusy
from cpersona.storage.repositories.memories import MemoryRepository

log = logging.getLogger(__name__)

EXIT_WAIT_SECONDS = 5.0


class CounterBacklog:
    """Increments waiting for the write lock: ``App.recall_counters``."""

    @classmethod
    def for_app(cls, app: App) -> CounterBacklog:
        """A backlog for ``app`` that is written out when the process exits normally."""
        atexit.register(_flush_at_exit, weakref.ref(app))
        return cls()

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[int] = Counter()
        self.stamp = ""
        self.flusher: threading.Thread | None = None

    def add(self, ids: Sequence[int], stamp: str) -> None:
        with self.lock:
            self.counts.update(ids)
            self.stamp = max(self.stamp, stamp)

    def take(self) -> tuple[Counter[int], str]:
        with self.lock:
            counts, self.counts = self.counts, Counter()
            return counts, self.stamp

    def give_back(self, counts: Counter[int]) -> None:
        with self.lock:
            self.counts.update(counts)


def bump_recall_counters(app: App, memory_ids: Sequence[int]) -> None:
    """Count a recall of each returned memory; never waits for the write lock, never fails the read."""
    # A no-persist pause silences counters too (P-12); a read-only database cannot keep them.
    if not memory_ids or app.writes_paused or app.db.read_only is not None:
        return
    backlog = app.recall_counters
    backlog.add(memory_ids, app.clock().astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S"))
    if not _write(app, backlog, wait=0):
        _start_flusher(app, backlog)


def _write(app: App, backlog: CounterBacklog, *, wait: float | None) -> bool:
    """Apply everything waiting in one transaction; False when the lock was taken (kept waiting)."""
    counts, stamp = backlog.take()
    if not counts:
        return True
    try:
        with app.db.write(wait=wait) as session:
            MemoryRepository(session).bump_recall_counts(counts, stamp)
    except DatabaseBusy:
        backlog.give_back(counts)
        return False
    except Exception:  # noqa: BLE001 - a lost counter must not fail the read
        log.warning("could not update recall counters", exc_info=True)
    return True


def _flush_at_exit(ref: weakref.ref[App]) -> None:
    app = ref()
    backlog = App.recall_counters.if_built(app) if app is not None else None
    if backlog is None:
        return
    flusher = backlog.flusher
    if flusher is not None:
        flusher.join(EXIT_WAIT_SECONDS)  # it may hold counts it took: let it finish writing them
    _write(app, backlog, wait=EXIT_WAIT_SECONDS)


def _start_flusher(app: App, backlog: CounterBacklog) -> None:
    with backlog.lock:
        if backlog.flusher is not None and backlog.flusher.is_alive():
            return
        backlog.flusher = threading.Thread(target=_flush, args=(app, backlog), name="recall-counters", daemon=True)
        backlog.flusher.start()


def _flush(app: App, backlog: CounterBacklog) -> None:
    # A few UPDATEs by id after the recall answered: the background connection serves them, so a
    # flush that overlaps the next recall does not make the serving pool open (and warm) another.
    with app.db.background():
        _flush_until_empty(app, backlog)


def _flush_until_empty(app: App, backlog: CounterBacklog) -> None:
    # Waits for the lock as any writer does; gives up a round after the lock wait
    # and tries again, so a backlog is never dropped while the process lives.
    while True:
        if _write(app, backlog, wait=None):
            with backlog.lock:
                if not backlog.counts:
                    backlog.flusher = None
                    return
