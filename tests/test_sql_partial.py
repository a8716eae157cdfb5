"""Splitting an aggregate in two (rtindex/sql/partial.py): over any division of the rows into
parts, the final text over the parts' partial rows answers what the whole text answers over
all of them (DuckDB both times); what cannot be split is refused."""

from __future__ import annotations

import math

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtindex.sql.partial import PARTS, split

FRAME = 'WITH "frame" AS (SELECT "c0" AS "f0", "c1" AS "f1", "c2" AS "f2" FROM "scan"{where}) '
SPLITS = [
    'SELECT COUNT(*) AS "n" FROM "frame"',
    'SELECT "f0" AS "k", COUNT("f1") AS "n", SUM("f1") AS "s", MIN("f2") AS "lo", MAX("f2") AS "hi" '
    'FROM "frame" GROUP BY "f0" ORDER BY "f0" NULLS LAST',
    'SELECT "f0" + 1 AS "k", AVG("f1") AS "m" FROM "frame" GROUP BY "f0" + 1 HAVING COUNT(*) > 1 ORDER BY 1 NULLS LAST',
    'SELECT SUM(CAST("f1" AS DOUBLE)) / (SUM("f2") + 1.0) AS "r", "f0" AS "k" FROM "frame" GROUP BY "f0" '
    'ORDER BY "k" NULLS LAST LIMIT 3',
    'SELECT "f0" AS "k", COUNT(*) AS "n" FROM "frame" GROUP BY "f0" ORDER BY "n" DESC, "k" NULLS LAST LIMIT 2 OFFSET 1',
]
WHOLE = [
    'SELECT COUNT(DISTINCT "f0") AS "n" FROM "frame"',
    'SELECT "f0", "f1", COUNT(*) FROM "frame" GROUP BY "f0"',
    'SELECT STRING_AGG(CAST("f0" AS VARCHAR), \',\') AS "s" FROM "frame"',
    'SELECT "f0", SUM("f1") OVER () AS "w" FROM "frame"',
    'SELECT "f0" FROM "frame" ORDER BY "f0"',
]

rows = st.lists(st.tuples(st.one_of(st.none(), st.integers(-3, 3)), st.one_of(st.none(), st.integers(-100, 100)),
                          st.one_of(st.none(), st.floats(-1e3, 1e3, allow_nan=False))), max_size=40)


def _table(data: list[tuple]) -> pa.Table:
    cols = list(zip(*data)) if data else [[], [], []]
    return pa.table({"c0": pa.array(cols[0], pa.int64()), "c1": pa.array(cols[1], pa.int64()),
                     "c2": pa.array(cols[2], pa.float64())})


def _close(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


@settings(max_examples=60, deadline=None)
@given(data=rows, cuts=st.lists(st.integers(0, 40), max_size=3), text=st.sampled_from(SPLITS),
       where=st.booleans())
def test_the_parts_merge_to_the_whole(data, cuts, text, where):
    text = FRAME.format(where=' WHERE ("c1" > $w0)' if where else "") + text
    params = {"w0": -50} if where else {}
    halves = split(text)
    assert halves is not None, text
    con = duckdb.connect()
    table = _table(data)
    con.register("scan", table)
    want = con.sql(text, params=params).fetchall()
    bounds = sorted({0, len(data), *[min(c, len(data)) for c in cuts]})
    parts = []
    for lo, hi in zip(bounds, bounds[1:]):
        con.register("scan", table.slice(lo, hi - lo))
        parts.append(con.sql(halves.partial, params=params).to_arrow_table())
    con.register(PARTS, pa.concat_tables(parts, promote_options="permissive") if parts else
                 con.sql(halves.partial, params=params).to_arrow_table())
    got = con.sql(halves.final).fetchall()
    assert len(got) == len(want) and all(all(_close(a, b) for a, b in zip(g, w)) for g, w in zip(got, want)), \
        (text, got, want)


@pytest.mark.parametrize("text", WHOLE)
def test_what_does_not_merge_is_not_split(text):
    assert split(FRAME.format(where="") + text) is None


def test_a_text_that_is_not_sql_is_not_split():
    assert split("SELECT (") is None
