"""Streamable HTTP: the real ``python -m cpersona`` process on 127.0.0.1, driven by real HTTP clients.

The harness at the top (``HttpServer``, ``mcp_call``) is shared with
test_acl.py, test_body_budget.py and test_oauth.py.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.anyio

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpServer:
    """``python -m cpersona`` serving streamable HTTP on a free loopback port."""

    def __init__(self, tmp_path: Path, nofile: int | None = None, **env: str) -> None:
        self.port = free_port()
        self.db_path = tmp_path / "http.db"
        self.log_path = tmp_path / f"server-{self.port}.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
        base.update(
            {
                "CPERSONA_DB_PATH": str(self.db_path),
                "CPERSONA_UPDATE_CHECK": "false",
                "CPERSONA_TRANSPORT": "streamable-http",
                "CPERSONA_HTTP_PORT": str(self.port),
            }
        )
        base.update(env)
        self._log = self.log_path.open("wb")
        # nofile lowers the server's RLIMIT_NOFILE before it starts (the file-limit tests).
        limit = None if nofile is None else (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile)))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cpersona"],
            env=base,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            preexec_fn=limit,
        )
        self._wait_ready()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not listen within {timeout} s: {self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def mcp_call(url: str, token: str | None, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One tool call through the SDK client (httpx2 carrying the bearer header)."""
    async with httpx2.AsyncClient(headers=auth(token) if token else {}, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            result = await client.call_tool(tool, arguments)
    return result.structured_content


def raw_post(url: str, headers: dict[str, str], body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(url, headers={**MCP_HEADERS, **headers}, content=json.dumps(body).encode(), timeout=30, **kw)


def sse_result(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a single-event SSE (or JSON) answer."""
    text = response.text
    if response.headers.get("content-type", "").startswith("application/json"):
        return json.loads(text)
    data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    return json.loads(data[-1])


def tool_request(tool: str, arguments: dict[str, Any], request_id: int = 2) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


@pytest.fixture
def token_server(tmp_path: Path) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path, CPERSONA_AUTH_TOKEN="s3cret-token")
    yield server
    server.stop()


def run_cli(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    base.update(
        {
            "CPERSONA_DB_PATH": str(tmp_path / "refused.db"),
            "CPERSONA_UPDATE_CHECK": "false",
            "CPERSONA_TRANSPORT": "streamable-http",
            "CPERSONA_HTTP_PORT": str(free_port()),
        }
    )
    base.update(env)
    return subprocess.run(
        [sys.executable, "-m", "cpersona"],
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


# --- start-up ---------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_http_without_credentials_refuses_to_start_even_on_loopback(tmp_path, host):  # spec T-8
    done = run_cli(tmp_path, CPERSONA_HTTP_HOST=host)
    assert done.returncode != 0
    assert "CPERSONA_AUTH_TOKEN" in done.stderr and "CPERSONA_ALLOW_UNAUTHENTICATED_HTTP" in done.stderr
    assert host in done.stderr and "delete_agent_data" in done.stderr
    assert not (tmp_path / "refused.db").exists()  # refused before the database was opened (T-7)


def test_only_the_word_true_opts_into_unauthenticated_http(tmp_path):  # spec T-8, CFG-3
    done = run_cli(tmp_path, CPERSONA_ALLOW_UNAUTHENTICATED_HTTP="yes")
    assert done.returncode != 0 and "CPERSONA_ALLOW_UNAUTHENTICATED_HTTP" in done.stderr
    assert not (tmp_path / "refused.db").exists()


def test_unauthenticated_opt_in_serves_and_warns(tmp_path):  # spec T-8, AUTH-5
    server = HttpServer(tmp_path, CPERSONA_ALLOW_UNAUTHENTICATED_HTTP="TRUE")
    try:
        first = raw_post(server.url, {}, INIT)
        assert first.status_code == 200
        assert "WITHOUT authentication" in server.log()
        assert "reachable from outside" not in server.log()  # loopback, no forwarding header
        raw_post(server.url, {"X-Forwarded-For": "203.0.113.9"}, INIT)
        raw_post(server.url, {"X-Forwarded-For": "203.0.113.9"}, INIT)
        assert server.log().count("reachable from outside while unauthenticated") == 1  # once per process
    finally:
        server.stop()


def test_an_unusable_acl_file_stops_start_up(tmp_path):  # spec ACL-6, T-7
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"clients": [{"client_id": "w", "grants": {"a": "write"}}]}))
    done = run_cli(tmp_path, CPERSONA_ACL_FILE=str(acl))
    assert done.returncode != 0 and "'w'" in done.stderr
    assert not (tmp_path / "refused.db").exists()


# --- bearer token -------------------------------------------------------------------


def test_requests_without_the_token_get_401(token_server):  # spec AUTH-1..AUTH-3
    for headers in (
        {},
        auth("wrong"),
        {"Authorization": "s3cret-token"},
        {"Authorization": "Basic s3cret-token"},
        {"Authorization": "Bearer"},
    ):
        response = raw_post(token_server.url, headers, INIT)
        assert response.status_code == 401, headers
        assert response.content == b'{"error":"unauthorized"}'
        assert response.headers["www-authenticate"] == "Bearer"


def test_a_non_ascii_credential_is_a_401_not_a_500(token_server):  # spec AUTH-2
    response = httpx.post(
        token_server.url,
        headers=[("Authorization", "Bearer s3cret-tokén".encode("utf-8")), ("Content-Type", "application/json")],
        content=b"{}",
    )
    assert response.status_code == 401


def test_the_scheme_is_case_insensitive_and_both_mounts_answer(token_server):  # spec AUTH-1, T-3
    for url in (token_server.url, token_server.root + "/"):
        response = raw_post(url, {"Authorization": "bEaReR s3cret-token"}, INIT)
        assert response.status_code == 200, url
        assert sse_result(response)["result"]["serverInfo"]["name"] == "cloto-mcp-cpersona"
        assert "mcp-session-id" not in response.headers  # stateless (T-3)


def test_cors_preflight_needs_no_token_and_names_only_claude(token_server):  # spec T-5, AUTH-4
    preflight = {
        "Origin": "https://claude.ai",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    ok = httpx.options(token_server.url, headers=preflight)
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == "https://claude.ai"
    foreign = httpx.options(token_server.url, headers={**preflight, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in foreign.headers
    answer = raw_post(token_server.url, {**auth("s3cret-token"), "Origin": "https://claude.ai"}, INIT)
    assert answer.headers["access-control-allow-origin"] == "https://claude.ai"


def test_a_rebinding_host_name_is_refused(token_server):  # stack.md §1 (DNS-rebinding protection)
    response = raw_post(token_server.url, {**auth("s3cret-token"), "Host": "evil.example:80"}, INIT)
    assert response.status_code == 421


async def test_sdk_client_stores_and_recalls_with_the_token(token_server):  # spec T-3, AUTH-2
    stored = await mcp_call(
        token_server.url, "s3cret-token", "store", {"agent_id": "alice", "content": "the deploy key rotates on Mondays"}
    )
    assert stored["ok"] is True and stored["result"] == "stored"
    found = await mcp_call(token_server.url, "s3cret-token", "recall", {"agent_id": "alice", "query": "deploy key"})
    assert [m["content"] for m in found["messages"]] == ["the deploy key rotates on Mondays"]
    with pytest.raises(Exception):  # noqa: B017 - the SDK client raises its own error for a 401
        await mcp_call(token_server.url, "wrong", "recall", {"agent_id": "alice", "query": "deploy"})


# --- many clients, one database -------------------------------------------------------


async def test_concurrent_writers_from_eight_clients_lose_nothing(token_server):  # spec T-3; storage PG-4
    clients, per_client = 8, 12
    answers: list[dict[str, Any]] = []

    async def writer(n: int) -> None:
        async with httpx2.AsyncClient(headers=auth("s3cret-token"), timeout=60) as http:
            async with Client(streamable_http_client(token_server.url, http_client=http)) as client:
                for i in range(per_client):
                    result = await client.call_tool(
                        "store", {"agent_id": f"agent-{n % 2}", "content": f"client {n} note {i}"}
                    )
                    answers.append(result.structured_content)

    async with anyio.create_task_group() as tg:
        for n in range(clients):
            tg.start_soon(writer, n)

    assert len(answers) == clients * per_client
    assert all(a["ok"] is True and a["result"] == "stored" for a in answers), [a for a in answers if not a["ok"]]
    assert not any("locked" in json.dumps(a) and "database" in json.dumps(a) for a in answers)
    with sqlite3.connect(token_server.db_path) as conn:
        rows = conn.execute("SELECT content FROM memories").fetchall()
    contents = sorted(r[0] for r in rows)
    assert contents == sorted(f"client {n} note {i}" for n in range(clients) for i in range(per_client))
    assert len({a["id"] for a in answers}) == clients * per_client


async def test_keyless_pause_is_process_wide_and_a_keyed_one_is_not(token_server):  # spec P-1, C-7
    tools = await _tool_names(token_server)
    assert "pause_persistence" in tools
    token = "s3cret-token"
    await mcp_call(token_server.url, token, "pause_persistence", {"session_key": "client-a"})
    other = await mcp_call(
        token_server.url, token, "store", {"agent_id": "x", "content": "from b", "session_key": "client-b"}
    )
    assert other["ok"] is True and other.get("persisted", True) is True
    mine = await mcp_call(
        token_server.url, token, "store", {"agent_id": "x", "content": "from a", "session_key": "client-a"}
    )
    assert mine.get("persisted") is False
    await mcp_call(token_server.url, token, "pause_persistence", {})
    keyless = await mcp_call(token_server.url, token, "store", {"agent_id": "x", "content": "keyless"})
    assert keyless.get("persisted") is False  # armed by another request, felt by this one


async def _tool_names(server: HttpServer) -> set[str]:
    async with httpx2.AsyncClient(headers=auth("s3cret-token")) as http:
        async with Client(streamable_http_client(server.url, http_client=http)) as client:
            return {t.name for t in (await client.list_tools()).tools}
