"""Contract points of admin-and-safety.md that no other module pins down, over a real database.

Conventions (§0), the isolation predicate (§1.1) and the process-local pause (§9.1).
Calls go through the facade's call path (``call_tool`` with the real pause gate), or
the in-process MCP server where the wire shape is the point.
"""

from __future__ import annotations

import itertools
import json

import pytest
from conftest import make_app
from mcp import Client
from sqlalchemy import select, text

from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.pause_gate import PauseGate
from cpersona.mcp.server import build_server
from cpersona.mcp.tools import default_registry
from cpersona.storage.models import Memory
from cpersona.storage.scope import Scope, predicates, sql_fragment

pytestmark = pytest.mark.anyio

REGISTRY = default_registry()


async def call(app, name: str, **arguments):
    outcome = await call_tool(app, REGISTRY, GateChain([PauseGate()]), name, arguments)
    return outcome


async def stored_id(app, **arguments) -> int:
    body = (await call(app, "store", **arguments)).payload
    assert body["result"] == "stored", body
    return body["id"]


# -- §0 conventions ---------------------------------------------------------------------------------


async def test_a_refusal_is_one_json_text_item_not_an_mcp_error_and_keeps_non_ascii(app):  # spec C-1, C-2
    async with Client(build_server(app)) as client:
        result = await client.call_tool("delete_memory", {"memory_id": 424242, "agent_id": "寿司"})
    assert result.is_error is False
    assert len(result.content) == 1 and result.content[0].type == "text"
    raw = result.content[0].text
    body = json.loads(raw)
    assert body == {"ok": False, "error": "Memory 424242 not found, not owned by agent, or locked"}

    async with Client(build_server(app)) as client:
        wiped = await client.call_tool("delete_agent_data", {"agent_id": "寿司"})
    assert wiped.is_error is False and '"agent_id": "寿司"' in wiped.content[0].text  # not \\u-escaped
    assert json.loads(wiped.content[0].text)["ok"] is True


@pytest.mark.parametrize(
    "tool, arguments, message",
    [
        ("delete_agent_data", {"agent_id": ""}, "agent_id is required for bulk deletion"),
        ("merge_memories", {"source_agent_id": "", "target_agent_id": "b"}, "source_agent_id is required"),
        (
            "merge_memories",
            {"source_agent_id": "a", "target_agent_id": "a"},
            "source_agent_id and target_agent_id must differ",
        ),
        ("delete_episode", {"episode_id": 99, "agent_id": "a"}, "Episode 99 not found or not owned by agent"),
        ("unlock_memory", {"memory_id": 99}, "Memory 99 not found"),
        ("export_memories", {"agent_id": "a", "output_path": ""}, "output_path rejected"),
        ("import_memories", {"input_path": "/nonexistent/nowhere.jsonl"}, "File not found"),
    ],
)
async def test_handler_failures_share_one_shape(app, tool, arguments, message):  # spec C-2
    outcome = await call(app, tool, **arguments)
    assert outcome.is_error is False
    body = outcome.payload
    assert body["ok"] is False and isinstance(body["error"], str) and body["error"].startswith(message), body


async def test_an_integral_float_id_is_read_as_an_integer_and_a_boolean_is_not(app):  # spec C-4, C-3
    memory_id = await stored_id(app, agent_id="a", content="float ids are fine")
    locked = await call(app, "lock_memory", memory_id=float(memory_id), agent_id="a")
    assert locked.payload == {"ok": True, "locked_id": memory_id}
    refused = await call(app, "unlock_memory", memory_id=True, agent_id="a")
    assert refused.is_error is True and "Input validation error" in refused.payload["error"]
    with app.db.read() as session:
        assert session.scalar(select(Memory.locked).where(Memory.id == memory_id)) == 1  # nothing half-done


@pytest.mark.parametrize(
    "tool, arguments",
    [
        ("delete_agent_data", {"agent_id": "a\ud800"}),
        ("merge_memories", {"source_agent_id": "a", "target_agent_id": "b\udfff"}),
        ("delete_memory", {"memory_id": 1, "agent_id": "\ud800"}),
        ("export_memories", {"agent_id": "a", "output_path": "/tmp/x\ud800.jsonl"}),
        ("import_memories", {"input_path": "/tmp/x.jsonl", "target_agent_id": "\ud800"}),
        ("pause_persistence", {"session_key": "k\ud800"}),
    ],
)
async def test_a_lone_surrogate_is_refused_before_the_handler(app, tool, arguments):  # spec C-6
    memory_id = await stored_id(app, agent_id="a", content="survives a surrogate attack")
    outcome = await call(app, tool, **arguments)
    body = outcome.payload
    assert body.get("ok") is False and "surrogate" in body["error"], body
    with app.db.read() as session:
        assert session.scalar(select(Memory.id).where(Memory.id == memory_id)) == memory_id
    assert (await call(app, "persistence_status")).payload["paused"] is False


# -- §1.1 the one isolation predicate ---------------------------------------------------------------

AGENTS, PROJECTS, CHANNELS = ("a", "b", ""), ("", "P", "Q"), ("", "C", "D")


def expected(row: tuple[str, str, str], scope: Scope) -> bool:
    """The table of §1.1, written out independently of the builder."""
    agent, project, channel = row
    if scope.agent_id is not None and agent != scope.agent_id:
        return False
    if scope.project_id is not None:
        allowed = {""} if scope.project_id == "" else {scope.project_id, ""}
        if project not in allowed:
            return False
    if scope.channel and channel not in (scope.channel, ""):
        return False
    return True


def test_the_scope_builder_follows_the_axis_table_in_both_forms(app):  # spec AX-1, AX-2
    rows = list(itertools.product(AGENTS, PROJECTS, CHANNELS))
    with app.db.write() as session:
        for agent, project, channel in rows:
            session.add(
                Memory(
                    agent_id=agent,
                    project_id=project,
                    channel=channel,
                    content=f"{agent}|{project}|{channel}",
                    msg_id="",
                    source="{}",
                    timestamp="2026-11-30T00:00:00+00:00",
                    metadata_="{}",
                )
            )
    scopes = [
        Scope(a, p, c) for a in (None, *AGENTS, "zed") for p in (None, *PROJECTS, "R") for c in (None, *CHANNELS, "E")
    ]
    with app.db.read() as session:
        for scope in scopes:
            want = {"|".join(r) for r in rows if expected(r, scope)}
            orm = set(session.scalars(select(Memory.content).where(predicates(Memory, scope))))
            fragment, params = sql_fragment(scope, "m")
            raw = {r[0] for r in session.execute(text(f"SELECT m.content FROM memories m WHERE {fragment}"), params)}
            assert orm == want and raw == want, scope


# -- §1.1 writes are verbatim and never union --------------------------------------------------------


async def test_writes_store_the_bucket_verbatim_and_omitted_axes_as_global(app):  # spec AX-3
    # Narrow buckets first: store's dedup probe also reads the global pool (memory-and-recall
    # DD-3), so a global copy written first would answer the later bucketed writes.
    same = "the same sentence in several buckets"
    ids = [
        await stored_id(app, agent_id="a", content=same, project_id="P", channel="C"),
        await stored_id(app, agent_id="a", content=same, project_id="P"),
        await stored_id(app, agent_id="a", content=same, channel="C"),
        await stored_id(app, agent_id="a", content=same),
    ]
    assert len(set(ids)) == 4
    again = (await call(app, "store", agent_id="a", content=same, project_id="P", channel="C")).payload
    assert again["result"] == "skipped", again
    with app.db.read() as session:
        buckets = session.execute(
            select(Memory.project_id, Memory.channel).where(Memory.content == same).order_by(Memory.id)
        ).all()
    assert [tuple(b) for b in buckets] == [("P", "C"), ("P", ""), ("", "C"), ("", "")]


# -- §9.1 a pause belongs to one server process -----------------------------------------------------


async def test_a_pause_silences_only_the_server_that_holds_it(db):  # spec P-3, P-1
    paused_server, other_server = make_app(db), make_app(db)  # two servers on one database file
    assert (await call(paused_server, "pause_persistence")).payload["paused"] is True
    skipped = (await call(paused_server, "store", agent_id="a", content="dropped while paused")).payload
    assert skipped["persisted"] is False
    written = (await call(other_server, "store", agent_id="a", content="kept by the other server")).payload
    assert written["result"] == "stored"
    assert (await call(other_server, "persistence_status")).payload["paused"] is False
    with db.read() as session:
        assert list(session.scalars(select(Memory.content))) == ["kept by the other server"]


# -- §7.2 episode records ---------------------------------------------------------------------------


def episode_file(path) -> str:
    lines = [
        {
            "_type": "episode",
            "agent_id": "a",
            "summary": "Planned the garden.",
            "keywords": ["garden", "plan"],
            "start_time": "2026-01-01T10:00:00+00:00",
            "end_time": "2026-01-01T11:00:00+00:00",
            "resolved": True,
            "created_at": "2026-01-01 11:00:00",
            "project_id": "home",
            "channel": "C",
        },
        {
            "_type": "episode",
            "agent_id": "a",
            "summary": "Planned the garden.",
            "keywords": "dup",
            "project_id": "home",
            "channel": "C",
        },  # same bucket, same summary: a within-file duplicate
        {
            "_type": "episode",
            "agent_id": "a",
            "summary": "Planned the garden.",
            "keywords": "other bucket",
            "project_id": "work",
            "channel": "C",
        },
        {"_type": "episode", "agent_id": "a", "summary": "", "keywords": "ignored"},
        {"_type": "episode", "agent_id": "a", "summary": "[Memory from 2026-01-01]", "project_id": ""},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    return str(path)


async def test_episode_records_join_keywords_dedup_within_the_run_and_keep_their_times(
    app, tmp_path
):  # spec IM-7, IM-14
    path = episode_file(tmp_path / "episodes.jsonl")
    preview = (await call(app, "import_memories", input_path=path, dry_run=True)).payload
    real = (await call(app, "import_memories", input_path=path)).payload
    for body in (preview, real):
        assert body["ok"] is True and body["imported_episodes"] == 2 and body["skipped_episodes"] == 2, body
        assert [e for e in body["errors"] if e.startswith("Line 5: episode")], body  # empty after sanitising
    assert {k: v for k, v in preview.items() if k != "dry_run"} == {k: v for k, v in real.items() if k != "dry_run"}
    with app.db.read() as session:
        rows = session.execute(
            text(
                "SELECT project_id, channel, summary, keywords, start_time, end_time, resolved, created_at "
                "FROM episodes ORDER BY id"
            )
        ).all()
    assert [tuple(r) for r in rows] == [
        (
            "home",
            "C",
            "Planned the garden.",
            "garden plan",
            "2026-01-01T10:00:00+00:00",
            "2026-01-01T11:00:00+00:00",
            1,
            "2026-01-01 11:00:00",
        ),
        ("work", "C", "Planned the garden.", "other bucket", None, None, 0, rows[1][7]),
    ]
