"""Column values at matched rows across chunks (rtindex/_ext/_gather.pyx, rtindex/_py/gather.py):
on generated chunks of every column type (nulls, sliced arrays, unaligned buffers, chunks a
segment does not have), both give the Arrow array that taking with Arrow and concatenating
gives."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtindex import columns, keys
from rtindex._impl import IMPLEMENTATION
from rtindex._py.gather import gather as py_gather

TAGS = [keys.INT, keys.FLOAT, keys.STRING, keys.BOOL, keys.TIMESTAMP, keys.NULL]
VALUES = {
    keys.INT: st.integers(-(1 << 63), (1 << 63) - 1),
    keys.FLOAT: st.floats(allow_nan=False),
    keys.STRING: st.text(max_size=6),
    keys.BOOL: st.booleans(),
    keys.TIMESTAMP: st.integers(0, 1 << 50),
    keys.NULL: st.just(True),
}


def implementations():
    found = [py_gather]
    if IMPLEMENTATION == "cython":
        from rtindex._ext._gather import gather
        found.append(gather)
    return found


@st.composite
def chunk_and_positions(draw, tag):
    """An Arrow array of the tag's type (maybe sliced, maybe copied to an unaligned buffer),
    or None (the segment has no such chunk), and sorted positions into it."""
    n = draw(st.integers(0, 40))
    values = draw(st.lists(st.none() | VALUES[tag], min_size=n, max_size=n))
    arr = pa.array(values, type=columns.arrow_type(tag))
    if n and draw(st.booleans()):
        lo = draw(st.integers(0, n - 1))
        arr = arr.slice(lo, draw(st.integers(0, n - lo)))
    if draw(st.booleans()):  # mapped from a file: 8-byte values at an odd address
        raw = columns.encode(arr).to_pybytes()
        arr = columns.decode(pa.py_buffer(b"\0" * 3 + raw).slice(3))
    if len(arr) == 0:
        positions = np.zeros(0, np.int64)
    else:
        positions = np.array(sorted(draw(st.sets(st.integers(0, len(arr) - 1)))), dtype=np.int64)
    missing = draw(st.integers(0, 5)) == 0
    return (None if missing else arr), positions


@settings(max_examples=300, deadline=None)
@given(data=st.data(), tag=st.sampled_from(TAGS))
def test_gather_matches_arrow(data, tag):
    parts = data.draw(st.lists(chunk_and_positions(tag), max_size=5))
    t = columns.arrow_type(tag)
    want = pa.concat_arrays([pa.array([], type=t)] + [
        arr.take(pa.array(pos)) if arr is not None else pa.nulls(len(pos), type=t) for arr, pos in parts])
    gather_parts = [columns.Chunk(arr).part(pos) if arr is not None else columns.missing_part(pos)
                    for arr, pos in parts]
    got = columns.gather(tag, gather_parts)
    got.validate(full=True)
    assert got.equals(want)
    results = [impl(columns._KINDS.get(t.id, 0), gather_parts) for impl in implementations()]
    assert all(r == results[0] for r in results)  # byte for byte, padding included


@pytest.mark.parametrize("impl", implementations())
def test_nothing_to_gather(impl):
    assert impl(0, []) == (0, None, b"", None)
    assert impl(2, []) == (0, None, b"", b"\0" * 8)
