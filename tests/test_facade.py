"""The MCP facade: declarations on the wire, the call path, the gate chain, the response wrapper.

Most tests drive the real server object through the SDK's in-process client,
with small test tools over a real App (real SQLite file) so that the call path
is exercised without depending on any one memory service.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

import cpersona
from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain, ToolCall
from cpersona.mcp.pause_gate import PassThrough
from cpersona.mcp.registry import READ_ONLY, Annotations, Registry, ToolSpec, by_keywords, keyword_tool
from cpersona.mcp.server import SERVER_NAME, build_server, declaration, instructions
from cpersona.mcp.stdio_lines import reparse, top_level_member
from cpersona.mcp.tools import default_registry
from cpersona.mcp.validation import MAX_DEPTH, MAX_TEXT_CHARS, conform, inspect_arguments, schema_violation
from cpersona.services.requests import keyword_request
from cpersona.services.responses import ToolFailure

pytestmark = pytest.mark.anyio

REFERENCE = json.loads((Path(__file__).parent / "e2e" / "reference_tools.json").read_text())
REFERENCE_TOOLS = {tool["name"]: tool for tool in REFERENCE["tools"]}
THE_SEVEN = ["store", "recall", "get_profile", "update_profile", "archive_episode", "list_memories", "list_episodes"]


def without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def description_paths(node: Any, path: str = "") -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        if isinstance(node.get("description"), str):
            found.add(path or "/")
        for key, value in node.items():
            if key != "description":
                found |= description_paths(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found |= description_paths(value, f"{path}/{i}")
    return found


# --- test tools -------------------------------------------------------------

SEEN: dict[str, Any] = {}


def echo(app, text: str, n: int = 1, flag: bool = False) -> dict:
    SEEN["echo"] = {"text": text, "n": n, "flag": flag, "thread": threading.get_ident()}
    return {"text": text, "n": n, "flag": flag}


def boom(app, text: str = "") -> dict:
    raise RuntimeError("the disk caught fire")


def refuse(app, text: str = "") -> dict:
    raise ToolFailure("not today", key="reason", result="rejected")


def not_a_dict(app) -> list:
    return [1, 2]


def surrogate_answer(app) -> dict:
    return {"text": "bad \ud800 text", "\udc00key": ["ok", "\ud83d"]}


def partial_service(app, text: str, n: int = 1, flag: bool = False) -> dict:  # "later" and "cue" are not carried out
    return {"text": text}


def make_schema(**extra_props: Any) -> dict:
    props = {
        "text": {"type": "string", "maxLength": 20},
        "n": {"type": "integer", "minimum": 0, "maximum": 100},
        "flag": {"type": "boolean", "default": False},
    }
    props.update(extra_props)
    return {"type": "object", "properties": props, "required": ["text"]}


def tool(name: str, description: str, schema: dict, annotations: Annotations, service, **more: Any) -> ToolSpec:
    if annotations.read_only is not True:
        more.setdefault("paused", PassThrough())
    return keyword_tool(
        name=name, description=description, input_schema=schema, annotations=annotations, service=service, **more
    )


def make_registry() -> Registry:
    rw = Annotations(read_only=False, destructive=False)
    return Registry(
        [
            tool("echo", "Echo.", make_schema(), READ_ONLY, echo),
            tool("boom", "Crashes.", {"type": "object", "properties": {"text": {"type": "string"}}}, rw, boom),
            tool("refuse", "Refuses.", {"type": "object", "properties": {"text": {"type": "string"}}}, rw, refuse),
            tool("not_a_dict", "Wrong type.", {"type": "object", "properties": {}}, READ_ONLY, not_a_dict),
            tool(
                "surrogate_answer", "Bad text out.", {"type": "object", "properties": {}}, READ_ONLY, surrogate_answer
            ),
            tool(
                "partial",
                "Declares two arguments it does not carry out.",
                make_schema(later={"type": "string", "default": ""}, cue={"type": "object"}),
                READ_ONLY,
                partial_service,
                unsupported=frozenset({"later", "cue"}),
            ),
        ]
    )


def payload(result) -> dict:
    """The JSON text and the structured content must be the same object."""
    assert len(result.content) == 1 and result.content[0].type == "text"
    parsed = json.loads(result.content[0].text)
    assert parsed == result.structured_content
    return parsed


# --- declarations ----------------------------------------------------------


async def test_lists_the_seven_tools_with_the_reference_schemas_and_annotations(app):  # spec G-3, T-6
    async with Client(build_server(app)) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(THE_SEVEN) <= set(tools)  # later issues add tools; each must match the reference
    for name, tool in tools.items():
        wire = tool.model_dump(by_alias=True, exclude_none=True)
        reference = REFERENCE_TOOLS[name]
        assert without_descriptions(wire["inputSchema"]) == reference["inputSchema"], name
        assert wire.get("annotations") == reference["annotations"], name
        assert wire.get("_meta") == reference["_meta"], name


def test_every_argument_a_reference_schema_describes_is_described_in_ours():
    import_path = Path("/work/ref-tools.json")
    if not import_path.exists():
        pytest.skip("the full reference dump (with descriptions) is not on this machine")
    full = {t["name"]: t for t in json.loads(import_path.read_text())["tools"]}
    for spec in default_registry():
        ours = declaration(spec).model_dump(by_alias=True, exclude_none=True)["inputSchema"]
        assert description_paths(ours) == description_paths(full[spec.name]["inputSchema"]), spec.name
        assert spec.description != full[spec.name]["description"], f"{spec.name}: write our own words"


async def test_server_identifies_itself_with_our_version(app):  # spec README decision 5, T-6
    async with Client(build_server(app)) as client:
        assert client.server_info.name == SERVER_NAME == "cloto-mcp-cpersona"
        assert client.server_info.version == cpersona.__version__
        # reconstruct is the recommended reader when it is offered, recall otherwise
        assert "store" in client.instructions and "reconstruct" in client.instructions


def test_instructions_name_only_tools_the_server_offers():
    text = instructions(Registry([spec for spec in default_registry() if spec.name == "store"]))
    assert "store" in text
    assert "recall" not in text and "archive_episode" not in text and "list_memories" not in text


@pytest.mark.parametrize(
    ("tool", "facts"),
    [
        (
            "store",
            [
                "result",
                "'stored'",
                "'skipped'",
                "'rejected'",
                "'duplicate (unique index)'",
                "resolved_agent_id",
                "locked:true|false",
                "persisted:false",
                "'no-persist'",
                "nodes:{status:'queued'}",
                "truncated:true",
                "message={content, id, source, timestamp, metadata}",
                "never both",
            ],
        ),
        (
            "recall",
            [
                "reconstruct",
                "LAST row",
                "gate_fallback:true",
                "CPERSONA_CONFIDENCE_ORDERING=legacy",
                "800 characters",
                "CPERSONA_RECALL_EXCERPT_CHARS",
                "' … '",
                "excerpt_basis",
                "get_contents",
                "200,000",
                "full_content_budget_chars",
                "match_reason {signal, score, ...}",
                "rsf",
                "cosine",
                "prior",
            ],
        ),
        ("get_profile", ["profile"]),
        ("update_profile", ["2000", "CPERSONA_MAX_PROFILE_LENGTH", "truncated:true", "not kept anywhere"]),
        ("archive_episode", ["summary", "keywords", "resolved", "no language model", "nodes:{status:'queued'}"]),
        (
            "list_memories",
            [
                "500",
                "budget_rows",
                "export_memories",
                "1,000,000",
                "CPERSONA_RECALL_PREVIEW_CHARS",
                "content_truncated",
                "content_len",
                "budget_chars",
                "own agent_id",
                "preview cap of 0",
            ],
        ),
        (
            "list_episodes",
            [
                "200",
                "budget_rows",
                "800,000",
                "summary_truncated/summary_len",
                "keywords_truncated/keywords_len",
                "budget_chars",
                "export_memories",
            ],
        ),
    ],
)
def test_descriptions_carry_the_facts_of_the_users_tool_descriptions(tool, facts):
    description = default_registry().get(tool).description
    for fact in facts:
        assert fact in description, f"{tool}: {fact!r} missing"


def test_registry_refuses_a_tool_declared_twice():
    spec = tool("echo", "Echo.", make_schema(), READ_ONLY, echo)
    with pytest.raises(ValueError, match="declared twice"):
        Registry([spec, spec])


def test_a_request_must_carry_every_declared_argument():
    # What the schema declares, the request carries (or the declaration says it is not carried out).
    schema = make_schema(later={"type": "string"})
    with pytest.raises(ValueError, match="its request carries"):
        Registry(
            [
                ToolSpec(
                    "echo",
                    "Echo.",
                    schema,
                    READ_ONLY,
                    by_keywords(echo),
                    request=keyword_request("echo", tuple(make_schema()["properties"])),
                )
            ]
        )


# --- the call path -----------------------------------------------------------


async def test_success_is_one_json_text_plus_the_same_structured_content(app):
    async with Client(build_server(app, make_registry())) as client:
        result = await client.call_tool("echo", {"text": "日本語のメモ"})
    assert result.is_error is False
    assert payload(result) == {"text": "日本語のメモ", "n": 1, "flag": False}
    assert "日本語のメモ" in result.content[0].text  # ensure_ascii=False: readable, not \\u escapes


async def test_service_runs_off_the_event_loop_thread(app):
    loop_thread = threading.get_ident()
    async with Client(build_server(app, make_registry())) as client:
        await client.call_tool("echo", {"text": "x"})
    assert SEEN["echo"]["thread"] != loop_thread


async def test_unknown_keys_are_dropped_before_the_service(app):  # spec G-5
    async with Client(build_server(app, make_registry())) as client:
        result = await client.call_tool("echo", {"text": "x", "bogus": 1, "also": {"deep": True}})
    assert result.is_error is False
    assert payload(result) == {"text": "x", "n": 1, "flag": False}


async def test_integral_float_reaches_the_service_as_int(app):
    async with Client(build_server(app, make_registry())) as client:
        result = await client.call_tool("echo", {"text": "x", "n": 5.0})
    assert payload(result)["n"] == 5 and isinstance(SEEN["echo"]["n"], int)


@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        ({"text": "x", "n": 101}, "101 is greater than the maximum of 100"),
        ({"text": "x", "n": -1}, "-1 is less than the minimum of 0"),
        ({"text": "x", "n": "5"}, "'5' is not of type 'integer'"),
        ({"text": "x", "n": True}, "True is not of type 'integer'"),
        ({"text": "x", "n": 1.5}, "1.5 is not of type 'integer'"),
        ({"n": 1}, "'text' is a required property"),
        ({"text": 5}, "5 is not of type 'string'"),
        ({"text": "x" * 21}, "is too long"),
        ({"text": None}, "None is not of type 'string'"),
    ],
)
async def test_schema_violations_are_input_validation_errors(app, arguments, detail):  # spec G-3
    async with Client(build_server(app, make_registry())) as client:
        result = await client.call_tool("echo", arguments)
        after = await client.call_tool("echo", {"text": "still serving"})
    assert result.is_error is True
    body = payload(result)
    assert body["ok"] is False and body["error"].startswith("Input validation error: ")
    assert detail in body["error"]
    assert "echo" not in SEEN or SEEN["echo"]["text"] == "still serving"
    assert payload(after)["text"] == "still serving"


async def test_unknown_tool_is_an_error_and_the_server_keeps_serving(app):
    async with Client(build_server(app, make_registry())) as client:
        result = await client.call_tool("no_such_tool", {})
        after = await client.call_tool("echo", {"text": "next"})
    assert result.is_error is True
    assert payload(result) == {"ok": False, "error": "Unknown tool: no_such_tool"}
    assert payload(after)["text"] == "next"


async def test_a_crash_is_logged_and_answered_and_the_server_keeps_serving(app, caplog):  # spec G-4
    caplog.set_level(logging.ERROR, logger="cpersona.mcp.dispatch")
    async with Client(build_server(app, make_registry())) as client:
        result = await client.call_tool("boom", {})
        after = await client.call_tool("echo", {"text": "next"})
    assert result.is_error is True
    assert payload(result) == {"ok": False, "error": "RuntimeError: the disk caught fire"}
    record = next(r for r in caplog.records if "boom" in r.getMessage())
    assert record.exc_info and record.exc_info[0] is RuntimeError  # traceback goes to the log
    assert payload(after)["text"] == "next"


async def test_a_tool_failure_is_the_services_answer_not_an_mcp_error(app):  # spec G-1
    async with Client(build_server(app, make_registry())) as client:
        result = await client.call_tool("refuse", {})
    assert result.is_error is False
    assert payload(result) == {"ok": False, "result": "rejected", "reason": "not today"}


async def test_a_service_returning_a_non_dict_is_reported_as_a_crash(app):
    async with Client(build_server(app, make_registry())) as client:
        result = await client.call_tool("not_a_dict", {})
    assert result.is_error is True
    assert payload(result)["error"].startswith("TypeError: service for not_a_dict returned list")


async def test_lone_surrogates_in_an_answer_are_replaced_not_fatal(app):
    async with Client(build_server(app, make_registry())) as client:
        result = await client.call_tool("surrogate_answer", {})
        after = await client.call_tool("echo", {"text": "next"})
    assert payload(result) == {"text": "bad \ufffd text", "\ufffdkey": ["ok", "\ufffd"]}
    assert payload(after)["text"] == "next"


async def test_lone_surrogate_in_arguments_is_refused_in_the_tools_own_shape(app):  # spec G-6
    async with Client(build_server(app, make_registry())) as client:
        in_value = await client.call_tool("refuse", {"text": "a\ud800b"})
    assert in_value.is_error is False
    assert payload(in_value) == {
        "ok": False,
        "error": "$.text contains a lone UTF-16 surrogate, which is not valid text; nothing was done",
    }
    # The SDK client rewrites a surrogate in a key before sending, so call the path directly.
    SEEN.pop("echo", None)
    in_key = await call_tool(app, make_registry(), GateChain(), "echo", {"text": "fine", "\udfffodd": 1})
    assert in_key.payload["ok"] is False and "lone UTF-16 surrogate" in in_key.payload["error"]
    assert "echo" not in SEEN


async def test_declared_argument_the_server_does_not_carry_out_is_refused_unless_at_its_default(app):
    async with Client(build_server(app, make_registry())) as client:
        at_default = await client.call_tool("partial", {"text": "x", "later": "", "flag": False})
        given = await client.call_tool("partial", {"text": "x", "cue": {"after": "2026-01-01"}})
    assert payload(at_default) == {"text": "x"}
    assert payload(given) == {"ok": False, "error": "cue is not supported by this server yet; nothing was done"}


# --- bounds and validation helpers ------------------------------------------


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def test_depth_bound_counts_levels_below_the_arguments_object():
    assert inspect_arguments({"m": nested(MAX_DEPTH - 1)}).bound_crossed is None
    crossed = inspect_arguments({"m": nested(MAX_DEPTH)}).bound_crossed
    assert crossed and f"deeper than {MAX_DEPTH} levels" in crossed


def test_walk_is_iterative_so_ten_thousand_levels_cost_nothing():
    assert "deeper than" in inspect_arguments({"m": nested(10_000)}).bound_crossed
    lists: object = 1
    for _ in range(MAX_DEPTH + 1):
        lists = [lists]
    assert "deeper than" in inspect_arguments({"m": lists}).bound_crossed


def test_other_bounds():
    assert "more than 100000 values" in inspect_arguments({"a": list(range(100_001))}).bound_crossed
    assert inspect_arguments({"a": "x" * (MAX_TEXT_CHARS - 1)}).bound_crossed is None  # the key counts too
    assert "characters of text" in inspect_arguments({"a": "x" * (MAX_TEXT_CHARS + 1)}).bound_crossed
    assert "wider than 64 bits" in inspect_arguments({"limit": 2**63}).bound_crossed
    assert inspect_arguments({"limit": 2**63 - 1, "low": -(2**63)}).bound_crossed is None
    assert "which JSON cannot carry" in inspect_arguments({"a": object()}).bound_crossed


def test_surrogate_walk_reports_the_path():
    assert inspect_arguments({"metadata": {"tags": ["ok", "x\ud800"]}}).lone_surrogate_at == "$.metadata.tags[1]"
    assert inspect_arguments({"content": "😀 pairs are fine"}).lone_surrogate_at is None
    assert inspect_arguments({"content": "NUL\x00 is text"}).lone_surrogate_at is None


def test_schema_messages_read_like_the_references():  # spec G-3 examples
    recall = default_registry().get("recall").input_schema
    # The reference's words, plus where the value sits (the reference does not say).
    assert schema_violation(recall, {"agent_id": "a", "query": "q", "limit": 101}) == (
        "101 is greater than the maximum of 100 (at $.limit)"
    )
    assert schema_violation(recall, {"agent_id": "a"}) == "'query' is a required property"
    cue = {"agent_id": "a", "query": "q", "time_cue": {"confidence": "maybe"}}
    assert "is not one of ['sure', 'likely', 'vague'] (at $.time_cue.confidence)" in schema_violation(recall, cue)


def test_conform_keeps_declared_keys_and_nested_unknowns():
    store = default_registry().get("store").input_schema
    kept = conform(store, {"content": "c", "agent_id": "a", "zzz": 1, "source": {"type": "User", "extra": 1}})
    assert kept == {"content": "c", "agent_id": "a", "source": {"type": "User", "extra": 1}}


# --- the gate chain -----------------------------------------------------------


async def test_empty_gate_chain_passes_the_call_through(app):
    outcome = await call_tool(app, make_registry(), GateChain(), "echo", {"text": "plain"})
    assert outcome.payload == {"text": "plain", "n": 1, "flag": False} and not outcome.is_error


async def test_gates_run_in_order_and_see_validated_arguments(app):
    order: list[str] = []

    def recording(label: str):
        async def gate(call: ToolCall, call_next):
            order.append(f"{label}:{sorted(call.arguments)}")
            response = await call_next(call)
            order.append(f"{label} done")
            return response

        return gate

    chain = GateChain([recording("outer"), recording("inner")])
    outcome = await call_tool(app, make_registry(), chain, "echo", {"text": "x", "junk": 1})
    assert outcome.payload["text"] == "x"
    assert order == ["outer:['text']", "inner:['text']", "inner done", "outer done"]


async def test_a_gate_can_answer_instead_of_the_service(app):
    async def paused(call: ToolCall, call_next):
        return {"ok": True, "persisted": False, "dry_run": True, "reason": f"{call.spec.name} paused"}

    SEEN.pop("echo", None)
    outcome = await call_tool(app, make_registry(), GateChain([paused]), "echo", {"text": "x"})
    assert outcome.payload == {"ok": True, "persisted": False, "dry_run": True, "reason": "echo paused"}
    assert "echo" not in SEEN


async def test_a_gate_can_amend_arguments_and_refuse_with_tool_failure(app):
    async def amend(call: ToolCall, call_next):
        return await call_next(call.with_arguments({**call.arguments, "n": 7}))

    async def deny(call: ToolCall, call_next):
        raise ToolFailure("permission_denied", tool=call.spec.name)

    amended = await call_tool(app, make_registry(), GateChain([amend]), "echo", {"text": "x"})
    denied = await call_tool(app, make_registry(), GateChain([deny]), "echo", {"text": "x"})
    assert amended.payload["n"] == 7
    assert denied.payload == {"ok": False, "tool": "echo", "error": "permission_denied"} and not denied.is_error


async def test_gates_are_not_reached_by_invalid_calls(app):
    reached: list[str] = []

    async def gate(call: ToolCall, call_next):
        reached.append(call.spec.name)
        return await call_next(call)

    await call_tool(app, make_registry(), GateChain([gate]), "echo", {"n": 1})
    await call_tool(app, make_registry(), GateChain([gate]), "echo", {"text": "\ud800"})
    assert reached == []


async def test_requests_are_served_concurrently(app):
    """A slow service must not hold up other calls (it runs in a worker thread)."""
    release = threading.Event()

    def slow(app) -> dict:
        release.wait(5)
        return {"slow": True}

    registry = make_registry()
    registry.add(tool("slow", "Slow.", {"type": "object", "properties": {}}, READ_ONLY, slow))
    async with Client(build_server(app, registry)) as client:
        results: dict[str, Any] = {}

        async def run_slow():
            results["slow"] = await client.call_tool("slow", {})

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_slow)
            await anyio.sleep(0.05)
            results["fast"] = await client.call_tool("echo", {"text": "fast"})
            release.set()
    assert payload(results["fast"])["text"] == "fast"
    assert payload(results["slow"]) == {"slow": True}


# --- stdio second chance helpers ---------------------------------------------


def test_top_level_member_finds_the_id_past_any_nesting():
    deep = '{"k":' * 10_000 + "1" + "}" * 10_000
    line = (
        '{"jsonrpc":"2.0","method":"tools/call","params":{"name":"store","arguments":{"metadata":%s,"id":"inner"}},"id":42}'
        % deep
    )
    assert top_level_member(line, "id") == 42
    assert top_level_member(line, "method") == "tools/call"
    assert top_level_member('{"id":"abc\\"d","method":"x"}', "id") == 'abc"d'
    assert top_level_member('{"id":null}', "id") is None
    assert top_level_member('{"method":"x"}', "id") is None


def test_reparse_accepts_lone_surrogate_escapes_the_sdk_refuses():
    line = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"store","arguments":{"content":"a\\ud800"}}}'
    message = reparse(line)
    assert message is not None and message.params["arguments"]["content"] == "a\ud800"
    assert reparse("{not json") is None
