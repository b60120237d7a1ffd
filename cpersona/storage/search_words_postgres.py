"""The word channel on PostgreSQL: ``tsvector`` expression indexes (revision 0006).

Apart from :mod:`cpersona.storage.search_words` so that a SQLite start never
imports the PostgreSQL search code.
"""

from __future__ import annotations

from typing import Any

from cpersona.storage.scope import Scope, sql_fragment
from cpersona.storage.search import Hit
from cpersona.storage.search_postgres import PostgresSearch
from cpersona.storage.search_postgres import source_filter as pg_source_filter
from cpersona.storage.search_sql import EPISODE_COLUMNS, MEMORY_COLUMNS, episode_record, memory_record
from cpersona.storage.search_words import TEXT_SEARCH_CONFIG, pg_tsquery, pg_word_vector, word_terms
from cpersona.storage.sql_text import text


class PostgresWordSearch(PostgresSearch):
    """PostgreSQL search with the word channel (GIN indexes ``idx_memories_words``, ``idx_episodes_words``)."""

    def word_memories(self, scope: Scope, query: str, depth: int, *, source_id: str = "") -> list[Hit]:
        terms = word_terms(query)
        if depth <= 0 or not self.fts_enabled or not terms:
            return []
        where, params = sql_fragment(scope, "m")
        by_source, source_params = pg_source_filter(source_id)
        rows = self._words("memories words", "mem", "m", MEMORY_COLUMNS, "memories", f"{where} AND {by_source}",
                           {**params, **source_params}, terms, depth)
        return [Hit(memory_record(r), float(r.score)) for r in rows]

    def word_episodes(self, scope: Scope, query: str, depth: int) -> list[Hit]:
        terms = word_terms(query)
        if depth <= 0 or not self.fts_enabled or not terms:
            return []
        where, params = sql_fragment(scope, "e")
        rows = self._words("episodes words", "ep", "e", EPISODE_COLUMNS, "episodes", where, params, terms, depth)
        return [Hit(episode_record(r), float(r.score)) for r in rows]

    def _words(
        self, what: str, kind: str, alias: str, columns: str, table: str, where: str, params: dict[str, Any],
        terms: list[str], depth: int,
    ) -> list[Any]:
        vector = pg_word_vector(kind, alias)
        sql = text(
            f"SELECT {columns}, ts_rank({vector}, q.query, 1) AS score "
            f"FROM {table} {alias}, to_tsquery('{TEXT_SEARCH_CONFIG}'::regconfig, :tsquery) AS q(query) "
            f"WHERE {vector} @@ q.query AND {where} ORDER BY score DESC, {alias}.id LIMIT :depth"
        )
        return self._run(what, sql, {**params, "tsquery": pg_tsquery(terms), "depth": depth}) or []
