"""Editing and removing records by id, and removing an agent wholesale.

Tools (spec admin-and-safety §1.3–§5, memory-and-recall §3.6):
``update_memory``, ``lock_memory``, ``unlock_memory``, ``delete_memory``,
``delete_episode`` and ``delete_agent_data``.

Ownership (OWN-1..OWN-4) is decided in one place, :func:`_memory_refusal` and
:func:`_memory_guards`: a call that names an ``agent_id`` is scoped and every
failure reads the same, so a caller cannot learn whether a row it does not own
exists or is locked; a call without one is unscoped, gets specific messages and
is logged as such. The mutating statement repeats every guard it was checked
against, and a statement that matched nothing is a refusal, never a success.

Derived rows keyed on ``mem:<id>`` / ``ep:<id>`` (full-text postings, overflow
nodes, declared mentions and relations) follow a deleted or edited record by the
database's own triggers (storage §4.5, LR-1, LR-2), in the same transaction.

The no-persist pause is answered before any of this runs (the facade's pause
gate); ``session_key`` is accepted here only because the tools declare it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from cpersona.services.records import remote_vectors
from cpersona.services.app import App
from cpersona.services.records.memories import embed_text
from cpersona.services.records.nodes import QUEUED, queue_build, runs_past_window
from cpersona.services.requests import Request
from cpersona.services.responses import ToolFailure, answers_refusals, failure
from cpersona.services.sanitize import find_lone_surrogate, nul_refusal, sanitize
from cpersona.storage.repositories.associations import delete_agent_declarations
from cpersona.storage.repositories.episodes import EpisodeRepository
from cpersona.storage.repositories.memories import MemoryRepository
from cpersona.storage.repositories.profiles import ProfileRepository
from cpersona.storage.repositories.tasks import TaskRepository

log = logging.getLogger(__name__)

# SQLite's INTEGER is signed 64-bit; an id outside it names no row (OWN-3).
_MIN_ID = -(2**63)
_MAX_ID = 2**63 - 1


# -- arguments --------------------------------------------------------------------------


def _record_id(name: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolFailure(f"{name} must be an integer")
    return value


def _owner_scope(operation: str, row_label: str, row_id: int, agent_id: str) -> str | None:
    """The agent a by-id call is scoped to, or None for an unscoped call (OWN-2)."""
    if agent_id == "":
        log.warning("%s %s %s running UNSCOPED: no agent_id, so no ownership check", operation, row_label, row_id)
        return None
    return agent_id


def _checked_row(id_field: str, row_id: Any, agent_id: Any) -> tuple[int, str]:
    """A library caller's row id and owner checked as the tool's schema checks a tool call's."""
    checked_id = _record_id(id_field, row_id)
    if agent_id is None:
        agent_id = ""
    if not isinstance(agent_id, str):
        # Never read a malformed scope as "no scope": that would widen the call.
        raise ToolFailure("agent_id must be a string")
    return checked_id, agent_id


@dataclass(frozen=True)
class MemoryRowArguments(Request):
    """``delete_memory``'s, ``lock_memory``'s and ``unlock_memory``'s arguments; defaults are the schema's."""

    memory_id: int
    agent_id: str = ""
    session_key: str = ""


@dataclass(frozen=True)
class EpisodeRowArguments(Request):
    """``delete_episode``'s arguments; defaults are the schema's."""

    episode_id: int
    agent_id: str = ""
    session_key: str = ""


def _memory_row_arguments(memory_id: Any, agent_id: Any) -> MemoryRowArguments:
    row_id, owner = _checked_row("memory_id", memory_id, agent_id)
    return MemoryRowArguments(memory_id=row_id, agent_id=owner)


def _in_range(row_id: int) -> bool:
    return _MIN_ID <= row_id <= _MAX_ID


# -- memory ownership (OWN-1..OWN-4) ----------------------------------------------------


def _not_found_or_foreign(memory_id: int) -> str:
    # One message for every scoped failure, lock included (OWN-1, LK-2).
    return f"Memory {memory_id} not found, not owned by agent, or locked"


def _memory_refusal(memory_id: int, owner: str | None, row: Any, *, refused_if_locked: str | None) -> str | None:
    """Why this call may not touch the row (None: it may).

    ``refused_if_locked`` is the participle of the operation a lock forbids
    ("deleted", "edited"), or None for lock/unlock, which a lock does not stop.
    """
    locked = row is not None and row.locked != 0
    if owner is not None:
        if row is None or row.agent_id != owner or (refused_if_locked and locked):
            return _not_found_or_foreign(memory_id)
        return None
    if row is None:
        return f"Memory {memory_id} not found"
    if refused_if_locked and locked:
        return f"Memory {memory_id} is locked and cannot be {refused_if_locked}"
    return None


def _absent(memory_id: int, owner: str | None) -> ToolFailure:
    """The refusal for an id that names no row, in the call's scoped or unscoped wording."""
    return ToolFailure(_not_found_or_foreign(memory_id) if owner is not None else f"Memory {memory_id} not found")


def _memory_row(session: Session, memory_id: int) -> Any:
    return MemoryRepository(session).ownership(memory_id)


def _checked_memory(session: Session, memory_id: int, owner: str | None, *, refused_if_locked: str | None) -> Any:
    row = _memory_row(session, memory_id)
    if (refusal := _memory_refusal(memory_id, owner, row, refused_if_locked=refused_if_locked)) is not None:
        raise ToolFailure(refusal)
    return row


def _unmatched(session: Session, memory_id: int, owner: str | None, refused_if_locked: str | None) -> ToolFailure:
    """The refusal for a guarded statement that matched no row (OWN-4)."""
    refusal = _memory_refusal(memory_id, owner, _memory_row(session, memory_id), refused_if_locked=refused_if_locked)
    return ToolFailure(refusal) if refusal is not None else _absent(memory_id, owner)


# -- delete_memory / lock_memory / unlock_memory ----------------------------------------


@answers_refusals
def delete_memory(app: App, *, memory_id: Any, agent_id: Any = "", session_key: Any = "") -> dict[str, Any]:
    """:func:`answer_delete_memory` for a library caller, whose arguments no schema has checked."""
    return answer_delete_memory.raises(app, _memory_row_arguments(memory_id, agent_id))


@answers_refusals
def answer_delete_memory(app: App, args: MemoryRowArguments) -> dict[str, Any]:
    """Delete one memory; a locked one never (DM-1..DM-3)."""
    row_id = args.memory_id
    owner = _owner_scope("delete_memory", "memory", row_id, args.agent_id)
    if not _in_range(row_id):
        raise _absent(row_id, owner)
    with app.db.write() as session:
        row = _checked_memory(session, row_id, owner, refused_if_locked="deleted")
        gone = MemoryRepository(session).delete_unlocked(row_id, owner)
        if gone != 1:
            raise _unmatched(session, row_id, owner, "deleted")
    # After commit, from the owner read before the delete; a failure is logged only.
    remote_vectors.forget(app, row.agent_id, [f"mem:{row_id}"])
    return {"ok": True, "deleted_id": row_id}


def _set_lock(app: App, tool: str, answer_key: str, args: MemoryRowArguments, value: int) -> dict[str, Any]:
    row_id = args.memory_id
    owner = _owner_scope(tool, "memory", row_id, args.agent_id)
    if not _in_range(row_id):
        raise _absent(row_id, owner)
    with app.db.write() as session:
        _checked_memory(session, row_id, owner, refused_if_locked=None)
        # LK-1: setting the flag it already has still matches the row, so it still succeeds.
        matched = MemoryRepository(session).set_locked(row_id, owner, value)
        if matched != 1:
            raise _unmatched(session, row_id, owner, None)
    return {"ok": True, answer_key: row_id}


@answers_refusals
def lock_memory(app: App, *, memory_id: Any, agent_id: Any = "", session_key: Any = "") -> dict[str, Any]:
    """:func:`answer_lock_memory` for a library caller, whose arguments no schema has checked."""
    return answer_lock_memory.raises(app, _memory_row_arguments(memory_id, agent_id))


@answers_refusals
def answer_lock_memory(app: App, args: MemoryRowArguments) -> dict[str, Any]:
    """Protect one memory from delete_memory and update_memory (LK-1..LK-3)."""
    return _set_lock(app, "lock_memory", "locked_id", args, 1)


@answers_refusals
def unlock_memory(app: App, *, memory_id: Any, agent_id: Any = "", session_key: Any = "") -> dict[str, Any]:
    """:func:`answer_unlock_memory` for a library caller, whose arguments no schema has checked."""
    return answer_unlock_memory.raises(app, _memory_row_arguments(memory_id, agent_id))


@answers_refusals
def answer_unlock_memory(app: App, args: MemoryRowArguments) -> dict[str, Any]:
    return _set_lock(app, "unlock_memory", "unlocked_id", args, 0)


# -- update_memory (memory-and-recall §3.6) ---------------------------------------------


def _holder_of(session: Session, row: Any, content: str, memory_id: int) -> int | None:
    """Another memory of the row's exact (agent, project, channel) bucket holding ``content`` (UM-5)."""
    return MemoryRepository(session).holder_of(row.agent_id, row.project_id, row.channel, content, memory_id)


def _copy_kept(memory_id: int, holder: int | None) -> ToolFailure:
    other = f"memory {holder}" if holder is not None else "another memory"
    return ToolFailure(
        f"Memory {memory_id} was not edited: {other} in the same agent, project and channel "
        "already holds this content, and one copy is kept per bucket"
    )


@dataclass(frozen=True)
class MemoryUpdateArguments(Request):
    """``update_memory``'s arguments in the types its schema declares; defaults are the schema's."""

    memory_id: int
    content: str
    agent_id: str = ""
    session_key: str = ""


def _refuse_empty(content: str) -> None:
    if not content.strip():
        raise ToolFailure("Content cannot be empty")  # UM-1: before the row is looked up


@answers_refusals
def update_memory(
    app: App, *, memory_id: Any, content: Any, agent_id: Any = "", session_key: Any = ""
) -> dict[str, Any]:
    """:func:`answer_update_memory` for a library caller, whose arguments no schema has checked."""
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise ToolFailure(f"content must be a string, not {type(content).__name__}")
    _refuse_empty(content)  # ahead of the row id's check, as for a tool call
    row_id, owner = _checked_row("memory_id", memory_id, agent_id)
    return answer_update_memory.raises(app, MemoryUpdateArguments(memory_id=row_id, content=content, agent_id=owner))


@answers_refusals
def answer_update_memory(app: App, args: MemoryUpdateArguments) -> dict[str, Any]:
    """Replace one memory's text: sanitized, capped, never onto a locked row or a copy (UM-1..UM-6)."""
    row_id, content = args.memory_id, args.content
    _refuse_empty(content)
    owner = _owner_scope("update_memory", "memory", row_id, args.agent_id)
    if find_lone_surrogate(content):
        raise ToolFailure("content contains a lone UTF-16 surrogate, which is not valid text; nothing was edited")
    if problem := nul_refusal(content=content):
        raise ToolFailure(f"{problem}; nothing was edited")  # decision 11
    if not _in_range(row_id):
        raise _absent(row_id, owner)
    cleaned = sanitize(content, app.settings.max_content_length)  # UM-4

    # Look first on a read snapshot, so a refused edit costs no embedding request.
    with app.db.read() as session:
        row = _checked_memory(session, row_id, owner, refused_if_locked="edited")
        if cleaned.empty:
            raise ToolFailure("Content cannot be empty after sanitization")
        if (holder := _holder_of(session, row, cleaned.text, row_id)) is not None:
            raise _copy_kept(row_id, holder)

    embedding = embed_text(app, cleaned.text)  # UM-6: outside the write lock; None clears the old vector
    long_text = runs_past_window(app, cleaned.text)  # OV-4: a network ask too, so before the lock

    with app.db.write() as session:
        # The authoritative look: the row may have been locked, moved or copied meanwhile.
        row = _checked_memory(session, row_id, owner, refused_if_locked="edited")
        if (holder := _holder_of(session, row, cleaned.text, row_id)) is not None:
            raise _copy_kept(row_id, holder)
        try:
            with session.begin_nested():
                matched = MemoryRepository(session).replace_text_unlocked(row_id, owner, cleaned.text, embedding)
        except IntegrityError:
            # The unique (agent, project, channel, content) index has the last word.
            raise _copy_kept(row_id, _holder_of(session, row, cleaned.text, row_id)) from None
        if matched != 1:
            raise _unmatched(session, row_id, owner, "edited")
        # The edit's trigger removed the old nodes (LR-1); the rebuild commits with the edit.
        nodes_queued = long_text and queue_build(
            app, session, "mem", row_id, agent_id=row.agent_id, project_id=row.project_id
        )

    remote_vectors.push(app, row.agent_id, [(f"mem:{row_id}", cleaned.text)])  # re-index the new text
    response: dict[str, Any] = {"ok": True, "updated_id": row_id}
    if cleaned.truncated:
        response["truncated"] = True
    if nodes_queued:
        response["nodes"] = dict(QUEUED)  # OV-3
    return response


# -- delete_episode (§3) ----------------------------------------------------------------


@answers_refusals
def delete_episode(app: App, *, episode_id: Any, agent_id: Any = "", session_key: Any = "") -> dict[str, Any]:
    """:func:`answer_delete_episode` for a library caller, whose arguments no schema has checked."""
    row_id, owner = _checked_row("episode_id", episode_id, agent_id)
    return answer_delete_episode.raises(app, EpisodeRowArguments(episode_id=row_id, agent_id=owner))


@answers_refusals
def answer_delete_episode(app: App, args: EpisodeRowArguments) -> dict[str, Any]:
    """Delete one episode; every failure reads the same, scoped or not (DE-1)."""
    row_id = args.episode_id
    owner = _owner_scope("delete_episode", "episode", row_id, args.agent_id)
    refusal = ToolFailure(f"Episode {row_id} not found or not owned by agent")
    if not _in_range(row_id):
        raise refusal
    with app.db.write() as session:
        episodes = EpisodeRepository(session)
        episode_owner = episodes.owner_of(row_id, owner)  # DE-2: read before the delete
        if episodes.delete_one(row_id, owner) != 1:
            raise refusal
    remote_vectors.forget(app, episode_owner or "", [f"ep:{row_id}"])
    return {"ok": True, "deleted_id": row_id}


# -- delete_agent_data (§5) -------------------------------------------------------------


def _forget_calibration(app: App, agent_id: str) -> None:
    """DAD-2: after commit, the agent's threshold, gate and beta leave memory and the sidecar."""
    if not app.calibration.forget_agent(agent_id, app.settings):
        log.warning(
            "delete_agent_data %s: the calibration sidecar could not be rewritten; the agent's "
            "calibration is gone from this process but may come back from the file at restart",
            agent_id,
        )


@dataclass(frozen=True)
class AgentArguments(Request):
    """``delete_agent_data``'s arguments in the types its schema declares."""

    agent_id: str
    session_key: str = ""


def delete_agent_data(app: App, *, agent_id: Any = None, session_key: Any = "") -> dict[str, Any]:
    """:func:`answer_delete_agent_data` for a library caller, whose arguments no schema has checked."""
    if agent_id is None:
        agent_id = ""  # refused below as missing
    if not isinstance(agent_id, str):
        return failure("agent_id must be a string")
    return answer_delete_agent_data(app, AgentArguments(agent_id=agent_id))


def answer_delete_agent_data(app: App, args: AgentArguments) -> dict[str, Any]:
    """Remove everything one agent owns, locked memories included (DAD-1, LK-3)."""
    agent_id = args.agent_id
    if agent_id == "":
        return failure("agent_id is required for bulk deletion")
    with app.db.write() as session:
        # Records go first so that their own triggers clear what hangs on them.
        counts = {
            "deleted_memories": MemoryRepository(session).delete_agent(agent_id),
            "deleted_profiles": ProfileRepository(session).delete_agent(agent_id),
            "deleted_episodes": EpisodeRepository(session).delete_agent(agent_id),
            "deleted_pending_tasks": TaskRepository(session).delete_agent(agent_id),
        }
        delete_agent_declarations(session.connection(), agent_id)
    _forget_calibration(app, agent_id)
    remote_vectors.purge(app, agent_id)  # DAD-2: the agent's remote namespace; failure logged only
    # DAD-4: the four counters always, zeros for an agent that had nothing.
    return {"ok": True, "agent_id": agent_id, **counts}
