"""The only importer of rocksdict: one RocksDB instance per shard, with column families.

Column families (the key layout is in docs/architecture.md):
  rows      row id (u64 BE)            -> document (orjson bytes)
  ids       encoded _id                -> current row id (u64 BE)
  postings  segment id + first term    -> a block of (term, posting list) entries
  columns   segment id + column key    -> Arrow IPC stream of one column
  meta      small records: next row id, segment descriptors, delete records
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Iterable, Iterator

from rocksdict import (
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    IngestExternalFileOptions,
    Options,
    Rdict,
    ReadOptions,
    SstFileWriter,
    WriteBatch,
    WriteBufferManager,
    WriteOptions,
)

from rtindex.errors import ClosedError, StorageError

CFS = ("rows", "ids", "postings", "columns", "meta")


def _options(block_cache: Cache | None, wbm: WriteBufferManager | None) -> Options:
    o = Options(raw_mode=True)
    o.create_if_missing(True)
    o.create_missing_column_families(True)
    o.set_compression_type(DBCompressionType.lz4())
    o.set_max_background_jobs(2)
    o.set_write_buffer_size(16 << 20)
    if wbm is not None:
        o.set_write_buffer_manager(wbm)
    o.set_keep_log_file_num(2)
    # bounded file handles per shard (RocksDB's default keeps every SST file open, and a
    # database has many shards; index and filter blocks live in the block cache anyway)
    o.set_max_open_files(MAX_OPEN_FILES)
    t = BlockBasedOptions()
    if block_cache is not None:
        t.set_block_cache(block_cache)
    t.set_bloom_filter(10, False)
    t.set_cache_index_and_filter_blocks(True)
    o.set_block_based_table_factory(t)
    return o


MAX_OPEN_FILES = 256


def new_block_cache(nbytes: int) -> Cache:
    """One LRU block cache shared by every shard of a database."""
    return Cache(nbytes)


def new_write_buffer_manager(nbytes: int) -> WriteBufferManager:
    """One memtable budget shared by every shard (and column family) of a database: without
    it, memtables alone could take shards x 5 column families x 2 x 16 MB."""
    return WriteBufferManager(nbytes, False)


class Store:
    """A RocksDB instance with rtindex's column families; thin, thread-safe, typed errors."""

    def __init__(self, path: str, *, sync: bool = False, block_cache: Cache | None = None,
                 write_buffers: WriteBufferManager | None = None):
        self.path = path
        if os.path.isdir(path):  # SST files a crash left before they were ingested
            for name in os.listdir(path):
                if name.startswith("ingest-") and name.endswith(".sst"):
                    os.remove(os.path.join(path, name))
        opts = _options(block_cache, write_buffers)
        try:
            self._db = Rdict(path, options=opts,
                             column_families={cf: _options(block_cache, write_buffers) for cf in CFS})
            self._cf = {cf: self._db.get_column_family(cf) for cf in CFS}
            self._h = {cf: self._db.get_column_family_handle(cf) for cf in CFS}
        except Exception as e:
            raise StorageError(f"cannot open RocksDB at {path}: {e} (is another process using it?)") from e
        self._opts = opts
        self._sst_seq = itertools.count()
        self._wo = WriteOptions()
        self._wo.sync = sync
        self._closed = False
        self._lock = threading.Lock()

    def _check(self) -> None:
        if self._closed:
            raise ClosedError(f"storage at {self.path} is closed")

    def batch(self) -> "Batch":
        return Batch(self._h)

    def write(self, batch: "Batch") -> None:
        """Apply ``batch`` atomically through the WAL (all column families at once)."""
        self._check()
        try:
            self._db.write(batch.wb, self._wo)
        except Exception as e:
            raise StorageError(f"write failed at {self.path}: {e}") from e

    def ingest_sorted(self, cf: str, items: Iterable[tuple[bytes, bytes]]) -> int:
        """Write (key, value) pairs given in increasing key order straight into an SST file and
        add it to column family ``cf`` atomically; returns how many were written.

        For bulk data (a sealed or merged segment): no WAL, no memtable, no later flush, so it
        costs a fraction of a WriteBatch, and rocksdict holds the GIL through either. The file
        is durable once ingested; what points at it is written afterwards by the caller.
        """
        self._check()
        path = os.path.join(self.path, f"ingest-{os.getpid()}-{next(self._sst_seq)}.sst")
        n = 0
        try:
            w = SstFileWriter(options=self._opts)
            w.open(path)
            for k, v in items:
                w[k] = v
                n += 1
            if n:
                w.finish()
                opts = IngestExternalFileOptions()
                opts.set_move_files(True)
                self._cf[cf].ingest_external_file([path], opts)
        except Exception as e:
            raise StorageError(f"bulk write failed at {self.path}: {e}") from e
        finally:
            if os.path.exists(path):
                os.remove(path)
        return n

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
        it = self._cf[cf].iter(ro)
        it.seek(lo)
        while it.valid():
            yield it.key(), it.value()
            it.next()

    def scan_keys(self, cf: str, lo: bytes, hi: bytes) -> list[bytes]:
        """Keys k with lo <= k < hi, in order, without reading values."""
        self._check()
        ro = ReadOptions()
        ro.set_iterate_upper_bound(hi)
        it = self._cf[cf].iter(ro)
        it.seek(lo)
        out = []
        while it.valid():
            out.append(it.key())
            it.next()
        return out

    def last_key(self, cf: str) -> bytes | None:
        self._check()
        it = self._cf[cf].iter(ReadOptions())
        it.seek_to_last()
        return it.key() if it.valid() else None

    def approximate_size(self) -> int:
        total = 0
        for cf in CFS:
            try:
                for prop in ("rocksdb.total-sst-files-size", "rocksdb.cur-size-all-mem-tables"):
                    total += self._cf[cf].property_int_value(prop) or 0
            except Exception:
                pass
        return total

    def flush(self) -> None:
        self._check()
        self._db.flush()

    def close(self) -> None:
        with self._lock:
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
    """A WriteBatch that knows the column family handles."""

    __slots__ = ("wb", "_h", "n")

    def __init__(self, handles):
        self.wb = WriteBatch(raw_mode=True)
        self._h = handles
        self.n = 0

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        self.wb.put(key, value, self._h[cf])
        self.n += 1

    def delete(self, cf: str, key: bytes) -> None:
        self.wb.delete(key, self._h[cf])
        self.n += 1

    def delete_range(self, cf: str, lo: bytes, hi: bytes) -> None:
        """Delete every key k with lo <= k < hi."""
        self.wb.delete_range(lo, hi, self._h[cf])
        self.n += 1
