"""recall with a time cue: the period search, the lift, the held seats and the notice.

Spec associations-and-reconstruct §9 (TQ-1 … TQ-7: the cue arm, the seats and
the lift are recall mechanics), memory-and-recall §5.13 ORD-2 (held seats come
first, labelled) and §5.9.5 (held seats are not credited to the counters).
The seat order, the seats' match_reason and the ``time_cue`` key were checked
against the reference on the same kind of corpus (period rows of one keyword,
limit 2, keyword-only).
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import select

from cpersona.services.recall.cue_arm import lift
from cpersona.services.records.memories import store
from cpersona.services.recall.service import recall
from cpersona.storage.models import Memory
from conftest import make_app

pytestmark = pytest.mark.both_backends

A = "agent"
NOW = datetime(2026, 11, 30, 12, tzinfo=timezone.utc)
MARCH = {"after": "2026-03-01", "before": "2026-03-10"}  # [03-01, 03-11) at sure width
IN_MARCH = ["pie", "split", "pancakes", "chips", "bread", "cake"]  # banana rows of March 2nd … 7th
ELSEWHERE = [("2026-01-05", "smoothie"), ("2026-04-10", "muffin"), ("2026-04-11", "milk"), ("2026-05-11", "cream")]


def _put(app, content, day, user="u1", agent=A):
    out = store(
        app,
        content=content,
        agent_id=agent,
        timestamp=f"{day}T10:00:00+00:00",
        source={"type": "User", "id": user, "name": ""},
    )
    assert out.get("ok", True) is not False, out
    return f"mem:{out['id']}"


@pytest.fixture
def cued_app(db):
    app = make_app(db, CONFIDENCE_ENABLED="true")
    app.clock = lambda: NOW
    return app


@pytest.fixture
def march(cued_app):
    """Refs of the six March banana rows (oldest first), the others after them."""
    refs = [_put(cued_app, f"banana {word} in march", f"2026-03-{i + 2:02d}") for i, word in enumerate(IN_MARCH)]
    others = [_put(cued_app, f"banana {word} elsewhere", day) for day, word in ELSEWHERE]
    return refs, others


def _seats(out):
    return [m for m in out["messages"] if m.get("match_reason", {}).get("admission") == "reservation"]


@pytest.mark.parametrize(("confidence", "places"), [("sure", 3), ("likely", 2), ("vague", 1)])
def test_held_seats_come_first_labelled_and_counted(cued_app, march, confidence, places):
    refs, _ = march
    out = recall(cued_app, agent_id=A, query="banana", limit=2, time_cue={"confidence": confidence, **MARCH})
    seats = _seats(out)
    assert len(seats) == places  # spec TQ-6: 3 / 2 / 1 seats (six March rows, at most two retrieved)
    assert out["messages"][:places] == seats  # spec ORD-2: appended before the reverse, so first
    ranked = out["messages"][places:]
    assert 1 <= len(ranked) <= 2 and not _seats({"messages": ranked})
    assert [s["match_reason"] for s in seats] == [
        {"signal": "cue", "admission": "reservation", "cue_rank": rank} for rank in reversed(range(places))
    ]
    assert {s["ref"] for s in seats} <= set(refs)  # period rows only
    assert not {s["ref"] for s in seats} & {m["ref"] for m in ranked}  # rows the answer holds take no seat
    assert all("confidence" in m for m in out["messages"])  # seats are scored too (§5.9.3)
    notice = out["time_cue"]
    assert notice["policy"] == "cued-v0.3" and notice["seated"] == places  # spec TQ-7
    assert notice["revised"] is False and notice["confidence"] == confidence


def test_blank_query_seats_the_newest_rows_of_the_period(cued_app, march):
    refs, others = march
    out = recall(cued_app, agent_id=A, query="", limit=2, time_cue={"confidence": "sure", **MARCH})
    # the recency listing holds the two newest rows; the period's three newest take the seats,
    # best (cue_rank 0) nearest the ranked rows (as the reference answers)
    assert [m["ref"] for m in out["messages"]] == [refs[3], refs[4], refs[5], others[2], others[3]]
    assert out["time_cue"] == {
        "policy": "cued-v0.3",
        "period": ["2026-03-01T00:00:00+00:00", "2026-03-11T00:00:00+00:00"],
        "confidence": "sure",
        "revised": False,
        "moved": 0,
        "seated": 3,
    }  # spec TQ-7


def test_held_seats_are_not_credited_to_the_recall_counters(cued_app, march, db):  # spec §5.9.5
    out = recall(cued_app, agent_id=A, query="banana", limit=2, time_cue={"confidence": "sure", **MARCH})
    seat_ids = {int(s["ref"].split(":")[1]) for s in _seats(out)}
    ranked_ids = {int(m["ref"].split(":")[1]) for m in out["messages"]} - seat_ids
    with db.read() as session:
        counts = dict(session.execute(select(Memory.id, Memory.recall_count)).all())
    assert seat_ids and all(counts[i] == 0 for i in seat_ids)  # after the cut, before held seats
    assert ranked_ids and all(counts[i] == 1 for i in ranked_ids)


def test_the_lift_moves_period_rows_up_within_the_answer(cued_app, march):  # spec TQ-6
    refs, _ = march
    plain = recall(cued_app, agent_id=A, query="banana", limit=20, deep=True)
    cued = recall(
        cued_app,
        agent_id=A,
        query="banana",
        limit=20,
        deep=True,
        time_cue={"confidence": "likely", "after": "2026-04-10", "before": "2026-04-11"},
    )
    best_first = [m["ref"] for m in reversed(plain["messages"])]
    in_april = {m["ref"] for m in plain["messages"] if m.get("timestamp", "").startswith("2026-04-1")}
    order, moved = lift(best_first, in_april, 2)
    assert [m["ref"] for m in reversed(cued["messages"])] == [best_first[i] for i in order]
    assert cued["time_cue"]["moved"] == moved and cued["time_cue"]["seated"] == 0  # every row already held
    assert sorted(m["ref"] for m in cued["messages"]) == sorted(best_first)  # membership untouched


def test_recent_only_cue_is_ignored_with_a_notice(cued_app, march):  # spec TQ-5
    plain = recall(cued_app, agent_id=A, query="banana", limit=3)
    out = recall(
        cued_app,
        agent_id=A,
        query="banana",
        limit=3,
        time_cue={"confidence": "sure", "ago": {"unit": "days", "value": 0}},
    )
    assert out["time_cue"] == {
        "policy": "cued-v0.3",
        "ignored": "recent_only",
        "period": ["2026-11-30T00:00:00+00:00", "2026-11-30T12:00:00+00:00"],
    }
    assert [m["ref"] for m in out["messages"]] == [m["ref"] for m in plain["messages"]]


def test_an_unreadable_cue_is_refused_with_no_messages(cued_app, march):  # spec TQ-2, recall's error shape
    out = recall(cued_app, agent_id=A, query="banana", time_cue={"confidence": "sure", "after": "bad"})
    assert out == {"ok": False, "error": "time_cue.after is not a date or timestamp: 'bad'", "messages": []}
    out = recall(cued_app, agent_id=A, query="banana", time_cue={"confidence": "sure"})
    assert out == {
        "ok": False,
        "messages": [],
        "error": "time_cue needs either after/before or ago, not both and not neither",
    }  # TQ-1
    assert recall(cued_app, agent_id=A, query="banana", time_cue="March")["error"] == "time_cue must be an object"


def test_an_empty_cue_is_no_cue(cued_app, march):  # spec TQ-1
    out = recall(cued_app, agent_id=A, query="banana", limit=2, time_cue={})
    assert "time_cue" not in out and not _seats(out)


def test_seats_stay_inside_the_scope_and_the_source_filter(cued_app):  # spec TQ-6, ISO-2, ISO-3
    mine = [_put(cued_app, f"banana {word} in march", f"2026-03-{i + 2:02d}") for i, word in enumerate(IN_MARCH[:3])]
    _put(cued_app, "banana of another user in march", "2026-03-08", user="u2")
    _put(cued_app, "banana of another agent in march", "2026-03-09", agent="other")
    newest = [_put(cued_app, f"banana {word} elsewhere", day) for day, word in ELSEWHERE]
    out = recall(cued_app, agent_id=A, query="", limit=2, source_id="u1", time_cue={"confidence": "sure", **MARCH})
    assert [m["ref"] for m in out["messages"]] == [mine[0], mine[1], mine[2], newest[2], newest[3]]
