"""What one HTTP connection may cost (cpersona/mcp/http_guard.py; issue 13 item 2).

Real ``python -m cpersona`` servers on 127.0.0.1, raw sockets playing the
attacker (idle, slow-header, slow-body, never-ending GET) while an
authenticated client keeps asking; one server runs with its file limit
lowered to 256.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Iterator

import pytest

from cpersona.config import load_settings
from cpersona.mcp.http_guard import (
    FD_RESERVE,
    MAX_CONNECTIONS,
    MIN_CONNECTIONS,
    RateLimitedLog,
    connection_limits,
    install_accept_error_limit,
)
from test_http_transport import HttpServer, auth, raw_post, tool_request

TOKEN = "limits-token"
LIVENESS = 15.0  # generous: every deadline under test is 1-2 s


def connect(server: HttpServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


def request_head(server: HttpServer, method: str = "POST", extra: str = "") -> bytes:
    return (
        f"{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n{extra}\r\n"
    ).encode()


def closed_by_server(sock: socket.socket, within: float = LIVENESS, trickle: bytes = b"") -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (sending ``trickle`` every 0.25 s)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if trickle:
                sock.sendall(trickle)
            sock.settimeout(0.25)
            data = sock.recv(65536)
            if not data:
                return True
        except (socket.timeout, TimeoutError):
            continue
        except (BrokenPipeError, ConnectionResetError):
            return True
    return False


def listed(server: HttpServer) -> int:
    return raw_post(server.url, auth(TOKEN), tool_request("list_memories", {"agent_id": "a"})).status_code


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def short_server(tmp_path) -> Iterator[HttpServer]:
    server = HttpServer(
        tmp_path,
        CPERSONA_AUTH_TOKEN=TOKEN,
        CPERSONA_HTTP_HEADER_TIMEOUT_SECS="1",
        CPERSONA_HTTP_BODY_TIMEOUT_SECS="1",
        CPERSONA_HTTP_STREAM_MAX_SECS="1",
        CPERSONA_HTTP_KEEP_ALIVE_TIMEOUT_SECS="30",
    )
    yield server
    server.stop()


# --- under a lowered file limit -------------------------------------------------------


def test_idle_and_slow_sockets_under_a_256_file_limit_do_not_lock_out_a_client(tmp_path):
    server = HttpServer(tmp_path, nofile=256, CPERSONA_AUTH_TOKEN=TOKEN)
    held: list[socket.socket] = []
    try:
        for _ in range(300):  # more than the whole file limit, as in the attack
            try:
                held.append(connect(server))
            except OSError:
                pass
        for sock in held[-20:]:  # some of them slow-header
            try:
                sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: x\r\n")
            except OSError:
                pass
        time.sleep(1)
        assert descriptors(server.proc.pid) < 256 - FD_RESERVE // 2  # kept well below the limit
        assert [listed(server) for _ in range(5)] == [200] * 5
        log = server.log()
        assert "Too many open files" not in log and "Traceback" not in log
        assert len(log) < 20_000  # no log flood
        assert 1 <= log.count("closed idle HTTP connections to make room") <= 2  # one line per 10 s
    finally:
        for sock in held:
            sock.close()
        server.stop()


# --- deadlines ------------------------------------------------------------------------


def test_a_connection_that_sends_nothing_is_closed(short_server):
    with connect(short_server) as sock:
        assert closed_by_server(sock)
    assert "closed slow HTTP connections (no complete request head in time)" in short_server.log()


def test_a_request_head_sent_a_byte_at_a_time_is_closed(short_server):
    with connect(short_server) as sock:
        sock.sendall(b"POST /mcp HTTP/1.1\r\n")
        assert closed_by_server(sock, trickle=b"X")  # each byte would reset a per-byte timer


def test_a_slow_next_request_on_a_kept_alive_connection_is_closed(short_server):
    with connect(short_server) as sock:
        sock.sendall(f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{short_server.port}\r\n\r\n".encode())
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 401")  # answered, and the connection kept alive
        sock.sendall(b"POST /mcp HTTP/1.1\r\n")
        # uvicorn's keep-alive timer (30 s here) is cancelled by the first byte; the head deadline is not.
        assert closed_by_server(sock, trickle=b"Y")


def test_a_body_that_stops_arriving_is_closed(short_server):
    with connect(short_server) as sock:
        sock.sendall(request_head(short_server, extra="Content-Length: 1000\r\n") + b'{"jsonrpc":')
        assert closed_by_server(sock)
    assert "the request body stopped arriving" in short_server.log()
    assert listed(short_server) == 200


def test_a_get_stream_that_never_closes_is_ended(short_server):
    with connect(short_server) as sock:
        sock.sendall(request_head(short_server, method="GET"))
        received = b""
        deadline = time.monotonic() + LIVENESS
        while b"0\r\n\r\n" not in received and time.monotonic() < deadline:
            sock.settimeout(0.5)
            try:
                chunk = sock.recv(65536)
            except (socket.timeout, TimeoutError):
                continue
            if not chunk:
                break
            received += chunk
    assert received.startswith(b"HTTP/1.1 200")
    assert b"text/event-stream" in received
    assert received.endswith(b"0\r\n\r\n")  # the chunked stream was ended by the server


# --- the connection bound -------------------------------------------------------------


def test_at_the_bound_the_oldest_idle_connection_makes_room(tmp_path):
    server = HttpServer(tmp_path, CPERSONA_AUTH_TOKEN=TOKEN, CPERSONA_HTTP_MAX_CONNECTIONS="4")
    idle = [connect(server) for _ in range(4)]
    try:
        time.sleep(0.5)
        assert listed(server) == 200
        assert closed_by_server(idle[0], within=5)
        assert not closed_by_server(idle[3], within=0.5)
    finally:
        for sock in idle:
            sock.close()
        server.stop()


def test_when_every_connection_is_busy_new_ones_are_refused_and_logged_once(tmp_path):
    server = HttpServer(tmp_path, CPERSONA_AUTH_TOKEN=TOKEN, CPERSONA_HTTP_MAX_CONNECTIONS="4")
    streams = []
    try:
        for _ in range(4):  # four GET streams: in the middle of a request, so not evictable
            sock = connect(server)
            sock.sendall(request_head(server, method="GET"))
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            streams.append(sock)
        for _ in range(20):
            with connect(server) as refused:
                assert closed_by_server(refused, within=5)
        log = server.log()
        assert 1 <= log.count("refused HTTP connections: all 4 allowed connections") <= 2
        for sock in streams:
            sock.close()
        time.sleep(0.5)
        assert listed(server) == 200  # slots are given back
    finally:
        for sock in streams:
            sock.close()
        server.stop()


# --- the derivation and the rate limits -----------------------------------------------


@pytest.mark.parametrize("limit", [64, 256, 1024, 4096, 65536, 1_048_576])
@pytest.mark.parametrize("in_use", [10, 60])
def test_connections_and_backlog_stay_below_the_file_limit(limit: int, in_use: int) -> None:
    limits = connection_limits(load_settings({}), limit=limit, in_use=in_use)
    assert MIN_CONNECTIONS <= limits.max_connections <= MAX_CONNECTIONS
    if limit - in_use - FD_RESERVE >= MIN_CONNECTIONS * 2:
        # Every connection open plus a full backlog still leaves the reserve untouched.
        assert in_use + limits.max_connections + limits.backlog + FD_RESERVE <= limit


def test_a_configured_bound_is_lowered_to_what_the_file_limit_allows(caplog) -> None:
    settings = load_settings({"CPERSONA_HTTP_MAX_CONNECTIONS": "100000"})
    with caplog.at_level(logging.WARNING, logger="cpersona.mcp.http_guard"):
        limits = connection_limits(settings, limit=256, in_use=10)
    assert limits.max_connections == (256 - 10 - FD_RESERVE) * 3 // 4
    assert "CPERSONA_HTTP_MAX_CONNECTIONS=100000 is more than the file limit allows" in caplog.text
    assert (
        connection_limits(load_settings({"CPERSONA_HTTP_MAX_CONNECTIONS": "5"}), limit=256, in_use=10).max_connections
        == 5
    )


def test_a_recurring_event_is_logged_once_per_interval(caplog) -> None:
    now = [0.0]
    event = RateLimitedLog("refused", interval=10, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="cpersona.mcp.http_guard"):
        logged = [event() for _ in range(1000)]
        now[0] = 10.5
        logged += [event() for _ in range(5)]
    assert logged.count(True) == 2
    assert [r.getMessage() for r in caplog.records] == [
        "refused (1 since the last such message, 1 this process)",
        "refused (1000 since the last such message, 1001 this process)",
    ]


def test_accept_running_out_of_descriptors_is_logged_once_per_interval(caplog) -> None:
    loop = asyncio.new_event_loop()
    try:
        install_accept_error_limit(loop)
        with caplog.at_level(logging.WARNING):
            for _ in range(2048):  # what one EMFILE burst of asyncio's accept loop reports
                loop.call_exception_handler(
                    {
                        "message": "socket.accept() out of system resource",
                        "exception": OSError(24, "Too many open files"),
                    }
                )
            loop.call_exception_handler({"message": "something else"})
    finally:
        loop.close()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("out of file descriptors" in m for m in messages) == 1
    assert any("something else" in m for m in messages)  # other errors still reach the default handler
