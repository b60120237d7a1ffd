"""A small, real HTTP embedding server for tests (and for trying the server by hand).

It speaks the contracts the client must handle (spec EMB-1, EMB-2, EMB-6):

- ``POST /embed`` ``{"texts": [...]}`` → ``{"embeddings": [[...], ...]}``
- ``POST /v1/embeddings`` ``{"model", "input": [...]}`` → ``{"data": [{"index",
  "embedding"}, ...], "model"}``, Bearer key checked when ``api_key`` is set
- ``GET /capabilities`` → the ``capabilities`` dict, or 404 when it is None
- ``POST /count_tokens`` ``{"texts": [...]}`` → ``{"token_info": [{count, window,
  truncated, window_end_char}, ...]}`` (spec OV-1) when ``token_window`` is set,
  404 otherwise. A token is a run of word characters or one other non-space
  character (``tokens_of``); the window closes at the end of token ``token_window``.
- with ``remote_index`` on, the remote vector index of spec EMB-6, kept in memory
  (``index``: namespace → {id: (text, vector)}): ``POST /index`` ``{namespace,
  items: [{id, text}]}`` embeds and stores (same id replaces), ``POST /remove``
  ``{namespace, ids}``, ``POST /purge`` ``{namespace}``, and ``POST /search``
  ``{namespace, query, limit, min_similarity}`` → ``{results: [{id, score}]}``,
  best dot product first. Off (the default), the four routes answer 404.
  ``search_results`` (a list) is answered verbatim instead of searching;
  ``route_status`` / ``route_delay`` (route path → status / seconds) break or
  slow one route without touching the others.

Vectors are deterministic and meaningful enough for recall tests: a hashed bag
of lower-cased words (weight 1) and character trigrams (weight 0.5), signed by
the hash, L2-normalised. Texts sharing words or spellings get a high dot
product; unrelated texts land near 0.

Fault knobs (set attributes on the live server, they apply to the next
request): ``delay`` (seconds before answering), ``status`` (non-2xx answer),
``mutate`` (a function turning the correct JSON payload into whatever should
be sent instead — wrong count, NaN, booleans, other widths ...), ``raw_body``
(bytes sent verbatim), ``declared_length`` (a Content-Length header that lies),
``omit_length`` (no Content-Length: the body ends when the connection closes),
``drip`` ((chunk size, pause) to send the body slowly), ``api_scale`` (api
vectors multiplied by this, so the client's normalisation shows) and
``api_order`` ("reverse" to return api items out of order). ``requests`` records
every request received.

Run by hand: ``python tests/embed_server.py --port 8401 [--dimension 64]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

WORD = re.compile(r"\w+", re.UNICODE)
REMOTE_ROUTES = ("/search", "/index", "/remove", "/purge")
TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def tokens_of(text: str) -> list[re.Match[str]]:
    """The test tokenizer of ``/count_tokens``: words and single punctuation marks."""
    return list(TOKEN.finditer(text))


def token_info(text: str, window: int) -> dict[str, Any]:
    """One ``token_info`` entry for ``text`` under a window of ``window`` tokens (spec OV-1)."""
    tokens = tokens_of(text)
    truncated = len(tokens) > window
    end = tokens[window - 1].end() if truncated else len(text)
    return {"count": len(tokens), "window": window, "truncated": truncated, "window_end_char": end}


def _bucket(feature: str, dimension: int) -> tuple[int, float]:
    digest = hashlib.blake2b(feature.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    number = int.from_bytes(digest, "little")
    return number % dimension, (1.0 if (number >> 63) & 1 else -1.0)


def embed_text(text: str, dimension: int = 64) -> list[float]:
    """The deterministic unit vector this server returns for ``text``."""
    lowered = text.lower()
    vector = [0.0] * dimension
    for word in WORD.findall(lowered):
        index, sign = _bucket("w:" + word, dimension)
        vector[index] += sign
    padded = f"  {lowered} "
    for start in range(len(padded) - 2):
        index, sign = _bucket("t:" + padded[start : start + 3], dimension)
        vector[index] += 0.5 * sign
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:
        # Blank text: a fixed unit vector, so every answer stays a unit vector.
        vector[0] = 1.0
        return vector
    return [v / norm for v in vector]


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw bytes when it was not JSON


@dataclass
class EmbedServer:
    """Server state and knobs; ``start()`` binds 127.0.0.1 on a free port."""

    dimension: int = 64
    api_key: str | None = None
    model_name: str = "test-hash-embedder"
    capabilities: dict[str, Any] | None = None
    token_window: int | None = None  # tokens per window for /count_tokens; None answers 404
    delay: float = 0.0
    status: int = 200
    mutate: Callable[[dict[str, Any]], Any] | None = None
    raw_body: bytes | None = None
    declared_length: int | None = None
    omit_length: bool = False
    drip: tuple[int, float] | None = None
    api_scale: float = 1.0
    api_order: str = "forward"
    requests: list[RecordedRequest] = field(default_factory=list)
    port: int = 0
    remote_index: bool = False
    index: dict[str, dict[str, tuple[str, list[float]]]] = field(default_factory=dict)
    search_results: list[Any] | None = None
    route_status: dict[str, int] = field(default_factory=dict)
    route_delay: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------- lifecycle

    def start(self) -> EmbedServer:
        handler = type("Handler", (_Handler,), {"state": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},  # so stop() returns quickly
            name="embed-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def reset_faults(self) -> None:
        self.delay, self.status, self.mutate, self.raw_body = 0.0, 200, None, None
        self.declared_length, self.omit_length, self.drip = None, False, None
        self.api_scale, self.api_order = 1.0, "forward"

    # ----------------------------------------------------------- addresses

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The http-mode endpoint (``CPERSONA_EMBEDDING_URL``)."""
        return f"{self.base_url}/embed"

    @property
    def api_url(self) -> str:
        """The api-mode endpoint (``CPERSONA_EMBEDDING_API_URL``)."""
        return f"{self.base_url}/v1/embeddings"

    def embed_requests(self) -> list[RecordedRequest]:
        """Recorded POSTs to either embedding route."""
        with self._lock:
            return [
                r for r in self.requests if r.method == "POST" and r.path.split("?")[0] in ("/embed", "/v1/embeddings")
            ]

    def token_requests(self) -> list[RecordedRequest]:
        """Recorded POSTs to ``/count_tokens``."""
        with self._lock:
            return [r for r in self.requests if r.method == "POST" and r.path.split("?")[0] == "/count_tokens"]

    def route_requests(self, route: str) -> list[RecordedRequest]:
        """Recorded POSTs to one path, e.g. ``/index``."""
        with self._lock:
            return [r for r in self.requests if r.method == "POST" and r.path.split("?")[0] == route]

    def indexed(self, namespace: str) -> dict[str, str]:
        """What the remote index holds for ``namespace``: id → text."""
        with self._lock:
            return {ref: text for ref, (text, _) in self.index.get(namespace, {}).items()}

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    # ------------------------------------------------------------- answers

    def vector(self, text: str) -> list[float]:
        return embed_text(text, self.dimension)


class _Handler(BaseHTTPRequestHandler):
    state: EmbedServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self._record(None)
        if self.path.split("?")[0] != "/capabilities" or self.state.capabilities is None:
            self._send_json(404, {"error": "not found"})
            return
        self._answer(self.state.capabilities)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw
        self._record(body)
        path = self.path.split("?")[0]
        if path == "/embed":
            texts = body.get("texts") if isinstance(body, dict) else None
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                self._send_json(422, {"error": "texts must be a list of strings"})
                return
            self._answer({"embeddings": [self.state.vector(t) for t in texts]})
        elif path == "/v1/embeddings":
            self._embeddings_api(body)
        elif path in REMOTE_ROUTES and self.state.remote_index:
            self._remote(path, body)
        elif path == "/count_tokens" and self.state.token_window is not None:
            texts = body.get("texts") if isinstance(body, dict) else None
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                self._send_json(422, {"error": "texts must be a list of strings"})
                return
            self._answer({"token_info": [token_info(t, self.state.token_window) for t in texts]})
        else:
            self._send_json(404, {"error": "not found"})

    def _embeddings_api(self, body: Any) -> None:
        state = self.state
        if state.api_key is not None and self.headers.get("Authorization") != f"Bearer {state.api_key}":
            self._send_json(401, {"error": {"message": "invalid api key"}})
            return
        texts = body.get("input") if isinstance(body, dict) else None
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            self._send_json(422, {"error": {"message": "input must be a list of strings"}})
            return
        items = [
            {"object": "embedding", "index": i, "embedding": [v * state.api_scale for v in state.vector(t)]}
            for i, t in enumerate(texts)
        ]
        if state.api_order == "reverse":
            items.reverse()
        self._answer({"object": "list", "data": items, "model": body.get("model", state.model_name)})

    def _remote(self, path: str, body: Any) -> None:
        """The in-memory remote vector index (spec EMB-6)."""
        state = self.state
        if delay := state.route_delay.get(path):
            time.sleep(delay)
        if status := state.route_status.get(path):
            self._send_json(status, {"error": "configured failure"})
            return
        if not isinstance(body, dict) or not isinstance(body.get("namespace"), str):
            self._send_json(422, {"error": "namespace must be a string"})
            return
        with state._lock:
            space = state.index.setdefault(body["namespace"], {})
            if path == "/index":
                for item in body.get("items") or []:
                    space[item["id"]] = (item["text"], state.vector(item["text"]))
                payload: Any = {"indexed": len(body.get("items") or [])}
            elif path == "/remove":
                removed = [ref for ref in body.get("ids") or [] if space.pop(ref, None) is not None]
                payload = {"removed": len(removed)}
            elif path == "/purge":
                payload = {"purged": len(space)}
                space.clear()
            elif state.search_results is not None:
                payload = {"results": state.search_results}
            else:
                query = state.vector(body.get("query", ""))
                scored = [(sum(a * b for a, b in zip(query, vector)), ref) for ref, (_, vector) in space.items()]
                floor = body.get("min_similarity", 0.0)
                scored = sorted((s for s in scored if s[0] >= floor), key=lambda s: -s[0])[: body.get("limit", 10)]
                payload = {"results": [{"id": ref, "score": score} for score, ref in scored]}
        self._send_json(200, payload)

    # ------------------------------------------------------------- plumbing

    def _record(self, body: Any) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.state.record(RecordedRequest(self.command, self.path, headers, body))

    def _answer(self, payload: Any) -> None:
        state = self.state
        if state.delay:
            time.sleep(state.delay)
        if state.status != 200:
            self._send_json(state.status, {"error": "configured failure"})
            return
        if state.mutate is not None:
            payload = state.mutate(payload)
        data = state.raw_body if state.raw_body is not None else json.dumps(payload).encode()
        self._send(200, data)

    def _send_json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode())

    def _send(self, status: int, data: bytes) -> None:
        state = self.state
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            faulty = status == 200 and (state.declared_length is not None or state.omit_length)
            if not (status == 200 and state.omit_length):
                length = state.declared_length if faulty and state.declared_length is not None else len(data)
                self.send_header("Content-Length", str(length))
            if faulty:
                # The body's end is wherever the connection closes.
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if status == 200 and state.drip is not None:
                size, pause = state.drip
                for start in range(0, len(data), size):
                    self.wfile.write(data[start : start + size])
                    self.wfile.flush()
                    time.sleep(pause)
            else:
                self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout tests); nothing to tell it


@pytest.fixture
def embed_server() -> Iterator[EmbedServer]:
    """A running server on 127.0.0.1 (free port), stopped after the test."""
    server = EmbedServer().start()
    try:
        yield server
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8401)
    parser.add_argument("--dimension", type=int, default=64)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()
    server = EmbedServer(dimension=args.dimension, api_key=args.api_key, port=args.port).start()
    print(f"embedding server on {server.url} (api: {server.api_url}); Ctrl-C stops it", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
