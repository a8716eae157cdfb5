"""Reference mutable segment: small and obviously correct, the oracle for ``_ext/_segment``.

A mutable segment holds the documents ingested since the last seal, indexed in memory:
- postings: term bytes -> increasing row offsets (row id - segment base);
- columns: column key (path + type tag) -> (offsets, values) for values not inside arrays.

Flattening rules (docs/architecture.md repeats them):
- nested objects flatten to paths (tuples of names); non-root objects add an OBJECT marker term;
- an array adds an ARRAY marker term at its path, and each element is indexed under the same
  path (objects inside arrays flatten below it, nested arrays are flattened the same way);
- the column store gets one value per (path, type) for leaves outside arrays; an array at a
  path outside arrays is stored whole as JSON text in its ARRAY column;
- a top-level ``_event_time`` int is a TIMESTAMP; everything else is NULL/BOOL/INT/FLOAT/STRING.
"""

from __future__ import annotations

import bisect
import math
import operator
from array import array
from typing import Any

import orjson
import pyarrow as pa

from rtindex import columns, keys
from rtindex._py.blocks import BlockWriter
from rtindex.errors import SchemaError

class SegmentBuilder:
    """In-memory postings and column values of the newest rows of one shard."""

    def __init__(self, max_depth: int = 64):
        self.max_depth = max_depth
        self._postings: dict[bytes, array] = {}
        self._terms_by_column: dict[bytes, list[bytes]] = {}
        self._columns: dict[bytes, tuple[array, list]] = {}
        self._n = 0
        self._nbytes = 0

    @property
    def n_rows(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        """Approximate memory held (term bytes + 4 per posting entry + column values)."""
        return self._nbytes

    def add(self, doc: dict) -> int:
        """Index ``doc`` as the next row; returns its offset. All or nothing on SchemaError."""
        if not isinstance(doc, dict):
            raise SchemaError(f"a document must be a JSON object, not {type(doc).__name__}")
        return self._apply(*self._index(doc))

    def add_columns(self, names, arrays) -> int:
        """Index the rows of ``arrays`` (pyarrow Arrays of ``columns.INDEXABLE_TYPES``, the
        columns ``names``) as the next rows; returns the offset of the first.

        The same as ``add(dict(zip(names, row)))`` for each row, a row's values as
        ``Array.to_pylist()`` gives them (a null is a JSON null), and all or nothing: every
        row is walked (and so checked) before any is indexed.
        """
        names, arrays, _ = columns.check_batch(names, arrays)
        rows = zip(*(arr.to_pylist() for arr in arrays))
        indexed = [self._index(dict(zip(names, row))) for row in rows]
        off = self._n
        for terms, cols in indexed:
            self._apply(terms, cols)
        return off

    def _index(self, doc: dict) -> tuple[list[bytes], list[tuple[bytes, Any]]]:
        """The terms and column values of ``doc``, or SchemaError (nothing changes)."""
        terms: list[bytes] = []
        cols: list[tuple[bytes, Any]] = []
        self._walk_object(doc, (), [], 1, False, terms, cols)
        return terms, cols

    def _apply(self, terms: list[bytes], cols: list[tuple[bytes, Any]]) -> int:
        """Add a walked document's terms and column values as the next row."""
        off = self._n
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
        self._n += 1
        return off

    def _walk_object(self, obj, path, where, depth, in_array, terms, cols):
        if depth > self.max_depth:
            raise SchemaError(f"nesting deeper than {self.max_depth} levels", keys.json_path(where))
        for k, v in obj.items():
            if not isinstance(k, str):
                raise SchemaError(f"object keys must be strings, not {type(k).__name__}", keys.json_path(where))
            self._walk_value(v, path + (k,), where + [k], depth, in_array, terms, cols, top=depth == 1)

    def _walk_value(self, v, path, where, depth, in_array, terms, cols, top=False):
        if isinstance(v, str):
            try:
                enc = keys.encode_string(v)
            except UnicodeEncodeError:
                raise SchemaError("string is not valid UTF-8 (lone surrogate)", keys.json_path(where)) from None
            self._leaf(path, keys.STRING, enc, v, in_array, terms, cols)
        elif v is None:
            self._leaf(path, keys.NULL, b"", None, in_array, terms, cols)
        elif v is True or v is False:
            self._leaf(path, keys.BOOL, b"\x01" if v else b"\x00", v, in_array, terms, cols)
        elif isinstance(v, int):
            if not keys.INT_MIN <= v <= keys.INT_MAX:
                raise SchemaError("integer outside the signed 64-bit range", keys.json_path(where))
            tag = keys.TIMESTAMP if top and path == ("_event_time",) else keys.INT
            self._leaf(path, tag, keys.encode_int(v), int(v), in_array, terms, cols)
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise SchemaError(f"non-finite number {v!r} (JSON has no NaN or Infinity)", keys.json_path(where))
            v = v + 0.0  # -0.0 -> 0.0
            self._leaf(path, keys.FLOAT, keys.encode_float(v), v, in_array, terms, cols)
        elif isinstance(v, dict):
            terms.append(keys.encode_path(path) + bytes((keys.OBJECT,)))
            self._walk_object(v, path, where, depth + 1, in_array, terms, cols)
        elif isinstance(v, (list, tuple)):
            if depth + 1 > self.max_depth:
                raise SchemaError(f"nesting deeper than {self.max_depth} levels", keys.json_path(where))
            terms.append(keys.encode_path(path) + bytes((keys.ARRAY,)))
            for i, item in enumerate(v):
                self._walk_value(item, path, where + [i], depth + 1, True, terms, cols)
            if not in_array:
                cols.append((keys.encode_path(path) + bytes((keys.ARRAY,)), orjson.dumps(v).decode()))
        else:
            raise SchemaError(f"unsupported value type {type(v).__name__}", keys.json_path(where))

    @staticmethod
    def _leaf(path, tag, enc, value, in_array, terms, cols):
        ck = keys.encode_path(path) + bytes((tag,))
        terms.append(ck + enc)
        if not in_array:
            cols.append((ck, value))

    def postings(self, term: bytes, limit: int) -> array:
        """Offsets (< ``limit``) of the rows holding ``term``, increasing; a new array."""
        plist = self._postings.get(term)
        if plist is None:
            return array("I")
        n = len(plist)
        while n and plist[n - 1] >= limit:
            n -= 1
        return plist[:n]

    def column_terms(self, column_key: bytes) -> list[bytes]:
        """Every distinct term of one column key (path + type), in no particular order."""
        return list(self._terms_by_column.get(column_key, ()))

    def column_keys(self) -> list[bytes]:
        return list(self._terms_by_column)

    def sorted_postings(self) -> list[tuple[bytes, array]]:
        """All (term, offsets) pairs sorted by term: what a seal writes."""
        return [(t, self._postings[t]) for t in sorted(self._postings)]

    def columns(self) -> list[tuple[bytes, array, pa.Array]]:
        """(column key, offsets, values) for every column with values, sorted by column key;
        the values as an Arrow array of ``columns.ARROW_TYPES[tag]`` (what a seal writes)."""
        return [(ck, offs, columns.values_array(ck[-1], vals))
                for ck, (offs, vals) in sorted(self._columns.items())]

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
