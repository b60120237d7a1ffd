"""Record nodes, the overflow tree: records longer than the embedding window (spec associations §6).

An embedding model reads a bounded number of tokens. A record whose stored text
runs past that window is divided into nodes — consecutive spans of the text,
each short enough to embed whole, each with its own vector. Nodes hold offsets,
never text, and never change which records a search returns (OV-12).

    write side   store / update_memory / archive_episode ask the token report
                 for the stored text (outside the write lock); when it runs
                 past the window, a ``build_nodes`` task joins the write's
                 transaction and the answer says nodes:{status:'queued'}
                 (OV-3, OV-4)
    build        the task queue (services/operations/tasks.py) runs :func:`build_nodes`:
                 divide (OV-9), embed every span, then — under the write lock
                 and only if the text is still byte-identical — replace the
                 record's nodes (OV-8). The queue lives in the database, so a
                 build interrupted by a restart runs again.
    read side    :func:`current_nodes` is the one currency test (OV-2) for
                 get_contents node ranges, reconstruct and check_health.

Deleting a record or changing its text removes its nodes at once (database
triggers, revision 0004, LR-1).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cpersona.embedding.tokens import TokenInfo
from cpersona.services.app import App
from cpersona.services.operations.tasks import TaskFailed, Task, enqueue, register_handler
from cpersona.storage.repositories.episodes import EpisodeRepository
from cpersona.storage.repositories.memories import MemoryRepository
from cpersona.storage.repositories.nodes import NodeRepository, NodeRow

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

TASK_TYPE = "build_nodes"
KINDS = ("mem", "ep")
QUEUED = {"status": "queued"}  # what a write adds to its answer (OV-3)
EMBED_BATCH = 32  # texts per embedding request while building (OV-8)
MAX_NODES = 1024  # a record divided into more is not built (16,000 characters need ~40)
MAX_MEASUREMENTS = 4096  # token reports one build may ask for

# OV-9 boundary classes, tried in order. A cut falls at the END of a match, so
# the separator stays with the earlier node. A half-width sentence mark counts
# only when whitespace or the end of the text follows it.
BOUNDARY_CLASSES = (
    re.compile(r"\n[ \t]*\n"),  # a blank line
    re.compile(r"\n"),  # a line feed
    re.compile(r"[。．！？]|[.!?](?=\s|\Z)"),  # a sentence end
    re.compile(r"\s"),  # any whitespace
)


# -- write side (OV-3, OV-4) ----------------------------------------------------------------


def runs_past_window(app: App, text: str) -> bool:
    """True when node building is possible and the token report says ``text`` overflows.

    Call it before taking the write lock: it is a network request. Unknown and
    failed reports answer False (never "fits", never "queued").
    """
    if not app.settings.task_queue_enabled or not text:
        return False
    reporter = app.token_reporter
    if reporter is None:
        return False
    info = reporter.measure(text)
    return info is not None and info.truncated


def queue_build(app: App, session: Session, kind: str, record_id: int, *, agent_id: str, project_id: str = "") -> bool:
    """Queue a node build inside the caller's write transaction; False (and logged) if that failed.

    A savepoint keeps a failed enqueue from taking the record's own write down
    with it: the write succeeds and its answer simply has no ``nodes`` key (OV-4).
    """
    try:
        with session.begin_nested():
            enqueue(
                app,
                session,
                TASK_TYPE,
                agent_id=agent_id,
                project_id=project_id,
                payload={"kind": kind, "id": record_id},
            )
    except Exception:  # noqa: BLE001 — the record is worth keeping without its nodes
        log.warning("could not queue a node build for %s:%s", kind, record_id, exc_info=True)
        return False
    return True


# -- division (OV-9) ------------------------------------------------------------------------


class DivisionFailed(Exception):
    """The text could not be divided (an unknown report, or no cut fits the window)."""


@dataclass(frozen=True, slots=True)
class Span:
    start: int
    end: int
    token_count: int
    window: int


def choose_cut(rest: str, window_end: int) -> int:
    """Where to end the next node: the last boundary of the first class that is past half the window."""
    for pattern in BOUNDARY_CLASSES:
        best = None
        for match in pattern.finditer(rest):
            if match.end() > window_end:
                break
            best = match.end()
        if best is not None and 2 * best >= window_end:
            return best
    return max(1, window_end)


def divide(text: str, measure: Callable[[str], TokenInfo | None]) -> list[Span]:
    """OV-9: consecutive spans covering ``text``, each within the model's window.

    Deterministic for a given text and token reporter. Raises
    :class:`DivisionFailed` on an unknown report, when no cut of at least one
    character fits, or past the work bounds.
    """
    asked = 0

    def ask(piece: str) -> TokenInfo:
        nonlocal asked
        asked += 1
        if asked > MAX_MEASUREMENTS:
            raise DivisionFailed(f"more than {MAX_MEASUREMENTS} token reports")
        info = measure(piece)
        if info is None:
            raise DivisionFailed("the token report is unknown")
        return info

    spans: list[Span] = []
    offset = 0
    while offset < len(text):
        if len(spans) >= MAX_NODES:
            raise DivisionFailed(f"more than {MAX_NODES} nodes")
        rest = text[offset:]
        whole = ask(rest)
        if not whole.truncated:
            spans.append(Span(offset, len(text), whole.count, whole.window))
            break
        window_end = whole.window_end_char
        while True:
            cut = choose_cut(rest, window_end)
            piece = ask(rest[:cut])
            if not piece.truncated:
                spans.append(Span(offset, offset + cut, piece.count, piece.window))
                break
            # The piece still overflows (tokens do not split where characters do): shrink.
            window_end = min(piece.window_end_char, cut - 1)
            if window_end < 1:
                raise DivisionFailed(f"no cut at offset {offset} fits the window")
        offset += cut
    return spans


# -- read side (OV-2) -----------------------------------------------------------------------


def node_rows(session: Session, kind: str, record_id: int) -> list[NodeRow]:
    """A record's node rows in index order (whatever state they are in)."""
    return NodeRepository(session).of_record(kind, record_id)


def partitions(rows: Sequence[NodeRow], length: int) -> bool:
    """OV-2 (a), (b): indices 0…n−1 whose spans cover [0, length) with no gap or overlap."""
    if not rows:
        return False
    position = 0
    for expected, row in enumerate(rows):
        if row.index != expected or row.start != position or row.end <= row.start:
            return False
        position = row.end
    return position == length


def accepted_model_keys(app: App) -> frozenset[str]:
    """OV-2 (d): the backend's fingerprint when it reports one, and always the configured model name."""
    keys = {app.settings.embedding_model}
    embedder = app.embedder
    if embedder is not None:
        keys.add(getattr(embedder, "model", "") or app.settings.embedding_model)
        fingerprint = _fingerprint(embedder)
        if fingerprint:
            keys.add(fingerprint)
    keys.discard("")
    return frozenset(keys)


def build_model_key(app: App) -> str:
    """OV-10: the key stamped on nodes built now — the fingerprint if known, else the model name."""
    embedder = app.embedder
    fingerprint = _fingerprint(embedder) if embedder is not None else None
    if fingerprint:
        return fingerprint
    return (getattr(embedder, "model", "") if embedder is not None else "") or app.settings.embedding_model


def _fingerprint(embedder: Any) -> str | None:
    refresh = getattr(embedder, "refresh_identity", None)
    if refresh is None:
        return None
    try:
        return refresh()
    except Exception:  # noqa: BLE001 — an unknown identity is simply not a key
        log.debug("backend identity unavailable", exc_info=True)
        return None


def current_nodes(
    session: Session, kind: str, record_id: int, text: str, *, model_keys: Iterable[str] | None = None
) -> list[NodeRow] | None:
    """The record's nodes when they describe ``text`` (its current stored text), else None.

    With ``model_keys`` the full OV-2 test applies (every node embedded, by an
    accepted model): builders, reconstruct and check_health pass it. Without,
    only the partition is checked — what get_contents node ranges need, since
    offsets depend on the text alone (GR-5).
    """
    rows = node_rows(session, kind, record_id)
    if not partitions(rows, len(text)):
        return None
    if model_keys is not None:
        keys = set(model_keys)
        if any(row.embedding is None or row.embedding_model not in keys for row in rows):
            return None
    return rows


def record_text(session: Session, kind: str, record_id: int) -> str | None:
    """The stored text of ``kind:record_id`` (memory content, episode summary), or None when it is gone."""
    return (MemoryRepository if kind == "mem" else EpisodeRepository)(session).text_of(record_id)


# -- the build task (OV-8) ------------------------------------------------------------------


def _payload(task_payload: Any) -> tuple[str, int] | None:
    if not isinstance(task_payload, dict):
        return None
    kind, record_id = task_payload.get("kind"), task_payload.get("id")
    if kind not in KINDS or isinstance(record_id, bool) or not isinstance(record_id, int):
        return None
    return kind, record_id


def build_record_nodes(app: App, kind: str, record_id: int) -> str:
    """Build one record's nodes if they are missing or stale; returns what happened.

    ``built``, ``current`` (nothing to do), ``fits`` (no nodes needed), ``gone``
    (the record was deleted) or ``changed`` (its text moved on while building:
    the next write queued its own build). Raises :class:`TaskFailed` when the
    build should be retried (unknown token report, missing vectors).
    """
    keys = accepted_model_keys(app)
    with app.db.read() as session:
        text = record_text(session, kind, record_id)
        if text is None:
            return "gone"
        if current_nodes(session, kind, record_id, text, model_keys=keys) is not None:
            return "current"
        had_rows = bool(node_rows(session, kind, record_id))

    reporter = app.token_reporter
    if reporter is None or app.embedder is None:
        raise TaskFailed("no token report: node building needs http embeddings with a URL ending in /embed")
    try:
        spans = divide(text, reporter.measure)
    except DivisionFailed as exc:
        raise TaskFailed(f"could not divide {kind}:{record_id}: {exc}") from None

    vectors: list[bytes | None] = []
    if len(spans) > 1:
        vectors = app.embedder.embed_many([text[s.start : s.end] for s in spans], batch_size=EMBED_BATCH)
        if len(vectors) != len(spans) or any(v is None for v in vectors):
            raise TaskFailed(f"embedding the nodes of {kind}:{record_id} failed")
    elif not had_rows:
        return "fits"
    model_key = build_model_key(app)

    with app.db.write() as session:
        # Write only what was divided: a record edited meanwhile keeps no stale offsets.
        if record_text(session, kind, record_id) != text:
            return "changed"
        # One span: old nodes of another model or window go; the record now fits whole.
        NodeRepository(session).replace(
            kind,
            record_id,
            []
            if len(spans) == 1
            else [
                {
                    "node_index": index,
                    "start_char": span.start,
                    "end_char": span.end,
                    "token_count": span.token_count,
                    "window": span.window,
                    "embedding": vector,
                    "embedding_model": model_key,
                }
                for index, (span, vector) in enumerate(zip(spans, vectors))
            ],
        )
    return "fits" if len(spans) == 1 else "built"


def build_nodes(app: App, task: Task) -> dict[str, Any] | None:
    """The ``build_nodes`` task handler (derived work: idempotent, never dropped by a pause)."""
    parsed = _payload(task.payload)
    if parsed is None:
        log.warning("task %d: build_nodes payload %r is malformed; discarded", task.id, task.payload)
        return None
    outcome = build_record_nodes(app, *parsed)
    log.debug("task %d: nodes of %s:%s %s", task.id, parsed[0], parsed[1], outcome)
    return None


register_handler(TASK_TYPE, build_nodes, derived=True)
