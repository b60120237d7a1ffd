"""What a client sees of this server, and the one call path into it, on the SDK's wire types alone.

Both transports serve this: the streamable-HTTP server wraps it in the SDK's
``Server`` (:func:`cpersona.mcp.server.build_server`), the stdio session
(:mod:`cpersona.mcp.stdio_session`) calls it directly. It imports only
``mcp_types``: ``import mcp.anything`` runs the SDK's package ``__init__``,
which loads its client, HTTP stack and ``cryptography`` (55 MiB and ~0.5 s of
CPU, docs/benchmarks.md issue 16 ninth round), none of which a stdio start runs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import mcp_types as types

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
SERVER_VERSION = __version__  # our own version, not the SDK's (spec README decision 5)


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


class ToolSurface:
    """The tool table as served: declarations for ``tools/list``, results for ``tools/call``."""

    def __init__(self, app: App, registry: Registry | None = None, gates: GateChain | None = None) -> None:
        self.app = app
        self.registry = registry if registry is not None else default_registry()
        # Without an explicit chain a server still honours pauses: a write must never
        # slip through because a caller forgot the gate. ACL needs a policy file, so
        # it is added by whoever loads one (cli.serve).
        self.gates = gates if gates is not None else GateChain([PauseGate()])
        self.instructions = instructions(self.registry, instructions_summary(app.settings))
        self._tools: list[types.Tool] = []

    async def list_tools(self) -> types.ListToolsResult:
        # Built on the first listing, not at start: some declarations render
        # their text from a service's tables and import it (ToolSpec).
        if not self._tools:
            self._tools.extend(declaration(spec) for spec in self.registry)
        return types.ListToolsResult(tools=self._tools)

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None) -> types.CallToolResult:
        outcome = await call_tool(self.app, self.registry, self.gates, name, arguments)
        try:
            return to_result(outcome)
        except Exception as exc:  # noqa: BLE001 — an answer that cannot be encoded is a bug, not a reason to stop
            log.exception("could not encode the answer of %s", name)
            return to_result(
                Outcome(failure(f"{type(exc).__name__}: the answer could not be encoded: {exc}"), is_error=True)
            )

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        spec = self.registry.get(name)
        return spec.input_schema if spec else None
