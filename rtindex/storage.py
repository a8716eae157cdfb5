"""The only importer of rocksdict: one RocksDB instance per shard, with column families.

Column families (the key layout is in rtindex/keys.py and docs/architecture.md):
  rows      row id (u64 BE)            -> document (orjson bytes)
  ids       encoded _id                -> current row id (u64 BE)
  meta      small records: next row id, segment descriptors, delete records, change log

Sealed segments' postings and columns are not here: they are immutable files of their own
(rtindex/segfile.py), so dropping a segment frees its disk space at once.

A shard is opened by one writer (``role="writer"``) and any number of followers in other
processes (``role="secondary"``: a RocksDB secondary instance that sees the writer's data
as of its last :meth:`Store.catch_up`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from itertools import repeat
from typing import Iterator

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    BottommostLevelCompaction,
    Cache,
    CompactOptions,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteBufferManager,
    WriteOptions,
)

from rtindex.errors import ClosedError, StorageError

log = logging.getLogger("rtindex")

CFS = ("rows", "ids", "meta")
MAX_OPEN_FILES = 256
MAX_WAL_BYTES = 64 << 20
LOG_FILE_BYTES = 1 << 20
# A write that RocksDB would stall (memtables full while a flush runs, or a flush that
# failed on a full disk) is retried for this long, then reported: a writer never hangs.
STALL_SECONDS = 10.0


def _options(block_cache: Cache | None, wbm: WriteBufferManager | None, *, create: bool,
             secondary: bool, memtable_bloom: bool = False, bloom: bool = True) -> Options:
    o = Options(raw_mode=True)
    if memtable_bloom:
        # a Bloom filter over each memtable's whole keys: ingest looks every given _id up, and
        # a new one (most) is then refused without searching the memtable's skip list
        o.set_memtable_prefix_bloom_ratio(0.1)
        o.set_memtable_whole_key_filtering(True)
    o.create_if_missing(create)
    o.create_missing_column_families(create)
    # LZ4 primed with a 16 KiB dictionary sampled from each SST file: rows much smaller
    # than plain LZ4 for a slightly dearer uncached get; ZSTD is smaller still but its gets
    # are far slower, and LZ4HC (the same decoder) compresses on the core the sealer needs,
    # which slows ingest (measured: docs/benchmarks.md, "Ingest"). One type for every
    # level: row ids only grow, so compactions move files down without rewriting them and
    # a bottommost-only setting would never apply.
    o.set_compression_type(DBCompressionType.lz4())
    o.set_compression_options(-14, 0, 0, 16 << 10)
    o.set_max_background_jobs(2)
    o.set_write_buffer_size(16 << 20)
    if wbm is not None:
        o.set_write_buffer_manager(wbm)
    # RocksDB's info LOG gets a few KB per flush and rolls only when the instance is opened:
    # a long-running writer's grew without bound. It rolls at 1 MiB; two files are kept.
    o.set_max_log_file_size(LOG_FILE_BYTES)
    o.set_keep_log_file_num(2)
    # the ids and meta column families take small writes and rarely fill a memtable, and an
    # unflushed one keeps every WAL file since its oldest entry: cap the WAL, which makes
    # RocksDB flush them (without it, WALs grow without bound under sustained upserts)
    o.set_max_total_wal_size(MAX_WAL_BYTES)
    if secondary:
        # a secondary must keep every file it reads open (the writer deletes files that
        # compactions replaced), and by default each catch-up starts 15 file-opening
        # threads, which makes even an idle catch-up costly (docs/benchmarks.md, "Read
        # replicas")
        o.set_max_open_files(-1)
        o.set_max_file_opening_threads(1)
    else:
        o.set_max_open_files(MAX_OPEN_FILES)
    t = BlockBasedOptions()
    if block_cache is not None:
        t.set_block_cache(block_cache)
    if bloom:
        t.set_bloom_filter(10, False)
    t.set_cache_index_and_filter_blocks(True)
    o.set_block_based_table_factory(t)
    return o


def _wal_numbers(path: str) -> set[int]:
    """The numbers of the WAL files (``000123.log``) in the RocksDB directory ``path``."""
    return {int(name[:-4]) for name in os.listdir(path) if name.endswith(".log") and name[:-4].isdigit()}


def new_block_cache(nbytes: int) -> Cache:
    """One LRU block cache shared by every shard of a database."""
    return Cache(nbytes)


class WriteBuffers:
    """One memtable budget shared by every shard (and column family) of a database (without
    it, memtables alone could take shards x 3 column families x 2 x 16 MB), and the flushing
    of idle shards' memtables that RocksDB leaves out.

    When a write finds the budget spent, RocksDB flushes the memtables of the instance being
    written, never another's. So a collection that was loaded and then left alone keeps its
    share until it is closed, and every later write anywhere else flushes memtables of about
    one write each: many tiny SST files, to be compacted later. Here, a write that finds the
    budget 7/8 spent (checked at most every CHECK_SECONDS) has the memtables of other
    collections' stores not written for IDLE_SECONDS flushed in the background, the largest
    first, until 3/4 of the budget would be left. The shards of the collection being written
    are left to RocksDB: while a batch goes to one shard the others wait, and flushing them
    as idle would multiply the flushes for no gain (measured: docs/benchmarks.md, "Ingest").
    """

    IDLE_SECONDS = 0.2
    CHECK_SECONDS = 0.05
    MIN_FLUSH_BYTES = 1 << 20

    def __init__(self, nbytes: int):
        self.manager = WriteBufferManager(nbytes, False)
        self._high = nbytes * 7 // 8
        self._low = nbytes * 3 // 4
        self._stores: weakref.WeakSet[Store] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._checked = 0.0

    def register(self, store: "Store") -> None:
        with self._lock:
            self._stores.add(store)

    def after_write(self, writer: "Store") -> None:
        """Called by ``writer`` after each write: flush idle stores' memtables if the budget
        is nearly spent."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked < self.CHECK_SECONDS:
                return
            self._checked = now
            usage = self.manager.get_usage()
            if usage < self._high:
                return
            excess = usage - self._low  # what to flush to bring the budget back to 3/4
            idle = [st for st in self._stores
                    if st.group != writer.group and now - st.last_write >= self.IDLE_SECONDS]
        # the largest first, and only as many as bring the budget back to 3/4; none holding
        # less than MIN_FLUSH_BYTES, which would become an SST file of a few KB
        for nbytes, st in sorted(((st.memtable_bytes(), st) for st in idle), key=lambda t: -t[0]):
            if excess <= 0 or nbytes < self.MIN_FLUSH_BYTES:
                break
            st.flush_memtables(wait=False)
            excess -= nbytes


class Store:
    """A RocksDB instance with rtindex's column families; thin, thread-safe, typed errors."""

    def __init__(self, path: str, *, create: bool = False, sync: bool = False, block_cache: Cache | None = None,
                 write_buffers: WriteBuffers | None = None, secondary_path: str | None = None):
        self.path = path
        self.sync = sync  # each write fsyncs the WAL (files written beside it must be synced too)
        self.secondary = secondary_path is not None
        wbm = None if write_buffers is None else write_buffers.manager
        opts = _options(block_cache, wbm, create=create, secondary=self.secondary)
        # no Bloom filter on rows: a row is read by a row id the index gave, which exists, so
        # the filter never spares a read; it took 10 bits a row on disk and in the block cache
        cf_opts = {cf: _options(block_cache, wbm, create=create, secondary=self.secondary,
                                memtable_bloom=cf == "ids", bloom=cf != "rows") for cf in CFS}
        try:
            if self.secondary:
                self._open_secondary = lambda: Rdict(path, options=opts, column_families=cf_opts,
                                                     access_type=AccessType.secondary(secondary_path))
                self._wal_tail = max(_wal_numbers(path), default=0)  # listed before the open: see catch_up
                self._db = self._open_secondary()
            else:
                self._db = Rdict(path, options=opts, column_families=cf_opts)
            self._cf = {cf: self._db.get_column_family(cf) for cf in CFS}
            self._h = {cf: self._db.get_column_family_handle(cf) for cf in CFS}
        except Exception as e:
            hint = "is another process writing it?" if not self.secondary else "is it an rtindex shard?"
            raise StorageError(f"cannot open RocksDB at {path}: {e} ({hint})") from e
        self._wo = WriteOptions()
        self._wo.sync = sync
        self._wo.no_slowdown = True  # stalls come back as errors: we retry them with a deadline
        self._closed = False
        self._lock = threading.Lock()
        self._compaction = threading.Lock()  # held by a compaction: close() waits for it
        self.last_write = time.monotonic()
        self.group = os.path.dirname(os.path.abspath(path))  # the collection, for WriteBuffers
        self._buffers = write_buffers
        if write_buffers is not None:
            write_buffers.register(self)

    def _check(self) -> None:
        if self._closed:
            raise ClosedError(f"storage at {self.path} is closed")

    def batch(self) -> "Batch":
        return Batch()

    def write(self, batch: "Batch") -> None:
        """Apply ``batch`` atomically through the WAL (all column families at once).

        A stall is retried with backoff for up to STALL_SECONDS; any other failure (a full
        disk, an I/O error) raises StorageError at once, and nothing of the batch is applied.
        RocksDB recovers from a full disk by itself once space is free, so a later write
        succeeds without a reopen.
        """
        self._check()
        deadline = None
        pause = 0.0005
        while True:
            try:
                self._db.write(batch.build(self._h), self._wo)
                break
            except Exception as e:
                if self._closed:
                    raise ClosedError(f"storage at {self.path} is closed") from e
                if "Write stall" not in str(e):
                    raise StorageError(f"write failed at {self.path}: {e}") from e
                now = time.monotonic()
                if deadline is None:
                    deadline = now + STALL_SECONDS
                elif now > deadline:
                    raise StorageError(f"write failed at {self.path}: RocksDB stalled writes for {STALL_SECONDS:.0f} s "
                                       f"(is the disk full, or far too slow?): {e}") from e
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
        self.last_write = time.monotonic()
        if self._buffers is not None:
            try:
                self._buffers.after_write(self)
            except Exception as e:  # the write is done: flushing other shards only frees memory sooner
                log.warning("rtindex: after a write at %s, flushing idle shards failed: %s", self.path, e)

    def get(self, cf: str, key: bytes) -> bytes | None:
        self._check()
        try:
            return self._cf[cf].get(key)
        except Exception as e:
            raise StorageError(f"read failed at {self.path}: {e}") from e

    def multi_get(self, cf: str, keys: list[bytes]) -> list[bytes | None]:
        self._check()
        if not keys:
            return []
        try:
            return self._cf[cf].get(keys)
        except Exception as e:
            raise StorageError(f"read failed at {self.path}: {e}") from e

    def scan(self, cf: str, lo: bytes, hi: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Yield (key, value) for lo <= key < hi, in key order (a consistent iterator view)."""
        self._check()
        ro = ReadOptions()
        if hi is not None:
            ro.set_iterate_upper_bound(hi)
        try:
            it = self._cf[cf].iter(ro)
            it.seek(lo)
            while it.valid():
                yield it.key(), it.value()
                it.next()
        except ClosedError:
            raise
        except Exception as e:
            raise StorageError(f"read failed at {self.path}: {e}") from e

    def scan_keys(self, cf: str, lo: bytes, hi: bytes) -> list[bytes]:
        """Keys k with lo <= k < hi, in order, without reading values."""
        self._check()
        ro = ReadOptions()
        ro.set_iterate_upper_bound(hi)
        try:
            it = self._cf[cf].iter(ro)
            it.seek(lo)
            out = []
            while it.valid():
                out.append(it.key())
                it.next()
            return out
        except Exception as e:
            raise StorageError(f"read failed at {self.path}: {e}") from e

    def catch_up(self) -> int:
        """A secondary: apply what the writer has written since the last call; returns the
        latest sequence number (unchanged means nothing new).

        A secondary skips a WAL file the writer deleted (its writes are in SST files by
        then), but what it had replayed of that file stays in its memtables and hides newer
        values of the same keys (from gets, and from iterators once the flushed files are
        compacted). So when the newest WAL file listed before the last catch-up is gone (they
        go oldest first), the secondary is opened again from the current files.
        """
        self._check()
        try:
            tail = max(_wal_numbers(self.path), default=0)
            self._db.try_catch_up_with_primary()
            stale = self._wal_tail not in _wal_numbers(self.path)
        except Exception as e:
            raise StorageError(f"cannot follow the writer of {self.path}: {e}") from e
        if stale:
            log.info("rtindex: the writer of %s deleted a WAL file this reader may not have read to its end: "
                     "opening its RocksDB secondary again", self.path)
            try:
                db = self._open_secondary()
            except Exception as e:
                raise StorageError(f"cannot follow the writer of {self.path}: it deleted a WAL file this reader "
                                   f"had not read to its end, and opening the reader's RocksDB secondary again "
                                   f"failed: {e} (tried again at the next catch-up)") from e
            with self._lock:  # reads under way finish on the instance they began with
                self._check()
                self._db = db
                self._cf = {cf: db.get_column_family(cf) for cf in CFS}
                self._h = {cf: db.get_column_family_handle(cf) for cf in CFS}
        self._wal_tail = tail
        try:
            return self._db.latest_sequence_number()
        except Exception as e:
            raise StorageError(f"cannot follow the writer of {self.path}: {e}") from e

    def approximate_size(self) -> int:
        total = 0
        for cf in CFS:
            try:
                for prop in ("rocksdb.total-sst-files-size", "rocksdb.cur-size-all-mem-tables"):
                    total += self._cf[cf].property_int_value(prop) or 0
            except Exception:
                pass
        return total

    def memtable_bytes(self) -> int:
        """Bytes in the active memtables of every column family (a few KB when they are
        empty; 0 once closed)."""
        with self._lock:
            if self._closed:
                return 0
            return sum(self._cf[cf].property_int_value("rocksdb.cur-size-active-mem-table") or 0 for cf in CFS)

    def flush_memtables(self, wait: bool = True) -> None:
        """Write every column family's memtable to an SST file (``wait=False``: schedule it
        on RocksDB's background threads). Quietly nothing once closed: an idle store may be
        closed while another's write decides to flush it."""
        with self._lock:
            if self._closed:
                return
            try:
                for cf in CFS:
                    self._cf[cf].flush(wait)
            except Exception as e:
                raise StorageError(f"flush failed at {self.path}: {e}") from e

    def sst_bytes(self, cf: str) -> int:
        """Bytes of the SST files of ``cf``."""
        self._check()
        try:
            return self._cf[cf].property_int_value("rocksdb.total-sst-files-size") or 0
        except Exception as e:
            raise StorageError(f"read failed at {self.path}: {e}") from e

    def compact(self, cf: str, lo: bytes | None = None, hi: bytes | None = None) -> None:
        """Compact the keys ``lo`` .. ``hi`` of ``cf`` now (None: from the first, to the
        last): the space of deleted and replaced keys comes back at once instead of at
        RocksDB's next compaction of those files (which an idle collection may never run).
        The last level is rewritten too: a file moved down to it whole keeps its tombstones.
        RocksDB does the work without the GIL; close() waits for it."""
        opts = CompactOptions()
        opts.set_bottommost_level_compaction(BottommostLevelCompaction.force_optimized())
        with self._compaction:
            self._check()
            try:
                self._cf[cf].compact_range(lo, hi, opts)
            except Exception as e:
                raise StorageError(f"compaction failed at {self.path}: {e}") from e

    def close(self) -> None:
        with self._compaction, self._lock:
            if self._closed:
                return
            self._closed = True
            # RocksDB releases its lock only when no column family object refers to it
            self._cf.clear()
            self._h.clear()
            try:
                self._db.close()
            except Exception as e:
                raise StorageError(f"close failed at {self.path}: {e}") from e


class Batch:
    """Writes to apply atomically: kept as a list, because RocksDB consumes a WriteBatch
    even when writing it fails, and a stalled write is tried again."""

    __slots__ = ("ops",)

    def __init__(self):
        self.ops: list[tuple[int, str, bytes, bytes]] = []

    @property
    def n(self) -> int:
        """Whether it holds anything (truthy), as the number of ops (a put_all counts once)."""
        return len(self.ops)

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        self.ops.append((0, cf, key, value))

    def put_all(self, cf: str, keys: list[bytes], values: list[bytes]) -> None:
        """``put`` of each key with its value: one op, built in a C loop (ingest writes two
        keys a document, and a Python loop over them is a cost per document)."""
        self.ops.append((3, cf, keys, values))

    def delete(self, cf: str, key: bytes) -> None:
        self.ops.append((1, cf, key, b""))

    def delete_range(self, cf: str, lo: bytes, hi: bytes) -> None:
        """Delete every key k with lo <= k < hi."""
        self.ops.append((2, cf, lo, hi))

    def build(self, handles) -> WriteBatch:
        wb = WriteBatch(raw_mode=True)
        for op, cf, a, b in self.ops:
            if op == 0:
                wb.put(a, b, handles[cf])
            elif op == 3:
                deque(map(wb.put, a, b, repeat(handles[cf])), 0)
            elif op == 1:
                wb.delete(a, handles[cf])
            else:
                wb.delete_range(a, b, handles[cf])
        return wb
