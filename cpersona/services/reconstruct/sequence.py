"""The passage sequences `evidence` and `whole` (spec RX-37), always used under a mode.

Instead of one head quote per item, every item's head record is divided into
passages (governing ranges of its read-time blocks, best first, each at most
800 characters; a record that fits is one whole passage). All passages of all
items are ordered by reciprocal-rank fusion of the item's position and the
passage's position inside its record, so the first passage of every item
comes before the third of the first. Under `whole`, records shown whole come
first, in item order. The answer is then the longest prefix of
passages-then-excerpts that fits the character budget, and an item shows the
passages of that prefix in text order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpersona.services.records.contents import revision_of
from cpersona.services.reconstruct.quote import SEPARATOR, Quote, divide, governing, rank_spans

PASSAGE_CHARS = 800
PRO_WHOLE_ITEMS = 10  # under pro only the first ten items' whole records go first
PRO_HELD_LONG = 6000  # held items' records past this size keep only their first passage in place


@dataclass(frozen=True, slots=True)
class Passage:
    item: int
    inside: int  # rank of the passage inside its record
    start: int
    end: int
    governing_end: int  # end of the governing range before the cut
    whole: bool = False


def record_passages(item: int, text: str, query: str, rrf_k: int) -> list[Passage]:
    if len(text) <= PASSAGE_CHARS:
        return [Passage(item, 0, 0, len(text), len(text), whole=True)]
    blocks = divide(text)
    if len(blocks) <= 1:
        return [Passage(item, 0, 0, PASSAGE_CHARS, len(text))]
    taken: list[tuple[int, int]] = []
    out: list[Passage] = []
    for i in rank_spans(text, blocks, query, rrf_k):
        start, end, _ = governing(text, blocks, i)
        if any(start < e and s < end for s, e in taken):
            continue
        taken.append((start, end))
        out.append(Passage(item, len(out), start, min(end, start + PASSAGE_CHARS), end))
    return out


def order(
    passages: list[list[Passage]], texts: list[str], held: list[bool], *, kind: str, pro: bool, rrf_k: int
) -> list[Passage]:
    """RX-37: every passage of every item, in the order the budget admits them."""
    flat = [p for ps in passages for p in ps]

    def fused(p: Passage) -> tuple[float, int, int]:
        return (-(1.0 / (rrf_k + 1 + p.item) + 1.0 / (rrf_k + 1 + p.inside)), p.item, p.start)

    ranked = sorted(flat, key=fused)
    if kind == "whole":
        first = [p for p in flat if p.whole and (not pro or p.item < PRO_WHOLE_ITEMS)]
        ranked = first + [p for p in ranked if p not in first]
    if pro:
        late = [p for p in ranked if p.inside > 0 and held[p.item] and len(texts[p.item]) > PRO_HELD_LONG]
        ranked = [p for p in ranked if p not in late] + late
    return ranked


def _joined(spans: list[tuple[int, int]]) -> list[list[int]]:
    merged: list[list[int]] = []
    for s, e in sorted(spans):
        if merged and merged[-1][1] == s:
            merged[-1][1] = e
        else:
            merged.append([s, e])
    return merged


def _cost(spans: list[tuple[int, int]]) -> int:
    merged = _joined(spans)
    return sum(e - s for s, e in merged) + len(SEPARATOR) * (len(merged) - 1)


@dataclass(slots=True)
class Prefix:
    """What a prefix of the sequence shows: items 0 … n-1, each from its admitted passages."""

    items: int
    quotes: list[Quote]
    excerpt_counts: list[int]
    used: int
    taken: list[Passage]


def passages_within_budget(sequence: list[Passage], excerpts: list[list[int]], budget: int | None) -> int:
    """How many entries of passages-then-excerpts fit ``budget`` (the first passage always does)."""
    room = float("inf") if budget is None else budget
    spans: dict[int, list[tuple[int, int]]] = {}
    used = 0
    for k, p in enumerate(sequence):
        mine = spans.get(p.item, [])
        delta = _cost(mine + [(p.start, p.end)]) - _cost(mine)
        if k and used + delta > room:
            return k  # excerpts come only after every passage
        spans[p.item] = mine + [(p.start, p.end)]
        used += delta
    count = len(sequence)
    items = 1 + max((p.item for p in sequence), default=-1)
    depth = max((len(e) for e in excerpts[:items]), default=0)
    for j in range(depth):
        for i in range(items):
            if j < len(excerpts[i]):
                if used + excerpts[i][j] > room:
                    return count
                used += excerpts[i][j]
                count += 1
    return count


def prefix(k: int, sequence: list[Passage], excerpts: list[list[int]], refs: list[str], texts: list[str]) -> Prefix:
    """The answer that the first ``k`` entries of the sequence make."""
    taken = sequence[:k]
    items = 1 + max((p.item for p in taken), default=-1)
    quotes = []
    for i in range(items):
        mine = sorted((p for p in taken if p.item == i), key=lambda p: p.start)
        quotes.append(_quote(refs[i], texts[i], mine))
    counts = [0] * items
    rest = k - len(taken)
    depth = max((len(e) for e in excerpts[:items]), default=0)
    for j in range(depth):
        for i in range(items):
            if rest > 0 and j < len(excerpts[i]):
                counts[i] += 1
                rest -= 1
    used = sum(len(q.content) for q in quotes) + sum(excerpts[i][j] for i in range(items) for j in range(counts[i]))
    return Prefix(items, quotes, counts, used, taken)


def _quote(ref: str, text: str, passages: list[Passage]) -> Quote:
    if not passages:
        return Quote("", {"ranges": []})
    if len(passages) == 1 and passages[0].whole:
        return Quote(text, {"ranges": [[0, len(text)]]})
    basis = (
        "start"
        if len(passages) == 1 and passages[0].governing_end == len(text) and passages[0].start == 0
        else "lexical"
    )  # read-time division ranked lexically, as the head quotes (RX-31)
    merged = _joined([(p.start, p.end) for p in passages])
    fields: dict[str, Any] = {"content_len": len(text)}
    cut = next((p for p in passages if p.governing_end > p.end), None)
    if cut is not None:
        fields["expand"] = {"ref": ref, "span": [cut.start, cut.governing_end], "revision": revision_of(text)}
        if cut.governing_end < len(text) or cut.start > 0:
            fields["context_incomplete"] = True
    fields["ranges"] = merged
    return Quote(SEPARATOR.join(text[s:e] for s, e in merged), fields, basis=basis)


def trace(kind: str, sequence: list[Passage], taken: list[Passage], refs: list[str]) -> dict[str, Any]:
    """RX-43 ``sequence``: the passages taken, with their ranks."""
    return {
        "mode": kind,
        "candidates": len(sequence),
        "taken": [
            {
                "ref": refs[p.item],
                "span": [p.start, p.end],
                "ranks": {"record": p.item, "inside": p.inside, "cosine": None},
            }
            for p in taken
        ],
    }
