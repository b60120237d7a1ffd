"""The loop-watched stdio streams read and write exactly what the SDK's text wrapper would.

The end-to-end stdio tests (tests/e2e) run the server over real pipes, so they
take this path for every call; these pin the line splitting and the write
side's flush on their own, over os.pipe() pairs.
"""

from __future__ import annotations

import asyncio
import io
import os
import time

import pytest

from cpersona.mcp.stdio_pipes import (
    OVERLONG_HEAD_CHARS,
    OverlongLine,
    PipeReader,
    PipeWriter,
    _LineReader,
    _WriteFlow,
    watchable,
)

pytestmark = pytest.mark.anyio


def sdk_lines(data: bytes) -> list[str]:
    """What the SDK's reader yields for ``data``: a UTF-8 text wrapper with replacement."""
    return list(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace"))


async def read_all(chunks: list[bytes]) -> list[str]:
    read_fd, write_fd = os.pipe()
    loop = asyncio.get_running_loop()
    protocol = _LineReader()
    transport, _ = await loop.connect_read_pipe(lambda: protocol, os.fdopen(read_fd, "rb", buffering=0))
    try:
        for chunk in chunks:
            os.write(write_fd, chunk)
            await asyncio.sleep(0.01)  # arrive as separate reads
        os.close(write_fd)
        return [line async for line in PipeReader(protocol)]
    finally:
        transport.close()


@pytest.mark.parametrize(
    "chunks",
    [
        [b'{"a":1}\n{"b":2}\n'],
        [b'{"a":', b'1}\n{"b"', b":2}"],  # split mid-line; the last line has no newline
        [b'{"a":1}\r\n{"b":2}\r', b'\n{"c":3}\r{"d":4}\n'],  # \r\n and a lone \r end lines too
        ['{"t":"日本語"}\n'.encode()[:9], '{"t":"日本語"}\n'.encode()[9:]],  # a character split across reads
        [b'{"bad":"\xff\xfe"}\n', b"\n", b"tail"],  # undecodable bytes, a blank line
        [b""],
    ],
)
async def test_lines_match_the_sdk_text_wrapper(chunks: list[bytes]) -> None:
    assert await read_all(chunks) == sdk_lines(b"".join(chunks))


async def test_many_lines_ahead_of_the_reader_pause_and_resume_without_loss() -> None:
    lines = [f'{{"n":{i}}}\n'.encode() for i in range(200)]
    assert await read_all([b"".join(lines)]) == [line.decode() for line in lines]


async def test_a_large_answer_is_fully_written_when_flush_returns() -> None:
    read_fd, write_fd = os.pipe()
    loop = asyncio.get_running_loop()
    flow = _WriteFlow()
    transport, _ = await loop.connect_write_pipe(lambda: flow, os.fdopen(write_fd, "wb", buffering=0))
    transport.set_write_buffer_limits(high=0)
    answer = "x" * 300_000 + "\n"  # larger than a pipe's buffer
    received = bytearray()

    def drain() -> None:
        while len(received) < len(answer):
            received.extend(os.read(read_fd, 65536))

    reader = loop.run_in_executor(None, drain)
    writer = PipeWriter(transport, flow)
    await writer.write(answer)
    await writer.flush()
    assert transport.get_write_buffer_size() == 0  # flush waited for the pipe to take it all
    await reader
    assert received.decode() == answer
    transport.close()
    os.close(read_fd)


async def test_writing_after_the_reader_went_away_raises() -> None:
    read_fd, write_fd = os.pipe()
    loop = asyncio.get_running_loop()
    flow = _WriteFlow()
    transport, _ = await loop.connect_write_pipe(lambda: flow, os.fdopen(write_fd, "wb", buffering=0))
    os.close(read_fd)
    await asyncio.sleep(0.05)
    writer = PipeWriter(transport, flow)
    with pytest.raises(OSError):
        await writer.write("x\n")
        await writer.flush()
        await asyncio.sleep(0.05)
        await writer.write("y\n")
    transport.close()


def test_only_pipes_and_sockets_are_watched(tmp_path) -> None:
    read_fd, write_fd = os.pipe()
    with open(tmp_path / "f", "wb") as regular:
        assert watchable(read_fd) and watchable(write_fd)
        assert not watchable(regular.fileno())  # a regular file: the SDK's own wrapping serves it
    os.close(read_fd)
    os.close(write_fd)


# --- long lines (issue 13 item 6) ---------------------------------------------------


def test_a_fifty_megabyte_line_in_small_reads_is_read_in_linear_time() -> None:
    # Re-joining everything received on every read took 64 s for this; linear reading takes well under
    # a second. The bound is a liveness guard, not a benchmark.
    reader = _LineReader()
    chunk = b"x" * (64 * 1024)
    deadline = time.monotonic() + 30
    for _ in range(800):  # 50 MiB, below the request limit
        reader.data_received(chunk)
        assert time.monotonic() < deadline, "reading one long line is not linear in its length"
    reader.data_received(b"\n{}\n")
    assert [len(line) for line in reader._lines] == [800 * len(chunk) + 1, 3]


async def test_an_overlong_line_is_dropped_as_it_arrives_and_reading_goes_on() -> None:
    read_fd, write_fd = os.pipe()
    loop = asyncio.get_running_loop()
    protocol = _LineReader(max_line_chars=1000)
    transport, _ = await loop.connect_read_pipe(lambda: protocol, os.fdopen(read_fd, "rb", buffering=0))
    overlong: list[OverlongLine] = []

    async def collect(line: OverlongLine) -> None:
        overlong.append(line)

    reader = PipeReader(protocol)
    reader.on_overlong = collect
    try:
        head = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"x":"'
        os.write(write_fd, b'{"n":1}\n' + head)
        for _ in range(40):
            os.write(write_fd, b"y" * 10_000)
            await asyncio.sleep(0.005)
            assert sum(map(len, protocol._parts)) <= 1000  # nothing past the limit is kept
        os.write(write_fd, b'"}}\n{"n":2}\n' + b"z" * 1001)
        os.close(write_fd)
        lines = [line async for line in reader]
    finally:
        transport.close()
    assert lines == ['{"n":1}\n', '{"n":2}\n']
    assert [line.length for line in overlong] == [len(head) + 400_000 + 3, 1001]
    assert overlong[0].head.startswith(head.decode()) and len(overlong[0].head) <= OVERLONG_HEAD_CHARS
