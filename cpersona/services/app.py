"""What every service function is handed: the database, the settings, the clock.

Service functions are plain Python: ``fn(app, **arguments) -> dict``. They take
the tool's arguments by name (already checked against the tool's JSON schema by
the MCP facade, unknown keys dropped), do the memory logic over the storage
layer and return the response object the spec describes. They never import the
MCP SDK, so tests call them directly on a real database.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from cpersona.config import Settings
from cpersona.storage.engine import Database


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class App:
    db: Database
    settings: Settings
    # Injected so tests can move time; everything that reads "now" asks here.
    clock: Callable[[], datetime] = utc_now
    # The embedding client (cpersona.embedding); None while CPERSONA_EMBEDDING_MODE
    # is "none". Callers embed BEFORE taking the write lock (spec PG-4).
    embedder: Any = None
    # Later features (embedder, pause registry, calibration, task queue) hang
    # their state here rather than in module globals.
    extras: dict[str, Any] = field(default_factory=dict)
    # True on the App a call runs with while the caller's no-persist bucket is
    # paused (set by cpersona.mcp.pause_gate): a read must then skip its
    # incidental writes, such as recall counters (spec P-12).
    writes_paused: bool = False
    # True when callers reach this App over streamable HTTP: they are not the
    # machine's user, so export/import paths are confined to the database's
    # exports/ directory unless CPERSONA_EXPORT_DIR names one (spec decision 12).
    # Set once, where the server is built for that transport (cli.serve).
    remote_callers: bool = False

    def now_iso(self) -> str:
        """Server default stamp: ISO-8601 UTC with microseconds (spec VF-2)."""
        return self.clock().isoformat(timespec="microseconds")
