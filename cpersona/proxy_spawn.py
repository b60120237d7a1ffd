"""``cpersona proxy --spawn``: find the shared server, or start it, once for every proxy.

In the manner of ``gopls -remote=auto``. Beside the database live two files:

    <db>.server.json   {"url", "token", "pid", "acl_file"}, mode 0600: where the
                       shared server listens, the bearer token it was started
                       with, and the ACL file it enforces (or null)
    <db>.server.lock   held (flock) by the one proxy that is starting a server

A proxy first tries the server the state file names. When nothing answers, it
takes the lock, looks again (another proxy may just have started one), and
otherwise starts ``python -m cpersona`` detached (its own session, no terminal)
on 127.0.0.1 with a free port and a fresh random token, and waits until it
answers. So several proxies starting at once start one server: one database
writer, one embedding model in memory.

Under an ACL file (``CPERSONA_ACL_FILE``) the server would ignore a bearer
token of ours (ACL-7), so it is started with that file, which then holds for
every proxy: each proxy presents its own ``CPERSONA_AUTH_TOKEN``, a token the
file grants, and no token is written down (``"token": null``). A proxy never
joins a server started under another ACL setting than its own: that would
lift its restrictions, or leave it with no credential.

The server stops by itself once no request has come for
``CPERSONA_PROXY_SERVER_IDLE_SECONDS``; every proxy pings it a few times per
that period while its session lives, so it stops only when no proxy is left.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Recorded:
    """What the state file says about a server some proxy started."""

    url: str
    token: str | None
    pid: int | None
    acl_file: str | None


class SpawnRefused(Exception):
    """The shared server cannot serve this proxy as configured; the message says what to change."""


ANSWERS, REFUSED, SILENT = "answers", "refused", "silent"


def acl_file(environ: Mapping[str, str]) -> Path | None:
    """CPERSONA_ACL_FILE as the server reads it (``~`` expanded; empty is unset), made absolute."""
    raw = (environ.get("CPERSONA_ACL_FILE") or "").strip()
    return Path(os.path.abspath(os.path.expanduser(raw))) if raw else None


def database_file(environ: Mapping[str, str]) -> Path:
    """CPERSONA_DB_PATH as the server reads it (``~`` expanded, relative to the working directory)."""
    raw = (environ.get("CPERSONA_DB_PATH") or "").strip() or DEFAULT_DB_PATH
    return Path(os.path.abspath(os.path.expanduser(raw)))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def probe(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT_SECONDS) -> str:
    """ANSWERS (a cpersona serves MCP there and takes the token), REFUSED (something refuses the token), SILENT."""
    body = b'{"jsonrpc":"2.0","id":"cpersona-proxy-probe","method":"ping"}'
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if endpoint.token:  # an empty credential is none at all (``Bearer `` is malformed, not refused)
        headers["Authorization"] = f"Bearer {endpoint.token}"
    try:
        response = httpx.post(endpoint.url, content=body, headers=headers, timeout=timeout)
    except httpx.HTTPError:
        return SILENT
    if response.status_code == 200 and b"cpersona-proxy-probe" in response.content:
        return ANSWERS
    return REFUSED if response.status_code in (401, 403) else SILENT


def answers(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT_SECONDS) -> bool:
    """Whether a cpersona serves MCP at ``endpoint`` and accepts its token."""
    return probe(endpoint, timeout) == ANSWERS


class Spawner:
    def __init__(self, environ: Mapping[str, str], settings: Any) -> None:
        self.environ = dict(environ)
        self.idle_seconds = float(settings.server_idle_seconds)
        self.db_file = database_file(environ)
        self.state_path = self.db_file.with_name(self.db_file.name + ".server.json")
        self.lock_path = self.db_file.with_name(self.db_file.name + ".server.lock")
        self.log_path = self.db_file.with_name(self.db_file.name + ".server.log")
        self.acl_file = acl_file(environ)
        self.own_token = settings.auth_token  # what this proxy presents to a server enforcing the ACL file

    def read_state(self) -> Recorded | None:
        try:
            state = json.loads(self.state_path.read_text(encoding="utf-8"))
            token, pid, acl = state.get("token"), state.get("pid"), state.get("acl_file")
            return Recorded(
                str(state["url"]),
                token if isinstance(token, str) else None,
                pid if isinstance(pid, int) else None,
                acl if isinstance(acl, str) else None,
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def _policy(self, acl: str | None) -> str:
        return f"enforcing CPERSONA_ACL_FILE={acl}" if acl else "without an ACL file"

    def _refused_token(self, where: str) -> SpawnRefused:
        return SpawnRefused(
            f"the shared server {where} refused this proxy's CPERSONA_AUTH_TOKEN: under "
            f"CPERSONA_ACL_FILE={self.acl_file} it must be a token that file grants"
        )

    def _running(self) -> Endpoint | None:
        """The recorded server, when it answers this proxy; None when none is running."""
        recorded = self.read_state()
        if recorded is None:
            return None
        mine = str(self.acl_file) if self.acl_file is not None else None
        token = self.own_token if mine is not None else (recorded.token or "")
        endpoint = Endpoint(recorded.url, token)
        status = probe(endpoint)
        if status == SILENT:
            return None
        where = f"for {self.db_file} (pid {recorded.pid})"
        if recorded.acl_file != mine:
            # Joining would lift this proxy's restrictions, or leave it with no credential.
            raise SpawnRefused(
                f"the shared server {where} runs {self._policy(recorded.acl_file)}, and this proxy "
                f"is configured {self._policy(mine)}; stop that server or start this proxy with "
                "the same CPERSONA_ACL_FILE"
            )
        if status == REFUSED:
            if mine is not None:
                raise self._refused_token(where)
            return None  # a stale record: another server on that port now
        return endpoint

    def ensure_server(self) -> Endpoint:
        """An endpoint that answers: the recorded one, or a server started now (one per database)."""
        if self.acl_file is not None and not self.own_token:
            raise SpawnRefused(
                f"CPERSONA_ACL_FILE={self.acl_file} is set, so the shared server enforces it for "
                "every proxy: set CPERSONA_AUTH_TOKEN to this client's token from that file"
            )
        found = self._running()
        if found is not None:
            return found
        self.db_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a proxy already starting one finishes first
            try:
                found = self._running()
                if found is not None:
                    return found
                return self._start()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _start(self) -> Endpoint:
        port = free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        env = {
            **self.environ,
            "CPERSONA_TRANSPORT": "streamable-http",
            "CPERSONA_HTTP_HOST": "127.0.0.1",
            "CPERSONA_HTTP_PORT": str(port),
            "CPERSONA_DB_PATH": str(self.db_file),
            "CPERSONA_HTTP_IDLE_EXIT_SECONDS": repr(self.idle_seconds),
        }
        if self.acl_file is not None:
            endpoint, recorded_token = Endpoint(url, self.own_token), None
            env["CPERSONA_ACL_FILE"] = str(self.acl_file)  # the server may start in another directory later
            env.pop("CPERSONA_AUTH_TOKEN", None)  # ignored under an ACL file; this proxy's own credential
        else:
            endpoint = Endpoint(url, secrets.token_urlsafe(32))
            recorded_token = endpoint.token
            env["CPERSONA_AUTH_TOKEN"] = endpoint.token
        with open(self.log_path, "ab") as server_log:
            process = subprocess.Popen(
                [sys.executable, "-m", "cpersona"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=server_log,
                start_new_session=True,
                close_fds=True,
            )
        self._write_state(url, recorded_token, process.pid)
        log.info(
            "started the shared cpersona server (pid %d) on %s; its log: %s", process.pid, endpoint.url, self.log_path
        )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited with status {process.returncode}; see {self.log_path}")
            status = probe(endpoint, timeout=2.0)
            if status == ANSWERS:
                return endpoint
            if status == REFUSED and self.acl_file is not None:
                raise self._refused_token(f"it started (pid {process.pid})")  # idles out by itself
            time.sleep(0.2)
        raise RuntimeError(f"the server did not answer within {START_TIMEOUT_SECONDS:.0f} s; see {self.log_path}")

    def _write_state(self, url: str, token: str | None, pid: int) -> None:
        # Written whole under a temporary name, created 0600 (the token is a credential), then renamed.
        temporary = self.state_path.with_name(self.state_path.name + f".{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            acl = str(self.acl_file) if self.acl_file is not None else None
            json.dump({"url": url, "token": token, "pid": pid, "acl_file": acl}, out)
        os.replace(temporary, self.state_path)

    def heartbeat(self, proxy: Any) -> None:
        """Ping a few times per idle period, so the server outlives no proxy and no proxy outlives it.

        Runs in a daemon thread of its own for as long as the proxy's process lives."""
        if self.idle_seconds <= 0:
            return
        interval = max(0.5, self.idle_seconds / 4)
        while True:
            time.sleep(interval)
            try:
                proxy.ping()
            except Exception as exc:  # noqa: BLE001 - the next client request revives the server
                log.info("heartbeat: %s", exc)
