"""The stdio session on the SDK's wire types answers as the SDK's own session did.

The default stdio start serves on :mod:`cpersona.mcp.stdio_session` (no ``mcp``
package import, issue 16). Here both servers, ours (``python -m cpersona``) and
the same start on the SDK's ``Server.run`` (tests/stdio_sdk_server.py), get the
same lines, one at a time, and their answers are compared byte for byte (the
timestamps of the records stored are the one thing masked). Then the SDK 2.x
client in both connect modes, and the session's own cancellation, concurrency
and end-of-input rules in process.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

sys.path.insert(0, str(Path(__file__).parent / "e2e"))
from stdio_harness import server_env  # noqa: E402

HERE = Path(__file__).resolve().parent
ENVELOPE = '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}'
# Every version the SDK negotiates by handshake, the newest (which it answers with
# the newest handshake version) and one it does not know.
VERSIONS = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28", "1999-01-01"]


def _initialize(version: str, request_id: int = 1) -> str:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
        }
    )


def _call(request_id: Any, name: str, arguments: str) -> str:
    return '{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"%s","arguments":%s}}' % (
        json.dumps(request_id),
        name,
        arguments,
    )


# (line, the id its answer carries, or None when it gets none)
BEFORE_INITIALIZE = [
    ('{"jsonrpc":"2.0","id":"early","method":"tools/list"}', "early"),  # the gate: invalid params
    ('{"jsonrpc":"2.0","id":"p0","method":"ping"}', "p0"),  # ping is answered before initialize
    ('{"jsonrpc":"2.0","id":"d","method":"server/discover","params":{%s}}' % ENVELOPE, "d"),
    ('{"jsonrpc":"2.0","id":"d2","method":"server/discover"}', "d2"),
    ('{"jsonrpc":"2.0","method":"notifications/initialized","params":{"_meta":5}}', None),  # malformed: dropped
    ('{"jsonrpc":"2.0","id":"early2","method":"tools/list"}', "early2"),  # so the gate is still shut
]
AFTER_INITIALIZE = [
    ('{"jsonrpc":"2.0","method":"notifications/initialized"}', None),
    ('{"jsonrpc":"2.0","id":2,"method":"tools/list"}', 2),
    ('{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"cursor":"abc"}}', 3),
    (_call(4, "store", '{"agent_id":"a","content":"hello world"}'), 4),
    (_call(5, "recall", '{"agent_id":"a","query":"hello"}'), 5),
    (_call(6, "no_such_tool", "{}"), 6),
    (_call(7, "recall", '{"agent_id":1}'), 7),  # a schema violation: the tool's input error
    (_call(8, "recall", '{"agent_id":"a","query":"\\ud800"}'), 8),  # a lone surrogate: the second parse
    (_call(9, "store", '{"agent_id":"a","content":"x\\u0000y"}'), 9),  # NUL: the tool's own refusal
    ('{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{}}', 10),  # no name: invalid params
    ('{"jsonrpc":"2.0","id":11,"method":"resources/list"}', 11),
    ('{"jsonrpc":"2.0","id":12,"method":"prompts/list"}', 12),
    ('{"jsonrpc":"2.0","id":13,"method":"prompts/get","params":{}}', 13),
    ('{"jsonrpc":"2.0","id":14,"method":"logging/setLevel","params":{"level":"info"}}', 14),
    (
        '{"jsonrpc":"2.0","id":15,"method":"completion/complete","params":'
        '{"ref":{"type":"ref/prompt","name":"x"},"argument":{"name":"a","value":"b"}}}',
        15,
    ),
    ('{"jsonrpc":"2.0","id":16,"method":"no/such/method"}', 16),
    ('{"jsonrpc":"2.0","id":17,"method":"tools/list","params":{%s}}' % ENVELOPE, 17),
    ('{"jsonrpc":"2.0","id":18,"method":"ping","params":[]}', None),  # params not an object: dropped
    ('{"jsonrpc":"2.0","id":19,"method":"ping","x":' + "[" * 100_000 + "]" * 100_000 + "}", 19),  # too deep
    ('{"jsonrpc":"2.0","id":20,"method":"tools/call"', 20),  # cut short: a parse error with its id
    ("not json", None),
    ("", None),
    ('[{"jsonrpc":"2.0","id":21,"method":"ping"}]', None),  # a batch: dropped, as the SDK drops it
    ('{"foo":1}', None),
    ('{"jsonrpc":"2.0","id":22,"result":{}}', None),  # a response to nothing
    ('{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":999}}', None),
    ('{"jsonrpc":"2.0","id":23,"method":"initialize","params":{}}', 23),  # invalid params
    (_call(24, "recall", '{"agent_id":"a","query":"' + "x" * 1_100_000 + '"}'), 24),  # over-long
    ('{"jsonrpc":"2.0","id":26,"method":"tools/call","params":{"name":5}}', 26),
    ('{"jsonrpc":"2.0","id":27,"method":"tools/call","params":{"name":"recall","arguments":[1]}}', 27),
    ('{"jsonrpc":"2.0","id":28,"method":"ping","params":{"_meta":5}}', 28),
    ('{"jsonrpc":"2.0","id":29,"method":"tools/list","params":{"cursor":5}}', 29),
    (
        '{"jsonrpc":"2.0","id":30,"method":"tools/call","params":{"name":"recall",'
        '"arguments":{"agent_id":"a","query":"hello"},"_meta":{"progressToken":"t"},"task":{"ttl":1000}}}',
        30,
    ),
    (
        '{"jsonrpc":"2.0","id":31,"method":"initialize","params":{"protocolVersion":5,"capabilities":{},'
        '"clientInfo":{"name":"t","version":"0"}}}',
        31,
    ),
    (
        '{"jsonrpc":"2.0","id":32,"method":"initialize","params":{"protocolVersion":"2025-03-26",'
        '"clientInfo":{"name":"t","version":"0"}}}',
        32,
    ),
    ('{"jsonrpc":"2.0","id":"7","method":"ping"}', "7"),
    (_initialize("2025-06-18", 25), 25),  # a second initialize negotiates again
    ('{"jsonrpc":"2.0","id":33,"method":"tools/list"}', 33),
]
TIMESTAMP = re.compile(rb'(\\"timestamp\\": \\"|"timestamp":")[^"\\]*')


class Wire:
    """Raw lines to a server process; each one's answers read up to a ping sent after it."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)
        self._buffer = b""
        self._syncs = 0

    def exchange(self, line: str, answer_id: Any) -> list[bytes]:
        """The lines written in answer to ``line`` (its own answer, if any, comes in by id)."""
        self._syncs += 1
        sync = f"sync-{self._syncs}"
        self.proc.stdin.write(
            line.encode("utf-8") + b"\n" + b'{"jsonrpc":"2.0","id":"%s","method":"ping"}\n' % sync.encode()
        )
        self.proc.stdin.flush()
        wanted = {sync} | ({answer_id} if answer_id is not None else set())
        answers: list[bytes] = []
        deadline = time.monotonic() + 20
        while wanted:
            while b"\n" in self._buffer and wanted:
                out, self._buffer = self._buffer.split(b"\n", 1)
                request_id = json.loads(out).get("id")
                wanted.discard(request_id)
                if request_id != sync:
                    answers.append(TIMESTAMP.sub(rb"\1<masked>", out))
            if not wanted:
                break
            assert self._selector.select(max(0.0, deadline - time.monotonic())), f"no answer to {line[:200]!r}"
            chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            assert chunk, "the server ended"
            self._buffer += chunk
        return answers

    def close(self) -> int:
        self.proc.stdin.close()
        rest = self.proc.stdout.read()
        code = self.proc.wait(timeout=30)
        assert self._buffer + rest == b"", "answers after the last exchange"
        return code


def _transcript(argv: list[str], env: dict[str, str], version: str) -> list[list[bytes]]:
    wire = Wire(argv, env)
    lines = [*BEFORE_INITIALIZE, (_initialize(version), 1), *AFTER_INITIALIZE]
    transcript = [wire.exchange(line, answer_id) for line, answer_id in lines]
    assert wire.close() == 0
    return transcript


@pytest.mark.parametrize("version", VERSIONS)
def test_the_session_answers_every_line_as_the_sdk_session(tmp_path: Path, version: str) -> None:
    ours = _transcript(
        [sys.executable, "-m", "cpersona"], server_env(tmp_path / "ours.db", CPERSONA_EMBEDDING_MODE="none"), version
    )
    sdk = _transcript(
        [sys.executable, str(HERE / "stdio_sdk_server.py")],
        server_env(tmp_path / "sdk.db", CPERSONA_EMBEDDING_MODE="none"),
        version,
    )
    lines = [*BEFORE_INITIALIZE, (_initialize(version), 1), *AFTER_INITIALIZE]
    for (line, _), mine, theirs in zip(lines, ours, sdk, strict=True):
        assert mine == theirs, line[:200]
    negotiated = json.loads(ours[len(BEFORE_INITIALIZE)][0])["result"]["protocolVersion"]
    assert negotiated == (version if version in VERSIONS[:4] else "2025-11-25")


def test_the_served_answers_need_no_per_version_sieve(app) -> None:
    # The session answers initialize, ping, tools/list and tools/call as dumped,
    # without mcp_types.methods (cpersona.mcp.stdio_session._shaped): that holds
    # only while every handshake version defines them and the sieve changes none.
    import mcp_types as types
    import mcp_types.methods as methods
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    from cpersona.mcp.stdio_session import _SERVED, StdioSession, _shaped
    from cpersona.mcp.surface import ToolSurface

    surface = ToolSurface(app)
    session = StdioSession(surface, write=None)  # type: ignore[arg-type]

    async def answers() -> dict[str, list[types.Result]]:
        stored = await surface.call_tool("store", {"agent_id": "a", "content": "one"})
        refused = await surface.call_tool("recall", {"agent_id": 1})
        return {
            "initialize": [session._initialize_result(v) for v in HANDSHAKE_PROTOCOL_VERSIONS],
            "ping": [types.EmptyResult()],
            "tools/list": [await surface.list_tools()],
            "tools/call": [stored, refused, await surface.call_tool("recall", {"agent_id": "a", "query": "one"})],
        }

    results = anyio.run(answers)
    assert set(results) == _SERVED
    for version in HANDSHAKE_PROTOCOL_VERSIONS:
        assert {m for m, v in methods.CLIENT_REQUESTS if v == version} >= _SERVED
        for method, shown in results.items():
            for result in shown:
                dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
                sieved = methods.serialize_server_result(method, version, dumped)
                assert json.dumps(_shaped(result)) == json.dumps(sieved), (method, version)  # members in order too


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_sdk_client_connects_in_either_mode(tmp_path: Path, mode: str) -> None:
    # mode "auto" probes server/discover first; the handshake-era answer makes it fall back.
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "cpersona"],
        env=server_env(tmp_path / "m.db", CPERSONA_EMBEDDING_MODE="none"),
    )
    async with Client(params, mode=mode) as client:
        tools = await client.list_tools()
        assert "recall" in [tool.name for tool in tools.tools]
        stored = await client.call_tool("store", {"agent_id": "a", "content": "kept through the client"})
        assert stored.structured_content["ok"] is True
        found = await client.call_tool("recall", {"agent_id": "a", "query": "kept"})
        assert [m["content"] for m in found.structured_content["messages"]] == ["kept through the client"]


# --- the session in process: cancellation, concurrency, the end of input -----------------


class SlowSurface:
    """A tool surface whose calls wait for a gate the test opens."""

    instructions = "test"

    def __init__(self) -> None:
        self.gates: dict[str, anyio.Event] = {}
        self.finished: list[str] = []

    async def list_tools(self) -> Any:
        import mcp_types as types

        return types.ListToolsResult(tools=[])

    async def call_tool(self, name: str, arguments: Any) -> Any:
        import mcp_types as types

        await self.gates.setdefault(name, anyio.Event()).wait()
        self.finished.append(name)
        return types.CallToolResult(content=[types.TextContent(type="text", text=name)])


def _run_session(surface: SlowSurface, script: Any) -> list[dict[str, Any]]:
    from cpersona.mcp.stdio_session import StdioSession

    written: list[dict[str, Any]] = []

    async def write(text: str) -> None:
        written.append(json.loads(text))

    async def main() -> None:
        send, receive = anyio.create_memory_object_stream[str](100)
        session = StdioSession(surface, write)  # type: ignore[arg-type]
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(session.run, receive)
            async with send:
                await script(send, written)

    anyio.run(main)
    return written


def test_calls_run_concurrently_and_a_cancelled_one_is_never_answered() -> None:
    surface = SlowSurface()

    async def script(send: Any, written: list[dict[str, Any]]) -> None:
        await send.send(_initialize("2025-11-25"))
        await send.send(_call(2, "slow", "{}"))
        await send.send(_call(3, "fast", "{}"))
        await send.send(_call(4, "cancelled", "{}"))
        await anyio.sleep(0.05)
        surface.gates.setdefault("fast", anyio.Event()).set()  # the later call ends first
        await anyio.sleep(0.05)
        assert [m.get("id") for m in written] == [1, 3]
        await send.send('{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"4"}}')
        await anyio.sleep(0.05)
        surface.gates.setdefault("slow", anyio.Event()).set()
        await anyio.sleep(0.05)

    written = _run_session(surface, script)
    assert [m.get("id") for m in written] == [1, 3, 2]  # 4 was cancelled: no answer, ever
    assert surface.finished == ["fast", "slow"]


def test_the_end_of_input_waits_for_answers_then_cancels_what_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    import cpersona.mcp.stdio_session as stdio_session

    monkeypatch.setattr(stdio_session, "CLOSE_DRAIN_SECONDS", 0.5)
    surface = SlowSurface()

    async def script(send: Any, written: list[dict[str, Any]]) -> None:
        await send.send(_initialize("2025-11-25"))
        await send.send(_call(2, "pending", "{}"))
        await send.send(_call(3, "stuck", "{}"))
        asyncio.get_running_loop().call_later(0.1, surface.gates.setdefault("pending", anyio.Event()).set)
        # returning closes the stream: stdin has ended with both calls unanswered

    written = _run_session(surface, script)
    # The call that ended within the drain bound was answered; the one that never
    # ended was cancelled at the bound and told so, as the SDK tells it.
    assert written[1] == {
        "jsonrpc": "2.0",
        "id": 2,
        "result": {"content": [{"type": "text", "text": "pending"}], "isError": False},
    }
    assert written[2] == {"jsonrpc": "2.0", "id": 3, "error": {"code": -32000, "message": "Connection closed"}}
    assert len(written) == 3 and surface.finished == ["pending"]
