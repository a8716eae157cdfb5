# Term-dictionary blocks of sealed segments; see the docstring of _blocks.pyx for the format.

from libc.stdint cimport uint32_t, uint64_t

from rtindex._ext._types cimport offset_t


cdef struct BlockView:
    const unsigned char* p      # first byte of the block (owned by a bytes object held elsewhere)
    Py_ssize_t size             # block length in bytes
    uint32_t n                  # entry count, >= 1
    Py_ssize_t table_end        # first byte after the offsets table (12 + 4n)


cdef struct Entry:
    Py_ssize_t ts               # term start (byte index into the block)
    Py_ssize_t tlen             # term length
    int kind                    # RAW (0) or ROARING (1)
    Py_ssize_t ps               # posting start
    Py_ssize_t plen             # posting length in bytes (raw: 4 per offset; roaring: 4 + serialized)


cdef struct WState:
    Py_ssize_t target           # emit a block once its size reaches this many bytes
    unsigned char* data         # encoded entries of the pending block, back to back
    Py_ssize_t data_len         # bytes used in data
    Py_ssize_t data_cap         # bytes allocated for data
    uint32_t* starts            # start of each pending entry within data
    Py_ssize_t n                # pending entries
    Py_ssize_t starts_cap       # slots allocated for starts
    unsigned char* last         # last term of the previously emitted block
    Py_ssize_t last_len         # its length; -1 before the first block is emitted
    Py_ssize_t last_cap         # bytes allocated for last
    Py_ssize_t n_terms          # terms written so far


cdef struct CState:
    BlockView v                 # current block of a merge input (v.p is NULL when none)
    uint32_t i                  # index of the current entry in it
    Entry e                     # the current entry, validated
    bint done                   # input exhausted
    bint hit                    # holds the term being merged now
    uint64_t shift              # added to every offset of this input
    unsigned char* dbits        # deleted offsets as a bitset (or NULL)
    uint64_t dbits_n            # number of bits in dbits
    const offset_t* dsorted     # deleted offsets, sorted, when too sparse for a bitset (or NULL)
    Py_ssize_t dsorted_n        # length of dsorted
    Entry nxt                   # the entry after e, decoded ahead by the nogil merge loop


cdef struct MState:
    CState** cs                 # the state of every merge input, in input order
    Py_ssize_t k                # number of inputs
    WState* w                   # the output writer's state
    unsigned char* last         # the term merged last (order check)
    Py_ssize_t last_len         # its length; -1 before the first term
    Py_ssize_t last_cap         # bytes allocated for last
    offset_t* scratch           # merged offsets of the current term
    Py_ssize_t scratch_cap      # slots allocated for scratch


cdef class BlockWriter:
    cdef WState w               # all state; plain C so the merge loop can run without the GIL
    cdef object _put(self, const unsigned char* term, Py_ssize_t tlen, const offset_t* vals,
                     Py_ssize_t k, object arr)
    cdef object _flush(self)


cdef class _Cursor:
    cdef CState s               # position, shift and deletes of one merge input
    cdef object it              # iterator over the input's blocks
    cdef bytes block            # current block: owns the bytes s.v points into
    cdef object deleted         # the deleted BitMap (or None)
    cdef object darr            # array('I') backing s.dsorted (or None)
    cdef int load(self) except -1
    cdef int advance(self) except -1
    cdef object bitmap(self)


cdef class _Merger:
    cdef MState m               # C state of the merge (pointers into cursors and writer below)
    cdef list cursors           # the _Cursor of every input, in input order (keeps m.cs valid)
    cdef BlockWriter writer     # output (keeps m.w valid)
    cdef bint started           # cursors loaded their first block
    cdef bint finished          # every input exhausted and the writer flushed
    cdef object next_block(self)
    cdef object slow_step(self)
