"""calibrate_threshold: place the vector threshold (and an agent's gate) from the corpus itself.

What it measures (spec §3.11, §5.18):

1. A random sample of embedded memories — the agent's, or every agent's for
   the global threshold (``agent_id`` ''), at most ``CPERSONA_CALIBRATE_MAX_SAMPLE``.
2. The null distribution: dot products of every pair in the sample. Random
   pairs are unrelated almost surely, so a useful threshold sits above most of it.
3. The threshold by ``separation`` (null vs rows written minutes apart, or
   nearest neighbours when the corpus has too few of those), ``percentile``
   of the null, or ``zscore`` (mean + z·std), floored and rounded.
4. For an agent, the post-fusion quality gate at the agent's β (:mod:`fused_gate`).

The result is applied at once and persisted to the sidecar; a measurement
that fails changes nothing. Everything here runs in a worker thread: the
facade never calls it on the event loop.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cpersona.embedding.vectors import VectorError, from_blob
from cpersona.services.calibration import statistics as cm
from cpersona.services.app import App
from cpersona.services.calibration.sidecar import Entry, read_sidecar, scoring_version
from cpersona.services.calibration.state import CalibrationState, restore_preferences
from cpersona.services.calibration.fused_gate import GateMeasurement, gate_signal, measure_gate
from cpersona.services.recall.retrievers import vector_threshold
from cpersona.services.requests import Request
from cpersona.services.responses import ToolFailure, answers_refusals
from cpersona.services.timestamps import parse_iso
from cpersona.storage.engine import trim_heap
from cpersona.storage.repositories.memories import MemoryRepository
from cpersona.storage.scope import Scope

__all__ = ["answer_calibrate_threshold", "calibrate_threshold", "measure", "start_calibration", "vector_threshold"]

log = logging.getLogger(__name__)

MIN_EMBEDDINGS = 10
MIN_TEMPORAL_PAIRS = 10
Z_FACTOR_BOUND = 10.0
METHODS = ("separation", "percentile", "zscore")


# -- arguments ---------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationRequest:
    agent_id: str
    sample_size: int
    z_factor: float
    method: str
    percentile: float

    @property
    def scope(self) -> Scope:
        return Scope(agent_id=self.agent_id) if self.agent_id else Scope()


@dataclass(frozen=True)
class CalibrationArguments(Request):
    """``calibrate_threshold``'s arguments in the types its schema declares; omitted (or 0) means the setting."""

    agent_id: str  # '' = the global threshold
    sample_size: int | None = None
    z_factor: float | None = None
    method: str | None = None
    percentile: float | None = None
    session_key: str = ""  # selects the pause bucket; the facade's pause gate reads it


def checked_arguments(
    agent_id: Any, sample_size: Any = None, z_factor: Any = None, method: Any = None, percentile: Any = None
) -> CalibrationArguments:
    """A library caller's arguments checked as the tool's schema checks a tool call's; ToolFailure if not."""
    if not isinstance(agent_id, str):
        raise ToolFailure("agent_id is required ('' calibrates the global threshold)")
    if isinstance(sample_size, float) and sample_size.is_integer():
        sample_size = int(sample_size)
    if sample_size is not None and (isinstance(sample_size, bool) or not isinstance(sample_size, int)):
        raise ToolFailure(f"sample_size must be an integer, got {sample_size!r}")
    for name, value in (("z_factor", z_factor), ("percentile", percentile)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ToolFailure(f"{name} must be a number, got {value!r}")
    if method is not None and not isinstance(method, str):
        raise ToolFailure(f"method must be one of {', '.join(METHODS)}")
    return CalibrationArguments(agent_id, sample_size, z_factor, method, percentile)


def _finite(name: str, value: float | None) -> float | None:
    """None when absent or zero (the schema's "use the default"); the value otherwise, which must be finite."""
    if value is None or value == 0:
        return None
    if not math.isfinite(value):
        raise ToolFailure(f"{name} must be a finite number, got {value}")
    return float(value)


def calibration_request(app: App, args: CalibrationArguments) -> CalibrationRequest:
    """What the arguments ask for (spec §3.11 table): the settings fill what is left out, bounds clamp."""
    settings = app.settings
    size = args.sample_size or settings.calibrate_sample_size
    size = max(1, min(size, settings.calibrate_max_sample))
    z = _finite("z_factor", args.z_factor)
    z = settings.calibrate_z_factor if z is None else z
    z = max(-Z_FACTOR_BOUND, min(Z_FACTOR_BOUND, z))
    chosen = args.method or settings.calibrate_method
    if chosen not in METHODS:
        raise ToolFailure(f"Unknown method {chosen!r}; expected one of {', '.join(METHODS)}")
    pct = _finite("percentile", args.percentile)
    pct = settings.calibrate_percentile if pct is None else pct
    if 1 < pct <= 100:
        pct /= 100  # read as a percent (95 → 0.95)
    if not 0 < pct <= 1:
        raise ToolFailure(f"percentile must be in (0, 1] (or a percent 1-100), got {float(args.percentile)}")
    return CalibrationRequest(args.agent_id, size, z, chosen, pct)


def defaults_for(app: App, agent_id: str) -> CalibrationRequest:
    """A calibration of ``agent_id`` ('' = global) with every argument left to the settings."""
    return calibration_request(app, CalibrationArguments(agent_id))


# -- the sample ------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    vectors: np.ndarray  # n × width, float64
    width: int


def draw_sample(app: App, scope: Scope, size: int, rng: Any) -> Sample:
    """Up to ``size`` random embedded memories of the scope, of one width (spec §5.18.1)."""
    with app.db.read() as session:
        ids = MemoryRepository(session, scope).embedded_ids()
    if len(ids) < MIN_EMBEDDINGS:
        raise ToolFailure(f"Need at least {MIN_EMBEDDINGS} embeddings, found {len(ids)}")
    chosen = sorted(rng.sample(ids, min(size, len(ids))))  # the same draw as from a list of the same ids
    if len(chosen) < MIN_EMBEDDINGS:
        raise ToolFailure(f"Need at least {MIN_EMBEDDINGS} embeddings, found {len(chosen)}")
    vectors = _read_vectors(app, chosen)
    by_width = Counter(v.size for v in vectors)
    width = max(by_width.items(), key=lambda kv: (kv[1], kv[0]))[0] if by_width else 0  # ties: the wider
    same = [v for v in vectors if v.size == width]
    if len(same) < MIN_EMBEDDINGS:
        raise ToolFailure(f"Need at least {MIN_EMBEDDINGS} same-dimension embeddings, found {len(same)}")
    return Sample(np.vstack(same).astype(np.float64), width)


def _read_vectors(app: App, ids: list[int]) -> list[np.ndarray]:
    """Decoded vectors of ``ids``; a corrupt blob (odd length, NaN/Inf) is left out."""
    return [vector for vector in _read_vectors_by_id(app, ids) if vector is not None]


def temporal_positives(app: App, scope: Scope, width: int, size: int, window_minutes: float) -> np.ndarray:
    """Cosines of time-adjacent pairs among the scope's newest ``size`` rows (spec §5.18.2).

    Rows written within the window of each other are almost always one
    conversation, so their similarity is what related text looks like here.
    """
    with app.db.read() as session:
        stamped = MemoryRepository(session, scope).embedded_stamps(width)
        # The newest ``size`` by (moment, id), kept as the rows stream (equal stamps: insertion order);
        # the same rows, in the same ascending order, as sorting every row and keeping the tail.
        timed = ((moment, mid) for mid, stamp in stamped if (moment := parse_iso(stamp)) is not None)
        newest = heapq.nlargest(size, timed)[::-1] if size > 0 else sorted(timed)  # [-0:] kept every row
    if len(newest) < 2:
        return np.empty(0)
    vectors = dict(zip([mid for _, mid in newest], _read_vectors_by_id(app, [mid for _, mid in newest])))
    window = window_minutes * 60.0
    sims = []
    for (t0, a), (t1, b) in zip(newest, newest[1:]):
        if (t1 - t0).total_seconds() <= window and vectors.get(a) is not None and vectors.get(b) is not None:
            pair = cm.unit_rows(np.vstack([vectors[a], vectors[b]]).astype(np.float64))
            sims.append(float(pair[0] @ pair[1]))
    return np.asarray(sims, dtype=np.float64)


def _read_vectors_by_id(app: App, ids: list[int]) -> list[np.ndarray | None]:
    """Decoded vectors of ``ids`` in their order; None where a blob is corrupt (odd length, NaN/Inf)."""
    found: dict[int, np.ndarray] = {}
    with app.db.read() as session:
        for mid, blob in MemoryRepository(session).embeddings(sorted(ids)):
            try:
                found[mid] = from_blob(blob)
            except (VectorError, TypeError):
                continue
    return [found.get(i) for i in ids]


def corpus_width(app: App) -> int | None:
    """The modal vector width of every agent's memories (ties: the wider), or None."""
    with app.db.read() as session:
        n = MemoryRepository(session).modal_vector_bytes()
    return None if not n or n % 4 else int(n) // 4


# -- measuring ------------------------------------------------------------------------


@dataclass
class Measurement:
    """One calibration's findings, not yet applied."""

    request: CalibrationRequest
    sampled: int
    num_pairs: int
    width: int
    distribution: dict[str, float]
    null_admit_rate: float
    new_threshold: float
    separation: dict[str, Any] = field(default_factory=dict)  # proxy_source, youden_j, pos_*
    gate: GateMeasurement | None = None


def embedding_model_label(settings: Any) -> str:
    """The model name calibration reports: known only in api mode or when configured (spec CT-5)."""
    if settings.embedding_mode == "api" or settings.embedding_model_configured:
        return settings.embedding_model
    return ""


def measure(app: App, req: CalibrationRequest, *, beta: float | None, rng: Any) -> Measurement:
    """Sample, compute the threshold and (for an agent) the gate at ``beta``. Changes nothing."""
    settings = app.settings
    sample = draw_sample(app, req.scope, req.sample_size, rng)
    null = cm.null_pairs(sample.vectors)
    values = null.sorted_values
    separation: dict[str, Any] = {}
    if req.method == "percentile":
        raw = cm.quantile(values, req.percentile)
    elif req.method == "zscore":
        stats = values.astype(np.float64)
        raw = float(stats.mean() + req.z_factor * stats.std())
    else:
        positives = temporal_positives(
            app, req.scope, sample.width, req.sample_size, settings.calibrate_temporal_window_min
        )
        source = "temporal"
        if positives.size < MIN_TEMPORAL_PAIRS:
            positives, source = null.nearest, "nn_fallback"
        positives = np.sort(positives)
        sweep = cm.separation_sweep(positives, values, 1.0)  # β = 1 for the vector threshold
        raw = sweep.threshold
        separation = {"proxy_source": source, "youden_j": round(sweep.youden_j, 4), "positives": positives}
    threshold = round(max(raw, settings.calibrate_floor), 4)
    if threshold > 1.0:
        detail = {"zscore": f", z_factor={req.z_factor}", "percentile": f", percentile={req.percentile}"}
        raise ToolFailure(
            f"the computed threshold {round(raw, 4)} is above 1.0, the largest possible cosine similarity "
            f"(method={req.method}{detail.get(req.method, '')}); nothing was changed. "
            + ("Use a smaller z_factor." if req.method == "zscore" else "Try method='separation'.")
        )
    if separation:
        positives = separation.pop("positives")
        separation["pos_admit_rate"] = round(cm.admit_rate(positives, threshold), 4)
        separation["pos_mean"] = round(cm.mean(positives), 4)
    gate = None
    if req.agent_id:
        effective = beta if beta is not None else effective_beta(app, req.agent_id)
        gate = measure_gate(app, req.agent_id, effective, rng)
    return Measurement(
        request=req, sampled=int(sample.vectors.shape[0]), num_pairs=null.count, width=sample.width,
        distribution=cm.describe(values), null_admit_rate=round(cm.admit_rate(values, threshold), 4),
        new_threshold=threshold, separation=separation, gate=gate,
    )  # fmt: skip


def effective_beta(app: App, agent_id: str) -> float:
    """The agent's own β if it has one, else the global ``CPERSONA_FUSED_GATE_BETA`` (spec §5.18.4)."""
    override = app.calibration.beta_override(agent_id)
    return override if override is not None else app.settings.gate_beta


def changes_of(m: Measurement) -> dict[Entry, float | None]:
    """The sidecar entries a measurement sets (a gate only when one was measured, CT-4)."""
    agent = m.request.agent_id
    changes: dict[Entry, float | None] = {}
    if agent:
        changes[("agent_thresholds", agent)] = m.new_threshold
        if m.gate is not None:
            changes[("agent_fused_gates", agent)] = m.gate.chosen.threshold
    else:
        changes[("global_threshold", "")] = m.new_threshold
    return changes


def apply(app: App, m: Measurement, extra: dict[Entry, float | None] | None = None) -> None:
    """Put a measurement in force (and any ``extra`` entries, e.g. a β) in one step."""
    state = app.calibration
    if m.request.agent_id and not _has_embedded(app, m.request.agent_id):
        raise ToolFailure(
            f"the memories of agent {m.request.agent_id!r} were deleted while it was being "
            "calibrated; nothing was changed"
        )
    state.apply(
        {**changes_of(m), **(extra or {})},
        embedding_dim=corpus_width(app) or m.width,
        embedding_model=embedding_model_label(app.settings),
        gate_signal=m.gate.signal if m.gate is not None else None,
    )


def _has_embedded(app: App, agent_id: str) -> bool:
    with app.db.read() as session:
        return MemoryRepository(session).has_embedded(agent_id)


def response(app: App, m: Measurement, *, old_threshold: float, persisted: bool) -> dict[str, Any]:
    req = m.request
    out: dict[str, Any] = {
        "ok": True, "sidecar_persisted": persisted, "scope": "per_agent" if req.agent_id else "global",
        "agent_id": req.agent_id, "sampled_embeddings": m.sampled, "num_pairs": m.num_pairs,
        "method": req.method, "z_factor": req.z_factor, "percentile": req.percentile,
        "embedding_dim": m.width, "embedding_model": embedding_model_label(app.settings),
        "distribution": m.distribution, "null_admit_rate": m.null_admit_rate,
        "old_threshold": old_threshold, "new_threshold": m.new_threshold,
    }  # fmt: skip
    out.update(m.separation)
    if m.gate is not None:
        out["fused_gate"] = m.gate.as_response()
    return out


def current_threshold(app: App, agent_id: str) -> float:
    """What the scope's threshold is before this run (the response's ``old_threshold``)."""
    if agent_id:
        return vector_threshold(app, agent_id)
    value = app.calibration.global_threshold()
    return value if value is not None else float(app.settings.vector_min_similarity)


# -- the tool --------------------------------------------------------------------------


@answers_refusals
def calibrate_threshold(
    app: App,
    *,
    agent_id: Any = None,
    sample_size: Any = None,
    z_factor: Any = None,
    method: Any = None,
    percentile: Any = None,
    session_key: Any = "",
) -> dict[str, Any]:
    """:func:`answer_calibrate_threshold` for a library caller, whose arguments no schema has checked."""
    args = checked_arguments(agent_id, sample_size, z_factor, method, percentile)
    return answer_calibrate_threshold.raises(app, args)


@answers_refusals
def answer_calibrate_threshold(app: App, args: CalibrationArguments) -> dict[str, Any]:
    """The ``calibrate_threshold`` tool (spec §3.11, CT-1..CT-5)."""
    state = app.calibration
    req = calibration_request(app, args)
    with state.run_lock:
        old = current_threshold(app, req.agent_id)
        m = measure(app, req, beta=None, rng=state.rng)
        apply(app, m)
        written = state.persist(app.settings)
    return response(app, m, old_threshold=old, persisted=written.ok)


# -- start-up ------------------------------------------------------------------------


class StartupCalibration:
    """The background start-up work (spec §5.18.5); ``stop()`` before closing the database."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpersona-calibration", daemon=True)

    def start(self) -> StartupCalibration:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            with self.app.db.background():  # off the serving connections and their caches
                startup(self.app, self._stop)
        except Exception:  # noqa: BLE001 - a failed calibration must never take the server down
            log.exception("start-up calibration failed; recall uses the configured thresholds")
        trim_heap()  # the sample, the null pairs and the pseudo-query recalls are freed by now


def start_calibration(app: App) -> StartupCalibration | None:
    """Restore the sidecar, and recalibrate when it is stale or asked to, off the serving path.

    The per-agent betas (preferences, not measurements) are read at once. In
    mode ``none`` no vector arm or gate runs, so that is all; otherwise the
    measured values are restored or re-measured in a background thread, and
    recall uses the configured threshold and the heuristic gate until they land.
    """
    restore_preferences(app)  # in force before the first call, whatever follows
    return start_measurement(app)


def start_measurement(app: App) -> StartupCalibration | None:
    """The background half of :func:`start_calibration`: restore or re-measure the thresholds."""
    if app.settings.embedding_mode == "none":
        return None
    return StartupCalibration(app).start()


def startup(app: App, stop: threading.Event) -> str:
    """Restore or recalibrate; returns what it did (for logs and tests)."""
    settings = app.settings
    state = app.calibration
    with state.run_lock:  # a calibration asked for meanwhile starts from the restored values
        stored = read_sidecar(settings.calibration_sidecar)
        width = corpus_width(app)
        fingerprint = scoring_version(settings)
        valid = stored.values is not None and stored.values.matches(width, fingerprint)
        if stored.values is not None:
            state.restore(stored.values, measured=valid)
    if stored.status == "unreadable":
        log.warning("calibration sidecar unreadable (%s)", stored.error)
    live_signal = gate_signal(settings) if settings.fused_gate_enabled else None
    gate_missing = valid and live_signal is not None and stored.values.fused_gate_signal != live_signal
    if settings.auto_calibrate or gate_missing:
        reason = "auto" if settings.auto_calibrate else "no gate for the live signal"
    elif settings.calibrate_on_model_change and not valid:
        reason = {"missing": "no sidecar", "unreadable": "unreadable sidecar"}.get(stored.status, "stale sidecar")
    else:
        return "restored" if valid else "nothing"
    if width is None:
        return "nothing to calibrate"
    log.info("calibrating at start-up (%s)", reason)
    return calibrate_everything(app, stop)


def calibrate_everything(app: App, stop: threading.Event) -> str:
    """The global threshold, then (if it worked) every agent with embedded memories."""
    state = app.calibration
    settings = app.settings
    defaults = defaults_for(app, "")
    try:
        with state.run_lock:
            m = measure(app, defaults, beta=None, rng=state.rng)
            apply(app, m)
            state.persist(settings)
    except ToolFailure as failure:
        log.info("global calibration skipped: %s", failure.message)
        return "global failed"
    with app.db.read() as session:
        agents = MemoryRepository(session).embedded_agents()
    done = 0
    for agent in agents:
        if stop.is_set():
            break
        if not agent:
            continue  # '' is the global scope's name, not an agent's
        try:
            with state.run_lock:
                m = measure(app, defaults_for(app, agent), beta=None, rng=state.rng)
                apply(app, m)
                state.persist(settings)
            done += 1
        except ToolFailure as failure:
            log.info("calibration of agent %r skipped: %s", agent, failure.message)
    return f"calibrated {done} agents"


def install(app: App, *, seed: int | None = None) -> CalibrationState:
    """A fresh state on ``app`` (tests use a seed for repeatable samples)."""
    state = CalibrationState(seed=seed)
    app.calibration = state
    return state


def paused_calibration_body(app: App, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``calibrate_threshold``'s success shape under a pause: all a measurement computes left empty (§9.5)."""
    req = calibration_request(app, CalibrationArguments.from_arguments(arguments))  # validated by the schema
    return {
        "ok": True,
        "sidecar_persisted": False,
        "scope": "per_agent" if req.agent_id else "global",
        "agent_id": req.agent_id,
        "sampled_embeddings": 0,
        "num_pairs": 0,
        "method": req.method,
        "z_factor": req.z_factor,
        "percentile": req.percentile,
        "embedding_dim": None,
        "embedding_model": embedding_model_label(app.settings),
        "distribution": None,
        "null_admit_rate": None,
        "old_threshold": current_threshold(app, req.agent_id),
        "new_threshold": None,
    }
