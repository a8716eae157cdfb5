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
from dataclasses import dataclass
from typing import Callable

import numpy as np
import orjson
import pyarrow as pa
from pyroaring import BitMap

from rtindex import columns, keys
from rtindex.chunkcache import ChunkCache
from rtindex.errors import CorruptionError
from rtindex.keys import u64
from rtindex.rowcache import RowStoreCache, copy_json
from rtindex.segments import Segment, ShardConfig, ShardState, View, keep_mask, open_segment
from rtindex.storage import Store

SEGMENTS_DIR = "segments"
TAILS_DIR = "tails"  # the mutable segments' files, which reader processes map
SIGNAL_FILE = "signal"  # the shard's published state, for reader processes (rtindex/notify.py)
OLD_SIGNAL_FILE = "changes"  # what an earlier version called it (removed)


def tail_path(shard_path: str, base: int, fid: int) -> str:
    """The file of the mutable segment ``fid`` whose first row id is ``base``."""
    return os.path.join(shard_path, TAILS_DIR, f"{base:020d}-{fid:016x}.rtt")


@dataclass(frozen=True, slots=True)
class Stored:
    """A shard as its meta records describe it (see :meth:`Shard.load`)."""

    next_row: int
    generation: int
    log_seq: int
    segments: list[Segment]  # by base, tiling the row ids from 0

    @property
    def sealed_end(self) -> int:
        return self.segments[-1].base + self.segments[-1].n if self.segments else 0


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
        state = self.state
        rid = self._find_id(state, id_key)
        if rid is None:
            return None
        doc = self.fetch(np.array([rid], dtype=np.uint64), state=state)[0]
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
                    if off < v.limit and off not in v.deleted and v.seg.holds(off):
                        return rid
        t = keys.id_term(id_key)
        for v in state.views:
            if v.limit:
                hits = self.term(v, t)
                if hits:
                    return v.base + hits.max()
        return None

    def load(self, previous: Stored | None = None) -> Stored:
        """What the meta records say now: the next row id, the change log sequence and the
        sealed segments (their files mapped; those of ``previous`` are reused, and all of
        them when the segment generation did not change). Writer recovery and a reader's
        refresh both start here."""
        next_row = self._meta_u64(keys.META_NEXT_ROW)
        gen = self._meta_u64(keys.META_GENERATION)
        log_seq = self._meta_u64(keys.META_LOG_SEQ)
        if previous is not None and previous.generation == gen:
            return Stored(next_row, gen, log_seq, previous.segments)
        known = {s.segid: s for s in previous.segments} if previous is not None else {}
        segs = []
        for k, v in self.store.scan("meta", keys.META_SEGMENT, keys.prefix_upper_bound(keys.META_SEGMENT)):
            segid = keys.meta_segment_id(k)
            seg = known.get(segid)
            segs.append(seg if seg is not None else open_segment(self.segments_dir, segid, orjson.loads(v), self.index))
        segs.sort(key=lambda s: s.base)
        end = 0
        for seg in segs:  # they tile the row ids from 0: a hole would make rows vanish
            if seg.base != end:
                raise CorruptionError(f"shard {self.index} of {self.path}: segment {seg.segid} starts at row "
                                      f"{seg.base}, the segments before it end at row {end}")
            end = seg.base + seg.n
        if end > next_row:
            raise CorruptionError(f"shard {self.index} of {self.path}: the rows end at {next_row}, "
                                  f"the segments at {end}")
        return Stored(next_row, gen, log_seq, segs)

    def deleted_offsets(self, base: int, n: int) -> BitMap:
        """Offsets (from ``base``) of the rows ``base`` .. ``base + n - 1`` that delete
        records name."""
        return BitMap(keys.meta_deleted_row(k) - base
                      for k in self.store.scan_keys("meta", keys.meta_deleted(base), keys.meta_deleted(base + n)))

    def source_offsets(self, source: str) -> dict[int, int]:
        """{partition: the next offset this shard has not stored} of ``source``
        (rtindex/sources.py)."""
        return {keys.meta_source_partition(k): keys.from_u64(v)
                for k, v in self.store.scan("meta", *keys.meta_source_range(source))}

    def _meta_u64(self, key: bytes) -> int:
        """A u64 meta record (0 when absent), read with an iterator: on a RocksDB secondary a
        point Get of a key the writer overwrites can keep returning an old value from a stale
        memtable after the writer flushed (facebook/rocksdb#15051; reproduced in 2-3 of 8
        rounds), while an iterator sees the current one."""
        for _, raw in self.store.scan("meta", key, key + b"\0"):
            return keys.from_u64(raw)
        return 0

    def term(self, view: View, term: bytes) -> BitMap:
        """Offsets of ``view``'s visible rows holding ``term``."""
        bm = view.seg.postings(term, view.limit)
        if view.deleted:
            bm -= view.deleted
        return bm

    def array_rows(self, view: View, marker: bytes) -> BitMap:
        """Offsets of ``view``'s rows (deleted ones too) holding an array where ``marker``
        (an ARRAY column key) says."""
        return view.seg.array_rows(marker, view.limit)

    def has_arrays(self, view: View, array_keys: list[bytes]) -> bool:
        """False when no row of ``view`` can hold an array at any of ``array_keys`` (ARRAY
        column keys); True when it may (look the markers up)."""
        return view.seg.may_have_arrays(array_keys)

    def has_columns(self, view: View, column_keys: list[bytes]) -> bool:
        """Whether some row of ``view`` may have a column-store value for one of
        ``column_keys`` (a scalar of that path and type outside arrays)."""
        return view.seg.has_columns(column_keys, view.limit)

    def has_terms(self, view: View, column_key: bytes) -> bool:
        """Whether some row of ``view`` may hold a term of ``column_key`` (path + type).
        Conservative (deleted rows count): planners use it to rule things out cheaply."""
        return view.seg.has_terms(column_key, view.limit)

    def term_range(self, view: View, lo: bytes, hi: bytes, budget: list[int] | None = None) -> BitMap:
        """Offsets of visible rows holding any term t with lo <= t < hi (one path and type).

        ``budget`` (a one-item list) is decremented by the number of distinct terms read;
        :class:`~rtindex.segments.OverBudget` is raised once it goes below zero, so a planner
        can give up on a range that covers too many terms before paying for all of them.
        """
        out = view.seg.term_range(lo, hi, view.limit, budget)
        if view.deleted:
            out -= view.deleted
        return out

    def all_rows(self, view: View) -> BitMap:
        bm = view.seg.all_offsets(view.limit)
        if view.deleted:
            bm -= view.deleted
        return bm

    def fetch(self, row_ids: np.ndarray | list[int], charge: list[int] | None = None,
              state: ShardState | None = None) -> list[dict | None]:
        """Decoded rows (``row_ids`` a uint64 array, or a list of a few ints) of ``state``
        (the current one if None) through the database's RowStoreCache: shared objects,
        read-only. ``charge``: see RowStoreCache.rows."""
        state = self._state if state is None else state
        return self._rows.rows(self._row_cache_id, row_ids, lambda ids: self._read_rows(ids, state),
                               state.next_row_id, charge)

    def _read_rows(self, row_ids: list[int], state: ShardState) -> list[bytes]:
        """The stored bytes of rows of ``state``: from the segment that holds each (a
        mutable segment's mapping, a sealed segment's file), else from the row store (the
        rows of segment files written before rows moved into them). A state's segments
        outlive a seal or merge that replaced them, so an old snapshot reads what it saw."""
        if not row_ids:
            return []
        views = state.views
        bases = [v.base for v in views]
        raws = []
        for r in row_ids:
            i = bisect.bisect_right(bases, r) - 1
            raws.append(views[i].seg.row(r - bases[i]) if i >= 0 else None)
        if None in raws:
            missing = [i for i, raw in enumerate(raws) if raw is None]
            for i, raw in zip(missing, self.store.multi_get("rows", [u64(row_ids[i]) for i in missing])):
                raws[i] = raw
        if None in raws:  # only rows a state shows are asked for: each must be there
            self._missing_rows([r for r, raw in zip(row_ids, raws) if raw is None])
        return raws

    def _missing_rows(self, row_ids: list[int]) -> None:
        raise CorruptionError(f"shard {self.index} of {self.path}: rows {row_ids[:5]} are visible in the index "
                              f"but missing from the row store")

    def column_tags(self, view: View, path_key: bytes) -> frozenset[int] | set[int]:
        """Type tags with a column-store value for the encoded path in ``view`` (array
        elements and object markers are indexed terms, not columns)."""
        return view.seg.column_tags(path_key, view.limit)

    def column_keys(self, view: View) -> list[bytes]:
        """Every column key (path + type tag) ``view`` has values or markers of: which fields
        its rows may hold (deleted rows count)."""
        return view.seg.keys_of_columns(view.limit)

    def scan_view(self, view: View, colkeys: list[bytes]) -> tuple[pa.Array, list[pa.Array]]:
        """(offsets, one array per column key) of the visible rows of ``view``."""
        offsets, cols = view.seg.scan(colkeys, view.limit, self._column_cache)
        if view.deleted:
            keep = keep_mask(view.seg.all_offsets(view.limit), view.deleted)
            offsets = offsets.filter(keep)
            cols = [c.filter(keep) for c in cols]
        return offsets, cols

    def take_view(self, view: View, colkeys: list[bytes], rows: BitMap) -> tuple[np.ndarray, list[tuple]]:
        """(offsets, the values of each column key) of the visible rows of ``view`` among
        ``rows``: the rows an index lookup matched, their fields read from the column store
        ("add fields") instead of whole documents; :func:`columns.gather` joins the parts
        of every view."""
        held = view.seg.held(rows, view.limit)
        if view.deleted:
            held -= view.deleted
        wanted = np.frombuffer(held.to_array(), dtype=np.uint32)
        return wanted, view.seg.take(colkeys, wanted, view.limit, self._column_cache)
