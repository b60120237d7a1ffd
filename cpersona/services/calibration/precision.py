"""set_recall_precision / get_recall_precision: an agent's β, "knob 3" (spec §3.12, §3.13).

β is the specificity weight of the gate's separation objective
TPR + β·(1 − FPR): a larger β sets the gate higher. The gate threshold is
precomputed at one β, so precision is a per-agent setting that recalibrates
once when it changes, not a per-recall argument (SP-6).

A β is only ever stored beside a gate measured at that β: the change is
adopted when the recalibration and the sidecar write both succeed, and
otherwise everything stays as it was (SP-3, SP-4).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cpersona.config import GATE_BETA
from cpersona.services.app import App
from cpersona.services.calibration.service import apply, defaults_for, effective_beta, measure
from cpersona.services.calibration.sidecar import Entry
from cpersona.services.requests import Request
from cpersona.services.responses import ToolFailure, answers_refusals, failure


def label_of(beta: float) -> str:
    """``strict`` / ``balanced`` / ``lenient`` for exactly 2.0 / 1.0 / 0.5, else ``custom``."""
    for name, value in GATE_BETA.items():
        if beta == value:
            return name
    return "custom"


def _agent(agent_id: Any) -> str:
    if not isinstance(agent_id, str):
        raise ToolFailure("agent_id is required")
    return _named(agent_id)


def _named(agent_id: str) -> str:
    if not agent_id:
        raise ToolFailure("agent_id is required")
    return agent_id


@dataclass(frozen=True)
class PrecisionUpdateArguments(Request):
    """``set_recall_precision``'s arguments in the types its schema declares; defaults are the schema's."""

    agent_id: str
    precision: str = ""
    beta: float = 0
    session_key: str = ""  # selects the pause bucket; the facade's pause gate reads it


def checked_update(agent_id: Any, precision: Any, beta: Any) -> PrecisionUpdateArguments:
    """A library caller's arguments checked as the tool's schema checks a tool call's (null: the default)."""
    agent = _agent(agent_id)
    if beta is None:
        beta = 0
    if isinstance(beta, bool) or not isinstance(beta, (int, float)):
        raise ToolFailure(f"beta must be a number, got {beta!r}")
    if precision is None:
        precision = ""
    if not isinstance(precision, str):
        raise ToolFailure(f"precision must be a string, got {precision!r}")
    return PrecisionUpdateArguments(agent_id=agent, precision=precision, beta=beta)


def resolve(app: App, args: PrecisionUpdateArguments) -> tuple[str, float, bool]:
    """(label, β, cleared) from the arguments (spec §3.12 resolution)."""
    beta = args.beta
    if not math.isfinite(beta):
        raise ToolFailure(f"beta must be a finite number, got {beta}")
    if beta > 0:  # a raw β wins over any named level
        return label_of(float(beta)), float(beta), False
    if args.precision:
        named = GATE_BETA.get(args.precision.lower())
        if named is None:
            raise ToolFailure(f"Unknown precision {args.precision!r}; expected strict / balanced / lenient")
        return args.precision.lower(), named, False
    return "default", app.settings.gate_beta, True


@answers_refusals
def set_recall_precision(
    app: App, *, agent_id: Any = None, precision: Any = "", beta: Any = 0, session_key: Any = ""
) -> dict[str, Any]:
    """:func:`answer_set_recall_precision` for a library caller, whose arguments no schema has checked."""
    return answer_set_recall_precision.raises(app, checked_update(agent_id, precision, beta))


@answers_refusals
def answer_set_recall_precision(app: App, args: PrecisionUpdateArguments) -> dict[str, Any]:
    """Set (or clear) the agent's β and recalibrate its gate at it in one step (SP-1..SP-6)."""
    agent = _named(args.agent_id)
    label, value, cleared = resolve(app, args)
    shape = {"agent_id": agent, "precision": label, "beta": value, "cleared": cleared}
    state = app.calibration
    with state.run_lock:
        previous_beta = effective_beta(app, agent)
        held_gate = state.agent_gate(agent)
        try:
            m = measure(app, defaults_for(app, agent), beta=value, rng=state.rng)
        except ToolFailure as refusal:
            return failure(refusal.message, **shape)
        if m.gate is None and held_gate is not None and previous_beta != value:
            return failure(
                f"no quality gate could be measured at beta {value}, and the agent's current gate was "
                f"measured at beta {previous_beta}; precision left unchanged (too few same-session "
                "memories, or no gate for this recall mode)",
                **shape,
            )
        captured = state.capture()
        beta_entry: dict[Entry, float | None] = {("agent_betas", agent): None if cleared else value}
        try:
            apply(app, m, beta_entry)
        except ToolFailure as refusal:
            state.rollback(captured)
            return failure(refusal.message, **shape)
        written = state.persist(app.settings)
        if not written.ok:
            state.rollback(captured)  # SP-3: a β that is not on disk is not adopted
            return failure(
                f"the calibration sidecar could not be written ({written.error}); precision left unchanged", **shape
            )
    return {
        "ok": True,
        **shape,
        "fused_gate": m.gate.as_response() if m.gate is not None else None,
        "calibrate": {"ok": True, "scope": "per_agent", "new_threshold": m.new_threshold},
    }


@dataclass(frozen=True)
class PrecisionArguments(Request):
    """``get_recall_precision``'s arguments in the types its schema declares."""

    agent_id: str


@answers_refusals
def get_recall_precision(app: App, *, agent_id: Any = None) -> dict[str, Any]:
    """:func:`answer_get_recall_precision` for a library caller, whose arguments no schema has checked."""
    return answer_get_recall_precision.raises(app, PrecisionArguments(agent_id=_agent(agent_id)))


@answers_refusals
def answer_get_recall_precision(app: App, args: PrecisionArguments) -> dict[str, Any]:
    """The agent's effective β and where it comes from (spec §3.13, GRP-1). Never writes."""
    agent = _named(args.agent_id)
    override = app.calibration.beta_override(agent)
    glob = app.settings.gate_beta
    beta = override if override is not None else glob
    return {
        "ok": True, "agent_id": agent, "precision": label_of(beta), "beta": beta,
        "overridden": override is not None, "global_precision": label_of(glob), "global_beta": glob,
    }  # fmt: skip


def paused_precision_body(app: App, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``set_recall_precision``'s answer under a pause: the resolved setting, nothing recalibrated.

    Arguments are resolved first (spec §9.5), so a bad precision is still refused.
    """
    args = PrecisionUpdateArguments.from_arguments(arguments)  # validated by the schema
    agent = _named(args.agent_id)
    label, beta, cleared = resolve(app, args)
    return {
        "ok": True,
        "agent_id": agent,
        "precision": label,
        "beta": beta,
        "cleared": cleared,
        "fused_gate": None,
        "calibrate": None,
    }
