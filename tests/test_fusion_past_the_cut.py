"""Issue 14, fifth pass: how the vector lists fuse with the keyword lists under rrf.

Three rules (docs/behavior-contracts.md, differences table; docs/benchmarks.md,
"Issue 14, fifth pass"):

- rows past the cut: the near list is read half as far again as ``depth`` and
  each merged keyword list kept whole; a row there counts only where the other
  channel ranks it too (``fusion.confirmed``), and the gate judges the votes
  within ``depth`` (``Candidate.cut_rrf``);
- the vector lists' ranks are put on one scale per table, as the lexical lists'
  are (``fusion.on_one_scale``);
- a clear first place of the memories' keyword list takes the near list's
  first-place vote too (``fusion.defer_to_clear_first``).

Pure functions first, then recall over a real SQLite file (and PostgreSQL where
configured) with a real local HTTP embedding server serving chosen vectors.
"""

from __future__ import annotations

import math

import pytest
from sqlalchemy import insert

from cpersona.embedding.client import build_embedder
from cpersona.services.records.memories import store
from cpersona.services.recall.fusion import (
    Ranked,
    RankedList,
    confirmed,
    defer_to_clear_first,
    on_one_scale,
    past_the_cut,
    rrf,
    vector_votes,
    within_cut,
)
from cpersona.services.recall.gate import Candidate
from cpersona.services.recall.service import recall
from cpersona.storage.models import Memory

from conftest import make_app

pytestmark = pytest.mark.both_backends

K = 60
M = [("mem", i) for i in range(30)]
E = [("ep", i) for i in range(5)]


def listed(channel: str, keys, raws=None, weight: float = 1.0) -> RankedList:
    raws = raws or [None] * len(keys)
    return RankedList(channel, tuple(Ranked(k, r, raw) for r, (k, raw) in enumerate(zip(keys, raws))), weight)


# -- pure functions ------------------------------------------------------------------------


def test_the_near_list_is_read_half_as_far_again():
    assert [past_the_cut(d) for d in (1, 10, 20)] == [1, 15, 30]


def test_a_row_past_the_cut_counts_only_where_the_other_channel_ranks_it_within_the_cut():
    vector = RankedList("vector", tuple(Ranked(k, r, 0.9) for k, r in ((M[0], 0), (M[1], 1), (M[12], 12), (M[13], 13))))
    memories = RankedList("memories", tuple(Ranked(k, r) for k, r in ((M[2], 0), (M[12], 3), (M[14], 11))))
    kept = confirmed([vector, memories], 10)
    assert [e.key for e in kept[0].entries] == [M[0], M[1], M[12]]  # M13: past the cut, no keyword list has it
    assert [e.key for e in kept[1].entries] == [M[2], M[12]]  # M14: past the cut, the vector list lacks it
    assert [e.rank for e in kept[0].entries] == [0, 1, 12]  # a row kept votes at its own rank
    # within the cut nothing is touched, and without rows past it the lists are returned as they came
    # past the cut on both channels: neither list vouches for it within the cut, so it is dropped
    both_deep = confirmed([listed("vector", M[:12]), listed("memories", [*M[20:30], M[11]])], 10)
    assert M[11] not in {e.key for lst in both_deep for e in lst.entries}
    plain = [listed("vector", [M[0]]), listed("memories", [M[5]])]
    assert confirmed(plain, 10) is plain
    assert [[e.key for e in lst.entries] for lst in within_cut([vector, memories], 10)] == [[M[0], M[1]], [M[2], M[12]]]


def test_keyword_only_lists_are_never_cut_by_confirmation():
    memories = RankedList("memories", tuple(Ranked(M[i], i) for i in range(15)))
    assert confirmed([memories], 10) == [memories]  # no vector list: nothing to confirm against


def test_vector_ranks_count_within_their_own_table_the_smaller_one_stretched():
    vector = listed("vector", [E[0], M[0], E[1], M[1]], [0.9, 0.8, 0.7, 0.6])
    memories = listed("memories", [M[2]])
    scaled = on_one_scale([vector, memories], 400, 20)  # 20 times more memories than episodes
    assert [(e.key, e.rank) for e in scaled[0].entries] == [(E[0], 0), (M[0], 0), (E[1], 20.0), (M[1], 1)]
    assert scaled[1] is memories  # the larger table's lexical list is left alone
    votes = {row.key: row.score for row in rrf(scaled, K)}
    assert votes[E[1]] == pytest.approx(1 / (K + 21))  # the second episode votes as the 21st memory
    only_memories = [listed("vector", [M[0], M[1]]), memories]
    assert [e.rank for e in on_one_scale(only_memories, 400, 20)[0].entries] == [0, 1]


def test_agreement_with_the_keyword_top_is_judged_within_the_cut():
    memories = listed("memories", [M[0], M[1], M[2]], [1.0, 0.5, 0.4])  # a clear first place
    far_agreement = RankedList("vector", (Ranked(M[9], 0, 0.9), Ranked(M[0], 12, 0.5)))
    assert vector_votes([far_agreement, memories])[0].weight == 1.0  # without a cut: it agrees
    assert vector_votes([far_agreement, memories], 10)[0].weight == 0.0  # its agreeing row is past the cut


def test_a_clear_memories_first_place_takes_the_near_lists_first_vote():
    memories = listed("memories", [M[0], M[1], M[2]], [1.0, 0.75, 0.6])  # 0.75 < 0.9 × 1.0: clear
    vector = listed("vector", [M[1], M[3], M[0]], [0.9, 0.8, 0.7])
    assert [row.key for row in rrf([vector, memories], K)][0] == M[1]  # 1/61 + 1/62 beats 1/61 + 1/63
    deferred = defer_to_clear_first([vector, memories])
    assert [(e.key, e.rank) for e in deferred[0].entries] == [(M[0], 0), (M[1], 0), (M[3], 1)]
    fused = rrf(deferred, K)
    assert fused[0].key == M[0] and fused[0].score == pytest.approx(2 / 61)
    # not clear, a silenced vector list, or a clear first place of the episodes: nothing moves
    unclear = listed("memories", [M[0], M[1]], [1.0, 0.95])
    assert defer_to_clear_first([vector, unclear])[0] is vector
    silenced = RankedList("vector", vector.entries, 0.0)
    assert defer_to_clear_first([silenced, memories])[0] is silenced
    episodes = listed("episodes", [E[0], E[1]], [1.0, 0.5])
    assert defer_to_clear_first([vector, episodes])[0] is vector


def test_a_reply_and_its_question_on_one_score_hold_the_clear_first_place_together():
    # replies.with_replies seats a question's reply just ahead of it with the question's score:
    # the pair is one first place, clear when the next row scores below 0.9 x it (issue 14)
    memories = listed("memories", [M[0], M[1], M[2], M[3]], [1.0, 1.0, 0.6, 0.5])
    vector = listed("vector", [M[2], M[4], M[1], M[0]], [0.9, 0.8, 0.7, 0.6])
    assert [row.key for row in rrf([vector, memories], K)][:3] == [M[2], M[0], M[1]]  # the vector votes lead
    deferred = defer_to_clear_first([vector, memories])
    assert [(e.key, e.rank) for e in deferred[0].entries[:3]] == [(M[0], 0), (M[1], 1), (M[2], 0)]
    fused = rrf(deferred, K)
    assert fused[0].key == M[0] and fused[0].score == pytest.approx(2 / 61)  # the reply first, on both votes
    assert {row.key for row in fused[:3]} == {M[0], M[1], M[2]}  # the question stays above the rows of one channel
    # a vector list holding neither row of the pair sits out, as against a single clear first place
    disagreeing = listed("vector", [M[5], M[6]], [0.9, 0.8])
    assert vector_votes([disagreeing, memories])[0].weight == 0.0
    # not clear of the next row, or three rows on one score (a tie): nothing moves
    close = listed("memories", [M[0], M[1], M[2]], [1.0, 1.0, 0.95])
    assert defer_to_clear_first([vector, close])[0] is vector
    tie = listed("memories", [M[0], M[1], M[2], M[3]], [1.0, 1.0, 1.0, 0.5])
    assert defer_to_clear_first([vector, tie])[0] is vector
    assert vector_votes([disagreeing, tie])[0].weight == 1.0


def test_the_gate_signal_is_the_score_within_the_cut():
    row = Candidate(M[0], rrf=0.03, cut_rrf=0.016)
    assert row.signal == ("rrf", 0.016)
    row.scale(0.5)  # the episode penalty scales what the gate judges too
    assert row.signal == ("rrf", pytest.approx(0.008)) and row.rrf == pytest.approx(0.015)
    assert Candidate(M[0], rrf=0.03).signal == ("rrf", 0.03)
    assert Candidate(M[0], rrf=0.03, cosine=0.7, cut_rrf=0.01).signal == ("cosine", 0.7)


# -- recall, over a real embedder ------------------------------------------------------------

QUERY = "harbour ferry"
STRONG = "harbour ferry harbour ferry timetable"  # first on both keyword indexes: a clear first place
KEYWORD = [
    f"harbour ferry notes for pier {n}" for n in ("north", "south", "east", "west", "old", "new", "main", "inner")
]
WEAK = "the harbour wall was repainted last spring in a pale blue colour, by the town council's crew"
VECTOR_ONLY = [f"unrelated line number {n} about quarterly figures" for n in range(10)]


def _toward(axis: int, spread: float, dimension: int) -> list[float]:
    """Axis 0 tilted towards ``axis``: cosine with axis 0 is 1/sqrt(1 + spread²)."""
    values = [1.0 if j == 0 else spread if j == axis else 0.0 for j in range(dimension)]
    norm = math.sqrt(sum(v * v for v in values))
    return [v / norm for v in values]


def _answer(db, embed_server, vector, limit: int = 10) -> list[dict]:
    """Recall's answer, best first, over the rows above and 100 unembedded fillers.

    The fillers make a pool past 100 rows, where the gate's bar admits a keyword
    list's tenth row (spec GATE-2); on a 20-row pool only a first place passes.
    """
    with db.write() as session:
        session.execute(
            insert(Memory),
            [
                {"agent_id": "a", "content": f"filler note number {i}", "timestamp": "2026-06-01T00:00:00+00:00"}
                for i in range(100)
            ],
        )
    embed_server.vector = vector
    app = make_app(db, EMBEDDING_MODE="http", EMBEDDING_URL=embed_server.url, DEGRADED_ADVISORY="false")
    app.embedder = build_embedder(app.settings)
    try:
        for text in [STRONG, *KEYWORD, WEAK, *VECTOR_ONLY]:
            assert store(app, agent_id="a", content=text, timestamp="2026-06-02T00:00:00+00:00")["embedded"] is True
        return list(reversed(recall(app, agent_id="a", query=QUERY, limit=limit)["messages"]))  # best first
    finally:
        app.embedder.close()


def test_a_row_both_channels_rank_just_past_the_cut_enters_the_answer(db, embed_server):
    """The keyword list's tenth row (WEAK) is the near list's twelfth. Each list alone puts
    ten rows above it, so with lists cut at ten it lost its seat to a vector-only row; two
    retrievers placing it just past the cut outvote one placing a row first."""
    dimension = embed_server.dimension

    def vector(text: str) -> list[float]:
        if text == QUERY:
            return _toward(1, 0.0, dimension)
        if text == STRONG:
            return _toward(1, 0.05, dimension)  # the near list's first: it agrees with the keyword top
        if text in VECTOR_ONLY:
            return _toward(2 + VECTOR_ONLY.index(text), 0.1 + 0.04 * VECTOR_ONLY.index(text), dimension)
        if text == WEAK:
            return _toward(20, 0.6, dimension)  # cosine 0.86: rank 11, below the ten vector-only rows
        return _toward(30 + KEYWORD.index(text), 50.0, dimension)  # cosine 0.02: below the arm's cut

    answer = _answer(db, embed_server, vector)
    keyword_only = [m["content"] for m in reversed(recall(make_app(db), agent_id="a", query=QUERY)["messages"])]
    assert keyword_only[0] == STRONG and keyword_only[-1] == WEAK  # the keyword list's tenth row
    contents = [m["content"] for m in answer]
    assert contents[0] == STRONG
    assert WEAK in contents, contents  # with lists cut at ten, the embedder cost this answer
    weak = answer[contents.index(WEAK)]["match_reason"]
    assert weak["rrf"] == pytest.approx(1 / (K + 10) + 1 / (K + 12))  # keyword rank 9, near rank 11
    assert weak["signal"] == "rrf" and weak["score"] == pytest.approx(1 / (K + 10))  # the gate: within the cut
    assert "cosine" not in weak  # a row past the cut is not judged on its cosine


def test_a_clear_keyword_first_place_stays_first_when_the_vector_list_prefers_another(db, embed_server):
    """STRONG is first on both keyword indexes; the near list ranks a keyword row (KEYWORD[0],
    the keyword list's second) first and STRONG sixth. Summed at face value the second row
    goes first (1/62 + 1/61 > 1/61 + 1/66); the near list's first-place vote goes to STRONG too."""
    dimension = embed_server.dimension
    near = [KEYWORD[0], *VECTOR_ONLY[:4], STRONG]

    def vector(text: str) -> list[float]:
        if text == QUERY:
            return _toward(1, 0.0, dimension)
        if text in near:
            return _toward(2 + near.index(text), 0.05 + 0.05 * near.index(text), dimension)
        return _toward(40 + ([*KEYWORD, WEAK, *VECTOR_ONLY].index(text)), 50.0, dimension)

    answer = _answer(db, embed_server, vector)
    keyword_only = [m["content"] for m in reversed(recall(make_app(db), agent_id="a", query=QUERY)["messages"])]
    assert keyword_only[0] == STRONG
    contents = [m["content"] for m in answer]
    assert contents[0] == STRONG, contents
    assert contents[1] == KEYWORD[0], contents
    assert answer[0]["match_reason"]["rrf"] == pytest.approx(2 / 61)
    assert answer[0]["match_reason"]["signal"] == "cosine"  # the gate judges it as before: on its cosine
