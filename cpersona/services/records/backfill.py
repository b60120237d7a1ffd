"""Vector backfill: rows stored without a vector get one later, never silently forever.

A store or an archive succeeds without a vector when the embedding backend is
down (``embedded: false``, spec ST-6, AE-5). Such a row is invisible to the
vector channel until something embeds it, so a background worker does:

- at startup (``cpersona serve`` installs the worker and starts a run), for
  whatever an earlier run left behind;
- after the embedding model changed (``vector_identity``: the vectors of the
  previous model are cleared at the start of a run, then refilled);
- while the worker is installed, when recall sees the backend come back (a
  query embedding succeeds after failures), and otherwise at most once a
  minute on a successful query embedding while unembedded rows exist — so a
  backend that failed only at store time is caught too.

Rules of one pass: rows are read in id order on a read snapshot, embedded in
batches of 32 outside the write lock (no network call under the lock), and
written one short transaction per batch, each update guarded by "still no
vector and text unchanged" so a concurrent edit, delete or repair always
wins. A batch that fails while the backend still answers a probe holds a row
the backend refuses; those rows are tried one by one and the ones refused are
set aside for the life of the process and reported, so one bad row cannot
block the rest. A pass handles at most ``CPERSONA_REEMBED_ROW_CAP`` rows per
table; the worker runs passes while they make progress. Every pass that did
anything is logged with what it did and what remains.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cpersona.embedding.passages import embed_passages
from cpersona.services.app import App
from cpersona.services.records.vector_identity import reconcile
from cpersona.storage.repositories.base import Repository
from cpersona.storage.repositories.episodes import EpisodeRepository
from cpersona.storage.repositories.memories import MemoryRepository, unembedded_total

log = logging.getLogger(__name__)

BATCH_SIZE = 32  # texts per embedding request (health's re-embed uses the same)
CHECK_INTERVAL_SECS = 60.0  # how often a healthy recall may look for a backlog
CLOSE_TIMEOUT_SECS = 10.0

# kind -> its rows; the vector is made from the repository's text column
# (store embeds the sanitized content, archive_episode the summary).
_REPOSITORIES: dict[str, type[Repository]] = {"mem": MemoryRepository, "ep": EpisodeRepository}


@dataclass
class BackfillReport:
    """What one pass did."""

    memories: int = 0  # rows that got a vector
    episodes: int = 0
    refused: list[tuple[str, int]] = field(default_factory=list)  # rows the live backend would not embed
    remaining: int = 0  # rows still without a vector after the pass (refused ones included)
    stopped: str | None = None  # why the pass ended early, if it did

    @property
    def embedded(self) -> int:
        return self.memories + self.episodes


def keeps_local_vectors(app: App) -> bool:
    """Whether this configuration stores vectors in the rows at all."""
    settings = app.settings
    return app.embedder is not None and (settings.vector_search_mode != "remote" or settings.store_blob)


def unembedded_count(app: App) -> int:
    """Memories plus episodes without a vector (served by the partial lost-embedding indexes)."""
    with app.db.read() as session:
        return unembedded_total(session)


def backfill_pass(
    app: App,
    *,
    row_cap: int | None = None,
    batch_size: int = BATCH_SIZE,
    skip: set[tuple[str, int]] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> BackfillReport:
    """Embed rows that have no vector; one bounded pass over both tables.

    ``skip`` holds rows to leave alone (refused earlier); rows refused in this
    pass are added to it and to the report.
    """
    report = BackfillReport()
    if not keeps_local_vectors(app):
        report.stopped = "no local vectors are kept in this configuration"
        return report
    cap = row_cap if row_cap is not None else app.settings.reembed_row_cap
    skip = skip if skip is not None else set()
    for kind in ("mem", "ep"):
        done, stopped = _fill_table(app, kind, cap, max(1, batch_size), skip, report, should_stop)
        if kind == "mem":
            report.memories = done
        else:
            report.episodes = done
        if stopped:
            report.stopped = stopped
            break
    report.remaining = unembedded_count(app)
    return report


def _fill_table(
    app: App,
    kind: str,
    cap: int,
    batch_size: int,
    skip: set[tuple[str, int]],
    report: BackfillReport,
    should_stop: Callable[[], bool],
) -> tuple[int, str | None]:
    repository = _REPOSITORIES[kind]
    embedder = app.embedder
    after, done, seen = 0, 0, 0
    while seen < cap:
        if should_stop():
            return done, "shutting down"
        with app.db.read() as session:
            rows = repository(session).unembedded_after(after, min(batch_size, cap - seen))
        if not rows:
            break
        after = rows[-1].id
        seen += len(rows)
        rows = [r for r in rows if (kind, r.id) not in skip and isinstance(r.body, str) and r.body]
        if not rows:
            continue
        blobs = embed_passages(embedder, [r.body for r in rows])  # as a store embeds them (embedding.passages)
        if all(blob is None for blob in blobs):
            if not embedder.probe():
                return done, "the embedding backend is unavailable"
            # The backend answers, so something in this batch is refused: one by one.
            blobs = [embed_passages(embedder, [r.body])[0] for r in rows]
        updates = [(r.id, r.body, b) for r, b in zip(rows, blobs) if b is not None]
        for r, b in zip(rows, blobs):
            if b is None:
                skip.add((kind, r.id))
                report.refused.append((kind, r.id))
        if updates:
            with app.db.write() as session:
                writer = repository(session)
                for row_id, body, blob in updates:
                    done += writer.set_embedding_if_unchanged(row_id, body, blob)
    return done, None


# -- the background worker ------------------------------------------------------------


class BackfillWorker:
    """Runs passes on one background thread, one at a time, on request."""

    def __init__(self, app: App, *, check_interval: float = CHECK_INTERVAL_SECS) -> None:
        self.app = app
        self.check_interval = check_interval
        self.refused: set[tuple[str, int]] = set()
        self.last_report: BackfillReport | None = None
        self.passes = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._again = False
        self._closing = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._last_check = float("-inf")

    def trigger(self, reason: str) -> bool:
        """Start a run (or ask the running one for another pass). False once closed."""
        if self._closing.is_set() or not keeps_local_vectors(self.app):
            return False
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                self._again = True
                return True
            self._idle.clear()
            self._thread = threading.Thread(target=self._run, args=(reason,), name="cpersona-backfill", daemon=True)
            self._thread.start()
            return True

    def due_for_check(self) -> bool:
        """Rate limit for looking for a backlog on the recall path."""
        now = time.monotonic()
        with self._lock:
            if now - self._last_check < self.check_interval:
                return False
            self._last_check = now
            return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no run is in progress; False on timeout."""
        return self._idle.wait(timeout)

    def close(self, timeout: float = CLOSE_TIMEOUT_SECS) -> None:
        """Stop between batches and wait for the thread (bounded by the embed timeout)."""
        self._closing.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self, reason: str) -> None:
        # A walk of the table, not serving: on the small-cache background connections (storage/engine.py).
        with self.app.db.background():
            self._run_passes(reason)

    def _run_passes(self, reason: str) -> None:
        try:
            # Vectors of a model other than the live one are cleared first, so this
            # run re-embeds them (rows of two models are never compared).
            try:
                if reconcile(self.app).action == "cleared":
                    reason = f"{reason}; the embedding model changed"
            except Exception:  # noqa: BLE001 - filling missing vectors is still worth doing
                log.exception("could not compare the embedding model with the one the database records")
            while not self._closing.is_set():
                with self._lock:
                    self._again = False
                report = backfill_pass(self.app, skip=self.refused, should_stop=self._closing.is_set)
                self.passes += 1
                self.last_report = report
                self._log(reason, report)
                with self._lock:
                    more = self._again or (
                        report.stopped is None and report.embedded > 0 and report.remaining > len(self.refused)
                    )
                    if not more:
                        self._thread = None
                        return
                reason = "continuing"
        except Exception:  # noqa: BLE001 - a failed pass must not take the server down
            log.exception("vector backfill failed; rows without a vector stay so until the next trigger")
        finally:
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None
                if self._thread is None:  # a run started meanwhile keeps the worker busy
                    self._idle.set()

    def _log(self, reason: str, report: BackfillReport) -> None:
        if report.refused:
            shown = ", ".join(f"{k}:{i}" for k, i in report.refused[:20])
            log.warning(
                "vector backfill: the embedding backend refused %d row(s) (%s%s); they stay without a "
                "vector until the server restarts or check_health repairs them",
                len(report.refused),
                shown,
                " …" if len(report.refused) > 20 else "",
            )
        if report.embedded or report.stopped or report.remaining:
            log.info(
                "vector backfill (%s): %d memories and %d episodes embedded, %d rows still without a vector%s",
                reason,
                report.memories,
                report.episodes,
                report.remaining,
                f"; stopped: {report.stopped}" if report.stopped else "",
            )


def start_backfill(app: App, reason: str = "startup") -> bool:
    """Build the worker and kick off a run (``cpersona serve`` calls this once the database is open).

    Until ``App.backfill`` is built, recall triggers nothing: background repair
    is the serving process's business, so a library caller or a test is never
    surprised by rows changing under it.
    """
    return keeps_local_vectors(app) and app.backfill.trigger(reason)


def stop_backfill(app: App, timeout: float = CLOSE_TIMEOUT_SECS) -> None:
    worker = App.backfill.if_built(app)
    if worker is not None:
        worker.close(timeout)


def on_query_embedded(app: App, *, recovered: bool) -> None:
    """Recall got a fresh query vector: the backend is up, so catch up if rows wait.

    A recovery (success after failures) always triggers a run; otherwise the
    backlog is looked at no more than once per check interval.
    """
    worker = App.backfill.if_built(app)
    if worker is None or not keeps_local_vectors(app):
        return
    if recovered:
        worker.trigger("embedding backend recovered")
        return
    if worker.due_for_check():
        try:
            waiting = unembedded_count(app)
        except Exception:  # noqa: BLE001 - a failed look must not fail the recall
            log.warning("could not count rows without a vector", exc_info=True)
            return
        if waiting > len(worker.refused):
            worker.trigger("rows without a vector found")


def describe(report: BackfillReport | None) -> dict[str, Any] | None:
    """A report as plain data (for health output and logs)."""
    if report is None:
        return None
    return {
        "memories": report.memories, "episodes": report.episodes, "remaining": report.remaining,
        "refused": [f"{k}:{i}" for k, i in report.refused], "stopped": report.stopped,
    }  # fmt: skip
