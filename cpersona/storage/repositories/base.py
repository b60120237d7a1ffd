"""What every repository shares: the session, the scope applied once, chunked id look-ups.

The shape follows basic-memory's ``Repository``: one object per table family
bound to a session, with ``select_by_ids`` as the one way to read a list of rows
by primary key. Chunking lives here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import ColumnElement, Connection, Row, bindparam, delete, select, text

from cpersona.storage.scope import Scope, predicates

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

# Ids bound per statement. SQLite's limit is 999 on old builds (32 766 since
# 3.32) and asyncpg/psycopg cap at 32 767; 500 leaves room for the scope's own
# parameters and keeps each statement's plan an index probe.
ID_CHUNK = 500


def chunks(ids: Iterable[Any], size: int = ID_CHUNK) -> Iterator[list[Any]]:
    """``ids`` in order, ``size`` at a time (no empty chunk)."""
    ordered = list(ids)
    for start in range(0, len(ordered), size):
        yield ordered[start : start + size]


class Repository:
    """One table family over one session or connection; ``scope`` filters every scoped read.

    A repository built without a scope reads unfiltered (``Scope()`` has no axis
    set): writes and admin paths name their rows exactly instead.
    """

    model: ClassVar[Any]
    text_column: ClassVar[str] = ""  # the row's text (memories ``content``, episodes ``summary``)
    listed_columns: ClassVar[tuple[Any, ...]] = ()  # what a listing shows of a row

    def __init__(self, session: Session | Connection, scope: Scope | None = None) -> None:
        self.session = session
        self.scope = scope if scope is not None else Scope()

    def scoped(self, model: Any = None) -> ColumnElement[bool]:
        """The scope as a WHERE predicate over ``model`` (the repository's own by default)."""
        return predicates(model if model is not None else self.model, self.scope)

    def select_by_ids(
        self, ids: Iterable[int], *columns: Any, scoped: bool = True, where: Sequence[ColumnElement[bool]] = ()
    ) -> list[Row[Any]]:
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
            found.extend(
                self.session.execute(select(*wanted).where(model.id.in_(chunk), *conditions).order_by(model.id)).all()
            )
        return found

    def newest(self, limit: int) -> list[Row[Any]]:
        """The scope's newest rows (``listed_columns``); same-second rows newest id first."""
        model = self.model
        return list(
            self.session.execute(
                select(*self.listed_columns)
                .where(self.scoped())
                .order_by(model.created_at.desc(), model.id.desc())
                .limit(limit)
            ).all()
        )

    def owned_by(self, row_id: int, agent_id: str) -> bool:
        """Row ``row_id`` exists and belongs to ``agent_id`` (any project or channel)."""
        model = self.model
        return self.session.scalar(select(model.id).where(model.id == row_id, model.agent_id == agent_id)) is not None

    def text_of(self, row_id: int) -> str | None:
        """The row's text, or None when there is no such row."""
        model = self.model
        return self.session.scalar(select(getattr(model, self.text_column)).where(model.id == row_id))

    def bucket_of(self, row_id: int) -> Row[Any] | None:
        """(agent_id, project_id) of the row, or None."""
        model = self.model
        return self.session.execute(select(model.agent_id, model.project_id).where(model.id == row_id)).first()

    def texts(self, ids: Iterable[int]) -> list[Row[Any]]:
        """(id, agent_id, text) of the rows among ``ids`` that exist, unscoped, id order."""
        model = self.model
        return self.select_by_ids(ids, model.id, model.agent_id, getattr(model, self.text_column), scoped=False)

    def delete_agent(self, agent_id: str) -> int:
        """Every row of ``agent_id`` (delete_agent_data); rows removed."""
        return self.session.execute(delete(self.model).where(self.model.agent_id == agent_id)).rowcount

    def delete_by_ids(self, ids: Iterable[int], agent_id: str) -> int:
        """Delete the rows among ``ids`` that belong to ``agent_id``, chunked; rows removed."""
        model = self.model
        return sum(
            self.session.execute(delete(model).where(model.id.in_(chunk), model.agent_id == agent_id)).rowcount
            for chunk in chunks(ids)
        )

    def stored_vectors(self, ids: list[int]) -> list[Row[Any]]:
        """(id, embedding) of the rows among ``ids`` that carry a vector (recall's candidate set: bounded)."""
        sql = text(
            f"SELECT id, embedding FROM {self.model.__tablename__} WHERE id IN :ids AND embedding IS NOT NULL"
        ).bindparams(bindparam("ids", expanding=True))
        return list(self.session.execute(sql, {"ids": ids}))

    # -- vectors of text rows (the backfill): plain SQL, the table named by the model

    def unembedded_after(self, after: int, n: int) -> list[Row[Any]]:
        """(id, body) of up to ``n`` rows past id ``after`` that have no vector, by id."""
        table, column = self.model.__tablename__, self.text_column
        return list(
            self.session.execute(
                text(
                    f"SELECT id, {column} AS body FROM {table}"
                    " WHERE embedding IS NULL AND id > :after ORDER BY id LIMIT :n"
                ),
                {"after": after, "n": n},
            ).all()
        )

    def set_embedding_if_unchanged(self, row_id: int, body: str, blob: bytes) -> int:
        """Store ``blob`` unless the row gained a vector or its text changed since it was read."""
        table, column = self.model.__tablename__, self.text_column
        return (
            self.session.execute(
                text(f"UPDATE {table} SET embedding = :blob WHERE id = :id AND embedding IS NULL AND {column} = :body"),
                {"id": row_id, "body": body, "blob": blob},
            ).rowcount
            or 0
        )
