"""The operating context: the operator's TOML file, get_operating_context and the Hard layer.

Every test writes a real file and points CPERSONA_OPERATING_CONTEXT_PATH at it;
the Hard layer is exercised through the real store / archive / list / recall
services on a real SQLite file.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from sqlalchemy import select

from conftest import make_app
from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.pause_gate import PauseGate
from cpersona.mcp.tools import default_registry
from cpersona.services.operating_context import (
    ProjectRefusal,
    ProjectResolution,
    get_operating_context,
    instructions_summary,
    resolve_project,
)
from cpersona.storage.models import Episode, Memory

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

CONTEXT = '''\
version = 1
context_revision = "2026-11-30.1"

[instructions]
summary = """
Team memory rules (rev 2026-11-30.1).
Pass "@auto" for your default project.
"""

[registry]
project_ids = ["", "ops", "home"]
enforce = "{enforce}"

[defaults]
"claude-code" = "ops"
"drifter" = "elsewhere"

[[doctrine]]
name = "recall-discipline"
body = "Call reconstruct at session start."

[[doctrine]]
name = "agent-id-conventions"
body = "Use your tool's name as agent_id."
'''


def write_context(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def context_file(tmp_path: Path) -> Path:
    return write_context(tmp_path / "operating-context.toml", CONTEXT.format(enforce="warn"))


def app_with(db, path: Path, **env: str):
    return make_app(db, OPERATING_CONTEXT_PATH=str(path), **env)


REGISTRY = default_registry()


def tool(app, name: str, **arguments):
    """One call through the facade's real call path: the Hard layer is the dispatch's, from the declaration."""
    return anyio.run(call_tool, app, REGISTRY, GateChain([PauseGate()]), name, arguments).payload


store, archive_episode, list_episodes, list_memories, recall, recall_with_context = (
    lambda app, _name=name, **arguments: tool(app, _name, **arguments)
    for name in ("store", "archive_episode", "list_episodes", "list_memories", "recall", "recall_with_context")
)


# --- the tool (§10.2) ---------------------------------------------------------------


def test_preview_tier_lists_everything_but_section_bodies(db, context_file):  # spec OC-6
    answer = get_operating_context(app_with(db, context_file))
    assert answer == {
        "ok": True,
        "context_revision": "2026-11-30.1",
        "instructions_summary": 'Team memory rules (rev 2026-11-30.1).\nPass "@auto" for your default project.\n',
        "registry": {"project_ids": ["", "ops", "home"], "enforce": "warn"},
        "defaults": {"claude-code": "ops", "drifter": "elsewhere"},
        "doctrine_sections": ["agent-id-conventions", "recall-discipline"],  # sorted by name
    }
    assert "Call reconstruct" not in str(answer)


def test_section_returns_one_body(db, context_file):
    app = app_with(db, context_file)
    assert get_operating_context(app, section="recall-discipline") == {
        "ok": True,
        "context_revision": "2026-11-30.1",
        "section": "recall-discipline",
        "body": "Call reconstruct at session start.",
    }
    assert get_operating_context(app, section="nope") == {
        "ok": False,
        "error": "unknown doctrine section 'nope'",
        "doctrine_sections": ["agent-id-conventions", "recall-discipline"],
    }


def test_absent_file_is_dormant(db, tmp_path):  # spec OC-2
    missing = tmp_path / "none.toml"
    answer = get_operating_context(app_with(db, missing))
    assert answer == {
        "ok": False,
        "enabled": False,
        "error": f"operating context is dormant — no sidecar file at {missing}",
    }


def test_kill_switch_is_dormant_whatever_the_file_says(db, context_file):  # spec OC-2, §8.8
    answer = get_operating_context(app_with(db, context_file, OPERATING_CONTEXT="OFF"))
    assert answer == {
        "ok": False,
        "enabled": False,
        "error": "operating context is dormant — disabled (CPERSONA_OPERATING_CONTEXT=off)",
    }


def test_toml_syntax_error_is_reported_with_its_position(db, tmp_path):  # spec OC-1, OC-2
    bad = write_context(tmp_path / "bad.toml", 'version = 1\ncontext_revision = "broken\n')
    answer = get_operating_context(app_with(db, bad))
    assert answer == {
        "ok": False,
        "enabled": False,
        "error": "operating context is dormant — sidecar unusable: Illegal character '\\n' (at line 2, column 27)",
    }


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("version = 2", "version must be the integer 1"),
        ("version = true", "version must be the integer 1"),
        ('version = "1"', "version must be the integer 1"),
        ("version = 1\ncontext_revision = 3", "context_revision must be a string"),
        ("version = 1\ninstructions = 'x'", "instructions must be a table"),
        ("version = 1\n[instructions]\nsummary = 5", "instructions.summary must be a string"),
        ("version = 1\n[registry]\nproject_ids = ['a', 1]", "registry.project_ids must be a list of strings"),
        ("version = 1\n[registry]\nenforce = 'strict'", "registry.enforce must be one of"),
        ("version = 1\n[defaults]\na = 1", "defaults must map agent ids"),
        ("version = 1\n[[doctrine]]\nname = ''\nbody = 'b'", "needs a non-empty string name"),
        ("version = 1\n[[doctrine]]\nname = 'a'\nbody = 1", "needs a string body"),
        ("version = 1\n[[doctrine]]\nname = 'a'\nbody = 'x'\n[[doctrine]]\nname = 'a'\nbody = 'y'", "used twice"),
    ],
)
def test_invalid_files_are_unusable_and_change_nothing(db, tmp_path, text, complaint):  # spec OC-1, OC-7
    path = write_context(tmp_path / "ctx.toml", text)
    app = app_with(db, path)
    answer = get_operating_context(app)
    assert answer["ok"] is False and answer["enabled"] is False
    assert "sidecar unusable" in answer["error"] and complaint in answer["error"]
    # Dormant: '@auto' is echoed and stored literally, nothing is validated.
    stored = store(app, content="x", agent_id="claude-code", project_id="@auto")
    assert stored["result"] == "stored" and stored["resolved_project_id"] == "@auto"
    assert "operating_context_warning" not in stored


def test_not_utf8_is_unusable(db, tmp_path):  # spec OC-1
    path = tmp_path / "ctx.toml"
    path.write_bytes(b'version = 1\ncontext_revision = "\xff"\n')
    assert "not UTF-8" in get_operating_context(app_with(db, path))["error"]


def test_unknown_keys_are_ignored(db, tmp_path):  # spec OC-1
    path = write_context(tmp_path / "ctx.toml", "version = 1\nflavour = 'extra'\n[registry]\ncolour = 3\n")
    answer = get_operating_context(app_with(db, path))
    assert answer["ok"] is True and answer["registry"] == {"project_ids": [], "enforce": "warn"}
    assert answer["context_revision"] == "" and answer["instructions_summary"] == ""


def test_edits_apply_live(db, context_file):  # spec OC-3
    app = app_with(db, context_file)
    assert get_operating_context(app)["registry"]["enforce"] == "warn"
    write_context(context_file, CONTEXT.format(enforce="reject").replace("2026-11-30.1", "rev-2"))
    stamp = context_file.stat().st_mtime_ns + 1_000_000_000
    os.utime(context_file, ns=(stamp, stamp))
    answer = get_operating_context(app)
    assert answer["registry"]["enforce"] == "reject" and answer["context_revision"] == "rev-2"
    context_file.unlink()
    assert get_operating_context(app)["enabled"] is False


def test_a_huge_file_is_unusable_not_read_whole(db, tmp_path):  # bounded work
    path = tmp_path / "ctx.toml"
    path.write_text("version = 1\n" + "# padding\n" * 200_000)
    assert "larger than" in get_operating_context(app_with(db, path))["error"]


def test_instructions_summary_is_the_summary_verbatim_or_none(db, context_file, tmp_path):  # spec OC-4
    app = app_with(db, context_file)
    assert instructions_summary(app.settings).startswith("Team memory rules")
    blank = write_context(tmp_path / "blank.toml", 'version = 1\n[instructions]\nsummary = "  \\n"\n')
    assert instructions_summary(app_with(db, blank).settings) is None
    assert instructions_summary(app_with(db, tmp_path / "absent.toml").settings) is None


# --- the Hard layer (§10.3) ------------------------------------------------------------


def test_resolution_rules(db, tmp_path):  # spec OC-7..OC-10
    def resolver(enforce: str):
        app = app_with(db, write_context(tmp_path / f"{enforce}.toml", CONTEXT.format(enforce=enforce)))
        return lambda tool, project, agent="claude-code": resolve_project(
            app, project, agent_id=agent, writes=REGISTRY.get(tool).project.writes
        )

    warn, reject, off = resolver("warn"), resolver("reject"), resolver("off")
    rev = "(rev 2026-11-30.1)"
    # OC-7: omitted and '' pass through untouched
    assert warn("store", None) == ProjectResolution(None)
    assert reject("store", "") == ProjectResolution("")
    # OC-8: @auto → the agent's default, itself validated
    assert warn("store", "@auto") == ProjectResolution("ops", {"resolved_project_id": "ops"})
    assert warn("store", "@auto", "drifter") == ProjectResolution(
        "elsewhere",
        {
            "resolved_project_id": "elsewhere",
            "operating_context_warning": f"project_id 'elsewhere' not in registry {rev}",
        },
    )
    no_map = f"@auto has no [defaults] mapping for agent_id 'nobody' {rev}"
    assert warn("store", "@auto", "nobody") == ProjectResolution(
        "", {"resolved_project_id": "", "operating_context_warning": f"{no_map}; resolved to '' (global pool)"}
    )
    assert reject("store", "@auto", "nobody") == ProjectRefusal(no_map, "2026-11-30.1")
    assert reject("recall", "@auto", "nobody") == ProjectResolution(
        "", {"resolved_project_id": "", "operating_context_warning": f"{no_map}; resolved to '' (global pool)"}
    )
    assert off("store", "@auto", "nobody") == ProjectResolution("", {"resolved_project_id": ""})
    # OC-9: explicit values outside the registry
    zzz = f"project_id 'zzz' not in registry {rev}"
    assert warn("archive_episode", "zzz") == ProjectResolution("zzz", {"operating_context_warning": zzz})
    assert reject("store", "zzz") == ProjectRefusal(zzz, "2026-11-30.1")
    assert reject("list_memories", "zzz") == ProjectResolution("zzz", {"operating_context_warning": zzz})
    assert off("store", "zzz") == ProjectResolution("zzz")
    # OC-10: a registered explicit value is left alone, with nothing to say
    assert reject("store", "home") == ProjectResolution("home")


def test_only_the_tools_of_ax5_are_governed():  # spec AX-5
    governed = {spec.name: spec.project.writes for spec in REGISTRY if spec.project.applies}
    assert governed == {
        "store": True,
        "declare_associations": True,
        "archive_episode": True,
        "recall": False,
        "recall_with_context": False,
        "reconstruct": False,
        "traverse": False,
        "list_memories": False,
        "list_episodes": False,
    }


def test_store_resolves_auto_and_stores_under_the_default(db, context_file):  # spec OC-8, OC-11
    app = app_with(db, context_file)
    answer = store(app, content="deploys happen on Fridays", agent_id="claude-code", project_id="@auto")
    assert answer == {
        "ok": True,
        "result": "stored",
        "id": answer["id"],
        "embedded": False,
        "resolved_project_id": "ops",
    }
    with db.read() as session:
        assert session.scalar(select(Memory.project_id).where(Memory.id == answer["id"])) == "ops"
    again = store(app, content="deploys happen on Fridays", agent_id="claude-code", project_id="@auto")
    assert again["result"] == "skipped" and again["resolved_project_id"] == "ops"  # on every answer


def test_store_warns_about_unregistered_projects(db, context_file):  # spec OC-9, OC-11
    answer = store(app_with(db, context_file), content="x", agent_id="a", project_id="zzz")
    assert answer["result"] == "stored"
    assert answer["operating_context_warning"] == "project_id 'zzz' not in registry (rev 2026-11-30.1)"
    assert "resolved_project_id" not in answer  # only a caller that sent @auto gets it


def test_reject_mode_refuses_the_write_and_writes_nothing(db, tmp_path):  # spec OC-9, OC-11
    app = app_with(db, write_context(tmp_path / "ctx.toml", CONTEXT.format(enforce="reject")))
    answer = store(app, content="x", agent_id="a", project_id="zzz", lock=True)
    assert answer == {
        "ok": False,
        "result": "rejected",
        "locked": False,
        "operating_context_revision": "2026-11-30.1",
        "reason": "project_id 'zzz' not in registry (rev 2026-11-30.1)",
    }
    episode = archive_episode(app, agent_id="nobody", summary="s", project_id="@auto")
    assert episode == {
        "ok": False,
        "episode_id": None,
        "operating_context_revision": "2026-11-30.1",
        "error": "@auto has no [defaults] mapping for agent_id 'nobody' (rev 2026-11-30.1)",
    }
    with db.read() as session:
        assert session.scalars(select(Memory.id)).all() == [] and session.scalars(select(Episode.id)).all() == []


def test_refusal_comes_after_the_mixed_forms_check(db, tmp_path):  # spec ST-2 order, OC-11
    app = app_with(db, write_context(tmp_path / "ctx.toml", CONTEXT.format(enforce="reject")))
    answer = store(app, content="x", message={"content": "y"}, agent_id="a", project_id="zzz")
    assert "either at the top level or inside message" in answer["reason"]


def test_archive_episode_resolves_auto(db, context_file):  # spec OC-8, OC-11
    app = app_with(db, context_file)
    answer = archive_episode(app, agent_id="claude-code", summary="we shipped", project_id="@auto")
    assert answer["ok"] is True and answer["resolved_project_id"] == "ops"
    with db.read() as session:
        assert session.scalar(select(Episode.project_id).where(Episode.id == answer["episode_id"])) == "ops"


def test_reads_filter_by_the_resolved_project_and_are_never_refused(db, tmp_path):  # spec OC-8, OC-9, OC-11
    warn_app = app_with(db, write_context(tmp_path / "warn.toml", CONTEXT.format(enforce="warn")))
    store(warn_app, content="ops note about deploys", agent_id="claude-code", project_id="ops")
    store(warn_app, content="home note about deploys", agent_id="claude-code", project_id="home")
    archive_episode(warn_app, agent_id="claude-code", summary="ops episode about deploys", project_id="ops")
    reject_app = app_with(db, write_context(tmp_path / "reject.toml", CONTEXT.format(enforce="reject")))

    listed = list_memories(reject_app, agent_id="claude-code", project_id="@auto")
    assert [m["content"] for m in listed["memories"]] == ["ops note about deploys"]
    assert listed["resolved_project_id"] == "ops"
    episodes = list_episodes(reject_app, agent_id="claude-code", project_id="@auto")
    assert episodes["count"] == 1 and episodes["resolved_project_id"] == "ops"

    found = recall(reject_app, agent_id="claude-code", query="deploys", project_id="@auto")
    assert {m["content"] for m in found["messages"]} == {
        "ops note about deploys",
        "[Episode] ops episode about deploys",
    }
    assert found["resolved_project_id"] == "ops"

    unknown = recall(reject_app, agent_id="claude-code", query="deploys", project_id="zzz")
    assert unknown["operating_context_warning"] == "project_id 'zzz' not in registry (rev 2026-11-30.1)"
    assert "ok" not in unknown  # a read is answered, not refused


def test_recall_with_context_resolves_auto_as_recall_does(db, context_file):  # spec OC-8, OC-11, RWC-1
    # The bug this pins: recall_with_context rebuilt recall's wrapper without '@auto', so it filtered on a
    # project literally named '@auto' (no rows) and said nothing of the resolution its schema promises.
    app = app_with(db, context_file)
    store(app, content="ops note about deploys", agent_id="claude-code", project_id="ops")
    store(app, content="home note about deploys", agent_id="claude-code", project_id="home")
    arguments = {"agent_id": "claude-code", "query": "deploys", "project_id": "@auto"}
    recalled = recall(app, **arguments)
    assert [m["content"] for m in recalled["messages"]] == ["ops note about deploys"]
    assert recalled["resolved_project_id"] == "ops"
    merged = recall_with_context(app, **arguments)
    assert [m["content"] for m in merged["messages"]] == ["ops note about deploys"]
    assert merged["resolved_project_id"] == "ops"
    unknown = recall_with_context(app, **{**arguments, "project_id": "zzz"})
    assert unknown["operating_context_warning"] == "project_id 'zzz' not in registry (rev 2026-11-30.1)"


def test_dormant_context_stores_auto_literally(db, tmp_path):  # spec OC-7, OC-11
    app = app_with(db, tmp_path / "absent.toml")
    answer = store(app, content="x", agent_id="claude-code", project_id="@auto")
    assert answer["resolved_project_id"] == "@auto"
    with db.read() as session:
        assert session.scalar(select(Memory.project_id)) == "@auto"
    assert list_memories(app, project_id="@auto")["count"] == 1


# --- the tool declaration ------------------------------------------------------------------------


def test_description_carries_the_facts():  # spec §14
    from cpersona.mcp.tools import default_registry

    description = default_registry().get("get_operating_context").description
    for fact in (
        "context_revision",
        "instructions_summary",
        "registry",
        "enforce",
        "'@auto'",
        "doctrine_sections",
        "section",
        "Read-only",
        "~/.cpersona/operating-context.toml",
    ):
        assert fact in description, fact


@pytest.mark.anyio
async def test_through_the_facade(db, context_file):  # spec C-3, §10.2
    from cpersona.mcp.dispatch import call_tool
    from cpersona.mcp.gates import GateChain
    from cpersona.mcp.tools import default_registry

    app = app_with(db, context_file)
    bad = await call_tool(app, default_registry(), GateChain(), "get_operating_context", {"section": 5})
    assert bad.is_error and "Input validation error" in bad.payload["error"]
    good = await call_tool(
        app, default_registry(), GateChain(), "get_operating_context", {"section": "recall-discipline"}
    )
    assert good.payload["body"] == "Call reconstruct at session start."
