"""Memory rows: the statements services run on ``memories`` outside search and the store's write pair.

Search lives in storage/search*.py and the dedup probe and insert of a store in
storage/memory_writes.py; this repository holds the rest.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import ColumnElement, Row, delete, select, text, update
from sqlalchemy.orm import Session

from cpersona.storage.models import Memory
from cpersona.storage.repositories.base import Repository

# Listed columns only: the embedding blob is never needed in a listing.
LISTED_COLUMNS = (
    Memory.id, Memory.agent_id, Memory.project_id, Memory.content, Memory.source,
    Memory.timestamp, Memory.created_at, Memory.locked, Memory.channel,
)


class MemoryRepository(Repository):
    model = Memory
    text_column = "content"

    def newest(self, limit: int) -> list[Row[Any]]:
        """The scope's newest rows (listed columns); same-second rows newest id first."""
        return list(self.session.execute(
            select(*LISTED_COLUMNS).where(self.scoped())
            .order_by(Memory.created_at.desc(), Memory.id.desc()).limit(limit)).all())

    # -- one row, guarded (delete_memory, lock_memory, update_memory)

    def ownership(self, memory_id: int) -> Row[Any] | None:
        """(agent_id, project_id, channel, locked) of the row, or None."""
        return self.session.execute(
            select(Memory.agent_id, Memory.project_id, Memory.channel, Memory.locked).where(Memory.id == memory_id)
        ).first()

    @staticmethod
    def _guards(memory_id: int, owner: str | None, respect_lock: bool) -> list[ColumnElement[bool]]:
        # The caller's checks, repeated in the mutating statement itself (OWN-4).
        guards = [Memory.id == memory_id]
        if owner is not None:
            guards.append(Memory.agent_id == owner)
        if respect_lock:
            guards.append(Memory.locked == 0)
        return guards

    def delete_unlocked(self, memory_id: int, owner: str | None) -> int:
        """Delete the row if it is unlocked (and ``owner``'s, when given); rows removed."""
        return self.session.execute(delete(Memory).where(*self._guards(memory_id, owner, True))).rowcount

    def set_locked(self, memory_id: int, owner: str | None, value: int) -> int:
        """Set the lock flag (rows matched: setting the flag it already has still matches)."""
        return self.session.execute(
            update(Memory).where(*self._guards(memory_id, owner, False)).values(locked=value)).rowcount

    def replace_text_unlocked(self, memory_id: int, owner: str | None, content: str, embedding: bytes | None) -> int:
        """New text and vector for an unlocked row; rows matched. A unique-index clash raises IntegrityError."""
        return self.session.execute(
            update(Memory).where(*self._guards(memory_id, owner, True)).values(content=content, embedding=embedding)
        ).rowcount

    def holder_of(self, agent_id: str, project_id: str, channel: str, content: str, excluding: int) -> int | None:
        """Another memory of the exact (agent, project, channel) bucket holding ``content``, lowest id."""
        return self.session.scalar(
            select(Memory.id)
            .where(Memory.agent_id == agent_id, Memory.project_id == project_id,
                   Memory.channel == channel, Memory.content == content, Memory.id != excluding)
            .order_by(Memory.id)
            .limit(1)
        )

    def lock(self, memory_id: int) -> int:
        """Set the row's lock flag; rows changed (0 when it is gone)."""
        return self.session.execute(update(Memory).where(Memory.id == memory_id).values(locked=1)).rowcount

    def content_rows(self, ids: Iterable[int]) -> list[Row[Any]]:
        """(id, content, source, timestamp, msg_id) of the readable rows among ``ids``."""
        return self.select_by_ids(ids, Memory.id, Memory.content, Memory.source, Memory.timestamp, Memory.msg_id)


_UNEMBEDDED = text(
    "SELECT (SELECT count(*) FROM memories WHERE embedding IS NULL)"
    " + (SELECT count(*) FROM episodes WHERE embedding IS NULL)"
)


def unembedded_total(session: Session) -> int:
    """Memories plus episodes without a vector (served by the partial lost-embedding indexes)."""
    return int(session.execute(_UNEMBEDDED).scalar_one())
