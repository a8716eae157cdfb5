"""Replies and errors in raw ASGI, shared by every layer of both processes.

Errors have one shape everywhere: ``{"type": ..., "message": ..., "limit"?: ...}`` with the
status that says whose fault it is. Messages say what was wrong with the request; they
never carry a traceback, a path on the server or an internal exception's text, except for
the rtindex errors whose messages are written for users.
"""

from __future__ import annotations

import json
import re
import unicodedata

import orjson
from starlette.requests import ClientDisconnect
from starlette.responses import Response

import rtindex

JSON = b"application/json"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
NDJSON = "application/x-ndjson"


class HttpError(Exception):
    def __init__(self, status: int, type_: str, message: str, *, limit: str | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None):
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.limit = limit
        self.headers = headers or []

    def body(self) -> bytes:
        d = {"type": self.type, "message": self.message}
        if self.limit:
            d["limit"] = self.limit
        return orjson.dumps(d)


# The one table of what an exception raised while answering a request is answered with:
# (exception class, status, type, the limit it names). The first row that matches wins, so a
# class comes before its bases. An exception no row matches is the server's own failure:
# logged, and answered 500 without its text.
ERRORS: tuple[tuple[type[Exception], int, str, str | None], ...] = (
    # the client closed the connection first: an answer nobody reads (499, as nginx logs it)
    (ClientDisconnect, 499, "ClientClosedRequest", None),
    (rtindex.QueryTimeoutError, 408, "Timeout", "timeout_ms"),
    (rtindex.ResultTooLargeError, 413, "LimitExceeded", "max_result_bytes"),
    (rtindex.SqlError, 400, "BadSql", None),
    (rtindex.NotFoundError, 404, "NotFound", None),
    (rtindex.AlreadyExistsError, 409, "AlreadyExists", None),
    (rtindex.StorageError, 503, "StorageError", None),
    # a cluster's shards whose node is gone (rtindex serve --ray): the message names them
    (rtindex.UnavailableError, 503, "Unavailable", None),
    # a document that cannot be stored, a fence no writer made, and the arguments that
    # rtindex and the key store refuse (an invalid collection name or role): their
    # messages are written for users (any other ValueError is the server's own failure)
    (rtindex.SchemaError, 400, "BadRequest", None),
    (rtindex.IngestError, 400, "BadRequest", None),
    (rtindex.FenceError, 400, "BadRequest", None),
    (rtindex.InvalidArgumentError, 400, "BadRequest", None),
)


def error_for(e: BaseException) -> HttpError | None:
    """The reply to an exception raised while answering a request (an ``HttpError`` is its
    own), or None when ``ERRORS`` has no row for it."""
    if isinstance(e, HttpError):
        return e
    for cls, status, type_, limit in ERRORS:
        if isinstance(e, cls):
            return HttpError(status, type_, str(e), limit=limit)
    return None


def internal_error() -> HttpError:
    return HttpError(500, "InternalError", "the server failed on this request; its log says why")


def path_name(kind: str, name: str) -> str:
    """A collection or workspace name from a URL path, refused (400) when it has a control
    character: no collection can have that name, so the request is malformed, not missing."""
    if any(unicodedata.category(c) == "Cc" for c in name):
        raise HttpError(400, "BadRequest", f"invalid {kind} name {name[:200]!r}: it has a control character")
    return name


def too_large(limit: str, value: int, what: str) -> HttpError:
    return HttpError(413, "LimitExceeded", f"{what} is over {limit}={value}", limit=limit)


def json_response(obj, status: int = 200) -> Response:
    """``obj`` as JSON; integer keys (a source's partitions) as strings."""
    return Response(orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS), status_code=status,
                    media_type="application/json")


def error_response(err: HttpError) -> Response:
    return Response(err.body(), status_code=err.status, media_type="application/json",
                    headers={k.decode(): v.decode() for k, v in err.headers})


async def send_bytes(send, status: int, body: bytes, content_type: bytes = JSON,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


async def send_error(send, err: HttpError) -> None:
    await send_bytes(send, err.status, err.body(), headers=err.headers)


async def read_body(receive, limit: int, limit_name: str) -> bytes:
    """The whole body of a small request (a query, a patch), refused past ``limit``."""
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise HttpError(400, "BadRequest", "the client went away before sending the body")
        body = msg.get("body", b"")
        size += len(body)
        if size > limit:
            raise too_large(limit_name, limit, "the request body")
        chunks.append(body)
        if not msg.get("more_body"):
            return b"".join(chunks)


def header(scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return v.decode("latin-1")
    return None


_LONG_DIGITS = re.compile(rb"[0-9]{19}")  # the shortest integer that may be past 64 bits


def loads(body: bytes):
    """``body`` parsed as JSON, with integers exact: orjson reads one past 64 bits as a float,
    so a body holding such a run of digits is read again by the standard library (after
    orjson checked it: UTF-8, no NaN), and rtindex refuses those integers as it does in
    documents given as Python objects. orjson.JSONDecodeError if it is not JSON."""
    parsed = orjson.loads(body)
    if _LONG_DIGITS.search(body) is None:
        return parsed
    try:
        return json.loads(body)
    except RecursionError:
        raise HttpError(400, "BadRequest", "the request body nests too deep") from None


def parse_json(body: bytes, what: str = "the request body"):
    try:
        return loads(body)
    except orjson.JSONDecodeError as e:
        raise HttpError(400, "BadRequest", f"{what} is not valid JSON: {e}") from None
