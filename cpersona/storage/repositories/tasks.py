"""Pending memory tasks: the durable queue of derived and one-off work.

Rows are taken in id order; a retry either bumps ``retries`` in place or, for
derived work that must not hold up older one-off work, moves to the back.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Connection, Row, delete, event, func, insert, select, update

# The table's columns, named as the mapped class names them: no ORM on this path.
from cpersona.storage.tables import PendingMemoryTaskColumns as PendingMemoryTask
from cpersona.storage.repositories.base import Repository

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


class _Wakeable(Protocol):
    def wake(self) -> None: ...


class TaskRepository(Repository):
    model = PendingMemoryTask

    def add(
        self,
        task_type: str,
        agent_id: str,
        project_id: str,
        payload: str,
        *,
        retries: int = 0,
        created_at: str | None = None,
    ) -> int:
        values: dict[str, Any] = {
            "task_type": task_type,
            "agent_id": agent_id,
            "project_id": project_id,
            "payload": payload,
        }
        if retries:
            values["retries"] = retries
        if created_at is not None:
            values["created_at"] = created_at
        return self.session.execute(
            insert(PendingMemoryTask).values(**values).returning(PendingMemoryTask.id)
        ).scalar_one()

    def remove(self, task_id: int) -> bool:
        """Delete the task row; False when it was already gone."""
        return self.session.execute(delete(PendingMemoryTask).where(PendingMemoryTask.id == task_id)).rowcount == 1

    def count(self) -> int:
        return self.session.scalar(select(func.count()).select_from(PendingMemoryTask)) or 0

    def head(self) -> Row[Any] | None:
        """The oldest row (every column), or None."""
        return self.session.execute(select(PendingMemoryTask.__table__).order_by(PendingMemoryTask.id).limit(1)).first()

    def payloads_of(self, task_type: str) -> list[str]:
        """The raw payload of every waiting row of ``task_type``."""
        return list(
            self.session.scalars(select(PendingMemoryTask.payload).where(PendingMemoryTask.task_type == task_type))
        )

    def set_retries(self, task_id: int, retries: int) -> None:
        self.session.execute(update(PendingMemoryTask).where(PendingMemoryTask.id == task_id).values(retries=retries))

    def any_other_than(self, task_types: Collection[str]) -> bool:
        """Whether a row of a type outside ``task_types`` waits."""
        return (
            self.session.scalar(
                select(PendingMemoryTask.id).where(PendingMemoryTask.task_type.not_in(list(task_types))).limit(1)
            )
            is not None
        )


_WAKE_KEY = "cpersona.task_queue.wake"


def wake_after_commit(session: Session | Connection, queue: _Wakeable) -> None:
    """Wake ``queue`` once this connection goes back to the pool, i.e. after its commit.

    SQLAlchemy's "commit" event fires before the database commits; a worker
    woken then could look too early, find nothing and go back to sleep.
    """
    conn = session if isinstance(session, Connection) else session.connection()
    conn.info[_WAKE_KEY] = queue  # the pooled connection's own dict
    if not event.contains(conn.engine, "checkin", _on_checkin):
        event.listen(conn.engine, "checkin", _on_checkin)


def _on_checkin(dbapi_connection: Any, record: Any) -> None:
    queue = record.info.pop(_WAKE_KEY, None) if record is not None else None
    if queue is not None:
        queue.wake()
