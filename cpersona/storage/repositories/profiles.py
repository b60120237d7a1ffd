"""Profile rows: one per agent, written under ``user_id = ''``.

The unique key (agent_id, user_id) keeps it to one row; an older file may hold
a row under another user_id, which still reads as the agent's profile.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

# The table's columns, named as the mapped class names them: no ORM on this path.
from cpersona.storage.tables import ProfileColumns as Profile
from cpersona.storage.repositories.base import Repository


class ProfileRepository(Repository):
    model = Profile

    def current(self, agent_id: str) -> str | None:
        """The agent's profile text: the ``user_id = ''`` row first, else the newest other one."""
        return self.session.scalar(
            select(Profile.content)
            .where(Profile.agent_id == agent_id)
            .order_by((Profile.user_id == "").desc(), Profile.updated_at.desc(), Profile.id.desc())
            .limit(1)
        )

    def _overwrite(self, agent_id: str, text: str, stamp: str) -> int:
        return self.session.execute(
            update(Profile)
            .where(Profile.agent_id == agent_id, Profile.user_id == "")
            .values(content=text, updated_at=stamp)
        ).rowcount

    def replace(self, agent_id: str, text: str, stamp: str) -> None:
        """Make ``text`` the agent's profile: update the row, or create it (racing writers included)."""
        if self._overwrite(agent_id, text, stamp):
            return
        from cpersona.storage.models import Profile as ProfileRow  # the ORM, for the one write that adds an object

        try:
            with self.session.begin_nested():
                self.session.add(ProfileRow(agent_id=agent_id, user_id="", content=text, updated_at=stamp))
                self.session.flush()
        except IntegrityError:
            # Another process created the row since our update looked: replace it.
            self._overwrite(agent_id, text, stamp)
