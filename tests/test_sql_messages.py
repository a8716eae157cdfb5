"""Errors and warnings a user can act on: in the words of the query, never of the machinery.

An ``UnsupportedSqlError`` names the construct as it was written (``function string_agg``,
``'a + b'``), not sqlglot's node (GROUP_CONCAT, ADD), and points at it; a DuckDB error about
the statement rtindex generated names the user's fields (never the frame's ``f0`` or the
scan's ``c0``) and says what to do; a valid query that almost surely asks the wrong thing
(a field no document has, a WHERE on an output alias) runs, with ``Result.warnings`` (and
a "warnings" key in the service's reply) saying so. Real RocksDB, DuckDB and server.
"""

from __future__ import annotations

import concurrent.futures as cf
import re

import orjson
import pyarrow as pa
import pytest
import sqlglot
from sqlglot import exp

import rtindex
from rtindex.errors import SqlError, UnsupportedSqlError
from rtindex.sql import messages
from rtindex.sql.syntax import MAX_DEPTH, MAX_NESTING
from tests.serving import module_service

INTERNAL = re.compile(r'\b(f\d+|c\d+|__pos|frame|GROUP_CONCAT|NULLSAFENEQ|BRACKET|COLUMN)\b')


@pytest.fixture
def t(db):
    t = db.create_collection("t", shards=1)
    t.ingest([{"_id": 1, "lang": "en", "m": 1, "s": "a", "k": 1, "device": {"os": "linux"}},
              {"_id": 2, "lang": "fr", "m": "x", "s": "b", "k": 2}])
    return t


@pytest.mark.parametrize("sql, node_type, construct, at", [
    ("SELECT string_agg(s, ',') FROM t", exp.GroupConcat, "function string_agg", "string_agg"),
    ("SELECT s FROM t WHERE a + b = 1", exp.Add, "'a + b'", "a + b"),
    ("SELECT s FROM t WHERE s IS DISTINCT FROM 'a'", exp.NullSafeNEQ, "'s IS DISTINCT FROM 'a''", "s IS"),
    ("SELECT m[1] FROM t", exp.Bracket, "'m[1]'", "m[1]"),
    ("SELECT lower(s) FROM t", exp.Lower, "function lower", "lower"),
])
def test_a_construct_is_named_as_written_and_pointed_at(sql, node_type, construct, at):
    node = next(sqlglot.parse_one(sql, read="duckdb").find_all(node_type))
    written, start = messages.as_written(node, sql, "INTERNAL", sql, lambda pos: pos)
    assert (written, start) == (construct, sql.index(at))


def test_an_unsupported_function_is_named_as_written_where_it_is(db, t):
    sql = "SELECT k FROM t WHERE k = 1\n  AND Read_Text('x') = 'a'"
    with pytest.raises(UnsupportedSqlError, match="function Read_Text") as e:
        db.sql(sql)
    assert e.value.position == sql.index("Read_Text") and "line 2, column 7" in str(e.value)
    with pytest.raises(UnsupportedSqlError, match="unsupported: Delete statement") as e:
        db.sql("  Delete FROM t WHERE k = 1")
    assert e.value.position == 2
    assert messages.keyword_position("distinct", "SELECT  DISTINCT a FROM t") == 8


@pytest.mark.parametrize("access", ["index", "scan"])
@pytest.mark.parametrize("sql, says", [
    ("SELECT SUM(m) AS total FROM t", "TRY_CAST"),  # m holds a number and a string: text
    ("SELECT s, COUNT(*) AS n FROM t GROUP BY k", "column s must appear in the GROUP BY"),
    ("SELECT k FROM t GROUP BY k HAVING s = 'a'", "column s must appear in the GROUP BY"),
    ("SELECT CAST(s AS BIGINT) AS n FROM t", "source column s: use TRY_CAST"),
    ("SELECT lower(k) AS l FROM t", "CAST the arguments"),
])
def test_duckdb_errors_name_the_users_fields(db, t, access, sql, says):
    with pytest.raises(SqlError) as e:
        db.sql(sql, access=access)
    assert says in str(e.value) and not INTERNAL.search(str(e.value)), str(e.value)
    assert e.value.sql == sql


def test_a_mixed_field_summed_over_rows_of_one_type_is_no_error(db, t):
    for access in ("index", "scan"):
        assert db.sql("SELECT SUM(m) AS total FROM t WHERE k = 1", access=access).rows() == [{"total": 1}]


def test_an_unknown_internal_name_is_never_shown():
    text = messages.duckdb_error('Binder Error: Referenced column "f7" not found in FROM clause!', {})
    assert "f7" not in text and "a column" in text
    assert messages.duckdb_error("Out of Memory Error: could not allocate", {}).startswith("Out of Memory Error")
    assert "rtindex cannot run this query" in messages.duckdb_error('Parser Error: syntax error at or near "BY"', {})


def test_warnings_for_a_field_no_document_has(db, t):
    res = db.sql("SELECT LANG FROM t")
    assert res.rows() == [{"LANG": None}, {"LANG": None}]
    assert len(res.warnings) == 1 and "LANG" in res.warnings[0] and "did you mean lang?" in res.warnings[0]
    res = db.sql("SELECT COUNT(*) AS n FROM t WHERE device.oss = 'linux'")
    assert "did you mean device.os?" in res.warnings[0]
    assert db.sql("SELECT lang, device.os FROM t WHERE k = 1").warnings == []
    assert db.sql("SELECT * FROM t").warnings == []
    db.create_collection("empty")
    assert db.sql("SELECT anything FROM empty").warnings == []  # no documents: nothing is a typo yet


def test_a_path_through_an_array_warns_and_names_the_form_that_works(db):
    """tags.k below an array of objects is NULL there (docs/sql.md, rule 1) while the index
    holds the elements' terms: the warning says so and the form it names finds the rows."""
    c = db.create_collection("arr")
    c.ingest([{"_id": "a", "tags": [{"k": "x"}, {"k": "y"}]}, {"_id": "b", "tags": [{"k": "z"}]},
              {"_id": "c", "o": {"k": "x"}}])
    for sql in ("SELECT _id FROM arr WHERE tags.k = 'x'", "SELECT _id FROM arr WHERE ARRAY_CONTAINS(tags.k, 'x')"):
        res = db.sql(sql, access="index")
        assert res.rows() == [] and len(res.warnings) == 1, res.warnings
        assert res.warnings[0].startswith("tags.k goes through tags, which holds arrays")
        assert db.sql(sql, access="scan").warnings == res.warnings
    hint = res.warnings[0].split("unnest them: ", 1)[1]
    assert hint == "SELECT ... FROM (SELECT *, UNNEST(tags) AS e FROM arr) WHERE e.k = ..."
    assert db.sql("SELECT _id FROM (SELECT *, UNNEST(tags) AS e FROM arr) WHERE e.k = 'x'").rows() == [{"_id": "a"}]
    assert db.sql("SELECT _id FROM arr WHERE o.k = 'x'").warnings == []  # objects only: no warning


@pytest.mark.parametrize("sql, rows, says", [
    ("SELECT _id FROM lit WHERE retweet_count = '0'", [],
     "retweet_count holds numbers and '0' is a string, so retweet_count = '0' is never TRUE (docs/sql.md, rule 2): "
     "write retweet_count = 0"),
    ("SELECT _id FROM lit WHERE lang > 5", [],
     "lang holds strings and 5 is a number, so lang > 5 is never TRUE (docs/sql.md, rule 2): write lang > '5'"),
    ("SELECT _id FROM lit WHERE _event_time > 1409444955", [{"_id": "a"}, {"_id": "b"}],
     "_event_time is a time, and 1409444955 compares with it as microseconds since 1970: for seconds write "
     "_event_time > TIMESTAMP_SECONDS(1409444955), for milliseconds TIMESTAMP_MILLIS(1409444955)"),
    ("SELECT _id FROM lit WHERE retweet_count = 0", [{"_id": "a"}], None),
    ("SELECT _id FROM lit WHERE lang = 'en'", [{"_id": "a"}], None),
    ("SELECT _id FROM lit WHERE _event_time > TIMESTAMP_SECONDS(1409444955)", [{"_id": "b"}], None),
])
def test_a_literal_of_another_type_than_the_field_says_what_to_write(db, sql, rows, says):
    if "lit" not in db:
        db.create_collection("lit").ingest([
            {"_id": "a", "retweet_count": 0, "lang": "en", "_event_time": 1409444955_000000},
            {"_id": "b", "retweet_count": 3, "lang": "fr", "_event_time": 1409444956_000000}])
    res = db.sql(sql + " ORDER BY _id")
    assert res.rows() == rows
    assert res.warnings == ([says] if says else [])


def test_warnings_are_worked_out_again_when_documents_arrive(db, t):
    """They are remembered per query text until rows are written (every query asked the
    column store about every field it names: a quarter of a selective query's time)."""
    assert "did you mean lang?" in db.sql("SELECT LANG FROM t").warnings[0]
    assert "did you mean lang?" in db.sql("SELECT LANG FROM t").warnings[0]  # remembered
    t.ingest([{"_id": 3, "LANG": "de"}])
    assert db.sql("SELECT LANG FROM t").warnings == []
    t.flush()  # sealed segments answer from their own memo
    assert db.sql("SELECT LANG FROM t").warnings == []
    assert "the field LANGS" in db.sql("SELECT LANGS FROM t").warnings[0]


def test_a_warning_for_where_on_an_output_alias(db, t):
    res = db.sql("SELECT k * 2 AS twice FROM t WHERE twice > 1")
    assert res.rows() == [] and "output alias twice" in res.warnings[0] and "HAVING" in res.warnings[0]


def _chain(op: str, n: int, term: str) -> str:
    return f" {op} ".join(term.format(i=i) for i in range(n))


@pytest.mark.parametrize("sql, says", [
    ("SELECT " + "(" * (MAX_NESTING + 1) + "k" + ")" * (MAX_NESTING + 1) + " AS v FROM t",
     f"more than {MAX_NESTING} deep"),
    ("SELECT k FROM " + "(SELECT k FROM " * 89 + "t" + ") s" * 89, f"more than {MAX_NESTING} deep"),
    ("SELECT * FROM t WHERE " + _chain("OR", 990, "k = {i}"), "write `x IN (...)`"),
    ("SELECT " + _chain("+", 990, "k") + " AS v FROM t", f"more than {MAX_DEPTH} deep"),
    ("SELECT t.k FROM t JOIN t AS u ON t._id = u._id WHERE " + _chain("AND", 400, "t.k <> {i}"),
     f"more than {MAX_DEPTH} deep"),
])
def test_nesting_past_the_limits_is_refused_naming_them(db, t, sql, says):
    with pytest.raises(SqlError, match=re.escape(says)):
        db.sql(sql)


# what sqlglot's parser recurses into besides parentheses, each nested n deep: "{}" is where
# the next level goes (prefix operators, CASE, arrays, structs, subscripts, nested types)
RECURSIVE = {
    "NOT": ("SELECT k FROM t WHERE {}", "NOT {}", "k = 1"),
    "minus": ("SELECT {} AS v FROM t", "- {}", "k"),
    "CASE": ("SELECT {} AS v FROM t", "CASE WHEN k > 0 THEN {} ELSE 0 END", "k"),
    "array": ("SELECT {} AS v FROM t", "[{}]", "k"),
    "struct": ("SELECT {} AS v FROM t", "{{'a': {}}}", "k"),
    "subscript": ("SELECT {} AS v FROM t", "{}[1]", "s"),  # a string's first character, again and again
    "STRUCT type": ("SELECT CAST(NULL AS {}) AS v FROM t", "STRUCT<a {}>", "INT"),
    "NOT (": ("SELECT k FROM t WHERE {}", "NOT ({})", "k = 1"),
}


def _nested(kind: str, n: int) -> str:
    query, level, inner = RECURSIVE[kind]
    for _ in range(n):
        inner = level.format(inner)
    return query.format(inner)


@pytest.mark.parametrize("kind", RECURSIVE)
@pytest.mark.parametrize("n", [MAX_NESTING + 1, 5_000])
def test_every_construct_the_parser_recurses_into_counts_toward_the_limit(db, t, kind, n):
    """Nested past MAX_NESTING, each is refused naming the limit (never a RecursionError: a
    500 from the service), at once (a long chain of subscripts is slow for sqlglot to parse)."""
    with pytest.raises(SqlError, match=f"more than {MAX_NESTING} deep") as e:
        db.sql(_nested(kind, n))
    assert e.value.position is not None


def test_a_construct_nested_up_to_the_limit_runs(db, t):
    """The deepest nesting the check lets through, of each kind (a NOT before a parenthesis
    weighs on it: both recurse), runs in a worker thread as in the service."""
    deepest = {kind: MAX_NESTING for kind in RECURSIVE}
    deepest.update({"STRUCT type": MAX_NESTING - 1, "NOT (": MAX_NESTING // 2})
    with cf.ThreadPoolExecutor(1) as pool:
        for kind, n in deepest.items():
            pool.submit(lambda: db.sql(_nested(kind, n)).rows()).result()
            with pytest.raises(SqlError, match=f"more than {MAX_NESTING} deep"):
                db.sql(_nested(kind, n + 1))


@pytest.mark.parametrize("sql, value", [("SELECT 0 .x AS v FROM t", "0"), ("SELECT 0 .json .json é", "0"),
                                        ("SELECT k FROM t WHERE 1.5 .x = 2", "1.5"), ("SELECT 'a' .x", "'a'"),
                                        ("SELECT -1 .x", "1"), ("SELECT TRUE .x AS v FROM t", "TRUE")])
def test_a_field_of_a_literal_is_refused(db, t, sql, value):
    """``0 .x`` asks for a field of a number: refused naming it (its text for DuckDB,
    ``0.x``, would read as the number 0. named x, or not read back at all)."""
    with pytest.raises(UnsupportedSqlError, match=re.escape(f"a field of the value {value}")) as e:
        db.sql(sql)
    assert e.value.position is not None
    assert db.sql("SELECT {'a': 1}.a AS v").rows() == [{"v": 1}]  # a struct has fields


def test_a_query_too_deep_for_the_parser_is_refused(db, t, monkeypatch):
    """Nesting that check_nesting does not count and the parser cannot take: a SqlError (a
    400 from the service), not the RecursionError (a 500)."""
    def too_deep(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")
    monkeypatch.setattr(sqlglot, "parse", too_deep)
    with pytest.raises(SqlError, match="nests too deep to be read"):
        db.sql("SELECT k FROM t WHERE k = 31337")


def test_nesting_up_to_the_limits_runs_on_every_path(db, t):
    """Every code path that recurses (parser, planner, small-query compiler, DuckDB text)
    takes the deepest query the limits let through."""
    deep = MAX_DEPTH - 6  # the chain's terms under SELECT and WHERE
    for sql in ("SELECT " + "(" * MAX_NESTING + "k" + ")" * MAX_NESTING + " AS v FROM t",
                "SELECT k FROM " + "(SELECT k FROM " * (MAX_NESTING - 1) + "t" + ") s" * (MAX_NESTING - 1),
                "SELECT * FROM t WHERE " + _chain("OR", deep, "k = {i}"),
                "SELECT " + _chain("+", deep, "k") + " AS v FROM t",
                "SELECT SUM(" + _chain("+", deep, "k") + ") AS v FROM t GROUP BY s",
                "SELECT t.k FROM t JOIN t AS u ON t._id = u._id WHERE " + _chain("OR", deep, "t.k = {i}")):
        db.sql(sql)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from module_service(tmp_path_factory.mktemp("srv"))


def test_the_service_replies_with_the_warnings(served):
    with served.client() as c:
        assert c.post("/v1/collections", json={"name": "w", "shards": 1}).status_code == 201
        fence = c.post("/v1/collections/w/docs", json=[{"_id": 1, "lang": "en"}]).json()["fence"]
        body = c.post("/v1/query", json={"sql": "SELECT LANG FROM w", "min_fence": fence}).json()
        assert body["rows"] == [{"LANG": None}] and "did you mean lang?" in body["warnings"][0]
        assert "warnings" not in c.post("/v1/query", json={"sql": "SELECT lang FROM w"}).json()
        a = c.post("/v1/query", json={"sql": "SELECT LANG, COUNT(*) AS n FROM w GROUP BY LANG"},
                   headers={"Accept": "application/vnd.apache.arrow.stream"})
        assert pa.ipc.open_stream(a.content).read_all().num_rows == 1
        assert "did you mean lang?" in orjson.loads(a.headers["x-rtindex-stats"])["warnings"][0]
    with rtindex.connect(served.url, api_key=served.admin_key) as remote:
        assert "did you mean lang?" in remote.sql("SELECT LANG FROM w").warnings[0]
        deep = "SELECT " + "(" * 42 + "1" + ")" * 42 + " AS v FROM w"  # a 500 before the limit
        with served.client() as c:
            r = c.post("/v1/query", json={"sql": deep})
            assert r.status_code == 400 and f"more than {MAX_NESTING} deep" in r.json()["message"]
        assert remote.sql("SELECT lang FROM w").warnings == []


def test_a_sum_beyond_64_bits_says_how_to_keep_it(tmp_path):
    with rtindex.open(str(tmp_path / "db")) as db:
        db.create_collection("t", shards=1).ingest([{"_id": 1, "x": 2**62}, {"_id": 2, "x": 2**62}])
        for access in ("index", "scan"):
            with pytest.raises(rtindex.SqlError, match=r"does not fit 64 bits; CAST\(SUM\(x\) AS DOUBLE\)"):
                db.sql("SELECT SUM(x) AS s FROM t WHERE x > 0", access=access).rows()
        assert db.sql("SELECT CAST(SUM(x) AS DOUBLE) AS s FROM t").rows() == [{"s": 2.0**63}]
