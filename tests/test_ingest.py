"""ingest: the write path of Collection.ingest (prepare on the caller's thread, put on the
indexer thread, in order), documents given as text, and the interpreter settings ingest
runs under."""

from __future__ import annotations

import gc
import sys
import threading

import pytest

import rtindex
from rtindex import documents, ingest
from rtindex.documents import Limits
from tests.test_inputs import ingest_paused_pipe


def test_ingest_runs_with_the_collector_paused_and_short_switches_then_restores(db):
    c = db.create_collection("c")
    seen = []

    def docs():
        for i in range(3):
            seen.append((gc.isenabled(), sys.getswitchinterval()))
            yield {"_id": i}

    before = (gc.isenabled(), sys.getswitchinterval())
    c.ingest(docs())
    assert seen == [(False, ingest.SWITCH_INTERVAL)] * 3
    assert (gc.isenabled(), sys.getswitchinterval()) == before

    def broken():
        yield {"_id": 9}
        raise RuntimeError("the caller's generator fails")

    with pytest.raises(RuntimeError):
        c.ingest(broken())
    assert (gc.isenabled(), sys.getswitchinterval()) == before


def test_a_collector_the_caller_turned_off_stays_off():
    gc.disable()
    try:
        with ingest.ingest_mode():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_settings_hold_until_the_last_of_several_threads_leaves():
    before = sys.getswitchinterval()
    first_in, second_out = threading.Event(), threading.Event()
    states = []

    def other():
        with ingest.ingest_mode():
            first_in.set()
            second_out.wait(5)
            states.append((gc.isenabled(), sys.getswitchinterval()))

    t = threading.Thread(target=other)
    t.start()
    first_in.wait(5)
    with ingest.ingest_mode():
        pass
    second_out.set()  # this thread left first: the other one still ingests
    t.join(5)
    assert states == [(False, ingest.SWITCH_INTERVAL)]
    assert gc.isenabled() and sys.getswitchinterval() == before


# -- documents given as JSON text ------------------------------------------------------------
def test_text_is_stored_as_it_came_with_only_id_and_event_time_added(db):
    c = db.create_collection("c", shards=2)
    lines = [b'{"_id": "a", "x": [1,  2],  "_event_time": 1700000000000000}',
             b'  {"x": {"y": "\\u00e9"}}  ',
             b'{}',
             b'{"_id": 7, "z": null}']
    st = c.ingest(lines)
    assert st.n == 4 and not st.errors
    snap = c.snapshot()
    stored = {d["_id"]: d for d in snap.fetch(snap.all())}
    assert stored["a"] == {"_id": "a", "x": [1, 2], "_event_time": 1700000000000000}
    gen = [k for k in stored if k not in ("a", 7)]
    assert len(gen) == 2 and all(len(k) == 32 for k in gen)
    assert [stored[k]["x"] for k in gen if "x" in stored[k]] == [{"y": "\u00e9"}]
    assert stored[7]["z"] is None and isinstance(stored[7]["_event_time"], int)
    assert st.doc_ids[0] == "a" and st.doc_ids[3] == 7 and st.doc_ids[1] in gen
    # the row is the text given (the array kept its spacing), found by the index
    row = c._shards[documents.shard_of(documents.encode_id("a"), 2)].fetch([0])[0]
    assert row["x"] == [1, 2]
    assert db.sql("SELECT _id FROM c WHERE ARRAY_CONTAINS(x, 2)").rows() == [{"_id": "a"}]


@pytest.mark.parametrize("text, message, path", [
    (b'{"a": tru}', "invalid JSON at byte 6: unexpected character 't'", "$"),
    (b'[1]', "a document must be a JSON object, not an array", "$"),
    (b'{"a": 1, "a": 2}', "duplicate key in an object", "$.a"),
    (b'{"a": 99999999999999999999}', "integer outside the signed 64-bit range", "$.a"),
    (b'{"a": NaN}', "invalid JSON at byte 6: NaN and Infinity are not JSON numbers", "$"),
    (b'{"_id": 1.5}', "_id must be a string or an integer, not float", "$._id"),
    (b'{"_event_time": 1700000000}', "looks like seconds", "$._event_time"),
])
def test_text_that_is_not_a_document_is_its_items_error(db, text, message, path):
    c = db.create_collection("c")
    st = c.ingest([b'{"_id": 1}', text, b'{"_id": 2}'], errors="report")
    assert st.n == 2 and [e.index for e in st.errors] == [1]
    assert message in st.errors[0].message and st.errors[0].path == path


@pytest.mark.parametrize("text, message, path", [
    (b'{"a": 1, "a": 2, "_event_time": "2024-01-01T00:00:00Z"}', "duplicate key in an object", "$.a"),
    (b'{"x": -9223372036854775809, "_event_time": "2024-01-01T00:00:00Z"}', "signed 64-bit range", "$.x"),
    (b'{"o": {"x": 18446744073709551616}, "_event_time": "2024-01-01"}', "signed 64-bit range", "$.o.x"),
])
def test_a_text_stored_as_its_parse_is_refused_as_the_text_would_be(db, text, message, path):
    """An ``_event_time`` given as ISO-8601 text is converted, so the document is stored as
    its parse serializes; what that parse lets pass (a key twice, an integer past 64 bits
    read as a float) is refused as the text itself is, never stored changed."""
    c = db.create_collection("c")
    for docs in ([text, b'{"_id": 1}'], text + b'\n{"_id": 1}\n'):
        st = c.ingest(docs, errors="report")
        assert st.n == 1 and [(e.index, e.path) for e in st.errors] == [(0, path)]
        assert message in st.errors[0].message
    assert len(c) == 1
    c.ingest([b'{"_id": "t", "o": {"k": [1, 2]}, "_event_time": "2024-01-01T00:00:00Z"}'])
    assert c.get("t") == {"_id": "t", "o": {"k": [1, 2]}, "_event_time": 1_704_067_200_000_000}


@pytest.mark.parametrize("length", [documents.MAX_ID_BYTES - 3, documents.MAX_ID_BYTES - 2,
                                    documents.MAX_ID_BYTES - 1, documents.MAX_ID_BYTES])
def test_a_long_string_id_is_taken_or_refused_alike_as_text_and_as_a_dict(db, length):
    """The scan of a text takes a string ``_id`` by its own length; its key (escaped, and
    terminated) is what encode_id bounds: text and dicts agree, and a stored document can
    be read by its ``_id`` (one the text path let past the bound could not)."""
    c = db.create_collection("c")
    doc_id = "i" * length
    try:
        documents.encode_id(doc_id)
        fits = True
    except rtindex.SchemaError:
        fits = False
    as_dict = c.ingest([{"_id": doc_id, "k": 1}], errors="report")
    as_text = c.ingest([b'{"_id": "%s", "k": 2}' % doc_id.encode(), b'{"_id": 3}'], errors="report")
    as_lines = c.ingest(b'{"_id": "%s", "k": 3}\n' % doc_id.encode(), errors="report")
    for st in (as_dict, as_text, as_lines):
        assert [e.message for e in st.errors] == ([] if fits else [f"_id is longer than {documents.MAX_ID_BYTES} bytes"])
        assert all(e.index == 0 and e.path == "$._id" for e in st.errors)
    assert as_text.n == 1 + fits
    if fits:
        assert c.get(doc_id)["k"] == 3


def test_a_long_text_is_refused_by_its_length(tmp_path):
    with rtindex.open(tmp_path / "db", max_document_bytes=100) as db:
        c = db.create_collection("c")
        st = c.ingest([b'{"_id": 5, "pad": "' + b"x" * 200 + b'"}'], errors="report")
        assert st.n == 0 and st.errors[0].id == 5 and "max_document_bytes=100" in st.errors[0].message


# -- the pipeline ------------------------------------------------------------------------------
def test_puts_run_on_the_indexer_threads_in_order_and_the_caller_prepares_meanwhile(db, monkeypatch):
    c = db.create_collection("c", shards=2)
    seen = []
    for shard in c._shards:
        put = shard.put_many

        def spy(items, generated=frozenset(), put=put, shard=shard):
            seen.append((threading.current_thread().name, shard.index, items[0][0]))
            return put(items, generated)

        monkeypatch.setattr(shard, "put_many", spy)
    st = c.ingest([{"_id": i} for i in range(4000)], batch_size=500)
    assert st.n == 4000 and len(c) == 4000
    # shard s always on indexer s % 2: the two shards' puts overlap, each shard's stay in order
    assert {(name, s) for name, s, _ in seen} == {("rtindex-indexer-0_0", 0), ("rtindex-indexer-1_0", 1)}
    for s in (0, 1):  # each shard's puts in input order
        firsts = [first for _, shard, first in seen if shard == s]
        assert firsts == sorted(firsts)


def test_a_chunk_is_visible_while_the_caller_waits_for_more_input(db):
    """A streamed input that pauses: what came before the pause is stored and visible."""
    seen, _ = ingest_paused_pipe(db.create_collection("c"), 100, 100, 100, 100)
    assert seen == [100]


def test_after_a_failed_put_nothing_more_is_begun(db, monkeypatch):
    c = db.create_collection("c", shards=1)
    shard = c._shards[0]
    put = shard.put_many
    calls = []

    def failing(items, generated=frozenset()):
        calls.append(items[0][0])
        if len(calls) == 2:
            raise rtindex.StorageError("injected: the second put fails")
        return put(items, generated)

    monkeypatch.setattr(shard, "put_many", failing)
    with pytest.raises(rtindex.StorageError, match="injected"):
        c.ingest([{"_id": i} for i in range(5000)], batch_size=1000)
    assert calls[:2] == [0, 1000] and len(calls) <= 3  # (one more may have been queued, never begun)
    assert len(c) == 1000


def test_prepare_routes_and_names_what_it_cannot_store():
    lim = Limits()
    chunk = [(0, {"_id": "x", "v": 1}), (1, documents.Line(None, b'{"v": 2}', True)), (2, [1, 2]),
             (3, documents.Line(None, b'{nope', True)), (4, b'{"_id": 5}')]
    c = ingest.prepare(chunk, lim, 4)
    routed = {idx: raw for part in c.per_shard for idx, _, _, raw in part}
    assert sorted(routed) == [0, 1, 4] and c.generated == {1}
    assert routed[1].startswith(b'{"v": 2,"_id":"') and b'"_event_time":' in routed[1]
    assert [(e.index, e.message) for e in c.errors] == [
        (2, "a document must be a JSON object, not list"),
        (3, "invalid JSON on line 4 at byte 1: expected a string key")]


# -- a chunk's dicts serialized together ---------------------------------------------------
from decimal import Decimal  # noqa: E402

import numpy as np  # noqa: E402
import orjson  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rtindex.errors import SchemaError  # noqa: E402

NOW = 1_700_000_000_000_000
_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=6)
            | st.floats(allow_nan=True, allow_infinity=True))
_odd = st.sampled_from([Decimal("1.5"), np.int64(7), 2**70, {1: "non-str key"}])
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
_ids = st.none() | st.text(max_size=6) | st.integers(-5, 5) | st.sampled_from([True, 1.0, 2**64, [1]])
_times = st.sampled_from([NOW + 5, 1_700_000_000_000, -1, "2024-05-01T12:00:00", 1.5, None])


@st.composite
def _dicts(draw):
    doc = draw(st.dictionaries(st.text(max_size=5).filter(lambda k: k not in ("_id", "_event_time")),
                               _values, max_size=4))
    if draw(st.booleans()):
        doc["_id"] = draw(_ids)
    if draw(st.booleans()):
        doc["_event_time"] = draw(_times)
    if draw(st.integers(0, 20)) == 0:  # not plain JSON: the chunk is serialized dict by dict
        doc["odd"] = draw(_odd)
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_dicts(), max_size=8))
def test_a_chunks_dicts_are_stored_as_each_alone_would_be(monkeypatch, docs):
    """One orjson call for the chunk's dicts, then the text path: the same ids, errors and
    stored values (in the same key order) as identify + serialize of each dict."""
    monkeypatch.setattr(documents, "now_us", lambda: NOW)  # the same for every input
    lim = Limits()
    c = ingest.prepare(list(enumerate(docs)), lim, 3)
    routed = {idx: (s, id_key, raw) for s, part in enumerate(c.per_shard) for idx, id_key, _, raw in part}
    errors = {e.index: e.message for e in c.errors}
    for i, doc in enumerate(docs):
        try:
            doc_id, id_key, _, raw = documents.prepare(doc, lim, NOW, True)
        except SchemaError as e:
            assert errors.get(i) == e.message and i not in routed
            continue
        assert i in routed and i not in errors
        s, got_key, got_raw = routed[i]
        if doc.get("_id") is None:  # generated: another id, in the same place
            assert i in c.generated
            got_raw = got_raw.replace(c.ids[i].encode(), doc_id.encode())
            id_key, got_key = documents.encode_id(doc_id), id_key
        else:
            assert c.ids[i] == doc_id and got_key == id_key and s == documents.shard_of(id_key, 3)
        stored, want = orjson.loads(got_raw), orjson.loads(raw)
        assert stored == want and list(stored) == list(want)
