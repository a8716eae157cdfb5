"""rtindex.keys: order preservation, round trips, prefix-freedom, prefix upper bounds.

``HYPOTHESIS_PROFILE`` (see conftest.py) overrides the example counts set here.
"""

from __future__ import annotations

import math
import os
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtindex import keys


def _settings(max_examples: int) -> settings:
    if os.environ.get("HYPOTHESIS_PROFILE"):
        return settings()  # the profile loaded by conftest.py decides
    return settings(max_examples=max_examples, deadline=None)


INTS = st.one_of(
    st.integers(keys.INT_MIN, keys.INT_MAX),
    st.sampled_from([keys.INT_MIN, keys.INT_MIN + 1, -1, 0, 1, keys.INT_MAX - 1, keys.INT_MAX]),
)
FLOATS = st.one_of(
    st.floats(allow_nan=False),  # includes +-inf, +-0.0 and subnormals
    st.sampled_from([-0.0, 0.0, 5e-324, -5e-324, math.inf, -math.inf, 2.0**53, -(2.0**53)]),
)
TEXT = st.one_of(
    st.text(),  # no surrogates: they cannot be encoded
    st.text(alphabet=st.sampled_from(["\x00", "\x01", "\xff", "a", "\x7f", "é", "\uffff", "😀"]), max_size=6),
)
PATHS = st.lists(TEXT, min_size=1, max_size=4).map(tuple)
TAGGED = st.one_of(
    st.tuples(st.just(keys.NULL), st.none()),
    st.tuples(st.just(keys.BOOL), st.booleans()),
    st.tuples(st.just(keys.INT), INTS),
    st.tuples(st.just(keys.TIMESTAMP), INTS),
    st.tuples(st.just(keys.FLOAT), FLOATS),
    st.tuples(st.just(keys.STRING), TEXT),
    st.tuples(st.just(keys.ARRAY), st.none()),
    st.tuples(st.just(keys.OBJECT), st.none()),
)
TERMS = st.tuples(PATHS, TAGGED).map(lambda pt: (pt[0], pt[1][0], pt[1][1]))


def _cmp(a, b) -> int:
    return (a > b) - (a < b)


# ---------------------------------------------------------------- order


@given(st.lists(INTS, max_size=30))
@_settings(300)
def test_int_order(values):
    assert sorted(values, key=keys.encode_int) == sorted(values)


@given(INTS, INTS)
@_settings(300)
def test_int_compare(a, b):
    assert _cmp(keys.encode_int(a), keys.encode_int(b)) == _cmp(a, b)
    assert len(keys.encode_int(a)) == 8


@given(FLOATS, FLOATS)
@_settings(300)
def test_float_compare(a, b):
    assert _cmp(keys.encode_float(a), keys.encode_float(b)) == _cmp(a, b)  # -0.0 == 0.0 too


@given(st.lists(FLOATS, max_size=30))
@_settings(200)
def test_float_order(values):
    by_encoding = [keys.encode_float(v) for v in sorted(values, key=keys.encode_float)]
    assert by_encoding == [keys.encode_float(v) for v in sorted(values)]


@given(TEXT, TEXT)
@_settings(300)
def test_string_compare(a, b):
    assert _cmp(keys.encode_string(a), keys.encode_string(b)) == _cmp(a, b)


@given(PATHS, PATHS)
@_settings(300)
def test_path_compare(a, b):
    # Segment by segment, then by depth: exactly tuple order.
    assert _cmp(keys.encode_path(a), keys.encode_path(b)) == _cmp(a, b)


@given(PATHS, st.sampled_from([keys.INT, keys.TIMESTAMP]), INTS, INTS)
@_settings(200)
def test_term_order_within_a_column(path, tag, a, b):
    assert _cmp(keys.term(path, tag, a), keys.term(path, tag, b)) == _cmp(a, b)


@given(PATHS, TEXT, TEXT)
@_settings(200)
def test_string_term_order_within_a_column(path, a, b):
    assert _cmp(keys.term(path, keys.STRING, a), keys.term(path, keys.STRING, b)) == _cmp(a, b)


def test_bool_order():
    assert keys.encode_value(keys.BOOL, False) < keys.encode_value(keys.BOOL, True)


# ---------------------------------------------------------------- round trips


@given(INTS)
@_settings(300)
def test_int_round_trip(v):
    assert keys.decode_int(keys.encode_int(v)) == v


@given(FLOATS)
@_settings(300)
def test_float_round_trip(v):
    back = keys.decode_float(keys.encode_float(v))
    assert back == v
    assert math.copysign(1.0, back) == (math.copysign(1.0, v) if v != 0.0 else 1.0)  # -0.0 -> 0.0


@given(TEXT)
@_settings(300)
def test_string_round_trip(s):
    enc = keys.encode_string(s)
    assert enc.endswith(keys.STR_END)
    assert b"\x00\x00" not in enc[:-2]
    assert keys.decode_value(keys.STRING, enc) == s


@given(PATHS)
@_settings(300)
def test_path_round_trip(path):
    assert keys.decode_path(keys.encode_path(path)) == path
    assert keys.split_path(path) == path


@given(TERMS)
@_settings(500)
def test_term_round_trip(t):
    path, tag, value = t
    enc = keys.term(path, tag, value)
    p, g, v = keys.split_term(enc)
    assert (p, g) == (path, tag)
    if tag == keys.FLOAT:
        assert v == value and not (v == 0.0 and math.copysign(1.0, v) < 0)
    elif tag in (keys.NULL, keys.ARRAY, keys.OBJECT):
        assert v is None
    else:
        assert v == value and type(v) is type(value)
    assert enc.startswith(keys.column_key(path, tag))
    assert keys._path_end(enc) == len(keys.encode_path(path))


@given(INTS)
def test_u64_round_trip(v):
    v = v - keys.INT_MIN  # 0 .. 2**64 - 1
    assert keys.from_u64(keys.u64(v)) == v


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_u64_order(a, b):
    assert _cmp(keys.u64(a), keys.u64(b)) == _cmp(a, b)


# ---------------------------------------------------------------- prefix-freedom


@given(TERMS, TERMS)
@_settings(500)
def test_terms_are_prefix_free(a, b):
    ta, tb = keys.term(*a), keys.term(*b)
    if ta != tb:
        assert not tb.startswith(ta) and not ta.startswith(tb)


@given(PATHS, PATHS)
@_settings(300)
def test_paths_are_prefix_free(a, b):
    ea, eb = keys.encode_path(a), keys.encode_path(b)
    if a != b:
        assert not eb.startswith(ea)


@given(TERMS, st.binary(max_size=4))
@_settings(300)
def test_split_term_stops_at_the_path(t, junk):
    enc = keys.term(*t)
    # The path end is found from the front: anything after it never moves it.
    assert keys._path_end(enc + junk) == keys._path_end(enc)


# ---------------------------------------------------------------- prefix upper bound


@given(st.binary(min_size=1, max_size=6).filter(lambda p: p.strip(b"\xff")), st.binary(max_size=6))
@_settings(300)
def test_prefix_upper_bound_above_every_extension(prefix, suffix):
    ub = keys.prefix_upper_bound(prefix)
    assert prefix < ub
    assert prefix + suffix < ub
    assert not ub.startswith(prefix)


@given(st.binary(min_size=1, max_size=6).filter(lambda p: p.strip(b"\xff")), st.binary(max_size=8))
@_settings(500)
def test_prefix_upper_bound_is_tight(prefix, key):
    # [prefix, upper bound) holds exactly the keys that start with prefix.
    ub = keys.prefix_upper_bound(prefix)
    assert (prefix <= key < ub) == key.startswith(prefix)


@given(TERMS)
@_settings(200)
def test_column_key_range_holds_the_column(t):
    path, tag, value = t
    ck = keys.column_key(path, tag)
    assert ck <= keys.term(path, tag, value) < keys.prefix_upper_bound(ck)


@pytest.mark.parametrize("prefix", [b"", b"\xff", b"\xff\xff"])
def test_prefix_upper_bound_of_all_ff(prefix):
    with pytest.raises(ValueError):
        keys.prefix_upper_bound(prefix)


def test_known_encodings():
    assert keys.encode_int(0) == b"\x80" + bytes(7)
    assert keys.encode_int(-1) == b"\x7f" + b"\xff" * 7
    assert keys.encode_float(0.0) == keys.encode_float(-0.0) == b"\x80" + bytes(7)
    assert keys.encode_string("a\x00b") == b"a\x00\xffb\x00\x00"
    assert keys.encode_path(("a", "b")) == b"a\x00\x01b\x00\x00"
    assert keys.term(("a",), keys.BOOL, True) == b"a\x00\x00\x02\x01"
    assert keys.prefix_upper_bound(b"a\xff") == b"b"
    for lo, hi in pairwise([keys.NULL, keys.BOOL, keys.INT, keys.FLOAT, keys.STRING,
                            keys.TIMESTAMP, keys.ARRAY, keys.OBJECT]):
        assert keys.column_key(("p",), lo) < keys.column_key(("p",), hi)


def test_empty_path_is_an_error():
    with pytest.raises(ValueError):
        keys.encode_path(())


def test_source_offset_keys_belong_to_one_source_and_give_their_partition():
    names = ["a", "a_b", "a-", "ab", "a\x00b"]
    for name in names:
        k = keys.meta_source_offset(name, 7)
        assert keys.meta_source_partition(k) == 7
        lo, hi = keys.meta_source_range(name)
        for other in names:
            ok = keys.meta_source_offset(other, 2 ** 40)
            assert (lo <= ok < hi) == (other == name), (name, other)
