"""What a writer process tells its readers through shared memory: each shard's published state,
and one wake-up word per database that readers sleep on.

A shard's signal file holds, behind a sequence lock (odd while the writer updates it), the
change counter, the next row id, the segment generation, the change log sequence and the
mutable segment files a reader maps. A reader copies it whole and retries when the sequence
moved meanwhile, so it never sees half of an update. The database's wake file holds a 32-bit
word the writer bumps after every change a reader must act on (a segment sealed or merged, a
new mutable segment, deletes), then wakes the processes sleeping on it (a Linux futex on the
shared page; elsewhere readers poll it). Rows added to a mutable segment need no wake-up:
readers see them through the segment's own published row count.
"""

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

import mmap
import os
import time

cdef extern from *:
    """
    #if defined(__linux__)
    #include <linux/futex.h>
    #include <sys/syscall.h>
    #include <unistd.h>
    #include <time.h>
    #include <errno.h>
    static int rt_futex_wait(uint32_t* word, uint32_t expected, double timeout) {
        struct timespec ts;
        ts.tv_sec = (time_t)timeout;
        ts.tv_nsec = (long)((timeout - (double)ts.tv_sec) * 1e9);
        return (int)syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, NULL, 0);
    }
    static int rt_futex_wake(uint32_t* word) {
        return (int)syscall(SYS_futex, word, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
    }
    #define RT_HAVE_FUTEX 1
    #else
    static int rt_futex_wait(uint32_t* word, uint32_t expected, double timeout) { (void)word; (void)expected; (void)timeout; return -1; }
    static int rt_futex_wake(uint32_t* word) { (void)word; return 0; }
    #define RT_HAVE_FUTEX 0
    #endif
    static inline uint64_t rtn_ld64(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void rtn_st64(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline uint32_t rtn_ld32(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline uint32_t rtn_add32(uint32_t* p, uint32_t v) { return __atomic_add_fetch(p, v, __ATOMIC_SEQ_CST); }
    static inline uint32_t rtn_sub32(uint32_t* p, uint32_t v) { return __atomic_sub_fetch(p, v, __ATOMIC_SEQ_CST); }
    static inline void rtn_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
    """
    int rt_futex_wait(uint32_t* word, uint32_t expected, double timeout) nogil
    int rt_futex_wake(uint32_t* word) nogil
    int RT_HAVE_FUTEX
    uint64_t rtn_ld64(const uint64_t* p) noexcept nogil
    void rtn_st64(uint64_t* p, uint64_t v) noexcept nogil
    uint32_t rtn_ld32(const uint32_t* p) noexcept nogil
    uint32_t rtn_add32(uint32_t* p, uint32_t v) noexcept nogil
    uint32_t rtn_sub32(uint32_t* p, uint32_t v) noexcept nogil
    void rtn_fence() noexcept nogil

cdef enum:
    MAX_TAILS = 16  # mutable segments a shard's signal lists (the active one and those being sealed)
    SIZE = 4096

cdef struct ShardHead:
    uint64_t seq  # odd while the writer updates the rest
    uint64_t count  # changes published so far (see rtindex/fence.py)
    uint64_t next_row  # rows written
    uint64_t time_ns  # wall time of the last change
    uint64_t generation  # segment generation (meta G)
    uint64_t log_seq  # change log sequence (meta Q)
    uint64_t epoch  # the writer process's incarnation (random at open)
    uint64_t n_tails  # entries of tails in use
    uint64_t tails[2 * MAX_TAILS]  # (base row id, file id) of each mutable segment, oldest first

HAVE_FUTEX = bool(RT_HAVE_FUTEX)
MAX_SEGMENTS = MAX_TAILS


cdef object _map(str path, bint write):
    """The file's first SIZE bytes, mapped (made, and sized, by a writer)."""
    flags = os.O_RDWR | os.O_CREAT if write else os.O_RDONLY
    fd = os.open(path, flags, 0o644)
    try:
        if write and os.fstat(fd).st_size < SIZE:
            os.ftruncate(fd, SIZE)  # never replaced: readers keep their map of this file
        elif not write and os.fstat(fd).st_size < SIZE:
            return None
        return mmap.mmap(fd, SIZE, access=mmap.ACCESS_WRITE if write else mmap.ACCESS_READ)
    finally:
        os.close(fd)


cdef inline char* _address(object mm) except NULL:
    cdef const unsigned char[::1] view = mm
    return <char*>&view[0]


cdef class Signal:
    """The writer's side of a shard's signal file."""

    cdef object _mm
    cdef ShardHead* _h
    cdef readonly uint64_t count

    def __init__(self, str path, uint64_t epoch):
        self._mm = _map(path, True)
        self._h = <ShardHead*>_address(self._mm)
        if self._h.seq & 1:  # a writer died mid-update: readers retry until this clears it
            rtn_st64(&self._h.seq, self._h.seq + 1)
        self.count = self._h.count
        self._h.epoch = epoch

    def bump(self, uint64_t next_row, uint64_t generation, uint64_t log_seq, tails):
        """Publish a change: the counter, then the rest (readers see all of it or none)."""
        cdef ShardHead* h = self._h
        cdef Py_ssize_t i, n = len(tails)
        if n > MAX_TAILS:
            raise ValueError(f"at most {MAX_TAILS} mutable segments per shard")
        self.count += 1
        rtn_st64(&h.seq, h.seq + 1)
        rtn_fence()
        h.count = self.count
        h.next_row = next_row
        h.time_ns = time.time_ns()
        h.generation = generation
        h.log_seq = log_seq
        for i in range(n):
            base, fid = tails[i]
            h.tails[2 * i] = base
            h.tails[2 * i + 1] = fid
        h.n_tails = n
        rtn_st64(&h.seq, h.seq + 1)

    def close(self):
        self._h = NULL
        if self._mm is not None:
            self._mm.close()
            self._mm = None


cdef class Watch:
    """A reader's side: ``read()`` is the shard's last published state, or None while the
    writer has never published one."""

    cdef str _path
    cdef object _mm
    cdef ShardHead* _h
    cdef object _last  # the last state read
    cdef uint64_t _stuck  # an odd sequence that never completed (0: none)

    def __init__(self, str path):
        self._path = path

    def read(self):
        """``(count, next_row, time, generation, log_seq, epoch, tails)``; None before the
        first publication. A writer killed in the middle of publishing leaves the state
        half-written until its successor publishes: meanwhile this is the last state read
        (after waiting a few milliseconds the first time, at once after that)."""
        cdef ShardHead copy
        cdef uint64_t s1, s2
        cdef int spins = 0
        if self._h == NULL:
            try:
                mm = _map(self._path, False)
            except FileNotFoundError:
                return None
            if mm is None:
                return None
            self._mm = mm
            self._h = <ShardHead*>_address(mm)
        while True:
            s1 = rtn_ld64(&self._h.seq)
            if not s1 & 1:
                memcpy(&copy, self._h, sizeof(ShardHead))
                rtn_fence()
                s2 = rtn_ld64(&self._h.seq)
                if s1 == s2:
                    break
            elif s1 == self._stuck:
                return self._last
            spins += 1
            if spins > 200:
                time.sleep(0.0001)
            if spins > 300:  # a writer that died mid-update: its successor clears it
                self._stuck = s1
                return self._last
        if copy.count == 0:
            return None
        n = min(copy.n_tails, MAX_TAILS)
        tails = tuple((copy.tails[2 * i], copy.tails[2 * i + 1]) for i in range(n))
        self._last = (copy.count, copy.next_row, copy.time_ns / 1e9, copy.generation, copy.log_seq, copy.epoch,
                      tails)
        return self._last

    def close(self):
        self._h = NULL
        if self._mm is not None:
            self._mm.close()
            self._mm = None


cdef class Wake:
    """A database's wake-up word: the writer rings it, readers wait for it to move."""

    cdef str _path
    cdef object _mm
    cdef uint32_t* _w  # [0]: the word, [1]: processes waiting

    def __init__(self, str path, bint writer):
        self._path = path
        if writer:
            self._mm = _map(path, True)
            self._w = <uint32_t*>_address(self._mm)
        else:
            self._open()

    cdef _open(self):
        """A reader's map of the file, once the writer has made it (it needs to count itself
        among the waiters, so read-write)."""
        try:
            fd = os.open(self._path, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            if os.fstat(fd).st_size >= SIZE:
                self._mm = mmap.mmap(fd, SIZE)
                self._w = <uint32_t*>_address(self._mm)
        finally:
            os.close(fd)

    @property
    def value(self):
        """The word now (0 while there is no wake file)."""
        if self._w == NULL:
            self._open()
        return rtn_ld32(self._w) if self._w != NULL else 0

    def ring(self):
        """Bump the word and wake every process waiting for it."""
        if self._w == NULL:
            return
        rtn_add32(self._w, 1)
        if rtn_ld32(&self._w[1]):
            rt_futex_wake(self._w)

    def wait(self, uint32_t seen, double timeout):
        """Sleep until the word differs from ``seen`` or ``timeout`` seconds pass (without a
        futex, or before the writer made the file: at most a millisecond)."""
        cdef uint32_t* w = self._w
        if w == NULL or not RT_HAVE_FUTEX:
            time.sleep(min(timeout, 0.001))
            return
        if rtn_ld32(w) != seen:
            return
        with nogil:
            rtn_add32(&w[1], 1)
            rt_futex_wait(w, seen, timeout)
            rtn_sub32(&w[1], 1)

    def close(self):
        self._w = NULL
        if self._mm is not None:
            self._mm.close()
            self._mm = None
