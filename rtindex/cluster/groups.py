"""The actors of a collection spread over a Ray cluster: one writer and its query actors per
shard group, each an embedded database of that group's shards on the node that holds them.

A shard group is a directory holding one rtindex database with the collection's shards
``g*k .. g*k+k-1`` (``k`` per group) as local shards ``0 .. k-1``: ``crc32(_id) % k`` is the
global shard modulo ``k``, so the group's own routing agrees with the cluster's. The writer
(role writer) stores what the coordinator routed to it; each query actor opens the same
directory as a reader and follows the writer, as a query process does on one machine. The
coordinator reads through a query actor's pinned snapshots (:class:`GroupReader`), so the
planner and executor it runs see the same row sets, documents and columns a single process
would.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import shutil
import threading
from typing import Any

from rtindex.database import open as open_database
from rtindex.duck import DuckEngine
from rtindex.errors import RtindexError
from rtindex.snapshot import Postings

SNAPSHOTS_KEPT = 256  # pinned snapshots per query actor; a query older than that many is retried
FENCE_WAIT_SECONDS = 10.0
MOVING_MARK = "rtindex-moving"  # a file in a group's old directory while the group moves away


class SnapshotExpiredError(RtindexError):
    """The snapshot a query read was dropped from its query actor (too many newer ones):
    the coordinator runs the query again."""


class GroupStoppedError(RtindexError):
    """The group's writer was stopped for a move (ClusterCollection.move): nothing of the
    call was written, and the coordinator sends it again to the writer on the new node."""


class GroupWriter:
    """The writer of one shard group: the group's database, opened as its writer (a
    restarted actor reopens it and recovers as a restarted process does). ``close`` waits
    for the calls under way and refuses later ones, so none writes to a closed database."""

    def __init__(self, path: str, collection: str, shards: int, options: dict):
        self.path, self.name = path, collection
        os.makedirs(path, exist_ok=True)
        self.db = open_database(path, **options)
        if collection not in self.db:
            self.db.create_collection(collection, shards=shards)
        self.coll = self.db.collection(collection)
        self._idle = threading.Condition()
        self._running = 0
        self._stopped = False

    @contextlib.contextmanager
    def _call(self):
        with self._idle:
            if self._stopped:
                raise GroupStoppedError(f"the writer of {self.name!r} at {self.path} was stopped for a move")
            self._running += 1
        try:
            yield
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()

    def ready(self) -> bool:
        return True

    def ingest(self, docs: list, errors: str) -> dict:
        """Store ``docs``; what the coordinator merges of the stats (positions are this
        part's). ``errors="raise"`` is the caller's: here every failure is reported."""
        with self._call():
            stats = self.coll.ingest(docs, errors="report", progress=False)
        return {"n": stats.n, "bytes": stats.bytes, "ids": stats.ids, "errors": stats.errors,
                "replaced": stats.replaced, "fence": stats.fence, "doc_ids": stats.doc_ids}

    def delete(self, doc_id: Any) -> tuple[bool, str]:
        with self._call():
            return self.coll.delete(doc_id), self.coll.fence()

    def patch(self, doc_id: Any, ops: list) -> tuple[dict, str]:
        with self._call():
            return self.coll.patch(doc_id, ops), self.coll.fence()

    def fence(self) -> str:
        with self._call():
            return self.coll.fence()

    def flush(self) -> None:
        with self._call():
            self.coll.flush()

    def stats(self) -> dict:
        with self._call():
            return self.coll.stats()

    def drop(self) -> None:
        """Close the group's database and remove its directory (the collection is dropped)."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def close(self) -> None:
        """Refuse new calls, wait for those under way, close the database."""
        with self._idle:
            self._stopped = True
            self._idle.wait_for(lambda: self._running == 0)
        self.db.close()


class GroupReader:
    """A query actor of one shard group: a reader of the group's database that answers the
    coordinator's snapshot calls (rtindex/cluster/snapshot.py) on snapshots it pins by token."""

    def __init__(self, path: str, collection: str, options: dict):
        self.name = collection
        self.db = open_database(path, role="reader", **options)
        self._lock = threading.Lock()
        self._pinned: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self._tokens = itertools.count(1)
        self._token_of: dict[int, int] = {}  # id(snapshot) -> its token, while pinned
        self._duck: DuckEngine | None = None  # made by the first partial aggregate

    def ready(self) -> bool:
        return True

    def _caught_up(self, fence: str | None) -> None:
        if fence and not self.db.wait_for(fence, FENCE_WAIT_SECONDS):
            raise RtindexError(f"the query actor of {self.name!r} did not catch up with its writer in "
                               f"{FENCE_WAIT_SECONDS:.0f} s")

    def open(self, fence: str | None, typed_paths: list, has_types: list, then: tuple | None = None) -> tuple:
        """Pin the collection's current snapshot once the writes ``fence`` covers are
        visible: (token, documents, rows written per shard, column_types of each of
        ``typed_paths``, has_type of each (path, type name) of ``has_types``, the answer of
        ``then``, a (method, args, kwargs) call of it, or None; this reader's lag). The
        answers the coordinator's planner asked of earlier snapshots come along, not one
        round trip each."""
        self._caught_up(fence)
        snap = self.db.collection(self.name).snapshot()
        with self._lock:
            token = self._token_of.get(id(snap))
            if token is None or self._pinned.get(token) is not snap:
                token = next(self._tokens)
                self._pinned[token] = snap
                self._token_of[id(snap)] = token
                while len(self._pinned) > SNAPSHOTS_KEPT:
                    _, old = self._pinned.popitem(last=False)
                    self._token_of.pop(id(old), None)
            else:
                self._pinned.move_to_end(token)
        return (token, snap.count(), snap.next_row_ids, [snap.column_types(p) for p in typed_paths],
                [snap.has_type(p, t) for p, t in has_types], None if then is None else self.call(token, *then),
                self.db.lag())

    def call(self, token: int, method: str, args: tuple, kwargs: dict) -> Any:
        """``method`` of the pinned snapshot ``token``: posting parts in and out as
        ``{(shard, base): BitMap}``, rows as documents, columns as Arrow."""
        with self._lock:
            snap = self._pinned.get(token)
        if snap is None:
            raise SnapshotExpiredError("the query's snapshot was dropped by its query actor")
        args = tuple(Postings(snap, a.parts) if isinstance(a, Parts) else a for a in args)
        if isinstance(kwargs.get("rows"), Parts):
            kwargs = {**kwargs, "rows": Postings(snap, kwargs["rows"].parts)}
        out = self._partial(snap, *args) if method == "partial" else getattr(snap, method)(*args, **kwargs)
        if isinstance(out, Postings):
            out = Parts(out._parts)
        elif method == "scan":  # two paths may print alike (a.b, and "a.b" as one key): by position
            out = out.rename_columns([f"c{i}" for i in range(out.num_columns)])
        # what the call counted into its one-item lists (a term budget, a fetch's charge)
        return out, {k: v[0] for k, v in kwargs.items() if isinstance(v, list)}

    def _partial(self, snap, specs: list, rows: Postings | None, text: str, params: dict):
        """A partial aggregate (rtindex/sql/partial.py) over this group's scan of ``specs``."""
        table = snap.scan(specs, rows=rows)
        table = table.rename_columns(["_shard", "_row_id"] + [f"c{i}" for i in range(len(specs))])
        with self._lock:
            if self._duck is None:
                self._duck = DuckEngine()
        return self._duck.run(text, {"scan": table}, params, exact_sums=True)

    def get(self, doc_id: Any, fence: str | None) -> dict | None:
        self._caught_up(fence)
        return self.db.collection(self.name).get(doc_id)

    def close(self) -> None:
        if self._duck is not None:
            self._duck.close()
        self.db.close()


class GroupFiles:
    """The files of a group's directory on one node, read and written in chunks: how a group
    moves to another node (ClusterDatabase.rebalance) while its writer is stopped."""

    def ready(self) -> bool:
        return True

    def mark(self, path: str) -> None:
        """Mark the directory as leaving (rtindex/cluster/local.py): its readers elsewhere
        in this machine's processes look where the group went."""
        if os.path.isdir(path):  # (a move that stopped half way may have removed it)
            with open(os.path.join(path, MOVING_MARK), "wb") as f:
                os.fsync(f.fileno())

    def listing(self, path: str) -> list[tuple[str, int]]:
        """(path relative to ``path``, bytes) of every file under it but the mark."""
        out = []
        for root, _, files in os.walk(path):
            for f in files:
                full = os.path.join(root, f)
                rel = os.path.relpath(full, path)
                if rel != MOVING_MARK:
                    out.append((rel, os.path.getsize(full)))
        return sorted(out)

    def read(self, path: str, rel: str, offset: int, size: int) -> bytes:
        with open(os.path.join(path, rel), "rb") as f:
            f.seek(offset)
            return f.read(size)

    def write(self, path: str, rel: str, offset: int, data: bytes) -> None:
        full = os.path.join(path, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "r+b" if offset else "wb") as f:
            f.seek(offset)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def remove(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)


class Parts:
    """Posting parts on their way between the coordinator and a query actor."""

    __slots__ = ("parts",)

    def __init__(self, parts: dict):
        self.parts = parts

