"""db.sql / db.explain: the dialect, the type rules of docs/sql.md, errors, the sandbox,
access paths and snapshot consistency. The differential test against DuckDB is
test_sql_differential.py."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest

import rtindex
from rtindex import SqlError, UnsupportedSqlError

DOCS = [
    {"_id": 1, "n": 1, "s": "apple", "o": {"x": 10, "name": "a"}, "tags": ["red", "green"], "we.ird": 1},
    {"_id": 2, "n": 2.5, "s": "apricot", "o": {"x": 20}, "tags": ["green"]},
    {"_id": 3, "n": "3", "s": "banana", "o": None, "tags": []},
    {"_id": 4, "n": None, "s": "berry", "tags": None},
    {"_id": 5, "s": "cherry", "o": {"x": [1, 2]}, "tags": "red"},
    {"_id": 6, "n": [1, 3], "s": "date", "o": {"x": 30, "name": "b"}},
    {"_id": 7, "n": 7, "s": 7, "a": [{"b": 1}, {"b": 2}]},
]
ACCESS = [None, "index", "scan"]


@pytest.fixture
def fruit(db):
    c = db.create_collection("fruit", shards=2)
    c.ingest(DOCS[:4])
    c.flush()  # some rows sealed, some in memory
    c.ingest(DOCS[4:])
    return db


def ids(db, sql, params=None, access=None):
    return sorted(r["_id"] for r in db.sql(sql, params, access=access))


@pytest.mark.parametrize("access", ACCESS)
@pytest.mark.parametrize("where, expected", [
    ("n = 1", [1]),
    ("n = 1.0", [1]),
    ("n > 1", [2, 7]),  # "3" is a string, [1, 3] an array: neither compares with a number
    ("n <> 1", [2, 7]),
    ("NOT n = 1", [2, 7]),
    ("n = '3'", [3]),
    ("n IS NULL", [4, 5]),  # null and missing
    ("n IS NOT NULL", [1, 2, 3, 6, 7]),
    ("IS_MISSING(n)", [5]),
    ("NOT IS_MISSING(n) AND n IS NULL", [4]),
    ("n IN (1, 7, 'x')", [1, 7]),
    ("NOT n IN (1, 7)", [2]),
    ("n BETWEEN 2 AND 7", [2, 7]),
    ("n NOT BETWEEN 2 AND 7", [1]),
    ("s LIKE 'ap%'", [1, 2]),
    ("s LIKE 'banana'", [3]),
    ("NOT s LIKE 'b%'", [1, 2, 5, 6]),  # 7's s is a number: unknown
    ("s >= 'b' AND s < 'c'", [3, 4]),
    ("o.x = 20", [2]),
    ("o.x > 5 OR s = 'cherry'", [1, 2, 5, 6]),
    ("o.x = 1", []),  # o.x is an array in document 5: compare with ARRAY_CONTAINS
    ("o.name IS NULL", [2, 3, 4, 5, 7]),
    ("ARRAY_CONTAINS(tags, 'red')", [1]),  # document 5's tags is a string, not an array
    ("NOT ARRAY_CONTAINS(tags, 'red')", [2, 3]),
    ("ARRAY_CONTAINS(o.x, 2)", [5]),
    ("a.b = 1", []),  # below an array there is no single value
    ("IS_MISSING(a.b)", [1, 2, 3, 4, 5, 6, 7]),
    ('"we.ird" = 1', [1]),
    ("_id IN (2, 3) OR _id > 6", [2, 3, 7]),
    ("fruit.s = 'date'", [6]),
])
def test_where(fruit, where, expected, access):
    assert ids(fruit, f"SELECT _id FROM fruit WHERE {where}", access=access) == expected


def test_alias_nested_paths_and_quoted_names(fruit):
    rows = fruit.sql('SELECT f._id, f.o.x AS ox, "we.ird" FROM fruit AS f WHERE f._id = 1').rows()
    assert rows == [{"_id": 1, "ox": 10, "we.ird": 1}]


def test_select_star_and_except(fruit):
    (row,) = fruit.sql("SELECT * FROM fruit WHERE _id = 2").rows()
    assert {k: v for k, v in row.items() if k != "_event_time"} == DOCS[1]
    (row,) = fruit.sql("SELECT * EXCEPT (o, tags, _event_time) FROM fruit WHERE _id = 2").rows()
    assert row == {"_id": 2, "n": 2.5, "s": "apricot"}


def test_star_with_order_limit_offset(fruit):
    res = fruit.sql("SELECT *, _id * 10 AS y FROM fruit WHERE _id <= 6 ORDER BY _id DESC LIMIT 2 OFFSET 1")
    assert [(r["_id"], r["y"], r["s"]) for r in res] == [(5, 50, "cherry"), (4, 40, "berry")]
    res = fruit.sql("SELECT * FROM fruit WHERE o.x >= 10 ORDER BY o.x DESC LIMIT 1")
    assert [r["_id"] for r in res] == [6]


@pytest.mark.parametrize("access", ACCESS)
def test_aggregates(fruit, access):
    res = fruit.sql("SELECT COUNT(*) AS c, COUNT(o.x) AS cx, COUNT(DISTINCT o.name) AS d, SUM(o.x) AS s, "
                    "AVG(o.x) AS a, MIN(o.x) AS lo, MAX(s) AS hi FROM fruit WHERE _id < 5 OR _id = 6",
                    access=access)
    (row,) = res.rows()
    assert row["c"] == 5 and row["cx"] == 3 and row["d"] == 2
    assert row["s"] == 60 and row["a"] == 20.0 and row["lo"] == 10 and row["hi"] == "date"


@pytest.mark.parametrize("access", ACCESS)
def test_group_by_having_order(fruit, access):
    res = fruit.sql("SELECT SUBSTR_FREE_KEY, COUNT(*) AS c FROM fruit".replace("SUBSTR_FREE_KEY", "o.name")
                    + " GROUP BY o.name HAVING COUNT(*) >= 1 ORDER BY c DESC, o.name NULLS LAST", access=access)
    assert res.rows() == [{"o.name": None, "c": 5}, {"o.name": "a", "c": 1}, {"o.name": "b", "c": 1}]


def test_cast_and_try_cast(fruit):
    rows = fruit.sql("SELECT _id, TRY_CAST(n AS BIGINT) AS i, CAST(o.x AS DOUBLE) AS x FROM fruit "
                     "WHERE _id IN (1, 3, 7) ORDER BY _id").rows()
    # n holds ints, floats, strings, arrays: as one column it is text ("3", "[1,3]", ...)
    assert rows == [{"_id": 1, "i": 1, "x": 10.0}, {"_id": 3, "i": 3, "x": None}, {"_id": 7, "i": 7, "x": None}]


def test_unnest(fruit):
    rows = fruit.sql("SELECT _id, UNNEST(tags) AS tag FROM fruit WHERE _id <= 3 ORDER BY _id, tag").rows()
    assert rows == [{"_id": 1, "tag": "green"}, {"_id": 1, "tag": "red"}, {"_id": 2, "tag": "green"}]


def test_event_time_is_a_timestamp(db):
    c = db.create_collection("ev")
    t = dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc)
    c.ingest([{"_id": 1, "_event_time": t}, {"_id": 2, "_event_time": t + dt.timedelta(hours=1)}])
    for access in ACCESS:
        res = db.sql("SELECT _id, _event_time FROM ev WHERE _event_time > :t", {"t": t}, access=access)
        assert res.rows() == [{"_id": 2, "_event_time": t + dt.timedelta(hours=1)}]


def test_results_as_arrow_and_pandas(fruit):
    res = fruit.sql("SELECT _id, s FROM fruit WHERE _id < 3")
    assert res.columns == ["_id", "s"]
    assert sorted(res.arrow().column("_id").to_pylist()) == [1, 2]
    assert sorted(res.df()["s"]) == ["apple", "apricot"]
    assert len(res) == 2 and len(list(res)) == 2
    empty = fruit.sql("SELECT _id, s FROM fruit WHERE _id = 99")
    assert empty.rows() == [] and empty.arrow().num_rows == 0


def test_parameters_are_values_not_sql(fruit):
    assert ids(fruit, "SELECT _id FROM fruit WHERE s = :s OR n = :n", {"s": "apple", "n": 7}) == [1, 7]
    assert ids(fruit, "SELECT _id FROM fruit WHERE s = ? OR _id BETWEEN ? AND ?", ["date", 1, 2]) == [1, 2, 6]
    assert ids(fruit, "SELECT _id FROM fruit WHERE s = :s", {"s": "x' OR '1'='1"}) == []
    # a parameter first inside nested parentheses (sqlglot once read it as a prefix alias)
    assert ids(fruit, "SELECT _id FROM fruit WHERE ((:v = n AND :v = n) OR s = 'date')", {"v": 7}) == [6, 7]
    assert ids(fruit, "SELECT _id FROM fruit WHERE ((? = n) OR s = ?)", [7, "date"]) == [6, 7]
    rows = fruit.sql("SELECT _id, o.x * :k AS y FROM fruit WHERE _id = ? ".replace("?", ":i"), {"k": 2, "i": 1}).rows()
    assert rows == [{"_id": 1, "y": 20}]
    assert len(fruit.sql("SELECT _id FROM fruit WHERE _id > ? LIMIT ?", [0, 2])) == 2


@pytest.mark.parametrize("sql, params, match", [
    ("SELECT _id FROM fruit WHERE s = :s", None, "pass a dict"),
    ("SELECT _id FROM fruit WHERE s = :s", {"t": 1}, "no value for parameter :s"),
    ("SELECT _id FROM fruit WHERE s = ?", [], "1 \\? parameter"),
    ("SELECT _id FROM fruit WHERE s = ? AND n = :n", {"n": 1}, "not both"),
    ("SELECT _id FROM fruit", {"x": 1}, "has none"),
    ("SELECT _id FROM fruit WHERE s = :s", {"s": object()}, "type object"),
    ("SELECT _id FROM fruit WHERE s LIKE :p", {"p": "%an%"}, "literal prefix"),
    ("SELECT _id FROM fruit LIMIT :n", {"n": -1}, "non-negative"),
])
def test_bad_parameters(fruit, sql, params, match):
    with pytest.raises(SqlError, match=match):
        fruit.sql(sql, params)


@pytest.mark.parametrize("sql, construct", [
    ("SELECT _id FROM fruit JOIN other ON a = b", "no collection 'other'"),
    ("SELECT x.s FROM (fruit AS a CROSS JOIN fruit AS b) AS x", "named parenthesized join"),
    ("SELECT _id FROM fruit WHERE IS_MISSING(n) OR lower(s) = 'x'", "IS_MISSING where DuckDB evaluates it"),
    ("SELECT current_setting('home_directory')", "(?i)function current_setting"),
    ("SELECT _id FROM fruit, read_csv('x.csv')", "READ_CSV"),
    ("WITH c AS (SELECT * FROM read_parquet('x.parquet')) SELECT * FROM c", "READ_PARQUET"),
    ("SELECT o.x FROM fruit a, fruit b", "nested field o.x"),
])
def test_unsupported_constructs_name_the_construct(fruit, sql, construct):
    with pytest.raises(SqlError, match=construct) as e:
        fruit.sql(sql)
    assert e.value.sql == sql


@pytest.mark.parametrize("access", ACCESS)
@pytest.mark.parametrize("sql, expected", [  # refused before the WHERE split (tests/test_sql_residual.py)
    ("SELECT DISTINCT o.x FROM fruit WHERE o.x > 0 ORDER BY 1", [{"o.x": 10}, {"o.x": 20}, {"o.x": 30}]),
    ("SELECT _id FROM fruit WHERE s LIKE '%an%' ORDER BY _id", [{"_id": 3}]),
    ("SELECT _id FROM fruit WHERE _id IN (SELECT _id + 1 FROM fruit WHERE s = 'apple')", [{"_id": 2}]),
    ("SELECT _id, ROW_NUMBER() OVER (ORDER BY _id DESC) AS r FROM fruit WHERE _id < 3 ORDER BY _id",
     [{"_id": 1, "r": 2}, {"_id": 2, "r": 1}]),
    ("SELECT MEDIAN(o.x) AS m FROM fruit WHERE o.x > 0", [{"m": 20.0}]),
])
def test_constructs_refused_before_now_answer(fruit, sql, expected, access):
    assert fruit.sql(sql, access=access).rows() == expected


@pytest.mark.parametrize("sql, params, expected", [
    ("SELECT 1 + 1 AS two", None, [{"two": 2}]),
    ("SELECT ? * 2 AS x", [21], [{"x": 42}]),
    ("SELECT n FROM (VALUES (1), (2)) AS v(n) ORDER BY n DESC", None, [{"n": 2}, {"n": 1}]),
])
def test_a_select_without_a_collection_runs_in_duckdb_alone(fruit, sql, params, expected):
    res = fruit.sql(sql, params)
    assert res.rows() == expected and res.access == "none"
    assert "query over no collection" in str(fruit.explain(sql, params))


def test_a_parenthesized_join_first_in_from_is_a_join(fruit):
    sql = "SELECT a._id AS x, b._id AS y FROM (fruit AS a JOIN fruit AS b ON a._id + 1 = b._id) ORDER BY x"
    assert fruit.sql(sql).rows() == fruit.sql(sql.replace("(fruit AS a", "fruit AS a").replace("b._id) ORDER", "b._id ORDER")).rows()
    assert fruit.sql(sql).rows()[0] == {"x": 1, "y": 2}


def test_errors_carry_a_position(fruit):
    sql = "SELECT _id,\n  read_text('x') FROM fruit"
    with pytest.raises(UnsupportedSqlError) as e:
        fruit.sql(sql)
    assert e.value.position == sql.index("read_text") and "line 2, column 3" in str(e.value)
    with pytest.raises(SqlError, match="syntax error") as e:
        fruit.sql("SELECT FROM WHERE")
    assert e.value.position is not None
    with pytest.raises(SqlError, match="no collection 'nope'"):
        fruit.sql("SELECT * FROM nope")


@pytest.mark.parametrize("sql", ["SELECT n FROM fruit TABLESAMPLE 10%", "SELECT COUNT(*) AS c FROM fruit TABLESAMPLE 1 ROWS",
                                 "SELECT n FROM fruit USING SAMPLE 10%"])
def test_sampling_is_refused_not_ignored(fruit, sql):
    """TABLESAMPLE on a collection was dropped without a word: every row came back."""
    with pytest.raises(UnsupportedSqlError, match="SAMPLE"):
        fruit.sql(sql)


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM '/etc/passwd'",
    "SELECT read_blob('/etc/passwd') FROM fruit",
    "COPY (SELECT 1) TO '/tmp/rtindex-copy-test.csv'",
    "ATTACH '/tmp/rtindex-attach-test.db' AS x",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET threads = 1",
    "PRAGMA version",
    "CALL pragma_version()",
    "SELECT 1 FROM fruit; SELECT 2 FROM fruit",
    "SELECT _id FROM fruit; DROP TABLE fruit",
    "SELECT * FROM duckdb_settings()",
    "SELECT _id FROM fruit WHERE s = (SELECT content FROM read_text('/etc/passwd'))",
])
def test_no_file_extension_or_setting_access(fruit, sql, tmp_path):
    with pytest.raises(SqlError):
        fruit.sql(sql)
    import os
    assert not os.path.exists("/tmp/rtindex-copy-test.csv") and not os.path.exists("/tmp/rtindex-attach-test.db")


def test_plain_index_queries_never_start_duckdb(tmp_path):
    with rtindex.open(str(tmp_path / "d")) as db:
        db.create_collection("t").ingest(DOCS)
        assert len(db.sql("SELECT * FROM t WHERE s = 'apple'")) == 1
        assert len(db.sql("SELECT _id, o.x FROM t WHERE ARRAY_CONTAINS(tags, 'green') LIMIT 5")) == 2
        assert db._sql._duck is None
        db.sql("SELECT COUNT(*) FROM t")  # a few rows' aggregate: Arrow compute (sql/small.py)
        assert db._sql._duck is None
        db.sql("SELECT COUNT(DISTINCT s) FROM t")
        assert db._sql._duck is not None


def test_explain_shows_the_choice_and_numbers(db):
    c = db.create_collection("big", shards=2)
    c.ingest([{"_id": i, "k": i % 100, "v": i} for i in range(5000)])
    plan = db.explain("SELECT SUM(v) FROM big WHERE k = :k", {"k": 5})
    assert plan.access == "index" and plan.matched_rows == 50 and plan.total_rows == 5000
    assert plan.predicates == (("k = 5", 50),)
    text = str(plan)
    assert "index path" in text and "50 rows" in text and "DuckDB: WITH" in text
    # the index path reads v from the column store at the 50 matched rows, not whole documents
    assert plan.by_column and "fields: read from the column store at the matched rows" in text
    wide = db.explain("SELECT SUM(v) FROM big WHERE v >= 0")
    assert wide.access == "scan" and "DuckDB: WITH" in str(wide)
    assert db.sql("SELECT SUM(v) AS s FROM big WHERE v >= 0").rows() == [{"s": sum(range(5000))}]
    forced = db.sql("SELECT SUM(v) AS s FROM big WHERE v >= 0", access="index")
    assert forced.access == "index" and forced.rows() == [{"s": sum(range(5000))}]


def test_plan_cache_is_bounded(db):
    db.create_collection("t").ingest([{"a": 1}])
    cache = db._sql._plans
    cache.size = 8
    for i in range(20):
        db.sql(f"SELECT a FROM t WHERE a = {i}")
    assert len(cache) == 8


def test_one_snapshot_per_query_under_concurrent_upserts(db):
    """A writer replaces every document 40 times (a == b == version) while queries run; a
    query must see each _id exactly once, with a == b."""
    c = db.create_collection("live", shards=3)
    n = 300
    c.ingest([{"_id": i, "a": 0, "b": 0} for i in range(n)])
    stop = threading.Event()
    errors = []

    def writer():
        for v in range(1, 41):  # bounded work: with 64-row segments every round seals and merges
            if stop.is_set():
                break
            c.ingest([{"_id": i, "a": v, "b": v} for i in range(n)], batch_size=37)
            time.sleep(0.01)

    t = threading.Thread(target=writer)
    t.start()
    try:
        for k in range(60):
            access = ACCESS[k % 3]
            rows = db.sql("SELECT _id, a, b FROM live", access=access).rows()
            if sorted(r["_id"] for r in rows) != list(range(n)) or any(r["a"] != r["b"] for r in rows):
                errors.append((access, len(rows)))
            (agg,) = db.sql("SELECT COUNT(*) AS c, COUNT(DISTINCT _id) AS d FROM live WHERE a >= 0",
                            access=access).rows()
            if agg != {"c": n, "d": n}:
                errors.append((access, agg))
    finally:
        stop.set()
        t.join()
    assert not errors


@pytest.mark.parametrize("seal", [False, True])
def test_elements_versus_scalars_in_every_segment_kind(db, seal):
    """ARRAY_CONTAINS skips the array test in segments without scalars of that path: check
    both answers where scalars and arrays share a segment, in memory and sealed."""
    c = db.create_collection("mix", shards=1)
    c.ingest([{"_id": 1, "t": ["x", "y"]}, {"_id": 2, "t": "x"}, {"_id": 3, "t": [["x"]]},
              {"_id": 4, "t": [{"u": "x"}]}, {"_id": 5, "t": [1, "x"]}])
    if seal:
        c.flush()
    c.ingest([{"_id": 6, "t": ["x"]}])  # a segment with no scalar t: no array test needed
    assert ids(db, "SELECT _id FROM mix WHERE ARRAY_CONTAINS(t, 'x')") == [1, 3, 5, 6]
    assert ids(db, "SELECT _id FROM mix WHERE NOT ARRAY_CONTAINS(t, 'y')") == [3, 4, 5, 6]
    assert ids(db, "SELECT _id FROM mix WHERE t = 'x'") == [2]


def test_a_parameter_before_an_empty_string_at_the_end(db):
    """sqlglot's tokenizer refused ``$p ... ''`` when the empty string ended the text (the
    form parameters are given to it in): found by the differential test."""
    db.create_collection("pe").ingest([{"_id": 1, "i": 1, "s": "ab"}, {"_id": 2, "i": 2, "s": ""}])
    assert sorted(r["i"] for r in db.sql("SELECT i FROM pe WHERE s = ? OR s LIKE ''", ["ab"]).rows()) == [1, 2]
    assert db.sql("SELECT i FROM pe WHERE s = :a OR s = ''", {"a": "zz"}).rows() == [{"i": 2}]
    union = "SELECT i AS v FROM pe WHERE NOT (s BETWEEN ? AND ?) UNION SELECT i FROM pe WHERE s LIKE ''"
    assert sorted(r["v"] for r in db.sql(union, ["a'b", "ba"]).rows()) == [2]


def test_array_contains_null_is_false_only_for_an_array_without_elements(db):
    """As DuckDB's list_contains: comparing an element with NULL is UNKNOWN, and an array
    with no element has nothing to be unknown about (found by the differential test)."""
    db.create_collection("an").ingest([{"_id": 1, "tags": []}, {"_id": 2, "tags": ["a"]}, {"_id": 3, "tags": None},
                                       {"_id": 4}, {"_id": 5, "tags": [[]]}, {"_id": 6, "tags": "x"},
                                       {"_id": 7, "tags": [None]}])
    for value in ("NULL", ":v"):
        params = {"v": None} if value == ":v" else None
        ids = lambda where: sorted(r["_id"] for r in db.sql(f"SELECT _id FROM an WHERE {where}", params).rows())
        assert ids(f"ARRAY_CONTAINS(tags, {value})") == []
        assert ids(f"NOT ARRAY_CONTAINS(tags, {value})") == [1, 5]
    assert sorted(r["_id"] for r in db.sql("SELECT _id FROM an WHERE NOT ARRAY_CONTAINS(tags, 'a')").rows()) == [1, 5, 7]
