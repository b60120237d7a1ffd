"""Episodes don't crowd out memories (issue 14 part 5), with the episode penalty on (decision 1).

The boundary is the newest episode's created_at (spec §5.9.1). Memories written
before it age; so do episodes written before it, by the end of their history
(else when archived). And an answer is never all episodes when a memory passed
the gate. Real SQLite files (and PostgreSQL where configured).
"""

from __future__ import annotations

import math

import pytest
from sqlalchemy import insert

from cpersona.services.recall.service import recall
from cpersona.storage.models import Episode, Memory

from conftest import make_app

pytestmark = pytest.mark.both_backends

BOUNDARY = "2026-06-01 12:00:00"  # the newest episode's created_at
TOP = 1 / 61


def add(db, table, *rows: dict) -> None:
    defaults = {"agent_id": "a"}
    if table is Memory:
        defaults["timestamp"] = "2026-06-02T00:00:00+00:00"
    with db.write() as session:
        session.execute(insert(table), [{**defaults, **row} for row in rows])


def filler(db, n: int) -> None:
    add(db, Memory, *({"content": f"filler note number {i}"} for i in range(n)))


@pytest.mark.parametrize(
    "end_time,created_at,factor",
    [
        ("2026-06-01T02:00:00+00:00", "2026-06-01 11:00:00", math.exp(-0.1)),  # ended 10 h before the boundary
        ("2026-05-20T12:00:00+00:00", "2026-06-01 11:00:00", 0.5),  # an old chapter: the floor
        (None, "2026-05-31 12:00:00", math.exp(-0.24)),  # no history: archived 24 h before
        (None, BOUNDARY, 1.0),  # it is the boundary
        ("2026-06-01T12:00:00+00:00", "2026-05-01 00:00:00", 1.0),  # history ends at the boundary
    ],
)
def test_episodes_older_than_the_boundary_age_like_memories(db, end_time, created_at, factor):
    filler(db, 100)
    add(
        db,
        Episode,
        {"summary": "alpha episode", "end_time": end_time, "created_at": created_at},
        {"summary": "unrelated boundary", "created_at": BOUNDARY},
    )
    (row,) = recall(make_app(db), agent_id="a", query="alpha", deep=True)["messages"]
    assert row["ref"] == "ep:1"
    assert row["match_reason"]["rrf"] == pytest.approx(TOP * factor)


def test_an_old_episode_no_longer_outranks_the_memory_written_since(db):
    filler(db, 100)
    add(db, Memory, {"content": "the alpha memory", "timestamp": "2026-06-02T00:00:00+00:00"})
    add(
        db,
        Episode,
        {"summary": "alpha alpha alpha", "end_time": "2026-05-01T00:00:00+00:00", "created_at": "2026-05-01 01:00:00"},
        {"summary": "boundary", "created_at": BOUNDARY},
    )
    response = recall(make_app(db), agent_id="a", query="alpha", deep=True)
    assert [m["ref"] for m in response["messages"]][-1] == "mem:101"  # the best row is the memory


def test_an_answer_is_never_all_episodes_when_a_memory_matched(db):
    filler(db, 100)
    # fresh episodes (at the boundary) and a memory a month older, so halved: every episode outranks it
    add(db, Episode, *({"summary": f"alpha alpha session {i}", "created_at": BOUNDARY} for i in range(6)))
    add(
        db,
        Memory,
        {
            "content": "alpha noted once, in a much longer memory row about other things",
            "timestamp": "2026-05-01T00:00:00+00:00",
        },
    )
    app = make_app(db)
    response = recall(app, agent_id="a", query="alpha", limit=3)
    refs = [m["ref"] for m in response["messages"]]
    assert len(refs) == 3 and "mem:101" in refs
    assert refs[0] == "mem:101"  # it takes the last seat (the lowest place), not a better one
    # with room for every row nothing is swapped: the memory is there on its own rank
    assert "mem:101" in [m["ref"] for m in recall(app, agent_id="a", query="alpha", limit=10)["messages"]]
    # no memory matched: the episodes keep every seat
    only_episodes = recall(app, agent_id="a", query="session", limit=3)
    assert [m["ref"][:3] for m in only_episodes["messages"]] == ["ep:"] * 3


def test_with_the_penalty_off_episodes_do_not_age(db):
    filler(db, 100)
    add(
        db,
        Episode,
        {"summary": "alpha episode", "end_time": "2026-05-20T12:00:00+00:00", "created_at": "2026-06-01 11:00:00"},
        {"summary": "boundary", "created_at": BOUNDARY},
    )
    (row,) = recall(make_app(db, EPISODE_PENALTY_ENABLED="false"), agent_id="a", query="alpha", deep=True)["messages"]
    assert row["match_reason"]["rrf"] == pytest.approx(TOP)


def test_episode_ranks_count_on_the_scale_of_the_memories(db):
    """Issue 14: the episode list ranks a table 26 times smaller than the memories'; its
    second place is a weaker match than the memory list's second place, so an answer
    holds the best episode, then memories, not every other row an episode. The
    stretched ranks order rows; the gate still judges the ranks the lists gave."""
    filler(db, 100)
    add(db, Memory, *({"content": f"the harbour ferry leaves at {h} o'clock"} for h in range(6)))
    add(db, Episode, *({"summary": f"we talked about the harbour, part {i}", "created_at": BOUNDARY} for i in range(4)))
    app = make_app(db)
    kinds = [m["ref"][:3] for m in reversed(recall(app, agent_id="a", query="harbour", limit=5)["messages"])]
    assert kinds == ["ep:", "mem", "mem", "mem", "mem"]  # best first: the top episode ties the top memory
    every = [m["ref"][:3] for m in reversed(recall(app, agent_id="a", query="harbour", limit=10)["messages"])]
    assert every == ["ep:"] + ["mem"] * 6 + ["ep:"] * 3  # no episode gated out, the weaker ones after the memories
