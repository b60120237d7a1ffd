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
    h.execute(
        app,
        "INSERT INTO memories_fts (memories_fts, rowid, content) VALUES ('delete', :i, :c)",
        i=row,
        c="searchable words",
    )
    [issue] = h.run(app, "fts_integrity")
    assert issue == {
        "type": "fts_integrity_failure",
        "table": "memories",
        "severity": "critical",
        "repairable": 1,
        "check": "fts_integrity",
    }
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


# --- schema_objects on adopted legacy files (issue 13 item 8) ---------------------------------------------

SAME_DEFINITION = [  # (stored spelling, ours): one definition, two spellings
    (
        "CREATE INDEX idx_a\n    ON memories(agent_id, created_at DESC)",
        "CREATE INDEX IF NOT EXISTS idx_a  ON memories (agent_id, created_at DESC)",
    ),
    (
        'create index "idx_a" on [memories] ( `agent_id` , created_at desc );',
        "CREATE INDEX idx_a ON memories (agent_id, created_at DESC)",
    ),
    (
        "CREATE TRIGGER t AFTER INSERT ON m BEGIN\n    INSERT INTO f(rowid, c)\n    VALUES (new.id, new.c);\nEND;;",
        "CREATE TRIGGER IF NOT EXISTS t AFTER INSERT ON m BEGIN\n  INSERT INTO f (rowid, c) VALUES (new.id, new.c);\nEND",
    ),
    ("CREATE INDEX i ON m (id) -- why\n WHERE msg_id <> ''", "CREATE INDEX i ON m (id) /* note */ WHERE msg_id != ''"),
]
DIFFERENT_DEFINITION = [  # a real drift must stay visible
    ("CREATE INDEX idx_a ON memories (agent_id)", "CREATE INDEX idx_a ON memories (agent_id, created_at DESC)"),
    ("CREATE INDEX idx_a ON memories (created_at, agent_id)", "CREATE INDEX idx_a ON memories (agent_id, created_at)"),
    ("CREATE INDEX idx_a ON memories (agent_id)", "CREATE UNIQUE INDEX idx_a ON memories (agent_id)"),
    ("CREATE INDEX i ON m (id) WHERE msg_id != 'X'", "CREATE INDEX i ON m (id) WHERE msg_id != 'x'"),
    ("CREATE INDEX i ON m (id) WHERE msg_id != ''", "CREATE INDEX i ON m (id)"),
    (
        "CREATE TRIGGER t AFTER UPDATE ON m BEGIN SELECT 1; END",
        "CREATE TRIGGER t AFTER UPDATE OF c ON m BEGIN SELECT 1; END",
    ),
    ('CREATE INDEX i ON m ("agent id")', "CREATE INDEX i ON m (agent, id)"),
]


@pytest.mark.parametrize("stored,ours", SAME_DEFINITION)
def test_canonical_form_ignores_spelling(stored, ours):  # spec R-26
    from cpersona.services.health.integrity import canonical_form

    assert canonical_form(stored) == canonical_form(ours)


@pytest.mark.parametrize("stored,ours", DIFFERENT_DEFINITION)
def test_canonical_form_keeps_meaning(stored, ours):  # spec R-26
    from cpersona.services.health.integrity import canonical_form

    assert canonical_form(stored) != canonical_form(ours)


def _adopted(fixture: str, tmp_path):
    import os

    from conftest import legacy_fixture
    from cpersona.config import load_settings
    from cpersona.services.app import App
    from cpersona.storage.migrate import open_database_and_upgrade

    os.chmod(tmp_path, 0o700)  # file_permissions is not what this test is about
    path = legacy_fixture(fixture, tmp_path)
    os.chmod(path, 0o600)
    settings = load_settings({"CPERSONA_DB_PATH": str(path)})
    return App(db=open_database_and_upgrade(settings), settings=settings)


LEGACY = ["cpersona-2.4.34-v10-dev.db", "cpersona-2.5.12-v13-dev.db"]


@pytest.mark.sqlite_only  # the legacy files are SQLite
@pytest.mark.parametrize("fixture", LEGACY)
def test_adopted_legacy_database_has_no_schema_drift(tmp_path, fixture):
    # spec R-26, MV-13: the 2.4/2.5 files spell their indexes and triggers with other
    # whitespace; adoption keeps them and check_health must not call them drifted.
    from cpersona.services.health.check_health import check_health

    app = _adopted(fixture, tmp_path)
    try:
        result = check_health(app)
        assert [i for i in result["issues"] if i["type"] == "schema_object_drift"] == []
        assert result["status"] != "unhealthy", result["issues"]
        if "v13" in fixture:
            assert result["status"] == "healthy", result["issues"]
        # (the v10 file's 24 lowercase "user" sources are a true R-39 finding: degraded, not drift)
    finally:
        app.db.close()


@pytest.mark.sqlite_only
@pytest.mark.parametrize("fixture", LEGACY)
def test_adopted_legacy_database_still_reports_real_drift(tmp_path, h, fixture):
    app = _adopted(fixture, tmp_path)
    try:
        h.execute(app, "DROP INDEX idx_memories_isolation")
        h.execute(app, "CREATE INDEX idx_memories_isolation\n    ON memories(agent_id, created_at DESC)")
        h.execute(app, "DROP TRIGGER memories_fts_ad")
        h.execute(
            app,
            "CREATE TRIGGER memories_fts_ad AFTER DELETE ON memories BEGIN\n"
            "    INSERT INTO memories_fts(memories_fts, rowid, content)\n"
            "    VALUES ('DELETE', old.id, old.content);\nEND",
        )
        found = {i["object"]: i for i in h.run(app, "schema_objects")}
        assert set(found) == {"idx_memories_isolation", "memories_fts_ad"}
        assert found["memories_fts_ad"]["severity"] == "critical"
        assert all(i["state"] == "definition_drift" for i in found.values())
        h.run(app, "schema_objects", fix=True)
        assert h.run(app, "schema_objects") == []
    finally:
        app.db.close()


@pytest.mark.sqlite_only  # FTS5 shadow tables
def test_the_word_indexes_are_checked_and_rebuilt_like_the_trigram_ones(app, h):
    # issue 14: revision 0006's word index out of step with its rows is found and rebuilt
    row = h.insert_memory(app, "searchable words")
    h.execute(
        app,
        "INSERT INTO memories_words (memories_words, rowid, content) VALUES ('delete', :i, :c)",
        i=row,
        c="searchable words",
    )
    [issue] = h.run(app, "fts_integrity")
    assert issue == {
        "type": "fts_integrity_failure",
        "table": "memories",
        "index": "memories_words",
        "severity": "critical",
        "repairable": 1,
        "check": "fts_integrity",
    }
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
