"""One shard, write side: the only process that writes it (docs/architecture.md, write path).

Per batch, under the shard's write lock:
1. each document is indexed into the active in-memory segment (it gets the next row id,
   ``base + offset``); a document the indexer rejects is reported, nothing is written;
2. the rows, the ``_id`` -> row id entries, delete records for replaced rows, a change log
   record (for readers in other processes) and the next row id go to RocksDB in one
   WAL-backed WriteBatch;
3. a new immutable ShardState is published (readers that start now see the batch) and the
   readers' change signal is bumped.

If step 2 fails (a full disk, an I/O error) nothing was stored, but step 1 left rows in the
builder: the builder is rebuilt from the row store before anything else may use it, so a
failed batch leaves no trace and the shard goes on working once the cause is gone.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable

import orjson
from pyroaring import BitMap, FrozenBitMap

from rtindex import keys, segfile
from rtindex._impl import SegmentBuilder
from rtindex.background import Worker
from rtindex.chunkcache import ChunkCache
from rtindex.errors import CorruptionError, SchemaError, StorageError
from rtindex.keys import from_u64, u64
from rtindex.maintenance import Maintenance
from rtindex.notify import Signal
from rtindex.rowcache import RowStoreCache
from rtindex.segments import EMPTY, MemSegment, Segment, ShardConfig, ShardState, View, open_segment
from rtindex.shard import SIGNAL_FILE, Shard
from rtindex.storage import Store

log = logging.getLogger("rtindex")

LOG_KEEP = 4096  # change log records kept for readers; one further behind reloads its delete sets
LOG_TRIM_EVERY = 256


class ShardWriter(Shard):
    def __init__(self, path: str, index: int, config: ShardConfig, sealer: Worker, merger: Worker,
                 row_cache: RowStoreCache, column_cache: ChunkCache, *, create: bool = False, sync: bool = False,
                 block_cache=None, write_buffers=None):
        super().__init__(path, index, config, row_cache, column_cache)
        self.store = Store(path, create=create, sync=sync, block_cache=block_cache, write_buffers=write_buffers)
        self._write_lock = threading.RLock()  # one writer at a time; publishes states
        self._closed = False
        self._broken_builder = False  # a failed write left rows in the active builder
        try:
            self._signal = Signal(os.path.join(path, SIGNAL_FILE))
            self.maintenance = Maintenance(self, sealer, merger)
            self._set_state(self._recover())
        except BaseException:
            self.store.close()
            raise
        self._signal.bump(self._state.next_row_id)

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> ShardState:
        """Load sealed segments and deletes; re-index rows that were only in memory."""
        st = self.store
        next_row = self._meta_u64(keys.META_NEXT_ROW)
        self._log_seq = self._meta_u64(keys.META_LOG_SEQ)
        self._generation = self._meta_u64(keys.META_GENERATION)
        segs = self._load_segments()
        self._next_segid = max((s.segid for s in segs), default=0) + 1
        self._collect_orphans(segs)
        sealed_end = segs[-1].base + segs[-1].n if segs else 0

        deleted: dict[int, BitMap] = {}
        garbage = st.batch()
        bases = [s.base for s in segs]
        for k, _ in st.scan("meta", keys.META_DELETED, keys.prefix_upper_bound(keys.META_DELETED)):
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
        builder = self._index_rows(sealed_end, next_row)
        views.append(View(MemSegment(builder, sealed_end), builder.n_rows, FrozenBitMap(deleted.get(sealed_end, EMPTY))))
        return ShardState(tuple(views), next_row)

    def _load_segments(self) -> list[Segment]:
        """The sealed segments the meta records name, with their files mapped, by base."""
        segs = [open_segment(self.segments_dir, from_u64(k[1:]), orjson.loads(v), self.index)
                for k, v in self.store.scan("meta", keys.META_SEGMENT, keys.prefix_upper_bound(keys.META_SEGMENT))]
        segs.sort(key=lambda s: s.base)
        end = 0
        for s in segs:  # they tile the row ids from 0: a hole would make rows vanish
            if s.base != end:
                raise CorruptionError(f"shard {self.index}: segment {s.segid} starts at row {s.base}, "
                                      f"the segments before it end at row {end}")
            end = s.base + s.n
        return segs

    def _index_rows(self, start: int, end: int):
        """A new builder holding rows ``start`` .. ``end - 1`` read back from the row store."""
        builder = SegmentBuilder(self.config.max_depth)
        for doc in self._decoded_rows(start, end):
            builder.add(doc)
        return builder

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
        """Replace the active builder by one re-indexed from the row store: after a failed
        write it holds rows that were never stored (readers of older states keep the old one,
        whose extra rows their row limit hides)."""
        state = self._state
        mem = state.views[-1]
        try:
            builder = self._index_rows(mem.base, state.next_row_id)
        except StorageError:
            self._broken_builder = True
            raise
        with self._mem_lock:
            views = state.views[:-1] + (replace(mem, seg=MemSegment(builder, mem.base)),)
            self._set_state(ShardState(views, state.next_row_id))
        self._broken_builder = False

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

    def put_many(self, items: list[tuple[int, bytes, dict, bytes | None]],
                 serialize: Callable[[dict, bytes | None], tuple[dict, bytes]] | None = None,
                 generated: set[int] | frozenset[int] = frozenset(),
                 ) -> tuple[list[tuple[int, SchemaError]], list[int], list[tuple[int, bytes, dict, bytes | None, int]]]:
        """Upsert ``(caller index, id key, document, document bytes)`` items atomically.

        ``serialize(document, bytes or None) -> (document, bytes)`` (or SchemaError) is
        called on each item right before it is indexed, while the document is in the CPU
        cache (see documents.serialize); without it every item must carry its bytes.
        Returns the per-item errors (serializing or indexing), the caller indices of the
        items that replaced a stored document (or an earlier item of the same call; every
        other item is new), and the items as serialized, each with its row offset in the
        active segment appended (-1: not stored, see the errors). ``generated``: the caller
        indices of items whose ``_id`` was just generated (80 random bits after a time, see
        documents._IdPool), which cannot be stored yet: their ``_id`` index is not read (1.6
        us a TSBS row). All of them are durable when this returns. Raises StorageError (and
        stores nothing) when the write fails.
        """
        errors: list[tuple[int, SchemaError]] = []
        replaced: list[int] = []
        with self._write_lock, self._failing(f"writing {len(items)} documents"):
            self._check_writable()
            self._rotate_if_full()
            state = self._state
            mem_view = state.views[-1]
            builder = mem_view.seg.builder
            base = mem_view.seg.base
            old = self._stored_rows([it[1] for it in items], [it[0] in generated for it in items])
            self._broken_builder = True  # until the write below succeeded
            items = self._index_docs(builder, items, serialize, errors)
            stored = [it for it in items if it[4] >= 0]
            if stored:
                if stored[-1][4] - stored[0][4] != len(stored) - 1:
                    raise CorruptionError(f"shard {self.index}: the builder gave offsets {stored[0][4]}.."
                                          f"{stored[-1][4]} to {len(stored)} documents")
                self._write_rows(state, base + stored[0][4], [it[1] for it in stored], [it[3] for it in stored],
                                 [o for it, o in zip(items, old) if it[4] >= 0], replaced, [it[0] for it in stored])
            self._broken_builder = False
        return errors, replaced, items

    def put_columns(self, names: list[str], arrays: list, id_keys: list[bytes], raws: list[bytes],
                    generated: list[bool]) -> list[int]:
        """Upsert rows given column-wise (``SegmentBuilder.add_columns``; ``rtindex.columnar``
        prepares them), each row's id key and JSON bytes, and whether its ``_id`` was just
        generated (its ``_id`` index is not read), atomically: all are durable when this
        returns, or none (StorageError). ``rtindex.columnar.prepare`` lets through only
        columns the builder takes. Returns the positions
        of the rows that replaced a stored document or an earlier row of the call."""
        replaced: list[int] = []
        with self._write_lock, self._failing(f"writing {len(id_keys)} documents"):
            self._check_writable()
            self._rotate_if_full()
            state = self._state
            mem_view = state.views[-1]
            old = self._stored_rows(id_keys, generated)
            with self._mem_lock:
                first = mem_view.seg.builder.add_columns(names, arrays)  # all or nothing
            self._broken_builder = True  # until the write below succeeded
            self._write_rows(state, mem_view.seg.base + first, id_keys, raws, old, replaced, range(len(id_keys)))
            self._broken_builder = False
        return replaced

    def _stored_rows(self, id_keys: list[bytes], fresh: list[bool]) -> list[bytes | None]:
        """The ``_id`` index value (a row id) of each id key, None where none is stored.
        ``fresh``: which ids were just generated (80 random bits after a time, which cannot
        be stored yet): they are not read (1.6 us a TSBS row)."""
        if not any(fresh):
            return self.store.multi_get("ids", id_keys)
        got = iter(self.store.multi_get("ids", [k for k, f in zip(id_keys, fresh) if not f]))
        return [None if f else next(got) for f in fresh]

    def _write_rows(self, state: ShardState, first: int, id_keys: list[bytes], raws: list[bytes],
                    old: list[bytes | None], replaced: list[int], tags) -> None:
        """Store rows just indexed into the active builder from row id ``first`` on: the
        rows, their ``_id`` index entries, delete records of the rows they replace (``old``:
        the ``_id`` index values read before, None for new ids) and the next row id, in one
        write; then publish them. Appends to ``replaced`` the ``tags`` of the rows that
        replaced one (a stored row, or an earlier one of these)."""
        next_row = first + len(id_keys)
        if first != state.next_row_id:
            raise CorruptionError(f"shard {self.index}: rows from {first} assigned, {state.next_row_id} expected")
        rid_keys = list(map(u64, range(first, next_row)))
        wb = self.store.batch()
        wb.put_all("rows", rid_keys, raws)
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
        seq = self._log(wb, dels)
        self.store.write(wb)
        self._log_seq = seq
        self._publish(state, next_row, dels)

    @property
    def change_count(self) -> int:
        """The change counter after the last published write (see rtindex/fence.py)."""
        return self._signal.count

    def _index_docs(self, builder, items, serialize, errors) -> list[tuple]:
        """Serialize (when ``serialize`` is given) and index each item's document into the
        active builder: the items with their offset appended, -1 if rejected.

        Items go 32 at a time: serialized, then indexed while still in the CPU cache under
        the lock that keeps readers off the builder, so a reader waits for at most a few
        documents, and ingest does not pay a lock round trip per document.
        """
        out = []
        add = builder.add
        for start in range(0, len(items), 32):
            part = []
            for idx, id_key, doc, raw in items[start : start + 32]:
                if serialize is not None:
                    try:
                        doc, raw = serialize(doc, raw)
                    except SchemaError as e:
                        errors.append((idx, e))
                        raw = None
                part.append((idx, id_key, doc, raw))
            with self._mem_lock:
                for idx, id_key, doc, raw in part:
                    off = -1
                    if raw is not None:
                        try:
                            off = add(doc)
                        except SchemaError as e:
                            errors.append((idx, e))
                    out.append((idx, id_key, doc, raw, off))
        return out

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
        self._set_state(ShardState(tuple(views), next_row))
        self._signal.bump(next_row)
        if self._is_full(self._state) and self._pending_seals(self._state) < self.config.max_pending_seals:
            self._set_state(self._rotated(self._state))

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

    def _rotated(self, state: ShardState) -> ShardState:
        """``state`` with a fresh active builder; the full one goes to the sealer."""
        fresh = View(MemSegment(SegmentBuilder(self.config.max_depth), state.next_row_id), 0, EMPTY)
        self.maintenance.seal_later()
        return ShardState(state.views + (fresh,), state.next_row_id)

    def seal_now(self) -> None:
        """Rotate the mutable segment out (if it has rows) so that it gets sealed."""
        with self._write_lock:
            self._check_writable()
            if self._state.views[-1].limit:
                self.maintenance.wait_for_seal_slot()
                self._set_state(self._rotated(self._state))

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
            self._signal.bump(self._state.next_row_id)

    def signal(self) -> None:
        self._signal.bump(self._state.next_row_id)

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
        try:
            self.store.close()
        finally:
            self._signal.close()
