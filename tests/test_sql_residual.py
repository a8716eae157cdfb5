"""WHERE split into an index part and a residual, and what DuckDB computes over one
collection's frame (docs/sql.md, "Residuals"): each query on every access path against
DuckDB over a native table of the same data (tests/sql_oracle.py)."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sql_oracle import check, documents, loaded

import rtindex

QUERIES = [
    "SELECT _id FROM t WHERE b",
    "SELECT _id FROM t WHERE NOT b",
    "SELECT _id FROM t WHERE b IS TRUE",
    "SELECT _id FROM t WHERE b IS NOT FALSE",
    "SELECT _id FROM t WHERE s LIKE '%a%'",
    "SELECT _id FROM t WHERE s LIKE '_'",
    "SELECT _id FROM t WHERE s ILIKE 'A%'",
    "SELECT _id FROM t WHERE s NOT LIKE '%b'",
    "SELECT _id FROM t WHERE i IS DISTINCT FROM 1",
    "SELECT _id FROM t WHERE i IS NOT DISTINCT FROM NULL",
    "SELECT _id FROM t WHERE i < f",
    "SELECT _id FROM t WHERE i = o.x",
    "SELECT _id FROM t WHERE i + 1 > 2",
    "SELECT _id FROM t WHERE i % 2 = 0 AND f > 0",
    "SELECT _id FROM t WHERE lower(s) = 'b'",
    "SELECT _id FROM t WHERE length(s) >= 2 AND i >= 0",
    "SELECT _id FROM t WHERE i > 0 AND s LIKE '%a%'",
    "SELECT _id FROM t WHERE i = 1 OR s LIKE '%a%'",
    "SELECT _id FROM t WHERE CASE WHEN b THEN i > 0 ELSE f < 0 END",
    "SELECT DISTINCT s FROM t",
    "SELECT DISTINCT i, b FROM t WHERE i > 0",
    "SELECT COUNT(*) FILTER (WHERE b) AS c, COUNT(*) AS n FROM t WHERE i >= -1",
    "SELECT s, COUNT(*) AS n FROM t GROUP BY ALL",
    "SELECT CAST(i AS DECIMAL(10, 2)) AS d FROM t WHERE i > 0",
    "SELECT CASE WHEN i > 0 THEN 'p' ELSE 'n' END AS k, COUNT(*) AS c FROM t GROUP BY 1",
    "SELECT _id, SUM(i) OVER (PARTITION BY s ORDER BY _id) AS w FROM t",
    "SELECT _id, RANK() OVER (ORDER BY f DESC NULLS LAST) AS r FROM t WHERE b",
    "SELECT o.x, COUNT(*) AS n FROM t WHERE o.x IS NOT NULL GROUP BY ALL",
    "SELECT string_agg(s, ',' ORDER BY _id) AS a FROM t WHERE s IS NOT NULL",
    "SELECT i, MEDIAN(f) AS m FROM t WHERE i = 1 OR i = 2 GROUP BY i",
]


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """One data set for every query: a few documents of each kind, on two shards."""
    docs = [{"_id": 0, "i": 1, "f": 0.5, "s": "a", "b": True, "o": {"x": 1}},
            {"_id": 1, "i": 2, "f": -1.5, "s": "ab", "b": False, "o": {"x": 3}},
            {"_id": 2, "i": -1, "s": "B", "b": None},
            {"_id": 3, "i": None, "f": 2.0, "s": "ba", "o": {"s": "x"}},
            {"_id": 4, "i": 3, "f": 3.0, "b": True},
            {"_id": 5, "i": 0, "f": 0.0, "s": "", "b": False, "o": {"x": 0}}]
    with loaded(str(tmp_path_factory.mktemp("residual") / "db"), {"t": (docs, 2)}) as pair:
        yield pair


@pytest.mark.parametrize("sql", QUERIES)
def test_query_matches_duckdb(fixed, sql):
    db, con = fixed
    check(db, con, sql)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=documents("t"), sql=st.sampled_from(QUERIES))
def test_generated_documents_match_duckdb(tmp_path_factory, docs, sql):
    with loaded(str(tmp_path_factory.mktemp("gen") / "db"), {"t": (docs, 2)}) as (db, con):
        check(db, con, sql)


def test_index_part_and_residual_in_explain(fixed):
    db, _ = fixed
    plan = db.explain("SELECT _id FROM t WHERE i > 0 AND s LIKE '%a%'")
    assert plan.predicates == (("i > 0", 3),) and plan.residual == "s LIKE '%a%'"
    assert "residual (DuckDB): s LIKE '%a%'" in str(plan)
    full = db.explain("SELECT _id FROM t WHERE i > 0")
    assert full.residual is None and "DuckDB: not used" in str(full)


def test_star_with_a_residual_returns_documents(fixed):
    db, _ = fixed
    for access in (None, "index", "scan"):
        res = db.sql("SELECT * FROM t WHERE s LIKE '%b%' AND i > 0", access=access)
        (row,) = res.rows()
        assert row.pop("_event_time") > 0  # documents as stored
        assert row == {"_id": 1, "i": 2, "f": -1.5, "s": "ab", "b": False, "o": {"x": 3}}


def test_event_time_functions_and_iso_strings(tmp_path):
    with rtindex.open(str(tmp_path / "db")) as db:
        ev = db.create_collection("ev")
        times = [dt.datetime(2024, 1, 1, tzinfo=dt.UTC), dt.datetime(2025, 6, 1, tzinfo=dt.UTC)]
        ev.ingest([{"_id": i, "_event_time": t, "ts": t.isoformat()} for i, t in enumerate(times)])
        for access in (None, "index", "scan"):
            assert db.sql("SELECT _id FROM ev WHERE _event_time > '2024-06-01T00:00:00Z'",
                          access=access).rows() == [{"_id": 1}]
            assert db.sql("SELECT _id, date_part('year', _event_time) AS y FROM ev WHERE "
                          "date_trunc('month', _event_time) = TIMESTAMPTZ '2025-06-01 00:00:00+00' ",
                          access=access).rows() == [{"_id": 1, "y": 2025}]
            assert db.sql("SELECT CAST(ts AS TIMESTAMP) AS t FROM ev WHERE _id = 0",
                          access=access).rows() == [{"t": dt.datetime(2024, 1, 1)}]


def test_result_budget_holds_on_the_residual_path(tmp_path):
    with rtindex.open(str(tmp_path / "db"), max_result_bytes=20_000) as db:
        db.create_collection("t").ingest({"_id": i, "s": f"row {i} " + "x" * 50} for i in range(2_000))
        res = db.sql("SELECT DISTINCT s FROM t WHERE s LIKE '%x%'")
        with pytest.raises(rtindex.ResultTooLargeError):
            res.rows()
        assert sum(b.num_rows for b in res.arrow_reader(batch_size=500)) == 2_000
        assert len(db.sql("SELECT DISTINCT s FROM t WHERE s LIKE '%x%' LIMIT 10")) == 10
        for access in ("index", "scan"):  # the single-collection form with a residual
            res = db.sql("SELECT s FROM t WHERE s LIKE '%x%' AND _id >= 0", access=access)
            with pytest.raises(rtindex.ResultTooLargeError):
                res.df()
            assert sum(b.num_rows for b in res.arrow_reader(batch_size=500)) == 2_000
