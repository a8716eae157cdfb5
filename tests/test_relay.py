"""The relay (server/relay.py) of writes from a query process to the ingest process, on a real
``rtindex serve``: the ingest process gets the path as the client sent it, and no path a
client can send makes the relay fail or close the client's connection.
"""

from __future__ import annotations

import socket
from urllib.parse import quote, urlsplit

import httpx
import pytest

from tests.serving import module_service


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from module_service(tmp_path_factory.mktemp("relay"))


def connection(r: httpx.Response) -> tuple:
    """The client end (address, port) of the connection a reply came on."""
    return r.extensions["network_stream"].get_extra_info("client_addr")


def test_control_characters_in_a_path_are_4xx_on_the_same_connection(served):
    with served.client() as c:
        assert c.post("/v1/collections", json={"name": "c", "shards": 1}).status_code == 201
        first = connection(c.get("/healthz"))
        asked = [  # (method, path, body, status, what the message names)
            ("DELETE", "/v1/collections/%01", None, 400, "invalid collection name '\\x01'"),
            ("POST", "/v1/collections/%01/docs", [{"_id": 1}], 400, "invalid collection name '\\x01'"),
            ("PATCH", "/v1/collections/c/docs/%1C", [{"op": "add", "path": "/a", "value": 1}], 404,
             "no document with _id '\\x1c'"),
            ("DELETE", "/v1/collections/c/docs/%7F", None, 404, "no document with _id '\\x7f'"),
            ("POST", "/v1/orgs/self/ws/%01/collections", {"name": "x"}, 400, "invalid workspace name '\\x01'"),
            ("POST", "/v1/orgs/self/ws/commons/collections/%01/docs", {"data": [{}]}, 400,
             "invalid collection name '\\x01'"),
            ("POST", "/v1/collections/c/docs?x=%01", b"\x01", 400, "not valid JSON"),
        ]
        for method, path, body, status, named in asked:
            kw = {"content": body} if isinstance(body, bytes) else {"json": body}
            r = c.request(method, path, **kw)
            assert (r.status_code, r.json()["type"]) == (status, "NotFound" if status == 404 else "BadRequest"), \
                (method, path, r.text)
            assert named in r.json()["message"], (method, path, r.text)
            assert connection(r) == first, f"{method} {path}: the server closed the connection"
        # an id with a control character is an id like any other (rtindex accepts it)
        for doc_id in ("\x01", "\x1c", "\x7f", "line\nbreak", "trailing\n"):
            w = c.post("/v1/collections/c/docs", json=[{"_id": doc_id, "v": 1}])
            assert w.json()["items"][0]["status"] == "ADDED", w.text
            p = c.patch(f"/v1/collections/c/docs/{quote(doc_id)}", json=[{"op": "add", "path": "/v", "value": 2}])
            assert p.status_code == 200 and p.json()["_id"] == doc_id, p.text
            d = c.delete(f"/v1/collections/c/docs/{quote(doc_id)}")
            assert d.status_code == 200 and d.json()["_id"] == doc_id, d.text
            assert connection(d) == first
        assert c.get("/healthz").status_code == 200 and connection(c.get("/healthz")) == first


def test_the_ingest_process_gets_the_path_as_sent(served):
    """Escapes that decode to a slash, a percent sign, a question mark or a space name the same
    document in both processes: the key check and the write agree on what was asked."""
    with served.client() as c:
        c.post("/v1/collections", json={"name": "ids", "shards": 2})
        ids = ["a/b", "100%", "what?", "x y", "#hash", "caf\u00e9", "%41", "a+b"]
        c.post("/v1/collections/ids/docs", json=[{"_id": i, "v": 0} for i in ids])
        for doc_id in ids:
            p = c.patch(f"/v1/collections/ids/docs/{quote(doc_id, safe='')}", json=[
                {"op": "replace", "path": "/v", "value": 1}])
            assert p.status_code == 200 and p.json()["document"] == {"_id": doc_id, "v": 1,
                                                                     "_event_time": p.json()["document"]["_event_time"]}
        assert c.delete("/v1/collections/ids/docs/%2541").json()["_id"] == "%41"  # not "A"
        assert c.delete("/v1/collections/ids/docs/A").status_code == 404


def raw_request(url: str, method: str, path: str, key: str) -> tuple[int, bytes]:
    """One request with its path exactly as given: HTTP clients resolve "." and ".." first."""
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: ApiKey {key}\r\n"
                  "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_dot_segments_never_reach_another_route(served):
    """A write key checked for a document route must not be relayed to a collection route."""
    with served.client() as c:
        for name in ("dots", "victim"):
            assert c.post("/v1/collections", json={"name": name, "shards": 1}).status_code == 201
        key = c.post("/v1/keys", json={"name": "writer", "role": "write"}).json()["key"]
        c.post("/v1/collections/dots/docs", json=[{"_id": "..", "v": 1}])
        for method, path in [("DELETE", "/v1/collections/dots/docs/../../victim"),
                             ("DELETE", "/v1/collections/dots/docs/./../../victim"),
                             ("PATCH", "/v1/collections/dots/docs/.."),
                             ("DELETE", "/v1/collections/dots/docs/x/../../../victim/docs/a")]:
            status, body = raw_request(served.url, method, path, key)
            assert status == 400 and b"'.' or '..'" in body, (method, path, status, body)
        # percent-encoded dots are an ordinary _id, in the collection the path names
        status, body = raw_request(served.url, "DELETE", "/v1/collections/dots/docs/%2E%2E", key)
        assert status == 200 and b'"_id":".."' in body, body
        status, body = raw_request(served.url, "DELETE", "/v1/collections/dots/docs/%2e%2e/%2e%2e/victim", key)
        assert status == 404 and b"collection 'dots'" in body, body
        w = c.post("/v1/collections/victim/docs", json=[{"_id": "still", "v": 1}])  # 404 once dropped
        assert w.status_code == 200 and w.json()["items"][0]["status"] == "ADDED", w.text
