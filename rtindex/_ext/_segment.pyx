"""Compiled mutable segment builder: the same results as ``rtindex/_py/segment.py``, faster.

``rtindex/_py/segment.py`` is the contract (its docstring states the flattening rules); the
tests compare the two on generated documents, byte for byte, including error messages.

Where the time goes, and what is done about it (a ~60-field event has ~70 terms, a third of
them new in a high-cardinality stream):

- paths are a tree of ``_Node`` objects keyed by the (exact ``str``) object key, so a path is
  encoded once per segment, not once per document. Members usually come in the order of the
  previous document, so each node predicts its next sibling and confirms the prediction by
  key identity (orjson reuses key objects): most members cost no dict lookup at all;
- terms are found through one open-addressing C hash table keyed by (column id, 64-bit
  value key): ints, floats and timestamps are keyed by their 8-byte encoding (exact, no
  compare), strings by ``hash(str)`` and then compared with the stored str. A slot is 16
  bytes (key, column, term id); the term itself (its str and posting list) is an entry of
  ``_terms``, a dense array in creation order. An existing term costs two cache misses, but
  the table is small: each doubling of it is memory fresh from the kernel, which zeroes it
  (on a VM, ~1.4 GB/s: measured with perf, most of the ingest thread's page-fault time was
  this), and 40-byte slots made 2.5x as much of it. The table lives on transparent huge
  pages from 2 MiB (``huge_zalloc``): fewer faults, fewer TLB misses on probes;
- term *bytes* are not built while indexing: a term keeps its column and value, and the
  bytes are made when read (``column_terms``, ``postings``, ``sorted_postings``); the seal
  (``write_blocks``) never makes them as Python objects: it sorts the terms and encodes the
  term blocks in C, with the block format code of ``_blocks`` (cimported);
- a posting list of one or two rows is stored inline in the entry (most high-cardinality
  terms), longer ones in a heap block grown by doubling;
- the column store is typed C buffers in Arrow's layout, filled by ``add``: int64 (INT,
  TIMESTAMP), double (FLOAT), bits (BOOL), UTF-8 arenas with int64 offsets (STRING, and
  ARRAY as its JSON text), nothing but the row offsets for NULL. No value object is kept
  (they were most of the builder's memory), and ``column``/``columns`` hand Arrow arrays
  copied from the buffers with a memcpy (without the GIL when large) instead of converting
  Python objects;
- ``add`` works in two phases. The walk validates every value, fills the column store and
  queues the document's terms, prefetching their table slots; then ``_commit`` resolves the
  queue in walk order, by when the slots (a cache miss each in a large table) have arrived
  together instead of one after another (and for strings, prefetches the entries and then
  their strs before comparing). A SchemaError can only come from the walk, before
  any term is touched; whatever fails, ``_rollback`` undoes what the document added
  (postings ending with its offset, the terms it created, column values): all or nothing.

Not thread-safe, like the reference: one writer at a time, readers between ``add`` calls
(``rtindex.shard.Shard`` holds a lock around both). ``write_blocks`` releases the GIL (for
all but the BitMap work and making its output), ``column``/``columns`` while copying many
bytes; ``add`` raises RuntimeError meanwhile, so nothing moves the table, the terms or a
buffer under them. Other reads keep the GIL: copying a posting list is a memcpy of at most a few MB.
"""

cimport cython
from cpython.array cimport array, clone, resize_smart
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError, PyDict_Next
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject, PyObject_Hash
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport (
    PyUnicode_AsUTF8AndSize,
    PyUnicode_AsUTF8String,
    PyUnicode_DecodeUTF8,
    PyUnicode_FromObject,
)
from libc.math cimport isfinite
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc, qsort, realloc
from libc.string cimport memchr, memcmp, memcpy, memset

from rtindex._ext._blocks cimport (
    MAX_TERM,
    RAW_MAX,
    BlockOut,
    BlockWriter,
    WState,
    _blockout_free,
    _blockout_list,
    _roaring_ser,
    _surely_raw,
    _w_entry_size,
    _w_flush_to,
    _w_grow,
    _w_put,
    _w_size,
)
from rtindex._ext._types cimport huge_free, huge_zalloc, offset_t, safe_realloc, term_id_t

import os

from operator import index as _index

import pyarrow as pa
from orjson import dumps as _dumps

from rtindex.columns import ARROW_TYPES, check_batch
from rtindex.errors import SchemaError
from rtindex.keys import json_path

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    int PyUnicode_KIND(object o)
    void* PyUnicode_DATA(object o)
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1
    int Py_EnterRecursiveCall(const char* where)
    void Py_LeaveRecursiveCall()
    const Py_ssize_t PY_SSIZE_T_MAX
    void PyObject_GC_UnTrack(object o)
    ctypedef struct PyASCIIObject:
        pass
    ctypedef struct PyCompactUnicodeObject:
        pass
    # Renamed so that Cython does not add its own error check: callers test the result.
    int _list_append "PyList_Append"(object lst, object item)

cdef extern from *:
    """
    /* What hash() of a str computes over its characters as stored (see ascii_hash):
       public as Py_HashBuffer from 3.14; 3.13 still exports _Py_HashBytes but no longer
       declares it. */
    #if PY_VERSION_HEX >= 0x030E0000
    #define rt_hash_bytes(p, n) Py_HashBuffer((p), (n))
    #else
    #if PY_VERSION_HEX >= 0x030D0000
    PyAPI_FUNC(Py_hash_t) _Py_HashBytes(const void *, Py_ssize_t);
    #endif
    #define rt_hash_bytes(p, n) _Py_HashBytes((p), (n))
    #endif
    #define RT_GOLDEN 0x9E3779B97F4A7C15ULL
    #define RT_MIX1 0xBF58476D1CE4E5B9ULL
    #define RT_MIX2 0x94D049BB133111EBULL
    #define RT_SIGN 0x8000000000000000ULL
    #define rt_prefetch(p) __builtin_prefetch(p)
    /* Capacity of a buffer grown by doubling from `least` (a power of two) once `used` is in
       use, 0 when empty: what nbytes counts, a function of what is in use. */
    static inline size_t rt_room(size_t used, size_t least) {
        if (used == 0) return 0;
        if (used <= least) return least;
        return (size_t)1 << (64 - __builtin_clzll((unsigned long long)(used - 1)));
    }
    /* The character data of an exact str: plain field reads, no reference counting. */
    static inline const void* rt_str_data(PyObject* s, int* kind, Py_ssize_t* n, int* ascii) {
        *kind = PyUnicode_KIND(s);
        *n = PyUnicode_GET_LENGTH(s);
        *ascii = PyUnicode_IS_ASCII(s);
        return PyUnicode_DATA(s);
    }
    """
    void rt_prefetch(const void* p) noexcept nogil
    Py_hash_t rt_hash_bytes(const void* src, Py_ssize_t n) noexcept
    size_t rt_room(size_t used, size_t least) noexcept nogil
    const void* rt_str_data(PyObject* s, int* kind, Py_ssize_t* n, int* ascii) noexcept nogil
    const uint64_t RT_GOLDEN
    const uint64_t RT_MIX1
    const uint64_t RT_MIX2
    const uint64_t RT_SIGN

# Type tags: the same numbers as rtindex.keys (part of the on-disk format).
cdef enum:
    NULL_TAG = 0x01
    BOOL_TAG = 0x02
    INT_TAG = 0x03
    FLOAT_TAG = 0x04
    STRING_TAG = 0x05
    TIMESTAMP_TAG = 0x06
    ARRAY_TAG = 0x07
    OBJECT_TAG = 0x08

cdef enum:
    # Below this depth (the default max_depth is 64) the walk skips the recursion check.
    RECURSION_CHECK_FROM = 100
    # Initial term-table slots (a power of two); the table doubles at 5/8 load.
    TABLE_MIN = 1024
    # Smallest allocation of a column buffer (Buf), in bytes, and of a U32Vec, in entries.
    BUF_MIN = 64
    VEC_MIN = 16
    # columns()/column() copy without the GIL from this many bytes on.
    NOGIL_COPY = 1 << 18
    # nbytes: what a path node (_Node, its children dict, its entry in its parent's, the key
    # str it keeps) and a column (_Column, its entries in _cols and _colobjs) take besides
    # their encoded bytes (tracemalloc over 5,000 new paths: ~500 bytes a leaf path).
    NODE_BYTES = 256
    COLUMN_BYTES = 192

cdef offset_t MAX_ROWS = 0xFFFFFFFF  # offsets and term ids are uint32
cdef uint64_t NO_LIMIT = 0x100000000  # above every offset
cdef term_id_t NO_TERM = 0xFFFFFFFF  # _likely_tid: no such term (term ids stay below MAX_ROWS)
cdef array _U32 = array("I")  # template for clone(); typecode "I" is 4 bytes here
# Secret per process, so that crafted ints cannot be made to collide in the term table.
cdef uint64_t _SEED = int.from_bytes(os.urandom(8), "little")

assert _U32.itemsize == sizeof(offset_t), "array('I') must hold 32-bit items"
# The Arrow types add_columns reads (rtindex.columns.INDEXABLE_TYPES).
_NULL = pa.null()
_BOOL = pa.bool_()
_INT64 = pa.int64()
_DOUBLE = pa.float64()
_LARGE_STRING = pa.large_string()



# ---------------------------------------------------------------- C helpers


cdef inline int u32_reserve(U32Vec* v, size_t extra) except -1:
    """Room for ``extra`` more entries in ``v``."""
    cdef size_t cap
    if v.n + extra <= v.cap:
        return 0
    cap = v.cap * 2 if v.cap else 16
    while cap < v.n + extra:
        cap *= 2
    v.data = <uint32_t*>safe_realloc(v.data, cap, sizeof(uint32_t))
    v.cap = cap
    return 0


cdef inline int buf_reserve(Buf* b, size_t extra) except -1:
    """Room for ``extra`` more bytes in ``b`` (its capacity stays ``rt_room(most used, BUF_MIN)``)."""
    cdef size_t cap
    if b.n + extra <= b.cap:
        return 0
    cap = rt_room(b.n + extra, BUF_MIN)
    b.data = <unsigned char*>safe_realloc(b.data, cap, 1)
    b.cap = cap
    return 0


cdef inline size_t col_bytes(_Column col) noexcept:
    """What ``col``'s column store holds (capacities as a function of the sizes in use)."""
    return (rt_room(col.offs.n, VEC_MIN) * sizeof(offset_t) + rt_room(col.vals.n, BUF_MIN)
            + rt_room(col.ends.n, BUF_MIN))


cdef inline void col_cut(_Column col) noexcept:
    """Drop the values of ``col`` past its ``offs.n`` rows (a failed add's)."""
    cdef size_t k = col.offs.n
    cdef int64_t end = 0
    cdef int tag = col.tag
    if tag == STRING_TAG or tag == ARRAY_TAG:
        col.ends.n = k * sizeof(int64_t)
        if k:
            memcpy(&end, col.ends.data + (k - 1) * sizeof(int64_t), sizeof(int64_t))
        col.vals.n = <size_t>end
    elif tag == BOOL_TAG:
        col.vals.n = (k + 7) >> 3
    elif tag != NULL_TAG:
        col.vals.n = k * 8


cdef inline size_t str_bytes(PyObject* sv) noexcept:
    """What the str object ``sv`` takes (pymalloc rounds to 16 bytes)."""
    cdef int kind, ascii
    cdef Py_ssize_t n
    cdef size_t size
    rt_str_data(sv, &kind, &n, &ascii)
    if ascii:
        size = sizeof(PyASCIIObject) + <size_t>n + 1
    else:
        size = sizeof(PyCompactUnicodeObject) + <size_t>(n + 1) * <size_t>kind
    return (size + 15) & ~(<size_t>15)


cdef void run_copies(const Copy* jobs, size_t n) noexcept nogil:
    cdef size_t i
    for i in range(n):
        if jobs[i].src != NULL:
            memcpy(jobs[i].dst, jobs[i].src, jobs[i].n)
        else:
            memset(jobs[i].dst, 0xFF, jobs[i].n)
        if jobs[i].last:
            jobs[i].dst[jobs[i].n - 1] &= jobs[i].last


cdef inline unsigned char* buffer_address(object buf):
    return <unsigned char*><uintptr_t>buf.address


cdef inline bint is_ascii(const unsigned char* p, size_t n) noexcept nogil:
    """Whether the bytes ``p[:n]`` are all below 0x80."""
    cdef uint64_t acc = 0, w
    cdef size_t i = 0
    while i + 8 <= n:
        memcpy(&w, p + i, 8)
        acc |= w
        i += 8
    while i < n:
        acc |= p[i]
        i += 1
    return (acc & 0x8080808080808080ULL) == 0


cdef inline uint64_t ascii_hash(const unsigned char* p, Py_ssize_t n) noexcept:
    """``hash()`` of the ASCII str whose characters are ``p[:n]``, without making the str.

    CPython hashes a str's characters as it stores them, one byte each for ASCII, with
    ``rt_hash_bytes``; ``check_ascii_hash`` makes sure of that at import, since string terms
    are keyed by ``hash(str)`` (``add``) and by this (``add_columns``) in the same table.
    """
    return <uint64_t>rt_hash_bytes(p, n)


cdef int check_ascii_hash() except -1:
    cdef bytes b
    for s in ("", "a", "pc-12345", "Lisbon", "x" * 100, "a\x00b"):
        b = s.encode()
        if ascii_hash(<const unsigned char*>PyBytes_AS_STRING(b), len(b)) != <uint64_t>hash(s):
            raise ImportError("rtindex._ext._segment: this Python hashes str differently from what "
                              "SegmentBuilder.add_columns assumes (report it, with the Python version)")
    return 0


check_ascii_hash()


cdef inline int64_t offset_at(const unsigned char* offsets, bint large, Py_ssize_t i) noexcept nogil:
    """Entry ``i`` of an Arrow string array's offsets (int64 for large_string, else int32)."""
    cdef int64_t v64
    cdef int32_t v32
    if large:
        memcpy(&v64, offsets + i * 8, 8)
        return v64
    memcpy(&v32, offsets + i * 4, 4)
    return v32


cdef inline bint bit_at(const unsigned char* bits, Py_ssize_t i) noexcept nogil:
    return (bits[i >> 3] >> (i & 7)) & 1


cdef inline void put_bit(Buf* b, size_t k, bint on) noexcept nogil:
    """Set value ``k`` of a BOOL column's bits (room reserved) to ``on``; a new byte is
    counted in ``b.n``. The bit is written either way: a failed add may have left it set."""
    cdef unsigned char* p = b.data + (k >> 3)
    cdef unsigned char bit = <unsigned char>(1 << (k & 7))
    if (k & 7) == 0:
        p[0] = 0
        b.n += 1
    p[0] = (p[0] & ~bit) | (bit if on else 0)


cdef inline uint64_t int_key(uint64_t bits) noexcept nogil:
    """The term table key of an int64 (its bits): order-preserving, as keys.encode_int."""
    return bits ^ RT_SIGN


cdef inline uint64_t float_key(uint64_t bits) noexcept nogil:
    """The term table key of a double (its bits): order-preserving, as keys.encode_float."""
    return ~bits if bits & RT_SIGN else bits | RT_SIGN


cdef Py_ssize_t first_non_finite(const unsigned char* data, const unsigned char* valid,
                                 Py_ssize_t start, Py_ssize_t n) noexcept nogil:
    """The first row (of ``n`` from ``start``) of a double array that is not null and not
    finite, or -1."""
    cdef Py_ssize_t i
    cdef double d
    for i in range(n):
        memcpy(&d, data + (start + i) * 8, 8)
        if not isfinite(d) and (valid == NULL or bit_at(valid, start + i)):
            return i
    return -1


def _empty_values(column_key):
    """The values of a column key the builder holds none of: an empty array of the type its
    last byte names (null type when it names none, e.g. an OBJECT key or no key at all)."""
    tag = column_key[len(column_key) - 1] if isinstance(column_key, bytes) and column_key else None
    return pa.array([], type=ARROW_TYPES.get(tag, pa.null()))


cdef inline offset_t* plist_data(PList* p) noexcept nogil:
    return &p.d.inl[0] if p.n <= PLIST_INLINE else p.d.heap


cdef int plist_push(PList* p, offset_t off) except -1:
    """Append ``off``. The capacity is implied by ``n``: PLIST_INLINE inline, then 8, 16, ..."""
    cdef offset_t* heap
    cdef uint32_t n = p.n
    if n == PLIST_INLINE:  # inline storage is full: move to the heap
        heap = <offset_t*>safe_realloc(NULL, 8, sizeof(offset_t))
        memcpy(heap, &p.d.inl[0], n * sizeof(offset_t))
        p.d.heap = heap
    elif n >= 8 and (n & (n - 1)) == 0:  # a full power of two: double
        if n == 0x80000000:
            raise OverflowError("a posting list holds at most 2**31 rows")
        p.d.heap = <offset_t*>safe_realloc(p.d.heap, <size_t>n * 2, sizeof(offset_t))
    if n < PLIST_INLINE:
        p.d.inl[n] = off
    else:
        p.d.heap[n] = off
    p.n = n + 1
    p.last = off
    return 0


cdef inline Py_ssize_t plist_growth(uint32_t n) noexcept nogil:
    """Bytes ``plist_push`` allocates when a list of ``n`` offsets gets one more (with a
    malloc header for a new heap block): what nbytes counts, undone by ``plist_pop``."""
    if n == PLIST_INLINE:
        return 8 * sizeof(offset_t) + 16
    if n >= 8 and (n & (n - 1)) == 0:
        return n * sizeof(offset_t)
    return 0


cdef inline void plist_pop(PList* p) noexcept nogil:
    """Drop the last offset (``p.n > 0``)."""
    cdef offset_t* heap
    p.n -= 1
    if p.n == PLIST_INLINE:  # back to inline storage
        heap = p.d.heap
        p.d.inl[0] = heap[0]
        p.d.inl[1] = heap[1]
        free(heap)
    if p.n:
        p.last = plist_data(p)[p.n - 1]


cdef inline void plist_free(PList* p) noexcept nogil:
    if p.n > PLIST_INLINE:
        free(p.d.heap)
    p.n = 0


cdef inline Py_ssize_t lower_bound(const offset_t* a, Py_ssize_t n, uint64_t x) noexcept nogil:
    """Number of entries of the increasing ``a[:n]`` that are ``< x``."""
    cdef Py_ssize_t lo = 0, hi = n, mid
    if n == 0 or a[n - 1] < x:
        return n
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline uint64_t mix(uint64_t key, uint32_t cid1) noexcept nogil:
    """Slot hash of (column, key): splitmix64's finalizer."""
    cdef uint64_t z = (key ^ _SEED) + <uint64_t>cid1 * RT_GOLDEN
    z = (z ^ (z >> 30)) * RT_MIX1
    z = (z ^ (z >> 27)) * RT_MIX2
    return z ^ (z >> 31)


cdef inline void put_be64(char* out, uint64_t bits) noexcept nogil:
    cdef int i
    for i in range(8):
        out[i] = <char>((bits >> (56 - 8 * i)) & 0xFF)


cdef inline uint64_t get_be64(const unsigned char* b) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v = (v << 8) | b[i]
    return v


cdef bint has_surrogate(str s) noexcept:
    """Whether ``s`` holds a surrogate code point (which UTF-8 cannot encode)."""
    cdef int kind = PyUnicode_KIND(s)
    cdef Py_ssize_t i, n
    cdef const uint16_t* d2
    cdef const uint32_t* d4
    if kind == 1:
        return False
    n = PyUnicode_GET_LENGTH(s)
    if kind == 2:
        d2 = <const uint16_t*>PyUnicode_DATA(s)
        for i in range(n):
            if 0xD800 <= d2[i] <= 0xDFFF:
                return True
        return False
    d4 = <const uint32_t*>PyUnicode_DATA(s)
    for i in range(n):
        if 0xD800 <= d4[i] <= 0xDFFF:
            return True
    return False


cdef bytes escaped_concat(bytes prefix, bint path_sep, const char* val, Py_ssize_t n):
    """``prefix + escape(val) + b"\\x00\\x00"`` in one allocation.

    With ``path_sep`` the prefix is an encoded path whose PATH_END (0x00 0x00) becomes a
    PATH_SEP (0x00 0x01): the encoded path of a child.
    """
    cdef Py_ssize_t plen = PyBytes_GET_SIZE(prefix), nz = 0, i, j
    cdef const char* p = val
    cdef const char* end = val + n
    cdef bytes out
    cdef char* buf
    while p < end:
        p = <const char*>memchr(p, 0, end - p)
        if p == NULL:
            break
        nz += 1
        p += 1
    out = PyBytes_FromStringAndSize(NULL, plen + n + nz + 2)
    buf = PyBytes_AS_STRING(out)
    memcpy(buf, PyBytes_AS_STRING(prefix), plen)
    if path_sep:
        buf[plen - 1] = 0x01
    j = plen
    if nz == 0:
        memcpy(buf + j, val, n)
        j += n
    else:
        for i in range(n):
            buf[j] = val[i]
            j += 1
            if val[i] == 0:
                buf[j] = <char>0xFF
                j += 1
    buf[j] = 0
    buf[j + 1] = 0
    return out


cdef bytes fixed_concat(bytes prefix, const char* val, Py_ssize_t n):
    """``prefix + val[:n]`` in one allocation."""
    cdef Py_ssize_t plen = PyBytes_GET_SIZE(prefix)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, plen + n)
    cdef char* buf = PyBytes_AS_STRING(out)
    memcpy(buf, PyBytes_AS_STRING(prefix), plen)
    if n:
        memcpy(buf + plen, val, n)
    return out


cdef object utf8(str s, const char** out, Py_ssize_t* n):
    """Point ``out`` at the UTF-8 of the exact str ``s``; returns the object that owns it.

    ASCII strings are their own UTF-8 (no copy, nothing cached on ``s``); others are
    encoded to a temporary bytes (a lone surrogate raises UnicodeEncodeError, exactly
    like ``s.encode("utf-8")``).
    """
    cdef bytes b
    if PyUnicode_IS_ASCII(s):
        out[0] = PyUnicode_AsUTF8AndSize(s, n)
        return s
    b = PyUnicode_AsUTF8String(s)
    out[0] = PyBytes_AS_STRING(b)
    n[0] = PyBytes_GET_SIZE(b)
    return b


cdef str where_str(const Where* where):
    """The JSON path of ``where`` (only computed when raising)."""
    parts = []
    while where != NULL:
        parts.append(<object>where.key if where.key != NULL else where.index)
        where = where.up
    parts.reverse()
    return json_path(parts)


cdef inline int nesting_error(SegmentBuilder b, const Where* where) except -1:
    raise SchemaError(f"nesting deeper than {b._max_depth_obj} levels", where_str(where))


# ---------------------------------------------------------------- term order, without the GIL
#
# sorted_postings() and write_blocks() order the terms the same way. Column keys are
# prefix-free, so terms sort by column key, then by value, and the value encodings preserve
# order: numeric terms sort by their 64-bit key, strings by their encoded bytes. So one
# sequential pass over the table puts a SortItem per term into the bucket of its column key
# (bucket sizes are the columns' term counts), encoding string values into a C arena on the
# way; then each bucket is radix-sorted by the 64-bit key (for strings: the first 8 encoded
# bytes), and runs of equal string keys are ordered by the next 8 bytes, and so on (encoded
# strings are prefix-free: two distinct ones differ within the shorter one).
# Nothing here touches a Python object but for reading the characters of strs the builder
# owns (immutable, kept alive by _vals; add() refuses while write_blocks runs): so
# _sort_terms() and encode_blocks() need no GIL, and the comparisons read only C memory.


cdef inline unsigned char* put_code_point(unsigned char* q, uint32_t c) noexcept nogil:
    """Write the UTF-8 of ``c`` (not a surrogate) at ``q``; returns the byte after it."""
    if c < 0x80:
        q[0] = <unsigned char>c
        return q + 1
    if c < 0x800:
        q[0] = 0xC0 | (c >> 6)
        q[1] = 0x80 | (c & 0x3F)
        return q + 2
    if c < 0x10000:
        q[0] = 0xE0 | (c >> 12)
        q[1] = 0x80 | ((c >> 6) & 0x3F)
        q[2] = 0x80 | (c & 0x3F)
        return q + 3
    q[0] = 0xF0 | (c >> 18)
    q[1] = 0x80 | ((c >> 12) & 0x3F)
    q[2] = 0x80 | ((c >> 6) & 0x3F)
    q[3] = 0x80 | (c & 0x3F)
    return q + 4


cdef inline uint32_t char_at(const void* data, int kind, Py_ssize_t i) noexcept nogil:
    if kind == 1:
        return (<const unsigned char*>data)[i]
    if kind == 2:
        return (<const uint16_t*>data)[i]
    return (<const uint32_t*>data)[i]


cdef inline size_t utf8_bound(PyObject* sv) noexcept nogil:
    """Bytes the UTF-8 of ``sv`` may take: 1 per char of an ASCII str, else 2, 3 or 4 per char
    of a 1-, 2- or 4-byte str."""
    cdef int kind, ascii
    cdef Py_ssize_t n
    rt_str_data(sv, &kind, &n, &ascii)
    return <size_t>n * (1 if ascii else <size_t>kind + 1 if kind < 4 else 4)


cdef size_t put_utf8(PyObject* sv, unsigned char* out) noexcept nogil:
    """Write the UTF-8 of ``sv`` (no lone surrogate: ``add`` rejects them) to ``out`` (room:
    ``utf8_bound``); returns its length. Unlike ``PyUnicode_AsUTF8AndSize``, caches no UTF-8
    copy on the str (which would double a non-ASCII term's memory); an ASCII str's characters
    are their UTF-8 already."""
    cdef int kind, ascii
    cdef Py_ssize_t n, i
    cdef const void* data = rt_str_data(sv, &kind, &n, &ascii)
    cdef unsigned char* q = out
    if ascii:
        memcpy(out, data, <size_t>n)
        return <size_t>n
    for i in range(n):
        q = put_code_point(q, char_at(data, kind, i))
    return <size_t>(q - out)


cdef size_t encode_str(PyObject* sv, unsigned char* out) noexcept nogil:
    """Write ``escape(UTF-8 of sv) + 00 00`` to ``out`` (room: ``str_bound``); returns its length.

    ``sv`` holds no lone surrogate (``add`` rejects them), so this is exactly
    ``keys.encode_string``.
    """
    cdef int kind, ascii
    cdef Py_ssize_t n, i
    cdef const void* data = rt_str_data(sv, &kind, &n, &ascii)
    cdef const unsigned char* d1 = <const unsigned char*>data
    cdef const unsigned char* z
    cdef unsigned char* q = out
    cdef uint32_t c
    if ascii:
        i = 0
        while i < n:
            z = <const unsigned char*>memchr(d1 + i, 0, <size_t>(n - i))
            if z == NULL:
                memcpy(q, d1 + i, <size_t>(n - i))
                q += n - i
                break
            memcpy(q, d1 + i, <size_t>(z - d1 - i))
            q += z - d1 - i
            q[0] = 0
            q[1] = 0xFF
            q += 2
            i = z - d1 + 1
    else:
        for i in range(n):
            c = char_at(data, kind, i)
            q = put_code_point(q, c)
            if c == 0:
                q[0] = 0xFF
                q += 1
    q[0] = 0
    q[1] = 0
    return <size_t>(q + 2 - out)


cdef inline size_t str_bound(PyObject* sv) noexcept nogil:
    """Bytes ``encode_str`` may write: 2 per char of a 1-byte str (NUL: 00 FF; >= 0x80: 2
    UTF-8 bytes), 3 per 2-byte char, 4 per 4-byte char, then 2."""
    cdef int kind, ascii
    cdef Py_ssize_t n
    rt_str_data(sv, &kind, &n, &ascii)
    return <size_t>n * (<size_t>kind + 1 if kind < 4 else 4) + 2


cdef inline uint64_t be_prefix(const unsigned char* p, size_t n) noexcept nogil:
    """The first 8 bytes of ``p[:n]``, zero-padded, as a big-endian number."""
    cdef uint64_t v = 0
    cdef size_t i
    for i in range(8):
        v = (v << 8) | (p[i] if i < n else 0)
    return v


cdef enum:
    STR_AHEAD = 16  # add_columns hashes string values this many rows ahead (prefetching slots)
    PREFETCH_TERMS = 64  # the term scan prefetches the str of the term this far ahead
    PREFETCH_ITEMS = 8  # encode_blocks prefetches postings this many terms ahead (entries: 2x)
    ARENA_CHUNK = 1 << 20  # bytes of one arena chunk (more for a longer string)
    SMALL_SORT = 32  # below this many items: insertion sort
    MAX_REFINE = 32  # past 8 * 32 equal leading bytes, a run of strings is qsorted instead


cdef inline size_t str_len(const unsigned char* v) noexcept nogil:
    """Length of the encoded string at ``v`` in a TermSort arena (stored just before it)."""
    cdef size_t n
    memcpy(&n, v - sizeof(size_t), sizeof(size_t))
    return n


cdef inline int cmp_str_from(const unsigned char* x, const unsigned char* y, size_t d) noexcept nogil:
    """Compare two encoded strings whose first ``d`` bytes are equal (both longer than ``d``)."""
    cdef size_t xn = str_len(x), yn = str_len(y)
    cdef int r = memcmp(x + d, y + d, (xn if xn < yn else yn) - d)
    if r != 0:
        return r
    return (xn > yn) - (xn < yn)


cdef int cmp_item_str(const void* a, const void* b) noexcept nogil:
    """qsort comparator of the SortItems of string terms: their encoded bytes."""
    return cmp_str_from((<const SortItem*>a).v, (<const SortItem*>b).v, 0)


cdef void radix_sort(SortItem* a, SortItem* tmp, size_t n) noexcept nogil:
    """Sort ``a[:n]`` by ``key`` (LSD radix by bytes; bytes equal in every key are skipped)."""
    cdef size_t hist[8][256]
    cdef size_t i, j, pos, c
    cdef SortItem* src = a
    cdef SortItem* dst = tmp
    cdef SortItem* sw
    cdef SortItem x
    cdef uint64_t k
    cdef int d, shift
    if n < SMALL_SORT:
        for i in range(1, n):
            x = a[i]
            j = i
            while j > 0 and a[j - 1].key > x.key:
                a[j] = a[j - 1]
                j -= 1
            a[j] = x
        return
    memset(hist, 0, sizeof(hist))
    for i in range(n):
        k = a[i].key
        for d in range(8):
            hist[d][(k >> (8 * d)) & 0xFF] += 1
    for d in range(8):
        shift = 8 * d
        if hist[d][(src[0].key >> shift) & 0xFF] == n:
            continue
        pos = 0
        for j in range(256):
            c = hist[d][j]
            hist[d][j] = pos
            pos += c
        for i in range(n):
            j = (src[i].key >> shift) & 0xFF
            dst[hist[d][j]] = src[i]
            hist[d][j] += 1
        sw = src
        src = dst
        dst = sw
    if src != a:
        memcpy(a, src, n * sizeof(SortItem))


cdef void refine_strings(SortItem* a, SortItem* tmp, size_t n, size_t d, int level) noexcept nogil:
    """Order the runs of equal keys in ``a[:n]``: string terms sorted by their first ``d`` bytes."""
    cdef size_t i = 0, j, m, t, u, vn
    cdef SortItem x
    while i < n:
        j = i + 1
        while j < n and a[j].key == a[i].key:
            j += 1
        m = j - i
        if m > 1:
            # Distinct encoded strings differ within the shorter: all of these are longer than d.
            if m < SMALL_SORT:
                for t in range(i + 1, j):
                    x = a[t]
                    u = t
                    while u > i and cmp_str_from(a[u - 1].v, x.v, d) > 0:
                        a[u] = a[u - 1]
                        u -= 1
                    a[u] = x
            elif level >= MAX_REFINE:
                qsort(a + i, m, sizeof(SortItem), cmp_item_str)
            else:
                for t in range(i, j):
                    vn = str_len(a[t].v)
                    a[t].key = be_prefix(a[t].v + d, vn - d if vn > d else 0)
                radix_sort(a + i, tmp + i, m)
                refine_strings(a + i, tmp + i, m, d + 8, level + 1)
        i = j


cdef inline size_t term_value(const TermSort* s, const SortItem* it, uint32_t rank,
                              unsigned char* buf, const unsigned char** v) noexcept nogil:
    """Length of the encoded value of term ``it`` (column key rank ``rank``); sets ``v`` to it
    (strings: in the arena; numbers and booleans: written to ``buf[:8]``)."""
    cdef int tag, i
    cdef uint64_t key
    if it.v != NULL:
        v[0] = it.v
        return str_len(it.v)
    v[0] = buf
    tag = s.ck_tag[rank]
    key = it.e.key
    if tag == INT_TAG or tag == FLOAT_TAG or tag == TIMESTAMP_TAG:
        for i in range(8):
            buf[i] = <unsigned char>((key >> (56 - 8 * i)) & 0xFF)
        return 8
    if tag == BOOL_TAG:
        buf[0] = <unsigned char>key
        return 1
    return 0


cdef unsigned char* arena_room(TermSort* s, size_t need) noexcept nogil:
    """``need`` free bytes at the end of the arena (a new chunk if needed); NULL: no memory."""
    cdef size_t size, cap
    cdef void* q
    if need > s.free_len:
        if s.n_chunks == s.chunks_cap:
            cap = s.chunks_cap * 2 if s.chunks_cap else 16
            q = realloc(s.chunks, cap * sizeof(unsigned char*))
            if q == NULL:
                return NULL
            s.chunks = <unsigned char**>q
            s.chunks_cap = cap
        size = need if need > ARENA_CHUNK else ARENA_CHUNK
        q = malloc(size)
        if q == NULL:
            return NULL
        s.chunks[s.n_chunks] = <unsigned char*>q
        s.n_chunks += 1
        s.free_at = <unsigned char*>q
        s.free_len = size
    return s.free_at


cdef int sort_error(int rc) except -1:
    """Raise for the -1 (out of memory) and -4 (bug) results of _sort_terms/encode_blocks."""
    if rc == -1:
        raise MemoryError()
    if rc == -4:  # pragma: no cover
        raise AssertionError("SegmentBuilder: the term table does not match the columns")
    return 0


cdef void sort_free(TermSort* s) noexcept nogil:
    cdef size_t i
    for i in range(s.n_chunks):
        free(s.chunks[i])
    free(s.chunks)
    free(s.items)
    free(s.bucket)
    free(s.tmp)
    free(s.rank_of)
    free(s.ck)
    free(s.ck_len)
    free(s.ck_tag)
    free(s.cand)
    free(s.ser)
    free(s.ser_len)
    memset(s, 0, sizeof(TermSort))


cdef inline size_t find_cand(const TermSort* s, const TEntry* e) noexcept nogil:
    """Index in ``s.cand`` of ``e`` (one of them: cand is in term order, so by address)."""
    cdef size_t lo = 0, hi = s.n_cand, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if s.cand[mid] < e:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef int encode_blocks(TermSort* s, WState* w, BlockOut* out) noexcept nogil:
    """Encode every term, in order, into blocks (as BlockWriter.add does) appended to ``out``.

    The roaring decisions of the candidates are in ``s.ser``. Returns 0, -1 when out of
    memory, -2 when a block is larger than 4 GiB, -3 when term ``s.items[s.bad]`` is too long.
    """
    cdef size_t i, c, vlen
    cdef Py_ssize_t cl, tlen, k, ser_len
    cdef const SortItem* it
    cdef TEntry* e
    cdef uint32_t rank
    cdef const unsigned char* ser
    cdef const unsigned char* v
    cdef unsigned char buf[8]
    cdef int rc
    for i in range(s.n):
        # Terms come in sorted order, their entries and strings in creation order: prefetch.
        if i + 2 * PREFETCH_ITEMS < s.n:
            rt_prefetch(s.items[i + 2 * PREFETCH_ITEMS].e)
            if s.items[i + 2 * PREFETCH_ITEMS].v != NULL:
                rt_prefetch(s.items[i + 2 * PREFETCH_ITEMS].v - sizeof(size_t))
        if i + PREFETCH_ITEMS < s.n:
            e = s.items[i + PREFETCH_ITEMS].e
            if e.pl.n > PLIST_INLINE:
                rt_prefetch(e.pl.d.heap)
        it = &s.items[i]
        e = it.e
        k = e.pl.n
        if k == 0:
            continue
        ser = NULL
        ser_len = -1
        if k >= RAW_MAX and s.n_cand > 0:
            c = find_cand(s, e)
            if c < s.n_cand and s.cand[c] == e and s.ser[c] != NULL:
                ser = s.ser[c]
                ser_len = s.ser_len[c]
        rank = s.rank_of[e.cid1 - 1]
        vlen = term_value(s, it, rank, buf, &v)
        cl = s.ck_len[rank]
        if vlen > <size_t>MAX_TERM or cl + <Py_ssize_t>vlen > MAX_TERM:
            s.bad = i
            return -3
        tlen = cl + <Py_ssize_t>vlen
        if _w_grow(w, _w_entry_size(tlen, k, ser_len)) < 0:
            return -1
        _w_put(w, s.ck[rank], cl, v, <Py_ssize_t>vlen, plist_data(&e.pl), k, ser, ser_len)
        if _w_size(w) >= w.target:
            rc = _w_flush_to(w, out)
            if rc < 0:
                return rc
    if w.n > 0:
        return _w_flush_to(w, out)
    return 0


# ---------------------------------------------------------------- path tree


@cython.final
cdef class _Column:
    """One (path, type tag): its terms and its column store."""

    def __dealloc__(self):
        free(self.tids.data)
        free(self.offs.data)
        free(self.vals.data)
        free(self.ends.data)


@cython.final
cdef class _Node:
    """One field path: its encoding, children and columns."""

    def __cinit__(self):
        self.children = {}


# ---------------------------------------------------------------- the builder


@cython.final
@cython.no_gc_clear  # table entries borrow strs from _vals: keep it until __dealloc__
cdef class SegmentBuilder:
    """In-memory postings and column values of the newest rows of one shard.

    Compiled twin of ``rtindex._py.segment.SegmentBuilder``: same methods, same results.
    """

    def __cinit__(self, *args, **kwargs):
        self._root = _Node()
        self._root.enc = b""
        self._table = <TSlot*>huge_zalloc(TABLE_MIN, sizeof(TSlot))
        self._mask = TABLE_MIN - 1
        self._vals = []
        self._cols = []
        self._colobjs = {}
        self._colkeys = []
        self._fail_at = -1

    def __init__(self, max_depth=64):
        self.max_depth = max_depth

    def __dealloc__(self):
        cdef Py_ssize_t tid
        if self._table != NULL:
            huge_free(self._table, self._mask + 1, sizeof(TSlot))
            self._table = NULL
        if self._terms != NULL:
            for tid in range(self._n_terms):
                plist_free(&self._terms[tid].pl)
            free(self._terms)
            self._terms = NULL
        if self._doc_terms.data != NULL:
            free(self._doc_terms.data)
            self._doc_terms.data = NULL
        if self._doc_cols != NULL:
            free(self._doc_cols)
            self._doc_cols = NULL
        if self._pend != NULL:
            self._release_pending()
            free(self._pend)
            self._pend = NULL

    @property
    def max_depth(self):
        """Deepest nesting accepted (the document root is level 1)."""
        return self._max_depth_obj

    @max_depth.setter
    def max_depth(self, value):
        cdef int overflow = 0
        cdef long long d = PyLong_AsLongLongAndOverflow(_index(value), &overflow)
        if overflow > 0 or d > <long long>PY_SSIZE_T_MAX:
            self._max_depth = PY_SSIZE_T_MAX
        elif overflow < 0 or d < -<long long>PY_SSIZE_T_MAX:
            self._max_depth = -PY_SSIZE_T_MAX
        else:
            self._max_depth = <Py_ssize_t>d
        self._max_depth_obj = value

    @property
    def n_rows(self):
        """Rows added so far."""
        return self._n

    @property
    def nbytes(self):
        """Memory held: the term table, the per-term arrays, the str of each STRING term,
        posting lists past their inline room, the column buffers, the path nodes.

        Buffers count at the capacity they have grown to by doubling for what is in use (a
        failed ``add`` leaves nbytes as it was, even if it grew a buffer). What the table and
        the per-term arrays take follows from the number of terms; the rest is summed as it
        grows (``_nbytes``).
        """
        cdef size_t n = <size_t>self._n_terms, slots = TABLE_MIN
        while n * 8 > slots * 5:  # the table doubles past 5/8 load
            slots *= 2
        return (self._nbytes + slots * sizeof(TSlot)
                + rt_room(n, 1024) * sizeof(TEntry)  # _terms
                + (n + (n >> 3) + 6) * sizeof(PyObject*))  # _vals (as a list over-allocates)

    # ------------------------------------------------------------ add

    def add(self, doc):
        """Index ``doc`` as the next row; returns its offset. All or nothing on SchemaError."""
        cdef Py_ssize_t n_terms_before, nbytes_before
        if type(doc) is not dict and not isinstance(doc, dict):
            raise SchemaError(f"a document must be a JSON object, not {type(doc).__name__}")
        if self._busy:
            raise RuntimeError("SegmentBuilder.add() re-entered: a builder has one writer")
        if self._pins:
            raise RuntimeError("SegmentBuilder.add() while write_blocks(), column() or columns() "
                               "reads the builder: add rows to a builder before sealing it, not during")
        if self._n >= MAX_ROWS:
            raise OverflowError("a segment holds at most 2**32 - 1 rows: seal it first")
        self._busy = True
        self._off = <offset_t>self._n
        self._doc_terms.n = 0
        self._n_doc_cols = 0
        n_terms_before = self._n_terms
        nbytes_before = self._nbytes
        try:
            self._walk_object(doc, self._root, NULL, 1, False)
            self._commit()
        except BaseException:
            self._rollback(n_terms_before, nbytes_before)
            raise
        finally:
            self._release_pending()
            self._busy = False
        self._n += 1
        return self._n - 1

    cdef int _rollback(self, Py_ssize_t n_terms_before, Py_ssize_t nbytes_before) except -1:
        """Undo what the row being added changed (it raised): the builder is as before."""
        cdef size_t i
        cdef TEntry* e
        cdef _Column col
        cdef offset_t off = self._off
        # Postings: each term got at most one entry for this row, the last one.
        for i in range(self._doc_terms.n):
            e = self._find_tid(self._doc_terms.data[i])
            if e.pl.n and e.pl.last == off:
                plist_pop(&e.pl)
        self._doc_terms.n = 0
        self._drop_terms(n_terms_before)
        # Column values, newest first.
        while self._n_doc_cols:
            self._n_doc_cols -= 1
            col = <_Column>self._doc_cols[self._n_doc_cols]
            col.offs.n -= 1
            col_cut(col)
        self._nbytes = nbytes_before
        return 0

    cdef int _drop_terms(self, Py_ssize_t n_terms_before) except -1:
        """Delete the terms created since there were ``n_terms_before``, newest first (and
        the column keys that had no term before them)."""
        cdef Py_ssize_t tid = self._n_terms - 1
        cdef TEntry* e
        cdef _Column col
        while tid >= n_terms_before:
            e = self._find_tid(tid)
            plist_free(&e.pl)
            col = <_Column>self._cols[e.cid1 - 1]
            col.tids.n -= 1
            if col.tids.n == 0:
                self._colkeys.pop()
            self._delete_slot(self._slot_of(tid))
            tid -= 1
        del self._vals[n_terms_before:]
        self._n_terms = n_terms_before
        return 0

    # ------------------------------------------------------------ the term table

    cdef TEntry* _find(self, uint32_t cid, uint64_t key, str sv):
        """The entry of (column ``cid``, ``key``), or NULL. ``sv``: the str of a STRING term."""
        cdef uint32_t cid1 = cid + 1
        cdef size_t mask = self._mask
        cdef size_t i = mix(key, cid1) & mask
        cdef TSlot* t
        cdef TEntry* e
        while True:
            t = &self._table[i]
            if t.cid1 == 0:
                return NULL
            if t.cid1 == cid1 and t.key == key:
                e = &self._terms[t.tid]
                if sv is None or e.sv == <PyObject*>sv or (<str>e.sv) == sv:
                    return e
            i = (i + 1) & mask

    cdef TEntry* _find_tid(self, Py_ssize_t tid):
        """The entry of term ``tid`` (which exists)."""
        return &self._terms[tid]

    cdef size_t _slot_of(self, Py_ssize_t tid):
        """The table slot of term ``tid`` (which exists)."""
        cdef TEntry* e = &self._terms[tid]
        cdef size_t mask = self._mask
        cdef size_t i = mix(e.key, e.cid1) & mask
        while self._table[i].tid != tid or self._table[i].cid1 != e.cid1:
            i = (i + 1) & mask
        return i

    cdef int _grow_table(self) except -1:
        """Double the table (rehashing from the stored keys: no Python object is touched)."""
        cdef size_t old_slots = self._mask + 1, slots = old_slots * 2, mask = slots - 1, i, j
        cdef TSlot* old = self._table
        cdef TSlot* new = <TSlot*>huge_zalloc(slots, sizeof(TSlot))
        for i in range(old_slots):
            if old[i].cid1:
                j = mix(old[i].key, old[i].cid1) & mask
                while new[j].cid1:
                    j = (j + 1) & mask
                new[j] = old[i]
        self._table = new
        self._mask = mask
        huge_free(old, old_slots, sizeof(TSlot))
        return 0

    cdef void _delete_slot(self, size_t i) noexcept:
        """Empty slot ``i``, shifting later entries of its probe run back (no tombstones)."""
        cdef size_t mask = self._mask, j = i, k
        cdef TSlot* t = self._table
        while True:
            j = (j + 1) & mask
            if t[j].cid1 == 0:
                break
            k = mix(t[j].key, t[j].cid1) & mask
            # The entry at j may fill the hole at i unless its home k lies cyclically in (i, j].
            if (i <= j and i < k <= j) or (i > j and (i < k or k <= j)):
                continue
            t[i] = t[j]
            i = j
        t[i].cid1 = 0
        self._count -= 1

    cdef TEntry* _insert(self, _Column col, uint64_t key, object sv) except NULL:
        """Create the term (``col``, ``key``); ``sv``: the str of a STRING term, else None."""
        cdef Py_ssize_t tid = self._n_terms, cap
        cdef uint32_t cid1 = col.cid + 1
        cdef size_t i, mask
        cdef TEntry* e
        if tid >= <Py_ssize_t>MAX_ROWS:
            raise OverflowError("a segment holds at most 2**32 - 1 distinct terms: seal it first")
        if (self._count + 1) * 8 > (self._mask + 1) * 5:
            self._grow_table()
        if tid == self._cap_terms:
            cap = self._cap_terms * 2 if self._cap_terms else 1024
            self._terms = <TEntry*>safe_realloc(self._terms, cap, sizeof(TEntry))
            self._cap_terms = cap
        u32_reserve(&col.tids, 1)
        if _list_append(self._vals, sv) < 0:
            return NULL
        if col.tids.n == 0 and _list_append(self._colkeys, col.key) < 0:
            self._vals.pop()
            return NULL
        # Nothing below can fail.
        mask = self._mask
        i = mix(key, cid1) & mask
        while self._table[i].cid1:
            i = (i + 1) & mask
        self._table[i].key = key
        self._table[i].cid1 = cid1
        self._table[i].tid = <term_id_t>tid
        e = &self._terms[tid]
        e.key = key
        e.cid1 = cid1
        e.tid = <term_id_t>tid
        e.sv = NULL if sv is None else <PyObject*>sv
        e.pl.n = 0
        e.pl.last = 0
        col.tids.data[col.tids.n] = <uint32_t>tid
        col.tids.n += 1
        self._count += 1
        self._n_terms = tid + 1
        if sv is not None:
            self._nbytes += str_bytes(<PyObject*>sv)  # kept alive by _vals
        return e

    cdef int _queue(self, _Column col, uint64_t key, object sv) except -1:
        """Queue the term (``col``, ``key``) of the current row; prefetch its table slot.

        Terms are resolved by ``_commit`` once the walk succeeded: by then the slots (one
        cache miss each in a large table) have arrived in parallel, not one after another.
        """
        cdef Pending* p
        cdef size_t cap
        if self._n_pend == self._cap_pend:
            cap = self._cap_pend * 2 if self._cap_pend else 128
            self._pend = <Pending*>safe_realloc(self._pend, cap, sizeof(Pending))
            self._cap_pend = cap
        p = &self._pend[self._n_pend]
        p.key = key
        p.cid = col.cid
        if sv is None:
            p.sv = NULL
        else:
            Py_INCREF(sv)
            p.sv = <PyObject*>sv
        self._n_pend += 1
        rt_prefetch(&self._table[mix(key, col.cid + 1) & self._mask])
        return 0

    cdef int _commit(self) except -1:
        """Resolve the queued terms in walk order (creating new ones) and post the row."""
        cdef size_t i
        cdef Pending* p
        cdef TEntry* e
        # Prefetch the entry of each string term's likely slot, then its stored str, so
        # that the compares below do not wait for them one by one.
        for i in range(self._n_pend):
            p = &self._pend[i]
            if p.sv != NULL:
                p.hint = self._likely_tid(p.key, p.cid + 1)
                if p.hint != NO_TERM:
                    rt_prefetch(&self._terms[p.hint])
        for i in range(self._n_pend):
            p = &self._pend[i]
            if p.sv != NULL and p.hint != NO_TERM:
                rt_prefetch(self._terms[p.hint].sv)
        for i in range(self._n_pend):
            if <Py_ssize_t>i == self._fail_at:
                raise MemoryError("injected by _test_fail_commit_at()")
            p = &self._pend[i]
            sv = None if p.sv == NULL else <str>p.sv
            e = self._find(p.cid, p.key, sv)
            if e == NULL:
                e = self._insert(<_Column>PyList_GET_ITEM(self._cols, p.cid), p.key, sv)
            self._post(e)
        return 0

    cdef term_id_t _likely_tid(self, uint64_t key, uint32_t cid1) noexcept:
        """The first term with this key and column (its str may differ), or NO_TERM."""
        cdef size_t mask = self._mask
        cdef size_t j = mix(key, cid1) & mask
        while self._table[j].cid1:
            if self._table[j].cid1 == cid1 and self._table[j].key == key:
                return self._table[j].tid
            j = (j + 1) & mask
        return NO_TERM

    cdef void _release_pending(self) noexcept:
        cdef size_t i
        for i in range(self._n_pend):
            if self._pend[i].sv != NULL:
                Py_DECREF(<object>self._pend[i].sv)
        self._n_pend = 0

    cdef int _post(self, TEntry* e) except -1:
        """Add the current row to ``e``'s postings (once per row)."""
        cdef uint32_t n = e.pl.n
        if n and e.pl.last == self._off:
            return 0
        u32_reserve(&self._doc_terms, 1)
        plist_push(&e.pl, self._off)
        self._doc_terms.data[self._doc_terms.n] = e.tid
        self._doc_terms.n += 1
        self._nbytes += plist_growth(n)
        return 0

    cdef int _col_add(self, _Column col, const void* v, size_t n, str s) except -1:
        """Append the current row's value to ``col``'s column store: ``n`` bytes at ``v``
        (INT, TIMESTAMP: an int64; FLOAT: a double; BOOL: one byte, 0 or 1; ARRAY: the JSON
        text; NULL: none) or, for STRING, the UTF-8 of the exact str ``s``. All or nothing."""
        cdef size_t cap, k = col.offs.n, before = col_bytes(col)
        cdef int tag = col.tag
        cdef int64_t end
        cdef unsigned char* p
        if self._n_doc_cols == self._cap_doc_cols:
            cap = self._cap_doc_cols * 2 if self._cap_doc_cols else 64
            self._doc_cols = <PyObject**>safe_realloc(self._doc_cols, cap, sizeof(PyObject*))
            self._cap_doc_cols = cap
        u32_reserve(&col.offs, 1)
        if tag == STRING_TAG:
            buf_reserve(&col.vals, utf8_bound(<PyObject*>s))
        elif tag == BOOL_TAG:
            buf_reserve(&col.vals, 1)
        else:
            buf_reserve(&col.vals, n)
        if tag == STRING_TAG or tag == ARRAY_TAG:
            buf_reserve(&col.ends, sizeof(int64_t))
        # Nothing below can fail.
        p = col.vals.data + col.vals.n
        if tag == STRING_TAG or tag == ARRAY_TAG:
            col.vals.n += put_utf8(<PyObject*>s, p) if tag == STRING_TAG else n
            if tag == ARRAY_TAG:
                memcpy(p, v, n)
            end = <int64_t>col.vals.n
            memcpy(col.ends.data + col.ends.n, &end, sizeof(int64_t))
            col.ends.n += sizeof(int64_t)
        elif tag == BOOL_TAG:
            put_bit(&col.vals, k, (<const unsigned char*>v)[0])
        elif tag != NULL_TAG:
            memcpy(p, v, n)
            col.vals.n += n
        col.offs.data[k] = self._off
        col.offs.n = k + 1
        self._doc_cols[self._n_doc_cols] = <PyObject*>col
        self._n_doc_cols += 1
        self._nbytes += col_bytes(col) - before
        return 0

    cdef bytes _term_bytes(self, Py_ssize_t tid):
        """The encoded term ``tid``: column key + encoded value."""
        cdef _Column col = <_Column>self._cols[self._terms[tid].cid1 - 1]
        cdef int tag = col.tag
        cdef char buf[8]
        cdef const char* s
        cdef Py_ssize_t n
        if tag == STRING_TAG:
            owner = utf8(<str>PyList_GET_ITEM(self._vals, tid), &s, &n)
            return escaped_concat(col.key, False, s, n)
        if tag == INT_TAG or tag == FLOAT_TAG or tag == TIMESTAMP_TAG:
            put_be64(buf, self._terms[tid].key)
            return fixed_concat(col.key, buf, 8)
        if tag == BOOL_TAG:
            buf[0] = <char>self._terms[tid].key
            return fixed_concat(col.key, buf, 1)
        return col.key

    cdef Py_ssize_t _term_id(self, bytes term) except -2:
        """The id of the term whose encoding is exactly ``term``, or -1."""
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(term)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(term), i = 0, end, vn, nz
        cdef const unsigned char* q
        cdef const unsigned char* v
        cdef _Column col
        cdef TEntry* e
        cdef int tag
        while True:  # the path ends at the first 0x00 0x00 (0x00 0xFF and 0x00 0x01 pair up)
            q = <const unsigned char*>memchr(p + i, 0, n - i) if i < n else NULL
            if q == NULL or q - p + 1 >= n:
                return -1
            if q[1] == 0:
                end = q - p + 2
                break
            i = q - p + 2
        if end >= n:
            return -1
        col = self._colobjs.get(term[:end + 1])
        if col is None:
            return -1
        tag = col.tag
        v = p + end + 1
        vn = n - end - 1
        if tag == STRING_TAG:
            if vn < 2 or v[vn - 2] != 0 or v[vn - 1] != 0:
                return -1
            # escape() output: every 0x00 of the body is followed by 0xFF. Then decoding and
            # re-encoding give these exact bytes back (strict UTF-8 is a bijection).
            nz = 0
            i = 0
            while i < vn - 2:
                q = <const unsigned char*>memchr(v + i, 0, vn - 2 - i)
                if q == NULL:
                    break
                if q - v + 1 >= vn - 2 or q[1] != 0xFF:
                    return -1
                nz += 1
                i = q - v + 2
            body = term[end + 1:n - 2]
            try:
                s = (body.replace(b"\x00\xff", b"\x00") if nz else body).decode("utf-8")
            except UnicodeDecodeError:
                return -1
            e = self._find(col.cid, <uint64_t>PyObject_Hash(s), s)
        elif tag == INT_TAG or tag == FLOAT_TAG or tag == TIMESTAMP_TAG:
            if vn != 8:
                return -1
            e = self._find(col.cid, get_be64(v), None)
        elif tag == BOOL_TAG:
            if vn != 1 or v[0] > 1:
                return -1
            e = self._find(col.cid, v[0], None)
        else:
            if vn != 0:
                return -1
            e = self._find(col.cid, 0, None)
        return -1 if e == NULL else e.tid

    cdef array _postings_copy(self, Py_ssize_t tid, uint64_t limit):
        """A new ``array('I')`` of term ``tid``'s offsets that are ``< limit``."""
        cdef TEntry* e = self._find_tid(tid)
        cdef Py_ssize_t cut = lower_bound(plist_data(&e.pl), e.pl.n, limit)
        cdef array out = clone(_U32, cut, False)
        if cut:
            e = self._find_tid(tid)  # again: the allocation may have run arbitrary code
            memcpy(out.data.as_uints, plist_data(&e.pl), min(cut, <Py_ssize_t>e.pl.n) * sizeof(offset_t))
        return out

    # ------------------------------------------------------------ paths and columns

    cdef _Node _lookup_child(self, _Node parent, object key):
        """The child of ``parent`` at the exact str ``key``, or None if not created yet."""
        cdef PyObject* r = PyDict_GetItemWithError(parent.children, key)
        cdef _Node child
        if r == NULL:
            return None
        child = <_Node>r
        child.key = key
        parent.last_child = child
        return child

    cdef _Node _new_child(self, _Node parent, object key):
        """Create the child of ``parent`` at ``key`` (UnicodeEncodeError for lone surrogates)."""
        cdef const char* s
        cdef Py_ssize_t n
        cdef _Node child
        owner = utf8(key, &s, &n)
        child = _Node()
        child.enc = escaped_concat(parent.enc, parent is not self._root, s, n)
        child.is_event_time = parent is self._root and key == "_event_time"
        child.key = key
        parent.children[key] = child
        parent.last_child = child
        self._nbytes += NODE_BYTES + PyBytes_GET_SIZE(child.enc)
        return child

    cdef _Node _child(self, _Node parent, object key):
        cdef _Node child = self._lookup_child(parent, key)
        if child is None:
            child = self._new_child(parent, key)
        return child

    cdef _Column _new_column(self, _Node node, int tag):
        cdef _Column col = _Column()
        cdef char t = <char>tag
        col.key = fixed_concat(node.enc, &t, 1)
        col.tag = tag
        col.cid = <uint32_t>len(self._cols)
        self._cols.append(col)
        self._colobjs[col.key] = col
        self._nbytes += COLUMN_BYTES + PyBytes_GET_SIZE(col.key)
        if tag == NULL_TAG:
            node.c_null = col
        elif tag == BOOL_TAG:
            node.c_bool = col
        elif tag == INT_TAG:
            node.c_int = col
        elif tag == FLOAT_TAG:
            node.c_float = col
        elif tag == STRING_TAG:
            node.c_str = col
        elif tag == TIMESTAMP_TAG:
            node.c_ts = col
        elif tag == ARRAY_TAG:
            node.c_arr = col
        else:
            node.c_obj = col
        return col

    # ------------------------------------------------------------ the walk

    cdef int _walk_object(self, object obj, _Node node, const Where* where, Py_ssize_t depth,
                          bint in_array) except -1:
        """Walk the members of ``obj`` (at ``node``/``where``, nesting level ``depth``)."""
        cdef Where w
        cdef Py_ssize_t pos = 0
        cdef PyObject* k
        cdef PyObject* v
        cdef PyObject* pred
        cdef PyObject* prev
        cdef _Node child
        if depth > self._max_depth:
            return nesting_error(self, where)
        w.up = where
        w.index = 0
        if type(obj) is dict:
            # Members usually come in the order of the previous document: predict the child
            # from the sibling chain and confirm by key identity (orjson reuses key objects).
            pred = node.first_child
            prev = NULL
            while PyDict_Next(obj, &pos, &k, &v):
                # Own references: odd values (subclasses) can run code that edits the dict.
                korig = <object>k
                val = <object>v
                w.key = k
                if pred != NULL and (<_Node>pred).key is korig:
                    child = <_Node>pred
                elif type(korig) is str:
                    child = self._lookup_child(node, korig)
                elif isinstance(korig, str):
                    self._walk_value(val, node, PyUnicode_FromObject(korig), None, &w, depth,
                                     in_array)
                    prev = NULL  # no prediction past a str subclass key
                    pred = NULL
                    continue
                else:
                    raise SchemaError(
                        f"object keys must be strings, not {type(korig).__name__}",
                        where_str(where),
                    )
                self._walk_value(val, node, korig, child, &w, depth, in_array)
                if child is None:
                    child = node.last_child  # created by the walk
                if prev == NULL:
                    node.first_child = <PyObject*>child
                else:
                    (<_Node>prev).next_sib = <PyObject*>child
                prev = <PyObject*>child
                pred = child.next_sib
        else:  # a dict subclass: its items() decides the order
            for korig, val in obj.items():
                w.key = <PyObject*>korig
                if type(korig) is str:
                    self._walk_value(val, node, korig, None, &w, depth, in_array)
                elif isinstance(korig, str):
                    self._walk_value(val, node, PyUnicode_FromObject(korig), None, &w, depth,
                                     in_array)
                else:
                    raise SchemaError(
                        f"object keys must be strings, not {type(korig).__name__}",
                        where_str(where),
                    )
        return 0

    cdef int _walk_value(self, object v, _Node parent, object key, _Node node,
                         const Where* where, Py_ssize_t depth, bint in_array) except -1:
        """Index ``v``, the member ``key`` of ``parent`` (``node``: its child, if known).

        Array elements come with ``node`` (their array's). ``where`` already names ``v``.
        An unknown child is created (its key encoded) at the point where the reference
        encodes the path, so that errors come in the same order.
        """
        cdef type t = type(v)
        if t is str:
            return self._leaf_str(<str>v, parent, key, node, where, in_array)
        if t is int:
            return self._leaf_int(v, parent, key, node, where, depth, in_array)
        if t is float:
            return self._leaf_float(v, parent, key, node, where, in_array)
        if v is True or v is False:
            return self._leaf_fixed(v, BOOL_TAG, parent, key, node, in_array)
        if v is None:
            return self._leaf_fixed(None, NULL_TAG, parent, key, node, in_array)
        if t is not dict and t is not list and t is not tuple:
            # Subclasses, in the reference's isinstance order.
            if isinstance(v, str):
                return self._leaf_str(PyUnicode_FromObject(v), parent, key, node, where, in_array)
            if isinstance(v, int):
                return self._leaf_int(v, parent, key, node, where, depth, in_array)
            if isinstance(v, float):
                return self._leaf_float(v, parent, key, node, where, in_array)
            if not isinstance(v, (dict, list, tuple)):
                raise SchemaError(f"unsupported value type {t.__name__}", where_str(where))
        if depth >= RECURSION_CHECK_FROM:
            if Py_EnterRecursiveCall(" while indexing a document"):
                return -1
            try:
                return self._walk_container(v, parent, key, node, where, depth, in_array)
            finally:
                Py_LeaveRecursiveCall()
        return self._walk_container(v, parent, key, node, where, depth, in_array)

    cdef int _walk_container(self, object v, _Node parent, object key, _Node node,
                             const Where* where, Py_ssize_t depth, bint in_array) except -1:
        cdef _Column col
        if isinstance(v, dict):
            if node is None:
                node = self._child(parent, key)
            col = node.c_obj
            if col is None:
                col = self._new_column(node, OBJECT_TAG)
            self._queue(col, 0, None)
            return self._walk_object(v, node, where, depth + 1, in_array)
        return self._walk_array(v, parent, key, node, where, depth, in_array)

    cdef int _walk_array(self, object v, _Node parent, object key, _Node node,
                         const Where* where, Py_ssize_t depth, bint in_array) except -1:
        cdef _Column col
        cdef Py_ssize_t i
        cdef Where w
        cdef type t = type(v)
        if depth + 1 > self._max_depth:
            return nesting_error(self, where)
        if node is None:
            node = self._child(parent, key)
        col = node.c_arr
        if col is None:
            col = self._new_column(node, ARRAY_TAG)
        self._queue(col, 0, None)
        w.up = where
        w.key = NULL
        if t is list:
            i = 0
            while i < PyList_GET_SIZE(v):
                item = <object>PyList_GET_ITEM(v, i)
                w.index = i
                self._walk_value(item, None, None, node, &w, depth + 1, True)
                i += 1
        elif t is tuple:
            for i in range(PyTuple_GET_SIZE(v)):
                w.index = i
                self._walk_value(<object>PyTuple_GET_ITEM(v, i), None, None, node, &w,
                                 depth + 1, True)
        else:
            i = 0
            for item in v:
                w.index = i
                self._walk_value(item, None, None, node, &w, depth + 1, True)
                i += 1
        if not in_array:
            text = <bytes>_dumps(v)
            self._col_add(col, PyBytes_AS_STRING(text), <size_t>PyBytes_GET_SIZE(text), None)
        return 0

    cdef int _leaf_str(self, str v, _Node parent, object key, _Node node,
                       const Where* where, bint in_array) except -1:
        """``v``: an exact str (a subclass's value is converted by the caller)."""
        cdef _Column col
        if not PyUnicode_IS_ASCII(v) and has_surrogate(v):
            raise SchemaError("string is not valid UTF-8 (lone surrogate)", where_str(where))
        if node is None:
            node = self._child(parent, key)
        col = node.c_str
        if col is None:
            col = self._new_column(node, STRING_TAG)
        self._queue(col, <uint64_t>PyObject_Hash(v), v)
        if not in_array:
            self._col_add(col, NULL, 0, v)
        return 0

    cdef int _leaf_int(self, object v, _Node parent, object key, _Node node,
                       const Where* where, Py_ssize_t depth, bint in_array) except -1:
        cdef int overflow = 0
        cdef long long x
        cdef _Column col
        if type(v) is not int:
            v = int(v)  # an int subclass: the reference stores int(v)
        x = PyLong_AsLongLongAndOverflow(v, &overflow)
        if overflow:
            raise SchemaError("integer outside the signed 64-bit range", where_str(where))
        if node is None:
            node = self._child(parent, key)
        if depth == 1 and node.is_event_time:
            col = node.c_ts
            if col is None:
                col = self._new_column(node, TIMESTAMP_TAG)
        else:
            col = node.c_int
            if col is None:
                col = self._new_column(node, INT_TAG)
        self._queue(col, int_key(<uint64_t>x), None)
        if not in_array:
            self._col_add(col, &x, 8, None)
        return 0

    cdef int _leaf_float(self, object v, _Node parent, object key, _Node node,
                         const Where* where, bint in_array) except -1:
        cdef double d = (<double>v)
        cdef uint64_t bits
        cdef _Column col
        if not isfinite(d):
            raise SchemaError(f"non-finite number {v!r} (JSON has no NaN or Infinity)",
                              where_str(where))
        d = d + 0.0  # -0.0 -> 0.0
        if node is None:
            node = self._child(parent, key)
        col = node.c_float
        if col is None:
            col = self._new_column(node, FLOAT_TAG)
        memcpy(&bits, &d, 8)
        self._queue(col, float_key(bits), None)
        if not in_array:
            self._col_add(col, &d, 8, None)
        return 0

    cdef int _leaf_fixed(self, object v, int tag, _Node parent, object key, _Node node,
                         bint in_array) except -1:
        """None (NULL) or a bool (BOOL)."""
        cdef _Column col
        cdef unsigned char b = 1 if v is True else 0
        if node is None:
            node = self._child(parent, key)
        if tag == BOOL_TAG:
            col = node.c_bool
            if col is None:
                col = self._new_column(node, BOOL_TAG)
            self._queue(col, b, None)
        else:
            col = node.c_null
            if col is None:
                col = self._new_column(node, NULL_TAG)
            self._queue(col, 0, None)
        if not in_array:
            self._col_add(col, &b, 1, None)
        return 0

    # ------------------------------------------------------------ add_columns
    #
    # A record batch, a column at a time: one pass over each column's Arrow buffers, with
    # no Python object per row but the str of a new string term (and a temporary str per
    # non-ASCII string value, whose hash() needs one). The result is exactly what add()
    # makes of the rows one by one: each row has one value per column, so column by column
    # every term still gets its rows in increasing order, each at most once; the column keys
    # new in the batch are put in the order add() would have met them at the end.

    def add_columns(self, names, arrays):
        """Index the rows of ``arrays`` (pyarrow Arrays of ``columns.INDEXABLE_TYPES``, the
        columns ``names``) as the next rows; returns the offset of the first.

        Exactly ``add(dict(zip(names, row)))`` for each row, a row's values as
        ``Array.to_pylist()`` gives them (a null is a JSON null), all or nothing; from the
        Arrow buffers, without a Python object per row.
        """
        cdef Py_ssize_t n, j, r, bad_row = -1, bad_col = -1, n_terms_before, nbytes_before, k0
        cdef Py_ssize_t nc, at, stop
        cdef offset_t base
        names, arrays, n = check_batch(names, arrays)
        if self._busy:
            raise RuntimeError("SegmentBuilder.add_columns() re-entered: a builder has one writer")
        if self._pins:
            raise RuntimeError("SegmentBuilder.add_columns() while write_blocks(), column() or columns() "
                               "reads the builder: add rows to a builder before sealing it, not during")
        if n > <Py_ssize_t>MAX_ROWS - self._n:
            raise OverflowError("a segment holds at most 2**32 - 1 rows: seal it first")
        if n == 0:
            return self._n
        if self._max_depth < 1:
            return nesting_error(self, NULL)
        nc = len(names)
        # The only value add() refuses here: a NaN or infinity. Its error is the first in
        # row order, as add() would meet it.
        for j in range(nc):
            arr = arrays[j]
            if arr.type == _DOUBLE:
                r = self._first_non_finite(arr)
                if r >= 0 and (bad_row < 0 or r < bad_row):
                    bad_row, bad_col = r, j
        self._busy = True
        base = <offset_t>self._n
        n_terms_before = self._n_terms
        nbytes_before = self._nbytes
        k0 = len(self._colkeys)
        touched = []  # (column, its values before), each column before anything is added to it
        at = 0  # values indexed so far, column by column (for _test_fail_commit_at)
        try:
            nodes = []
            for j in range(nc):  # as the first row would: a bad name, unless a NaN comes first
                if bad_row == 0 and bad_col == j:
                    break
                nodes.append(self._child(self._root, names[j]))
            if bad_row >= 0:
                v = arrays[bad_col][bad_row].as_py()
                raise SchemaError(f"non-finite number {v!r} (JSON has no NaN or Infinity)",
                                  json_path([names[bad_col]]))
            for j in range(nc):
                stop = n
                if 0 <= self._fail_at - at < n:
                    stop = self._fail_at - at
                self._add_column(<_Node>nodes[j], arrays[j], j, stop, base, touched)
                if stop < n:
                    raise MemoryError("injected by _test_fail_commit_at()")
                at += n
            self._order_column_keys(k0, touched)
        except BaseException:
            self._rollback_columns(base, n_terms_before, nbytes_before, touched)
            raise
        finally:
            self._busy = False
        self._n += n
        return base

    cdef Py_ssize_t _first_non_finite(self, object arr) except -2:
        """The first row of the double array ``arr`` that is NaN or infinite, or -1."""
        bufs = arr.buffers()
        if bufs[1] is None:
            return -1
        return first_non_finite(buffer_address(bufs[1]),
                                buffer_address(bufs[0]) if arr.null_count else NULL,
                                arr.offset, len(arr))

    cdef _Column _touch(self, _Node node, int tag, Py_ssize_t j, list touched):
        """The column of ``node`` for ``tag`` (made if new), noted in ``touched`` with the
        index ``j`` of its batch column and its values before."""
        cdef _Column col
        if tag == NULL_TAG:
            col = node.c_null
        elif tag == BOOL_TAG:
            col = node.c_bool
        elif tag == INT_TAG:
            col = node.c_int
        elif tag == FLOAT_TAG:
            col = node.c_float
        elif tag == STRING_TAG:
            col = node.c_str
        else:
            col = node.c_ts
        if col is None:
            col = self._new_column(node, tag)
        touched.append((col, col.offs.n, j))
        return col

    cdef int _add_column(self, _Node node, object arr, Py_ssize_t j, Py_ssize_t n, offset_t base,
                         list touched) except -1:
        """Index the first ``n`` values of ``arr``, the batch column ``j`` at ``node``, as the
        rows from offset ``base``."""
        cdef _Column col, ncol = None
        cdef int tag
        cdef const unsigned char* valid = NULL
        t = arr.type
        if t == _NULL or arr.null_count == len(arr):  # (no column of the type: add() makes none)
            return self._add_nulls(self._touch(node, NULL_TAG, j, touched), n, base)
        bufs = arr.buffers()
        if arr.null_count:
            ncol = self._touch(node, NULL_TAG, j, touched)
            valid = buffer_address(bufs[0])
        if t == _INT64:
            tag = TIMESTAMP_TAG if node.is_event_time else INT_TAG
        elif t == _DOUBLE:
            tag = FLOAT_TAG
        elif t == _BOOL:
            tag = BOOL_TAG
        else:
            tag = STRING_TAG
        col = self._touch(node, tag, j, touched)
        if tag == STRING_TAG:
            return self._add_strings(col, ncol, bufs[1], t == _LARGE_STRING, bufs[2], valid,
                                     arr.offset, n, base)
        return self._add_fixed(col, ncol, buffer_address(bufs[1]), valid, arr.offset, n, base)

    cdef TEntry* _term(self, _Column col, uint64_t key) except NULL:
        """The entry of the term (``col``, ``key``) of a non-STRING column, made if new."""
        cdef TEntry* e = self._find(col.cid, key, None)
        if e == NULL:
            e = self._insert(col, key, None)
        return e

    cdef int _post_at(self, TEntry* e, offset_t off) except -1:
        """Add row ``off`` (past every row ``e`` has) to ``e``'s postings."""
        cdef uint32_t n = e.pl.n
        plist_push(&e.pl, off)
        self._nbytes += plist_growth(n)
        return 0

    cdef int _add_null(self, _Column ncol, offset_t off, TEntry** null_e, TEntry** null_terms) except -1:
        """Index a null cell of row ``off``: the NULL term's posting (``null_e``, looked up
        again when an insert moved the terms, which ``null_terms`` tells) and the column
        store's row (``ncol.offs`` has room)."""
        if null_e[0] == NULL or null_terms[0] != self._terms:
            null_e[0] = self._term(ncol, 0)
            null_terms[0] = self._terms
        self._post_at(null_e[0], off)
        ncol.offs.data[ncol.offs.n] = off
        ncol.offs.n += 1
        return 0

    cdef int _add_nulls(self, _Column ncol, Py_ssize_t n, offset_t base) except -1:
        """``n`` nulls as the rows from ``base``."""
        cdef Py_ssize_t i
        cdef size_t before = col_bytes(ncol)
        cdef TEntry* e
        u32_reserve(&ncol.offs, <size_t>n)
        e = self._term(ncol, 0)
        for i in range(n):
            self._post_at(e, base + <offset_t>i)
            ncol.offs.data[ncol.offs.n] = base + <offset_t>i
            ncol.offs.n += 1
        self._nbytes += col_bytes(ncol) - before
        return 0

    cdef int _add_fixed(self, _Column col, _Column ncol, const unsigned char* data,
                        const unsigned char* valid, Py_ssize_t start, Py_ssize_t n,
                        offset_t base) except -1:
        """Values ``start`` .. ``start + n - 1`` of an int64 (INT, TIMESTAMP), double (FLOAT,
        all finite) or bool (BOOL) array as the rows from ``base``; ``valid``: its validity
        bits, NULL when no value is null (else the nulls go to ``ncol``)."""
        cdef Py_ssize_t i, ahead
        cdef size_t before = col_bytes(col) + (col_bytes(ncol) if ncol is not None else 0)
        cdef size_t k
        cdef int tag = col.tag
        cdef uint32_t cid1 = col.cid + 1
        cdef uint64_t key, bits
        cdef int64_t x
        cdef double d
        cdef offset_t off
        cdef TEntry* null_e = NULL
        cdef TEntry* null_terms = NULL  # the terms null_e points into
        u32_reserve(&col.offs, <size_t>n)
        if tag == BOOL_TAG:
            buf_reserve(&col.vals, ((col.offs.n + <size_t>n + 7) >> 3) - col.vals.n)
        else:
            buf_reserve(&col.vals, <size_t>n * 8)
        if ncol is not None:
            u32_reserve(&ncol.offs, <size_t>n)
        for i in range(n):
            off = base + <offset_t>i
            if valid != NULL and not bit_at(valid, start + i):
                self._add_null(ncol, off, &null_e, &null_terms)
                continue
            if tag == BOOL_TAG:
                key = bit_at(data, start + i)
            elif tag == FLOAT_TAG:
                memcpy(&d, data + (start + i) * 8, 8)
                d = d + 0.0  # -0.0 -> 0.0
                memcpy(&bits, &d, 8)
                key = float_key(bits)
            else:
                memcpy(&x, data + (start + i) * 8, 8)
                key = int_key(<uint64_t>x)
            # The slot of a row a few ahead is on its way while this one is resolved.
            ahead = i + 8
            if ahead < n and tag != BOOL_TAG:
                memcpy(&bits, data + (start + ahead) * 8, 8)
                bits = float_key(bits) if tag == FLOAT_TAG else int_key(bits)
                rt_prefetch(&self._table[mix(bits, cid1) & self._mask])
            self._post_at(self._term(col, key), off)
            k = col.offs.n
            col.offs.data[k] = off
            col.offs.n = k + 1
            if tag == BOOL_TAG:
                put_bit(&col.vals, k, key)
            elif tag == FLOAT_TAG:
                memcpy(col.vals.data + col.vals.n, &d, 8)
                col.vals.n += 8
            else:
                memcpy(col.vals.data + col.vals.n, &x, 8)
                col.vals.n += 8
        self._nbytes += col_bytes(col) + (col_bytes(ncol) if ncol is not None else 0) - before
        return 0

    cdef int _add_strings(self, _Column col, _Column ncol, object offsets_buf, bint large,
                          object data_buf, const unsigned char* valid, Py_ssize_t start,
                          Py_ssize_t n, offset_t base) except -1:
        """Values ``start`` .. ``start + n - 1`` of a string or large_string array as the rows
        from ``base`` (``valid``, ``ncol``: as ``_add_fixed``).

        An ASCII value is hashed (and its table slot prefetched) STR_AHEAD rows before it is
        resolved: in a large table the slot is a cache miss, most of a new term's cost.
        """
        cdef const unsigned char* offsets = buffer_address(offsets_buf)
        cdef const unsigned char* data = NULL
        cdef Py_ssize_t size = 0, i, m
        cdef size_t before = col_bytes(col) + (col_bytes(ncol) if ncol is not None else 0)
        cdef size_t slot
        cdef int64_t lo, hi, a, b, end
        cdef uint32_t cid1 = col.cid + 1
        cdef uint64_t key
        cdef uint64_t ahead_key[STR_AHEAD]  # row i's hash at i % STR_AHEAD (ASCII values)
        cdef bint ahead_ascii[STR_AHEAD]  # whether row i's value is ASCII (so hashed)
        cdef bint ascii_value
        cdef offset_t off
        cdef const unsigned char* v
        cdef TSlot* t
        cdef TEntry* e
        cdef TEntry* null_e = NULL
        cdef TEntry* null_terms = NULL
        cdef int kind, ascii
        cdef Py_ssize_t sn
        cdef const void* sdata
        if data_buf is not None:
            data = buffer_address(data_buf)
            size = data_buf.size
        lo = offset_at(offsets, large, start)
        hi = offset_at(offsets, large, start + n)
        if lo < 0 or hi < lo or hi > size:
            raise ValueError("string array whose offsets are outside its data: a malformed array")
        u32_reserve(&col.offs, <size_t>n)
        buf_reserve(&col.vals, <size_t>(hi - lo))
        buf_reserve(&col.ends, <size_t>n * sizeof(int64_t))
        if ncol is not None:
            u32_reserve(&ncol.offs, <size_t>n)
        for i in range(min(n, STR_AHEAD)):
            self._hash_ahead(offsets, large, data, lo, hi, valid, start + i, cid1,
                             &ahead_key[i], &ahead_ascii[i])
        b = lo
        for i in range(n):
            off = base + <offset_t>i
            a = b
            b = offset_at(offsets, large, start + i + 1)
            if b < a or b > hi:
                raise ValueError("string array whose offsets decrease: a malformed array")
            key = ahead_key[i % STR_AHEAD]
            ascii_value = ahead_ascii[i % STR_AHEAD]
            if i + STR_AHEAD < n:
                self._hash_ahead(offsets, large, data, lo, hi, valid, start + i + STR_AHEAD, cid1,
                                 &ahead_key[i % STR_AHEAD], &ahead_ascii[i % STR_AHEAD])
            if valid != NULL and not bit_at(valid, start + i):
                self._add_null(ncol, off, &null_e, &null_terms)
                continue
            v = data + a
            m = <Py_ssize_t>(b - a)
            if ascii_value:
                # Keyed like add()'s str, found by comparing the bytes: no str unless new.
                slot = mix(key, cid1) & self._mask
                while True:
                    t = &self._table[slot]
                    if t.cid1 == 0:
                        e = self._insert(col, key, PyUnicode_DecodeUTF8(<const char*>v, m, NULL))
                        break
                    if t.cid1 == cid1 and t.key == key:
                        e = &self._terms[t.tid]
                        sdata = rt_str_data(e.sv, &kind, &sn, &ascii)
                        if ascii and sn == m and memcmp(sdata, v, <size_t>m) == 0:
                            break
                    slot = (slot + 1) & self._mask
            else:
                s = PyUnicode_DecodeUTF8(<const char*>v, m, "strict")
                key = <uint64_t>PyObject_Hash(s)
                e = self._find(col.cid, key, s)
                if e == NULL:
                    e = self._insert(col, key, s)
            self._post_at(e, off)
            memcpy(col.vals.data + col.vals.n, v, <size_t>m)
            col.vals.n += <size_t>m
            end = <int64_t>col.vals.n
            memcpy(col.ends.data + col.ends.n, &end, sizeof(int64_t))
            col.ends.n += sizeof(int64_t)
            col.offs.data[col.offs.n] = off
            col.offs.n += 1
        self._nbytes += col_bytes(col) + (col_bytes(ncol) if ncol is not None else 0) - before
        return 0

    cdef void _hash_ahead(self, const unsigned char* offsets, bint large, const unsigned char* data,
                          int64_t lo, int64_t hi, const unsigned char* valid, Py_ssize_t row,
                          uint32_t cid1, uint64_t* key, bint* ascii_value) noexcept:
        """For ``_add_strings``: whether value ``row`` is ASCII and then its hash, and
        prefetch its slot. (Not ASCII, null or malformed: no hash; the row is checked when
        it is resolved.)"""
        cdef int64_t a = offset_at(offsets, large, row), b = offset_at(offsets, large, row + 1)
        ascii_value[0] = False
        if a < lo or b < a or b > hi or (valid != NULL and not bit_at(valid, row)):
            return
        if is_ascii(data + a, <size_t>(b - a)):
            key[0] = ascii_hash(data + a, <Py_ssize_t>(b - a))
            ascii_value[0] = True
            rt_prefetch(&self._table[mix(key[0], cid1) & self._mask])

    cdef int _order_column_keys(self, Py_ssize_t k0, list touched) except -1:
        """Put the column keys the batch added (past ``k0``) in the order ``add`` would
        have: by the first row with a value, then by batch column."""
        cdef _Column col
        cdef TEntry* e
        if len(self._colkeys) - k0 < 2:
            return 0
        column_of = {}
        for col, _, j in touched:
            column_of[col.key] = j
        order = []
        for ck in self._colkeys[k0:]:
            col = <_Column>self._colobjs[ck]
            e = self._find_tid(col.tids.data[0])
            order.append((plist_data(&e.pl)[0], column_of[ck], ck))
        order.sort()
        self._colkeys[k0:] = [ck for _, _, ck in order]
        return 0

    cdef int _rollback_columns(self, offset_t base, Py_ssize_t n_terms_before,
                               Py_ssize_t nbytes_before, list touched) except -1:
        """Undo what a failed ``add_columns`` changed: the builder is as before."""
        cdef _Column col
        cdef TEntry* e
        cdef size_t t
        for col, k, _ in touched:
            for t in range(col.tids.n):  # the batch's rows are the last of each posting list
                e = self._find_tid(col.tids.data[t])
                while e.pl.n and e.pl.last >= base:
                    plist_pop(&e.pl)
            col.offs.n = <size_t>k
            col_cut(col)
        self._drop_terms(n_terms_before)
        self._nbytes = nbytes_before
        return 0

    def _test_fail_commit_at(self, n):
        """Tests only: make ``add`` raise MemoryError before resolving its ``n``-th term,
        and ``add_columns`` before indexing its ``n``-th value (column after column).

        The walk validates everything, so only an allocation failure can interrupt the
        second phase; this makes that rollback path testable. ``-1`` turns it off.
        """
        self._fail_at = n

    # ------------------------------------------------------------ reads

    def postings(self, term, limit):
        """Offsets (< ``limit``) of the rows holding ``term``, increasing; a new array."""
        cdef Py_ssize_t tid
        cdef long long lim
        cdef int overflow = 0
        if type(term) is not bytes:
            hash(term)  # unhashable: TypeError, like the reference's dict lookup
            if not isinstance(term, bytes):
                return clone(_U32, 0, False)
            term = bytes(term)
        tid = self._term_id(term)
        if tid < 0:
            return clone(_U32, 0, False)
        lim = PyLong_AsLongLongAndOverflow(_index(limit), &overflow)
        if overflow < 0 or (overflow == 0 and lim <= 0):
            return clone(_U32, 0, False)
        if overflow > 0 or <unsigned long long>lim > NO_LIMIT:
            return self._postings_copy(tid, NO_LIMIT)
        return self._postings_copy(tid, <uint64_t>lim)

    def column_terms(self, column_key):
        """Every distinct term of one column key (path + type), in no particular order."""
        cdef _Column col = self._colobjs.get(column_key)
        cdef size_t i
        if col is None:
            return []
        return [self._term_bytes(col.tids.data[i]) for i in range(col.tids.n)]

    def column_keys(self):
        """Column keys (path + type) that have at least one term, in first-term order."""
        return list(self._colkeys)

    cdef list _sort_prepare(self, TermSort* s):
        """Column key ranks, buckets and buffers of ``_sort_terms``; returns the sorted column
        keys, which own the bytes ``s.ck`` points into (keep the list alive meanwhile)."""
        cdef _Column col
        cdef Py_ssize_t i, ncols = len(self._cols), nck
        cdef size_t total = 0, largest = 0
        cks = sorted(self._colkeys)
        nck = len(cks)
        s.rank_of = <uint32_t*>safe_realloc(NULL, ncols, sizeof(uint32_t))
        memset(s.rank_of, 0, ncols * sizeof(uint32_t))
        s.ck = <const unsigned char**>safe_realloc(NULL, nck, sizeof(const unsigned char*))
        s.ck_len = <Py_ssize_t*>safe_realloc(NULL, nck, sizeof(Py_ssize_t))
        s.ck_tag = <unsigned char*>safe_realloc(NULL, nck, sizeof(unsigned char))
        s.bucket = <size_t*>safe_realloc(NULL, nck + 1, sizeof(size_t))
        for i in range(nck):
            ck = <bytes>PyList_GET_ITEM(cks, i)
            col = <_Column>self._colobjs[ck]
            s.rank_of[col.cid] = <uint32_t>i
            s.ck[i] = <const unsigned char*>PyBytes_AS_STRING(ck)
            s.ck_len[i] = PyBytes_GET_SIZE(ck)
            s.ck_tag[i] = <unsigned char>col.tag
            s.bucket[i] = total
            total += col.tids.n  # the column's terms
            largest = max(largest, col.tids.n)
        s.bucket[nck] = total
        s.n_ranks = <size_t>nck
        s.n = <size_t>self._n_terms
        if total != s.n:  # pragma: no cover - an internal inconsistency
            raise AssertionError(f"SegmentBuilder: {total} terms in columns, {s.n} in the table")
        s.items = <SortItem*>safe_realloc(NULL, s.n, sizeof(SortItem))
        s.tmp = <SortItem*>safe_realloc(NULL, largest, sizeof(SortItem))
        return cks

    cdef int _sort_terms(self, TermSort* s) noexcept nogil:
        """Fill ``s.items`` in term order, and ``s.cand``; -1 when out of memory, -4 when
        the terms do not match the columns' term counts (a bug).

        Needs no GIL (see "term order" above); the terms must not change meanwhile.
        """
        cdef size_t i, j, need, cap, c, n = <size_t>self._n_terms
        cdef TEntry* e
        cdef SortItem* it
        cdef uint32_t rank
        cdef unsigned char* p
        cdef void* q
        cdef size_t* pos
        cdef char* ahead
        pos = <size_t*>malloc((s.n_ranks + 1) * sizeof(size_t))
        if pos == NULL:
            return -1
        memcpy(pos, s.bucket, (s.n_ranks + 1) * sizeof(size_t))
        # 1. One pass over the terms, in creation order: each to the bucket of its column.
        for i in range(n):
            e = &self._terms[i]
            if i + PREFETCH_TERMS < n:
                ahead = <char*>self._terms[i + PREFETCH_TERMS].sv
                if ahead != NULL:
                    rt_prefetch(ahead)
                    rt_prefetch(ahead + 40)  # where the state and the characters are
            rank = s.rank_of[e.cid1 - 1]
            j = pos[rank]
            if j >= s.bucket[rank + 1]:  # pragma: no cover - an internal inconsistency
                free(pos)
                return -4
            pos[rank] = j + 1
            it = &s.items[j]
            it.e = e
            if e.pl.n >= RAW_MAX and not _surely_raw(plist_data(&e.pl), e.pl.n):
                if s.n_cand == s.cand_cap:
                    cap = s.cand_cap * 2 if s.cand_cap else 256
                    q = realloc(s.cand, cap * sizeof(TEntry*))
                    if q == NULL:
                        free(pos)
                        return -1
                    s.cand = <TEntry**>q
                    s.cand_cap = cap
                s.cand[s.n_cand] = e
                s.n_cand += 1
            if e.sv == NULL:
                it.key = e.key
                it.v = NULL
            else:
                p = arena_room(s, sizeof(size_t) + str_bound(e.sv))
                if p == NULL:
                    free(pos)
                    return -1
                need = encode_str(e.sv, p + sizeof(size_t))
                memcpy(p, &need, sizeof(size_t))
                it.key = be_prefix(p + sizeof(size_t), need)
                it.v = p + sizeof(size_t)
                s.free_at += sizeof(size_t) + need
                s.free_len -= sizeof(size_t) + need
        free(pos)
        # 2. Sort each bucket.
        for c in range(s.n_ranks):
            j = s.bucket[c]
            radix_sort(s.items + j, s.tmp, s.bucket[c + 1] - j)
            if s.ck_tag[c] == STRING_TAG:
                refine_strings(s.items + j, s.tmp, s.bucket[c + 1] - j, 8, 0)
        free(s.tmp)
        s.tmp = NULL
        return 0

    def sorted_postings(self):
        """All (term, offsets) pairs sorted by term: what a seal writes."""
        cdef TermSort s
        cdef SortItem* it
        cdef size_t i, vlen
        cdef uint32_t rank
        cdef Py_ssize_t cl
        cdef unsigned char buf[8]
        cdef const unsigned char* v
        cdef array arr
        cdef bytes t
        cdef char* q
        if self._busy:
            raise RuntimeError("SegmentBuilder read while add() runs: a builder has one writer")
        memset(&s, 0, sizeof(TermSort))
        out = []
        self._busy = True  # no add() (e.g. from a finalizer) may move the table meanwhile
        try:
            cks = self._sort_prepare(&s)
            sort_error(self._sort_terms(&s))  # with the GIL: no add() can interleave
            for i in range(s.n):
                it = &s.items[i]
                rank = s.rank_of[it.e.cid1 - 1]
                vlen = term_value(&s, it, rank, buf, &v)
                if vlen == 0:
                    t = <bytes>PyList_GET_ITEM(cks, rank)
                else:
                    cl = s.ck_len[rank]
                    t = PyBytes_FromStringAndSize(NULL, cl + <Py_ssize_t>vlen)
                    q = PyBytes_AS_STRING(t)
                    memcpy(q, s.ck[rank], <size_t>cl)
                    memcpy(q + cl, v, vlen)
                arr = clone(_U32, it.e.pl.n, False)
                memcpy(arr.data.as_uints, plist_data(&it.e.pl), it.e.pl.n * sizeof(offset_t))
                pair = (t, arr)
                # Neither can be part of a reference cycle; untracked, 10**5-10**6 of them do
                # not trigger full collections of the whole heap (the reference's do).
                PyObject_GC_UnTrack(arr)
                PyObject_GC_UnTrack(pair)
                out.append(pair)
        finally:
            self._busy = False
            sort_free(&s)
        return out

    def write_blocks(self, target_bytes=16384):
        """The term blocks of a seal: ``[(first_term, block), ...]``.

        Exactly what ``BlockWriter(target_bytes)`` returns when fed ``sorted_postings()``
        in order (each block ``add`` returns, then ``finish()``), made without a Python
        object per term. Runs without the GIL but for preparing, ``BitMap.serialize()`` of
        the postings that may encode as roaring (>= 64 rows), and making the output bytes;
        meanwhile ``add`` raises RuntimeError.
        """
        cdef BlockWriter writer = BlockWriter(target_bytes)  # checks target_bytes alike
        cdef TermSort s
        cdef BlockOut out
        cdef TEntry* e
        cdef size_t c
        cdef int rc = 0
        cdef uint32_t rank
        cdef unsigned char buf[8]
        cdef const unsigned char* v
        cdef bytes ser
        cdef array vals
        if self._busy:
            raise RuntimeError("SegmentBuilder read while add() runs: a builder has one writer")
        memset(&s, 0, sizeof(TermSort))
        memset(&out, 0, sizeof(BlockOut))
        self._pins += 1
        try:
            cks = self._sort_prepare(&s)
            with nogil:
                rc = self._sort_terms(&s)
                if rc == 0 and s.n_cand == 0:
                    rc = encode_blocks(&s, &writer.w, &out)
            if rc == 0 and s.n_cand > 0:
                # The roaring decisions (BitMap.serialize) need the GIL: all at once.
                s.ser = <const unsigned char**>safe_realloc(NULL, s.n_cand, sizeof(const unsigned char*))
                s.ser_len = <Py_ssize_t*>safe_realloc(NULL, s.n_cand, sizeof(Py_ssize_t))
                sers = []
                vals = clone(_U32, 0, False)  # one array('I') for every BitMap(vals)
                for c in range(s.n_cand):
                    e = s.cand[c]
                    resize_smart(vals, e.pl.n)
                    memcpy(vals.data.as_uints, plist_data(&e.pl), e.pl.n * sizeof(offset_t))
                    ser = _roaring_ser(plist_data(&e.pl), e.pl.n, vals)
                    if ser is None:
                        s.ser[c] = NULL
                        s.ser_len[c] = -1
                    else:
                        sers.append(ser)
                        s.ser[c] = <const unsigned char*>PyBytes_AS_STRING(ser)
                        s.ser_len[c] = PyBytes_GET_SIZE(ser)
                with nogil:
                    rc = encode_blocks(&s, &writer.w, &out)
            sort_error(rc)
            if rc == -2:
                raise ValueError("block larger than 4 GiB")
            if rc == -3:
                rank = s.rank_of[s.items[s.bad].e.cid1 - 1]
                tlen = s.ck_len[rank] + <Py_ssize_t>term_value(&s, &s.items[s.bad], rank, buf, &v)
                raise ValueError(f"term of {tlen} bytes is too long (at most {MAX_TERM})")
            return _blockout_list(&out)
        finally:
            self._pins -= 1
            sort_free(&s)
            _blockout_free(&out)

    def column(self, column_key, limit):
        """(offsets, values) of one column's rows with offset < ``limit``: a new array('I')
        and a new Arrow array of ``columns.ARROW_TYPES[tag]`` (copied: the builder's buffers
        keep growing). A column key the builder has no values of gives ``(array('I'), an
        empty array)``, typed by the key's last byte when that is a value type tag.
        """
        cdef _Column col
        cdef Py_ssize_t cut
        cdef long long lim
        cdef int overflow = 0
        if self._busy:
            raise RuntimeError("SegmentBuilder read while add() runs: a builder has one writer")
        col = self._colobjs.get(column_key)
        lim = PyLong_AsLongLongAndOverflow(_index(limit), &overflow)
        if col is None or col.tag == OBJECT_TAG:
            return clone(_U32, 0, False), _empty_values(column_key)
        if overflow < 0 or (overflow == 0 and lim <= 0):
            cut = 0
        elif overflow > 0 or <unsigned long long>lim > NO_LIMIT:
            cut = <Py_ssize_t>col.offs.n
        else:
            cut = lower_bound(col.offs.data, <Py_ssize_t>col.offs.n, <uint64_t>lim)
        return self._copy_columns([col], [cut])[0]

    def column_size(self, column_key, limit):
        """How many rows with offset < ``limit`` have a value in this column (no copy)."""
        cdef _Column col
        cdef long long lim
        cdef int overflow = 0
        col = self._colobjs.get(column_key)
        lim = PyLong_AsLongLongAndOverflow(_index(limit), &overflow)
        if col is None or overflow < 0 or (overflow == 0 and lim <= 0):
            return 0
        if overflow > 0 or <unsigned long long>lim > NO_LIMIT:
            return <Py_ssize_t>col.offs.n
        return lower_bound(col.offs.data, <Py_ssize_t>col.offs.n, <uint64_t>lim)

    def columns(self):
        """(column key, offsets, values) for every column with values, sorted by column key:
        new arrays, the values an Arrow array of ``columns.ARROW_TYPES[tag]`` (what a seal
        writes). The copies are made in one pass without the GIL (the sealer calls this
        while ingest runs on another thread).
        """
        cdef _Column col
        if self._busy:
            raise RuntimeError("SegmentBuilder read while add() runs: a builder has one writer")
        colobjs = self._colobjs
        cks = []
        cols = []
        cuts = []
        for ck in sorted(colobjs):
            col = <_Column>colobjs[ck]
            if col.offs.n:
                cks.append(ck)
                cols.append(col)
                cuts.append(<Py_ssize_t>col.offs.n)
        copies = self._copy_columns(cols, cuts)
        return [(cks[i], *copies[i]) for i in range(len(cks))]

    cdef list _copy_columns(self, list cols, list cuts):
        """(offsets, values) of the first ``cuts[i]`` rows of each column ``cols[i]`` (none an
        OBJECT column): a new array('I') and an Arrow array in new Arrow buffers.

        The arrays are allocated first, then filled in one pass (without the GIL when the
        bytes are many), then the Arrow ones wrapped. ``add`` refuses meanwhile (it could
        move the buffers).
        """
        cdef Copy* jobs = NULL
        cdef size_t nj = 0, total = 0, k, size, nb
        cdef Py_ssize_t i
        cdef _Column col
        cdef int tag
        cdef int64_t end
        cdef unsigned char* q
        cdef array offs
        specs = []
        self._pins += 1
        try:
            jobs = <Copy*>safe_realloc(NULL, 3 * len(cols), sizeof(Copy))
            for i in range(len(cols)):
                col = <_Column>cols[i]
                k = <size_t>(<Py_ssize_t>cuts[i])
                tag = col.tag
                offs = clone(_U32, <Py_ssize_t>k, False)
                jobs[nj] = Copy(<unsigned char*>offs.data.as_uints, <const unsigned char*>col.offs.data,
                                k * sizeof(offset_t), 0)
                nj += 1
                total += k * sizeof(offset_t)
                if tag == STRING_TAG or tag == ARRAY_TAG:
                    end = 0
                    if k:
                        memcpy(&end, col.ends.data + (k - 1) * sizeof(int64_t), sizeof(int64_t))
                    size = <size_t>end
                    offsets = pa.allocate_buffer((k + 1) * sizeof(int64_t))
                    data = pa.allocate_buffer(size)
                    q = buffer_address(offsets)
                    memset(q, 0, sizeof(int64_t))  # Arrow's offsets start with a 0
                    jobs[nj] = Copy(q + sizeof(int64_t), col.ends.data, k * sizeof(int64_t), 0)
                    jobs[nj + 1] = Copy(buffer_address(data), col.vals.data, size, 0)
                    nj += 2
                    total += k * sizeof(int64_t) + size
                    bufs = [None, offsets, data]
                elif tag == BOOL_TAG or tag == NULL_TAG:
                    nb = (k + 7) >> 3
                    bits = pa.allocate_buffer(nb)
                    jobs[nj] = Copy(buffer_address(bits), NULL, nb, <unsigned char>((1 << (k & 7)) - 1))
                    if tag == BOOL_TAG:
                        jobs[nj].src = col.vals.data
                    nj += 1
                    total += nb
                    bufs = [None, bits]
                else:
                    values = pa.allocate_buffer(k * 8)
                    jobs[nj] = Copy(buffer_address(values), col.vals.data, k * 8, 0)
                    nj += 1
                    total += k * 8
                    bufs = [None, values]
                specs.append((offs, ARROW_TYPES[tag], k, bufs))
            if total >= NOGIL_COPY:
                with nogil:
                    run_copies(jobs, nj)
            else:
                run_copies(jobs, nj)
        finally:
            self._pins -= 1
            free(jobs)
        return [(offs, pa.Array.from_buffers(t, k, bufs, null_count=0)) for offs, t, k, bufs in specs]
