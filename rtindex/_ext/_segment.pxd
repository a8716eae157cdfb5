# Declarations of the compiled mutable segment builder (implementation in _segment.pyx).
from cpython.array cimport array
from cpython.object cimport PyObject
from libc.stdint cimport int64_t, uint32_t, uint64_t

from rtindex._ext._types cimport offset_t, term_id_t


cdef enum:
    PLIST_INLINE = 2  # a posting list of up to this many rows lives inside its PList


cdef struct U32Vec:
    uint32_t* data  # heap buffer (NULL until the first push)
    size_t n  # entries in use
    size_t cap  # entries allocated


cdef struct Buf:
    unsigned char* data  # heap buffer (NULL until the first append)
    size_t n  # bytes in use
    size_t cap  # bytes allocated: room(most ever in use, BUF_MIN)


cdef struct Copy:
    unsigned char* dst  # into a new Arrow buffer
    const unsigned char* src  # NULL: fill with 0xFF bytes instead (a NULL column's trues)
    size_t n  # bytes
    unsigned char last  # bits of the last byte that are values (0: all; else the others are cleared)


cdef union PData:
    offset_t* heap  # heap buffer, when n > PLIST_INLINE (capacity: max(8, next power of 2))
    offset_t inl[PLIST_INLINE]  # inline storage, when n <= PLIST_INLINE (most terms)


cdef struct PList:
    uint32_t n  # row offsets in use, strictly increasing (the capacity follows from n)
    offset_t last  # the last offset (when n > 0): the once-per-row test reads no array
    PData d  # the offsets


cdef struct TSlot:
    uint64_t key  # the term's TEntry.key (compared here, so a probe reads no entry)
    uint32_t cid1  # column id + 1; 0 marks an empty slot
    term_id_t tid  # the term: index in SegmentBuilder._terms


cdef struct TEntry:
    uint64_t key  # value key: encoded int/float/timestamp, 0/1 for bools, 0 for null and
                  # markers, hash(str) for strings (then checked against the stored str)
    uint32_t cid1  # column id + 1
    term_id_t tid  # term id: creation order, this entry's index in _terms
    PyObject* sv  # (borrowed from _vals) the str of a STRING term, else NULL
    PList pl  # the term's postings


cdef struct Pending:
    uint64_t key  # the term's TEntry.key
    uint32_t cid  # its column id
    term_id_t hint  # _commit, STRING terms: the first term with this key and column, or NO_TERM
    PyObject* sv  # owned reference to the str of a STRING term, else NULL


cdef struct SortItem:
    uint64_t key  # sort key at the current depth: TEntry.key for numeric terms; for strings
                  # 8 bytes of the encoded value (big-endian, zero-padded), the first 8 first
    TEntry* e  # the term's entry (the terms cannot move while a TermSort exists)
    const unsigned char* v  # string term: its encoded value (escaped UTF-8 + 00 00) in
                            # the TermSort arena, its length in the 8 bytes before; else NULL


cdef struct TermSort:
    SortItem* items  # every term, bucketed by column key rank; in term order once sorted
    size_t n  # terms (== SegmentBuilder._n_terms)
    size_t* bucket  # rank -> start of its bucket in items (n_ranks + 1 entries, the last n)
    SortItem* tmp  # scratch of the radix sort (as large as the largest bucket)
    unsigned char** chunks  # the arena: encoded values of the string terms, each after its
                            # length (a size_t), in chunks that never move
    size_t n_chunks  # chunks in use
    size_t chunks_cap  # entries of chunks allocated
    unsigned char* free_at  # first free byte of the last chunk
    size_t free_len  # free bytes there
    uint32_t* rank_of  # column id -> rank of its column key among the sorted column keys
    size_t n_ranks  # column keys with terms
    const unsigned char** ck  # rank -> column key bytes (borrowed: the _Column objects own them)
    Py_ssize_t* ck_len  # rank -> column key length
    unsigned char* ck_tag  # rank -> type tag
    TEntry** cand  # entries whose postings may encode as roaring (>= 64 rows), in term order
    size_t n_cand  # entries of cand in use
    size_t cand_cap  # entries of cand allocated
    const unsigned char** ser  # write_blocks: cand i -> its serialized BitMap (borrowed), NULL: raw
    Py_ssize_t* ser_len  # write_blocks: cand i -> length of ser
    size_t bad  # write_blocks: index in items of the first term too long for a block


cdef struct Where:
    const Where* up  # the enclosing container, NULL at the document root
    PyObject* key  # object key of this value (borrowed), NULL for an array element
    Py_ssize_t index  # array index of this value when key is NULL


cdef class _Column:
    cdef bytes key  # column key: encoded path + type tag (the prefix of every term below)
    cdef int tag  # keys.NULL ... keys.OBJECT
    cdef uint32_t cid  # column id: index in SegmentBuilder._cols
    cdef U32Vec tids  # this column's term ids, in creation order
    cdef U32Vec offs  # column store: row offsets of the values below (leaves outside arrays)
    cdef Buf vals  # column store values, as Arrow lays them out: int64 (INT, TIMESTAMP), double
                   # (FLOAT), one bit each, least significant first (BOOL), UTF-8 one after
                   # another (STRING, ARRAY: the JSON text); unused for NULL (all true)
    cdef Buf ends  # STRING, ARRAY: int64 end of each value in vals (Arrow's offsets but the 0)


cdef class _Node:
    cdef bytes enc  # encoded path (ends with PATH_END); b"" for the document root
    cdef dict children  # exact str key -> child _Node (the path-encoding cache)
    cdef object key  # the key object this node was last reached by (identity fast path)
    cdef _Node last_child  # the child created or looked up last
    cdef PyObject* first_child  # (borrowed) the child walked first last time: the prediction
    cdef PyObject* next_sib  # (borrowed) the sibling walked after this node last time
    cdef bint is_event_time  # the top-level `_event_time` path (ints become TIMESTAMP)
    cdef _Column c_null  # columns of this path, one per type tag, None until first used
    cdef _Column c_bool
    cdef _Column c_int
    cdef _Column c_float
    cdef _Column c_str
    cdef _Column c_ts
    cdef _Column c_arr
    cdef _Column c_obj


cdef class SegmentBuilder:
    cdef object _max_depth_obj  # max_depth as given (used in error messages)
    cdef Py_ssize_t _max_depth  # max_depth clamped to Py_ssize_t (used in comparisons)
    cdef _Node _root  # root of the path tree
    cdef Pending* _pend  # scratch: terms of the row being added, in walk order (then resolved)
    cdef size_t _n_pend  # entries of _pend in use
    cdef size_t _cap_pend  # entries of _pend allocated
    cdef TSlot* _table  # open-addressing (linear probing) term table: (column, key) -> term id
    cdef size_t _mask  # table slots - 1 (slots: a power of two)
    cdef size_t _count  # occupied slots (== _n_terms)
    cdef TEntry* _terms  # term id -> the term (dense, in creation order; moves as it grows)
    cdef Py_ssize_t _n_terms  # distinct terms
    cdef Py_ssize_t _cap_terms  # entries of _terms allocated
    cdef list _vals  # term id -> value (the str of a STRING term; None or the value otherwise)
    cdef list _cols  # column id -> _Column
    cdef dict _colobjs  # column key -> _Column (including ones without any term yet)
    cdef list _colkeys  # column keys with at least one term, in first-term order
    cdef Py_ssize_t _n  # rows added
    cdef Py_ssize_t _nbytes  # memory held beyond what nbytes computes from _n_terms (see nbytes)
    cdef offset_t _off  # offset of the row being added
    cdef U32Vec _doc_terms  # scratch: term ids that got a posting for the row being added
    cdef PyObject** _doc_cols  # scratch: columns (borrowed) that got a value for that row
    cdef size_t _n_doc_cols  # entries of _doc_cols in use
    cdef size_t _cap_doc_cols  # entries of _doc_cols allocated
    cdef bint _busy  # inside add(): guards against re-entry (e.g. from another thread)
    cdef Py_ssize_t _fail_at  # tests: MemoryError before resolving queued term n (-1: never)
    cdef Py_ssize_t _pins  # write_blocks()/column()/columns() calls under way (they may release
                          # the GIL): add() refuses

    cdef TEntry* _find(self, uint32_t cid, uint64_t key, str sv)
    cdef TEntry* _find_tid(self, Py_ssize_t tid)
    cdef size_t _slot_of(self, Py_ssize_t tid)
    cdef term_id_t _likely_tid(self, uint64_t key, uint32_t cid1) noexcept
    cdef TEntry* _insert(self, _Column col, uint64_t key, object sv) except NULL
    cdef int _grow_table(self) except -1
    cdef void _delete_slot(self, size_t i) noexcept
    cdef int _queue(self, _Column col, uint64_t key, object sv) except -1
    cdef int _commit(self) except -1
    cdef void _release_pending(self) noexcept
    cdef int _post(self, TEntry* e) except -1
    cdef int _col_add(self, _Column col, const void* v, size_t n, str s) except -1
    cdef list _copy_columns(self, list cols, list cuts)
    cdef bytes _term_bytes(self, Py_ssize_t tid)
    cdef Py_ssize_t _term_id(self, bytes term) except -2
    cdef array _postings_copy(self, Py_ssize_t tid, uint64_t limit)
    cdef list _sort_prepare(self, TermSort* s)
    cdef int _sort_terms(self, TermSort* s) noexcept nogil
    cdef _Node _lookup_child(self, _Node parent, object key)
    cdef _Node _new_child(self, _Node parent, object key)
    cdef _Node _child(self, _Node parent, object key)
    cdef _Column _new_column(self, _Node node, int tag)
    cdef int _walk_object(self, object obj, _Node node, const Where* where, Py_ssize_t depth,
                          bint in_array) except -1
    cdef int _walk_value(self, object v, _Node parent, object key, _Node node,
                         const Where* where, Py_ssize_t depth, bint in_array) except -1
    cdef int _walk_container(self, object v, _Node parent, object key, _Node node,
                             const Where* where, Py_ssize_t depth, bint in_array) except -1
    cdef int _walk_array(self, object v, _Node parent, object key, _Node node,
                         const Where* where, Py_ssize_t depth, bint in_array) except -1
    cdef int _leaf_str(self, str v, _Node parent, object key, _Node node,
                       const Where* where, bint in_array) except -1
    cdef int _leaf_int(self, object v, _Node parent, object key, _Node node,
                       const Where* where, Py_ssize_t depth, bint in_array) except -1
    cdef int _leaf_float(self, object v, _Node parent, object key, _Node node,
                         const Where* where, bint in_array) except -1
    cdef int _leaf_fixed(self, object v, int tag, _Node parent, object key, _Node node,
                         bint in_array) except -1
    cdef int _rollback(self, Py_ssize_t n_terms_before, Py_ssize_t nbytes_before) except -1
    cdef int _drop_terms(self, Py_ssize_t n_terms_before) except -1
    cdef Py_ssize_t _first_non_finite(self, object arr) except -2
    cdef _Column _touch(self, _Node node, int tag, Py_ssize_t j, list touched)
    cdef int _add_column(self, _Node node, object arr, Py_ssize_t j, Py_ssize_t n, offset_t base,
                         list touched) except -1
    cdef TEntry* _term(self, _Column col, uint64_t key) except NULL
    cdef int _post_at(self, TEntry* e, offset_t off) except -1
    cdef int _add_null(self, _Column ncol, offset_t off, TEntry** null_e, TEntry** null_terms) except -1
    cdef int _add_nulls(self, _Column ncol, Py_ssize_t n, offset_t base) except -1
    cdef int _add_fixed(self, _Column col, _Column ncol, const unsigned char* data,
                        const unsigned char* valid, Py_ssize_t start, Py_ssize_t n,
                        offset_t base) except -1
    cdef int _add_strings(self, _Column col, _Column ncol, object offsets_buf, bint large,
                          object data_buf, const unsigned char* valid, Py_ssize_t start,
                          Py_ssize_t n, offset_t base) except -1
    cdef void _hash_ahead(self, const unsigned char* offsets, bint large, const unsigned char* data,
                          int64_t lo, int64_t hi, const unsigned char* valid, Py_ssize_t row,
                          uint32_t cid1, uint64_t* key, bint* ascii_value) noexcept
    cdef int _order_column_keys(self, Py_ssize_t k0, list touched) except -1
    cdef int _rollback_columns(self, offset_t base, Py_ssize_t n_terms_before,
                               Py_ssize_t nbytes_before, list touched) except -1
