"""Point queries from terms to rows in one call: the reference of ``rtindex/_ext/_point.pyx``.

A point query (``WHERE path = :v``, ``ARRAY_CONTAINS(path, :v)``) looks a few terms up in
every segment of every shard, keeps the visible rows, and hands back copies of the cached
rows. Done step by step through the general read path's objects (posting sets per view,
then a fetch per shard), the steps between the compiled parts cost several times the
lookup itself; :class:`PointLookup` lays one snapshot's views out once and runs the whole
way in one call. Both implementations give the same rows in the same order (shard, then
row id) as ``Snapshot.matching`` followed by ``Snapshot.fetch`` (tests/test_point.py).
"""

from __future__ import annotations

from typing import Callable

from pyroaring import BitMap

from rtindex._py.lru import copy_json


class PointLookup:
    """One snapshot's views, laid out for point queries.

    ``views``: one ``(shard, base, seg, limit, deleted, terms)`` per view with rows, in shard
    then base order; ``seg`` has ``postings(term, limit)``, ``array_rows(marker, limit)``,
    ``has_columns(keys, limit)`` and ``may_have_arrays(keys)`` (rtindex/segments.py);
    ``terms`` is a sealed segment's TermIndex, None for an in-memory segment. Two views may
    share a (shard, base) (a replica's in-memory copy of rows the writer has sealed since):
    their rows are united. ``fetchers``: per shard, ``fetch(row_ids, charge)``, the decoded
    rows the snapshot shows through the row cache (shared objects; Shard.fetch).
    """

    def __init__(self, views: list[tuple], fetchers: list[Callable[[list[int], list[int] | None], list[dict]]]):
        slot_of: dict[tuple[int, int], int] = {}
        self._slots: list[tuple[int, int]] = []  # (shard, base), sorted
        for shard, base, *_ in sorted(views, key=lambda v: (v[0], v[1])):
            if (shard, base) not in slot_of:
                slot_of[(shard, base)] = len(self._slots)
                self._slots.append((shard, base))
        # (slot, seg, limit, deleted) per view; the sealed ones' term indexes in one list
        self._views = [(slot_of[(v[0], v[1])], v[2], v[3], v[4]) for v in views]
        self._sealed = [i for i, v in enumerate(views) if v[5] is not None]
        self._terms = [views[i][5] for i in self._sealed]
        self._mem = [i for i, v in enumerate(views) if v[5] is None]
        self._fetchers = fetchers
    def rows(self, terms: list[bytes], scalars: list[bytes] | None, marker: bytes | None,
             array_markers: list[bytes], limit: int | None, offset: int, copy: bool,
             max_rows: int | None, charge: list[int] | None) -> tuple[int, list[dict] | None]:
        """``(n, rows)``: the number of visible rows holding one of ``terms`` (with
        ``scalars``, in a view having one of those column keys, only rows also holding
        ``marker``: ARRAY_CONTAINS's elements), less those holding one of ``array_markers``;
        and their documents after the first ``offset``, at most ``limit`` (copies with
        ``copy``, else the cached objects). ``rows`` is None, and nothing fetched, when
        there would be more than ``max_rows``. ``charge``: see RowStoreCache.rows."""
        views = self._views
        hits: dict[int, BitMap] = {}  # view -> offsets
        for term in terms:
            for v, index in zip(self._sealed, self._terms):
                bm = index.get(term)
                if bm is not None:
                    hits[v] = hits[v] | bm if v in hits else bm
        for v in self._mem:
            _, seg, lim, _ = views[v]
            for term in terms:
                bm = seg.postings(term, lim)
                if bm:
                    hits[v] = hits[v] | bm if v in hits else bm
        per_slot: dict[int, BitMap] = {}
        for v, bm in hits.items():
            slot, seg, lim, deleted = views[v]
            if deleted:
                bm = bm - deleted
            if scalars is not None and bm and seg.has_columns(scalars, lim):
                bm = bm & seg.array_rows(marker, lim)
            if bm:
                per_slot[slot] = per_slot[slot] | bm if slot in per_slot else bm
        if array_markers and per_slot:
            for v, (slot, seg, lim, deleted) in enumerate(views):
                if slot in per_slot and seg.may_have_arrays(array_markers):
                    for m in array_markers:
                        per_slot[slot] = per_slot[slot] - seg.array_rows(m, lim)
        n = sum(len(bm) for bm in per_slot.values())
        n_out = max(0, n - offset) if limit is None else max(0, min(n - offset, limit))
        if max_rows is not None and n_out > max_rows:
            return n, None
        docs: list[dict] = []
        skip = offset
        for slot in sorted(per_slot):  # (shard, base) order
            if len(docs) >= n_out:
                break
            shard, base = self._slots[slot]
            offs = list(per_slot[slot])
            if skip >= len(offs):
                skip -= len(offs)
                continue
            docs.extend(self._fetchers[shard]([base + o for o in offs[skip:skip + n_out - len(docs)]], charge))
            skip = 0
        return n, [copy_json(d) for d in docs] if copy else docs
