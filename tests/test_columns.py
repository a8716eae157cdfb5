"""Taking values from column chunks with numpy (rtindex/columns.py) against Arrow's take.

``Chunk.take`` + ``gather`` must give exactly what ``pa.concat_arrays`` of Arrow takes gives,
for every column type, with nulls, over sliced (offset) arrays and unaligned buffers; and a
snapshot's scan of the rows an index matched (sealed segments, the in-memory one, deleted
rows) must equal its full scan filtered to those rows.
"""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from rtindex import columns, keys

VALUES = {
    keys.INT: st.integers(-(2**63), 2**63 - 1),
    keys.FLOAT: st.floats(allow_nan=True, allow_infinity=True),
    keys.STRING: st.text(max_size=6),
    keys.BOOL: st.booleans(),
    keys.TIMESTAMP: st.datetimes(timezones=st.just(timezone.utc), min_value=datetime(1970, 1, 1),
                                 max_value=datetime(2100, 1, 1)),
    keys.ARRAY: st.sampled_from(["[]", "[1,2]", '["a"]']),
    keys.NULL: st.just(True),
}


@st.composite
def chunks(draw, tag):
    """An Arrow array of the tag's type (nulls optional), maybe a slice of a longer one, and
    positions into it; ``unaligned``: its buffers copied to an odd address, as a mapped
    segment file may hold them."""
    values = draw(st.lists(st.one_of(st.none(), VALUES[tag]) if draw(st.booleans()) else VALUES[tag], max_size=30))
    arr = pa.array(values, type=columns.arrow_type(tag))
    if len(arr) and draw(st.booleans()):
        start = draw(st.integers(0, len(arr) - 1))
        arr = arr.slice(start, draw(st.integers(0, len(arr) - start)))
    if draw(st.booleans()):
        arr = _unaligned(arr)
    positions = draw(st.lists(st.integers(0, len(arr) - 1), max_size=20)) if len(arr) else []
    return arr, np.array(positions, dtype=np.intp)


def _unaligned(arr: pa.Array) -> pa.Array:
    """``arr`` with every buffer at an address one past a multiple of 8."""
    bufs = []
    for b in arr.buffers():
        if b is None:
            bufs.append(None)
            continue
        raw = np.zeros(b.size + 1, dtype=np.uint8)
        raw[1:] = np.frombuffer(b, dtype=np.uint8)
        bufs.append(pa.py_buffer(raw).slice(1))
    return pa.Array.from_buffers(arr.type, len(arr), bufs, arr.null_count, arr.offset)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), tag=st.sampled_from(list(VALUES)), parts=st.integers(0, 4))
def test_gather_equals_arrow_take(data, tag, parts):
    taken, want = [], []
    for _ in range(parts):
        arr, positions = data.draw(chunks(tag))
        positions = np.asarray(positions, dtype=np.int64)
        present = data.draw(st.booleans())
        taken.append(columns.Chunk(arr).part(positions) if present else columns.missing_part(positions))
        want.append(arr.take(pa.array(positions, type=pa.int64())) if present or len(positions) == 0
                    else pa.nulls(len(positions), columns.arrow_type(tag)))
    got = columns.gather(tag, taken)
    got.validate(full=True)
    expected = pa.concat_arrays(want) if want else pa.array([], type=columns.arrow_type(tag))
    assert got.type == columns.arrow_type(tag)
    assert got.null_count == expected.null_count
    assert pc.all(pc.equal(pc.is_null(got), pc.is_null(expected))).as_py() in (True, None)
    if tag == keys.FLOAT:  # NaN != NaN: compare the bits
        got_bits = got.fill_null(0.0).to_numpy(zero_copy_only=False).view(np.int64)
        want_bits = expected.fill_null(0.0).to_numpy(zero_copy_only=False).view(np.int64)
        assert (got_bits == want_bits).all()
    else:
        assert got.to_pylist() == expected.to_pylist()


def test_scan_of_matched_rows_equals_the_full_scan_filtered(open_db):
    c = open_db(seal_rows=16, merge_factor=2).create_collection("c", shards=2)
    docs = [{"_id": i, "g": i % 7, "x": i if i % 5 else None, "f": i / 3, "s": "s" * (i % 4), "b": i % 3 == 0,
             "mixed": i if i % 2 else str(i)} for i in range(400)]
    for start in (0, 100, 200):  # sealed segments, merged ones without the rows deleted before ...
        c.ingest(docs[start:start + 100])
        for i in range(start, start + 100, 13):
            c.delete(i)
        c.flush()
    for k in range(300, 400, 10):  # ... and rows in the in-memory segment (a batch of more than
        c.ingest(docs[k:k + 10])  # seal_rows would rotate it out whole, to be sealed at any moment)
    for i in range(0, 400, 11):
        c.delete(i)
    s = c.snapshot()
    views = [v for _, v in s._views()]
    assert any(v.sealed and not v.seg.live_dense for v in views)
    assert any(v.sealed and v.deleted for v in views) and any(not v.sealed for v in views)
    specs = [("x", "int"), ("f", "float"), ("s", "string"), ("b", "bool"), ("mixed", "int"),
             ("mixed", "string"), ("absent", "int")]
    full = s.scan(specs)
    for g in (0, 3, 99):
        rows = s.term("g", g)
        got = s.scan(specs, rows=rows)
        got.validate(full=True)
        assert got.schema == full.schema
        ids = set(rows)
        keep = pa.array([(sh, r) in ids for sh, r in zip(full.column("_shard").to_pylist(),
                                                         full.column("_row_id").to_pylist())])
        assert got.to_pylist() == full.filter(keep).to_pylist()
