"""In-process cache of single-text embeddings (spec EMB-4): LRU with a TTL.

Recall embeds the same query text again and again (a retry, a follow-up with
the same words); the cache turns those into no request at all. Entries are
keyed by a hash of the text so the cache never holds the texts themselves.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable


def text_key(text: str) -> bytes:
    # surrogatepass: a lone surrogate must hash, not raise.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class EmbeddingCache:
    """Thread-safe LRU of ``size`` entries, each valid for ``ttl`` seconds.

    ``size`` 0 (or less) turns caching off; ``ttl`` 0 (or less) means entries
    never expire by age.
    """

    def __init__(self, size: int, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.size = max(0, int(size))
        self.ttl = float(ttl)
        self._clock = clock
        self._entries: OrderedDict[bytes, tuple[float, bytes]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, text: str) -> bytes | None:
        if self.size == 0:
            return None
        key = text_key(text)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and self.ttl > 0 and self._clock() - entry[0] >= self.ttl:
                del self._entries[key]
                entry = None
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[1]

    def put(self, text: str, blob: bytes) -> None:
        if self.size == 0:
            return
        key = text_key(text)
        with self._lock:
            self._entries[key] = (self._clock(), blob)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
