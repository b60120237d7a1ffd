"""Writing memories: ``store``."""

from __future__ import annotations

import dataclasses

from cpersona.mcp.demands import WRITE_AGENT
from cpersona.mcp.pause_gate import NO_PERSIST, Skip, const
from cpersona.mcp.registry import WRITE_PROJECT, Annotations, Ref, ServiceRef, ToolSpec
from cpersona.mcp.tools.common import (
    AGENT_ID,
    CHANNEL_FOR_WRITE,
    KEY_FIELD_MAX,
    PROJECT_ID_FOR_WRITE,
    SESSION_KEY,
    lock_flag,
    object_schema,
    prop,
    store_refusal,
)

STORE_DESCRIPTION = (
    "Save one memory so a later recall can find it; the text goes in content. "
    "agent_id can be left out only on a connection allowed to write to exactly one agent, and the agent "
    "chosen is then reported as resolved_agent_id; source defaults to that agent. "
    "With lock:true the memory is also locked, exactly as lock_memory would, and locked:true|false says "
    "whether that happened. "
    "Branch on result, which every answer carries: "
    "'stored' means a new row was written (its id; embedded tells whether a vector was kept; "
    "truncated:true when content was cut to the length cap; nodes:{status:'queued'} when the text is "
    "longer than the embedding window and its overflow-tree nodes were queued). "
    "'skipped' means nothing was written and nothing is wrong: the id was already used, or the same "
    "content is already stored under the same source id, and the existing row's id is returned — except "
    "for reason 'duplicate (unique index)', a race between concurrent writes, which carries no id. "
    "'rejected' comes with ok:false: nothing was written, and reason explains why in words meant for "
    "people (not a code to match on). "
    "While pause_persistence is active the write is skipped with persisted:false and id 'no-persist', "
    "which is how a paused write differs from a duplicate. "
    "The older form message={content, id, source, timestamp, metadata} is still accepted; send either "
    "it or the top-level fields, never both."
)

_MESSAGE_FORM = {
    "type": "object",
    "description": "Older way of sending content, id, source, timestamp and metadata in one object.",
    "properties": {
        "content": {"type": "string"},
        "id": {"type": "string", "maxLength": KEY_FIELD_MAX},
        "source": {
            "type": ["object", "string", "null"],
            "description": "Besides an object, a bare word 'user' or 'assistant'; null is stored as the unknown producer {}.",
        },
        "timestamp": {"type": "string", "maxLength": 64},
        "metadata": {"type": "object"},
    },
}

STORE = ToolSpec(
    name="store",
    contracts="memory-and-recall.md §3.1",
    description=STORE_DESCRIPTION,
    input_schema=object_schema(
        {
            "content": {
                "type": "string",
                "description": (
                    "The text to remember. Any '[Memory from …]' annotation in it is removed; text that is empty "
                    "afterwards is refused (ok:false, result:'rejected')."
                ),
            },
            "agent_id": prop(
                AGENT_ID,
                description=(
                    "The agent the memory belongs to. Can be left out only when this connection may write to exactly "
                    "one agent."
                ),
            ),
            "id": {
                "type": "string",
                "maxLength": KEY_FIELD_MAX,
                "description": "Your own id for this memory: storing again with the same id in the same project is skipped as a duplicate.",
            },
            "source": {
                "type": "object",
                "description": (
                    "Who produced the content, as {type, id, name}. Defaults to {type:'Agent', id:<agent_id>}; "
                    "send {} only when the producer is unknown."
                ),
                "properties": {
                    "type": {
                        "type": "string",
                        "description": (
                            "'User', 'Agent' or 'System', matched without regard to case; the older words 'ai' and "
                            "'assistant' become 'Agent' and 'session' becomes 'System'."
                        ),
                    },
                    "id": {"type": "string"},
                    "name": {"type": "string"},
                },
            },
            "timestamp": {
                "type": "string",
                "maxLength": 64,
                "description": "When it happened, ISO-8601 with an offset (e.g. '2026-07-22T12:00:00+00:00'). Defaults to now.",
            },
            "metadata": {
                "type": "object",
                "description": (
                    "Any JSON object. Serialised it may take at most 8000 characters (so may source); a larger one "
                    "is refused, never cut."
                ),
            },
            "lock": {
                "type": "boolean",
                "description": "Also lock the memory against editing and deletion. Default false.",
                "default": False,
            },
            "message": _MESSAGE_FORM,
            "channel": prop(
                CHANNEL_FOR_WRITE,
                description=(
                    "Channel that keeps this memory apart from other conversations (e.g. 'chat'). '' (the default) "
                    "is shared by every channel."
                ),
            ),
            "project_id": prop(
                PROJECT_ID_FOR_WRITE,
                description=(
                    "Project bucket; omit or '' for the global pool, which a recall in project 'X' reads together "
                    "with 'X'. '@auto' takes this agent's default project from the operating context and reports it "
                    "as resolved_project_id; with no operating context configured it is stored as the literal '@auto'."
                ),
            ),
            "session_key": SESSION_KEY,
            "associations": {
                "type": "object",
                "description": (
                    "Entities and relations to declare against this memory, in declare_associations' form: "
                    "{entities: [{name, aliases}], relations: [{subject, predicate, object}]}, where subject and "
                    "object are entity names or 'mem:<id>' / 'ep:<id>' refs. Malformed items are listed in the "
                    "answer's associations.dropped and skipped; the memory is stored either way."
                ),
            },
        }
    ),
    annotations=Annotations(read_only=False, destructive=False, idempotent=True),
    service=ServiceRef("cpersona.services.records.memories", "answer_store"),
    request=Ref("cpersona.services.records.memories", "StoreArguments"),
    precheck=Ref(
        "cpersona.services.records.memories", "check_boundary"
    ),  # ST-2 steps 1-2, ahead of the project registry and the pause
    project=WRITE_PROJECT,
    # ACL-17/18: an omitted agent is the client's one writable agent; ACL-15: a denial says rejected.
    access=dataclasses.replace(WRITE_AGENT, fills_agent=True, says_rejected=True),
    paused=Skip(const({"ok": True, "result": "skipped", "id": NO_PERSIST, "embedded": False}), after=lock_flag),
    refusal=store_refusal,
    meta={"anthropic/alwaysLoad": True},
)

TOOLS = [STORE]
