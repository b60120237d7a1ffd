"""list_memories (spec §3.9) and the list budgets (spec §5.15.3) on a real SQLite file."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from cpersona.services.records.listing import ListBounds, apply_char_budget, list_memories
from cpersona.services.records.memories import store
from cpersona.storage.models import Memory
from conftest import make_app

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL


def store_at(app, when: str, **arguments) -> int:
    app.clock = lambda: datetime.fromisoformat(when).replace(tzinfo=timezone.utc)
    response = store(app, **arguments)
    assert response["result"] == "stored", response
    return response["id"]


def contents(response: dict) -> list[str]:
    return [m["content"] for m in response["memories"]]


def test_row_shape(app):  # spec §3.9, LM-5, G-2
    store_at(
        app,
        "2026-11-30 03:59:13.432853",
        agent_id="a1",
        id="msg-1",
        content="The deploy key for staging lives in vault path secret/staging/deploy.",
    )
    assert list_memories(app, agent_id="a1") == {
        "memories": [
            {
                "id": 1,
                "agent_id": "a1",
                "project_id": "",
                "content": "The deploy key for staging lives in vault path secret/staging/deploy.",
                "source": {"type": "Agent", "id": "a1", "name": ""},
                "timestamp": "2026-11-30T03:59:13.432853+00:00",
                "created_at": "2026-11-30 03:59:13",
                "locked": False,
                "channel": "",
            }
        ],
        "count": 1,
    }


def test_locked_is_a_boolean_and_channel_is_listed(app):  # spec §3.9
    store(app, agent_id="a", content="x", lock=True, channel="c1")
    row = list_memories(app, agent_id="a")["memories"][0]
    assert row["locked"] is True and row["channel"] == "c1"


@pytest.mark.parametrize(
    ("stored", "listed"),
    [
        ("", {}),
        ("not json", {}),
        ('"bob"', "bob"),
        ('{"type": "User", "id": "u"}', {"type": "User", "id": "u"}),
    ],
)
def test_source_is_the_stored_json_parsed(app, db, stored, listed):  # spec §3.9
    store(app, agent_id="a", content="x")
    with db.write_connection() as conn:
        conn.execute(text("UPDATE memories SET source = :s"), {"s": stored})
    assert list_memories(app, agent_id="a")["memories"][0]["source"] == listed


def test_newest_first_with_same_second_ties_newest_id_first(app):  # spec LM-1, §6 item 6
    store_at(app, "2026-06-01 10:00:00", agent_id="a", content="old")
    store_at(app, "2026-06-01 12:00:00.100", agent_id="a", content="new-1")
    store_at(app, "2026-06-01 12:00:00.900", agent_id="a", content="new-2")
    store_at(app, "2026-06-01 11:00:00", agent_id="a", content="middle")
    assert contents(list_memories(app, agent_id="a")) == ["new-2", "new-1", "middle", "old"]


def test_order_follows_created_at_not_the_caller_timestamp(app):  # spec LM-1
    store_at(app, "2026-06-01 10:00:00", agent_id="a", content="stored first", timestamp="2030-01-01T00:00:00Z")
    store_at(app, "2026-06-01 11:00:00", agent_id="a", content="stored second", timestamp="2001-01-01T00:00:00Z")
    assert contents(list_memories(app, agent_id="a")) == ["stored second", "stored first"]


def test_agent_omitted_or_empty_lists_every_agent(app):  # spec §3.9 [S], AX table §1.2
    store(app, agent_id="a", content="a's")
    store(app, agent_id="b", content="b's")
    store(app, agent_id="", content="empty agent's")
    assert sorted(contents(list_memories(app))) == ["a's", "b's", "empty agent's"]
    assert sorted(contents(list_memories(app, agent_id=""))) == ["a's", "b's", "empty agent's"]
    assert contents(list_memories(app, agent_id="a")) == ["a's"]


def test_project_filter(app):  # spec §3.9, §5.1
    store(app, agent_id="a", content="global")
    store(app, agent_id="a", content="in p", project_id="p")
    store(app, agent_id="a", content="in q", project_id="q")
    assert sorted(contents(list_memories(app, agent_id="a"))) == ["global", "in p", "in q"]
    assert contents(list_memories(app, agent_id="a", project_id="")) == ["global"]
    assert sorted(contents(list_memories(app, agent_id="a", project_id="p"))) == ["global", "in p"]


def test_no_channel_filter(app):  # spec §3.9
    store(app, agent_id="a", content="one", channel="c1")
    store(app, agent_id="a", content="two", channel="c2")
    assert list_memories(app, agent_id="a")["count"] == 2


def add_rows(db, count: int, agent_id: str = "a") -> None:
    with db.write() as session:
        session.add_all(Memory(agent_id=agent_id, content=f"row {i}", timestamp="t") for i in range(count))


def test_default_limit_100_and_clamp_500(app, db):  # spec LM-2, §3.9
    add_rows(db, 501)
    assert list_memories(app, agent_id="a")["count"] == 100
    capped = list_memories(app, agent_id="a", limit=10_000)
    assert capped["count"] == 500 and capped["budget_rows"] == 500
    assert "budget_rows" not in list_memories(app, agent_id="a", limit=500)
    assert list_memories(app, agent_id="a", limit=501)["budget_rows"] == 500


def test_budget_rows_absent_when_the_data_ends_before_the_cap(app, db):  # spec §3.9
    add_rows(db, 500)
    add_rows(db, 3, agent_id="other")
    listed = list_memories(app, agent_id="a", limit=600)
    assert listed["count"] == 500 and "budget_rows" not in listed


@pytest.mark.parametrize("limit", [-1, -500, 0])
def test_negative_or_zero_limit_lists_nothing(app, limit):  # spec LM-2
    store(app, agent_id="a", content="x")
    assert list_memories(app, limit=limit) == {"memories": [], "count": 0}


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"limit": "10"}, "limit must be an integer, not str"),
        ({"limit": 2.5}, "limit must be an integer, not float"),
        ({"limit": True}, "limit must be an integer, not bool"),
        ({"agent_id": 5}, "agent_id must be a string"),
        ({"project_id": ["p"]}, "project_id must be a string"),
    ],
)
def test_bad_arguments_are_clear_failures(app, arguments, error):
    assert list_memories(app, **arguments) == {"ok": False, "error": error, "memories": [], "count": 0}


# -- character budget (LM-3, LM-4, §5.15.3) -------------------------------------------------------------


def fill_past_the_budget(app) -> None:
    # 62 rows of 16,000 characters use 992,000 of the 1,000,000 budget; the 63rd
    # does not fit. Then two short rows and one more long row, all older.
    for i in range(64):
        when = datetime(2026, 6, 1, 12, 0, 0) + timedelta(minutes=i)
        store_at(app, when.isoformat(sep=" "), agent_id="a", content=f"row{i:03d} " + "x" * 15_993)
    store_at(app, "2026-06-01 11:00:00", agent_id="a", content="tiny old")
    store_at(app, "2026-06-01 10:00:00", agent_id="a", content="long oldest " + "y" * 2000)


def test_rows_past_the_budget_are_degraded_never_dropped(app):  # spec LM-3, §5.15.3
    fill_past_the_budget(app)
    listed = list_memories(app, agent_id="a", limit=500)
    rows = listed["memories"]
    assert listed["count"] == 66 and listed["budget_chars"] == 1_000_000
    assert all("ref" not in r and len(r["content"]) == 16_000 for r in rows[:62])
    first_cut = rows[62]
    assert first_cut["content"] == ("row001 " + "x" * 15_993)[:500]
    assert first_cut["content_len"] == 16_000 and first_cut["content_truncated"] is True
    assert first_cut["ref"] == f"mem:{first_cut['id']}"
    assert rows[64]["content"] == "tiny old" and "ref" not in rows[64]  # short rows are never cut
    assert rows[65]["content_len"] == 2012 and len(rows[65]["content"]) == 500


def test_degraded_ref_expands_under_the_rows_own_agent(app):  # spec LM-4
    fill_past_the_budget(app)
    row = list_memories(app, limit=500)["memories"][63]
    assert row["ref"] == f"mem:{row['id']}" and row["agent_id"] == "a"


def test_budget_follows_the_preview_cap_and_zero_disables_it(db):  # spec §5.15.1, §5.15.3
    app = make_app(db, recall_preview_chars="0")
    fill_past_the_budget(app)
    listed = list_memories(app, agent_id="a", limit=500)
    assert "budget_chars" not in listed
    assert all("ref" not in r for r in listed["memories"])
    app = make_app(db, recall_preview_chars="100")
    cut = list_memories(app, agent_id="a", limit=500)["memories"][62]
    assert len(cut["content"]) == 100 and cut["content_len"] == 16_000


def test_the_first_row_is_always_whole():  # spec §5.15.3
    bounds = ListBounds(row_cap=10, char_budget=10, fields=("content",), ref_prefix="mem")
    rows = [{"id": 1, "content": "a" * 50}, {"id": 2, "content": "b" * 5}, {"id": 3, "content": "c" * 50}]
    assert apply_char_budget(rows, bounds, preview_chars=20) is True
    assert rows[0] == {"id": 1, "content": "a" * 50}
    # spent after the first row: the short row stays whole, the long one is cut
    assert rows[1] == {"id": 2, "content": "b" * 5}
    assert rows[2] == {"id": 3, "content": "c" * 20, "content_len": 50, "content_truncated": True, "ref": "mem:3"}


def test_once_spent_the_budget_stays_spent():  # spec §5.15.3: "every row after it"
    bounds = ListBounds(row_cap=10, char_budget=100, fields=("content",), ref_prefix="mem")
    rows = [{"id": 1, "content": "a" * 60}, {"id": 2, "content": "b" * 60}, {"id": 3, "content": "c" * 30}]
    apply_char_budget(rows, bounds, preview_chars=20)
    # row 3 would fit the remaining 40, but the walk stopped admitting at row 2
    assert rows[2]["content_truncated"] is True and rows[1]["content_truncated"] is True


def test_a_row_that_exactly_fills_the_budget_is_whole():  # spec §5.15.3: used + cost <= budget
    bounds = ListBounds(row_cap=10, char_budget=100, fields=("content",), ref_prefix="mem")
    rows = [{"id": 1, "content": "a" * 60}, {"id": 2, "content": "b" * 40}, {"id": 3, "content": "c" * 30}]
    apply_char_budget(rows, bounds, preview_chars=20)
    assert "ref" not in rows[1] and rows[2]["ref"] == "mem:3"
