"""Stage 1b: the candidate pool — one recall, depth ``top_k`` (RX-9 … RX-13).

The recall is composed from recall's own stages (retrievers, fusion, episode
penalty, gate, autocut) rather than called as a tool, for two reasons: the cue
terms of RX-8 must reach the lexical arms only, and reconstruct must leave
every stored row as it found it — so the recall counters are not bumped.
Alongside the admitted rows one *keyword seat* holds the best row only the
lexical arms found, if the gate or the depth left it out (RX-9).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cpersona.services.recall.advisory import advisory
from cpersona.services.app import App
from cpersona.services.recall.cue_arm import CueOutcome, lift, search_period, seat_records
from cpersona.services.recall.time_cue import TimeCue
from cpersona.services.recall.words import add_lexical_lists
from cpersona.services.recall.service import (
    RecallRequest,
    depth_for,
    fuse,
    gate_candidates,
    parse_instant,
    score_candidates,
)
from cpersona.services.recall.retrievers import Retrieval, exclusion, retrieve, search_backend
from cpersona.services.operations.update_check import recall_update_notice
from cpersona.services.sanitize import parse_stored_json
from cpersona.storage.repositories.episodes import EpisodeRepository
from cpersona.storage.repositories.memories import MemoryRepository
from cpersona.storage.search import Record

LEXICAL = ("episodes", "memories")


@dataclass(slots=True)
class Candidate:
    """A candidate row with what bundling needs to know about it."""

    rank: int  # 0 = most relevant
    record: Record
    held: bool = False  # admitted by a reservation seat, not by the gate (RX-10)
    context: tuple[str, str] | None = None  # (project_id, channel); None when the row vanished
    stamp: datetime | None = None  # None = undated
    span: tuple[datetime, datetime] | None = None  # episodes: [start, end]

    @property
    def ref(self) -> str:
        return self.record.ref

    @property
    def kind(self) -> str:
        return self.record.kind

    def source_key(self) -> tuple[str, str] | None:
        """(type, id) of the producer when it names one (RX-16: source alone is never enough)."""
        source = parse_stored_json(self.record.source)
        if not isinstance(source, dict):
            return None
        kind, ident = source.get("type"), source.get("id")
        if not isinstance(ident, str) or not ident:
            return None
        return (str(kind), ident)


@dataclass(slots=True)
class Pool:
    candidates: list[Candidate] = field(default_factory=list)  # rank order, best first
    excluded_without_provenance: int = 0
    admitted: int = 0  # rows the gate admitted (RX-11 compares this with top_k)
    notices: dict[str, Any] = field(default_factory=dict)
    query_vector: bytes | None = None


def _with_terms(app: App, req: RecallRequest, found: Retrieval, terms: list[str], depth: int) -> None:
    """RX-8: re-run the lexical arms with the extra terms OR-ed in; the vector lists stay as they are."""
    backend = search_backend(app)
    excluded = exclusion(())
    query = req.retriever_query()
    kept = [lst for lst in found.lists if lst.channel not in LEXICAL]
    found.lists = kept
    # Each term is one phrase ("Mina Tanaka" as written, not "Mina" OR "Tanaka");
    # the backend leaves out terms shorter than 3 characters.
    add_lexical_lists(backend, query, depth, excluded, found, weight=app.settings.recall_word_weight, phrases=terms)


def candidate_pool(app: App, req: RecallRequest, terms: list[str], cue: TimeCue | None = None) -> Pool:
    """RX-9 … RX-12: the rows one recall of depth ``top_k`` returns, best first, plus its notices.

    With a time cue (TQ-6) the period is searched too: answer rows it also
    found move up a few places, and rows only it found take held seats.
    """
    pool = Pool()
    backend = search_backend(app)
    depth = depth_for(app, req)
    found = retrieve(app, backend, req.retriever_query(), depth, exclusion(()))
    if terms and not req.blank:
        _with_terms(app, req, found, terms, depth)
    pool.query_vector = found.query_vector
    cued = search_period(backend, req.scope, cue, req.query, terms, req.source_id, now=app.clock())
    if (notice := advisory(app, req.session_key)) is not None:
        pool.notices["advisory"] = notice
    if (update := recall_update_notice(app, req.session_key)) is not None:
        pool.notices["update"] = update
    # recall's steps 6–11: penalty and (legacy) confidence, gate, gate_fallback rescue or autocut, prior
    fused = score_candidates(app, backend, req, found, fuse(app, req, found, backend.profile(req.agent_id)))
    admitted = gate_candidates(app, backend, req, fused, found)
    if admitted.gate_fallback:
        pool.notices["gate_fallback"] = True  # RX-12, RX-13
    # TQ-6: the lift works on the admitted list before the cut, so a period row
    # just past the depth can move into it (and the row it passes drops out).
    order, moved = lift([r.key for r in admitted.rows], set(cued.found), cued.places)
    rows = [admitted.rows[i] for i in order][: req.limit]
    pool.admitted = sum(1 for r in rows if not r.is_profile)
    taken = {r.key for r in rows}
    for row in rows:
        if row.record is None:
            pool.excluded_without_provenance += 1  # the injected profile row has no ref (RX-10)
            continue
        pool.candidates.append(Candidate(len(pool.candidates), row.record))
    if not req.blank:
        lexical = {key for lst in found.lists if lst.channel in LEXICAL for key in (e.key for e in lst.entries)}
        seat = next(
            (
                r
                for r in fused
                if r.record is not None and r.key in lexical and r.key not in taken and r.key not in found.cosines
            ),
            None,
        )
        if seat is not None:
            pool.candidates.append(Candidate(len(pool.candidates), seat.record, held=True))
    seated = _cue_seats(backend, req, pool, cued, {r.key for r in fused} | taken)
    if cued.notice is not None:
        if cued.used:
            cued.notice.update(moved=moved, seated=seated)
        pool.notices["time_cue"] = cued.notice
    _read_context(app, pool.candidates)
    return pool


def _cue_seats(backend: Any, req: RecallRequest, pool: Pool, cued: CueOutcome, retrieved: set[Any]) -> int:
    """TQ-6: the best period rows no arm retrieved take as many held seats as the cue lifts places."""
    records = seat_records(backend, req.scope, cued, retrieved, source_id=req.source_id)
    for record in records:
        pool.candidates.append(Candidate(len(pool.candidates), record, held=True))
    return len(records)


def _read_context(app: App, candidates: list[Candidate]) -> None:
    """Each candidate's project and channel, timestamp and (episodes) span (§8.5, last paragraph)."""
    mem_ids = [c.record.id for c in candidates if c.kind == "mem"]
    ep_ids = [c.record.id for c in candidates if c.kind == "ep"]
    with app.db.read() as session:
        mems = {row.id: row for row in MemoryRepository(session).contexts(mem_ids)}
        eps = {row.id: row for row in EpisodeRepository(session).contexts(ep_ids)}
    for cand in candidates:
        row = (mems if cand.kind == "mem" else eps).get(cand.record.id)
        cand.stamp = parse_instant(cand.record.timestamp) if cand.record.timestamp else None
        if row is None:
            continue
        cand.context = (row.project_id or "", row.channel or "")
        if cand.kind == "ep" and row.start_time and row.end_time:
            start, end = parse_instant(row.start_time), parse_instant(row.end_time)
            if start is not None and end is not None:
                cand.span = (start, end)
