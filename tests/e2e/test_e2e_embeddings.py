"""Embeddings end to end: the real server over stdio, a real embedding server in its own process.

The embedding server is tests/embed_server.py with a small thesaurus (the
``TableServer`` of tests/test_vector_channel.py), so a paraphrase sharing no
word with the stored text still lands next to it, as with a sentence model.
It runs as a separate process so it can be killed like a real backend: every
connection to it dies, which an in-process server stopped politely would not
guarantee (its handler threads keep answering open keep-alive connections).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from stdio_harness import e2e_db_path, server_env  # noqa: F401 (fixture)

pytestmark = pytest.mark.anyio

TESTS = Path(__file__).resolve().parents[1]
SYNONYMS = {
    "automobile": "car",
    "needs": "wants",
    "new": "fresh",
    "tyres": "tires",
    "bicycle": "bike",
    "pedals": "cranks",
}
LAUNCH = (
    "import json, sys, threading; sys.path.insert(0, sys.argv[1]);"
    "from test_vector_channel import TableServer;"
    "s = TableServer(synonyms=json.loads(sys.argv[2]), port=int(sys.argv[3])).start();"
    "print('ready', flush=True); threading.Event().wait()"
)


class EmbeddingProcess:
    """tests/embed_server.py (with the thesaurus) in its own process, on a fixed port."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/embed"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, str(TESTS), json.dumps(SYNONYMS), str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def embedder_process():
    process = EmbeddingProcess()
    process.start()
    yield process
    process.kill()


def params(db_path: Path, url: str) -> StdioServerParameters:
    env = server_env(
        db_path, CPERSONA_EMBEDDING_MODE="http", CPERSONA_EMBEDDING_URL=url, CPERSONA_EMBEDDING_TIMEOUT_SECS="5"
    )
    return StdioServerParameters(command=sys.executable, args=["-m", "cpersona"], env=env, cwd=os.getcwd())


async def call(client: Client, tool: str, **arguments) -> dict:
    result = await client.call_tool(tool, arguments)
    assert result.is_error is False, result.content
    return json.loads(result.content[0].text)


def refs(answer: dict) -> list[str]:
    return [m.get("ref") for m in answer["messages"]]


async def until_found(client: Client, query: str, ref: str, seconds: float = 15.0) -> dict:
    """Recall until ``ref`` is found by its vector (the backfill works in the background)."""
    deadline = time.monotonic() + seconds
    while True:
        answer = await call(client, "recall", agent_id="a", query=query)
        if ref in refs(answer) or time.monotonic() > deadline:
            return answer
        await anyio.sleep(0.2)


async def test_paraphrase_outage_degraded_recall_and_backfill_on_recovery(e2e_db_path, embedder_process):
    async with Client(params(e2e_db_path, embedder_process.url)) as client:
        stored = await call(client, "store", agent_id="a", content="The automobile needs new tyres")
        assert stored["result"] == "stored" and stored["embedded"] is True  # spec ST-6

        # The vector channel finds a paraphrase that shares no word with the row.
        found = await call(client, "recall", agent_id="a", query="car wants fresh tires")
        assert refs(found) == ["mem:1"] and found["messages"][0]["match_reason"]["signal"] == "cosine"
        assert "advisory" not in found

        embedder_process.kill()
        # Degraded: keyword recall still answers. One failure shows nothing (ADV-2) ...
        first = await call(client, "recall", agent_id="a", query="automobile")
        assert refs(first) == ["mem:1"] and "advisory" not in first
        # ... the second latches the fault, and the answer carries the advisory (RC-9).
        second = await call(client, "recall", agent_id="a", query="tyres")
        assert refs(second) == ["mem:1"]
        assert second["advisory"]["severity"] == "fault" and "unreachable" in second["advisory"]["reason"]
        assert f"127.0.0.1:{embedder_process.port}/embed" in second["advisory"]["evidence"]

        # A store still succeeds, without a vector.
        down = await call(client, "store", agent_id="a", content="The bicycle needs new pedals")
        assert down["result"] == "stored" and down["embedded"] is False
        # Its paraphrase cannot be found by keywords alone.
        assert (await call(client, "recall", agent_id="a", query="bike wants fresh cranks"))["messages"] == []

        embedder_process.start()
        back = await call(client, "recall", agent_id="a", query="which automobile")  # the backend is back
        assert "advisory" not in back
        # Recovery triggered the backfill: the row stored during the outage gets its vector.
        answer = await until_found(client, "bike wants fresh cranks", "mem:2")
        assert refs(answer) == ["mem:2"] and answer["messages"][0]["match_reason"]["signal"] == "cosine"


async def test_a_row_stored_while_the_backend_was_down_is_embedded_at_the_next_startup(e2e_db_path, embedder_process):
    embedder_process.kill()
    async with Client(params(e2e_db_path, embedder_process.url)) as client:
        down = await call(client, "store", agent_id="a", content="The bicycle needs new pedals")
        assert down["embedded"] is False
    embedder_process.start()
    async with Client(params(e2e_db_path, embedder_process.url)) as client:
        answer = await until_found(client, "bike wants fresh cranks", "mem:1")
        assert refs(answer) == ["mem:1"] and answer["messages"][0]["match_reason"]["signal"] == "cosine"
