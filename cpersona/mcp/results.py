"""Turning a tool's answer into the MCP ``CallToolResult`` a client receives.

One text content holding the answer as JSON (non-ASCII kept as is, so Japanese
reads as Japanese) and the same object as ``structuredContent``.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from cpersona.mcp.dispatch import Outcome
from cpersona.mcp.validation import has_lone_surrogate


def to_result(outcome: Outcome) -> types.CallToolResult:
    payload = outcome.payload
    text = json.dumps(payload, ensure_ascii=False)
    if has_lone_surrogate(text):
        # The transport writes UTF-8, which cannot encode a lone surrogate; one in
        # an answer (say, text a legacy database already held) would otherwise
        # break the connection instead of one reply.
        payload = replace_lone_surrogates(payload)
        text = json.dumps(payload, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=payload,
        is_error=outcome.is_error,
    )


def replace_lone_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate, in keys and strings at any depth, replaced by U+FFFD."""
    if isinstance(value, str):
        return (
            "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
            if has_lone_surrogate(value)
            else value
        )
    if isinstance(value, dict):
        return {replace_lone_surrogates(k): replace_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [replace_lone_surrogates(v) for v in value]
    return value
