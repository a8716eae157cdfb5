"""Stateful test: a real Collection against a model ``dict[_id -> document]``.

Hypothesis drives a :class:`RuleBasedStateMachine` through ingests (upserts from a small id
pool, in every input format), good and failing JSON Patches, deletes, flushes, batches with
bad documents between good ones, snapshots and reopens, with tiny ``seal_rows`` and
``merge_factor`` so that background sealing and merging happen all the time. After every
step the collection must agree with the model: ``len``, ``get`` of every id of the pool,
and index lookups (term, range, prefix, exists, missing, set algebra, column scans) on a
fresh snapshot, checked against a brute-force evaluator that implements the documented
semantics (docs/architecture.md, rtindex/snapshot.py) over the model. Snapshots kept from
earlier steps must keep answering from the model of their moment until the database closes.

Scale with ``HYPOTHESIS_PROFILE`` (dev, ci, thorough); timings at the bottom of the file.
"""

from __future__ import annotations

import calendar
import copy
import math
import os
import random
import shutil
import tempfile
import warnings

import orjson
import pytest
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import rtindex
from rtindex import ClosedError, IngestWarning, NotFoundError, SchemaError
from rtindex.documents import EVENT_TIME_MAX_US, EVENT_TIME_MIN_US

# ---------------------------------------------------------------------------- generation

FIELDS = ("a", "b", "c")
RARE_FIELDS = ("x.y", "", "\x00")  # a dot inside a name, the empty name, a NUL in a name
ID_POOL = tuple(range(16)) + tuple(f"k{i}" for i in range(16)) + ("0", "1", "")

INTS = (0, 1, -1, 2, 3, 7, -7, 2**53, 2**53 + 1, -(2**53) - 1, 2**63 - 1, -(2**63), 10**18)
FLOATS = (0.0, -0.0, 0.5, -0.5, 1.0, -1.5, 2.0, 2.5, 3.0, 1e300, -1e300, 5e-324, -5e-324,
          2.0**53, 2.0**63, -(2.0**63), 1e18, 9007199254740993.0)
STRINGS = ("", "a", "A", "aa", "ab", "abc", "b", "a\x00", "a\x00b", "a\x01", "é", "éa",
           "\U0001F600", "1", "\xff", "\uffff")
PATHS = ("a", "b", "c", "a.a", "a.b", "a.c", "b.a", "b.b", "c.c", "a.a.a", "b.b.b", "c.a.b",
         "_id", "_event_time", "z", "a.z", ("x.y",), ("",), ("\x00",), ("a", "x.y"), "x.y")
TYPE_NAMES = ("null", "bool", "int", "float", "string", "timestamp", "array", "object")
NUMERIC = ("int", "float", "timestamp")

# (what the document says, the integer microseconds the stored document must hold)
ISO_EVENT_TIMES = (
    ("1970-01-01T00:00:01", 1_000_000),
    ("2024-02-29T12:00:00+01:00", calendar.timegm((2024, 2, 29, 11, 0, 0)) * 1_000_000),
    ("1969-12-31T23:59:59.5", -500_000),
)

scalars = st.one_of(
    st.sampled_from(INTS), st.integers(-4, 4),
    st.sampled_from(FLOATS), st.floats(-4, 4, allow_nan=False, allow_infinity=False),
    st.sampled_from(STRINGS), st.text(alphabet="ab\x00é", max_size=3),
    st.booleans(), st.none(),
)
field_names = st.one_of(st.sampled_from(FIELDS), st.sampled_from(FIELDS), st.sampled_from(FIELDS),
                        st.sampled_from(RARE_FIELDS))


def _nested(depth: int):
    v = scalars
    for _ in range(depth):
        v = st.one_of(scalars, st.lists(v, max_size=3), st.dictionaries(field_names, v, max_size=3))
    return v


VALUES = _nested(3)  # at most 3 containers below the root: documents are <= 4 levels deep
# an integer _event_time is microseconds from 1980 to 3000 (another one is a bad document)
ET_MIN, ET_MAX = EVENT_TIME_MIN_US, EVENT_TIME_MAX_US - 1
event_times = st.one_of(
    st.integers(ET_MIN, ET_MIN + 3).map(lambda t: (t, t)),
    st.sampled_from((ET_MIN, 1_700_000_000_000_000, ET_MAX)).map(lambda t: (t, t)),
    st.sampled_from(ISO_EVENT_TIMES),
)


@st.composite
def documents(draw, ids=st.sampled_from(ID_POOL)):
    """(input document, the document get() must return)."""
    et_in, et_stored = draw(event_times)
    doc = {"_id": draw(ids), "_event_time": et_in}
    doc.update(draw(st.dictionaries(field_names, VALUES, max_size=4)))
    return doc, {**doc, "_event_time": et_stored}


def nest(k: int, kind: str) -> object:
    """A value of exactly ``k`` nested containers (dicts or lists) around a scalar."""
    v: object = 1
    for _ in range(k):
        v = {"a": v} if kind == "dict" else [v]
    return v


def deep_path(max_depth: int, kind: str) -> str:
    """Where the indexer reports nesting of max_depth + 1 levels (root = level 1) at field a."""
    if kind == "dict":
        return "$" + ".a" * max_depth
    return "$.a" + "[0]" * (max_depth - 1)


# ------------------------------------------------------------------------ brute force


def canon(x):
    """A strict comparison form: True != 1 != 1.0, -0.0 != 0.0, key order ignored."""
    if x is None:
        return ("n",)
    if isinstance(x, bool):
        return ("b", x)
    if isinstance(x, int):
        return ("i", x)
    if isinstance(x, float):
        return ("f", x.hex())
    if isinstance(x, str):
        return ("s", x)
    if isinstance(x, (list, tuple)):
        return ("l", tuple(canon(i) for i in x))
    if isinstance(x, dict):
        return ("d", tuple(sorted((k, canon(v)) for k, v in x.items())))
    raise TypeError(type(x))


def idkey(i):
    """Sort/compare key of an _id: 1 and "1" are different ids."""
    return ("s", i) if isinstance(i, str) else ("i", i)


def as_path(path) -> tuple:
    return tuple(path.split(".")) if isinstance(path, str) else tuple(path)


def flatten(doc: dict) -> list[tuple[tuple, str, object]]:
    """Every (path, type name, value) the documented flattening indexes for ``doc``."""
    out: list = []

    def walk(v, path, top):
        if v is None:
            out.append((path, "null", None))
        elif isinstance(v, bool):
            out.append((path, "bool", v))
        elif isinstance(v, int):
            out.append((path, "timestamp" if top and path == ("_event_time",) else "int", v))
        elif isinstance(v, float):
            out.append((path, "float", v))
        elif isinstance(v, str):
            out.append((path, "string", v))
        elif isinstance(v, dict):
            out.append((path, "object", None))
            for k, x in v.items():
                walk(x, path + (k,), False)
        elif isinstance(v, list):
            out.append((path, "array", None))
            for x in v:
                walk(x, path, False)
        else:
            raise TypeError(type(v))

    for k, v in doc.items():
        walk(v, (k,), True)
    return out


def columns_of(doc: dict) -> dict[tuple[tuple, str], object]:
    """(path, type) -> column value for leaves (and whole arrays) outside arrays."""
    out: dict = {}

    def walk(v, path, top):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, path + (k,), False)
        elif isinstance(v, list):
            out[(path, "array")] = v
        elif v is None:
            out[(path, "null")] = True
        elif isinstance(v, bool):
            out[(path, "bool")] = v
        elif isinstance(v, int):
            out[(path, "timestamp" if top and path == ("_event_time",) else "int")] = v
        elif isinstance(v, float):
            out[(path, "float")] = v + 0.0
        else:
            out[(path, "string")] = v

    for k, v in doc.items():
        walk(v, (k,), True)
    return out


def _in_range(v, lo, hi, lo_inc, hi_inc) -> bool:
    if lo is not None and not (v > lo or (lo_inc and v == lo)):
        return False
    if hi is not None and not (v < hi or (hi_inc and v == hi)):
        return False
    return True


def _domain(b):
    if isinstance(b, bool):
        return ("bool",)
    if isinstance(b, str):
        return ("string",)
    return NUMERIC


def matches(entries, q) -> bool:
    """Brute-force evaluation of query ``q`` on one flattened document."""
    kind, path = q[0], as_path(q[1])
    if kind == "exists":
        types = q[2]
        return any(p == path and (types is None or t in types) for p, t, _ in entries)
    if kind == "missing":
        return not any(p == path for p, _, _ in entries)
    if kind == "prefix":
        return any(p == path and t == "string" and v.startswith(q[2]) for p, t, v in entries)
    if kind == "term":
        value = q[2]
        for p, t, v in entries:
            if p != path:
                continue
            if value is None:
                if t == "null":
                    return True
            elif isinstance(value, bool):
                if t == "bool" and v is value:
                    return True
            elif isinstance(value, str):
                if t == "string" and v == value:
                    return True
            elif t in NUMERIC and v == value:  # exact across int and float (nan, inf: never)
                return True
        return False
    if kind == "range":
        lo, hi, lo_inc, hi_inc = q[2:]
        types = _domain(lo if lo is not None else hi)
        return any(p == path and t in types and _in_range(v, lo, hi, lo_inc, hi_inc) for p, t, v in entries)
    raise AssertionError(kind)


def run(s, q):
    kind, path = q[0], q[1]
    if kind == "term":
        return s.term(path, q[2])
    if kind == "range":
        lo, hi, lo_inc, hi_inc = q[2:]
        return s.range(path, lo, hi, lo_inclusive=lo_inc, hi_inclusive=hi_inc)
    if kind == "prefix":
        return s.prefix(path, q[2])
    if kind == "exists":
        return s.exists(path) if q[2] is None else s.exists(path, types=q[2])
    if kind == "missing":
        return s.missing(path)
    raise AssertionError(kind)


# ------------------------------------------------------------------------ queries

NUMBER_BOUNDS = INTS + FLOATS + (math.inf, -math.inf, math.nan, -2, -1, 0, 1, 2, 3, 1.5, -0.25)
bool_ = st.booleans()


def _range_q(path, bounds):
    return st.tuples(st.just("range"), st.just(path), bounds, bounds, bool_, bool_).filter(
        lambda q: q[2] is not None or q[3] is not None)


@st.composite
def queries(draw):
    path = draw(st.sampled_from(PATHS))
    kind = draw(st.sampled_from(("term", "term", "range", "range", "prefix", "exists", "missing")))
    if kind == "term":
        return ("term", path, draw(st.one_of(scalars, st.sampled_from((math.nan, math.inf)))))
    if kind == "prefix":
        return ("prefix", path, draw(st.one_of(st.sampled_from(STRINGS), st.text("ab\x00é", max_size=2))))
    if kind == "exists":
        types = draw(st.none() | st.lists(st.sampled_from(TYPE_NAMES), min_size=1, max_size=3, unique=True))
        return ("exists", path, types)
    if kind == "missing":
        return ("missing", path)
    dom = draw(st.sampled_from(("number", "number", "string", "bool")))
    if dom == "number":
        bound = st.none() | st.sampled_from(NUMBER_BOUNDS) | st.integers(-5, 5) | st.floats(-5, 5, allow_nan=False)
    elif dom == "string":
        bound = st.none() | st.sampled_from(STRINGS)
    else:
        bound = st.none() | st.booleans()
    return draw(_range_q(path, bound))


def random_query(rng: random.Random, model: dict, flat: dict):
    """A query biased to hit: paths and values taken from the model's own documents."""
    entries = flat[rng.choice(list(flat))] if flat and rng.random() < 0.7 else []
    if entries:
        path, typ, value = rng.choice(entries)
        if all("." not in p for p in path) and rng.random() < 0.7:
            path = ".".join(path)  # else a tuple: the only way to name "x.y"
    else:
        path, typ, value = rng.choice(PATHS), None, rng.choice(STRINGS + INTS + FLOATS + (None, True, False))
    kind = rng.choice(("term", "term", "range", "range", "prefix", "exists", "missing"))
    if kind == "term":
        if typ in ("array", "object"):
            value = rng.choice((None, 1, "a", True))
        return ("term", path, value)
    if kind == "prefix":
        if isinstance(value, str) and value:
            return ("prefix", path, value[: rng.randrange(len(value) + 1)])
        return ("prefix", path, rng.choice(STRINGS))
    if kind == "exists":
        types = None if rng.random() < 0.6 else rng.sample(TYPE_NAMES, rng.randrange(1, 4))
        return ("exists", path, types)
    if kind == "missing":
        return ("missing", path)
    if isinstance(value, str):
        pool = list(STRINGS) + [value]
    elif isinstance(value, bool):
        pool = [True, False]
    elif isinstance(value, (int, float)):
        pool = list(NUMBER_BOUNDS) + [value, value, float(value), value + 1, value - 1]
    else:
        pool = list(NUMBER_BOUNDS)
    lo, hi = rng.choice(pool + [None]), rng.choice(pool + [None])
    if lo is None and hi is None:
        lo = rng.choice(pool)
    if rng.random() < 0.5 and lo is not None and hi is not None and not isinstance(lo, str) and lo > hi:
        lo, hi = hi, lo
    if isinstance(lo, str) and isinstance(hi, str) and rng.random() < 0.5 and lo > hi:
        lo, hi = hi, lo
    return ("range", path, lo, hi, rng.random() < 0.5, rng.random() < 0.5)


def check_query(s, model: dict, flat: dict, q) -> set:
    """Run ``q`` on snapshot ``s``, compare with the brute force over ``model``; (ids, postings)."""
    postings = run(s, q)
    docs = s.fetch(postings)
    got = [idkey(d["_id"]) for d in docs]
    want = sorted(idkey(i) for i in model if matches(flat[idkey(i)], q))
    assert sorted(got) == want, f"query {q!r}"
    assert len(set(got)) == len(got), f"a document twice in {q!r}"
    assert len(postings) == len(docs), f"len(postings) != fetched rows for {q!r}"
    assert bool(postings) == bool(docs)
    for d in docs:  # the current version of each document, not an older row
        assert canon(d) == canon(model[d["_id"]]), f"query {q!r} fetched a stale or wrong row"
    return set(got), postings


def check_snapshot(s, model: dict, rng: random.Random, n_queries: int) -> None:
    flat = {idkey(i): flatten(d) for i, d in model.items()}
    assert s.count() == len(model)
    everything = s.all()
    assert len(everything) == len(model)
    docs = s.fetch(everything)
    assert sorted((idkey(d["_id"]), canon(d)) for d in docs) == sorted(
        (idkey(i), canon(d)) for i, d in model.items())
    for _ in range(n_queries):
        check_query(s, model, flat, random_query(rng, model, flat))


def check_scan(s, model: dict, specs) -> None:
    """Column scan: one row per visible document, the value of each (path, type) or null."""
    table = s.scan(specs)
    assert table.num_rows == len(model)
    rows = s.all().row_ids()
    docs = s.fetch(s.all())
    by_rid = {rid: d for rid, d in zip(rows, docs)}
    shards = table.column("_shard").to_pylist()
    rids = table.column("_row_id").to_pylist()
    assert sorted(zip(shards, rids)) == sorted(by_rid)
    for (path, typ) in specs:
        name = f"{'.'.join(as_path(path))}:{typ}"
        col = table.column(name)
        if typ == "timestamp":
            col = col.cast("int64")
        values = col.to_pylist()
        for shard, rid, got in zip(shards, rids, values):
            doc = model[by_rid[(shard, rid)]["_id"]]
            want = columns_of(doc).get((as_path(path), typ))
            if typ == "array" and got is not None:
                got = orjson.loads(got)
            assert canon(got) == canon(want), f"scan {name} of _id {doc['_id']!r}"


# ------------------------------------------------------------------------ the machine

MAX_DOCUMENT_BYTES = 1 << 14


class CollectionMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.db = None
        self.dir = None
        self.model: dict = {}
        self.writes = 0  # write steps since the last open
        self.snaps: list = []  # (snapshot, model copy at that moment)

    # -- setup / teardown --------------------------------------------------
    @initialize(seal_rows=st.integers(2, 20), merge_factor=st.integers(2, 4), shards=st.integers(1, 3),
                max_depth=st.integers(4, 8), seed=st.integers(0, 2**32 - 1))
    def setup(self, seal_rows, merge_factor, shards, max_depth, seed):
        self.dir = tempfile.mkdtemp(prefix="rtindex-state-")
        self.opts = dict(seal_rows=seal_rows, merge_factor=merge_factor, max_depth=max_depth,
                         max_document_bytes=MAX_DOCUMENT_BYTES, block_cache_bytes=8 << 20)
        self.max_depth = max_depth
        # the invariants' queries come from a plain Random: they draw nothing from hypothesis, so a
        # failure that depends on background timing is reported as Flaky with its traceback
        # rather than as an inconsistent data generation
        self.rng = random.Random(seed)
        self.db = rtindex.open(os.path.join(self.dir, "db"), **self.opts)
        self.coll = self.db.create_collection("c", shards=shards)
        self.n_shards = shards
        note(f"open({self.opts}), shards={shards}")

    def teardown(self):
        try:
            if self.db is not None:
                self.db.close()
        finally:
            if self.dir is not None:
                shutil.rmtree(self.dir, ignore_errors=True)

    # -- writes ------------------------------------------------------------
    def _feed(self, docs: list, fmt: str):
        if fmt == "list":
            return docs
        if fmt == "iter":
            return (d for d in docs)
        if fmt == "json":
            return orjson.dumps(docs)
        lines = [orjson.dumps(d) for d in docs]
        return b"\n".join(lines) + b"\n" if fmt == "ndjson" else b"\n".join(lines).decode()

    _formats = st.sampled_from(("list", "list", "iter", "json", "ndjson", "ndjson-str"))
    _batch_sizes = st.sampled_from((1000, 1000, 1, 3))

    def _ingest(self, batch, fmt, batch_size):
        before = [canon(d) for d, _ in batch]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stats = self.coll.ingest(self._feed([d for d, _ in batch], fmt), batch_size=batch_size)
        # JSON text of one object holding an array of objects is stored, with a note saying so
        assert all(isinstance(w.message, IngestWarning) and str(w.message) in stats.notes for w in caught), \
            [str(w.message) for w in caught]
        assert [canon(d) for d, _ in batch] == before, "ingest changed the caller's documents"
        assert stats.errors == [], stats.errors
        first_seen = list(dict.fromkeys(idkey(d["_id"]) for d, _ in batch))  # an _id twice counts once
        assert stats.n == len(first_seen)
        assert [idkey(i) for i in stats.ids] == first_seen
        for _, stored in batch:
            self.model[stored["_id"]] = stored
        self.writes += 1

    @rule(batch=st.lists(documents(), min_size=1, max_size=20), fmt=_formats, batch_size=_batch_sizes)
    def ingest(self, batch, fmt, batch_size):
        self._ingest(batch, fmt, batch_size)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), fmt=_formats, batch_size=_batch_sizes)
    def ingest_replacing(self, data, fmt, batch_size):
        """Upserts of stored ids only: every document replaces a row."""
        ids = st.sampled_from(sorted(self.model, key=idkey))
        self._ingest(data.draw(st.lists(documents(ids), min_size=1, max_size=10), label="batch"), fmt, batch_size)

    @rule(data=st.data(), fmt=st.sampled_from(("list", "json", "ndjson")))
    def ingest_with_bad_documents(self, data, fmt):
        md = self.max_depth
        good_ok = documents()
        # (document, error path) for documents that are valid JSON but not storable
        bad_common = [
            ([1, 2], "$"), (5, "$"), ("x", "$"), (None, "$"),
            ({"_id": 3, "a": nest(md, "dict")}, deep_path(md, "dict")),
            ({"_id": "k3", "a": nest(md, "list")}, deep_path(md, "list")),
            ({"_id": 4, "_event_time": ET_MIN, "b": 2**63}, "$.b"),
            ({"_id": 1.5, "a": 1}, "$._id"), ({"_id": True, "a": 1}, "$._id"),
            ({"_id": [1], "a": 1}, "$._id"), ({"_id": "x" * 1025}, "$._id"),
            ({"_id": 6, "_event_time": True}, "$._event_time"),
            ({"_id": 6, "_event_time": "yesterday"}, "$._event_time"),
            ({"_id": 7, "_event_time": 1.5}, "$._event_time"),
            ({"_id": 8, "_event_time": 2**63}, "$._event_time"),
            ({"_id": 8, "_event_time": 1_700_000_000}, "$._event_time"),  # seconds
            ({"_id": 8, "_event_time": ET_MAX + 1}, "$._event_time"), ({"_id": 8, "_event_time": 0}, "$._event_time"),
            ({"_id": 2**63, "a": 1}, "$._id"),
            ({"_id": 9, "a": "x" * (MAX_DOCUMENT_BYTES + 1)}, "$"),
        ]
        # only expressible as Python objects
        bad_python = [
            ({"_id": 10, "a": math.nan}, "$.a"), ({"_id": "k10", "c": [1.0, math.inf]}, "$.c[1]"),
            ({"_id": 11, "b": {"c": -math.inf}}, "$.b.c"), ({"_id": 12, 1: "x"}, "$"),
            ({"_id": 13, "a": "\ud800"}, "$.a"), ({"_id": 14, "a": b"bytes"}, "$.a"),
            ({"_id": 15, "a": {1, 2}}, "$.a"), ({"_id": "k1", "a": [b"x"]}, "$.a[0]"),
            ({"_id": "k2", "a": 2**64}, "$.a"), ({"_id": 5, "_event_time": ET_MIN, "b": [0, -(2**63) - 1]}, "$.b[1]"),
        ]
        pool = bad_common + (bad_python if fmt == "list" else [])
        n = data.draw(st.integers(1, 8), label="n")
        items = []  # (document or raw NDJSON line, expected (error id, path) or None, stored doc)
        for _ in range(n):
            choice = data.draw(st.sampled_from(("good", "good", "bad", "boundary")), label="kind")
            if choice == "good":
                doc, stored = data.draw(good_ok, label="good")
                items.append((doc, None, stored))
            elif choice == "boundary":  # exactly max_depth levels: accepted
                kind = data.draw(st.sampled_from(("dict", "list")), label="boundary kind")
                i = data.draw(st.sampled_from(ID_POOL), label="boundary id")
                doc = {"_id": i, "_event_time": ET_MIN, "a": nest(md - 1, kind)}
                items.append((doc, None, doc))
            else:
                doc, path = data.draw(st.sampled_from(pool), label="bad")
                eid = doc.get("_id") if isinstance(doc, dict) else None
                items.append((copy.deepcopy(doc), (eid, path), None))
        if not any(exp for _, exp, _ in items):
            doc, path = pool[0]
            items.insert(data.draw(st.integers(0, len(items)), label="at"), (doc, (None, path), None))
        if fmt == "ndjson" and len(items) == 1 and isinstance(items[0][0], list):
            # one line that is an array IS a JSON array (of non-documents): add a line
            doc, stored = data.draw(good_ok, label="good")
            items.append((doc, None, stored))
        raw_lines = {}
        if fmt == "ndjson" and data.draw(st.booleans(), label="broken line"):
            at = data.draw(st.integers(0, len(items)), label="broken at")
            items.insert(at, (None, (None, "$"), None))
            raw_lines[at] = b'{"_id": 1, "a": '
        docs = [d for d, _, _ in items]
        if fmt == "list":
            feed = docs
        elif fmt == "json":
            feed = orjson.dumps(docs)
        else:
            feed = b"\n".join(raw_lines.get(i, orjson.dumps(d)) for i, d in enumerate(docs))

        stats = self.coll.ingest(feed, errors="report")
        want_errors = [(i, exp) for i, (_, exp, _) in enumerate(items) if exp is not None]
        got_errors = [(e.index, (e.id, e.path)) for e in stats.errors]
        # NDJSON whose first line is an array (a bad document) must not swallow the good lines
        assert [i for i, _ in got_errors] == [i for i, _ in want_errors], (fmt, stats.errors)
        for (i, (gid, gpath)), (_, (wid, wpath)), e in zip(got_errors, want_errors, stats.errors):
            assert canon(gid) == canon(wid), e
            assert gpath == wpath, e
            assert e.message, e
        good = [(d, stored) for d, exp, stored in items if exp is None]
        first_seen = list(dict.fromkeys(idkey(d["_id"]) for d, _ in good))  # an _id twice counts once
        assert stats.n == len(first_seen)
        assert [idkey(i) for i in stats.ids] == first_seen
        for _, stored in good:
            self.model[stored["_id"]] = stored
        self.writes += 1

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def patch(self, data):
        doc_id = data.draw(st.sampled_from(sorted(self.model, key=idkey)), label="id")
        new = copy.deepcopy(self.model[doc_id])
        ops = []
        for _ in range(data.draw(st.integers(1, 3), label="n ops")):
            present = [k for k in new if k not in ("_id", "_event_time")]
            kinds = ["add", "event_time"] + (["replace", "remove", "test_replace"] if present else [])
            if any(isinstance(new[k], list) for k in present):
                kinds.append("append")
            if any(isinstance(new[k], dict) for k in present):
                kinds.append("add_nested")
            kind = data.draw(st.sampled_from(kinds), label="op")
            if kind == "add":
                f = data.draw(field_names, label="field")
                v = data.draw(VALUES, label="value")
                ops.append({"op": "add", "path": "/" + f, "value": v})
                new[f] = copy.deepcopy(v)
            elif kind == "replace":
                f = data.draw(st.sampled_from(present), label="field")
                v = data.draw(VALUES, label="value")
                ops.append({"op": "replace", "path": "/" + f, "value": v})
                new[f] = copy.deepcopy(v)
            elif kind == "remove":
                f = data.draw(st.sampled_from(present), label="field")
                ops.append({"op": "remove", "path": "/" + f})
                del new[f]
            elif kind == "test_replace":
                f = data.draw(st.sampled_from(present), label="field")
                v = data.draw(scalars, label="value")
                ops += [{"op": "test", "path": "/" + f, "value": copy.deepcopy(new[f])},
                        {"op": "replace", "path": "/" + f, "value": v}]
                new[f] = v
            elif kind == "append":
                f = data.draw(st.sampled_from([k for k in present if isinstance(new[k], list)]), label="field")
                v = data.draw(scalars, label="value")
                ops.append({"op": "add", "path": f"/{f}/-", "value": v})
                new[f].append(v)
            elif kind == "add_nested":
                f = data.draw(st.sampled_from([k for k in present if isinstance(new[k], dict)]), label="field")
                g = data.draw(st.sampled_from(FIELDS), label="subfield")
                v = data.draw(scalars, label="value")
                ops.append({"op": "add", "path": f"/{f}/{g}", "value": v})
                new[f][g] = v
            else:  # _event_time: set an int, or remove it
                if "_event_time" in new and data.draw(st.booleans(), label="remove event time"):
                    ops.append({"op": "remove", "path": "/_event_time"})
                    del new["_event_time"]
                else:
                    t = data.draw(st.integers(ET_MAX - 5, ET_MAX), label="event time")
                    op = "replace" if "_event_time" in new else "add"
                    ops.append({"op": op, "path": "/_event_time", "value": t})
                    new["_event_time"] = t
        if "_event_time" not in new:  # removing _event_time keeps the one stored before the patch
            new["_event_time"] = self.model[doc_id]["_event_time"]
        note(f"patch({doc_id!r}, {ops!r})")
        result = self.coll.patch(doc_id, ops)
        assert canon(result) == canon(new)
        self.model[doc_id] = new
        self.writes += 1

    @rule(data=st.data())
    def failing_patch(self, data):
        doc_id = data.draw(st.sampled_from(ID_POOL), label="id")
        if doc_id not in self.model:
            with pytest.raises(NotFoundError):
                self.coll.patch(doc_id, [{"op": "add", "path": "/a", "value": 1}])
            assert self.coll.get(doc_id) is None
            return
        doc = self.model[doc_id]
        present = [k for k in doc if k not in ("_id", "_event_time")]
        md = self.max_depth
        candidates = [
            [{"op": "add", "path": "/a", "value": 1}, {"op": "remove", "path": "/zz"}],
            [{"op": "replace", "path": "/zz", "value": 1}],
            [{"op": "replace", "path": "/_id", "value": "other id"}],
            [{"op": "add", "path": "/b", "value": math.nan}],
            [{"op": "add", "path": "/c", "value": [1, {"d": math.inf}]}],
            [{"op": "add", "path": "/a", "value": nest(md, "dict")}],
            [{"op": "add", "path": "/a", "value": 2**63}],
            [{"op": "add", "path": "/a/b/c", "value": 1}] if not isinstance(doc.get("a"), dict) else
            [{"op": "test", "path": "/a", "value": "__never__"}],
            [{"op": "bogus", "path": "/a", "value": 1}],
            [{"op": "remove", "path": ""}],
        ]
        if present:
            f = data.draw(st.sampled_from(present), label="field")
            candidates.append([{"op": "test", "path": "/" + f, "value": "__never__"},
                               {"op": "replace", "path": "/" + f, "value": 1}])
            candidates.append([{"op": "replace", "path": "/" + f, "value": 1},
                               {"op": "test", "path": "/" + f, "value": "__never__"}])
        ops = data.draw(st.sampled_from(candidates), label="ops")
        note(f"failing patch({doc_id!r}, {ops!r})")
        with pytest.raises(SchemaError):
            self.coll.patch(doc_id, ops)
        assert canon(self.coll.get(doc_id)) == canon(doc)

    @rule(doc_id=st.sampled_from(ID_POOL))
    def delete(self, doc_id):
        existed = self.coll.delete(doc_id)
        assert existed == (doc_id in self.model), doc_id
        self.model.pop(doc_id, None)
        self.writes += 1
        assert self.coll.get(doc_id) is None

    @rule()
    def flush(self):
        self.coll.flush()
        st_ = self.coll.stats()
        assert st_["documents"] == len(self.model)
        for sh in st_["shards"]:
            assert sh["memory_segments"] == 1, st_  # only the fresh, empty one

    @precondition(lambda self: self.writes >= 3)
    @rule()
    def reopen(self):
        old_coll, old_snaps = self.coll, self.snaps
        held = [(s, s.all()) for s, _ in old_snaps]
        self.snaps = []
        self.db.close()
        assert self.db.closed and old_coll.closed
        for call in (lambda: old_coll.get(0), lambda: len(old_coll), old_coll.snapshot,
                     lambda: old_coll.ingest([{"_id": 0}]), lambda: old_coll.delete(0)):
            with pytest.raises(ClosedError):
                call()
        for s, everything in held:
            with pytest.raises(ClosedError):
                s.term("a", 1)
            with pytest.raises(ClosedError):
                s.all()
            if everything:
                with pytest.raises(ClosedError):
                    s.fetch(everything)
        self.db = rtindex.open(os.path.join(self.dir, "db"), **self.opts)
        assert self.db.collection_names() == ["c"]
        self.coll = self.db["c"]
        assert self.coll.n_shards == self.n_shards
        self.writes = 0

    # -- reads -------------------------------------------------------------
    @rule(data=st.data())
    def take_or_drop_snapshot(self, data):
        if self.snaps and data.draw(st.integers(0, 3), label="drop one?") == 0:
            self.snaps.pop(data.draw(st.integers(0, len(self.snaps) - 1), label="which"))
            return
        self.snaps.append((self.coll.snapshot(), copy.deepcopy(self.model)))
        if len(self.snaps) > 3:
            self.snaps.pop(0)

    @rule(qs=st.lists(queries(), min_size=1, max_size=4), old=st.booleans(), bad=st.sampled_from(PATHS))
    def query(self, qs, old, bad):
        s, model = self.snaps[-1] if old and self.snaps else (self.coll.snapshot(), self.model)
        flat = {idkey(i): flatten(d) for i, d in model.items()}
        results = [check_query(s, model, flat, q) for q in qs]
        (a, pa_), (b, pb) = results[0], results[-1]
        assert {idkey(d["_id"]) for d in s.fetch(pa_ & pb)} == a & b
        assert {idkey(d["_id"]) for d in s.fetch(pa_ | pb)} == a | b
        assert {idkey(d["_id"]) for d in s.fetch(pa_ - pb)} == a - b
        assert len(pa_ | pb) == len(a | b)
        limited = s.fetch(pa_, limit=1)
        assert len(limited) == min(1, len(a))
        # lookups that make no sense are errors, not empty results
        with pytest.raises(ValueError):
            s.range(bad)
        with pytest.raises(TypeError):
            s.range(bad, 1, "b")
        with pytest.raises(TypeError):
            s.term(bad, [1])

    @rule(specs=st.lists(st.tuples(st.sampled_from(PATHS), st.sampled_from(
        ("null", "bool", "int", "float", "string", "timestamp", "array"))), min_size=1, max_size=4,
        unique_by=lambda spec: (".".join(as_path(spec[0])), spec[1])),
        old=st.booleans())
    def scan(self, specs, old):
        s, model = self.snaps[-1] if old and self.snaps else (self.coll.snapshot(), self.model)
        check_scan(s, model, specs)

    # -- invariants --------------------------------------------------------
    @invariant()
    def agrees_with_model(self):
        if self.db is None:
            return
        assert len(self.coll) == len(self.model)
        assert self.coll.stats()["documents"] == len(self.model)
        for i in ID_POOL:
            got = self.coll.get(i)
            want = self.model.get(i)
            assert canon(got) == canon(want), f"get({i!r})"
        check_snapshot(self.coll.snapshot(), self.model, self.rng, 4)

    @invariant()
    def old_snapshots_do_not_change(self):
        # rows, postings and columns a snapshot can see must outlive seals, merges and the
        # clean-up of merged-away segments (a row deleted after its segment was merged, then
        # merged again, used to vanish under a snapshot that held the first segment)
        for s, model in self.snaps:
            check_snapshot(s, model, self.rng, 2)


# examples from the profile (dev 30, ci 60, thorough 500), longer runs beyond dev. When green:
# dev ~10-15 s, thorough ~3-4 min; a failure adds up to 5 minutes of shrinking.
_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
CollectionMachine.TestCase.settings = settings(
    settings.default,
    stateful_step_count=50 if _PROFILE == "dev" else 60,
)
TestCollectionState = CollectionMachine.TestCase
if _PROFILE not in ("dev", "ci"):
    pytestmark = pytest.mark.timeout(3600)
