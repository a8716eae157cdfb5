"""The relay (server/relay.py) of writes from a query process to the ingest process, on a real
``rtindex serve``: the ingest process gets the path as the client sent it, and no path a
client can send makes the relay fail or close the client's connection.
"""

from __future__ import annotations

from urllib.parse import quote

import httpx
import pytest

from tests.serving import Served


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = Served(str(tmp_path_factory.mktemp("relay") / "db"))
    yield s
    assert s.stop() == 0, "".join(s.output)
    assert "Traceback" not in "".join(s.output), "".join(s.output)  # nothing failed inside either


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
