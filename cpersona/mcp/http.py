"""Streamable HTTP: one process serving many clients (spec transport-and-config §1-§2, §5, §6).

The ASGI stack, outermost first (T-4):

    CORS               claude.ai origins; preflights answered here, unauthenticated (T-5)
    BodyBudget         counts request-body bytes as they arrive (BB-1..BB-4); refuses any body
                       larger than the largest request a tool can accept, whatever the mode
    Authentication     bearer token, ACL token table, OAuth verifier (AUTH-1..AUTH-5, ACL-8)
    StreamLifetime     ends a GET event stream after CPERSONA_HTTP_STREAM_MAX_SECS
    routes             RFC 9728 metadata (when discovery is on), then the MCP endpoint
                       mounted at /mcp and / (the SDK's stateless session manager)

Below the ASGI stack, :mod:`cpersona.mcp.http_guard` bounds the connections
themselves (header deadline, body silence, keep-alive, how many are open).

Authentication never reads the body, so a request without credentials is
refused before any of its body is consumed, and the budget (which counts only
what the application reads) never sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from mcp.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cpersona.mcp.acl import AclPolicy, Principal, current_principal
from cpersona.mcp.http_guard import (
    ConnectionGuard,
    ConnectionLimits,
    StreamLifetime,
    install_accept_error_limit,
    protocol_class,
)
from cpersona.mcp.oauth import OAuthConfig, TokenVerifier
from cpersona.mcp.validation import MAX_REQUEST_BYTES

log = logging.getLogger(__name__)

CORS_ORIGINS = ("https://claude.ai", "https://www.claude.ai")
CORS_METHODS = ("GET", "POST", "DELETE", "OPTIONS")
CORS_HEADERS = ("Authorization", "Content-Type", "Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-Id")
FORWARDING_HEADERS = (
    b"x-forwarded-for",
    b"x-forwarded-proto",
    b"x-forwarded-host",
    b"forwarded",
    b"via",
    b"x-real-ip",
    b"true-client-ip",
    b"cf-connecting-ip",
)
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# T-3: the SDK's own ceiling must never bind first; the budget below is the limit.
SDK_BODY_CEILING = sys.maxsize


# --- authentication -----------------------------------------------------------------


@dataclass(frozen=True)
class AuthMode:
    """Exactly one of: unauthenticated, a single token, or an ACL policy (§2)."""

    token: str | None = None
    policy: AclPolicy | None = None
    verifier: TokenVerifier | None = None

    @property
    def unauthenticated(self) -> bool:
        return self.token is None and self.policy is None


class StartupRefusal(Exception):
    """The HTTP transport must not start with this configuration (T-8)."""


def http_auth_mode(settings: Any, policy: AclPolicy | None, oauth: OAuthConfig | None) -> AuthMode:
    """Which of the three modes serves, or a refusal when none was chosen (T-8, OA-6)."""
    if policy is not None:
        verifier = TokenVerifier(oauth) if oauth is not None else None
        return AuthMode(policy=policy, verifier=verifier)
    if oauth is not None:
        log.warning(
            "OAuth token verification stays off without CPERSONA_ACL_FILE: a verified identity with no "
            "grant table would reach every tool. Discovery is still served; OAuth clients will be refused."
        )
    token = settings.auth_token.get_secret_value() if settings.auth_token is not None else ""
    if token:
        return AuthMode(token=token)
    if not settings.allow_unauthenticated_http:
        raise StartupRefusal(
            f"refusing to serve streamable-http on {settings.http_host}:{settings.http_port} without "
            "credentials: every tool, including delete_agent_data and file import/export, would be callable by "
            "anyone who reaches the port (a loopback bind is no boundary: tunnels, proxies and port-forwards "
            "reach it). Set CPERSONA_AUTH_TOKEN (or CPERSONA_ACL_FILE), or, for local development only, "
            "CPERSONA_ALLOW_UNAUTHENTICATED_HTTP=true"
        )
    log.warning(
        "serving streamable-http WITHOUT authentication (CPERSONA_ALLOW_UNAUTHENTICATED_HTTP=true): "
        "anyone who reaches %s:%s can call every tool",
        settings.http_host,
        settings.http_port,
    )
    return AuthMode()


def bearer_credential(scope: Scope) -> bytes:
    """AUTH-1: what follows a case-insensitive ``bearer `` prefix, else empty."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return value[7:] if value[:7].lower() == b"bearer " else b""
    return b""


class Authentication:
    def __init__(self, app: ASGIApp, mode: AuthMode, oauth: OAuthConfig | None) -> None:
        self.app = app
        self.mode = mode
        self.oauth = oauth
        self.challenge = oauth.challenge() if oauth else "Bearer"
        self._warned_exposed = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self.app(scope, receive, send)
            return
        if self.mode.unauthenticated:
            if kind == "http":
                self._warn_if_exposed(scope)
            await self.app(scope, receive, send)
            return
        if kind != "http":
            await send({"type": "websocket.close", "code": 1008})  # AUTH-4
            return
        if scope["method"] == "OPTIONS" or self._public_metadata(scope):
            await self.app(scope, receive, send)
            return
        principal = await self._principal(bearer_credential(scope))
        if principal is None:
            await self._unauthorized(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        token = current_principal.set(principal)
        try:
            await self.app(scope, receive, send)
        finally:
            current_principal.reset(token)

    async def _principal(self, credential: bytes) -> Principal | None:
        mode = self.mode
        if mode.policy is None:
            expected = (mode.token or "").encode("utf-8")
            # AUTH-2: compared as bytes, so any header value is a plain mismatch.
            return Principal("token") if credential and hmac.compare_digest(credential, expected) else None
        principal = mode.policy.resolve_token(credential)
        if principal is None and mode.verifier is not None and credential:
            try:
                text = credential.decode("ascii")
            except UnicodeDecodeError:
                return None
            principal = await mode.verifier.verify(text)
        return principal

    def _public_metadata(self, scope: Scope) -> bool:
        return (
            self.oauth is not None
            and scope["path"] == self.oauth.metadata_path
            and scope["method"] in ("GET", "HEAD", "OPTIONS")
        )

    async def _unauthorized(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse(
            {"error": "unauthorized"}, status_code=401, headers={"WWW-Authenticate": self.challenge}
        )
        await response(scope, receive, send)

    def _warn_if_exposed(self, scope: Scope) -> None:
        # AUTH-5: one warning per process; silence proves nothing.
        if self._warned_exposed:
            return
        names = {name for name, _ in scope.get("headers", ())}
        forwarded = sorted(h.decode() for h in FORWARDING_HEADERS if h in names)
        client = scope.get("client")
        peer = client[0] if client else None
        if forwarded or not _is_loopback_peer(peer):
            self._warned_exposed = True
            why = f"forwarding header(s) {', '.join(forwarded)}" if forwarded else f"a request from {peer}"
            log.warning(
                "this server is reachable from outside while unauthenticated (%s); set "
                "CPERSONA_AUTH_TOKEN or CPERSONA_ACL_FILE",
                why,
            )


def _is_loopback_peer(peer: str | None) -> bool:
    if peer is None:
        return False
    if peer == "localhost":
        return True
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


# --- the body budget ----------------------------------------------------------------


class BodyBudget:
    """BB-1..BB-4: count body bytes as they are read; warn, reject (413) or do nothing.

    Whatever the mode, a body longer than the largest request any tool can
    accept (``hard_max_bytes``, :data:`cpersona.mcp.validation.MAX_REQUEST_BYTES`)
    is answered 413 the moment it is seen to be longer, so `warn` keeps its
    meaning for bodies a tool could take and nothing else is read in full. A
    ``Content-Length`` that already declares more is refused before any byte is
    read; below that the header is not trusted (the budget counts what
    arrives). The chunks pass straight through: counting holds no copy.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, mode: str, hard_max_bytes: int = MAX_REQUEST_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.mode = mode
        self.hard_max_bytes = hard_max_bytes
        self.crossings = 0
        self.refusals = 0

    @property
    def refuse_above(self) -> int:
        """The size past which a body is answered 413 in this mode."""
        return min(self.max_bytes, self.hard_max_bytes) if self.mode == "reject" else self.hard_max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Only the hard cap trusts the header (a client that declares more than
        # any tool accepts means it); the budget counts what arrives (BB-1).
        declared = _declared_length(scope)
        if declared is not None and declared > self.hard_max_bytes:
            self._refused(scope, declared, declared=True)
            await _payload_too_large(self._answered_limit(declared), send)
            return
        counting = self.mode != "off"
        seen = 0
        crossed = False
        answered = False

        async def counting_receive() -> Message:
            nonlocal seen, crossed, answered
            if answered:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] != "http.request":
                return message
            seen += len(message.get("body", b""))
            if seen > self.refuse_above:
                answered = True
                self._refused(scope, seen, declared=False)
                await _payload_too_large(self._answered_limit(seen), send)
                return {"type": "http.disconnect"}
            if counting and seen > self.max_bytes and not crossed:
                crossed = True
                self.crossings += 1
                self._log(scope, seen, "The request was served in full.")
            return message

        async def guarded_send(message: Message) -> None:
            if not answered:  # after a 413 the application's own answer goes nowhere
                await send(message)

        await self.app(scope, counting_receive, guarded_send)

    def _answered_limit(self, size: int) -> int:
        return min(self.max_bytes, self.hard_max_bytes) if self.mode == "reject" else self.hard_max_bytes

    def _refused(self, scope: Scope, size: int, *, declared: bool) -> None:
        if self.mode == "reject" and size > self.max_bytes and not declared:
            self.crossings += 1
            self._log(scope, size, "The request was answered 413 and the rest of the body was not read.")
            return
        what = (
            f"declares {size} bytes in Content-Length, so none of it was read"
            if declared
            else f"reached at least {size} bytes, so the rest of it was not read"
        )
        self.refusals += 1
        n = self.refusals
        if 10 ** (len(str(n)) - 1) == n:  # 1st, 10th, 100th, ...
            log.warning(
                "HTTP request body on %s %s is longer than the largest request any tool can accept "
                "(%d bytes): its body %s. It was answered 413 whatever CPERSONA_HTTP_BODY_LIMIT_MODE "
                "says (mode=%s). Occurrence %d this process.",
                scope["method"],
                scope["path"],
                self.hard_max_bytes,
                what,
                self.mode,
                n,
            )

    def _log(self, scope: Scope, seen: int, outcome: str) -> None:
        n = self.crossings
        if n < 1 or 10 ** (len(str(n)) - 1) != n:  # 1st, 10th, 100th, ...
            return
        log.warning(
            "HTTP request body exceeded CPERSONA_HTTP_MAX_BODY_BYTES on %s %s: at least %d bytes against "
            "a budget of %d (mode=%s). Occurrence %d this process. %s",
            scope["method"],
            scope["path"],
            seen,
            self.max_bytes,
            self.mode,
            n,
            outcome,
        )


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def _payload_too_large(max_bytes: int, send: Send) -> None:
    body = JSONResponse({"error": "payload_too_large", "max_bytes": max_bytes}).body
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# --- the application ----------------------------------------------------------------


def transport_security(host: str) -> TransportSecuritySettings:
    """DNS-rebinding protection on a loopback bind, as the SDK does for its own apps.

    A browser page on another site must not reach a local server through a
    rebinding host name (421), nor post from a foreign origin (403). On any
    other bind the host names are the operator's, so the check is off.
    """
    if host not in LOOPBACK_HOSTS:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1", "127.0.0.1:*", "localhost", "localhost:*", "[::1]", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*", *CORS_ORIGINS],
    )


def build_http_app(
    server: Server[Any],
    *,
    host: str,
    auth: AuthMode,
    max_body_bytes: int,
    body_limit_mode: str,
    oauth: OAuthConfig | None = None,
    stream_max_seconds: float = 300.0,
) -> Starlette:
    manager = StreamableHTTPSessionManager(
        app=server, stateless=True, security_settings=transport_security(host), max_request_body_size=SDK_BODY_CEILING
    )

    async def mcp_endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        await manager.handle_request(scope, receive, send)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    routes: list[Any] = []
    if oauth is not None:
        document = oauth.metadata()

        async def metadata(request: Request) -> Response:
            return JSONResponse(document)

        routes.append(Route(oauth.metadata_path, metadata, methods=["GET", "HEAD"]))
    routes.append(Mount("/", app=mcp_endpoint))  # /mcp and / alike (T-3)

    middleware = [
        Middleware(
            CORSMiddleware,
            allow_origins=list(CORS_ORIGINS),
            allow_methods=list(CORS_METHODS),
            allow_headers=list(CORS_HEADERS),
            expose_headers=["Mcp-Session-Id"],
        ),
        Middleware(BodyBudget, max_bytes=max_body_bytes, mode=body_limit_mode),
        Middleware(Authentication, mode=auth, oauth=oauth),
        Middleware(StreamLifetime, max_seconds=stream_max_seconds),
    ]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


def serve_http(app: ASGIApp, host: str, port: int, limits: ConnectionLimits) -> None:
    """Run ``app`` under uvicorn until interrupted, with the connection bounds of :mod:`cpersona.mcp.http_guard`."""
    import uvicorn

    log.info(
        "HTTP connections: at most %d open (RLIMIT_NOFILE %s), request head within %g s, body silence up to "
        "%g s, keep-alive %g s, GET streams end after %g s",
        limits.max_connections,
        limits.file_limit,
        limits.header_timeout,
        limits.body_timeout,
        limits.keep_alive_timeout,
        limits.stream_max_seconds,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info",
        lifespan="on",
        access_log=False,
        ws="none",
        http=protocol_class(ConnectionGuard(limits)),
        loop="asyncio",
        timeout_keep_alive=limits.keep_alive_timeout,
        backlog=limits.backlog,
    )
    server = uvicorn.Server(config)

    async def serve() -> None:
        install_accept_error_limit(asyncio.get_running_loop())
        await server.serve()

    asyncio.run(serve())
