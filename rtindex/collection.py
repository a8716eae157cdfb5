"""Collection: a named set of documents, split into shards by a hash of ``_id``."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import jsonpatch

from rtindex import documents
from rtindex.documents import ItemError, Limits
from rtindex.errors import ClosedError, CorruptionError, NotFoundError, ReadOnlyError, SchemaError
from rtindex.fence import Fence
from rtindex.runtime import Runtime
from rtindex.shard import Shard
from rtindex.snapshot import Snapshot


@dataclass
class IngestStats:
    """What one ingest() call did.

    ``n`` counts distinct documents: an ``_id`` given twice in one call is one document
    (the later version replaced the earlier one within the call, so only one is stored),
    and ``ids`` lists each stored ``_id`` once, in the order of its first appearance in the
    input. ``bytes`` is the size of the version of each that is stored at the end. So
    ``n == len(ids)``, and a caller that counts ``n`` counts what a read will find.
    """

    n: int = 0  # distinct documents stored (an _id given twice counts once)
    bytes: int = 0  # their size as stored JSON (the last version of each)
    seconds: float = 0.0
    ids: list = field(default_factory=list)  # _id of each stored document, once, in order of first appearance
    errors: list[ItemError] = field(default_factory=list)  # documents not stored, and why
    replaced: list[int] = field(default_factory=list)  # input positions of documents that replaced a stored version
    fence: str = ""  # write fence covering this call (Database.wait_for in a reader process)

    def __repr__(self) -> str:
        return (f"IngestStats(n={self.n}, bytes={self.bytes}, seconds={self.seconds:.3f}, "
                f"errors={len(self.errors)})")


def _shard_path(path: str, i: int) -> str:
    return os.path.join(path, f"shard-{i:03d}")


def _check_shard_exists(name: str, shard_path: str, n_shards: int) -> None:
    """CorruptionError naming the shard unless it is a RocksDB directory we can read.

    RocksDB writes ``CURRENT`` when it creates a database and never removes it, so a shard
    directory without one was emptied or damaged after the collection was made.
    """
    where = f"collection {name!r} lists {n_shards} shards in its manifest, but shard {shard_path}"
    restore = (f"restore {os.path.dirname(shard_path)} from a backup, or remove that directory "
               f"to give up the collection")
    if not os.path.isdir(shard_path):
        raise CorruptionError(f"{where} is missing; {restore}")
    current = os.path.join(shard_path, "CURRENT")
    if not os.path.isfile(current):
        raise CorruptionError(f"{where} has no RocksDB CURRENT file (it was emptied or damaged); {restore}")
    if not os.access(shard_path, os.R_OK | os.W_OK | os.X_OK) or not os.access(current, os.R_OK):
        raise CorruptionError(f"{where} is not readable and writable by this process "
                              f"(check its owner and permissions, or {restore})")


class Collection:
    """A handle on one collection; get it from ``db.create_collection()`` or ``db[name]``."""

    def __init__(self, runtime: Runtime, name: str, path: str, n_shards: int, *, created: int = 0,
                 create: bool = False):
        """``create`` is True only from Database.create_collection: only then may shards be
        made. Opening an existing collection first checks that every shard its manifest lists
        is there, because opening a missing one would silently make a fresh, empty shard (and
        its documents would be gone without a word). ``created`` is the creation stamp from
        the manifest (nanoseconds; 0 for collections made before it was recorded): write
        fences carry it."""
        self._runtime = runtime
        self.name = name
        self.created = created
        self.path = path
        self.n_shards = n_shards
        self._limits = runtime.limits
        self._closed = False
        self._shards: list = []  # ShardWriter, or ShardReader in a reader process
        if not create:
            for i in range(n_shards):
                _check_shard_exists(name, _shard_path(path, i), n_shards)
        try:
            for i in range(n_shards):
                self._shards.append(runtime.open_shard(_shard_path(path, i), i, create=create))
        except BaseException:
            for s in self._shards:
                s.close()
            raise

    def __repr__(self) -> str:
        return f"<rtindex.Collection {self.name!r} shards={self.n_shards}>"

    @property
    def closed(self) -> bool:
        return self._closed

    def _check(self) -> None:
        if self._closed:
            raise ClosedError(f"collection {self.name!r} is closed (its database was closed or dropped)")

    def _check_writable(self) -> None:
        self._check()
        if self._runtime.reader:
            raise ReadOnlyError(f"collection {self.name!r} is opened by a reader (role=\"reader\"): "
                                "write through the database's writer process")

    # -- writes -------------------------------------------------------------
    def ingest(self, docs: Iterable[dict] | bytes | str, batch_size: int = 1000) -> IngestStats:
        """Store documents; each replaces any stored document with the same ``_id``.

        ``docs`` is an iterable of dicts, or the bytes/str of a JSON array or of NDJSON.
        A document is visible to every read that starts after the call returns, and durable
        (its shard's WAL) once it is counted in the returned stats. A bad document is
        reported in ``stats.errors`` (position, path, reason) and costs nothing else. The
        same ``_id`` twice in one call stores the later version and counts once (see
        :class:`IngestStats`).
        """
        self._check_writable()
        t0 = time.perf_counter()
        stats = IngestStats()
        limits = self._limits
        n_shards = self.n_shards
        written: dict[bytes, tuple[Any, int]] = {}  # id key -> (_id, size of the last stored version)
        chunk: list = []
        for item in documents.iter_input(docs):
            chunk.append(item)
            if len(chunk) >= batch_size:
                self._ingest_chunk(chunk, limits, n_shards, stats, written)
                chunk = []
        if chunk:
            self._ingest_chunk(chunk, limits, n_shards, stats, written)
        # a dict keeps the first insertion's position when a key is assigned again
        stats.ids = [doc_id for doc_id, _ in written.values()]
        stats.n = len(written)
        stats.bytes = sum(size for _, size in written.values())
        stats.replaced.sort()
        stats.fence = self.fence()
        stats.seconds = time.perf_counter() - t0
        return stats

    def _ingest_chunk(self, chunk: list, limits: Limits, n_shards: int, stats: IngestStats,
                      written: dict[bytes, tuple[Any, int]]) -> None:
        """Store one chunk; errors go to ``stats.errors``, and each stored document to
        ``written`` (a later version of an ``_id`` replaces the size of the earlier one)."""
        now = documents.now_us()
        per_shard: list[list] = [[] for _ in range(n_shards)]
        stored: dict[int, tuple[Any, bytes, int]] = {}  # input index -> (_id, id key, size), while not failed
        for idx, doc in chunk:
            if isinstance(doc, SchemaError):
                stats.errors.append(ItemError(idx, None, doc.path, doc.message))
                continue
            try:
                doc_id, id_key, d, raw = documents.prepare(doc, limits, now)
            except SchemaError as e:
                stats.errors.append(ItemError(idx, doc.get("_id") if isinstance(doc, dict) else None,
                                              e.path, e.message))
                continue
            stored[idx] = (doc_id, id_key, len(raw))
            per_shard[documents.shard_of(id_key, n_shards)].append((idx, id_key, d, raw))
        for shard, items in zip(self._shards, per_shard):
            if items:
                errors, replaced = shard.put_many(items)
                for idx, e in errors:
                    stats.errors.append(ItemError(idx, stored.pop(idx)[0], e.path, e.message))
                stats.replaced.extend(replaced)
        for idx in sorted(stored):  # input order: of two versions of an _id, the later one is stored
            doc_id, id_key, size = stored[idx]
            written[id_key] = (doc_id, size)
        if stats.errors:
            stats.errors.sort(key=lambda e: e.index)

    def _shard_for(self, doc_id: Any) -> tuple[Shard, bytes]:
        id_key = documents.encode_id(doc_id)
        return self._shards[documents.shard_of(id_key, self.n_shards)], id_key

    def delete(self, doc_id: Any) -> bool:
        """Delete a document by ``_id``; True if it existed."""
        self._check_writable()
        shard, id_key = self._shard_for(doc_id)
        return shard.delete_many([id_key])[0]

    def patch(self, doc_id: Any, ops: list[dict]) -> dict:
        """Apply an RFC 6902 JSON Patch to a stored document atomically; returns the new one.

        ``_id`` cannot be changed; removing ``_event_time`` keeps the old one.
        """
        self._check_writable()
        shard, id_key = self._shard_for(doc_id)
        with shard.write_lock:
            doc = shard.get(id_key)
            if doc is None:
                raise NotFoundError(f"no document with _id {doc_id!r} in collection {self.name!r}")
            try:
                new = jsonpatch.apply_patch(doc, ops)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                raise SchemaError(f"cannot apply patch: {e}", "$") from e
            except (TypeError, ValueError, KeyError) as e:
                raise SchemaError(f"malformed patch: {e}", "$") from e
            if not isinstance(new, dict):
                raise SchemaError("a patch must leave an object")
            if new.get("_id", doc_id) != doc_id:
                raise SchemaError("a patch cannot change _id", "$._id")
            new["_id"] = doc_id
            if new.get("_event_time") is None:
                new["_event_time"] = doc["_event_time"]
            _, _, d, raw = documents.prepare(new, self._limits, documents.now_us())
            errors, _ = shard.put_many([(0, id_key, d, raw)])
            if errors:
                raise errors[0][1]
            return d

    def fence(self) -> str:
        """A write fence covering every write to this collection acknowledged so far: give
        it to ``Database.wait_for`` (or the service's ``min_fence``) in a reader process to
        read your writes there. In a reader, the writes it sees so far."""
        self._check()
        return str(Fence(self.name, self.created, tuple(s.change_count for s in self._shards)))

    def flush(self) -> None:
        """Seal every in-memory segment and wait for background sealing and merging.

        Never needed for correctness (ingested documents are durable and visible at once);
        useful before measuring, or to make on-disk state compact.
        """
        self._check_writable()
        for s in self._shards:
            s.seal_now()
        for s in self._shards:
            s.wait_for_background()

    # -- reads --------------------------------------------------------------
    def get(self, doc_id: Any) -> dict | None:
        """The stored document with this ``_id``, or None."""
        self._check()
        shard, id_key = self._shard_for(doc_id)
        return shard.get(id_key)

    def __len__(self) -> int:
        self._check()
        return sum(s.state.count() for s in self._shards)

    def count(self) -> int:
        """Number of documents (same as ``len(collection)``)."""
        return len(self)

    def snapshot(self) -> Snapshot:
        """A consistent read view of every shard (see :class:`rtindex.Snapshot`)."""
        self._check()
        return Snapshot(self)

    def stats(self) -> dict:
        """Counts per shard: rows, sealed and in-memory segments, approximate disk bytes."""
        self._check()
        out = []
        for s in self._shards:
            st = s.state
            out.append({
                "shard": s.index,
                "documents": st.count(),
                "next_row_id": st.next_row_id,
                "sealed_segments": sum(1 for v in st.views if v.sealed),
                "memory_segments": sum(1 for v in st.views if not v.sealed),
                "disk_bytes": s.store.approximate_size(),
            })
            if self._runtime.reader:
                out[-1]["lag"] = s.lag()
        return {"name": self.name, "documents": sum(x["documents"] for x in out), "shards": out}

    def _close(self) -> None:
        if self._closed:
            return
        try:
            if not self._runtime.reader:
                for s in self._shards:
                    s.wait_for_background()  # re-raises a background failure, after which ...
        finally:
            self._closed = True  # ... every shard is still closed
            for s in self._shards:
                s.close()
