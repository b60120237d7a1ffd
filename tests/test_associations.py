"""declare_associations and the associations rider of store (spec associations §1–§4, CA-5).

Service functions are called directly on a real SQLite file; the MCP facade is
driven through the SDK's in-process client where the published schema matters.
Expected answers are the reference's (CPersona 2.6.14) where the spec shows them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import Client
from sqlalchemy import text

from cpersona.mcp.server import build_server
from cpersona.mcp.tools import default_registry
from cpersona.services.records.admin import delete_agent_data
from cpersona.services.graph.associations import (
    declare,
    declare_associations,
    delete_agent_associations,
    entities_mentioned_by,
    normalize,
    parse_ref,
    record_relations,
    resolve_visible,
)
from cpersona.services.records.episodes import archive_episode
from cpersona.services.records.memories import store
from cpersona.storage.engine import Database
from cpersona.storage.scope import Scope
from conftest import refuse_inserts

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

STAMP = "2026-11-30T04:01:11.432103+00:00"


def rows(db: Database, sql: str, **params: Any) -> list[tuple]:
    with db.read() as session:
        return [tuple(r) for r in session.execute(text(sql), params)]


def declared(app, **kwargs: Any) -> dict[str, Any]:
    answer = declare_associations(app, **kwargs)
    assert answer["ok"] is True and answer["result"] == "declared", answer
    return answer


def notes(app, agent: str = "dz", count: int = 2, **kwargs: Any) -> list[int]:
    return [store(app, agent_id=agent, content=f"note {agent} {i}", **kwargs)["id"] for i in range(count)]


# -- normalization and refs (A-1 … A-3, §0.3) -----------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  Big \t  Thing\n", "big thing"),  # runs of whitespace collapse, ends trimmed
        ("ＡＴＬＡＳ", "atlas"),  # NFKC folds full-width letters
        ("Straße", "strasse"),  # full case fold, not lower()
        ("ﬁle", "file"),  # NFKC ligature
        ("Temporal_Predecessor", "temporal_predecessor"),
    ],
)
def test_normalization_is_nfkc_casefold_and_whitespace(raw: str, expected: str) -> None:  # spec A-1
    assert normalize(raw) == expected


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("mem:1", "mem:1"),
        ("ep:42", "ep:42"),
        ("mem:007", "mem:7"),
        (" mem:3 ", "mem:3"),
        ("mem:99999999999999999999999", "mem:99999999999999999999999"),
        ("Mem:1", None),
        ("mem:-1", None),
        ("mem:+1", None),
        ("mem: 1", None),
        ("mem:", None),
        ("memo:1", None),
        ("mem:1:2", None),
        ("mem:１", None),
        (5, None),
    ],
)
def test_ref_shapes(raw: Any, canonical: str | None) -> None:  # spec §0.3
    parsed = parse_ref(raw)
    assert (parsed.canonical if parsed else None) == canonical


# -- the reference's worked example (§3.2) -------------------------------------------------------


def test_the_worked_example_of_the_spec(app, db: Database) -> None:  # spec … A-17, §3.2
    notes(app)
    declared(
        app,
        agent_id="dz",
        associations={"entities": [{"name": "Atlas", "aliases": ["atlas-svc"]}, {"name": "Postgres"}]},
    )
    answer = declared(
        app,
        agent_id="dz",
        anchor_ref="mem:1",
        associations={
            "entities": [
                {"name": "Issue 412", "aliases": ["bug412", "atlas-svc", "   ", "x" * 300, "Postgres", "BUG412"]},
                {"name": "y" * 300},
            ],
            "relations": [
                {"subject": "Postgres", "predicate": "fixes", "object": "Issue 412"},
                {"subject": "mem:999", "predicate": "p", "object": "Atlas"},
                {"subject": "mem:99999999999999999999999", "predicate": "p", "object": "Atlas"},
                {"subject": "Atlas", "predicate": "   ", "object": "Postgres"},
                {"subject": "mem:1", "predicate": "Temporal_Predecessor", "object": "mem:2"},
                {"subject": "Atlas", "predicate": "uses", "object": "z" * 300},
            ],
        },
    )
    assert answer == {
        "ok": True,
        "result": "declared",
        "entities": [{"id": 3, "name": "Issue 412", "created": True}],
        "mentions": 1,
        "relations": [1, 2],
        "dropped": [
            {"item": "entities[0].aliases[1]", "reason": "already names another entity in this scope"},
            {"item": "entities[0].aliases[2]", "reason": "must be a nonempty string"},
            {"item": "entities[0].aliases[3]", "reason": "must be a nonempty string"},
            {"item": "entities[0].aliases[4]", "reason": "already names another entity in this scope"},
            {"item": "entities[1]", "reason": "name must be a nonempty string"},
            {"item": "relations[1].subject", "reason": "mem:999 is not a record of this agent"},
            {"item": "relations[2].subject", "reason": "mem:99999999999999999999999 is not a record of this agent"},
            {"item": "relations[3]", "reason": "predicate must be a nonempty string"},
            {"item": "relations[5].object", "reason": "endpoint must be an entity name or a record ref"},
        ],
    }
    # BUG412 normalizes like bug412: one alias row; the predicate is stored folded
    assert rows(db, "SELECT alias, normalized FROM entity_aliases WHERE entity_id = 3") == [("bug412", "bug412")]
    assert rows(
        db, "SELECT subject_kind, subject_id, predicate, object_kind, object_id, anchor_ref FROM relations"
    ) == [("entity", 2, "fixes", "entity", 3, "mem:1"), ("mem", 1, "temporal_predecessor", "mem", 2, "mem:1")]
    # the overflowing ref was never registered as a name
    assert rows(db, "SELECT count(*) FROM entities WHERE name LIKE 'mem:%'") == [(0,)]


def test_a_bad_anchor_is_dropped_once_and_the_rest_is_declared_without_it(app, db: Database) -> None:
    notes(app)
    answer = declared(
        app,
        agent_id="dz",
        anchor_ref="ep:5",
        associations={"entities": [{"name": "Q"}], "relations": [{"subject": "Q", "predicate": "r", "object": "Q"}]},
    )
    assert answer["dropped"] == [{"item": "anchor_ref", "reason": "ep:5 is not a record of this agent"}]
    assert answer["mentions"] == 0 and answer["entities"] == [{"id": 1, "name": "Q", "created": True}]
    assert rows(db, "SELECT anchor_ref FROM relations") == [("",)]
    assert rows(db, "SELECT count(*) FROM entity_mentions") == [(0,)]
    # another agent's record is not an anchor either; a trimmed, zero-padded one of ours is
    other = store(app, agent_id="someone-else", content="theirs")["id"]
    assert declared(app, agent_id="dz", anchor_ref=f"mem:{other}", associations={"entities": [{"name": "Q"}]})[
        "dropped"
    ] == [{"item": "anchor_ref", "reason": f"mem:{other} is not a record of this agent"}]
    assert (
        declared(app, agent_id="dz", anchor_ref=" mem:002 ", associations={"entities": [{"name": "Q"}]})["mentions"]
        == 1
    )
    assert rows(db, "SELECT ref FROM entity_mentions") == [("mem:2",)]  # stored canonical


def test_anchors_of_the_same_agent_in_other_projects_and_channels_count(app, db: Database) -> None:
    elsewhere = store(app, agent_id="dz", content="elsewhere", project_id="P", channel="c")["id"]
    answer = declared(
        app,
        agent_id="dz",
        anchor_ref=f"mem:{elsewhere}",
        associations={"relations": [{"subject": f"mem:{elsewhere}", "predicate": "p", "object": "X"}]},
    )
    assert answer["dropped"] == [] and len(answer["relations"]) == 1
    ep = archive_episode(app, agent_id="dz", summary="an episode", channel="other")["episode_id"]
    assert (
        declared(app, agent_id="dz", anchor_ref=f"ep:{ep}", associations={"entities": [{"name": "E"}]})["mentions"] == 1
    )


def test_nothing_is_checked_or_written_for_an_empty_declaration(app, db: Database) -> None:  # §3.2, A-12
    empty = {"ok": True, "result": "declared", "entities": [], "mentions": 0, "relations": [], "dropped": []}
    assert declare_associations(app, agent_id="dz") == empty
    assert declare_associations(app, agent_id="dz", associations={}, anchor_ref="mem:77") == empty
    # a non-empty object runs the declaration, so a bad anchor is reported even with no items
    assert declared(app, agent_id="dz", anchor_ref="mem:77", associations={"entities": []})["dropped"] == [
        {"item": "anchor_ref", "reason": "mem:77 is not a record of this agent"}
    ]
    assert rows(db, "SELECT count(*) FROM entities") == [(0,)]


# -- entities and aliases (A-3 … … A-15) --------------------------------------------


def test_names_are_stored_trimmed_as_written_and_matched_normalized(app, db: Database) -> None:
    notes(app, count=1)
    first = declared(app, agent_id="dz", anchor_ref="mem:1", associations={"entities": [{"name": "  Big   Thing "}]})
    assert first["entities"] == [{"id": 1, "name": "Big   Thing", "created": True}]
    again = declared(
        app,
        agent_id="dz",
        anchor_ref="mem:1",
        associations={"entities": [{"name": "big thing"}, {"name": "BIG THING"}]},
    )
    # the report echoes the item's name, not the stored one; mentions count declarations
    assert again["entities"] == [
        {"id": 1, "name": "big thing", "created": False},
        {"id": 1, "name": "BIG THING", "created": False},
    ]
    assert again["mentions"] == 2
    assert rows(db, "SELECT name, normalized FROM entities") == [("Big   Thing", "big thing")]
    assert rows(db, "SELECT entity_id, ref FROM entity_mentions") == [(1, "mem:1")]


def test_text_bounds_of_names_aliases_and_predicates(app, db: Database) -> None:
    answer = declared(
        app,
        agent_id="dz",
        associations={
            "entities": [
                {"name": "x" * 256},
                {"name": "y" * 257},
                {"name": " " + "z" * 256 + " "},
                {"name": "\u3000"},
                {"name": 5},
                "not an object",
                {"aliases": ["a"]},
            ],
            "relations": [
                {"subject": "A", "predicate": "p" * 257, "object": "B"},
                {"subject": "A", "predicate": "p" * 256, "object": "B"},
                {"subject": "A", "predicate": 7, "object": "B"},
                "not an object",
            ],
        },
    )
    assert [e["name"] for e in answer["entities"]] == ["x" * 256, "z" * 256]
    assert answer["dropped"] == [
        {"item": "entities[1]", "reason": "name must be a nonempty string"},
        {"item": "entities[3]", "reason": "name must be a nonempty string"},
        {"item": "entities[4]", "reason": "name must be a nonempty string"},
        {"item": "entities[5]", "reason": "name must be a nonempty string"},
        {"item": "entities[6]", "reason": "name must be a nonempty string"},
        {"item": "relations[0]", "reason": "predicate must be a nonempty string"},
        {"item": "relations[2]", "reason": "predicate must be a nonempty string"},
        {"item": "relations[3]", "reason": "must be an object"},
    ]
    assert len(answer["relations"]) == 1


def test_item_bounds(app, db: Database) -> None:
    answer = declared(
        app,
        agent_id="dz",
        associations={
            "entities": [{"name": f"E{i}"} for i in range(66)]
            + [{"name": "Q", "aliases": [f"q{i}" for i in range(34)]}],
            "relations": [{"subject": f"R{i}", "predicate": "p", "object": "S"} for i in range(65)],
        },
    )
    assert len(answer["entities"]) == 64
    assert answer["dropped"] == [
        {"item": "entities[64]", "reason": "beyond the 64-item bound"},
        {"item": "entities[65]", "reason": "beyond the 64-item bound"},
        {"item": "entities[66]", "reason": "beyond the 64-item bound"},
        {"item": "relations[64]", "reason": "beyond the 64-item bound"},
    ]
    assert len(answer["relations"]) == 64
    aliases = declared(
        app, agent_id="dz", associations={"entities": [{"name": "Q", "aliases": [f"q{i}" for i in range(34)]}]}
    )
    assert aliases["dropped"] == [
        {"item": "entities[0].aliases[32]", "reason": "beyond the 32-alias bound"},
        {"item": "entities[0].aliases[33]", "reason": "beyond the 32-alias bound"},
    ]
    assert rows(db, "SELECT count(*) FROM entity_aliases") == [(32,)]


def test_alias_rules(app, db: Database) -> None:
    answer = declared(
        app,
        agent_id="dz",
        associations={
            "entities": [
                {"name": "A", "aliases": []},
                {"name": "B", "aliases": ["", "b", "A", "a2", "a2", "\u3000", 5]},
                {"name": "C", "aliases": "notalist"},
            ]
        },
    )
    assert answer["dropped"] == [
        {"item": "entities[1].aliases[0]", "reason": "must be a nonempty string"},
        {"item": "entities[1].aliases[2]", "reason": "already names another entity in this scope"},
        {"item": "entities[1].aliases[5]", "reason": "must be a nonempty string"},
        {"item": "entities[1].aliases[6]", "reason": "must be a nonempty string"},
        {"item": "entities[2].aliases", "reason": "must be a list"},
    ]
    assert [e["name"] for e in answer["entities"]] == ["A", "B", "C"]  # C still registered
    # an alias equal to the entity's own name, and a repeat, are accepted silently; one row each
    assert rows(db, "SELECT alias FROM entity_aliases ORDER BY normalized") == [("a2",), ("b",)]
    # names and aliases are one namespace: the alias finds B
    assert declared(app, agent_id="dz", associations={"entities": [{"name": "A2"}]})["entities"] == [
        {"id": 2, "name": "A2", "created": False}
    ]


def test_visible_scopes_resolve_nearest_first(app, db: Database) -> None:
    glob = declared(app, agent_id="dz", associations={"entities": [{"name": "Atlas"}]})["entities"][0]["id"]
    in_p = declared(
        app,
        agent_id="dz",
        project_id="P",
        associations={"relations": [{"subject": "Atlas", "predicate": "uses", "object": "Ledger"}]},
    )
    # the endpoint reused the global Atlas; the unknown name registered in exactly (P, '')
    assert rows(db, "SELECT subject_id, object_id, project_id FROM relations") == [(glob, 2, "P")]
    assert rows(db, "SELECT name, project_id, channel FROM entities WHERE id = 2") == [("Ledger", "P", "")]
    assert in_p["entities"] == []  # endpoint entities are not reported and get no mention
    # a channel-scoped declaration sees (P, c), (P, ''), ('', c), ('', '') in that order
    declared(app, agent_id="dz", channel="c", associations={"entities": [{"name": "Ledger"}]})  # ('', c): new id 3
    with db.read() as session:
        assert resolve_visible(session, "dz", "ledger", project_id="P", channel="c") == 2  # (P, '') before ('', c)
        assert resolve_visible(session, "dz", "ledger", project_id="Q", channel="c") == 3
        assert resolve_visible(session, "dz", "ledger") is None
        assert resolve_visible(session, "dz", "atlas", project_id="P", channel="c") == glob
        assert resolve_visible(session, "other-agent", "atlas") is None


def test_aliases_pin_the_declaring_scope(app, db: Database) -> None:
    declared(app, agent_id="dz", associations={"entities": [{"name": "Atlas", "aliases": ["atlas-svc"]}]})
    pinned = declared(
        app,
        agent_id="dz",
        project_id="P",
        associations={"entities": [{"name": "Atlas", "aliases": ["the-ledger-app"]}]},
    )
    assert pinned["entities"] == [{"id": 2, "name": "Atlas", "created": True}]  # a second Atlas, in P
    reused = declared(app, agent_id="dz", project_id="P", associations={"entities": [{"name": "atlas"}]})
    assert reused["entities"] == [{"id": 2, "name": "atlas", "created": False}]  # (P, '') is nearest now
    # an item whose aliases are all invalid does not pin: the visible search applies
    loose = declared(
        app, agent_id="dz", project_id="Q", associations={"entities": [{"name": "Atlas", "aliases": ["  "]}]}
    )
    assert loose["entities"] == [{"id": 1, "name": "Atlas", "created": False}]
    # the global alias is not claimed by P's Atlas
    taken = declared(
        app, agent_id="dz", project_id="P", associations={"entities": [{"name": "Atlas", "aliases": ["atlas-svc"]}]}
    )
    assert taken["dropped"] == [
        {"item": "entities[0].aliases[0]", "reason": "already names another entity in this scope"}
    ]


def test_scopes_are_per_agent(app, db: Database) -> None:  # isolation: agent is exact
    declared(app, agent_id="a", associations={"entities": [{"name": "Shared", "aliases": ["sh"]}]})
    answer = declared(app, agent_id="b", associations={"entities": [{"name": "Other", "aliases": ["sh"]}]})
    assert answer["dropped"] == [] and answer["entities"][0]["created"] is True
    assert declared(app, agent_id="", associations={"entities": [{"name": "Shared"}]})["entities"][0]["created"]


# -- relations (A-16, A-17, A-18) ---------------------------------------------------------------


def test_relation_keys_and_endpoints(app, db: Database) -> None:
    m1, m2 = notes(app)
    first = declared(
        app,
        agent_id="dz",
        anchor_ref="mem:1",
        associations={
            "relations": [
                {"subject": "Atlas", "predicate": "Uses", "object": "Postgres"},
                {"subject": "atlas", "predicate": "  uses ", "object": "POSTGRES"},  # same key: same id
                {"subject": f"mem:00{m1}", "predicate": "corrects", "object": f"mem:{m2}"},
                {"subject": "Atlas", "predicate": "self", "object": "atlas"},
                {"subject": "NewThing", "predicate": "p", "object": "mem:999"},
            ]
        },
    )
    uses, same, corrects, itself = first["relations"]
    assert uses == same and len({uses, corrects, itself}) == 3  # the row holding the key, new or not
    assert first["dropped"] == [{"item": "relations[4].object", "reason": "mem:999 is not a record of this agent"}]
    # the same triple with another anchor (or none) is another relation
    second = declared(
        app,
        agent_id="dz",
        associations={"relations": [{"subject": "Atlas", "predicate": "uses", "object": "Postgres"}]},
    )
    assert second["relations"][0] not in first["relations"]
    assert rows(db, "SELECT count(*) FROM relations") == [(4,)]
    stamps = rows(db, "SELECT DISTINCT declared_at, declared_by FROM relations WHERE anchor_ref = 'mem:1'")
    assert len(stamps) == 1 and stamps[0][1] == "agent"  # one stamp per call
    assert stamps[0][0].endswith("+00:00") and len(stamps[0][0].split(".")[1]) == len("432103+00:00")
    # a subject resolved before its object failed stays registered, without a mention
    assert rows(db, "SELECT count(*) FROM entities WHERE name = 'NewThing'") == [(1,)]
    assert rows(db, "SELECT count(*) FROM entity_mentions") == [(0,)]
    with db.read() as session:
        assert [r.id for r in record_relations(session, Scope(agent_id="dz"), ["mem:1"])] == [corrects]


def test_string_endpoints_that_only_look_like_refs_are_names(app, db: Database) -> None:
    notes(app, count=1)
    answer = declared(
        app,
        agent_id="dz",
        associations={
            "relations": [
                {"subject": s, "predicate": "p", "object": "X"} for s in ("Mem:1", "mem:abc", "mem:-1", "mem:")
            ]
        },
    )
    assert answer["dropped"] == []
    assert rows(db, "SELECT name FROM entities ORDER BY id") == [
        ("Mem:1",),
        ("X",),
        ("mem:abc",),
        ("mem:-1",),
        ("mem:",),
    ]
    assert declared(
        app, agent_id="dz", associations={"relations": [{"subject": "mem:0", "predicate": "p", "object": "X"}]}
    )["dropped"] == [{"item": "relations[0].subject", "reason": "mem:0 is not a record of this agent"}]


def test_nul_in_names_is_refused_item_by_item(app, db: Database) -> None:  # ours: NUL never stored (sanitize.py)
    answer = declared(
        app,
        agent_id="dz",
        associations={
            "entities": [{"name": "A\x00B"}, {"name": "C", "aliases": ["c\x00"]}],
            "relations": [
                {"subject": "A\x00", "predicate": "p", "object": "C"},
                {"subject": "C", "predicate": "p\x00", "object": "C"},
            ],
        },
    )
    assert answer["dropped"] == [
        {"item": "entities[0]", "reason": "name must not contain a NUL character"},
        {"item": "entities[1].aliases[0]", "reason": "must not contain a NUL character"},
        {"item": "relations[0].subject", "reason": "endpoint must not contain a NUL character"},
        {"item": "relations[1]", "reason": "predicate must not contain a NUL character"},
    ]
    if db.is_sqlite:  # PostgreSQL text cannot hold a NUL at all
        assert rows(db, "SELECT count(*) FROM entities WHERE instr(name, char(0)) > 0") == [(0,)]


# -- retract (A-20, A-21, A-22) -----------------------------------------------------------------


def test_retract_removes_only_the_callers_rows(app, db: Database) -> None:
    notes(app, count=1)
    declared(
        app,
        agent_id="dz",
        anchor_ref="mem:1",
        associations={
            "entities": [{"name": "Atlas"}, {"name": "Postgres"}],
            "relations": [{"subject": "Atlas", "predicate": "uses", "object": "Postgres"}],
        },
    )
    stranger = declared(app, agent_id="b", retract={"relations": [1], "mentions": [{"entity": 1, "ref": "mem:1"}]})
    assert stranger["retracted"] == {"relations": 0, "mentions": 0}
    answer = declared(
        app,
        agent_id="dz",
        retract={
            "relations": [999, 1, "1", True],
            "mentions": [
                {"entity": 1, "ref": "mem:01"},
                {"entity": 2, "ref": "Mem:1"},
                {"entity": 2},
                {"ref": "mem:1"},
                {"entity": 2, "ref": " mem:1"},
                {"entity": True, "ref": "mem:1"},
                "x",
            ],
        },
    )
    assert answer == {
        "ok": True,
        "result": "declared",
        "entities": [],
        "mentions": 0,
        "relations": [],
        "dropped": [
            {"item": "retract.relations[2]", "reason": "must be an integer id"},
            {"item": "retract.relations[3]", "reason": "must be an integer id"},
            {"item": "retract.mentions[1]", "reason": "needs an integer entity and a record ref"},
            {"item": "retract.mentions[2]", "reason": "needs an integer entity and a record ref"},
            {"item": "retract.mentions[3]", "reason": "needs an integer entity and a record ref"},
            {"item": "retract.mentions[5]", "reason": "needs an integer entity and a record ref"},
            {"item": "retract.mentions[6]", "reason": "needs an integer entity and a record ref"},
        ],
        "retracted": {"relations": 1, "mentions": 2},
    }
    assert rows(db, "SELECT count(*) FROM relations") == [(0,)]
    assert rows(db, "SELECT count(*) FROM entity_mentions") == [(0,)]
    assert rows(db, "SELECT count(*) FROM entities") == [(2,)]  # retract never removes entities


def test_retract_bounds_and_shapes(app, db: Database) -> None:
    assert "retracted" not in declared(app, agent_id="dz", retract={})
    assert declared(app, agent_id="dz", retract={"relations": []})["retracted"] == {"relations": 0, "mentions": 0}
    answer = declared(app, agent_id="dz", retract={"relations": list(range(1, 67)), "mentions": "x"})
    assert answer["dropped"] == [
        {"item": "retract.relations[64]", "reason": "beyond the 64-item bound"},
        {"item": "retract.relations[65]", "reason": "beyond the 64-item bound"},
        {"item": "retract.mentions", "reason": "must be a list"},
    ]


def test_declaration_then_retraction_in_one_call(app, db: Database) -> None:
    notes(app, count=1)
    answer = declared(
        app,
        agent_id="dz",
        anchor_ref="mem:1",
        associations={
            "entities": [{"name": "bad", "aliases": [""]}],
            "relations": [{"subject": "A", "predicate": "p", "object": "B"}],
        },
        retract={"relations": [1, "x"]},
    )
    # the declaration ran first (relation 1 was written), then the retraction removed it;
    # retract drops follow the declaration's own
    assert answer["relations"] == [1] and answer["retracted"] == {"relations": 1, "mentions": 0}
    assert [d["item"] for d in answer["dropped"]] == ["entities[0].aliases[0]", "retract.relations[1]"]
    assert rows(db, "SELECT count(*) FROM relations") == [(0,)]


# -- argument-level refusals (A-24) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({}, "agent_id is required"),
        ({"agent_id": 5}, "agent_id must be a string"),
        ({"agent_id": "a\x00"}, "agent_id contains the NUL character (U+0000) at position 1"),
        ({"agent_id": "a", "channel": "c" * 257}, "channel"),
        ({"agent_id": "a", "project_id": "p\x00"}, "project_id contains the NUL character (U+0000) at position 1"),
        ({"agent_id": "a", "associations": {"entities": [{"name": "\ud800"}]}}, "lone UTF-16 surrogate"),
    ],
)
def test_argument_refusals_keep_the_declaration_shape(app, db: Database, arguments, error) -> None:  # §0.2
    answer = declare_associations(app, **arguments)
    assert answer["ok"] is False and error in answer["error"]
    assert {k: answer[k] for k in ("result", "entities", "mentions", "relations", "dropped")} == {
        "result": "rejected",
        "entities": [],
        "mentions": 0,
        "relations": [],
        "dropped": [],
    }
    assert rows(db, "SELECT count(*) FROM entities") == [(0,)]


def test_a_database_failure_leaves_nothing_half_written(app, db: Database) -> None:
    notes(app, count=1)
    refuse_inserts(db, "relations", "disk said no", when=("predicate", "boom"))
    with pytest.raises(Exception, match="disk said no"):
        declare(
            app,
            agent_id="dz",
            anchor_ref="mem:1",
            associations={
                "entities": [{"name": "Kept?"}],
                "relations": [{"subject": "A", "predicate": "boom", "object": "B"}],
            },
        )
    assert rows(db, "SELECT count(*) FROM entities") == [(0,)]
    assert rows(db, "SELECT count(*) FROM entity_mentions") == [(0,)]


# -- the rider on store (AS-1 … AS-4) ---------------------------------------------------------------


def test_store_declares_against_the_new_memory(app, db: Database) -> None:  # AS-1, AS-4
    answer = store(
        app,
        agent_id="spec",
        content="Kirari maintains the MizEye vision module",
        associations={
            "entities": [{"name": "MizEye", "aliases": ["mizeye", "ミズアイ"]}, {"name": "Kirari"}],
            "relations": [{"subject": "Kirari", "predicate": "Maintains", "object": "MizEye"}],
        },
    )
    assert answer == {
        "ok": True,
        "result": "stored",
        "id": 1,
        "embedded": False,
        "associations": {
            "entities": [{"id": 1, "name": "MizEye", "created": True}, {"id": 2, "name": "Kirari", "created": True}],
            "mentions": 2,
            "relations": [1],
            "dropped": [],
        },
    }
    assert rows(db, "SELECT anchor_ref, predicate FROM relations") == [("mem:1", "maintains")]
    assert rows(db, "SELECT entity_id, ref FROM entity_mentions ORDER BY entity_id") == [(1, "mem:1"), (2, "mem:1")]


def test_store_rider_runs_for_a_duplicate_in_the_stores_own_scope(app, db: Database) -> None:  # AS-3, AS-4
    store(app, agent_id="spec", content="weekly sync notes", project_id="P", channel="c")
    answer = store(
        app,
        agent_id="spec",
        content="weekly sync notes",
        project_id="P",
        channel="c",
        associations={"entities": [{"name": "Tuesday sync"}]},
    )
    assert answer["result"] == "skipped" and answer["id"] == 1
    assert answer["associations"]["entities"] == [{"id": 1, "name": "Tuesday sync", "created": True}]
    assert rows(db, "SELECT project_id, channel FROM entities") == [("P", "c")]
    assert entities_of(db, "mem:1") == [1]


def entities_of(db: Database, ref: str) -> list[int]:
    with db.read() as session:
        return entities_mentioned_by(session, ref)


def test_store_rider_reports_malformed_items_and_keeps_the_memory(app, db: Database) -> None:  # AS-2
    answer = store(
        app, agent_id="spec", content="x", associations={"entities": "nope", "relations": [{"subject": "A"}]}
    )
    assert answer["result"] == "stored"
    assert answer["associations"] == {
        "entities": [],
        "mentions": 0,
        "relations": [],
        "dropped": [
            {"item": "entities", "reason": "must be a list"},
            {"item": "relations[0]", "reason": "predicate must be a nonempty string"},
        ],
    }
    other = store(app, agent_id="spec", content="y", associations={"other": 1})
    assert other["associations"] == {"entities": [], "mentions": 0, "relations": [], "dropped": []}


def test_store_rider_does_not_run_without_a_row(app, db: Database) -> None:  # AS-3
    assert "associations" not in store(app, agent_id="spec", content="x", associations={})
    refused = store(app, agent_id="spec", content="", associations={"entities": [{"name": "A"}]})
    assert refused["ok"] is False and "associations" not in refused
    assert rows(db, "SELECT count(*) FROM entities") == [(0,)]


def test_a_failing_rider_never_unstores_the_memory(app, db: Database) -> None:  # AS-4
    refuse_inserts(db, "entities", "disk said no")
    answer = store(app, agent_id="spec", content="still here", associations={"entities": [{"name": "A"}]})
    assert answer["result"] == "stored" and answer["id"] == 1
    assert answer["associations"] == {
        "entities": [],
        "mentions": 0,
        "relations": [],
        "dropped": [{"item": "associations", "reason": answer["associations"]["dropped"][0]["reason"]}],
    }
    assert answer["associations"]["dropped"][0]["reason"].startswith("declaration failed: ")
    assert "disk said no" in answer["associations"]["dropped"][0]["reason"]
    assert rows(db, "SELECT content FROM memories") == [("still here",)]


# -- removal with the agent (CA-5, DAD-1) --------------------------------------------------------


def test_delete_agent_data_removes_the_agents_declarations(app, db: Database) -> None:  # CA-5
    notes(app, agent="gone", count=1)
    notes(app, agent="stays", count=1)
    declared(
        app,
        agent_id="gone",
        anchor_ref="mem:1",
        associations={
            "entities": [{"name": "A", "aliases": ["a1"]}],
            "relations": [{"subject": "A", "predicate": "p", "object": "B"}],
        },
    )
    declared(
        app,
        agent_id="stays",
        anchor_ref="mem:2",
        associations={
            "entities": [{"name": "A", "aliases": ["a1"]}],
            "relations": [{"subject": "A", "predicate": "p", "object": "B"}],
        },
    )
    assert delete_agent_data(app, agent_id="gone")["ok"] is True
    assert rows(db, "SELECT DISTINCT agent_id FROM entities") == [("stays",)]
    assert rows(db, "SELECT DISTINCT agent_id FROM relations") == [("stays",)]
    assert rows(db, "SELECT count(*) FROM entity_aliases") == [(1,)]
    assert rows(db, "SELECT ref FROM entity_mentions") == [("mem:2",)]


def test_delete_agent_associations_in_the_callers_transaction(app, db: Database) -> None:  # CA-5
    declared(
        app,
        agent_id="gone",
        associations={
            "entities": [{"name": "A", "aliases": ["a1"]}],
            "relations": [{"subject": "A", "predicate": "p", "object": "B"}],
        },
    )
    with db.write() as session:
        assert delete_agent_associations(session, "gone") == {"entities": 2, "relations": 1}
    assert rows(db, "SELECT count(*) FROM entity_aliases") == [(0,)]


# -- the MCP declaration (A-19 as published, annotations) -----------------------------------------


def payload(result) -> dict[str, Any]:
    return json.loads(result.content[0].text)


@pytest.mark.anyio
async def test_declare_associations_over_mcp(app, db: Database) -> None:  # §3, A-19 (reference schema)
    spec = default_registry().get("declare_associations")
    assert spec.annotations.as_wire() == {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": True}
    store(app, agent_id="dz", content="evidence")
    async with Client(build_server(app)) as client:
        good = await client.call_tool(
            "declare_associations",
            {
                "agent_id": "dz",
                "anchor_ref": "mem:1",
                "bogus_key": 1,
                "associations": {"entities": [{"name": "Atlas", "aliases": ["", "atlas-svc"]}]},
            },
        )
        # the published nested schema refuses a relation without predicate (as the reference does)
        missing = await client.call_tool(
            "declare_associations", {"agent_id": "dz", "associations": {"relations": [{"subject": "A", "object": "B"}]}}
        )
        surrogate = await client.call_tool("declare_associations", {"agent_id": "dz", "anchor_ref": "\ud800"})
    assert good.is_error is False
    assert payload(good)["entities"] == [{"id": 1, "name": "Atlas", "created": True}]
    assert payload(good)["dropped"] == [{"item": "entities[0].aliases[0]", "reason": "must be a nonempty string"}]
    assert missing.is_error is True and "'predicate' is a required property" in payload(missing)["error"]
    answer = payload(surrogate)
    assert surrogate.is_error is False and answer["ok"] is False and answer["result"] == "rejected"
    assert (answer["entities"], answer["mentions"], answer["relations"], answer["dropped"]) == ([], 0, [], [])
    assert rows(db, "SELECT count(*) FROM relations") == [(0,)]


# -- the operating context (OC-7 … OC-11) -------------------------------------------------------

CONTEXT = """\
version = 1
context_revision = "rev-7"

[registry]
project_ids = ["", "ops"]
enforce = "{enforce}"

[defaults]
"claude-code" = "ops"
"""


def through_facade(app, name: str, **arguments):
    """One call through the real call path, where the operating context's '@auto' is applied."""
    import anyio

    from cpersona.mcp.dispatch import call_tool
    from cpersona.mcp.gates import GateChain
    from cpersona.mcp.pause_gate import PauseGate
    from cpersona.mcp.tools import default_registry

    return anyio.run(call_tool, app, default_registry(), GateChain([PauseGate()]), name, arguments).payload


def test_auto_project_and_the_registry(db: Database, tmp_path) -> None:  # spec §3.2, OC-8, OC-9, OC-11
    from conftest import make_app

    path = tmp_path / "ctx.toml"
    path.write_text(CONTEXT.format(enforce="warn"), encoding="utf-8")
    app = make_app(db, OPERATING_CONTEXT_PATH=str(path))
    answer = through_facade(
        app,
        "declare_associations",
        agent_id="claude-code",
        project_id="@auto",
        associations={"entities": [{"name": "Atlas"}]},
    )
    assert answer["ok"] is True and answer["resolved_project_id"] == "ops"
    assert rows(db, "SELECT project_id FROM entities") == [("ops",)]
    warned = through_facade(
        app, "declare_associations", agent_id="a", project_id="zzz", associations={"entities": [{"name": "B"}]}
    )
    assert warned["operating_context_warning"] == "project_id 'zzz' not in registry (rev rev-7)"

    path.write_text(CONTEXT.format(enforce="reject"), encoding="utf-8")
    refused = through_facade(
        app, "declare_associations", agent_id="a", project_id="zzz", associations={"entities": [{"name": "C"}]}
    )
    assert refused == {
        "ok": False,
        "result": "rejected",
        "entities": [],
        "mentions": 0,
        "relations": [],
        "dropped": [],
        "operating_context_revision": "rev-7",
        "error": "project_id 'zzz' not in registry (rev rev-7)",
    }
    assert rows(db, "SELECT count(*) FROM entities") == [(2,)]


# -- what a declaration writes: only what it names (A-10, A-11, A-23) ----------------------------


def test_nothing_is_extracted_from_record_text(app, db: Database) -> None:  # spec
    anchor = store(app, agent_id="dz", content="Atlas depends on Postgres; Mina owns the calendar.")["id"]
    answer = declared(
        app,
        agent_id="dz",
        anchor_ref=f"mem:{anchor}",
        associations={
            "entities": [{"name": "Mina"}, {"name": "Release calendar"}],
            "relations": [{"subject": "Mina", "predicate": "owns", "object": "Release calendar"}],
        },
    )
    assert answer["mentions"] == 2
    # Only the named entities exist (no Atlas or Postgres read out of the text) ...
    assert rows(db, "SELECT name FROM entities ORDER BY id") == [("Mina",), ("Release calendar",)]
    # ... each named entity is mentioned by the anchor, and the relation carries it
    assert rows(db, "SELECT entity_id, ref FROM entity_mentions ORDER BY entity_id") == [
        (1, f"mem:{anchor}"),
        (2, f"mem:{anchor}"),
    ]
    assert rows(db, "SELECT predicate, anchor_ref FROM relations") == [("owns", f"mem:{anchor}")]
    # an entity named only inside a relation is registered but not mentioned (A-10: nothing inferred)
    declared(
        app,
        agent_id="dz",
        anchor_ref=f"mem:{anchor}",
        associations={"relations": [{"subject": "Mina", "predicate": "uses", "object": "Atlas"}]},
    )
    assert rows(db, "SELECT count(*) FROM entity_mentions") == [(2,)]


@pytest.mark.anyio
async def test_a_paused_caller_writes_nothing(app, db: Database) -> None:  # spec A-23, §3.2 (paused)
    anchor = store(app, agent_id="dz", content="evidence")["id"]
    async with Client(build_server(app)) as client:
        await client.call_tool("pause_persistence", {"session_key": "s"})
        paused = payload(
            await client.call_tool(
                "declare_associations",
                {
                    "agent_id": "dz",
                    "anchor_ref": f"mem:{anchor}",
                    "session_key": "s",
                    "associations": {"entities": [{"name": "Garden"}]},
                },
            )
        )
        other = payload(
            await client.call_tool(
                "declare_associations",
                {"agent_id": "dz", "session_key": "someone-else", "associations": {"entities": [{"name": "Shed"}]}},
            )
        )
    assert paused["ok"] is True and paused["result"] == "skipped" and paused["persisted"] is False
    assert (paused["entities"], paused["mentions"], paused["relations"], paused["dropped"]) == ([], 0, [], [])
    assert rows(db, "SELECT name FROM entities") == [("Shed",)]  # another session's bucket is not paused
    assert other["result"] == "declared"


def test_a_dedup_repair_repoints_the_losers_declarations(app, db: Database) -> None:  # spec CA-3
    from cpersona.services.health.check_health import check_health

    keeper = store(app, agent_id="dz", content="the same note")["id"]
    # the same text again in a channel: covered by the global row, so the repair deletes it
    loser = store(app, agent_id="dz", content="the same note", channel="c1")["id"]
    other = store(app, agent_id="dz", content="another note")["id"]
    declared(
        app,
        agent_id="dz",
        anchor_ref=f"mem:{loser}",
        associations={
            "entities": [{"name": "Atlas"}],
            "relations": [{"subject": f"mem:{loser}", "predicate": "supports", "object": f"mem:{other}"}],
        },
    )
    relation_ids = rows(db, "SELECT id FROM relations")
    check_health(app, agent_id="dz", fix=True, checks=["duplicate_content"])
    assert rows(db, "SELECT id FROM memories ORDER BY id") == [(keeper,), (other,)]
    assert rows(db, "SELECT ref FROM entity_mentions") == [(f"mem:{keeper}",)]
    assert rows(db, "SELECT id, subject_id, anchor_ref FROM relations") == [
        (relation_ids[0][0], keeper, f"mem:{keeper}")
    ]  # same relation id, re-pointed
