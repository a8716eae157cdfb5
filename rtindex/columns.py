"""Column store chunks: one Arrow array per (sealed segment, field path, type).

A chunk holds one value per *live* row of its segment, in offset order (rows dropped by a
merge are gone; a row without a value of this path and type is null). Chunks are stored as
Arrow IPC streams so a scan maps them back without copying.
"""

from __future__ import annotations

from array import array
from typing import Iterable

import numpy as np
import pyarrow as pa

from rtindex import keys
from rtindex._impl import gather as gather_parts
from rtindex.errors import CorruptionError, InvalidArgumentError

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
    """A column's values (Python objects of one type tag) as Arrow; a null column's as
    ``True``s. The reference builder's conversion (the compiled one fills Arrow's layout as
    it goes)."""
    if tag == keys.NULL:
        values = [True] * len(values)
    return pa.array(values, type=ARROW_TYPES[tag])


# The Arrow types ``SegmentBuilder.add_columns`` indexes straight from their buffers: each
# value, as ``Array.to_pylist()`` gives it, is a JSON scalar (rtindex.columnar turns other
# types into these, or leaves the table to the row path).
INDEXABLE_TYPES = (pa.int64(), pa.float64(), pa.bool_(), pa.string(), pa.large_string(), pa.null())


def check_batch(names, arrays) -> tuple[list[str], list[pa.Array], int]:
    """``(names, arrays, rows)`` of a ``SegmentBuilder.add_columns`` call, or the TypeError
    or ValueError that says what is wrong with them. Both builders call it first, so they
    refuse alike and before anything is indexed."""
    names, arrays = list(names), list(arrays)
    if len(names) != len(arrays):
        raise InvalidArgumentError(f"add_columns got {len(names)} names and {len(arrays)} arrays: "
                                   "give one name per array")
    if not arrays:
        raise InvalidArgumentError("add_columns needs at least one column (the rows are as long as the arrays)")
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"a column name must be a str, not {type(name).__name__}")
    names = [str.__str__(name) for name in names]  # an exact str, as a document's key would be
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise InvalidArgumentError(f"column names must be unique: {', '.join(map(repr, twice))} more than once")
    for name, arr in zip(names, arrays):
        if not isinstance(arr, pa.Array):
            raise TypeError(f"column {name!r} is a {type(arr).__name__}, not a pyarrow Array "
                            f"(a ChunkedArray: combine_chunks() it first)")
        if arr.type not in INDEXABLE_TYPES:
            raise TypeError(f"column {name!r} is of type {arr.type}: add_columns takes int64, double, bool, "
                            f"string, large_string and null columns (rtindex.columnar.prepare converts a batch)")
        arr.validate()  # buffers as large as the type and length say (ArrowInvalid, a ValueError)
    n = len(arrays[0])
    for name, arr in zip(names, arrays):
        if len(arr) != n:
            raise InvalidArgumentError(f"columns of unequal lengths: {names[0]!r} has {n} rows, {name!r} {len(arr)}")
    return names, arrays, n


def dense(tag: int, offsets: array, values: pa.Array, n: int) -> pa.Array:
    """An array of length ``n`` with ``values[i]`` at ``offsets[i]`` and nulls elsewhere;
    ``values`` as a builder's ``column``/``columns`` give them, of type ``ARROW_TYPES[tag]``."""
    if values.type != ARROW_TYPES[tag]:
        raise TypeError(f"column values of type {values.type} for type tag {tag} (expected {ARROW_TYPES[tag]})")
    if len(offsets) == n:  # every row has a value: offsets are 0..n-1
        return values
    idx = np.full(n, -1, dtype=np.int64)
    idx[np.frombuffer(offsets, dtype=np.uint32)] = np.arange(len(offsets), dtype=np.int64)
    return values.take(pa.array(idx, mask=idx < 0))


def nulls(tag: int, n: int) -> pa.Array:
    return pa.nulls(n, type=ARROW_TYPES[tag])


# Sealed chunks are ZSTD-compressed (level 1; 3 is no smaller on these columns): several
# times smaller than plain, and smaller than LZ4, which would decode no faster here
# (measured: docs/benchmarks.md, "Ingest"). Chunks under COMPRESS_MIN bytes stay plain,
# and zero-copy.
_COMPRESSED = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=1))
_PLAIN = pa.ipc.IpcWriteOptions()
COMPRESS_MIN = 4096


def encode(arr: pa.Array) -> pa.Buffer:
    """``arr`` as an Arrow IPC stream, compressed unless it is small."""
    return encode_parts(arr.type, [arr], compress=arr.nbytes >= COMPRESS_MIN)


def encode_parts(type_: pa.DataType, parts: Iterable[pa.Array], compress: bool = True) -> pa.Buffer:
    """The arrays ``parts`` (of ``type_``, taken one at a time: a generator's items are
    freed as soon as written) as one chunk, a batch each: a merge writes a column of its
    inputs without holding all of them decoded and their concatenation at once (for a
    large text column, twice its decoded size).
    :func:`decode` joins them."""
    schema = pa.schema([("v", type_)])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=_COMPRESSED if compress else _PLAIN) as w:
        for arr in parts:
            w.write_batch(pa.record_batch([arr], schema=schema))
    return sink.getvalue()


def decode(data: bytes | pa.Buffer) -> pa.Array:
    """The array of a chunk; zero-copy when ``data`` is a (mapped) Arrow buffer and the
    chunk is not compressed."""
    try:
        table = pa.ipc.open_stream(data if isinstance(data, pa.Buffer) else pa.py_buffer(data)).read_all()
    except pa.ArrowInvalid as e:
        raise CorruptionError(f"column chunk does not decode: {e}") from e
    col = table.column(0)
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


class Chunk:
    """A column chunk with its Arrow buffers at hand, to take values at positions from: a
    query that reads a few fields of the rows an index matched takes from every segment of
    every shard, and :func:`gather` joins what it took from all of them in one compiled
    call per column (rtindex/_py/gather.py says how a part is laid out)."""

    __slots__ = ("array", "_buffers")

    def __init__(self, arr: pa.Array):
        self.array = arr
        bufs = arr.buffers()
        valid = bufs[0] if arr.null_count else None
        if arr.type == pa.large_string():
            data, offsets = (bufs[2] if bufs[2] is not None else b""), bufs[1]
        else:
            data, offsets = bufs[1], None
        self._buffers = (data, offsets, valid, arr.offset) if data is not None else (None, None, None, 0)

    def part(self, positions: np.ndarray) -> tuple:
        """The part of a :func:`gather` that takes the values at ``positions`` (int64)."""
        return (*self._buffers, positions)


def missing_part(positions: np.ndarray) -> tuple:
    """A part of nulls, for the rows of a segment that has no chunk of the column."""
    return (None, None, None, 0, positions)


_KINDS = {pa.large_string().id: 2, pa.bool_().id: 1}  # (rtindex/_py/gather.py; else 8-byte values)


def gather(tag: int, parts: list[tuple]) -> pa.Array:
    """One Arrow array of type tag ``tag`` holding the values of ``parts`` one after the other."""
    t = ARROW_TYPES[tag]
    n = sum(len(p[4]) for p in parts)
    null_count, validity, data, offsets = gather_parts(_KINDS.get(t.id, 0), parts)
    bufs = [pa.py_buffer(validity) if validity is not None else None]
    bufs += [pa.py_buffer(offsets), pa.py_buffer(data)] if offsets is not None else [pa.py_buffer(data)]
    return pa.Array.from_buffers(t, n, bufs, null_count)
