"""Checks 16-29 (spec R-28..R-41): each defect planted alone, its repair, and a rerun that finds nothing."""

from __future__ import annotations

import pytest

from health_seed import h  # noqa: F401  (the seeding fixture)

from datetime import datetime, timezone

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL


def test_axis_hygiene_clusters_spellings_of_one_bucket(app, h):
    # spec R-28
    h.insert_memory(app, "a", project="data-ops")
    h.insert_memory(app, "b", project="data-ops")
    h.insert_memory(app, "c", project="DataOps")
    h.insert_memory(app, "d", project="other")
    [issue] = h.run(app, "axis_hygiene")
    assert issue["clusters"] == [[{"project_id": "data-ops", "count": 2}, {"project_id": "DataOps", "count": 1}]]
    assert issue["severity"] == "warn"


def test_invalid_json_reencodes_nan_and_blanks_garbage(app, h):
    # spec R-29
    a = h.insert_memory(app, "x", metadata='{"v": NaN}')
    b = h.insert_memory(app, "y", source="not json")
    [issue] = h.run(app, "invalid_json")
    assert (issue["bad_source"], issue["bad_metadata"], issue["repairable"]) == (1, 1, 2)
    h.run(app, "invalid_json", fix=True)
    rows = {r.id: (r.source, r.metadata) for r in h.query(app, "SELECT id, source, metadata FROM memories")}
    assert rows[a][1] == '{"v": null}' and rows[b][0] == "{}"
    assert h.run(app, "invalid_json") == []


def test_future_timestamp_copies_created_at(app, h):
    # spec R-31
    row = h.insert_memory(app, "x", timestamp="2999-01-01T00:00:00+00:00")
    [issue] = h.run(app, "future_timestamp")
    assert (issue["count"], issue["repairable"]) == (1, 1)
    h.run(app, "future_timestamp", fix=True)
    stamp = h.query(app, "SELECT timestamp FROM memories WHERE id = :i", i=row)[0].timestamp
    assert stamp.endswith("+00:00") and not stamp.startswith("2999")
    assert h.run(app, "future_timestamp") == []


def test_invalid_timestamp_falls_back_to_created_at(app, h):
    # spec R-30: a stamp nothing can read
    row = h.insert_memory(app, "x", timestamp="yesterday-ish")
    [issue] = h.run(app, "invalid_timestamp")
    assert issue["count"] == 1 and issue["repairable"] == 1
    h.run(app, "invalid_timestamp", fix=True)
    stamp = h.query(app, "SELECT timestamp FROM memories WHERE id = :i", i=row)[0].timestamp
    assert datetime.fromisoformat(stamp).tzinfo is not None
    assert h.run(app, "invalid_timestamp") == []


def test_timestamp_format_drift_converts_aware_and_never_naive(app, h):
    # spec R-33
    h.insert_memory(app, "u", timestamp="2024-01-01T00:00:00+00:00")
    aware = h.insert_memory(app, "a", timestamp="2024-01-01T09:00:00+09:00")
    h.insert_memory(app, "n", timestamp="2024-01-01 00:00:00")
    [issue] = h.run(app, "timestamp_format_drift")
    assert (issue["utc"], issue["aware"], issue["naive"], issue["repairable"], issue["unfixable_naive"]) == (
        1,
        1,
        1,
        1,
        1,
    )
    [fixed] = h.run(app, "timestamp_format_drift", fix=True)
    assert fixed["normalized"] == 1
    assert (
        h.query(app, "SELECT timestamp FROM memories WHERE id = :i", i=aware)[0].timestamp
        == "2024-01-01T00:00:00+00:00"
    )
    [left] = h.run(app, "timestamp_format_drift")  # naive vs utc still mixed: reported, nothing repairable
    assert left["aware"] == 0 and left["repairable"] == 0 and left["severity"] == "info"


def test_missing_episode_start_time_written_from_created_at(app, h):
    # spec R-32
    h.execute(app, "INSERT INTO episodes (agent_id, summary, start_time) VALUES ('a', 's', NULL)")
    [issue] = h.run(app, "missing_episode_start_time")
    assert issue["count"] == 1 and issue["repairable"] == 1
    h.run(app, "missing_episode_start_time", fix=True)
    assert h.run(app, "missing_episode_start_time") == []


def test_future_episode_timestamp(app, h):
    # spec R-35
    h.execute(
        app,
        "INSERT INTO episodes (agent_id, summary, start_time, end_time) VALUES "
        "('a', 's', '2024-01-01T00:00:00+00:00', '2999-01-01T00:00:00+00:00')",
    )
    [issue] = h.run(app, "future_episode_timestamp")
    assert issue["count"] == 1
    h.run(app, "future_episode_timestamp", fix=True)
    assert h.run(app, "future_episode_timestamp") == []


def test_stale_pending_tasks_deleted(app, h):
    # spec R-36
    h.execute(
        app,
        "INSERT INTO pending_memory_tasks (task_type, agent_id, payload, created_at) "
        "VALUES ('x', 'a', '{}', '2000-01-01 00:00:00')",
    )
    h.execute(app, "INSERT INTO pending_memory_tasks (task_type, agent_id, payload) VALUES ('x', 'a', '{}')")
    [issue] = h.run(app, "stale_pending_tasks")
    assert issue["count"] == 1
    h.run(app, "stale_pending_tasks", fix=True)
    assert len(h.query(app, "SELECT id FROM pending_memory_tasks")) == 1
    assert h.run(app, "stale_pending_tasks") == []


def test_missing_profile_lists_agents(app, h):
    # spec R-37
    h.insert_memory(app, "x", agent="bob")
    h.execute(app, "INSERT INTO profiles (agent_id, content) VALUES ('alice', 'p')")
    h.insert_memory(app, "y", agent="alice")
    [issue] = h.run(app, "missing_profile")
    assert issue["agents"] == ["bob"] and issue["severity"] == "info"


def test_empty_content_deleted_unless_locked(app, h):
    # spec R-38
    h.insert_memory(app, "   ")
    h.insert_memory(app, "\n", locked=1)
    [issue] = h.run(app, "empty_content")
    assert (issue["count"], issue["repairable"]) == (2, 1)
    h.run(app, "empty_content", fix=True)
    [left] = h.run(app, "empty_content")
    assert left["count"] == 1 and left["repairable"] == 0


def test_invalid_source_type_maps_known_shapes(app, h):
    # spec R-39
    mapped = h.insert_memory(app, "a", source='{"type": "assistant", "id": "x"}')
    h.insert_memory(app, "b", source='"claude-code"')
    h.insert_memory(app, "c", source="{}")  # anonymous, not this check's
    [issue] = h.run(app, "invalid_source_type")
    assert (issue["count"], issue["repairable"]) == (2, 1)
    [fixed] = h.run(app, "invalid_source_type", fix=True)
    assert (fixed["mapped"], fixed["unmapped"], fixed["locked"], fixed["remaining"]) == (1, 1, 0, 1)
    assert '"Agent"' in h.query(app, "SELECT source FROM memories WHERE id = :i", i=mapped)[0].source


def test_invalid_source_type_past_the_cap_reports_null(db, h):
    # spec R-39, H-14
    app = h.make_app(db, INVALID_SOURCE_CLASSIFY_CAP="1")
    h.insert_memory(app, "a", source='{"type": "user"}')
    h.insert_memory(app, "b", source='{"type": "user", "id": "2"}')
    [issue] = h.run(app, "invalid_source_type")
    assert issue["repairable"] is None and issue["classified"] == 1
    [fixed] = h.run(app, "invalid_source_type", fix=True)
    assert fixed["mapped"] == 1 and fixed["remaining"] == 1 and "again" in fixed["hint"]


def test_oversized_profile_truncated(db, h):
    # spec R-40
    app = h.make_app(db, MAX_PROFILE_LENGTH="5")
    h.execute(app, "INSERT INTO profiles (agent_id, content) VALUES ('a', 'abcdefgh')")
    [issue] = h.run(app, "oversized_profile")
    assert (issue["count"], issue["max_len"]) == (1, 5)
    h.run(app, "oversized_profile", fix=True)
    assert h.query(app, "SELECT content FROM profiles")[0].content == "abcde"
    assert h.run(app, "oversized_profile") == []


def test_anonymous_source_counts_sentinel_and_unattributed(app, h):
    # spec R-41
    h.insert_memory(app, "a", source='{"type":"User","id":"","name":""}')
    h.insert_memory(app, "b", source="{}")
    h.insert_memory(app, "c", source='{"type":"User","id":"u","name":"n"}')
    [issue] = h.run(app, "anonymous_source")
    assert (issue["count"], issue["unattributed"]) == (2, 1) and "deep_check" in issue["hint"]


def test_clean_rows_report_nothing(app, h):
    h.insert_memory(
        app,
        "fine",
        source='{"type":"User","id":"u","name":"n"}',
        timestamp=datetime.now(timezone.utc).replace(year=2024).isoformat(),
    )
    h.execute(app, "INSERT INTO profiles (agent_id, content) VALUES ('a', 'p')")
    for name in (
        "axis_hygiene",
        "invalid_json",
        "invalid_timestamp",
        "future_timestamp",
        "timestamp_format_drift",
        "stale_pending_tasks",
        "missing_profile",
        "empty_content",
        "invalid_source_type",
        "oversized_profile",
        "anonymous_source",
        "episode_timestamp_format_drift",
    ):
        assert h.run(app, name) == [], name
