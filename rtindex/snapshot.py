"""The index-read interface: one consistent snapshot of every shard of a collection.

The SQL layer is built on this: term and range lookups return :class:`Postings` (row sets)
that combine with ``&``, ``|`` and ``-``; rows are fetched by row id; chosen columns of all
(or of selected) rows come back as Arrow.
"""

from __future__ import annotations

import functools
import itertools
import math
from datetime import datetime
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Protocol, Sequence

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from rtindex import columns, keys
from rtindex._impl import PointLookup, terms_get
from rtindex.documents import to_event_time
from rtindex.errors import ClosedError
from rtindex.rowcache import copy_json

if TYPE_CHECKING:
    from rtindex.segments import ShardState, View

Path = str | Sequence[str]
_NUMERIC_INT_TAGS = (keys.INT, keys.TIMESTAMP)
_REPR_ROWS = 5  # how many (shard, row id) pairs repr(Postings) shows
_FEW_ROWS = 16  # up to this many row ids (a part's in by_shard, all in fetch): Python ints, not numpy


class Postings:
    """A set of rows of one snapshot, each named by (shard, row id).

    Combine with ``&``, ``|`` and ``-``; ``len()`` counts the rows; iterating yields their
    (shard, row id) pairs in :meth:`row_ids` order; :meth:`Snapshot.fetch` reads the
    documents. Held as a BitMap of offsets per (shard, segment base).
    """

    __slots__ = ("_snap", "_parts", "_len")

    def __init__(self, snap: "Snapshot", parts: dict[tuple[int, int], BitMap]):
        self._snap = snap
        self._parts = {k: v for k, v in parts.items() if v}
        self._len: int | None = None  # (the parts never change: counted once)

    def _combine(self, other: "Postings", op) -> "Postings":
        if other._snap is not self._snap:
            raise ValueError("cannot combine postings of two different snapshots")
        return Postings(self._snap, op(self._parts, other._parts))

    def __and__(self, other: "Postings") -> "Postings":
        return self._combine(other, lambda a, b: {k: a[k] & b[k] for k in a.keys() & b.keys()})

    def __or__(self, other: "Postings") -> "Postings":
        def union(a, b):
            out = dict(a)
            for k, v in b.items():
                out[k] = out[k] | v if k in out else v
            return out
        return self._combine(other, union)

    def __sub__(self, other: "Postings") -> "Postings":
        if not other._parts and other._snap is self._snap:  # (postings never change: self is the difference)
            return self
        return self._combine(other, lambda a, b: {k: (v - b[k] if k in b else v) for k, v in a.items()})

    def __len__(self) -> int:
        if self._len is None:
            self._len = sum(len(v) for v in self._parts.values())
        return self._len

    def __bool__(self) -> bool:
        return bool(self._parts)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """(shard, row id) of every row, ordered by shard then row id, as :meth:`row_ids`."""
        for (shard, base) in sorted(self._parts):
            for offset in self._parts[(shard, base)]:
                yield shard, base + offset

    def __repr__(self) -> str:
        """The count and the first (shard, row id) pairs: ``<rtindex.Postings 7 rows: (0, 3), ...>``."""
        first = [f"({shard}, {rid})" for shard, rid in itertools.islice(self, _REPR_ROWS)]
        n = len(self)
        more = ", ..." if n > len(first) else ""
        rows = f": {', '.join(first)}{more}" if first else ""
        return f"<rtindex.Postings {n:,} row{'' if n == 1 else 's'}{rows}>"

    def row_ids(self) -> list[tuple[int, int]]:
        """(shard, row id) of every row, ordered by shard then row id."""
        return list(self)

    def by_shard(self) -> dict[int, np.ndarray]:
        """Row ids per shard, increasing, as uint64 arrays."""
        parts: dict[int, list[np.ndarray]] = {}
        for (shard, base) in sorted(self._parts):
            bm = self._parts[(shard, base)]
            if len(bm) <= _FEW_ROWS:  # a selective lookup's: Python ints beat numpy's fixed costs
                ids = np.array([base + o for o in bm], dtype=np.uint64)
            else:
                ids = np.frombuffer(bm.to_array(), dtype=np.uint32).astype(np.uint64) + np.uint64(base)
            parts.setdefault(shard, []).append(ids)
        return {shard: (a[0] if len(a) == 1 else np.concatenate(a)) for shard, a in parts.items()}


class _Collection(Protocol):
    """What a snapshot needs of its collection (rtindex.collection.Collection)."""

    name: str
    _shards: list

    @property
    def closed(self) -> bool: ...


class Snapshot:
    """What one read sees: never blocks writers, never changes. Reads between two writes
    share one (``Collection.snapshot()`` returns the same object until a shard publishes
    a new state)."""

    def __init__(self, coll: _Collection, states: list["ShardState"] | None = None):
        self._coll = coll
        self._shards = coll._shards
        self.states: list[ShardState] = states if states is not None else [s.state for s in self._shards]
        # What lookups need, worked out once: the collection hands the same snapshot to every
        # query until a shard publishes a new state (Collection.snapshot), and per-shard loops
        # cost a microsecond or two each on a lookup that is otherwise a few. The views with
        # rows as (shard, view) pairs; the sealed ones apart, with their term indexes in one
        # flat list (terms_get looks a term up in all of them in one call) and the union of
        # their column keys; the in-memory ones.
        self._views_with_rows = [(i, v) for i, st in enumerate(self.states) for v in st.views if v.limit]
        self._sealed = [(i, v) for i, v in self._views_with_rows if v.sealed]
        self._terms = [v.seg.terms for _, v in self._sealed]
        self._column_keys = frozenset().union(*(v.seg.column_set for _, v in self._sealed))
        self._mem = [(i, v) for i, v in self._views_with_rows if not v.sealed]
        self._count = sum(st.count() for st in self.states)
        self.next_row_ids = tuple(st.next_row_id for st in self.states)  # (rows written, per shard)
        # the planners' questions (has_type, column_types), answered once per snapshot: each
        # asks every view, and every query asks them again
        self._memo: dict[tuple[str, bytes], Any] = {}
        self._point: PointLookup | None = None  # made by the first point query

    def _check(self) -> None:
        if self._coll.closed:
            raise ClosedError(f"collection {self._coll.name!r} is closed")

    def _views(self) -> Iterator[tuple[int, "View"]]:
        self._check()
        # the views with rows (a fresh in-memory segment has none: nothing to look up there)
        return iter(self._views_with_rows)

    def count(self) -> int:
        """Number of visible documents, without reading them."""
        return self._count

    def _collect(self, rows_of) -> Postings:
        """Postings of ``rows_of(shard, view)`` (a BitMap of offsets) over every view.

        Two views of a shard can share a base (a read replica's in-memory copy of rows that
        the writer has since sealed, masked, starts where the sealed segment does): their
        offsets name the same row ids, so they are united, never overwritten."""
        parts: dict[tuple[int, int], BitMap] = {}
        shards = self._shards
        for i, v in self._views():
            bm = rows_of(shards[i], v)
            if not bm:  # (most views hold no row of a selective lookup)
                continue
            k = (i, v.base)
            parts[k] = parts[k] | bm if k in parts else bm
        return Postings(self, parts)

    # -- lookups ------------------------------------------------------------
    def all(self) -> Postings:
        """Every visible row."""
        return self._collect(lambda shard, v: shard.all_rows(v))

    def term(self, path: Path, value: Any) -> Postings:
        """Rows where ``path`` (an array's elements included) equals ``value``.

        Numbers compare by value across int, float and timestamp; ``None`` finds JSON null.
        """
        p = keys.split_path(path)
        return Postings(self, self._term_parts([keys.term(p, tag, v) for tag, v in _typed(value)]))

    def _term_parts(self, terms: list[bytes], scalars: list[bytes] | None = None,
                    marker: bytes | None = None) -> dict[tuple[int, int], BitMap]:
        """Offsets of the rows holding any of ``terms``, per (shard, base) (Postings parts).
        With ``scalars`` (column keys), in a view that has one of those columns a hit counts
        only if the row also holds the term ``marker`` (see :meth:`elements`). The sealed
        segments of every shard are looked up in one compiled call per term."""
        self._check()
        shards, sealed = self._shards, self._sealed
        hits: list[tuple[int, View, BitMap]] = []
        for term in terms:
            hits.extend((*sealed[j], bm) for j, bm in terms_get(self._terms, term))
        for i, v in self._mem:
            bm = BitMap().union(*(shards[i].term(v, t) for t in terms))
            if bm:
                hits.append((i, v, bm))
        parts: dict[tuple[int, int], BitMap] = {}
        for i, v, bm in hits:
            if v.deleted:
                bm = bm - v.deleted
            if scalars is not None and shards[i].has_columns(v, scalars):
                bm &= shards[i].array_rows(v, marker)
            if bm:
                k = (i, v.base)
                parts[k] = parts[k] | bm if k in parts else bm
        return parts

    def elements(self, path: Path, value: Any) -> Postings:
        """Rows where ``path`` holds an array with an element equal to ``value`` (elements of
        nested arrays too), by :meth:`term`'s rules; a scalar equal to ``value`` is no match.

        The array test costs nothing in a segment where ``path`` never holds a scalar of a
        type that could equal ``value``: there every hit is an element.
        """
        p = keys.split_path(path)
        typed = _typed(value)
        terms = [keys.term(p, tag, v) for tag, v in typed]
        scalars = [keys.column_key(p, tag) for tag, _ in typed]
        return Postings(self, self._term_parts(terms, scalars, keys.column_key(p, keys.ARRAY)))

    def matching(self, path: Path, value: Any, contains: bool = False) -> Postings:
        """What SQL's ``path = value`` (or, with ``contains``, ``ARRAY_CONTAINS(path, value)``)
        is TRUE for: :meth:`term` (:meth:`elements`) less the rows where an array on the way
        to ``path`` (or ``path`` itself, for ``=``) makes it name no single value (docs/sql.md,
        rule 1). NULL matches nothing. One call, as a point query makes it."""
        if value is None:
            self._check()
            return Postings(self, {})
        hits = self.elements(path, value) if contains else self.term(path, value)
        return hits - self.arrays(path, include_self=not contains) if hits else hits

    def point(self, path: Path, value: Any, contains: bool = False, limit: int | None = None, offset: int = 0,
              max_rows: int | None = None, charge: list[int] | None = None) -> tuple[int, list[dict] | None]:
        """:meth:`matching` and :meth:`fetch` of its rows in one compiled call, as a point
        query runs them: (how many rows match, copies of their documents after the first
        ``offset``, at most ``limit``; None, and nothing fetched, when that is more than
        ``max_rows``). ``charge``: see :meth:`fetch`."""
        self._check()
        if value is None:
            return 0, []
        p = keys.split_path(path)
        typed = _typed(value)
        terms = [keys.term(p, tag, v) for tag, v in typed]
        scalars = [keys.column_key(p, tag) for tag, _ in typed] if contains else None
        markers = self._array_markers(p, include_self=not contains)
        lookup = self._point
        if lookup is None:
            lookup = self._point = PointLookup(*self._point_layout())
        return lookup.rows(terms, scalars, keys.column_key(p, keys.ARRAY) if contains else None, markers,
                           limit, offset, True, max_rows, charge)

    def _point_layout(self) -> tuple[list[tuple], list[tuple]]:
        """The views and the per-shard fetches (through the row cache) a PointLookup of this
        snapshot is made of."""
        views = [(i, v.base, v.seg, v.limit, v.deleted, v.seg.terms if v.sealed else None)
                 for i, v in self._views_with_rows]
        return views, [functools.partial(shard.fetch, state=st) for shard, st in zip(self._shards, self.states)]

    def range(self, path: Path, lo: Any = None, hi: Any = None, *, lo_inclusive: bool = True,
              hi_inclusive: bool = False, budget: list[int] | None = None) -> Postings:
        """Rows where ``lo <(=) path <(=) hi``; numbers (and timestamps) or strings, not both.

        ``budget``: see :meth:`prefix`.
        """
        p = keys.split_path(path)
        ranges = _key_ranges(p, lo, hi, lo_inclusive, hi_inclusive)
        return self._ranges(ranges, budget)

    def prefix(self, path: Path, prefix: str, budget: list[int] | None = None) -> Postings:
        """Rows where the string at ``path`` starts with ``prefix`` (LIKE 'prefix%').

        ``budget``, for query planners: a one-item list holding how many distinct terms the
        lookup may read; it is decremented, and ``rtindex.segments.OverBudget`` is raised when
        the range holds more (a sign that a column scan is cheaper).
        """
        lo = keys.column_key(keys.split_path(path), keys.STRING) + keys.escape(prefix.encode("utf-8"))
        return self._ranges([(lo, keys.prefix_upper_bound(lo))], budget)

    def exists(self, path: Path, types: Iterable[str] | None = None) -> Postings:
        """Rows that have ``path`` at all (any type, null included), or one of ``types``."""
        p = keys.split_path(path)
        tags = [keys.TAGS_BY_NAME[t] for t in types] if types is not None else list(keys.TAG_NAMES)
        ranges = []
        for tag in tags:
            ck = keys.column_key(p, tag)
            ranges.append((ck, keys.prefix_upper_bound(ck)))
        return self._ranges(ranges)

    def missing(self, path: Path) -> Postings:
        """Rows that do not have ``path`` at all (JSON null counts as present)."""
        return self.all() - self.exists(path)

    def arrays(self, path: Path, include_self: bool = True) -> Postings:
        """Rows where a field on the way to ``path`` (and, with ``include_self``, ``path``
        itself) holds an array: there ``path`` names no single value, only elements, which
        :meth:`term` and :meth:`range` also find."""
        markers = self._array_markers(keys.split_path(path), include_self)
        if not markers:
            self._check()
            return Postings(self, {})

        def rows_of(shard, v):
            if not shard.has_arrays(v, markers):
                return None
            bm = BitMap().union(*(shard.array_rows(v, m) for m in markers))
            return bm - v.deleted if v.deleted else bm
        return self._collect(rows_of)

    def _array_markers(self, p: tuple[str, ...], include_self: bool) -> list[bytes]:
        """The array markers (ARRAY column keys) of the fields on the way to ``p`` (and of
        ``p`` itself with ``include_self``); none when no segment can hold an array there,
        the common case."""
        markers = [keys.column_key(p[:i], keys.ARRAY) for i in range(1, len(p) + (1 if include_self else 0))]
        return [] if self._column_keys.isdisjoint(markers) and not self._mem else markers

    def _ranges(self, ranges: list[tuple[bytes, bytes]], budget: list[int] | None = None) -> Postings:
        ranges = [(lo, hi) for lo, hi in ranges if lo < hi]
        return self._collect(lambda shard, v: BitMap().union(*(shard.term_range(v, lo, hi, budget)
                                                                for lo, hi in ranges)))

    # -- rows and columns ---------------------------------------------------
    def fetch(self, rows: Postings, limit: int | None = None, *, offset: int = 0, copy: bool = True,
              charge: list[int] | None = None) -> list[dict]:
        """The documents of ``rows`` (in shard, row id order), after the first ``offset``, at
        most ``limit``: so a large result can be read in chunks.

        Rows come through the database's RowStoreCache. ``copy=False`` returns the cached
        objects themselves (no copy, for readers that only read them: never modify those).
        ``charge`` (a one-item list): what the documents take as Python objects is added to
        it (rtindex.rowcache.json_bytes; known to the cache, so usually not serialized).
        """
        self._check()  # (cached rows would not notice a closed store)
        out: list[dict] = []
        if len(rows) <= _FEW_ROWS:  # a selective lookup's: Python ints beat numpy's fixed costs
            per_shard: dict[int, Any] = {}
            for shard, base in sorted(rows._parts):
                per_shard.setdefault(shard, []).extend([base + o for o in rows._parts[(shard, base)]])
        else:
            per_shard = rows.by_shard()
        for shard, rids in per_shard.items():
            if offset >= len(rids):
                offset -= len(rids)
                continue
            rids, offset = rids[offset:], 0
            if limit is not None:
                rids = rids[: limit - len(out)]
            docs = self._shards[shard].fetch(rids, charge, self.states[shard])
            out.extend([copy_json(d) for d in docs] if copy else docs)
            if limit is not None and len(out) >= limit:
                break
        return out

    def has_type(self, path: Path, type_name: str) -> bool:
        """Whether some row may hold a ``type_name`` value (an array element, or a row deleted
        since, counts) at ``path``: a cheap, conservative test for planners."""
        ck = keys.column_key(keys.split_path(path), keys.TAGS_BY_NAME[type_name])
        found = self._memo.get(("has_type", ck))
        if found is None:
            found = self._memo[("has_type", ck)] = any(self._shards[i].has_terms(v, ck) for i, v in self._views())
        self._check()
        return found

    def column_types(self, path: Path) -> list[str]:
        """Type names with a column for ``path`` in any segment (what scan() can return)."""
        path_key = keys.encode_path(keys.split_path(path))
        found = self._memo.get(("column_types", path_key))
        if found is None:
            tags = set().union(*(self._shards[i].column_tags(v, path_key) for i, v in self._views()))
            found = self._memo[("column_types", path_key)] = [keys.TAG_NAMES[t] for t in sorted(tags)]
        self._check()
        return list(found)

    def field_paths(self) -> set[tuple[str, ...]]:
        """Every field path some row may hold (with each object on the way to one): what
        the SQL layer's warnings compare a query's fields with (deleted rows count)."""
        paths = set()
        for i, v in self._views():
            for ck in self._shards[i].column_keys(v):
                path = keys.decode_path(ck[:-1])
                paths.update(path[:n] for n in range(1, len(path) + 1))
        return paths

    def scan(self, specs: Sequence[tuple[Path, str]], rows: Postings | None = None) -> pa.Table:
        """Columns of every visible row, or of ``rows``: ``specs`` lists (path, type name) pairs.

        The table has ``_shard`` and ``_row_id`` and one column per spec named
        ``"<dotted path>:<type>"``; a row without a value of that path and type is null.
        With ``rows`` (what an index lookup matched), the values are taken from the column
        store at those rows: the fields a query needs without reading whole documents.
        """
        colkeys = [keys.column_key(keys.split_path(p), keys.TAGS_BY_NAME[t]) for p, t in specs]
        names = [f"{'.'.join(keys.split_path(p))}:{t}" for p, t in specs]
        schema = pa.schema([("_shard", pa.uint16()), ("_row_id", pa.uint64())]
                           + [(n, columns.arrow_type(keys.tag_of(ck))) for n, ck in zip(names, colkeys)])
        if rows is not None:  # a few rows of many views: taken with numpy, one array per column
            if rows._snap is not self:
                raise ValueError("rows of another snapshot")
            shards, bases, offsets, taken = [], [], [np.zeros(0, np.uint32)], []
            for i, v in self._views():
                part = rows._parts.get((i, v.base))
                if part is not None:
                    offs, values = self._shards[i].take_view(v, colkeys, part)
                    shards.append(i)
                    bases.append(v.base)
                    offsets.append(offs)
                    taken.append(values)
            counts = [len(o) for o in offsets[1:]]
            rids = np.concatenate(offsets).astype(np.uint64) + np.repeat(np.array(bases, dtype=np.uint64), counts)
            ids = [pa.array(np.repeat(np.array(shards, dtype=np.uint16), counts)), pa.array(rids)]
            return pa.Table.from_arrays(ids + [columns.gather(keys.tag_of(ck), [t[j] for t in taken])
                                               for j, ck in enumerate(colkeys)], schema=schema)
        batches = []
        for i, v in self._views():
            offsets, cols = self._shards[i].scan_view(v, colkeys)
            rids = pa.array(offsets.to_numpy().astype(np.uint64) + np.uint64(v.base))
            shard = pa.array(np.full(len(offsets), i, dtype=np.uint16))
            batches.append(pa.record_batch([shard, rids, *cols], names=["_shard", "_row_id", *names]))
        return pa.Table.from_batches(batches, schema=schema)


def _typed(value: Any) -> list[tuple[int, Any]]:
    """The (tag, value) pairs equal to ``value`` under rtindex's comparison rules."""
    if value is None:
        return [(keys.NULL, None)]
    if isinstance(value, bool):
        return [(keys.BOOL, value)]
    if isinstance(value, str):
        return [(keys.STRING, value)]
    if isinstance(value, datetime):
        value = to_event_time(value)
    if isinstance(value, int):
        out = [(keys.INT, value), (keys.TIMESTAMP, value)] if keys.INT_MIN <= value <= keys.INT_MAX else []
        f = float(value)
        if math.isfinite(f) and int(f) == value:
            out.append((keys.FLOAT, f))
        return out
    if isinstance(value, float):
        if not math.isfinite(value):
            return []
        out = [(keys.FLOAT, value)]
        if value.is_integer() and keys.INT_MIN <= value <= keys.INT_MAX:
            out += [(keys.INT, int(value)), (keys.TIMESTAMP, int(value))]
        return out
    raise TypeError(f"cannot look up a value of type {type(value).__name__}")


def _domain(b: Any) -> str | None:
    if b is None:
        return None
    if isinstance(b, bool):
        return "bool"
    if isinstance(b, str):
        return "string"
    if isinstance(b, (int, float, datetime)):
        return "number"
    raise TypeError(f"cannot compare with a value of type {type(b).__name__}")


def _key_ranges(p, lo, hi, lo_inc, hi_inc) -> list[tuple[bytes, bytes]]:
    doms = {_domain(lo), _domain(hi)} - {None}
    if len(doms) > 1:
        raise TypeError(f"range bounds of different types: {lo!r} and {hi!r}")
    if not doms:
        raise ValueError("a range needs at least one bound")
    dom = doms.pop()
    if isinstance(lo, datetime):
        lo = to_event_time(lo)
    if isinstance(hi, datetime):
        hi = to_event_time(hi)
    if isinstance(lo, float) and (math.isnan(lo) or lo == math.inf):
        return []
    if isinstance(hi, float) and (math.isnan(hi) or hi == -math.inf):
        return []
    if dom == "string":
        return [_one_range(p, keys.STRING, lo, hi, lo_inc, hi_inc)]
    if dom == "bool":
        return [_one_range(p, keys.BOOL, lo, hi, lo_inc, hi_inc)]
    out = []
    ilo, ihi = _int_bounds(lo, hi, lo_inc, hi_inc)
    if ilo is None or ihi is None or ilo <= ihi:
        for tag in _NUMERIC_INT_TAGS:
            out.append(_one_range(p, tag, ilo, ihi, True, True))
    flo, flo_inc = _float_bound(lo, lo_inc, up=False)
    fhi, fhi_inc = _float_bound(hi, hi_inc, up=True)
    out.append(_one_range(p, keys.FLOAT, flo, fhi, flo_inc, fhi_inc))
    return out


def _one_range(p, tag, lo, hi, lo_inc, hi_inc) -> tuple[bytes, bytes]:
    return keys.term_bounds(keys.column_key(p, tag), tag, lo, hi, lo_inc, hi_inc)


def _int_bounds(lo, hi, lo_inc, hi_inc):
    """Inclusive integer bounds equivalent to the given numeric bounds (None: unbounded)."""
    ilo = ihi = None
    if lo is not None:
        if isinstance(lo, float):
            if lo == math.inf:
                return 1, 0
            ilo = None if lo == -math.inf else (math.ceil(lo) if lo_inc else math.floor(lo) + 1)
        else:
            ilo = lo if lo_inc else lo + 1
        if ilo is not None:
            if ilo > keys.INT_MAX:
                return 1, 0
            ilo = max(ilo, keys.INT_MIN)
    if hi is not None:
        if isinstance(hi, float):
            if hi == -math.inf:
                return 1, 0
            ihi = None if hi == math.inf else (math.floor(hi) if hi_inc else math.ceil(hi) - 1)
        else:
            ihi = hi if hi_inc else hi - 1
        if ihi is not None:
            if ihi < keys.INT_MIN:
                return 1, 0
            ihi = min(ihi, keys.INT_MAX)
    return ilo, ihi


def _float_bound(b, inc: bool, up: bool) -> tuple[float | None, bool]:
    """A float bound selecting the same floats as the (possibly int) bound ``b``."""
    if b is None or isinstance(b, float):
        if b is not None and math.isinf(b):
            return None, True
        return b, inc
    f = float(b)
    if f == b:
        return f, inc
    if up:  # floats x with x <(=) b: f rounds b; the nearest float on the right side of b
        return (f if f < b else math.nextafter(f, -math.inf)), True
    return (f if f > b else math.nextafter(f, math.inf)), True
