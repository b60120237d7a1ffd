"""Reading records in full after a preview: ``get_contents``."""

from __future__ import annotations

from typing import Any

from cpersona.mcp.registry import READ_ONLY, Ref, ServiceRef, ToolSpec
from cpersona.mcp.tools.common import object_schema

DESCRIPTION = (
    "Read the full, uncut text behind refs that a preview-tier recall (or a listing) handed out. Expand only the "
    "rows you need rather than asking the whole recall for full_content=true. "
    "Two bounds: at most 20 refs per call, and 40,000 characters across the batch (this does not change with "
    "CPERSONA_MAX_CONTENT_LENGTH). A row is never cut to fit: once the budget is used up, the remaining refs "
    "come back untouched in `deferred` (absent otherwise) together with `budget_chars`; ask for them in another "
    "call. The first row served is always returned whole, even when it alone exceeds the budget, because this "
    "is the only way to read a row's complete text. "
    "Refs of rows that do not exist, are malformed, or belong to another agent come back in `missing`. "
    "RANGES: instead of a ref string, an entry can be an object naming part of a record: {ref, span: [start, end]} "
    "for characters start to end (end excluded), {ref, node: i} or {ref, node: [first, last]} (inclusive) for "
    "overflow-tree nodes such as a reconstruct quote's `node.index`, or {ref, block: ...} likewise. Offsets count "
    "in the stored text: a memory's content, an episode's summary without the '[Episode] ' label. The item then "
    "holds just that slice as `content`, plus `range` = {span, content_len, and node + of or block + of when "
    "those were named}; an end beyond the text is clamped and `range.span` shows what was served. An entry may "
    "also carry `revision`, the digest a reconstruct quote's `expand` gives for the text its offsets refer to: "
    "if the record has been rewritten since, the entry is refused instead of serving other characters under the "
    "same offsets. A range that cannot be served exactly is never widened to the whole row; it is listed in "
    "`unresolved` (absent otherwise) as {ref, reason}, the reason being one of invalid_range, no_current_nodes "
    "(the record has no complete node set: short records never get one, and a long record gets it shortly after "
    "it is written), node_out_of_range, span_out_of_range, no_current_blocks, block_out_of_range, stale_revision. "
    "A range counts against the budget only for the slice served."
)

_INDEX_OR_PAIR: dict[str, Any] = {
    "anyOf": [
        {"type": "integer", "minimum": 0},
        {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2},
    ]
}

GET_CONTENTS = ToolSpec(
    name="get_contents",
    contracts="memory-and-recall.md §3.4, associations-and-reconstruct.md §7",
    description=DESCRIPTION,
    input_schema=object_schema(
        {
            "agent_id": {
                "type": "string",
                "description": "The agent that owns the rows; refs of any other agent come back in `missing`.",
            },
            "refs": {
                "type": "array",
                "items": {
                    "anyOf": [
                        {"type": "string"},
                        {
                            "type": "object",
                            "properties": {
                                "ref": {"type": "string"},
                                "node": _INDEX_OR_PAIR,
                                "block": _INDEX_OR_PAIR,
                                "span": {
                                    "type": "array",
                                    "items": {"type": "integer", "minimum": 0},
                                    "minItems": 2,
                                    "maxItems": 2,
                                },
                                "revision": {"type": "string"},
                            },
                            "required": ["ref"],
                        },
                    ]
                },
                "maxItems": 20,
                "description": (
                    "Up to 20 refs as recall gives them ('mem:<id>' / 'ep:<id>'), or range objects such as "
                    "{'ref': 'mem:<id>', 'node': [2, 3]}, {'ref': 'ep:<id>', 'span': [0, 800]} or "
                    "{'ref': 'mem:<id>', 'span': [738, 2212], 'revision': '<from an expand>'}. An object names at "
                    "most one of node / span / block."
                ),
            },
        },
        required=["agent_id", "refs"],
    ),
    annotations=READ_ONLY,
    service=ServiceRef("cpersona.services.records.contents", "answer_get_contents"),
    request=Ref("cpersona.services.records.contents", "ContentsArguments"),
)

TOOLS = [GET_CONTENTS]
