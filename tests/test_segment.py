"""SegmentBuilder: the compiled builder against the pure-Python reference, and by hand.

The differential tests feed the same generated documents (including ones that must fail)
to ``rtindex._ext._segment.SegmentBuilder`` and ``rtindex._py.segment.SegmentBuilder`` and
require identical results from every read method after every ``add``: the same term bytes,
postings, column values (Arrow type, then each value's type and repr), term blocks
(``write_blocks``, also against a ``BlockWriter`` fed ``sorted_postings()``), the same
exception type and message, and, after a failed ``add``, a builder that is exactly as before.

``HYPOTHESIS_PROFILE`` (see conftest.py) overrides the example counts set here.
"""

from __future__ import annotations

import os
import random
import threading
from array import array
from collections import OrderedDict, namedtuple
from enum import IntEnum

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rtindex._py.blocks as PyBlocks
from rtindex import columns, keys
from rtindex._py.segment import SegmentBuilder as PySegmentBuilder
from rtindex.errors import SchemaError

try:
    import rtindex._ext._blocks as CyBlocks
    from rtindex._ext._segment import SegmentBuilder as CySegmentBuilder
except ImportError:  # pragma: no cover - depends on the build
    if os.environ.get("RTINDEX_PURE_PYTHON") != "1":
        raise
    CySegmentBuilder = CyBlocks = None

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


def pyvalues(arr):
    """A column's values as Python objects (timestamps as their int64 microseconds: the
    extremes are outside ``datetime``'s range)."""
    assert isinstance(arr, pa.Array), arr
    arr.validate(full=True)
    assert arr.null_count == 0
    if pa.types.is_timestamp(arr.type):
        arr = arr.view(pa.int64())
    return arr.to_pylist()


def check_values(arr):
    """Comparable form of a column's values: the Arrow type and each value's type and repr."""
    return (str(arr.type), [canon(v) for v in pyvalues(arr)])


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
        "columns": [(ck, check_u32(o), check_values(vals)) for ck, o, vals in b.columns()],
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
        "column": {
            ck: [(check_u32(o), check_values(vals)) for o, vals in
                 (b.column(ck, lim) for lim in (-1, 0, 1, n // 2, n - 1, n, n + 1, 2**40))]
            for ck in [c for c, _, _ in b.columns()] + cks + [b"no such column\x00\x00\x05"]
        },
        "column_size": {
            ck: [b.column_size(ck, lim) for lim in (-1, 0, 1, n // 2, n - 1, n, n + 1, 2**40)]
            for ck in [c for c, _, _ in b.columns()] + cks + [b"no such column\x00\x00\x05"]
        },
        "write_blocks": {target: b.write_blocks(target) for target in (1, 64, 16384)},
    }
    for ck, sizes in snap["column_size"].items():
        assert sizes == [len(o) for o, _ in snap["column"][ck]], ck
        assert sizes == [len(vals) for _, (_, vals) in snap["column"][ck]], ck
    for target, blocks in snap["write_blocks"].items():
        assert blocks == blocks_of(sp_arrays(b), target), target
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


def sp_arrays(b):
    return b.sorted_postings()


def blocks_of(sorted_postings, target):
    """What the seal did before write_blocks: a BlockWriter fed ``sorted_postings``."""
    w = (CyBlocks or PyBlocks).BlockWriter(target)
    out = []
    for t, offs in sorted_postings:
        r = w.add(t, offs)
        if r is not None:
            out.append(r)
    r = w.finish()
    if r is not None:
        out.append(r)
    return out


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
            if len(after["sorted_postings"]) > len(before["sorted_postings"]):  # new terms
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
def test_term_table_past_a_huge_page():
    # ~50k distinct terms grow the compiled term table past 2 MiB, from where it lives on
    # its own huge-page mapping (huge_zalloc); every term must still be found, and growing
    # and freeing it again (a second builder) must work too.
    docs = [{"id": f"ev-{i}", "n": i * 3} for i in range(25_000)]
    ref = PySegmentBuilder()
    for d in docs:
        ref.add(d)
    expected = [(t, a.tolist()) for t, a in ref.sorted_postings()]
    for _ in range(2):
        cy = CySegmentBuilder()
        for d in docs:
            cy.add(d)
        assert [(t, a.tolist()) for t, a in cy.sorted_postings()] == expected
        assert all(cy.postings(t, 10**9).tolist() == a for t, a in expected[::97])


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
    cols = {ck: (offs.tolist(), pyvalues(vals)) for ck, offs, vals in b.columns()}
    assert cols == {
        keys.column_key(("a",), keys.INT): ([0], [1]),
        keys.column_key(("b", "c"), keys.STRING): ([0], ["x\x00y"]),
        keys.column_key(("d",), keys.ARRAY): ([0], ['[1,"y",{"e":null},[2.5]]']),
        keys.column_key(("_event_time",), keys.TIMESTAMP): ([0], [5]),
        keys.column_key(("f",), keys.FLOAT): ([0], [0.0]),
        keys.column_key(("g",), keys.BOOL): ([0], [True]),
    }
    assert {ck: vals.type for ck, _, vals in b.columns()} == {ck: columns.ARROW_TYPES[ck[-1]] for ck in cols}
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
    assert 0 <= b.nbytes < 64 << 10  # the compiled one's empty term table
    sizes = []
    for i in range(5):
        b.add({"id": f"doc-{i}", "v": i, "tags": ["x", "y"]})
        sizes.append(b.nbytes)
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    b.add({})
    assert b.nbytes == sizes[-1]


@needs_ext
def test_compiled_nbytes_counts_what_it_holds():
    # Column buffers (no value objects: one distinct string, kept once as its term's str),
    # the term table and the strs of string terms.
    b = CySegmentBuilder()
    empty = b.nbytes
    for i in range(4000):
        b.add({"s": "x" * 1000, "n": 1})
    assert 4_000_000 <= b.nbytes - empty <= 8_400_000  # the arena: 4 MB in use, 4 MiB capacity
    b2 = CySegmentBuilder()
    for i in range(4000):
        b2.add({"id": f"{i:0100d}"})  # 4000 new terms, each keeping a str of ~150 bytes
    assert b2.nbytes - empty >= 4000 * (150 + 40) + 400_000


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
    assert vals.to_pylist() == [orjson.dumps([1, 2]).decode()]


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


# ---------------------------------------------------------------- write_blocks


TARGETS = st.one_of(st.sampled_from([1, 64, 65, 100, 1000, 16384, 2**20, 2**62, 2**70]), st.integers(1, 50_000))


@st.composite
def hot_documents(draw):
    """Many rows with a few high-cardinality terms (>= 64, >= 4096 rows: roaring postings of
    array, bitset and run containers), mixed with generated documents."""
    n = draw(st.sampled_from([1, 63, 64, 65, 300, 4095, 4096, 4097, 5000]))
    rng = random.Random(draw(st.integers(0, 2**32)))
    p_hot = draw(st.sampled_from([1.0, 0.97, 0.5, 0.05]))
    extra = draw(st.lists(st.tuples(st.integers(0, max(n - 1, 0)), documents()), max_size=5))
    docs = []
    for i in range(n):
        d = {"k": i % 7, "all": "x", "f": [1.5, None]}
        if rng.random() < p_hot:
            d["hot"] = "h\x00"
        if i % 3 == 0:
            d["every3"] = True
        if i >= n // 2:
            d["tail"] = {"z": 0}  # a run of consecutive rows
        if rng.random() < 0.2:
            d["s"] = rng.choice(["a", "b", "a\x00", "é", "😀", "same prefix " + str(rng.randrange(50))])
        docs.append(d)
    for i, d in sorted(extra, key=lambda x: x[0]):
        docs.insert(i, d)
    return docs


def add_both(ref, cy, docs):
    for doc in docs:
        assert outcome(cy.add, doc) == outcome(ref.add, doc)


def check_blocks(ref, cy, target):
    blocks = cy.write_blocks(target)
    assert blocks == ref.write_blocks(target)
    assert blocks == blocks_of(cy.sorted_postings(), target)
    # Every term and posting comes back, in order.
    items = [(t, bm.to_array().tolist()) for _, blk in blocks for t, bm in CyBlocks.block_items(blk)]
    assert items == [(t, offs.tolist()) for t, offs in ref.sorted_postings()]
    return blocks


@needs_ext
@given(docs=st.lists(DOCS, max_size=12), targets=st.lists(TARGETS, min_size=1, max_size=3))
@_settings(150)
def test_write_blocks_same_as_reference(docs, targets):
    ref, cy = PySegmentBuilder(), CySegmentBuilder()
    add_both(ref, cy, docs)
    for target in targets:
        check_blocks(ref, cy, target)


@needs_ext
@given(docs=hot_documents(), targets=st.lists(TARGETS, min_size=1, max_size=2))
@_settings(20)
def test_write_blocks_high_cardinality(docs, targets):
    ref, cy = PySegmentBuilder(), CySegmentBuilder()
    add_both(ref, cy, docs)
    for target in targets:
        blocks = check_blocks(ref, cy, target)
    if max((len(offs) for _, offs in ref.sorted_postings()), default=0) >= 64:
        kinds = {struct_kind(blk, i) for _, blk in blocks for i in range(block_n(blk))}
        assert kinds == {0, 1}  # both raw and roaring entries were written


def block_n(block):
    return int.from_bytes(block[4:8], "little")


def struct_kind(block, i):
    """Entry ``i``'s posting kind (0 raw, 1 roaring), read with the reference decoder."""
    return PyBlocks._Block(block).entry(i)[3]


@needs_ext
def test_write_blocks_roaring_containers():
    # One term per roaring container kind (run, bitset: >= 4096 rows, array) and raw ones.
    rng = random.Random(7)
    docs = [{"all": 1, "half": rng.random() < 0.5, "sparse": rng.random() < 0.02, "few": i in (5, 9),
             "runs": (i // 100) % 2 == 0} for i in range(6000)]
    ref, cy = PySegmentBuilder(), CySegmentBuilder()
    add_both(ref, cy, docs)
    by_len = {len(offs) for _, offs in ref.sorted_postings()}
    assert max(by_len) == 6000 and any(4096 <= n < 6000 for n in by_len) and 2 in by_len
    for target in (1, 64, 16384):
        blocks = check_blocks(ref, cy, target)
        kinds = [struct_kind(blk, i) for _, blk in blocks for i in range(block_n(blk))]
        assert kinds.count(1) >= 5 and kinds.count(0) >= 1


@needs_ext
def test_write_blocks_many_terms():
    # Enough terms to grow the table several times; string runs sharing long prefixes (the
    # sort compares them 8 bytes at a time) and one prefix longer than the refinement depth.
    ref, cy = PySegmentBuilder(), CySegmentBuilder()
    long = "p" * 300
    docs = [{"id": f"ev-{i}", "n": i - 1500, "f": i / 7, "s": f"same prefix {i % 700:05d}",
             "l": long + str(i % 40), "l2": long + "\x00" * (i % 3), "t": [i % 5, -i]}
            for i in range(3000)]
    add_both(ref, cy, docs)
    for target in (1, 64, 4096, 16384, 2**30):
        check_blocks(ref, cy, target)


@needs_ext
def test_write_blocks_sort_order_edge_values():
    ref, cy = PySegmentBuilder(), CySegmentBuilder()
    strs = ["", "\x00", "\x00\x00", "\x00\xff", "\x01", "a", "a\x00", "a\x00b", "ab", "\x7f", "\x80", "\xff",
            "é", "\u07ff", "\u0800", "\uffff", "\U00010000", "😀", "\U0010ffff", "abcdefgh", "abcdefgh\x00",
            "abcdefghi", "abcdefg", "abcdefgh" * 3, "abcdefgh" * 3 + "\x00"]
    ints = [keys.INT_MIN, keys.INT_MIN + 1, -(2**32), -1, 0, 1, 2**32, keys.INT_MAX]
    floats = [-1.7976931348623157e308, -1.5, -5e-324, 0.0, 5e-324, 1.5, 1.7976931348623157e308]
    docs = [{"s": v} for v in strs] + [{"i": v, "_event_time": v} for v in ints] + [{"f": v} for v in floats]
    docs += [{"b": True}, {"b": False}, {"n": None}, {"o": {}}, {"a": []}]
    add_both(ref, cy, list(reversed(docs)))
    for target in (1, 64, 16384):
        check_blocks(ref, cy, target)


@pytest.mark.parametrize("impl", IMPLS)
def test_write_blocks_arguments(impl):
    b = impl()
    assert b.write_blocks() == [] and b.write_blocks(1) == []
    b.add({"a": 1})
    assert b.write_blocks() == b.write_blocks(16384)
    for bad, exc in [("1", TypeError), (True, TypeError), (1.0, TypeError), (None, TypeError),
                     (0, ValueError), (-5, ValueError)]:
        with pytest.raises(exc) as ei:
            b.write_blocks(bad)
        with pytest.raises(exc) as ei2:
            PyBlocks.BlockWriter(bad)
        assert str(ei.value) == str(ei2.value)
    assert b.add({"a": 2}) == 1  # usable afterwards


@needs_ext
def test_write_blocks_while_other_threads_run():
    # write_blocks releases the GIL: the result is the same while other threads run Python
    # code and read the same builder.
    cy = CySegmentBuilder()
    for i in range(20_000):
        cy.add({"id": f"ev-{i}", "n": i % 1000, "s": "x" if i % 3 else "y"})
    expected = blocks_of(cy.sorted_postings(), 16384)
    stop = threading.Event()
    seen = []

    def reader():
        t = keys.term(("s",), keys.STRING, "y")
        while not stop.is_set():
            seen.append(len(cy.postings(t, 10**9)))
            cy.column(keys.column_key(("n",), keys.INT), 500)

    th = threading.Thread(target=reader)
    th.start()
    try:
        results = [cy.write_blocks(16384) for _ in range(3)]
    finally:
        stop.set()
        th.join()
    assert all(r == expected for r in results)
    assert seen and set(seen) == {6667}


@pytest.mark.parametrize("impl", IMPLS)
def test_column(impl):
    b = impl()
    for i in range(6):
        b.add({"n": i, "s": "x"} if i % 2 else {"s": "y", "arr": [1, {"in": i}]})
    ck = keys.column_key(("n",), keys.INT)
    offs, vals = b.column(ck, 4)
    assert offs.tolist() == [1, 3] and vals.to_pylist() == [1, 3] and vals.type == pa.int64()
    offs.append(9)
    offs, vals = b.column(ck, 100)
    assert offs == array("I", [1, 3, 5]) and vals.to_pylist() == [1, 3, 5]  # copies, not the builder's
    for lim in (0, -(2**70)):
        offs, vals = b.column(ck, lim)
        assert offs == array("I") and vals.to_pylist() == [] and vals.type == pa.int64()
    assert b.column(ck, 2**70)[1].to_pylist() == [1, 3, 5]
    for unknown, typ in [(keys.column_key(("arr", "in"), keys.INT), pa.int64()),  # only in arrays
                         (keys.column_key(("nope",), keys.STRING), pa.large_string()),
                         (keys.column_key(("arr",), keys.OBJECT), pa.null()),
                         (b"nope", pa.null()), ("nope", pa.null()), (b"", pa.null())]:
        offs, vals = b.column(unknown, 10)
        assert offs == array("I") and len(vals) == 0 and vals.type == typ, unknown
    with pytest.raises(TypeError):
        b.column([b"unhashable"], 10)
    with pytest.raises(TypeError):
        b.column(ck, 1.5)
    for ck2, o, v in b.columns():
        o2, v2 = b.column(ck2, b.n_rows)
        assert o2 == o and v2.equals(v)


@pytest.mark.parametrize("impl", IMPLS)
def test_column_types_and_copies(impl):
    # Every value type, through buffer growth (strings past the first arena sizes, bools past
    # a byte): an array taken earlier keeps its values while the builder grows on.
    b = impl()
    rows = []
    for i in range(3000):
        doc = {"i": i - 1500, "f": i / 4 - 100.0, "b": i % 3 == 0, "n": None, "s": "é" * (i % 5) + str(i),
               "a": [i, "x"], "_event_time": 1_700_000_000_000_000 + i}
        if i % 7 == 3:
            del doc["s"]  # a sparse column
        rows.append(doc)
    taken = []
    for i, doc in enumerate(rows):
        b.add(doc)
        if i in (0, 7, 100, 2999):
            taken.append((i + 1, {ck: b.column(ck, i + 1) for ck in b.column_keys()}))
    for n, cols in taken:
        for ck, (offs, vals) in cols.items():
            end = keys._path_end(ck)
            (name,), tag = keys.decode_path(ck[:end]), ck[end]
            if name == "a" and tag != keys.ARRAY:  # array elements: no column values
                assert len(offs) == len(vals) == 0
                continue
            assert vals.type == columns.ARROW_TYPES[tag]
            expect = [rows[o][name] for o in offs]
            if tag == keys.ARRAY:
                expect = [orjson.dumps(v).decode() for v in expect]
            elif tag == keys.NULL:
                expect = [True] * len(offs)
            assert pyvalues(vals) == expect, (n, ck)
            assert len(offs) == (n - (n + 3) // 7 if name == "s" else n)
