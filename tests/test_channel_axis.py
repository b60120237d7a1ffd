"""migrate_channel_axis over a real SQLite file: survey, dry run, real run, globalize, declarations.

The fixture rows mirror a probe of CPersona 2.6.14 (same ids, same metadata);
its answers are the expected figures here.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import inspect, select, text

from cpersona.services.operations.channel_axis import classify, migrate_channel_axis
from cpersona.services.recall.service import recall
from cpersona.storage.models import Memory

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

ROWS = [  # (agent, channel, metadata, content)
    ("kai", "discord", {"session_id": "1122334455:77:0"}, "a"),  # 1 recoverable
    ("kai", "discord", {"session_id": "1122334455:shared"}, "b"),  # 2 recoverable
    ("kai", "discord", {"session_id": "9988776655:1:3"}, "c"),  # 3 recoverable
    ("kai", "discord", {"session_id": "abc:1"}, "d"),  # 4 non-numeric prefix
    ("kai", "discord", "not json", "e"),  # 5 invalid JSON
    ("kai", "discord", {}, "f"),  # 6 no session id
    ("kai", "discord", {"session_id": "1122334455:77:0"}, "g-dup"),  # 7 recoverable, but its new bucket has it
    ("kai", "1122334455", {"session_id": "1122334455:77:0"}, "g-dup"),  # 8 already there
    ("zed", "discord", {"session_id": "5:x"}, "h"),  # 9 another agent
    ("kai", "discord", {"session_id": 123}, "i"),  # 10 not a string
    ("kai", "discord", ["1:2"], "j"),  # 11 not an object
    ("kai", "discord", {"session_id": "7"}, "k"),  # 12 no ':'
]


@pytest.fixture
def seeded(app):
    with app.db.write() as session:
        for agent, channel, metadata, content in ROWS:
            session.add(
                Memory(
                    agent_id=agent,
                    channel=channel,
                    content=content,
                    timestamp="2026-01-01T00:00:00",
                    metadata_=metadata if isinstance(metadata, str) else json.dumps(metadata),
                    locked=1 if content == "a" else 0,
                )
            )
    return app


def channels(app) -> dict[int, str]:
    with app.db.read() as session:
        return dict(session.execute(select(Memory.id, Memory.channel).order_by(Memory.id)).all())


def test_dry_run_reports_buckets_and_changes_nothing(seeded):  # spec MC-1, MC-2, MC-5
    before = channels(seeded)
    answer = migrate_channel_axis(seeded, agent_id="kai")
    assert answer == {
        "agent_id": "kai",
        "dry_run": True,
        "recoverable_total": 4,
        "recoverable_by_channel": [{"channel": "1122334455", "count": 3}, {"channel": "9988776655", "count": 1}],
        "unrecoverable_total": 6,
        "invalid_metadata_total": 1,
        "invalid_metadata_ids": [5],
        "globalize_unrecoverable": False,
        "migrated": 0,
        "globalized": 0,
        "samples": [
            {"id": 1, "recovered_channel": "1122334455", "session_id": "1122334455:77:0"},
            {"id": 2, "recovered_channel": "1122334455", "session_id": "1122334455:shared"},
            {"id": 3, "recovered_channel": "9988776655", "session_id": "9988776655:1:3"},
            {"id": 7, "recovered_channel": "1122334455", "session_id": "1122334455:77:0"},
        ],
    }
    assert channels(seeded) == before


def test_empty_agent_means_every_agent(seeded):  # spec §12 (agent_id '' = every agent)
    answer = migrate_channel_axis(seeded)
    assert answer["agent_id"] == "" and answer["recoverable_total"] == 5
    assert answer["recoverable_by_channel"] == [
        {"channel": "1122334455", "count": 3},
        {"channel": "9988776655", "count": 1},
        {"channel": "5", "count": 1},
    ]
    assert migrate_channel_axis(seeded, agent_id="nobody")["recoverable_total"] == 0


def test_real_run_moves_recoverable_rows_and_skips_a_clash(seeded):  # spec MC-3, MC-4, MC-5
    answer = migrate_channel_axis(seeded, agent_id="kai", dry_run=False)
    assert (answer["dry_run"], answer["recoverable_total"], answer["migrated"], answer["globalized"]) == (
        False,
        4,
        3,
        0,
    )
    after = channels(seeded)
    assert (after[1], after[2], after[3]) == ("1122334455", "1122334455", "9988776655")
    assert after[7] == "discord"  # its new bucket already holds "g-dup": skipped, not failed
    assert after[9] == "discord"  # another agent's row is not touched
    with seeded.db.read() as session:
        row = session.get(Memory, 1)
        assert (row.locked, row.content, json.loads(row.metadata_)) == (1, "a", {"session_id": "1122334455:77:0"})


def test_globalize_moves_only_the_genuinely_unrecoverable(seeded):  # spec MC-2, MC-3, MC-4
    migrate_channel_axis(seeded, agent_id="kai", dry_run=False)
    answer = migrate_channel_axis(seeded, agent_id="kai", dry_run=False, globalize_unrecoverable=True)
    assert (answer["recoverable_total"], answer["migrated"], answer["unrecoverable_total"], answer["globalized"]) == (
        1,
        0,
        6,
        6,
    )
    assert answer["samples"] == [{"id": 7, "recovered_channel": "1122334455", "session_id": "1122334455:77:0"}]
    after = channels(seeded)
    assert [after[i] for i in (4, 5, 6, 10, 11, 12)] == [""] * 6
    assert after[7] == "discord"  # recoverable (if blocked) rows are never globalized
    again = migrate_channel_axis(seeded, agent_id="kai", dry_run=False, globalize_unrecoverable=True)
    assert (again["unrecoverable_total"], again["invalid_metadata_total"], again["globalized"]) == (0, 0, 0)


def test_rerun_is_a_no_op(seeded):  # spec MC-4
    migrate_channel_axis(seeded, dry_run=False, globalize_unrecoverable=True)
    before = channels(seeded)
    answer = migrate_channel_axis(seeded, dry_run=False, globalize_unrecoverable=True)
    assert (answer["migrated"], answer["globalized"]) == (0, 0)
    assert channels(seeded) == before


def test_moved_rows_become_visible_to_their_channels_recall(seeded):  # the point of the tool (seed description)
    def contents(channel: str) -> set[str]:
        return {m["content"] for m in recall(seeded, agent_id="kai", query="", channel=channel, limit=50)["messages"]}

    assert "a" not in contents("1122334455")
    migrate_channel_axis(seeded, agent_id="kai", dry_run=False)
    assert {"a", "b"} <= contents("1122334455") and "c" not in contents("1122334455")


def test_bad_argument_types_are_refused(app):
    assert migrate_channel_axis(app, agent_id=5) == {"ok": False, "error": "agent_id must be a string"}
    assert migrate_channel_axis(app, dry_run="no") == {"ok": False, "error": "dry_run must be true or false"}


@pytest.mark.parametrize(
    ("metadata", "recovered", "invalid"),
    [
        ('{"session_id": "1:2:3"}', "1", False),
        ('{"session_id": "12ab:x"}', "12ab", False),  # the glob only asks for a leading digit
        ('{"session_id": ":1"}', None, False),
        ('{"session_id": "1"}', None, False),
        ('{"session_id": "١٢:x"}', None, False),  # Arabic-Indic digits are not ASCII digits
        ('{"session_id": NaN}', None, True),
        ("", None, True),
        (None, None, True),
    ],
)
def test_classification(metadata, recovered, invalid):  # spec MC-1, MC-2
    row = classify(1, "a", "", metadata)
    assert (row.recovered_channel, row.invalid_json) == (recovered, invalid)


# --- declarations follow their memories (CA-4) ---------------------------------------------------

GRAPH_DDL = """
CREATE TABLE IF NOT EXISTS entities (id INTEGER PRIMARY KEY AUTOINCREMENT, agent_id TEXT NOT NULL,
  project_id TEXT NOT NULL DEFAULT '', channel TEXT NOT NULL DEFAULT '', name TEXT NOT NULL,
  normalized TEXT NOT NULL, declared_by TEXT NOT NULL, created_at TEXT NOT NULL,
  UNIQUE (agent_id, project_id, channel, normalized));
CREATE TABLE IF NOT EXISTS entity_aliases (entity_id INTEGER NOT NULL, alias TEXT NOT NULL,
  normalized TEXT NOT NULL, PRIMARY KEY (entity_id, normalized));
CREATE TABLE IF NOT EXISTS entity_mentions (entity_id INTEGER NOT NULL, ref TEXT NOT NULL,
  declared_by TEXT NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY (entity_id, ref));
CREATE TABLE IF NOT EXISTS relations (id INTEGER PRIMARY KEY AUTOINCREMENT, agent_id TEXT NOT NULL,
  project_id TEXT NOT NULL DEFAULT '', channel TEXT NOT NULL DEFAULT '', subject_kind TEXT NOT NULL,
  subject_id INTEGER NOT NULL, predicate TEXT NOT NULL, object_kind TEXT NOT NULL, object_id INTEGER NOT NULL,
  anchor_ref TEXT NOT NULL DEFAULT '', declared_by TEXT NOT NULL, declared_at TEXT NOT NULL,
  UNIQUE (agent_id, project_id, channel, subject_kind, subject_id, predicate, object_kind, object_id, anchor_ref));
"""


def test_declarations_follow_a_moved_memory(seeded):  # spec CA-4, MC-3
    with seeded.db.write_connection() as conn:
        if "entities" not in inspect(conn).get_table_names():  # the 2.6 layout (storage.md §6.2)
            for statement in filter(str.strip, GRAPH_DDL.split(";")):
                conn.exec_driver_sql(statement)
        conn.exec_driver_sql(
            "INSERT INTO entities (id, agent_id, channel, name, normalized, declared_by, created_at) VALUES "
            "(101, 'kai', 'discord', 'Mina', 'mina', 'agent', 't0'), "
            "(102, 'kai', 'discord', 'Ops', 'ops', 'agent', 't0')"
        )
        conn.exec_driver_sql("INSERT INTO entity_aliases VALUES (101, 'mina-san', 'mina-san')")
        conn.exec_driver_sql(
            "INSERT INTO entity_mentions VALUES (101, 'mem:1', 'agent', 't1'), (102, 'mem:4', 'agent', 't1')"
        )  # mem:4 is unrecoverable: stays
        conn.exec_driver_sql(
            "INSERT INTO relations (agent_id, channel, subject_kind, subject_id, predicate, object_kind, object_id, "
            "anchor_ref, declared_by, declared_at) VALUES "
            "('kai', 'discord', 'entity', 101, 'owns', 'mem', 2, 'mem:1', 'agent', 't2')"
        )

    migrate_channel_axis(seeded, agent_id="kai", dry_run=False)

    with seeded.db.read() as session:
        q = lambda sql: [tuple(r) for r in session.execute(text(sql)).all()]  # noqa: E731
        entities = q("SELECT id, channel, name FROM entities ORDER BY id")
        copy = next(e for e in entities if e[1] == "1122334455")
        assert copy[2] == "Mina"
        assert (101, "discord", "Mina") not in entities  # nothing in the bridge channel names it any more
        assert (102, "discord", "Ops") in entities  # still mentioned by an unmoved memory
        assert q(f"SELECT alias FROM entity_aliases WHERE entity_id = {copy[0]}") == [("mina-san",)]
        assert q("SELECT entity_id, ref FROM entity_mentions ORDER BY ref") == [(copy[0], "mem:1"), (102, "mem:4")]
        assert q("SELECT channel, subject_kind, subject_id, object_id, anchor_ref FROM relations") == [
            ("1122334455", "entity", copy[0], 2, "mem:1")
        ]


# --- the tool declaration ------------------------------------------------------------------------


def test_description_carries_the_facts():  # spec §14
    from cpersona.mcp.tools import default_registry

    description = default_registry().get("migrate_channel_axis").description
    for fact in (
        "'discord'",
        "metadata.session_id",
        "dry_run=true",
        "non-destructive",
        "idempotent",
        "unrecoverable",
        "globalize_unrecoverable=true",
        "channel ''",
        "locked",
        "repairs_skipped",
    ):
        assert fact in description, fact


@pytest.mark.anyio
async def test_through_the_facade(seeded):  # spec C-3, §12
    from cpersona.mcp.dispatch import call_tool
    from cpersona.mcp.gates import GateChain
    from cpersona.mcp.tools import default_registry

    registry, gates = default_registry(), GateChain()
    bad = await call_tool(seeded, registry, gates, "migrate_channel_axis", {"dry_run": "no"})
    assert bad.is_error and "Input validation error" in bad.payload["error"]
    answer = await call_tool(seeded, registry, gates, "migrate_channel_axis", {"agent_id": "kai"})
    assert answer.payload["dry_run"] is True and answer.payload["recoverable_total"] == 4
    assert channels(seeded)[1] == "discord"


@pytest.mark.anyio
async def test_a_paused_real_run_is_a_dry_run(seeded):  # spec MC-6, P-11
    from cpersona.mcp import pause_gate
    from cpersona.mcp.dispatch import call_tool
    from cpersona.mcp.gates import GateChain
    from cpersona.mcp.tools import default_registry
    from cpersona.services.operations.pause import pause_persistence

    pause_persistence(seeded, ttl_seconds=600, session_key="op")
    gates = GateChain([pause_gate.PauseGate()])
    answer = (
        await call_tool(
            seeded,
            default_registry(),
            gates,
            "migrate_channel_axis",
            {"agent_id": "kai", "dry_run": False, "session_key": "op"},
        )
    ).payload
    assert (answer["dry_run"], answer["migrated"], answer["recoverable_total"]) == (True, 0, 4)
    assert answer["repairs_skipped"] is True and "persisted" not in answer
    assert answer["repairs_skip_reason"] == "no-persist mode active — dry_run forced"
    assert channels(seeded)[1] == "discord"
    other = (
        await call_tool(
            seeded,
            default_registry(),
            gates,
            "migrate_channel_axis",
            {"agent_id": "kai", "dry_run": False, "session_key": "someone-else"},
        )
    ).payload
    assert other["migrated"] == 3  # P-14: another bucket is not paused
