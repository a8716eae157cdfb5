# Shared C types of the compiled modules, and their one allocator (cimport them; never
# redefine per module).
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport realloc

ctypedef uint32_t offset_t   # row offset inside one segment (row id - segment base)
ctypedef uint32_t term_id_t  # index of a distinct term inside one segment builder
ctypedef uint64_t doc_id_t   # global row id (segment base + offset)


cdef inline void* safe_realloc(void* p, size_t count, size_t size) except NULL:
    """``realloc(p, count * size)``; MemoryError (``p`` untouched) when it fails or overflows."""
    cdef void* q
    if size != 0 and count > (<size_t>-1) / size:
        raise MemoryError("allocation size overflow")
    q = realloc(p, count * size if count else 1)
    if q == NULL:
        raise MemoryError(f"cannot allocate {count * size} bytes")
    return q


cdef inline int grow(void** p, Py_ssize_t* cap, Py_ssize_t need, size_t item,
                     Py_ssize_t minimum) noexcept nogil:
    """Make ``*p`` hold at least ``need`` items of ``item`` bytes, doubling (at least
    ``minimum``); -1 when out of memory, with ``*p`` and ``*cap`` unchanged. For nogil code."""
    cdef Py_ssize_t n
    cdef void* q
    if need <= cap[0]:
        return 0
    n = max(2 * cap[0], need, minimum)
    q = realloc(p[0], <size_t>n * item)
    if q == NULL:
        return -1
    p[0] = q
    cap[0] = n
    return 0
