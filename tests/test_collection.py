"""Collection API: ingest forms, upsert, delete, patch, bad input, persistence, lifecycle."""

from __future__ import annotations

from datetime import datetime, timezone

import orjson
import pytest

import rtindex


def test_ingest_get_len(db):
    c = db.create_collection("events", shards=3)
    stats = c.ingest([{"_id": f"id-{i}", "n": i, "nested": {"a": [1, {"b": "x"}]}} for i in range(200)])
    assert stats.n == 200 and not stats.errors and stats.ids[:2] == ["id-0", "id-1"]
    assert stats.bytes > 0 and stats.seconds >= 0
    assert len(c) == 200
    doc = c.get("id-7")
    assert doc["n"] == 7 and doc["nested"] == {"a": [1, {"b": "x"}]}
    assert isinstance(doc["_event_time"], int)
    assert c.get("missing") is None


def test_ingest_bytes_json_array_and_ndjson(db):
    c = db.create_collection("c")
    assert c.ingest(orjson.dumps([{"_id": 1, "a": 1}, {"_id": 2, "a": 2}])).n == 2
    assert c.ingest(b'{"_id": 3, "a": 3}\n\n{"_id": 4, "a": 4}\n').n == 2
    assert c.ingest('{"_id": 5}').n == 1
    assert [c.get(i)["_id"] for i in range(1, 6)] == [1, 2, 3, 4, 5]


def test_generated_id_and_event_time(db):
    c = db.create_collection("c")
    t = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
    stats = c.ingest([{"x": 1}, {"_event_time": t}, {"_event_time": "2024-05-01T12:00:00"},
                      {"_event_time": 1_700_000_000_000_005}])
    assert stats.n == 4
    gen = stats.ids[0]
    assert isinstance(gen, str) and len(gen) == 32 and c.get(gen)["x"] == 1
    us = int(t.timestamp() * 1_000_000)
    assert c.get(stats.ids[1])["_event_time"] == us
    assert c.get(stats.ids[2])["_event_time"] == us
    assert c.get(stats.ids[3])["_event_time"] == 1_700_000_000_000_005


def test_int_and_string_ids_are_distinct(db):
    c = db.create_collection("c")
    c.ingest([{"_id": 1, "t": "int"}, {"_id": "1", "t": "str"}])
    assert c.get(1)["t"] == "int" and c.get("1")["t"] == "str" and len(c) == 2


def test_upsert_replaces_and_old_version_is_invisible(db):
    c = db.create_collection("c", shards=2)
    c.ingest([{"_id": "a", "v": 1, "tag": "old"}])
    before = c.snapshot()
    c.ingest([{"_id": "a", "v": 2}])
    assert c.get("a")["v"] == 2 and "tag" not in c.get("a") and len(c) == 1
    s = c.snapshot()
    assert len(s.term("tag", "old")) == 0 and len(s.term("v", 1)) == 0 and len(s.term("v", 2)) == 1
    # a snapshot taken before still sees the old version, and only it
    assert [d["v"] for d in before.fetch(before.all())] == [1]


def test_upsert_twice_in_one_batch_keeps_last(db):
    c = db.create_collection("c")
    c.ingest([{"_id": "a", "v": 1}, {"_id": "a", "v": 2}, {"_id": "a", "v": 3}])
    assert c.get("a")["v"] == 3 and len(c) == 1
    assert len(c.snapshot().term("v", 1)) == 0


def test_delete(db):
    c = db.create_collection("c")
    c.ingest([{"_id": i, "k": "x"} for i in range(10)])
    assert c.delete(3) is True
    assert c.delete(3) is False
    assert c.delete("nope") is False
    assert c.get(3) is None and len(c) == 9
    assert len(c.snapshot().term("k", "x")) == 9


def test_patch(db):
    c = db.create_collection("c")
    c.ingest([{"_id": "p", "a": {"b": 1}, "l": [1, 2]}])
    new = c.patch("p", [{"op": "replace", "path": "/a/b", "value": 3}, {"op": "add", "path": "/l/-", "value": 9}])
    assert new["a"]["b"] == 3 and new["l"] == [1, 2, 9]
    assert c.get("p")["a"] == {"b": 3}
    s = c.snapshot()
    assert len(s.term("a.b", 3)) == 1 and len(s.term("a.b", 1)) == 0 and len(s.term("l", 9)) == 1
    with pytest.raises(rtindex.NotFoundError):
        c.patch("nope", [])
    with pytest.raises(rtindex.SchemaError):
        c.patch("p", [{"op": "test", "path": "/a/b", "value": 99}])
    with pytest.raises(rtindex.SchemaError, match="_id"):
        c.patch("p", [{"op": "replace", "path": "/_id", "value": "q"}])
    with pytest.raises(rtindex.SchemaError):
        c.patch("p", [{"op": "frobnicate", "path": "/a"}])
    assert c.get("p")["a"] == {"b": 3}


@pytest.mark.parametrize(
    "doc, path, message",
    [
        ([1, 2], "$", "JSON object"),
        ({"a": {"b": [1, {"c": float("nan")}]}}, "$.a.b[1].c", "non-finite"),
        ({"a": 1 << 70}, "$.a", "64-bit"),
        ({"a": {1: 2}}, "$.a", "keys must be strings"),
        ({"a": {"b": {1, 2}}}, "$.a.b", "unsupported value type set"),
        ({"_id": 1.5}, "$._id", "_id must be"),
        ({"_id": True}, "$._id", "_id must be"),
        ({"_event_time": "yesterday"}, "$._event_time", "ISO-8601"),
        ({"we.ird": [float("inf")]}, '$["we.ird"][0]', "non-finite"),
    ],
)
def test_bad_documents_are_reported_and_good_ones_kept(db, doc, path, message):
    c = db.create_collection("c")
    stats = c.ingest([{"_id": "good-1"}, doc, {"_id": "good-2"}], errors="report")
    assert stats.n == 2 and stats.ids == ["good-1", "good-2"]
    [err] = stats.errors
    assert err.index == 1 and err.path == path and message in err.message
    assert message in str(err)
    assert c.get("good-1") and c.get("good-2") and len(c) == 2


def test_depth_and_size_limits(open_db):
    db = open_db(max_depth=4, max_document_bytes=1000)
    c = db.create_collection("c")
    deep = {"a": {"b": {"c": {"d": {"e": 1}}}}}
    ok = {"a": {"b": {"c": 1}}}
    stats = c.ingest([ok, deep, {"big": "x" * 2000}], errors="report")
    assert stats.n == 1
    assert [(e.index, e.path) for e in stats.errors] == [(1, "$.a.b.c.d"), (2, "$")]
    assert "deeper than 4" in stats.errors[0].message and "max_document_bytes" in stats.errors[1].message


def test_invalid_json_input_is_reported_per_line(db):
    c = db.create_collection("c")
    stats = c.ingest(b'{"_id": 1}\n{nope\n{"_id": 2}\n', errors="report")
    assert stats.n == 2 and [e.index for e in stats.errors] == [1]
    assert "line 2" in stats.errors[0].message
    stats = c.ingest(b"[{]", errors="report")
    assert stats.n == 0 and "invalid JSON" in stats.errors[0].message


def test_ingest_rejects_a_single_dict(db):
    c = db.create_collection("c")
    with pytest.raises(TypeError, match="iterable"):
        c.ingest({"_id": 1})


def test_persistence_across_reopen(open_db):
    db = open_db()
    c = db.create_collection("c", shards=2)
    c.ingest([{"_id": i, "v": i} for i in range(500)])
    c.delete(10)
    c.ingest([{"_id": 11, "v": -1}])
    db.close()
    db2 = open_db()
    c2 = db2["c"]
    assert c2.n_shards == 2 and len(c2) == 499
    assert c2.get(10) is None and c2.get(11)["v"] == -1 and c2.get(499)["v"] == 499
    s = c2.snapshot()
    assert len(s.term("v", 11)) == 0 and len(s.term("v", -1)) == 1 and len(s.range("v", 0, 100)) == 98


def test_collection_catalog(db):
    db.create_collection("a")
    with pytest.raises(rtindex.AlreadyExistsError):
        db.create_collection("a")
    assert db.create_collection("a", exist_ok=True) is db["a"]
    with pytest.raises(rtindex.NotFoundError, match="create_collection"):
        db.collection("zzz")
    with pytest.raises(KeyError):
        db["zzz"]
    with pytest.raises(ValueError, match="invalid collection name"):
        db.create_collection("../etc")
    with pytest.raises(ValueError, match="shards"):
        db.create_collection("b", shards=0)
    assert db.collection_names() == ["a"] and "a" in db
    db.drop_collection("a")
    assert db.collection_names() == []


def test_use_after_close_is_a_clear_error(tmp_path):
    db = rtindex.open(str(tmp_path / "x"))
    c = db.create_collection("c")
    c.ingest([{"_id": 1}])
    snap = c.snapshot()
    db.close()
    db.close()  # idempotent
    for call in (lambda: c.get(1), lambda: c.ingest([{}]), lambda: len(c), lambda: snap.all(),
                 lambda: db.collection("c"), lambda: c.delete(1)):
        with pytest.raises(rtindex.ClosedError):
            call()


def test_second_open_of_same_directory_fails(tmp_path):
    with rtindex.open(str(tmp_path / "x")) as db:
        db.create_collection("c")
        with pytest.raises(rtindex.StorageError, match="another process"):
            rtindex.open(str(tmp_path / "x"))


def test_open_missing_without_create(tmp_path):
    with pytest.raises(rtindex.NotFoundError):
        rtindex.open(str(tmp_path / "none"), create=False)


def test_stats(db):
    c = db.create_collection("c", shards=2)
    c.ingest([{"_id": i} for i in range(300)])
    c.flush()
    st = c.stats()
    assert st["documents"] == 300 and len(st["shards"]) == 2
    assert sum(s["sealed_segments"] for s in st["shards"]) >= 2
    assert db.stats()["collections"]["c"]["documents"] == 300


def test_ndjson_whose_first_line_is_an_array(db):
    c = db.create_collection("c")
    stats = c.ingest(b'[1, 2]\n{"_id": 1}\n', errors="report")
    assert stats.n == 1 and [e.index for e in stats.errors] == [0]
    assert c.ingest(b"[1, 2]", errors="report").errors[0].message.startswith("a document must be a JSON object")


def test_background_failure_is_reported_retried_and_recovers_without_reopen(tmp_path, monkeypatch):
    """A seal that fails (here: encoding a column raises) is reported by flush(), retried
    with backoff, and succeeds by itself once the cause is gone; data stays readable, and
    writes go on until the unsealed rows reach max_pending_seals, then fail storing nothing."""
    from rtindex import columns

    db = rtindex.open(str(tmp_path / "db"), seal_rows=10)
    c = db.create_collection("c", shards=1)
    encode = columns.encode

    def broken(arr):
        raise OSError("disk on fire")

    monkeypatch.setattr(columns, "encode", broken)
    c.ingest([{"_id": i} for i in range(10)])  # rotates: the sealer fails in the background
    with pytest.raises(rtindex.StorageError, match="background work failed.*disk on fire"):
        c.flush()
    assert len(c) == 10 and len(c.snapshot().term("_id", 3)) == 1  # readable meanwhile
    c.ingest([{"_id": f"more{i}"} for i in range(10)])  # a second segment waits for the sealer
    c.ingest([{"_id": f"full{i}"} for i in range(10)])  # fills the active one: no third may wait
    with pytest.raises(rtindex.StorageError, match="background work failed"):
        c.ingest([{"_id": f"over{i}"} for i in range(10)])
    assert len(c) == 30 and c.get("over0") is None
    monkeypatch.setattr(columns, "encode", encode)  # the cause is gone: the retry succeeds
    c.flush()
    assert c.stats()["shards"][0]["memory_segments"] == 1 and c.stats()["shards"][0]["sealed_segments"] >= 1
    c.ingest([{"_id": "after"}])
    assert len(c) == 31 and c.get("after") == {"_id": "after", "_event_time": c.get("after")["_event_time"]}
    db.close()
    with rtindex.open(str(tmp_path / "db"), seal_rows=10) as db2:
        c2 = db2["c"]
        assert len(c2) == 31 and len(c2.snapshot().term("_id", 3)) == 1 and c2.get("over0") is None


def test_one_json_object_holding_documents_gets_a_note(db):
    """JSON that is one object, holding an array of objects, is stored as one document (it
    is one), with a note and a warning naming the json_path that would store the array."""
    c = db.create_collection("notes")
    answer = orjson.dumps({"statuses": [{"id": i} for i in range(100)], "search_metadata": {"count": 100}})
    with pytest.warns(rtindex.IngestWarning, match="its field statuses is an array of 100 objects: "
                                                   "pass json_path='statuses'"):
        st = c.ingest(answer)
    assert st.n == 1 and st.notes == [f"stored 1 document of {st.bytes:,} bytes; its field statuses is an array "
                                      f"of 100 objects: pass json_path='statuses' to store them as documents"]
    assert c.ingest(answer, errors="report").notes  # noted, not warned
    assert not c.ingest([{"statuses": [{"id": 1}, {"id": 2}]}]).notes  # a dict given as one: meant as one
    assert not c.ingest(orjson.dumps({"a": [1, 2]})).notes
