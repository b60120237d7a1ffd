"""Episode rows."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import ColumnElement, Row, delete, select

# The table's columns, named as the mapped class names them: no ORM on this path.
from cpersona.storage.tables import EpisodeColumns as Episode
from cpersona.storage.repositories.base import Repository

# No channel and no resolved flag in a listed episode (spec §3.10).
LISTED_COLUMNS = (
    Episode.id,
    Episode.agent_id,
    Episode.project_id,
    Episode.summary,
    Episode.keywords,
    Episode.start_time,
    Episode.end_time,
    Episode.created_at,
)


class EpisodeRepository(Repository):
    model = Episode
    listed_columns = LISTED_COLUMNS
    text_column = "summary"

    def insert(self, **values: Any) -> int:
        """A new episode's id (flushed inside the caller's transaction)."""
        from cpersona.storage.models import Episode as EpisodeRow  # the ORM, for the one write that adds an object

        row = EpisodeRow(**values)
        self.session.add(row)
        self.session.flush()
        return row.id

    def content_rows(self, ids: Iterable[int]) -> list[Row[Any]]:
        """(id, summary, start_time, created_at, resolved) of the readable rows among ``ids``."""
        return self.select_by_ids(
            ids, Episode.id, Episode.summary, Episode.start_time, Episode.created_at, Episode.resolved
        )

    def contexts(self, ids: Iterable[int]) -> list[Row[Any]]:
        """(id, project_id, channel, start_time, end_time) of the rows among ``ids``, unscoped."""
        return self.select_by_ids(
            ids, Episode.id, Episode.project_id, Episode.channel, Episode.start_time, Episode.end_time, scoped=False
        )

    @staticmethod
    def _guards(episode_id: int, owner: str | None) -> list[ColumnElement[bool]]:
        return [Episode.id == episode_id] + ([Episode.agent_id == owner] if owner is not None else [])

    def owner_of(self, episode_id: int, owner: str | None = None) -> str | None:
        """The episode's agent (None when there is no such row, or it is not ``owner``'s)."""
        return self.session.scalar(select(Episode.agent_id).where(*self._guards(episode_id, owner)))

    def delete_one(self, episode_id: int, owner: str | None = None) -> int:
        return self.session.execute(delete(Episode).where(*self._guards(episode_id, owner))).rowcount
