"""A client for ``rtindex serve``: the embedded API's shape, over HTTP.

A notebook moves from a local database to a server by changing one line::

    db = rtindex.open("rtindex-data")                           # embedded
    db = rtindex.connect("http://localhost:8000", api_key=key)  # the same calls, remote

Example, with a server at ``url`` and an admin key in ``key``:

>>> import rtindex
>>> db = rtindex.connect(url, api_key=key)
>>> tweets = db.create_collection("tweets_demo", shards=2)
>>> stats = tweets.ingest([{"_id": 1, "user": "ada", "likes": 3},
...                        {"_id": 2, "user": "bob", "likes": 5},
...                        {"_id": 3, "user": "cy", "likes": "many"}])
>>> stats.n, stats.errors
(3, [])
>>> db.sql("SELECT user FROM tweets_demo WHERE likes > :n ORDER BY user", {"n": 4}).rows()
[{'user': 'bob'}]
>>> tweets.patch(1, [{"op": "replace", "path": "/likes", "value": 9}])["likes"]
9
>>> tweets.get(1)["likes"], tweets.get(42)
(9, None)
>>> len(tweets), "tweets_demo" in db
(3, True)
>>> db.drop_collection("tweets_demo")
>>> db.close()

What differs from the embedded database:

- **Read-your-writes.** The query processes are read replicas that follow the writer within
  milliseconds. So that a client always sees its own writes, it remembers the newest write
  fence each of its writes returned (per collection) and sends the one of the collection a
  query reads as ``min_fence``: the server waits until that replica has those writes
  (``get()`` and ``len()`` are queries too). Writes by *other* clients are seen as soon as
  the replica has them (milliseconds), like a reader process's. A fence of a collection
  this client dropped is forgotten; one dropped by someone else does not wait (the
  replica sees the collection is gone).
  ``create_collection()`` and ``drop_collection()`` return once the listing shows them
  (``name in db``), and a query right after a create waits for the replica to know it.
- **Results** are the same :class:`rtindex.Result`. ``SELECT *`` and plain projections
  (rows the embedded engine returns as documents or as their fields) come back as JSON,
  so ``rows()`` are exactly the stored values (``_id`` 1 stays 1, a field holding numbers
  and strings keeps both); ``arrow()``/``df()`` are built from them the way the embedded
  ``Result`` builds them (when such a query ran on the column scan, where the embedded
  table comes from DuckDB, types can differ in detail: the zone name of a timestamp, the
  type of an empty or all-null column). Everything else (aggregations, expressions) comes
  as an Arrow IPC stream, the very table DuckDB produced. ``access`` is the server's access path, ``seconds``
  the server's elapsed time, ``stats`` the server's stats (``queued_ms``,
  ``staleness_ms``, ...); ``plan`` is None. ``sql()`` has no ``access=`` argument but
  takes ``timeout_ms``.
- **Ingest** sends NDJSON in batches of ``batch_size`` documents (and at most 4 MiB), one
  request each, so the input is never in memory at once (beyond what the caller passed).
  Documents without ``_id`` get one here (the embedded form: 32 hex characters), so a
  resent batch cannot store a document twice. ``IngestStats.bytes`` counts the NDJSON bytes
  sent for the stored documents (the embedded count also includes the ``_event_time`` the
  server adds). A document over the server's ``max_document_bytes`` is an item error, as
  embedded. Batches are separate requests: when one fails (server unreachable, a refusal
  other than a document's), the exception says so and the batches before it are stored.
- **Documents by URL.** ``patch()`` and ``delete()`` name the ``_id`` in the URL, where 1
  and "1" are the same text (the server reads the string ``_id`` when one is stored, else
  the integer). So for an ``_id`` that could be either they first ask (one query) whether
  the string one is stored, and act only on the document meant: an integer ``_id`` whose
  string twin is stored cannot be patched or deleted this way (``RequestError``), and
  neither can an ``_id`` containing "/" (the server's routes do not take one).
- **Errors** are rtindex's: 404 ``NotFoundError``, 409 ``AlreadyExistsError``, bad SQL
  ``SqlError``, a refused document ``SchemaError``, other refusals (400, 413, 422)
  :class:`RequestError` (a ``ValueError``; ``.limit`` names the server limit hit), 401/403
  ``AccessDeniedError`` (a ``PermissionError``), 408 and a reply later than ``timeout``
  :class:`QueryTimeoutError` (a ``TimeoutError``), 429 ``OverloadedError``, 5xx and an
  unreachable server ``StorageError``. Each carries ``.status`` and ``.type`` from the
  server's reply (None when there was none).
- **Retries.** A 429 (the server refuses before it reads the request, so nothing was
  done) is retried up to ``retries`` times (3), each after the reply's Retry-After seconds
  (at most 30); then ``OverloadedError`` with ``.retry_after``. An ingest batch is also
  sent again, with backoff, for up to ``ingest_retry_seconds`` (30) when the service is
  restarting its ingest process (502, 503, 504) or cannot be reached: a batch is upserts
  by ``_id`` (documents without one get theirs before they are sent), so sending it twice
  stores each document once. When it gives up, the ``StorageError`` says how many
  documents were stored and from which input position to ingest again. Nothing else is
  retried.
"""

from __future__ import annotations

import os
import re
import threading
import time
from datetime import datetime
from typing import Any
from urllib.parse import quote

import orjson
import pyarrow as pa

from rtindex import documents
from rtindex.collection import IngestStats, check_ingest_options
from rtindex._impl import scan_top
from rtindex.documents import ItemError, Limits
from rtindex.ingest import json_error, on_line
from rtindex.errors import (
    AccessDeniedError,
    AlreadyExistsError,
    ClosedError,
    FenceError,
    InvalidArgumentError,
    NotFoundError,
    OverloadedError,
    QueryTimeoutError,
    RtindexError,
    SchemaError,
    SqlError,
    StorageError,
)
from rtindex.fence import Fence
from rtindex.inputs import Input, open_file, open_input
from rtindex.progress import Progress
from rtindex.sql.result import Result
from rtindex.sql.parse import Query, collection_name
from rtindex.sql.queries import PlanCache

__all__ = ["QueryTimeoutError", "RemoteCollection", "RemoteDatabase", "RequestError", "connect"]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
NDJSON = "application/x-ndjson"
BATCH_BYTES = 4 << 20  # an ingest request's NDJSON (the server stores in batches of up to this much)
MAX_RETRY_WAIT = 30.0  # seconds: the most one Retry-After is honoured for
RESTARTING = (502, 503, 504)  # what a service whose ingest process restarts answers meanwhile
INGEST_BACKOFF = (0.05, 2.0)  # seconds: the first wait before an ingest batch is sent again, the longest
LISTING_WAIT = 10.0  # seconds: the most create/drop wait for the collection listing to show them
QUERY_SLACK = 5.0  # seconds past timeout_ms a query's reply is waited for
EVENT_TIME = ("_event_time",)


class RequestError(RtindexError, ValueError):
    """The server refused a request as invalid (400, 413, 422): the message says why and
    ``limit`` names the server limit it went over (None when it was not a limit)."""


def connect(url: str, api_key: str | None = None, *, timeout: float = 30.0, retries: int = 3,
            ingest_retry_seconds: float = 30.0) -> "RemoteDatabase":
    """A database served by ``rtindex serve`` at ``url``, with the embedded API's shape.

    ``api_key`` is sent as ``Authorization: ApiKey <key>``; None reads ``RTINDEX_API_KEY``
    from the environment (and sends none when that is unset too: a ``--no-auth`` server).
    ``timeout``: seconds to wait for a reply (a query given ``timeout_ms`` waits that long
    plus 5 s). ``retries``: how many times a 429 is retried. ``ingest_retry_seconds``: how
    long an ingest batch is sent again while the service restarts or cannot be reached.
    Checks the server and the key at once (``StorageError`` if unreachable,
    ``AccessDeniedError`` for a bad key). See the module documentation (``rtindex.client``)
    for what differs from ``rtindex.open``.
    """
    return RemoteDatabase(url, api_key, timeout=timeout, retries=retries, ingest_retry_seconds=ingest_retry_seconds)


def _retry_after(resp) -> float:
    try:
        return max(0.0, float(resp.headers.get("retry-after", "1")))
    except ValueError:  # an HTTP date: not worth parsing, wait a second
        return 1.0


_AT = re.compile(r"^(?P<msg>.*) \(at (?:document \d+, )?(?P<path>\$[^()]*)\)$", re.DOTALL)
_ITEM = re.compile(r"^(?:document|line) \d+: (?P<msg>.*?)(?: at (?P<path>\$.*))?$", re.DOTALL)


def _schema_error(message: str) -> SchemaError:
    """SchemaError from its text (``"why (at $.path)"``), path included."""
    m = _AT.match(message)
    return SchemaError(m["msg"], m["path"]) if m else SchemaError(message)


def _error_from(resp, documents_route: bool = False) -> RtindexError:
    """The rtindex exception an error reply means (see the module documentation)."""
    type_, limit = None, None
    try:
        body = orjson.loads(resp.content)
        type_, message, limit = body.get("type"), body.get("message") or body.get("detail"), body.get("limit")
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    if not isinstance(message, str):  # not the server's own error shape
        message = f"{resp.status_code} {resp.reason_phrase}: {resp.text[:1000]}"
    s = resp.status_code
    if s in (401, 403):
        e: RtindexError = AccessDeniedError(message)
    elif s == 404:
        e = NotFoundError(message)
    elif s == 409:
        e = AlreadyExistsError(message)
    elif s == 408:
        e = QueryTimeoutError(message)
    elif s == 429:
        e = OverloadedError(message, _retry_after(resp))
    elif s == 400 and type_ == "BadSql":
        e = SqlError(message)
    elif s < 500 and documents_route and s == 400:
        e = _schema_error(message)
    elif s < 500:
        e = RequestError(message)
    else:
        e = StorageError(f"the server failed ({s}): {message}")
    e.status, e.type, e.limit = s, type_, limit
    return e


def _id_key(doc_id: Any) -> tuple:
    return (isinstance(doc_id, str), doc_id)


class RemoteDatabase:
    """A database behind ``rtindex serve``; make one with :func:`rtindex.connect`."""

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 30.0, retries: int = 3,
                 ingest_retry_seconds: float = 30.0):
        import httpx  # here, not at import time: `import rtindex` need not load it

        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidArgumentError(f"url must be http://host:port or https://..., not {url!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidArgumentError(f"retries must be an integer >= 0, not {retries!r}")
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.retries = retries
        if isinstance(ingest_retry_seconds, bool) or not isinstance(ingest_retry_seconds, (int, float)) \
                or not ingest_retry_seconds >= 0:
            raise InvalidArgumentError(f"ingest_retry_seconds must be a number >= 0, not {ingest_retry_seconds!r}")
        self.ingest_retry_seconds = float(ingest_retry_seconds)
        self._httpx = httpx
        key = api_key if api_key is not None else os.environ.get("RTINDEX_API_KEY")
        headers = {"User-Agent": "rtindex-client"}
        if key:
            headers["Authorization"] = f"ApiKey {key}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=self.timeout,
                                  limits=httpx.Limits(max_connections=32, max_keepalive_connections=8))
        self._sleep = time.sleep  # tests replace it
        self._lock = threading.Lock()
        self._fences: dict[str, Fence] = {}  # collection -> newest fence of this client's writes
        self._plans = PlanCache(256)
        self._closed = False
        try:
            self._list()  # the server is there, and the key is good
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"<rtindex.RemoteDatabase {self.url!r}{' closed' if self._closed else ''}>"

    def __enter__(self) -> "RemoteDatabase":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True once close() has run: any request afterwards raises ClosedError."""
        return self._closed

    def close(self) -> None:
        """Close the connection pool. Idempotent."""
        self._closed = True
        self._http.close()

    # -- requests -------------------------------------------------------------------
    def _request(self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
                 headers: dict | None = None, read_timeout: float | None = None,
                 documents_route: bool = False):
        """One request, 429 retried; the reply, or the rtindex exception it means."""
        if self._closed:
            raise ClosedError(f"the connection to {self.url} is closed")
        httpx = self._httpx
        hdrs = dict(headers or {})
        if json is not None:
            content = orjson.dumps(json)
            hdrs["Content-Type"] = "application/json"
        timeout = httpx.Timeout(self.timeout, read=read_timeout) if read_timeout else httpx.USE_CLIENT_DEFAULT
        for attempt in range(self.retries + 1):
            try:
                resp = self._http.request(method, path, content=content, headers=hdrs, timeout=timeout)
            except httpx.ReadTimeout as e:
                raise QueryTimeoutError(f"no reply from {self.url} within {read_timeout or self.timeout} s "
                                        f"({method} {path})") from e
            except httpx.TransportError as e:
                raise StorageError(f"cannot reach the rtindex server at {self.url}: "
                                   f"{type(e).__name__}: {e}") from e
            if resp.status_code == 429 and attempt < self.retries:
                self._sleep(min(_retry_after(resp), MAX_RETRY_WAIT))
                continue
            if resp.status_code >= 400:
                raise _error_from(resp, documents_route)
            return resp
        raise AssertionError("unreachable")

    def _saw_fence(self, text: Any) -> None:
        """Remember a fence a write returned (the newest per collection)."""
        try:
            f = Fence.parse(text)
        except FenceError:
            return
        with self._lock:
            old = self._fences.get(f.collection)
            if old is not None and old.created == f.created and len(old.counters) == len(f.counters):
                f = Fence(f.collection, f.created, tuple(map(max, old.counters, f.counters)))
            elif old is not None and old.created > f.created:
                f = old
            self._fences.pop(f.collection, None)
            self._fences[f.collection] = f  # the most recently written collection last

    def _forget_fence(self, name: str) -> None:
        with self._lock:
            self._fences.pop(collection_name(None, name), None)

    def _list(self) -> list[dict]:
        return orjson.loads(self._request("GET", "/v1/collections").content)["collections"]

    # -- collections ----------------------------------------------------------------
    def collection_names(self) -> list[str]:
        """Names of the collections, sorted."""
        return sorted(c["name"] for c in self._list())

    def collection(self, name: str) -> "RemoteCollection":
        """An existing collection (``NotFoundError`` if there is none); ``commons.coll``
        names ``coll``."""
        want = collection_name(None, name) if isinstance(name, str) else name
        for c in self._list():
            if c["name"] == want:
                return RemoteCollection(self, c["name"], c["shards"])
        raise NotFoundError(f"no collection {name!r} (create it with db.create_collection({name!r}))")

    __getitem__ = collection

    def __contains__(self, name: str) -> bool:
        return isinstance(name, str) and collection_name(None, name) in self.collection_names()

    def create_collection(self, name: str, shards: int = 4, exist_ok: bool = False, *,
                          transformation: str | None = None) -> "RemoteCollection":
        """Create a collection of ``shards`` shards (needs an admin key); with ``exist_ok``,
        an existing one is returned instead of ``AlreadyExistsError``. ``transformation``:
        its ingest transformation (see Collection.set_transformation)."""
        try:
            body = {"name": name, "shards": shards}
            if transformation is not None:
                body["transformation"] = transformation
            body = orjson.loads(self._request("POST", "/v1/collections", json=body).content)
        except AlreadyExistsError:
            if exist_ok:
                return self.collection(name)
            raise
        coll = RemoteCollection(self, body["name"], body["shards"])
        # the replicas learn of a collection within milliseconds; until then a query on it
        # would be NotFoundError: its first fence makes this client's queries wait for it
        fence = orjson.loads(self._request("POST", coll._docs_path(), content=b"",
                                           headers={"Content-Type": NDJSON}).content)["fence"]
        self._saw_fence(fence)
        self._await_listing(coll.name, True)
        return coll

    def drop_collection(self, name: str) -> None:
        """Delete a collection and all its data (needs an admin key)."""
        self._request("DELETE", f"/v1/collections/{quote(str(name), safe='')}")
        self._forget_fence(name)
        self._await_listing(collection_name(None, name), False)

    def _await_listing(self, name: str, present: bool) -> None:
        """Wait (at most LISTING_WAIT s) until the collection listing shows what this client
        just did, so that ``name in db`` and ``db[name]`` agree with it on return."""
        deadline = time.monotonic() + min(self.timeout, LISTING_WAIT)
        pause = 0.001
        while any(c["name"] == name for c in self._list()) != present and time.monotonic() < deadline:
            self._sleep(pause)
            pause = min(pause * 2, 0.05)

    # -- queries --------------------------------------------------------------------
    def _plan(self, sql: str) -> tuple[Query | None, str | None]:
        """The query as this client's parser reads it (None if it does not: the server
        will say why) and the fence to send with it."""
        try:
            q = self._plans.get(sql)
        except Exception:  # noqa: BLE001 - the server is the judge of the SQL
            q = None
        with self._lock:
            if q is not None:
                f = self._fences.get(collection_name(None, q.collection))
            else:  # unknown collection: wait for this client's newest write
                f = next(reversed(self._fences.values()), None) if self._fences else None
        return q, (str(f) if f is not None else None)

    def sql(self, sql: str, params: Any = None, *, timeout_ms: int | None = None) -> Result:
        """Run one SELECT on the server; see docs/sql.md for the dialect.

        ``params`` binds ``:name`` (a dict) or ``?`` (a list) placeholders. ``timeout_ms``:
        the server gives up after this long (default: the server's, 30 s). The query sees
        every write this client made to its collection (see the module documentation).
        Raises SqlError, NotFoundError, QueryTimeoutError, OverloadedError.
        """
        if not isinstance(sql, str):
            raise SqlError(f"SQL must be a string, not {type(sql).__name__}")
        q, fence = self._plan(sql)
        as_rows = q is not None and (q.star or q.plain is not None)
        req: dict[str, Any] = {"sql": sql}
        if params is not None:
            req["parameters"] = list(params) if isinstance(params, tuple) else params
        if fence is not None:
            req["min_fence"] = fence
        if timeout_ms is not None:
            req["timeout_ms"] = timeout_ms
        read = timeout_ms / 1000.0 + QUERY_SLACK if isinstance(timeout_ms, (int, float)) and timeout_ms > 0 else None
        resp = self._request("POST", "/v1/query", json=req, read_timeout=read,
                             headers={"Accept": "application/json" if as_rows else ARROW_STREAM})
        if resp.headers.get("content-type", "").startswith(ARROW_STREAM):
            table = pa.ipc.open_stream(resp.content).read_all()
            stats = orjson.loads(resp.headers.get("x-rtindex-stats", "{}"))
            warnings = stats.pop("warnings", [])
            res = Result(table.column_names, table=table, access=stats.get("access_path") or "index")
        else:
            body = orjson.loads(resp.content)
            stats = body.get("stats") or {}
            warnings = body.get("warnings", [])
            rows = body["rows"]
            if q is not None and q.plain:  # _event_time is a datetime in rows(); JSON made it text
                for name in [n for n, path in q.plain if tuple(path) == EVENT_TIME]:
                    for r in rows:
                        v = r.get(name)
                        if isinstance(v, str):
                            r[name] = datetime.fromisoformat(v)
            res = Result(None if q is None or q.star else list(q.outputs), rows=rows,
                         access=stats.get("access_path") or "index")
        res.seconds = (stats.get("elapsed_ms") or 0.0) / 1000.0
        res.stats = stats
        res.warnings = warnings
        return res


class RemoteCollection:
    """A collection behind ``rtindex serve``; get it from ``db[name]`` or
    ``db.create_collection()`` of a :class:`RemoteDatabase`."""

    def __init__(self, db: RemoteDatabase, name: str, n_shards: int):
        self.db = db
        self.name = name
        self.n_shards = n_shards

    def __repr__(self) -> str:
        return f"<rtindex.RemoteCollection {self.name!r} shards={self.n_shards} at {self.db.url!r}>"

    def _docs_path(self, doc_id: Any = None) -> str:
        path = f"/v1/collections/{quote(self.name, safe='')}/docs"
        if doc_id is not None:
            path += "/" + quote(str(doc_id), safe="")
        return path

    def _addressable(self, doc_id: Any) -> bool:
        """Whether the URL of ``doc_id`` names that document; False when it surely does not
        exist. A URL carries text, and the server reads "1" as the string _id "1" when one
        is stored, else as the integer 1: so an integer _id whose string twin is stored
        cannot be named (RequestError), and a string that spells an integer must be checked
        to exist, or the integer document would be acted on."""
        documents.encode_id(doc_id)  # SchemaError for an _id that cannot be one, as embedded
        text = str(doc_id)
        if "/" in text:
            raise RequestError(f"_id {doc_id!r} cannot be named in a URL: the server does not route an "
                               f"_id containing '/' (patch or delete it with embedded rtindex)")
        if isinstance(doc_id, str):
            try:
                ambiguous = str(int(text)) == text
            except ValueError:
                ambiguous = False
        else:
            ambiguous = True
        if not ambiguous:
            return True
        twin = self.db.sql(f"SELECT _id FROM {self._quoted()} WHERE _id = :id LIMIT 1", {"id": text}).rows()
        if isinstance(doc_id, str):
            return bool(twin)
        if twin:
            raise RequestError(f"_id {doc_id!r} cannot be named in a URL while _id {text!r} is stored in "
                               f"collection {self.name!r} too (the server reads the URL as the string)")
        return True

    def _quoted(self) -> str:
        return '"' + self.name + '"'

    # -- writes ---------------------------------------------------------------------
    def ingest(self, docs: Any, batch_size: int = 1000, *, errors: str = "warn",
               progress: bool | None = None, json_path: str | None = None) -> IngestStats:
        """Store documents; each replaces any stored document with the same ``_id``.

        ``docs`` is anything the embedded ``Collection.ingest`` takes (dicts, JSON text,
        files, DataFrames, Arrow tables), converted the same way. They are sent as NDJSON,
        ``batch_size`` documents (at most 4 MiB) per request, read from ``docs`` as they
        are sent. Returns the embedded :class:`~rtindex.IngestStats`: ``errors``
        (positions in the whole input), ``replaced``, ``ids``, ``n``, ``fence``,
        ``seconds``; ``bytes`` is the size of the NDJSON lines sent for the stored
        documents. ``errors``, ``progress`` and ``json_path`` work as embedded. The documents
        are visible to this client's queries when it returns (see the module documentation).
        """
        check_ingest_options(batch_size, errors)
        return self._ingest(open_input(docs, batch_size, json_path), batch_size, errors, progress)

    def ingest_file(self, path: str | os.PathLike, *, progress: bool | None = None, errors: str = "warn",
                    batch_size: int = 1000, json_path: str | None = None) -> IngestStats:
        """Store the documents of a file (``.ndjson``, ``.jsonl``, ``.json``, ``.parquet``;
        the JSON ones also ``.gz``), as the embedded ``Collection.ingest_file`` does."""
        check_ingest_options(batch_size, errors)
        source = open_file(path, batch_size) if json_path is None else open_input(path, batch_size, json_path)
        return self._ingest(source, batch_size, errors, progress)

    def _ingest(self, source: Input, batch_size: int, errors: str, progress: bool | None) -> IngestStats:
        t0 = time.perf_counter()
        stats = IngestStats()
        written: dict[tuple, tuple[Any, int]] = {}  # id key -> (_id, bytes of the last stored version)
        batch: list[tuple[int, Any, bytes]] = []  # (input position, the document's own _id, NDJSON line)
        size = 0
        sent = False
        bar = Progress(progress, source.total, source.unit, self.name)

        numbered: set[int] = set()  # input positions of NDJSON lines: their errors name the line

        def send() -> None:
            before = sum(n for _, n in written.values())
            self._send(batch, stats, written, numbered)
            bar.update(len(batch), sum(n for _, n in written.values()) - before, len(stats.errors),
                       source.tell() if source.tell else None)

        try:
            with source:
                for idx, doc in source.items:
                    if type(doc) is documents.Line and doc.numbered:
                        numbered.add(idx)
                    item = self._line(idx, doc, stats)
                    if item is None:
                        continue
                    batch.append(item)
                    size += len(item[2])
                    if len(batch) >= batch_size or size >= BATCH_BYTES:
                        send()
                        batch, size, sent = [], 0, True
                if batch or not sent:  # an empty request still checks the collection and gives the fence
                    send()
        except KeyboardInterrupt as e:
            e.add_note(f"rtindex: ingest into collection {self.name!r} was interrupted; the {len(written)} "
                       f"documents the server had acknowledged stay stored")
            raise
        except StorageError as e:
            if batch:
                e.add_note(f"rtindex: {len(written)} documents of this ingest into collection {self.name!r} "
                           f"were stored; the batch from input position {batch[0][0]} on was not acknowledged: "
                           f"ingest again from there (documents already stored are replaced by themselves)")
            raise
        finally:
            bar.close()
        stats._tally(written, t0)
        stats._settle(errors, stacklevel=4)
        return stats

    @staticmethod
    def _line(idx: int, doc: Any, stats: IngestStats) -> tuple[int, Any, bytes] | None:
        """A document as an NDJSON line, or None after recording why it cannot be one."""
        line = None
        if type(doc) is documents.Line:  # NDJSON input: the line is sent as it is, if it has an _id
            line = doc.raw
            if doc.doc is None:
                status, own_id, _, _, _, _ = scan_top(line)
                if status == 0 and own_id is not None:
                    return idx, own_id, line.strip()
                try:
                    parsed = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    parsed = json_error(line, 1 << 20) or SchemaError(f"invalid JSON: {e}")
                if not isinstance(parsed, dict):  # what the indexer says of it, as the embedded ingest does
                    if not isinstance(parsed, SchemaError):
                        parsed = json_error(line, 1 << 20) or SchemaError("a document must be a JSON object")
                    if doc.numbered:
                        parsed = SchemaError(on_line(parsed.message, idx), parsed.path)
                doc.doc = parsed
            doc = doc.doc
        if isinstance(doc, SchemaError):  # text input that does not parse
            stats.errors.append(ItemError(idx, None, doc.path, doc.message))
            return None
        if not isinstance(doc, dict):
            stats.errors.append(ItemError(idx, None, "$", f"a document must be a JSON object, "
                                                           f"not {type(doc).__name__}"))
            return None
        own_id = documents.json_value(doc.get("_id"))
        if own_id is None:  # named here, so that resending a batch cannot store it twice
            doc = {**doc, "_id": documents.new_id()}
        elif line is not None:
            return idx, own_id, line.strip()
        try:
            return idx, own_id, documents.to_json_bytes(doc)[1]
        except (TypeError, orjson.JSONEncodeError) as e:
            try:  # the embedded check names the path of the bad value
                documents.prepare(doc, Limits(max_document_bytes=1 << 62, max_depth=1 << 30), documents.now_us())
            except SchemaError as se:
                stats.errors.append(ItemError(idx, own_id, se.path, se.message))
                return None
            stats.errors.append(ItemError(idx, own_id, "$", f"document is not JSON-serializable: {e}"))
            return None

    def _send(self, batch: list[tuple[int, Any, bytes]], stats: IngestStats, written: dict,
              numbered: set[int] = frozenset()) -> None:
        """POST one batch; record each document's outcome."""
        pending = list(batch)
        deadline, wait = None, INGEST_BACKOFF[0]
        while True:
            try:
                resp = self.db._request("POST", self._docs_path(), headers={"Content-Type": NDJSON},
                                        content=b"".join(line + b"\n" for _, _, line in pending))
                break
            except StorageError as e:  # the service restarting, or out of reach: send it again for a while
                if getattr(e, "status", None) not in (*RESTARTING, None):
                    raise
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + self.db.ingest_retry_seconds
                if now + wait > deadline:
                    raise
                self.db._sleep(wait)
                wait = min(2 * wait, INGEST_BACKOFF[1])
            except RequestError as e:
                if e.status != 413 or not pending:
                    raise
                m = re.search(r"\bline (\d+)", str(e))
                if e.limit == "max_document_bytes" and m and 0 < int(m[1]) <= len(pending):
                    # nothing of this request was stored (it is under the server's batch):
                    # that document is an item error, as embedded; send the others again
                    idx, own_id, line = pending.pop(int(m[1]) - 1)
                    most = re.search(r"max_document_bytes=(\d+)", str(e))
                    stats.errors.append(ItemError(idx, own_id, "$", f"document is {len(line)} bytes, more than "
                                                                    f"max_document_bytes={most[1] if most else '?'}"))
                    continue
                if e.limit in ("max_body_bytes", "max_docs_per_request") and len(pending) > 1:
                    half = len(pending) // 2
                    self._send(pending[:half], stats, written, numbered)
                    self._send(pending[half:], stats, written, numbered)
                    return
                if e.limit == "max_body_bytes":
                    idx, own_id, line = pending[0]
                    stats.errors.append(ItemError(idx, own_id, "$", str(e)))
                    return
                raise
        body = orjson.loads(resp.content)
        items = body["items"]
        if len(items) != len(pending):
            raise StorageError(f"the server answered {len(items)} statuses for {len(pending)} documents")
        for (idx, own_id, line), it in zip(pending, items):
            if it.get("status") == "FILTERED":
                stats.filtered += 1
                continue
            if it.get("status") == "ERROR":
                m = _ITEM.match(it.get("error") or "")
                msg, path = (m["msg"], m["path"] or "$") if m else (it.get("error") or "not stored", "$")
                if idx in numbered:  # as the embedded ingest words it
                    msg = on_line(msg, idx)
                stats.errors.append(ItemError(idx, own_id, path, msg))
                continue
            doc_id = it["_id"]
            written[_id_key(doc_id)] = (doc_id, len(line))
            if it.get("status") == "REPLACED":
                stats.replaced.append(idx)
        stats.fence = body.get("fence") or stats.fence
        self.db._saw_fence(stats.fence)

    @property
    def transformation(self) -> str | None:
        """The SQL of the collection's ingest transformation, or None."""
        return orjson.loads(self.db._request("GET", self._transformation_path()).content)["sql"]

    def set_transformation(self, sql: str | None) -> None:
        """Set (None: remove) the ingest transformation for documents from now on (admin key)."""
        if sql is None:
            self.db._request("DELETE", self._transformation_path())
        else:
            self.db._request("PUT", self._transformation_path(), json={"sql": sql})

    def _transformation_path(self) -> str:
        return f"/v1/collections/{quote(self.name, safe='')}/transformation"

    def patch(self, doc_id: Any, ops: list[dict]) -> dict:
        """Apply an RFC 6902 JSON Patch to a stored document atomically; returns the new one.
        ``NotFoundError`` if there is none; ``SchemaError`` if the patch cannot apply."""
        if not self._addressable(doc_id):
            raise NotFoundError(f"no document with _id {doc_id!r} in collection {self.name!r}")
        body = orjson.loads(self.db._request("PATCH", self._docs_path(doc_id), json=ops,
                                             documents_route=True).content)
        self.db._saw_fence(body.get("fence"))
        return body["document"]

    def delete(self, doc_id: Any) -> bool:
        """Delete a document by ``_id``; True if it existed."""
        if not self._addressable(doc_id):
            return False
        try:
            body = orjson.loads(self.db._request("DELETE", self._docs_path(doc_id)).content)
        except NotFoundError as e:
            if str(e).startswith("no document"):
                return False
            raise
        self.db._saw_fence(body.get("fence"))
        return True

    # -- reads ----------------------------------------------------------------------
    def get(self, doc_id: Any) -> dict | None:
        """The stored document with this ``_id``, or None. A query (by ``_id``, typed: 1
        and "1" are different documents), so it sees this client's writes."""
        documents.encode_id(doc_id)
        rows = self.db.sql(f"SELECT * FROM {self._quoted()} WHERE _id = :id LIMIT 1", {"id": doc_id}).rows()
        return rows[0] if rows else None

    def count(self) -> int:
        """Number of documents (same as ``len(collection)``)."""
        rows = self.db.sql(f"SELECT COUNT(*) AS n FROM {self._quoted()}").rows()
        return int(rows[0]["n"])

    __len__ = count
