"""Group numbers of 64-bit integer keys in one compiled pass: the same results as
``rtindex/_py/groups.py``.

``rtindex/_py/groups.py`` is the contract; tests/test_groups.py checks both on generated
keys. The aggregate of a few thousand matched rows (rtindex/sql/small.py) numbers its groups
first; Arrow's dictionary_encode has a fixed cost per call several times the work itself on
such sizes. Here an open-addressing table (linear probing, keys hashed with splitmix64's
finalizer) numbers them in one loop without the GIL.
"""

from libc.stdint cimport int64_t, uint64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

import numpy as np

__all__ = ["factorize"]


cdef inline uint64_t mix(uint64_t z) noexcept nogil:
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EB
    return z ^ (z >> 31)


def factorize(const int64_t[::1] values, const uint8_t[::1] valid=None):
    """See rtindex._py.groups.factorize."""
    cdef Py_ssize_t n = values.shape[0], i
    if valid is not None and valid.shape[0] != n:
        raise ValueError(f"{valid.shape[0]} validity flags for {n} values")
    codes_arr = np.empty(n, dtype=np.intp)
    firsts_arr = np.empty(n, dtype=np.intp)
    cdef Py_ssize_t[::1] codes = codes_arr
    cdef Py_ssize_t[::1] firsts = firsts_arr
    cdef size_t cap = 16, mask, h
    while cap < 2 * <size_t>n:
        cap <<= 1
    mask = cap - 1
    cdef int64_t* keys = <int64_t*>malloc(cap * sizeof(int64_t))
    cdef Py_ssize_t* ids = <Py_ssize_t*>malloc(cap * sizeof(Py_ssize_t))
    if keys == NULL or ids == NULL:
        free(keys)
        free(ids)
        raise MemoryError()
    memset(ids, 0xFF, cap * sizeof(Py_ssize_t))  # -1: an empty slot
    cdef Py_ssize_t count = 0, null_id = -1
    cdef int64_t v
    cdef bint has_valid = valid is not None
    try:
        with nogil:
            for i in range(n):
                if has_valid and not valid[i]:
                    if null_id < 0:
                        null_id = count
                        firsts[count] = i
                        count += 1
                    codes[i] = null_id
                    continue
                v = values[i]
                h = mix(<uint64_t>v) & mask
                while ids[h] >= 0 and keys[h] != v:
                    h = (h + 1) & mask
                if ids[h] < 0:
                    ids[h] = count
                    keys[h] = v
                    firsts[count] = i
                    count += 1
                codes[i] = ids[h]
    finally:
        free(keys)
        free(ids)
    return codes_arr, count, firsts_arr[:count]
