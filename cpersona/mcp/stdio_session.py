"""The stdio transport's MCP session, on the SDK's wire types (``mcp_types``) without the SDK.

Importing any part of the ``mcp`` package runs its ``__init__``, which loads the
SDK's client, ``MCPServer``, auth, the HTTP stack and ``cryptography``: 55 MiB
and ~0.5 s of CPU, more than the reference's whole start costs over the stack
under it (docs/benchmarks.md, issue 16 ninth round). The SDK's documentation
points at ``mcp_types`` for a program that only (de)serializes MCP traffic, and
that is all a stdio session needs: this module answers the same lines with the
same bytes as the SDK's ``Server.run`` over ``stdio_server`` did
(tests/test_stdio_session.py compares the two), for the handshake era:

    initialize             inline (nothing else is read until it is answered);
                           the offered version if the SDK negotiates it, else
                           the newest handshake version; serverInfo,
                           capabilities and instructions as the SDK server
    notifications/initialized   opens the gate, as an answered initialize does
    ping                   answered before initialize too
    tools/list, tools/call the tool surface (cpersona.mcp.surface), concurrently;
                           every handshake version has the same (2025-11-25 era)
                           shapes for these, so the answers are the same bytes
    notifications/cancelled     the request's task is cancelled, never answered
    other methods          a spec method is validated against the negotiated
                           version (mcp_types.methods): malformed params are
                           "Invalid request parameters", else "Method not found"
                           (this server serves no other method); a served method
                           before initialize is "Invalid request parameters" too
    server/discover        "Method not found" (the handshake versions lack it), or
                           "Invalid request" with the 2026-07-28 envelope: what
                           the SDK answers on a handshake connection. The SDK
                           2.x client's probe (mode "auto") then falls back to
                           initialize; the reference (SDK 1.x) answers "Method
                           not found" to it
    a request carrying the 2026-07-28 envelope   "Invalid request", as the SDK
                           answers it on a handshake connection
    unreadable lines       as cpersona.mcp.stdio_lines; other invalid messages
                           (a batch, an object that is not JSON-RPC) dropped, as
                           the SDK's transport drops them

The 2026-07-28 era (no handshake, an envelope on every request) is served only
by the streamable-HTTP transport; a stdio client of that era falls back.

At the end of input every request read so far is answered first (bounded by
``CLOSE_DRAIN_SECONDS``), so a store sent just before the client closed its end
is written; what is still running then is cancelled and answered "Connection
closed", as the SDK answers it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from pydantic import BaseModel, ValidationError

from cpersona.mcp.stdio_lines import overlong_reason, reason, reparse, unparsed_line, unreadable_reply
from cpersona.mcp.stdio_pipes import CLOSE_DRAIN_SECONDS, OverlongLine, pipe_stdio
from cpersona.mcp.stdio_thread import thread_stdin, thread_stdout
from cpersona.mcp.surface import SERVER_NAME, SERVER_VERSION, ToolSurface

log = logging.getLogger(__name__)

_ENVELOPE_REFUSED = "this connection serves the handshake protocol era; requests carrying the 2026-07-28 envelope are not accepted on it"
_SHUTDOWN_WRITE_SECONDS = 1.0
# What this session serves; every other method is answered by _unserved. The
# handshake versions all define these four (mcp_types.methods.CLIENT_REQUESTS).
_SERVED = frozenset({"initialize", "ping", "tools/list", "tools/call"})

Write = Callable[[str], Awaitable[None]]


class RpcError(Exception):
    """A request's JSON-RPC error answer."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        # An absent data member stays absent on the wire (the writer dumps only what was set).
        self.error = (
            types.ErrorData(code=code, message=message)
            if data is None
            else types.ErrorData(code=code, message=message, data=data)
        )


def _not_found(method: str) -> RpcError:
    return RpcError(types.METHOD_NOT_FOUND, "Method not found", method)


def _invalid_params() -> RpcError:
    return RpcError(types.INVALID_PARAMS, "Invalid request parameters", "")


def _request_key(request_id: types.RequestId) -> types.RequestId:
    # "7" and 7 are one request for cancellation, as the SDK correlates them.
    if isinstance(request_id, str):
        with contextlib.suppress(ValueError):
            return int(request_id)
    return request_id


def _has_envelope(params: Mapping[str, Any] | None) -> bool:
    meta = params.get("_meta") if params else None
    return isinstance(meta, Mapping) and types.PROTOCOL_VERSION_META_KEY in meta


@dataclass
class _InFlight:
    scope: anyio.CancelScope
    cancelled: bool = False


@dataclass
class _Handler:
    params_type: type[BaseModel]
    run: Callable[[Any], Awaitable[BaseModel]]


@dataclass
class StdioSession:
    """One client over one pair of streams: ``write`` takes one answer's line, ``after_first_answer`` runs once."""

    surface: ToolSurface
    write: Write
    after_first_answer: Callable[[], None] | None = None
    version: str = LATEST_HANDSHAKE_VERSION
    client_params: types.InitializeRequestParams | None = None
    initialized: bool = False
    _in_flight: dict[types.RequestId, _InFlight] = field(default_factory=dict)
    _pending: set[types.RequestId] = field(default_factory=set)
    _idle: anyio.Event | None = None
    _tasks: anyio.abc.TaskGroup | None = None
    _closed: bool = False

    def __post_init__(self) -> None:
        self._handlers = {
            "ping": _Handler(types.RequestParams, self._ping),
            "tools/list": _Handler(types.PaginatedRequestParams, self._list_tools),
            "tools/call": _Handler(types.CallToolRequestParams, self._call_tool),
        }

    # --- the read loop -------------------------------------------------------------

    async def run(self, lines: Any) -> None:
        """Serve every line of ``lines`` (an async iterator of text lines), then drain and cancel."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            async for line in lines:
                await self.receive_line(line)
            await self._all_answered()
            tasks.cancel_scope.cancel()
        self._closed = True

    async def receive_line(self, line: str) -> None:
        try:
            message: Any = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except Exception as exc:  # noqa: BLE001 — any refusal of the parser is one line's problem
            raw = unparsed_line(exc)
            message = reparse(raw) if raw is not None else None
            if message is None:
                if raw is None:
                    log.debug("dropped a line that is not a JSON-RPC message: %r", exc)
                else:
                    await self.send_reply(unreadable_reply(raw, reason(exc)))
                return
        await self._dispatch(message)

    async def answer_overlong(self, line: OverlongLine) -> None:
        """Answer a line the pipe reader refused for its length (only its head was kept)."""
        await self.send_reply(unreadable_reply(line.head, overlong_reason(line), null_id=True))

    async def _dispatch(self, message: Any) -> None:
        if isinstance(message, types.JSONRPCRequest):
            key = _request_key(message.id)
            entry = self._in_flight[key] = _InFlight(anyio.CancelScope())
            self._pending.add(message.id)
            assert self._tasks is not None
            if message.method == "initialize":
                # Inline, as the SDK runs it: the next line is read once it is answered,
                # so a pipelined request sees its outcome; requests read before it start first.
                done = anyio.Event()
                self._tasks.start_soon(self._handle, message, entry, done)
                await done.wait()
            else:
                self._tasks.start_soon(self._handle, message, entry)
        elif isinstance(message, types.JSONRPCNotification):
            self._notified(message.method, message.params)
        # A response or error from the client answers nothing: this server sends no requests.

    def _notified(self, method: str, params: Mapping[str, Any] | None) -> None:
        if method == "notifications/cancelled":
            request_id = (params or {}).get("requestId")
            if isinstance(request_id, (str, int)) and not isinstance(request_id, bool):
                entry = self._in_flight.get(_request_key(request_id))
                if entry is not None:
                    entry.cancelled = True
                    entry.scope.cancel()
        if method == "notifications/initialized":
            try:
                types.InitializedNotification.model_validate(_body(method, params), by_name=False)
            except ValidationError:
                log.warning("dropped %r: malformed params", method)
                return
            self.initialized = True
        # Any other notification has no handler here: nothing to do, as in the SDK.

    # --- one request ---------------------------------------------------------------

    async def _handle(self, request: types.JSONRPCRequest, entry: _InFlight, done: anyio.Event | None = None) -> None:
        answered = False
        try:
            with entry.scope:
                try:
                    result = await self._answer(request.method, request.params)
                finally:
                    key = _request_key(request.id)
                    if self._in_flight.get(key) is entry:
                        del self._in_flight[key]
                if not entry.cancelled:
                    answered = True
                    await self.send(types.JSONRPCResponse(jsonrpc="2.0", id=request.id, result=result))
        except anyio.get_cancelled_exc_class():
            if not answered and not entry.cancelled:  # shutdown: the client is told, not left waiting
                with anyio.move_on_after(_SHUTDOWN_WRITE_SECONDS, shield=True):
                    await self._send_error(
                        request.id, types.ErrorData(code=types.CONNECTION_CLOSED, message="Connection closed")
                    )
            raise
        except Exception as exc:  # noqa: BLE001 — one bad request never ends the session
            if not entry.cancelled:
                answered = True
                await self._send_error(request.id, _error_data(request.method, exc))
        finally:
            self._settled(request.id)
            if done is not None:
                done.set()

    async def _answer(self, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
        if method != "initialize" and _has_envelope(params):
            raise RpcError(types.INVALID_REQUEST, _ENVELOPE_REFUSED)
        version = self.version
        if method not in _SERVED:
            raise _unserved(method, version, params)
        if method == "initialize":
            init = types.InitializeRequestParams.model_validate(params or {}, by_name=False)
            negotiated = (
                init.protocol_version
                if init.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
                else LATEST_HANDSHAKE_VERSION
            )
            result = _shaped(self._initialize_result(negotiated))
            self.client_params, self.version = init, negotiated
            return result
        handler = self._handlers.get(method)
        if handler is None:
            raise _not_found(method)
        if not (self.initialized or self.client_params is not None) and method != "ping":
            raise _invalid_params()
        typed = handler.params_type.model_validate({} if params is None else params, by_name=False)
        return _shaped(await handler.run(typed))

    def _initialize_result(self, negotiated: str) -> types.InitializeResult:
        return types.InitializeResult(
            protocol_version=negotiated,
            capabilities=types.ServerCapabilities(tools=types.ToolsCapability(list_changed=False)),
            server_info=types.Implementation(name=SERVER_NAME, version=SERVER_VERSION),
            instructions=self.surface.instructions,
        )

    async def _ping(self, params: types.RequestParams) -> BaseModel:
        return types.EmptyResult()

    async def _list_tools(self, params: types.PaginatedRequestParams) -> BaseModel:
        return await self.surface.list_tools()

    async def _call_tool(self, params: types.CallToolRequestParams) -> BaseModel:
        return await self.surface.call_tool(params.name, params.arguments)

    # --- the write side ------------------------------------------------------------

    async def send(self, message: types.JSONRPCResponse | types.JSONRPCError) -> None:
        if self._closed:
            return
        try:
            await self.write(message.model_dump_json(by_alias=True, exclude_unset=True) + "\n")
        except (OSError, ValueError) as exc:  # the client closed its end: nothing more can reach it
            log.debug("dropped an answer: %s", exc)
            self._closed = True
        hook, self.after_first_answer = self.after_first_answer, None
        if hook is not None:
            hook()

    async def send_reply(self, reply: types.JSONRPCMessage | None) -> None:
        if isinstance(reply, (types.JSONRPCResponse, types.JSONRPCError)):
            await self.send(reply)

    async def _send_error(self, request_id: types.RequestId, error: types.ErrorData) -> None:
        await self.send(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))

    def _settled(self, request_id: types.RequestId) -> None:
        self._pending.discard(request_id)
        if not self._pending and self._idle is not None:
            self._idle.set()

    async def _all_answered(self) -> None:
        with anyio.move_on_after(CLOSE_DRAIN_SECONDS):
            while self._pending:
                self._idle = anyio.Event()
                await self._idle.wait()


def _shaped(result: BaseModel) -> dict[str, Any]:
    """The result as the SDK's per-version sieve writes it, without importing the sieve.

    Every handshake version shares the 2025-11-25 schema era (mcp_types.methods).
    Against the version-free models we build answers with, its sieve does two
    things to these four methods' answers: it drops the 2026-07-28 members
    (``resultType``, the cache hints) and dumps members in the order of their
    wire names, while free-form objects (a tool's input schema, an answer's
    structured content, ``_meta``) keep theirs. tests/test_stdio_session.py
    holds this to the sieve itself (each kind of answer at every version gives
    the same text) and to the SDK's session (the same bytes).
    """
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return _in_wire_order({k: v for k, v in dumped.items() if k not in _MODERN_ONLY})


_MODERN_ONLY = frozenset({"resultType", "ttlMs", "cacheScope"})
_FREE_FORM = frozenset({"structuredContent", "_meta", "experimental"})
_SCHEMAS = frozenset({"inputSchema", "outputSchema"})
# The 2025-11-25 schema model's own members; a schema's other keywords follow them
# as they are, and each property's schema is free-form.
_SCHEMA_MEMBERS = ("$schema", "properties", "required", "type")


def _in_wire_order(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _member(k, value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_in_wire_order(item) for item in value]
    return value


def _member(key: str, value: Any) -> Any:
    if key in _FREE_FORM or not isinstance(value, (dict, list)):
        return value
    if key in _SCHEMAS and isinstance(value, dict):
        members = {k: value[k] for k in _SCHEMA_MEMBERS if k in value}
        return {**members, **{k: v for k, v in value.items() if k not in members}}
    return _in_wire_order(value)


def _unserved(method: str, version: str, params: Mapping[str, Any] | None) -> RpcError:
    """The error for a method this session does not serve, as the SDK words it.

    A spec method is validated against the negotiated version's surface first
    (malformed params are "Invalid request parameters" even with no handler).
    The per-version surfaces (``mcp_types.methods``) cost about as much CPU to
    import as ``mcp_types`` itself, and 6 MiB, for nothing the four methods
    served need, so only a client asking for another method pays for them.
    """
    import mcp_types.methods as methods

    if method in methods.SPEC_CLIENT_METHODS:
        try:
            methods.validate_client_request(method, version, params)
        except KeyError:
            pass
        except ValidationError:
            return _invalid_params()
    return _not_found(method)


def _body(method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, **({"params": params} if params is not None else {})}


def _error_data(method: str, exc: Exception) -> types.ErrorData:
    if isinstance(exc, RpcError):
        return exc.error
    if isinstance(exc, ValidationError):
        return types.ErrorData(code=types.INVALID_PARAMS, message="Invalid request parameters", data="")
    log.exception("handler for %r raised", method)
    return types.ErrorData(code=0, message=str(exc))  # the SDK's answer to a crash, kept for its clients


async def serve_stdio(surface: ToolSurface, after_first_answer: Callable[[], None] | None = None) -> None:
    """Serve until stdin ends; ``after_first_answer`` runs once, as soon as the first answer is handed out."""
    # Pipes are watched by the event loop (no worker-thread hop per line);
    # anything else (a terminal, a file) is read by a daemon thread that a
    # cancellation never waits for (see stdio_thread).
    async with contextlib.AsyncExitStack() as stack:
        pipes = await stack.enter_async_context(pipe_stdio())
        if pipes is not None:
            stdin, stdout = pipes

            async def write(text: str) -> None:
                await stdout.write(text)
                await stdout.flush()

            session = StdioSession(surface, write, after_first_answer)
            stdin.on_overlong = session.answer_overlong  # only the pipe reader bounds a line as it arrives
            await session.run(stdin)
        else:
            lines = await stack.enter_async_context(thread_stdin())
            write_line = await stack.enter_async_context(thread_stdout())
            await StdioSession(surface, write_line, after_first_answer).run(lines)
