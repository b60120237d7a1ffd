"""recall: find the memories and episodes that answer a query (spec §1, §3.2).

The pipeline, top to bottom:

    validate → depth → retrieve (one ranked list per retriever) → fuse
      → score (episode boundary penalty; legacy confidence ordering: cosine
        backfill before it, confidence and re-sort after it) → gate
      → gate_fallback rescue or autocut → age prior → (time cue: lift) → cut to limit
      → (time cue: held seats) → confidence beside the rows (fusion ordering) → reverse (the best row
        ends the list) → messages → counters
      → advisory → preview tier / full-content budget

Retrievers (:mod:`cpersona.services.recall.retrievers`) are the vector channel (near
list and optional far list), FTS over episodes and FTS over memories with its
LIKE fallback. Each produces a :class:`~cpersona.services.recall.fusion.RankedList`; a
row the vector channel scored carries its cosine into the gate and
``match_reason`` through :class:`Candidate`. The degraded advisory lives in
:mod:`cpersona.services.recall.advisory`.

:func:`run_recall` runs the pipeline (steps up to the response, no preview
cut); :func:`recalled` runs it on one read snapshot, for ``recall`` and
``recall_with_context`` alike. :func:`answer_recall` is the tool's service, fed
a :class:`RecallArguments` that dispatch parsed from schema-checked arguments;
:func:`recall` is the same answer for a library caller, whose arguments no
schema has checked (:func:`check_arguments`). The operating context's
``@auto`` (OC-7..OC-11) is applied by the facade before either tool runs,
from the tool's declaration.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from cpersona.services.recall.advisory import advisory
from cpersona.services.recall import cjk_query
from cpersona.services.recall.counters import bump_recall_counters
from cpersona.services.app import App
from cpersona.services.recall.confidence import (
    backfill_cosines,
    describe_confidence,
    gate_fallback,
    legacy_ordering,
    memory_time_span,
    order_by_confidence,
)
from cpersona.services.recall.cue_arm import cued_answer, search_period
from cpersona.services.recall.fusion import (
    RankedList,
    cascade,
    defer_to_clear_first,
    on_one_scale,
    rrf,
    rsf,
    seat_vector_only,
    vector_only_seats,
    vector_votes,
    within_cut,
)
from cpersona.services.recall.keyword_floor import annotate, gate_notice, keep_a_memory
from cpersona.services.recall.gate import (
    POOL_SATURATION,
    PROFILE_KEY,
    Candidate,
    apply_gate,
    autocut,
    calibrated_gate_for,
)
from cpersona.services.recall.prior import apply_prior, prior_applies
from cpersona.services.recall.preview import (
    FULL_CONTENT_BUDGET,
    apply_full_content_budget,
    apply_preview_tier,
)
from cpersona.services.requests import Request
from cpersona.services.responses import ToolFailure, answers_refusals
from cpersona.services.sanitize import find_lone_surrogate, parse_stored_json
from cpersona.services.recall.time_cue import TimeCue, parse_time_cue
from cpersona.services.recall.retrievers import Query, Retrieval, exclusion, retrieve, search_backend
from cpersona.storage.scope import Scope
from cpersona.storage.search import RowKey, SearchBackend, clean_query

log = logging.getLogger(__name__)


# -- arguments ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecallRequest:
    """The tool's arguments after validation, in the types the pipeline uses."""

    agent_id: str
    query: str
    limit: int
    deep: bool = False
    channel: str = ""
    exclude_contents: tuple[str, ...] = ()
    session_key: str = ""
    project_id: str | None = None
    source_id: str = ""
    full_content: bool = False
    time_cue: TimeCue | None = None

    @property
    def scope(self) -> Scope:
        return Scope(agent_id=self.agent_id, project_id=self.project_id, channel=self.channel or None)

    @property
    def blank(self) -> bool:
        return not clean_query(self.query)

    def retriever_query(self) -> Query:
        return Query(
            agent_id=self.agent_id,
            text=self.query,
            scope=self.scope,
            source_id=self.source_id,
            channel=self.channel,
            blank=self.blank,
        )


@dataclass(frozen=True)
class RecallArguments(Request):
    """``recall``'s arguments in the types its schema declares; defaults are the schema's.

    ``trace`` is declared by the schema but not carried out: the declaration
    refuses ``trace: true`` rather than answer as if it had not been asked.
    """

    agent_id: str
    query: str
    limit: int = 10
    deep: bool = False
    channel: str = ""
    exclude_contents: Sequence[str] = ()
    session_key: str = ""
    project_id: str | None = None
    source_id: str = ""
    full_content: bool = False
    time_cue: Mapping[str, Any] | None = None


def resolve_request(app: App, args: RecallArguments) -> RecallRequest:
    """What well-typed arguments mean to the pipeline; raise ToolFailure on a cue that cannot be read."""
    try:
        time_cue = parse_time_cue(args.time_cue)  # TQ-1…TQ-3: refused before any read
    except ToolFailure as refused:
        raise ToolFailure(refused.message, messages=[]) from None
    return RecallRequest(
        agent_id=args.agent_id, query=args.query, limit=max(0, min(args.limit, app.settings.recall_library_max_limit)),
        deep=args.deep, channel=args.channel, exclude_contents=tuple(args.exclude_contents),
        session_key=args.session_key, project_id=args.project_id, source_id=args.source_id,
        full_content=args.full_content, time_cue=time_cue,
    )  # fmt: skip


def _text(name: str, value: Any, *, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise ToolFailure(f"{name} must be a string", messages=[])
    return value


def _flag(name: str, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ToolFailure(f"{name} must be true or false", messages=[])
    return value


def check_arguments(arguments: Mapping[str, Any]) -> RecallArguments:
    """A library caller's arguments checked as the tool's schema checks a tool call's; ToolFailure if not."""
    for name, value in arguments.items():
        if find_lone_surrogate(value):
            raise ToolFailure(f"{name} contains an unpaired UTF-16 surrogate, which is not valid text", messages=[])
    if arguments.get("agent_id") is None:
        raise ToolFailure("agent_id is required", messages=[])
    if arguments.get("query") is None:
        raise ToolFailure("query is required", messages=[])
    limit = arguments.get("limit", 10)
    if limit is None:
        limit = 10
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ToolFailure("limit must be an integer from 0 to 100", messages=[])
    exclude = arguments.get("exclude_contents") or []
    if not isinstance(exclude, (list, tuple)) or not all(isinstance(e, str) for e in exclude):
        raise ToolFailure("exclude_contents must be a list of strings", messages=[])
    project_id = arguments.get("project_id")
    return RecallArguments(
        agent_id=_text("agent_id", arguments["agent_id"]),
        query=_text("query", arguments["query"]),
        limit=limit,
        deep=_flag("deep", arguments.get("deep")),
        channel=_text("channel", arguments.get("channel")),
        exclude_contents=tuple(exclude),
        session_key=_text("session_key", arguments.get("session_key")),
        project_id=None if project_id is None else _text("project_id", project_id),
        source_id=_text("source_id", arguments.get("source_id")),
        full_content=_flag("full_content", arguments.get("full_content")),
        time_cue=arguments.get("time_cue"),
    )


def parse_request(app: App, arguments: Mapping[str, Any]) -> RecallRequest:
    """A library caller's arguments checked and resolved; raise ToolFailure on bad input."""
    return resolve_request(app, check_arguments(arguments))


# -- fusion and scoring --------------------------------------------------------------


def fuse(app: App, req: RecallRequest, found: Retrieval, profile: str | None) -> list[Candidate]:
    """One candidate list, best first, with the profile row where its mode puts it."""
    mode = app.settings.recall_mode
    profile_row = Candidate(PROFILE_KEY, profile_text=profile) if profile is not None else None
    if req.blank or mode == "cascade":
        order = cascade(
            found.keys("vector"),
            found.keys("episodes"),
            found.keys("memories"),
            limit=req.limit,
            profile=PROFILE_KEY if profile_row else None,
        )
        placed = {PROFILE_KEY: profile_row} if profile_row else {}
        return [placed.get(key) or _candidate(found, key) for key in order]
    depth = depth_for(app, req)
    lists: Sequence[RankedList] = found.lists
    if mode == "rrf":
        lists = vector_votes(lists, depth)  # a vector list at odds with a clear keyword first place sits out (issue 14)
    if cjk_query.applies(req.query):
        lists = cjk_query.vector_votes(lists)  # on Japanese, only a vector list agreeing at the keyword top votes
    # Rows read past the cut (fusion.confirmed) and a clear keyword first place order the answer;
    # the gate judges the votes the retrievers gave within depth.
    cut = within_cut(lists, depth) if mode == "rrf" and found.query_embedded else None
    if found.counts is not None:
        lists = on_one_scale(lists, *found.counts)
        cut = None if cut is None else on_one_scale(cut, *found.counts)
    if mode == "rrf":
        lists = defer_to_clear_first(lists)  # the near list's first place goes to it too (issue 14)
        # rows only the vector channel found take at most a fifth of the answer (issue 14, sixth pass)
        lists = seat_vector_only(lists, vector_only_seats(req.limit), app.settings.rrf_k)
    fused = rrf(lists, app.settings.rrf_k) if mode == "rrf" else rsf(lists)
    within = {} if cut is None else {row.key: row.score for row in rrf(cut, app.settings.rrf_k)}
    rows = []
    for row in fused:
        candidate = _candidate(found, row.key)
        setattr(candidate, mode, row.score)
        if cut is not None:
            candidate.cut_rrf = within.get(row.key, 0.0)
        candidate.single_arm = _single_arm(found, row.key)
        rows.append(candidate)
    if found.query_embedded or lists is not found.lists:
        # the gate's keyword-only floor, and its view of the ranks the retrievers gave (issue 14)
        annotate(within_cut(found.lists, depth), rows, mode, app.settings.rrf_k)
    return rows + ([profile_row] if profile_row else [])


def _candidate(found: Retrieval, key: RowKey) -> Candidate:
    return Candidate(key, record=found.records[key], cosine=found.cosines.get(key))


def _single_arm(found: Retrieval, key: RowKey) -> bool:
    """Only one retriever could have ranked this row (spec §5.8.2)."""
    if key in found.cosines:
        return False
    return not found.query_embedded or not found.records[key].has_embedding


def parse_instant(stamp: str) -> datetime | None:
    """An ISO-8601 stamp as an aware instant (naive = UTC), or None."""
    try:
        moment = datetime.fromisoformat(stamp.strip())
    except (ValueError, AttributeError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def apply_episode_penalty(
    app: App, backend: SearchBackend, scope: Scope, rows: list[Candidate], *, legacy: bool
) -> list[Candidate]:
    """Age rows written before the newest episode (spec §5.9.1).

    Archiving an episode closes a chapter: rows from before it keep their
    place but count for less, down to the floor, so an old corpus does not
    drown what was said since. Episodes age by the same rule as memories, by
    the time they were written (``Record.written_at``: the end of their
    history, else when archived): an episode of an older chapter is old too. Deliberate difference from the reference,
    which exempts every episode: with one episode archived per session the
    episodes, all unpenalised, filled the answers (issue 14; LoCoMo R@10
    0.011 keyword-only).
    """
    settings = app.settings
    if not settings.episode_penalty_enabled or not any(r.record for r in rows):
        return rows
    boundary = backend.episode_boundary(scope)
    if boundary is None:
        return rows
    penalised = False
    for row in rows:
        if row.record is None:  # the profile row
            continue
        stamp = parse_instant(row.record.written_at)
        if stamp is None or stamp >= boundary:
            continue
        hours = (boundary - stamp).total_seconds() / 3600
        factor = max(math.exp(-settings.episode_decay_rate * hours), settings.episode_decay_floor)
        if factor < 1:
            row.scale(factor)
            penalised = True
    scored = [r for r in rows if not r.is_profile]
    for name in ("rrf", "rsf"):
        if penalised and not legacy and scored and all(getattr(r, name) is not None for r in scored):
            profile = [r for r in rows if r.is_profile]
            return sorted(scored, key=lambda r: -getattr(r, name)) + profile
    return rows


def score_candidates(
    app: App, backend: SearchBackend, req: RecallRequest, found: Retrieval, rows: list[Candidate]
) -> list[Candidate]:
    """Step 6 (spec §5.9): the episode penalty and, under legacy ordering, confidence around it.

    Legacy ordering backfills the cosine of rows the vector arm did not find
    (non-blank query), applies the penalty, then scores every row and
    re-sorts by confidence. Otherwise the penalty alone.
    """
    if not legacy_ordering(app.settings):
        return apply_episode_penalty(app, backend, req.scope, rows, legacy=False)
    with app.db.read() as session:
        if not req.blank:
            backfill_cosines(session, found.query_vector, rows)
        span = memory_time_span(backend, req.scope)
    rows = apply_episode_penalty(app, backend, req.scope, rows, legacy=True)
    return order_by_confidence(app.settings, rows, now=app.clock(), span=span, deep=req.deep)


@dataclass
class Admitted:
    """The rows that survived the gate (or were rescued), best first."""

    rows: list[Candidate]
    gate_fallback: bool = False


def gate_candidates(
    app: App, backend: SearchBackend, req: RecallRequest, rows: list[Candidate], found: Retrieval
) -> Admitted:
    """Steps 7–11: the quality gate, the gate_fallback rescue (§5.11), autocut (§5.12), age prior (§5.9.6)."""
    settings = app.settings
    gate = calibrated_gate_for(app, req.agent_id, enabled=settings.fused_gate_enabled)
    if found.counts is not None:  # read with the retrievers' lists (the same snapshot)
        pool = min(sum(found.counts), POOL_SATURATION)
    else:
        pool = backend.pool_count(req.scope, cap=POOL_SATURATION)
    passed = apply_gate(
        rows, pool=pool, query_blank=req.blank, deep=req.deep,
        rrf_k=settings.rrf_k, calibrated=gate,
    )  # fmt: skip
    if (rescued := gate_fallback(rows, passed)) is not None:
        return Admitted(rescued, gate_fallback=True)  # autocut is skipped after a rescue
    if settings.autocut_enabled:
        passed = autocut(passed, min_results=settings.autocut_min_results, min_gap_ratio=settings.autocut_min_gap_ratio)
    if (prior_on := prior_applies(settings, passed, legacy=legacy_ordering(settings))) is not None:
        span = memory_time_span(backend, req.scope)
        passed = apply_prior(settings, passed, prior_on, span=span, now=app.clock())
    return Admitted(passed)


# -- response ------------------------------------------------------------------------


def match_reason(row: Candidate) -> dict[str, Any] | None:
    """Why a scored row is here: the gate's signal and every score it carries (§5.14)."""
    if row.held is not None:
        return dict(row.held)
    judged = row.signal
    if judged is None:
        return None
    reason: dict[str, Any] = {"signal": judged[0], "score": judged[1]}
    for name in ("cosine", "rrf", "rsf"):
        value = getattr(row, name)
        if name == "cosine" and value is None:
            value = row.shown_cosine  # fusion ordering displays a stored-vector cosine (§5.9.3)
        if value is not None:
            reason[name] = value
    if row.prior is not None:
        reason["prior"] = round(row.prior, 4)
    return reason


def message(row: Candidate) -> dict[str, Any]:
    record = row.record
    if record is None:  # the profile row
        out: dict[str, Any] = {"content": f"[Profile] {row.profile_text}", "source": {"System": "profile"}}
    else:
        out = {"content": record.content, "ref": record.ref}
        out["source"] = {"System": "episode"} if record.kind == "ep" else parse_stored_json(record.source)
        if record.timestamp:
            out["timestamp"] = record.timestamp
        if record.msg_id:
            out["id"] = record.msg_id
    if row.confidence_payload is not None:
        out["confidence"] = row.confidence_payload
    if (reason := match_reason(row)) is not None:
        out["match_reason"] = reason
    return out


# -- the pipeline --------------------------------------------------------------------


@dataclass
class RecallOutcome:
    """Messages worst → best, before any preview cut, and the response's extra keys."""

    messages: list[dict[str, Any]]
    extras: dict[str, Any] = field(default_factory=dict)


def depth_for(app: App, req: RecallRequest) -> int:
    """Rows each retriever returns (spec §5.8.1)."""
    if req.blank or app.settings.recall_mode == "cascade":
        return req.limit
    return min(max(req.limit, app.settings.recall_depth_floor), app.settings.recall_library_max_limit)


def _attach_advisory(app: App, req: RecallRequest, extras: dict[str, Any]) -> None:
    if (notice := advisory(app, req.session_key)) is not None:
        extras["advisory"] = notice


def recalled(app: App, req: RecallRequest) -> RecallOutcome:
    """:func:`run_recall` on one read session for the pipeline's five or six reads."""
    with app.db.snapshot():
        return run_recall(app, req)


def run_recall(app: App, req: RecallRequest) -> RecallOutcome:
    """Steps 2–15 of the pipeline for a validated request (no preview cut)."""
    settings = app.settings
    extras: dict[str, Any] = {}
    depth = depth_for(app, req)
    if depth != req.limit:
        extras["depth"] = depth
    if req.limit == 0:
        _attach_advisory(app, req, extras)
        return RecallOutcome([], extras)

    backend = search_backend(app)
    found = retrieve(app, backend, req.retriever_query(), depth, exclusion(req.exclude_contents))
    _attach_advisory(app, req, extras)  # after the query embedding: this recall's outcome counts (ADV-2)
    rows = fuse(app, req, found, backend.profile(req.agent_id))
    rows = score_candidates(app, backend, req, found, rows)
    admitted = gate_candidates(app, backend, req, rows, found)
    if (notice := gate_notice(rows, admitted.rows)) is not None:
        extras["gated"] = notice  # the gate emptied an answer that had candidates: say so (issue 14)
    rows = admitted.rows
    if admitted.gate_fallback:
        extras["gate_fallback"] = True  # spec RC-4: present only when it fired

    seats: list[Candidate] = []
    if req.time_cue is None:
        ranked = keep_a_memory(rows, req.limit)
    else:  # TQ-6: cue rows lifted before the cut; held seats after it, outside the ranked order (ORD-2)
        cued = search_period(backend, req.scope, req.time_cue, req.query, (), req.source_id, now=app.clock())
        ranked, seats = cued_answer(
            backend, req.scope, cued, rows, set(found.records), req.limit, source_id=req.source_id
        )
        if cued.notice is not None:
            extras["time_cue"] = cued.notice  # TQ-5 ignored / TQ-7 used
    legacy = legacy_ordering(settings)
    if settings.confidence_enabled and (seats or not legacy):
        described = seats if legacy else ranked + seats  # legacy ordering scored the ranked rows already
        with app.db.read() as session:  # fusion ordering: confidence for the response only (§5.9.3)
            describe_confidence(
                settings,
                session,
                found.query_vector,
                described,
                now=app.clock(),
                span=memory_time_span(backend, req.scope),
                deep=req.deep,
            )
    if settings.confidence_enabled and not req.deep and not admitted.gate_fallback:  # spec §5.9.5
        # the ranked answer only: after the cut, before held seats
        bump_recall_counters(app, [r.record.id for r in ranked if r.record and r.record.kind == "mem"])
    shown = ranked + seats
    shown.reverse()  # spec RC-1: the best row is the last one, nearest the reader; seats come first (ORD-2)
    return RecallOutcome([message(row) for row in shown], extras)


def answer_recall(app: App, args: RecallArguments) -> dict[str, Any]:
    """The ``recall`` tool: ``{messages: [...]}`` worst → best, plus optional keys."""
    req = resolve_request(app, args)
    outcome = recalled(app, req)
    settings = app.settings
    cut = {
        "preview_chars": settings.recall_preview_chars,
        "excerpt_chars": settings.recall_excerpt_chars,
        "query": req.query,
    }
    response: dict[str, Any] = {"messages": outcome.messages}
    if not req.full_content:
        apply_preview_tier(outcome.messages, **cut)
    elif apply_full_content_budget(outcome.messages, **cut):
        response["full_content_budget_chars"] = FULL_CONTENT_BUDGET
    response.update(outcome.extras)
    if (notice := _update_notice(app, req.session_key)) is not None:
        response["update"] = notice  # a newer or withdrawn release, told once per session (UP-10)
    return response


def _update_notice(app: App, session_key: str) -> dict[str, Any] | None:
    """recall_update_notice, whose module (with the installation probe's) loads only once a check was started.

    Without a started check it has nothing to say (update_check.update_notice), so
    a server with CPERSONA_UPDATE_CHECK=false never loads it (tests/test_startup.py).
    """
    if App.update_checker.if_built(app) is None:
        return None
    from cpersona.services.operations.update_check import recall_update_notice

    return recall_update_notice(app, session_key)


@answers_refusals
def recall(
    app: App,
    *,
    agent_id: Any = None,
    query: Any = None,
    limit: Any = 10,
    deep: Any = False,
    channel: Any = "",
    exclude_contents: Any = None,
    session_key: Any = "",
    project_id: Any = None,
    source_id: Any = "",
    full_content: Any = False,
    time_cue: Any = None,
) -> dict[str, Any]:
    """:func:`answer_recall` for a library caller (no ``@auto``: that is the facade's)."""
    return answer_recall(app, check_arguments(dict(
        agent_id=agent_id, query=query, limit=limit, deep=deep, channel=channel,
        exclude_contents=exclude_contents, session_key=session_key, project_id=project_id,
        source_id=source_id, full_content=full_content, time_cue=time_cue,
    )))  # fmt: skip
