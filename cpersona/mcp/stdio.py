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
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any

import anyio
import mcp.types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

from cpersona.mcp.stdio_lines import overlong_reason, reason, reparse, unparsed_line, unreadable_reply
from cpersona.mcp.stdio_pipes import CLOSE_DRAIN_SECONDS, OverlongLine, pipe_stdio
from cpersona.mcp.stdio_thread import thread_stdin

log = logging.getLogger(__name__)


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
            line = unparsed_line(item)
            if line is None:
                return item
            message = reparse(line)
            if message is not None:
                if isinstance(self._write, AnswerTracker):
                    self._write.expect(message)
                return SessionMessage(message)
            await self._answer_unreadable(line, item)

    async def _answer_unreadable(self, line: str, exc: Exception) -> None:
        await self._answer(line, reason(exc))

    async def answer_overlong(self, line: OverlongLine) -> None:
        """Answer a line the pipe reader refused for its length (only its head was kept)."""
        await self._answer(line.head, overlong_reason(line), null_id=True)

    async def _answer(self, line: str, why: str, null_id: bool = False) -> None:
        reply = unreadable_reply(line, why, null_id)
        if reply is not None:
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
