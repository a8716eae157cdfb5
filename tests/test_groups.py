"""Group numbers of integer keys (rtindex/_ext/_groups.pyx, rtindex/_py/groups.py): on
generated keys (repeats, NULLs, the extremes of int64), both number the groups alike, in the
order of their first rows, as Arrow's dictionary_encode does."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtindex._impl import IMPLEMENTATION
from rtindex._py.groups import factorize as py_factorize

KEYS = st.lists(st.none() | st.sampled_from([0, 1, -1, 7, (1 << 63) - 1, -(1 << 63)]) | st.integers(-(1 << 63), (1 << 63) - 1),
                max_size=60)


def implementations():
    found = [py_factorize]
    if IMPLEMENTATION == "cython":
        from rtindex._ext._groups import factorize
        found.append(factorize)
    return found


@settings(max_examples=300, deadline=None)
@given(keys=KEYS)
def test_factorize_numbers_groups_as_arrow_does(keys):
    arr = pa.array(keys, type=pa.int64())
    enc = pc.dictionary_encode(arr, null_encoding="encode")
    ints = np.ascontiguousarray(arr.fill_null(0).to_numpy())
    valid = arr.is_valid().to_numpy(zero_copy_only=False).view(np.uint8) if arr.null_count else None
    for factorize in implementations():
        codes, count, firsts = factorize(ints, valid)
        assert codes.dtype == np.intp and firsts.dtype == np.intp
        assert codes.tolist() == enc.indices.to_pylist()
        assert count == len(enc.dictionary)
        assert arr.take(pa.array(firsts)).equals(enc.dictionary)


@pytest.mark.parametrize("factorize", implementations())
def test_factorize_refuses_flags_of_another_length(factorize):
    with pytest.raises(ValueError, match="2 validity flags for 3 values"):
        factorize(np.zeros(3, np.int64), np.ones(2, np.uint8))
    codes, count, firsts = factorize(np.zeros(0, np.int64))
    assert (len(codes), count, len(firsts)) == (0, 0, 0)
