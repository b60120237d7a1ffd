"""stdin the event loop cannot watch (a terminal, a file), read by a daemon thread.

Without this, the SDK reads such a stdin through ``anyio.wrap_file``: each line
is a read in an AnyIO worker thread, and a cancelled read waits for that thread
to return. In a terminal it returns only when a line is typed, so Ctrl-C
cancelled the server and then waited for the next Enter (issue 13: "still
running after 20 s"); and interpreter exit joins that non-daemon thread too.

Here one daemon thread reads lines and hands them to the loop through a queue.
Cancelling the wait on the queue is immediate, and nothing ever joins the
thread: it ends with the process. Lines read as the SDK reads them (UTF-8 with
undecodable bytes replaced, universal newlines); like the SDK, fd 0 reads the
null device while serving, so a child process cannot steal the input.
"""

from __future__ import annotations

import asyncio
import io
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio.to_thread

from cpersona.mcp.stdio_pipes import MAX_PENDING_LINES, _claim, _restore

_EOF = object()


class ThreadStdin:
    """The ``async for line in stdin`` side of the SDK's stdio transport."""

    def __init__(self, fd: int) -> None:
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._room = threading.Semaphore(MAX_PENDING_LINES)  # back-pressure on the reading thread
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._read, args=(fd,), name="cpersona-stdin", daemon=True)
        self._thread.start()

    def _read(self, fd: int) -> None:
        # closefd=False: the descriptor must outlive the transport while this thread may still block on it.
        lines = io.TextIOWrapper(os.fdopen(fd, "rb", closefd=False), encoding="utf-8", errors="replace")
        item: object = _EOF
        try:
            for line in lines:
                self._room.acquire()
                self._hand_over(line)
        except (OSError, ValueError) as exc:
            item = exc
        except RuntimeError:  # the loop is gone: nobody is reading any more
            return
        try:
            self._hand_over(item)
        except RuntimeError:
            pass

    def _hand_over(self, item: object) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def __aiter__(self) -> ThreadStdin:
        return self

    async def __anext__(self) -> str:
        item = await self._queue.get()
        if item is _EOF:
            self._queue.put_nowait(_EOF)  # every later read ends too
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        self._room.release()
        return item  # type: ignore[return-value]


@asynccontextmanager
async def thread_stdin() -> AsyncIterator[ThreadStdin]:
    """A :class:`ThreadStdin` on the process's stdin, with fd 0 claimed while serving."""
    blocking = os.get_blocking(0)
    private = _claim(0, os.open(os.devnull, os.O_RDONLY))
    try:
        yield ThreadStdin(private)
    finally:
        # The private descriptor stays open: the thread may still be blocked on it.
        _restore(0, private, blocking)


@asynccontextmanager
async def thread_stdout() -> AsyncIterator[Callable[[str], Awaitable[None]]]:
    """A ``write(text)`` for stdout the event loop cannot watch, each write a worker-thread hop.

    As the SDK's transport does, fd 1 points at stderr while serving (a stray
    ``print`` misses the wire) and the answers go to a private copy of it.
    """
    blocking = os.get_blocking(1)
    private = _claim(1, os.dup(2))
    out = os.fdopen(private, "wb", closefd=False)

    def write_all(data: bytes) -> None:
        out.write(data)
        out.flush()

    async def write(text: str) -> None:
        await anyio.to_thread.run_sync(write_all, text.encode("utf-8"))  # strict, as the SDK's writer

    try:
        yield write
    finally:
        _restore(1, private, blocking)
        os.close(private)
