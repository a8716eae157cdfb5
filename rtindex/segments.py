"""The segment model of a shard: what a reader state is made of.

A shard's rows are split into segments by row id: sealed segments (immutable files, see
rtindex/segfile.py) followed by in-memory segments (a SegmentBuilder: the newest rows, or
rows handed to the sealer and not yet written). A :class:`ShardState` is an immutable
picture of them: which segments, how many rows of each are visible, which offsets are
deleted. Writers publish a new state per batch; readers take the current one and never lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyroaring import FrozenBitMap

from rtindex import columns, segfile
from rtindex.chunkcache import ChunkCache
from rtindex.errors import CorruptionError
from rtindex.segfile import SegmentFile

EMPTY = FrozenBitMap()


class Segment:
    """A sealed segment: a mapped file. Immutable; weak-referenceable so that its clean-up
    runs once the last reader state that refers to it is gone."""

    __slots__ = ("segid", "base", "n", "live", "file", "column_keys", "column_set", "block_keys", "terms", "term_memo",
                 "tags_memo", "merged_into", "_live_offsets", "live_dense", "__weakref__")

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
        self.term_memo: dict[bytes, bool] = {}  # column key -> has terms (see Shard.has_terms)
        self.tags_memo: dict[bytes, frozenset[int]] = {}  # path key -> its column type tags (Shard.column_tags)
        # the segment a merge turned this one into: a reader still holding this one keeps the
        # successor (whose clean-up could drop rows this reader sees) alive too
        self.merged_into: Segment | None = None
        self._live_offsets: pa.Array | None = None

    def column(self, column_key: bytes, cache: ChunkCache) -> columns.Chunk | None:
        """The column chunk of ``column_key`` (one value per live offset), or None; decoded
        once while ``cache`` keeps it (every scan and every add-fields read of the segment
        needs it, and a compressed chunk costs ~1 ms per MB to decode)."""
        if column_key not in self.column_set:
            return None
        key = (self.file.path, column_key)
        chunk = cache.get(key)
        if chunk is None:
            arr = self.file.column(column_key)
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
    """An in-memory segment: mutable while active, read-only once rotated out for sealing.

    Scans read its columns with ``builder.column`` each time, with no cache of Arrow arrays
    here: the builder keeps its values in Arrow's layout already, so a scan's cost is a copy
    (a memcpy of the visible prefix), not a conversion from Python objects.
    """

    __slots__ = ("builder", "base", "sealed_as", "__weakref__")

    def __init__(self, builder, base: int):
        self.builder = builder
        self.base = base
        # the Segment it became: a reader still holding this MemSegment keeps that Segment
        # (and so its rows) alive until the reader is done, even after a merge retires it
        self.sealed_as: Segment | None = None


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
        return isinstance(self.seg, Segment)

    def n_live(self) -> int:
        if isinstance(self.seg, Segment):
            return len(self.seg.live) - len(self.deleted)
        return self.limit - len(self.deleted)


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
