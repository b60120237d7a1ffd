"""The MCP server object: tool declarations out, tool calls in.

Built on the SDK's low-level ``Server`` so that each tool's JSON Schema is the
one we declare (matching CPersona 2.6.14's), not one derived from type hints.
Every call goes through :func:`cpersona.mcp.dispatch.call_tool`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import mcp.types as types
from mcp.server import Server

from cpersona import __version__
from cpersona.mcp.dispatch import Outcome, call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.pause_gate import PauseGate
from cpersona.mcp.registry import Registry, ToolSpec
from cpersona.mcp.results import to_result
from cpersona.mcp.tools import default_registry
from cpersona.services.app import App
from cpersona.services.operating_context import instructions_summary
from cpersona.services.responses import failure

log = logging.getLogger(__name__)

# The name CPersona clients already know this server by (spec T-6).
SERVER_NAME = "cloto-mcp-cpersona"


def declaration(spec: ToolSpec) -> types.Tool:
    return types.Tool(
        name=spec.name,
        description=spec.description,
        input_schema=dict(spec.input_schema),
        annotations=types.ToolAnnotations(**spec.annotations.as_wire()),
        _meta=dict(spec.meta) if spec.meta else None,
    )


def instructions(registry: Registry, operator_summary: str | None = None) -> str:
    """Guidance sent at initialize; it names only tools this server actually offers.

    The operator's context summary follows verbatim after a blank line (spec
    OC-4). It is read once here, so an edit needs a restart to reach clients.
    """
    parts = [
        "cpersona is this agent's long-term memory: decisions, rules, preferences and findings from "
        "earlier sessions, kept as records that can be quoted."
    ]
    reader = "reconstruct" if "reconstruct" in registry else "recall" if "recall" in registry else None
    if reader:
        parts.append(
            f"Call {reader} when a session starts and whenever a question depends on something from "
            "before this conversation."
        )
    if "store" in registry:
        parts.append(
            "Call store when something should outlive this conversation"
            + (", and archive_episode when the session ends." if "archive_episode" in registry else ".")
        )
    if "get_contents" in registry:
        parts.append("get_contents reads a quoted record further.")
    maintenance = [name for name in ("check_health", "list_memories", "list_episodes") if name in registry]
    if maintenance:
        parts.append(
            f"The maintenance tools ({', '.join(maintenance)}) are for when the user asks about the "
            "memory store itself."
        )
    guidance = " ".join(parts)
    return f"{guidance}\n\n{operator_summary}" if operator_summary else guidance


def build_server(app: App, registry: Registry | None = None, gates: GateChain | None = None) -> Server[Any]:
    registry = registry if registry is not None else default_registry()
    # Without an explicit chain a server still honours pauses: a write must never
    # slip through because a caller forgot the gate. ACL needs a policy file, so
    # it is added by whoever loads one (cli.serve).
    gates = gates if gates is not None else GateChain([PauseGate()])
    tools: list[types.Tool] = []

    async def on_list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        # Built on the first listing, not at start: some declarations render
        # their text from a service's tables and import it (ToolSpec).
        if not tools:
            tools.extend(declaration(spec) for spec in registry)
        return types.ListToolsResult(tools=tools)

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        outcome = await call_tool(app, registry, gates, params.name, params.arguments)
        try:
            return to_result(outcome)
        except Exception as exc:  # noqa: BLE001 — an answer that cannot be encoded is a bug, not a reason to stop
            log.exception("could not encode the answer of %s", params.name)
            return to_result(
                Outcome(failure(f"{type(exc).__name__}: the answer could not be encoded: {exc}"), is_error=True)
            )

    def input_schema(name: str) -> Mapping[str, Any] | None:
        spec = registry.get(name)
        return spec.input_schema if spec else None

    return Server(
        SERVER_NAME,
        version=__version__,  # our own version, not the SDK's (spec README decision 5)
        instructions=instructions(registry, instructions_summary(app.settings)),
        get_tool_input_schema=input_schema,
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )
