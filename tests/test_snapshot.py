"""The index-read interface: lookups, set algebra, fetch and column scans, before and after seals."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pytest

DOCS = [
    {"_id": 0, "x": 1, "s": "apple", "arr": [1, "one", {"k": "v0"}], "o": {"p": {"q": True}}},
    {"_id": 1, "x": 1.0, "s": "apricot", "arr": [], "o": {}},
    {"_id": 2, "x": 2.5, "s": "banana", "n": None},
    {"_id": 3, "x": "1", "s": "Apple"},
    {"_id": 4, "x": -3, "arr": [[2, 3], {"k": "v4"}], "n": 0},
    {"_id": 5, "x": True, "s": ""},
    {"_id": 6, "x": 1 << 60, "s": "a\x00b"},
]


def ids(snap, postings):
    return sorted(d["_id"] for d in snap.fetch(postings))


@pytest.fixture(params=["memory", "sealed", "mixed"])
def coll(db, request):
    c = db.create_collection("c", shards=2)
    if request.param == "memory":
        c.ingest(DOCS)
    elif request.param == "sealed":
        c.ingest(DOCS)
        c.flush()
    else:
        c.ingest(DOCS[:4])
        c.flush()
        c.ingest(DOCS[4:])
    return c


def test_equality_across_number_types(coll):
    s = coll.snapshot()
    assert ids(s, s.term("x", 1)) == [0, 1]
    assert ids(s, s.term("x", 1.0)) == [0, 1]
    assert ids(s, s.term("x", "1")) == [3]
    assert ids(s, s.term("x", True)) == [5]
    assert ids(s, s.term("x", 1 << 60)) == [6]
    assert ids(s, s.term("s", "a\x00b")) == [6]


def test_arrays_and_nested(coll):
    s = coll.snapshot()
    assert ids(s, s.term("arr", 1)) == [0]
    assert ids(s, s.term("arr", "one")) == [0]
    assert ids(s, s.term("arr", 3)) == [4]  # nested array elements are indexed under the path
    assert ids(s, s.term("arr.k", "v4")) == [4]
    assert ids(s, s.term("o.p.q", True)) == [0]
    assert ids(s, s.term(("o", "p", "q"), True)) == [0]


def test_null_missing_exists(coll):
    s = coll.snapshot()
    assert ids(s, s.term("n", None)) == [2]
    assert ids(s, s.exists("n")) == [2, 4]
    assert ids(s, s.missing("n")) == [0, 1, 3, 5, 6]
    assert ids(s, s.exists("arr")) == [0, 1, 4]  # [] exists
    assert ids(s, s.exists("o")) == [0, 1]  # {} exists
    assert ids(s, s.exists("x", types=["string"])) == [3]


def test_ranges(coll):
    s = coll.snapshot()
    assert ids(s, s.range("x", 1, 2.5)) == [0, 1]
    assert ids(s, s.range("x", 1, 2.5, hi_inclusive=True)) == [0, 1, 2]
    assert ids(s, s.range("x", 1, lo_inclusive=False)) == [2, 6]
    assert ids(s, s.range("x", hi=0)) == [4]
    assert ids(s, s.range("x", 0.5, 1.5)) == [0, 1]
    assert ids(s, s.range("x", float("-inf"), float("inf"))) == [0, 1, 2, 4, 6]
    assert ids(s, s.range("s", "a", "b")) == [0, 1, 6]
    assert ids(s, s.range("s", "apple", "apricot", hi_inclusive=True)) == [0, 1]
    assert ids(s, s.prefix("s", "ap")) == [0, 1]
    assert ids(s, s.prefix("s", "")) == [0, 1, 2, 3, 5, 6]
    with pytest.raises(TypeError):
        s.range("x", 1, "z")
    with pytest.raises(ValueError):
        s.range("x")


def test_timestamps(db):
    c = db.create_collection("t")
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    c.ingest([{"_id": i, "_event_time": t0.replace(day=1 + i)} for i in range(5)])
    s = c.snapshot()
    assert ids(s, s.range("_event_time", t0.replace(day=2), t0.replace(day=4))) == [1, 2]
    assert ids(s, s.term("_event_time", t0.replace(day=5))) == [4]
    assert s.column_types("_event_time") == ["timestamp"]


def test_set_algebra_and_count(coll):
    s = coll.snapshot()
    a, b = s.term("x", 1), s.prefix("s", "ap")
    assert ids(s, a & b) == [0, 1]
    assert ids(s, a | s.term("x", "1")) == [0, 1, 3]
    assert ids(s, s.all() - a) == [2, 3, 4, 5, 6]
    assert len(s.all()) == s.count() == len(DOCS)
    assert len(s.fetch(s.all(), limit=3)) == 3
    assert coll.snapshot() is s  # nothing written since: the same snapshot serves every read
    coll.ingest([{"_id": "late"}])
    later = coll.snapshot()
    assert later is not s and later.count() == s.count() + 1 and len(s.all()) == len(DOCS)
    with pytest.raises(ValueError):
        _ = a & later.all()


def test_scan_columns(coll):
    s = coll.snapshot()
    assert set(s.column_types("x")) == {"int", "float", "string", "bool"}
    t = s.scan([("x", "int"), ("x", "float"), ("s", "string"), ("arr", "array"), ("o.p.q", "bool")])
    assert t.num_rows == len(DOCS)
    assert t.column_names == ["_shard", "_row_id", "x:int", "x:float", "s:string", "arr:array", "o.p.q:bool"]
    by_s = {r["s:string"]: r for r in t.to_pylist()}
    assert by_s["apple"]["x:int"] == 1 and by_s["apple"]["x:float"] is None
    assert by_s["apple"]["arr:array"] == '[1,"one",{"k":"v0"}]' and by_s["apple"]["o.p.q:bool"] is True
    assert by_s["banana"]["x:float"] == 2.5
    # the row ids point at the rows themselves
    for r in t.to_pylist():
        shard = coll._shards[r["_shard"]]
        assert shard.fetch(np.array([r["_row_id"]], dtype=np.uint64))[0] is not None


def test_snapshot_is_isolated_from_later_writes(db):
    c = db.create_collection("c", shards=2)
    c.ingest([{"_id": i, "g": i % 2} for i in range(300)])
    s = c.snapshot()
    c.ingest([{"_id": i, "g": 5} for i in range(0, 300, 3)])
    for i in range(1, 300, 3):
        c.delete(i)
    c.flush()  # seals and merges while the old snapshot is held
    assert len(s.term("g", 0)) == 150 and len(s.term("g", 5)) == 0 and s.count() == 300
    assert sorted(d["_id"] for d in s.fetch(s.all())) == list(range(300))
    t = s.scan([("g", "int")])
    assert t.num_rows == 300 and sorted(t.column("g:int").to_pylist()) == [0] * 150 + [1] * 150
    now = c.snapshot()
    assert now.count() == 200 and len(now.term("g", 5)) == 100


def test_column_types_name_only_real_columns_in_memory_and_sealed(db):
    c = db.create_collection("ct", shards=1)
    c.ingest([{"_id": 1, "arr": [1, 2], "o": {"p": 1}, "x": None}])
    for _ in range(2):  # in the mutable segment, then sealed
        s = c.snapshot()
        assert s.column_types("arr") == ["array"]  # elements are terms, not a column
        assert s.column_types("o") == []  # objects have no column: their leaves do
        assert s.column_types("o.p") == ["int"] and s.column_types("x") == ["null"]
        assert s.scan([("arr", "array")]).column("arr:array").to_pylist() == ["[1,2]"]
        c.flush()


def test_postings_iterate_in_row_id_order_and_show_themselves(db):
    coll = db.create_collection("p", shards=3)
    coll.ingest([{"_id": i, "even": i % 2 == 0} for i in range(300)])  # several sealed segments a shard
    coll.ingest([{"_id": i, "even": True} for i in range(300, 310)])  # and rows still in memory
    snap = coll.snapshot()
    p = snap.term("even", True)
    pairs = list(p)
    assert pairs == p.row_ids() == sorted(pairs) and len(pairs) == len(p) == 160
    assert {s for s, _ in pairs} == {0, 1, 2}
    # the pairs name the rows fetch() reads, in the order it reads them
    assert [snap.term("_id", d["_id"]).row_ids()[0] for d in snap.fetch(p)] == pairs
    first = ", ".join(f"({s}, {r})" for s, r in pairs[:5])
    assert repr(p) == f"<rtindex.Postings 160 rows: {first}, ...>"
    (s, r), = snap.term("_id", 7)
    assert repr(snap.term("_id", 7)) == f"<rtindex.Postings 1 row: ({s}, {r})>"
    assert repr(snap.term("_id", "none")) == "<rtindex.Postings 0 rows>" and list(snap.term("_id", "none")) == []


def test_the_shared_snapshot_never_keeps_a_retired_segment(db):
    """Reads between writes share one snapshot; a write drops it at once, so the segments a
    merge retires are freed without waiting for another read."""
    import gc
    import weakref

    c = db.create_collection("r", shards=1)
    for start in range(0, 64 * 3, 64):  # three sealed segments of 64 rows: one short of a merge
        c.ingest([{"_id": i, "k": i % 3} for i in range(start, start + 64)])
        c.flush()
    before = c.snapshot()
    assert c.snapshot() is before and len(before.term("k", 1)) == 64
    sealed = [weakref.ref(v.seg) for v in before.states[0].views if v.sealed]
    assert len(sealed) == 3
    del before
    c.ingest([{"_id": i, "k": 9} for i in range(64 * 3, 64 * 4)])
    c.flush()  # the fourth: the four merge into one, retiring the first three
    gc.collect()
    assert c._snapshot is None  # no read since the writes
    assert all(ref() is None for ref in sealed)
    assert [v.limit for v in c.snapshot().states[0].views if v.sealed] == [256]
