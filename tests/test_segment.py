"""SegmentBuilder: the compiled builder against the pure-Python reference, and by hand.

The differential tests feed the same generated documents (including ones that must fail)
to ``rtindex._ext._segment.SegmentBuilder`` and ``rtindex._py.segment.SegmentBuilder`` and
require identical results from every read method after every ``add``: the same term bytes,
postings, column values (type and repr), the same exception type and message, and, after a
failed ``add``, a builder that is exactly as before.

``HYPOTHESIS_PROFILE`` (see conftest.py) overrides the example counts set here.
"""

from __future__ import annotations

import os
from array import array
from collections import OrderedDict, namedtuple
from enum import IntEnum

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rtindex import keys
from rtindex._py.segment import SegmentBuilder as PySegmentBuilder
from rtindex.errors import SchemaError

try:
    from rtindex._ext._segment import SegmentBuilder as CySegmentBuilder
except ImportError:  # pragma: no cover - depends on the build
    if os.environ.get("RTINDEX_PURE_PYTHON") != "1":
        raise
    CySegmentBuilder = None

needs_ext = pytest.mark.skipif(CySegmentBuilder is None, reason="compiled extension not built")
IMPLS = [
    pytest.param(PySegmentBuilder, id="python"),
    pytest.param(CySegmentBuilder, id="cython", marks=needs_ext),
]


def _settings(max_examples: int) -> settings:
    if os.environ.get("HYPOTHESIS_PROFILE"):
        return settings()  # the profile loaded by conftest.py decides
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ---------------------------------------------------------------- odd values


class Str(str):
    pass


class Float(float):
    pass


class Color(IntEnum):
    RED = 1
    GREEN = 2


Point = namedtuple("Point", "x y")

# ---------------------------------------------------------------- strategies


def rarely(common, rare, one_in: int):
    """``rare`` about once in ``one_in`` draws, else ``common``."""
    return st.integers(1, one_in).flatmap(lambda i: rare if i == 1 else common)


NAMES = st.one_of(
    st.sampled_from(["a", "b", "c", "x_1", "_event_time", "a.b", "", "a b", "1a", "\x00", "a\x00",
                     "\x00\xff", "é", "😀", "a\n", "A", "_"]),
    st.text(max_size=4),
)
ODD_KEYS = st.sampled_from([1, None, (1,), 2.5, Str("k"), Str("a"), "\ud800", "a\udfffb"])
KEYS = rarely(NAMES, ODD_KEYS, 40)

STRINGS = st.one_of(
    st.sampled_from(["", "x", "y", "\x00", "a\x00b", "\x00\xff", "é", "😀", "\U0010ffff", "a" * 70]),
    st.text(max_size=8),
)
INTS = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([keys.INT_MIN, keys.INT_MAX, keys.INT_MIN + 1, keys.INT_MAX - 1, 2**32, 2**31 - 1, -(2**31)]),
    st.integers(keys.INT_MIN, keys.INT_MAX),
)
FLOATS = st.one_of(
    st.sampled_from([0.0, -0.0, 1.5, -1.5, 1.0, 5e-324, -5e-324, 1.7976931348623157e308]),
    st.floats(allow_nan=False, allow_infinity=False),
)
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, STRINGS)
# Values that must be rejected, and subclasses that must be handled like the reference does.
ODD_VALUES = st.sampled_from([
    2**63, -(2**63) - 1, 10**30, float("nan"), float("inf"), float("-inf"),
    "\ud800", "a\udfffb", "😀\udc00",
    b"bytes", {1, 2}, 1 + 2j, object(),
    Str("sub"), Str("\x00"), Color.RED, Float(2.5), Float(-0.0), Float("nan"), Point(1, 2),
])


def _containers(children):
    return st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(KEYS, children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(NAMES, children, max_size=3).map(OrderedDict),
    )


VALUES = st.recursive(rarely(SCALARS, ODD_VALUES, 25), _containers, max_leaves=16)
EVENT_TIMES = st.one_of(INTS, FLOATS, STRINGS, st.lists(INTS, max_size=2), st.none(), st.just({"x": 1}))


@st.composite
def documents(draw):
    doc = draw(st.dictionaries(KEYS, VALUES, max_size=8))
    if draw(st.booleans()):
        doc["_event_time"] = draw(EVENT_TIMES)
    if draw(st.integers(0, 9)) == 0:
        doc = OrderedDict(reversed(list(doc.items())))
    return doc


DOCS = rarely(documents(), st.sampled_from([[], [{"a": 1}], 1, None, "doc"]), 20)
# A few fixed shapes with small value pools, so that terms repeat across documents.
REPEATING = st.fixed_dictionaries(
    {"k": st.sampled_from(["x", "y", "\x00"]), "n": st.integers(0, 3), "f": st.sampled_from([0.0, -0.0, 1.5])},
    optional={
        "arr": st.lists(st.sampled_from([1, 2, "x", None, True]), max_size=3),
        "o": st.fixed_dictionaries({"p": st.booleans()}, optional={"q": st.sampled_from([[1], {"r": None}])}),
        "_event_time": st.integers(0, 3),
    },
)

# ---------------------------------------------------------------- helpers


def outcome(fn, *args):
    """What a call did: ("ok", result) or ("raised", type, message, SchemaError.path)."""
    try:
        return ("ok", fn(*args))
    except Exception as e:  # noqa: BLE001 - we compare whatever was raised
        return ("raised", type(e), str(e), getattr(e, "path", None))


def canon(v):
    return (type(v), repr(v))


def check_u32(a):
    assert type(a) is array and a.typecode == "I", a
    return a.tolist()


def snapshot(b) -> dict:
    """Everything the read API says about ``b`` (nbytes aside), in comparable form."""
    n = b.n_rows
    sp = [(t, check_u32(a)) for t, a in b.sorted_postings()]
    cks = b.column_keys()
    snap = {
        "n_rows": n,
        "column_keys": cks,
        "column_terms": {ck: b.column_terms(ck) for ck in cks},
        "sorted_postings": sp,
        "columns": [(ck, check_u32(o), [canon(v) for v in vals]) for ck, o, vals in b.columns()],
        "postings": {
            t: [check_u32(b.postings(t, lim)) for lim in (-1, 0, 1, n // 2, n - 1, n, n + 1, 2**40)]
            for t, _ in sp
        },
        "misses": [
            check_u32(b.postings(t, n + 1))
            for t in (b"", b"nope", b"a\x00\x00\x03", b"a\x00\x00\x03" + bytes(9), b"a\x00\x00\x05x\x00",
                      b"a\x00\x00\x05\xff\x00\x00", b"\x00\x00\x00", b"a\x00\x00\x02\x05", b"a\x00\x00\x01x")
        ],
        "unknown_column": b.column_terms(b"no such column\x00\x00\x05"),
    }
    for t, _ in sp:
        ck = t[: keys._path_end(t) + 1]
        assert t in snap["column_terms"][ck]  # every term's column knows it
        # Terms are prefix-free, and escape() never leaves 0x00 0x01 in a value: these are
        # never terms, however the lookup parses them.
        near = [t[:-1], t + b"\x00", t + b"\x00\x00"]
        if ck[-1] == keys.STRING and b"\x00\xff" in t[len(ck):]:
            near.append(ck + t[len(ck):].replace(b"\x00\xff", b"\x00\x01", 1))
        assert [check_u32(b.postings(x, n + 1)) for x in near] == [[]] * len(near), t
    return snap


def run_both(max_depth, docs):
    ref, cy = PySegmentBuilder(max_depth), CySegmentBuilder(max_depth)
    for doc in docs:
        before = snapshot(cy)
        nbytes_before = cy.nbytes
        r, c = outcome(ref.add, doc), outcome(cy.add, doc)
        assert c == r, doc
        after = snapshot(cy)
        assert after == snapshot(ref), doc
        if c[0] == "raised":
            assert after == before  # all or nothing
            assert cy.nbytes == nbytes_before
        else:
            assert cy.nbytes >= nbytes_before
            if after["sorted_postings"] != before["sorted_postings"]:
                assert cy.nbytes > nbytes_before
    return ref, cy


# ---------------------------------------------------------------- differential tests


@needs_ext
@given(max_depth=st.sampled_from([0, 1, 2, 3, 4, 64]), docs=st.lists(DOCS, min_size=1, max_size=10))
@_settings(300)
def test_same_as_reference(max_depth, docs):
    run_both(max_depth, docs)


@needs_ext
@given(docs=st.lists(REPEATING, min_size=1, max_size=40), bad_at=st.sets(st.integers(0, 39), max_size=5))
@_settings(100)
def test_same_as_reference_repeating_terms(docs, bad_at):
    # Failing documents in the middle of a stream of similar ones: the rollback must leave
    # every posting list and column exactly as it was, however long.
    docs = [dict(d, zzz=float("nan")) if i in bad_at else d for i, d in enumerate(docs)]
    run_both(64, docs)


@needs_ext
def test_same_as_reference_many_terms():
    # Enough distinct terms to grow the compiled term table several times.
    docs = [{"id": f"ev-{i}", "n": i, "f": i / 7, "g": {"s": str(i % 97)}, "t": [i, -i]} for i in range(3000)]
    ref, cy = PySegmentBuilder(), CySegmentBuilder()
    for d in docs:
        assert cy.add(d) == ref.add(d)
    with pytest.raises(SchemaError):
        cy.add({"new": "term", "id": "ev-new", "n": -1, "bad": 2**64})
    assert snapshot(cy) == snapshot(ref)


@needs_ext
def test_same_as_reference_deep_nesting():
    doc = leaf = {}
    for _ in range(150):
        leaf["x"] = [{}]
        leaf = leaf["x"][0]
    leaf["end"] = "here"
    for max_depth in (64, 299, 300, 301, 1000):
        run_both(max_depth, [doc, {"x": [{"x": 1}]}])


@needs_ext
def test_recursion_limit_is_an_exception_not_a_crash():
    doc = leaf = {}
    for _ in range(20_000):
        leaf["x"] = {}
        leaf = leaf["x"]
    cy = CySegmentBuilder(max_depth=10**9)
    with pytest.raises(RecursionError):
        cy.add(doc)
    assert snapshot(cy) == snapshot(CySegmentBuilder())
    assert cy.add({"x": {"x": 1}}) == 0


# ---------------------------------------------------------------- by hand, both implementations


@pytest.mark.parametrize("impl", IMPLS)
def test_flattening(impl):
    b = impl()
    doc = {
        "a": 1,
        "b": {"c": "x\x00y"},
        "d": [1, "y", {"e": None}, [2.5]],
        "_event_time": 5,
        "f": -0.0,
        "g": True,
        "h": {},
    }
    assert b.add(doc) == 0
    expected = {
        keys.term(("a",), keys.INT, 1),
        keys.term(("b",), keys.OBJECT),
        keys.term(("b", "c"), keys.STRING, "x\x00y"),
        keys.term(("d",), keys.ARRAY),
        keys.term(("d",), keys.INT, 1),
        keys.term(("d",), keys.STRING, "y"),
        keys.term(("d",), keys.OBJECT),
        keys.term(("d", "e"), keys.NULL),
        keys.term(("d",), keys.FLOAT, 2.5),
        keys.term(("_event_time",), keys.TIMESTAMP, 5),
        keys.term(("f",), keys.FLOAT, 0.0),
        keys.term(("g",), keys.BOOL, True),
        keys.term(("h",), keys.OBJECT),
    }
    sp = b.sorted_postings()
    assert [t for t, _ in sp] == sorted(expected)
    assert all(offs.tolist() == [0] for _, offs in sp)
    assert {keys.split_term(t) for t in expected} >= {(("b", "c"), keys.STRING, "x\x00y")}
    cols = {ck: (offs.tolist(), vals) for ck, offs, vals in b.columns()}
    assert cols == {
        keys.column_key(("a",), keys.INT): ([0], [1]),
        keys.column_key(("b", "c"), keys.STRING): ([0], ["x\x00y"]),
        keys.column_key(("d",), keys.ARRAY): ([0], ['[1,"y",{"e":null},[2.5]]']),
        keys.column_key(("_event_time",), keys.TIMESTAMP): ([0], [5]),
        keys.column_key(("f",), keys.FLOAT): ([0], [0.0]),
        keys.column_key(("g",), keys.BOOL): ([0], [True]),
    }
    f = cols[keys.column_key(("f",), keys.FLOAT)][1][0]
    assert str(f) == "0.0"  # -0.0 is stored as 0.0
    assert b.column_terms(keys.column_key(("d",), keys.INT)) == [keys.term(("d",), keys.INT, 1)]
    assert set(b.column_keys()) == {t[: keys._path_end(t) + 1] for t in expected}


@pytest.mark.parametrize("impl", IMPLS)
def test_event_time_only_at_the_top(impl):
    b = impl()
    b.add({"_event_time": 7, "x": {"_event_time": 8}})
    b.add({"_event_time": [9]})
    b.add({"_event_time": 1.5})
    terms = {t for t, _ in b.sorted_postings()}
    assert keys.term(("_event_time",), keys.TIMESTAMP, 7) in terms
    assert keys.term(("x", "_event_time"), keys.INT, 8) in terms
    assert keys.term(("_event_time",), keys.INT, 9) in terms
    assert keys.term(("_event_time",), keys.FLOAT, 1.5) in terms
    assert keys.term(("_event_time",), keys.TIMESTAMP, 9) not in terms


@pytest.mark.parametrize("impl", IMPLS)
def test_offsets_and_postings_limit(impl):
    b = impl()
    for i in range(10):
        assert b.add({"k": i % 3, "same": [1, 1, 1]}) == i
    assert b.n_rows == 10
    t0 = keys.term(("k",), keys.INT, 0)
    assert b.postings(t0, 10).tolist() == [0, 3, 6, 9]
    assert b.postings(t0, 9).tolist() == [0, 3, 6]
    assert b.postings(t0, 4).tolist() == [0, 3]
    assert b.postings(t0, 0).tolist() == []
    assert b.postings(t0, -5).tolist() == []
    assert b.postings(t0, 2**40).tolist() == [0, 3, 6, 9]
    assert b.postings(keys.term(("same",), keys.INT, 1), 100).tolist() == list(range(10))
    assert b.postings(keys.term(("k",), keys.INT, 5), 100).tolist() == []
    assert b.postings(b"", 100).tolist() == []
    out = b.postings(t0, 10)
    out.append(99)  # a new array each time
    assert b.postings(t0, 10).tolist() == [0, 3, 6, 9]


ERRORS = [
    ([1], "a document must be a JSON object, not list", "$"),
    ({"a": [1, {"b": float("nan")}]}, "non-finite number nan (JSON has no NaN or Infinity)", "$.a[1].b"),
    ({"a": float("-inf")}, "non-finite number -inf (JSON has no NaN or Infinity)", "$.a"),
    ({"a b": {"c": 2**64}}, "integer outside the signed 64-bit range", '$["a b"].c'),
    ({"x": [[-(2**63) - 1]]}, "integer outside the signed 64-bit range", "$.x[0][0]"),
    ({"a": {1: 2}}, "object keys must be strings, not int", "$.a"),
    ({"a": ["ok", "\ud800"]}, "string is not valid UTF-8 (lone surrogate)", "$.a[1]"),
    ({"a": b"x"}, "unsupported value type bytes", "$.a"),
    ({"é": {"\x00": {1, 2}}}, "unsupported value type set", '$["é"]["\\u0000"]'),
    ({"a": {"b": {"c": {"d": 1}}}}, "nesting deeper than 3 levels", "$.a.b.c"),
    ({"a": {"b": [[1]]}}, "nesting deeper than 3 levels", "$.a.b[0]"),
    ({"a": [[[1]]]}, "nesting deeper than 3 levels", "$.a[0][0]"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("doc,message,path", ERRORS, ids=[f"error{i}" for i in range(len(ERRORS))])
def test_errors(impl, doc, message, path):
    b = impl(max_depth=3)
    b.add({"a": 1})
    with pytest.raises(SchemaError) as ei:
        b.add(doc)
    assert ei.value.message == message
    assert ei.value.path == path
    assert str(ei.value) == f"{message} (at {path})"
    assert isinstance(ei.value, ValueError)


@pytest.mark.parametrize("impl", IMPLS)
def test_max_depth_boundaries(impl):
    b = impl(max_depth=3)
    b.add({"a": {"b": {"c": 1}}})
    b.add({"a": [[1]]})
    b.add({"a": [{"b": 1}]})
    assert b.n_rows == 3
    b.add({"a": {"b": []}})
    with pytest.raises(SchemaError, match=r"nesting deeper than 3 levels \(at \$\.a\.b\.c\)"):
        b.add({"a": {"b": {"c": []}}})
    assert b.n_rows == 4
    with pytest.raises(SchemaError):
        impl(max_depth=0).add({})


@pytest.mark.parametrize("impl", IMPLS)
def test_failed_add_changes_nothing(impl):
    good = {"id": "a", "n": 1, "o": {"s": "x"}, "arr": [1, 2]}
    b, expected = impl(), impl()
    b.add(good)
    expected.add(good)
    before = b.nbytes
    bad = {"id": "b", "n": 1, "new": {"deep": ["fresh", 3.5]}, "arr": [9, {"z": float("nan")}]}
    with pytest.raises(SchemaError):
        b.add(bad)
    assert b.nbytes == before
    assert snapshot(b) == snapshot(expected)
    assert b.add(good) == 1
    expected.add(good)
    assert snapshot(b) == snapshot(expected)


@pytest.mark.parametrize("impl", IMPLS)
def test_nbytes_grows_with_content(impl):
    b = impl()
    assert b.nbytes == 0
    sizes = []
    for i in range(5):
        b.add({"id": f"doc-{i}", "v": i, "tags": ["x", "y"]})
        sizes.append(b.nbytes)
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    b.add({})
    assert b.nbytes == sizes[-1]


@pytest.mark.parametrize("impl", IMPLS)
def test_keys_and_strings_with_nul_bytes(impl):
    b = impl()
    b.add({"a\x00b": "c\x00", "a": {"\x00b": 1}})
    terms = [t for t, _ in b.sorted_postings()]
    assert keys.term(("a\x00b",), keys.STRING, "c\x00") in terms
    assert keys.term(("a", "\x00b"), keys.INT, 1) in terms
    assert all(keys.term(*keys.split_term(t)) == t for t in terms)


@pytest.mark.parametrize("impl", IMPLS)
def test_odd_arguments(impl):
    b = impl()
    b.add({"a": "x"})
    assert b.postings("not bytes", 10).tolist() == []
    with pytest.raises(TypeError):
        b.postings([b"unhashable"], 10)
    assert b.column_terms("no") == []
    with pytest.raises(TypeError):
        b.column_terms(["unhashable"])


@needs_ext
def test_compiled_reads_return_fresh_arrays():
    b = CySegmentBuilder()
    b.add({"a": [1, 2]})
    (t, offs), *_ = b.sorted_postings()
    offs.append(7)
    assert b.sorted_postings()[0][1].tolist() == [0]
    (ck, o, vals), *_ = b.columns()
    o.append(5)
    assert b.columns()[0][1].tolist() == [0]
    assert vals == [orjson.dumps([1, 2]).decode()]


@needs_ext
def test_compiled_max_depth_attribute():
    b = CySegmentBuilder(max_depth=5)
    assert b.max_depth == 5
    b.max_depth = 1
    with pytest.raises(SchemaError, match="nesting deeper than 1 levels"):
        b.add({"a": {}})
    b.max_depth = 10**30  # clamped, not an error
    b.add({"a": {}})


@needs_ext
@given(
    docs=st.lists(st.one_of(REPEATING, documents()), min_size=2, max_size=12),
    fail_doc=st.integers(0, 11),
    fail_at=st.integers(0, 40),
)
@_settings(150)
def test_rollback_after_a_failure_while_resolving_terms(docs, fail_doc, fail_at):
    # The walk checks every value before any term is touched, so SchemaError never leaves
    # half-posted terms behind; an allocation failure while resolving them (simulated here)
    # must be rolled back all the same.
    ref, cy = PySegmentBuilder(), CySegmentBuilder()
    for i, doc in enumerate(docs):
        if i == fail_doc:
            before = snapshot(cy)
            nbytes = cy.nbytes
            cy._test_fail_commit_at(fail_at)
            c = outcome(cy.add, doc)
            cy._test_fail_commit_at(-1)
            if c[0] == "raised" and c[1] is MemoryError:
                assert snapshot(cy) == before
                assert cy.nbytes == nbytes
                c = outcome(cy.add, doc)
        else:
            c = outcome(cy.add, doc)
        assert c == outcome(ref.add, doc)
        assert snapshot(cy) == snapshot(ref)


@pytest.mark.parametrize("impl", IMPLS)
def test_postings_of_almost_terms(impl):
    b = impl()
    b.add({"s": "a\x00", "e": "", "n": 255})
    ck = keys.column_key(("s",), keys.STRING)
    assert b.postings(ck + b"a\x00\xff\x00\x00", 5).tolist() == [0]
    for almost in (b"a\x00\x00\x00", b"a\x00\x01\x00\x00", b"a\x00\xff\x00", b"a\x00\xff\x00\x00\x00"):
        assert b.postings(ck + almost, 5).tolist() == [], almost
    assert b.postings(keys.term(("e",), keys.STRING, ""), 5).tolist() == [0]
    assert b.postings(keys.column_key(("e",), keys.STRING) + b"\x00", 5).tolist() == []
    assert b.postings(keys.term(("n",), keys.INT, 255)[:-1], 5).tolist() == []
