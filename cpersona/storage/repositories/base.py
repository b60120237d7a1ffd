"""What every repository shares: the session, the scope applied once, chunked id look-ups.

The shape follows basic-memory's ``Repository``: one object per table family
bound to a session, with ``select_by_ids`` as the one way to read a list of rows
by primary key. Chunking lives here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar

from sqlalchemy import ColumnElement, Connection, Row, select
from sqlalchemy.orm import Session

from cpersona.storage.scope import Scope, predicates

# Ids bound per statement. SQLite's limit is 999 on old builds (32 766 since
# 3.32) and asyncpg/psycopg cap at 32 767; 500 leaves room for the scope's own
# parameters and keeps each statement's plan an index probe.
ID_CHUNK = 500


def chunks(ids: Iterable[Any], size: int = ID_CHUNK) -> Iterator[list[Any]]:
    """``ids`` in order, ``size`` at a time (no empty chunk)."""
    ordered = list(ids)
    for start in range(0, len(ordered), size):
        yield ordered[start:start + size]


class Repository:
    """One table family over one session or connection; ``scope`` filters every scoped read.

    A repository built without a scope reads unfiltered (``Scope()`` has no axis
    set): writes and admin paths name their rows exactly instead.
    """

    model: ClassVar[Any]

    def __init__(self, session: Session | Connection, scope: Scope | None = None) -> None:
        self.session = session
        self.scope = scope if scope is not None else Scope()

    def scoped(self, model: Any = None) -> ColumnElement[bool]:
        """The scope as a WHERE predicate over ``model`` (the repository's own by default)."""
        return predicates(model if model is not None else self.model, self.scope)

    def select_by_ids(self, ids: Iterable[int], *columns: Any, scoped: bool = True,
                      where: Sequence[ColumnElement[bool]] = ()) -> list[Row[Any]]:
        """Rows (``columns``, default the id) whose id is in ``ids``, chunked, in id order per chunk.

        ``scoped`` applies the repository's scope; ``where`` adds the caller's own
        conditions. Rows are returned chunk after chunk; callers that need one
        global order sort (ids are usually sorted already).
        """
        model = self.model
        wanted = columns or (model.id,)
        conditions = [*where, self.scoped()] if scoped else list(where)
        found: list[Row[Any]] = []
        for chunk in chunks(ids):
            found.extend(self.session.execute(
                select(*wanted).where(model.id.in_(chunk), *conditions).order_by(model.id)).all())
        return found

    def owned_by(self, row_id: int, agent_id: str) -> bool:
        """Row ``row_id`` exists and belongs to ``agent_id`` (any project or channel)."""
        model = self.model
        return self.session.scalar(
            select(model.id).where(model.id == row_id, model.agent_id == agent_id)) is not None
