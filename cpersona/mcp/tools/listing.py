"""Dashboard listings: ``list_memories`` and ``list_episodes``."""

from __future__ import annotations

from cpersona.mcp.registry import READ_ONLY, READ_PROJECT, Ref, ServiceRef, ToolSpec
from cpersona.mcp.tools.common import PROJECT_ID_FILTER, object_schema, prop

_ALL_AGENTS = {"type": "string", "description": "The agent to list; omit or '' to list every agent."}

LIST_MEMORIES = ToolSpec(
    name="list_memories",
    contracts="memory-and-recall.md §3.9",
    description=(
        "List an agent's most recent memories, newest first, for display on a dashboard. "
        "limit is capped at 500 rows; when more were asked for and rows beyond the cap exist, the answer "
        "carries budget_rows (the cap), so a capped list can be told apart from one that reached the end — "
        "get the rest with export_memories or a narrower filter, not a larger limit. "
        "The rows also share a budget of 1,000,000 characters of content. No row is ever dropped for it: "
        "once it is spent, each later row longer than the preview cap (CPERSONA_RECALL_PREVIEW_CHARS, 500 by "
        "default) is cut to its start and marked content_truncated with content_len, plus a ref that "
        "get_contents expands under that row's own agent_id (in a list of every agent, use the row's agent_id "
        "field). budget_chars appears exactly when at least one row was cut. The most an answer holds is "
        "therefore the budget, one whole row and the cut rows' starts; a preview cap of 0 turns both the "
        "cutting and the budget off."
    ),
    input_schema=object_schema(
        {
            "agent_id": _ALL_AGENTS,
            "limit": {"type": "integer", "description": "Most memories to return (capped at 500).", "default": 100},
            "project_id": PROJECT_ID_FILTER,
        },
        required=[],
    ),
    annotations=READ_ONLY,
    service=ServiceRef("cpersona.services.records.listing", "answer_list_memories"),
    request=Ref("cpersona.services.records.listing", "ListArguments"),
    project=READ_PROJECT,
)

LIST_EPISODES = ToolSpec(
    name="list_episodes",
    contracts="memory-and-recall.md §3.10",
    description=(
        "List an agent's archived episodes, newest first, for display on a dashboard. "
        "limit is capped at 200 rows; when more were asked for and rows beyond the cap exist, the answer "
        "carries budget_rows (the cap) — get the rest with export_memories or a narrower filter, not a larger "
        "limit. Summary and keywords together share a budget of 800,000 characters, with the same rules as "
        "list_memories: no row is dropped, and once the budget is spent each field longer than the preview cap "
        "is cut to its start and marked summary_truncated/summary_len or keywords_truncated/keywords_len; "
        "budget_chars appears exactly when something was cut. A cut row's ref expands the summary through "
        "get_contents (under the row's own agent_id); the full keywords are only available through "
        "export_memories."
    ),
    input_schema=object_schema(
        {
            "agent_id": _ALL_AGENTS,
            "limit": {"type": "integer", "description": "Most episodes to return (capped at 200).", "default": 50},
            "project_id": prop(PROJECT_ID_FILTER),
        },
        required=[],
    ),
    annotations=READ_ONLY,
    service=ServiceRef("cpersona.services.records.episodes", "answer_list_episodes"),
    request=Ref("cpersona.services.records.episodes", "EpisodeListArguments"),
    project=READ_PROJECT,
)

TOOLS = [LIST_MEMORIES, LIST_EPISODES]
