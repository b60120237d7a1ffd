"""Merging ranked lists from several retrievers into one (spec §5.8). Pure functions.

Each retriever hands in a :class:`RankedList`: the rows it found, best first,
each at its own 0-based rank. A row excluded by the caller keeps no entry but
the rows after it keep their original ranks (spec §5.7.5), which is why ranks
are stored rather than read off list positions.

Lists arrive in a fixed order (vector near list, far list, episodes, memories)
and every sort below is stable, so on equal scores the row first seen in that
order wins: the outcome depends only on the inputs (spec RC-11).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cpersona.storage.search import RowKey

VECTOR_CHANNELS = ("vector", "far")  # the lists the vector channel makes; the others are lexical


@dataclass(frozen=True, slots=True)
class Ranked:
    key: RowKey
    rank: int  # 0-based position on the retriever's own list
    raw: float | None = None  # the retriever's score, higher is better; None = unscored


@dataclass(frozen=True, slots=True)
class RankedList:
    channel: str  # "vector", "far", "episodes", "memories"
    entries: tuple[Ranked, ...]
    weight: float = 1.0  # votes of this list count this much (the far list's prior)

    @classmethod
    def of(cls, channel: str, keys_and_raw: Sequence[tuple[RowKey, float | None]], weight: float = 1.0) -> RankedList:
        """A list whose ranks are the positions in ``keys_and_raw``."""
        return cls(channel, tuple(Ranked(k, r, raw) for r, (k, raw) in enumerate(keys_and_raw)), weight)


@dataclass(slots=True)
class Fused:
    key: RowKey
    score: float
    ranks: dict[str, int] = field(default_factory=dict)  # channel -> rank on that channel


def rrf(lists: Sequence[RankedList], k: int) -> list[Fused]:
    """Reciprocal rank fusion: each appearance adds ``weight / (k + rank + 1)``."""
    fused: dict[RowKey, Fused] = {}
    for ranked in lists:
        for entry in ranked.entries:
            row = fused.setdefault(entry.key, Fused(entry.key, 0.0))
            row.score += ranked.weight / (k + entry.rank + 1)
            row.ranks.setdefault(ranked.channel, entry.rank)
    return sorted(fused.values(), key=lambda row: -row.score)


def min_max(values: Sequence[float | None]) -> list[float]:
    """Per-query normalisation of one channel (spec §5.8.3).

    No value present, or a single distinct value: every row 1.0. Otherwise
    ``(v - min) / (max - min)``, and 0.0 for a row without a value.
    """
    present = [v for v in values if v is not None]
    if not present or min(present) == max(present):
        return [1.0] * len(values)
    low, high = min(present), max(present)
    return [0.0 if v is None else (v - low) / (high - low) for v in values]


def rsf(lists: Sequence[RankedList]) -> list[Fused]:
    """Relative score fusion: min-max normalised scores, summed, over the channels in use.

    The divisor is the number of channels holding at least one row, so a score
    places a row among this query's co-candidates; it does not measure
    similarity (the weakest row of a channel is pinned to 0.0, a lone row to 1.0).
    """
    fused: dict[RowKey, Fused] = {}
    used = 0
    for ranked in lists:
        if not ranked.entries:
            continue
        used += 1
        normalised = min_max([entry.raw for entry in ranked.entries])
        for entry, value in zip(ranked.entries, normalised, strict=True):
            row = fused.setdefault(entry.key, Fused(entry.key, 0.0))
            row.score += value * ranked.weight
            row.ranks.setdefault(ranked.channel, entry.rank)
    for row in fused.values():
        row.score /= max(used, 1)
    return sorted(fused.values(), key=lambda row: -row.score)


def cascade(
    vector: Sequence[RowKey],
    episodes: Sequence[RowKey],
    memories: Sequence[RowKey],
    *,
    limit: int,
    profile: RowKey | None = None,
) -> list[RowKey]:
    """The legacy sequential fill (spec §5.8.4), also the blank-query path.

    Vector rows, then episode rows, then the profile, then memory rows for the
    places still free (the profile does not take one). A row already placed is
    skipped. Stage inputs are expected to be cut to ``limit`` already.
    """
    placed: list[RowKey] = []
    seen: set[RowKey] = set()

    def take(keys: Sequence[RowKey], room: int) -> None:
        for key in keys:
            if room <= 0:
                return
            if key not in seen:
                seen.add(key)
                placed.append(key)
                room -= 1

    take(vector, limit)
    take(episodes, limit)
    filled = len(placed)
    if profile is not None:
        placed.append(profile)
        seen.add(profile)
    take(memories, max(0, limit - filled))
    return placed
