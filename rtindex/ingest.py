"""The write path of ``Collection.ingest``: documents prepared on the calling thread, then
indexed, stored and published on the database's indexer threads, so that both cores work.

A chunk of documents goes through two stages:
1. **prepare** (calling thread): each document identified (``_id`` and ``_event_time``
   filled in where missing), serialized to the JSON bytes the row store keeps (text input
   is kept as it came: read, not parsed; a chunk's dicts are serialized in one call and
   then read as text is), and routed to its shard;
2. **put** (shard s on indexer thread s % 2, so one shard's puts stay in order while
   another shard's run beside them): the bytes indexed into the shard's mutable segment in
   one compiled pass without the GIL (which keeps their bytes in the segment's file), their
   ``_id`` entries written to RocksDB in one atomic write, and published
   (``ShardWriter.put_many``). RocksDB holds the GIL while it writes; the other indexer
   thread indexes meanwhile.

While the indexer threads put chunk k, the calling thread prepares chunk k+1; at most
``IN_FLIGHT`` chunks are under way. A chunk is visible once its puts are done, whatever
the caller does meanwhile (a streamed input may wait for more data); ``ingest()`` returns
after the last. After a put fails, the puts queued behind it are not begun.

Interpreter settings while documents are ingested (:func:`ingest_mode`):

- **The cyclic garbage collector is paused.** Ingest makes and drops millions of
  containers and creates no reference cycles, but the collector, triggered by allocation
  counts, keeps traversing them, more so the more objects the process holds. Between
  batches :func:`collect_young` collects the young generations, so cycles that the
  caller's own code (a generator feeding ingest) makes are still freed; older ones wait
  for the next full collection after the ingest.
- **The interpreter switches threads every 0.5 ms instead of 5.** The calling thread holds
  the GIL nearly all the time, and the indexer and sealer threads need it between their
  native steps; with the default interval they wait for it (measured: docs/benchmarks.md).

Both hold while any thread is inside :func:`ingest_mode`, and are undone when the last one
leaves (a collector the caller had turned off stays off; the caller's interval comes back).
"""

from __future__ import annotations

import gc
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import orjson

from rtindex import documents
from rtindex._impl import SegmentBuilder, identify_texts
from rtindex.documents import ItemError, Limits
from rtindex.errors import SchemaError
from rtindex.transform import FALLBACK, Transformation

SWITCH_INTERVAL = 0.0005
# Documents a shard takes per put: its mutable segment is checked against seal_rows and
# seal_bytes before each put, so a put of more would overshoot them by more.
PUT_DOCS = 1024
IN_FLIGHT = 2  # chunks prepared and not yet put, at most

_lock = threading.Lock()
_inside = 0  # threads inside ingest_mode()
_gc_was_enabled = False  # as found by the first of them
_interval_was = 0.005


@contextmanager
def ingest_mode() -> Iterator[None]:
    global _inside, _gc_was_enabled, _interval_was
    with _lock:
        if _inside == 0:
            _gc_was_enabled = gc.isenabled()
            _interval_was = sys.getswitchinterval()
            gc.disable()
            sys.setswitchinterval(min(_interval_was, SWITCH_INTERVAL))
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0:
                sys.setswitchinterval(_interval_was)
                if _gc_was_enabled:
                    gc.enable()


def collect_young() -> None:
    """Collect generations 0 and 1: objects made since the last collection that are still
    alive, which between two ingest batches are few (the batch before is gone)."""
    gc.collect(1)


@dataclass
class Chunk:
    """One chunk's documents on their way: what each shard takes, and what was stored."""

    per_shard: list[list[tuple[int, bytes, Any, bytes]]]  # (input index, id key, document, JSON bytes)
    generated: set[int]  # input indices of the documents given an _id just now
    ids: dict[int, Any]  # input index -> _id, of each document routed to a shard
    errors: list[ItemError] = field(default_factory=list)
    replaced: list[int] = field(default_factory=list)
    stored: list[tuple[int, bytes, int]] = field(default_factory=list)  # (input index, id key, bytes) stored
    lines: set[int] = field(default_factory=set)  # input indices of NDJSON lines (their errors name the line)
    filtered: int = 0  # documents the collection's transformation left out (its WHERE)
    puts: list = field(default_factory=list)  # (shard, its put under way: a future)

    def route(self, idx: int, doc_id: Any, id_key: bytes, doc: Any, raw: bytes, generated: bool) -> None:
        """Send input ``idx`` to the shard its id key belongs to."""
        self.ids[idx] = doc_id
        self.per_shard[documents.shard_of(id_key, len(self.per_shard))].append((idx, id_key, doc, raw))
        if generated:
            self.generated.add(idx)

    def error(self, idx: int, doc_id: Any, e: SchemaError) -> None:
        """Record that input ``idx`` was not stored, and why."""
        self.errors.append(ItemError(idx, doc_id, e.path, on_line(e.message, idx) if idx in self.lines else e.message))


def on_line(message: str, idx: int) -> str:
    """A JSON syntax error's message for line ``idx + 1`` of NDJSON text: it names the line."""
    if message.startswith("invalid JSON at byte "):
        return f"invalid JSON on line {idx + 1} at byte " + message[len("invalid JSON at byte "):]
    return message


def prepare(chunk: list, limits: Limits, n_shards: int, transform: Transformation | None = None) -> Chunk:
    """Identify, serialize and route a chunk of ``(input index, document)`` items (a document
    is a dict, a documents.Line, or the SchemaError of an input that could not be read),
    each first through ``transform`` (the collection's ingest transformation) if given.

    The chunk's dicts are serialized together (:func:`_dict_texts`), and each then takes the
    path of a document given as text: the texts are identified in one compiled call
    (``identify_texts``: ``_id`` and ``_event_time`` read by a scan of the top level, what is
    missing spliced in); a dict that path cannot take whole (an unusual ``_id`` or
    ``_event_time``, a NaN or an infinity) goes through :func:`documents.identify` and
    :func:`documents.serialize` as any dict would, and a text that path cannot take is
    parsed."""
    now = documents.now_us()
    out = Chunk([[] for _ in range(n_shards)], set(), {})
    if transform is not None:
        chunk = _transformed(chunk, transform, limits, out)
    line_type, identify, serialize = documents.Line, documents.identify, documents.serialize
    texts = _dict_texts(chunk)
    items = []  # (input index, the document, its text to identify or None)
    for pos, (idx, doc) in enumerate(chunk):
        if type(doc) is bytes:  # one JSON document as text
            doc = line_type(None, doc)
        if type(doc) is dict:
            items.append((idx, doc, texts[pos] if texts is not None else None))
        elif type(doc) is line_type:
            if doc.numbered:
                out.lines.add(idx)
            items.append((idx, doc, doc.raw if doc.doc is None else None))
        else:
            items.append((idx, doc, None))
    scanned = iter(_identified([t for _, _, t in items if t is not None], now, limits))
    for idx, doc, text in items:
        line = None
        if text is not None:
            got = next(scanned)
            if type(got) is tuple:
                doc_id, id_key, raw, generated = got
                out.route(idx, doc_id, id_key, None, raw, generated)
                continue
            if type(doc) is line_type:
                if type(got) is _Refused:
                    out.error(idx, got.doc_id, got.error)
                    continue
                got = _parsed(doc.raw, limits)
                if type(got) is _Refused:
                    out.error(idx, got.doc_id, got.error)
                    continue
                doc.doc = got
        if type(doc) is line_type:
            doc, line = doc.doc, doc.raw
        elif isinstance(doc, SchemaError):
            out.errors.append(ItemError(idx, None, doc.path, doc.message))
            continue
        try:
            doc_id, id_key, d, raw = identify(doc, now, True, line)
            if line is not None and raw is None:
                # a text stored as its parse serializes (its _id or _event_time converted) is
                # checked as text first: the parse lets a key twice, or an integer past 64 bits
                # (as a float), pass, and the indexer never sees the text
                bad = json_error(line, limits.max_depth)
                if bad is not None:
                    raise bad
            d, raw = serialize(d, raw, limits)
        except SchemaError as e:
            out.error(idx, doc.get("_id") if isinstance(doc, dict) else None, e)
            continue
        out.route(idx, doc_id, id_key, d, raw, doc.get("_id") is None)
    return out


def _transformed(chunk: list, transform: Transformation, limits: Limits, out: Chunk) -> list:
    """The chunk's documents as ``transform`` makes them: text rewritten as text where the
    transformation can (Transformation.text), else parsed first; a document it fails on is
    an error in ``out``, one its WHERE leaves out is counted there."""
    line_type = documents.Line
    items = []
    for idx, doc in chunk:
        if type(doc) is bytes:
            doc = line_type(None, doc)
        if type(doc) is line_type:
            if doc.numbered:
                out.lines.add(idx)
            if doc.doc is None and transform.takes_text and len(doc.raw) <= limits.max_document_bytes:
                try:
                    text = transform.text(doc.raw)
                except SchemaError as e:
                    out.error(idx, None, e)
                    continue
                if text is None:
                    out.filtered += 1
                    continue
                if text is not FALLBACK:
                    items.append((idx, line_type(None, text, doc.numbered)))
                    continue
            if doc.doc is None:
                got = _parsed(doc.raw, limits)
                if type(got) is _Refused:
                    out.error(idx, got.doc_id, got.error)
                    continue
                doc.doc = got
            doc = doc.doc
        if type(doc) is not dict:
            items.append((idx, doc))  # (a SchemaError, or a value that is no document: said below)
            continue
        try:
            doc = transform(doc)
        except SchemaError as e:
            out.error(idx, doc.get("_id"), e)
            continue
        if doc is None:
            out.filtered += 1
        else:
            items.append((idx, doc))
    return items


def _dict_texts(chunk: list) -> list | None:
    """The JSON text of each dict of ``chunk`` at its position (None elsewhere, and for a
    dict holding a NaN or an infinity), from :func:`documents.plain_texts`; None when there
    are none, or when one is not plain JSON (then each dict is serialized on its own, and
    converted where it needs it)."""
    dicts = [doc for _, doc in chunk if type(doc) is dict]
    texts = documents.plain_texts(dicts) if dicts else None
    if texts is None:
        return None
    it = iter(texts)
    return [next(it) if type(doc) is dict else None for _, doc in chunk]


def _identified(texts: list[bytes], now: int, limits: Limits) -> list:
    """For each document given as JSON text, identified without parsing it: ``(_id, id key,
    the text to store, whether the _id was generated)``, with ``_id`` and ``_event_time``
    added at its end when missing; a :class:`_Refused` for one too large; None for one
    that must be parsed."""
    out = identify_texts(texts, now, limits.max_document_bytes, documents.EVENT_TIME_MIN_US,
                         documents.EVENT_TIME_MAX_US, documents.new_ids)
    for i, got in enumerate(out):
        if type(got) is tuple:
            if len(got) == 2:
                out[i] = _too_large(got[0], got[1], limits)
            elif len(got[1]) > _MAX_ID_KEY:  # the scan takes a str _id by its length, not its key's
                out[i] = _Refused(got[0], SchemaError(f"_id is longer than {documents.MAX_ID_BYTES} bytes", "$._id"))
    return out


# the longest id key documents.encode_id makes: its type tag, then at most MAX_ID_BYTES
# (a string's escaped bytes and terminator)
_MAX_ID_KEY = 1 + documents.MAX_ID_BYTES


def _parsed(raw: bytes, limits: Limits):
    """A document given as text that the scan could not take whole, parsed; or why it is
    refused (a :class:`_Refused`)."""
    if len(raw) > limits.max_document_bytes:  # (not parsed: it would be refused anyway)
        return _too_large(None, len(raw), limits)
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        return _Refused(None, json_error(raw, limits.max_depth) or SchemaError(f"invalid JSON: {e}"))
    if type(doc) is not dict:  # what the indexer says of it
        return _Refused(None, json_error(raw, limits.max_depth) or SchemaError("a document must be a JSON object"))
    return doc


def _too_large(doc_id: Any, size: int, limits: Limits) -> _Refused:
    return _Refused(doc_id, SchemaError(f"document is {size} bytes, more than max_document_bytes="
                                        f"{limits.max_document_bytes}"))


class _Refused:
    """A document given as text that is refused before it is indexed, and its ``_id`` if known."""

    __slots__ = ("doc_id", "error")

    def __init__(self, doc_id: Any, error: SchemaError):
        self.doc_id = doc_id
        self.error = error


def json_error(raw: bytes, max_depth: int) -> SchemaError | None:
    """What the indexer says of ``raw`` (the canonical error of a document that is not
    valid JSON, or not an object), None if it takes it."""
    _, errors = SegmentBuilder(None, 0, max_depth).add_json([raw])
    return errors[0][1] if errors else None


class Pipeline:
    """Chunks of documents through the shards of one collection (see the module docstring).

    ``add`` takes the next chunk; ``drain`` waits until every chunk added is stored (and
    raises the first failure). Finished chunks go to ``done`` in order, one at a time.
    """

    def __init__(self, shards: list, limits: Limits, indexers: tuple, done, transform: Transformation | None = None):
        self._shards = shards
        self._transform = transform
        self._limits = limits
        self._indexers = indexers  # empty: put on the calling thread
        self._done = done
        self._chunks: list[Chunk] = []  # added and not yet handed to done, in order
        self._failed: BaseException | None = None  # the first put that failed: later ones are not begun

    def add(self, chunk: list) -> None:
        """Prepare a chunk (while the ones before are put) and queue its puts."""
        n = len(self._shards)
        step = PUT_DOCS * n
        for start in range(0, len(chunk), step):
            c = prepare(chunk[start : start + step], self._limits, n, self._transform)
            while len(self._chunks) >= IN_FLIGHT:
                self._finish_first()
            if self._failed is not None:
                raise self._failed
            for s, items in enumerate(c.per_shard):
                if items:
                    if not self._indexers:
                        c.puts.append((s, _Done(self._put, s, items, c.generated)))
                    else:
                        indexer = self._indexers[s % len(self._indexers)]
                        c.puts.append((s, indexer.submit(self._put, s, items, c.generated)))
            self._chunks.append(c)
            self._hand_over()

    def drain(self) -> None:
        """Wait for every chunk added; the first failure is raised (after all stopped)."""
        while self._chunks:
            self._finish_first()
        if self._failed is not None:
            raise self._failed

    def _put(self, s: int, items: list, generated: set[int]):
        """On the indexer thread: one shard's part of a chunk, unless a put failed before."""
        if self._failed is not None:
            return None
        try:
            return self._shards[s].put_many(items, generated)
        except BaseException as e:
            self._failed = e
            raise

    def _finish_first(self) -> None:
        """Wait for the oldest chunk's puts, take their results, and hand it to ``done``."""
        c = self._chunks.pop(0)
        for _, put in c.puts:
            try:
                got = put.result()
            except BaseException:  # (kept in _failed: drain or add raises it)
                continue
            if got is None:
                continue
            errors, replaced, items = got
            c.replaced.extend(replaced)
            for idx, e in errors:
                c.error(idx, c.ids.get(idx), e)
            c.stored.extend((idx, id_key, len(raw)) for idx, id_key, _, raw, off in items if off >= 0)
        c.puts = []
        if self._failed is None:
            self._done(c)

    def _hand_over(self) -> None:
        """Hand over the chunks at the front whose puts are done, without waiting."""
        while self._chunks and all(put.done() for _, put in self._chunks[0].puts):
            self._finish_first()


class _Done:
    """A call made at once, shaped as the future an executor returns."""

    __slots__ = ("_value", "_error")

    def __init__(self, fn, *args):
        self._value = self._error = None
        try:
            self._value = fn(*args)
        except BaseException as e:
            self._error = e

    def done(self) -> bool:
        return True

    def result(self):
        if self._error is not None:
            raise self._error
        return self._value
