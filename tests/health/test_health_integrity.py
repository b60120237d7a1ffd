"""Checks 11-15 (spec R-23..R-27) on real SQLite files with objects dropped behind the server's back."""

from __future__ import annotations

import pytest

from health_seed import h  # noqa: F401  (the seeding fixture)

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL


def test_intact_database_has_no_integrity_issue(app, h):
    h.insert_memory(app, "hello")
    for name in ("fts_integrity", "schema_version", "dedup_msg_id_index", "schema_objects", "sqlite_integrity"):
        assert h.run(app, name) == [], name


@pytest.mark.sqlite_only  # sqlite_master drift of SQLite's own DDL
def test_missing_trigger_and_index_are_drift_and_fix_recreates_them(app, h):
    # spec R-26: critical trigger, warn index; fix creates them; a rerun finds nothing
    h.execute(app, "DROP TRIGGER episodes_ai")
    h.execute(app, "DROP INDEX idx_memories_agent")
    issues = {i["object"]: i for i in h.run(app, "schema_objects")}
    assert issues["episodes_ai"]["severity"] == "critical" and issues["episodes_ai"]["kind"] == "trigger"
    assert issues["idx_memories_agent"]["severity"] == "warn" and issues["idx_memories_agent"]["state"] == "missing"
    fixed = {i["object"]: i for i in h.run(app, "schema_objects", fix=True)}
    assert fixed["episodes_ai"]["fixed"] is True and fixed["idx_memories_agent"]["fixed"] is True
    assert h.run(app, "schema_objects") == []


@pytest.mark.sqlite_only  # sqlite_master drift of SQLite's own DDL
def test_redefined_index_is_definition_drift(app, h):
    h.execute(app, "DROP INDEX idx_memories_msg_id")
    h.execute(app, "CREATE INDEX idx_memories_msg_id ON memories (msg_id)")
    [issue] = h.run(app, "schema_objects")
    assert issue["state"] == "definition_drift"
    h.run(app, "schema_objects", fix=True)
    assert h.run(app, "schema_objects") == []


def test_dedup_msg_id_index_fix_blanks_colliders_keeping_locked(app, h):
    # spec R-25: keep the highest-id locked row's msg_id, blank the other unlocked ones; no row deleted
    h.execute(app, "DROP INDEX idx_memories_dedup_msg_id")
    keep = h.insert_memory(app, "one", msg_id="m1", locked=1)
    other = h.insert_memory(app, "two", msg_id="m1")
    [issue] = h.run(app, "dedup_msg_id_index")
    assert issue["severity"] == "critical" and issue["repairable"] == 1
    [fixed] = h.run(app, "dedup_msg_id_index", fix=True)
    assert fixed["fixed"] is True
    rows = {r.id: r.msg_id for r in h.query(app, "SELECT id, msg_id FROM memories")}
    assert rows == {keep: "m1", other: ""}
    assert h.run(app, "dedup_msg_id_index") == []


@pytest.mark.sqlite_only  # FTS5 shadow tables
def test_fts_out_of_sync_is_critical_and_rebuild_fixes_it(app, h):
    # spec R-23: an index out of step with its content table
    row = h.insert_memory(app, "searchable words")
    h.execute(app, "INSERT INTO memories_fts (memories_fts, rowid, content) VALUES ('delete', :i, :c)",
              i=row, c="searchable words")
    [issue] = h.run(app, "fts_integrity")
    assert issue == {"type": "fts_integrity_failure", "table": "memories", "severity": "critical", "repairable": 1,
                     "check": "fts_integrity"}
    [fixed] = h.run(app, "fts_integrity", fix=True)
    assert fixed["fixed"] is True
    assert h.run(app, "fts_integrity") == []


@pytest.mark.sqlite_only  # FTS5 shadow tables
def test_missing_fts_table_is_recreated(app, h):
    h.execute(app, "DROP TABLE episodes_fts")
    [issue] = h.run(app, "fts_integrity")
    assert issue["table"] == "episodes"
    h.run(app, "fts_integrity", fix=True)
    assert h.run(app, "fts_integrity") == []


def test_schema_version_mismatch_and_unreadable_version_crashes(app, h):
    # spec R-24
    h.execute(app, "INSERT INTO schema_version (version) VALUES (14)")
    [issue] = h.run(app, "schema_version")
    assert (issue["db_version"], issue["expected"], issue["severity"]) == (14, 13, "critical")
    h.execute(app, "DROP TABLE schema_version")
    [crash] = h.run(app, "schema_version")
    assert crash["type"] == "check_crashed" and crash["check_name"] == "schema_version"


def test_report_run_writes_nothing_and_holds_no_lock(app, h):
    # spec H-13: after a report, another connection can take the write lock at once
    h.insert_memory(app, "x")
    before = h.query(app, "SELECT COUNT(*) AS n FROM memories")[0].n
    h.run(app, "fts_integrity")
    h.execute(app, "INSERT INTO memories (agent_id, content, timestamp) VALUES ('z', 'after', '')")
    assert h.query(app, "SELECT COUNT(*) AS n FROM memories")[0].n == before + 1


@pytest.mark.sqlite_only  # FTS5 shadow tables
def test_the_word_indexes_are_checked_and_rebuilt_like_the_trigram_ones(app, h):
    # issue 14: revision 0005's word index out of step with its rows is found and rebuilt
    row = h.insert_memory(app, "searchable words")
    h.execute(app, "INSERT INTO memories_words (memories_words, rowid, content) VALUES ('delete', :i, :c)",
              i=row, c="searchable words")
    [issue] = h.run(app, "fts_integrity")
    assert issue == {"type": "fts_integrity_failure", "table": "memories", "index": "memories_words",
                     "severity": "critical", "repairable": 1, "check": "fts_integrity"}
    [fixed] = h.run(app, "fts_integrity", fix=True)
    assert fixed["fixed"] is True
    assert h.run(app, "fts_integrity") == []
    h.execute(app, "DROP TABLE episodes_words")
    [issue] = h.run(app, "fts_integrity")
    assert issue["index"] == "episodes_words"
    h.run(app, "fts_integrity", fix=True)
    assert h.run(app, "fts_integrity") == []


@pytest.mark.sqlite_only
def test_a_lost_word_trigger_is_schema_drift_and_comes_back(app, h):
    h.execute(app, "DROP TRIGGER memories_words_au")
    issues = h.run(app, "schema_objects")
    assert [(i["object"], i["state"], i["severity"]) for i in issues] == [("memories_words_au", "missing", "critical")]
    h.run(app, "schema_objects", fix=True)
    assert h.run(app, "schema_objects") == []
