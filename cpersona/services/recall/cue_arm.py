"""The time cue applied to the candidate pool: the cue arm, the lift and the seats (spec TQ-4 … TQ-7).

A cue says *when* the answer was stored. The period it names is searched as
well, to a depth of 50: the rows of the period (memories by their timestamp,
episodes by their start) that hold a word of the query, most words first,
then newest. The cue only ever adds: it never changes a score, the gate or
autocut. Rows the answer already holds that the period search also found move
up a few places; rows the period search found that no arm retrieved at all
take a few held seats. A period search that finds nothing is widened once by
one confidence step before giving up.

Deliberate difference from the reference: the period is searched lexically
only (no vector pass restricted to the period), so ``remainder`` — the
reference's note about period rows past the vector scan window — never arises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cpersona.services.recall.gate import Candidate
from cpersona.services.recall.time_cue import (
    CONFIDENCES,
    POLICY,
    TimeCue,
    base_period,
    ignored_notice,
    recent_only,
    widen,
)
from cpersona.storage.scope import Scope
from cpersona.storage.search import Record, RowKey, phrase_terms, query_terms, ranking_terms

DEPTH = 50  # rows the period search returns (TQ-6)
PLACES = {"sure": 3, "likely": 2, "vague": 1}  # how far a cue row may move up, and how many seats (TQ-6)


@dataclass(slots=True)
class CueOutcome:
    """What the cue did: the period search's rows (best first) and the notice for the response."""

    found: list[RowKey] = field(default_factory=list)
    confidence: str = "sure"
    notice: dict[str, Any] | None = None
    used: bool = False  # False: no cue, no period, or a recent-only cue (nothing moves, no seats)

    @property
    def places(self) -> int:
        return PLACES[self.confidence] if self.used else 0


def search_period(
    backend: Any,
    scope: Scope,
    cue: TimeCue | None,
    query: str,
    phrases: Sequence[str],
    source_id: str,
    *,
    now: datetime,
) -> CueOutcome:
    """TQ-4 … TQ-6: the period the cue names and the rows found in it (widened once when empty)."""
    outcome = CueOutcome()
    if cue is None:
        return outcome
    # TQ-4: any stamp the engine reads as an instant counts (not only date-shaped ones)
    oldest, newest = backend.memory_span(scope, date_shaped_only=False) if _needs_span(cue) else (None, None)
    base = base_period(cue, now, oldest, newest)
    if base is None:
        return outcome  # long_ago on an empty scope, or no start: no period to search
    if recent_only(base, now):  # TQ-5: judged on the sure-width period
        outcome.notice = ignored_notice(base)
        return outcome
    confidence = cue.confidence
    period = widen(base, confidence)
    found = _in_period(backend, scope, period, query, phrases, source_id)
    revised = False
    if not found and confidence != CONFIDENCES[-1]:
        confidence = CONFIDENCES[CONFIDENCES.index(confidence) + 1]
        period = widen(base, confidence)
        found = _in_period(backend, scope, period, query, phrases, source_id)
        revised = True
    outcome.found, outcome.confidence, outcome.used = found, confidence, True
    outcome.notice = {
        "policy": POLICY,
        "period": [period[0].isoformat(), period[1].isoformat()],
        "confidence": confidence,
        "revised": revised,
        "moved": 0,
        "seated": 0,
    }
    return outcome


def lift(keys: list[RowKey | None], found: set[RowKey], places: int) -> tuple[list[int], int]:
    """TQ-6: the answer's order after rows the period search also found move up by at most ``places``.

    Top-down, each found row steps past the rows above it, one at a time, up to
    ``places`` steps; it stops at another found row or at a row some found row
    already stepped past (no row is pushed down more than one place, and found
    rows keep their order among themselves). Returns the new order (indices
    into ``keys``) and how many rows changed place, lifted and passed alike.
    Scores and membership are untouched. (Order and count measured against
    the reference on fixtures where several found rows compete.)
    """
    order = list(range(len(keys)))
    passed: set[int] = set()
    for at in range(len(order)):
        if keys[order[at]] not in found:
            continue
        pos = at
        for _ in range(places):
            above = order[pos - 1] if pos > 0 else None
            if above is None or keys[above] in found or above in passed:
                break
            passed.add(above)
            order[pos - 1], order[pos] = order[pos], above
            pos -= 1
    moved = sum(1 for new, old in enumerate(order) if new != old)
    return order, moved


def _needs_span(cue: TimeCue) -> bool:
    return cue.ago == "long_ago" or (cue.ago is None and cue.after is None)


def _in_period(
    backend: Any, scope: Scope, period: tuple[datetime, datetime], query: str, phrases: Sequence[str], source_id: str
) -> list[RowKey]:
    """Rows of the period holding a term of the query (content words first) or a cue phrase, best first.

    A query with no usable term (blank, or only words shorter than 3
    characters) finds the period's rows newest first.
    """
    terms = query_terms(query)
    words = [*ranking_terms(terms), *phrase_terms(phrases, terms)]
    return backend.period_rows(scope, period[0], period[1], words, source_id=source_id, depth=DEPTH)


def seat_records(
    backend: Any, scope: Scope, outcome: CueOutcome, retrieved: set[RowKey], *, source_id: str = ""
) -> list[Record]:
    """TQ-6: the best period rows no arm retrieved, as many as the cue lifts places, best first.

    Hydrated through the scope and the source filter, so a seat can never
    carry a row the caller could not have recalled.
    """
    wanted = [key for key in outcome.found if key not in retrieved][: outcome.places]
    records = backend.fetch(scope, wanted, source_id=source_id)
    return [records[key] for key in wanted if key in records]


def cued_answer(
    backend: Any,
    scope: Scope,
    outcome: CueOutcome,
    admitted: list[Candidate],
    retrieved: set[RowKey],
    limit: int,
    *,
    source_id: str = "",
) -> tuple[list[Candidate], list[Candidate]]:
    """Recall's answer under a cue: the ranked rows (lifted, then cut) and the held seats, both best first.

    The lift works on the admitted list before the cut, as in reconstruct, so a
    period row just past ``limit`` can move into the answer. Seats are labelled
    for the response (spec ORD-2: ``admission: "reservation"``, ``signal: "cue"``,
    ``cue_rank`` 0 = the period search's best) and ``outcome.notice`` gets the
    counts (TQ-7).
    """
    order, moved = lift([row.key for row in admitted], set(outcome.found), outcome.places)
    ranked = [admitted[i] for i in order][:limit]
    records = seat_records(backend, scope, outcome, retrieved | {row.key for row in ranked}, source_id=source_id)
    seats = [
        Candidate(record.key, record=record, held={"signal": "cue", "admission": "reservation", "cue_rank": rank})
        for rank, record in enumerate(records)
    ]
    if outcome.used and outcome.notice is not None:
        outcome.notice.update(moved=moved, seated=len(seats))
    return ranked, seats
