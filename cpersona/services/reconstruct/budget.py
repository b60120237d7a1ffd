"""Stage 6: the character budget over one fixed payload sequence (RX-35 … RX-39).

The sequence is every head quote in item order, then each item's first
excerpt, then each item's second, and so on; the answer is the longest prefix
that fits. Raising the budget can therefore only add to an answer, never take
anything away (RX-36).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Admission:
    items: int = 0  # items returned (a prefix of the item order)
    excerpts: list[int] = field(default_factory=list)  # excerpts admitted per returned item
    used: int = 0
    cut_items: int = 0  # items the budget left out


def quotes_within_budget(heads: list[int], excerpts: list[list[int]], budget: int | None) -> Admission:
    """``heads[i]`` / ``excerpts[i][j]``: characters of item i's head quote and j-th excerpt."""
    out = Admission()
    room = float("inf") if budget is None else budget
    for size in heads:
        if out.items and out.used + size > room:
            break  # the first head is always admitted, even alone over budget
        out.used += size
        out.items += 1
    out.cut_items = len(heads) - out.items
    out.excerpts = [0] * out.items
    depth = max((len(e) for e in excerpts[: out.items]), default=0)
    for j in range(depth):
        for i in range(out.items):
            if j >= len(excerpts[i]):
                continue
            if out.used + excerpts[i][j] > room:
                return out  # the first excerpt that does not fit ends the sequence
            out.used += excerpts[i][j]
            out.excerpts[i] += 1
    return out
