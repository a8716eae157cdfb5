"""Column store chunks: one Arrow array per (sealed segment, field path, type).

A chunk holds one value per *live* row of its segment, in offset order (rows dropped by a
merge are gone; a row without a value of this path and type is null). Chunks are stored as
Arrow IPC streams so a scan maps them back without copying.
"""

from __future__ import annotations

from array import array

import numpy as np
import pyarrow as pa

from rtindex import keys
from rtindex.errors import CorruptionError

ARROW_TYPES = {
    keys.NULL: pa.bool_(),  # true where the field is JSON null
    keys.BOOL: pa.bool_(),
    keys.INT: pa.int64(),
    keys.FLOAT: pa.float64(),
    keys.STRING: pa.large_string(),
    keys.TIMESTAMP: pa.timestamp("us", tz="UTC"),
    keys.ARRAY: pa.large_string(),  # the whole array as JSON text
}


def arrow_type(tag: int) -> pa.DataType:
    return ARROW_TYPES[tag]


def values_array(tag: int, values: list) -> pa.Array:
    """A column's values (of one type tag) as Arrow; a null column's as ``True``s."""
    if tag == keys.NULL:
        values = [True] * len(values)
    return pa.array(values, type=ARROW_TYPES[tag])


def dense(tag: int, offsets: array, values: list | pa.Array, n: int) -> pa.Array:
    """An array of length ``n`` with ``values[i]`` at ``offsets[i]`` and nulls elsewhere
    (``values`` a list, or already its :func:`values_array`)."""
    vals = values if isinstance(values, pa.Array) else values_array(tag, values)
    if len(offsets) == n:  # every row has a value: offsets are 0..n-1
        return vals
    idx = np.full(n, -1, dtype=np.int64)
    idx[np.frombuffer(offsets, dtype=np.uint32)] = np.arange(len(offsets), dtype=np.int64)
    return vals.take(pa.array(idx, mask=idx < 0))


def nulls(tag: int, n: int) -> pa.Array:
    return pa.nulls(n, type=ARROW_TYPES[tag])


def encode(arr: pa.Array) -> bytes:
    batch = pa.record_batch([arr], names=["v"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode(data: bytes | pa.Buffer) -> pa.Array:
    """The array of a chunk; zero-copy when ``data`` is a (mapped) Arrow buffer."""
    try:
        table = pa.ipc.open_stream(data if isinstance(data, pa.Buffer) else pa.py_buffer(data)).read_all()
    except pa.ArrowInvalid as e:
        raise CorruptionError(f"column chunk does not decode: {e}") from e
    col = table.column(0)
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


def take(arr: pa.Array, positions: np.ndarray) -> pa.Array:
    """``arr``'s values at ``positions`` (an int array). Numbers without nulls go through
    numpy: Arrow's take costs ~20 us a call in fixed costs, and a query that reads a few
    fields of the rows an index matched takes from every segment of every shard."""
    if arr.null_count == 0 and (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        return pa.array(arr.to_numpy()[positions], type=arr.type)
    return arr.take(pa.array(positions))
