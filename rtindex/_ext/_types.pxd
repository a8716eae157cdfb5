# Shared C types of the compiled modules, and their allocators (cimport them; never
# redefine per module).
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport calloc, free, realloc


cdef extern from *:
    """
    #include <sys/mman.h>
    #ifndef MADV_HUGEPAGE  /* no transparent huge pages (not Linux): plain pages */
    #define MADV_HUGEPAGE MADV_NORMAL
    #endif
    #ifndef MAP_ANONYMOUS
    #define MAP_ANONYMOUS MAP_ANON
    #endif
    """
    int PROT_READ, PROT_WRITE, MAP_PRIVATE, MAP_ANONYMOUS, MADV_HUGEPAGE
    void* MAP_FAILED
    void* mmap(void* addr, size_t length, int prot, int flags, int fd, long offset) nogil
    int munmap(void* addr, size_t length) nogil
    int madvise(void* addr, size_t length, int advice) nogil

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


cdef enum:
    HUGE_PAGE = 2 * 1024 * 1024  # x86-64 and arm64 transparent huge pages


cdef inline size_t huge_room(size_t nbytes) noexcept nogil:
    """What ``huge_zalloc(nbytes)`` maps: whole huge pages."""
    return (nbytes + HUGE_PAGE - 1) & ~(<size_t>HUGE_PAGE - 1)


cdef inline void* huge_zalloc(size_t count, size_t size) except NULL:
    """``count * size`` zeroed bytes; from one huge page up, on huge-page-aligned memory the
    kernel may back with transparent huge pages. Free with ``huge_free`` and the same sizes.

    For large, randomly probed arrays that are filled once and freed whole (the term table):
    zeroing a fresh table 4 KiB page at a time makes most of the ingest thread's page faults
    (``perf``; docs/benchmarks.md, "Ingest"), and a probe into tens of MB of small pages
    misses the TLB. The mapping comes zeroed, so there is no memset (the kernel's zeroing
    stays); where the kernel gives no huge pages (THP off, not Linux) it is plain anonymous
    memory. Below a huge page it is ``calloc``."""
    cdef size_t room, over
    cdef char* p
    cdef char* q
    if size != 0 and count > (<size_t>-1 - 2 * HUGE_PAGE) / size:
        raise MemoryError("allocation size overflow")
    if count * size < HUGE_PAGE:
        p = <char*>calloc(count if count else 1, size if size else 1)
        if p == NULL:
            raise MemoryError(f"cannot allocate {count * size} bytes")
        return p
    room = huge_room(count * size)
    over = room + HUGE_PAGE  # room to align the start to a huge page
    p = <char*>mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if <void*>p == MAP_FAILED:
        raise MemoryError(f"cannot map {room} bytes")
    q = <char*>(((<size_t>p) + HUGE_PAGE - 1) & ~(<size_t>HUGE_PAGE - 1))
    if q != p:
        munmap(p, <size_t>(q - p))
    if q + room != p + over:
        munmap(q + room, <size_t>((p + over) - (q + room)))
    madvise(q, room, MADV_HUGEPAGE)  # advice only: an error leaves small pages
    return q


cdef inline void huge_free(void* p, size_t count, size_t size) noexcept nogil:
    """Release what ``huge_zalloc(count, size)`` returned."""
    if p == NULL:
        return
    if count * size < HUGE_PAGE:
        free(p)
    else:
        munmap(p, huge_room(count * size))
