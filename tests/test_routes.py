"""The route table (server/routes.py) and the exception-to-status table (server/http.py).

The ingest process's routes, the query process's relay list and the key check all come from
the route table: a unit test checks that the built apps and the check agree with it, and a
real ``rtindex serve`` is walked through every row of it with no key and a key of each role.
"""

from __future__ import annotations

import itertools
import re

import httpx
import pytest
from starlette.requests import ClientDisconnect
from starlette.routing import Mount, compile_path

import rtindex
from rtindex.server import ingest_app, query_app, routes
from rtindex.server.auth import ROLES
from rtindex.server.config import ServerConfig
from rtindex.server.http import ERRORS, HttpError, error_for
from tests.serving import module_service

# a value for each path parameter of the table
SAMPLE = {"name": "walk", "doc_id": "1", "ws": "commons", "coll": "walk", "key_id": "k_000000000000",
          "path": "none.js", "source": "nosuch"}


def sample_path(r: routes.Endpoint, **given: str) -> str:
    values = {**SAMPLE, **given}

    def value(m: re.Match) -> str:
        assert m.group(1) in values, f"add a sample value of {{{m.group(1)}}} for {r.method} {r.path}"
        return values[m.group(1)]

    return re.sub(r"{(\w+)(?::\w+)?}", value, r.path)


def app_routes(app) -> set[tuple[str, str, str]]:
    """(method, path template, name) of every route of a Starlette or FastAPI app."""
    out = set()
    for route in app.routes:
        if isinstance(route, Mount):  # the docs' scripts and styles
            out.add(("GET", route.path + "/{path:path}", route.name))
            continue
        for method in route.methods - {"HEAD"}:
            out.add((method, route.path, route.name))
    return out


def test_the_table_the_relay_list_and_the_role_check_agree(tmp_path):
    keys = [(r.method, r.path) for r in routes.ROUTES]
    assert len(keys) == len(set(keys)), "a (method, path) is in the table twice"
    assert all(r.role in (None, *ROLES) and r.process in (routes.INGEST, routes.QUERY) for r in routes.ROUTES)
    assert routes.UNLISTED_ROLE in ROLES
    table = {(r.method, r.path, r.name) for r in routes.ROUTES}
    ingest_rows = {(r.method, r.path, r.name) for r in routes.served_by(routes.INGEST)}
    config = ServerConfig(data=str(tmp_path / "db"), ingest_socket=str(tmp_path / "ingest.sock"))
    with rtindex.open(config.data) as writer, rtindex.open(config.data, role="reader") as reader:
        # the ingest process serves its rows (and its private health check), nothing else
        ingest = ingest_app.build_app(writer, config).app
        assert app_routes(ingest) == ingest_rows | {("GET", "/healthz", "healthz")}
        # a query process serves every row: its own, and the ingest process's by relaying them
        front = query_app.build_app(reader, config)
        try:
            assert app_routes(front.app) == table
            relayed = {(m, route.path) for route in front.app.routes
                       if getattr(getattr(route, "endpoint", None), "__name__", "") == "relay_write"
                       for m in route.methods}
            assert relayed == {(m, p) for m, p, _ in ingest_rows}
        finally:
            front.service.pool.shutdown()
    # the key check: every row's role, whatever its path holds
    for r in routes.ROUTES:
        for path in (sample_path(r), sample_path(r) + "\n"):  # a pattern's end matches before a final line break
            got = routes.endpoint_of(r.method, path)
            assert got == r, (r, path, got)
            assert query_app.required_role(r.method, path) == r.role
        if r.method == "GET":
            assert query_app.required_role("HEAD", sample_path(r)) == r.role
        for o in routes.ROUTES:  # no other row takes it, so the order of the routers' lists is moot
            assert o == r or o.method != r.method or not compile_path(o.path)[0].match(sample_path(r)), (r, o)
    assert {("POST", p) for p in query_app.QUERY_PATHS} <= {(r.method, r.path) for r in routes.ROUTES
                                                            if r.role == "read"}
    assert query_app.required_role("GET", "/v1/nowhere") == routes.UNLISTED_ROLE
    assert query_app.required_role("PUT", "/v1/keys") == routes.UNLISTED_ROLE  # the router answers 405
    assert query_app.required_role("GET", "/v1/collections/a/docs/x/y\nz") == "read"
    assert query_app.required_role("DELETE", "/v1/collections/a/docs/x/y\nz") == "write"


def test_one_table_answers_exceptions():
    """No row is hidden behind an earlier one, and the replies say what the error says."""
    for (a, *_), (b, *_) in itertools.combinations(ERRORS, 2):
        assert not issubclass(b, a), f"{b.__name__} comes after its base {a.__name__}: move it up"
    cases = [(rtindex.NotFoundError("no collection 'x'"), 404, "NotFound"),
             (rtindex.AlreadyExistsError("collection 'x' already exists"), 409, "AlreadyExists"),
             (rtindex.SqlError("no such column"), 400, "BadSql"),
             (rtindex.ResultTooLargeError(10, 1 << 30, 1 << 20, estimated=True), 413, "LimitExceeded"),
             (rtindex.QueryTimeoutError("too slow"), 408, "Timeout"),
             (rtindex.SchemaError("not a document"), 400, "BadRequest"),
             (rtindex.FenceError("not a fence"), 400, "BadRequest"),
             (rtindex.StorageError("disk full"), 503, "StorageError"),
             (rtindex.InvalidArgumentError("role must be one of read, write, admin"), 400, "BadRequest"),
             (rtindex.IngestError("no document was stored", None), 400, "BadRequest"),
             (ClientDisconnect(), 499, "ClientClosedRequest")]
    for e, status, type_ in cases:
        err = error_for(e)
        assert (err.status, err.type, err.message) == (status, type_, str(e))
    for bug in (RuntimeError("a bug"), KeyError("k"), ValueError("unknown type tag 9"), TypeError("t")):
        assert error_for(bug) is None, bug  # the server's own failure: a 500, its text not shown
    own = HttpError(429, "TooManyRequests", "later")
    assert error_for(own) is own


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from module_service(tmp_path_factory.mktemp("routes"))


def test_every_route_answers_by_its_role(served):
    """No key: 401; a key whose role is too weak: 403; a strong enough one: neither; never a
    5xx. Every row of the table, as the table has it (a new row is walked too)."""
    with served.client() as admin:
        keys = {"admin": served.admin_key}
        for role in ("read", "write"):
            r = admin.post("/v1/keys", json={"role": role, "name": f"walk {role}"})
            assert r.status_code == 201, r.text
            keys[role] = r.json()["key"]
        for name in ("walk", "walk_gone"):
            assert admin.post("/v1/collections", json={"name": name, "shards": 1}).status_code == 201
    new_name = (f"walk_new{i}" for i in itertools.count())
    bodies = {
        "create_collection": lambda: {"name": next(new_name), "shards": 1},
        "rockset_create": lambda: {"name": next(new_name)},
        "post_docs": lambda: [{"_id": 1}],
        "patch_doc": lambda: [{"op": "add", "path": "/z", "value": 1}],
        "rockset_docs": lambda: {"data": [{"_id": 2}]},
        "rockset_patch": lambda: {"data": [{"_id": 2, "patch": [{"op": "add", "path": "/z", "value": 1}]}]},
        "query": lambda: {"sql": "SELECT COUNT(*) AS n FROM walk"},
        "rockset_query": lambda: {"sql": {"query": "SELECT COUNT(*) AS n FROM walk"}},
        "noop": lambda: {},
        "create_key": lambda: {"role": "read", "name": "walk"},
    }
    clients = {who: served.client(keys.get(who)) for who in (None, *ROLES)}
    try:
        for r in routes.ROUTES:
            path = sample_path(r, name="walk_gone") if r.name == "drop_collection" else sample_path(r)
            body = bodies.get(r.name, lambda: None)
            for who, c in clients.items():
                got = c.request(r.method, path, json=body())
                where = (r.method, path, who, got.status_code, got.text[:300])
                assert got.status_code < 500, where
                if r.role is None:
                    assert got.status_code not in (401, 403), where
                elif who is None:
                    assert got.status_code == 401 and got.json()["type"] == "Unauthorized", where
                elif ROLES.index(who) < ROLES.index(r.role):
                    assert got.status_code == 403 and r.role in got.json()["message"], where
                    # the same route, its path ending in a line break (the router still picks it)
                    again = c.request(r.method, path + "%0A", json=body())
                    assert again.status_code == 403, (*where, again.text)
                else:
                    assert got.status_code not in (401, 403), where
    finally:
        for c in clients.values():
            c.close()
