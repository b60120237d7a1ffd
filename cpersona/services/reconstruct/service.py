"""reconstruct: answer a question from memory with items that quote stored rows (spec §8).

    resolve the request → cue terms → candidate pool (one recall) → bundle into clusters
      → relation walk → structure items → quote → budget → shape (and the modes' cap)

Nothing here writes: no model is called, nothing is summarised, and no stored
row changes (RX-50) — the candidate recall is composed without its counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from cpersona.services.app import App
from cpersona.services.graph.associations import RelationRow, record_relations
from cpersona.services.reconstruct import bundle as bundling
from cpersona.services.reconstruct.bundle import Cluster
from cpersona.services.reconstruct import sequence
from cpersona.services.reconstruct.audit import NODE_ORDER_DEPTH, coverage
from cpersona.services.reconstruct.budget import quotes_within_budget
from cpersona.services.reconstruct.cues import Cues, cue_terms
from cpersona.services.reconstruct.pool import Pool, candidate_pool
from cpersona.services.reconstruct.quote import Quote, excerpt_quote, head_quote
from cpersona.services.reconstruct.request import (
    Bounds,
    Policy,
    ReconstructArguments,
    Request,
    check_reconstruct_arguments,
    parse,
    resolve_budget,
)
from cpersona.services.reconstruct.shape import CAPS, fit_to_cap, item_dict
from cpersona.services.reconstruct.structure import Item, structure
from cpersona.services.reconstruct.walk import ItemWalk, walk_items
from cpersona.services.refs import ref_key
from cpersona.services.responses import ToolFailure, answers_refusals
from cpersona.services.recall.retrievers import search_backend
from cpersona.storage.layout import has_graph_tables


def answer_reconstruct(app: App, args: ReconstructArguments) -> dict[str, Any]:
    """The ``reconstruct`` tool, for arguments its schema has checked (the facade applies ``@auto``)."""
    return _run(app, parse(app, args))


@answers_refusals
def reconstruct(
    app: App,
    *,
    agent_id: Any = None,
    query: Any = None,
    count: Any = None,
    top_k: Any = None,
    max_hops: Any = None,
    max_evidence: Any = None,
    deep: Any = None,
    channel: Any = None,
    project_id: Any = None,
    source_id: Any = None,
    trace: Any = None,
    budget: Any = None,
    session_key: Any = None,
    time_cue: Any = None,
    mode: Any = None,
    lite: Any = None,
) -> dict[str, Any]:
    """:func:`answer_reconstruct` for a library caller, whose arguments no schema has checked."""
    return answer_reconstruct(
        app,
        check_reconstruct_arguments(
            {
                "agent_id": agent_id,
                "query": query,
                "count": count,
                "top_k": top_k,
                "max_hops": max_hops,
                "max_evidence": max_evidence,
                "deep": deep,
                "channel": channel,
                "project_id": project_id,
                "source_id": source_id,
                "trace": trace,
                "budget": budget,
                "session_key": session_key,
                "time_cue": time_cue,
                "mode": mode,
                "lite": lite,
            }
        ),
    )


@dataclass(slots=True)
class Step:
    """One breakpoint of the payload sequence: the first ``items`` items with their head quotes and excerpts."""

    items: int
    excerpt_counts: list[int]
    heads: list[Quote]
    used: int
    taken: list[Any] = field(default_factory=list)  # passages taken (passage sequences only)


@dataclass(slots=True)
class Run:
    """One call's state, filled in by the stages of :func:`_run` in order."""

    req: Request
    # cue terms (RX-7, RX-51)
    graph: bool = False
    cues: Cues = field(default_factory=Cues)
    # candidate pool and items (RX-8 … RX-25)
    pool: Pool = field(default_factory=Pool)
    relations: list[RelationRow] = field(default_factory=list)
    clusters: list[Cluster] = field(default_factory=list)
    top_k_reached: bool = False  # RX-11: the candidate recall filled top_k, so more may exist
    items: list[Item] = field(default_factory=list)
    # quotes and budget (RX-26 … RX-36)
    quotes: list[Quote] = field(default_factory=list)
    excerpts: list[list[tuple[Any, Quote]]] = field(default_factory=list)
    budget: int | None = None
    budget_policy: Policy | None = None
    # the payload sequence (RX-37)
    kind: str = "items"
    passages: list[sequence.Passage] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    final: Step = field(default_factory=lambda: Step(0, [], [], 0))

    @property
    def budget_cut(self) -> bool:
        return self.final.items < len(self.items)


def _run(app: App, req: Request) -> dict[str, Any]:
    run = Run(req)
    _find_cues(app, run)
    _gather_items(app, run)
    _quote_items(app, run)
    _sequence(app, run)
    return _answer(run)


def _find_cues(app: App, run: Run) -> None:
    recall = run.req.recall
    with app.db.read() as session:
        run.graph = _graph_present(session)
        if run.graph and not recall.blank:
            run.cues = cue_terms(session, recall.scope, recall.query)


def _gather_items(app: App, run: Run) -> None:
    """Candidate pool → clusters → the chosen items, each with its relation walk (RX-8 … RX-25)."""
    req, scope = run.req, run.req.recall.scope
    run.pool = pool = candidate_pool(app, req.recall, run.cues.terms, req.time_cue)
    refs = [c.ref for c in pool.candidates]
    if run.graph:
        with app.db.read() as session:
            run.relations = record_relations(session, scope, refs)
    run.clusters = bundling.bundle(pool.candidates, run.relations, app.settings.reconstruct_adjacency_seconds)
    chosen = bundling.choose_items(run.clusters, req.effective_count)
    run.top_k_reached = sum(1 for c in pool.candidates if not c.held) >= req.bounds.top_k
    walks: list[ItemWalk | None] = [None] * len(chosen)
    if req.mode is None and chosen and run.graph:  # RX-20: a mode never carries walked evidence
        with app.db.read() as session:
            walks = list(
                walk_items(
                    session,
                    scope,
                    chosen,
                    max_hops=req.bounds.max_hops,
                    max_evidence=req.bounds.max_evidence,
                    source_id=req.recall.source_id,
                    channel=req.recall.channel,
                )
            )
    walked_refs = {w.ref for walk in walks if walk for w in walk.evidence}
    fetched = search_backend(app).fetch(scope, [ref_key(ref) for ref in walked_refs])
    walked_records = {r.ref: r for r in fetched.values()}
    run.items = [
        structure(cl, walk, walked_records, run.relations, set(refs), req.bounds.max_evidence, len(pool.candidates))
        for cl, walk in zip(chosen, walks)
    ]


def _quote_items(app: App, run: Run) -> None:
    held = sum(1 for it in run.items if it.held)
    run.budget, run.budget_policy = resolve_budget(
        app.settings, run.req.requested_budget, run.req.mode, run.req.effective_count + held
    )
    run.quotes, run.excerpts = _quote_all(app, run.req, run.items, run.pool.query_vector)


def _sequence(app: App, run: Run) -> None:
    """RX-37: the breakpoints of the payload sequence the budget admits."""
    settings, items = app.settings, run.items
    sizes = [[len(q.content) for _, q in ex] for ex in run.excerpts]
    run.kind = "whole" if run.req.mode is not None else settings.reconstruct_sequence  # RX-37, RX-45
    if run.kind == "items":
        got = quotes_within_budget([len(q.content) for q in run.quotes], sizes, run.budget)
        run.steps = _item_steps(got, run.quotes)
        if run.steps:
            run.final = run.steps[-1]
        run.final.used = got.used
        return
    texts = [it.head.record.text for it in items]
    run.passages = sequence.order(
        [sequence.record_passages(i, texts[i], run.req.recall.query, settings.rrf_k) for i in range(len(items))],
        texts,
        [it.held for it in items],
        kind=run.kind,
        pro=run.req.mode == "pro",
        rrf_k=settings.rrf_k,
    )
    fits = sequence.passages_within_budget(run.passages, sizes, run.budget)
    refs_of = [it.head.ref for it in items]
    prefixes = [sequence.prefix(k, run.passages, sizes, refs_of, texts) for k in range(1, fits + 1)]
    run.steps = [Step(p.items, p.excerpt_counts, p.quotes, p.used, p.taken) for p in prefixes]
    if run.steps:
        run.final = run.steps[-1]


def _answer(run: Run) -> dict[str, Any]:
    """The shaped answer: whole, or the longest prefix under a mode's token cap (RX-44 … RX-47)."""
    req = run.req

    def build(step: Step, full: bool) -> dict[str, Any]:
        return _shape(run, step, full)

    if req.trace:
        response = build(run.final, True)
        if req.mode is not None:
            capped = _capped(build, run.steps, req.mode)
            if capped is not None:
                response.update(mode=req.mode, cap=CAPS[req.mode], used_tokens=capped["used_tokens"])
        return response
    if req.mode is None or not run.final.items:
        response = build(run.final, False)
        if req.mode is not None:
            response.update(mode=req.mode, cap=CAPS[req.mode])
        return response
    capped = _capped(build, run.steps, req.mode) or _fewer_claims(
        build, run.steps[0], run.items, run.excerpts, req.mode
    )
    if capped is None:
        raise ToolFailure(
            "cap_below_minimum",
            detail="the first item's head quote alone is larger than the token cap",
            items=[],
            returned_count=0,
            mode=req.mode,
            cap=CAPS[req.mode],
            **run.pool.notices,
        )
    return capped


def _shape(run: Run, step: Step, full: bool) -> dict[str, Any]:
    """The answer made of the first ``step.items`` items (``full``: every field, and the trace)."""
    req, items, excerpts = run.req, run.items, run.excerpts
    n_items, excerpt_counts = step.items, step.excerpt_counts
    out: dict[str, Any] = {
        "items": [
            item_dict(items[i], step.heads[i], excerpts[i], excerpt_counts[i], full=full, mode=req.mode)
            for i in range(n_items)
        ],
        "effective_count": req.effective_count,
        "returned_count": n_items,
    }
    shown = step.heads[:n_items] + [q for i in range(n_items) for _, q in excerpts[i][: excerpt_counts[i]]]
    if any(q.lexical_only for q in shown):  # RX-33
        out["quote_selection"] = "lexical_only"
    _envelope(out, run, step, full)
    if full:
        _audit(
            out["trace"],
            req.recall.query,
            items[:n_items],
            [(items[i].head.ref, step.heads[i]) for i in range(n_items)]
            + [(row.ref, q) for i in range(n_items) for row, q in excerpts[i][: excerpt_counts[i]]],
        )
        if run.kind != "items":
            out["trace"]["sequence"] = sequence.trace(run.kind, run.passages, step.taken, [it.head.ref for it in items])
    return _in_wire_order(out)


def _item_steps(got: Any, quotes: list[Quote]) -> list[Step]:
    """RX-37 (items): every head in item order, then each item's first excerpt, then each one's second, …"""
    steps = [Step(n, [0] * n, quotes[:n], 0) for n in range(1, got.items + 1)]
    counts = [0] * got.items
    for j in range(max(got.excerpts, default=0)):
        for i in range(got.items):
            if counts[i] < got.excerpts[i] and counts[i] == j:
                counts[i] += 1
                steps.append(Step(got.items, list(counts), quotes[: got.items], 0))
    return steps


def _fewer_claims(
    build: Any, first_step: Step, items: list[Item], excerpts: list[list[tuple[Any, Quote]]], mode: str
) -> dict[str, Any] | None:
    """RX-47: the first item alone is over the cap — keep the most claims that fit, at least the head.

    Claims are kept in retention priority (RX-24: the head, then by relevance)
    and shown in claim order; the rest are reported through claims_omitted.
    """
    first, first_excerpts = items[0], excerpts[0]
    by_priority = [first.head] + sorted(
        (r for r in first.rows if r is not first.head), key=lambda r: (r.rank, r.record.kind, r.record.id)
    )

    def keep(k: int) -> None:
        kept = {id(r) for r in by_priority[:k]}
        items[0] = replace(
            first,
            rows=[r for r in first.rows if id(r) in kept],
            claims_omitted=first.claims_omitted + len(first.rows) - k,
        )
        excerpts[0] = [(row, q) for row, q in first_excerpts if id(row) in kept]

    def shaped(k: int) -> dict[str, Any]:
        keep(k)
        return build(first_step, False)

    found = fit_to_cap(shaped, len(first.rows) - 1, mode)
    if found is None:
        return None
    keep(found[1])  # leave the kept claims in place for anything read after
    return found[0]


# The reference's key order. JSON readers do not care, but the modes count the
# tokens of the JSON text, and the same answer should cost the same (RX-44).
_WIRE_ORDER = (
    "items",
    "requested_count",
    "effective_count",
    "returned_count",
    "count_policy",
    "requested_budget",
    "effective_budget",
    "used_budget",
    "budget_policy",
    "bounds",
    "reconstruction",
    "quote_selection",
    "advisory",
    "update",
    "suggestion",
    "gate_fallback",
    "time_cue",
    "trace",
    "reserved_count",
    "reserved_omitted",
    "shortfall_reason",
)


def _in_wire_order(out: dict[str, Any]) -> dict[str, Any]:
    ordered = {key: out[key] for key in _WIRE_ORDER if key in out}
    ordered.update((key, value) for key, value in out.items() if key not in ordered)
    return ordered


def _audit(trace: dict[str, Any], query: str, items: list[Item], shown: list[tuple[str, Quote]]) -> None:
    """RX-43: node_order for records quoted from nodes; coverage of the query by the cited records."""
    node_order: dict[str, list[int]] = {}
    for ref, quote in shown:
        if quote.node_order is not None:
            node_order.setdefault(ref, quote.node_order[:NODE_ORDER_DEPTH])
    if node_order:
        trace["node_order"] = node_order
    if items:
        cited: dict[str, str] = {}
        for item in items:
            for row in item.rows:
                cited.setdefault(row.ref, row.record.text)
        trace["coverage"] = coverage(query, list(cited.items()))


def _capped(build: Any, steps: list[Step], mode: str) -> dict[str, Any] | None:
    """RX-46: the longest prefix of the payload sequence's breakpoints whose shaped JSON fits the cap."""
    found = fit_to_cap(lambda k: build(steps[k - 1], False), len(steps), mode)
    return None if found is None else found[0]


def _graph_present(session: Any) -> bool:
    """RX-51: a database without the association tables answers as one where nothing is declared.

    Our migrations always create them; a copied-in or hand-trimmed file may not
    have them, and reconstruct must not fail where recall would not.
    """
    return has_graph_tables(session.connection())


def _quote_all(
    app: App, req: Request, items: list[Item], query_vector: bytes | None
) -> tuple[list[Quote], list[list[tuple[Any, Quote]]]]:
    settings = app.settings
    full_chars = settings.reconstruct_quote_chars
    preview = settings.recall_preview_chars
    quotes: list[Quote] = []
    excerpts: list[list[tuple[Any, Quote]]] = []
    with app.db.read() as session:
        for position, item in enumerate(items):
            record = item.head.record
            if full_chars > 0:
                cap = (
                    full_chars if position < settings.reconstruct_full_quotes else settings.reconstruct_tail_quote_chars
                )
                quotes.append(head_quote(record.ref, record.text, req.recall.query, cap, settings.rrf_k))
            else:  # RX-34: heads follow the excerpt rules
                quotes.append(
                    excerpt_quote(
                        session,
                        record.kind,
                        record.id,
                        record.ref,
                        record.text,
                        record.content,
                        req.recall.query,
                        preview,
                        settings.rrf_k,
                        query_vector,
                    )
                )
            excerpts.append(
                [
                    (
                        row,
                        excerpt_quote(
                            session,
                            row.record.kind,
                            row.record.id,
                            row.ref,
                            row.record.text,
                            row.record.content,
                            req.recall.query,
                            preview,
                            settings.rrf_k,
                            query_vector,
                        ),
                    )
                    for row in item.excerpt_rows()
                ]
            )
    return quotes, excerpts


def _bounds(run: Run, items: list[Item]) -> Bounds:
    """The request's bounds with which of them cut these items (RX-11, RX-22, RX-25); the request's own stay as parsed."""
    cut = run.req.bounds
    omitted = [
        name
        for name, hit in (
            ("max_evidence", any(it.claims_omitted for it in items)),
            ("max_hops", any(it.walk and it.walk.hops_cut for it in items)),
        )
        if hit
    ]
    reached = [
        name
        for name, hit in (
            ("top_k", run.top_k_reached),
            ("max_evidence", any(it.walk and it.walk.evidence_reached for it in items)),
        )
        if hit
    ]
    return replace(cut, omitted=[*cut.omitted, *omitted], reached=[*cut.reached, *reached])


def _envelope(out: dict[str, Any], run: Run, step: Step, full: bool) -> None:
    """RX-38 … RX-43: only the fields that say something (all of them under trace)."""
    req, pool, clusters, excerpts = run.req, run.pool, run.clusters, run.excerpts
    returned, excerpt_counts, used, budget = step.items, step.excerpt_counts, step.used, run.budget
    items = run.items[:returned]
    budget_cut = run.budget_cut and returned < len(run.items)
    reserved = sum(1 for it in items if it.held)
    window = returned - reserved
    gate_fallback = bool(pool.notices.get("gate_fallback"))
    if req.effective_count == 0:
        out["shortfall_reason"] = "count_zero"
    elif window < req.effective_count:
        if budget_cut:
            out["shortfall_reason"] = "budget_exhausted"
        elif gate_fallback:
            out["shortfall_reason"] = "below_quality_threshold"
        elif not pool.candidates:
            out["shortfall_reason"] = "no_relevant_evidence"
        else:
            out["shortfall_reason"] = "exhausted_candidates"
    if reserved:
        out["reserved_count"] = reserved
    held_total = sum(1 for cl in clusters if cl.held)
    if held_total > reserved and req.mode is None:
        out["reserved_omitted"] = held_total - reserved
    if full or req.count_policy.clamped or req.count_policy.source == "operator_forced":
        if req.requested_count is not None or full:
            out["requested_count"] = req.requested_count
        out["count_policy"] = req.count_policy.as_dict()
    budget_policy = run.budget_policy
    shown_policy = budget_policy is not None and (full or budget_policy.worth_showing())
    if shown_policy or full:
        out["requested_budget"] = req.requested_budget
        if shown_policy:
            out["budget_policy"] = budget_policy.as_dict()
    cut = budget_cut or "reserved_omitted" in out or any(len(excerpts[i]) > excerpt_counts[i] for i in range(returned))
    if (req.mode is None and cut) or full:  # RX-45: the mode shape has none; RX-43/48: trace has all
        out["effective_budget"], out["used_budget"] = (used if budget is None else budget), used
    if req.mode is None or full:
        shown = _bounds(run, items).as_dict(always=full)
        if shown is not None:
            out["bounds"] = shown
    if pool.excluded_without_provenance or full:
        out["reconstruction"] = {"excluded_without_provenance": pool.excluded_without_provenance}
        if full:
            out["reconstruction"] = {
                "policy": "v1",
                "candidate_count": len(pool.candidates),
                "cluster_count": len(clusters),
                "selected_count": returned,
                "excluded_without_provenance": pool.excluded_without_provenance,
            }
    out.update(pool.notices)
    if full:
        trace: dict[str, Any] = {
            "candidate_refs": [c.ref for c in reversed(pool.candidates)],
            "clusters": [[m.ref for m in cl.members] for cl in reversed(clusters)],  # as candidate_refs: worst first
        }
        if (cue_trace := run.cues.trace()) is not None:
            trace["cues"] = cue_trace
        out["trace"] = trace
