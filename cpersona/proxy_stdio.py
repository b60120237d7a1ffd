"""``cpersona proxy`` / ``python -m cpersona.proxy_stdio``: stdio for the client, one shared HTTP server behind it.

MCP hosts (Claude Code, Claude Desktop) start one stdio server per session.
This process is that server, and it is thin: every JSON-RPC line the client
writes is POSTed to a streamable-HTTP cpersona at ``CPERSONA_REMOTE_URL`` (spec
transport-and-config T-10) with ``Authorization: Bearer $CPERSONA_AUTH_TOKEN``,
and every message the server sends back (a JSON body or an SSE stream) is
written to stdout, one line each. The wire format is spoken here with httpx
alone, so a session's process loads neither the MCP SDK nor SQLAlchemy nor the
database code: many sessions share one warm server, one database writer and one
embedding model.

    line from the client          → POST; answers and notifications relayed back
    server-initiated messages     → read from the session's GET stream (one, reopened when it
                                    ends or fails) and relayed like answers
    ``initialize``                → answered by the real server (same instructions, tools)
    more than MAX_INFLIGHT unanswered messages
                                  → stdin is not read until one is answered (T-10)
    connection lost mid-request   → an error answer for that request, never silence
    server back (or respawned)    → the session is initialized again, transparently
    session expired (404)         → initialized again, the message sent once more
    stdin closed                  → in-flight requests finish (bounded), then exit

With ``--spawn`` (or ``CPERSONA_PROXY_SPAWN=true``) the proxy starts the shared
server itself when none answers (:mod:`cpersona.proxy_spawn`).

Threads, not an event loop: the main thread reads stdin, each message is
POSTed by a thread of its own (at most MAX_INFLIGHT at once) through one
thread-safe synchronous httpx client, and writes to stdout are serialised.
So the process loads neither asyncio nor AnyIO (httpcore would import AnyIO,
and trio where installed, for its async half; see ``_import_httpx``).

Settings are read here from the environment with the same rules as
:mod:`cpersona.config` (tests/test_proxy.py holds the two to each other):
loading the settings model would cost this process more than everything else
it does.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def _import_httpx() -> Any:
    """httpx, without the modules only its async half and its command-line tool use.

    httpcore imports AnyIO (and trio, whenever it is installed) at module level
    for its async connection pool: 0.1 s of CPU and several MiB in a process
    that only ever uses the synchronous client. httpx's package likewise imports
    its command-line tool (click, rich, pygments) when those are installed. A
    None entry in ``sys.modules`` makes each of those optional imports fail the
    way httpcore and httpx expect when the package is absent; the entries for
    anyio and trio are removed again afterwards, so nothing else in the process
    is kept from importing them.
    """
    if "httpx" in sys.modules:
        return sys.modules["httpx"]
    sys.modules.setdefault("httpx._main", None)  # type: ignore[assignment]
    placed = [name for name in ("anyio", "trio") if name not in sys.modules]
    for name in placed:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        import httpcore  # noqa: F401 - imported now, while the async libraries read as absent
        import httpx
    finally:
        for name in placed:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]
    return httpx


httpx = _import_httpx()

log = logging.getLogger("cpersona.proxy")

DEFAULT_REMOTE_URL = "http://localhost:8402/mcp"
DEFAULT_MAX_INFLIGHT = 8
# Work a request may take on the server before the proxy answers it with an error.
READ_TIMEOUT_SECONDS = 300.0
CONNECT_TIMEOUT_SECONDS = 5.0
# How long, after stdin closes, requests still in flight may take to be answered.
CLOSE_WAIT_SECONDS = 30.0
# Waits before the GET stream is opened again: doubled after each failure up to the cap,
# back to the first after a stream that opened; a new session retries at once.
LISTEN_RETRY_SECONDS = 0.5
LISTEN_RETRY_MAX_SECONDS = 10.0
# JSON-RPC error code of the proxy's own answers (implementation-defined server error range).
PROXY_ERROR = -32000
PARSE_ERROR = -32700
ACCEPT = "application/json, text/event-stream"
_INT = re.compile(r"[+-]?\d+")  # as cpersona.config reads integers


class ProxyConfigError(ValueError):
    """A proxy setting cannot be used; the message names the variable."""


@dataclass(frozen=True)
class ProxySettings:
    remote_url: str
    auth_token: str
    max_inflight: int
    spawn: bool
    server_idle_seconds: float


def _value(environ: Mapping[str, str], name: str) -> str | None:
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return None  # spec CFG-5: empty counts as unset
    return raw.strip()


def _integer(environ: Mapping[str, str], name: str, default: int, lo: int) -> int:
    raw = _value(environ, name)
    if raw is None:
        return default
    if not _INT.fullmatch(raw):
        raise ProxyConfigError(f"{name}={raw!r} is not a whole number")
    value = int(raw)
    if value < lo:  # clamped, as the settings model does (T-10: below 1 → 1)
        log.warning("%s=%s is out of range; using %s", name, value, lo)
        value = lo
    return value


def _number(environ: Mapping[str, str], name: str, default: float, lo: float) -> float:
    raw = _value(environ, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ProxyConfigError(f"{name}={raw!r} is not a number")
    if value < lo:
        raise ProxyConfigError(f"{name}={value} is below the minimum of {lo}")
    return value


def _boolean(environ: Mapping[str, str], name: str) -> bool:
    raw = _value(environ, name)
    if raw is None:
        return False
    if raw.lower() in ("true", "1", "yes", "on"):
        return True
    if raw.lower() in ("false", "0", "no", "off"):
        return False
    raise ProxyConfigError(f"{name}={raw!r} is not true or false")


def proxy_settings(environ: Mapping[str, str] | None = None) -> ProxySettings:
    environ = os.environ if environ is None else environ
    return ProxySettings(
        remote_url=_value(environ, "CPERSONA_REMOTE_URL") or DEFAULT_REMOTE_URL,
        auth_token=_value(environ, "CPERSONA_AUTH_TOKEN") or "",
        max_inflight=_integer(environ, "CPERSONA_PROXY_MAX_INFLIGHT", DEFAULT_MAX_INFLIGHT, 1),
        spawn=_boolean(environ, "CPERSONA_PROXY_SPAWN"),
        server_idle_seconds=_number(environ, "CPERSONA_PROXY_SERVER_IDLE_SECONDS", 600.0, 0.0),
    )


def tls_verification(url: str) -> Any:
    """What the proxy's client verifies TLS with: the default CA bundle for an https URL.

    For a plain-http URL (the usual loopback server, and every server --spawn
    starts) no bundle is loaded: reading certifi's file cost this process more
    CPU than the rest of a proxied call. The context given instead still demands
    a verified certificate and holds no authority to verify one with, so an
    https hop it was never meant for fails rather than trusting anyone.
    """
    if url.strip().lower().startswith("https:"):
        return True
    import ssl

    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class Unreachable(Exception):
    """The request never reached the server (nothing listens, or the connection was refused)."""


class Broken(Exception):
    """The request may have reached the server, but no answer came back."""


class Expired(Exception):
    """The server no longer knows the session (404 on a request that carried its id, the argument)."""


class Proxy:
    """One client session over stdio, forwarded to the HTTP server."""

    def __init__(self, settings: ProxySettings, *, spawner: Any = None) -> None:
        self.settings = settings
        self.url = settings.remote_url
        self.token = settings.auth_token
        self._spawner = spawner
        # One client for every thread: httpx's synchronous client and its pool are thread-safe.
        self._http = httpx.Client(
            timeout=httpx.Timeout(READ_TIMEOUT_SECONDS, connect=CONNECT_TIMEOUT_SECONDS),
            verify=tls_verification(settings.remote_url),
        )
        self._room = threading.BoundedSemaphore(settings.max_inflight)
        self._out = threading.Lock()  # one writer of stdout at a time: every line whole
        self._closed = False  # set once exit has answered what was still in flight; later writes are dropped
        self._busy = threading.Condition()
        self._pending: dict[int, Any] = {}  # forwarding thread → the id of the request it carries
        self._forwarding = 0
        self._session_id: str | None = None
        self._protocol_version: str | None = None
        self._init_params: Any = None  # the client's initialize, replayed after a reconnect
        self._needs_init = False
        self._init_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._listener: threading.Thread | None = None
        self._listener_lock = threading.Lock()
        self._listen_wake = threading.Event()  # a new session: (re)open the GET stream now

    # -- stdio ---------------------------------------------------------------------

    def write(self, message: Any) -> None:
        line = message if isinstance(message, bytes) else json.dumps(message, ensure_ascii=False).encode("utf-8")
        with self._out:
            if not self._closed:
                self._emit(line)

    def ping(self) -> None:
        """One ``ping`` the client never sees: keeps a spawned server from idling out while this session lives."""
        body = json.dumps({"jsonrpc": "2.0", "id": f"cpersona-proxy-ping-{next(self._ids)}", "method": "ping"})
        self._post(body.encode("utf-8"), relay=False)

    def answer_error(self, request_id: Any, text: str) -> None:
        self.write(_error(request_id, text))

    def run(self, stdin: Any) -> None:
        """Forward every line until stdin ends, then let in-flight requests finish (bounded)."""
        try:
            for raw in iter(stdin.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not line.strip():
                    continue
                self._room.acquire()  # back-pressure: stdin waits while MAX_INFLIGHT are unanswered
                with self._busy:
                    self._forwarding += 1
                threading.Thread(target=self._forward, args=(line,), name="cpersona-proxy-post", daemon=True).start()
            with self._busy:  # stdin ended; an interrupt (Ctrl-C) does not wait
                self._busy.wait_for(lambda: self._forwarding == 0, timeout=CLOSE_WAIT_SECONDS)
        finally:
            with self._busy:
                unanswered = list(self._pending.values())
            with self._out:
                # What is still in flight is answered now, and whatever its thread writes later is dropped.
                for request_id in unanswered:
                    if not self._closed:
                        stopped = _error(request_id, "cpersona proxy: stopped before the server answered")
                        self._emit(json.dumps(stopped).encode("utf-8"))
                self._closed = True
            self._listen_wake.set()

    def _emit(self, line: bytes) -> None:
        """One line to the client; the caller holds the stdout lock."""
        try:
            sys.stdout.buffer.write(line + b"\n")
            sys.stdout.buffer.flush()
        except (OSError, ValueError):  # the client stopped reading: nobody is left to answer
            self._closed = True

    # -- one message ---------------------------------------------------------------

    def _forward(self, line: str) -> None:
        me = threading.get_ident()
        try:
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):
                message = None
            request_id = message.get("id") if isinstance(message, dict) and "method" in message else None
            is_initialize = isinstance(message, dict) and message.get("method") == "initialize"
            if request_id is not None:
                with self._busy:
                    self._pending[me] = request_id
            try:
                self._deliver(line.encode("utf-8"), message, request_id, is_initialize)
            except (Unreachable, Broken) as exc:
                self._needs_init = self._init_params is not None
                if request_id is not None:
                    self.answer_error(request_id, f"cpersona proxy: {exc}")
                else:
                    log.warning("a notification or answer from the client was not delivered: %s", exc)
            except Exception as exc:  # noqa: BLE001 - an unexpected failure still answers the request
                log.exception("forwarding failed")
                if request_id is not None:
                    self.answer_error(request_id, f"cpersona proxy: {type(exc).__name__}: {exc}")
        finally:
            with self._busy:
                self._pending.pop(me, None)
                self._forwarding -= 1
                self._busy.notify_all()
            self._room.release()

    def _deliver(self, body: bytes, message: Any, request_id: Any, is_initialize: bool) -> None:
        if not is_initialize and self._needs_init:
            self._reinitialize()
        for attempt in (1, 2):
            try:
                answered = self._post(body, relay=True, capture=is_initialize)
            except Unreachable:
                if attempt == 2 or not self._revive():
                    raise
                continue
            except Expired as exc:
                if attempt == 2 or self._init_params is None:
                    raise Broken("the server ended the session") from None
                self._reinitialize(stale=exc.args[0])
                continue
            if is_initialize and isinstance(message, dict):
                self._init_params = message.get("params")
                self._needs_init = False
                self._listen_soon()
            if request_id is not None and request_id not in answered:
                raise Broken("the server closed the answer stream before answering")
            return

    def _revive(self) -> bool:
        """Nothing answered: with --spawn, start (or find) the shared server and initialize again."""
        if self._spawner is None:
            return False
        endpoint = self._spawner.ensure_server()
        self.url, self.token = endpoint.url, endpoint.token
        self._session_id = None
        if self._init_params is not None:
            self._reinitialize()
        return True

    def _reinitialize(self, stale: str | None = None) -> None:
        """Initialize a new session with the client's own parameters; ``stale``: the session the server forgot."""
        with self._init_lock:
            if not self._needs_init and self._session_id is not None and self._session_id != stale:
                return  # another thread has already initialized a live session
            self._session_id = None
            init_id = f"cpersona-proxy-initialize-{next(self._ids)}"
            body = json.dumps(
                {"jsonrpc": "2.0", "id": init_id, "method": "initialize", "params": self._init_params}
            ).encode("utf-8")
            answered = self._post(body, relay=False, capture=True)
            if init_id not in answered:
                raise Broken("the server did not answer initialize")
            self._post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}', relay=False)
            self._needs_init = False
            self._listen_soon()

    # -- what the server sends outside any answer -------------------------------------

    def _listen_soon(self) -> None:
        """A session is (newly) initialized: open its GET stream, starting the one listener if none runs.

        Only for a server that keeps sessions (it gave an ``Mcp-Session-Id``): one
        without them, as cpersona's own stateless server, has nobody to address a
        message to outside an answer; its SDK would hold such a GET open and never
        write to it, a server task per proxy for nothing.
        """
        if self._session_id is None:
            return
        with self._listener_lock:
            if self._listener is None:
                self._listener = threading.Thread(target=self._listen, name="cpersona-proxy-listen", daemon=True)
                self._listener.start()
        self._listen_wake.set()

    def _listen(self) -> None:
        """Relay the session's GET stream to the client for as long as the proxy runs; reopen it when it ends.

        Streamable HTTP carries what a server sends on its own (list_changed,
        resource updates, its requests to the client) on a GET stream the
        client opens. One stream at a time; a server that does not offer one
        (405, or no such session) is asked again only once a new session is
        initialized.
        """
        delay = LISTEN_RETRY_SECONDS
        while not self._closed:
            self._listen_wake.clear()
            outcome = self._listen_once()
            if self._closed:
                return
            if outcome == "refused":
                self._listen_wake.wait()
                continue
            if outcome == "ended":
                delay = LISTEN_RETRY_SECONDS
            self._listen_wake.wait(delay)
            if outcome == "failed":
                delay = min(delay * 2, LISTEN_RETRY_MAX_SECONDS)

    def _listen_once(self) -> str:
        """One GET stream, relayed until it ends: "ended" (it was open), "refused" or "failed" (never opened)."""
        if self._session_id is None:
            return "refused"
        headers = self._headers()
        del headers["Content-Type"]
        headers["Accept"] = "text/event-stream"
        opened = False
        try:
            with self._http.stream("GET", self.url, headers=headers) as response:
                kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if response.status_code != 200 or kind != "text/event-stream":
                    return "refused"
                opened = True
                for data in _sse_data(response):
                    self._received(data, set(), relay=True, capture=False)
        except httpx.HTTPError:
            return "ended" if opened else "failed"
        return "ended"

    # -- HTTP ------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": ACCEPT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self._session_id:
            headers["Mcp-Session-Id"] = self._session_id
        if self._protocol_version:
            headers["Mcp-Protocol-Version"] = self._protocol_version
        return headers

    def _post(self, body: bytes, *, relay: bool, capture: bool = False) -> set[Any]:
        """POST one message; relay what comes back; the ids of the answers seen."""
        answered: set[Any] = set()
        sent_session = self._session_id
        try:
            with self._http.stream("POST", self.url, content=body, headers=self._headers()) as response:
                if response.status_code == 404 and sent_session:
                    raise Expired(sent_session)
                if capture and response.headers.get("mcp-session-id"):
                    self._session_id = response.headers["mcp-session-id"]
                if response.status_code == 202:
                    return answered
                kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if kind == "text/event-stream":
                    for data in _sse_data(response):
                        self._received(data, answered, relay, capture)
                    return answered
                payload = response.read()
                if kind == "application/json" and payload.strip():
                    self._received(payload, answered, relay, capture)
                    return answered
                if response.status_code >= 400:
                    raise Broken(
                        f"the server answered HTTP {response.status_code}: {payload[:200].decode('utf-8', 'replace')}"
                    )
                return answered
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise Unreachable(f"nothing answers at {self.url} ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise Broken(f"the connection to {self.url} failed: {type(exc).__name__}: {exc}") from None

    def _received(self, data: bytes, answered: set[Any], relay: bool, capture: bool) -> None:
        try:
            parsed = json.loads(data)
        except (ValueError, RecursionError):
            log.warning("the server sent a message that is not JSON (%d bytes); dropped", len(data))
            return
        for message in parsed if isinstance(parsed, list) else [parsed]:
            if not isinstance(message, dict):
                continue
            if "method" not in message and "id" in message:
                answered.add(message["id"])
                result = message.get("result")
                if capture and isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
                    self._protocol_version = result["protocolVersion"]
            if relay:
                single = data if not isinstance(parsed, list) and b"\n" not in data.strip() else None
                self.write(single.strip() if single is not None else message)


def _error(request_id: Any, text: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": PROXY_ERROR, "message": text}}


def _sse_data(response: Any) -> Any:
    """The ``data`` of each server-sent event (the fields of one event joined by newlines)."""
    data: list[str] = []
    for line in response.iter_lines():
        if line == "":
            if data:
                yield "\n".join(data).encode("utf-8")
            data = []
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
        # event:, id:, retry: and comments carry nothing a stdio client needs
    if data:
        yield "\n".join(data).encode("utf-8")


# -- the command -----------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s [%(name)s] %(levelname)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise on the client's stderr
    try:
        settings = proxy_settings()
    except ProxyConfigError as exc:
        print(f"cpersona: {exc}", file=sys.stderr)
        return 2
    spawner = None
    if args.spawn or settings.spawn:
        from cpersona.proxy_spawn import Spawner

        spawner = Spawner(os.environ, settings)
        try:
            endpoint = spawner.ensure_server()
        except Exception as exc:  # noqa: BLE001 - a start-up failure is one line on stderr
            print(f"cpersona: could not start the shared server: {exc}", file=sys.stderr)
            return 1
        settings = ProxySettings(
            endpoint.url, endpoint.token, settings.max_inflight, True, settings.server_idle_seconds
        )
    proxy = Proxy(settings, spawner=spawner)
    if spawner is not None:
        threading.Thread(target=spawner.heartbeat, args=(proxy,), name="cpersona-proxy-heartbeat", daemon=True).start()
    try:
        proxy.run(sys.stdin.buffer)
    except KeyboardInterrupt:
        pass
    from cpersona.cli import _leave

    return _leave(0)  # every answer is written; interpreter teardown would only delay the exit


def main(argv: Sequence[str] | None = None) -> int:
    # The same arguments as ``cpersona proxy`` (cpersona.cli builds that parser).
    from cpersona.cli import build_parser

    return run(build_parser(proxy_only=True).parse_args(["proxy", *(argv if argv is not None else sys.argv[1:])]))


if __name__ == "__main__":
    raise SystemExit(main())
