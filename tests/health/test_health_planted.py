"""Planted defects for the checks the family test files do not cover, each with a clean twin
(spec R-19, R-20, R-27, R-34, R-42..R-48, DC-7, DC-9), plus the feature-off checks that must stay silent
(spec §9 open point 3).
"""

from __future__ import annotations

from health_seed import h  # noqa: F401  (the seeding fixture)

import json
import os
import sqlite3
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from cpersona.embedding.client import build_embedder
from cpersona.services.calibration.sidecar import scoring_version
from cpersona.services.health.check_health import check_health
from cpersona.services.health.deep_check import deep_check
from cpersona.storage.engine import open_sqlite

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL


def http_app(db, h, server, **env):
    app = h.make_app(db, EMBEDDING_MODE="http", EMBEDDING_URL=server.url, **env)
    app.embedder = build_embedder(app.settings)
    return app


# -- 15: sqlite_integrity --------------------------------------------------------------------------


def _corrupt_copy(app, h, tmp_path):
    """A copy of the database with garbage written into the b-tree page of one non-essential index."""
    for i in range(300):
        h.insert_memory(app, f"row {i} " + "x" * 50, agent=f"agent-{i % 7}")
    copy = tmp_path / "corrupt.db"
    source, raw = sqlite3.connect(app.db.path), sqlite3.connect(copy)
    source.backup(raw)  # a page-for-page copy, WAL content included
    source.close()
    page_size = raw.execute("PRAGMA page_size").fetchone()[0]
    root = raw.execute("SELECT rootpage FROM sqlite_master WHERE name = 'idx_memories_agent'").fetchone()[0]
    raw.close()
    with open(copy, "r+b") as handle:
        handle.seek((root - 1) * page_size + 8)
        handle.write(b"\xff\x13" * 200)
    return copy


def test_sqlite_integrity_clean_database(app, h):
    # spec R-27
    h.insert_memory(app, "fine")
    assert h.run(app, "sqlite_integrity") == []


@pytest.mark.sqlite_only  # corrupts a page of the SQLite file
def test_sqlite_integrity_reports_a_corrupt_index_page(app, h, tmp_path):
    # spec: critical, report-only (fix accepted, nothing written)
    copy = _corrupt_copy(app, h, tmp_path)
    damaged = open_sqlite(copy)
    try:
        bad = h.make_app(damaged)
        [issue] = h.run(bad, "sqlite_integrity")
        assert issue["type"] == "sqlite_integrity_failure" and issue["severity"] == "critical"
        assert issue["detail"] and issue["detail"] != "ok"
        out = check_health(bad, checks=["sqlite_integrity"], fix=True)
        assert out["status"] == "unhealthy" and "fixed" not in out["issues"][0]
    finally:
        damaged.close()


# -- 22: episode_timestamp_format_drift ------------------------------------------------------------


def test_episode_timestamp_drift_repair_and_second_run(app, h):
    # spec R-34: aware -> UTC; naive equal to created_at -> canonical; other naive unfixable
    h.execute(
        app,
        "INSERT INTO episodes (agent_id, summary, start_time, end_time, created_at) VALUES "
        "('a', 'aware', '2024-01-01T09:00:00+09:00', '2024-01-01T10:00:00+00:00', '2024-01-01 00:00:00'),"
        "('a', 'naive=created', '2024-02-01 00:00:00', '2024-02-01T01:00:00+00:00', '2024-02-01 00:00:00')",
    )
    [issue] = h.run(app, "episode_timestamp_format_drift")
    assert issue["aware"] == 1 and issue["naive"] == 1 and issue["repairable"] == 2
    h.run(app, "episode_timestamp_format_drift", fix=True)
    rows = h.query(app, "SELECT summary, start_time FROM episodes ORDER BY id")
    assert rows[0].start_time == "2024-01-01T00:00:00+00:00"
    assert rows[1].start_time == "2024-02-01T00:00:00+00:00"
    assert h.run(app, "episode_timestamp_format_drift") == []


def test_episode_timestamp_unfixable_naive_is_left_alone(app, h):
    # spec R-34: a naive value that is not created_at cannot be placed in a zone
    h.execute(
        app,
        "INSERT INTO episodes (agent_id, summary, start_time, end_time, created_at) VALUES "
        "('a', 'x', '2024-03-01 05:00:00', '2024-03-01T06:00:00+00:00', '2024-03-02 00:00:00')",
    )
    [issue] = h.run(app, "episode_timestamp_format_drift")
    assert issue["repairable"] == 0 and issue["unfixable_naive"] == 1 and issue["needs_human_review"] is True
    h.run(app, "episode_timestamp_format_drift", fix=True)
    assert h.query(app, "SELECT start_time FROM episodes")[0].start_time == "2024-03-01 05:00:00"


# -- 7: embedding_backend -------------------------------------------------------------------------


def test_embedding_backend_up_down_and_report_only(db, h, embed_server):
    # spec R-19, H-17: only fix judges liveness; a report run is never evidence
    app = http_app(db, h, embed_server)
    assert h.run(app, "embedding_backend", fix=True) == []  # up: the probe reached the backend
    [report] = h.run(app, "embedding_backend")
    assert report["type"] == "embedding_backend_not_probed" and report["reason"] == "no_probe_on_this_run"
    embed_server.status = 503
    app.embedder = build_embedder(app.settings)  # no cached probe
    [down] = h.run(app, "embedding_backend", fix=True)
    assert down["type"] == "embedding_backend_unreachable" and down["severity"] == "warn"
    assert down["semantic_recall"].startswith("degraded")
    embed_server.reset_faults()
    app.embedder = build_embedder(app.settings)
    assert h.run(app, "embedding_backend", fix=True) == []


def test_embedding_backend_without_client_reports_nothing(app, h):
    # spec R-19: "no backend configured" is never reported here
    assert h.run(app, "embedding_backend") == [] and h.run(app, "embedding_backend", fix=True) == []


# -- 8: embedding_model ---------------------------------------------------------------------------


def test_embedding_model_mismatch(db, h, embed_server):
    # spec R-20
    app = http_app(db, h, embed_server, EMBEDDING_MODEL="current-model")
    vec = np.ones(64, dtype="<f4").tobytes()
    h.insert_memory(app, "no label column yet", embedding=vec)
    assert h.run(app, "embedding_model") == []  # the v13 schema carries no label: nothing to compare
    # a database whose rows carry the per-row label (spec storage §6.4)
    h.execute(app, "ALTER TABLE memories ADD COLUMN embedding_model TEXT NOT NULL DEFAULT ''")
    h.execute(app, "ALTER TABLE episodes ADD COLUMN embedding_model TEXT NOT NULL DEFAULT ''")
    h.insert_memory(app, "labelled current", embedding=vec)
    h.execute(app, "UPDATE memories SET embedding_model = 'current-model'")
    assert h.run(app, "embedding_model") == []  # clean: every label accepted
    other = h.insert_memory(app, "labelled other", embedding=vec)
    h.insert_memory(app, "unlabelled", embedding=vec)  # '' is unknown, never a mismatch
    h.execute(app, "UPDATE memories SET embedding_model = 'old-model' WHERE id = :i", i=other)
    [issue] = h.run(app, "embedding_model")
    assert issue["count"] == 1 and issue["memories"] == 1 and issue["current"] == "current-model"
    assert issue["labels"] == [{"label": "old-model", "count": 1}]
    assert issue["mode"] == "warn" and issue["severity"] == "info"
    off = http_app(db, h, embed_server, EMBEDDING_MODEL="current-model", EMBEDDING_MODEL_MODE="off")
    assert h.run(off, "embedding_model") == []


# -- 30: vector_fallback_config -------------------------------------------------------------------


def test_vector_fallback_config(db, h):
    # spec R-42
    local = h.make_app(db)
    h.insert_memory(local, "x")
    assert h.run(local, "vector_fallback_config") == []
    remote = h.make_app(db, VECTOR_SEARCH_MODE="remote", STORE_BLOB="false")
    [issue] = h.run(remote, "vector_fallback_config")
    assert issue["type"] == "no_local_vector_fallback" and issue["memories"] == 1
    assert issue["memories_with_local_embedding"] == 0 and issue["store_blob"] is False
    assert h.run(h.make_app(db, VECTOR_SEARCH_MODE="remote", STORE_BLOB="true"), "vector_fallback_config") == []


# -- 34, 35: operating context --------------------------------------------------------------------


def test_operating_context_parse_and_size(db, h, tmp_path):
    # spec, R-10 (path only on whole-database calls)
    path = tmp_path / "oc.toml"
    app = h.make_app(db, OPERATING_CONTEXT_PATH=str(path))
    assert h.run(app, "operating_context_parse") == [] and h.run(app, "operating_context_size") == []  # absent
    path.write_text('version = 1\n[instructions]\nsummary = "short"\n')
    assert h.run(app, "operating_context_parse") == [] and h.run(app, "operating_context_size") == []
    path.write_text('version = 1\n[instructions]\nsummary = "unterminated\n')
    [bad] = h.run(app, "operating_context_parse")
    assert bad["type"] == "operating_context_parse_error" and bad["path"] == str(path) and bad["detail"]
    [scoped] = h.run(app, "operating_context_parse", agent_id="a")
    assert "path" not in scoped
    path.write_text('version = 1\n[instructions]\nsummary = """' + "s" * 3001 + '"""\n')
    assert h.run(app, "operating_context_parse") == []
    [big] = h.run(app, "operating_context_size")
    assert big["summary_len"] == 3001 and big["budget"] == 3000 and big["severity"] == "info"


# -- 36: file_permissions through the tool --------------------------------------------------------


@pytest.mark.skipif(os.name == "nt", reason="permission bits are not the access control there")
@pytest.mark.sqlite_only  # the database file's own permissions
def test_file_permissions_through_the_tool(db, h):
    # spec: files narrowed to 0600; directories reported for review, never chmod-ed
    import anyio

    from cpersona.mcp.dispatch import call_tool
    from cpersona.mcp.tools import default_registry
    from cpersona.mcp.gates import GateChain

    app = h.make_app(db)
    directory = db.path.parent
    os.chmod(directory, 0o700)
    os.chmod(db.path, 0o600)
    registry = default_registry()

    def call(args):
        return anyio.run(lambda: call_tool(app, registry, GateChain([]), "check_health", args)).payload

    clean = call({"checks": ["file_permissions"]})
    assert clean["issues"] == []
    os.chmod(db.path, 0o644)
    os.chmod(directory, 0o755)
    out = call({"checks": ["file_permissions"]})
    kinds = {i["type"]: i for i in out["issues"]}
    assert kinds["file_reachable_by_other_accounts"]["mode"] == "0644"
    assert kinds["directory_reachable_by_other_accounts"]["severity"] == "info"
    fixed = call({"checks": ["file_permissions"], "fix": True})
    assert [i.get("fixed") for i in fixed["issues"] if i["type"] == "file_reachable_by_other_accounts"] == [True]
    assert oct(os.stat(db.path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(directory).st_mode & 0o777) == "0o755"  # never chmod-ed
    left = call({"checks": ["file_permissions"]})
    assert [i["type"] for i in left["issues"]] == ["directory_reachable_by_other_accounts"]
    os.chmod(directory, 0o700)


# -- feature-off checks (spec §9 open point 3) ----------------------------------------------------


@pytest.mark.parametrize("name", ["vector_index", "coarse_index", "block_index", "missing_blocks"])
def test_feature_off_checks_report_nothing(app, h, name):
    h.insert_memory(app, "x", embedding=np.ones(8, dtype="<f4").tobytes())
    assert h.run(app, name) == [] and h.run(app, name, fix=True) == []


# -- deep_check: stale_profile, calibration_staleness ---------------------------------------------


def test_stale_profile(app, h):
    # spec DC-7
    assert deep_check(app, agent_id="a", checks=["stale_profile"])["results"]["stale_profile"]["count"] == 0
    fresh = app.clock().strftime("%Y-%m-%d %H:%M:%S")
    h.execute(app, "INSERT INTO profiles (agent_id, user_id, content, updated_at) VALUES ('a', '', 'p', :u)", u=fresh)
    assert deep_check(app, agent_id="a", checks=["stale_profile"])["results"]["stale_profile"]["count"] == 0
    old = (app.clock() - timedelta(days=31)).strftime("%Y-%m-%d %H:%M:%S")
    h.execute(app, "UPDATE profiles SET updated_at = :u", u=old)
    r = deep_check(app, agent_id="a", checks=["stale_profile"])["results"]["stale_profile"]
    assert r == {"count": 1, "threshold_days": 30, "last_updated": old}


def test_calibration_staleness_with_a_sidecar(db, h, embed_server):
    # spec DC-9
    app = http_app(db, h, embed_server)
    sidecar = app.settings.calibration_sidecar

    def status():
        return deep_check(app, agent_id="a", checks=["calibration_staleness"])["results"]["calibration_staleness"]

    assert status()["status"] == "ok" and "too small" in status()["reason"]  # no sidecar, small corpus
    now = datetime.now(timezone.utc)
    body = {"scoring_version": scoring_version(app.settings), "calibrated_at": now.isoformat()}
    sidecar.write_text(json.dumps(body))
    assert status()["status"] == "ok"
    body["calibrated_at"] = (now - timedelta(days=100)).isoformat()
    sidecar.write_text(json.dumps(body))
    stale = status()
    assert stale["status"] == "stale" and stale["threshold_days"] == 90 and stale["age_days"] >= 99
    body["scoring_version"] = "something-else"
    sidecar.write_text(json.dumps(body))
    assert status()["status"] == "stale_scoring_version"
    sidecar.write_text("{not json")
    assert status()["status"] == "unreadable"


# -- 10: null_episode_embedding -------------------------------------------------------------------


def test_null_episode_embedding_fix_and_second_run(db, h, embed_server):
    # spec R-22, H-4: an episode always expects a vector; fix embeds it outside the lock
    app = http_app(db, h, embed_server)
    assert h.run(app, "null_episode_embedding") == []
    h.execute(app, "INSERT INTO episodes (agent_id, summary, start_time, end_time) VALUES ('a', 'an episode', '', '')")
    [issue] = h.run(app, "null_episode_embedding")
    assert issue["count"] == 1 and issue["repairable"] == 1
    [fixed] = h.run(app, "null_episode_embedding", fix=True)
    assert fixed["re_embedded"] == 1
    assert len(h.query(app, "SELECT embedding FROM episodes")[0].embedding) == 64 * 4
    assert h.run(app, "null_episode_embedding") == []


def test_deep_check_clean_agent_reports_nothing(app, h):
    # spec DC-5..DC-12: the clean twin of every deep check
    h.insert_memory(
        app,
        "a perfectly ordinary memory",
        source='{"type":"User","id":"u1","name":"Ann"}',
        timestamp="2024-01-01T00:30:00+00:00",
        embedding=np.array([1.0, 0.0], dtype="<f4").tobytes(),
    )
    h.execute(
        app,
        "INSERT INTO episodes (agent_id, summary, start_time, end_time) VALUES "
        "('a', 'covers the memory', '2024-01-01T00:00:00+00:00', '2024-01-01T01:00:00+00:00')",
    )
    r = deep_check(app, agent_id="a")["results"]
    assert r["anonymous_source"]["recoverable"] == 0 and r["anonymous_source"]["unrecoverable"] == 0
    assert r["short_content"]["count"] == 0 and r["stale_profile"]["count"] == 0
    assert r["orphaned_episodes"]["count"] == 0 and r["near_duplicate"]["pairs"] == 0
    assert r["unnormalized_content"]["count"] == 0 and r["embedding_norm"]["count"] == 0
    assert r["calibration_staleness"]["status"] == "not_applicable"
