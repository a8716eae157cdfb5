"""SegmentBuilder.add_columns: a record batch's columns indexed exactly as its rows would be.

Both builders (compiled and reference) get generated tables column-wise, with the rows' JSON
bytes (``orjson.dumps`` of each row as a dict), and must end up exactly as a builder of the
same kind that got those bytes with ``add_json`` (every read method's output, and nbytes
where it is the same), with the same outcome when the table must be refused (a row's value
that ``walk`` refuses, before anything changes); and the two kinds must agree with each
other. Documents added before and after check that add_columns mixes with add_json.
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtindex import keys
from rtindex._py.segment import SegmentBuilder as PySegmentBuilder
from rtindex._py.segment import walk
from rtindex.errors import SchemaError
from tests.test_segment import (
    FLOATS,
    IMPLS,
    INTS,
    REPEATING,
    STRINGS,
    CySegmentBuilder,
    _settings,
    needs_ext,
    outcome,
    prefix_reads,
    run_isolated,
    snapshot,
    summary,
)

NAMES = ["_id", "_event_time", "a", "b", "", "\x00", "a\x00b", "é", "😀", "x.y"]
TYPES = {
    "int64": (pa.int64(), INTS),
    "double": (pa.float64(), FLOATS),
    "bool": (pa.bool_(), st.booleans()),
    "string": (pa.string(), STRINGS),
    "large_string": (pa.large_string(), STRINGS),
    "null": (pa.null(), st.none()),
}


@st.composite
def columns(draw, n: int, nan_ok: bool):
    """One column of ``n`` rows (maybe a slice of a longer array: Arrow offsets), with nulls,
    repeated values, and rarely a NaN or infinity (which must be refused)."""
    type_, values = TYPES[draw(st.sampled_from(sorted(TYPES)))]
    pool = draw(st.lists(values, min_size=1, max_size=4))  # few distinct values: terms repeat
    cell = st.one_of(st.sampled_from(pool), values, st.none())
    if nan_ok and type_ == pa.float64():
        cell = st.one_of(cell, st.sampled_from([float("nan"), float("inf"), float("-inf")]))
    before = draw(st.integers(0, 2))
    cells = draw(st.lists(cell, min_size=n + before, max_size=n + before))
    return pa.array(cells, type=type_).slice(before, n)


@st.composite
def tables(draw, nan_ok: bool = False):
    n = draw(st.integers(0, 12))
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True))
    return names, [draw(columns(n, nan_ok and draw(st.integers(0, 9)) == 0)) for _ in names]


def rows_of(names, arrays):
    return [dict(zip(names, row)) for row in zip(*(a.to_pylist() for a in arrays))]


def raws_of(names, arrays) -> list[bytes]:
    """Each row's JSON bytes (a NaN or an infinity, refused anyway, is written as null)."""
    return [orjson.dumps(row) for row in rows_of(names, arrays)]


def add_rows(b, names, arrays):
    """What add_columns must equal: add_json of the rows' JSON bytes, or nothing at all and
    the SchemaError of the first row value that cannot be indexed (NaN and infinities have
    no JSON text: ``walk`` of the row's values says what is refused, and where)."""
    rows = rows_of(names, arrays)
    for row in rows:
        walk(row, b.max_depth)  # raises where add_columns must
    raws = [orjson.dumps(row) for row in rows]
    off = b.n_rows
    assert b.add_json(raws) == (list(range(off, off + len(raws))), [])
    return off


def check_against_rows(impl, before, names, arrays, after):
    """add_columns on one builder, add_json of the rows on another: the same in every way."""
    col, row = impl(), impl()
    for b in (col, row):
        b.add_json([orjson.dumps(d) for d in before])
    snap, nbytes = snapshot(col), col.nbytes
    got = outcome(col.add_columns, names, arrays, raws_of(names, arrays))
    expected = outcome(add_rows, row, names, arrays)
    assert got == expected
    if got[0] == "raised":
        assert snapshot(col) == snap  # nothing changed
        assert col.nbytes == nbytes
    for b in (col, row):
        b.add_json([orjson.dumps(d) for d in after])
    assert snapshot(col) == snapshot(row)
    if got[0] == "ok" and impl is PySegmentBuilder:
        assert col.nbytes == row.nbytes
    return got, col


@given(before=st.lists(REPEATING, max_size=3), table=tables(nan_ok=True), after=st.lists(REPEATING, max_size=3))
@_settings(100)
@pytest.mark.parametrize("impl", IMPLS)
def test_same_as_rows(impl, before, table, after):
    check_against_rows(impl, before, *table, after)


@needs_ext
@given(before=st.lists(REPEATING, max_size=3), table=tables(nan_ok=True), after=st.lists(REPEATING, max_size=3))
@_settings(100)
def test_compiled_same_as_reference(before, table, after):
    py_got, py = check_against_rows(PySegmentBuilder, before, *table, after)
    cy_got, cy = check_against_rows(CySegmentBuilder, before, *table, after)
    assert cy_got == py_got
    assert snapshot(cy) == snapshot(py)


@needs_ext
@given(tables=st.lists(tables(), min_size=1, max_size=4), max_depth=st.sampled_from([1, 2, 64]))
@_settings(100)
def test_tables_in_a_row_same_as_reference(tables, max_depth):
    ref, cy = PySegmentBuilder(max_depth=max_depth), CySegmentBuilder(max_depth=max_depth)
    for names, arrays in tables:
        raws = raws_of(names, arrays)
        assert outcome(cy.add_columns, names, arrays, raws) == outcome(ref.add_columns, names, arrays, raws)
        assert snapshot(cy) == snapshot(ref)


@needs_ext
@pytest.mark.parametrize("fail_after", [0, 1 << 20, 3 << 20])
def test_allocation_failure_breaks_the_builder(fail_after):
    # The mapping cannot grow (past the file's first 4 MiB): OSError, then the builder
    # refuses every batch, and the rows it had read as before.
    b = CySegmentBuilder()
    first = ["i", "s"], [pa.array(range(100)), pa.array([f"s{i % 7}" for i in range(100)])]
    assert b.add_columns(*first, raws_of(*first)) == 0
    terms = [t for t, _ in b.sorted_postings()]
    cks = sorted({*b.column_keys(), *(ck for ck, _, _ in b.columns())})
    before = prefix_reads(b, 100, terms, cks)
    b._test_fail_alloc_after(fail_after)
    n = 200_000
    big = ["i", "s", "f"], [pa.array(range(n)), pa.array([f"{i:040d}" for i in range(n)]),
                            pa.array([i / 3 for i in range(n)])]
    raws = [b'{"i":%d}' % i for i in range(n)]  # (a row's bytes are not checked against its values)
    with pytest.raises(OSError, match="the mutable segment is full"):
        b.add_columns(*big, raws)
    for call in (lambda: b.add_columns(*first, raws_of(*first)), lambda: b.add_json([b"{}"])):
        with pytest.raises(RuntimeError, match="lost a batch midway"):
            call()
    assert b.n_rows >= 100
    assert prefix_reads(b, 100, terms, cks) == before


@pytest.mark.parametrize("impl", IMPLS)
def test_many_terms_and_nulls(impl):
    # Enough new terms to grow the compiled term table several times between the nulls of
    # a column (whose null term is found once and must be found again after a growth).
    n = 3000
    names = ["_id", "n", "f", "s", "_event_time"]
    arrays = [
        pa.array([f"r-{i}" for i in range(n)], type=pa.large_string()),
        pa.array([None if i % 7 == 0 else i for i in range(n)], type=pa.int64()),
        pa.array([None if i % 5 == 0 else i / 3 for i in range(n)]),
        pa.array([None if i % 3 == 0 else f"é{i % 50}" for i in range(n)]),
        pa.array([1_700_000_000_000_000 + i for i in range(n)]),
    ]
    raws = raws_of(names, arrays)
    col, row = impl(), impl()
    assert col.add_columns(names, arrays, raws) == add_rows(row, names, arrays) == 0
    assert col.add_columns(names, arrays, raws) == add_rows(row, names, arrays) == n
    for b in (col, row):
        b.add_json([orjson.dumps({"n": 3, "s": "é3", "new": True})])
    assert summary(col) == summary(row)
    assert col.write_blocks(16384) == row.write_blocks(16384)
    assert [col.row(i) for i in (0, n - 1, n, 2 * n)] == \
        [raws[0], raws[-1], raws[0], b'{"n":3,"s":"\xc3\xa93","new":true}']


@pytest.mark.parametrize("impl", IMPLS)
def test_rows_are_the_given_bytes(impl):
    b = impl()
    raws = [b' {"a": 1} ', b'{"a":2,"extra":"not indexed"}', b"anything at all"]
    assert b.add_columns(["a"], [pa.array([1, 2, 3])], raws) == 0
    assert [b.row(i) for i in range(3)] == raws
    assert b.postings(keys.term(("extra",), keys.STRING, "not indexed"), 10).tolist() == []
    assert b.postings(keys.term(("a",), keys.INT, 3), 10).tolist() == [2]


@pytest.mark.parametrize("impl", IMPLS)
def test_zero_rows_add_nothing(impl):
    b = impl()
    b.add_json([b'{"a": 1}'])
    snap, nbytes = snapshot(b), b.nbytes
    assert b.add_columns(["a", "new"], [pa.array([], pa.int64()), pa.array([], pa.string())], []) == 1
    assert snapshot(b) == snap
    assert b.nbytes == nbytes


@pytest.mark.parametrize("impl", IMPLS)
def test_event_time_is_a_timestamp_only_as_int64(impl):
    b = impl()
    b.add_columns(["_event_time"], [pa.array([1, None])], [b'{"_event_time":1}', b'{"_event_time":null}'])
    b.add_columns(["_event_time"], [pa.array([1.5])], [b'{"_event_time":1.5}'])
    b.add_columns(["_event_time"], [pa.array(["2"])], [b'{"_event_time":"2"}'])
    assert [ck[-1] for ck in b.column_keys()] == [keys.NULL, keys.FLOAT, keys.STRING, keys.TIMESTAMP]
    offs, vals = b.column(keys.column_key(("_event_time",), keys.TIMESTAMP), 10)
    assert offs.tolist() == [0] and vals.type == pa.timestamp("us", tz="UTC")


@pytest.mark.parametrize("impl", IMPLS)
def test_refused_arguments(impl):
    b = impl()
    ints = pa.array([1, 2])
    two = [b"{}", b"{}"]
    cases = [
        (["a"], [ints, ints], two, ValueError, "1 names and 2 arrays"),
        ([], [], [], ValueError, "at least one column"),
        ([1], [ints], two, TypeError, "must be a str, not int"),
        (["a", "a"], [ints, ints], two, ValueError, "'a' more than once"),
        (["a"], [[1, 2]], two, TypeError, "'a' is a list, not a pyarrow Array"),
        (["a"], [pa.chunked_array([ints])], two, TypeError, "combine_chunks"),
        (["a"], [pa.array([1, 2], pa.int32())], two, TypeError, "'a' is of type int32"),
        (["a"], [pa.array([[1]])], [b"{}"], TypeError, "'a' is of type list<item: int64>"),
        (["a", "b"], [ints, pa.array([1])], two, ValueError, "'a' has 2 rows, 'b' 1"),
        (["a"], [ints], [b"{}"], ValueError, "add_columns got 2 rows and 1 row texts"),
        (["a"], [ints], two * 2, ValueError, "add_columns got 2 rows and 4 row texts"),
    ]
    for names, arrays, raws, error, message in cases:
        with pytest.raises(error, match=message):
            b.add_columns(names, arrays, raws)
    assert b.n_rows == 0 and b.column_keys() == []


@needs_ext
def test_refused_row_texts_same_as_reference():
    # Row texts that are not bytes are refused alike (the compiled builder: TypeError).
    for raws in (["{}"], [bytearray(b"{}")], [None]):
        got = [outcome(impl().add_columns, ["a"], [pa.array([1])], raws)
               for impl in (CySegmentBuilder, PySegmentBuilder)]
        assert got[0][:2] == got[1][:2] == ("raised", TypeError), raws


@pytest.mark.parametrize("impl", IMPLS)
def test_errors_are_the_rows_errors(impl):
    b = impl()
    with pytest.raises(SchemaError, match=r"non-finite number nan .*\(at \$\.f\)"):
        b.add_columns(["s", "f"], [pa.array(["x", "y"]), pa.array([1.0, float("nan")])], [b"{}", b"{}"])
    with pytest.raises(SchemaError, match=r"non-finite number -inf .*\(at \$\.g\)"):  # the first row's first
        b.add_columns(["f", "g"], [pa.array([1.0, float("inf")]), pa.array([float("-inf"), 1.0])], [b"{}", b"{}"])
    with pytest.raises(SchemaError, match=r"key is not valid UTF-8 \(lone surrogate\) \(at \$\)"):
        b.add_columns(["s", "\ud800"], [pa.array(["x"]), pa.array([1])], [b"{}"])
    b.max_depth = 0
    with pytest.raises(SchemaError, match=r"nesting deeper than 0 levels \(at \$\)"):
        b.add_columns(["s"], [pa.array(["x"])], [b"{}"])
    assert b.n_rows == 0 and b.column_keys() == []


@needs_ext
@pytest.mark.parametrize("max_depth,names,arrays", [
    (64, ["\ud800"], [pa.array([], pa.int64())]),  # no rows: nothing to index
    (0, ["\ud800"], [pa.array([1])]),  # the depth of the first row, or its key first?
    (0, ["\ud800"], [pa.array([], pa.int64())]),
    (0, ["a"], [pa.array([], pa.int64())]),
    (0, ["a"], [pa.array([float("nan")])]),
], ids=["surrogate-no-rows", "surrogate-depth0", "surrogate-depth0-no-rows", "depth0-no-rows", "nan-depth0"])
def test_refusal_order_same_as_reference(max_depth, names, arrays):
    raws = [b"{}"] * len(arrays[0])
    got = [outcome(impl(max_depth=max_depth).add_columns, names, arrays, raws)
           for impl in (CySegmentBuilder, PySegmentBuilder)]
    assert got[0] == got[1]


@needs_ext
def test_invalid_utf8_strings_same_as_reference():
    offsets = pa.py_buffer(pa.array([0, 1, 3], pa.int32()).buffers()[1])
    arr = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"a\xff\xfe")])
    got = []
    for impl in (CySegmentBuilder, PySegmentBuilder):
        b = impl()
        got.append(outcome(b.add_columns, ["s"], [arr], [b"{}", b"{}"]))
        assert b.n_rows == 0 and b.column_keys() == []
    assert got[0][:2] == ("raised", SchemaError)
    assert got[0] == got[1]


@needs_ext
def test_malformed_string_offsets_are_refused():
    # Offsets that go backwards (which Array.validate() lets through): refused, nothing
    # changed. (In a child process: reading them unchecked would crash this one.)
    done = run_isolated("""
        import pyarrow as pa
        from rtindex._ext._segment import SegmentBuilder
        offsets = pa.py_buffer(pa.array([0, 3, 1], pa.int32()).buffers()[1])
        arr = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"abc")])
        b = SegmentBuilder()
        b.add_json([b'{"s": "abc"}'])
        try:
            b.add_columns(["s"], [arr], [b"{}", b"{}"])
        except ValueError as e:
            print("refused:", e)
        print(b.n_rows, b.column_keys(), b.add_json([b'{"s": "d"}']))
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("refused:") and "malformed" in lines[0]
    assert lines[1] == "1 [b's\\x00\\x00\\x05'] ([1], [])"
