"""check_health as a whole (spec H-1..H-13, R-7, H-11) and the other two tools' surfaces (F-1..F-10, DC-1..DC-12)."""

from __future__ import annotations

import pytest

from health_seed import h  # noqa: F401  (the seeding fixture)

import json
import subprocess
import sys

import numpy as np

from cpersona.services.health.check_health import check_health
from cpersona.services.health.deep_check import deep_check
from cpersona.services.health.findings import get_session_findings
from cpersona.services.health.registry import names

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL


def test_registry_has_38_checks_and_checks_run_echoes_it():
    assert len(names()) == 38 and names()[0] == "memory_annotation" and names()[-1] == "missing_blocks"


def test_unknown_name_is_refused_and_nothing_runs(app, h):
    # spec H-1, H-12
    h.insert_memory(app, "   ")
    out = check_health(app, checks=["empty_content", "nope"], fix=True)
    assert out["ok"] is False and out["unknown_checks"] == ["nope"] and out["checks_run"] == []
    assert out["error"].startswith("unknown check name(s): nope. Valid names: memory_annotation, ")
    assert len(h.query(app, "SELECT id FROM memories")) == 1


def test_checks_run_dedupes_and_execution_follows_registry_order(app, h):
    # spec H-2
    h.insert_memory(app, "   ", source="bad")
    out = check_health(app, checks=["invalid_json", "empty_content", "invalid_json"])
    assert out["checks_run"] == ["invalid_json", "empty_content"]
    assert [i["check"] for i in out["issues"]] == ["invalid_json", "empty_content"]


@pytest.mark.sqlite_only  # plants its critical issue by dropping an FTS5 trigger
def test_verdict_and_stats(app, h):
    # spec R-7, H-11
    h.insert_memory(app, "a", project="p1", channel="c")
    h.insert_memory(app, "b", agent="other")
    out = check_health(app, agent_id="a", checks=["missing_profile"])
    assert out["status"] == "healthy" and out["severity_summary"] == {"critical": 0, "warn": 0, "info": 1}
    stats = out["stats"]
    assert stats["memories"] == 1 and stats["agent_memories"] == 1 and stats["agent_episodes"] == 0
    assert stats["axes"] == {"project_id": {"p1": 1}, "channel": {"c": 1}}
    whole = check_health(app, checks=["empty_content"])
    assert whole["stats"]["axes"]["project_id"] == {"p1": 1, "(global)": 1} and "agent_memories" not in whole["stats"]
    h.execute(app, "DROP TRIGGER episodes_ai")
    assert check_health(app, checks=["schema_objects"])["status"] == "unhealthy"


def test_fix_reports_pre_repair_issue_with_residual_verdict(app, h):
    # spec H-9, H-16
    h.insert_memory(app, "  ")
    out = check_health(app, checks=["empty_content"], fix=True)
    assert out["fixed"] is True and out["issues"][0]["count"] == 1
    assert out["status"] == "healthy" and out["severity_summary"]["warn"] == 0


def test_null_embedding_fix_reembeds_outside_the_lock(db, h, embed_server):
    # spec R-21, H-4: severity from the share of NULL rows; fix writes the vectors
    app = h.make_app(db, EMBEDDING_MODE="http", EMBEDDING_URL=embed_server.url)
    from cpersona.embedding.client import build_embedder

    app.embedder = build_embedder(app.settings)
    h.insert_memory(app, "first text")
    [issue] = h.run(app, "null_embedding")
    assert issue["severity"] == "critical" and issue["repairable"] == 1
    [fixed] = h.run(app, "null_embedding", fix=True)
    assert fixed["re_embedded"] == 1
    assert h.run(app, "null_embedding") == []


def test_nonfinite_and_dimension_mismatch(db, h, embed_server):
    # spec
    app = h.make_app(db, EMBEDDING_MODE="http", EMBEDDING_URL=embed_server.url)
    from cpersona.embedding.client import build_embedder

    app.embedder = build_embedder(app.settings)
    h.insert_memory(app, "nan row", embedding=np.array([np.nan, 1.0], dtype="<f4").tobytes())
    out = check_health(app, checks=["embedding_dimension", "nonfinite_embedding"])
    kinds = {i["type"]: i for i in out["issues"]}
    assert kinds["embedding_dimension_mismatch"]["severity"] == "critical"
    assert kinds["nonfinite_embedding"]["count"] == 1
    check_health(app, checks=["embedding_dimension", "nonfinite_embedding"], fix=True)
    rest = check_health(app, checks=["embedding_dimension", "nonfinite_embedding"])
    assert rest["issues"] == []


@pytest.mark.sqlite_only  # plants its critical issue by dropping an FTS5 trigger
def test_findings_shape_caps_and_summary(app, h):
    # spec F-1, F-3..F-7, F-9
    assert get_session_findings(app, per_kind_limit=0) == {
        "ok": False,
        "error": "per_kind_limit must be at least 1 (got 0)",
        "per_kind_limit": 0,
    }
    h.execute(app, "DROP TRIGGER episodes_ai")
    h.execute(app, "DROP INDEX idx_memories_agent")
    h.execute(app, "DROP INDEX idx_episodes_agent")
    h.insert_memory(app, "x")
    out = get_session_findings(app, per_kind_limit=1)
    kinds = [f["kind"] for f in out["findings"]]
    assert "null_embedding_expected" in kinds and "schema_objects" in kinds
    assert "schema_objects_perf_index" in out["capped_kinds"]
    perf = next(f for f in out["findings"] if f["kind"] == "schema_objects_perf_index")
    assert perf["object_kind"] == "index" and perf["health_severity"] == "warn" and "kind" in perf
    assert out["total"] == len(out["findings"]) and out["_meta"]["superauditor"] == "1.1"
    assert out["summary"].startswith(f"Storage findings: {out['total']} returned (critical 1")
    assert "Capped at 1 per kind:" in out["summary"]
    assert "summary" not in get_session_findings(app, include_summary=False)


def test_findings_check_crashed(app, h):
    # spec F-10
    h.execute(app, "DROP TABLE schema_version")
    out = get_session_findings(app)
    crash = [f for f in out["findings"] if f["kind"] == "check_crashed"]
    assert crash and crash[0]["check"] == "schema_version" and crash[0]["severity"] == "warn"


def test_deep_check_report_and_fix(app, h):
    # spec DC-2, DC-5, DC-6, DC-8, DC-11
    assert deep_check(app, agent_id="a", checks=["bogus"])["unknown_checks"] == ["bogus"]
    anon = h.insert_memory(app, "[carol] hello there", source='{"type":"User","id":"","name":""}')
    h.insert_memory(app, "ok")
    h.insert_memory(app, "caf\u0065\u0301 decomposed text")
    h.execute(
        app,
        "INSERT INTO episodes (agent_id, summary, start_time, end_time) VALUES "
        "('a', 'nothing inside', '2020-01-01T00:00:00', '2020-01-02T00:00:00')",
    )
    out = deep_check(app, agent_id="a")
    r = out["results"]
    assert list(r) == out["checks_run"] and out["fixed"] is False
    assert r["anonymous_source"]["samples"] == [{"id": anon, "recovered_name": "carol"}]
    assert r["short_content"]["count"] == 1
    assert r["orphaned_episodes"]["count"] == 1
    assert r["unnormalized_content"]["count"] == 1
    assert r["unnormalized_content"]["samples"][0]["decomposed_codepoints"] == ["U+0301"]
    assert r["calibration_staleness"]["status"] == "not_applicable"
    fixed = deep_check(app, agent_id="a", checks=["anonymous_source", "short_content"], fix=True)
    assert fixed["results"]["anonymous_source"]["fixed"] == 1 and fixed["results"]["short_content"]["fixed"] == 1
    again = deep_check(app, agent_id="a", checks=["anonymous_source", "short_content"])["results"]
    assert again["anonymous_source"]["recoverable"] == 0 and again["short_content"]["count"] == 0


def test_deep_check_near_duplicate_and_norm(app, h):
    # spec DC-10, DC-12
    v = np.array([1.0, 0.0, 0.0], dtype="<f4")
    w = np.array([0.999, 0.01, 0.0], dtype="<f4")
    h.insert_memory(app, "one", embedding=v.tobytes())
    h.insert_memory(app, "two", embedding=w.tobytes())
    h.insert_memory(app, "three", embedding=(v * 3).tobytes())
    r = deep_check(app, agent_id="a", checks=["near_duplicate", "embedding_norm"])["results"]
    assert r["near_duplicate"]["pairs"] == 3 and r["near_duplicate"]["rows_scanned"] == 3
    assert r["embedding_norm"]["count"] == 1  # only the row of norm 3; w is within 0.001 of 1


@pytest.mark.sqlite_only  # the checkup CLI reads a SQLite file
def test_checkup_cli_exit_codes_and_json(db, h, tmp_path):
    # spec CLI-1, CLI-6, CLI-7
    missing = subprocess.run(
        [sys.executable, "-m", "cpersona.checkup", "--db", str(tmp_path / "none.db")], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "error: database not found:" in missing.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "cpersona.checkup", "--db", str(db.path), "--json"], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert len(json.loads(ok.stdout)["checks_run"]) == 38
    h.execute(h.make_app(db), "DROP TRIGGER episodes_ai")
    bad = subprocess.run(
        [sys.executable, "-m", "cpersona.checkup", "--db", str(db.path)], capture_output=True, text=True
    )
    assert bad.returncode == 2
    lines = bad.stdout.splitlines()
    assert lines[0].startswith("cpersona checkup: 0 memories, 1 critical") and lines[-1] == "exit=2 (non-strict gate)"
    fixed = subprocess.run(
        [sys.executable, "-m", "cpersona", "checkup", "--db", str(db.path), "--fix"], capture_output=True, text=True
    )
    assert fixed.returncode == 0 and "(fix applied)" in fixed.stdout.splitlines()[0]
