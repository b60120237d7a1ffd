"""Text holding NUL (U+0000) is refused, never stored and never silently cut (spec README decision 11).

The rule holds for every string field of every tool, at any depth, so the
tests walk the registry's published input schemas instead of picking examples;
the refusal must name the field and the position of the character. Services
reached by other paths (a library caller, an import) refuse it too, and an
import reports the row in its errors and goes on with the others.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.tools import default_registry
from cpersona.services.portability import import_memories
from cpersona.services.records.admin import update_memory
from cpersona.services.records.episodes import archive_episode
from cpersona.services.records.memories import store
from cpersona.services.records.profiles import update_profile
from cpersona.services.sanitize import sanitize
from cpersona.storage.models import Episode, Memory, Profile

pytestmark = pytest.mark.anyio

NUL_TEXT = "ab\x00cd"  # the NUL sits at position 2
REGISTRY = default_registry()


def _branches(schema: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return list(schema[key])
    return [schema]


def _types(schema: Mapping[str, Any]) -> set[str]:
    declared = schema.get("type")
    if declared is None:
        return set()
    return {declared} if isinstance(declared, str) else set(declared)


def string_slots(schema: Mapping[str, Any], depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(path, value) for every place a string can go under ``schema``, with NUL_TEXT placed there.

    Objects without declared properties (metadata, source) take a string at any
    key; arrays take one as their first item.
    """
    if depth > 6:
        return
    for branch in _branches(schema):
        types = _types(branch)
        if "string" in types or (not types and "enum" in branch and any(isinstance(v, str) for v in branch["enum"])):
            yield "", NUL_TEXT
        if "object" in types:
            props = branch.get("properties")
            if props:
                for name, sub in props.items():
                    for path, value in string_slots(sub, depth + 1):
                        yield f".{name}{path}", {name: value}
            else:
                yield ".note", {"note": NUL_TEXT}
        if "array" in types and isinstance(branch.get("items"), Mapping):
            for path, value in string_slots(branch["items"], depth + 1):
                yield f"[0]{path}", [value]


def every_tool_string_field() -> list[tuple[str, str, Any]]:
    cases = []
    for spec in REGISTRY:
        for name, sub in spec.properties.items():
            seen: set[str] = set()
            for path, value in string_slots(sub):
                if path not in seen:  # anyOf branches may offer the same slot twice
                    seen.add(path)
                    cases.append((spec.name, f"$.{name}{path}", {name: value}))
    return cases


CASES = every_tool_string_field()


def test_the_walk_covers_every_tool_that_takes_text():
    # Guards the walk itself: a schema shape it did not understand would shrink the table silently.
    tools_with_text = {
        spec.name for spec in REGISTRY if any('"string"' in json.dumps(sub) for sub in spec.properties.values())
    }
    assert {tool for tool, _, _ in CASES} == tools_with_text
    assert len(CASES) > 60
    assert ("store", "$.content", {"content": NUL_TEXT}) in CASES
    assert ("store", "$.metadata.note", {"metadata": {"note": NUL_TEXT}}) in CASES


def required_values(spec) -> dict[str, Any]:
    """Plausible values for the tool's required arguments, so only the NUL is wrong."""
    out: dict[str, Any] = {}
    for name in spec.input_schema.get("required", []):
        sub = spec.properties[name]
        types = _types(_branches(sub)[0])
        if "enum" in sub:
            out[name] = sub["enum"][0]
        elif "string" in types:
            out[name] = "a"
        elif "integer" in types or "number" in types:
            out[name] = 1
        elif "boolean" in types:
            out[name] = False
        elif "array" in types:
            out[name] = []
        else:
            out[name] = {}
    return out


def message_of(payload: dict[str, Any]) -> str:
    return str(payload.get("error") or payload.get("reason") or "")


@pytest.mark.parametrize(("tool", "path", "argument"), CASES, ids=[f"{t}:{p}" for t, p, _ in CASES])
async def test_every_string_field_of_every_tool_refuses_nul(app, db, tool, path, argument, tmp_path, monkeypatch):
    # decision 11; in tmp_path, so a build that lets the call through writes its "a" file there
    monkeypatch.chdir(tmp_path)
    spec = REGISTRY.get(tool)
    arguments = {**required_values(spec), **argument}
    before = _row_counts(db)
    outcome = await call_tool(app, REGISTRY, GateChain([]), tool, arguments)
    payload = outcome.payload
    assert payload.get("ok") is False, payload
    message = message_of(payload)
    assert f"{path} contains the NUL character (U+0000) at position 2" in message, message
    assert outcome.is_error is False  # the tool's own refusal shape (G-6), not a protocol error
    assert _row_counts(db) == before


async def test_nul_in_an_object_key_is_refused_with_its_path(app):
    outcome = await call_tool(
        app, REGISTRY, GateChain([]), "store", {"agent_id": "a", "content": "fine", "metadata": {"k\x00ey": 1}}
    )
    assert outcome.payload["ok"] is False and outcome.payload["result"] == "rejected"
    assert "$.metadata key 'k\\x00ey' contains the NUL character (U+0000) at position 1" in outcome.payload["reason"]


def _row_counts(db) -> tuple[int, int, int]:
    with db.read() as session:
        return tuple(session.scalar(select(func.count()).select_from(t)) for t in (Memory, Episode, Profile))


# -- services reached without the facade ------------------------------------------------------------


def test_the_sanitizer_no_longer_removes_nul_silently():
    with pytest.raises(ValueError, match=r"NUL character \(U\+0000\) at position 2"):
        sanitize(NUL_TEXT, 100)


SERVICE_CALLS = [
    ("store content", lambda app: store(app, agent_id="a", content=NUL_TEXT), "content"),
    ("store metadata", lambda app: store(app, agent_id="a", content="x", metadata={"k": NUL_TEXT}), "metadata.k"),
    (
        "store source",
        lambda app: store(app, agent_id="a", content="x", source={"type": "User", "name": NUL_TEXT}),
        "source.name",
    ),
    ("archive_episode summary", lambda app: archive_episode(app, agent_id="a", summary=NUL_TEXT), "summary"),
    (
        "archive_episode keywords",
        lambda app: archive_episode(app, agent_id="a", summary="s", keywords=NUL_TEXT),
        "keywords",
    ),
    ("update_profile", lambda app: update_profile(app, agent_id="a", profile=NUL_TEXT), "profile"),
]


@pytest.mark.parametrize(("label", "call", "field"), SERVICE_CALLS, ids=[c[0] for c in SERVICE_CALLS])
def test_services_refuse_nul_in_their_text(app, db, label, call, field):  # decision 11
    before = _row_counts(db)
    answer = call(app)
    assert answer["ok"] is False, answer
    assert f"{field} contains the NUL character (U+0000) at position 2" in message_of(answer)
    assert _row_counts(db) == before


def test_update_memory_refuses_nul_and_keeps_the_old_text(app, db):
    stored = store(app, agent_id="a", content="original")
    answer = update_memory(app, memory_id=stored["id"], content=NUL_TEXT, agent_id="a")
    assert answer["ok"] is False and "content contains the NUL character (U+0000) at position 2" in answer["error"]
    with db.read() as session:
        assert session.scalar(select(Memory.content).where(Memory.id == stored["id"])) == "original"


# -- import: the row is reported, the others go in --------------------------------------------------


def test_an_import_reports_the_nul_row_and_imports_the_others(app, db, tmp_path: Path):  # decision 11, IM-5
    rows = [
        {"_type": "memory", "agent_id": "a", "content": "first good row"},
        {"_type": "memory", "agent_id": "a", "content": "bad \x00 row"},
        {"_type": "memory", "agent_id": "a", "content": "second good row", "metadata": {"k": "v"}},
        {"_type": "memory", "agent_id": "a", "content": "meta bad", "metadata": {"k": "v\x00"}},
        {"_type": "episode", "agent_id": "a", "summary": "an episode \x00"},
        {"_type": "episode", "agent_id": "a", "summary": "a good episode"},
        {"_type": "profile", "agent_id": "a", "content": "likes \x00 tea"},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    answer = import_memories(app, input_path=str(path))
    assert answer["ok"] is True, answer
    assert (answer["imported_memories"], answer["skipped_memories"]) == (2, 2)
    assert answer["imported_episodes"] == 1 and answer["skipped_episodes"] == 1
    assert answer["profile_updated"] is False
    errors = answer["errors"]
    assert "Line 2: memory content contains the NUL character (U+0000) at position 4; it was not imported" in errors
    assert "Line 4: memory metadata.k contains the NUL character (U+0000) at position 1; it was not imported" in errors
    assert any(e.startswith("Line 5: episode summary contains the NUL character") for e in errors)
    assert any(e.startswith("Line 7: profile content contains the NUL character") for e in errors)
    with db.read() as session:
        contents = set(session.scalars(select(Memory.content)).all())
        assert contents == {"first good row", "second good row"}
        assert not any("\x00" in c for c in session.scalars(select(Episode.summary)).all())
