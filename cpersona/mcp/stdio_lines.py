"""Lines the SDK's strict parser refuses, and the answers they get: shared by both stdio paths.

The SDK's parser (``mcp_types.jsonrpc_message_adapter``, pydantic's JSON) refuses
two things JSON allows: a lone UTF-16 surrogate escape (``"\\ud800"``) and nesting
deeper than about 200 levels. Such a line is re-parsed with Python's ``json``
(:func:`reparse`); if it is still unreadable, or longer than any tool accepts,
the request is answered from the id found by a flat scan (:func:`unreadable_reply`).
Wire types only (``mcp_types``): the stdio session imports this without the SDK.
"""

from __future__ import annotations

import json
import logging
import re
from json.decoder import scanstring
from typing import Any

import mcp_types as types
import pydantic

from cpersona.mcp.dispatch import input_error
from cpersona.mcp.results import replace_lone_surrogates, to_result
from cpersona.mcp.stdio_pipes import OverlongLine
from cpersona.mcp.validation import MAX_REQUEST_BYTES

log = logging.getLogger("cpersona.mcp.stdio")  # the name operators' log filters already know

_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def unreadable_reply(line: str, reason: str, null_id: bool = False) -> types.JSONRPCMessage | None:
    """The answer to a request that could not be read, or None when it has no id to answer.

    A tool error for ``tools/call``, a JSON-RPC parse error otherwise; with
    ``null_id`` a line without a findable id is still answered, id null.
    """
    request_id = top_level_member(line, "id")
    method = top_level_member(line, "method")
    if not isinstance(request_id, (int, str)) or isinstance(request_id, bool):
        if not null_id:
            log.warning("dropped an unreadable line without a request id (%d characters)", len(line))
            return None
        request_id, method = None, None  # JSON-RPC: a parse error whose id could not be found has id null
    log.warning("answered unreadable request %r (%s): %s", request_id, method, reason)
    if method == "tools/call":
        result = to_result(input_error(f"the request could not be read: {reason}"))
        return types.JSONRPCResponse(
            jsonrpc="2.0", id=request_id, result=result.model_dump(by_alias=True, exclude_none=True, mode="json")
        )
    return types.JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=types.ErrorData(code=types.PARSE_ERROR, message=f"the request could not be read: {reason}"),
    )


def overlong_reason(line: OverlongLine) -> str:
    return (
        f"it is at least {line.length} bytes long, more than the largest request any "
        f"tool can accept ({MAX_REQUEST_BYTES} bytes), so it was not read"
    )


def unparsed_line(exc: Exception) -> str | None:
    """The raw line behind a JSON syntax failure of the SDK's parser, else None."""
    if not isinstance(exc, pydantic.ValidationError):
        return None
    for error in exc.errors():
        if error.get("type") == "json_invalid" and isinstance(error.get("input"), str):
            return error["input"]
    return None


def reason(exc: Exception) -> str:
    if isinstance(exc, pydantic.ValidationError):
        msg = exc.errors()[0].get("msg", "")
        if "recursion limit" in msg:
            return "it is nested too deeply"
        return msg
    return type(exc).__name__


def reparse(line: str) -> types.JSONRPCMessage | None:
    """Parse with Python's json and validate as JSON-RPC; None if either fails.

    Lone surrogates may stay only inside a tool call's arguments, where the call
    path refuses them without echoing them. Anywhere else (a method name, a
    cursor) the SDK might echo one back, and its UTF-8 writer would then fail and
    take the whole connection down, so there they become U+FFFD.
    """
    try:
        raw = _surrogates_only_in_arguments(json.loads(line))
        return types.jsonrpc_message_adapter.validate_python(raw, by_name=False)
    except (ValueError, RecursionError, pydantic.ValidationError):
        return None


def _surrogates_only_in_arguments(raw: Any) -> Any:
    params = raw.get("params") if isinstance(raw, dict) else None
    if isinstance(params, dict) and raw.get("method") == "tools/call" and "arguments" in params:
        envelope = replace_lone_surrogates({**raw, "params": {k: v for k, v in params.items() if k != "arguments"}})
        envelope["params"]["arguments"] = params["arguments"]
        return envelope
    return replace_lone_surrogates(raw)


def top_level_member(line: str, wanted: str) -> Any:
    """The string or number value of key ``wanted`` in the outermost object of ``line``.

    A flat scan that tracks depth instead of parsing, so any nesting costs one
    pass. Returns None when the key is absent or its value is not a scalar.
    """
    depth = 0
    key: str | None = None
    awaiting_value = False
    pos, end = 0, len(line)
    while pos < end:
        char = line[pos]
        if char == '"':
            try:
                text, pos = scanstring(line, pos + 1, False)
            except ValueError:
                return None
            if depth == 1:
                if awaiting_value:
                    if key == wanted:
                        return text
                    awaiting_value = False
                else:
                    key = text
            continue
        if char in "{[":
            depth += 1
            awaiting_value = False if depth > 1 else awaiting_value
        elif char in "}]":
            depth -= 1
        elif depth == 1 and char == ":":
            awaiting_value = True
        elif depth == 1 and char == ",":
            key, awaiting_value = None, False
        elif depth == 1 and awaiting_value and char in "-0123456789":
            match = _NUMBER.match(line, pos)
            if match and key == wanted:
                number = match.group()
                return int(number) if re.fullmatch(r"-?[0-9]+", number) else float(number)
            awaiting_value = False
            pos = match.end() if match else pos + 1
            continue
        pos += 1
    return None
