"""The HTTP request-body budget (spec transport-and-config §5): counted on arrival, warn / reject / off."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cpersona.mcp.http import BodyBudget
from cpersona.mcp.validation import (
    ENVELOPE_BYTES,
    JSON_BYTES_PER_CHAR,
    JSON_BYTES_PER_VALUE,
    MAX_REQUEST_BYTES,
    MAX_TEXT_CHARS,
    MAX_VALUES,
)
from test_http_transport import MCP_HEADERS, HttpServer, auth, raw_post, sse_result, tool_request

pytestmark = pytest.mark.anyio

TOKEN = "budget-token"


def big_store(chars: int) -> dict[str, Any]:
    return tool_request("store", {"agent_id": "a", "content": "x" * chars})


@pytest.fixture
def reject_server(tmp_path) -> Iterator[HttpServer]:
    server = HttpServer(
        tmp_path, CPERSONA_AUTH_TOKEN=TOKEN, CPERSONA_HTTP_MAX_BODY_BYTES="2000", CPERSONA_HTTP_BODY_LIMIT_MODE="reject"
    )
    yield server
    server.stop()


def test_reject_answers_413_and_logs_the_crossing(reject_server):  # spec BB-2, BB-3, BB-4
    body = json.dumps(big_store(5000)).encode()
    response = httpx.post(reject_server.url, headers={**MCP_HEADERS, **auth(TOKEN)}, content=body)
    assert response.status_code == 413
    assert response.json() == {"error": "payload_too_large", "max_bytes": 2000}
    log = reject_server.log()
    assert "exceeded CPERSONA_HTTP_MAX_BODY_BYTES on POST /mcp" in log
    assert "against a budget of 2000 (mode=reject). Occurrence 1 this process." in log
    assert "answered 413 and the rest of the body was not read" in log


def test_a_chunked_body_is_measured_by_what_arrives(reject_server):  # spec BB-1
    def chunks() -> Iterator[bytes]:
        payload = json.dumps(big_store(6000)).encode()
        for i in range(0, len(payload), 500):
            yield payload[i : i + 500]

    response = httpx.post(reject_server.url, headers={**MCP_HEADERS, **auth(TOKEN)}, content=chunks())
    assert response.status_code == 413
    assert response.json()["max_bytes"] == 2000


def test_within_budget_is_served_and_stores_nothing_when_rejected(reject_server):  # spec BB-2
    small = raw_post(reject_server.url, auth(TOKEN), tool_request("store", {"agent_id": "a", "content": "fits"}))
    assert small.status_code == 200
    assert json.loads(sse_result(small)["result"]["content"][0]["text"])["result"] == "stored"
    httpx.post(reject_server.url, headers={**MCP_HEADERS, **auth(TOKEN)}, content=json.dumps(big_store(5000)))
    listed = raw_post(reject_server.url, auth(TOKEN), tool_request("list_memories", {"agent_id": "a"}))
    rows = json.loads(sse_result(listed)["result"]["content"][0]["text"])["memories"]
    assert [r["content"] for r in rows] == ["fits"]


def test_an_unauthenticated_request_gets_401_whatever_its_size(reject_server):  # spec BB-4, AUTH-3
    response = httpx.post(reject_server.url, headers=MCP_HEADERS, content=json.dumps(big_store(5000)))
    assert response.status_code == 401


def test_a_413_carries_cors_headers(reject_server):  # spec BB-4 (budget inside CORS)
    response = httpx.post(
        reject_server.url,
        headers={**MCP_HEADERS, **auth(TOKEN), "Origin": "https://claude.ai"},
        content=json.dumps(big_store(5000)),
    )
    assert response.status_code == 413
    assert response.headers["access-control-allow-origin"] == "https://claude.ai"


def test_warn_serves_in_full_and_logs(tmp_path):  # spec BB-2, BB-3
    server = HttpServer(tmp_path, CPERSONA_AUTH_TOKEN=TOKEN, CPERSONA_HTTP_MAX_BODY_BYTES="2000")
    try:
        response = raw_post(server.url, auth(TOKEN), big_store(5000))
        assert response.status_code == 200
        assert json.loads(sse_result(response)["result"]["content"][0]["text"])["result"] == "stored"
        assert "(mode=warn). Occurrence 1 this process. The request was served in full." in server.log()
    finally:
        server.stop()


def test_off_does_not_count_and_the_sdk_ceiling_is_gone(tmp_path):  # spec BB-2, T-3
    server = HttpServer(
        tmp_path, CPERSONA_AUTH_TOKEN=TOKEN, CPERSONA_HTTP_MAX_BODY_BYTES="2000", CPERSONA_HTTP_BODY_LIMIT_MODE="off"
    )
    try:
        # 5 MB: past both our budget and the SDK's own 4 MiB default.
        response = raw_post(server.url, auth(TOKEN), big_store(5_000_000))
        assert response.status_code == 200
        answer = json.loads(sse_result(response)["result"]["content"][0]["text"])
        assert answer["result"] == "stored" and answer["truncated"] is True
        assert "exceeded CPERSONA_HTTP_MAX_BODY_BYTES" not in server.log()
    finally:
        server.stop()


# --- the middleware itself, for what a well-behaved HTTP client cannot send ---------------


class Recorder:
    """An ASGI app that reads the whole body and answers 200 with its size."""

    def __init__(self) -> None:
        self.read = 0

    async def __call__(self, scope, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                await send({"type": "http.response.start", "status": 499, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
            self.read += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(self.read).encode()})


async def drive(budget: BodyBudget, declared: int, chunks: list[bytes]) -> tuple[list[dict[str, Any]], int]:
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": [(b"content-length", str(declared).encode())]}
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await budget(scope, receive, send)
    return sent, pulled


async def test_a_lying_content_length_is_never_trusted():  # spec BB-1
    app = Recorder()
    sent, pulled = await drive(BodyBudget(app, 1000, "reject"), declared=10, chunks=[b"x" * 600] * 5)
    assert sent[0]["status"] == 413
    assert pulled == 2  # reading stopped at the chunk that crossed the budget
    assert len(sent) == 2  # the application's own answer went nowhere
    honest = Recorder()
    sent, _ = await drive(BodyBudget(honest, 1000, "reject"), declared=10**6, chunks=[b"x" * 300] * 3)
    assert sent[0]["status"] == 200 and honest.read == 900  # a header over the budget alone refuses nothing


async def test_crossings_are_logged_at_the_1st_10th_100th(caplog):  # spec BB-3
    budget = BodyBudget(Recorder(), 10, "warn")
    with caplog.at_level(logging.WARNING, logger="cpersona.mcp.http"):
        for _ in range(120):
            sent, _ = await drive(budget, declared=0, chunks=[b"y" * 25])
            assert sent[0]["status"] == 200
    occurrences = [r.getMessage() for r in caplog.records if "exceeded" in r.getMessage()]
    assert len(occurrences) == 3
    assert [
        "Occurrence 1 " in occurrences[0],
        "Occurrence 10 " in occurrences[1],
        "Occurrence 100 " in occurrences[2],
    ] == [True, True, True]
    assert budget.crossings == 120


# --- the edge: a body of exactly the budget is within it; one byte more is not ----------------------------


def body_of(size: int) -> bytes:
    """A real store request of exactly ``size`` bytes (the content pads it)."""
    bare = len(json.dumps(big_store(0)).encode())
    body = json.dumps(big_store(size - bare)).encode()
    assert len(body) == size
    return body


def test_a_body_exactly_at_the_budget_is_served_and_one_byte_over_is_not(reject_server):  # spec BB-1, BB-2
    at = httpx.post(reject_server.url, headers={**MCP_HEADERS, **auth(TOKEN)}, content=body_of(2000))
    assert at.status_code == 200
    assert json.loads(sse_result(at)["result"]["content"][0]["text"])["result"] == "stored"
    over = httpx.post(reject_server.url, headers={**MCP_HEADERS, **auth(TOKEN)}, content=body_of(2001))
    assert over.status_code == 413 and over.json() == {"error": "payload_too_large", "max_bytes": 2000}
    assert reject_server.log().count("exceeded CPERSONA_HTTP_MAX_BODY_BYTES") == 1


@pytest.mark.parametrize("mode", ["reject", "warn"])
@pytest.mark.parametrize("split", [1, 3, 1000])
async def test_the_budget_edge_holds_however_the_body_is_split(mode, split, caplog):  # spec BB-1
    for size, crosses in ((1000, False), (1001, True)):
        app = Recorder()
        budget = BodyBudget(app, 1000, mode)
        step = -(-size // split)
        chunks = [b"z" * (min(i + step, size) - i) for i in range(0, size, step)]
        with caplog.at_level(logging.WARNING, logger="cpersona.mcp.http"):
            caplog.clear()
            sent, _ = await drive(budget, declared=size, chunks=chunks)
        assert budget.crossings == int(crosses)
        assert ("exceeded" in caplog.text) is crosses
        if crosses and mode == "reject":
            assert sent[0]["status"] == 413
        else:
            assert sent[0]["status"] == 200 and app.read == size


# --- the hard cap: larger than any tool can accept (issue 13 item 4) ------------------


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def huge_request(server: HttpServer, framing: str) -> bytes:
    return (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
    ).encode()


def answer_status(sock: socket.socket, timeout: float = 60, whole: bool = False) -> bytes:
    """The answer's head, or (``whole``) everything until the server closes the connection."""
    sock.settimeout(timeout)
    received = b""
    while whole or b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


@pytest.fixture
def warn_server(tmp_path) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path, CPERSONA_AUTH_TOKEN=TOKEN)  # the default mode: warn
    yield server
    server.stop()


def test_a_declared_200_mb_body_is_refused_in_warn_mode_before_any_of_it_is_read(warn_server):
    raw_post(warn_server.url, auth(TOKEN), tool_request("list_memories", {"agent_id": "a"}))  # warm up
    before = peak_rss_kib(warn_server.proc.pid)
    with socket.create_connection(("127.0.0.1", warn_server.port), timeout=10) as sock:
        sock.sendall(huge_request(warn_server, "Content-Length: 200000000"))
        answer = answer_status(sock, whole=True)  # no body byte was sent: only the header can have refused it
    assert answer.startswith(b"HTTP/1.1 413")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"error": "payload_too_large", "max_bytes": MAX_REQUEST_BYTES}
    assert peak_rss_kib(warn_server.proc.pid) - before < 20_000
    assert "longer than the largest request any tool can accept" in warn_server.log()


def test_a_chunked_200_mb_body_is_refused_once_past_the_cap_without_holding_it(warn_server):
    raw_post(warn_server.url, auth(TOKEN), tool_request("list_memories", {"agent_id": "a"}))
    before = peak_rss_kib(warn_server.proc.pid)
    chunk = b"%x\r\n%s\r\n" % (1 << 20, b"x" * (1 << 20))
    sent = 0
    with socket.create_connection(("127.0.0.1", warn_server.port), timeout=10) as sock:
        sock.sendall(huge_request(warn_server, "Transfer-Encoding: chunked"))
        try:
            while sent < 200 << 20:
                sock.sendall(chunk)
                sent += 1 << 20
        except (BrokenPipeError, ConnectionResetError, TimeoutError, socket.timeout):
            pass  # the server stopped reading: what we want
        try:
            head = answer_status(sock, timeout=10)
        except (ConnectionResetError, TimeoutError, socket.timeout):
            head = b""
    assert sent < 200 << 20  # the server did not take the whole body
    assert head == b"" or head.startswith(b"HTTP/1.1 413")
    # About one copy of the ~51 MiB cap at most was held (the old code grew by ~600 MB here).
    grown = peak_rss_kib(warn_server.proc.pid) - before
    print(f"peak RSS grew by {grown} KiB after {sent} bytes sent")
    assert grown < 200_000
    assert "longer than the largest request any tool can accept" in warn_server.log()
    assert raw_post(warn_server.url, auth(TOKEN), tool_request("list_memories", {"agent_id": "a"})).status_code == 200


async def test_the_hard_cap_binds_in_every_mode_and_the_budget_below_it_keeps_its_meaning():
    for mode in ("warn", "off", "reject"):
        at_cap = Recorder()
        sent, _ = await drive(
            BodyBudget(at_cap, 10_000, mode, hard_max_bytes=1000), declared=0, chunks=[b"x" * 500] * 2
        )
        assert sent[0]["status"] == 200 and at_cap.read == 1000  # exactly at the cap: served
        over = Recorder()
        sent, pulled = await drive(
            BodyBudget(over, 10_000, mode, hard_max_bytes=1000), declared=0, chunks=[b"x" * 600] * 5
        )
        assert sent[0]["status"] == 413 and json.loads(sent[1]["body"]) == {
            "error": "payload_too_large",
            "max_bytes": 1000,
        }
        assert pulled == 2  # refused at the chunk that crossed it
        declared = Recorder()
        sent, pulled = await drive(
            BodyBudget(declared, 10_000, mode, hard_max_bytes=1000), declared=1001, chunks=[b"x"]
        )
        assert sent[0]["status"] == 413 and pulled == 0  # the Content-Length fast path reads nothing


def test_the_hard_cap_is_the_largest_request_the_argument_walk_accepts():
    # One place: the walk's own bounds at their worst JSON spelling, plus the envelope.
    assert MAX_REQUEST_BYTES == (
        MAX_TEXT_CHARS * JSON_BYTES_PER_CHAR + MAX_VALUES * JSON_BYTES_PER_VALUE + ENVELOPE_BYTES
    )
    longest = json.dumps(
        tool_request(
            "recall_with_context",
            {
                "agent_id": "a",
                "query": "q",
                "external_context": [{"role": "user", "content": "\u00e9" * (MAX_TEXT_CHARS - 100)}],
            },
        )
    ).encode()  # ensure_ascii: 6 bytes a char
    assert len(longest) <= MAX_REQUEST_BYTES
