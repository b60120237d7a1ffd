"""Per-client ACL (spec transport-and-config §4): the file, the classification, the gate, and HTTP isolation."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import make_app
from cpersona.mcp.acl import (
    ALL,
    READ,
    access_for,
    READ_WRITE,
    AclConfigError,
    AclGate,
    Principal,
    acl_gates,
    load_acl_file,
    parse_acl,
)
from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain, ToolCall
from cpersona.mcp.registry import Annotations, ToolSpec, keyword_tool
from cpersona.mcp.tools import default_registry
from test_http_transport import HttpServer, mcp_call

pytestmark = pytest.mark.anyio

REFERENCE_TOOLS = json.loads((Path(__file__).parent / "e2e" / "reference_tools.json").read_text())

FILE = {
    "clients": [
        {"client_id": "writer", "token": "tok-writer", "grants": {"alice": "read-write"}},
        {"client_id": "bobby", "token": "tok-bob", "grants": {"bob": "read-write", "alice": "read"}},
        {"client_id": "reader", "token": "tok-reader", "grants": {"*": "read", "prod": "none"}},
        {"client_id": "admin", "token": "tok-admin", "grants": {"*": "read-write"}},
        {"client_id": "oauth-app", "token": None, "grants": {"alice": "read"}},
        {"client_id": "local", "grants": {"alice": "read-write", "bob": "read"}},
    ]
}


def policy(document: dict[str, Any] = FILE, environ: dict[str, str] | None = None):
    return parse_acl(json.loads(json.dumps(document)), environ or {})


def with_clients(*clients: dict[str, Any]) -> dict[str, Any]:
    return {"clients": list(clients)}


# --- the file (ACL-1..ACL-7) --------------------------------------------------------


def test_a_valid_file_loads_every_client():  # spec ACL-1..ACL-4
    p = policy()
    assert set(p.clients) == {"writer", "bobby", "reader", "admin", "oauth-app", "local"}
    assert p.client("reader").grants == {"*": READ, "prod": 0}
    assert p.client("oauth-app").token is None


@pytest.mark.parametrize(
    "document, words",
    [
        ({"clients": []}, "non-empty"),
        ({"clients": [], "extra": 1}, "exactly"),
        ([], "exactly"),
        (with_clients({"client_id": "a", "token": "t", "grants": {}, "role": "x"}), "unknown key"),
        (with_clients({"client_id": "", "token": "t", "grants": {}}), "client_id"),
        (with_clients({"client_id": "a", "token": "t", "grants": {"x": "write"}}), "'write'"),
        (with_clients({"client_id": "a", "token": "t", "grants": {"": "read"}}), "agent pattern"),
        (with_clients({"client_id": "a", "token": "t", "grants": []}), "grants"),
        (with_clients({"client_id": "a", "grants": {}}), "token is required"),
        (with_clients({"client_id": "a", "token": "", "grants": {}}), "non-empty"),
        (with_clients({"client_id": "a", "token": "t\n", "grants": {}}), "whitespace"),
        (with_clients({"client_id": "a", "token": "tök", "grants": {}}), "ASCII"),
        (with_clients({"client_id": "a", "token": "t\x01x", "grants": {}}), "control"),
        (with_clients({"client_id": "a", "token": "pre-${X}", "grants": {}}), "partial"),
        (with_clients({"client_id": "a", "token": "${UNSET_VAR}", "grants": {}}), "UNSET_VAR"),
        (
            with_clients(
                {"client_id": "a", "token": "t", "grants": {}}, {"client_id": "a", "token": "u", "grants": {}}
            ),
            "twice",
        ),
        (
            with_clients(
                {"client_id": "a", "token": "t", "grants": {}}, {"client_id": "b", "token": "t", "grants": {}}
            ),
            "unique",
        ),
        (with_clients({"client_id": "local", "token": "t", "grants": {}}), "stdio principal"),
        (with_clients({"client_id": "a", "token": "t", "per_subject": True, "grants": {}}), "token: null"),
        (with_clients({"client_id": "a", "token": None, "per_subject": "yes", "grants": {}}), "per_subject"),
        (
            with_clients({"client_id": "web", "token": None, "per_subject": True, "grants": {"*": "read-write"}}),
            "not supported",
        ),
    ],
)
def test_every_defect_is_a_start_up_error_naming_the_problem(document, words):  # spec ACL-1..ACL-6
    with pytest.raises(AclConfigError) as err:
        parse_acl(document, {})
    assert words in str(err.value)


def test_a_token_may_come_from_the_environment():  # spec ACL-3
    p = parse_acl(with_clients({"client_id": "a", "token": "${TOK_A}", "grants": {}}), {"TOK_A": "from-env"})
    assert p.resolve_token(b"from-env") == Principal("a")
    assert p.resolve_token(b"${TOK_A}") is None


def test_a_file_readable_by_others_is_warned_about(tmp_path, caplog):  # spec ACL-6
    path = tmp_path / "acl.json"
    path.write_text(json.dumps(FILE))
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING):
        load_acl_file(path, {})
    assert "readable by group or others" in caplog.text
    caplog.clear()
    os.chmod(path, 0o600)
    load_acl_file(path, {})
    assert "readable" not in caplog.text


def test_a_file_that_is_not_json_is_refused(tmp_path):  # spec ACL-6
    path = tmp_path / "acl.json"
    path.write_text("{clients: []")
    with pytest.raises(AclConfigError, match="not valid JSON"):
        load_acl_file(path, {})


def test_tokens_resolve_exactly():  # spec ACL-8
    p = policy()
    assert p.resolve_token(b"tok-writer") == Principal("writer")
    for wrong in (b"", b"tok-write", b"tok-writerX", b"TOK-WRITER"):
        assert p.resolve_token(wrong) is None


# --- the classification (§4.4) ----------------------------------------------------------


def test_every_tool_of_the_reference_is_classified():  # spec ACL-14
    names = (
        {tool["name"] for tool in REFERENCE_TOOLS["tools"]}
        if isinstance(REFERENCE_TOOLS, dict)
        else {tool["name"] for tool in REFERENCE_TOOLS}
    )
    assert len(names) == 34
    registry = default_registry()
    assert names == set(registry.names())  # every one declared, each with its demand
    assert all(access_for(spec).demands is not None for spec in registry)


def demands(tool: str, arguments: dict[str, Any], **env: str) -> list[tuple[str, int]]:
    from cpersona.config import load_settings

    settings = load_settings({f"CPERSONA_{k.upper()}": v for k, v in env.items()})
    return [(d.agent, d.level) for d in access_for(default_registry().get(tool)).demands(arguments, settings)]


def test_demands_follow_the_table():  # spec §4.4, ACL-13
    assert demands("persistence_status", {}) == []
    assert demands("pause_persistence", {"session_key": "mine"}) == [(ALL, READ_WRITE)]
    assert demands("get_session_findings", {}) == [(ALL, READ)]
    assert demands("check_update", {}) == [(ALL, READ)]
    assert demands("check_update", {"apply": True}) == [(ALL, READ_WRITE)]
    assert demands("recall", {"agent_id": "alice", "query": "x"}) == [("alice", READ)]
    assert demands("list_memories", {}) == [(ALL, READ)]
    assert demands("list_memories", {"agent_id": ""}) == [(ALL, READ)]
    assert demands("list_memories", {"agent_id": 5}) == [(ALL, READ)]
    assert demands("delete_memory", {"memory_id": 3}) == [(ALL, READ_WRITE)]
    assert demands("store", {"agent_id": "a"}) == [("a", READ_WRITE)]
    assert demands("merge_memories", {"source_agent_id": "a", "target_agent_id": "b"}) == [
        ("a", READ),
        ("b", READ_WRITE),
    ]
    assert demands("merge_memories", {"source_agent_id": "a", "target_agent_id": "b", "mode": "move"}) == [
        ("a", READ_WRITE),
        ("b", READ_WRITE),
    ]
    assert demands("check_health", {"agent_id": "a"}) == [("a", READ)]
    assert demands("check_health", {"agent_id": "a", "fix": True}) == [("a", READ_WRITE), (ALL, READ_WRITE)]
    assert demands("check_health", {"agent_id": "a", "fix": True, "checks": ["duplicate_content"]}) == [
        ("a", READ_WRITE)
    ]
    assert demands("check_health", {"agent_id": "a", "fix": True, "checks": ["file_permissions"]}) == [
        ("a", READ_WRITE),
        (ALL, READ_WRITE),
    ]
    assert demands("deep_check", {"agent_id": "a", "fix": True}) == [("a", READ_WRITE)]
    assert demands("export_memories", {"agent_id": "a", "output_path": "/tmp/x"}) == [(ALL, READ_WRITE)]
    assert demands("import_memories", {"input_path": "/tmp/x", "target_agent_id": "a"}) == [(ALL, READ_WRITE)]


def test_export_and_import_under_an_export_dir_demand_the_agents_the_files_name(tmp_path):  # spec §4.4
    root = tmp_path / "exports"
    root.mkdir()
    env = {"export_dir": str(root)}
    assert demands("export_memories", {"agent_id": "a", "output_path": str(root / "new.jsonl")}, **env) == [
        ("a", READ_WRITE)
    ]
    owned = root / "bob.jsonl"
    owned.write_text(json.dumps({"_type": "header", "version": "cpersona-export/1.1", "agent_id": "bob"}) + "\n")
    assert demands("export_memories", {"agent_id": "a", "output_path": str(owned)}, **env) == [
        ("a", READ_WRITE),
        ("bob", READ_WRITE),
    ]
    everyone = root / "all.jsonl"
    everyone.write_text(
        json.dumps({"_type": "header", "version": "cpersona-export/1.1", "agent_id": ""})
        + "\n"
        + json.dumps({"_type": "memory", "agent_id": "carol", "content": "c"})
        + "\n"
    )
    assert demands("export_memories", {"agent_id": "a", "output_path": str(everyone)}, **env) == [
        ("a", READ_WRITE),
        (ALL, READ_WRITE),
    ]
    assert demands("import_memories", {"input_path": str(everyone), "target_agent_id": "a"}, **env) == [
        ("a", READ_WRITE),
        (ALL, READ),
    ]
    mixed = root / "mixed.jsonl"
    mixed.write_text(
        "\n".join(
            json.dumps(r)
            for r in (
                {"_type": "header", "version": "cpersona-export/1.1", "agent_id": "bob"},
                {"_type": "memory", "agent_id": "bob", "content": "b"},
                {"_type": "memory", "agent_id": "dave", "content": "d"},
            )
        )
        + "\n"
    )
    assert demands("import_memories", {"input_path": str(mixed)}, **env) == [
        (ALL, READ_WRITE),
        ("bob", READ),
        ("dave", READ),
    ]
    assert demands("import_memories", {"input_path": str(mixed), "target_agent_id": "t"}, **env) == [
        ("t", READ_WRITE),
        ("bob", READ),
        ("dave", READ),
    ]


# --- the gate ------------------------------------------------------------------------


def stub_spec(name: str) -> ToolSpec:
    """The real declaration of ``name``; a name the registry lacks is a tool that declares no demand."""
    real = default_registry().get(name)
    if real is not None:
        return real
    return keyword_tool(
        name=name,
        description="",
        input_schema={"type": "object", "properties": {}},
        annotations=Annotations(read_only=False),
        service=lambda app, **kw: {"ok": True},
    )


async def through_gate(app, tool: str, arguments: dict[str, Any], client: str | None) -> dict[str, Any]:
    gate = AclGate(policy(), app.settings)
    context = {"principal": Principal(client)} if client else {}

    async def service(call: ToolCall) -> dict[str, Any]:
        return {"ok": True, "ran": call.spec.name, "arguments": dict(call.arguments)}

    return await gate(ToolCall(app, stub_spec(tool), arguments, context), service)


# A tool whose writes depend on an argument is called in its writing form here.
WRITING_FORM = {"check_health": {"fix": True}, "deep_check": {"fix": True}, "check_update": {"apply": True}}
SCOPE_ARGUMENTS = ("agent_id", "source_agent_id", "target_agent_id")
READER = {"client_id": "r", "token": "tok-r", "grants": {"alice": "read", "*": "read"}}
WRITER = {"client_id": "w", "token": "tok-w", "grants": {"alice": "read-write", "*": "read-write"}}
EVERY_TOOL = [spec.name for spec in default_registry()]


def test_the_writing_forms_name_tools_that_write():
    registry = default_registry()
    assert len(EVERY_TOOL) >= 34
    assert all(registry.get(name) is not None and not registry.get(name).annotations.read_only for name in WRITING_FORM)


@pytest.mark.parametrize("tool", EVERY_TOOL)
async def test_a_tool_that_is_not_read_only_demands_a_read_write_grant(app, tool):  # spec ACL-10, §4.4
    # Over the whole registry, through the real gate with the real declaration: a read grant
    # (named and "*") never lets a writing tool through; a read-write grant does. A read-only
    # tool is never refused to a reader.
    spec = default_registry().get(tool)
    arguments = {name: "alice" for name in SCOPE_ARGUMENTS if name in spec.properties}
    arguments.update(WRITING_FORM.get(tool, {}))
    gate = AclGate(policy(with_clients(READER, WRITER)), app.settings)
    ran: list[str] = []

    async def service(call: ToolCall) -> dict[str, Any]:
        ran.append(call.spec.name)
        return {"ok": True}

    async def as_client(client: str) -> dict[str, Any]:
        return await gate(ToolCall(app, spec, dict(arguments), {"principal": Principal(client)}), service)

    as_reader = await as_client("r")
    if spec.annotations.read_only:
        assert as_reader == {"ok": True}, as_reader
    else:
        assert as_reader["error"] == "permission_denied" and as_reader["required"] == "read-write", as_reader
        assert ran == []
        assert await as_client("w") == {"ok": True}
        assert ran == [tool]


async def test_a_named_agent_denial_has_the_spec_shape(app):  # spec ACL-15
    denied = await through_gate(app, "store", {"agent_id": "bob", "content": "x"}, "writer")
    assert denied == {
        "ok": False,
        "error": "permission_denied",
        "tool": "store",
        "agent_id": "bob",
        "required": "read-write",
        "client_id": "writer",
        "result": "rejected",
    }
    locked = await through_gate(app, "store", {"agent_id": "bob", "content": "x", "lock": True}, "writer")
    assert locked["locked"] is False and locked["result"] == "rejected"
    assoc = await through_gate(app, "declare_associations", {"agent_id": "bob"}, "writer")
    assert assoc["result"] == "rejected"
    read = await through_gate(app, "recall", {"agent_id": "prod", "query": "q"}, "reader")
    assert read == {
        "ok": False,
        "error": "permission_denied",
        "tool": "recall",
        "agent_id": "prod",
        "required": "read",
        "client_id": "reader",
    }


async def test_all_agent_denials_explain_themselves(app):  # spec ACL-16
    omitted = await through_gate(app, "list_memories", {}, "writer")
    assert omitted["agent_id"] == "*" and omitted["detail"] == (
        "no agent scope was sent, so the call resolved to the all-agents demand — pass agent_id to scope it"
    )
    merge = await through_gate(app, "merge_memories", {"source_agent_id": "", "target_agent_id": ""}, "writer")
    assert merge["required"] == "read" and merge["detail"].endswith(
        "pass source_agent_id and target_agent_id to scope it"
    )
    star = await through_gate(app, "list_memories", {"agent_id": "*"}, "writer")
    assert star["detail"] == (
        'agent_id was sent as "*", so the call demands every agent at once — this client '
        "holds no all-agents grant, and named grants never add up to one. Name a single "
        "agent to scope it"
    )
    weakest = await through_gate(app, "check_health", {"agent_id": "*"}, "reader")
    assert weakest["detail"] == (
        'agent_id was sent as "*", so the call demands every agent at once — a sweep is '
        "satisfied only at the weakest grant this client holds (none on prod). Name a "
        "single agent to scope it"
    )
    non_string = await through_gate(app, "list_memories", {"agent_id": 7}, "writer")
    assert non_string["detail"] == "non-string agent_id argument resolved to the all-agents demand"
    export = await through_gate(app, "export_memories", {"agent_id": "alice", "output_path": "/tmp/x"}, "writer")
    assert export["required"] == "read-write" and export["detail"] == (
        "CPERSONA_EXPORT_DIR is unset, so the path argument names any file the caller chooses under the "
        "database directory's exports/ folder, which no agent owns on record, and the call is not confined to "
        "one agent; no agent scope narrows this call — it demands every agent by its "
        "nature, and this client holds no all-agents grant, and named grants never add up to one"
    )
    repair = await through_gate(app, "check_health", {"agent_id": "alice", "fix": True}, "writer")
    assert (
        repair["agent_id"] == "*"
        and "block_index, coarse_index, dedup_msg_id_index, file_permissions" in (repair["detail"])
    )
    pause = await through_gate(app, "pause_persistence", {"session_key": "k"}, "writer")
    assert pause["required"] == "read-write" and "session_key" in pause["detail"]


async def test_the_me_sentinel_is_refused_without_a_per_subject_partition(app):  # spec ACL-21
    for args in ({"agent_id": "@me"}, {"source_agent_id": "alice", "target_agent_id": "@me"}):
        denied = await through_gate(app, "merge_memories" if "source_agent_id" in args else "store", args, "admin")
        assert denied["error"] == "permission_denied" and denied["agent_id"] == "@me"
        assert "per_subject" in denied["detail"]


async def test_a_sweep_needs_a_star_grant_and_is_met_at_the_weakest(app):  # spec ACL-11, ACL-12
    assert (await through_gate(app, "get_session_findings", {}, "admin"))["ok"] is True
    assert (await through_gate(app, "get_session_findings", {}, "reader"))["ok"] is False  # prod: none
    assert (await through_gate(app, "recall", {"agent_id": "anyone", "query": "q"}, "reader"))["ok"] is True
    assert (await through_gate(app, "store", {"agent_id": "anyone"}, "reader"))["required"] == "read-write"
    # bobby holds bob and alice by name: they never add up to "*".
    assert (await through_gate(app, "get_session_findings", {}, "bobby"))["ok"] is False


async def test_unknown_principals_unclassified_tools_and_missing_principals_are_denied(app, caplog):  # ACL-9, ACL-14
    stranger = await through_gate(app, "recall", {"agent_id": "alice", "query": "q"}, "oauth:https://i:app")
    assert stranger["client_id"] == "oauth:https://i:app"
    assert stranger["detail"].startswith("this client has no entry in the ACL grant table")
    assert (await through_gate(app, "persistence_status", {}, "oauth:https://i:app"))["ok"] is True
    # A tool that declares no demand is judged by its annotations: a write, here with no agent named,
    # demands read-write on every agent (ACL-13, ACL-14: never wider than what it writes).
    undeclared = await through_gate(app, "brand_new_tool", {}, "reader")
    assert undeclared["error"] == "permission_denied" and (undeclared["agent_id"], undeclared["required"]) == (
        "*",
        "read-write",
    )
    with caplog.at_level(logging.ERROR):
        nobody = await through_gate(app, "persistence_status", {}, None)
    assert nobody["detail"] == "no principal resolved" and "no principal" in caplog.text


async def test_store_without_agent_id_goes_to_the_one_writable_agent(db):  # spec ACL-17, ACL-18
    app = make_app(db)
    chain = GateChain([AclGate(policy(), app.settings)])
    registry = default_registry()
    out = await call_tool(
        app, registry, chain, "store", {"content": "implicit owner"}, {"principal": Principal("writer")}
    )
    assert out.payload["ok"] is True and out.payload["resolved_agent_id"] == "alice"
    with sqlite3.connect(db.path) as conn:
        assert conn.execute("SELECT agent_id FROM memories").fetchall() == [("alice",)]
    # admin can write everywhere, so there is no single agent to fill in: the store itself refuses.
    admin = await call_tool(app, registry, chain, "store", {"content": "whose?"}, {"principal": Principal("admin")})
    assert admin.payload["ok"] is False and "resolved_agent_id" not in admin.payload
    # reader writes nowhere: the omitted scope is the all-agents demand, denied.
    reader = await call_tool(app, registry, chain, "store", {"content": "x"}, {"principal": Principal("reader")})
    assert reader.payload["error"] == "permission_denied" and reader.payload["agent_id"] == "*"


async def test_stdio_runs_as_local(db):  # spec T-2, ACL-19
    app = make_app(db)
    chain = GateChain(acl_gates(policy(), app.settings, "stdio"))
    registry = default_registry()
    stored = await call_tool(app, registry, chain, "store", {"content": "via stdio"})
    assert stored.payload["resolved_agent_id"] == "alice"
    denied = await call_tool(app, registry, chain, "store", {"agent_id": "bob", "content": "x"})
    assert denied.payload["client_id"] == "local" and denied.payload["required"] == "read-write"
    assert (await call_tool(app, registry, chain, "list_memories", {"agent_id": "bob"})).payload.get("ok") is not False
    over_http = GateChain(acl_gates(policy(), app.settings, "streamable-http"))
    assert (await call_tool(app, registry, over_http, "list_memories", {"agent_id": "bob"})).payload[
        "detail"
    ] == "no principal resolved"


# --- two clients over HTTP ------------------------------------------------------------


@pytest.fixture
def acl_server(tmp_path):
    path = tmp_path / "acl.json"
    path.write_text(json.dumps(FILE))
    os.chmod(path, 0o600)
    server = HttpServer(tmp_path, CPERSONA_ACL_FILE=str(path), CPERSONA_AUTH_TOKEN="legacy-token")
    yield server
    server.stop()


async def test_two_clients_never_reach_each_others_agent_over_http(acl_server):  # spec §4, ACL-8, ACL-15
    url = acl_server.url
    assert "CPERSONA_AUTH_TOKEN is ignored in ACL mode" in acl_server.log()  # ACL-7
    a = await mcp_call(url, "tok-writer", "store", {"agent_id": "alice", "content": "alice's secret plan"})
    b = await mcp_call(url, "tok-bob", "store", {"agent_id": "bob", "content": "bob's secret plan"})
    assert a["ok"] and b["ok"]
    assert (await mcp_call(url, "tok-writer", "store", {"agent_id": "bob", "content": "intrusion"}))[
        "error"
    ] == "permission_denied"
    for tool, args in (
        ("recall", {"agent_id": "bob", "query": "secret plan"}),
        ("list_memories", {"agent_id": "bob"}),
        ("list_memories", {}),
        ("list_episodes", {"agent_id": "bob"}),
        ("get_profile", {"agent_id": "bob"}),
    ):
        denied = await mcp_call(url, "tok-writer", tool, args)
        assert denied["error"] == "permission_denied" and denied["client_id"] == "writer", tool
    mine = await mcp_call(url, "tok-writer", "recall", {"agent_id": "alice", "query": "secret plan"})
    assert [m["content"] for m in mine["messages"]] == ["alice's secret plan"]
    # bobby may read alice, but not write her.
    seen = await mcp_call(url, "tok-bob", "list_memories", {"agent_id": "alice"})
    assert [m["content"] for m in seen["memories"]] == ["alice's secret plan"]
    assert (await mcp_call(url, "tok-bob", "update_profile", {"agent_id": "alice", "profile": "x"}))[
        "required"
    ] == "read-write"
    everything = await mcp_call(url, "tok-admin", "list_memories", {})
    assert sorted(m["content"] for m in everything["memories"]) == ["alice's secret plan", "bob's secret plan"]
    # the legacy single token is not a client in ACL mode.
    with pytest.raises(Exception):  # noqa: B017 - the SDK client raises its own error for a 401
        await mcp_call(url, "legacy-token", "list_memories", {"agent_id": "alice"})
    with sqlite3.connect(acl_server.db_path) as conn:
        assert sorted(conn.execute("SELECT agent_id, content FROM memories").fetchall()) == [
            ("alice", "alice's secret plan"),
            ("bob", "bob's secret plan"),
        ]


async def test_an_omitted_agent_id_over_http_resolves_per_client(acl_server):  # spec ACL-17, ACL-18
    stored = await mcp_call(acl_server.url, "tok-bob", "store", {"content": "no agent named"})
    assert stored["ok"] is True and stored["resolved_agent_id"] == "bob"


async def test_the_stdio_process_runs_as_local_under_an_acl_file(tmp_path):  # spec T-2, ACL-19, ACL-9
    import sys

    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps(FILE))
    os.chmod(acl, 0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    env.update(
        {
            "CPERSONA_DB_PATH": str(tmp_path / "stdio.db"),
            "CPERSONA_UPDATE_CHECK": "false",
            "CPERSONA_ACL_FILE": str(acl),
        }
    )
    params = StdioServerParameters(command=sys.executable, args=["-m", "cpersona"], env=env)
    async with Client(stdio_client(params)) as client:
        stored = (await client.call_tool("store", {"content": "local note"})).structured_content
        denied = (await client.call_tool("store", {"agent_id": "bob", "content": "x"})).structured_content
    assert stored["resolved_agent_id"] == "alice"
    assert denied["client_id"] == "local" and denied["error"] == "permission_denied"
