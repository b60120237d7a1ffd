"""``store``: write one memory, never twice (spec memory-and-recall §3.1, §5.3).

The path, top to bottom:

    validate in the order ST-2 fixes      → rejected {ok:false, result, reason}
    sanitize the content (§5.2)           → rejected when nothing is left
    future-timestamp policy (§5.4)        → rejected in reject mode, reported in warn mode
    dedup probe on a read snapshot        → skipped / rejected without embedding anything
    embed the sanitized text, once        (outside the write lock: no network under it)
    under the write lock: probe again, insert in a savepoint
                                          → the unique indexes have the last word
    lock the resolved row when asked      (ST-12)

Pause gating and ACL are decided before this function runs (the MCP facade's
gates); ``session_key`` only matters to them. The operating context's Hard
layer (``@auto``, the project registry) is step 3 of ST-2: the facade applies
it after :func:`check_boundary` (steps 1–2) and before this function runs,
so ``project_id`` arrives resolved.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from cpersona.embedding.passages import embed_passage
from cpersona.services.records import remote_vectors
from cpersona.services.app import App
from cpersona.services.graph.associations import declare_for_record
from cpersona.services.records.backfill import keeps_local_vectors
from cpersona.services.records.nodes import QUEUED, queue_build, runs_past_window
from cpersona.services.requests import Request
from cpersona.services.responses import ToolFailure, failure
from cpersona.services.sanitize import (
    bucket_field,
    check_json_size,
    check_key_field,
    check_timestamp_field,
    find_lone_surrogate,
    nul_refusal,
    normalize_source,
    parse_stored_json,
    sanitize,
    source_id_text,
    to_json,
)
from cpersona.services.timestamps import FuturePolicy, sql_stamp
from cpersona.storage.repositories.memories import MemoryRepository
from cpersona.storage.memory_writes import dedup_candidates, insert_memory

log = logging.getLogger(__name__)


# ``source`` has a default that depends on whether the caller sent one.
OMITTED: Any = Request.OMITTED

MIXED_FORMS = "send content, id, source, timestamp and metadata either at the top level or inside message, not both"
MISSING_AGENT = (
    "agent_id is required: it can be omitted only on a connection whose ACL grants write access to exactly one agent"
)
SAME_BUCKET_COPY = (
    "this content is already stored under a different source id in the same agent, project and channel; "
    "one copy is kept per bucket, so it was not stored for this source"
)
LONE_SURROGATE = "the arguments contain a lone UTF-16 surrogate, which is not valid text; nothing was stored"


class _Rejected(Exception):
    """A refusal of this store: nothing is written, ``reason`` tells why."""

    def __init__(self, reason: str, **extra: Any) -> None:
        super().__init__(reason)
        self.reason = reason
        self.extra = extra  # keys the refusal carries besides result/reason (OC-11)


@dataclass(frozen=True, slots=True)
class _Write:
    """A store request once validated and cleaned: exactly what the row will hold."""

    agent_id: str
    project_id: str
    channel: str
    msg_id: str
    content: str
    truncated: bool
    source: Any  # normalized value; source_json is its stored text
    source_json: str
    metadata_json: str
    timestamp: str  # the caller's stamp, or '' for "now"
    lock: bool


@dataclass(frozen=True, slots=True)
class _Probe:
    """What the dedup probe decided: proceed, skip (echoing a row) or reject."""

    result: str  # "proceed" | "skipped" | "rejected"
    reason: str = ""
    row_id: int | None = None


_PROCEED = _Probe("proceed")


@dataclass(frozen=True)
class StoreArguments(Request):
    """``store``'s arguments in the types its schema declares; defaults are the schema's.

    ``content`` and ``agent_id`` are None when not sent (refused, ST-2); ``source``
    stays OMITTED, since its default is the agent itself (ST-8).
    """

    content: str | None = None
    agent_id: str | None = None  # a tool call without one was refused by check_boundary or filled by the ACL
    id: str = ""  # the caller's own id for the memory (msg_id)
    source: Any = OMITTED  # an object, or what normalize_source reads
    timestamp: str = ""
    metadata: Mapping[str, Any] | None = None
    lock: bool = False
    message: Mapping[str, Any] | None = None
    channel: str = ""
    project_id: str = ""
    session_key: str = ""
    associations: Any = None  # the declaration reports a malformed one in dropped, never refusing the store (AS-2)


def store(
    app: App,
    *,
    content: Any = None,
    agent_id: Any = None,
    id: Any = "",  # noqa: A002 — the tool's argument is called "id"
    source: Any = OMITTED,
    timestamp: Any = "",
    metadata: Any = None,
    lock: Any = False,
    message: Any = None,
    channel: Any = "",
    project_id: Any = "",
    session_key: Any = "",
    associations: Any = None,
) -> dict[str, Any]:
    """:func:`answer_store` for a library caller, whose arguments no schema has checked."""
    try:
        if not isinstance(lock, bool):
            raise _Rejected("lock must be true or false")
        if message is not None and not isinstance(message, dict):
            raise _Rejected("message must be an object")
        if agent_id is not None and not isinstance(agent_id, str):
            raise _Rejected("agent_id must be a string")
        _check_types(content, id, timestamp, metadata)
        if message:
            _check_types(message.get("content"), message.get("id"), message.get("timestamp"), message.get("metadata"))
    except _Rejected as refusal:
        return _rejected(refusal, lock_requested=lock is True)
    arguments = StoreArguments(
        content=content,
        agent_id=agent_id,
        id=id or "",
        source=source,
        timestamp=timestamp or "",
        metadata=metadata,
        lock=lock,
        message=message,
        channel=bucket_field(channel),
        project_id=bucket_field(project_id),
        associations=associations,
    )
    return answer_store(app, arguments)


def _check_types(content: Any, msg_id: Any, timestamp: Any, metadata: Any) -> None:
    """A library caller's fields, in either form, in the types the tool's schema gives a tool call's."""
    if content is not None and not isinstance(content, str):
        raise _Rejected(f"content must be a string, not {type(content).__name__}")
    if msg_id is not None and not isinstance(msg_id, str):
        raise _Rejected("id must be a string")
    if timestamp is not None and not isinstance(timestamp, str):
        raise _Rejected("timestamp must be a string")
    if metadata is not None and not isinstance(metadata, dict):
        raise _Rejected("metadata must be an object")


def _rejected(refusal: _Rejected, *, lock_requested: bool) -> dict[str, Any]:
    extra = {"locked": False} if lock_requested else {}
    return failure(refusal.reason, key="reason", result="rejected", **extra, **refusal.extra)


def answer_store(app: App, args: StoreArguments) -> dict[str, Any]:
    """Store one memory; answers ``stored``, ``skipped`` or ``rejected`` (spec §3.1)."""
    try:
        request = _validate(app, args)
        # Only a stamp the caller sent can be ahead; the server's own never is.
        policy = FuturePolicy.from_settings(app.settings)
        ahead = policy.judge([request.timestamp] if request.timestamp else [], app.clock())
        if ahead is not None and policy.rejects:
            raise _Rejected(ahead.refusal())  # before dedup: a duplicate does not excuse it (FT-2)
    except _Rejected as refusal:
        return _rejected(refusal, lock_requested=args.lock)

    answer = _write(app, request, ahead)
    associations = args.associations
    if associations is not None and associations != {} and isinstance(answer.get("id"), int):
        # AS-3, AS-4: declared against the row the store resolved to (new or an
        # echoed duplicate), after it committed; a failure never unstores it.
        answer["associations"] = declare_for_record(
            app,
            agent_id=request.agent_id,
            project_id=request.project_id,
            channel=request.channel,
            anchor=f"mem:{answer['id']}",
            associations=associations,
        )
    return answer


def _write(app: App, request: _Write, ahead: Any) -> dict[str, Any]:
    """Steps after validation: dedup, embed, insert, lock."""
    # A cheap look before embedding: a duplicate costs no embedding request.
    # Without an embedder or token reporter nothing runs between the two
    # probes, so the authoritative one under the write lock answers alone.
    if keeps_local_vectors(app) or app.token_reporter is not None:
        with app.db.read() as session:
            early = _probe(session.connection(), request)
        if early.result != "proceed":
            return _answer_without_insert(app, request, early)

    # ST-11: the sanitized text, once; OV-4: the token report. Both before the lock.
    embedding, long_text = _embed_and_measure(app, request.content)

    # A bare connection, not an ORM session: every statement here is Core.
    with app.db.write_connection() as conn:
        # The authoritative probe: another writer may have stored the same row
        # while the embedding request was out.
        probe = _probe(conn, request)
        if probe.result != "proceed":
            return _finish_probe(conn, request, probe)
        new_id = _insert(conn, app, request, embedding)
        # The build task commits with the row, so a restart cannot lose it.
        nodes_queued = new_id is not None and long_text and _queue_nodes(app, conn, request, new_id)

    if new_id is None:
        # DD-5: lost a race to the unique indexes (another process wrote the
        # same row between our probe and our insert).
        return _with_lock_flag(
            {"ok": True, "result": "skipped", "reason": "duplicate (unique index)"}, request, locked=False
        )

    # ST-6: in remote vector mode the row also counts as embedded when the index took it.
    pushed = remote_vectors.push(app, request.agent_id, [(f"mem:{new_id}", request.content)])
    response: dict[str, Any] = {
        "ok": True,
        "result": "stored",
        "id": new_id,
        "embedded": embedding is not None or pushed,
    }
    if request.truncated:
        response["truncated"] = True
    if nodes_queued:
        response["nodes"] = dict(QUEUED)  # OV-3
    if ahead is not None:
        response["timestamp_ahead_of_clock"] = ahead.report()
    return _with_lock_flag(response, request, locked=True)


# -- validation (ST-2 order) ------------------------------------------------------------


def _top_level_used(content: Any, msg_id: Any, timestamp: Any, metadata: Any, source_sent: bool) -> bool:
    return (
        content not in (None, "")
        or msg_id not in (None, "")
        or timestamp not in (None, "")
        or bool(metadata)
        or source_sent
    )


def check_boundary(arguments: Mapping[str, Any]) -> None:
    """ST-2 steps 1–2, which come before the project registry (step 3) and the pause (step 4).

    Mixed forms and a missing agent are refused even while paused; the facade
    runs this first, for every store, paused or not. Same messages, same
    order, same rule as :func:`_validate`, which repeats them for a caller of
    :func:`store` as a library function.
    """
    message = arguments.get("message")
    if (
        isinstance(message, dict)
        and message
        and _top_level_used(
            arguments.get("content"),
            arguments.get("id"),
            arguments.get("timestamp"),
            arguments.get("metadata"),
            "source" in arguments,
        )
    ):
        raise ToolFailure(MIXED_FORMS)
    if arguments.get("agent_id") is None:
        raise ToolFailure(MISSING_AGENT)


def _validate(app: App, args: StoreArguments) -> _Write:
    settings = app.settings
    content, agent_id, msg_id, source = args.content, args.agent_id, args.id, args.source
    timestamp, metadata, message = args.timestamp, args.metadata, args.message

    # 1. one form or the other (ST-1)
    if message:
        if _top_level_used(content, msg_id, timestamp, metadata, source is not OMITTED):
            raise _Rejected(MIXED_FORMS)
        content = message.get("content")
        msg_id = message.get("id") or ""
        timestamp = message.get("timestamp") or ""
        metadata = message.get("metadata")
        source = message.get("source")  # the older form's default producer is "unknown" ({})

    # 2. whose memory
    if agent_id is None:
        raise _Rejected(MISSING_AGENT)

    # 3. (the operating context's Hard layer: applied by the facade, see check_boundary)
    project_id, channel = args.project_id, args.channel

    # 4. (pause: answered by the facade before this function runs)

    # 5. something to store
    if content is None or content == "":
        raise _Rejected("empty content")

    # 6. key fields are refused, never cut (§5.2.2)
    for name, value in (("id", msg_id), ("channel", channel), ("project_id", project_id)):
        if problem := check_key_field(name, value):
            raise _Rejected(problem)
    if problem := nul_refusal(agent_id=agent_id):
        raise _Rejected(problem)

    # 7. timestamp bound
    if problem := check_timestamp_field(timestamp):
        raise _Rejected(problem)

    # 8. text that cannot be encoded
    if find_lone_surrogate(content, agent_id, msg_id, channel, project_id, timestamp, source, metadata):
        raise _Rejected(LONE_SURROGATE)
    if problem := nul_refusal(content=content, source=source, metadata=metadata):
        raise _Rejected(problem)  # decision 11: refused, never stored cut

    # 9. source and metadata as stored JSON, within their cap
    if source is OMITTED:
        source = {"type": "Agent", "id": agent_id, "name": ""}  # ST-8
    source = normalize_source(source)
    if metadata is None:
        metadata = {}
    source_json = _serialize("source", source)
    metadata_json = _serialize("metadata", metadata)
    for name, text in (("source", source_json), ("metadata", metadata_json)):
        if problem := check_json_size(name, text, settings.max_metadata_length):
            raise _Rejected(problem)

    # 10. the content itself (SAN-1, ST-3)
    cleaned = sanitize(content, settings.max_content_length)
    if cleaned.empty:
        raise _Rejected("empty after sanitization")

    return _Write(
        agent_id=agent_id,
        project_id=project_id,
        channel=channel,
        msg_id=msg_id,
        content=cleaned.text,
        truncated=cleaned.truncated,
        source=source,
        source_json=source_json,
        metadata_json=metadata_json,
        timestamp=timestamp,
        lock=args.lock,
    )


def _serialize(name: str, value: Any) -> str:
    try:
        return to_json(value)
    except ValueError as exc:
        raise _Rejected(f"{name} is {exc}") from None


# -- dedup (§5.3) ----------------------------------------------------------------------------


def _probe(conn: Connection, request: _Write) -> _Probe:
    """Decide skip / reject / proceed against what is already stored (DD-1, DD-2).

    The caller-id candidates come first, so DD-1 wins over DD-2.
    """
    rows = dedup_candidates(
        conn, agent_id=request.agent_id, project_id=request.project_id, channel=request.channel,
        content=request.content, msg_id=request.msg_id,
    )  # fmt: skip
    if rows and rows[0].same_id:
        # DD-1: the same caller id anywhere in those projects, whatever the channel.
        return _Probe("skipped", "duplicate msg_id", rows[0].id)
    wanted = source_id_text(request.source)
    for copy in rows:
        if source_id_text(parse_stored_json(copy.source)) == wanted:
            return _Probe("skipped", "duplicate content", copy.id)
    if any(c.project_id == request.project_id and c.channel == request.channel for c in rows):
        # ST-5: one copy per exact bucket, whoever declared it.
        return _Probe("rejected", SAME_BUCKET_COPY)
    return _PROCEED


def _answer_without_insert(app: App, request: _Write, probe: _Probe) -> dict[str, Any]:
    """Answer an early skip / reject; a skip with lock:true still has to lock its row."""
    if probe.result == "skipped" and request.lock:
        with app.db.write_connection() as conn:
            return _finish_probe(conn, request, probe)
    return _probe_answer(request, probe, locked=False)


def _finish_probe(conn: Connection, request: _Write, probe: _Probe) -> dict[str, Any]:
    locked = False
    if probe.result == "skipped" and request.lock and probe.row_id is not None:
        # ST-12: the row the store resolved to is the one that gets locked.
        locked = MemoryRepository(conn).lock(probe.row_id) == 1
    return _probe_answer(request, probe, locked=locked)


def _probe_answer(request: _Write, probe: _Probe, *, locked: bool) -> dict[str, Any]:
    if probe.result == "rejected":
        return _with_lock_flag(failure(probe.reason, key="reason", result="rejected"), request, locked=False)
    return _with_lock_flag(
        {"ok": True, "result": "skipped", "reason": probe.reason, "id": probe.row_id}, request, locked=locked
    )


def _with_lock_flag(response: dict[str, Any], request: _Write, *, locked: bool) -> dict[str, Any]:
    # `locked` is part of the answer only when the caller asked for a lock (ST-12).
    if request.lock:
        response["locked"] = locked
    return response


# -- embedding and insert -------------------------------------------------------------------


def embed_text(app: App, text: str) -> bytes | None:
    """The text's vector, or None; an embedding failure never fails a write (ST-6, AE-5).

    Call it before ``app.db.write()``: no network request may run under the write lock.
    Remote vector mode with ``CPERSONA_STORE_BLOB=false`` keeps no local vector,
    so it asks for none (the remote index embeds the text itself).
    """
    if not keeps_local_vectors(app):
        return None
    try:
        return embed_passage(app.embedder, text)  # a chat turn: whole and sentence by sentence (issue 14)
    except Exception:  # noqa: BLE001 — the row is still worth storing without a vector
        log.warning("embedding failed; the row is stored without a vector", exc_info=True)
        return None


def _embed_and_measure(app: App, text: str) -> tuple[bytes | None, bool]:
    """The text's vector and whether it runs past the embedding window: two requests, sent together.

    Against a backend with a token report (``cpersona embed-server``) a store
    asked them one after the other, two round trips before its write; the
    report now goes out on a side thread while this one embeds.
    """
    reporter = app.token_reporter if app.settings.task_queue_enabled and text else None
    asks = getattr(reporter, "asks", None)  # an in-process tokenizer makes no request: nothing to overlap
    if asks is None or not asks() or not keeps_local_vectors(app):
        return embed_text(app, text), runs_past_window(app, text)
    pending = _side_requests().submit(runs_past_window, app, text)
    embedding = embed_text(app, text)
    return embedding, pending.result()


_SIDE: list[Any] = []
_SIDE_LOCK = threading.Lock()


def _side_requests() -> Any:
    """The few threads token reports are sent from (built on first use)."""
    with _SIDE_LOCK:
        if not _SIDE:
            from concurrent.futures import ThreadPoolExecutor

            _SIDE.append(ThreadPoolExecutor(max_workers=4, thread_name_prefix="cpersona-token-report"))
        return _SIDE[0]


def _insert(conn: Connection, app: App, request: _Write, embedding: bytes | None) -> int | None:
    """Insert the row and return its id, or None when a unique index refused it (DD-5)."""
    now = app.clock()
    values = {
        "agent_id": request.agent_id,
        "project_id": request.project_id,
        "msg_id": request.msg_id,
        "content": request.content,
        "source": request.source_json,
        "timestamp": request.timestamp or now.isoformat(timespec="microseconds"),  # ST-7
        "metadata": request.metadata_json,
        "embedding": embedding,
        "channel": request.channel,
        "locked": 1 if request.lock else 0,
        "created_at": sql_stamp(now),
    }
    return insert_memory(conn, values)


def _queue_nodes(app: App, conn: Connection, request: _Write, new_id: int) -> bool:
    # The task queue writes through the ORM: a session joined to this transaction.
    with Session(bind=conn, autoflush=False, expire_on_commit=False) as session:
        queued = queue_build(app, session, "mem", new_id, agent_id=request.agent_id, project_id=request.project_id)
        session.flush()
    return queued
