"""When FTS5's bm25 need not score the rows only a query's commonest terms match.

FTS5's ``bm25()`` (k1 = 1.2, b = 0.75, the ``rank`` of our FTS tables) sums,
over the phrases of the MATCH expression, ``idf(p) * g(tf, D)`` with
``idf(p) = log((N - n + 0.5) / (n + 0.5))`` (1e-6 when not positive; ``N``
the index's rows, ``n`` the rows holding ``p``) and
``g = tf * (k1 + 1) / (tf + k1 * (1 - b + b * D / avgdl))``, which is 0 for a
phrase the row does not hold and below ``k1 + 1`` for any row that holds it.

So a row that holds only the phrases of a set C scores below
``(k1 + 1) * sum(idf(c) for c in C)``. Split a query's phrases into C (the
commonest) and R (the rest): when the probe-th best row among those holding
an R phrase, scored on **every** phrase, is at least that bound, no row
outside them can enter the first ``probe`` (every such row scores strictly
less), and those first ``probe`` are the whole statement's first ``probe``,
scores and tie order included: the same function scores the same rows with
the same inputs. Scoring the other rows is then wasted, and it is most of a
query's cost when a common word ("s" of a possessive matches 42% of the
bench's rows) is among its terms. When the test fails, the caller runs the
whole statement instead, so the answer never depends on the split.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

K1 = 1.2
# Per phrase, g stays below k1 + 1 whatever the row; the margin covers the
# rounding of the bound's own arithmetic (far below the gap actually left,
# g <= 2.19 even for a phrase a row holds 100 times).
TERM_CEILING = (K1 + 1.0) * (1.0 + 1e-9)
# The largest bound split off: the commoner phrases go to C while their bound
# stays under this. A question's best rows score 5-10 on a rare word; a word
# half the rows hold weighs ~0.3 (bound ~0.7), one in a sixth of them ~1.6.
# At 10k rows with the bench's queries, 3.5 / 6 / 9 / 14 split 156 / 422 / 482 /
# 482 of 592 statements, and 6 left the word arm cheapest (a larger bound
# fails the test more often, and each failure runs the whole statement too).
MAX_BOUND = 6.0
# Below this many rows held by C, scoring them costs less than the split's
# extra statement and counts.
MIN_SKIPPED_ROWS = 200


def idf(total_rows: int, holding: int) -> float:
    """FTS5 bm25's weight of a phrase ``holding`` of ``total_rows`` rows hold."""
    value = math.log((total_rows - holding + 0.5) / (holding + 0.5))
    return value if value > 0.0 else 1e-6


def split(terms: Sequence[str], counts: dict[str, int], total_rows: int) -> tuple[list[str], float] | None:
    """(R, bound): the phrases a row must hold to be scored, and the score a row without them stays below.

    C takes the commonest phrases (by exact row count) while its bound stays
    under :data:`MAX_BOUND`; R keeps at least one phrase that some row holds.
    None when nothing worth splitting off (fewer than :data:`MIN_SKIPPED_ROWS`
    rows held by C) or a count is missing.
    """
    if len(terms) < 2 or any(t not in counts for t in terms):
        return None
    order = sorted(range(len(terms)), key=lambda i: -counts[terms[i]])
    common: set[int] = set()
    bound = 0.0
    for i in order[:-1]:  # the rarest phrase always stays in R
        weight = TERM_CEILING * idf(total_rows, counts[terms[i]])
        if bound + weight > MAX_BOUND:
            break
        common.add(i)
        bound += weight
    rare = [t for i, t in enumerate(terms) if i not in common]
    if not common or not any(counts[t] for t in rare) or sum(counts[terms[i]] for i in common) < MIN_SKIPPED_ROWS:
        return None
    return rare, bound


def total_rows(totals: bytes | None) -> int | None:
    """The row count at the head of an FTS5 totals record (``{fts}_data`` id 1): a SQLite varint."""
    if not totals:
        return None
    value = 0
    for i, byte in enumerate(totals[:9]):
        if i == 8:
            return (value << 8) | byte
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value
    return None


# -- the same bound without exact counts (the trigram index) ---------------------------------
#
# An exact count of a trigram phrase walks the positions of every trigram it is made of: about
# what the ranked statement's own set-up pays, so counting first would cost what it saves (and a
# count is remembered only while the index is unchanged: one store and it is gone). The bound
# needs no exact count, though: ``idf`` falls as the count grows, so a *lower* bound on a
# phrase's count gives an upper bound on its weight, and ``count(*)`` over the first ``k``
# matches (LIMIT k) is such a lower bound that stops walking at ``k``. The split is chosen on
# upper bounds instead (a phrase's rarest trigram's count, which the keyword budget reads
# anyway), and only the score the bound has to stay under decides how far each count walks.

# C takes a phrase only when it holds this many times the rows left to R (by upper bound):
# the filter walks R's phrases once more, and a trigram phrase's walk can cost as much as
# scoring its rows. 3 and 2 (with 3 and 4 phrases in R) split 66 and 105 of 588 trigram
# statements of bench/latency.py's mix at 100k rows, and 2 / 4 saved the more CPU.
COMMON_SHARE = 2.0
# At most this many phrases in R: each is walked once more by the filter.
MAX_RARE = 4
# Rows that C must hold (by upper bound) for the split to be worth its second walk of R.
MIN_COMMON_ROWS = 2000


def split_by_upper(terms: Sequence[str], upper: dict[str, int], total_rows: int) -> tuple[list[str], list[str]] | None:
    """(R, C) for a statement whose phrases' exact counts are unknown, from upper bounds on them.

    C takes the commonest phrases (by ``upper``) while each holds at least
    :data:`COMMON_SHARE` times the rows of the phrases still in R and
    :data:`MIN_COMMON_ROWS` rows, and while C's bound, at those counts, stays
    under :data:`MAX_BOUND` (the least it can be: a count is at most its upper
    bound). R keeps the rarest phrase, every phrase without a count, and at
    most :data:`MAX_RARE` phrases. None when no such split exists. Whether the
    split gives the statement's rows is shown after the pruned statement ran
    (:func:`count_floors`).
    """
    if len(terms) < 2:
        return None
    known = [t for t in terms if t in upper]
    order = sorted(known, key=lambda t: -upper[t])
    common: list[str] = []
    rest = sum(upper[t] for t in known) + (0 if len(known) == len(terms) else MIN_COMMON_ROWS)
    bound = 0.0
    for term in order[:-1] if len(known) == len(terms) else order:
        rest -= upper[term]
        weight = TERM_CEILING * idf(total_rows, upper[term])
        if upper[term] < MIN_COMMON_ROWS or upper[term] < COMMON_SHARE * rest or bound + weight > MAX_BOUND:
            break
        common.append(term)
        bound += weight
    rare = [t for t in terms if t not in common]
    if not common or len(rare) > MAX_RARE or not rare:
        return None
    return rare, common


def holding(total_rows: int, weight: float) -> int:
    """The fewest rows a phrase can hold and still weigh (``idf``) no more than ``weight``."""
    grow = math.exp(weight)
    k = max(1, math.ceil((total_rows + 0.5 - 0.5 * grow) / (1.0 + grow)))
    while k < total_rows and idf(total_rows, k) > weight:  # the closed form's rounding
        k += 1 + k // 1000
    return k


def count_floors(common: Sequence[int], total_rows: int, best: float) -> list[int] | None:
    """For phrases holding at most ``common`` rows each (upper bounds), the counts each must be
    shown to reach for rows holding only them to score below ``best``; None when they cannot.

    What ``best`` leaves above the least bound they can have (each at its upper
    bound) is shared equally between them. A count at or past its floor is a
    lower bound on the phrase's count, so the weight it gives is an upper bound
    (:func:`bound_from_floors`).
    """
    least = [idf(total_rows, n) for n in common]
    slack = best / TERM_CEILING - sum(least)
    if not common or slack <= 0.0:
        return None
    floors = [holding(total_rows, w + slack / len(common)) for w in least]
    if any(f > n for f, n in zip(floors, common)):
        return None
    return floors


def bound_from_floors(floors: Sequence[int], total_rows: int) -> float:
    """What a row holding only phrases whose counts are at least ``floors`` scores below."""
    return sum(TERM_CEILING * idf(total_rows, n) for n in floors)
