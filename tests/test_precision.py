"""set_recall_precision / get_recall_precision on real databases (spec §3.12, §3.13, SP-1..SP-6, GRP-1)."""

from __future__ import annotations

import json
import math

import pytest
from calibration_corpus import insert, sessions
from conftest import make_app

from cpersona.embedding.client import build_embedder
from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.tools import default_registry
from cpersona.services.calibration.service import calibrate_threshold, install, vector_threshold
from cpersona.services.recall.gate import calibrated_gate_for
from cpersona.services.calibration.precision import get_recall_precision, label_of, set_recall_precision

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

FAST = {"FUSED_GATE_SAMPLE_QUERIES": "10", "FUSED_GATE_CALIBRATION_DRAWS": "2"}  # each query is an HTTP round trip


@pytest.fixture
def app(db):
    app = make_app(db)
    install(app, seed=2)
    return app


def gate_app(db, embed_server, state=None, **env):
    app = make_app(db, EMBEDDING_MODE="http", EMBEDDING_URL=embed_server.url, **{"RECALL_MODE": "rsf", **FAST, **env})
    app.embedder = build_embedder(app.settings)
    if state is None:
        install(app, seed=9)
    else:
        app.calibration = state
    return app


def sidecar(app) -> dict:
    return json.loads(app.settings.calibration_sidecar.read_text())


# -- resolution and bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(("arguments", "expected"), [
    ({"agent_id": ""}, {"ok": False, "error": "agent_id is required"}),
    ({"agent_id": "a", "precision": "bogus"},
     {"ok": False, "error": "Unknown precision 'bogus'; expected strict / balanced / lenient"}),
    ({"agent_id": "a", "precision": " strict "},
     {"ok": False, "error": "Unknown precision ' strict '; expected strict / balanced / lenient"}),
    ({"agent_id": "a", "precision": "custom"},
     {"ok": False, "error": "Unknown precision 'custom'; expected strict / balanced / lenient"}),
    ({"agent_id": "a", "beta": math.inf}, {"ok": False, "error": "beta must be a finite number, got inf"}),
    ({"agent_id": "a", "beta": math.nan}, {"ok": False, "error": "beta must be a finite number, got nan"}),
])  # fmt: skip
def test_invalid_input_is_refused_without_a_calibration(app, arguments, expected):
    # spec SP-5, §3.12 ("invalid input {ok:false, error}")
    assert set_recall_precision(app, **arguments) == expected
    assert not app.settings.calibration_sidecar.exists()


@pytest.mark.parametrize(("precision", "beta", "expected"), [
    ("strict", 0, ("strict", 2.0, False)),
    ("STRICT", 0, ("strict", 2.0, False)),
    ("lenient", -1, ("lenient", 0.5, False)),
    ("bogus", 3, ("custom", 3.0, False)),  # a raw β wins and the name is not even read
    ("", 2.0, ("strict", 2.0, False)),  # a raw β equal to a level takes its name
    ("", 2.0000001, ("custom", 2.0000001, False)),
    ("", 0, ("default", 1.0, True)),  # clearing: back to the global β
    ("", -5, ("default", 1.0, True)),
])  # fmt: skip
def test_resolution_of_precision_and_beta(app, precision, beta, expected):
    # spec §3.12 resolution [S]; with no embeddings the failure shape still carries the resolution
    answer = set_recall_precision(app, agent_id="a", precision=precision, beta=beta)
    assert (answer["precision"], answer["beta"], answer["cleared"]) == expected
    assert answer["ok"] is False and answer["error"] == "Need at least 10 embeddings, found 0"


def test_labels():
    assert [label_of(b) for b in (2.0, 1.0, 0.5, 3.0, 1.5)] == ["strict", "balanced", "lenient", "custom", "custom"]


# -- SP-3: needs a calibration that succeeds -----------------------------------------------------------


def test_without_embeddings_the_beta_is_not_adopted(app, db):
    # spec SP-3, §6 item 14
    insert(db, "a", sessions(1, 9))  # 9 embedded memories: one too few
    answer = set_recall_precision(app, agent_id="a", precision="strict")
    assert answer == {
        "ok": False,
        "agent_id": "a",
        "precision": "strict",
        "beta": 2.0,
        "cleared": False,
        "error": "Need at least 10 embeddings, found 9",
    }
    assert get_recall_precision(app, agent_id="a")["overridden"] is False
    assert not app.settings.calibration_sidecar.exists()


def test_a_failed_sidecar_write_keeps_the_previous_beta_gate_and_threshold(db, embed_server):
    # spec SP-3: adopted only if the calibration AND the sidecar write succeeded
    insert(db, "g", sessions(16, 5))
    app = gate_app(db, embed_server)
    assert set_recall_precision(app, agent_id="g", precision="lenient")["ok"] is True
    state = app.calibration
    before = (state.beta_override("g"), state.agent_gate("g"), vector_threshold(app, "g"))
    path = app.settings.calibration_sidecar
    path.unlink()
    path.mkdir()  # the next write cannot replace a directory
    answer = set_recall_precision(app, agent_id="g", precision="strict")
    assert answer["ok"] is False and answer["precision"] == "strict" and "could not be written" in answer["error"]
    assert (state.beta_override("g"), state.agent_gate("g"), vector_threshold(app, "g")) == before
    assert get_recall_precision(app, agent_id="g")["precision"] == "lenient"


# -- SP-1, SP-2, GRP-1: success --------------------------------------------------------------------------


def test_setting_precision_recalibrates_the_gate_at_the_new_beta_and_persists_both(db, embed_server):
    # spec SP-1, SP-2, SP-6, GRP-1, §5.18.4
    insert(db, "g", sessions(16, 5))
    app = gate_app(db, embed_server)
    answer = set_recall_precision(app, agent_id="g", precision="strict")
    assert answer["ok"] is True and (answer["precision"], answer["beta"], answer["cleared"]) == ("strict", 2.0, False)
    assert answer["fused_gate"]["beta"] == 2.0 and answer["fused_gate"]["signal"] == "rsf"
    assert answer["calibrate"] == {"ok": True, "scope": "per_agent", "new_threshold": 0.388}
    gate = calibrated_gate_for(app, "g", enabled=True)
    assert gate.threshold == answer["fused_gate"]["threshold"]  # live without restart
    stored = sidecar(app)
    assert stored["agent_betas"] == {"g": 2.0} and stored["agent_fused_gates"] == {"g": gate.threshold}
    assert get_recall_precision(app, agent_id="g") == {
        "ok": True,
        "agent_id": "g",
        "precision": "strict",
        "beta": 2.0,
        "overridden": True,
        "global_precision": "balanced",
        "global_beta": 1.0,
    }
    # A later calibrate_threshold measures the gate at the agent's own β (spec CT-4).
    assert calibrate_threshold(app, agent_id="g")["fused_gate"]["beta"] == 2.0
    assert set_recall_precision(app, agent_id="g", beta=3)["precision"] == "custom"
    assert get_recall_precision(app, agent_id="g")["precision"] == "custom"  # GRP-1: 3.0 reads back custom
    assert get_recall_precision(app, agent_id="other")["overridden"] is False  # SP-6: per agent


def test_clearing_returns_to_the_global_beta_and_drops_the_entry(db, embed_server):
    # spec §3.12 (clearing), SC-2 agent_betas
    insert(db, "g", sessions(16, 5))
    app = gate_app(db, embed_server, RECALL_PRECISION="strict")
    set_recall_precision(app, agent_id="g", precision="lenient")
    assert sidecar(app)["agent_betas"] == {"g": 0.5}
    answer = set_recall_precision(app, agent_id="g")
    assert answer["ok"] is True and (answer["precision"], answer["beta"], answer["cleared"]) == ("default", 2.0, True)
    assert answer["fused_gate"]["beta"] == 2.0  # measured at the global β
    assert sidecar(app)["agent_betas"] == {}
    assert get_recall_precision(app, agent_id="g") == {
        "ok": True,
        "agent_id": "g",
        "precision": "strict",
        "beta": 2.0,
        "overridden": False,
        "global_precision": "strict",
        "global_beta": 2.0,
    }


def test_an_agent_without_sessions_can_set_precision_with_no_gate(db, embed_server):
    # Reference run: 60 memories a day apart → fused_gate null, precision stored.
    insert(db, "c", sessions(60, 1))
    app = gate_app(db, embed_server)
    answer = set_recall_precision(app, agent_id="c", beta=2)
    assert answer == {
        "ok": True,
        "agent_id": "c",
        "precision": "strict",
        "beta": 2.0,
        "cleared": False,
        "fused_gate": None,
        "calibrate": {"ok": True, "scope": "per_agent", "new_threshold": 0.5651},
    }
    assert sidecar(app)["agent_betas"] == {"c": 2.0}


# -- SP-4: never a β beside a gate measured at another β --------------------------------------------------


def test_no_gate_at_the_new_beta_while_holding_one_at_the_old_is_refused(db, embed_server):
    # spec SP-4
    insert(db, "g", sessions(16, 5))
    app = gate_app(db, embed_server)
    assert set_recall_precision(app, agent_id="g", precision="lenient")["ok"]
    state = app.calibration
    held = state.agent_gate("g")
    cascade = gate_app(db, embed_server, state=state, RECALL_MODE="cascade")  # no gate can be measured here
    answer = set_recall_precision(cascade, agent_id="g", precision="strict")
    assert answer["ok"] is False and (answer["precision"], answer["beta"]) == ("strict", 2.0)
    assert "beta 0.5" in answer["error"]
    assert state.beta_override("g") == 0.5 and state.agent_gate("g") == held
    assert sidecar(app)["agent_betas"] == {"g": 0.5}
    # The same β again is no contradiction: it is accepted and the gate stays (spec CT-4).
    assert set_recall_precision(cascade, agent_id="g", precision="lenient")["ok"] is True
    assert state.agent_gate("g") == held


# -- get_recall_precision ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "expected"), [
    ({}, ("balanced", 1.0)),
    ({"RECALL_PRECISION": "lenient"}, ("lenient", 0.5)),
    ({"RECALL_PRECISION": "lenient", "FUSED_GATE_BETA": "3"}, ("custom", 3.0)),
    ({"FUSED_GATE_BETA": "2"}, ("strict", 2.0)),
])  # fmt: skip
def test_global_precision_comes_from_the_settings(db, env, expected):
    # spec §3.13, §5.18.4
    app = make_app(db, **env)
    answer = get_recall_precision(app, agent_id="a")
    assert (answer["global_precision"], answer["global_beta"]) == expected
    assert (answer["precision"], answer["beta"], answer["overridden"]) == (*expected, False)


def test_get_never_writes_and_refuses_the_empty_agent(app):
    # spec §3.13
    assert get_recall_precision(app, agent_id="") == {"ok": False, "error": "agent_id is required"}
    get_recall_precision(app, agent_id="a")
    assert not app.settings.calibration_sidecar.exists()


@pytest.mark.anyio
async def test_facade_declarations_and_calls(app):
    registry, gates = default_registry(), GateChain([])
    for name in ("set_recall_precision", "get_recall_precision"):
        missing = await call_tool(app, registry, gates, name, {})
        assert missing.is_error and "'agent_id' is a required property" in missing.payload["error"]
    bad = await call_tool(app, registry, gates, "set_recall_precision", {"agent_id": "a", "beta": "high"})
    assert bad.is_error
    read = await call_tool(app, registry, gates, "get_recall_precision", {"agent_id": "a", "unknown": 1})
    assert read.payload["precision"] == "balanced"
    assert registry.get("get_recall_precision").annotations.read_only is True
    assert registry.get("set_recall_precision").annotations.idempotent is False
