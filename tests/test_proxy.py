"""``cpersona proxy``: the SDK's stdio client → the proxy process → a real HTTP cpersona.

Real processes only: the server is ``python -m cpersona`` on streamable HTTP
over a real SQLite file, the proxy is ``python -m cpersona proxy``. Waits are
generous liveness bounds, never timing assertions.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from cpersona.config import ConfigError, load_settings
from cpersona.proxy_spawn import Endpoint, answers, database_file
from cpersona.proxy_stdio import ProxyConfigError, proxy_settings, tls_verification

sys.path.insert(0, str(Path(__file__).parent / "e2e"))
from stdio_harness import RawSession, server_env  # noqa: E402

HERE = Path(__file__).resolve().parent
TOKEN = "proxy-test-token"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class HttpServer:
    """``python -m cpersona`` on streamable HTTP, started and stopped by the test."""

    def __init__(self, db_path: Path, port: int) -> None:
        self.db_path, self.port = db_path, port
        self.endpoint = Endpoint(f"http://127.0.0.1:{port}/mcp", TOKEN)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> HttpServer:
        env = server_env(
            self.db_path,
            CPERSONA_EMBEDDING_MODE="none",
            CPERSONA_TRANSPORT="streamable-http",
            CPERSONA_HTTP_PORT=str(self.port),
            CPERSONA_AUTH_TOKEN=TOKEN,
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cpersona"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while not answers(self.endpoint, timeout=2):
            assert self.proc.poll() is None, "the HTTP server exited during start-up"
            assert time.monotonic() < deadline, "the HTTP server did not answer within 120 s"
            time.sleep(0.2)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def http_server(tmp_path: Path):
    server = HttpServer(tmp_path / "shared.db", _port()).start()
    yield server
    server.kill()


def _proxy_env(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPERSONA_")}
    env.update({"CPERSONA_REMOTE_URL": url, "CPERSONA_AUTH_TOKEN": TOKEN, **extra})
    return env


def _body(result) -> dict:
    assert result.is_error is False
    return json.loads(result.content[0].text)


@pytest.mark.anyio
async def test_the_sdk_client_through_the_proxy_sees_the_real_server(http_server: HttpServer, tmp_path: Path) -> None:
    # spec T-10; initialize is answered by the real server: same name, instructions and tools as a direct start.
    direct = StdioServerParameters(
        command=sys.executable,
        args=["-m", "cpersona"],
        env=server_env(tmp_path / "direct.db", CPERSONA_EMBEDDING_MODE="none"),
    )
    async with Client(direct) as client:
        direct_info = (client.server_info.name, client.instructions)
        direct_tools = [tool.model_dump() for tool in (await client.list_tools()).tools]
    proxied = StdioServerParameters(
        command=sys.executable, args=["-m", "cpersona", "proxy"], env=_proxy_env(http_server.endpoint.url)
    )
    async with Client(proxied) as client:
        assert (client.server_info.name, client.instructions) == direct_info
        assert [tool.model_dump() for tool in (await client.list_tools()).tools] == direct_tools
        stored = _body(await client.call_tool("store", {"agent_id": "p", "content": "kept through the proxy"}))
        assert stored["result"] == "stored"
        recalled = _body(await client.call_tool("recall", {"agent_id": "p", "query": "kept through the proxy"}))
        assert [m["content"] for m in recalled["messages"]] == ["kept through the proxy"]


@pytest.mark.parametrize("command", [["cpersona", "proxy"], ["cpersona.proxy_stdio"]], ids=" ".join)
def test_the_proxy_process_loads_neither_the_sdk_nor_the_database_code(
    http_server: HttpServer, tmp_path: Path, command: list[str]
) -> None:
    modules_file = tmp_path / "modules.txt"
    env = _proxy_env(http_server.endpoint.url, CPERSONA_TEST_MODULES_FILE=str(modules_file))
    session = RawSession(env, args=[str(HERE / "modules_at_exit.py"), *command])
    session.initialize()
    assert "result" in session.call("recall", '{"agent_id":"a","query":"anything"}')
    assert session.close() == 0
    loaded = set(modules_file.read_text(encoding="utf-8").split())
    assert "httpx" in loaded  # the file is the proxy's
    # jsonschema: the stdio reader shares its size bound with the argument checks, not their validator.
    # asyncio, anyio, trio: the proxy runs on threads with httpx's synchronous client, and httpcore's
    # module-level imports of the async libraries are kept out (cpersona.proxy_stdio._import_httpx).
    heavy = {
        "mcp",
        "mcp_types",
        "pydantic",
        "pydantic_settings",
        "sqlalchemy",
        "numpy",
        "cpersona.config",
        "cpersona.storage.engine",
        "cpersona.services.app",
        "jsonschema",
        "asyncio",
        "anyio",
        "trio",
        "sniffio",
        "cpersona.mcp",
        # the maintenance commands' modules: `cpersona proxy` parses its command line alone
        "cpersona.admin_cli",
        "cpersona.checkup",
        "cpersona.people_cli",
        "cpersona.hooks",
        "cpersona.ui",
    }
    assert sorted(loaded & heavy) == []


@pytest.mark.parametrize("url", ["http://127.0.0.1:8402/mcp", "HTTP://localhost/mcp", " http://[::1]:9/mcp"])
def test_a_plain_http_url_reads_no_ca_bundle_and_still_trusts_no_certificate(url: str) -> None:
    import ssl

    context = tls_verification(url)
    assert isinstance(context, ssl.SSLContext)
    assert context.cert_store_stats()["x509_ca"] == 0  # certifi's bundle was not read
    # Should the client ever be sent to https with it, it verifies and has no authority to trust.
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


@pytest.mark.parametrize("url", ["https://memory.example/mcp", "HTTPS://memory.example/mcp"])
def test_an_https_url_verifies_against_the_default_bundle(url: str) -> None:
    assert tls_verification(url) is True  # httpx's own default: certifi's bundle, SSL_CERT_FILE/DIR honoured


def test_a_call_in_flight_when_the_server_dies_gets_an_error_and_a_restart_serves_again(
    http_server: HttpServer,
) -> None:
    session = RawSession(_proxy_env(http_server.endpoint.url), args=["-m", "cpersona", "proxy"])
    try:
        session.initialize()
        assert "result" in session.call("store", '{"agent_id":"a","content":"before the crash"}')
        os.kill(http_server.proc.pid, signal.SIGSTOP)  # the next call reaches a server that cannot answer...
        request_id = session.request("tools/call", {"name": "recall", "arguments": {"agent_id": "a", "query": "x"}})
        time.sleep(1.0)
        http_server.kill()  # ...and dies with the call in flight
        answer = session.reply(request_id, timeout=60)
        assert answer["error"]["message"].startswith("cpersona proxy:")
        down = session.call("recall", '{"agent_id":"a","query":"before"}', timeout=60)
        assert "nothing answers" in down["error"]["message"]
        http_server.start()  # the same port and database, a new process
        back = session.call("recall", '{"agent_id":"a","query":"before the crash"}', timeout=60)
        rows = json.loads(back["result"]["content"][0]["text"])["messages"]
        assert [m["content"] for m in rows] == ["before the crash"]
    finally:
        session.close()


def test_two_proxies_starting_at_once_start_one_server(tmp_path: Path) -> None:
    db_path = tmp_path / "spawned" / "memory.db"
    env = server_env(db_path, CPERSONA_EMBEDDING_MODE="none", CPERSONA_PROXY_SERVER_IDLE_SECONDS="3")
    sessions = [RawSession(env, args=["-m", "cpersona", "proxy", "--spawn"]) for _ in range(2)]
    state_path = db_path.with_name(db_path.name + ".server.json")
    try:
        for session in sessions:
            session.initialize()
        for n, session in enumerate(sessions):
            assert "result" in session.call("store", '{"agent_id":"a","content":"from proxy %d"}' % n, timeout=60)
        state = json.loads(state_path.read_text())
        assert stat.S_IMODE(state_path.stat().st_mode) == 0o600  # the token is a credential
        assert state["url"].startswith("http://127.0.0.1:")
        server_log = db_path.with_name(db_path.name + ".server.log").read_text()
        assert server_log.count("serving streamable-http") == 1  # one server for both
        _close_and_see_the_server_idle_out(sessions, state["pid"])
    finally:
        _kill_leftovers(sessions, state_path)


ACL = {
    "clients": [
        {"client_id": "writer", "token": "tok-writer", "grants": {"alice": "read-write"}},
        {"client_id": "reader", "token": "tok-reader", "grants": {"alice": "read"}},
    ]
}


def _tool_answer(reply: dict) -> dict:
    return json.loads(reply["result"]["content"][0]["text"])


def _proxy_once(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cpersona", "proxy", "--spawn"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=150,
    )


def test_spawn_under_an_acl_file_starts_a_server_that_enforces_it_for_every_proxy(tmp_path: Path) -> None:
    acl_path = tmp_path / "acl.json"
    acl_path.write_text(json.dumps(ACL))
    acl_path.chmod(0o600)
    db_path = tmp_path / "spawned" / "memory.db"
    env = server_env(
        db_path, CPERSONA_EMBEDDING_MODE="none", CPERSONA_PROXY_SERVER_IDLE_SECONDS="3", CPERSONA_ACL_FILE=str(acl_path)
    )
    state_path = db_path.with_name(db_path.name + ".server.json")
    sessions = [
        RawSession({**env, "CPERSONA_AUTH_TOKEN": token}, args=["-m", "cpersona", "proxy", "--spawn"])
        for token in ("tok-writer", "tok-reader")
    ]
    writer, reader = sessions
    try:
        for session in sessions:
            session.initialize()
        assert (
            _tool_answer(writer.call("store", '{"agent_id":"alice","content":"the writer wrote this"}', timeout=60))[
                "ok"
            ]
            is True
        )
        denied = _tool_answer(reader.call("store", '{"agent_id":"alice","content":"no"}', timeout=60))
        assert (denied["error"], denied["client_id"]) == ("permission_denied", "reader")  # the file holds
        found = _tool_answer(reader.call("recall", '{"agent_id":"alice","query":"writer wrote"}', timeout=60))
        assert [m["content"] for m in found["messages"]] == ["the writer wrote this"]

        state = json.loads(state_path.read_text())
        assert (state["token"], state["acl_file"]) == (None, str(acl_path))  # no credential written down
        server_log = db_path.with_name(db_path.name + ".server.log").read_text()
        assert server_log.count("serving streamable-http") == 1  # one server for both

        # Proxies that cannot be served say why at once, and join nothing.
        no_token = _proxy_once(env)
        assert no_token.returncode == 1 and "set CPERSONA_AUTH_TOKEN" in no_token.stderr, no_token.stderr
        wrong = _proxy_once({**env, "CPERSONA_AUTH_TOKEN": "tok-nobody"})
        assert wrong.returncode == 1 and "refused this proxy's CPERSONA_AUTH_TOKEN" in wrong.stderr, wrong.stderr
        without_acl = {k: v for k, v in env.items() if k != "CPERSONA_ACL_FILE"}
        other = _proxy_once(without_acl)
        assert other.returncode == 1 and "runs enforcing CPERSONA_ACL_FILE" in other.stderr, other.stderr
        assert db_path.with_name(db_path.name + ".server.log").read_text().count("serving streamable-http") == 1

        _close_and_see_the_server_idle_out(sessions, state["pid"])
    finally:
        _kill_leftovers(sessions, state_path)


def _close_and_see_the_server_idle_out(sessions: list[RawSession], pid: int) -> None:
    for session in sessions:
        assert session.close() == 0
    # With no proxy left, the server stops by itself after its idle time.
    deadline = time.monotonic() + 60
    while _alive(pid):
        assert time.monotonic() < deadline, "the spawned server outlived its proxies"
        time.sleep(0.5)


def _kill_leftovers(sessions: list[RawSession], state_path: Path) -> None:
    for session in sessions:
        if session.proc.poll() is None:
            session.proc.kill()
    if state_path.exists() and _alive(json.loads(state_path.read_text())["pid"]):
        os.kill(json.loads(state_path.read_text())["pid"], signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: the server runs detached
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return status not in ("Z", "X")


# -- the settings, read without the settings model -----------------------------------------------------

CASES = [
    {},
    {"CPERSONA_PROXY_MAX_INFLIGHT": "3"},
    {"CPERSONA_PROXY_MAX_INFLIGHT": "0"},
    {"CPERSONA_PROXY_MAX_INFLIGHT": " 12 "},
    {"CPERSONA_PROXY_MAX_INFLIGHT": ""},
    {"CPERSONA_PROXY_MAX_INFLIGHT": "eight"},
    {"CPERSONA_PROXY_MAX_INFLIGHT": "2.5"},
    {"CPERSONA_REMOTE_URL": "http://127.0.0.1:9/mcp"},
    {"CPERSONA_REMOTE_URL": "  "},
    {"CPERSONA_AUTH_TOKEN": "t"},
    {"CPERSONA_PROXY_SPAWN": "yes"},
    {"CPERSONA_PROXY_SPAWN": "off"},
    {"CPERSONA_PROXY_SPAWN": "maybe"},
    {"CPERSONA_PROXY_SERVER_IDLE_SECONDS": "2.5"},
    {"CPERSONA_PROXY_SERVER_IDLE_SECONDS": "-1"},
    {"CPERSONA_PROXY_SERVER_IDLE_SECONDS": "nan"},
]


@pytest.mark.parametrize("environ", CASES, ids=lambda e: ",".join(f"{k}={v!r}" for k, v in e.items()) or "none")
def test_the_proxy_reads_its_settings_as_the_settings_model_does(environ: dict[str, str]) -> None:
    try:
        model = load_settings(environ)
    except ConfigError:
        with pytest.raises(ProxyConfigError):
            proxy_settings(environ)
        return
    light = proxy_settings(environ)
    token = model.auth_token.get_secret_value() if model.auth_token is not None else ""
    assert (light.remote_url, light.auth_token, light.max_inflight, light.spawn, light.server_idle_seconds) == (
        model.remote_url,
        token,
        model.proxy_max_inflight,
        model.proxy_spawn,
        model.proxy_server_idle_seconds,
    )


@pytest.mark.parametrize("raw", ["", "memory.db", "~/m/memory.db", "/abs/memory.db", " rel/x.db "])
def test_the_spawner_finds_the_database_the_server_opens(raw: str) -> None:
    environ = {"CPERSONA_DB_PATH": raw} if raw else {}
    assert database_file(environ) == load_settings(environ).db_file


def test_stdin_is_not_read_past_max_inflight_unanswered_messages(tmp_path: Path) -> None:
    # spec T-10: backpressure. A local HTTP server holds every request until released.
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    release = threading.Event()
    lock = threading.Lock()
    arrived: list[object] = []

    class Holding(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server spelling
            message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                arrived.append(message.get("id"))
            release.wait(60)
            body = json.dumps({"jsonrpc": "2.0", "id": message.get("id"), "result": {}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Holding)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/mcp"
    session = RawSession(_proxy_env(url, CPERSONA_PROXY_MAX_INFLIGHT="2"), args=["-m", "cpersona", "proxy"])
    try:
        ids = [session.request("ping") for _ in range(5)]
        deadline = time.monotonic() + 30
        while len(arrived) < 2:
            assert time.monotonic() < deadline, "the first two messages never reached the server"
            time.sleep(0.05)
        time.sleep(1.0)  # room for a third to arrive, if the bound did not hold
        assert len(arrived) == 2
        release.set()
        assert all("result" in answer for answer in session.replies(ids, timeout=30).values())
        assert sorted(arrived) == sorted(ids)
    finally:
        release.set()
        session.close()
        server.shutdown()


class NotifyingServer:
    """tests/notifying_http_server.py (the SDK's stateful streamable-HTTP server), started and stopped here."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> NotifyingServer:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "notifying_http_server.py"), str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while True:
            assert self.proc.poll() is None, "the notifying server exited during start-up"
            assert time.monotonic() < deadline, "the notifying server did not listen within 120 s"
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.2)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.anyio
async def test_what_the_server_sends_on_its_own_reaches_the_client_and_again_after_a_restart() -> None:
    # Issue 16: the proxy "relays answers and notifications back". A notification
    # inside an SSE answer rides the POST; one the server sends to the session
    # (here notifications/tools/list_changed) rides the session's GET stream, which
    # the proxy must hold open, and open again for the new session after a restart.
    import anyio
    from mcp.shared.exceptions import MCPError

    server = NotifyingServer(_port()).start()
    logged: list[str] = []
    changed = anyio.Event()

    async def on_log(params) -> None:
        logged.append(params.data)

    async def on_message(message) -> None:
        nonlocal changed
        if getattr(getattr(message, "root", message), "method", None) == "notifications/tools/list_changed":
            changed.set()

    async def announced_on_the_get_stream(client: Client) -> bool:
        # The SDK server drops a session notification while no GET stream is open,
        # so the first announce may precede the proxy's stream: ask again (bounded).
        for _ in range(120):
            try:
                result = await client.call_tool("announce", {})
            except MCPError:  # the proxy's error answer while the server is away
                await anyio.sleep(0.5)
                continue
            if result.is_error is False:
                with anyio.move_on_after(0.5):
                    await changed.wait()
                if changed.is_set():
                    return True
            else:
                await anyio.sleep(0.5)
        return False

    params = StdioServerParameters(command=sys.executable, args=["-m", "cpersona", "proxy"], env=_proxy_env(server.url))
    try:
        # "legacy": the initialize handshake, sessions and their GET stream (what today's hosts speak).
        async with Client(params, mode="legacy", logging_callback=on_log, message_handler=on_message) as client:
            assert await announced_on_the_get_stream(client)
            assert "in the answer's stream" in logged
            server.kill()
            server.start()  # a new process on the same port: the old session is gone
            changed = anyio.Event()
            # The first call after the restart meets the forgotten session (404): the proxy
            # initializes a new one and sends the call again, without an error answer.
            assert (await client.call_tool("announce", {})).is_error is False
            assert await announced_on_the_get_stream(client)
    finally:
        server.kill()
