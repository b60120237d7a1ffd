"""Editing and removing records: update_memory, lock/unlock, delete_memory, delete_episode, delete_agent_data.

Every call goes through the facade's real call path (schema validation, pause
gate, service in a worker thread) on a real SQLite file; effects are checked
in the database and through recall, so the full-text index is covered too.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import pytest
from conftest import make_app
from embed_server import EmbedServer, embed_text  # noqa: F401
from sqlalchemy import text

from cpersona.config import load_settings
from cpersona.embedding.client import build_embedder
from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.pause_gate import PauseGate
from cpersona.mcp.tools import default_registry
from cpersona.services.records import admin
from cpersona.services.app import App
from cpersona.services.recall.retrievers import vector_threshold

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

REGISTRY = default_registry()
GATES = GateChain([PauseGate()])


async def call(app: App, name: str, **arguments: Any) -> dict[str, Any]:
    outcome = await call_tool(app, REGISTRY, GATES, name, arguments)
    assert outcome.is_error is False, outcome.payload
    return outcome.payload


async def remember(app: App, content: str, agent: str = "a", **extra: Any) -> int:
    stored = await call(app, "store", agent_id=agent, content=content, **extra)
    assert stored["result"] == "stored", stored
    return stored["id"]


async def recalled(app: App, query: str, agent: str = "a") -> list[str]:
    return [m["content"] for m in (await call(app, "recall", agent_id=agent, query=query))["messages"]]


def row(app: App, memory_id: int) -> dict[str, Any] | None:
    with app.db.read() as session:
        found = session.execute(text("SELECT * FROM memories WHERE id = :i"), {"i": memory_id}).mappings().first()
        return dict(found) if found else None


# PostgreSQL has no separate full-text table: its trigram indexes cover the rows
# themselves, so there the lexical index holds whatever rows still hold the phrase.
_INDEXED_TEXT = {"memories_fts": ("memories", "content"), "episodes_fts": ("episodes", "summary || ' ' || keywords")}


def fts_hits(app: App, table: str, phrase: str) -> list[int]:
    with app.db.read() as session:
        if not app.db.is_sqlite:
            base, indexed = _INDEXED_TEXT[table]
            return [
                r[0]
                for r in session.execute(
                    text(f"SELECT id FROM {base} WHERE strpos({indexed}, :q) > 0 ORDER BY id"), {"q": phrase}
                )
            ]
        return [
            r[0]
            for r in session.execute(text(f"SELECT rowid FROM {table} WHERE {table} MATCH :q"), {"q": f'"{phrase}"'})
        ]


def ambiguous(memory_id: int) -> dict[str, Any]:
    return {"ok": False, "error": f"Memory {memory_id} not found, not owned by agent, or locked"}


# -- delete_memory (§2) ------------------------------------------------------------------------------


async def test_delete_removes_the_row_and_its_full_text_entry(app):  # spec DM-1, DB-3
    keep = await remember(app, "the kitchen tap drips on Sundays")
    gone = await remember(app, "the garden hose is in the blue shed")
    assert "the garden hose is in the blue shed" in await recalled(app, "garden hose")
    assert fts_hits(app, "memories_fts", "garden hose") == [gone]

    assert await call(app, "delete_memory", memory_id=gone, agent_id="a") == {"ok": True, "deleted_id": gone}

    assert row(app, gone) is None and row(app, keep) is not None
    assert fts_hits(app, "memories_fts", "garden hose") == []
    assert await recalled(app, "garden hose") == []
    assert await recalled(app, "kitchen tap") == ["the kitchen tap drips on Sundays"]


async def test_delete_takes_the_declarations_that_hang_on_the_memory(app):  # spec DM-1, LR-2
    target = await remember(app, "Miso is the cat")
    with app.db.write() as session:
        session.execute(
            text(
                "INSERT INTO entities (agent_id, name, normalized, declared_by, created_at) "
                "VALUES ('a', 'Miso', 'miso', 'agent', 'now')"
            )
        )
        session.execute(
            text(
                "INSERT INTO entity_mentions (entity_id, ref, declared_by, created_at) VALUES (1, :r, 'agent', 'now')"
            ),
            {"r": f"mem:{target}"},
        )
    await call(app, "delete_memory", memory_id=target)
    with app.db.read() as session:
        assert session.execute(text("SELECT count(*) FROM entity_mentions")).scalar_one() == 0
        assert session.execute(text("SELECT count(*) FROM entities")).scalar_one() == 1  # LR-3: entity stays


async def test_deleting_again_is_a_refusal_not_a_success(app):  # spec DM-3
    memory_id = await remember(app, "short lived")
    await call(app, "delete_memory", memory_id=memory_id)
    assert await call(app, "delete_memory", memory_id=memory_id) == {
        "ok": False,
        "error": f"Memory {memory_id} not found",
    }
    assert await call(app, "delete_memory", memory_id=memory_id, agent_id="a") == ambiguous(memory_id)


async def test_scoped_failures_share_one_message_so_nothing_leaks(app):  # spec OWN-1, LK-2
    mine = await remember(app, "owned by a")
    locked = await remember(app, "owned by a and locked")
    await call(app, "lock_memory", memory_id=locked)
    for tool in ("delete_memory", "update_memory"):
        extra = {"content": "new text"} if tool == "update_memory" else {}
        foreign = await call(app, tool, memory_id=mine, agent_id="b", **extra)
        absent = await call(app, tool, memory_id=9999, agent_id="b", **extra)
        lock = await call(app, tool, memory_id=locked, agent_id="a", **extra)
        assert foreign == ambiguous(mine) and absent == ambiguous(9999) and lock == ambiguous(locked)
    for tool in ("lock_memory", "unlock_memory"):
        assert await call(app, tool, memory_id=mine, agent_id="b") == ambiguous(mine)
        assert await call(app, tool, memory_id=9999, agent_id="a") == ambiguous(9999)
    assert row(app, mine)["content"] == "owned by a" and row(app, mine)["locked"] == 0
    assert row(app, locked)["locked"] == 1


async def test_unscoped_calls_answer_specifically_and_are_logged(app, caplog):  # spec OWN-2
    caplog.set_level(logging.WARNING, logger="cpersona.services.records.admin")
    memory_id = await remember(app, "anyone may touch this")
    await call(app, "lock_memory", memory_id=memory_id)
    assert await call(app, "delete_memory", memory_id=memory_id) == {
        "ok": False,
        "error": f"Memory {memory_id} is locked and cannot be deleted",
    }
    assert await call(app, "update_memory", memory_id=memory_id, content="x") == {
        "ok": False,
        "error": f"Memory {memory_id} is locked and cannot be edited",
    }
    assert await call(app, "unlock_memory", memory_id=9999) == {"ok": False, "error": "Memory 9999 not found"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"delete_memory memory {memory_id} running UNSCOPED: no agent_id, so no ownership check" in warnings
    assert any(w.startswith("unlock_memory memory 9999 running UNSCOPED") for w in warnings)


async def test_the_empty_agent_is_unscoped_and_scoped_agents_do_not_widen(app):  # spec AX-2, OWN-2
    empty_agents = await remember(app, "a row of the empty agent", agent="")
    assert await call(app, "delete_memory", memory_id=empty_agents, agent_id="b") == ambiguous(empty_agents)
    assert await call(app, "delete_memory", memory_id=empty_agents, agent_id="") == {
        "ok": True,
        "deleted_id": empty_agents,
    }


async def test_ids_outside_64_bits_or_negative_are_not_found(app):  # spec OWN-3, DE-1
    assert await call(app, "delete_memory", memory_id=-1) == {"ok": False, "error": "Memory -1 not found"}
    assert await call(app, "delete_episode", episode_id=-3) == {
        "ok": False,
        "error": "Episode -3 not found or not owned by agent",
    }
    # The facade refuses integers wider than 64 bits before any service; a library caller gets "not found".
    huge = 2**63
    outcome = await call_tool(app, REGISTRY, GATES, "delete_memory", {"memory_id": huge})
    assert outcome.is_error and "wider than 64 bits" in outcome.payload["error"]
    assert admin.delete_memory(app, memory_id=huge) == {"ok": False, "error": f"Memory {huge} not found"}
    assert admin.update_memory(app, memory_id=huge, content="x", agent_id="a") == ambiguous(huge)
    assert admin.lock_memory(app, memory_id=-(2**63) - 1) == {"ok": False, "error": f"Memory {-(2**63) - 1} not found"}
    assert admin.delete_episode(app, episode_id=huge) == {
        "ok": False,
        "error": f"Episode {huge} not found or not owned by agent",
    }


async def test_the_mutating_statement_repeats_its_guards(app, monkeypatch):  # spec OWN-4
    """With the pre-check bypassed (as if the row changed after it), the statement itself refuses."""
    locked = await remember(app, "locked after the check")
    foreign = await remember(app, "owned by someone else", agent="b")
    await call(app, "lock_memory", memory_id=locked)
    monkeypatch.setattr(
        admin, "_checked_memory", lambda session, memory_id, owner, **kw: admin._memory_row(session, memory_id)
    )

    assert await call(app, "delete_memory", memory_id=locked) == {
        "ok": False,
        "error": f"Memory {locked} is locked and cannot be deleted",
    }
    assert await call(app, "update_memory", memory_id=locked, content="overwritten") == {
        "ok": False,
        "error": f"Memory {locked} is locked and cannot be edited",
    }
    assert await call(app, "delete_memory", memory_id=foreign, agent_id="a") == ambiguous(foreign)
    assert await call(app, "lock_memory", memory_id=foreign, agent_id="a") == ambiguous(foreign)
    assert row(app, locked)["content"] == "locked after the check"
    assert row(app, foreign) is not None and row(app, foreign)["locked"] == 0


async def test_library_callers_get_type_refusals_not_a_wider_scope(app):
    memory_id = await remember(app, "typed")
    assert admin.delete_memory(app, memory_id=memory_id, agent_id=7) == {
        "ok": False,
        "error": "agent_id must be a string",
    }
    assert admin.delete_memory(app, memory_id="1") == {"ok": False, "error": "memory_id must be an integer"}
    assert admin.delete_memory(app, memory_id=True) == {"ok": False, "error": "memory_id must be an integer"}
    assert admin.delete_episode(app, episode_id=None) == {"ok": False, "error": "episode_id must be an integer"}
    assert row(app, memory_id) is not None


# -- delete_episode (§3) ------------------------------------------------------------------------------


async def test_delete_episode_scoped_and_unscoped(app):  # spec DE-1, DE-2
    first = (
        await call(app, "archive_episode", agent_id="a", summary="we planned the orchard", keywords="orchard apples")
    )["episode_id"]
    second = (await call(app, "archive_episode", agent_id="a", summary="we fixed the fence"))["episode_id"]
    assert fts_hits(app, "episodes_fts", "orchard") == [first]

    not_owned = {"ok": False, "error": f"Episode {first} not found or not owned by agent"}
    assert await call(app, "delete_episode", episode_id=first, agent_id="b") == not_owned
    assert await call(app, "delete_episode", episode_id=first, agent_id="a") == {"ok": True, "deleted_id": first}
    assert await call(app, "delete_episode", episode_id=first) == not_owned  # unscoped: the same words
    assert await call(app, "delete_episode", episode_id=second) == {"ok": True, "deleted_id": second}

    assert fts_hits(app, "episodes_fts", "orchard") == [] and fts_hits(app, "episodes_fts", "fence") == []
    assert "we planned the orchard" not in await recalled(app, "orchard")
    assert (await call(app, "list_episodes", agent_id="a"))["count"] == 0


# -- lock / unlock (§4) -------------------------------------------------------------------------------


async def test_lock_is_idempotent_and_protects_against_edit_and_delete(app):  # spec LK-1, LK-3, UM-3, DM-2
    memory_id = await remember(app, "a rule that must not change")
    for _ in range(2):
        assert await call(app, "lock_memory", memory_id=memory_id, agent_id="a") == {"ok": True, "locked_id": memory_id}
    assert row(app, memory_id)["locked"] == 1
    assert (await call(app, "update_memory", memory_id=memory_id, content="changed"))["ok"] is False
    assert (await call(app, "delete_memory", memory_id=memory_id))["ok"] is False
    assert row(app, memory_id)["content"] == "a rule that must not change"
    assert (await call(app, "list_memories", agent_id="a"))["memories"][0]["locked"] is True

    for _ in range(2):
        assert await call(app, "unlock_memory", memory_id=memory_id, agent_id="a") == {
            "ok": True,
            "unlocked_id": memory_id,
        }
    assert await call(app, "update_memory", memory_id=memory_id, content="now it may change") == {
        "ok": True,
        "updated_id": memory_id,
    }
    assert await call(app, "delete_memory", memory_id=memory_id) == {"ok": True, "deleted_id": memory_id}


async def test_lock_does_not_change_ranking(app):  # spec LK-3
    plain = await remember(app, "the spare key hides under the flower pot")
    await remember(app, "the spare tyre is in the boot")
    before = await recalled(app, "spare key")
    await call(app, "lock_memory", memory_id=plain)
    assert await recalled(app, "spare key") == before


# -- update_memory (memory-and-recall §3.6) ---------------------------------------------------------


async def test_update_replaces_the_text_and_the_index_follows(app):  # spec UM-6, DB-3
    memory_id = await remember(app, "the meeting is on Tuesday", id="msg-7", timestamp="2026-01-02T03:04:05+00:00")
    before = row(app, memory_id)
    assert await call(
        app, "update_memory", memory_id=memory_id, content="the meeting moved to Thursday", agent_id="a"
    ) == {"ok": True, "updated_id": memory_id}
    after = row(app, memory_id)
    assert after["content"] == "the meeting moved to Thursday"
    for unchanged in ("timestamp", "msg_id", "source", "recall_count", "created_at", "project_id", "channel"):
        assert after[unchanged] == before[unchanged], unchanged
    assert await recalled(app, "Tuesday") == []
    assert await recalled(app, "Thursday") == ["the meeting moved to Thursday"]


async def test_update_checks_in_the_references_order(app):  # spec UM-1, UM-2, UM-4
    memory_id = await remember(app, "something")
    for empty in ("", "   \n"):
        assert await call(app, "update_memory", memory_id=9999, content=empty) == {
            "ok": False,
            "error": "Content cannot be empty",
        }  # before the row is looked up
    assert await call(app, "update_memory", memory_id=9999, content="[Memory from x] ") == {
        "ok": False,
        "error": "Memory 9999 not found",
    }  # the row before the sanitizer's verdict
    assert await call(app, "update_memory", memory_id=memory_id, content="[Memory from x] ") == {
        "ok": False,
        "error": "Content cannot be empty after sanitization",
    }
    assert row(app, memory_id)["content"] == "something"


async def test_update_sanitizes_and_reports_truncation(db):  # spec UM-4, ST-3
    app = make_app(db, max_content_length="10")
    memory_id = await remember(app, "short")
    assert await call(app, "update_memory", memory_id=memory_id, content="[Memory from bot] 0123456789abc") == {
        "ok": True,
        "updated_id": memory_id,
        "truncated": True,
    }
    assert row(app, memory_id)["content"] == "0123456789"
    assert await call(app, "update_memory", memory_id=memory_id, content="  [Memory from q] fits  ") == {
        "ok": True,
        "updated_id": memory_id,
    }
    assert row(app, memory_id)["content"] == "fits"


async def test_update_refuses_a_text_another_row_of_the_bucket_holds(app):  # spec UM-5
    first = await remember(app, "alpha")
    holder = await remember(app, "beta")
    other_channel = await remember(app, "gamma", channel="c1")
    other_agent = await remember(app, "delta", agent="b")

    assert await call(app, "update_memory", memory_id=first, content="beta") == {
        "ok": False,
        "error": (
            f"Memory {first} was not edited: memory {holder} in the same agent, project and channel already holds "
            "this content, and one copy is kept per bucket"
        ),
    }
    assert row(app, first)["content"] == "alpha"
    # Other buckets do not count, and a row may be given its own text again.
    assert (await call(app, "update_memory", memory_id=first, content="gamma"))["ok"] is True
    assert (await call(app, "update_memory", memory_id=first, content="delta"))["ok"] is True
    assert (await call(app, "update_memory", memory_id=first, content="delta"))["ok"] is True
    assert row(app, other_channel)["content"] == "gamma" and row(app, other_agent)["content"] == "delta"


async def test_update_re_embeds_and_clears_the_vector_when_embedding_fails(db, embed_server):  # spec UM-6
    settings = load_settings(
        {
            "CPERSONA_DB_PATH": str(db.path),
            "CPERSONA_EMBEDDING_MODE": "http",
            "CPERSONA_EMBEDDING_URL": embed_server.url,
        }
    )
    app = App(db=db, settings=settings, embedder=build_embedder(settings))
    try:
        memory_id = await remember(app, "first wording of the note")
        old_vector = row(app, memory_id)["embedding"]
        assert old_vector == np.asarray(embed_text("first wording of the note"), dtype="<f4").tobytes()

        await call(app, "update_memory", memory_id=memory_id, content="second wording of the note")
        assert (
            row(app, memory_id)["embedding"]
            == np.asarray(embed_text("second wording of the note"), dtype="<f4").tobytes()
        )

        embed_server.status = 500  # the backend fails: the old vector must not survive the edit
        assert (await call(app, "update_memory", memory_id=memory_id, content="third wording"))["ok"] is True
        assert row(app, memory_id)["embedding"] is None and row(app, memory_id)["content"] == "third wording"
    finally:
        app.embedder.close()


async def test_a_refused_update_costs_no_embedding_request(db, embed_server):  # spec UM-2, PG-4
    settings = load_settings(
        {
            "CPERSONA_DB_PATH": str(db.path),
            "CPERSONA_EMBEDDING_MODE": "http",
            "CPERSONA_EMBEDDING_URL": embed_server.url,
        }
    )
    app = App(db=db, settings=settings, embedder=build_embedder(settings))
    try:
        memory_id = await remember(app, "locked text")
        await call(app, "lock_memory", memory_id=memory_id)
        asked = len(embed_server.embed_requests())
        await call(app, "update_memory", memory_id=memory_id, content="new")
        await call(app, "update_memory", memory_id=memory_id, content="new", agent_id="b")
        assert len(embed_server.embed_requests()) == asked
    finally:
        app.embedder.close()


# -- delete_agent_data (§5) ---------------------------------------------------------------------------


async def test_delete_agent_data_removes_everything_the_agent_owns(app):  # spec DAD-1, DAD-4, LK-3
    for content in ("one", "two", "three"):
        await remember(app, content)
    locked = await remember(app, "locked but still the agent's")
    await call(app, "lock_memory", memory_id=locked)
    await call(app, "archive_episode", agent_id="a", summary="an episode of a")
    await call(app, "update_profile", agent_id="a", profile="a's profile")
    survivor = await remember(app, "b keeps this", agent="b")
    await call(app, "archive_episode", agent_id="b", summary="an episode of b")
    with app.db.write() as session:
        session.execute(
            text(
                "INSERT INTO pending_memory_tasks (task_type, agent_id, payload) "
                "VALUES ('update_profile', 'a', '\"x\"'), ('update_profile', 'b', '\"y\"')"
            )
        )
        session.execute(
            text(
                "INSERT INTO entities (agent_id, name, normalized, declared_by, created_at) "
                "VALUES ('a', 'Miso', 'miso', 'agent', 'now'), ('b', 'Rex', 'rex', 'agent', 'now')"
            )
        )
        session.execute(
            text("INSERT INTO entity_aliases (entity_id, alias, normalized) VALUES (1, 'the cat', 'the cat')")
        )
        session.execute(
            text(
                "INSERT INTO relations (agent_id, subject_kind, subject_id, predicate, object_kind, object_id, "
                "declared_by, declared_at) VALUES ('a', 'entity', 1, 'likes', 'entity', 1, 'agent', 'now')"
            )
        )

    assert await call(app, "delete_agent_data", agent_id="a") == {
        "ok": True,
        "agent_id": "a",
        "deleted_memories": 4,
        "deleted_profiles": 1,
        "deleted_episodes": 1,
        "deleted_pending_tasks": 1,
    }

    with app.db.read() as session:

        def count(sql: str) -> int:
            return session.execute(text(sql)).scalar_one()

        assert count("SELECT count(*) FROM memories WHERE agent_id = 'a'") == 0
        assert count("SELECT count(*) FROM episodes WHERE agent_id = 'a'") == 0
        assert count("SELECT count(*) FROM profiles WHERE agent_id = 'a'") == 0
        assert count("SELECT count(*) FROM pending_memory_tasks") == 1
        assert count("SELECT count(*) FROM entities") == 1 and count("SELECT count(*) FROM entity_aliases") == 0
        assert count("SELECT count(*) FROM relations") == 0
    assert fts_hits(app, "memories_fts", "three") == []
    assert row(app, survivor) is not None
    # b's rows are all still found: its memory first, then its episode (the word channel
    # matches the one-letter word "b" in "an episode of b").
    assert await recalled(app, "b keeps", agent="b") == ["b keeps this", "[Episode] an episode of b"]

    # DAD-4: an agent with nothing left is not an error.
    assert await call(app, "delete_agent_data", agent_id="a") == {
        "ok": True,
        "agent_id": "a",
        "deleted_memories": 0,
        "deleted_profiles": 0,
        "deleted_episodes": 0,
        "deleted_pending_tasks": 0,
    }


async def test_delete_agent_data_refuses_the_empty_agent(app):  # spec DAD-5, §1.2
    kept = await remember(app, "the empty agent's row", agent="")
    assert await call(app, "delete_agent_data", agent_id="") == {
        "ok": False,
        "error": "agent_id is required for bulk deletion",
    }
    assert row(app, kept) is not None
    outcome = await call_tool(app, REGISTRY, GATES, "delete_agent_data", {})
    assert outcome.is_error and "'agent_id' is a required property" in outcome.payload["error"]


async def test_delete_agent_data_forgets_the_agents_calibration(app):  # spec DAD-2
    state = app.calibration
    state.apply({("agent_thresholds", "a"): 0.41, ("agent_thresholds", "b"): 0.52, ("agent_betas", "a"): 2.0})
    assert state.persist(app.settings).ok
    assert vector_threshold(app, "a") == 0.41
    await remember(app, "x")
    await call(app, "delete_agent_data", agent_id="a")
    assert vector_threshold(app, "a") == app.settings.vector_min_similarity and state.beta_override("a") is None
    assert vector_threshold(app, "b") == 0.52
    on_disk = json.loads(app.settings.calibration_sidecar.read_text())
    assert on_disk["agent_thresholds"] == {"b": 0.52} and "a" not in on_disk.get("agent_betas", {})


# -- declarations ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "facts"),
    [
        ("delete_memory", ["one memory", "ownership is enforced", "agent_id"]),
        ("delete_episode", ["one episode", "ownership is enforced", "agent_id"]),
        (
            "lock_memory",
            [
                "delete_memory and update_memory refuse",
                "migrate_channel_axis",
                "move mode",
                "stays locked",
                "delete_agent_data still removes it",
                "ownership is enforced",
            ],
        ),
        ("unlock_memory", ["delete_memory and update_memory may change it again", "ownership is enforced"]),
        ("delete_agent_data", ["memories", "profile", "episodes"]),
        (
            "update_memory",
            [
                "locked memory is refused",
                "ownership is enforced",
                "'[Memory from ...]'",
                "truncated:true",
                "same agent, project and channel",
                "ok:false naming that memory",
                "nodes:{status:'queued'}",
            ],
        ),
    ],
)
def test_descriptions_carry_the_required_facts(tool, facts):  # spec §14
    description = REGISTRY.get(tool).description
    for fact in facts:
        assert fact in description, f"{tool}: {fact!r}"
