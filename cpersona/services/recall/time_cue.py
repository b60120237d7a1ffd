"""The ``time_cue`` object: its shape (TQ-1 … TQ-3) and the period it names (TQ-4, TQ-5).

The cue is read before any retrieval so that an unreadable cue costs nothing
(RX-2). The period is computed from the scope's oldest and newest memory and
the clock; :mod:`cpersona.services.recall.cue_arm` searches it for recall and reconstruct.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from cpersona.services.responses import ToolFailure

CONFIDENCES = ("sure", "likely", "vague")
MARGIN = {"sure": 0.0, "likely": 0.5, "vague": 1.0}  # of the period's length, each side (TQ-4)
UNITS = {"days": timedelta(days=1), "weeks": timedelta(weeks=1), "months": timedelta(days=30)}
_KEYS = ("after", "before", "ago", "confidence")
RECENT = timedelta(hours=24)
POLICY = "cued-v0.3"


def _refuse(message: str) -> ToolFailure:
    """A bare refusal: each tool adds its own empty answer (recall messages, reconstruct items)."""
    return ToolFailure(message)


@dataclass(frozen=True, slots=True)
class TimeCue:
    confidence: str
    after: datetime | None = None
    before: datetime | None = None
    ago: tuple[str, int] | str | None = None  # (unit, value) or "long_ago"


_EARLIEST = datetime.min.replace(tzinfo=timezone.utc)
_LATEST = datetime.max.replace(tzinfo=timezone.utc)


def _shift(moment: datetime, delta: timedelta) -> datetime:
    """``moment + delta``, clipped to the representable range (TQ-4)."""
    try:
        return moment + delta
    except OverflowError:
        return _LATEST if delta > timedelta(0) else _EARLIEST


def _instant(field: str, value: Any, *, end_of_day: bool) -> datetime:
    if not isinstance(value, str) or not value.strip():
        raise _refuse(f"time_cue.{field} must be a date (YYYY-MM-DD) or an ISO-8601 timestamp")
    text = value.strip()
    try:
        if len(text) == 10:
            day = datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=timezone.utc)
            return _shift(day, timedelta(days=1)) if end_of_day else day  # a date is the whole day (TQ-2)
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise _refuse(f"time_cue.{field} is not a date or timestamp: {value!r}") from None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    try:
        return moment.astimezone(timezone.utc)
    except OverflowError:  # an offset that carries the instant past year 1 or 9999
        return _EARLIEST if moment.year == 1 else _LATEST


def parse_time_cue(raw: Any) -> TimeCue | None:
    """TQ-1 … TQ-3: ``None`` or ``{}`` is no cue; anything unreadable is refused with its reason."""
    if raw is None or raw == {}:
        return None
    if not isinstance(raw, dict):
        raise _refuse("time_cue must be an object")
    unknown = sorted(k for k in raw if k not in _KEYS)
    if unknown:
        raise _refuse(f"time_cue has unknown fields: {unknown}")
    confidence = raw.get("confidence")
    if confidence not in CONFIDENCES:
        raise _refuse("time_cue.confidence is required: one of sure, likely, vague")
    absolute = "after" in raw or "before" in raw
    if absolute == ("ago" in raw):
        raise _refuse("time_cue needs either after/before or ago, not both and not neither")
    if absolute:
        after = _instant("after", raw["after"], end_of_day=False) if "after" in raw else None
        before = _instant("before", raw["before"], end_of_day=True) if "before" in raw else None
        if after is not None and before is not None and before <= after:
            raise _refuse("time_cue.before must be later than time_cue.after")
        return TimeCue(confidence, after=after, before=before)
    ago = raw["ago"]
    if ago == "long_ago":
        return TimeCue(confidence, ago="long_ago")
    if not isinstance(ago, dict) or set(ago) != {"unit", "value"}:
        raise _refuse('time_cue.ago must be {"unit": ..., "value": ...} or "long_ago"')
    if ago["unit"] not in UNITS:
        raise _refuse("time_cue.ago.unit must be one of days, weeks, months")
    value = ago["value"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _refuse("time_cue.ago.value must be a whole number, 0 or more")
    return TimeCue(confidence, ago=(ago["unit"], value))


def base_period(
    cue: TimeCue, now: datetime, oldest: datetime | None, newest: datetime | None
) -> tuple[datetime, datetime] | None:
    """TQ-4 before the confidence margin: the period the cue names, or None."""
    if cue.ago == "long_ago":
        if oldest is None or newest is None:
            return None
        return oldest, oldest + (newest - oldest) / 3
    if cue.ago is not None:
        unit, value = cue.ago
        width = UNITS[unit]
        try:
            centre = now - width * value
        except OverflowError:
            centre = _EARLIEST
        start, end = _shift(centre, -width / 2), min(_shift(centre, width / 2), now)
    else:
        start = cue.after if cue.after is not None else oldest
        end = cue.before if cue.before is not None else now
    if start is None:
        return None
    if end <= start:
        end = _shift(start, timedelta(seconds=1))  # an empty period is widened to one second
    return start, end


def widen(period: tuple[datetime, datetime], confidence: str) -> tuple[datetime, datetime]:
    start, end = period
    margin = (end - start) * MARGIN[confidence]
    return _shift(start, -margin), _shift(end, margin)


def recent_only(period: tuple[datetime, datetime], now: datetime) -> bool:
    """TQ-5: a period starting within the last day says nothing recall's recency does not."""
    return period[0] >= now - RECENT


def ignored_notice(period: tuple[datetime, datetime]) -> dict[str, Any]:
    return {"policy": POLICY, "ignored": "recent_only", "period": [period[0].isoformat(), period[1].isoformat()]}
