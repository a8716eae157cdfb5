"""The decoded column chunks of sealed segments, kept while they fit in a memory budget.

Sealed column chunks are stored compressed (ZSTD, see :func:`rtindex.columns.encode`), so
reading one means decompressing it whole, which is costly for a large column. A query
that scans or gathers a column of a segment would pay that every time; this cache
keeps the decoded chunks most recently used, across every shard of a database, up to
``column_cache_bytes``. It is keyed by segment file and column key (never the Segment
object, whose lifetime decides when a merged-away segment's rows are cleaned up), and
segment files are never reused, so an entry never goes stale: a retired segment's chunks
just age out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any


class ChunkCache:
    """An LRU of decoded column chunks with a budget in bytes (0: keep nothing)."""

    def __init__(self, capacity_bytes: int):
        self.capacity = capacity_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: Any) -> Any:
        """The cached value of ``key`` (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]

    def put(self, key: Any, value: Any, nbytes: int) -> None:
        """Keep ``value`` (``nbytes`` of memory), evicting the least recently used entries
        to make room; a value larger than the whole budget is not kept."""
        if nbytes > self.capacity:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.capacity:
                _, (_, n) = self._entries.popitem(last=False)
                self._bytes -= n

    def stats(self) -> dict:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self._bytes, "capacity": self.capacity,
                    "hits": self.hits, "misses": self.misses}
