"""Column values at matched rows, across segments, in one compiled call: the same results as
``rtindex/_py/gather.py``.

``rtindex/_py/gather.py`` is the contract (its docstring states the layout of the parts and
of the result); tests/test_gather.py checks both on generated chunks. A search-then-aggregate
query reads a few columns at the rows an index matched in every segment of every shard;
taken with numpy, each (segment, column) pair cost several calls of fixed cost. Here one
loop per column reads Arrow's buffers in place (unaligned 8-byte values, bitmaps, large
string offsets and bytes) and writes the buffers of the joined Arrow array, without the GIL.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy, memset

__all__ = ["gather"]

cdef enum:
    FIXED8 = 0
    BITS = 1
    STRING = 2

cdef class _Bytes:
    """The bytes of a buffer (Arrow's, bytes), held while in use; whatever its item format."""
    cdef Py_buffer view
    cdef const uint8_t* p
    cdef bint held

    def __cinit__(self, obj):
        if obj is not None:
            PyObject_GetBuffer(obj, &self.view, PyBUF_SIMPLE)
            self.held = True
            self.p = <const uint8_t*>self.view.buf

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


cdef inline bint bit(const uint8_t* bits, int64_t i) noexcept nogil:
    return (bits[i >> 3] >> (i & 7)) & 1


cdef inline int64_t ld64(const uint8_t* p) noexcept nogil:
    cdef int64_t v
    memcpy(&v, p, 8)
    return v


def gather(int kind, list parts):
    """See rtindex._py.gather.gather."""
    cdef Py_ssize_t k, n = 0, i, m
    cdef int64_t total = 0, start, pos, s, e, at, nulls = 0
    cdef _Bytes pos_b
    cdef const int64_t* positions
    cdef _Bytes values_b, offsets_b, valid_b
    cdef const uint8_t* values
    cdef const uint8_t* offsets
    cdef const uint8_t* valid
    cdef bint has_valid
    for part in parts:
        n += len(part[4])  # (int64 positions: the caller's contract)
    cdef bytes out_valid = PyBytes_FromStringAndSize(NULL, (n + 7) // 8)
    cdef uint8_t* ov = <uint8_t*>PyBytes_AS_STRING(out_valid)
    memset(ov, 0xFF, (n + 7) // 8)
    cdef bytes out_offsets = None
    cdef int64_t* oo = NULL
    if kind == STRING:  # first pass: the bytes each value takes
        out_offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * 8)
        oo = <int64_t*>PyBytes_AS_STRING(out_offsets)
        oo[0] = 0
        at = 0
        for part in parts:
            pos_b = _Bytes(part[4])
            positions, m = <const int64_t*>pos_b.p, pos_b.view.len // 8
            if part[0] is None:
                for i in range(m):
                    oo[at + i + 1] = total
            else:
                offsets_b = _Bytes(part[1])
                offsets = offsets_b.p
                start = part[3]
                with nogil:
                    for i in range(m):
                        pos = start + positions[i]
                        total += ld64(&offsets[8 * (pos + 1)]) - ld64(&offsets[8 * pos])
                        oo[at + i + 1] = total
            at += m
    cdef Py_ssize_t size = total if kind == STRING else (8 * n if kind == FIXED8 else (n + 7) // 8)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
    cdef uint8_t* ob = <uint8_t*>PyBytes_AS_STRING(out)
    memset(ob, 0, size)
    at = 0
    for part in parts:
        pos_b = _Bytes(part[4])
        positions, m = <const int64_t*>pos_b.p, pos_b.view.len // 8
        if part[0] is None:  # a chunk the segment does not have: all null
            with nogil:
                for i in range(m):
                    ov[(at + i) >> 3] &= ~(1 << ((at + i) & 7))
                nulls += m
            at += m
            continue
        values_b, offsets_b, valid_b = _Bytes(part[0]), _Bytes(part[1]), _Bytes(part[2])
        values, offsets, valid = values_b.p, offsets_b.p, valid_b.p
        start = part[3]
        has_valid = part[2] is not None
        with nogil:
            if has_valid:
                for i in range(m):
                    if not bit(valid, start + positions[i]):
                        ov[(at + i) >> 3] &= ~(1 << ((at + i) & 7))
                        nulls += 1
            if kind == FIXED8:
                for i in range(m):
                    memcpy(ob + 8 * (at + i), &values[8 * (start + positions[i])], 8)
            elif kind == BITS:
                for i in range(m):
                    if bit(values, start + positions[i]):
                        ob[(at + i) >> 3] |= 1 << ((at + i) & 7)
            else:
                for i in range(m):
                    pos = start + positions[i]
                    s = ld64(&offsets[8 * pos])
                    e = ld64(&offsets[8 * (pos + 1)])
                    if e > s:
                        memcpy(ob + oo[at + i], &values[s], e - s)
        at += m
    if n & 7:  # (the bits past the last value are zero, as in the reference)
        ov[n >> 3] &= (1 << (n & 7)) - 1
    return nulls, out_valid if nulls else None, out, out_offsets
