"""SegmentBuilder: the compiled builder against the pure-Python reference, and by hand.

The differential tests feed the same JSON documents (generated ones serialized many ways,
hostile and mutated text, documents that must be refused) to
``rtindex._ext._segment.SegmentBuilder`` and ``rtindex._py.segment.SegmentBuilder`` with
``add_json``, and require the same offsets and errors (message and path) and identical
results from every read method after every batch: the same term bytes, postings, column
values (Arrow type, then each value's type and repr), term blocks (``write_blocks``, also
against a reference ``BlockWriter`` fed ``sorted_postings()``) and row bytes. Documents
serialized differently must index alike, and as ``walk`` indexes the Python values.

Then the compiled builder's own ways: growth (many terms, long posting lists, very deep
documents), a reader thread beside the writer, a view of another builder's file
(``attach``/``publish``), and a mapping that cannot grow.

``HYPOTHESIS_PROFILE`` (see conftest.py) overrides the example counts set here.
"""

from __future__ import annotations

import ast
import bisect
import json
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from array import array
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import rtindex._py.blocks as PyBlocks
from rtindex import columns, keys
from rtindex._py.segment import SegmentBuilder as PySegmentBuilder
from rtindex._py.segment import walk
from rtindex.errors import SchemaError
from tests.jsontext import (  # noqa: F401 - FLOATS, INTS, STRINGS, REPEATING: for test_columnar, test_add_columns
    FAMILY,
    FLOATS,
    HOSTILE,
    HOSTILE_TEXTS,
    INTS,
    MUTATED,
    NUMBER_TEXTS,
    REPEATING,
    SERIALIZERS,
    STRINGS,
    TRUNCATED,
    UTF8_EDGES,
    documents,
    json_documents,
    rarely,
)

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


def dumps(*docs) -> list[bytes]:
    return [orjson.dumps(d) for d in docs]


def run_isolated(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter in the project's directory: a test whose subject
    may crash the process fails instead of ending the run."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=Path(__file__).resolve().parent.parent,
                          capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------- helpers


def outcome(fn, *args):
    """What a call did: ("ok", result) or ("raised", type, message, SchemaError.path)."""
    try:
        return ("ok", fn(*args))
    except Exception as e:  # noqa: BLE001 - we compare whatever was raised
        return ("raised", type(e), str(e), getattr(e, "path", None))


def added(b, docs):
    """``b.add_json(docs)`` in comparable form: ("ok", offsets, [(index, message, path)]) or
    what it raised; checks the shape of a result on the way."""
    n0 = b.n_rows
    try:
        offsets, errors = b.add_json(docs)
    except Exception as e:  # noqa: BLE001
        return ("raised", type(e), str(e))
    assert type(offsets) is list and len(offsets) == len(docs)
    accepted = [o for o in offsets if o != -1]
    assert accepted == list(range(n0, n0 + len(accepted)))  # the next rows, in order
    assert b.n_rows == n0 + len(accepted)
    assert [i for i, _ in errors] == [i for i, o in enumerate(offsets) if o == -1]
    out = []
    for i, e in errors:
        assert type(e) is SchemaError and isinstance(e, ValueError)
        assert str(e) == f"{e.message} (at {e.path})"
        out.append((i, e.message, e.path))
    return ("ok", offsets, out)


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


LIMITS = lambda n: (-1, 0, 1, n // 2, n - 1, n, n + 1, 2**40)  # noqa: E731
UNKNOWN_COLUMN = b"no such column\x00\x00\x05"
MISSES = (b"", b"nope", b"a\x00\x00\x03", b"a\x00\x00\x03" + bytes(9), b"a\x00\x00\x05x\x00",
          b"a\x00\x00\x05\xff\x00\x00", b"\x00\x00\x00", b"a\x00\x00\x02\x05", b"a\x00\x00\x01x")


def snapshot(b) -> dict:
    """Everything the read API says about ``b`` (nbytes aside), in comparable form."""
    n = b.n_rows
    sp = [(t, check_u32(a)) for t, a in b.sorted_postings()]
    cks = b.column_keys()
    assert cks == sorted(cks)
    with_values = [c for c, _, _ in b.columns()]
    snap = {
        "n_rows": n,
        "base": b.base,
        "max_depth": b.max_depth,
        "published": b.published,
        "column_keys": cks,
        "column_terms": {ck: b.column_terms(ck) for ck in cks},
        "sorted_postings": sp,
        "columns": [(ck, check_u32(o), check_values(vals)) for ck, o, vals in b.columns()],
        "postings": {t: [check_u32(b.postings(t, lim)) for lim in LIMITS(n)] for t, _ in sp},
        "misses": [check_u32(b.postings(t, n + 1)) for t in MISSES],
        "unknown_column": b.column_terms(UNKNOWN_COLUMN),
        "column": {
            ck: [(check_u32(o), check_values(vals)) for o, vals in (b.column(ck, lim) for lim in LIMITS(n))]
            for ck in with_values + cks + [UNKNOWN_COLUMN]
        },
        "column_size": {ck: [b.column_size(ck, lim) for lim in LIMITS(n)]
                        for ck in with_values + cks + [UNKNOWN_COLUMN]},
        "write_blocks": {target: b.write_blocks(target) for target in (1, 64, 16384)},
        "rows": [b.row(i) for i in range(n)],
        "row_past_end": outcome(b.row, n),
    }
    assert all(type(r) is bytes for r in snap["rows"])
    for ck, sizes in snap["column_size"].items():
        assert sizes == [len(o) for o, _ in snap["column"][ck]], ck
        assert sizes == [len(vals) for _, (_, vals) in snap["column"][ck]], ck
    for target, blocks in snap["write_blocks"].items():
        assert blocks == blocks_of(b.sorted_postings(), target), target
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


def summary(b) -> dict:
    """The reads a seal makes, and the rows: a lighter snapshot for large builders."""
    return {
        "n_rows": b.n_rows,
        "column_keys": b.column_keys(),
        "column_terms": {ck: b.column_terms(ck) for ck in b.column_keys()},
        "sorted_postings": [(t, check_u32(a)) for t, a in b.sorted_postings()],
        "columns": [(ck, check_u32(o), check_values(vals)) for ck, o, vals in b.columns()],
        "rows": [b.row(i) for i in range(b.n_rows)],
    }


def prefix_reads(b, n: int, terms, cks) -> dict:
    """What ``b`` says about its first ``n`` rows: reads with the limit ``n``."""
    return {
        "postings": {t: check_u32(b.postings(t, n)) for t in terms},
        "column": {ck: (check_u32(o), check_values(v)) for ck, (o, v) in ((ck, b.column(ck, n)) for ck in cks)},
        "column_size": {ck: b.column_size(ck, n) for ck in cks},
        "rows": [b.row(i) for i in range(n)],
    }


def portable(snap: dict) -> dict:
    """A snapshot without what depends on how the documents were written: the row bytes,
    and the text of arrays (compared by the values it holds)."""
    out = dict(snap)
    del out["rows"]

    def texts(ck, vals):
        if ck[-1] != keys.ARRAY:
            return vals
        return (vals[0], [repr(json.loads(ast.literal_eval(r))) for _, r in vals[1]])

    out["columns"] = [(ck, o, texts(ck, v)) for ck, o, v in snap["columns"]]
    out["column"] = {ck: [(o, texts(ck, v)) for o, v in per] for ck, per in snap["column"].items()}
    return out


def blocks_of(sorted_postings, target):
    """What a seal does before write_blocks: a reference BlockWriter fed ``sorted_postings``."""
    w = PyBlocks.BlockWriter(target)
    out = []
    for t, offs in sorted_postings:
        r = w.add(t, offs)
        if r is not None:
            out.append(r)
    r = w.finish()
    if r is not None:
        out.append(r)
    return out


def run_both(max_depth, batches, snap=snapshot):
    """Each batch to a reference and a compiled builder: the same results and reads after
    every batch. Returns (reference, compiled, results)."""
    ref, cy = PySegmentBuilder(max_depth=max_depth), CySegmentBuilder(max_depth=max_depth)
    results = []
    for batch in batches:
        nbytes = cy.nbytes
        r, c = added(ref, batch), added(cy, batch)
        assert c == r, batch
        results.append(c)
        assert snap(cy) == snap(ref), batch
        assert cy.nbytes >= nbytes
    return ref, cy, results


def dict_index(docs, max_depth):
    """The index of the Python values ``docs`` (dicts) by ``walk``, their arrays' text as
    orjson writes it: (errors, sorted postings, columns), in the builders' read forms."""
    postings, cols, errors = {}, {}, []
    off = 0
    for i, doc in enumerate(docs):
        try:
            terms, values = walk(doc, max_depth)
        except SchemaError as e:
            errors.append((i, e.message, e.path))
            continue
        for t in terms:
            plist = postings.setdefault(t, [])
            if not plist or plist[-1] != off:
                plist.append(off)
        for ck, v in values:
            col = cols.setdefault(ck, ([], []))
            col[0].append(off)
            col[1].append(v)
        off += 1
    return (errors, sorted(postings.items()),
            [(ck, o, check_values(columns.values_array(ck[-1], v))) for ck, (o, v) in sorted(cols.items())])


# ---------------------------------------------------------------- differential: generated documents


BATCH_ITEMS = rarely(json_documents(), st.one_of(HOSTILE_TEXTS, MUTATED), 8)


@needs_ext
@given(max_depth=st.sampled_from([0, 1, 2, 3, 4, 64]),
       batches=st.lists(st.lists(BATCH_ITEMS, max_size=5), min_size=1, max_size=3))
@_settings(45)
def test_same_as_reference(max_depth, batches):
    run_both(max_depth, batches)


@needs_ext
@given(docs=st.lists(documents(), min_size=1, max_size=6), max_depth=st.sampled_from([1, 2, 3, 64]))
@_settings(20)
def test_every_serialization_indexes_alike(docs, max_depth):
    """orjson and json.dumps (whitespace, escapes, indentation) give the same results and the
    same index, the one ``walk`` makes of the Python values; only the row bytes and the
    text of arrays follow the input."""
    errors, postings, cols = dict_index(docs, max_depth)
    refused = {i for i, _, _ in errors}
    offsets, n = [], 0
    for i in range(len(docs)):
        offsets.append(-1 if i in refused else n)
        n += i not in refused
    seen = {}
    for name, serialize in SERIALIZERS.items():
        batch = [serialize(d) for d in docs]
        ref, cy, [result] = run_both(max_depth, [batch])
        assert result == ("ok", offsets, errors), name
        snap = snapshot(cy)
        assert snap["rows"] == [raw for i, raw in enumerate(batch) if result[1][i] != -1]
        assert snap["sorted_postings"] == [(t, offs) for t, offs in postings], name
        if FAMILY[name] == "orjson":
            assert snap["columns"] == cols, name
        seen.setdefault(FAMILY[name], []).append((name, snap))
    families = {fam: snaps[0][1] for fam, snaps in seen.items()}
    for fam, snaps in seen.items():  # the same compact array text within a family
        for name, snap in snaps:
            assert {k: v for k, v in snap.items() if k != "rows"} == \
                {k: v for k, v in families[fam].items() if k != "rows"}, name
    first = portable(families["orjson"])
    for fam, snap in families.items():
        assert portable(snap) == first, fam


@needs_ext
@given(docs=st.lists(REPEATING, min_size=1, max_size=40), bad_at=st.sets(st.integers(0, 39), max_size=5),
       cuts=st.lists(st.integers(0, 40), max_size=3), bad=st.one_of(HOSTILE_TEXTS, MUTATED))
@_settings(60)
def test_same_as_reference_repeating_terms(docs, bad_at, cuts, bad):
    # Refused documents in the middle of a stream of similar ones (and of a batch): every
    # posting list and column must be as if they were never sent.
    raws = [bad if i in bad_at else orjson.dumps(d) for i, d in enumerate(docs)]
    bounds = sorted({0, len(raws), *(min(c, len(raws)) for c in cuts)})
    run_both(64, [raws[a:b] for a, b in zip(bounds, bounds[1:])])


@needs_ext
@given(texts=st.lists(NUMBER_TEXTS, min_size=1, max_size=8))
@_settings(50)
def test_number_texts(texts):
    batch = [b'{"n":' + t.encode() + b',"a":[' + t.encode() + b",-" + t.lstrip("-").encode() + b"]}" for t in texts]
    run_both(64, [batch])


NUMBERS_BY_HAND = [
    "0", "-0", "0.0", "-0.0", "0e0", "-0e-0", "1e-400", "-1e-400", "1e308", "-1e308", "1.7976931348623157e308",
    "1.7976931348623158e308", "1.797693134862315807e308", "1.7976931348623159e308", "4.9406564584124654e-324",
    "4.9406564584124654e-325", "2.4703282292062327e-324", "2.4703282292062328e-324", "2.2250738585072011e-308",
    "2.2250738585072012e-308", "2.2250738585072014e-308", "9223372036854775807", "-9223372036854775808",
    "9223372036854775808", "-9223372036854775809", "18446744073709551616", "9223372036854775807.0",
    "9223372036854775807e0", "0.1", "0.30000000000000004", "1e23", "8.98846567431158e307",
    "9007199254740993", "9007199254740993.0", "9007199254740993.00000000000000000000001",
    "0.1000000000000000055511151231257827021181583404541015625", "1" * 30, "1" * 30 + ".0",
    "0." + "0" * 330 + "1e330", "1" + "0" * 330 + "e-330", "123456789012345678e-10", "7e-10", "1E2", "1e+2",
    "00", "-00", "01", "1.", "1.e1", ".1", "-", "--1", "+1", "1e", "1e+", "1e-", "1ee1", "1.2.3", "0x1",
    "Infinity", "-Infinity", "NaN", "1e99999999999999999999", "1e-99999999999999999999", "-" + "9" * 20,
]


@needs_ext
def test_numbers_by_hand():
    batch = [b'{"n":' + t.encode() + b',"a":[' + t.encode() + b"]}" for t in NUMBERS_BY_HAND]
    _, _, [(_, offsets, errors)] = run_both(64, [batch])
    assert offsets.count(-1) == len(errors) >= 15


# ---------------------------------------------------------------- differential: hostile text


@needs_ext
@pytest.mark.parametrize("raw,message,path,max_depth", HOSTILE,
                         ids=[f"{i}:{r[:40].decode('latin-1')}" for i, (r, *_) in enumerate(HOSTILE)])
def test_hostile_documents(raw, message, path, max_depth):
    # Between two good documents: the same error as the reference parser's, and nothing of
    # it left behind.
    _, _, [result] = run_both(max_depth, [[b'{"a":{"b":1}}', raw, b'{"a":[{"b":"x"}],"c":2}']])
    assert (1, message, path) in result[2]


@needs_ext
@given(batches=st.lists(st.lists(st.one_of(MUTATED, HOSTILE_TEXTS, json_documents(REPEATING)), max_size=8),
                        min_size=1, max_size=3),
       max_depth=st.sampled_from([2, 3, 6, 64]))
@_settings(60)
def test_mutated_documents(batches, max_depth):
    run_both(max_depth, batches)


@needs_ext
@given(doc=documents(), serializer=st.sampled_from(sorted(SERIALIZERS)))
@_settings(10)
def test_every_truncation(doc, serializer):
    raw = SERIALIZERS[serializer](doc)
    cuts = range(len(raw) + 1)
    if len(raw) > 500:  # every 7th, and the last 60
        cuts = sorted({*range(0, len(raw), 7), *range(len(raw) - 60, len(raw) + 1)})
    run_both(64, [[raw[:i] for i in cuts] + [TRUNCATED[:i] for i in range(len(TRUNCATED) + 1)]], snap=summary)


@needs_ext
def test_every_byte_everywhere():
    patterns = [b"{%s}", b'{"a":%s}', b'{"a":"\\%s0041"}', b'{"a":"x%s"}', b'{"a":1%s}', b'{"a":[1%s]}',
                b'{"a"%s:1}', b'{"x%s":1}', b'{"a":[%s]}', b'{"a":t%srue}', b'{"a":-%s1}', b'{"a":1.%s}',
                b'{"a":1e%s2}', b'{"a":"\\u00%s1"}', b'{"a":"\\ud83d\\u%sde00"}', b'%s{}', b'{}%s']
    batch = [p.replace(b"%s", bytes([c])) for p in patterns for c in range(256)]
    _, _, [result] = run_both(64, [batch], snap=summary)
    assert 0 < result[1].count(-1) < len(batch)


@needs_ext
def test_utf8_sequences_exhaustively():
    # The compiled scanner checks UTF-8 itself: a lead byte of each class boundary with
    # every second byte, then every lead byte with boundary bytes after, in a string and in
    # a key. (tests/test_jsonparse.py runs every lead byte with every second byte.)
    leads = sorted({c for c in UTF8_EDGES if c >= 0x80} | {0xC3, 0xE2, 0xEB, 0xF2})
    cases = [bytes([lead, second, 0x80, 0x80]) for lead in leads for second in range(256)]
    cases += [bytes([lead, second]) + tail for lead in range(0x80, 0x100) for second in UTF8_EDGES
              for tail in (b"", b"\x80", b"\xbf\x7f", b"\x80\xbf", b"\x8f\x90\x41")]
    batch = [b'{"a":"' + c + b'"}' for c in cases] + [b'{"' + c + b'":1}' for c in cases[::5]]
    ref, cy, [result] = run_both(64, [batch], snap=summary)
    for c, off in zip(cases, result[1]):
        try:
            c.decode("utf-8")
        except UnicodeDecodeError:
            assert off == -1, c
        else:
            assert off != -1, c


LONE_TEXT = st.text(alphabet=st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "a", "é", "😀", "\\", '"']),
                    min_size=1, max_size=4)


@needs_ext
@given(texts=st.lists(st.tuples(LONE_TEXT, st.booleans(), st.sampled_from(["escape", "raw"])), min_size=1,
                      max_size=6))
@_settings(60)
def test_lone_surrogates(texts):
    # Written as \u escapes (json.dumps' ensure_ascii) or as their three bytes (invalid
    # UTF-8), in a value or a key, in an object or an array.
    batch = []
    for s, as_key, how in texts:
        doc = {"o": {s: 1}} if as_key else {"o": [1, {"p": s}]}
        text = json.dumps(doc) if how == "escape" else json.dumps(doc, ensure_ascii=False)
        batch.append(text.encode("utf-8", "surrogatepass"))
    _, _, [result] = run_both(64, [batch])
    for (s, as_key, how), off in zip(texts, result[1]):
        try:  # escaped: a high then a low surrogate are one character
            s.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
            lone = how == "raw" and any(0xD800 <= ord(c) <= 0xDFFF for c in s)  # raw: never UTF-8
        except UnicodeDecodeError:
            lone = True
        assert (off == -1) == lone, (s, how)


# ---------------------------------------------------------------- differential: sizes


@needs_ext
def test_many_terms():
    # 30k distinct terms (strings and numbers) grow the term table many times over; a refused
    # document with new terms in every batch must leave none of them behind.
    ref, cy = PySegmentBuilder(), CySegmentBuilder()
    slots = cy._test_counts()["slots"]
    for start in range(0, 6000, 1000):
        batch = dumps(*({"id": f"ev-{i}", "n": i * 7919 - 10**6, "f": i / 7, "g": {"s": str(i % 97)}, "t": [i, -i]}
                        for i in range(start, start + 1000)))
        batch.insert(700, b'{"id":"refused","n":-5,"new":"term","x":[1,2,"y"],"n2":1e999}')
        assert added(cy, batch) == added(ref, batch)
        probe = [t for t, _ in ref.sorted_postings()[::499]]
        assert [cy.postings(t, 2**40) for t in probe] == [ref.postings(t, 2**40) for t in probe]
    counts = cy._test_counts()
    assert counts["terms"] == len(ref.sorted_postings()) > 30_000
    assert counts["slots"] >= 32 * slots and counts["terms"] * 8 <= counts["slots"] * 5
    assert summary(cy) == summary(ref)
    assert cy.write_blocks(16384) == ref.write_blocks(16384)
    # And again, in one batch, in a second builder (the first one freed on the way).
    batch = [cy.row(i) for i in range(cy.n_rows)]
    del cy
    cy2 = CySegmentBuilder()
    assert cy2.add_json(batch)[0] == list(range(len(batch)))
    assert summary(cy2) == summary(ref)


@needs_ext
def test_long_posting_lists():
    # A term in every row, one in every other row, one in every third: past the inline
    # postings and every slice size (8 rows doubling up to 4,096, then 4,096 each).
    n = 10_500
    batch = dumps(*({"hot": "h", "i": i, "two": i % 2 == 0, **({"three": None} if i % 3 == 0 else {})}
                    for i in range(n)))
    ref, cy = PySegmentBuilder(), CySegmentBuilder()
    for a in range(0, n, 2100):
        assert added(cy, batch[a:a + 2100]) == added(ref, batch[a:a + 2100])
    bounds, total, size = {2}, 2, 8  # postings: 2 in the term's record, then the slices
    while total < n:
        total += size
        bounds.add(total)
        size = min(size * 2, 4096)
    col_bounds = {16 * (2**k - 1) for k in range(1, 11)}  # column values: 16 doubling up to 16,384
    limits = sorted({x + d for b in bounds for x in (b, 2 * b, 3 * b) for d in (-1, 0, 1)}
                    | {x + d for b in col_bounds for x in (b, 3 * b) for d in (-1, 0, 1)} | {0, 1, n - 1, n, n + 1})
    hot, two = keys.term(("hot",), keys.STRING, "h"), keys.term(("two",), keys.BOOL, True)
    three = keys.term(("three",), keys.NULL)
    cols = [keys.column_key(("i",), keys.INT), keys.column_key(("three",), keys.NULL)]
    full = {ck: ref.column(ck, n) for ck in cols}
    for lim in limits:
        assert cy.postings(hot, lim).tolist() == list(range(min(lim, n)))
        assert cy.postings(two, lim).tolist() == list(range(0, min(lim, n), 2))
        assert cy.postings(three, lim).tolist() == list(range(0, min(lim, n), 3))
        for ck in cols:
            o, v = cy.column(ck, lim)
            k = bisect.bisect_left(full[ck][0], max(lim, 0))
            assert o == full[ck][0][:k] and v.equals(full[ck][1].slice(0, k)), (ck, lim)
            assert cy.column_size(ck, lim) == k
    assert summary(cy) == summary(ref)
    assert cy.write_blocks(16384) == ref.write_blocks(16384)


def nested(kind: str, depth: int, leaf: bytes = b"1") -> bytes:
    """A document whose deepest container is at level ``depth`` (the root object is 1)."""
    if kind == "objects":
        return b'{"a":' * (depth - 1) + b"{}" + b"}" * (depth - 1) if depth > 1 else b"{}"
    if kind == "arrays":
        return b'{"a":' + b"[" * (depth - 1) + leaf + b"]" * (depth - 1) + b"}" if depth > 1 else b"{}"
    # alternating: an array in the root object, an object in it, an array in that...
    if depth == 1:
        return b"{}"
    opens, closes = [], []
    for level in range(2, depth + 1):
        last = level == depth
        if level % 2 == 0:
            opens.append(b"[]" if last else b"[")
            closes.append(b"" if last else b"]")
        else:
            opens.append(b"{}" if last else b'{"o":')
            closes.append(b"" if last else b"}")
    return b'{"a":' + b"".join(opens) + b"".join(reversed(closes)) + b"}"


@needs_ext
@pytest.mark.parametrize("max_depth", [0, 1, 2, 3, 4, 63, 64, 65, 200])
def test_nesting_at_the_limit(max_depth):
    batch, expect = [], []
    for depth in {max(1, max_depth - 1), max(1, max_depth), max_depth + 1, max_depth + 2}:
        for kind in ("objects", "arrays", "mixed"):
            batch.append(nested(kind, depth))
            expect.append(depth <= max_depth)
    k = max(0, max_depth - 4)  # the deepest array at level 4 + k
    batch.append(b'{"a":[[],[[' + b"[" * k + b"]" * k + b"]],{}]}")
    expect.append(max_depth >= 4)
    _, _, [result] = run_both(max_depth, [batch])
    assert [o != -1 for o in result[1]] == expect
    for i, message, path in result[2]:
        assert message == f"nesting deeper than {max_depth} levels"


@needs_ext
def test_very_deep_documents_compiled():
    # The scanner keeps its own stack: 200,000 levels are no recursion, only a limit. (Deep
    # objects make a column per level, each keyed by its whole path: 3,000 levels, 9 MB.)
    deep_arrays = b'{"a":' + b"[ " * 200_000 + b"]" * 200_000 + b"}"
    deep_objects = b'{"a":' * 3000 + b'"leaf"' + b"}" * 3000
    cy = CySegmentBuilder(max_depth=10**9)
    assert cy.add_json([deep_arrays, deep_objects]) == ([0, 1], [])
    assert cy.postings(keys.term(("a",), keys.ARRAY), 10).tolist() == [0]
    assert cy.column(keys.column_key(("a",), keys.ARRAY), 10)[1].to_pylist() == ["[" * 200_000 + "]" * 200_000]
    assert cy.postings(keys.term(("a",) * 3000, keys.STRING, "leaf"), 10).tolist() == [1]
    assert cy.postings(keys.term(("a",) * 2999, keys.OBJECT), 10).tolist() == [1]
    assert cy.row(0) == deep_arrays
    # Refused at the limit, with the same path as the reference's (which stops there too).
    ref, cy, [result] = run_both(64, [[deep_arrays, deep_objects, b"{}"]])
    assert result == ("ok", [-1, -1, 0], [(0, "nesting deeper than 64 levels", "$.a" + "[0]" * 63),
                                          (1, "nesting deeper than 64 levels", "$" + ".a" * 64)])


@needs_ext
def test_nul_bytes_in_keys_and_strings():
    docs = [{"a\x00b": "c\x00", "a": {"\x00b": 1, "\x00": ["\x00", "\x00\x00", "\x00\xff"]}},
            {"\x00": "\x00", "\x00\x00": "", "": "\x00"}, {"a\x00": {"b": "x\x00\x00y"}}, {"a": {"\x00b": 2}}]
    for serialize in (orjson.dumps, lambda d: json.dumps(d).encode()):
        ref, cy, _ = run_both(64, [[serialize(d) for d in docs]])
    terms = [t for t, _ in cy.sorted_postings()]
    assert keys.term(("a\x00b",), keys.STRING, "c\x00") in terms
    assert keys.term(("a", "\x00b"), keys.INT, 1) in terms
    assert keys.term(("a", "\x00"), keys.STRING, "\x00\xff") in terms
    assert all(keys.term(*keys.split_term(t)) == t for t in terms)
    assert len({keys.column_key_of(t) for t in terms}) == len(cy.column_keys())


DUPLICATES = [
    (b'{"a":1,"a":1}', "$.a"),
    (b'{"a":1,"b":2,"a":{}}', "$.a"),
    (b'{"o":{"x":[],"x":[]}}', "$.o.x"),
    (b'{"o":[{"k":1},{"k":1,"k":2}]}', "$.o[1].k"),
    (b'{"\\u0000":1,"\\u0000":2}', '$["\\u0000"]'),
    (b'{"\\u00e9":1,"\xc3\xa9":2}', '$["é"]'),
    (b'{"a\\u0000":1,"a\\u0000":2}', '$["a\\u0000"]'),
    (b'{"":{},"":{}}', '$[""]'),
    (b'{"_event_time":1,"_event_time":2}', "$._event_time"),
]


@needs_ext
@pytest.mark.parametrize("raw,path", DUPLICATES, ids=[str(i) for i in range(len(DUPLICATES))])
def test_duplicate_keys_are_refused(raw, path):
    # A repeated name, even with the same value: the path tree must not confuse it with the
    # same name in the document before.
    primer = b'{"a":1,"b":2,"o":{"x":[],"k":1},"":{},"_event_time":3}'
    _, _, [result] = run_both(64, [[primer, raw, primer, raw[:-1] + b',"z":0}']])
    assert result[1] == [0, -1, 1, -1]
    assert result[2] == [(1, "duplicate key in an object", path), (3, "duplicate key in an object", path)]


@needs_ext
def test_empty_documents():
    batch = [b"{}", b" {} ", b"\t\r\n{\n}\n", b"{}", b'{"a":{}}', b"{}"]
    ref, cy, [result, _] = run_both(64, [batch, [b"{}"] * 3000])
    assert result == ("ok", list(range(6)), [])
    assert cy.n_rows == 3006 and cy.row(1) == b" {} " and cy.row(2) == b"\t\r\n{\n}\n"
    assert [t for t, _ in cy.sorted_postings()] == [keys.term(("a",), keys.OBJECT)]
    assert cy.columns() == [] and cy.column_keys() == [keys.column_key(("a",), keys.OBJECT)]


# ---------------------------------------------------------------- a reader beside the writer


@needs_ext
def test_reader_thread_sees_consistent_prefixes():
    # Readers take a row limit (n_rows) and read postings, columns, terms and rows below it
    # while another thread adds batches: each read is exactly the reference's for that
    # prefix (and never a crash).
    rng = random.Random(11)
    docs = []
    for i in range(12_000):
        d = {"id": f"r{i}", "k": i % 7, "s": rng.choice(["a", "b", "é", "\x00"]), "f": i / 3, "hot": True}
        if i % 5 == 0:
            d["arr"] = [i % 4, "x" * (i % 9)]
        if i % 1000 == 999:
            d["late"] = f"t{i // 1000}"
        docs.append(orjson.dumps(d))
        if i % 777 == 0:
            docs.append(b'{"id":"bad","new":[1,2],"n":1e400}')
    batches = [docs[a:a + 50] for a in range(0, len(docs), 50)]
    ref = PySegmentBuilder()
    for batch in batches:
        ref.add_json(batch)
    probe_terms = [keys.term(("hot",), keys.BOOL, True), keys.term(("k",), keys.INT, 3),
                   keys.term(("s",), keys.STRING, "\x00"), keys.term(("arr",), keys.ARRAY),
                   keys.term(("arr",), keys.INT, 1), *(keys.term(("late",), keys.STRING, f"t{j}") for j in range(12)),
                   keys.term(("new",), keys.ARRAY), keys.term(("id",), keys.STRING, "r11999")]
    probe_cols = [keys.column_key(p, t) for p, t in [(("k",), keys.INT), (("s",), keys.STRING), (("f",), keys.FLOAT),
                                                   (("arr",), keys.ARRAY), (("late",), keys.STRING),
                                                   (("hot",), keys.BOOL), (("id",), keys.STRING)]]
    full = {ck: ref.column(ck, ref.n_rows) for ck in probe_cols}  # (offsets, values) of every row
    few_terms = {ck: set(ref.column_terms(ck)) for ck in probe_cols if len(ref.column_terms(ck)) < 50}
    all_cks = set(ref.column_keys())
    cy = CySegmentBuilder()
    stop = threading.Event()
    failures, limits = [], []

    def reader():
        r = random.Random(5)
        try:
            while not stop.is_set():
                n = cy.n_rows
                limits.append(n)
                for t in probe_terms:
                    got = cy.postings(t, n)
                    if got != ref.postings(t, n):
                        failures.append(("postings", t, n, got.tolist()))
                for ck in probe_cols:
                    o, v = cy.column(ck, n)
                    k = bisect.bisect_left(full[ck][0], n)
                    if o != full[ck][0][:k] or not v.equals(full[ck][1].slice(0, k)) or cy.column_size(ck, n) != k:
                        failures.append(("column", ck, n))
                for ck, expected in few_terms.items():
                    if not {t for t in expected if len(ref.postings(t, n))} <= set(cy.column_terms(ck)) <= expected:
                        failures.append(("column_terms", ck, n))
                if not set(cy.column_keys()) <= all_cks:
                    failures.append(("column_keys", n))
                if n:
                    for i in (n - 1, r.randrange(n)):
                        if cy.row(i) != ref.row(i):
                            failures.append(("row", i))
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(("raised", repr(e)))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for th in threads:
        th.start()
    try:
        for batch in batches:
            cy.add_json(batch)
            time.sleep(0.0005)  # (the readers' turn)
    finally:
        stop.set()
        for th in threads:
            th.join()
    assert failures == []
    assert len(set(limits)) > 50  # the readers did read while the writer wrote
    assert summary(cy) == summary(ref)


READERS_WITH_ANY_LIMIT = """
    import sys, threading
    import orjson
    import pyarrow as pa
    from rtindex import keys
    from rtindex._ext._segment import SegmentBuilder

    sys.setswitchinterval(1e-4)
    b = SegmentBuilder()
    hot, ck = keys.term(("b",), keys.BOOL, True), keys.column_key(("i",), keys.INT)
    stop, bad, reads = threading.Event(), [], [0]

    def postings():
        while not stop.is_set():
            n = b.n_rows
            for limit in (2**40, n + 1000, n):
                got = b.postings(hot, limit)
                if len(got) < n or (len(got) and (got[0], got[-1]) != (0, len(got) - 1)):
                    bad.append(("postings", limit, n, len(got)))
            reads[0] += 1

    def columns():
        while not stop.is_set():
            n = b.n_rows
            o, v = b.column(ck, 2**40)
            if len(o) < n or len(o) != len(v) or (len(o) and v[len(o) - 1].as_py() != len(o) - 1):
                bad.append(("column", n, len(o)))
            if b.column_size(ck, 2**40) < n or (n and b.row(n - 1) != b'{"b":true}'):
                bad.append(("column_size", n))
            reads[0] += 1

    threads = [threading.Thread(target=f) for f in (postings, postings, columns)]
    for t in threads:
        t.start()
    m = 20_000
    for k in range(30):
        ints = pa.array(range(k * m, (k + 1) * m))
        b.add_columns(["b", "i"], [pa.array([True] * m), ints], [b'{"b":true}'] * m)
    stop.set()
    for t in threads:
        t.join()
    print("rows", b.n_rows, "reads", reads[0], "bad", bad[:5])
"""


@needs_ext
def test_readers_with_any_limit_never_crash():
    # A limit is any int: a reader may ask for every row (2**40) while the writer adds
    # rows of that very term (add_columns posts 20,000 at a time, without the GIL). Each
    # read is a prefix at least as long as the rows added before it; and nothing crashes.
    done = run_isolated(READERS_WITH_ANY_LIMIT)
    got = (done.returncode, done.stdout.split()[:2], done.stdout.split("bad")[-1].strip())
    assert got == (0, ["rows", "600000"], "[]"), done.stderr[-2000:]


# ---------------------------------------------------------------- attach and publish


def reads_of(b):
    """Terms and column keys to read: all of ``b``'s, and some it does not have."""
    terms = [t for t, _ in b.sorted_postings()] + list(MISSES)
    cks = sorted({*b.column_keys(), *(ck for ck, _, _ in b.columns()), UNKNOWN_COLUMN})
    return terms, cks


@needs_ext
def test_attach_sees_the_published_rows(tmp_path):
    path = tmp_path / "seg"
    w = CySegmentBuilder(path, base=1000, max_depth=8)
    view = CySegmentBuilder.attach(path)
    assert (view.n_rows, view.published, view.base, view.max_depth, view.path, view.writer) == \
        (0, (0, 0), 1000, 8, str(path), False)
    assert (w.path, w.writer, w.published) == (str(path), True, (0, 0))
    ref = PySegmentBuilder(max_depth=8)
    rng = random.Random(3)
    batches = [dumps(*({"i": i, "k": i % 3, "s": rng.choice("xyz"), "a": [i, {"b": i % 2}], "_event_time": i}
                      for i in range(a, a + 40))) + [b'{"bad":', b'{"deep":' + b"[" * 9 + b"]" * 9 + b"}"]
               for a in range(0, 400, 40)]
    published = 0
    for k, batch in enumerate(batches):
        assert added(w, batch) == added(ref, batch)
        terms, cks = reads_of(ref)
        # Not yet published: the view still shows what it showed.
        assert view.n_rows == published
        assert prefix_reads(view, published, terms, cks) == prefix_reads(ref, published, terms, cks)
        published = w.n_rows - rng.randrange(0, 30)
        w.publish(published, 100 + k)
        assert view.published == w.published == (published, 100 + k)
        assert view.n_rows == published
        assert prefix_reads(view, published, terms, cks) == prefix_reads(w, published, terms, cks) \
            == prefix_reads(ref, published, terms, cks)
        with pytest.raises(IndexError):
            view.row(published)
        if k % 4 == 3:  # a view attached later sees the same
            later = CySegmentBuilder.attach(path)
            assert prefix_reads(later, published, terms, cks) == prefix_reads(view, published, terms, cks)
            later.close()
    # Everything published: every read is the writer's (and the reference's).
    w.publish(w.n_rows, 999)
    assert snapshot(view) == snapshot(w)
    assert {k: v for k, v in snapshot(view).items() if k not in ("base", "published")} == \
        {k: v for k, v in snapshot(ref).items() if k not in ("base", "published")}
    # The view cannot write; it outlives the writer's close and the file's unlink.
    for call in (lambda: view.add_json([b"{}"]), lambda: view.add_columns(["a"], [pa.array([1])], [b'{"a":1}']),
                 lambda: view.publish(0, 0), lambda: view._test_fail_alloc_after(0)):
        with pytest.raises(RuntimeError):
            call()
    before = snapshot(view)
    w.close()
    w.unlink()
    assert not path.exists()
    assert snapshot(view) == before
    view.close()
    with pytest.raises(ValueError, match="closed"):
        view.postings(b"x", 1)
    with pytest.raises(ValueError, match="closed"):
        w.n_rows


@needs_ext
def test_attach_refuses_other_files(tmp_path):
    for name, content in [("empty", b""), ("short", b"RTTAIL01"), ("zeros", bytes(1 << 16)),
                          ("text", b'{"a":1}\n' * 4096), ("random", random.Random(1).randbytes(1 << 16))]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match="not a mutable segment file"):
            CySegmentBuilder.attach(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        CySegmentBuilder.attach(tmp_path / "missing")


@needs_ext
def test_one_writer_per_file(tmp_path):
    path = tmp_path / "seg"
    w = CySegmentBuilder(str(path))
    w.add_json([b'{"a":1}'])
    with pytest.raises(OSError):
        CySegmentBuilder(path)  # the file exists: another writer's
    (tmp_path / "other").write_bytes(b"x")
    with pytest.raises(OSError):
        CySegmentBuilder(tmp_path / "other")
    assert (tmp_path / "other").read_bytes() == b"x"
    with pytest.raises(OSError):
        CySegmentBuilder(tmp_path / "no such dir" / "seg")
    assert w.add_json([b'{"a":2}']) == ([1], [])  # the first writer is unharmed
    w.publish(2, 1)
    assert CySegmentBuilder.attach(path).postings(keys.term(("a",), keys.INT, 2), 2).tolist() == [1]


# ---------------------------------------------------------------- a mapping that cannot grow


@needs_ext
@pytest.mark.parametrize("file_backed", [False, True], ids=["memory", "file"])
def test_allocation_failure_breaks_the_builder(tmp_path, file_backed):
    path = tmp_path / "seg" if file_backed else None
    b, ref = CySegmentBuilder(path), PySegmentBuilder()
    first = dumps(*({"i": i, "s": f"v{i % 10}", "a": [i]} for i in range(300)))
    assert added(b, first) == added(ref, first)
    b.publish(300, 7)
    view = CySegmentBuilder.attach(path) if file_backed else None
    terms, cks = reads_of(ref)
    expected = prefix_reads(ref, 300, terms, cks)
    b._test_fail_alloc_after(64 << 10)
    big = dumps(*({"s": "x" * 1000 + str(i), "i": i + 1000} for i in range(8000)))  # 8 MB: past the file's size
    with pytest.raises(OSError):
        b.add_json(big)
    for call in (lambda: b.add_json([b"{}"]), lambda: b.add_json([]),
                 lambda: b.add_columns(["a"], [pa.array([1])], [b'{"a":1}'])):
        with pytest.raises(RuntimeError):
            call()
    assert b.n_rows >= 300 and b.published == (300, 7)
    assert prefix_reads(b, 300, terms, cks) == expected  # the published rows are intact
    if view is not None:
        assert view.n_rows == 300
        assert prefix_reads(view, 300, terms, cks) == expected
        view.close()


@needs_ext
@given(fail_after=st.integers(0, 6 << 20), batches=st.lists(st.integers(1, 2000), min_size=1, max_size=4))
@example(fail_after=0, batches=[2000, 2000, 2000])
@example(fail_after=3 << 20, batches=[1, 2000, 2000, 2000])
@_settings(10)
def test_allocation_failure_anywhere(fail_after, batches):
    # Wherever the mapping stops growing (past the file's first 4 MiB), the rows before the
    # failed batch read as they did before it, and the builder takes no more. (Its reads
    # are the reference's elsewhere: here they are compared with themselves.)
    b = CySegmentBuilder()
    b._test_fail_alloc_after(fail_after)
    start, failed = 0, False
    for size in batches:
        batch = dumps(*({"id": f"{i:08d}" * 8, "n": i, "t": ["x" * (i % 50)], "pad": "p" * 1500}
                        for i in range(start, start + size)))
        n = b.n_rows
        terms = [t for t, _ in b.sorted_postings()] + [keys.term(("id",), keys.STRING, f"{start:08d}" * 8)]
        cks = sorted({*b.column_keys(), *(ck for ck, _, _ in b.columns())})
        before = prefix_reads(b, n, terms, cks)
        got = added(b, batch)
        if got[0] == "raised":
            assert got[1] is OSError and "the mutable segment is full" in got[2], got
            assert b.n_rows >= n
            assert prefix_reads(b, n, terms, cks) == before
            for call in (lambda: b.add_json(batch), lambda: b.add_json([b"{}"])):
                with pytest.raises(RuntimeError):
                    call()
            assert prefix_reads(b, n, terms, cks) == before
            failed = True
            break
        assert got == ("ok", list(range(start, start + size)), [])
        start += size
    assert failed == (start < sum(batches))


# ---------------------------------------------------------------- by hand, both implementations


@pytest.mark.parametrize("impl", IMPLS)
def test_flattening(impl):
    b = impl()
    raw = (b'{"a": 1, "b": {"c": "x\\u0000y"}, "d": [1, "y", {"e": null}, [2.5]],'
           b' "_event_time": 5, "f": -0.0, "g": true, "h": {}}')
    assert b.add_json([raw]) == ([0], [])
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
    assert str(cols[keys.column_key(("f",), keys.FLOAT)][1][0]) == "0.0"  # -0.0 is stored as 0.0
    assert b.column_terms(keys.column_key(("d",), keys.INT)) == [keys.term(("d",), keys.INT, 1)]
    assert b.column_keys() == sorted({t[: keys._path_end(t) + 1] for t in expected})
    assert b.row(0) == raw


@pytest.mark.parametrize("impl", IMPLS)
def test_array_text_is_the_source_without_whitespace(impl):
    b = impl()
    raw = (b'{"a": [ 1 , "a b" ,\n{"x" : [ ]}, ["\\u00e9", "\\" ]"], \t\r\n[]\n], "e": ["\xc3\xa9 \xc3\xbc", 1E2, -0.0,'
           b' 1.50, 0e0], "o": {"in": [true,\tfalse , null]}, "t": [[ [ ] ]] }')
    assert b.add_json([raw]) == ([0], [])
    cols = {ck: pyvalues(vals) for ck, _, vals in b.columns() if ck[-1] == keys.ARRAY}
    assert cols == {
        keys.column_key(("a",), keys.ARRAY): ['[1,"a b",{"x":[]},["\\u00e9","\\" ]"],[]]'],
        keys.column_key(("e",), keys.ARRAY): ['["é ü",1E2,-0.0,1.50,0e0]'],
        keys.column_key(("o", "in"), keys.ARRAY): ["[true,false,null]"],
        keys.column_key(("t",), keys.ARRAY): ["[[[]]]"],
    }
    terms = {t for t, _ in b.sorted_postings()}
    assert keys.term(("e",), keys.FLOAT, 100.0) in terms and keys.term(("e",), keys.FLOAT, 0.0) in terms
    assert keys.term(("a", "x"), keys.ARRAY) in terms
    assert b.row(0) == raw


@pytest.mark.parametrize("impl", IMPLS)
def test_event_time_only_at_the_top(impl):
    b = impl()
    offsets, errors = b.add_json([b'{"_event_time": 7, "x": {"_event_time": 8}}', b'{"_event_time": [9]}',
                                  b'{"_event_time": 1.5}', b'{"_event_time": 1e2}', b'{"_event_time": "10"}',
                                  b'{"_event_time": -9223372036854775808}', b'{"_event_time": null}',
                                  b'{"a":[{"_event_time": 11}]}', b'{"_event_time": 9223372036854775808}',
                                  b'{"_event_time": 12, "_event_time": 12}', b'{"_event_time": -0}'])
    assert offsets == [0, 1, 2, 3, 4, 5, 6, 7, -1, -1, 8]
    assert [(i, e.message, e.path) for i, e in errors] == [
        (8, "integer outside the signed 64-bit range", "$._event_time"),
        (9, "duplicate key in an object", "$._event_time")]
    terms = {t for t, _ in b.sorted_postings()}
    for t in [keys.term(("_event_time",), keys.TIMESTAMP, 7), keys.term(("x", "_event_time"), keys.INT, 8),
              keys.term(("_event_time",), keys.INT, 9), keys.term(("_event_time",), keys.FLOAT, 1.5),
              keys.term(("_event_time",), keys.FLOAT, 100.0), keys.term(("_event_time",), keys.STRING, "10"),
              keys.term(("_event_time",), keys.TIMESTAMP, keys.INT_MIN), keys.term(("_event_time",), keys.NULL),
              keys.term(("a", "_event_time"), keys.INT, 11), keys.term(("_event_time",), keys.TIMESTAMP, 0)]:
        assert t in terms, keys.split_term(t)
    assert keys.term(("_event_time",), keys.TIMESTAMP, 9) not in terms
    assert keys.term(("_event_time",), keys.INT, 7) not in terms
    ck = keys.column_key(("_event_time",), keys.TIMESTAMP)
    offs, vals = b.column(ck, 100)
    assert offs.tolist() == [0, 5, 8] and pyvalues(vals) == [7, keys.INT_MIN, 0]
    assert vals.type == pa.timestamp("us", tz="UTC")


@pytest.mark.parametrize("impl", IMPLS)
def test_offsets_and_postings_limit(impl):
    b = impl()
    for i in range(10):
        assert b.add_json([orjson.dumps({"k": i % 3, "same": [1, 1, 1]})]) == ([i], [])
    assert b.n_rows == 10
    t0 = keys.term(("k",), keys.INT, 0)
    assert b.postings(t0, 10).tolist() == [0, 3, 6, 9]
    assert b.postings(t0, 9).tolist() == [0, 3, 6]
    assert b.postings(t0, 4).tolist() == [0, 3]
    assert b.postings(t0, 0).tolist() == []
    assert b.postings(t0, -5).tolist() == []
    assert b.postings(t0, -(2**70)).tolist() == []
    assert b.postings(t0, 2**40).tolist() == [0, 3, 6, 9]
    assert b.postings(t0, 2**70).tolist() == [0, 3, 6, 9]
    assert b.postings(keys.term(("same",), keys.INT, 1), 100).tolist() == list(range(10))
    assert b.postings(keys.term(("k",), keys.INT, 5), 100).tolist() == []
    assert b.postings(b"", 100).tolist() == []
    out = b.postings(t0, 10)
    out.append(99)  # a new array each time
    assert b.postings(t0, 10).tolist() == [0, 3, 6, 9]
    # A batch: offsets continue, refused documents take none.
    assert b.add_json([b"{}", b"[]", b'{"k":0}', b"", b"{}"])[0] == [10, -1, 11, -1, 12]
    assert b.postings(t0, 12).tolist() == [0, 3, 6, 9, 11]


ERRORS = [
    (b"[1]", "a document must be a JSON object, not an array", "$"),
    (b'{"a": [1, {"b": NaN}]}', "invalid JSON at byte 16: NaN and Infinity are not JSON numbers", "$"),
    (b'{"a": -1e999}', "non-finite number -inf (JSON has no NaN or Infinity)", "$.a"),
    (b'{"a b": {"c": 18446744073709551616}}', "integer outside the signed 64-bit range", '$["a b"].c'),
    (b'{"x": [[-9223372036854775809]]}', "integer outside the signed 64-bit range", "$.x[0][0]"),
    (b'{"a": {1: 2}}', "invalid JSON at byte 7: expected a string key", "$"),
    (b'{"a": ["ok", "\\ud800"]}', "string is not valid UTF-8 (lone surrogate)", "$.a[1]"),
    (b'{"\xc3\xa9": {"\\u0000": {"\\udfff": 1}}}', "key is not valid UTF-8 (lone surrogate)", '$["é"]["\\u0000"]'),
    (b'{"a": {"b": {"c": {"d": 1}}}}', "nesting deeper than 3 levels", "$.a.b.c"),
    (b'{"a": {"b": [[1]]}}', "nesting deeper than 3 levels", "$.a.b[0]"),
    (b'{"a": [[[1]]]}', "nesting deeper than 3 levels", "$.a[0][0]"),
    (b'{"a": 1} {}', "invalid JSON at byte 9: unexpected content after the document", "$"),
    (b'{"a": "\xff"}', "invalid JSON at byte 7: invalid UTF-8 in a string", "$"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("raw,message,path", ERRORS, ids=[f"error{i}" for i in range(len(ERRORS))])
def test_errors(impl, raw, message, path):
    b = impl(max_depth=3)
    b.add_json([b'{"a":1}'])
    offsets, errors = b.add_json([raw])
    assert offsets == [-1] and len(errors) == 1
    i, e = errors[0]
    assert (i, e.message, e.path, str(e)) == (0, message, path, f"{message} (at {path})")
    assert isinstance(e, SchemaError) and isinstance(e, ValueError)
    assert b.n_rows == 1


@pytest.mark.parametrize("impl", IMPLS)
def test_max_depth_boundaries(impl):
    b = impl(max_depth=3)
    assert b.max_depth == 3
    ok = [b'{"a":{"b":{"c":1}}}', b'{"a":[[1]]}', b'{"a":[{"b":1}]}', b'{"a":{"b":[]}}']
    assert b.add_json(ok) == ([0, 1, 2, 3], [])
    offsets, [(i, e)] = b.add_json([b'{"a":{"b":{"c":[]}}}'])
    assert offsets == [-1] and (e.message, e.path) == ("nesting deeper than 3 levels", "$.a.b.c")
    assert b.n_rows == 4
    for depth, doc, path in [(0, b"{}", "$"), (0, b'{"a":1}', "$"), (1, b'{"a":{}}', "$.a"), (1, b'{"a":[]}', "$.a")]:
        offsets, [(_, e)] = impl(max_depth=depth).add_json([doc])
        assert (offsets, e.message, e.path) == ([-1], f"nesting deeper than {depth} levels", path)
    assert impl(max_depth=1).add_json([b'{"a":1,"b":"x"}']) == ([0], [])


@pytest.mark.parametrize("impl", IMPLS)
def test_refused_documents_change_nothing(impl):
    good = orjson.dumps({"id": "a", "n": 1, "o": {"s": "x"}, "arr": [1, 2]})
    b, expected = impl(), impl()
    b.add_json([good])
    expected.add_json([good])
    bad = [b'{"id": "b", "n": 1, "new": {"deep": ["fresh", 3.5]}, "arr": [9, {"z": NaN}]}',
           b'{"id": "c", "new2": {"x": 1}, "new2": 2}', b'{"id": "d", "arr": [1, 2], "n": 99999999999999999999}',
           b'{"fresh": "' + "é".encode() * 100 + b'", "x": "\\udc00"}', b'{"id": "e", "o": {"s": "y"} ']
    offsets, errors = b.add_json(bad)
    assert offsets == [-1] * len(bad) and len(errors) == len(bad)
    assert snapshot(b) == snapshot(expected)
    offsets, [(i, e)] = b.add_json([good, bad[0], good])
    assert (offsets, i, str(e)) == ([1, -1, 2], 1, str(errors[0][1]))
    expected.add_json([good, good])
    assert snapshot(b) == snapshot(expected)


@pytest.mark.parametrize("impl", IMPLS)
def test_row_bytes(impl):
    b = impl()
    docs = [b'{}', b' {"a" : 1}\n', b'{"s":"\\u00e9\xc3\xa9\\n"}', b'{"x":[1,2]}' + b" " * 1000,
            orjson.dumps({"big": "z" * 100_000}), b'\t{"e":"\xf0\x9f\x98\x80"}\r\n']
    offsets, _ = b.add_json([docs[0], b"bad", *docs[1:]])
    assert offsets == [0, -1, 1, 2, 3, 4, 5]
    assert [b.row(i) for i in range(b.n_rows)] == docs
    assert all(type(b.row(i)) is bytes for i in range(b.n_rows))
    for bad in (6, 100, 2**40):
        with pytest.raises(IndexError, match=f"row {bad} is not in this mutable segment"):
            b.row(bad)


@pytest.mark.parametrize("impl", IMPLS)
def test_odd_arguments(impl):
    b = impl()
    b.add_json([b'{"a":"x"}'])
    for batch in (["not bytes", b'{"b":1}'], [bytearray(b'{"b":1}')], [memoryview(b"{}")], [None], b"{}"):
        with pytest.raises(TypeError, match="add_json takes a list of bytes"):
            b.add_json(batch)
    assert b.add_json([]) == ([], [])
    assert b.add_json((b'{"b":2}',)) == ([1], [])
    with pytest.raises(TypeError):
        b.add_json(None)
    # Not a term: refused or found in no row, as long as nothing breaks.
    for term in ("a\x00\x00\x05x\x00\x00", [b"unhashable"], 5, None):
        r = outcome(b.postings, term, 10)
        assert r[0] == "ok" and r[1].tolist() == [] or r[1] is TypeError, r
    for ck in ("a\x00\x00\x05", [b"unhashable"], None):
        for call in (b.column_terms, lambda c: b.column_size(c, 10), lambda c: b.column(c, 10)[0].tolist()):
            r = outcome(call, ck)
            assert r in (("ok", []), ("ok", 0)) or r[1] is TypeError, r
    for lim in (1.5, "1", None):
        for call in (lambda: b.postings(keys.term(("a",), keys.STRING, "x"), lim),
                     lambda: b.column(keys.column_key(("a",), keys.STRING), lim),
                     lambda: b.column_size(keys.column_key(("a",), keys.STRING), lim)):
            with pytest.raises(TypeError):
                call()
    assert b.postings(keys.term(("a",), keys.STRING, "x"), True).tolist() == [0]  # bool is an int


@needs_ext
def test_a_batch_with_a_non_bytes_item_adds_nothing():
    # The compiled builder checks the whole list before indexing; so must the reference.
    ref, cy, _ = run_both(64, [[b'{"a":1}']])
    for b in (ref, cy):
        with pytest.raises(TypeError, match="add_json takes a list of bytes, not of str"):
            b.add_json([b'{"b":2}', "x"])
    assert snapshot(cy) == snapshot(ref)
    assert cy.n_rows == ref.n_rows == 1


@needs_ext
def test_row_publish_and_limits_of_odd_numbers():
    # Both builders say the same about rows and counts that cannot be.
    ref, cy, _ = run_both(64, [[b'{"a":1}', b"{}"]])
    for call in (lambda b: b.row(-1), lambda b: b.row(2**64), lambda b: b.row(2), lambda b: b.publish(-1, 0),
                 lambda b: b.publish(3, 0), lambda b: b.publish(1, -1)):
        assert outcome(call, cy)[:2] == outcome(call, ref)[:2]
    assert cy.published == ref.published


@pytest.mark.parametrize("impl", IMPLS)
def test_publish(impl):
    b = impl(base=5)
    assert (b.published, b.base, b.path, b.max_depth) == ((0, 0), 5, None, 64)
    b.add_json([b"{}"] * 3)
    b.publish(2, 10)
    assert b.published == (2, 10) and b.n_rows == 3  # the writer sees every row it added
    with pytest.raises(ValueError, match=r"publish\(4\) of a segment holding 3 rows"):
        b.publish(4, 11)
    assert b.published == (2, 10)
    b.publish(3, 12)
    assert b.published == (3, 12)


@pytest.mark.parametrize("impl", IMPLS)
def test_nbytes_grows_with_content(impl):
    b = impl()
    assert 0 <= b.nbytes < 1 << 20
    sizes = []
    for i in range(5):
        b.add_json([orjson.dumps({"id": f"doc-{i}", "v": i, "tags": ["x", "y"]})])
        sizes.append(b.nbytes)
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    b.add_json([b"[]", b'{"new": NaN}'])  # refused: nothing kept
    assert b.nbytes == sizes[-1]


@needs_ext
def test_compiled_nbytes_counts_what_it_holds():
    b = CySegmentBuilder()
    empty = b.nbytes
    batch = [orjson.dumps({"s": "x" * 1000, "n": 1})] * 4000  # one distinct string, kept once; each row's bytes
    b.add_json(batch)
    held = b.nbytes - empty
    assert 4000 * len(batch[0]) <= held <= 4000 * len(batch[0]) + (1 << 20)
    b2 = CySegmentBuilder()
    b2.add_json(dumps(*({"id": f"{i:0100d}"} for i in range(4000))))  # 4000 new terms of 100 bytes
    assert b2.nbytes - empty >= 4000 * (100 + 109)


@pytest.mark.parametrize("impl", IMPLS)
def test_keys_and_strings_with_nul_bytes(impl):
    b = impl()
    b.add_json([b'{"a\\u0000b": "c\\u0000", "a": {"\\u0000b": 1}}'])
    terms = [t for t, _ in b.sorted_postings()]
    assert keys.term(("a\x00b",), keys.STRING, "c\x00") in terms
    assert keys.term(("a", "\x00b"), keys.INT, 1) in terms
    assert all(keys.term(*keys.split_term(t)) == t for t in terms)


@needs_ext
def test_compiled_reads_return_fresh_arrays():
    b = CySegmentBuilder()
    b.add_json([b'{"a": [1, 2]}'])
    (t, offs), *_ = b.sorted_postings()
    offs.append(7)
    assert b.sorted_postings()[0][1].tolist() == [0]
    (ck, o, vals), *_ = b.columns()
    o.append(5)
    assert b.columns()[0][1].tolist() == [0]
    assert vals.to_pylist() == ["[1,2]"]


@needs_ext
def test_compiled_max_depth_attribute():
    b = CySegmentBuilder(max_depth=5)
    assert b.max_depth == 5
    b.max_depth = 1
    [_, [(_, e)]] = b.add_json([b'{"a": {}}'])
    assert e.message == "nesting deeper than 1 levels"
    b.max_depth = 10**30  # clamped, not an error
    assert b.max_depth == 10**30
    assert b.add_json([b'{"a": {}}']) == ([0], [])
    with pytest.raises(TypeError):
        b.max_depth = 1.5


@pytest.mark.parametrize("impl", IMPLS)
def test_postings_of_almost_terms(impl):
    b = impl()
    b.add_json([b'{"s": "a\\u0000", "e": "", "n": 255}'])
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
    extra = draw(st.lists(st.tuples(st.integers(0, max(n - 1, 0)), json_documents()), max_size=5))
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
        docs.append(orjson.dumps(d))
    for i, d in sorted(extra, key=lambda x: x[0]):
        docs.insert(i, d)
    return docs


def add_both(ref, cy, docs):
    assert added(cy, docs) == added(ref, docs)


def check_blocks(ref, cy, target):
    blocks = cy.write_blocks(target)
    assert blocks == ref.write_blocks(target)  # a reference BlockWriter fed its sorted_postings()
    assert summary(cy)["sorted_postings"] == summary(ref)["sorted_postings"]
    # Every term and posting comes back, in order.
    items = [(t, bm.to_array().tolist()) for _, blk in blocks for t, bm in CyBlocks.block_items(blk)]
    assert items == [(t, offs.tolist()) for t, offs in ref.sorted_postings()]
    return blocks


@needs_ext
@given(docs=st.lists(BATCH_ITEMS, max_size=12), targets=st.lists(TARGETS, min_size=1, max_size=3))
@_settings(25)
def test_write_blocks_same_as_reference(docs, targets):
    ref, cy = PySegmentBuilder(), CySegmentBuilder()
    add_both(ref, cy, docs)
    for target in targets:
        check_blocks(ref, cy, target)


@needs_ext
@given(docs=hot_documents(), targets=st.lists(TARGETS, min_size=1, max_size=2))
@_settings(6)
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
    docs = dumps(*({"all": 1, "half": rng.random() < 0.5, "sparse": rng.random() < 0.02, "few": i in (5, 9),
                    "runs": (i // 100) % 2 == 0} for i in range(6000)))
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
    # String runs sharing long prefixes (the sort compares them 8 bytes at a time) and one
    # prefix longer than the refinement depth.
    ref, cy = PySegmentBuilder(), CySegmentBuilder()
    long = "p" * 300
    docs = dumps(*({"id": f"ev-{i}", "n": i - 1500, "f": i / 7, "s": f"same prefix {i % 700:05d}",
                    "l": long + str(i % 40), "l2": long + "\x00" * (i % 3), "t": [i % 5, -i]}
                   for i in range(1500)))
    add_both(ref, cy, docs)
    for target in (1, 4096, 2**30):
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
    add_both(ref, cy, dumps(*reversed(docs)))
    for target in (1, 64, 16384):
        check_blocks(ref, cy, target)


@pytest.mark.parametrize("impl", IMPLS)
def test_write_blocks_arguments(impl):
    b = impl()
    assert b.write_blocks() == [] and b.write_blocks(1) == []
    b.add_json([b'{"a": 1}'])
    assert b.write_blocks() == b.write_blocks(16384)
    for bad, exc in [("1", TypeError), (True, TypeError), (1.0, TypeError), (None, TypeError),
                     (0, ValueError), (-5, ValueError)]:
        with pytest.raises(exc) as ei:
            b.write_blocks(bad)
        with pytest.raises(exc) as ei2:
            PyBlocks.BlockWriter(bad)
        assert str(ei.value) == str(ei2.value)
    assert b.add_json([b'{"a": 2}']) == ([1], [])  # usable afterwards


@needs_ext
def test_write_blocks_while_other_threads_run():
    # write_blocks releases the GIL: the result is the same while other threads run Python
    # code and read the same builder.
    cy = CySegmentBuilder()
    cy.add_json(dumps(*({"id": f"ev-{i}", "n": i % 1000, "s": "x" if i % 3 else "y"} for i in range(20_000))))
    expected = cy.write_blocks(16384)
    assert expected == blocks_of(cy.sorted_postings(), 16384)
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


# ---------------------------------------------------------------- columns


@pytest.mark.parametrize("impl", IMPLS)
def test_column(impl):
    b = impl()
    for i in range(6):
        b.add_json([orjson.dumps({"n": i, "s": "x"} if i % 2 else {"s": "y", "arr": [1, {"in": i}]})])
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
                         (keys.column_key(("nope",), keys.TIMESTAMP), pa.timestamp("us", tz="UTC")),
                         (keys.column_key(("arr",), keys.OBJECT), pa.null()),
                         (b"nope", pa.null()), (b"", pa.null())]:
        offs, vals = b.column(unknown, 10)
        assert offs == array("I") and len(vals) == 0 and vals.type == typ, unknown
        assert b.column_size(unknown, 10) == 0
    with pytest.raises(TypeError):
        b.column(ck, 1.5)
    for ck2, o, v in b.columns():
        o2, v2 = b.column(ck2, b.n_rows)
        assert o2 == o and v2.equals(v)


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_and_null_columns(impl):
    b = impl()
    b.add_json([b'{"z": null, "o": {}, "a": [], "s": ""}', b'{"z": null}', b'{"o": {"p": null}}'])
    cols = {ck: (o.tolist(), vals) for ck, o, vals in b.columns()}
    assert sorted(cols) == sorted([keys.column_key(("z",), keys.NULL), keys.column_key(("a",), keys.ARRAY),
                                   keys.column_key(("s",), keys.STRING), keys.column_key(("o", "p"), keys.NULL)])
    o, vals = cols[keys.column_key(("z",), keys.NULL)]
    assert o == [0, 1] and vals.type == pa.bool_() and vals.to_pylist() == [True, True]
    assert cols[keys.column_key(("a",), keys.ARRAY)][1].to_pylist() == ["[]"]
    assert cols[keys.column_key(("s",), keys.STRING)][1].to_pylist() == [""]
    # An object is a marker term, never a column.
    assert b.column_size(keys.column_key(("o",), keys.OBJECT), 10) == 0
    assert b.postings(keys.term(("o",), keys.OBJECT), 10).tolist() == [0, 2]


@pytest.mark.parametrize("impl", IMPLS)
def test_column_types_and_copies(impl):
    # Every value type, through buffer growth (strings past the first slice sizes, bools past
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
        b.add_json([orjson.dumps(doc)])
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


# ---------------------------------------------------------------- the rows' file (recovery)


def _tail_rows_of(builder_cls):
    import rtindex._py.segment as py

    if builder_cls is PySegmentBuilder:
        return py.tail_rows
    from rtindex._ext._segment import tail_rows

    return tail_rows


@pytest.mark.parametrize("builder_cls", IMPLS)
def test_tail_rows_reads_the_rows_written_published_or_not(tmp_path, builder_cls):
    path = str(tmp_path / "t.rtt")
    b = builder_cls(path, 100)
    raws = dumps(*({"i": i, "s": "é" * (i % 7)} for i in range(700)))
    b.add_json(raws[:300])
    b.publish(300, 0)
    b.add_json(raws[300:] + [b"[1]"])  # the refused one is not a row
    tail_rows = _tail_rows_of(builder_cls)
    assert tail_rows(path, 0, 700) == raws  # published or not
    assert tail_rows(path, 650, 700) == raws[650:] and tail_rows(path, 5, 5) == []
    with pytest.raises(ValueError, match="row 700"):
        tail_rows(path, 690, 701)
    b.close()
    with open(path, "r+b") as f:  # cut short: the later rows are gone
        f.truncate(os.path.getsize(path) // 3 if builder_cls is PySegmentBuilder else 4096)
    with pytest.raises(ValueError, match="not in the file|past the end"):
        tail_rows(path, 0, 700)
    with pytest.raises(ValueError):
        tail_rows(str(tmp_path / "t.rtt"), 3, 2)


# ---------------------------------------------------------------- identify_texts (ingest)

ID_VALUES = st.one_of(st.none(), STRINGS, INTS, st.booleans(), st.just(1.5), st.just("a\\b"), st.just("x" * 1025))


@st.composite
def identified_texts(draw):
    """A document's text as ingest gets it: maybe an ``_id`` of any kind, maybe an
    ``_event_time``, by any serializer, maybe padded with whitespace; or hostile text."""
    doc = draw(documents())
    if draw(st.booleans()):
        doc = {"_id": draw(ID_VALUES), **doc}
    raw = draw(st.sampled_from(sorted(SERIALIZERS)))
    text = SERIALIZERS[raw](doc) if raw != "orjson" or all(isinstance(k, str) for k in doc) else orjson.dumps(doc)
    pad = draw(st.sampled_from([b"", b" ", b"\n", b" \t\r\n "]))
    return draw(st.one_of(st.just(pad + text + pad), HOSTILE_TEXTS, MUTATED))


@needs_ext
@_settings(300)
@given(st.lists(identified_texts(), min_size=1, max_size=6), st.integers(0, 3_000))
@example([b' {"a": 1} ', b'{}', b'{"_id": "x", "_event_time": 5}', b'{"_id": 7}'], 2_000)
def test_identify_texts_matches_the_reference(texts, max_bytes):
    import rtindex._ext._segment as cy
    import rtindex._py.segment as py

    def new_ids(n):  # the same each time: the scans may differ on which texts take one
        return ["0123456789abcdef0123456789abcdef"] * n

    now, lo, hi = 1_700_000_000_000_000, 315_532_800_000_000, 32_503_680_000_000_000
    got = cy.identify_texts(texts, now, max_bytes, lo, hi, new_ids)
    want = py.identify_texts(texts, now, max_bytes, lo, hi, new_ids)
    for text, g, w in zip(texts, got, want):
        if w is None or g is None:  # the reference parses: it may take what the scan leaves to the parse
            continue
        assert g == w, text
        if len(g) == 4:
            assert orjson.loads(g[2])["_id"] == g[0]  # what is stored says the _id it was given


# -- top_rewrite: an ingest transformation's scan of a document's top level ------------
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=json_documents(), picks=st.lists(st.integers(0, 9), max_size=6, unique=True), n_drop=st.integers(0, 6),
       extra=st.sampled_from([(), (b"absent",), (b"_id",)]), renaming=st.lists(st.booleans(), max_size=7),
       reads=st.lists(st.integers(0, 6), max_size=4))
def test_top_rewrite_keeps_renames_and_reads_what_a_parse_reads(raw, picks, n_drop, extra, renaming, reads):
    """Compiled against the parse: the text kept is the members not dropped, plus each
    renamed one that is not null under its new name; the values read are the keys' values
    (null for one absent); None only for a key written with an escape."""
    from rtindex._ext._segment import top_rewrite
    from rtindex._py.segment import top_rewrite as reference

    doc = orjson.loads(raw)
    names = list(doc)
    keys_ = tuple(dict.fromkeys([orjson.dumps(names[i])[1:-1] for i in picks if i < len(names)] + list(extra)))
    n_drop = min(n_drop, len(keys_))
    renames = tuple(b'"renamed%d":' % k if k < len(renaming) and renaming[k] else None for k in range(len(keys_)))
    reads = tuple(k for k in reads if k < len(keys_))
    got = top_rewrite(raw, keys_, n_drop, renames, reads)
    if got is None:
        assert b"\\" in raw
        return
    kept, values = got
    named = [orjson.loads(b'"' + k + b'"') for k in keys_]
    want = {k: v for k, v in doc.items() if k not in named[:n_drop]}
    want.update({f"renamed{k}": doc[named[k]] for k in range(len(keys_))
                 if renames[k] is not None and doc.get(named[k]) is not None})
    assert orjson.loads(b"{" + kept + b"}") == want
    assert orjson.loads(values) == [doc.get(named[k]) for k in reads]
    ref = reference(raw, keys_, n_drop, renames, reads)  # (None for text it cannot place: see its doc)
    assert ref is None or (orjson.loads(b"{" + ref[0] + b"}") == want and orjson.loads(ref[1]) == orjson.loads(values))


@pytest.mark.parametrize("raw", [b'{"a":1,"a":2}', b'{"a":1} x', b"[1]", b'{"a" 1}', b'{"a":1,}', b'{"a":1', b"",
                                 b'{"\\u0061":1}'])
def test_top_rewrite_leaves_what_it_cannot_tell_to_the_parse(raw):
    from rtindex._ext._segment import top_rewrite

    assert top_rewrite(raw, (b"a",), 0, (None,), ()) is None
    got = top_rewrite(b' {"b": [1, {"c": "}"}], "a": "q\\"", "n": null } ', (b"b", b"a", b"n", b"z"), 1,
                      (b'"c":', None, b'"m":', None), (1, 3, 0))
    assert got == (b'"c":[1, {"c": "}"}],"a": "q\\"","n": null', b'["q\\"",null,[1, {"c": "}"}]]')


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.one_of(MUTATED, HOSTILE_TEXTS, NUMBER_TEXTS.map(str.encode),
                       json_documents().map(lambda raw: raw)))
def test_top_rewrite_drops_only_values_a_parse_reads(value):
    """A dropped value is checked against JSON's grammar: the text is left to the parse
    (None) exactly when orjson would refuse the value."""
    from rtindex._ext._segment import top_rewrite

    if isinstance(value, str):
        value = value.encode("utf-8", "surrogatepass")
    raw = b'{"keep": 1, "gone": ' + value + b"}"
    try:
        orjson.loads(value)
        valid = True
    except orjson.JSONDecodeError:
        valid = False
    got = top_rewrite(raw, (b"gone",), 1, (None,), ())
    if not valid:
        assert got is None, value
    elif value.count(b"[") + value.count(b"{") < 500 and len(value) < 500:  # (else the parse may decide)
        assert got is not None and got[0] == b'"keep": 1', value
