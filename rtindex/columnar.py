"""A record batch made ready for the shards column-wise, as the row path would make its rows.

The row path (``inputs._arrow_values`` then ``documents.identify`` and ``serialize`` per
row) stays the definition of what a table means; :func:`prepare` does the same work a
column at a time, with pyarrow compute and numpy, for the batches where that is exact:

- every column is normalized to one of the types ``SegmentBuilder.add_columns`` indexes
  (``columns.INDEXABLE_TYPES``): integers to int64 (uint64 only when every value fits),
  floats to double with NaN as null, dictionaries decoded, timestamps and durations to
  int64 microseconds (floored, as numpy's ``astype("M8[us]")`` does);
- ``_id`` is kept (a string or integer column) or filled with ``documents.new_ids()`` where
  missing or null; ``_event_time`` kept (an integer column, checked as
  ``documents.event_time_of(check=True)`` checks one, or a timestamp column) or filled with
  ``now_us``; a missing one goes at the end, ``_id`` first, as ``identify`` puts them;
- each row's JSON text is made by DuckDB (``rtindex.duck.json_objects``: one query
  a batch), which writes shortest round-trip floats: ``orjson.loads`` of it is the row's value.

Anything else gives None: a column of another type (nested, binary, decimal, date, ...), an
infinite float, an integer ``_id`` column with nulls (its filled ids would be strings), a
value the row path refuses (an implausible ``_event_time``, a too long ``_id``), a row
over ``max_document_bytes``. The caller then takes the row path, which reports per row.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from rtindex import keys
from rtindex.documents import (
    EVENT_TIME_MAX_US,
    EVENT_TIME_MIN_US,
    MAX_ID_BYTES,
    Limits,
    new_ids,
)
from rtindex.duck import json_objects

_INT64 = pa.int64()
_US_PER = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}  # a unit -> microseconds (ns: // 1000)
_NAT = -(1 << 63)  # numpy's NaT: the row path reads this int64 time as a missing one
# The range of datetime.datetime in microseconds since the epoch: numpy's tolist() makes a
# datetime of a time within it (which _event_time takes as it is), an int beyond.
_DATETIME_MIN_US = -62_135_596_800_000_000
_DATETIME_MAX_US = 253_402_300_799_999_999


@dataclass
class Prepared:
    """A batch ready for :func:`split` and ``SegmentBuilder.add_columns``: per column its
    name and values, per row what ``documents.prepare`` returns for it."""

    names: list[str]  # the row dict's keys, in order (``_id``, ``_event_time`` included)
    arrays: list[pa.Array]  # the columns, of ``columns.INDEXABLE_TYPES``
    ids: list  # per row: the user id (str or int)
    id_keys: list[bytes]  # per row: ``documents.encode_id`` of it
    generated: list[bool]  # per row: whether the id was generated (it cannot exist yet)
    json: list[bytes]  # per row: its JSON text

    def __len__(self) -> int:
        return len(self.ids)


class Part(NamedTuple):
    """The rows of a prepared batch that go to one shard."""

    shard: int
    rows: np.ndarray  # their positions in the batch, increasing (int64)
    arrays: list[pa.Array]  # the batch's columns at those rows


def prepare(batch: pa.RecordBatch, now_us: int, limits: Limits) -> Prepared | None:
    """``batch`` ready for the shards, or None when only the row path can take it (see the
    module doc)."""
    names = list(batch.schema.names)
    if len(set(names)) != len(names) or limits.max_depth < 1:
        return None  # the row path says what is wrong
    arrays = []
    for name, arr in zip(names, batch.columns):
        arr = _event_time(arr, now_us) if name == "_event_time" else _normalized(arr)
        if arr is None:
            return None
        arrays.append(arr)
    n = batch.num_rows
    if "_id" in names:
        at = names.index("_id")
        filled = _filled_ids(arrays[at])
        if filled is None:
            return None
        arrays[at], generated = filled
    else:
        names.append("_id")
        arrays.append(pa.array(new_ids(n), pa.string()))
        generated = [True] * n
    if "_event_time" not in names:
        names.append("_event_time")
        arrays.append(pa.array(np.full(n, now_us, dtype=np.int64)))
    id_column = arrays[names.index("_id")]
    id_keys = _id_keys(id_column)
    if id_keys is None:
        return None
    text = json_objects(names, arrays)
    if not _within(text, names, arrays, limits.max_document_bytes):
        return None
    return Prepared(names, arrays, id_column.to_pylist(), id_keys, generated,
                    text.cast(pa.binary()).to_pylist())


def split(prepared: Prepared, n_shards: int) -> list[Part]:
    """The batch's rows by shard (``documents.shard_of`` of each id key), in batch order,
    with the columns taken at them; only shards that get rows."""
    n = len(prepared)
    if n_shards == 1:
        return [Part(0, np.arange(n, dtype=np.int64), prepared.arrays)] if n else []
    shard = np.array(list(map(zlib.crc32, prepared.id_keys)), dtype=np.int64) % n_shards
    order = np.argsort(shard, kind="stable")
    bounds = np.searchsorted(shard[order], np.arange(n_shards + 1))
    parts = []
    for s in range(n_shards):
        rows = order[bounds[s]:bounds[s + 1]]
        if len(rows):
            parts.append(Part(s, rows, [arr.take(rows) for arr in prepared.arrays]))
    return parts


# -- columns -----------------------------------------------------------------------------
def _normalized(arr: pa.Array) -> pa.Array | None:
    """``arr`` as the values ``inputs._arrow_values`` reads from it, in one of the indexable
    types; None for another type, or values the builder would refuse."""
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_null(t) or pa.types.is_boolean(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
        return arr
    if pa.types.is_integer(t):
        if t == _INT64:
            return arr
        try:
            return pc.cast(arr, _INT64)  # (safe: a uint64 over 2**63 - 1 raises)
        except pa.ArrowInvalid:
            return None
    if pa.types.is_floating(t):
        arr = pc.cast(arr, pa.float64())
        if pc.any(pc.is_inf(arr)).as_py():
            return None  # the row path refuses that row alone
        return pc.if_else(pc.is_nan(arr), pa.scalar(None, pa.float64()), arr)
    if pa.types.is_timestamp(t) or pa.types.is_duration(t):
        return _microseconds(arr)
    return None


def _microseconds(arr: pa.Array) -> pa.Array | None:
    """A timestamp or duration column as int64 microseconds, floored (NaT: null); None
    when a value does not fit."""
    raw = pc.cast(arr, _INT64)
    values = raw.fill_null(0).to_numpy()
    valid = raw.is_valid().to_numpy(zero_copy_only=False) & (values != _NAT)
    per = _US_PER[arr.type.unit]
    if per is None:
        if np.any(values[valid] < _NAT + 1000):
            return None  # numpy's conversion overflows there (the row path's values are wrong)
        values = values // 1000
    elif per > 1:
        limit = (keys.INT_MAX // per) - 1
        if np.any(np.abs(values[valid]) > limit):
            return None
        values = values * per
    return pa.array(values, mask=~valid)


def _event_time(arr: pa.Array, now_us: int) -> pa.Array | None:
    """The ``_event_time`` column: its values where given and plausible (integers as
    ``event_time_of(check=True)`` checks them; a timestamp may be any time a datetime
    holds), ``now_us`` where null; None when the row path would refuse a value."""
    t = arr.type.value_type if pa.types.is_dictionary(arr.type) else arr.type
    us = _normalized(arr)
    if us is None:
        return None
    if us.null_count == len(us):
        return pa.array(np.full(len(us), now_us, dtype=np.int64))
    if us.type != _INT64:
        return None  # strings, floats, bools: the row path converts or refuses them per row
    lo, hi = pc.min_max(us).values()
    if pa.types.is_timestamp(t):
        if lo.as_py() < _DATETIME_MIN_US or hi.as_py() > _DATETIME_MAX_US:
            return None
    elif lo.as_py() < EVENT_TIME_MIN_US or hi.as_py() >= EVENT_TIME_MAX_US:
        return None
    return us.fill_null(now_us)


def _filled_ids(arr: pa.Array) -> tuple[pa.Array, list[bool]] | None:
    """The ``_id`` column with a new id where it is null, and where that was; None when
    the column is not strings or integers (or integers with nulls)."""
    n = len(arr)
    if arr.null_count == n:
        return pa.array(new_ids(n), pa.string()), [True] * n
    if arr.type == _INT64:
        return (arr, [False] * n) if arr.null_count == 0 else None
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        return None
    if arr.null_count == 0:
        return arr, [False] * n
    missing = arr.is_null().to_numpy(zero_copy_only=False)
    at = np.flatnonzero(missing)
    ids = arr.to_pylist()
    for i, fresh in zip(at.tolist(), new_ids(len(at))):
        ids[i] = fresh
    return pa.array(ids, arr.type), missing.tolist()


def _id_keys(ids: pa.Array) -> list[bytes] | None:
    """``documents.encode_id`` of each id (strings: type tag, escaped UTF-8, 00 00; integers:
    type tag, order-preserving big-endian); None when a string id is too long."""
    if ids.type == _INT64:
        be = (ids.to_numpy().view(np.uint64) ^ np.uint64(1 << 63)).astype(">u8")
        encoded = pa.Array.from_buffers(pa.binary(8), len(ids), [None, pa.py_buffer(be)]).cast(pa.binary())
        return pc.binary_join_element_wise(keys.id_prefix(keys.INT), encoded, b"").to_pylist()
    escaped = pc.replace_substring(ids.cast(pa.large_binary()), b"\x00", b"\x00\xff")
    if len(ids) and pc.max(pc.binary_length(escaped)).as_py() + len(keys.STR_END) > MAX_ID_BYTES:
        return None
    return pc.binary_join_element_wise(pa.scalar(keys.id_prefix(keys.STRING), pa.large_binary()), escaped,
                                       pa.scalar(keys.STR_END, pa.large_binary()),
                                       pa.scalar(b"", pa.large_binary())).to_pylist()


# -- JSON --------------------------------------------------------------------------------
def _within(text: pa.Array, names: list[str], arrays: list[pa.Array], max_bytes: int) -> bool:
    """Whether no row is over ``max_bytes`` as the row path measures it (orjson's text, which
    may write a float shorter or longer than DuckDB: rows near the limit are measured so)."""
    if not len(text):
        return True
    lengths = pc.binary_length(text).to_numpy()
    near = np.flatnonzero(lengths > max_bytes // 2)
    if not len(near):
        return True
    for i in near.tolist():
        row = {name: arr[i].as_py() for name, arr in zip(names, arrays)}
        if len(orjson.dumps(row)) > max_bytes:
            return False
    return True
