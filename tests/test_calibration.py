"""calibrate_threshold on real SQLite files with real vectors (spec §3.11, §5.18, CT-1..CT-5).

Figures marked "reference" were produced by CPersona 2.6.14 over stdio on the
same corpus (same text, same stamps, vectors from the same embedder); when the
sample is the whole corpus the measurement is deterministic, so ours must agree.
"""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import pytest
from calibration_corpus import insert, sessions
from conftest import make_app
from embed_server import embed_text
from sqlalchemy import delete

from cpersona.embedding.client import build_embedder
from cpersona.embedding.vectors import to_blob
from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.tools import default_registry
from cpersona.services.calibration import service as cal
from cpersona.services.calibration import statistics as cm
from cpersona.services.calibration.service import calibrate_threshold, install, vector_threshold
from cpersona.services.calibration.sidecar import SCORING_VERSION
from cpersona.services.calibration.fused_gate import signal_floor
from cpersona.services.recall.gate import calibrated_gate_for
from cpersona.storage.models import Memory

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL


@pytest.fixture
def app(db):
    app = make_app(db)
    install(app, seed=11)
    return app


def gate_app(db, embed_server, **env):
    """An app with a real HTTP embedding client, so the fused gate can be measured.

    Fewer pseudo-queries than the default unless a test sets them: each one is
    an HTTP round trip to the test embedding server.
    """
    env = {"FUSED_GATE_SAMPLE_QUERIES": "10", "FUSED_GATE_CALIBRATION_DRAWS": "2", **env}
    app = make_app(db, EMBEDDING_MODE="http", EMBEDDING_URL=embed_server.url, **env)
    app.embedder = build_embedder(app.settings)
    install(app, seed=5)
    return app


def sidecar(app) -> dict:
    return json.loads(app.settings.calibration_sidecar.read_text())


# -- CT-2: the minimum sample ---------------------------------------------------------------------


def test_fewer_than_ten_embedded_memories_fail_and_change_nothing(app, db):
    # spec CT-2
    insert(db, "a", sessions(1, 9))
    with db.write() as s:
        s.add(Memory(agent_id="a", content="stored in mode none", timestamp="2026-01-01T00:00:00Z"))
    assert calibrate_threshold(app, agent_id="a") == {"ok": False, "error": "Need at least 10 embeddings, found 9"}
    assert calibrate_threshold(app, agent_id="nobody") == {"ok": False, "error": "Need at least 10 embeddings, found 0"}
    assert vector_threshold(app, "a") == 0.3
    assert not app.settings.calibration_sidecar.exists()


def test_a_sample_size_below_ten_can_never_succeed(app, db):
    # spec §3.11: sample_size is clamped to [1, max]; the reference answers "found 1" for -5
    insert(db, "a", sessions(4, 5))
    assert calibrate_threshold(app, agent_id="a", sample_size=5)["error"] == "Need at least 10 embeddings, found 5"
    assert calibrate_threshold(app, agent_id="a", sample_size=-5)["error"] == "Need at least 10 embeddings, found 1"


def test_only_the_modal_width_counts_and_corrupt_blobs_are_skipped(app, db):
    # spec CT-2, §5.18.1: drop blobs that are not float32 or not finite; keep the modal width
    insert(db, "a", sessions(2, 4), dimension=64)  # 8 of width 64
    insert(db, "a", sessions(1, 3, seed=1), dimension=32)  # 3 of width 32
    insert(db, "a", [("odd", "2026-01-01T00:00:00Z")], blob=b"\x00" * 10)
    insert(db, "a", [("nan", "2026-01-01T00:00:01Z")], blob=np.array([np.nan] * 64, "<f4").tobytes())
    result = calibrate_threshold(app, agent_id="a")
    assert result == {"ok": False, "error": "Need at least 10 same-dimension embeddings, found 8"}
    insert(db, "a", sessions(1, 2, seed=2), dimension=64)  # now 10 of width 64
    result = calibrate_threshold(app, agent_id="a")
    assert result["ok"] and result["embedding_dim"] == 64 and result["sampled_embeddings"] == 10


def test_on_a_tie_the_wider_width_wins(app, db):
    insert(db, "a", sessions(2, 5), dimension=32)
    insert(db, "a", sessions(2, 5, seed=3), dimension=48)
    result = calibrate_threshold(app, agent_id="a")
    assert result["ok"] and result["embedding_dim"] == 48 and result["sampled_embeddings"] == 10


# -- CT-1, §5.18.1-2: the measurement ---------------------------------------------------------------


def test_separation_matches_the_reference_on_a_session_corpus(app, db):
    # spec CT-1, §5.18.2; reference run: 80 memories in 16 same-session groups, whole corpus sampled
    insert(db, "g", sessions(16, 5))
    result = calibrate_threshold(app, agent_id="g")
    assert result == {
        "ok": True, "sidecar_persisted": True, "scope": "per_agent", "agent_id": "g",
        "sampled_embeddings": 80, "num_pairs": 3160, "method": "separation", "z_factor": 1.0,
        "percentile": 0.95, "embedding_dim": 64, "embedding_model": "",
        "distribution": {"mean": 0.215, "std": 0.1705, "median": 0.2042, "p95": 0.5124},
        "null_admit_rate": 0.1358, "old_threshold": 0.3, "new_threshold": 0.388,
        "proxy_source": "temporal", "youden_j": 0.8017, "pos_admit_rate": 0.9375, "pos_mean": 0.6087,
    }  # fmt: skip


def test_separation_falls_back_to_nearest_neighbours_like_the_reference(app, db):
    # spec §5.18.2: 60 memories a day apart have no same-session pairs; reference figures
    insert(db, "c", sessions(60, 1))
    result = calibrate_threshold(app, agent_id="c")
    assert result["proxy_source"] == "nn_fallback"
    assert result["distribution"] == {"mean": 0.3468, "std": 0.1422, "median": 0.3433, "p95": 0.5875}
    assert (result["new_threshold"], result["youden_j"], result["pos_admit_rate"], result["pos_mean"]) == (
        0.5651,
        0.9051,
        0.9667,
        0.7236,
    )


def test_distribution_is_every_pair_of_the_sample(app, db):
    # spec §5.18.1: num_pairs = n(n-1)/2; mean, population std, median, p95 (linear) of the dots
    rows = sessions(5, 6)
    insert(db, "a", rows)
    vectors = np.array([embed_text(c) for c, _ in rows], dtype=np.float32).astype(np.float64)
    dots = [vectors[i] @ vectors[j] for i in range(30) for j in range(i + 1, 30)]
    result = calibrate_threshold(app, agent_id="a", method="zscore", z_factor=0.5)
    assert result["num_pairs"] == 435 == len(dots)
    assert result["distribution"] == {
        "mean": round(float(np.mean(dots)), 4), "std": round(float(np.std(dots)), 4),
        "median": round(float(np.quantile(dots, 0.5)), 4), "p95": round(float(np.quantile(dots, 0.95)), 4),
    }  # fmt: skip
    assert result["new_threshold"] == round(float(np.mean(dots) + 0.5 * np.std(dots)), 4)  # zscore
    assert "proxy_source" not in result and "youden_j" not in result  # separation-only fields


def test_percentile_reads_percents_and_takes_the_null_quantile(app, db):
    # spec §3.11 (percentile), §5.18.2; reference: c at 0.5 → 0.3433, at 1 and at 100 → 0.882
    insert(db, "c", sessions(60, 1))
    half = calibrate_threshold(app, agent_id="c", method="percentile", percentile=0.5)
    assert (half["new_threshold"], half["null_admit_rate"], half["percentile"]) == (0.3433, 0.5, 0.5)
    assert calibrate_threshold(app, agent_id="c", method="percentile", percentile=1)["new_threshold"] == 0.882
    top = calibrate_threshold(app, agent_id="c", method="percentile", percentile=100)
    assert (top["percentile"], top["new_threshold"]) == (1.0, 0.882)
    assert calibrate_threshold(app, agent_id="c", method="percentile", percentile=1.5)["percentile"] == 0.015


@pytest.mark.parametrize(("arguments", "error"), [
    ({"percentile": 150}, "percentile must be in (0, 1] (or a percent 1-100), got 150.0"),
    ({"percentile": -1}, "percentile must be in (0, 1] (or a percent 1-100), got -1.0"),
    ({"percentile": math.inf}, "percentile must be a finite number, got inf"),
    ({"z_factor": math.nan}, "z_factor must be a finite number, got nan"),
    ({"z_factor": -math.inf}, "z_factor must be a finite number, got -inf"),
    ({"method": "bogus"}, "Unknown method 'bogus'; expected one of separation, percentile, zscore"),
])  # fmt: skip
def test_bad_arguments_are_refused_before_anything_is_read(app, db, arguments, error):
    # spec §3.11 failures; checked before the corpus is looked at (the reference does the same)
    assert calibrate_threshold(app, agent_id="a", **arguments) == {"ok": False, "error": error}


def test_zero_means_default_and_z_is_clamped(app, db):
    # spec §3.11 table: 0 → default for sample_size, z_factor, percentile; z clamped to [-10, 10]
    insert(db, "g", sessions(16, 5))
    result = calibrate_threshold(app, agent_id="g", sample_size=0, z_factor=0, percentile=0, method="zscore")
    assert (result["sampled_embeddings"], result["z_factor"], result["percentile"]) == (80, 1.0, 0.95)
    low = calibrate_threshold(app, agent_id="g", method="zscore", z_factor=-50)
    assert (low["z_factor"], low["new_threshold"], low["null_admit_rate"]) == (-10.0, 0.05, 0.8443)  # the floor


def test_a_threshold_above_one_fails_and_nothing_is_applied(app, db):
    # spec §5.18.2: above 1.0 → error, nothing applied; reference figure 1.9199 at z = 10
    insert(db, "g", sessions(16, 5))
    result = calibrate_threshold(app, agent_id="g", method="zscore", z_factor=50)
    assert result["ok"] is False
    assert "1.9199" in result["error"] and "z_factor=10.0" in result["error"]
    assert vector_threshold(app, "g") == 0.3
    assert not app.settings.calibration_sidecar.exists()


def test_the_sample_is_capped_and_random_but_repeatable_with_a_seed(db):
    # spec §3.11: sample_size clamped to CPERSONA_CALIBRATE_MAX_SAMPLE
    insert(db, "a", sessions(20, 5))
    first, second, other = (make_app(db, CALIBRATE_MAX_SAMPLE="30") for _ in range(3))
    install(first, seed=3), install(second, seed=3), install(other, seed=4)
    runs = [
        calibrate_threshold(x, agent_id="a", sample_size=99999, method="percentile") for x in (first, second, other)
    ]
    assert all(r["sampled_embeddings"] == 30 and r["num_pairs"] == 435 for r in runs)
    assert runs[0]["distribution"] == runs[1]["distribution"] != runs[2]["distribution"]


# -- CT-3: applied at once and persisted --------------------------------------------------------------


def test_thresholds_apply_at_once_agent_over_global_over_setting(app, db):
    # spec CT-3, VEC-4
    insert(db, "g", sessions(16, 5))
    insert(db, "c", sessions(60, 1))
    assert vector_threshold(app, "g") == vector_threshold(app, "other") == 0.3
    glob = calibrate_threshold(app, agent_id="")
    assert glob["scope"] == "global" and glob["sampled_embeddings"] == 140 and "fused_gate" not in glob
    assert glob["old_threshold"] == 0.3
    assert vector_threshold(app, "other") == vector_threshold(app, "g") == glob["new_threshold"]
    per = calibrate_threshold(app, agent_id="g")
    assert per["old_threshold"] == glob["new_threshold"]  # the agent's threshold in force before the run
    assert vector_threshold(app, "g") == 0.388 and vector_threshold(app, "other") == glob["new_threshold"]
    stored = sidecar(app)
    assert stored["global_threshold"] == glob["new_threshold"] and stored["agent_thresholds"] == {"g": 0.388}
    assert stored["embedding_dim"] == 64 and stored["scoring_version"] == SCORING_VERSION


def test_a_failed_sidecar_write_is_reported_not_fatal(app, db):
    # spec CT-3 (sidecar_persisted), SC-6 ("a write failure is reported, never fatal")
    insert(db, "g", sessions(16, 5))
    app.settings.calibration_sidecar.mkdir(parents=True)  # a directory where the file should go
    result = calibrate_threshold(app, agent_id="g")
    assert result["ok"] is True and result["sidecar_persisted"] is False
    assert vector_threshold(app, "g") == 0.388  # still in force for this process


def test_embedding_dim_is_the_samples_and_the_sidecar_gets_the_corpus_width(app, db):
    # spec CT-5
    insert(db, "small", sessions(2, 5), dimension=32)
    insert(db, "big", sessions(4, 5, seed=9), dimension=64)
    result = calibrate_threshold(app, agent_id="small")
    assert result["embedding_dim"] == 32
    assert sidecar(app)["embedding_dim"] == 64


def test_embedding_model_is_reported_only_when_known(db):
    # spec CT-5
    insert(db, "g", sessions(4, 5))
    plain = make_app(db, EMBEDDING_MODE="http", EMBEDDING_URL="http://127.0.0.1:9/embed")
    named = make_app(db, EMBEDDING_MODE="http", EMBEDDING_URL="http://127.0.0.1:9/embed", EMBEDDING_MODEL="bge-m3")
    api = make_app(db, EMBEDDING_MODE="api", EMBEDDING_API_KEY="k")
    got = [calibrate_threshold(x, agent_id="g")["embedding_model"] for x in (plain, named, api)]
    assert got == ["", "bge-m3", "text-embedding-3-small"]


def test_data_deleted_during_the_run_fails_and_nothing_is_applied(app, db, monkeypatch):
    # spec §3.11 failures: "the agent's data being deleted during the run"
    insert(db, "g", sessions(16, 5))

    def delete_then_measure(app_, agent_id, beta, rng):
        with db.write() as s:
            s.execute(delete(Memory).where(Memory.agent_id == "g"))
        return None

    monkeypatch.setattr(cal, "measure_gate", delete_then_measure)
    result = calibrate_threshold(app, agent_id="g")
    assert result["ok"] is False and "deleted" in result["error"]
    assert vector_threshold(app, "g") == 0.3 and not app.settings.calibration_sidecar.exists()


def test_calibrations_of_one_process_run_one_at_a_time(app, db):
    # Each run reads what the previous one applied (old_threshold): no interleaving.
    insert(db, "g", sessions(16, 5))
    results = []

    def run():
        results.append(calibrate_threshold(app, agent_id="g", method="percentile", percentile=0.9))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r["old_threshold"] for r in results) == [0.3] + [results[0]["new_threshold"]] * 3


# -- CT-4: the fused gate --------------------------------------------------------------------------------


def test_an_agent_gets_its_fused_gate_measured_through_recall(db, embed_server):
    # spec CT-4, §5.18.3, GATE-3
    insert(db, "g", sessions(16, 5))
    app = gate_app(
        db, embed_server, RECALL_MODE="rsf", FUSED_GATE_SAMPLE_QUERIES="40", FUSED_GATE_CALIBRATION_DRAWS="5"
    )
    result = calibrate_threshold(app, agent_id="g")
    gate = result["fused_gate"]
    assert gate["signal"] == "rsf" and gate["beta"] == 1.0 and gate["queries_run"] == 40
    assert gate["n_null"] >= 10 and gate["n_pos"] >= 5 and gate["pos_mean"] > gate["null_mean"]
    assert gate["threshold_draws"] == sorted(gate["threshold_draws"]) and len(gate["threshold_draws"]) > 1
    assert gate["threshold"] == gate["threshold_draws"][len(gate["threshold_draws"]) // 2]  # the upper median
    assert 0.05 <= gate["threshold"] < 1
    # The word channel (issue 14) merges into the lexical list, which moves the rsf populations
    # a little (measured: pos_mean 0.49, null_mean 0.06, gate 0.21, J 0.966) ...
    assert 0.4 < gate["pos_mean"] < 0.6 and gate["null_mean"] < 0.1 and 0.17 < gate["threshold"] < 0.25
    assert gate["youden_j"] > 0.9
    # ... and without it the populations are the reference's on this corpus (rsf): pos_mean 0.44,
    # null_mean 0.04, gate ~0.18 (ours: 0.45, 0.04, 0.19, J 0.972).
    app = gate_app(
        db,
        embed_server,
        RECALL_MODE="rsf",
        FUSED_GATE_SAMPLE_QUERIES="40",
        FUSED_GATE_CALIBRATION_DRAWS="5",
        RECALL_WORD_WEIGHT="0",
    )
    gate = calibrate_threshold(app, agent_id="g")["fused_gate"]
    assert 0.35 < gate["pos_mean"] < 0.5 and gate["null_mean"] < 0.1 and 0.15 < gate["threshold"] < 0.21
    found = calibrated_gate_for(app, "g", enabled=True)
    assert (found.threshold, found.signal) == (gate["threshold"], "rsf")
    assert calibrated_gate_for(app, "g", enabled=False) is None
    assert calibrated_gate_for(app, "other", enabled=True) is None  # no global gate
    stored = sidecar(app)
    assert stored["agent_fused_gates"] == {"g": gate["threshold"]} and stored["fused_gate_signal"] == "rsf"


def test_the_global_scope_and_a_store_without_sessions_get_no_gate(db, embed_server):
    # spec CT-4 ("too few samples"), §6 item 15
    insert(db, "c", sessions(60, 1))
    app = gate_app(db, embed_server, RECALL_MODE="rsf")
    assert "fused_gate" not in calibrate_threshold(app, agent_id="")
    assert "fused_gate" not in calibrate_threshold(app, agent_id="c")
    assert calibrated_gate_for(app, "c", enabled=True) is None


def test_no_gate_without_embedder_under_cascade_or_when_disabled_and_the_old_gate_stays(db, embed_server):
    # spec CT-4: when no gate can be measured fused_gate is absent and the previous gate stays
    insert(db, "g", sessions(16, 5))
    app = gate_app(db, embed_server, RECALL_MODE="rsf")
    measured = calibrate_threshold(app, agent_id="g")["fused_gate"]["threshold"]
    state = app.calibration
    for env in ({"RECALL_MODE": "cascade"}, {"RECALL_MODE": "rsf", "FUSED_GATE_ENABLED": "false"}):
        other = gate_app(db, embed_server, **env)
        other.calibration = state
        assert "fused_gate" not in calibrate_threshold(other, agent_id="g")
    keyword_only = make_app(db, RECALL_MODE="rsf")
    keyword_only.calibration = state
    assert "fused_gate" not in calibrate_threshold(keyword_only, agent_id="g")
    assert state.agent_gate("g") == measured


def test_a_calibrated_rrf_gate_is_reachable_by_rrf_scores(db, embed_server):
    # Deliberate difference (spec §6 item 3, README decision 3): the reference floors the rrf gate at
    # 0.05, above every reachable rrf score (≤ 3/61), so it blocks every lexical-only row. Ours floors it
    # at CPERSONA_CALIBRATE_FLOOR × 1/(K+1) and the sweep places it inside the populations.
    insert(db, "g", sessions(16, 5))
    # Under rrf the vector arm claims most related rows (they are judged on cosine), so few rows are
    # judged on rrf: the default 40 pseudo-queries and 5 draws are needed to see 5 positives.
    app = gate_app(
        db, embed_server, RECALL_MODE="rrf", FUSED_GATE_SAMPLE_QUERIES="40", FUSED_GATE_CALIBRATION_DRAWS="5"
    )
    gate = calibrate_threshold(app, agent_id="g")["fused_gate"]
    assert gate["signal"] == "rrf"
    assert gate["threshold"] < 1 / 61  # a row ranked first by one keyword arm passes
    assert gate["pos_admit_rate"] > 0  # the reference measured 0.0 here
    assert signal_floor("rrf", app.settings) == pytest.approx(0.05 / 61)
    assert signal_floor("rsf", app.settings) == signal_floor("cosine", app.settings) == 0.05


def test_pseudo_queries_do_not_count_as_recalls(db, embed_server):
    # Calibration is not a reader: recall counters stay as they were (spec §5.9.5 is for recalls).
    insert(db, "g", sessions(16, 5))
    app = gate_app(db, embed_server, RECALL_MODE="rsf", CONFIDENCE_ENABLED="true")
    calibrate_threshold(app, agent_id="g")
    with db.read() as s:
        assert s.query(Memory).filter(Memory.recall_count > 0).count() == 0


# -- the facade ----------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_facade_enforces_the_schema_and_reaches_the_service(app, db):
    # spec G-3, §3.11 ("An unknown method is a schema violation")
    registry, gates = default_registry(), GateChain([])
    bad = await call_tool(app, registry, gates, "calibrate_threshold", {"agent_id": "a", "method": "bogus"})
    assert bad.is_error and "'bogus' is not one of" in bad.payload["error"]
    missing = await call_tool(app, registry, gates, "calibrate_threshold", {})
    assert missing.is_error and "'agent_id' is a required property" in missing.payload["error"]
    insert(db, "g", sessions(16, 5))
    ok = await call_tool(app, registry, gates, "calibrate_threshold", {"agent_id": "g", "sample_size": 80.0})
    assert not ok.is_error and ok.payload["new_threshold"] == 0.388


# -- the math ---------------------------------------------------------------------------------------------


def test_null_pairs_match_the_full_matrix_across_blocks():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(600, 8))  # more rows than one block
    pairs = cm.null_pairs(vectors)
    full = vectors @ vectors.T
    upper = full[np.triu_indices(600, k=1)]
    assert pairs.count == upper.size
    assert np.allclose(pairs.sorted_values, np.sort(upper).astype(np.float32))
    np.fill_diagonal(full, -np.inf)
    assert np.allclose(pairs.nearest, full.max(axis=1))


def test_separation_sweep_picks_the_first_best_and_rises_with_beta():
    # spec SP-1: TPR + β(1 − FPR); a higher β never lowers the threshold
    rng = np.random.default_rng(1)
    null, pos = rng.normal(0.1, 0.1, 2000), rng.normal(0.5, 0.15, 300)
    points = [cm.separation_sweep(pos, null, beta).threshold for beta in (0.5, 1.0, 2.0, 4.0)]
    assert points == sorted(points) and points[0] < points[-1]
    flat = cm.separation_sweep(np.array([0.4, 0.4]), np.array([0.4, 0.4]), 1.0)
    assert flat.threshold == 0.4  # no range: the common value


def test_temporal_positives_pair_only_rows_close_in_time(app, db):
    # spec §5.18.2: consecutive rows at most 30 minutes apart contribute their cosine
    rows = [
        ("alpha beta", "2026-01-01T09:00:00Z"),
        ("alpha gamma", "2026-01-01T09:29:00Z"),
        ("delta", "2026-01-01T10:30:00Z"),
        ("not a stamp", "yesterday"),
    ]
    insert(db, "a", rows)
    from cpersona.storage.scope import Scope

    sims = cal.temporal_positives(app, Scope(agent_id="a"), 64, 200, 30.0)
    a, b = (np.array(embed_text(t), dtype=np.float32).astype(np.float64) for t in ("alpha beta", "alpha gamma"))
    assert sims.size == 1 and sims[0] == pytest.approx(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_vector_blobs_written_by_to_blob_round_trip_into_the_sample(app, db):
    insert(
        db, "a", [(f"row {i}", f"2026-01-0{1 + i % 9}T00:00:00Z") for i in range(12)], blob=to_blob([1.0] + [0.0] * 63)
    )
    result = calibrate_threshold(app, agent_id="a", method="percentile")
    assert result["distribution"]["mean"] == 1.0 and result["new_threshold"] == 1.0  # identical vectors


# -- start-up (spec §5.18.5, SC-5, SC-7) --------------------------------------------------------------------


def write_sidecar_file(app, **values) -> dict:
    obj = {
        "embedding_dim": 64,
        "embedding_model": "",
        "scoring_version": SCORING_VERSION,
        "global_threshold": 0.41,
        "agent_thresholds": {"g": 0.52},
        "global_fused_gate": None,
        "agent_fused_gates": {"g": 0.19},
        "fused_gate_signal": "rsf",
        "agent_betas": {"g": 2.0, "z": 0.5},
        "calibrated_at": "2026-11-30T04:00:44.150986+00:00",
        **values,
    }
    path = app.settings.calibration_sidecar
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return obj


def test_mode_none_reads_only_the_betas_and_starts_nothing(db):
    # spec §5.18.5 (start-up only when the embedding mode is not none), SC-5 (betas are preferences)
    insert(db, "g", sessions(16, 5))
    app = make_app(db)
    install(app)
    write_sidecar_file(app)
    assert cal.start_calibration(app) is None
    assert vector_threshold(app, "g") == 0.3 and calibrated_gate_for(app, "g", enabled=True) is None
    from cpersona.services.calibration.precision import get_recall_precision

    assert get_recall_precision(app, agent_id="g")["precision"] == "strict"


def test_a_valid_sidecar_is_restored_in_the_background(db, embed_server):
    # spec §5.18.5, SC-5
    insert(db, "g", sessions(16, 5))
    app = gate_app(db, embed_server, RECALL_MODE="rsf")
    before = write_sidecar_file(app)
    task = cal.start_calibration(app)
    task.join(30)
    assert vector_threshold(app, "g") == 0.52 and vector_threshold(app, "other") == 0.41
    found = calibrated_gate_for(app, "g", enabled=True)
    assert (found.threshold, found.signal) == (0.19, "rsf")
    assert json.loads(app.settings.calibration_sidecar.read_text()) == before  # nothing rewritten
    task.stop()


def test_a_stale_sidecar_is_backed_up_and_recalibrated_keeping_the_betas(db, embed_server):
    # spec §5.18.5 (calibrate on model change), SC-5, SC-7
    insert(db, "g", sessions(16, 5))
    insert(db, "c", sessions(60, 1))
    app = gate_app(db, embed_server, RECALL_MODE="rsf")
    reference = write_sidecar_file(
        app, scoring_version="260a7-confidence-gates-nothing", agent_thresholds={"g": 0.99, "gone": 0.7}
    )
    assert cal.startup(app, threading.Event()) == "calibrated 2 agents"
    backups = list(
        app.settings.calibration_sidecar.parent.glob("*.calibration.json.before-260a7-confidence-gates-nothing-*")
    )
    assert len(backups) == 1 and json.loads(backups[0].read_text()) == reference
    stored = json.loads(app.settings.calibration_sidecar.read_text())
    assert stored["scoring_version"] == SCORING_VERSION
    assert stored["agent_thresholds"] == {"g": 0.388, "c": 0.5651}  # measured here, the stale 'gone' dropped
    assert stored["agent_betas"] == {"g": 2.0, "z": 0.5}  # preferences survive
    assert stored["global_threshold"] == 0.5078  # reference figure for the two agents together
    assert stored["agent_fused_gates"].keys() == {"g"} and stored["fused_gate_signal"] == "rsf"
    assert vector_threshold(app, "g") == 0.388


def test_a_stale_sidecar_is_left_alone_when_model_change_calibration_is_off(db, embed_server):
    # spec §5.18.5, SC-5
    insert(db, "g", sessions(16, 5))
    app = gate_app(db, embed_server, RECALL_MODE="rsf", CALIBRATE_ON_MODEL_CHANGE="false")
    before = write_sidecar_file(app, embedding_dim=32)  # measured on another width
    assert cal.startup(app, threading.Event()) == "nothing"
    assert vector_threshold(app, "g") == 0.3 and calibrated_gate_for(app, "g", enabled=True) is None
    assert app.calibration.beta_override("g") == 2.0
    assert json.loads(app.settings.calibration_sidecar.read_text()) == before


@pytest.mark.parametrize(("env", "values"), [
    ({"AUTO_CALIBRATE": "true"}, {}),  # asked for explicitly
    ({}, {"fused_gate_signal": None, "agent_fused_gates": {}}),  # valid, but no gate for the live signal
])  # fmt: skip
def test_a_valid_sidecar_is_recalibrated_when_asked_or_without_a_gate(db, embed_server, env, values):
    # spec §5.18.5
    insert(db, "g", sessions(16, 5))
    app = gate_app(db, embed_server, RECALL_MODE="rsf", **env)
    write_sidecar_file(app, **values)
    assert cal.startup(app, threading.Event()) == "calibrated 1 agents"
    assert vector_threshold(app, "g") == 0.388
    assert calibrated_gate_for(app, "g", enabled=True).signal == "rsf"
    assert app.calibration.beta_override("g") == 2.0


def test_no_sidecar_at_all_calibrates_and_a_stop_request_ends_the_agent_loop(db, embed_server):
    # spec §5.18.5 ("no file")
    insert(db, "a", sessions(4, 5))
    insert(db, "b", sessions(4, 5, seed=8))
    app = gate_app(db, embed_server, RECALL_MODE="rsf")
    stop = threading.Event()
    stop.set()  # the server is shutting down: the global value lands, no agent is started
    assert cal.startup(app, stop) == "calibrated 0 agents"
    stored = json.loads(app.settings.calibration_sidecar.read_text())
    assert stored["global_threshold"] is not None and stored["agent_thresholds"] == {}


def test_an_empty_corpus_has_nothing_to_calibrate(db, embed_server):
    app = gate_app(db, embed_server, RECALL_MODE="rsf")
    assert cal.startup(app, threading.Event()) == "nothing to calibrate"
    assert not app.settings.calibration_sidecar.exists()


def test_over_stdio_calibration_and_precision_survive_a_restart(db_path, embed_server):
    # spec CT-3, SP-2, §5.18.5 through the real server process (cli serve starts the restore)
    import sys
    from pathlib import Path

    from cpersona.storage.engine import open_sqlite
    from cpersona.storage.migrate import upgrade

    database = open_sqlite(db_path)
    upgrade(database)
    insert(database, "g", sessions(16, 5))
    database.close()
    sys.path.insert(0, str(Path(__file__).parent / "e2e"))
    from stdio_harness import RawSession, server_env

    env = server_env(
        db_path,
        CPERSONA_EMBEDDING_MODE="http",
        CPERSONA_EMBEDDING_URL=embed_server.url,
        CPERSONA_RECALL_MODE="rsf",
        CPERSONA_FUSED_GATE_SAMPLE_QUERIES="10",
        CPERSONA_FUSED_GATE_CALIBRATION_DRAWS="2",
        CPERSONA_CALIBRATE_ON_MODEL_CHANGE="false",
    )  # only the tools measure here

    def answer(session, name, arguments):
        reply = session.call(name, json.dumps(arguments), timeout=60)
        return json.loads(reply["result"]["content"][0]["text"])

    first = RawSession(env)
    try:
        first.initialize()
        measured = answer(first, "calibrate_threshold", {"agent_id": "g"})
        assert measured["ok"] and measured["new_threshold"] == 0.388 and measured["sidecar_persisted"]
        assert answer(first, "set_recall_precision", {"agent_id": "g", "precision": "strict"})["ok"]
    finally:
        assert first.close() == 0
    second = RawSession(env)
    try:
        second.initialize()
        # The β is read before serving; the measured values under the calibration lock right after.
        assert answer(second, "get_recall_precision", {"agent_id": "g"})["precision"] == "strict"
        again = answer(second, "calibrate_threshold", {"agent_id": "g", "method": "percentile"})
        assert again["old_threshold"] == 0.388 and again["fused_gate"]["beta"] == 2.0
    finally:
        assert second.close() == 0


def test_the_pseudo_query_pool_is_packed_and_draws_what_the_list_drew(db):
    # spec §5.18.3: the gate's pseudo-queries are a seeded random draw of the agent's embedded
    # memories; the pool is packed (two machine integers a row, not a tuple of an int and a
    # datetime, ~150 bytes: the start-up calibration's peak at 1M rows) and must draw the same.
    import random
    import tracemalloc

    from cpersona.services.calibration import fused_gate
    from cpersona.services.timestamps import parse_iso

    rows = [
        (f"pool row {i}", f"2026-0{1 + i % 9}-1{i % 10}T0{i % 10}:1{i % 7}:0{i % 10}.{i:06d}+0{i % 3}:00")
        for i in range(6000)
    ]
    insert(db, "p", rows)
    insert(db, "p", [("   ", "2026-01-01T00:00:00+00:00"), ("no time", "not a stamp")])  # never pseudo-queries
    app = make_app(db)
    tracemalloc.start()
    try:
        pool = fused_gate._pseudo_query_pool(app, "p")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    with db.read() as session:
        listed = [
            (i, parse_iso(t))
            for i, t in session.query(Memory.id, Memory.timestamp).filter(Memory.agent_id == "p").order_by(Memory.id)
            if parse_iso(t) and i <= len(rows)
        ]
    assert len(pool) == len(listed) == 6000 and list(pool) == listed  # the same (id, moment), in id order
    for k in (40, 5999):
        assert random.Random(3).sample(pool, k) == random.Random(3).sample(listed, k)
    assert peak < 60 * len(rows)  # bytes a row; the list of tuples took ~300 (fetched rows, then tuples)
