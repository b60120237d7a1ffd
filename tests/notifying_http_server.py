"""A streamable-HTTP MCP server (the SDK's own, stateful) that sends server-initiated messages.

Test-only: tests/test_proxy.py puts ``cpersona proxy`` in front of it to see
that what a server sends outside any answer (on the session's GET stream) and
inside one (an SSE answer's notifications) reaches the stdio client. cpersona's
own HTTP server is stateless and sends neither. ``announce`` logs a line on its
own answer's stream and announces a changed tool list to the session, which the
SDK writes on the GET stream (and drops when no GET stream is open).

    python tests/notifying_http_server.py PORT
"""

import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("notifying")


@server.tool()
async def announce(ctx: Context) -> str:
    """Log on this answer's stream, and tell the session (GET stream) that the tools changed."""
    await ctx.info("in the answer's stream")
    await ctx.session.send_tool_list_changed()
    return "announced"


if __name__ == "__main__":
    anyio.run(lambda: server.run_streamable_http_async(host="127.0.0.1", port=int(sys.argv[1])))
