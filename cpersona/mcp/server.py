"""The SDK's server object around the tool surface, for the streamable-HTTP transport.

Built on the SDK's low-level ``Server`` so that each tool's JSON Schema is the
one we declare (matching CPersona 2.6.14's), not one derived from type hints.
Declarations, instructions and the call path live in
:mod:`cpersona.mcp.surface`, which the stdio session serves without the SDK.
"""

from __future__ import annotations

from typing import Any

import mcp.types as types
from mcp.server import Server

from cpersona.mcp.gates import GateChain
from cpersona.mcp.registry import Registry
from cpersona.mcp.surface import SERVER_NAME, SERVER_VERSION, ToolSurface, declaration, instructions
from cpersona.services.app import App

__all__ = ["SERVER_NAME", "build_server", "declaration", "instructions", "sdk_server"]


def build_server(app: App, registry: Registry | None = None, gates: GateChain | None = None) -> Server[Any]:
    return sdk_server(ToolSurface(app, registry, gates))


def sdk_server(surface: ToolSurface) -> Server[Any]:
    async def on_list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return await surface.list_tools()

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await surface.call_tool(params.name, params.arguments)

    return Server(
        SERVER_NAME,
        version=SERVER_VERSION,
        instructions=surface.instructions,
        get_tool_input_schema=surface.input_schema,
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )
