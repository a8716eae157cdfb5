"""Term-dictionary blocks of sealed segments (compiled); ``rtindex/_py/blocks.py`` is the oracle.

The block format (format 3: terms front-coded against the block's first term, raw postings
as varint gaps, a 16-bit offsets table when the block allows; blocks of formats 1 and 2 in
older segment files are still read), the encoding rule (raw or roaring, decided by the set
alone) and the lookup guarantees are documented once, in the reference
module's docstring; this module produces the same bytes and raises the same errors
(tests/test_blocks.py compares them).

The merge runs its common case (terms whose postings are all raw and small) in a C loop
without the GIL; it falls back to one Python-level step per term for roaring postings, at
block boundaries, and to report errors, so both paths produce the reference's bytes.

The writing side is plain C declared in ``_blocks.pxd`` (``_w_put``, ``_w_flush_to``,
``_roaring_or_none``, ...): BlockWriter, the merge and ``SegmentBuilder.write_blocks``
(``rtindex._ext._segment``, which cimports them) share this one implementation.
"""

from cpython cimport array
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.list cimport PyList_GET_ITEM
from cpython.object cimport Py_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, qsort, realloc
from libc.string cimport memcmp, memcpy, memset

import array as _pyarray

from pyroaring import AbstractBitMap, BitMap

from rtindex.errors import CorruptionError

# rtb_ld16 / rtb_ld32 / rtb_st16 / rtb_st32 and the RAW / ROARING / RAW_MAX / MAX_TERM / HEADER
# constants are declared in _blocks.pxd (shared with rtindex._ext._segment).

__all__ = [
    "BlockWriter",
    "TermFilterBuilder",
    "TermIndex",
    "terms_get",
    "block_cardinality",
    "block_first_last",
    "block_get",
    "block_items",
    "block_range",
    "merge_blocks",
]

cdef uint32_t MAGIC = 0x03425452    # b"RTB\x03" read as a little-endian uint32: what writers write
cdef uint32_t MAGIC_V2 = 0x02425452 # b"RTB\x02": format 2, still read
cdef uint32_t MAGIC_V1 = 0x01425452 # b"RTB\x01": format 1, still read
cdef uint64_t MAXU32 = 0xFFFFFFFF
cdef Py_ssize_t NOGIL_MIN = 4096    # release the GIL for runs of at least this many offsets
cdef uint64_t _bitset_limit = 1 << 27   # deleted sets with max below this become a bitset

cdef array.array _U32 = _pyarray.array("I")
if _U32.itemsize != 4:  # pragma: no cover - no supported platform
    raise ImportError("rtindex._ext._blocks needs a 4-byte array('I')")


def _test_set_bitset_limit(limit):
    """Test hook: set the largest deleted offset that uses a bitset; returns the old limit."""
    global _bitset_limit
    old = _bitset_limit
    _bitset_limit = limit
    return old


def _test_surely_raw(values):
    """Test hook: the encoder's shortcut on an ``array('I')`` of increasing offsets."""
    cdef array.array a = values
    return _surely_raw(a.data.as_uints, Py_SIZE(a))


# ---- small C helpers --------------------------------------------------------------------


cdef inline int _cmp(const unsigned char* a, Py_ssize_t al,
                     const unsigned char* b, Py_ssize_t bl) noexcept nogil:
    """Bytewise three-way comparison, like ``bytes`` ordering."""
    cdef Py_ssize_t m = al if al < bl else bl
    cdef int r = 0
    if m > 0:
        r = memcmp(a, b, <size_t>m)
    if r != 0:
        return r
    return (al > bl) - (al < bl)


cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    /* Length of the common prefix of a[:n] and b[:n], 8 bytes at a time. */
    static inline Py_ssize_t rtb_lcp(const unsigned char *a, const unsigned char *b, Py_ssize_t n) {
        Py_ssize_t i = 0;
        uint64_t x, y;
        while (i + 8 <= n) {
            memcpy(&x, a + i, 8);
            memcpy(&y, b + i, 8);
            if (x != y) {
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
                return i + (__builtin_ctzll(x ^ y) >> 3);
    #else
                break;
    #endif
            }
            i += 8;
        }
        while (i < n && a[i] == b[i])
            i++;
        return i;
    }
    """
    Py_ssize_t rtb_lcp(const unsigned char* a, const unsigned char* b, Py_ssize_t n) noexcept nogil


cdef int _cmp22(const unsigned char* a1, Py_ssize_t al1, const unsigned char* a2, Py_ssize_t al2,
                const unsigned char* b1, Py_ssize_t bl1, const unsigned char* b2, Py_ssize_t bl2) noexcept nogil:
    """Bytewise three-way comparison of ``a1 + a2`` with ``b1 + b2`` (terms in two parts:
    a format 2 entry's term is a prefix of the block's first term and the entry's suffix)."""
    cdef Py_ssize_t m
    cdef int r
    while True:
        if al1 == 0:
            a1 = a2
            al1 = al2
            al2 = 0
        if bl1 == 0:
            b1 = b2
            bl1 = bl2
            bl2 = 0
        if al1 == 0 or bl1 == 0:
            return (al1 > 0) - (bl1 > 0)
        m = al1 if al1 < bl1 else bl1
        r = memcmp(a1, b1, <size_t>m)
        if r != 0:
            return r
        a1 += m
        al1 -= m
        b1 += m
        bl1 -= m


cdef inline int _cmp_ek(const BlockView* v, const Entry* e, const unsigned char* k,
                        Py_ssize_t kl) noexcept nogil:
    """Compare the term of entry ``e`` of ``v`` with ``k``."""
    return _cmp22(v.first, e.pre, v.p + e.ts, e.tlen, k, kl, NULL, 0)


cdef inline int _cmp_ee(const BlockView* va, const Entry* ea, const BlockView* vb,
                        const Entry* eb) noexcept nogil:
    """Compare the terms of two entries (of two blocks)."""
    return _cmp22(va.first, ea.pre, va.p + ea.ts, ea.tlen, vb.first, eb.pre, vb.p + eb.ts, eb.tlen)


cdef inline void _copy_term(unsigned char* q, const BlockView* v, const Entry* e) noexcept nogil:
    """Write the ``e.pre + e.tlen`` bytes of entry ``e``'s term to ``q``."""
    if e.pre > 0:
        memcpy(q, v.first, <size_t>e.pre)
    if e.tlen > 0:
        memcpy(q + e.pre, v.p + e.ts, <size_t>e.tlen)


cdef bytes _term_bytes(const BlockView* v, const Entry* e):
    cdef bytes t = PyBytes_FromStringAndSize(NULL, e.pre + e.tlen)
    _copy_term(<unsigned char*>PyBytes_AS_STRING(t), v, e)
    return t


cdef inline int64_t _get_varint(const unsigned char* p, int64_t pos, int64_t end, uint64_t* v) noexcept nogil:
    """Decode the varint at ``p[pos:end]`` into ``v``: the position after it, or -1 when it
    runs past ``end`` or is longer than 5 bytes."""
    cdef uint64_t x = 0
    cdef int i
    cdef unsigned char c
    if pos < end and p[pos] < 0x80:  # the common case: one byte
        v[0] = p[pos]
        return pos + 1
    for i in range(5):
        if pos + i >= end:
            return -1
        c = p[pos + i]
        x |= <uint64_t>(c & 0x7F) << (7 * i)
        if c < 0x80:
            v[0] = x
            return pos + i + 1
    return -1


cdef inline unsigned char* _put_varint(unsigned char* q, uint64_t v) noexcept nogil:
    """Write ``v`` as a varint at ``q``; returns the byte after it."""
    while v >= 0x80:
        q[0] = <unsigned char>((v & 0x7F) | 0x80)
        q += 1
        v >>= 7
    q[0] = <unsigned char>v
    return q + 1


cdef inline bint _increasing(const uint32_t* v, Py_ssize_t k) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(1, k):
        if v[i - 1] >= v[i]:
            return False
    return True


cdef int _cmp_u32(const void* a, const void* b) noexcept nogil:
    cdef uint32_t x = (<const uint32_t*>a)[0]
    cdef uint32_t y = (<const uint32_t*>b)[0]
    return (x > y) - (x < y)


cdef Py_ssize_t _sort_unique(uint32_t* v, Py_ssize_t k) noexcept nogil:
    """Sort ``v[:k]`` and drop duplicates in place; returns the new length."""
    cdef Py_ssize_t i, j = 0
    if k == 0:
        return 0
    qsort(v, <size_t>k, 4, _cmp_u32)
    for i in range(1, k):
        if v[i] != v[j]:
            j += 1
            v[j] = v[i]
    return j + 1


cdef bint _surely_raw(const uint32_t* v, Py_ssize_t k) noexcept nogil:
    """True when the raw encoding is known to win without serializing a BitMap.

    A lower bound of the portable roaring size: 4 bytes + 8 per 64K chunk (4 with fewer than
    4 chunks) + per chunk the smallest container payload (array 2/value, run 2 + 4/run,
    bitset 8192). Raw wins when ``4 + bound >= _raw_size``. A shortcut only: it never changes
    which encoding is chosen (``_py/blocks.py`` has the same function).
    """
    cdef Py_ssize_t i = 0, chunks = 0, card, runs, payload = 0, pmin, raw = 0
    cdef uint32_t hi
    cdef int64_t prev, last = -1
    if k < RAW_MAX:
        return True
    while i < k:
        hi = v[i] >> 16
        card = 0
        runs = 0
        prev = -2
        while i < k and (v[i] >> 16) == hi:
            if v[i] != prev + 1:
                runs += 1
            prev = v[i]
            raw += _varint_len(<uint64_t>(v[i] - last - 1))
            last = v[i]
            card += 1
            i += 1
        pmin = 2 * card
        if 2 + 4 * runs < pmin:
            pmin = 2 + 4 * runs
        if 8192 < pmin:
            pmin = 8192
        payload += pmin
        chunks += 1
    return 4 + 4 + (8 if chunks >= 4 else 4) * chunks + payload >= raw


cdef inline Py_ssize_t _varint_len(uint64_t x) noexcept nogil:
    """Bytes of the varint of ``x < 2**35``."""
    return 1 + (x >= 1 << 7) + (x >= 1 << 14) + (x >= 1 << 21) + (x >= 1 << 28)


cdef Py_ssize_t _raw_size(const uint32_t* v, Py_ssize_t k) noexcept nogil:
    """Bytes of the raw posting of ``v[:k]``: the varints of the first offset and the gaps - 1."""
    cdef Py_ssize_t i, size = 0
    cdef int64_t prev = -1
    for i in range(k):
        size += _varint_len(<uint64_t>(v[i] - prev - 1))
        prev = v[i]
    return size


cdef inline Py_ssize_t _raw_bound(const BlockView* v, const Entry* e) noexcept nogil:
    """At least the number of offsets of raw entry ``e`` (exact before format 3)."""
    return e.plen if v.fmt == 3 else e.plen >> 2


cdef Py_ssize_t _load_raw(const BlockView* v, const Entry* e, uint32_t* out) noexcept nogil:
    """Decode raw entry ``e`` into ``out`` (room for ``_raw_bound`` offsets): how many, or
    -1 when they are not strictly increasing, -4 when one passes 2**32 - 1 (format 3), -3
    when a varint is malformed."""
    cdef const unsigned char* p = v.p
    cdef Py_ssize_t i, k = 0
    cdef int64_t prev = -1, pos = e.ps, end = e.ps + e.plen
    cdef uint64_t g, x
    cdef uint32_t y
    if v.fmt < 3:
        k = e.plen >> 2
        for i in range(k):
            y = rtb_ld32(p + pos + 4 * i)
            if y <= prev:
                return -1
            prev = y
            out[i] = y
        return k
    x = <uint64_t>-1  # the offset before the first, as the first gap counts from -1
    while pos < end:
        pos = _get_varint(p, pos, end, &g)
        if pos < 0:
            return -3
        x += g + 1
        if x > MAXU32:
            return -4
        out[k] = <uint32_t>x
        k += 1
    return k




cdef int _raise_raw(Py_ssize_t rc) except -1:
    """Raise for a negative result of ``_load_raw``."""
    if rc == -3:
        raise CorruptionError("term block posting is malformed")
    if rc == -4:
        raise CorruptionError("term block posting has an offset past 2**32 - 1")
    raise CorruptionError("term block posting is not strictly increasing")


cdef inline int _check_term(object term) except -1:
    if not PyBytes_Check(term):
        raise TypeError(f"term must be bytes, not {type(term).__name__}")
    return 0


# ---- reading ---------------------------------------------------------------------------


cdef class _Pinned:
    """A block's bytes held in place (bytes, or a slice of a mapped segment file): copying a
    16 KiB block cost more than the lookup in it. ``p`` stays valid while this object lives."""

    def __cinit__(self, block):
        PyObject_GetBuffer(block, &self.view, PyBUF_SIMPLE)
        self.held = True
        self.p = <const unsigned char*>self.view.buf
        self.size = self.view.len

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


cdef int _open(_Pinned b, BlockView* v) except -1:
    """Validate the header of ``b`` and point ``v`` at it (``b`` held while ``v`` is read)."""
    return _open_at(b.p, b.size, v)


cdef int _open_at(const unsigned char* p, Py_ssize_t size, BlockView* v) except -1:
    """Validate the header of the block of ``size`` bytes at ``p`` and point ``v`` at it."""
    cdef uint32_t n, magic
    cdef int64_t table_end
    cdef Entry e
    if size < 12:
        raise CorruptionError(f"term block of {size} bytes is too short")
    magic = rtb_ld32(p)
    if magic == MAGIC:
        v.fmt = 3
        v.table = HEADER
        v.width = p[8]
        if v.width != 2 and v.width != 4:
            raise CorruptionError(f"term block has a bad offset width {v.width}")
    elif magic == MAGIC_V2 or magic == MAGIC_V1:
        v.fmt = 2 if magic == MAGIC_V2 else 1
        v.table = 8
        v.width = 4
    else:
        raise CorruptionError(f"term block has a bad magic number {PyBytes_FromStringAndSize(<const char*>p, 4)!r}")
    n = rtb_ld32(p + 4)
    if n == 0:
        raise CorruptionError("term block has no entries")
    table_end = v.table + v.width * (<int64_t>n + 1)
    if table_end > size:
        raise CorruptionError(f"term block of {size} bytes cannot hold {n} entries")
    v.p = p
    v.n = n
    if _off(v, 0) != table_end or _off(v, n) != size:
        raise CorruptionError("term block offsets table does not match its size")
    v.size = size
    v.table_end = <Py_ssize_t>table_end
    v.first = p
    v.first_len = 0
    if v.fmt > 1:  # every entry refers to the first term: check it now
        _entry_or_raise(v, 0, &e)
        v.first = p + e.ts
        v.first_len = e.tlen
    return 0


cdef inline int64_t _off(const BlockView* v, uint32_t i) noexcept nogil:
    """Offset ``i`` of the offsets table (``i <= v.n``)."""
    if v.width == 2:
        return rtb_ld16(v.p + v.table + 2 * <Py_ssize_t>i)
    return rtb_ld32(v.p + v.table + 4 * <Py_ssize_t>i)


cdef int _entry(const BlockView* v, uint32_t i, Entry* e) noexcept nogil:
    """Decode and check entry ``i < v.n``: 0, or -1 out of bounds, -2 malformed."""
    cdef const unsigned char* p = v.p
    cdef int64_t s = _off(v, i)
    cdef int64_t end = _off(v, i + 1)
    cdef int64_t ts, tlen, plen
    cdef uint64_t shared, tail
    cdef uint32_t head
    cdef int kind
    if v.fmt > 1:
        if s < v.table_end or end > v.size or end < s:
            return -1
        ts = _get_varint(p, s, end, &shared)
        if ts < 0:
            return -2
        ts = _get_varint(p, ts, end, &tail)
        if ts < 0 or shared > <uint64_t>(0 if i == 0 else v.first_len):
            return -2
        tlen = <int64_t>(tail >> 1)
        kind = <int>(tail & 1)
    else:
        if s < v.table_end or end > v.size or end - s < 4:
            return -1
        head = rtb_ld32(p + s)
        shared = 0
        ts = s + 4
        tlen = head & MAX_TERM
        kind = <int>(head >> 30)
    plen = end - ts - tlen
    if kind == RAW and v.fmt == 3:  # varints to the end: at least one, the last one ending
        if plen < 1 or p[end - 1] >= 0x80:
            return -2
    elif kind > ROARING or plen < 4 or (kind == RAW and (plen & 3)) or (kind == ROARING and plen == 4):
        return -2
    e.pre = <Py_ssize_t>shared
    e.ts = <Py_ssize_t>ts
    e.tlen = <Py_ssize_t>tlen
    e.kind = kind
    e.ps = <Py_ssize_t>(ts + tlen)
    e.plen = <Py_ssize_t>plen
    return 0


cdef int _entry_or_raise(const BlockView* v, uint32_t i, Entry* e) except -1:
    cdef int rc = _entry(v, i, e)
    if rc == -1:
        raise CorruptionError(f"term block entry {i} is out of bounds")
    if rc == -2:
        raise CorruptionError(f"term block entry {i} is malformed")
    return 0


cdef struct Key:
    const unsigned char* p      # the key's bytes
    Py_ssize_t len              # its length
    Py_ssize_t lcp              # length of its common prefix with the block's first term
    int c0                      # its order against the first term (<0, 0, >0)


cdef inline void _key_init(const BlockView* v, const unsigned char* p, Py_ssize_t n, Key* k) noexcept nogil:
    """Compare ``p[:n]`` with the first term of ``v`` once, for ``_key_cmp``."""
    cdef Py_ssize_t m = n if n < v.first_len else v.first_len
    cdef Py_ssize_t lcp = rtb_lcp(p, v.first, m)
    k.p = p
    k.len = n
    k.lcp = lcp
    if lcp < m:
        k.c0 = <int>p[lcp] - <int>v.first[lcp]
    else:
        k.c0 = (n > v.first_len) - (n < v.first_len)


cdef inline int _key_cmp(const BlockView* v, const Entry* e, const Key* k) noexcept nogil:
    """Order of key ``k`` against the term of entry ``e`` (<0, 0, >0).

    An entry that shares more than ``k.lcp`` bytes with the first term orders against the
    key as the first term does; otherwise its term and the key agree on the shared bytes,
    and only the rest is compared.
    """
    if e.pre > k.lcp:
        return k.c0
    return _cmp(k.p + e.pre, k.len - e.pre, v.p + e.ts, e.tlen)


cdef int64_t _lower_bound(const BlockView* v, const Key* k) except -1:
    """Index of the first entry whose term is >= key (``n`` when none)."""
    cdef uint32_t lo = 0, hi = v.n, mid
    cdef Entry e
    while lo < hi:
        mid = (lo + hi) >> 1
        if _entry(v, mid, &e) < 0:
            _entry_or_raise(v, mid, &e)
        if _key_cmp(v, &e, k) > 0:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef bint _find(const BlockView* v, bytes key, Entry* e) except -1:
    """Binary search for ``key``: True with ``e`` filled, or False."""
    cdef Key k
    _key_init(v, <const unsigned char*>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), &k)
    cdef int64_t i = _lower_bound(v, &k)
    if i < v.n:
        _entry_or_raise(v, <uint32_t>i, e)
        if _key_cmp(v, e, &k) == 0:
            return True
    return False


cdef object _bitmap(const BlockView* v, const Entry* e):
    """The posting of entry ``e`` as a BitMap (validated)."""
    cdef Py_ssize_t k
    cdef array.array arr
    cdef uint32_t card
    cdef uint32_t small[MAX_VARINT]
    cdef bytes ser
    if e.kind == RAW:
        k = _raw_bound(v, e)
        if k <= MAX_VARINT:  # most terms have one offset: BitMap() + add is twice as fast as BitMap(array)
            k = _load_raw(v, e, small)
            if k < 0:
                _raise_raw(k)
            if k == 1:
                bm = BitMap()
                bm.add(small[0])
                return bm
            arr = array.clone(_U32, k, False)
            memcpy(arr.data.as_uints, small, <size_t>k * 4)
            return BitMap(arr, optimize=False)
        arr = array.clone(_U32, k, False)
        if k >= NOGIL_MIN:
            with nogil:
                k = _load_raw(v, e, arr.data.as_uints)
        else:
            k = _load_raw(v, e, arr.data.as_uints)
        if k < 0:
            _raise_raw(k)
        array.resize(arr, k)
        return BitMap(arr, optimize=False)
    card = rtb_ld32(v.p + e.ps)
    ser = PyBytes_FromStringAndSize(<const char*>(v.p + e.ps + 4), e.plen - 4)
    try:
        bm = BitMap.deserialize(ser)
    except ValueError as exc:
        raise CorruptionError(f"term block posting does not decode: {exc}") from None
    if len(bm) != card or card == 0:
        raise CorruptionError("term block posting has the wrong cardinality")
    return bm


def block_get(block, term):
    """The posting list of ``term`` in ``block``, or None when the block does not hold it."""
    cdef BlockView v
    cdef Entry e
    _check_term(term)
    cdef _Pinned b = _Pinned(block)
    _open(b, &v)
    if not _find(&v, <bytes>term, &e):
        return None
    return _bitmap(&v, &e)


# ---- term filter -----------------------------------------------------------------------
# A blocked Bloom filter over a segment's terms (format in the reference module's docstring):
# a point lookup asks it first, so a segment that lacks the term costs one cache line
# instead of a bisect and a binary search in a 16 KiB block.

cdef extern from *:
    """
    #include <stdint.h>
    /* FNV-1a 64 over the term, then splitmix64's finalizer: stable everywhere (it is stored). */
    static inline uint64_t rtf_fnv(uint64_t h, const unsigned char *p, Py_ssize_t n) {
        Py_ssize_t i;
        for (i = 0; i < n; i++) {
            h ^= p[i];
            h *= 0x100000001b3ULL;
        }
        return h;
    }
    static inline uint64_t rtf_mix(uint64_t h) {
        h ^= h >> 30;
        h *= 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 27;
        h *= 0x94d049bb133111ebULL;
        return h ^ (h >> 31);
    }
    static inline uint64_t rtf_hash(const unsigned char *p, Py_ssize_t n) {
        return rtf_mix(rtf_fnv(0xcbf29ce484222325ULL, p, n));
    }
    /* rtf_hash of the term p1[:n1] + p2[:n2] (a front-coded entry's term) */
    static inline uint64_t rtf_hash2(const unsigned char *p1, Py_ssize_t n1,
                                     const unsigned char *p2, Py_ssize_t n2) {
        return rtf_mix(rtf_fnv(rtf_fnv(0xcbf29ce484222325ULL, p1, n1), p2, n2));
    }
    /* The 64-byte block of hash h: the high 32 bits scaled to [0, nblocks). */
    static inline const unsigned char *rtf_block(const unsigned char *bits, uint32_t nblocks, uint64_t h) {
        return bits + 64 * (size_t)(((h >> 32) * (uint64_t)nblocks) >> 32);
    }
    /* Bit j of a block: the top 9 bits of the low 32 bits of h times 0x9E3779B9^(j+1). */
    static inline void rtf_set(unsigned char *bits, uint32_t nblocks, uint32_t k, uint64_t h) {
        unsigned char *b = (unsigned char *)rtf_block(bits, nblocks, h);
        uint32_t x = (uint32_t)h, j, bit;
        for (j = 0; j < k; j++) {
            x *= 0x9E3779B9u;
            bit = x >> 23;
            b[bit >> 3] |= (unsigned char)(1u << (bit & 7));
        }
    }
    static inline int rtf_test(const unsigned char *bits, uint32_t nblocks, uint32_t k, uint64_t h) {
        const unsigned char *b = rtf_block(bits, nblocks, h);
        uint32_t x = (uint32_t)h, j, bit;
        for (j = 0; j < k; j++) {
            x *= 0x9E3779B9u;
            bit = x >> 23;
            if (!((b[bit >> 3] >> (bit & 7)) & 1))
                return 0;
        }
        return 1;
    }
    """
    uint64_t rtf_hash(const unsigned char* p, Py_ssize_t n) noexcept nogil
    uint64_t rtf_hash2(const unsigned char* p1, Py_ssize_t n1, const unsigned char* p2,
                       Py_ssize_t n2) noexcept nogil
    void rtf_set(unsigned char* bits, uint32_t nblocks, uint32_t k, uint64_t h) noexcept nogil
    bint rtf_test(const unsigned char* bits, uint32_t nblocks, uint32_t k, uint64_t h) noexcept nogil


cdef uint32_t FILTER_MAGIC = 0x01465452     # b"RTF\x01" read as a little-endian uint32
cdef Py_ssize_t FILTER_HEADER = 12          # magic, u32 n_blocks, u32 k
cdef uint64_t FILTER_BITS_PER_TERM = 10
cdef uint32_t FILTER_K = 7
cdef uint32_t FILTER_MAX_K = 16


cdef int _tf_check(const unsigned char* p, Py_ssize_t size, uint32_t* nblocks, uint32_t* k) except -1:
    """Validate a filter's header and size; sets its block count and k."""
    if size < FILTER_HEADER:
        raise CorruptionError(f"term filter of {size} bytes is too short")
    if rtb_ld32(p) != FILTER_MAGIC:
        raise CorruptionError(f"term filter has a bad magic number {PyBytes_FromStringAndSize(<const char*>p, 4)!r}")
    nblocks[0] = rtb_ld32(p + 4)
    k[0] = rtb_ld32(p + 8)
    if nblocks[0] == 0 or not 1 <= k[0] <= FILTER_MAX_K:
        raise CorruptionError(f"term filter header is malformed ({nblocks[0]} blocks, k = {k[0]})")
    if size != FILTER_HEADER + 64 * <int64_t>nblocks[0]:
        raise CorruptionError(f"term filter of {size} bytes does not hold its {nblocks[0]} blocks")
    return 0


cdef class TermFilterBuilder:
    """Builds the term filter of a segment from its encoded blocks: it reads each block's
    entry table and hashes the terms only (postings are never decoded), keeping 8 bytes per
    term until :meth:`finish` sizes the filter to the number of terms."""

    def __dealloc__(self):
        if self.hashes != NULL:
            free(self.hashes)

    @property
    def n_terms(self):
        """Number of terms added so far."""
        return self.n

    def add_block(self, block):
        """Add every term of one encoded block (CorruptionError if it does not decode)."""
        cdef BlockView v
        cdef Entry e
        cdef uint32_t i
        cdef int64_t bad = -1
        cdef uint64_t* out
        cdef _Pinned b = _Pinned(block)
        _open(b, &v)
        if self.n + v.n > self.cap:
            self.hashes = <uint64_t*>safe_realloc(self.hashes, <size_t>max(2 * self.cap, self.n + v.n, 1024),
                                                  sizeof(uint64_t))
            self.cap = max(2 * self.cap, self.n + v.n, 1024)
        out = self.hashes + self.n
        with nogil:  # a seal runs beside ingest
            for i in range(v.n):
                if _entry(&v, i, &e) < 0:
                    bad = i
                    break
                out[i] = rtf_hash2(v.first, e.pre, v.p + e.ts, e.tlen)
        if bad >= 0:
            _entry_or_raise(&v, <uint32_t>bad, &e)
        self.n += v.n

    def finish(self):
        """The filter of every term added so far, as bytes (about 10 bits per term)."""
        cdef uint64_t nb = max(1, (<uint64_t>self.n * FILTER_BITS_PER_TERM + 511) // 512)
        cdef Py_ssize_t i
        cdef unsigned char* p
        cdef unsigned char* bits
        cdef bytes out
        if nb > MAXU32:
            raise ValueError(f"{self.n} terms are too many for one term filter")
        out = PyBytes_FromStringAndSize(NULL, FILTER_HEADER + 64 * <Py_ssize_t>nb)
        p = <unsigned char*>PyBytes_AS_STRING(out)
        memset(p, 0, FILTER_HEADER + 64 * <size_t>nb)
        rtb_st32(p, FILTER_MAGIC)
        rtb_st32(p + 4, <uint32_t>nb)
        rtb_st32(p + 8, FILTER_K)
        bits = p + FILTER_HEADER
        with nogil:
            for i in range(self.n):
                rtf_set(bits, <uint32_t>nb, FILTER_K, self.hashes[i])
        return out


cdef class TermIndex:
    """A sealed segment's term dictionary, looked up in one call: the first term of each
    block (bisected in C) and where each block lies in the segment's mapped file (held
    pinned). A point lookup through Python (bisect, slice, block_get) cost a microsecond
    per segment, and a query looks a term up in every segment of every shard. With a term
    filter (the segment's TermFilterBuilder output), a term the filter rules out costs one
    probe of one 64-byte block and reads no term block."""

    cdef _Pinned data
    cdef list firsts
    cdef uint64_t* pos              # offset and length of block i at pos[2i], pos[2i + 1]
    cdef Py_ssize_t n
    cdef _Pinned filter             # the term filter's bytes (None without one)
    cdef const unsigned char* fbits # its first 64-byte block (NULL without a filter)
    cdef uint32_t fblocks           # its number of 64-byte blocks
    cdef uint32_t fk                # bits set per term

    def __cinit__(self, data, firsts, positions, filter=None):
        cdef Py_ssize_t i
        self.data = _Pinned(data)
        self.firsts = list(firsts)
        self.n = len(self.firsts)
        if len(positions) != self.n:
            raise ValueError(f"{self.n} first terms but {len(positions)} block positions")
        self.pos = <uint64_t*>malloc(max(1, 2 * self.n) * sizeof(uint64_t))
        if self.pos == NULL:
            raise MemoryError()
        for i in range(self.n):
            _check_term(self.firsts[i])
            off, ln = positions[i]
            if off < 0 or ln < 0 or off + ln > self.data.size:
                raise CorruptionError(f"term block {i} at {off}+{ln} lies outside the {self.data.size} bytes of its file")
            self.pos[2 * i] = off
            self.pos[2 * i + 1] = ln
        if filter is not None:
            self.filter = _Pinned(filter)
            _tf_check(self.filter.p, self.filter.size, &self.fblocks, &self.fk)
            self.fbits = self.filter.p + FILTER_HEADER

    def __dealloc__(self):
        free(self.pos)

    def get(self, term):
        """The posting list of ``term``, or None when no block holds it."""
        _check_term(term)
        return self._get(<bytes>term, rtf_hash(<const unsigned char*>PyBytes_AS_STRING(term),
                                                PyBytes_GET_SIZE(term)))

    def may_contain(self, term):
        """False when the term filter rules ``term`` out; True when it may be here (always
        True without a filter). A filter errs only towards True, on about 1% of absent terms."""
        _check_term(term)
        return self.fbits == NULL or rtf_test(self.fbits, self.fblocks, self.fk, rtf_hash(
            <const unsigned char*>PyBytes_AS_STRING(term), PyBytes_GET_SIZE(term)))

    cdef object _get(self, bytes term, uint64_t h):
        """``get`` of ``term``, whose hash (``rtf_hash``) is ``h``."""
        cdef const unsigned char* kp = <const unsigned char*>PyBytes_AS_STRING(term)
        cdef Py_ssize_t klen = PyBytes_GET_SIZE(term)
        cdef Py_ssize_t lo = 0, hi = self.n, mid
        cdef object first
        if self.fbits != NULL and not rtf_test(self.fbits, self.fblocks, self.fk, h):
            return None
        while lo < hi:  # the last block whose first term is <= term
            mid = (lo + hi) >> 1
            first = <object>PyList_GET_ITEM(self.firsts, mid)
            if _cmp(kp, klen, <const unsigned char*>PyBytes_AS_STRING(first), PyBytes_GET_SIZE(first)) < 0:
                hi = mid
            else:
                lo = mid + 1
        if lo == 0:
            return None
        cdef BlockView v
        cdef Entry e
        _open_at(self.data.p + self.pos[2 * (lo - 1)], <Py_ssize_t>self.pos[2 * (lo - 1) + 1], &v)
        if not _find(&v, <bytes>term, &e):
            return None
        return _bitmap(&v, &e)


def terms_get(list indexes, term):
    """``(i, posting list)`` for each of ``indexes`` (TermIndex objects) that holds ``term``,
    in order, in one call: a query looks its term up in every sealed segment of every shard,
    and a selective term is in few of them (the term is hashed once, for every filter)."""
    _check_term(term)
    cdef Py_ssize_t i, n = len(indexes)
    cdef list out = []
    cdef object bm
    cdef uint64_t h = rtf_hash(<const unsigned char*>PyBytes_AS_STRING(term), PyBytes_GET_SIZE(term))
    for i in range(n):
        bm = (<TermIndex?>indexes[i])._get(<bytes>term, h)
        if bm is not None:
            out.append((i, bm))
    return out


cdef Py_ssize_t _count_ends(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i, k = 0
    for i in range(n):
        k += p[i] < 0x80
    return k


def block_cardinality(block, term):
    """Length of ``term``'s posting list in ``block`` (0 when absent); builds no BitMap."""
    cdef BlockView v
    cdef Entry e
    cdef uint32_t card
    _check_term(term)
    cdef _Pinned b = _Pinned(block)
    _open(b, &v)
    if not _find(&v, <bytes>term, &e):
        return 0
    if e.kind == RAW and v.fmt == 3:  # one varint ends at each byte below 0x80
        return _count_ends(v.p + e.ps, e.plen)
    if e.kind == RAW:
        return e.plen >> 2
    card = rtb_ld32(v.p + e.ps)
    if card == 0:
        raise CorruptionError("term block posting has the wrong cardinality")
    return card


cdef list _scan(const BlockView* v, uint32_t start, object hi):
    cdef list out = []
    cdef Entry e
    cdef uint32_t i
    cdef const unsigned char* hp = NULL
    cdef Py_ssize_t hlen = 0
    cdef bytes prev = None
    if hi is not None:
        hp = <const unsigned char*>PyBytes_AS_STRING(hi)
        hlen = PyBytes_GET_SIZE(hi)
    for i in range(start, v.n):
        _entry_or_raise(v, i, &e)
        if hp != NULL and _cmp_ek(v, &e, hp, hlen) >= 0:
            break
        if prev is not None and _cmp_ek(v, &e, <const unsigned char*>PyBytes_AS_STRING(prev),
                                        PyBytes_GET_SIZE(prev)) <= 0:
            raise CorruptionError("term block terms are not strictly increasing")
        prev = _term_bytes(v, &e)
        out.append((prev, _bitmap(v, &e)))
    return out


def block_range(block, lo, hi):
    """Entries with ``lo <= term < hi`` (None: unbounded), in term order."""
    cdef BlockView v
    cdef Key k
    cdef int64_t start = 0
    if lo is not None:
        _check_term(lo)
    if hi is not None:
        _check_term(hi)
    cdef _Pinned b = _Pinned(block)
    _open(b, &v)
    if lo is not None:
        _key_init(&v, <const unsigned char*>PyBytes_AS_STRING(lo), PyBytes_GET_SIZE(lo), &k)
        start = _lower_bound(&v, &k)
    return _scan(&v, <uint32_t>start, hi)


def block_items(block):
    """Every (term, posting list) of ``block``, in term order."""
    cdef BlockView v
    cdef _Pinned b = _Pinned(block)
    _open(b, &v)
    return _scan(&v, 0, None)


def block_first_last(block):
    """(first term, last term) of ``block``."""
    cdef BlockView v
    cdef Entry e
    cdef _Pinned b = _Pinned(block)
    _open(b, &v)
    _entry_or_raise(&v, 0, &e)
    first = _term_bytes(&v, &e)
    _entry_or_raise(&v, v.n - 1, &e)
    return first, _term_bytes(&v, &e)


# ---- writing ---------------------------------------------------------------------------


cdef int _w_grow(WState* w, Py_ssize_t need) noexcept nogil:
    """Room for one more entry of ``need`` bytes; -1 (``w`` unchanged) when out of memory."""
    if grow(<void**>&w.data, &w.data_cap, w.data_len + need, 1, 4096) < 0:
        return -1
    return grow(<void**>&w.starts, &w.starts_cap, w.n + 1, sizeof(uint32_t), 256)


cdef int _w_reserve(WState* w, Py_ssize_t need) except -1:
    """Room for one more entry of ``need`` bytes, or MemoryError."""
    if _w_grow(w, need) < 0:
        raise MemoryError(f"cannot allocate a term block of {w.data_len + need} bytes")
    return 0


cdef void _w_put(WState* w, const unsigned char* t1, Py_ssize_t l1, const unsigned char* t2,
                 Py_ssize_t l2, const offset_t* vals, Py_ssize_t k, const unsigned char* ser,
                 Py_ssize_t ser_len) noexcept nogil:
    """Append the entry of term ``t1 + t2`` (two parts, so that callers need not join them).

    Raw when ``ser`` is NULL (``vals[:k]``), else roaring (cardinality ``k``, then
    ``ser[:ser_len]``). The term is stored as the length of its longest common prefix with
    the pending block's first term and the rest. The caller reserved ``_w_entry_size``
    bytes and a start slot; ``t1``, ``t2`` do not point into ``w.data``.
    """
    cdef unsigned char* q = w.data + w.data_len
    cdef const unsigned char* f = w.data + w.first_ts
    cdef Py_ssize_t tlen = l1 + l2, shared = 0
    cdef Py_ssize_t m = tlen if tlen < w.first_len else w.first_len
    if w.n > 0:  # the common prefix of t1 + t2 and the first term
        shared = rtb_lcp(t1, f, l1 if l1 < m else m)
        if shared == l1 and m > l1:
            shared += rtb_lcp(t2, f + l1, m - l1)
    w.starts[w.n] = <uint32_t>w.data_len
    q = _put_varint(q, <uint64_t>shared)
    q = _put_varint(q, <uint64_t>(tlen - shared) << 1 | (0 if ser == NULL else ROARING))
    if w.n == 0:
        w.first_ts = q - w.data
        w.first_len = tlen
    w.n += 1
    if shared < l1:
        memcpy(q, t1 + shared, <size_t>(l1 - shared))
        q += l1 - shared
        if l2 > 0:
            memcpy(q, t2, <size_t>l2)
        q += l2
    elif tlen > shared:
        memcpy(q, t2 + (shared - l1), <size_t>(tlen - shared))
        q += tlen - shared
    if ser == NULL:
        q = _put_raw(q, vals, k)
    else:
        rtb_st32(q, <uint32_t>k)
        memcpy(q + 4, ser, <size_t>ser_len)
        q += 4 + ser_len
    w.data_len = q - w.data
    w.n_terms += 1


cdef unsigned char* _put_raw(unsigned char* q, const offset_t* vals, Py_ssize_t k) noexcept nogil:
    """Write the raw posting of ``vals[:k]`` at ``q``; returns the byte after it."""
    cdef Py_ssize_t i
    cdef int64_t prev = -1
    for i in range(k):
        q = _put_varint(q, <uint64_t>(vals[i] - prev - 1))
        prev = vals[i]
    return q


cdef void _w_entry_term(const WState* w, Py_ssize_t j, Entry* e) noexcept nogil:
    """Where the term of pending entry ``j`` lies in ``w.data`` (``pre``, ``ts``, ``tlen``):
    the writer's own bytes, so unchecked."""
    cdef uint64_t shared, tail
    cdef int64_t pos = _get_varint(w.data, w.starts[j], w.data_len, &shared)
    pos = _get_varint(w.data, pos, w.data_len, &tail)
    e.pre = <Py_ssize_t>shared
    e.ts = <Py_ssize_t>pos
    e.tlen = <Py_ssize_t>(tail >> 1)


cdef void _w_write_block(const WState* w, unsigned char* q) noexcept nogil:
    """Write the pending block (``_w_size(w)`` bytes, at most 4 GiB) to ``q``."""
    cdef Py_ssize_t n = w.n, i, size = _w_size(w)
    cdef Py_ssize_t table_end = size - w.data_len
    rtb_st32(q, MAGIC)
    rtb_st32(q + 4, <uint32_t>n)
    if size <= 0xFFFF:
        q[8] = 2
        for i in range(n):
            rtb_st16(q + HEADER + 2 * i, <uint32_t>(table_end + w.starts[i]))
        rtb_st16(q + HEADER + 2 * n, <uint32_t>size)
    else:
        q[8] = 4
        for i in range(n):
            rtb_st32(q + HEADER + 4 * i, <uint32_t>(table_end + w.starts[i]))
        rtb_st32(q + HEADER + 4 * n, <uint32_t>size)
    memcpy(q + table_end, w.data, <size_t>w.data_len)


cdef int _w_flush_to(WState* w, BlockOut* out) noexcept nogil:
    """Append the pending block to ``out`` and empty ``w`` (``w.last`` is left as it was).

    Returns 0, -1 when out of memory, -2 when the block is larger than 4 GiB.
    """
    cdef Py_ssize_t size = _w_size(w)
    if size > <Py_ssize_t>MAXU32:
        return -2
    if grow(<void**>&out.data, &out.cap, out.len + size, 1, 1 << 16) < 0:
        return -1
    if grow(<void**>&out.ends, &out.ends_cap, out.n + 1, sizeof(Py_ssize_t), 64) < 0:
        return -1
    _w_write_block(w, out.data + out.len)
    out.len += size
    out.ends[out.n] = out.len
    out.n += 1
    w.n = 0
    w.data_len = 0
    return 0


cdef list _blockout_list(const BlockOut* out):
    """``(first_term, block)`` of every block of ``out``, as BlockWriter returns them."""
    cdef list res = []
    cdef Py_ssize_t i, start = 0
    cdef const unsigned char* p
    cdef uint32_t table_end
    cdef int64_t pos
    cdef uint64_t shared, tail
    for i in range(out.n):
        p = out.data + start
        # entry 0, at the first offset: varint 0, varint tail, the whole first term
        table_end = rtb_ld16(p + HEADER) if p[8] == 2 else rtb_ld32(p + HEADER)
        pos = _get_varint(p, table_end, out.ends[i] - start, &shared)
        pos = _get_varint(p, pos, out.ends[i] - start, &tail)
        first = PyBytes_FromStringAndSize(<const char*>(p + pos), <Py_ssize_t>(tail >> 1))
        block = PyBytes_FromStringAndSize(<const char*>p, out.ends[i] - start)
        res.append((first, block))
        start = out.ends[i]
    return res


cdef void _blockout_free(BlockOut* out) noexcept nogil:
    free(out.data)
    free(out.ends)
    out.data = NULL
    out.ends = NULL
    out.len = out.cap = out.n = out.ends_cap = 0


cdef bytes _roaring_or_none(const offset_t* vals, Py_ssize_t k, object arr):
    """``BitMap(vals[:k]).serialize()`` when the roaring encoding wins, else None (raw).

    The one place that makes the choice: raw when ``_surely_raw`` (always below RAW_MAX
    offsets), else as ``_roaring_ser`` decides. ``arr``: an ``array('I')`` holding
    ``vals[:k]`` (None: a copy is made).
    """
    if _surely_raw(vals, k):
        return None
    return _roaring_ser(vals, k, arr)


cdef bytes _roaring_ser(const offset_t* vals, Py_ssize_t k, object arr):
    """``_roaring_or_none`` for a posting that ``_surely_raw`` already turned down:
    ``BitMap(vals[:k]).serialize()`` when ``4 + len(serialized)`` is less than the raw
    posting's size, else None."""
    cdef array.array a
    cdef bytes ser
    if arr is None:
        a = array.clone(_U32, k, False)
        memcpy(a.data.as_uints, vals, <size_t>k * 4)
        arr = a
    ser = BitMap(arr).serialize()
    if 4 + PyBytes_GET_SIZE(ser) < _raw_size(vals, k):
        return ser
    return None


cdef class BlockWriter:
    """Packs (term, postings) pairs, added in increasing term order, into blocks."""

    def __cinit__(self):
        memset(&self.w, 0, sizeof(WState))
        self.w.last_len = -1

    def __init__(self, target_bytes=16384):
        if not isinstance(target_bytes, int) or isinstance(target_bytes, bool):
            raise TypeError("target_bytes must be an int")
        if target_bytes < 1:
            raise ValueError("target_bytes must be >= 1")
        self.w.target = target_bytes if target_bytes < (1 << 62) else (1 << 62)

    def __dealloc__(self):
        if self.w.data != NULL:
            free(self.w.data)
        if self.w.starts != NULL:
            free(self.w.starts)
        if self.w.last != NULL:
            free(self.w.last)

    @property
    def n_terms(self):
        """Number of terms written so far (empty postings are not counted)."""
        return self.w.n_terms

    def add(self, term, postings):
        """Add ``term`` (greater than every term added before) with its row offsets.

        ``postings`` is an ``array('I')`` of strictly increasing offsets or a pyroaring
        ``BitMap``; an empty one is skipped (not checked against the order). Returns a
        finished ``(first_term, block)`` once the current block reaches ``target_bytes``.
        """
        cdef array.array arr = None
        cdef Py_ssize_t k, tlen
        cdef const unsigned char* t
        cdef Entry e
        cdef bytes last = None
        if not PyBytes_Check(term):
            raise TypeError(f"term must be bytes, not {type(term).__name__}")
        if isinstance(postings, array.array):
            arr = <array.array>postings
            if arr.ob_descr.typecode != c"I" or arr.ob_descr.itemsize != 4:
                raise TypeError(f"postings must be array('I'), not array({postings.typecode!r})")
            k = Py_SIZE(arr)
        elif isinstance(postings, AbstractBitMap):
            k = len(postings)
        else:
            raise TypeError(
                f"postings must be array('I') or a pyroaring BitMap, not {type(postings).__name__}")
        if k == 0:
            return None
        tlen = PyBytes_GET_SIZE(term)
        if tlen > MAX_TERM:
            raise ValueError(f"term of {tlen} bytes is too long (at most {MAX_TERM})")
        if arr is None:
            arr = postings.to_array()
        elif not _increasing(arr.data.as_uints, k):
            raise ValueError("postings must be strictly increasing")
        t = <const unsigned char*>PyBytes_AS_STRING(term)
        if self.w.n > 0:
            _w_entry_term(&self.w, self.w.n - 1, &e)
            if _cmp22(t, tlen, NULL, 0, self.w.data + self.w.first_ts, e.pre,
                      self.w.data + e.ts, e.tlen) <= 0:
                last = PyBytes_FromStringAndSize(NULL, e.pre + e.tlen)
                memcpy(PyBytes_AS_STRING(last), self.w.data + self.w.first_ts, <size_t>e.pre)
                memcpy(PyBytes_AS_STRING(last) + e.pre, self.w.data + e.ts, <size_t>e.tlen)
        elif self.w.last_len >= 0 and _cmp(t, tlen, self.w.last, self.w.last_len) <= 0:
            last = PyBytes_FromStringAndSize(<const char*>self.w.last, self.w.last_len)
        if last is not None:
            raise ValueError(f"terms must be added in strictly increasing order: {term!r} after {last!r}")
        return self._put(t, tlen, arr.data.as_uints, k, arr)

    cdef object _put(self, const unsigned char* term, Py_ssize_t tlen, const offset_t* vals,
                     Py_ssize_t k, object arr):
        """Encode one non-empty increasing posting; returns a finished block or None."""
        cdef WState* w = &self.w
        cdef bytes ser = _roaring_or_none(vals, k, arr)
        if ser is None:
            _w_reserve(w, _w_entry_size(tlen, k, -1))
            _w_put(w, term, tlen, NULL, 0, vals, k, NULL, 0)
        else:
            _w_reserve(w, _w_entry_size(tlen, k, PyBytes_GET_SIZE(ser)))
            _w_put(w, term, tlen, NULL, 0, vals, k,
                   <const unsigned char*>PyBytes_AS_STRING(ser), PyBytes_GET_SIZE(ser))
        if _w_size(w) >= w.target:
            return self._flush()
        return None

    def finish(self):
        """The last, partly filled block, or None when nothing is pending."""
        if self.w.n == 0:
            return None
        return self._flush()

    cdef object _flush(self):
        cdef WState* w = &self.w
        cdef Py_ssize_t total = _w_size(w), llen
        cdef Entry e
        if total > <Py_ssize_t>MAXU32:
            raise ValueError("block larger than 4 GiB")
        out = PyBytes_FromStringAndSize(NULL, total)
        _w_write_block(w, <unsigned char*>PyBytes_AS_STRING(out))
        first = PyBytes_FromStringAndSize(<const char*>(w.data + w.first_ts), w.first_len)
        _w_entry_term(w, w.n - 1, &e)
        llen = e.pre + e.tlen
        if llen > w.last_cap:
            w.last = <unsigned char*>safe_realloc(w.last, <size_t>llen, 1)
            w.last_cap = llen
        if e.pre > 0:
            memcpy(w.last, w.data + w.first_ts, <size_t>e.pre)
        if e.tlen > 0:
            memcpy(w.last + e.pre, w.data + e.ts, <size_t>e.tlen)
        w.last_len = llen
        w.n = 0
        w.data_len = 0
        return first, out


# ---- merging ---------------------------------------------------------------------------


cdef inline bint _is_deleted(const CState* c, uint32_t v) noexcept nogil:
    cdef Py_ssize_t lo, hi, mid
    if c.dbits != NULL:
        return v < c.dbits_n and (c.dbits[v >> 3] >> (v & 7)) & 1
    if c.dsorted != NULL:
        lo = 0
        hi = c.dsorted_n
        while lo < hi:
            mid = (lo + hi) >> 1
            if c.dsorted[mid] < v:
                lo = mid + 1
            else:
                hi = mid
        return lo < c.dsorted_n and c.dsorted[lo] == v
    return False


cdef int _filter(const CState* c, offset_t* out, Py_ssize_t* got, uint32_t* bad) noexcept nogil:
    """The current raw posting of ``c`` minus deletes, plus shift, into ``out`` (room for
    ``_raw_bound`` offsets).

    Returns 0, -2 when an offset overflows uint32 after the shift (``bad`` is the offending
    offset), or what ``_load_raw`` returns for a corrupt posting (-1, -3, -4).
    """
    cdef Py_ssize_t k = _load_raw(&c.v, &c.e, out), i, cnt = 0
    cdef uint32_t v
    if k < 0:
        return <int>k
    for i in range(k):
        v = out[i]
        if _is_deleted(c, v):
            continue
        if v + c.shift > MAXU32:
            bad[0] = v
            return -2
        out[cnt] = <uint32_t>(v + c.shift)
        cnt += 1
    got[0] = cnt
    return 0


cdef int _raise_filter(int rc, uint32_t bad, uint64_t shift) except -1:
    if rc != -2:
        _raise_raw(rc)
    raise ValueError(f"offset {bad} + shift {shift} does not fit in uint32")


cdef class _Cursor:
    """One merge input: the current block of a segment and the position in it."""

    def __cinit__(self):
        memset(&self.s, 0, sizeof(CState))

    def __init__(self, block_iter, shift, deleted):
        cdef array.array darr
        cdef Py_ssize_t n, i
        cdef uint32_t mx, v
        if not isinstance(shift, int) or isinstance(shift, bool):
            raise TypeError(f"shift must be an int, not {type(shift).__name__}")
        if not 0 <= shift <= MAXU32:
            raise ValueError(f"shift {shift} is outside [0, 2**32)")
        if deleted is not None and not isinstance(deleted, AbstractBitMap):
            raise TypeError(f"deleted must be a pyroaring BitMap or None, not {type(deleted).__name__}")
        self.it = iter(block_iter)
        self.s.shift = shift
        if deleted is not None and deleted.copy_on_write:  # pyroaring won't mix the two kinds
            deleted = BitMap(deleted.to_array())
        self.deleted = deleted if deleted else None
        if self.deleted is None:
            return
        darr = deleted.to_array()
        n = Py_SIZE(darr)
        mx = darr.data.as_uints[n - 1]
        if mx < _bitset_limit:
            self.s.dbits = <unsigned char*>safe_realloc(NULL, (mx >> 3) + 1, 1)
            memset(self.s.dbits, 0, (mx >> 3) + 1)
            for i in range(n):
                v = darr.data.as_uints[i]
                self.s.dbits[v >> 3] |= <unsigned char>(1 << (v & 7))
            self.s.dbits_n = <uint64_t>mx + 1
        else:
            self.darr = darr
            self.s.dsorted = darr.data.as_uints
            self.s.dsorted_n = n

    def __dealloc__(self):
        if self.s.dbits != NULL:
            free(self.s.dbits)

    cdef int load(self) except -1:
        """Move to the first entry of the next block, or set ``done``."""
        cdef BlockView v
        try:
            blk = next(self.it)
        except StopIteration:
            self.block = None
            self.s.v.p = NULL
            self.s.done = True
            return 0
        self.block = _Pinned(blk)
        _open(self.block, &v)
        self.s.v = v
        self.s.i = 0
        _entry_or_raise(&self.s.v, 0, &self.s.e)
        return 0

    cdef int advance(self) except -1:
        self.s.i += 1
        if self.s.i < self.s.v.n:
            _entry_or_raise(&self.s.v, self.s.i, &self.s.e)
        else:
            self.load()
        return 0

    cdef object bitmap(self):
        """The current posting (any kind) minus deletes, plus shift."""
        cdef array.array arr
        cdef Py_ssize_t got = 0
        cdef uint32_t bad = 0
        cdef int rc
        if self.s.e.kind == RAW:
            arr = array.clone(_U32, _raw_bound(&self.s.v, &self.s.e), False)
            rc = _filter(&self.s, arr.data.as_uints, &got, &bad)
            if rc < 0:
                _raise_filter(rc, bad, self.s.shift)
            array.resize(arr, got)
            return BitMap(arr, optimize=False)
        bm = _bitmap(&self.s.v, &self.s.e)
        if self.deleted is not None:
            bm -= self.deleted
        if bm and self.s.shift:
            if bm.max() + self.s.shift > MAXU32:
                raise ValueError(f"offset {bm.max()} + shift {self.s.shift} does not fit in uint32")
            bm = bm.shift(self.s.shift)
        return bm


cdef inline int _grow_last(MState* m, Py_ssize_t n) except -1:
    if n > m.last_cap:
        m.last = <unsigned char*>safe_realloc(m.last, <size_t>n, 1)
        m.last_cap = n
    return 0


cdef inline int _grow_scratch(MState* m, Py_ssize_t n) except -1:
    if n > m.scratch_cap:
        m.scratch = <offset_t*>safe_realloc(m.scratch, <size_t>n, sizeof(offset_t))
        m.scratch_cap = n
    return 0


cdef Py_ssize_t _fast(MState* m) noexcept nogil:
    """Merge terms while each is plain C work; returns how many it merged.

    A term is merged here only when every input holding it has a raw posting and a next
    entry in its current block, the result is surely raw, nothing is wrong, and the output
    block does not fill up; otherwise nothing is changed and ``slow_step`` does that term,
    with the GIL.
    """
    cdef Py_ssize_t merged = 0, j, total, cnt, got, need, kk, tl
    cdef CState* c
    cdef CState* best
    cdef bint dup
    cdef int r
    cdef uint32_t bad
    cdef WState* w = m.w
    while True:
        best = NULL
        dup = False
        for j in range(m.k):
            c = m.cs[j]
            if c.done:
                continue
            if best == NULL:
                best = c
            else:
                r = _cmp_ee(&c.v, &c.e, &best.v, &best.e)
                if r < 0:
                    best = c
                    dup = False
                elif r == 0:
                    dup = True
        if best == NULL:
            return merged
        tl = best.e.pre + best.e.tlen
        if m.last_len >= 0 and _cmp_ek(&best.v, &best.e, m.last, m.last_len) <= 0:
            return merged
        if tl > m.last_cap:
            return merged
        total = 0
        for j in range(m.k):
            c = m.cs[j]
            c.hit = not c.done and (c == best or (dup and _cmp_ee(&c.v, &c.e, &best.v, &best.e) == 0))
            if not c.hit:
                continue
            kk = _raw_bound(&c.v, &c.e)
            if c.e.kind != RAW or c.i + 1 >= c.v.n or _entry(&c.v, c.i + 1, &c.nxt) < 0:
                return merged
            total += kk
        if total > m.scratch_cap:
            return merged
        cnt = 0
        for j in range(m.k):
            c = m.cs[j]
            if c.hit:
                if _filter(c, m.scratch + cnt, &got, &bad) < 0:
                    return merged
                cnt += got
        if dup and not _increasing(m.scratch, cnt):
            cnt = _sort_unique(m.scratch, cnt)
        if not _surely_raw(m.scratch, cnt):
            return merged  # may be roaring: BitMap work needs the GIL
        if cnt > 0:
            need = _w_entry_size(tl, cnt, -1)
            if w.data_len + need > w.data_cap or w.n >= w.starts_cap:
                return merged
            if _block_size(w.n + 1, w.data_len + need) >= w.target:
                return merged
        # commit: nothing above changed any state
        _copy_term(m.last, &best.v, &best.e)
        m.last_len = tl
        if cnt > 0:
            _w_put(w, m.last, tl, NULL, 0, m.scratch, cnt, NULL, 0)
        for j in range(m.k):
            c = m.cs[j]
            if c.hit:
                c.i += 1
                c.e = c.nxt
        merged += 1


cdef class _Merger:
    """State of one merge_blocks() call; next_block() runs it to the next output block."""

    def __cinit__(self):
        memset(&self.m, 0, sizeof(MState))
        self.m.last_len = -1

    def __init__(self, list cursors, BlockWriter writer):
        cdef Py_ssize_t j
        self.cursors = cursors
        self.writer = writer
        self.m.k = len(cursors)
        self.m.cs = <CState**>safe_realloc(NULL, <size_t>max(self.m.k, 1), sizeof(CState*))
        for j in range(self.m.k):
            self.m.cs[j] = &(<_Cursor>cursors[j]).s
        self.m.w = &writer.w
        _grow_scratch(&self.m, RAW_MAX * (self.m.k + 1))
        _grow_last(&self.m, 256)
        # room for a full block, so the nogil loop rarely stops to grow the writer
        _w_reserve(&writer.w, min(writer.w.target, 1 << 20) + 4096)
        if writer.w.starts_cap < 1024:
            writer.w.starts = <uint32_t*>safe_realloc(writer.w.starts, 1024, sizeof(uint32_t))
            writer.w.starts_cap = 1024

    def __dealloc__(self):
        if self.m.cs != NULL:
            free(self.m.cs)
        if self.m.last != NULL:
            free(self.m.last)
        if self.m.scratch != NULL:
            free(self.m.scratch)

    cdef object next_block(self):
        cdef MState* m = &self.m
        if self.finished:
            return None
        if not self.started:
            self.started = True
            for c in self.cursors:
                (<_Cursor>c).load()
        while True:
            with nogil:
                _fast(m)
            out = self.slow_step()
            if out is not None:
                return out
            if self.finished:
                return None

    cdef object slow_step(self):
        """Merge exactly one term (any kind), raising what is wrong; returns a block or None."""
        cdef MState* m = &self.m
        cdef Py_ssize_t j, best = -1, total = 0, cnt = 0, got = 0, tl
        cdef CState* c
        cdef CState* b
        cdef bint all_raw = True
        cdef uint32_t bad = 0
        cdef int rc
        cdef const offset_t* vals
        cdef array.array arr = None
        for j in range(m.k):
            c = m.cs[j]
            if not c.done and (best < 0 or _cmp_ee(&c.v, &c.e, &m.cs[best].v, &m.cs[best].e) < 0):
                best = j
        if best < 0:
            self.finished = True
            return self.writer.finish()
        b = m.cs[best]
        tl = b.e.pre + b.e.tlen
        if m.last_len >= 0 and _cmp_ek(&b.v, &b.e, m.last, m.last_len) <= 0:
            raise CorruptionError("merge input terms are not strictly increasing")
        _grow_last(m, tl)
        _copy_term(m.last, &b.v, &b.e)
        m.last_len = tl
        for j in range(m.k):
            c = m.cs[j]
            c.hit = not c.done and (j == best or _cmp_ek(&c.v, &c.e, m.last, tl) == 0)
            if c.hit:
                if c.e.kind == RAW:
                    total += _raw_bound(&c.v, &c.e)
                else:
                    all_raw = False
        if all_raw:
            _grow_scratch(m, total)
            for j in range(m.k):
                c = m.cs[j]
                if c.hit:
                    if total >= NOGIL_MIN:
                        with nogil:
                            rc = _filter(c, m.scratch + cnt, &got, &bad)
                    else:
                        rc = _filter(c, m.scratch + cnt, &got, &bad)
                    if rc < 0:
                        _raise_filter(rc, bad, c.shift)
                    cnt += got
            if not _increasing(m.scratch, cnt):
                cnt = _sort_unique(m.scratch, cnt)
            vals = m.scratch
        else:
            parts = [(<_Cursor>self.cursors[j]).bitmap() for j in range(m.k) if m.cs[j].hit]
            u = parts[0] if len(parts) == 1 else BitMap.union(*parts)
            arr = u.to_array()
            cnt = Py_SIZE(arr)
            vals = arr.data.as_uints
        out = None
        if cnt > 0:
            out = self.writer._put(m.last, tl, vals, cnt, arr)
        for j in range(m.k):
            if m.cs[j].hit:
                (<_Cursor>self.cursors[j]).advance()
        return out


def _merge_gen(_Merger merger):
    while True:
        out = merger.next_block()
        if out is None:
            return
        yield out


def merge_blocks(inputs, target_bytes=16384):
    """Merge the term blocks of several segments into the blocks of one.

    ``inputs`` is a list of ``(block_iter, shift, deleted)``: ``block_iter`` yields one
    segment's blocks in term order; each of its postings loses ``deleted`` and then gains
    ``shift``. Postings of one term are unioned; terms left empty are dropped. Yields
    ``(first_term, block)`` as :class:`BlockWriter` does, holding one block per input.
    Arguments are checked at call time; blocks as they are read.
    """
    writer = BlockWriter(target_bytes)
    cursors = [_Cursor(*inp) for inp in inputs]
    return _merge_gen(_Merger(cursors, writer))
