"""What ``Collection.ingest`` takes (rtindex/inputs.py), how Python values are stored
(rtindex/documents.py: json_value, _event_time), what it does with failures (errors=),
progress, and Ctrl-C: all through a real database, files and subprocesses."""

from __future__ import annotations

import datetime as dt
import enum
import fcntl
import gzip
import io
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time
import uuid
import warnings
from decimal import Decimal

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rtindex
from rtindex import documents
from rtindex.documents import EVENT_TIME_MAX_US, EVENT_TIME_MIN_US

T_US = 1_700_000_000_000_000  # 2023-11-14 22:13:20 UTC, in microseconds
T = dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)


def stored(c, doc_id):
    """The stored document without its _event_time."""
    d = c.get(doc_id)
    return None if d is None else {k: v for k, v in d.items() if k != "_event_time"}


# -- Python values ---------------------------------------------------------------------------
class Color(enum.Enum):
    RED = "red"
    BLUE = 2


def test_python_values_are_stored_as_the_json_they_mean(db):
    c = db.create_collection("c")
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    doc = {
        "_id": np.int64(1),
        "i": np.int64(-3), "u8": np.uint8(200), "f": np.float32(0.5), "b": np.bool_(True), "s": np.str_("x"),
        "arr": np.array([[1, 2], [3, 4]]), "farr": np.array([0.5, 1.5]),
        "ts": pd.Timestamp("2023-11-14 22:13:20.000001"), "tz": pd.Timestamp("2023-11-14 23:13:20", tz="Europe/Paris"),
        "dt": dt.datetime(2023, 11, 14, 22, 13, 20), "nat": pd.NaT, "na": pd.NA,
        "npdt": np.datetime64("2023-11-14T22:13:20.000000999"), "npnat": np.datetime64("NaT"),
        "dtarr": np.array(["2023-11-14T22:13:20", "NaT"], dtype="datetime64[ns]"),
        "date": dt.date(2024, 2, 29), "time": dt.time(12, 30, 5), "td": dt.timedelta(seconds=1.5),
        "ptd": pd.Timedelta(milliseconds=2), "dec": Decimal("2.50"), "deci": Decimal("3.000"),
        "dec_big": Decimal("1e30"), "uuid": u, "enum": Color.RED, "enum2": Color.BLUE, "tup": (1, (2, 3)),
        "nested": {np.str_("k"): [u, np.int32(7), {"t": dt.date(2020, 1, 1)}]},
    }
    before = dict(doc)
    st = c.ingest([doc])
    assert st.n == 1 and st.ids == [1] and not st.errors
    assert doc == before  # the caller's dict is not changed
    got = c.get(1)
    assert stored(c, 1) == {
        "_id": 1, "i": -3, "u8": 200, "f": 0.5, "b": True, "s": "x", "arr": [[1, 2], [3, 4]], "farr": [0.5, 1.5],
        "ts": T_US + 1, "tz": T_US, "dt": T_US, "nat": None, "na": None, "npdt": T_US, "npnat": None,
        "dtarr": [T_US, None], "date": "2024-02-29", "time": "12:30:05", "td": 1_500_000, "ptd": 2000,
        "dec": 2.5, "deci": 3, "dec_big": 1e30, "uuid": str(u), "enum": "red", "enum2": 2, "tup": [1, [2, 3]],
        "nested": {"k": [str(u), 7, {"t": "2020-01-01"}]},
    }
    assert type(got["deci"]) is int and type(got["dec"]) is float and type(got["b"]) is bool
    # a datetime is stored as microseconds, as _event_time is: it compares with datetimes in SQL
    for access in ("index", "scan"):
        rows = db.sql("SELECT _id FROM c WHERE dt >= :t AND dt < :u", {"t": T, "u": T + dt.timedelta(seconds=1)},
                      access=access).rows()
        assert rows == [{"_id": 1}], access


def test_a_uuid_id_is_its_text_and_conversion_keeps_the_later_version(db):
    """UUID and Enum values reach the shard unconverted (orjson serializes them itself) and
    are converted when the indexer refuses them: in input order, as any document is."""
    c = db.create_collection("c", shards=2)
    u = uuid.uuid4()
    st = c.ingest([{"_id": u, "v": 1}, {"_id": "a", "u": u}, {"_id": "a", "v": 2}, {"_id": "b", "v": 1},
                   {"_id": "b", "u": [u]}, {"_id": "c", "e": Color.RED}, {"_id": "c", "e": Color.BLUE}])
    assert not st.errors and st.ids == [str(u), "a", "b", "c"] and st.n == 4
    assert stored(c, str(u)) == {"_id": str(u), "v": 1}
    assert stored(c, "a") == {"_id": "a", "v": 2}  # the later version, though the earlier one was converted
    assert stored(c, "b") == {"_id": "b", "u": [str(u)]}
    assert stored(c, "c") == {"_id": "c", "e": 2}
    assert st.replaced == [2, 4, 6]  # each later version replaced the earlier one of the call
    assert st.bytes == sum(len(orjson.dumps(c.get(i))) for i in st.ids)


def test_values_of_no_json_meaning_are_still_item_errors(db):
    c = db.create_collection("c")
    st = c.ingest([{"_id": 1, "a": {"b": [1, b"raw"]}}, {"_id": 2, "a": {1, 2}}, {"_id": 3, "f": np.float64("nan")},
                   {"_id": 4, "d": Decimal("NaN")}, {"_id": 5, "x": np.complex128(1j)}, {"_id": 6}], errors="report")
    assert [(e.index, e.path) for e in st.errors] == [(0, "$.a.b[1]"), (1, "$.a"), (2, "$.f"), (3, "$.d"), (4, "$.x")]
    assert "bytes" in st.errors[0].message and "non-finite" in st.errors[2].message
    assert st.ids == [6]


def _plain_json():
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5))
    return st.recursive(scalars, lambda v: st.one_of(st.lists(v, max_size=3),
                                                      st.dictionaries(st.text(max_size=3), v, max_size=3)),
                        max_leaves=12)


def _as_numpy(v, draw):
    """``v`` with some of its numbers as numpy scalars and some lists as tuples or arrays."""
    if isinstance(v, bool):
        return np.bool_(v) if draw(st.booleans()) else v
    if isinstance(v, int):
        return np.int64(v) if draw(st.booleans()) else v
    if isinstance(v, float):
        return np.float64(v) if draw(st.booleans()) else v
    if isinstance(v, list):
        items = [_as_numpy(x, draw) for x in v]
        if v and all(type(x) is int for x in v) and draw(st.booleans()):
            return np.array(v, dtype=np.int64)
        return tuple(items) if draw(st.booleans()) else items
    if isinstance(v, dict):
        return {k: _as_numpy(x, draw) for k, x in v.items()}
    return v


def _indexable(v) -> bool:
    """Whether ``v`` holds only the types the shard's indexer takes (tuples are arrays there)."""
    if type(v) in (dict,):
        return all(type(k) is str and _indexable(x) for k, x in v.items())
    if type(v) in (list, tuple):
        return all(_indexable(x) for x in v)
    return type(v) in (str, int, float, bool, type(None))


@given(data=st.data())
def test_numpy_values_store_what_their_plain_twins_store(data):
    """prepare() of a document with numpy values and tuples gives the bytes of its plain
    JSON twin and a document of plain types; a plain document is passed on as it is."""
    plain = {"_id": "x", "_event_time": T_US, **data.draw(st.dictionaries(st.text(max_size=4), _plain_json(), max_size=4))}
    mixed = _as_numpy(plain, data.draw)
    limits = documents.Limits(max_depth=1000, max_document_bytes=1 << 30)
    _, _, d_plain, raw_plain = documents.prepare(plain, limits, 0, check_event_time=True)
    _, _, d_mixed, raw_mixed = documents.prepare(mixed, limits, 0, check_event_time=True)
    assert d_plain is plain
    assert raw_mixed == raw_plain and _indexable(d_mixed)
    assert orjson.dumps(d_mixed) == raw_plain


# -- _event_time -----------------------------------------------------------------------------
@pytest.mark.parametrize("value, unit, fix", [
    (1_700_000_000, "seconds", "multiply it by 1_000_000"),
    (1_700_000_000_000, "milliseconds", "multiply it by 1_000"),
    (1_700_000_000_000_000_000, "nanoseconds", "divide it by 1_000"),
    (np.int64(1_700_000_000), "seconds", "multiply it by 1_000_000"),
])
def test_an_event_time_in_another_unit_is_an_error_that_says_which(db, value, unit, fix):
    c = db.create_collection("c")
    st = c.ingest([{"_id": 1, "_event_time": value}, {"_id": 2}], errors="report")
    [e] = st.errors
    assert (e.index, e.id, e.path) == (0, 1, "$._event_time")
    assert f"looks like {unit}" in e.message and fix in e.message and "microseconds" in e.message
    assert c.get(1) is None and st.ids == [2]


def test_event_time_bounds_and_what_may_be_any_time(db):
    c = db.create_collection("c")
    old = dt.datetime(1960, 1, 1, tzinfo=dt.UTC)
    st = c.ingest([
        {"_id": "min", "_event_time": EVENT_TIME_MIN_US}, {"_id": "max", "_event_time": EVENT_TIME_MAX_US - 1},
        {"_id": "np", "_event_time": np.int64(T_US)}, {"_id": "pd", "_event_time": pd.Timestamp(T)},
        {"_id": "old", "_event_time": old}, {"_id": "iso", "_event_time": "1960-01-01T00:00:00Z"},
        {"_id": "npdt", "_event_time": np.datetime64("1960-01-01T00:00:00")}, {"_id": "nat", "_event_time": pd.NaT},
        {"_id": "low", "_event_time": EVENT_TIME_MIN_US - 1}, {"_id": "high", "_event_time": EVENT_TIME_MAX_US},
        {"_id": "zero", "_event_time": 0}, {"_id": "neg", "_event_time": -5},
    ], errors="report")
    assert [e.id for e in st.errors] == ["low", "high", "zero", "neg"]
    assert all("not a plausible time" in e.message for e in st.errors)
    old_us = int((old - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)).total_seconds()) * 1_000_000
    got = {i: c.get(i)["_event_time"] for i in st.ids}
    assert got["min"] == EVENT_TIME_MIN_US and got["np"] == got["pd"] == T_US
    assert got["old"] == got["iso"] == got["npdt"] == old_us  # a time given as a time may be any time
    assert got["nat"] > T_US  # no time given: the ingest time
    # a patch re-stores a document whose (checked) time was given as a datetime
    assert c.patch("old", [{"op": "add", "path": "/x", "value": 1}])["_event_time"] == old_us


# -- errors= -------------------------------------------------------------------------------
BAD = [{"_id": 1}, {"_id": 2.5}, {"_id": 3}, {"_id": 4, "_event_time": "yesterday"}, {"_id": 5}, {"_id": [6]}]


def test_errors_warn_is_the_default_and_stores_the_good_ones(db):
    c = db.create_collection("c")
    with pytest.warns(rtindex.IngestWarning) as rec:
        st = c.ingest(BAD)
    [w] = rec
    assert w.filename == __file__  # it points at the caller's line
    msg = str(w.message)
    assert msg.startswith("3 documents were not stored and the other 3 were: document 1: _id must be")
    assert "document 3: _event_time 'yesterday'" in msg and "and 1 more" in msg and "errors='report'" in msg
    assert st.ids == [1, 3, 5] and len(c) == 3 and [e.index for e in st.errors] == [1, 3, 5]
    assert repr(st).endswith("errors=3)")


def test_errors_report_is_silent(db):
    c = db.create_collection("c")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st = c.ingest(BAD, errors="report")
        assert c.ingest([{"_id": 2.5}], errors="report").errors[0].path == "$._id"  # all failed: no raise
    assert st.ids == [1, 3, 5] and len(st.errors) == 3


def test_errors_raise_stores_the_good_ones_and_raises(db):
    c = db.create_collection("c")
    with pytest.raises(rtindex.IngestError, match=r"^3 documents were not stored and the other 3 were") as ei:
        c.ingest(BAD, errors="raise")
    e = ei.value
    assert isinstance(e, ValueError) and isinstance(e, rtindex.RtindexError)
    assert e.stats.ids == [1, 3, 5] and len(e.stats.errors) == 3 and len(c) == 3
    assert "document 1: _id must be" in str(e)
    c.ingest([{"_id": 9}], errors="raise")  # nothing failed: nothing raised


@pytest.mark.parametrize("errors", ["warn", "raise"])
def test_when_every_document_fails_ingest_raises(db, errors):
    c = db.create_collection("c")
    with pytest.raises(rtindex.IngestError, match=r"^no document was stored: 2 failed") as ei:
        c.ingest([{"_event_time": 1_700_000_000}, 5], errors=errors)
    assert ei.value.stats.n == 0 and [x.index for x in ei.value.stats.errors] == [0, 1]
    assert c.ingest([], errors=errors).n == 0  # no document is not a failure


def test_ingest_options_are_checked_first(db):
    c = db.create_collection("c")
    with pytest.raises(ValueError, match="errors must be one of 'warn', 'report', 'raise'"):
        c.ingest([{"_id": 1}], errors="ignore")
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        c.ingest([{"_id": 1}], batch_size=0)
    assert len(c) == 0


# -- DataFrames and Arrow ------------------------------------------------------------------------
def test_a_dataframe_is_stored_row_by_row_with_missing_values_as_null(db):
    c = db.create_collection("c")
    df = pd.DataFrame({
        "_id": [0, 1, 2],
        "f": [1.5, np.nan, 3.0],
        "i": [1, 2, 3],
        "ni": pd.array([1, None, 3], dtype="Int64"),
        "b": [True, False, True],
        "s": ["a", None, "c"],
        "cat": pd.Categorical(["x", "y", None]),
        "ts": pd.to_datetime(["2023-11-14 22:13:20", None, "1960-01-01 00:00:00"]),
        "tz": pd.to_datetime(["2023-11-14 23:13:20", None, None]).tz_localize("Europe/Paris"),
        "td": pd.to_timedelta([1, None, 3], unit="s"),
        "obj": [{"k": np.int64(1)}, np.nan, [dt.date(2020, 1, 1), None]],  # NaN in a cell is null
        3: ["label", "is", "str"],
    })
    st = c.ingest(df)
    assert st.ids == [0, 1, 2] and not st.errors
    assert stored(c, 0) == {"_id": 0, "f": 1.5, "i": 1, "ni": 1, "b": True, "s": "a", "cat": "x", "ts": T_US,
                            "tz": T_US, "td": 1_000_000, "obj": {"k": 1}, "3": "label"}
    assert stored(c, 1) == {"_id": 1, "f": None, "i": 2, "ni": None, "b": False, "s": None, "cat": "y", "ts": None,
                            "tz": None, "td": None, "obj": None, "3": "is"}
    assert stored(c, 2)["obj"] == ["2020-01-01", None] and stored(c, 2)["ts"] < 0
    assert db.sql("SELECT COUNT(*) AS n FROM c WHERE f IS NULL").rows() == [{"n": 1}]


def test_dataframe_index_rows_and_event_time(db):
    c = db.create_collection("c")
    df = pd.DataFrame({"v": [1, 2, 3, 4],
                       "_event_time": pd.to_datetime(["2023-11-14 22:13:20", "1960-01-01 00:00:00", None,
                                                     "2023-11-14 22:13:20"])},
                      index=pd.Index(["a", "b", "c", "d"], name="_id"))
    df.loc["c", "v"] = 7
    bad = df.copy()
    bad["w"] = [1, 2, {1, 2}, 4]  # a set: no JSON meaning
    st = c.ingest(bad, batch_size=3, errors="report")
    assert st.ids == ["a", "b", "d"] and [(e.index, e.id, e.path) for e in st.errors] == [(2, "c", "$.w")]
    assert c.get("a")["_event_time"] == T_US and c.get("b")["_event_time"] < 0  # a time may be any time
    st = c.ingest(df.reset_index(drop=True))  # an unnamed index is not stored
    assert all(len(i) == 32 for i in st.ids) and stored(c, st.ids[2]) == {"_id": st.ids[2], "v": 7}
    with pytest.raises(ValueError, match="more than one column named 'v'"):
        c.ingest(pd.DataFrame([[1, 2]], columns=["v", "v"]))
    assert c.ingest(pd.DataFrame(index=range(2))).n == 2  # rows without columns are empty documents


def test_arrow_tables_and_record_batches(db):
    c = db.create_collection("c", shards=3)
    table = pa.table({
        "_id": pa.array(range(5)),
        "ts": pa.array([T_US, None, 0, 1, 2], pa.timestamp("us", tz="UTC")),
        "ns": pa.array([T_US * 1000 + 999, None, None, None, None], pa.timestamp("ns")),
        "d": pa.array([dt.date(2024, 2, 29), None, None, None, None]),
        "dec": pa.array([Decimal("1.25"), Decimal("2"), None, None, None], pa.decimal128(6, 2)),
        "f": pa.array([0.5, None, float("nan"), 1.0, 2.0]),
        "tags": pa.array([["a"], [], None, ["b", "c"], None]),
        "st": pa.array([{"at": dt.datetime(2023, 11, 14, 22, 13, 20), "n": 1}, None, None, None, None]),
        "cat": pa.array(["x", "y", "x", None, "y"]).dictionary_encode(),
        "nul": pa.nulls(5),
    })
    st = c.ingest(table, batch_size=2)
    assert st.ids == [0, 1, 2, 3, 4] and not st.errors
    assert stored(c, 0) == {"_id": 0, "ts": T_US, "ns": T_US, "d": "2024-02-29", "dec": 1.25, "f": 0.5, "tags": ["a"],
                            "st": {"at": T_US, "n": 1}, "cat": "x", "nul": None}
    assert stored(c, 1)["dec"] == 2 and stored(c, 2)["f"] is None and stored(c, 2)["tags"] is None
    batch = pa.record_batch({"_id": ["r1", "r2"], "_event_time": pa.array([1_700_000_000, T_US])})
    st = c.ingest(batch, errors="report")  # an int64 _event_time column is checked as any int
    assert st.ids == ["r2"] and st.errors[0].index == 0 and "seconds" in st.errors[0].message
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=2))
    assert c.ingest(reader).n == 5


# -- files ------------------------------------------------------------------------------------
DOCS = [{"_id": i, "v": i * 1.5, "s": f"s{i}"} for i in range(7)]


def _ndjson(docs, bad_line=None) -> bytes:
    lines = [orjson.dumps(d) for d in docs]
    if bad_line is not None:
        lines.insert(bad_line, b'{"_id": oops')
    return b"\n".join(lines[:3]) + b"\n\n" + b"\n".join(lines[3:]) + b"\n"  # a blank line counts as a line


@pytest.mark.parametrize("name", ["d.ndjson", "d.jsonl", "d.json", "d.ndjson.gz", "d.JSONL.GZ", "d.json.gz"])
def test_ndjson_files_by_path_str_and_pathlib(db, tmp_path, name):
    c = db.create_collection("c")
    path = tmp_path / name
    data = _ndjson(DOCS, bad_line=2)
    path.write_bytes(gzip.compress(data) if name.lower().endswith(".gz") else data)
    for source in (str(path), path):
        st = c.ingest(source, batch_size=3, errors="report")
        assert st.ids == list(range(7))
        [e] = st.errors
        assert e.index == 2 and e.message == "invalid JSON on line 3 at byte 8: unexpected character 'o'"  # index: line number - 1
    st = c.ingest_file(path, errors="report", batch_size=2)
    assert st.ids == list(range(7)) and st.errors[0].index == 2
    assert stored(c, 4) == {"_id": 4, "v": 6.0, "s": "s4"}


@pytest.mark.parametrize("name", ["d.json", "d.json.gz"])
def test_json_array_files(db, tmp_path, name):
    c = db.create_collection("c")
    data = b"\n  " + json.dumps(DOCS[:3] + [5] + DOCS[3:], indent=2).encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    st = c.ingest_file(str(path), errors="report")
    assert st.ids == list(range(7)) and [e.index for e in st.errors] == [3]


def test_parquet_files_are_read_in_batches_of_rows(db, tmp_path):
    c = db.create_collection("c")
    df = pd.DataFrame({"_id": [f"p{i}" for i in range(10)], "at": pd.date_range("2023-11-14 22:13:20", periods=10, freq="s"),
                       "_event_time": [T_US] * 7 + [1_700_000_000] + [T_US] * 2})
    path = tmp_path / "d.parquet"
    df.to_parquet(path, row_group_size=4)
    st = c.ingest_file(path, batch_size=3, errors="report")
    assert st.ids == [f"p{i}" for i in range(10) if i != 7]
    assert [(e.index, e.id) for e in st.errors] == [(7, "p7")]  # the row number in the file
    assert stored(c, "p1") == {"_id": "p1", "at": T_US + 1_000_000}
    assert c.ingest(str(path), errors="report").n == 9


def test_open_files_text_binary_gzip_and_parquet(db, tmp_path):
    c = db.create_collection("c")
    data = _ndjson(DOCS)
    (tmp_path / "a.txt").write_bytes(data)
    with open(tmp_path / "a.txt") as f:
        assert c.ingest(f).ids == list(range(7))
    with open(tmp_path / "a.txt", "rb") as f:
        assert c.ingest(f).ids == list(range(7))
        assert not f.closed  # the caller's file stays open
    assert c.ingest(io.BytesIO(gzip.compress(data))).ids == list(range(7))
    assert c.ingest(io.StringIO(json.dumps(DOCS))).ids == list(range(7))
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(DOCS), buf)
    buf.seek(0)
    assert c.ingest(buf).ids == list(range(7))


def ingest_paused_pipe(c, first: int, wait_for: int, total: int, batch_size: int) -> tuple[list[int], object]:
    """Ingest NDJSON documents ``_id`` 0 .. ``total - 1`` from a pipe whose writer sends the
    first ``first``, then waits (30 s at most) until the collection holds ``wait_for``, notes
    how many it holds, and sends the rest: ``(what it noted, IngestStats)``."""
    r, w = os.pipe()
    seen: list[int] = []

    def write():
        with os.fdopen(w, "wb") as out:
            out.write(b"".join(orjson.dumps({"_id": i}) + b"\n" for i in range(first)))
            out.flush()
            deadline = time.monotonic() + 30
            while len(c) < wait_for and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(len(c))
            out.write(b"".join(orjson.dumps({"_id": i}) + b"\n" for i in range(first, total)))

    t = threading.Thread(target=write)
    t.start()
    with os.fdopen(r, "rb") as f:
        st = c.ingest(f, batch_size=batch_size)
    t.join()
    return seen, st


def test_ndjson_is_streamed_not_read_whole(db):
    """Through a pipe: the writer waits, half-way, until the first batches are stored."""
    seen, st = ingest_paused_pipe(db.create_collection("c"), 250, 200, 300, 100)
    assert seen[0] >= 200 and st.n == 300


def test_what_is_not_an_input_says_so(db, tmp_path):
    c = db.create_collection("c")
    with pytest.raises(ValueError, match=r"neither JSON text .* nor the path of a file: 'nope\.ndjson'"):
        c.ingest("nope.ndjson")
    (tmp_path / "d.csv").write_text("a,b\n")
    for path in (tmp_path / "d.csv", tmp_path / "d.parquet.gz"):
        with pytest.raises(ValueError, match=r"ending in \.ndjson, \.jsonl, \.json \(each also \.gz\) and \.parquet"):
            c.ingest_file(path)
    with pytest.raises(FileNotFoundError):
        c.ingest_file(tmp_path / "missing.ndjson")
    with pytest.raises(TypeError, match="wrap a single document in a list"):
        c.ingest({"_id": 1})
    with pytest.raises(TypeError, match="not int"):
        c.ingest(5)
    assert c.ingest("  ").n == 0 and c.ingest('  {"_id": 1}').ids == [1]  # JSON text, as before


# -- progress ---------------------------------------------------------------------------------
def test_progress_true_shows_rates_and_false_nothing(db, tmp_path, capsys):
    c = db.create_collection("c")
    c.ingest([{"_id": i} for i in range(50)], batch_size=10, progress=True)
    err = capsys.readouterr().err
    assert re.search(r"50(\.0)?/50(\.0)? \[", err) and "docs/s" in err and "MB/s" in err
    path = tmp_path / "d.ndjson"
    path.write_bytes(_ndjson(DOCS))
    c.ingest_file(path, progress=True)
    err = capsys.readouterr().err
    size = path.stat().st_size
    assert f"{size}/{size}" in err and "B/s" in err and "7 docs" in err
    c.ingest([{"_id": i} for i in range(50)], progress=False)
    c.ingest([{"_id": i} for i in range(50)])  # None: stderr is not a terminal here
    assert capsys.readouterr().err == ""


def test_a_bar_is_made_only_once_the_work_is_long_and_left_out_of_a_notebook(monkeypatch, capsys):
    """progress=None where someone watches: a short call makes no bar at all (a notebook
    saves every widget made); a long one makes it when the delay has passed, counting what
    was done before; in a notebook it is removed at the end."""
    from rtindex import progress

    monkeypatch.setattr(progress, "_someone_watches", lambda: True)
    monkeypatch.setattr(progress, "in_notebook", lambda: False)
    p = progress.Progress(None, 100, "docs", "c")
    p.update(10, 1000, 0)
    assert p.bar is None
    p.close()
    assert capsys.readouterr().err == ""
    p = progress.Progress(None, 100, "docs", "c")
    p.update(10, 1000, 0)
    p.t0 -= progress.DELAY  # the work has now taken the delay
    p.update(30, 3000, 0)
    assert p.bar is not None and p.bar.n == 40 and p.bar.leave
    p.close()
    assert re.search(r"40(\.0)?/100", capsys.readouterr().err)
    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    p = progress.Progress(True, 10, "docs", "c")
    assert p.bar is not None and not p.bar.leave
    p.close()


def _run_in_pty(script: str, *args: str, timeout: float = 120) -> str:
    """Run ``script`` with its stderr on a terminal; what it wrote there."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0 columns wide
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stderr=slave, stdout=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=timeout) == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


def test_by_default_a_bar_shows_on_a_terminal_once_the_work_takes_a_while(tmp_path):
    script = textwrap.dedent("""
        import sys, time, rtindex
        with rtindex.open(sys.argv[1]) as db:
            c = db.create_collection("c")
            c.ingest([{"_id": i} for i in range(100)])
            print("QUICK-DONE", file=sys.stderr, flush=True)
            def slow():
                for i in range(40):
                    time.sleep(0.06)
                    yield {"_id": i}
            c.ingest(slow(), batch_size=4)
    """)
    out = _run_in_pty(script, str(tmp_path / "db"))
    quick, slow = out.split("QUICK-DONE")
    assert "docs" not in quick  # a short call stays quiet
    assert "docs/s" in slow and "MB/s" in slow and re.search(r"40(\.0)? docs", slow)


# -- Ctrl-C ------------------------------------------------------------------------------------
# A Python started by a shell's background job (CI under nohup, `cmd &`) inherits SIGINT
# ignored, and then Ctrl-C does nothing at all; these scripts stand in for one started at a
# terminal, where Python's own handler is installed.
INTERACTIVE_SIGINT = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


def test_ctrl_c_stops_between_batches_and_says_what_was_stored(tmp_path):
    script = INTERACTIVE_SIGINT + textwrap.dedent("""
        import itertools, sys, rtindex
        with rtindex.open(sys.argv[1]) as db:
            c = db.create_collection("c", shards=2)
            def docs():
                for i in range(10_000_000):
                    if i == 3000:
                        print("ready", flush=True)
                    yield {"_id": i, "v": "x" * 100}
            c.ingest(docs(), batch_size=500, progress=False)
    """)
    path = str(tmp_path / "db")
    proc = subprocess.Popen([sys.executable, "-c", script, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    m = re.search(r"ingest into collection 'c' was interrupted; the (\d+) documents it had stored stay stored", err)
    assert m, err
    with rtindex.open(path) as db:
        assert len(db["c"]) == int(m[1]) >= 3000
        assert int(m[1]) % 500 == 0  # whole batches


# -- the same over HTTP ---------------------------------------------------------------------
def test_a_client_takes_the_same_inputs_and_errors(tmp_path):
    from tests.serving import Served

    served = Served(str(tmp_path / "served"))
    try:
        with rtindex.connect(served.url, api_key=served.admin_key) as db:
            c = db.create_collection("remote", shards=2)
            df = pd.DataFrame({"_id": [1, 2, 3], "f": [0.5, np.nan, 1.5],
                               "at": pd.to_datetime(["2023-11-14 22:13:20", None, None]),
                               "_event_time": [T_US, 1_700_000_000, T_US]})
            with pytest.warns(rtindex.IngestWarning, match=r"^1 document was not stored and the other 2 were: "
                                                           r"document 1: _event_time 1700000000 looks like seconds"):
                st = c.ingest(df)
            assert st.ids == [1, 3] and [e.index for e in st.errors] == [1]
            assert {k: v for k, v in c.get(1).items() if k != "_event_time"} == {"_id": 1, "f": 0.5, "at": T_US}
            path = tmp_path / "d.ndjson.gz"
            path.write_bytes(gzip.compress(_ndjson(DOCS, bad_line=2)))
            with pytest.raises(rtindex.IngestError, match="1 document was not stored and the other 7 were") as ei:
                c.ingest_file(path, errors="raise")
            assert ei.value.stats.errors[0].index == 2 and len(c) == 7  # _id 0..6, 1 and 3 replaced
            with pytest.raises(rtindex.IngestError, match="^no document was stored"):
                c.ingest([{"_id": 2.5}])
            assert c.ingest([{"_id": 2.5}], errors="report").errors[0].path == "$._id"
    finally:
        assert served.stop() == 0, "".join(served.output)


def test_a_pretty_printed_object_and_a_byte_order_mark(db, tmp_path):
    """What editors and `json.dump(doc, f, indent=2)` write: one object over several lines,
    and a UTF-8 byte order mark first; a broken one is one error, not one per line."""
    c = db.create_collection("pretty", shards=1)
    (tmp_path / "one.json").write_text(json.dumps({"_id": 1, "a": {"b": [1, 2]}}, indent=2))
    assert c.ingest_file(tmp_path / "one.json").n == 1
    assert stored(c, 1) == {"_id": 1, "a": {"b": [1, 2]}}
    bom = "\ufeff".encode()
    (tmp_path / "bom.ndjson").write_bytes(bom + b'{"_id": 2}\n{"_id": 3}\n')
    (tmp_path / "bom.json").write_bytes(bom + b'[{"_id": 4}]')
    assert c.ingest_file(tmp_path / "bom.ndjson").n == 2
    assert c.ingest_file(tmp_path / "bom.json").n == 1
    assert c.ingest(io.StringIO('\ufeff{"_id": 5}\n')).n == 1
    (tmp_path / "bad.json").write_text('{\n  "_id": 6,\n  "a": \n}\n')
    stats = c.ingest_file(tmp_path / "bad.json", errors="report")
    assert stats.n == 0 and len(stats.errors) == 1
    assert "one object over several lines" in stats.errors[0].message and "line 4" in stats.errors[0].message


def test_a_ctrl_c_that_a_finalizer_swallowed_still_stops_the_ingest(tmp_path):
    """A KeyboardInterrupt raised where the GC runs a __del__ is printed and dropped by
    Python; an endless input then went on forever (seen once under load). The press is
    remembered, and the end of the next batch raises it."""
    script = INTERACTIVE_SIGINT + textwrap.dedent("""
        import os, signal, sys, rtindex
        sys.unraisablehook = lambda u: print("dropped:", type(u.exc_value).__name__, flush=True)
        class Finalizer:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)  # the handler's KeyboardInterrupt lands in here
        def docs():
            for i in range(10_000):
                if i == 1500:
                    Finalizer()  # freed at once: its __del__ runs inside this generator
                yield {"_id": i}
        with rtindex.open(sys.argv[1]) as db:
            c = db.create_collection("c", shards=1)
            try:
                c.ingest(docs(), batch_size=1000, progress=False)
            except KeyboardInterrupt:
                print("interrupted", len(c))
    """)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "db")], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.splitlines() == ["dropped: KeyboardInterrupt", "interrupted 2000"], out


# -- one JSON document holding the documents ---------------------------------------------------
API_ANSWER = {"search_metadata": {"count": 3},
              "statuses": [{"_id": i, "text": f"t{i}", "user": {"name": "u"}} for i in range(3)],
              "meta": {"pages": [{"n": 1}, {"n": 2}]}}


def test_json_path_stores_the_array_inside_one_document(db, tmp_path):
    c = db.create_collection("c")
    text = orjson.dumps(API_ANSWER)
    pretty = tmp_path / "answer.json"
    pretty.write_text(__import__("json").dumps(API_ANSWER, indent=2))
    for source in (text, text.decode(), pretty, str(pretty)):
        st = c.ingest(source, json_path="statuses")
        assert st.n == 3 and not st.notes and sorted(st.ids) == [0, 1, 2]
    with open(pretty, "rb") as f:  # an open file, left open
        assert c.ingest(f, json_path="statuses").n == 3 and not f.closed
    assert c.ingest_file(pretty, json_path="meta.pages").n == 2
    assert c.ingest(text, json_path="statuses", batch_size=1).n == 3
    assert sorted(d["text"] for d in c.snapshot().fetch(c.snapshot().exists("text"))) == ["t0", "t1", "t2"]


@pytest.mark.parametrize("json_path, message", [
    ("nope", "the document has no field 'nope' (its fields: 'search_metadata', 'statuses', 'meta')"),
    ("search_metadata", "holds a dict, not an array of documents"),
    ("statuses.x", "statuses has no field 'x'"),
    ("a..b", "the dotted path of an array"),
])
def test_json_path_names_what_is_there_when_it_is_wrong(db, json_path, message):
    c = db.create_collection("c")
    with pytest.raises(ValueError, match=re.escape(message)):
        c.ingest(orjson.dumps(API_ANSWER), json_path=json_path)
    with pytest.raises(TypeError, match="give its text or a file"):
        c.ingest([API_ANSWER], json_path="statuses")
    with pytest.raises(ValueError, match="not one"):
        c.ingest(b'{"a": [1', json_path="a")
    assert len(c) == 0


def test_array_of_objects_finds_the_longest_array_of_objects():
    from rtindex.inputs import array_of_objects

    assert array_of_objects(API_ANSWER) == ("statuses", 3)
    assert array_of_objects({"a": {"b": {"c": [{}, {}]}}}) == ("a.b.c", 2)
    assert array_of_objects({"a": [1, 2, 3], "b": [{}], "c": "x"}) is None
    assert array_of_objects({"": [{}, {}], "x.y": [{}, {}, {}], "o": {"": [{}, {}]}}) is None  # json_path cannot name them
