"""rtindex.connect: the embedded API over a real ``rtindex serve`` (nothing of it mocked but
the 429/5xx replies, which a test server cannot be made to give on demand)."""

from __future__ import annotations

import doctest
import os
import socket
import uuid

import httpx
import orjson
import pytest

import rtindex
from rtindex import client
from tests.serving import Served, module_service


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from module_service(tmp_path_factory.mktemp("cli"))


@pytest.fixture(scope="module")
def db(served):
    with rtindex.connect(served.url, api_key=served.admin_key) as d:
        yield d


@pytest.fixture(scope="module")
def reader(served, db):
    """An embedded reader process's view of the server's data directory."""
    db.create_collection("reader_anchor", exist_ok=True)  # the directory exists by now
    r = rtindex.open(served.data, role="reader")
    yield r
    r.close()


def fresh(prefix: str = "c") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


class Recorder:
    """Counts the requests a RemoteDatabase sends (and what it sent with each)."""

    def __init__(self, db, monkeypatch, on_send=None):
        self.calls: list[tuple[str, str, dict]] = []
        real = db._request

        def request(method, path, **kw):
            if on_send is not None:
                on_send()
            self.calls.append((method, path, kw))
            return real(method, path, **kw)

        monkeypatch.setattr(db, "_request", request)


def test_docstring_example_runs(served):
    test = doctest.DocTestParser().get_doctest(client.__doc__, {"url": served.url, "key": served.admin_key},
                                               "rtindex.client", client.__file__, 0)
    runner = doctest.DocTestRunner(verbose=False)
    runner.run(test)
    assert runner.failures == 0 and runner.tries >= 10


def test_collections(db, served):
    name = fresh()
    coll = db.create_collection(name, shards=3)
    assert (coll.name, coll.n_shards) == (name, 3)
    assert name in db and f"commons.{name}" in db and "nope_nope" not in db
    assert name in db.collection_names() and db.collection_names() == sorted(db.collection_names())
    assert db[name].n_shards == 3 and db.collection(f"commons.{name}").name == name
    assert db.create_collection(name, exist_ok=True).n_shards == 3
    with pytest.raises(rtindex.AlreadyExistsError):
        db.create_collection(name)
    with pytest.raises(ValueError, match="invalid collection name"):
        db.create_collection("bad name")
    with pytest.raises(ValueError, match="shards"):
        db.create_collection(fresh(), shards=0)
    assert repr(coll) == f"<rtindex.RemoteCollection {name!r} shards=3 at {served.url!r}>"
    assert repr(db) == f"<rtindex.RemoteDatabase {served.url!r}>"
    db.drop_collection(name)
    assert name not in db
    with pytest.raises(rtindex.NotFoundError):
        db[name]
    with pytest.raises(rtindex.NotFoundError):
        db.drop_collection(name)
    with pytest.raises(rtindex.NotFoundError):
        coll.ingest([{"_id": 1}])


def test_ndjson_in_several_batches_reports_what_embedded_reports(db, tmp_path, monkeypatch):
    """Bad lines, blank lines, non-objects and repeated ids spread over several requests:
    the stats are the embedded ones, positions in the whole input."""
    lines = []
    for i in range(40):
        if i % 9 == 4:
            lines.append(b'{"_id": %d, broken' % i)
        elif i % 11 == 7:
            lines.append(b"")
        elif i == 20:
            lines.append(b"[1, 2]")
        elif i == 23:
            lines.append(b'{"_id": 3.5}')  # a float _id: refused by the server's checks
        else:
            lines.append(orjson.dumps({"_id": i % 30, "v": i, "s": f"s{i}"}))
    data = b"\n".join(lines) + b"\n"
    coll = db.create_collection(fresh("nd"), shards=2)
    coll.ingest([{"_id": 0, "v": -1}])  # so that _id 0 is replaced, as below
    rec = Recorder(db, monkeypatch)
    got = coll.ingest(data, batch_size=6, errors="report")
    posts = [c for c in rec.calls if c[0] == "POST"]
    assert len(posts) == 6  # 34 documents to send, 6 a request
    assert all(c[2]["headers"]["Content-Type"] == "application/x-ndjson" for c in posts)
    with rtindex.open(str(tmp_path / "emb")) as emb:
        ec = emb.create_collection("nd", shards=2)
        ec.ingest([{"_id": 0, "v": -1}])
        want = ec.ingest(data, batch_size=6, errors="report")
    assert (got.n, got.ids, got.replaced) == (want.n, want.ids, want.replaced)
    assert got.errors == want.errors and [e.index for e in got.errors] == [4, 13, 20, 22, 23, 31]
    assert got.fence.startswith(coll.name + "/") and got.seconds > 0
    last = {}  # bytes counts the NDJSON sent for the stored (last) version of each document
    for line in lines:
        try:
            d = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(d, dict) and isinstance(d["_id"], int):
            last[d["_id"]] = len(line)
    assert got.bytes == sum(last.values())
    # the stored values are the last ones given
    assert coll.get(3) == {"_id": 3, "v": 33, "s": "s33", "_event_time": coll.get(3)["_event_time"]}
    assert len(coll) == want.n == coll.count()


def test_ingest_takes_what_embedded_takes_and_reads_lazily(db, monkeypatch):
    coll = db.create_collection(fresh("in"), shards=3)
    consumed = []

    def docs():
        for i in range(25):
            consumed.append(i)
            yield {"_id": f"g{i}", "i": i}

    at_send: list[int] = []
    Recorder(db, monkeypatch, on_send=lambda: at_send.append(len(consumed)))
    st = coll.ingest(docs(), batch_size=10)
    monkeypatch.undo()
    assert st.n == 25 and st.ids == [f"g{i}" for i in range(25)] and not st.errors
    assert at_send[:3] == [10, 20, 25]  # a batch is sent as soon as it is full
    # a JSON array, as bytes and as str; documents without _id get one
    st = coll.ingest(b'[{"x": 1}, {"x": 2}, 5]', errors="report")
    assert st.n == 2 and all(len(i) == 32 for i in st.ids)
    assert [(e.index, e.message) for e in st.errors] == [(2, "a document must be a JSON object, not a number")]
    st = coll.ingest('{"_id": "s1"}\n{"_id": "s2"}\n')
    assert st.ids == ["s1", "s2"]
    # what cannot be JSON, too deep, too large: item errors, the rest stored
    big = {"_id": "big", "s": "x" * (4 << 20)}
    deep: dict = {"_id": "deep"}
    node = deep
    for _ in range(70):
        node["d"] = {}
        node = node["d"]
    st = coll.ingest([{"_id": "ok1"}, {"_id": "set", "v": {1, 2}}, big, deep, {"_id": "ok2"}], batch_size=100,
                     errors="report")
    assert st.ids == ["ok1", "ok2"]
    assert [(e.index, e.id) for e in st.errors] == [(1, "set"), (2, "big"), (3, "deep")]
    assert "max_document_bytes" in st.errors[1].message and st.errors[2].path.startswith("$.d.d")
    assert coll.get("big") is None and coll.get("ok2") is not None
    st = coll.ingest([])
    assert st.n == 0 and st.fence.startswith(coll.name + "/")
    with pytest.raises(TypeError):
        coll.ingest({"_id": 1})
    with pytest.raises(ValueError):
        coll.ingest([], batch_size=0)


def test_read_your_writes(db, monkeypatch):
    coll = db.create_collection(fresh("ryw"), shards=4)
    other = db.create_collection(fresh("ryw"), shards=1)
    rec = Recorder(db, monkeypatch)
    for i in range(30):
        st = coll.ingest([{"_id": i, "k": i % 3}])
        other.ingest([{"_id": i}])  # a write elsewhere does not replace coll's fence
        assert db.sql(f"SELECT COUNT(*) AS n FROM {coll.name}").rows() == [{"n": i + 1}]
        assert coll.get(i) is not None
        sent = [c[2]["json"] for c in rec.calls if c[1] == "/v1/query"][-1]
        assert sent["min_fence"] == st.fence
    coll.patch(5, [{"op": "add", "path": "/p", "value": True}])
    assert db.sql(f"SELECT _id FROM {coll.name} WHERE p = true").rows() == [{"_id": 5}]
    assert coll.delete(6) is True
    assert db.sql(f"SELECT COUNT(*) AS n FROM {coll.name} WHERE _id = 6").rows() == [{"n": 0}]
    # dropped: its fence is forgotten (queries elsewhere do not wait for it)
    db.drop_collection(other.name)
    assert other.name not in db._fences


def test_results_equal_an_embedded_readers(db, reader):
    coll = db.create_collection(fresh("res"), shards=3)
    docs = [{"_id": i, "k": i % 4, "price": i * 1.5 if i % 2 else i, "tag": ["a", "b", 7][i % 3],
             "user": {"name": f"u{i % 5}", **({"vip": True} if i % 6 == 0 else {})},
             **({"opt": [i, i + 1]} if i % 4 == 0 else {})} for i in range(60)]
    docs.append({"_id": "s1", "k": 1})
    st = coll.ingest(docs)
    assert reader.wait_for(st.fence, timeout=10)
    n = coll.name
    queries = [
        (f"SELECT * FROM {n} WHERE k = :k", {"k": 1}),
        (f"SELECT * FROM {n} WHERE _id = ?", [1]),
        (f"SELECT _id, tag, price, user, _event_time FROM {n} WHERE k = 2", None),
        (f"SELECT user.name AS who, opt FROM {n} WHERE k = 0 ORDER BY _id", None),
        (f"SELECT k, COUNT(*) AS n, SUM(price) AS total, MAX(_event_time) AS t FROM {n} GROUP BY k ORDER BY k", None),
        (f"SELECT price * 2 AS p2 FROM {n} WHERE price > 50 ORDER BY p2", None),
        (f"SELECT * FROM {n} WHERE k = 99", None),
        (f"SELECT COUNT(*) AS n FROM {n}", None),
    ]
    for sql, params in queries:
        got, want = db.sql(sql, params), reader.sql(sql, params)
        assert got.rows() == want.rows(), sql
        assert got.arrow().equals(want.arrow()), sql
        assert got.df().equals(want.df()), sql
        assert got.columns == want.columns and len(got) == len(want) and got.access == want.access, sql
        assert isinstance(got, rtindex.Result) and got.seconds > 0 and "staleness_ms" in got.stats
    assert coll.get(1) == reader[n].get(1) and coll.get("1") is None and coll.get("s1") == reader[n].get("s1")
    # large enough for the column scan: a projection's rows are still the embedded ones
    big = db.create_collection(fresh("scan"), shards=2)
    st = big.ingest({"_id": i, "k": i % 4, "m": i if i % 2 else str(i), "p": i / 2} for i in range(3000))
    assert reader.wait_for(st.fence, timeout=10)
    for sql in (f"SELECT k, m, p, _event_time FROM {big.name}", f"SELECT k, MIN(m) AS m FROM {big.name} GROUP BY k ORDER BY k"):
        got, want = db.sql(sql), reader.sql(sql)
        assert got.access == want.access == "scan", sql
        assert got.rows() == want.rows(), sql
        assert got.arrow().cast(want.arrow().schema).equals(want.arrow()), sql  # the zone's name may differ


def test_documents_by_id(db):
    coll = db.create_collection(fresh("doc"), shards=2)
    coll.ingest([{"_id": 1, "v": 1}, {"_id": "a b?#%", "v": 2}, {"_id": 7, "v": 3}, {"_id": "x/y"}])
    assert coll.get(2) is None and coll.get("1") is None
    assert coll.get("a b?#%")["v"] == 2 and coll.get("x/y") == {"_id": "x/y", "_event_time": coll.get("x/y")["_event_time"]}
    with pytest.raises(client.RequestError, match="containing '/'"):  # the server's routes cannot name it
        coll.delete("x/y")
    new = coll.patch("a b?#%", [{"op": "replace", "path": "/v", "value": 20}, {"op": "add", "path": "/w", "value": [1]}])
    assert new == coll.get("a b?#%") and new["v"] == 20 and new["w"] == [1] and "_event_time" in new
    with pytest.raises(rtindex.NotFoundError):
        coll.patch(2, [])
    with pytest.raises(rtindex.NotFoundError):
        coll.patch("1", [])  # the integer 1 is stored, not the string
    with pytest.raises(rtindex.SchemaError) as e:
        coll.patch(1, [{"op": "replace", "path": "/_id", "value": 2}])
    assert e.value.path == "$._id" and e.value.status == 400
    with pytest.raises(rtindex.SchemaError):
        coll.patch(1, [{"op": "remove", "path": "/missing"}])
    with pytest.raises(rtindex.SchemaError):
        coll.get(1.5)
    assert coll.delete("1") is False and coll.get(1) is not None  # not the integer's
    coll.ingest([{"_id": "7"}])
    with pytest.raises(client.RequestError, match="cannot be named"):
        coll.delete(7)
    assert coll.delete("7") is True and coll.delete(7) is True and coll.delete(7) is False
    assert coll.delete(1) is True and coll.get(1) is None
    assert len(coll) == 2 == coll.count()


def test_errors_map_to_rtindex_classes(db, served):
    coll = db.create_collection(fresh("err"), shards=1)
    with pytest.raises(rtindex.SqlError) as e:
        db.sql(f"SELEC * FROM {coll.name}")
    assert e.value.status == 400 and e.value.type == "BadSql" and "line 1" in str(e.value)
    with pytest.raises(rtindex.SqlError, match="no collection"):  # as embedded
        db.sql("SELECT * FROM no_such_collection")
    with pytest.raises(client.RequestError) as e:
        db.sql(f"SELECT * FROM {coll.name}", timeout_ms=10**9)
    assert e.value.limit == "max_query_ms" and isinstance(e.value, ValueError)
    with pytest.raises(rtindex.AccessDeniedError) as e:
        rtindex.connect(served.url, api_key="rtk_not_a_key")
    assert isinstance(e.value, PermissionError) and e.value.status == 401
    with served.client() as admin:
        read_key = admin.post("/v1/keys", json={"role": "read", "name": "client test"}).json()["key"]
    with rtindex.connect(served.url, api_key=read_key) as ro:
        assert ro.sql(f"SELECT COUNT(*) AS n FROM {coll.name}").rows() == [{"n": 0}]
        with pytest.raises(PermissionError) as e:
            ro[coll.name].ingest([{"_id": 1}])
        assert isinstance(e.value, rtindex.AccessDeniedError) and e.value.status == 403
        with pytest.raises(rtindex.AccessDeniedError):
            ro.create_collection(fresh())
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(rtindex.StorageError, match="cannot reach"):
        rtindex.connect(f"http://127.0.0.1:{port}", api_key="k", timeout=2)
    closed = rtindex.connect(served.url, api_key=served.admin_key)
    closed.close()
    closed.close()
    assert closed.closed
    with pytest.raises(rtindex.ClosedError):
        closed.collection_names()


def test_api_key_from_the_environment(served, monkeypatch):
    monkeypatch.setenv("RTINDEX_API_KEY", served.admin_key)
    with rtindex.connect(served.url) as d:
        assert isinstance(d.collection_names(), list)
    monkeypatch.delenv("RTINDEX_API_KEY")
    with pytest.raises(rtindex.AccessDeniedError, match="give a valid API key"):
        rtindex.connect(served.url)


def test_429_is_retried_after_retry_after_then_overloaded(db, served):
    """The replies a loaded server gives, from a mock transport (the rest is the real client)."""
    replies: list[httpx.Response] = []
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return replies.pop(0)

    busy = lambda s="2": httpx.Response(429, headers={"Retry-After": s},
                                        json={"type": "TooManyRequests", "message": "busy",
                                              "limit": "max_concurrent_queries"})
    ok = httpx.Response(200, json={"rows": [{"n": 1}], "stats": {"elapsed_ms": 2.0, "access_path": "index"}})
    d = client.RemoteDatabase.__new__(client.RemoteDatabase)
    d.__dict__.update(db.__dict__)
    d._http = httpx.Client(base_url=served.url, transport=httpx.MockTransport(handler))
    d._fences = {}
    slept: list[float] = []
    d._sleep = slept.append
    try:
        replies[:] = [busy(), busy("0.5"), ok]
        res = d.sql("SELECT k FROM x")
        assert res.rows() == [{"n": 1}] and slept == [2.0, 0.5] and len(seen) == 3 and res.seconds == 0.002
        replies[:] = [busy("600")] * 4
        slept.clear()
        with pytest.raises(rtindex.OverloadedError) as e:
            d.sql("SELECT k FROM x")
        assert e.value.retry_after == 600 and slept == [30.0] * 3  # bounded
        replies[:] = [busy()] * 3 + [httpx.Response(200, json={"items": [{"_id": 1, "status": "ADDED", "error": None}],
                                                                "fence": "x/1/3"})]
        st = client.RemoteCollection(d, "x", 1).ingest([{"_id": 1}])
        assert st.ids == [1] and st.fence == "x/1/3" and d._fences["x"].counters == (3,)
        replies[:] = [httpx.Response(503, json={"type": "StorageError", "message": "disk full"})]
        with pytest.raises(rtindex.StorageError, match="disk full"):
            d.collection_names()
        replies[:] = [httpx.Response(408, json={"type": "Timeout", "message": "ran past", "limit": "timeout_ms"})]
        with pytest.raises(client.QueryTimeoutError) as e:
            d.sql("SELECT k FROM x", timeout_ms=5)
        assert isinstance(e.value, TimeoutError)
    finally:
        d._http.close()


def test_ingest_rides_out_a_restarting_ingest_process_and_says_where_to_resume(tmp_path, monkeypatch):
    """The ingest process killed in the middle of a remote ingest: the service answers 503
    until it is back, and the client sends the batch again; nothing is lost or doubled. A
    service that stays away: the error says how many documents were stored and where to
    resume, and ingesting again from there completes the data."""
    import re
    import signal
    import threading

    s = Served(str(tmp_path / "db"))
    key = s.admin_key  # (a restart shows no key: the first one stays good)
    docs = [{"_id": i, "v": i} for i in range(6000)]
    try:
        with rtindex.connect(s.url, api_key=s.admin_key) as d:
            coll = d.create_collection("c", shards=2)
            sent = []

            def on_send():
                sent.append(1)
                if len(sent) == 3:  # in the middle of the ingest
                    os.kill(s.children()["ingest"][0], signal.SIGKILL)
            Recorder(d, monkeypatch, on_send)
            st = coll.ingest(docs, batch_size=200)
            assert st.n == len(docs) and not st.errors
            assert len(sent) > len(docs) // 200  # some batch went twice
            monkeypatch.undo()
            assert coll.count() == len(docs)
            assert d.sql("SELECT COUNT(DISTINCT v) AS n FROM c").rows() == [{"n": len(docs)}]
        with rtindex.connect(s.url, api_key=s.admin_key, ingest_retry_seconds=0.5) as d:
            coll = d.collection("c")
            more = [{"_id": f"m{i}", "v": i} for i in range(6000)]
            calls = []

            def stop_server():
                calls.append(1)
                if len(calls) == 4:
                    threading.Thread(target=s.stop).start()
                    s.proc.wait(60)
            Recorder(d, monkeypatch, stop_server)
            with pytest.raises(rtindex.StorageError) as e:
                coll.ingest(more, batch_size=500)
            note = " ".join(getattr(e.value, "__notes__", []))
            m = re.search(r"(\d+) documents of this ingest .* from input position (\d+) on", note)
            assert m, note
            stored, resume = int(m[1]), int(m[2])
            assert stored == resume == 1500  # three batches acknowledged before the service went away
    finally:
        s.stop()
    s = Served(str(tmp_path / "db"))
    try:
        with rtindex.connect(s.url, api_key=key) as d:
            d.collection("c").ingest(more[resume:], batch_size=500)
            assert d.collection("c").count() == len(docs) + len(more)
    finally:
        s.stop()


def test_json_path_works_as_embedded(db, tmp_path):
    answer = orjson.dumps({"data": {"items": [{"_id": i, "v": i} for i in range(5)]}})
    coll = db.create_collection(fresh(), shards=2)
    assert coll.ingest(answer, json_path="data.items").n == 5
    path = tmp_path / "answer.json"
    path.write_bytes(answer)
    assert coll.ingest_file(path, json_path="data.items").n == 5 and coll.count() == 5
    with pytest.raises(ValueError, match="holds a dict"):
        coll.ingest(answer, json_path="data")


def test_an_ingest_transformation_as_embedded(db):
    name = fresh("tr")
    coll = db.create_collection(name, shards=2, transformation="SELECT * EXCEPT (pw), k AS _id FROM _input "
                                                               "WHERE k IS NOT NULL")
    assert coll.transformation == "SELECT * EXCEPT (pw), k AS _id FROM _input WHERE k IS NOT NULL"
    stats = coll.ingest([{"k": "a", "pw": 1}, {"pw": 2}, {"k": "b"}], errors="report")
    assert (stats.n, stats.filtered, stats.ids) == (2, 1, ["a", "b"])
    assert coll.get("a") == {"_id": "a", "k": "a", "_event_time": coll.get("a")["_event_time"]}
    with pytest.raises(rtindex.SqlError, match="GROUP BY"):
        coll.set_transformation("SELECT k FROM _input GROUP BY k")
    coll.set_transformation(None)
    assert coll.transformation is None
    assert coll.ingest([{"_id": "c", "pw": 3}]).n == 1 and coll.get("c")["pw"] == 3
