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
