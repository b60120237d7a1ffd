"""Bad input to the seven tools, in-process through the real server and real services.

Each bad call must get a clear answer (an input validation error, or the tool's
own refusal), must write nothing, and must leave the server serving.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import Client

from cpersona.mcp.server import build_server

pytestmark = pytest.mark.anyio


def answer(result) -> dict:
    body = json.loads(result.content[0].text)
    assert body == result.structured_content
    return body


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


async def memory_count(client: Client) -> int:
    return answer(await client.call_tool("list_memories", {}))["count"]


# --- refused by the schema (spec G-3): is_error, "Input validation error: ..." ---

SCHEMA_VIOLATIONS = [
    ("recall", {"agent_id": "a"}, "'query' is a required property"),
    ("recall", {"query": "q"}, "'agent_id' is a required property"),
    ("recall", {"agent_id": "a", "query": "q", "limit": -1}, "-1 is less than the minimum of 0"),
    ("recall", {"agent_id": "a", "query": "q", "limit": 101}, "101 is greater than the maximum of 100"),
    ("recall", {"agent_id": "a", "query": "q", "limit": "5"}, "'5' is not of type 'integer'"),
    ("recall", {"agent_id": "a", "query": "q", "deep": "yes"}, "'yes' is not of type 'boolean'"),
    ("recall", {"agent_id": "a", "query": "q", "exclude_contents": "text"}, "'text' is not of type 'array'"),
    ("recall", {"agent_id": "a", "query": "q", "session_key": "k" * 257}, "is too long"),
    (
        "recall",
        {"agent_id": "a", "query": "q", "time_cue": {"after": "2026-01-01"}},
        "'confidence' is a required property",
    ),
    ("recall", {"agent_id": 7, "query": "q"}, "7 is not of type 'string'"),
    ("store", {"agent_id": "a", "content": 5}, "5 is not of type 'string'"),
    ("store", {"agent_id": "a", "content": "c", "id": "i" * 257}, "is too long"),
    ("store", {"agent_id": "a", "content": "c", "channel": "c" * 257}, "is too long"),
    ("store", {"agent_id": "a", "content": "c", "project_id": "p" * 257}, "is too long"),
    ("store", {"agent_id": "a", "content": "c", "timestamp": "t" * 65}, "is too long"),
    ("store", {"agent_id": "a", "content": "c", "metadata": "not an object"}, "is not of type 'object'"),
    ("store", {"agent_id": "a", "content": "c", "lock": "true"}, "'true' is not of type 'boolean'"),
    ("store", {"agent_id": "a", "content": "c", "source": ["User"]}, "is not of type 'object'"),
    ("store", {"agent_id": None, "content": "c"}, "None is not of type 'string'"),
    ("get_profile", {}, "'agent_id' is a required property"),
    ("update_profile", {"agent_id": "a"}, "'profile' is a required property"),
    ("update_profile", {"agent_id": "a", "profile": 123}, "123 is not of type 'string'"),
    ("archive_episode", {"agent_id": "a"}, "'summary' is a required property"),
    ("archive_episode", {"agent_id": "a", "summary": "s", "history": "not a list"}, "is not of type 'array'"),
    ("archive_episode", {"agent_id": "a", "summary": "s", "history": ["not an object"]}, "is not of type 'object'"),
    ("archive_episode", {"agent_id": "a", "summary": "s", "resolved": "yes"}, "'yes' is not of type 'boolean'"),
    ("list_memories", {"limit": "ten"}, "'ten' is not of type 'integer'"),
    ("list_memories", {"limit": 2.5}, "2.5 is not of type 'integer'"),
    ("list_episodes", {"agent_id": ["a"]}, "is not of type 'string'"),
]


@pytest.mark.parametrize(("tool", "arguments", "detail"), SCHEMA_VIOLATIONS)
async def test_schema_violations_are_answered_as_input_validation_errors(app, tool, arguments, detail):  # spec G-3
    async with Client(build_server(app)) as client:
        result = await client.call_tool(tool, arguments)
        body = answer(result)
        assert result.is_error is True
        assert body["ok"] is False and body["error"].startswith("Input validation error: ")
        assert detail in body["error"]
        assert await memory_count(client) == 0


BOUNDS = [
    ({"agent_id": "a", "content": "c", "metadata": nested(100)}, "nested deeper than 32 levels"),
    ({"agent_id": "a", "content": "c", "metadata": {"many": list(range(100_001))}}, "more than 100000 values"),
    ({"agent_id": "a", "content": "c", "metadata": {"n": 2**70}}, "wider than 64 bits"),
]


@pytest.mark.parametrize(("arguments", "detail"), BOUNDS)
async def test_requests_past_the_work_bounds_are_refused_before_validation(app, arguments, detail):
    async with Client(build_server(app)) as client:
        result = await client.call_tool("store", arguments)
        assert result.is_error is True
        assert answer(result)["error"].startswith("Input validation error: ") and detail in answer(result)["error"]
        assert await memory_count(client) == 0


async def test_integer_wider_than_sqlite_in_a_limit_is_refused(app):
    async with Client(build_server(app)) as client:
        result = await client.call_tool("list_memories", {"limit": 10**30})
    assert result.is_error is True and "wider than 64 bits" in answer(result)["error"]


# --- refused by the tool in its own shape (spec G-6) -------------------------------

LONE_SURROGATE_SHAPES = [
    ("store", {"agent_id": "a", "content": "bad \ud800"}, {"ok": False, "result": "rejected"}, "reason"),
    (
        "store",
        {"agent_id": "a", "content": "x", "lock": True, "source": {"name": "\udfff"}},
        {"ok": False, "result": "rejected", "locked": False},
        "reason",
    ),  # spec ST-12
    ("recall", {"agent_id": "a", "query": "q\udc00"}, {"ok": False, "messages": []}, "error"),
    (
        "archive_episode",
        {"agent_id": "a", "summary": "s", "keywords": "\ud800"},
        {"ok": False, "episode_id": None},
        "error",
    ),
    ("update_profile", {"agent_id": "a", "profile": "\ud800"}, {"ok": False, "profiles_updated": 0}, "reason"),
    ("get_profile", {"agent_id": "\ud800"}, {"ok": False}, "error"),
    ("list_memories", {"project_id": "\ud800"}, {"ok": False}, "error"),
    ("list_episodes", {"agent_id": "a\ud800"}, {"ok": False}, "error"),
]


@pytest.mark.parametrize(("tool", "arguments", "shape", "message_key"), LONE_SURROGATE_SHAPES)
async def test_lone_surrogates_are_refused_in_the_tools_own_shape(app, tool, arguments, shape, message_key):  # spec G-6
    async with Client(build_server(app)) as client:
        result = await client.call_tool(tool, arguments)
        body = answer(result)
        assert result.is_error is False
        assert set(body) == set(shape) | {message_key}
        assert {k: body[k] for k in shape} == shape
        assert "lone UTF-16 surrogate" in body[message_key]
        assert await memory_count(client) == 0


# --- accepted, and handled as documented ---------------------------------------------


async def test_unknown_arguments_are_ignored(app):  # spec G-5
    async with Client(build_server(app)) as client:
        stored = answer(await client.call_tool("store", {"agent_id": "a", "content": "kept", "colour": "blue"}))
        listed = answer(await client.call_tool("list_memories", {"agent_id": "a", "page": 2}))
    assert stored["result"] == "stored"
    assert [m["content"] for m in listed["memories"]] == ["kept"]


async def test_five_megabytes_of_content_are_cut_to_the_cap_not_refused(app):  # spec ST-3, SAN
    async with Client(build_server(app)) as client:
        stored = answer(await client.call_tool("store", {"agent_id": "a", "content": "word " * 1_000_000}))
        listed = answer(await client.call_tool("list_memories", {"agent_id": "a"}))
    assert stored["ok"] is True and stored["truncated"] is True
    assert len(listed["memories"][0]["content"]) <= 16_000


async def test_nul_bytes_are_refused_in_text_and_in_keys(app):
    # Decision 11 (the reference keeps NUL; removing it would change what was
    # stored): refused in the tool's own shape, naming field and position.
    async with Client(build_server(app)) as client:
        stored = answer(await client.call_tool("store", {"agent_id": "a", "content": "before\x00after"}))
        in_key = answer(await client.call_tool("store", {"agent_id": "a", "content": "c", "channel": "x\x00y"}))
        listed = answer(await client.call_tool("list_memories", {"agent_id": "a"}))
    assert (
        stored["result"] == "rejected"
        and "$.content contains the NUL character (U+0000) at position 6" in stored["reason"]
    )
    assert in_key["ok"] is False and in_key["result"] == "rejected" and "$.channel" in in_key["reason"]
    assert listed["memories"] == []


@pytest.mark.parametrize(("tool", "key"), [("list_memories", "memories"), ("list_episodes", "episodes")])
async def test_negative_list_limit_lists_nothing(app, tool, key):  # spec LM-2
    async with Client(build_server(app)) as client:
        await client.call_tool("store", {"agent_id": "a", "content": "one"})
        body = answer(await client.call_tool(tool, {"limit": -5}))
    assert body == {key: [], "count": 0}


async def test_unknown_tool_then_a_good_call(app):
    async with Client(build_server(app)) as client:
        unknown = await client.call_tool("forget_everything", {"agent_id": "a"})
        stored = answer(await client.call_tool("store", {"agent_id": "a", "content": "after the bad call"}))
    assert unknown.is_error is True and answer(unknown) == {"ok": False, "error": "Unknown tool: forget_everything"}
    assert stored["result"] == "stored"


async def test_a_run_of_bad_calls_leaves_the_server_serving_and_the_database_clean(app):
    async with Client(build_server(app)) as client:
        for tool, arguments, _ in SCHEMA_VIOLATIONS:
            await client.call_tool(tool, arguments)
        for arguments, _ in BOUNDS:
            await client.call_tool("store", arguments)
        for tool, arguments, _, _ in LONE_SURROGATE_SHAPES:
            await client.call_tool(tool, arguments)
        assert await memory_count(client) == 0
        stored = answer(await client.call_tool("store", {"agent_id": "a", "content": "good"}))
        assert stored["result"] == "stored"
        assert await memory_count(client) == 1
