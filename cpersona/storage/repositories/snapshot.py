"""Memories, episodes and profiles read out of a database in pages, inside the caller's snapshot.

Used by export (our database), merge (the source agent in our database) and the
2.6 copier (a foreign database). The caller opens one read transaction and
every count and page comes from it, so what is counted is what is read
(spec EX-6, JL-4) and nothing is materialised whole.

Columns are selected by name from what the database actually has (``Layout``):
a column a database lacks reads as its schema default, so older or newer files
read alike (spec DB-7: no reader depends on column position).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, ColumnElement, and_, column, func, literal, or_, select, table
from sqlalchemy.engine import Row

from cpersona.storage.layout import Layout
from cpersona.storage.scope import Scope, predicates

PAGE_SIZE = 500

# Column → value when the database has no such column.
MEMORY_COLUMNS: dict[str, Any] = {
    "id": None,
    "agent_id": "",
    "project_id": "",
    "msg_id": "",
    "content": "",
    "source": "{}",
    "timestamp": "",
    "metadata": "{}",
    "embedding": None,
    "embedding_model": "",
    "channel": "",
    "recall_count": 0,
    "last_recalled_at": None,
    "locked": 0,
    "created_at": "",
}
EPISODE_COLUMNS: dict[str, Any] = {
    "id": None,
    "agent_id": "",
    "project_id": "",
    "summary": "",
    "keywords": "",
    "embedding": None,
    "embedding_model": "",
    "start_time": None,
    "end_time": None,
    "resolved": 0,
    "channel": "",
    "created_at": "",
}
PROFILE_COLUMNS: dict[str, Any] = {
    "id": None,
    "agent_id": "",
    "project_id": "",
    "user_id": "",
    "content": "",
    "updated_at": "",
}


def _selectable(name: str, wanted: dict[str, Any], present: frozenset[str]) -> tuple[Any, list[ColumnElement[Any]]]:
    tbl = table(name, *(column(col) for col in wanted if col in present))
    cols = [tbl.c[col] if col in present else literal(default).label(col) for col, default in wanted.items()]
    return tbl, cols


class SnapshotReader:
    """One agent's rows (``agent_id=None``: every agent's) in stable order."""

    def __init__(self, conn: Connection, layout: Layout, agent_id: str | None) -> None:
        self.conn = conn
        self.layout = layout
        self.scope = Scope(agent_id=agent_id)
        profile_cols = frozenset(PROFILE_COLUMNS) if "profiles" in layout.tables else frozenset()
        self._memories = _selectable("memories", MEMORY_COLUMNS, layout.memory_columns)
        self._episodes = _selectable("episodes", EPISODE_COLUMNS, layout.episode_columns)
        self._profiles = _selectable("profiles", PROFILE_COLUMNS, profile_cols)
        self._has_profiles = "profiles" in layout.tables

    def counts(self) -> dict[str, int]:
        def count(tbl: Any) -> int:
            return self.conn.execute(
                select(func.count()).select_from(tbl).where(predicates(tbl, self.scope))
            ).scalar_one()

        return {
            "memory": count(self._memories[0]),
            "episode": count(self._episodes[0]),
            "profile": count(self._profiles[0]) if self._has_profiles else 0,
        }

    def memories(self) -> Iterator[Row[Any]]:
        return self._by_id(*self._memories)

    def episodes(self) -> Iterator[Row[Any]]:
        return self._by_id(*self._episodes)

    def _by_id(self, tbl: Any, cols: list[ColumnElement[Any]]) -> Iterator[Row[Any]]:
        last = 0
        while True:
            page = self.conn.execute(
                select(*cols).where(predicates(tbl, self.scope), tbl.c.id > last).order_by(tbl.c.id).limit(PAGE_SIZE)
            ).all()
            yield from page
            if len(page) < PAGE_SIZE:
                return
            last = page[-1].id

    def profiles(self) -> Iterator[Row[Any]]:
        """Ascending agent_id (then user_id), as the file lists them (JL-2)."""
        if not self._has_profiles:
            return
        tbl, cols = self._profiles
        after: tuple[str, str] | None = None
        while True:
            stmt = select(*cols).where(predicates(tbl, self.scope))
            if after is not None:
                stmt = stmt.where(
                    or_(
                        tbl.c.agent_id > after[0],
                        and_(tbl.c.agent_id == after[0], tbl.c.user_id > after[1]),
                    )
                )
            page = self.conn.execute(stmt.order_by(tbl.c.agent_id, tbl.c.user_id).limit(PAGE_SIZE)).all()
            yield from page
            if len(page) < PAGE_SIZE:
                return
            after = (page[-1].agent_id, page[-1].user_id)
