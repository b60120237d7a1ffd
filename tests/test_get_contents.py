"""get_contents on a real database: whole rows, ownership, strict refs, the batch budget, ranges."""

from __future__ import annotations

import hashlib
import time

import pytest
from sqlalchemy import insert, update

from cpersona.config import load_settings
from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.tools import default_registry
from cpersona.services.app import App
from cpersona.services.records.contents import BATCH_BUDGET, get_contents, item_cost, parse_ref, revision_of
from cpersona.storage.models import Episode, Memory

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

STAMP = "2026-11-01T09:00:00+00:00"  # 25 characters
SOURCE = '{"type": "Agent", "id": "b", "name": ""}'  # 40 characters as the answer spells it
SOURCE_OBJ = {"type": "Agent", "id": "b", "name": ""}
# A whole memory item costs its content + len("mem:N") + 40 (source) + 25 (timestamp).
OVERHEAD = 5 + 40 + 25


def make_app(db, **env: str) -> App:
    environ = {"CPERSONA_DB_PATH": str(db.path), **{f"CPERSONA_{k}": v for k, v in env.items()}}
    return App(db=db, settings=load_settings(environ))


def add_memories(db, *rows: dict) -> None:
    defaults = {"agent_id": "b", "timestamp": STAMP, "source": SOURCE}
    with db.write() as session:
        session.execute(insert(Memory), [{**defaults, **row} for row in rows])


def add_episodes(db, *rows: dict) -> None:
    defaults = {"agent_id": "b", "created_at": "2026-06-01 12:00:00"}
    with db.write() as session:
        session.execute(insert(Episode), [{**defaults, **row} for row in rows])


def refs_of(response: dict) -> list:
    return [item["ref"] for item in response["items"]]


# -- whole rows ---------------------------------------------------------------------------


def test_memory_and_episode_items_have_the_documented_shape(db, app):  # spec §3.4, G-2, SH-4
    add_memories(db, {"content": "the full memory text", "msg_id": "caller-9"})
    add_episodes(
        db,
        {"summary": "talked about deploys", "start_time": "2026-10-01T08:00:00Z"},
        {"summary": "no start time", "resolved": 1},
    )
    response = get_contents(app, agent_id="b", refs=["mem:1", "ep:1", "ep:2"])
    assert response == {
        "items": [
            {"ref": "mem:1", "content": "the full memory text", "source": SOURCE_OBJ, "timestamp": STAMP,
             "id": "caller-9"},
            {"ref": "ep:1", "content": "[Episode] talked about deploys", "source": {"System": "episode"},
             "timestamp": "2026-10-01T08:00:00Z", "resolved": False},
            {"ref": "ep:2", "content": "[Episode] no start time", "source": {"System": "episode"},
             "timestamp": "2026-06-01 12:00:00", "resolved": True},
        ],
        "missing": [],
        "count": 3,
    }  # fmt: skip
    assert "ok" not in response  # a successful read carries no ok key


def test_legacy_rows_without_source_or_stamp_and_with_broken_json(db, app):  # spec §5.14 (as for recall)
    add_memories(
        db,
        {"content": "blank fields", "source": "", "timestamp": ""},
        {"content": "bad json", "source": "{nope"},
        {"content": "bare string", "source": '"legacy"'},
    )
    items = get_contents(app, agent_id="b", refs=["mem:1", "mem:2", "mem:3"])["items"]
    assert items[0] == {"ref": "mem:1", "content": "blank fields"}
    assert items[1]["source"] == {} and items[2]["source"] == "legacy"


def test_a_row_is_served_every_time_it_is_asked_for(db, app):
    add_memories(db, {"content": "one"})
    assert refs_of(get_contents(app, agent_id="b", refs=["mem:1", "mem:1"])) == ["mem:1", "mem:1"]


# -- ownership and refs --------------------------------------------------------------------


def test_another_agents_row_is_missing_like_a_row_that_does_not_exist(db, app):  # spec GC-2
    add_memories(db, {"content": "mine"}, {"content": "theirs", "agent_id": "other"})
    add_episodes(db, {"summary": "their episode", "agent_id": "other"})
    response = get_contents(app, agent_id="b", refs=["mem:2", "ep:1", "mem:99", "mem:1"])
    assert refs_of(response) == ["mem:1"]
    assert response["missing"] == ["mem:2", "ep:1", "mem:99"]
    # The empty agent is an agent like any other, not a wildcard: it owns nothing here.
    assert get_contents(app, agent_id="other", refs=["mem:1"])["missing"] == ["mem:1"]


def test_project_and_channel_do_not_hide_an_owned_row(db, app):  # spec GC-2
    add_memories(db, {"content": "scoped", "project_id": "p", "channel": "c"})
    assert get_contents(app, agent_id="b", refs=["mem:1"])["items"][0]["content"] == "scoped"


def test_range_refusals_come_after_ownership(db, app):  # spec GR-2, GC-6
    add_memories(db, {"content": "theirs", "agent_id": "other"})
    response = get_contents(app, agent_id="b", refs=[{"ref": "mem:1", "span": [5, 1]}, {"ref": "mem:1", "node": 0}])
    assert response["missing"] == ["mem:1", "mem:1"] and "unresolved" not in response


@pytest.mark.parametrize(
    "bad",
    [
        "bogus", "mem:", "mem:abc", "MEM:1", " mem:1", "mem:1 ", "mem:+1", "mem:1.0", "mem:1e0", "mem:0x1",
        "mem:1_0", "mem:\uff11", "ep:\u0663", "mem:0", "mem:-1", "m:1", "episode:1", "mem:1\n",
        "mem:9223372036854775808", "mem:99999999999999999999999", "mem:" + "1" * 5000,
    ],
)  # fmt: skip
def test_malformed_refs_are_missing_and_never_fail_the_batch(db, app, bad):  # spec GC-3
    add_memories(db, {"content": "row one"})
    response = get_contents(app, agent_id="b", refs=[bad, "mem:1"])
    assert response["missing"] == [bad] and refs_of(response) == ["mem:1"]


def test_ref_parsing_is_strict_ascii_decimal_with_leading_zeros_read_through():  # spec GC-3, assoc §0.3
    assert parse_ref("mem:7") == ("mem", 7) == parse_ref("mem:007")
    assert parse_ref("ep:9223372036854775807") == ("ep", 2**63 - 1)
    for bad in ("mem:9223372036854775808", "mem:0", "mem:000", "mem:+7", "mem:7 ", "mem:\u0667", "x:7", None, 7):
        assert parse_ref(bad) is None, bad


def test_leading_zeros_name_the_row_and_the_item_echoes_the_ref_as_sent(db, app):  # assoc §0.3
    add_memories(db, *({"content": f"row {i}"} for i in range(7)))
    response = get_contents(app, agent_id="b", refs=["mem:007"])
    assert response["items"][0]["ref"] == "mem:007" and response["items"][0]["content"] == "row 6"


# -- the batch budget ----------------------------------------------------------------------


def test_the_budget_admits_exactly_40000_and_defers_the_rest_as_sent(db, app):  # spec GC-4, GC-5, §6 item 13
    add_memories(
        db,
        {"content": "a" * 16000},
        {"content": "b" * 16000},
        {"content": "c" * (BATCH_BUDGET - 32000 - 3 * OVERHEAD)},  # total exactly 40,000
        {"content": "d" * (BATCH_BUDGET - 32000 - 3 * OVERHEAD + 1)},  # one character over
    )
    fits = get_contents(app, agent_id="b", refs=["mem:1", "mem:2", "mem:3"])
    assert refs_of(fits) == ["mem:1", "mem:2", "mem:3"]
    assert sum(item_cost(i) for i in fits["items"]) == BATCH_BUDGET
    assert "deferred" not in fits and "budget_chars" not in fits

    later = ["mem:4", "bogus", {"ref": "mem:1", "node": 0}, "mem:99", {"ref": "mem:1", "span": [9, 1]}]
    over = get_contents(app, agent_id="b", refs=["nope", "mem:1", "mem:2", *later])
    assert refs_of(over) == ["mem:1", "mem:2"] and over["count"] == 2
    assert over["missing"] == ["nope"]  # judged before the budget ran out
    assert over["deferred"] == later  # objects and malformed refs included, unvalidated
    assert over["budget_chars"] == BATCH_BUDGET


def test_every_field_counts_and_non_ascii_counts_as_characters(db, app):  # spec GC-4
    text = "日" * (BATCH_BUDGET - 32000 - 3 * OVERHEAD)
    add_memories(db, {"content": "a" * 16000}, {"content": "b" * 16000},
                 {"content": text, "source": '{"type": "User", "id": "日本", "name": ""}'})  # fmt: skip
    assert get_contents(app, agent_id="b", refs=["mem:1", "mem:2", "mem:3"])["count"] == 3
    add_memories(db, {"content": text, "msg_id": "x", "channel": "c"})  # the one-character id tips it over
    assert get_contents(app, agent_id="b", refs=["mem:1", "mem:2", "mem:4"])["deferred"] == ["mem:4"]


def test_the_first_row_is_whole_however_long(db, app):  # spec GC-4
    add_memories(db, {"content": "x" * 100_000}, {"content": "small"})
    response = get_contents(app, agent_id="b", refs=["mem:99", "mem:1", "mem:2"])
    assert response["items"][0]["content"] == "x" * 100_000
    assert response["deferred"] == ["mem:2"] and response["missing"] == ["mem:99"]


def test_the_budget_does_not_follow_the_content_cap(db):  # spec GC-4
    app = make_app(db, MAX_CONTENT_LENGTH="100000")
    add_memories(db, *({"content": str(i) * 30000} for i in range(3)))
    response = get_contents(app, agent_id="b", refs=["mem:1", "mem:2", "mem:3"])
    assert refs_of(response) == ["mem:1"] and response["deferred"] == ["mem:2", "mem:3"]


def test_a_preview_cap_of_zero_lifts_the_budget(
    db,
):  # configuration seed (CPERSONA_RECALL_PREVIEW_CHARS); differs from 2.6.14
    app = make_app(db, RECALL_PREVIEW_CHARS="0")
    add_memories(db, *({"content": str(i) * 16000} for i in range(5)))
    response = get_contents(app, agent_id="b", refs=[f"mem:{i}" for i in range(1, 6)])
    assert response["count"] == 5 and "deferred" not in response and "budget_chars" not in response


def test_only_the_served_slice_counts(db, app):  # spec GC-7, GR-9
    add_memories(db, {"content": "a" * 16000}, {"content": "b" * 16000}, {"content": "c" * 16000})
    response = get_contents(app, agent_id="b", refs=["mem:1", "mem:2", {"ref": "mem:3", "span": [0, 10]}])
    assert response["count"] == 3 and response["items"][2]["content"] == "c" * 10
    # The range object is part of the cost, as JSON text.
    cost = item_cost(response["items"][2])
    assert cost == 10 + OVERHEAD + len('{"span": [0, 10], "content_len": 16000}')


# -- ranges --------------------------------------------------------------------------------


def test_span_serves_exact_characters_and_clamps_the_end(db, app):  # spec GC-6, GR-4
    add_memories(db, {"content": "0123456789"})
    response = get_contents(app, agent_id="b", refs=[
        {"ref": "mem:1", "span": [2, 5]}, {"ref": "mem:1", "span": [7, 999]}, {"ref": "mem:1", "span": [9, 10]},
    ])  # fmt: skip
    assert [(i["content"], i["range"]) for i in response["items"]] == [
        ("234", {"span": [2, 5], "content_len": 10}),
        ("789", {"span": [7, 10], "content_len": 10}),
        ("9", {"span": [9, 10], "content_len": 10}),
    ]
    assert response["items"][0]["source"] == SOURCE_OBJ and response["items"][0]["timestamp"] == STAMP


def test_episode_offsets_skip_the_label_and_the_slice_has_none(db, app):  # spec GR-8
    add_episodes(db, {"summary": "Episode summary text here"})
    response = get_contents(app, agent_id="b", refs=[{"ref": "ep:1", "span": [0, 7]}, "ep:1"])
    assert response["items"][0]["content"] == "Episode"
    assert response["items"][0]["range"] == {"span": [0, 7], "content_len": 25}
    assert response["items"][0]["resolved"] is False
    assert response["items"][1]["content"] == "[Episode] Episode summary text here"


@pytest.mark.parametrize(
    "entry,reason",
    [
        ({"span": [10, 11]}, "span_out_of_range"),  # start at the end of the text
        ({"span": [5000, 6000]}, "span_out_of_range"),
        ({"span": [3, 3]}, "invalid_range"),  # empty
        ({"span": [4, 2]}, "invalid_range"),
        ({"span": [-1, 2]}, "invalid_range"),
        ({"span": [0, 5.0]}, "invalid_range"),  # not an integer, as 2.6.14 answers
        ({"span": [True, 5]}, "invalid_range"),  # booleans are not integers
        ({"span": [0, 1, 2]}, "invalid_range"),
        ({"span": 3}, "invalid_range"),
        ({"span": None}, "invalid_range"),
        ({"span": [0, 1], "node": 0}, "invalid_range"),  # more than one kind
        ({"node": 0, "block": 0}, "invalid_range"),
        ({"node": [2, 1]}, "invalid_range"),
        ({"node": -1}, "invalid_range"),
        ({"node": "0"}, "invalid_range"),
        ({"block": [0]}, "invalid_range"),
        ({"span": [0, 2], "revision": 5}, "invalid_range"),  # a revision must be text
        ({"node": 0}, "no_current_nodes"),  # no record has nodes yet (GR-10)
        ({"node": [0, 3]}, "no_current_nodes"),
        ({"block": 0}, "no_current_blocks"),  # GR-6: no block rows are built (spec decision 6, §12 point 8)
    ],
)
def test_ranges_that_cannot_be_served_exactly_are_unresolved_never_widened(db, app, entry, reason):  # spec GR-1, GR-3
    add_memories(db, {"content": "0123456789"})
    response = get_contents(app, agent_id="b", refs=[{"ref": "mem:1", **entry}, "mem:1"])
    assert response["unresolved"] == [{"ref": "mem:1", "reason": reason}]
    assert [i.get("range") for i in response["items"]] == [None]  # only the plain ref was served, whole
    assert response["missing"] == []


def test_a_plain_object_ref_is_the_whole_row(db, app):  # spec §7.1
    add_memories(db, {"content": "whole"})
    assert get_contents(app, agent_id="b", refs=[{"ref": "mem:1"}])["items"] == [
        {"ref": "mem:1", "content": "whole", "source": SOURCE_OBJ, "timestamp": STAMP}
    ]


def test_revision_is_twelve_hex_digits_of_sha256_of_the_stored_text(db, app):  # spec GR-7
    text = "short row about rotation"
    assert revision_of(text) == hashlib.sha256(text.encode()).hexdigest()[:12] == "dadf178a581a"
    add_episodes(db, {"summary": "an episode"})
    digest = revision_of("an episode")  # the summary, not the labelled display text
    response = get_contents(app, agent_id="b", refs=[{"ref": "ep:1", "span": [0, 2], "revision": digest}])
    assert response["items"][0]["content"] == "an"


def test_a_stale_revision_refuses_and_is_checked_before_the_range(db, app):  # spec GR-2, GR-7, GR-11
    add_memories(db, {"content": "short row about rotation"})
    good = revision_of("short row about rotation")
    refs = [
        {"ref": "mem:1", "span": [0, 5], "revision": good},
        {"ref": "mem:1", "span": [0, 5], "revision": good.upper()},
        {"ref": "mem:1", "span": [0, 5], "revision": good[:6]},
        {"ref": "mem:1", "span": [0, 5], "revision": hashlib.sha256(b"short row about rotation").hexdigest()},
        {"ref": "mem:1", "span": [0, 5], "revision": ""},
        {"ref": "mem:1", "node": 0, "revision": "deadbeef0000"},  # stale wins over no_current_nodes
        {"ref": "mem:1", "span": [500, 600], "revision": "deadbeef0000"},  # and over span_out_of_range
    ]
    response = get_contents(app, agent_id="b", refs=refs)
    assert [i["content"] for i in response["items"]] == ["short"]
    assert [u["reason"] for u in response["unresolved"]] == ["stale_revision"] * 6

    with app.db.write() as session:  # the record is rewritten: the old digest no longer serves
        session.execute(update(Memory).where(Memory.id == 1).values(content="short row, rewritten"))
    after = get_contents(app, agent_id="b", refs=[{"ref": "mem:1", "span": [0, 5], "revision": good}])
    assert after["items"] == [] and after["unresolved"] == [{"ref": "mem:1", "reason": "stale_revision"}]


def test_a_revision_on_the_whole_row_form_is_checked_too(db, app):  # spec §7.1 table; differs from 2.6.14
    add_memories(db, {"content": "pinned text"})
    good = revision_of("pinned text")
    response = get_contents(app, agent_id="b", refs=[{"ref": "mem:1", "revision": good},
                                                     {"ref": "mem:1", "revision": "deadbeef0000"}])  # fmt: skip
    assert [i["content"] for i in response["items"]] == ["pinned text"]
    assert response["unresolved"] == [{"ref": "mem:1", "reason": "stale_revision"}]


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments,needle",
    [
        ({"agent_id": "", "refs": ["mem:1"]}, "agent_id is required"),
        ({"refs": ["mem:1"]}, "agent_id is required"),
        ({"agent_id": 5, "refs": ["mem:1"]}, "agent_id must be a string"),
        ({"agent_id": "b", "refs": []}, "non-empty list"),
        ({"agent_id": "b"}, "non-empty list"),
        ({"agent_id": "b", "refs": "mem:1"}, "non-empty list"),
        ({"agent_id": "b", "refs": ["mem:1"] * 21}, "too many refs (21; max 20)"),
    ],
)
def test_bad_arguments_are_refused_plainly(db, app, arguments, needle):  # spec §3.4 errors, GC-1, G-1
    add_memories(db, {"content": "row"})
    response = get_contents(app, **arguments)
    assert response == {"ok": False, "error": response["error"]} and needle in response["error"]


def test_entries_outside_the_schema_are_missing_not_crashes(db, app):  # in-process callers skip the schema
    add_memories(db, {"content": "row"})
    response = get_contents(app, agent_id="b", refs=[5, None, {"ref": 1}, {"span": [0, 1]}, ["mem:1"], "mem:1"])
    assert response["missing"] == [5, None, 1, None, ["mem:1"]] and response["count"] == 1


async def call(app, arguments):
    return await call_tool(app, default_registry(), GateChain(), "get_contents", arguments)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "arguments,detail",
    [
        ({"agent_id": "b", "refs": ["mem:1"] * 21}, "is too long"),
        ({"agent_id": "b", "refs": "mem:1"}, "is not of type 'array'"),
        ({"agent_id": "b", "refs": [5]}, "is not valid under any of the given schemas"),
        ({"agent_id": "b", "refs": [{"span": [0, 3]}]}, "'ref' is a required property"),
        ({"agent_id": "b", "refs": [{"ref": "mem:1", "node": -1}]}, ""),
        ({"agent_id": "b", "refs": [{"ref": "mem:1", "span": [0, 1, 2]}]}, "is too long"),
        ({"agent_id": "b", "refs": [{"ref": "mem:1", "revision": 5}]}, "is not of type 'string'"),
        ({"refs": ["mem:1"]}, "'agent_id' is a required property"),
    ],
)
async def test_schema_violations_are_input_validation_errors(db, app, arguments, detail):  # spec G-3, GC-1
    outcome = await call(app, arguments)
    assert outcome.is_error and outcome.payload["error"].startswith("Input validation error: ")
    assert detail in outcome.payload["error"]


@pytest.mark.anyio
async def test_the_tool_is_registered_and_answers_through_the_call_path(db, app):
    add_memories(db, {"content": "through the facade"})
    outcome = await call(app, {"agent_id": "b", "refs": ["mem:1", {"ref": "mem:1", "span": [0, 7]}], "extra": 1})
    assert not outcome.is_error
    assert [i["content"] for i in outcome.payload["items"]] == ["through the facade", "through"]
    refused = await call(app, {"agent_id": "b", "refs": ["mem:\ud800"]})  # spec G-6
    assert refused.payload["ok"] is False and "surrogate" in refused.payload["error"]


def test_twenty_huge_rows_are_read_in_bounded_time(db, app):  # bounded work: 20 refs, one read
    add_memories(db, *({"content": f"{i:02d}" * 500_000} for i in range(20)))
    app = make_app(db, RECALL_PREVIEW_CHARS="0")  # no budget: every row is served
    started = time.perf_counter()
    response = get_contents(app, agent_id="b", refs=[f"mem:{i}" for i in range(1, 21)])
    assert response["count"] == 20 and time.perf_counter() - started < 5
