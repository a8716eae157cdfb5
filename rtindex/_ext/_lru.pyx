"""Compiled row cache: the same results as ``rtindex/_py/lru.py``, in C data structures.

``rtindex/_py/lru.py`` is the contract (its docstring states the semantics and the counters);
tests/test_lru.py runs one model-based state machine against both implementations.

This is the database's RowStoreCache: one LRU of decoded rows (Python dicts) across all
shards, keyed by a uint64 (shard number and row id, packed by the caller), under a byte
budget. Row ids are never reused, so an entry is never stale: the cache only has to be a
fast, correct, bounded LRU. No Python dict inside:

- an entry array of ``Entry`` (key, an owned reference to the value, the bytes charged, and
  prev/next indexes of an intrusive doubly linked LRU list), with a free list of entries;
- an open-addressing hash table of ``Slot`` (key, entry index + 1): linear probing, a power
  of two slots at load <= 1/2, doubled by rehashing from the keys it stores, deletion by
  backward shift (no tombstones). Keys are hashed with splitmix64's finalizer (xor a secret
  per-process seed) so that sequential row ids spread over the table;
- ``get_many``/``put_many`` run one C loop over a buffer of 64-bit integers (``array('Q')``,
  a numpy uint64 or int64 vector, any 1-D buffer of format Q/L/q/l, strides allowed) or over
  a list/tuple of ints (any other iterable is made a list first, any other buffer is
  iterated, as the reference does). Keys are validated like the reference's: TypeError for
  non-ints (bool included), OverflowError outside 0 .. 2**64-1, raised at the first bad key
  after the keys before it took effect, exactly as ``[get(k) for k in keys]`` would.

Differences from the reference, both deliberate: ``capacity_bytes`` must be below 2**63
(ValueError otherwise; so no byte sum ever overflows uint64), and buffers of 64-bit
integers are accepted as keys (the reference iterates them: numpy scalars are not ints).

Thread safety, and why a finalizer cannot corrupt the cache
-----------------------------------------------------------
Every method runs holding the GIL and never releases it. The GIL could still pass to another
thread, or the cache be re-entered from the same thread, if arbitrary Python code ran in the
middle of a method: that happens only through (a) error paths (formatting an error message,
``isinstance``), (b) a Py_DECREF that frees an object whose finalizer (``__del__``, a weakref
callback) runs Python code, and (c) the cyclic GC, which can start in any allocation of a
GC-tracked object and runs finalizers. So:

- (a) every argument is validated before the structures are touched for that key, and an
  error is raised between keys, when everything is consistent (like the reference);
- (b) no value is DECREF'd while a method runs: an evicted, replaced, discarded or cleared
  value stays in its entry, which is chained into a *release chain* local to the call (the
  entry is in neither the LRU list, the table nor the free list). When the structures are
  consistent again and the budget holds, ``_release`` walks the chain: it puts each entry
  on the free list and only then DECREFs its value. A finalizer that re-enters the cache
  (even ``put``/``clear``, even growing the arrays) sees a consistent cache, and the chain it
  has not reached yet is private to this call; ``_release`` re-reads ``self._ents`` after
  every DECREF because a re-entrant put may have moved it;
- (c) the only GC-tracked allocations are made before the loops (the result list of
  ``get_many``, ``list(keys)``) or after them (``stats``); while the structures are being
  changed only C memory is allocated (``safe_realloc``), and ints (not GC-tracked) in
  ``keys_lru``, whose walk changes nothing.

A MemoryError can only come from growing the table or the entry array, which happens before
the put that needs it changes anything. ``__dealloc__`` detaches the arrays before it
DECREFs the values (nothing can reach a cache being deallocated: it has no weakref slot).
The cache does not take part in the cyclic GC: its values are decoded JSON, which cannot
refer back to it (a value that does keeps the cache alive until it is evicted).
"""

cimport cython
from cpython.buffer cimport PyBUF_FORMAT, PyBUF_STRIDES, PyBuffer_Release, PyObject_CheckBuffer
from cpython.dict cimport PyDict_Copy, PyDict_Next, PyDict_SetItem
from cpython.exc cimport PyErr_Clear, PyErr_Occurred
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_GetSlice
from cpython.object cimport PyObject
from cpython.sequence cimport PySequence_Fast_GET_ITEM, PySequence_Fast_GET_SIZE
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcpy, memset

from rtindex._ext._types cimport safe_realloc

import os

cdef extern from "Python.h":
    bint PyLong_Check(object o)
    bint PyBool_Check(object o)
    bint PyDict_CheckExact(object o)
    bint PyList_CheckExact(object o)
    bint PyDict_Check(object o)
    bint PyList_Check(object o)
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1
    # No exception check by Cython: the caller tests the result and clears the error.
    unsigned long long _as_ull "PyLong_AsUnsignedLongLong"(object o) noexcept
    int _get_buffer "PyObject_GetBuffer"(object o, Py_buffer* view, int flags) noexcept
    void Py_LeaveRecursiveCall()
    const int PY_LITTLE_ENDIAN

cdef extern from *:
    """
    #define RC_NIL 0xFFFFFFFFu
    #define RC_MIX1 0xBF58476D1CE4E5B9ULL
    #define RC_MIX2 0x94D049BB133111EBULL
    #define rc_prefetch(p) __builtin_prefetch(p)
    #define rc_incref(o) Py_INCREF(o)
    #define rc_decref(o) Py_DECREF(o)
    /* Whether o is a dict or a list (or a subclass of either): one flags test. */
    #define rc_is_container(o) \\
        PyType_HasFeature(Py_TYPE(o), Py_TPFLAGS_DICT_SUBCLASS | Py_TPFLAGS_LIST_SUBCLASS)
    /* Store a new reference to v at list[i], which holds None (never freed by a DECREF). */
    static inline void rc_list_put(PyObject* list, Py_ssize_t i, PyObject* v) {
        PyObject* old = PyList_GET_ITEM(list, i);
        Py_INCREF(v);
        PyList_SET_ITEM(list, i, v);
        Py_DECREF(old);
    }
    static inline int rc_enter(void) {
        return Py_EnterRecursiveCall(" in copy_json") ? -1 : 0;
    }
    """
    const uint32_t NIL "RC_NIL"
    const uint64_t RC_MIX1
    const uint64_t RC_MIX2
    void rc_prefetch(const void* p) noexcept nogil
    void rc_incref(PyObject* o) noexcept
    void rc_decref(PyObject* o) noexcept
    bint rc_is_container(PyObject* o) noexcept
    void rc_list_put(object lst, Py_ssize_t i, PyObject* v) noexcept
    int rc_enter() except -1

cdef enum:
    TABLE_MIN = 16  # initial table slots (a power of two)
    ENTS_MIN = 16  # initial entry array
    PREFETCH = 8  # get_many: prefetch the table slot of the key this far ahead

cdef uint32_t MAX_ENTS = 0xFFFFFFFF  # entry indexes stay below NIL
cdef uint64_t CAP_LIMIT = 0x8000000000000000  # capacity_bytes must be below 2**63
cdef uint64_t HUGE = 0xFFFFFFFFFFFFFFFF  # nbytes of 2**63 or more: above any capacity
# Secret per process, so that crafted keys cannot be made to collide in the table.
cdef uint64_t _SEED = int.from_bytes(os.urandom(8), "little")

KEY_MAX = (1 << 64) - 1

__all__ = ["KEY_MAX", "RowCache", "copy_json"]


# ---------------------------------------------------------------- C helpers


cdef inline uint64_t mix(uint64_t key) noexcept nogil:
    """Slot hash of ``key``: splitmix64's finalizer of the seeded key."""
    cdef uint64_t z = key ^ _SEED
    z = (z ^ (z >> 30)) * RC_MIX1
    z = (z ^ (z >> 27)) * RC_MIX2
    return z ^ (z >> 31)


cdef int bad_key(object k) except -1:
    """Raise the reference's error for a key that is not an int in 0 .. 2**64-1."""
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"row cache keys are ints, not {type(k).__name__}")
    raise OverflowError(f"row cache key {k} is outside 0 .. 2**64-1")


cdef inline int key_of(object k, uint64_t* out) except -1:
    """``out[0] = k`` for an int in 0 .. 2**64-1 (runs no Python code); else the error."""
    cdef int overflow = 0
    cdef long long v
    cdef unsigned long long u
    if PyLong_Check(k) and not PyBool_Check(k):
        v = PyLong_AsLongLongAndOverflow(k, &overflow)
        if overflow == 0:
            if v >= 0:
                out[0] = <uint64_t>v
                return 0
        elif overflow > 0:  # 2**63 or more
            u = _as_ull(k)
            if u != <unsigned long long>-1 or PyErr_Occurred() == NULL:
                out[0] = u
                return 0
            PyErr_Clear()
    return bad_key(k)


cdef inline int nbytes_of(object n, uint64_t* out) except -1:
    """``out[0] = n`` for an int >= 0 (HUGE from 2**63 on: above any capacity); else ValueError."""
    cdef int overflow = 0
    cdef long long v
    if PyLong_Check(n) and not PyBool_Check(n):
        v = PyLong_AsLongLongAndOverflow(n, &overflow)
        if overflow > 0:
            out[0] = HUGE
            return 0
        if overflow == 0 and v >= 0:
            out[0] = <uint64_t>v
            return 0
    raise ValueError(f"nbytes must be a non-negative int, not {n!r}")


cdef int buffer_kind(const Py_buffer* b) noexcept:
    """1: a vector of uint64, 2: of int64, 0: anything else."""
    cdef const char* f = b.format
    if b.ndim != 1 or b.itemsize != 8 or f == NULL:
        return 0
    if f[0] == b'@' or f[0] == b'=':
        f += 1
    elif f[0] == b'<':
        if not PY_LITTLE_ENDIAN:
            return 0
        f += 1
    elif f[0] == b'>' or f[0] == b'!':
        if PY_LITTLE_ENDIAN:
            return 0
        f += 1
    if f[0] == 0 or f[1] != 0:
        return 0
    if f[0] == b'Q' or f[0] == b'L':
        return 1
    if f[0] == b'q' or f[0] == b'l':
        return 2
    return 0


cdef int open_buffer(object obj, Py_buffer* view) noexcept:
    """1 or 2 (see buffer_kind) with ``view`` holding ``obj``'s buffer, to be released; 0
    (nothing held) when ``obj`` is not a 1-D buffer of 64-bit integers."""
    cdef int kind
    if not PyObject_CheckBuffer(obj):
        return 0
    if _get_buffer(obj, view, PyBUF_FORMAT | PyBUF_STRIDES) < 0:
        PyErr_Clear()  # e.g. an exporter that refuses strides: iterate it instead
        return 0
    kind = buffer_kind(view)
    if kind == 0:
        PyBuffer_Release(view)
    return kind


cdef inline uint64_t buf_u64(const char* data, Py_ssize_t i, Py_ssize_t stride) noexcept nogil:
    cdef uint64_t v
    memcpy(&v, data + i * stride, 8)  # the buffer need not be aligned
    return v


cdef object as_seq(object o):
    """``o`` if a list or tuple, else ``list(o)`` (the reference's iteration and errors)."""
    if type(o) is list or type(o) is tuple:
        return o
    return list(o)


# ---------------------------------------------------------------- the cache


@cython.final
@cython.auto_pickle(False)
cdef class RowCache:
    """An LRU of objects under a byte budget (see ``rtindex._py.lru``).

    Compiled twin of ``rtindex._py.lru.RowCache``: same methods, same results.
    """

    def __cinit__(self, capacity_bytes):
        self._lru = self._mru = self._free = NIL
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be a non-negative int, not {capacity_bytes!r}")
        if capacity_bytes >= CAP_LIMIT:
            raise ValueError(f"capacity_bytes must be below 2**63, not {capacity_bytes!r}")
        self._cap = capacity_bytes
        self._table = <Slot*>safe_realloc(NULL, TABLE_MIN, sizeof(Slot))
        memset(self._table, 0, TABLE_MIN * sizeof(Slot))
        self._mask = TABLE_MIN - 1

    def __dealloc__(self):
        cdef Entry* ents = self._ents
        cdef uint32_t i, n = self._n_ents
        cdef PyObject* v
        # Detach first: a finalizer run by a DECREF below sees an empty cache (none can
        # reach this one, but nothing is left half-freed either way).
        self._ents = NULL
        self._n_ents = self._cap_ents = 0
        self._count = 0
        self._lru = self._mru = self._free = NIL
        if self._table != NULL:
            free(self._table)
            self._table = NULL
        if ents != NULL:
            for i in range(n):
                v = ents[i].value
                if v != NULL:
                    ents[i].value = NULL
                    rc_decref(v)
            free(ents)

    # ------------------------------------------------------------ C structures

    cdef uint32_t _find(self, uint64_t key) noexcept nogil:
        """The entry of ``key``, or NIL."""
        cdef size_t mask = self._mask
        cdef size_t i = mix(key) & mask
        cdef const Slot* t = self._table
        while t[i].ent1:
            if t[i].key == key:
                return t[i].ent1 - 1
            i = (i + 1) & mask
        return NIL

    cdef void _unlink(self, uint32_t e) noexcept nogil:
        """Take entry ``e`` out of the LRU list."""
        cdef Entry* ents = self._ents
        cdef uint32_t p = ents[e].prev, n = ents[e].next
        if p == NIL:
            self._lru = n
        else:
            ents[p].next = n
        if n == NIL:
            self._mru = p
        else:
            ents[n].prev = p

    cdef void _push_mru(self, uint32_t e) noexcept nogil:
        """Append entry ``e`` (not in the list) at the MRU end."""
        cdef Entry* ents = self._ents
        ents[e].prev = self._mru
        ents[e].next = NIL
        if self._mru == NIL:
            self._lru = e
        else:
            ents[self._mru].next = e
        self._mru = e

    cdef void _touch(self, uint32_t e) noexcept nogil:
        """Make entry ``e`` the most recently used."""
        if e != self._mru:
            self._unlink(e)
            self._push_mru(e)

    cdef void _delete_key(self, uint64_t key) noexcept nogil:
        """Empty the table slot of ``key`` (present), shifting later slots of its probe run
        back (no tombstones)."""
        cdef size_t mask = self._mask, i = mix(key) & mask, j, k
        cdef Slot* t = self._table
        while t[i].key != key or t[i].ent1 == 0:
            i = (i + 1) & mask
        j = i
        while True:
            j = (j + 1) & mask
            if t[j].ent1 == 0:
                break
            k = mix(t[j].key) & mask
            # The slot at j may fill the hole at i unless its home k lies cyclically in (i, j].
            if (i <= j and i < k <= j) or (i > j and (i < k or k <= j)):
                continue
            t[i] = t[j]
            i = j
        t[i].ent1 = 0
        self._count -= 1

    cdef void _remove(self, uint32_t e, uint32_t* release) noexcept nogil:
        """Drop entry ``e`` from the table and the LRU list into the release chain
        ``release`` (its value is DECREF'd by ``_release``, once all is consistent)."""
        self._delete_key(self._ents[e].key)
        self._unlink(e)
        self._bytes -= self._ents[e].nbytes
        self._ents[e].next = release[0]
        release[0] = e

    cdef int _grow_table(self) except -1:
        """Double the table (rehashing from the keys in the slots: no Python object is touched)."""
        cdef size_t old_slots = self._mask + 1, slots = old_slots * 2, mask = slots - 1, i, j
        cdef Slot* old = self._table
        cdef Slot* new = <Slot*>safe_realloc(NULL, slots, sizeof(Slot))
        memset(new, 0, slots * sizeof(Slot))
        for i in range(old_slots):
            if old[i].ent1:
                j = mix(old[i].key) & mask
                while new[j].ent1:
                    j = (j + 1) & mask
                new[j] = old[i]
        self._table = new
        self._mask = mask
        free(old)
        return 0

    cdef int _reserve_entry(self) except -1:
        """Make sure ``_take_entry`` has an entry to hand out (grows the array)."""
        cdef uint32_t cap
        if self._free != NIL or self._n_ents < self._cap_ents:
            return 0
        if self._cap_ents == MAX_ENTS:
            raise MemoryError("a row cache holds at most 2**32 - 1 entries")
        if self._cap_ents < ENTS_MIN:
            cap = ENTS_MIN
        elif self._cap_ents > MAX_ENTS // 2:
            cap = MAX_ENTS
        else:
            cap = self._cap_ents * 2
        self._ents = <Entry*>safe_realloc(self._ents, cap, sizeof(Entry))
        self._cap_ents = cap
        return 0

    cdef uint32_t _take_entry(self) noexcept nogil:
        """A free entry (after ``_reserve_entry``)."""
        cdef uint32_t e = self._free
        if e != NIL:
            self._free = self._ents[e].next
            return e
        e = self._n_ents
        self._n_ents += 1
        return e

    cdef int _put(self, uint64_t key, PyObject* value, uint64_t nbytes,
                  uint32_t* release) except -1:
        """``put`` of a validated key, value and nbytes; what it drops goes to ``release``."""
        cdef uint32_t e = self._find(key), old
        cdef size_t i, mask
        cdef Entry* ents
        if nbytes > self._cap:
            if e != NIL:
                self._remove(e, release)
            return 0
        if e != NIL:
            # Replacement, in place; the old value is parked in a spare entry of the chain.
            self._reserve_entry()
            old = self._take_entry()
            ents = self._ents
            ents[old].value = ents[e].value
            ents[old].next = release[0]
            release[0] = old
            rc_incref(value)
            ents[e].value = value
            self._bytes -= ents[e].nbytes
            self._bytes += nbytes
            ents[e].nbytes = nbytes
            self._touch(e)
        else:
            # Everything that can fail comes first.
            if (self._count + 1) * 2 > self._mask + 1:
                self._grow_table()
            self._reserve_entry()
            e = self._take_entry()
            ents = self._ents
            ents[e].key = key
            rc_incref(value)
            ents[e].value = value
            ents[e].nbytes = nbytes
            mask = self._mask
            i = mix(key) & mask
            while self._table[i].ent1:
                i = (i + 1) & mask
            self._table[i].key = key
            self._table[i].ent1 = e + 1
            self._count += 1
            self._push_mru(e)
            self._bytes += nbytes
        self._inserts += 1
        while self._bytes > self._cap:  # the new entry (<= capacity, MRU) is never reached
            self._remove(self._lru, release)
            self._evictions += 1
        return 0

    cdef void _release(self, uint32_t chain) noexcept:
        """Free the entries of a release chain and DECREF their values (may run any code)."""
        cdef uint32_t e
        cdef PyObject* v
        while chain != NIL:
            e = chain
            v = self._ents[e].value  # re-read: a finalizer may have moved the array
            chain = self._ents[e].next
            self._ents[e].value = NULL
            self._ents[e].next = self._free
            self._free = e
            rc_decref(v)

    # ------------------------------------------------------------ lookups

    @property
    def capacity_bytes(self):
        return self._cap

    def get(self, key):
        """The object cached under ``key`` (now most recently used), or None."""
        cdef uint64_t k = 0
        cdef uint32_t e
        key_of(key, &k)
        e = self._find(k)
        if e == NIL:
            self._misses += 1
            return None
        self._hits += 1
        self._touch(e)
        return <object>self._ents[e].value

    def get_many(self, keys):
        """``[get(k) for k in keys]`` in one call; ``keys`` may be a buffer of uint64/int64."""
        cdef Py_buffer view
        cdef int kind = open_buffer(keys, &view)
        if kind:
            try:
                return self._get_buf(<const char*>view.buf, view.shape[0], view.strides[0],
                                     kind == 2)
            finally:
                PyBuffer_Release(&view)
        return self._get_seq(as_seq(keys))

    cdef list _get_seq(self, object seq):
        """get_many of a list or tuple."""
        cdef Py_ssize_t i, n = PySequence_Fast_GET_SIZE(seq)
        cdef list out = [None] * n  # allocated before the loop (it may start the GC)
        cdef uint64_t k = 0
        cdef uint32_t e
        for i in range(n):
            key_of(<object>PySequence_Fast_GET_ITEM(seq, i), &k)
            e = self._find(k)
            if e == NIL:
                self._misses += 1
            else:
                self._hits += 1
                self._touch(e)
                rc_list_put(out, i, self._ents[e].value)
        return out

    cdef list _get_buf(self, const char* data, Py_ssize_t n, Py_ssize_t stride, bint signed):
        """get_many of a vector of 64-bit integers (``signed``: int64, else uint64)."""
        cdef list out = [None] * n
        cdef Py_ssize_t i
        cdef uint64_t k = 0
        cdef uint32_t e
        cdef const Slot* table = self._table  # get_many never moves the table
        cdef size_t mask = self._mask
        for i in range(n):
            if i + PREFETCH < n:
                rc_prefetch(&table[mix(buf_u64(data, i + PREFETCH, stride)) & mask])
            k = buf_u64(data, i, stride)
            if signed and <int64_t>k < 0:
                raise OverflowError(f"row cache key {<int64_t>k} is outside 0 .. 2**64-1")
            e = self._find(k)
            if e == NIL:
                self._misses += 1
            else:
                self._hits += 1
                self._touch(e)
                rc_list_put(out, i, self._ents[e].value)
        return out

    # ------------------------------------------------------------ updates

    def put(self, key, value, nbytes):
        """Cache ``value`` under ``key`` (replacing what was there) as most recently used."""
        cdef uint64_t k = 0, n = 0
        cdef uint32_t release = NIL
        key_of(key, &k)
        if value is None:
            raise ValueError("None cannot be cached (get() uses it for a miss)")
        nbytes_of(nbytes, &n)
        try:
            self._put(k, <PyObject*>value, n, &release)
        finally:
            self._release(release)

    def put_many(self, keys, values, sizes):
        """``put`` of each (key, value, nbytes), in order; keys and sizes may be buffers."""
        cdef Py_buffer kview, sview
        cdef int kkind = 0, skind = 0
        cdef Py_ssize_t i, n, kstride = 0, sstride = 0
        cdef const char* kdata = NULL
        cdef const char* sdata = NULL
        cdef uint64_t k = 0, nb = 0
        cdef uint32_t release = NIL
        cdef PyObject* v
        cdef object kseq = None, vseq, sseq = None
        kkind = open_buffer(keys, &kview)
        try:
            if kkind:
                kdata = <const char*>kview.buf
                kstride = kview.strides[0]
                n = kview.shape[0]
            else:
                kseq = as_seq(keys)
                n = PySequence_Fast_GET_SIZE(kseq)
            vseq = as_seq(values)
            skind = open_buffer(sizes, &sview)
            try:
                if skind:
                    sdata = <const char*>sview.buf
                    sstride = sview.strides[0]
                    if sview.shape[0] != n:
                        n = -1
                else:
                    sseq = as_seq(sizes)
                    if PySequence_Fast_GET_SIZE(sseq) != n:
                        n = -1
                if n < 0 or PySequence_Fast_GET_SIZE(vseq) != n:
                    raise ValueError("keys, values and sizes must have the same length")
                try:
                    for i in range(n):
                        if kkind:
                            k = buf_u64(kdata, i, kstride)
                            if kkind == 2 and <int64_t>k < 0:
                                raise OverflowError(
                                    f"row cache key {<int64_t>k} is outside 0 .. 2**64-1")
                        else:
                            key_of(<object>PySequence_Fast_GET_ITEM(kseq, i), &k)
                        v = PySequence_Fast_GET_ITEM(vseq, i)
                        if v == <PyObject*>None:
                            raise ValueError("None cannot be cached (get() uses it for a miss)")
                        if skind:
                            nb = buf_u64(sdata, i, sstride)
                            if skind == 2 and <int64_t>nb < 0:
                                raise ValueError(
                                    f"nbytes must be a non-negative int, not {<int64_t>nb!r}")
                        else:
                            nbytes_of(<object>PySequence_Fast_GET_ITEM(sseq, i), &nb)
                        self._put(k, v, nb, &release)
                finally:
                    self._release(release)
            finally:
                if skind:
                    PyBuffer_Release(&sview)
        finally:
            if kkind:
                PyBuffer_Release(&kview)

    def discard(self, key):
        """Drop ``key``; True if it was cached."""
        cdef uint64_t k = 0
        cdef uint32_t e, release = NIL
        key_of(key, &k)
        e = self._find(k)
        if e == NIL:
            return False
        self._remove(e, &release)
        self._release(release)
        return True

    def clear(self):
        """Drop every entry (counters other than bytes and entries keep counting)."""
        cdef uint32_t e = self._lru, nxt, release = NIL
        while e != NIL:
            nxt = self._ents[e].next
            self._ents[e].next = release
            release = e
            e = nxt
        memset(self._table, 0, (self._mask + 1) * sizeof(Slot))
        self._count = 0
        self._bytes = 0
        self._lru = self._mru = NIL
        self._release(release)

    # ------------------------------------------------------------ introspection

    def keys_lru(self):
        """Cached keys, least recently used first (for tests and debugging)."""
        cdef list out = []
        cdef uint32_t e = self._lru
        while e != NIL:  # appending allocates ints and list storage: neither starts the GC
            out.append(self._ents[e].key)
            e = self._ents[e].next
        return out

    def charged(self, keys):
        """(the sum of the ``nbytes`` given for those of ``keys`` that are cached, how many
        are not), leaving recency and counters alone: what cached values take by the
        caller's measure. ``keys`` as get_many takes them."""
        cdef Py_buffer view
        cdef int kind = open_buffer(keys, &view)
        cdef Py_ssize_t i, n
        cdef uint64_t k = 0, total = 0, absent = 0
        cdef uint32_t e
        cdef object seq
        if kind:
            try:
                for i in range(view.shape[0]):
                    k = buf_u64(<const char*>view.buf, i, view.strides[0])
                    if kind == 2 and <int64_t>k < 0:
                        raise OverflowError(f"row cache key {<int64_t>k} is outside 0 .. 2**64-1")
                    e = self._find(k)
                    if e == NIL:
                        absent += 1
                    else:
                        total += self._ents[e].nbytes
            finally:
                PyBuffer_Release(&view)
            return total, absent
        seq = as_seq(keys)
        n = PySequence_Fast_GET_SIZE(seq)
        for i in range(n):
            key_of(<object>PySequence_Fast_GET_ITEM(seq, i), &k)
            e = self._find(k)
            if e == NIL:
                absent += 1
            else:
                total += self._ents[e].nbytes
        return total, absent

    def __contains__(self, key):
        cdef uint64_t k = 0
        key_of(key, &k)
        return self._find(k) != NIL

    def __len__(self):
        return self._count

    def stats(self):
        return {"hits": self._hits, "misses": self._misses, "inserts": self._inserts,
                "evictions": self._evictions, "bytes": self._bytes, "entries": self._count,
                "capacity_bytes": self._cap}


# ---------------------------------------------------------------- copy_json


cdef object copy_any(object v):
    if PyDict_CheckExact(v):
        return copy_dict(<dict>v)
    if PyList_CheckExact(v):
        return copy_list(<list>v)
    if PyDict_Check(v):  # a subclass: a plain dict, like the reference's comprehension
        rc_enter()
        try:
            return {k: copy_any(x) for k, x in v.items()}
        finally:
            Py_LeaveRecursiveCall()
    if PyList_Check(v):
        rc_enter()
        try:
            return [copy_any(x) for x in v]
        finally:
            Py_LeaveRecursiveCall()
    return v


cdef dict copy_dict(dict d):
    """A shallow copy (one C copy of the table), then the container values replaced by copies.

    The loop walks the copy, which no other code can reach: it is safe even if the original
    changes meanwhile. Setting the value of an existing key during PyDict_Next is allowed.
    """
    cdef dict out = PyDict_Copy(d)
    cdef Py_ssize_t pos = 0
    cdef PyObject* k
    cdef PyObject* x
    cdef object key, item
    rc_enter()
    try:
        while PyDict_Next(out, &pos, &k, &x):
            if rc_is_container(x):
                key = <object>k
                item = <object>x
                PyDict_SetItem(out, key, copy_any(item))
    finally:
        Py_LeaveRecursiveCall()
    return out


cdef list copy_list(list l):
    """A shallow copy, then the container items replaced by copies (see copy_dict)."""
    cdef list out = PyList_GetSlice(l, 0, PyList_GET_SIZE(l))
    cdef Py_ssize_t i
    cdef PyObject* x
    cdef object item
    rc_enter()
    try:
        for i in range(PyList_GET_SIZE(out)):
            x = PyList_GET_ITEM(out, i)
            if rc_is_container(x):
                item = <object>x
                out[i] = copy_any(item)
    finally:
        Py_LeaveRecursiveCall()
    return out


def copy_json(value):
    """A copy of a decoded JSON value that shares only immutable parts (str, int, float,
    bool, None) with it: what a caller may mutate without touching the cached original."""
    return copy_any(value)


cdef extern from "Python.h":
    int PyObject_GC_IsTracked(object op)
    void PyObject_GC_UnTrack(void* op)


cdef void untrack_any(object v) except *:
    cdef Py_ssize_t pos = 0
    cdef PyObject* k
    cdef PyObject* x
    cdef Py_ssize_t i
    if type(v) is dict:
        rc_enter()
        try:
            while PyDict_Next(v, &pos, &k, &x):
                if rc_is_container(x):
                    untrack_any(<object>x)
        finally:
            Py_LeaveRecursiveCall()
    elif type(v) is list:
        rc_enter()
        try:
            for i in range(PyList_GET_SIZE(v)):
                x = PyList_GET_ITEM(v, i)
                if rc_is_container(x):
                    untrack_any(<object>x)
        finally:
            Py_LeaveRecursiveCall()
    else:
        return
    if PyObject_GC_IsTracked(v):
        PyObject_GC_UnTrack(<void*>v)


def untrack_json(value):
    """Take a decoded JSON value's dicts and lists out of the cyclic garbage collector's
    view; returns ``value``.

    A JSON tree has no reference cycles, so the collector has nothing to find in it, but it
    would still traverse every cached row on each full collection: with a few hundred
    thousand cached rows that is a long pause at random queries (measured:
    docs/benchmarks.md, "RowStoreCache").
    Untracked containers are freed by reference counting as usual. Only for values nobody
    modifies (cached rows are read-only; callers get ``copy_json`` copies, which are tracked).
    """
    untrack_any(value)
    return value
