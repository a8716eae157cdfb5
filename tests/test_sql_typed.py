"""Rule 2 (typed comparisons, docs/sql.md) where DuckDB evaluates a condition over a field
of mixed types (rtindex/sql/typed.py): a residual, a comparison with a parameter, two mixed
fields, on both access paths. The oracles are the index (which answers ``v op :c`` by rule
2 itself) and rule 2 written out in Python."""

from __future__ import annotations

import itertools
import operator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rtindex

ACCESS = ("index", "scan")
OPS = {"=": operator.eq, "<>": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
       ">=": operator.ge}
SCALARS = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, 2.0, -1.5]), st.sampled_from(["", "a", "b", "7", "ab"]),
                    st.booleans())
VALUES = st.one_of(SCALARS, st.none())
# a conjunct the index cannot answer, FALSE on every row (s is always a short string): it
# makes the comparison beside it a residual without changing its truth
NEVER = "length(s) > 100"


def family(v) -> str | None:
    """Rule 2's family of a JSON value (None: null)."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "num"
    return "text" if isinstance(v, str) else None


def rule2(a, op: str, b) -> bool | None:
    """``a op b`` by rule 2: values of one family compare, anything else is UNKNOWN."""
    if family(a) is None or family(a) != family(b):
        return None
    return OPS[op](a, b)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    with rtindex.open(str(tmp_path_factory.mktemp("typed") / "db")) as db:
        yield db


_names = itertools.count()


def collection(db, rows: list[dict]) -> str:
    name = f"t{next(_names)}"
    db.create_collection(name, shards=1).ingest([{"_id": i, "s": "x", **r} for i, r in enumerate(rows)])
    return name


def ids(db, sql: str, params=None, access: str = "index") -> list:
    res = db.sql(sql, params, access=access)
    assert res.access == access
    return sorted(r["_id"] for r in res.rows())


@pytest.mark.parametrize("access", ACCESS)
@pytest.mark.parametrize(("value", "expected"), [(7, [1]), (7.0, [1]), ("7", [2]), (True, [3]), (None, [])])
def test_a_parameter_compares_with_its_own_family(db, access, value, expected):
    name = collection(db, [{"v": "x"}, {"v": 7}, {"v": "7"}, {"v": True}, {"v": None}])
    assert ids(db, f"SELECT _id FROM {name} WHERE v = :p OR {NEVER}", {"p": value}, access) == expected
    assert ids(db, f"SELECT _id FROM {name} WHERE v IS NOT DISTINCT FROM ?", [value], access) == (
        [4] if value is None else expected)


@pytest.mark.parametrize("access", ACCESS)
def test_outputs_keep_the_text_column_and_one_type_is_untouched(db, access):
    name = collection(db, [{"v": 7, "k": 7}, {"v": "7", "k": 8}])
    res = db.sql(f"SELECT v, k FROM {name} WHERE v = k OR {NEVER} ORDER BY k", access=access)
    assert res.rows() == [{"v": "7", "k": 7}]
    # k holds ints only: DuckDB compares it as it always did (no shadow columns)
    assert "__" not in db.explain(f"SELECT k FROM {name} WHERE k > 7 OR {NEVER}", access=access).duckdb_sql


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(VALUES, min_size=1, max_size=8), op=st.sampled_from(sorted(OPS)), const=SCALARS)
def test_a_residual_comparison_agrees_with_the_index(db, values, op, const):
    name = collection(db, [{"v": v} for v in values])
    for negate in ("", "NOT "):
        expected = ids(db, f"SELECT _id FROM {name} WHERE {negate}v {op} :c", {"c": const})  # the index's rule 2
        for access in ACCESS:
            sql = f"SELECT _id FROM {name} WHERE {negate}(v {op} :c OR {NEVER})"
            assert ids(db, sql, {"c": const}, access) == expected, (sql, access)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=st.lists(st.tuples(VALUES, VALUES), min_size=1, max_size=8), op=st.sampled_from(sorted(OPS)))
def test_two_mixed_fields_compare_by_rule_2(db, pairs, op):
    name = collection(db, [{"a": a, "b": b} for a, b in pairs])
    truth = [rule2(a, op, b) for a, b in pairs]
    for access in ACCESS:
        assert ids(db, f"SELECT _id FROM {name} WHERE a {op} b", access=access) == [
            i for i, t in enumerate(truth) if t is True]
        assert ids(db, f"SELECT _id FROM {name} WHERE NOT (a {op} b)", access=access) == [
            i for i, t in enumerate(truth) if t is False]
        same = [i for i, (a, b) in enumerate(pairs) if (a is None and b is None) or rule2(a, "=", b) is True]
        assert ids(db, f"SELECT _id FROM {name} WHERE a IS NOT DISTINCT FROM b", access=access) == same


@pytest.mark.parametrize("access", ACCESS)
@pytest.mark.parametrize("sql", ["SELECT _id FROM {t} WHERE k = 1 AND v > w",
                                 "SELECT _id FROM {t} a WHERE v > (SELECT MIN(w) FROM {t} b WHERE b.k = a.k)"])
def test_explain_shows_the_text_duckdb_runs(db, access, sql):
    # EXPLAIN's DuckDB line is the text after rule 2's rewrite (the mixed v compared through
    # its numeric shadow column), the same text the query's own Result.plan reports
    name = collection(db, [{"k": i % 2, "v": i if i % 3 else str(i), "w": i / 2} for i in range(12)])
    sql = sql.format(t=name)
    plan = db.explain(sql, access=access)
    assert '"__num:' in plan.duckdb_sql
    res = db.sql(sql, access=access)
    assert res.plan.duckdb_sql == plan.duckdb_sql
    assert f"DuckDB: {plan.duckdb_sql}" in str(plan)


# v: ints, and strings that are not numbers where i % 3 == 0; w = i / 2; k = i % 2
MIXED_ROWS = [{"k": i % 2, "v": i if i % 3 else f"{i}x", "w": i / 2} for i in range(12)]


@pytest.mark.parametrize("access", ACCESS)
@pytest.mark.parametrize(("sql", "expected"), [
    # the other operand's family from an aggregate's argument: MIN(w) is a number
    ("SELECT _id FROM {t} a WHERE v > (SELECT MIN(w) FROM {t} b WHERE b.k = a.k)", [1, 2, 4, 5, 7, 8, 10, 11]),
    # from a CASE whose results are all numbers
    ("SELECT _id FROM {t} WHERE v > CASE WHEN k = 1 THEN w ELSE 2 END", [1, 4, 5, 7, 8, 10, 11]),
    # from a CTE's column, by the expression it outputs
    ("WITH c AS (SELECT w + 1 AS z FROM {t}) SELECT _id FROM {t} WHERE v > (SELECT MAX(z) FROM c)", [7, 8, 10, 11]),
    ("SELECT _id FROM {t}, (SELECT 4 AS n) d WHERE v < d.n", [1, 2]),
])
def test_the_other_operands_family_is_found_through_expressions(db, access, sql, expected):
    name = collection(db, MIXED_ROWS)
    assert ids(db, sql.format(t=name), access=access) == expected


@pytest.mark.parametrize("access", ACCESS)
def test_a_mixed_field_passed_on_by_a_cte_is_an_error_that_says_so(db, access):
    # the CTE passes v's text column without its shadow columns: rule 2 cannot apply, and
    # DuckDB's own error is translated (it is never compared as text silently)
    name = collection(db, MIXED_ROWS)
    with pytest.raises(rtindex.SqlError, match="several types") as err:
        db.sql(f"SELECT _id FROM (SELECT _id, v AS vv FROM {name}) d WHERE vv > 3", access=access)
    assert "INTEGER_LITERAL" not in str(err.value)


@pytest.mark.parametrize("access", ACCESS)
@pytest.mark.parametrize(("sql", "expected"), [
    # a number or a bool is never LIKE a pattern: UNKNOWN, not DuckDB's "no function ~~(BIGINT, ...)"
    ("SELECT _id FROM {t} WHERE k LIKE '1%' OR b IS TRUE", []),
    ("SELECT _id FROM {t} WHERE CASE WHEN k NOT LIKE '1%' THEN TRUE ELSE FALSE END", []),
    # bounds of two families: one side is UNKNOWN, whatever the rows read (none, here: k = 3)
    ("SELECT COUNT(*) FILTER (WHERE b BETWEEN FALSE AND 2.5) AS n FROM {t} WHERE k = 3", [{"n": 0}]),
    ("SELECT COUNT(*) FILTER (WHERE b BETWEEN FALSE AND 2.5) AS n FROM {t} WHERE k = 16", [{"n": 0}]),
    # a field with no value in the rows read (w): NULL NOT IN an empty subquery is still TRUE
    ("SELECT _id FROM {t} WHERE k = 16 AND w NOT IN (SELECT k FROM {t} WHERE k = 99)", [{"_id": 0}]),
])
def test_comparisons_that_duckdb_would_refuse_are_unknown(db, access, sql, expected):
    name = collection(db, [{"k": 16, "b": False}])
    rows = db.sql(sql.format(t=name), access=access).rows()
    assert (rows if rows and "n" in rows[0] else [{"_id": r["_id"]} for r in rows]) == expected


def test_a_text_made_for_duckdb_that_does_not_read_back_is_a_sql_error():
    """A construct carried over to DuckDB's text wrongly (the text does not parse) is the
    SqlError that says so, not sqlglot's ParseError (a 500 from the service)."""
    from rtindex.sql import typed

    with pytest.raises(rtindex.SqlError, match="not carried over to DuckDB correctly"):
        typed.compared('SELECT 0.x AS "y" FROM "frame"')


@pytest.mark.parametrize("sql", ["SELECT * FROM (SELECT k, s x) q WHERE q.k = 1",
                                 "SELECT -1 FROM (SELECT k, s -1 x) q WHERE q.k = 1"])
def test_a_derived_table_whose_columns_name_itself_is_an_error_not_a_recursion(tmp_path, sql):
    """Columns of a derived table with no FROM of its own resolve to the derived table
    itself: a SqlError (DuckDB's "FROM clause is missing"), never a RecursionError (a 500)."""
    with rtindex.open(tmp_path / "db") as d:
        d.create_collection("c").ingest([{"_id": 1, "k": 1, "s": "x"}])
        with pytest.raises(rtindex.SqlError, match="FROM clause is missing"):
            d.sql(sql)
