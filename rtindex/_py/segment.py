"""Reference mutable segment: small and obviously correct, the oracle for ``_ext/_segment``.

A mutable segment holds the documents ingested since the last seal, indexed in memory:
- postings: term bytes -> increasing row offsets (row id - segment base);
- columns: column key (path + type tag) -> (offsets, values) for values not inside arrays;
- rows: each document's JSON bytes.

Documents arrive as JSON bytes (``add_json``: parsed by ``rtindex/_py/jsonparse.py``, whose
rules the compiled scanner follows) or as Arrow columns (``add_columns``). Flattening rules
(docs/architecture.md repeats them):
- nested objects flatten to paths (tuples of names); non-root objects add an OBJECT marker term;
- an array adds an ARRAY marker term at its path, and each element is indexed under the same
  path (objects inside arrays flatten below it, nested arrays are flattened the same way);
- the column store gets one value per (path, type) for leaves outside arrays; an array at a
  path outside arrays is stored whole as JSON text in its ARRAY column (its source text
  without the whitespace outside strings);
- a top-level ``_event_time`` int is a TIMESTAMP; everything else is NULL/BOOL/INT/FLOAT/STRING.

It keeps everything in process memory: the compiled builder's file, which other processes
attach, has no counterpart here.
"""

from __future__ import annotations

import bisect
import math
import operator
import os
from array import array
from typing import Any, Callable

import orjson
import pyarrow as pa

from rtindex import columns, keys
from rtindex._py.blocks import BlockWriter
from rtindex._py.jsonparse import parse_document
from rtindex.errors import SchemaError


def nonfinite_path(doc: Any) -> tuple[list, float] | None:
    """``(path, value)`` of the first NaN or infinite float in ``doc`` (dicts, lists and
    tuples nested, in the order orjson serializes them), or None."""
    if isinstance(doc, float):
        return None if math.isfinite(doc) else ([], doc)
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, (list, tuple)) else ()
    for k, v in items:
        found = nonfinite_path(v)
        if found is not None:
            return [k] + found[0], found[1]
    return None


def scan_top(raw: bytes) -> tuple:
    """``(status, _id, id key, _event_time, position of the closing brace, has members)`` of
    a JSON document (the contract of the compiled ``scan_top``): status 0 when ``_id`` is
    absent, a str (at most 1,024 bytes, no escape) or an int, and ``_event_time`` absent or
    an int; 1 when one is something else; 2 when ``raw`` is not a JSON object."""
    if type(raw) is not bytes:
        raise TypeError(f"scan_top takes bytes, not {type(raw).__name__}")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return 2, None, None, None, 0, False
    if not isinstance(doc, dict):
        return 2, None, None, None, 0, False
    close = len(raw.rstrip()) - 1
    status, doc_id, id_key, et = 0, doc.get("_id"), None, doc.get("_event_time")
    if type(doc_id) is str and len(doc_id.encode("utf-8", "surrogatepass")) <= 1024 and b"\\" not in raw:
        id_key = bytes((keys.STRING,)) + keys.encode_string(doc_id)
    elif type(doc_id) is int and keys.INT_MIN <= doc_id <= keys.INT_MAX:
        id_key = bytes((keys.INT,)) + keys.encode_int(doc_id)
    elif doc_id is not None or "_id" in doc:
        status, doc_id = 1, None
    if et is not None and not (type(et) is int and keys.INT_MIN <= et <= keys.INT_MAX):
        status, et = 1, None
    elif et is None and "_event_time" in doc:
        status = 1
    if status:
        return 1, None, None, None, close, bool(doc)
    return 0, doc_id, id_key, et, close, bool(doc)


def identify_texts(texts: list[bytes], now_us: int, max_bytes: int, et_min: int, et_max: int,
                   new_ids: Callable[[int], list[str]]) -> list[tuple | None]:
    """For each text, ``(_id, id key, text to store, generated)``, ``(_id or None, size)``
    for one too large, or None for one to parse (the contract of the compiled
    ``identify_texts``)."""
    scans = [scan_top(raw) for raw in texts]
    fresh = iter(new_ids(sum(1 for sc in scans if sc[0] == 0 and sc[1] is None)))
    out: list[tuple | None] = []
    for raw, (status, doc_id, id_key, et, close, members) in zip(texts, scans):
        if status != 0:
            out.append(None)
            continue
        if len(raw) > max_bytes:
            out.append((doc_id, len(raw)))
            continue
        if et is not None and not et_min <= et < et_max:
            out.append(None)
            continue
        added = b""
        generated = doc_id is None
        if generated:
            doc_id = next(fresh)
            id_key = bytes((keys.STRING,)) + keys.encode_string(doc_id)
            added = b'"_id":"' + doc_id.encode() + b'"'
        if et is None:
            added += (b"," if added else b"") + b'"_event_time":' + str(now_us).encode()
        if not added:
            out.append((doc_id, id_key, raw.strip(b" \t\r\n"), False))
            continue
        text = raw[:close].rstrip(b" \t\r\n") + (b"," if members else b"") + added + b"}"
        out.append((doc_id, len(text)) if len(text) > max_bytes else (doc_id, id_key, text, generated))
    return out


def split_array(data: bytes, start: int = 0) -> list[bytes] | None:
    """The elements of the JSON array at ``data[start:]`` as bytes each (the contract of the
    compiled ``split_array``): here each re-serialized from a parse, None if it does not parse."""
    try:
        docs = orjson.loads(data[start:])
    except orjson.JSONDecodeError:
        return None
    return [orjson.dumps(d) for d in docs] if isinstance(docs, list) else None


def member_span(data: bytes, key: str) -> tuple[int, int] | None:
    """``(start, end)`` of the value of the top-level member ``key`` of the JSON object
    ``data`` (the contract of the compiled ``member_span``): found by a small scan here."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or key not in doc:
        return None
    text = orjson.dumps(doc[key])
    at = data.find(text)
    return None if at < 0 else (at, at + len(text))


def top_rewrite(data: bytes, keys: tuple, n_drop: int, renames: tuple, reads: tuple) -> tuple[bytes, bytes] | None:
    """The contract of the compiled ``top_rewrite``, from a parse: the kept and renamed
    members and the values read, re-serialized (the compiled one copies their text, and
    writes a renamed member where its source was). A key it cannot find written once as
    ``"key":`` in the text (escaped, spaced, twice, or also below) makes it None: that text
    goes the parse way."""
    if type(data) is not bytes:
        raise TypeError(f"top_rewrite takes bytes, not {type(data).__name__}")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    written = {orjson.dumps(k)[1:-1]: v for k, v in doc.items()}
    if any(data.count(b'"' + k + b'":') != 1 for k in written):
        return None  # a key written otherwise, or twice (or again below: then the parse way is taken too)
    dropped = set(keys[:n_drop])
    new = {k: r for k, r in zip(keys, renames) if r is not None}
    parts = []
    for k, v in written.items():
        if k not in dropped:
            parts.append(b'"' + k + b'":' + orjson.dumps(v))
        if k in new and v is not None:
            parts.append(new[k] + orjson.dumps(v))
    return b",".join(parts), orjson.dumps([written.get(keys[k]) for k in reads])


class _NotUtf8:
    """Where a string column holds bytes that are not UTF-8: ``walk`` refuses it."""


def _python_values(arr: pa.Array) -> list:
    """``arr.to_pylist()``, with a :class:`_NotUtf8` for each string that is not UTF-8."""
    if arr.type not in (pa.string(), pa.large_string()):
        return arr.to_pylist()
    out = []
    for b in arr.cast(pa.large_binary()).to_pylist():
        try:
            out.append(None if b is None else b.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(_NotUtf8())
    return out


def walk(doc: dict, max_depth: int) -> tuple[list[bytes], list[tuple[bytes, Any]]]:
    """The terms and column values of ``doc`` (a dict of JSON values), or the SchemaError of
    its first value that cannot be indexed, with its path."""
    if not isinstance(doc, dict):
        raise SchemaError(f"a document must be a JSON object, not {type(doc).__name__}")
    terms: list[bytes] = []
    cols: list[tuple[bytes, Any]] = []
    _walk_object(doc, (), [], 1, max_depth, False, terms, cols)
    return terms, cols


def _walk_object(obj, path, where, depth, max_depth, in_array, terms, cols):
    if depth > max_depth:
        raise SchemaError(f"nesting deeper than {max_depth} levels", keys.json_path(where))
    for k, v in obj.items():
        if not isinstance(k, str):
            raise SchemaError(f"object keys must be strings, not {type(k).__name__}", keys.json_path(where))
        _walk_value(v, path + (k,), where + [k], depth, max_depth, in_array, terms, cols, top=depth == 1)


def _walk_value(v, path, where, depth, max_depth, in_array, terms, cols, top=False):
    if isinstance(v, str):
        try:
            enc = keys.encode_string(v)
        except UnicodeEncodeError:
            raise SchemaError("string is not valid UTF-8 (lone surrogate)", keys.json_path(where)) from None
        _leaf(path, keys.STRING, enc, v, in_array, terms, cols)
    elif v is None:
        _leaf(path, keys.NULL, b"", None, in_array, terms, cols)
    elif v is True or v is False:
        _leaf(path, keys.BOOL, b"\x01" if v else b"\x00", v, in_array, terms, cols)
    elif isinstance(v, int):
        if not keys.INT_MIN <= v <= keys.INT_MAX:
            raise SchemaError("integer outside the signed 64-bit range", keys.json_path(where))
        tag = keys.TIMESTAMP if top and path == ("_event_time",) else keys.INT
        _leaf(path, tag, keys.encode_int(v), int(v), in_array, terms, cols)
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise SchemaError(f"non-finite number {v!r} (JSON has no NaN or Infinity)", keys.json_path(where))
        v = v + 0.0  # -0.0 -> 0.0
        _leaf(path, keys.FLOAT, keys.encode_float(v), v, in_array, terms, cols)
    elif isinstance(v, _NotUtf8):
        raise SchemaError("invalid UTF-8 in a string", keys.json_path(where))
    elif isinstance(v, dict):
        terms.append(keys.encode_path(path) + bytes((keys.OBJECT,)))
        _walk_object(v, path, where, depth + 1, max_depth, in_array, terms, cols)
    elif isinstance(v, (list, tuple)):
        if depth + 1 > max_depth:
            raise SchemaError(f"nesting deeper than {max_depth} levels", keys.json_path(where))
        terms.append(keys.encode_path(path) + bytes((keys.ARRAY,)))
        for i, item in enumerate(v):
            _walk_value(item, path, where + [i], depth + 1, max_depth, True, terms, cols)
        if not in_array:
            text = getattr(v, "json", None)  # the source text of a parsed array
            cols.append((keys.encode_path(path) + bytes((keys.ARRAY,)),
                         text if text is not None else orjson.dumps(v).decode()))
    else:
        raise SchemaError(f"unsupported value type {type(v).__name__}", keys.json_path(where))


def _leaf(path, tag, enc, value, in_array, terms, cols):
    ck = keys.encode_path(path) + bytes((tag,))
    terms.append(ck + enc)
    if not in_array:
        cols.append((ck, value))


PY_TAIL_MAGIC = b"RTPYTAIL"  # the reference builder's file: this, then (u32 length, bytes) per row


def tail_rows(path, start: int, stop: int) -> list[bytes]:
    """Rows ``start`` .. ``stop - 1`` of the reference builder's file ``path`` (see the
    compiled ``tail_rows``); ValueError where the file does not hold one."""
    if start < 0 or stop < start:
        raise ValueError(f"tail_rows({start}, {stop})")
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(PY_TAIL_MAGIC):
        raise ValueError(f"{path} is not a mutable segment file of the reference builder")
    out, at, i = [], len(PY_TAIL_MAGIC), 0
    while i < stop:
        n = int.from_bytes(data[at : at + 4], "little")
        if at + 4 + n > len(data) or at + 4 > len(data):
            raise ValueError(f"{path}: row {i} is not in the file")
        if i >= start:
            out.append(data[at + 4 : at + 4 + n])
        at += 4 + n
        i += 1
    return out


class SegmentBuilder:
    """In-memory postings, column values and row bytes of the newest rows of one shard."""

    def __init__(self, path=None, base: int = 0, max_depth: int = 64):
        self.max_depth = max_depth
        self.path = path
        self.base = operator.index(base)
        # with a path, the rows' bytes also go to a file, each batch written through before
        # add_json/add_columns return, so that a restarted writer finds them (``tail_rows``)
        self._fd = -1
        if path is not None:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            os.write(self._fd, PY_TAIL_MAGIC)
        self.writer = True
        self._postings: dict[bytes, array] = {}
        self._terms_by_column: dict[bytes, list[bytes]] = {}
        self._columns: dict[bytes, tuple[array, list]] = {}
        self._rows: list[bytes] = []
        self._published = (0, 0)
        self._nbytes = 0

    @staticmethod
    def attach(path):
        raise NotImplementedError("following another process's mutable segment needs the compiled extension "
                                  "(RTINDEX_PURE_PYTHON=1 runs the reference code, which keeps it in memory)")

    @property
    def n_rows(self) -> int:
        return len(self._rows)

    @property
    def nbytes(self) -> int:
        """Approximate memory held (term bytes + 4 per posting entry + column values + rows)."""
        return self._nbytes

    @property
    def published(self) -> tuple[int, int]:
        return self._published

    def publish(self, rows: int, log_seq: int) -> None:
        rows, log_seq = operator.index(rows), operator.index(log_seq)
        if rows < 0 or log_seq < 0:
            raise ValueError(f"publish({rows}, {log_seq}): both must be non-negative")
        if rows > len(self._rows):
            raise ValueError(f"publish({rows}) of a segment holding {len(self._rows)} rows")
        self._published = (rows, log_seq)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()

    def unlink(self) -> None:
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def sync(self) -> None:
        """fdatasync the rows' file (a process crash never loses what was written)."""
        if self._fd >= 0:
            os.fsync(self._fd)

    def _write_through(self, raws: list[bytes]) -> None:
        if self._fd >= 0 and raws:
            data = b"".join(len(r).to_bytes(4, "little") + r for r in raws)
            while data:
                data = data[os.write(self._fd, data):]

    def add_json(self, docs: list[bytes]) -> tuple[list[int], list[tuple[int, SchemaError]]]:
        """Index each JSON document as the next row, each all or nothing: ``(offsets,
        errors)``, an offset of -1 for a refused document and ``(index, SchemaError)`` in
        ``errors`` for it."""
        docs = list(docs)
        for raw in docs:
            if type(raw) is not bytes:
                raise TypeError(f"add_json takes a list of bytes, not of {type(raw).__name__}")
        offsets, errors = [], []
        for i, raw in enumerate(docs):
            try:
                terms, cols = walk(parse_document(raw, self.max_depth), self.max_depth)
            except SchemaError as e:
                offsets.append(-1)
                errors.append((i, e))
                continue
            offsets.append(self._apply(terms, cols, raw))
        self._write_through([raw for raw, off in zip(docs, offsets) if off >= 0])
        return offsets, errors

    def add_columns(self, names, arrays, raws) -> int:
        """Index the rows of ``arrays`` (pyarrow Arrays of ``columns.INDEXABLE_TYPES``, the
        columns ``names``) as the next rows, with ``raws`` their JSON bytes; returns the
        offset of the first. The same as indexing ``dict(zip(names, row))`` for each row, a
        row's values as ``Array.to_pylist()`` gives them (a null is a JSON null); all or
        nothing: every row is walked (and so checked) before any is indexed."""
        names, arrays, n = columns.check_batch(names, arrays)
        raws = list(raws)
        if len(raws) != n:
            raise ValueError(f"add_columns got {n} rows and {len(raws)} row texts")
        for raw in raws:
            if type(raw) is not bytes:
                raise TypeError(f"add_columns takes the rows' texts as bytes, not {type(raw).__name__}")
        for name in names:
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise SchemaError("key is not valid UTF-8 (lone surrogate)", "$") from None
        rows = zip(*(_python_values(arr) for arr in arrays))
        indexed = [walk(dict(zip(names, row)), self.max_depth) for row in rows]
        off = len(self._rows)
        for (terms, cols), raw in zip(indexed, raws):
            self._apply(terms, cols, raw)
        self._write_through(raws)
        return off

    def _apply(self, terms: list[bytes], cols: list[tuple[bytes, Any]], raw: bytes) -> int:
        """Add a walked document's terms and column values as the next row."""
        off = len(self._rows)
        for t in terms:
            plist = self._postings.get(t)
            if plist is None:
                plist = self._postings[t] = array("I")
                ck = keys.column_key_of(t)
                self._terms_by_column.setdefault(ck, []).append(t)
                self._nbytes += len(t) + 64
            if not plist or plist[-1] != off:
                plist.append(off)
                self._nbytes += 4
        for ck, v in cols:
            col = self._columns.get(ck)
            if col is None:
                col = self._columns[ck] = (array("I"), [])
            col[0].append(off)
            col[1].append(v)
            self._nbytes += 16 + (len(v) if isinstance(v, str) else 8)
        self._rows.append(raw)
        self._nbytes += len(raw)
        return off

    def row(self, offset: int) -> bytes:
        """The JSON bytes of row ``offset``."""
        if not 0 <= offset < len(self._rows):
            raise IndexError(f"row {offset} is not in this mutable segment")
        return self._rows[offset]

    def postings(self, term: bytes, limit: int) -> array:
        """Offsets (< ``limit``) of the rows holding ``term``, increasing; a new array."""
        plist = self._postings.get(term)
        if plist is None:
            return array("I")
        return plist[: bisect.bisect_left(plist, operator.index(limit))]

    def column_terms(self, column_key: bytes) -> list[bytes]:
        """Every distinct term of one column key (path + type), in no particular order."""
        return list(self._terms_by_column.get(column_key, ()))

    def column_keys(self) -> list[bytes]:
        """Column keys (path + type) that have at least one term, sorted."""
        return sorted(self._terms_by_column)

    def sorted_postings(self) -> list[tuple[bytes, array]]:
        """All (term, offsets) pairs sorted by term: what a seal writes."""
        return [(t, self._postings[t]) for t in sorted(self._postings)]

    def columns(self) -> list[tuple[bytes, array, pa.Array]]:
        """(column key, offsets, values) for every column with values, sorted by column key;
        the values as an Arrow array of ``columns.ARROW_TYPES[tag]`` (what a seal writes)."""
        return [(ck, offs, columns.values_array(ck[-1], vals))
                for ck, (offs, vals) in sorted(self._columns.items())]

    def dense_columns(self) -> list[tuple[bytes, pa.Array]]:
        """(column key, values) of every column with values, sorted by column key, one value
        per row (null where a row has none): what a seal writes."""
        n = len(self._rows)
        return [(ck, columns.dense(ck[-1], offs, vals, n)) for ck, offs, vals in self.columns()]

    def write_blocks(self, target_bytes: int = 16384) -> list[tuple[bytes, bytes]]:
        """The term blocks of a seal: ``BlockWriter(target_bytes)`` fed ``sorted_postings()``.

        Returns ``[(first_term, block), ...]``: each block ``add`` returned, then ``finish()``.
        """
        writer = BlockWriter(target_bytes)
        out = []
        for term, offsets in self.sorted_postings():
            block = writer.add(term, offsets)
            if block is not None:
                out.append(block)
        block = writer.finish()
        if block is not None:
            out.append(block)
        return out

    def column(self, column_key: bytes, limit: int) -> tuple[array, pa.Array]:
        """(offsets, values) of one column's rows with offset < ``limit``: a new array('I')
        and a new Arrow array of ``columns.ARROW_TYPES[tag]``.

        A column key the builder has no values of gives ``(array('I'), an empty array)``,
        typed by the key's last byte when that is a value type tag (else of type null).
        """
        col = self._columns.get(column_key)
        limit = operator.index(limit)
        if col is None:
            tag = column_key[-1] if isinstance(column_key, bytes) and column_key else None
            return array("I"), pa.array([], type=columns.ARROW_TYPES.get(tag, pa.null()))
        cut = bisect.bisect_left(col[0], limit)
        return col[0][:cut], columns.values_array(column_key[-1], col[1][:cut])

    def column_size(self, column_key: bytes, limit: int) -> int:
        """How many rows with offset < ``limit`` have a value in this column (no copy)."""
        col = self._columns.get(column_key)
        limit = operator.index(limit)
        return 0 if col is None else bisect.bisect_left(col[0], limit)
