"""export_memories, import_memories and merge_memories as MCP tools: the facade and the pause around them.

The services themselves are tested in test_export_import.py and test_merge.py;
here every call goes through the real call path with the pause gate in the
chain, on real SQLite files, to pin what the tool layer adds: declarations,
checks that run before the pause (IM-1, MG-1), the paused answers, and dry
runs that still run while paused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import make_app
from sqlalchemy import text

from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.pause_gate import PauseGate
from cpersona.mcp.tools import default_registry
from cpersona.services.app import App

pytestmark = pytest.mark.anyio

REGISTRY = default_registry()
GATES = GateChain([PauseGate()])
PAUSE_KEYS = ("persisted", "reason")


async def call(app: App, name: str, **arguments: Any) -> dict[str, Any]:
    outcome = await call_tool(app, REGISTRY, GATES, name, arguments)
    assert outcome.is_error is False, outcome.payload
    return outcome.payload


def rows(app: App) -> dict[str, list[tuple]]:
    with app.db.read() as session:
        return {
            t: [tuple(r) for r in session.execute(text(f"SELECT * FROM {t} ORDER BY rowid"))]
            for t in ("memories", "episodes", "profiles")
        }


async def seed(app: App, agent: str = "alice") -> None:
    for i, content in enumerate(("Alice's cat is named Miso.", "Alice waters the plants on Fridays.")):
        stored = await call(app, "store", agent_id=agent, content=content, id=f"msg-{i}")
        assert stored["result"] == "stored"
    await call(app, "lock_memory", memory_id=1)
    await call(app, "archive_episode", agent_id=agent, summary="Talked about Miso the cat.", keywords="cat miso")
    await call(app, "update_profile", agent_id=agent, profile="Alice likes cats.")


# -- round trip through the tools -------------------------------------------------------------------


async def test_export_then_import_restores_the_agent_and_a_second_import_adds_nothing(
    app, tmp_path
):  # spec EX-9, IM-15, LK-4
    await seed(app)
    path = tmp_path / "backups" / "alice.jsonl"
    exported = await call(app, "export_memories", agent_id="alice", output_path=str(path))
    assert exported == {"ok": True, "path": str(path), "memories": 2, "episodes": 1, "profiles": 1}
    header = json.loads(path.read_text().splitlines()[0])
    assert header["_type"] == "header" and header["version"] == "cpersona-export/1.1"

    deleted = await call(app, "delete_agent_data", agent_id="alice")
    assert deleted["deleted_memories"] == 2 and rows(app)["memories"] == []

    imported = await call(app, "import_memories", input_path=str(path))
    assert imported == {
        "ok": True,
        "dry_run": False,
        "imported_memories": 2,
        "skipped_memories": 0,
        "imported_episodes": 1,
        "skipped_episodes": 0,
        "profile_updated": True,
    }
    listed = (await call(app, "list_memories", agent_id="alice"))["memories"]
    assert {m["content"]: m["locked"] for m in listed} == {
        "Alice's cat is named Miso.": True,
        "Alice waters the plants on Fridays.": False,
    }
    assert (await call(app, "get_profile", agent_id="alice")) == {"profile": "Alice likes cats."}

    again = await call(app, "import_memories", input_path=str(path), target_agent_id="")
    assert again["imported_memories"] == 0 and again["skipped_memories"] == 2 and again["imported_episodes"] == 0


async def test_export_refuses_a_traversing_path_through_the_tool(app, tmp_path):  # spec EX-3, EX-4
    bad = str(tmp_path / ".." / "escape.jsonl")
    assert await call(app, "export_memories", agent_id="", output_path=bad) == {
        "ok": False,
        "error": f"output_path rejected (path traversal or outside export dir): {bad}",
    }


async def test_export_is_never_paused(app, tmp_path):  # spec §6, P-12
    await seed(app)
    await call(app, "pause_persistence")
    path = tmp_path / "while-paused.jsonl"
    # export declares no session_key; one sent anyway is dropped, and nothing pauses it.
    exported = await call(app, "export_memories", agent_id="alice", output_path=str(path), session_key="x")
    assert exported["ok"] is True and "persisted" not in exported and path.exists()
    assert "session_key" not in REGISTRY.get("export_memories").properties


# -- import: vetting first, then the pause (§7.1) ---------------------------------------------------


@pytest.mark.parametrize("paused", [False, True])
async def test_import_vetting_precedes_the_pause(db, tmp_path, paused):  # spec IM-1, IM-2
    app = make_app(db, max_import_bytes="64")
    if paused:
        await call(app, "pause_persistence", session_key="s")
    missing = tmp_path / "missing.jsonl"
    assert await call(app, "import_memories", input_path=str(missing), session_key="s") == {
        "ok": False,
        "error": f"File not found: {missing}",
    }
    assert await call(app, "import_memories", input_path=str(tmp_path), session_key="s") == {
        "ok": False,
        "error": f"input_path is not a regular file: {tmp_path}",
    }
    big = tmp_path / "big.jsonl"
    big.write_text("x" * 65)
    assert await call(app, "import_memories", input_path=str(big), session_key="s") == {
        "ok": False,
        "error": f"input file exceeds CPERSONA_MAX_IMPORT_BYTES (64): {big}",
    }
    bad = str(tmp_path / ".." / "x.jsonl")
    refused = await call(app, "import_memories", input_path=bad, session_key="s")
    assert refused == {"ok": False, "error": f"input_path rejected (path traversal or outside export dir): {bad}"}


async def test_paused_import_is_skipped_but_a_dry_run_still_counts(app, tmp_path):  # spec IM-2, IM-14, P-12
    await seed(app)
    path = tmp_path / "alice.jsonl"
    await call(app, "export_memories", agent_id="alice", output_path=str(path))
    before = rows(app)

    await call(app, "pause_persistence", session_key="s")
    skipped = await call(app, "import_memories", input_path=str(path), target_agent_id="bob", session_key="s")
    assert {k: v for k, v in skipped.items() if k not in PAUSE_KEYS} == {
        "ok": True,
        "dry_run": True,
        "imported_memories": 0,
        "skipped_memories": 0,
        "imported_episodes": 0,
        "skipped_episodes": 0,
        "profile_updated": False,
    }
    assert skipped["persisted"] is False and "`import_memories` skipped" in skipped["reason"]
    dry = await call(app, "import_memories", input_path=str(path), target_agent_id="bob", dry_run=True, session_key="s")
    assert "persisted" not in dry and dry["dry_run"] is True and dry["imported_memories"] == 2
    assert rows(app) == before

    await call(app, "resume_persistence", session_key="s")
    real = await call(app, "import_memories", input_path=str(path), target_agent_id="bob", session_key="s")
    assert {k: v for k, v in real.items() if k != "dry_run"} == {k: v for k, v in dry.items() if k != "dry_run"}
    assert (await call(app, "list_memories", agent_id="bob"))["count"] == 2


# -- merge: argument checks first, then the pause (§8) ----------------------------------------------


@pytest.mark.parametrize("paused", [False, True])
@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"source_agent_id": "", "target_agent_id": "b"}, "source_agent_id is required"),
        ({"source_agent_id": "a", "target_agent_id": ""}, "target_agent_id is required"),
        ({"source_agent_id": "", "target_agent_id": ""}, "source_agent_id is required"),
        ({"source_agent_id": "a", "target_agent_id": "a"}, "source_agent_id and target_agent_id must differ"),
        (
            {"source_agent_id": "a", "target_agent_id": "b", "strategy": "overwrite"},
            "Unsupported strategy 'overwrite'. Currently supported: 'skip'",
        ),
        (
            {"source_agent_id": "a", "target_agent_id": "b", "mode": "swap"},
            "Invalid mode 'swap'. Supported: 'copy', 'move'",
        ),
        (
            {"source_agent_id": "a", "target_agent_id": "b", "strategy": "x", "mode": "y"},
            "Unsupported strategy 'x'. Currently supported: 'skip'",
        ),
    ],
)
async def test_merge_arguments_are_checked_before_the_pause(app, arguments, error, paused):  # spec MG-1, MG-2
    if paused:
        await call(app, "pause_persistence")
    assert await call(app, "merge_memories", **arguments) == {"ok": False, "error": error}


async def test_paused_merge_is_skipped_but_a_dry_run_still_counts(app):  # spec MG-2, MG-10, P-12
    await seed(app)
    before = rows(app)
    await call(app, "pause_persistence")
    skipped = await call(app, "merge_memories", source_agent_id="alice", target_agent_id="dave", mode="move")
    assert {k: v for k, v in skipped.items() if k not in PAUSE_KEYS} == {
        "ok": True,
        "dry_run": True,
        "source_agent_id": "alice",
        "target_agent_id": "dave",
        "strategy": "skip",
        "mode": "move",
        "merged_memories": 0,
        "skipped_memories": 0,
        "merged_episodes": 0,
        "skipped_episodes": 0,
        "profile_copied": False,
        "skipped_profile": False,
    }
    dry = await call(app, "merge_memories", source_agent_id="alice", target_agent_id="dave", dry_run=True)
    assert dry["merged_memories"] == 2 and dry["merged_episodes"] == 1 and dry["profile_copied"] is True
    assert "persisted" not in dry
    assert rows(app) == before

    await call(app, "resume_persistence")
    real = await call(app, "merge_memories", source_agent_id="alice", target_agent_id="dave")
    assert {k: v for k, v in real.items() if k != "dry_run"} == {k: v for k, v in dry.items() if k != "dry_run"}
    again = await call(app, "merge_memories", source_agent_id="alice", target_agent_id="dave")
    assert again["merged_memories"] == 0 and again["skipped_memories"] == 2  # MG-10


async def test_merge_move_carries_a_locked_row_and_its_lock(app):  # spec LK-3, LK-4, MG-7
    await seed(app)
    moved = await call(app, "merge_memories", source_agent_id="alice", target_agent_id="erin", mode="move")
    assert moved["source_deleted"]["deleted_memories"] == 2
    listed = (await call(app, "list_memories", agent_id="erin"))["memories"]
    assert {m["content"]: m["locked"] for m in listed}["Alice's cat is named Miso."] is True
    assert (await call(app, "list_memories", agent_id="alice"))["count"] == 0


# -- declarations -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "facts"),
    [
        (
            "export_memories",
            [
                "memories, episodes, profile and declared associations",
                "entities",
                "aliases",
                "mentions and relations",
                "JSONL",
                "backup",
            ],
        ),
        (
            "import_memories",
            [
                "JSONL",
                "export_memories",
                "pointed at the record it names as restored",
                "adds nothing",
                "msg_id",
                "content",
                "same project and channel",
                "summary",
            ],
        ),
        # Not "one transaction" any more: it commits in batches (issue 13 item 3, differences table).
        (
            "merge_memories",
            [
                "memories, episodes, profile and declared associations",
                "commits in batches",
                "running it again completes it",
                "'skip'",
                "msg_id",
                "summary",
            ],
        ),
    ],
)
def test_descriptions_carry_the_required_facts(tool, facts):  # spec §14
    description = REGISTRY.get(tool).description
    for fact in facts:
        assert fact in description, f"{tool}: {fact!r}"


def test_the_pause_tools_describe_what_a_pause_does():  # spec §14
    pause = REGISTRY.get("pause_persistence").description
    for fact in (
        "1800",
        "86400",
        "persisted:false",
        "dry_run:true",
        "'no-persist'",
        "null",
        "migrate_channel_axis",
        "repairs_skipped",
        "fix=false",
        "recall stops counting",
        "scope 'session'",
        "scope 'process'",
        "streamable HTTP",
        "Only this server",
        "calibrate_threshold",
        "set_recall_precision",
    ):
        assert fact in pause, fact
    assert "was_active" in REGISTRY.get("resume_persistence").description
    status = REGISTRY.get("persistence_status").description
    assert "paused:false only means your session is not paused" in status and "another keyless session" in status


async def test_sending_a_path_as_a_non_string_is_an_input_error(app):  # spec C-3
    outcome = await call_tool(app, REGISTRY, GATES, "import_memories", {"input_path": 5})
    assert outcome.is_error and "5 is not of type 'string'" in outcome.payload["error"]
    assert not Path("5").exists()
