"""The same query gives the same rows, with the same types, on every access path.

A field of a schemaless collection can hold ints, floats, strings, bools and nulls in
different documents, and docs/sql.md types a projected field by the kinds of values it holds
in the rows WHERE selects. The index path learns them from the rows it fetches (or from
posting lists when a LIMIT leaves rows unread), the scan from counts over typed columns: if
the two disagree, a result's types change with the planner's choice. So hypothesis makes
small collections of mixed-type fields (in sealed and in-memory segments) and queries of
the documented dialect, runs each with ``access="index"`` and ``access="scan"`` and compares
the rows and the Python type of every value (or the error both raise). The collections hold
no arrays or objects, so the scan can answer every generated query and both paths must run
(a forced path that cannot run is reported by ``Result.access``; :func:`both` leaves it out).
The first tests are regressions, each a wrong answer a path once gave, spelled out.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import rtindex
from rtindex.errors import SqlError

MISSING = object()
BIG = 2 ** 53 + 1  # an int no float64 holds
STRINGS = ["", "a", "ab", "b", "7", "RT x", "2.5"]
FIELDS = ["_id", "m", "n", "k", "o.x"]


@pytest.fixture
def t(db):
    return db.create_collection("t", shards=1)


def both(db, sql, params=None):
    """The result of ``sql`` on each access path that can run it: {access: rows or error}."""
    out = {}
    for access in ("index", "scan"):
        try:
            res = db.sql(sql, params, access=access)
        except SqlError as e:
            out[access] = type(e).__name__
            continue
        if res.access == access:
            out[access] = res.rows()
    return out


def test_not_like_is_the_negation(db, t):
    t.ingest([{"_id": 1, "s": "RT hi"}, {"_id": 2, "s": "hi"}, {"_id": 3, "s": 5}])
    for access in ("index", "scan"):
        assert db.sql("SELECT _id FROM t WHERE s NOT LIKE 'RT%'", access=access).rows() == [{"_id": 2}]
        assert db.sql("SELECT _id FROM t WHERE NOT s LIKE 'RT%'", access=access).rows() == [{"_id": 2}]


def test_a_plain_projection_applies_the_typing_rule(db, t):
    t.ingest([{"id": 7, "k": 1}, {"id": "x", "k": 2}, {"id": 2.5, "k": 3}])
    for access in ("index", "scan"):
        res = db.sql("SELECT id FROM t WHERE k IN (1, 2)", access=access)
        assert res.rows() == [{"id": "7"}, {"id": "x"}]
        assert res.arrow().column("id").to_pylist() == ["7", "x"]
        assert db.sql("SELECT id FROM t WHERE k IN (1, 3) ORDER BY k", access=access).rows() == [
            {"id": 7.0}, {"id": 2.5}]
    # LIMIT leaves a row unread: the kinds come from the posting lists of every matched row
    assert db.sql("SELECT id FROM t WHERE k IN (1, 2) LIMIT 1", access="index").rows() == [{"id": "7"}]


def test_a_field_is_typed_by_the_rows_where_selects(db, t):
    t.ingest([{"id": 7, "k": 1}, {"id": "x", "k": 2}])
    for access in ("index", "scan"):
        res = db.sql("SELECT id FROM t WHERE k = 1", access=access)
        assert (res.access, res.rows()) == (access, [{"id": 7}])
        assert db.sql("SELECT COUNT(*) AS n, SUM(id) AS s FROM t WHERE k = 1", access=access).rows() == [
            {"n": 1, "s": 7}]


def test_a_large_plain_projection_learns_the_kinds_from_posting_lists(db, t):
    from rtindex.sql.executor import MIXING_FROM_ROWS
    n = 2 * MIXING_FROM_ROWS + 500
    t.ingest([{"_id": i, "m": i if i % 3 else f"s{i}", "k": i % 2} for i in range(n)])
    t.ingest([{"_id": n + i, "m": i + 0.5, "k": 2} for i in range(n)])
    for where, kind in (("k = 1", str), ("k = 2", float), ("k IN (0, 2)", str)):
        rows = {a: db.sql(f"SELECT m FROM t WHERE {where}", access=a).rows() for a in ("index", "scan")}
        assert len(rows["index"]) > MIXING_FROM_ROWS and {type(r["m"]) for r in rows["index"]} == {kind}
        assert sorted(rows["index"], key=repr) == sorted(rows["scan"], key=repr)


def test_a_field_no_selected_row_holds_is_typed_by_the_collection(db, t):
    t.ingest([{"_id": 1, "s": "a", "k": 1}])
    for access in ("index", "scan"):
        with pytest.raises(SqlError, match="TRY_CAST"):  # text, even where no row matched
            db.sql("SELECT SUM(s) AS total FROM t WHERE k = 5", access=access)
        assert db.sql("SELECT MAX(s) AS top FROM t WHERE k = 5", access=access).rows() == [{"top": None}]


def test_ints_compare_exactly_with_floats(db, t):
    t.ingest([{"_id": 1, "x": BIG}, {"_id": 2, "x": 2 ** 53 + 0.0}, {"_id": 3, "x": 3}])
    cases = {"x = 9007199254740992.0": [2], "x > 9007199254740992.0": [1], "x >= 9007199254740992.0": [1, 2],
             "x <> 9007199254740992.0": [1, 3], "x < 3.5": [3], "x > 2.5": [1, 2, 3], "x = 3.0": [3],
             "x <= 3.5": [3], "x = 9007199254740993": [1], "x < 9007199254740993": [2, 3],
             "x > 1e300": [], "x < 1e300": [1, 2, 3]}
    for where, ids in cases.items():
        for access in ("index", "scan"):
            rows = db.sql(f"SELECT _id FROM t WHERE {where} ORDER BY _id", access=access).rows()
            assert [r["_id"] for r in rows] == ids, (where, access)


# -- the property ------------------------------------------------------------------------
VALUES = st.one_of(
    st.integers(-3, 3), st.sampled_from([BIG, -BIG, 2 ** 53, 2 ** 62]),
    st.sampled_from([0.5, -1.0, 2.0, 2.5, 1e16, 1.5e-07, 2.0 ** 53]),
    st.sampled_from(STRINGS), st.booleans(), st.none(), st.just(MISSING))
NUMBERS = st.one_of(st.integers(-3, 3), st.sampled_from([BIG, 0.5, 2.0, -1.5]), st.none(), st.just(MISSING))


@st.composite
def documents(draw):
    docs = []
    for i in range(draw(st.integers(1, 10))):
        doc = {"_id": i, "k": draw(st.integers(0, 3)), "s": draw(st.sampled_from(STRINGS))}
        for name, values in (("m", VALUES), ("n", NUMBERS)):
            v = draw(values)
            if v is not MISSING:
                doc[name] = v
        x = draw(VALUES)
        if x is not MISSING:
            doc["o"] = {"x": x}
        docs.append(doc)
    return docs


OPERANDS = st.sampled_from(["1", "2", "-1", "2.0", "2.5", "0.5", str(BIG), "9007199254740992.0", "'a'", "'7'",
                            "TRUE", "FALSE", "NULL"])


@st.composite
def predicates(draw, depth=0):
    kind = draw(st.sampled_from(["cmp", "cmp", "in", "between", "null", "missing", "like", "k", "expr"]
                                + (["not", "and", "or"] if depth < 2 else [])))
    f = draw(st.sampled_from(["m", "n", "o.x"]))
    if kind == "cmp":
        return f"{f} {draw(st.sampled_from(['=', '<>', '<', '<=', '>', '>=']))} {draw(OPERANDS)}"
    if kind == "in":
        return f"{f} IN ({', '.join(draw(st.lists(OPERANDS, min_size=1, max_size=3)))})"
    if kind == "between":
        return f"{f} BETWEEN {draw(OPERANDS)} AND {draw(OPERANDS)}"
    if kind == "null":
        return f"{f} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
    if kind == "missing":
        return f"IS_MISSING({f})"
    if kind == "like":
        return f"{f} {draw(st.sampled_from(['', 'NOT ']))}LIKE '{draw(st.sampled_from(['a%', '', 'RT%', '7']))}'"
    if kind == "expr":  # what DuckDB evaluates over the rows the rest of WHERE selects
        return draw(st.sampled_from(["n + 1 > 2", "m LIKE '%a%'", "length(CAST(m AS VARCHAR)) > 1",
                                     "k IS DISTINCT FROM 1", "k * 2 = k + 2"]))
    if kind == "k":
        return f"k = {draw(st.integers(0, 3))}"
    if kind == "not":
        return f"NOT ({draw(predicates(depth + 1))})"
    joiner = " AND " if kind == "and" else " OR "
    return "(" + joiner.join(draw(st.lists(predicates(depth + 1), min_size=2, max_size=3))) + ")"


@st.composite
def queries(draw):
    """(sql, ordered): a query of the documented dialect, and whether its order is total."""
    where = f" WHERE {draw(predicates())}" if draw(st.booleans()) else ""
    shape = draw(st.sampled_from(["plain", "plain", "ordered", "aggregate", "group"]))
    if shape == "aggregate":
        aggs = draw(st.lists(st.sampled_from(["COUNT(*)", "COUNT(m)", "MIN(m)", "MAX(n)", "SUM(n)", "AVG(n)",
                                              "COUNT(DISTINCT o.x)", "SUM(m)", "SUM(k)", "MAX(lower(s))"]),
                             min_size=1, max_size=3, unique=True))
        return "SELECT " + ", ".join(f"{a} AS a{i}" for i, a in enumerate(aggs)) + f" FROM t{where}", True
    if shape == "group":
        return f"SELECT m, COUNT(*) AS c, MAX(n) AS top FROM t{where} GROUP BY m", False
    fields = draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3, unique=True))
    if "_id" not in fields:
        fields.append("_id")
    select = "SELECT " + ", ".join(fields) + f" FROM t{where}"
    if shape == "ordered":
        return select + f" ORDER BY _id DESC LIMIT {draw(st.integers(0, 4))}", True
    return select, False


def typed(rows):
    """Rows as comparable values that keep each value's type (floats rounded a little:
    a SUM may add in another order)."""
    def cell(v):
        return (type(v).__name__, round(v, 9) if isinstance(v, float) and math.isfinite(v) else repr(v))
    return [tuple(sorted((k, cell(v)) for k, v in r.items())) for r in rows]


@given(docs=documents(), shards=st.integers(1, 2), flush_at=st.integers(0, 10), deleted=st.sets(st.integers(0, 9)),
       query=queries(), limit=st.integers(0, 3), offset=st.sampled_from(["", " OFFSET 1"]))
def test_every_access_path_gives_the_same_rows_and_types(tmp_path_factory, docs, shards, flush_at, deleted, query,
                                                         limit, offset):
    sql, ordered = query
    with rtindex.open(str(tmp_path_factory.mktemp("db") / "db")) as db:
        t = db.create_collection("t", shards=shards)
        t.ingest(docs[:flush_at])
        t.flush()  # some rows in a sealed segment, the rest in memory
        t.ingest(docs[flush_at:])
        for i in deleted:  # the typing must not count deleted rows
            t.delete(i)
        results = both(db, sql)
        assert set(results) == {"index", "scan"}, sql  # no arrays or objects here: both paths can run
        if len(results) == 2:
            index, scan = results["index"], results["scan"]
            if isinstance(index, list) and isinstance(scan, list):
                a, b = typed(index), typed(scan)
                assert (a if ordered else sorted(a)) == (b if ordered else sorted(b)), (sql, docs, index, scan)
            else:
                assert index == scan, (sql, docs, index, scan)
        if not ordered and "GROUP BY" not in sql:  # LIMIT without ORDER BY: some of the rows, typed alike
            limited = both(db, f"{sql} LIMIT {limit}{offset}")
            for access, rows in limited.items():
                if isinstance(rows, list):
                    full = typed(results[access])
                    size = min(limit, max(0, len(full) - (1 if offset else 0)))
                    assert len(rows) == size and set(typed(rows)) <= set(full), (sql, access, docs)
