"""The segment model of a shard: what a reader state is made of.

A shard's rows are split into segments by row id: sealed segments (immutable files, see
rtindex/segfile.py) followed by in-memory segments (a SegmentBuilder: the newest rows, or
rows handed to the sealer and not yet written). A :class:`ShardState` is an immutable
picture of them: which segments, how many rows of each are visible, which offsets are
deleted. Writers publish a new state per batch; readers take the current one and never lock.
"""

from __future__ import annotations

import bisect
import os
import weakref
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyroaring import BitMap, FrozenBitMap

from rtindex import columns, keys, segfile
from rtindex._impl import block_first_last, block_items, block_range
from rtindex.chunkcache import ChunkCache
from rtindex.errors import CorruptionError, StorageError
from rtindex.segfile import SegmentFile

EMPTY = FrozenBitMap()


class Segment:
    """A sealed segment: a mapped file. Immutable; weak-referenceable so that its clean-up
    runs once the last reader state that refers to it is gone.

    Its reads take a row ``limit`` like a mutable segment's (a sealed one shows every row)."""

    sealed = True
    __slots__ = ("segid", "base", "n", "live", "file", "column_keys", "column_set", "block_keys", "terms", "term_memo",
                 "tags_memo", "array_memo", "merged_into", "_live_offsets", "live_dense", "_term_keys", "__weakref__")

    def __init__(self, segid: int, file: SegmentFile):
        self.segid = segid
        self.file = file
        self.base = file.base
        self.n = file.n
        self.live = file.live  # offsets the segment holds (a merge drops deleted rows)
        # live is 0..n-1 (nothing dropped): an offset is its own position in a column chunk
        self.live_dense = not self.live or (self.live.min() == 0 and self.live.max() == len(self.live) - 1)
        self.column_keys = file.column_keys
        self.column_set = frozenset(file.column_keys)
        # first term of each postings block, sorted: a range lookup bisects it and reads blocks
        self.block_keys = file.block_keys
        self.terms = file.term_index()  # point lookups, in one call
        self.term_memo: dict[bytes, bool] = {}  # column key -> has terms (see has_terms)
        self.tags_memo: dict[bytes, frozenset[int]] = {}  # path key -> its column type tags (column_tags)
        self.array_memo: dict[bytes, FrozenBitMap] = {}  # array marker -> its rows (array_rows)
        # the segment a merge turned this one into: a reader still holding this one keeps the
        # successor (whose clean-up could drop rows this reader sees) alive too
        self.merged_into: Segment | None = None
        self._live_offsets: pa.Array | None = None
        self._term_keys: frozenset[bytes] | None = None

    def live_count(self, limit: int) -> int:
        return len(self.live)

    def holds(self, off: int) -> bool:
        return off in self.live

    def postings(self, term: bytes, limit: int) -> BitMap:
        bm = self.terms.get(term)
        return BitMap() if bm is None else bm

    def array_rows(self, marker: bytes, limit: int) -> FrozenBitMap:
        """The rows holding an array at a path (``marker``, its ARRAY column key): a point
        query through an array asks for them every time, and they are often most rows of
        the segment, so they are decoded once."""
        bm = self.array_memo.get(marker)
        if bm is None:
            bm = self.array_memo[marker] = FrozenBitMap(self.postings(marker, limit))
        return bm

    def term_range(self, lo: bytes, hi: bytes, limit: int, budget: list[int] | None) -> BitMap:
        out = BitMap()
        firsts = self.block_keys
        for i in range(max(bisect.bisect_right(firsts, lo) - 1, 0), bisect.bisect_left(firsts, hi)):
            hits = block_range(self.file.block(i), lo, hi)
            spend(budget, len(hits))
            for _, bm in hits:
                out |= bm
        return out

    def all_offsets(self, limit: int) -> BitMap:
        return BitMap(self.live)

    def may_have_arrays(self, array_keys: list[bytes]) -> bool:
        """The first array on a path is never inside another array, so it has a column."""
        return not self.column_set.isdisjoint(array_keys)

    def has_columns(self, column_keys: list[bytes], limit: int) -> bool:
        return not self.column_set.isdisjoint(column_keys)

    def has_terms(self, column_key: bytes, limit: int) -> bool:
        hit = self.term_memo.get(column_key)
        if hit is None:
            hit = self.term_memo[column_key] = bool(
                self.term_range(column_key, keys.prefix_upper_bound(column_key), limit, None))
        return hit

    def column_tags(self, path_key: bytes, limit: int) -> frozenset[int]:
        tags = self.tags_memo.get(path_key)  # every query asks: worked out once per path
        if tags is None:
            tags = self.tags_memo[path_key] = frozenset(
                tag for tag in keys.TAG_NAMES if keys.column_key_at(path_key, tag) in self.column_set)
        return tags

    def keys_of_columns(self, limit: int) -> list[bytes]:
        """Column keys with values, and those of its terms (markers, array elements): read
        from the term blocks once; a block whose first and last terms share a column key
        holds only that one."""
        if self._term_keys is None:
            found = set()
            for i in range(len(self.block_keys)):
                block = self.file.block(i)
                first, last = (keys.column_key_of(t) for t in block_first_last(block))
                found.update((first, last) if first == last else
                             (keys.column_key_of(t) for t, _ in block_items(block)))
            self._term_keys = frozenset(found)
        return sorted(self.column_set | self._term_keys)

    def scan(self, colkeys: list[bytes], limit: int, cache: ChunkCache) -> tuple[pa.Array, list[pa.Array]]:
        """(offsets, one array per column key) of every row it holds."""
        n = len(self.live)
        cols = [c.array if c is not None else columns.nulls(keys.tag_of(ck), n)
                for ck, c in zip(colkeys, self._chunks(colkeys, cache))]
        return self.live_offsets, cols

    def held(self, rows: BitMap, limit: int) -> BitMap:
        """The offsets among ``rows`` it holds (a new BitMap)."""
        return rows & self.live

    def take(self, colkeys: list[bytes], wanted: np.ndarray, limit: int, cache: ChunkCache) -> list[tuple]:
        """The :func:`columns.gather` part of each column key at the held offsets ``wanted``."""
        # a chunk holds one value per live offset: take at their ranks
        at = (wanted.astype(np.int64) if self.live_dense
              else np.searchsorted(self.live_offsets.to_numpy(zero_copy_only=True), wanted).astype(np.int64))
        return [c.part(at) if c is not None else columns.missing_part(at) for c in self._chunks(colkeys, cache)]

    def row(self, off: int) -> bytes | None:
        """The stored text of the row at ``off`` (a held one), or None when the rows of this
        segment are in the row store (a file written before rows moved into segment files)."""
        if not self.file.has_rows or off not in self.live:
            return None
        try:
            return self.file.row(off if self.live_dense else self.live.rank(off) - 1)
        except OSError as e:  # (a write reads the version it replaces: StorageError is what it may raise)
            raise StorageError(f"cannot read segment file {self.file.path}: {e}") from e

    def _chunks(self, colkeys: list[bytes], cache: ChunkCache) -> list[columns.Chunk | None]:
        n = len(self.live)
        out = []
        for ck in colkeys:
            chunk = self.column(ck, cache)
            if chunk is not None and len(chunk.array) != n:
                raise CorruptionError(f"column chunk of the wrong length in segment file {self.file.path}")
            out.append(chunk)
        return out

    def column(self, column_key: bytes, cache: ChunkCache) -> columns.Chunk | None:
        """The column chunk of ``column_key`` (one value per live offset), or None; decoded
        once while ``cache`` keeps it (every scan and every add-fields read of the segment
        needs it, and decoding a compressed chunk is dear)."""
        if column_key not in self.column_set:
            return None
        key = (self.file.path, column_key)
        chunk = cache.get(key)
        if chunk is None:
            try:
                arr = self.file.column(column_key)
            except OSError as e:
                raise StorageError(f"cannot read segment file {self.file.path}: {e}") from e
            chunk = columns.Chunk(arr)
            cache.put(key, chunk, arr.nbytes)
        return chunk

    @property
    def live_offsets(self) -> pa.Array:
        """``live`` as a uint32 Arrow array, made once: every scan of the segment needs it."""
        if self._live_offsets is None:
            self._live_offsets = pa.array(np.frombuffer(self.live.to_array(), dtype=np.uint32))
        return self._live_offsets


def open_segment(directory: str, segid: int, descriptor: dict, shard_index: int) -> Segment:
    """Map the file of the segment a descriptor (``{"base", "n"}``) names, checked against it."""
    seg = Segment(segid, segfile.open_segment(directory, segid))
    if (seg.base, seg.n) != (descriptor["base"], descriptor["n"]):
        raise CorruptionError(f"shard {shard_index}: segment file {seg.file.path} holds rows {seg.base}+{seg.n}, "
                              f"its descriptor says {descriptor['base']}+{descriptor['n']}")
    return seg


class MemSegment:
    """A mutable segment: the newest rows, indexed in memory (a SegmentBuilder, in a file that
    reader processes map); read-only once rotated out for sealing. A read shows its first
    ``limit`` rows.

    Scans read its columns with ``builder.column`` each time, with no cache of Arrow arrays
    here: the builder keeps its values typed already, so a scan's cost is a copy.
    ``owned``: this process made the file, which is removed once no state refers to it.
    """

    sealed = False
    __slots__ = ("builder", "base", "fid", "sealed_as", "_unlink", "__weakref__")

    def __init__(self, builder, owned: bool = False):
        self.builder = builder
        self.base = builder.base
        self.fid = tail_fid(builder.path)
        # the Segment it became: a reader still holding this MemSegment keeps that Segment
        # (and so its rows) alive until the reader is done, even after a merge retires it
        self.sealed_as: Segment | None = None
        self._unlink = weakref.finalize(self, builder.unlink) if owned else None

    def keep_file(self) -> None:
        """Leave the file when this goes (a writer closing: readers may still follow it)."""
        if self._unlink is not None:
            self._unlink.detach()

    def live_count(self, limit: int) -> int:
        return limit

    def holds(self, off: int) -> bool:
        return True

    def postings(self, term: bytes, limit: int) -> BitMap:
        return BitMap(self.builder.postings(term, limit))

    def array_rows(self, marker: bytes, limit: int) -> BitMap:
        return self.postings(marker, limit)

    def term_range(self, lo: bytes, hi: bytes, limit: int, budget: list[int] | None) -> BitMap:
        b = self.builder
        terms = [t for t in b.column_terms(keys.column_key_of(lo)) if lo <= t < hi]
        spend(budget, len(terms))
        out = BitMap()
        for t in terms:
            out |= BitMap(b.postings(t, limit))
        return out

    def all_offsets(self, limit: int) -> BitMap:
        return BitMap(range(limit))

    def may_have_arrays(self, array_keys: list[bytes]) -> bool:
        return True  # (the array markers are looked up instead)

    def has_columns(self, column_keys: list[bytes], limit: int) -> bool:
        return any(self.builder.column_size(ck, limit) for ck in column_keys)

    def has_terms(self, column_key: bytes, limit: int) -> bool:
        return column_key in self.builder.column_keys()

    def column_tags(self, path_key: bytes, limit: int) -> set[int]:
        b = self.builder
        return {tag for tag in columns.ARROW_TYPES if b.column_size(keys.column_key_at(path_key, tag), limit)}

    def keys_of_columns(self, limit: int) -> list[bytes]:
        return self.builder.column_keys()

    def scan(self, colkeys: list[bytes], limit: int, cache: ChunkCache) -> tuple[pa.Array, list[pa.Array]]:
        return pa.array(np.arange(limit, dtype=np.uint32)), self._columns(colkeys, limit)

    def held(self, rows: BitMap, limit: int) -> BitMap:
        held = BitMap(rows)
        held.remove_range(limit, 1 << 32)  # offsets the view does not show yet
        return held

    def take(self, colkeys: list[bytes], wanted: np.ndarray, limit: int, cache: ChunkCache) -> list[tuple]:
        at = wanted.astype(np.int64)
        return [columns.Chunk(c).part(at) for c in self._columns(colkeys, limit)]

    def row(self, off: int) -> bytes | None:
        return self.builder.row(off) if off < self.builder.n_rows else None

    def _columns(self, colkeys: list[bytes], n: int) -> list[pa.Array]:
        """The columns of the first ``n`` rows (deleted ones too)."""
        got = [self.builder.column(ck, n) for ck in colkeys]
        return [columns.dense(keys.tag_of(ck), offs, vals, n) if len(offs) else columns.nulls(keys.tag_of(ck), n)
                for ck, (offs, vals) in zip(colkeys, got)]


def tail_fid(path: str | None) -> int:
    """The file id in a mutable segment's file name (``<base>-<fid>.rtt``), 0 without one."""
    if not path:
        return 0
    return int(os.path.basename(path).rsplit(".", 1)[0].split("-")[1], 16)


@dataclass(frozen=True, slots=True)
class View:
    """A segment as one reader state sees it: ``limit`` rows visible, ``deleted`` offsets."""

    seg: Segment | MemSegment
    limit: int
    deleted: FrozenBitMap

    @property
    def base(self) -> int:
        return self.seg.base

    @property
    def sealed(self) -> bool:
        return self.seg.sealed

    def n_live(self) -> int:
        return self.seg.live_count(self.limit) - len(self.deleted)


@dataclass(frozen=True, slots=True)
class ShardState:
    """An immutable, consistent picture of a shard: what one read sees."""

    views: tuple[View, ...]
    next_row_id: int
    live_rows: int = field(init=False)  # its count: every query's planner asks

    def __post_init__(self) -> None:
        object.__setattr__(self, "live_rows", sum(v.n_live() for v in self.views))

    def count(self) -> int:
        return self.live_rows


@dataclass
class ShardConfig:
    seal_rows: int = 25_000
    seal_bytes: int = 96 << 20
    merge_factor: int = 4
    max_merge_rows: int = 8_000_000
    max_depth: int = 64
    block_bytes: int = 16 << 10
    max_pending_seals: int = 2
    # how long the files and rows a merge dropped are kept for readers in other processes
    # that may still be reading them (a query that runs longer can fail, never see wrong rows)
    reader_grace_seconds: float = 30.0


class OverBudget(Exception):
    """A budgeted range lookup read more terms than it was allowed (see Shard.term_range)."""


def spend(budget: list[int] | None, n: int) -> None:
    if budget is not None:
        budget[0] -= n
        if budget[0] < 0:
            raise OverBudget()


def keep_mask(live: FrozenBitMap, deleted: FrozenBitMap) -> pa.Array:
    """A boolean mask over ``live`` (in offset order): true for offsets not in ``deleted``."""
    live_arr = np.frombuffer(live.to_array(), dtype=np.uint32)
    del_arr = np.frombuffer(deleted.to_array(), dtype=np.uint32)
    return pa.array(np.isin(live_arr, del_arr, invert=True, assume_unique=True))
