"""Fetching a model into the cache: a real HTTP server on 127.0.0.1 serving a model folder.

The server is the standard library's file server over a folder the test
builds (the tiny model of local_model_support.py, named like the default
profile), with knobs for the checksum sources fetch.py reads: a SHA256SUMS
file, an ``X-Linked-Etag`` header (what the Hugging Face hub sends), or
neither. Nothing leaves the machine.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cpersona.config import load_settings
from cpersona.embedding.client import build_embedder
from cpersona.embedding.fetch import FetchError, fetch_model, verify_folder
from cpersona.embedding.profiles import format_sums, profile, read_sums
from local_model_support import build_model_folder

PROFILE = profile("all-MiniLM-L6-v2")
FILES = ("model.onnx", "tokenizer.json")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class FolderServer:
    """Serves ``folder`` over HTTP; ``etags`` (name → value) adds X-Linked-Etag headers; ``seen`` lists paths."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.etags: dict[str, str] = {}
        self.seen: list[str] = []
        owner = self

        class Handler(SimpleHTTPRequestHandler):
            def end_headers(self) -> None:
                tag = owner.etags.get(self.path.lstrip("/"))
                if tag:
                    self.send_header("X-Linked-Etag", f'"{tag}"')
                super().end_headers()

            def do_GET(self) -> None:  # noqa: N802
                owner.seen.append(self.path)
                super().do_GET()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class names it
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/models/all-MiniLM-L6-v2"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served(tmp_path: Path):
    root = tmp_path / "served"
    folder = build_model_folder(root / "models" / "all-MiniLM-L6-v2", name="all-MiniLM-L6-v2", dimension=16)
    (folder / "SHA256SUMS").write_text(format_sums({name: sha256(folder / name) for name in FILES}))
    server = FolderServer(root)
    yield server, folder
    server.close()


def test_a_fetch_downloads_checks_and_installs_the_folder_in_one_step(tmp_path, served):
    server, folder = served
    lines: list[str] = []
    target = fetch_model(PROFILE, tmp_path / "cache", source=server.url, progress=lines.append)
    assert target == tmp_path / "cache" / "all-MiniLM-L6-v2"
    for name in (*FILES, "cpersona-model.json"):
        assert (target / name).read_bytes() == (folder / name).read_bytes()
    assert read_sums(target) == {name: sha256(folder / name) for name in FILES}
    assert verify_folder(target) == []
    assert any(line.startswith("fetching all-MiniLM-L6-v2: model.onnx") and "(100%)" in line for line in lines)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["all-MiniLM-L6-v2"]  # no partial left
    # Once there, it is never fetched again.
    requests = len(server.seen)
    assert fetch_model(PROFILE, tmp_path / "cache", source=server.url, progress=lines.append) == target
    assert len(server.seen) == requests


def test_a_file_that_does_not_match_its_published_sum_is_refused_and_nothing_is_kept(tmp_path, served):
    server, folder = served
    (folder / "model.onnx").write_bytes((folder / "model.onnx").read_bytes()[:-10] + b"0123456789")
    with pytest.raises(FetchError, match="model.onnx of all-MiniLM-L6-v2 .* has sha256 .* expected"):
        fetch_model(PROFILE, tmp_path / "cache", source=server.url, progress=lambda _: None)
    assert list((tmp_path / "cache").iterdir()) == []


def test_the_hub_style_etag_is_the_checksum_when_no_sums_file_is_served(tmp_path, served):
    server, folder = served
    (folder / "SHA256SUMS").unlink()
    good = sha256(folder / "model.onnx")
    server.etags["models/all-MiniLM-L6-v2/model.onnx"] = "0" * 64
    with pytest.raises(FetchError, match=f"expected {'0' * 64}"):
        fetch_model(PROFILE, tmp_path / "cache", source=server.url, progress=lambda _: None)
    server.etags["models/all-MiniLM-L6-v2/model.onnx"] = good
    target = fetch_model(PROFILE, tmp_path / "cache", source=server.url, progress=lambda _: None)
    # tokenizer.json had no published sum: kept, and its sum recorded for later checks.
    assert read_sums(target) == {"model.onnx": good, "tokenizer.json": sha256(folder / "tokenizer.json")}
    (target / "tokenizer.json").write_text("{}")
    assert verify_folder(target) == ["tokenizer.json"]


def test_a_source_serving_another_model_is_refused(tmp_path, served):
    server, folder = served
    config = json.loads((folder / "cpersona-model.json").read_text())
    (folder / "cpersona-model.json").write_text(json.dumps({**config, "name": "something-else"}))
    with pytest.raises(FetchError, match="serves the model 'something-else', not 'all-MiniLM-L6-v2'"):
        fetch_model(PROFILE, tmp_path / "cache", source=server.url, progress=lambda _: None)


def test_local_mode_fetches_on_first_use_in_the_background_then_embeds(tmp_path, served):
    server, _ = served
    settings = load_settings(
        {
            "CPERSONA_EMBEDDING_MODE": "local",
            "CPERSONA_EMBEDDING_CACHE_DIR": str(tmp_path / "c"),
            "CPERSONA_EMBEDDING_MODEL_SOURCE": server.url,
        }
    )
    embedder = build_embedder(settings)
    try:
        first = embedder.embed_query("cat")
        assert first.vector is None and "being fetched" in first.outcome.error  # the call does not wait
        assert embedder.provider.wait_for_fetch(60)
        assert embedder.embed_query("cat").vector.shape == (16,)
        assert (tmp_path / "c" / "all-MiniLM-L6-v2" / "model.onnx").is_file()
    finally:
        embedder.close()


def test_offline_with_nothing_cached_names_both_ways_out(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "CPERSONA_UPDATE_CHECK": "false",
        "CPERSONA_EMBEDDING_CACHE_DIR": str(tmp_path / "empty"),
        "CPERSONA_EMBEDDING_MODEL_SOURCE": "http://127.0.0.1:9/nothing-listens-here",
    }
    done = subprocess.run(
        [sys.executable, "-m", "cpersona", "embed-server", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1
    message = done.stderr.strip().splitlines()[-1]
    assert "cpersona fetch-model all-MiniLM-L6-v2" in message and "CPERSONA_EMBEDDING_MODEL_PATH" in message
    assert "ConnectError" in message


def test_fetch_model_command_fetches_lists_and_verifies(tmp_path, served):
    server, _ = served
    env = {"PATH": "/usr/bin:/bin", "CPERSONA_UPDATE_CHECK": "false"}
    cache = str(tmp_path / "cache")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cpersona", "fetch-model", *args, "--cache-dir", cache],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    listed = cli("--list")
    assert listed.returncode == 0
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [
        "all-MiniLM-L6-v2",
        "bge-small-en-v1.5",
        "multilingual-e5-small",
    ]
    assert "not cached" in listed.stdout.splitlines()[0]
    fetched = cli("minilm", "--source", server.url)
    assert fetched.returncode == 0, fetched.stderr
    assert fetched.stdout.strip() == str(tmp_path / "cache" / "all-MiniLM-L6-v2")
    assert "fetching all-MiniLM-L6-v2: model.onnx" in fetched.stderr
    assert cli("--verify").returncode == 0
    (tmp_path / "cache" / "all-MiniLM-L6-v2" / "model.onnx").write_bytes(b"changed")
    broken = cli("--verify")
    assert broken.returncode == 1 and "model.onnx" in broken.stderr
    assert cli("no-such-model").returncode == 2
