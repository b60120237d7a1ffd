"""The statistics behind calibration, on plain numpy arrays (spec §5.18.1–§5.18.3).

No labels exist, so every threshold is placed against a *null* population —
similarities of random pairs, which are unrelated almost surely — and, for the
``separation`` method and the fused gate, a *positive* population of pairs that
are related by construction (written minutes apart, or nearest neighbours).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SWEEP_POINTS = 256
_BLOCK_ROWS = 256  # rows of the pair matrix computed at once: bounds peak memory, not the result


@dataclass(frozen=True)
class NullPairs:
    """Every unordered pair's dot product, sorted, and each vector's best match."""

    sorted_values: np.ndarray  # ascending
    nearest: np.ndarray  # per vector: its largest dot product with any other vector

    @property
    def count(self) -> int:
        return int(self.sorted_values.size)


def null_pairs(vectors: np.ndarray) -> NullPairs:
    """Dot products of all n(n−1)/2 distinct pairs of the rows of ``vectors``.

    Computed in row blocks of the upper triangle, so the full n×n matrix never
    exists at once; the pairs themselves (the O(n²) part the sample cap bounds)
    are kept as float32.
    """
    n = vectors.shape[0]
    pairs = np.empty(n * (n - 1) // 2, dtype=np.float32)
    nearest = np.full(n, -np.inf)
    at = 0
    for start in range(0, n, _BLOCK_ROWS):
        stop = min(start + _BLOCK_ROWS, n)
        block = vectors[start:stop] @ vectors[start:].T  # rows start..stop against columns start..n
        rows = stop - start
        mask = np.arange(block.shape[1])[None, :] > np.arange(rows)[:, None]  # strictly above the diagonal
        upper = np.where(mask, block, -np.inf)
        nearest[start:stop] = np.maximum(nearest[start:stop], upper.max(axis=1))
        nearest[start:] = np.maximum(nearest[start:], upper.max(axis=0))
        values = block[mask]  # row-major: pair (i, j) for each i in the block, j > i
        pairs[at : at + values.size] = values
        at += values.size
    pairs.sort()
    return NullPairs(pairs, nearest)


def quantile(sorted_values: np.ndarray, q: float) -> float:
    """The q-quantile with linear interpolation between order statistics."""
    n = sorted_values.size
    position = q * (n - 1)
    low = math.floor(position)
    high = min(low + 1, n - 1)
    weight = position - low
    return float(sorted_values[low]) * (1 - weight) + float(sorted_values[high]) * weight


def admit_rate(sorted_values: np.ndarray, threshold: float) -> float:
    """Share of values ≥ threshold."""
    if sorted_values.size == 0:
        return 0.0
    below = int(np.searchsorted(sorted_values, threshold, side="left"))
    return (sorted_values.size - below) / sorted_values.size


def describe(sorted_values: np.ndarray) -> dict[str, float]:
    """mean, population std, median and 95th percentile, 4 decimals (spec §5.18.1)."""
    as64 = sorted_values.astype(np.float64, copy=False)
    return {
        "mean": round(float(as64.mean()), 4),
        "std": round(float(as64.std()), 4),
        "median": round(quantile(sorted_values, 0.5), 4),
        "p95": round(quantile(sorted_values, 0.95), 4),
    }


def mean(values: np.ndarray) -> float:
    return float(np.asarray(values, dtype=np.float64).mean()) if values.size else 0.0


@dataclass(frozen=True)
class Sweep:
    """The operating point that best separates positives from nulls."""

    threshold: float  # raw, before any floor
    tpr: float  # share of positives admitted there
    fpr: float  # share of nulls admitted there

    @property
    def youden_j(self) -> float:
        return self.tpr - self.fpr


def separation_sweep(positives: np.ndarray, nulls: np.ndarray, beta: float) -> Sweep:
    """The first of 256 evenly spaced candidates maximising TPR + β·(1 − FPR) (spec SP-1).

    β weighs specificity: a larger β puts the threshold higher, rejecting more
    nulls at the cost of missing more positives.
    """
    pos = np.sort(np.asarray(positives, dtype=np.float64))
    null = np.sort(np.asarray(nulls, dtype=np.float64))
    low = min(pos[0], null[0])
    high = max(pos[-1], null[-1])
    candidates = np.array([low]) if high <= low else np.linspace(low, high, SWEEP_POINTS)
    tpr = (pos.size - np.searchsorted(pos, candidates, side="left")) / pos.size
    fpr = (null.size - np.searchsorted(null, candidates, side="left")) / null.size
    best = int(np.argmax(tpr + beta * (1.0 - fpr)))
    return Sweep(float(candidates[best]), float(tpr[best]), float(fpr[best]))


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to unit length (rows of norm ~0 left as they are)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.array(vectors, dtype=np.float64), where=norms > 1e-9)
