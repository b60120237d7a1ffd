"""The quality gate and autocut: which scored candidates are good enough to return.

The gate (spec §5.10) judges each row on one signal, chosen by priority
confidence > rsf > cosine > rrf, against either the calibrated gate (when one
was measured for that very signal) or a pool-size heuristic: the larger the
agent's pool, the lower the bar, because a bigger store makes a chance match
at a given rank less surprising. It only removes rows; order is kept.

Deliberate difference from the reference: against the heuristic bar a row is
judged on its score before the episode boundary penalty (the penalty still
orders the list and still shows in ``match_reason``). In the reference a
memory written before the newest episode is gated out of keyword-only recall
altogether on small pools, and beyond ~51 h before the episode on any pool.

Autocut (spec §5.12) then trims a tail after a large score gap, but only on
similarity-scale scores: fused scores are never autocut.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cpersona.services.app import App
from cpersona.storage.search import Record, RowKey

PROFILE_KEY: RowKey = ("profile", -1)
PROFILE_MIN_POOL = 50  # the profile rides along only in a scope this large (spec ORD-3)
UNSCORED_MIN_POOL = 100  # rows with no score at all pass only in a pool this large
# Every pool rule is flat from this size on (the heuristic bar reaches its floor
# at 499 rows), so recall counts the pool no further than this.
POOL_SATURATION = 499


@dataclass(slots=True)
class Candidate:
    """A row on its way from fusion to the response, with every score it carries."""

    key: RowKey
    record: Record | None = None  # None for the profile row
    profile_text: str | None = None
    rrf: float | None = None
    rsf: float | None = None
    cosine: float | None = None
    confidence: float | None = None  # only under legacy confidence ordering
    single_arm: bool = False  # only one retriever could have ranked it (spec §5.8.2)
    penalty: float = 1.0  # product of the factors scale() applied (the episode penalty)
    backfilled: bool = False  # cosine read from the stored vector, not found by the vector arm (§5.9.4)
    shown_cosine: float | None = None  # display-only cosine under fusion ordering: never judged (§5.9.3)
    confidence_payload: dict[str, Any] | None = None  # the response's "confidence" object (§5.9.3)
    prior: float | None = None  # the age prior's multiplier, when it ran (§5.9.6)
    held: dict[str, Any] | None = None  # a held seat's match_reason: outside the ranked order (§5.13 ORD-2)
    # Set by keyword_floor.annotate when the query was embedded (issue 14):
    judged_rrf: float | None = None  # the rrf the heuristic bar judges: near-list votes at full weight
    # (fusion mode, score): the row's fused score over the lexical lists alone (keyword-only's view)
    lexical: tuple[str, float] | None = None
    # Under rrf with rows read past the cut (fusion.confirmed): the fused score of the votes within
    # depth. Those rows order the answer; the gate and its calibration judge what the retrievers
    # returned within depth, the population the bars were derived and measured on.
    cut_rrf: float | None = None

    @property
    def is_profile(self) -> bool:
        return self.key == PROFILE_KEY

    @property
    def signal(self) -> tuple[str, float] | None:
        """The (name, value) the gate judges this row on, or None when unscored."""
        for name in ("confidence", "rsf", "cosine", "rrf"):
            value = getattr(self, name)
            if value is not None:
                return name, (self.cut_rrf if name == "rrf" and self.cut_rrf is not None else value)
        return None

    def scale(self, factor: float) -> None:
        """Multiply every score the row carries (the episode penalty does this)."""
        self.penalty *= factor
        for name in ("rrf", "rsf", "cosine", "cut_rrf"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value * factor)


@dataclass(frozen=True, slots=True)
class CalibratedGate:
    """A measured threshold and the one signal it was measured on."""

    threshold: float
    signal: str  # "rrf", "rsf", "cosine" or "confidence"


def heuristic_min_score(pool: int) -> float:
    """The bar for a pool of ``pool`` rows without calibration (spec GATE-2).

    0.5 for an empty pool, falling with log(pool) to 0.2 at 499 rows and beyond.
    """
    if pool <= 0:
        return 0.5
    return round(0.5 - 0.3 * min(1.0, math.log(pool + 1) / math.log(500)), 4)


def calibrated_gate_for(app: App, agent_id: str, *, enabled: bool) -> CalibratedGate | None:
    """The calibrated fused gate that applies to ``agent_id``, if any (spec GATE-3).

    Calibration keeps its live values on ``App.calibration`` and answers
    ``fused_gate_for``. Without a calibrated gate recall uses the heuristic.
    """
    state = App.calibration.if_built(app) if enabled else None
    measured = state.fused_gate_for(agent_id) if state is not None else None
    return None if measured is None else CalibratedGate(float(measured[0]), str(measured[1]))


def apply_gate(
    candidates: Sequence[Candidate],
    *,
    pool: int,
    query_blank: bool,
    deep: bool,
    rrf_k: int,
    calibrated: CalibratedGate | None = None,
) -> list[Candidate]:
    """The candidates that pass the gate, in their original order (spec GATE-5, GATE-6)."""
    min_score = heuristic_min_score(pool)
    gate = calibrated.threshold if calibrated else None
    if deep:  # spec GATE-4: deep recall halves both bars
        min_score *= 0.5
        gate = None if gate is None else gate * 0.5

    def passes(row: Candidate) -> bool:
        if row.is_profile:
            return pool >= PROFILE_MIN_POOL
        judged = row.signal
        if judged is None:
            return query_blank or pool >= UNSCORED_MIN_POOL
        name, value = judged
        if gate is not None and calibrated is not None and calibrated.signal == name:
            return value >= gate  # calibration measured penalised scores: compare like with like
        # The heuristic bar judges the score the retrievers gave. The episode
        # penalty orders rows; it must not exclude them: a halved first place
        # (1/61 × 0.5) can never clear the rrf bar, so every memory older than
        # the newest episode became unrecallable (README decision 3; measured
        # in tests/test_vector_channel.py and the issue-3 report).
        if name == "rrf" and row.judged_rrf is not None:
            value = row.judged_rrf  # before any penalty or vector weight: the ranks the retrievers gave
        elif row.penalty > 0 and name != "confidence":  # legacy confidence is judged as 2.5 did (§5.9.3)
            value /= row.penalty
        if name != "rrf":
            return value >= min_score
        # Fused rank scores live on a scale of at most 3/(K+1) (three first
        # places), so the bar is scaled down to it. A row only one retriever could
        # have ranked can reach 1/(K+1) at best; a bar above that would block
        # even that retriever's best match.
        bar = min_score * 3 / (rrf_k + 1)
        if row.single_arm:
            bar = min(bar, 1 / (rrf_k + 1))
        return value >= bar

    def keyword_admits(row: Candidate) -> bool:
        """Whether keyword-only recall's gate would pass the row on its lexical lists alone.

        Embeddings never cost answers (issue 14): with a weak or out-of-domain
        embedder the cosine-keyed bar (a row the vector arm scored is judged
        on its cosine), the fused bar, a calibrated gate or the vector votes
        could drop rows the lexical lists vouch for, and a recall that
        keyword-only answered came back []. Without an embedder every row is
        single-arm and judged on the fused score, which is the bar used here.
        """
        if row.lexical is None or row.is_profile or (row.signal is not None and row.signal[0] == "confidence"):
            return False  # legacy confidence ordering keeps 2.5's gate; gate_fallback is its lexical rescue
        mode, value = row.lexical  # judged as keyword-only judges it, whatever signal the row carries now
        if mode == "rrf":
            return value >= min(min_score * 3 / (rrf_k + 1), 1 / (rrf_k + 1))
        return value >= min_score

    return [row for row in candidates if passes(row) or keyword_admits(row)]


def autocut(candidates: Sequence[Candidate], *, min_results: int, min_gap_ratio: float) -> list[Candidate]:
    """Drop the tail after the largest score gap, on similarity-scale scores only.

    The profile row is set aside and kept where it is. Fusion scores (rrf/rsf)
    are positions among co-candidates, not similarities, so a list keyed on
    them is never cut; neither is a list where some row lacks a cosine.
    """
    scored = [row for row in candidates if not row.is_profile]
    if len(scored) < max(2, min_results):
        return list(candidates)
    first = scored[0]
    if first.confidence is not None:
        scores = [row.confidence for row in scored]
    elif first.rsf is not None or first.rrf is not None:
        return list(candidates)
    else:
        scores = [row.cosine for row in scored]
    if any(s is None for s in scores):
        return list(candidates)
    values: list[float] = [float(s) for s in scores]  # type: ignore[arg-type]
    if values[0] <= 0:
        return list(candidates)
    gaps = [values[i] - values[i + 1] for i in range(len(values) - 1)]
    widest = max(gaps)
    if widest / values[0] < min_gap_ratio:
        return list(candidates)
    keep = {id(row) for row in scored[: gaps.index(widest) + 1]}
    return [row for row in candidates if row.is_profile or id(row) in keep]
