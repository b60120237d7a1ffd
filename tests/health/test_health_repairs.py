"""Every database-only repair, one planted defect each: the run finds it, fix repairs it, the state after fix
is checked, and a second run finds nothing (spec R-9..R-40, H-14, H-16). Repairs that need an embedding
backend or a server file live in test_check_health.py, test_health_planted.py and test_health_derived.py.
"""

from __future__ import annotations

import json

from health_seed import h  # noqa: F401  (the seeding fixture)

import numpy as np
import pytest

from cpersona.services.health.check_health import check_health

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

NAN = np.array([np.nan, 1.0], dtype="<f4").tobytes()


def _episode(h, app, start="2024-01-01T00:00:00+00:00", end="2024-01-01T01:00:00+00:00"):
    h.execute(
        app,
        "INSERT INTO episodes (agent_id, summary, start_time, end_time, created_at) "
        "VALUES ('a', 'ep', :s, :e, '2024-01-01 00:00:00')",
        s=start,
        e=end,
    )


# name -> (extra env, plant(h, app), what the state after fix must satisfy: SQL returning one truthy value,
# or a check in Python where the SQL would be one engine's JSON functions)
CASES = {
    "memory_annotation": (
        {},
        lambda h, a: h.insert_memory(a, "[Memory from bot] hi"),
        "SELECT content = 'hi' FROM memories",
    ),
    "discord_mention": ({}, lambda h, a: h.insert_memory(a, "<@123> <@!45>hi"), "SELECT content = 'hi' FROM memories"),
    "oversized_content": (
        {"MAX_CONTENT_LENGTH": "10"},
        lambda h, a: h.insert_memory(a, "0123456789abcdef"),
        "SELECT content = '0123456789' FROM memories",
    ),
    "duplicate_content": (
        {},
        lambda h, a: (h.insert_memory(a, "same"), h.insert_memory(a, "same", channel="c")),
        "SELECT COUNT(*) = 1 AND MIN(channel) = '' FROM memories",
    ),
    "nonfinite_embedding": (
        {},
        lambda h, a: h.insert_memory(a, "v", embedding=NAN),
        "SELECT embedding IS NULL FROM memories",
    ),
    "fts_integrity": (
        {},
        lambda h, a: (h.insert_memory(a, "findable words"), h.execute(a, "DROP TABLE memories_fts")),
        "SELECT COUNT(*) = 1 FROM memories_fts WHERE memories_fts MATCH 'findable'",
    ),
    "dedup_msg_id_index": (
        {},
        lambda h, a: h.execute(a, "DROP INDEX idx_memories_dedup_msg_id"),
        "SELECT COUNT(*) = 1 FROM sqlite_master WHERE name = 'idx_memories_dedup_msg_id'",
    ),
    "schema_objects": (
        {},
        lambda h, a: (h.execute(a, "DROP INDEX idx_memories_agent"), h.execute(a, "DROP TRIGGER memories_fts_ai")),
        "SELECT COUNT(*) = 2 FROM sqlite_master WHERE name IN ('idx_memories_agent', 'memories_fts_ai')",
    ),
    "invalid_json": (
        {},
        lambda h, a: h.insert_memory(a, "j", source="garbage", metadata="{bad"),
        lambda h, a: [(json.loads(s), json.loads(m)) for s, m in h.query(a, "SELECT source, metadata FROM memories")],
    ),
    "invalid_timestamp": (
        {},
        lambda h, a: h.insert_memory(a, "t", timestamp="not a time"),
        "SELECT timestamp LIKE '____-__-__T__:__:__+00:00' FROM memories",
    ),
    "future_timestamp": (
        {},
        lambda h, a: h.insert_memory(a, "t", timestamp="2999-01-01T00:00:00+00:00"),
        "SELECT timestamp < '2999' FROM memories",
    ),
    "missing_episode_start_time": (
        {},
        lambda h, a: _episode(h, a, start=""),
        "SELECT start_time = '2024-01-01T00:00:00+00:00' FROM episodes",
    ),
    "timestamp_format_drift": (
        {},
        lambda h, a: (h.insert_memory(a, "u"), h.insert_memory(a, "o", timestamp="2024-01-01T09:00:00+09:00")),
        "SELECT COUNT(*) = 2 FROM memories WHERE timestamp LIKE '%+00:00'",
    ),
    "episode_timestamp_format_drift": (
        {},
        lambda h, a: _episode(h, a, start="2024-01-01T09:00:00+09:00"),
        "SELECT start_time = '2024-01-01T00:00:00+00:00' FROM episodes",
    ),
    "future_episode_timestamp": (
        {},
        lambda h, a: _episode(h, a, end="2999-01-01T00:00:00+00:00"),
        "SELECT end_time = '2024-01-01T00:00:00+00:00' FROM episodes",
    ),
    "stale_pending_tasks": (
        {},
        lambda h, a: h.execute(
            a,
            "INSERT INTO pending_memory_tasks (task_type, agent_id, payload, created_at) "
            "VALUES ('x', 'a', '{}', '2000-01-01 00:00:00')",
        ),
        "SELECT COUNT(*) = 0 FROM pending_memory_tasks",
    ),
    "empty_content": ({}, lambda h, a: h.insert_memory(a, " \n "), "SELECT COUNT(*) = 0 FROM memories"),
    "invalid_source_type": (
        {},
        lambda h, a: h.insert_memory(a, "s", source='{"type": "assistant", "id": "x"}'),
        lambda h, a: json.loads(h.query(a, "SELECT source FROM memories")[0][0])["type"] == "Agent",
    ),
    "oversized_profile": (
        {"MAX_PROFILE_LENGTH": "5"},
        lambda h, a: h.execute(a, "INSERT INTO profiles (agent_id, content) VALUES ('a', 'abcdefgh')"),
        "SELECT content = 'abcde' FROM profiles",
    ),
}


# FTS5 tables, SQLite's dedup index DDL and sqlite_master drift exist only on SQLite.
SQLITE_ONLY_CASES = {"fts_integrity", "dedup_msg_id_index", "schema_objects"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.sqlite_only) if n in SQLITE_ONLY_CASES else n for n in sorted(CASES)]
)
def test_repair_then_second_run_finds_nothing(db, h, name):
    env, plant, after = CASES[name]
    app = h.make_app(db, **env)
    assert h.run(app, name) == []  # the clean twin
    plant(h, app)
    found = h.run(app, name)
    assert found and all(i.get("repairable") for i in found), found
    out = check_health(app, checks=[name], fix=True)
    assert out["fixed"] is True and [i["type"] for i in out["issues"]] == [i["type"] for i in found]  # H-16
    assert after(h, app) if callable(after) else h.query(app, after)[0][0], after
    assert h.run(app, name) == [] and h.run(app, name, fix=True) == []


def test_every_db_only_repair_is_covered():
    from cpersona.services.health.registry import registry

    elsewhere = {
        "embedding_dimension",
        "null_embedding",
        "null_episode_embedding",
        "file_permissions",
        "missing_nodes",
        "coarse_index",
        "block_index",
        "missing_blocks",
    }
    assert {c.name for c in registry() if c.fixable} == set(CASES) | elsewhere


# --- locked rows (spec R-9): every repair that rewrites or deletes authored memory fields ----------------
# name -> (extra env, plant(h, app) -> the ids of the locked rows planted). Each plant also holds an
# unlocked twin with the same defect, so the repair does run (and is seen to) while the locked row waits.


def _pair(**defect):
    def plant(h, a):
        h.insert_memory(a, **{"content": "twin", **defect})
        return [h.insert_memory(a, **{"content": "locked", **defect}, locked=1)]

    return plant


def _content(text, twin):
    def plant(h, a):
        h.insert_memory(a, twin)
        return [h.insert_memory(a, text, locked=1)]

    return plant


def _duplicates(h, a):
    h.execute(a, "DROP INDEX idx_memories_dedup_content")  # to plant exact duplicates in one bucket
    h.insert_memory(a, "same")  # unlocked, channel ''
    first = h.insert_memory(a, "same", locked=1)  # locked in the same bucket
    named = h.insert_memory(a, "same", channel="c", locked=1)  # covered by the '' copies
    h.insert_memory(a, "same", channel="c")  # unlocked, covered
    return [first, named]


def _msg_ids(h, a):
    h.execute(a, "DROP INDEX idx_memories_dedup_msg_id")
    kept = h.insert_memory(a, "one", msg_id="m1", locked=1)
    h.insert_memory(a, "two", msg_id="m1")
    return [kept]


LOCKED_CASES = {
    "memory_annotation": ({}, _content("[Memory from bot] hi", "[Memory from bot] yo")),
    "discord_mention": ({}, _content("<@123> hi", "<@45> yo")),
    "oversized_content": ({"MAX_CONTENT_LENGTH": "10"}, _content("0123456789abcdef", "abcdefghijklmnop")),
    "duplicate_content": ({}, _duplicates),
    "dedup_msg_id_index": ({}, _msg_ids),
    "invalid_json": ({}, _pair(source="garbage", metadata="{bad")),
    "invalid_timestamp": ({}, _pair(timestamp="not a time")),
    "future_timestamp": ({}, _pair(timestamp="2999-01-01T00:00:00+00:00")),
    "timestamp_format_drift": ({}, _pair(timestamp="2024-01-01T09:00:00+09:00")),
    "empty_content": ({}, _content(" \n ", "  ")),
    "invalid_source_type": ({}, _pair(source='{"type": "assistant", "id": "x"}')),
}
# Repairs that write no authored memory field: derived data (vectors, indexes, nodes, blocks, the FTS
# tables, schema objects), tables without a lock (episodes, profiles, the task queue), or files.
NO_AUTHORED_MEMORY_FIELD = {
    "nonfinite_embedding",
    "fts_integrity",
    "schema_objects",
    "missing_episode_start_time",
    "episode_timestamp_format_drift",
    "future_episode_timestamp",
    "stale_pending_tasks",
    "oversized_profile",
    "embedding_dimension",
    "null_embedding",
    "null_episode_embedding",
    "file_permissions",
    "missing_nodes",
    "coarse_index",
    "block_index",
    "missing_blocks",
}


def test_every_repair_is_classified_for_locked_rows():
    from cpersona.services.health.registry import registry

    fixable = {c.name for c in registry() if c.fixable}
    assert fixable == set(LOCKED_CASES) | NO_AUTHORED_MEMORY_FIELD
    assert not set(LOCKED_CASES) & NO_AUTHORED_MEMORY_FIELD


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.sqlite_only) if n in SQLITE_ONLY_CASES else n for n in sorted(LOCKED_CASES)],
)
def test_a_repair_never_touches_a_locked_row(db, h, name):  # spec
    env, plant = LOCKED_CASES[name]
    app = h.make_app(db, **env)
    locked = plant(h, app)
    marks = ", ".join(str(i) for i in locked)

    def rows():
        return sorted(tuple(r) for r in h.query(app, f"SELECT * FROM memories WHERE id IN ({marks})"))

    def others():
        return sorted(tuple(r) for r in h.query(app, f"SELECT * FROM memories WHERE id NOT IN ({marks})"))

    before, twins = rows(), others()
    assert len(before) == len(locked)
    found = h.run(app, name)
    assert found and any(i.get("repairable") for i in found), found  # the unlocked twin is repairable
    check_health(app, checks=[name], fix=True)
    assert rows() == before  # every column of every locked row, as planted
    assert others() != twins  # ... while the repair did act on the unlocked twin
