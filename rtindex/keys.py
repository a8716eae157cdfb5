"""Order-preserving key encoding: pure functions shared by every index kind.

A *term* is ``encode_path(path) + tag + encode_value(tag, value)``. Within one path and
type, bytewise order of the encoded value equals the natural order of the value, so a range
predicate is one RocksDB key range. Every encoding is prefix-free, so a term is never the
prefix of another term and a term prefix scan finds exactly that term.

The Cython segment builder (``rtindex/_ext/_segment.pyx``) produces the same bytes; the tests
compare the two on generated documents.
"""

from __future__ import annotations

import functools
import json
import re
import struct
from typing import Any, Sequence

# Type tags. The numbers are part of the on-disk format: never renumber.
NULL = 0x01
BOOL = 0x02
INT = 0x03
FLOAT = 0x04
STRING = 0x05
TIMESTAMP = 0x06  # int64 microseconds since the Unix epoch (only `_event_time`)
ARRAY = 0x07  # marker: "an array is at this path" (no value bytes)
OBJECT = 0x08  # marker: "an object is at this path" (no value bytes)

TAG_NAMES = {
    NULL: "null",
    BOOL: "bool",
    INT: "int",
    FLOAT: "float",
    STRING: "string",
    TIMESTAMP: "timestamp",
    ARRAY: "array",
    OBJECT: "object",
}
TAGS_BY_NAME = {v: k for k, v in TAG_NAMES.items()}

INT_MIN = -(1 << 63)
INT_MAX = (1 << 63) - 1
_SIGN = 1 << 63
_MASK = (1 << 64) - 1
_PACK_Q = struct.Struct(">Q")
_PACK_D = struct.Struct(">d")


def escape(raw: bytes) -> bytes:
    """Make ``raw`` free of the two-byte terminators below: 0x00 becomes 0x00 0xFF."""
    return raw.replace(b"\x00", b"\x00\xff")


def unescape(enc: bytes) -> bytes:
    return enc.replace(b"\x00\xff", b"\x00")


PATH_SEP = b"\x00\x01"
PATH_END = b"\x00\x00"
STR_END = b"\x00\x00"


def encode_path(path: Sequence[str]) -> bytes:
    """Encode a field path (a tuple of names); sorts by segment, then by depth."""
    return _encode_tuple(path if type(path) is tuple else tuple(path))


@functools.lru_cache(maxsize=4096)  # every lookup encodes its path: remembered (a query's are few)
def _encode_tuple(path: tuple[str, ...]) -> bytes:
    if not path:
        raise ValueError("empty field path")
    return PATH_SEP.join(escape(p.encode("utf-8")) for p in path) + PATH_END


def decode_path(enc: bytes) -> tuple[str, ...]:
    if not enc.endswith(PATH_END):
        raise ValueError("not an encoded path")
    return tuple(unescape(p).decode("utf-8") for p in enc[:-2].split(PATH_SEP))


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def json_path(parts: Sequence[str | int]) -> str:
    """``["a", 3, "b"]`` -> ``$.a[3].b``: where in a document an error is (names that are not
    identifiers are quoted, ``$["we.ird"]``)."""
    out = ["$"]
    for p in parts:
        if isinstance(p, int):
            out.append(f"[{p}]")
        elif _IDENT.fullmatch(p):
            out.append("." + p)
        else:
            out.append("[" + json.dumps(p, ensure_ascii=False) + "]")
    return "".join(out)


def split_path(path: str | Sequence[str]) -> tuple[str, ...]:
    """``"a.b.c"`` -> ``("a", "b", "c")``; a tuple or list passes through (names with dots)."""
    if isinstance(path, str):
        return tuple(path.split("."))
    return tuple(path)


def encode_int(v: int) -> bytes:
    return _PACK_Q.pack((v + _SIGN) & _MASK)


def decode_int(b: bytes) -> int:
    return _PACK_Q.unpack(b)[0] - _SIGN


def encode_float(f: float) -> bytes:
    if f == 0.0:
        f = 0.0  # -0.0 and 0.0 are one value
    bits = _PACK_Q.unpack(_PACK_D.pack(f))[0]
    bits = (~bits & _MASK) if bits & _SIGN else (bits | _SIGN)
    return _PACK_Q.pack(bits)


def decode_float(b: bytes) -> float:
    bits = _PACK_Q.unpack(b)[0]
    bits = (bits & ~_SIGN) if bits & _SIGN else (~bits & _MASK)
    return _PACK_D.unpack(_PACK_Q.pack(bits))[0]


def encode_string(s: str) -> bytes:
    return escape(s.encode("utf-8")) + STR_END


def encode_value(tag: int, value: Any) -> bytes:
    """Encode ``value`` as type ``tag`` (no validation: callers classify first)."""
    if tag == STRING:
        return encode_string(value)
    if tag == INT or tag == TIMESTAMP:
        return encode_int(value)
    if tag == FLOAT:
        return encode_float(value)
    if tag == BOOL:
        return b"\x01" if value else b"\x00"
    if tag in (NULL, ARRAY, OBJECT):
        return b""
    raise ValueError(f"unknown type tag {tag}")


def decode_value(tag: int, enc: bytes) -> Any:
    if tag == STRING:
        return unescape(enc[:-2]).decode("utf-8")
    if tag == INT or tag == TIMESTAMP:
        return decode_int(enc)
    if tag == FLOAT:
        return decode_float(enc)
    if tag == BOOL:
        return enc == b"\x01"
    return None


def term(path: Sequence[str], tag: int, value: Any = None) -> bytes:
    return column_key(path, tag) + encode_value(tag, value)


def column_key(path: Sequence[str], tag: int) -> bytes:
    """The prefix of every term of ``path`` with type ``tag``; also names a column."""
    return _column_key(path if type(path) is tuple else tuple(path), tag)


@functools.lru_cache(maxsize=4096)  # (as _encode_tuple: every lookup asks)
def _column_key(path: tuple[str, ...], tag: int) -> bytes:
    return _encode_tuple(path) + bytes((tag,))


def column_key_at(path_key: bytes, tag: int) -> bytes:
    """The column key of an encoded path and a type tag."""
    return path_key + bytes((tag,))


def tag_of(column_key: bytes) -> int:
    """The type tag a column key ends with."""
    return column_key[-1]


def column_key_of(t: bytes) -> bytes:
    """The column key (path + type tag) a term starts with."""
    return t[: _path_end(t) + 1]


def split_term(t: bytes) -> tuple[tuple[str, ...], int, Any]:
    """Inverse of :func:`term`."""
    end = _path_end(t)
    return decode_path(t[:end]), t[end], decode_value(t[end], t[end + 1 :])


def _path_end(t: bytes) -> int:
    i = 0
    while True:
        i = t.index(b"\x00", i)
        if t[i + 1] == 0x00:
            return i + 2
        i += 2


def prefix_upper_bound(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        raise ValueError("no upper bound for an all-0xFF prefix")
    p[-1] += 1
    return bytes(p)


def term_bounds(ck: bytes, tag: int, lo: Any, hi: Any, lo_inc: bool, hi_inc: bool) -> tuple[bytes, bytes]:
    """``(lo_key, hi_key)`` such that the terms of column key ``ck`` (type ``tag``) whose
    values are within the bounds (None: unbounded) are exactly those with lo_key <= t < hi_key:
    a term is never the prefix of another, so the first key past a term is the term + 00."""
    lo_key = ck if lo is None else ck + encode_value(tag, lo) + (b"" if lo_inc else b"\x00")
    hi_key = prefix_upper_bound(ck) if hi is None else ck + encode_value(tag, hi) + (b"\x00" if hi_inc else b"")
    return lo_key, hi_key


def u64(v: int) -> bytes:
    """Big-endian unsigned 64-bit: row ids and segment ids sort numerically."""
    return _PACK_Q.pack(v)


def from_u64(b: bytes) -> int:
    return _PACK_Q.unpack(b)[0]


# -- document ids: the ``ids`` keys and the ``_id`` terms ---------------------------------
ID_PATH = encode_path(("_id",))


def id_prefix(tag: int) -> bytes:
    """An id key is the type tag of the ``_id`` (INT or STRING) and its encoded value, so
    that string and integer ids never collide."""
    return bytes((tag,))


def id_term(key: bytes) -> bytes:
    """The ``_id`` term of the document whose id key is ``key``."""
    return ID_PATH + key


# -- a shard's meta records (column family "meta"); docs/architecture.md explains each -----
META_NEXT_ROW = b"N"  # -> u64: the next row id
META_SEGMENT = b"S"  # + u64 segment id -> orjson {"base", "n"}: the segment exists (its file holds the rest)
META_DELETED = b"D"  # + u64 row id -> b"": that row was replaced or deleted
META_LOG = b"C"  # + u64 sequence -> the row ids one write deleted (u64 BE each): the change log readers follow
META_LOG_SEQ = b"Q"  # -> u64: sequence of the newest change log record
META_GENERATION = b"G"  # -> u64: bumped by every write that changes the set of segments
META_TAIL = b"T"  # + u64 first row id -> u64 file id: the mutable segment file holding the unsealed rows from there
# + the source's name, a path terminator and a u64 partition -> u64: the next offset of that
# partition whose document this shard has not stored (rtindex/sources.py)
META_SOURCE = b"K"


def meta_segment(segid: int) -> bytes:
    return META_SEGMENT + u64(segid)


def meta_deleted(row_id: int) -> bytes:
    return META_DELETED + u64(row_id)


def meta_segment_id(key: bytes) -> int:
    """The segment id of a ``meta_segment`` key."""
    return from_u64(key[1:])


def meta_deleted_row(key: bytes) -> int:
    """The row id of a ``meta_deleted`` key."""
    return from_u64(key[1:])


def meta_tail(base: int) -> bytes:
    return META_TAIL + u64(base)


def meta_tail_base(key: bytes) -> int:
    """The first row id of a ``meta_tail`` key."""
    return from_u64(key[1:])


def meta_log(seq: int) -> bytes:
    return META_LOG + u64(seq)


def meta_log_seq(key: bytes) -> int:
    """The sequence of a ``meta_log`` key."""
    return from_u64(key[1:])


def meta_source(source: str) -> bytes:
    """The prefix of every ``meta_source_offset`` key of ``source``."""
    return META_SOURCE + escape(source.encode()) + PATH_END


def meta_source_range(source: str) -> tuple[bytes, bytes]:
    """The key range holding every ``meta_source_offset`` key of ``source`` (and no other's)."""
    prefix = meta_source(source)
    return prefix, prefix[:-1] + b"\x01"


def meta_source_offset(source: str, partition: int) -> bytes:
    return meta_source(source) + u64(partition)


def meta_source_partition(key: bytes) -> int:
    """The partition of a ``meta_source_offset`` key."""
    return from_u64(key[-8:])


def pack_u64s(values) -> bytes:
    """Row ids as concatenated big-endian u64s (a change log record)."""
    return b"".join(_PACK_Q.pack(v) for v in values)


def unpack_u64s(raw: bytes) -> list[int]:
    return [v for (v,) in _PACK_Q.iter_unpack(raw)]
