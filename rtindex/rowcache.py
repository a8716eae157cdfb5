"""The RowStoreCache: decoded rows above RocksDB's block cache, one LRU per database.

Fetching the rows a selective query matched ("add fields") costs a RocksDB read and a JSON
decode per row; this cache keeps the decoded documents (Python dicts, the form the query
path consumes: SQL reads fields straight out of them) in one least-recently-used map across
all shards and collections of a database, under a byte budget.

Why it needs no invalidation: a row id names one stored version of one document forever.
An update writes a new row id and marks the old one deleted; a delete marks it deleted; ids
are never reused. So the content behind a key never changes: a cached row is never stale,
only evicted. Which row ids a query may see is decided by its snapshot (the posting lists
and deleted sets of its views), never by the cache, and a row stays in the row store while
any snapshot that can reach it is alive (physical deletion waits for them), so a miss can
read through RocksDB's latest state and get exactly the version the snapshot names.
Cached rows are also taken out of the cyclic garbage collector's view (``untrack_json``):
a JSON tree has no cycles, and full collections traversing every cached row caused pauses
of 100+ ms. Eviction only drops the cache's reference: a running query holds its own references to the
rows it fetched. Cached dicts are shared, so callers that hand rows to users copy them
(``copy_json``) and internal readers never mutate them.

Keys pack a database-wide shard number (assigned when a shard opens, never reused while the
database is open) above a 40-bit row id; a row id past 2**40 (a trillion versions in one
shard) simply bypasses the cache.
"""

from __future__ import annotations

import itertools
import threading
from typing import Callable

import numpy as np
import orjson

from rtindex._impl import RowCache, copy_json, untrack_json

ROW_BITS = 40
ROW_MAX = (1 << ROW_BITS) - 1
# A decoded row takes several times its JSON size in Python objects, less for small flat
# rows (measured: docs/benchmarks.md, "RowStoreCache"), plus the cache's entry; charging
# 5x keeps the budget an upper bound.
DECODED_BYTES_PER_JSON_BYTE = 5
ENTRY_BYTES = 64

__all__ = ["RowStoreCache", "copy_json", "json_bytes"]


def json_bytes(rows: list[dict]) -> int:
    """The memory decoded rows take as Python objects, by their JSON size and the ratio the
    cache charges for them: what a result budget counts."""
    return sum(len(orjson.dumps(r, default=str)) for r in rows) * DECODED_BYTES_PER_JSON_BYTE


class RowStoreCache:
    """Read-through cache of decoded rows for every shard of one database (0 bytes: off)."""

    def __init__(self, capacity_bytes: int):
        self._lru = RowCache(capacity_bytes)
        self.enabled = capacity_bytes > 0
        self._uids = itertools.count(1)
        self._lock = threading.Lock()

    def new_shard_id(self) -> int:
        """A number for a shard that is opening, unique in this database's lifetime."""
        with self._lock:
            return next(self._uids)

    def rows(self, shard_id: int, row_ids: np.ndarray | list[int], read: Callable[[list[int]], list[bytes | None]],
             below: int, charge: list[int] | None = None) -> list[dict | None]:
        """The decoded rows of ``row_ids`` (a uint64 array, or a list of a few ints; each less
        than ``below``; None where there is none), from the cache or, for misses, from
        ``read`` (RocksDB), which then fill the cache. The dicts are shared with the cache:
        do not modify them. ``charge`` (a one-item list): what the rows take by the measure
        of :func:`json_bytes` is added to it, from the sizes the cache holds when it can."""
        if not self.enabled or not len(row_ids) or below - 1 > ROW_MAX and int(max(row_ids)) > ROW_MAX:
            ids = row_ids.tolist() if isinstance(row_ids, np.ndarray) else row_ids
            docs = [orjson.loads(raw) if raw is not None else None for raw in read(ids)]
            if charge is not None:
                charge[0] += json_bytes([d for d in docs if d is not None])
            return docs
        tag = shard_id << ROW_BITS
        keys = row_ids | np.uint64(tag) if isinstance(row_ids, np.ndarray) else [tag | r for r in row_ids]
        docs = self._lru.get_many(keys)
        if None in docs:  # (a C-speed scan; the common all-hit case stops here)
            missing = [i for i, d in enumerate(docs) if d is None]
            raws = read([int(row_ids[i]) for i in missing])
            put_keys, put_docs, sizes = [], [], []
            for i, raw in zip(missing, raws):
                if raw is None:
                    continue
                d = docs[i] = untrack_json(orjson.loads(raw))  # no cycles: keep the GC out
                put_keys.append(int(keys[i]))
                put_docs.append(d)
                sizes.append(len(raw) * DECODED_BYTES_PER_JSON_BYTE + ENTRY_BYTES)
            self._lru.put_many(put_keys, put_docs, sizes)
        if charge is not None:
            total, absent = self._lru.charged(keys)  # (absent: evicted at once, or too big to cache)
            charge[0] += total - ENTRY_BYTES * len(docs) if not absent else json_bytes([d for d in docs if d is not None])
        return docs

    def forget(self, shard_id: int, row_ids: list[int]) -> None:
        """Drop rows that no reader can reach any more (their versions were garbage-collected):
        they could never be hit again, so they would only hold memory until evicted."""
        if self.enabled:
            base = shard_id << ROW_BITS
            for r in row_ids:
                if r <= ROW_MAX:
                    self._lru.discard(base | r)

    def stats(self) -> dict[str, int]:
        """hits, misses, inserts, evictions, bytes, entries, capacity_bytes."""
        return self._lru.stats()

