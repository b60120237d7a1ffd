"""Searching memory alongside the caller's conversation: ``recall_with_context``."""

from __future__ import annotations

from cpersona.mcp.registry import READ_ONLY, READ_PROJECT, Ref, ServiceRef, ToolSpec
from cpersona.mcp.tools.common import AGENT_ID, PROJECT_ID_FILTER, SESSION_KEY, object_schema, prop, recall_refusal

DESCRIPTION = (
    "Run a recall and merge its rows with conversation turns you already hold, returning one list sorted by time "
    "(oldest first) instead of by relevance, so you do not have to recall and merge by hand. "
    "Duplicates are removed: every external_context entry's content keeps recall from returning a row with that "
    "text (you already have it), whatever the entry's role; only role=user and role=assistant entries are merged "
    "into messages. When entries of other roles were sent, the answer carries context_filter_only={roles:[...]}: "
    "those entries filtered the recall but are not shown, whether or not they removed a row this time. "
    "Each entry field is a string; a field holding anything else is treated as absent, the entry is merged "
    "without it, and context_field_issues={entries:[{index, fields}]} (absent otherwise) names it. With "
    "CPERSONA_EXTERNAL_CONTEXT_MODE=reject such a call is refused instead (off: no report). "
    "Recalled rows are preview-tiered as in recall: a row the preview cut keeps its ref for get_contents and "
    "carries excerpt / excerpt_basis; full_content=true returns whole rows within the same 200,000-character "
    "budget as recall, spent from the newest end of the list. Merged turns are returned as you sent them "
    "(trimmed), never cut. "
    "gate_fallback=true (absent otherwise) is passed on from the underlying recall: every candidate fell below "
    "the quality gate and the lexical matches below it were returned, so treat them as weak. That only happens "
    "with CPERSONA_CONFIDENCE_ENABLED=true and CPERSONA_CONFIDENCE_ORDERING=legacy; otherwise such a recall adds "
    "no rows."
)

_STRING_FIELD = " A string; any other value is treated as absent and reported in context_field_issues."

RECALL_WITH_CONTEXT = ToolSpec(
    name="recall_with_context",
    contracts="memory-and-recall.md §3.3",
    description=DESCRIPTION,
    input_schema=object_schema(
        {
            "agent_id": AGENT_ID,
            "query": {"type": "string", "description": "What to look for, as in recall."},
            "external_context": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "role": {
                            "description": (
                                "'user' or 'assistant' to merge the entry into messages; any other role only filters "
                                "the recall." + _STRING_FIELD
                            )
                        },
                        "content": {"description": "The turn's text." + _STRING_FIELD},
                        "name": {
                            "description": (
                                "Who spoke, for a role=user entry: source.name, and source.id when user_id is missing. "
                                "Defaults to 'User'." + _STRING_FIELD
                            )
                        },
                        "user_id": {
                            "description": (
                                "A stable id for the speaker of a role=user entry, shown as source.id "
                                "'discord:<user_id>'." + _STRING_FIELD
                            )
                        },
                        "timestamp": {
                            "description": (
                                "ISO-8601 time of the turn; it decides where the entry sorts. An entry without one, or "
                                "with text that is not a point in time, sorts before every dated message."
                                + _STRING_FIELD
                            )
                        },
                    },
                },
                "description": (
                    "Conversation turns you already hold: [{role, content, name?, user_id?, timestamp?}, ...]. Every "
                    "field is a string; one that is not is treated as absent and reported in context_field_issues "
                    "(see CPERSONA_EXTERNAL_CONTEXT_MODE)."
                ),
            },
            "limit": {
                "type": "integer",
                "description": (
                    "Depth of each retriever in the underlying recall as well as how many rows it returns, exactly as "
                    "recall's limit: lowering it shrinks the candidate pool, not only the answer. Merged turns do not "
                    "count against it."
                ),
                "default": 10,
                "minimum": 0,
                "maximum": 100,
            },
            "channel": {"type": "string", "description": "Channel filter, as in recall."},
            "deep": {
                "type": "boolean",
                "description": "Admit weaker matches, as in recall: halves the quality gate.",
                "default": False,
            },
            "project_id": prop(
                PROJECT_ID_FILTER,
                description=(
                    "Project filter passed to the recall, as in recall: omitted reads every project, '' only the global "
                    "pool, 'X' the project X together with the global pool. '@auto' asks for this agent's default "
                    "project from the server's operating context and is echoed as resolved_project_id; without an "
                    "operating context it is taken literally. Check resolved_project_id before relying on it."
                ),
            ),
            "source_id": {
                "type": "string",
                "description": "Per-user source filter passed to the recall, as in recall.",
                "default": "",
            },
            "full_content": {
                "type": "boolean",
                "default": False,
                "description": "Return whole recalled rows instead of previews, as in recall (200,000-character budget).",
            },
            "session_key": prop(
                SESSION_KEY,
                description=(
                    "A session name you choose; it is not a credential. It keeps this server's per-session memory "
                    "(whether the degraded-recall advisory was already shown) and picks which no-persist pause applies. "
                    "It never filters stored data. Callers that omit it share one bucket."
                ),
            ),
        },
        required=["agent_id", "query"],
    ),
    annotations=READ_ONLY,
    service=ServiceRef("cpersona.services.recall.with_context", "answer_with_context"),
    request=Ref("cpersona.services.recall.with_context", "ContextArguments"),
    project=READ_PROJECT,
    refusal=recall_refusal,
)

TOOLS = [RECALL_WITH_CONTEXT]
