"""Retrieval metrics over one ranked list (best first) against a set of evidence ids.

Binary relevance throughout: a returned turn is relevant iff it is evidence.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

METRIC_NAMES = ("recall@5", "recall@10", "hit@10", "mrr", "ndcg@10")


def recall_at(ranked: Sequence[str], evidence: set[str], k: int) -> float:
    return len(evidence.intersection(ranked[:k])) / len(evidence)


def reciprocal_rank(ranked: Sequence[str], evidence: set[str], k: int = 10) -> float:
    for position, item in enumerate(ranked[:k], start=1):
        if item in evidence:
            return 1.0 / position
    return 0.0


def ndcg_at(ranked: Sequence[str], evidence: set[str], k: int) -> float:
    dcg = sum(1.0 / math.log2(position + 1) for position, item in enumerate(ranked[:k], start=1) if item in evidence)
    ideal = sum(1.0 / math.log2(position + 1) for position in range(1, min(len(evidence), k) + 1))
    return dcg / ideal


def score_question(ranked: Sequence[str], evidence: Iterable[str]) -> dict[str, float]:
    """All metrics for one question. `ranked` is best-first and may hold duplicates-free ids only."""
    wanted = set(evidence)
    if not wanted:
        raise ValueError("a question without evidence cannot be scored")
    return {
        "recall@5": recall_at(ranked, wanted, 5),
        "recall@10": recall_at(ranked, wanted, 10),
        "hit@10": 1.0 if wanted.intersection(ranked[:10]) else 0.0,
        "mrr": reciprocal_rank(ranked, wanted, 10),
        "ndcg@10": ndcg_at(ranked, wanted, 10),
    }


def average(scores: Sequence[dict[str, float]]) -> dict[str, float]:
    if not scores:
        return {name: 0.0 for name in METRIC_NAMES}
    return {name: sum(s[name] for s in scores) / len(scores) for name in METRIC_NAMES}


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (p50 = median of an odd list); 0 for an empty list."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]
