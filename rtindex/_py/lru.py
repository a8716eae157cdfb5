"""Reference row cache: small and obviously correct, the oracle for ``rtindex/_ext/_lru``.

A least-recently-used map from 64-bit keys to objects with a byte budget: each entry is
charged the ``nbytes`` its caller states; after a put, least recently used entries are
evicted until the charged total fits the budget. An entry larger than the whole budget is
not stored. ``get``/``get_many`` count a hit or a miss per key and make hits most recently
used; ``__contains__`` and ``keys_lru`` only look.

Each method holds a lock, and values it drops are released only after it is done (a value's
finalizer may run Python code that uses the cache again), as the compiled cache does.

Counters: ``hits``, ``misses``, ``inserts`` (puts that stored an entry, replacing one
included), ``evictions`` (entries dropped to fit the budget; not ``discard``/``clear`` or a
replacement), ``bytes`` and ``entries`` (what is held now).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Iterable

KEY_MAX = (1 << 64) - 1


def _key(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"row cache keys are ints, not {type(k).__name__}")
    if not 0 <= k <= KEY_MAX:
        raise OverflowError(f"row cache key {k} is outside 0 .. 2**64-1")
    return k


def _key_list(keys: Any) -> list:
    """A buffer of integers (what the SQL layer passes: numpy uint64) as a list of ints."""
    try:
        view = memoryview(keys)
    except TypeError:
        return list(keys)
    if view.ndim != 1 or view.format.lstrip("@=<>!") not in ("Q", "q", "L", "l"):
        return list(keys)
    return view.tolist()


class RowCache:
    """An LRU of objects under a byte budget (see the module docstring)."""

    def __init__(self, capacity_bytes: int):
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be a non-negative int, not {capacity_bytes!r}")
        self._capacity = capacity_bytes
        self._map: OrderedDict[int, tuple[Any, int]] = OrderedDict()  # LRU first
        self._bytes = 0
        self._hits = self._misses = self._inserts = self._evictions = 0
        self._lock = threading.RLock()

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    def get(self, key: int) -> Any:
        """The object cached under ``key`` (now most recently used), or None."""
        k = _key(key)
        with self._lock:
            hit = self._map.get(k)
            if hit is None:
                self._misses += 1
                return None
            self._hits += 1
            self._map.move_to_end(k)
            return hit[0]

    def get_many(self, keys: Iterable[int]) -> list:
        """``[get(k) for k in keys]`` in one call; ``keys`` may also be a buffer of 64-bit
        integers (``array('Q')``, a numpy uint64 array), as the compiled twin takes."""
        keys = _key_list(keys)
        with self._lock:
            return [self.get(k) for k in keys]

    def charged(self, keys: Iterable[int]) -> tuple[int, int]:
        """(the sum of the ``nbytes`` given for those of ``keys`` that are cached, how many
        are not), leaving recency and counters alone."""
        keys = _key_list(keys)
        with self._lock:
            hits = [self._map.get(k) for k in keys]
        return sum(h[1] for h in hits if h is not None), sum(h is None for h in hits)

    def put(self, key: int, value: Any, nbytes: int) -> None:
        """Cache ``value`` under ``key`` (replacing what was there) as most recently used."""
        k = _key(key)
        if value is None:
            raise ValueError("None cannot be cached (get() uses it for a miss)")
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be a non-negative int, not {nbytes!r}")
        dropped = []  # released when this returns, after the lock
        with self._lock:
            old = self._map.pop(k, None)
            if old is not None:
                self._bytes -= old[1]
                dropped.append(old)
            if nbytes > self._capacity:
                return
            self._map[k] = (value, nbytes)
            self._bytes += nbytes
            self._inserts += 1
            while self._bytes > self._capacity:
                _, old = self._map.popitem(last=False)
                self._bytes -= old[1]
                self._evictions += 1
                dropped.append(old)

    def put_many(self, keys: Iterable[int], values: Iterable[Any], sizes: Iterable[int]) -> None:
        """``put`` of each (key, value, nbytes), in order."""
        keys, values, sizes = _key_list(keys), list(values), list(sizes)
        if not len(keys) == len(values) == len(sizes):
            raise ValueError("keys, values and sizes must have the same length")
        with self._lock:
            for k, v, n in zip(keys, values, sizes):
                self.put(k, v, n)

    def discard(self, key: int) -> bool:
        """Drop ``key``; True if it was cached."""
        k = _key(key)
        with self._lock:
            old = self._map.pop(k, None)
            if old is None:
                return False
            self._bytes -= old[1]
        del old  # released outside the lock
        return True

    def clear(self) -> None:
        """Drop every entry (counters other than bytes and entries keep counting)."""
        with self._lock:
            old, self._map = self._map, OrderedDict()
            self._bytes = 0
        del old  # finalizers run outside the lock, on a cache that is already empty

    def keys_lru(self) -> list[int]:
        """Cached keys, least recently used first (for tests and debugging)."""
        with self._lock:
            return list(self._map)

    def __contains__(self, key: int) -> bool:
        k = _key(key)
        with self._lock:
            return k in self._map

    def __len__(self) -> int:
        return len(self._map)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self._hits, "misses": self._misses, "inserts": self._inserts,
                    "evictions": self._evictions, "bytes": self._bytes, "entries": len(self._map),
                    "capacity_bytes": self._capacity}


def copy_json(value: Any) -> Any:
    """A copy of a decoded JSON value that shares only immutable parts (str, int, float,
    bool, None) with it: what a caller may mutate without touching the cached original."""
    if isinstance(value, dict):
        return {k: copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_json(v) for v in value]
    return value


def untrack_json(value: Any) -> Any:
    """Returns ``value``. The compiled twin takes the value's dicts and lists out of the
    cyclic garbage collector's view (JSON trees have no cycles, and a full collection would
    otherwise traverse every cached row); pure Python cannot, so this does nothing."""
    return value
