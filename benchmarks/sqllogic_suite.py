#!/usr/bin/env python
"""rtindex's SQL on SQLite's public sqllogictest suite: an outside check of its answers.

    python benchmarks/sqllogic_suite.py [--suite DIR_OR_GITDIR] [--files GLOB ...] [--quick]
                                        [--limit-queries N] [--paths] [--examples K]

``--suite`` is a checkout of https://sqlite.org/sqllogictest (a plain directory), or a bare
git directory of it read with ``git cat-file`` so that no work tree is needed (default: the
mirror this machine keeps, ``/work/.mirror/gregrahn+sqllogictest/repo``); files are named by
their path in it (``test/select1.test``) and ``--files`` takes shell globs of those paths
(default: ``test/select1.test`` ... ``select5.test``, one file of each kind under
``test/index/`` at 10 rows per table, the ``test/evidence/`` files with SELECTs, and the
first file of each kind under ``test/random/``: about 130,000 query records, ~45 minutes).
``--limit-queries N`` runs at most N query records of each file, spread evenly through it
(every data statement still runs, so the tables are the file's); ``--quick`` is 40 per file,
which finishes in about a minute on a shared 2-core machine. ``--paths`` also runs each
query with ``access="index"`` and ``access="scan"`` and reports where a forced path's
result differs from the default path's (every path must give the same rows; compared as
sorted rows when the query has no ORDER BY). The suite's files are read, never copied.

How a file runs. DuckDB holds the tables and rtindex follows them: each data statement
(``CREATE TABLE``, ``INSERT`` of values or of a SELECT, ``INSERT OR REPLACE``, ``UPDATE``,
``DELETE``, ``DROP TABLE``) runs in DuckDB, and then each table's collection is brought to
DuckDB's rows: one document per row, its ``_id`` the row's ``rowid``, its fields the row's
values (NULL an explicit null), in segments of 4 rows (as tests/sqllogic.py does), so a
table has sealed rows and in-memory ones. So the documents hold the values as the table's
declared types make them, as SQLite's column affinity does (``1`` in a ``FLOAT`` column is
1.0).
DuckDB's tables are declared with the types rtindex gives values (``INTEGER`` as BIGINT,
``FLOAT`` and ``REAL`` as DOUBLE: the suite's FLOAT would be 32-bit in DuckDB), so both
engines read the same numbers. ``CREATE INDEX`` is a no-op (the converged index has every
field). What this runner cannot follow (``CREATE VIEW``, triggers, a statement DuckDB
refuses) is skipped, and so is every later query that names the view or table it made or
changed: those records are counted as skipped, not failed. A ``statement`` record that is a
SELECT, or that must fail, is skipped too: only query records are scored. The same file
also runs in SQLite (the stdlib's ``sqlite3``, as written), only to recover the expected
values behind a hash when a query that differs is diagnosed.

The format is sqllogictest.c's: ``hash-threshold N``; ``skipif``/``onlyif <engine>`` (this
runner is the engine ``rtindex``, so ``onlyif sqlite`` records are skipped, ``skipif mysql``
ones run); ``halt``; ``query <types> <sort> [label]`` with one value per result line, or
``N values hashing to <md5>``: the md5 of every value followed by a newline, in result order
after sorting (``rowsort`` sorts rows, ``valuesort`` values, both as strings). A value is
printed by its column letter as sqllogictest.c prints SQLite's: ``I`` as a 64-bit integer
(a float truncated toward zero, text converted by its numeric prefix, a bool 0 or 1), ``R``
as ``%.3f``, ``T`` as text (``(empty)`` for '', characters outside ' '..'~' as ``@``), NULL
as ``NULL``. rtindex's ``SELECT *`` adds ``_id`` and ``_event_time`` to every document;
those two columns are dropped from its results (the suite's tables have no such columns).

Each query record runs on rtindex (its default access path) and on DuckDB with the same
tables, and is classified:

* ``correct``: rtindex's result is the suite's expected one;
* ``duckdb_semantics``: it is not, but it is DuckDB's own answer (for instance ``/`` on
  integers gives a DOUBLE in DuckDB, so ``ORDER BY a/2`` orders differently);
* ``refused``: rtindex raised a clear SqlError: an ``UnsupportedSqlError`` (outside the
  documented dialect, such as a SELECT without a collection), or an error on a query that
  DuckDB cannot run either (SQLite's own syntax and functions);
* ``wrong``: rtindex returned a result that is neither the expected one nor DuckDB's;
* ``error``: any other exception, a SqlError on a query that DuckDB answers over the same
  tables (rtindex's rewrite of it failed, and DuckDB's message about the rewritten text is
  what the user reads), or a message that shows rtindex's internal names.

Prints per-file figures and, per class other than ``correct``, its causes (most frequent
first) with ``--examples`` examples each (file:line, the SQL, and the expected result with
rtindex's and DuckDB's, or the message); then, as
the LAST stdout line, one JSON object: queries, correct, duckdb_semantics, refused, wrong,
error, skipped, pct_correct_or_duckdb, pct_correct_or_duckdb_of_not_refused (the same over
the queries rtindex did not refuse), the same for multi-table queries (``multi_``: a FROM
with a join or several tables, or a subquery), paths_disagree (null without ``--paths``),
files, limit_queries, seconds.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import fnmatch
import hashlib
import json
import logging
import math
import pathlib
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import duckdb
import sqlglot
from sqlglot import expressions as exp

import rtindex

MIRROR = "/work/.mirror/gregrahn+sqllogictest/repo"
ENGINE = "rtindex"  # the engine name skipif/onlyif lines are matched against
DEFAULT_FILES = (
    "test/select[1-5].test",
    "test/index/between/10/slt_good_1.test",
    "test/index/commute/10/slt_good_0.test",
    "test/index/in/10/slt_good_3.test",
    "test/index/orderby/10/slt_good_0.test",
    "test/index/orderby_nosort/10/slt_good_0.test",
    "test/index/random/10/slt_good_0.test",
    "test/index/delete/10/slt_good_0.test",
    "test/evidence/in1.test",
    "test/evidence/in2.test",
    "test/evidence/slt_lang_aggfunc.test",
    "test/evidence/slt_lang_createview.test",
    "test/evidence/slt_lang_update.test",
    "test/random/*/slt_good_0.test",
)
QUICK_QUERIES = 40
CLASSES = ("correct", "duckdb_semantics", "refused", "wrong", "error")
HASH_LINE = re.compile(r"(\d+) values hashing to ([0-9a-f]{32})$")
# A SqlError that shows DuckDB's own text: rtindex's internal frame/column names, or the
# error class DuckDB prefixes its messages with.
UNTRANSLATED = re.compile(r'\b__c\d+\b|"f\d+"|\bframe\b|\b(Binder|Catalog|Parser|Conversion|Invalid Input|'
                          r'Not implemented|INTERNAL|Out of Range) Error\b')


# ------------------------------------------------------------------------ reading the suite

class Suite:
    """The suite's files: a plain directory, or a git directory read without a work tree."""

    def __init__(self, root: str):
        self.root = pathlib.Path(root)
        self.git = (self.root / "HEAD").is_file() and (self.root / "objects").is_dir()
        if not self.git and not self.root.is_dir():
            raise SystemExit(f"--suite {root}: no such directory (give a checkout of sqllogictest, "
                             "or its git directory)")

    def names(self) -> list[str]:
        """Every .test file, as a path relative to the suite's root."""
        if self.git:
            out = self._git("ls-tree", "-r", "--name-only", "HEAD")
            return sorted(n for n in out.splitlines() if n.endswith(".test"))
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*.test"))

    def read(self, name: str) -> str | None:
        """A file's text, or None when the snapshot lists it but does not hold its content."""
        if self.git:
            try:
                return self._git("cat-file", "blob", f"HEAD:{name}")
            except subprocess.CalledProcessError:
                return None
        return (self.root / name).read_text(encoding="utf-8", errors="replace")

    def _git(self, *args: str) -> str:
        return subprocess.run(["git", f"--git-dir={self.root}", *args], check=True, capture_output=True,
                              text=True, errors="replace").stdout


# ------------------------------------------------------------------------ the format

@dataclasses.dataclass
class Record:
    """One record of a sqllogictest file that applies to this runner."""

    line: int                 # 1-based line of the statement/query line
    kind: str                 # "statement", "query" or "halt"
    sql: str = ""
    error: bool = False       # statement error
    types: str = ""           # query: one of I, T, R per column
    sort: str = "nosort"
    values: list[str] | None = None      # query: the expected values, or None when hashed
    hashed: tuple[int, str] | None = None  # query: (number of values, md5)


def parse(text: str) -> list[Record]:
    """The records of a file that this runner runs (skipif/onlyif applied), in order."""
    lines = text.split("\n")
    records: list[Record] = []
    i, applies = 0, True
    while i < len(lines):
        words = lines[i].split("#", 1)[0].split() if not lines[i].startswith("#") else []
        if not words:
            i += 1
            continue
        head = words[0]
        if head in ("skipif", "onlyif"):
            engine = words[1] if len(words) > 1 else ""
            applies = applies and ((engine != ENGINE) if head == "skipif" else (engine == ENGINE))
            i += 1
            continue
        if head == "hash-threshold":
            i += 1
            continue
        rec = Record(i + 1, head)
        if head == "halt":
            i += 1
        elif head in ("statement", "query"):
            if head == "statement":
                rec.error = words[1:2] == ["error"]
            else:
                rec.types = words[1] if len(words) > 1 else ""
                rec.sort = words[2] if len(words) > 2 else "nosort"
            i += 1
            sql = []
            while i < len(lines) and lines[i].strip() and lines[i].strip() != "----":
                sql.append(lines[i].rstrip())
                i += 1
            rec.sql = "\n".join(sql)
            result = []
            if i < len(lines) and lines[i].strip() == "----":
                i += 1
                while i < len(lines) and lines[i].strip():
                    result.append(lines[i].rstrip("\r"))
                    i += 1
            m = HASH_LINE.match(result[0]) if len(result) == 1 else None
            if m:
                rec.hashed = (int(m.group(1)), m.group(2))
            else:
                rec.values = result
        else:
            raise ValueError(f"line {i + 1}: expected a record, not {lines[i]!r}")
        if applies:
            records.append(rec)
        applies = True
    return records


def md5_of(values: Iterable[str]) -> str:
    """sqllogictest.c's result hash: md5 of each value followed by a newline."""
    h = hashlib.md5()
    for v in values:
        h.update(v.encode("utf-8") + b"\n")
    return h.hexdigest()


def _numeric_prefix(text: str) -> float:
    m = re.match(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text)
    return float(m.group(0)) if m else 0.0


def format_value(value: Any, kind: str) -> str:
    """A value as sqllogictest.c prints SQLite's for a column of that letter."""
    if value is None:
        return "NULL"
    if isinstance(value, Decimal):
        value = int(value) if value == value.to_integral_value() else float(value)
    if kind == "I":
        if isinstance(value, str):
            value = _numeric_prefix(value)
        if isinstance(value, float):
            if not math.isfinite(value):
                return str(value)  # not an integer: never equal to an expected one
            value = int(value)
        return str(int(value))
    if kind == "R":
        return f"{_numeric_prefix(value) if isinstance(value, str) else float(value):.3f}"
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, float):
        text = f"{value:.15g}"
        value = text + ".0" if re.fullmatch(r"-?\d+", text) else text
    text = str(value)
    return "(empty)" if text == "" else "".join(c if " " <= c <= "~" else "@" for c in text)


def result_values(rows: Iterable[Iterable[Any]], types: str, sort: str) -> list[str]:
    """The flat printed values of a result, sorted as the record says."""
    printed = [[format_value(v, types[i] if i < len(types) else "T") for i, v in enumerate(row)] for row in rows]
    if sort == "rowsort":
        printed.sort()
    flat = [v for row in printed for v in row]
    return sorted(flat) if sort == "valuesort" else flat


def expected_matches(rec: Record, values: list[str]) -> bool:
    """Whether printed values are the record's expected result."""
    if rec.hashed is not None:
        return (len(values), md5_of(values)) == rec.hashed
    return values == rec.values


# ------------------------------------------------------------------------ running a file

@dataclasses.dataclass
class Outcome:
    """How one query record went."""

    line: int
    sql: str
    cls: str          # one of CLASSES
    multi: bool       # several tables, a join or a subquery
    cause: str = ""   # for the classes other than correct
    detail: str = ""  # both results, or the message
    paths: str = ""   # with --paths: how forced access paths differ from the default one


class FileRun:
    """One suite file against rtindex, DuckDB, and (for diagnosis) SQLite."""

    def __init__(self, records: list[Record], workdir: str, paths: bool = False):
        self.records = records
        self.paths = paths  # also force each access path and compare with the default one
        self.db = rtindex.open(workdir, seal_rows=4)  # small segments: sealed rows and in-memory ones
        self.duck = duckdb.connect()
        self.lite = sqlite3.connect(":memory:")
        self.columns: dict[str, list[str]] = {}   # table -> declared columns
        self.loaded: dict[str, dict[int, tuple]] = {}  # collection -> rowid -> the row its document holds
        self.gone: set[str] = set()               # tables/views rtindex could not follow
        self.skipped: collections.Counter[str] = collections.Counter()

    def close(self) -> None:
        self.db.close()
        self.duck.close()
        self.lite.close()

    def run(self, chosen: set[int]) -> list[Outcome]:
        """Apply every statement; run the query records whose index is in ``chosen``."""
        outcomes, q = [], -1
        for rec in self.records:
            if rec.kind == "halt":
                break
            if rec.kind == "statement":
                self.statement(rec)
                continue
            q += 1
            if q not in chosen:
                continue
            if self.gone & _names(rec.sql):
                self.skipped["query of a view, or of a table this runner could not follow"] += 1
                continue
            outcomes.append(self.query(rec))
        return outcomes

    # -- statements

    def statement(self, rec: Record) -> None:
        try:
            self.lite.execute(rec.sql)
        except sqlite3.Error:
            pass  # a statement error record, or one SQLite refuses: the diagnosis oracle follows the file
        try:
            tree = sqlglot.parse_one(rec.sql, read="sqlite")
        except sqlglot.errors.SqlglotError:
            tree = None
        if isinstance(tree, (exp.Create, exp.Drop)) and tree.kind == "INDEX":
            return  # the converged index has every field
        if rec.error or isinstance(tree, exp.Query):  # a statement that must fail, or a SELECT
            self.skipped["statement error" if rec.error else "statement SELECT"] += 1
            return
        try:
            loaded = tree is not None and self.load(rec.sql, tree)
        except (duckdb.Error, rtindex.RtindexError):
            loaded = False
        if not loaded:
            target = _target(tree) if tree is not None else None
            # what it writes, or, for a statement sqlglot does not read (a trigger), every table it names
            self.gone |= {target} if target else _names(rec.sql) & set(self.columns)
            self.skipped[f"statement {_statement_kind(rec.sql)}"] += 1

    def load(self, sql: str, tree: exp.Expression) -> bool:
        """Apply a data statement to DuckDB, then bring the collection to DuckDB's rows;
        False when this runner cannot follow the statement."""
        if isinstance(tree, exp.Create) and tree.kind == "TABLE" and isinstance(tree.this, exp.Schema) \
                and not tree.expression:
            name = tree.this.this.name
            self.duck.execute(_duckdb_typed(sql))
            self.columns[name] = [c.name for c in tree.this.expressions if isinstance(c, exp.ColumnDef)]
            if name not in self.loaded:  # else: the emptied collection of a table of that name, dropped
                self.db.create_collection(name, shards=2)
                self.loaded[name] = {}
            self.gone.discard(name)
            return True
        name = _target(tree)
        if name not in self.columns or name in self.gone:
            return False
        if isinstance(tree, exp.Drop) and tree.kind == "TABLE":
            self.duck.execute(sql)
            del self.columns[name]
            self.sync(name, appended=False)
            return True
        if not isinstance(tree, (exp.Insert, exp.Delete, exp.Update)):
            return False
        self.duck.execute(sql)
        self.sync(name, appended=isinstance(tree, exp.Insert) and not tree.args.get("alternative"))
        return True

    def sync(self, name: str, appended: bool) -> None:
        """Make the collection hold DuckDB's rows of the table: one document per row, its
        ``_id`` the row's rowid. ``appended``: the statement only added rows (DuckDB gives
        them rowids above every earlier one), so only those are read."""
        have = self.loaded[name]
        if name in self.columns:
            since = f" WHERE rowid > {max(have, default=-1)}" if appended else ""
            rows = {r[0]: r[1:] for r in self.duck.sql(f'SELECT rowid, * FROM "{name}"{since}').fetchall()}
        else:
            rows = {}
        collection = self.db.collection(name)
        if not appended:
            for rowid in have.keys() - rows.keys():
                collection.delete(rowid)
                del have[rowid]
        changed = {rowid: row for rowid, row in rows.items() if have.get(rowid) != row}
        if changed:
            collection.ingest([{"_id": rowid, **dict(zip(self.columns[name], row))} for rowid, row in changed.items()],
                              errors="raise")
            have.update(changed)

    # -- queries

    def query(self, rec: Record) -> Outcome:
        multi = _multi_table(rec.sql)
        try:
            got = result_values(self.rtindex_rows(rec.sql), rec.types, rec.sort)
        except rtindex.SqlError as e:
            msg = str(e)
            try:
                self.duck.sql(rec.sql).fetchall()
                duckdb_answers = True
            except duckdb.Error:
                duckdb_answers = False
            clear = isinstance(e, rtindex.UnsupportedSqlError) or not duckdb_answers
            cls = "refused" if clear and not UNTRANSLATED.search(msg) else "error"
            return Outcome(rec.line, rec.sql, cls, multi, _message_cause(msg), msg)
        except Exception as e:  # noqa: BLE001 - any other exception is the class "error"
            msg = f"{type(e).__name__}: {e}"
            return Outcome(rec.line, rec.sql, "error", multi, _message_cause(msg), msg)
        disagree = self.other_paths(rec, got) if self.paths else ""
        if expected_matches(rec, got):
            return Outcome(rec.line, rec.sql, "correct", multi, paths=disagree)
        try:
            duck = result_values(self.duck.sql(rec.sql).fetchall(), rec.types, rec.sort)
        except duckdb.Error as e:
            duck = [f"(DuckDB: {str(e).splitlines()[0]})"]
        expected = self.expected_values(rec)
        cls = "duckdb_semantics" if got == duck else "wrong"
        detail = (f"expected: {_short(expected) if expected is not None else rec.hashed}\n"
                  f"rtindex:  {_short(got)}\nDuckDB:   {_short(duck)}")
        return Outcome(rec.line, rec.sql, cls, multi, _difference_cause(rec, expected, got), detail, disagree)

    def other_paths(self, rec: Record, got: list[str]) -> str:
        """How the forced access paths' results differ from the default path's (rows compared
        sorted when the query has no ORDER BY); empty when they agree."""
        sort = "rowsort" if rec.sort == "nosort" and not re.search(r"\border\s+by\b", rec.sql, re.IGNORECASE) else rec.sort
        width = max(len(rec.types), 1)
        want = got if sort == rec.sort else [v for row in sorted(got[i:i + width] for i in range(0, len(got), width))
                                              for v in row]
        out = []
        for access in ("index", "scan"):
            try:
                values = result_values(self.rtindex_rows(rec.sql, access), rec.types, sort)
            except Exception as e:  # noqa: BLE001 - a path that fails where the default one ran
                values = [f"({type(e).__name__}: {str(e).splitlines()[0]})"]
            if values != want:
                out.append(f"{access}: {_short(values)}")
        return "\n".join(out)

    def rtindex_rows(self, sql: str, access: str | None = None) -> list[tuple]:
        """The rows rtindex returns, by position, without the _id and _event_time every
        document has (over a join: _id_2, _event_time_2... for the later tables)."""
        table = self.db.sql(sql, access=access).arrow()
        keep = [i for i, n in enumerate(table.column_names) if not _ADDED.fullmatch(n)]
        columns = [table.column(i).to_pylist() for i in keep]
        return list(zip(*columns)) if columns else []

    def expected_values(self, rec: Record) -> list[str] | None:
        """The expected values, from the file or, when it gives a hash, from SQLite (None
        when SQLite's answer is not the file's either)."""
        if rec.values is not None:
            return rec.values
        try:
            values = result_values(self.lite.execute(rec.sql).fetchall(), rec.types, rec.sort)
        except sqlite3.Error:
            return None
        return values if expected_matches(rec, values) else None


# ------------------------------------------------------------------------ helpers

def _names(sql: str) -> set[str]:
    """Every word of a SQL text (a cheap superset of the tables it names)."""
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", sql))


def _target(tree: exp.Expression) -> str | None:
    """The table (or view) a statement creates, drops or writes."""
    if isinstance(tree, exp.Drop):
        tables = tree.args.get("tables") or [tree.this]
        table = tables[0]
    else:
        table = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
    return table.name if isinstance(table, exp.Table) else None


def _statement_kind(sql: str) -> str:
    words = sql.split()
    head = " ".join(words[:2]).upper() if words[:1] and words[0].upper() in ("CREATE", "DROP") else words[0].upper()
    return re.sub(r"\s+(UNIQUE|TEMP|TEMPORARY)$", "", head)


def _duckdb_typed(create: str) -> str:
    """A CREATE TABLE with the column types rtindex gives the values (64-bit ints and floats)."""
    create = re.sub(r"\b(INTEGER|INT|SMALLINT|TINYINT)\b", "BIGINT", create, flags=re.IGNORECASE)
    return re.sub(r"\b(FLOAT|REAL)\b", "DOUBLE", create, flags=re.IGNORECASE)


def _multi_table(sql: str) -> bool:
    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except sqlglot.errors.SqlglotError:
        return False
    return len(list(tree.find_all(exp.Table))) > 1 or len(list(tree.find_all(exp.Select))) > 1


def _message_cause(msg: str) -> str:
    """An error message with its specifics (positions, quoted names, numbers) blanked, to group by."""
    first = msg.splitlines()[0]
    first = re.sub(r"\(line \d+, column \d+\)", "", first)
    first = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", first)
    return re.sub(r"\b\d+\b", "N", first).strip()[:140]


def _difference_cause(rec: Record, expected: list[str] | None, got: list[str]) -> str:
    """A guess at why a result differs from the expected one."""
    if expected is None:
        return "hashed result SQLite does not reproduce (not diagnosed)"
    if len(expected) != len(got):
        how = "another number of values"
    elif sorted(expected) == sorted(got):
        how = "the same values in another order" + (" (NULLs placed differently)" if "NULL" in got else "")
    else:
        how = "other values"
    return how + ("; the query divides (DuckDB's / is float division)" if "/" in rec.sql else "")


_ADDED = re.compile(r"(_id|_event_time)(_[0-9]+)?")  # columns rtindex's SELECT * adds


def _short(values: list[str], n: int = 12) -> str:
    return " ".join(values[:n]) + (f" ... ({len(values)} values)" if len(values) > n else "")


def choose(n_queries: int, limit: int | None) -> set[int]:
    """At most ``limit`` of ``n_queries`` query indexes, spread evenly through the file."""
    if limit is None or limit >= n_queries:
        return set(range(n_queries))
    return {i * n_queries // limit for i in range(limit)}


def figures(outcomes: list[Outcome]) -> dict[str, Any]:
    counts = collections.Counter(o.cls for o in outcomes)
    out: dict[str, Any] = {"queries": len(outcomes), **{c: counts[c] for c in CLASSES}}
    good = counts["correct"] + counts["duckdb_semantics"]
    out["pct_correct_or_duckdb"] = round(100 * good / len(outcomes), 2) if outcomes else None
    answered = len(outcomes) - counts["refused"]
    out["pct_correct_or_duckdb_of_not_refused"] = round(100 * good / answered, 2) if answered else None
    return out


# ------------------------------------------------------------------------ main

def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default=MIRROR, help="a sqllogictest checkout or its git directory")
    ap.add_argument("--files", nargs="+", default=list(DEFAULT_FILES), metavar="GLOB",
                    help="globs of file paths in the suite (default: select1-5, a sample of index/ and evidence/)")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_QUERIES} query records per file (about a minute)")
    ap.add_argument("--limit-queries", type=int, default=None, metavar="N",
                    help="at most N query records per file, spread evenly through it")
    ap.add_argument("--paths", action="store_true",
                    help="also run each query with access='index' and access='scan' and compare with the default path")
    ap.add_argument("--examples", type=int, default=3, help="examples shown per cause")
    args = ap.parse_args(argv)
    logging.getLogger("sqlglot").setLevel(logging.ERROR)  # its fallbacks for SQLite-only statements
    limit = args.limit_queries if args.limit_queries is not None else (QUICK_QUERIES if args.quick else None)

    suite = Suite(args.suite)
    names = suite.names()
    files = [n for n in names if any(fnmatch.fnmatchcase(n, g) for g in args.files)]
    if not files:
        raise SystemExit(f"no .test file of {args.suite} matches {' '.join(args.files)}")
    t0 = time.perf_counter()
    per_file: dict[str, list[Outcome]] = {}
    skipped: collections.Counter[str] = collections.Counter()
    for name in files:
        text = suite.read(name)
        if text is None:
            print(f"{name}: not in this snapshot (a large file left out of the mirror); skipped", file=sys.stderr)
            continue
        records = parse(text)
        n_queries = sum(r.kind == "query" for r in records)
        t = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            run = FileRun(records, tmp + "/db", paths=args.paths)
            try:
                per_file[name] = run.run(choose(n_queries, limit))
            finally:
                run.close()
        skipped.update(run.skipped)
        f = figures(per_file[name])
        print(f"{name}: {f['queries']} queries, {f['pct_correct_or_duckdb']}% correct or DuckDB's semantics "
              f"({time.perf_counter() - t:.1f} s)", file=sys.stderr)
    seconds = time.perf_counter() - t0
    report(per_file, skipped, args.examples)

    everything = [o for outs in per_file.values() for o in outs]
    out = figures(everything)
    out["skipped"] = sum(skipped.values())
    out.update({f"multi_{k}": v for k, v in figures([o for o in everything if o.multi]).items()})
    out["paths_disagree"] = sum(bool(o.paths) for o in everything) if args.paths else None
    out["files"] = len(per_file)
    out["limit_queries"] = limit
    out["seconds"] = round(seconds, 1)
    print(json.dumps(out))
    return out


def report(per_file: dict[str, list[Outcome]], skipped: collections.Counter[str], examples: int) -> None:
    hdr = f"{'file':<44} {'queries':>7} " + " ".join(f"{c[:9]:>9}" for c in CLASSES) + f" {'% ok':>6}"
    print(hdr)
    print("-" * len(hdr))
    rows = list(per_file.items()) + [("total", [o for outs in per_file.values() for o in outs])]
    for name, outs in rows:
        f = figures(outs)
        pct = f"{f['pct_correct_or_duckdb']:.1f}" if outs else "-"
        print(f"{name:<44} {f['queries']:>7} " + " ".join(f"{f[c]:>9}" for c in CLASSES) + f" {pct:>6}")
    print("(% ok: correct or DuckDB's semantics)")
    if skipped:
        print("\nskipped records: " + "; ".join(f"{why}: {n}" for why, n in skipped.most_common()))
    for cls in CLASSES[1:]:
        causes: dict[str, list[tuple[str, Outcome]]] = collections.defaultdict(list)
        for name, outs in per_file.items():
            for o in outs:
                if o.cls == cls:
                    causes[o.cause].append((name, o))
        if not causes:
            continue
        print(f"\n== {cls}: {sum(map(len, causes.values()))} queries")
        for cause, hits in sorted(causes.items(), key=lambda kv: -len(kv[1])):
            print(f"-- {len(hits)} x {cause}")
            for name, o in hits[:examples]:
                print(f"   {name}:{o.line}: {' '.join(o.sql.split())}")
                for line in o.detail.splitlines():
                    print(f"      {line}")
    disagree = [(name, o) for name, outs in per_file.items() for o in outs if o.paths]
    if disagree:
        print(f"\n== a forced access path differs from the default one: {len(disagree)} queries")
        for name, o in disagree[:examples * 3]:
            print(f"   {name}:{o.line} ({o.cls} on the default path): {' '.join(o.sql.split())}")
            for line in o.paths.splitlines():
                print(f"      {line}")


if __name__ == "__main__":
    main()
