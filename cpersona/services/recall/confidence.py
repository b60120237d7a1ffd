"""The confidence score: how far a recalled row can be trusted now (spec §5.9.2–5.9.4).

A score in [0, 1] built from three things a fused rank does not know:

- similarity: the row's cosine, stretched between ``CPERSONA_COSINE_FLOOR`` and
  ``_CEIL`` (rows without one are judged on time alone);
- time: a hyperbolic decay with age, slowed on corpora that span a long time
  (so a year-long store does not age everything to the floor) and floored
  higher for rows that keep being recalled;
- state: a resolved episode counts less, and a row recalled a moment ago is
  held back so a repeated question surfaces something new.

Under the default ``fusion`` ordering the score only rides beside the returned
rows; under ``legacy`` it orders and gates them (recall decides which, see
:func:`cpersona.services.recall.service.run_recall`).

The database reads here take the caller's session, so a recall can do all its
reading in one snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any


from cpersona.embedding.vectors import FLOAT32, VectorError, from_blob
from cpersona.services.recall.gate import Candidate
from cpersona.services.timestamps import parse_iso
from cpersona.storage.repositories.base import Repository
from cpersona.storage.repositories.episodes import EpisodeRepository
from cpersona.storage.repositories.memories import MemoryRepository
from cpersona.storage.scope import Scope
from cpersona.storage.search import Record, RowKey, SearchBackend

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

HOUR = 3600.0


# -- time span (spec §5.9.2) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimeSpan:
    """Oldest and newest readable memory timestamp in the recall's scope (None: no such row)."""

    oldest: datetime | None = None
    newest: datetime | None = None

    @property
    def exists(self) -> bool:
        return self.newest is not None

    @property
    def range_hours(self) -> float:
        if self.oldest is None or self.newest is None:
            return 0.0
        return max(0.0, (self.newest - self.oldest).total_seconds() / HOUR)

    def newest_age_hours(self, now: datetime) -> float:
        if self.newest is None:
            return 0.0
        return max(0.0, (now - self.newest).total_seconds() / HOUR)


def memory_time_span(backend: SearchBackend, scope: Scope) -> TimeSpan:
    """The chronological span of the scope's memory timestamps (spec §5.9.2).

    Timestamps are caller strings with any offset, so text order is not time
    order: the backend takes the minimum and maximum instant. Only date-shaped
    stamps count, so a bare number the engine would read as a Julian day takes
    no part, nor do empty or unreadable stamps.
    """
    oldest, newest = backend.memory_span(scope, date_shaped_only=True)
    return TimeSpan(oldest, newest)


# -- the score (spec §5.9.3) ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Confidence:
    """One row's score and the payload the response shows beside it."""

    score: float
    payload: dict[str, Any]


def row_confidence(
    settings: Any,
    *,
    now: datetime,
    span: TimeSpan,
    cosine: float | None,
    stamp: str | None,
    resolved: bool = False,
    recall_count: int = 0,
    last_recalled_at: str | None = None,
    deep: bool = False,
) -> Confidence:
    """The confidence of one row (spec §5.9.3); ``stamp`` None or unreadable = age unknown."""
    range_h = span.range_hours
    moment = parse_iso(stamp) if stamp else None
    if moment is not None:
        age_h = max(0.0, (now - moment).total_seconds() / HOUR)
    elif span.exists:  # an undated row is placed at the middle of the scope's span
        age_h = span.newest_age_hours(now) + range_h / 2
    else:
        age_h = max(settings.min_time_range_hours, range_h) / 2

    last = parse_iso(last_recalled_at) if last_recalled_at else None
    since_last_h = max(0.0, (now - last).total_seconds() / HOUR) if last is not None else None
    boost = math.log1p(max(0, recall_count)) * settings.recall_boost
    if since_last_h is not None:
        boost /= 1 + since_last_h * settings.boost_decay_rate  # the boost fades once recalls stop
    floor = min(settings.decay_ceil, settings.decay_floor + boost)

    if deep:
        decay = 1.0
    else:
        rate = settings.decay_rate
        if range_h > 0:  # a long-lived store ages more slowly
            rate /= max(1.0, max(settings.min_time_range_hours, range_h) / settings.reference_hours)
        decay = max(floor, 1 / (1 + age_h * rate))
    completion = settings.resolved_decay_factor if resolved and not deep else 1.0
    recent = since_last_h is not None and since_last_h * 60 < settings.recent_recall_window_min and not deep
    penalty = settings.recent_recall_penalty if recent else 1.0

    if cosine is not None:
        width = settings.cosine_ceil - settings.cosine_floor
        norm = (cosine - settings.cosine_floor) / width if width > 0 else float(cosine >= settings.cosine_ceil)
        base = math.sqrt(min(1.0, max(0.0, norm)) * decay)
    else:
        base = math.sqrt(decay)
    score = round(base * completion * penalty, 4)

    payload: dict[str, Any] = {"age_hours": round(age_h, 1)}
    if moment is None:
        payload["age_unknown"] = True
    if resolved:
        payload["resolved"] = True
    if cosine is not None:
        payload["cosine"] = round(cosine, 4)
    payload["score"] = score
    return Confidence(score, payload)


def record_confidence(
    settings: Any, record: Record | None, *, cosine: float | None, now: datetime, span: TimeSpan, deep: bool
) -> Confidence:
    """:func:`row_confidence` for a recalled row; ``record`` None is the profile row (no time, no counters)."""
    if record is None:
        return row_confidence(settings, now=now, span=span, cosine=cosine, stamp=None, deep=deep)
    counted = record.kind == "mem"  # episodes carry no recall counters (spec §5.9.2)
    return row_confidence(
        settings,
        now=now,
        span=span,
        cosine=cosine,
        stamp=record.timestamp,
        resolved=record.resolved,
        recall_count=record.recall_count if counted else 0,
        last_recalled_at=record.last_recalled_at if counted else None,
        deep=deep,
    )


# -- cosine from stored vectors (spec §5.9.4) -----------------------------------------


_REPOSITORIES: dict[str, type[Repository]] = {"mem": MemoryRepository, "ep": EpisodeRepository}


def stored_cosines(session: Session, query_vector: bytes | None, keys: Iterable[RowKey]) -> dict[RowKey, float]:
    """Dot product of the query vector with each row's stored vector (spec §5.9.4).

    Only rows with a positive id whose stored vector has the query's width and
    finite values get one; every other row is left out of the answer. Stored
    and query vectors are unit length, so the dot product is the cosine.
    """
    if not query_vector:
        return {}
    try:
        query = from_blob(query_vector)
    except VectorError:
        return {}
    wanted: dict[str, list[int]] = {}
    for kind, row_id in keys:
        if kind in _REPOSITORIES and isinstance(row_id, int) and row_id > 0:
            wanted.setdefault(kind, []).append(row_id)
    import numpy as np  # only once there is a vector (see cpersona.embedding.vectors)

    width = len(query_vector)
    found: dict[RowKey, float] = {}
    for kind, ids in wanted.items():
        for row_id, blob in _REPOSITORIES[kind](session).stored_vectors(ids):
            if blob is None or len(blob) != width:
                continue
            try:
                vector = from_blob(blob)
            except VectorError:
                continue
            value = float(np.dot(vector, query).astype(FLOAT32))
            if math.isfinite(value):
                found[(kind, row_id)] = value
    return found


# -- confidence in the recall pipeline ------------------------------------------------


def legacy_ordering(settings: Any) -> bool:
    """Whether confidence orders and gates the rows (``CPERSONA_CONFIDENCE_ORDERING=legacy``, §6 item 2)."""
    return bool(settings.confidence_enabled) and settings.confidence_ordering == "legacy"


def backfill_cosines(session: Session, query_vector: bytes | None, rows: list[Candidate]) -> None:
    """Legacy ordering: a row the vector arm did not find takes its cosine from its stored vector.

    Such rows are marked ``backfilled``: they are what ``gate_fallback`` may
    rescue (spec §5.11). A row without a usable vector keeps no cosine.
    """
    missing = [row for row in rows if row.cosine is None and row.record is not None and row.record.has_embedding]
    found = stored_cosines(session, query_vector, (row.key for row in missing))
    for row in missing:
        if (value := found.get(row.key)) is not None:
            row.cosine, row.backfilled = value, True


def order_by_confidence(
    settings: Any, rows: list[Candidate], *, now: datetime, span: TimeSpan, deep: bool
) -> list[Candidate]:
    """Legacy ordering: every row, the profile included, gets ``_confidence``; best first (stable)."""
    for row in rows:
        scored = record_confidence(settings, row.record, cosine=row.cosine, now=now, span=span, deep=deep)
        row.confidence, row.confidence_payload = scored.score, scored.payload
    return sorted(rows, key=lambda row: -(row.confidence or 0.0))


def describe_confidence(
    settings: Any,
    session: Session,
    query_vector: bytes | None,
    rows: list[Candidate],
    *,
    now: datetime,
    span: TimeSpan,
    deep: bool,
) -> None:
    """Fusion ordering: the confidence shown beside each returned row; it orders and gates nothing.

    A row the vector arm did not find is given the cosine of its stored vector
    for display (``shown_cosine``, also in ``match_reason.cosine``), without
    becoming a cosine-judged row.
    """
    missing = [row for row in rows if row.cosine is None and row.record is not None and row.record.has_embedding]
    shown = stored_cosines(session, query_vector, (row.key for row in missing))
    for row in missing:
        row.shown_cosine = shown.get(row.key)
    for row in rows:
        cosine = row.cosine if row.cosine is not None else row.shown_cosine
        row.confidence_payload = record_confidence(
            settings, row.record, cosine=cosine, now=now, span=span, deep=deep
        ).payload


def gate_fallback(pre_gate: list[Candidate], passed: list[Candidate]) -> list[Candidate] | None:
    """The rows ``gate_fallback`` returns, or None when it does not fire (spec §5.11).

    It fires when the gate let no row but the profile through and the list
    held rows whose cosine was backfilled: those come back, in pre-gate order,
    with the profile only if the gate had passed it.
    """
    if any(not row.is_profile for row in passed) or not any(row.backfilled for row in pre_gate):
        return None
    profile_passed = any(row.is_profile for row in passed)
    return [row for row in pre_gate if row.backfilled or (row.is_profile and profile_passed)]
