"""The thread that keeps a reader process's database caught up with the writer.

Every ``INTERVAL`` it refreshes each shard whose change signal moved (rtindex/notify.py:
a memory load per shard when nothing changed); every ``FULL_EVERY`` it also catches up
every shard regardless (a missed signal, a writer that restarted) and looks for collections
created or dropped by the writer. A failure (the writer mid-restart, a segment file removed
under a reader that fell far behind) is kept in ``last_error`` and tried again next time:
the replica serves its last good state meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from rtindex.errors import ClosedError

if TYPE_CHECKING:
    from rtindex.database import Database

log = logging.getLogger("rtindex")

INTERVAL = 0.001
FULL_EVERY = 0.1


class Follower:
    def __init__(self, db: "Database"):
        self._db = db
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one refresh pass at a time (the thread, or refresh_all)
        self._thread = threading.Thread(target=self._run, name="rtindex-follower", daemon=True)
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        last_full = time.monotonic()
        while not self._stop.wait(INTERVAL):
            full = time.monotonic() - last_full >= FULL_EVERY
            if full:
                last_full = time.monotonic()
            try:
                with self._lock:
                    if full:
                        self.sync_collections()
                    self._refresh(force=full)
                self.last_error = None
            except ClosedError:
                if self._stop.is_set():
                    return
            except Exception as e:  # keep following; report it in stats()
                if self.last_error != str(e):
                    log.warning("rtindex reader of %s: %s (retrying)", self._db.path, e)
                self.last_error = str(e)

    def _refresh(self, force: bool) -> None:
        for coll in list(self._db._collections.values()):
            for shard in coll._shards:
                shard.refresh(force=force)

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
