# Declarations of the compiled row cache (implementation and design notes in _lru.pyx).
from cpython.object cimport PyObject
from libc.stdint cimport uint32_t, uint64_t


cdef struct Entry:
    uint64_t key  # the cache key (shard and row id, packed by the caller)
    PyObject* value  # owned reference to the cached object; NULL while the slot is free
    uint64_t nbytes  # bytes charged for this entry (<= the capacity)
    uint32_t prev  # LRU list: the entry used just before this one (NIL at the LRU end)
    uint32_t next  # LRU list: the entry used just after (NIL at the MRU end); the free list
                   # and a call's release chain link through this field too


cdef struct Slot:
    uint64_t key  # key of the entry (probes compare it without touching the entry array)
    uint32_t ent1  # entry index + 1; 0 marks an empty slot


cdef class RowCache:
    cdef uint64_t _cap  # capacity_bytes (< 2**63: byte sums below 2 * _cap never overflow)
    cdef uint64_t _bytes  # bytes charged by the entries held (<= _cap between calls)
    cdef uint64_t _hits  # get/get_many keys found
    cdef uint64_t _misses  # get/get_many keys not found
    cdef uint64_t _inserts  # puts that stored an entry (replacements included)
    cdef uint64_t _evictions  # entries dropped to fit the budget
    cdef Slot* _table  # open-addressing hash table (linear probing): key -> entry index
    cdef size_t _mask  # table slots - 1 (slots: a power of two, load <= 1/2)
    cdef size_t _count  # entries held: occupied table slots == length of the LRU list
    cdef Entry* _ents  # entry array: held, free and awaiting-release entries
    cdef uint32_t _n_ents  # entries of _ents ever handed out (the rest is unused)
    cdef uint32_t _cap_ents  # entries of _ents allocated
    cdef uint32_t _free  # head of the free list of entries below _n_ents (NIL: empty)
    cdef uint32_t _lru  # least recently used entry (NIL when empty)
    cdef uint32_t _mru  # most recently used entry (NIL when empty)

    cdef uint32_t _find(self, uint64_t key) noexcept nogil
    cdef void _touch(self, uint32_t e) noexcept nogil
    cdef void _unlink(self, uint32_t e) noexcept nogil
    cdef void _push_mru(self, uint32_t e) noexcept nogil
    cdef void _delete_key(self, uint64_t key) noexcept nogil
    cdef void _remove(self, uint32_t e, uint32_t* release) noexcept nogil
    cdef int _grow_table(self) except -1
    cdef int _reserve_entry(self) except -1
    cdef uint32_t _take_entry(self) noexcept nogil
    cdef int _put(self, uint64_t key, PyObject* value, uint64_t nbytes,
                  uint32_t* release) except -1
    cdef void _release(self, uint32_t chain) noexcept
    cdef list _get_seq(self, object seq)
    cdef list _get_buf(self, const char* data, Py_ssize_t n, Py_ssize_t stride, bint signed)
