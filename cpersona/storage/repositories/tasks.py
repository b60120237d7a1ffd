"""Pending memory tasks: the durable queue of derived work (node builds and the like)."""

from __future__ import annotations

from cpersona.storage.models import PendingMemoryTask
from cpersona.storage.repositories.base import Repository


class TaskRepository(Repository):
    model = PendingMemoryTask
