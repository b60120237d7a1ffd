"""What one HTTP connection may cost: how long it may idle, how slowly it may send, how many may be open.

uvicorn times out an idle keep-alive connection (``timeout_keep_alive``) but
nothing else: a fresh connection that never sends a byte, or one that sends
its headers a byte every few seconds (each byte cancels the keep-alive timer),
stays open for ever, and every one holds a file descriptor. Once they fill the
process's file limit, ``accept`` fails with EMFILE, asyncio retries at once for
the whole listen backlog and logs a traceback each time (hundreds of megabytes
of log a minute), and no client is served. This module closes those gaps:

- **Header deadline.** A connection must deliver a complete request head
  within ``header_timeout`` seconds of opening, or of its previous response.
  Bytes arriving slowly do not extend it.
- **Body silence.** While a request body is arriving, a gap of more than
  ``body_timeout`` seconds without a byte closes the connection (the
  application reads a disconnect). Time spent waiting for the application to
  read is not counted.
- **A bound on open connections**, derived from ``RLIMIT_NOFILE`` so that
  connections plus the listen backlog plus a reserve for the database, the
  embedding client and logs stay under the limit. At the bound, the oldest
  connection that is waiting for a request head (the kind an attacker holds)
  is closed to make room; only when every connection is in the middle of a
  request is the new one refused. Refusals and evictions are logged at most
  once per ``LOG_INTERVAL_SECONDS`` with counts.
- **GET streams end.** The stateless server never sends anything on a GET
  event stream, so one is closed after ``stream_max_seconds``.
- EMFILE from ``accept`` (another part of the process can still use the file
  table up) is logged at most once per interval instead of once per retry.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

# Descriptors kept for everything that is not a client connection: two per pooled
# database connection (16 at most), the WAL index, the embedding client's pool,
# logs, the SDK's pipes, imports and exports.
FD_RESERVE = 128
MIN_CONNECTIONS = 4
MAX_CONNECTIONS = 4096  # past this, memory per connection matters more than descriptors
MAX_BACKLOG = 2048  # uvicorn's default
LOG_INTERVAL_SECONDS = 10.0


# --- the bound --------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float
    keep_alive_timeout: float
    body_timeout: float
    stream_max_seconds: float
    max_connections: int
    backlog: int
    file_limit: int | None


def file_limit() -> int | None:
    """The soft RLIMIT_NOFILE, or None where there is none to respect."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor
    except OSError:
        return 16


def connection_limits(settings: Any, limit: int | None = None, in_use: int | None = None) -> ConnectionLimits:
    """The bounds the HTTP server runs with, from the settings and the process's file limit."""
    limit = file_limit() if limit is None else limit
    in_use = open_descriptors() if in_use is None else in_use
    if limit is None:
        derived, backlog = MAX_CONNECTIONS, MAX_BACKLOG
    else:
        # Connections take three quarters of what is left, the backlog (accepted
        # in one burst before any connection can be refused) the rest.
        room = limit - in_use - FD_RESERVE
        derived = max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, room * 3 // 4))
        backlog = max(1, min(MAX_BACKLOG, room - derived))
        if room * 3 // 4 < MIN_CONNECTIONS:
            log.warning(
                "the file limit (RLIMIT_NOFILE %d, %d in use) leaves almost no room for HTTP connections; "
                "serving at most %d. Raise it with `ulimit -n`.",
                limit,
                in_use,
                derived,
            )
    wanted = settings.http_max_connections
    chosen = derived if not wanted else min(wanted, derived)
    if wanted and wanted > derived:
        log.warning(
            "CPERSONA_HTTP_MAX_CONNECTIONS=%d is more than the file limit allows (RLIMIT_NOFILE %s); "
            "serving at most %d connections",
            wanted,
            limit,
            derived,
        )
    return ConnectionLimits(
        header_timeout=settings.http_header_timeout_secs,
        keep_alive_timeout=settings.http_keep_alive_timeout_secs,
        body_timeout=settings.http_body_timeout_secs,
        stream_max_seconds=settings.http_stream_max_secs,
        max_connections=chosen,
        backlog=backlog,
        file_limit=limit,
    )


class RateLimitedLog:
    """One WARNING per interval for a recurring event, saying how often it happened meanwhile."""

    def __init__(
        self, message: str, interval: float = LOG_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.message = message
        self.interval = interval
        self.clock = clock
        self.total = 0
        self._since = 0
        self._last: float | None = None

    def __call__(self, detail: str = "") -> bool:
        """Count one occurrence; log it when the interval allows. True when it was logged."""
        self.total += 1
        self._since += 1
        now = self.clock()
        if self._last is not None and now - self._last < self.interval:
            return False
        log.warning(
            "%s%s (%d since the last such message, %d this process)", self.message, detail, self._since, self.total
        )
        self._last, self._since = now, 0
        return True


# --- the connections --------------------------------------------------------------


class ConnectionGuard:
    """Every open connection, split into those waiting for a request head and those busy with one."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.waiting: dict[GuardedH11Protocol, None] = {}  # insertion order = oldest first
        self.busy: set[GuardedH11Protocol] = set()
        self.refused = RateLimitedLog(
            f"refused HTTP connections: all {limits.max_connections} allowed connections (derived from the file "
            "limit, or CPERSONA_HTTP_MAX_CONNECTIONS) are in the middle of a request"
        )
        self.evicted = RateLimitedLog(
            f"closed idle HTTP connections to make room: {limits.max_connections} connections were open and the "
            "oldest was waiting for a request"
        )
        self.timed_out = RateLimitedLog("closed slow HTTP connections")

    def admit(self, protocol: GuardedH11Protocol) -> bool:
        if len(self.waiting) + len(self.busy) >= self.limits.max_connections:
            if not self.waiting:
                self.refused()
                return False
            oldest = next(iter(self.waiting))
            self.forget(oldest)
            oldest.evict()
            self.evicted()
        self.waiting[protocol] = None
        return True

    def mark_waiting(self, protocol: GuardedH11Protocol) -> None:
        self.busy.discard(protocol)
        self.waiting[protocol] = None  # at the young end: it has just finished a request

    def mark_busy(self, protocol: GuardedH11Protocol) -> None:
        self.waiting.pop(protocol, None)
        self.busy.add(protocol)

    def forget(self, protocol: GuardedH11Protocol) -> None:
        self.waiting.pop(protocol, None)
        self.busy.discard(protocol)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the header deadline, body silence and the connection bound."""

    guard: ConnectionGuard  # bound per server by protocol_class()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._admitted = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.guard.admit(self):
            transport.abort()
            return
        self._admitted = True
        self._arm(self.guard.limits.header_timeout, "no complete request head")

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._admitted and not self.transport.is_closing():
            self._follow_state()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._admitted and not self.transport.is_closing():
            self._follow_state()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.forget(self)
        super().connection_lost(exc)

    def evict(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()

    def _follow_state(self) -> None:
        state = self.conn.their_state
        if state is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
            if self in self.guard.busy:  # a request just ended: a fresh deadline for the next head
                self.guard.mark_waiting(self)
                self._arm(self.guard.limits.header_timeout, "no complete request head")
        elif state is h11.SEND_BODY:
            self.guard.mark_busy(self)
            self._arm(self.guard.limits.body_timeout, "the request body stopped arriving")
        else:
            self.guard.mark_busy(self)
            self._disarm()

    def _arm(self, seconds: float, why: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, why)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, why: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.SEND_BODY and self.flow.read_paused:
            # The application has not read what arrived: the client is not the slow one.
            self._arm(self.guard.limits.body_timeout, why)
            return
        self.guard.timed_out(f" ({why} in time)")
        self.guard.forget(self)
        self.transport.close()


def protocol_class(guard: ConnectionGuard) -> type[GuardedH11Protocol]:
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": guard})


# --- GET streams ------------------------------------------------------------------


class StreamLifetime:
    """Ends a GET response (an event stream) after ``max_seconds``; other methods pass untouched."""

    def __init__(self, app: ASGIApp, max_seconds: float) -> None:
        self.app = app
        self.max_seconds = max_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        started = finished = False

        async def tracking_send(message: Message) -> None:
            nonlocal started, finished
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
            await send(message)

        with anyio.move_on_after(self.max_seconds):
            await self.app(scope, receive, tracking_send)
        if started and not finished:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


# --- the accept loop --------------------------------------------------------------


def install_accept_error_limit(loop: asyncio.AbstractEventLoop) -> None:
    """Log asyncio's "out of system resource" accept errors at most once per interval.

    On EMFILE, asyncio's accept loop logs and schedules a retry once per entry
    of the listen backlog, every second; one line per interval says the same.
    """
    accept_failed = RateLimitedLog("could not accept HTTP connections: the process is out of file descriptors")
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == "socket.accept() out of system resource":
            accept_failed(f": {context.get('exception')}")
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
