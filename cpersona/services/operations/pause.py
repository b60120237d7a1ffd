"""The no-persist pause: buckets, deadlines and the three tools that manage them.

Model (spec admin-and-safety §9.1): an in-process map ``bucket → deadline``.
A declared ``session_key`` is its own bucket (scope ``session``); every caller
that declares none shares one bucket (scope ``process``). Nothing is stored on
disk and no timer runs: an expired entry is dropped whenever the map is
consulted, judged by ``app.clock`` so tests can move time.

What a paused write answers is decided by the MCP facade's pause gate
(:mod:`cpersona.mcp.pause_gate`); this module only knows whether a bucket is
paused, for how long, and how to say so (:func:`skip_reason`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from cpersona.services.app import App
from cpersona.services.requests import Request
from cpersona.services.responses import failure

DEFAULT_TTL_SECONDS = 1800
MAX_TTL_SECONDS = 86400
MAX_LIVE_PAUSES = 256  # P-4: a pause is never evicted to make room for another
KEYLESS = ""
TRANSPORT_KEY = "transport"  # C-7: a client that names its transport has declared no key


def bucket_of(session_key: Any) -> str:
    """The bucket a ``session_key`` selects (spec C-7); KEYLESS for none.

    A non-string is read as the default "" (spec C-4), so it lands in the shared bucket.
    """
    if not isinstance(session_key, str):
        return KEYLESS
    key = session_key.strip()
    return KEYLESS if key == TRANSPORT_KEY else key


def scope_of(bucket: str) -> str:
    return "process" if bucket == KEYLESS else "session"


def iso(moment: datetime) -> str:
    """P-7: ISO-8601 UTC with microseconds and ``+00:00``."""
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


@dataclass(frozen=True, slots=True)
class PauseState:
    """One bucket as seen at one clock reading (``now``)."""

    bucket: str
    now: datetime
    deadline: datetime | None = None

    @property
    def paused(self) -> bool:
        return self.deadline is not None

    @property
    def remaining_seconds(self) -> float | None:
        if self.deadline is None:
            return None
        return (self.deadline - self.now).total_seconds()

    @property
    def scope(self) -> str:
        return scope_of(self.bucket)


class PauseCapacityFull(Exception):
    def __init__(self, earliest: datetime) -> None:
        super().__init__(earliest)
        self.earliest = earliest


class PauseBuckets:
    """The bucket → deadline map of one server process; safe to use from any thread."""

    def __init__(self, capacity: int = MAX_LIVE_PAUSES) -> None:
        self.capacity = capacity
        self._deadlines: dict[str, datetime] = {}
        self._lock = threading.Lock()

    def _drop_expired(self, now: datetime) -> None:
        for bucket in [b for b, deadline in self._deadlines.items() if deadline <= now]:
            del self._deadlines[bucket]

    def state(self, bucket: str, now: datetime) -> PauseState:
        with self._lock:
            self._drop_expired(now)
            return PauseState(bucket, now, self._deadlines.get(bucket))

    def arm(self, bucket: str, ttl_seconds: int, now: datetime) -> datetime:
        """Pause ``bucket`` until now + TTL (P-5: last write wins, no stacking)."""
        with self._lock:
            self._drop_expired(now)
            if bucket not in self._deadlines and len(self._deadlines) >= self.capacity:
                raise PauseCapacityFull(min(self._deadlines.values()))
            deadline = now + timedelta(seconds=ttl_seconds)
            self._deadlines[bucket] = deadline
            return deadline

    def clear(self, bucket: str, now: datetime) -> bool:
        """Resume ``bucket``; True when it held a live pause just before (P-8)."""
        with self._lock:
            self._drop_expired(now)
            return self._deadlines.pop(bucket, None) is not None


def pause_state(app: App, session_key: Any) -> PauseState:
    """Whether the bucket ``session_key`` selects is paused right now."""
    return app.pause_buckets.state(bucket_of(session_key), app.clock())


def ttl_text(state: PauseState) -> str:
    remaining = state.remaining_seconds
    if remaining is None:
        return "TTL unknown"
    if remaining <= 0:
        return "TTL expired"
    if remaining >= 60:
        return f"{int(remaining // 60)}m left"
    return f"{int(remaining)}s left"


def skip_reason(tool: str, state: PauseState) -> str:
    """The ``reason`` every skipped write carries (spec §9.5)."""
    return (
        f"session no-persist mode active ({ttl_text(state)}) — `{tool}` skipped. "
        "Call `resume_persistence` to re-enable, or wait for TTL to elapse."
    )


# -- the three tools -------------------------------------------------------------------


def _checked_ttl(ttl_seconds: Any) -> int:
    """P-6: the schema bounds the TTL; a caller behind it gets the same rules, plus a clamp."""
    if isinstance(ttl_seconds, float) and ttl_seconds.is_integer():
        ttl_seconds = int(ttl_seconds)
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int):
        raise ValueError("ttl_seconds must be a positive integer")
    if ttl_seconds < 1:
        raise ValueError("ttl_seconds must be >= 1")
    return min(ttl_seconds, MAX_TTL_SECONDS)


@dataclass(frozen=True)
class SessionArguments(Request):
    """``resume_persistence``'s and ``persistence_status``'s arguments; defaults are the schema's."""

    session_key: str = ""


@dataclass(frozen=True)
class PauseArguments(SessionArguments):
    """``pause_persistence``'s arguments; defaults are the schema's (which bounds the TTL, P-6)."""

    ttl_seconds: int = DEFAULT_TTL_SECONDS


def _session_key(session_key: Any) -> str:
    # A non-string is read as the default "" (spec C-4), as bucket_of reads it.
    return session_key if isinstance(session_key, str) else ""


def pause_persistence(app: App, *, ttl_seconds: Any = DEFAULT_TTL_SECONDS, session_key: Any = "") -> dict[str, Any]:
    """:func:`answer_pause_persistence` for a library caller, whose arguments no schema has checked."""
    try:
        ttl = _checked_ttl(ttl_seconds)
    except ValueError as exc:
        return failure(str(exc))
    return answer_pause_persistence(app, PauseArguments(ttl_seconds=ttl, session_key=_session_key(session_key)))


def answer_pause_persistence(app: App, args: PauseArguments) -> dict[str, Any]:
    """Arm the selected bucket for ``ttl_seconds`` (spec §9.2)."""
    ttl = min(args.ttl_seconds, MAX_TTL_SECONDS)
    bucket = bucket_of(args.session_key)
    try:
        deadline = app.pause_buckets.arm(bucket, ttl, app.clock())
    except PauseCapacityFull as full:
        return failure(
            f"persistence was NOT paused: {MAX_LIVE_PAUSES} sessions already hold a live pause on this process, "
            "and granting another would revoke one of them. "
            f"The earliest frees at {iso(full.earliest)}; resume_persistence on a key you no longer need "
            "frees one now."
        )
    return {"paused": True, "expires_at": iso(deadline), "ttl_seconds": ttl, "scope": scope_of(bucket)}


def resume_persistence(app: App, *, session_key: Any = "") -> dict[str, Any]:
    """:func:`answer_resume_persistence` for a library caller, whose arguments no schema has checked."""
    return answer_resume_persistence(app, SessionArguments(session_key=_session_key(session_key)))


def answer_resume_persistence(app: App, args: SessionArguments) -> dict[str, Any]:
    """Clear the selected bucket only (spec §9.3)."""
    bucket = bucket_of(args.session_key)
    was_active = app.pause_buckets.clear(bucket, app.clock())
    return {"paused": False, "was_active": was_active, "scope": scope_of(bucket)}


def persistence_status(app: App, *, session_key: Any = "") -> dict[str, Any]:
    """:func:`answer_persistence_status` for a library caller, whose arguments no schema has checked."""
    return answer_persistence_status(app, SessionArguments(session_key=_session_key(session_key)))


def answer_persistence_status(app: App, args: SessionArguments) -> dict[str, Any]:
    """Report the selected bucket only (spec §9.4)."""
    state = pause_state(app, args.session_key)
    remaining = state.remaining_seconds
    return {
        "paused": state.paused,
        "expires_at": iso(state.deadline) if state.deadline else None,
        # P-9: floored, never negative, from the same clock reading as the expiry test.
        "ttl_remaining_seconds": None if remaining is None else max(0, math.floor(remaining)),
        "scope": state.scope,
    }
