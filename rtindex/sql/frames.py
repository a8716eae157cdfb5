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
from typing import Any, Sequence

import orjson
import pyarrow as pa

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
