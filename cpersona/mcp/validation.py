"""Checks on tool arguments before any service runs.

Three checks, in the order the call path applies them:

1. :func:`inspect_arguments` walks the arguments once, without recursion, and
   reports the first bound crossed (nesting depth, number of values, total text,
   integers wider than 64 bits), the first string carrying a lone UTF-16
   surrogate (spec G-6) and the first NUL character, in a key or a value at any
   depth (decision 11: text cannot hold it, so no tool may store or search it). The walk is iterative on purpose: a 10,000-deep object
   must cost a loop, not the interpreter's stack.
2. :func:`schema_violation` validates against the tool's published JSON Schema
   (spec G-3) and returns jsonschema's best-matching message; arguments that
   :mod:`cpersona.mcp.schema_check` finds certainly valid skip jsonschema.
3. :func:`conform` drops keys the schema does not declare (spec G-5) and turns
   integral floats (``5.0``, which JSON Schema counts as an integer) into ints so
   services never see a float where the schema promised an integer.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cpersona.mcp.schema_check import conforms
from cpersona.services.sanitize import has_lone_surrogate, nul_message

if TYPE_CHECKING:
    # Imported where a schema is first compiled: the stdio readers (and so the
    # proxy, which validates nothing) take MAX_REQUEST_BYTES from here, and
    # jsonschema with its referencing, rpds and attrs costs ~60 ms CPU.
    from jsonschema import Draft202012Validator

# Far above any legitimate call (a 16,000-char memory with 8,000 chars of
# metadata, or recall_with_context carrying a few hundred turns) and far below
# what would make a request expensive to walk, validate or store.
MAX_DEPTH = 32
MAX_VALUES = 100_000
MAX_TEXT_CHARS = 8 * 1024 * 1024
MAX_INT = 2**63 - 1  # what SQLite can store; anything wider is never a real id or count

# The largest request any tool can accept, in bytes on the wire, derived from the
# bounds above (the content caps, CPERSONA_MAX_CONTENT_LENGTH and friends, sit far
# below MAX_TEXT_CHARS, so the walk is what binds): JSON spells a character in at
# most 6 bytes (``\uXXXX``; only an astral character escaped as a surrogate pair
# takes 12), a value's syntax (a 20-digit number, separators, a pretty-printer's
# indentation) costs at most 32 bytes beyond its text, and the JSON-RPC envelope
# fits in 64 KiB. A longer HTTP body or stdio line is refused as soon as it is
# seen to be longer, before it is held whole: its arguments could only be refused.
JSON_BYTES_PER_CHAR = 6
JSON_BYTES_PER_VALUE = 32
ENVELOPE_BYTES = 64 * 1024
MAX_REQUEST_BYTES = MAX_TEXT_CHARS * JSON_BYTES_PER_CHAR + MAX_VALUES * JSON_BYTES_PER_VALUE + ENVELOPE_BYTES


@dataclass(frozen=True)
class ArgumentReport:
    """What one walk over the arguments found; all None means the arguments are sound."""

    bound_crossed: str | None = None
    lone_surrogate_at: str | None = None
    nul: str | None = None  # the refusal naming the first NUL's path and position


def _child_path(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if str(key).isidentifier() else f"{path}[{json.dumps(str(key), ensure_ascii=True)}]"


def inspect_arguments(arguments: Mapping[str, Any]) -> ArgumentReport:
    """Walk the arguments once; report the first bound crossed, lone surrogate and NUL."""
    surrogate_at: str | None = None
    nul: str | None = None
    values = 0
    text_chars = 0
    stack: list[tuple[Any, str, int]] = [(arguments, "$", 0)]
    while stack:
        value, path, depth = stack.pop()
        values += 1
        if values > MAX_VALUES:
            return ArgumentReport(bound_crossed=f"arguments hold more than {MAX_VALUES} values")
        if isinstance(value, str):
            text_chars += len(value)
            if text_chars > MAX_TEXT_CHARS:
                return ArgumentReport(bound_crossed=f"arguments hold more than {MAX_TEXT_CHARS} characters of text")
            if surrogate_at is None and has_lone_surrogate(value):
                surrogate_at = path
            if nul is None and (position := value.find("\x00")) >= 0:
                nul = nul_message(path, position)
        elif isinstance(value, bool) or value is None or isinstance(value, float):
            pass
        elif isinstance(value, int):
            if not -MAX_INT - 1 <= value <= MAX_INT:
                return ArgumentReport(bound_crossed=f"{path} is an integer wider than 64 bits")
        elif isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                return ArgumentReport(bound_crossed=f"arguments are nested deeper than {MAX_DEPTH} levels (at {path})")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                if isinstance(key, str):
                    text_chars += len(key)
                    if surrogate_at is None and has_lone_surrogate(key):
                        surrogate_at = _child_path(path, key)
                    if nul is None and (position := key.find("\x00")) >= 0:
                        nul = nul_message(f"{path} key {key!r}", position)
                stack.append((child, _child_path(path, key), depth + 1))
        else:
            # Only reachable in-process: JSON cannot carry other types.
            return ArgumentReport(bound_crossed=f"{path} is a {type(value).__name__}, which JSON cannot carry")
    return ArgumentReport(lone_surrogate_at=surrogate_at, nul=nul)


@functools.lru_cache(maxsize=None)
def _validator(schema_json: str) -> Draft202012Validator:
    # Keyed by the schema's JSON text: compiling costs far more than validating.
    from jsonschema import Draft202012Validator

    schema = json.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


# Tool schemas are long-lived objects, so the hot path looks them up by identity
# (serialising a schema on every call to find its validator cost more than the
# validation itself); the JSON-keyed cache still shares equal schemas.
_BY_IDENTITY: dict[int, tuple[Mapping[str, Any], Draft202012Validator]] = {}
_BY_IDENTITY_MAX = 256


def validator_for(schema: Mapping[str, Any]) -> Draft202012Validator:
    hit = _BY_IDENTITY.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    validator = _validator(json.dumps(schema, sort_keys=True))
    if len(_BY_IDENTITY) >= _BY_IDENTITY_MAX:
        _BY_IDENTITY.clear()
    _BY_IDENTITY[id(schema)] = (schema, validator)  # holding the schema keeps its id from being reused
    return validator


def schema_violation(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """jsonschema's best-matching complaint about ``arguments``, or None when they conform."""
    try:
        if conforms(schema, arguments):
            return None  # certainly no complaint: jsonschema need not load (schema_check)
    except Exception:  # noqa: BLE001 — a shape it did not expect: jsonschema decides, as before
        pass
    from jsonschema.exceptions import best_match

    error = best_match(validator_for(schema).iter_errors(arguments))
    if error is None:
        return None
    where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    # The reference answers the bare message; a location helps when the complaint
    # is about a nested value ("'x' is not one of ['sure', ...]" says nothing of where).
    return f"{error.message} (at $" + where + ")" if where else error.message


def conform(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Keep only declared keys (G-5) and make schema integers Python ints."""
    declared = schema.get("properties", {})
    return {key: _as_declared(declared[key], value) for key, value in arguments.items() if key in declared}


def _as_declared(schema: Mapping[str, Any], value: Any) -> Any:
    if isinstance(value, float) and _allows(schema, "integer") and not _allows(schema, "number") and value.is_integer():
        return int(value)
    if isinstance(value, dict) and isinstance(schema.get("properties"), Mapping):
        props = schema["properties"]
        return {k: _as_declared(props[k], v) if k in props else v for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [_as_declared(schema["items"], v) for v in value]
    return value


def _allows(schema: Mapping[str, Any], type_name: str) -> bool:
    declared = schema.get("type")
    return declared == type_name or (isinstance(declared, list) and type_name in declared)
