"""reconstruct with a time cue: the period search, the lift, the seats and the notice (spec §9, TQ-4 … TQ-7).

Fixture rows carry explicit timestamps and distinct sources, so no two bundle
by adjacency (spec §12 point 5). The expected orders and counts of the lift
were measured on the reference with the same rows.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from cpersona.services.records.memories import store
from cpersona.services.reconstruct import reconstruct
from cpersona.services.recall.cue_arm import lift

pytestmark = pytest.mark.both_backends

A = "agent"
WORDS = "split cake pudding chips muffin pancake waffle cream shake jam toast loaf cookie fritter salad".split()


def _put(app, content, stamp, source_id, agent=A):
    out = store(
        app, content=content, agent_id=agent, timestamp=stamp, source={"type": "User", "id": source_id, "name": ""}
    )
    assert out.get("ok", True) is not False, out
    return f"mem:{out['id']}"


@pytest.fixture
def pantry(app):
    """Six spring notes and fifteen June banana notes (ids 1 … 21, June 1st … 15th are ids 7 … 21)."""
    refs = {}
    for stamp, text, src in [
        ("2026-03-01T10:00:00+00:00", "apple pie recipe from grandma", "a1"),
        ("2026-03-10T10:00:00+00:00", "banana bread baking notes", "b1"),
        ("2026-04-01T10:00:00+00:00", "cherry tart with almonds", "c1"),
        ("2026-05-02T10:00:00+00:00", "banana smoothie for breakfast", "b2"),
        ("2026-05-20T10:00:00+00:00", "apple cider vinegar dressing", "a2"),
        ("2026-06-20T10:00:00+00:00", "grape juice at the market", "g1"),
    ]:
        refs[src] = _put(app, text, stamp, src)
    for day, word in zip(range(1, 16), WORDS):
        refs[f"x{day}"] = _put(app, f"banana {word} number {day}", f"2026-06-{day:02d}T10:00:00+00:00", f"x{day}")
    return refs


def _heads(out):
    return [(i["head_ref"], i.get("admission", "")) for i in out["items"]]


def test_the_notice_names_the_period_searched_with_the_confidence_margin(app, pantry):
    cue = {"confidence": "likely", "after": "2026-05-01", "before": "2026-05-03"}
    out = reconstruct(app, agent_id=A, query="banana smoothie", time_cue=cue)
    # spec §9 example: 2026-05-01T00:00 – 2026-05-04T00:00 widened by half its length on each side
    assert out["time_cue"] == {
        "policy": "cued-v0.3",
        "period": ["2026-04-29T12:00:00+00:00", "2026-05-05T12:00:00+00:00"],
        "confidence": "likely",
        "revised": False,
        "moved": 0,
        "seated": 0,
    }  # spec TQ-7


def test_an_empty_period_is_widened_once_by_one_confidence_step(app, pantry):
    cue = {"confidence": "sure", "after": "2026-05-01", "before": "2026-05-03"}
    out = reconstruct(app, agent_id=A, query="apple", time_cue=cue)  # the period holds no apple
    assert out["time_cue"]["revised"] is True  # spec TQ-6
    assert out["time_cue"]["confidence"] == "likely"  # spec TQ-7: the last confidence used
    assert out["time_cue"]["period"] == ["2026-04-29T12:00:00+00:00", "2026-05-05T12:00:00+00:00"]
    vague = reconstruct(
        app, agent_id=A, query="apple", time_cue={"confidence": "vague", "after": "2026-04-10", "before": "2026-04-12"}
    )
    # spec TQ-6: vague has no wider step
    assert vague["time_cue"] == {
        "policy": "cued-v0.3",
        "period": ["2026-04-07T00:00:00+00:00", "2026-04-16T00:00:00+00:00"],
        "confidence": "vague",
        "revised": False,
        "moved": 0,
        "seated": 0,
    }


def test_period_rows_no_arm_retrieved_take_held_seats(app, pantry):
    cue = {"confidence": "sure", "after": "2026-06-12", "before": "2026-06-15"}
    plain = reconstruct(app, agent_id=A, query="banana", top_k=3)
    out = reconstruct(app, agent_id=A, query="banana", top_k=3, time_cue=cue)
    period = {pantry[f"x{d}"] for d in (12, 13, 14, 15)}
    seats = [ref for ref, admission in _heads(out) if admission == "reservation" and ref in period]
    assert len(seats) == 3 and out["time_cue"]["seated"] == 3  # spec TQ-6: sure holds 3 seats
    assert out["reserved_count"] == len([h for h in _heads(out) if h[1]])  # spec RX-10, RX-19, RX-39
    # The cue only adds: the window is the same rows in the same order (spec TQ-6).
    assert [h for h in _heads(out) if not h[1]] == [h for h in _heads(plain) if not h[1]]
    likely = reconstruct(app, agent_id=A, query="banana", top_k=3, time_cue={**cue, "confidence": "likely"})
    assert likely["time_cue"]["seated"] == 2  # likely holds 2
    cited = {c["ref"] for i in out["items"] for c in i["claims"]}
    assert cited <= set(pantry.values())


def test_a_seat_is_never_a_row_the_gate_refused(app, pantry):
    # mem for "banana smoothie" (May 2nd) is retrieved by the keyword arm and refused by the gate:
    # the cue finds it in the period but does not seat it (measured on the reference).
    cue = {"confidence": "sure", "after": "2026-05-01", "before": "2026-05-03"}
    out = reconstruct(app, agent_id=A, query="banana", time_cue=cue)
    assert out["time_cue"]["seated"] == 0 and out["time_cue"]["revised"] is False


def test_rows_found_in_the_period_move_up_a_bounded_number_of_places(app, pantry):
    plain = [h for h, _ in _heads(reconstruct(app, agent_id=A, query="banana", deep=True))]
    cue = {"confidence": "likely", "after": "2026-06-08", "before": "2026-06-15"}
    out = reconstruct(app, agent_id=A, query="banana", deep=True, time_cue=cue)
    lifted = [h for h, _ in _heads(out)]
    assert sorted(lifted) == sorted(plain)  # spec TQ-6: the cue moves rows, never swaps one in or out here
    assert out["time_cue"]["moved"] > 0
    for position, ref in enumerate(lifted):
        assert plain.index(ref) - position <= 2  # likely: at most 2 places up


def test_lift_matches_the_reference_orders():  # spec TQ-6
    # likely (2 places): only 16 and 10 move, one place each; 14 stays below 7, which 10 already passed
    keys = [("mem", i) for i in (8, 16, 7, 10, 14, 15, 18, 11, 13, 17)]
    found = {("mem", i) for i in (16, 10, 14, 15, 18, 11, 13, 17)}
    order, moved = lift(keys, found, 2)
    assert [keys[i][1] for i in order] == [16, 8, 10, 7, 14, 15, 18, 11, 13, 17]
    assert moved == 4
    # sure (3 places): a lone found row passes three rows
    keys = [("mem", i) for i in (8, 16, 7, 10, 14)]
    order, moved = lift(keys, {("mem", 10)}, 3)
    assert [keys[i][1] for i in order] == [10, 8, 16, 7, 14] and moved == 4
    assert lift(keys, set(), 3) == ([0, 1, 2, 3, 4], 0)
    assert lift([None, ("mem", 1)], {("mem", 1)}, 1) == ([1, 0], 2)  # the profile row is passed like any


def test_a_recent_only_cue_is_ignored(app, pantry):
    out = reconstruct(
        app, agent_id=A, query="banana", time_cue={"confidence": "vague", "ago": {"unit": "days", "value": 0}}
    )
    notice = out["time_cue"]
    assert notice["policy"] == "cued-v0.3" and notice["ignored"] == "recent_only"  # spec TQ-5
    assert set(notice) == {"policy", "ignored", "period"}
    plain = reconstruct(app, agent_id=A, query="banana")
    assert out["items"] == plain["items"]  # not used: nothing moved, no seat


def test_relative_and_long_ago_periods(app, pantry):
    out = reconstruct(app, agent_id=A, query="cherry", time_cue={"confidence": "likely", "ago": "long_ago"})
    # spec TQ-4: the oldest third of March 1st … June 20th, widened by half its length each side
    assert out["time_cue"]["period"] == ["2026-02-10T22:00:00+00:00", "2026-04-25T22:00:00+00:00"]
    now = datetime.now(timezone.utc)
    weeks = reconstruct(
        app, agent_id=A, query="cherry", time_cue={"confidence": "sure", "ago": {"unit": "weeks", "value": 3}}
    )
    start, end = (datetime.fromisoformat(t) for t in weeks["time_cue"]["period"])
    # one unit wide, centred 3 weeks ago; nothing there, so widened to likely: half a unit each side
    assert weeks["time_cue"]["revised"] is True
    assert end - start == timedelta(weeks=2)
    assert abs((start + (end - start) / 2) - (now - timedelta(weeks=3))) < timedelta(minutes=5)


def test_long_ago_on_an_empty_scope_has_no_period(app):
    out = reconstruct(app, agent_id="nobody", query="anything", time_cue={"confidence": "sure", "ago": "long_ago"})
    assert "time_cue" not in out and out["items"] == []  # spec TQ-4: no period, nothing to search


def test_the_period_search_keeps_the_call_scope_and_source(app, pantry):
    _put(app, "banana secret of another agent", "2026-06-13T11:00:00+00:00", "o1", agent="other")
    cue = {"confidence": "sure", "after": "2026-06-12", "before": "2026-06-15"}
    out = reconstruct(app, agent_id=A, query="banana", top_k=3, time_cue=cue, source_id="x13")
    cited = {c["ref"] for i in out["items"] for c in i["claims"]}
    assert cited == {pantry["x13"]}  # spec ISO-2, ISO-3: only the caller's rows of that source
