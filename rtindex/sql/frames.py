"""Field values of documents -> Arrow columns, with one typing rule for both access paths.

A field that holds one type in the rows WHERE selects becomes that Arrow type (int64,
float64, string, bool; ``_event_time`` a UTC timestamp); ints and floats together become
float64 (text when an int is beyond 2**53, which float64 cannot hold exactly); arrays and
objects become what Arrow infers (lists, structs). Anything Arrow cannot type as one column
(a string in some rows, a number in others) becomes text: strings as they are, other
values as JSON. The rule depends only on the *kinds* of values the selected rows hold
(:func:`mixing`), which every access path can learn: from the values themselves (a frame,
:func:`column`), from posting lists (a plain projection whose LIMIT leaves rows unread), or
from counts over the column store's typed columns (the scan, :func:`value_sql`). So a
result does not depend on the access path that produced it.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterator, Sequence

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from rtindex import keys
from rtindex.columns import arrow_type
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


# the largest magnitude up to which every int is a float64 (Arrow refuses to mix larger ones with floats)
EXACT_INT = 1 << 53
# kinds of values a field can hold, by type tag (NULL aside: null mixes with anything)
KINDS = (keys.BOOL, keys.INT, keys.FLOAT, keys.STRING, keys.TIMESTAMP, keys.ARRAY, keys.OBJECT)
DOUBLE, TEXT = "double", "text"


def mixing(kinds: set[int], big_ints: bool = False) -> str | None:
    """What :func:`column` makes of a field holding values of ``kinds`` (type tags; NULL is
    ignored) in the rows a query selects, ``big_ints`` if one of its ints is beyond
    EXACT_INT: None (one kind: values as they are), DOUBLE (ints and floats) or TEXT."""
    kinds = set(kinds) - {keys.NULL}
    if len(kinds) <= 1:
        return None
    if kinds == {keys.INT, keys.FLOAT} and not big_ints:
        return DOUBLE
    return TEXT


def kind(v: Any) -> int:
    """The type tag of a JSON value as a document holds it."""
    if v is None:
        return keys.NULL
    if isinstance(v, bool):
        return keys.BOOL
    if isinstance(v, int):
        return keys.INT
    if isinstance(v, float):
        return keys.FLOAT
    if isinstance(v, str):
        return keys.STRING
    return keys.ARRAY if isinstance(v, list) else keys.OBJECT


def mixing_of(values: list) -> str | None:
    """:func:`mixing` of the values themselves."""
    kinds = set(map(kind, values))
    big = keys.INT in kinds and any(type(v) is int and abs(v) > EXACT_INT for v in values)
    return mixing(kinds, big)


def mixed_value(how: str | None, v: Any) -> Any:
    """One value as a column mixed ``how`` (see :func:`mixing`) holds it."""
    if how is None or v is None:
        return v
    if how == DOUBLE:
        return float(v)
    return _text(v)


def _text(v: Any) -> str | None:
    """A value in a text column: strings as they are, other values as JSON (floats as
    Python's repr spells them, which is how DuckDB casts a DOUBLE to VARCHAR: ``1.5e-07``)."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
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


def nulls_typed(arr: pa.Array, tags: list[int]) -> pa.Array:
    """``arr`` (a frame column), or, when the selected rows hold no value of its field and
    the collection holds one kind of scalar there (``tags``: its column-store types), nulls
    of that kind's type: what the column scan reads then, so that ``SUM(s)`` of a text field
    fails (or ``lower(k)`` of an int one) whether or not a row matched, on either path."""
    kinds = [t for t in tags if t not in (keys.NULL, keys.ARRAY, keys.OBJECT)]
    if not pa.types.is_null(arr.type) or len(kinds) != 1:
        return arr
    return pa.nulls(len(arr), type=arrow_type(kinds[0]))


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
def value_sql(cols: dict[int, str], big_ints: bool = False) -> str:
    """DuckDB expression for a field's value from its typed columns (tag -> column name):
    pass only the columns of the kinds the selected rows hold (see :func:`kinds_sql`)."""
    vals = {t: c for t, c in cols.items() if t not in (keys.NULL, keys.ARRAY, keys.OBJECT)}
    if not vals:
        return "NULL"
    if len(vals) == 1:
        return next(iter(vals.values()))
    if mixing(set(vals), big_ints) == DOUBLE:
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


def kinds_sql(cols: dict[int, str]) -> list[str]:
    """DuckDB aggregates over a field's typed columns (tag -> column name) that tell
    :func:`value_sql` which kinds the selected rows hold: one count per value column, then
    a count of ints beyond EXACT_INT (see :func:`scan_kinds`)."""
    out = [f"COUNT({c})" for t, c in sorted(cols.items()) if t in KINDS]
    col = cols.get(keys.INT)
    out.append(f"COUNT(CASE WHEN {col} > {EXACT_INT} OR {col} < -{EXACT_INT} THEN 1 END)" if col else "0")
    return out


def scan_kinds(cols: dict[int, str], counts: list[int]) -> tuple[dict[int, str], bool]:
    """The columns of the kinds present, and whether an int is beyond EXACT_INT, from the
    values of :func:`kinds_sql`."""
    present = [t for t in sorted(cols) if t in KINDS]
    return {t: cols[t] for t, n in zip(present, counts) if n}, bool(counts[-1])


def unique_name(name: str, taken: Sequence[str]) -> str:
    """``name``, or ``name_2``, ``name_3``... the first not in ``taken``: the one rule that
    names a query's output columns when two would share a name."""
    if name not in taken:
        return name
    i = 2
    while f"{name}_{i}" in taken:
        i += 1
    return f"{name}_{i}"


def unique_names(names: Sequence[str]) -> list[str]:
    """Each of ``names`` made unique against the ones before it (:func:`unique_name`)."""
    out: list[str] = []
    for name in names:
        out.append(unique_name(name, out))
    return out


def with_unique_names(data: pa.Table | pa.RecordBatch) -> pa.Table | pa.RecordBatch:
    """``data`` with its columns renamed by :func:`unique_names` (itself when they are)."""
    names = data.schema.names
    if len(set(names)) == len(names):
        return data
    unique = unique_names(names)
    if isinstance(data, pa.RecordBatch):
        return pa.RecordBatch.from_arrays(data.columns, names=unique)
    return data.rename_columns(unique)
