"""``cpersona embed-server`` as a real process on 127.0.0.1, used by real stdio servers in ``http`` mode.

The model is the tiny one the test builds (tests/local_model_support.py). The
stdio servers are ``python -m cpersona`` driven by the SDK's client; the
database is read directly afterwards to see which vectors were stored.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from mcp import Client, StdioServerParameters

from stdio_harness import e2e_db_path, server_env  # noqa: F401 (fixture)
from local_model_support import build_model_folder
from cpersona.embedding.local_model import LocalModel

pytestmark = pytest.mark.anyio


class EmbedServer:
    def __init__(self, folder: Path) -> None:
        env = {
            **os.environ,
            "CPERSONA_EMBEDDING_MODEL_PATH": str(folder),
            "CPERSONA_UPDATE_CHECK": "false",
            "CPERSONA_EMBEDDING_THREADS": "1",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cpersona", "embed-server", "--port", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        line = self.proc.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:"), line
        self.url = line.removeprefix("listening on ")
        self.base = self.url.removesuffix("/embed")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    return build_model_folder(tmp_path / "tiny", dimension=16)


@pytest.fixture
def embed_server(model_folder: Path):
    server = EmbedServer(model_folder)
    yield server
    server.close()


def test_the_routes_speak_the_http_embedding_contract(embed_server, model_folder):
    model = LocalModel(model_folder, threads=1)
    with httpx.Client(timeout=30) as http:
        health = http.get(f"{embed_server.base}/health").json()
        assert (health["ok"], health["model"], health["dimension"]) == (True, "tiny-test", 16)
        report = http.get(f"{embed_server.base}/capabilities").json()
        # spec EMB-6: a fingerprint and nothing incomplete; the same one local mode stores.
        assert report["fingerprint"] == model.fingerprint and report["incomplete"] == []
        assert report["identity"]["model"] == "tiny-test"
        texts = ["the cat", "coffee tea morning", "the cat"]
        embedded = http.post(embed_server.url, json={"texts": texts}).json()["embeddings"]
        np.testing.assert_allclose(np.array(embedded, dtype=np.float32), model.embed(texts), atol=1e-6)
        counted = http.post(f"{embed_server.base}/count_tokens", json={"texts": ["cat dog"]}).json()
        assert counted == {"token_info": [{"count": 2, "window": 10, "truncated": False, "window_end_char": 7}]}
        # Bad input: a 400 naming the problem, and the server keeps serving.
        for body in (b"not json", b'{"texts": "x"}', b'{"texts": [1]}', json.dumps({"texts": ["a"] * 513}).encode()):
            answer = http.post(embed_server.url, content=body)
            assert answer.status_code == 400 and answer.json()["error"]
        assert http.post(f"{embed_server.base}/nowhere", json={}).status_code == 404
        assert http.get(f"{embed_server.base}/health").json()["ok"] is True


def stdio(db_path: Path, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "cpersona"], env=server_env(db_path, **env), cwd=os.getcwd()
    )


async def call(client: Client, tool: str, **arguments) -> dict:
    result = await client.call_tool(tool, arguments)
    assert result.is_error is False, result.content
    return json.loads(result.content[0].text)


def stored(db_path: Path) -> tuple[list[bytes], list[tuple]]:
    with sqlite3.connect(db_path) as conn:
        vectors = [r[0] for r in conn.execute("SELECT embedding FROM memories ORDER BY id")]
        identity = conn.execute("SELECT label, dimension FROM embedding_identity").fetchall()
    return vectors, identity


async def test_stdio_servers_share_the_model_and_local_mode_keeps_its_vectors(e2e_db_path, embed_server, model_folder):
    model = LocalModel(model_folder, threads=1)
    texts = ["morning coffee with music", "the garden tomato", "a piano lesson"]
    http_mode = stdio(e2e_db_path, CPERSONA_EMBEDDING_MODE="http", CPERSONA_EMBEDDING_URL=embed_server.url)
    async with Client(http_mode) as client:
        for text in texts:
            assert (await call(client, "store", agent_id="a", content=text))["embedded"] is True
        found = await call(client, "recall", agent_id="a", query="piano")
        assert "a piano lesson" in [m["content"] for m in found["messages"]]
    vectors, identity = stored(e2e_db_path)
    np.testing.assert_allclose(
        np.frombuffer(b"".join(vectors), dtype=np.float32).reshape(3, 16), model.embed(texts), atol=1e-6
    )
    assert [label for label, _ in identity] == [model.fingerprint]  # the width is recorded once known

    # The same model in-process: same fingerprint, so nothing is cleared or re-embedded.
    local_mode = stdio(e2e_db_path, CPERSONA_EMBEDDING_MODE="local", CPERSONA_EMBEDDING_MODEL_PATH=str(model_folder))
    async with Client(local_mode) as client:
        assert (await call(client, "store", agent_id="a", content="tea in the evening"))["embedded"] is True
        health = await call(client, "check_health", agent_id="a")
        assert not [i for i in health.get("issues", []) if i.get("type") == "embedding_model_mismatch"]
    after, identity = stored(e2e_db_path)
    assert after[:3] == vectors and identity == [(model.fingerprint, 16)]
    np.testing.assert_allclose(
        np.frombuffer(after[3], dtype=np.float32), model.embed(["tea in the evening"])[0], atol=1e-6
    )
