"""Measuring an agent's post-fusion quality gate (spec §5.18.3).

The gate is a threshold on the very score the gate judges rows by (GATE-5), so
it is measured by running recall itself: the agent's own memories serve as
pseudo-queries, and each row the pipeline ranks for one is labelled *positive*
when it was written within the temporal window of the query's memory (same
session, so related) and *null* otherwise. The separation sweep at the agent's
β then places the gate between the two populations.

One draw uses up to ``CPERSONA_FUSED_GATE_SAMPLE_QUERIES`` pseudo-queries; of
``CPERSONA_FUSED_GATE_CALIBRATION_DRAWS`` draws the upper median is kept, so
one unlucky sample does not set the gate.

Rows are read *before* the gate, autocut and cut (a gate measured on what an
earlier gate let through would only ever rise), and nothing is counted as a
recall: calibration is not a reader.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np

from cpersona.services.calibration import statistics as cm
from cpersona.services.app import App
from cpersona.services.recall.gate import Candidate
from cpersona.services.timestamps import parse_iso
from cpersona.storage.repositories.memories import MemoryRepository

log = logging.getLogger(__name__)

PSEUDO_QUERY_LIMIT = 20  # the limit each pseudo-query recall runs with
MIN_NULL = 10  # a draw needs this many null scores ...
MIN_POSITIVE = 5  # ... and this many positive ones
TIME_BUDGET_SECONDS = 120.0  # draws not started by then are skipped; what finished still counts


def gate_signal(settings: Any) -> str | None:
    """The score a gate is measured on: confidence under legacy ordering, else the fusion mode.

    ``cascade`` without legacy confidence keys its gate on nothing calibratable.
    """
    if settings.confidence_enabled and settings.confidence_ordering == "legacy":
        return "confidence"
    return settings.recall_mode if settings.recall_mode in ("rrf", "rsf") else None


def signal_floor(signal: str, settings: Any) -> float:
    """The lowest gate calibration may set, in the signal's own units.

    Deliberate difference from CPersona 2.6.14, which floors every gate at
    ``CPERSONA_CALIBRATE_FLOOR`` (0.05): an ``rrf`` score never exceeds
    3/(K+1) ≈ 0.049, so that floor blocks every row the gate judges on rrf
    (spec §6 item 3). The floor is read as a share of the best single vote,
    1/(K+1), the way it is a share of a perfect similarity on the other signals.
    """
    if signal == "rrf":
        return settings.calibrate_floor / (settings.rrf_k + 1)
    return settings.calibrate_floor


@dataclass(frozen=True)
class GateDraw:
    threshold: float
    youden_j: float
    queries_run: int
    n_null: int
    n_pos: int
    null_admit_rate: float
    pos_admit_rate: float
    null_mean: float
    pos_mean: float


@dataclass(frozen=True)
class GateMeasurement:
    """The chosen draw, at the β and on the signal it was measured with."""

    signal: str
    beta: float
    chosen: GateDraw
    draws: tuple[float, ...]  # every successful draw's threshold, ascending

    def as_response(self) -> dict[str, Any]:
        d = self.chosen
        out: dict[str, Any] = {
            "threshold": d.threshold, "signal": self.signal, "beta": self.beta, "youden_j": d.youden_j,
            "queries_run": d.queries_run, "n_null": d.n_null, "n_pos": d.n_pos,
            "null_admit_rate": d.null_admit_rate, "pos_admit_rate": d.pos_admit_rate,
            "null_mean": d.null_mean, "pos_mean": d.pos_mean,
        }  # fmt: skip
        if len(self.draws) > 1:
            out["threshold_draws"] = list(self.draws)
        return out


def measure_gate(app: App, agent_id: str, beta: float, rng: Any) -> GateMeasurement | None:
    """The agent's gate at ``beta``, or None when none can be measured (spec CT-4)."""
    settings = app.settings
    signal = gate_signal(settings)
    if not agent_id or not settings.fused_gate_enabled or app.embedder is None or signal is None:
        return None
    pool = _pseudo_query_pool(app, agent_id)
    if not pool:
        return None
    window = settings.calibrate_temporal_window_min * 60.0
    floor = signal_floor(signal, settings)
    deadline = time.monotonic() + TIME_BUDGET_SECONDS
    seen: dict[int, list[tuple[float, datetime | None]]] = {}  # pseudo-query id → its scored rows
    draws: list[GateDraw] = []
    for _ in range(settings.fused_gate_calibration_draws):
        if time.monotonic() > deadline:
            log.warning("gate calibration of %r stopped after %d draws (time budget)", agent_id, len(draws))
            break
        picked = rng.sample(pool, min(settings.fused_gate_sample_queries, len(pool)))
        draw = _one_draw(app, agent_id, picked, seen, signal, window, beta, floor)
        if draw is not None:
            draws.append(draw)
    if not draws:
        return None
    draws.sort(key=lambda d: d.threshold)
    chosen = draws[len(draws) // 2]  # the upper median
    return GateMeasurement(signal, beta, chosen, tuple(d.threshold for d in draws))


class _Pool(Sequence):
    """The pseudo-query pool, (id, time) by id, packed: two machine integers a row (id, and the
    time in microseconds since the epoch, UTC) instead of a tuple, an int and a datetime (~150
    bytes a row: ~150 MB at 1M rows, the start-up calibration's peak). ``rng.sample`` reads only
    its length and items, so it draws the same rows as from the list of those tuples."""

    def __init__(self) -> None:
        self.ids = array("q")
        self.micros = array("q")

    def append(self, memory_id: int, moment: datetime) -> None:
        self.ids.append(memory_id)
        self.micros.append((moment - _EPOCH) // _MICROSECOND)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):  # noqa: ANN001, ANN204 - Sequence's overloads; the sampler passes ints
        return self.ids[i], _EPOCH + timedelta(microseconds=self.micros[i])


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def _pseudo_query_pool(app: App, agent_id: str) -> _Pool:
    """Embedded memories of the agent with text and a readable time: (id, time)."""
    pool = _Pool()
    with app.db.read() as session:
        for memory_id, stamp in MemoryRepository(session).embedded_with_text(agent_id):
            moment = parse_iso(stamp)
            if moment is not None:
                pool.append(memory_id, moment)
    return pool


def _one_draw(
    app: App, agent_id: str, picked: list[tuple[int, datetime]],
    seen: dict[int, list[tuple[float, datetime | None]]], signal: str, window: float, beta: float, floor: float,
) -> GateDraw | None:  # fmt: skip
    nulls: list[float] = []
    positives: list[float] = []
    for memory_id, moment in picked:
        if memory_id not in seen:
            seen[memory_id] = _scored_rows(app, agent_id, memory_id, signal)
        for score, when in seen[memory_id]:
            related = when is not None and abs((when - moment).total_seconds()) <= window
            (positives if related else nulls).append(score)
    if len(nulls) < MIN_NULL or len(positives) < MIN_POSITIVE:
        return None
    pos, null = np.sort(np.asarray(positives)), np.sort(np.asarray(nulls))
    sweep = cm.separation_sweep(pos, null, beta)
    threshold = round(max(sweep.threshold, floor), 4)
    return GateDraw(
        threshold=threshold,
        youden_j=round(sweep.youden_j, 4),
        queries_run=len(picked),
        n_null=len(nulls),
        n_pos=len(positives),
        null_admit_rate=round(cm.admit_rate(null, threshold), 4),
        pos_admit_rate=round(cm.admit_rate(pos, threshold), 4),
        null_mean=round(cm.mean(null), 4),
        pos_mean=round(cm.mean(pos), 4),
    )


def _scored_rows(app: App, agent_id: str, memory_id: int, signal: str) -> list[tuple[float, datetime | None]]:
    """(score, time) of every row a recall for this memory's text ranks on ``signal``, itself excluded."""
    with app.db.read() as session:
        content = MemoryRepository(session).text_of(memory_id)
    if content is None:  # deleted meanwhile
        return []
    out = []
    for row in scored_candidates(app, agent_id, content):
        if row.is_profile or row.record is None or row.key == ("mem", memory_id):
            continue
        judged = row.signal
        if judged is None or judged[0] != signal:
            continue
        out.append((float(judged[1]), parse_iso(row.record.timestamp)))
    return out


def scored_candidates(app: App, agent_id: str, text: str) -> list[Candidate]:
    """Recall's steps 5–6 for one query: retrieve, fuse, score — no gate, no cut, no counters.

    Composed from the recall pipeline's own stages so the gate is measured on
    exactly the scores recall will judge (limit 20, no project, channel or
    source filter, no profile row).
    """
    from cpersona.services.recall import service as recall
    from cpersona.services.recall import retrievers

    req = recall.RecallRequest(agent_id=agent_id, query=text, limit=PSEUDO_QUERY_LIMIT)
    backend = retrievers.search_backend(app)
    # pseudo: the keyword rows the common-words rule would drop stay in the measured population
    # (a small scope's pseudo-queries otherwise leave too few rows judged on rrf to place a gate).
    query = replace(req.retriever_query(), pseudo=True)
    found = retrievers.retrieve(app, backend, query, recall.depth_for(app, req), retrievers.exclusion(()))
    rows = recall.fuse(app, req, found, None)
    return recall.score_candidates(app, backend, req, found, rows)  # legacy ordering: confidence too
