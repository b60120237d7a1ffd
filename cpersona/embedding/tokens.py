"""The token report of an ``http`` embedding backend (spec associations §6.1, OV-1).

``POST <the /embed URL with its last segment replaced by count_tokens>`` with
``{"texts": [...]}`` answers, per text, how many tokens it holds, the model's
window, whether the text runs past it, and the character where the window
closes. Record nodes are cut from these answers, so each entry is checked
before use; any other shape, a non-2xx status, a transport failure or
``token_info: null`` means *unknown*, which callers must never read as "fits".

In ``local`` mode the in-process tokenizer gives the same report. In
``none`` and ``api`` modes, and for a URL not ending in ``/embed``, there
is no report at all (no request is made).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: a start without embeddings never loads httpx
    import httpx

from cpersona.embedding.endpoints import safe_endpoint, sibling_url

log = logging.getLogger(__name__)

MAX_REPORT_BYTES = 4 * 1024 * 1024  # a report is a few numbers per text
MAX_TEXTS = 512
# A backend that answered 404 (it has no count_tokens route) is asked again only after
# this long: until then its answer is "unknown" without a request. Every store asks
# before its write, so without this a backend without the route cost each store a
# second round trip to learn the same 404 (~1 ms CPU in httpx, a new connection each
# time, at 1M rows with the bench's stub embedder). A row stored meanwhile that runs
# past the window gets its nodes from check_health's missing_nodes repair (OV-6).
ABSENT_RECHECK_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """One text's report: ``text[:window_end_char]`` is what the model would embed."""

    count: int
    window: int
    truncated: bool
    window_end_char: int


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_entry(entry: Any, text: str) -> TokenInfo | None:
    """OV-1's checks on one entry; None when the entry breaks the contract."""
    if not isinstance(entry, dict):
        return None
    count, window, truncated, end = (entry.get(k) for k in ("count", "window", "truncated", "window_end_char"))
    if not (_is_int(count) and count >= 0 and _is_int(window) and window >= 1 and isinstance(truncated, bool)):
        return None
    if not (_is_int(end) and 0 <= end <= len(text)):
        return None
    if truncated != (count > window) or (not truncated and end != len(text)):
        return None
    return TokenInfo(count, window, truncated, end)


class _RouteMissing(Exception):
    """The backend answered 404: it has no token report."""


class TokenReporter:
    """Asks the backend's count_tokens route; never raises (a failure is "unknown")."""

    def __init__(self, url: str, *, timeout_secs: float, transport: httpx.BaseTransport | None = None) -> None:
        self.url = url
        self.timeout_secs = timeout_secs
        import httpx

        self._http = httpx.Client(timeout=httpx.Timeout(timeout_secs), transport=transport, follow_redirects=False)
        self._absent_until = 0.0  # time.monotonic() before which the route is taken to be missing

    def report(self, texts: Sequence[str]) -> list[TokenInfo] | None:
        """One entry per text, or None when the answer is unknown."""
        if not texts or len(texts) > MAX_TEXTS:
            return None
        if self._absent_until and time.monotonic() < self._absent_until:
            return None
        try:
            body = self._post({"texts": list(texts)})
        except _RouteMissing:
            if not self._absent_until:
                log.info("token report from %s unavailable: no such route (404)", safe_endpoint(self.url))
            self._absent_until = time.monotonic() + ABSENT_RECHECK_SECONDS
            return None
        except Exception as exc:  # noqa: BLE001 — unknown, whatever went wrong
            log.info("token report from %s unavailable: %s: %s", safe_endpoint(self.url), type(exc).__name__, exc)
            return None
        self._absent_until = 0.0
        info = body.get("token_info") if isinstance(body, dict) else None
        if not isinstance(info, list) or len(info) != len(texts):
            return None
        entries = [parse_entry(entry, text) for entry, text in zip(info, texts)]
        if any(entry is None for entry in entries):
            log.warning("token report from %s breaks the contract; treated as unknown", safe_endpoint(self.url))
            return None
        return entries  # type: ignore[return-value]

    def asks(self) -> bool:
        """Whether a report now would be a network request (False while the route is known missing)."""
        return not (self._absent_until and time.monotonic() < self._absent_until)

    def measure(self, text: str) -> TokenInfo | None:
        found = self.report([text])
        return None if found is None else found[0]

    def _post(self, payload: dict[str, Any]) -> Any:
        deadline = time.monotonic() + self.timeout_secs
        data = json.dumps(payload, ensure_ascii=True).encode("ascii")
        headers = {"Content-Type": "application/json"}
        with self._http.stream("POST", self.url, content=data, headers=headers) as response:
            if response.status_code == 404:
                raise _RouteMissing()
            if not response.is_success:
                import httpx

                raise httpx.HTTPStatusError(
                    f"status {response.status_code}", request=response.request, response=response
                )
            chunks, received = [], 0
            for chunk in response.iter_bytes():
                received += len(chunk)
                if received > MAX_REPORT_BYTES or time.monotonic() > deadline:
                    raise ValueError("token report too large or too slow")
                chunks.append(chunk)
        return json.loads(b"".join(chunks))

    def close(self) -> None:
        self._http.close()


def build_token_reporter(embedder: Any, *, transport: httpx.BaseTransport | None = None) -> TokenReporter | None:
    """The reporter for ``embedder``, or None when its mode or URL has no token report (OV-1).

    A local model answers from its own tokenizer (``LocalEmbedder.token_reporter``).
    """
    own = getattr(embedder, "token_reporter", None)
    if callable(own):
        return own()
    if embedder is None or getattr(embedder, "mode", None) != "http":
        return None
    url = sibling_url(getattr(embedder, "url", "") or "", "count_tokens")
    if url is None:
        return None
    return TokenReporter(url, timeout_secs=float(getattr(embedder, "timeout_secs", 30.0)), transport=transport)
