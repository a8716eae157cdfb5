"""Segment files: a sealed segment's postings blocks and column chunks in one immutable file.

Why files of our own rather than keys in RocksDB (docs/architecture.md has the numbers):
a segment is written once, read many times and dropped whole. Kept in RocksDB, its keys
would be range-deleted when dropped but live on in bottom-level SST files that no
compaction revisits, so disk use would grow with every seal and merge. A file is freed by
one unlink, is read through a memory map (a block or a column is a zero-copy slice), and a
reader in another process that has it mapped keeps reading it even after the writer
unlinked it.

Layout (integers little-endian)::

    magic "RTSEG\\0\\0\\2"
    postings blocks, back to back      (rtindex/_ext/_blocks.pyx encodes them)
    column chunks, back to back        (Arrow IPC streams, rtindex/columns.py)
    row blocks, back to back           (rows' JSON text, back to back, LZ4-compressed per block)
    row block table: per block: u64 offset, u32 compressed length, u32 length
    row table: per live offset, in order: u32 row block, u32 start in the block's text
    footer:  u32 n_blocks, then per block: u32 len(first term), first term, u64 offset, u32 length
             u32 n_columns, then per column: u32 len(key), column key, u64 offset, u64 length
             u64 base, u64 n, u32 len(live), live (serialized roaring bitmap of offsets)
             u64 row block table offset, u64 n row blocks, u64 row table offset
             u32 len(filter), u32 pad, pad zero bytes, filter (the term filter; see below)
    trailer: u64 footer offset, u32 footer length, u32 crc32(footer), magic

A row ends where the next one in its block starts, or at the block's end. Rows are here so
that a fetch is a slice of the map and one small decompression, not a RocksDB read (the row
store keeps only the rows of mutable segments, see ShardWriter); files of magic
"RTSEG\\0\\0\\1", written before, have no rows (theirs stay in the row store) and no row
fields in the footer.

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
import sys
import zlib
from array import array
from typing import Iterable, Iterator

import pyarrow as pa
from pyroaring import FrozenBitMap

from rtindex import columns
from rtindex._impl import TermFilterBuilder, TermIndex
from rtindex.errors import CorruptionError, StorageError

MAGIC = b"RTSEG\x00\x00\x02"
MAGIC_NO_ROWS = b"RTSEG\x00\x00\x01"  # files written before rows moved into them
ROW_BLOCK_BYTES = 8 << 10  # rows' text per compressed block: a fetch decompresses one
_ROW_CODEC = pa.Codec("lz4_raw")
_ROWS_POS = struct.Struct("<QQQ")  # row block table offset, n row blocks, row table offset
_ROW_BLOCK = struct.Struct("<QII")  # offset, compressed length, length
_ROW_AT = struct.Struct("<II")  # row block, start in its text
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
                  blocks: Iterable[tuple[bytes, bytes]], cols: Iterable[tuple[bytes, bytes]],
                  rows: Iterable[bytes]) -> "SegmentFile":
    """Write a segment file whole, durably, and open it.

    ``blocks`` yields (first term, encoded block) in term order, ``cols`` (column key, Arrow
    IPC chunk) in key order, ``rows`` the JSON text of each live offset in order; all may be
    generators, so nothing is held whole in memory. On any failure (a full disk) no file is
    left behind and StorageError says why.
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
            pos, rows_pos = _write_rows(f, pos, rows, len(live))
            footer += rows_pos
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


def _write_rows(f, pos: int, rows: Iterable[bytes], count: int) -> tuple[int, bytes]:
    """Write the row blocks, the row block table and the row table at ``pos``; returns the
    position after them and the footer's row fields."""
    table, at = bytearray(), array("I")
    text = bytearray()
    n = 0

    def flush() -> None:
        nonlocal pos
        packed = _ROW_CODEC.compress(text, asbytes=True)
        table.extend(_ROW_BLOCK.pack(pos, len(packed), len(text)))
        f.write(packed)
        pos += len(packed)
        text.clear()

    for raw in rows:
        if text and len(text) + len(raw) > ROW_BLOCK_BYTES:
            flush()
        at.extend((len(table) // _ROW_BLOCK.size, len(text)))
        text += raw
        n += 1
    if text:
        flush()
    if n != count:
        raise ValueError(f"a segment of {count} live rows was given {n} rows")
    if sys.byteorder != "little":
        at.byteswap()
    table_off = pos
    f.write(table)
    pos += len(table)
    at_off = pos
    f.write(at)
    pos += len(at) * at.itemsize
    return pos, _ROWS_POS.pack(table_off, len(table) // _ROW_BLOCK.size, at_off)


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

    __slots__ = ("path", "base", "n", "live", "block_keys", "_block_pos", "column_keys", "_col_pos", "_buf", "_terms",
                 "_row_blocks", "_row_at", "_last_block")

    def __init__(self, path: str, buf: pa.Buffer):
        self.path = path
        self._buf = buf
        size = buf.size
        head = buf.slice(0, len(MAGIC)).to_pybytes() if size >= len(MAGIC) + _TRAILER.size else b""
        if head not in (MAGIC, MAGIC_NO_ROWS):
            raise CorruptionError(f"segment file {path} is not a segment file (bad header)")
        foot_off, foot_len, crc, magic = _TRAILER.unpack(buf.slice(size - _TRAILER.size).to_pybytes())
        if magic != head or foot_off + foot_len != size - _TRAILER.size:
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
            rows_pos = None
            if head == MAGIC:
                rows_pos = _ROWS_POS.unpack_from(footer, p)
                p += _ROWS_POS.size
            term_filter = None
            if p < len(footer):  # files written before the term filter end here
                fl, pad = _FILTER_POS.unpack_from(footer, p)
                p += _FILTER_POS.size + pad
                if pad >= 64 or p + fl != len(footer):
                    raise ValueError(f"a term filter of {fl} bytes after {pad} bytes of padding does not end the footer")
                term_filter = buf.slice(foot_off + p, fl)  # zero-copy: the probes read the map
        except (struct.error, ValueError) as e:
            raise CorruptionError(f"segment file {path} is damaged (footer does not decode: {e})") from e
        spans = pos + list(cols.values())
        if rows_pos is not None:
            table_off, n_row_blocks, at_off = rows_pos
            spans += [(table_off, n_row_blocks * _ROW_BLOCK.size), (at_off, len(self.live) * _ROW_AT.size)]
        for off, ln in spans:
            if off + ln > foot_off:
                raise CorruptionError(f"segment file {path} is damaged (an entry points past its data)")
        self._row_blocks = self._row_at = None
        self._last_block: tuple[int, bytes] = (-1, b"")
        if rows_pos is not None:
            self._row_blocks = (table_off, n_row_blocks)
            at = memoryview(buf)[at_off:at_off + len(self.live) * _ROW_AT.size]
            if sys.byteorder == "little":
                self._row_at = at.cast("I")
            else:
                self._row_at = array("I", at)
                self._row_at.byteswap()
        try:
            self._terms = TermIndex(buf, keys_, pos, term_filter)
        except CorruptionError as e:
            raise CorruptionError(f"segment file {path} is damaged ({e})") from e
        self.block_keys = keys_
        self._block_pos = pos
        self.column_keys = tuple(cols)
        self._col_pos = cols

    @property
    def has_rows(self) -> bool:
        """Whether the rows are in this file (else in the row store: an older file)."""
        return self._row_at is not None

    def row(self, rank: int) -> bytes:
        """The JSON text of the ``rank``-th live row (see :attr:`has_rows`)."""
        at = self._row_at
        block, start = at[2 * rank], at[2 * rank + 1]
        last = self._last_block  # (one tuple read: another thread may replace it meanwhile)
        text = last[1] if last[0] == block else self._row_block(block)
        return text[start:self._row_end(rank, block, len(text))]

    def _row_end(self, rank: int, block: int, length: int) -> int:
        """Where the ``rank``-th row ends in its block's text (of ``length``): where the next
        row starts if it is in the same block, else the block's end."""
        at = self._row_at
        return at[2 * rank + 3] if 2 * rank + 2 < len(at) and at[2 * rank + 2] == block else length

    def _row_block(self, block: int) -> bytes:
        table_off, n_blocks = self._row_blocks
        if block >= n_blocks:
            raise CorruptionError(f"segment file {self.path} is damaged (row block {block} of {n_blocks})")
        off, packed, length = _ROW_BLOCK.unpack_from(self._buf, table_off + block * _ROW_BLOCK.size)
        text = self._decompress(self._buf.slice(off, packed), length, block)
        self._last_block = (block, text)
        return text

    def _decompress(self, packed, length: int, block: int) -> bytes:
        try:  # (Arrow says OSError of data that does not decode)
            text = _ROW_CODEC.decompress(packed, decompressed_size=length, asbytes=True)
        except (pa.ArrowException, ValueError, OSError) as e:
            raise CorruptionError(f"segment file {self.path} is damaged (row block {block}: {e})") from e
        if len(text) != length:
            raise CorruptionError(f"segment file {self.path} is damaged (row block {block} decodes to "
                                  f"{len(text)} bytes, not {length})")
        return text

    def read_rows(self) -> Iterator[bytes]:
        """Every row in order, read from the file rather than the map (for a merge, as
        :meth:`read_blocks`)."""
        table_off, n_blocks = self._row_blocks
        at = self._row_at
        n = len(at) // 2
        r = 0
        try:
            f = open(self.path, "rb", buffering=1 << 20)
        except OSError as e:
            raise StorageError(f"cannot read segment file {self.path}: {e}") from e
        with f:
            for block in range(n_blocks):
                off, packed, length = _ROW_BLOCK.unpack_from(self._buf, table_off + block * _ROW_BLOCK.size)
                try:
                    f.seek(off)
                    data = f.read(packed)
                except OSError as e:
                    raise StorageError(f"cannot read segment file {self.path}: {e}") from e
                text = self._decompress(data, length, block)
                while r < n and at[2 * r] == block:
                    yield text[at[2 * r + 1]:self._row_end(r, block, length)]
                    r += 1

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
