"""``cpersona embed-server``: one local model served over the ``http`` embedding contract.

Every Claude Code session starts its own stdio server; with ``local`` mode each
would hold its own copy of the model. This server holds one, and the stdio
servers use it with ``CPERSONA_EMBEDDING_MODE=http`` and
``CPERSONA_EMBEDDING_URL=http://127.0.0.1:8401/embed``. Routes (the shapes the
client in ``client.py``, ``tokens.py`` and ``identity.py`` reads):

- ``POST /embed`` ``{"texts": [...]}`` → ``{"embeddings": [[...], ...]}`` — stored
  passages (the profile's passage prefix). ``"kind": "query"`` selects the
  query prefix; cpersona's client does not send it, since the contract has no
  such field, so a profile whose queries need their own prefix is best run
  in-process.
- ``POST /count_tokens`` ``{"texts": [...]}`` → ``{"token_info": [...]}`` (spec OV-1)
- ``GET /capabilities`` → ``{"identity": {...}, "incomplete": [], "fingerprint"}``
  (spec EMB-6): the fingerprint is the one ``local`` mode stores, so rows keep
  their label whichever way the same model is reached.
- ``GET /health`` → ``{"ok": true, "model", "dimension", "texts_embedded", ...}``

It binds to 127.0.0.1 unless told otherwise and has no authentication: anything
that can reach the port can use the model. The model is loaded (and fetched
into the cache if needed, with progress on stderr) before the port opens.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cpersona.embedding.local_model import LocalModel
from cpersona.embedding.validate import MAX_VECTORS

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8401
MAX_BODY_BYTES = 16 * 1024 * 1024


class BadRequest(ValueError):
    pass


class ModelService:
    """The routes' logic on one loaded model (kept apart from the HTTP plumbing so it reads plainly)."""

    def __init__(self, model: LocalModel) -> None:
        self.model = model
        self._lock = threading.Lock()
        self.texts_embedded = 0
        self.requests = 0

    def capabilities(self) -> dict[str, Any]:
        config = self.model.config
        identity = {
            "model": config.name,
            "dimension": self.model.dimension,
            "pooling": config.pooling,
            "normalize": config.normalize,
            "max_tokens": config.max_tokens,
            "runtime": "onnxruntime",
        }
        return {"identity": identity, "incomplete": [], "fingerprint": self.model.fingerprint}

    def health(self) -> dict[str, Any]:
        with self._lock:
            counts = {"texts_embedded": self.texts_embedded, "requests": self.requests}
        return {
            "ok": True,
            "model": self.model.name,
            "dimension": self.model.dimension,
            "fingerprint": self.model.fingerprint,
            **counts,
        }

    def embed(self, payload: Any) -> dict[str, Any]:
        texts = _texts(payload)
        kind = payload.get("kind", "passage")
        if kind not in ("passage", "query"):
            raise BadRequest('"kind" must be "passage" or "query"')
        matrix = self.model.embed(texts, query=kind == "query")
        with self._lock:
            self.texts_embedded += len(texts)
            self.requests += 1
        return {"embeddings": matrix.tolist()}

    def count_tokens(self, payload: Any) -> dict[str, Any]:
        texts = _texts(payload)
        info = self.model.token_info(texts)
        return {
            "token_info": [
                {"count": i.count, "window": i.window, "truncated": i.truncated, "window_end_char": i.window_end_char}
                for i in info
            ]
        }


def _texts(payload: Any) -> list[str]:
    if not isinstance(payload, dict) or not isinstance(payload.get("texts"), list):
        raise BadRequest('body must be a JSON object with a "texts" list')
    texts = payload["texts"]
    if not all(isinstance(t, str) for t in texts):
        raise BadRequest('"texts" must hold strings only')
    if len(texts) > MAX_VECTORS:
        raise BadRequest(f'"texts" has {len(texts)} entries; at most {MAX_VECTORS} per request')
    return texts


def make_handler(service: ModelService) -> type[BaseHTTPRequestHandler]:
    posts = {"/embed": service.embed, "/count_tokens": service.count_tokens}
    gets = {"/capabilities": service.capabilities, "/health": service.health}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a stdio server sends one request per store
        disable_nagle_algorithm = True  # headers and body leave in two writes
        server_version = "cpersona-embed-server"

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self) -> str:
            return self.path.split("?", 1)[0].rstrip("/") or "/"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            route = gets.get(self._route())
            if route is None:
                self._send(404, {"error": f"no route GET {self._route()}"})
            else:
                self._send(200, route())

        def do_POST(self) -> None:  # noqa: N802
            # The body is read before any answer: an unread body left on a
            # keep-alive connection would be taken for the next request.
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY_BYTES:
                self.close_connection = True
                self._send(400 if length < 0 else 413, {"error": "missing or oversized Content-Length"})
                return
            body = self.rfile.read(length)
            route = posts.get(self._route())
            if route is None:
                self._send(404, {"error": f"no route POST {self._route()}"})
                return
            try:
                payload = json.loads(body)
                self._send(200, route(payload))
            except (BadRequest, ValueError) as exc:
                self._send(400, {"error": str(exc)})
            except Exception as exc:  # noqa: BLE001 - a model failure answers, it does not drop the connection
                log.exception("embedding failed")
                self._send(500, {"error": f"embedding failed: {type(exc).__name__}"})

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class names it
            pass  # one line per store would drown everything else

    return Handler


def serve(model: LocalModel, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Serve until interrupted; prints ``listening on http://HOST:PORT/embed`` to stdout once bound."""
    server = ThreadingHTTPServer((host, port), make_handler(ModelService(model)))
    server.daemon_threads = True
    bound_host, bound_port = server.server_address[:2]
    if bound_host not in ("127.0.0.1", "::1", "localhost"):
        log.warning(
            "embed-server is bound to %s: anything that reaches this port can use the model "
            "(there is no authentication)",
            bound_host,
        )
    print(f"listening on http://{bound_host}:{bound_port}/embed", flush=True)
    log.info(
        "embed-server: %s (%d-wide), point stdio servers at CPERSONA_EMBEDDING_MODE=http "
        "CPERSONA_EMBEDDING_URL=http://%s:%d/embed",
        model.name,
        model.dimension,
        bound_host,
        bound_port,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.flush()
