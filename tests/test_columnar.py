"""rtindex.columnar: a record batch prepared column-wise, checked against the row path.

The row path (``inputs.batch_rows`` then ``documents.prepare`` per row) defines what a
table means; for every batch ``prepare`` accepts, each row's names and values, ``_id``,
id key, ``_event_time`` and JSON value must be what the row path gives (but for the
random ids both generate), and indexing the columns must equal indexing the row dicts.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtindex import columnar, documents, inputs, keys
from rtindex._py.segment import SegmentBuilder as PySegmentBuilder
from rtindex.columns import INDEXABLE_TYPES
from rtindex.datagen import product_clicks
from rtindex.documents import EVENT_TIME_MAX_US, EVENT_TIME_MIN_US, Limits
from rtindex.errors import SchemaError
from tests.test_segment import FLOATS, STRINGS, CySegmentBuilder, _settings, snapshot

NOW = 1_750_000_000_000_000
LIMITS = Limits()
INTEGER_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
UNITS = ["s", "ms", "us", "ns"]


def row_path(batch: pa.RecordBatch, limits: Limits = LIMITS) -> list:
    """Per row: (user id, id key, document, its JSON value) as the row path makes them, or
    the SchemaError it raises for that row."""
    out = []
    for _, doc in inputs.batch_rows(0, batch):
        try:
            doc_id, id_key, d, raw = documents.prepare(doc, limits, NOW, check_event_time=True)
        except SchemaError as e:
            out.append(e)
            continue
        out.append((doc_id, id_key, d, orjson.loads(raw)))
    return out


def check_prepared(batch: pa.RecordBatch, p: columnar.Prepared, limits: Limits = LIMITS) -> None:
    """``p`` is what the row path makes of ``batch``, row by row."""
    rows = row_path(batch, limits)
    assert len(p) == len(rows) == batch.num_rows
    assert [len(a) for a in p.arrays] == [batch.num_rows] * len(p.names)
    values = [a.to_pylist() for a in p.arrays]
    for i, expected in enumerate(rows):
        assert not isinstance(expected, SchemaError), (i, expected)  # eligible: the row path takes every row
        doc_id, id_key, d, value = expected
        if p.generated[i]:
            assert type(p.ids[i]) is str and len(p.ids[i]) == 32
            d = dict(d, _id=p.ids[i])  # (the row path drew another random id, at the same place)
            value = dict(value, _id=p.ids[i])
            doc_id, id_key = p.ids[i], documents.encode_id(p.ids[i])
        assert (type(p.ids[i]), p.ids[i]) == (type(doc_id), doc_id)
        assert p.id_keys[i] == id_key
        row = [(name, col[i]) for name, col in zip(p.names, values)]
        assert [(k, type(v), v) for k, v in row] == [(k, type(v), v) for k, v in d.items()], i
        got = orjson.loads(p.json[i])
        assert list(got) == list(value), i  # key order too
        assert [(type(v), v) for v in got.values()] == [(type(v), v) for v in value.values()], i


# ---------------------------------------------------------------- generated batches


@st.composite
def plain_column(draw, n: int):
    """A column of a type prepare takes, with nulls and repeated values."""
    kind = draw(st.sampled_from(["int", "float", "bool", "string", "large_string", "dict", "null",
                                 "timestamp", "duration"]))
    present = draw(st.lists(st.booleans(), min_size=n, max_size=n))

    def cells(values):
        pool = draw(st.lists(values, min_size=1, max_size=3))
        return [draw(st.sampled_from(pool) | values) if ok else None for ok in present]

    if kind == "int":
        t = draw(st.sampled_from(INTEGER_TYPES))
        info = np.iinfo(t.to_pandas_dtype())
        return pa.array(cells(st.integers(int(info.min), int(info.max))), t)
    if kind == "float":
        width = draw(st.sampled_from([16, 32, 64]))
        vals = cells(FLOATS | st.just(float("nan")))
        dtype = {16: np.float16, 32: np.float32, 64: np.float64}[width]
        with np.errstate(over="ignore"):
            arr = np.array([0.0 if v is None else v for v in vals], dtype=dtype)
        if not np.all(np.isfinite(arr[~np.isnan(arr)])):  # overflowed to inf in a narrow type
            arr[~np.isfinite(arr)] = 1.5
        return pa.array(arr, mask=np.array([v is None for v in vals], dtype=bool))
    if kind == "bool":
        return pa.array(cells(st.booleans()), pa.bool_())
    if kind in ("string", "large_string"):
        return pa.array(cells(STRINGS), pa.string() if kind == "string" else pa.large_string())
    if kind == "dict":
        return pa.array(cells(STRINGS), pa.string()).dictionary_encode()
    if kind == "null":
        return pa.nulls(n)
    unit = draw(st.sampled_from(UNITS))
    bound = keys.INT_MAX // {"s": 10**6, "ms": 10**3, "us": 1, "ns": 1}[unit] // 2
    t = pa.timestamp(unit, tz=draw(st.sampled_from([None, "UTC", "Europe/Lisbon"]))) if kind == "timestamp" \
        else pa.duration(unit)
    return pa.array(cells(st.integers(-bound, bound)), t)


@st.composite
def id_column(draw, n: int):
    present = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    kind = draw(st.sampled_from(["string", "int", "null"]))
    if kind == "int":
        if draw(st.booleans()):
            present = [True] * n  # (an integer _id column with nulls is left to the row path)
        return pa.array([draw(st.integers(keys.INT_MIN, keys.INT_MAX)) if ok else None for ok in present])
    if kind == "null":
        return pa.nulls(n)
    return pa.array([draw(STRINGS) if ok else None for ok in present])


@st.composite
def event_time_column(draw, n: int):
    present = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    if draw(st.booleans()):
        return pa.array([draw(st.integers(EVENT_TIME_MIN_US, EVENT_TIME_MAX_US - 1)) if ok else None
                         for ok in present])
    unit = draw(st.sampled_from(UNITS))
    per = {"s": 10**6, "ms": 10**3, "us": 1, "ns": 10**-3}[unit]
    lo = max(keys.INT_MIN + 1, int(-62_135_596_800_000_000 / per))
    hi = min(keys.INT_MAX, int(253_402_300_799_999_999 / per))
    return pa.array([draw(st.integers(lo, hi)) if ok else None for ok in present], pa.timestamp(unit))


@st.composite
def batches(draw):
    n = draw(st.integers(0, 8))
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "", "é", "a\x00", 'q"\\']), max_size=4, unique=True))
    cols = [draw(plain_column(n)) for _ in names]
    if draw(st.booleans()):
        names.insert(draw(st.integers(0, len(names))), "_id")
        cols.insert(names.index("_id"), draw(id_column(n)))
    if draw(st.booleans()):
        names.insert(draw(st.integers(0, len(names))), "_event_time")
        cols.insert(names.index("_event_time"), draw(event_time_column(n)))
    return pa.RecordBatch.from_arrays(cols, names=names) if cols else pa.RecordBatch.from_pylist([{}] * n)


@given(batch=batches())
@_settings(300)
def test_prepared_rows_are_the_row_paths(batch):
    p = columnar.prepare(batch, NOW, Limits())
    if p is not None:
        check_prepared(batch, p)


@given(batch=batches(), n_shards=st.integers(1, 5))
@_settings(100)
def test_split_and_index_as_the_rows(batch, n_shards):
    p = columnar.prepare(batch, NOW, Limits())
    if p is None:
        return
    parts = columnar.split(p, n_shards)
    rows = np.concatenate([part.rows for part in parts]) if parts else np.zeros(0, np.int64)
    assert sorted(rows.tolist()) == list(range(len(p)))
    for part in parts:
        assert part.rows.tolist() == sorted(part.rows.tolist())  # batch order kept
        assert all(documents.shard_of(p.id_keys[i], n_shards) == part.shard for i in part.rows.tolist())
        assert [a.to_pylist() for a in part.arrays] == [[a[i].as_py() for i in part.rows.tolist()] for a in p.arrays]
        # Row-wise: add_json of each row's JSON; column-wise: add_columns, with the same bytes.
        raws = [orjson.dumps(dict(zip(p.names, (a[i].as_py() for a in p.arrays)))) for i in part.rows.tolist()]
        for impl in (PySegmentBuilder, CySegmentBuilder):
            if impl is None:
                continue
            columnwise, rowwise = impl(), impl()
            assert columnwise.add_columns(p.names, part.arrays, raws) == 0
            assert rowwise.add_json(raws) == (list(range(len(raws))), [])
            assert snapshot(columnwise) == snapshot(rowwise)
            if impl is PySegmentBuilder:
                assert columnwise.nbytes == rowwise.nbytes


# ---------------------------------------------------------------- by hand


def test_the_clicks_table_is_eligible():
    table = pa.Table.from_pylist(list(product_clicks(500)))
    batch = table.to_batches()[0]
    p = columnar.prepare(batch, NOW, Limits())
    assert p.names == ["_id", "city", "product_id", "clicks", "impressions", "ts", "_event_time"]
    assert p.generated == [False] * 500 and p.ids[:2] == ["pc-0", "pc-1"]
    assert p.arrays[-1].to_pylist() == [NOW] * 500
    check_prepared(batch, p)


def one(arr, name="v"):
    return pa.RecordBatch.from_arrays([arr], names=[name])


@pytest.mark.parametrize("arr", [
    pa.array([1, None], pa.uint64()),
    pa.array([2**63 - 1], pa.uint64()),
    pa.array([1.5, None, float("nan")], pa.float32()),
    pa.array(np.array([0.5, -2.0], np.float16)),
    pa.array(["x", None, "x"]).dictionary_encode(),
    pa.array([1, 2, 1], pa.int8()).dictionary_encode(),
    pa.array([-1, 1, None, -(2**63) + 1000], pa.timestamp("ns", tz="UTC")),
    pa.array([-1, 1001, None], pa.duration("ns")),
    pa.array([-5, 7], pa.timestamp("s")),
    pa.array([True, None]),
    pa.nulls(2),
    pa.array(["é", "\x00", None], pa.large_string()),
])
def test_eligible_types_normalize_as_the_row_path(arr):
    p = columnar.prepare(one(arr), NOW, Limits())
    assert p is not None
    assert all(a.type in INDEXABLE_TYPES for a in p.arrays)
    check_prepared(one(arr), p)


@pytest.mark.parametrize("batch", [
    one(pa.array([2**63], pa.uint64())),  # over int64: the builder refuses it
    one(pa.array([1.0, float("inf")])),  # the row path refuses that row alone
    one(pa.array([[1, 2]])),
    one(pa.array([b"x"])),
    one(pa.array([dt.date(2024, 1, 1)])),
    one(pa.array([{"a": 1}])),
    one(pa.array([1], pa.decimal128(5, 2))),
    one(pa.array([1.5]), "_id"),  # an _id must be a string or an integer
    one(pa.array([True]), "_id"),
    one(pa.array([1, None]), "_id"),  # its filled ids would be strings among integers
    one(pa.array(["x" * 1023]), "_id"),  # over MAX_ID_BYTES
    one(pa.array([1_700_000_000]), "_event_time"),  # seconds, not microseconds
    one(pa.array(["2024-01-01"]), "_event_time"),
    one(pa.array([2**62], pa.timestamp("us")), "_event_time"),  # beyond datetime
    one(pa.array([2**62], pa.timestamp("s"))),  # overflows microseconds
    one(pa.array([-(2**63) + 999], pa.timestamp("ns"))),  # numpy's conversion overflows
    pa.RecordBatch.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"]),
])
def test_not_eligible(batch):
    assert columnar.prepare(batch, NOW, Limits()) is None


def test_ids_and_event_times_filled_in_place_or_at_the_end():
    batch = pa.RecordBatch.from_arrays(
        [pa.array([None, 1_700_000_000_000_001]), pa.array([None, "k"]), pa.array([1, 2])],
        names=["_event_time", "_id", "x"])
    p = columnar.prepare(batch, NOW, Limits())
    assert p.names == ["_event_time", "_id", "x"]
    assert p.arrays[0].to_pylist() == [NOW, 1_700_000_000_000_001]
    assert p.generated == [True, False] and p.ids[1] == "k"
    check_prepared(batch, p)
    p = columnar.prepare(one(pa.array([1, 2])), NOW, Limits())
    assert p.names == ["v", "_id", "_event_time"] and p.generated == [True, True]
    assert len(set(p.ids)) == 2


def test_timestamp_event_time_may_be_any_time():
    arr = pa.array([dt.datetime(1900, 1, 1), None, dt.datetime(9999, 12, 31)], pa.timestamp("us"))
    p = columnar.prepare(one(arr, "_event_time"), NOW, Limits())
    assert p.arrays[0].to_pylist()[1] == NOW
    check_prepared(one(arr, "_event_time"), p)


def test_json_of_awkward_values():
    floats = [1e300, 0.1, -0.0, 5e-324, 1.0, 1e16, 1.7976931348623157e308, -2.5e-8]
    strs = ['q"uote', "back\\slash", "ctl\x01\x1f\x7f", "\x00", "é😀", "\u2028", "", "/"]
    ints = [keys.INT_MIN, keys.INT_MAX, 0, -1, 1, 2**53 + 1, -(2**53) - 1, 7]
    batch = pa.RecordBatch.from_arrays([pa.array(floats), pa.array(strs), pa.array(ints)], names=["f", "s", "i"])
    p = columnar.prepare(batch, NOW, Limits())
    check_prepared(batch, p)


def test_rows_over_max_document_bytes_are_left_to_the_row_path():
    limits = Limits(max_document_bytes=200)
    batch = one(pa.array(["x" * 50, "y" * 150]))
    assert columnar.prepare(batch, NOW, limits) is None
    batch = one(pa.array(["x" * 50, "y" * 80]))
    check_prepared(batch, columnar.prepare(batch, NOW, limits), limits)


def test_split_one_shard_and_empty():
    p = columnar.prepare(one(pa.array([1, 2, 3])), NOW, Limits())
    (part,) = columnar.split(p, 1)
    assert part.shard == 0 and part.rows.tolist() == [0, 1, 2] and part.arrays is p.arrays
    empty = columnar.prepare(one(pa.array([], pa.int64())), NOW, Limits())
    assert len(empty) == 0 and columnar.split(empty, 3) == [] and columnar.split(empty, 1) == []


def test_json_connection_cannot_read_files(tmp_path):
    from rtindex import duck

    (tmp_path / "x.csv").write_text("a\n1\n")
    # a key is a bound parameter, never SQL text
    key = f"') FROM read_csv('{tmp_path / 'x.csv'}') --"
    text = duck.json_objects([key], [pa.array([1])])
    assert orjson.loads(text[0].as_py()) == {key: 1}
    con = duck._json_local.con
    with pytest.raises(Exception, match="disabled|Permission|not allowed"):
        con.sql(f"SELECT * FROM read_csv('{tmp_path / 'x.csv'}')").fetchall()


def _stored(db, name: str) -> list[dict]:
    """Every document of collection ``name``, without the _event_time that two loads fill
    in at different times, and any generated _id (which differ) as "generated"."""
    docs = db.sql(f"SELECT * FROM {name}").rows()
    for d in docs:
        d.pop("_event_time")
        if len(d["_id"]) == 32:
            d["_id"] = "generated"
    return sorted(docs, key=lambda d: (str(d["_id"]), str(d.get("k"))))


def test_a_table_is_stored_as_its_rows_are(db):
    """Collection.ingest of record batches: some column-wise (an upsert of a stored id, the
    same id twice in a batch, nulls), one that only the row path takes (a list column),
    one with a row it refuses; stats, documents and queries as if the rows came as dicts."""
    schema = pa.schema([("_id", pa.string()), ("k", pa.string()), ("v", pa.float64())])
    batches = [
        pa.record_batch([pa.array(["a", "b", "a", None]), pa.array(["x", None, "y", "z"]),
                         pa.array([1.0, float("nan"), 2.5, 3.0])], schema=schema),
        pa.record_batch([pa.array(["b", "c"]), pa.array(["w", "x"]), pa.array([None, 4.0])], schema=schema),
    ]
    listy = pa.record_batch([pa.array(["d"]), pa.array([[1, 2]])], names=["_id", "k"])
    refused = pa.record_batch([pa.array(["e", "f"]), pa.array([1, 2]),
                               pa.array(["2024-01-01T00:00:00", "not a time"])], names=["_id", "k", "_event_time"])
    assert all(columnar.prepare(b, NOW, LIMITS) is not None for b in batches)
    assert columnar.prepare(listy, NOW, LIMITS) is None and columnar.prepare(refused, NOW, LIMITS) is None
    by_table = db.create_collection("by_table", shards=3)
    by_rows = db.create_collection("by_rows", shards=3)
    stats = []
    for coll in (by_table, by_rows):
        got = [coll.ingest(pa.Table.from_batches(batches), batch_size=4, errors="report")]
        for b in (listy, refused):
            got.append(coll.ingest(b if coll is by_table else b.to_pylist(), errors="report"))
        stats.append(got)
    for t, r in zip(*stats):
        assert (t.n, t.bytes, t.replaced, [(e.index, e.path, e.message) for e in t.errors]) == \
               (r.n, r.bytes, r.replaced, [(e.index, e.path, e.message) for e in r.errors])
        assert len(t.ids) == len(r.ids) and [i for i in t.ids if len(i) < 32] == [i for i in r.ids if len(i) < 32]
    assert [len(s.errors) for s in stats[0]] == [0, 0, 1]
    assert stats[0][0].replaced == [2, 4]  # "a" again in its batch, "b" stored by the first batch
    generated = [i for i in stats[0][0].ids if i not in ("a", "b", "c")]
    assert len(generated) == 1 and len(generated[0]) == 32
    table_docs, row_docs = _stored(db, "by_table"), _stored(db, "by_rows")
    assert table_docs == row_docs
    assert {d["_id"]: d.get("k") for d in table_docs} == {"a": "y", "b": "w", "c": "x", "generated": "z",
                                                          "d": [1, 2], "e": 1}
    q = "SELECT k, count(*) AS n FROM {} WHERE v IS NOT NULL GROUP BY k ORDER BY k"
    assert db.sql(q.format("by_table")).rows() == db.sql(q.format("by_rows")).rows()


def test_a_dataframe_is_stored_as_its_rows_are(db):
    """A DataFrame goes column-wise where Arrow holds its values exactly, and as rows where
    it does not (an object column of ints and floats mixed): the same documents either way."""
    import pandas as pd

    df = pd.DataFrame({
        "_id": [f"r{i}" for i in range(6)],
        "i": [1, 2, 3, 4, 5, 6],
        "f": [0.5, np.nan, 1e300, -0.0, 2.0, 3.25],
        "b": [True, False, True, True, False, False],
        "s": ["x", None, "é\x00", "", "y", "z"],
        "cat": pd.Categorical(["a", "b", "a", "b", "a", "b"]),
        "nullable": pd.array([1, None, 3, None, 5, 6], dtype="Int64"),
        "t": pd.to_datetime(["2024-01-01T00:00:00.0000015", None, "1969-12-31T23:59:59.9999995",
                             "2024-01-02", "2024-01-03", "2024-01-04"], format="ISO8601"),
        "tz": pd.to_datetime(["2024-01-01T01:00:00+01:00"] * 6),
        "mixed": [1, 2.5, 3, 4, 5, 6],
    }).set_index("_id")
    mixed = df.assign(mixed=pd.Series([1, 2.5, 3, 4, 5, 6], dtype=object, index=df.index))
    assert [isinstance(p, pa.RecordBatch) for _, p in inputs._dataframe_slices(df, 3)] == [True, True]
    assert [isinstance(p, list) for _, p in inputs._dataframe_slices(mixed, 3)] == [True, True]
    for name, frame in {"plain": df, "mixed": mixed}.items():
        by_frame = db.create_collection(f"{name}_frame")
        by_rows = db.create_collection(f"{name}_rows")
        a = by_frame.ingest(frame, batch_size=3, errors="report")
        # the row path: each cell's JSON value by _pandas_values (what a DataFrame means)
        cols = [frame.index] + [frame[c] for c in frame.columns]
        names = ["_id", *frame.columns]
        rows = [doc for _, doc in inputs._rows(names, [inputs._pandas_values(c, n == "_event_time")
                                                      for n, c in zip(names, cols)], len(frame), 0)]
        b = by_rows.ingest(rows, errors="report")
        assert (a.n, a.errors) == (b.n, b.errors) and a.n == 6 and not a.errors  # (bytes: 1e300 or 1e+300)
        assert _stored(db, f"{name}_frame") == _stored(db, f"{name}_rows")
