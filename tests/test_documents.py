"""documents: generated ids (drawn from a pool of OS randomness)."""

from __future__ import annotations

import os
import re
import threading
import time
from unittest import mock

import pytest

from rtindex import documents
from rtindex.errors import SchemaError


def test_generated_ids_are_distinct_hex_across_pool_refills():
    ids = [documents.new_id() for _ in range(documents._IdPool._IDS + 7)] + documents.new_ids(2 * documents._IdPool._IDS)
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


def test_generated_ids_grow_and_start_with_the_time():
    """Ids only grow, also across pool refills and when the clock stands still or goes
    back: RocksDB appends their index entries instead of searching its memtable."""
    ids = [documents.new_id() for _ in range(documents._IdPool._IDS + 7)] + documents.new_ids(2 * documents._IdPool._IDS)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    before_ms = time.time_ns() // 1_000_000
    assert before_ms <= int(documents._IdPool().take(1)[0][:12], 16) <= time.time_ns() // 1_000_000
    pool = documents._IdPool()
    with mock.patch.object(documents.time, "time_ns", return_value=10**18):  # a clock stuck...
        stuck = pool.take(2 * pool._IDS - 3) + pool.take(4)  # across refills
    with mock.patch.object(documents.time, "time_ns", return_value=10**15):  # ...then set back
        back = [pool.take(1)[0] for _ in range(pool._IDS + 1)]
    every = stuck + back
    assert every == sorted(every) and len(set(every)) == len(every)
    assert [int(i[:12], 16) for i in every[:: pool._IDS]] == [10**12 + k for k in range(4)]


def test_threads_never_get_the_same_id():
    got: list[list[str]] = [[] for _ in range(4)]

    def draw(out: list[str]) -> None:
        out.extend(documents.new_id() for _ in range(5000))

    threads = [threading.Thread(target=draw, args=(out,)) for out in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for out in got for i in out]
    assert len(set(every)) == len(every) == 20000


def test_a_forked_child_does_not_repeat_its_parents_ids():
    documents.new_id()  # the pool holds ids the child must not hand out again
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write its next ids and leave at once
        try:
            os.write(w, "".join(documents.new_id() for _ in range(8)).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        child = f.read().decode()
    os.waitpid(pid, 0)
    parent = [documents.new_id() for _ in range(8)]
    child_ids = [child[i : i + 32] for i in range(0, len(child), 32)]
    assert len(child_ids) == 8 and not set(child_ids) & set(parent)


# -- NDJSON lines stored as they came ----------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
import json  # noqa: E402

import orjson  # noqa: E402

from rtindex.documents import Limits, Line, parse_lines, prepare  # noqa: E402

NOW = 1_700_000_000_000_000
_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
_event_times = st.sampled_from([None, NOW + 5, "2024-05-01T12:00:00", 1_700_000_000_000])


@st.composite
def _documents(draw):
    doc = draw(st.dictionaries(st.text(max_size=6).filter(lambda k: k not in ("_id", "_event_time")), _values, max_size=5))
    items = list(doc.items())
    if draw(st.booleans()):  # an _id, somewhere among the keys
        items.insert(draw(st.integers(0, len(items))), ("_id", draw(st.none() | st.text(max_size=6) | st.integers(-5, 5))))
    et = draw(_event_times)
    if et is not None or draw(st.booleans()):
        items.insert(draw(st.integers(0, len(items))), ("_event_time", et))
    return dict(items)


def _line(doc: dict, spaced: bool) -> bytes:
    """NDJSON text of ``doc``, compact (as orjson writes) or spaced (as json.dumps does)."""
    return (b"  " + json.dumps(doc).encode() + b" \r") if spaced else orjson.dumps(doc)


@settings(max_examples=300, deadline=None)
@given(_documents(), st.booleans())
def test_a_line_is_stored_as_the_document_serialized_would_be(doc, spaced):
    limits = Limits()
    (_, parsed), = parse_lines([_line(doc, spaced)])
    assert type(parsed) is Line
    try:
        want = prepare(parsed.doc, limits, NOW, True)
    except SchemaError as e:  # e.g. an _event_time in milliseconds: refused the same way
        with pytest.raises(SchemaError) as refused:
            prepare(parsed.doc, limits, NOW, True, raw=parsed.raw)
        assert str(refused.value) == str(e)
        return
    got = prepare(parsed.doc, limits, NOW, True, raw=parsed.raw)
    if doc.get("_id") is None:  # generated: different ids, same place
        assert got[0] != want[0]
        got = (want[0], want[1], {**got[2], "_id": want[0]}, got[3].replace(got[0].encode(), want[0].encode()))
    assert got[:2] == want[:2]
    assert got[2] == want[2] and list(got[2]) == list(want[2])
    stored, expected = orjson.loads(got[3]), orjson.loads(want[3])
    assert stored == expected and list(stored) == list(expected)  # same values, same key order
    if not spaced and doc.get("_id") is not None and doc.get("_event_time") in (NOW + 5,):
        assert got[3] == want[3]  # nothing filled in: the line itself, byte for byte


def test_a_line_over_max_document_bytes_is_refused_by_its_own_length():
    line = b'{"_id": 1, "_event_time": 1700000000000000, "pad": "' + b"x" * 100 + b'"}'
    (_, parsed), = parse_lines([line])
    assert parsed.doc is None and parsed.raw == line  # a line is kept as text, not parsed
    with pytest.raises(SchemaError, match="max_document_bytes"):
        prepare(orjson.loads(parsed.raw), Limits(max_document_bytes=100), NOW, True, raw=parsed.raw)


@pytest.mark.parametrize("doc_id", ["\ud800", "a\udfffb"])
def test_an_id_that_is_not_utf8_is_a_schema_error(tmp_path, doc_id):
    """A lone surrogate cannot be stored: the item's error (a 400 from the service), never a
    UnicodeEncodeError, on every call that takes an ``_id``."""
    import rtindex

    with pytest.raises(SchemaError, match="_id is not valid UTF-8"):
        documents.encode_id(doc_id)
    with rtindex.open(tmp_path / "db") as db:
        c = db.create_collection("c", shards=2)
        st = c.ingest([{"_id": doc_id}, {"_id": "ok"}], errors="report")
        assert [(e.index, e.path) for e in st.errors] == [(0, "$._id")] and len(c) == 1
        for call in (c.get, c.delete, lambda i: c.patch(i, [])):
            with pytest.raises(SchemaError, match="_id is not valid UTF-8"):
                call(doc_id)
