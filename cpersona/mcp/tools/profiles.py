"""Agent profiles: ``get_profile`` and ``update_profile``."""

from __future__ import annotations

from cpersona.mcp.pause_gate import Skip, const
from cpersona.mcp.registry import READ_ONLY, Annotations, Ref, ServiceRef, ToolSpec
from cpersona.mcp.tools.common import AGENT_ID, SESSION_KEY, object_schema, profile_update_refusal

GET_PROFILE = ToolSpec(
    name="get_profile",
    contracts="memory-and-recall.md §3.7",
    description="Read an agent's current profile ('' when it has none).",
    input_schema=object_schema({"agent_id": AGENT_ID}, required=["agent_id"]),
    annotations=READ_ONLY,
    service=ServiceRef("cpersona.services.records.profiles", "answer_get_profile"),
    request=Ref("cpersona.services.records.profiles", "ProfileArguments"),
)

UPDATE_PROFILE = ToolSpec(
    name="update_profile",
    contracts="memory-and-recall.md §3.8",
    description=(
        "Replace an agent's profile with text the caller has already written. The text is cleaned the same "
        "way store cleans content, against the profile's own limit: at most 2000 characters "
        "(CPERSONA_MAX_PROFILE_LENGTH). When the limit cut it the answer says truncated:true — check for it, "
        "because the cut-off part is not kept anywhere."
    ),
    input_schema=object_schema(
        {
            "agent_id": AGENT_ID,
            "profile": {
                "type": "string",
                "description": (
                    "The profile text, prepared by the caller. Longer than 2000 characters "
                    "(CPERSONA_MAX_PROFILE_LENGTH) is cut, and the answer then says truncated:true."
                ),
            },
            "session_key": SESSION_KEY,
        },
        required=["agent_id", "profile"],
    ),
    annotations=Annotations(read_only=False, destructive=False),
    service=ServiceRef("cpersona.services.records.profiles", "answer_update_profile"),
    request=Ref("cpersona.services.records.profiles", "ProfileUpdateArguments"),
    paused=Skip(const({"ok": True, "profiles_updated": 0})),
    refusal=profile_update_refusal,
)

TOOLS = [GET_PROFILE, UPDATE_PROFILE]
