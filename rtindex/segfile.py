"""Segment files: a sealed segment's postings blocks and column chunks in one immutable file.

Why files of our own rather than keys in RocksDB (docs/architecture.md has the numbers):
a segment is written once, read many times and dropped whole. Kept in RocksDB, its keys
would be range-deleted when dropped but live on in bottom-level SST files that no
compaction revisits, so disk use would grow with every seal and merge. A file is freed by
one unlink, is read through a memory map (a block or a column is a zero-copy slice), and a
reader in another process that has it mapped keeps reading it even after the writer
unlinked it.

Layout (integers little-endian)::

    magic "RTSEG\\0\\0\\1"
    postings blocks, back to back      (rtindex/_ext/_blocks.pyx encodes them)
    column chunks, back to back        (Arrow IPC streams, rtindex/columns.py)
    footer:  u32 n_blocks, then per block: u32 len(first term), first term, u64 offset, u32 length
             u32 n_columns, then per column: u32 len(key), column key, u64 offset, u64 length
             u64 base, u64 n, u32 len(live), live (serialized roaring bitmap of offsets)
             u32 len(filter), u32 pad, pad zero bytes, filter (the term filter; see below)
    trailer: u64 footer offset, u32 footer length, u32 crc32(footer), magic

The term filter (rtindex/_py/blocks.py documents its format) lets a point lookup skip a
segment that lacks its term after reading one 64-byte block: a selective term is in one
or two segments of a shard, and a shard has tens of them. ``pad`` (< 64) puts the filter's
first bit block at a file offset that is a multiple of 64, so a probe reads one cache line.
Files written before the filter existed end the footer after ``live``; they open and are
read without a filter (each lookup then reads a term block).

A file appears under its final name only complete and fsync'ed (written under a temporary
name, then renamed, then the directory fsync'ed); the segment exists once its descriptor is
in the shard's meta records, so a file no descriptor names is an orphan that open() removes.
This module is the only one that touches segment files.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import Iterable, Iterator

import pyarrow as pa
from pyroaring import FrozenBitMap

from rtindex import columns
from rtindex._impl import TermFilterBuilder, TermIndex
from rtindex.errors import CorruptionError, StorageError

MAGIC = b"RTSEG\x00\x00\x01"
SUFFIX = ".rts"
_TRAILER = struct.Struct("<QII8s")
_U32 = struct.Struct("<I")
_BLOCK_POS = struct.Struct("<QI")
_COL_POS = struct.Struct("<QQ")
_BASE_N = struct.Struct("<QQ")
_FILTER_POS = struct.Struct("<II")  # len(filter), pad
_FILTER_HEADER = 12  # the term filter's header (rtindex/_py/blocks.py); its 64-byte bit blocks follow


def file_name(segid: int) -> str:
    return f"seg-{segid:016x}{SUFFIX}"


def segment_ids(directory: str) -> list[int]:
    """Segment ids of the complete segment files in ``directory`` (none if it is missing)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise StorageError(f"cannot list segment files in {directory}: {e}") from e
    return sorted(int(n[4:-len(SUFFIX)], 16) for n in names if n.startswith("seg-") and n.endswith(SUFFIX))


def remove_leftovers(directory: str) -> None:
    """Delete temporary files of writes that never finished (a crash or a full disk)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if name.endswith(".tmp"):
            _unlink(os.path.join(directory, name))


def remove_segment(directory: str, segid: int) -> None:
    """Delete a segment's file; a file already gone is fine (clean-up may run twice)."""
    _unlink(os.path.join(directory, file_name(segid)))


def _unlink(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StorageError(f"cannot remove {path}: {e}") from e


def write_segment(directory: str, segid: int, base: int, n: int, live: FrozenBitMap,
                  blocks: Iterable[tuple[bytes, bytes]], cols: Iterable[tuple[bytes, bytes]]) -> "SegmentFile":
    """Write a segment file whole, durably, and open it.

    ``blocks`` yields (first term, encoded block) in term order, ``cols`` (column key, Arrow
    IPC chunk) in key order; both may be generators, so nothing is held whole in memory. On
    any failure (a full disk) no file is left behind and StorageError says why.
    """
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, file_name(segid))
    tmp = final + ".tmp"
    footer = bytearray()
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            pos = len(MAGIC)
            n_blocks = 0
            entries = bytearray()
            term_filter = TermFilterBuilder()
            for first, block in blocks:
                term_filter.add_block(block)
                entries += _U32.pack(len(first)) + first + _BLOCK_POS.pack(pos, len(block))
                f.write(block)
                pos += len(block)
                n_blocks += 1
            footer += _U32.pack(n_blocks) + entries
            n_cols = 0
            entries = bytearray()
            for ck, chunk in cols:
                entries += _U32.pack(len(ck)) + ck + _COL_POS.pack(pos, len(chunk))
                f.write(chunk)
                pos += len(chunk)
                n_cols += 1
            live_raw = live.serialize()
            footer += _U32.pack(n_cols) + entries + _BASE_N.pack(base, n) + _U32.pack(len(live_raw)) + live_raw
            filter_raw = term_filter.finish()
            pad = -(pos + len(footer) + _FILTER_POS.size + _FILTER_HEADER) % 64
            footer += _FILTER_POS.pack(len(filter_raw), pad) + bytes(pad) + filter_raw
            f.write(footer)
            f.write(_TRAILER.pack(pos, len(footer), zlib.crc32(footer), MAGIC))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(directory)
    except BaseException as e:  # no partial file left behind, whatever went wrong
        try:
            os.remove(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise StorageError(f"cannot write segment file {final}: {e}") from e
        raise
    return open_segment(directory, segid)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_segment(directory: str, segid: int) -> "SegmentFile":
    """Map a segment file (StorageError if it cannot be read, CorruptionError if it does
    not decode)."""
    path = os.path.join(directory, file_name(segid))
    try:
        with pa.memory_map(path) as mm:
            buf = mm.read_buffer()
    except (OSError, pa.ArrowException) as e:
        raise StorageError(f"cannot read segment file {path}: {e}") from e
    return SegmentFile(path, buf)


class SegmentFile:
    """A mapped segment file: lookups return zero-copy slices of the map. The map lives as
    long as this object and any slice handed out (a reader's arrays keep it alive)."""

    __slots__ = ("path", "base", "n", "live", "block_keys", "_block_pos", "column_keys", "_col_pos", "_buf", "_terms")

    def __init__(self, path: str, buf: pa.Buffer):
        self.path = path
        self._buf = buf
        size = buf.size
        if size < len(MAGIC) + _TRAILER.size or buf.slice(0, len(MAGIC)).to_pybytes() != MAGIC:
            raise CorruptionError(f"segment file {path} is not a segment file (bad header)")
        foot_off, foot_len, crc, magic = _TRAILER.unpack(buf.slice(size - _TRAILER.size).to_pybytes())
        if magic != MAGIC or foot_off + foot_len != size - _TRAILER.size:
            raise CorruptionError(f"segment file {path} is truncated or damaged (bad trailer)")
        footer = buf.slice(foot_off, foot_len).to_pybytes()
        if zlib.crc32(footer) != crc:
            raise CorruptionError(f"segment file {path} is damaged (footer checksum mismatch)")
        try:
            p = 0
            (nb,) = _U32.unpack_from(footer, p)
            p += 4
            keys_, pos = [], []
            for _ in range(nb):
                (kl,) = _U32.unpack_from(footer, p)
                p += 4
                keys_.append(footer[p:p + kl])
                p += kl
                pos.append(_BLOCK_POS.unpack_from(footer, p))
                p += _BLOCK_POS.size
            (nc,) = _U32.unpack_from(footer, p)
            p += 4
            cols = {}
            for _ in range(nc):
                (kl,) = _U32.unpack_from(footer, p)
                p += 4
                ck = footer[p:p + kl]
                p += kl
                cols[ck] = _COL_POS.unpack_from(footer, p)
                p += _COL_POS.size
            self.base, self.n = _BASE_N.unpack_from(footer, p)
            p += _BASE_N.size
            (ll,) = _U32.unpack_from(footer, p)
            p += 4
            self.live = FrozenBitMap.deserialize(footer[p:p + ll])
            p += ll
            term_filter = None
            if p < len(footer):  # files written before the term filter end here
                fl, pad = _FILTER_POS.unpack_from(footer, p)
                p += _FILTER_POS.size + pad
                if pad >= 64 or p + fl != len(footer):
                    raise ValueError(f"a term filter of {fl} bytes after {pad} bytes of padding does not end the footer")
                term_filter = buf.slice(foot_off + p, fl)  # zero-copy: the probes read the map
        except (struct.error, ValueError) as e:
            raise CorruptionError(f"segment file {path} is damaged (footer does not decode: {e})") from e
        for off, ln in pos + list(cols.values()):
            if off + ln > foot_off:
                raise CorruptionError(f"segment file {path} is damaged (an entry points past its data)")
        try:
            self._terms = TermIndex(buf, keys_, pos, term_filter)
        except CorruptionError as e:
            raise CorruptionError(f"segment file {path} is damaged ({e})") from e
        self.block_keys = keys_
        self._block_pos = pos
        self.column_keys = tuple(cols)
        self._col_pos = cols

    def term_index(self) -> TermIndex:
        """The term dictionary of this file, for point lookups (rtindex._impl.TermIndex),
        with the file's term filter when it has one."""
        return self._terms

    def block(self, i: int) -> pa.Buffer:
        off, ln = self._block_pos[i]
        return self._buf.slice(off, ln)

    def read_blocks(self) -> Iterator[bytes]:
        """Every block in order, read from the file rather than the map (for a merge).

        A merge reads each block of its inputs once; read through the map, every page it
        touched would count in this process's RSS until the input is dropped, a large
        share of it for large segments (measured: docs/benchmarks.md, "Bounded memory").
        """
        try:
            with open(self.path, "rb", buffering=1 << 20) as f:
                for off, ln in self._block_pos:
                    f.seek(off)
                    yield f.read(ln)
        except OSError as e:
            raise StorageError(f"cannot read segment file {self.path}: {e}") from e

    def read_column(self, column_key: bytes) -> pa.Array | None:
        """:meth:`column`, read from the file rather than the map (see :meth:`read_blocks`)."""
        pos = self._col_pos.get(column_key)
        if pos is None:
            return None
        try:
            with open(self.path, "rb") as f:
                return columns.decode(os.pread(f.fileno(), pos[1], pos[0]))
        except OSError as e:
            raise StorageError(f"cannot read segment file {self.path}: {e}") from e

    def column(self, column_key: bytes) -> pa.Array | None:
        """The column chunk of ``column_key`` (one value per live offset), or None."""
        pos = self._col_pos.get(column_key)
        if pos is None:
            return None
        return columns.decode(self._buf.slice(*pos))

    def column_bytes(self, column_key: bytes) -> pa.Buffer | None:
        pos = self._col_pos.get(column_key)
        return None if pos is None else self._buf.slice(*pos)
