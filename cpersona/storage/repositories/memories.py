"""Memory rows: the statements services run on ``memories`` outside search and the store's write pair.

Search lives in storage/search*.py and the dedup probe and insert of a store in
storage/memory_writes.py; this repository holds the rest.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Row, case, delete, func, select, text, update

# The table's columns, named as the mapped class names them: no ORM on this path.
from cpersona.storage.tables import MemoryColumns as Memory
from cpersona.storage.repositories.base import Repository

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

# Listed columns only: the embedding blob is never needed in a listing.
LISTED_COLUMNS = (
    Memory.id,
    Memory.agent_id,
    Memory.project_id,
    Memory.content,
    Memory.source,
    Memory.timestamp,
    Memory.created_at,
    Memory.locked,
    Memory.channel,
)


class MemoryRepository(Repository):
    model = Memory
    listed_columns = LISTED_COLUMNS
    text_column = "content"

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
            update(Memory).where(*self._guards(memory_id, owner, False)).values(locked=value)
        ).rowcount

    def replace_text_unlocked(self, memory_id: int, owner: str | None, content: str, embedding: bytes | None) -> int:
        """New text and vector for an unlocked row; rows matched. A unique-index clash raises IntegrityError."""
        return self.session.execute(
            update(Memory).where(*self._guards(memory_id, owner, True)).values(content=content, embedding=embedding)
        ).rowcount

    def holder_of(self, agent_id: str, project_id: str, channel: str, content: str, excluding: int) -> int | None:
        """Another memory of the exact (agent, project, channel) bucket holding ``content``, lowest id."""
        return self.session.scalar(
            select(Memory.id)
            .where(
                Memory.agent_id == agent_id,
                Memory.project_id == project_id,
                Memory.channel == channel,
                Memory.content == content,
                Memory.id != excluding,
            )
            .order_by(Memory.id)
            .limit(1)
        )

    def lock(self, memory_id: int) -> int:
        """Set the row's lock flag; rows changed (0 when it is gone)."""
        return self.session.execute(update(Memory).where(Memory.id == memory_id).values(locked=1)).rowcount

    def content_rows(self, ids: Iterable[int]) -> list[Row[Any]]:
        """(id, content, source, timestamp, msg_id) of the readable rows among ``ids``."""
        return self.select_by_ids(ids, Memory.id, Memory.content, Memory.source, Memory.timestamp, Memory.msg_id)

    def contexts(self, ids: Iterable[int]) -> list[Row[Any]]:
        """(id, project_id, channel) of the rows among ``ids``, unscoped."""
        return self.select_by_ids(ids, Memory.id, Memory.project_id, Memory.channel, scoped=False)

    # -- recall's own writes and the gate's measurement

    def bump_recall_counts(self, counts: dict[int, int], stamp: str) -> None:
        """Add ``counts[id]`` to each row's recall_count and stamp last_recalled_at, in one statement."""
        by_step: dict[int, list[int]] = {}
        for memory_id, n in counts.items():
            by_step.setdefault(n, []).append(memory_id)
        step = case({i: n for n, group in by_step.items() for i in group}, value=Memory.id)
        self.session.execute(
            update(Memory)
            .where(Memory.id.in_(list(counts)))
            .values(recall_count=Memory.recall_count + step, last_recalled_at=stamp)
        )

    def embedded_with_text(self, agent_id: str) -> Iterator[Row[Any]]:
        """(id, timestamp) of the agent's rows that carry a vector and nonblank text, by id, as they
        stream (consume it inside the session): at 1M rows the fetched list alone held ~200 MB."""
        return iter(
            self.session.execute(
                select(Memory.id, Memory.timestamp)
                .where(
                    Memory.agent_id == agent_id,
                    Memory.embedding.is_not(None),
                    func.length(func.trim(Memory.content)) > 0,
                )
                .order_by(Memory.id)
            )
        )

    # -- vectors (calibration)

    def embedded_ids(self) -> array[int]:
        """Ids of the scope's rows that carry a vector, ascending.

        A packed array, filled as the rows stream: at 1M rows a list of ints
        held ~36 MB (and its fetched rows more) that the process kept after
        start-up calibration had let it go.
        """
        statement = select(Memory.id).where(self.scoped(), Memory.embedding.is_not(None)).order_by(Memory.id)
        return array("q", self.session.execute(statement).scalars())

    def embeddings(self, ids: Iterable[int]) -> list[Row[Any]]:
        """(id, embedding) of the rows among ``ids``, unscoped, chunked."""
        return self.select_by_ids(ids, Memory.id, Memory.embedding, scoped=False)

    def embedded_stamps(self, width: int) -> Iterator[Row[Any]]:
        """(id, timestamp) of the scope's rows whose vector has ``width`` float32 components, as they stream.

        An iterator (consume it inside the session): the caller keeps only the
        newest few, and 1M fetched rows held at once cost ~200 MB of peak memory.
        """
        return iter(
            self.session.execute(
                select(Memory.id, Memory.timestamp).where(
                    self.scoped(),
                    Memory.embedding.is_not(None),
                    func.length(Memory.embedding) == 4 * width,
                )
            )
        )

    def modal_vector_bytes(self) -> int | None:
        """The most common vector length in bytes over every agent (ties: the longer), or None."""
        row = self.session.execute(
            select(func.length(Memory.embedding).label("n"), func.count().label("c"))
            .where(Memory.embedding.is_not(None))
            .group_by(func.length(Memory.embedding))
            .order_by(func.count().desc(), func.length(Memory.embedding).desc())
            .limit(1)
        ).first()
        return None if row is None else row.n

    def has_embedded(self, agent_id: str) -> bool:
        return (
            self.session.execute(
                select(Memory.id).where(Memory.agent_id == agent_id, Memory.embedding.is_not(None)).limit(1)
            ).first()
            is not None
        )

    def embedded_agents(self) -> list[str]:
        """Every agent with at least one vector, ascending."""
        return list(
            self.session.execute(
                select(Memory.agent_id).where(Memory.embedding.is_not(None)).distinct().order_by(Memory.agent_id)
            )
            .scalars()
            .all()
        )


_UNEMBEDDED = text(
    "SELECT (SELECT count(*) FROM memories WHERE embedding IS NULL)"
    " + (SELECT count(*) FROM episodes WHERE embedding IS NULL)"
)


def unembedded_total(session: Session) -> int:
    """Memories plus episodes without a vector (served by the partial lost-embedding indexes)."""
    return int(session.execute(_UNEMBEDDED).scalar_one())
