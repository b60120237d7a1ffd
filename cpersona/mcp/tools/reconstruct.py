"""Answering from memory: ``reconstruct`` (spec associations-and-reconstruct §8)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cpersona.mcp.registry import READ_ONLY, READ_PROJECT, Ref, ServiceRef, ToolSpec
from cpersona.mcp.tools.common import AGENT_ID, KEY_FIELD_MAX, PROJECT_ID_FILTER, object_schema
from cpersona.services.responses import failure

DESCRIPTION = (
    "The recommended way to answer a question from memory. Returns up to count items; each item quotes, word "
    "for word, the record most relevant to it (content, head_ref) and lists the rows that back it as claims, "
    "newest first, each with its timestamp (as_of), why it is there (absent = a search hit; cluster:episode, "
    "cluster:adjacent, relation:<predicate>, ...) and roles such as supports or corrects. Other claims are "
    "quoted briefly in excerpts. No model is called, nothing is summarised and no stored row is changed. "
    "count is a ceiling, not a target: fewer items is normal and shortfall_reason says why. budget bounds the "
    "characters of quoted text (claims and refs are free); when it cut something, effective_budget and "
    "used_budget appear. top_k (candidate depth), max_hops (steps over declared relations) and max_evidence "
    "(rows kept per item) bound the work and never change count; bounds reports when they cut. A quote that "
    "shows only part of a record carries content_len, ranges and an expand entry to pass to get_contents. "
    "Declared associations (declare_associations) widen the keyword search and add walked evidence inside "
    "items, never new items. mode 'lite' or 'pro' caps the answer's tokens (3,000 / 5,000) with a compact "
    "shape; trace=true returns the full audit."
)

_TIME_CUE = {
    "type": "object",
    "description": (
        "When you remember the answer being stored, as in recall: after and/or before (YYYY-MM-DD or ISO-8601) "
        "or ago ({unit: days|weeks|months, value} or 'long_ago'), with confidence sure|likely|vague. Give one "
        "only when the question names a time. A cue that cannot be read is an error."
    ),
}


def reconstruct_refusal(message: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return failure(message, items=[], returned_count=0)


RECONSTRUCT = ToolSpec(
    name="reconstruct",
    contracts="associations-and-reconstruct.md §8",
    description=DESCRIPTION,
    input_schema=object_schema(
        {
            "agent_id": AGENT_ID,
            "query": {"type": "string", "description": "The question. '' quotes the most recent records."},
            "count": {
                "type": "integer",
                "minimum": 0,
                "description": "Most items to return (default 10, pro 15; clamped to the server maximum).",
            },
            "top_k": {
                "type": "integer",
                "minimum": 1,
                "maximum": 100,
                "description": "How many candidate rows the underlying recall returns (default 20).",
            },
            "max_hops": {
                "type": "integer",
                "minimum": 0,
                "maximum": 5,
                "description": "Steps followed over declared entity relations (default 2; 0 = none).",
            },
            "max_evidence": {
                "type": "integer",
                "minimum": 1,
                "maximum": 100,
                "description": "Rows kept per item, and per entity read by the walk (default 40).",
            },
            "deep": {"type": "boolean", "description": "Passed to the candidate recall: admit weaker matches."},
            "channel": {
                "type": "string",
                "description": "Only this channel plus rows stored without one; '' reads all.",
            },
            "project_id": PROJECT_ID_FILTER,
            "source_id": {"type": "string", "description": "Only memories from this source id (as in recall)."},
            "trace": {"type": "boolean", "description": "Return every field uncompacted plus the audit trail."},
            "budget": {
                "type": "integer",
                "minimum": 1,
                "description": "Characters of quoted text (default: enough for the window's head quotes).",
            },
            "session_key": {
                "type": "string",
                "maxLength": KEY_FIELD_MAX,
                "description": "Passed to the candidate recall (advisory memory, pause bucket).",
            },
            "time_cue": _TIME_CUE,
            "mode": {
                "type": "string",
                "enum": ["lite", "pro"],
                "description": "Cap the answer at 3,000 (lite) or 5,000 (pro) tokens, compact shape.",
            },
            "lite": {"type": "boolean", "description": "Older spelling of mode 'lite'; not together with mode."},
        },
        required=["agent_id", "query"],
    ),
    annotations=READ_ONLY,
    service=ServiceRef("cpersona.services.reconstruct.service", "answer_reconstruct"),
    request=Ref("cpersona.services.reconstruct.request", "ReconstructArguments"),
    project=READ_PROJECT,
    refusal=reconstruct_refusal,
    meta={"anthropic/alwaysLoad": True},
)

TOOLS = (RECONSTRUCT,)
