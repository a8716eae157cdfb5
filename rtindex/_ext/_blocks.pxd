# Term-dictionary blocks of sealed segments; see the docstring of _blocks.pyx for the format.
#
# The block format is written in C in one place: the functions declared at the end, which
# BlockWriter, the merge and rtindex._ext._segment (SegmentBuilder.write_blocks) all call.

from libc.stdint cimport uint32_t, uint64_t

from rtindex._ext._types cimport grow, offset_t, safe_realloc

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #if defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    #define RTB_BIG_ENDIAN 1
    #else
    #define RTB_BIG_ENDIAN 0
    #endif
    static inline uint32_t rtb_ld32(const unsigned char *p) {
        uint32_t v;
        memcpy(&v, p, 4);
    #if RTB_BIG_ENDIAN
        v = __builtin_bswap32(v);
    #endif
        return v;
    }
    static inline void rtb_st32(unsigned char *p, uint32_t v) {
    #if RTB_BIG_ENDIAN
        v = __builtin_bswap32(v);
    #endif
        memcpy(p, &v, 4);
    }
    static inline uint32_t rtb_ld16(const unsigned char *p) {
        return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    }
    static inline void rtb_st16(unsigned char *p, uint32_t v) {
        p[0] = (unsigned char)v;
        p[1] = (unsigned char)(v >> 8);
    }
    """
    uint32_t rtb_ld32(const unsigned char* p) noexcept nogil
    void rtb_st32(unsigned char* p, uint32_t v) noexcept nogil
    uint32_t rtb_ld16(const unsigned char* p) noexcept nogil
    void rtb_st16(unsigned char* p, uint32_t v) noexcept nogil


cdef enum:
    RAW = 0                     # entry kind: raw offsets (format 3: varint gaps; before: uint32)
    ROARING = 1                 # entry kind: cardinality + BitMap.serialize()
    RAW_MAX = 64                # a set of fewer offsets is always stored raw
    MAX_TERM = 0x3FFFFFFF       # longest term
    MAX_HEAD = 10               # longest entry head: two varints of at most 5 bytes
    MAX_VARINT = 5              # longest varint (of a uint32)
    HEADER = 9                  # format 3 header: magic, u32 n, u8 offset width


cdef struct BlockView:
    const unsigned char* p      # first byte of the block (a buffer held elsewhere)
    Py_ssize_t size             # block length in bytes
    uint32_t n                  # entry count, >= 1
    int fmt                     # format: 3 (varint raw postings), 2 (front-coded terms) or 1
    Py_ssize_t table            # first byte of the offsets table (9 in format 3, else 8)
    int width                   # bytes an offset takes in the table: 2 or 4
    Py_ssize_t table_end        # first byte after the offsets table
    const unsigned char* first  # formats 2, 3: the first term, which entries share a prefix of
    Py_ssize_t first_len        # its length (0 in format 1: no entry shares anything)


cdef struct Entry:
    Py_ssize_t pre              # the term starts with the block's first term[:pre] (format 1: 0)
    Py_ssize_t ts               # start of the rest of the term (byte index into the block)
    Py_ssize_t tlen             # length of the rest: the term is pre + tlen bytes
    int kind                    # RAW (0) or ROARING (1)
    Py_ssize_t ps               # posting start
    Py_ssize_t plen             # posting length in bytes (raw: varints, or 4 per offset before
                                # format 3; roaring: 4 + serialized)


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
    Py_ssize_t first_ts         # the pending block's first term starts at data[first_ts]
    Py_ssize_t first_len        # its length


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


cdef struct BlockOut:
    unsigned char* data         # finished blocks, back to back (the nogil writer's output)
    Py_ssize_t len              # bytes used in data
    Py_ssize_t cap              # bytes allocated for data
    Py_ssize_t* ends            # ends[i]: end of block i in data (it starts at ends[i - 1], or 0)
    Py_ssize_t n                # finished blocks
    Py_ssize_t ends_cap         # slots allocated for ends


# ---- the block format in C (implemented in _blocks.pyx) ------------------------------
# Writing a block: reserve room (_w_grow or _w_reserve), _w_put each entry, and once
# _w_size(w) >= w.target flush it: BlockWriter._flush makes the bytes, _w_flush_to appends
# them to a BlockOut without the GIL (_blockout_list turns that into BlockWriter's output).

cdef bint _surely_raw(const uint32_t* v, Py_ssize_t k) noexcept nogil
cdef bytes _roaring_or_none(const offset_t* vals, Py_ssize_t k, object arr)
cdef bytes _roaring_ser(const offset_t* vals, Py_ssize_t k, object arr)
cdef int _w_grow(WState* w, Py_ssize_t need) noexcept nogil
cdef int _w_reserve(WState* w, Py_ssize_t need) except -1
cdef void _w_put(WState* w, const unsigned char* t1, Py_ssize_t l1, const unsigned char* t2,
                 Py_ssize_t l2, const offset_t* vals, Py_ssize_t k, const unsigned char* ser,
                 Py_ssize_t ser_len) noexcept nogil
cdef void _w_write_block(const WState* w, unsigned char* q) noexcept nogil
cdef int _w_flush_to(WState* w, BlockOut* out) noexcept nogil
cdef list _blockout_list(const BlockOut* out)
cdef void _blockout_free(BlockOut* out) noexcept nogil


cdef inline Py_ssize_t _block_size(Py_ssize_t n, Py_ssize_t data_len) noexcept nogil:
    """Size of a block of ``n`` entries of ``data_len`` bytes: header + offsets table (2
    bytes an offset when every offset fits in 16 bits, else 4) + entries."""
    cdef Py_ssize_t size = HEADER + 2 * (n + 1) + data_len
    if size <= 0xFFFF:
        return size
    return HEADER + 4 * (n + 1) + data_len


cdef inline Py_ssize_t _w_size(const WState* w) noexcept nogil:
    """Size of the pending block."""
    return _block_size(w.n, w.data_len)


cdef inline Py_ssize_t _w_entry_size(Py_ssize_t tlen, Py_ssize_t k, Py_ssize_t ser_len) noexcept nogil:
    """At most the bytes of one entry (what to reserve; the shared prefix and small gaps make
    it smaller): raw (``ser_len < 0``) or roaring (``ser_len`` serialized bytes)."""
    return MAX_HEAD + tlen + (MAX_VARINT * k if ser_len < 0 else 4 + ser_len)


cdef class BlockWriter:
    cdef WState w               # all state; plain C so the merge loop can run without the GIL
    cdef object _put(self, const unsigned char* term, Py_ssize_t tlen, const offset_t* vals,
                     Py_ssize_t k, object arr)
    cdef object _flush(self)


cdef class _Pinned:
    cdef Py_buffer view         # the block object's buffer, held until this object goes
    cdef bint held
    cdef const unsigned char* p
    cdef Py_ssize_t size


cdef class _Cursor:
    cdef CState s               # position, shift and deletes of one merge input
    cdef object it              # iterator over the input's blocks
    cdef _Pinned block          # current block: holds the buffer s.v points into
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


cdef class TermFilterBuilder:
    cdef uint64_t* hashes       # the hash of every term added so far, in order
    cdef Py_ssize_t n           # terms added
    cdef Py_ssize_t cap         # slots allocated for hashes
