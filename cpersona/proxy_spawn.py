"""``cpersona proxy --spawn``: find the shared server, or start it, once for every proxy.

In the manner of ``gopls -remote=auto``. Beside the database live two files:

    <db>.server.json   {"url", "token", "pid"}, mode 0600: where the shared server
                       listens and the bearer token it was started with
    <db>.server.lock   held (flock) by the one proxy that is starting a server

A proxy first tries the server the state file names. When nothing answers, it
takes the lock, looks again (another proxy may just have started one), and
otherwise starts ``python -m cpersona`` detached (its own session, no terminal)
on 127.0.0.1 with a free port and a fresh random token, and waits until it
answers. So several proxies starting at once start one server: one database
writer, one embedding model in memory.

The server stops by itself once no request has come for
``CPERSONA_PROXY_SERVER_IDLE_SECONDS``; every proxy pings it a few times per
that period while its session lives, so it stops only when no proxy is left.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("cpersona.proxy")

DEFAULT_DB_PATH = "data/cpersona.db"  # cpersona.config's default for CPERSONA_DB_PATH
START_TIMEOUT_SECONDS = 120.0  # a cold start on a loaded machine takes seconds, not minutes
PROBE_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Endpoint:
    url: str
    token: str


def database_file(environ: Mapping[str, str]) -> Path:
    """CPERSONA_DB_PATH as the server reads it (``~`` expanded, relative to the working directory)."""
    raw = (environ.get("CPERSONA_DB_PATH") or "").strip() or DEFAULT_DB_PATH
    return Path(os.path.abspath(os.path.expanduser(raw)))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT_SECONDS) -> bool:
    """Whether a cpersona serves MCP at ``endpoint`` and accepts its token."""
    body = b'{"jsonrpc":"2.0","id":"cpersona-proxy-probe","method":"ping"}'
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "Authorization": f"Bearer {endpoint.token}"}
    try:
        response = httpx.post(endpoint.url, content=body, headers=headers, timeout=timeout)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and b"cpersona-proxy-probe" in response.content


class Spawner:
    def __init__(self, environ: Mapping[str, str], settings: Any) -> None:
        self.environ = dict(environ)
        self.idle_seconds = float(settings.server_idle_seconds)
        self.db_file = database_file(environ)
        self.state_path = self.db_file.with_name(self.db_file.name + ".server.json")
        self.lock_path = self.db_file.with_name(self.db_file.name + ".server.lock")
        self.log_path = self.db_file.with_name(self.db_file.name + ".server.log")

    def read_state(self) -> Endpoint | None:
        try:
            state = json.loads(self.state_path.read_text(encoding="utf-8"))
            return Endpoint(str(state["url"]), str(state["token"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def ensure_server(self) -> Endpoint:
        """An endpoint that answers: the recorded one, or a server started now (one per database)."""
        found = self.read_state()
        if found is not None and answers(found):
            return found
        self.db_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a proxy already starting one finishes first
            try:
                found = self.read_state()
                if found is not None and answers(found):
                    return found
                return self._start()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _start(self) -> Endpoint:
        port = free_port()
        endpoint = Endpoint(f"http://127.0.0.1:{port}/mcp", secrets.token_urlsafe(32))
        env = {**self.environ, "CPERSONA_TRANSPORT": "streamable-http", "CPERSONA_HTTP_HOST": "127.0.0.1",
               "CPERSONA_HTTP_PORT": str(port), "CPERSONA_AUTH_TOKEN": endpoint.token,
               "CPERSONA_DB_PATH": str(self.db_file), "CPERSONA_HTTP_IDLE_EXIT_SECONDS": repr(self.idle_seconds)}
        with open(self.log_path, "ab") as server_log:
            process = subprocess.Popen([sys.executable, "-m", "cpersona"], env=env, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=server_log, start_new_session=True,
                                       close_fds=True)
        self._write_state(endpoint, process.pid)
        log.info("started the shared cpersona server (pid %d) on %s; its log: %s", process.pid, endpoint.url,
                 self.log_path)
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited with status {process.returncode}; see {self.log_path}")
            if answers(endpoint, timeout=2.0):
                return endpoint
            time.sleep(0.2)
        raise RuntimeError(f"the server did not answer within {START_TIMEOUT_SECONDS:.0f} s; see {self.log_path}")

    def _write_state(self, endpoint: Endpoint, pid: int) -> None:
        # Written whole under a temporary name, created 0600 (the token is a credential), then renamed.
        temporary = self.state_path.with_name(self.state_path.name + f".{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"url": endpoint.url, "token": endpoint.token, "pid": pid}, out)
        os.replace(temporary, self.state_path)

    async def heartbeat(self, proxy: Any) -> None:
        """Ping a few times per idle period, so the server outlives no proxy and no proxy outlives it."""
        if self.idle_seconds <= 0:
            return
        interval = max(0.5, self.idle_seconds / 4)
        while True:
            await asyncio.sleep(interval)
            try:
                await proxy.ping()
            except Exception as exc:  # noqa: BLE001 - the next client request revives the server
                log.info("heartbeat: %s", exc)
