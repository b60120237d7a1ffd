"""traverse: the declared neighbourhood of an entity (spec associations §5, TV-1 … TV-11).

The graphs are declared through declare_associations (and store's rider) on a
real SQLite file; relation recency is controlled with the App's clock, since
TV-5/TV-8 order by declaration time.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from mcp import Client
from sqlalchemy import text

from cpersona.mcp.server import build_server
from cpersona.services.graph.associations import declare_associations
from cpersona.services.records.episodes import archive_episode
from cpersona.services.records.memories import store
from cpersona.services.graph import traverse as traverse_module
from cpersona.services.graph.traverse import traverse
from cpersona.storage.engine import Database

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

T0 = datetime(2026, 11, 30, 3, 59, 33, tzinfo=timezone.utc)


class Clock:
    """Moves one second per call, so each declaration call gets a later stamp."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


@pytest.fixture
def app(app):
    app.clock = Clock()
    return app


def declare(app, **kwargs: Any) -> dict[str, Any]:
    answer = declare_associations(app, **kwargs)
    assert answer["ok"] is True and answer["dropped"] == [], answer
    return answer


def names(answer: dict[str, Any]) -> list[tuple[str, int]]:
    return [(e["name"], e["hops"]) for e in answer["entities"]]


def mizeye(app) -> None:
    """The graph of the spec's examples: Kirari maintains MizEye, MizEye depends on OpenCV."""
    store(
        app,
        agent_id="spec",
        content="Kirari maintains the MizEye vision module",
        associations={
            "entities": [{"name": "MizEye", "aliases": ["mizeye", "ミズアイ"]}, {"name": "Kirari"}],
            "relations": [{"subject": "Kirari", "predicate": "Maintains", "object": "MizEye"}],
        },
    )
    store(
        app,
        agent_id="spec",
        content="MizEye depends on OpenCV",
        associations={
            "entities": [{"name": "OpenCV"}],
            "relations": [{"subject": "MizEye", "predicate": "depends on", "object": "OpenCV"}],
        },
    )
    store(app, agent_id="spec", content="OpenCV 4.10 upgrade notes", associations={"entities": [{"name": "OpenCV"}]})


def test_the_spec_examples(app) -> None:  # TV-1, TV-3, TV-5 … TV-9, §5.2
    mizeye(app)
    stamp = {r["id"]: r["declared_at"] for r in traverse(app, agent_id="spec", entity="mizeye")["relations"]}
    assert traverse(app, agent_id="spec", entity="mizeye") == {
        "entity": "mizeye",
        "max_hops": 1,
        "limit": 20,
        "entities": [
            {"id": 1, "name": "MizEye", "hops": 0, "aliases": ["mizeye", "ミズアイ"], "mentions": ["mem:1"]},
            {"id": 3, "name": "OpenCV", "hops": 1, "mentions": ["mem:2", "mem:3"]},
            {"id": 2, "name": "Kirari", "hops": 1, "mentions": ["mem:1"]},
        ],
        "relations": [
            {
                "id": 2,
                "subject": 1,
                "predicate": "depends on",
                "object": 3,
                "declared_by": "agent",
                "declared_at": stamp[2],
                "anchor_ref": "mem:2",
            },
            {
                "id": 1,
                "subject": 2,
                "predicate": "maintains",
                "object": 1,
                "declared_by": "agent",
                "declared_at": stamp[1],
                "anchor_ref": "mem:1",
            },
        ],
    }
    assert stamp[2] > stamp[1]
    assert traverse(app, agent_id="spec", entity="OpenCV", max_hops=0, limit=1) == {
        "entity": "OpenCV",
        "max_hops": 0,
        "limit": 1,
        "entities": [{"id": 3, "name": "OpenCV", "hops": 0, "mentions": ["mem:2"], "mentions_omitted": 1}],
        "relations": [],
        "bounds": {"omitted": ["max_hops", "limit"]},
    }
    assert traverse(app, agent_id="spec", entity="Kirari", max_hops=1, limit=2) == {
        "entity": "Kirari",
        "max_hops": 1,
        "limit": 2,
        "entities": [
            {"id": 2, "name": "Kirari", "hops": 0, "mentions": ["mem:1"]},
            {"id": 1, "name": "MizEye", "hops": 1, "aliases": ["mizeye", "ミズアイ"], "mentions": ["mem:1"]},
        ],
        "relations": [
            {
                "id": 1,
                "subject": 2,
                "predicate": "maintains",
                "object": 1,
                "declared_by": "agent",
                "declared_at": stamp[1],
                "anchor_ref": "mem:1",
            }
        ],
        "bounds": {"omitted": ["max_hops"]},
    }
    assert traverse(app, agent_id="spec", entity="nothing here") == {
        "entity": "nothing here",
        "max_hops": 1,
        "limit": 20,
        "entities": [],
        "relations": [],
        "reason": "no_such_entity",
    }


def test_two_starts_and_the_same_triple_twice(app) -> None:  # TV-1, TV-8, A-6, A-17
    for content in ("one", "two"):
        store(app, agent_id="a", content=content)
    store(app, agent_id="a", content="three", project_id="P")
    declare(
        app,
        agent_id="a",
        anchor_ref="mem:1",
        associations={
            "entities": [{"name": "Atlas", "aliases": ["atlas-svc"]}, {"name": "Postgres"}],
            "relations": [{"subject": "Atlas", "predicate": "uses", "object": "Postgres"}],
        },
    )
    declare(app, agent_id="a", anchor_ref="mem:2", associations={"entities": [{"name": "Atlas"}]})
    declare(
        app,
        agent_id="a",
        anchor_ref="mem:3",
        project_id="P",
        associations={"entities": [{"name": "Atlas", "aliases": ["the-ledger-app"]}]},
    )
    declare(
        app, agent_id="a", associations={"relations": [{"subject": "Atlas", "predicate": "uses", "object": "Postgres"}]}
    )
    for project in (None, "P"):
        answer = traverse(app, agent_id="a", entity="atlas", project_id=project)
        assert [(e["id"], e["name"], e["hops"], e.get("aliases"), e.get("mentions")) for e in answer["entities"]] == [
            (1, "Atlas", 0, ["atlas-svc"], ["mem:1", "mem:2"]),
            (3, "Atlas", 0, ["the-ledger-app"], ["mem:3"]),
            (2, "Postgres", 1, None, ["mem:1"]),
        ]
        assert [(r["id"], r.get("anchor_ref")) for r in answer["relations"]] == [(2, None), (1, "mem:1")]
    # the global pool only: P's Atlas is not readable, nor is mem:3
    only_global = traverse(app, agent_id="a", entity="atlas", project_id="")
    assert [e["id"] for e in only_global["entities"]] == [1, 2]
    # with a source nobody used, no record is listed
    nobody = traverse(app, agent_id="a", entity="atlas", source_id="someone")
    assert all("mentions" not in e for e in nobody["entities"])


def test_isolation_of_entities_relations_and_mentions(app) -> None:  # TV-1, TV-3, TV-7, ISO-1 … ISO-4
    store(app, agent_id="a", content="global note")
    store(app, agent_id="a", content="P c1 note", project_id="P", channel="c1")
    store(app, agent_id="b", content="b note")
    declare(
        app,
        agent_id="a",
        anchor_ref="mem:1",
        associations={
            "entities": [{"name": "Atlas"}, {"name": "Postgres"}],
            "relations": [{"subject": "Atlas", "predicate": "uses", "object": "Postgres"}],
        },
    )
    declare(
        app,
        agent_id="a",
        anchor_ref="mem:2",
        project_id="P",
        channel="c1",
        associations={
            "entities": [{"name": "atlas"}, {"name": "Zed", "aliases": ["zz"]}],
            "relations": [{"subject": "Zed", "predicate": "uses", "object": "Atlas"}],
        },
    )
    everything = traverse(app, agent_id="a", entity="atlas")
    assert names(everything) == [("Atlas", 0), ("Zed", 1), ("Postgres", 1)]  # Zed: the newer relation first
    assert everything["entities"][0]["mentions"] == ["mem:1", "mem:2"]
    # another channel: the channel-scoped relation, entity and memory are out of reach
    other_channel = traverse(app, agent_id="a", entity="atlas", channel="c2")
    assert names(other_channel) == [("Atlas", 0), ("Postgres", 1)]
    assert other_channel["entities"][0]["mentions"] == ["mem:1"]
    # Zed lives in (P, c1) only
    assert traverse(app, agent_id="a", entity="zed", project_id="")["reason"] == "no_such_entity"
    assert names(traverse(app, agent_id="a", entity="zz", channel="c1")) == [("Zed", 0), ("Atlas", 1)]
    # another agent reads nothing of it
    assert traverse(app, agent_id="b", entity="atlas")["reason"] == "no_such_entity"


def test_episodes_and_the_source_filter(app) -> None:  # TV-7, ISO-3, ISO-4
    store(app, agent_id="a", content="from dana", source={"type": "User", "id": "discord:42", "name": "Dana"})
    store(app, agent_id="a", content="from eve", source={"type": "User", "id": "discord:7", "name": "Eve"})
    ep = archive_episode(app, agent_id="a", summary="the sync", channel="c")["episode_id"]
    for anchor in ("mem:1", "mem:2", f"ep:{ep}"):
        declare(app, agent_id="a", anchor_ref=anchor, associations={"entities": [{"name": "Sync"}]})

    def mentions(**kwargs: Any) -> list[str]:
        return traverse(app, agent_id="a", entity="sync", **kwargs)["entities"][0].get("mentions", [])

    assert mentions() == ["ep:1", "mem:1", "mem:2"]  # by id; at equal id ep before mem
    assert mentions(source_id="discord:42") == ["mem:1"]  # exact: ends in a digit; episodes skipped
    assert mentions(source_id="discord:") == ["mem:1", "mem:2"]  # prefix: ends in ':'
    assert mentions(source_id="discord:", channel="c") == ["ep:1", "mem:1", "mem:2"]  # a channel brings episodes back
    assert mentions(source_id="nobody") == []


def test_breadth_first_hops_and_the_hop_bound(app) -> None:  # TV-2, TV-3, TV-9
    chain = [f"N{i}" for i in range(8)]
    declare(
        app,
        agent_id="a",
        associations={
            "relations": [{"subject": chain[i], "predicate": "next", "object": chain[i + 1]} for i in range(7)]
        },
    )
    answer = traverse(app, agent_id="a", entity="n0", max_hops=3)
    assert names(answer) == [("N0", 0), ("N1", 1), ("N2", 2), ("N3", 3)]
    assert answer["bounds"] == {"omitted": ["max_hops"]}  # N3 -> N4 was loaded but not followed
    assert [(r["subject"], r["object"]) for r in answer["relations"]] == [(1, 2), (2, 3), (3, 4)]
    # either direction, and the clamp (the schema enforces 0..5; in-process values are clamped)
    backwards = traverse(app, agent_id="a", entity="N7", max_hops=99, limit=500)
    assert (backwards["max_hops"], backwards["limit"]) == (5, 100)
    assert names(backwards) == [(f"N{7 - i}", i) for i in range(6)]
    whole = traverse(app, agent_id="a", entity="N3", max_hops=5)
    assert "bounds" not in whole and len(whole["entities"]) == 8
    assert traverse(app, agent_id="a", entity="N3", max_hops=-4, limit=0)["max_hops"] == 0


def test_entity_order_follows_the_recency_of_the_reaching_relation(app) -> None:  # TV-5, TV-8
    declare(app, agent_id="a", associations={"relations": [{"subject": "Hub", "predicate": "p", "object": "Old"}]})
    declare(app, agent_id="a", associations={"relations": [{"subject": "Mid", "predicate": "p", "object": "Hub"}]})
    declare(
        app,
        agent_id="a",
        associations={
            "relations": [
                {"subject": "Hub", "predicate": "p", "object": "New"},
                {"subject": "Hub", "predicate": "q", "object": "Old"},
            ]
        },
    )
    answer = traverse(app, agent_id="a", entity="hub")
    # New and Old were both reached by the newest call (ties: lower relation id); Mid by an older one
    assert names(answer) == [("Hub", 0), ("New", 1), ("Old", 1), ("Mid", 1)]
    assert [r["predicate"] + ":" + str(r["object"]) for r in answer["relations"]] == [
        "p:" + str(answer["entities"][1]["id"]),
        "q:" + str(answer["entities"][2]["id"]),
        "p:1",
        "p:2",
    ]


def test_limit_cuts_entities_and_mentions(app) -> None:  # TV-6, TV-7, TV-9
    for i in range(5):
        store(app, agent_id="a", content=f"note {i}")
    for i in range(1, 6):
        declare(app, agent_id="a", anchor_ref=f"mem:{i}", associations={"entities": [{"name": "Root"}]})
    declare(
        app,
        agent_id="a",
        associations={"relations": [{"subject": "Root", "predicate": "p", "object": f"Leaf{i}"} for i in range(4)]},
    )
    answer = traverse(app, agent_id="a", entity="root", limit=3)
    assert len(answer["entities"]) == 3 and answer["entities_omitted"] == 2
    assert answer["entities"][0]["mentions"] == ["mem:1", "mem:2", "mem:3"]
    assert answer["entities"][0]["mentions_omitted"] == 2
    assert answer["bounds"] == {"omitted": ["limit"]}
    kept = {e["id"] for e in answer["entities"]}
    assert all(r["subject"] in kept and r["object"] in kept for r in answer["relations"])
    assert len(answer["relations"]) == 2


def test_a_self_relation_is_listed_with_its_entity(app) -> None:  # TV-8
    declare(app, agent_id="a", associations={"relations": [{"subject": "E1", "predicate": "self", "object": "e1"}]})
    answer = traverse(app, agent_id="a", entity="E1")
    assert names(answer) == [("E1", 0)]
    assert [(r["subject"], r["object"]) for r in answer["relations"]] == [(1, 1)]
    assert "bounds" not in answer


def test_record_relations_and_deleted_records_are_not_part_of_the_graph(app, db: Database) -> None:  # TV-3, LR-2
    store(app, agent_id="a", content="one")
    store(app, agent_id="a", content="two")
    declare(
        app,
        agent_id="a",
        anchor_ref="mem:1",
        associations={
            "entities": [{"name": "A"}],
            "relations": [
                {"subject": "mem:1", "predicate": "supports", "object": "mem:2"},
                {"subject": "A", "predicate": "in", "object": "mem:2"},
                {"subject": "A", "predicate": "p", "object": "B"},
            ],
        },
    )
    assert names(traverse(app, agent_id="a", entity="a")) == [("A", 0), ("B", 1)]
    with db.write_connection() as conn:
        conn.exec_driver_sql("DELETE FROM memories WHERE id = 1")
    answer = traverse(app, agent_id="a", entity="a")
    assert names(answer) == [("A", 0)] and answer["relations"] == []  # the anchored relation went with mem:1
    assert "mentions" not in answer["entities"][0]


def test_the_breadth_bound(app, monkeypatch) -> None:  # TV-4, TV-9
    monkeypatch.setattr(traverse_module, "MAX_REACHED", 4)
    declare(
        app,
        agent_id="a",
        associations={
            "relations": [
                {"subject": "S", "predicate": "p", "object": "Old1"},
                {"subject": "S", "predicate": "p", "object": "Old2"},
            ]
        },
    )
    declare(
        app,
        agent_id="a",
        associations={
            "relations": [
                {"subject": "S", "predicate": "p", "object": "New1"},
                {"subject": "S", "predicate": "p", "object": "New2"},
            ]
        },
    )
    answer = traverse(app, agent_id="a", entity="s", max_hops=3)
    # room for 3 besides the start: the two newest, then the lower relation id of the older call
    assert names(answer) == [("S", 0), ("New1", 1), ("New2", 1), ("Old1", 1)]
    assert answer["bounds"] == {"omitted": ["max_hops"]}


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"entity": "x"}, "agent_id is required"),
        ({"agent_id": 5, "entity": "x"}, "agent_id must be a string"),
        ({"agent_id": "a"}, "entity is required"),
        ({"agent_id": "a", "entity": ["x"]}, "entity must be a string"),
    ],
)
def test_bad_arguments_from_library_callers(app, arguments, error) -> None:
    assert traverse(app, **arguments) == {"ok": False, "error": error}


def test_traverse_never_writes(app, db: Database) -> None:  # TV-11
    mizeye(app)
    with db.read() as session:
        before = session.execute(text("SELECT recall_count, last_recalled_at FROM memories")).all()
    app.writes_paused = True  # the pause does not apply to reads
    assert traverse(app, agent_id="spec", entity="mizeye")["entities"]
    with db.read() as session:
        assert session.execute(text("SELECT recall_count, last_recalled_at FROM memories")).all() == before


@pytest.mark.anyio
async def test_traverse_over_mcp(app) -> None:  # §5.1 schema bounds (G-3)
    mizeye(app)
    async with Client(build_server(app)) as client:
        good = await client.call_tool("traverse", {"agent_id": "spec", "entity": "MizEye", "max_hops": 0})
        too_far = await client.call_tool("traverse", {"agent_id": "spec", "entity": "x", "max_hops": 6})
        no_limit = await client.call_tool("traverse", {"agent_id": "spec", "entity": "x", "limit": 0})
    assert good.is_error is False and good.structured_content["entities"][0]["name"] == "MizEye"
    assert too_far.is_error is True and "maximum of 5" in too_far.content[0].text
    assert no_limit.is_error is True and "minimum of 1" in no_limit.content[0].text


def through_facade(app, name: str, **arguments):
    """One call through the real call path, where the operating context's '@auto' is applied."""
    import anyio

    from cpersona.mcp.dispatch import call_tool
    from cpersona.mcp.gates import GateChain
    from cpersona.mcp.pause_gate import PauseGate
    from cpersona.mcp.tools import default_registry

    return anyio.run(call_tool, app, default_registry(), GateChain([PauseGate()]), name, arguments).payload


def test_auto_project_is_resolved_for_the_read(db: Database, tmp_path) -> None:  # spec §5.2, OC-8, OC-11
    from conftest import make_app

    path = tmp_path / "ctx.toml"
    path.write_text(
        'version = 1\ncontext_revision = "r1"\n[registry]\nproject_ids = ["", "ops"]\n'
        'enforce = "reject"\n[defaults]\n"claude-code" = "ops"\n',
        encoding="utf-8",
    )
    app = make_app(db, OPERATING_CONTEXT_PATH=str(path))
    declare(app, agent_id="claude-code", project_id="ops", associations={"entities": [{"name": "Atlas"}]})
    declare(app, agent_id="claude-code", project_id="", associations={"entities": [{"name": "Atlas"}]})
    answer = through_facade(app, "traverse", agent_id="claude-code", entity="atlas", project_id="@auto")
    assert answer["resolved_project_id"] == "ops" and [e["id"] for e in answer["entities"]] == [1, 2]
    # a read is warned, never refused, even in reject mode
    other = through_facade(app, "traverse", agent_id="claude-code", entity="atlas", project_id="zzz")
    assert other["operating_context_warning"] == "project_id 'zzz' not in registry (rev r1)"
    assert [e["id"] for e in other["entities"]] == [2]


def test_only_declared_data_comes_back(app) -> None:  # spec TV-10
    anchor = store(app, agent_id="a", content="Mina owns the release calendar and also likes Atlas.")["id"]
    declare(
        app,
        agent_id="a",
        anchor_ref=f"mem:{anchor}",
        associations={
            "entities": [{"name": "Mina"}],
            "relations": [{"subject": "Mina", "predicate": "owns", "object": "Release calendar"}],
        },
    )
    out = traverse(app, agent_id="a", entity="Mina", max_hops=2)
    names = {e["name"] for e in out["entities"]}
    assert names == {"Mina", "Release calendar"}  # Atlas is only in the text: never inferred
    assert "Mina owns" not in str(out)  # no record text
    # the relation ids listed are the ones retract takes
    ids = [r["id"] for r in out["relations"]]
    answer = declare_associations(app, agent_id="a", retract={"relations": ids})
    assert answer["retracted"]["relations"] == len(ids) == 1
    assert traverse(app, agent_id="a", entity="Mina")["relations"] == []
