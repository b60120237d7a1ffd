"""The no-persist pause: ``pause_persistence``, ``resume_persistence``, ``persistence_status``."""

from __future__ import annotations

from cpersona.mcp.demands import ANY_PRINCIPAL, PAUSE_BUCKET, RESUME_BUCKET
from cpersona.mcp.pause_gate import PassThrough
from cpersona.mcp.registry import READ_ONLY, Annotations, Ref, ServiceRef, ToolSpec
from cpersona.mcp.tools.common import SESSION_KEY, object_schema, prop

_SESSION_KEY = prop(
    SESSION_KEY,
    description=(
        "A session name you choose. It selects which pause bucket this call arms, clears or reports; it is not a "
        "credential and filters no data. Omit it to use the one bucket shared by every caller that omits it."
    ),
)

PAUSE_PERSISTENCE = ToolSpec(
    name="pause_persistence",
    contracts="admin-and-safety.md §9.2",
    description=(
        "Stop this server from writing for a while: the pause lasts ttl_seconds (default 1800, at most 86400) "
        "and ends by itself. While it lasts every write tool (store, declare_associations, archive_episode, "
        "update_memory, delete_memory, delete_episode, delete_agent_data, lock_memory, unlock_memory, "
        "update_profile, import_memories, merge_memories, calibrate_threshold, set_recall_precision) writes "
        "nothing and answers a no-op carrying persisted:false, dry_run:true and a reason that says how much "
        "of the pause is left. Test persisted:false to tell a paused answer apart, not an id: store and "
        "archive_episode answer id 'no-persist', and deleted_id / updated_id / locked_id / unlocked_id / "
        "episode_id are null. migrate_channel_axis is run as a dry run instead and says repairs_skipped "
        "(it has no persisted key); check_health and deep_check run with fix=false and say repairs_skipped:true. "
        "Reads answer as usual, except that recall stops counting recall_count / last_recalled_at. "
        "Who is affected depends on session_key (the answer's scope): with a key, only calls that send the "
        "same key are paused (scope 'session'); a call with another key is neither paused by it nor able to "
        "resume it; the key is a label, not a secret, so anyone sending the same string shares the pause. "
        "Without a key you pause the bucket all keyless callers share (scope 'process'): over streamable "
        "HTTP one process serves every client, so every other keyless session stops writing too, without "
        "being told, until resume or the end of the TTL; over stdio that bucket is just this session. "
        "Only this server is paused; other servers must be paused on their own."
    ),
    input_schema=object_schema(
        {
            "ttl_seconds": {
                "type": "integer",
                "description": "How long the pause lasts before writing resumes by itself, in seconds: 1 to 86400, default 1800.",
                "default": 1800,
                "minimum": 1,
                "maximum": 86400,
            },
            "session_key": _SESSION_KEY,
        }
    ),
    annotations=Annotations(read_only=False, destructive=False, idempotent=True),
    service=ServiceRef("cpersona.services.operations.pause", "answer_pause_persistence"),
    request=Ref("cpersona.services.operations.pause", "PauseArguments"),
    access=PAUSE_BUCKET,
    paused=PassThrough(),  # the pause tools manage the pause itself (P-12)
)

RESUME_PERSISTENCE = ToolSpec(
    name="resume_persistence",
    contracts="admin-and-safety.md §9.3",
    description=(
        "End a pause now, so writes persist again. Only the bucket session_key selects is cleared (the "
        "answer's scope): with a key, your own pause and nobody else's; without one, the bucket all keyless "
        "callers share, which over streamable HTTP lets every other keyless session write again too. "
        "was_active:true means that bucket was paused just before this call."
    ),
    input_schema=object_schema({"session_key": _SESSION_KEY}),
    annotations=Annotations(read_only=False, destructive=False, idempotent=True),
    service=ServiceRef("cpersona.services.operations.pause", "answer_resume_persistence"),
    request=Ref("cpersona.services.operations.pause", "SessionArguments"),
    access=RESUME_BUCKET,
    paused=PassThrough(),
)

PERSISTENCE_STATUS = ToolSpec(
    name="persistence_status",
    contracts="admin-and-safety.md §9.4",
    description=(
        "Say whether writes are paused and how many seconds of the pause remain (ttl_remaining_seconds). "
        "It answers for the bucket session_key selects (the answer's scope), not for the whole server: with "
        "a key, paused:false only means your session is not paused, not that no other session is; without "
        "one it reports the bucket all keyless callers share, so over streamable HTTP paused:true may come "
        "from a pause another keyless session set."
    ),
    input_schema=object_schema({"session_key": _SESSION_KEY}),
    annotations=READ_ONLY,
    service=ServiceRef("cpersona.services.operations.pause", "answer_persistence_status"),
    request=Ref("cpersona.services.operations.pause", "SessionArguments"),
    access=ANY_PRINCIPAL,
)

TOOLS = [PAUSE_PERSISTENCE, RESUME_PERSISTENCE, PERSISTENCE_STATUS]
