"""The start-up work no first answer needs, started only once that answer is out.

Spec T-7 step 9 schedules it before the transport starts; here it is scheduled
then but *started* after the server's first answer, because each part imports
code and takes the GIL (the vector backfill, the task-queue drain, the update
check) and on a busy machine that delayed the first answer by seconds. Nothing
here is needed by that answer: rows without vectors are served as they are,
queued tasks are durable rows that wait, and the update notice is only ever
attached to later answers.

What a call *does* need is started by :meth:`BackgroundWork.prepare`, before
serving: the per-agent betas (preferences) are put in force, and with
embeddings on the calibration restore starts, because it holds the calibration
lock from its first step, so a calibrate call right after start sees the
restored thresholds (tests/test_calibration.py). Without embeddings there is no
such restore.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from cpersona.services.app import App

log = logging.getLogger(__name__)


class BackgroundWork:
    """Start once (after the first answer), stop once (before the database closes)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False
        self._calibration: Any = None
        self._queue: Any = None
        self._coarse: threading.Thread | None = None

    def prepare(self) -> None:
        # Without a sidecar file there is nothing to restore (read_sidecar answers "missing"),
        # so the calibration modules are not loaded for it (tests/test_startup.py).
        if os.path.exists(self.app.settings.calibration_sidecar):
            from cpersona.services.calibration.state import restore_preferences

            restore_preferences(self.app)
        if self.app.settings.embedding_mode != "none":
            from cpersona.services.calibration.service import start_measurement

            self._calibration = start_measurement(self.app)

    def start(self) -> None:
        """Start every part; a no-op after the first call or once stopped."""
        with self._lock:
            if self._started or self._stopped:
                return
            self._started = True
            try:
                self._start_parts()
            except Exception:  # noqa: BLE001 - background work must never take the server down
                log.exception("start-up background work failed to start")

    def start_in_thread(self) -> None:
        """:meth:`start` without blocking the caller (the event loop that just wrote an answer)."""
        threading.Thread(target=self.start, name="cpersona-start-background", daemon=True).start()

    def _start_parts(self) -> None:
        # Rows an earlier run stored without a vector get one (never under the lock), and the DB
        # task queue drains what earlier runs left (spec Q-2): both only write, so not on a
        # read-only database. The update check runs once, unwaited (UP-2). Each part's module is
        # imported only when that part runs: with embeddings off there is no vector to backfill,
        # and with CPERSONA_UPDATE_CHECK=false no check (tests/test_startup.py).
        if self.app.db.read_only is None:
            settings = self.app.settings
            if self.app.db.is_sqlite and settings.vector_reach > settings.max_memories:
                # Writers without sqlite-vec (the sqlite3 shell, CPersona 2.6) leave the coarse
                # index behind; it is a cache, so it is put back in step here, off the first answer.
                # Only the far list reads it: with the reach inside the window a start pays nothing.
                self._coarse = threading.Thread(
                    target=self._reconcile_coarse, name="cpersona-coarse-reconcile", daemon=True
                )
                self._coarse.start()
            if self.app.embedder is not None:  # backfill.keeps_local_vectors is False without one
                from cpersona.services.records.backfill import start_backfill

                start_backfill(self.app)
            from cpersona.services.operations.tasks import start_task_queue

            self._queue = start_task_queue(self.app)
        if self.app.settings.update_check:
            from cpersona.services.operations.update_check import start_update_check

            start_update_check(self.app)

    def _reconcile_coarse(self) -> None:
        from cpersona.storage.coarse_sqlite import reconcile_database

        try:
            with self.app.db.background():
                reconcile_database(self.app.db)
        except Exception:  # noqa: BLE001 - a cache left behind costs candidates, never the server
            log.exception("coarse vector index reconcile failed")
        # Then this process's copy of it (storage/vector_index_sqlite.py), so the first far list
        # does not pay the load (~1 s of CPU a million rows).
        from cpersona.storage.vector_index_sqlite import warm_database

        try:
            with self.app.db.background():  # a walk of the whole coarse table: the small-cache connection
                warm_database(self.app.db)
        except Exception:  # noqa: BLE001 - the first far list loads it instead
            log.exception("in-process vector index load failed")
        from cpersona.storage.engine import trim_heap

        trim_heap()  # the load's chunks of fetched rows are freed, not yet returned

    def stop(self) -> None:
        """Stop what was started (waiting as each part allows); later starts do nothing."""
        with self._lock:
            self._stopped = True
        if self._calibration is not None:
            self._calibration.stop()
        if not self._started:
            return
        if self._queue is not None:
            self._queue.stop()  # waits up to 5 s for a running handler (spec Q-7)
        if self._coarse is not None:
            self._coarse.join(timeout=30)  # the database closes next
        if App.backfill.if_built(self.app) is not None:  # stop_backfill's own test, before its import
            from cpersona.services.records.backfill import stop_backfill

            stop_backfill(self.app)
