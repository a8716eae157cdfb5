"""The ingest process: the one writer of the data directory, serving writes.

It listens on a private Unix socket and is reached only through the query processes,
which checked the caller's key and relay the request bytes unparsed (server/relay.py).
Bodies are read as they arrive: a JSON array whole (it is bounded by ``max_body_bytes``),
NDJSON a line at a time into bounded batches that are stored as they fill, so a large
upload never sits in memory at once. ``ingest()`` runs in a worker thread so the event
loop keeps receiving other requests' bytes meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import re
from typing import Any

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

import rtindex
from rtindex.sources import unsafe_options

from . import metrics, routes
from .config import ServerConfig
from .http import (NDJSON, HttpError, error_for, error_response, internal_error, json_response, loads, path_name,
                   send_error, too_large)

log = logging.getLogger("rtindex.server")

BATCH_DOCS = 1_000
BATCH_BYTES = 4 << 20


class WriteBudget:
    """The in-flight write-bytes limit: a request reserves its declared size (or the body
    limit, when it declares none) before its body is read, and gets 429 when that would
    pass ``max_inflight_write_bytes``. Pure ASGI, in front of the write routes."""

    def __init__(self, app, config: ServerConfig):
        self.app = app
        self.limits = config.limits
        self.inflight = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PATCH"):
            return await self.app(scope, receive, send)
        declared = None
        for k, v in scope["headers"]:
            if k == b"content-length":
                declared = int(v) if v.isdigit() else None
        if declared is not None and declared > self.limits.max_body_bytes:
            return await send_error(send, too_large("max_body_bytes", self.limits.max_body_bytes, "the request body"))
        need = declared if declared is not None else self.limits.max_body_bytes
        if self.inflight and self.inflight + need > self.limits.max_inflight_write_bytes:
            metrics.WRITES_THROTTLED.inc()
            return await send_error(send, HttpError(
                429, "TooManyRequests",
                f"{self.inflight} bytes of writes are in flight; max_inflight_write_bytes="
                f"{self.limits.max_inflight_write_bytes}: retry after the Retry-After seconds",
                limit="max_inflight_write_bytes", headers=[(b"retry-after", b"1")]))
        self.inflight += need
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight -= need


class IngestService:
    def __init__(self, db: rtindex.Database, config: ServerConfig):
        self.db = db
        self.config = config
        self.limits = config.limits

    # ---------------------------------------------------------------- helpers
    def collection(self, name: str) -> rtindex.Collection:
        if path_name("collection", name) not in self.db:
            raise HttpError(404, "NotFound", f"no collection named {name!r}")
        return self.db[name]

    async def _ingest(self, coll: rtindex.Collection, docs: list, first: int, items: list,
                      names: list[str] | None = None) -> str:
        """Store one batch (documents, or each one's JSON text as bytes: stored and indexed as
        it came); append each document's status to ``items``; the fence. ``names``: what an
        error calls each document (else "document <position>")."""
        # errors="report": each document's outcome goes into the reply; nothing is raised
        stats = await anyio.to_thread.run_sync(functools.partial(coll.ingest, docs, errors="report", progress=False))
        errors = {e.index: e for e in stats.errors}
        replaced = set(stats.replaced)
        for i in range(len(docs)):
            doc_id = stats.doc_ids.get(i)
            e = errors.get(i)
            if e is None and doc_id is None:  # neither stored nor refused: the transformation's WHERE left it out
                items.append({"_id": None, "status": "FILTERED", "error": None})
            elif e is not None:
                name = names[i] if names is not None else f"document {first + i}"
                items.append({"_id": doc_id, "status": "ERROR",
                              "error": f"{name}: {e.message}" + (f" at {e.path}" if e.path != "$" else "")})
            else:
                items.append({"_id": doc_id, "status": "REPLACED" if i in replaced else "ADDED", "error": None})
        metrics.INGEST_DOCS.inc(stats.n)
        metrics.INGEST_BYTES.inc(stats.bytes)
        if stats.errors:
            metrics.INGEST_ERRORS.inc(len(stats.errors))
        return stats.fence

    async def _body(self, request: Request) -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.limits.max_body_bytes:
                raise too_large("max_body_bytes", self.limits.max_body_bytes, "the request body")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _json(self, request: Request):
        body = await self._body(request)
        try:
            return loads(body)
        except orjson.JSONDecodeError as e:
            raise not_json(body, e) from None

    async def _documents(self, request: Request, member: str | None) -> list:
        """The documents of a JSON array body (or of the array at ``member`` of a JSON object
        body), each as its JSON text: they are stored and indexed as they came."""
        body = await self._body(request)
        docs = rtindex.documents_of(body, member)
        if docs is not None:
            return docs
        try:  # not an array as expected: say what is wrong with it
            parsed = loads(body)
        except orjson.JSONDecodeError as e:
            raise not_json(body, e) from None
        if member is None:
            if not isinstance(parsed, list):
                raise HttpError(400, "BadRequest", "the body must be a JSON array of documents "
                                                   f"(or NDJSON sent as {NDJSON})")
            return parsed
        if not isinstance(parsed, dict) or not isinstance(parsed.get(member), list):
            raise HttpError(400, "BadRequest", f'give {{"{member}": [documents]}}')
        return parsed[member]

    def _check_count(self, n: int) -> None:
        if n > self.limits.max_docs_per_request:
            raise too_large("max_docs_per_request", self.limits.max_docs_per_request,
                            f"a request of {n} documents")

    async def write_docs(self, coll: rtindex.Collection, docs: list, request: Request) -> tuple[list, str]:
        self._check_count(len(docs))
        items: list = []
        fence = coll.fence()
        for start in range(0, len(docs), BATCH_DOCS):
            if start:
                await _still_connected(request)
            fence = await self._ingest(coll, docs[start:start + BATCH_DOCS], start, items)
        return items, fence

    async def write_ndjson(self, coll: rtindex.Collection, request: Request) -> tuple[list, str]:
        """NDJSON, stored in batches as lines arrive. A line that is not JSON, or longer
        than ``max_document_bytes`` (skipped as it streams past, never held), is that
        item's error; the others are stored."""
        max_doc = self.limits.max_document_bytes
        max_docs = self.limits.max_docs_per_request
        items: list = []
        state = {"fence": coll.fence(), "first": 0}  # first: input position of batch[0]
        batch: list = []  # (line number, line bytes, or None for a line too long)
        batch_bytes = 0

        async def flush():
            slots: list = []
            good: list = []
            names: list = []
            for line_no, line in batch:
                if line is None:
                    slots.append({"_id": None, "status": "ERROR",
                                  "error": f"line {line_no} is over max_document_bytes={max_doc}"})
                    continue
                good.append(line)  # indexed as it came: a line that is not a document is its item's error
                names.append(f"line {line_no}")
                slots.append(None)
            done: list = []
            if state["first"]:
                await _still_connected(request)
            if good:
                state["fence"] = await self._ingest(coll, good, state["first"], done, names)
            it = iter(done)
            items.extend(s if s is not None else next(it) for s in slots)
            state["first"] += len(batch)
            batch.clear()

        async def add(line_no: int, line: bytes | None):
            nonlocal batch_bytes
            if line is not None and not line.strip():
                return
            if state["first"] + len(batch) >= max_docs:
                await flush()
                raise too_large("max_docs_per_request", max_docs,
                                f"the request (its first {state['first']} documents, up to line "
                                f"{line_no - 1}, were processed and are in the store)")
            batch.append((line_no, line))
            batch_bytes += len(line or b"")
            if len(batch) >= BATCH_DOCS or batch_bytes >= BATCH_BYTES:
                await flush()
                batch_bytes = 0

        pending = b""
        skipping = False  # inside a line too long to keep
        line_no = 0
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.limits.max_body_bytes:
                raise too_large("max_body_bytes", self.limits.max_body_bytes, "the request body")
            if skipping:
                nl = chunk.find(b"\n")
                if nl < 0:
                    continue
                chunk, skipping = chunk[nl + 1:], False
                line_no += 1
                await add(line_no, None)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                line_no += 1
                await add(line_no, line if len(line) <= max_doc else None)
            if len(pending) > max_doc:
                pending, skipping = b"", True
        if skipping or pending.strip():
            line_no += 1
            await add(line_no, None if skipping else pending)
        await flush()
        return items, state["fence"]

    # ---------------------------------------------------------------- native routes
    def _create(self, name: str, shards, transformation) -> rtindex.Collection:
        """Create a collection for either API's route, with the same refusals."""
        if transformation is not None and not isinstance(transformation, str):
            raise HttpError(400, "BadRequest", "an ingest transformation is a SQL text: SELECT ... FROM _input")
        return self.db.create_collection(name, shards=shards, transformation=transformation)

    async def create_collection(self, request: Request) -> Response:
        body = await self._json(request)
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise HttpError(400, "BadRequest", 'give {"name": ..., "shards": ..., "transformation": ...} (shards '
                                               "optional, default 4; transformation optional)")
        coll = self._create(body["name"], body.get("shards", 4), body.get("transformation"))
        return json_response({"name": coll.name, "shards": coll.n_shards, "transformation": coll.transformation,
                              "fence": coll.fence()}, 201)

    # ---------------------------------------------------------------- ingest transformation
    async def get_transformation(self, request: Request) -> Response:
        coll = self.collection(request.path_params["name"])
        return json_response({"collection": coll.name, "sql": coll.transformation})

    async def set_transformation(self, request: Request) -> Response:
        coll = self.collection(request.path_params["name"])
        body = await self._json(request)
        if not isinstance(body, dict) or not isinstance(body.get("sql"), str) or set(body) != {"sql"}:
            raise HttpError(400, "BadRequest", 'give {"sql": "SELECT ... FROM _input [WHERE ...]"}')
        await anyio.to_thread.run_sync(coll.set_transformation, body["sql"])
        return json_response({"collection": coll.name, "sql": coll.transformation})

    async def remove_transformation(self, request: Request) -> Response:
        coll = self.collection(request.path_params["name"])
        await anyio.to_thread.run_sync(coll.set_transformation, None)
        return json_response({"collection": coll.name, "sql": None})

    async def drop_collection(self, request: Request) -> Response:
        name = request.path_params["name"]
        self.collection(name)
        await anyio.to_thread.run_sync(self.db.drop_collection, name)
        return json_response({"name": name, "dropped": True})

    # ---------------------------------------------------------------- sources (docs/sources.md)
    async def add_source(self, request: Request) -> Response:
        coll = self.collection(request.path_params["name"])
        body = await self._json(request)
        fields = set(inspect.signature(rtindex.KafkaSource).parameters)
        if not isinstance(body, dict) or body.get("kind", "kafka") != "kafka" or not set(body) - {"kind"} <= fields:
            raise HttpError(400, "BadRequest", f'give {{"kind": "kafka", {", ".join(sorted(fields))}}} '
                                               "(bootstrap_servers and topic required)")
        try:
            source = rtindex.KafkaSource(**{k: v for k, v in body.items() if k != "kind"})
        except TypeError:
            raise HttpError(400, "BadRequest", "a Kafka source needs bootstrap_servers and topic") from None
        unsafe = unsafe_options(source.options) if isinstance(source.options, dict) else []
        if unsafe:
            raise HttpError(400, "BadRequest", f"options {unsafe} are not taken over HTTP: they read files, load "
                                               "libraries or run commands on the server")
        status = await anyio.to_thread.run_sync(coll.add_source, source)
        return json_response(status, 201)

    async def list_sources(self, request: Request) -> Response:
        return json_response({"sources": self.collection(request.path_params["name"]).sources()})

    async def get_source(self, request: Request) -> Response:
        coll = self.collection(request.path_params["name"])
        return json_response(coll.source(request.path_params["source"]))

    async def pause_source(self, request: Request) -> Response:
        coll = self.collection(request.path_params["name"])
        return json_response(await anyio.to_thread.run_sync(coll.pause_source, request.path_params["source"]))

    async def resume_source(self, request: Request) -> Response:
        coll = self.collection(request.path_params["name"])
        return json_response(await anyio.to_thread.run_sync(coll.resume_source, request.path_params["source"]))

    async def remove_source(self, request: Request) -> Response:
        coll, name = self.collection(request.path_params["name"]), request.path_params["source"]
        await anyio.to_thread.run_sync(coll.remove_source, name)
        return json_response({"name": name, "removed": True})

    async def post_docs(self, request: Request) -> Response:
        coll = self.collection(request.path_params["name"])
        if request.headers.get("content-type", "").split(";")[0].strip() == NDJSON:
            items, fence = await self.write_ndjson(coll, request)
        else:
            items, fence = await self.write_docs(coll, await self._documents(request, None), request)
        return json_response({"items": items, "fence": fence})

    async def patch_doc(self, request: Request) -> Response:
        coll = self.collection(request.path_params["name"])
        ops = await self._json(request)
        if not isinstance(ops, list):
            raise HttpError(400, "BadRequest", "the body must be a JSON Patch: an array of operations")
        doc_id = self._stored_id(coll, request.path_params["doc_id"])
        doc = await anyio.to_thread.run_sync(coll.patch, doc_id, ops)
        return json_response({"_id": doc_id, "status": "PATCHED", "document": doc, "fence": coll.fence()})

    async def delete_doc(self, request: Request) -> Response:
        coll = self.collection(request.path_params["name"])
        doc_id = self._stored_id(coll, request.path_params["doc_id"])
        await anyio.to_thread.run_sync(coll.delete, doc_id)
        return json_response({"_id": doc_id, "status": "DELETED", "fence": coll.fence()})

    @staticmethod
    def _stored_id(coll: rtindex.Collection, text: str):
        """The stored ``_id`` a URL names: the string, or else the integer it spells."""
        found = stored_doc(coll, text)
        if found is None:
            raise HttpError(404, "NotFound", f"no document with _id {text!r} in collection {coll.name!r}")
        return found[0]

    # ---------------------------------------------------------------- Rockset's routes
    def rockset_name(self, request: Request) -> str:
        ws, coll = request.path_params["ws"], request.path_params["coll"]
        return rockset_collection(path_name("workspace", ws), path_name("collection", coll))

    async def rockset_create(self, request: Request) -> Response:
        body = await self._json(request)
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise HttpError(400, "BadRequest", 'give {"name": ...}')
        ws = path_name("workspace", request.path_params["ws"])
        mapping = body.get("field_mapping_query")  # Rockset's name for the ingest transformation
        if mapping is not None and not (isinstance(mapping, dict) and isinstance(mapping.get("sql"), str)):
            raise HttpError(400, "BadRequest", 'field_mapping_query is {"sql": "SELECT ... FROM _input"}')
        self._create(rockset_collection(ws, body["name"]), body.get("shards", 4),
                     mapping["sql"] if mapping is not None else None)
        return json_response({"data": {"name": body["name"], "workspace": ws, "status": "READY"}})

    async def rockset_docs(self, request: Request) -> Response:
        name = self.rockset_name(request)
        coll = self.collection(name)
        items, fence = await self.write_docs(coll, await self._documents(request, "data"), request)
        coll_name = request.path_params["coll"]
        return json_response({"data": [{"_id": it["_id"], "_collection": coll_name, "status": it["status"],
                                 "error": it["error"]} for it in items], "last_offset": fence})

    async def rockset_patch(self, request: Request) -> Response:
        name = self.rockset_name(request)
        coll = self.collection(name)
        body = await self._json(request)
        if not isinstance(body, dict) or not isinstance(body.get("data"), list):
            raise HttpError(400, "BadRequest", 'give {"data": [{"_id": ..., "patch": [operations]}]}')
        self._check_count(len(body["data"]))
        coll_name = request.path_params["coll"]

        def apply_all() -> list:
            out = []
            for p in body["data"]:
                doc_id = p.get("_id") if isinstance(p, dict) else None
                try:
                    if doc_id is None or not isinstance(p.get("patch"), list):
                        raise rtindex.SchemaError('each item is {"_id": ..., "patch": [operations]}')
                    coll.patch(doc_id, p["patch"])
                    out.append({"_id": doc_id, "_collection": coll_name, "status": "PATCHED", "error": None})
                except (rtindex.SchemaError, rtindex.NotFoundError) as e:
                    out.append({"_id": doc_id, "_collection": coll_name, "status": "ERROR",
                                "error": e.args[0] if e.args else str(e)})
            return out

        data = await anyio.to_thread.run_sync(apply_all)
        return json_response({"data": data, "last_offset": coll.fence()})

    async def healthz(self, request: Request) -> Response:
        return json_response({"status": "ok", "role": "ingest"})


_NON_FINITE = re.compile(rb"-?(NaN|Infinity)\b")


async def _still_connected(request: Request) -> None:
    """ClientDisconnect once the client (for a relayed write, its query process) is gone: the
    rest of its write is not stored. Its client saw the connection fail and may already have
    written newer versions of the same documents; the batches stored before stay (an
    unanswered write is retried whole, docs/service.md)."""
    if await request.is_disconnected():
        raise ClientDisconnect()


def not_json(body: bytes, e: orjson.JSONDecodeError) -> HttpError:
    """What is wrong with a request body that is not JSON, with what to do for the two
    mistakes seen most: NDJSON sent as application/json, and NaN or Infinity (which JSON
    has no words for: Python's json.dumps writes them)."""
    message = f"the request body is not valid JSON: {e}"
    start = max(e.pos - 1, 0)
    if _NON_FINITE.match(body, e.pos) or _NON_FINITE.match(body, start):
        message += " (NaN and Infinity are not JSON: send null, or the value as a string)"
    elif str(e).startswith("unexpected content after document") and body[:e.pos].strip().startswith(b"{"):
        message += f" (one JSON document per line is NDJSON: send it with Content-Type: {NDJSON})"
    return HttpError(400, "BadRequest", message)


def stored_doc(coll: rtindex.Collection, text: str) -> tuple[Any, dict] | None:
    """(stored ``_id``, document) of the document a URL path names (URLs carry strings;
    ``_id`` may be an integer): the string if a document has it, else the integer it
    spells if one has that, else None."""
    doc = coll.get(text)
    if doc is not None:
        return text, doc
    try:
        as_int = int(text)
    except ValueError:
        return None
    doc = coll.get(as_int) if str(as_int) == text else None
    return (as_int, doc) if doc is not None else None


def rockset_collection(ws: str, coll: str) -> str:
    """Rockset's workspace + collection as an rtindex collection name: ``commons`` is the
    default workspace (plain names), any other is a prefix (``ws.coll``)."""
    return coll if ws == "commons" else f"{ws}.{coll}"


def build_app(db: rtindex.Database, config: ServerConfig):
    svc = IngestService(db, config)

    def wrap(handler):
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as e:  # answered by http.ERRORS; anything else is logged
                err = error_for(e)
                if err is None:
                    log.exception("rtindex serve (ingest): %s %r failed", request.method, request.url.path[:200])
                    err = internal_error()
                return error_response(err)
        return endpoint

    # its own /healthz (the query processes' /healthz asks it; not a public route), then
    # every route of the table the ingest process serves
    served = [Route("/healthz", wrap(svc.healthz), methods=["GET"], name="healthz")]
    served += [Route(r.path, wrap(getattr(svc, r.name)), methods=[r.method], name=r.name)
               for r in routes.served_by(routes.INGEST)]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(metrics.sample_forever(db))
        yield
        task.cancel()

    app = Starlette(routes=served, lifespan=lifespan)
    return WriteBudget(app, config)
