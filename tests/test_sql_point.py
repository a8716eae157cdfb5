"""Point queries (``Query.point``) against the general index path on the same data.

``SELECT * FROM c WHERE f = :v`` and ``WHERE ARRAY_CONTAINS(f, :v)`` (with LIMIT/OFFSET)
run on a short path of their own (SqlEngine._point). ``access="index"`` forces the general
path for the same text: the two must return the same rows in the same order, the same plan
and the same warnings, whatever the data (mixed types, arrays, nested arrays, objects, nulls,
missing fields, deletes, rows sealed and not) and the value (any type, absent, NULL).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rtindex
from rtindex.errors import ResultTooLargeError, SqlError
from rtindex.sql.queries import parse_query

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([1.0, 2.5, -0.0, 2**53 + 1]),
                    st.sampled_from(["a", "b", "", "1"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from(["x", "y"]), inner, max_size=2)),
                      max_leaves=4)
DOCS = st.lists(st.dictionaries(st.sampled_from(["f", "g", "h"]), VALUES, max_size=3), min_size=1, max_size=40)
PATHS = st.sampled_from(["f", "g", "h.x", "f.y", "nope"])


def both(db, sql, params):
    """(point path, general path) results of one text and parameters."""
    fast = db.sql(sql, params)
    general = db.sql(sql, params, access="index")
    return fast, general


def same(fast, general):
    assert fast.rows() == general.rows()
    assert str(fast.plan) == str(general.plan)
    assert fast.warnings == general.warnings
    assert fast.access == general.access == "index"
    assert set(fast.timings) == {"plan", "fetch"}


def test_try_point_answers_only_point_queries(tmp_path):
    with rtindex.open(tmp_path / "db") as db:
        c = db.create_collection("c", shards=2)
        c.ingest([{"_id": i, "k": i % 3, "tags": ["x"] if i < 2 else []} for i in range(30)])
        texts = ["SELECT * FROM c WHERE k = 1", "SELECT * FROM c WHERE ARRAY_CONTAINS(tags, 'x')",
                 "SELECT * FROM c WHERE k = 1 LIMIT 9", "SELECT k FROM c WHERE k = 1", "SELECT COUNT(*) AS n FROM c",
                 "SELECT * FROM nope WHERE k = 1"]
        for text in texts:  # a text not run before is not parsed here: no row count bounds that work
            assert db.try_point(text) is None
        for text in texts[:-1]:
            db.sql(text)
        with pytest.raises(SqlError, match="no collection 'nope'"):
            db.sql(texts[-1])
        assert db.try_point("SELECT * FROM c WHERE k = 1", max_rows=64).rows() == db.sql("SELECT * FROM c WHERE k = 1").rows()
        assert len(db.try_point("SELECT * FROM c WHERE ARRAY_CONTAINS(tags, 'x')")) == 2
        assert db.try_point("SELECT * FROM c WHERE k = 1", max_rows=9) is None  # 10 rows
        assert db.try_point("SELECT * FROM c WHERE k = 1 LIMIT 9", max_rows=9) is not None
        assert db.try_point("SELECT k FROM c WHERE k = 1") is None  # not a point query
        assert db.try_point("SELECT COUNT(*) AS n FROM c") is None
        with pytest.raises(SqlError):
            db.sql("SELECT * FROM c WHERE k = :v")
        with pytest.raises(SqlError):
            db.try_point("SELECT * FROM c WHERE k = :v")  # its parameter missing
        with pytest.raises(SqlError, match="no collection 'nope'"):  # as sql() says it
            db.try_point("SELECT * FROM nope WHERE k = 1")


def test_the_point_shape():
    def point(sql):
        return parse_query(sql).point is not None
    assert point("SELECT * FROM c WHERE a = :v")
    assert point("SELECT * FROM c WHERE a.b = 3 LIMIT 2 OFFSET 1")
    assert point("SELECT * FROM c WHERE ARRAY_CONTAINS(tags, 'x')")
    assert not point("SELECT a FROM c WHERE a = 1")  # a projection: the planner may scan
    assert not point("SELECT * FROM c WHERE a > 1")
    assert not point("SELECT * FROM c WHERE a = 1 AND b = 2")
    assert not point("SELECT * FROM c WHERE a = 1 ORDER BY b")
    assert not point("SELECT * EXCLUDE (b) FROM c WHERE a = 1")
    assert not point("SELECT * FROM c")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=DOCS, path=PATHS, value=SCALARS, contains=st.booleans(), limit=st.sampled_from([None, 0, 1, 3]),
       offset=st.sampled_from([None, 0, 2]), delete=st.sets(st.integers(0, 39), max_size=5),
       seal=st.booleans())
def test_point_path_equals_general_path(tmp_path_factory, docs, path, value, contains, limit, offset, delete, seal):
    with rtindex.open(str(tmp_path_factory.mktemp("db")), seal_rows=8) as db:
        c = db.create_collection("c", shards=2)
        c.ingest([{"_id": i, **d} for i, d in enumerate(docs)])
        for i in delete:
            c.delete(i)
        if seal:
            c.flush()
        where = f"ARRAY_CONTAINS({path}, :v)" if contains else f"{path} = :v"
        sql = f"SELECT * FROM c WHERE {where}"
        params = {"v": value}
        if limit is not None:
            sql += " LIMIT :n"
            params["n"] = limit
        if offset is not None:
            sql += f" OFFSET {offset}"
        same(*both(db, sql, params))
        small = db.try_point(sql, params, max_rows=3)
        expected = db.sql(sql, params)
        if len(expected) <= 3:
            same(small, expected)
        else:
            assert small is None  # more rows than max_rows: left to sql()


def test_rows_are_the_users_copies(db):
    c = db.create_collection("c")
    c.ingest([{"_id": 1, "a": 1, "tags": ["x"], "o": {"p": [1]}}])
    first = db.sql("SELECT * FROM c WHERE a = 1").rows()[0]
    first["o"]["p"].append(2)
    first["tags"].clear()
    assert db.sql("SELECT * FROM c WHERE ARRAY_CONTAINS(tags, 'x')").rows() == [
        {"_id": 1, "_event_time": first["_event_time"], "a": 1, "tags": ["x"], "o": {"p": [1]}}]


def test_writes_are_seen_at_once(db):
    c = db.create_collection("c")
    assert db.sql("SELECT * FROM c WHERE a = 1").rows() == []
    c.ingest([{"_id": "x", "a": 1}])
    assert [r["_id"] for r in db.sql("SELECT * FROM c WHERE a = 1").rows()] == ["x"]
    c.ingest([{"_id": "x", "a": 2}])
    assert db.sql("SELECT * FROM c WHERE a = 1").rows() == []
    assert [r["a"] for r in db.sql("SELECT * FROM c WHERE a = 2").rows()] == [2]


def test_errors_are_the_general_paths(db):
    db.create_collection("c").ingest([{"a": 1}])
    with pytest.raises(SqlError, match="no value for parameter :v"):
        db.sql("SELECT * FROM c WHERE a = :v", {})
    with pytest.raises(SqlError, match="cannot compare a field with a value of type list"):
        db.sql("SELECT * FROM c WHERE a = :v", {"v": [1]})
    with pytest.raises(SqlError, match="LIMIT and OFFSET take a non-negative integer"):
        db.sql("SELECT * FROM c WHERE a = 1 LIMIT :n", {"n": -1})
    with pytest.raises(SqlError, match="no collection 'd'"):
        db.sql("SELECT * FROM d WHERE a = 1")


def test_warnings_name_a_missing_field(db):
    db.create_collection("c").ingest([{"lang": "en"}])
    fast, general = both(db, "SELECT * FROM c WHERE LANG = 'en'", None)
    same(fast, general)
    assert fast.warnings and "lang" in fast.warnings[0]


def test_max_result_bytes_refuses_as_the_general_path_does(tmp_path):
    with rtindex.open(str(tmp_path / "db"), max_result_bytes=2_000) as db:
        c = db.create_collection("c")
        c.ingest([{"_id": i, "k": i % 2, "pad": "x" * 300} for i in range(40)])
        small = db.sql("SELECT * FROM c WHERE k = 1 LIMIT 1")  # measured: under the budget
        assert [r["k"] for r in small.rows()] == [1]
        for sql in ("SELECT * FROM c WHERE k = 1 LIMIT 3",  # measured: over it
                    "SELECT * FROM c WHERE k = 1"):  # 20 rows: estimated from a sample
            res = db.sql(sql)
            with pytest.raises(ResultTooLargeError):
                res.rows()
            assert sum(b.num_rows for b in res.arrow_reader(batch_size=4)) == (3 if "LIMIT" in sql else 20)
