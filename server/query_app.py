"""A query process: a read replica of the data directory behind the public port.

Layers, outermost first (all pure ASGI but the last):

0. Below ASGI, in the HTTP protocol (server/shedding.py), ``Front.shed`` refuses a query
   with a valid key that admission refuses now, before any task exists.
1. ``Front``: API keys and roles for every route, per-route metrics, and the lean path:
   the query routes go straight to ``QueryService`` instead of through FastAPI's
   routing, validation and serialization (docs/service.md has the measurement).
2. ``Admission`` (server/admission.py) on the query routes.
3. FastAPI for everything else: collection listing, document reads, metrics, keys, the
   write routes (relayed to the ingest process, server/relay.py) and the OpenAPI docs of
   every route, the query routes included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pyarrow as pa
from fastapi import Body, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, Field
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

import rtindex

from . import metrics, routes
from .admission import Admission
from .auth import KeyStore, key_from_headers, role_allows
from .config import ServerConfig
from .http import (ARROW_STREAM, ERRORS, HttpError, error_for, error_response, header, internal_error, json_response,
                   parse_json, path_name, read_body, send_bytes, send_error)
from .ingest_app import stored_doc
from .relay import Relay
from .routes import DOCS_ASSETS, OPEN_PATHS, required_role
from .shedding import LoopLag

log = logging.getLogger("rtindex.server")

QUERY_PATHS = {"/v1/query", "/v1/orgs/self/queries", "/v1/noop"}
MAX_QUERY_BODY = 1 << 20  # SQL text plus parameters
# seconds past timeout_ms before a query still running is answered 408 anyway: DuckDB's
# part stops within a batch of rows, the rest (parsing, index lookups, fetching rows) at its
# next step
OVERRUN_GRACE = 0.25
# seconds a query may still run after that 408 before this process gives up on it and exits
# (the supervisor starts another): a thread cannot be stopped from outside, so work that
# neither DuckDB's interrupt nor a step's check reaches would hold its query slot and a core
RUNAWAY_SECONDS = 10.0
RUNAWAY_EXIT = 3  # the exit code that says so
INLINE_ROWS = 64  # a point query matching at most this many rows runs on the event loop
# seconds between checks of a query's min_fence, first and most: each check is a wake-up of
# the event loop, and queries waiting long for their fences would otherwise keep it busy
FENCE_POLL = (0.0005, 0.008)


class QueryBody(BaseModel):
    """``POST /v1/query``."""

    sql: str = Field(description="one SELECT (docs/sql.md)")
    parameters: dict[str, Any] | list[Any] | None = Field(None, description=":name (object) or ? (array) values")
    min_fence: str | None = Field(None, description="wait until the writes of this fence are visible")
    timeout_ms: int | None = Field(None, description="give up after this long (default: the server's)")


class RocksetQueryBody(BaseModel):
    """``POST /v1/orgs/self/queries``: Rockset's shape."""

    sql: dict[str, Any] = Field(description='{"query": "...", "parameters": [{"name", "type", "value"}]}')


class QueryService:
    """Runs queries for both the lean route and the FastAPI one: one implementation."""

    def __init__(self, db: rtindex.Database, config: ServerConfig):
        self.db = db
        self.config = config
        self.limits = config.limits
        self.pool = ThreadPoolExecutor(config.max_concurrent_queries, thread_name_prefix="rtindex-query")
        self._watches: set[asyncio.Task] = set()  # of queries answered 408 still running

    # ------------------------------------------------------------ request -> query
    def native(self, req: Any) -> tuple[str, Any, str | None, int]:
        if not isinstance(req, dict) or not isinstance(req.get("sql"), str):
            raise HttpError(400, "BadRequest", 'give {"sql": "SELECT ...", "parameters": {...}}')
        return req["sql"], req.get("parameters"), req.get("min_fence"), self._timeout(req.get("timeout_ms"))

    def rockset(self, req: Any) -> tuple[str, Any, str | None, int]:
        sql = req.get("sql") if isinstance(req, dict) else None
        if not isinstance(sql, dict) or not isinstance(sql.get("query"), str):
            raise HttpError(400, "BadRequest", 'give {"sql": {"query": "SELECT ...", "parameters": [...]}}')
        params = {}
        for p in sql.get("parameters") or []:
            if not isinstance(p, dict) or not isinstance(p.get("name"), str):
                raise HttpError(400, "BadRequest", 'each parameter is {"name", "type", "value"}')
            params[p["name"]] = _rockset_value(p)
        return sql["query"], params, None, self._timeout(sql.get("timeout_ms"))

    def _timeout(self, ms: Any) -> int:
        if ms is None:
            return self.limits.default_query_ms
        if isinstance(ms, bool) or not isinstance(ms, int) or ms <= 0:
            raise HttpError(400, "BadRequest", "timeout_ms must be a positive integer")
        if ms > self.limits.max_query_ms:
            raise HttpError(400, "LimitExceeded", f"timeout_ms={ms} is over max_query_ms={self.limits.max_query_ms}",
                            limit="max_query_ms")
        return ms

    # ------------------------------------------------------------ running
    async def run(self, sql: str, params: Any, min_fence: str | None, timeout_ms: int,
                  arrow: bool, rockset: bool, queued_ms: float
                  ) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]], asyncio.Future | None]:
        """(status, content type, body, headers, the worker still running after a timeout).
        An Arrow reply carries its stats in the ``x-rtindex-stats`` header (JSON)."""
        if len(sql) > self.limits.max_sql_chars:
            raise HttpError(413, "LimitExceeded", f"the SQL text is {len(sql)} characters, over "
                                                  f"max_sql_chars={self.limits.max_sql_chars}", limit="max_sql_chars")
        t0 = time.perf_counter()
        deadline = t0 + timeout_ms / 1000.0
        if min_fence is not None:
            await self._wait_fence(min_fence, deadline, timeout_ms)
        staleness_ms = self.db.lag()["ms"]
        # a point query of a few rows is answered here, on the event loop: its work is
        # bounded, and shorter than handing it to a thread and back
        got = None if arrow else self._answer(self.db.try_point(sql, params, max_rows=INLINE_ROWS), arrow)
        if got is not None:
            body, res, n = got
        else:
            left_ms = max((deadline - time.perf_counter()) * 1000.0, 1.0)
            fut = asyncio.get_running_loop().run_in_executor(self.pool, self._execute, sql, params, arrow,
                                                             timeout_ms, left_ms)
            try:  # the query's own limit answers first (its thread free); this one, if the rest overran
                body, res, n = await asyncio.wait_for(asyncio.shield(fut), left_ms / 1000.0 + OVERRUN_GRACE)
            except asyncio.TimeoutError:
                metrics.QUERY_TIMEOUTS.inc()
                self._watch_runaway(fut, timeout_ms)
                return 408, b"application/json", HttpError(
                    408, "Timeout", f"the query ran past timeout_ms={timeout_ms}", limit="timeout_ms").body(), [], fut
        stats = {"elapsed_ms": round((time.perf_counter() - t0) * 1000.0, 3), "queued_ms": round(queued_ms, 3),
                 "staleness_ms": round(staleness_ms, 3),
                 "rows_matched": res.plan.matched_rows if res.plan is not None else None,
                 "access_path": res.access, "rows": n}
        metrics.STALENESS.observe(staleness_ms / 1000.0)
        if res.warnings:  # Result.warnings: a query that runs but almost surely is not what was meant
            stats["warnings"] = res.warnings
        if arrow:
            return 200, ARROW_STREAM.encode(), body, [(b"x-rtindex-stats", orjson.dumps(stats))], None
        key = b'"results"' if rockset else b'"rows"'
        warnings = b',"warnings":' + orjson.dumps(stats.pop("warnings")) if res.warnings else b""
        return (200, b"application/json",
                b"{" + key + b":" + body + b',"stats":' + orjson.dumps(stats) + warnings + b"}", [], None)

    def _watch_runaway(self, fut: asyncio.Future, timeout_ms: int) -> None:
        """Exit this process if the query of ``fut`` still runs RUNAWAY_SECONDS from now."""
        async def watch() -> None:
            await asyncio.wait([fut], timeout=RUNAWAY_SECONDS)
            if fut.done():
                if not fut.cancelled():
                    fut.exception()  # (answered 408 already: retrieved, so that asyncio does not log it)
                return
            log.error("rtindex serve: a query still runs %.0f s after its timeout_ms=%d and cannot be "
                      "interrupted: query process %d exits (the supervisor starts another)",
                      RUNAWAY_SECONDS, timeout_ms, os.getpid())
            logging.shutdown()
            os._exit(RUNAWAY_EXIT)
        task = asyncio.get_running_loop().create_task(watch())
        self._watches.add(task)
        task.add_done_callback(self._watches.discard)

    async def _wait_fence(self, fence: str, deadline: float, timeout_ms: int) -> None:
        pause = FENCE_POLL[0]  # a replica is usually there within a few polls; then less often
        while not self.db.caught_up(fence):  # a FenceError is answered by http.ERRORS
            if time.perf_counter() >= deadline:
                raise HttpError(408, "Timeout", f"this replica did not reach min_fence within "
                                                f"timeout_ms={timeout_ms}", limit="timeout_ms")
            await asyncio.sleep(pause)
            pause = min(2 * pause, FENCE_POLL[1])

    def _execute(self, sql: str, params: Any, arrow: bool, timeout_ms: int,
                 left_ms: float) -> tuple[bytes, rtindex.Result, int]:
        """In a worker thread: the query, and its rows serialized (the event loop stays free).
        Its DuckDB work is interrupted ``left_ms`` from now, so the thread is free again then."""
        try:
            res = self.db.sql(sql, params, timeout_ms=left_ms)
        except rtindex.QueryTimeoutError:
            metrics.QUERY_TIMEOUTS.inc()
            raise HttpError(408, "Timeout", f"the query ran past timeout_ms={timeout_ms}", limit="timeout_ms") from None
        return self._answer(res, arrow)

    def _answer(self, res: rtindex.Result | None, arrow: bool) -> tuple[bytes, rtindex.Result, int] | None:
        """(body, result, rows) of a result (None: None), or the HttpError of one over a limit."""
        if res is None:
            return None
        n = len(res)
        if n > self.limits.max_result_rows:
            raise HttpError(413, "LimitExceeded", f"the result has {n} rows, over max_result_rows="
                                                  f"{self.limits.max_result_rows}: add a LIMIT or aggregate",
                            limit="max_result_rows")
        try:  # the database was opened with max_result_bytes: a result over it is refused unbuilt
            if arrow:
                sink = pa.BufferOutputStream()
                table = res.arrow()
                with pa.ipc.new_stream(sink, table.schema) as w:
                    w.write_table(table)
                body = sink.getvalue().to_pybytes()
            else:
                body = orjson.dumps(res.rows(), default=str, option=orjson.OPT_NON_STR_KEYS)
        except rtindex.ResultTooLargeError as e:
            raise HttpError(413, "LimitExceeded", f"the result is {e.rows} rows, {'about ' if e.estimated else ''}"
                                                  f"{e.size_bytes} bytes, over max_result_bytes={e.max_result_bytes}: "
                                                  "add a LIMIT or select fewer fields", limit="max_result_bytes") from None
        if len(body) > self.limits.max_result_bytes:
            raise HttpError(413, "LimitExceeded", f"the result is {len(body)} bytes, over max_result_bytes="
                                                  f"{self.limits.max_result_bytes}: add a LIMIT or select fewer fields",
                            limit="max_result_bytes")
        return body, res, n


def _rockset_value(p: dict) -> Any:
    """A Rockset query parameter's value by its type (Rockset sends values as strings)."""
    t, v = str(p.get("type", "string")).lower(), p.get("value")
    try:
        if v is None or t in ("string", "timestamp", "date", "datetime"):
            return v
        if t == "int":
            return int(v)
        if t == "float":
            return float(v)
        if t == "bool":
            return v if isinstance(v, bool) else str(v).lower() == "true"
    except (TypeError, ValueError):
        raise HttpError(400, "BadRequest", f"parameter {p.get('name')!r}: {v!r} is not a valid {t}") from None
    raise HttpError(400, "BadRequest", f"parameter {p.get('name')!r}: unknown type {t!r} "
                                       "(int, float, bool, string)")


class Front:
    """Keys, metrics and the lean query path, in front of everything (see the module doc)."""

    def __init__(self, app, service: QueryService, keys: KeyStore, config: ServerConfig, lag: LoopLag, *,
                 lean: bool = True):
        self.app = app
        self.service = service
        self.keys = keys
        self.auth = config.auth
        self.lean = lean
        # one admission control for the query routes, lean or through FastAPI
        self.admitted = Admission(self._route, QUERY_PATHS, config.max_concurrent_queries,
                                  config.queue_depth, config.queue_timeout_ms / 1000.0,
                                  metrics.AdmissionGauges(), lag)
        self._counted: dict[tuple[str, int], Any] = {}  # (route, status) -> its request counter
        self._latencies: dict[str, Any] = {}  # route -> its latency histogram
        # for shed(): each query route's path as the parser sees it, with the role it needs
        self._shed_needs = {p.encode(): required_role("POST", p) for p in QUERY_PATHS}

    def shed(self, method: bytes, path: bytes, headers: list[tuple[bytes, bytes]]) -> bytes | None:
        """server/shedding.py's gate: the 429 for a query with a valid key that admission
        refuses now, else None (the request is answered, or refused, by the ASGI path)."""
        need = self._shed_needs.get(path)
        if need is None or method != b"POST":
            return None
        refusal = self.admitted.refusal_now()
        if refusal is None:
            return None
        if self.auth:
            key = key_from_headers(headers)
            role = self.keys.role_of(key) if key else None
            if role is None or not role_allows(role, need):
                return None
        self.admitted.count_refusal()
        self._count(path.decode(), 429).inc()
        return refusal.raw

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = 500
        started = False  # a reply has begun (FastAPI's has, for an error it re-raises after its 500)

        async def send_status(msg):
            nonlocal status, started
            if msg["type"] == "http.response.start":
                status, started = msg["status"], True
            await send(msg)

        path, method = scope["path"], scope["method"]
        try:
            need = required_role(method, path)
            if need is not None and self.auth:
                key = key_from_headers(scope["headers"])
                role = self.keys.role_of(key) if key else None
                if role is None:
                    raise HttpError(401, "Unauthorized", "give a valid API key: Authorization: ApiKey <key>"
                                    if key is None else "this API key is not valid (revoked, or mistyped)")
                if not role_allows(role, need):
                    raise HttpError(403, "Forbidden", f"this API key's role is {role}; {method} {path} "
                                                      f"needs {need}")
            await self.admitted(scope, receive, send_status)
        except Exception as e:  # answered by http.ERRORS; anything else is logged
            err = error_for(e)
            if err is None:
                log.exception("rtindex serve: %s %r failed", method, path[:200])
            if not started:  # a started reply cannot be changed
                await send_error(send_status, err or internal_error())
        finally:
            route = scope.get("route")
            label = path if path in QUERY_PATHS or path in OPEN_PATHS else (
                route.path if route is not None else "unmatched")
            self._count(label, status).inc()
            self._latency(label).observe(time.perf_counter() - t0)

    def _count(self, label: str, status: int):
        counted = self._counted.get((label, status))
        if counted is None:  # labels() checks and looks up its values: once per route and status
            counted = self._counted[(label, status)] = metrics.REQUESTS.labels(label, str(status))
        return counted

    def _latency(self, label: str):
        observed = self._latencies.get(label)
        if observed is None:
            observed = self._latencies[label] = metrics.LATENCY.labels(label)
        return observed

    async def _route(self, scope, receive, send):
        if self.lean and scope["method"] == "POST" and scope["path"] in QUERY_PATHS:
            return await self._query(scope, receive, send)
        return await self.app(scope, receive, send)

    async def _query(self, scope, receive, send):
        """The lean query route (behind Admission)."""
        fut = None
        try:
            req = parse_json(await read_body(receive, MAX_QUERY_BODY, "max_query_body_bytes"))
            svc = self.service
            path = scope["path"]
            if path == "/v1/noop":
                return await send_bytes(send, 200, b'{"rows":[],"stats":{}}')
            sql, params, fence, timeout_ms = svc.rockset(req) if path != "/v1/query" else svc.native(req)
            arrow = path == "/v1/query" and (header(scope, b"accept") or "").startswith(ARROW_STREAM)
            status, ctype, body, headers, fut = await svc.run(
                sql, params, fence, timeout_ms, arrow, path != "/v1/query", scope.get("rtindex.queued_ms", 0.0))
            await send_bytes(send, status, body, ctype, headers)
        except Exception as e:  # answered here, inside admission; the rest by Front
            err = error_for(e)
            if err is None:
                raise
            await send_error(send, err)
        finally:
            if fut is not None:  # a timed-out query keeps its slot until its thread is done
                await asyncio.wait([fut])


def build_app(db: rtindex.Database, config: ServerConfig, *, lean: bool = True):
    """The query process's ASGI app (``lean=False`` sends queries through FastAPI too: the
    comparison docs/service.md reports)."""
    svc = QueryService(db, config)
    keys = KeyStore(config.data)
    relay = Relay(config.ingest_socket, config.limits.max_body_bytes)
    lag = LoopLag(config.max_loop_lag_ms / 1000.0)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(metrics.sample_forever(db))
        lag.start()
        yield
        lag.stop()
        task.cancel()
        await relay.aclose()
        svc.pool.shutdown(wait=True)

    # /docs and /redoc with their scripts and styles served from the package, not a CDN: a
    # machine without internet access shows them too
    app = FastAPIOffline(title="rtindex", version=rtindex.__version__, lifespan=lifespan, static_url=DOCS_ASSETS,
                         redirect_slashes=False,  # a path ending in "/" is answered, not redirected
                         description="Real-time indexing database for JSON: writes, SQL, Rockset-compatible routes. "
                                     "Every route but /healthz needs `Authorization: ApiKey <key>`.")

    async def _mapped_error(request: Request, e: Exception):
        """An exception of http.ERRORS (or an HttpError), answered by that table."""
        return error_response(error_for(e))

    for cls in (HttpError, *(row[0] for row in ERRORS)):
        app.add_exception_handler(cls, _mapped_error)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, e: Exception):
        """Any other: a 500 in the error shape (Front logs it)."""
        return error_response(internal_error())

    @app.exception_handler(StarletteHTTPException)
    async def _route_error(request: Request, e: StarletteHTTPException):
        """No such route, or not with this method: in the error shape of every other reply."""
        where = f"{request.method} {request.url.path[:200]}"
        if e.status_code == 404:
            return error_response(HttpError(404, "NotFound", f"no route {where} (the routes are listed at /docs)"))
        if e.status_code == 405:
            return error_response(HttpError(405, "MethodNotAllowed", f"{request.url.path[:200]} does not take "
                                                                      f"{request.method} (the routes: /docs)"))
        return error_response(HttpError(e.status_code, "BadRequest", str(e.detail)))

    async def query_reply(request: Request, parsed: tuple, rockset: bool) -> Response:
        arrow = not rockset and request.headers.get("accept", "").startswith(ARROW_STREAM)
        status, ctype, body, headers, fut = await svc.run(*parsed, arrow, rockset,
                                                          request.scope.get("rtindex.queued_ms", 0.0))
        background = BackgroundTask(asyncio.wait, [fut]) if fut is not None else None
        return Response(body, status_code=status, media_type=ctype.decode(), background=background,
                        headers={k.decode(): v.decode() for k, v in headers})

    @app.post("/v1/query", tags=["query"], summary="Run one SELECT")
    async def query(request: Request, body: QueryBody = Body(...)):
        return await query_reply(request, svc.native(body.model_dump()), False)

    @app.post("/v1/orgs/self/queries", tags=["rockset"], summary="Run one SELECT (Rockset's API)")
    async def rockset_query(request: Request, body: RocksetQueryBody = Body(...)):
        return await query_reply(request, svc.rockset(body.model_dump()), True)

    @app.post("/v1/noop", tags=["query"], summary="Does nothing, through the query path (benchmarks' ceiling)")
    async def noop(request: Request):
        return Response(b'{"rows":[],"stats":{}}', media_type="application/json")

    @app.get("/healthz", tags=["service"])
    async def healthz():
        lag = db.lag()
        ingest = await relay.healthy()
        return json_response({"status": "ok" if ingest else "degraded", "role": "query", "pid": os.getpid(),
                              "ingest": "ok" if ingest else "unreachable", "lag": lag}, 200 if ingest else 503)

    @app.get("/metrics", tags=["service"])
    async def get_metrics():
        metrics.observe_db(db)
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/collections", tags=["collections"], summary="Collections, with document counts and sizes")
    async def list_collections():
        out = []
        for name in db.collection_names():
            st = db[name].stats()
            out.append({"name": name, "shards": len(st["shards"]), "documents": st["documents"],
                        "disk_bytes": sum(s["disk_bytes"] for s in st["shards"])})
        return json_response({"collections": out})

    def collection(name: str) -> rtindex.Collection:
        if path_name("collection", name) not in db:
            raise HttpError(404, "NotFound", f"no collection named {name!r}")
        return db[name]

    @app.get("/v1/collections/{name}/docs/{doc_id:rest}", tags=["documents"], summary="One document by _id")
    async def get_doc(name: str, doc_id: str):
        coll = collection(name)
        found = stored_doc(coll, doc_id)
        if found is None:
            raise HttpError(404, "NotFound", f"no document with _id {doc_id!r} in collection {name!r}")
        return json_response(found[1])

    # writes: relayed to the ingest process, every route of the table it serves (their docs
    # here; the role each needs, from the table, ends the summary)
    async def relay_write(request: Request):
        return await relay.forward(request)

    docs_body = {"requestBody": {"content": {
        "application/json": {"schema": {"type": "array", "items": {"type": "object"}}},
        "application/x-ndjson": {"schema": {"type": "string"}}}}}
    relayed_docs = {
        "create_collection": dict(tags=["collections"], summary='Create a collection: {"name", "shards"?, '
                                                                '"transformation"?}',
                                  openapi_extra={"requestBody": {"content": {"application/json": {"schema": {
                                      "type": "object", "properties": {"name": {"type": "string"},
                                                                       "shards": {"type": "integer"},
                                                                       "transformation": {"type": "string"}}}}}}}),
        "drop_collection": dict(tags=["collections"], summary="Drop a collection and its data"),
        "post_docs": dict(tags=["documents"], summary="Add or replace documents: a JSON array, or NDJSON streamed",
                          openapi_extra=docs_body),
        "patch_doc": dict(tags=["documents"], summary="Apply a JSON Patch to one document",
                          openapi_extra={"requestBody": {"content": {"application/json": {"schema": {
                              "type": "array", "items": {"type": "object"}}}}}}),
        "delete_doc": dict(tags=["documents"], summary="Delete one document"),
        "add_source": dict(tags=["sources"], summary='Consume a Kafka topic into the collection: {"kind": "kafka", '
                                                     '"bootstrap_servers", "topic", "group"?, "start"?, "name"?, '
                                                     '"options"?} (docs/sources.md)',
                           openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                               "schema": {"type": "object", "properties": {
                                   "kind": {"type": "string", "enum": ["kafka"]},
                                   "bootstrap_servers": {"type": "string"}, "topic": {"type": "string"},
                                   "group": {"type": "string"}, "start": {"type": "string",
                                                                          "enum": ["earliest", "latest"]},
                                   "format": {"type": "string", "enum": ["json"]}, "name": {"type": "string"},
                                   "options": {"type": "object"}},
                                   "required": ["bootstrap_servers", "topic"]}}}}}),
        "list_sources": dict(tags=["sources"], summary="The collection's sources, with lag, rates and errors"),
        "get_source": dict(tags=["sources"], summary="One source's status"),
        "pause_source": dict(tags=["sources"], summary="Stop consuming, keeping the position"),
        "resume_source": dict(tags=["sources"], summary="Consume again"),
        "remove_source": dict(tags=["sources"], summary="Stop and forget the source, its stored offsets too"),
        "get_transformation": dict(tags=["collections"], summary="The collection's ingest transformation (SQL "
                                                                 "or null)"),
        "set_transformation": dict(tags=["collections"], summary='Set the ingest transformation for documents '
                                                                 'from now on: {"sql": "SELECT ... FROM _input"}',
                                   openapi_extra={"requestBody": {"required": True, "content": {
                                       "application/json": {"schema": {"type": "object", "properties": {
                                           "sql": {"type": "string"}}, "required": ["sql"]}}}}}),
        "remove_transformation": dict(tags=["collections"], summary="Store documents as they come from now on"),
        "rockset_create": dict(tags=["rockset"], summary='Create a collection in a workspace: {"name"}'),
        "rockset_docs": dict(tags=["rockset"], summary='Add documents: {"data": [...]}'),
        "rockset_patch": dict(tags=["rockset"], summary='Patch documents: {"data": [{"_id", "patch"}]}'),
    }
    for r in routes.served_by(routes.INGEST):
        docs = dict(relayed_docs.get(r.name, {}))
        docs["summary"] = f"{docs.get('summary', r.name)} ({r.role})"
        app.add_api_route(r.path, relay_write, methods=[r.method], name=r.name, **docs)

    @app.get("/v1/keys", tags=["keys"], summary="API keys (admin)")
    async def list_keys():
        return json_response({"keys": keys.list()})

    @app.post("/v1/keys", tags=["keys"], summary='Make an API key: {"role", "name"}; the key is shown once (admin)',
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
                  "type": "object", "properties": {"role": {"type": "string", "enum": ["read", "write", "admin"]},
                                                   "name": {"type": "string"}}}}}}})
    async def create_key(request: Request):
        body = parse_json(await request.body())  # (read here: FastAPI's 422 is not the error shape)
        if not isinstance(body, dict):
            raise HttpError(400, "BadRequest", 'give {"role": "read" | "write" | "admin", "name": ...}')
        key, entry = keys.create(body.get("role", "read"), body.get("name", ""))
        return json_response({**entry, "key": key}, 201)

    @app.delete("/v1/keys/{key_id}", tags=["keys"], summary="Revoke an API key (admin)")
    async def revoke_key(key_id: str):
        if not keys.revoke(key_id):
            raise HttpError(404, "NotFound", f"no API key with id {key_id!r}")
        return json_response({"id": key_id, "revoked": True})

    def openapi() -> dict:
        """The schema, with the API-key header declared (so /docs has an Authorize button;
        enter ``ApiKey <key>``). The key is checked in ``Front``, for every route."""
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            schema.setdefault("components", {})["securitySchemes"] = {
                "ApiKey": {"type": "apiKey", "in": "header", "name": "Authorization",
                           "description": "ApiKey <key> (or Bearer <key>)"}}
            schema["security"] = [{"ApiKey": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
    return Front(app, svc, keys, config, lag, lean=lean)
