"""The transactions of a bulk restore (import, merge): batches for a real run, one snapshot for a dry run.

A real run commits every few hundred records (storage ``write_batches``), so
another writer never waits more than one batch for the lock (issue 13 item 3).
The restore code calls :meth:`Run.tick` after each record, at a point where
everything written so far is whole (a row, its full-text entry and derived
rows, all from the row's own triggers), so a crash or a refusal leaves a
consistent prefix; the dedup rules of ``writer`` make a re-run skip that
prefix and finish the rest.

:class:`Run` also remembers the tallies as they stood at the last commit: an
answer after a failure reports what is durable, not what was rolled back.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection

from cpersona.services.app import App
from cpersona.storage.engine import WriteBatches

T = TypeVar("T")


class Run(Generic[T]):
    """One bulk restore's connection, batch boundaries and durable tallies."""

    def __init__(self, connection: Connection, batches: WriteBatches | None) -> None:
        self.connection = connection
        self._batches = batches
        self._tallies: Callable[[], T] | None = None
        self.committed: T | None = None
        self.on_commit: list[Callable[[], None]] = []
        self.before_commit: list[Callable[[], None]] = []
        if batches is not None:
            batches.before_commit = lambda: [hook() for hook in self.before_commit]
            batches.after_commit = self._committed

    @property
    def dry_run(self) -> bool:
        return self._batches is None

    @property
    def wrote(self) -> bool:
        """True once some batch committed (a failure can no longer roll everything back)."""
        return self._batches is not None and self._batches.commits > 0

    def track(self, tallies: Callable[[], T]) -> None:
        """Which tallies to copy at each commit."""
        self._tallies = tallies

    def tick(self) -> bool:
        """One record done; commits the batch when it is full (True then)."""
        return self._batches is not None and self._batches.tick()

    def _committed(self) -> None:
        if self._tallies is not None:
            self.committed = copy.deepcopy(self._tallies())
        for hook in self.on_commit:
            hook()


@contextmanager
def restore_run(app: App, *, dry_run: bool) -> Iterator[Run[Any]]:
    """A dry run reads one snapshot and writes nothing (IM-14, MG-2); a real run writes in batches."""
    if dry_run:
        with app.db.read() as session:
            yield Run(session.connection(), None)
        return
    with app.db.write_batches() as batches:
        yield Run(batches.connection, batches)


def stopped_message(reason: str, what: str) -> str:
    """The error of a run that failed after some batches committed."""
    return (
        f"{what} stopped part-way and the part already written was kept: {reason}. "
        f"Running the same {what} again completes it (what is already there is skipped)"
    )
