"""The service (issue 9): a real ``rtindex serve`` with its ingest and query processes.

Each test talks HTTP to the supervisor's port from separate clients, as users do; nothing
is mocked. One server is shared by the module; tests that stop or kill processes, or that
need other options, start their own.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import orjson
import pyarrow as pa
import pytest

import rtindex
from rtindex.server.config import Limits, ServerConfig, parse_limits
from tests.serving import Served, module_service


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from module_service(tmp_path_factory.mktemp("srv"), "--query-workers", "2")


@pytest.fixture(scope="module")
def admin(served):
    with served.client() as c:
        yield c


def make_key(admin: httpx.Client, role: str) -> str:
    r = admin.post("/v1/keys", json={"role": role, "name": f"test {role}"})
    assert r.status_code == 201, r.text
    return r.json()["key"]


def ndjson(docs) -> bytes:
    return b"".join(orjson.dumps(d) + b"\n" for d in docs)


def test_write_then_read_from_another_client_with_a_fence(served, admin):
    assert admin.post("/v1/collections", json={"name": "ev", "shards": 3}).status_code == 201
    r = admin.post("/v1/collections/ev/docs", json=[{"_id": i, "k": i % 3, "tags": ["a", f"t{i}"]} for i in range(50)])
    assert r.status_code == 200, r.text
    body = r.json()
    assert [it["status"] for it in body["items"]] == ["ADDED"] * 50 and body["fence"].startswith("ev/")
    with served.client(make_key(admin, "read")) as reader:  # another connection, another key
        q = reader.post("/v1/query", json={"sql": "SELECT COUNT(*) AS n FROM ev WHERE k = :k",
                                           "parameters": {"k": 1}, "min_fence": body["fence"]})
        assert q.status_code == 200, q.text
        assert q.json()["rows"] == [{"n": 17}]
        stats = q.json()["stats"]
        assert set(stats) >= {"elapsed_ms", "queued_ms", "staleness_ms", "rows_matched", "access_path"}
        # every write's fence, read at once from the other client: the write is there
        for v in range(5):
            fence = admin.post("/v1/collections/ev/docs", json=[{"_id": 7, "v": v}]).json()["fence"]
            rows = reader.post("/v1/query", json={"sql": "SELECT v FROM ev WHERE _id = 7",
                                                  "min_fence": fence}).json()["rows"]
            assert rows == [{"v": v}]
        # Arrow IPC
        a = reader.post("/v1/query", json={"sql": "SELECT _id, k FROM ev WHERE k = 2 ORDER BY _id"},
                        headers={"Accept": "application/vnd.apache.arrow.stream"})
        assert a.headers["content-type"].startswith("application/vnd.apache.arrow.stream")
        table = pa.ipc.open_stream(a.content).read_all()
        assert table.column("_id").to_pylist() == list(range(2, 50, 3))
        assert orjson.loads(a.headers["x-rtindex-stats"])["access_path"] in ("index", "scan")


def test_ndjson_streamed_with_per_item_status(served, admin):
    admin.post("/v1/collections", json={"name": "nd", "shards": 2})
    admin.post("/v1/collections/nd/docs", json=[{"_id": "x"}])
    lines = [{"_id": i} for i in range(2500)]  # several batches
    body = ndjson(lines[:1200]) + b"{broken\n" + b'{"_id": "x", "again": true}\n' + ndjson(lines[1200:]) \
        + b'{"_id": "nan", "v": NaN}'  # no final newline
    r = admin.post("/v1/collections/nd/docs", content=body, headers={"Content-Type": "application/x-ndjson"})
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert len(items) == 2503
    assert items[1200]["status"] == "ERROR" and "line 1201" in items[1200]["error"]
    assert items[1201] == {"_id": "x", "status": "REPLACED", "error": None}
    assert items[2502]["status"] == "ERROR" and items[0]["status"] == items[2501]["status"] == "ADDED"
    n = admin.post("/v1/query", json={"sql": "SELECT COUNT(*) AS n FROM nd", "min_fence": r.json()["fence"]})
    assert n.json()["rows"] == [{"n": 2501}]


def test_an_ndjson_line_over_the_document_limit_is_an_item_error(served, admin):
    """Skipped as it streams past (never held whole); the lines around it are stored."""
    admin.post("/v1/collections", json={"name": "huge", "shards": 1})
    big = b'{"_id": "big", "s": "' + b"x" * (5 << 20) + b'"}'

    def body():
        yield b'{"_id": 1}\n'
        for i in range(0, len(big), 65536):
            yield big[i:i + 65536]
        yield b'\n\n{"_id": 2}\n'

    r = admin.post("/v1/collections/huge/docs", content=body(), headers={"Content-Type": "application/x-ndjson"})
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert [it["status"] for it in items] == ["ADDED", "ERROR", "ADDED"]
    assert "line 2" in items[1]["error"] and "max_document_bytes" in items[1]["error"]


def test_documents_get_patch_delete_and_collections(served, admin):
    admin.post("/v1/collections", json={"name": "docs1", "shards": 1})
    f = admin.post("/v1/collections/docs1/docs", json=[{"_id": 5, "a": 1}, {"_id": "s", "a": 2}]).json()["fence"]
    admin.post("/v1/query", json={"sql": "SELECT 1 AS one FROM docs1 LIMIT 1", "min_fence": f})
    assert admin.get("/v1/collections/docs1/docs/5").json()["a"] == 1  # an integer _id by its URL spelling
    assert admin.get("/v1/collections/docs1/docs/s").json()["a"] == 2
    p = admin.patch("/v1/collections/docs1/docs/5", json=[{"op": "replace", "path": "/a", "value": 9}])
    assert p.status_code == 200 and p.json()["document"]["a"] == 9
    bad = admin.patch("/v1/collections/docs1/docs/5", json=[{"op": "replace", "path": "/nope/x", "value": 1}])
    assert bad.status_code == 400 and "patch" in bad.json()["message"]
    d = admin.delete("/v1/collections/docs1/docs/s")
    assert d.json()["status"] == "DELETED"
    admin.post("/v1/query", json={"sql": "SELECT 1 AS one FROM docs1 LIMIT 1", "min_fence": d.json()["fence"]})
    assert admin.get("/v1/collections/docs1/docs/s").status_code == 404
    assert admin.delete("/v1/collections/docs1/docs/s").status_code == 404
    assert admin.get("/v1/collections/nope/docs/1").json()["type"] == "NotFound"
    listed = {c["name"]: c for c in admin.get("/v1/collections").json()["collections"]}
    assert listed["docs1"]["documents"] == 1 and listed["docs1"]["disk_bytes"] >= 0
    assert admin.post("/v1/collections", json={"name": "docs1"}).status_code == 409
    assert admin.post("/v1/collections", json={"name": "bad name!"}).status_code == 400
    assert admin.delete("/v1/collections/docs1").json()["dropped"] is True
    assert admin.delete("/v1/collections/docs1").status_code == 404


def test_keys_and_roles_on_every_route(served, admin):
    admin.post("/v1/collections", json={"name": "sec", "shards": 1})
    keys = {role: make_key(admin, role) for role in ("read", "write")}
    routes = [  # (method, path, body, least role)
        ("GET", "/v1/collections", None, "read"),
        ("GET", "/v1/collections/sec/docs/1", None, "read"),
        ("POST", "/v1/query", {"sql": "SELECT COUNT(*) AS n FROM sec"}, "read"),
        ("POST", "/v1/orgs/self/queries", {"sql": {"query": "SELECT COUNT(*) AS n FROM sec"}}, "read"),
        ("GET", "/metrics", None, "read"),
        ("POST", "/v1/collections/sec/docs", [{"_id": 1}], "write"),
        ("PATCH", "/v1/collections/sec/docs/1", [{"op": "add", "path": "/z", "value": 1}], "write"),
        ("DELETE", "/v1/collections/sec/docs/1", None, "write"),
        ("POST", "/v1/orgs/self/ws/commons/collections/sec/docs", {"data": [{"_id": 2}]}, "write"),
        ("POST", "/v1/collections", {"name": "sec2"}, "admin"),
        ("DELETE", "/v1/collections/sec2", None, "admin"),
        ("GET", "/v1/keys", None, "admin"),
    ]
    order = ["read", "write", "admin"]
    for method, path, body, need in routes:
        for who in (None, "rtk_not-a-key", "read", "write", "admin"):
            key = served.admin_key if who == "admin" else keys.get(who, who)
            headers = {"Authorization": f"ApiKey {key}"} if key else {}
            r = httpx.request(method, served.url + path, json=body, headers=headers, timeout=30)
            if who in (None, "rtk_not-a-key"):
                assert r.status_code == 401, (method, path, who, r.text)
            elif order.index(who) < order.index(need):
                assert r.status_code == 403 and need in r.json()["message"], (method, path, who, r.text)
            else:
                assert r.status_code not in (401, 403), (method, path, who, r.text)
    assert httpx.get(served.url + "/healthz").status_code == 200  # open, for load balancers
    schema = httpx.get(served.url + "/openapi.json").json()
    assert schema["components"]["securitySchemes"]["ApiKey"]["name"] == "Authorization"
    documented = {(m.upper(), p) for p, ops in schema["paths"].items() for m in ops}
    assert documented >= {
        ("POST", "/v1/collections"), ("GET", "/v1/collections"), ("DELETE", "/v1/collections/{name}"),
        ("POST", "/v1/collections/{name}/docs"), ("GET", "/v1/collections/{name}/docs/{doc_id}"),
        ("PATCH", "/v1/collections/{name}/docs/{doc_id}"), ("DELETE", "/v1/collections/{name}/docs/{doc_id}"),
        ("POST", "/v1/query"), ("GET", "/metrics"), ("GET", "/healthz"), ("GET", "/v1/keys"), ("POST", "/v1/keys"),
        ("DELETE", "/v1/keys/{key_id}"), ("POST", "/v1/orgs/self/ws/{ws}/collections"),
        ("POST", "/v1/orgs/self/ws/{ws}/collections/{coll}/docs"),
        ("PATCH", "/v1/orgs/self/ws/{ws}/collections/{coll}/docs"), ("POST", "/v1/orgs/self/queries"),
    }, "every route is in the OpenAPI docs"
    # Bearer works too; a revoked key stops working (every process re-reads the key file)
    r = admin.post("/v1/keys", json={"role": "read"}).json()
    assert httpx.get(served.url + "/v1/collections", headers={"Authorization": f"Bearer {r['key']}"}).status_code == 200
    assert admin.delete(f"/v1/keys/{r['id']}").status_code == 200
    deadline = time.monotonic() + 5
    while httpx.get(served.url + "/v1/collections", headers={"Authorization": f"ApiKey {r['key']}"}).status_code != 401:
        assert time.monotonic() < deadline, "a revoked key still works"
        time.sleep(0.2)
    listed = admin.get("/v1/keys").json()["keys"]
    assert all("hash" not in k and "key" not in k for k in listed)
    with open(os.path.join(served.data, "_server", "api_keys.json")) as f:
        stored = f.read()
    assert served.admin_key not in stored and keys["read"] not in stored


def test_limits_and_bad_requests_are_clear(served, admin):
    admin.post("/v1/collections", json={"name": "lim", "shards": 1})
    r = admin.post("/v1/query", json={"sql": "SELECT * FROM lim WHERE " + " OR ".join(["a = 1"] * 30_000)})
    assert r.status_code == 413 and r.json()["limit"] == "max_sql_chars"
    r = admin.post("/v1/query", json={"sql": "DELETE FROM lim"})
    assert r.status_code == 400 and r.json()["type"] == "BadSql"
    r = admin.post("/v1/query", json={"sql": "SELECT * FROM read_csv('/etc/passwd')"})
    assert r.status_code in (400, 404) and "passwd" not in r.text.replace("'/etc/passwd'", "")
    r = admin.post("/v1/query", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["message"]
    r = admin.post("/v1/query", json={"sql": "SELECT 1", "timeout_ms": 10**9})
    assert r.status_code == 400 and r.json()["limit"] == "max_query_ms"
    r = admin.post("/v1/query", json={"sql": "SELECT * FROM nope"})
    assert r.status_code in (400, 404) and "nope" in r.json()["message"]
    r = admin.post("/v1/query", json={"sql": "SELECT 1 AS x FROM lim", "min_fence": "garbage"})
    assert r.status_code == 400 and "fence" in r.json()["message"]
    r = admin.post("/v1/collections/lim/docs", json={"not": "a list"})
    assert r.status_code == 400 and "array" in r.json()["message"]
    r = admin.post("/v1/collections/lim/docs", content=b'{"_id": "n3"}\n{"_id": "n4"}\n',
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "Content-Type: application/x-ndjson" in r.json()["message"]
    r = admin.post("/v1/collections/lim/docs", content=b'[{"_id": "n1", "x": NaN}, {"_id": "n2"}]',
                   headers={"Content-Type": "application/json"})  # a document of an array: an item error
    assert [it["status"] for it in r.json()["items"]] == ["ERROR", "ADDED"]
    assert "NaN and Infinity are not JSON" in r.json()["items"][0]["error"]
    for path, body in (("/v1/collections/lim/docs", b'{"_id": 1, "x": -Infinity}'),
                       ("/v1/collections/lim/docs/n2", b'[{"op": "add", "path": "/x", "value": NaN}]')):
        r = admin.request("PATCH" if path.endswith("/n2") else "POST", path, content=body,
                          headers={"Content-Type": "application/json"})  # the body is refused
        assert r.status_code == 400 and "NaN and Infinity are not JSON" in r.json()["message"], r.text
    r = admin.get("/v1/nowhere")  # routes that do not exist answer in the error shape of the others
    assert r.status_code == 404 and r.json() == {"type": "NotFound", "message": "no route GET /v1/nowhere "
                                                                                "(the routes are listed at /docs)"}
    r = admin.put("/v1/query", json={"sql": "SELECT 1"})
    assert r.status_code == 405 and r.json()["type"] == "MethodNotAllowed"
    # a declared size over the limit is refused before any of the body is read
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"POST /v1/collections/lim/docs HTTP/1.1\r\nHost: x\r\nAuthorization: ApiKey {served.admin_key}"
                     f"\r\nContent-Type: application/json\r\nContent-Length: {100 << 20}\r\n\r\n[".encode())
        sock.settimeout(10)
        reply = ""
        while not reply.endswith("}"):
            reply += sock.recv(65536).decode()
    assert reply.startswith("HTTP/1.1 413") and '"limit":"max_body_bytes"' in reply
    deep = {"a": 1}
    for _ in range(100):
        deep = {"d": deep}
    r = admin.post("/v1/collections/lim/docs", json=[{"_id": 1, **deep}, {"_id": 2}])
    items = r.json()["items"]
    assert items[0]["status"] == "ERROR" and "nesting deeper" in items[0]["error"] and items[1]["status"] == "ADDED"
    name, created, _ = r.json()["fence"].split("/")  # a fence no write has reached yet
    r = admin.post("/v1/query", json={"sql": "SELECT * FROM lim", "min_fence": f"{name}/{created}/{10**12}",
                                      "timeout_ms": 100})
    assert r.status_code == 408 and r.json()["limit"] == "timeout_ms"


def test_a_timed_out_query_stops_and_frees_its_slot(tmp_path):
    """A query past timeout_ms is answered 408 and stopped: the next ones are admitted and
    answered at once (its DuckDB work does not hold the only query slot)."""
    s = Served(str(tmp_path / "db"), "--max-concurrent-queries", "1", "--max-queued-queries", "0")
    try:
        with s.client() as c:
            c.post("/v1/collections", json={"name": "c", "shards": 1})
            c.post("/v1/collections/c/docs", json=[{"_id": i, "v": i} for i in range(200)])
            cross = "SELECT COUNT(*) AS n FROM c a1, c a2, c a3, c a4, c a5, c a6"
            for _ in range(3):
                t0 = time.perf_counter()
                r = c.post("/v1/query", json={"sql": cross, "timeout_ms": 300})
                assert r.status_code == 408 and r.json()["limit"] == "timeout_ms", r.text
                assert time.perf_counter() - t0 < 3.0
                r = c.post("/v1/query", json={"sql": "SELECT COUNT(*) AS n FROM c"})
                assert r.status_code == 200 and r.json()["rows"] == [{"n": 200}], r.text
    finally:
        assert s.stop() == 0


def test_rockset_surface_as_rockbench_uses_it(served):
    """The requests RockBench (DESTINATION=Rockset) makes, byte for byte in shape."""
    h = {"Authorization": f"ApiKey {served.admin_key}", "Content-Type": "application/json"}
    with httpx.Client(base_url=served.url, headers=h, timeout=30) as c:
        r = c.post("/v1/orgs/self/ws/commons/collections", json={"name": "bench"})
        assert r.status_code == 200 and r.json()["data"]["name"] == "bench"
        now_us = int(time.time() * 1_000_000)
        docs = [{"_id": f"{i:024d}", "_event_time": now_us + i, "generator_identifier": "DPRzvn4A4r",
                 "Name": {"First": "A", "Last": "B"}, "Tags": ["x"]} for i in range(20)]
        r = c.post("/v1/orgs/self/ws/commons/collections/bench/docs", json={"data": docs})
        assert r.status_code == 200  # RockBench counts anything else as an error
        assert {d["status"] for d in r.json()["data"]} == {"ADDED"} and r.json()["data"][0]["_collection"] == "bench"
        r = c.patch("/v1/orgs/self/ws/commons/collections/bench/docs",
                    json={"data": [{"_id": f"{3:024d}", "patch": [{"op": "replace", "path": "/Name/First", "value": "Z"},
                                                                  {"op": "add", "path": "/_ts", "value": now_us}]},
                                   {"_id": "missing", "patch": [{"op": "add", "path": "/x", "value": 1}]}]})
        assert r.status_code == 200
        assert [d["status"] for d in r.json()["data"]] == ["PATCHED", "ERROR"]
        sql = ("select UNIX_MICROS(max(_event_time)) as ts from \"commons\".\"bench\" where "
               f"generator_identifier = 'DPRzvn4A4r' and _event_time > TIMESTAMP_SECONDS({now_us // 1_000_000 - 120})")
        deadline = time.monotonic() + 5
        while True:
            r = c.post("/v1/orgs/self/queries", json={"sql": {"query": sql}})
            assert r.status_code == 200, r.text
            if r.json()["results"] and r.json()["results"][0]["ts"] == now_us + 19:
                break
            assert time.monotonic() < deadline, r.text
            time.sleep(0.01)
        p = c.post("/v1/orgs/self/queries", json={"sql": {
            "query": "SELECT COUNT(*) AS n FROM commons.bench WHERE generator_identifier = :g",
            "parameters": [{"name": "g", "type": "string", "value": "DPRzvn4A4r"}]}})
        assert p.json()["results"] == [{"n": 20}]


def test_api_docs_need_no_internet(served):
    """/docs and /redoc load their scripts and styles from the service itself, without a
    key (like the pages), so they show on a machine without internet access."""
    with served.client(None) as anyone:
        for page in ("/docs", "/redoc"):
            r = anyone.get(page)
            assert r.status_code == 200 and "cdn." not in r.text and "unpkg" not in r.text, r.text[:500]
            assets = re.findall(r'(?:src|href)="(/docs-assets/[^"]+)"', r.text)
            assert any(a.endswith(".js") for a in assets), r.text[:500]
            for asset in assets:
                got = anyone.get(asset)
                assert got.status_code == 200 and len(got.content) > 1000, asset
        assert anyone.get("/openapi.json").json()["info"]["title"] == "rtindex"
        assert anyone.get("/v1/collections").status_code == 401  # the rest still needs a key


def test_metrics_and_health(served, admin):
    admin.post("/v1/query", json={"sql": "SELECT 1 AS one FROM ev LIMIT 1"})
    text = admin.get("/metrics").text
    for name in ("rtindex_http_requests_total", "rtindex_http_request_seconds_bucket", "rtindex_queries_queued",
                 "rtindex_queries_refused_total", "rtindex_ingest_documents_total", "rtindex_ingest_bytes_total",
                 "rtindex_reader_lag_ms", "rtindex_row_cache", "rtindex_query_staleness_seconds_bucket"):
        assert name in text, name
    assert 'route="/v1/query"' in text
    for pid in served.children()["ingest"] + served.children()["query"]:  # every process samples its own
        assert f'rtindex_row_cache{{counter="hits",pid="{pid}"}}' in text, pid
    h = httpx.get(served.url + "/healthz").json()
    assert h["status"] == "ok" and h["ingest"] == "ok"


def test_an_idle_connection_is_still_open_when_reused(served):
    """Idle for longer than uvicorn's default keep-alive timeout, a connection is still open
    when the client reuses it: clients keep idle connections longer than that, and one that
    sends just as the server closes its end sees a reset."""
    def client_end(r: httpx.Response) -> tuple:
        return r.extensions["network_stream"].get_extra_info("client_addr")

    with served.client(limits=httpx.Limits(keepalive_expiry=60)) as c:  # httpx's own is shorter
        first = client_end(c.post("/v1/collections", json={"name": "idle", "shards": 1}))
        time.sleep(6.5)
        again = c.post("/v1/collections/idle/docs", json=[{"_id": 1}])  # relayed, too
        assert again.status_code == 200, again.text
        assert client_end(again) == first, "the server closed the idle connection"


def test_overload_is_refused_fast_and_bounded(tmp_path):
    s = Served(str(tmp_path / "db"), "--max-concurrent-queries", "1", "--max-queued-queries", "2",
               "--queue-timeout-ms", "5000", "--limit", "max_sql_chars=300")
    try:
        with s.client() as c:
            c.post("/v1/collections", json={"name": "big", "shards": 1})
            for i in range(0, 60_000, 10_000):
                c.post("/v1/collections/big/docs", json=[{"_id": j, "g": j % 97, "s": f"v{j}"} for j in range(i, i + 10_000)])
        slow = {"sql": "SELECT s, COUNT(*) AS n FROM big GROUP BY s ORDER BY n DESC, s LIMIT 5"}
        with s.client() as c:  # the configured limit, not the default
            r = c.post("/v1/query", json={"sql": "SELECT s FROM big WHERE g = 1" + " OR g = 1" * 40})
            assert r.status_code == 413 and r.json()["limit"] == "max_sql_chars" and "300" in r.json()["message"]

        def one(_):
            t = time.perf_counter()
            r = httpx.post(s.url + "/v1/query", json=slow, headers={"Authorization": f"ApiKey {s.admin_key}"},
                           timeout=60)
            return r.status_code, time.perf_counter() - t, r.headers.get("retry-after")

        with cf.ThreadPoolExecutor(24) as pool:
            results = list(pool.map(one, range(24)))
        ok = [r for r in results if r[0] == 200]
        refused = [r for r in results if r[0] == 429]
        assert len(ok) + len(refused) == 24, results
        assert 1 <= len(ok) <= 24 and refused, results  # some refused, the rest all answered
        assert all(r[2] == "1" for r in refused)
        with s.client() as c:
            assert "rtindex_queries_refused_total" in c.get("/metrics").text
    finally:
        assert s.stop() == 0


def test_sigterm_keeps_acknowledged_writes_and_sigkilled_query_process_comes_back(tmp_path):
    data = str(tmp_path / "db")
    s = Served(data)
    acked = 0
    try:
        with s.client() as c:
            c.post("/v1/collections", json={"name": "keep", "shards": 2})
            query_pid = s.children()["query"][0]
            os.kill(query_pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while True:  # the supervisor starts another; the service answers again
                try:
                    if c.get("/healthz").status_code == 200 and s.children()["query"] not in ([], [query_pid]):
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "".join(s.output)
                time.sleep(0.1)
            assert "restarting it" in "".join(s.output)
            # writes while the supervisor gets SIGTERM: every acknowledged one survives
            with cf.ThreadPoolExecutor(1) as pool:
                def writer():
                    n = 0
                    while True:
                        try:
                            r = c.post("/v1/collections/keep/docs", json=[{"_id": n * 10 + j} for j in range(10)])
                        except httpx.TransportError:
                            return n
                        if r.status_code != 200:
                            return n
                        n += 1
                fut = pool.submit(writer)
                time.sleep(1.0)
                assert s.stop() == 0
                acked = fut.result() * 10
    finally:
        s.stop()
    assert acked > 0
    with rtindex.open(data) as db:
        coll = db["keep"]
        assert all(coll.get(i) is not None for i in range(acked)), f"lost an acknowledged write of {acked}"


def test_children_ignore_a_source_checkout_in_the_working_directory(tmp_path):
    """`rtindex serve` run from a checkout of the source (the README's case, after a
    non-editable install) must not start its children on that checkout's uncompiled
    package: they run with the installed one."""
    shadow = tmp_path / "checkout" / "rtindex"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('the source checkout, not the installed package')\n")
    s = Served(str(tmp_path / "db"), cwd=str(shadow.parent))
    try:
        with s.client() as c:
            assert c.get("/healthz").json()["ingest"] == "ok"
    finally:
        assert s.stop() == 0, "".join(s.output)


def test_limits_from_the_command_line():
    assert parse_limits(["max_body_bytes=10", "max_sql_chars=5"]) == Limits(max_body_bytes=10, max_sql_chars=5)
    for bad, why in (["nope=1"], "NAME=VALUE"), (["max_body_bytes"], "NAME=VALUE"), \
            (["max_body_bytes=x"], "integer"), (["max_body_bytes=0"], "positive"):
        with pytest.raises(ValueError, match=why):
            parse_limits(bad)


def test_no_auth_only_on_loopback():
    with pytest.raises(ValueError, match="loopback"):
        ServerConfig(data="x", host="0.0.0.0", auth=False).check()
    ServerConfig(data="x", host="127.0.0.1", auth=False).check()
    ServerConfig(data="x", host="::1", auth=False).check()


def test_demo_is_loaded_by_the_ingest_process_and_answers_the_banners_query(tmp_path):
    """`rtindex serve --demo` (the README's first command): the demo collection is there when
    the banner shows, its query answers, and the supervisor did not load the data itself
    (it lives as long as the service and would keep that memory)."""
    import psutil

    s = Served(str(tmp_path / "db"), "--demo")
    try:
        out = "".join(s.output)
        assert "loading 20,000 demo events" in out
        with s.client() as c:
            r = c.post("/v1/query", json={"sql": "SELECT COUNT(*) AS n FROM demo_events"})
            assert r.status_code == 200 and r.json()["rows"] == [{"n": 20_000}]
            banner_sql = re.search(r'"sql": "([^"]+)"', out).group(1)
            r = c.post("/v1/query", json={"sql": banner_sql})
            assert r.status_code == 200 and len(r.json()["rows"]) == 3
        supervisor = psutil.Process(s.proc.pid).memory_info().rss
        ingest = psutil.Process(s.children()["ingest"][0]).memory_info().rss
        assert supervisor < ingest, (supervisor, ingest)
    finally:
        assert s.stop() == 0
    restarted = Served(str(tmp_path / "db"), "--demo")  # loaded once: a restart keeps it
    try:
        assert "loading" not in "".join(restarted.output)
    finally:
        restarted.stop()


def test_a_start_that_cannot_listen_makes_no_admin_key(tmp_path):
    """The port is busy: the start fails before it makes a key nobody would see; the next
    start shows the first admin key, and a later one names how to make an admin key."""
    data = str(tmp_path / "db")
    with socket.create_server(("127.0.0.1", 0)) as busy:
        out = subprocess.run([sys.executable, "-P", "-m", "rtindex", "serve", "--data", data, "--port",
                              str(busy.getsockname()[1])], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "cannot listen on" in out.stderr + out.stdout
    assert "rtk_" not in out.stdout + out.stderr
    first = Served(data)
    try:
        assert first.admin_key is not None
    finally:
        first.stop()
    again = Served(data)
    try:
        text = "".join(again.output)
        assert again.admin_key is None and "--role admin" in text and "--role read" not in text
    finally:
        again.stop()
