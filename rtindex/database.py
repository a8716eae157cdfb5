"""Database: a directory of collections, opened by one process at a time."""

from __future__ import annotations

import builtins
import os
import re
import shutil
import threading
from typing import Any

import orjson

from rtindex.background import Worker
from rtindex.collection import Collection
from rtindex.documents import Limits
from rtindex.result import Result
from rtindex.rowcache import RowStoreCache
from rtindex.sql.engine import Plan, SqlEngine
from rtindex.errors import AlreadyExistsError, ClosedError, NotFoundError, StorageError
from rtindex.shard import ShardConfig
from rtindex.storage import new_block_cache, new_write_buffer_manager

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,127}$")
COLLECTIONS_DIR = "collections"
MANIFEST = "collection.json"


class Database:
    """An open rtindex database. Use :func:`rtindex.open`; close it (or use ``with``)."""

    def __init__(self, path: str, *, create: bool = True, sync: bool = False,
                 block_cache_bytes: int = 256 << 20, write_buffer_bytes: int = 256 << 20, max_document_bytes: int = 4 << 20,
                 max_depth: int = 64, seal_rows: int = 25_000, seal_bytes: int = 96 << 20,
                 merge_factor: int = 4, row_cache_bytes: int = 256 << 20):
        self.path = os.path.abspath(path)
        if not os.path.isdir(self.path):
            if not create:
                raise NotFoundError(f"no database at {self.path} (pass create=True to make one)")
            os.makedirs(self.path, exist_ok=True)
        os.makedirs(os.path.join(self.path, COLLECTIONS_DIR), exist_ok=True)
        if max_depth < 1 or max_document_bytes < 16 or seal_rows < 1 or merge_factor < 2:
            raise ValueError("max_depth, max_document_bytes, seal_rows and merge_factor must be positive "
                             "(merge_factor at least 2)")
        self.sync = sync
        self._limits = Limits(max_document_bytes=max_document_bytes, max_depth=max_depth)
        self._config = ShardConfig(seal_rows=seal_rows, seal_bytes=seal_bytes, merge_factor=merge_factor,
                                   max_depth=max_depth)
        self._block_cache = new_block_cache(block_cache_bytes)
        self._write_buffers = new_write_buffer_manager(write_buffer_bytes)
        if isinstance(row_cache_bytes, bool) or not isinstance(row_cache_bytes, int) or row_cache_bytes < 0:
            raise ValueError(f"row_cache_bytes must be a non-negative int (0 turns the cache off), not {row_cache_bytes!r}")
        self._row_cache = RowStoreCache(row_cache_bytes)
        self._sealer = Worker("sealer")
        self._merger = Worker("merger")
        self._collections: dict[str, Collection] = {}
        self._lock = threading.RLock()
        self._closed = False
        self._sql = SqlEngine(self)
        try:
            for name in sorted(os.listdir(os.path.join(self.path, COLLECTIONS_DIR))):
                if os.path.exists(os.path.join(self._coll_path(name), MANIFEST)):
                    self._open_collection(name)
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"<rtindex.Database {self.path!r} collections={sorted(self._collections)}>"

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check(self) -> None:
        if self._closed:
            raise ClosedError(f"database {self.path} is closed")

    def _coll_path(self, name: str) -> str:
        return os.path.join(self.path, COLLECTIONS_DIR, name)

    def _open_collection(self, name: str) -> Collection:
        with builtins.open(os.path.join(self._coll_path(name), MANIFEST), "rb") as f:
            manifest = orjson.loads(f.read())
        coll = Collection(self, name, self._coll_path(name), manifest["shards"], self._config, self._limits)
        self._collections[name] = coll
        return coll

    def create_collection(self, name: str, shards: int = 4, exist_ok: bool = False) -> Collection:
        """Create a collection of ``shards`` shards (fixed for its lifetime)."""
        self._check()
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"invalid collection name {name!r}: use letters, digits, _ and -, "
                             "starting with a letter or _ (at most 128 characters)")
        if not isinstance(shards, int) or not 1 <= shards <= 1024:
            raise ValueError(f"shards must be an integer from 1 to 1024, not {shards!r}")
        with self._lock:
            if name in self._collections:
                if exist_ok:
                    return self._collections[name]
                raise AlreadyExistsError(f"collection {name!r} already exists")
            path = self._coll_path(name)
            os.makedirs(path, exist_ok=True)
            tmp = os.path.join(path, MANIFEST + ".tmp")
            with builtins.open(tmp, "wb") as f:
                f.write(orjson.dumps({"shards": shards, "format": 1}))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, os.path.join(path, MANIFEST))
            return self._open_collection(name)

    def collection(self, name: str) -> Collection:
        """An existing collection (NotFoundError if there is none)."""
        self._check()
        try:
            return self._collections[name]
        except KeyError:
            raise NotFoundError(f"no collection {name!r} (create it with db.create_collection({name!r}))") from None

    __getitem__ = collection

    def __contains__(self, name: str) -> bool:
        return name in self._collections

    def collection_names(self) -> list[str]:
        """Names of the collections, sorted."""
        self._check()
        return sorted(self._collections)

    def drop_collection(self, name: str) -> None:
        """Delete a collection and all its data."""
        self._check()
        with self._lock:
            coll = self.collection(name)
            coll._close()
            del self._collections[name]
            try:
                os.remove(os.path.join(coll.path, MANIFEST))
                shutil.rmtree(coll.path)
            except OSError as e:
                raise StorageError(f"cannot remove {coll.path}: {e}") from e

    def sql(self, sql: str, params: Any = None, *, access: str | None = None) -> Result:
        """Run one SELECT over a collection; see docs/sql.md for the dialect.

        ``params`` binds ``:name`` placeholders (a dict) or ``?`` placeholders (a list);
        values are never spliced into the text. ``access`` forces the "index" or "scan" path
        when the query can run on it (``Result.access`` tells which ran). Raises SqlError.
        """
        self._check()
        return self._sql.sql(sql, params, access)

    def explain(self, sql: str, params: Any = None, *, access: str | None = None) -> Plan:
        """The access path :meth:`sql` would choose, and the numbers behind the choice
        (matched rows and rows per predicate from the posting lists, estimated costs);
        ``str()`` of it is a readable report."""
        self._check()
        return self._sql.explain(sql, params, access)

    def stats(self) -> dict:
        """Per collection and shard: documents, segments, approximate disk bytes; and the
        RowStoreCache's counters (hits, misses, inserts, evictions, bytes, entries)."""
        self._check()
        return {"path": self.path, "collections": {n: c.stats() for n, c in self._collections.items()},
                "row_cache": self._row_cache.stats()}

    def close(self) -> None:
        """Finish background work and close every shard. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            errors = []
            for coll in self._collections.values():
                try:
                    coll._close()
                except Exception as e:  # close the others anyway
                    errors.append(e)
            self._sql.close()
            self._sealer.stop()
            self._merger.stop()
            if errors:
                raise errors[0]

    @property
    def closed(self) -> bool:
        return self._closed


def open(path: str, **options: Any) -> Database:  # noqa: A001 - the natural name, like lmdb.open
    """Open (by default creating) the database in directory ``path``.

    Options: ``create`` (True), ``sync`` (False: an acknowledged write survives a process
    crash; True: also a power loss, at the cost of an fsync per batch), ``block_cache_bytes``,
    ``write_buffer_bytes`` (RocksDB memtables of all shards together),
    ``max_document_bytes``, ``max_depth``, ``seal_rows``, ``seal_bytes``, ``merge_factor``,
    ``row_cache_bytes`` (256 MiB: the RowStoreCache of decoded rows shared by every
    collection; 0 turns it off).
    """
    return Database(path, **options)
