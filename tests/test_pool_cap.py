"""Recall counts its gate pool only up to POOL_SATURATION: past it no gate rule changes.

A count of the whole scope walked every row of it on every recall; the gate
only ever compares the pool with 50, 100 and the heuristic bar's 499-row floor
(spec GATE-2, ORD-3), so a capped count must give the same decisions.
"""

from __future__ import annotations

import itertools

import pytest

from cpersona.services.recall.gate import PROFILE_KEY, POOL_SATURATION, Candidate, apply_gate, heuristic_min_score
from cpersona.storage.engine import Database
from cpersona.storage.models import Episode, Memory
from cpersona.storage.scope import Scope
from cpersona.storage.search import open_search

pytestmark = pytest.mark.both_backends


def test_the_heuristic_bar_is_flat_from_the_saturation_point():  # spec GATE-2
    floor = heuristic_min_score(POOL_SATURATION)
    assert heuristic_min_score(POOL_SATURATION - 1) > floor
    assert all(heuristic_min_score(pool) == floor for pool in (POOL_SATURATION + 1, 10_000, 10**9))


@pytest.mark.parametrize("deep", [False, True])
@pytest.mark.parametrize("blank", [False, True])
def test_every_gate_decision_is_the_same_above_the_cap(deep: bool, blank: bool):
    values = (None, 0.05, 0.1, 0.15, 0.2, 0.25, 0.45)
    rows = [Candidate(PROFILE_KEY, profile_text="p")]
    for i, (rrf, cosine) in enumerate(itertools.product(values, values)):
        rows.append(Candidate(("mem", i), rrf=rrf, cosine=cosine, single_arm=bool(i % 2)))

    def kept(pool: int) -> list:
        return [row.key for row in apply_gate(rows, pool=pool, query_blank=blank, deep=deep, rrf_k=60)]

    at_cap = kept(POOL_SATURATION)
    assert at_cap != kept(40)  # the pool does matter below the cap
    assert all(kept(pool) == at_cap for pool in (POOL_SATURATION + 1, 5_000, 10**7))


def test_capped_pool_count_is_the_count_up_to_the_cap(db: Database):
    with db.write() as session:
        session.add_all(Memory(agent_id="a", content=f"m{i}", timestamp="2024-01-01T00:00:00Z") for i in range(7))
        session.add_all(Episode(agent_id="a", summary=f"e{i}") for i in range(3))
        session.add(Memory(agent_id="b", content="other agent", timestamp="2024-01-01T00:00:00Z"))
    search = open_search(db)
    scope = Scope(agent_id="a")
    assert search.pool_count(scope) == 10
    assert [search.pool_count(scope, cap=cap) for cap in (0, 1, 5, 7, 9, 10, 11, 499)] == [0, 1, 5, 7, 9, 10, 10, 10]
    assert search.pool_count(Scope(agent_id="b"), cap=499) == 1
