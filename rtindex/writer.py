"""One shard, write side: the only process that writes it (docs/architecture.md, write path).

Per batch, under the shard's write lock:
1. the documents' JSON bytes are indexed into the active mutable segment in one compiled
   pass (each gets the next row id, ``base + offset``); a document the indexer refuses is
   reported, nothing of it is written;
2. the ``_id`` -> row id entries, delete records for replaced rows, a change log record
   (for readers in other processes) and the next row id go to RocksDB in one WAL-backed
   WriteBatch (the rows themselves are in the mutable segment's file already, which a
   ``T`` meta record names: the file is where recovery reads them back);
3. a new immutable ShardState is published (reads that start now see the batch), the
   mutable segment publishes its row count to readers in other processes, and the shard's
   signal records the change.

The mutable segments are files in ``tails/`` that reader processes map: they read the index
built here instead of building their own. If step 2 fails (a full disk, an I/O error)
nothing was stored, but step 1 left rows in the segment: it is replaced by one holding only
the stored rows before anything else may use it, so a failed batch leaves no trace and the
shard goes on working once the cause is gone.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterable, Iterator

from pyroaring import BitMap, FrozenBitMap

from rtindex import keys, segfile
from rtindex._impl import SegmentBuilder, tail_rows
from rtindex.background import Worker
from rtindex.chunkcache import ChunkCache
from rtindex.errors import CorruptionError, SchemaError, StorageError
from rtindex.keys import from_u64, u64
from rtindex.maintenance import Maintenance
from rtindex.notify import Signal, Wake
from rtindex.rowcache import RowStoreCache
from rtindex.segments import EMPTY, MemSegment, Segment, ShardConfig, ShardState, View, tail_fid
from rtindex.shard import OLD_SIGNAL_FILE, SIGNAL_FILE, TAILS_DIR, Shard, tail_path
from rtindex.storage import Store

log = logging.getLogger("rtindex")

LOG_KEEP = 4096  # change log records kept for readers; one further behind reloads its delete sets
LOG_TRIM_EVERY = 256
RECOVERY_ROWS = 2048  # rows read back and indexed at a time by recovery and rebuilds


class ShardWriter(Shard):
    def __init__(self, path: str, index: int, config: ShardConfig, sealer: Worker, merger: Worker,
                 row_cache: RowStoreCache, column_cache: ChunkCache, *, create: bool = False, sync: bool = False,
                 block_cache=None, write_buffers=None, wake: Wake | None = None):
        super().__init__(path, index, config, row_cache, column_cache)
        self.store = Store(path, create=create, sync=sync, block_cache=block_cache, write_buffers=write_buffers)
        self._write_lock = threading.RLock()  # one writer at a time; publishes states
        self._closed = False
        self._broken_builder = False  # a failed write left rows in the active builder
        self._wake = wake
        self._epoch = int.from_bytes(os.urandom(4), "little") or 1  # this incarnation's tail file ids
        self._next_tail = 0
        self.row_store_end = 0  # rows below it may be in the row store (written by an older version)
        try:
            os.makedirs(os.path.join(path, TAILS_DIR), exist_ok=True)
            self._signal = Signal(os.path.join(path, SIGNAL_FILE), self._epoch)
            self.maintenance = Maintenance(self, sealer, merger)
            self._set_state(self._recover())
            self._clear_tails()
        except BaseException:
            self.store.close()
            raise
        self._signal_change(structural=True)
        self.maintenance.written()  # (what recovery left unsealed is sealed if no write comes)

    def _clear_tails(self) -> None:
        """Remove the mutable segment files this writer does not use: an earlier writer's,
        once recovery holds their rows (readers that map one keep their map)."""
        tails = os.path.join(self.path, TAILS_DIR)
        mine = {os.path.basename(v.seg.builder.path) for v in self._state.views if not v.sealed}
        for name in os.listdir(tails):
            if name not in mine:
                os.unlink(os.path.join(tails, name))
        try:
            os.unlink(os.path.join(self.path, OLD_SIGNAL_FILE))
        except FileNotFoundError:
            pass

    def _new_builder(self, base: int, max_depth: int | None = None):
        """An empty mutable segment from row id ``base``, in a file readers can map."""
        self._next_tail += 1
        fid = (self._epoch << 32) | self._next_tail
        try:
            return SegmentBuilder(tail_path(self.path, base, fid), base,
                                  self.config.max_depth if max_depth is None else max_depth)
        except OSError as e:
            raise StorageError(f"cannot make a mutable segment in {os.path.join(self.path, TAILS_DIR)}: "
                               f"{e.strerror or e}") from e

    def _record_tail(self, builder, stale: Iterable[int] = ()) -> None:
        """Make ``builder``'s file the one recovery reads the rows from its base on (a ``T``
        record; the ``T`` records of the bases ``stale`` go), once what it holds is durable.
        On failure the file is removed: it was never named."""
        try:
            if self.store.sync:
                builder.sync()
            wb = self.store.batch()
            for base in stale:
                wb.delete("meta", keys.meta_tail(base))
            wb.put("meta", keys.meta_tail(builder.base), u64(tail_fid(builder.path)))
            self.store.write(wb)
        except BaseException as e:
            builder.close()
            builder.unlink()
            if isinstance(e, OSError):
                raise StorageError(f"cannot make the mutable segment durable: {e.strerror or e}") from e
            raise

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> ShardState:
        """Load sealed segments and deletes; index the rows after them (the unsealed ones)
        again, read from the mutable segment files the ``T`` records name (or the row
        store, for rows an older version wrote there), into one new mutable segment."""
        stored = self.load()
        self._log_seq, self._generation = stored.log_seq, stored.generation
        segs = stored.segments
        self._next_segid = max((s.segid for s in segs), default=0) + 1
        self._collect_orphans(segs)
        views = []
        garbage = self.store.batch()
        for seg in segs:
            deleted = self.deleted_offsets(seg.base, seg.n)
            for off in deleted - seg.live:  # dropped by a merge whose clean-up did not run: finish it
                garbage.delete("meta", keys.meta_deleted(seg.base + off))
                if not seg.file.has_rows:
                    garbage.delete("rows", u64(seg.base + off))
            views.append(View(seg, seg.n, FrozenBitMap(deleted & seg.live)))
        if garbage.n:
            self.store.write(garbage)
        start = stored.sealed_end
        tails = {keys.meta_tail_base(k): from_u64(v)
                 for k, v in self.store.scan("meta", keys.META_TAIL, keys.prefix_upper_bound(keys.META_TAIL))}
        builder = self._indexed(start, stored.next_row, self._stored_rows_from(start, stored.next_row, tails))
        self._record_tail(builder, stale=[b for b in tails if b != start])
        deleted = self.deleted_offsets(start, stored.next_row - start)
        views.append(View(MemSegment(builder, owned=True), builder.n_rows, FrozenBitMap(deleted)))
        return ShardState(tuple(views), stored.next_row)

    def _stored_rows_from(self, start: int, end: int, tails: dict[int, int]) -> Iterator[list[bytes]]:
        """Rows ``start`` .. ``end - 1``, a list at a time: from the mutable segment file
        the ``T`` record of each range names (``tails``: base -> file id), the rows before
        the first such range from the row store (written there by an older version)."""
        bases = sorted(b for b in tails if start <= b < end)
        first = bases[0] if bases else end
        if start < first:
            self.row_store_end = first
            expect = start
            part: list[bytes] = []
            for k, v in self.store.scan("rows", u64(start), u64(first)):
                if from_u64(k) != expect:
                    raise CorruptionError(f"shard {self.index} of {self.path}: row {from_u64(k)} found where "
                                          f"row {expect} was expected")
                part.append(v)
                expect += 1
                if len(part) >= RECOVERY_ROWS:
                    yield part
                    part = []
            if part:
                yield part
            if expect != first:
                raise CorruptionError(f"shard {self.index} of {self.path}: rows end at {expect}, "
                                      f"{first} expected")
        for base, stop in zip(bases, bases[1:] + [end]):
            path = tail_path(self.path, base, tails[base])
            for lo in range(base, stop, RECOVERY_ROWS):
                hi = min(lo + RECOVERY_ROWS, stop)
                try:
                    yield tail_rows(path, lo - base, hi - base)
                except (OSError, ValueError) as e:
                    raise CorruptionError(f"shard {self.index} of {self.path}: rows {lo}..{hi - 1} cannot be "
                                          f"read from their mutable segment file (a power loss without "
                                          f"sync=True can do this): {e}") from e

    def _indexed(self, start: int, end: int, parts: Iterable[list[bytes]]):
        """A new mutable segment holding rows ``start`` .. ``end - 1``, whose stored JSON
        bytes ``parts`` gives a list at a time, indexed as stored (no document is decoded)."""
        builder = self._new_builder(start, max_depth=1 << 20)  # they were checked when written
        try:
            for raws in parts:
                first = start + builder.n_rows
                _, errors = self._add(builder.add_json, raws)
                if errors:
                    i, e = errors[0]
                    raise CorruptionError(f"shard {self.index} of {self.path}: stored row {first + i} "
                                          f"cannot be indexed: {e}")
            if start + builder.n_rows != end:
                raise CorruptionError(f"shard {self.index} of {self.path}: rows end at {start + builder.n_rows}, "
                                      f"next row id is {end}")
        except BaseException:
            builder.close()
            builder.unlink()
            raise
        builder.max_depth = self.config.max_depth
        builder.publish(builder.n_rows, self._log_seq)
        return builder

    def row_store_rows(self, row_ids: list[int]) -> Iterator[bytes]:
        """The row store's rows of ``row_ids``, read a batch at a time (a merge of segment
        files written before rows moved into them)."""
        for i in range(0, len(row_ids), RECOVERY_ROWS):
            part = row_ids[i : i + RECOVERY_ROWS]
            raws = self.store.multi_get("rows", [u64(r) for r in part])
            if None in raws:
                self._missing_rows([r for r, raw in zip(part, raws) if raw is None])
            yield from raws

    def _collect_orphans(self, segs: list[Segment]) -> None:
        """Delete segment files no descriptor names (a crash mid-seal/merge, or a clean-up
        that did not run) and temporary files of unfinished writes."""
        named = {s.segid for s in segs}
        segfile.remove_leftovers(self.segments_dir)
        for segid in segfile.segment_ids(self.segments_dir):
            self._next_segid = max(self._next_segid, segid + 1)
            if segid not in named:
                segfile.remove_segment(self.segments_dir, segid)

    # ------------------------------------------------------------------ writes
    @property
    def write_lock(self) -> threading.RLock:
        """Held by every write; hold it to make a read-modify-write (patch) atomic."""
        return self._write_lock

    def _check_writable(self) -> None:
        if self._broken_builder:
            self._rebuild_builder()

    def _rebuild_builder(self) -> None:
        """Replace the active builder by one holding only its stored rows: after a failed
        write it holds rows that were never stored (readers of older states keep the old one,
        whose extra rows their row limit hides)."""
        state = self._state
        mem = state.views[-1]
        old = mem.seg.builder
        n = state.next_row_id - mem.base
        try:
            builder = self._indexed(mem.base, state.next_row_id,
                                    ([old.row(i) for i in range(lo, min(lo + RECOVERY_ROWS, n))]
                                     for lo in range(0, n, RECOVERY_ROWS)))
            self._record_tail(builder)
        except StorageError:
            self._broken_builder = True
            raise
        views = state.views[:-1] + (replace(mem, seg=MemSegment(builder, owned=True)),)
        self._set_state(ShardState(views, state.next_row_id))
        self._broken_builder = False
        self._signal_change(structural=True)

    @contextmanager
    def _failing(self, what: str):
        """A StorageError inside names this shard and says that nothing of ``what`` was
        stored; the builder is rebuilt if indexing had begun (now, or before the next write)."""
        try:
            yield
        except StorageError as e:
            if self._broken_builder:
                try:
                    self._rebuild_builder()
                except StorageError:
                    pass  # rebuilt before the next write instead
            raise StorageError(f"shard {self.index} of {os.path.dirname(self.path)}: {what} failed, nothing "
                               f"of it was stored: {e}") from e

    def put_many(self, items: list[tuple[int, bytes, dict | None, bytes | None]],
                 generated: set[int] | frozenset[int] = frozenset(), meta: list[tuple[bytes, bytes]] = (),
                 ) -> tuple[list[tuple[int, SchemaError]], list[int], list[tuple[int, bytes, dict | None, bytes | None, int]]]:
        """Upsert ``(caller index, id key, document, its JSON bytes)`` items atomically: the
        bytes are indexed into the active mutable segment in one compiled pass (without the
        GIL), then stored in one write and published. An item without bytes (None) is
        skipped, as refused.

        Returns the per-item errors (refused by the indexer), the caller indices of the
        items that replaced a stored document (or an earlier item of the same call; every
        other item is new), and the items, each with its row offset in the active segment
        appended (-1: not stored, see the errors). ``generated``: the caller indices of items
        whose ``_id`` was just generated (a time then 80 random bits, see
        documents._IdPool), which cannot be stored yet: their ``_id`` index is not read. All
        of them are durable when this returns. Raises StorageError (and stores nothing) when
        the write fails. ``meta``: records stored in the same write as the items, whether
        any item is stored or not (a source's offsets, rtindex/sources.py).
        """
        with self._write_lock, self._failing(f"writing {len(items)} documents"):
            self._check_writable()
            self._rotate_if_full()
            state = self._state
            mem = state.views[-1].seg
            self._broken_builder = True  # until the write succeeded
            offsets, refused = self._add(mem.builder.add_json, [it[3] for it in items if it[3] is not None])
            out = []
            at = 0
            for idx, id_key, doc, raw in items:
                off = -1
                if raw is not None:
                    off = offsets[at]
                    at += 1
                out.append((idx, id_key, doc, raw, off))
            errors = []
            if refused:
                with_bytes = [i for i, it in enumerate(items) if it[3] is not None]
                errors = [(items[with_bytes[i]][0], e) for i, e in refused]
            replaced: list[int] = []
            stored = [it for it in out if it[4] >= 0]
            if stored:
                if stored[-1][4] - stored[0][4] != len(stored) - 1:
                    raise CorruptionError(f"shard {self.index}: the builder gave offsets {stored[0][4]}.."
                                          f"{stored[-1][4]} to {len(stored)} documents")
                old = self._stored_rows([it[1] for it in stored], [it[0] in generated for it in stored])
                self._write_rows(state, mem.base + stored[0][4], [it[1] for it in stored], old, replaced,
                                 [it[0] for it in stored], meta)
            elif meta:
                wb = self.store.batch()
                for key, value in meta:
                    wb.put("meta", key, value)
                self.store.write(wb)
            self._broken_builder = False
        return errors, replaced, out

    def _add(self, add, *args):
        """Call a builder's add_json/add_columns: an OSError (its file cannot grow) is a
        StorageError, so that the builder is replaced."""
        try:
            return add(*args)
        except OSError as e:
            raise StorageError(f"indexing into {os.path.basename(os.path.dirname(self.path))}/"
                               f"shard {self.index}: {e.strerror or e}") from e

    def put_columns(self, names: list[str], arrays: list, id_keys: list[bytes], raws: list[bytes],
                    generated: list[bool]) -> list[int]:
        """Upsert rows given column-wise (``SegmentBuilder.add_columns``; ``rtindex.columnar``
        prepares them), each row's id key and JSON bytes, and whether its ``_id`` was just
        generated (its ``_id`` index is not read), atomically: all are durable when this
        returns, or none (StorageError). ``rtindex.columnar.prepare`` lets through only
        columns the builder takes. Returns the positions of the rows that replaced a stored
        document or an earlier row of the call."""
        replaced: list[int] = []
        with self._write_lock, self._failing(f"writing {len(id_keys)} documents"):
            self._check_writable()
            self._rotate_if_full()
            state = self._state
            mem_view = state.views[-1]
            old = self._stored_rows(id_keys, generated)
            self._broken_builder = True  # until the write below succeeded
            first = self._add(mem_view.seg.builder.add_columns, names, arrays, raws)  # refuses before indexing
            self._write_rows(state, mem_view.seg.base + first, id_keys, old, replaced, range(len(id_keys)))
            self._broken_builder = False
        return replaced

    def _stored_rows(self, id_keys: list[bytes], fresh: list[bool]) -> list[bytes | None]:
        """The ``_id`` index value (a row id) of each id key, None where none is stored.
        ``fresh``: which ids were just generated (a time then 80 random bits, which cannot
        be stored yet): they are not read."""
        if not any(fresh):
            return self.store.multi_get("ids", id_keys)
        got = iter(self.store.multi_get("ids", [k for k, f in zip(id_keys, fresh) if not f]))
        return [None if f else next(got) for f in fresh]

    def _write_rows(self, state: ShardState, first: int, id_keys: list[bytes], old: list[bytes | None],
                    replaced: list[int], tags, meta: list[tuple[bytes, bytes]] = ()) -> None:
        """Store rows just indexed into the active builder from row id ``first`` on (their
        bytes are in its file): their ``_id`` index entries, delete records of the rows they
        replace (``old``: the ``_id`` index values read before, None for new ids) and the
        next row id, in one write; then publish them. Appends to ``replaced`` the ``tags`` of
        the rows that replaced one (a stored row, or an earlier one of these)."""
        next_row = first + len(id_keys)
        if first != state.next_row_id:
            raise CorruptionError(f"shard {self.index}: rows from {first} assigned, {state.next_row_id} expected")
        rid_keys = list(map(u64, range(first, next_row)))
        if self.store.sync:
            state.views[-1].seg.builder.sync()
        wb = self.store.batch()
        wb.put_all("ids", id_keys, rid_keys)
        dels: list[int] = []
        if len(set(id_keys)) < len(id_keys) or any(o is not None for o in old):
            seen: dict[bytes, int] = {}
            for rid, id_key, prev_raw, tag in zip(range(first, next_row), id_keys, old, tags):
                prev = seen.get(id_key)
                if prev is None and prev_raw is not None:
                    prev = from_u64(prev_raw)
                if prev is not None:
                    replaced.append(tag)
                    dels.append(prev)
                    wb.put("meta", keys.meta_deleted(prev), b"")
                seen[id_key] = rid
        wb.put("meta", keys.META_NEXT_ROW, u64(next_row))
        for key, value in meta:
            wb.put("meta", key, value)
        seq = self._log(wb, dels)
        self.store.write(wb)
        self._log_seq = seq
        self._publish(state, next_row, dels)

    def drop_source(self, source: str) -> None:
        """Forget ``source``'s stored offsets (rtindex/sources.py)."""
        with self._write_lock, self._failing(f"removing source {source!r}"):
            self._check_writable()
            wb = self.store.batch()
            wb.delete_range("meta", *keys.meta_source_range(source))
            self.store.write(wb)

    @property
    def change_count(self) -> int:
        """The change counter after the last published write (see rtindex/fence.py)."""
        return self._signal.count

    def _log(self, wb, dels: list[int]) -> int:
        """Add a change log record of ``dels`` to ``wb`` (readers in other processes learn
        deletes from it), trimming old records now and then; returns the log sequence as of
        this write (the caller keeps it once the write succeeded)."""
        if not dels:
            return self._log_seq
        seq = self._log_seq + 1
        wb.put("meta", keys.meta_log(seq), keys.pack_u64s(dels))
        wb.put("meta", keys.META_LOG_SEQ, u64(seq))
        if seq % LOG_TRIM_EVERY == 0 and seq > LOG_KEEP:
            wb.delete_range("meta", keys.meta_log(0), keys.meta_log(seq - LOG_KEEP))
        return seq

    def delete_many(self, id_keys: list[bytes]) -> list[bool]:
        """Delete documents by id key; returns whether each existed."""
        with self._write_lock, self._failing(f"deleting {len(id_keys)} documents"):
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
                wb.put("meta", keys.meta_deleted(prev), b"")
                wb.delete("ids", id_key)
            if dels:
                seq = self._log(wb, dels)
                self.store.write(wb)
                self._log_seq = seq
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
        mem.seg.builder.publish(next_row - mem.base, self._log_seq)
        self._set_state(ShardState(tuple(views), next_row))
        rotate = self._is_full(self._state) and self._pending_seals(self._state) < self.config.max_pending_seals
        if rotate:
            try:
                self._set_state(self._rotated(self._state))
            except StorageError as e:  # the batch is stored; the next write rotates (or fails before storing)
                log.warning("rtindex shard %s: %s", self.path, e)
                rotate = False
        self._signal_change(structural=bool(dels) or rotate)
        self.maintenance.written()

    def _signal_change(self, structural: bool) -> None:
        """Publish the shard's state to reader processes (caller holds the write lock);
        ``structural``: a change they must act on (deletes, segments made, sealed or merged),
        not only rows they see through the mutable segment's row count: wake them."""
        st = self._state
        tails = [(v.base, v.seg.fid) for v in st.views if not v.sealed]
        self._signal.bump(st.next_row_id, self._generation, self._log_seq, tails)
        if structural and self._wake is not None:
            self._wake.ring()

    # ------------------------------------------------------------------ rotation
    def _is_full(self, state: ShardState) -> bool:
        b = state.views[-1].seg.builder
        return b.n_rows >= self.config.seal_rows or b.nbytes >= self.config.seal_bytes

    @staticmethod
    def _pending_seals(state: ShardState) -> int:
        return sum(1 for v in state.views[:-1] if not v.sealed)

    def _rotate_if_full(self) -> None:
        """Before a write: rotate a full builder out, waiting for the sealer while too many
        wait (bounded memory). A sealer that keeps failing makes the write fail here, before
        anything of it is stored."""
        if not self._is_full(self._state):
            return
        self.maintenance.wait_for_seal_slot()
        self._set_state(self._rotated(self._state))
        self._signal_change(structural=True)

    def _rotated(self, state: ShardState) -> ShardState:
        """``state`` with a fresh active builder; the full one goes to the sealer."""
        builder = self._new_builder(state.next_row_id)
        self._record_tail(builder)
        fresh = View(MemSegment(builder, owned=True), 0, EMPTY)
        self.maintenance.seal_later()
        return ShardState(state.views + (fresh,), state.next_row_id)

    def seal_now(self) -> None:
        """Rotate the mutable segment out (if it has rows) so that it gets sealed."""
        with self._write_lock:
            self._check_writable()
            if self._state.views[-1].limit:
                self.maintenance.wait_for_seal_slot()
                self._set_state(self._rotated(self._state))
                self._signal_change(structural=True)

    def new_segid(self) -> int:
        with self._write_lock:
            segid = self._next_segid
            self._next_segid += 1
            return segid

    def next_generation(self) -> int:
        """The next value of the segment-set generation (caller writes it with the change)."""
        with self._write_lock:
            self._generation += 1
            return self._generation

    def replace_views(self, old: list, build) -> None:
        """Publish a state where the views of the adjacent segments ``old`` are replaced by
        ``build(their current views)``: a seal or merge result, which carries over the
        deletes that arrived while it was being written."""
        with self._write_lock:
            views = list(self._state.views)
            i = next(i for i, v in enumerate(views) if v.seg is old[0])
            cur = views[i : i + len(old)]
            if [v.seg for v in cur] != old:
                raise CorruptionError(f"shard {self.index}: segments changed under a seal or merge")
            views[i : i + len(old)] = [build(cur)]
            self._set_state(ShardState(tuple(views), self._state.next_row_id))
            self._signal_change(structural=True)

    def signal(self) -> None:
        with self._write_lock:
            self._signal_change(structural=True)

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ lifecycle
    def wait_for_background(self) -> None:
        """Block until sealing and merging are done; StorageError if they failed meanwhile
        (they are retried: a later call succeeds once the cause is gone)."""
        self.maintenance.wait_idle()

    def close(self) -> None:
        with self._write_lock:
            self._closed = True
            for v in self._state.views:  # readers may go on reading them; the next writer removes them
                if not v.sealed:
                    v.seg.keep_file()
        try:
            self.store.close()
        finally:
            self._signal.close()
