"""cpersona.mcp.schema_check says yes only where jsonschema finds nothing (spec G-3).

The quick check lets a sound call skip jsonschema (issue 16: ~2.7 MiB and
~0.03 s on a stdio start's first recall). It may say "not known" freely, but a
yes where jsonschema has a complaint would let a bad call through, so every
tool's published schema is tried here with the arguments a client could send:
a sound call, then each argument in turn replaced by values of every JSON kind
and edge (wrong types, bounds, lengths, enum misses, nested items), a missing
required argument and an undeclared one.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from cpersona.mcp.schema_check import conforms
from cpersona.mcp.tools import default_registry
from cpersona.mcp.validation import schema_violation

REGISTRY = default_registry()

PROBES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    5.0,
    2.5,
    -0.5,
    2**40,
    -(2**40),
    float("nan"),
    float("inf"),
    "",
    "x",
    "sure",
    "x" * 70_000,
    [],
    ["a"],
    [1],
    [None],
    ["a"] * 600,
    {},
    {"a": 1},
    {"role": "user"},
]


def _sample(schema: Any) -> Any:
    """A value the schema accepts, built from its own keywords."""
    if not isinstance(schema, dict):
        return None
    if "default" in schema:
        return copy.deepcopy(schema["default"])
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return _sample(schema["anyOf"][0])
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "object":
        props = schema.get("properties", {})
        return {name: _sample(props[name]) for name in schema.get("required", []) if name in props}
    if kind == "array":
        return [_sample(schema.get("items", {}))] * max(1, schema.get("minItems", 1))
    if kind == "integer":
        return max(schema.get("minimum", 1), 1) if schema.get("maximum", 2) >= 1 else schema["maximum"]
    if kind == "number":
        return float(max(schema.get("minimum", 0.5), 0.5)) if schema.get("maximum", 1) >= 0.5 else schema["maximum"]
    if kind == "boolean":
        return True
    if kind == "string":
        return "a" * max(1, schema.get("minLength", 1))
    return None


def _cases(schema: dict[str, Any]) -> list[Any]:
    base = _sample(schema)
    props = schema.get("properties", {})
    cases = [base, {**base, "undeclared": 1}]
    for name in schema.get("required", []):
        cases.append({k: v for k, v in base.items() if k != name})
    for name, sub in props.items():
        values = [*PROBES, _sample(sub)]
        if isinstance(sub, dict) and sub.get("type") == "array":
            values += [[probe] for probe in PROBES]
            values += [[_sample(sub.get("items", {}))] * n for n in (0, 1, 2, 11, 51, 101, 501)]
        if isinstance(sub, dict) and sub.get("type") == "object":
            inner = _sample(sub)
            values += [{**inner, k: probe} for k in sub.get("properties", {}) for probe in PROBES]
        for bound in ("maxLength", "maxItems", "minimum", "maximum"):
            if isinstance(sub, dict) and bound in sub:
                edge = sub[bound]
                values += ["y" * edge, "y" * (edge + 1), ["a"] * edge, ["a"] * (edge + 1), edge, edge + 1, edge - 1]
        cases += [{**base, name: value} for value in values]
    return cases


@pytest.mark.parametrize("name", [spec.name for spec in REGISTRY])
def test_a_yes_is_never_given_where_jsonschema_complains(name: str) -> None:
    schema = REGISTRY.get(name).input_schema
    validator = Draft202012Validator(schema)
    yes = 0
    for case in _cases(schema):
        if conforms(schema, case):
            yes += 1
            errors = [e.message for e in validator.iter_errors(case)]
            assert errors == [], f"{name}: quick yes for {str(case)[:200]} but jsonschema says {errors[:2]}"
    assert yes > 0, f"{name}: not even a sound call takes the quick path"


def test_a_sound_call_takes_the_quick_path_and_a_bad_one_keeps_jsonschemas_words() -> None:
    schema = REGISTRY.get("recall").input_schema
    sound = {"agent_id": "a", "query": "seed memory about start-up", "limit": 5.0, "deep": False}
    assert conforms(schema, sound)
    assert schema_violation(schema, sound) is None
    assert not conforms(schema, {**sound, "limit": 101})
    assert schema_violation(schema, {**sound, "limit": 101}) == "101 is greater than the maximum of 100 (at $.limit)"
    assert not conforms(schema, {**sound, "limit": True})
    assert schema_violation(schema, {**sound, "limit": True}) == "True is not of type 'integer' (at $.limit)"


@pytest.mark.parametrize(
    ("schema", "instance"),
    [
        ({"type": "integer"}, True),  # a bool is not an integer
        ({"type": "number"}, False),
        ({"type": "integer"}, 2.5),
        ({"enum": [1, 2]}, True),  # jsonschema's own equality decides non-strings
        ({"oneOf": [{"type": "string"}]}, "x"),  # not checked here
        ({"type": "string", "pattern": "^a$"}, "a"),  # an unknown keyword
        ({"type": "object", "additionalProperties": False}, {"x": 1}),
        ({"type": "array", "items": False}, [1]),
        ({"type": "widget"}, 1),
        ({"$ref": "#/$defs/x"}, 1),
    ],
)
def test_what_it_does_not_know_it_leaves_to_jsonschema(schema: dict[str, Any], instance: Any) -> None:
    assert not conforms(schema, instance)


def test_integral_floats_are_integers_as_jsonschema_counts_them() -> None:
    assert conforms({"type": "integer", "minimum": 0}, 5.0)
    assert Draft202012Validator({"type": "integer", "minimum": 0}).is_valid(5.0)
