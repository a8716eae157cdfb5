"""One shard, followed from another process: a live read replica of the writer's shard.

The reader opens the shard's RocksDB as a secondary instance and, on each refresh:
1. catches up with the writer (RocksDB replays the writer's new WAL records and files);
2. reads the meta records as of that point: the next row id, the segment generation (the
   set of sealed segments changed: map the new segment files), the change log (which rows
   the writer's new batches deleted);
3. indexes the rows it has not seen yet into in-memory segments of its own: the writer seals
   only every ``seal_rows`` rows, and a document must be queryable in milliseconds, so the
   unsealed tail is indexed here (as the writer's recovery would), not waited for;
4. publishes a new ShardState, in which the rows below the writer's sealed end come from
   the segment files and its own in-memory rows above it (rows both hold are masked out of
   the in-memory copy until it is dropped).

Every state of a shard is a prefix of the writer's batches on it: the rows, the deletes and the
next row id of a batch are one RocksDB write, and one refresh sees all of it or none of it.
Refreshes are cheap when nothing changed: the writer bumps a counter in a shared-memory file
(rtindex/notify.py) after each write, and a reader catches up only the shards whose counter
moved (and every shard now and then, in case a signal was missed).
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
import time

import orjson
from pyroaring import BitMap, FrozenBitMap

from rtindex import keys
from rtindex._impl import SegmentBuilder
from rtindex.chunkcache import ChunkCache
from rtindex.errors import CorruptionError, StorageError
from rtindex.keys import from_u64
from rtindex.notify import Watch
from rtindex.rowcache import RowStoreCache
from rtindex.segments import EMPTY, MemSegment, Segment, ShardConfig, ShardState, View, open_segment
from rtindex.shard import SIGNAL_FILE, Shard
from rtindex.storage import Store


class ShardReader(Shard):
    def __init__(self, path: str, index: int, config: ShardConfig, row_cache: RowStoreCache,
                 column_cache: ChunkCache, *, secondary_path: str, block_cache=None):
        super().__init__(path, index, config, row_cache, column_cache)
        os.makedirs(secondary_path, exist_ok=True)
        self.store = Store(path, secondary_path=secondary_path, block_cache=block_cache)
        self._watch = Watch(os.path.join(path, SIGNAL_FILE))
        self._refresh_lock = threading.Lock()
        self._gen = -1
        self._log_seq = -1  # -1: delete sets not loaded yet
        self._segs: list[Segment] = []
        self._mems: list[MemSegment] = [MemSegment(SegmentBuilder(config.max_depth), 0)]
        self._upto = 0  # rows indexed into self._mems end here
        self._applied = 0  # the writer's change counter as of the last refresh
        self._applied_at = 0.0  # wall time the last refresh started: everything written before is in
        self._set_state(ShardState((View(self._mems[0], 0, EMPTY),), 0))
        self.closed = False
        try:
            self.refresh(force=True)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ following
    def refresh(self, force: bool = False) -> bool:
        """Catch up with the writer and publish what is new; False when nothing changed.

        ``force`` catches up even if the writer's change signal did not move (a writer that
        restarted, or a signal file that is not there yet)."""
        with self._refresh_lock:
            if self.closed:
                return False
            started = time.time()
            counter = self._watch.read()[0]
            if counter == self._applied and not force:
                self._applied_at = started
                return False
            self.store.catch_up()
            changed = self._apply()
            self._applied = counter
            self._applied_at = started
            return changed

    @property
    def change_count(self) -> int:
        """The writer's change counter as of the last refresh: every change it counted up
        to here is visible (see rtindex/fence.py)."""
        return self._applied

    def lag(self) -> dict:
        """How far behind the writer this replica is: rows it has not indexed yet (as the
        writer last signalled) and milliseconds since the newest write it surely has."""
        counter, writer_next, _ = self._watch.read()
        if counter == self._applied and writer_next <= self._state.next_row_id:
            return {"rows": 0, "ms": 0.0}
        return {"rows": max(writer_next - self._state.next_row_id, 0),
                "ms": max((time.time() - self._applied_at) * 1000.0, 0.0)}

    def _apply(self) -> bool:
        st = self.store
        next_row = self._meta_u64(keys.META_NEXT_ROW)
        gen = self._meta_u64(keys.META_GENERATION)
        log_seq = self._meta_u64(keys.META_LOG_SEQ)
        old = self._state
        if next_row == old.next_row_id and gen == self._gen and log_seq == self._log_seq:
            return False
        full = self._log_seq < 0 or log_seq < self._log_seq
        dels: list[int] = []
        if not full and log_seq > self._log_seq:
            expect = self._log_seq + 1
            for k, v in st.scan("meta", keys.meta_log(expect), keys.meta_log(log_seq + 1)):
                if from_u64(k[1:]) != expect:
                    break
                dels.extend(keys.unpack_u64s(v))
                expect += 1
            if expect != log_seq + 1:  # the writer trimmed records we had not read: reload
                full, dels = True, []
        if gen != self._gen or full:
            known = {s.segid: s for s in self._segs}
            segs = []
            for k, v in st.scan("meta", keys.META_SEGMENT, keys.prefix_upper_bound(keys.META_SEGMENT)):
                segid = from_u64(k[1:])
                seg = known.get(segid)
                if seg is None:
                    seg = open_segment(self.segments_dir, segid, orjson.loads(v), self.index)
                segs.append(seg)
            segs.sort(key=lambda s: s.base)
        else:
            segs = self._segs
        sealed_end = segs[-1].base + segs[-1].n if segs else 0
        if next_row < self._upto or sealed_end > next_row:
            raise CorruptionError(f"shard {self.index} of {self.path}: the writer's rows end at {next_row}, "
                                  f"this replica indexed {self._upto} and segments end at {sealed_end}")
        self._index_new_rows(next_row, sealed_end)

        old_views = {id(v.seg): v for v in old.views} if not full else {}
        by_range = sorted(dels)
        views = []
        for seg in segs:
            views.append(self._view(seg, seg.n, seg.live, 0, old_views.get(id(seg)), by_range))
        mems = [m for m in self._mems[:-1] if m.base + m.builder.n_rows > sealed_end] + [self._mems[-1]]
        self._mems = mems
        for m in mems:
            n = m.builder.n_rows
            covered = min(max(sealed_end - m.base, 0), n)
            views.append(self._view(m, n, None, covered, old_views.get(id(m)), by_range))
        self._segs = segs
        self._gen = gen
        self._log_seq = log_seq
        self._set_state(ShardState(tuple(views), next_row))
        return True

    def _view(self, seg, n: int, live, covered: int, old: View | None, dels: list[int]) -> View:
        """The view of ``seg`` (``n`` rows from its base): the previous view's deleted
        offsets plus the new deletes, or the delete records when the segment is new to this
        replica; in-memory rows below ``covered`` are masked (a segment file has them)."""
        base = seg.base
        lo, hi = bisect.bisect_left(dels, base), bisect.bisect_left(dels, base + n)
        if old is not None and lo == hi and (not covered or old.deleted.contains_range(0, covered)):
            return old if old.limit == n else View(seg, n, old.deleted)
        if old is not None:
            deleted = BitMap(old.deleted)
            deleted.update(r - base for r in dels[lo:hi])
        else:
            deleted = BitMap(from_u64(k[1:]) - base for k in self.store.scan_keys(
                "meta", keys.meta_deleted(base), keys.meta_deleted(base + n)))
        if live is not None:
            deleted &= live
        if covered:
            deleted.add_range(0, covered)
        return View(seg, n, FrozenBitMap(deleted))

    def _index_new_rows(self, next_row: int, sealed_end: int) -> None:
        """Index rows ``self._upto`` .. ``next_row - 1`` into the replica's own builders."""
        if self._upto < sealed_end:  # rows the writer sealed before we saw them: skip them
            active = self._mems[-1]
            if active.builder.n_rows == 0 or active.base + active.builder.n_rows <= sealed_end:
                self._mems[-1] = MemSegment(SegmentBuilder(self.config.max_depth), sealed_end)
            else:
                self._mems.append(MemSegment(SegmentBuilder(self.config.max_depth), sealed_end))
            self._upto = sealed_end
        if self._upto == next_row:
            return
        # decoded and indexed in small chunks as they are read: a document dies right after it
        # is indexed (holding a whole refresh's documents alive made the cyclic GC traverse
        # them again and again: orjson.loads measured 36 us per event that way, 10 us without)
        seal_rows = self.config.seal_rows
        docs = self._decoded_rows(self._upto, next_row)
        while self._upto < next_row:
            mem = self._mems[-1]
            if mem.builder.n_rows >= seal_rows:  # bounded builders, like the writer's
                mem = MemSegment(SegmentBuilder(self.config.max_depth), mem.base + mem.builder.n_rows)
                self._mems.append(mem)
            b = mem.builder
            chunk = list(itertools.islice(docs, min(32, seal_rows - b.n_rows, next_row - self._upto)))
            with self._mem_lock:
                for doc in chunk:
                    b.add(doc)
            self._upto += len(chunk)  # a failure after this resumes here (the builder has these rows)

    def _missing_rows(self, row_ids: list[int]) -> None:
        """A replica's state older than the writer's ``reader_grace_seconds`` can show rows
        whose clean-up has run since: a clean error, never a wrong answer."""
        raise StorageError(f"shard {self.index} of {self.path}: rows {row_ids[:5]} were removed by the writer "
                           f"while this read was using an older state (a snapshot kept longer than the writer's "
                           f"reader_grace_seconds): run the read again")

    def close(self) -> None:
        with self._refresh_lock:
            self.closed = True
        self._watch.close()
        self.store.close()
