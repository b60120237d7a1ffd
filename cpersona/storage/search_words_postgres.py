"""The word channel on PostgreSQL: ``tsvector`` expression indexes (revision 0006).

The GIN expression indexes find the matching rows; ranking them with
``ts_rank`` needs each match's ``tsvector``, which the index does not hand
back, so without help PostgreSQL rebuilds it from the text for every match
(~1,750 rows for a common question at 10k rows: most of the statement's
time). :func:`ensure_word_columns` (run at every start after Alembic, like the
pgvector column) adds a stored generated column ``word_vector`` holding
exactly the indexed expression, and the ranking reads it. Generated, it is
always equal to the text whichever writer wrote the row, and PostgreSQL
recomputes it only when the text changes (counter bumps leave it alone).
Outside the Alembic history for the same reason as the pgvector column: it
is derived, and a database without it ranks the same from the expression.

Apart from :mod:`cpersona.storage.search_words` so that a SQLite start never
imports the PostgreSQL search code.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from cpersona.storage.engine import Database
from cpersona.storage.scope import Scope, sql_fragment
from cpersona.storage.search import Hit, WordSpread
from cpersona.storage.search_postgres import PostgresSearch
from cpersona.storage.search_postgres import source_filter as pg_source_filter
from cpersona.storage.search_sqlite import within_budget
from cpersona.storage.search_sql import EPISODE_COLUMNS, MEMORY_COLUMNS, episode_record, memory_record
from cpersona.storage.search_words import TEXT_SEARCH_CONFIG, pg_tsquery, pg_word_vector, word_terms
from cpersona.storage.sql_text import text
from cpersona.storage.vectors_postgres import has_column

WORD_VECTOR_COLUMN = "word_vector"
_WORD_TABLES = (("mem", "memories"), ("ep", "episodes"))


def ensure_word_columns(conn: Connection) -> None:
    """Add the stored ``word_vector`` columns where they are missing (``conn`` holds the writer lock)."""
    for kind, table in _WORD_TABLES:
        conn.exec_driver_sql(
            f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {WORD_VECTOR_COLUMN} tsvector"
            f" GENERATED ALWAYS AS ({pg_word_vector(kind)}) STORED"
        )


_stored_word_vectors: weakref.WeakKeyDictionary[Database, bool] = weakref.WeakKeyDictionary()


def _has_word_columns(db: Database) -> bool:
    known = _stored_word_vectors.get(db)
    if known is None:
        with db.read() as session:
            conn = session.connection()
            known = all(has_column(conn, table, WORD_VECTOR_COLUMN) for _, table in _WORD_TABLES)
        _stored_word_vectors[db] = known
    return known


class PostgresWordSearch(PostgresSearch):
    """PostgreSQL search with the word channel (GIN indexes ``idx_memories_words``, ``idx_episodes_words``)."""

    def word_memories(self, scope: Scope, query: str, depth: int, *, source_id: str = "") -> list[Hit]:
        terms = word_terms(query)
        if depth <= 0 or not self.fts_enabled or not terms:
            return []
        where, params = sql_fragment(scope, "m")
        by_source, source_params = pg_source_filter(source_id)
        rows = self._words(
            "memories words",
            "mem",
            "m",
            MEMORY_COLUMNS,
            "memories",
            f"{where} AND {by_source}",
            {**params, **source_params},
            terms,
            depth,
        )
        return [Hit(memory_record(r), float(r.score)) for r in rows]

    def word_episodes(self, scope: Scope, query: str, depth: int) -> list[Hit]:
        terms = word_terms(query)
        if depth <= 0 or not self.fts_enabled or not terms:
            return []
        where, params = sql_fragment(scope, "e")
        rows = self._words("episodes words", "ep", "e", EPISODE_COLUMNS, "episodes", where, params, terms, depth)
        return [Hit(episode_record(r), float(r.score)) for r in rows]

    def word_spread(
        self, scope: Scope, query: str, ids: Sequence[int], *, source_id: str = "", cap: int, share: float
    ) -> WordSpread | None:
        terms = word_terms(query)
        if not self.fts_enabled or not terms or not ids or cap <= 0:
            return None
        where, params = sql_fragment(scope, "m")
        by_source, source_params = pg_source_filter(source_id)
        params = {**params, **source_params}
        in_scope = f"{where} AND {by_source}"
        vector = pg_word_vector("mem", "m")  # the indexed expression: the GIN index finds each word's rows
        words = {f"w{i}": t for i, t in enumerate(terms)}

        def matches(w: str) -> str:
            return f"{vector} @@ to_tsquery('{TEXT_SEARCH_CONFIG}'::regconfig, :{w})"

        rows = text(f"SELECT count(*) FROM (SELECT 1 FROM memories m WHERE {in_scope} LIMIT :cap) AS n")
        found = self._run("word spread", rows, {**params, "cap": cap})
        if not found:
            return None
        total = int(found[0][0])
        if not 0 < total < cap:  # an empty scope, or one the cap cut short: no share to judge by
            return WordSpread(total, {}, {})
        # Each word's count stops just past the share: a common word is not walked to its end.
        counts = text(
            "SELECT "
            + ", ".join(
                f"(SELECT count(*) FROM (SELECT 1 FROM memories m WHERE {matches(w)} AND {in_scope} LIMIT :enough) AS c{i})"
                for i, w in enumerate(words)
            )
        )
        flags = ", ".join(f"{matches(w)} AS has{i}" for i, w in enumerate(words))
        held = text(f"SELECT m.id, {flags} FROM memories m WHERE m.id = ANY(:ids)")
        counted = self._run("word spread", counts, {**params, **words, "enough": int(share * total) + 1})
        listed = self._run("words held", held, {**words, "ids": [int(v) for v in ids]})
        if counted is None or listed is None:
            return None
        holds: dict[int, frozenset[str]] = {}
        for row in listed:
            kept = frozenset(t for i, t in enumerate(terms) if row[1 + i])
            if kept:
                holds[int(row[0])] = kept
        return WordSpread(total, dict(zip(terms, (int(n) for n in counted[0]))), holds)

    def _words(
        self,
        what: str,
        kind: str,
        alias: str,
        columns: str,
        table: str,
        where: str,
        params: dict[str, Any],
        terms: list[str],
        depth: int,
    ) -> list[Any]:
        vector = pg_word_vector(kind, alias)  # the indexed expression finds the rows
        if len(terms) > 1:  # SQLite's keyword budget, on the planner's estimates (PostgresSearch._ranked)
            predicates = [
                f"{vector} @@ to_tsquery('{TEXT_SEARCH_CONFIG}'::regconfig, :w{i})" for i in range(len(terms))
            ]
            counts = self.estimated_counts(
                f"{table} word estimates", table, alias, predicates, {f"w{i}": t for i, t in enumerate(terms)}, terms
            )
            terms = within_budget(terms, counts)
        stored = f"{alias}.{WORD_VECTOR_COLUMN}" if _has_word_columns(self.db) else vector
        sql = text(
            f"SELECT {columns}, ts_rank({stored}, q.query, 1) AS score "
            f"FROM {table} {alias}, to_tsquery('{TEXT_SEARCH_CONFIG}'::regconfig, :tsquery) AS q(query) "
            f"WHERE {vector} @@ q.query AND {where} ORDER BY score DESC, {alias}.id LIMIT :depth"
        )
        return self._run(what, sql, {**params, "tsquery": pg_tsquery(terms), "depth": depth}) or []
