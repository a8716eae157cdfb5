"""Turning user input into storable documents: parsing, `_id`, `_event_time`, limits, and
Python values (numpy, pandas, datetime, Decimal, UUID) into the JSON values they mean.

Everything here runs before a document reaches a shard, so one bad document is reported
with its position and path and never costs the good ones of its batch.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from datetime import date, datetime, time as clock_time, timedelta, timezone
from decimal import Decimal
from enum import Enum
from typing import Any, Iterable, Iterator
from uuid import UUID

import numpy as np
import orjson

from rtindex import keys
from rtindex._impl import member_span, nonfinite_path, split_array
from rtindex._py.segment import walk as _walk
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

    index: int  # position in the ingest input: line number - 1 in NDJSON, row number (from 0) in a table
    id: Any  # the document's _id when it had one
    path: str  # where in the document, like $.a[3].b
    message: str

    def __str__(self) -> str:
        return f"document {self.index}: {self.message} (at {self.path})"


def encode_id(doc_id: Any) -> bytes:
    """The ``ids`` key of an ``_id``: strings and integers never collide."""
    if isinstance(doc_id, str):
        try:
            raw = keys.encode_string(doc_id)
        except UnicodeEncodeError:
            raise SchemaError("_id is not valid UTF-8 (lone surrogate)", "$._id") from None
        if len(raw) > MAX_ID_BYTES:
            raise SchemaError(f"_id is longer than {MAX_ID_BYTES} bytes", "$._id")
        return keys.id_prefix(keys.STRING) + raw
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        if not keys.INT_MIN <= doc_id <= keys.INT_MAX:
            raise SchemaError("integer _id outside the signed 64-bit range", "$._id")
        return keys.id_prefix(keys.INT) + keys.encode_int(doc_id)
    raise SchemaError(f"_id must be a string or an integer, not {type(doc_id).__name__}", "$._id")


def shard_of(id_key: bytes, n_shards: int) -> int:
    """Stable across processes and machines (unlike hash())."""
    return zlib.crc32(id_key) % n_shards


class _IdPool:
    """Generated ids, made 1024 at a time: 12 hex characters of a millisecond time, then 20
    of OS randomness (80 bits), sorted.

    Time first, so that the ids a process generates only grow (each fill takes the time, or
    one more than the previous fill's if the clock has not moved on or went back). RocksDB
    then appends each new ``_id`` index entry at the end of its memtable instead of
    searching it at a random place, which is much cheaper (docs/benchmarks.md, "Ingest").
    80 random bits after the time still make a collision impossible in practice, which
    ingest relies on: it does not look a just generated ``_id`` up (see
    ShardWriter._stored_rows).

    One ``os.urandom`` call per id was a measurable part of a small document's ingest (the
    call releases the GIL, and getting it back waits behind the other threads); hence the
    pool. A child process made by ``fork`` starts with an empty pool, so it never hands out
    its parent's ids.
    """

    _IDS = 1024
    _RANDOM_HEX = 20

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: list[str] = []
        self._at = 0
        self._ms = 0  # the time prefix of the last fill
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._ids, self._at = [], 0

    def _fill(self) -> list[str]:
        self._ms = max(time.time_ns() // 1_000_000, self._ms + 1)
        prefix = f"{self._ms:012x}"
        n = self._RANDOM_HEX
        rand = os.urandom(n // 2 * self._IDS).hex()
        return sorted([prefix + rand[i : i + n] for i in range(0, n * self._IDS, n)])

    def take(self, n: int) -> list[str]:
        """The next ``n`` ids, in order."""
        out: list[str] = []
        with self._lock:
            while len(out) < n:
                at = self._at
                if at >= len(self._ids):
                    self._ids, at = self._fill(), 0
                got = self._ids[at : at + n - len(out)]
                self._at = at + len(got)
                out += got
        return out


_ids = _IdPool()


def new_id() -> str:
    """A new id: 32 hex characters, a millisecond time then 80 random bits (see _IdPool),
    greater than every id this process generated before."""
    return _ids.take(1)[0]


def new_ids(n: int) -> list[str]:
    """``n`` new ids (see :func:`new_id`), in order: one lock for all of them."""
    return _ids.take(n)


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
_US = timedelta(microseconds=1)
# An integer _event_time outside these bounds is surely not microseconds: 1.7e9 (seconds)
# would be 1970-01-01 00:28 and 1.7e18 (nanoseconds) the year 55,800.
EVENT_TIME_MIN_US = (datetime(1980, 1, 1, tzinfo=timezone.utc) - _EPOCH) // _US
EVENT_TIME_MAX_US = (datetime(3000, 1, 1, tzinfo=timezone.utc) - _EPOCH) // _US
# unit name, microseconds per unit, how to turn it into microseconds
_EVENT_TIME_UNITS = (("seconds", 1_000_000, "multiply it by 1_000_000"),
                     ("milliseconds", 1_000, "multiply it by 1_000"),
                     ("nanoseconds", 0.001, "divide it by 1_000 (v // 1_000)"))


def event_time_of(v: Any, now_us: int, check: bool) -> int:
    """The ``_event_time`` to store for a document's value ``v`` (None: ``now_us``).

    Microseconds, as everywhere in rtindex (and Rockset). With ``check`` (a document given
    to ingest), an integer is taken as microseconds only when that is a plausible time (1980
    to 3000): an epoch in seconds, milliseconds or nanoseconds would otherwise be stored as
    a wrong time without a word, so it is a SchemaError that names the unit it looks like.
    A datetime (also a pandas or numpy one) or an ISO-8601 string says its time itself and
    may be any time; so may the stored integer it became (a patched document, unchecked).
    """
    if v is None:
        return now_us
    if type(v) is not int:
        if isinstance(v, (str, datetime, np.datetime64)):
            if v != v:  # NaT: no time given
                return now_us
            return to_event_time(v) if isinstance(v, (str, datetime)) else json_value(v)
        v = json_value(v)  # numpy integers, Decimal, pandas NA -> None, ...
        if v is None:
            return now_us
        if not isinstance(v, int) or isinstance(v, bool):
            return to_event_time(v)  # says what it must be
    us = to_event_time(v)
    if not check or EVENT_TIME_MIN_US <= us < EVENT_TIME_MAX_US:
        return us
    for unit, per, fix in _EVENT_TIME_UNITS:
        if EVENT_TIME_MIN_US <= us * per < EVENT_TIME_MAX_US:
            raise SchemaError(f"_event_time {us} looks like {unit} since the epoch, but an integer "
                              f"_event_time is microseconds ({_us_text(us)} as such): {fix}, or give a "
                              f"datetime", "$._event_time")
    raise SchemaError(f"_event_time {us} is not a plausible time in microseconds since the epoch "
                      f"({_us_text(us)}; 1980 to 3000 are): give microseconds, a datetime or an "
                      f"ISO-8601 string", "$._event_time")


def _us_text(us: int) -> str:
    try:
        return (_EPOCH + us * _US).strftime("%Y-%m-%d %H:%M:%S UTC")
    except OverflowError:
        return "out of the datetime range"


# Values orjson would otherwise serialize itself (datetimes, subclasses of str/int/dict/list,
# dataclasses) go to the ``default`` hook, like numpy and Decimal values do: the hook is
# called exactly when a document is not plain JSON. Only UUID and Enum values slip past
# (orjson always serializes them); the shard's indexer refuses those, and the collection
# converts and stores such a document again (Collection._put).
_PASSTHROUGH = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS
_PLAIN = frozenset((str, int, float, bool, type(None)))
_ID_TYPES = (str, int, type(None))


class _NotPlain(Exception):
    pass


def _not_plain(v: Any) -> Any:
    raise _NotPlain


def json_value(v: Any) -> Any:
    """The JSON value a Python value means (the table in docs/reference.md).

    numpy scalars become int/float/bool/str and arrays lists; datetimes (pandas Timestamp
    and numpy datetime64 too) microseconds since the epoch, naive meaning UTC, like
    ``_event_time`` (so a field compares with datetime parameters in SQL); timedeltas
    microseconds; dates and times ISO-8601 text; Decimal an int when integral (and within
    64 bits), else a float; UUID its text; Enum its value; pandas NaT and NA null. Containers
    are converted throughout (tuples become lists). Returns ``v`` itself when nothing needed
    converting, and a value of no known meaning (bytes, a set) unchanged, for the indexer to
    report with its path.
    """
    t = type(v)
    if t in _PLAIN:
        return v
    if isinstance(v, dict):
        out = {}
        same = t is dict
        for k, x in v.items():
            y = json_value(x)
            if type(k) is not str and isinstance(k, str):  # numpy.str_ keys
                k, same = str(k), False
            same = same and y is x
            out[k] = y
        return v if same else out
    if isinstance(v, (list, tuple)):
        items = [json_value(x) for x in v]
        return v if t is list and all(y is x for y, x in zip(items, v)) else items
    if isinstance(v, datetime):
        return None if v != v else to_event_time(v)  # pandas NaT (a datetime) means "no value"
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, clock_time):
        return v.isoformat()
    if isinstance(v, timedelta):
        return v // _US
    if isinstance(v, Decimal):
        if v.is_finite() and v == v.to_integral_value() and keys.INT_MIN <= v <= keys.INT_MAX:
            return int(v)
        return float(v)
    if isinstance(v, UUID):
        return str(v)
    if isinstance(v, Enum):
        return json_value(v.value)
    if isinstance(v, np.ndarray):
        return array_values(v)
    if isinstance(v, (np.datetime64, np.timedelta64)):
        return array_values(np.asarray(v).reshape(1))[0]
    if isinstance(v, np.generic):
        return json_value(v.item())
    if v is getattr(sys.modules.get("pandas"), "NA", _NotPlain):  # pandas may still be being imported
        return None
    for base in (str, int, float):  # subclasses the indexer would keep as they are
        if isinstance(v, base):
            return base(v)
    return v


def array_values(arr: Any) -> list:
    """A numpy array as a list of JSON values (:func:`json_value`'s rules, at numpy speed for
    numbers, datetimes and timedeltas; NaT is None)."""
    if arr.ndim > 1:
        return [array_values(a) for a in arr]
    kind = arr.dtype.kind
    if kind in "biuf":
        return arr.tolist()
    if kind in "mM":
        out = arr.astype(f"{kind}8[us]").view(np.int64).tolist()  # floors, as to_event_time does
        for i in np.flatnonzero(np.isnat(arr)).tolist():
            out[i] = None
        return out
    return [json_value(x) for x in arr.tolist()]


def to_json_bytes(d: dict) -> tuple[dict, bytes]:
    """``(d as plain JSON types, its JSON bytes)``; ``d`` itself when it is plain already.

    A plain document is serialized once and never walked in Python (most documents are
    plain, and ingest must not get slower for them); one holding other types is converted
    by :func:`json_value` first. TypeError (orjson.JSONEncodeError) for a value of no
    known meaning.
    """
    try:
        return d, orjson.dumps(d, default=_not_plain, option=_PASSTHROUGH)
    except orjson.JSONEncodeError as e:
        if not isinstance(e.__cause__, _NotPlain):
            raise
    d = json_value(d)
    return d, orjson.dumps(d)


def _converted(d: dict, limits: Limits) -> tuple[dict, bytes]:
    """The slow path of :func:`prepare`: ``d`` converted to plain JSON and serialized, or a
    SchemaError naming the path of the first value that cannot be stored."""
    d = json_value(d)
    try:
        return d, orjson.dumps(d)
    except orjson.JSONEncodeError as e:
        error = e
    try:  # the reference indexer names the path of the first bad value
        _walk(d, limits.max_depth)
    except SchemaError:
        raise
    except Exception:  # e.g. a key with a lone surrogate: say what orjson said
        pass
    raise SchemaError(f"document is not JSON-serializable: {error}") from None


class Line:
    """A document as the JSON text it came in (an NDJSON line, an element of a JSON array):
    ingest reads what it needs of it (``_id``, ``_event_time``) without parsing it, and
    stores and indexes the text itself. ``doc`` is the parsed document once something
    needed it (None until then); ``numbered``: a line of NDJSON text, whose errors name it."""

    __slots__ = ("doc", "raw", "numbered")

    def __init__(self, doc: Any, raw: bytes, numbered: bool = False):
        self.doc = doc
        self.raw = raw
        self.numbered = numbered


def _spliced(raw: bytes, doc: dict, filled: dict) -> bytes | None:
    """``raw`` (the JSON text of ``doc``) with the ``filled`` keys added at its end, as
    ``dict(doc) | filled`` would serialize; None when a filled key is in ``doc`` already (its
    value was converted: the document is serialized again)."""
    if any(k in doc for k in filled):
        return None
    body = raw.strip()
    return body[:-1] + (b"," if doc else b"") + orjson.dumps(filled)[1:]


def identify(doc: Any, now_us: int, check_event_time: bool = False,
             raw: bytes | None = None) -> tuple[Any, bytes, dict, bytes | None]:
    """(user id, id key, document, its JSON text if known) of a document to store, or
    SchemaError: the ``_id`` (generated when missing) and ``_event_time`` (``now_us`` when
    missing) filled in on a copy, the caller's dict never changed. ``check_event_time``:
    see :func:`event_time_of` (ingest checks what it is given; a patch re-stores a document
    whose time was checked before). ``raw``: the JSON text ``doc`` was parsed from (see
    :class:`Line`), returned with what was filled in; None when unknown or when a value had
    to be converted (then :func:`serialize` makes it)."""
    if not isinstance(doc, dict):
        raise SchemaError(f"a document must be a JSON object, not {type(doc).__name__}")
    given_id = doc.get("_id")
    doc_id = given_id if type(given_id) in _ID_TYPES else json_value(given_id)  # numpy int, UUID
    et = doc.get("_event_time")
    et_us = now_us if et is None else event_time_of(et, now_us, check_event_time)  # a valid int: itself
    if doc_id is None or doc_id is not given_id or et_us is not et:
        # fill in what is missing on a copy
        filled = {}
        if doc_id is None:
            doc_id = new_id()
        if doc_id is not given_id:
            filled["_id"] = doc_id
        if et_us is not et:
            filled["_event_time"] = et_us
        if raw is not None:
            raw = _spliced(raw, doc, filled)
        d = dict(doc)
        d.update(filled)
    else:
        d = doc
        if raw is not None:
            raw = raw.strip()
    return doc_id, encode_id(doc_id), d, raw


def serialize(d: dict, raw: bytes | None, limits: Limits) -> tuple[dict, bytes]:
    """``(d, its JSON bytes)`` to store, ``raw`` when given; ``d`` converted to plain JSON
    types first when it holds others (see :func:`to_json_bytes`). SchemaError when it
    cannot be serialized, holds a NaN or an infinity (orjson would write null), or is over
    ``limits.max_document_bytes``."""
    if raw is None:
        try:  # most documents are plain JSON: serialized once, never walked (see to_json_bytes)
            raw = orjson.dumps(d, default=_not_plain, option=_PASSTHROUGH)
        except orjson.JSONEncodeError:
            d, raw = _converted(d, limits)
        if b"null" in raw:
            bad = nonfinite_path(d)
            if bad is not None:
                raise SchemaError(f"non-finite number {bad[1]!r} (JSON has no NaN or Infinity)", keys.json_path(bad[0]))
    if len(raw) > limits.max_document_bytes:
        raise SchemaError(f"document is {len(raw)} bytes, more than max_document_bytes={limits.max_document_bytes}")
    return d, raw


PLAIN_PART = 64  # documents serialized a call by plain_texts (their objects stay in the CPU's caches)


def plain_texts(docs: list[dict]) -> list[bytes | None] | None:
    """The JSON text of each of ``docs`` as :func:`serialize` makes it, None for one holding
    a NaN or an infinity (orjson writes null for them: :func:`serialize` refuses it with its
    path); None when one of them is not plain JSON. Serialized ``PLAIN_PART`` documents a
    call, which costs a fraction of one call each, and each text that holds a null checked
    right after, while its document is still in the CPU's caches."""
    out: list[bytes | None] = []
    for i in range(0, len(docs), PLAIN_PART):
        part = docs[i : i + PLAIN_PART]
        try:
            texts = split_array(orjson.dumps(part, default=_not_plain, option=_PASSTHROUGH))
        except orjson.JSONEncodeError:
            return None
        if texts is None or len(texts) != len(part):
            return None
        for doc, text in zip(part, texts):
            out.append(text if b"null" not in text or nonfinite_path(doc) is None else None)
    return out


def prepare(doc: Any, limits: Limits, now_us: int, check_event_time: bool = False,
            raw: bytes | None = None) -> tuple[Any, bytes, dict, bytes]:
    """(user id, id key, document, serialized document) ready for a shard, or SchemaError:
    :func:`identify` then :func:`serialize`."""
    doc_id, id_key, d, raw = identify(doc, now_us, check_event_time, raw)
    d, raw = serialize(d, raw, limits)
    return doc_id, id_key, d, raw


def parse_lines(lines: Iterable[bytes | str]) -> Iterator[tuple[int, Any]]:
    """Yield (line number - 1, :class:`Line`) for each non-blank NDJSON line."""
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        yield i, Line(None, line if isinstance(line, bytes) else line.encode(), True)


def documents_of(text: bytes | bytearray | memoryview, member: str | None = None) -> list[bytes] | None:
    """The documents of a JSON array, each as its JSON text, found without parsing them (what
    ``Collection.ingest`` stores and indexes as they are): ``member``, the array is that
    member of a top-level JSON object (``{"data": [...]}``). None when ``text`` is not such
    an array (parse it to learn what is wrong). Each document is checked when it is ingested.
    """
    text = bytes(text)
    if member is not None:
        span = member_span(text, member)
        if span is None:
            return None
        return split_array(text[span[0] : span[1]])
    return split_array(text)


def parse_input(data: bytes | str) -> Iterator[tuple[int, Any]]:
    """Yield (index, :class:`Line` or SchemaError) from a JSON array or NDJSON text.

    Text that starts with ``[`` and is a whole JSON array gives its elements (as text, not
    parsed); otherwise every line is one document (so an NDJSON line that happens to be an
    array is just a bad document)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    stripped = data.strip()
    if stripped[:1] == b"[":
        elements = split_array(data)
        if elements is not None:
            for i, e in enumerate(elements):
                yield i, Line(None, e)
            return
        try:  # not an array the splitter reads: say what is wrong with it
            docs = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            if b"\n" not in stripped:  # one line: it was meant as a JSON array
                yield 0, SchemaError(f"invalid JSON: {e}")
                return
            docs = None  # NDJSON whose first line is an array: each line on its own
        if isinstance(docs, list):
            yield from enumerate(docs)
            return
    yield from parse_lines(data.split(b"\n"))


def now_us() -> int:
    return time.time_ns() // 1000
