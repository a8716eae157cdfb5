"""A shard's background work: sealing in-memory segments, merging sealed ones, and the
clean-up ("garbage") of what a merge dropped.

A shard left idle (not written for ``IDLE_SECONDS``) is tidied up: its mutable segment
sealed and RocksDB's dead space given back, so that disk is bounded by the working set
however small it is next to ``seal_rows`` (docs/architecture.md, "What bounds disk").

None of it is on the write path, and none of it may wedge a shard: work that fails (a full
disk, an I/O error) leaves no trace (a half-written segment file is removed; the segment
exists only once its descriptor is written, last) and is tried again with backoff, while
the data stays readable from where it was. ``flush()`` reports such a failure; writes go
on until the unsealed rows reach ``max_pending_seals`` segments, and then fail (before
storing anything) rather than grow memory without bound.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable, Iterator, Protocol

import orjson
from pyroaring import BitMap, FrozenBitMap

from rtindex import columns, keys, segfile
from rtindex._impl import merge_blocks
from rtindex.background import Worker
from rtindex.errors import ClosedError, StorageError
from rtindex.keys import u64
from rtindex.memtrim import release_free_memory
from rtindex.segments import MemSegment, Segment, ShardConfig, ShardState, View, keep_mask

if TYPE_CHECKING:
    from rtindex.rowcache import RowStoreCache
    from rtindex.storage import Store

log = logging.getLogger("rtindex")

RETRY_FIRST = 0.05  # seconds before the first retry of failed background work
RETRY_MAX = 5.0
COMPACT_MOVED_SEALS = 4  # seals whose rows left the row store before its range is compacted
IDLE_SECONDS = 5.0  # a shard not written for this long is idle: sealed and tidied up
TIDY_GROWTH = 1.25  # at idle, a column family is compacted once its SST files grew this much since
TIDY_MIN_BYTES = 64 << 10  # ... its last compaction there, and by more than this


class _ShardWriter(Protocol):
    """What a shard's maintenance needs of the shard (rtindex.writer.ShardWriter)."""

    path: str
    index: int
    config: ShardConfig
    segments_dir: str
    store: Store
    row_store_end: int  # rows below it may be in the row store (written there by an older version)
    _rows: RowStoreCache
    _row_cache_id: int
    _log_seq: int  # the change log's newest record

    @property
    def write_lock(self) -> threading.RLock: ...

    @property
    def state(self) -> ShardState: ...

    @property
    def closed(self) -> bool: ...

    def _pending_seals(self, state: ShardState) -> int: ...

    def new_segid(self) -> int: ...

    def next_generation(self) -> int: ...

    def seal_now(self) -> None: ...

    def replace_views(self, old: list, build: Callable[[list[View]], View]) -> None: ...

    def signal(self) -> None: ...

    def row_store_rows(self, row_ids: list[int]) -> Iterator[bytes]: ...


class Maintenance:
    """Seals, merges and clean-ups of one shard, run on the database's worker threads."""

    def __init__(self, shard: _ShardWriter, sealer: Worker, merger: Worker):
        self.shard = shard
        self._sealer = sealer
        self._merger = merger
        self._merging = False
        self._error: BaseException | None = None  # the last failure, until work succeeds again
        self._failures = 0  # failures since the last success (for the backoff)
        self._attempts = 0  # attempts of background work begun so far
        self._failed_attempt = 0  # the number of the latest attempt that failed
        self._retry_now_upto = 0  # failed attempts up to this one are retried at once (someone waits)
        self._cv = threading.Condition(shard.write_lock)
        self._compacted_to = 0  # row ids below it: the row store's range of moved rows was compacted
        self._moved_to = 0  # row ids below it left the row store for segment files
        self._compacting = False
        self._idle_due = False  # an idle check is queued on the merger thread
        self._written_at = time.monotonic()  # the last write of documents (or the open)
        self._tidied_at: float | None = None  # the store's last write as of the last tidy-up
        self._sst_after: dict[str, int] = {}  # column family -> its SST bytes after its last compaction at idle
        self._log_trimmed = 0  # change log records before this one were dropped at idle

    # ------------------------------------------------------------------ failures
    def _begin(self) -> int:
        """Number an attempt, so a wait counts only failures of attempts begun after it."""
        with self._cv:
            self._attempts += 1
            return self._attempts

    def _retry(self, what: str, e: BaseException, again: Callable[[], None], worker: Worker,
               attempt: int) -> None:
        """Record the failure of ``attempt`` and schedule ``again`` with exponential backoff."""
        with self._cv:
            self._error = e
            self._failures += 1
            self._failed_attempt = max(self._failed_attempt, attempt)
            delay = min(RETRY_FIRST * 2 ** (self._failures - 1), RETRY_MAX)
            if attempt <= self._retry_now_upto:
                delay = 0.0
            self._cv.notify_all()
        log.warning("rtindex shard %s: %s failed (retrying in %.2f s): %s", self.shard.path, what, delay, e)
        worker.submit(again, delay, retry=True)

    def _succeeded(self) -> None:
        with self._cv:
            self._error = None
            self._failures = 0
            self._cv.notify_all()

    def error(self) -> StorageError:
        e = self._error
        return StorageError(f"shard {self.shard.index} of {self.shard.path}: background work failed "
                            f"(retried automatically; writes resume once the cause is gone): {e}")

    # ------------------------------------------------------------------ waiting
    def wait_for_seal_slot(self) -> None:
        """Wait (caller holds the write lock) until fewer than ``max_pending_seals`` rotated
        segments wait for the sealer. A failed seal waiting for its retry is tried again at
        once; StorageError if it fails again."""
        limit = self.shard.config.max_pending_seals
        if self.shard._pending_seals(self.shard.state) < limit:
            return
        begun = self._retry_now_upto = self._attempts
        self._sealer.hurry()
        self._cv.wait_for(lambda: self._failed_attempt > begun
                          or self.shard._pending_seals(self.shard.state) < limit)
        if self.shard._pending_seals(self.shard.state) >= limit:
            raise self.error() from self._error

    def wait_idle(self) -> None:
        """Until no seal or merge of this shard is under way, and the row store's space of
        the rows sealed so far is back. Failed work waiting for its retry is tried again at
        once; StorageError if an attempt begun while waiting fails."""
        with self._cv:
            begun = self._retry_now_upto = self._attempts
        self._sealer.hurry()
        self._merger.hurry()
        compacted = False
        while True:
            self._sealer.wait_idle()
            self._merger.wait_idle()
            with self._cv:
                if self._failed_attempt > begun:
                    raise self.error() from self._error
                busy = self._merging or self._compacting or self.shard._pending_seals(self.shard.state) > 0
                if not busy and (compacted or self._moved_to <= self._compacted_to):
                    return
                if busy:
                    self._cv.wait(0.01)
                    continue
            compacted = True  # (asked once: a compaction that fails leaves the space to RocksDB)
            self._moved_out(0, now=True)

    # ------------------------------------------------------------------ sealing
    def seal_later(self) -> None:
        """Seal the oldest rotated segment on the sealer thread (one call per rotation)."""
        self._sealer.submit(self._seal_next)

    def _seal_next(self) -> None:
        """Seal the oldest rotated in-memory segment. Always the oldest: segments must cover
        row ids without holes, so one whose seal failed (and waits for its retry) is sealed
        before any later one."""
        if self.shard.closed:
            return
        with self._cv:
            pending = [v.seg for v in self.shard.state.views[:-1] if not v.sealed]
        if not pending:
            return
        attempt = self._begin()
        try:
            self._seal_inner(pending.pop(0))
        except Exception as e:
            if self.shard.closed:
                return
            self._retry("sealing a segment", e, self._seal_next, self._sealer, attempt)
            return
        del pending  # the sealed builder goes with the last state that shows it (usually now)
        release_free_memory()
        self._succeeded()
        self.maybe_merge()

    def _seal_inner(self, mem: MemSegment) -> None:
        shard = self.shard
        b = mem.builder
        n = b.n_rows
        segid = shard.new_segid()

        def column_chunks():
            for ck, values in b.dense_columns():
                yield ck, columns.encode(values)

        # postings are sorted and encoded in C with the GIL released
        file = segfile.write_segment(shard.segments_dir, segid, mem.base, n, FrozenBitMap(range(n)),
                                     b.write_blocks(shard.config.block_bytes), column_chunks(),
                                     (b.row(i) for i in range(n)))
        seg = Segment(segid, file)
        moved = [(mem.base, mem.base + n)] if mem.base < shard.row_store_end else []
        self._commit(seg, [], moved, sealed_tail=mem.base)
        mem.sealed_as = seg
        shard.replace_views([mem], lambda cur: View(seg, n, cur[0].deleted))
        with self._cv:
            self._cv.notify_all()
        if moved:
            self._moved_out(mem.base + n)

    def _commit(self, seg: Segment, dropped: list[Segment], moved: list[tuple[int, int]],
                sealed_tail: int | None = None) -> None:
        """Write the descriptor that makes ``seg`` exist (and ``dropped`` not), with a new
        segment generation, drop the row store's copy of the row id ranges ``moved``
        (rows an older version wrote there: they are in ``seg``'s file now) and the ``T``
        record of the mutable segment sealed from row id ``sealed_tail``, in one write; on
        failure remove its file: it never existed."""
        wb = self.shard.store.batch()
        wb.put("meta", keys.meta_segment(seg.segid), orjson.dumps({"base": seg.base, "n": seg.n}))
        for old in dropped:
            wb.delete("meta", keys.meta_segment(old.segid))
        if sealed_tail is not None:
            wb.delete("meta", keys.meta_tail(sealed_tail))
        for lo, hi in moved:
            wb.delete_range("rows", u64(lo), u64(hi))
        wb.put("meta", keys.META_GENERATION, u64(self.shard.next_generation()))
        try:
            self.shard.store.write(wb)
        except BaseException:
            segfile.remove_segment(self.shard.segments_dir, seg.segid)
            raise

    def _moved_out(self, end: int, now: bool = False) -> None:
        """Rows below ``end`` left the row store (their segment file holds them): once
        ``COMPACT_MOVED_SEALS`` seals' worth did (or ``now``: :meth:`wait_idle`), compact
        that range on the merger thread, so its space comes back (RocksDB would reclaim it
        only when a compaction happens to take those files, which an idle collection may
        never run). Batched: a compaction also rewrites the newer rows in the files it
        takes, and doing so at every seal slowed ingest by a quarter (docs/benchmarks.md)."""
        with self._cv:
            self._moved_to = end = max(self._moved_to, end)
            if self._compacting or end <= self._compacted_to:
                return
            if not now and end - self._compacted_to < COMPACT_MOVED_SEALS * self.shard.config.seal_rows:
                return
            self._compacting = True
        self._merger.submit(lambda: self._compact_rows(end))

    def _compact_rows(self, end: int) -> None:
        try:
            self.shard.store.compact("rows", u64(self._compacted_to), u64(end))
            self._compacted_to = end
        except StorageError as e:  # (the space comes back at a later compaction)
            if not self.shard.closed:
                log.warning("rtindex shard %s: %s", self.shard.path, e)
        finally:
            with self._cv:
                self._compacting = False

    # ------------------------------------------------------------------ merging
    def maybe_merge(self) -> None:
        with self._cv:
            if self._merging or self.shard.closed:
                return
            run = self._pick_merge(self.shard.state)
            if run is None:
                return
            self._merging = True
        self._merger.submit(lambda: self._merge(run))

    def _pick_merge(self, state: ShardState) -> list[View] | None:
        """Log-structured policy: ``merge_factor`` adjacent sealed segments of one size tier,
        or one segment that is mostly deleted rows."""
        cfg = self.shard.config
        sealed = [v for v in state.views if v.sealed]
        f = cfg.merge_factor

        def tier(v: View) -> int:
            n, t = max(v.n_live(), 1), 0
            while n >= cfg.seal_rows * (f ** (t + 1)) // 2:
                t += 1
            return t

        for i in range(len(sealed) - f + 1):
            run = sealed[i : i + f]
            if len({tier(v) for v in run}) == 1 and sum(v.seg.n for v in run) <= cfg.max_merge_rows:
                return run
        for v in sealed:
            if len(v.deleted) > 0.3 * max(len(v.seg.live), 1):
                return [v]
        return None

    def _merge(self, run: list[View]) -> None:
        if self.shard.closed:
            return
        attempt = self._begin()
        try:
            self._merge_inner(run)
        except Exception as e:
            with self._cv:
                self._merging = False
            if not self.shard.closed:
                self._retry("merging segments", e, self.maybe_merge, self._merger, attempt)
            return
        with self._cv:
            self._merging = False
        release_free_memory()  # the inputs' decoded columns
        self._succeeded()
        self.maybe_merge()

    def _merge_inner(self, run: list[View]) -> None:
        shard = self.shard
        base = run[0].base
        last = run[-1]
        n = last.base + last.seg.n - base
        segid = shard.new_segid()
        inputs = [(v.seg.file.read_blocks(), v.base - base, BitMap(v.deleted)) for v in run]
        live = BitMap()
        keeps = []
        for v in run:
            kept = BitMap(v.seg.live) - BitMap(v.deleted)
            live |= kept.shift(v.base - base) if v.base != base else kept
            keeps.append(keep_mask(v.seg.live, v.deleted) if v.deleted else None)
        colkeys = sorted(set().union(*(v.seg.column_keys for v in run)))

        def parts(ck: bytes):
            for v, keep in zip(run, keeps):  # one input's column decoded at a time
                arr = v.seg.file.read_column(ck)
                if arr is None:
                    arr = columns.nulls(keys.tag_of(ck), len(v.seg.live))
                yield arr.filter(keep) if keep is not None else arr

        def column_chunks():
            for ck in colkeys:
                yield ck, columns.encode_parts(columns.arrow_type(keys.tag_of(ck)), parts(ck))

        def rows():
            for v in run:  # the kept rows of each input, in order
                held = v.seg.live
                kept = iter(held - BitMap(v.deleted)) if v.deleted else iter(held)
                if v.seg.file.has_rows:
                    want = next(kept, None)
                    for off, raw in zip(held, v.seg.file.read_rows()):
                        if off == want:
                            yield raw
                            want = next(kept, None)
                else:  # an older file: its rows are in the row store
                    yield from shard.row_store_rows([v.base + off for off in kept])

        # postings streamed from the inputs' blocks (the k-way merge drops deleted rows)
        file = segfile.write_segment(shard.segments_dir, segid, base, n, FrozenBitMap(live),
                                     merge_blocks(inputs, shard.config.block_bytes), column_chunks(), rows())
        seg = Segment(segid, file)
        self._commit(seg, [v.seg for v in run],
                     [(v.base, v.base + v.seg.n) for v in run if not v.seg.file.has_rows])

        def merged(cur: list[View]) -> View:
            # deletes that arrived while merging carry over to the new segment
            late = BitMap()
            for now, old in zip(cur, run):
                extra = BitMap(now.deleted) - BitMap(old.deleted)
                if extra:
                    late |= BitMap((o + now.base - base) for o in extra)
            return View(seg, n, FrozenBitMap(late))

        shard.replace_views([v.seg for v in run], merged)
        for v in run:
            v.seg.merged_into = seg
        for v in run:  # drop the old segments' data once no reader state can reach them
            dropped = [v.base + o for o in v.deleted]
            weakref.finalize(v.seg, self._merger.submit,
                             _Garbage(self, v.seg.segid, dropped, in_row_store=not v.seg.file.has_rows))

    # ------------------------------------------------------------------ idle
    def written(self) -> None:
        """Documents were written (or the shard opened): look at it once it has not been
        written for ``IDLE_SECONDS``. The caller holds the write lock (or nothing else runs
        yet), which guards what the idle check reads."""
        self._written_at = time.monotonic()
        if not self._idle_due:
            self._check_when_idle()

    def _check_when_idle(self) -> None:
        """Queue an idle check unless one is queued."""
        with self._cv:
            if self._idle_due:
                return
            self._idle_due = True
        self._merger.submit(self._when_idle, IDLE_SECONDS)

    def _when_idle(self) -> None:
        """Seal the mutable segment of an idle shard if it holds rows: with a working set
        small next to ``seal_rows`` it holds several versions of each document, each at
        several times a sealed row's size, and seals and merges are what drop replaced
        versions. Once nothing is under way, tidy up RocksDB. Looked at again later while
        the shard is written, busy, or was just sealed."""
        shard = self.shard
        with self._cv:
            if shard.closed:
                return
            quiet = time.monotonic() - self._written_at
            busy = self._merging or self._compacting or shard._pending_seals(shard.state) > 0
            if quiet >= IDLE_SECONDS and not busy and shard.state.views[-1].limit:
                try:
                    shard.seal_now()
                except StorageError as e:  # (a later write or open tries again)
                    self._idle_due = False
                    log.warning("rtindex shard %s: sealing the idle mutable segment failed: %s", shard.path, e)
                    return
                busy = True
            if quiet < IDLE_SECONDS or busy:
                self._merger.submit(self._when_idle, IDLE_SECONDS if busy else IDLE_SECONDS - quiet)
                return
            if shard.store.last_write == self._tidied_at:  # nothing stored since the last tidy-up
                self._idle_due = False
                return
            written, log_seq = self._written_at, shard._log_seq
        self._tidy_up(log_seq)
        with self._cv:
            if self._written_at != written and not shard.closed:  # written meanwhile: again later
                self._merger.submit(self._when_idle, IDLE_SECONDS)
            else:
                self._tidied_at = shard.store.last_write
                self._idle_due = False

    def _tidy_up(self, log_seq: int) -> None:
        """Give back what RocksDB holds for nothing. The change log records before the
        newest (``log_seq``) go: readers in other processes follow within milliseconds, so
        an idle shard's have read them (one that has not reloads its delete sets, as after
        a writer's own trim). The memtables are flushed, so that the WAL files go (the
        ``ids`` and ``meta`` column families fill a memtable slowly, and an unflushed one
        keeps every WAL file since its oldest entry). The ``ids`` and ``meta`` column families
        are compacted once their SST files grew by ``TIDY_GROWTH`` since their last
        compaction here (replaced ``_id`` entries and the tombstones of delete records sit
        in files that no compaction of an idle shard would take); growth-based, so that a
        trickle of writes does not rewrite a large column family at every pause."""
        store = self.shard.store
        try:
            if log_seq > self._log_trimmed:
                wb = store.batch()
                wb.delete_range("meta", keys.meta_log(0), keys.meta_log(log_seq))
                store.write(wb)
                self._log_trimmed = log_seq
            store.flush_memtables()
            for cf in ("ids", "meta"):  # (rows only an older version wrote: seals compact them as they move)
                size = store.sst_bytes(cf)
                if size > self._sst_after.get(cf, 0) * TIDY_GROWTH + TIDY_MIN_BYTES:
                    store.compact(cf)
                    self._sst_after[cf] = store.sst_bytes(cf)
        except (StorageError, ClosedError) as e:  # (the space comes back at a later tidy-up)
            if not self.shard.closed:
                log.warning("rtindex shard %s: tidying up storage failed: %s", self.shard.path, e)


class _Garbage:
    """The clean-up of a merged-away segment, once no state of this process can reach it.

    Its file is removed at once: a reader in another process that still reads it has it
    mapped, and a mapping outlives the unlink (rows included). The delete records of the
    rows the merge dropped (replaced or deleted ones), their RowStoreCache entries and the
    rows themselves where the row store still holds them (files written before rows moved
    into segment files) go after ``reader_grace_seconds``: a reader's older state may still
    fetch them. Tried again later if it fails.
    """

    def __init__(self, maintenance: Maintenance, segid: int, dropped_rows: list[int], in_row_store: bool):
        self.maintenance = weakref.ref(maintenance)
        self.segid = segid
        self.dropped = dropped_rows
        self.in_row_store = in_row_store
        self.file_removed = False

    def __call__(self) -> None:
        m = self.maintenance()
        if m is None or m.shard.closed:
            return  # open() finishes the clean-up
        shard = m.shard
        attempt = m._begin()
        try:
            if not self.file_removed:
                segfile.remove_segment(shard.segments_dir, self.segid)
                self.file_removed = True
                grace = shard.config.reader_grace_seconds
                if self.dropped and grace > 0:
                    m._merger.submit(self, grace)
                    return
            wb = shard.store.batch()
            for rid in self.dropped:
                if self.in_row_store:
                    wb.delete("rows", u64(rid))
                wb.delete("meta", keys.meta_deleted(rid))
            if wb.n:
                shard.store.write(wb)
                m._check_when_idle()  # (their tombstones go at the tidy-up)
        except Exception as e:
            if not shard.closed:
                m._retry(f"removing dropped segment {self.segid}", e, self, m._merger, attempt)
            return
        shard._rows.forget(shard._row_cache_id, self.dropped)  # no reader can ask for them again
        shard.signal()
