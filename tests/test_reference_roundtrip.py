"""Export files cross the line between us and the reference CPersona 2.6.14 without losing rows.

Both servers run as real processes over stdio, driven by the MCP SDK client. The
reference lives in its own venv (never imported); point CPERSONA_TEST_REFERENCE_BIN
at its ``cpersona`` console script, or install it at /work/ref-venv.

Rows are compared through the export files: every field of every memory, episode,
profile, entity (with aliases), mention and relation, with ids replaced by content
keys, since ids are renumbered on import (spec IM-9).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).parent / "e2e"))
from stdio_harness import server_env  # noqa: E402

pytestmark = pytest.mark.anyio

_DEFAULT_REFERENCE = Path("/work/ref-venv/bin/cpersona")
REFERENCE_BIN = os.environ.get("CPERSONA_TEST_REFERENCE_BIN") or (
    str(_DEFAULT_REFERENCE) if _DEFAULT_REFERENCE.exists() else ""
)

needs_reference = pytest.mark.skipif(
    not REFERENCE_BIN or not Path(REFERENCE_BIN).exists(),
    reason="reference CPersona not installed: set CPERSONA_TEST_REFERENCE_BIN to its cpersona console script "
    "(pip install cpersona==2.6.14 in a separate venv)",
)


# Recall bumps recall_count / last_recalled_at only with confidence enabled (spec RC-12),
# and the corpus needs non-zero counters to prove they travel.
ENV = {"CPERSONA_CONFIDENCE_ENABLED": "true"}


def ours(db: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "cpersona"], env=server_env(db, **ENV), cwd=str(db.parent)
    )


def reference(db: Path) -> StdioServerParameters:
    # The reference's console script takes no arguments; cwd is set because it
    # resolves relative paths (and its default database) against it.
    return StdioServerParameters(command=REFERENCE_BIN, args=[], env=server_env(db, **ENV), cwd=str(db.parent))


async def call(client, tool: str, arguments: dict) -> dict:
    result = await client.call_tool(tool, arguments)
    assert result.is_error is False, (tool, result.content)
    return json.loads(result.content[0].text)


# (agent, project, channel, content, msg_id, lock)
CORPUS = [
    ("alice", "", "", "Alice's cat is named Miso.", "msg-a1", True),
    ("alice", "home", "", "The spare key hangs behind the garden shed door.", "", False),
    ("alice", "work", "C123", "Standup moved to 9:30 on Tuesdays.", "msg-a3", False),
    ("bob", "", "", "Bob prefers green tea over coffee.", "", False),
    ("bob", "hobby", "discord", "Bob is building a 60% mechanical keyboard.", "msg-b2", False),
    ("", "", "", "The empty-agent bucket remembers the wifi password hint: blue heron.", "", False),
    ("", "ops", "chan9", "東京オフィスの定例会議は毎週水曜日です。", "msg-e2", False),
]


async def fill(client) -> None:
    ids = {}
    for agent, project, channel, content, msg_id, lock in CORPUS:
        args = {"agent_id": agent, "content": content, "project_id": project, "channel": channel}
        if msg_id:
            args["id"] = msg_id
        if lock:
            args["lock"] = True
        stored = await call(client, "store", args)
        assert stored["ok"] is True and stored["result"] == "stored", stored
        ids[content] = stored["id"]
    # Recall counters: a recall that returns a row bumps its recall_count / last_recalled_at.
    hits = await call(client, "recall", {"agent_id": "alice", "query": "Miso cat"})
    assert any("Miso" in m["content"] for m in hits["messages"]), hits
    episode = await call(
        client,
        "archive_episode",
        {
            "agent_id": "alice",
            "summary": "Talked about Miso the cat and the garden key.",
            "keywords": "cat miso key",
            "resolved": True,
            "project_id": "home",
            "channel": "",
        },
    )
    assert episode["ok"] is True, episode
    assert (await call(client, "update_profile", {"agent_id": "alice", "profile": "Alice likes cats."}))["ok"]
    assert (await call(client, "update_profile", {"agent_id": "bob", "profile": "Bob likes tea."}))["ok"]
    declared = await call(
        client,
        "declare_associations",
        {
            "agent_id": "alice",
            "anchor_ref": f"mem:{ids[CORPUS[0][3]]}",
            "associations": {
                "entities": [{"name": "Miso", "aliases": ["the cat"]}, {"name": "Alice"}],
                "relations": [{"subject": "Miso", "predicate": "owned by", "object": "Alice"}],
            },
        },
    )
    assert declared["ok"] is True and not declared.get("dropped"), declared


def read_export(path: Path) -> dict[str, list]:
    """The export file as comparable rows: ids replaced by content keys, sorted."""
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    header = lines[0]
    assert header["_type"] == "header"
    mem_key, ep_key, ent_key = {}, {}, {}
    for row in lines:
        if row["_type"] == "memory":
            mem_key[row["id"]] = ("mem", row["agent_id"], row["project_id"], row["channel"], row["content"])
        elif row["_type"] == "episode":
            ep_key[row["id"]] = ("ep", row["agent_id"], row["project_id"], row["channel"], row["summary"])
        elif row["_type"] == "entity":
            ent_key[row["id"]] = ("entity", row["agent_id"], row["project_id"], row["channel"], row["name"])

    def ref(text):
        if text is None:
            return None
        kind, _, number = text.partition(":")
        return (mem_key if kind == "mem" else ep_key)[int(number)]

    def endpoint(kind, ident):
        return ent_key[ident] if kind == "entity" else ref(f"{kind}:{ident}")

    out: dict[str, list] = {k: [] for k in ("memory", "episode", "profile", "entity", "mention", "relation")}
    for row in lines[1:]:
        kind = row.pop("_type")
        if kind == "memory":
            row.pop("id")
        elif kind == "episode":
            row.pop("id")
        elif kind == "entity":
            row.pop("id")
            row["aliases"] = sorted(row["aliases"])
        elif kind == "mention":
            row["entity"] = ent_key[row["entity"]]
            row["ref"] = ref(row["ref"])
        elif kind == "relation":
            row.pop("id")
            row["subject_id"] = endpoint(row["subject_kind"], row["subject_id"])
            row["object_id"] = endpoint(row["object_kind"], row["object_id"])
            row["anchor_ref"] = ref(row["anchor_ref"])
        out[kind].append(row)
    return {k: sorted(v, key=lambda r: json.dumps(r, sort_keys=True, ensure_ascii=False)) for k, v in out.items()}


def counts(rows: dict[str, list]) -> dict[str, int]:
    return {k: len(v) for k, v in rows.items()}


def without_agent(rows: dict[str, list], agent: str) -> dict[str, list]:
    """Rows not owned by ``agent`` (graph rows follow their owner)."""
    return {
        k: [r for r in v if (r.get("agent_id") if k != "mention" else r["entity"][1]) != agent] for k, v in rows.items()
    }


async def export_all(params: StdioServerParameters, path: Path) -> dict:
    async with Client(params) as client:
        exported = await call(client, "export_memories", {"agent_id": "", "output_path": str(path)})
    assert exported["ok"] is True, exported
    return exported


async def import_into(params: StdioServerParameters, path: Path) -> dict:
    async with Client(params) as client:
        return await call(client, "import_memories", {"input_path": str(path)})


@needs_reference
async def test_ours_to_reference_to_ours_keeps_every_row_the_reference_accepts(tmp_path):  # spec EX-6, IM-6, IM-9, LK-4
    legs = {name: tmp_path / name for name in ("ours1", "ref", "ours2")}
    for d in legs.values():
        d.mkdir()
    async with Client(ours(legs["ours1"] / "memory.db")) as client:
        await fill(client)
    first = tmp_path / "ours1.jsonl"
    await export_all(ours(legs["ours1"] / "memory.db"), first)
    original = read_export(first)
    assert counts(original) == {"memory": 7, "episode": 1, "profile": 2, "entity": 2, "mention": 2, "relation": 1}
    assert any(m["locked"] == 1 for m in original["memory"])
    assert any(m["recall_count"] >= 1 and m["last_recalled_at"] for m in original["memory"])

    # The reference refuses rows whose agent_id is '' (spec README decision 7: we keep them);
    # it must say so line by line, and everything else must survive.
    ref_import = await import_into(reference(legs["ref"] / "x.db"), first)
    assert ref_import["ok"] is True, ref_import
    empty_agent_rows = [m for m in original["memory"] if m["agent_id"] == ""]
    assert len(empty_agent_rows) == 2
    missing = [e for e in ref_import.get("errors", []) if "missing agent_id" in e]
    assert len(missing) == len(empty_agent_rows), ref_import
    assert ref_import["imported_memories"] == 5 and ref_import["imported_episodes"] == 1, ref_import
    assert ref_import["profile_updated"] is True
    assert ref_import.get("associations") == {"entities": 2, "mentions": 2, "relations": 1}, ref_import

    second = tmp_path / "ref.jsonl"
    await export_all(reference(legs["ref"] / "x.db"), second)
    via_reference = read_export(second)
    assert via_reference == without_agent(original, "")

    back = await import_into(ours(legs["ours2"] / "memory.db"), second)
    assert back["ok"] is True and not back.get("errors"), back
    third = tmp_path / "ours2.jsonl"
    await export_all(ours(legs["ours2"] / "memory.db"), third)
    assert read_export(third) == via_reference


async def test_ours_to_ours_keeps_the_empty_agent_rows(tmp_path):  # spec README decision 7, IM-4, IM-15
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    async with Client(ours(src / "memory.db")) as client:
        await fill(client)
    first = tmp_path / "first.jsonl"
    await export_all(ours(src / "memory.db"), first)
    original = read_export(first)
    assert sum(1 for m in original["memory"] if m["agent_id"] == "") == 2

    imported = await import_into(ours(dst / "memory.db"), first)
    assert imported["ok"] is True and not imported.get("errors"), imported
    assert imported["imported_memories"] == 7 and imported["imported_episodes"] == 1
    second = tmp_path / "second.jsonl"
    await export_all(ours(dst / "memory.db"), second)
    assert read_export(second) == original

    again = await import_into(ours(dst / "memory.db"), first)  # spec IM-15: a second import is all skips
    assert again["imported_memories"] == 0 and again["imported_episodes"] == 0, again


@needs_reference
async def test_reference_export_into_ours_keeps_every_row(tmp_path):  # spec IM-6, IM-7, IM-8, IM-9
    ref_dir, our_dir = tmp_path / "ref", tmp_path / "ours"
    ref_dir.mkdir()
    our_dir.mkdir()
    async with Client(reference(ref_dir / "x.db")) as client:
        await fill(client)
    first = tmp_path / "ref.jsonl"
    await export_all(reference(ref_dir / "x.db"), first)
    original = read_export(first)
    assert counts(original) == {"memory": 7, "episode": 1, "profile": 2, "entity": 2, "mention": 2, "relation": 1}

    imported = await import_into(ours(our_dir / "memory.db"), first)
    assert imported["ok"] is True and not imported.get("errors"), imported
    assert imported["imported_memories"] == 7 and imported["imported_episodes"] == 1
    second = tmp_path / "ours.jsonl"
    await export_all(ours(our_dir / "memory.db"), second)
    assert read_export(second) == original


@needs_reference
async def test_the_reference_writes_a_file_we_migrated(tmp_path):
    # Compatibility both ways: our newest revision stores nothing in the file that needs our
    # extensions (the coarse index's triggers are TEMP, storage/coarse_sqlite.py), so CPersona
    # 2.6.14, which does not load sqlite-vec, still stores and archives into it.
    from cpersona.storage.engine import open_sqlite
    from cpersona.storage.migrate import upgrade

    db_file = tmp_path / "ours.db"
    db = open_sqlite(db_file)
    try:
        upgrade(db)
    finally:
        db.close()
    async with Client(reference(db_file)) as client:
        assert (await call(client, "store", {"agent_id": "a", "content": "stored by the reference"}))["ok"] is True
        assert (await call(client, "archive_episode", {"agent_id": "a", "summary": "by the reference"}))["ok"] is True
    async with Client(ours(db_file)) as client:
        hits = await call(client, "recall", {"agent_id": "a", "query": "stored by the reference"})
    assert "stored by the reference" in json.dumps(hits)
