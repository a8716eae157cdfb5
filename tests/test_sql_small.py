"""Aggregates in numpy and Arrow compute (rtindex/sql/small.py) against DuckDB on the same frame.

Hypothesis generates frames (BIGINT, DOUBLE, VARCHAR and BOOLEAN columns with nulls) and
aggregate queries of the shape small.py takes (and some it must refuse); each one small.py
computes must equal what the SQL layer's DuckDB engine returns for the same text: the same
column names and Arrow types, the same rows (floats within rounding; in the ORDER BY's order
where it orders totally, else as a multiset), and the same LIMIT/OFFSET slice.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import rtindex
from rtindex.sql import small
from rtindex.duck import DuckEngine

TYPES = {"f0": pa.int64(), "f1": pa.float64(), "f2": pa.string(), "f3": pa.bool_(), "f4": pa.int64()}
NUMERIC = ["f0", "f1", "f4"]


@pytest.fixture(scope="module")
def duck():
    engine = DuckEngine()
    yield engine
    engine.close()


def frames(n_max: int = 40):
    ints = st.one_of(st.none(), st.integers(-5, 5), st.integers(-(2**40), 2**40),
                     st.sampled_from([2**62, -(2**62), 2**63 - 1, -(2**63)]))  # sums past 64 bits: left to DuckDB
    floats = st.one_of(st.none(), st.sampled_from([0.0, -1.5, 2.25, 1e10, -0.0]),
                       st.sampled_from([math.nan, math.inf, -math.inf]))
    texts = st.one_of(st.none(), st.sampled_from(["", "a", "b", "é"]))
    rows = st.tuples(ints, floats, texts, st.one_of(st.none(), st.booleans()), st.integers(0, 3))
    return st.lists(rows, max_size=n_max).map(
        lambda rs: {name: pa.array([r[i] for r in rs], type=t) for i, (name, t) in enumerate(TYPES.items())})


@st.composite
def aggregate(draw):
    fn = draw(st.sampled_from(["COUNT", "SUM", "AVG", "MIN", "MAX"]))
    if fn == "COUNT" and draw(st.booleans()):
        return "COUNT(*)"
    col = draw(st.sampled_from(NUMERIC + (["f2", "f3"] if fn in ("COUNT", "MIN", "MAX") else [])))
    arg = f'"{col}"'
    if col in NUMERIC and draw(st.booleans()):
        arg = f"CAST({arg} AS {draw(st.sampled_from(['REAL', 'DOUBLE', 'BIGINT']))})"
    return f"{fn}({arg})"


@st.composite
def expression(draw, depth=0):
    if depth >= 2 or draw(st.booleans()):
        return draw(aggregate())
    op = draw(st.sampled_from(["+", "-", "*", "/"]))
    right = draw(st.one_of(expression(depth + 1), st.sampled_from(["1", "2", "0", "1.0", "0.5"])))
    left = draw(expression(depth + 1))
    if draw(st.booleans()):
        left, right = right, left
    text = f"{left} {op} {right}"
    return f"({text})" if draw(st.booleans()) else f"-({text})" if draw(st.booleans()) else text


@st.composite
def queries(draw):
    keys = draw(st.lists(st.sampled_from(["f0", "f1", "f2", "f3", "f4"]), max_size=2, unique=True))
    outs = [(f'"{k}"', f"k{i}") for i, k in enumerate(keys)]
    outs += [(draw(expression()), f"e{i}") for i in range(draw(st.integers(1, 3)))]
    select = ", ".join(f'{e} AS "{a}"' for e, a in outs)
    sql = f'SELECT {select} FROM "frame"'
    if keys:
        sql += " GROUP BY " + ", ".join(f'"{k}"' for k in keys)
    order = draw(st.lists(st.sampled_from([a for _, a in outs]), max_size=2, unique=True))
    if order:
        sql += " ORDER BY " + ", ".join(
            f"{a} {draw(st.sampled_from(['', 'ASC', 'DESC']))} {draw(st.sampled_from(['', 'NULLS FIRST', 'NULLS LAST']))}"
            for a in order)
    limit = draw(st.one_of(st.none(), st.integers(0, 5)))
    offset = draw(st.integers(0, 2))
    return sql, [a for _, a in outs], keys, order, limit, offset


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    return a == b and type(a) is type(b)


def _identical(a: list[dict], b: list[dict]) -> bool:
    """Equal rows, NaN equal to NaN."""
    def same(x, y):
        return (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)) or x == y
    return len(a) == len(b) and all(r.keys() == q.keys() and all(same(r[k], q[k]) for k in r) for r, q in zip(a, b))


def _rows_match(got: list[tuple], want: list[tuple]) -> bool:
    remaining = list(want)
    for row in got:
        for i, other in enumerate(remaining):
            if all(_same(x, y) for x, y in zip(row, other)):
                del remaining[i]
                break
        else:
            return False
    return not remaining


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame=frames(), query=queries())
def test_arrow_aggregates_equal_duckdb(duck, frame, query):
    sql, names, keys, order, limit, offset = query
    plan = small.compile_plan(sql)
    if plan is None:
        event("a shape small.py leaves to DuckDB")
        return
    n = len(frame["f0"])
    got = plan.run({c: frame[c] for c in plan.columns}, n, limit, offset)
    if got is None:
        event("values small.py leaves to DuckDB")
        return
    event("computed in Arrow")
    tail = (f" LIMIT {limit}" if limit is not None else "") + (f" OFFSET {offset}" if offset else "")
    try:
        want = duck.run(sql + tail, {"frame": pa.table(frame)})
    except rtindex.SqlError as e:  # e.g. a 128-bit sum that does not fit 64 bits
        pytest.fail(f"small.py answered where DuckDB fails ({e}): {sql}")
    assert got.column_names == want.column_names == names, sql
    assert got.schema.types == want.schema.types, (sql, got.schema, want.schema)
    got_rows = list(zip(*(c.to_pylist() for c in got.columns)))
    want_rows = list(zip(*(c.to_pylist() for c in want.columns)))
    assert len(got_rows) == len(want_rows), (sql, got_rows, want_rows)
    if limit is not None or offset:  # ties (and a LIMIT or OFFSET over them) may select other rows than DuckDB's
        whole = plan.run({c: frame[c] for c in plan.columns}, n, None, 0)  # but the same as a slice of all
        part = whole.slice(offset, limit)
        assert got.schema == part.schema and _identical(got.to_pylist(), part.to_pylist()), (sql, got, whole)
        return
    assert _rows_match(got_rows, want_rows), (sql, got_rows, want_rows)
    if order:  # in the ORDER BY's order: its values row by row (ties may order the rest otherwise)
        idx = [names.index(o) for o in order]
        assert all(_same(g[i], w[i]) for g, w in zip(got_rows, want_rows) for i in idx), (sql, got_rows, want_rows)


@pytest.mark.parametrize("sql", [
    'SELECT COUNT(DISTINCT "f0") AS "n" FROM "frame"',
    'SELECT "f0" AS "a" FROM "frame"',  # no aggregate
    'SELECT SUM("f0") AS "s" FROM "frame" WHERE "f1" > 0',
    'SELECT SUM("f0") AS "s" FROM "frame" HAVING SUM("f0") > 1',
    'SELECT "f0" AS "k", SUM("f1") AS "s" FROM "frame" GROUP BY ALL',
    'SELECT SUM(TRY_CAST("f2" AS BIGINT)) AS "s" FROM "frame"',
    'SELECT SUM("f0") AS "s" FROM "frame" ORDER BY "f1"',
    'SELECT SUM("f0" + 1) AS "s" FROM "frame"',
])
def test_other_shapes_are_left_to_duckdb(sql):
    assert small.compile_plan(sql) is None


def test_constant_outputs_are_left_to_duckdb():
    for sql in ('SELECT 65 AS "c" FROM "frame" GROUP BY "f0"', 'SELECT -(65) AS "x", COUNT(*) AS "n" FROM "frame" GROUP BY "f0"'):
        plan = small.compile_plan(sql)
        assert plan is None or plan.run({"f0": pa.array([1, 2])}, 2, None, 0) is None


def test_sums_that_could_pass_64_bits_and_nan_orders_are_left_to_duckdb():
    big = pa.array([2**62, 2**62], type=pa.int64())
    plan = small.compile_plan('SELECT SUM("f0") AS "s" FROM "frame"')
    assert plan.run({"f0": big}, 2, None, 0) is None
    nan = small.compile_plan('SELECT "f4" AS "k", SUM("f1") / SUM("f1") AS "r" FROM "frame" GROUP BY "f4" ORDER BY 2')
    assert nan.run({"f1": pa.array([0.0, 1.0]), "f4": pa.array([1, 2])}, 2, None, 0) is None
    assert nan.run({"f1": pa.array([2.0, 1.0]), "f4": pa.array([1, 2])}, 2, None, 0).to_pylist() == [
        {"k": 1, "r": 1.0}, {"k": 2, "r": 1.0}]
    # an int beside a decimal literal is a DECIMAL in DuckDB; beside a DOUBLE it is a DOUBLE
    decimal = small.compile_plan('SELECT SUM("f0") + 1.0 AS "s" FROM "frame"')
    assert decimal.run({"f0": pa.array([1, 2])}, 2, None, 0) is None
    assert decimal.run({"f0": pa.array([1.5, 2.0])}, 2, None, 0).to_pylist() == [{"s": 4.5}]


def test_the_index_path_aggregates_a_few_matched_rows_without_duckdb(tmp_path):
    with rtindex.open(str(tmp_path / "db")) as db:
        c = db.create_collection("clicks", shards=2)
        rng = np.random.default_rng(0)
        c.ingest([{"_id": i, "city": f"c{i % 50}", "product": int(rng.integers(0, 20)),
                   "clicks": int(rng.integers(0, 9)), "views": int(rng.integers(1, 99))} for i in range(5000)])
        sql = ("SELECT product, SUM(CAST(clicks AS FLOAT)) / (SUM(CAST(views AS FLOAT)) + 1.0) AS ctr "
               "FROM clicks WHERE city = :c GROUP BY product ORDER BY ctr DESC, product LIMIT 5")
        plan = db.explain(sql, {"c": "c7"})
        assert plan.access == "index" and plan.arrow and "aggregated with numpy and Arrow compute" in str(plan)
        fast = db.sql(sql, {"c": "c7"})
        assert fast.plan.arrow and db._sql._duck is None
        slow = db.sql(sql, {"c": "c7"}, access="scan")  # DuckDB over the column scan
        assert not slow.plan.arrow
        assert fast.arrow().schema == slow.arrow().schema
        assert [r["product"] for r in fast.rows()] == [r["product"] for r in slow.rows()]
        assert all(math.isclose(a["ctr"], b["ctr"], rel_tol=1e-9) for a, b in zip(fast.rows(), slow.rows()))


@settings(max_examples=300, deadline=None)
@given(values=st.one_of(st.lists(st.integers(-3, 3), min_size=2, max_size=60).map(lambda v: np.array(v, dtype=np.int64)),
                        st.lists(st.sampled_from([0.0, -0.0, 1.5, -2.0, math.inf, -math.inf]), min_size=2,
                                 max_size=60).map(lambda v: np.array(v, dtype=np.float64))),
       descending=st.booleans(), data=st.data())
def test_top_rows_are_the_head_of_a_stable_sort(values, descending, data):
    """ORDER BY one number LIMIT k picks the first k of Arrow's stable sort, ties in row order."""
    k = data.draw(st.integers(1, len(values) - 1))
    want = pc.sort_indices(pa.array(values), sort_keys=[("", "descending" if descending else "ascending")])
    assert small._top(values, descending, k).tolist() == want.to_pylist()[:k]
