"""Reference change signals: the layout of rtindex/_ext/_notify.pyx, read and written with
``struct`` on a memory map (no futex: a reader polls the wake-up word)."""

from __future__ import annotations

import mmap
import os
import struct
import time

MAX_SEGMENTS = 16
SIZE = 4096
HAVE_FUTEX = False
_HEAD = struct.Struct("=QQQQQQQQ")  # seq, count, next_row, time_ns, generation, log_seq, epoch, n_tails
_PAIR = struct.Struct("=QQ")
_WORD = struct.Struct("=I")


def _map(path: str, write: bool):
    fd = os.open(path, os.O_RDWR | os.O_CREAT if write else os.O_RDONLY, 0o644)
    try:
        if os.fstat(fd).st_size < SIZE:
            if not write:
                return None
            os.ftruncate(fd, SIZE)
        return mmap.mmap(fd, SIZE, access=mmap.ACCESS_WRITE if write else mmap.ACCESS_READ)
    finally:
        os.close(fd)


class Signal:
    def __init__(self, path: str, epoch: int):
        self._mm = _map(path, True)
        seq, count, *_ = _HEAD.unpack_from(self._mm)
        if seq & 1:
            struct.pack_into("=Q", self._mm, 0, seq + 1)
        self.count = count
        struct.pack_into("=Q", self._mm, 48, epoch)

    def bump(self, next_row: int, generation: int, log_seq: int, tails) -> None:
        if len(tails) > MAX_SEGMENTS:
            raise ValueError(f"at most {MAX_SEGMENTS} mutable segments per shard")
        seq = _HEAD.unpack_from(self._mm)[0]
        self.count += 1
        struct.pack_into("=Q", self._mm, 0, seq + 1)
        epoch = _HEAD.unpack_from(self._mm)[6]
        _HEAD.pack_into(self._mm, 0, seq + 1, self.count, next_row, time.time_ns(), generation, log_seq, epoch,
                        len(tails))
        for i, (base, fid) in enumerate(tails):
            _PAIR.pack_into(self._mm, _HEAD.size + 16 * i, base, fid)
        struct.pack_into("=Q", self._mm, 0, seq + 2)

    def close(self) -> None:
        self._mm.close()


class Watch:
    def __init__(self, path: str):
        self._path = path
        self._mm = None
        self._last = None
        self._stuck = 0

    def read(self):
        if self._mm is None:
            try:
                self._mm = _map(self._path, False)
            except FileNotFoundError:
                return None
            if self._mm is None:
                return None
        spins = 0
        while True:
            head = _HEAD.unpack_from(self._mm)
            tails = tuple(_PAIR.unpack_from(self._mm, _HEAD.size + 16 * i) for i in range(min(head[7], MAX_SEGMENTS)))
            if not head[0] & 1 and _HEAD.unpack_from(self._mm)[0] == head[0]:
                break
            if head[0] & 1 and head[0] == self._stuck:
                return self._last
            spins += 1
            if spins > 100:  # a writer that died mid-update: its successor clears it
                self._stuck = head[0]
                return self._last
            time.sleep(0.0001)
        if head[1] == 0:
            return None
        self._last = (head[1], head[2], head[3] / 1e9, head[4], head[5], head[6], tails)
        return self._last

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None


class Wake:
    def __init__(self, path: str, writer: bool):
        self._path, self._writer = path, writer
        self._mm = None
        self._open()

    def _open(self) -> None:
        try:
            self._mm = _map(self._path, self._writer)
        except FileNotFoundError:
            self._mm = None

    @property
    def value(self) -> int:
        if self._mm is None:
            self._open()
        return _WORD.unpack_from(self._mm)[0] if self._mm is not None else 0

    def ring(self) -> None:
        if self._mm is not None:
            _WORD.pack_into(self._mm, 0, (self.value + 1) & 0xFFFFFFFF)

    def wait(self, seen: int, timeout: float) -> None:
        time.sleep(min(timeout, 0.001))

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
