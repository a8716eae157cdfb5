"""Type stub of the compiled row cache (twin of rtindex._py.lru)."""

from typing import Any, Iterable

KEY_MAX: int

class RowCache:
    """An LRU of objects under a byte budget, keyed by uint64 (see ``rtindex._py.lru``)."""

    def __init__(self, capacity_bytes: int) -> None:
        """``capacity_bytes``: a non-negative int below 2**63 (ValueError otherwise)."""
    @property
    def capacity_bytes(self) -> int:
        """The byte budget."""
    def get(self, key: int) -> Any:
        """The object cached under ``key`` (now most recently used), or None."""
    def get_many(self, keys: Iterable[int]) -> list[Any]:
        """``[get(k) for k in keys]`` in one call; ``keys`` may be a 1-D buffer of 64-bit
        integers (``array('Q')``, numpy uint64/int64), read in one C loop."""
    def charged(self, keys: Iterable[int]) -> tuple[int, int]:
        """(the sum of the ``nbytes`` given for those of ``keys`` that are cached, how many
        are not), leaving recency and counters alone."""
    def put(self, key: int, value: Any, nbytes: int) -> None:
        """Cache ``value`` under ``key`` (replacing what was there) as most recently used;
        then evict least recently used entries until the budget holds. An entry larger than
        the budget is not stored (and drops what ``key`` held)."""
    def put_many(self, keys: Iterable[int], values: Iterable[Any], sizes: Iterable[int]) -> None:
        """``put`` of each (key, value, nbytes), in order; keys and sizes may be buffers."""
    def discard(self, key: int) -> bool:
        """Drop ``key``; True if it was cached."""
    def clear(self) -> None:
        """Drop every entry (counters other than bytes and entries keep counting)."""
    def keys_lru(self) -> list[int]:
        """Cached keys, least recently used first (for tests and debugging)."""
    def __contains__(self, key: int) -> bool:
        """Whether ``key`` is cached (not a use: the LRU order and counters do not change)."""
    def __len__(self) -> int:
        """Entries held."""
    def stats(self) -> dict[str, int]:
        """hits, misses, inserts, evictions, bytes, entries, capacity_bytes."""

def copy_json(value: Any) -> Any:
    """A copy of a decoded JSON value that shares only immutable parts (str, int, float,
    bool, None) with it: what a caller may mutate without touching the cached original."""

def untrack_json(value: Any) -> Any:
    """Take a decoded JSON value's dicts and lists out of the cyclic GC's view (a JSON tree
    has no cycles; cached rows would otherwise be traversed by every full collection);
    returns ``value``. Only for values nobody modifies."""
