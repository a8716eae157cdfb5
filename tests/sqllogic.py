"""A runner for rtindex's own SQL logic tests (tests/sqllogic/*.test).

The files use the sqllogictest record format (as sqlite and DuckDB write it), so each can
also run unchanged in DuckDB, the oracle its expected results were checked against:

    statement ok                     statement error            query ITR rowsort
    CREATE TABLE t(a INTEGER, ...)   SELECT ...                 SELECT a, b, c FROM t
                                     ----                       ----
                                     text the error contains    1<TAB>x<TAB>2.500

- ``query <types> [nosort|rowsort|valuesort]``: one letter per column, ``I`` integer (an int,
  or an integral Decimal as SUM of integers gives), ``R`` float or Decimal (3 decimals;
  ``inf``, ``-inf``, ``nan``), ``T`` string (``(empty)`` for ''); NULL is ``NULL`` in any
  column. A value of another type is a failure (cast it in the query), so a result's types
  are checked, not only its text. Expected values are tab-separated rows, or one value per
  line; ``rowsort`` compares sorted rows, ``valuesort`` sorted values, ``nosort`` (the
  default) the order as returned.
- ``statement ok`` / ``statement error``: ``CREATE TABLE``, ``INSERT [OR REPLACE] INTO ...
  VALUES`` and ``DELETE FROM t WHERE _id = v`` (or ``_id IN (...)``) change data; a SELECT
  must run (or fail; text after ``----`` must appear in the message).
- ``skipif <engine>`` / ``onlyif <engine>`` before a record, engines ``rtindex`` and
  ``duckdb``: records about rtindex's own semantics (mixed types, missing fields,
  ``_event_time``, its error messages) are ``onlyif rtindex``.
- A comment ``# xfail: <reason>`` (or ``# xfail index: ...`` / ``# xfail scan: ...`` for one
  access path) directly above a record marks a known rtindex bug or missing feature: the
  test is a strict expected failure, so it fails as soon as the answer becomes right.

Loading. rtindex only runs SELECTs: each ``CREATE TABLE t(...)`` becomes the collection
``t`` and each ``INSERT`` one ``ingest`` of documents, one per row. A value is stored as its
literal is written (documents have no schema; the declared types are for DuckDB): ``1`` an
int, ``1.0`` a float, ``'x'`` a string, ``TRUE`` a bool, ``[1, 2]`` an array, ``{'k': 1}``
an object, and ``NULL`` an explicit JSON null, while a column left out of the INSERT's
column list (``INSERT INTO t(a) VALUES (1)``) is a missing field. A column named ``_id``
or ``_event_time`` (an int of microseconds) sets the document's own. A document replaces
the one with its ``_id``: write ``INSERT OR REPLACE`` with every column (and ``_id ...
PRIMARY KEY``) so that DuckDB does the same (it keeps the old values of columns left out);
``DELETE`` deletes documents by ``_id``.

Every record runs on every engine: rtindex with ``access="index"`` and ``access="scan"``
(when a query cannot use the forced path rtindex runs it on the other one; the test of
that path is skipped and says why) and DuckDB.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
from decimal import Decimal
from typing import Any

import duckdb
import sqlglot
from sqlglot import expressions as exp

import rtindex

ENGINES = ("index", "scan", "duckdb")  # the two rtindex access paths, and the oracle
RTINDEX_PATHS = ("index", "scan")
SORTS = ("nosort", "rowsort", "valuesort")


class SqlLogicError(Exception):
    """A .test file that the runner cannot read (a bad record, an unsupported statement)."""


@dataclasses.dataclass
class Record:
    """One statement or query of a .test file."""

    file: str
    line: int           # 1-based line of the record's first line (statement/query)
    kind: str           # "statement" or "query"
    sql: str
    error: bool = False  # statement error
    error_text: str = ""  # what the error message must contain
    types: str = ""     # query: one of I, T, R per column
    sort: str = "nosort"
    expected: list[str] = dataclasses.field(default_factory=list)  # query: flat values
    skip: set[str] = dataclasses.field(default_factory=set)   # engines ("rtindex", "duckdb") it does not run on
    xfail: dict[str, str] = dataclasses.field(default_factory=dict)  # access path -> reason

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def loads_data(self) -> bool:
        """CREATE TABLE, INSERT, DELETE: they change data, not tests of their own."""
        return self.kind == "statement" and _statement(self.sql)[0] != "select"


def parse_file(path: str | pathlib.Path) -> list[Record]:
    """The records of a .test file, in order."""
    path = pathlib.Path(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    records: list[Record] = []
    i, skip, xfail = 0, set(), {}
    while i < len(lines):
        line = lines[i].rstrip("\r")
        words = line.split()
        where = f"{path.name}:{i + 1}"
        if not words:
            skip, xfail = set(), {}
            i += 1
            continue
        if line.startswith("#"):
            m = re.match(r"#\s*xfail(?:\s+(index|scan))?\s*:\s*(\S.*)", line)
            if m:
                for p in (m.group(1),) if m.group(1) else RTINDEX_PATHS:
                    xfail[p] = m.group(2).strip()
            i += 1
            continue
        if words[0] in ("skipif", "onlyif"):
            if len(words) < 2 or words[1] not in ("rtindex", "duckdb"):
                raise SqlLogicError(f"{where}: {words[0]} takes rtindex or duckdb")
            other = {"rtindex": "duckdb", "duckdb": "rtindex"}[words[1]]
            skip.add(words[1] if words[0] == "skipif" else other)
            i += 1
            continue
        if words[0] == "hash-threshold":
            i += 1
            continue
        if words[0] not in ("statement", "query"):
            raise SqlLogicError(f"{where}: expected a statement or query record, not {line!r}")
        rec = Record(path.name, i + 1, words[0], "", skip=skip, xfail=xfail)
        skip, xfail = set(), {}
        if rec.kind == "statement":
            if len(words) != 2 or words[1] not in ("ok", "error"):
                raise SqlLogicError(f"{where}: write 'statement ok' or 'statement error'")
            rec.error = words[1] == "error"
        else:
            if len(words) < 2 or not re.fullmatch(r"[ITR]+", words[1]):
                raise SqlLogicError(f"{where}: write 'query <types>' with one of I, T, R per column")
            rec.types = words[1]
            rec.sort = words[2] if len(words) > 2 else "nosort"
            if rec.sort not in SORTS or len(words) > 3:
                raise SqlLogicError(f"{where}: the sort mode is one of {', '.join(SORTS)}")
        i += 1
        sql_lines = []
        while i < len(lines) and lines[i].strip() and lines[i].strip() != "----":
            sql_lines.append(lines[i].rstrip())
            i += 1
        rec.sql = "\n".join(sql_lines)
        if not rec.sql:
            raise SqlLogicError(f"{where}: the record has no SQL")
        result: list[str] = []
        if i < len(lines) and lines[i].strip() == "----":
            i += 1
            while i < len(lines) and lines[i].strip():
                result.append(lines[i].rstrip("\r"))
                i += 1
        if rec.kind == "query":
            rec.expected = [v for row in result for v in row.split("\t")]
        elif result:
            if not rec.error:
                raise SqlLogicError(f"{where}: only 'statement error' takes text after ----")
            rec.error_text = "\n".join(result)
        if rec.loads_data and (rec.error or rec.skip):
            raise SqlLogicError(f"{where}: CREATE TABLE, INSERT and DELETE change data on every engine: 'statement ok' only")
        records.append(rec)
    return records


# ------------------------------------------------------------------------ loading data

def _statement(sql: str) -> tuple[str, exp.Expression | None]:
    """("create" | "insert" | "delete" | "select", parsed statement); SELECTs are not parsed here."""
    head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
    if head not in ("CREATE", "INSERT", "DELETE"):
        return "select", None
    tree = sqlglot.parse_one(sql, read="duckdb")
    if isinstance(tree, exp.Create) and tree.kind == "TABLE" and isinstance(tree.this, exp.Schema):
        return "create", tree
    if isinstance(tree, exp.Insert) and isinstance(tree.expression, exp.Values):
        return "insert", tree
    if isinstance(tree, exp.Delete) and _deleted_ids(tree) is not None:
        return "delete", tree
    raise SqlLogicError("the loader runs CREATE TABLE t(col TYPE, ...), INSERT INTO t VALUES (...) and "
                        f"DELETE FROM t WHERE _id = v (or _id IN (...)), not: {sql}")


def _deleted_ids(delete: exp.Delete) -> list[Any] | None:
    """The _ids a ``DELETE FROM t WHERE _id = v`` (or ``_id IN (...)``) deletes, else None."""
    where = delete.args.get("where")
    cond = where.this if where is not None else None
    if isinstance(cond, exp.EQ) and isinstance(cond.this, exp.Column) and cond.this.name == "_id":
        return [_value(cond.expression)]
    if isinstance(cond, exp.In) and isinstance(cond.this, exp.Column) and cond.this.name == "_id":
        return [_value(e) for e in cond.expressions]
    return None


def _value(node: exp.Expression) -> Any:
    """A Python value for a literal, as written (see the module docstring)."""
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return node.this
    if isinstance(node, exp.Neg):
        return -_value(node.this)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        text = node.this
        return int(text) if re.fullmatch(r"\d+", text) else float(text)
    if isinstance(node, exp.Array):
        return [_value(e) for e in node.expressions]
    if isinstance(node, exp.Struct):
        out = {}
        for e in node.expressions:
            if not isinstance(e, exp.PropertyEQ):
                raise SqlLogicError(f"write an object as {{'key': value, ...}}, not {node.sql('duckdb')}")
            out[e.this.name] = _value(e.expression)
        return out
    raise SqlLogicError(f"the loader takes literals only, not {node.sql('duckdb')}")


def documents(insert: exp.Insert, columns: dict[str, list[str]]) -> tuple[str, list[dict]]:
    """The collection name and the documents of an INSERT (columns: declared, per table)."""
    target = insert.this
    table = target.this.name if isinstance(target, exp.Schema) else target.name
    if table not in columns:
        raise SqlLogicError(f"INSERT into {table!r}, which no CREATE TABLE made")
    names = [c.name for c in target.expressions] if isinstance(target, exp.Schema) else columns[table]
    docs = []
    for row in insert.expression.expressions:
        values = row.expressions
        if len(values) != len(names):
            raise SqlLogicError(f"INSERT into {table!r}: {len(values)} values for {len(names)} columns")
        docs.append({name: _value(v) for name, v in zip(names, values)})
    return table, docs


# ------------------------------------------------------------------------ the engines

class RtindexEngine:
    """One database per .test file: its tables as collections, queried with db.sql. Given
    ``db`` (a cluster's, opened with seal_rows=4), its tables are collections of ``shards``
    there, dropped at close."""

    def __init__(self, path: str | None = None, db=None, shards: int = 2):
        # small segments, so a table of a few rows has sealed rows and in-memory ones
        self.db = rtindex.open(path, seal_rows=4) if db is None else db
        self.owned = db is None
        self.shards = shards
        self.columns: dict[str, list[str]] = {}

    def load(self, sql: str) -> None:
        kind, tree = _statement(sql)
        if kind == "create":
            name = tree.this.this.name
            self.columns[name] = [c.name for c in tree.this.expressions if isinstance(c, exp.ColumnDef)]
            self.db.create_collection(name, shards=self.shards)
        elif kind == "delete":
            collection = self.db.collection(tree.this.name)
            for doc_id in _deleted_ids(tree):
                collection.delete(doc_id)
        else:
            table, docs = documents(tree, self.columns)
            self.db.collection(table).ingest(docs, errors="raise")

    def run(self, sql: str, access: str) -> tuple[list[list[Any]], str | None]:
        """The rows of a query on one access path, and, when rtindex ran it on the other
        path because this one cannot answer it, why (else None)."""
        res = self.db.sql(sql, access=access)
        if res.access != access:
            return [], self.db.explain(sql, access=access).reason
        columns = res.columns
        if len(set(columns)) < len(columns):
            raise AssertionError(f"the result has columns of the same name ({columns}), of which rows() "
                                 "keeps one: give them aliases")
        rows = [[row.get(c) for c in columns] for row in res.rows()]
        if not _documents(sql):  # SELECT * gives documents as stored, its Arrow form is typed
            as_arrow = [list(r) for r in zip(*(col.to_pylist() for col in res.arrow().columns))]
            if _typed(rows) != _typed(as_arrow):
                raise AssertionError(f"rows() and arrow() disagree:\n  rows():  {rows}\n  arrow(): {as_arrow}")
        return rows, None

    def close(self) -> None:
        if self.owned:
            self.db.close()
        else:
            for name in self.columns:
                self.db.drop_collection(name)


class DuckdbEngine:
    """DuckDB over native tables: the statements and queries run as written."""

    def __init__(self) -> None:
        self.con = duckdb.connect()

    def load(self, sql: str) -> None:
        self.con.execute(sql)

    def run(self, sql: str, access: str) -> tuple[list[list[Any]], str | None]:
        return [list(r) for r in self.con.sql(sql).fetchall()], None

    def close(self) -> None:
        self.con.close()


def _documents(sql: str) -> bool:
    """Whether a query's SELECT list has a ``*``."""
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError:
        return False
    return isinstance(tree, exp.Select) and any(isinstance(e, exp.Star) for e in tree.expressions)


def _typed(rows: list[list[Any]]) -> list[list[tuple[str, Any]]]:
    return [[(type(v).__name__, v) for v in row] for row in rows]


# ------------------------------------------------------------------------ results

def format_value(value: Any, kind: str) -> str:
    """A value as sqllogictest prints it, checking it is of the column's declared kind."""
    if value is None:
        return "NULL"
    if kind == "I":
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, Decimal) and value == value.to_integral_value():
            return str(int(value))
    elif kind == "R":
        if isinstance(value, (float, Decimal)):
            return f"{value:.3f}" if math.isfinite(value) else str(value).lower()  # inf, -inf, nan
    elif isinstance(value, str):
        return "(empty)" if value == "" else value
    raise AssertionError(f"a {kind} column holds {value!r} ({type(value).__name__}): "
                         "fix the column's type letter, or cast the value in the query")


def compare(rec: Record, rows: list[list[Any]]) -> None:
    """Raise AssertionError, showing both results, unless rows are what rec expects."""
    width = len(rec.types)
    if rows and len(rows[0]) != width:
        raise AssertionError(f"the query returns {len(rows[0])} columns, the record declares {width} ({rec.types})")
    actual = [[format_value(v, k) for v, k in zip(row, rec.types)] for row in rows]
    expected = rec.expected
    if len(expected) % width:
        raise AssertionError(f"{len(expected)} expected values is not a whole number of {width}-column rows")
    expected_rows = [expected[i:i + width] for i in range(0, len(expected), width)]
    if rec.sort == "rowsort":
        actual, expected_rows = sorted(actual), sorted(expected_rows)
    elif rec.sort == "valuesort":
        actual = [[v] for v in sorted(v for row in actual for v in row)]
        expected_rows = [[v] for v in sorted(expected)]
    if actual != expected_rows:
        raise AssertionError(f"wrong result ({rec.sort}):\n--- expected\n{_show(expected_rows)}\n--- got\n{_show(actual)}")


def _show(rows: list[list[str]]) -> str:
    return "\n".join("\t".join(r) for r in rows) or "(no rows)"


def check(rec: Record, engine: RtindexEngine | DuckdbEngine, access: str) -> str | None:
    """Run one record on one engine (access: "index", "scan" or "duckdb"); raise
    AssertionError when it gives the wrong answer. Returns why the record could not run on
    that access path (rtindex ran it on the other one), else None."""
    try:
        rows, other_path = engine.run(rec.sql, access)
    except (rtindex.SqlError, duckdb.Error) as e:
        if rec.kind == "statement" and rec.error:
            if rec.error_text and rec.error_text not in str(e):
                raise AssertionError(f"the error should contain {rec.error_text!r}, it says: {e}") from e
            return None
        raise AssertionError(f"{type(e).__name__}: {e}") from e
    if other_path is not None:
        return other_path
    if rec.kind == "statement":
        if rec.error:
            raise AssertionError("the statement should fail, it ran")
        return None
    compare(rec, rows)
    return None
