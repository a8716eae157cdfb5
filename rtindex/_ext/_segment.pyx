"""Compiled mutable segment: a shard's newest rows, indexed once, in a mapping other processes read.

``rtindex/_py/segment.py`` is the contract (its docstring states the flattening rules) and
``rtindex/_py/jsonparse.py`` the JSON rules; the tests compare them with this module on
generated and hostile documents, byte for byte, errors included.

Why it looks like this:

- **One pass from JSON bytes to the index, without the GIL.** ``add_json`` takes a batch of
  documents as JSON bytes and, with the GIL released, scans each one (our own scanner, made
  for flattening: strings are validated and unescaped, numbers parsed, paths resolved in the
  same pass), queues its terms and column values, then commits them. No Python object is
  made per document. ``add_columns`` indexes an Arrow record batch column-wise.
- **Index once, read many.** Everything a query reads lives in one mapping: a file when the
  builder has a path, so that query processes map it read-only and search the writer's
  index instead of building their own (``SegmentBuilder.attach``). Memory there is only
  appended, never moved or freed (offsets, not pointers; growable tables keep their old
  copies), and every count is stored after what it counts (release) and loaded before it is
  used (acquire): a reader holding a row limit reads a consistent prefix while the writer
  goes on. The writer publishes the rows a reader in another process may see (``publish``)
  once they are durable.
- **Terms** are found through an open-addressing table of 16-byte slots keyed by (column,
  64-bit value key): numbers by their order-preserving 8-byte encoding, strings by a keyed
  SipHash-1-3 of their UTF-8 (the key is random per file, so crafted strings cannot be made
  to collide), then compared. A posting list keeps its first two rows in its record and the
  rest in slices that double up to 4,096 rows (Lucene's postings keep slices the same way).
- **The column store** of each column (a path and type) is three slice lists: row offsets,
  values (int64, double, bool bytes, string term ids, array text records) and the column's
  term ids; ``column``/``columns`` copy them into Arrow arrays.
- **Paths** are a private tree (only the writer walks documents) keyed by (parent, name),
  whose nodes predict the next member from the previous document, so most members cost a
  comparison of their name and no hash.

One writer thread at a time (``add_json`` and ``add_columns`` refuse to run concurrently);
any number of readers, in any thread or process, at any time.
"""

cimport cython
from cpython.array cimport array, clone
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.dict cimport PyDict_Next
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_Check
from cpython.dict cimport PyDict_Check
from cpython.object cimport PyTypeObject
from cpython.tuple cimport PyTuple_GET_ITEM
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject
from libc.math cimport isfinite
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc, qsort, realloc, strtod
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
from rtindex._ext._types cimport offset_t, safe_realloc

import os

from operator import index as _index

import pyarrow as pa

from rtindex.columns import ARROW_TYPES, check_batch
from rtindex.errors import SchemaError
from rtindex.keys import json_path

cdef extern from *:
    """
    #include <sys/mman.h>
    #include <fcntl.h>
    #include <unistd.h>
    #include <errno.h>
    #include <stdlib.h>
    #include <locale.h>
    #ifdef __APPLE__
    #include <xlocale.h>
    #endif
    #ifndef MAP_NORESERVE
    #define MAP_NORESERVE 0
    #endif
    #ifndef MAP_ANONYMOUS
    #define MAP_ANONYMOUS MAP_ANON
    #endif
    #ifndef O_CLOEXEC
    #define O_CLOEXEC 0
    #endif

    static inline uint64_t rt_ld64(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline uint32_t rt_ld32(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void rt_st64(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline void rt_st32(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline int rt_clz64(uint64_t x) { return __builtin_clzll(x); }
    #define rt_prefetch(p) __builtin_prefetch(p)

    /* SipHash-1-3 (Aumasson and Bernstein; the variant CPython hashes str with). */
    #define RT_ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
    #define RT_SIPROUND do { \\
        v0 += v1; v1 = RT_ROTL(v1, 13); v1 ^= v0; v0 = RT_ROTL(v0, 32); \\
        v2 += v3; v3 = RT_ROTL(v3, 16); v3 ^= v2; \\
        v0 += v3; v3 = RT_ROTL(v3, 21); v3 ^= v0; \\
        v2 += v1; v1 = RT_ROTL(v1, 17); v1 ^= v2; v2 = RT_ROTL(v2, 32); \\
    } while (0)
    static inline uint64_t rt_siphash13(uint64_t k0, uint64_t k1, const unsigned char* p, size_t n) {
        uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
        uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
        uint64_t b = ((uint64_t)n) << 56, m;
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            memcpy(&m, p + i, 8);
            #if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            m = __builtin_bswap64(m);
            #endif
            v3 ^= m; RT_SIPROUND; v0 ^= m;
        }
        switch (n - i) {
            case 7: b |= ((uint64_t)p[i + 6]) << 48; /* fall through */
            case 6: b |= ((uint64_t)p[i + 5]) << 40; /* fall through */
            case 5: b |= ((uint64_t)p[i + 4]) << 32; /* fall through */
            case 4: b |= ((uint64_t)p[i + 3]) << 24; /* fall through */
            case 3: b |= ((uint64_t)p[i + 2]) << 16; /* fall through */
            case 2: b |= ((uint64_t)p[i + 1]) << 8; /* fall through */
            case 1: b |= ((uint64_t)p[i]); break;
            default: break;
        }
        v3 ^= b; RT_SIPROUND; v0 ^= b;
        v2 ^= 0xff;
        RT_SIPROUND; RT_SIPROUND; RT_SIPROUND;
        return v0 ^ v1 ^ v2 ^ v3;
    }

    /* The first position >= i of '"', a backslash, a byte < 0x20 or a byte >= 0x80. */
    static inline size_t rt_str_stop(const unsigned char* p, size_t i, size_t n) {
        #if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
        while (i + 8 <= n) {
            uint64_t w, q, b, m;
            memcpy(&w, p + i, 8);
            q = w ^ (ones * 0x22);
            b = w ^ (ones * 0x5C);
            m = (((q - ones) & ~q) | ((b - ones) & ~b) | ((w - ones * 0x20) & ~w) | w) & highs;
            if (m) return i + ((size_t)__builtin_ctzll(m) >> 3);
            i += 8;
        }
        #endif
        while (i < n) {
            unsigned char c = p[i];
            if (c == 0x22 || c == 0x5C || c < 0x20 || c >= 0x80) return i;
            i++;
        }
        return n;
    }

    /* strtod in the C locale (a program may have set another one). */
    static locale_t rt_c_locale;
    static int rt_init_locale(void) {
        rt_c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
        return rt_c_locale ? 0 : -1;
    }
    static inline double rt_strtod(const char* s) { return strtod_l(s, NULL, rt_c_locale); }

    static inline int rt_fallocate(int fd, uint64_t at, uint64_t len) {
        #ifdef __APPLE__
        return ftruncate(fd, (off_t)(at + len)) == 0 ? 0 : errno;
        #else
        return posix_fallocate(fd, (off_t)at, (off_t)len);
        #endif
    }
    static inline int rt_errno(void) { return errno; }
    #ifndef MADV_POPULATE_WRITE
    #define MADV_POPULATE_WRITE 23
    #endif
    /* Fault the pages of a new region in with one call (much cheaper than a fault per page
       of a shared mapping); advice only: a kernel without it leaves them to fault. */
    static inline void rt_populate(void* p, size_t n) { (void)madvise(p, n, MADV_POPULATE_WRITE); }
    """
    uint64_t rt_ld64(const uint64_t* p) noexcept nogil
    uint32_t rt_ld32(const uint32_t* p) noexcept nogil
    void rt_st64(uint64_t* p, uint64_t v) noexcept nogil
    void rt_st32(uint32_t* p, uint32_t v) noexcept nogil
    int rt_clz64(uint64_t x) noexcept nogil
    void rt_prefetch(const void* p) noexcept nogil
    uint64_t rt_siphash13(uint64_t k0, uint64_t k1, const unsigned char* p, size_t n) noexcept nogil
    size_t rt_str_stop(const unsigned char* p, size_t i, size_t n) noexcept nogil
    int rt_init_locale() noexcept
    double rt_strtod(const char* s) noexcept nogil
    int rt_fallocate(int fd, uint64_t at, uint64_t len) noexcept nogil
    int rt_errno() noexcept nogil
    void rt_populate(void* p, size_t n) noexcept nogil
    int PROT_READ, PROT_WRITE, MAP_SHARED, MAP_PRIVATE, MAP_NORESERVE, MAP_ANONYMOUS, MADV_HUGEPAGE
    int madvise(void* addr, size_t length, int advice) nogil
    int O_RDWR, O_RDONLY, O_CREAT, O_EXCL, O_CLOEXEC
    void* MAP_FAILED
    void* mmap(void* addr, size_t length, int prot, int flags, int fd, long offset) nogil
    int munmap(void* addr, size_t length) nogil
    int c_open "open"(const char* path, int flags, int mode) nogil
    int c_close "close"(int fd) nogil

cdef extern from "Python.h":
    PyTypeObject PyFloat_Type
    PyTypeObject PyDict_Type
    PyTypeObject PyList_Type
    PyTypeObject PyTuple_Type
    PyTypeObject PyUnicode_Type
    PyTypeObject PyLong_Type
    PyTypeObject PyBool_Type
    PyTypeObject* rt_type "Py_TYPE"(PyObject* o) noexcept
    Py_ssize_t rt_size "Py_SIZE"(PyObject* o) noexcept

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
    VERSION = 1
    DIR_SHIFT = 8  # a Dir's first chunk holds 256 entries
    TABLE_MIN = 1024  # initial term table slots
    NTABLE_MIN = 256  # initial path table slots
    FIRST_SIZE = 1 << 20  # bytes a new file starts with
    GROW_MIN = 1 << 20  # the file grows by at least this many bytes (and a quarter of its size)
    PRIVATE_CHUNK = 64 << 10  # bytes of a private arena chunk (more for a longer name)
    POST_MINLOG = 3  # posting slices: 8 rows, doubling up to
    POST_MAXLOG = 12  # 4,096
    COL_MINLOG = 4  # column slices: 16 values, doubling up to
    COL_MAXLOG = 14  # 16,384
    PEND_TERM = 0
    PEND_TERM_COL = 1
    PEND_COL = 2
    NO_NODE = 0xFFFFFFFF

# Errors of a document (messages in _error_message); E_OS: the batch failed (errno in extra).
cdef enum:
    E_EMPTY = 1
    E_NOT_OBJECT = 2
    E_EOF = 3
    E_CHAR = 4
    E_NAN = 5
    E_NUMBER = 6
    E_CONTROL = 7
    E_ESCAPE = 8
    E_UESCAPE = 9
    E_UTF8 = 10
    E_KEY_EXPECTED = 11
    E_COLON = 12
    E_OBJ_NEXT = 13
    E_ARR_NEXT = 14
    E_TRAILING = 15
    E_DEPTH = 20
    E_DUPKEY = 21
    E_SURROGATE = 22
    E_KEY_SURROGATE = 23
    E_INT_RANGE = 24
    E_NONFINITE = 25
    E_OS = 30
    E_FULL = 31

cdef uint64_t MAGIC = 0x31304C4941545452  # "RTTAIL01"
cdef uint64_t RT_GOLDEN = 0x9E3779B97F4A7C15
cdef uint64_t RT_MIX1 = 0xBF58476D1CE4E5B9
cdef uint64_t RT_MIX2 = 0x94D049BB133111EB
cdef uint64_t RT_SIGN = 0x8000000000000000
cdef uint32_t NO_TERM = 0  # no term (offset 0 is the header)
cdef uint64_t MAX_ROWS = 0xFFFFFFFF  # offsets are uint32
cdef uint32_t INDEX_BIT = 0x80000000  # DocError.path: an array index, not a node
cdef uint64_t DEFAULT_RESERVE = 16 << 30  # address space a file may grow into (at most 32 GiB: term ids are offsets / 8)
cdef array _U32 = array("I")
cdef double POW10[23]
cdef int _i
for _i in range(23):
    POW10[_i] = float(10 ** _i)

assert _U32.itemsize == sizeof(offset_t), "array('I') must hold 32-bit items"
if rt_init_locale() != 0:  # pragma: no cover
    raise ImportError("rtindex: cannot create the C locale for number parsing")

_LARGE_STRING = pa.large_string()
_NULL = pa.null()
_BOOL = pa.bool_()
_INT64 = pa.int64()
_DOUBLE = pa.float64()
_NOT_OBJECT_KIND = {ord("["): "an array", ord('"'): "a string", ord("t"): "a boolean", ord("f"): "a boolean",
                    ord("n"): "null", ord("-"): "a number"}
_NOT_OBJECT_KIND.update({c: "a number" for c in range(0x30, 0x3A)})


# ---------------------------------------------------------------- value keys


cdef inline uint64_t int_key(int64_t v) noexcept nogil:
    """The order-preserving 8-byte key of an int (keys.encode_int as a number)."""
    return (<uint64_t>v) ^ RT_SIGN


cdef inline int64_t key_int(uint64_t k) noexcept nogil:
    return <int64_t>(k ^ RT_SIGN)


cdef inline uint64_t float_key(double d) noexcept nogil:
    """keys.encode_float as a number (-0.0 is 0.0)."""
    cdef uint64_t bits
    d = d + 0.0
    memcpy(&bits, &d, 8)
    if bits & RT_SIGN:
        return ~bits
    return bits | RT_SIGN


cdef inline double key_float(uint64_t k) noexcept nogil:
    cdef uint64_t bits = (k & ~RT_SIGN) if k & RT_SIGN else ~k
    cdef double d
    memcpy(&d, &bits, 8)
    return d


cdef inline uint64_t mix(uint64_t key, uint32_t cid1, uint64_t seed) noexcept nogil:
    """Slot hash of (column, value key): keyed, so crafted values cannot collide on purpose."""
    cdef uint64_t z = (key ^ seed) + <uint64_t>cid1 * RT_GOLDEN
    z = (z ^ (z >> 30)) * RT_MIX1
    z = (z ^ (z >> 27)) * RT_MIX2
    return z ^ (z >> 31)


cdef inline uint64_t get_be64(const unsigned char* b) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v = (v << 8) | b[i]
    return v


cdef inline void put_be64(unsigned char* out, uint64_t v) noexcept nogil:
    cdef int i
    for i in range(8):
        out[i] = <unsigned char>((v >> (56 - 8 * i)) & 0xFF)


# ---------------------------------------------------------------- the mapping: arena, dirs, slices


cdef inline void* at(const Tail* t, uint64_t off) noexcept nogil:
    return t.map + off


cdef int grow_file(Tail* t, uint64_t need) noexcept nogil:
    """Make the file hold at least ``need`` bytes (allocated ahead in steps: a full disk is
    an error here, never a fault on first touch); -1 with t.err set when it cannot."""
    cdef Header* h = t.h
    cdef uint64_t size = h.size, new_size, step
    cdef int rc
    if need <= size:
        return 0
    if need > h.reserve:
        t.err.code = E_FULL
        return -1
    step = size >> 2
    if step < GROW_MIN:
        step = GROW_MIN
    new_size = size + step
    if new_size < need:
        new_size = need
    new_size = (new_size + (1 << 20) - 1) & ~(<uint64_t>(1 << 20) - 1)
    if new_size > h.reserve:
        new_size = h.reserve
    if t.fd >= 0:
        rc = rt_fallocate(t.fd, size, new_size - size)
        if rc != 0:
            t.err.code = E_OS
            t.err.extra = <uint64_t>rc
            return -1
        rt_populate(t.map + size, new_size - size)
    h.size = new_size
    return 0


cdef inline uint64_t alloc(Tail* t, uint64_t nbytes, uint64_t align) noexcept nogil:
    """``nbytes`` of fresh (zero) memory aligned to ``align``; its offset, 0 on failure."""
    cdef uint64_t off = (t.h.used + align - 1) & ~(align - 1)
    if off + nbytes > t.h.size and grow_file(t, off + nbytes) < 0:
        return 0
    t.h.used = off + nbytes
    return off


cdef inline uint64_t put_bytes(Tail* t, const unsigned char* p, size_t n) noexcept nogil:
    """A Bytes record (uint32 length, then the bytes) of ``p[:n]``; its offset, 0 on failure."""
    cdef uint64_t off = alloc(t, 4 + n, 4)
    cdef uint32_t len32 = <uint32_t>n
    if off == 0:
        return 0
    memcpy(t.map + off, &len32, 4)
    memcpy(t.map + off + 4, p, n)
    return off


cdef inline uint32_t bytes_len(const Tail* t, uint64_t off) noexcept nogil:
    cdef uint32_t n
    memcpy(&n, t.map + off, 4)
    return n


cdef inline const unsigned char* bytes_data(const Tail* t, uint64_t off) noexcept nogil:
    return t.map + off + 4


cdef inline void* dir_get(const Tail* t, Dir* d, uint64_t i, size_t width) noexcept nogil:
    """Entry ``i`` of a Dir (chunk k holds entries [256 * (2^k - 1), 256 * (2^(k+1) - 1)))."""
    cdef uint64_t q = (i >> DIR_SHIFT) + 1
    cdef int k = 63 - rt_clz64(q)
    cdef uint64_t start = ((<uint64_t>1 << k) - 1) << DIR_SHIFT
    return t.map + rt_ld64(&d.chunk[k]) + (i - start) * width


cdef void* dir_put(Tail* t, Dir* d, uint64_t i, size_t width) noexcept nogil:
    """Room for entry ``i`` of a Dir, the next one (its chunk made when it starts one)."""
    cdef uint64_t q = (i >> DIR_SHIFT) + 1, off
    cdef int k = 63 - rt_clz64(q)
    cdef uint64_t start = ((<uint64_t>1 << k) - 1) << DIR_SHIFT
    if i == start:
        if k >= DIR_CHUNKS:
            t.err.code = E_FULL
            return NULL
        off = alloc(t, (<uint64_t>1 << (k + DIR_SHIFT)) * width, 8)
        if off == 0:
            return NULL
        rt_st64(&d.chunk[k], off)
    return t.map + d.chunk[k] + (i - start) * width


cdef inline uint64_t slice_cap(uint32_t s, int minlog, int maxlog) noexcept nogil:
    """Elements slice ``s`` of a slice list holds: 2^minlog, doubling up to 2^maxlog."""
    if s + minlog >= <uint32_t>maxlog:
        return <uint64_t>1 << maxlog
    return <uint64_t>1 << (s + minlog)


cdef inline uint64_t slice_start(uint32_t s, int minlog, int maxlog) noexcept nogil:
    """Index of the first element of slice ``s``."""
    cdef uint32_t steps = <uint32_t>(maxlog - minlog)
    if s <= steps:
        return (<uint64_t>1 << (s + minlog)) - (<uint64_t>1 << minlog)
    return ((<uint64_t>1 << maxlog) - (<uint64_t>1 << minlog)) + <uint64_t>(s - steps) * (<uint64_t>1 << maxlog)


cdef unsigned char* slice_room(Tail* t, uint64_t* head, uint64_t* tail, uint32_t* tail_s, uint64_t idx,
                               size_t width, int minlog, int maxlog) noexcept nogil:
    """Where element ``idx`` (the next) of a slice list goes, linking a new slice when the
    last one is full; NULL on failure. A slice is the offset of the next slice, then its
    elements."""
    cdef uint64_t start, off, cap
    if head[0] == 0:
        off = alloc(t, 8 + slice_cap(0, minlog, maxlog) * width, 8)
        if off == 0:
            return NULL
        tail[0] = off
        tail_s[0] = 0
        rt_st64(head, off)
        return t.map + off + 8
    start = slice_start(tail_s[0], minlog, maxlog)
    cap = slice_cap(tail_s[0], minlog, maxlog)
    if idx - start == cap:
        off = alloc(t, 8 + slice_cap(tail_s[0] + 1, minlog, maxlog) * width, 8)
        if off == 0:
            return NULL
        rt_st64(<uint64_t*>(t.map + tail[0]), off)
        tail[0] = off
        tail_s[0] += 1
        start += cap
    return t.map + tail[0] + 8 + (idx - start) * width


cdef inline unsigned char* clist_room(Tail* t, CList* c, size_t width, int minlog, int maxlog) noexcept nogil:
    return slice_room(t, &c.head, &c.tail, &c.tail_s, c.n, width, minlog, maxlog)


cdef int clist_add32(Tail* t, CList* c, uint32_t v) noexcept nogil:
    cdef unsigned char* q = clist_room(t, c, 4, COL_MINLOG, COL_MAXLOG)
    if q == NULL:
        return -1
    memcpy(q, &v, 4)
    rt_st32(&c.n, c.n + 1)
    return 0


cdef size_t clist_copy(const Tail* t, const CList* c, uint64_t n, size_t width,
                       unsigned char* out) noexcept nogil:
    """Copy the first ``n`` elements of a column slice list (n <= its count) to ``out``."""
    cdef uint64_t sl = rt_ld64(&c.head), i = 0, m, cap
    cdef uint32_t s = 0
    while i < n:
        cap = slice_cap(s, COL_MINLOG, COL_MAXLOG)
        m = n - i if n - i < cap else cap
        memcpy(out + i * width, t.map + sl + 8, m * width)
        i += m
        if i < n:
            sl = rt_ld64(<const uint64_t*>(t.map + sl))
            s += 1
    return <size_t>(n * width)


cdef uint64_t clist_count_below(const Tail* t, const CList* c, uint64_t limit) noexcept nogil:
    """How many of a uint32 slice list's (increasing) elements are below ``limit``."""
    cdef uint64_t n = rt_ld32(&c.n), sl, i = 0, m, cap, lo, hi, mid
    cdef uint32_t s = 0
    cdef const uint32_t* a
    if n == 0:
        return 0
    sl = rt_ld64(&c.head)
    while i < n:
        cap = slice_cap(s, COL_MINLOG, COL_MAXLOG)
        m = n - i if n - i < cap else cap
        a = <const uint32_t*>(t.map + sl + 8)
        if a[m - 1] < limit:
            i += m
            if i < n:
                sl = rt_ld64(<const uint64_t*>(t.map + sl))
                s += 1
            continue
        lo = 0
        hi = m
        while lo < hi:
            mid = (lo + hi) >> 1
            if a[mid] < limit:
                lo = mid + 1
            else:
                hi = mid
        return i + lo
    return n


# ---------------------------------------------------------------- terms


cdef inline TRec* term_rec(const Tail* t, uint64_t tid) noexcept nogil:
    """The record of term ``tid`` (a term id is its record's offset / 8)."""
    return <TRec*>(t.map + (tid << 3))


cdef inline uint64_t term_str(uint64_t tid) noexcept nogil:
    """The Bytes record of a STRING term's UTF-8: right after the term's record."""
    return (tid << 3) + sizeof(TRec)


cdef inline CRec* col_rec(const Tail* t, uint64_t cid) noexcept nogil:
    return <CRec*>dir_get(t, &t.h.cols, cid, sizeof(CRec))


cdef inline uint64_t str_hash(const Tail* t, const unsigned char* p, size_t n) noexcept nogil:
    return rt_siphash13(t.h.seed0, t.h.seed1, p, n)


cdef uint32_t find_term(const Tail* t, uint32_t cid, int tag, uint64_t key, const unsigned char* s,
                        size_t slen) noexcept nogil:
    """The term id of (column, value), NO_TERM if none; safe beside a writer (acquire loads)."""
    cdef uint64_t toff = rt_ld64(&t.h.table)
    cdef uint64_t mask = (<TableHead*>(t.map + toff)).mask
    cdef TSlot* slots = <TSlot*>(t.map + toff + sizeof(TableHead))
    cdef uint32_t cid1 = cid + 1, c, tid
    cdef uint64_t i = mix(key, cid1, t.h.seed0) & mask
    cdef TRec* r
    while True:
        c = rt_ld32(&slots[i].cid1)
        if c == 0:
            return NO_TERM
        if c == cid1 and slots[i].key == key:
            tid = slots[i].tid
            if tag != STRING_TAG:
                return tid
            if bytes_len(t, term_str(tid)) == slen and memcmp(bytes_data(t, term_str(tid)), s, slen) == 0:
                return tid
        i = (i + 1) & mask


cdef int grow_table(Tail* t) noexcept nogil:
    """Double the term table: a new copy, published when complete (readers of the old one
    find every term it had)."""
    cdef uint64_t old = t.h.table
    cdef uint64_t omask = (<TableHead*>(t.map + old)).mask
    cdef uint64_t nmask = omask * 2 + 1, j, i
    cdef uint64_t off = alloc(t, sizeof(TableHead) + (nmask + 1) * sizeof(TSlot), 64)
    cdef TSlot* os_
    cdef TSlot* ns
    if off == 0:
        return -1
    (<TableHead*>(t.map + off)).mask = nmask
    os_ = <TSlot*>(t.map + old + sizeof(TableHead))
    ns = <TSlot*>(t.map + off + sizeof(TableHead))
    for i in range(omask + 1):
        if os_[i].cid1 == 0:
            continue
        j = mix(os_[i].key, os_[i].cid1, t.h.seed0) & nmask
        while ns[j].cid1 != 0:
            j = (j + 1) & nmask
        ns[j] = os_[i]
    rt_st64(&t.h.table, off)
    return 0


cdef int64_t add_term(Tail* t, uint32_t cid, int tag, uint64_t key, const unsigned char* s,
                      size_t slen) noexcept nogil:
    """The term id of (column, value), made if new; -1 on failure (t.err says why)."""
    cdef uint64_t toff = t.h.table
    cdef uint64_t mask = (<TableHead*>(t.map + toff)).mask
    cdef TSlot* slots = <TSlot*>(t.map + toff + sizeof(TableHead))
    cdef uint32_t cid1 = cid + 1, tid
    cdef uint64_t i = mix(key, cid1, t.h.seed0) & mask, n, off
    cdef uint32_t len32 = <uint32_t>slen
    cdef TRec* r
    cdef CRec* c
    while True:
        if slots[i].cid1 == 0:
            break
        if slots[i].cid1 == cid1 and slots[i].key == key:
            tid = slots[i].tid
            if tag != STRING_TAG:
                return tid
            if bytes_len(t, term_str(tid)) == slen and memcmp(bytes_data(t, term_str(tid)), s, slen) == 0:
                return tid
        i = (i + 1) & mask
    n = t.h.n_terms
    if n >= MAX_ROWS:
        t.err.code = E_FULL
        return -1
    off = alloc(t, sizeof(TRec) + (4 + slen if tag == STRING_TAG else 0), 8)
    if off == 0:
        return -1
    if (off >> 3) > MAX_ROWS:
        t.err.code = E_FULL
        return -1
    tid = <uint32_t>(off >> 3)
    r = term_rec(t, tid)
    r.cid = cid
    r.key = key
    if tag == STRING_TAG:
        memcpy(t.map + off + sizeof(TRec), &len32, 4)
        memcpy(t.map + off + sizeof(TRec) + 4, s, slen)
    c = col_rec(t, cid)
    if clist_add32(t, &c.tids, tid) < 0:
        return -1
    slots[i].key = key
    slots[i].tid = tid
    rt_st32(&slots[i].cid1, cid1)
    rt_st64(&t.h.n_terms, n + 1)
    if (n + 1) * 8 > (mask + 1) * 5 and grow_table(t) < 0:
        return -1
    return <int64_t>tid


cdef int post(Tail* t, TRec* r, uint32_t off) noexcept nogil:
    """Add row ``off`` (>= every row ``r`` has) to a term's postings, once."""
    cdef uint32_t n = r.n
    cdef unsigned char* q
    if n and r.last == off:
        return 0
    if n < INLINE_POSTINGS:
        r.inl[n] = off
    else:
        q = slice_room(t, &r.head, &r.tail, &r.tail_s, n - INLINE_POSTINGS, 4, POST_MINLOG, POST_MAXLOG)
        if q == NULL:
            return -1
        memcpy(q, &off, 4)
    r.last = off
    rt_st32(&r.n, n + 1)
    return 0


cdef size_t postings_below(const Tail* t, const TRec* r, uint64_t limit, uint32_t n, uint32_t* out) noexcept nogil:
    """Copy the first ``n`` postings of a term (``n`` at most its count, loaded by the caller:
    it sizes ``out``) that are below ``limit`` to ``out``, in order."""
    cdef uint32_t k = 0, s = 0, v
    cdef uint64_t sl, m, cap, j
    cdef const uint32_t* a
    while k < n and k < INLINE_POSTINGS:
        v = r.inl[k]
        if v >= limit:
            return k
        out[k] = v
        k += 1
    if k == n:
        return k
    sl = rt_ld64(&r.head)
    while k < n:
        cap = slice_cap(s, POST_MINLOG, POST_MAXLOG)
        m = n - k if n - k < cap else cap
        a = <const uint32_t*>(t.map + sl + 8)
        for j in range(m):
            v = a[j]
            if v >= limit:
                return k
            out[k] = v
            k += 1
        if k < n:
            sl = rt_ld64(<const uint64_t*>(t.map + sl))
            s += 1
    return k


# ---------------------------------------------------------------- the path tree (writer only)


cdef inline uint64_t node_hash(const Tail* t, uint32_t parent, const unsigned char* key, size_t n) noexcept nogil:
    return rt_siphash13(t.h.seed1 ^ (<uint64_t>parent * RT_GOLDEN), t.h.seed0, key, n)


cdef unsigned char* arena_room(Arena* a, size_t need, size_t chunk) noexcept nogil:
    """At least ``need`` free bytes of the arena, not yet taken (a new chunk of at least
    ``chunk`` bytes when the last one has too few); NULL when out of memory."""
    cdef size_t size, cap
    cdef void* q
    if need > a.free_len:
        if a.n_chunks == a.cap_chunks:
            cap = a.cap_chunks * 2 if a.cap_chunks else 16
            q = realloc(a.chunks, cap * sizeof(unsigned char*))
            if q == NULL:
                return NULL
            a.chunks = <unsigned char**>q
            a.cap_chunks = cap
        size = need if need > chunk else chunk
        q = malloc(size)
        if q == NULL:
            return NULL
        a.chunks[a.n_chunks] = <unsigned char*>q
        a.n_chunks += 1
        a.free_at = <unsigned char*>q
        a.free_len = size
        a.held += size
    return a.free_at


cdef inline void arena_take(Arena* a, size_t n) noexcept nogil:
    """Take the first ``n`` bytes arena_room returned."""
    a.free_at += n
    a.free_len -= n


cdef void arena_free(Arena* a) noexcept nogil:
    cdef size_t i
    for i in range(a.n_chunks):
        free(a.chunks[i])
    free(a.chunks)
    memset(a, 0, sizeof(Arena))


cdef unsigned char* private_room(Tail* t, size_t need) noexcept nogil:
    """``need`` bytes of the private arena (never moved); NULL when out of memory."""
    cdef unsigned char* q = arena_room(&t.names, need, PRIVATE_CHUNK)
    if q != NULL:
        arena_take(&t.names, need)
    return q


cdef int64_t new_node(Tail* t, uint32_t parent, const unsigned char* key, size_t n, uint64_t h) noexcept nogil:
    """A new path node below ``parent``; its id, -1 when out of memory."""
    cdef uint32_t id = t.n_nodes, cap
    cdef Node* nd
    cdef Node* par
    cdef unsigned char* mem
    cdef size_t plen, elen, i, nz = 0
    cdef unsigned char* q
    cdef void* p
    cdef uint64_t j, slots, mask, nmask
    cdef uint32_t* table
    if id == t.cap_nodes:
        cap = t.cap_nodes * 2 if t.cap_nodes else 64
        p = realloc(t.nodes, cap * sizeof(Node))
        if p == NULL:
            return -1
        t.nodes = <Node*>p
        t.private_bytes += (cap - t.cap_nodes) * sizeof(Node)
        t.cap_nodes = cap
    if (<uint64_t>id + 1) * 2 > t.nmask + 1:  # the path table stays at most half full
        nmask = t.nmask * 2 + 1
        table = <uint32_t*>malloc((nmask + 1) * sizeof(uint32_t))
        if table == NULL:
            return -1
        memset(table, 0, (nmask + 1) * sizeof(uint32_t))
        for i in range(1, id):
            j = t.nodes[i].hash & nmask
            while table[j] != 0:
                j = (j + 1) & nmask
            table[j] = <uint32_t>i + 1
        free(t.ntable)
        t.private_bytes += (nmask - t.nmask) * sizeof(uint32_t)
        t.ntable = table
        t.nmask = nmask
    par = &t.nodes[parent]
    for i in range(n):
        if key[i] == 0:
            nz += 1
    # encoded path: the parent's without its end (and a separator), the escaped name, the end
    plen = par.enc_len if parent != 0 else 0
    elen = plen + n + nz + 2
    mem = private_room(t, n + elen + 1)
    if mem == NULL:
        return -1
    nd = &t.nodes[id]
    memset(nd, 0, sizeof(Node))
    memcpy(mem, key, n)
    nd.key = mem
    nd.key_len = <uint32_t>n
    q = mem + n
    nd.enc = q
    if parent != 0:
        memcpy(q, par.enc, par.enc_len - 2)
        q += par.enc_len - 2
        q[0] = 0
        q[1] = 1
        q += 2
    for i in range(n):
        q[0] = key[i]
        q += 1
        if key[i] == 0:
            q[0] = 0xFF
            q += 1
    q[0] = 0
    q[1] = 0
    nd.enc_len = <uint32_t>elen
    nd.parent = parent
    nd.hash = h
    nd.first_child = NO_NODE
    nd.next_sib = NO_NODE
    nd.is_event_time = parent == 0 and n == 11 and memcmp(key, b"_event_time", 11) == 0
    j = h & t.nmask
    while t.ntable[j] != 0:
        j = (j + 1) & t.nmask
    t.ntable[j] = id + 1
    t.n_nodes = id + 1
    return id


cdef inline int64_t child_node(Tail* t, uint32_t parent, uint32_t predicted, const unsigned char* key,
                               size_t n) noexcept nogil:
    """The node of member ``key`` below ``parent`` (made if new): the predicted node when its
    name is ``key``, else the path table's."""
    cdef Node* nd
    cdef uint64_t h, j
    cdef uint32_t e
    if predicted != NO_NODE:
        nd = &t.nodes[predicted]
        if nd.parent == parent and nd.key_len == n and memcmp(nd.key, key, n) == 0:
            return predicted
    h = node_hash(t, parent, key, n)
    j = h & t.nmask
    while True:
        e = t.ntable[j]
        if e == 0:
            return new_node(t, parent, key, n, h)
        nd = &t.nodes[e - 1]
        if nd.hash == h and nd.parent == parent and nd.key_len == n and memcmp(nd.key, key, n) == 0:
            return e - 1
        j = (j + 1) & t.nmask


cdef int64_t column_of(Tail* t, uint32_t node, int tag) noexcept nogil:
    """The column id of (path node, type tag), made if new; -1 on failure."""
    cdef uint32_t c = t.nodes[node].cid1[tag]
    cdef uint64_t cid, k
    cdef CRec* r
    cdef unsigned char* q
    cdef Node* nd
    if c:
        return c - 1
    cid = t.h.n_cols
    if cid >= MAX_ROWS:
        t.err.code = E_FULL
        return -1
    nd = &t.nodes[node]
    k = alloc(t, 4 + nd.enc_len + 1, 4)
    if k == 0:
        return -1
    (<uint32_t*>(t.map + k))[0] = nd.enc_len + 1
    q = t.map + k + 4
    memcpy(q, nd.enc, nd.enc_len)
    q[nd.enc_len] = <unsigned char>tag
    r = <CRec*>dir_put(t, &t.h.cols, cid, sizeof(CRec))
    if r == NULL:
        return -1
    r.key = k
    r.tag = <uint32_t>tag
    rt_st64(&t.h.n_cols, cid + 1)
    t.nodes[node].cid1[tag] = <uint32_t>cid + 1
    return <int64_t>cid


# ---------------------------------------------------------------- the walk: JSON bytes to terms


cdef inline bint is_ws(unsigned char c) noexcept nogil:
    return c == 0x20 or c == 0x0A or c == 0x0D or c == 0x09


cdef inline bint is_digit(unsigned char c) noexcept nogil:
    return 0x30 <= c <= 0x39


cdef inline int hex_val(unsigned char c) noexcept nogil:
    if 0x30 <= c <= 0x39:
        return c - 0x30
    if 0x61 <= c <= 0x66:
        return c - 0x61 + 10
    if 0x41 <= c <= 0x46:
        return c - 0x41 + 10
    return -1


cdef int fail(Tail* t, int code, size_t pos, uint64_t extra, size_t depth, bint with_path) noexcept nogil:
    """Record the walked document's error (the path from the container stack); returns -1."""
    cdef size_t i
    cdef Frame* f
    t.err.code = code
    t.err.pos = pos
    t.err.extra = extra
    t.err.depth = 0
    if with_path:
        for i in range(depth):
            f = &t.frames[i]
            if f.is_array:
                t.err.path[t.err.depth] = INDEX_BIT | f.index
                t.err.depth += 1
            elif f.member != NO_NODE:
                t.err.path[t.err.depth] = f.member
                t.err.depth += 1
    return -1


cdef inline int utf8_len(const unsigned char* p, size_t i, size_t n) noexcept nogil:
    """Length of the valid UTF-8 sequence (RFC 3629) starting with p[i] >= 0x80; 0 if invalid."""
    cdef unsigned char c = p[i], lo = 0x80, hi = 0xBF
    cdef int k, need
    if c < 0xC2 or c > 0xF4:
        return 0
    if c < 0xE0:
        need = 2
    elif c < 0xF0:
        need = 3
        if c == 0xE0:
            lo = 0xA0
        elif c == 0xED:
            hi = 0x9F
    else:
        need = 4
        if c == 0xF0:
            lo = 0x90
        elif c == 0xF4:
            hi = 0x8F
    if i + <size_t>need > n or p[i + 1] < lo or p[i + 1] > hi:
        return 0
    for k in range(2, need):
        if p[i + k] < 0x80 or p[i + k] > 0xBF:
            return 0
    return need


cdef inline int scratch_reserve(Tail* t, size_t extra) noexcept nogil:
    cdef size_t cap
    cdef void* q
    if t.n_scratch + extra <= t.cap_scratch:
        return 0
    cap = t.cap_scratch * 2 if t.cap_scratch else 4096
    while cap < t.n_scratch + extra:
        cap *= 2
    q = realloc(t.scratch, cap)
    if q == NULL:
        return -1
    t.private_bytes += cap - t.cap_scratch
    t.scratch = <unsigned char*>q
    t.cap_scratch = cap
    return 0


cdef inline size_t put_utf8(unsigned char* q, uint32_t c) noexcept nogil:
    if c < 0x80:
        q[0] = <unsigned char>c
        return 1
    if c < 0x800:
        q[0] = 0xC0 | (c >> 6)
        q[1] = 0x80 | (c & 0x3F)
        return 2
    if c < 0x10000:
        q[0] = 0xE0 | (c >> 12)
        q[1] = 0x80 | ((c >> 6) & 0x3F)
        q[2] = 0x80 | (c & 0x3F)
        return 3
    q[0] = 0xF0 | (c >> 18)
    q[1] = 0x80 | ((c >> 12) & 0x3F)
    q[2] = 0x80 | ((c >> 6) & 0x3F)
    q[3] = 0x80 | (c & 0x3F)
    return 4


cdef inline int32_t hex4(const unsigned char* p, size_t i, size_t n) noexcept nogil:
    """The value of the 4 hex digits at p[i:i+4]; -1 if any is not hex, -2 if the input ends."""
    cdef int32_t v = 0, d
    cdef size_t k
    for k in range(4):
        if i + k >= n:
            return -2
        d = hex_val(p[i + k])
        if d < 0:
            return -1
        v = (v << 4) | d
    return v


cdef int read_string(Tail* t, size_t i, size_t* end, uint64_t* s_at, uint32_t* s_len,
                     uint8_t* in_scratch, bint is_key, size_t depth) noexcept nogil:
    """Read the string whose first byte (after the quote) is at ``i``: validated UTF-8 with
    escapes decoded, where it is (the input itself when it has no escape, else the scratch);
    ``end``: the byte after the closing quote. -1 on error (recorded)."""
    cdef const unsigned char* p = t.doc
    cdef size_t n = t.doc_len, start = i, k, out = 0
    cdef bint copying = False
    cdef unsigned char c
    cdef int len8
    cdef int32_t u, lo
    cdef uint32_t cp
    while True:
        k = rt_str_stop(p, i, n)
        if copying and k > i:
            if scratch_reserve(t, k - i) < 0:
                t.err.code = E_OS
                t.err.extra = 12
                return -1
            memcpy(t.scratch + t.n_scratch, p + i, k - i)
            t.n_scratch += k - i
        i = k
        if i >= n:
            return fail(t, E_EOF, n, 0, 0, False)
        c = p[i]
        if c == 0x22:
            end[0] = i + 1
            if copying:
                s_at[0] = out
                s_len[0] = <uint32_t>(t.n_scratch - out)
                in_scratch[0] = 1
            else:
                s_at[0] = start
                s_len[0] = <uint32_t>(i - start)
                in_scratch[0] = 0
            return 0
        if c < 0x20:
            return fail(t, E_CONTROL, i, 0, 0, False)
        if c >= 0x80:
            len8 = utf8_len(p, i, n)
            if len8 == 0:
                return fail(t, E_UTF8, i, 0, 0, False)
            if copying:
                if scratch_reserve(t, <size_t>len8) < 0:
                    t.err.code = E_OS
                    t.err.extra = 12
                    return -1
                memcpy(t.scratch + t.n_scratch, p + i, <size_t>len8)
                t.n_scratch += <size_t>len8
            i += <size_t>len8
            continue
        # a backslash: from here on the string is decoded into the scratch
        if not copying:
            if scratch_reserve(t, i - start + 8) < 0:
                t.err.code = E_OS
                t.err.extra = 12
                return -1
            out = t.n_scratch
            memcpy(t.scratch + out, p + start, i - start)
            t.n_scratch += i - start
            copying = True
        if i + 1 >= n:
            return fail(t, E_EOF, n, 0, 0, False)
        c = p[i + 1]
        if scratch_reserve(t, 4) < 0:
            t.err.code = E_OS
            t.err.extra = 12
            return -1
        if c == 0x22 or c == 0x5C or c == 0x2F:
            t.scratch[t.n_scratch] = c
        elif c == 0x62:
            t.scratch[t.n_scratch] = 0x08
        elif c == 0x66:
            t.scratch[t.n_scratch] = 0x0C
        elif c == 0x6E:
            t.scratch[t.n_scratch] = 0x0A
        elif c == 0x72:
            t.scratch[t.n_scratch] = 0x0D
        elif c == 0x74:
            t.scratch[t.n_scratch] = 0x09
        elif c == 0x75:
            u = hex4(p, i + 2, n)
            if u == -2:
                return fail(t, E_EOF, n, 0, 0, False)
            if u < 0:
                return fail(t, E_UESCAPE, i, 0, 0, False)
            if 0xD800 <= u <= 0xDBFF:
                lo = -1
                if i + 7 < n and p[i + 6] == 0x5C and p[i + 7] == 0x75:
                    lo = hex4(p, i + 8, n)
                if lo < 0xDC00 or lo > 0xDFFF:
                    return fail(t, E_KEY_SURROGATE if is_key else E_SURROGATE, i, 0,
                                depth - 1 if is_key else depth, True)
                cp = 0x10000 + ((<uint32_t>(u - 0xD800)) << 10) + <uint32_t>(lo - 0xDC00)
                t.n_scratch += put_utf8(t.scratch + t.n_scratch, cp)
                i += 12
                continue
            if 0xDC00 <= u <= 0xDFFF:
                return fail(t, E_KEY_SURROGATE if is_key else E_SURROGATE, i, 0,
                            depth - 1 if is_key else depth, True)
            t.n_scratch += put_utf8(t.scratch + t.n_scratch, <uint32_t>u)
            i += 6
            continue
        else:
            return fail(t, E_ESCAPE, i, 0, 0, False)
        t.n_scratch += 1
        i += 2


cdef inline Pend* pend_push(Tail* t) noexcept nogil:
    cdef size_t cap
    cdef void* q
    if t.n_pend == t.cap_pend:
        cap = t.cap_pend * 2 if t.cap_pend else 256
        q = realloc(t.pend, cap * sizeof(Pend))
        if q == NULL:
            t.err.code = E_OS
            t.err.extra = 12
            return NULL
        t.private_bytes += (cap - t.cap_pend) * sizeof(Pend)
        t.pend = <Pend*>q
        t.cap_pend = cap
    t.n_pend += 1
    return &t.pend[t.n_pend - 1]


cdef int queue(Tail* t, uint32_t node, int tag, uint64_t key, int what, uint64_t s_at, uint32_t s_len,
               uint8_t in_scratch) noexcept nogil:
    """Queue a term (and/or a column value) of the walked document, prefetching its slot."""
    cdef int64_t cid = column_of(t, node, tag)
    cdef Pend* e
    cdef uint64_t toff
    if cid < 0:
        return -1
    e = pend_push(t)
    if e == NULL:
        return -1
    e.key = key
    e.cid = <uint32_t>cid
    e.tag = <uint8_t>tag
    e.what = <uint8_t>what
    e.s_at = s_at
    e.s_len = s_len
    e.in_scratch = in_scratch
    if what != PEND_COL:
        toff = t.h.table
        rt_prefetch(t.map + toff + sizeof(TableHead)
                    + (mix(key, <uint32_t>cid + 1, t.h.seed0) & (<TableHead*>(t.map + toff)).mask) * sizeof(TSlot))
    return 0


cdef int read_number(Tail* t, size_t i, size_t* end, int* tag_out, uint64_t* key, size_t depth) noexcept nogil:
    """Read the number at ``i``: its key and tag (INT, or FLOAT); -1 on error (recorded)."""
    cdef const unsigned char* p = t.doc
    cdef size_t n = t.doc_len, start = i, int_start, int_end, frac_start = 0, frac_end = 0, k
    cdef bint neg = False, is_float = False, exp_neg = False
    cdef uint64_t m = 0, v
    cdef int64_t e10 = 0, ex = 0
    cdef int sig = 0
    cdef bint exact = True
    cdef double d
    cdef char small[64]
    cdef char* buf
    if p[i] == 0x2D:
        neg = True
        i += 1
        if i >= n or not is_digit(p[i]):
            return fail(t, E_NUMBER, i, 0, 0, False)
    int_start = i
    if p[i] == 0x30:
        i += 1
    else:
        while i < n and is_digit(p[i]):
            i += 1
    int_end = i
    if i < n and p[i] == 0x2E:
        i += 1
        if i >= n or not is_digit(p[i]):
            return fail(t, E_NUMBER, i, 0, 0, False)
        frac_start = i
        while i < n and is_digit(p[i]):
            i += 1
        frac_end = i
        is_float = True
    if i < n and (p[i] == 0x65 or p[i] == 0x45):
        i += 1
        if i < n and (p[i] == 0x2B or p[i] == 0x2D):
            exp_neg = p[i] == 0x2D
            i += 1
        if i >= n or not is_digit(p[i]):
            return fail(t, E_NUMBER, i, 0, 0, False)
        while i < n and is_digit(p[i]):
            if ex < 100000:
                ex = ex * 10 + (p[i] - 0x30)
            i += 1
        is_float = True
    end[0] = i
    if not is_float:
        if int_end - int_start > 19:
            return fail(t, E_INT_RANGE, start, 0, depth, True)
        v = 0
        for k in range(int_start, int_end):
            v = v * 10 + (p[k] - 0x30)
        if neg:
            if v > RT_SIGN:
                return fail(t, E_INT_RANGE, start, 0, depth, True)
            key[0] = int_key(<int64_t>(0 - v))
        else:
            if v >= RT_SIGN:
                return fail(t, E_INT_RANGE, start, 0, depth, True)
            key[0] = int_key(<int64_t>v)
        tag_out[0] = INT_TAG
        return 0
    # fast path: at most 19 significant digits, a mantissa exact in a double, |power| <= 22
    for k in range(int_start, int_end):
        if sig == 0 and p[k] == 0x30:
            continue
        if sig < 19:
            m = m * 10 + (p[k] - 0x30)
            sig += 1
        else:
            exact = False
    for k in range(frac_start, frac_end):
        if sig == 0 and p[k] == 0x30:
            e10 -= 1
            continue
        if sig < 19:
            m = m * 10 + (p[k] - 0x30)
            sig += 1
            e10 -= 1
        else:
            exact = False
    e10 += -ex if exp_neg else ex
    if exact and m <= (<uint64_t>1 << 53) and -22 <= e10 <= 22:
        d = <double>m
        if e10 >= 0:
            d = d * POW10[e10]
        else:
            d = d / POW10[-e10]
        if m == 0:
            d = 0.0
    else:
        k = i - start
        buf = small
        if k + 1 > sizeof(small):
            buf = <char*>malloc(k + 1)
            if buf == NULL:
                t.err.code = E_OS
                t.err.extra = 12
                return -1
        memcpy(buf, p + start, k)
        buf[k] = 0
        d = rt_strtod(buf)
        if buf != small:
            free(buf)
        if d < 0:
            d = -d
    if not isfinite(d):
        return fail(t, E_NONFINITE, start, neg, depth, True)
    if neg:
        d = -d
    key[0] = float_key(d)
    tag_out[0] = FLOAT_TAG
    return 0


cdef int64_t compact_text(Tail* t, size_t a, size_t b) noexcept nogil:
    """The input's bytes [a, b) without whitespace outside strings, copied to the scratch;
    its scratch offset, -1 when out of memory."""
    cdef const unsigned char* p = t.doc
    cdef size_t i, out
    cdef unsigned char c
    cdef bint in_str = False
    if scratch_reserve(t, b - a) < 0:
        t.err.code = E_OS
        t.err.extra = 12
        return -1
    out = t.n_scratch
    i = a
    while i < b:
        c = p[i]
        if in_str:
            t.scratch[t.n_scratch] = c
            t.n_scratch += 1
            if c == 0x5C:
                t.scratch[t.n_scratch] = p[i + 1]
                t.n_scratch += 1
                i += 1
            elif c == 0x22:
                in_str = False
        elif not is_ws(c):
            t.scratch[t.n_scratch] = c
            t.n_scratch += 1
            if c == 0x22:
                in_str = True
        i += 1
    return <int64_t>out


cdef inline int frames_reserve(Tail* t, size_t depth) noexcept nogil:
    cdef size_t cap
    cdef void* q
    cdef void* r
    if depth < t.cap_frames:
        return 0
    cap = t.cap_frames * 2 if t.cap_frames else 64
    while cap <= depth:
        cap *= 2
    q = realloc(t.frames, cap * sizeof(Frame))
    if q == NULL:
        t.err.code = E_OS
        t.err.extra = 12
        return -1
    t.frames = <Frame*>q
    r = realloc(t.err.path, cap * sizeof(uint32_t))
    if r == NULL:
        t.err.code = E_OS
        t.err.extra = 12
        return -1
    t.err.path = <uint32_t*>r
    t.private_bytes += (cap - t.cap_frames) * (sizeof(Frame) + sizeof(uint32_t))
    t.cap_frames = cap
    return 0


cdef enum:
    S_OBJ_FIRST = 0
    S_OBJ_NEXT = 1
    S_ARR_FIRST = 2
    S_ARR_NEXT = 3
    S_VALUE = 4
    S_AFTER = 5


cdef int walk(Tail* t) noexcept nogil:
    """Scan the document t.doc, validating it and queueing its terms and column values
    (t.pend), in one pass; -1 on the first error in document order (recorded in t.err)."""
    cdef const unsigned char* p = t.doc
    cdef size_t n = t.doc_len, i = 0, depth = 0, ws = 0, j
    cdef Frame* f
    cdef Frame* g
    cdef int state, tag
    cdef unsigned char c
    cdef uint32_t node = 0, len32 = 0, pred
    cdef int64_t child, off
    cdef uint64_t s_at = 0, key = 0
    cdef uint8_t in_scratch = 0
    cdef bint in_array = False
    cdef Node* nd
    t.n_pend = 0
    t.n_scratch = 0
    t.err.code = 0
    while i < n and is_ws(p[i]):
        i += 1
    if i >= n:
        return fail(t, E_EMPTY, 0, 0, 0, False)
    c = p[i]
    if c != 0x7B:
        if c == 0x5B or c == 0x22 or c == 0x2D or is_digit(c) or c == 0x74 or c == 0x66 or c == 0x6E:
            return fail(t, E_NOT_OBJECT, i, c, 0, False)
        if c == 0x4E or c == 0x49:
            return fail(t, E_NAN, i, 0, 0, False)
        return fail(t, E_CHAR, i, c, 0, False)
    if t.max_depth < 1:
        return fail(t, E_DEPTH, i, 0, 0, True)
    if frames_reserve(t, 1) < 0:
        return -1
    f = &t.frames[0]
    t.serial += 1
    f.serial = t.serial
    f.node = 0
    f.member = NO_NODE
    f.prev = NO_NODE
    f.is_array = 0
    f.in_array = 0
    f.col_array = 0
    depth = 1
    i += 1
    state = S_OBJ_FIRST
    while True:
        if state == S_OBJ_FIRST or state == S_OBJ_NEXT:
            f = &t.frames[depth - 1]
            while i < n and is_ws(p[i]):
                i += 1
                ws += 1
            if i >= n:
                return fail(t, E_EOF, n, 0, 0, False)
            c = p[i]
            if state == S_OBJ_NEXT:
                if c == 0x2C:
                    i += 1
                    while i < n and is_ws(p[i]):
                        i += 1
                        ws += 1
                    if i >= n:
                        return fail(t, E_EOF, n, 0, 0, False)
                    if p[i] != 0x22:
                        return fail(t, E_KEY_EXPECTED, i, 0, 0, False)
                elif c == 0x7D:
                    i += 1
                    depth -= 1
                    state = S_AFTER
                    continue
                else:
                    return fail(t, E_OBJ_NEXT, i, 0, 0, False)
            elif c == 0x7D:
                i += 1
                depth -= 1
                state = S_AFTER
                continue
            elif c != 0x22:
                return fail(t, E_KEY_EXPECTED, i, 0, 0, False)
            # a member's key
            f.member = NO_NODE
            if read_string(t, i + 1, &j, &s_at, &len32, &in_scratch, True, depth) < 0:
                return -1
            i = j
            pred = t.nodes[f.node].first_child if f.prev == NO_NODE else t.nodes[f.prev].next_sib
            child = child_node(t, f.node, pred, (t.scratch if in_scratch else p) + s_at, len32)
            if child < 0:
                t.err.code = E_OS
                t.err.extra = 12
                return -1
            if in_scratch:
                t.n_scratch = s_at  # the key is the node's now
            f = &t.frames[depth - 1]
            nd = &t.nodes[child]
            if nd.stamp == f.serial:
                f.member = <uint32_t>child
                return fail(t, E_DUPKEY, i, 0, depth, True)
            nd.stamp = f.serial
            f.member = <uint32_t>child
            if f.prev == NO_NODE:
                t.nodes[f.node].first_child = <uint32_t>child
            else:
                t.nodes[f.prev].next_sib = <uint32_t>child
            f.prev = <uint32_t>child
            while i < n and is_ws(p[i]):
                i += 1
                ws += 1
            if i >= n:
                return fail(t, E_EOF, n, 0, 0, False)
            if p[i] != 0x3A:
                return fail(t, E_COLON, i, 0, 0, False)
            i += 1
            while i < n and is_ws(p[i]):
                i += 1
                ws += 1
            node = <uint32_t>child
            in_array = f.in_array
            state = S_VALUE
        elif state == S_ARR_FIRST or state == S_ARR_NEXT:
            f = &t.frames[depth - 1]
            while i < n and is_ws(p[i]):
                i += 1
                ws += 1
            if i >= n:
                return fail(t, E_EOF, n, 0, 0, False)
            c = p[i]
            if state == S_ARR_FIRST:
                if c == 0x5D:
                    i += 1
                else:
                    node = f.node
                    in_array = True
                    state = S_VALUE
                    continue
            elif c == 0x2C:
                i += 1
                while i < n and is_ws(p[i]):
                    i += 1
                    ws += 1
                f.index += 1
                node = f.node
                in_array = True
                state = S_VALUE
                continue
            elif c == 0x5D:
                i += 1
            else:
                return fail(t, E_ARR_NEXT, i, 0, 0, False)
            # the array ends (i is past its ']')
            if f.col_array:
                if ws == f.ws:
                    if queue(t, f.node, ARRAY_TAG, 0, PEND_COL, f.start, <uint32_t>(i - f.start), 0) < 0:
                        return -1
                else:
                    off = compact_text(t, f.start, i)
                    if off < 0:
                        return -1
                    if queue(t, f.node, ARRAY_TAG, 0, PEND_COL, <uint64_t>off,
                             <uint32_t>(t.n_scratch - <size_t>off), 1) < 0:
                        return -1
            depth -= 1
            state = S_AFTER
        elif state == S_VALUE:
            if i >= n:
                return fail(t, E_EOF, n, 0, 0, False)
            c = p[i]
            if c == 0x22:
                if read_string(t, i + 1, &j, &s_at, &len32, &in_scratch, False, depth) < 0:
                    return -1
                i = j
                key = str_hash(t, (t.scratch if in_scratch else p) + s_at, len32)
                if queue(t, node, STRING_TAG, key, PEND_TERM if in_array else PEND_TERM_COL,
                         s_at, len32, in_scratch) < 0:
                    return -1
            elif c == 0x7B or c == 0x5B:
                if <Py_ssize_t>depth + 1 > t.max_depth:
                    return fail(t, E_DEPTH, i, 0, depth, True)
                if queue(t, node, OBJECT_TAG if c == 0x7B else ARRAY_TAG, 0, PEND_TERM, 0, 0, 0) < 0:
                    return -1
                if frames_reserve(t, depth + 1) < 0:
                    return -1
                g = &t.frames[depth]
                g.node = node
                g.member = NO_NODE
                g.prev = NO_NODE
                g.index = 0
                g.in_array = in_array
                if c == 0x7B:
                    t.serial += 1
                    g.serial = t.serial
                    g.is_array = 0
                    g.col_array = 0
                    state = S_OBJ_FIRST
                else:
                    g.is_array = 1
                    g.in_array = 1
                    g.col_array = not in_array
                    g.start = i
                    g.ws = ws
                    state = S_ARR_FIRST
                depth += 1
                i += 1
                continue
            elif c == 0x2D or is_digit(c):
                if c == 0x2D and i + 1 < n and p[i + 1] == 0x49:
                    return fail(t, E_NAN, i, 0, 0, False)
                if read_number(t, i, &j, &tag, &key, depth) < 0:
                    return -1
                i = j
                if tag == INT_TAG and depth == 1 and t.nodes[node].is_event_time:
                    tag = TIMESTAMP_TAG
                if queue(t, node, tag, key, PEND_TERM if in_array else PEND_TERM_COL, 0, 0, 0) < 0:
                    return -1
            elif c == 0x74:
                if i + 4 > n or memcmp(p + i, b"true", 4) != 0:
                    return fail(t, E_CHAR, i, c, 0, False)
                i += 4
                if queue(t, node, BOOL_TAG, 1, PEND_TERM if in_array else PEND_TERM_COL, 0, 0, 0) < 0:
                    return -1
            elif c == 0x66:
                if i + 5 > n or memcmp(p + i, b"false", 5) != 0:
                    return fail(t, E_CHAR, i, c, 0, False)
                i += 5
                if queue(t, node, BOOL_TAG, 0, PEND_TERM if in_array else PEND_TERM_COL, 0, 0, 0) < 0:
                    return -1
            elif c == 0x6E:
                if i + 4 > n or memcmp(p + i, b"null", 4) != 0:
                    return fail(t, E_CHAR, i, c, 0, False)
                i += 4
                if queue(t, node, NULL_TAG, 0, PEND_TERM if in_array else PEND_TERM_COL, 0, 0, 0) < 0:
                    return -1
            elif c == 0x4E or c == 0x49:
                return fail(t, E_NAN, i, 0, 0, False)
            else:
                return fail(t, E_CHAR, i, c, 0, False)
            state = S_AFTER
        else:  # S_AFTER: a value (or container) ended; depth is its container's
            if depth == 0:
                while i < n and is_ws(p[i]):
                    i += 1
                if i < n:
                    return fail(t, E_TRAILING, i, 0, 0, False)
                return 0
            state = S_ARR_NEXT if t.frames[depth - 1].is_array else S_OBJ_NEXT


# ---------------------------------------------------------------- commit: queued terms into the index


cdef int add_value(Tail* t, CRec* c, int tag, uint32_t off, uint64_t key, uint64_t val) noexcept nogil:
    """Append row ``off``'s value to a column store (the values first, then the offset that
    makes them visible)."""
    cdef unsigned char* q
    cdef int64_t x
    cdef double d
    cdef uint8_t b
    cdef uint32_t u
    if tag == INT_TAG or tag == TIMESTAMP_TAG:
        q = clist_room(t, &c.vals, 8, COL_MINLOG, COL_MAXLOG)
        if q == NULL:
            return -1
        x = key_int(key)
        memcpy(q, &x, 8)
        rt_st32(&c.vals.n, c.vals.n + 1)
    elif tag == FLOAT_TAG:
        q = clist_room(t, &c.vals, 8, COL_MINLOG, COL_MAXLOG)
        if q == NULL:
            return -1
        d = key_float(key)
        memcpy(q, &d, 8)
        rt_st32(&c.vals.n, c.vals.n + 1)
    elif tag == BOOL_TAG:
        q = clist_room(t, &c.vals, 1, COL_MINLOG, COL_MAXLOG)
        if q == NULL:
            return -1
        b = <uint8_t>key
        q[0] = b
        rt_st32(&c.vals.n, c.vals.n + 1)
    elif tag == STRING_TAG:
        q = clist_room(t, &c.vals, 4, COL_MINLOG, COL_MAXLOG)
        if q == NULL:
            return -1
        u = <uint32_t>val
        memcpy(q, &u, 4)
        rt_st32(&c.vals.n, c.vals.n + 1)
    elif tag == ARRAY_TAG:
        q = clist_room(t, &c.vals, 8, COL_MINLOG, COL_MAXLOG)
        if q == NULL:
            return -1
        memcpy(q, &val, 8)
        rt_st32(&c.vals.n, c.vals.n + 1)
    return clist_add32(t, &c.offs, off)


cdef inline uint32_t slot_hint(const Tail* t, uint32_t cid, uint64_t key) noexcept nogil:
    """The term whose slot holds (column, key), without comparing a string's bytes; NO_TERM
    when the probe meets an empty slot first."""
    cdef uint64_t toff = t.h.table
    cdef uint64_t mask = (<TableHead*>(t.map + toff)).mask
    cdef TSlot* slots = <TSlot*>(t.map + toff + sizeof(TableHead))
    cdef uint32_t cid1 = cid + 1
    cdef uint64_t i = mix(key, cid1, t.h.seed0) & mask
    while slots[i].cid1 != 0:
        if slots[i].cid1 == cid1 and slots[i].key == key:
            return slots[i].tid
        i = (i + 1) & mask
    return NO_TERM


cdef int commit(Tail* t, const unsigned char* raw, size_t raw_len) noexcept nogil:
    """Index the queued terms and column values as row t.n, and store its bytes; -1 on failure
    (the mapping is then inconsistent: the caller drops the builder).

    In stages over the whole document, so that the cache misses of its ~70 terms overlap
    instead of coming one after another: the slots (prefetched by the walk) give each term's
    likely id; then the terms' records are fetched; then the bytes of the string ones; then
    each term is resolved (a string compared, a new term inserted) and posted.
    """
    cdef size_t k
    cdef Pend* e
    cdef int64_t tid
    cdef uint32_t off = t.n
    cdef const unsigned char* s
    cdef uint64_t rec
    cdef uint64_t* pos
    cdef TRec* r
    for k in range(t.n_pend):
        e = &t.pend[k]
        if e.what != PEND_COL:
            e.hint = slot_hint(t, e.cid, e.key)
            if e.hint != NO_TERM:
                rt_prefetch(term_rec(t, e.hint))
    for k in range(t.n_pend):
        e = &t.pend[k]
        if e.what != PEND_COL and e.hint != NO_TERM:
            r = term_rec(t, e.hint)
            if e.tag == STRING_TAG:
                rt_prefetch(t.map + term_str(e.hint) + 64)
            if r.n > INLINE_POSTINGS:
                rt_prefetch(t.map + r.tail + 8 + (r.n - INLINE_POSTINGS
                                                  - slice_start(r.tail_s, POST_MINLOG, POST_MAXLOG)) * 4)
    for k in range(t.n_pend):
        e = &t.pend[k]
        s = (t.scratch if e.in_scratch else t.doc) + e.s_at
        if e.what == PEND_COL:
            rec = put_bytes(t, s, e.s_len)
            if rec == 0 or add_value(t, col_rec(t, e.cid), ARRAY_TAG, off, 0, rec) < 0:
                return -1
            continue
        tid = -1
        if e.hint != NO_TERM:
            if e.tag != STRING_TAG:
                tid = e.hint
            else:
                if bytes_len(t, term_str(e.hint)) == e.s_len and memcmp(bytes_data(t, term_str(e.hint)), s, e.s_len) == 0:
                    tid = e.hint
        if tid < 0:
            tid = add_term(t, e.cid, e.tag, e.key, s, e.s_len)
            if tid < 0:
                return -1
        if post(t, term_rec(t, <uint64_t>tid), off) < 0:
            return -1
        if e.what == PEND_TERM_COL and add_value(t, col_rec(t, e.cid), e.tag, off, e.key, <uint64_t>tid) < 0:
            return -1
    rec = put_bytes(t, raw, raw_len)
    if rec == 0:
        return -1
    pos = <uint64_t*>dir_put(t, &t.h.rowpos, off, 8)
    if pos == NULL:
        return -1
    pos[0] = rec
    t.n = off + 1
    return 0


# ---------------------------------------------------------------- sorting terms (seal), without the GIL
#
# sorted_postings() and write_blocks() order the terms the same way. Column keys are
# prefix-free, so terms sort by column key, then by value, and the value encodings preserve
# order: numeric terms sort by their 64-bit key, strings by their encoded bytes. So one pass
# over the terms puts a SortItem per term into the bucket of its column key, encoding string
# values into an arena on the way; then each bucket is radix-sorted by the 64-bit key (for
# strings: the first 8 encoded bytes), and runs of equal string keys are ordered by the next
# 8 bytes, and so on (encoded strings are prefix-free: two distinct ones differ within the
# shorter one). Everything read is in the mapping or C memory: no GIL needed.


cdef enum:
    SMALL_SORT = 32  # below this many items: insertion sort
    MAX_REFINE = 32  # past 8 * 32 equal leading bytes, a run of strings is qsorted
    SORT_CHUNK = 1 << 20  # bytes of an arena chunk of encoded strings
    PREFETCH_ITEMS = 8


cdef inline size_t str_len(const unsigned char* v) noexcept nogil:
    cdef size_t n
    memcpy(&n, v - sizeof(size_t), sizeof(size_t))
    return n


cdef inline int cmp_str_from(const unsigned char* x, const unsigned char* y, size_t d) noexcept nogil:
    cdef size_t xn = str_len(x), yn = str_len(y)
    cdef int r = memcmp(x + d, y + d, (xn if xn < yn else yn) - d)
    if r != 0:
        return r
    return (xn > yn) - (xn < yn)


cdef int cmp_item_str(const void* a, const void* b) noexcept nogil:
    return cmp_str_from((<const SortItem*>a).v, (<const SortItem*>b).v, 0)


cdef inline uint64_t be_prefix(const unsigned char* p, size_t n) noexcept nogil:
    cdef uint64_t v = 0
    cdef size_t i
    for i in range(8):
        v = (v << 8) | (p[i] if i < n else 0)
    return v


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


cdef void sort_free(TermSort* s) noexcept nogil:
    arena_free(&s.strs)
    free(s.items)
    free(s.bucket)
    free(s.tmp)
    free(s.rank_of)
    free(s.rank_cid)
    free(s.ck)
    free(s.ck_len)
    free(s.ck_tag)
    free(s.cand)
    free(s.ser)
    free(s.ser_len)
    free(s.post)
    memset(s, 0, sizeof(TermSort))


cdef inline size_t encode_str(const unsigned char* src, size_t n, unsigned char* out) noexcept nogil:
    """keys.encode_string of UTF-8 ``src[:n]`` (0x00 -> 00 FF, then 00 00) to ``out``."""
    cdef const unsigned char* z
    cdef unsigned char* q = out
    cdef size_t i = 0
    while i < n:
        z = <const unsigned char*>memchr(src + i, 0, n - i)
        if z == NULL:
            memcpy(q, src + i, n - i)
            q += n - i
            break
        memcpy(q, src + i, <size_t>(z - src - i))
        q += z - src - i
        q[0] = 0
        q[1] = 0xFF
        q += 2
        i = <size_t>(z - src) + 1
    q[0] = 0
    q[1] = 0
    return <size_t>(q + 2 - out)


cdef inline const uint32_t* term_postings(TermSort* s, const Tail* t, TRec* e, uint32_t n) noexcept nogil:
    """The first ``n`` postings of ``e`` contiguous (its record's when inline, else
    gathered); NULL: no memory."""
    cdef void* q
    if n <= INLINE_POSTINGS:
        return e.inl
    if n > s.post_cap:
        q = realloc(s.post, n * sizeof(uint32_t))
        if q == NULL:
            return NULL
        s.post = <uint32_t*>q
        s.post_cap = n
    postings_below(t, e, MAX_ROWS + 1, n, s.post)
    return s.post


cdef int cmp_ptr(const void* a, const void* b) noexcept nogil:
    cdef uintptr_t x = <uintptr_t>(<const Cand*>a).e, y = <uintptr_t>(<const Cand*>b).e
    return (x > y) - (x < y)


cdef int sort_terms(TermSort* s, const Tail* t) noexcept nogil:
    """Fill ``s.items`` in term order, and ``s.cand`` (by address); -1 when out of memory,
    -4 when the terms do not match the columns' term counts (a bug)."""
    cdef size_t j, need, cap, c, k, m
    cdef uint64_t sl
    cdef uint32_t rank, si, tid, nt
    cdef const uint32_t* a
    cdef TRec* e
    cdef SortItem* it
    cdef CRec* col
    cdef unsigned char* p
    cdef void* q
    cdef const uint32_t* pl
    for rank in range(s.n_ranks):
        col = col_rec(t, s.rank_cid[rank])
        nt = <uint32_t>(s.bucket[rank + 1] - s.bucket[rank])  # (its count when prepared)
        j = s.bucket[rank]
        sl = col.tids.head
        si = 0
        k = 0
        while k < nt:
            m = slice_cap(si, COL_MINLOG, COL_MAXLOG)
            if m > nt - k:
                m = nt - k
            a = <const uint32_t*>(t.map + sl + 8)
            for c in range(m):
                tid = a[c]
                e = term_rec(t, tid)
                it = &s.items[j]
                j += 1
                it.e = e
                it.tid = tid
                it.n = rt_ld32(&e.n)  # (read once: the postings sorted and encoded are these)
                if it.n >= RAW_MAX:
                    pl = term_postings(s, t, e, it.n)
                    if pl == NULL:
                        return -1
                    if not _surely_raw(pl, it.n):
                        if s.n_cand == s.cand_cap:
                            cap = s.cand_cap * 2 if s.cand_cap else 256
                            q = realloc(s.cand, cap * sizeof(Cand))
                            if q == NULL:
                                return -1
                            s.cand = <Cand*>q
                            s.cand_cap = cap
                        s.cand[s.n_cand].e = e
                        s.cand[s.n_cand].n = it.n
                        s.n_cand += 1
                if s.ck_tag[rank] != STRING_TAG:
                    it.key = e.key
                    it.v = NULL
                else:
                    need = bytes_len(t, term_str(tid))
                    p = arena_room(&s.strs, sizeof(size_t) + 2 * need + 2, SORT_CHUNK)
                    if p == NULL:
                        return -1
                    need = encode_str(bytes_data(t, term_str(tid)), need, p + sizeof(size_t))
                    memcpy(p, &need, sizeof(size_t))
                    it.key = be_prefix(p + sizeof(size_t), need)
                    it.v = p + sizeof(size_t)
                    arena_take(&s.strs, sizeof(size_t) + need)
            k += m
            if k < nt:
                sl = (<const uint64_t*>(t.map + sl))[0]
                si += 1
    if s.n_cand > 1:
        qsort(s.cand, s.n_cand, sizeof(Cand), cmp_ptr)
    for c in range(s.n_ranks):
        j = s.bucket[c]
        radix_sort(s.items + j, s.tmp, s.bucket[c + 1] - j)
        if s.ck_tag[c] == STRING_TAG:
            refine_strings(s.items + j, s.tmp, s.bucket[c + 1] - j, 8, 0)
    free(s.tmp)
    s.tmp = NULL
    return 0


cdef inline size_t term_value(const TermSort* s, const SortItem* it, uint32_t rank,
                              unsigned char* buf, const unsigned char** v) noexcept nogil:
    """Length of the encoded value of term ``it``; sets ``v`` to it."""
    cdef int tag
    if it.v != NULL:
        v[0] = it.v
        return str_len(it.v)
    v[0] = buf
    tag = s.ck_tag[rank]
    if tag == INT_TAG or tag == FLOAT_TAG or tag == TIMESTAMP_TAG:
        put_be64(buf, it.e.key)
        return 8
    if tag == BOOL_TAG:
        buf[0] = <unsigned char>it.e.key
        return 1
    return 0


cdef inline size_t find_cand(const TermSort* s, const TRec* e) noexcept nogil:
    cdef size_t lo = 0, hi = s.n_cand, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if <uintptr_t>s.cand[mid].e < <uintptr_t>e:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef int encode_blocks(TermSort* s, const Tail* t, WState* w, BlockOut* out) noexcept nogil:
    """Encode every term, in order, into blocks (as BlockWriter.add does) appended to ``out``.
    Returns 0, -1 when out of memory, -2 when a block is larger than 4 GiB, -3 when term
    ``s.items[s.bad]`` is too long."""
    cdef size_t i, c, vlen
    cdef Py_ssize_t cl, tlen, k, ser_len
    cdef const SortItem* it
    cdef TRec* e
    cdef uint32_t rank
    cdef const unsigned char* ser
    cdef const unsigned char* v
    cdef const uint32_t* pl
    cdef unsigned char buf[8]
    cdef int rc
    for i in range(s.n):
        if i + PREFETCH_ITEMS < s.n:
            rt_prefetch(s.items[i + PREFETCH_ITEMS].e)
        it = &s.items[i]
        e = it.e
        k = it.n
        if k == 0:
            continue
        ser = NULL
        ser_len = -1
        if k >= RAW_MAX and s.n_cand > 0:
            c = find_cand(s, e)
            if c < s.n_cand and s.cand[c].e == e and s.ser[c] != NULL:
                ser = s.ser[c]
                ser_len = s.ser_len[c]
        rank = s.rank_of[e.cid]
        vlen = term_value(s, it, rank, buf, &v)
        cl = s.ck_len[rank]
        if vlen > <size_t>MAX_TERM or cl + <Py_ssize_t>vlen > MAX_TERM:
            s.bad = i
            return -3
        tlen = cl + <Py_ssize_t>vlen
        pl = term_postings(s, t, e, <uint32_t>k)
        if pl == NULL:
            return -1
        if _w_grow(w, _w_entry_size(tlen, k, ser_len)) < 0:
            return -1
        _w_put(w, s.ck[rank], cl, v, <Py_ssize_t>vlen, pl, k, ser, ser_len)
        if _w_size(w) >= w.target:
            rc = _w_flush_to(w, out)
            if rc < 0:
                return rc
    if w.n > 0:
        return _w_flush_to(w, out)
    return 0


cdef int index_batch(Tail* t, const unsigned char** ptrs, const size_t* lens, Py_ssize_t n, int64_t* offs,
                     ErrList* el) noexcept nogil:
    """Walk and commit each document; refused ones get -1 and an entry in ``el``. -1 when the
    batch cannot go on (t.err says why)."""
    cdef Py_ssize_t k
    cdef DocError* e
    cdef void* q
    cdef size_t cap
    for k in range(n):
        t.doc = ptrs[k]
        t.doc_len = lens[k]
        if walk(t) < 0:
            if t.err.code >= E_OS:
                return -1
            offs[k] = -1
            if el.n == el.cap:
                cap = el.cap * 2 if el.cap else 16
                q = realloc(el.items, cap * sizeof(DocError))
                if q == NULL:
                    t.err.code = E_OS
                    t.err.extra = 12
                    return -1
                el.items = <DocError*>q
                el.cap = cap
            e = &el.items[el.n]
            e[0] = t.err
            e.doc = <uint32_t>k
            e.path = <uint32_t*>malloc((t.err.depth + 1) * sizeof(uint32_t))
            if e.path == NULL:
                t.err.code = E_OS
                t.err.extra = 12
                return -1
            memcpy(e.path, t.err.path, t.err.depth * sizeof(uint32_t))
            el.n += 1
            continue
        if t.n >= MAX_ROWS:
            t.err.code = E_FULL
            return -1
        if commit(t, ptrs[k], lens[k]) < 0:
            return -1
        offs[k] = <int64_t>t.n - 1
    return 0


# ---------------------------------------------------------------- Arrow batches, column-wise


cdef inline bint bit_at(const unsigned char* bits, int64_t i) noexcept nogil:
    return (bits[i >> 3] >> (i & 7)) & 1


cdef inline int64_t offset_at(const unsigned char* offsets, bint large, int64_t i) noexcept nogil:
    cdef int64_t v64
    cdef int32_t v32
    if large:
        memcpy(&v64, offsets + i * 8, 8)
        return v64
    memcpy(&v32, offsets + i * 4, 4)
    return v32


cdef int null_term(Tail* t, uint32_t node, TRec** r, CRec** c) noexcept nogil:
    """The NULL term and column of ``node`` (made when new) into ``r`` and ``c``."""
    cdef int64_t cid = column_of(t, node, NULL_TAG), tid
    if cid < 0:
        return -1
    tid = add_term(t, <uint32_t>cid, NULL_TAG, 0, NULL, 0)
    if tid < 0:
        return -1
    r[0] = term_rec(t, <uint64_t>tid)
    c[0] = col_rec(t, <uint64_t>cid)
    return 0


cdef inline int add_null(Tail* t, TRec* r, CRec* c, uint32_t off) noexcept nogil:
    """Row ``off`` holds null where ``r`` and ``c`` (null_term) are."""
    if post(t, r, off) < 0 or add_value(t, c, NULL_TAG, off, 0, 0) < 0:
        return -1
    return 0


cdef int index_nulls(Tail* t, uint32_t node, uint64_t n, uint32_t base) noexcept nogil:
    """Rows ``base`` .. ``base + n - 1`` hold null at ``node``."""
    cdef TRec* r
    cdef CRec* c
    cdef uint64_t i
    if null_term(t, node, &r, &c) < 0:
        return -1
    for i in range(n):
        if add_null(t, r, c, base + <uint32_t>i) < 0:
            return -1
    return 0


cdef int index_fixed(Tail* t, uint32_t node, int tag, const unsigned char* data, const unsigned char* valid,
                     int64_t start, uint64_t n, uint32_t base) noexcept nogil:
    """Values ``start`` .. ``start + n - 1`` of an int64 (INT, TIMESTAMP), double (FLOAT,
    finite) or bool array at ``node`` as the rows from ``base``; ``valid``: validity bits
    (NULL: none is null)."""
    cdef int64_t cid = column_of(t, node, tag), tid
    cdef TRec* null_r = NULL
    cdef CRec* c
    cdef CRec* nc = NULL
    cdef uint64_t i, key
    cdef uint32_t off
    cdef int64_t x
    cdef double d
    if cid < 0:
        return -1
    c = col_rec(t, <uint64_t>cid)
    for i in range(n):
        off = base + <uint32_t>i
        if valid != NULL and not bit_at(valid, start + <int64_t>i):
            if null_r == NULL and null_term(t, node, &null_r, &nc) < 0:
                return -1
            if add_null(t, null_r, nc, off) < 0:
                return -1
            continue
        if tag == BOOL_TAG:
            key = bit_at(data, start + <int64_t>i)
        elif tag == FLOAT_TAG:
            memcpy(&d, data + (start + <int64_t>i) * 8, 8)
            key = float_key(d)
        else:
            memcpy(&x, data + (start + <int64_t>i) * 8, 8)
            key = int_key(x)
        tid = add_term(t, <uint32_t>cid, tag, key, NULL, 0)
        if tid < 0 or post(t, term_rec(t, <uint64_t>tid), off) < 0 or add_value(t, c, tag, off, key, 0) < 0:
            return -1
    return 0


cdef int index_strings(Tail* t, uint32_t node, const unsigned char* offsets, bint large,
                       const unsigned char* data, const unsigned char* valid, int64_t start, uint64_t n,
                       uint32_t base) noexcept nogil:
    """Values ``start`` .. ``start + n - 1`` of a (large_)string array (validated UTF-8) at
    ``node`` as the rows from ``base``."""
    cdef int64_t cid = column_of(t, node, STRING_TAG), tid, a, b
    cdef TRec* null_r = NULL
    cdef CRec* c
    cdef CRec* nc = NULL
    cdef uint64_t i, key
    cdef uint32_t off
    if cid < 0:
        return -1
    c = col_rec(t, <uint64_t>cid)
    for i in range(n):
        off = base + <uint32_t>i
        if valid != NULL and not bit_at(valid, start + <int64_t>i):
            if null_r == NULL and null_term(t, node, &null_r, &nc) < 0:
                return -1
            if add_null(t, null_r, nc, off) < 0:
                return -1
            continue
        a = offset_at(offsets, large, start + <int64_t>i)
        b = offset_at(offsets, large, start + <int64_t>i + 1)
        key = str_hash(t, data + a, <size_t>(b - a))
        tid = add_term(t, <uint32_t>cid, STRING_TAG, key, data + a, <size_t>(b - a))
        if tid < 0 or post(t, term_rec(t, <uint64_t>tid), off) < 0:
            return -1
        if add_value(t, c, STRING_TAG, off, key, <uint64_t>tid) < 0:
            return -1
    return 0


cdef int64_t first_bad_utf8(const unsigned char* offsets, bint large, const unsigned char* data, int64_t size,
                            const unsigned char* valid, int64_t start, int64_t n) noexcept nogil:
    """The first row (from 0) of a string array whose value is not valid UTF-8, -1 if none,
    -2 when its offsets go back or past its data (a malformed array)."""
    cdef int64_t i, a, b, j
    cdef int k
    for i in range(n + 1):
        a = offset_at(offsets, large, start + i)
        if a < 0 or a > size or (i and a < offset_at(offsets, large, start + i - 1)):
            return -2
    for i in range(n):
        if valid != NULL and not bit_at(valid, start + i):
            continue
        a = offset_at(offsets, large, start + i)
        b = offset_at(offsets, large, start + i + 1)
        j = a
        while j < b:
            if data[j] < 0x80:
                j += 1
                continue
            k = utf8_len(data, <size_t>j, <size_t>b)
            if k == 0:
                return i
            j += k
    return -1


cdef int store_rows(Tail* t, const unsigned char** ptrs, const size_t* lens, uint64_t n) noexcept nogil:
    """Keep the bytes of the next ``n`` rows (their index is in already) and count them."""
    cdef uint64_t i, rec
    cdef uint64_t* pos
    for i in range(n):
        rec = put_bytes(t, ptrs[i], lens[i])
        if rec == 0:
            return -1
        pos = <uint64_t*>dir_put(t, &t.h.rowpos, t.n, 8)
        if pos == NULL:
            return -1
        pos[0] = rec
        t.n += 1
    return 0


# ---------------------------------------------------------------- the Python face


def _error_message(int code, uint64_t pos, uint64_t extra, max_depth):
    """The message of a document error (rtindex/_py/jsonparse.py words them the same)."""
    cdef unsigned char c = <unsigned char>extra
    if code == E_EMPTY:
        return "empty document"
    if code == E_NOT_OBJECT:
        return f"a document must be a JSON object, not {_NOT_OBJECT_KIND[c]}"
    if code == E_DEPTH:
        return f"nesting deeper than {max_depth} levels"
    if code == E_DUPKEY:
        return "duplicate key in an object"
    if code == E_SURROGATE:
        return "string is not valid UTF-8 (lone surrogate)"
    if code == E_KEY_SURROGATE:
        return "key is not valid UTF-8 (lone surrogate)"
    if code == E_INT_RANGE:
        return "integer outside the signed 64-bit range"
    if code == E_NONFINITE:
        return f"non-finite number {'-inf' if extra else 'inf'} (JSON has no NaN or Infinity)"
    if code == E_EOF:
        what = "unexpected end of input"
    elif code == E_CHAR:
        what = f"unexpected character '{chr(c)}'" if 0x21 <= c <= 0x7E else f"unexpected byte 0x{c:02x}"
    elif code == E_NAN:
        what = "NaN and Infinity are not JSON numbers"
    elif code == E_NUMBER:
        what = "invalid number"
    elif code == E_CONTROL:
        what = "control character in a string"
    elif code == E_ESCAPE:
        what = "invalid escape"
    elif code == E_UESCAPE:
        what = "invalid \\u escape"
    elif code == E_UTF8:
        what = "invalid UTF-8 in a string"
    elif code == E_KEY_EXPECTED:
        what = "expected a string key"
    elif code == E_COLON:
        what = "expected ':' after an object key"
    elif code == E_OBJ_NEXT:
        what = "expected ',' or '}' after an object member"
    elif code == E_ARR_NEXT:
        what = "expected ',' or ']' after an array element"
    else:
        what = "unexpected content after the document"
    return f"invalid JSON at byte {pos}: {what}"


cdef inline unsigned char* buffer_address(object buf):
    return <unsigned char*><uintptr_t>buf.address


cdef class SegmentBuilder:
    """The newest rows of a shard, indexed in a mapping: a file other processes may attach."""

    def __cinit__(self, *args, **kwargs):
        memset(&self.t, 0, sizeof(Tail))
        self.t.fd = -1
        self._colmap = {}

    def __init__(self, path=None, base=0, max_depth=64, reserve=DEFAULT_RESERVE):
        """A new mutable segment whose row 0 is row id ``base``: in the file ``path`` (made;
        it must not exist), which other processes may attach, or in private memory."""
        cdef Tail* t = &self.t
        cdef uint64_t res = _index(reserve), b = _index(base)
        cdef int fd = -1
        cdef bytes seed = os.urandom(16)
        cdef void* m
        cdef uint64_t toff
        if self.t.map != NULL:
            raise RuntimeError("SegmentBuilder.__init__ called twice")
        self.max_depth = max_depth
        res = (res + 4095) & ~(<uint64_t>4095)
        if res < (8 << 20) or res > (<uint64_t>32 << 30):
            raise ValueError("reserve must be from 8 MiB to 32 GiB")
        if path is not None:
            path = os.fspath(path)
            bpath = os.fsencode(path)
            fd = c_open(bpath, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
            if fd < 0:
                raise OSError(rt_errno(), f"cannot create the mutable segment file {path}: {os.strerror(rt_errno())}")
            err = rt_fallocate(fd, 0, FIRST_SIZE)  # the header's page must exist before it is touched
            if err != 0:
                c_close(fd)
                os.unlink(path)
                raise OSError(err, f"cannot allocate the mutable segment file {path}: {os.strerror(err)}")
            m = mmap(NULL, res, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0)
        else:
            m = mmap(NULL, res, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
            if m != MAP_FAILED and os.environ.get("RT_THP"):
                madvise(m, res, MADV_HUGEPAGE)
        if m == MAP_FAILED:
            err = rt_errno()
            if fd >= 0:
                c_close(fd)
                os.unlink(path)
            raise OSError(err, f"cannot map {res} bytes for a mutable segment: {os.strerror(err)}")
        t.map = <unsigned char*>m
        t.h = <Header*>m
        t.mapped = res
        t.fd = fd
        t.writer = True
        self._path = path
        t.h.reserve = res
        t.h.size = FIRST_SIZE
        t.h.used = sizeof(Header)
        t.h.base = b
        t.h.seed0 = int.from_bytes(seed[:8], "little")
        t.h.seed1 = int.from_bytes(seed[8:], "little")
        t.h.max_depth = <uint32_t>min(max(self.t.max_depth, 0), 0xFFFFFFFF)
        t.h.version = VERSION
        toff = alloc(t, sizeof(TableHead) + TABLE_MIN * sizeof(TSlot), 64)
        (<TableHead*>(t.map + toff)).mask = TABLE_MIN - 1
        t.h.table = toff
        self._init_private()
        t.h.magic = MAGIC  # last: a reader that sees it sees a complete header

    cdef _init_private(self):
        cdef Tail* t = &self.t
        t.nodes = <Node*>safe_realloc(NULL, 64, sizeof(Node))
        t.cap_nodes = 64
        memset(&t.nodes[0], 0, sizeof(Node))
        t.nodes[0].first_child = NO_NODE
        t.nodes[0].next_sib = NO_NODE
        t.n_nodes = 1
        t.ntable = <uint32_t*>safe_realloc(NULL, NTABLE_MIN, sizeof(uint32_t))
        memset(t.ntable, 0, NTABLE_MIN * sizeof(uint32_t))
        t.nmask = NTABLE_MIN - 1
        t.private_bytes = 64 * sizeof(Node) + NTABLE_MIN * sizeof(uint32_t)
        t.frames = <Frame*>safe_realloc(NULL, 64, sizeof(Frame))
        t.err.path = <uint32_t*>safe_realloc(NULL, 64, sizeof(uint32_t))
        t.cap_frames = 64

    @staticmethod
    def attach(path):
        """A read-only view of the mutable segment another process writes in ``path``."""
        cdef SegmentBuilder b = SegmentBuilder.__new__(SegmentBuilder)
        cdef int fd
        cdef void* m
        cdef Header h
        path = os.fspath(path)
        with open(path, "rb") as f:
            head = f.read(sizeof(Header))
        if len(head) < <Py_ssize_t>sizeof(Header):
            raise ValueError(f"{path} is not a mutable segment file (too short)")
        memcpy(&h, PyBytes_AS_STRING(head), sizeof(Header))
        if h.magic != MAGIC or h.version != VERSION:
            raise ValueError(f"{path} is not a mutable segment file of this version")
        fd = c_open(os.fsencode(path), O_RDONLY | O_CLOEXEC, 0)
        if fd < 0:
            raise OSError(rt_errno(), f"cannot open {path}: {os.strerror(rt_errno())}")
        m = mmap(NULL, h.reserve, PROT_READ, MAP_SHARED | MAP_NORESERVE, fd, 0)
        if m == MAP_FAILED:
            err = rt_errno()
            c_close(fd)
            raise OSError(err, f"cannot map {path}: {os.strerror(err)}")
        b.t.map = <unsigned char*>m
        b.t.h = <Header*>m
        b.t.mapped = h.reserve
        b.t.fd = fd
        b.t.writer = False
        b.t.max_depth = h.max_depth
        b._max_depth_obj = h.max_depth
        b._path = path
        return b

    cdef _release(self):
        cdef Tail* t = &self.t
        cdef size_t i
        if t.map != NULL:
            munmap(t.map, t.mapped)
            t.map = NULL
            t.h = NULL
        if t.fd >= 0:
            c_close(t.fd)
            t.fd = -1
        arena_free(&t.names)
        free(t.nodes)
        free(t.ntable)
        free(t.pend)
        free(t.scratch)
        free(t.frames)
        free(t.err.path)
        memset(t, 0, sizeof(Tail))
        t.fd = -1

    def __dealloc__(self):
        self._release()

    cdef int _check(self) except -1:
        if self.t.map == NULL:
            raise ValueError("the mutable segment is closed")
        return 0

    cdef int _check_writer(self) except -1:
        self._check()
        if not self.t.writer:
            raise RuntimeError("this mutable segment is another process's (attached read-only)")
        if self._busy:
            raise RuntimeError("SegmentBuilder: one writer at a time (add_json/add_columns re-entered)")
        return 0

    @property
    def path(self):
        """The file (None: private memory)."""
        return self._path

    @property
    def base(self):
        self._check()
        return self.t.h.base

    @property
    def writer(self):
        """Whether this process adds rows (else: attached read-only)."""
        return self.t.writer

    @property
    def max_depth(self):
        return self._max_depth_obj

    @max_depth.setter
    def max_depth(self, value):
        value = _index(value)
        self._max_depth_obj = value
        self.t.max_depth = max(min(value, 1 << 30), -1)

    @property
    def n_rows(self):
        """Rows added (the writer's count); for an attached view, the rows published."""
        self._check()
        if self.t.writer:
            return self.t.n
        return rt_ld64(&self.t.h.rows)

    @property
    def published(self):
        """(rows, change log sequence) as the writer last published them: the log sequence
        was stored first, so it is at least the one of those rows."""
        self._check()
        rows = rt_ld64(&self.t.h.rows)
        return rows, rt_ld64(&self.t.h.log_seq)

    def publish(self, rows, log_seq):
        """Let readers in other processes see ``rows`` rows (durable ones), written by the
        writer's change log sequence ``log_seq``."""
        cdef uint64_t r, q
        self._check()
        rows, log_seq = _index(rows), _index(log_seq)
        if rows < 0 or log_seq < 0 or log_seq >= 1 << 64:
            raise ValueError(f"publish({rows}, {log_seq}): both must be non-negative")
        if rows > self.t.n:
            raise ValueError(f"publish({rows}) of a segment holding {self.t.n} rows")
        r, q = rows, log_seq
        if not self.t.writer:
            raise RuntimeError("this mutable segment is another process's (attached read-only)")
        if r > self.t.n:
            raise ValueError(f"publish({r}) of a segment holding {self.t.n} rows")
        rt_st64(&self.t.h.log_seq, q)
        rt_st64(&self.t.h.rows, r)

    @property
    def nbytes(self):
        """Memory held: the mapping's bytes in use and the writer's private structures."""
        self._check()
        return self.t.h.used + self.t.private_bytes + self.t.names.held

    def close(self):
        """Unmap (the file stays; see ``unlink``). Using the builder afterwards raises."""
        self._release()

    def unlink(self):
        """Remove the file (processes that mapped it keep their mapping)."""
        if self._path is not None:
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass

    cdef _batch_failed(self, int code, uint64_t extra):
        """A batch stopped midway (out of disk or memory, or the segment full): the builder
        holds part of it and takes no more rows (the writer replaces it)."""
        self._broken = True
        if code == E_FULL:
            raise OSError(28, "the mutable segment is full (too many rows, terms or bytes): seal it first")
        err = <int>extra if extra else 12
        raise OSError(err, f"cannot grow the mutable segment {self._path or '(memory)'}: {os.strerror(err)}")

    def add_json(self, docs):
        """Index the JSON documents ``docs`` (a list of bytes, each one JSON object) as the
        next rows, each all or nothing, and keep their bytes (``row``).

        Returns ``(offsets, errors)``: each document's row offset (-1: refused) and
        ``[(index, SchemaError)]`` for the refused ones, with what and where (the rules of
        rtindex/_py/jsonparse.py). Runs without the GIL. OSError when the mapping cannot
        grow: the builder then holds part of the batch and refuses further rows.
        """
        cdef Py_ssize_t n, k, m
        cdef const unsigned char** ptrs = NULL
        cdef size_t* lens = NULL
        cdef int64_t* offs = NULL
        cdef ErrList el
        cdef Tail* t = &self.t
        cdef int rc = 0
        cdef object d
        cdef DocError* e
        self._check_writer()
        if self._broken:
            raise RuntimeError("this mutable segment lost a batch midway: the writer must replace it")
        if type(docs) is not list:
            docs = list(docs)
        n = PyList_GET_SIZE(docs)
        memset(&el, 0, sizeof(ErrList))
        self._busy = True
        try:
            ptrs = <const unsigned char**>safe_realloc(NULL, n + 1, sizeof(unsigned char*))
            lens = <size_t*>safe_realloc(NULL, n + 1, sizeof(size_t))
            offs = <int64_t*>safe_realloc(NULL, n + 1, sizeof(int64_t))
            for k in range(n):
                d = <object>PyList_GET_ITEM(docs, k)
                if type(d) is not bytes:
                    raise TypeError(f"add_json takes a list of bytes, not of {type(d).__name__}")
                ptrs[k] = <const unsigned char*>PyBytes_AS_STRING(d)
                lens[k] = <size_t>PyBytes_GET_SIZE(d)
            with nogil:
                rc = index_batch(t, ptrs, lens, n, offs, &el)
            if rc < 0:
                self._batch_failed(t.err.code, t.err.extra)
            out = [offs[k] for k in range(n)]
            errors = []
            for k in range(<Py_ssize_t>el.n):
                e = &el.items[k]
                parts = []
                for m in range(e.depth):
                    if e.path[m] & INDEX_BIT:
                        parts.append(<Py_ssize_t>(e.path[m] & ~INDEX_BIT))
                    else:
                        parts.append((<bytes>t.nodes[e.path[m]].key[:t.nodes[e.path[m]].key_len]).decode("utf-8"))
                errors.append((e.doc, SchemaError(_error_message(e.code, e.pos, e.extra, self._max_depth_obj),
                                                  json_path(parts))))
            return out, errors
        finally:
            self._busy = False
            free(ptrs)
            free(lens)
            free(offs)
            for k in range(<Py_ssize_t>el.n):
                free(el.items[k].path)
            free(el.items)


    def add_columns(self, names, arrays, raws):
        """Index the rows of ``arrays`` (pyarrow Arrays of ``columns.INDEXABLE_TYPES``, the
        columns ``names``) as the next rows, column by column, with ``raws`` their JSON bytes
        (``row``); returns the offset of the first.

        The same index as ``add_json`` of each row (a null is a JSON null). Everything that
        could refuse the batch is checked before anything is indexed.
        """
        cdef Py_ssize_t n, j, r, bad_row = -1, bad_col = -1, nc
        cdef Tail* t = &self.t
        cdef uint32_t base
        cdef int64_t cid
        cdef const unsigned char** ptrs = NULL
        cdef size_t* lens = NULL
        cdef int rc = 0, tag
        cdef const unsigned char* valid
        cdef const unsigned char* data
        cdef const unsigned char* offsets
        cdef int64_t start, bad
        cdef bint large
        cdef uint32_t node
        cdef const unsigned char* kp
        cdef size_t kn
        names, arrays, n = check_batch(names, arrays)
        self._check_writer()
        if self._broken:
            raise RuntimeError("this mutable segment lost a batch midway: the writer must replace it")
        if type(raws) is not list:
            raws = list(raws)
        if len(raws) != n:
            raise ValueError(f"add_columns got {n} rows and {len(raws)} row texts")
        for j in range(n):
            if type(raws[j]) is not bytes:
                raise TypeError(f"add_columns takes the rows' texts as bytes, not {type(raws[j]).__name__}")
        nc = len(names)
        encoded = []
        for j in range(nc):
            try:
                encoded.append(names[j].encode("utf-8"))
            except UnicodeEncodeError:
                raise SchemaError("key is not valid UTF-8 (lone surrogate)", "$") from None
        if <uint64_t>n > MAX_ROWS - t.n:
            raise OverflowError("a segment holds at most 2**32 - 1 rows: seal it first")
        if n == 0:
            return t.n
        if t.max_depth < 1:
            raise SchemaError(f"nesting deeper than {self._max_depth_obj} levels", "$")
        # What add_json would refuse in these rows: a NaN or an infinity, a string that is not
        # UTF-8; the first in row order, as a row-by-row walk would meet it.
        for j in range(nc):
            arr = arrays[j]
            if arr.null_count == len(arr) or arr.type == _NULL:
                continue
            bufs = arr.buffers()
            valid = buffer_address(bufs[0]) if arr.null_count else NULL
            if arr.type == _DOUBLE:
                r = _first_non_finite(buffer_address(bufs[1]), valid, arr.offset, n)
            elif arr.type == _BOOL or arr.type == _INT64:
                r = -1
            else:
                data = buffer_address(bufs[2]) if bufs[2] is not None else NULL
                r = first_bad_utf8(buffer_address(bufs[1]), arr.type == _LARGE_STRING, data,
                                   bufs[2].size if bufs[2] is not None else 0, valid, arr.offset, n)
                if r == -2:
                    raise ValueError(f"column {names[j]!r} is a string array whose offsets go back or past its "
                                     f"data: a malformed array")
            if r >= 0 and (bad_row < 0 or r < bad_row):
                bad_row, bad_col = r, j
        if bad_row >= 0:
            v = arrays[bad_col][bad_row]
            if arrays[bad_col].type == _DOUBLE:
                raise SchemaError(f"non-finite number {v.as_py()!r} (JSON has no NaN or Infinity)",
                                  json_path([names[bad_col]]))
            raise SchemaError(f"invalid UTF-8 in a string", json_path([names[bad_col]]))
        self._busy = True
        try:
            ptrs = <const unsigned char**>safe_realloc(NULL, n, sizeof(unsigned char*))
            lens = <size_t*>safe_realloc(NULL, n, sizeof(size_t))
            for j in range(n):
                ptrs[j] = <const unsigned char*>PyBytes_AS_STRING(raws[j])
                lens[j] = <size_t>PyBytes_GET_SIZE(raws[j])
            base = t.n
            for j in range(nc):
                key = <bytes>encoded[j]
                kp = <const unsigned char*>PyBytes_AS_STRING(key)
                kn = <size_t>PyBytes_GET_SIZE(key)
                with nogil:
                    cid = child_node(t, 0, NO_NODE, kp, kn)
                if cid < 0:
                    self._batch_failed(E_OS, 12)
                node = <uint32_t>cid
                arr = arrays[j]
                if arr.type == _NULL or arr.null_count == len(arr):
                    with nogil:
                        rc = index_nulls(t, node, <uint64_t>n, base)
                else:
                    bufs = arr.buffers()
                    valid = buffer_address(bufs[0]) if arr.null_count else NULL
                    start = arr.offset
                    if arr.type == _INT64 or arr.type == _DOUBLE or arr.type == _BOOL:
                        if arr.type == _INT64:
                            tag = TIMESTAMP_TAG if t.nodes[node].is_event_time else INT_TAG
                        else:
                            tag = FLOAT_TAG if arr.type == _DOUBLE else BOOL_TAG
                        data = buffer_address(bufs[1])
                        with nogil:
                            rc = index_fixed(t, node, tag, data, valid, start, <uint64_t>n, base)
                    else:
                        offsets = buffer_address(bufs[1])
                        data = buffer_address(bufs[2]) if bufs[2] is not None else NULL
                        large = arr.type == _LARGE_STRING
                        with nogil:
                            rc = index_strings(t, node, offsets, large, data, valid, start, <uint64_t>n, base)
                if rc < 0:
                    self._batch_failed(t.err.code, t.err.extra)
            with nogil:
                rc = store_rows(t, ptrs, lens, <uint64_t>n)
            if rc < 0:
                self._batch_failed(t.err.code, t.err.extra)
            return base
        finally:
            self._busy = False
            free(ptrs)
            free(lens)

    # ------------------------------------------------------------ reads (any thread, any process)

    cdef Py_ssize_t _cid(self, bytes column_key):
        """The column id of ``column_key``, -1 if none (learning the columns made since last)."""
        cdef uint64_t n, cid
        got = self._colmap.get(column_key)
        if got is not None:
            return got
        n = rt_ld64(&self.t.h.n_cols)
        if <uint64_t>self._learned < n:
            for cid in range(<uint64_t>self._learned, n):
                self._colmap[self._col_key(cid)] = cid
            self._learned = <Py_ssize_t>n
            got = self._colmap.get(column_key)
            if got is not None:
                return got
        return -1

    cdef bytes _col_key(self, uint64_t cid):
        cdef CRec* c = col_rec(&self.t, cid)
        return PyBytes_FromStringAndSize(<const char*>bytes_data(&self.t, c.key), bytes_len(&self.t, c.key))

    cdef bytes _term_bytes(self, uint64_t tid):
        """The bytes of term ``tid``: its column key, then its value encoded."""
        cdef Tail* t = &self.t
        cdef TRec* r = term_rec(t, tid)
        cdef CRec* c = col_rec(t, r.cid)
        cdef uint32_t cl = bytes_len(t, c.key), vl
        cdef bytes out
        cdef unsigned char* q
        if c.tag == STRING_TAG:
            vl = bytes_len(t, term_str(tid))
            out = PyBytes_FromStringAndSize(NULL, cl + 2 * vl + 2)
            q = <unsigned char*>PyBytes_AS_STRING(out)
            memcpy(q, bytes_data(t, c.key), cl)
            vl = <uint32_t>encode_str(bytes_data(t, term_str(tid)), vl, q + cl)
            return out[:cl + vl]
        vl = 8 if c.tag == INT_TAG or c.tag == FLOAT_TAG or c.tag == TIMESTAMP_TAG else 1 if c.tag == BOOL_TAG else 0
        out = PyBytes_FromStringAndSize(NULL, cl + vl)
        q = <unsigned char*>PyBytes_AS_STRING(out)
        memcpy(q, bytes_data(t, c.key), cl)
        if vl == 8:
            put_be64(q + cl, r.key)
        elif vl == 1:
            q[cl] = <unsigned char>r.key
        return out

    def _term_id(self, term):
        """The term id of ``term`` (bytes), -1 if the builder has no such term."""
        cdef const unsigned char* p
        cdef Py_ssize_t n, i = 0, cl, vn
        cdef Py_ssize_t cid
        cdef int tag
        cdef uint64_t key = 0
        cdef uint32_t tid
        cdef bytes val = b""
        self._check()
        if type(term) is not bytes:
            raise TypeError(f"a term is bytes, not {type(term).__name__}")
        p = <const unsigned char*>PyBytes_AS_STRING(term)
        n = PyBytes_GET_SIZE(term)
        while i + 1 < n and not (p[i] == 0 and p[i + 1] == 0):  # the path ends at 00 00
            i += 2 if p[i] == 0 else 1
        if i + 2 >= n:
            return -1
        cl = i + 3  # path, its end, the tag
        tag = p[i + 2]
        cid = self._cid(term[:cl])
        if cid < 0:
            return -1
        vn = n - cl
        if tag == INT_TAG or tag == FLOAT_TAG or tag == TIMESTAMP_TAG:
            if vn != 8:
                return -1
            key = get_be64(p + cl)
        elif tag == BOOL_TAG:
            if vn != 1 or p[cl] > 1:
                return -1
            key = p[cl]
        elif tag == STRING_TAG:
            if vn < 2 or p[n - 1] != 0 or p[n - 2] != 0:
                return -1
            enc = term[cl:n - 2]
            if enc.count(b"\x00") != enc.count(b"\x00\xff"):  # every NUL escaped as 00 FF
                return -1
            val = enc.replace(b"\x00\xff", b"\x00")
            key = str_hash(&self.t, <const unsigned char*>PyBytes_AS_STRING(val), PyBytes_GET_SIZE(val))
        elif vn != 0:
            return -1
        tid = find_term(&self.t, <uint32_t>cid, tag, key, <const unsigned char*>PyBytes_AS_STRING(val),
                        PyBytes_GET_SIZE(val))
        return -1 if tid == NO_TERM else tid

    def postings(self, term, limit):
        """Offsets (< ``limit``) of the rows holding ``term``, increasing; a new array('I')."""
        cdef Py_ssize_t tid = self._term_id(term)
        cdef uint64_t lim = _clamp_limit(limit)
        cdef TRec* r
        cdef array out
        cdef size_t k
        cdef uint32_t n
        if tid < 0:
            return clone(_U32, 0, False)
        r = term_rec(&self.t, <uint64_t>tid)
        n = rt_ld32(&r.n)
        out = clone(_U32, n, False)
        k = postings_below(&self.t, r, lim, n, out.data.as_uints)
        return out[:k] if k < len(out) else out

    def column_terms(self, column_key):
        """Every distinct term of one column key (path + type), in no particular order."""
        cdef Py_ssize_t cid
        cdef CRec* c
        cdef uint64_t n, i
        cdef array tids
        self._check()
        if type(column_key) is not bytes:
            return []
        cid = self._cid(column_key)
        if cid < 0:
            return []
        c = col_rec(&self.t, <uint64_t>cid)
        n = rt_ld32(&c.tids.n)
        tids = clone(_U32, n, False)
        clist_copy(&self.t, &c.tids, n, 4, <unsigned char*>tids.data.as_uints)
        return [self._term_bytes(tids.data.as_uints[i]) for i in range(n)]

    def column_keys(self):
        """Column keys (path + type) that have at least one term, sorted."""
        cdef uint64_t n, cid
        self._check()
        n = rt_ld64(&self.t.h.n_cols)
        return sorted([self._col_key(cid) for cid in range(n) if rt_ld32(&col_rec(&self.t, cid).tids.n)])

    def column_size(self, column_key, limit):
        """How many rows with offset < ``limit`` have a value in this column (no copy)."""
        cdef Py_ssize_t cid
        self._check()
        if type(column_key) is not bytes:
            return 0
        cid = self._cid(column_key)
        if cid < 0:
            return 0
        return clist_count_below(&self.t, &col_rec(&self.t, <uint64_t>cid).offs, _clamp_limit(limit))

    def column(self, column_key, limit):
        """(offsets, values) of one column's rows with offset < ``limit``: a new array('I')
        and a new Arrow array of ``columns.ARROW_TYPES[tag]``. A column key the builder has no
        values of gives ``(array('I'), an empty array)``, typed by the key's last byte when
        that is a value type tag."""
        cdef Py_ssize_t cid
        cdef uint64_t k
        self._check()
        cid = self._cid(column_key) if type(column_key) is bytes else -1
        if cid < 0 or col_rec(&self.t, <uint64_t>cid).tag == OBJECT_TAG:
            return clone(_U32, 0, False), _empty_values(column_key)
        k = clist_count_below(&self.t, &col_rec(&self.t, <uint64_t>cid).offs, _clamp_limit(limit))
        return self._copy_columns([cid], [k])[0]

    def columns(self):
        """(column key, offsets, values) of every column with values, sorted by column key:
        what a seal writes."""
        cdef uint64_t n, cid, k
        self._check()
        n = rt_ld64(&self.t.h.n_cols)
        found = []
        for cid in range(n):
            k = rt_ld32(&col_rec(&self.t, cid).offs.n)
            if k:
                found.append((self._col_key(cid), cid, k))
        found.sort()
        copies = self._copy_columns([c for _, c, _ in found], [k for _, _, k in found])
        return [(found[i][0], *copies[i]) for i in range(len(found))]

    def dense_columns(self):
        """(column key, values) of every column with values, sorted by column key, each
        array one value per row (null where the row has none): what a seal writes, made in
        C without an Arrow take."""
        cdef uint64_t n, cid, k
        self._check()
        n = rt_ld64(&self.t.h.n_cols)
        found = []
        for cid in range(n):
            k = rt_ld32(&col_rec(&self.t, cid).offs.n)
            if k:
                found.append((self._col_key(cid), cid, k))
        found.sort()
        rows = self.n_rows
        return [(ck, self._dense(cid, k, rows)) for ck, cid, k in found]

    cdef object _dense(self, uint64_t cid, uint64_t k, uint64_t n):
        """Column ``cid``'s first ``k`` values as an array of ``n`` rows (nulls elsewhere)."""
        cdef Tail* t = &self.t
        cdef CRec* c = col_rec(t, cid)
        cdef int tag = c.tag
        cdef uint32_t* offs = <uint32_t*>safe_realloc(NULL, k + 1, 4)
        cdef unsigned char* vals = NULL
        cdef unsigned char* valid_p = NULL
        cdef unsigned char* q
        cdef unsigned char* dq
        cdef uint64_t i, r, total = 0, rec
        cdef int64_t pos
        cdef uint32_t ln
        cdef int width = 8 if tag in (INT_TAG, FLOAT_TAG, TIMESTAMP_TAG, ARRAY_TAG) else 4 if tag == STRING_TAG else 1
        try:
            with nogil:
                clist_copy(t, &c.offs, k, 4, <unsigned char*>offs)
            validity = None
            if k != n:
                validity = pa.allocate_buffer((n + 7) >> 3)
                valid_p = buffer_address(validity)
                memset(valid_p, 0, (n + 7) >> 3)
                for i in range(k):
                    valid_p[offs[i] >> 3] |= <unsigned char>(1 << (offs[i] & 7))
            if tag == NULL_TAG:
                bits = pa.allocate_buffer((n + 7) >> 3)
                q = buffer_address(bits)
                if valid_p != NULL:
                    memcpy(q, valid_p, (n + 7) >> 3)
                else:
                    memset(q, 0xFF, (n + 7) >> 3)
                return pa.Array.from_buffers(ARROW_TYPES[tag], n, [validity, bits], null_count=n - k)
            vals = <unsigned char*>safe_realloc(NULL, k + 1, width)
            with nogil:
                clist_copy(t, &c.vals, k, width, vals)
            if tag == BOOL_TAG:
                bits = pa.allocate_buffer((n + 7) >> 3)
                q = buffer_address(bits)
                memset(q, 0, (n + 7) >> 3)
                for i in range(k):
                    if vals[i]:
                        q[offs[i] >> 3] |= <unsigned char>(1 << (offs[i] & 7))
                return pa.Array.from_buffers(ARROW_TYPES[tag], n, [validity, bits], null_count=n - k)
            if tag == STRING_TAG or tag == ARRAY_TAG:
                for i in range(k):
                    total += bytes_len(t, _value_rec(t, vals, i, tag))
                offsets = pa.allocate_buffer((n + 1) * 8)
                data = pa.allocate_buffer(total)
                q = buffer_address(offsets)
                dq = buffer_address(data)
                with nogil:
                    pos = 0
                    i = 0
                    for r in range(n):
                        memcpy(q + r * 8, &pos, 8)
                        if i < k and offs[i] == r:
                            rec = _value_rec(t, vals, i, tag)
                            ln = bytes_len(t, rec)
                            memcpy(dq + pos, bytes_data(t, rec), ln)
                            pos += ln
                            i += 1
                    memcpy(q + n * 8, &pos, 8)
                return pa.Array.from_buffers(ARROW_TYPES[tag], n, [validity, offsets, data], null_count=n - k)
            buf = pa.allocate_buffer(n * 8)
            q = buffer_address(buf)
            with nogil:
                if k == n:
                    memcpy(q, vals, n * 8)
                else:
                    memset(q, 0, n * 8)
                    for i in range(k):
                        memcpy(q + <uint64_t>offs[i] * 8, vals + i * 8, 8)
            return pa.Array.from_buffers(ARROW_TYPES[tag], n, [validity, buf], null_count=n - k)
        finally:
            free(offs)
            free(vals)

    cdef list _copy_columns(self, list cids, list counts):
        """(offsets, Arrow values) of the first ``counts[i]`` rows of each column ``cids[i]``."""
        cdef Tail* t = &self.t
        cdef CRec* c
        cdef uint64_t k, i, total
        cdef int tag
        cdef array offs
        cdef unsigned char* q
        cdef unsigned char* tmp = NULL
        cdef int64_t pos
        cdef uint64_t rec
        cdef uint32_t tid, ln
        cdef Py_ssize_t j
        out = []
        for j in range(len(cids)):
            c = col_rec(t, <uint64_t>cids[j])
            k = <uint64_t>counts[j]
            tag = c.tag
            offs = clone(_U32, k, False)
            with nogil:
                clist_copy(t, &c.offs, k, 4, <unsigned char*>offs.data.as_uints)
            if tag == NULL_TAG:
                bits = pa.allocate_buffer((k + 7) >> 3)
                q = buffer_address(bits)
                memset(q, 0xFF, (k + 7) >> 3)
                if k & 7:
                    q[k >> 3] = <unsigned char>((1 << (k & 7)) - 1)
                values = pa.Array.from_buffers(ARROW_TYPES[tag], k, [None, bits], null_count=0)
            elif tag == BOOL_TAG:
                bits = pa.allocate_buffer((k + 7) >> 3)
                q = buffer_address(bits)
                memset(q, 0, (k + 7) >> 3)
                tmp = <unsigned char*>safe_realloc(NULL, k + 1, 1)
                try:
                    with nogil:
                        clist_copy(t, &c.vals, k, 1, tmp)
                        for i in range(k):
                            if tmp[i]:
                                q[i >> 3] |= <unsigned char>(1 << (i & 7))
                finally:
                    free(tmp)
                    tmp = NULL
                values = pa.Array.from_buffers(ARROW_TYPES[tag], k, [None, bits], null_count=0)
            elif tag == STRING_TAG or tag == ARRAY_TAG:
                width = 4 if tag == STRING_TAG else 8
                tmp = <unsigned char*>safe_realloc(NULL, k + 1, width)
                try:
                    with nogil:
                        clist_copy(t, &c.vals, k, width, tmp)
                    total = 0
                    for i in range(k):
                        rec = _value_rec(t, tmp, i, tag)
                        total += bytes_len(t, rec)
                    offsets = pa.allocate_buffer((k + 1) * 8)
                    data = pa.allocate_buffer(total)
                    q = buffer_address(offsets)
                    dq = buffer_address(data)
                    with nogil:
                        pos = 0
                        memcpy(q, &pos, 8)
                        for i in range(k):
                            rec = _value_rec(t, tmp, i, tag)
                            ln = bytes_len(t, rec)
                            memcpy(dq + pos, bytes_data(t, rec), ln)
                            pos += ln
                            memcpy(q + (i + 1) * 8, &pos, 8)
                finally:
                    free(tmp)
                    tmp = NULL
                values = pa.Array.from_buffers(ARROW_TYPES[tag], k, [None, offsets, data], null_count=0)
            else:
                vals = pa.allocate_buffer(k * 8)
                q = buffer_address(vals)
                with nogil:
                    clist_copy(t, &c.vals, k, 8, q)
                values = pa.Array.from_buffers(ARROW_TYPES[tag], k, [None, vals], null_count=0)
            out.append((offs, values))
        return out

    def row(self, offset):
        """The JSON bytes of row ``offset`` (it must be one of the rows added)."""
        cdef uint64_t off
        cdef uint64_t rec
        self._check()
        offset = _index(offset)
        if not 0 <= offset < (self.t.n if self.t.writer else rt_ld64(&self.t.h.rows)):
            raise IndexError(f"row {offset} is not in this mutable segment")
        off = offset
        rec = (<uint64_t*>dir_get(&self.t, &self.t.h.rowpos, off, 8))[0]
        return PyBytes_FromStringAndSize(<const char*>bytes_data(&self.t, rec), bytes_len(&self.t, rec))

    cdef list _stored_rows(self, uint64_t start, uint64_t stop):
        """See ``tail_rows``."""
        cdef Tail* t = &self.t
        cdef uint64_t i, k, q, chunk, rec, end
        cdef uint32_t n
        self._check()
        end = os.fstat(t.fd).st_size if t.fd >= 0 else t.h.size
        end = min(end, t.h.size, t.mapped)
        out = []
        for i in range(start, stop):
            q = (i >> DIR_SHIFT) + 1
            k = <uint64_t>(63 - rt_clz64(q))
            chunk = rt_ld64(&t.h.rowpos.chunk[k]) if k < DIR_CHUNKS else 0
            if chunk == 0 or chunk + ((i - (((<uint64_t>1 << k) - 1) << DIR_SHIFT)) + 1) * 8 > end:
                raise ValueError(f"{self._path}: row {i} is not in the file")
            rec = (<uint64_t*>dir_get(t, &t.h.rowpos, i, 8))[0]
            if rec < sizeof(Header) or rec + 4 > end:
                raise ValueError(f"{self._path}: row {i} is not in the file")
            n = bytes_len(t, rec)
            if rec + 4 + n > end:
                raise ValueError(f"{self._path}: row {i} runs past the end of the file")
            out.append(PyBytes_FromStringAndSize(<const char*>bytes_data(t, rec), n))
        return out

    def sync(self):
        """Make the rows added so far durable against a power loss (fdatasync of the file;
        a process crash never loses them: they are in the page cache)."""
        self._check()
        if self.t.fd >= 0:
            getattr(os, "fdatasync", os.fsync)(self.t.fd)

    # ------------------------------------------------------------ seal

    cdef list _sort_prepare(self, TermSort* s):
        """Column key ranks, buckets and buffers of ``sort_terms``; returns the sorted column
        keys (kept alive meanwhile)."""
        cdef Tail* t = &self.t
        cdef uint64_t ncols = rt_ld64(&t.h.n_cols), cid
        cdef Py_ssize_t i, nck
        cdef size_t total = 0, largest = 0, nt
        cdef CRec* c
        found = sorted([(self._col_key(cid), cid, rt_ld32(&col_rec(t, cid).tids.n))
                        for cid in range(ncols) if rt_ld32(&col_rec(t, cid).tids.n)])
        nck = len(found)
        s.rank_of = <uint32_t*>safe_realloc(NULL, ncols + 1, sizeof(uint32_t))
        memset(s.rank_of, 0, (ncols + 1) * sizeof(uint32_t))
        s.ck = <const unsigned char**>safe_realloc(NULL, nck + 1, sizeof(const unsigned char*))
        s.ck_len = <Py_ssize_t*>safe_realloc(NULL, nck + 1, sizeof(Py_ssize_t))
        s.ck_tag = <unsigned char*>safe_realloc(NULL, nck + 1, sizeof(unsigned char))
        s.bucket = <size_t*>safe_realloc(NULL, nck + 1, sizeof(size_t))
        s.rank_cid = <uint32_t*>safe_realloc(NULL, nck + 1, sizeof(uint32_t))
        for i in range(nck):
            ck, cid, nt = found[i]
            c = col_rec(t, cid)
            s.rank_of[cid] = <uint32_t>i
            s.rank_cid[i] = <uint32_t>cid
            s.ck[i] = bytes_data(t, c.key)
            s.ck_len[i] = bytes_len(t, c.key)
            s.ck_tag[i] = <unsigned char>c.tag
            s.bucket[i] = total
            total += nt
            largest = max(largest, nt)
        s.bucket[nck] = total
        s.n_ranks = <size_t>nck
        s.n = total
        s.items = <SortItem*>safe_realloc(NULL, s.n + 1, sizeof(SortItem))
        s.tmp = <SortItem*>safe_realloc(NULL, largest + 1, sizeof(SortItem))
        return found

    def sorted_postings(self):
        """All (term, offsets) pairs sorted by term: what a seal writes."""
        cdef TermSort s
        cdef size_t i
        cdef array arr
        cdef uint32_t rank
        cdef uint64_t tid
        self._check()
        memset(&s, 0, sizeof(TermSort))
        out = []
        try:
            self._sort_prepare(&s)
            _sort_error(sort_terms(&s, &self.t))
            for i in range(s.n):
                tid = s.items[i].tid
                arr = clone(_U32, s.items[i].n, False)
                postings_below(&self.t, s.items[i].e, MAX_ROWS + 1, s.items[i].n, arr.data.as_uints)
                out.append((self._term_bytes(tid), arr))
        finally:
            sort_free(&s)
        return out

    def write_blocks(self, target_bytes=16384):
        """The term blocks of a seal: ``[(first_term, block), ...]``, exactly what
        ``BlockWriter(target_bytes)`` returns when fed ``sorted_postings()``, made without a
        Python object per term and without the GIL but for the roaring encodings."""
        cdef BlockWriter writer = BlockWriter(target_bytes)
        cdef TermSort s
        cdef BlockOut out
        cdef TRec* e
        cdef size_t c
        cdef int rc = 0
        cdef uint32_t rank
        cdef unsigned char buf[8]
        cdef const unsigned char* v
        cdef bytes ser
        cdef array vals
        self._check()
        memset(&s, 0, sizeof(TermSort))
        memset(&out, 0, sizeof(BlockOut))
        try:
            self._sort_prepare(&s)
            with nogil:
                rc = sort_terms(&s, &self.t)
                if rc == 0 and s.n_cand == 0:
                    rc = encode_blocks(&s, &self.t, &writer.w, &out)
            if rc == 0 and s.n_cand > 0:
                s.ser = <const unsigned char**>safe_realloc(NULL, s.n_cand, sizeof(const unsigned char*))
                s.ser_len = <Py_ssize_t*>safe_realloc(NULL, s.n_cand, sizeof(Py_ssize_t))
                sers = []
                for c in range(s.n_cand):
                    e = s.cand[c].e
                    vals = clone(_U32, s.cand[c].n, False)
                    postings_below(&self.t, e, MAX_ROWS + 1, s.cand[c].n, vals.data.as_uints)
                    ser = _roaring_ser(vals.data.as_uints, s.cand[c].n, vals)
                    if ser is None:
                        s.ser[c] = NULL
                        s.ser_len[c] = -1
                    else:
                        sers.append(ser)
                        s.ser[c] = <const unsigned char*>PyBytes_AS_STRING(ser)
                        s.ser_len[c] = PyBytes_GET_SIZE(ser)
                with nogil:
                    rc = encode_blocks(&s, &self.t, &writer.w, &out)
            _sort_error(rc)
            if rc == -2:
                raise ValueError("block larger than 4 GiB")
            if rc == -3:
                rank = s.rank_of[s.items[s.bad].e.cid]
                tlen = s.ck_len[rank] + <Py_ssize_t>term_value(&s, &s.items[s.bad], rank, buf, &v)
                raise ValueError(f"term of {tlen} bytes is too long (at most {MAX_TERM})")
            return _blockout_list(&out)
        finally:
            sort_free(&s)
            _blockout_free(&out)

    def _test_counts(self):
        """Tests only: terms, columns, path nodes, bytes of the mapping in use and held, slots of the term table."""
        self._check()
        return {"terms": self.t.h.n_terms, "columns": self.t.h.n_cols, "nodes": self.t.n_nodes,
                "used": self.t.h.used, "size": self.t.h.size,
                "slots": (<TableHead*>(self.t.map + self.t.h.table)).mask + 1}

    def _test_fail_alloc_after(self, nbytes):
        """Tests only: the mapping cannot grow past ``nbytes`` more bytes in use (an
        allocation past it fails as a full disk does)."""
        self._check_writer()
        self.t.h.reserve = min(self.t.h.reserve, self.t.h.used + _index(nbytes))


cdef inline uint64_t _value_rec(const Tail* t, const unsigned char* vals, uint64_t i, int tag) noexcept nogil:
    """The Bytes record of value ``i`` of a STRING (term ids) or ARRAY (records) column copy."""
    cdef uint32_t tid
    cdef uint64_t rec
    if tag == STRING_TAG:
        memcpy(&tid, vals + i * 4, 4)
        return term_str(tid)
    memcpy(&rec, vals + i * 8, 8)
    return rec


cdef uint64_t _clamp_limit(limit) except? 0:
    cdef object v = _index(limit)
    if v <= 0:
        return 0
    if v > MAX_ROWS + 1:
        return MAX_ROWS + 1
    return <uint64_t>v


cdef int _sort_error(int rc) except -1:
    if rc == -1:
        raise MemoryError()
    if rc == -4:  # pragma: no cover
        raise AssertionError("SegmentBuilder: the terms do not match the columns")
    return 0


cdef Py_ssize_t _first_non_finite(const unsigned char* data, const unsigned char* valid, Py_ssize_t start,
                                  Py_ssize_t n):
    """The first row of a double array that is NaN or infinite, or -1."""
    cdef Py_ssize_t i
    cdef double d
    for i in range(n):
        if valid != NULL and not bit_at(valid, start + i):
            continue
        memcpy(&d, data + (start + i) * 8, 8)
        if not isfinite(d):
            return i
    return -1


# ---------------------------------------------------------------- identifying a document from its bytes


cdef inline size_t skip_ws(const unsigned char* p, size_t i, size_t n) noexcept nogil:
    while i < n and is_ws(p[i]):
        i += 1
    return i


cdef size_t skip_string(const unsigned char* p, size_t i, size_t n) noexcept nogil:
    """The position after the string whose first byte (after its quote) is at ``i``; 0 when
    it does not end."""
    while True:
        i = rt_str_stop(p, i, n)
        if i >= n:
            return 0
        if p[i] == 0x22:
            return i + 1
        if p[i] == 0x5C:
            i += 2
        else:
            i += 1


cdef size_t skip_value(const unsigned char* p, size_t i, size_t n) noexcept nogil:
    """The position after the value at ``i`` (containers skipped by counting brackets outside
    strings, nothing validated); 0 when it does not end."""
    cdef size_t depth = 0
    cdef unsigned char c
    while i < n:
        c = p[i]
        if c == 0x22:
            i = skip_string(p, i + 1, n)
            if i == 0:
                return 0
        elif c == 0x7B or c == 0x5B:
            depth += 1
            i += 1
        elif c == 0x7D or c == 0x5D:
            if depth == 0:
                return 0
            depth -= 1
            i += 1
        elif c == 0x2C or c == 0x3A or is_ws(c):
            if depth == 0:
                return 0
            i += 1
        else:
            i += 1
            if depth == 0:  # a number or literal: up to the next delimiter
                while i < n and not (is_ws(p[i]) or p[i] == 0x2C or p[i] == 0x7D or p[i] == 0x5D):
                    i += 1
                return i
        if depth == 0:
            return i
    return 0


cdef int parse_int_token(const unsigned char* p, size_t i, size_t n, size_t* end, int64_t* out) noexcept nogil:
    """An integer token at ``i`` (no fraction or exponent) within int64: 0, else -1."""
    cdef bint neg = False
    cdef size_t start
    cdef uint64_t v = 0
    if i < n and p[i] == 0x2D:
        neg = True
        i += 1
    start = i
    if i >= n or not is_digit(p[i]):
        return -1
    if p[i] == 0x30:
        i += 1
    else:
        while i < n and is_digit(p[i]):
            if i - start >= 19:
                return -1
            v = v * 10 + (p[i] - 0x30)
            i += 1
    if i < n and (p[i] == 0x2E or p[i] == 0x65 or p[i] == 0x45):
        return -1
    if neg:
        if v > RT_SIGN:
            return -1
        out[0] = <int64_t>(0 - v)
    else:
        if v >= RT_SIGN:
            return -1
        out[0] = <int64_t>v
    end[0] = i
    return 0


def tail_rows(path, start, stop):
    """The JSON bytes of rows ``start`` .. ``stop - 1`` of the mutable segment file ``path``
    as it holds them, published or not: a restarted writer's recovery reads them, knowing
    from the row store which are durable. ValueError where the file does not hold one (cut
    short or damaged, or not such a file)."""
    start, stop = _index(start), _index(stop)
    if start < 0 or stop < start:
        raise ValueError(f"tail_rows({start}, {stop})")
    cdef SegmentBuilder b = SegmentBuilder.attach(path)
    try:
        return b._stored_rows(start, stop)
    finally:
        b.close()


def scan_top(raw):
    """What ingest needs of a JSON document before indexing it, read without parsing the
    rest: ``(status, _id, its id key, _event_time, position of the closing brace, whether
    the object has members)``.

    ``_id`` is a str, an int or None (absent), and its id key the one
    ``documents.encode_id`` makes; ``_event_time`` an int or None (absent). ``status`` 0:
    all of that is known; 1: something is unusual (``_id`` of another type, or too long,
    or with an escape that is not plain; ``_event_time`` not an integer; either twice):
    parse the document; 2: the bytes are not one JSON object as far as this scan can tell.
    """
    cdef const unsigned char* p
    cdef size_t n, i, j, ks, kl
    cdef Py_ssize_t nm = 0
    cdef int64_t v
    cdef bint key_escaped
    cdef unsigned char c
    if type(raw) is not bytes:
        raise TypeError(f"scan_top takes bytes, not {type(raw).__name__}")
    p = <const unsigned char*>PyBytes_AS_STRING(raw)
    n = <size_t>PyBytes_GET_SIZE(raw)
    doc_id = et = id_key = None
    status = 0
    i = skip_ws(p, 0, n)
    if i >= n or p[i] != 0x7B:
        return 2, None, None, None, 0, False
    i = skip_ws(p, i + 1, n)
    if i < n and p[i] == 0x7D:
        close = i
        if skip_ws(p, i + 1, n) != n:
            return 2, None, None, None, 0, False
        return 0, None, None, None, close, False
    while True:
        if i >= n or p[i] != 0x22:
            return 2, None, None, None, 0, False
        ks = i + 1
        j = skip_string(p, ks, n)
        if j == 0:
            return 2, None, None, None, 0, False
        kl = j - 1 - ks
        key_escaped = memchr(p + ks, 0x5C, kl) != NULL
        i = skip_ws(p, j, n)
        if i >= n or p[i] != 0x3A:
            return 2, None, None, None, 0, False
        i = skip_ws(p, i + 1, n)
        if i >= n:
            return 2, None, None, None, 0, False
        nm += 1
        if key_escaped:
            status = 1  # (might spell _id)
        if not key_escaped and kl == 3 and memcmp(p + ks, b"_id", 3) == 0:
            if doc_id is not None or id_key is not None:
                status = 1
            c = p[i]
            if c == 0x22:
                j = skip_string(p, i + 1, n)
                if j == 0:
                    return 2, None, None, None, 0, False
                if memchr(p + i + 1, 0x5C, j - 2 - i) != NULL or j - 2 - i > 1024:
                    status = 1
                else:
                    try:
                        doc_id = PyUnicode_DecodeUTF8(<const char*>(p + i + 1), <Py_ssize_t>(j - 2 - i), "strict")
                    except UnicodeDecodeError:
                        return 2, None, None, None, 0, False
                    id_key = b"\x05" + (<bytes>p[i + 1:j - 1]).replace(b"\x00", b"\x00\xff") + b"\x00\x00"
                i = j
            elif c == 0x2D or is_digit(c):
                if parse_int_token(p, i, n, &j, &v) < 0:
                    status = 1
                    j = skip_value(p, i, n)
                    if j == 0:
                        return 2, None, None, None, 0, False
                else:
                    doc_id = v
                    id_key = b"\x03" + (<uint64_t>v ^ RT_SIGN).to_bytes(8, "big")
                i = j
            else:
                status = 1
                i = skip_value(p, i, n)
                if i == 0:
                    return 2, None, None, None, 0, False
        elif not key_escaped and kl == 11 and memcmp(p + ks, b"_event_time", 11) == 0:
            if et is not None:
                status = 1
            if parse_int_token(p, i, n, &j, &v) < 0:
                status = 1
                j = skip_value(p, i, n)
                if j == 0:
                    return 2, None, None, None, 0, False
            else:
                et = v
            i = j
        else:
            i = skip_value(p, i, n)
            if i == 0:
                return 2, None, None, None, 0, False
        i = skip_ws(p, i, n)
        if i >= n:
            return 2, None, None, None, 0, False
        if p[i] == 0x2C:
            i = skip_ws(p, i + 1, n)
            continue
        if p[i] == 0x7D:
            close = i
            if skip_ws(p, i + 1, n) != n:
                return 2, None, None, None, 0, False
            return status, doc_id, id_key, et, close, nm > 0
        return 2, None, None, None, 0, False


def identify_texts(list texts, int64_t now_us, Py_ssize_t max_bytes, int64_t et_min, int64_t et_max, new_ids):
    """What ingest needs of each JSON document of ``texts`` (bytes) before indexing it, read
    by ``scan_top`` without parsing the rest: ``(_id, its id key, the text to store, whether
    the _id was generated)``, the text stripped of surrounding whitespace and with ``_id``
    (from ``new_ids(k)``, k str ids, called once) and ``_event_time`` (``now_us``) added at
    its end where missing;
    ``(_id or None, size)`` for a text over ``max_bytes`` bytes (as given, or with what was
    added); None for one that must be parsed (``scan_top`` cannot read it whole, or its
    ``_event_time`` is outside ``[et_min, et_max)``)."""
    cdef bytes et_text = b'"_event_time":' + str(now_us).encode()
    cdef bytes raw, idb, out_raw
    cdef const unsigned char* p
    cdef unsigned char* q
    cdef Py_ssize_t n, a, b, size
    cdef bint generated, add_et
    scans = [scan_top(raw) for raw in texts]
    fresh = iter(new_ids(sum(1 for sc in scans if sc[0] == 0 and sc[1] is None)))
    out = []
    for raw, sc in zip(texts, scans):
        status, doc_id, id_key, et, close, members = sc
        if status != 0:
            out.append(None)
            continue
        n = PyBytes_GET_SIZE(raw)
        if n > max_bytes:
            out.append((doc_id, n))
            continue
        if et is not None and not et_min <= et < et_max:
            out.append(None)
            continue
        p = <const unsigned char*>PyBytes_AS_STRING(raw)
        generated = doc_id is None
        add_et = et is None
        if not generated and not add_et:  # as given, without surrounding whitespace
            a = 0
            b = n
            while a < b and is_ws(p[a]):
                a += 1
            while b > a and is_ws(p[b - 1]):
                b -= 1
            out.append((doc_id, id_key, raw if a == 0 and b == n else raw[a:b], False))
            continue
        idb = b""
        if generated:
            doc_id = next(fresh)
            idb = b'"_id":"' + (<str>doc_id).encode() + b'"'
            id_key = b"\x05" + (<str>doc_id).encode().replace(b"\x00", b"\x00\xff") + b"\x00\x00"
        b = <Py_ssize_t>close
        while b > 0 and is_ws(p[b - 1]):
            b -= 1
        size = b + (1 if members else 0) + len(idb) + (1 if generated and add_et else 0) + \
            (len(et_text) if add_et else 0) + 1
        if size > max_bytes:
            out.append((doc_id, size))
            continue
        out_raw = PyBytes_FromStringAndSize(NULL, size)
        q = <unsigned char*>PyBytes_AS_STRING(out_raw)
        memcpy(q, p, b)
        a = b
        if members:
            q[a] = 0x2C
            a += 1
        if generated:
            memcpy(q + a, PyBytes_AS_STRING(idb), len(idb))
            a += len(idb)
            if add_et:
                q[a] = 0x2C
                a += 1
        if add_et:
            memcpy(q + a, PyBytes_AS_STRING(et_text), len(et_text))
            a += len(et_text)
        q[a] = 0x7D
        out.append((doc_id, id_key, out_raw, generated))
    return out


def split_array(data, Py_ssize_t start=0):
    """The elements of the JSON array at ``data[start:]`` (its last byte ends the text, but
    for whitespace) as bytes each, found without parsing them: what ingest takes a JSON
    array's documents as. None when the text is not an array this scan can split (it reads
    strings and brackets only): the caller parses it, and says what is wrong."""
    cdef const unsigned char* p
    cdef size_t n, i, j, e
    if type(data) is not bytes:
        raise TypeError(f"split_array takes bytes, not {type(data).__name__}")
    p = <const unsigned char*>PyBytes_AS_STRING(data)
    n = <size_t>PyBytes_GET_SIZE(data)
    if start < 0 or <size_t>start > n:
        return None
    i = skip_ws(p, <size_t>start, n)
    if i >= n or p[i] != 0x5B:
        return None
    out = []
    i = skip_ws(p, i + 1, n)
    if i < n and p[i] == 0x5D:
        return out if skip_ws(p, i + 1, n) == n else None
    while True:
        j = skip_value(p, i, n)
        if j == 0:
            return None
        out.append(data[i:j])
        e = skip_ws(p, j, n)
        if e >= n:
            return None
        if p[e] == 0x2C:
            i = skip_ws(p, e + 1, n)
            continue
        if p[e] == 0x5D:
            return out if skip_ws(p, e + 1, n) == n else None
        return None


def member_span(data, key):
    """``(start, end)`` of the value of the top-level member ``key`` (a str) of the JSON
    object ``data``, found without parsing the rest; None when there is no such member (or
    the text is not an object this scan can read)."""
    cdef const unsigned char* p
    cdef size_t n, i, j, ks, kl
    cdef bytes k = key.encode("utf-8")
    if type(data) is not bytes:
        raise TypeError(f"member_span takes bytes, not {type(data).__name__}")
    p = <const unsigned char*>PyBytes_AS_STRING(data)
    n = <size_t>PyBytes_GET_SIZE(data)
    i = skip_ws(p, 0, n)
    if i >= n or p[i] != 0x7B:
        return None
    i = skip_ws(p, i + 1, n)
    while i < n and p[i] == 0x22:
        ks = i + 1
        j = skip_string(p, ks, n)
        if j == 0:
            return None
        kl = j - 1 - ks
        i = skip_ws(p, j, n)
        if i >= n or p[i] != 0x3A:
            return None
        i = skip_ws(p, i + 1, n)
        j = skip_value(p, i, n)
        if j == 0:
            return None
        if kl == <size_t>len(k) and memcmp(p + ks, <const char*>k, kl) == 0:
            return i, j
        i = skip_ws(p, j, n)
        if i < n and p[i] == 0x2C:
            i = skip_ws(p, i + 1, n)
    return None


cdef enum:
    CHECK_DEPTH = 512  # nesting check_value follows (deeper: left to the parse)


cdef size_t check_string(const unsigned char* p, size_t i, size_t n) noexcept nogil:
    """The position after the JSON string whose first byte (after its quote) is at ``i``,
    checked as a strict parser checks it (no control byte, escapes of JSON's grammar,
    surrogates in pairs, valid UTF-8); 0 when it is not one."""
    cdef int32_t u, lo
    cdef int k
    while i < n:
        if p[i] == 0x22:
            return i + 1
        if p[i] < 0x20:
            return 0
        if p[i] >= 0x80:
            k = utf8_len(p, i, n)
            if k == 0:
                return 0
            i += k
            continue
        if p[i] != 0x5C:
            i += 1
            continue
        if i + 1 >= n:
            return 0
        if p[i + 1] != 0x75:
            if memchr(b'"\\/bfnrt', p[i + 1], 8) == NULL:
                return 0
            i += 2
            continue
        u = hex4(p, i + 2, n)
        if u < 0 or 0xDC00 <= u <= 0xDFFF:
            return 0
        i += 6
        if 0xD800 <= u <= 0xDBFF:
            if i + 1 >= n or p[i] != 0x5C or p[i + 1] != 0x75:
                return 0
            lo = hex4(p, i + 2, n)
            if not 0xDC00 <= lo <= 0xDFFF:
                return 0
            i += 6
    return 0


cdef size_t check_number(const unsigned char* p, size_t i, size_t n) noexcept nogil:
    """The position after the JSON number at ``i`` (its grammar, and finite as a double,
    as a parser reads one), 0 when it is not one."""
    cdef size_t start = i
    cdef char buf[512]
    if i < n and p[i] == 0x2D:
        i += 1
    if i >= n or not is_digit(p[i]):
        return 0
    if p[i] == 0x30:
        i += 1
    else:
        while i < n and is_digit(p[i]):
            i += 1
    if i < n and p[i] == 0x2E:
        i += 1
        if i >= n or not is_digit(p[i]):
            return 0
        while i < n and is_digit(p[i]):
            i += 1
    if i < n and (p[i] == 0x65 or p[i] == 0x45):
        i += 1
        if i < n and (p[i] == 0x2B or p[i] == 0x2D):
            i += 1
        if i >= n or not is_digit(p[i]):
            return 0
        while i < n and is_digit(p[i]):
            i += 1
    if i - start > 17 or memchr(p + start, 0x65, i - start) != NULL or memchr(p + start, 0x45, i - start) != NULL:
        # long enough, or an exponent big enough, not to be a finite double: strtod says
        if i - start >= sizeof(buf):
            return 0  # (the parse says)
        memcpy(buf, p + start, i - start)
        buf[i - start] = 0
        if not isfinite(strtod(buf, NULL)):
            return 0
    return i


cdef size_t check_value(const unsigned char* p, size_t i, size_t n, int depth) noexcept nogil:
    """The position after the JSON value at ``i`` (whitespace before it skipped), checked
    against JSON's grammar; 0 when it is not one, or nests deeper than CHECK_DEPTH."""
    cdef unsigned char c, close
    i = skip_ws(p, i, n)
    if i >= n or depth > CHECK_DEPTH:
        return 0
    c = p[i]
    if c == 0x22:
        return check_string(p, i + 1, n)
    if c == 0x7B or c == 0x5B:
        close = 0x7D if c == 0x7B else 0x5D
        i = skip_ws(p, i + 1, n)
        if i < n and p[i] == close:
            return i + 1
        while True:
            if c == 0x7B:
                if i >= n or p[i] != 0x22:
                    return 0
                i = check_string(p, i + 1, n)
                if i == 0:
                    return 0
                i = skip_ws(p, i, n)
                if i >= n or p[i] != 0x3A:
                    return 0
                i += 1
            i = check_value(p, i, n, depth + 1)
            if i == 0:
                return 0
            i = skip_ws(p, i, n)
            if i < n and p[i] == 0x2C:
                i = skip_ws(p, i + 1, n)
                continue
            return i + 1 if i < n and p[i] == close else 0
    if c == 0x74:
        return i + 4 if i + 4 <= n and memcmp(p + i, b"true", 4) == 0 else 0
    if c == 0x66:
        return i + 5 if i + 5 <= n and memcmp(p + i, b"false", 5) == 0 else 0
    if c == 0x6E:
        return i + 4 if i + 4 <= n and memcmp(p + i, b"null", 4) == 0 else 0
    return check_number(p, i, n)


def top_rewrite(data, tuple keys, Py_ssize_t n_drop, tuple renames, tuple reads):
    """What an ingest transformation needs to rewrite the JSON object ``data`` without
    parsing it: ``(kept, values)``. ``keys`` are top-level keys (bytes, as written between
    the quotes); the members of the first ``n_drop`` are left out of ``kept``, the text of
    the other members joined by commas (without the braces); where ``renames[k]`` is not
    None (``b'"new":'``), ``kept`` also has the value of ``keys[k]`` under that name, unless
    it is null. ``values`` is a JSON array of the values of ``keys[k]`` for each k of
    ``reads`` (null where absent). None when the scan cannot tell: not one object, a key
    with an escape, one of ``keys`` twice, text after the closing brace, a dropped value
    that is not JSON (the others are skipped here: the indexer checks what is kept, and
    the values read are parsed)."""
    cdef const unsigned char* p
    cdef size_t n, i, j, ks, kl, vs, ms, room
    cdef Py_ssize_t nk = len(keys), k, found
    cdef const char** kp = NULL
    cdef size_t* kn = NULL
    cdef const char** rp = NULL
    cdef size_t* rl = NULL
    cdef unsigned char* out = NULL
    cdef size_t used = 0
    cdef bint ok = False
    cdef int64_t* at = NULL
    cdef size_t vlen = 2
    if type(data) is not bytes:
        raise TypeError(f"top_rewrite takes bytes, not {type(data).__name__}")
    if len(renames) != nk:
        raise ValueError("top_rewrite takes one rename (or None) a key")
    for key in keys:
        if type(key) is not bytes:
            raise TypeError("top_rewrite takes keys as bytes")
    p = <const unsigned char*>PyBytes_AS_STRING(data)
    n = <size_t>PyBytes_GET_SIZE(data)
    room = 2 * n + 1
    for new in renames:
        if new is not None:
            if type(new) is not bytes:
                raise TypeError("top_rewrite takes renames as bytes")
            room += PyBytes_GET_SIZE(new) + 1
    for k in reads:
        if not 0 <= k < nk:
            raise ValueError("top_rewrite reads a key it is not given")
    at = <int64_t*>malloc((2 * nk + 1) * sizeof(int64_t))
    kp = <const char**>malloc((nk + 1) * sizeof(char*))
    kn = <size_t*>malloc((nk + 1) * sizeof(size_t))
    rp = <const char**>malloc((nk + 1) * sizeof(char*))
    rl = <size_t*>malloc((nk + 1) * sizeof(size_t))
    out = <unsigned char*>malloc(room)
    if at == NULL or kp == NULL or kn == NULL or rp == NULL or rl == NULL or out == NULL:
        free(at); free(kp); free(kn); free(rp); free(rl); free(out)
        raise MemoryError()
    try:
        for k in range(nk):
            kp[k] = PyBytes_AS_STRING(<bytes>PyTuple_GET_ITEM(keys, k))
            kn[k] = <size_t>PyBytes_GET_SIZE(<bytes>PyTuple_GET_ITEM(keys, k))
            new = <object>PyTuple_GET_ITEM(renames, k)
            rp[k] = PyBytes_AS_STRING(<bytes>new) if new is not None else NULL
            rl[k] = <size_t>PyBytes_GET_SIZE(<bytes>new) if new is not None else 0
            at[2 * k] = at[2 * k + 1] = -1
        with nogil:
            i = skip_ws(p, 0, n)
            if i < n and p[i] == 0x7B:
                i = skip_ws(p, i + 1, n)
                if i < n and p[i] == 0x7D:
                    ok = skip_ws(p, i + 1, n) == n
                else:
                    while i < n and p[i] == 0x22:
                        ms = i
                        ks = i + 1
                        j = skip_string(p, ks, n)
                        if j == 0:
                            break
                        kl = j - 1 - ks
                        if memchr(p + ks, 0x5C, kl) != NULL:
                            break
                        found = -1
                        for k in range(nk):
                            if kn[k] == kl and memcmp(p + ks, kp[k], kl) == 0:
                                found = k
                                break
                        i = skip_ws(p, j, n)
                        if i >= n or p[i] != 0x3A:
                            break
                        vs = skip_ws(p, i + 1, n)
                        j = skip_value(p, vs, n)
                        if j == 0:
                            break
                        if found >= 0 and found < n_drop and check_value(p, vs, j, 0) != j:
                            break  # a dropped value that is not JSON: the parse says what is wrong
                        if found >= 0:
                            if at[2 * found] >= 0:
                                break  # a key twice: the parse decides which one counts
                            at[2 * found] = <int64_t>vs
                            at[2 * found + 1] = <int64_t>j
                        if found < 0 or found >= n_drop:
                            if used:
                                out[used] = 0x2C
                                used += 1
                            memcpy(out + used, p + ms, j - ms)
                            used += j - ms
                        if found >= 0 and rp[found] != NULL and not (j - vs == 4 and memcmp(p + vs, b"null", 4) == 0):
                            if used:
                                out[used] = 0x2C
                                used += 1
                            memcpy(out + used, rp[found], rl[found])
                            used += rl[found]
                            memcpy(out + used, p + vs, j - vs)
                            used += j - vs
                        i = skip_ws(p, j, n)
                        if i < n and p[i] == 0x2C:
                            i = skip_ws(p, i + 1, n)
                            continue
                        ok = i < n and p[i] == 0x7D and skip_ws(p, i + 1, n) == n
                        break
        if not ok:
            return None
        kept = PyBytes_FromStringAndSize(<const char*>out, used)
        for k in reads:
            vlen += <size_t>(at[2 * k + 1] - at[2 * k]) + 1 if at[2 * k] >= 0 else 5
        if vlen > room:
            free(out)
            out = <unsigned char*>malloc(vlen)
            if out == NULL:
                raise MemoryError()
        used = 1
        out[0] = 0x5B
        for k in reads:
            if used > 1:
                out[used] = 0x2C
                used += 1
            if at[2 * k] >= 0:
                memcpy(out + used, p + at[2 * k], <size_t>(at[2 * k + 1] - at[2 * k]))
                used += <size_t>(at[2 * k + 1] - at[2 * k])
            else:
                memcpy(out + used, b"null", 4)
                used += 4
        out[used] = 0x5D
        return kept, PyBytes_FromStringAndSize(<const char*>out, used + 1)
    finally:
        free(at); free(kp); free(kn); free(rp); free(rl); free(out)


def nonfinite_path(doc):
    """``(path, value)`` of the first NaN or infinite float in ``doc`` (dicts, lists and
    tuples nested, in the order orjson serializes them), or None: orjson writes such a float
    as null, and a document holding one is refused instead."""
    cdef PyObject* keys[NONFINITE_DEPTH]
    cdef Py_ssize_t idx[NONFINITE_DEPTH]
    cdef PyObject* found = NULL
    cdef int depth = _nonfinite(<PyObject*>doc, keys, idx, 0, &found)
    if depth < 0:
        return None
    return [<object>keys[i] if keys[i] != NULL else idx[i] for i in range(depth)], <object>found


cdef enum:
    NONFINITE_DEPTH = 256  # nesting nonfinite_path looks into (deeper documents are refused by depth anyway)


cdef int _nonfinite(PyObject* v, PyObject** keys, Py_ssize_t* idx, int depth, PyObject** found) noexcept:
    """The depth of the first non-finite float below ``v`` (its path in keys/idx), or -1.
    Borrowed references throughout: nothing is allocated unless found."""
    cdef Py_ssize_t pos = 0, i, n
    cdef PyObject* k
    cdef PyObject* x
    cdef PyTypeObject* t = rt_type(v)
    cdef PyTypeObject* t2
    cdef int r
    if t == &PyFloat_Type:
        if isfinite(PyFloat_AS_DOUBLE(<object>v)):
            return -1
        found[0] = v
        return depth
    if depth >= NONFINITE_DEPTH:
        return -1
    if t == &PyDict_Type or (t != &PyList_Type and PyDict_Check(<object>v)):
        while PyDict_Next(<object>v, &pos, &k, &x):
            t2 = rt_type(x)
            if t2 == &PyUnicode_Type or t2 == &PyLong_Type or t2 == &PyBool_Type or x == <PyObject*>None:
                continue
            r = _nonfinite(x, keys, idx, depth + 1, found)
            if r >= 0:
                keys[depth] = k
                return r
    elif t == &PyList_Type or t == &PyTuple_Type:
        n = rt_size(v)
        for i in range(n):
            x = PyList_GET_ITEM(<object>v, i) if t == &PyList_Type else PyTuple_GET_ITEM(<object>v, i)
            t2 = rt_type(x)
            if t2 == &PyUnicode_Type or t2 == &PyLong_Type or t2 == &PyBool_Type or x == <PyObject*>None:
                continue
            r = _nonfinite(x, keys, idx, depth + 1, found)
            if r >= 0:
                keys[depth] = NULL
                idx[depth] = i
                return r
    elif PyFloat_Check(<object>v) and not isfinite(PyFloat_AS_DOUBLE(<object>v)):
        found[0] = v
        return depth
    return -1


def _empty_values(column_key):
    tag = column_key[len(column_key) - 1] if isinstance(column_key, bytes) and column_key else None
    return pa.array([], type=ARROW_TYPES.get(tag, pa.null()))
