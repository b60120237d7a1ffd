"""SearchBackend over PostgreSQL: pg_trgm for the keyword arms, pgvector or numpy for vectors.

Keyword search. The GIN ``gin_trgm_ops`` indexes (revision 0001's PostgreSQL
branch) answer ``ILIKE '%term%'`` for any term of 3 or more characters, in any
script, so the terms of :func:`~cpersona.storage.search.query_terms` (words,
and every 3-character window of a CJK run) find the same rows FTS5 trigram
finds on SQLite. The score is the number of distinct terms a row contains plus
``word_similarity`` of the whole query (0..1) as a tie-break: like bm25 it
rewards rows matching more of the query, higher is better, and fusion
min-max-normalises it per channel exactly as it does ``-bm25``. With no usable
term or no match, memories fall back to the newest-first substring scan
(spec KW-1), as on SQLite.

Vectors (:mod:`cpersona.storage.vectors_postgres`). Where the server has
pgvector, the window is ranked inside PostgreSQL over a derived ``vector``
column; otherwise (Debian 12 ships no pgvector package) the window's float32
BYTEA blobs are read in chunks and ranked in numpy. Either way the window,
threshold, depth, tie order and cosine values are those of
:mod:`cpersona.storage.vectors_sqlite`.

Every statement carries the isolation fragment of :mod:`cpersona.storage.scope`
and runs under a statement_timeout, so no query can hold a worker for long.
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from cpersona.storage.engine import Database
from cpersona.storage.scope import Scope, sql_fragment
from cpersona.storage.search import Hit, Kind, KeywordResult, clean_query, phrase_terms, query_terms, ranking_terms
from cpersona.storage.search_sql import (
    EPISODE_COLUMNS,
    MEMORY_COLUMNS,
    SqlSearch,
    episode_record,
    like_pattern,
    memory_record,
)
from cpersona.storage import search_postgres_levels as levels
from cpersona.storage import search_sqlite
from cpersona.storage.search_postgres_levels import WALK_EXAMINED
from cpersona.storage.search_sqlite import STATEMENT_DEADLINE_SECONDS, within_budget
from cpersona.storage.vectors_postgres import (
    hnsw_scan,
    hnsw_widths,
    numpy_scan,
    pgvector_scan,
    pgvector_serves,
    vector_text,
)

log = logging.getLogger(__name__)


def source_filter(source_id: str, alias: str = "m") -> tuple[str, dict[str, Any]]:
    """spec ISO-3 on PostgreSQL: exact id, or prefix when the id ends in punctuation.

    ``cpersona_source_id`` (revision 0001) returns NULL for a source that is not
    JSON, so such a row never matches, as json_valid() ensures on SQLite.
    """
    if not source_id:
        return "1=1", {}
    row_id = f"cpersona_source_id({alias}.source)"
    if source_id[-1].isalnum():
        return f"{row_id} = :source_id", {"source_id": source_id}
    return (
        f"substr({row_id}, 1, :source_id_len) = :source_id",
        {"source_id": source_id, "source_id_len": len(source_id)},
    )


def _term_predicates(column_sets: tuple[str, ...], terms: list[str]) -> tuple[list[str], list[str], dict[str, Any]]:
    """(per term: its ILIKE on any column, per term: its test on the lowered copies, params).

    The ILIKE is on the columns themselves, the form the pg_trgm GIN indexes
    answer. The test runs on ``lower()`` of each column, computed once per
    candidate (:func:`tiered_statement`): in a UTF-8 database ILIKE is
    ``lower(text) LIKE lower(pattern)`` (PostgreSQL's like.c), so the count is
    the same while lowering a row once instead of once per term.
    """
    params: dict[str, Any] = {}
    found, counted = [], []
    for i, term in enumerate(terms):
        params[f"t{i}"] = like_pattern(term)
        found.append("(" + " OR ".join(f"{c} ILIKE :t{i}" for c in column_sets) + ")")
        lowered = (f"f.l{j} LIKE lower(:t{i})" for j in range(len(column_sets)))
        counted.append("(" + " OR ".join(lowered) + ")")
    return found, counted, params


def _terms_clause(column_sets: tuple[str, ...], terms: list[str]) -> tuple[str, str, dict[str, Any]]:
    """(any-term predicate on the columns, matched-term count over their lowered copies, params)."""
    found, counted, params = _term_predicates(column_sets, terms)
    return " OR ".join(found), _count_of(counted), params


def _count_of(counted: list[str]) -> str:
    return " + ".join(f"({p})::int" for p in counted)


# How long a table found at most half the keyword budget is taken as still under it
# (the budget only bounds cost: a table that outgrows it meanwhile is ranked whole a
# little longer, as a small one always is).
SMALL_TABLE_SECONDS = 60.0
_small_tables: weakref.WeakKeyDictionary[Database, dict[tuple[str, int], float]] = weakref.WeakKeyDictionary()


def estimates_statement(table: str, alias: str, predicates: Sequence[str]) -> Any:
    """EXPLAIN of one sub-select per predicate: the planner's row estimate of each, in one round trip.

    ``LIMIT 1`` keeps each sub-plan a plain scan (a count would be split
    across parallel workers, whose nodes carry per-worker estimates); a
    Limit node leaves its child's estimate whole.
    """
    subs = ", ".join(f"(SELECT {alias}.id FROM {table} {alias} WHERE {p} LIMIT 1)" for p in predicates)
    return text(f"EXPLAIN (FORMAT JSON) SELECT {subs}")


def plan_estimates(plan: Any, count: int) -> list[int] | None:
    """The row estimates of :func:`estimates_statement`'s ``count`` sub-plans, in order; None when unreadable."""
    if isinstance(plan, str):
        plan = json.loads(plan)
    found: dict[int, int] = {}
    for sub in plan[0]["Plan"].get("Plans", []):
        name = str(sub.get("Subplan Name", ""))
        if name.startswith("InitPlan ") and sub.get("Plans"):
            found[int(name.split()[1])] = int(sub["Plans"][0]["Plan Rows"])
    if len(found) != count:
        return None
    return [found[k] for k in sorted(found)]


@dataclass(frozen=True)
class Arm:
    """One trigram arm's table: what it returns, what it lowers and counts, what it scores, its scope."""

    table: str
    alias: str
    columns: str  # the row columns returned
    lowered: tuple[str, ...]  # the columns searched (lowered once per candidate)
    similarity_of: str  # the text word_similarity scores
    where: str  # scope (and source) predicate


def tiered_statement(arm: Arm, any_term: str, matched: str) -> Any:
    """Rows matching ``any_term``, best ``:depth`` by matched-term count + ``word_similarity``.

    ``f`` is the candidate set: rows holding a term, found through the
    trigram GIN indexes (the caller runs it with :data:`INDEXED_SETTINGS`),
    then kept when in scope (``OFFSET 0`` keeps the scope out of the index
    scan: pushed down, it lets the planner read the whole scope through the
    agent index instead, all of a one-agent memory), each searched column
    lowered once (``l0``, ``l1``) for the
    term count (:func:`_terms_clause`).

    ``word_similarity`` costs more than every ILIKE of a row together, and it
    only orders rows within one matched-term count (it is below 1), so it is
    computed for the rows whose count reaches the ``:depth``-th best count, not
    for every matching row. (A row one term short could tie only with a
    similarity of exactly 1 against exactly 0.) On 10k rows: the same top 10
    for 80 bench queries out of 80, ~40 % less time in PostgreSQL.

    The text ``word_similarity`` reads is carried in ``f`` (``s``) and the
    row's columns are read for the ``:depth`` best only (``best``): joined
    to the table before the cut, the tier's rows (estimated in thousands)
    were hash-joined against the whole table read through its primary key,
    sequential scans being off (EXPLAIN ANALYZE at 100k rows: 249 ms of a
    941 ms statement).

    Each row also carries the cut (``cut_level``, NULL when fewer than
    ``:depth`` candidates): the check of :mod:`~cpersona.storage.search_postgres_levels`
    when ``any_term`` is narrower than every term.
    """
    alias, table = arm.alias, arm.table
    lows = ", ".join(f"lower({column}) AS l{j}" for j, column in enumerate(arm.lowered))
    return text(
        f"WITH f AS MATERIALIZED (SELECT {alias}.id, {arm.similarity_of} AS s, {lows} FROM "
        f"(SELECT * FROM {table} {alias} WHERE {any_term} OFFSET 0) {alias} WHERE {arm.where}), "
        f"c AS (SELECT f.id, f.s, ({matched}) AS matched FROM f), "
        "cut AS (SELECT matched FROM c ORDER BY matched DESC LIMIT 1 OFFSET :depth - 1), "
        "best AS MATERIALIZED (SELECT c.id, c.matched + word_similarity(:q, c.s) AS score FROM c "
        "WHERE c.matched >= COALESCE((SELECT matched FROM cut), 0) ORDER BY score DESC, c.id LIMIT :depth) "
        f"SELECT {arm.columns}, best.score, (SELECT matched FROM cut) AS cut_level "
        f"FROM best JOIN {table} {alias} ON {alias}.id = best.id "
        f"ORDER BY best.score DESC, {alias}.id"
    )


def walk_statement(arm: Arm, found: str) -> Any:
    """With one term: the first ``:depth`` rows in id order whose score is the highest any row can have.

    See :mod:`~cpersona.storage.search_postgres_levels` (the walk). The
    table's lowest ``:examined`` ids are read through the primary key
    (every scope: the bound is on rows read, not on rows kept), then the
    term, the scope and ``word_similarity`` = 1 in that order. The score is
    :func:`tiered_statement`'s expression for a count of 1.
    """
    alias, table = arm.alias, arm.table
    return text(
        f"SELECT {arm.columns}, 1 + word_similarity(:q, {arm.similarity_of}) AS score FROM "
        f"(SELECT * FROM {table} {alias} ORDER BY {alias}.id LIMIT :examined) {alias} "
        f"WHERE {found} AND {arm.where} AND word_similarity(:q, {arm.similarity_of}) >= 1 "
        f"ORDER BY {alias}.id LIMIT :depth"
    )


DEADLINE_SETTING = text(f"SET LOCAL statement_timeout = {int(STATEMENT_DEADLINE_SECONDS * 1000)}")

# For the keyword statements, in the same round trip as the deadline: their
# candidate scan has only the trigram predicate (:func:`tiered_statement`),
# which the pg_trgm GIN indexes answer, but the planner prices ILIKE like one
# cheap operator (lowering and matching a row costs about a hundred) and
# would read every row instead, ~4x slower at 10k rows.
INDEXED_SETTINGS = text(
    f"SELECT set_config('statement_timeout', '{int(STATEMENT_DEADLINE_SECONDS * 1000)}', true),"
    " set_config('enable_seqscan', 'off', true)"
)
SIMILARITY_FLOOR = text("SELECT set_config('pg_trgm.word_similarity_threshold', :floor, true)")
SEQSCAN_BACK = text("SELECT set_config('enable_seqscan', 'on', true)")

_DEADLINE_KEY = "cpersona_deadline_for"


def with_deadline(session: Any, *, indexed: bool = False) -> None:
    """Put the statement deadline (and, ``indexed``, :data:`INDEXED_SETTINGS`) on ``session``'s transaction.

    Inside :meth:`Database.snapshot` a recall's reads share one transaction,
    so the deadline is set once per transaction, not once per statement (a
    round trip each); the caller of an ``indexed`` statement restores
    sequential scans after it (:data:`SEQSCAN_BACK`) for the reads that follow.
    """
    if indexed:
        session.execute(INDEXED_SETTINGS)
    else:
        transaction = session.connection() and session.get_transaction()
        if session.info.get(_DEADLINE_KEY) is transaction:
            return
        session.execute(DEADLINE_SETTING)
    session.info[_DEADLINE_KEY] = session.get_transaction()


class PostgresSearch(SqlSearch):
    """:class:`~cpersona.storage.search.SearchBackend` for a PostgreSQL database."""

    source_filter = staticmethod(source_filter)
    # PostgreSQL's LIKE is case-sensitive; ILIKE folds every script's case (SQLite
    # folds ASCII only, so this can match a little more). Backslash escapes by default.
    substring_match = "ILIKE :pattern"

    def __init__(self, db: Database, *, fts_enabled: bool = True, pgvector: bool | None = None) -> None:
        """``pgvector``: None = use it when the database carries its columns; False = numpy."""
        super().__init__(db, fts_enabled=fts_enabled)
        self._pgvector = pgvector

    # -- keyword arms -----------------------------------------------------------

    def keyword_memories(
        self, scope: Scope, query: str, depth: int, *, source_id: str = "", phrases: Sequence[str] = ()
    ) -> KeywordResult:
        if depth <= 0 or not (clean_query(query) or phrases):
            return KeywordResult([], "none")
        terms = query_terms(query)
        extra = phrase_terms(phrases, terms)  # a phrase is one ILIKE pattern, spaces included
        if self.fts_enabled and (terms or extra):
            where, params = sql_fragment(scope, "m")
            by_source, source_params = source_filter(source_id)
            arm = Arm("memories", "m", MEMORY_COLUMNS, ("m.content",), "m.content", f"{where} AND {by_source}")
            rows = self._ranked(
                "memories trigram",
                arm,
                {**params, **source_params, "q": clean_query(query), "depth": depth},
                terms,
                extra,
                depth,
            )
            if rows:
                return KeywordResult([Hit(memory_record(r), score) for r, score in rows], "fts")
            if rows is not None and terms:
                # No row in scope holds even one of the query's terms, each a substring
                # of the query under the same ILIKE test, so none holds the whole query:
                # the substring scan of the whole scope would come back empty.
                return KeywordResult([], "like")
        if not clean_query(query):  # phrases alone: no substring scan stands in for them
            return KeywordResult([], "none")
        return KeywordResult(self._like_memories(scope, query, depth, source_id), "like")

    def keyword_episodes(self, scope: Scope, query: str, depth: int, *, phrases: Sequence[str] = ()) -> list[Hit]:
        terms = query_terms(query)
        extra = phrase_terms(phrases, terms)
        if depth <= 0 or not self.fts_enabled or not (terms or extra):
            return []
        where, params = sql_fragment(scope, "e")
        arm = Arm("episodes", "e", EPISODE_COLUMNS, ("e.summary", "e.keywords"), "e.summary", where)
        rows = self._ranked(
            "episodes trigram", arm, {**params, "q": clean_query(query), "depth": depth}, terms, extra, depth
        )
        return [Hit(episode_record(r), score) for r, score in (rows or [])]

    def _ranked(
        self, what: str, arm: Arm, params: dict[str, Any], terms: list[str], phrases: Sequence[str], depth: int
    ) -> list[tuple[Any, float]] | None:
        """Rows matching the terms, ranked on the query's content words first.

        As on SQLite (``search_sqlite.ranking_terms``): function words ("what",
        "did", "the") match nearly every row, so the first pass ranks on the
        content words and phrases only; rows only a function word matches fill
        the list after them, scored below the last content-word row. Besides
        ranking like SQLite, this keeps the common case cheap: the rows scored
        are those holding a content word, not nearly the whole scope.

        The keyword budget is SQLite's too (``search_sqlite.within_budget``):
        when the terms together would have more than ``SCORED_ROWS_BUDGET``
        rows scored, the most common are left out, rarest kept first, here by
        the planner's estimates (:meth:`_term_counts`). Each candidate costs
        PostgreSQL a heap fetch and an ILIKE recheck (tens of µs a row at 100k),
        so a question whose common term matches a fifth of the table paid
        for every such row.
        """
        pieces = levels.pieces(terms) if len(terms) > 1 else {}
        extra = sorted({p for found in pieces.values() for p in found} - set(terms))
        counts = self._term_counts(arm.table, arm.lowered, [*terms, *extra])
        content = [*within_budget(ranking_terms(terms), counts), *phrases]
        every = [*within_budget(terms, counts), *phrases]
        costs = levels.lookup_costs(counts, pieces)
        # The walk's top score needs a row matching the whole query as one word: a query of one term.
        single = len(terms) + len(phrases) == 1
        rows = self._best(what, arm, params, content, costs, depth, walk=single)
        if rows is None:
            return None
        ranked = [(r, float(r.score)) for r in rows]
        if len(ranked) >= depth or set(content) == set(every):
            return ranked
        rest = self._best(what, arm, params, every, costs, depth, walk=single)
        seen = {r.id for r, _ in ranked}
        floor = min((score for _, score in ranked), default=0.0)
        fill = [r for r in (rest or []) if r.id not in seen][: depth - len(ranked)]
        ranked.extend((r, floor - 1.0 - i) for i, r in enumerate(fill))
        return ranked

    def _best(
        self,
        what: str,
        arm: Arm,
        params: dict[str, Any],
        terms: list[str],
        counts: dict[str, int],
        depth: int,
        *,
        walk: bool,
    ) -> list[Any] | None:
        """:func:`tiered_statement`'s rows for ``terms``, through an exact shortcut where one holds.

        The shortcuts (:mod:`~cpersona.storage.search_postgres_levels`) read
        fewer candidates; each is checked on its own rows (the walk: ``depth``
        rows found; a level: its cut reaches the level) and otherwise the full
        statement runs, so the rows are always the full statement's.
        """
        found, counted, term_params = _term_predicates(arm.lowered, terms)
        params = {**params, **term_params}
        if len(terms) == 1 and walk:
            walked = self._run(what, walk_statement(arm, found[0]), {**params, "examined": WALK_EXAMINED}, indexed=True)
            if walked is not None and len(walked) >= depth:
                return walked
        elif (level := levels.plan(terms, counts, depth)) is not None:
            while True:
                if level.every:
                    narrow = " AND ".join(found)
                else:
                    narrow = " OR ".join(p for t, p in zip(terms, found) if t in level.any_of)
                rows = self._run(what, tiered_statement(arm, narrow, _count_of(counted)), params, indexed=True)
                cut = rows[0].cut_level if rows else None
                if cut is not None and cut >= level.needed:
                    return rows
                # Its candidates held ``depth`` rows of ``cut`` or more terms: the level of that
                # cut is then exact, and still leaves out the commonest ``cut - 1`` terms.
                if cut is None or cut < 2 or level.every:
                    break
                level = levels.lower(terms, counts, cut)
        if len(terms) == 2 and levels.floor_worth_trying(terms, counts, params["q"]):
            if (rows := self._similar_first(what, arm, params, found, _count_of(counted), depth)) is not None:
                return rows
        return self._run(what, tiered_statement(arm, " OR ".join(found), _count_of(counted)), params, indexed=True)

    def _similar_first(
        self, what: str, arm: Arm, params: dict[str, Any], found: list[str], matched: str, depth: int
    ) -> list[Any] | None:
        """Two terms, fewer than ``depth`` rows holding both: the rows whose ``word_similarity`` reaches a floor first.

        See :data:`~cpersona.storage.search_postgres_levels.SIMILARITY_FLOORS`.
        The candidates are the rows holding both terms (the whole tier
        above one term) and the rows holding a term whose similarity is at
        least the floor (``%>``, which the pg_trgm GIN index answers). When
        they fill ``depth`` rows, every row left out scores below each row
        kept one term short, so the rows are the full statement's; else None.
        """
        every = " AND ".join(found)
        narrow = f"(({every}) OR (({' OR '.join(found)}) AND {arm.similarity_of} %> :q))"
        for floor in levels.SIMILARITY_FLOORS:
            rows = self._run(what, tiered_statement(arm, narrow, matched), params, indexed=True, similarity=floor)
            if rows is not None and len(rows) >= depth:
                return rows
        return None

    def _term_counts(self, table: str, columns: tuple[str, ...], terms: list[str]) -> dict[str, int]:
        """The planner's estimate of the rows each term's ILIKE matches over the whole table, for the budget.

        SQLite reads its index's own counts; a GIN index gives none without
        fetching every matching row, which is the cost the budget avoids. The
        estimates come from the column's statistics (a sample of rows, so a
        rare term reads as about one row in a hundred): what the budget needs
        is to tell a term held by a fifth of the table from one held by a few
        rows. {} (every term kept) for a single term or when no estimate came back.
        """
        if len(terms) <= 1:
            return {}
        alias = columns[0].split(".")[0]
        predicates = ["(" + " OR ".join(f"{c} ILIKE :t{i}" for c in columns) + ")" for i in range(len(terms))]
        params = {f"t{i}": like_pattern(term) for i, term in enumerate(terms)}
        return self.estimated_counts(f"{table} term estimates", table, alias, predicates, params, terms)

    def estimated_counts(
        self, what: str, table: str, alias: str, predicates: list[str], params: dict[str, Any], terms: list[str]
    ) -> dict[str, int]:
        """{term: the planner's row estimate of its predicate}; {} (every term kept) when the
        table is no larger than the budget, as SQLite decides, or when the EXPLAIN failed.

        The first sub-select estimates the table itself. A table found well under the
        budget is not asked again for :data:`SMALL_TABLE_SECONDS` (the EXPLAIN is a
        round trip, and a recall runs up to four of them).
        """
        budget = search_sqlite.SCORED_ROWS_BUDGET
        known = _small_tables.setdefault(self.db, {})
        if known.get((table, budget), 0.0) > time.monotonic():
            return {}
        rows = self._run(what, estimates_statement(table, alias, ["true", *predicates]), params)
        estimates = plan_estimates(rows[0][0], len(terms) + 1) if rows else None
        if not estimates:
            return {}
        if estimates[0] <= budget:
            if estimates[0] <= budget // 2:
                known[(table, budget)] = time.monotonic() + SMALL_TABLE_SECONDS
            return {}
        return dict(zip(terms, estimates[1:]))

    # -- vector arm (spec §5.6): pgvector, or numpy over the same window ---------------

    # The near window from vectors this process holds (vector_near_postgres); off: the exact scan in SQL.
    held_near = True

    def _near_scan(
        self, kind: Kind, scope: Scope, source_id: str, where: str, params: dict[str, Any], query: bytes
    ) -> list[tuple[float, int]] | None:
        """The near window's candidates from this process's copy, re-ranked in SQL by pgvector
        (the exact scan's cosine and order); None where the copy cannot answer exactly."""
        if not self.held_near or source_id:
            return None
        if self._pgvector is None:
            self._pgvector = pgvector_serves(self.db)
        if not self._pgvector:
            return None
        from cpersona.storage import vector_near_postgres as near  # numpy: there is a query vector

        index = near.for_database(self.db)
        if index.logged is False:
            return None
        stop, depth = int(params["start"]) + int(params["span"]), int(params["depth"])
        try:
            with self.db.read() as session:
                with_deadline(session)
                ids = index.near(session, kind, scope, query, stop, depth, float(params["threshold"]))
                if ids is None:
                    return None
                if not ids:
                    return []
                rows = session.execute(
                    near.rerank_statement(kind, where), {**params, "ids": ids, "qv": vector_text(query)}
                ).all()
        except DBAPIError as exc:
            log.warning("%s held near window unavailable, scanned in SQL: %s", kind, exc.orig)
            return None
        return [(float(r.cosine), r.id) for r in rows]

    def _vector_scan(self, kind: Kind, where: str, params: dict[str, Any], query: bytes) -> list[tuple[float, int]]:
        if self._pgvector is None:
            self._pgvector = pgvector_serves(self.db)
        scan = pgvector_scan if self._pgvector else numpy_scan
        try:
            with self.db.read() as session:
                with_deadline(session)
                if self._pgvector:
                    widths = hnsw_widths(self.db, "memories" if kind == "mem" else "episodes")
                    if (best := hnsw_scan(session, kind, where, params, query, widths)) is not None:
                        return best
                return scan(session, kind, where, params, query)
        except DBAPIError as exc:
            log.warning("%s vector search failed, treated as no match: %s", kind, exc.orig)
            return []

    # -- listings and scope facts -----------------------------------------------

    def episode_boundary(self, scope: Scope) -> datetime | None:
        # cpersona_instant() reads SQLite-style and ISO-8601 stamps (UTC when no
        # offset), NULL for anything else: "newest" by instant, as julianday does.
        where, params = sql_fragment(scope, "e")
        sql = text(f"SELECT max(cpersona_instant(e.created_at)) FROM episodes e WHERE {where}")
        with self.db.read() as session:
            value = session.execute(sql, params).scalar_one()
        return None if value is None else value.astimezone(timezone.utc)

    # -- execution ----------------------------------------------------------------

    def _run(
        self, what: str, sql: Any, params: dict[str, Any], *, indexed: bool = False, similarity: float | None = None
    ) -> list[Any] | None:
        """Rows of one search statement, or None when it failed or overran.

        ``indexed``: the statement's candidates come from an index
        (:data:`INDEXED_SETTINGS`). ``similarity``: the floor of pg_trgm's
        ``%>`` for this transaction (:meth:`_similar_first`).
        """
        with self.db.read() as session:
            try:
                with_deadline(session, indexed=indexed)
                if similarity is not None:
                    session.execute(SIMILARITY_FLOOR, {"floor": str(similarity)})
                rows = list(session.execute(sql, params))
                if indexed:
                    session.execute(SEQSCAN_BACK)
                return rows
            except DBAPIError as exc:
                log.warning("%s search failed, treated as no match: %s", what, exc.orig)
                return None
