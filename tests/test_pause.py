"""The no-persist pause: buckets and TTLs, the three tools, and the one gate every write passes.

Calls go through the facade's real call path (``call_tool`` with the pause gate
in the chain) over real SQLite files; the clock is injected so TTLs are tested
without sleeping. The last test drives ``python -m cpersona`` over stdio.
"""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import make_app
from mcp import Client, StdioServerParameters
from sqlalchemy import text

from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.gates import ToolCall
from cpersona.mcp.pause_gate import DowngradeFix, ForceDryRun, PassThrough, PauseGate, Rule, Skip
from cpersona.mcp.registry import READ_ONLY, Annotations, Registry, ToolSpec, keyword_tool
from cpersona.mcp.tools import default_registry
from cpersona.services.operations import pause
from cpersona.services.app import App
from cpersona.services.records.memories import check_boundary, store
from cpersona.services.operations.pause import PauseState, ttl_text
from cpersona.services.responses import ToolFailure

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 11, 30, 4, 0, 0, tzinfo=timezone.utc)
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00$")
REASON = re.compile(
    r"^session no-persist mode active \((\d+m left|\d+s left|TTL expired|TTL unknown)\) — `(\w+)` skipped\. "
    r"Call `resume_persistence` to re-enable, or wait for TTL to elapse\.$"
)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def app(db, clock) -> App:  # noqa: F811 - this module's app has a movable clock
    application = make_app(db)
    application.clock = clock
    return application


REGISTRY = default_registry()
GATES = GateChain([PauseGate()])


async def call(app: App, name: str, registry: Registry = REGISTRY, **arguments: Any) -> dict[str, Any]:
    outcome = await call_tool(app, registry, GATES, name, arguments)
    return outcome.payload


def snapshot(app: App) -> dict[str, list[tuple]]:
    """Every row of every table a write tool could touch."""
    tables = (
        "memories",
        "episodes",
        "profiles",
        "pending_memory_tasks",
        "entities",
        "entity_aliases",
        "entity_mentions",
        "relations",
    )
    with app.db.read() as session:
        present = {row[0] for row in session.execute(text("SELECT name FROM sqlite_master WHERE type='table'"))}
        return {
            t: [tuple(r) for r in session.execute(text(f"SELECT * FROM {t} ORDER BY rowid"))]
            for t in tables
            if t in present
        }


async def seed(app: App) -> None:
    for content in ("alpha note about the garden", "beta note about the kitchen"):
        assert (await call(app, "store", agent_id="a", content=content))["result"] == "stored"
    assert (await call(app, "archive_episode", agent_id="a", summary="talked about the garden"))["ok"] is True
    assert (await call(app, "update_profile", agent_id="a", profile="likes gardens"))["ok"] is True


# -- the three tools (spec §9.2–§9.4) -------------------------------------------------------------


async def test_pause_status_resume_shapes_and_clock(app, clock):  # spec P-1, P-7, P-8, P-9
    assert await call(app, "persistence_status") == {
        "paused": False,
        "expires_at": None,
        "ttl_remaining_seconds": None,
        "scope": "process",
    }
    paused = await call(app, "pause_persistence")
    assert paused == {
        "paused": True,
        "expires_at": "2026-11-30T04:30:00.000000+00:00",
        "ttl_seconds": 1800,
        "scope": "process",
    }
    assert ISO_UTC.match(paused["expires_at"])
    clock.advance(0.5)
    status = await call(app, "persistence_status")
    assert status == {
        "paused": True,
        "expires_at": paused["expires_at"],
        "ttl_remaining_seconds": 1799,
        "scope": "process",
    }  # floored
    assert await call(app, "resume_persistence") == {"paused": False, "was_active": True, "scope": "process"}
    assert await call(app, "resume_persistence") == {"paused": False, "was_active": False, "scope": "process"}
    assert (await call(app, "persistence_status"))["paused"] is False


async def test_a_pause_ends_by_itself_when_the_clock_passes_its_deadline(app, clock):  # spec P-1
    await call(app, "pause_persistence", ttl_seconds=60, session_key="s")
    clock.advance(59.999)
    assert (await call(app, "store", agent_id="a", content="x", session_key="s"))["persisted"] is False
    assert (await call(app, "persistence_status", session_key="s"))["ttl_remaining_seconds"] == 0  # never negative
    clock.advance(0.001)
    assert (await call(app, "persistence_status", session_key="s"))["paused"] is False
    assert (await call(app, "store", agent_id="a", content="x", session_key="s"))["result"] == "stored"
    assert (await call(app, "resume_persistence", session_key="s"))["was_active"] is False


async def test_last_pause_wins_and_does_not_stack(app, clock):  # spec P-5
    await call(app, "pause_persistence", ttl_seconds=1800)
    second = await call(app, "pause_persistence", ttl_seconds=60)
    assert second["expires_at"] == "2026-11-30T04:01:00.000000+00:00" and second["ttl_seconds"] == 60
    clock.advance(61)
    assert (await call(app, "persistence_status"))["paused"] is False


@pytest.mark.parametrize(
    ("key", "scope", "bucket"),
    [
        ("", "process", ""),
        ("   ", "process", ""),
        ("transport", "process", ""),
        (" k1 ", "session", "k1"),
        ("k1", "session", "k1"),
        ("Transport", "session", "Transport"),
    ],
)
async def test_session_key_resolution(app, key, scope, bucket):  # spec C-7, P-9
    assert (await call(app, "pause_persistence", session_key=key))["scope"] == scope
    assert app.pause_buckets.state(bucket, app.clock()).paused
    assert (await call(app, "persistence_status", session_key=bucket))["paused"] is True


async def test_buckets_are_strictly_separate(app):  # spec P-14, P-2, AX-4
    await call(app, "pause_persistence", session_key="A")
    assert (await call(app, "store", agent_id="a", content="keyless write"))["result"] == "stored"
    assert (await call(app, "store", agent_id="a", content="b write", session_key="B"))["result"] == "stored"
    assert (await call(app, "store", agent_id="a", content="a write", session_key="A"))["persisted"] is False
    assert (await call(app, "resume_persistence", session_key="B"))["was_active"] is False  # B cannot clear A
    assert (await call(app, "persistence_status", session_key="A"))["paused"] is True

    await call(app, "pause_persistence")  # the shared bucket silences keyless callers only
    assert (await call(app, "store", agent_id="a", content="keyless again"))["persisted"] is False
    assert (await call(app, "store", agent_id="a", content="c write", session_key="C"))["result"] == "stored"
    # A key is compared, never verified: whoever sends "A" may resume it.
    assert (await call(app, "resume_persistence", session_key="A"))["was_active"] is True


async def test_ttl_bounds_at_the_schema_and_behind_it(app):  # spec P-6, C-3
    for bad, detail in (
        (0, "0 is less than the minimum of 1"),
        (86401, "86401 is greater than the maximum of 86400"),
        ("10", "'10' is not of type 'integer'"),
        (True, "True is not of type 'integer'"),
    ):
        outcome = await call_tool(app, REGISTRY, GATES, "pause_persistence", {"ttl_seconds": bad})
        assert outcome.is_error and detail in outcome.payload["error"]
    assert (await call(app, "persistence_status"))["paused"] is False
    assert (await call(app, "pause_persistence", ttl_seconds=1.0))["ttl_seconds"] == 1  # integral float accepted
    # A library caller behind the schema gets the handler's own rules.
    assert pause.pause_persistence(app, ttl_seconds=0) == {"ok": False, "error": "ttl_seconds must be >= 1"}
    assert pause.pause_persistence(app, ttl_seconds=True) == {
        "ok": False,
        "error": "ttl_seconds must be a positive integer",
    }
    assert pause.pause_persistence(app, ttl_seconds="5")["ok"] is False
    assert pause.pause_persistence(app, ttl_seconds=10**6, session_key="big")["ttl_seconds"] == 86400


async def test_at_most_256_live_pauses_and_none_is_ever_evicted(app, clock):  # spec P-4
    for i in range(256):
        await call(app, "pause_persistence", session_key=f"k{i}", ttl_seconds=100 + i)
    refused = await call(app, "pause_persistence", session_key="one-more")
    assert refused == {
        "ok": False,
        "error": (
            "persistence was NOT paused: 256 sessions already hold a live pause on this process, and granting another "
            "would revoke one of them. The earliest frees at 2026-11-30T04:01:40.000000+00:00; resume_persistence on a "
            "key you no longer need frees one now."
        ),
    }
    assert (await call(app, "pause_persistence"))["ok"] is False  # the shared bucket counts as a new key too
    assert all(app.pause_buckets.state(f"k{i}", app.clock()).paused for i in range(256))
    assert (await call(app, "pause_persistence", session_key="k7", ttl_seconds=5))["paused"] is True  # re-arm
    assert (await call(app, "resume_persistence", session_key="k0"))["was_active"] is True
    assert (await call(app, "pause_persistence", session_key="one-more"))["paused"] is True
    clock.advance(10)  # k7 expired: its place is free again
    assert (await call(app, "pause_persistence", session_key="another"))["paused"] is True


@pytest.mark.parametrize(
    ("remaining", "expected"),
    [
        (1800, "30m left"),
        (1799.9, "29m left"),
        (61, "1m left"),
        (60, "1m left"),
        (59.99, "59s left"),
        (0.5, "0s left"),
        (0, "TTL expired"),
        (-3, "TTL expired"),
        (None, "TTL unknown"),
    ],
)
def test_ttl_wording(remaining, expected):  # spec §9.5
    deadline = None if remaining is None else T0 + timedelta(seconds=remaining)
    assert ttl_text(PauseState("", T0, deadline)) == expected


# -- what every write answers while paused (§9.5) --------------------------------------------------

# Arguments and the body each write tool answers while paused (before the three added keys).
PAUSED_BODIES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "store": (
        {"agent_id": "a", "content": "new text"},
        {"ok": True, "result": "skipped", "id": "no-persist", "embedded": False},
    ),
    "archive_episode": (
        {"agent_id": "a", "summary": "new episode"},
        {"ok": True, "queued": False, "task_id": None, "episode_id": None, "id": "no-persist"},
    ),
    "update_profile": ({"agent_id": "a", "profile": "new profile"}, {"ok": True, "profiles_updated": 0}),
    "update_memory": ({"memory_id": 1, "content": "edited"}, {"ok": True, "updated_id": None}),
    "delete_memory": ({"memory_id": 1}, {"ok": True, "deleted_id": None}),
    "delete_episode": ({"episode_id": 1}, {"ok": True, "deleted_id": None}),
    "lock_memory": ({"memory_id": 1}, {"ok": True, "locked_id": None}),
    "unlock_memory": ({"memory_id": 1}, {"ok": True, "unlocked_id": None}),
    "delete_agent_data": (
        {"agent_id": "a"},
        {
            "ok": True,
            "agent_id": "a",
            "deleted_memories": 0,
            "deleted_profiles": 0,
            "deleted_episodes": 0,
            "deleted_pending_tasks": 0,
        },
    ),
    "merge_memories": (
        {"source_agent_id": "a", "target_agent_id": "b"},
        {
            "ok": True,
            "dry_run": True,
            "source_agent_id": "a",
            "target_agent_id": "b",
            "strategy": "skip",
            "mode": "copy",
            "merged_memories": 0,
            "skipped_memories": 0,
            "merged_episodes": 0,
            "skipped_episodes": 0,
            "profile_copied": False,
            "skipped_profile": False,
        },
    ),
    "declare_associations": (
        {"agent_id": "a", "associations": {"entities": [{"name": "Garden"}]}},
        {"ok": True, "result": "skipped", "entities": [], "mentions": 0, "relations": [], "dropped": []},
    ),
    "calibrate_threshold": (
        {"agent_id": "a"},
        {
            "ok": True,
            "sidecar_persisted": False,
            "scope": "per_agent",
            "agent_id": "a",
            "sampled_embeddings": 0,
            "num_pairs": 0,
            "method": "separation",
            "z_factor": 1.0,
            "percentile": 0.95,
            "embedding_dim": None,
            "embedding_model": "",
            "distribution": None,
            "null_admit_rate": None,
            "old_threshold": "<default>",
            "new_threshold": None,
        },
    ),
    "set_recall_precision": (
        {"agent_id": "a", "precision": "strict"},
        {
            "ok": True,
            "agent_id": "a",
            "precision": "strict",
            "beta": 2.0,
            "cleared": False,
            "fused_gate": None,
            "calibrate": None,
        },
    ),
    "import_memories": (
        {"input_path": "<export>"},
        {
            "ok": True,
            "dry_run": True,
            "imported_memories": 0,
            "skipped_memories": 0,
            "imported_episodes": 0,
            "skipped_episodes": 0,
            "profile_updated": False,
        },
    ),
}


@pytest.mark.parametrize("tool", sorted(PAUSED_BODIES))
async def test_every_write_answers_its_no_op_shape_and_writes_nothing(app, tmp_path, tool):  # spec §9.5, G-7, P-10
    assert tool in REGISTRY, f"{tool} is not registered"  # a missing write tool is a bug, not a skip
    await seed(app)
    export = tmp_path / "export.jsonl"
    assert (await call(app, "export_memories", agent_id="", output_path=str(export)))["ok"] is True
    arguments, body = PAUSED_BODIES[tool]
    arguments = {k: (str(export) if v == "<export>" else v) for k, v in arguments.items()}
    body = {k: (app.settings.vector_min_similarity if v == "<default>" else v) for k, v in body.items()}
    if tool == "import_memories":
        await call(app, "delete_agent_data", agent_id="a")  # so a real import would write
    before = snapshot(app)

    await call(app, "pause_persistence", session_key="s")
    answer = await call(app, tool, **arguments, session_key="s")

    assert {k: v for k, v in answer.items() if k not in ("persisted", "dry_run", "reason")} == {
        k: v for k, v in body.items() if k != "dry_run"
    }
    assert answer["persisted"] is False and answer["dry_run"] is True
    match = REASON.match(answer["reason"])
    assert match and match.groups() == ("30m left", tool)
    assert snapshot(app) == before  # nothing checked, nothing written
    assert not app.settings.calibration_sidecar.exists()

    # The same call on another bucket is not silenced (P-14), so the shape above was the pause's doing.
    unpaused = await call(app, tool, **arguments, session_key="other")
    assert unpaused.get("persisted") is not False


def test_every_registered_write_tool_declares_its_pause_behaviour():  # spec §9.5: the declaration decides
    missing = [
        spec.name
        for spec in default_registry()
        if spec.annotations.read_only is not True and not isinstance(spec.paused, Rule)
    ]
    assert missing == [], f"write tools without a pause behaviour in their declaration: {missing}"


def test_every_registered_write_tool_with_a_no_op_rule_has_a_shape_test_here():
    skipped = {spec.name for spec in default_registry() if isinstance(spec.paused, Skip)}
    assert skipped <= set(PAUSED_BODIES), f"add the paused body of {sorted(skipped - set(PAUSED_BODIES))}"


def test_action_id_keys_and_ids_follow_the_rule_in_every_skip_body(app):  # spec §9.5, P-10
    for spec in default_registry():
        name, rule = spec.name, spec.paused
        if isinstance(rule, Skip) and name not in ("import_memories", "merge_memories"):
            body = rule.body(app, {"agent_id": "a"})
            assert body.get("id", "no-persist") == "no-persist", name
            for key in ("deleted_id", "updated_id", "locked_id", "unlocked_id", "episode_id"):
                assert body.get(key) is None, (name, key)


# -- what runs before the gate answers -------------------------------------------------------------


async def test_store_boundary_refusals_come_before_the_pause_content_checks_after(app):  # spec ST-2, ST-12
    await call(app, "pause_persistence")
    mixed = await call(app, "store", agent_id="a", content="x", message={"content": "y"})
    assert mixed["ok"] is False and mixed["result"] == "rejected" and "not both" in mixed["reason"]
    missing = await call(app, "store", content="x", lock=True)
    assert (
        missing["ok"] is False and missing["reason"].startswith("agent_id is required") and missing["locked"] is False
    )
    # Content validation comes after the pause: an empty content is skipped, not rejected.
    empty = await call(app, "store", agent_id="a", content="")
    assert empty["result"] == "skipped" and empty["persisted"] is False
    locked = await call(app, "store", agent_id="a", content="keep", lock=True)
    assert list(locked)[-1] == "locked" and locked["locked"] is False and locked["id"] == "no-persist"


@pytest.mark.parametrize(
    "arguments",
    [
        {"content": "x"},
        {"agent_id": "a", "content": "x", "message": {"content": "y"}},
        {"agent_id": "a", "message": {"content": "y"}, "source": {}},
        {"agent_id": "a", "message": {"content": "y"}, "metadata": {"k": 1}},
        {"agent_id": "a", "message": {"content": "y"}, "id": "m1"},
        {"agent_id": "a", "message": {"content": "y"}, "timestamp": "2026-01-01T00:00:00Z"},
        {"agent_id": "a", "message": {"content": "y"}, "metadata": {}, "content": ""},
        {"agent_id": "a", "message": {}, "content": "x"},
        {"message": {"content": "y"}, "content": "x"},
        {"agent_id": "a", "content": ""},
    ],
)
async def test_store_boundary_agrees_with_the_store_service(app, arguments):  # spec ST-2
    """The facade runs store's first two checks first; the service must refuse the same calls with the same words."""
    try:
        check_boundary(arguments)
        boundary = None
    except ToolFailure as refusal:
        boundary = REGISTRY.get("store").refusal(refusal.message, arguments)
    service = store(app, **arguments)
    first_two = service.get("reason", "").startswith(("send content, id", "agent_id is required"))
    if boundary is None:
        assert not (service["ok"] is False and first_two)
    else:
        assert service == boundary


OPERATING_CONTEXT = """version = 1
context_revision = "r1"
[registry]
project_ids = ["", "ops"]
enforce = "reject"
[defaults]
"a" = "ops"
"""


async def test_the_operating_context_check_precedes_the_pause(db, clock, tmp_path):  # spec §9.5, OC-8, OC-9, OC-11
    context = tmp_path / "operating-context.toml"
    context.write_text(OPERATING_CONTEXT)
    app = make_app(db, operating_context_path=str(context))
    app.clock = clock
    await call(app, "pause_persistence")
    before = snapshot(app)

    refused = await call(app, "store", agent_id="a", content="x", project_id="zzz", lock=True)
    assert refused == {
        "ok": False,
        "result": "rejected",
        "locked": False,
        "reason": "project_id 'zzz' not in registry (rev r1)",
        "operating_context_revision": "r1",
    }
    unpaused = await call(app, "store", agent_id="a", content="x", project_id="zzz", lock=True, session_key="other")
    assert refused == unpaused  # as an unpaused call is refused
    auto = await call(app, "store", agent_id="a", content="x", project_id="@auto")
    assert auto["persisted"] is False and auto["resolved_project_id"] == "ops"
    episode = await call(app, "archive_episode", agent_id="a", summary="s", project_id="zzz")
    assert episode == {
        "ok": False,
        "episode_id": None,
        "error": "project_id 'zzz' not in registry (rev r1)",
        "operating_context_revision": "r1",
    }
    unmapped = await call(app, "archive_episode", agent_id="b", summary="s", project_id="@auto")
    assert unmapped["ok"] is False and "no [defaults] mapping for agent_id 'b'" in unmapped["error"]
    assert (await call(app, "archive_episode", agent_id="a", summary="s", project_id="ops"))["persisted"] is False
    assert snapshot(app) == before


async def test_calibration_arguments_are_checked_before_the_pause(app):  # spec §9.5 (after argument validation)
    assert "calibrate_threshold" in REGISTRY
    await call(app, "pause_persistence")
    bad_percentile = await call(app, "calibrate_threshold", agent_id="a", percentile=150)
    assert bad_percentile["ok"] is False and "percentile must be in (0, 1]" in bad_percentile["error"]
    no_agent = await call(app, "set_recall_precision", agent_id="", precision="strict")
    assert no_agent == {"ok": False, "error": "agent_id is required"}
    bad_level = await call(app, "set_recall_precision", agent_id="a", precision="loose")
    assert bad_level["ok"] is False and "Unknown precision" in bad_level["error"]
    global_run = await call(app, "calibrate_threshold", agent_id="", method="percentile", percentile=90)
    assert global_run["scope"] == "global" and global_run["percentile"] == 0.9 and global_run["persisted"] is False
    cleared = await call(app, "set_recall_precision", agent_id="a")
    assert cleared["cleared"] is True and cleared["precision"] == "default" and cleared["persisted"] is False
    assert not app.settings.calibration_sidecar.exists()


async def test_delete_agent_data_pause_precedes_the_empty_id_check(app):  # spec DAD-5
    await call(app, "pause_persistence")
    answer = await call(app, "delete_agent_data", agent_id="")
    assert answer["ok"] is True and answer["agent_id"] == "" and answer["persisted"] is False


async def test_by_id_tools_are_answered_before_any_lookup(app):  # spec DM-4, DE-3, LK-5, UM (paused first)
    await call(app, "pause_persistence")
    assert (await call(app, "update_memory", memory_id=999, content=""))["updated_id"] is None
    assert (await call(app, "delete_memory", memory_id=999, agent_id="nobody"))["deleted_id"] is None
    assert (await call(app, "delete_episode", episode_id=-5))["deleted_id"] is None
    assert (await call(app, "lock_memory", memory_id=999))["locked_id"] is None


# -- tools that still run while paused --------------------------------------------------------------


async def test_recall_does_not_bump_counters_while_paused(db, clock):  # spec P-12, §5.9.5
    app = make_app(db, confidence_enabled="true")
    app.clock = clock
    await call(app, "store", agent_id="a", content="the garden gate is green")

    def counters():
        with app.db.read() as session:
            return tuple(session.execute(text("SELECT recall_count, last_recalled_at FROM memories")).one())

    assert (await call(app, "recall", agent_id="a", query="garden gate"))["messages"]
    assert counters()[0] == 1 and counters()[1] is not None
    await call(app, "pause_persistence", session_key="s")
    paused = await call(app, "recall", agent_id="a", query="garden gate", session_key="s")
    assert paused["messages"] and "persisted" not in paused  # reads answer normally
    assert counters()[0] == 1
    await call(app, "recall", agent_id="a", query="garden gate", session_key="t")  # another bucket counts
    assert counters()[0] == 2


async def test_export_and_reads_are_unaffected(app, tmp_path):  # spec P-12
    await seed(app)
    await call(app, "pause_persistence")
    exported = await call(app, "export_memories", agent_id="a", output_path=str(tmp_path / "e.jsonl"))
    assert exported["ok"] is True and exported["memories"] == 2 and (tmp_path / "e.jsonl").exists()
    assert (await call(app, "list_memories", agent_id="a"))["count"] == 2
    assert (await call(app, "get_profile", agent_id="a")) == {"profile": "likes gardens"}


def _recording_tool(
    name: str,
    seen: list[dict[str, Any]],
    annotations: Annotations,
    paused: Rule | None = None,
) -> ToolSpec:
    def service(app, dry_run=True, fix=False, session_key=""):
        seen.append({"dry_run": dry_run, "fix": fix, "session_key": session_key})
        return {"ran": True, "writes_paused": app.writes_paused}

    props = {
        "dry_run": {"type": "boolean", "default": True},
        "fix": {"type": "boolean", "default": False},
        "session_key": {"type": "string", "default": ""},
    }
    return keyword_tool(
        name=name,
        description="Test tool.",
        input_schema={"type": "object", "properties": props},
        annotations=annotations,
        service=service,
        paused=paused,
    )


async def test_migrate_is_forced_to_a_dry_run(app):  # spec P-11, MC-6
    seen: list[dict[str, Any]] = []
    registry = Registry([_recording_tool("migrate_channel_axis", seen, Annotations(read_only=False), ForceDryRun())])
    await call(app, "pause_persistence")
    asked = await call(app, "migrate_channel_axis", registry, dry_run=False)
    assert seen[-1]["dry_run"] is True
    assert asked == {
        "ran": True,
        "writes_paused": True,
        "repairs_skipped": True,
        "repairs_skip_reason": "no-persist mode active — dry_run forced",
    }
    default = await call(app, "migrate_channel_axis", registry)
    assert seen[-1]["dry_run"] is True and "repairs_skipped" not in default and "persisted" not in default


async def test_the_real_migrate_tool_changes_nothing_while_paused(app):  # spec MC-6, P-11
    assert "migrate_channel_axis" in REGISTRY
    await call(
        app,
        "store",
        agent_id="kai",
        content="from discord",
        channel="discord",
        metadata={"session_id": "1122334455:77:0"},
    )
    before = snapshot(app)
    await call(app, "pause_persistence")
    answer = await call(app, "migrate_channel_axis", agent_id="kai", dry_run=False)
    assert answer["dry_run"] is True and answer["recoverable_total"] == 1 and answer["migrated"] == 0
    assert (
        answer["repairs_skipped"] is True and answer["repairs_skip_reason"] == "no-persist mode active — dry_run forced"
    )
    assert "persisted" not in answer
    assert snapshot(app) == before
    await call(app, "resume_persistence")
    assert (await call(app, "migrate_channel_axis", agent_id="kai", dry_run=False))["migrated"] == 1


async def test_the_real_check_health_repairs_nothing_while_paused(app):  # spec P-11
    assert "check_health" in REGISTRY
    await call(app, "store", agent_id="a", content="[Memory from bot] kept as written")
    with app.db.write() as session:  # a defect a repair would rewrite
        session.execute(text("UPDATE memories SET content = '[Memory from bot] x' || content"))
    before = snapshot(app)
    await call(app, "pause_persistence")
    answer = await call(app, "check_health", fix=True)
    assert answer["fixed"] is False and answer["repairs_skipped"] is True
    assert answer["repairs_skip_reason"] == "no-persist mode active — fix downgraded to fix=False"
    assert "persisted" not in answer and snapshot(app) == before
    report = await call(app, "check_health", fix=False)
    assert "repairs_skipped" not in report
    await call(app, "resume_persistence")
    await call(app, "check_health", fix=True)
    assert snapshot(app) != before  # the same call repairs once resumed: the pause was what held it back


@pytest.mark.parametrize("tool", ["check_health", "deep_check"])
async def test_health_tools_are_downgraded_to_report_only(app, tool):  # spec P-11
    seen: list[dict[str, Any]] = []
    registry = Registry([_recording_tool(tool, seen, Annotations(read_only=False), DowngradeFix())])
    await call(app, "pause_persistence")
    fixed = await call(app, tool, registry, fix=True)
    assert seen[-1]["fix"] is False
    assert fixed == {
        "ran": True,
        "writes_paused": True,
        "fixed": False,
        "repairs_skipped": True,
        "repairs_skip_reason": "no-persist mode active — fix downgraded to fix=False",
    }
    report = await call(app, tool, registry, fix=False)
    assert "repairs_skipped" not in report and "persisted" not in report


async def test_a_tool_without_a_rule_is_judged_by_its_annotations(app, caplog):
    seen: list[dict[str, Any]] = []
    writer = _recording_tool("new_writer", seen, Annotations(read_only=False))
    with pytest.raises(ValueError, match="must declare what it does while paused"):
        Registry([writer])  # the registry never serves a write that says nothing
    registry = Registry([_recording_tool("new_reader", seen, READ_ONLY)])
    await call(app, "pause_persistence")

    async def service(call: ToolCall) -> dict[str, Any]:
        seen.append(dict(call.arguments))
        return {"ran": True}

    # Built outside a registry, the same write is still not let through.
    write = await PauseGate()(ToolCall(app, writer, {}), service)
    assert seen == [] and write["persisted"] is False and "`new_writer` skipped" in write["reason"]
    assert "no pause rule" in caplog.text
    assert (await call(app, "new_reader", registry)) == {"ran": True, "writes_paused": True}


def test_pass_through_rules_cover_only_tools_that_write_no_record():
    passing = {spec.name for spec in default_registry() if isinstance(spec.paused, PassThrough)}
    assert passing == {"export_memories", "check_update", "pause_persistence", "resume_persistence"}
    assert isinstance(default_registry().get("migrate_channel_axis").paused, ForceDryRun)


# -- end to end over stdio ----------------------------------------------------------------------------


def _stdio(db_path: Path) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    env.update({"CPERSONA_DB_PATH": str(db_path), "CPERSONA_UPDATE_CHECK": "false"})
    return StdioServerParameters(command=sys.executable, args=["-m", "cpersona"], env=env)


def _body(result) -> dict[str, Any]:
    assert result.is_error is False and len(result.content) == 1
    return json.loads(result.content[0].text)


async def test_stdio_pause_silences_store_and_resume_restores_it(tmp_path):  # spec §9, P-1, P-8
    async with Client(_stdio(tmp_path / "data" / "e2e.db")) as client:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert {"pause_persistence", "resume_persistence", "persistence_status"} <= tools
        paused = _body(await client.call_tool("pause_persistence", {"ttl_seconds": 600}))
        assert paused["paused"] is True and paused["scope"] == "process"
        skipped = _body(await client.call_tool("store", {"agent_id": "e2e", "content": "written while paused"}))
        assert skipped["persisted"] is False and skipped["id"] == "no-persist"
        assert REASON.match(skipped["reason"]).group(1) in ("9m left", "10m left")
        assert _body(await client.call_tool("list_memories", {"agent_id": "e2e"}))["count"] == 0
        assert _body(await client.call_tool("resume_persistence", {}))["was_active"] is True
        stored = _body(await client.call_tool("store", {"agent_id": "e2e", "content": "written after resume"}))
        assert stored["result"] == "stored" and isinstance(stored["id"], int)
        listed = _body(await client.call_tool("list_memories", {"agent_id": "e2e"}))
        assert [m["content"] for m in listed["memories"]] == ["written after resume"]
