"""The embedding client: turns texts into vectors over HTTP (spec §5.5, EMB-1..7).

Two providers share one client:

- ``http``: ``POST <CPERSONA_EMBEDDING_URL> {"texts": [...]}`` →
  ``{"embeddings": [[...], ...]}`` in input order, vectors kept as given.
- ``api`` (OpenAI-compatible): ``POST <CPERSONA_EMBEDDING_API_URL>
  {"model", "input": [...]}`` with a Bearer key → ``{"data": [{"index",
  "embedding"}, ...]}``, placed by index and L2-normalised.

A third provider, ``local``, runs the model in this process
(``cpersona.embedding.local.LocalEmbedder``, a subclass that replaces the
request with a forward pass and keeps everything else here).

Mode ``none`` has no client at all (``build_embedder`` returns None) and so
never contacts anything (EMB-7).

Every method is synchronous and meant for worker threads, never the event
loop. None of them raises: any failure — transport error, timeout, non-2xx,
a body that breaks the contract — yields "no vector" and an ``EmbedOutcome``
saying why, because callers degrade (store without a vector, recall without
the vector arm) rather than fail. Each request is a single attempt bounded by
the configured timeout; there are no retries.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from cpersona.embedding.cache import EmbeddingCache
from cpersona.embedding.endpoints import redact, safe_endpoint, sibling_url, url_problem
from cpersona.embedding.identity import BackendIdentity, IdentityTracker, parse_capabilities
from cpersona.embedding.validate import (
    MAX_RESPONSE_BYTES,
    MAX_VECTORS,
    EmbeddingResponseError,
    check_width,
    parse_json_object,
    vectors_from_api,
    vectors_from_http,
)
from cpersona.embedding.vectors import FLOAT32, l2_normalised

if TYPE_CHECKING:
    import httpx
    import numpy as np  # imported where a vector is made (see cpersona.embedding.vectors)

log = logging.getLogger(__name__)

MODES = ("none", "http", "api", "local")
DEFAULT_API_URL = "https://api.openai.com/v1/embeddings"
DEFAULT_MODEL = "text-embedding-3-small"
DEFAULT_TIMEOUT_SECS = 30.0
# Health probes and the startup identity ask must not hold anything up for long
# (spec T-7: identity probed within 3 s).
PROBE_TIMEOUT_SECS = 3.0
PROBE_TEXT = "test"


@dataclass(frozen=True)
class EmbedOutcome:
    """What one embedding call did — the evidence the degraded advisory reads (§5.17).

    ``attempted`` is true when a request was issued. A failure with
    ``attempted`` false could not be issued at all (a configuration fault:
    no URL, unusable URL); with ``attempted`` true the backend was unreachable
    or answered badly. A cache hit is ``ok`` but neither attempted nor an
    observation of the backend's health (ADV-2).
    """

    ok: bool
    attempted: bool
    from_cache: bool = False
    error: str | None = None

    @property
    def misconfigured(self) -> bool:
        return not self.ok and not self.attempted and self.error is not None


@dataclass(frozen=True)
class QueryEmbedding:
    """One text's vector (float32, read-only), its stored blob, and the outcome."""

    vector: np.ndarray | None
    blob: bytes | None
    outcome: EmbedOutcome


@dataclass(frozen=True)
class EmbedderHealth:
    """A snapshot of every request this client issued or could not issue.

    It counts store-time calls too; the advisory's fault latch must be driven
    by the recall query's own ``EmbedOutcome`` (ADV-2), not by this.
    """

    mode: str
    endpoint: str
    dimension: int | None
    requests: int
    consecutive_failures: int
    last_success_at: datetime | None
    last_failure_at: datetime | None
    last_error: str | None
    last_failure_attempted: bool | None
    cache_hits: int
    cache_misses: int


class _NotIssued(Exception):
    """No request could be sent (configuration fault)."""


class NotReady(Exception):
    """The backend exists but cannot answer yet (a local model still being fetched)."""


class BadStatus(Exception):
    """The endpoint answered with a non-2xx status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}".strip())
        self.status = status


class Embedder:
    """An ``http`` or ``api`` embedding provider over one shared ``httpx.Client``."""

    SERVED_MODES = ("http", "api")
    USES_HTTP = True  # a subclass that computes vectors itself needs no connection pool

    def __init__(
        self,
        *,
        mode: str,
        url: str,
        model: str = DEFAULT_MODEL,
        api_key: str = "",
        model_configured: bool = False,
        timeout_secs: float = DEFAULT_TIMEOUT_SECS,
        cache_size: int = 256,
        cache_ttl: float = 300.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if mode not in self.SERVED_MODES:
            raise ValueError(f"{type(self).__name__} serves mode {' or '.join(self.SERVED_MODES)}, not {mode!r}")
        self.mode = mode
        self.url = url or ""
        self.model = model or DEFAULT_MODEL
        self._api_key = api_key or ""
        self._model_configured = bool(model_configured)
        self.timeout_secs = float(timeout_secs) if timeout_secs and timeout_secs > 0 else DEFAULT_TIMEOUT_SECS
        self._max_response_bytes = int(max_response_bytes)
        self._cache = EmbeddingCache(cache_size, cache_ttl, clock)
        self._clock = clock
        variable = "CPERSONA_EMBEDDING_URL" if mode == "http" else "CPERSONA_EMBEDDING_API_URL"
        self._config_problem = url_problem(self.url, variable)
        self._capabilities_url = sibling_url(self.url, "capabilities") if mode == "http" else None
        self._identity = IdentityTracker()
        import httpx  # here, not at the top: a start without embeddings never loads it

        self._http = (
            httpx.Client(
                timeout=httpx.Timeout(self.timeout_secs),
                transport=transport,
                follow_redirects=False,
            )
            if self.USES_HTTP
            else None
        )
        self._lock = threading.Lock()  # guards dimension and the health counters
        self._dimension: int | None = None
        self._requests = 0
        self._consecutive_failures = 0
        self._last_success_at: datetime | None = None
        self._last_failure_at: datetime | None = None
        self._last_error: str | None = None
        self._last_failure_attempted: bool | None = None

    # ------------------------------------------------------------------ reads

    @property
    def endpoint(self) -> str:
        """The configured URL without userinfo or query, fit for messages."""
        return safe_endpoint(self.url)

    @property
    def dimension(self) -> int | None:
        """Width of the first accepted response; None until one arrives."""
        with self._lock:
            return self._dimension

    @property
    def model_label(self) -> str:
        """The label stored beside new vectors (spec storage §6.4).

        The backend's fingerprint when it reported one, else the model name
        this process can vouch for — in api mode the model it sends, in http
        mode only an explicitly configured one — else '' (unknown).
        """
        if self.mode == "http" and self._identity.fingerprint:
            return self._identity.fingerprint
        if self.mode == "api" or self._model_configured:
            return self.model
        return ""

    @property
    def backend_model(self) -> str | None:
        """The model name the backend gave in its last capability report."""
        return self._identity.reported_model

    @property
    def health(self) -> EmbedderHealth:
        with self._lock:
            return EmbedderHealth(
                mode=self.mode,
                endpoint=self.endpoint,
                dimension=self._dimension,
                requests=self._requests,
                consecutive_failures=self._consecutive_failures,
                last_success_at=self._last_success_at,
                last_failure_at=self._last_failure_at,
                last_error=self._last_error,
                last_failure_attempted=self._last_failure_attempted,
                cache_hits=self._cache.hits,
                cache_misses=self._cache.misses,
            )

    # -------------------------------------------------------------- embedding

    def embed(self, text: str) -> bytes | None:
        """One text as a little-endian float32 blob, or None. Cached (EMB-4)."""
        return self.embed_query(text).blob

    def embed_vector(self, text: str) -> np.ndarray | None:
        """One text as a float32 vector, or None. Cached (EMB-4)."""
        return self.embed_query(text).vector

    def embed_query(self, text: str) -> QueryEmbedding:
        """One text with the outcome the advisory needs (cache hit, attempted, error)."""
        if not isinstance(text, str):
            return QueryEmbedding(None, None, EmbedOutcome(False, False, error="text is not a string"))
        return self._cached_query(text, [text], lambda vectors: vectors[0])

    def embed_query_sum(self, texts: Sequence[str], weights: Sequence[float] | None = None) -> QueryEmbedding:
        """The unit-length weighted sum of the texts' unit query vectors, from ONE request (issue 14).

        A recall embeds its query as asked and without the scope's speaker names
        (services/recall/nameless.py); both go in one request so the second costs
        no round trip. ``weights`` (one per text, default all 1) scale each unit
        vector before the sum. Cached under the texts joined by NUL, which no text
        holds, and the weights when any is not 1. One text is :meth:`embed_query`.
        """
        if len(texts) == 1:
            return self.embed_query(texts[0])
        if not texts or not all(isinstance(text, str) for text in texts):
            return QueryEmbedding(None, None, EmbedOutcome(False, False, error="text is not a string"))
        scale = tuple(float(w) for w in weights) if weights is not None else (1.0,) * len(texts)
        if len(scale) != len(texts):
            return QueryEmbedding(None, None, EmbedOutcome(False, False, error="one weight per text"))
        key = "\x00".join(texts)
        if any(w != 1.0 for w in scale):
            key += "\x00" + ",".join(repr(w) for w in scale)  # a weighted sum is another vector
        return self._cached_query(key, list(texts), lambda vectors: _unit_sum(vectors, scale))

    def _cached_query(self, key: str, texts: list[str], combine: Callable[[list[Any]], Any]) -> QueryEmbedding:
        """The cache entry under ``key``, else ``combine`` of the texts' vectors from one request, cached."""
        import numpy as np

        cached = self._cache.get(key)
        if cached is not None:
            vector = np.frombuffer(cached, dtype=FLOAT32)
            return QueryEmbedding(vector, cached, EmbedOutcome(True, False, from_cache=True))
        vectors, outcome = self._call(texts, self.timeout_secs, query=True)
        if vectors is None:
            return QueryEmbedding(None, None, outcome)
        blob = combine(vectors).tobytes()
        self._cache.put(key, blob)
        return QueryEmbedding(np.frombuffer(blob, dtype=FLOAT32), blob, outcome)

    def embed_many(self, texts: Sequence[str], batch_size: int = MAX_VECTORS) -> list[bytes | None]:
        """Blobs aligned with ``texts`` (None where no vector), ≤ 512 texts per request.

        Not cached. After the first failed request the remaining batches are not
        sent: a backend that just failed or timed out would most likely do it
        again, and each try would cost a full timeout.
        """
        size = min(max(1, int(batch_size)), MAX_VECTORS)
        results: list[bytes | None] = [None] * len(texts)
        positions = [i for i, text in enumerate(texts) if isinstance(text, str)]
        for start in range(0, len(positions), size):
            batch = positions[start : start + size]
            vectors, _ = self._call([texts[i] for i in batch], self.timeout_secs)
            if vectors is None:
                break
            for position, vector in zip(batch, vectors):
                results[position] = vector.tobytes()
        return results

    # ----------------------------------------------------------------- health

    def probe_outcome(self, timeout_secs: float = PROBE_TIMEOUT_SECS) -> EmbedOutcome:
        """Embed the probe text once, bypassing the cache, with a short timeout."""
        _, outcome = self._call([PROBE_TEXT], min(timeout_secs, self.timeout_secs))
        return outcome

    def probe(self, timeout_secs: float = PROBE_TIMEOUT_SECS) -> bool:
        """Whether the backend answers with a valid vector right now."""
        return self.probe_outcome(timeout_secs).ok

    def refresh_identity(self, timeout_secs: float = PROBE_TIMEOUT_SECS, *, force: bool = False) -> str | None:
        """Ask ``GET …/capabilities`` when due (or forced); return the fingerprint in force.

        Only http mode with a URL ending in ``/embed`` has the route; a 404 or
        any failure is tolerated and keeps what was learned before (EMB-6).
        """
        if self.mode != "http":
            return None
        now = time.monotonic()
        if not force and not self._identity.due(now):
            return self._identity.fingerprint
        identity, error = self._ask_capabilities(min(timeout_secs, self.timeout_secs))
        if error:
            log.info("Embedding backend identity unknown: %s", error)
        return self._identity.record(identity, error, now)

    def label_for_write(self) -> str:
        """``model_label`` after refreshing the backend identity if it is due."""
        self.refresh_identity()
        return self.model_label

    def close(self) -> None:
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -------------------------------------------------------------- internals

    def _request_spec(self, texts: list[str]) -> tuple[bytes, dict[str, str]]:
        if self.mode == "http":
            body: dict[str, Any] = {"texts": texts}
        else:
            body = {"model": self.model, "input": texts}
        headers = {"Content-Type": "application/json"}
        if self.mode == "api" and self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        # ensure_ascii: a lone surrogate is escaped instead of failing to encode.
        return json.dumps(body, ensure_ascii=True).encode("ascii"), headers

    def _call(
        self, texts: list[str], timeout: float, *, query: bool = False
    ) -> tuple[list[np.ndarray] | None, EmbedOutcome]:
        """One request for ``texts``: validated float32 vectors, or None and why.

        ``query`` marks a recall query; only a local model treats it differently
        (some models expect a prefix on queries that stored passages do not get).
        """
        attempted = False
        try:
            if self._config_problem:
                raise _NotIssued(self._config_problem)
            attempted = True
            vectors = self._vectors(texts, timeout, query)
            with self._lock:
                width = check_width(vectors, self._dimension)
                if self._dimension is None:
                    self._dimension = width
            accepted = [vector.astype(FLOAT32) for vector in vectors]
        except Exception as exc:  # never raise: every failure means "no vector"
            import httpx

            attempted = attempted and not isinstance(exc, _NotIssued)
            evidence = self._evidence("POST", self.url, exc)
            if not isinstance(
                exc, (_NotIssued, NotReady, BadStatus, EmbeddingResponseError, httpx.HTTPError, httpx.InvalidURL)
            ):
                log.exception("Unexpected error in the embedding client")
            log.warning("Embedding request failed: %s", evidence)
            self._record(ok=False, attempted=attempted, error=evidence)
            return None, EmbedOutcome(False, attempted, error=evidence)
        self._record(ok=True, attempted=True, error=None)
        return accepted, EmbedOutcome(True, True)

    def _vectors(self, texts: list[str], timeout: float, query: bool) -> list[np.ndarray]:
        """The contract-checked vectors of one POST (the part a local model replaces)."""
        body, headers = self._request_spec(texts)
        payload = parse_json_object(self._fetch("POST", self.url, body, headers, timeout))
        if self.mode == "http":
            return vectors_from_http(payload, len(texts))
        return vectors_from_api(payload, len(texts))

    def _fetch(self, method: str, url: str, body: bytes | None, headers: dict[str, str], timeout: float) -> bytes:
        return fetch_capped(self._http, method, url, body, headers, timeout, self._max_response_bytes)

    def _ask_capabilities(self, timeout: float) -> tuple[BackendIdentity | None, str | None]:
        if self._config_problem:
            return None, f"mode=http / GET {self.endpoint} failed: {self._config_problem}"
        if self._capabilities_url is None:
            return None, (
                f"mode=http / {self.endpoint} does not end in /embed, so the capability route cannot be derived from it"
            )
        url = self._capabilities_url
        try:
            raw = self._fetch("GET", url, None, {}, timeout)
            return parse_capabilities(parse_json_object(raw)), None
        except Exception as exc:  # noqa: BLE001 - tolerated: the route is optional (EMB-6)
            evidence = self._evidence("GET", url, exc)
            if isinstance(exc, BadStatus) and exc.status == 404:
                evidence += " (the server predates the capability report)"
            return None, evidence

    def _evidence(self, method: str, url: str, exc: BaseException) -> str:
        """``mode=<m> / <METHOD> <safe url> failed: <Type>: <detail>`` (spec ADV-4)."""
        if isinstance(exc, _NotIssued):
            return f"mode={self.mode} / {method} {safe_endpoint(url)} failed: {exc}"
        kind = "HTTPStatusError" if isinstance(exc, BadStatus) else type(exc).__name__
        detail = redact(str(exc) or repr(exc), url, _normalised(url))
        return f"mode={self.mode} / {method} {safe_endpoint(url)} failed: {kind}: {detail}"

    def _record(self, *, ok: bool, attempted: bool, error: str | None) -> None:
        now = datetime.now(timezone.utc)
        with self._lock:
            if attempted:
                self._requests += 1
            if ok:
                self._consecutive_failures = 0
                self._last_success_at = now
            else:
                self._consecutive_failures += 1
                self._last_failure_at = now
                self._last_error = error
                self._last_failure_attempted = attempted


def fetch_capped(
    http: httpx.Client,
    method: str,
    url: str,
    body: bytes | None,
    headers: dict[str, str],
    timeout: float,
    cap: int = MAX_RESPONSE_BYTES,
) -> bytes:
    """The 2xx body, read under the size cap and the overall deadline.

    httpx's timeout bounds each network wait; the deadline check between
    chunks stops a backend that drips a body slowly from stretching one
    request far past the timeout. A non-2xx answer raises ``BadStatus``.
    """
    import httpx

    deadline = time.monotonic() + timeout
    with http.stream(method, url, content=body, headers=headers, timeout=timeout) as response:
        if not response.is_success:
            raise BadStatus(response.status_code, response.reason_phrase)
        declared = response.headers.get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > cap:
            raise EmbeddingResponseError(f"response declares {int(declared)} bytes, over the {cap}-byte cap")
        chunks: list[bytes] = []
        received = 0
        for chunk in response.iter_bytes():
            received += len(chunk)
            if received > cap:
                raise EmbeddingResponseError(f"response body runs past the {cap}-byte cap")
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout("response took longer than the timeout")
            chunks.append(chunk)
        return b"".join(chunks)


def _normalised(url: str) -> str:
    """httpx's own spelling of ``url``, which its exception texts quote."""
    import httpx

    try:
        return str(httpx.URL(url))
    except Exception:  # noqa: BLE001 - an unparsable URL has no other spelling to hide
        return ""


def _setting(settings: Any, name: str, default: Any) -> Any:
    value = getattr(settings, name, default)
    # pydantic SecretStr and friends
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    return default if value is None else value


def build_embedder(settings: Any, *, transport: httpx.BaseTransport | None = None) -> Embedder | None:
    """The client the settings ask for, or None for mode ``none`` (EMB-7).

    An unsupported mode raises ``ValueError`` (the server refuses to start);
    a missing or unusable URL does not — the client is built and every call
    reports the configuration fault, so recall can say so (ADV-2 misconfigured).
    """
    mode = str(_setting(settings, "embedding_mode", "none")).strip().lower()
    if mode == "none":
        return None
    if mode not in MODES:
        raise ValueError(f"CPERSONA_EMBEDDING_MODE={mode} is not supported; expected one of {', '.join(MODES)}")
    if mode == "local":
        from cpersona.embedding.local import build_local_embedder  # onnxruntime only when asked for

        return build_local_embedder(settings)
    model = str(_setting(settings, "embedding_model", DEFAULT_MODEL)) or DEFAULT_MODEL
    fields_set = getattr(settings, "model_fields_set", set())
    configured = getattr(settings, "embedding_model_configured", None)
    model_configured = bool(configured) if configured is not None else "embedding_model" in fields_set
    if mode == "http":
        url = str(_setting(settings, "embedding_url", ""))
    else:
        url = str(_setting(settings, "embedding_api_url", DEFAULT_API_URL)) or DEFAULT_API_URL
    return Embedder(
        mode=mode,
        url=url,
        model=model,
        api_key=str(_setting(settings, "embedding_api_key", "")),
        model_configured=model_configured,
        timeout_secs=float(_setting(settings, "embedding_timeout_secs", DEFAULT_TIMEOUT_SECS)),
        cache_size=int(_setting(settings, "embedding_cache_size", 256)),
        cache_ttl=float(_setting(settings, "embedding_cache_ttl", 300)),
        transport=transport,
    )


def _unit_sum(vectors: list[Any], weights: Sequence[float]) -> Any:
    """The unit-length sum of the vectors' unit vectors, each times its weight, as float32."""
    return l2_normalised(sum(w * l2_normalised(vector) for w, vector in zip(weights, vectors))).astype(FLOAT32)
