"""Reference term-dictionary blocks: the oracle for ``rtindex/_ext/_blocks.pyx``.

A sealed segment stores its sorted (term -> posting list) pairs Lucene-style: one RocksDB
value per run of consecutive terms (about ``target_bytes`` each), keyed by the run's first
term. Both implementations produce the same bytes and raise the same errors; the tests
compare them on generated data.

Block format 3 (integers are little-endian unless named varint: unsigned LEB128, 7 bits a
byte, low group first, at most 5 bytes)::

    offset 0    magic      b"RTB\\x03" (format version 3)
    offset 4    n          uint32 entry count, >= 1
    offset 8    width      uint8: bytes per offset in the table, 2 or 4
    offset 9    off[n+1]   uint16 (width 2) or uint32 (width 4) each: entry i is
                           block[off[i]:off[i+1]]; off[0] = 9 + width * (n + 1), off[n] = len(block)
    off[0]...   entries, terms strictly increasing (bytewise)

    entry:  shared     varint: how many leading bytes the term shares with the block's first
                       term (0 in entry 0, which stores its whole term)
            tail       varint: suffix_len << 1 | kind   (kind 0 = raw, 1 = roaring)
            suffix     suffix_len bytes: the term is first_term[:shared] + suffix
            posting    up to the entry's end:
                raw:     varints, one per offset (k >= 1): the first offset, then each gap to the
                         previous offset minus 1 (so any sequence decodes strictly increasing; a
                         reader checks only that each varint ends in the posting and that no
                         offset passes 2**32 - 1). k is the number of bytes below 0x80.
                roaring: uint32 cardinality (>= 1), then ``BitMap.serialize()`` (portable format)

Writers use width 2 exactly when the whole block is at most 65535 bytes (a ~16 KiB block
takes 2; one with a huge roaring entry or under a huge target takes 4); readers accept either.

Why front coding: a block's terms are sorted and mostly share a long prefix with its first
term (the column key: encoded path and type tag, often part of the value), so storing only
the suffixes makes term blocks much smaller (measured: docs/benchmarks.md, "Ingest"). Why
the first term and not the previous one (which would save a little more): any entry still
decodes alone, so a lookup stays a binary search over the offsets table. It compares the key
with the first term once (their common prefix ``L``), then each probed entry by ``shared``
and its suffix only (``shared > L``: the entry orders against the key as the first term
does; else compare ``key[shared:]`` with the suffix). Writers store the longest shared
prefix, so the bytes are a function of the terms; readers only require
``shared <= len(first term)``.

Why format 3: most postings are small raw sets, and a uint32 per offset plus a uint32 per
table slot are the largest part of format 2's blocks. A varint gap takes one byte below 128
and two below 16,384, and the table 2 bytes an entry, which makes the blocks of small-row
data sets much smaller with lookups (block_get, terms_get) as fast (docs/benchmarks.md,
"Ingest"). Left out: front coding against the previous term with a restart (the first term)
every 16 entries would save a little more but make a lookup scan up to 15 entries after its
binary search, and the merge rebuild terms.

Formats 1 and 2 (magics b"RTB\\x01" and b"RTB\\x02", segments written before format 3) have
an 8-byte header (magic, uint32 n) and a uint32 offsets table (``off[0] = 12 + 4n``); a raw
posting is k uint32 offsets (k = posting bytes / 4). A format 2 entry is as above; a format 1
entry is ``uint32 term_len | kind << 30``, the whole term, the posting. Readers accept all
three (dispatching on the magic); writers, the merge included, write format 3 only.

Encoding is a function of the set alone, so both implementations (and a merge that changes
nothing) give identical bytes: a set of k < 64 offsets is raw; otherwise ``s =
BitMap(offsets).serialize()`` (run-optimized by pyroaring's constructor) is stored as roaring
when ``4 + len(s)`` is less than the raw posting's bytes, else raw (gaps below 128 take one
byte raw against two in a roaring array container; runs and bitsets denser than a byte an
offset are smaller as roaring).
A block is emitted as soon as its size (header + table + entries) reaches ``target_bytes``,
so a block is only larger than that by its last entry.

Lookups binary-search the offsets table and read only the probed entries, so they cost
O(log n) and never decode the others. Every read is checked against the block's bounds: a
truncated or garbage block raises :class:`~rtindex.errors.CorruptionError` (validation is
lazy, so a damaged entry that is never probed goes unnoticed; a format 2 or 3 block's first
entry is checked when the block is opened, since the others refer to it).

Term filter: a blocked Bloom filter over every term of a segment, so that a point lookup in
a segment that lacks the term reads one 64-byte block instead of a term block (a selective
term is in one or two of a shard's segments; it is looked up in all of them)::

    offset 0    magic      b"RTF\x01" (format version 1)
    offset 4    n_blocks   uint32, >= 1
    offset 8    k          uint32, bits set per term, 1..16
    offset 12   n_blocks bit blocks of 64 bytes; bit j of a block is bit j % 8 of its byte j // 8

A term's hash ``h`` is FNV-1a 64 of its bytes followed by splitmix64's finalizer (stored on
disk, so it must not be Python's ``hash``). Its block is ``((h >> 32) * n_blocks) >> 32``;
its k bits in that block are the top 9 bits of ``x``, ``x * C``, ... ``x * C**(k-1)`` where
``x = (h mod 2**32) * C`` and ``C = 0x9E3779B9``, all mod 2**32. A builder sizes the filter at
10 bits per term with k = 7: about 1% of absent terms pass, none present fail.
"""

from __future__ import annotations

import bisect
import itertools
import struct
import sys
from array import array
from typing import Iterable, Iterator

from pyroaring import AbstractBitMap, BitMap

from rtindex.errors import CorruptionError

MAGIC = b"RTB\x03"  # what writers write
MAGIC_V2 = b"RTB\x02"  # still read
MAGIC_V1 = b"RTB\x01"  # still read
RAW = 0
ROARING = 1
RAW_MAX = 64  # a set of fewer offsets is always stored raw
MAX_TERM = (1 << 30) - 1
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_HDR = struct.Struct("<4sI")
_HDR3 = 9  # format 3: magic, u32 n, u8 offset width
_MAXU16 = 0xFFFF
_BIG = sys.byteorder == "big"
_MAXU32 = 0xFFFFFFFF
_VARINT_MAX = 5  # bytes of the longest varint a reader accepts

__all__ = [
    "BlockWriter",
    "TermFilterBuilder",
    "TermIndex",
    "block_cardinality",
    "block_first_last",
    "block_get",
    "block_items",
    "block_range",
    "merge_blocks",
    "terms_get",
]


def _from_le(b: bytes) -> array:
    a = array("I")
    a.frombytes(b)
    if _BIG:
        a.byteswap()
    return a


def _varint(v: int) -> bytes:
    """Unsigned LEB128 of ``v``: 7 bits a byte, low group first."""
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _read_varint(b: bytes, pos: int, end: int) -> tuple[int, int] | None:
    """(value, position after it) of the varint at ``b[pos:end]``; None when it runs past
    ``end`` or is longer than ``_VARINT_MAX`` bytes."""
    v = 0
    for i in range(_VARINT_MAX):
        if pos + i >= end:
            return None
        c = b[pos + i]
        v |= (c & 0x7F) << (7 * i)
        if c < 0x80:
            return v, pos + i + 1
    return None


def _shared_len(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _increasing(a: array) -> bool:
    return all(x < y for x, y in zip(a, a[1:]))


def _raw_bytes(values: array) -> bytes:
    """A raw posting of format 3: varints of the first offset, then of each gap minus 1."""
    out = bytearray()
    prev = -1
    for v in values:
        out += _varint(v - prev - 1)
        prev = v
    return bytes(out)


def _varint_len(v: int) -> int:
    return max(1, (v.bit_length() + 6) // 7)


def _raw_size(values: array) -> int:
    """``len(_raw_bytes(values))``, without making the bytes."""
    return sum(_varint_len(v - p - 1) for p, v in zip(itertools.chain((-1,), values), values))


def _surely_raw(values: array) -> bool:
    """True when the raw encoding is known to win without serializing a BitMap.

    A lower bound of the portable roaring size: 4 bytes + 8 per 64K chunk (4 with fewer than
    4 chunks) + per chunk the smallest container payload (array 2/value, run 2 + 4/run,
    bitset 8192). Raw wins when ``4 + bound >= _raw_size``. A shortcut only: it never changes which
    encoding is chosen. The compiled encoder uses it to skip building a BitMap; this reference
    does not (so the byte-for-byte tests also check that it changes nothing).
    """
    k = len(values)
    if k < RAW_MAX:
        return True
    payload = 0
    chunks = 0
    for _, group in itertools.groupby(values, lambda v: v >> 16):
        vs = list(group)
        runs = 1 + sum(1 for a, b in zip(vs, vs[1:]) if b != a + 1)
        payload += min(2 * len(vs), 2 + 4 * runs, 8192)
        chunks += 1
    return 4 + 4 + (8 if chunks >= 4 else 4) * chunks + payload >= _raw_size(values)


def _encode(values: array) -> tuple[int, bytes]:
    """(kind, posting bytes) of a non-empty increasing array('I')."""
    raw = _raw_bytes(values)
    if len(values) >= RAW_MAX:
        ser = BitMap(values).serialize()
        if 4 + len(ser) < len(raw):
            return ROARING, _U32.pack(len(values)) + ser
    return RAW, raw


def _block_size(n: int, data_len: int) -> int:
    """Size of a format 3 block of ``n`` entries of ``data_len`` bytes: the offsets table
    takes 2 bytes an offset when every offset fits, else 4."""
    size = _HDR3 + 2 * (n + 1) + data_len
    return size if size <= _MAXU16 else _HDR3 + 4 * (n + 1) + data_len


class BlockWriter:
    """Packs (term, postings) pairs, added in increasing term order, into blocks."""

    def __init__(self, target_bytes: int = 16384):
        if not isinstance(target_bytes, int) or isinstance(target_bytes, bool):
            raise TypeError("target_bytes must be an int")
        if target_bytes < 1:
            raise ValueError("target_bytes must be >= 1")
        self._target = target_bytes
        self._entries: list[bytes] = []
        self._data_len = 0
        self._first: bytes | None = None
        self._last: bytes | None = None
        self._n_terms = 0

    @property
    def n_terms(self) -> int:
        """Number of terms written so far (empty postings are not counted)."""
        return self._n_terms

    def add(self, term: bytes, postings: array | AbstractBitMap) -> tuple[bytes, bytes] | None:
        """Add ``term`` (greater than every term added before) with its row offsets.

        ``postings`` is an ``array('I')`` of strictly increasing offsets or a pyroaring
        ``BitMap``; an empty one is skipped (not checked against the order). Returns a
        finished ``(first_term, block)`` once the current block reaches ``target_bytes``.
        """
        if not isinstance(term, bytes):
            raise TypeError(f"term must be bytes, not {type(term).__name__}")
        if isinstance(postings, array):
            if postings.typecode != "I" or postings.itemsize != 4:
                raise TypeError(f"postings must be array('I'), not array({postings.typecode!r})")
            values = postings
        elif isinstance(postings, AbstractBitMap):
            values = None
        else:
            raise TypeError(
                f"postings must be array('I') or a pyroaring BitMap, not {type(postings).__name__}"
            )
        if not postings:
            return None
        if len(term) > MAX_TERM:
            raise ValueError(f"term of {len(term)} bytes is too long (at most {MAX_TERM})")
        if values is None:
            values = postings.to_array()
        elif not _increasing(values):
            raise ValueError("postings must be strictly increasing")
        if self._last is not None and term <= self._last:
            raise ValueError(
                f"terms must be added in strictly increasing order: {term!r} after {self._last!r}"
            )
        return self._put(term, values)

    def _put(self, term: bytes, values: array) -> tuple[bytes, bytes] | None:
        kind, post = _encode(values)
        if self._entries:
            assert self._first is not None
            shared = _shared_len(self._first, term)
        else:
            self._first = term
            shared = 0
        suffix = term[shared:]
        entry = _varint(shared) + _varint(len(suffix) << 1 | kind) + suffix + post
        self._entries.append(entry)
        self._data_len += len(entry)
        self._last = term
        self._n_terms += 1
        if _block_size(len(self._entries), self._data_len) >= self._target:
            return self._flush()
        return None

    def finish(self) -> tuple[bytes, bytes] | None:
        """The last, partly filled block, or None when nothing is pending."""
        if not self._entries:
            return None
        return self._flush()

    def _flush(self) -> tuple[bytes, bytes]:
        n = len(self._entries)
        size = _block_size(n, self._data_len)
        if size > _MAXU32:
            raise ValueError("block larger than 4 GiB")
        width = 2 if size <= _MAXU16 else 4
        offs = list(itertools.accumulate([len(e) for e in self._entries], initial=_HDR3 + width * (n + 1)))
        table = struct.pack(f"<{n + 1}{'H' if width == 2 else 'I'}", *offs)
        block = _HDR.pack(MAGIC, n) + bytes([width]) + table + b"".join(self._entries)
        first = self._first
        assert first is not None
        self._entries = []
        self._data_len = 0
        self._first = None
        return first, block


# ---- reading --------------------------------------------------------------------------


class _Block:
    """A validated header over one block's bytes (format 1, 2 or 3); entries are checked as
    they are read."""

    __slots__ = ("b", "first", "fmt", "n", "table", "table_end", "width")

    def __init__(self, block):
        b = block if isinstance(block, bytes) else bytes(memoryview(block))
        if len(b) < 12:
            raise CorruptionError(f"term block of {len(b)} bytes is too short")
        magic, n = _HDR.unpack_from(b, 0)
        if magic == MAGIC:
            self.fmt, self.width, self.table = 3, b[8], _HDR3
            if self.width != 2 and self.width != 4:
                raise CorruptionError(f"term block has a bad offset width {self.width}")
        elif magic == MAGIC_V2 or magic == MAGIC_V1:
            self.fmt, self.width, self.table = magic[3], 4, 8
        else:
            raise CorruptionError(f"term block has a bad magic number {magic!r}")
        if n == 0:
            raise CorruptionError("term block has no entries")
        table_end = self.table + self.width * (n + 1)
        if table_end > len(b):
            raise CorruptionError(f"term block of {len(b)} bytes cannot hold {n} entries")
        self.b = b
        self.n = n
        self.table_end = table_end
        if self._off(0) != table_end or self._off(n) != len(b):
            raise CorruptionError("term block offsets table does not match its size")
        self.first = b""  # formats 2, 3: the first term, which the other entries' terms start with
        if self.fmt > 1:
            _, ts, te, _, _, _ = self.entry(0)
            self.first = b[ts:te]

    def _off(self, i: int) -> int:
        """Entry ``i`` starts at offset ``_off(i)`` (``_off(n)``: the block's end)."""
        return (_U16 if self.width == 2 else _U32).unpack_from(self.b, self.table + self.width * i)[0]

    def entry(self, i: int) -> tuple[int, int, int, int, int, int]:
        """(shared, suffix_start, suffix_end, kind, posting_start, posting_end) of entry ``i``:
        its term is ``first[:shared] + b[suffix_start:suffix_end]`` (format 1: shared is 0)."""
        b = self.b
        s, e = self._off(i), self._off(i + 1)
        if self.fmt > 1:
            if s < self.table_end or e > len(b) or e < s:
                raise CorruptionError(f"term block entry {i} is out of bounds")
            got = _read_varint(b, s, e)
            tail = None if got is None else _read_varint(b, got[1], e)
            if got is None or tail is None:
                raise CorruptionError(f"term block entry {i} is malformed")
            shared, (t, ts) = got[0], tail
            te = ts + (t >> 1)
            kind = t & 1
            if shared > (0 if i == 0 else len(self.first)):
                raise CorruptionError(f"term block entry {i} is malformed")
        else:
            if s < self.table_end or e > len(b) or e - s < 4:
                raise CorruptionError(f"term block entry {i} is out of bounds")
            head = _U32.unpack_from(b, s)[0]
            shared, ts, te, kind = 0, s + 4, s + 4 + (head & MAX_TERM), head >> 30
        plen = e - te
        if kind == RAW and self.fmt == 3:  # varints to the end: at least one, the last one ending
            bad = plen < 1 or b[e - 1] >= 0x80
        else:
            bad = kind > ROARING or plen < 4 or (kind == RAW and plen % 4) or (kind == ROARING and plen == 4)
        if bad:
            raise CorruptionError(f"term block entry {i} is malformed")
        return shared, ts, te, kind, te, e

    def term(self, i: int) -> bytes:
        shared, ts, te, _, _, _ = self.entry(i)
        return self.first[:shared] + self.b[ts:te]

    def lower_bound(self, key: bytes) -> int:
        """Index of the first entry whose term is >= ``key`` (``n`` when none)."""
        lo, hi = 0, self.n
        while lo < hi:
            mid = (lo + hi) >> 1
            if self.term(mid) < key:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def find(self, key: bytes) -> int:
        i = self.lower_bound(key)
        if i < self.n and self.term(i) == key:
            return i
        return -1

    def raw(self, ps: int, pe: int) -> array:
        """The offsets of the raw posting at ``b[ps:pe]`` (validated: increasing, uint32)."""
        if self.fmt < 3:
            a = _from_le(self.b[ps:pe])
            if not _increasing(a):
                raise CorruptionError("term block posting is not strictly increasing")
            return a
        a = array("I")
        v = -1
        while ps < pe:
            got = _read_varint(self.b, ps, pe)
            if got is None:
                raise CorruptionError("term block posting is malformed")
            v += got[0] + 1
            if v > _MAXU32:
                raise CorruptionError("term block posting has an offset past 2**32 - 1")
            a.append(v)
            ps = got[1]
        return a

    def cardinality(self, kind: int, ps: int, pe: int) -> int:
        """Length of one posting, without decoding it (format 3 raw: its varints' last bytes)."""
        if kind == RAW:
            if self.fmt < 3:
                return (pe - ps) >> 2
            return sum(1 for c in self.b[ps:pe] if c < 0x80)
        card = _U32.unpack_from(self.b, ps)[0]
        if card == 0:
            raise CorruptionError("term block posting has the wrong cardinality")
        return card

    def bitmap(self, kind: int, ps: int, pe: int) -> BitMap:
        if kind == RAW:
            return BitMap(self.raw(ps, pe))
        card = _U32.unpack_from(self.b, ps)[0]
        try:
            bm = BitMap.deserialize(self.b[ps + 4 : pe])
        except ValueError as e:
            raise CorruptionError(f"term block posting does not decode: {e}") from None
        if len(bm) != card or card == 0:
            raise CorruptionError("term block posting has the wrong cardinality")
        return bm


def _check_term(term) -> None:
    if not isinstance(term, bytes):
        raise TypeError(f"term must be bytes, not {type(term).__name__}")


def block_get(block: bytes, term: bytes) -> BitMap | None:
    """The posting list of ``term`` in ``block``, or None when the block does not hold it."""
    _check_term(term)
    blk = _Block(block)
    i = blk.find(term)
    if i < 0:
        return None
    _, _, _, kind, ps, pe = blk.entry(i)
    return blk.bitmap(kind, ps, pe)


# ---- term filter ----------------------------------------------------------------------

FILTER_MAGIC = b"RTF\x01"
FILTER_BITS_PER_TERM = 10
FILTER_K = 7
FILTER_MAX_K = 16
_FILTER_HDR = struct.Struct("<4sII")
_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1


def _hash(term: bytes) -> int:
    """FNV-1a 64, then splitmix64's finalizer."""
    h = 0xCBF29CE484222325
    for c in term:
        h = ((h ^ c) * 0x100000001B3) & _M64
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _M64
    return h ^ (h >> 31)


def _bits(h: int, n_blocks: int, k: int) -> Iterator[int]:
    """Byte index (from the first bit block) and bit of each of the k bits of hash ``h``."""
    base = 64 * (((h >> 32) * n_blocks) >> 32)
    x = h & _M32
    for _ in range(k):
        x = (x * 0x9E3779B9) & _M32
        bit = x >> 23
        yield base + (bit >> 3), 1 << (bit & 7)


def _filter_header(f: bytes) -> tuple[int, int]:
    """(n_blocks, k) of a validated filter."""
    if len(f) < _FILTER_HDR.size:
        raise CorruptionError(f"term filter of {len(f)} bytes is too short")
    magic, n_blocks, k = _FILTER_HDR.unpack_from(f, 0)
    if magic != FILTER_MAGIC:
        raise CorruptionError(f"term filter has a bad magic number {magic!r}")
    if n_blocks == 0 or not 1 <= k <= FILTER_MAX_K:
        raise CorruptionError(f"term filter header is malformed ({n_blocks} blocks, k = {k})")
    if len(f) != _FILTER_HDR.size + 64 * n_blocks:
        raise CorruptionError(f"term filter of {len(f)} bytes does not hold its {n_blocks} blocks")
    return n_blocks, k


class TermFilterBuilder:
    """Builds the term filter of a segment from its encoded blocks (terms only; postings are
    never decoded), keeping each term's hash until :meth:`finish` sizes the filter."""

    def __init__(self):
        self._hashes: list[int] = []

    @property
    def n_terms(self) -> int:
        """Number of terms added so far."""
        return len(self._hashes)

    def add_block(self, block) -> None:
        """Add every term of one encoded block (CorruptionError if it does not decode)."""
        blk = _Block(block)
        self._hashes.extend([_hash(blk.term(i)) for i in range(blk.n)])

    def finish(self) -> bytes:
        """The filter of every term added so far, as bytes (about 10 bits per term)."""
        n_blocks = max(1, (len(self._hashes) * FILTER_BITS_PER_TERM + 511) // 512)
        if n_blocks > _M32:
            raise ValueError(f"{len(self._hashes)} terms are too many for one term filter")
        bits = bytearray(64 * n_blocks)
        for h in self._hashes:
            for byte, mask in _bits(h, n_blocks, FILTER_K):
                bits[byte] |= mask
        return _FILTER_HDR.pack(FILTER_MAGIC, n_blocks, FILTER_K) + bytes(bits)


class TermIndex:
    """A sealed segment's term dictionary: the first term of each block and where each
    block lies in ``data`` (the segment file); :meth:`get` finds a term's posting list,
    asking the term ``filter`` (TermFilterBuilder's bytes, if given) first."""

    def __init__(self, data, firsts, positions, filter=None):
        self._data = memoryview(data)
        self._firsts = list(firsts)
        self._pos = list(positions)
        if len(self._pos) != len(self._firsts):
            raise ValueError(f"{len(self._firsts)} first terms but {len(self._pos)} block positions")
        for i, (first, (off, ln)) in enumerate(zip(self._firsts, self._pos)):
            _check_term(first)
            if off < 0 or ln < 0 or off + ln > len(self._data):
                raise CorruptionError(f"term block {i} at {off}+{ln} lies outside the {len(self._data)} bytes of its file")
        self._filter: bytes | None = None
        if filter is not None:
            f = bytes(memoryview(filter))
            self._n_blocks, self._k = _filter_header(f)
            self._filter = f

    def may_contain(self, term: bytes) -> bool:
        """False when the term filter rules ``term`` out; True when it may be here (always
        True without a filter). A filter errs only towards True, on about 1% of absent terms."""
        _check_term(term)
        f = self._filter
        if f is None:
            return True
        base = _FILTER_HDR.size
        return all(f[base + byte] & mask for byte, mask in _bits(_hash(term), self._n_blocks, self._k))

    def get(self, term: bytes) -> BitMap | None:
        """The posting list of ``term``, or None when no block holds it."""
        if not self.may_contain(term):
            return None
        i = bisect.bisect_right(self._firsts, term) - 1
        if i < 0:
            return None
        off, ln = self._pos[i]
        return block_get(bytes(self._data[off:off + ln]), term)


def terms_get(indexes: list[TermIndex], term: bytes) -> list[tuple[int, BitMap]]:
    """``(i, posting list)`` for each of ``indexes`` that holds ``term``, in order."""
    _check_term(term)
    return [(i, bm) for i, bm in enumerate(index.get(term) for index in indexes) if bm is not None]


def block_cardinality(block: bytes, term: bytes) -> int:
    """Length of ``term``'s posting list in ``block`` (0 when absent); builds no BitMap."""
    _check_term(term)
    blk = _Block(block)
    i = blk.find(term)
    if i < 0:
        return 0
    _, _, _, kind, ps, pe = blk.entry(i)
    return blk.cardinality(kind, ps, pe)


def block_range(block: bytes, lo: bytes | None, hi: bytes | None) -> list[tuple[bytes, BitMap]]:
    """Entries with ``lo <= term < hi`` (None: unbounded), in term order."""
    if lo is not None:
        _check_term(lo)
    if hi is not None:
        _check_term(hi)
    blk = _Block(block)
    start = 0 if lo is None else blk.lower_bound(lo)
    return _scan(blk, start, hi)


def block_items(block: bytes) -> list[tuple[bytes, BitMap]]:
    """Every (term, posting list) of ``block``, in term order."""
    return _scan(_Block(block), 0, None)


def _scan(blk: _Block, start: int, hi: bytes | None) -> list[tuple[bytes, BitMap]]:
    out = []
    prev = None
    for i in range(start, blk.n):
        shared, ts, te, kind, ps, pe = blk.entry(i)
        t = blk.first[:shared] + blk.b[ts:te]
        if hi is not None and t >= hi:
            break
        if prev is not None and t <= prev:
            raise CorruptionError("term block terms are not strictly increasing")
        prev = t
        out.append((t, blk.bitmap(kind, ps, pe)))
    return out


def block_first_last(block: bytes) -> tuple[bytes, bytes]:
    """(first term, last term) of ``block``."""
    blk = _Block(block)
    return blk.term(0), blk.term(blk.n - 1)


# ---- merging --------------------------------------------------------------------------


class _Cursor:
    """One merge input: the current block of a segment and the position in it."""

    def __init__(self, block_iter: Iterable, shift: int, deleted: AbstractBitMap | None):
        if not isinstance(shift, int) or isinstance(shift, bool):
            raise TypeError(f"shift must be an int, not {type(shift).__name__}")
        if not 0 <= shift <= _MAXU32:
            raise ValueError(f"shift {shift} is outside [0, 2**32)")
        if deleted is not None and not isinstance(deleted, AbstractBitMap):
            raise TypeError(f"deleted must be a pyroaring BitMap or None, not {type(deleted).__name__}")
        self.it = iter(block_iter)
        self.shift = shift
        if deleted is not None and deleted.copy_on_write:  # pyroaring won't mix the two kinds
            deleted = BitMap(deleted.to_array())
        self.deleted = deleted if deleted else None
        self.blk: _Block | None = None
        self.i = 0
        self.done = False
        self.cur: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)

    def load(self) -> None:
        """Move to the first entry of the next block, or set ``done``."""
        for block in self.it:
            self.blk = _Block(block)
            self.i = 0
            self.cur = self.blk.entry(0)
            return
        self.blk = None
        self.done = True

    def advance(self) -> None:
        assert self.blk is not None
        self.i += 1
        if self.i < self.blk.n:
            self.cur = self.blk.entry(self.i)
        else:
            self.load()

    def term(self) -> bytes:
        assert self.blk is not None
        shared, ts, te, _, _, _ = self.cur
        return self.blk.first[:shared] + self.blk.b[ts:te]

    def raw_values(self) -> array:
        """The current raw posting minus deletes, plus shift."""
        assert self.blk is not None
        _, _, _, _, ps, pe = self.cur
        out = array("I")
        for v in self.blk.raw(ps, pe):
            if self.deleted is not None and v in self.deleted:
                continue
            if v + self.shift > _MAXU32:
                raise ValueError(f"offset {v} + shift {self.shift} does not fit in uint32")
            out.append(v + self.shift)
        return out

    def bitmap(self) -> BitMap:
        """The current posting (any kind) minus deletes, plus shift."""
        assert self.blk is not None
        _, _, _, kind, ps, pe = self.cur
        if kind == RAW:
            return BitMap(self.raw_values())
        bm = self.blk.bitmap(kind, ps, pe)
        if self.deleted is not None:
            bm -= self.deleted
        if bm and self.shift:
            if bm.max() + self.shift > _MAXU32:
                raise ValueError(f"offset {bm.max()} + shift {self.shift} does not fit in uint32")
            bm = bm.shift(self.shift)
        return bm


def merge_blocks(inputs, target_bytes: int = 16384) -> Iterator[tuple[bytes, bytes]]:
    """Merge the term blocks of several segments into the blocks of one.

    ``inputs`` is a list of ``(block_iter, shift, deleted)``: ``block_iter`` yields one
    segment's blocks in term order; each of its postings loses ``deleted`` and then gains
    ``shift``. Postings of one term are unioned; terms left empty are dropped. Yields
    ``(first_term, block)`` as :class:`BlockWriter` does, holding one block per input.
    Arguments are checked at call time; blocks as they are read.
    """
    writer = BlockWriter(target_bytes)
    cursors = [_Cursor(*inp) for inp in inputs]
    return _merge(cursors, writer)


def _merge(cursors: list[_Cursor], writer: BlockWriter) -> Iterator[tuple[bytes, bytes]]:
    for c in cursors:
        c.load()
    last: bytes | None = None
    while True:
        m = None
        mt = b""
        for c in cursors:
            if not c.done:
                t = c.term()
                if m is None or t < mt:
                    m, mt = c, t
        if m is None:
            break
        if last is not None and mt <= last:
            raise CorruptionError("merge input terms are not strictly increasing")
        last = mt
        same = [c for c in cursors if not c.done and (c is m or c.term() == mt)]
        if all(c.cur[3] == RAW for c in same):
            vals = array("I")
            for c in same:
                vals.extend(c.raw_values())
            if not _increasing(vals):
                vals = array("I", sorted(set(vals)))
        else:
            parts = [c.bitmap() for c in same]
            vals = (parts[0] if len(parts) == 1 else BitMap.union(*parts)).to_array()
        out = writer._put(mt, vals) if vals else None
        for c in same:
            c.advance()
        if out is not None:
            yield out
    out = writer.finish()
    if out is not None:
        yield out
