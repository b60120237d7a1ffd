"""A tool call parsed into its typed request means what the same arguments mean to a library caller.

Dispatch parses a tool call's arguments once into the tool's request dataclass;
the service's library entry checks a Python caller's raw values and builds the
same request. An argument left out must get the same default either way
(``store``'s ``source`` is the agent itself at the top level, the unknown
producer in the older message form: omitted, null and a default differ there).
Each case runs on two fresh databases seeded alike, once through the real MCP
client and once as a library call, and compares the answers and every row the
call left behind.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from sqlalchemy import text

from cpersona.mcp.server import build_server
from cpersona.services.app import App
from cpersona.services.graph.associations import declare_associations
from cpersona.services.graph.traverse import traverse
from cpersona.services.records.admin import update_memory
from cpersona.services.records.contents import get_contents
from cpersona.services.records.episodes import archive_episode
from cpersona.services.records.memories import store
from cpersona.storage.engine import open_sqlite
from cpersona.storage.migrate import upgrade
from conftest import make_app

NOW = datetime(2026, 6, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
LIBRARY: dict[str, Callable[..., dict[str, Any]]] = {
    "store": store,
    "update_memory": update_memory,
    "get_contents": get_contents,
    "archive_episode": archive_episode,
    "declare_associations": declare_associations,
    "traverse": traverse,
}
TABLES = ("memories", "episodes", "entities", "entity_aliases", "entity_mentions", "relations")

CASES: list[tuple[str, dict[str, Any]]] = [
    # store: every optional argument omitted, the older form, and the refusals that are about meaning
    ("store", {"agent_id": "a", "content": "a new memory"}),
    ("store", {"agent_id": "a", "message": {"content": "the older form"}}),
    ("store", {"agent_id": "a", "message": {"content": "older, null source", "source": None}}),
    ("store", {"agent_id": "a", "message": {"content": "older, bare word", "source": "user", "id": "m1"}}),
    ("store", {"agent_id": "a", "message": {}, "content": "an empty message is no form"}),
    ("store", {"agent_id": "a", "content": "both forms", "message": {"content": "y"}}),
    ("store", {"agent_id": "a", "source": {}, "message": {"content": "y"}}),
    ("store", {"agent_id": "a", "content": "locked at once", "lock": True}),
    ("store", {"agent_id": "a", "content": "the deploy runs on Fridays"}),
    ("store", {"agent_id": "a", "content": "the deploy runs on Fridays", "lock": True}),
    ("store", {"agent_id": "a", "content": ""}),
    ("store", {"agent_id": "a"}),
    ("store", {"agent_id": "a", "content": "[Memory from 2026-01-01]"}),
    ("store", {"agent_id": "a", "content": "stamped", "timestamp": "2026-01-01T00:00:00+00:00", "id": "x1"}),
    ("store", {"agent_id": "a", "content": "with a rider", "associations": {"entities": [{"name": "Rider"}]}}),
    ("store", {"agent_id": "a", "content": "an empty rider", "associations": {}}),
    ("store", {"agent_id": "a", "content": "bucketed", "channel": "chat", "project_id": "p"}),
    # update_memory: the owner omitted (unscoped), given, and empty text
    ("update_memory", {"memory_id": 1, "content": "the deploy runs on Mondays"}),
    ("update_memory", {"memory_id": 1, "content": "owned edit", "agent_id": "a"}),
    ("update_memory", {"memory_id": 1, "content": "not yours", "agent_id": "b"}),
    ("update_memory", {"memory_id": 1, "content": "   "}),
    ("update_memory", {"memory_id": 99, "content": "no such row"}),
    # get_contents
    ("get_contents", {"agent_id": "a", "refs": ["mem:1", "ep:1", "ep:9", "nonsense"]}),
    ("get_contents", {"agent_id": "a", "refs": [{"ref": "mem:1", "span": [4, 10]}, {"ref": "mem:1", "node": 0}]}),
    ("get_contents", {"agent_id": "b", "refs": ["mem:1"]}),
    ("get_contents", {"agent_id": "", "refs": ["mem:1"]}),
    ("get_contents", {"agent_id": "a", "refs": []}),
    # archive_episode: history, keywords, resolved, project and channel omitted; summary empty
    ("archive_episode", {"agent_id": "a", "summary": "we shipped"}),
    ("archive_episode", {"agent_id": "a", "summary": ""}),
    (
        "archive_episode",
        {
            "agent_id": "a",
            "summary": "dated",
            "keywords": "k1 k2",
            "resolved": True,
            "history": [{"timestamp": "2026-01-02T00:00:00Z"}, {"timestamp": "2026-01-01T00:00:00Z"}, {}],
            "channel": "chat",
        },
    ),
    ("archive_episode", {"agent_id": "a", "summary": "[Memory from 2026-01-01]"}),
    # declare_associations: nothing to declare, an anchor, a retraction, dropped items
    ("declare_associations", {"agent_id": "a"}),
    (
        "declare_associations",
        {"agent_id": "a", "associations": {"entities": [{"name": "Atlas"}]}, "anchor_ref": "mem:1"},
    ),
    (
        "declare_associations",
        {"agent_id": "a", "associations": {"entities": [{"name": "Atlas"}]}, "anchor_ref": "mem:9"},
    ),
    ("declare_associations", {"agent_id": "a", "retract": {"relations": [1], "mentions": [{"entity": 1}]}}),
    (
        "declare_associations",
        {"agent_id": "a", "associations": {"relations": [{"subject": "A", "predicate": " ", "object": "B"}]}},
    ),
    # traverse: max_hops and limit omitted, given, and a name nobody declared
    ("traverse", {"agent_id": "a", "entity": "Deploy"}),
    ("traverse", {"agent_id": "a", "entity": "release", "max_hops": 0, "limit": 1}),
    ("traverse", {"agent_id": "a", "entity": "Friday", "max_hops": 5}),
    ("traverse", {"agent_id": "a", "entity": "nobody"}),
]


def _fresh_app(path: Path) -> App:
    db = open_sqlite(path)
    upgrade(db)
    app = make_app(db)
    app.clock = lambda: NOW
    store(app, agent_id="a", content="the deploy runs on Fridays")
    archive_episode(app, agent_id="a", summary="a past conversation")
    declare_associations(
        app,
        agent_id="a",
        associations={
            "entities": [{"name": "Deploy", "aliases": ["release"]}],
            "relations": [{"subject": "Deploy", "predicate": "runs on", "object": "Friday"}],
        },
        anchor_ref="mem:1",
    )
    return app


def _rows(app: App) -> dict[str, list[dict[str, Any]]]:
    with app.db.read() as session:
        return {
            table: [
                {key: value for key, value in row.items() if key != "embedding"}
                for row in session.execute(text(f"SELECT * FROM {table} ORDER BY 1")).mappings()
            ]
            for table in TABLES
        }


async def _over_mcp(app: App, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    async with Client(build_server(app)) as client:
        result = await client.call_tool(tool, arguments)
    return json.loads(result.content[0].text)


@pytest.mark.anyio
@pytest.mark.parametrize(("tool", "arguments"), CASES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(CASES)])
async def test_a_tool_call_and_a_library_call_agree(tmp_path, tool, arguments):
    over_mcp, as_library = _fresh_app(tmp_path / "mcp.db"), _fresh_app(tmp_path / "library.db")
    try:
        answer = await _over_mcp(over_mcp, tool, arguments)
        assert answer == LIBRARY[tool](as_library, **arguments)
        assert _rows(over_mcp) == _rows(as_library)
    finally:
        over_mcp.db.close()
        as_library.db.close()


def test_the_cases_cover_every_tool_they_name():
    assert {tool for tool, _ in CASES} == set(LIBRARY)
