"""The statements of a bulk restore (import, merge, the 2.6 copier): exact-bucket probes and inserts.

The rules — which keys make a duplicate, what a dry run remembers — are the
service's (services/portability/writer.py); here are the statements, built once:
a bulk restore runs them per record, and building a statement costs far more
than executing its cached compiled form.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Connection, Row, bindparam, column, select, table, update

from cpersona.storage.models import Episode, Memory, Profile

_MEMORY_BY_MSG_ID = (
    select(Memory.id)
    .where(
        Memory.agent_id == bindparam("agent_id"),
        Memory.project_id == bindparam("project_id"),
        Memory.msg_id == bindparam("msg_id"),
        Memory.msg_id != "",  # lets SQLite use the partial unique index
    )
    .limit(1)
)
_MEMORY_BY_CONTENT = (
    select(Memory.id)
    .where(
        Memory.agent_id == bindparam("agent_id"),
        Memory.project_id == bindparam("project_id"),
        Memory.channel == bindparam("channel"),
        Memory.content == bindparam("content"),
    )
    .limit(1)
)
_EPISODE_BY_SUMMARY = (
    select(Episode.id)
    .where(
        Episode.agent_id == bindparam("agent_id"),
        Episode.project_id == bindparam("project_id"),
        Episode.channel == bindparam("channel"),
        Episode.summary == bindparam("summary"),
    )
    .limit(1)
)


class RestoreRows:
    """Probes and inserts on one connection; ``memory_columns`` / ``episode_columns`` are what an insert writes.

    Lightweight tables so an optional column (embedding_model, 2.6 v18) is
    written exactly when this database has it.
    """

    def __init__(self, conn: Connection, memory_columns: Iterable[str], episode_columns: Iterable[str]) -> None:
        from cpersona.storage.vectors_postgres import VECTOR_COLUMN, PgVectorType, sends_vectors

        self.conn = conn
        # PostgreSQL with pgvector's column: each row carries its vector, no decode in the trigger.
        self._vectors = sends_vectors(conn)

        def extra() -> list[Any]:
            return [column(VECTOR_COLUMN, PgVectorType())] if self._vectors else []

        memories = table("memories", column("id"), *(column(c) for c in memory_columns), *extra())
        episodes = table("episodes", column("id"), *(column(c) for c in episode_columns), *extra())
        self._insert_memory = memories.insert().returning(memories.c.id)
        self._insert_episode = episodes.insert().returning(episodes.c.id)

    def memory_by_msg_id(self, agent_id: str, project_id: str, msg_id: str) -> int | None:
        return self.conn.execute(
            _MEMORY_BY_MSG_ID, {"agent_id": agent_id, "project_id": project_id, "msg_id": msg_id}
        ).scalar()

    def memory_by_content(self, agent_id: str, project_id: str, channel: str, content: str) -> int | None:
        return self.conn.execute(
            _MEMORY_BY_CONTENT,
            {"agent_id": agent_id, "project_id": project_id, "channel": channel, "content": content},
        ).scalar()

    def episode_by_summary(self, agent_id: str, project_id: str, channel: str, summary: str) -> int | None:
        return self.conn.execute(
            _EPISODE_BY_SUMMARY,
            {"agent_id": agent_id, "project_id": project_id, "channel": channel, "summary": summary},
        ).scalar()

    def _with_vector(self, values: Mapping[str, Any]) -> dict[str, Any]:
        if not self._vectors:
            return dict(values)
        from cpersona.storage.vectors_postgres import VECTOR_COLUMN, vector_value

        return {**values, VECTOR_COLUMN: vector_value(values.get("embedding"))}

    def insert_memory(self, values: Mapping[str, Any]) -> int:
        return self.conn.execute(self._insert_memory, self._with_vector(values)).scalar_one()

    def insert_episode(self, values: Mapping[str, Any]) -> int:
        return self.conn.execute(self._insert_episode, self._with_vector(values)).scalar_one()

    def profile(self, agent_id: str, user_id: str) -> Row[Any] | None:
        """(project_id, content, updated_at) of the profile under (agent, user_id)."""
        return self.conn.execute(
            select(Profile.project_id, Profile.content, Profile.updated_at).where(
                Profile.agent_id == agent_id, Profile.user_id == user_id
            )
        ).first()

    def update_profile(self, agent_id: str, user_id: str, values: Mapping[str, Any]) -> None:
        self.conn.execute(
            update(Profile).where(Profile.agent_id == agent_id, Profile.user_id == user_id).values(dict(values))
        )

    def insert_profile(self, agent_id: str, user_id: str, values: Mapping[str, Any]) -> None:
        self.conn.execute(Profile.__table__.insert().values(agent_id=agent_id, user_id=user_id, **values))
