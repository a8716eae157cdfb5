"""One shard, followed from another process: a live read replica of the writer's shard that
indexes nothing itself.

Sealed segments are the writer's files; the unsealed rows are the writer's mutable segments,
files it indexes into and this process maps read-only (rtindex/_ext/_segment.pyx). Following
the writer is then mostly reading numbers it publishes:

- **Rows**: each mutable segment publishes its row count, with the change log sequence as of
  those rows (stored first). A read takes the newest count whenever the writer's deletes are
  the ones this replica applied (:meth:`ShardReader.current`): new rows are visible as soon
  as the writer acknowledged them, without waking anyone.
- **Everything else** (deletes, a new mutable segment, a seal, a merge, a restarted writer)
  wakes the follower thread (rtindex/follower.py), which calls :meth:`ShardReader.refresh`:
  it catches up with the writer's RocksDB (a secondary instance), reads the next row id,
  the segment generation and the change log as of that point, maps new segment files, and
  publishes a new ShardState whose mutable segments show exactly the rows of that point.

Every state of a shard is a prefix of the writer's acknowledged batches on it: the rows, the
deletes and the next row id of a batch are one RocksDB write, and a refresh shows a mutable
segment's rows up to the next row id it read there (waiting, briefly, for the writer to
publish them if it has not yet).
"""

from __future__ import annotations

import bisect
import os
import threading
import time

from pyroaring import BitMap, FrozenBitMap

from rtindex import keys
from rtindex._impl import SegmentBuilder
from rtindex.chunkcache import ChunkCache
from rtindex.errors import StorageError
from rtindex.notify import Watch
from rtindex.rowcache import RowStoreCache
from rtindex.segments import MemSegment, ShardConfig, ShardState, View
from rtindex.shard import SIGNAL_FILE, Shard, Stored, tail_path
from rtindex.storage import Store

PUBLISH_WAIT = 0.05  # seconds a refresh waits for the writer to publish rows it wrote


class ShardReader(Shard):
    def __init__(self, path: str, index: int, config: ShardConfig, row_cache: RowStoreCache,
                 column_cache: ChunkCache, *, secondary_path: str, block_cache=None):
        super().__init__(path, index, config, row_cache, column_cache)
        os.makedirs(secondary_path, exist_ok=True)
        self.store = Store(path, secondary_path=secondary_path, block_cache=block_cache)
        self._watch = Watch(os.path.join(path, SIGNAL_FILE))
        self._refresh_lock = threading.Lock()
        self._stored: Stored | None = None  # what the last refresh loaded (None: nothing yet)
        self._mems: dict[tuple[int, int], MemSegment] = {}  # (base, file id) -> the writer's mutable segment
        self._applied: tuple | None = None  # the signal's structural part as of the last refresh
        self._applied_count = 0  # the writer's change counter as of the last refresh
        self._caught_up = 0  # the writer's change counter as of the last catch-up with RocksDB
        self._applied_at = 0.0  # wall time the last refresh started: everything written before is in
        self._live: tuple = (None, 0, None)  # (state it extends, next row id, the state made): current()'s last
        self._basis: tuple[ShardState, int] = (ShardState((), 0), -1)  # the last refresh's state, its log sequence
        self._served = 0  # the most rows a read was shown: a refresh never goes back before them
        self._live_lock = threading.Lock()
        self._set_state(self._basis[0])
        self.pending = False  # the last refresh found rows the writer had not published yet
        self.closed = False
        try:
            self.refresh(force=True)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ following
    @staticmethod
    def _structure(sig: tuple) -> tuple:
        """What in a signal needs a refresh: generation, log sequence, writer, mutable segments."""
        return sig[3], sig[4], sig[5], sig[6]

    def refresh(self, force: bool = False) -> bool:
        """Catch up with the writer if it changed more than rows (or ``force``), and publish
        what is new; False when there was nothing to do or the writer had not published the
        rows it wrote yet (try again)."""
        with self._refresh_lock:
            if self.closed:
                return False
            started = time.time()
            sig = self._watch.read()
            if sig is None:
                self._applied_at = started
                return False
            if not force and self._structure(sig) == self._applied:
                self._applied_at = started
                self.pending = False
                return False
            if not force and self._rotated(sig):
                self._applied = self._structure(sig)
                self._applied_count = sig[0]
                self._applied_at = started
                self.pending = False
                return True
            self.store.catch_up()
            self._caught_up = sig[0]
            self.pending = not self._apply(sig)
            if self.pending:
                return False
            self._applied = self._structure(sig)
            self._applied_count = sig[0]
            self._applied_at = started
            return True

    def keep_up(self) -> None:
        """Catch up with the writer's RocksDB if it wrote since the last time, so that the
        catch-up of a refresh replays little: RocksDB holds the GIL while it replays."""
        with self._refresh_lock:
            if self.closed:
                return
            sig = self._watch.read()
            if sig is not None and sig[0] != self._caught_up:
                self.store.catch_up()
                self._caught_up = sig[0]

    @property
    def state(self) -> ShardState:
        return self.current()

    def current(self) -> ShardState:
        """The newest state a read may use: the last refresh's, with the active mutable
        segment's rows up to what the writer published since, if it deleted nothing since."""
        st, applied_seq = self._basis
        if not st.views or st.views[-1].sealed:
            return st
        last = st.views[-1]
        rows, log_seq = last.seg.builder.published
        extends, upto, made = self._live
        if log_seq != applied_seq or last.base + rows <= st.next_row_id:
            # deletes since (wait for the refresh they woke), or no new rows: the newest
            # state shown so far from this refresh, which was a prefix when it was made
            return made if extends is st else st
        if extends is st and upto == last.base + rows:
            return made
        with self._live_lock:  # (a refresh must not then publish a state older than this one)
            if self._basis[0] is not st:
                return self.current()
            made = ShardState(st.views[:-1] + (View(last.seg, rows, last.deleted),), last.base + rows)
            self._live = (st, last.base + rows, made)
            self._served = max(self._served, made.next_row_id)
        return made

    @property
    def change_count(self) -> int:
        """The writer's change counter that every read now sees up to (see rtindex/fence.py):
        the last refresh's, or the signal's newest when only rows changed since and the
        mutable segment shows them all."""
        sig = self._watch.read()
        if sig is not None and self._structure(sig) == self._applied:
            st = self.current()
            if st.next_row_id >= sig[1]:
                return sig[0]
        return self._applied_count

    def lag(self) -> dict:
        """How far behind the writer this replica is: rows it does not show yet (as the
        writer last signalled) and milliseconds since the newest write it surely has."""
        sig = self._watch.read()
        if sig is None:
            return {"rows": 0, "ms": 0.0}
        behind = max(sig[1] - self.current().next_row_id, 0)
        if not behind and self._structure(sig) == self._applied:
            return {"rows": 0, "ms": 0.0}
        return {"rows": behind, "ms": max((time.time() - self._applied_at) * 1000.0, 0.0)}

    def _rotated(self, sig: tuple) -> bool:
        """Follow a writer that only started new mutable segments since the last refresh
        (nothing sealed, merged or deleted): map them after the current ones, without
        catching up with RocksDB. A writer starts one once the previous is full, so the
        previous one's published rows are final and the new one starts right after them.
        False: the change is more than that (a full refresh)."""
        if self._applied is None:
            return False
        generation, log_seq, writer, tails = self._structure(sig)
        old_gen, old_seq, old_writer, old_tails = self._applied
        if ((generation, log_seq, writer) != (old_gen, old_seq, old_writer)
                or len(tails) <= len(old_tails) or tuple(tails[:len(old_tails)]) != tuple(old_tails)):
            return False
        st, seq = self._basis
        if not st.views or st.views[-1].sealed:
            return False
        views = list(st.views)
        last = views[-1]
        rows, last_seq = last.seg.builder.published
        if last_seq != seq:
            return False
        views[-1] = View(last.seg, rows, last.deleted)
        next_row = last.base + rows
        mapped = {}
        for base, fid in tails[len(old_tails):]:
            if base != next_row:
                return False
            try:
                mem = MemSegment(SegmentBuilder.attach(tail_path(self.path, base, fid)))
            except FileNotFoundError:
                return False  # sealed and removed already: a full refresh
            n, mem_seq = mem.builder.published
            if n and mem_seq != seq:
                return False  # rows written after deletes this replica has not applied
            mapped[(base, fid)] = mem
            views.append(View(mem, n, FrozenBitMap()))
            next_row = base + n
        state = ShardState(tuple(views), next_row)
        with self._live_lock:
            if self._basis[0] is not st:
                return False
            self._basis = (state, seq)
            self._served = max(self._served, next_row)
        self._mems.update(mapped)
        self._set_state(state)
        return True

    def _apply(self, sig: tuple) -> bool:
        prev = self._stored
        stored = self.load(prev)
        old = self._state
        if (stored.next_row < max(sig[1], old.next_row_id) or stored.generation < sig[3]
                or stored.log_seq < sig[4] or prev is not None and (stored.generation < prev.generation
                                                                      or stored.log_seq < prev.log_seq)):
            return False  # the catch-up did not reach what was signalled yet: soon
        full = prev is None
        dels: list[int] = []
        if not full and stored.log_seq > prev.log_seq:
            expect = prev.log_seq + 1
            for k, v in self.store.scan("meta", keys.meta_log(expect), keys.meta_log(stored.log_seq + 1)):
                if keys.meta_log_seq(k) != expect:
                    break
                dels.extend(keys.unpack_u64s(v))
                expect += 1
            if expect != stored.log_seq + 1:  # the writer trimmed records we had not read: reload
                full, dels = True, []
        sealed_end = stored.sealed_end
        mems = self._map_mems(sig[6], sealed_end, stored.next_row)
        if mems is None:
            return False
        old_views = {id(v.seg): v for v in old.views} if not full else {}
        by_range = sorted(dels)
        views = [self._view(seg, seg.n, 0, old_views.get(id(seg)), by_range) for seg in stored.segments]
        for m, n in mems:
            covered = min(max(sealed_end - m.base, 0), n)
            views.append(self._view(m, n, covered, old_views.get(id(m)), by_range))
        state = ShardState(tuple(views), stored.next_row)
        with self._live_lock:
            if stored.next_row < self._served:
                return False  # reads were shown rows this catch-up has not reached: soon
            self._basis = (state, stored.log_seq)
            self._served = stored.next_row
        self._stored = stored
        self._set_state(state)
        return True

    def _map_mems(self, tails: tuple, sealed_end: int, next_row: int) -> list[tuple[MemSegment, int]] | None:
        """The writer's mutable segments holding rows from ``sealed_end`` to ``next_row``,
        mapped, each with the rows of it to show; None when the writer has not published all
        of them yet (after waiting a little)."""
        mapped = {}
        for base, fid in tails:
            mem = self._mems.get((base, fid))
            if mem is None:
                try:
                    mem = MemSegment(SegmentBuilder.attach(tail_path(self.path, base, fid)))
                except FileNotFoundError:
                    continue  # sealed and removed since the signal was read: the segments have its rows
            mapped[(base, fid)] = mem
        self._mems = mapped
        out = []
        ordered = sorted(mapped.values(), key=lambda m: m.base)
        covered_to = sealed_end
        for i, m in enumerate(ordered):
            last = i + 1 == len(ordered)
            end = min(next_row if last else ordered[i + 1].base, next_row)
            if not last and (end <= sealed_end or end <= m.base):
                continue  # sealed: the segment files have its rows
            if last and end < m.base:  # the writer's newest segment starts past the rows read: not yet
                return None
            if m.base > covered_to:  # a segment between (sealed and removed after the catch-up): soon
                return None
            want = end - m.base
            covered_to = max(covered_to, end)
            deadline = time.monotonic() + PUBLISH_WAIT
            while m.builder.published[0] < want:  # written and not yet published (microseconds)
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.0002)
            out.append((m, want))
        if covered_to < next_row:  # rows no mapped segment holds: the signal was older than RocksDB
            return None
        return out

    def _view(self, seg, n: int, covered: int, old: View | None, dels: list[int]) -> View:
        """The view of ``seg`` (``n`` rows from its base): the previous view's deleted
        offsets plus the new deletes, or the delete records when the segment is new to this
        replica; mutable rows below ``covered`` are masked (a segment file has them)."""
        base = seg.base
        lo, hi = bisect.bisect_left(dels, base), bisect.bisect_left(dels, base + n)
        if old is not None and lo == hi and (not covered or old.deleted.contains_range(0, covered)):
            return old if old.limit == n else View(seg, n, old.deleted)
        if old is not None:
            deleted = BitMap(old.deleted)
            deleted.update(r - base for r in dels[lo:hi])
        else:
            deleted = self.deleted_offsets(base, n)
        if seg.sealed:
            deleted &= seg.live
        if covered:
            deleted.add_range(0, covered)
        return View(seg, n, FrozenBitMap(deleted))

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
