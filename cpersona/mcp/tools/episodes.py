"""Conversation episodes: ``archive_episode``."""

from __future__ import annotations

from cpersona.mcp.pause_gate import NO_PERSIST, Skip, const
from cpersona.mcp.registry import WRITE_PROJECT, Annotations, Ref, ServiceRef, ToolSpec
from cpersona.mcp.tools.common import (
    AGENT_ID,
    CHANNEL_FOR_WRITE,
    PROJECT_ID_FOR_WRITE,
    SESSION_KEY,
    episode_refusal,
    object_schema,
    prop,
)

ARCHIVE_EPISODE = ToolSpec(
    name="archive_episode",
    contracts="memory-and-recall.md §3.5",
    description=(
        "Archive a finished conversation as an episode, from a summary, keywords and a resolved flag that "
        "the caller has already worked out: the server runs no language model and summarises nothing. "
        "When the summary is longer than the embedding window, the answer adds nodes:{status:'queued'}, "
        "as store does."
    ),
    input_schema=object_schema(
        {
            "agent_id": AGENT_ID,
            "history": {
                "type": "array",
                "description": (
                    "The conversation's messages. Only their timestamps are read, to date the episode's start and "
                    "end; the episode's vector is computed from the summary."
                ),
                "items": {"type": "object"},
            },
            "summary": {"type": "string", "description": "The episode summary, written by the caller."},
            "keywords": {"type": "string", "description": "Keywords separated by spaces, chosen by the caller."},
            "resolved": {"type": "boolean", "description": "Whether the topic reached a conclusion."},
            "project_id": PROJECT_ID_FOR_WRITE,
            "channel": prop(
                CHANNEL_FOR_WRITE,
                description=(
                    "Conversation channel (e.g. a Discord channel id); '' (default) leaves the episode unscoped. A "
                    "channel-scoped recall returns the episodes of its channel."
                ),
            ),
            "session_key": SESSION_KEY,
        },
        required=["agent_id", "summary"],
    ),
    annotations=Annotations(read_only=False, destructive=False, idempotent=False),
    service=ServiceRef("cpersona.services.records.episodes", "answer_archive_episode"),
    request=Ref("cpersona.services.records.episodes", "EpisodeArchiveArguments"),
    project=WRITE_PROJECT,
    paused=Skip(const({"ok": True, "queued": False, "task_id": None, "episode_id": None, "id": NO_PERSIST})),
    refusal=episode_refusal,
    meta={"anthropic/alwaysLoad": True},
)

TOOLS = [ARCHIVE_EPISODE]
