"""Memory rows: the statements services run on ``memories`` outside search and the store's write pair.

Search lives in storage/search*.py and the dedup probe and insert of a store in
storage/memory_writes.py; this repository holds the rest.
"""

from __future__ import annotations

from cpersona.storage.models import Memory
from cpersona.storage.repositories.base import Repository


class MemoryRepository(Repository):
    model = Memory
