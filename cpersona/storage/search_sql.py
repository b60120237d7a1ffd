"""What the SQL search backends share: row shapes, recency, pool count, hydration, profile,
the scope's memory span and a period's rows (time spelled by storage/dialect.py).

Only the statements that read the same on SQLite and PostgreSQL live here; each
backend supplies its own ``source_filter`` (the spec ISO-3 predicate needs the
engine's JSON functions), its keyword and vector arms, the episode boundary
(date arithmetic differs) and ``_run`` (how a statement deadline is enforced).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam

from cpersona.storage.engine import Database
from cpersona.storage.scope import Scope, sql_fragment
from cpersona.storage.search import Hit, Kind, Record, RowKey, clean_query
from cpersona.storage.sql_text import text
from cpersona.storage.vectors_sqlite import scan_parameters, usable_query

# spec KW-2: substring patterns longer than this are not run at all.
LIKE_MAX_PATTERN_BYTES = 50_000

MEMORY_COLUMNS = (
    "m.id, m.content, m.source, m.timestamp, m.msg_id, m.created_at, "
    "m.embedding IS NOT NULL AS has_embedding, m.recall_count, m.last_recalled_at"
)
EPISODE_COLUMNS = (
    "e.id, e.summary, e.start_time, e.end_time, e.created_at, e.resolved, e.embedding IS NOT NULL AS has_embedding"
)


def like_pattern(query: str) -> str:
    """``%query%`` with LIKE's wildcards and the escape character escaped."""
    escaped = query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def memory_record(row: Any) -> Record:
    return Record(
        kind="mem",
        id=row.id,
        text=row.content,
        source=row.source,
        timestamp=row.timestamp or "",
        msg_id=row.msg_id or "",
        created_at=row.created_at or "",
        has_embedding=bool(row.has_embedding),
        recall_count=row.recall_count or 0,
        last_recalled_at=row.last_recalled_at,
    )


def episode_record(row: Any) -> Record:
    return Record(
        kind="ep",
        id=row.id,
        text=row.summary,
        source="",
        timestamp=row.start_time or row.created_at or "",
        created_at=row.created_at or "",
        ended_at=row.end_time or "",
        resolved=bool(row.resolved),
        has_embedding=bool(row.has_embedding),
    )


class SqlSearch(ABC):
    """The engine-neutral half of :class:`~cpersona.storage.search.SearchBackend`."""

    # (source_id, alias) -> (SQL predicate, parameters); set by each backend.
    source_filter: Callable[..., tuple[str, dict[str, Any]]]
    # The substring test against :pattern, with backslash as the escape character.
    substring_match: str
    # Written after the table of a read by id (fetch): how to keep the planner
    # on the primary key when a scope predicate sits beside the ids.
    by_id_hint: str = ""

    def __init__(self, db: Database, *, fts_enabled: bool = True) -> None:
        self.db = db
        self.fts_enabled = fts_enabled

    def _rows(self, session: Any, sql: Any, params: dict[str, Any]) -> list[Any]:
        """Every row of one statement on ``session``; a backend may read them another way (SQLite: the driver's cursor)."""
        return list(session.execute(sql, params))

    @abstractmethod
    def _run(self, what: str, sql: Any, params: dict[str, Any]) -> list[Any] | None:
        """Rows of one search statement under the backend's deadline, or None when it failed."""

    @abstractmethod
    def _vector_scan(self, kind: Kind, where: str, params: dict[str, Any], query: bytes) -> list[tuple[float, int]]:
        """(cosine, id) of the scan window's best rows, best first; [] when the scan failed."""

    def _coarse_scan(
        self, kind: Kind, scope: Scope, source_id: str, where: str, params: dict[str, Any], query: bytes
    ) -> list[tuple[float, int]] | None:
        """(cosine, id) of the window's best rows found through a compact index and re-ranked by
        exact cosine, best first; None when this backend (or this query's width) has no such index."""
        return None

    def _near_scan(
        self, kind: Kind, scope: Scope, source_id: str, where: str, params: dict[str, Any], query: bytes
    ) -> list[tuple[float, int]] | None:
        """(cosine, id) of the near window's best rows ranked exactly from vectors the process
        holds, best first; None when this backend holds none (the engine then scans the window)."""
        return None

    def vector_candidates(
        self,
        kind: Kind,
        scope: Scope,
        query: bytes,
        depth: int,
        *,
        threshold: float,
        window: tuple[int, int],
        source_id: str = "",
    ) -> list[Hit]:
        """The vector arm (spec §5.6): scope and source inside the scan, the engine ranks the window."""
        if depth <= 0 or window[1] <= window[0] or not usable_query(query):
            return []
        alias = "m" if kind == "mem" else "e"
        where, params = sql_fragment(scope, alias)
        if kind == "mem":
            by_source, source_params = type(self).source_filter(source_id)
            where, params = f"{where} AND {by_source}", {**params, **source_params}
        params.update(scan_parameters(query, window=window, threshold=threshold, depth=depth))
        # The near list (from position 0: the exact window, VEC-2) is ranked exactly, from vectors
        # the process holds when the backend keeps them; a far list goes through the backend's
        # coarse index when it has one.
        if window[0] > 0:
            best = self._coarse_scan(kind, scope, source_id, where, params, query)
        else:
            best = self._near_scan(kind, scope, source_id, where, params, query)
        if best is None:
            best = self._vector_scan(kind, where, params, query)
        if not best:
            return []
        # Hydrate through the same scope: a row deleted or moved since the scan is dropped.
        records = self.fetch(scope, [(kind, row_id) for _, row_id in best])
        return [Hit(records[(kind, i)], cosine) for cosine, i in best if (kind, i) in records]

    def _like_memories(self, scope: Scope, query: str, depth: int, source_id: str) -> list[Hit]:
        """Newest-first substring matches (spec KW-1), scope and source inside the WHERE.

        The reference reads up to max(depth*5, 50) rows and filters them in
        Python; with the filters in SQL, reading ``depth`` rows is the same answer.
        """
        pattern = like_pattern(clean_query(query))
        if len(pattern.encode("utf-8")) > LIKE_MAX_PATTERN_BYTES:
            return []
        where, params = sql_fragment(scope, "m")
        by_source, source_params = type(self).source_filter(source_id)
        sql = text(
            f"SELECT {MEMORY_COLUMNS} FROM memories m "
            f"WHERE m.content {self.substring_match} AND {where} AND {by_source} "
            "ORDER BY m.created_at DESC, m.id DESC LIMIT :depth"
        )
        rows = self._run("memories LIKE", sql, {**params, **source_params, "pattern": pattern, "depth": depth})
        return [Hit(memory_record(r)) for r in (rows or [])]

    def next_memories(self, scope: Scope, ids: Sequence[int], *, source_id: str = "", reach: int) -> dict[int, Record]:
        """For each id, the memory stored next in scope and source (the smallest larger id,
        at most ``reach`` ids on), keyed by the id it follows; ids with none are left out.

        ``reach`` bounds each look-up to a short range of the primary key, so an id
        with no later row in scope costs one short index walk, not a table scan.
        """
        if not ids or reach <= 0:
            return {}
        where_m, params = sql_fragment(scope, "m")
        where_n, _ = sql_fragment(scope, "n")
        by_source_m, source_params = type(self).source_filter(source_id, "m")
        by_source_n, _ = type(self).source_filter(source_id, "n")
        # Keep the planner on the primary key range (by_id_hint): beside the scope
        # predicate it would rather walk the scope's index, every row in scope.
        hint = self.by_id_hint
        parts = []
        for i, row_id in enumerate(ids):
            params[f"q{i}"] = int(row_id)
            parts.append(
                f"SELECT :q{i} AS after_id, {MEMORY_COLUMNS} FROM memories m {hint} WHERE m.id = "
                f"(SELECT min(n.id) FROM memories n {hint} WHERE n.id > :q{i} AND n.id <= :q{i} + :reach "
                f"AND {where_n} AND {by_source_n}) AND {where_m} AND {by_source_m}"
            )
        rows = self._run("next memories", text(" UNION ALL ".join(parts)), {**params, **source_params, "reach": reach})
        return {int(r.after_id): memory_record(r) for r in rows or []}

    def _newest(self, what: str, columns: str, scope: Scope, depth: int, source_id: str) -> list[Any]:
        """Rows of the ``depth`` newest memories in scope and source (created_at desc, id desc)."""
        if depth <= 0:
            return []
        where, params = sql_fragment(scope, "m")
        by_source, source_params = type(self).source_filter(source_id)
        sql = text(
            f"SELECT {columns} FROM memories m WHERE {where} AND {by_source} "
            "ORDER BY m.created_at DESC, m.id DESC LIMIT :depth"
        )
        return self._run(what, sql, {**params, **source_params, "depth": depth}) or []

    def recent_memories(self, scope: Scope, depth: int, *, source_id: str = "") -> list[Hit]:
        return [Hit(memory_record(r)) for r in self._newest("recency", MEMORY_COLUMNS, scope, depth, source_id)]

    def recent_texts(self, scope: Scope, depth: int, *, source_id: str = "") -> list[tuple[int, str]]:
        """(id, content) of the ``depth`` newest memories, in recent_memories' order: a slim read for
        scanning text in the caller (no row objects for rows it will not return)."""
        rows = self._newest("recent texts", "m.id, m.content", scope, depth, source_id)
        return [(int(r.id), r.content or "") for r in rows]

    def pool_count(self, scope: Scope, *, cap: int | None = None) -> int:
        total = sum(self.table_counts(scope, cap=cap))
        return total if cap is None else min(total, max(cap, 0))

    def table_counts(self, scope: Scope, *, cap: int | None = None) -> tuple[int, int]:
        m_where, params = sql_fragment(scope, "m")
        e_where, _ = sql_fragment(scope, "e")
        if cap is None:
            sql = text(
                f"SELECT (SELECT count(*) FROM memories m WHERE {m_where}), "
                f"(SELECT count(*) FROM episodes e WHERE {e_where})"
            )
        else:
            # Each table stops counting at the cap: a count of the whole scope
            # walked every row of it (about 3 ms per recall at 100k rows).
            sql = text(
                f"SELECT (SELECT count(*) FROM (SELECT 1 FROM memories m WHERE {m_where} LIMIT :cap) AS capped_m), "
                f"(SELECT count(*) FROM (SELECT 1 FROM episodes e WHERE {e_where} LIMIT :cap) AS capped_e)"
            )
            params = {**params, "cap": max(cap, 0)}
        with self.db.read() as session:
            memories, episodes = self._rows(session, sql, params)[0]
        return int(memories), int(episodes)

    def fetch(self, scope: Scope, keys: Iterable[RowKey], *, source_id: str = "") -> dict[RowKey, Record]:
        wanted: dict[str, list[int]] = {"mem": [], "ep": []}
        for kind, row_id in keys:
            wanted[kind].append(int(row_id))
        found: dict[RowKey, Record] = {}
        with self.db.read() as session:
            for kind, ids in wanted.items():
                if not ids:
                    continue
                alias, table, columns, build = (
                    ("m", "memories", MEMORY_COLUMNS, memory_record)
                    if kind == "mem"
                    else ("e", "episodes", EPISODE_COLUMNS, episode_record)
                )
                where, params = sql_fragment(scope, alias)
                if kind == "mem" and source_id:
                    by_source, source_params = type(self).source_filter(source_id, alias)
                    where, params = f"{where} AND {by_source}", {**params, **source_params}
                head = f"SELECT {columns} FROM {table} {alias} {self.by_id_hint} WHERE {alias}.id IN"
                for row in self._rows_by_id(session, head, f"AND {where}", params, ids):
                    record = build(row)
                    found[record.key] = record
        return found

    def _rows_by_id(self, session: Any, head: str, tail: str, params: dict[str, Any], ids: list[int]) -> Iterable[Any]:
        """``head (ids) tail`` executed; a backend may read it off its driver instead."""
        sql = text(f"{head} :ids {tail}").bindparams(bindparam("ids", expanding=True))
        return session.execute(sql, {**params, "ids": ids})

    def memory_span(self, scope: Scope, *, date_shaped_only: bool) -> tuple[datetime | None, datetime | None]:
        from cpersona.storage import dialect  # dialect imports the backends: resolved at call time

        where, params = sql_fragment(scope, "m")
        instant = dialect.instant(self.db.engine, "m.timestamp")
        shaped = " AND m.timestamp LIKE '____-__-__%'" if date_shaped_only else ""
        sql = text(f"SELECT min({instant}), max({instant}) FROM memories m WHERE {where}{shaped}")
        with self.db.read() as session:
            oldest, newest = session.execute(sql, params).one()
        return dialect.instant_value(oldest), dialect.instant_value(newest)

    def period_rows(
        self, scope: Scope, start: datetime, end: datetime, words: Sequence[str], *, source_id: str = "", depth: int
    ) -> list[RowKey]:
        from cpersona.storage import dialect

        def instant(expr: str) -> str:
            return dialect.instant(self.db.engine, expr)

        params: dict[str, Any] = {"start": start.isoformat(), "end": end.isoformat(), "depth": depth}
        for i, word in enumerate(words):
            params[f"w{i}"] = like_pattern(word)
        found: list[tuple[int, float, str, int]] = []  # (-words held, -instant, kind, id)
        for kind, alias, table, stamp, texts in (
            ("mem", "m", "memories", "m.timestamp", ("m.content",)),
            ("ep", "e", "episodes", "COALESCE(NULLIF(e.start_time, ''), e.created_at)", ("e.summary", "e.keywords")),
        ):
            where, kind_params = sql_fragment(scope, alias)
            clauses = [where]
            if kind == "mem":
                by_source, source_params = type(self).source_filter(source_id)
                clauses.append(by_source)
                kind_params = {**kind_params, **source_params}
            at = instant(stamp)
            clauses.append(f"{at} >= {instant(':start')} AND {at} < {instant(':end')}")
            per_word = [
                "(" + " OR ".join(
                    f"COALESCE({col}, '') {self.substring_match.replace(':pattern', f':w{i}')}" for col in texts
                ) + ")"
                for i in range(len(words))
            ]  # fmt: skip
            held = " + ".join(f"(CASE WHEN {p} THEN 1 ELSE 0 END)" for p in per_word) or "0"
            if per_word:
                clauses.append("(" + " OR ".join(per_word) + ")")
            sql = text(
                f"SELECT {alias}.id AS id, ({held}) AS hits, {at} AS at FROM {table} {alias} "
                f"WHERE {' AND '.join(clauses)} ORDER BY hits DESC, at DESC, {alias}.id DESC LIMIT :depth"
            )
            with self.db.read() as session:
                rows = session.execute(sql, {**params, **kind_params}).all()
            for row in rows:
                moment = dialect.instant_value(row.at)
                found.append((-int(row.hits), -(moment.timestamp() if moment else 0.0), kind, int(row.id)))
        found.sort()
        return [(kind, ident) for _, _, kind, ident in found[:depth]]

    def profile(self, agent_id: str) -> str | None:
        sql = text("SELECT content FROM profiles WHERE agent_id = :agent ORDER BY user_id != '', id LIMIT 1")
        with self.db.read() as session:
            rows = self._rows(session, sql, {"agent": agent_id})
        return rows[0][0] if rows else None
