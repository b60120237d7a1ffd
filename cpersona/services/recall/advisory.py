"""The degraded advisory: telling the agent, once, that recall lost its vector channel (spec §5.17).

Two ways recall can be degraded:

- **hint** — mode ``none``: no embedding backend is configured at all, so
  recall is keyword/FTS-only by design (ADV-1). Static; no network involved.
- **fault** — mode ``http``/``api`` and the backend stopped answering. The
  measurement is the recall's own query embedding (ADV-2): a call that reached
  the backend and got a vector means healthy; two failures in a row latch the
  fault. One failure alone changes nothing visible (a blip is not an outage),
  a cache hit observes nothing, and store-time failures are not observations
  (a store answers ``embedded:false`` itself, and the row is repaired later by
  :mod:`cpersona.services.records.backfill`).

The notice is relayed to the user, so it is delivered in full once per
degradation episode and audience, then as a one-line reminder (ADV-6).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from cpersona.services.app import App

ADVISORY_SESSIONS = 256  # sessions remembered as "already told" (spec ADV-6)
KEYLESS = ""  # the advisory / pause bucket of callers that declare no session_key
FAULT_AFTER = 2  # consecutive failed query embeddings that latch the fault (ADV-2)
HINT_EPISODE = 0  # the standing mode-none hint; fault episodes count from 1

_HINT_REASON = "embeddings disabled (mode=none); recall is keyword/FTS-only"
_HINT_EVIDENCE = "mode=none / no embedding backend configured"
_HINT_RUNBOOK = (
    "Please tell the user: memory search is running without an embedding backend "
    "(CPERSONA_EMBEDDING_MODE=none), so recall matches keywords and substrings only. "
    "Memories worded differently from the question, and older ones, can be missed.\n\n"
    "To search by meaning, run an embedding server that speaks the CPersona embedding "
    'contract (POST {"texts": [...]} -> {"embeddings": [...]}), then set '
    "CPERSONA_EMBEDDING_MODE=http and CPERSONA_EMBEDDING_URL to its /embed endpoint "
    "(or CPERSONA_EMBEDDING_MODE=api for an OpenAI-compatible service) and restart.\n\n"
    'In plain words for the user: "I can only find memories by their exact words right '
    'now; with an embedding service I could also find them by meaning."\n\n'
    "Setting CPERSONA_DEGRADED_ADVISORY=false stops this notice; it does not turn "
    "semantic search on."
)
_HINT_REMINDER = f"Reminder: keyword-only recall ({_HINT_EVIDENCE})."

_FAULT_REASON = {
    "unreachable": "embedding endpoint unreachable; recall fell back to keyword/FTS-only",
    "misconfigured": "embedding endpoint never contacted (configuration problem); recall fell back to keyword/FTS-only",
}
_FAULT_INVESTIGATE = (
    "What to check: is the embedding server process running; is its port reachable from "
    'this machine; does the URL answer a POST of {{"texts": ["test"]}} by hand ({endpoint}); '
    "has the server finished downloading or loading its model?"
)
_FAULT_RECONFIGURE = (
    "No request could be sent, so this is a configuration problem, not an outage: set "
    "CPERSONA_EMBEDDING_URL (mode http) or CPERSONA_EMBEDDING_API_URL and "
    "CPERSONA_EMBEDDING_API_KEY (mode api) to a usable http(s) address and restart the server."
)


def _fault_runbook(kind: str, evidence: str, endpoint: str) -> str:
    steps = _FAULT_RECONFIGURE if kind == "misconfigured" else _FAULT_INVESTIGATE.format(endpoint=endpoint)
    return (
        "Please tell the user: the embedding service behind memory search is not answering, "
        "so recall is running on keywords and substrings only.\n\n"
        f"Measured: {evidence}\n\n"
        "Impact: memories worded differently from the question, and older ones, can be "
        "missed until the service is back. Nothing is lost: memories stored meanwhile are "
        "kept and receive their vectors once the service answers again.\n\n"
        f"{steps}\n\n"
        'In plain words for the user: "My memory search can only match exact words right '
        'now because the service that understands meaning is down."\n\n'
        "Setting CPERSONA_DEGRADED_ADVISORY=false stops this notice; it does not repair "
        "semantic search."
    )


# -- embedding health (ADV-2) --------------------------------------------------------


@dataclass
class EmbeddingHealth:
    """Process-wide embedding health as recall's own query embeddings measured it."""

    state: str = "unknown"  # unknown | healthy | fault
    failures: int = 0  # consecutive failed query embeddings
    kind: str | None = None  # while failing: "unreachable" or "misconfigured"
    evidence: str | None = None  # the last failure, as the client described it
    episode: int = HINT_EPISODE  # bumped each time a new fault is latched
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe(self, outcome: Any) -> bool:
        """Record one query embedding's outcome; True when it ended a failure streak.

        ``outcome`` is an :class:`~cpersona.embedding.client.EmbedOutcome`.
        """
        if getattr(outcome, "from_cache", False):
            return False  # a cache hit says nothing about the backend now
        with self._lock:
            if outcome.ok:
                recovered = self.failures > 0 or self.state == "fault"
                self.state, self.failures, self.kind, self.evidence = "healthy", 0, None, None
                return recovered
            self.failures += 1
            self.kind = "unreachable" if outcome.attempted else "misconfigured"
            self.evidence = outcome.error or "the embedding call produced no vector"
            if self.failures >= FAULT_AFTER and self.state != "fault":
                self.state = "fault"
                self.episode += 1  # a new episode of degradation re-arms everyone
            return False

    def snapshot(self) -> tuple[str, str | None, str | None, int]:
        with self._lock:
            return self.state, self.kind, self.evidence, self.episode


# -- who has been told ---------------------------------------------------------------


@dataclass
class AdvisoryMemory:
    """Who has already been given the full notice in the current degradation episode."""

    episode: int = HINT_EPISODE
    sessions: OrderedDict[str, None] = field(default_factory=OrderedDict)
    keyless_told: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def first_time(self, episode: int, session_key: str) -> bool:
        with self._lock:
            if episode != self.episode:  # a new episode of degradation re-arms everyone
                self.episode, self.sessions, self.keyless_told = episode, OrderedDict(), False
            if session_key == KEYLESS:
                told, self.keyless_told = self.keyless_told, True
                return not told
            if session_key in self.sessions:
                self.sessions.move_to_end(session_key)
                return False
            self.sessions[session_key] = None
            while len(self.sessions) > ADVISORY_SESSIONS:
                self.sessions.popitem(last=False)
            return True


def session_bucket(session_key: str) -> str:
    """spec SH-2: absent, blank or the literal ``transport`` all mean keyless."""
    key = session_key.strip()
    return KEYLESS if key in ("", "transport") else key


def advisory(app: App, session_key: str) -> dict[str, Any] | None:
    """The notice that recall is degraded, while it is (spec §5.17), else None.

    Call it after the recall's query embedding was observed, so the recall
    that latches a fault already carries the notice.
    """
    settings = app.settings
    if not settings.degraded_advisory:
        return None  # ADV-3
    if settings.embedding_mode == "none":
        severity, episode = "hint", HINT_EPISODE
        kind = evidence = None
    else:
        state, kind, evidence, episode = app.embedding_health.snapshot()
        if state != "fault":
            return None  # ADV-3: unknown and healthy say nothing
        severity = "fault"
    memory = app.recall_advisory
    bucket = session_bucket(session_key)
    shared = settings.transport != "stdio"
    full = memory.first_time(episode, bucket)
    if severity == "fault" and bucket == KEYLESS and shared:
        full = True  # keyless callers of a shared server cannot be told apart (ADV-6)
    scope = "process" if bucket == KEYLESS and shared else "session"
    if severity == "hint":
        return {
            "degraded": True, "severity": "hint", "reason": _HINT_REASON, "evidence": _HINT_EVIDENCE,
            "runbook": _HINT_RUNBOOK if full else _HINT_REMINDER, "advisory_scope": scope,
        }  # fmt: skip
    kind = kind or "unreachable"
    evidence = evidence or "the embedding call produced no vector"
    endpoint = getattr(app.embedder, "endpoint", "") or "the configured endpoint"
    runbook = (
        _fault_runbook(kind, evidence, endpoint)
        if full
        else f"Reminder: the embedding service is still unavailable and recall is keyword-only ({evidence})."
    )
    return {
        "degraded": True, "severity": "fault", "reason": _FAULT_REASON[kind], "evidence": evidence,
        "runbook": runbook, "advisory_scope": scope,
    }  # fmt: skip
