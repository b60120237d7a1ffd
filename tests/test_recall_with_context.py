"""recall_with_context on a real database: filtering, merging, chronology, field issues, budgets."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from sqlalchemy import insert, select

import cpersona.services.recall.with_context as rwc_module
from cpersona.config import load_settings
from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.tools import default_registry
from cpersona.services.app import App
from cpersona.services.recall.service import RecallOutcome
from cpersona.services.recall.with_context import recall_with_context
from cpersona.storage.models import Memory, Profile

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

RELEASE = "The user said the release date is March 3rd."
TOP = 1 / 61  # a first place on one list under rrf with K = 60


def make_app(db, **env: str) -> App:
    environ = {"CPERSONA_DB_PATH": str(db.path), "CPERSONA_DEGRADED_ADVISORY": "false",
               **{f"CPERSONA_{k}": v for k, v in env.items()}}  # fmt: skip
    return App(db=db, settings=load_settings(environ))


@pytest.fixture
def app(db) -> App:
    return make_app(db)


def add_memories(db, *rows: dict) -> None:
    defaults = {"agent_id": "w", "timestamp": "2026-11-01T09:00:00+00:00",
                "source": '{"type": "Agent", "id": "w", "name": ""}'}  # fmt: skip
    with db.write() as session:
        session.execute(insert(Memory), [{**defaults, **row} for row in rows])


def filler(db, n: int, agent_id: str = "w") -> None:
    """Rows no test query matches, to grow the gated pool."""
    add_memories(db, *({"agent_id": agent_id, "content": f"filler note number {i}"} for i in range(n)))


def contents(response: dict) -> list[str]:
    return [m["content"] for m in response["messages"]]


def user(content, **extra) -> dict:
    return {"role": "user", "content": content, **extra}


# -- merging and order ---------------------------------------------------------------------


def test_recalled_rows_and_turns_merge_into_one_chronological_list(db, app):  # spec RWC-2..RWC-5
    add_memories(db, {"content": RELEASE})
    response = recall_with_context(app, agent_id="w", query="release date", external_context=[
        user("When is the release?", name="Ann", user_id="42", timestamp="2026-11-01T18:00:00+09:00"),
        {"role": "assistant", "content": "  Checking memory.  ", "timestamp": "2026-11-01T10:00:00Z"},
        {"role": "system", "content": "sys"},
        {"role": "tool", "content": "tool out"},
        user("no stamp here"),
        user(5),
        user("bad stamp", timestamp=7),
        user("dated by day", timestamp="2026-11-01"),
        user("not a time", timestamp="garbage"),
        user("naive is UTC", timestamp="2026-11-01T09:00:00"),
    ])  # fmt: skip
    assert response["messages"] == [
        # undated (missing, non-string or unreadable stamps) first, in merge order
        {"content": "no stamp here", "source": {"type": "User", "id": "discord:User", "name": "User"},
         "timestamp": "", "context_type": "conversation"},
        {"content": "bad stamp", "source": {"type": "User", "id": "discord:User", "name": "User"},
         "timestamp": "", "context_type": "conversation"},
        {"content": "not a time", "source": {"type": "User", "id": "discord:User", "name": "User"},
         "timestamp": "garbage", "context_type": "conversation"},
        {"content": "dated by day", "source": {"type": "User", "id": "discord:User", "name": "User"},
         "timestamp": "2026-11-01", "context_type": "conversation"},
        # 09:00 UTC three times: the recalled row first, then the turns in the order given
        {"content": RELEASE, "ref": "mem:1", "source": {"type": "Agent", "id": "w", "name": ""},
         "timestamp": "2026-11-01T09:00:00+00:00", "match_reason": {"signal": "rrf", "score": TOP, "rrf": TOP}},
        {"content": "When is the release?", "source": {"type": "User", "id": "discord:42", "name": "Ann"},
         "timestamp": "2026-11-01T18:00:00+09:00", "context_type": "conversation"},
        {"content": "naive is UTC", "source": {"type": "User", "id": "discord:User", "name": "User"},
         "timestamp": "2026-11-01T09:00:00", "context_type": "conversation"},
        {"content": "Checking memory.", "source": {"type": "Agent", "id": "self"},
         "timestamp": "2026-11-01T10:00:00Z", "context_type": "conversation"},
    ]  # fmt: skip
    assert response["context_filter_only"]["roles"] == ["system", "tool"]
    assert response["context_field_issues"]["entries"] == [{"index": 5, "fields": ["content"]},
                                                           {"index": 6, "fields": ["timestamp"]}]  # fmt: skip
    assert "ok" not in response  # spec G-2


def test_user_sources_fall_back_to_the_name_and_the_default_name(db, app):  # spec RWC-3
    response = recall_with_context(app, agent_id="w", query="x", limit=0, external_context=[
        user("a", name="Bob"), user("b", user_id="9"), user("c", name="Bob", user_id="9"),
        {"role": "assistant", "content": "d", "name": "Bob", "user_id": "9"},
    ])  # fmt: skip
    assert [m["source"] for m in response["messages"]] == [
        {"type": "User", "id": "discord:Bob", "name": "Bob"},
        {"type": "User", "id": "discord:9", "name": "User"},
        {"type": "User", "id": "discord:9", "name": "Bob"},
        {"type": "Agent", "id": "self"},
    ]


def test_order_is_by_instant_not_by_relevance_or_text(db, app):  # spec RWC-4, RWC-5
    filler(db, 100)
    add_memories(
        db,
        {"content": "alpha alpha alpha", "timestamp": "2026-01-03T00:00:00+00:00"},  # best match, newest
        {"content": "alpha beta", "timestamp": "2026-01-01T00:00:00+00:00"},
        {"content": "alpha in a long sentence with many more words", "timestamp": "2026-01-02T00:00:00+05:00"},
    )
    response = recall_with_context(app, agent_id="w", query="alpha", external_context=[
        user("late turn", timestamp="2026-01-02T12:00:00Z"),
        user("early turn", timestamp="2025-12-31T23:59:59-01:00"),  # 2026-01-01T00:59:59Z
    ])  # fmt: skip
    assert contents(response) == [
        "alpha beta", "early turn", "alpha in a long sentence with many more words", "late turn",
        "alpha alpha alpha",
    ]  # fmt: skip


def test_the_profile_row_joins_the_undated_group_at_the_front(db, app):  # spec RWC-4, ORD-3
    filler(db, 60)
    add_memories(db, {"content": "alpha"})
    with db.write() as session:
        session.add(Profile(agent_id="w", content="Likes tea."))
    response = recall_with_context(app, agent_id="w", query="alpha", external_context=[user("undated turn")])
    assert contents(response) == ["[Profile] Likes tea.", "undated turn", "alpha"]


def test_limit_zero_still_merges_the_turns(db, app):  # spec §3.3
    add_memories(db, {"content": RELEASE})
    response = recall_with_context(app, agent_id="w", query="release", limit=0,
                                   external_context=[{"role": "assistant", "content": "a"}])  # fmt: skip
    assert contents(response) == ["a"]


# -- filtering -----------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["user", "assistant", "system", "tool", None])
def test_every_entry_with_text_keeps_its_row_out_whatever_its_role(db, app, role):  # spec RWC-1, §5.7.5
    add_memories(db, {"content": RELEASE})
    entry = {"content": "  " + RELEASE.upper() + " "}  # compared trimmed and lower-cased
    if role is not None:
        entry["role"] = role
    response = recall_with_context(app, agent_id="w", query="release date", external_context=[entry])
    assert all("ref" not in m for m in response["messages"])
    assert len(response["messages"]) == (1 if role in ("user", "assistant") else 0)


def test_long_entries_exclude_by_prefix_short_ones_only_exactly(db, app):  # spec RWC-1, §5.7.5
    add_memories(db, {"content": RELEASE})
    prefix = RELEASE[:32]
    excluded = recall_with_context(app, agent_id="w", query="release date",
                                   external_context=[{"role": "system", "content": prefix}])  # fmt: skip
    assert excluded["messages"] == []
    kept = recall_with_context(app, agent_id="w", query="release date",
                               external_context=[{"role": "system", "content": prefix[:31]}])  # fmt: skip
    assert [m.get("ref") for m in kept["messages"]] == ["mem:1"]


def test_entries_without_usable_text_do_not_filter(db, app):  # spec RWC-1, RWC-6
    add_memories(db, {"content": RELEASE})
    response = recall_with_context(app, agent_id="w", query="release date", external_context=[
        {"role": "system", "content": ["The user said the release date is March 3rd."]},
        {"role": "system", "content": "   "},
        {"role": "user"},
    ])  # fmt: skip
    assert [m.get("ref") for m in response["messages"]] == ["mem:1"]
    assert "context_filter_only" not in response  # blank or dropped entries filtered nothing


def test_context_filter_only_lists_sorted_unique_roles_with_unset_for_none(db, app):  # spec RWC-2
    response = recall_with_context(app, agent_id="w", query="x", limit=0, external_context=[
        {"role": "tool", "content": "t"}, {"role": "system", "content": "s"}, {"role": "tool", "content": "t2"},
        {"content": "no role"}, {"role": "User", "content": "roles are case-sensitive"},
        {"role": 5, "content": "a role that is not text is absent"}, {"role": "system", "content": " "},
    ])  # fmt: skip
    assert response["context_filter_only"]["roles"] == ["(unset)", "User", "system", "tool"]
    assert response["context_filter_only"]["note"]
    assert response["messages"] == []
    plain = recall_with_context(app, agent_id="w", query="x", limit=0, external_context=[user("u")])
    assert "context_filter_only" not in plain


# -- field issues (CPERSONA_EXTERNAL_CONTEXT_MODE) -----------------------------------------


def test_warn_mode_reports_fields_read_as_absent_with_one_of_three_notes(db, app):  # spec RWC-6, RWC-7
    def issues(entries):
        return recall_with_context(app, agent_id="w", query="x", limit=0, external_context=entries)[
            "context_field_issues"
        ]

    kept = issues([user("ok", name=5, user_id=None, timestamp=[1])])
    assert kept["entries"] == [{"index": 0, "fields": ["name", "timestamp", "user_id"]}]
    dropped = issues([user(5), user("fine"), {"role": "user", "name": 5}])
    assert dropped["entries"] == [{"index": 0, "fields": ["content"]}, {"index": 2, "fields": ["name"]}]
    mixed = issues([user(None), user("ok", role=7)])
    assert mixed["entries"] == [{"index": 0, "fields": ["content"]}, {"index": 1, "fields": ["role"]}]
    assert len({kept["note"], dropped["note"], mixed["note"]}) == 3
    assert "dropped" in dropped["note"] and "merged" in kept["note"]
    assert "context_field_issues" not in recall_with_context(app, agent_id="w", query="x", limit=0,
                                                             external_context=[user("ok")])  # fmt: skip


def test_a_field_that_is_not_a_string_is_read_as_absent(db, app):  # spec RWC-6
    response = recall_with_context(app, agent_id="w", query="x", limit=0,
                                   external_context=[user("ok", name=3, user_id=4, timestamp=5)])  # fmt: skip
    assert response["messages"] == [{"content": "ok", "source": {"type": "User", "id": "discord:User", "name": "User"},
                                      "timestamp": "", "context_type": "conversation"}]  # fmt: skip


def counters(db) -> dict[int, int]:
    with db.read() as session:
        return dict(session.execute(select(Memory.id, Memory.recall_count)).all())


def test_reject_mode_refuses_before_any_search(db):  # spec RWC-6
    app = make_app(db, EXTERNAL_CONTEXT_MODE="reject", CONFIDENCE_ENABLED="true")
    add_memories(db, {"content": RELEASE})
    entries = [user("ok", name=5), user("fine"), {"role": 7, "content": 4, "timestamp": [1]}]
    response = recall_with_context(app, agent_id="w", query="release date", external_context=entries)
    assert response["ok"] is False and response["messages"] == []
    assert "[0] name" in response["error"] and "[2] content, role, timestamp" in response["error"]
    assert counters(db) == {1: 0}  # the recall did not run: with confidence on it would have counted
    fine = recall_with_context(app, agent_id="w", query="release date", external_context=[user("fine")])
    assert contents(fine) == ["fine", RELEASE] and counters(db) == {1: 1}


def test_off_mode_reads_the_same_but_says_nothing(db):  # spec RWC-6
    app = make_app(db, EXTERNAL_CONTEXT_MODE="off")
    response = recall_with_context(app, agent_id="w", query="x", limit=0,
                                   external_context=[user("ok", name=5), {"role": "system", "content": "s"}])  # fmt: skip
    assert contents(response) == ["ok"] and response["messages"][0]["source"]["name"] == "User"
    assert "context_field_issues" not in response
    assert response["context_filter_only"]["roles"] == ["system"]  # the role report is not a field issue


def test_an_entry_that_is_not_an_object_is_reported_as_such(db, app):  # spec RWC-6 (in-process callers)
    response = recall_with_context(app, agent_id="w", query="x", limit=0, external_context=["text", user("ok")])
    assert response["context_field_issues"]["entries"] == [{"index": 0, "fields": ["<entry>"]}]
    assert contents(response) == ["ok"]


# -- preview tier and budgets ----------------------------------------------------------------


LONG_ROW = "zebra crossing notes. " + "filler words here. " * 150  # 2,872 characters


def test_recalled_rows_are_previewed_and_turns_never_cut(db, app):  # spec RWC-9, RC-6, §6 item 9
    add_memories(db, {"content": LONG_ROW, "timestamp": "2026-01-01T00:00:00+00:00"})
    turn = "conversation text " * 100
    response = recall_with_context(app, agent_id="w", query="zebra",
                                   external_context=[user(turn, timestamp="2025-01-01T00:00:00Z")])  # fmt: skip
    first, row = response["messages"]
    assert first["content"] == turn.strip() and "content_truncated" not in first
    assert row["content"] == LONG_ROW[:500] and row["content_len"] == len(LONG_ROW)
    assert row["content_truncated"] is True and row["excerpt"].startswith("zebra crossing notes.")
    assert row["excerpt_basis"] == "lexical"


def test_full_content_budget_is_spent_from_the_chronological_end(db, app):  # spec RWC-9, §5.15.2
    add_memories(db, {"content": LONG_ROW, "timestamp": "2026-01-01T00:00:00+00:00"})
    big = ("conversation text " * 11000).strip()  # 197,999 characters
    newer = recall_with_context(app, agent_id="w", query="zebra", full_content=True,
                                external_context=[user(big, timestamp="2026-02-01T00:00:00Z")])  # fmt: skip
    row, turn = newer["messages"]
    assert turn["content"] == big and row["content_truncated"] is True and len(row["content"]) == 500
    assert newer["full_content_budget_chars"] == 200_000

    older = recall_with_context(app, agent_id="w", query="zebra", full_content=True,
                                external_context=[user(big, timestamp="2025-02-01T00:00:00Z")])  # fmt: skip
    turn, row = older["messages"]
    assert row["content"] == LONG_ROW and "content_truncated" not in row  # the newest message is always whole
    assert turn["content"] == big and older["full_content_budget_chars"] == 200_000

    fits = recall_with_context(app, agent_id="w", query="zebra", full_content=True,
                               external_context=[user(big[:190_000], timestamp="2026-02-01T00:00:00Z")])  # fmt: skip
    assert fits["messages"][0]["content"] == LONG_ROW and "full_content_budget_chars" not in fits


# -- forwarded keys and refusals ------------------------------------------------------------------


def test_advisory_is_forwarded_once_per_session_like_recall(db):  # spec RWC-8, §5.17
    app = make_app(db, DEGRADED_ADVISORY="true")
    first = recall_with_context(app, agent_id="w", query="x", session_key="s1")
    second = recall_with_context(app, agent_id="w", query="x", session_key="s1")
    assert first["advisory"]["severity"] == "hint" and first["advisory"]["runbook"] != second["advisory"]["runbook"]


def test_gate_fallback_is_forwarded_but_depth_is_not(db, app, monkeypatch):  # spec RWC-8, §3.3 response keys
    monkeypatch.setattr(rwc_module, "recalled", lambda app, req: RecallOutcome(
        [{"content": "weak", "ref": "mem:1", "timestamp": "2026-01-01T00:00:00Z"}],
        {"gate_fallback": True, "depth": 20, "resolved_project_id": "p"}))  # fmt: skip
    response = recall_with_context(app, agent_id="w", query="x", external_context=[user("u")])
    assert response["gate_fallback"] is True and response["resolved_project_id"] == "p"
    assert "depth" not in response
    assert contents(response) == ["u", "weak"]


def test_isolation_is_recalls(db, app):  # spec RC-8, §5.1
    add_memories(db, {"content": RELEASE, "agent_id": "other"})
    assert recall_with_context(app, agent_id="w", query="release date")["messages"] == []
    add_memories(db, {"content": RELEASE, "project_id": "p"})
    assert recall_with_context(app, agent_id="w", query="release date", project_id="q")["messages"] == []
    assert len(recall_with_context(app, agent_id="w", query="release date", project_id="p")["messages"]) == 1


@pytest.mark.parametrize(
    "arguments,needle",
    [
        ({"query": "x"}, "agent_id"),
        ({"agent_id": "w"}, "query"),
        ({"agent_id": "w", "query": "x", "limit": "5"}, "limit"),
        ({"agent_id": "w", "query": "x", "deep": "yes"}, "deep"),
        ({"agent_id": "w", "query": "x", "external_context": "turns"}, "external_context"),
        ({"agent_id": "w", "query": "x", "external_context": {"role": "user"}}, "external_context"),
        ({"agent_id": "w", "query": "x", "external_context": [user("x\ud800")]}, "surrogate"),
        ({"agent_id": "w", "query": "x", "external_context": [user("ok", name="\udfff")]}, "surrogate"),
    ],
)
def test_a_refused_recall_is_the_answer(db, arguments, needle):  # spec RWC-10, G-1, G-6
    app = make_app(db, CONFIDENCE_ENABLED="true")
    add_memories(db, {"content": "x marks the spot"})
    response = recall_with_context(app, **arguments)
    assert response["ok"] is False and response["messages"] == [] and needle in response["error"]
    assert counters(db) == {1: 0}


# -- through the facade ------------------------------------------------------------------------


async def call(app, arguments):
    return await call_tool(app, default_registry(), GateChain(), "recall_with_context", arguments)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "arguments,detail",
    [
        ({"agent_id": "w", "query": "x", "external_context": None}, "None is not of type 'array'"),
        ({"agent_id": "w", "query": "x", "external_context": ["text"]}, "'text' is not of type 'object'"),
        ({"agent_id": "w", "query": "x", "limit": 101}, "101 is greater than the maximum of 100"),
        ({"agent_id": "w", "query": "x", "session_key": "k" * 257}, "is too long"),
        ({"agent_id": "w"}, "'query' is a required property"),
    ],
)
async def test_schema_violations_are_input_validation_errors(db, app, arguments, detail):  # spec G-3
    outcome = await call(app, arguments)
    assert outcome.is_error and outcome.payload["error"].startswith("Input validation error: ")
    assert detail in outcome.payload["error"]


@pytest.mark.anyio
async def test_through_the_call_path_with_a_surrogate_refused_in_the_recall_shape(db, app):  # spec G-6
    add_memories(db, {"content": RELEASE})
    outcome = await call(app, {"agent_id": "w", "query": "release date", "external_context": [user("hi")]})
    assert not outcome.is_error and contents(outcome.payload) == ["hi", RELEASE]
    refused = await call(app, {"agent_id": "w", "query": "x", "external_context": [user("\ud800")]})
    assert refused.payload["ok"] is False and refused.payload["messages"] == []


@pytest.mark.anyio
async def test_a_very_long_conversation_is_handled_in_bounded_time(db, app):  # bounded work
    filler(db, 200)
    add_memories(db, {"content": RELEASE})
    turns = [user(f"turn {i:05d} of a long conversation that is over 32 chars",
                  timestamp=datetime(2026, 1, 1, tzinfo=timezone.utc).replace(second=i % 60).isoformat())
             for i in range(15_000)]  # fmt: skip
    started = time.perf_counter()
    outcome = await call(app, {"agent_id": "w", "query": "release date", "external_context": turns})
    elapsed = time.perf_counter() - started
    assert not outcome.is_error and len(outcome.payload["messages"]) == 15_001
    assert elapsed < 10, elapsed
