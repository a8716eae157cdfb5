#!/usr/bin/env python
"""rtindex's SQL checked from outside, on real public JSON, against DuckDB as the oracle.

    python benchmarks/sql_public_json.py --data FILE [FILE ...] [--quick] [--seed N]
                                         [--queries N] [--no-mixed] [--repros N]

Each FILE is one data set: a JSON array of documents, an object holding them (the largest
member that is an array of objects, like twitter.json's ``statuses``, or an object of
objects, like a package index's ``plugins``), or NDJSON (objects, or arrays after a first
line of field names). Public examples: simdjson's ``jsonexamples/`` (twitter.json,
github_events.json, update-center.json, amazon_cellphones.ndjson); the script reads them
where they are. Each data set becomes one collection (2 shards; half ingested and flushed
into sealed segments, half left in the in-memory tail), and, with more than one FILE, all of
them together become the collection ``mixed``, where fields such as ``id`` hold different
types in different documents. A document without ``_id`` gets its position as ``_id``.

The oracle is DuckDB over an Arrow table built here, independently of rtindex's code, from
the documented rules (docs/sql.md, "Types and comparisons" and "Residuals"): per field (a
path through objects only) one column per type family (ints, floats, strings, bools; the
elements of arrays per family), with flags for null-or-missing, missing and array. A
comparison reads the column of its literal's family, so rule 2 (typed comparisons, UNKNOWN
across families) and rule 3 (three-valued logic) hold by construction; an int compared with
a float literal is compared exactly (with the ints next to it). The typing of projected
fields depends on the rows a query selects, so the oracle runs in two steps, as the
documented semantics does: the conjuncts of WHERE that the index answers select rows of the
whole collection; then a frame of those rows gets each output field typed by the values it
holds in them (one kind: that type; ints and floats: DOUBLE, text if an int is beyond 2**53;
anything else mixed: text, non-strings as JSON; no value in them: the collection's type when
its values have one, else a column of NULLs, as docs/sql.md leaves that case open) and
DuckDB runs the rest of the query (residual, GROUP BY, ORDER BY, LIMIT) over it. Subqueries,
self joins and windows only output, join, group and order on fields of one type in the whole
collection, where the typing cannot depend on which rows are read.

Queries are generated (``--seed``) from the fields present. Conditions: equality, IN,
BETWEEN, ranges, IS [NOT] NULL, IS_MISSING, LIKE prefixes and NOT LIKE, ARRAY_CONTAINS,
AND/OR/NOT of them, with literals of the field's kinds and sometimes of another. Queries:
SELECT * (the documents as stored), plain projections, ORDER BY + LIMIT, COUNT, GROUP BY
with aggregates, COUNT(DISTINCT), DISTINCT, residuals (functions, two fields compared,
arithmetic, bare booleans, LIKE '%x%', IS DISTINCT FROM, an OR with a residual), CASE with
GROUP BY ALL, COUNT(*) FILTER, TRY_CAST, RANK() OVER, IN and scalar subqueries, self joins.
Each runs on rtindex three times (default, ``access="index"``, ``access="scan"``) and once
on the oracle. A run is

* correct: the same rows (types included: an int is not a float nor a string; floats to
  10 significant digits; in order when ORDER BY orders totally), ``rows()`` and ``arrow()``
  alike; or both raise (an aggregate over text, say);
* refused: a SqlError whose message is the user's terms;
* error: any other exception, a SqlError that shows DuckDB's or the planner's internals
  (``Binder Error``, a frame column ``f0``, ...), or a refusal on one access path of a
  query that another path answers;
* wrong: other rows.

Every wrong answer and error is shrunk to a minimal repro (fewest documents, fewest fields,
by delta debugging on fresh collections) for the first ``--repros`` distinct causes, printed
with the SQL and both answers. Progress and the report go to stderr; the LAST stdout line is
one JSON object of the figures: runs, correct_pct, refused_pct, wrong_pct, error_pct,
queries_correct_pct (right on all three paths), informative_answers_pct (answers holding a
value other than 0 and NULL), forced_scan_ran_pct (runs with ``access="scan"`` that did
scan), ``<data set>_correct_pct``, ...
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import duckdb
import pyarrow as pa

import rtindex

PATHS = (None, "index", "scan")  # None: rtindex's own choice
OUTCOMES = ("correct", "refused", "wrong", "error")
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
EXACT_INT = 1 << 53
# a SqlError that shows these did not translate DuckDB's or the planner's terms into the user's
INTERNAL = re.compile(r"Binder Error|~~|Parser Error|Catalog Error|Conversion Error|INTERNAL|Traceback|"
                      r"\bf\d+\b|__c\d+|\"frame\"|sqlglot|exp\.[A-Z]")
SCALARS = ("int", "float", "str", "bool")
PATH_DEPENDENT = "refused on this access path, answered on another: "
LIST_TYPES = {"i": pa.list_(pa.int64()), "f": pa.list_(pa.float64()), "s": pa.list_(pa.string()),
              "b": pa.list_(pa.bool_())}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- loading


def load_documents(path: str) -> list[dict]:
    """The documents of one file (the formats in the module docstring)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        if lines and isinstance(lines[0], list):  # a header line of names, then rows
            return [dict(zip(lines[0], row)) for row in lines[1:]]
        data = lines
    if isinstance(data, dict):
        groups = [v for v in data.values() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
        groups += [list(v.values()) for v in data.values()
                   if isinstance(v, dict) and len(v) > 1 and all(isinstance(x, dict) for x in v.values())]
        if not groups:
            raise SystemExit(f"{path}: no array of objects (nor object of objects) in it")
        data = max(groups, key=len)
    docs = [d for d in data if isinstance(d, dict)]
    if not docs:
        raise SystemExit(f"{path}: no documents (JSON objects) in it")
    return docs


def kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    return "array" if isinstance(v, list) else "object"


MISSING = object()


def reach(doc: dict, path: tuple[str, ...]) -> Any:
    """The value at ``path`` through objects only (rule 1), MISSING when unreachable."""
    cur: Any = doc
    for name in path:
        if not isinstance(cur, dict) or name not in cur:
            return MISSING
        cur = cur[name]
    return cur


def elements(v: list) -> list:
    """The scalar elements of an array, nested arrays included (rule 5)."""
    out = []
    for x in v:
        out.extend(elements(x) if isinstance(x, list) else [x])
    return out


def as_text(v: Any) -> str:
    """A non-string value in a text column: JSON (floats as Python's repr)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"), ensure_ascii=False)


# --------------------------------------------------------------------------- the oracle


@dataclass
class Field:
    """One path of the collection and what its documents hold there."""

    path: tuple[str, ...]
    col: str  # the oracle's column prefix (c0, c1, ...): DuckDB names are case-insensitive
    kinds: collections.Counter = field(default_factory=collections.Counter)  # incl. null, missing
    values: dict = field(default_factory=lambda: collections.defaultdict(collections.Counter))  # kind -> values
    elems: dict = field(default_factory=lambda: collections.defaultdict(collections.Counter))  # array elements

    @property
    def name(self) -> str:
        return ".".join(self.path)

    @property
    def value_kinds(self) -> set[str]:
        return set(self.kinds) - {"null", "missing"}

    @property
    def scalar(self) -> bool:
        """Holds scalars only (so it can be projected as a column)."""
        return bool(self.value_kinds) and self.value_kinds <= set(SCALARS)

    @property
    def one_type(self) -> bool:
        """Typed the same whichever rows a query reads."""
        return len(self.value_kinds) == 1 and self.scalar


class Catalog:
    """The fields of a list of documents and the oracle's table of their type families."""

    def __init__(self, docs: list[dict], paths: list[tuple[str, ...]] | None = None):
        self.docs = docs
        if paths is None:
            found: dict[tuple[str, ...], None] = {("_id",): None}
            for d in docs:
                self._walk(d, (), found)
            paths = list(found)
        self.fields = {p: Field(p, f"c{i}") for i, p in enumerate(paths)}
        self.raw: dict[tuple[str, ...], list] = {}
        for p, f in self.fields.items():
            vals = [reach(d, p) for d in docs]
            self.raw[p] = vals
            for v in vals:
                k = "missing" if v is MISSING else kind(v)
                f.kinds[k] += 1
                if k in SCALARS:
                    f.values[k][v] += 1
                elif k == "array":
                    for e in elements(v):
                        if kind(e) in SCALARS:
                            f.elems[kind(e)][e] += 1
        self.table = self._families()

    def _walk(self, doc: dict, prefix: tuple[str, ...], found: dict) -> None:
        for k, v in doc.items():
            if not IDENT.match(k):
                continue
            p = prefix + (k,)
            found.setdefault(p, None)
            if isinstance(v, dict):
                self._walk(v, p, found)

    def _families(self) -> pa.Table:
        cols: dict[str, pa.Array] = {"_row": pa.array(range(len(self.docs)), pa.int64())}
        for p, f in self.fields.items():
            vals = self.raw[p]
            pick = {k: [v if kind(v) == k else None for v in vals] for k in SCALARS}
            cols[f.col + "_i"] = pa.array(pick["int"], pa.int64())
            cols[f.col + "_f"] = pa.array(pick["float"], pa.float64())
            cols[f.col + "_s"] = pa.array(pick["str"], pa.string())
            cols[f.col + "_b"] = pa.array(pick["bool"], pa.bool_())
            cols[f.col + "_null"] = pa.array([v is None or v is MISSING for v in vals], pa.bool_())
            cols[f.col + "_miss"] = pa.array([v is MISSING for v in vals], pa.bool_())
            arrays = [v if isinstance(v, list) else None for v in vals]
            cols[f.col + "_arr"] = pa.array([a is not None for a in arrays], pa.bool_())
            for fam, k in (("i", "int"), ("f", "float"), ("s", "str"), ("b", "bool")):
                lists = [None if a is None else [e for e in elements(a) if kind(e) == k] for a in arrays]
                cols[f"{f.col}_e{fam}"] = pa.array(lists, LIST_TYPES[fam])
        return pa.table(cols)

    def output_column(self, path: tuple[str, ...], rows: list[int]) -> pa.Array:
        """A projected field over the selected rows, typed by the values it holds in them
        (the collection's values when they hold none)."""
        vals = [self.raw[path][r] for r in rows]
        vals = [None if v is MISSING else v for v in vals]
        kinds = {kind(v) for v in vals} - {"null"}
        source = vals
        if not kinds:  # the collection's type, "when they have one": none when its values mix types
            source = [v for v in self.raw[path] if v is not MISSING]
            kinds = {kind(v) for v in source} - {"null"}
            if not kinds or (len(kinds) > 1 and kinds != {"int", "float"}):
                return pa.nulls(len(vals))
        typed = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_()}
        if len(kinds) == 1 and next(iter(kinds)) in typed:
            return pa.array(vals, typed[next(iter(kinds))])
        if kinds == {"int", "float"} and not any(kind(v) == "int" and abs(v) > EXACT_INT for v in source):
            return pa.array([None if v is None else float(v) for v in vals], pa.float64())
        return pa.array([None if v is None else as_text(v) for v in vals], pa.string())


def normal(v: Any) -> Any:
    """A value as results compare: floats to 10 significant digits, an integral DECIMAL (a
    SUM of ints in DuckDB, a 128-bit int) as the int rtindex gives."""
    if isinstance(v, float):
        return None if math.isnan(v) else float(f"{v:.10g}")
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(f"{float(v):.10g}")
    if isinstance(v, (list, dict)):
        return json.dumps(v, sort_keys=True)
    return v


def documents(rows: list[dict]) -> list[str]:
    """Documents as they compare: JSON text (an int is not a float), without the
    ``_event_time`` rtindex adds at ingest, sorted (compared as a multiset)."""
    return sorted((json.dumps({k: v for k, v in d.items() if k != "_event_time"}, sort_keys=True,
                              ensure_ascii=False) for d in rows), key=lambda t: (len(t), t))


def result_rows(rows: list[dict], ordered: bool) -> list[tuple]:
    out = [tuple((type(normal(v)).__name__, normal(v)) for v in r.values()) for r in rows]
    return out if ordered else sorted(out, key=repr)


@dataclass
class Query:
    """One generated query: rtindex's text and the oracle's two steps."""

    kind: str
    rt: str
    select: str | None  # oracle step 1: WHERE of the index part over "fam" (None: every row)
    body: str  # oracle step 2, over "frame" (the selected rows, output fields typed by them)
    outputs: list[tuple[str, ...]]  # fields whose typed column step 2 needs
    ordered: bool = False
    star: bool = False  # SELECT *: step 2 gives the _ids, the answer is those documents as stored


class Oracle:
    """DuckDB over the catalog's family table, following docs/sql.md's rules."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.con = duckdb.connect()
        self.con.register("fam", catalog.table)

    def run(self, q: Query) -> list[dict]:
        if q.select is None:
            rows = list(range(len(self.catalog.docs)))
        else:
            got = self.con.sql(f"SELECT _row FROM fam WHERE {q.select} ORDER BY _row").fetchall()
            rows = [r[0] for r in got]
        frame = self.catalog.table.take(pa.array(rows, pa.int64()))
        for p in dict.fromkeys(q.outputs):
            frame = frame.append_column(self.catalog.fields[p].col, self.catalog.output_column(p, rows))
        self.con.register("frame", frame)
        try:
            out = self.con.sql(q.body).to_arrow_table().to_pylist()
        finally:
            self.con.unregister("frame")
        if q.star:
            by_id = {d["_id"]: d for d in self.catalog.docs}
            return [by_id[r["c0"]] for r in out]
        return out

    def close(self) -> None:
        self.con.close()


# --------------------------------------------------------------------------- queries


def sql_literal(v: Any) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, (int, float)):
        return repr(v)
    return "'" + v.replace("'", "''") + "'"


def int_vs_float(col: str, op: str, v: float) -> str:
    """An int column compared with a float exactly (rule 2): with the int the float equals,
    or with the ints on either side of it (DuckDB alone would round the ints to doubles)."""
    if v.is_integer():
        return f"{col} {op} {int(v)}"
    if op in ("=", "<>"):
        return "FALSE" if op == "=" else "TRUE"
    if op in ("<", "<="):
        return f"{col} <= {math.floor(v)}"
    return f"{col} >= {math.ceil(v)}"


@dataclass
class Pred:
    """A condition in both languages; ``q`` is the qualifier (``a.``) to put before fields."""

    rt: Callable[[str], str]
    oracle: Callable[[str], str]
    index: bool  # the index answers it (docs/sql.md's WHERE row), so it narrows the rows


class Gen:
    """Draws queries over one catalog's fields."""

    def __init__(self, catalog: Catalog, table: str, rng: random.Random):
        self.c = catalog
        self.t = table
        self.rng = rng
        fields = list(catalog.fields.values())
        self.scalars = [f for f in fields if f.value_kinds & set(SCALARS)]  # in some documents
        self.outputs = [f for f in fields if f.scalar]
        self.typed = [f for f in fields if f.one_type]
        self.strings = [f for f in fields if "str" in f.value_kinds and self._short(f)]
        self.numbers = [f for f in fields if f.value_kinds & {"int", "float"}]
        self.typed_numbers = [f for f in self.typed if f.value_kinds <= {"int", "float"}]
        self.typed_strings = [f for f in self.typed if f.value_kinds == {"str"} and self._short(f)]
        self.bools = [f for f in self.typed if f.value_kinds == {"bool"}]
        self.arrays = [f for f in fields if "array" in f.value_kinds and f.elems]
        self.everything = fields
        self.groupable = [f for f in self.outputs if self._groups(f)]
        self.mixed = {id(f) for f in fields if len(f.value_kinds) > 1}

    def field(self, candidates: list[Field]) -> Field:
        """One of ``candidates``, a field of mixed types a third of the time when there is
        one (real data has few, and they are where the typing rules matter)."""
        mixed = [f for f in candidates if id(f) in self.mixed]
        if mixed and self.rng.random() < 0.33:
            return self.rng.choice(mixed)
        return self.rng.choice(candidates)

    def _short(self, f: Field) -> bool:
        return any(len(s) <= 80 for s in f.values["str"])

    def _groups(self, f: Field) -> bool:
        n = sum(len(v) for v in f.values.values())
        return 1 < n <= max(50, len(self.c.docs) // 3)

    # ---- values
    def pick(self, counter: collections.Counter) -> Any:
        vals = list(counter)
        return vals[self.rng.randrange(len(vals))]

    def number(self, f: Field) -> Any:
        """A number to compare ``f`` with: one it holds (or next to one), sometimes as the
        other numeric kind (an int field against a float literal: exact comparison)."""
        rng = self.rng
        k = rng.choice(sorted(f.value_kinds & {"int", "float"}))
        v = self.pick(f.values[k])
        how = rng.choice(["same", "same", "same", "near", "cross"])
        if how == "near":
            v = v + rng.choice([-1, 1])
        elif how == "cross" and k == "int":
            v = float(v) if abs(v) >= 1 << 52 or rng.random() < 0.5 else v + 0.5
        elif how == "cross" and float(v).is_integer() and abs(v) < EXACT_INT:
            v = int(v)
        return v

    def string(self, f: Field) -> str:
        vals = [s for s in f.values["str"] if len(s) <= 80]
        v = vals[self.rng.randrange(len(vals))]
        return v if self.rng.random() < 0.9 else v + "~"

    def value_for(self, f: Field) -> Any:
        """A literal for a comparison with ``f``: usually of a kind it holds, sometimes not."""
        fams = [k for k in SCALARS if f.values.get(k)]
        if "str" in fams and not self._short(f):
            fams.remove("str")
        if not fams or self.rng.random() < 0.08:
            return self.rng.choice([3, "x", True, 2.5])
        k = self.rng.choice(fams)
        if k in ("int", "float"):
            return self.number(f)
        if k == "str":
            return self.string(f)
        return self.rng.choice([True, False])

    # ---- predicates
    @staticmethod
    def cmp_oracle(f: Field, op: str, v: Any) -> Callable[[str], str]:
        c = f.col
        if isinstance(v, bool):
            return lambda q: f"({q}{c}_b {op} {sql_literal(v)})"
        if isinstance(v, str):
            return lambda q: f"({q}{c}_s {op} {sql_literal(v)})"
        if isinstance(v, float):
            return lambda q: (f"(CASE WHEN {q}{c}_i IS NOT NULL THEN {int_vs_float(q + c + '_i', op, v)} "
                              f"ELSE {q}{c}_f {op} {sql_literal(v)} END)")
        return lambda q: f"(CASE WHEN {q}{c}_i IS NOT NULL THEN {q}{c}_i {op} {v} ELSE {q}{c}_f {op} {v} END)"

    def leaf(self, forms: tuple[str, ...] = ("cmp", "cmp", "cmp", "in", "between", "null", "missing", "like",
                                             "notlike", "contains", "not")) -> Pred:
        rng = self.rng
        form = rng.choice(forms)
        if form == "contains" and self.arrays:
            f = rng.choice(self.arrays)
            fam = rng.choice(sorted(f.elems))
            v = self.pick(f.elems[fam]) if rng.random() < 0.9 else {"int": 123456, "float": 0.25,
                                                                     "str": "zz", "bool": True}[fam]
            lists = {"int": "_ei", "float": "_ef", "str": "_es", "bool": "_eb"}
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                has = lambda q: (f"(list_contains({q}{f.col}_ei, {sql_literal(v)}) OR "
                                 f"list_contains({q}{f.col}_ef, {sql_literal(v)}))")
            else:
                has = lambda q: f"list_contains({q}{f.col}{lists[kind(v)]}, {sql_literal(v)})"
            return Pred(lambda q: f"ARRAY_CONTAINS({q}{f.name}, {sql_literal(v)})",
                        lambda q: f"(CASE WHEN {q}{f.col}_arr THEN {has(q)} END)", True)
        if form in ("null", "missing"):
            f = self.field(self.everything)
            neg = rng.random() < 0.4
            if form == "null":
                n = " NOT" if neg else ""
                return Pred(lambda q: f"{q}{f.name} IS{n} NULL",
                            lambda q: f"({'NOT ' if neg else ''}{q}{f.col}_null)", True)
            n = "NOT " if neg else ""
            return Pred(lambda q: f"{n}IS_MISSING({q}{f.name})", lambda q: f"({n}{q}{f.col}_miss)", True)
        if form in ("like", "notlike") and self.strings:
            f = self.field(self.strings)
            s = self.string(f)
            if rng.random() < 0.15:  # a pattern for a field that holds no strings: UNKNOWN (rule 2)
                f = self.field(self.scalars)
            prefix = s[: rng.randint(0, 4)]
            if "%" in prefix or "_" in prefix or "\\" in prefix:
                prefix = ""
            pat = sql_literal(prefix + "%") if rng.random() < 0.8 else sql_literal(s.replace("%", "").replace("_", ""))
            n = " NOT" if form == "notlike" else ""
            return Pred(lambda q: f"{q}{f.name}{n} LIKE {pat}", lambda q: f"({q}{f.col}_s{n} LIKE {pat})", True)
        if form == "not":
            inner = self.leaf(forms)
            return Pred(lambda q: f"NOT ({inner.rt(q)})", lambda q: f"(NOT {inner.oracle(q)})", inner.index)
        f = self.field(self.scalars)
        if form == "in":
            vals = [self.value_for(f) for _ in range(rng.randint(1, 4))]
            parts = [self.cmp_oracle(f, "=", v) for v in vals]
            text = ", ".join(sql_literal(v) for v in vals)
            return Pred(lambda q: f"{q}{f.name} IN ({text})",
                        lambda q: "(" + " OR ".join(p(q) for p in parts) + ")", True)
        if form == "between":
            lo, hi = sorted([self.value_for(f), self.value_for(f)], key=lambda v: (kind(v), v))
            a, b = self.cmp_oracle(f, ">=", lo), self.cmp_oracle(f, "<=", hi)
            return Pred(lambda q: f"{q}{f.name} BETWEEN {sql_literal(lo)} AND {sql_literal(hi)}",
                        lambda q: f"({a(q)} AND {b(q)})", True)
        op = rng.choice(["=", "=", "<>", "<", "<=", ">", ">="])
        v = self.value_for(f)
        o = self.cmp_oracle(f, op, v)
        if rng.random() < 0.2:  # the value on the left
            flip = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}[op]
            return Pred(lambda q: f"{sql_literal(v)} {flip} {q}{f.name}", o, True)
        return Pred(lambda q: f"{q}{f.name} {op} {sql_literal(v)}", o, True)

    def pred(self, depth: int = 0) -> Pred:
        """A leaf, or AND/OR of two predicates (the index answers it if it answers both)."""
        if depth >= 2 or self.rng.random() < 0.6:
            return self.leaf()
        a, b = self.pred(depth + 1), self.pred(depth + 1)
        op = self.rng.choice(["AND", "OR"])
        return Pred(lambda q: f"({a.rt(q)} {op} {b.rt(q)})", lambda q: f"({a.oracle(q)} {op} {b.oracle(q)})",
                    a.index and b.index)

    def residual(self) -> Pred:
        """A condition the index does not answer: DuckDB evaluates it over the frame."""
        rng = self.rng
        forms = ["or"]
        if self.typed_strings:
            forms += ["lower", "length", "contains_text", "ilike"]
        if len(self.typed_numbers) >= 2:
            forms += ["two_fields"]
        if self.typed_numbers:
            forms += ["arith"]
        if self.bools:
            forms += ["bare", "bare", "is_true"]
        if self.scalars:
            forms += ["distinct_from"]
        form = rng.choice(forms)
        if form == "or":
            a = self.leaf()
            b = self.residual()
            return Pred(lambda q: f"({a.rt(q)} OR {b.rt(q)})", lambda q: f"({a.oracle(q)} OR {b.oracle(q)})", False)
        if form in ("lower", "length", "contains_text", "ilike"):
            f = rng.choice(self.typed_strings)
            s = self.string(f)
            if form == "lower":
                v = sql_literal(s.lower())
                return Pred(lambda q: f"lower({q}{f.name}) = {v}", lambda q: f"(lower({q}{f.col}_s) = {v})", False)
            if form == "length":
                n = len(s)
                op = rng.choice(["<", ">=", "="])
                return Pred(lambda q: f"length({q}{f.name}) {op} {n}", lambda q: f"(length({q}{f.col}_s) {op} {n})",
                            False)
            i = rng.randrange(max(1, len(s) - 2))
            sub = s[i:i + 3].replace("%", "").replace("_", "").replace("\\", "")
            like = "ILIKE" if form == "ilike" else "LIKE"
            if form == "ilike":
                sub = sub.upper()
            pat = sql_literal(f"%{sub}%")
            return Pred(lambda q: f"{q}{f.name} {like} {pat}", lambda q: f"({q}{f.col}_s {like} {pat})", False)
        if form == "two_fields":
            f, g = rng.sample(self.typed_numbers, 2)
            op = rng.choice(["=", "<", ">="])
            num = lambda q, x: f"COALESCE({q}{x.col}_i, {q}{x.col}_f)"
            return Pred(lambda q: f"{q}{f.name} {op} {q}{g.name}", lambda q: f"({num(q, f)} {op} {num(q, g)})", False)
        if form == "arith":
            f = rng.choice(self.typed_numbers)
            v = self.number(f)
            if isinstance(v, float) and not v.is_integer():
                v = math.floor(v)
            v = int(v) if abs(v) < EXACT_INT else 0
            return Pred(lambda q: f"{q}{f.name} + 1 > {v}",
                        lambda q: f"(COALESCE({q}{f.col}_i, {q}{f.col}_f) + 1 > {v})", False)
        if form in ("bare", "is_true"):
            f = rng.choice(self.bools)
            if form == "is_true":
                t = rng.choice(["IS TRUE", "IS FALSE", "IS NOT TRUE"])
                return Pred(lambda q: f"{q}{f.name} {t}", lambda q: f"({q}{f.col}_b {t})", False)
            n = rng.choice(["", "NOT "])
            return Pred(lambda q: f"{n}{q}{f.name}", lambda q: f"({n}{q}{f.col}_b)", False)
        f = self.field(self.scalars)
        v = self.value_for(f)
        equal = self.cmp_oracle(f, "=", v)  # NULL for null, missing and another family: distinct
        return Pred(lambda q: f"{q}{f.name} IS DISTINCT FROM {sql_literal(v)}",
                    lambda q: f"(NOT COALESCE({equal(q)}, FALSE))", False)

    # ---- whole queries
    def where(self, preds: list[Pred]) -> tuple[str, str | None, str]:
        """(rtindex WHERE clause, oracle step 1 condition, oracle step 2 WHERE clause)."""
        if not preds:
            return "", None, ""
        rt = " WHERE " + " AND ".join(p.rt("") for p in preds)
        idx = [p.oracle("") for p in preds if p.index]
        rest = [p.oracle("") for p in preds if not p.index]
        return rt, (" AND ".join(idx) if idx else None), (" WHERE " + " AND ".join(rest) if rest else "")

    def query(self) -> Query:
        rng = self.rng
        kinds = ["star", "project", "project", "order_limit", "count", "count", "group", "group", "count_distinct",
                 "distinct", "residual", "residual", "subquery", "scalar_subquery", "self_join", "case",
                 "filter", "window", "try_cast"]
        k = rng.choice(kinds)
        t = self.t
        if k in ("subquery", "scalar_subquery", "self_join", "window") and self.typed:
            return getattr(self, k)()
        if k in ("subquery", "scalar_subquery", "self_join", "window"):
            k = "count"
        if k in ("case", "filter", "try_cast"):
            return getattr(self, k)()
        preds = [self.pred()] if rng.random() < 0.85 else []
        if k == "residual" or (k == "star" and rng.random() < 0.3):
            preds = ([self.pred()] if rng.random() < 0.7 else []) + [self.residual()]
        rt_where, select, where = self.where(preds)
        if k == "star":
            return Query(k, f"SELECT * FROM {t}{rt_where}", select, f"SELECT c0 FROM frame{where}", [("_id",)],
                         star=True)
        if k in ("project", "order_limit", "residual"):
            fields = list({id(f): f for f in (self.field(self.outputs) for _ in range(rng.randint(1, 3)))}.values())
            rt_cols = ", ".join(f.name for f in fields)
            or_cols = ", ".join(f.col for f in fields)
            outs = [f.path for f in fields]
            if k == "order_limit":
                n = rng.choice([1, 5, 20])
                return Query(k, f"SELECT {rt_cols} FROM {t}{rt_where} ORDER BY _id LIMIT {n}", select,
                             f"SELECT {or_cols} FROM frame{where} ORDER BY c0 LIMIT {n}", outs + [("_id",)], True)
            return Query(k, f"SELECT {rt_cols} FROM {t}{rt_where}", select, f"SELECT {or_cols} FROM frame{where}", outs)
        if k == "count":
            return Query(k, f"SELECT COUNT(*) AS n FROM {t}{rt_where}", select,
                         f"SELECT COUNT(*) AS n FROM frame{where}", [])
        if k == "count_distinct":
            f = self.field(self.outputs)
            return Query(k, f"SELECT COUNT(DISTINCT {f.name}) AS n FROM {t}{rt_where}", select,
                         f"SELECT COUNT(DISTINCT {f.col}) AS n FROM frame{where}", [f.path])
        if k == "distinct":
            f = self.field(self.outputs)
            return Query(k, f"SELECT DISTINCT {f.name} FROM {t}{rt_where}", select,
                         f"SELECT DISTINCT {f.col} FROM frame{where}", [f.path])
        # group
        g = rng.choice(self.groupable or self.outputs)
        aggs_rt, aggs_or, outs = [], [], [g.path]
        if rng.random() < 0.6:
            f = self.field(self.outputs)
            fn = rng.choice(["MIN", "MAX"])
            aggs_rt.append(f"{fn}({f.name})")
            aggs_or.append(f"{fn}({f.col})")
            outs.append(f.path)
        if self.numbers and rng.random() < 0.6:
            f = self.field(self.numbers)
            fn = rng.choice(["SUM", "AVG"])
            aggs_rt.append(f"{fn}({f.name})")
            aggs_or.append(f"{fn}({f.col})")
            outs.append(f.path)
        n = rng.choice([3, 10, 100])
        extra_rt = "".join(", " + a for a in aggs_rt)
        extra_or = "".join(", " + a for a in aggs_or)
        return Query(k, f"SELECT {g.name}, COUNT(*) AS n{extra_rt} FROM {t}{rt_where} GROUP BY {g.name} "
                        f"ORDER BY n DESC, {g.name} LIMIT {n}", select,
                     f"SELECT {g.col}, COUNT(*) AS n{extra_or} FROM frame{where} GROUP BY {g.col} "
                     f"ORDER BY n DESC, {g.col} LIMIT {n}", outs, True)

    # a condition inside an expression (CASE WHEN, FILTER): comparisons, LIKE, IS NULL, NOT
    EXPR_LEAVES = ("cmp", "cmp", "in", "between", "null", "like", "notlike", "not")

    def case(self) -> Query:
        """A CASE over a condition, grouped with GROUP BY ALL."""
        c = self.pred_in_expr()
        rt_where, select, where = self.where([self.pred()] if self.rng.random() < 0.5 else [])
        return Query("case", f"SELECT CASE WHEN {c.rt('')} THEN 'yes' ELSE 'no' END AS k, COUNT(*) AS n "
                             f"FROM {self.t}{rt_where} GROUP BY ALL ORDER BY k", select,
                     f"SELECT CASE WHEN {c.oracle('')} THEN 'yes' ELSE 'no' END AS k, COUNT(*) AS n "
                     f"FROM frame{where} GROUP BY ALL ORDER BY k", [], True)

    def filter(self) -> Query:
        """COUNT(*) FILTER (WHERE ...) beside COUNT(*)."""
        c = self.pred_in_expr()
        rt_where, select, where = self.where([self.pred()] if self.rng.random() < 0.5 else [])
        return Query("filter", f"SELECT COUNT(*) FILTER (WHERE {c.rt('')}) AS hits, COUNT(*) AS n "
                               f"FROM {self.t}{rt_where}", select,
                     f"SELECT COUNT(*) FILTER (WHERE {c.oracle('')}) AS hits, COUNT(*) AS n FROM frame{where}", [])

    def pred_in_expr(self) -> Pred:
        if self.rng.random() < 0.7:
            return self.leaf(self.EXPR_LEAVES)
        a, b = self.leaf(self.EXPR_LEAVES), self.leaf(self.EXPR_LEAVES)
        op = self.rng.choice(["AND", "OR"])
        return Pred(lambda q: f"({a.rt(q)} {op} {b.rt(q)})", lambda q: f"({a.oracle(q)} {op} {b.oracle(q)})", False)

    def try_cast(self) -> Query:
        """A field's values back out of its column (text when it mixes types) as numbers."""
        f = self.field(self.outputs)
        to = self.rng.choice(["BIGINT", "DOUBLE", "VARCHAR"])
        rt_where, select, where = self.where([self.pred()] if self.rng.random() < 0.7 else [])
        return Query("try_cast", f"SELECT _id, TRY_CAST({f.name} AS {to}) AS v FROM {self.t}{rt_where} "
                                 f"ORDER BY _id LIMIT 50", select,
                     f"SELECT c0, TRY_CAST({f.col} AS {to}) AS v FROM frame{where} ORDER BY c0 LIMIT 50",
                     [("_id",), f.path], True)

    def window(self) -> Query:
        """RANK() over a number, in a total order."""
        if not self.typed_numbers:
            return self.subquery()
        f = self.rng.choice(self.typed_numbers)
        rt_where, select, where = self.where([self.pred()] if self.rng.random() < 0.6 else [])
        return Query("window", f"SELECT _id, RANK() OVER (ORDER BY {f.name} DESC) AS r FROM {self.t}{rt_where} "
                               f"ORDER BY r, _id LIMIT 20", select,
                     f"SELECT c0, RANK() OVER (ORDER BY {f.col} DESC) AS r FROM frame{where} ORDER BY r, c0 LIMIT 20",
                     [("_id",), f.path], True)

    def subquery(self) -> Query:
        f = self.rng.choice(self.typed)
        inner = self.pred()
        outer = [self.pred()] if self.rng.random() < 0.4 else []
        rt_extra = "".join(f" AND {p.rt('')}" for p in outer)
        or_extra = "".join(f" AND {p.oracle('')}" for p in outer)
        return Query("subquery",
                     f"SELECT COUNT(*) AS n FROM {self.t} WHERE {f.name} IN "
                     f"(SELECT {f.name} FROM {self.t} WHERE {inner.rt('')}){rt_extra}", None,
                     f"SELECT COUNT(*) AS n FROM frame WHERE {f.col} IN "
                     f"(SELECT {f.col} FROM frame WHERE {inner.oracle('')}){or_extra}", [f.path])

    def scalar_subquery(self) -> Query:
        if not self.typed_numbers:
            return self.subquery()
        f = self.rng.choice(self.typed_numbers)
        op = self.rng.choice([">", "<=", "="])
        fn = self.rng.choice(["AVG", "MIN", "MAX"])
        return Query("scalar_subquery",
                     f"SELECT COUNT(*) AS n FROM {self.t} WHERE {f.name} {op} (SELECT {fn}({f.name}) FROM {self.t})",
                     None, f"SELECT COUNT(*) AS n FROM frame WHERE {f.col} {op} (SELECT {fn}({f.col}) FROM frame)",
                     [f.path])

    def self_join(self) -> Query:
        rng = self.rng
        key = rng.choice(self.typed)
        groups = [f for f in self.typed if self._groups(f)] or self.typed
        g = rng.choice(groups)
        p = self.pred()
        n = rng.choice([5, 50])
        return Query("self_join",
                     f"SELECT a.{g.name}, COUNT(*) AS n FROM {self.t} a JOIN {self.t} b ON a.{key.name} = b.{key.name} "
                     f"WHERE {p.rt('a.')} GROUP BY a.{g.name} ORDER BY n DESC, a.{g.name} LIMIT {n}", None,
                     f"SELECT a.{g.col}, COUNT(*) AS n FROM frame a JOIN frame b ON a.{key.col} = b.{key.col} "
                     f"WHERE {p.oracle('a.')} GROUP BY a.{g.col} ORDER BY n DESC, a.{g.col} LIMIT {n}",
                     [key.path, g.path], True)


# --------------------------------------------------------------------------- running


@dataclass
class Outcome:
    kind: str  # one of OUTCOMES
    cause: str = ""
    got: Any = None
    want: Any = None
    access: str | None = None  # Result.access: the path that ran


def oracle_answer(oracle: Oracle, q: Query) -> list[tuple] | Exception:
    try:
        rows = oracle.run(q)
    except duckdb.Error as e:
        return e
    return documents(rows) if q.star else result_rows(rows, q.ordered)


def rtindex_outcome(db, q: Query, path: str | None, want: list[tuple] | Exception) -> Outcome:
    """Run ``q`` on one access path and classify the run against the oracle's ``want``."""
    try:
        res = db.sql(q.rt, access=path)
        if q.star:  # documents as stored (arrow() gives columns of their top-level fields)
            got = arrow = documents(res.rows())
        else:
            got = result_rows(res.rows(), q.ordered)
            arrow = result_rows(res.arrow().to_pylist(), q.ordered)
    except rtindex.SqlError as e:
        if isinstance(want, Exception):
            return Outcome("correct")
        msg = str(e)
        kind_ = "error" if INTERNAL.search(msg) else "refused"
        return Outcome(kind_, f"{type(e).__name__}: {cause_text(msg)}", got=msg)
    except Exception as e:  # noqa: BLE001 - anything else is the error the benchmark counts
        return Outcome("error", f"{type(e).__name__}: {cause_text(str(e))}", got=repr(e))
    if isinstance(want, Exception):
        return Outcome("wrong", f"{q.kind}: rtindex answers where DuckDB fails ({cause_text(str(want))})",
                       got=got, want=str(want))
    if got != arrow:
        return Outcome("wrong", f"{q.kind}: rows() differs from arrow()", got=got, want=arrow)
    if got != want:
        return Outcome("wrong", f"{q.kind}: {difference(got, want)}", got=got, want=want)
    return Outcome("correct", access=res.access)


def difference(got: list[tuple], want: list[tuple]) -> str:
    """What kind of difference two answers have (a cause's name, not its detail)."""
    strip = lambda rows: sorted((tuple(v for _, v in r) for r in rows), key=repr)
    if strip(got) == strip(want):
        return "same values, other types" if sorted(got, key=repr) != sorted(want, key=repr) else "other order"
    return "other rows" if len(got) == len(want) else "other number of rows"


def cause_text(msg: str) -> str:
    """An error message without its particulars (literals, numbers, positions)."""
    msg = msg.splitlines()[0] if msg else msg
    msg = re.sub(r"'[^']*'", "'…'", msg)
    msg = re.sub(r"\d+", "N", msg)
    return msg[:160]


class Collections:
    """A database of collections of given documents (fresh ones for repros)."""

    def __init__(self, root: str):
        self.db = rtindex.open(root)
        self.n = 0

    def load(self, name: str, docs: list[dict]) -> None:
        coll = self.db.create_collection(name, shards=2)
        half = len(docs) // 2
        coll.ingest(docs[:half], errors="raise")
        coll.flush()  # half in sealed segments, half in the in-memory tail
        if docs[half:]:
            coll.ingest(docs[half:], errors="raise")

    def fresh(self, docs: list[dict]) -> str:
        self.n += 1
        name = f"repro{self.n}"
        self.load(name, docs)
        return name

    def close(self) -> None:
        self.db.close()


def project(doc: dict, paths: list[tuple[str, ...]]) -> dict:
    """``doc`` with only its ``_id`` and what ``paths`` reach (or the non-object that stops
    them: ``o`` null keeps ``o.x`` missing rather than absent), copied."""
    out: dict = {"_id": doc["_id"]}
    for p in paths:
        src, dst = doc, out
        for i, name in enumerate(p):
            if not isinstance(src, dict) or name not in src or not isinstance(dst, dict):
                break
            if i == len(p) - 1 or not isinstance(src[name], dict):
                dst[name] = json.loads(json.dumps(src[name]))
                break
            dst = dst.setdefault(name, {})
            src = src[name]
    return out


def still_fails(store: Collections, docs: list[dict], q: Query, table: str, path: str | None,
                paths: list[tuple[str, ...]], first: Outcome) -> Outcome | None:
    """The outcome of ``q`` over ``docs`` in a fresh collection, if it is still the kind of
    ``first`` (for a path-dependent refusal: refused on ``path``, correct on another)."""
    if not docs:
        return None
    name = store.fresh(docs)
    qq = replace(q, rt=re.sub(rf"\b{re.escape(table)}\b", name, q.rt))
    oracle = Oracle(Catalog(docs, paths))
    try:
        want = oracle_answer(oracle, qq)
        out = rtindex_outcome(store.db, qq, path, want)
        if first.cause.startswith(PATH_DEPENDENT):
            others = [rtindex_outcome(store.db, qq, p, want).kind for p in PATHS if p != path]
            return first if out.kind == "refused" and "correct" in others else None
    finally:
        oracle.close()
    return out if out.kind == first.kind else None


def shrink(store: Collections, docs: list[dict], q: Query, table: str, path: str | None,
           paths: list[tuple[str, ...]], first: Outcome, budget: int = 60) -> tuple[list[dict], Outcome]:
    """Fewer documents (delta debugging) and fewer fields that give the same kind of outcome."""
    used = [p for p in paths if re.search(rf"(?<![\w.])(?:[ab]\.)?{re.escape('.'.join(p))}(?![\w.])", q.rt)]
    best, out = docs, first
    trimmed = [project(d, used) for d in docs]
    got = still_fails(store, trimmed, q, table, path, paths, first)
    if got:
        best, out = trimmed, got
    chunks = 2
    while len(best) > 1 and budget > 0:
        size = math.ceil(len(best) / chunks)
        for i in range(0, len(best), size):
            budget -= 1
            rest = best[:i] + best[i + size:]
            got = still_fails(store, rest, q, table, path, paths, first)
            if got:
                best, out = rest, got
                chunks = max(chunks - 1, 2)
                break
            if budget <= 0:
                break
        else:
            if size == 1:
                break
            chunks = min(len(best), chunks * 2)
    return best, out


@dataclass
class Tally:
    runs: collections.Counter = field(default_factory=collections.Counter)  # outcome -> runs
    queries: int = 0
    queries_correct: int = 0
    ran: collections.Counter = field(default_factory=collections.Counter)  # (forced path, it ran) -> runs
    informative: int = 0  # queries whose oracle answer holds a value other than 0 and NULL
    causes: dict = field(default_factory=dict)  # (outcome, cause) -> [count, example]


def check_dataset(store: Collections, name: str, docs: list[dict], n_queries: int, rng: random.Random,
                  tally: Tally, per_set: Tally) -> None:
    t0 = time.perf_counter()
    store.load(name, docs)
    catalog = Catalog(docs)
    oracle = Oracle(catalog)
    gen = Gen(catalog, name, rng)
    log(f"{name}: {len(docs):,} documents, {len(catalog.fields)} fields "
        f"({sum(1 for f in catalog.fields.values() if len(f.value_kinds) > 1)} of mixed types), "
        f"loaded in {time.perf_counter() - t0:.1f} s")
    for _ in range(n_queries):
        q = gen.query()
        want = oracle_answer(oracle, q)
        if isinstance(want, list) and any(isinstance(r, str) or any(v not in (None, 0) for _, v in r) for r in want):
            tally.informative += 1  # not an empty answer, nor only zeros and NULLs (a str: a document)
        tally.queries += 1
        per_set.queries += 1
        all_right = True
        outs = {path: rtindex_outcome(store.db, q, path, want) for path in PATHS}
        for path, out in outs.items():
            if out.kind == "refused" and any(o.kind == "correct" for o in outs.values()):
                # the dialect does not refuse what another access path answers
                out = Outcome("error", PATH_DEPENDENT + out.cause, out.got, out.want)
            for t in (tally, per_set):
                t.runs[out.kind] += 1
            if path and out.access:
                tally.ran[path, path in out.access] += 1
            if out.kind == "correct":
                continue
            all_right = False
            key = (out.kind, out.cause)
            if key not in tally.causes:
                tally.causes[key] = [0, {"dataset": name, "sql": q.rt, "path": path, "docs": docs, "query": q,
                                         "outcome": out, "paths": list(catalog.fields)}]
            tally.causes[key][0] += 1
        tally.queries_correct += all_right
        per_set.queries_correct += all_right
    oracle.close()
    log(f"{name}: {per_set.queries} queries, runs {dict(per_set.runs)} ({time.perf_counter() - t0:.1f} s)")


def pct(n: int, total: int) -> float | None:
    return round(100 * n / total, 2) if total else None


def report_causes(store: Collections, tally: Tally, max_repros: int) -> list[dict]:
    """Print each distinct cause of a run that was not correct; shrink wrong answers and errors."""
    out = []
    shrunk = 0
    for (kind_, cause), (count, ex) in sorted(tally.causes.items(), key=lambda kv: (kv[0][0], -kv[1][0])):
        log(f"\n[{kind_}] x{count}: {cause}\n  e.g. {ex['dataset']}, access={ex['path']}: {ex['sql']}")
        item = {"outcome": kind_, "cause": cause, "runs": count, "sql": ex["sql"], "access": ex["path"]}
        if kind_ == "refused":
            log(f"  message: {ex['outcome'].got}")
        if kind_ in ("wrong", "error") and shrunk < max_repros:
            shrunk += 1
            docs, o = shrink(store, ex["docs"], ex["query"], ex["dataset"], ex["path"], ex["paths"], ex["outcome"])
            log(f"  minimal repro ({len(docs)} documents): db.create_collection('t', shards=2).ingest(docs), "
                f"half flushed")
            log(f"  docs = {json.dumps(docs, ensure_ascii=False)[:3000]}")
            sql = re.sub(rf"\b{re.escape(ex['dataset'])}\b", "t", ex["sql"])
            log(f"  sql  = {sql}")
            log(f"  rtindex: {str(o.got)[:1500]}")
            log(f"  oracle:  {str(o.want)[:1500]}")
            item.update(repro_docs=docs, repro_sql=sql, rtindex=str(o.got), oracle=str(o.want))
        out.append(item)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", nargs="+", required=True, help="JSON / NDJSON files, one data set each")
    ap.add_argument("--quick", action="store_true", help="60 queries per data set instead of 300")
    ap.add_argument("--queries", type=int, help="queries per data set")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--no-mixed", action="store_true", help="skip the collection of all data sets together")
    ap.add_argument("--repros", type=int, default=12, help="distinct causes to shrink into minimal repros")
    ap.add_argument("--causes-json", help="also write every cause (and its repro) to this file")
    args = ap.parse_args(argv)
    n_queries = args.queries or (60 if args.quick else 300)
    rng = random.Random(args.seed)

    sets: dict[str, list[dict]] = {}
    for path in args.data:
        name = re.sub(r"[^A-Za-z0-9_]", "_", Path(path).name.split(".")[0])
        if not re.match(r"^[A-Za-z_]", name):
            name = "d_" + name
        sets[name] = load_documents(path)
    if len(sets) > 1 and not args.no_mixed:
        sets["mixed"] = [dict(d) for docs in sets.values() for d in docs]
    for docs in sets.values():
        for i, d in enumerate(docs):
            d.setdefault("_id", i)

    tally = Tally()
    per_set: dict[str, Tally] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rt_public_json_") as tmp:
        store = Collections(tmp + "/db")
        try:
            for name, docs in sets.items():
                per_set[name] = Tally()
                check_dataset(store, name, docs, n_queries, rng, tally, per_set[name])
            causes = report_causes(store, tally, args.repros)
        finally:
            store.close()

    total = sum(tally.runs.values())
    log(f"\n{'data set':<22}{'docs':>7}{'queries':>9}" + "".join(f"{k:>10}" for k in OUTCOMES))
    for name, t in per_set.items():
        n = sum(t.runs.values())
        log(f"{name:<22}{len(sets[name]):>7}{t.queries:>9}"
            + "".join(f"{pct(t.runs[k], n):>9}%" for k in OUTCOMES))
    log(f"{'all':<22}{sum(map(len, sets.values())):>7}{tally.queries:>9}"
        + "".join(f"{pct(tally.runs[k], total):>9}%" for k in OUTCOMES))
    if args.causes_json:
        Path(args.causes_json).write_text(json.dumps(causes, indent=1, ensure_ascii=False, default=str))
    out: dict[str, Any] = {
        "data_sets": len(sets), "documents": sum(map(len, sets.values())), "queries": tally.queries,
        "runs": total, **{k: tally.runs[k] for k in OUTCOMES},
        **{f"{k}_pct": pct(tally.runs[k], total) for k in OUTCOMES},
        "queries_correct_pct": pct(tally.queries_correct, tally.queries),
        "informative_answers_pct": pct(tally.informative, tally.queries),
        # a forced path runs when the query can use it (else rtindex takes the other one)
        **{f"forced_{p}_ran_pct": pct(tally.ran[p, True], tally.ran[p, True] + tally.ran[p, False])
           for p in ("index", "scan")},
        **{f"{name}_correct_pct": pct(t.runs["correct"], sum(t.runs.values())) for name, t in per_set.items()},
        "distinct_causes": len(tally.causes), "seed": args.seed, "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
