"""A quick yes to "do these arguments conform?", so a sound call never loads jsonschema.

jsonschema (with referencing, rpds and attrs) costs ~0.03 s CPU and ~2.7 MiB on
the first call it validates, and a stdio start's first recall paid it
(docs/benchmarks.md, issue 16 sixth round). The tool schemas use a small part
of JSON Schema (type, properties, required, enum, minimum/maximum,
minLength/maxLength, items, minItems/maxItems, anyOf, additionalProperties and
annotations), and a well-formed call only needs to be *accepted*.

:func:`conforms` answers True only when jsonschema's Draft 2020-12 validator
would find no error: each keyword below is checked as jsonschema's own keyword
function checks it (same type rules: a bool is neither an integer nor a number,
``5.0`` is an integer; same comparisons). Anything else (a keyword not listed,
an enum of non-strings, ``oneOf``, an unknown type, a failed check) answers
False, which means "ask jsonschema": :func:`cpersona.mcp.validation.schema_violation`
then validates as before and words the complaint. So this can only skip work,
never change an answer (tests/test_schema_check.py compares the two on every
tool's schema).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# Keywords that never make an instance invalid.
_ANNOTATIONS = frozenset({"description", "default", "title", "examples", "$comment", "deprecated"})


def conforms(schema: Any, instance: Any) -> bool:
    """True when ``instance`` certainly satisfies ``schema``; False means "not known here"."""
    if schema is True:
        return True
    if not isinstance(schema, Mapping):
        return False
    for keyword, value in schema.items():
        check = _KEYWORDS.get(keyword)
        if check is None:
            if keyword in _ANNOTATIONS:
                continue
            return False
        if not check(value, instance, schema):
            return False
    return True


def _is_type(instance: Any, name: Any) -> bool:
    # jsonschema's draft 2020-12 type checker, restricted to what JSON can carry.
    if name == "string":
        return isinstance(instance, str)
    if name == "object":
        return isinstance(instance, dict)
    if name == "array":
        return isinstance(instance, list)
    if name == "boolean":
        return isinstance(instance, bool)
    if name == "null":
        return instance is None
    if isinstance(instance, bool):
        return False  # for "integer" and "number"
    if name == "integer":
        return isinstance(instance, int) or (isinstance(instance, float) and instance.is_integer())
    if name == "number":
        return isinstance(instance, (int, float))
    return False  # a type jsonschema would refuse (UnknownType): let it


def _type(value: Any, instance: Any, _schema: Mapping[str, Any]) -> bool:
    names = value if isinstance(value, list) else [value]
    return any(_is_type(instance, name) for name in names)


def _properties(value: Any, instance: Any, _schema: Mapping[str, Any]) -> bool:
    if not isinstance(instance, dict):
        return True
    if not isinstance(value, Mapping):
        return False
    return all(conforms(sub, instance[name]) for name, sub in value.items() if name in instance)


def _required(value: Any, instance: Any, _schema: Mapping[str, Any]) -> bool:
    if not isinstance(instance, dict):
        return True
    return isinstance(value, list) and all(name in instance for name in value)


def _additional(value: Any, instance: Any, schema: Mapping[str, Any]) -> bool:
    if not isinstance(instance, dict) or value is True:
        return True
    if "patternProperties" in schema:
        return False  # not used by any tool; jsonschema decides
    declared = schema.get("properties", {})
    return all(conforms(value, item) for name, item in instance.items() if name not in declared)


def _enum(value: Any, instance: Any, _schema: Mapping[str, Any]) -> bool:
    # For strings jsonschema's equality is ==; other kinds (1 vs True, 1 vs 1.0) it decides.
    return (
        isinstance(instance, str)
        and isinstance(value, list)
        and all(isinstance(v, str) for v in value)
        and (instance in value)
    )


def _minimum(value: Any, instance: Any, _schema: Mapping[str, Any]) -> bool:
    if not _is_type(instance, "number"):
        return True
    return not instance < value


def _maximum(value: Any, instance: Any, _schema: Mapping[str, Any]) -> bool:
    if not _is_type(instance, "number"):
        return True
    return not instance > value


def _max_length(value: Any, instance: Any, _schema: Mapping[str, Any]) -> bool:
    return not isinstance(instance, str) or not len(instance) > value


def _min_length(value: Any, instance: Any, _schema: Mapping[str, Any]) -> bool:
    return not isinstance(instance, str) or not len(instance) < value


def _items(value: Any, instance: Any, schema: Mapping[str, Any]) -> bool:
    if not isinstance(instance, list):
        return True
    if "prefixItems" in schema or not isinstance(value, (Mapping, bool)):
        return False
    return all(conforms(value, item) for item in instance)


def _max_items(value: Any, instance: Any, _schema: Mapping[str, Any]) -> bool:
    return not isinstance(instance, list) or not len(instance) > value


def _min_items(value: Any, instance: Any, _schema: Mapping[str, Any]) -> bool:
    return not isinstance(instance, list) or not len(instance) < value


def _any_of(value: Any, instance: Any, _schema: Mapping[str, Any]) -> bool:
    return isinstance(value, list) and any(conforms(sub, instance) for sub in value)


_KEYWORDS: dict[str, Callable[[Any, Any, Mapping[str, Any]], bool]] = {
    "type": _type,
    "properties": _properties,
    "required": _required,
    "additionalProperties": _additional,
    "enum": _enum,
    "minimum": _minimum,
    "maximum": _maximum,
    "maxLength": _max_length,
    "minLength": _min_length,
    "items": _items,
    "maxItems": _max_items,
    "minItems": _min_items,
    "anyOf": _any_of,
}
