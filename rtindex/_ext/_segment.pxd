# Declarations of the compiled mutable segment (implementation and layout notes in _segment.pyx).
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from rtindex._ext._types cimport offset_t


cdef enum:
    DIR_CHUNKS = 40  # chunks of a Dir: chunk k holds DIR_FIRST << k entries
    INLINE_POSTINGS = 2  # postings kept in a TRec before its slices


# ---------------------------------------------------------------- the shared mapping
# Everything below lives in the mapped file at an offset; offsets (never pointers) link it,
# so another process can map the file at another address. Memory is only appended: nothing
# moves or is freed while the file lives, and fresh memory is zero.

cdef struct Dir:
    uint64_t chunk[DIR_CHUNKS]  # offset of chunk k (0: not allocated yet)


cdef struct Header:
    uint64_t magic  # MAGIC: a mutable segment file of this layout version
    uint64_t base  # row id of offset 0
    uint64_t seed0  # SipHash key (random per file): term and column hashing
    uint64_t seed1
    uint64_t reserve  # bytes of address space each process maps for the file
    uint64_t size  # bytes the file holds (allocated ahead of use)
    uint64_t used  # bytes handed out by the arena (the writer's bump pointer)
    uint64_t log_seq  # published with rows: the writer's change log sequence (stored first)
    uint64_t rows  # published: rows visible to readers of other processes
    uint64_t n_cols  # columns made (a CRec is complete before this counts it)
    uint64_t n_terms  # terms made
    uint64_t table  # offset of the current term table (a TableHead then its slots)
    uint32_t max_depth  # the writer's nesting limit (for information)
    uint32_t version  # layout version (MAGIC carries it too)
    Dir cols  # column id -> CRec
    Dir rowpos  # row offset -> offset of the row's bytes (a Bytes record)


cdef struct TableHead:
    uint64_t mask  # slots - 1 (slots: a power of two)
    uint64_t pad


cdef struct TSlot:
    uint64_t key  # the term's value key (strings: the hash of their UTF-8)
    uint32_t cid1  # column id + 1, stored last (release); 0: empty slot
    uint32_t tid  # term id: its TRec's offset / 8


cdef struct TRec:  # a STRING term's UTF-8 follows it (a Bytes record)
    uint64_t key  # value key (a STRING term: the hash of its UTF-8)
    uint32_t cid  # column id
    uint32_t n  # postings (stored after the posting, release)
    uint32_t inl[INLINE_POSTINGS]  # postings 0 and 1
    uint32_t last  # the last posting (writer)
    uint32_t tail_s  # index of the last slice (writer)
    uint64_t head  # first slice of postings 2.. (0: none)
    uint64_t tail  # last slice (writer)


cdef struct CList:
    uint64_t head  # first slice (0: none)
    uint64_t tail  # last slice (writer)
    uint32_t n  # elements (stored after the element, release)
    uint32_t tail_s  # index of the last slice (writer)


cdef struct CRec:
    uint64_t key  # offset of the column key (a Bytes record: encoded path + type tag)
    uint32_t tag  # type tag (keys.NULL ... keys.OBJECT)
    uint32_t pad
    CList tids  # uint32 term ids of the column, in creation order
    CList offs  # column store: uint32 row offsets of the values (leaves outside arrays)
    CList vals  # column store values: int64/double (8 bytes), bool (1), STRING: uint32 term
                # id, ARRAY: uint64 offset of the JSON text (a Bytes record); NULL: none


# ---------------------------------------------------------------- the writer's own memory

cdef struct Node:
    uint64_t hash  # hash of (parent, key bytes): the path table's key
    const unsigned char* key  # the member name as UTF-8 (in the private arena)
    const unsigned char* enc  # the encoded path (keys.encode_path) + room for a type tag
    uint32_t key_len  # bytes of key
    uint32_t enc_len  # bytes of enc (without the tag)
    uint32_t parent  # node id of the parent (the root is node 0)
    uint32_t first_child  # prediction: the member walked first last time below this node
    uint32_t next_sib  # prediction: the member walked after this one last time
    uint32_t cid1[9]  # column id + 1 of this path per type tag (index: the tag), 0: none yet
    uint64_t stamp  # the object instance this node was last a member of (duplicate keys)
    uint8_t is_event_time  # the top-level `_event_time` (an integer there is a TIMESTAMP)


cdef struct Pend:
    uint64_t key  # value key (strings: their hash)
    uint64_t s_at  # STRING term, ARRAY text: where the bytes are (input or scratch offset)
    uint32_t s_len  # their length
    uint32_t cid  # column id
    uint8_t tag  # type tag
    uint8_t what  # PEND_TERM, PEND_TERM_COL (also the row's column value) or PEND_COL (ARRAY text)
    uint8_t in_scratch  # s_at is an offset into the scratch buffer, not the input
    uint8_t pad
    uint32_t hint  # commit: the term whose slot matched (key, column), NO_TERM: none


cdef struct Frame:
    uint64_t serial  # object instance number (duplicate keys)
    uint64_t start  # array: input offset of its '['
    uint64_t ws  # array: whitespace bytes skipped before its '['
    uint32_t node  # path node of the members (object) or elements (array)
    uint32_t member  # object: node of the member being read (NO_NODE: none yet)
    uint32_t prev  # object: node of the previous member (sibling prediction)
    uint32_t index  # array: index of the element being read
    uint8_t is_array
    uint8_t in_array  # inside an array (no column values)
    uint8_t col_array  # array outside arrays: its text is a column value


cdef struct DocError:
    int code  # E_* (see _segment.pyx)
    uint32_t doc  # index of the document in its batch
    uint64_t pos  # byte position (syntax errors)
    uint64_t extra  # the byte (unexpected character), the sign (non-finite number)
    uint32_t* path  # (is_index << 31 | node id or index) per level
    uint32_t depth  # levels in path


cdef struct ErrList:
    DocError* items  # the errors of a batch's documents, in document order
    size_t n
    size_t cap


# ---------------------------------------------------------------- sorting terms (seal)

cdef struct SortItem:
    uint64_t key  # sort key at the current depth (see above)
    TRec* e  # the term's record
    uint64_t tid  # its id
    uint32_t n  # its postings (as read once)
    const unsigned char* v  # string term: its encoded value in the arena (length before it)


cdef struct Cand:
    TRec* e  # a term whose postings may encode as roaring
    uint32_t n  # its postings (as read once)


# private memory handed out in order from chunks that never move, freed all at once
cdef struct Arena:
    unsigned char** chunks
    size_t n_chunks
    size_t cap_chunks
    unsigned char* free_at  # free bytes of the last chunk
    size_t free_len
    size_t held  # bytes of all chunks


cdef struct TermSort:
    SortItem* items  # every term, bucketed by column key rank; in term order once sorted
    size_t n  # terms
    size_t* bucket  # rank -> start of its bucket in items (n_ranks + 1 entries)
    SortItem* tmp  # scratch of the radix sort
    Arena strs  # encoded string values
    uint32_t* rank_of  # column id -> rank of its column key
    uint32_t* rank_cid  # rank -> column id
    size_t n_ranks  # column keys with terms
    const unsigned char** ck  # rank -> column key bytes (in the mapping)
    Py_ssize_t* ck_len
    unsigned char* ck_tag
    Cand* cand  # terms whose postings may encode as roaring (>= RAW_MAX rows), by address
    size_t n_cand
    size_t cand_cap
    const unsigned char** ser  # cand i -> its serialized BitMap (borrowed), NULL: raw
    Py_ssize_t* ser_len
    size_t bad  # write_blocks: index in items of the first term too long for a block
    uint32_t* post  # postings of the term being encoded
    size_t post_cap


cdef struct Tail:
    unsigned char* map  # the mapping (reserve bytes; the file's bytes below h.size)
    Header* h  # == map
    size_t mapped  # bytes mapped
    int fd  # the file (-1: anonymous memory)
    bint writer  # this process adds rows (else: a read-only view of another's)
    uint32_t n  # rows added (the writer's count; readers use the published one)
    Py_ssize_t max_depth  # nesting limit of the walk
    # the writer's own memory: the path tree and the walked document's scratch
    Node* nodes  # node id -> Node (0: the root)
    uint32_t n_nodes
    uint32_t cap_nodes
    uint32_t* ntable  # path table: probe slot -> node id + 1 (0: empty)
    uint64_t nmask  # its slots - 1
    Arena names  # member names, encoded paths
    size_t private_bytes  # bytes of private memory held (besides names)
    Pend* pend  # the walked document's terms and column values
    size_t n_pend
    size_t cap_pend
    unsigned char* scratch  # decoded strings and compacted array texts of the document
    size_t n_scratch
    size_t cap_scratch
    Frame* frames  # the container stack of the walk
    size_t cap_frames
    uint64_t serial  # object instances walked so far
    const unsigned char* doc  # the document being walked
    size_t doc_len
    DocError err  # the error of the document that failed last


cdef class SegmentBuilder:
    cdef Tail t  # the state (C functions work on it without the GIL)
    cdef bint _closed
    cdef object _path  # the file's path (None: anonymous memory)
    cdef object _max_depth_obj  # max_depth as given (error messages)
    cdef dict _colmap  # column key -> column id, learned from the column records
    cdef Py_ssize_t _pins  # calls that released the GIL and still read the mapping
    cdef bint _busy  # add_json/add_columns under way (one writer at a time)
    cdef bint _broken  # a batch failed midway: no more rows may be added
    cdef Py_ssize_t _learned  # column records learned into _colmap
    cdef _release(self)
    cdef _init_private(self)
    cdef int _check(self) except -1
    cdef int _check_writer(self) except -1
    cdef Py_ssize_t _cid(self, bytes column_key)
    cdef bytes _term_bytes(self, uint64_t tid)
    cdef bytes _col_key(self, uint64_t cid)
    cdef list _copy_columns(self, list cids, list counts)
    cdef object _dense(self, uint64_t cid, uint64_t k, uint64_t n)
    cdef _batch_failed(self, int code, uint64_t extra)
    cdef list _sort_prepare(self, TermSort* s)
    cdef list _stored_rows(self, uint64_t start, uint64_t stop)
