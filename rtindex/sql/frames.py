"""Field values of documents -> Arrow columns, with one typing rule for both access paths.

A field that holds one type in the selected rows becomes that Arrow type (int64, float64,
string, bool; ``_event_time`` a UTC timestamp); ints and floats together become float64;
arrays and objects become what Arrow infers (lists, structs). Anything Arrow cannot type as
one column (a string in some rows, a number in others) becomes text: strings as they are,
other values as JSON. The column scan builds the same types in DuckDB (see
:func:`value_sql`), so a result does not depend on the access path that produced it.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterator, Sequence

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from rtindex import keys
from rtindex.rowcache import copy_json

MISSING = object()
EVENT_TIME = ("_event_time",)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
TIMESTAMP = pa.timestamp("us", tz="UTC")


def get_path(doc: Any, path: Sequence[str]) -> Any:
    """The value at ``path``, reached through objects only; None when missing."""
    for name in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(name, MISSING)
        if doc is MISSING:
            return None
    return doc


def values(docs: list[dict], path: Sequence[str]) -> list:
    """``get_path`` of every document (a top-level field takes the fast lane)."""
    if len(path) == 1:
        return list(map(dict.get, docs, itertools.repeat(path[0])))
    return [get_path(d, path) for d in docs]


def output_value(path: Sequence[str], v: Any) -> Any:
    """A projected value as rows() shows it: ``_event_time`` as an aware datetime; arrays and
    objects copied (the documents are the RowStoreCache's shared objects)."""
    if isinstance(v, (dict, list)):
        return copy_json(v)
    if tuple(path) == EVENT_TIME and isinstance(v, int) and not isinstance(v, bool):
        return _EPOCH + timedelta(microseconds=v)
    return v


def _text(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    return orjson.dumps(v).decode()


def column(values: list, path: Sequence[str] = ()) -> pa.Array:
    """One Arrow column of ``values`` (Python values of one field) by the rule above.

    Arrow's own inference implements it (one type; ints with floats -> float64; lists and
    structs) in C; only what it rejects (mixed types) is turned into text here.
    """
    try:
        arr = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        return pa.array([_text(v) for v in values], type=pa.large_string())
    if pa.types.is_floating(arr.type) and any(type(v) is bool for v in values):
        # Arrow reads a bool after a float as 0.0/1.0 (but fails on a bool first): mixed types
        return pa.array([_text(v) for v in values], type=pa.large_string())
    if tuple(path) == EVENT_TIME and (pa.types.is_int64(arr.type) or pa.types.is_null(arr.type)):
        return arr.cast(TIMESTAMP)  # a timestamp even when no row matched (MAX(_event_time) is NULL)
    return arr


def table(names: list[str], columns: list[pa.Array]) -> pa.Table:
    return pa.table(dict(zip(names, columns))) if names else pa.table({})


def rows_table(rows: list[dict]) -> pa.Table:
    """An Arrow table of result rows (documents, or projections): one column per key, in order
    of first appearance; a row without a key is null there."""
    names: dict[str, None] = {}
    for r in rows:
        for k in r:
            names.setdefault(k)
    return pa.table({n: column([r.get(n) for r in rows], (n,)) for n in names}) if names else pa.table({})


# -- the same rule over a stream of rows ------------------------------------------------
def unify(types: list[pa.DataType]) -> pa.DataType:
    """The type :func:`column` gives all the values of a field whose parts typed as ``types``:
    Arrow's own promotion (null with anything, ints with floats, structs' fields united),
    text when there is none."""
    if not types:
        return pa.null()
    try:
        merged = pa.unify_schemas([pa.schema([("v", t)]) for t in types], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return pa.large_string()
    return merged.field("v").type


def conform(values: list, path: Sequence[str], target: pa.DataType) -> pa.Array:
    """:func:`column` of ``values``, as ``target`` (the :func:`unify` of this field's parts)."""
    arr = column(values, path)
    if arr.type == target:
        return arr
    if pa.types.is_large_string(target) and not (pa.types.is_string(arr.type) or pa.types.is_null(arr.type)):
        return pa.array([_text(v) for v in values], type=target)  # the field mixes types: all of it is text
    try:
        return arr.cast(target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return pa.array(values, type=target)  # e.g. a struct that lacks some of target's fields


def rows_reader(chunks: Callable[[], Iterator[list[dict]]], names: list[str] | None = None) -> pa.RecordBatchReader:
    """Record batches of result rows that arrive in chunks, typed as :func:`rows_table` types
    all of them at once. A stream has one schema, and the type of a field depends on every
    value of it (a float in the last chunk makes the column float64), so ``chunks()`` (a fresh
    iterator of row lists per call) is read twice: once for the columns and their types, then
    for the batches. Memory: one chunk at a time."""
    parts: dict[str, list[pa.DataType]] = {n: [] for n in names or ()}
    inexact: set[str] = set()  # holds an int a float64 cannot hold: with floats, the field is text
    for rows in chunks():
        table = rows_table(rows)
        for f, col in zip(table.schema, table.columns):
            parts.setdefault(f.name, []).append(f.type)
            if pa.types.is_int64(f.type) and col.null_count < len(col):
                lo, hi = pc.min_max(col).values()
                if max(-lo.as_py(), hi.as_py()) > 1 << 53:
                    inexact.add(f.name)
    types = {n: unify(ts) for n, ts in parts.items()}
    schema = pa.schema([(n, pa.large_string() if n in inexact and pa.types.is_floating(t) else t)
                        for n, t in types.items()])

    def batches() -> Iterator[pa.RecordBatch]:
        for rows in chunks():
            yield pa.record_batch([conform([r.get(f.name) for r in rows], (f.name,), f.type) for f in schema],
                                  schema=schema)
    return pa.RecordBatchReader.from_batches(schema, batches())


# -- the same rule in DuckDB, over the column store's typed columns --------------------
def value_sql(cols: dict[int, str]) -> str:
    """DuckDB expression for a field's value from its typed columns (tag -> column name)."""
    vals = {t: c for t, c in cols.items() if t not in (keys.NULL, keys.ARRAY, keys.OBJECT)}
    if not vals:
        return "NULL"
    if len(vals) == 1:
        return next(iter(vals.values()))
    if set(vals) <= {keys.INT, keys.FLOAT}:
        return f"COALESCE(CAST({vals[keys.INT]} AS DOUBLE), {vals[keys.FLOAT]})"
    parts = []
    for t, c in sorted(vals.items()):
        if t == keys.STRING:
            parts.append(c)
        elif t == keys.BOOL:
            parts.append(f"CASE WHEN {c} THEN 'true' WHEN NOT {c} THEN 'false' END")
        else:
            parts.append(f"CAST({c} AS VARCHAR)")
    return f"COALESCE({', '.join(parts)})"
