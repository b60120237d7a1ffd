"""Searching memory: ``recall``."""

from __future__ import annotations

from cpersona.mcp.registry import READ_ONLY, READ_PROJECT, Ref, ServiceRef, ToolSpec
from cpersona.mcp.tools.common import AGENT_ID, PROJECT_ID_FILTER, SESSION_KEY, object_schema, prop, recall_refusal

RECALL_DESCRIPTION = (
    "Search an agent's memories and episodes with several retrievers at once (vector similarity, FTS5 "
    "full text, keywords). When the goal is to answer a question from memory, reconstruct is the better "
    "tool: its items quote the rows that support them, within a character budget. "
    "ORDER: rows come back from least to most relevant, so the LAST row is the best match. "
    "gate_fallback:true (never present otherwise) means every candidate fell below the quality gate and "
    "the lexical matches below it were returned instead: treat them as weak. That rescue only happens with "
    "CPERSONA_CONFIDENCE_ENABLED=true and CPERSONA_CONFIDENCE_ORDERING=legacy; in every other setup a "
    "recall whose candidates all fail the gate returns no rows. "
    "By default content is a preview: the start of the record. A row the preview cut also carries excerpt, "
    "the part of the record that matched the query (up to 800 characters, set by "
    "CPERSONA_RECALL_EXCERPT_CHARS, 0 turns it off; separate passages joined by ' … ' in text order), and "
    "excerpt_basis, how it was chosen. Read the excerpt before expanding a row's ref with get_contents. "
    "full_content=true returns whole rows instead, up to 200,000 characters per answer: rows beyond that "
    "fall back to the preview and the answer carries full_content_budget_chars. "
    "Each scored row carries match_reason {signal, score, ...}: signal names the score the quality gate "
    "judged (rsf, else cosine, else rrf), the other keys are each retriever's contribution, and prior is the "
    "age weight when one ordered the row. Rows without a score (cascade full-text and keyword rows) have no "
    "match_reason. When confidence scoring is on, its score is shown beside each row but neither orders nor "
    "gates it, unless CPERSONA_CONFIDENCE_ORDERING=legacy."
)

_TIME_CUE = {
    "type": "object",
    "description": (
        "When you remember the answer being stored: after and/or before (a date YYYY-MM-DD covering that whole "
        "day, or an ISO-8601 timestamp), or ago, plus how sure you are. That period is searched as well; among "
        "the rows returned anyway, one found there moves up by at most 3 / 2 / 1 places (sure / likely / "
        "vague), and as many extra seats hold the best records found there that the answer lacks. No row is "
        "removed or re-scored. An empty period is widened once, by one confidence step (likely: half its "
        "length on each side, vague: its whole length). The answer then carries time_cue: the period searched, "
        "whether it was widened, rows moved, seats used. Give a cue only when the request itself names a time "
        "('last week', 'in March'); never fill in today's date or a guess. A period starting within the last "
        "24 hours is ignored (time_cue says ignored). A cue that cannot be read is an error and returns no rows."
    ),
    "properties": {
        "after": {"type": "string"},
        "before": {"type": "string"},
        "ago": {
            "description": (
                'Relative to now: {"unit": "days" | "weeks" | "months", "value": N} is the period one '
                'unit long centred N units ago (a month counts 30 days); "long_ago" is the oldest third of '
                "what this scope holds."
            ),
            "oneOf": [
                {
                    "type": "object",
                    "properties": {
                        "unit": {"type": "string", "enum": ["days", "weeks", "months"]},
                        "value": {"type": "integer", "minimum": 0},
                    },
                    "required": ["unit", "value"],
                    "additionalProperties": False,
                },
                {"type": "string", "enum": ["long_ago"]},
            ],
        },
        "confidence": {"type": "string", "enum": ["sure", "likely", "vague"]},
    },
    "required": ["confidence"],
    "additionalProperties": False,
}

RECALL = ToolSpec(
    name="recall",
    contracts="memory-and-recall.md §3.2",
    description=RECALL_DESCRIPTION,
    input_schema=object_schema(
        {
            "agent_id": AGENT_ID,
            "query": {
                "type": "string",
                "description": "What to look for. An empty query returns the most recent memories.",
            },
            "limit": {
                "type": "integer",
                "description": (
                    "How deep each retriever searches as well as how many rows come back: lowering it shrinks the "
                    "candidate pool itself, so a smaller limit can return different rows, not only fewer. Fewer rows "
                    "than this is normal; rows held by other features (time_cue seats) can add a few."
                ),
                "default": 10,
                "minimum": 0,
                "maximum": 100,
            },
            "deep": {
                "type": "boolean",
                "description": (
                    "Admit weaker matches: halves the quality gate. It also switches off time and completion decay "
                    "(only active with CPERSONA_CONFIDENCE_ENABLED=true) but does not search further back than the "
                    "scan window (CPERSONA_MAX_MEMORIES)."
                ),
                "default": False,
            },
            "channel": {
                "type": "string",
                "description": "Only this channel (e.g. 'chat', 'discord') plus memories stored without one. '' (default) reads every channel.",
            },
            "exclude_contents": {
                "type": "array",
                "items": {"type": "string"},
                "description": (
                    "Texts the caller already has, normalised (stripped, lower-cased), kept out of the results. An "
                    "entry of 32 characters or more excludes every memory that starts with it; a shorter entry only "
                    "excludes a memory equal to it, so a short prefix cannot silently hide everything beginning with it."
                ),
            },
            "session_key": prop(
                SESSION_KEY,
                description=(
                    "A session name you choose; it is not a credential. It keeps this server's per-session memory "
                    "(whether the degraded-recall advisory was already shown) and picks which no-persist pause applies. "
                    "It never filters stored data (agent_id, project_id and channel do that). Callers that omit it share "
                    "one bucket."
                ),
            ),
            "project_id": PROJECT_ID_FILTER,
            "source_id": {
                "type": "string",
                "description": (
                    "Only memories whose source id matches; '' (default) means no filter. A value ending in a letter "
                    "or digit must equal the id (e.g. 'discord:12345' for one Discord user); a value ending in any "
                    "other character is a prefix (e.g. 'discord:'). Episodes carry no source, so they are left out "
                    "when this is set, unless channel is set too."
                ),
                "default": "",
            },
            "full_content": {
                "type": "boolean",
                "default": False,
                "description": (
                    "Return whole rows instead of previews. By default a row longer than "
                    "CPERSONA_RECALL_PREVIEW_CHARS (500) is cut to its start and marked content_truncated with "
                    "content_len; its ref expands through get_contents."
                ),
            },
            "trace": {
                "type": "boolean",
                "default": False,
                "description": (
                    "Declared for compatibility and not carried out: this server builds no recall trace, so "
                    "trace=true is refused (ok=false, nothing searched) rather than answered without one. "
                    "Leave it false; reconstruct's trace explains its own answers."
                ),
            },
            "time_cue": _TIME_CUE,
        },
        required=["agent_id", "query"],
    ),
    annotations=READ_ONLY,
    service=ServiceRef("cpersona.services.recall.service", "answer_recall"),
    request=Ref("cpersona.services.recall.service", "RecallArguments"),
    project=READ_PROJECT,
    unsupported=frozenset({"trace"}),  # refused when set, rather than answered as if absent
    refusal=recall_refusal,
)

TOOLS = [RECALL]
