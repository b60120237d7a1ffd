"""Driving the real ``python -m cpersona`` process over stdio in tests.

The fixtures live here, not in a conftest.py: a second conftest module would
shadow tests/conftest.py for every ``from conftest import ...`` in the suite.
Test modules import the fixtures they use by name.

Two ways to talk to it: the SDK's own client (what an MCP host does), and raw
JSON-RPC lines (to send what the SDK client cannot encode, such as a lone
surrogate escape, and to prove an unreadable line does not hang the server).
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import StdioServerParameters

REFERENCE = json.loads((Path(__file__).parent / "reference_tools.json").read_text())


def server_env(db_path: Path, **extra: str) -> dict[str, str]:
    """A clean environment: no CPERSONA_* from the developer's shell leaks into a test."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    env.update({"CPERSONA_DB_PATH": str(db_path), "CPERSONA_UPDATE_CHECK": "false"})
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cpersona", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


class RawSession:
    """Newline-delimited JSON-RPC written by hand to a server process."""

    def __init__(
        self,
        env: dict[str, str],
        args: list[str] | None = None,
        *,
        argv: list[str] | None = None,
        stderr: Any = subprocess.DEVNULL,
    ) -> None:
        # args: what follows the interpreter (default -m cpersona); argv: a whole other command
        command = argv or [sys.executable, *(args or ["-m", "cpersona"])]
        self.proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)
        self._buffer = b""
        self._next_id = 0

    def send_line(self, line: str) -> None:
        self.proc.stdin.write(line.encode("utf-8") + b"\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any] | None = None, *, raw_params: str | None = None) -> int:
        self._next_id += 1
        params_text = raw_params if raw_params is not None else json.dumps(params or {})
        self.send_line(
            '{"jsonrpc":"2.0","id":%d,"method":%s,"params":%s}' % (self._next_id, json.dumps(method), params_text)
        )
        return self._next_id

    def reply(self, request_id: int, timeout: float = 30) -> dict[str, Any]:
        """The response to ``request_id``; notifications and other replies are skipped."""
        return self.replies([request_id], timeout)[request_id]

    def replies(self, request_ids: list[int], timeout: float = 30) -> dict[int, dict[str, Any]]:
        """The responses to all of ``request_ids``, in whatever order they come; others are skipped."""
        found: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                message = json.loads(line)
                if message.get("id") in request_ids and ("result" in message or "error" in message):
                    found[message["id"]] = message
                    if len(found) == len(request_ids):
                        return found
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._selector.select(remaining):
                missing = sorted(set(request_ids) - set(found))
                raise TimeoutError(f"no reply to request {', '.join(map(str, missing))} within {timeout}s")
            chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            if not chunk:
                raise EOFError("the server closed stdout")
            self._buffer += chunk

    def initialize(self) -> dict[str, Any]:
        answer = self.reply(
            self.request(
                "initialize",
                {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "raw-test", "version": "0"},
                },
            )
        )
        self.send_line('{"jsonrpc":"2.0","method":"notifications/initialized"}')
        return answer

    def call(self, name: str, arguments_json: str, timeout: float = 30) -> dict[str, Any]:
        """tools/call with the arguments given as JSON text (so any bytes can be sent)."""
        request_id = self.request(
            "tools/call", raw_params='{"name":%s,"arguments":%s}' % (json.dumps(name), arguments_json)
        )
        return self.reply(request_id, timeout)

    def close(self) -> int:
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=30)
        finally:
            self._selector.close()
            self.proc.stdout.close()


@pytest.fixture
def e2e_db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "memory.db"


@pytest.fixture
def stdio_params(e2e_db_path: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "cpersona"], env=server_env(e2e_db_path))


@pytest.fixture
def raw_session(e2e_db_path: Path):
    session = RawSession(server_env(e2e_db_path))
    session.initialize()
    yield session
    if session.proc.poll() is None:
        session.close()
