"""Serving over stdio, with a second chance for lines the SDK cannot parse.

The SDK's stdio transport parses each line with a strict JSON parser that
refuses two things JSON allows: a lone UTF-16 surrogate escape (``"\\ud800"``)
and nesting deeper than about 200 levels. It then drops the line with a debug
log and never answers, so the client waits forever. Spec G-6 wants the lone
surrogate refused in the tool's own shape, and the brief wants every bad input
answered, so such lines get a second chance here:

- re-parsed with Python's ``json`` (which accepts lone surrogates and nests as
  deep as the interpreter allows): the request then takes the normal call path,
  whose own checks refuse it properly;
- still unreadable (say, 10,000 levels deep): if the request's ``id`` can be
  found, it is answered directly — a tool error for ``tools/call``, a JSON-RPC
  parse error otherwise — and the server reads the next line.

A line longer than the largest request any tool can accept never reaches the
SDK (the pipe reader drops it as it arrives, keeping only its head): it is
answered the same way from the id found in that head, or with a JSON-RPC parse
error whose id is null when none is there.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Callable
from json.decoder import scanstring
from types import TracebackType
from typing import Any

import anyio
import mcp.types as types
import pydantic
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from cpersona.mcp.dispatch import input_error
from cpersona.mcp.results import replace_lone_surrogates, to_result
from cpersona.mcp.stdio_pipes import CLOSE_DRAIN_SECONDS, OverlongLine, pipe_stdio
from cpersona.mcp.stdio_thread import thread_stdin
from cpersona.mcp.validation import MAX_REQUEST_BYTES

log = logging.getLogger(__name__)

_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


async def serve_stdio(server: Server[Any], after_first_answer: Callable[[], None] | None = None) -> None:
    """Serve until stdin ends; ``after_first_answer`` runs once, as soon as the first answer is handed out."""
    # Pipes are watched by the event loop (no worker-thread hop per line);
    # anything else (a terminal, a file) is read by a daemon thread that a
    # cancellation never waits for (see stdio_thread), and written by the SDK.
    async with contextlib.AsyncExitStack() as stack:
        pipes = await stack.enter_async_context(pipe_stdio())
        if pipes is not None:
            stdin, stdout = pipes
        else:
            stdin, stdout = await stack.enter_async_context(thread_stdin()), None
        read_stream, write_stream = await stack.enter_async_context(stdio_server(stdin, stdout))  # type: ignore[arg-type]
        write_stream = AnswerTracker(write_stream, after_first_answer)
        reader = SecondChanceReader(read_stream, write_stream)
        if pipes is not None:
            stdin.on_overlong = reader.answer_overlong  # only the pipe reader bounds a line as it arrives
        await server.run(reader, write_stream, server.create_initialization_options())


class AnswerTracker:
    """The write side of the server: knows which requests are unanswered, and when the first answer went out.

    At the end of stdin the SDK cancels the requests still being handled, so a
    store sent just before the client closed its end was never written. The
    reader (:class:`SecondChanceReader`) instead holds the end of input back
    until every request read so far is answered, up to ``CLOSE_DRAIN_SECONDS``.
    """

    def __init__(self, inner: Any, after_first_answer: Callable[[], None] | None = None) -> None:
        self._inner = inner
        self._hook = after_first_answer
        self._pending: set[Any] = set()
        self._empty: anyio.Event | None = None

    def expect(self, message: Any) -> None:
        if isinstance(message, types.JSONRPCRequest):
            self._pending.add(message.id)

    async def send(self, item: SessionMessage) -> None:
        await self._inner.send(item)
        if isinstance(item.message, (types.JSONRPCResponse, types.JSONRPCError)):
            self._pending.discard(item.message.id)
            if not self._pending and self._empty is not None:
                self._empty.set()
        hook, self._hook = self._hook, None
        if hook is not None:
            hook()

    async def all_answered(self) -> None:
        """Wait (bounded) until every request read so far has its answer handed out."""
        with anyio.move_on_after(CLOSE_DRAIN_SECONDS):
            while self._pending:
                self._empty = anyio.Event()
                await self._empty.wait()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> AnswerTracker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class SecondChanceReader:
    """A read stream that passes messages through and retries lines the SDK rejected."""

    def __init__(self, inner: Any, write_stream: Any) -> None:
        self._inner = inner
        self._write = write_stream

    @property
    def last_context(self) -> Any:
        # The SDK restores each sender's contextvars from here (duck-typed).
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        while True:
            try:
                item = await self._inner.receive()
            except anyio.EndOfStream:
                if isinstance(self._write, AnswerTracker):
                    await self._write.all_answered()  # writes in flight are committed before the server ends
                raise
            if not isinstance(item, Exception):
                if isinstance(self._write, AnswerTracker):
                    self._write.expect(item.message)
                return item
            line = _unparsed_line(item)
            if line is None:
                return item
            message = reparse(line)
            if message is not None:
                if isinstance(self._write, AnswerTracker):
                    self._write.expect(message)
                return SessionMessage(message)
            await self._answer_unreadable(line, item)

    async def _answer_unreadable(self, line: str, exc: Exception) -> None:
        await self._answer(line, _reason(exc))

    async def answer_overlong(self, line: OverlongLine) -> None:
        """Answer a line the pipe reader refused for its length (only its head was kept)."""
        await self._answer(
            line.head,
            f"it is at least {line.length} bytes long, more than the largest request any "
            f"tool can accept ({MAX_REQUEST_BYTES} bytes), so it was not read",
            null_id=True,
        )

    async def _answer(self, line: str, reason: str, null_id: bool = False) -> None:
        request_id = top_level_member(line, "id")
        method = top_level_member(line, "method")
        if not isinstance(request_id, (int, str)) or isinstance(request_id, bool):
            if not null_id:
                log.warning("dropped an unreadable line without a request id (%d characters)", len(line))
                return
            request_id, method = None, None  # JSON-RPC: a parse error whose id could not be found has id null
        log.warning("answered unreadable request %r (%s): %s", request_id, method, reason)
        if method == "tools/call":
            result = to_result(input_error(f"the request could not be read: {reason}"))
            reply: types.JSONRPCResponse | types.JSONRPCError = types.JSONRPCResponse(
                jsonrpc="2.0", id=request_id, result=result.model_dump(by_alias=True, exclude_none=True, mode="json")
            )
        else:
            reply = types.JSONRPCError(
                jsonrpc="2.0",
                id=request_id,
                error=types.ErrorData(code=types.PARSE_ERROR, message=f"the request could not be read: {reason}"),
            )
        await self._write.send(SessionMessage(reply))

    def __aiter__(self) -> SecondChanceReader:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> SecondChanceReader:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _unparsed_line(exc: Exception) -> str | None:
    """The raw line behind a JSON syntax failure of the SDK's parser, else None."""
    if not isinstance(exc, pydantic.ValidationError):
        return None
    for error in exc.errors():
        if error.get("type") == "json_invalid" and isinstance(error.get("input"), str):
            return error["input"]
    return None


def _reason(exc: Exception) -> str:
    if isinstance(exc, pydantic.ValidationError):
        msg = exc.errors()[0].get("msg", "")
        if "recursion limit" in msg:
            return "it is nested too deeply"
        return msg
    return type(exc).__name__


def reparse(line: str) -> types.JSONRPCMessage | None:
    """Parse with Python's json and validate as JSON-RPC; None if either fails.

    Lone surrogates may stay only inside a tool call's arguments, where the call
    path refuses them without echoing them. Anywhere else (a method name, a
    cursor) the SDK might echo one back, and its UTF-8 writer would then fail and
    take the whole connection down, so there they become U+FFFD.
    """
    try:
        raw = _surrogates_only_in_arguments(json.loads(line))
        return types.jsonrpc_message_adapter.validate_python(raw, by_name=False)
    except (ValueError, RecursionError, pydantic.ValidationError):
        return None


def _surrogates_only_in_arguments(raw: Any) -> Any:
    params = raw.get("params") if isinstance(raw, dict) else None
    if isinstance(params, dict) and raw.get("method") == "tools/call" and "arguments" in params:
        envelope = replace_lone_surrogates({**raw, "params": {k: v for k, v in params.items() if k != "arguments"}})
        envelope["params"]["arguments"] = params["arguments"]
        return envelope
    return replace_lone_surrogates(raw)


def top_level_member(line: str, wanted: str) -> Any:
    """The string or number value of key ``wanted`` in the outermost object of ``line``.

    A flat scan that tracks depth instead of parsing, so any nesting costs one
    pass. Returns None when the key is absent or its value is not a scalar.
    """
    depth = 0
    key: str | None = None
    awaiting_value = False
    pos, end = 0, len(line)
    while pos < end:
        char = line[pos]
        if char == '"':
            try:
                text, pos = scanstring(line, pos + 1, False)
            except ValueError:
                return None
            if depth == 1:
                if awaiting_value:
                    if key == wanted:
                        return text
                    awaiting_value = False
                else:
                    key = text
            continue
        if char in "{[":
            depth += 1
            awaiting_value = False if depth > 1 else awaiting_value
        elif char in "}]":
            depth -= 1
        elif depth == 1 and char == ":":
            awaiting_value = True
        elif depth == 1 and char == ",":
            key, awaiting_value = None, False
        elif depth == 1 and awaiting_value and char in "-0123456789":
            match = _NUMBER.match(line, pos)
            if match and key == wanted:
                number = match.group()
                return int(number) if re.fullmatch(r"-?[0-9]+", number) else float(number)
            awaiting_value = False
            pos = match.end() if match else pos + 1
            continue
        pos += 1
    return None
