"""Fusion (rrf / rsf / cascade), the quality gate and autocut: pure functions."""

from __future__ import annotations

import math

import pytest

from cpersona.services.recall.fusion import Ranked, RankedList, cascade, min_max, rrf, rsf
from cpersona.services.recall.gate import (
    PROFILE_KEY,
    CalibratedGate,
    Candidate,
    apply_gate,
    autocut,
    calibrated_gate_for,
    heuristic_min_score,
)

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

M1, M2, M3, E1 = ("mem", 1), ("mem", 2), ("mem", 3), ("ep", 1)
K = 60


def scores(fused) -> dict:
    return {row.key: row.score for row in fused}


# -- rrf ----------------------------------------------------------------------------------


def test_rrf_vote_is_one_over_k_plus_rank_plus_one():  # spec §5.8.2
    fused = rrf([RankedList.of("memories", [(M1, None), (M2, None), (M3, None)])], K)
    assert [row.key for row in fused] == [M1, M2, M3]
    assert scores(fused) == {M1: 1 / 61, M2: 1 / 62, M3: 1 / 63}


def test_rrf_uses_the_configured_k():
    fused = rrf([RankedList.of("memories", [(M1, None)])], 5)
    assert fused[0].score == 1 / 6


def test_rrf_sums_votes_across_lists_and_ties_keep_list_order():  # spec §5.8.2
    episodes = RankedList.of("episodes", [(E1, None)])
    memories = RankedList.of("memories", [(M1, None), (M2, None)])
    vector = RankedList.of("vector", [(M2, 0.9)])
    fused = rrf([vector, episodes, memories], K)
    assert [row.key for row in fused] == [M2, E1, M1]  # E1 and M1 tie at 1/61: E1 was seen first
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 62)
    assert fused[0].ranks == {"vector": 0, "memories": 1}


def test_rrf_tie_goes_to_the_row_with_more_lexical_votes():  # issue 14: differences table
    vector = RankedList.of("vector", [(M1, 0.9), (M3, 0.8)])
    memories = RankedList.of("memories", [(M2, None), (M3, None)])
    fused = rrf([vector, memories], K)
    # M1 (vector rank 0) and M2 (memories rank 0) tie at 1/61; M1 was seen first, M2 wins.
    assert [row.key for row in fused] == [M3, M2, M1]
    assert fused[1].score == fused[2].score
    # on both lists: equal sums, the better lexical rank first
    swapped = rrf(
        [RankedList.of("vector", [(M1, 0.9), (M2, 0.8)]), RankedList.of("memories", [(M2, None), (M1, None)])], K
    )
    assert [row.key for row in swapped] == [M2, M1]


def test_rrf_three_first_places_is_the_ceiling():
    lists = [RankedList.of(name, [(M1, None)]) for name in ("vector", "episodes", "memories")]
    assert rrf(lists, K)[0].score == pytest.approx(3 / 61)


def test_an_excluded_row_leaves_a_gap_not_a_renumbering():  # spec §5.7.5
    # rank 0 was excluded: the next row keeps rank 1 and its 1/62 vote
    lst = RankedList("memories", (Ranked(M2, 1), Ranked(M3, 2)))
    assert scores(rrf([lst], K)) == {M2: 1 / 62, M3: 1 / 63}


def test_rrf_list_weight_scales_its_votes():
    far = RankedList.of("far", [(M1, 0.5)], weight=0.5)
    assert rrf([far], K)[0].score == 0.5 / 61


# -- rsf ----------------------------------------------------------------------------------


def test_min_max_rules():  # spec §5.8.3
    assert min_max([None, None]) == [1.0, 1.0]
    assert min_max([3.0]) == [1.0]
    assert min_max([2.0, 2.0]) == [1.0, 1.0]
    assert min_max([4.0, 2.0, 3.0]) == [1.0, 0.0, 0.5]
    assert min_max([4.0, None, 2.0]) == [1.0, 0.0, 0.0]


def test_rsf_normalises_per_channel_and_divides_by_channels_in_use():  # spec §5.8.3
    memories = RankedList.of("memories", [(M1, 9.0), (M2, 5.0), (M3, 1.0)])
    episodes = RankedList.of("episodes", [(E1, 0.2)])
    empty = RankedList.of("vector", [])
    fused = rsf([empty, episodes, memories])
    assert scores(fused) == {E1: 0.5, M1: 0.5, M2: 0.25, M3: 0.0}
    assert [row.key for row in fused] == [E1, M1, M2, M3]  # E1 first seen on the tie


def test_rsf_weakest_row_of_a_channel_is_pinned_to_zero_and_a_lone_row_to_one():
    assert scores(rsf([RankedList.of("memories", [(M1, 0.3), (M2, 0.29)])])) == {M1: 1.0, M2: 0.0}
    assert scores(rsf([RankedList.of("memories", [(M1, 0.01)])])) == {M1: 1.0}


def test_rsf_unscored_channel_gives_every_row_one():  # LIKE rows carry no bm25
    assert scores(rsf([RankedList.of("memories", [(M1, None), (M2, None)])])) == {M1: 1.0, M2: 1.0}


# -- cascade ------------------------------------------------------------------------------


def test_cascade_fills_vector_then_episodes_then_profile_then_memories():  # spec §5.8.4
    order = cascade([M2], [E1], [M1, M2, M3], limit=3, profile=PROFILE_KEY)
    assert order == [M2, E1, PROFILE_KEY, M1]  # memory stage gets 3 - 2 places; M2 not repeated


def test_cascade_blank_query_shape():  # spec RC-3: profile ahead of the recency rows
    order = cascade([], [], [M3, M2, M1], limit=3, profile=PROFILE_KEY)
    assert order == [PROFILE_KEY, M3, M2, M1]
    assert cascade([], [], [M3, M2], limit=0) == []


# -- the gate -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pool,expected",
    [(0, 0.5), (-3, 0.5), (1, 0.4665), (7, 0.3996), (60, 0.3016), (80, 0.2879), (81, 0.2873), (499, 0.2), (10**6, 0.2)],
)
def test_heuristic_min_score_values(pool, expected):  # spec GATE-2
    assert heuristic_min_score(pool) == expected


def lexical(key, rank, *, single_arm=True):
    return Candidate(key, rrf=1 / (K + rank + 1), single_arm=single_arm)


def gate(rows, pool, **kw):
    return apply_gate(rows, pool=pool, query_blank=kw.pop("blank", False), deep=kw.pop("deep", False), rrf_k=K, **kw)


def test_small_pool_keyword_only_passes_each_lists_first_row():  # spec GATE-7, §6 item 5
    rows = [lexical(M1, 0), lexical(M2, 1), lexical(M3, 2)]
    assert [r.key for r in gate(rows, pool=30)] == [M1]


def test_pool_of_100_passes_ranks_0_to_12():  # spec GATE-7
    rows = [lexical(("mem", r), r) for r in range(20)]
    assert [r.key[1] for r in gate(rows, pool=100)] == list(range(13))


def test_deep_halves_the_bar():  # spec GATE-4, RC-10
    rows = [lexical(("mem", r), r) for r in range(100)]
    bar = heuristic_min_score(100) * 0.5 * 3 / 61
    expected = [r for r in range(100) if 1 / (61 + r) >= bar]
    assert [r.key[1] for r in gate(rows, pool=100, deep=True)] == expected
    assert len(expected) > 13


def test_multi_arm_rrf_row_is_not_relaxed():
    strict = Candidate(M1, rrf=1 / 61, single_arm=False)
    assert gate([strict], pool=5) == []  # 1/61 < min_score(5) * 3/61
    assert gate([lexical(M1, 0)], pool=5) != []


def test_other_signals_use_min_score_directly():  # spec GATE-5
    rows = [Candidate(M1, cosine=0.41, rrf=0.03), Candidate(M2, cosine=0.39, rrf=0.04), Candidate(M3, rsf=0.5)]
    kept = gate(rows, pool=60)  # min_score 0.3016
    assert [r.key for r in kept] == [M1, M2, M3]
    assert [r.key for r in gate(rows, pool=7)] == [M1, M3]  # min_score 0.3996


def test_profile_rides_only_with_a_pool_of_50():  # spec GATE-5, ORD-3
    profile = Candidate(PROFILE_KEY, profile_text="p")
    assert gate([profile], pool=49) == []
    assert gate([profile], pool=50) == [profile]


def test_unscored_rows_pass_on_blank_query_or_pool_of_100():  # spec GATE-5
    row = Candidate(M1)
    assert gate([row], pool=99) == []
    assert gate([row], pool=100) == [row]
    assert gate([row], pool=1, blank=True) == [row]


def test_calibrated_gate_applies_only_to_its_own_signal():  # spec GATE-3
    rrf_row = lexical(M1, 0)
    cos_row = Candidate(M2, cosine=0.35)
    calibrated = CalibratedGate(0.5, "cosine")
    kept = gate([rrf_row, cos_row], pool=1000, calibrated=calibrated)
    assert kept == [rrf_row]  # cosine judged on 0.5; the rrf row on the heuristic
    halved = gate([cos_row], pool=1000, calibrated=CalibratedGate(0.6, "cosine"), deep=True)
    assert halved == [cos_row]


def test_calibrated_gate_lookup_prefers_the_agent_then_global(app):
    from cpersona.services.calibration.sidecar import SidecarValues
    from cpersona.services.calibration.state import CalibrationState

    assert calibrated_gate_for(app, "a", enabled=True) is None  # nothing calibrated: the heuristic
    app.calibration = CalibrationState()
    app.calibration.restore(
        SidecarValues(fused_gate_signal="rsf", global_fused_gate=0.2, agent_fused_gates={"a": 0.4}), measured=True
    )
    assert calibrated_gate_for(app, "a", enabled=True) == CalibratedGate(0.4, "rsf")
    assert calibrated_gate_for(app, "b", enabled=True) == CalibratedGate(0.2, "rsf")
    assert calibrated_gate_for(app, "a", enabled=False) is None  # spec GATE-8


def test_gate_keeps_order():  # spec GATE-6
    rows = [Candidate(("mem", i), cosine=c) for i, c in enumerate([0.9, 0.1, 0.8, 0.7])]
    assert [r.key[1] for r in gate(rows, pool=1000)] == [0, 2, 3]


# -- autocut ------------------------------------------------------------------------------


def test_autocut_cuts_after_the_largest_cosine_gap():  # spec §5.12 reference example
    profile = Candidate(PROFILE_KEY, profile_text="p")
    rows = [Candidate(("mem", i), cosine=c) for i, c in enumerate([0.7087, 0.507, 0.474, 0.474, 0.474, 0.421])]
    kept = autocut([*rows[:3], profile, *rows[3:]], min_results=3, min_gap_ratio=0.15)
    assert [r.key for r in kept] == [("mem", 0), PROFILE_KEY]


def test_autocut_never_cuts_fusion_scores():  # spec §5.12 step 3
    rows = [Candidate(("mem", i), rrf=s, cosine=0.9) for i, s in enumerate([0.049, 0.01, 0.009])]
    assert autocut(rows, min_results=3, min_gap_ratio=0.15) == rows


def test_autocut_leaves_short_or_flat_lists():
    rows = [Candidate(("mem", i), cosine=c) for i, c in enumerate([0.9, 0.2])]
    assert autocut(rows, min_results=3, min_gap_ratio=0.15) == rows
    flat = [Candidate(("mem", i), cosine=c) for i, c in enumerate([0.5, 0.48, 0.46])]
    assert autocut(flat, min_results=3, min_gap_ratio=0.15) == flat
    mixed = [Candidate(M1, cosine=0.9), Candidate(M2), Candidate(M3, cosine=0.1)]
    assert autocut(mixed, min_results=3, min_gap_ratio=0.15) == mixed


def test_episode_penalty_scaling_touches_every_score():
    row = Candidate(M1, rrf=0.02, cosine=0.6)
    row.scale(0.5)
    assert (row.rrf, row.cosine, row.rsf) == (0.01, 0.3, None)
    assert math.isclose(row.signal[1], 0.3)
