"""The tool table: every tool is one declaration holding all of its rules, and nothing else names a tool.

Walks the whole registry (every tool, not an example), then reads the package
source to check that no table outside ``cpersona/mcp/tools/`` is keyed by tool
names. The two recall bugs that came from rules living elsewhere are pinned
through the real MCP client at the end.
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import inspect
import json
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
from mcp import Client

from cpersona.mcp.demands import Access, access_for
from cpersona.mcp.pause_gate import PassThrough, Rule
from cpersona.mcp.registry import ProjectAxis, Ref, ServiceRef, request_fields
from cpersona.mcp.server import build_server
from cpersona.mcp.tools import default_registry
from cpersona.services.requests import Request

REGISTRY = default_registry()
PACKAGE = Path(__file__).resolve().parent.parent / "cpersona"
TOOLS_DIR = PACKAGE / "mcp" / "tools"


@pytest.mark.parametrize("spec", list(REGISTRY), ids=lambda spec: spec.name)
def test_every_tool_declares_every_field(spec):
    assert spec.description.strip() and spec.input_schema["type"] == "object"
    assert spec.annotations.read_only in (True, False), "read_only must be stated, not left out"
    assert isinstance(spec.project, ProjectAxis)
    access = access_for(spec)
    assert isinstance(access, Access) and callable(access.demands.resolve())
    # A write must say what it does while paused; a read-only tool that says nothing runs as usual.
    assert isinstance(spec.paused, Rule) or (spec.annotations.read_only and spec.paused is None)
    assert isinstance(spec.paused or PassThrough(), Rule)
    assert spec.contracts
    # The request carries every declared argument, except those the declaration says are not carried out.
    request = spec.request_type()
    assert dataclasses.is_dataclass(request) and issubclass(request, Request)
    assert request_fields(request) == set(spec.properties) - spec.unsupported
    assert spec.unsupported <= set(spec.properties)
    # The refusal is the tool's own ok:false shape and carries the message.
    refused = spec.refusal("nothing was done", {})
    assert refused["ok"] is False and "nothing was done" in refused.values()
    # The project axis needs the two arguments it reads.
    if spec.project.applies:
        assert {"project_id", "agent_id"} <= set(spec.properties)


@pytest.mark.parametrize("spec", list(REGISTRY), ids=lambda spec: spec.name)
def test_the_service_takes_exactly_what_the_request_carries(spec):
    # Every declared service is named lazily and resolves to a function.
    assert isinstance(spec.service, ServiceRef)
    fn = spec.service.function()
    params = list(inspect.signature(fn).parameters.values())[1:]
    assert len(params) == 1 and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD  # fn(app, request)


# Fields read leniently on purpose, entry by entry, by their own service (not a type the schema promises).
LENIENT_FIELDS = {
    ("recall_with_context", "external_context"),  # RWC-6
    # Items are read one by one and a malformed one is reported in `dropped`, not refused (AS-2).
    ("store", "associations"),
    ("declare_associations", "associations"),
    ("declare_associations", "retract"),
    # OMITTED tells "not sent" from a sent object: the default producer differs by form (top level or message).
    ("store", "source"),
}
SCHEMA_TYPES = {
    "string": str,
    "boolean": bool,
    "integer": int,
    "number": float,
    "array": collections.abc.Sequence,
    "object": collections.abc.Mapping,
}


def _alternatives(hint: object) -> tuple[object, ...]:
    """The members of a union (``str | None``), or the hint itself."""
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


@pytest.mark.parametrize("spec", list(REGISTRY), ids=lambda spec: spec.name)
def test_a_tool_parses_its_own_request_once_for_its_service(spec):
    # Every tool (issue 18 part 1): the request is a declared dataclass in the types the schema promises,
    # so its service never re-validates an Any; defaults are what an omitted field means.
    assert isinstance(spec.request, Ref)
    request = spec.request_type()
    assert issubclass(request, Request) and request.__name__ == spec.request.attr
    hints = typing.get_type_hints(request)
    required = set(spec.input_schema.get("required", ()))
    for field in dataclasses.fields(request):
        if not field.init:
            continue
        declared = spec.properties[field.name]
        has_default = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
        assert has_default is (field.name not in required), f"{spec.name}.{field.name}: required iff no default"
        if "default" in declared:
            assert field.default == declared["default"], f"{spec.name}.{field.name}: the schema's default"
        if (spec.name, field.name) in LENIENT_FIELDS:
            continue
        kinds = [typing.get_origin(kind) or kind for kind in _alternatives(hints[field.name])]
        expected = SCHEMA_TYPES[declared["type"]]
        allowed = [expected] + ([type(None)] if field.name not in required else [])
        assert expected in kinds and all(kind in allowed for kind in kinds), f"{spec.name}.{field.name}: {kinds}"
    # The service is written for that request: its one argument is annotated with it (or a base of it).
    fn = spec.service.function()
    _app, argument = inspect.signature(fn).parameters  # fn(app, request)
    assert issubclass(request, typing.get_type_hints(fn)[argument])


def _lazy_targets(spec) -> set[str]:
    """The modules a declaration names by reference (its service, and the rules that need a service)."""
    refs = [
        spec.service,
        spec.precheck,
        spec.request,
        access_for(spec).demands,
        *(getattr(spec.paused, name, None) for name in ("body", "before", "after")),
    ]
    return {ref.module for ref in refs if isinstance(ref, Ref)}


def test_building_the_table_imports_no_service_and_no_acl():
    # The table is built on every start; what it names is imported on first use (tests/test_startup.py).
    targets = set().union(*(_lazy_targets(spec) for spec in REGISTRY))
    assert "cpersona.mcp.acl" in targets and "cpersona.services.recall.service" in targets
    # The gates are loaded by every start anyway (the pause gate reads the pause state); the table adds nothing.
    probe = (
        "import sys; import cpersona.mcp.dispatch, cpersona.mcp.pause_gate; before = set(sys.modules); "
        "from cpersona.mcp.tools import default_registry; default_registry(); "
        "print('\\n'.join(set(sys.modules) - before))"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
        ).stdout.split()
    )
    assert "cpersona.mcp.tools.recall" in loaded  # the probe saw the table being built
    assert sorted(targets & loaded) == []


def _members(node: ast.AST) -> list[ast.expr]:
    """The literal keys or members of a container used as a lookup table."""
    if isinstance(node, ast.Dict):
        return [k for k in node.keys if k is not None]
    if isinstance(node, ast.Set):
        return list(node.elts)
    if isinstance(node, ast.Compare):
        return [
            e
            for op, c in zip(node.ops, node.comparators)
            if isinstance(op, (ast.In, ast.NotIn)) and isinstance(c, (ast.Tuple, ast.List, ast.Set))
            for e in c.elts
        ]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("set", "frozenset")
        and node.args
        and isinstance(node.args[0], (ast.Tuple, ast.List, ast.Set))
    ):
        return list(node.args[0].elts)
    return []


def test_no_table_outside_the_declarations_names_a_tool():
    names = set(REGISTRY.names())
    tables = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if TOOLS_DIR in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            literals = [m.value for m in _members(node) if isinstance(m, ast.Constant) and isinstance(m.value, str)]
            named = [value for value in literals if value in names]
            # A table of tools is one whose members are mostly tool names (config's "recall" section
            # or a "recall" answer key happen to share a word with a tool; they are not tool tables).
            if len(named) >= 2 and len(named) * 2 > len(literals):
                tables.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {named}")
    assert tables == [], "per-tool rules belong in the tool's declaration:\n" + "\n".join(tables)


def test_the_table_scan_finds_a_tool_table():
    # The scan above must be able to fail: a table like the ones it replaced is found.
    source = 'RULES = {"store": 1, "recall": 2}\nWRITES = frozenset({"store", "archive_episode"})\n'
    found = [node for node in ast.walk(ast.parse(source)) if _members(node)]
    assert len(found) == 3  # the dict, the frozenset(...) call and its set


# -- the two bugs -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_recall_trace_is_refused_not_dropped(app):  # spec memory-and-recall §3.2 (trace: other part)
    # trace was accepted and silently ignored; the server does not build a trace, so it says so.
    async with Client(build_server(app)) as client:
        await client.call_tool("store", {"agent_id": "a", "content": "the deploy runs on Fridays"})
        traced = json.loads(
            (await client.call_tool("recall", {"agent_id": "a", "query": "deploy", "trace": True})).content[0].text
        )
        plain = json.loads(
            (await client.call_tool("recall", {"agent_id": "a", "query": "deploy", "trace": False})).content[0].text
        )
    assert traced == {
        "ok": False,
        "messages": [],
        "error": "trace is not supported by this server yet; nothing was done",
    }
    assert [m["content"] for m in plain["messages"]] == ["the deploy runs on Fridays"]


@pytest.mark.anyio
async def test_reconstruct_takes_only_the_arguments_it_declares(app):  # spec RX-1
    # reconstruct took **arguments, so nothing checked that its service carried what its schema declares.
    # Now its request carries exactly what the schema declares, parsed once, and the service takes that request.
    spec = REGISTRY.get("reconstruct")
    assert request_fields(spec.request_type()) == set(spec.properties)
    async with Client(build_server(app)) as client:
        answer = json.loads(
            (
                await client.call_tool(
                    "reconstruct", {"agent_id": "a", "query": "x", "count": 2, "top_k": 5, "trace": True}
                )
            )
            .content[0]
            .text
        )
    assert answer["returned_count"] == 0 and answer["bounds"]["top_k"] == 5 and "trace" in answer


def _answers_a_refusal(handler: ast.ExceptHandler) -> bool:
    """An ``except ToolFailure`` that turns the refusal into the answer (``return refused.as_response()``)."""
    caught = handler.type
    if not (isinstance(caught, ast.Name) and caught.id == "ToolFailure"):
        return False
    return any(
        isinstance(node, ast.Attribute) and node.attr == "as_response"
        for stmt in handler.body
        for node in ast.walk(stmt)
    )


def test_services_raise_refusals_and_leave_answering_them_to_one_helper():
    # Dispatch answers a ToolFailure in the tool's shape; a library caller gets answers_refusals' answer.
    local = []
    for path in sorted((PACKAGE / "services").rglob("*.py")):
        if path.name == "responses.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        local += [
            f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ExceptHandler) and _answers_a_refusal(node)
        ]
    assert local == [], "use cpersona.services.responses.answers_refusals:\n" + "\n".join(local)
