"""Editing and removing records: ``delete_agent_data``, ``delete_memory``, ``delete_episode``,
``update_memory``, ``lock_memory``, ``unlock_memory``."""

from __future__ import annotations

from cpersona.mcp.registry import Annotations, ToolSpec
from cpersona.mcp.tools.common import SESSION_KEY, object_schema

_DESTRUCTIVE = Annotations(read_only=False, destructive=True, idempotent=True)
_EDIT = Annotations(read_only=False, destructive=False, idempotent=True)

_OWNER = {
    "type": "string",
    "description": (
        "The agent that must own the row. When given, a row of another agent (or a missing one) is refused "
        "with one message that does not reveal which it was; when omitted, any agent's row is acted on."
    ),
}


def _memory_id(verb: str) -> dict[str, object]:
    return {"type": "integer", "description": f"Id of the memory to {verb} (the number in mem:<id>)."}


DELETE_AGENT_DATA = ToolSpec(
    name="delete_agent_data",
    description=(
        "Remove everything one agent has: all its memories (locked ones too), its profile and its episodes, "
        "with its queued tasks and declared associations. Meant for when the agent itself is being deleted."
    ),
    input_schema=object_schema({
        "agent_id": {"type": "string", "description": "The agent whose data is removed; '' is refused."},
        "session_key": SESSION_KEY,
    }, required=["agent_id"]),
    annotations=_DESTRUCTIVE,
    service="cpersona.services.admin:delete_agent_data",
)

DELETE_MEMORY = ToolSpec(
    name="delete_memory",
    description=(
        "Delete one memory by its id; a locked memory is refused. When agent_id is given, the memory must "
        "belong to that agent (ownership is enforced)."
    ),
    input_schema=object_schema({
        "agent_id": _OWNER,
        "memory_id": _memory_id("delete"),
        "session_key": SESSION_KEY,
    }, required=["memory_id"]),
    annotations=_DESTRUCTIVE,
    service="cpersona.services.admin:delete_memory",
)

DELETE_EPISODE = ToolSpec(
    name="delete_episode",
    description=(
        "Delete one episode by its id. When agent_id is given, the episode must belong to that agent "
        "(ownership is enforced)."
    ),
    input_schema=object_schema({
        "agent_id": _OWNER,
        "episode_id": {"type": "integer", "description": "Id of the episode to delete (the number in ep:<id>)."},
        "session_key": SESSION_KEY,
    }, required=["episode_id"]),
    annotations=_DESTRUCTIVE,
    service="cpersona.services.admin:delete_episode",
)

UPDATE_MEMORY = ToolSpec(
    name="update_memory",
    description=(
        "Replace the text of one memory, found by id. A locked memory is refused, and when agent_id is given "
        "the memory must belong to that agent (ownership is enforced). The new text is cleaned as store cleans "
        "content: '[Memory from ...]' annotations are removed, so a text made only of them is refused instead "
        "of leaving an empty row, and it is cut to the content length limit, in which case the answer says "
        "truncated:true. If another memory of the same agent, project and channel already holds exactly that "
        "text, the edit is refused with ok:false naming that memory: each bucket keeps one copy. The memory "
        "is embedded again from its new text. A new text longer than the embedding window is answered with "
        "nodes:{status:'queued'}, as store does."
    ),
    input_schema=object_schema({
        "agent_id": _OWNER,
        "memory_id": _memory_id("edit"),
        "content": {"type": "string", "description": "The memory's new text; it replaces the old one entirely."},
        "session_key": SESSION_KEY,
    }, required=["memory_id", "content"]),
    annotations=_EDIT,
    service="cpersona.services.admin:update_memory",
)

LOCK_MEMORY = ToolSpec(
    name="lock_memory",
    description=(
        "Lock one memory so that delete_memory and update_memory refuse it. A lock does not stop an operator "
        "from re-filing it: migrate_channel_axis and merge_memories in move mode still relocate it, and it "
        "stays locked there; delete_agent_data still removes it. When agent_id is given, the memory must "
        "belong to that agent (ownership is enforced). Locking a locked memory succeeds again."
    ),
    input_schema=object_schema({
        "agent_id": _OWNER,
        "memory_id": _memory_id("lock"),
        "session_key": SESSION_KEY,
    }, required=["memory_id"]),
    annotations=_EDIT,
    service="cpersona.services.admin:lock_memory",
)

UNLOCK_MEMORY = ToolSpec(
    name="unlock_memory",
    description=(
        "Unlock one memory, so that delete_memory and update_memory may change it again. When agent_id is "
        "given, the memory must belong to that agent (ownership is enforced)."
    ),
    input_schema=object_schema({
        "agent_id": _OWNER,
        "memory_id": _memory_id("unlock"),
        "session_key": SESSION_KEY,
    }, required=["memory_id"]),
    annotations=_EDIT,
    service="cpersona.services.admin:unlock_memory",
)

# delete_agent_data sits apart from the by-id tools in the reference's list; the
# by-id tools keep the reference's relative order.
TOOLS = [DELETE_AGENT_DATA, DELETE_MEMORY, DELETE_EPISODE, UPDATE_MEMORY, LOCK_MEMORY, UNLOCK_MEMORY]
