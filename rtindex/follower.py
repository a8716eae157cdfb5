"""The thread that keeps a reader process's database caught up with the writer.

It sleeps on the database's wake-up word (rtindex/notify.py), which the writer rings after
every change a reader must act on: deletes, a new mutable segment, a seal or merge, a
restart. Then it refreshes each shard whose signal says its structure changed (rows alone
need nothing: reads see them through the mutable segments' published row counts). Every
``SYNC_EVERY`` it also looks for collections created or dropped by the writer, and catches
each shard up with the writer's RocksDB (``ShardReader.keep_up``): RocksDB holds the GIL
while it replays the writer's log, so small regular catch-ups stall reads less than one
large one at the next seal. A shard whose
writer had not published what it wrote yet is tried again after ``RETRY``. A failure (the
writer mid-restart, a segment file removed under a reader that fell far behind) is kept in
``last_error`` and tried again: the replica serves its last good state meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Protocol

from rtindex.errors import ClosedError

if TYPE_CHECKING:
    from rtindex.collection import Collection
    from rtindex.runtime import Runtime

log = logging.getLogger("rtindex")

SYNC_EVERY = 0.25
RETRY = 0.001


class _Database(Protocol):
    """What the follower needs of its database (rtindex.database.Database)."""

    path: str
    _runtime: Runtime
    _collections: dict[str, Collection]
    _lock: threading.RLock

    def _collections_on_disk(self) -> list[str]: ...

    def _created_on_disk(self, name: str) -> int | None: ...

    def _open_collection(self, name: str) -> Collection: ...


class Follower:
    def __init__(self, db: _Database):
        self._db = db
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one refresh pass at a time (the thread, or refresh_all)
        self._thread = threading.Thread(target=self._run, name="rtindex-follower", daemon=True)
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._db._runtime.wake.ring()  # (wakes the other readers of the database too: harmless)
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        wake = self._db._runtime.wake
        last_sync = time.monotonic()
        pending = False
        seen = wake.value
        while not self._stop.is_set():
            wake.wait(seen, RETRY if pending else SYNC_EVERY)
            seen = wake.value
            if self._stop.is_set():
                return
            sync = time.monotonic() - last_sync >= SYNC_EVERY
            if sync:
                last_sync = time.monotonic()
            try:
                with self._lock:
                    if sync:
                        self.sync_collections()
                    pending = self._refresh(force=False)
                    if sync:
                        self._keep_up()
                self.last_error = None
            except ClosedError:
                if self._stop.is_set():
                    return
            except Exception as e:  # keep following; report it in stats()
                pending = True
                if self.last_error != str(e):
                    log.warning("rtindex reader of %s: %s (retrying)", self._db.path, e)
                self.last_error = str(e)

    def _refresh(self, force: bool) -> bool:
        """Refresh every shard; True when one could not be yet (try again soon)."""
        pending = False
        for coll in list(self._db._collections.values()):
            for shard in coll._shards:
                shard.refresh(force=force)
                pending = pending or shard.pending
        return pending

    def _keep_up(self) -> None:
        for coll in list(self._db._collections.values()):
            for shard in coll._shards:
                shard.keep_up()
                time.sleep(0)  # a catch-up holds the GIL: let waiting reads run between shards

    def refresh_all(self) -> None:
        """Catch up everything now (Database.refresh)."""
        with self._lock:
            self.sync_collections()
            self._refresh(force=True)

    def sync_collections(self, strict: bool = False) -> None:
        """Open collections the writer created, close the ones it dropped. ``strict`` (at
        open) raises what fails; later a collection that fails to open is tried again."""
        db = self._db
        try:
            on_disk = set(db._collections_on_disk())
        except Exception:
            if strict:
                raise
            return
        with db._lock:
            for name in sorted(set(db._collections) & on_disk):
                # dropped and made again since the last pass: the same name, other shards
                if db._created_on_disk(name) not in (None, db._collections[name].created):
                    on_disk.discard(name)  # closed below, reopened on the next pass
            for name in sorted(set(db._collections) - on_disk):
                coll = db._collections.pop(name)
                coll._close()
            for name in sorted(on_disk - set(db._collections)):
                try:
                    db._open_collection(name)
                except Exception:
                    if strict:
                        raise
                    continue
