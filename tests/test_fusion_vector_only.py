"""Issue 14, sixth pass: rows only the vector channel found take at most a fifth of an rrf answer.

``fusion.seat_vector_only`` keeps the vector votes of the best
``fusion.vector_only_seats(limit)`` rows that no keyword list holds; the others
stay in the answer after every voted row (a list of weight 0), so keyword
rows take the seats they used to lose and no row is lost
(docs/behavior-contracts.md, differences table; docs/benchmarks.md, "Issue 14,
sixth pass").

Pure functions first, then recall over a real SQLite file (and PostgreSQL where
configured) with a real local HTTP embedding server serving chosen vectors.
"""

from __future__ import annotations

import math

import pytest
from sqlalchemy import insert

from cpersona.embedding.client import build_embedder
from cpersona.services.records.memories import store
from cpersona.services.recall.fusion import Ranked, RankedList, rrf, seat_vector_only, vector_only_seats
from cpersona.services.recall.service import recall
from cpersona.storage.models import Memory

from conftest import make_app

pytestmark = pytest.mark.both_backends

K = 60
M = [("mem", i) for i in range(40)]
E = [("ep", i) for i in range(5)]


def listed(channel: str, keys, weight: float = 1.0) -> RankedList:
    return RankedList(channel, tuple(Ranked(k, r, 0.5) for r, k in enumerate(keys)), weight)


# -- pure functions ------------------------------------------------------------------------


def test_a_fifth_of_the_answer_at_least_one_seat():
    assert [vector_only_seats(n) for n in (1, 3, 5, 9, 10, 14, 15, 50)] == [1, 1, 1, 1, 2, 2, 3, 10]


def test_only_the_best_vector_only_rows_keep_their_votes():
    # near list: a keyword row first, then five rows no keyword list holds
    vector = listed("vector", [M[0], M[20], M[21], M[22], M[23], M[24]])
    memories = listed("memories", [M[0], *M[1:10]])
    fused = [row.key for row in rrf(seat_vector_only([vector, memories], 2, K), K)]
    assert fused[0] == M[0]
    assert fused[:12] == [M[0], M[1], M[20], M[2], M[21], *M[3:10]]  # two vector-only rows, every keyword row
    assert fused[12:] == [M[22], M[23], M[24]]  # the others are kept, after every voted row, in near order
    before = [row.key for row in rrf([vector, memories], K)][:10]
    assert {M[22], M[23]} <= set(before)  # without the rule they took keyword rows' seats
    scores = {row.key: row.score for row in rrf(seat_vector_only([vector, memories], 2, K), K)}
    assert scores[M[22]] == 0.0 and scores[M[20]] == pytest.approx(1 / (K + 2))


def test_rows_on_both_channels_and_a_silenced_list_are_not_touched():
    vector = listed("vector", [M[20], M[21], M[22], M[3], M[4]])
    memories = listed("memories", [M[0], M[1], M[2], M[3], M[4]])
    kept = seat_vector_only([vector, memories], 1, K)
    assert [e.key for e in kept[0].entries] == [M[20], M[3], M[4]]  # M3, M4: the keyword list holds them
    assert [e.rank for e in kept[0].entries] == [0, 3, 4]  # they vote at their own ranks
    assert kept[-1].weight == 0.0 and [e.key for e in kept[-1].entries] == [M[21], M[22]]
    silenced = listed("vector", [M[20], M[21], M[22]], weight=0.0)
    assert seat_vector_only([silenced, memories], 1, K) == [silenced, memories]
    few = [listed("vector", [M[20], M[3]]), memories]
    assert seat_vector_only(few, 1, K) is few  # one vector-only row, one seat: nothing to set aside
    alone = [listed("vector", M[20:30]), listed("memories", [])]
    assert seat_vector_only(alone, 1, K) is alone  # no keyword row: the vector channel is the only evidence


def test_an_episode_the_keyword_lists_hold_is_not_vector_only():
    vector = listed("vector", [E[0], M[20], M[21]])
    episodes = listed("episodes", [E[0]])
    memories = listed("memories", [M[0]])
    kept = seat_vector_only([vector, episodes, memories], 1, K)
    assert [e.key for e in kept[0].entries] == [E[0], M[20]]
    assert [e.key for e in kept[-1].entries] == [M[21]]


# -- recall, over a real embedder ------------------------------------------------------------

QUERY = "harbour ferry"
STRONG = "harbour ferry harbour ferry timetable"  # first on both keyword indexes: a clear first place
KEYWORD = [f"harbour ferry notes for pier {n}" for n in ("north", "south", "east", "west", "old", "new", "main")]
VECTOR_ONLY = [f"unrelated line number {n} about quarterly figures" for n in range(8)]


def _toward(axis: int, spread: float, dimension: int) -> list[float]:
    """Axis 0 tilted towards ``axis``: cosine with axis 0 is 1/sqrt(1 + spread²)."""
    values = [1.0 if j == 0 else spread if j == axis else 0.0 for j in range(dimension)]
    norm = math.sqrt(sum(v * v for v in values))
    return [v / norm for v in values]


def _answers(db, embed_server, limits) -> list[list[str]]:
    """Recall's answers (contents, best first) for each limit, over the rows above and 100 unembedded fillers."""
    with db.write() as session:
        session.execute(
            insert(Memory),
            [
                {"agent_id": "a", "content": f"filler note number {i}", "timestamp": "2026-06-01T00:00:00+00:00"}
                for i in range(100)
            ],
        )
    dimension = embed_server.dimension

    def vector(text: str) -> list[float]:
        if text == QUERY:
            return _toward(1, 0.0, dimension)
        if text == STRONG:
            return _toward(1, 0.05, dimension)  # the near list's first: it agrees with the keyword top
        if text in VECTOR_ONLY:
            return _toward(2 + VECTOR_ONLY.index(text), 0.1 + 0.04 * VECTOR_ONLY.index(text), dimension)
        return _toward(30 + KEYWORD.index(text), 50.0, dimension)  # cosine 0.02: below the arm's cut

    embed_server.vector = vector
    app = make_app(db, EMBEDDING_MODE="http", EMBEDDING_URL=embed_server.url, DEGRADED_ADVISORY="false")
    app.embedder = build_embedder(app.settings)
    try:
        for text in [STRONG, *KEYWORD, *VECTOR_ONLY]:
            assert store(app, agent_id="a", content=text, timestamp="2026-06-02T00:00:00+00:00")["embedded"] is True
        return [
            [m["content"] for m in reversed(recall(app, agent_id="a", query=QUERY, limit=n)["messages"])]
            for n in limits
        ]
    finally:
        app.embedder.close()


def test_vector_only_rows_take_at_most_a_fifth_of_the_answer(db, embed_server):
    """Eight keyword rows and eight rows only the near list holds (ranked 2nd to 9th by it).
    At K = 60 the vector-only row at near rank r tied the keyword row at rank r, so a ten-row
    answer held four of them and lost keyword rows 6-7; now two seats of ten, one of five."""
    ten, five = _answers(db, embed_server, (10, 5))
    assert ten[0] == STRONG, ten
    assert [c for c in ten if c in VECTOR_ONLY] == VECTOR_ONLY[:2], ten  # the near list's best two
    assert set(KEYWORD) <= set(ten), ten  # every keyword row keeps its seat
    assert five[0] == STRONG and [c for c in five if c in VECTOR_ONLY] == VECTOR_ONLY[:1], five
