"""Turning user input into storable documents: parsing, `_id`, `_event_time`, limits.

Everything here runs before a document reaches a shard, so one bad document is reported
with its position and path and never costs the good ones of its batch.
"""

from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Iterator

import orjson

from rtindex import keys
from rtindex._py.segment import SegmentBuilder as _ReferenceBuilder
from rtindex.errors import SchemaError

MAX_ID_BYTES = 1024


@dataclass(frozen=True)
class Limits:
    """Bounds on one document (raise them in rtindex.open if your data needs it)."""

    max_document_bytes: int = 4 << 20
    max_depth: int = 64


@dataclass
class ItemError:
    """One document that was not stored, and why."""

    index: int  # position in the ingest input (line number - 1 for NDJSON)
    id: Any  # the document's _id when it had one
    path: str  # where in the document, like $.a[3].b
    message: str

    def __str__(self) -> str:
        return f"document {self.index}: {self.message} (at {self.path})"


def encode_id(doc_id: Any) -> bytes:
    """The ``ids`` key of an ``_id``: strings and integers never collide."""
    if isinstance(doc_id, str):
        raw = keys.encode_string(doc_id)
        if len(raw) > MAX_ID_BYTES:
            raise SchemaError(f"_id is longer than {MAX_ID_BYTES} bytes", "$._id")
        return bytes((keys.STRING,)) + raw
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        if not keys.INT_MIN <= doc_id <= keys.INT_MAX:
            raise SchemaError("integer _id outside the signed 64-bit range", "$._id")
        return bytes((keys.INT,)) + keys.encode_int(doc_id)
    raise SchemaError(f"_id must be a string or an integer, not {type(doc_id).__name__}", "$._id")


def shard_of(id_key: bytes, n_shards: int) -> int:
    """Stable across processes and machines (unlike hash())."""
    return zlib.crc32(id_key) % n_shards


def new_id() -> str:
    """A random 128-bit id as 32 hex characters (a UUID4's worth of randomness)."""
    return os.urandom(16).hex()


def to_event_time(v: Any) -> int:
    """Microseconds since the Unix epoch from an int (already microseconds), a datetime or
    an ISO-8601 string (naive means UTC)."""
    if isinstance(v, bool):
        raise SchemaError("_event_time must be an integer (microseconds), a datetime or an ISO-8601 string",
                          "$._event_time")
    if isinstance(v, int):
        if not keys.INT_MIN <= v <= keys.INT_MAX:
            raise SchemaError("_event_time outside the signed 64-bit range", "$._event_time")
        return v
    if isinstance(v, str):
        try:
            v = datetime.fromisoformat(v)
        except ValueError:
            raise SchemaError(f"_event_time {v!r} is not an ISO-8601 timestamp", "$._event_time") from None
    if isinstance(v, datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=timezone.utc)
        return (v - _EPOCH) // _US
    raise SchemaError("_event_time must be an integer (microseconds), a datetime or an ISO-8601 string",
                      "$._event_time")


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=timezone.utc) - _EPOCH


def prepare(doc: Any, limits: Limits, now_us: int) -> tuple[Any, bytes, dict, bytes]:
    """(user id, id key, document, serialized document) ready for a shard, or SchemaError."""
    if not isinstance(doc, dict):
        raise SchemaError(f"a document must be a JSON object, not {type(doc).__name__}")
    doc_id = doc.get("_id")
    et = doc.get("_event_time")
    et_us = now_us if et is None else to_event_time(et)  # an int comes back as itself
    if doc_id is None or et_us is not et:
        # fill in what is missing on a copy: the caller's dict is never changed
        d = dict(doc)
        if doc_id is None:
            doc_id = d["_id"] = new_id()
        d["_event_time"] = et_us
    else:
        d = doc
    id_key = encode_id(doc_id)
    try:
        raw = orjson.dumps(d)
    except (TypeError, orjson.JSONEncodeError) as e:
        # find where: the reference indexer names the path of the first bad value
        try:
            _ReferenceBuilder(limits.max_depth).add(d)
        except SchemaError:
            raise
        except Exception:  # e.g. a key with a lone surrogate: say what orjson said
            pass
        raise SchemaError(f"document is not JSON-serializable: {e}") from None
    if len(raw) > limits.max_document_bytes:
        raise SchemaError(f"document is {len(raw)} bytes, more than max_document_bytes={limits.max_document_bytes}")
    return doc_id, id_key, d, raw


def parse_input(data: bytes | str) -> Iterator[tuple[int, Any]]:
    """Yield (index, document or SchemaError) from a JSON array or NDJSON text.

    Text that starts with ``[`` and parses whole is a JSON array; otherwise every line is
    one document (so an NDJSON line that happens to be an array is just a bad document)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    stripped = data.strip()
    if stripped[:1] == b"[":
        try:
            docs = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            if b"\n" not in stripped:  # one line: it was meant as a JSON array
                yield 0, SchemaError(f"invalid JSON: {e}")
                return
            docs = None  # NDJSON whose first line is an array: each line on its own
        if isinstance(docs, list):
            yield from enumerate(docs)
            return
    for i, line in enumerate(data.split(b"\n")):
        if not line.strip():
            continue
        try:
            yield i, orjson.loads(line)
        except orjson.JSONDecodeError as e:
            yield i, SchemaError(f"invalid JSON on line {i + 1}: {e}")


def iter_input(docs: Iterable[Any] | bytes | str) -> Iterator[tuple[int, Any]]:
    if isinstance(docs, (bytes, bytearray, memoryview, str)):
        return parse_input(bytes(docs) if not isinstance(docs, str) else docs)
    if isinstance(docs, dict):
        raise TypeError("ingest() takes an iterable of documents; wrap a single document in a list")
    return enumerate(docs)


def now_us() -> int:
    return time.time_ns() // 1000
