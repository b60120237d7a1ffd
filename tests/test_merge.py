"""merge_memories over real SQLite files (spec admin-and-safety §8)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from sqlalchemy import text

from cpersona.services.app import App
from cpersona.services.portability import merge_memories, paused_merge_body, validate_merge
from cpersona.services.responses import ToolFailure
from cpersona.storage.engine import Database
from cpersona.storage.models import Episode, Memory, PendingMemoryTask, Profile
from conftest import refuse_inserts
from test_import_db import STAMP, add_graph_tables_to

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

VEC = struct.pack("<2f", 1.0, -2.0)
MEMORY_COLUMNS = (
    "project_id, channel, msg_id, content, source, timestamp, metadata, embedding, "
    "recall_count, last_recalled_at, locked, created_at"
)


def add(db: Database, model: type, **values: Any) -> int:
    with db.write() as session:
        row = model(**values)
        session.add(row)
        session.flush()
        return row.id


def add_memory(db: Database, agent: str, content: str, **values: Any) -> int:
    return add(db, Memory, agent_id=agent, content=content, timestamp="2026-01-01T00:00:00+00:00", **values)


def q(db: Database, sql: str, **params: Any) -> list[tuple]:
    with db.read() as session:
        return [tuple(r) for r in session.execute(text(sql), params)]


def n(db: Database, table: str, agent: str) -> int:
    return q(db, f"SELECT count(*) FROM {table} WHERE agent_id = :a", a=agent)[0][0]


@pytest.fixture
def alice(db: Database) -> dict[str, int]:
    """alice: four memories (one locked with a vector), one episode, one profile, one task."""
    ids = {
        "m1": add_memory(
            db,
            "alice",
            "Alice's cat is Miso.",
            project_id="home",
            msg_id="msg-1",
            source='{"type": "User", "id": "u1"}',
            metadata_='{"k": 1}',
            locked=1,
            recall_count=4,
            last_recalled_at="2026-02-02 02:02:02",
            created_at="2025-01-01 00:00:00",
            embedding=VEC,
        ),
        "m2": add_memory(db, "alice", "Deploys freeze on Friday.", channel="ops"),
        "m3": add_memory(db, "alice", "Shared with dave already.", project_id="home"),
        "m4": add_memory(db, "alice", "Same msg id as dave's.", project_id="work", msg_id="dup-id"),
        "e1": add(
            db,
            Episode,
            agent_id="alice",
            summary="Talked about Miso.",
            keywords="cat",
            start_time="2026-01-01",
            end_time="2026-01-02",
            resolved=1,
            created_at="2025-01-03 00:00:00",
            embedding=VEC,
        ),
        "p1": add(db, Profile, agent_id="alice", content="Likes cats.", updated_at="2025-01-04 00:00:00"),
    }
    add(db, PendingMemoryTask, task_type="archive_episode", agent_id="alice", payload="{}")
    return ids


def test_copy_preserves_rows_and_skips_what_the_target_holds(app: App, db: Database, alice: dict[str, int]) -> None:
    # spec MG-3/MG-4: copy under the target preserving every column; skip
    # (project, msg_id) and (project, channel, content) hits in the target.
    add_memory(db, "dave", "Shared with dave already.", project_id="home")
    add_memory(db, "dave", "dave's own words", project_id="work", msg_id="dup-id")
    add_memory(db, "dave", "Deploys freeze on Friday.", channel="")  # another channel: not a duplicate
    answer = merge_memories(app, source_agent_id="alice", target_agent_id="dave")
    assert answer == {
        "ok": True,
        "dry_run": False,
        "source_agent_id": "alice",
        "target_agent_id": "dave",
        "strategy": "skip",
        "mode": "copy",
        "merged_memories": 2,
        "skipped_memories": 2,
        "merged_episodes": 1,
        "skipped_episodes": 0,
        "profile_copied": True,
        "skipped_profile": False,
    }
    copied = q(
        db, f"SELECT {MEMORY_COLUMNS} FROM memories WHERE agent_id = 'dave' AND content = :c", c="Alice's cat is Miso."
    )
    original = q(db, f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = :i", i=alice["m1"])
    assert copied == original
    assert q(
        db, "SELECT channel FROM memories WHERE agent_id = 'dave' AND content LIKE 'Deploys%' ORDER BY channel"
    ) == [("",), ("ops",)]
    assert q(
        db,
        "SELECT summary, keywords, start_time, end_time, resolved, created_at, embedding FROM episodes WHERE agent_id = 'dave'",
    ) == [("Talked about Miso.", "cat", "2026-01-01", "2026-01-02", 1, "2025-01-03 00:00:00", VEC)]
    assert q(db, "SELECT content, updated_at FROM profiles WHERE agent_id = 'dave'") == [
        ("Likes cats.", "2025-01-04 00:00:00")
    ]
    # copy leaves the source alone
    assert (n(db, "memories", "alice"), n(db, "episodes", "alice"), n(db, "profiles", "alice")) == (4, 1, 1)


def test_copy_twice_merges_nothing_the_second_time(app: App, db: Database, alice: dict[str, int]) -> None:
    # spec MG-10
    merge_memories(app, source_agent_id="alice", target_agent_id="dave")
    again = merge_memories(app, source_agent_id="alice", target_agent_id="dave")
    assert (again["merged_memories"], again["skipped_memories"]) == (0, 4)
    assert (again["merged_episodes"], again["skipped_episodes"]) == (0, 1)
    assert (again["profile_copied"], again["skipped_profile"]) == (False, True)
    assert n(db, "memories", "dave") == 4


def test_move_deletes_exactly_the_copied_rows(app: App, db: Database, alice: dict[str, int]) -> None:
    # spec MG-5 / MG-7: skipped rows and a kept profile stay at the source; the
    # queue is only cleared when nothing remains.
    add_memory(db, "dave", "Shared with dave already.", project_id="home")
    add(db, Profile, agent_id="dave", content="dave's own profile")
    answer = merge_memories(app, source_agent_id="alice", target_agent_id="dave", mode="move")
    assert (answer["merged_memories"], answer["skipped_memories"]) == (3, 1)
    assert (answer["profile_copied"], answer["skipped_profile"]) == (False, True)
    assert answer["source_deleted"] == {
        "ok": True,
        "agent_id": "alice",
        "deleted_memories": 3,
        "deleted_profiles": 0,
        "deleted_episodes": 1,
        "deleted_pending_tasks": 0,
    }
    assert answer["left_at_source"] == {"memories": 1, "episodes": 0, "profiles": 1}
    assert q(db, "SELECT id FROM memories WHERE agent_id = 'alice'") == [(alice["m3"],)]
    assert n(db, "pending_memory_tasks", "alice") == 1
    assert q(db, "SELECT content FROM profiles WHERE agent_id = 'dave'") == [("dave's own profile",)]
    # locked rows move too: the copy keeps the lock
    assert q(db, "SELECT locked FROM memories WHERE agent_id = 'dave' AND msg_id = 'msg-1'") == [(1,)]


def test_move_of_everything_empties_the_source(app: App, db: Database, alice: dict[str, int]) -> None:
    answer = merge_memories(app, source_agent_id="alice", target_agent_id="erin", mode="move")
    assert answer["source_deleted"] == {
        "ok": True,
        "agent_id": "alice",
        "deleted_memories": 4,
        "deleted_profiles": 1,
        "deleted_episodes": 1,
        "deleted_pending_tasks": 1,
    }
    assert answer["left_at_source"] == {"memories": 0, "episodes": 0, "profiles": 0}
    assert sum(n(db, t, "alice") for t in ("memories", "episodes", "profiles", "pending_memory_tasks")) == 0
    assert (n(db, "memories", "erin"), n(db, "episodes", "erin"), n(db, "profiles", "erin")) == (4, 1, 1)
    # a second move finds nothing and still answers the move shape
    again = merge_memories(app, source_agent_id="alice", target_agent_id="erin", mode="move")
    assert again["merged_memories"] == again["skipped_memories"] == 0
    assert again["source_deleted"]["deleted_memories"] == 0


def test_dry_run_writes_nothing_and_counts_like_a_real_run(app: App, db: Database, alice: dict[str, int]) -> None:
    # spec MG-2: a dry run writes nothing and its counts equal a real run's
    add_memory(db, "dave", "Shared with dave already.", project_id="home")
    snapshot = (
        q(db, "SELECT * FROM memories ORDER BY id"),
        q(db, "SELECT * FROM episodes"),
        q(db, "SELECT * FROM profiles"),
    )
    dry = merge_memories(app, source_agent_id="alice", target_agent_id="dave", mode="move", dry_run=True)
    assert (
        q(db, "SELECT * FROM memories ORDER BY id"),
        q(db, "SELECT * FROM episodes"),
        q(db, "SELECT * FROM profiles"),
    ) == snapshot
    assert "source_deleted" not in dry
    real = merge_memories(app, source_agent_id="alice", target_agent_id="dave", mode="move")
    counts = (
        "merged_memories",
        "skipped_memories",
        "merged_episodes",
        "skipped_episodes",
        "profile_copied",
        "skipped_profile",
    )
    assert {k: dry[k] for k in counts} == {k: real[k] for k in counts}
    assert dry["dry_run"] is True and real["dry_run"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"source_agent_id": "", "target_agent_id": "b"}, "source_agent_id is required"),
        ({"source_agent_id": "a", "target_agent_id": ""}, "target_agent_id is required"),
        ({"source_agent_id": "a", "target_agent_id": "a"}, "source_agent_id and target_agent_id must differ"),
        (
            {"source_agent_id": "a", "target_agent_id": "b", "strategy": "overwrite"},
            "Unsupported strategy 'overwrite'. Currently supported: 'skip'",
        ),
        (
            {"source_agent_id": "a", "target_agent_id": "b", "mode": "swap"},
            "Invalid mode 'swap'. Supported: 'copy', 'move'",
        ),
        ({"source_agent_id": "", "target_agent_id": "", "mode": "swap"}, "source_agent_id is required"),
    ],
)
def test_argument_validation(app: App, db: Database, args: dict[str, str], message: str) -> None:
    # spec MG-1, first failure wins; validate_merge is what the facade runs before its gate
    assert merge_memories(app, **args) == {"ok": False, "error": message}
    with pytest.raises(ToolFailure, match="^" + message.replace("(", r"\(").replace(".", r"\.") + "$"):
        validate_merge(
            args["source_agent_id"], args["target_agent_id"], args.get("strategy", "skip"), args.get("mode", "copy")
        )


def test_failure_rolls_the_whole_merge_back(app: App, db: Database, alice: dict[str, int]) -> None:
    # spec MG-9: an error after some rows were written leaves nothing behind
    refuse_inserts(db, "episodes", "episode write refused", when=("agent_id", "dave"))
    answer = merge_memories(app, source_agent_id="alice", target_agent_id="dave", mode="move")
    assert answer == {
        "ok": False,
        "error": "merge aborted and rolled back: episode write refused",
        "dry_run": False,
        "source_agent_id": "alice",
        "target_agent_id": "dave",
        "merged_memories": 0,
        "skipped_memories": 0,
        "merged_episodes": 0,
        "skipped_episodes": 0,
        "profile_copied": False,
        "skipped_profile": False,
    }
    assert n(db, "memories", "dave") == 0
    assert n(db, "memories", "alice") == 4


def test_graph_is_carried_and_repointed(app: App, db: Database, alice: dict[str, int]) -> None:
    # spec MG-6 / CA-2: declarations follow the records to the target; a move
    # that empties the source removes the source's declarations.
    add_graph_tables_to(db)
    with db.write() as session:
        run = lambda sql, **p: session.execute(text(sql), p)  # noqa: E731
        # ids from the sequence (1, then 2): an explicit id would not advance PostgreSQL's
        run(
            "INSERT INTO entities (agent_id, name, normalized, declared_by, created_at) "
            "VALUES ('alice', 'Miso', 'miso', 'agent', :s)",
            s=STAMP,
        )
        run("INSERT INTO entity_aliases VALUES (1, 'the cat', 'the cat')")
        run("INSERT INTO entity_mentions VALUES (1, :r, 'agent', :s)", r=f"mem:{alice['m1']}", s=STAMP)
        run(
            "INSERT INTO relations (agent_id, subject_kind, subject_id, predicate, object_kind, object_id, "
            "anchor_ref, declared_by, declared_at) VALUES ('alice', 'mem', :m2, 'follows', 'ep', :e1, :a, 'agent', :s)",
            m2=alice["m2"],
            e1=alice["e1"],
            a=f"mem:{alice['m1']}",
            s=STAMP,
        )
        # dave already calls someone else "the cat": that alias cannot be carried
        run(
            "INSERT INTO entities (agent_id, name, normalized, declared_by, created_at) "
            "VALUES ('dave', 'The Cat', 'the cat', 'agent', :s)",
            s=STAMP,
        )

    answer = merge_memories(app, source_agent_id="alice", target_agent_id="dave", mode="move")
    assert answer["associations"] == {"entities": 1, "mentions": 1, "relations": 1, "not_carried": 1}
    m1 = q(db, "SELECT id FROM memories WHERE agent_id = 'dave' AND msg_id = 'msg-1'")[0][0]
    m2 = q(db, "SELECT id FROM memories WHERE agent_id = 'dave' AND channel = 'ops'")[0][0]
    e1 = q(db, "SELECT id FROM episodes WHERE agent_id = 'dave'")[0][0]
    miso = q(db, "SELECT id FROM entities WHERE agent_id = 'dave' AND normalized = 'miso'")[0][0]
    assert q(db, "SELECT entity_id, ref FROM entity_mentions") == [(miso, f"mem:{m1}")]
    assert q(db, "SELECT agent_id, subject_kind, subject_id, object_kind, object_id, anchor_ref FROM relations") == [
        ("dave", "mem", m2, "ep", e1, f"mem:{m1}")
    ]
    assert q(db, "SELECT count(*) FROM entity_aliases WHERE entity_id = :e", e=miso) == [(0,)]
    # not everything was carried (the alias), so the source's entity stays
    assert answer["left_at_source"] == {"memories": 0, "episodes": 0, "profiles": 0, "entities": 1}


def test_paused_body_matches_the_spec() -> None:
    # spec §9.5
    assert paused_merge_body("a", "b", "skip", "move") == {
        "ok": True,
        "dry_run": True,
        "source_agent_id": "a",
        "target_agent_id": "b",
        "strategy": "skip",
        "mode": "move",
        "merged_memories": 0,
        "skipped_memories": 0,
        "merged_episodes": 0,
        "skipped_episodes": 0,
        "profile_copied": False,
        "skipped_profile": False,
    }


def test_a_move_that_empties_the_source_forgets_its_calibration(app: App, db: Database) -> None:  # spec MG-7
    from cpersona.services.calibration.service import vector_threshold
    from cpersona.services.records.memories import store

    state = app.calibration
    state.apply({("agent_thresholds", "old"): 0.41, ("agent_thresholds", "keep"): 0.52})
    assert state.persist(app.settings).ok
    store(app, agent_id="old", content="only fact of the old agent")
    store(app, agent_id="keep", content="a fact that stays")

    copied = merge_memories(app, source_agent_id="keep", target_agent_id="new", mode="copy")
    assert copied["ok"] and vector_threshold(app, "keep") == 0.52  # a copy leaves the source as it was

    moved = merge_memories(app, source_agent_id="old", target_agent_id="new", mode="move")
    assert moved["ok"] and not any(moved["left_at_source"].values())
    assert vector_threshold(app, "old") == app.settings.vector_min_similarity
    assert vector_threshold(app, "keep") == 0.52
