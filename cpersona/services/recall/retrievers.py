"""Recall's retrievers: one ranked list per channel, in fusion order (spec §5.6–5.7).

    vector near list → far list → episodes (FTS) → memories (FTS, LIKE fallback;
    a kana/kanji query: :mod:`cpersona.services.recall.cjk_query`)

Each lexical list is the trigram ranking merged with the word channel's
(:mod:`cpersona.services.recall.words`).

The vector channel runs when an embedding client exists and the query is not
blank. The query is embedded once per recall (VEC-1); that call is also the
measurement the degraded advisory reads (ADV-2), and a fresh success lets the
vector backfill catch up on rows stored while the backend was away.

Every list is already isolated: each backend primitive applies the scope in
its own statement (ISO-2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cpersona.services.recall import cjk_query
from cpersona.services.app import App
from cpersona.services.recall.fusion import VECTOR_CHANNELS, Ranked, RankedList, confirmed, past_the_cut
from cpersona.services.recall.gate import POOL_SATURATION
from cpersona.services.recall.words import add_lexical_lists
from cpersona.storage.scope import Scope
from cpersona.storage.search import MAX_QUERY_CHARS, Hit, Record, RowKey, SearchBackend, open_search

log = logging.getLogger(__name__)

EXCLUDE_PREFIX_MIN = 32  # exclusion entries this long also match by prefix (spec §5.7.5)


def search_backend(app: App) -> SearchBackend:
    return open_search(app.db, fts_enabled=app.settings.fts_enabled)


def exclusion(entries: Sequence[str]) -> Callable[[str], bool]:
    """Whether a row's text is one the caller already holds (spec §5.7.5).

    Entries are compared trimmed and lower-cased. Any entry excludes an equal
    row; an entry of 32 characters or more also excludes a row it starts with
    or that starts with it (a caller's copy may be cut, or extended).
    """
    exact = {e.strip().lower() for e in entries if e.strip()}
    long = [e for e in exact if len(e) >= EXCLUDE_PREFIX_MIN]

    def excluded(text: str) -> bool:
        row = text.strip().lower()
        if not row:
            return False
        return row in exact or any(e.startswith(row) or row.startswith(e) for e in long)

    return excluded


@dataclass
class Retrieval:
    """What the retrievers found: ranked lists plus the rows they name."""

    lists: list[RankedList] = field(default_factory=list)
    records: dict[RowKey, Record] = field(default_factory=dict)
    cosines: dict[RowKey, float] = field(default_factory=dict)  # from the vector channel
    query_embedded: bool = False  # the query has a vector, so the vector channel ran
    query_vector: bytes | None = None
    # (memories, episodes) in scope, each counted up to POOL_SATURATION; None on the blank path
    counts: tuple[int, int] | None = None

    def add(
        self,
        channel: str,
        hits: Sequence[Hit],
        excluded: Callable[[str], bool],
        *,
        weight: float = 1.0,
        cut: int | None = None,
    ) -> None:
        """Add one retriever's hits; an excluded row casts no vote, later rows keep their rank.

        ``cut``: a vector list read past the cut (``fusion.confirmed``) records the
        cosine of its first ``cut`` rows only; a row past it is judged on its fused score.
        """
        entries = []
        for rank, hit in enumerate(hits):
            if excluded(hit.record.content):
                continue
            key = hit.record.key
            self.records.setdefault(key, hit.record)
            if channel in VECTOR_CHANNELS and hit.raw is not None and (cut is None or rank < cut):
                self.cosines.setdefault(key, hit.raw)  # VEC-6: every vector row carries its cosine
            entries.append(Ranked(key, rank, hit.raw))
        self.lists.append(RankedList(channel, tuple(entries), weight))

    def confirm(self, depth: int) -> None:
        """Keep a row past the cut only where both channels rank it (``fusion.confirmed``)."""
        lists = confirmed(self.lists, depth)
        if lists is self.lists:
            return
        self.lists = list(lists)
        listed = {entry.key for lst in self.lists for entry in lst.entries}
        self.records = {key: record for key, record in self.records.items() if key in listed}
        self.cosines = {key: cosine for key, cosine in self.cosines.items() if key in listed}

    def keys(self, channel: str) -> list[RowKey]:
        return [e.key for lst in self.lists if lst.channel == channel for e in lst.entries]


@dataclass(frozen=True, slots=True)
class Query:
    """What the retrievers need to know about one recall."""

    agent_id: str
    text: str
    scope: Scope
    source_id: str = ""
    channel: str = ""
    blank: bool = False
    # Whether the query embedding's outcome is a health observation (spec ADV-2:
    # a recall's is; a calibration pseudo-query's should pass False).
    measure: bool = True
    # A calibration pseudo-query (services/calibration/fused_gate.py): the gate is measured on the
    # keyword rows before common_words drops any; recall's rows after it are a subset of them.
    pseudo: bool = False

    @property
    def episodes_apply(self) -> bool:
        """spec ISO-4: episodes carry no per-user source, so a source filter skips them
        unless a channel is named as well."""
        return not self.source_id or bool(self.channel)


def retrieve(app: App, backend: SearchBackend, query: Query, depth: int, excluded: Callable[[str], bool]) -> Retrieval:
    """Run the retrievers, in fusion order: vector near, far, episodes, memories."""
    found = Retrieval()
    if query.blank:  # spec §5.7.4: a blank query is a recency listing
        found.add("memories", backend.recent_memories(query.scope, depth, source_id=query.source_id), excluded)
        return found
    remote = remote_near_list(app, backend, query, depth)
    if remote is not None:
        # EMB-6: the remote index's answer replaces the local scan, and no far list is read.
        found.query_embedded = True
        found.add("vector", remote, excluded)
    elif (
        vector := embed_query(app, query.text, measure=query.measure, second=second_text(app, backend, query))
    ) is not None:
        found.query_embedded, found.query_vector = True, vector
        vector_lists(app, backend, query, depth, vector, excluded, found)
    add_lexical_lists(
        backend,
        query,
        depth,
        excluded,
        found,
        weight=app.settings.recall_word_weight,
        cjk=cjk_query.applies(query.text),
        whole=found.query_embedded and app.settings.recall_mode == "rrf",  # rows past the cut: fusion.confirmed
    )
    found.counts = backend.table_counts(query.scope, cap=POOL_SATURATION)  # fusion's rank scale, the gate's pool
    found.confirm(depth)  # rows read past the cut stay where both channels rank them (issue 14)
    return found


# -- the vector channel ----------------------------------------------------------------


def second_text(app: App, backend: SearchBackend, query: Query) -> str | None:
    """The query without the scope's speaker names, when one occurs in it (issue 14; nameless.py)."""
    if app.embedder is None:
        return None
    from cpersona.services.recall.nameless import NAME_SCAN, nameless, speaker_names

    head = query.text[:MAX_QUERY_CHARS]
    if not any(ch.isupper() for ch in head):  # a name is capitalised where it is stored; skip the read
        names: frozenset[str] = frozenset()
    else:
        rows = backend.recent_texts(query.scope, NAME_SCAN, source_id=query.source_id)
        names = speaker_names([text for _, text in rows])
    return nameless(head, names)


def embed_query(app: App, text: str, *, measure: bool = True, second: str | None = None) -> bytes | None:
    """The query's vector for this recall (VEC-1), or None when there is none.

    With ``measure`` the outcome feeds the advisory's health state (ADV-2)
    and may wake the backfill. Only the head of a huge query is embedded, as
    only its head is searched lexically.
    """
    if app.embedder is None:
        return None
    try:
        head = text[:MAX_QUERY_CHARS]
        if second is None:
            result = app.embedder.embed_query(head)
        else:
            from cpersona.services.recall.nameless import WEIGHT

            result = app.embedder.embed_query_sum([head, second], (1.0, WEIGHT))
    except Exception:  # noqa: BLE001 - the client never raises by contract; be safe anyway
        log.warning("query embedding failed unexpectedly; recall continues without vectors", exc_info=True)
        return None
    outcome = result.outcome
    if measure:
        recovered = app.embedding_health.observe(outcome)
        if outcome.ok and not outcome.from_cache:
            # Imported here, as only a recall that embedded its query gets this far.
            from cpersona.services.records.backfill import on_query_embedded

            on_query_embedded(app, recovered=recovered)
    return result.blob if outcome.ok else None


def vector_threshold(app: App, agent_id: str) -> float:
    """VEC-4's ``t``: the agent's calibrated threshold, else the calibrated global
    one, else ``CPERSONA_VECTOR_MIN_SIMILARITY``.

    Before any calibration ran or was loaded there is no state to ask: recall
    does not build one just to read nothing from it.
    """
    state = App.calibration.if_built(app)
    value = state.threshold_for(agent_id) if state is not None else None
    return float(app.settings.vector_min_similarity) if value is None else value


def arm_threshold(app: App, agent_id: str) -> float:
    """The vector channel's cut (VEC-4): ``t``, times the threshold factor under fusion."""
    threshold = vector_threshold(app, agent_id)
    if app.settings.recall_mode != "cascade":
        threshold *= app.settings.rrf_threshold_factor  # the other arms vouch for what this admits
    return threshold


def remote_near_list(app: App, backend: SearchBackend, query: Query, depth: int) -> list[Hit] | None:
    """The near list from the remote index (remote vector mode), or None to scan locally."""
    if app.settings.vector_search_mode != "remote":
        return None
    # Imported here: it brings the embedding client and the backfill, which a recall
    # outside remote mode never runs (tests/test_startup.py).
    from cpersona.services.records import remote_vectors

    return remote_vectors.near_list(
        app,
        backend,
        agent_id=query.agent_id,
        text=query.text,
        scope=query.scope,
        source_id=query.source_id,
        episodes_apply=query.episodes_apply,
        depth=depth,
        threshold=arm_threshold(app, query.agent_id),
        measure=query.measure,
    )


def vector_lists(
    app: App,
    backend: SearchBackend,
    query: Query,
    depth: int,
    vector: bytes,
    excluded: Callable[[str], bool],
    found: Retrieval,
) -> None:
    """The near list over the scan window and, when configured, the far list (VEC-2..7)."""
    settings = app.settings
    fusing = settings.recall_mode != "cascade"
    threshold = arm_threshold(app, query.agent_id)
    window = settings.max_memories
    if settings.recall_mode == "rrf":
        # Read past the cut: a memory row ranked there votes when a lexical list ranks it too
        # (fusion.confirmed). Episodes stay within depth: the table is small, and its rows past
        # the cut cost answers with one episode per session (docs/benchmarks.md, fifth pass).
        near = nearest(backend, query, vector, past_the_cut(depth), threshold, (0, window))
        near = [hit for rank, hit in enumerate(near) if rank < depth or hit.record.kind == "mem"]
    else:
        near = nearest(backend, query, vector, depth, threshold, (0, window))
    found.add("vector", near, excluded, weight=settings.recall_vector_weight, cut=depth)
    reach = settings.vector_reach
    if fusing and reach > window and settings.prior_far_weight > 0:
        far_depth = min(depth, settings.vector_far_limit) if settings.vector_far_limit > 0 else depth
        in_near = {hit.record.key for hit in near}
        far = nearest(backend, query, vector, far_depth, threshold, (window, reach))
        # Two statements, two snapshots: a row that moved across the boundary is counted once.
        found.add(
            "far", [hit for hit in far if hit.record.key not in in_near], excluded, weight=settings.prior_far_weight
        )


def nearest(
    backend: SearchBackend, query: Query, vector: bytes, depth: int, threshold: float, window: tuple[int, int]
) -> list[Hit]:
    """Best ``depth`` rows of both tables (VEC-5): memories, then episodes, stable by cosine."""
    if depth <= 0:
        return []
    hits = backend.vector_candidates(
        "mem", query.scope, vector, depth, threshold=threshold, window=window, source_id=query.source_id
    )
    if query.episodes_apply:
        hits += backend.vector_candidates("ep", query.scope, vector, depth, threshold=threshold, window=window)
    hits.sort(key=lambda hit: -(hit.raw or 0.0))  # stable: on a tie a memory precedes an episode
    return hits[:depth]
