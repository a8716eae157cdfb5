"""Point queries from terms to rows in one compiled call: the same results as ``rtindex/_py/point.py``.

``rtindex/_py/point.py`` is the contract (its docstrings state the arguments and the
order of the rows); tests/test_point.py checks both against the general read path on
generated collections. A point query's work is a few posting lists and a few cached rows;
here the loops between them (views, slots, row ids, copies) run in C, and the rows come
through each shard's fetch (the row cache). The GIL is held throughout: every step makes
or reads Python objects (posting sets, cached dicts and their copies).
"""

from cpython.list cimport PyList_GET_ITEM

from rtindex._ext._blocks import terms_get
from rtindex._ext._lru import copy_json

__all__ = ["PointLookup"]


cdef class PointLookup:
    """One snapshot's views, laid out for point queries (see rtindex._py.point.PointLookup)."""

    cdef list _slot_shard      # per slot (a distinct (shard, base), sorted): its shard
    cdef list _slot_base       # and its base
    cdef list _view_slot       # per view: its slot
    cdef list _view_seg        # its segment
    cdef list _view_limit      # its row limit
    cdef list _view_deleted    # its deleted offsets (a FrozenBitMap)
    cdef list _sealed          # the views of sealed segments
    cdef list _terms           # and their term indexes
    cdef list _mem             # the views of in-memory segments
    cdef list _fetchers        # per shard: fetch(row_ids, charge) -> decoded rows (Shard.fetch)

    def __init__(self, list views, list fetchers):
        cdef dict slot_of = {}
        cdef Py_ssize_t i
        self._slot_shard, self._slot_base = [], []
        for v in sorted(views, key=lambda v: (v[0], v[1])):
            key = (v[0], v[1])
            if key not in slot_of:
                slot_of[key] = len(self._slot_shard)
                self._slot_shard.append(v[0])
                self._slot_base.append(v[1])
        self._view_slot = [slot_of[(v[0], v[1])] for v in views]
        self._view_seg = [v[2] for v in views]
        self._view_limit = [v[3] for v in views]
        self._view_deleted = [v[4] for v in views]
        self._sealed = [i for i in range(len(views)) if views[i][5] is not None]
        self._terms = [views[i][5] for i in self._sealed]
        self._mem = [i for i in range(len(views)) if views[i][5] is None]
        self._fetchers = fetchers

    def rows(self, list terms, scalars, marker, list array_markers, limit, Py_ssize_t offset, bint copy,
             max_rows, charge):
        """See rtindex._py.point.PointLookup.rows."""
        cdef dict hits = {}  # view -> offsets
        cdef dict per_slot = {}  # slot -> offsets
        cdef Py_ssize_t j, v, slot, n = 0, n_out, skip, k, got
        cdef object bm, seg, lim, deleted, old
        for term in terms:
            for j, bm in terms_get(self._terms, term):
                v = self._sealed[j]
                old = hits.get(v)
                hits[v] = bm if old is None else old | bm
        for v in self._mem:
            seg, lim = self._view_seg[v], self._view_limit[v]
            for term in terms:
                bm = seg.postings(term, lim)
                if bm:
                    old = hits.get(v)
                    hits[v] = bm if old is None else old | bm
        for v, bm in hits.items():
            seg, lim, deleted = self._view_seg[v], self._view_limit[v], self._view_deleted[v]
            if deleted:
                bm = bm - deleted
            if scalars is not None and bm and seg.has_columns(scalars, lim):
                bm = bm & seg.array_rows(marker, lim)
            if bm:
                slot = self._view_slot[v]
                old = per_slot.get(slot)
                per_slot[slot] = bm if old is None else old | bm
        if array_markers and per_slot:
            for v in range(len(self._view_slot)):
                slot = self._view_slot[v]
                if slot in per_slot:
                    seg = self._view_seg[v]
                    if seg.may_have_arrays(array_markers):
                        lim = self._view_limit[v]
                        for m in array_markers:
                            per_slot[slot] = per_slot[slot] - seg.array_rows(m, lim)
        for bm in per_slot.values():
            n += len(bm)
        n_out = max(0, n - offset)
        if limit is not None:
            n_out = min(n_out, <Py_ssize_t>limit)
        if max_rows is not None and n_out > <Py_ssize_t>max_rows:
            return n, None
        cdef list docs = []
        cdef list rids
        skip = offset
        got = 0
        for slot in sorted(per_slot):  # (shard, base) order: a shard's rows come together
            if got >= n_out:
                break
            offs = list(per_slot[slot])
            if skip >= len(offs):
                skip -= len(offs)
                continue
            base = self._slot_base[slot]
            rids = [base + <object>PyList_GET_ITEM(offs, k) for k in range(skip, min(len(offs), skip + n_out - got))]
            docs.extend(self._fetchers[self._slot_shard[slot]](rids, charge))
            got += len(rids)
            skip = 0
        if copy:
            return n, [copy_json(d) for d in docs]
        return n, docs
