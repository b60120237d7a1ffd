"""Editing and removing records: ``delete_agent_data``, ``delete_memory``, ``delete_episode``,
``update_memory``, ``lock_memory``, ``unlock_memory``."""

from __future__ import annotations

from cpersona.mcp.pause_gate import Skip, const
from cpersona.mcp.registry import Annotations, Ref, ServiceRef, ToolSpec
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


_SERVICES = "cpersona.services.records.admin"
_ROW_IDS = {"memory": ("memory_id", "mem"), "episode": ("episode_id", "ep")}


def _one_row_tool(
    name: str,
    contracts: str,
    description: str,
    *,
    row: str,
    verb: str,
    annotations: Annotations,
    acted_on: str,
    request: str,
    more: dict[str, object] | None = None,
) -> ToolSpec:
    """A tool acting on one row found by id, owner-checked when agent_id is given.

    Arguments, in order: agent_id, the row's id, ``more`` (all required), session_key.
    Its answer names the row it acted on in ``acted_on``, which is null while paused.
    ``request``: its request dataclass in the service module, whose ``answer_<name>`` takes it.
    """
    id_field, ref_kind = _ROW_IDS[row]
    row_id = {"type": "integer", "description": f"Id of the {row} to {verb} (the number in {ref_kind}:<id>)."}
    return ToolSpec(
        name=name,
        contracts=contracts,
        description=description,
        input_schema=object_schema(
            {"agent_id": _OWNER, id_field: row_id, **(more or {}), "session_key": SESSION_KEY},
            required=[id_field, *(more or {})],
        ),
        annotations=annotations,
        service=ServiceRef(_SERVICES, f"answer_{name}"),
        request=Ref(_SERVICES, request),
        paused=Skip(const({"ok": True, acted_on: None})),
    )


DELETE_AGENT_DATA = ToolSpec(
    name="delete_agent_data",
    contracts="admin-and-safety.md §5",
    description=(
        "Remove everything one agent has: all its memories (locked ones too), its profile and its episodes, "
        "with its queued tasks and declared associations. Meant for when the agent itself is being deleted."
    ),
    input_schema=object_schema(
        {
            "agent_id": {"type": "string", "description": "The agent whose data is removed; '' is refused."},
            "session_key": SESSION_KEY,
        },
        required=["agent_id"],
    ),
    annotations=_DESTRUCTIVE,
    service=ServiceRef(_SERVICES, "answer_delete_agent_data"),
    request=Ref(_SERVICES, "AgentArguments"),
    paused=Skip(
        lambda _app, args: {  # DAD-5: the pause comes before the empty-id check
            "ok": True,
            "agent_id": args.get("agent_id", ""),
            "deleted_memories": 0,
            "deleted_profiles": 0,
            "deleted_episodes": 0,
            "deleted_pending_tasks": 0,
        }
    ),
)

DELETE_MEMORY = _one_row_tool(
    "delete_memory",
    "admin-and-safety.md §2",
    "Delete one memory by its id; a locked memory is refused. When agent_id is given, the memory must "
    "belong to that agent (ownership is enforced).",
    row="memory",
    verb="delete",
    annotations=_DESTRUCTIVE,
    acted_on="deleted_id",
    request="MemoryRowArguments",
)

DELETE_EPISODE = _one_row_tool(
    "delete_episode",
    "admin-and-safety.md §3",
    "Delete one episode by its id. When agent_id is given, the episode must belong to that agent "
    "(ownership is enforced).",
    row="episode",
    verb="delete",
    annotations=_DESTRUCTIVE,
    acted_on="deleted_id",
    request="EpisodeRowArguments",
)

UPDATE_MEMORY = _one_row_tool(
    "update_memory",
    "memory-and-recall.md §3.6",
    "Replace the text of one memory, found by id. A locked memory is refused, and when agent_id is given "
    "the memory must belong to that agent (ownership is enforced). The new text is cleaned as store cleans "
    "content: '[Memory from ...]' annotations are removed, so a text made only of them is refused instead "
    "of leaving an empty row, and it is cut to the content length limit, in which case the answer says "
    "truncated:true. If another memory of the same agent, project and channel already holds exactly that "
    "text, the edit is refused with ok:false naming that memory: each bucket keeps one copy. The memory "
    "is embedded again from its new text. A new text longer than the embedding window is answered with "
    "nodes:{status:'queued'}, as store does.",
    row="memory",
    verb="edit",
    annotations=_EDIT,
    acted_on="updated_id",
    more={"content": {"type": "string", "description": "The memory's new text; it replaces the old one entirely."}},
    request="MemoryUpdateArguments",
)

LOCK_MEMORY = _one_row_tool(
    "lock_memory",
    "admin-and-safety.md §4",
    "Lock one memory so that delete_memory and update_memory refuse it. A lock does not stop an operator "
    "from re-filing it: migrate_channel_axis and merge_memories in move mode still relocate it, and it "
    "stays locked there; delete_agent_data still removes it. When agent_id is given, the memory must "
    "belong to that agent (ownership is enforced). Locking a locked memory succeeds again.",
    row="memory",
    verb="lock",
    annotations=_EDIT,
    acted_on="locked_id",
    request="MemoryRowArguments",
)

UNLOCK_MEMORY = _one_row_tool(
    "unlock_memory",
    "admin-and-safety.md §4",
    "Unlock one memory, so that delete_memory and update_memory may change it again. When agent_id is "
    "given, the memory must belong to that agent (ownership is enforced).",
    row="memory",
    verb="unlock",
    annotations=_EDIT,
    acted_on="unlocked_id",
    request="MemoryRowArguments",
)

# delete_agent_data sits apart from the by-id tools in the reference's list; the
# by-id tools keep the reference's relative order.
TOOLS = [DELETE_AGENT_DATA, DELETE_MEMORY, DELETE_EPISODE, UPDATE_MEMORY, LOCK_MEMORY, UNLOCK_MEMORY]
