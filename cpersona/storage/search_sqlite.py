"""SearchBackend over SQLite: FTS5 trigram indexes, a LIKE fallback, recency.

The FTS5 tables (spec storage.md §4.5) index memory ``content`` and episode
``summary`` + ``keywords`` with the trigram tokenizer, so any substring of 3 or
more characters can be found, in any script. A term shorter than that matches
nothing at all, silently; queries that yield no usable term, or whose MATCH
finds nothing, fall back to a plain substring scan of memories (spec KW-1).

Every statement carries the isolation fragment of :mod:`cpersona.storage.scope`
in its own WHERE clause, next to the MATCH or LIKE it filters.

Cost bounds: a query contributes at most ``search.MAX_TERMS`` terms, each one
quoted as an FTS5 phrase (no user text is ever read as FTS5 syntax), and each
statement runs under a deadline; a statement that overruns it is abandoned and
treated like a failed search, so no query can hold a worker thread for long.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy.exc import DBAPIError

from cpersona.storage import bm25_bound, coarse_sqlite
from cpersona.storage.scope import Scope, sql_fragment
from cpersona.storage.search import (  # noqa: F401  (FUNCTION_WORDS, ranking_terms: imported from here too)
    FUNCTION_WORDS,
    Hit,
    Kind,
    KeywordResult,
    Record,
    RowKey,
    clean_query,
    phrase_terms,
    query_terms,
    ranking_terms,
)
from cpersona.storage.search_sql import (  # noqa: F401  (like_pattern is part of this module's API)
    EPISODE_COLUMNS,
    MEMORY_COLUMNS,
    SqlSearch,
    episode_record,
    like_pattern,
    memory_record,
)
from cpersona.storage.sql_text import text
from cpersona.storage.vectors_sqlite import scan_statement

log = logging.getLogger(__name__)

# A statement running longer than this is interrupted (progress handler).
# Ranked FTS over 100k rows takes well under 100 ms for common 3-letter terms
# (notes/stack.md §2); the deadline only stops pathological inputs.
STATEMENT_DEADLINE_SECONDS = 2.0
_PROGRESS_STEPS = 10_000  # VM instructions between deadline checks


def fts5_match(terms: Iterable[str]) -> str:
    """An FTS5 query that ORs ``terms``, each quoted so it is read literally."""
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)


def source_filter(source_id: str, alias: str = "m", *, extracted: bool = False) -> tuple[str, dict[str, Any]]:
    """The per-user ``source_id`` predicate of spec ISO-3, as SQL and parameters.

    An id ending in a letter or digit must match ``source.$.id`` exactly; one
    ending in anything else (``discord:``, ``docs/``) is a prefix. A row whose
    source is not valid JSON never matches (CASE keeps json_extract from
    raising on it). ``extracted``: ``alias`` is a coarse-index row, whose
    ``source_key`` holds that id already (storage/coarse_sqlite.py).
    """
    if not source_id:
        return "1=1", {}
    row_id = (
        f"{alias}.source_key"
        if extracted
        else f"CAST(CASE WHEN json_valid({alias}.source) THEN json_extract({alias}.source, '$.id') END AS TEXT)"
    )
    if source_id[-1].isalnum():
        return f"{row_id} = :source_id", {"source_id": source_id}
    return (
        f"substr({row_id}, 1, :source_id_len) = :source_id",
        {"source_id": source_id, "source_id_len": len(source_id)},
    )


# How many of the index's best matches are read before ranking inside the
# scope instead (see SqliteSearch._best_in_scope): room for a few rows of
# other scopes among the best without falling back.
PROBE_FACTOR = 1.5


@dataclass(frozen=True)
class _FtsSearch:
    """One keyword arm's two ways to the best rows in scope.

    ``joined`` ranks every match that is in scope (:match, :depth). ``probed``
    ranks the index alone and reads only its best :probe matches, each with its
    row when that row is in scope and with NULL columns when it is not.
    """

    joined: Any
    probed: Any
    fts: str = ""  # the FTS5 table both statements match against
    table: str = ""  # its content table
    pruned: Any = None  # ``probed`` scoring only the rows a phrase of :rare matches (bm25_bound)
    # Whether the split is made on exact phrase counts read first (the word indexes: a word's
    # row list is cheap to walk) or on upper bounds, proven after the statement (trigram).
    exact_counts: bool = True


# How many matching rows one ranked statement may score, as estimated from
# the index's own counts (see SqliteSearch._within_budget). bm25 scores every
# match before LIMIT keeps the best: a question's common terms ("Caroline",
# "time") match a large share of the rows, ~1.5 µs each to rank, so at 1M
# rows one statement would score hundreds of thousands of them.
SCORED_ROWS_BUDGET = 20_000


def trigrams(term: str) -> set[str]:
    """The trigram tokens FTS5 indexes for ``term`` (its tokenizer folds case)."""
    folded = term.lower()
    return {folded[i : i + 3] for i in range(len(folded) - 2)}


# How many counts one index's memo holds before it starts over (a few bytes each).
MEMO_KEYS = 50_000
# A memo key for a term's exact row count, apart from the trigram and word keys
# of the keyword budget (no query term holds a control character).
PHRASE_KEY = "\x01"
# A memo key for a lower bound on a term's row count (a count capped by LIMIT: _capped_probe).
FLOOR_KEY = "\x02"


class _CountMemo:
    """The keyword budget's counts of one FTS5 index, as read at one state of that index.

    The state is the index's own bookkeeping: the totals record (row and token
    counts: every insert and delete changes it) and the structure record (its
    segments and a counter of the leaves written: every flushed write,
    an update included, changes it). A count read at one state is the count
    at every moment the two records are byte for byte the same, in any
    process and over any connection, because each committed change of the
    index rewrites at least one of them. A recall's counter bumps do not
    touch the index, so counts survive them.
    """

    def __init__(self, state: tuple[Any, ...]) -> None:
        self.state = state
        self.counts: dict[str, int] = {}

    def remember(self, found: dict[str, int]) -> None:
        # A new dict, not an update: a thread reading the old one sees a whole mapping.
        self.counts = {**self.counts, **found} if len(self.counts) + len(found) <= MEMO_KEYS else dict(found)


_MEMOS: weakref.WeakKeyDictionary[Any, dict[str, _CountMemo]] = weakref.WeakKeyDictionary()
_MEMOS_LOCK = threading.Lock()


def _memo(db: Any, fts: str, state: tuple[Any, ...]) -> _CountMemo:
    """``db``'s memo for index ``fts`` at ``state``: the remembered one, or a new empty one."""
    with _MEMOS_LOCK:
        memos = _MEMOS.setdefault(db, {})
        memo = memos.get(fts)
        if memo is None or memo.state != state:
            memo = memos[fts] = _CountMemo(state)
        return memo


def _index_state(fts: str, table: str) -> Any:
    """The table's largest id and the index's totals and structure records (FTS5 keeps them at ids 1 and 10)."""
    return text(
        f"SELECT (SELECT max(id) FROM {table}) AS n, "
        f"(SELECT block FROM {fts}_data WHERE id = 1) AS totals, "
        f"(SELECT block FROM {fts}_data WHERE id = 10) AS structure"
    )


def _fts_search(fts: str, table: str, alias: str, columns: str, where: str, *, prunable: bool = False) -> _FtsSearch:
    joined = text(
        f"SELECT {columns}, {fts}.rank AS rank "
        f"FROM {fts} JOIN {table} {alias} ON {alias}.id = {fts}.rowid "
        f"WHERE {fts} MATCH :match AND {where} "
        f"ORDER BY {fts}.rank, {alias}.id LIMIT :depth"
    )
    # NOT INDEXED: next to the scope predicate the planner would rather walk
    # the scope's index (every row in scope) than look the few ids up.
    probed = text(
        f"SELECT {columns}, best.rank AS rank "
        f"FROM (SELECT rowid AS id, rank FROM {fts} WHERE {fts} MATCH :match ORDER BY rank, rowid LIMIT :probe) AS best "
        f"LEFT JOIN {table} {alias} NOT INDEXED ON {alias}.id = best.id AND {where} "
        "ORDER BY best.rank, best.id"
    )
    # +rowid: a plain rowid IN would reach FTS5 as one look-up per listed id,
    # each paying bm25's per-statement set-up (a walk of every phrase's rows).
    # On a trigram index (not ``prunable``: its exact counts cost a walk each) the
    # split comes from upper bounds and is proven afterwards (_capped_probe).
    pruned = text(
        f"SELECT {columns}, best.rank AS rank "
        f"FROM (SELECT rowid AS id, rank FROM {fts} WHERE {fts} MATCH :match "
        f"AND +rowid IN (SELECT rowid FROM {fts} WHERE {fts} MATCH :rare) ORDER BY rank, rowid LIMIT :probe) AS best "
        f"LEFT JOIN {table} {alias} NOT INDEXED ON {alias}.id = best.id AND {where} "
        "ORDER BY best.rank, best.id"
    )
    return _FtsSearch(joined, probed, fts, table, pruned, exact_counts=prunable)


def _julian_to_datetime(jd: float) -> datetime:
    # A julian day is a double: good to about a millisecond, so round to that.
    millis = round((jd - 2440587.5) * 86_400_000)
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=millis)


class SqliteSearch(SqlSearch):
    """:class:`~cpersona.storage.search.SearchBackend` for a SQLite database."""

    source_filter = staticmethod(source_filter)
    # SQLite's LIKE folds ASCII case; FTS5 trigram folds at least as widely.
    substring_match = "LIKE :pattern ESCAPE '\\'"
    # Next to the scope predicate SQLite's planner would walk the scope's index
    # (every row in scope: ~1 ms at 10k rows, ~10 ms at 100k) rather than look
    # the few ids up; NOT INDEXED leaves it only the primary key.
    by_id_hint = "NOT INDEXED"

    # -- keyword arms -----------------------------------------------------------

    def keyword_memories(
        self, scope: Scope, query: str, depth: int, *, source_id: str = "", phrases: Sequence[str] = ()
    ) -> KeywordResult:
        if depth <= 0 or not (clean_query(query) or phrases):
            return KeywordResult([], "none")
        terms = query_terms(query)
        extra = phrase_terms(phrases, terms)
        if self.fts_enabled and (terms or extra):
            hits = self._fts_memories(scope, terms, depth, source_id, extra)
            if hits:
                return KeywordResult(hits, "fts")
            if hits is not None and terms:
                # The MATCH ran and no row in scope holds even one of the query's
                # terms (each is a substring of the query, and the trigram index
                # folds case at least as far as LIKE does), so no row holds the
                # whole query: the LIKE pass, a scan of the whole scope, would
                # come back empty. Skipping it is the no-match recall's main cost.
                return KeywordResult([], "like")
        if not clean_query(query):
            return KeywordResult([], "none")
        return KeywordResult(self._like_memories(scope, query, depth, source_id), "like")

    def _fts_memories(
        self, scope: Scope, terms: list[str], depth: int, source_id: str, phrases: Sequence[str]
    ) -> list[Hit] | None:
        where, params = sql_fragment(scope, "m")
        by_source, source_params = source_filter(source_id)
        search = _fts_search("memories_fts", "memories", "m", MEMORY_COLUMNS, f"{where} AND {by_source}")
        params.update(source_params)
        rows = self._ranked("memories FTS", search, params, terms, depth, phrases)
        if rows is None:
            return None
        # bm25 is "more negative is better"; hits carry -bm25 so higher is better.
        return [Hit(memory_record(r), score) for r, score in rows]

    def _ranked(
        self,
        what: str,
        search: _FtsSearch,
        params: dict[str, Any],
        terms: list[str],
        depth: int,
        phrases: Sequence[str] = (),
    ) -> list[tuple[Any, float]] | None:
        """Rows of an FTS statement ranked on the query's content words.

        Rows only a function word matches come after every content-word row,
        when the content words found fewer than ``depth`` (so a list is never
        shorter than with every term). Their scores are set below the last
        content-word row's so raw scores stay in list order for rsf.
        """
        # Phrases (declared names) always rank as content, whatever words they hold.
        counts = self._term_counts(search, terms)
        content = [*self._within_budget(ranking_terms(terms), counts), *phrases]
        terms = [*self._within_budget(terms, counts), *phrases]
        rows = self._best_in_scope(what, search, params, content, depth, upper=counts)
        if rows is None:
            return None
        ranked = [(r, -float(rank)) for r, rank in rows]
        if len(ranked) >= depth or set(content) == set(terms):
            return ranked
        rest = self._best_in_scope(what, search, params, terms, depth, upper=counts)
        seen = {r.id for r, _ in ranked}
        floor = min((score for _, score in ranked), default=0.0)
        extra = [r for r, _ in (rest or []) if r.id not in seen][: depth - len(ranked)]
        # A function-word match ranks below every content-word match, in its own bm25 order.
        ranked.extend((r, floor - 1.0 - i) for i, r in enumerate(extra))
        return ranked

    @staticmethod
    def _within_budget(terms: list[str], counts: dict[str, int]) -> list[str]:
        """``terms`` (in their order) without the most common ones, while together they would
        have the index score more than :data:`SCORED_ROWS_BUDGET` rows.

        Rarest first: each term is kept while the kept terms' match counts still
        fit the budget, and the rarest is always kept. The terms left out are
        the ones bm25 weighs least (lowest IDF); a row they alone match would
        rank under every row holding a rarer term. Below the budget (every
        query of a corpus of a few thousand rows) nothing changes.
        """
        if len(terms) <= 1 or sum(counts.get(t, 0) for t in terms) <= SCORED_ROWS_BUDGET:
            return terms
        kept: set[str] = set()
        total = 0
        for term in sorted(terms, key=lambda t: counts.get(t, 0)):
            if kept and total + counts.get(term, 0) > SCORED_ROWS_BUDGET:
                break
            kept.add(term)
            total += counts.get(term, 0)
        return [t for t in terms if t in kept]

    def _term_counts(self, search: _FtsSearch, terms: list[str]) -> dict[str, int]:
        """An upper bound on the rows each term matches: its rarest trigram's row count.

        Read from an ``fts5vocab`` view of the index (a temporary table of the
        connection, so the file's schema is untouched); {} when it cannot be
        read, which keeps every term. Counting walks each trigram's row list
        (cheaper per row than scoring, but over every trigram of every term),
        so it is skipped when the table has no more rows than the budget (no
        statement can score more), and each trigram's count is remembered
        while the index is unchanged (:meth:`_budget_counts`).
        """
        if not search.fts or len(terms) <= 1:
            return {}
        grams = {term: trigrams(term) for term in terms}
        wanted = sorted(set().union(*grams.values()))
        if not wanted:
            return {}
        fts = search.fts

        def count(session: Any, missing: list[str]) -> dict[str, int]:
            session.execute(
                text(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{fts}_vocab USING fts5vocab(main, {fts}, 'row')")
            )
            marks = ", ".join(f":g{i}" for i in range(len(missing)))
            sql = text(f"SELECT term, doc FROM temp.{fts}_vocab WHERE term IN ({marks})")
            found = dict(self._rows(session, sql, {f"g{i}": g for i, g in enumerate(missing)}))
            return {g: int(found.get(g, 0)) for g in missing}

        found = self._budget_counts(search, wanted, count)
        if not found:
            return {}
        return {term: min((found[g] for g in gs), default=0) for term, gs in grams.items()}

    def _budget_counts(
        self, search: _FtsSearch, keys: list[str], count: Callable[[Any, list[str]], dict[str, int]]
    ) -> dict[str, int]:
        """``keys``' counts in ``search``'s index, for the keyword budget; {} when none are needed or readable.

        None are needed when the table has no more rows than the budget (its
        largest id bounds that in one index step). A count is remembered
        between recalls while the index's state is the one it was read at:
        ``count(session, missing)`` runs for the keys not remembered. The state
        is read in the same snapshot as the counts (see :class:`_CountMemo`).
        """
        with self.db.read() as session:
            dbapi = session.connection().connection.driver_connection
            try:
                with _deadline(dbapi, STATEMENT_DEADLINE_SECONDS):
                    largest, *state = self._rows(session, _index_state(search.fts, search.table), {})[0]
                    if (largest or 0) <= SCORED_ROWS_BUDGET:
                        return {}
                    memo = _memo(self.db, search.fts, tuple(state))
                    known = memo.counts
                    missing = [k for k in keys if k not in known]
                    if missing:
                        found = count(session, missing)
                        memo.remember(found)
                        known = {**known, **found}
            except DBAPIError as exc:
                log.warning("%s term counts unavailable, every term is ranked: %s", search.fts, exc.orig)
                return {}
        return {k: known[k] for k in keys}

    def _best_in_scope(
        self,
        what: str,
        search: _FtsSearch,
        params: dict[str, Any],
        terms: list[str],
        depth: int,
        *,
        upper: dict[str, int] | None = None,
    ) -> list[tuple[Any, Any]] | None:
        """The first ``depth`` (row, rank) pairs of ``search.joined`` for the OR of ``terms``: in scope, by rank then id.

        Joining every match to its row to test the scope cost about as much as
        ranking them (1.5 of 5 ms for a question at 10k rows), and nearly all
        of it is wasted: only ``depth`` rows are kept. So the index ranks alone
        first, the best few are read in scope, and when enough of them are in
        scope (or there are no more matches) they are the answer: rank and id
        do not depend on the scope, so the first ``depth`` in-scope rows of
        that order are the joined statement's rows. Otherwise (a scope holding
        few of the best matches) the joined statement runs as before.
        One statement does the first part; at 10k rows it costs about a third
        less than the joined one (LoCoMo questions: 5.5 -> 3.7 ms), and
        :meth:`_pruned_probe` spares it scoring the rows only common terms hold
        (:meth:`_capped_probe` on a trigram index, from ``upper``: each term's count or more).
        """
        match = fts5_match(terms)
        probe = max(depth, int(depth * PROBE_FACTOR))
        if search.exact_counts:
            best = self._pruned_probe(what, search, params, terms, probe)
        else:
            best = self._capped_probe(what, search, params, terms, probe, upper or {})
        if best is None:
            best = self._run(what, search.probed, {**params, "match": match, "probe": probe})
        if best is None:
            return None
        kept = [(r, r.rank) for r in best if r.id is not None]  # a NULL id: a match outside the scope
        if len(kept) >= depth or len(best) < probe:
            return kept[:depth]
        rows = self._run(what, search.joined, {**params, "match": match, "depth": depth})
        return None if rows is None else [(r, r.rank) for r in rows]

    def _bound_snapshot(
        self, what: str, search: _FtsSearch, body: Callable[[Any, Any, tuple[Any, Any], int], list[Any] | None]
    ) -> list[Any] | None:
        """``body(session, fts, state, total)`` in one snapshot under the statement deadline; None when
        the index's row count cannot be read or a statement fails (the caller ranks in full).

        Both splits (:meth:`_pruned_probe`, :meth:`_capped_probe`) prove their bound from
        counts and a row total that must be the ones their pruned statement sees, so the
        index's state (its totals and structure records, :class:`_CountMemo`) is read
        first in the same read transaction.
        """
        fts = search.fts
        with self.db.read() as session:
            dbapi = session.connection().connection.driver_connection
            try:
                with _deadline(dbapi, STATEMENT_DEADLINE_SECONDS):
                    _, totals, structure = self._rows(session, _index_state(fts, search.table), {})[0]
                    total = bm25_bound.total_rows(totals)
                    if total is None:
                        return None
                    return body(session, fts, (totals, structure), total)
            except DBAPIError as exc:
                log.warning("%s pruned search failed, ranked in full: %s", what, exc.orig)
                return None

    def _pruned_probe(
        self, what: str, search: _FtsSearch, params: dict[str, Any], terms: list[str], probe: int
    ) -> list[Any] | None:
        """``search.probed``'s rows, found without scoring the rows only the commonest terms match; None
        when that cannot be shown to give the same rows (the caller then runs ``probed`` itself).

        The split and its bound are :func:`bm25_bound.split`'s, from each term's
        exact row count (remembered while the index is unchanged) and the
        index's row count, all read in the snapshot the statement runs in.
        """
        if search.pruned is None or len(terms) < 2:
            return None

        def body(session: Any, fts: str, state: tuple[Any, Any], total: int) -> list[Any] | None:
            memo = _memo(self.db, fts, state)
            keys = {t: PHRASE_KEY + t for t in terms}
            missing = sorted({k for k in keys.values() if k not in memo.counts})
            known = memo.counts
            if missing:
                counts = ", ".join(f"(SELECT count(*) FROM {fts} WHERE {fts} MATCH :p{i})" for i in range(len(missing)))
                values = {f"p{i}": fts5_match([k[len(PHRASE_KEY) :]]) for i, k in enumerate(missing)}
                found = dict(zip(missing, (int(n) for n in self._rows(session, text(f"SELECT {counts}"), values)[0])))
                memo.remember(found)
                known = {**known, **found}
            plan = bm25_bound.split(terms, {t: known[k] for t, k in keys.items()}, total)
            if plan is None:
                return None
            rare, bound = plan
            values = {**params, "match": fts5_match(terms), "rare": fts5_match(rare), "probe": probe}
            rows = self._rows(session, search.pruned, values)
            if len(rows) < probe or -float(rows[-1].rank) < bound:
                return None
            return rows

        return self._bound_snapshot(what, search, body)

    def _capped_probe(
        self, what: str, search: _FtsSearch, params: dict[str, Any], terms: list[str], probe: int, upper: dict[str, int]
    ) -> list[Any] | None:
        """``search.probed``'s rows without scoring the rows only the commonest terms match, on an
        index whose exact counts cost what ranking does; None when that is not shown (the caller
        then runs ``probed`` itself).

        The split is :func:`bm25_bound.split_by_upper`'s, on ``upper`` (each
        term's rarest trigram's count, which the keyword budget read). After the
        pruned statement, its ``probe``-th score says how many rows each common
        term must hold for rows holding only common terms to score below it
        (:func:`bm25_bound.count_floors`); a count capped there (LIMIT) is a
        lower bound on the term's count, so an upper bound on its weight, and the
        walk stops at the cap. All in one snapshot, with the index's row count.
        """
        if search.pruned is None or len(terms) < 2 or not upper:
            return None

        def body(session: Any, fts: str, state: tuple[Any, Any], total: int) -> list[Any] | None:
            plan = bm25_bound.split_by_upper(terms, upper, total)
            if plan is None:
                return None
            rare, common = plan
            values = {**params, "match": fts5_match(terms), "rare": fts5_match(rare), "probe": probe}
            rows = self._rows(session, search.pruned, values)
            if len(rows) < probe:
                return None
            best = -float(rows[-1].rank)
            floors = bm25_bound.count_floors([upper[t] for t in common], total, best)
            if floors is None:
                return None
            memo = _memo(self.db, fts, state)
            capped = text(f"SELECT count(*) FROM (SELECT 1 FROM {fts} WHERE {fts} MATCH :p LIMIT :cap)")
            for term, floor in zip(common, floors):
                known = memo.counts.get(FLOOR_KEY + term, 0)  # the largest capped count read at this state
                if known < floor:
                    found = self._rows(session, capped, {"p": fts5_match([term]), "cap": floor})[0][0]
                    known = max(known, int(found))
                    memo.remember({FLOOR_KEY + term: known})
                if known < floor:
                    return None
            if best < bm25_bound.bound_from_floors(floors, total):
                return None
            return rows

        return self._bound_snapshot(what, search, body)

    def keyword_episodes(self, scope: Scope, query: str, depth: int, *, phrases: Sequence[str] = ()) -> list[Hit]:
        terms = query_terms(query)
        extra = phrase_terms(phrases, terms)
        if depth <= 0 or not self.fts_enabled or not (terms or extra):
            return []
        if not self._has_episodes(scope):
            return []
        where, params = sql_fragment(scope, "e")
        search = _fts_search("episodes_fts", "episodes", "e", EPISODE_COLUMNS, where)
        rows = self._ranked("episodes FTS", search, params, terms, depth, extra)
        return [Hit(episode_record(r), score) for r, score in (rows or [])]

    def _has_episodes(self, scope: Scope) -> bool:
        # Many scopes hold no episode at all; one indexed look is cheaper than
        # the one or two ranked statements that would find nothing.
        where, params = sql_fragment(scope, "e")
        return bool(self._run("episodes", text(f"SELECT 1 FROM episodes e WHERE {where} LIMIT 1"), params))

    # -- vector arm (spec §5.6): sqlite-vec ranks the window --------------------

    def _vector_scan(self, kind: Kind, where: str, params: dict[str, Any], query: bytes) -> list[tuple[float, int]]:
        rows = self._run(f"{kind} vector", scan_statement(kind, where), params)
        return [(float(r.cosine), r.id) for r in rows or []]

    def _coarse_scan(
        self, kind: Kind, scope: Scope, source_id: str, where: str, params: dict[str, Any], query: bytes
    ) -> list[tuple[float, int]] | None:
        """The window through the sign-bit index, best candidates re-ranked exactly (coarse_sqlite)."""
        if not coarse_sqlite.quantisable(query):
            return None
        coarse_where, coarse_params = sql_fragment(scope, "c")
        if kind == "mem":
            by_source, source_params = source_filter(source_id, "c", extracted=True)
            coarse_where = f"{coarse_where} AND {by_source}"
            coarse_params.update(source_params)
        proposed = self._process_index_scan(kind, scope, source_id, where, params, query)
        if proposed is not None:
            return proposed
        statement = coarse_sqlite.far_statement(kind, coarse_where, where)
        extra = {
            "qbits": coarse_sqlite.query_bits(query),
            "nbits": len(query) // 32,
            "k": coarse_sqlite.candidates(int(params["depth"])),
        }
        rows = self._run(f"{kind} coarse vector", statement, {**params, **coarse_params, **extra})
        return [(float(r.cosine), r.id) for r in rows or []]

    def _near_scan(
        self, kind: Kind, scope: Scope, source_id: str, where: str, params: dict[str, Any], query: bytes
    ) -> list[tuple[float, int]] | None:
        """The near window through this process's copy of the coarse index, where one is loaded
        (a reach past the window loads it at start): the window's rows are found on the copy,
        scored on float vectors it holds for them, and only the rows that can make the answer are
        re-ranked in SQL by sqlite-vec, so the list is the exact scan's (vector_index_sqlite.near).
        None (the exact scan in SQL) without a loaded copy of the query's width."""
        if not coarse_sqlite.quantisable(query):
            return None
        from cpersona.storage import vector_index_sqlite  # numpy is in use already: there is a query vector

        index = vector_index_sqlite.for_database(self.db)
        if not index.serves(kind, len(query) // 32):
            return None
        stop, depth = int(params["start"]) + int(params["span"]), int(params["depth"])
        with self.db.read() as session:
            try:
                conn = session.connection().connection.driver_connection
                found = index.near(conn, kind, scope, source_id, query, stop, depth, float(params["threshold"]))
            except self.db.engine.dialect.dbapi.Error as exc:
                log.warning("%s in-process near window unavailable, scanned in SQL: %s", kind, exc)
                return None
        if found is None:
            return None
        ids, upper = found
        if not ids:
            return []
        statement = coarse_sqlite.rerank_statement(kind, where, lower=False, upper=upper is not None)
        extra: dict[str, Any] = {"ids": json.dumps(ids)}
        if upper is not None:
            extra.update(hi_at=upper[0], hi_id=upper[1])
        rows = self._run(f"{kind} near vector re-rank", statement, {**params, **extra})
        return [(float(r.cosine), r.id) for r in rows or []]

    def _process_index_scan(
        self, kind: Kind, scope: Scope, source_id: str, where: str, params: dict[str, Any], query: bytes
    ) -> list[tuple[float, int]] | None:
        """The far list through this process's copy of the coarse index (storage/vector_index_sqlite.py):
        candidates from the arrays, then read and re-tested in SQL. None when the file has no
        change log to keep a copy in step (the SQL walk serves then)."""
        from cpersona.storage import vector_index_sqlite  # numpy: only once a far list runs

        window = (int(params["start"]), int(params["start"]) + int(params["span"]))
        k = coarse_sqlite.candidates(int(params["depth"]))
        index = vector_index_sqlite.for_database(self.db)
        with self.db.read() as session:
            try:
                conn = session.connection().connection.driver_connection
                found = index.propose(conn, kind, scope, source_id, coarse_sqlite.query_bits(query), window, k)
            except self.db.engine.dialect.dbapi.Error as exc:
                log.warning("%s in-process vector index unavailable, walked in SQL: %s", kind, exc)
                return None
        if found is None:
            return None
        ids, lower, upper = found
        if not ids:
            return []
        statement = coarse_sqlite.rerank_statement(kind, where, lower=lower is not None, upper=upper is not None)
        extra: dict[str, Any] = {"ids": json.dumps(ids)}
        if lower is not None:
            extra.update(lo_at=lower[0], lo_id=lower[1])
        if upper is not None:
            extra.update(hi_at=upper[0], hi_id=upper[1])
        rows = self._run(f"{kind} vector re-rank", statement, {**params, **extra})
        return [(float(r.cosine), r.id) for r in rows or []]

    def _rows_by_id(self, session: Any, head: str, tail: str, params: dict[str, Any], ids: list[int]) -> Iterable[Any]:
        """:meth:`SqlSearch.fetch`'s statement read off the driver's cursor (:meth:`_rows`).

        The same SQL, one ``:i<n>`` per id where SQLAlchemy's expanding IN rendered
        one ``?`` each, so the plan and the row order are the ones it had. Every
        recall hydrates its vector hits through here (twice with a far list), and
        SQLAlchemy's path (expanding the IN, result metadata, Row objects) was
        half of a call: 0.60 -> 0.30 ms at 100k rows, 10-28 ids (docs/benchmarks.md).
        """
        marks = ", ".join(f":i{n}" for n in range(len(ids)))
        return self._rows(
            session, text(f"{head} ({marks}) {tail}"), {**params, **{f"i{n}": i for n, i in enumerate(ids)}}
        )

    # -- listings and scope facts -----------------------------------------------

    def episode_boundary(self, scope: Scope) -> datetime | None:
        # julianday() reads both SQLite's own 'YYYY-MM-DD HH:MM:SS' and ISO-8601
        # stamps with offsets, so "newest" is decided by instant, not by text.
        where, params = sql_fragment(scope, "e")
        sql = text(f"SELECT max(julianday(e.created_at)) FROM episodes e WHERE {where}")
        with self.db.read() as session:
            jd = self._rows(session, sql, params)[0][0]
        return None if jd is None else _julian_to_datetime(float(jd))

    # -- execution ----------------------------------------------------------------

    def _rows(self, session: Any, sql: Any, params: dict[str, Any]) -> list[Any]:
        """Every row of one statement, read off the driver's cursor on the session's connection.

        Inside the session's transaction, so a snapshot() still holds. These
        statements are plain text with ``:name`` parameters, which the sqlite3
        API binds itself, and no column needs a SQLAlchemy type; SQLAlchemy's
        execution path (compiled-cache look-up, parameter processing, result
        metadata, Row objects) cost ~0.1 ms a statement, about a tenth of a
        recall's CPU at 10k rows. Rows are named tuples (``row.id`` reads as
        before); a driver error is raised as SQLAlchemy's, as session.execute would.
        """
        dbapi = session.connection().connection.driver_connection
        try:
            cursor = dbapi.execute(sql.text, params)
            shape = _row_shape(tuple(column[0] for column in cursor.description or ()))
            return [shape._make(row) for row in cursor]
        except self.db.engine.dialect.dbapi.Error as exc:
            raise DBAPIError.instance(sql.text, None, exc, self.db.engine.dialect.dbapi.Error) from exc

    def _run(self, what: str, sql: Any, params: dict[str, Any]) -> list[Any] | None:
        """Rows of one search statement, or None when it failed or overran."""
        with self.db.read() as session:
            try:
                with _deadline(session.connection().connection.driver_connection, STATEMENT_DEADLINE_SECONDS):
                    return self._rows(session, sql, params)
            except DBAPIError as exc:
                log.warning("%s search failed, treated as no match: %s", what, exc.orig)
                return None


# The PostgreSQL arms keep the same budget (search_postgres.estimated_rows gives their counts).
within_budget = SqliteSearch._within_budget


@lru_cache(maxsize=256)
def _row_shape(columns: tuple[str, ...]) -> Any:
    """A named-tuple type for one statement's columns (built once per distinct column list)."""
    return namedtuple("SearchRow", columns, rename=True)  # type: ignore[misc]  # "SELECT 1" names a column "1"


@contextmanager
def _deadline(dbapi: Any, seconds: float) -> Iterator[None]:
    """Interrupt statements of the driver connection ``dbapi`` that run longer than ``seconds``."""
    if not hasattr(dbapi, "set_progress_handler"):  # pragma: no cover - other drivers
        yield
        return
    stop_at = time.monotonic() + seconds
    dbapi.set_progress_handler(lambda: int(time.monotonic() > stop_at), _PROGRESS_STEPS)
    try:
        yield
    finally:
        dbapi.set_progress_handler(None, 0)
