"""SegmentBuilder.add_columns: a record batch's columns indexed exactly as its rows would be.

Both builders (compiled and reference) get generated tables column-wise, and must end up
exactly as a builder of the same kind that got the rows one by one with ``add`` (every read
method's output, and nbytes), with the same outcome when the table must be refused; and
the two kinds must agree with each other. Documents added before and after check that
add_columns mixes with add.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtindex._py.segment import SegmentBuilder as PySegmentBuilder
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
    snapshot,
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
    repeated values, and rarely a NaN or infinity (which add() refuses)."""
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


def add_rows(b, names, arrays):
    """What add_columns must equal: add() row by row, all or nothing (a builder per
    attempt, since add() keeps the rows before a bad one)."""
    rows = rows_of(names, arrays)
    probe = type(b)(b.max_depth)
    for row in rows:
        probe.add(row)  # raises where add_columns must
    off = b.n_rows
    for row in rows:
        b.add(row)
    return off


def check_against_rows(impl, before, names, arrays, after):
    """add_columns on one builder, add() row by row on another: the same in every way."""
    col, row = impl(), impl()
    for doc in before:
        col.add(doc)
        row.add(doc)
    snap, nbytes = snapshot(col), col.nbytes
    got = outcome(col.add_columns, names, arrays)
    expected = outcome(add_rows, row, names, arrays)
    assert got == expected
    if got[0] == "raised":
        assert snapshot(col) == snap  # all or nothing
        assert col.nbytes == nbytes
    for doc in after:
        col.add(doc)
        row.add(doc)
    assert snapshot(col) == snapshot(row)
    if got[0] == "ok":
        # (After a failure, like after a failed add(), path nodes made before the error stay
        # and are not counted again: nbytes then depends on the history, as add()'s does.)
        assert col.nbytes == row.nbytes
    return got, col


@given(before=st.lists(REPEATING, max_size=3), table=tables(nan_ok=True), after=st.lists(REPEATING, max_size=3))
@_settings(200)
@pytest.mark.parametrize("impl", IMPLS)
def test_same_as_rows(impl, before, table, after):
    check_against_rows(impl, before, *table, after)


@needs_ext
@given(before=st.lists(REPEATING, max_size=3), table=tables(nan_ok=True), after=st.lists(REPEATING, max_size=3))
@_settings(200)
def test_compiled_same_as_reference(before, table, after):
    py_got, py = check_against_rows(PySegmentBuilder, before, *table, after)
    cy_got, cy = check_against_rows(CySegmentBuilder, before, *table, after)
    assert cy_got == py_got
    assert snapshot(cy) == snapshot(py)


@needs_ext
@given(tables=st.lists(tables(), min_size=1, max_size=3), fail_table=st.integers(0, 2), fail_at=st.integers(0, 40))
@_settings(150)
def test_rollback_after_a_failure_midway(tables, fail_table, fail_at):
    # Only an allocation failure can stop add_columns once it started indexing (simulated
    # here at any value of any column): the builder must be exactly as before.
    ref, cy = PySegmentBuilder(), CySegmentBuilder()
    for i, (names, arrays) in enumerate(tables):
        if i == fail_table:
            snap, nbytes = snapshot(cy), cy.nbytes
            cy._test_fail_commit_at(fail_at)
            got = outcome(cy.add_columns, names, arrays)
            cy._test_fail_commit_at(-1)
            if got[1] is MemoryError:
                assert snapshot(cy) == snap
                assert cy.nbytes == nbytes
            else:  # fail_at past the table's values
                assert got == ("ok", ref.n_rows)
                ref.add_columns(names, arrays)
                assert snapshot(cy) == snapshot(ref)
                continue
        assert cy.add_columns(names, arrays) == ref.add_columns(names, arrays)
        assert snapshot(cy) == snapshot(ref)


@pytest.mark.parametrize("impl", IMPLS)
def test_many_terms_and_nulls(impl):
    # Enough new terms to grow the compiled term table several times between the nulls of
    # a column (whose null term is found once and must be found again after a growth).
    n = 6000
    names = ["_id", "n", "f", "s", "_event_time"]
    arrays = [
        pa.array([f"r-{i}" for i in range(n)], type=pa.large_string()),
        pa.array([None if i % 7 == 0 else i for i in range(n)], type=pa.int64()),
        pa.array([None if i % 5 == 0 else i / 3 for i in range(n)]),
        pa.array([None if i % 3 == 0 else f"é{i % 50}" for i in range(n)]),
        pa.array([1_700_000_000_000_000 + i for i in range(n)]),
    ]
    col, row = impl(), impl()
    assert col.add_columns(names, arrays) == add_rows(row, names, arrays) == 0
    assert col.add_columns(names, arrays) == add_rows(row, names, arrays) == n
    for b in (col, row):
        b.add({"n": 3, "s": "é3", "new": True})
    assert snapshot(col) == snapshot(row)
    assert col.nbytes == row.nbytes


@pytest.mark.parametrize("impl", IMPLS)
def test_zero_rows_add_nothing(impl):
    b = impl()
    b.add({"a": 1})
    snap, nbytes = snapshot(b), b.nbytes
    assert b.add_columns(["a", "new"], [pa.array([], pa.int64()), pa.array([], pa.string())]) == 1
    assert snapshot(b) == snap
    assert b.nbytes == nbytes


@pytest.mark.parametrize("impl", IMPLS)
def test_event_time_is_a_timestamp_only_as_int64(impl):
    b = impl()
    b.add_columns(["_event_time"], [pa.array([1, None])])
    b.add_columns(["_event_time"], [pa.array([1.5])])
    assert [ck[-1] for ck in b.column_keys()] == [6, 1, 4]  # TIMESTAMP, NULL, FLOAT


@pytest.mark.parametrize("impl", IMPLS)
def test_refused_arguments(impl):
    b = impl()
    ints = pa.array([1, 2])
    cases = [
        (["a"], [ints, ints], ValueError, "1 names and 2 arrays"),
        ([], [], ValueError, "at least one column"),
        ([1], [ints], TypeError, "must be a str, not int"),
        (["a", "a"], [ints, ints], ValueError, "'a' more than once"),
        (["a"], [[1, 2]], TypeError, "'a' is a list, not a pyarrow Array"),
        (["a"], [pa.chunked_array([ints])], TypeError, "combine_chunks"),
        (["a"], [pa.array([1, 2], pa.int32())], TypeError, "'a' is of type int32"),
        (["a"], [pa.array([[1]])], TypeError, "'a' is of type list<item: int64>"),
        (["a", "b"], [ints, pa.array([1])], ValueError, "'a' has 2 rows, 'b' 1"),
    ]
    for names, arrays, error, message in cases:
        with pytest.raises(error, match=message):
            b.add_columns(names, arrays)
    assert b.n_rows == 0 and b.column_keys() == []


@pytest.mark.parametrize("impl", IMPLS)
def test_errors_are_add_errors(impl):
    b = impl()
    with pytest.raises(SchemaError, match=r"non-finite number nan .*\(at \$\.f\)"):
        b.add_columns(["s", "f"], [pa.array(["x", "y"]), pa.array([1.0, float("nan")])])
    with pytest.raises(UnicodeEncodeError):
        b.add_columns(["s", "\ud800"], [pa.array(["x"]), pa.array([1])])
    b.max_depth = 0
    with pytest.raises(SchemaError, match="nesting deeper than 0 levels"):
        b.add_columns(["s"], [pa.array(["x"])])
    assert b.n_rows == 0 and b.column_keys() == []


@needs_ext
def test_malformed_string_offsets_are_refused():
    offsets = pa.py_buffer(pa.array([0, 3, 1], pa.int32()).buffers()[1])
    arr = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"abc")])
    b = CySegmentBuilder()
    b.add({"s": "abc"})
    snap = snapshot(b)
    with pytest.raises(ValueError, match="malformed"):
        b.add_columns(["s"], [arr])
    assert snapshot(b) == snap
