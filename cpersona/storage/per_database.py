"""One process-held object per open ``Database``, dropped with it.

The vector copies (SQLite's coarse index, PostgreSQL's near window) live as
long as the ``Database`` they mirror: a weak key, so a closed and collected
database takes its copy with it, and a lock, so two threads' first recalls
build one copy, not two.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class PerDatabase(Generic[T]):
    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._held: weakref.WeakKeyDictionary[Any, T] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, db: Any) -> T:
        """``db``'s object, made (empty) on first use."""
        with self._lock:
            found = self._held.get(db)
            if found is None:
                found = self._held[db] = self._factory()
            return found

    def peek(self, db: Any) -> T | None:
        """``db``'s object if one was made, without making it."""
        return self._held.get(db)
