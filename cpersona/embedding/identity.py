"""What produced the vectors: the backend's ``/capabilities`` report (spec EMB-6).

An http-mode request carries only texts; the backend picks the model, so the
model's name never crosses the wire. A backend that can name itself answers
``GET …/capabilities`` with ``{"identity": {...}, "incomplete": [...],
"fingerprint": "<str>" | null}``. A fingerprint is the label stored beside new
vectors. No fingerprint means *unknown*, never *unchanged*: a report carrying
a fingerprint while admitting incomplete components, or carrying neither, is
refused as self-contradictory.

Once learned, a fingerprint is kept through failed asks (a failed ask is
usually a restart, not a model swap) and re-asked sooner than the normal
interval; only a fingerprint the backend reports moves the label.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from cpersona.embedding.validate import EmbeddingResponseError, describe

# The backend can be redeployed under the same URL, so the answer is not kept
# for the life of the process, nor asked before every write.
REFRESH_INTERVAL_SECS = 300.0
# A failed ask while a fingerprint is held is retried this soon.
RETRY_UNKNOWN_SECS = 30.0


@dataclass(frozen=True)
class BackendIdentity:
    fingerprint: str | None
    fields: dict[str, Any] = field(default_factory=dict)
    incomplete: tuple[str, ...] = ()

    @property
    def model(self) -> str | None:
        name = self.fields.get("model")
        return name if isinstance(name, str) and name else None


def parse_capabilities(payload: Any) -> BackendIdentity:
    if not isinstance(payload, dict):
        raise EmbeddingResponseError(f"capability report is {describe(payload)}, expected an object")
    fields = payload.get("identity")
    if not isinstance(fields, dict):
        raise EmbeddingResponseError(f"capability report's identity is {describe(fields)}, expected an object")
    incomplete = payload.get("incomplete", [])
    if not isinstance(incomplete, list) or not all(isinstance(name, str) for name in incomplete):
        raise EmbeddingResponseError("capability report's incomplete is not a list of strings")
    fingerprint = payload.get("fingerprint")
    if fingerprint is not None and (not isinstance(fingerprint, str) or not fingerprint):
        raise EmbeddingResponseError(
            f"capability report's fingerprint is {describe(fingerprint)}, expected a non-empty string or null"
        )
    if fingerprint is not None and incomplete:
        raise EmbeddingResponseError(
            "capability report carries a fingerprint but names components it could not establish"
        )
    if fingerprint is None and not incomplete:
        raise EmbeddingResponseError(
            "capability report carries no fingerprint and names nothing it could not establish"
        )
    return BackendIdentity(fingerprint=fingerprint, fields=dict(fields), incomplete=tuple(incomplete))


class IdentityTracker:
    """The fingerprint learned so far and when to ask again (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked_at: float | None = None
        self._retry_at: float | None = None
        self.fingerprint: str | None = None
        self.reported_model: str | None = None
        self.last_error: str | None = None

    def due(self, now: float) -> bool:
        with self._lock:
            if self._asked_at is None or now - self._asked_at >= REFRESH_INTERVAL_SECS:
                return True
            return self._retry_at is not None and now >= self._retry_at

    def record(self, identity: BackendIdentity | None, error: str | None, now: float) -> str | None:
        """Store one ask's result; returns the fingerprint now in force."""
        with self._lock:
            self._asked_at = now
            self.last_error = error
            if identity is not None:
                self.reported_model = identity.model
            if identity is not None and identity.fingerprint is not None:
                self.fingerprint = identity.fingerprint
                self._retry_at = None
            elif self.fingerprint is not None:
                self._retry_at = now + RETRY_UNKNOWN_SECS
            return self.fingerprint
