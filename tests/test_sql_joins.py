"""Queries over several collection references: JOINs, subqueries (IN, scalar, EXISTS,
correlated), CTEs, UNION, self joins; each against DuckDB over native tables of the same
data (tests/sql_oracle.py) on every access path; each collection read once; the sandbox
inside subqueries and CTEs."""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sql_oracle import check, documents, loaded

import rtindex
from rtindex import SqlError

QUERIES = [
    "SELECT t._id, u._id FROM t JOIN u ON t.i = u.k",
    "SELECT t._id, u.w FROM t JOIN u ON t.i = u.k WHERE t.i > 0 AND u.w < 5",
    "SELECT t._id, u.w FROM t LEFT JOIN u ON t.i = u.k WHERE u.w IS NULL",
    "SELECT t._id, u.w FROM t LEFT JOIN u ON t.i = u.k AND u.w > 2",
    "SELECT s, w FROM t JOIN u ON i = k WHERE b",
    "SELECT COUNT(*) AS c FROM t, u WHERE t.i = u.k AND u.name LIKE '%a%'",
    "SELECT _id FROM t WHERE i IN (SELECT k FROM u WHERE w > 2)",
    "SELECT _id FROM t WHERE i NOT IN (SELECT k FROM u WHERE k IS NOT NULL)",
    "SELECT _id FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.k = t.i AND u.w >= 3)",
    "SELECT _id, (SELECT MAX(w) FROM u WHERE u.k = t.i) AS m FROM t",
    "SELECT _id FROM t WHERE f > (SELECT AVG(w) FROM u)",
    "SELECT a._id FROM t a WHERE a.i > (SELECT AVG(b.i) FROM t b WHERE b.s = a.s)",
    "SELECT a._id, b._id AS c FROM t a JOIN t b ON a.i = b.i WHERE a.b AND b.s = 'a'",
    "SELECT a._id, b._id AS c FROM t a JOIN t b ON a.i = b.i WHERE a.i = 1 AND b.f > 0",
    "WITH c AS (SELECT s, SUM(i) AS x FROM t WHERE i > 0 GROUP BY s) SELECT * FROM c",
    "WITH c AS (SELECT k, COUNT(*) AS n FROM u GROUP BY k) SELECT t._id, c.n FROM t JOIN c ON t.i = c.k",
    "SELECT i AS v FROM t WHERE b UNION SELECT k FROM u WHERE w > 1",
    "SELECT i AS v FROM t UNION ALL SELECT k FROM u EXCEPT SELECT 0",
    "SELECT * FROM (SELECT s, i FROM t WHERE i >= 0) x WHERE x.s LIKE '%a%'",
    "SELECT u.name, COUNT(t._id) AS n FROM u LEFT JOIN t ON t.i = u.k GROUP BY u.name",
]


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    t = [{"_id": 0, "i": 1, "f": 0.5, "s": "a", "b": True}, {"_id": 1, "i": 2, "f": -1.5, "s": "ab", "b": False},
         {"_id": 2, "i": 1, "s": "a", "b": None}, {"_id": 3, "i": None, "f": 2.0, "s": "ba"},
         {"_id": 4, "i": 3, "f": 3.0, "b": True}]
    u = [{"_id": 0, "k": 1, "w": 2, "name": "a"}, {"_id": 1, "k": 1, "w": 5, "name": "ba"},
         {"_id": 2, "k": 3, "w": 3}, {"_id": 3, "k": None, "w": 1, "name": "b"}]
    with loaded(str(tmp_path_factory.mktemp("joins") / "db"), {"t": (t, 2), "u": (u, 4)}) as pair:
        yield pair


@pytest.mark.parametrize("sql", QUERIES)
def test_query_matches_duckdb(fixed, sql):
    db, con = fixed
    check(db, con, sql)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t=documents("t", 15), u=documents("u", 10), sql=st.sampled_from(QUERIES))
def test_generated_documents_match_duckdb(tmp_path_factory, t, u, sql):
    with loaded(str(tmp_path_factory.mktemp("gen") / "db"), {"t": (t, 2), "u": (u, 4)}) as (db, con):
        check(db, con, sql)


def test_a_collection_referenced_twice_is_read_once(fixed):
    db, _ = fixed
    plan = db.explain("SELECT a._id FROM t a JOIN t b ON a.i = b.i WHERE a.b AND b.s = 'a'")
    assert [p.collection for p in plan.sources] == ["t"]
    text = str(plan)
    assert "reference t AS a: index part: none; residual: a.b; estimated rows: 5" in text
    assert "reference t AS b: index part: s = 'a'; residual: a.b; estimated rows: 2" in text
    res = db.sql("SELECT a._id FROM t a JOIN t b ON a.i = b.i WHERE a.i = 1 AND b.i = 1")
    assert sorted(r["_id"] for r in res) == [0, 0, 2, 2]
    assert len(res.plan.sources) == 1


def test_explain_shows_each_reference(fixed):
    db, _ = fixed
    plan = db.explain("SELECT t._id, u.w FROM t JOIN u ON t.i = u.k WHERE t.i > 1 AND u.w < 5 AND t.f < u.w")
    text = str(plan)
    assert "reference t AS t: index part: i > 1; residual: t.f < u.w; estimated rows: 2" in text
    assert "reference u AS u: index part: w < 5; residual: t.f < u.w; estimated rows: 3" in text
    assert 'DuckDB: SELECT "t"."_id", "u"."w" FROM "__c0" AS "t" JOIN "__c1" AS "u"' in text


def test_outer_join_where_stays_in_duckdb(fixed):
    db, _ = fixed
    plan = db.explain("SELECT t._id FROM t LEFT JOIN u ON t.i = u.k WHERE u.w IS NULL")
    assert all("index part: none" in line for p in plan.sources for line in p.references)


def test_parameters_in_subqueries_and_ctes(fixed):
    db, _ = fixed
    sql = "WITH c AS (SELECT k FROM u WHERE w > :w) SELECT _id FROM t WHERE i IN (SELECT k FROM c) AND b = :b"
    assert sorted(r["_id"] for r in db.sql(sql, {"w": 2, "b": True})) == [0, 4]
    assert sorted(r["_id"] for r in db.sql(sql.replace(":w", "?").replace(":b", "?"), [2, True])) == [0, 4]


@pytest.mark.parametrize("sql", [
    "SELECT _id FROM t WHERE s IN (SELECT content FROM read_text('/etc/passwd'))",
    "WITH x AS (SELECT * FROM read_csv('/etc/passwd')) SELECT * FROM t, x",
    "WITH x AS (SELECT * FROM read_parquet('/tmp/x.parquet')) SELECT _id FROM t",
    "SELECT _id, (SELECT COUNT(*) FROM glob('/etc/*')) AS n FROM t",
    "SELECT _id FROM t WHERE EXISTS (SELECT 1 FROM '/etc/passwd')",
    "SELECT _id FROM t UNION SELECT 1 FROM duckdb_settings()",
    "SELECT _id FROM t WHERE s = (SELECT getenv('HOME'))",
    "WITH x AS (SELECT 1) SELECT * FROM t; COPY t TO '/tmp/rtindex-copy-test.csv'",
    "WITH x AS (SELECT 1) SELECT * FROM t; ATTACH '/tmp/rtindex-attach-test.db' AS y",
    "SELECT _id FROM t WHERE i IN (SELECT 1); PRAGMA version",
    "SELECT * FROM t JOIN (SELECT * FROM pragma_version()) v ON TRUE",
    "SELECT * FROM t, (SELECT * FROM information_schema.tables) x",
    "SELECT * FROM t JOIN \"__c0\" ON TRUE",
])
def test_no_file_or_setting_access_through_subqueries_or_ctes(fixed, sql):
    db, _ = fixed
    with pytest.raises(SqlError):
        db.sql(sql)
    assert not os.path.exists("/tmp/rtindex-copy-test.csv") and not os.path.exists("/tmp/rtindex-attach-test.db")


def test_outer_fields_in_a_subquery_are_no_index_part_of_it(fixed):
    db, con = fixed
    sql = "SELECT a._id FROM t a WHERE NOT EXISTS (SELECT 1 FROM u WHERE a.i = 1 AND u.w > 4)"
    check(db, con, sql)
    plan = db.explain(sql)
    assert all("index part: none" in line or "index part: w > 4" in line
               for p in plan.sources for line in p.references)


def test_time_functions_inside_subqueries(tmp_path):
    with rtindex.open(str(tmp_path / "db")) as db:
        db.create_collection("ev").ingest([{"_id": i, "k": i % 2, "_event_time": 1_700_000_000_000_000 + i}
                                          for i in range(4)])
        sql = ("SELECT _id FROM ev WHERE _id IN (SELECT _id FROM ev WHERE UNIX_MICROS(_event_time) > "
               "1700000000000001 AND _event_time > TIMESTAMP_SECONDS(:t)) ORDER BY _id")
        for access in (None, "index", "scan"):
            assert db.sql(sql, {"t": 5}, access=access).rows() == [{"_id": 2}, {"_id": 3}]
            assert db.sql("SELECT UNIX_MICROS(a._event_time) AS us FROM ev a JOIN ev b ON a._id = b._id "
                          "WHERE a.k = 1 AND b._id < 2", access=access).rows() == [{"us": 1_700_000_000_000_001}]


def test_where_reads_the_field_an_output_alias_shadows(tmp_path):
    # SELECT DISTINCT goes through the general planner; there, too, WHERE b is the documents'
    # field b and not the output alias b (DuckDB would bind the alias when the frame lacks b)
    with rtindex.open(str(tmp_path / "db")) as db:
        db.create_collection("t", shards=1).ingest([{"_id": 1, "a": 30, "b": 5}, {"_id": 2, "a": 1, "b": 10}])
        assert db.sql("SELECT DISTINCT a AS b FROM t WHERE b > 7").rows() == [{"b": 1}]
        assert db.sql("SELECT DISTINCT COUNT(*) AS b FROM t WHERE -b IS NOT NULL").rows() == [{"b": 2}]
        assert db.sql("SELECT DISTINCT a AS b FROM t ORDER BY b").rows() == [{"b": 1}, {"b": 30}]


@pytest.mark.parametrize("access", [None, "index", "scan"])
def test_output_columns_of_one_name_are_all_kept(tmp_path, access):
    """Two output columns named alike: the later is name_2 (then _3...), on every path and in
    rows(), arrow() and columns alike; no value hides another."""
    with rtindex.open(tmp_path / "db") as db:
        db.create_collection("tab0", shards=1).ingest([{"_id": 1, "col1": 10, "col2": 20}])
        db.create_collection("tab2", shards=2).ingest([{"_id": 2, "col1": 30, "col2": 40}])
        cases = {
            "SELECT DISTINCT + + col1 AS col2, 59 AS col2 FROM tab2": [{"col2": 30, "col2_2": 59}],
            "SELECT col1 AS x, col2 AS x, col1 AS x_2 FROM tab2": [{"x": 30, "x_2": 40, "x_2_2": 30}],
            "SELECT col2 AS n, COUNT(*) AS n FROM tab2 GROUP BY col2": [{"n": 40, "n_2": 1}],
            "SELECT cor0.col1, cor1.col1 FROM tab0 cor0 CROSS JOIN tab2 AS cor1": [{"col1": 10, "col1_2": 30}],
            "SELECT cor0.col1, cor1.col2 AS col1 FROM tab0 cor0, tab2 cor1 ORDER BY 1": [{"col1": 10, "col1_2": 40}],
        }
        for sql, rows in cases.items():
            res = db.sql(sql, access=access)
            assert res.rows() == rows, sql
            assert res.columns == list(rows[0]) == res.arrow().column_names, sql
            assert res.arrow().to_pylist() == rows, sql
        res = db.sql("SELECT * FROM tab0 cor0 CROSS JOIN tab2 AS cor1", access=access)
        row = res.rows()[0]
        assert (row["_id"], row["col1"], row["col2"]) == (1, 10, 20)
        assert (row["_id_2"], row["col1_2"], row["col2_2"]) == (2, 30, 40)
        assert res.columns == res.arrow().column_names and len(set(res.columns)) == len(res.columns) == 8


def test_the_hint_for_a_nested_field_names_the_source_that_has_it(tmp_path):
    """Over a collection and a subquery, an unqualified nested field is refused with the
    form that works: the subquery's name when its column is meant, else the collection's."""
    with rtindex.open(str(tmp_path / "db")) as db:
        db.create_collection("p").ingest([{"_id": "a", "items": [{"name": "n1"}], "o": {"k": 1}}])
        for sql, fix in (("SELECT d.name FROM p, (SELECT UNNEST(items) AS d FROM p) x", "x.d.name"),
                         ("SELECT o.k FROM p, (SELECT UNNEST(items) AS d FROM p) x", "p.o.k")):
            with pytest.raises(rtindex.UnsupportedSqlError, match=re.escape(f"(write {fix})")):
                db.sql(sql)
            fixed = db.sql(sql.replace(fix.split(".", 1)[1], fix, 1)).rows()
            assert list(fixed[0].values()) == (["n1"] if fix == "x.d.name" else [1])
