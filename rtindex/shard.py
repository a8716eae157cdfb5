"""One shard, read side: lookups, fetches and scans over a :class:`ShardState`.

A shard is a RocksDB instance (rows, ids, meta: rtindex/storage.py) plus its segments
(rtindex/segments.py). The writer process subclasses this with the write path
(rtindex/writer.py, background work in rtindex/maintenance.py); a reader process follows
the writer with rtindex/reader.py. Every read here works on a state the caller took, so it
never locks against writers (except a short lock on the one builder still being filled).
"""

from __future__ import annotations

import bisect
import os
import threading
from contextlib import nullcontext
from typing import Callable, ContextManager, Iterator

import numpy as np
import orjson
import pyarrow as pa
from pyroaring import BitMap, FrozenBitMap

from rtindex import columns, keys
from rtindex._impl import block_range
from rtindex.chunkcache import ChunkCache
from rtindex.errors import CorruptionError
from rtindex.keys import u64
from rtindex.rowcache import RowStoreCache, copy_json
from rtindex.segments import EMPTY, Segment, ShardConfig, ShardState, View, keep_mask, spend
from rtindex.storage import Store

SEGMENTS_DIR = "segments"
SIGNAL_FILE = "changes"  # rtindex/notify.py
_ID_PATH = keys.encode_path(("_id",))


class Shard:
    """Reads of one shard. Subclasses set ``store`` and publish ``_state``."""

    store: Store
    _state: ShardState

    def __init__(self, path: str, index: int, config: ShardConfig, row_cache: RowStoreCache,
                 column_cache: ChunkCache):
        self.path = path
        self.index = index
        self.config = config
        self.segments_dir = os.path.join(path, SEGMENTS_DIR)
        self._rows = row_cache
        self._column_cache = column_cache
        self._row_cache_id = row_cache.new_shard_id()
        self._mem_lock = threading.Lock()  # guards the builder being filled against concurrent reads
        self.on_publish: Callable[[], None] | None = None  # called after each new state

    @property
    def state(self) -> ShardState:
        return self._state

    def _set_state(self, state: ShardState) -> None:
        """Make ``state`` the one new reads see, and tell ``on_publish`` (the collection,
        which then drops what it worked out from the states it replaces: holding them would
        keep segments that a merge retired, and so their files, until the next query)."""
        self._state = state
        if self.on_publish is not None:
            self.on_publish()

    def get(self, id_key: bytes) -> dict | None:
        """The current document with this id key, as of the current state (a copy)."""
        state = self._state
        rid = self._find_id(state, id_key)
        if rid is None:
            return None
        doc = self.fetch(np.array([rid], dtype=np.uint64))[0]
        return copy_json(doc) if doc is not None else None

    def _find_id(self, state: ShardState, id_key: bytes) -> int | None:
        """Row id of the visible version of a document in ``state``.

        The ``ids`` record is one point read, but it may be ahead of ``state`` (a write not yet
        published, or a reader's storage caught up further than its index): it is used only
        when ``state`` confirms it; otherwise the ``_id`` term is looked up in ``state``.
        """
        raw = self.store.get("ids", id_key)
        if raw is not None:
            rid = keys.from_u64(raw)
            if rid < state.next_row_id:
                i = bisect.bisect_right([v.base for v in state.views], rid) - 1
                if i >= 0:
                    v = state.views[i]
                    off = rid - v.base
                    if off < v.limit and off not in v.deleted and (not v.sealed or off in v.seg.live):
                        return rid
        t = _ID_PATH + id_key
        for v in state.views:
            if v.limit:
                hits = self.term(v, t)
                if hits:
                    return v.base + hits.max()
        return None

    def _meta_u64(self, key: bytes) -> int:
        """A u64 meta record (0 when absent), read with an iterator: on a RocksDB secondary a
        point Get of a key the writer overwrites can keep returning an old value from a stale
        memtable after the writer flushed (facebook/rocksdb#15051; reproduced in 2-3 of 8
        rounds), while an iterator sees the current one."""
        for _, raw in self.store.scan("meta", key, key + b"\0"):
            return keys.from_u64(raw)
        return 0

    def _decoded_rows(self, start: int, end: int) -> Iterator[dict]:
        """Rows ``start`` .. ``end - 1`` from the row store, decoded, in order (what an
        in-memory segment is built from); CorruptionError where one is missing."""
        expect = start
        for k, v in self.store.scan("rows", u64(start), u64(end)):
            if keys.from_u64(k) != expect:
                raise CorruptionError(f"shard {self.index} of {self.path}: row {keys.from_u64(k)} found where "
                                      f"row {expect} was expected")
            yield orjson.loads(v)
            expect += 1
        if expect != end:
            raise CorruptionError(f"shard {self.index} of {self.path}: rows end at {expect}, next row id is {end}")

    def _reading(self, view: View) -> ContextManager:
        """Guard for reading ``view``'s builder: the active one is locked against ``add()``;
        a rotated one never changes again and needs no lock."""
        return self._mem_lock if view.seg is self._state.views[-1].seg else nullcontext()

    def term(self, view: View, term: bytes) -> BitMap:
        """Offsets of ``view``'s visible rows holding ``term``."""
        if isinstance(view.seg, Segment):
            bm = view.seg.terms.get(term)
            if bm is None:
                return BitMap()
        else:
            with self._reading(view):
                bm = BitMap(view.seg.builder.postings(term, view.limit))
        if view.deleted:
            bm -= view.deleted
        return bm

    def has_arrays(self, view: View, array_keys: list[bytes]) -> bool:
        """False when no row of a sealed ``view`` can hold an array at any of ``array_keys``
        (ARRAY column keys): the first array on a path is never inside another array, so it
        has a column. In-memory segments answer True (look the markers up)."""
        return not isinstance(view.seg, Segment) or not view.seg.column_set.isdisjoint(array_keys)

    def has_columns(self, view: View, column_keys: list[bytes]) -> bool:
        """Whether some row of ``view`` may have a column-store value for one of
        ``column_keys`` (a scalar of that path and type outside arrays)."""
        if isinstance(view.seg, Segment):
            return not view.seg.column_set.isdisjoint(column_keys)
        with self._reading(view):
            return any(view.seg.builder.column_size(ck, view.limit) for ck in column_keys)

    def has_terms(self, view: View, column_key: bytes) -> bool:
        """Whether some row of ``view`` may hold a term of ``column_key`` (path + type).

        Conservative (deleted rows count): planners use it to rule things out cheaply. A
        sealed segment never changes, so its answer is remembered.
        """
        seg = view.seg
        if isinstance(seg, Segment):
            hit = seg.term_memo.get(column_key)
            if hit is None:
                hi = keys.prefix_upper_bound(column_key)
                hit = seg.term_memo[column_key] = bool(self.term_range(View(seg, view.limit, EMPTY), column_key, hi))
            return hit
        with self._reading(view):
            return column_key in seg.builder.column_keys()

    def term_range(self, view: View, lo: bytes, hi: bytes, budget: list[int] | None = None) -> BitMap:
        """Offsets of visible rows holding any term t with lo <= t < hi (one path and type).

        ``budget`` (a one-item list) is decremented by the number of distinct terms read;
        :class:`~rtindex.segments.OverBudget` is raised once it goes below zero, so a planner
        can give up on a range that covers too many terms before paying for all of them.
        """
        out = BitMap()
        if isinstance(view.seg, Segment):
            file = view.seg.file
            firsts = view.seg.block_keys
            start = max(bisect.bisect_right(firsts, lo) - 1, 0)
            end = bisect.bisect_left(firsts, hi)
            for i in range(start, end):
                hits = block_range(file.block(i), lo, hi)
                spend(budget, len(hits))
                for _, bm in hits:
                    out |= bm
        else:
            b = view.seg.builder
            with self._reading(view):
                terms = [t for t in b.column_terms(keys.column_key_of(lo)) if lo <= t < hi]
                spend(budget, len(terms))
                for t in terms:
                    out |= BitMap(b.postings(t, view.limit))
        if view.deleted:
            out -= view.deleted
        return out

    def all_rows(self, view: View) -> BitMap:
        bm = BitMap(view.seg.live) if isinstance(view.seg, Segment) else BitMap(range(view.limit))
        if view.deleted:
            bm -= view.deleted
        return bm

    def fetch(self, row_ids: np.ndarray | list[int], charge: list[int] | None = None) -> list[dict | None]:
        """Decoded rows (``row_ids`` a uint64 array, or a list of a few ints) through the
        database's RowStoreCache: shared objects, read-only. ``charge``: see RowStoreCache.rows."""
        return self._rows.rows(self._row_cache_id, row_ids, self._read_rows, self.state.next_row_id, charge)

    def _read_rows(self, row_ids: list[int]) -> list[bytes]:
        raws = self.store.multi_get("rows", [u64(r) for r in row_ids])
        if None in raws:  # only rows a state shows are asked for: each must be there
            self._missing_rows([r for r, raw in zip(row_ids, raws) if raw is None])
        return raws

    def _missing_rows(self, row_ids: list[int]) -> None:
        raise CorruptionError(f"shard {self.index} of {self.path}: rows {row_ids[:5]} are visible in the index "
                              f"but missing from the row store")

    def column_tags(self, view: View, path_key: bytes) -> frozenset[int] | set[int]:
        """Type tags with a column-store value for the encoded path in ``view`` (array
        elements and object markers are indexed terms, not columns)."""
        if isinstance(view.seg, Segment):  # immutable: worked out once per path (every query asks)
            tags = view.seg.tags_memo.get(path_key)
            if tags is None:
                tags = view.seg.tags_memo[path_key] = frozenset(
                    tag for tag in keys.TAG_NAMES if path_key + bytes((tag,)) in view.seg.column_set)
            return tags
        b = view.seg.builder
        with self._reading(view):
            return {tag for tag in columns.ARROW_TYPES if b.column_size(path_key + bytes((tag,)), view.limit)}

    def column_keys(self, view: View) -> list[bytes]:
        """Every column key (path + type tag) ``view`` has values or markers of: which fields
        its rows may hold (deleted rows count)."""
        if isinstance(view.seg, Segment):
            return list(view.seg.column_keys)
        with self._reading(view):
            return view.seg.builder.column_keys()

    def scan_view(self, view: View, colkeys: list[bytes]) -> tuple[pa.Array, list[pa.Array]]:
        """(offsets, one array per column key) of the visible rows of ``view``."""
        if isinstance(view.seg, Segment):
            n = len(view.seg.live)
            cols = [c.array if c is not None else columns.nulls(ck[-1], n)
                    for ck, c in zip(colkeys, self._chunks(view.seg, colkeys))]
            offsets = view.seg.live_offsets
            if view.deleted:
                keep = keep_mask(view.seg.live, view.deleted)
                offsets = offsets.filter(keep)
                cols = [c.filter(keep) for c in cols]
            return offsets, cols
        n = view.limit
        cols = self._mem_columns(view, colkeys)
        offsets = pa.array(np.arange(n, dtype=np.uint32))
        if view.deleted:
            keep = keep_mask(FrozenBitMap(range(n)), view.deleted)
            offsets = offsets.filter(keep)
            cols = [c.filter(keep) for c in cols]
        return offsets, cols

    def take_view(self, view: View, colkeys: list[bytes], rows: BitMap) -> tuple[np.ndarray, list[columns.Taken]]:
        """(offsets, the values of each column key) of the visible rows of ``view`` among
        ``rows``: the rows an index lookup matched, their fields read from the column store
        ("add fields") instead of whole documents; :func:`columns.gather` joins the values
        taken from every view."""
        if isinstance(view.seg, Segment):
            seg = view.seg
            held = rows & seg.live
            if view.deleted:
                held = held - view.deleted
            wanted = np.frombuffer(held.to_array(), dtype=np.uint32)
            # a chunk holds one value per live offset: take at their ranks
            at = (wanted.astype(np.intp) if seg.live_dense
                  else np.searchsorted(seg.live_offsets.to_numpy(zero_copy_only=True), wanted))
            chunks = self._chunks(seg, colkeys)
            return wanted, [c.take(at) if c is not None else columns.null_taken(len(at)) for c in chunks]
        held = BitMap(rows) - view.deleted
        held.remove_range(view.limit, 1 << 32)  # offsets this view does not show yet
        wanted = np.frombuffer(held.to_array(), dtype=np.uint32)
        at = wanted.astype(np.intp)
        return wanted, [columns.Chunk(c).take(at) for c in self._mem_columns(view, colkeys)]

    def _chunks(self, seg: Segment, colkeys: list[bytes]) -> list[columns.Chunk | None]:
        """The column chunks of a sealed segment (None: it holds no value of that key)."""
        n = len(seg.live)
        out = []
        for ck in colkeys:
            chunk = seg.column(ck, self._column_cache)
            if chunk is not None and len(chunk.array) != n:
                raise CorruptionError(f"shard {self.index}: column chunk of the wrong length in segment "
                                      f"{seg.segid} ({seg.file.path})")
            out.append(chunk)
        return out

    def _mem_columns(self, view: View, colkeys: list[bytes]) -> list[pa.Array]:
        """The columns of an in-memory ``view``'s first ``limit`` rows (deleted ones too)."""
        n = view.limit
        with self._reading(view):  # (copies of the builder's buffers: used outside the lock)
            got = [view.seg.builder.column(ck, n) for ck in colkeys]
        return [columns.dense(ck[-1], offs, vals, n) if len(offs) else columns.nulls(ck[-1], n)
                for ck, (offs, vals) in zip(colkeys, got)]
