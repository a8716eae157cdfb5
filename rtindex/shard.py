"""One shard: a RocksDB instance holding the converged index of a slice of a collection.

Write path (docs/architecture.md has the whole story):
1. each document of a batch is indexed into the in-memory mutable segment (it gets the next
   row id, ``base + offset``); a document the indexer rejects is reported, nothing is written;
2. the rows, the ``_id`` -> row id entries, delete records for replaced rows and the next
   row id go to RocksDB in one WAL-backed WriteBatch;
3. a new immutable :class:`ShardState` is published: readers that start now see the batch.

The mutable segment is rotated out when it is big enough and sealed into RocksDB by a
background thread; sealed segments are merged in the background too. Readers never lock:
they take the current ShardState, whose segments stay on disk until no state refers to them.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import ContextManager, Iterator

import numpy as np
import orjson
import pyarrow as pa
from pyroaring import BitMap, FrozenBitMap

from rtindex import columns, keys
from rtindex._impl import SegmentBuilder, block_get, block_range, merge_blocks
from rtindex.background import Worker
from rtindex.errors import CorruptionError, SchemaError, StorageError
from rtindex.keys import from_u64, u64
from rtindex.rowcache import RowStoreCache, copy_json
from rtindex.storage import Store

META_NEXT_ROW = b"N"
META_SEGMENT = b"S"  # + segid: orjson {"base", "n", "columns"}
META_LIVE = b"L"  # + segid: serialized BitMap of the offsets the segment holds
META_DELETED = b"D"  # + row id: that row was replaced or deleted

EMPTY = FrozenBitMap()
RANGE_READ_BLOCKS = 16  # postings blocks per multi-get in a range lookup (the budget is checked between)


class Segment:
    """A sealed segment on disk. Immutable; weak-referenceable so its files can be dropped
    once the last reader state that refers to it is gone."""

    __slots__ = ("segid", "base", "n", "live", "column_keys", "column_set", "term_memo", "block_keys",
                 "merged_into", "__weakref__")

    def __init__(self, segid: int, base: int, n: int, live: FrozenBitMap, column_keys: tuple[bytes, ...],
                 block_keys: list[bytes] | None = None):
        self.segid = segid
        self.base = base
        self.n = n
        self.live = live
        self.column_keys = column_keys
        self.column_set = frozenset(column_keys)
        self.term_memo: dict[bytes, bool] = {}  # column key -> has terms (see Shard.has_terms)
        # first term of each postings block, sorted: a lookup bisects it and reads one block
        # with a point get (no iterator); None until known (loaded lazily after a reopen)
        self.block_keys = block_keys
        # the segment a merge turned this one into: a reader still holding this one keeps the
        # successor (whose clean-up could drop rows this reader sees) alive too
        self.merged_into: Segment | None = None


class MemSegment:
    """The in-memory segment: mutable while active, read-only once rotated out for sealing."""

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

    def count(self) -> int:
        return sum(v.n_live() for v in self.views)


@dataclass
class ShardConfig:
    seal_rows: int = 25_000
    seal_bytes: int = 96 << 20
    merge_factor: int = 4
    max_merge_rows: int = 8_000_000
    max_depth: int = 64
    block_bytes: int = 16 << 10
    max_pending_seals: int = 2


class Shard:
    def __init__(self, path: str, index: int, config: ShardConfig, sealer: Worker, merger: Worker,
                 row_cache: RowStoreCache, sync: bool = False, block_cache=None, write_buffers=None):
        self.index = index
        self._rows = row_cache
        self._row_cache_id = row_cache.new_shard_id()
        self.config = config
        self.store = Store(path, sync=sync, block_cache=block_cache, write_buffers=write_buffers)
        self._sealer = sealer
        self._merger = merger
        self._write_lock = threading.RLock()  # one writer at a time; publishes states
        self._mem_lock = threading.Lock()  # guards the active builder against concurrent reads
        self._seal_done = threading.Condition(self._write_lock)
        self._merging = False
        self._bg_error: BaseException | None = None
        self._closed = False
        try:
            self._state = self._recover()
        except BaseException:
            self.store.close()
            raise

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> ShardState:
        """Load sealed segments and deletes; re-index rows that were only in memory."""
        st = self.store
        raw_next = st.get("meta", META_NEXT_ROW)
        next_row = from_u64(raw_next) if raw_next else 0
        segs: list[Segment] = []
        for k, v in st.scan("meta", META_SEGMENT, keys.prefix_upper_bound(META_SEGMENT)):
            segid = from_u64(k[1:])
            d = orjson.loads(v)
            live_raw = st.get("meta", META_LIVE + k[1:])
            if live_raw is None:
                raise CorruptionError(f"shard {self.index}: segment {segid} has no live set")
            live = FrozenBitMap.deserialize(live_raw)
            segs.append(Segment(segid, d["base"], d["n"], live, tuple(bytes.fromhex(c) for c in d["columns"])))
        segs.sort(key=lambda s: s.base)
        self._next_segid = max((s.segid for s in segs), default=0) + 1
        self._collect_orphans(segs)
        sealed_end = segs[-1].base + segs[-1].n if segs else 0

        deleted: dict[int, BitMap] = {}
        garbage = self.store.batch()
        bases = [s.base for s in segs]
        for k, _ in st.scan("meta", META_DELETED, keys.prefix_upper_bound(META_DELETED)):
            rid = from_u64(k[1:])
            if rid >= sealed_end:
                deleted.setdefault(sealed_end, BitMap()).add(rid - sealed_end)
                continue
            i = bisect.bisect_right(bases, rid) - 1
            off = rid - segs[i].base if i >= 0 else -1
            if i >= 0 and off in segs[i].live:
                deleted.setdefault(segs[i].base, BitMap()).add(off)
            else:  # dropped by a merge whose clean-up did not run: finish it
                garbage.delete("meta", k)
                garbage.delete("rows", u64(rid))
        if garbage.n:
            st.write(garbage)

        views = [View(s, s.n, FrozenBitMap(deleted.get(s.base, EMPTY))) for s in segs]
        builder = SegmentBuilder(self.config.max_depth)
        expect = sealed_end
        for k, v in st.scan("rows", u64(sealed_end)):
            rid = from_u64(k)
            if rid != expect or rid >= next_row:
                raise CorruptionError(f"shard {self.index}: row {rid} found where row {expect} was expected")
            builder.add(orjson.loads(v))
            expect += 1
        if expect != next_row:
            raise CorruptionError(f"shard {self.index}: rows end at {expect}, next row id is {next_row}")
        mem = MemSegment(builder, sealed_end)
        views.append(View(mem, builder.n_rows, FrozenBitMap(deleted.get(sealed_end, EMPTY))))
        state = ShardState(tuple(views), next_row)
        if builder.n_rows >= self.config.seal_rows or builder.nbytes >= self.config.seal_bytes:
            state = self._rotate(state)
        return state

    def _collect_orphans(self, segs: list[Segment]) -> None:
        """Delete postings/columns of segments no descriptor names (a crash mid-seal/merge)."""
        live_ids = {s.segid for s in segs}
        wb = self.store.batch()
        for cf in ("postings", "columns"):
            pos = b""
            while True:
                first = next(iter(self.store.scan(cf, pos)), None)
                if first is None:
                    break
                segid = from_u64(first[0][:8])
                nxt = u64(segid + 1)
                if segid not in live_ids:
                    wb.delete_range(cf, u64(segid), nxt)
                self._next_segid = max(self._next_segid, segid + 1)
                pos = nxt
        for k, _ in self.store.scan("meta", META_LIVE, keys.prefix_upper_bound(META_LIVE)):
            if from_u64(k[1:]) not in live_ids:
                wb.delete("meta", k)
        if wb.n:
            self.store.write(wb)

    # ------------------------------------------------------------------ reads
    @property
    def state(self) -> ShardState:
        return self._state

    @property
    def write_lock(self) -> threading.RLock:
        """Held by every write; hold it to make a read-modify-write (patch) atomic."""
        return self._write_lock

    def get(self, id_key: bytes) -> dict | None:
        state = self._state
        rid_key = self.store.get("ids", id_key)
        if rid_key is None or from_u64(rid_key) >= state.next_row_id:
            return None
        doc = self.fetch(np.array([from_u64(rid_key)], dtype=np.uint64))[0]
        return copy_json(doc) if doc is not None else None

    def _reading(self, view: View) -> ContextManager:
        """Guard for reading ``view``'s builder: the active one is locked against ``add()``;
        a rotated one never changes again and needs no lock."""
        return self._mem_lock if view.seg is self._state.views[-1].seg else nullcontext()

    def _block_keys(self, seg: Segment) -> list[bytes]:
        if seg.block_keys is None:  # a benign race: two readers may both load it
            prefix = u64(seg.segid)
            seg.block_keys = [k[8:] for k in self.store.scan_keys("postings", prefix, u64(seg.segid + 1))]
        return seg.block_keys

    def term(self, view: View, term: bytes) -> BitMap:
        """Offsets of ``view``'s visible rows holding ``term``."""
        if isinstance(view.seg, Segment):
            firsts = self._block_keys(view.seg)
            i = bisect.bisect_right(firsts, term) - 1
            block = self.store.get("postings", u64(view.seg.segid) + firsts[i]) if i >= 0 else None
            bm = block_get(block, term) if block is not None else None
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
        :class:`OverBudget` is raised once it goes below zero, so a planner can give up on a
        range that covers too many terms before paying for all of them.
        """
        out = BitMap()
        if isinstance(view.seg, Segment):
            prefix = u64(view.seg.segid)
            firsts = self._block_keys(view.seg)
            start = max(bisect.bisect_right(firsts, lo) - 1, 0)
            end = bisect.bisect_left(firsts, hi)
            for i in range(start, end, RANGE_READ_BLOCKS):
                chunk = [prefix + k for k in firsts[i:min(end, i + RANGE_READ_BLOCKS)]]
                for block in self.store.multi_get("postings", chunk):
                    if block is None:
                        raise CorruptionError(f"shard {self.index}: postings block missing in segment {view.seg.segid}")
                    hits = block_range(block, lo, hi)
                    _spend(budget, len(hits))
                    for _, bm in hits:
                        out |= bm
        else:
            b = view.seg.builder
            with self._reading(view):
                terms = [t for t in b.column_terms(keys.column_key_of(lo)) if lo <= t < hi]
                _spend(budget, len(terms))
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

    def fetch(self, row_ids: np.ndarray) -> list[dict | None]:
        """Decoded rows (``row_ids`` a uint64 array) through the database's RowStoreCache:
        shared objects, read-only."""
        return self._rows.rows(self._row_cache_id, row_ids, self._read_rows)

    def _read_rows(self, row_ids: list[int]) -> list[bytes | None]:
        return self.store.multi_get("rows", [u64(r) for r in row_ids])

    def column_tags(self, view: View, path_key: bytes) -> set[int]:
        """Type tags with a column-store value for the encoded path in ``view`` (array
        elements and object markers are indexed terms, not columns)."""
        if isinstance(view.seg, Segment):
            return {ck[-1] for ck in view.seg.column_keys if ck[:-1] == path_key}
        b = view.seg.builder
        with self._reading(view):
            return {tag for tag in columns.ARROW_TYPES if b.column_size(path_key + bytes((tag,)), view.limit)}

    def scan_view(self, view: View, colkeys: list[bytes]) -> tuple[pa.Array, list[pa.Array]]:
        """(offsets, one array per column key) of the visible rows of ``view``."""
        if isinstance(view.seg, Segment):
            live = view.seg.live
            present = set(view.seg.column_keys)
            raws = self.store.multi_get("columns", [u64(view.seg.segid) + ck for ck in colkeys])
            cols = []
            for ck, raw in zip(colkeys, raws):
                if ck in present and raw is None:
                    raise CorruptionError(f"shard {self.index}: column chunk missing in segment {view.seg.segid}")
                cols.append(columns.decode(raw) if raw is not None else columns.nulls(ck[-1], len(live)))
            offsets = pa.array(live.to_array(), type=pa.uint32())
            if view.deleted:
                keep = keep_mask(live, view.deleted)
                offsets = offsets.filter(keep)
                cols = [c.filter(keep) for c in cols]
            return offsets, cols
        n = view.limit
        by_key = {}
        with self._reading(view):
            for ck in colkeys:
                offs, vals = view.seg.builder.column(ck, n)
                if len(offs):
                    by_key[ck] = (offs, vals)
        cols = [columns.dense(ck[-1], *by_key[ck], n) if ck in by_key else columns.nulls(ck[-1], n) for ck in colkeys]
        offsets = pa.array(np.arange(n, dtype=np.uint32))
        if view.deleted:
            keep = keep_mask(FrozenBitMap(range(n)), view.deleted)
            offsets = offsets.filter(keep)
            cols = [c.filter(keep) for c in cols]
        return offsets, cols

    # ------------------------------------------------------------------ writes
    def _check_writable(self) -> None:
        if self._bg_error is not None:
            raise StorageError(f"shard {self.index}: background work failed: {self._bg_error!r}; reopen the database") \
                from self._bg_error

    def put_many(self, items: list[tuple[int, bytes, dict, bytes]]) -> list[tuple[int, SchemaError]]:
        """Upsert ``(caller index, id key, document, document bytes)`` items atomically.

        Returns the per-item indexing errors; every other item is durable when this returns.
        """
        errors: list[tuple[int, SchemaError]] = []
        with self._write_lock:
            self._check_writable()
            state = self._state
            mem_view = state.views[-1]
            builder = mem_view.seg.builder
            base = mem_view.seg.base
            old = self.store.multi_get("ids", [it[1] for it in items])
            wb = self.store.batch()
            seen: dict[bytes, int] = {}
            dels: list[int] = []
            next_row = state.next_row_id
            offsets = self._index_docs(builder, items, errors)
            put = wb.put
            for (idx, id_key, doc, raw), prev_raw, off in zip(items, old, offsets):
                if off < 0:
                    continue
                rid = base + off
                if rid != next_row:
                    raise CorruptionError(f"shard {self.index}: row id {rid} assigned, {next_row} expected")
                next_row += 1
                prev = seen.get(id_key)
                if prev is None and prev_raw is not None:
                    prev = from_u64(prev_raw)
                if prev is not None:
                    dels.append(prev)
                    put("meta", META_DELETED + u64(prev), b"")
                seen[id_key] = rid
                rid_key = u64(rid)
                put("rows", rid_key, raw)
                put("ids", id_key, rid_key)
            if next_row == state.next_row_id:
                return errors
            wb.put("meta", META_NEXT_ROW, u64(next_row))
            self.store.write(wb)
            self._publish(state, next_row, dels)
        return errors

    def _index_docs(self, builder, items, errors) -> list[int]:
        """Index each item's document into the active builder: its offset, or -1 if rejected.

        The lock that keeps readers off the builder is taken per small chunk, so a reader waits
        for at most a few documents, and ingest does not pay a lock round trip per document.
        """
        offsets = []
        add = builder.add
        for start in range(0, len(items), 32):
            with self._mem_lock:
                for idx, _, doc, _ in items[start : start + 32]:
                    try:
                        offsets.append(add(doc))
                    except SchemaError as e:
                        errors.append((idx, e))
                        offsets.append(-1)
        return offsets

    def delete_many(self, id_keys: list[bytes]) -> list[bool]:
        """Delete documents by id key; returns whether each existed."""
        with self._write_lock:
            self._check_writable()
            state = self._state
            old = self.store.multi_get("ids", id_keys)
            wb = self.store.batch()
            dels, found, gone = [], [], set()
            for id_key, prev_raw in zip(id_keys, old):
                if prev_raw is None or id_key in gone:
                    found.append(False)
                    continue
                gone.add(id_key)
                prev = from_u64(prev_raw)
                dels.append(prev)
                found.append(True)
                wb.put("meta", META_DELETED + u64(prev), b"")
                wb.delete("ids", id_key)
            if dels:
                self.store.write(wb)
                self._publish(state, state.next_row_id, dels)
            return found

    def _publish(self, state: ShardState, next_row: int, dels: list[int]) -> None:
        """Make a written batch visible (caller holds the write lock)."""
        views = list(state.views)
        if dels:
            by_view: dict[int, list[int]] = {}
            bases = [v.base for v in views]
            for rid in dels:
                i = bisect.bisect_right(bases, rid) - 1
                by_view.setdefault(i, []).append(rid - bases[i])
            for i, offs in by_view.items():
                views[i] = replace(views[i], deleted=FrozenBitMap(BitMap(views[i].deleted) | BitMap(offs)))
        mem = views[-1]
        views[-1] = replace(mem, limit=next_row - mem.base)
        new = ShardState(tuple(views), next_row)
        b = mem.seg.builder
        if b.n_rows >= self.config.seal_rows or b.nbytes >= self.config.seal_bytes:
            new = self._rotate(new)
        self._state = new

    # ------------------------------------------------------------------ sealing
    def _new_segid(self) -> int:
        with self._write_lock:
            segid = self._next_segid
            self._next_segid += 1
            return segid

    def _rotate(self, state: ShardState) -> ShardState:
        """Start a new mutable segment; hand the full one to the sealer (caller holds the lock)."""
        pending = sum(1 for v in state.views if not v.sealed) - 1
        if pending >= self.config.max_pending_seals:
            # bounded memory: wait for the sealer rather than pile up segments
            self._state = state
            self._seal_done.wait_for(lambda: self._bg_error is not None or
                                     sum(1 for v in self._state.views if not v.sealed) - 1 < self.config.max_pending_seals)
            self._check_writable()
            state = self._state
        full = state.views[-1]
        fresh = View(MemSegment(SegmentBuilder(self.config.max_depth), state.next_row_id), 0, EMPTY)
        self._sealer.submit(lambda: self._seal(full.seg))
        return ShardState(state.views + (fresh,), state.next_row_id)

    def seal_now(self) -> None:
        """Rotate the mutable segment out (if it has rows) so that it gets sealed."""
        with self._write_lock:
            self._check_writable()
            if self._state.views[-1].limit:
                self._state = self._rotate(self._state)

    def _seal(self, mem: MemSegment) -> None:
        try:
            self._seal_inner(mem)
        except BaseException as e:
            self._fail(e)
            raise

    def _seal_inner(self, mem: MemSegment) -> None:
        if self._closed:
            return
        b = mem.builder
        n = b.n_rows
        segid = self._new_segid()
        prefix = u64(segid)
        # postings sorted and encoded in C with the GIL released; both column families go
        # in as SST files (no WAL or memtable); the descriptor below makes them count
        firsts: list[bytes] = []
        self.store.ingest_sorted("postings", _recording(firsts, prefix, b.write_blocks(self.config.block_bytes)))
        colkeys = []

        def column_chunks():
            for ck, offs, vals in b.columns():
                colkeys.append(ck)
                yield prefix + ck, columns.encode(columns.dense(ck[-1], offs, vals, n))

        self.store.ingest_sorted("columns", column_chunks())
        seg = Segment(segid, mem.base, n, FrozenBitMap(range(n)), tuple(colkeys), firsts)
        wb = self.store.batch()
        self._put_descriptor(wb, seg)
        self.store.write(wb)
        mem.sealed_as = seg
        with self._write_lock:
            views = list(self._state.views)
            i = next(i for i, v in enumerate(views) if v.seg is mem)
            views[i] = View(seg, n, views[i].deleted)
            self._state = ShardState(tuple(views), self._state.next_row_id)
            self._seal_done.notify_all()
        self._maybe_merge()

    @staticmethod
    def _put_descriptor(wb, seg: Segment) -> None:
        """The records that make a written segment exist (read back by ``_recover``)."""
        prefix = u64(seg.segid)
        wb.put("meta", META_LIVE + prefix, seg.live.serialize())
        wb.put("meta", META_SEGMENT + prefix,
               orjson.dumps({"base": seg.base, "n": seg.n, "columns": [c.hex() for c in seg.column_keys]}))

    def _fail(self, e: BaseException) -> None:
        """Record a background failure: the next write raises it; waiting writers wake up."""
        with self._write_lock:
            self._bg_error = e
            self._seal_done.notify_all()

    # ------------------------------------------------------------------ merging
    def _maybe_merge(self) -> None:
        with self._write_lock:
            if self._merging or self._closed:
                return
            run = self._pick_merge(self._state)
            if run is None:
                return
            self._merging = True
        self._merger.submit(lambda: self._merge(run))

    def _pick_merge(self, state: ShardState) -> list[View] | None:
        """Log-structured policy: ``merge_factor`` adjacent sealed segments of one size tier,
        or one segment that is mostly deleted rows."""
        sealed = [v for v in state.views if v.sealed]
        f = self.config.merge_factor

        def tier(v: View) -> int:
            n, t = max(v.n_live(), 1), 0
            while n >= self.config.seal_rows * (f ** (t + 1)) // 2:
                t += 1
            return t

        for i in range(len(sealed) - f + 1):
            run = sealed[i : i + f]
            if len({tier(v) for v in run}) == 1 and sum(v.seg.n for v in run) <= self.config.max_merge_rows:
                return run
        for v in sealed:
            if len(v.deleted) > 0.3 * max(len(v.seg.live), 1):
                return [v]
        return None

    def _merge(self, run: list[View]) -> None:
        try:
            self._merge_inner(run)
        except BaseException as e:
            with self._write_lock:
                self._merging = False
            self._fail(e)
            raise
        with self._write_lock:
            self._merging = False
        self._maybe_merge()

    def _merge_inner(self, run: list[View]) -> None:
        if self._closed:
            return
        base = run[0].base
        last = run[-1]
        n = last.base + last.seg.n - base
        segid = self._new_segid()
        prefix = u64(segid)
        # postings streamed from the inputs' blocks into an SST file (the segment exists only
        # once its descriptor is written, so a crash in between leaves orphans open() removes)
        inputs = [(self._blocks(v.seg.segid), v.base - base, BitMap(v.deleted)) for v in run]
        firsts: list[bytes] = []
        self.store.ingest_sorted("postings", _recording(firsts, prefix, merge_blocks(inputs, self.config.block_bytes)))
        live = BitMap()
        keeps = []
        for v in run:
            kept = BitMap(v.seg.live) - BitMap(v.deleted)
            live |= kept.shift(v.base - base) if v.base != base else kept
            keeps.append(keep_mask(v.seg.live, v.deleted) if v.deleted else None)
        colkeys = sorted(set().union(*(v.seg.column_keys for v in run)))

        def column_chunks():
            for ck in colkeys:
                parts = []
                for v, keep in zip(run, keeps):
                    raw = self.store.get("columns", u64(v.seg.segid) + ck) if ck in v.seg.column_keys else None
                    arr = columns.decode(raw) if raw is not None else columns.nulls(ck[-1], len(v.seg.live))
                    parts.append(arr.filter(keep) if keep is not None else arr)
                yield prefix + ck, columns.encode(pa.concat_arrays(parts))

        self.store.ingest_sorted("columns", column_chunks())
        seg = Segment(segid, base, n, FrozenBitMap(live), tuple(colkeys), firsts)
        wb = self.store.batch()
        self._put_descriptor(wb, seg)
        for v in run:
            wb.delete("meta", META_SEGMENT + u64(v.seg.segid))
        self.store.write(wb)
        with self._write_lock:
            views = list(self._state.views)
            i = next(i for i, v in enumerate(views) if v.seg is run[0].seg)
            assert [v.seg for v in views[i : i + len(run)]] == [v.seg for v in run]
            # deletes that arrived while merging carry over to the new segment
            late = BitMap()
            for cur, old in zip(views[i : i + len(run)], run):
                extra = BitMap(cur.deleted) - BitMap(old.deleted)
                if extra:
                    late |= BitMap((o + cur.base - base) for o in extra)
            views[i : i + len(run)] = [View(seg, n, FrozenBitMap(late))]
            self._state = ShardState(tuple(views), self._state.next_row_id)
            for v in run:
                v.seg.merged_into = seg
        for v in run:  # drop the old segments' data once no reader state can reach them
            dropped = [v.base + o for o in v.deleted]
            weakref.finalize(v.seg, self._merger.submit, _Garbage(self, v.seg.segid, dropped))

    def _blocks(self, segid: int) -> Iterator[bytes]:
        prefix = u64(segid)
        for _, block in self.store.scan("postings", prefix, u64(segid + 1)):
            yield block

    # ------------------------------------------------------------------ lifecycle
    def wait_for_background(self) -> None:
        """Block until the sealer and merger have nothing queued for this database."""
        while True:
            self._sealer.wait_idle()
            self._merger.wait_idle()
            with self._write_lock:
                busy = self._merging or any(not v.sealed for v in self._state.views[:-1])
            if self._bg_error is not None:
                self._check_writable()
            if not busy:
                return

    def close(self) -> None:
        with self._write_lock:
            self._closed = True
        self.store.close()


def _recording(firsts: list[bytes], prefix: bytes, blocks):
    """Pass (first term, block) pairs on as postings records, noting each first term."""
    for first, block in blocks:
        firsts.append(first)
        yield prefix + first, block


class OverBudget(Exception):
    """A budgeted range lookup read more terms than it was allowed (see Shard.term_range)."""


def _spend(budget: list[int] | None, n: int) -> None:
    if budget is not None:
        budget[0] -= n
        if budget[0] < 0:
            raise OverBudget()


class _Garbage:
    """Deletes a merged-away segment's postings, columns, live set, rows and delete records
    (and the rows' RowStoreCache entries)."""

    def __init__(self, shard: Shard, segid: int, dropped_rows: list[int]):
        self.shard = weakref.ref(shard)
        self.segid = segid
        self.dropped = dropped_rows

    def __call__(self) -> None:
        shard = self.shard()
        if shard is None or shard._closed:
            return  # open() finishes the clean-up
        st = shard.store
        wb = st.batch()
        for cf in ("postings", "columns"):
            wb.delete_range(cf, u64(self.segid), u64(self.segid + 1))
        wb.delete("meta", META_LIVE + u64(self.segid))
        for rid in self.dropped:
            wb.delete("rows", u64(rid))
            wb.delete("meta", META_DELETED + u64(rid))
        try:
            st.write(wb)
        except Exception:
            if not shard._closed:
                raise
        shard._rows.forget(shard._row_cache_id, self.dropped)  # no reader can ask for them again


def keep_mask(live: FrozenBitMap, deleted: FrozenBitMap) -> pa.Array:
    """A boolean mask over ``live`` (in offset order): true for offsets not in ``deleted``."""
    live_arr = np.frombuffer(live.to_array(), dtype=np.uint32)
    del_arr = np.frombuffer(deleted.to_array(), dtype=np.uint32)
    return pa.array(np.isin(live_arr, del_arr, invert=True, assume_unique=True))
