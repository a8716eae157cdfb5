"""What ``Collection.ingest`` reads: documents from every input a data scientist has.

Each input becomes an :class:`Input`: ``(position, document)`` pairs, read as they are
needed (files and tables in bounded batches, never whole, except a JSON array file), plus
what a progress bar needs. The position is what ``ItemError.index`` reports: the index in
a list or a JSON array, the line number - 1 in NDJSON, the row number (0-based) in a
DataFrame, an Arrow table or a Parquet file.

- an iterable of dicts (a list, a generator): as it is;
- ``bytes``, or a ``str`` that starts with ``[`` or ``{``: JSON array or NDJSON text;
- a ``str`` or ``os.PathLike`` naming a file, by its extension (:data:`EXTENSIONS`), or an
  open file (text or binary), by its content: NDJSON or a JSON array, also gzip-compressed,
  or Parquet;
- a pandas DataFrame (named index levels become fields, as ``reset_index()`` would make
  them), a pyarrow Table, RecordBatch or RecordBatchReader, or anything else that exports
  an Arrow stream (``__arrow_c_stream__``: polars, DuckDB relations).

Tables are converted a column at a time (numbers and times by numpy), with the value rules
of :func:`rtindex.documents.json_value`; a missing value in a cell (None, NaN, NaT, pd.NA)
is null there, because that is what it means in a DataFrame.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import math
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from rtindex.documents import Line, array_values, json_value, parse_input, parse_lines
from rtindex.errors import InvalidArgumentError, SchemaError

_BOM = "\ufeff".encode()
# file name ending -> format; the JSON ones may also end in .gz
EXTENSIONS = {".ndjson": "ndjson", ".jsonl": "ndjson", ".json": "json", ".parquet": "parquet"}
_SUPPORTED = ".ndjson, .jsonl, .json (each also .gz) and .parquet"
_GZIP_MAGIC = b"\x1f\x8b"
_PARQUET_MAGIC = b"PAR1"


@dataclass
class Input:
    """Documents to ingest and how to show progress through them."""

    items: Iterator[tuple[int, Any]]  # (position, document, or SchemaError for a line that is not JSON)
    total: int | None = None  # in ``unit``s, when known
    unit: str = "docs"  # "docs": progress counts documents; "B": bytes of a file
    tell: Callable[[], int] | None = None  # bytes of the file read so far (unit "B")
    # a table's record batches of at most batch_size rows, with the position of their first
    # row: what ``items`` yields, before it is made dicts (Collection.ingest indexes them
    # column-wise, rtindex.columnar); a list of (position, document) instead for a part of
    # a DataFrame that Arrow cannot hold exactly. A consumer reads one of the two, never both.
    batches: Iterator[tuple[int, pa.RecordBatch | list[tuple[int, dict]]]] | None = None
    json_text: bool = False  # JSON text or a JSON file: one object there may hold the documents meant
    _close: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def __enter__(self) -> Input:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close.close()  # the files this module opened (never the caller's)


def open_input(docs: Any, batch_size: int, json_path: str | None = None) -> Input:
    """The :class:`Input` of anything ``Collection.ingest`` takes (see the module doc);
    with ``json_path``, the documents of the array at that dotted path of one JSON document
    (JSON text, a JSON file or an open one)."""
    if json_path is not None:
        return _at_json_path(docs, json_path, batch_size)
    if isinstance(docs, (bytes, bytearray, memoryview)):
        return Input(parse_input(bytes(docs)), json_text=True)
    if isinstance(docs, str):
        if docs.lstrip()[:1] in ("", "[", "{"):
            return Input(parse_input(docs), json_text=True)
        if os.path.isfile(docs):
            return open_file(docs, batch_size)
        raise InvalidArgumentError(f"ingest() got a str that is neither JSON text (which starts with [ or {{) nor "
                                   f"the path of a file: {docs[:100]!r}")
    if isinstance(docs, os.PathLike):
        return open_file(docs, batch_size)
    if isinstance(docs, dict):
        raise TypeError("ingest() takes an iterable of documents; wrap a single document in a list")
    if hasattr(docs, "read"):
        return _open_stream(docs, batch_size)
    # a DataFrame exists only if pandas was imported (maybe still being imported, in another thread)
    dataframe = getattr(sys.modules.get("pandas"), "DataFrame", None)
    if dataframe is not None and isinstance(docs, dataframe):
        slices = _dataframe_slices(docs, batch_size)
        return Input(itertools.chain.from_iterable(itertools.starmap(slice_rows, slices)), total=len(docs),
                     batches=slices)
    if isinstance(docs, pa.Table):
        return _table_input(docs.to_batches(max_chunksize=batch_size), batch_size, docs.num_rows)
    if isinstance(docs, pa.RecordBatch):
        return _table_input([docs], batch_size, docs.num_rows)
    if isinstance(docs, pa.RecordBatchReader):
        return _table_input(docs, batch_size)
    if hasattr(type(docs), "__arrow_c_stream__"):
        return _table_input(pa.RecordBatchReader.from_stream(docs), batch_size)
    try:
        it = iter(docs)
    except TypeError:
        raise TypeError(f"ingest() takes an iterable of dicts, JSON text, a file (path or open file), a "
                        f"DataFrame or an Arrow table, not {type(docs).__name__}") from None
    return Input(enumerate(it), total=len(docs) if isinstance(docs, Sized) else None)


def _at_json_path(docs: Any, json_path: str, batch_size: int) -> Input:
    """The documents of the array at ``json_path`` in one JSON document, read whole."""
    if not isinstance(json_path, str) or not json_path or any(not k for k in json_path.split(".")):
        raise InvalidArgumentError(f"json_path is the dotted path of an array in the JSON document, such as "
                                   f"'statuses' or 'data.items', not {json_path!r}")
    if isinstance(docs, (bytes, bytearray, memoryview, str)) and not (
            isinstance(docs, str) and docs.lstrip()[:1] not in ("[", "{") and os.path.isfile(docs)):
        text = bytes(docs) if not isinstance(docs, str) else docs
    elif isinstance(docs, (str, os.PathLike)):
        source = open_file(docs, batch_size)
        if source.unit != "B":
            raise InvalidArgumentError("json_path picks an array inside one JSON document: a .json file, "
                                       "not a Parquet one")
        with source:
            docs = [d for _, d in source.items]
        if len(docs) != 1:
            raise InvalidArgumentError(f"json_path picks an array inside one JSON document; the file holds {len(docs)}")
        return _elements_at(docs[0], json_path)
    elif hasattr(docs, "read"):
        text = docs.read()
    else:
        raise TypeError(f"json_path picks an array inside one JSON document: give its text or a file, "
                        f"not {type(docs).__name__}")
    try:
        whole = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InvalidArgumentError(f"json_path needs one JSON document, and this is not one: {e}") from None
    return _elements_at(whole, json_path)


def _elements_at(doc: Any, json_path: str) -> Input:
    value, seen = doc, []
    if isinstance(value, Line):
        value = value.doc if value.doc is not None else orjson.loads(value.raw)
    if isinstance(value, SchemaError):
        raise InvalidArgumentError(f"json_path needs one JSON document, and this is not one: {value.message}")
    for key in json_path.split("."):
        if not isinstance(value, dict) or key not in value:
            where = ".".join(seen) or "the document"
            fields = ", ".join(map(repr, list(value)[:10])) if isinstance(value, dict) else "none: not an object"
            raise InvalidArgumentError(f"json_path={json_path!r}: {where} has no field {key!r} (its fields: {fields})")
        value = value[key]
        seen.append(key)
    if not isinstance(value, list):
        raise InvalidArgumentError(f"json_path={json_path!r} holds a {type(value).__name__}, not an array of documents")
    return Input(enumerate(value), total=len(value))


def array_of_objects(doc: Any, depth: int = 3) -> tuple[str, int] | None:
    """(dotted path, length) of the longest array of objects (2 or more) in ``doc``, looked
    for ``depth`` objects deep: what a JSON file that is one object usually holds the
    documents in (a tweet search's ``statuses``, an API's ``data``). Only paths that a
    ``json_path`` can name: no empty key, no key with a dot."""
    best = None
    if isinstance(doc, dict) and depth:
        for key, value in doc.items():
            if not isinstance(key, str) or not key or "." in key:
                continue
            if isinstance(value, list) and len(value) >= 2 and all(isinstance(v, dict) for v in value[:100]):
                found = (key, len(value))
            else:
                inner = array_of_objects(value, depth - 1)
                found = (f"{key}.{inner[0]}", inner[1]) if inner else None
            if found and (best is None or found[1] > best[1]):
                best = found
    return best


def open_file(path: str | os.PathLike, batch_size: int) -> Input:
    """The :class:`Input` of a file, whose format its name says (:data:`EXTENSIONS`).

    NDJSON is read a line at a time and Parquet a batch of rows at a time; a JSON array is
    read whole. A ``.json`` file holds a JSON array, or NDJSON when its first non-blank
    character is not ``[``. Progress counts bytes of the file (compressed ones for ``.gz``)
    for JSON, and rows for Parquet (its footer says how many).
    """
    path = os.fspath(path)
    name = os.path.basename(path).lower()
    compressed = name.endswith(".gz")
    stem = name[:-3] if compressed else name
    fmt = next((f for ext, f in EXTENSIONS.items() if stem.endswith(ext)), None)
    if fmt is None or (compressed and fmt == "parquet"):
        raise InvalidArgumentError(f"cannot tell the format of {path!r} from its name: rtindex reads files ending "
                                   f"in {_SUPPORTED} (or pass an open file to ingest(), whose content is looked at)")
    size = os.path.getsize(path)  # FileNotFoundError naming the path, before anything is read
    source = Input(iter(()))
    if fmt == "parquet":
        pf = source._close.enter_context(pq.ParquetFile(path))
        table = _table_input(pf.iter_batches(batch_size=batch_size), batch_size, pf.metadata.num_rows)
        source.items, source.batches, source.total = table.items, table.batches, table.total
        return source
    raw = source._close.enter_context(open(path, "rb"))
    stream = source._close.enter_context(gzip.GzipFile(fileobj=raw)) if compressed else raw
    source.items = parse_lines(_without_bom(stream)) if fmt == "ndjson" else _json_any(stream)
    source.total, source.unit, source.tell, source.json_text = size, "B", raw.tell, fmt == "json"
    return source


def _open_stream(f: Any, batch_size: int) -> Input:
    """An open file of the caller's (left open). A binary one is Parquet or gzip when it
    starts with their magic bytes (seen with ``peek()`` or ``seek()``; a stream with neither
    is taken as JSON), else JSON, as a text one is."""
    source = Input(iter(()))
    head = b"" if isinstance(f.read(0), str) else _peek(f, 4)
    if head == _PARQUET_MAGIC:
        pf = pq.ParquetFile(f)
        return _table_input(pf.iter_batches(batch_size=batch_size), batch_size, pf.metadata.num_rows)
    gz = head[:2] == _GZIP_MAGIC
    source.items = _json_any(source._close.enter_context(gzip.GzipFile(fileobj=f)) if gz else f)
    try:  # progress by bytes, when it is a file on disk (not a pipe)
        raw = getattr(f, "buffer", f)  # a text file's position is not known while it is iterated
        st = os.fstat(f.fileno())
        raw.tell()
    except (AttributeError, OSError, ValueError):
        return source
    if stat.S_ISREG(st.st_mode):
        source.total, source.unit, source.tell = st.st_size, "B", raw.tell
    return source


def _peek(f: Any, n: int) -> bytes:
    peek = getattr(f, "peek", None)
    if peek is not None:
        return peek(n)[:n]
    if getattr(f, "seekable", lambda: False)():
        pos = f.tell()
        head = f.read(n)
        f.seek(pos)
        return head
    return b""


def _json_any(stream: Any) -> Iterator[tuple[int, Any]]:
    """A JSON array (read whole), NDJSON (a line at a time), or one pretty-printed object
    (a first line that opens an object and is not one by itself): the first non-blank line
    tells."""
    head = []
    stream = _without_bom(stream)
    for line in stream:
        head.append(line)
        if line.strip():
            break
    first = head[-1].lstrip()[:1] if head else ""
    if first in (b"[", "["):
        yield from parse_input(head[-1][:0].join(itertools.chain(head, stream)))
        return
    if first in (b"{", "{") and not _is_json(head[-1]):
        text = head[-1][:0].join(itertools.chain(head, stream))
        try:
            yield 0, orjson.loads(text)
        except orjson.JSONDecodeError as e:  # orjson's message says the line and column
            yield 0, SchemaError(f"invalid JSON (one object over several lines): {e}")
        return
    yield from parse_lines(itertools.chain(head, stream))


def _without_bom(lines: Iterable[bytes | str]) -> Iterator[bytes | str]:
    """The lines, without the UTF-8 byte order mark some editors write first."""
    lines = iter(lines)
    for first in lines:
        yield first.removeprefix(_BOM if isinstance(first, bytes) else _BOM.decode())
        break
    yield from lines


def _is_json(line: bytes | str) -> bool:
    try:
        orjson.loads(line)
        return True
    except orjson.JSONDecodeError:
        return False


# -- tables ------------------------------------------------------------------------------
def _dataframe_slices(df: Any, batch_size: int) -> Iterator[tuple[int, pa.RecordBatch | list[tuple[int, dict]]]]:
    """``df`` (named index levels first, as fields) ``batch_size`` rows at a time: a record
    batch of what the rows mean, or the rows themselves where a column holds values Arrow
    would change (an object column of anything but strings: ints and floats mixed, dicts),
    or that has no column."""
    levels = [i for i, n in enumerate(df.index.names) if n is not None]
    names = _field_names([df.index.names[i] for i in levels] + list(df.columns))
    for start in range(0, len(df), batch_size):
        part = df.iloc[start:start + batch_size]
        cols = [part.index.get_level_values(i) for i in levels] + [part.iloc[:, j] for j in range(part.shape[1])]
        arrays = [_arrow_of_pandas(c) for c in cols]
        if arrays and all(a is not None for a in arrays):  # (no column: a batch would have no rows)
            yield start, pa.RecordBatch.from_arrays(arrays, names=names)
        else:
            values = [_pandas_values(c, name == "_event_time") for name, c in zip(names, cols)]
            yield start, list(_rows(names, values, len(part), start))


def _arrow_of_pandas(col: Any) -> pa.Array | None:
    """A DataFrame column (or index level) as Arrow holds it, when the JSON values of its cells
    are what the array's values read (see batch_rows); else None."""
    try:
        arr = pa.array(col, from_pandas=True)  # NaN and None are nulls, as _pandas_values has them
    except (pa.ArrowException, TypeError, ValueError):
        return None
    if col.dtype == object and not (pa.types.is_string(arr.type) or pa.types.is_null(arr.type)):
        return None  # ints and floats mixed become floats, other objects change
    return arr


def slice_rows(first: int, part: pa.RecordBatch | list[tuple[int, dict]]) -> Iterable[tuple[int, dict]]:
    """(position, document) of each row of an Input's batch (its first row at ``first``)."""
    return part if isinstance(part, list) else batch_rows(first, part)


def _table_input(batches: Iterable[pa.RecordBatch], batch_size: int, total: int | None = None) -> Input:
    """The Input of record batches: ``batches`` (sliced to ``batch_size`` rows), and as dicts."""
    slices = _arrow_slices(batches, batch_size)
    return Input(itertools.chain.from_iterable(itertools.starmap(batch_rows, slices)), total=total, batches=slices)


def _arrow_slices(batches: Iterable[pa.RecordBatch], batch_size: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    first = 0
    for batch in batches:
        for start in range(0, batch.num_rows, batch_size):
            part = batch.slice(start, batch_size)
            yield first, part
            first += part.num_rows


def batch_rows(first: int, batch: pa.RecordBatch) -> Iterator[tuple[int, dict]]:
    """(position, document) of each row of ``batch``, its first row at ``first``: what a
    table means, row by row (rtindex.columnar does the same column-wise where it can)."""
    names = _field_names(batch.schema.names)
    values = [_arrow_values(batch.column(j), name == "_event_time") for j, name in enumerate(names)]
    return _rows(names, values, batch.num_rows, first)


def _field_names(labels: list) -> list[str]:
    """Column labels as field names (a label that is not a string becomes its ``str()``);
    ValueError for a name twice, which would silently keep one of the columns."""
    names = [label if isinstance(label, str) else str(label) for label in labels]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidArgumentError(f"the table has more than one column named {', '.join(map(repr, twice))}: "
                                   f"rename them, a document has one field of a name")
    return names


def _rows(names: list[str], columns: list[list], n: int, first: int) -> Iterator[tuple[int, dict]]:
    rows = zip(*columns) if columns else [()] * n
    for i, row in enumerate(rows, first):
        yield i, dict(zip(names, row))


def _pandas_values(col: Any, event_time: bool) -> list:
    """One column (a Series or an index level) as JSON values."""
    dtype = col.dtype
    if isinstance(dtype, np.dtype):
        return _column_values(col.to_numpy(), event_time)
    if dtype.kind == "M":  # with a time zone: its UTC instants
        return _column_values(col.to_numpy(dtype="datetime64[us]"), event_time)
    return [_cell(v) for v in col.to_numpy(dtype=object, na_value=None)]  # nullable ints, str, category, ...


def _arrow_values(arr: pa.Array, event_time: bool) -> list:
    """One column of a record batch as JSON values."""
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_floating(t):
        return _column_values(arr.to_numpy(zero_copy_only=False), event_time)  # nulls: NaT, NaN
    if (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t) or pa.types.is_null(t)):
        return arr.to_pylist()
    return [_cell(v) for v in arr.to_pylist()]  # decimals, dates, nested values, ...


def _column_values(arr: np.ndarray, event_time: bool) -> list:
    kind = arr.dtype.kind
    if kind == "M" and event_time:
        # datetimes (None for NaT): an _event_time given as a time may be any time
        return arr.astype("M8[us]").tolist()
    if kind == "f":
        out = arr.tolist()
        for i in np.flatnonzero(np.isnan(arr)).tolist():
            out[i] = None
        return out
    if kind == "O":
        return [_cell(v) for v in arr.tolist()]
    return array_values(arr)


def _cell(v: Any) -> Any:
    """A table cell's JSON value: a missing value (NaN included) is null."""
    v = json_value(v)
    return None if isinstance(v, float) and math.isnan(v) else v
