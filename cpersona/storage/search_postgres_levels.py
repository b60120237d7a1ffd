"""Exact shortcuts for the PostgreSQL trigram arms: fewer candidate rows, the same ranked rows.

A trigram arm (:func:`~cpersona.storage.search_postgres.tiered_statement`)
scores a row as ``matched + word_similarity(q, text)``: the number of the
query's terms the row holds, then (below 1) how well the whole query matches
it. The best ``depth`` rows are those of the highest counts, down to the
``depth``-th best count (the cut), ordered by score then id. Its cost is
per candidate: every row holding any term is fetched from the heap,
rechecked, lowered and counted (~20 µs at 100k rows), and every row of the
cut tier gets ``word_similarity`` (~30–70 µs). A question whose common term
("Nate": 18,292 of 100k rows) sits beside a rarer one paid for every row of
the common term, although none of them can reach a cut of two.

Two shortcuts, each checked on its own answer and dropped for the full
statement when the check fails, so the ranked rows never change:

- **Levels** (:func:`plan`). A row holding at least ``k`` of ``n`` terms holds
  at least one of any ``n - k + 1`` of them (it misses at most ``n - k``), so
  the rows of the ``n - k + 1`` rarest terms (by the planner's estimates), or
  for ``k = n`` the rows holding every term (one BitmapAnd of the GIN
  lookups), include every row with ``k`` or more. Counted over all ``n``
  terms, if their cut is at least ``k`` then at least ``depth`` rows hold
  ``cut`` or more terms, all of them among the candidates: the whole
  statement's cut, tier and scores are the same.
- **Walk** (:data:`WALK_EXAMINED`). With one term every candidate's count is 1,
  so no score passes ``1 + 1``, reached exactly where ``word_similarity`` is 1
  (the row holds the term as a whole word, or the query's every trigram in
  one stretch). Ties go by id, lowest first; so the first ``depth`` such rows
  in id order are the answer, and reading ids from the lowest finds them
  without scoring the rest ("thanks", ~20,000 of 100k rows hold it). The
  walk reads a bounded prefix of the table; when it finds fewer than
  ``depth`` such rows the full statement runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# How many rows (in id order, any scope) the single-term walk reads before it
# gives up for the full statement: a failed walk costs at most this many
# ILIKE tests (~1-2 µs each) plus word_similarity on those that match.
WALK_EXAMINED = 2_000


# Two terms and fewer than ``depth`` rows holding both: the rest of
# the answer is the rows one term short with the best ``word_similarity``, and
# the full statement scores every row holding a term (~50 µs each: "make
# parks", 6,491 rows, 418 ms at 54k rows). The rows whose similarity reaches a
# floor are found first, through the GIN index (pg_trgm's ``%>``, which needs
# that share of the question's trigrams in the row); when they fill the answer,
# no row below the floor can enter it. Tried high to low, then the full
# statement. (At 54k rows, psql: "transformative one" 5.6 ms at 0.7, "friends
# local" 43 ms at 0.7, "make parks" 26 ms at 0.7 (too few) + 85 ms at 0.6, where
# the full statements took 311-630, 104-134 and 370-568 ms.)
SIMILARITY_FLOORS = (0.7, 0.6)
# A floor's ``%>`` lookup is lossy: its recheck computes ``word_similarity`` for
# every row holding the floor's share of the question's trigrams, which can cost
# more than the full statement (a question of many function words, shared
# stems). So a floor is tried only where the planner reckons the full statement
# reads this many rows or more, and where the terms' trigrams can make up the
# lowest floor's share of the question's. (58 calls of the bench mix at 54k
# rows: 3 pass the gate, 925 -> 340 ms over them; ungated, 18 did, no net gain.)
FLOOR_MIN_ROWS = 2_000
_WORD = re.compile(r"[^\W_]+")


def floor_worth_trying(terms: list[str], counts: dict[str, int], query: str) -> bool:
    """Whether :data:`SIMILARITY_FLOORS` may save work for these terms (it never changes the rows).

    A word of ``n`` letters has about ``n + 1`` trigrams (pg_trgm pads it);
    ``counts`` are the planner's estimates ({} under the keyword budget: no floor).
    """
    if not SIMILARITY_FLOORS or sum(counts.get(t, 0) for t in terms) < FLOOR_MIN_ROWS:
        return False
    held = sum(len(w) + 1 for t in terms for w in _WORD.findall(t))
    every = sum(len(w) + 1 for w in _WORD.findall(query))
    return every > 0 and held >= min(SIMILARITY_FLOORS) * every


@dataclass(frozen=True)
class Level:
    """Candidates for rows holding at least ``needed`` of the terms."""

    needed: int
    every: bool  # True: candidates hold every term (needed == len(terms)); else one of ``any_of``
    any_of: tuple[str, ...] = ()


# A term is left out of a level's candidates when the planner reckons it holds
# more than this many times the rows of the query's rarest term. The estimates
# are coarse (a statistics sample reads a rare term as ~10 rows and a common
# one in steps of ~1 % of the table), so only a wide gap is trusted; a wrong
# guess costs the narrow statement, and its cut then names an exact level.
COMMON_FACTOR = 4


def plan(terms: list[str], counts: dict[str, int], depth: int) -> Level | None:
    """The shortcut level to try first for these terms, or None (the full statement only).

    Two terms: rows holding both (the BitmapAnd of their GIN lookups reads no
    row that misses one). More, with the planner's estimates (``counts``):
    the terms holding over :data:`COMMON_FACTOR` times the rarest term's rows
    are left out of the candidates, and the level is one more than the number
    left out (when it fails, its cut names the level to retry at). The
    estimates only choose the level; the check decides. Without estimates (a
    table under the keyword budget skips the EXPLAIN), or when no term stands
    out, None.
    """
    n = len(terms)
    if n < 2 or depth <= 0:
        return None
    if n == 2:
        return Level(2, True)
    if not counts:
        return None
    held = {t: max(counts.get(t, 0), 0) for t in terms}
    rarest = max(min(held.values()), 1)
    left_out = sum(1 for t in terms if held[t] > COMMON_FACTOR * rarest)
    if left_out == 0:
        return None
    return lower(terms, counts, min(left_out, n - 1) + 1)


def lower(terms: list[str], counts: dict[str, int], needed: int) -> Level:
    """Candidates for rows holding ``needed`` or more terms: those of the ``n - needed + 1`` rarest."""
    rare = sorted(terms, key=lambda t: max(counts.get(t, 0), 0))[: len(terms) - needed + 1]
    return Level(needed, False, tuple(rare))


_PIECE = re.compile(r"[^\W_]{3,}")


def pieces(terms: list[str]) -> dict[str, list[str]]:
    """{term: its letter-and-digit runs of 3 or more} for each term holding other characters.

    pg_trgm looks a pattern up by the trigrams of its words, so the GIN
    lookup of ``John's`` returns every row holding ``john`` (at 100k rows of
    the bench: 16,996 rechecked for none holding ``john's``), whatever the
    planner estimates for the whole pattern.
    """
    found = {}
    for term in terms:
        if not term.isalnum():
            runs = _PIECE.findall(term)
            if runs:
                found[term] = runs
    return found


def lookup_costs(counts: dict[str, int], pieces: dict[str, list[str]]) -> dict[str, int]:
    """``counts`` with each punctuated term's estimate raised to what its lookup reads: the
    rarest of its pieces (the lookup needs every piece's trigrams), when that is more."""
    costs = dict(counts)
    for term, runs in pieces.items():
        known = [counts[r] for r in runs if r in counts]
        if term in costs and known:
            costs[term] = max(costs[term], min(known))
    return costs
