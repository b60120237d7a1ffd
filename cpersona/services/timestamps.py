"""Reading caller time stamps, and the future-timestamp policy (spec §5.4).

Caller stamps are stored verbatim and never validated (ST-7, VF-2); this module
only *reads* them: to tell whether a stamp lies ahead of the clock, and to order
an episode's history. A stamp without an offset is UTC and ``Z`` means +00:00.

A stamp Python's ISO parser refuses is read the way SQLite's date functions
read it (FT-1), because that is how SQL over the stored column will see it: a
Julian day number such as ``2500000`` is a date far in the future to SQLite.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any


log = logging.getLogger(__name__)


def parse_iso(stamp: str) -> datetime | None:
    """An ISO-8601 stamp as an aware UTC datetime, or None if it is not one."""
    if not isinstance(stamp, str):
        return None
    try:
        moment = datetime.fromisoformat(stamp.strip())
    except ValueError:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def instant_seconds(stamp: str) -> float | None:
    """Unix seconds of a caller stamp: ISO-8601 first, then SQLite's reading (FT-1)."""
    moment = parse_iso(stamp)
    if moment is not None:
        return moment.timestamp()
    if not isinstance(stamp, str) or not stamp.strip():
        return None
    # dialect imports both search backends: a stdio start on SQLite loads it only when a stamp needs it
    from cpersona.storage.dialect import sqlite_seconds

    return sqlite_seconds(stamp)


def sql_stamp(moment: datetime) -> str:
    """The server-clock form of ``created_at`` / ``updated_at`` (VF-1): UTC, whole seconds."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


# -- future-timestamp policy (spec §5.4) ----------------------------------------------


@dataclass(frozen=True, slots=True)
class AheadOfClock:
    """A caller stamp found ahead of the clock by more than the allowance."""

    stamp: str
    ahead_by_seconds: float
    allowance_seconds: int

    def report(self) -> dict[str, Any]:
        """The ``timestamp_ahead_of_clock`` object of a warn-mode answer (FT-2)."""
        return {
            "timestamp": self.stamp,
            "ahead_by_seconds": round(self.ahead_by_seconds, 3),
            "allowance_seconds": self.allowance_seconds,
        }

    def refusal(self, label: str = "timestamp") -> str:
        """The reject-mode message, naming the stamp as the caller sent it."""
        return (
            f"{label} '{self.stamp}' is {int(self.ahead_by_seconds)}s ahead of this clock "
            f"(allowance {self.allowance_seconds}s)"
        )


def ahead_of_clock(stamp: str, now: datetime, allowance_seconds: int) -> AheadOfClock | None:
    """The stamp's lead over ``now`` when it exceeds the allowance, else None.

    Exactly ``now + allowance`` is accepted; a stamp nothing can read is not
    reported here (another check owns unreadable stamps).
    """
    seconds = instant_seconds(stamp)
    if seconds is None:
        return None
    ahead = seconds - now.timestamp()
    if ahead <= allowance_seconds:
        return None
    return AheadOfClock(stamp, ahead, int(allowance_seconds))


@dataclass(frozen=True, slots=True)
class FuturePolicy:
    """``CPERSONA_FUTURE_TIMESTAMP_MODE`` / ``_SKEW_SECONDS`` as one object."""

    mode: str  # "warn" | "reject" | "off"
    allowance_seconds: int

    @classmethod
    def from_settings(cls, settings: Any) -> FuturePolicy:
        return cls(settings.future_timestamp_mode, settings.future_timestamp_skew_seconds)

    def judge(self, stamps: list[str], now: datetime) -> AheadOfClock | None:
        """The first stamp (in the order given) that is ahead, unless the mode is off."""
        if self.mode == "off":
            return None
        for stamp in stamps:
            found = ahead_of_clock(stamp, now, self.allowance_seconds)
            if found is not None:
                if self.mode == "warn":
                    log.warning(
                        "caller timestamp %r is %.3fs ahead of the clock (allowance %ss); stored as sent",
                        stamp,
                        found.ahead_by_seconds,
                        self.allowance_seconds,
                    )
                return found
        return None

    @property
    def rejects(self) -> bool:
        return self.mode == "reject"
