"""The word-level lexical channel: whole words, stemmed, beside the trigram index.

The trigram arms (``search_sqlite``, ``search_postgres``) find substrings of 3
or more characters: they cannot find ``Q1`` or ``AI`` at all, and they treat
"runs" and "running" as unrelated strings. This channel searches the query's
Latin-script words, stemmed, in the word indexes of revision 0006: FTS5
``porter unicode61`` on SQLite (ranked by bm25), the ``english`` text search
configuration on PostgreSQL (ranked by ``ts_rank`` normalised by length, as bm25 is). Recall fuses its list
with the trigram one (``services/recall/words.py``); CJK text, identifiers and
substrings stay with trigram, so a query with no Latin-script content word
has no word list at all.

Each backend gains the two methods by subclassing; :func:`~cpersona.storage.search.open_search`
returns these subclasses, so everything else the backends do is untouched.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy.exc import DBAPIError

from cpersona.storage.scope import Scope, sql_fragment
from cpersona.storage.search import FUNCTION_WORDS, MAX_QUERY_CHARS, MAX_TERMS, Hit, WordSpread, clean_query
from cpersona.storage.sql_text import text
from cpersona.storage.search_sql import EPISODE_COLUMNS, MEMORY_COLUMNS, episode_record, memory_record
from cpersona.storage.search_sqlite import (
    PHRASE_KEY,
    STATEMENT_DEADLINE_SECONDS,
    SqliteSearch,
    _deadline,
    _fts_search,
    _FtsSearch,
    fts5_match,
)
from cpersona.storage.search_sqlite import source_filter as sqlite_source_filter

log = logging.getLogger(__name__)

# A word as unicode61 splits text: a run of letters and digits (underscore and
# every other mark separate words).
_WORD = re.compile(r"[^\W_]+")
# Words outside Latin script's reach: any CJK character sends the word to trigram.
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uff66-\uff9f\uac00-\ud7af]")
# Function words shorter than 3 letters. The trigram terms never held them
# (too short to match); as words they would match nearly every row.
SHORT_FUNCTION_WORDS = frozenset("a an am as at be by do he i if in is it me my no of on or so to up us we".split())


def word_terms(query: str) -> list[str]:
    """The query's content words for the word indexes, case-folded, in order, no duplicates.

    Function words are left out (the word index has no "rank them last" pass:
    a question made only of them has no word list); so are words holding a CJK
    character. Words of one or two characters stay: that is what this channel
    finds and trigram cannot (``Q1``). At most :data:`MAX_TERMS`.
    """
    terms: dict[str, None] = {}
    for word in _WORD.findall(clean_query(query[:MAX_QUERY_CHARS]).casefold()):
        if word in FUNCTION_WORDS or word in SHORT_FUNCTION_WORDS or _CJK.search(word):
            continue
        terms.setdefault(word, None)
        if len(terms) >= MAX_TERMS:
            break
    return list(terms)


# -- SQLite: FTS5 porter unicode61 ---------------------------------------------------------


class SqliteWordSearch(SqliteSearch):
    """SQLite search with the word channel (tables ``memories_words``, ``episodes_words``)."""

    def word_memories(self, scope: Scope, query: str, depth: int, *, source_id: str = "") -> list[Hit]:
        terms = word_terms(query)
        if depth <= 0 or not self.fts_enabled or not terms:
            return []
        where, params = sql_fragment(scope, "m")
        by_source, source_params = sqlite_source_filter(source_id)
        search = _fts_search(
            "memories_words", "memories", "m", MEMORY_COLUMNS, f"{where} AND {by_source}", prunable=True
        )
        terms = self._within_budget(terms, self._word_counts(search, terms))
        rows = self._best_in_scope("memories words", search, {**params, **source_params}, terms, depth)
        return [Hit(memory_record(r), -float(rank)) for r, rank in rows or []]  # -bm25: higher is better

    def word_episodes(self, scope: Scope, query: str, depth: int) -> list[Hit]:
        terms = word_terms(query)
        if depth <= 0 or not self.fts_enabled or not terms or not self._has_episodes(scope):
            return []
        where, params = sql_fragment(scope, "e")
        search = _fts_search("episodes_words", "episodes", "e", EPISODE_COLUMNS, where, prunable=True)
        terms = self._within_budget(terms, self._word_counts(search, terms))
        rows = self._best_in_scope("episodes words", search, params, terms, depth)
        return [Hit(episode_record(r), -float(rank)) for r, rank in rows or []]

    def word_spread(
        self, scope: Scope, query: str, ids: Sequence[int], *, source_id: str = "", cap: int, share: float
    ) -> WordSpread | None:
        terms = word_terms(query)
        if not self.fts_enabled or not terms or not ids or cap <= 0:
            return None
        where, params = sql_fragment(scope, "m")
        by_source, source_params = sqlite_source_filter(source_id)
        params = {**params, **source_params}
        in_scope = f"{where} AND {by_source}"
        words = {f"w{i}": fts5_match([t]) for i, t in enumerate(terms)}
        rows = text(f"SELECT count(*) FROM (SELECT 1 FROM memories m WHERE {in_scope} LIMIT :cap)")
        # Each word's count stops just past the share (a LIMIT inside): a common word is not walked to its end.
        counts = text(
            "SELECT "
            + ", ".join(
                f"(SELECT count(*) FROM (SELECT 1 FROM memories_words f JOIN memories m ON m.id = f.rowid "
                f"WHERE memories_words MATCH :{w} AND {in_scope} LIMIT :enough))"
                for w in words
            )
        )
        marks = ", ".join(f":i{j}" for j in range(len(ids)))
        # +rowid: the ids filter the word's matches; as a plain rowid IN FTS5 would run one look-up per id.
        held = text(
            " UNION ALL ".join(
                f"SELECT rowid AS id, {i} AS word FROM memories_words "
                f"WHERE memories_words MATCH :{w} AND +rowid IN ({marks})"
                for i, w in enumerate(words)
            )
        )
        with self.db.read() as session:
            dbapi = session.connection().connection.driver_connection
            try:
                with _deadline(dbapi, STATEMENT_DEADLINE_SECONDS):
                    total = int(self._rows(session, rows, {**params, "cap": cap})[0][0])
                    if not 0 < total < cap:  # an empty scope, or one the cap cut short: no share to judge by
                        return WordSpread(total, {}, {})
                    enough = int(share * total) + 1
                    found = self._rows(session, counts, {**params, **words, "enough": enough})[0]
                    pairs = self._rows(session, held, {**words, **{f"i{j}": int(v) for j, v in enumerate(ids)}})
            except DBAPIError as exc:
                log.warning("word spread unavailable: %s", exc.orig)
                return None
        holds: dict[int, set[str]] = {}
        for row in pairs:
            holds.setdefault(int(row.id), set()).add(terms[int(row.word)])
        return WordSpread(total, dict(zip(terms, (int(n) for n in found))), {k: frozenset(v) for k, v in holds.items()})

    def _word_counts(self, search: _FtsSearch, terms: list[str]) -> dict[str, int]:
        """Each word's exact match count in the word index, for the keyword budget (``_within_budget``).

        The index holds porter stems, which this side cannot spell, so each word
        is counted by a MATCH of its own: a walk of its row list with no score,
        about a twentieth of what ranking the same rows with bm25 costs (100k
        rows, bench/recall_profile.py), remembered while the index is unchanged
        (``_budget_counts``). {} (every word ranked) when the table is no larger
        than the budget or a count fails.
        """
        if len(terms) <= 1:
            return {}
        fts = search.fts

        # Under the split's keys (a word's count is its phrase's count): one count serves both.
        def count(session: Any, missing: list[str]) -> dict[str, int]:
            counts = ", ".join(f"(SELECT count(*) FROM {fts} WHERE {fts} MATCH :w{i})" for i in range(len(missing)))
            params = {f"w{i}": fts5_match([k[len(PHRASE_KEY) :]]) for i, k in enumerate(missing)}
            return dict(zip(missing, (int(n) for n in self._rows(session, text(f"SELECT {counts}"), params)[0])))

        found = self._budget_counts(search, [PHRASE_KEY + t for t in terms], count)
        return {t: found[PHRASE_KEY + t] for t in terms} if found else {}


# -- PostgreSQL: tsvector expression indexes --------------------------------------------------

TEXT_SEARCH_CONFIG = "english"


def pg_word_vector(kind: str, alias: str = "") -> str:
    """The tsvector expression of a row's text; revision 0006 indexes exactly this (alias-free)."""
    prefix = f"{alias}." if alias else ""
    column = f"{prefix}content" if kind == "mem" else f"{prefix}summary || ' ' || {prefix}keywords"
    return f"to_tsvector('{TEXT_SEARCH_CONFIG}'::regconfig, {column})"


def pg_tsquery(terms: list[str]) -> str:
    """``to_tsquery`` text OR-ing ``terms``; each term is letters and digits only (``_WORD``)."""
    return " | ".join(terms)
