"""The remote vector index: search, index, remove and purge beside ``/embed`` (spec EMB-6).

With ``CPERSONA_VECTOR_SEARCH_MODE=remote`` the embedding service also keeps
the vectors and answers the vector search itself. Its routes are siblings of
the configured ``CPERSONA_EMBEDDING_URL`` and exist only when that URL ends in
``/embed`` (``…/search``, ``…/index``, ``…/remove``, ``…/purge``); any other URL
has no remote index, since guessing a path would send rows somewhere nobody
configured. Wire shapes (observed on CPersona 2.6.14, which these must match):

- ``POST …/search`` ``{namespace, query, limit, min_similarity}`` →
  ``{results: [{id: "mem:<n>" | "ep:<n>", score}, ...]}``
- ``POST …/index`` ``{namespace, items: [{id, text}, ...]}`` — the service
  embeds the text itself
- ``POST …/remove`` ``{namespace, ids: [...]}``
- ``POST …/purge`` ``{namespace}``

The namespace is ``cpersona:<agent_id>``: the index knows nothing of projects,
channels, sources or deletions, so an answer is only a list of candidate ids
that the caller must hydrate through its own scope (see
``cpersona.services.records.remote_vectors``).

Same discipline as the embedding client: synchronous, for worker threads,
one attempt per call bounded by its timeout, the body read under a size cap,
and never raising — a 404, a transport error, a timeout or a malformed answer
means "no answer" (search) or "not done" (index, remove, purge), logged with
the endpoint's safe form only.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: a start without embeddings never loads httpx
    import httpx

from cpersona.embedding.client import BadStatus, fetch_capped
from cpersona.embedding.endpoints import redact, safe_endpoint, sibling_url, url_problem
from cpersona.embedding.validate import MAX_VECTORS, EmbeddingResponseError, describe, parse_json_object

log = logging.getLogger(__name__)

DEFAULT_SEARCH_TIMEOUT_SECS = 5.0
DEFAULT_INDEX_TIMEOUT_SECS = 10.0
# A search answer is a list of short ids; anything near this size is not one.
MAX_SEARCH_RESPONSE_BYTES = 8 * 1024 * 1024
MAX_SEARCH_RESULTS = 10_000
INDEX_BATCH = MAX_VECTORS  # items per /index or /remove request
ROUTES = ("search", "index", "remove", "purge")
# What a remote id may name: a memory or an episode by positive row id.
_REF = re.compile(r"(mem|ep):([1-9][0-9]{0,17})")


def namespace(agent_id: str) -> str:
    """The remote namespace of one agent's vectors."""
    return f"cpersona:{agent_id}"


def parse_ref(value: Any) -> tuple[str, int] | None:
    """``("mem" | "ep", id)`` for a well-formed ``mem:<n>`` / ``ep:<n>``, else None."""
    if not isinstance(value, str):
        return None
    match = _REF.fullmatch(value)
    return (match.group(1), int(match.group(2))) if match else None


@dataclass(frozen=True, slots=True)
class RemoteHit:
    kind: str  # "mem" | "ep"
    id: int
    score: float

    @property
    def key(self) -> tuple[str, int]:
        return (self.kind, self.id)


@dataclass(frozen=True)
class RemoteSearch:
    """One search call: the hits in the service's order, or None with the reason."""

    hits: list[RemoteHit] | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.hits is not None


def results_from_search(payload: dict[str, Any]) -> list[RemoteHit]:
    """The answer's hits, checked (raises ``EmbeddingResponseError`` on a broken answer).

    A hit whose id names neither a memory nor an episode is dropped on its own
    (the service may index things this process does not own); a missing or
    non-finite score breaks the whole answer, as nothing can rank it. An id
    listed twice keeps its first score.
    """
    results = payload.get("results")
    if not isinstance(results, list):
        raise EmbeddingResponseError(f"results is {describe(results)}, not a list")
    if len(results) > MAX_SEARCH_RESULTS:
        raise EmbeddingResponseError(f"{len(results)} results, over the {MAX_SEARCH_RESULTS} cap")
    hits: dict[tuple[str, int], RemoteHit] = {}
    for position, item in enumerate(results):
        if not isinstance(item, dict):
            raise EmbeddingResponseError(f"result {position} is {describe(item)}, not an object")
        score = item.get("score")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise EmbeddingResponseError(
                f"result {position} has a score that is {describe(score)}, not a finite number"
            )
        ref = parse_ref(item.get("id"))
        if ref is not None and ref not in hits:
            hits[ref] = RemoteHit(ref[0], ref[1], float(score))
    return list(hits.values())


class RemoteIndex:
    """The four sibling routes of one ``/embed`` URL over a shared ``httpx.Client``."""

    def __init__(
        self,
        *,
        embed_url: str,
        search_timeout_secs: float = DEFAULT_SEARCH_TIMEOUT_SECS,
        index_timeout_secs: float = DEFAULT_INDEX_TIMEOUT_SECS,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        usable = url_problem(embed_url or "", "CPERSONA_EMBEDDING_URL") is None
        self._urls = {route: sibling_url(embed_url, route) if usable else None for route in ROUTES}
        self.search_timeout_secs = _positive(search_timeout_secs, DEFAULT_SEARCH_TIMEOUT_SECS)
        self.index_timeout_secs = _positive(index_timeout_secs, DEFAULT_INDEX_TIMEOUT_SECS)
        import httpx

        self._http = httpx.Client(
            timeout=httpx.Timeout(self.index_timeout_secs), transport=transport, follow_redirects=False
        )
        self._lock = threading.Lock()
        self._last_error: str | None = None

    @property
    def available(self) -> bool:
        """Whether the routes could be derived (the URL ends in ``/embed``)."""
        return self._urls["search"] is not None

    def url(self, route: str) -> str | None:
        return self._urls.get(route)

    @property
    def last_error(self) -> str | None:
        with self._lock:
            return self._last_error

    # ------------------------------------------------------------------ calls

    def search(self, agent_id: str, query: str, limit: int, min_similarity: float) -> RemoteSearch:
        """The service's nearest rows for ``query`` in the agent's namespace."""
        body = {
            "namespace": namespace(agent_id),
            "query": query,
            "limit": int(limit),
            "min_similarity": float(min_similarity),
        }
        url = self._urls["search"]
        if url is None:
            return RemoteSearch(None, "the embedding URL does not end in /embed: no remote search route")
        try:
            raw = fetch_capped(
                self._http, "POST", url, _encode(body), _HEADERS, self.search_timeout_secs, MAX_SEARCH_RESPONSE_BYTES
            )
            hits = results_from_search(parse_json_object(raw))
        except Exception as exc:  # noqa: BLE001 - never raise: the caller falls back to the local scan
            return RemoteSearch(None, self._failed("search", url, exc))
        return RemoteSearch(hits)

    def index(self, agent_id: str, items: Sequence[tuple[str, str]]) -> bool:
        """Push ``(ref, text)`` pairs; True only when every batch was accepted."""
        entries = [{"id": ref, "text": text} for ref, text in items]
        return (
            all(
                self._post("index", {"namespace": namespace(agent_id), "items": entries[start : start + INDEX_BATCH]})
                for start in range(0, len(entries), INDEX_BATCH)
            )
            if entries
            else True
        )

    def remove(self, agent_id: str, refs: Sequence[str]) -> bool:
        """Drop ``refs`` from the agent's namespace; True when the service accepted it."""
        ids = list(refs)
        return (
            all(
                self._post("remove", {"namespace": namespace(agent_id), "ids": ids[start : start + INDEX_BATCH]})
                for start in range(0, len(ids), INDEX_BATCH)
            )
            if ids
            else True
        )

    def purge(self, agent_id: str) -> bool:
        """Drop the agent's whole namespace."""
        return self._post("purge", {"namespace": namespace(agent_id)})

    def close(self) -> None:
        self._http.close()

    # -------------------------------------------------------------- internals

    def _post(self, route: str, body: dict[str, Any]) -> bool:
        url = self._urls[route]
        if url is None:
            return False
        try:
            # The answer's content is not used; the cap still bounds what is read.
            fetch_capped(
                self._http, "POST", url, _encode(body), _HEADERS, self.index_timeout_secs, MAX_SEARCH_RESPONSE_BYTES
            )
        except Exception as exc:  # noqa: BLE001 - tolerated (EMB-6): the row stays stored either way
            self._failed(route, url, exc)
            return False
        return True

    def _failed(self, route: str, url: str, exc: BaseException) -> str:
        import httpx

        known = (BadStatus, EmbeddingResponseError, httpx.HTTPError, httpx.InvalidURL)
        if not isinstance(exc, known):
            log.exception("Unexpected error in the remote vector index client")
        kind = "HTTPStatusError" if isinstance(exc, BadStatus) else type(exc).__name__
        evidence = f"remote {route}: POST {safe_endpoint(url)} failed: {kind}: {redact(str(exc) or repr(exc), url)}"
        if isinstance(exc, BadStatus) and exc.status == 404:
            evidence += " (the service has no such route)"
        log.warning("%s", evidence)
        with self._lock:
            self._last_error = evidence
        return evidence


_HEADERS = {"Content-Type": "application/json"}


def _encode(body: dict[str, Any]) -> bytes:
    # ensure_ascii: a lone surrogate is escaped instead of failing to encode.
    return json.dumps(body, ensure_ascii=True).encode("ascii")


def _positive(value: Any, default: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    return number if number > 0 and math.isfinite(number) else default


def build_remote_index(
    settings: Any, embedder: Any, *, transport: httpx.BaseTransport | None = None
) -> RemoteIndex | None:
    """The remote index the settings ask for, or None.

    Only ``remote`` vector mode over an ``http`` embedder has one: the routes
    are siblings of ``CPERSONA_EMBEDDING_URL``, which the ``api`` provider
    does not use. A URL not ending in ``/embed`` yields no index at all, so
    the local scan keeps serving.
    """
    if getattr(settings, "vector_search_mode", "local") != "remote" or embedder is None:
        return None
    if getattr(embedder, "mode", None) != "http":
        return None
    index = RemoteIndex(
        embed_url=getattr(embedder, "url", ""),
        search_timeout_secs=getattr(settings, "remote_search_timeout_secs", DEFAULT_SEARCH_TIMEOUT_SECS),
        index_timeout_secs=getattr(settings, "remote_index_timeout_secs", DEFAULT_INDEX_TIMEOUT_SECS),
        transport=transport,
    )
    if not index.available:
        log.warning(
            "CPERSONA_VECTOR_SEARCH_MODE=remote, but %s does not end in /embed: no remote index "
            "routes can be derived, vector search stays local",
            safe_endpoint(getattr(embedder, "url", "")),
        )
        index.close()
        return None
    return index
