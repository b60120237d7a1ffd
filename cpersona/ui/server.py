"""The ASGI application of ``cpersona ui``: the token check, the tool runner, the routes.

Who may look: whoever holds the random token printed at start. The first
request carries it in the query (``/?token=...``); the answer sets it as a
cookie (HttpOnly, SameSite=Strict) and redirects to the same URL without it,
so it leaves the address bar and the history. Every request without a valid
token, static files included, is answered 401 before any route runs. A form
that changes something also carries a value derived from the token (CSRF),
and is refused when the page was started without ``--write``.

What may change: only the tools may write. Edit, lock, unlock and delete are
tool calls through :func:`cpersona.mcp.dispatch.call_tool` with the same
gate chain the server uses (ACL as the ``local`` principal, then the pause),
so ownership, locks, pauses and grants apply exactly as they do to an agent.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.registry import Registry
from cpersona.services.app import App

COOKIE = "cpersona_ui"
STATIC = Path(__file__).resolve().parent / "static"
# Stored text is shown, never run: scripts and styles come only from this server's /static.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "x-frame-options": "DENY",
}


@dataclass
class UiState:
    """What every route needs: the App and the tools' call path, the token, the write switch."""

    app: App
    registry: Registry
    gates: GateChain
    token: str
    write: bool = False
    context: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A person's search is an audit, not an agent recalling: the rows' recall
        # counters stay as they are (the App mark a paused read gets, P-12).
        self._quiet = dataclasses.replace(self.app, writes_paused=True)

    @property
    def csrf(self) -> str:
        return hmac.new(self.token.encode(), b"cpersona-ui-form", hashlib.sha256).hexdigest()

    async def tool(self, name: str, *, change: bool = False, **arguments: Any) -> dict[str, Any]:
        """The tool's answer, as an agent would get it (refusals included); a change needs --write.

        Which page action changes a row is the page's own table (pages.ACTIONS), not a list of tools here.
        """
        if change and not self.write:
            raise WriteRefused(name)
        outcome = await call_tool(self._quiet, self.registry, self.gates, name, arguments, self.context)
        return outcome.payload

    async def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A service read, off the event loop on the readers' threads."""
        return await self.app.db.run(fn, self.app, *args, writes=False)


class WriteRefused(Exception):
    """A change was asked of a page started without --write."""


class TokenGate:
    """Serves nothing without the start-up token (query once, then the cookie)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    def _valid(self, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(presented.encode(), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        offered = next((value for key, value in query if key == "token"), None)
        if offered is not None and self._valid(offered) and scope["method"] in ("GET", "HEAD"):
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            target = scope["path"] + (f"?{rest}" if rest else "")
            response: Response = RedirectResponse(target, status_code=303)
            response.set_cookie(COOKIE, offered, httponly=True, samesite="strict", path="/")
            await _secured(response)(scope, receive, send)
            return
        if not self._valid(_cookie(scope)):
            await _secured(
                PlainTextResponse(
                    "401: this page needs the link `cpersona ui` printed when it started (it carries a token that "
                    "changes at every start).",
                    status_code=401,
                )
            )(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _cookie(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # noqa: BLE001 — an unreadable cookie header is simply no token
                return None
            if COOKIE in jar:
                return jar[COOKIE].value
    return None


def _secured(response: Response) -> Response:
    for key, value in SECURITY_HEADERS.items():
        response.headers[key] = value
    return response


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.decode().lower() not in SECURITY_HEADERS]
                headers.extend((k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items())
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


Handler = Callable[[Request, UiState], Awaitable[Response]]


def build_ui_app(state: UiState) -> ASGIApp:
    """The whole page: token gate outermost, then the security headers, then the routes."""
    from cpersona.ui import pages

    def bind(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request, state)
            except WriteRefused as refused:
                return pages.refused_write(state, str(refused))

        return endpoint

    routes = [Route(path, bind(handler), methods=list(methods)) for path, handler, methods in pages.ROUTES]
    routes.append(Mount("/static", app=StaticFiles(directory=STATIC), name="static"))
    return TokenGate(SecurityHeaders(Starlette(routes=routes)), state.token)
