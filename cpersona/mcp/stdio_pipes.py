"""stdin and stdout watched by the event loop itself: no worker thread per line.

The SDK's stdio transport wraps both streams with ``anyio.wrap_file``, so
reading a line, writing an answer and flushing it are each a hop to a worker
thread and back: three per tool call, on top of the service's own. On a busy
machine each hop waits for the scheduler, and together they were a sizeable
share of a cheap call's latency. When stdin and stdout are pipes or sockets
(which is how MCP clients start servers), the asyncio loop can watch them
directly; these classes give the SDK's ``stdio_server`` the two file objects it
asks for (``async for line in stdin``, ``await stdout.write(...)``,
``await stdout.flush()``) on top of that.

Lines read exactly as the SDK's text wrapper reads them: UTF-8 with
undecodable bytes replaced, universal newlines (``\\r\\n`` and ``\\r`` end a
line too and read as ``\\n``), the last line kept even without a newline.

Reading costs time in proportion to what arrives: a line is kept as the list of
pieces it came in and joined once, when its newline arrives. A line longer than
the largest request any tool can accept is not kept at all: its first
``OVERLONG_HEAD_CHARS`` stay (enough to find the request id), the rest is
counted and dropped as it arrives, and the reader hands out an
:class:`OverlongLine` in its place, for the server to answer.

Like the SDK, the wire is claimed while serving: fd 0 reads the null device
and fd 1 writes to stderr, so a stray ``print`` or a child process cannot
corrupt the protocol stream; both are restored on exit.
"""

from __future__ import annotations

import asyncio
import codecs
import io
import os
import stat
import sys
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

from cpersona.mcp.validation import MAX_REQUEST_BYTES

# Lines read ahead of the server before reading pauses (back-pressure).
MAX_PENDING_LINES = 16
# How long exit waits for a client that stopped reading to take the last answer.
CLOSE_DRAIN_SECONDS = 5.0
# What is kept of an over-long line: the JSON-RPC envelope (and its id) comes first.
OVERLONG_HEAD_CHARS = 64 * 1024


@dataclass(frozen=True)
class OverlongLine:
    """Stands for a line longer than the limit: its head and how long it was (characters, newline excluded)."""

    head: str
    length: int


def watchable(fd: int) -> bool:
    """Whether the event loop can watch ``fd`` (a pipe or a socket)."""
    if sys.platform == "win32":  # pragma: no cover - the SDK's transport serves Windows
        return False
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class _LineReader(asyncio.Protocol):
    """Decodes what arrives into lines and hands them out in order."""

    def __init__(self, max_line_chars: int = MAX_REQUEST_BYTES) -> None:
        self._decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")("replace"), translate=True)
        # A UTF-8 byte decodes to at most one character, so counting characters
        # never refuses a line whose bytes are within the limit.
        self._max_line_chars = max_line_chars
        self._parts: list[str] = []  # the line so far, in the pieces it arrived in
        self._length = 0  # characters of the line so far
        self._overlong_head: str | None = None  # set once the line is known to be too long
        self._lines: deque[str | OverlongLine] = deque()
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.ReadTransport | None = None
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._add(self._decoder.decode(data))

    def eof_received(self) -> bool:
        self._finish(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        if self._eof:
            return
        self._add(self._decoder.decode(b"", final=True))
        if self._length or self._overlong_head is not None:
            self._end_line("")
        self._eof, self._error = True, exc
        self._wake()

    def _add(self, text: str) -> None:
        # Each character is looked at by one find and copied by one join.
        start = 0
        while (newline := text.find("\n", start)) >= 0:
            self._extend(text, start, newline)
            self._end_line("\n")
            start = newline + 1
        if start < len(text):
            self._extend(text, start, len(text))
        if self._lines:
            self._wake()
            if len(self._lines) >= MAX_PENDING_LINES and self._transport is not None and not self._paused:
                self._transport.pause_reading()
                self._paused = True

    def _extend(self, text: str, start: int, end: int) -> None:
        if start == end:
            return
        self._length += end - start
        if self._overlong_head is not None:
            return  # counted, not kept
        self._parts.append(text[start:end] if start or end < len(text) else text)
        if self._length > self._max_line_chars:
            head: list[str] = []
            kept = 0
            for part in self._parts:
                head.append(part[: OVERLONG_HEAD_CHARS - kept])
                kept += len(head[-1])
                if kept >= OVERLONG_HEAD_CHARS:
                    break
            self._overlong_head = "".join(head)
            self._parts = []

    def _end_line(self, newline: str) -> None:
        if self._overlong_head is not None:
            self._lines.append(OverlongLine(self._overlong_head, self._length))
        else:
            self._lines.append("".join(self._parts) + newline)
        self._parts, self._length, self._overlong_head = [], 0, None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next_line(self) -> str | OverlongLine | None:
        """The next line, or None at the end of input."""
        while not self._lines:
            if self._eof:
                if self._error is not None:
                    raise self._error
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        line = self._lines.popleft()
        if self._paused and len(self._lines) < MAX_PENDING_LINES // 2 and self._transport is not None:
            self._transport.resume_reading()
            self._paused = False
        return line


class PipeReader:
    """The ``async for line in stdin`` side of the SDK's stdio transport.

    An over-long line never reaches the SDK: it goes to ``on_overlong`` (set by
    whoever can answer it) and reading goes on with the next line.
    """

    def __init__(self, protocol: _LineReader) -> None:
        self._protocol = protocol
        self.on_overlong: Callable[[OverlongLine], Awaitable[None]] | None = None

    def __aiter__(self) -> PipeReader:
        return self

    async def __anext__(self) -> str:
        while True:
            line = await self._protocol.next_line()
            if line is None:
                raise StopAsyncIteration
            if isinstance(line, str):
                return line
            if self.on_overlong is not None:
                await self.on_overlong(line)


class _WriteFlow(asyncio.Protocol):
    """Write-side flow control: flush waits while the pipe's buffer is over its high mark."""

    def __init__(self) -> None:
        self._resumed: asyncio.Event = asyncio.Event()
        self._resumed.set()
        self.lost: BaseException | None = None

    def pause_writing(self) -> None:
        self._resumed.clear()

    def resume_writing(self) -> None:
        self._resumed.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or BrokenPipeError("stdout was closed")
        self._resumed.set()

    async def drained(self) -> None:
        await self._resumed.wait()


class PipeWriter:
    """The ``await stdout.write(text)`` / ``await stdout.flush()`` side."""

    def __init__(self, transport: asyncio.WriteTransport, flow: _WriteFlow) -> None:
        self._transport = transport
        self._flow = flow

    async def write(self, text: str) -> None:
        if self._flow.lost is not None:
            raise self._flow.lost
        self._transport.write(text.encode("utf-8"))  # strict, as the SDK's writer

    async def flush(self) -> None:
        await self._flow.drained()
        if self._flow.lost is not None:
            raise self._flow.lost


def _claim(fd: int, diversion: int) -> int:
    """Move the wire on ``fd`` to a private descriptor; ``fd`` then points at ``diversion``."""
    import fcntl

    private = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    try:
        os.dup2(diversion, fd)
    except OSError:
        os.close(private)
        raise
    finally:
        os.close(diversion)
    return private


def _restore(fd: int, private: int, blocking: bool) -> None:
    try:
        os.dup2(private, fd)
        os.set_blocking(fd, blocking)  # the loop made the shared description non-blocking
    except OSError:  # pragma: no cover - nothing more can be done at exit
        pass


@asynccontextmanager
async def pipe_stdio() -> AsyncIterator[tuple[PipeReader, PipeWriter] | None]:
    """Loop-watched stdin/stdout, or None when they are not both pipes or sockets."""
    if not (watchable(0) and watchable(1)):
        yield None
        return
    loop = asyncio.get_running_loop()
    blocking = (os.get_blocking(0), os.get_blocking(1))
    stdin_fd = _claim(0, os.open(os.devnull, os.O_RDONLY))
    try:
        stdout_fd = _claim(1, os.dup(2))
    except OSError:
        _restore(0, stdin_fd, blocking[0])
        os.close(stdin_fd)
        raise
    transports: list[Any] = []
    try:
        reader = _LineReader()
        transport, _ = await loop.connect_read_pipe(lambda: reader, os.fdopen(stdin_fd, "rb", buffering=0))
        transports.append(transport)
        flow = _WriteFlow()
        write_transport, _ = await loop.connect_write_pipe(lambda: flow, os.fdopen(stdout_fd, "wb", buffering=0))
        transports.append(write_transport)
        # Anything buffered pauses the writer, so flush returns only once the
        # answer is in the pipe, as the SDK's blocking flush does.
        write_transport.set_write_buffer_limits(high=0)
        yield PipeReader(reader), PipeWriter(write_transport, flow)
        with suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(flow.drained(), CLOSE_DRAIN_SECONDS)
    finally:
        # Restore first: closing a transport closes its private descriptor.
        _restore(0, stdin_fd, blocking[0])
        _restore(1, stdout_fd, blocking[1])
        for transport in transports:
            transport.close()
        await asyncio.sleep(0)  # let the transports finish closing
