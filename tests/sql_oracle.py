"""DuckDB over native tables as the oracle of rtindex's SQL (test_sql_residual.py, test_sql_joins.py).

Documents have one JSON type per field (or null, or no key): a native DuckDB table holds the
same data, null and missing both NULL, the object ``o`` a STRUCT(x BIGINT, s VARCHAR). The
same SQL text runs on both; results compare as multisets of rows (values by position: rtindex
names a nested field ``o.x`` where DuckDB says ``x``), floats rounded, unless ``ordered``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal

import duckdb
import pyarrow as pa
from hypothesis import strategies as st

import rtindex

MISSING = object()
STRINGS = ["", "a", "ab", "b", "ba", "B", "é", "a%b", "1"]
# collection -> Arrow schema of its native table (the fields its documents may hold)
SCHEMAS = {
    "t": pa.schema([("_id", pa.int64()), ("i", pa.int64()), ("f", pa.float64()), ("s", pa.string()),
                    ("b", pa.bool_()), ("o", pa.struct([("x", pa.int64()), ("s", pa.string())]))]),
    "u": pa.schema([("_id", pa.int64()), ("k", pa.int64()), ("w", pa.int64()), ("name", pa.string())]),
}
FIELDS = {
    "t": {"i": st.integers(-3, 3), "f": st.integers(-8, 8).map(lambda k: k * 0.5), "s": st.sampled_from(STRINGS),
          "b": st.booleans()},
    "u": {"k": st.integers(-3, 3), "w": st.integers(0, 6), "name": st.sampled_from(STRINGS)},
}
PRESENCE = st.sampled_from(["value", "value", "value", None, MISSING])


@st.composite
def documents(draw, collection: str, max_size: int = 25) -> list[dict]:
    """Documents of ``collection`` (``_id`` 0, 1, ...): each field a value, null or missing."""
    docs = []
    for _id in range(draw(st.integers(0, max_size))):
        d = {"_id": _id}
        for name, strategy in FIELDS[collection].items():
            how = draw(PRESENCE)
            if how != MISSING:
                d[name] = draw(strategy) if how == "value" else None
        if collection == "t" and draw(st.booleans()):
            d["o"] = {"x": draw(st.integers(-3, 3))} if draw(st.booleans()) else {"s": draw(st.sampled_from(STRINGS))}
        docs.append(d)
    return docs


@contextmanager
def loaded(path: str, collections: dict[str, tuple[list[dict], int]]) -> Iterator[tuple[rtindex.Database, duckdb.DuckDBPyConnection]]:
    """An rtindex database at ``path`` and an in-memory DuckDB holding the same documents:
    each name -> (documents, shards) is a collection there and a native table here."""
    with rtindex.open(path) as db:
        con = duckdb.connect()
        try:
            for name, (docs, shards) in collections.items():
                db.create_collection(name, shards=shards).ingest(docs)
                native(con, name, docs)
            yield db, con
        finally:
            con.close()


def native(con: duckdb.DuckDBPyConnection, name: str, docs: list[dict]) -> None:
    """Load ``docs`` into the native DuckDB table ``name``."""
    schema = SCHEMAS[name]
    cols = {f.name: [d.get(f.name) for d in docs] for f in schema}
    con.register(f"{name}_arrow", pa.table(cols, schema=schema))
    con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM {name}_arrow")


def normal(v):
    if isinstance(v, float):
        return None if math.isnan(v) else round(v, 6)
    if isinstance(v, Decimal):
        return round(float(v), 6)
    return v


def rows(table: pa.Table, ordered: bool) -> list[tuple]:
    """The rows as tuples, by column position (columns of one name all count)."""
    out = [tuple(normal(v) for v in r) for r in zip(*(c.to_pylist() for c in table.columns))]
    return out if ordered else sorted(out, key=repr)


def oracle(con: duckdb.DuckDBPyConnection, sql: str, ordered: bool) -> list[tuple] | type[Exception]:
    """DuckDB's rows for ``sql`` on the native tables (or the class of error it raised)."""
    try:
        return rows(con.sql(sql).to_arrow_table(), ordered)
    except duckdb.Error:
        return Exception


def check(db, con, sql: str, ordered: bool = False, access=(None, "index", "scan")) -> None:
    """``sql`` gives DuckDB's rows on every access path (or both fail)."""
    want = oracle(con, sql, ordered)
    for path in access:
        try:
            got = rows(db.sql(sql, access=path).arrow(), ordered)
        except rtindex.SqlError:
            if want is Exception:
                continue
            raise
        assert got == want, (sql, path)
