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


class TokenReporter:
    """Asks the backend's count_tokens route; never raises (a failure is "unknown")."""

    def __init__(self, url: str, *, timeout_secs: float, transport: httpx.BaseTransport | None = None) -> None:
        self.url = url
        self.timeout_secs = timeout_secs
        import httpx

        self._http = httpx.Client(timeout=httpx.Timeout(timeout_secs), transport=transport, follow_redirects=False)

    def report(self, texts: Sequence[str]) -> list[TokenInfo] | None:
        """One entry per text, or None when the answer is unknown."""
        if not texts or len(texts) > MAX_TEXTS:
            return None
        try:
            body = self._post({"texts": list(texts)})
        except Exception as exc:  # noqa: BLE001 — unknown, whatever went wrong
            log.info("token report from %s unavailable: %s: %s", safe_endpoint(self.url), type(exc).__name__, exc)
            return None
        info = body.get("token_info") if isinstance(body, dict) else None
        if not isinstance(info, list) or len(info) != len(texts):
            return None
        entries = [parse_entry(entry, text) for entry, text in zip(info, texts)]
        if any(entry is None for entry in entries):
            log.warning("token report from %s breaks the contract; treated as unknown", safe_endpoint(self.url))
            return None
        return entries  # type: ignore[return-value]

    def measure(self, text: str) -> TokenInfo | None:
        found = self.report([text])
        return None if found is None else found[0]

    def _post(self, payload: dict[str, Any]) -> Any:
        deadline = time.monotonic() + self.timeout_secs
        data = json.dumps(payload, ensure_ascii=True).encode("ascii")
        headers = {"Content-Type": "application/json"}
        with self._http.stream("POST", self.url, content=data, headers=headers) as response:
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
