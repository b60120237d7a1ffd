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
from dataclasses import dataclass, field, replace

from cpersona.storage.search import RowKey

VECTOR_CHANNELS = ("vector", "far")  # the lists the vector channel makes; the others are lexical
AGREE_ROWS = 2  # the keyword rows a vector list must hold one of to vote against a clear first place
DOMINANT = 0.9  # a keyword first place is clear when its second row scores below this share of it
SHARED = 2  # rows that may hold one first place on one score (a reply and its question, replies.with_replies)
VECTOR_ONLY_SHARE = 5  # one seat in this many of an answer may go to a row no keyword list holds (seat_vector_only)


@dataclass(frozen=True, slots=True)
class Ranked:
    key: RowKey
    rank: float  # 0-based position on the retriever's own list (fractional once put on another table's scale)
    raw: float | None = None  # the retriever's score, higher is better; None = unscored


@dataclass(frozen=True, slots=True)
class RankedList:
    channel: str  # "vector", "far", "episodes", "memories"
    entries: tuple[Ranked, ...]
    weight: float = 1.0  # votes of this list count this much (the far list's prior)
    scale: float = 1.0  # a rank here counts as rank × scale under rrf (see on_one_scale)

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
    """Reciprocal rank fusion: each appearance adds ``weight / (k + rank + 1)``.

    On equal fused scores the row with more of its score from the lexical
    lists goes first, then first-seen order. Deliberate difference from the
    reference, whose ties follow list order and so put the vector list's row
    first: a vector-only row at rank r tied the lexical-only row at rank r,
    and on every LoCoMo dev conversation the lexical list is the more
    precise at the top (MRR 0.45-0.53 vs 0.30-0.42 for the vector list
    alone, all-MiniLM-L6-v2), so the lexical row is the better bet.
    """
    fused: dict[RowKey, Fused] = {}
    lexical: dict[RowKey, float] = {}
    for ranked in lists:
        for entry in ranked.entries:
            row = fused.setdefault(entry.key, Fused(entry.key, 0.0))
            vote = ranked.weight / (k + entry.rank * ranked.scale + 1)
            row.score += vote
            if ranked.channel not in VECTOR_CHANNELS:
                lexical[entry.key] = lexical.get(entry.key, 0.0) + vote
            row.ranks.setdefault(ranked.channel, entry.rank)
    return sorted(fused.values(), key=lambda row: (-row.score, -lexical.get(row.key, 0.0)))


def past_the_cut(depth: int) -> int:
    """How deep recall reads the near list under rrf: half as far again as ``depth`` (see :func:`confirmed`)."""
    return depth + depth // 2


def confirmed(lists: Sequence[RankedList], depth: int) -> Sequence[RankedList]:
    """The lists with every row past the cut (rank >= ``depth``) kept only where the other channel ranks it within it.

    Under rrf with a query vector recall reads the near list half as far
    again as ``depth`` (:func:`past_the_cut`) and keeps each merged lexical
    list whole (both indexes' ``depth`` rows). Past the cut one list's vote
    never seats a row in an answer of ``depth`` (a lexical row at rank
    ``depth`` ties the vector row at the same rank, and a tie goes to the
    lexical row), so a row there counts only when a list of the other channel
    (vector beside lexical) ranks it within ``depth``: a row one retriever
    found and the other placed just past the cut is the evidence the cut
    threw away. A row past the cut on both channels is dropped: the gate
    judges the votes within ``depth``, and it would have none. Deliberate
    difference from the reference, whose lists end at ``depth``: on LoCoMo dev
    with all-MiniLM-L6-v2 it lifts R@10 0.665 -> 0.672 (docs/benchmarks.md,
    "Issue 14, fifth pass"; leave-one-conversation-out chose 1.5 x depth for
    the near list in four folds of five). A row past the cut votes at its
    own rank; the gate judges it on its votes within ``depth``
    (``Candidate.cut_rrf``), not on a cosine (``retrievers.vector_lists``
    records cosines for the first ``depth`` rows only), so the rows the gate
    keys on cosine, and the rrf population calibration measures, are the
    ones they were.
    """
    if all(e.rank < depth for lst in lists for e in lst.entries):
        return lists
    channels = {lst.channel in VECTOR_CHANNELS for lst in lists if lst.entries}
    if channels != {True, False}:
        return lists  # one channel only (keyword-only recall): nothing to confirm against
    vector = {e.key for lst in lists if lst.channel in VECTOR_CHANNELS for e in lst.entries if e.rank < depth}
    lexical = {e.key for lst in lists if lst.channel not in VECTOR_CHANNELS for e in lst.entries if e.rank < depth}
    out = []
    for lst in lists:
        other = lexical if lst.channel in VECTOR_CHANNELS else vector
        entries = tuple(e for e in lst.entries if e.rank < depth or e.key in other)
        out.append(lst if len(entries) == len(lst.entries) else replace(lst, entries=entries))
    return out


def within_cut(lists: Sequence[RankedList], depth: int) -> list[RankedList]:
    """The lists cut at ``depth`` ranks: what each retriever would have returned at that depth."""
    return [replace(lst, entries=tuple(e for e in lst.entries if e.rank < depth)) for lst in lists]


def on_one_scale(lists: Sequence[RankedList], memories: int, episodes: int) -> Sequence[RankedList]:
    """Every list's ranks on one scale: rank among the larger table's rows.

    Each lexical list ranks its own table, and rrf reads a rank as how
    selective the match was. The episodes of a scope are usually a few dozen
    beside hundreds of memories, so the episode list's tenth place is a much
    weaker match than the memory list's, yet it drew the same vote, and a
    ten-row answer took five episodes whenever both tables matched (issue
    14: one episode archived per LoCoMo session cost 0.074 R@10 keyword-only).
    The smaller table's ranks are stretched by the ratio of the two table
    sizes (``memories``, ``episodes``: the scope's counts); both first places
    still draw equal votes. Deliberate difference from the reference, which
    votes on the raw rank of each list. The scale orders rows; the gate still
    judges the ranks the retrievers gave (``keyword_floor.annotate``).

    The vector lists rank both tables in one list by cosine; there each row's
    rank becomes its rank among its own table's rows in that list, the
    smaller table's stretched the same way. Episode summaries sit close to
    many questions, so with one episode per session the near list still
    gave episodes its high ranks (MiniLM R@10 0.616 against 0.665 without
    episodes); the rule has no parameter and changes nothing when only one
    table is in the list (docs/benchmarks.md, "Issue 14, fifth pass").
    """
    if memories <= 0 or episodes <= 0 or memories == episodes:
        return lists  # the same object: nothing was rescaled
    smaller, ratio = ("episodes", memories / episodes) if episodes < memories else ("memories", episodes / memories)
    kind = "ep" if smaller == "episodes" else "mem"
    out = []
    for lst in lists:
        if lst.channel == smaller:
            out.append(replace(lst, scale=ratio))
        elif lst.channel in VECTOR_CHANNELS and any(e.key[0] == kind for e in lst.entries):
            out.append(replace(lst, entries=_own_table_ranks(lst.entries, kind, ratio)))
        else:
            out.append(lst)
    return out


def _own_table_ranks(entries: Sequence[Ranked], smaller: str, ratio: float) -> tuple[Ranked, ...]:
    """Each row ranked among the rows of its own table in the list, the ``smaller`` table's × ``ratio``."""
    seen: dict[str, int] = {}
    out = []
    for entry in entries:
        table = entry.key[0]
        place = seen.get(table, 0)
        seen[table] = place + 1
        out.append(replace(entry, rank=place * ratio if table == smaller else place))
    return tuple(out)


def vector_votes(lists: Sequence[RankedList], depth: int | None = None) -> Sequence[RankedList]:
    """The lists with the vector channel's votes kept or, for this query, set aside (weight 0).

    The vector lists vote unless the keyword lists are confident and the
    vector lists disagree with them: the first row of a keyword list scores
    more than ``1 / DOMINANT`` times its second (a clear first place) and
    neither vector list holds any keyword list's first ``AGREE_ROWS`` rows.
    At K = 60 any row on two lists outranks a row on one, so a vector list
    that cannot read the text (all-MiniLM-L6-v2 on Japanese: its first row
    is the right paragraph 19% of the time against the keyword list's 91%)
    lifted every row it happened to share with the keyword list above the
    keyword first place: JSQuAD R@1 0.916 keyword-only, 0.675 with MiniLM.
    A list that agrees with the keyword top, or a keyword list without a
    clear first place, is the case where the vector channel adds answers.
    Both values were chosen by leave-one-conversation-out on LoCoMo dev
    (every fold chose 2 rows; 0.9 on four, 0.85 on one) and checked on
    JSQuAD (docs/benchmarks.md, "Issue 14, third pass"). Rows set aside
    still come after the keyword rows in the vector list's order; the gate
    judges them by the ranks the retrievers gave (``keyword_floor.annotate``).
    With ``depth``, agreement is judged on the vector rows ranked within it
    (the rows past the cut, :func:`confirmed`, are there because they agree).
    A reply and its question on one score are one first place
    (:func:`first_place`); ``AGREE_ROWS`` covers both.
    """
    lexical = [lst for lst in lists if lst.channel not in VECTOR_CHANNELS and lst.entries]
    vector = [lst for lst in lists if lst.channel in VECTOR_CHANNELS and lst.entries]
    if not lexical or not vector:
        return lists
    if not any(_clear_first(lst) for lst in lexical):
        return lists
    top = {entry.key for lst in lexical for entry in lst.entries[:AGREE_ROWS]}
    if any(entry.key in top for lst in vector for entry in lst.entries if depth is None or entry.rank < depth):
        return lists
    return [replace(lst, weight=0.0) if lst.channel in VECTOR_CHANNELS else lst for lst in lists]


def defer_to_clear_first(lists: Sequence[RankedList]) -> Sequence[RankedList]:
    """The lists with the near list's first-place vote also given to the memories list's clear first place.

    When the keyword ranking of the memories is sure of its first row (it
    scores above the second by more than ``1 / DOMINANT``, the rule of
    :func:`vector_votes`), the near list's vote for that row counts as its
    first place, so a row both channels vouch for goes first and the vector
    votes order the rest, as on a kana/kanji query whose first rows agree
    (``cjk_query.vector_votes``). The keyword list alone is the more precise
    at the top (LoCoMo dev MRR 0.45-0.53 against 0.30-0.42 for
    all-MiniLM-L6-v2 alone), and the vector rows ranked above a clear
    keyword first place were, on LoCoMo dev, the rows that cost NDCG@10
    against keyword-only (conversation 30: 0.501 vs 0.526). Only the
    memories list: episodes summarise many turns and so match many
    questions, and an episode's clear first place pinned first took the
    first seat from the memories with one episode archived per session.
    A silenced vector list (weight 0) gives nothing. Deliberate difference
    from the reference (docs/benchmarks.md, "Issue 14, fifth pass").
    A first place held by a reply and its question (:func:`first_place`)
    takes the near list's first two votes, reply first, so the pair stays
    together at the top; the other rows keep their ranks.
    """
    memories = next((lst for lst in lists if lst.channel == "memories" and lst.entries), None)
    held = 0 if memories is None else first_place(memories)
    if not held:
        return lists
    firsts = [e.key for e in memories.entries[:held]]
    out = []
    for lst in lists:
        if lst.channel == "vector" and lst.weight > 0:
            cosine = {e.key: e.raw for e in lst.entries}
            rest = tuple(e for e in lst.entries if e.key not in firsts)
            lst = replace(lst, entries=(*(Ranked(k, i, cosine.get(k)) for i, k in enumerate(firsts)), *rest))
        out.append(lst)
    return out


def vector_only_seats(limit: int) -> int:
    """Seats of a ``limit``-row answer that rows found by the vector channel alone may take: a fifth, at least one."""
    return max(1, limit // VECTOR_ONLY_SHARE)


def seat_vector_only(lists: Sequence[RankedList], seats: int, k: int) -> Sequence[RankedList]:
    """The lists with the vector votes of rows no keyword list holds kept for the best ``seats`` of them.

    A row only the vector channel found (on no lexical list, at any depth
    read) is the least precise row an answer can hold: on LoCoMo dev with
    all-MiniLM-L6-v2 the first such row of the near list is evidence 3.5% of
    the time, the second 1.8%, the third and fourth 0.7%, against 2-3% for
    the keyword rows at ranks 4-9 that they pushed out of the ten. Under rrf
    at K = 60 a vector-only row at near rank r ties the keyword row at rank
    r, so a ten-row answer took up to four of them. The best ``seats`` of
    them (by their vector votes) keep their votes; the others keep their
    rows in a list of weight 0 after every voted row, in the near list's
    order, so an answer the keyword lists cannot fill still gets them and no
    row is lost. Rows on both channels, and a vector list set aside, are not
    touched. Ordering only: the gate judges the votes within depth
    (``Candidate.cut_rrf``, computed before this). Deliberate difference from
    the reference (docs/benchmarks.md, "Issue 14, sixth pass"): LoCoMo dev
    R@10 0.712 -> 0.718, higher or equal on every conversation, R@10 and
    NDCG@10.
    """
    lexical = {e.key for lst in lists if lst.channel not in VECTOR_CHANNELS for e in lst.entries}
    if not lexical:
        return lists  # the vector channel is the only evidence: nothing to make room for
    votes: dict[RowKey, float] = {}
    for lst in lists:
        if lst.channel in VECTOR_CHANNELS and lst.weight > 0:
            for e in lst.entries:
                if e.key not in lexical:
                    votes[e.key] = votes.get(e.key, 0.0) + lst.weight / (k + e.rank * lst.scale + 1)
    if len(votes) <= seats:
        return lists
    kept = set(sorted(votes, key=lambda key: -votes[key])[:seats])  # stable: on equal votes the first seen
    out, aside = [], {}
    for lst in lists:
        if lst.channel in VECTOR_CHANNELS and lst.weight > 0:
            for e in lst.entries:
                if e.key in votes and e.key not in kept:
                    aside.setdefault(e.key, e)
            lst = replace(lst, entries=tuple(e for e in lst.entries if e.key not in aside))
        out.append(lst)
    return [*out, RankedList("vector", tuple(aside.values()), 0.0)]


def first_place(ranked: RankedList) -> int:
    """How many rows hold the list's clear first place: 0 when it has none.

    The first place is clear when the first row scoring below the first row
    scores below ``DOMINANT`` times it. Up to ``SHARED`` rows may share
    the first score and hold the first place together: a question's reply
    is seated just ahead of it with the question's score
    (``replies.with_replies``), so a pair at the top compared with itself
    (second row = first row) never had a clear first place, and on LoCoMo
    dev with all-MiniLM-L6-v2 those were the queries where the vector votes
    pushed the pair down (NDCG@10 below keyword-only on conversations 26,
    30 and 42; docs/benchmarks.md, "Issue 14, fifth pass: replies and the
    clear first place"). Three or more rows on one score are a tie, not a
    first place.
    """
    entries = ranked.entries
    if len(entries) < 2:
        return 0
    first = entries[0].raw
    if first is None or first <= 0:
        return 0
    held = 1
    while held < len(entries) and held < SHARED and entries[held].raw == first:
        held += 1
    if held == len(entries):
        return 0  # nothing below the shared score to be clear of
    below = entries[held].raw
    if below is None or below == first or below >= DOMINANT * first:
        return 0
    return held


def _clear_first(ranked: RankedList) -> bool:
    """The list has a clear first place (:func:`first_place`)."""
    return first_place(ranked) > 0


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
