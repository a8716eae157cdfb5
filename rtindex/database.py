"""Database: a directory of collections, opened by one process at a time.

On disk: ``rtindex.json`` (the marker: format version, written last at creation, so a
directory without it is never mistaken for a database), ``writer.lock`` (flock'ed by the one
writing process) and ``collections/<name>/`` (``collection.json`` plus one RocksDB directory
per shard).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rtindex.background import Worker
from rtindex.chunkcache import ChunkCache
from rtindex.collection import Collection
from rtindex.documents import Limits
from rtindex.fence import Fence
from rtindex.jsonfile import read_json, write_json_atomic
from rtindex.follower import Follower
from rtindex.notify import WAKE_FILE, Wake
from rtindex.sql.result import Result
from rtindex.rowcache import RowStoreCache
from rtindex.sql.engine import SqlEngine
from rtindex.sql.plan import Plan
from rtindex.sql.parse import DEFAULT_WORKSPACE, collection_name
from rtindex.errors import (
    AlreadyExistsError,
    ClosedError,
    CorruptionError,
    InvalidArgumentError,
    LockedError,
    NotADatabaseError,
    NotFoundError,
    ReadOnlyError,
    StorageError,
)
from rtindex.runtime import Runtime
from rtindex.segments import ShardConfig
from rtindex.storage import WriteBuffers, new_block_cache
from rtindex.transform import Transformation

# a collection name: one part, or a workspace and a name (``ws.coll``, as Rockset's workspaces;
# each part at most 128 characters). The default workspace is no prefix: ``commons.coll``
# is the collection ``coll`` (in SQL, and through Database.collection).
_PART = r"[A-Za-z_][A-Za-z0-9_\-]{0,127}"
_NAME = re.compile(rf"{_PART}(?:\.{_PART})?")  # whole names: fullmatch
# and at most this long in all: the name is a directory name (255 bytes on common file
# systems), and a reader names its RocksDB secondaries "<name>-shard-<n>"
MAX_NAME = 240
COLLECTIONS_DIR = "collections"
MANIFEST = "collection.json"
MARKER = "rtindex.json"  # {"format": FORMAT, "created_by": "rtindex <version>"}
# the on-disk format this version reads and writes: 2 keeps sealed segments in files of their
# own (rtindex/segfile.py); format 1 (rtindex 0.1, no marker) kept them inside RocksDB
FORMAT = 2
LOCK_FILE = "writer.lock"
MAX_SHARDS = 1024
# Threads that index and write shards' parts of an ingest: while one holds the GIL to write
# RocksDB, another indexes without it (one more than that finds no free core on 2).
INDEXER_THREADS = 2
# Memory defaults: sized for a laptop beside a notebook;
# docs/benchmarks.md ("Memory defaults") has what each costs, docs/reference.md when to raise it
BLOCK_CACHE_BYTES = 64 << 20
WRITE_BUFFER_BYTES = 64 << 20
ROW_CACHE_BYTES = 64 << 20
COLUMN_CACHE_BYTES = 256 << 20
SEAL_BYTES = 32 << 20
MAX_RESULT_BYTES = 256 << 20
# what a crash in the middle of creating a database can leave in its directory: such a
# directory counts as empty (creating again there destroys nothing of anyone's)
_CREATION_LEFTOVERS = frozenset({LOCK_FILE, MARKER + ".tmp"})


def _created(manifest: dict) -> int:
    """A manifest's creation stamp (ns); 0 for collections made before it was recorded."""
    created = manifest.get("created", 0)
    return created if isinstance(created, int) and created >= 0 else 0


def _read_manifest(path: str) -> dict:
    """The manifest of the collection at ``path``, checked: a damaged one is a
    CorruptionError naming the file, never a bare JSONDecodeError or KeyError."""
    file = os.path.join(path, MANIFEST)
    manifest = read_json(file, "collection manifest")
    shards = manifest.get("shards")
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise CorruptionError(f"collection manifest {file} has shards={shards!r}, not an integer from 1 to "
                              f"{MAX_SHARDS}; restore it from a backup")
    fmt = manifest.get("format", FORMAT)
    if fmt != FORMAT:
        raise CorruptionError(f"collection manifest {file} has format {fmt!r}; this rtindex reads format "
                              f"{FORMAT} (upgrade rtindex, or restore the file from a backup)")
    return manifest


def _version() -> str:
    from rtindex import __version__  # at call time: rtindex/__init__.py imports this module

    return __version__


def _inspect_directory(path: str, create: bool) -> str:
    """What is at ``path``: "new" (nothing, or an empty folder: create there) or "database"
    (has the marker, of a format this version reads). Raises for anything else (a database
    of another format included), before anything is written there.
    """
    hint = "pass create=True to make one" if not create else "choose a new or empty directory"
    if not os.path.lexists(path):
        if not create:
            raise NotFoundError(f"no database at {path} ({hint})")
        return "new"
    if not os.path.isdir(path):
        raise NotADatabaseError(f"{path} is a file, not an rtindex database directory ({hint})")
    marker = os.path.join(path, MARKER)
    if os.path.exists(marker):
        info = read_json(marker, "database marker")
        fmt = info.get("format")
        if isinstance(fmt, bool) or not isinstance(fmt, int):
            raise CorruptionError(f"database marker {marker} has format {fmt!r}, not an integer; "
                                  f"restore it from a backup")
        if fmt != FORMAT:
            raise NotADatabaseError(
                f"database {path} has format {fmt} (made by {info.get('created_by', 'an unknown version')}); "
                f"rtindex {_version()} reads format {FORMAT} only: open it with a matching rtindex version")
        return "database"
    try:
        entries = set(os.listdir(path))
    except OSError as e:
        raise StorageError(f"cannot list {path}: {e}") from e
    if entries <= _CREATION_LEFTOVERS:
        if not create:
            raise NotADatabaseError(f"{path} is an empty directory, not an rtindex database ({hint})")
        return "new"
    if _is_legacy_database(path, entries):
        raise NotADatabaseError(f"{path} is an rtindex database of format 1 (made by rtindex 0.1, which kept "
                                f"segments inside RocksDB); rtindex {_version()} reads format {FORMAT} only: "
                                f"open it with rtindex 0.1, or ingest its data into a new database")
    if create:
        raise NotADatabaseError(f"{path} is not an rtindex database (it has no {MARKER}) and is not empty: "
                                f"refusing to create a database in it; choose a new or empty directory")
    raise NotADatabaseError(f"{path} is not an rtindex database (it has no {MARKER}); check the path: "
                            f"it must be the directory a database was created in")


def _is_legacy_database(path: str, entries: set[str]) -> bool:
    """A database made before the marker existed: only ``collections/`` (and our lock file)
    at the top, and in ``collections/`` only directories with collection names. Anything
    else in the folder means it is someone else's, and it is left alone.
    """
    if COLLECTIONS_DIR not in entries or not entries <= _CREATION_LEFTOVERS | {COLLECTIONS_DIR}:
        return False
    colls = os.path.join(path, COLLECTIONS_DIR)
    if not os.path.isdir(colls):
        return False
    try:
        names = os.listdir(colls)
    except OSError as e:
        raise StorageError(f"cannot list {colls}: {e}") from e
    return all(n == WAKE_FILE or (_NAME.fullmatch(n) and os.path.isdir(os.path.join(colls, n))) for n in names)


def check_new_collection(name: Any, shards: Any) -> None:
    """InvalidArgumentError for a name or a shard count no collection can be created with."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_NAME:
        raise InvalidArgumentError(f"invalid collection name {name!r}: use letters, digits, _ and -, starting "
                                   "with a letter or _ (at most 128 characters), optionally after a workspace "
                                   "and a dot, named by the same rules (workspace.collection, at most "
                                   f"{MAX_NAME} characters in all)")
    if collection_name(None, name) != name:
        short = collection_name(None, name)
        raise InvalidArgumentError(f"invalid collection name {name!r}: {DEFAULT_WORKSPACE} is the default "
                                   f"workspace; create the collection as {short!r} (queries may still say {name})")
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise InvalidArgumentError(f"shards must be an integer from 1 to {MAX_SHARDS}, not {shards!r}")


def _canonical(name: Any) -> Any:
    """The collection ``name`` refers to: ``commons.coll`` is ``coll`` (the default workspace)."""
    return collection_name(None, name) if isinstance(name, str) else name


class _WriterLock:
    """An exclusive ``flock`` on ``<db>/writer.lock``, held while a Database writes.

    RocksDB locks each shard, but a database without collections has no shard to lock, and
    two writers of one database must never both proceed: this lock is the database's own.
    The holder's pid is written into the file for the message the next writer gets. The
    kernel drops the lock when the process dies (kill -9 included), so no stale lock is
    ever left behind. A process that only reads does not construct one.
    """

    def __init__(self, db_path: str):
        self.path = os.path.join(db_path, LOCK_FILE)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise StorageError(f"cannot open the lock file {self.path}: {e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            try:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            finally:
                os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StorageError(f"cannot lock {self.path}: {e}") from e
            here = "; that is this process: close the other Database first" if holder == str(os.getpid()) else ""
            raise LockedError(f"database {db_path} is open for writing in another process or handle "
                              f"(pid {holder}{here}); one writer at a time", int(holder) if holder.isdigit() else None) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:  # the pid is only for messages; the lock is what counts
            pass
        self._fd: int | None = fd

    def release(self) -> None:
        """Unlock (idempotent). The file stays: unlinking it would let two writers lock two
        different files of the same name."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor releases the flock



READER_DIR = "rtindex-reader-"  # then the reader's process id, a dash, and mkdtemp's letters


def _reader_dir() -> str:
    """A new directory for a reader's RocksDB secondaries' own files. close() removes it; a
    reader killed first cannot, so the directories of readers whose process is gone are
    removed here."""
    tmp = tempfile.gettempdir()
    for entry in os.listdir(tmp):
        pid = entry[len(READER_DIR):].split("-")[0] if entry.startswith(READER_DIR) else ""
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(os.path.join(tmp, entry), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{READER_DIR}{os.getpid()}-")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True

class Database:
    """An open rtindex database. Use :func:`rtindex.open`; close it (or use ``with``)."""

    def __init__(self, path: str, *, role: str = "writer", create: bool = True, sync: bool = False,
                 block_cache_bytes: int = BLOCK_CACHE_BYTES, write_buffer_bytes: int = WRITE_BUFFER_BYTES,
                 max_document_bytes: int = 4 << 20, max_depth: int = 64, seal_rows: int = 25_000,
                 seal_bytes: int = SEAL_BYTES, merge_factor: int = 4, row_cache_bytes: int = ROW_CACHE_BYTES,
                 column_cache_bytes: int = COLUMN_CACHE_BYTES,
                 reader_grace_seconds: float = 30.0, max_result_bytes: int | None = MAX_RESULT_BYTES):
        self.path = os.path.abspath(path)
        if role not in ("writer", "reader"):
            raise InvalidArgumentError(f"role must be 'writer' or 'reader', not {role!r}")
        if isinstance(reader_grace_seconds, bool) or not isinstance(reader_grace_seconds, (int, float)) \
                or not reader_grace_seconds >= 0:
            raise InvalidArgumentError(f"reader_grace_seconds must be a number >= 0, not {reader_grace_seconds!r}")
        self.role = role
        # everything is checked before anything is written: a wrong path or a bad option
        # must leave the directory exactly as it was
        if max_depth < 1 or max_document_bytes < 16 or seal_rows < 1 or merge_factor < 2:
            raise InvalidArgumentError("max_depth, max_document_bytes, seal_rows and merge_factor must be positive "
                                       "(merge_factor at least 2)")
        for name, value in (("row_cache_bytes", row_cache_bytes), ("column_cache_bytes", column_cache_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(f"{name} must be a non-negative int (0 turns the cache off), not {value!r}")
        if max_result_bytes is not None and (isinstance(max_result_bytes, bool) or not isinstance(max_result_bytes, int)
                                             or max_result_bytes < 1):
            raise InvalidArgumentError(f"max_result_bytes must be a positive int, or None for no limit, "
                                       f"not {max_result_bytes!r}")
        kind = _inspect_directory(self.path, create and role == "writer")
        self.sync = sync
        self._limits = Limits(max_document_bytes=max_document_bytes, max_depth=max_depth)
        self._config = ShardConfig(seal_rows=seal_rows, seal_bytes=seal_bytes, merge_factor=merge_factor,
                                   max_depth=max_depth, reader_grace_seconds=float(reader_grace_seconds))
        self._row_cache = RowStoreCache(row_cache_bytes)
        self._column_cache = ChunkCache(column_cache_bytes)
        self._runtime = Runtime(self._config, self._limits, self._row_cache, self._column_cache,
                                new_block_cache(block_cache_bytes), WriteBuffers(write_buffer_bytes), sync)
        self._collections: dict[str, Collection] = {}
        self._lock = threading.RLock()
        self._closed = False
        self._sql = SqlEngine(self.collection, max_result_bytes)
        self._writer_lock: _WriterLock | None = None
        self._follower: Follower | None = None
        if role == "reader":
            self._open_reader()
            return
        self._runtime.sealer = Worker("sealer")
        self._runtime.merger = Worker("merger")
        self._runtime.indexers = tuple(ThreadPoolExecutor(1, thread_name_prefix=f"rtindex-indexer-{i}")
                                       for i in range(INDEXER_THREADS))
        try:
            if kind == "new":
                try:
                    os.makedirs(self.path, exist_ok=True)
                except OSError as e:
                    raise StorageError(f"cannot create the database directory {self.path}: {e}") from e
            self._writer_lock = _WriterLock(self.path)
            # again, now that no other writer can change it: what was empty a moment ago
            # may be a database another process just made
            kind = _inspect_directory(self.path, create)
            if kind != "database":  # new: mark it (last, once it is whole)
                try:
                    os.makedirs(os.path.join(self.path, COLLECTIONS_DIR), exist_ok=True)
                except OSError as e:
                    raise StorageError(f"cannot create {self._coll_path('')}: {e}") from e
                write_json_atomic(os.path.join(self.path, MARKER),
                                  {"format": FORMAT, "created_by": f"rtindex {_version()}"})
            self._runtime.wake = Wake(os.path.join(self.path, COLLECTIONS_DIR, WAKE_FILE), True)
            for name in self._collections_on_disk():
                self._open_collection(name)
        except BaseException:
            self.close()
            raise

    def _open_reader(self) -> None:
        """A live read replica: every collection's shards opened as RocksDB secondaries, and a
        thread that keeps them caught up with the writer (rtindex/follower.py)."""
        self._runtime.secondary_root = _reader_dir()
        self._runtime.wake = Wake(os.path.join(self.path, COLLECTIONS_DIR, WAKE_FILE), False)
        try:
            self._follower = Follower(self)
            self._follower.sync_collections(strict=True)
            self._follower.start()
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"<rtindex.Database {self.path!r} role={self.role} collections={sorted(self._collections)}>"

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check(self) -> None:
        if self._closed:
            raise ClosedError(f"database {self.path} is closed")

    def _check_writable(self) -> None:
        self._check()
        if self.role == "reader":
            raise ReadOnlyError(f"database {self.path} is opened with role=\"reader\": create and drop "
                                "collections through its writer")

    def _collections_on_disk(self) -> list[str]:
        """Names of the collections in the directory, sorted: the directories with a manifest
        (one without is what a crashed create or drop leaves: no collection)."""
        root = os.path.join(self.path, COLLECTIONS_DIR)
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            raise CorruptionError(f"database {self.path} has {MARKER} but no {COLLECTIONS_DIR}/ directory; "
                                  f"restore it from a backup") from None
        except OSError as e:
            raise StorageError(f"cannot list {root}: {e}") from e
        return sorted(n for n in names if os.path.exists(os.path.join(root, n, MANIFEST)))

    def _coll_path(self, name: str) -> str:
        return os.path.join(self.path, COLLECTIONS_DIR, name)

    def _open_collection(self, name: str) -> Collection:
        path = self._coll_path(name)
        manifest = _read_manifest(path)
        coll = Collection(self._runtime, name, path, manifest["shards"], created=_created(manifest), create=False)
        self._collections[name] = coll
        return coll

    def _created_on_disk(self, name: str) -> int | None:
        """The creation stamp of the collection's manifest now on disk; None when it cannot
        be read (mid-drop or mid-create: the next look decides)."""
        try:
            return _created(_read_manifest(self._coll_path(name)))
        except StorageError:  # CorruptionError too
            return None

    def _manifest(self, name: str) -> dict:
        """The manifest of an open collection, as on disk (the demo reads its mark here)."""
        self.collection(name)
        return _read_manifest(self._coll_path(name))

    def create_collection(self, name: str, shards: int = 4, exist_ok: bool = False, *,
                          transformation: str | None = None) -> Collection:
        """Create a collection of ``shards`` shards (fixed for its lifetime). ``name`` is
        ``coll`` or ``workspace.coll``; the default workspace ``commons`` is never spelled
        out (``commons.coll`` is refused: create ``coll``). ``transformation``: an ingest
        transformation, ``SELECT ... FROM _input [WHERE ...]``, applied to every document
        stored in it (see Collection.set_transformation); with ``exist_ok``, an existing
        collection keeps its own."""
        return self._create_collection(name, shards, exist_ok, transformation=transformation)

    def _create_collection(self, name: str, shards: int = 4, exist_ok: bool = False,
                           extra: dict | None = None, transformation: str | None = None) -> Collection:
        """create_collection, with ``extra`` keys stored in the manifest (the demo marks the
        collections it made with ``{"created_by": "rtindex demo"}``)."""
        self._check_writable()
        check_new_collection(name, shards)
        if transformation is not None:
            Transformation(transformation)  # checked before anything is made
        with self._lock:
            if name in self._collections:
                if exist_ok:
                    return self._collections[name]
                raise AlreadyExistsError(f"collection {name!r} already exists")
            path = self._coll_path(name)
            try:
                if os.path.lexists(path):  # no manifest: the remains of a crashed create or drop
                    shutil.rmtree(path)
                os.makedirs(path)
            except OSError as e:
                raise StorageError(f"cannot create the collection directory {path}: {e}") from e
            # shards first, manifest last: the manifest says "these shards exist", so once it
            # is there a missing shard is corruption (see Collection), never a crash in here
            created = time.time_ns()
            coll = Collection(self._runtime, name, path, shards, created=created, create=True)
            try:
                if transformation is not None:
                    coll.set_transformation(transformation)
                write_json_atomic(os.path.join(path, MANIFEST),
                                  {**(extra or {}), "shards": shards, "format": FORMAT, "created": created})
            except BaseException:
                coll._close()
                shutil.rmtree(path, ignore_errors=True)
                raise
            self._collections[name] = coll
            return coll

    def collection(self, name: str) -> Collection:
        """An existing collection (NotFoundError if there is none); ``commons.coll`` names
        ``coll`` (the default workspace)."""
        self._check()
        coll = self._find(_canonical(name))
        if coll is None:
            raise NotFoundError(f"no collection {name!r} (create it with db.create_collection({name!r}))")
        return coll

    __getitem__ = collection

    def __contains__(self, name: str) -> bool:
        return self._find(_canonical(name)) is not None

    def _find(self, name: str) -> Collection | None:
        """The open collection of that name. A reader asked for one it has not followed
        yet, but which the writer made (its manifest is there), opens it now instead of
        waiting for the follower's next pass: "create, then query at once" works. (Only a
        valid name is looked for on disk: no other can be there, nor name a path elsewhere.)"""
        coll = self._collections.get(name)
        if coll is None and self._follower is not None and _NAME.fullmatch(name) \
                and self._created_on_disk(name) is not None:
            self._follower.sync_collections()
            coll = self._collections.get(name)
        return coll

    def collection_names(self) -> list[str]:
        """Names of the collections, sorted."""
        self._check()
        return sorted(self._collections)

    def drop_collection(self, name: str) -> None:
        """Delete a collection and all its data."""
        self._check_writable()
        with self._lock:
            coll = self.collection(name)
            coll._close()
            del self._collections[coll.name]
            try:
                os.remove(os.path.join(coll.path, MANIFEST))
                shutil.rmtree(coll.path)
            except OSError as e:
                raise StorageError(f"cannot remove {coll.path}: {e}") from e

    def sql(self, sql: str, params: Any = None, *, access: str | None = None,
            timeout_ms: float | None = None) -> Result:
        """Run one SELECT over a collection; see docs/sql.md for the dialect.

        ``params`` binds ``:name`` placeholders (a dict) or ``?`` placeholders (a list);
        values are never spliced into the text. ``access`` forces the "index" or "scan" path
        when the query can run on it (``Result.access`` tells which ran). ``timeout_ms``: the
        query's DuckDB work is interrupted that long after the call and QueryTimeoutError
        raised (its CPU is free again at once). Raises SqlError.
        """
        self._check()
        if timeout_ms is not None and (isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float))
                                       or not timeout_ms > 0):
            raise InvalidArgumentError(f"timeout_ms must be a positive number of milliseconds or None, "
                                       f"not {timeout_ms!r}")
        return self._sql.sql(sql, params, access, timeout_ms)

    def try_point(self, sql: str, params: Any = None, *, max_rows: int = 64) -> Result | None:
        """The result of ``sql`` if it is a point query (``SELECT * ... WHERE field = value``
        or ``ARRAY_CONTAINS``) matching at most ``max_rows`` rows, else None (then use
        :meth:`sql`; also for a text it has not run before). Its work is bounded by
        ``max_rows``: a server answers such queries on its event loop instead of handing
        them to a thread."""
        self._check()
        return self._sql.try_point(sql, params, max_rows)

    def explain(self, sql: str, params: Any = None, *, access: str | None = None) -> Plan:
        """The access path :meth:`sql` would choose, and the numbers behind the choice
        (matched rows and rows per predicate from the posting lists, estimated costs);
        ``str()`` of it is a readable report."""
        self._check()
        return self._sql.explain(sql, params, access)

    def stats(self) -> dict:
        """Per collection and shard: documents, segments, approximate disk bytes; and the
        RowStoreCache's counters (hits, misses, inserts, evictions, bytes, entries). A reader
        also reports its ``lag`` behind the writer: rows not indexed yet and milliseconds
        since the newest write it surely has (per shard, and the worst of them here)."""
        self._check()
        out = {"path": self.path, "role": self.role,
               "collections": {n: c.stats() for n, c in list(self._collections.items())},
               "row_cache": self._row_cache.stats(), "column_cache": self._column_cache.stats()}
        if self._follower is not None:
            out["lag"] = self.lag()
            out["follow_error"] = self._follower.last_error
        return out

    def lag(self) -> dict:
        """How far behind the writer this reader is, cheaply (no disk access): rows not
        indexed yet and milliseconds since the newest write it surely has, the worst over
        all shards. Zeros in the writer."""
        self._check()
        rows, ms = 0, 0.0
        if self._follower is not None:
            for coll in list(self._collections.values()):
                for s in coll._shards:
                    lag = s.lag()
                    rows += lag["rows"]
                    ms = max(ms, lag["ms"])
        return {"rows": rows, "ms": ms}

    def caught_up(self, fence: str) -> bool:
        """Whether reads started now see every write the fence covers (see
        :meth:`Collection.fence`). Always true in the writer process; in a reader, false
        until it has followed the writer that far (or learned of the collection)."""
        self._check()
        f = Fence.parse(fence)
        coll = self._find(f.collection)
        if coll is None:
            return self._created_on_disk(f.collection) is None  # dropped: nothing left to wait for
        if coll.created < f.created:
            return False  # made again since: the follower opens the new one on its next pass
        if coll.created > f.created or len(coll._shards) != len(f.counters):
            return True  # the fenced collection was dropped: nothing of it left to wait for
        return all(s.change_count >= c for s, c in zip(coll._shards, f.counters))

    def wait_for(self, fence: str, timeout: float = 10.0) -> bool:
        """Block until :meth:`caught_up` (True), or ``timeout`` seconds pass (False): how a
        reader process reads the writes another process acknowledged."""
        deadline = time.monotonic() + timeout
        while not self.caught_up(fence):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.0005)
        return True

    def refresh(self) -> None:
        """A reader: catch up with the writer now (reads started after this returns see every
        write the writer had acknowledged when it was called). A writer: nothing to do."""
        self._check()
        if self._follower is not None:
            self._follower.refresh_all()

    def close(self) -> None:
        """Finish background work and close every shard. Idempotent."""
        if self._follower is not None:  # before the lock: the follower takes it
            self._follower.stop()
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
            try:
                self._sql.close()
                for worker in (self._runtime.sealer, self._runtime.merger):
                    if worker is not None:
                        worker.stop()
                for indexer in self._runtime.indexers:
                    indexer.shutdown()
            finally:
                # last, once every shard is closed; and always, even when closing failed, so
                # that this process can open the database again
                if self._runtime.secondary_root is not None:
                    shutil.rmtree(self._runtime.secondary_root, ignore_errors=True)
                if self._runtime.wake is not None:
                    self._runtime.wake.close()
                if self._writer_lock is not None:
                    self._writer_lock.release()
            if errors:
                raise errors[0]

    @property
    def closed(self) -> bool:
        """True once close() has run: any use afterwards raises ClosedError."""
        return self._closed


def open(path: str, *, role: str = "writer", create: bool = True, sync: bool = False,  # noqa: A001 - like lmdb.open
         block_cache_bytes: int = BLOCK_CACHE_BYTES, write_buffer_bytes: int = WRITE_BUFFER_BYTES,
         max_document_bytes: int = 4 << 20, max_depth: int = 64, seal_rows: int = 25_000,
         seal_bytes: int = SEAL_BYTES, merge_factor: int = 4, row_cache_bytes: int = ROW_CACHE_BYTES,
         column_cache_bytes: int = COLUMN_CACHE_BYTES,
         reader_grace_seconds: float = 30.0, max_result_bytes: int | None = MAX_RESULT_BYTES) -> Database:
    """Open (by default creating) the database in directory ``path``.

    ``create=True`` makes the directory when it is missing or empty; any other folder that is
    not an rtindex database (no ``rtindex.json`` marker) is refused with NotADatabaseError,
    so a wrong path is never written to. One writer at a time: the directory is locked
    (``writer.lock``) until close(), and a second writer gets StorageError naming the pid.

    ``role`` ("writer"): "reader" opens a live read replica from another process: it follows
    the writer (new collections, rows, upserts, deletes, seals, merges) within milliseconds,
    by itself, and every write through it raises ReadOnlyError. Several readers may follow
    one writer.

    Options (memory first; docs/reference.md says what each costs and when to raise it):

    - ``row_cache_bytes`` (64 MiB): the RowStoreCache of decoded rows, shared by every
      collection; 0 turns it off.
    - ``column_cache_bytes`` (256 MiB): decoded column chunks of sealed segments (they are
      stored compressed), shared by every collection; 0 keeps none.
    - ``block_cache_bytes`` (64 MiB): RocksDB's block cache, shared by every shard.
    - ``write_buffer_bytes`` (64 MiB): RocksDB's memtables of all shards together.
    - ``seal_rows`` (25,000), ``seal_bytes`` (32 MiB): a shard's in-memory segment is sealed
      when it holds this many rows or bytes.
    - ``merge_factor`` (4): sealed segments of a size tier merged into one.
    - ``max_result_bytes`` (256 MiB): a query result bigger than this is refused before it
      is built (ResultTooLargeError from ``rows()``, ``arrow()``, ``df()``; read it with
      ``Result.arrow_reader()``); None: no limit.
    - ``create`` (True), ``sync`` (False: an acknowledged write survives a process crash;
      True: also a power loss, at the cost of an fsync per batch).
    - ``max_document_bytes`` (4 MiB), ``max_depth`` (64): limits on one document.
    - ``reader_grace_seconds`` (30): how long rows a merge dropped stay readable for reader
      processes' older snapshots where the row store holds them (segment files written
      before rows moved into them; a segment file's rows stay readable to a reader that
      maps it).
    """
    return Database(path, role=role, create=create, sync=sync, block_cache_bytes=block_cache_bytes,
                    write_buffer_bytes=write_buffer_bytes, max_document_bytes=max_document_bytes,
                    max_depth=max_depth, seal_rows=seal_rows, seal_bytes=seal_bytes, merge_factor=merge_factor,
                    row_cache_bytes=row_cache_bytes, column_cache_bytes=column_cache_bytes,
                    reader_grace_seconds=reader_grace_seconds,
                    max_result_bytes=max_result_bytes)
