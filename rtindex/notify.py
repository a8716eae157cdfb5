"""Change signals from the writer process to its readers, through a tiny shared-memory file.

A reader could find out whether a shard changed by asking RocksDB to catch up, but that
costs ~21 us per shard per call, and polling every shard every millisecond adds up. The
writer instead bumps a counter in a 24-byte memory-mapped file after each write it makes
durable (a store to memory), and a reader compares it with what it last applied (a load):
only shards that changed are caught up. The file is a hint, never the truth: readers also
catch up every shard now and then, so a lost or stale signal only delays them.

Layout (native endianness, one machine): u64 change counter, u64 next row id after the
last write, f64 wall-clock time (seconds) of that write.
"""

from __future__ import annotations

import mmap
import os
import struct
import time

_LAYOUT = struct.Struct("=QQd")
_COUNT = struct.Struct("=Q")
_ROW_TIME = struct.Struct("=Qd")
SIZE = _LAYOUT.size


class Signal:
    """The writer's side: bump after every durable change."""

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < SIZE:
                os.ftruncate(fd, SIZE)  # never replaced: readers keep their map of this file
            self._mm = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._count = _LAYOUT.unpack_from(self._mm)[0]

    @property
    def count(self) -> int:
        """The counter as of the last bump: a reader that applied this value has every
        change made before it (the write fences of rtindex/fence.py are made of these)."""
        return self._count

    def bump(self, next_row: int) -> None:
        self._count += 1
        # the counter last (and never anything else there): a reader that sees it changed
        # reads a matching row count
        _ROW_TIME.pack_into(self._mm, 8, next_row, time.time())
        _COUNT.pack_into(self._mm, 0, self._count)

    def close(self) -> None:
        self._mm.close()


class Watch:
    """A reader's side: ``read()`` -> (counter, writer's next row id, time of its last write);
    (0, 0, 0.0) while the writer has never signalled."""

    def __init__(self, path: str):
        self._path = path
        self._mm: mmap.mmap | None = None

    def read(self) -> tuple[int, int, float]:
        if self._mm is None:
            try:
                fd = os.open(self._path, os.O_RDONLY)
            except FileNotFoundError:
                return 0, 0, 0.0
            try:
                if os.fstat(fd).st_size < SIZE:
                    return 0, 0, 0.0
                self._mm = mmap.mmap(fd, SIZE, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
        return _LAYOUT.unpack_from(self._mm)

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
