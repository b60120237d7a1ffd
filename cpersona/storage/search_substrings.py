"""Substring probes for needles a trigram index cannot look up (CJK runs of one or two characters).

FTS5 trigram and pg_trgm both need three characters; a Japanese content word
is often two (``名前``, ``東京``, ``設定``) or one (``猫``). These two primitives
answer such needles with the engine's plain substring test (SQLite ``LIKE``,
PostgreSQL ``ILIKE``: the backend's ``substring_match``), each bounded:

- :meth:`SubstringProbes.containing` reads the newest ``depth`` rows holding a
  needle and stops there; only a needle rare in the scope walks the whole scope,
  which is what the LIKE fallback of spec KW-1 already does for such a query.
- :meth:`SubstringProbes.substring_stats` counts, over the scope's newest
  ``sample`` rows only, how many hold each needle: the document frequencies an
  IDF weighting needs, at a cost that does not grow with the store.

Both apply the scope and the per-user source filter inside their statement
(spec ISO-2, ISO-3) and run under the backend's statement deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cpersona.storage.scope import Scope, sql_fragment
from cpersona.storage.search import Hit
from cpersona.storage.sql_text import text

MAX_NEEDLES = 64  # one statement tests at most this many needles per row


@dataclass(frozen=True, slots=True)
class SubstringStats:
    """How common each needle is among the scope's newest ``rows`` memories."""

    rows: int
    mean_length: float  # characters
    frequencies: tuple[int, ...]  # rows holding needle i, in the order asked


class SubstringProbes:
    """Mixed into the SQL search backends; needs ``_run``, ``substring_match`` and ``source_filter``."""

    substring_match: str
    source_filter: Any
    _run: Callable[[str, Any, dict[str, Any]], list[Any] | None]

    def _substring_test(self, column: str, param: str) -> str:
        return f"{column} {self.substring_match.replace(':pattern', ':' + param)}"

    def _scope_where(self, scope: Scope, source_id: str) -> tuple[str, dict[str, Any]]:
        where, params = sql_fragment(scope, "m")
        by_source, source_params = type(self).source_filter(source_id)
        return f"{where} AND {by_source}", {**params, **source_params}

    def containing(self, scope: Scope, needle: str, depth: int, *, source_id: str = "") -> list[Hit]:
        """The newest ``depth`` memories whose content holds ``needle`` (case-folded as the engine's
        substring test folds), newest first; rows carry no score."""
        # search_sql builds its base class from this mixin, so its helpers are read at call time.
        from cpersona.storage.search_sql import MEMORY_COLUMNS, like_pattern, memory_record

        if depth <= 0 or not needle:
            return []
        where, params = self._scope_where(scope, source_id)
        sql = text(
            f"SELECT {MEMORY_COLUMNS} FROM memories m WHERE {self._substring_test('m.content', 'needle')} "
            f"AND {where} ORDER BY m.created_at DESC, m.id DESC LIMIT :depth"
        )
        rows = self._run("memories substring", sql, {**params, "needle": like_pattern(needle), "depth": depth})
        return [Hit(memory_record(r)) for r in rows or []]

    def substring_stats(
        self, scope: Scope, needles: Sequence[str], *, sample: int, source_id: str = ""
    ) -> SubstringStats:
        """Document frequencies of ``needles`` among the newest ``sample`` memories in scope.

        At most :data:`MAX_NEEDLES` needles are counted; later ones read as 0.
        A failed or overrun statement reads as an empty sample.
        """
        from cpersona.storage.search_sql import like_pattern

        counted = list(needles[:MAX_NEEDLES])
        where, params = self._scope_where(scope, source_id)
        held = "".join(
            f", sum(CASE WHEN {self._substring_test('s.content', f'n{i}')} THEN 1 ELSE 0 END) AS n{i}"
            for i in range(len(counted))
        )
        sql = text(
            f"SELECT count(*) AS total, avg(length(s.content)) AS mean_length{held} FROM "
            f"(SELECT m.content FROM memories m WHERE {where} "
            "ORDER BY m.created_at DESC, m.id DESC LIMIT :sample) AS s"
        )
        params.update({f"n{i}": like_pattern(needle) for i, needle in enumerate(counted)})
        rows = self._run("memories substring stats", sql, {**params, "sample": max(sample, 0)})
        if not rows or not rows[0].total:
            return SubstringStats(0, 0.0, (0,) * len(needles))
        row = rows[0]
        frequencies = [int(getattr(row, f"n{i}") or 0) for i in range(len(counted))]
        frequencies += [0] * (len(needles) - len(counted))
        return SubstringStats(int(row.total), float(row.mean_length or 0.0), tuple(frequencies))
