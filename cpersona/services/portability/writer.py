"""Writing restored records into our tables: dedup probe, then insert.

Import, merge and the 2.6 copier all end here, so the rules that make a bulk
restore idempotent live in one place (spec IM-6.3, IM-7, MG-3, MG-4):

- a memory is a duplicate when the exact bucket (agent, project) already holds
  its non-empty ``msg_id``, or the exact bucket (agent, project, channel) holds
  its content — the same keys as the two unique indexes (DB-5), which remain
  the final guard;
- an episode is a duplicate when (agent, project, channel) holds its summary.

These are write-side probes on one exact bucket (spec AX-3: writes never
union), not reads through the isolation predicates.

A dry run runs the same probes on a read snapshot and remembers (as digests)
what it would have inserted, so a duplicate later in the same file is counted
exactly as a real run counts it (IM-14). Stand-in ids are negative.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Connection

from cpersona.storage.layout import Layout
from cpersona.storage.repositories.restore import RestoreRows


@dataclass
class MemoryRow:
    agent_id: str
    project_id: str
    channel: str
    msg_id: str
    content: str
    source: str
    timestamp: str
    metadata: str
    created_at: str
    locked: int = 0
    recall_count: int = 0
    last_recalled_at: str | None = None
    embedding: bytes | None = None
    embedding_model: str = ""


@dataclass
class EpisodeRow:
    agent_id: str
    project_id: str
    channel: str
    summary: str
    keywords: str
    created_at: str
    start_time: str | None = None
    end_time: str | None = None
    resolved: int = 0
    embedding: bytes | None = None
    embedding_model: str = ""


@dataclass
class ProfileRow:
    agent_id: str
    user_id: str
    project_id: str
    content: str
    updated_at: str


def _digest(*parts: str) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


class RecordWriter:
    def __init__(self, conn: Connection, layout: Layout, *, dry_run: bool) -> None:
        self.dry_run = dry_run
        memory_cols = [c for c in asdict(_EMPTY_MEMORY) if c != "embedding_model" or layout.memory_labels]
        episode_cols = [c for c in asdict(_EMPTY_EPISODE) if c != "embedding_model" or layout.episode_labels]
        self.rows = RestoreRows(conn, memory_cols, episode_cols)
        self._memory_cols = memory_cols
        self._episode_cols = episode_cols
        self._seen: dict[bytes, int] = {}
        self._profiles: dict[tuple[str, str], ProfileRow] = {}
        self._stand_in = 0

    # -- memories

    def find_memory(self, row: MemoryRow) -> int | None:
        """The id of the row that already holds this memory, if any."""
        if row.msg_id:
            found = self._remembered("msg", row.agent_id, row.project_id, row.msg_id) or self.rows.memory_by_msg_id(
                row.agent_id, row.project_id, row.msg_id
            )
            if found is not None:
                return found
        content_key = ("content", row.agent_id, row.project_id, row.channel, row.content)
        return self._remembered(*content_key) or self.rows.memory_by_content(*content_key[1:])

    def put_memory(self, row: MemoryRow) -> tuple[bool, int]:
        """(inserted?, id of the row holding it): insert unless a duplicate exists."""
        existing = self.find_memory(row)
        if existing is not None:
            return False, existing
        if self.dry_run:
            new_id = self._next_stand_in()
            if row.msg_id:
                self._remember(new_id, "msg", row.agent_id, row.project_id, row.msg_id)
            self._remember(new_id, "content", row.agent_id, row.project_id, row.channel, row.content)
            return True, new_id
        values = {c: getattr(row, c) for c in self._memory_cols}
        return True, self.rows.insert_memory(values)

    # -- episodes

    def put_episode(self, row: EpisodeRow) -> tuple[bool, int]:
        key = ("episode", row.agent_id, row.project_id, row.channel, row.summary)
        existing = self._remembered(*key) or self.rows.episode_by_summary(*key[1:])
        if existing is not None:
            return False, existing
        if self.dry_run:
            new_id = self._next_stand_in()
            self._remember(new_id, *key)
            return True, new_id
        values = {c: getattr(row, c) for c in self._episode_cols}
        return True, self.rows.insert_episode(values)

    # -- what a dry run would have written (real runs ask the database)

    def _remembered(self, *key: str) -> int | None:
        return self._seen.get(_digest(*key)) if self.dry_run else None

    def _remember(self, new_id: int, *key: str) -> None:
        self._seen[_digest(*key)] = new_id

    # -- profiles (one per agent and user_id, spec storage.md §4.4)

    def stored_profile(self, agent_id: str, user_id: str) -> ProfileRow | None:
        if (agent_id, user_id) in self._profiles:
            return self._profiles[(agent_id, user_id)]
        found = self.rows.profile(agent_id, user_id)
        if found is None:
            return None
        return ProfileRow(agent_id, user_id, found.project_id, found.content, found.updated_at)

    def put_profile(self, row: ProfileRow) -> None:
        """Insert, or replace the profile stored under the same (agent, user_id)."""
        exists = self.stored_profile(row.agent_id, row.user_id) is not None
        self._profiles[(row.agent_id, row.user_id)] = row
        if self.dry_run:
            return
        values: dict[str, Any] = {
            "project_id": row.project_id,
            "content": row.content,
            "updated_at": row.updated_at,
        }
        if exists:
            self.rows.update_profile(row.agent_id, row.user_id, values)
        else:
            self.rows.insert_profile(row.agent_id, row.user_id, values)

    def _next_stand_in(self) -> int:
        self._stand_in -= 1
        return self._stand_in


_EMPTY_MEMORY = MemoryRow("", "", "", "", "", "", "", "", "")
_EMPTY_EPISODE = EpisodeRow("", "", "", "", "", "")
