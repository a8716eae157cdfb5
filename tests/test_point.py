"""Point lookups in one call (rtindex/_ext/_point.pyx, rtindex/_py/point.py): on generated
collections (sealed and in-memory segments, deletes, upserts, arrays on the way to a path,
mixed types), the compiled lookup and the reference give what the general read path gives
(``Snapshot.matching`` then ``Snapshot.fetch``): the same count, the same rows in the same
order, the same charge, and copies the caller may change."""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rtindex
from rtindex._impl import IMPLEMENTATION
from rtindex._py.point import PointLookup as PyPointLookup
from rtindex.rowcache import json_bytes

SCALARS = st.sampled_from([0, 1, 1.0, 2.5, "x", "y", True, False, None])
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.fixed_dictionaries({"k": inner}),
                      max_leaves=4)
DOC = st.fixed_dictionaries({}, optional={"k": VALUES, "a": VALUES, "n": st.fixed_dictionaries({"k": VALUES})})
# (path, value, contains): what is looked up after each history
LOOKUPS = [(path, value, contains) for path in ("k", "a.k", "n.k", "a")
           for value in (0, 1, "x", True, None, 2.5) for contains in (False, True)]


def implementations() -> list[type]:
    found = [PyPointLookup]
    if IMPLEMENTATION == "cython":
        from rtindex._ext._point import PointLookup
        found.append(PointLookup)
    return found


def make_lookup(cls: type, snap):
    return cls(*snap._point_layout())


def point_args(path: str, value, contains: bool):
    """What Snapshot.point passes, worked out the same way (its own call is checked too)."""
    from rtindex import keys
    from rtindex.snapshot import _typed
    p = keys.split_path(path)
    typed = _typed(value)
    terms = [keys.term(p, tag, v) for tag, v in typed]
    scalars = [keys.column_key(p, tag) for tag, _ in typed] if contains else None
    marker = keys.column_key(p, keys.ARRAY) if contains else None
    markers = [keys.column_key(p[:i], keys.ARRAY) for i in range(1, len(p) + (0 if contains else 1))]
    return terms, scalars, marker, markers


HISTORY = st.lists(st.tuples(st.sampled_from(["ingest", "delete", "flush"]), st.lists(DOC, min_size=1, max_size=6),
                             st.lists(st.integers(0, 30), max_size=3)), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=HISTORY, shards=st.sampled_from([1, 2]), window=st.tuples(st.none() | st.integers(0, 4),
                                                                          st.integers(0, 3)),
       cache_bytes=st.sampled_from([0, 1 << 20]))
def test_lookups_match_the_general_path(history, shards, window, cache_bytes):
    limit, offset = window
    with tempfile.TemporaryDirectory() as d:
        db = rtindex.open(d, seal_rows=4, row_cache_bytes=cache_bytes)
        try:
            c = db.create_collection("c", shards=shards)
            next_id = 0
            for op, docs, ids in history:
                if op == "ingest":  # new ids, and upserts of ids seen before
                    batch = []
                    for i, doc in enumerate(docs):
                        _id = ids[i] % max(next_id, 1) if i < len(ids) and next_id else next_id
                        next_id = max(next_id, _id + 1)
                        batch.append({**doc, "_id": str(_id)})
                    c.ingest(batch)
                elif op == "delete" and next_id:
                    for i in ids:
                        c.delete(str(i % next_id))
                else:
                    c.flush()
            snap = c.snapshot()
            for cls in implementations():
                lookup = make_lookup(cls, snap)
                for path, value, contains in LOOKUPS:
                    rows = snap.matching(path, value, contains)
                    want = snap.fetch(rows, limit, offset=offset)
                    if value is None:
                        continue  # (Snapshot.point answers NULL itself)
                    for attempt in range(2):  # the second one from the cache, when on
                        charge = [0]
                        n, got = lookup.rows(*point_args(path, value, contains), limit, offset, True, None,
                                             charge)
                        assert (n, got) == (len(rows), want), (cls, path, value, contains)
                        assert charge[0] == json_bytes(want) or cache_bytes and charge[0] > 0
                    if want and cache_bytes:  # copies: changing one leaves the cache alone
                        got[0]["changed"] = 1
                        assert "changed" not in lookup.rows(*point_args(path, value, contains), limit, offset,
                                                            True, None, None)[1][0]
                    n, none = lookup.rows(*point_args(path, value, contains), limit, offset, True,
                                          len(want) - 1 if want else None, None)
                    assert none is None if want else none == []
                assert snap.point("k", 1) == (len(snap.matching("k", 1)), snap.fetch(snap.matching("k", 1)))
        finally:
            db.close()


def test_a_point_query_sees_a_write_right_after_it(db):
    """A snapshot's lookup is made once; the next write makes a new snapshot, and so a new lookup."""
    c = db.create_collection("c", shards=2)
    c.ingest([{"_id": "a", "k": 1}])
    assert [(r["_id"], r["k"]) for r in db.sql("SELECT * FROM c WHERE k = :v", {"v": 1}).rows()] == [("a", 1)]
    c.ingest([{"_id": "b", "k": 1}, {"_id": "a", "k": 2}])
    assert db.sql("SELECT _id FROM c WHERE k = :v", {"v": 1}).rows() == [{"_id": "b"}]
    assert [r["_id"] for r in db.sql("SELECT * FROM c WHERE k = :v", {"v": 1}).rows()] == ["b"]
