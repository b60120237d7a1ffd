"""What a stdio start would cost on the SDK's wire types alone: a measurement prototype, not a server.

Any ``import mcp.…`` runs the SDK's package ``__init__``, which imports its
client, ``MCPServer``, the streamable-HTTP stack (starlette, uvicorn, httpx2),
opentelemetry and ``cryptography`` (``mcp.server.request_state``), 55 MiB and
~0.5 s of CPU before our first line (docs/benchmarks.md, issue 16 ninth round).
The SDK itself points at the narrower part: ``mcp_types`` ("import mcp_types
directly when you only need to (de)serialize MCP traffic and don't want the
SDK's transport stack"). How much of our start is then left is what this
measures, with the real start path (settings, database at head, App, the
background work after the first answer, ``build_server``, the recall through
the tool's own ``on_call_tool`` handler):

- a shim package named ``mcp`` (written to a scratch directory and put first on
  ``PYTHONPATH`` for this kind only) maps ``mcp.types`` to ``mcp_types`` and
  stands in for ``mcp.server.Server`` by keeping its keyword arguments;
- a 30-line loop answers ``initialize`` (the same capabilities and
  instructions as ours) and ``tools/call``, one line in, one line out, with
  ``mcp_types`` parsing and dumping every message.

Left out, so a real session on ``mcp_types`` would cost a little more than this
reads: ``ping``, ``tools/list``, cancellation, concurrent requests, the
unreadable-line answers of ``cpersona.mcp.stdio`` and its pipe reader
(~0.1 MiB). It is the bench's kind ``narrow``; nothing in cpersona imports it.
"""

from __future__ import annotations

from pathlib import Path

SHIM = {
    "mcp/__init__.py": '"""Measurement shim (bench/startup_narrow.py): the SDK narrowed to mcp_types."""\n',
    "mcp/types.py": "from mcp_types import *  # noqa: F403\nfrom mcp_types import PARSE_ERROR, jsonrpc_message_adapter  # noqa: F401\n",
    "mcp/server/__init__.py": (
        "class Server:\n    def __init__(self, name, **kw):\n        self.name, self.kw = name, kw\n"
    ),
}

SERVE = """\
import gc, json, os, sys
gc.disable()  # as cli.serve: off while the start builds, frozen after
import anyio
import mcp_types as types
from cpersona import cli
from cpersona.config import check_startup, load_settings
settings = load_settings()
check_startup(settings)
from cpersona.storage.migrate import open_database_and_upgrade
db = open_database_and_upgrade(settings)
from cpersona.background import BackgroundWork
from cpersona.mcp.server import build_server
from cpersona.services.app import App
app = App(db=db, settings=settings, embedder=None, remote_callers=False)
background = BackgroundWork(app)
background.prepare()
server = build_server(app, gates=cli.tool_gates(None, settings, "stdio"))
cli._collector_on()
first = [True]


def write(message):
    sys.stdout.write(json.dumps(message.model_dump(by_alias=True, exclude_none=True, mode="json")) + "\\n")
    sys.stdout.flush()


async def main():
    while True:
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        if not line:
            return
        message = types.jsonrpc_message_adapter.validate_json(line)
        if not isinstance(message, types.JSONRPCRequest):
            continue
        if message.method == "initialize":
            result = types.InitializeResult(
                protocol_version=message.params["protocolVersion"],
                capabilities=types.ServerCapabilities(tools=types.ToolsCapability(list_changed=False)),
                server_info=types.Implementation(name=server.name, version=server.kw["version"]),
                instructions=server.kw["instructions"],
            )
        elif message.method == "tools/call":
            params = types.CallToolRequestParams.model_validate(message.params)
            result = await server.kw["on_call_tool"](None, params)
        else:
            continue
        dumped = result.model_dump(by_alias=True, exclude_none=True, mode="json")
        write(types.JSONRPCResponse(jsonrpc="2.0", id=message.id, result=dumped))
        if first[0]:
            first[0] = False
            background.start_in_thread()  # as serve_stdio: after the first answer


anyio.run(main)
background.stop()
db.close()
os._exit(0)
"""


def write_prototype(work: Path) -> tuple[Path, Path]:
    """(shim directory for PYTHONPATH, the serve script), written under ``work``."""
    shim = work / "narrow-shim"
    for name, text in SHIM.items():
        path = shim / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    script = work / "narrow_serve.py"
    script.write_text(SERVE)
    return shim, script
