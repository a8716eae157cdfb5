"""Differential test of the SQL layer: rtindex against DuckDB on a native table.

Hypothesis generates documents (every field has one JSON type, or is null, or is missing)
and queries from rtindex's supported grammar (docs/sql.md). The documents are ingested into
a fresh rtindex collection (one to three batches with ``flush()`` between them, so rows live
in sealed and in in-memory segments; some replaced by a later version, some ingested and
then deleted) and the final ones loaded into a typed DuckDB table where null and missing
both become NULL. Every query runs on rtindex three times (default access path,
``access="index"``, ``access="scan"``) and once on DuckDB; the results must agree: in order
when ORDER BY orders totally, as multisets otherwise, and for LIMIT without ORDER BY as a
sub-multiset of the right size. Values compare with their types (an int is not a float),
floats with math.isclose.

Both sides convert results through Arrow, as rtindex does, and a HUGEINT (SUM of BIGINT)
is a 64-bit int on both (documented in docs/sql.md); no other difference is allowed for.

A failure prints the documents, the ingest/flush/delete steps, both SQL texts with their
parameters and both results. ``HYPOTHESIS_PROFILE=thorough`` runs 500 examples.
"""

from __future__ import annotations

import itertools
import math
from decimal import Decimal
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st


MISSING = object()  # a field left out of a document (unlike None: a JSON null)

MAX_DOCS = 30
STRINGS = ["", "a", "ab", "b", "ba", "B", "é", "😀", "a%b", "a'b", "1", "10", "-2", "1.5"]
LIKE_PREFIXES = ["", "a", "b", "B", "é", "😀", "1", "ab", "a'", "x"]  # no % or _ inside: a literal prefix

# field -> type; "o.x" and "o.s" live inside the object "o"
SCALARS = {"_id": "int", "i": "int", "f": "float", "s": "str", "b": "bool", "o.x": "int", "o.s": "str"}
NULLABLE = [f for f in SCALARS if f != "_id"] + ["tags"]

# rtindex's placement of NULLs in ORDER BY when the query names none: DuckDB's default (NULLS
# LAST in both directions), as DuckDB runs the ORDER BY; the DuckDB text always says it
RT_DEFAULT_NULLS = {"": " NULLS LAST", " ASC": " NULLS LAST", " DESC": " NULLS LAST"}
FLIPPED = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}

ARROW_SCHEMA = pa.schema([
    ("_id", pa.int64()), ("i", pa.int64()), ("f", pa.float64()), ("s", pa.string()),
    ("b", pa.bool_()), ("o.x", pa.int64()), ("o.s", pa.string()), ("tags", pa.list_(pa.string())),
])


def duck_col(name: str) -> str:
    return '"' + name + '"'


def get_path(doc: dict, path: str):
    """The value at a dotted path, None for null or missing (as the DuckDB table has it)."""
    cur = doc
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


# --------------------------------------------------------------------------- documents

PRESENCE = st.sampled_from(["value", "value", "value", None, MISSING])  # 3/5 a value


def maybe(draw, strategy):
    """A value (usually), JSON null, or MISSING."""
    how = draw(PRESENCE)
    return draw(strategy) if how == "value" else how


ID_VALUES = st.integers(-60, 60)  # dense enough that comparisons with _id hit documents
quarters = st.integers(-80, 80).map(lambda k: k * 0.25)  # exact in binary: sums are exact
strings = st.sampled_from(STRINGS)


def pool(draw, strategy):
    """Values of one field come from a few per example, so equal values (ties, groups,
    duplicates for COUNT DISTINCT) are common."""
    return st.sampled_from(draw(st.lists(strategy, min_size=1, max_size=8)))


class Pools:
    """Per example, the values each numeric field draws from."""

    def __init__(self, draw):
        self.i = pool(draw, st.integers(-50, 50))
        self.f = pool(draw, quarters)
        self.ox = pool(draw, st.integers(-50, 50))

    def __repr__(self) -> str:
        return "Pools()"


def document(draw, _id: int, pools: Pools) -> dict:
    d = {"_id": _id}
    for name, strat in (("i", pools.i), ("f", pools.f), ("s", strings), ("b", st.booleans())):
        v = maybe(draw, strat)
        if v is not MISSING:
            d[name] = v
    o = draw(st.sampled_from(["object", "object", "object", None, MISSING]))
    if o == "object":
        o = {}
        for name, strat in (("x", pools.ox), ("s", strings)):
            v = maybe(draw, strat)
            if v is not MISSING:
                o[name] = v
    if o is not MISSING:
        d["o"] = o
    tags = maybe(draw, st.lists(strings, max_size=3))
    if tags is not MISSING:
        d["tags"] = tags
    return d


# --------------------------------------------------------------------------- queries

def sql_literal(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, (int, float)):
        return repr(v)
    return "'" + v.replace("'", "''") + "'"


@dataclass
class Query:
    kind: str  # star | proj | agg | unnest
    rt: str  # rtindex text (on the example's collection)
    duck: str  # DuckDB text (on the native table t)
    rt_params: object = None  # dict (:name), list (?) or None
    duck_params: object = None
    ncols: int = 0  # output columns (0 for SELECT *)
    aliases: list = field(default_factory=list)  # output position -> expected name or None
    order: str = "none"  # none: multiset; total: in order; subset: LIMIT without ORDER BY
    duck_full: str = ""  # for order == "subset": the DuckDB text without LIMIT/OFFSET
    duck_full_params: object = None
    limit: int | None = None
    offset: int = 0

    def __repr__(self) -> str:
        return (f"Query(rt={self.rt!r}, rt_params={self.rt_params!r}, "
                f"duck={self.duck!r}, duck_params={self.duck_params!r})")


class Gen:
    """Draws one query, writing the rtindex text and the DuckDB text side by side."""

    def __init__(self, draw, pools):
        self.draw = draw
        self.pools = pools
        self.style = draw(st.sampled_from([None, None, "named", "positional"]))
        self.rt_params = {} if self.style == "named" else []
        self.duck_params = {} if self.style == "named" else []

    def lit(self, v) -> tuple[str, str]:
        """A value as a literal or (sometimes, in a query with parameters) a parameter."""
        if self.style is not None and self.draw(st.booleans()):
            if self.style == "named":
                name = f"p{len(self.rt_params)}"
                self.rt_params[name] = v
                self.duck_params[name] = v
                return ":" + name, "$" + name
            self.rt_params.append(v)
            self.duck_params.append(v)
            return "?", "?"
        text = sql_literal(v)
        return text, text

    def snapshot_params(self):
        """A copy of the parameters so far (None when there are none)."""
        if self.style is None or not self.duck_params:
            return None
        return dict(self.duck_params) if self.style == "named" else list(self.duck_params)

    def value(self, fld: str):
        """A value to compare ``fld`` with: often one the documents can hold; rarely NULL
        (a comparison with NULL is UNKNOWN on both sides)."""
        kind = SCALARS[fld] if fld in SCALARS else "str"
        draw = self.draw
        if not draw(st.integers(0, 24)):
            return None
        # the pools the documents' values come from, not the documents: so the shrinker can
        # drop documents without changing the queries
        pool = {"i": self.pools.i, "f": self.pools.f, "o.x": self.pools.ox}.get(fld)
        if pool is not None and draw(st.booleans()):
            v = draw(pool)
        elif kind == "int":
            v = draw(ID_VALUES if fld == "_id" else st.integers(-55, 55))
        elif kind == "float":
            v = draw(st.integers(-84, 84).map(lambda k: k * 0.25))
        elif kind == "str":
            v = draw(strings)
        else:
            v = draw(st.booleans())
        if kind in ("int", "float"):  # numbers compare across int and float
            how = draw(st.sampled_from(["same", "same", "float", "int", "half"]))
            if how == "float":
                v = float(v)
            elif how == "int":
                v = int(v)
            elif how == "half":
                v = v + 0.5
        return v

    def leaf(self) -> tuple[str, str]:
        draw = self.draw
        form = draw(st.sampled_from(["cmp", "cmp", "cmp", "in", "between", "null", "like", "contains"]))
        if form == "null":
            fld = draw(st.sampled_from(NULLABLE))
            neg = " NOT" if draw(st.booleans()) else ""
            return f"{fld} IS{neg} NULL", f"{duck_col(fld)} IS{neg} NULL"
        if form == "like":
            fld = draw(st.sampled_from(["s", "o.s"]))
            if draw(st.booleans()):
                pat = draw(st.sampled_from(LIKE_PREFIXES)) + "%"
            else:
                pat = draw(st.sampled_from([x for x in STRINGS if "%" not in x and "_" not in x]))
            p = sql_literal(pat)
            return f"{fld} LIKE {p}", f"{duck_col(fld)} LIKE {p}"
        if form == "contains":
            r, d = self.lit(self.value("tags"))
            return f"ARRAY_CONTAINS(tags, {r})", f"list_contains({duck_col('tags')}, {d})"
        fld = draw(st.sampled_from(list(SCALARS)))
        c = duck_col(fld)
        if form == "cmp":
            op = draw(st.sampled_from(["=", "<>", "<", "<=", ">", ">="]))
            r, d = self.lit(self.value(fld))
            if draw(st.integers(0, 2)):
                return f"{fld} {op} {r}", f"{c} {op} {d}"
            flipped = FLIPPED[op]  # the value on the left: 5 > i is i < 5
            return f"{r} {flipped} {fld}", f"{d} {flipped} {c}"
        if form == "in":
            vals = [self.lit(self.value(fld)) for _ in range(draw(st.integers(1, 4)))]
            return (f"{fld} IN ({', '.join(r for r, _ in vals)})",
                    f"{c} IN ({', '.join(d for _, d in vals)})")
        lo, hi = self.value(fld), self.value(fld)
        if lo is not None and hi is not None and draw(st.integers(0, 3)):
            lo, hi = sorted([lo, hi])  # mostly lo <= hi; sometimes either way
        (rl, dl), (rh, dh) = self.lit(lo), self.lit(hi)
        return f"{fld} BETWEEN {rl} AND {rh}", f"{c} BETWEEN {dl} AND {dh}"

    def pred(self, depth: int) -> tuple[str, str]:
        draw = self.draw
        form = draw(st.sampled_from(["leaf", "and", "or", "or", "not"])) if depth > 0 else "leaf"
        if form == "leaf":
            r, d = self.leaf()
            if not draw(st.integers(0, 3)):  # redundant parentheses are allowed anywhere
                r, d = f"({r})", f"({d})"
            return r, d
        if form == "not":
            r, d = self.pred(depth - 1)
            return f"NOT ({r})", f"NOT ({d})"
        (r1, d1), (r2, d2) = self.pred(depth - 1), self.pred(depth - 1)
        op = form.upper()
        return f"({r1} {op} {r2})", f"({d1} {op} {d2})"

    def where(self) -> tuple[str, str]:
        if not self.draw(st.integers(0, 5)):
            return "", ""
        r, d = self.pred(self.draw(st.integers(0, 3)))
        return f" WHERE {r}", f" WHERE {d}"

    def limit(self) -> tuple[str, str, int | None, int]:
        """(rtindex text, DuckDB text, limit, offset); either may be a parameter."""
        draw = self.draw
        n = draw(st.integers(0, 12))
        off = draw(st.sampled_from([0, 0, 1, 3, 10]))
        (rn, dn) = self.lit(n)
        r, d = f" LIMIT {rn}", f" LIMIT {dn}"
        if off:
            (ro, do) = self.lit(off)
            r, d = r + f" OFFSET {ro}", d + f" OFFSET {do}"
        return r, d, n, off

    def order_by(self, keys: list[str]) -> tuple[str, str]:
        """ORDER BY over ``keys`` (fields), each with a direction and maybe NULLS FIRST/LAST;
        the DuckDB text always names the NULLS placement (RT_DEFAULT_NULLS when rtindex's
        does not)."""
        rs, ds = [], []
        for key in keys:
            direction = self.draw(st.sampled_from(["", " ASC", " DESC"]))
            nulls = self.draw(st.sampled_from(["", "", " NULLS FIRST", " NULLS LAST"]))
            rs.append(f"{key}{direction}{nulls}")
            ds.append(f"{duck_col(key)}{direction}{nulls or RT_DEFAULT_NULLS[direction]}")
        return " ORDER BY " + ", ".join(rs), " ORDER BY " + ", ".join(ds)


PROJ = [  # (rtindex, DuckDB, alias that may be given)
    ("_id", '"_id"', "id2"), ("i", '"i"', "ii"), ("f", '"f"', "ff"), ("s", '"s"', "ss"),
    ("b", '"b"', "bb"), ("o.x", '"o.x"', "ox"), ("o.s", '"o.s"', "os"), ("tags", '"tags"', "tg"),
    ("i + 1", '"i" + 1', "j"), ("CAST(i AS DOUBLE)", 'CAST("i" AS DOUBLE)', "di"),
    ("TRY_CAST(s AS BIGINT)", 'TRY_CAST("s" AS BIGINT)', "si"),
]
AGGS = [  # (rtindex, DuckDB)
    ("COUNT(*)", "COUNT(*)"), ("COUNT(i)", 'COUNT("i")'), ("COUNT(DISTINCT s)", 'COUNT(DISTINCT "s")'),
    ("SUM(i)", 'SUM("i")'), ("AVG(f)", 'AVG("f")'), ("MIN(s)", 'MIN("s")'), ("MAX(i)", 'MAX("i")'),
    ("COUNT(o.x)", 'COUNT("o.x")'), ("SUM(f)", 'SUM("f")'), ("AVG(i)", 'AVG("i")'),
    ("MIN(i)", 'MIN("i")'), ("MAX(s)", 'MAX("s")'), ("MIN(f)", 'MIN("f")'), ("MAX(o.s)", 'MAX("o.s")'),
    ("COUNT(DISTINCT o.s)", 'COUNT(DISTINCT "o.s")'), ("COUNT(DISTINCT i)", 'COUNT(DISTINCT "i")'),
    ("COUNT(b)", 'COUNT("b")'), ("SUM(o.x)", 'SUM("o.x")'), ("MAX(f)", 'MAX("f")'), ("MIN(_id)", 'MIN("_id")'),
    ("COUNT(tags)", 'COUNT("tags")'),
]
GROUP_KEYS = ["s", "b", "o.s", "i"]
ORDER_FIELDS = ["i", "f", "s", "b", "o.x", "o.s"]  # nullable: with _id last, a total order


@st.composite
def queries(draw, pools, table: str = "t"):
    """One Query: SELECT *, a projection, aggregates (maybe grouped) or UNNEST."""
    g = Gen(draw, pools)
    kind = draw(st.sampled_from(["star", "proj", "proj", "agg", "agg", "unnest"]))
    wr, wd = g.where()
    q = Query(kind=kind, rt="", duck="")
    if kind in ("star", "proj"):
        if kind == "star":
            sel_r, sel_d = "*", '"_id"'
        else:
            items = draw(st.lists(st.sampled_from(PROJ), min_size=1, max_size=4, unique=True))
            rs, ds = [], []
            for r, d, alias in items:
                if draw(st.booleans()):
                    rs.append(f"{r} AS {alias}")
                    ds.append(f"{d} AS {alias}")
                    q.aliases.append(alias)
                else:
                    rs.append(r)
                    ds.append(d)
                    q.aliases.append(r if r in SCALARS and "." not in r or r == "tags" else None)
            sel_r, sel_d = ", ".join(rs), ", ".join(ds)
            q.ncols = len(items)
        base_r = f"SELECT {sel_r} FROM {table}{wr}"
        base_d = f"SELECT {sel_d} FROM t{wd}"
        mode = draw(st.sampled_from(["none", "order", "order", "limit"]))
        if mode == "none":
            q.rt, q.duck = base_r, base_d
        elif mode == "order":
            keys = draw(st.lists(st.sampled_from(ORDER_FIELDS), max_size=2, unique=True)) + ["_id"]
            ord_r, ord_d = g.order_by(keys)
            lim_r, lim_d, q.limit, q.offset = g.limit() if draw(st.booleans()) else ("", "", None, 0)
            q.rt, q.duck = base_r + ord_r + lim_r, base_d + ord_d + lim_d
            q.order = "total"
        else:
            before = g.snapshot_params()  # the text without LIMIT/OFFSET binds these
            lim_r, lim_d, q.limit, q.offset = g.limit()
            q.rt, q.duck, q.duck_full, q.order = base_r + lim_r, base_d + lim_d, base_d, "subset"
            q.duck_full_params = before
    elif kind == "agg":
        key = draw(st.sampled_from([None, *GROUP_KEYS]))
        aggs = draw(st.lists(st.sampled_from(AGGS), min_size=1, max_size=3, unique=True))
        rs = [r for r, _ in aggs]
        ds = [d for _, d in aggs]
        q.aliases = [None] * len(aggs)
        if key is not None:
            at = draw(st.integers(0, len(aggs)))
            rs.insert(at, key)
            ds.insert(at, duck_col(key))
            q.aliases.insert(at, None)
        q.ncols = len(rs)
        q.rt = f"SELECT {', '.join(rs)} FROM {table}{wr}"
        q.duck = f"SELECT {', '.join(ds)} FROM t{wd}"
        if key is not None:
            q.rt += f" GROUP BY {key}"
            q.duck += f" GROUP BY {duck_col(key)}"
        if draw(st.integers(0, 3 if key is None else 1)) == 0:
            k = draw(st.integers(0, 3))
            q.rt += f" HAVING COUNT(*) > {k}"
            q.duck += f" HAVING COUNT(*) > {k}"
        if key is not None and draw(st.booleans()):  # the key is unique per group: a total order
            ord_r, ord_d = g.order_by([key])
            lim_r, lim_d, q.limit, q.offset = g.limit() if draw(st.booleans()) else ("", "", None, 0)
            q.rt += ord_r + lim_r
            q.duck += ord_d + lim_d
            q.order = "total"
    else:  # unnest
        q.rt = f"SELECT UNNEST(tags) AS tag, _id FROM {table}{wr}"
        q.duck = f"SELECT UNNEST(\"tags\") AS tag, \"_id\" FROM t{wd}"
        q.ncols = 2
        q.aliases = ["tag", "_id"]
    if g.style is not None and g.rt_params:
        q.rt_params, q.duck_params = g.rt_params, g.duck_params
    return q


@dataclass
class Scenario:
    docs: list  # what the collection holds in the end (and the DuckDB table)
    steps: list  # ("ingest", [docs]) / ("delete", [ids]) / ("flush",), in order
    queries: list


@st.composite
def placed_documents(draw, pools: Pools, n_batches: int):
    """(the batch it is ingested in, a document)."""
    return draw(st.integers(0, n_batches - 1)), document(draw, draw(ID_VALUES), pools)


@st.composite
def scenarios(draw, table: str = "t"):
    """Final documents, and how they get there: 1-3 ingest batches with flush() between them
    (sealed and in-memory segments); an _id drawn twice is a replacement (the version
    ingested last is the final one, whether in the same batch or a later one); sometimes
    documents ingested and then deleted."""
    pools = Pools(draw)
    n_batches = draw(st.sampled_from([1, 2, 2, 3, 3]))
    # at least min_size documents (hypothesis' lists and integers favour short ones and 0);
    # one list element per document shrinks well
    min_size = draw(st.sampled_from(range(MAX_DOCS + 1)))
    placed = draw(st.lists(placed_documents(pools, n_batches), min_size=min_size, max_size=MAX_DOCS))
    batches = [[] for _ in range(n_batches)]
    deletes = [[] for _ in range(n_batches)]  # ids deleted after batch k is ingested
    for k, d in placed:
        batches[k].append(d)
    final = {d["_id"]: d for batch in batches for d in batch}  # the last version ingested
    for g in range(draw(st.sampled_from([0, 0, 0, 1, 3]))):  # ghosts: in, then deleted
        k = draw(st.integers(0, n_batches - 1))
        batches[k].append(document(draw, 2000 + g, pools))
        deletes[draw(st.integers(k, n_batches - 1))].append(2000 + g)
    qs = draw(st.lists(queries(pools, table), min_size=1, max_size=6))
    steps = []
    for k in range(n_batches):
        if batches[k]:
            steps.append(("ingest", batches[k]))
        if deletes[k]:
            steps.append(("delete", deletes[k]))
        if k < n_batches - 1:
            steps.append(("flush",))
    return Scenario(list(final.values()), steps, qs)


# --------------------------------------------------------------------------- comparison

def same(a, b) -> bool:
    """Equal values of the same type (ints and floats are different types); floats close."""
    if a is None or b is None:
        return a is None and b is None
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def sort_key(v):
    if v is None:
        return (0, "", 0)
    if isinstance(v, bool):
        return (1, "bool", v)
    if isinstance(v, (int, float, Decimal)):
        return (1, "num", round(float(v), 6))
    if isinstance(v, str):
        return (1, "str", v)
    if isinstance(v, (list, tuple)):
        return (1, "list", tuple(sort_key(x) for x in v))
    if isinstance(v, dict):
        return (1, "dict", tuple(sorted((k, sort_key(x)) for k, x in v.items())))
    return (1, type(v).__name__, repr(v))


def row_key(row):
    return tuple(sort_key(v) for v in row)


def same_rows(a: list, b: list) -> bool:
    return len(a) == len(b) and all(same(tuple(x), tuple(y)) for x, y in zip(a, b))


def sub_multiset(small: list, big: list) -> bool:
    left = list(big)
    for row in small:
        for k, cand in enumerate(left):
            if same(tuple(row), tuple(cand)):
                del left[k]
                break
        else:
            return False
    return True


def load_duckdb(con, docs: list) -> None:
    cols = {name: [get_path(d, name) for d in docs] for name in ARROW_SCHEMA.names}
    con.register("native_docs", pa.table(cols, schema=ARROW_SCHEMA))
    try:
        con.execute("CREATE OR REPLACE TABLE t AS SELECT * FROM native_docs")
    finally:
        con.unregister("native_docs")


def run_duck(con, sql: str, params) -> list:
    """Rows as tuples, converted through Arrow as rtindex converts DuckDB's results (SUM of
    BIGINT, a HUGEINT, is an int64 on both sides: docs/sql.md)."""
    relation = con.sql(sql, params=params)
    huge = [str(t) == "HUGEINT" for t in relation.types]
    table = relation.to_arrow_table()
    return list(zip(*((col.cast(pa.int64()) if h else col).to_pylist() for col, h in zip(table.columns, huge))))


def check(scn: Scenario, q: Query, got_rows: list, access: str, con, docs_by_id: dict) -> None:
    """got_rows: rtindex res.rows(); raises AssertionError with the whole story."""
    want = run_duck(con, q.duck, q.duck_params)
    full = run_duck(con, q.duck_full, q.duck_full_params) if q.order == "subset" else None

    def fail(why: str):
        raise AssertionError(
            f"{why}\n  access={access}\n  rtindex: {q.rt}  params={q.rt_params!r}\n"
            f"  duckdb:  {q.duck}  params={q.duck_params!r}\n  rtindex rows: {got_rows!r}\n"
            f"  duckdb rows:  {want!r}\n  documents: {scn.docs!r}\n  steps: {scn.steps!r}")

    if q.kind == "star":
        got = []
        for row in got_rows:
            row = dict(row)
            if "_event_time" not in row:
                fail("SELECT * row without _event_time")
            del row["_event_time"]
            doc = docs_by_id.get(row.get("_id"))
            if doc is None or not same(row, doc):
                fail(f"SELECT * row {row!r} is not the ingested document {doc!r}")
            got.append((row["_id"],))
    else:
        got = []
        for row in got_rows:
            if len(row) != q.ncols:
                fail(f"row has {len(row)} columns, expected {q.ncols}: {list(row)}")
            for name, want_name in zip(row, q.aliases):
                if want_name is not None and name != want_name:
                    fail(f"output column named {name!r}, expected {want_name!r}")
            got.append(tuple(row.values()))
    if q.order == "total":
        if not same_rows(got, want):
            fail("rows differ (in order)")
    elif q.order == "subset":
        n = max(0, min(q.limit, len(full) - q.offset))
        if len(got) != n or not sub_multiset(got, full):
            fail(f"LIMIT without ORDER BY: expected {n} rows out of {full!r}")
    elif not same_rows(sorted(got, key=row_key), sorted(want, key=row_key)):
        fail("rows differ (as multisets)")


# --------------------------------------------------------------------------- tests

# Each example ingests a collection and runs up to six queries four times: at least 150
# examples (about 20 s), more under a profile that asks for more (HYPOTHESIS_PROFILE=thorough).
SETTINGS = settings(max_examples=max(150, settings.default.max_examples), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def duck():
    con = duckdb.connect()
    yield con
    con.close()


@SETTINGS
@given(scn=scenarios())
def test_generated_queries_are_valid_duckdb(duck, scn):
    """The generator only writes SQL that DuckDB runs on the native table."""
    load_duckdb(duck, scn.docs)
    for q in scn.queries:
        run_duck(duck, q.duck, q.duck_params)
        if q.duck_full:
            run_duck(duck, q.duck_full, q.duck_full_params)


_counter = itertools.count()


@SETTINGS
@given(data=st.data())
def test_sql_matches_duckdb(db, duck, data):
    """Every generated query gives DuckDB's answer, on every access path. One database (the
    ``db`` fixture) per test, a new collection per example, dropped after it."""
    name = f"t{next(_counter)}"
    scn = data.draw(scenarios(name), label="scenario")
    load_duckdb(duck, scn.docs)
    docs_by_id = {d["_id"]: d for d in scn.docs}
    c = db.create_collection(name, shards=2)
    try:
        for step in scn.steps:
            if step[0] == "ingest":
                stats = c.ingest(step[1])
                assert not stats.errors, stats.errors
            elif step[0] == "delete":
                assert all(c.delete(_id) for _id in step[1])
            else:
                c.flush()
        assert len(c) == len(scn.docs)
        event(f"documents: {min(len(scn.docs), 20) // 10 * 10}+")
        for step in {s[0] for s in scn.steps}:
            event(f"scenario has {step}")
        if sum(len(s[1]) for s in scn.steps if s[0] == "ingest") > len(scn.docs) + sum(
                len(s[1]) for s in scn.steps if s[0] == "delete"):
            event("scenario replaces documents")
        for q in scn.queries:
            for access in (None, "index", "scan"):
                kw = {} if access is None else {"access": access}
                res = db.sql(q.rt, q.rt_params, **kw)
                event(f"{q.kind}: access={access} ran {res.access}")
                rows = res.rows()
                check(scn, q, rows, f"{access} (ran {res.access})", duck, docs_by_id)
                if q.kind != "star":  # (SELECT * as Arrow has a column per top-level field)
                    assert same(res.arrow().to_pylist(), rows), (q, res.arrow(), rows)
    finally:
        db.drop_collection(name)
