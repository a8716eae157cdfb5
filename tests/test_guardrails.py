"""Guard rails: the result budget and Result.arrow_reader(), rtindex.open's signature, SQL
syntax errors in the user's words, JSON Patch errors that name the path."""

from __future__ import annotations

import inspect
import tracemalloc

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rtindex
from rtindex import ResultTooLargeError, SchemaError, SqlError
from rtindex.database import Database
from rtindex.sql import frames

N = 20_000


def _doc(i: int) -> dict:
    return {"_id": i, "k": i % 10, "text": f"event {i} " + "x" * 200, "n": i if i < N // 2 else i + 0.5,
            "mixed": i if i % 1000 else f"s{i}", "tags": [i % 3, i % 5], "o": {"a": i % 7},
            "_event_time": 1_700_000_000_000_000 + i}


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    """A database of N documents (~270 bytes of JSON each), built once; tests open it."""
    p = str(tmp_path_factory.mktemp("guardrails") / "db")
    with rtindex.open(p) as db:
        db.create_collection("ev").ingest(_doc(i) for i in range(N))
        db["ev"].flush()
    return p


@pytest.fixture
def opened(path):
    dbs = []

    def _open(**opts):
        db = rtindex.open(path, **opts)
        dbs.append(db)
        return db
    yield _open
    for db in dbs:
        db.close()


QUERIES = [  # (sql, access path it takes)
    ("SELECT * FROM ev", "index"),  # documents
    ("SELECT * EXCEPT (text) FROM ev WHERE k < 8", "index"),
    ("SELECT _id, text, tags FROM ev", "index"),  # a plain projection (tags: arrays, so the index path)
    ("SELECT _id, text, n, mixed, _event_time FROM ev", "scan"),
    ("SELECT _id, text, tags FROM ev ORDER BY _id DESC", "index"),  # DuckDB over the index path's frame
    ("SELECT *, n * 2 AS n2 FROM ev ORDER BY n DESC", "index"),  # documents, ordered by DuckDB
]


def _sorted(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: r["_id"])


@pytest.mark.parametrize("sql,access", QUERIES)
def test_a_result_over_the_budget_is_refused_and_streams_whole(opened, sql, access):
    unlimited = opened(max_result_bytes=None)
    full = unlimited.sql(sql)
    expected = full.arrow()
    assert full.access == access and expected.num_rows > 10_000
    unlimited.close()
    small = opened(max_result_bytes=100_000)
    res = small.sql(sql)  # sql() itself does not refuse: the rows are never built
    assert res.access == access and len(res) == expected.num_rows
    for read in (res.rows, res.arrow, res.df, lambda: list(res)):
        with pytest.raises(ResultTooLargeError) as e:
            read()
    err = e.value
    assert isinstance(err, SqlError) and err.rows == expected.num_rows and err.max_result_bytes == 100_000
    assert err.size_bytes > 100_000 and err.sql == sql
    assert f"{expected.num_rows:,} rows" in str(err) and "LIMIT" in str(err) and "arrow_reader()" in str(err)
    reader = res.arrow_reader(batch_size=4096)
    assert isinstance(reader, pa.RecordBatchReader)
    batches = list(reader)
    assert len(batches) >= 3 and all(b.num_rows <= 4096 + 4096 for b in batches)
    streamed = pa.Table.from_batches(batches, schema=reader.schema)
    assert streamed.schema == expected.schema  # typed as arrow() types the whole result
    if "ORDER BY" in sql:
        assert streamed.to_pylist() == expected.to_pylist()
    else:
        assert _sorted(streamed) == _sorted(expected)
    assert res.columns == expected.column_names


def test_the_stream_types_columns_by_all_their_values(opened):
    """``n`` is an int in the first half and a float in the second; ``mixed`` is mostly int,
    sometimes a string: one type for the whole stream, whichever batch shows it first."""
    db = opened(max_result_bytes=1000)
    schema = db.sql("SELECT * FROM ev").arrow_reader(1000).schema
    assert schema.field("n").type == pa.float64() and schema.field("mixed").type == pa.large_string()
    assert schema.field("_event_time").type == pa.timestamp("us", tz="UTC")
    assert schema.field("tags").type == pa.list_(pa.int64()) and schema.field("o").type == pa.struct([("a", pa.int64())])


def test_refusing_spends_no_memory_and_streaming_is_bounded(opened):
    db = opened(max_result_bytes=1 << 20, row_cache_bytes=0)  # no cache: what is measured is ours
    tracemalloc.start()
    try:
        res = db.sql("SELECT * FROM ev")
        refused_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        rows = 0
        for batch in res.arrow_reader(batch_size=500):
            rows += batch.num_rows
        stream_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows == N
    db.close()
    tracemalloc.start()
    try:
        everything = opened(max_result_bytes=None, row_cache_bytes=0).sql("SELECT * FROM ev").rows()
        full_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(everything) == N
    assert refused_peak < full_peak / 20, (refused_peak, full_peak)
    assert stream_peak < full_peak / 5, (stream_peak, full_peak)


def test_results_within_the_budget_are_as_before(opened):
    db = opened(max_result_bytes=100_000)
    res = db.sql("SELECT * FROM ev WHERE k = 3 LIMIT 20")
    assert len(res.rows()) == 20 and res.arrow().num_rows == 20
    assert db.sql("SELECT k, COUNT(*) AS c FROM ev GROUP BY k ORDER BY k").rows()[0] == {"k": 0, "c": N // 10}
    assert sum(b.num_rows for b in db.sql("SELECT _id FROM ev WHERE k = 1").arrow_reader(100)) == N // 10
    # a small result of big rows is measured, not estimated
    db.close()
    with pytest.raises(ResultTooLargeError) as e:
        opened(max_result_bytes=2_000).sql("SELECT * FROM ev LIMIT 10").rows()
    assert not e.value.estimated and e.value.rows == 10


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1MB"])
def test_max_result_bytes_is_positive_or_none(tmp_path, bad):
    with pytest.raises(ValueError, match="max_result_bytes"):
        rtindex.open(str(tmp_path / "db"), max_result_bytes=bad)


def test_closing_the_database_ends_an_open_stream(path):
    db = rtindex.open(path, max_result_bytes=1000)
    reader = db.sql("SELECT _id, text FROM ev").arrow_reader(2048)  # the scan path: DuckDB streams
    assert reader.read_next_batch().num_rows > 0
    db.close()  # does not wait for the reader
    with pytest.raises(rtindex.ClosedError):
        for _ in reader:
            pass


# -- typing a stream as a whole result is typed ---------------------------------------------
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1),
                   st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3),
                   st.lists(st.integers(-5, 5), max_size=2), st.fixed_dictionaries({}, optional={
                       "a": st.integers(-5, 5), "b": st.text(max_size=2)}))


ROWS = st.lists(st.fixed_dictionaries({}, optional={"a": VALUES, "b": VALUES, "_event_time": st.one_of(
    st.none(), st.integers(0, 4_000_000_000_000_000))}), max_size=12)  # _event_time: microseconds, as stored


@given(rows=ROWS, chunk=st.integers(1, 5))
def test_rows_reader_types_as_rows_table(rows, chunk):
    expected = frames.rows_table(rows)
    reader = frames.rows_reader(lambda: (rows[i:i + chunk] for i in range(0, len(rows), chunk)))
    got = reader.read_all()
    assert got.schema == expected.schema
    assert got.to_pylist() == expected.to_pylist()


# -- rtindex.open's signature -------------------------------------------------------------------
def test_open_has_database_s_signature_and_documents_every_option():
    opened_sig = inspect.signature(rtindex.open)
    init = inspect.signature(Database.__init__)
    assert list(opened_sig.parameters.values()) == list(init.parameters.values())[1:]  # less self
    assert all(p.kind is p.KEYWORD_ONLY for name, p in opened_sig.parameters.items() if name != "path")
    for name in opened_sig.parameters:
        assert f"``{name}``" in rtindex.open.__doc__, name


# -- SQL syntax errors ----------------------------------------------------------------------------
TYPOS = [  # (sql, what the message must say, the text at .position)
    ("SELEC * FROM ev", "syntax error near 'SELEC': did you mean SELECT?", "SELEC"),
    ("SELECT * FORM ev", "near 'FORM': did you mean FROM?", "FORM"),
    ("SELECT * FROM ev WHRE k = 1", "near 'WHRE': did you mean WHERE?", "WHRE"),
    ("SELECT k FROM ev GROUP k", "near 'GROUP': did you mean GROUP BY?", "GROUP"),
    ("SELECT k FROM ev ORDER k", "near 'ORDER': did you mean ORDER BY?", "ORDER"),
    ("SELECT * FROM ev LIMT 5", "did you mean LIMIT?", "LIMT"),
    ("SELECT k FROM ev HAVNG COUNT(*) > 1", "did you mean HAVING?", "HAVNG"),
    ("SELECT * FROM ev WHERE text = 'abc", "unterminated string starting at line 1, column 31", "'abc"),
    ('SELECT "k FROM ev', 'unterminated quoted name starting at line 1, column 8', '"k'),
    ("SELECT *\nFROM ev\nWHERE text = 'it''s", "unterminated string starting at line 3, column 14", "'it"),
    ("SELECT * FROM ev /* note", "unterminated comment starting at line 1, column 18", "/*"),
    ("SELECT COUNT(* FROM ev", "unbalanced parenthesis: this '(' is never closed", "("),
    ("SELECT * FROM ev WHERE k IN (1, 2", "unbalanced parenthesis: this '(' is never closed", "("),
    ("SELECT k) FROM ev", "unbalanced parenthesis: this ')' closes nothing", ")"),
    ("SELECT * FROM ev WHERE", "the query ends too early, after 'WHERE'", "WHERE"),
    ("SELECT * FROM ev WHERE k = 1 AND", "the query ends too early, after 'AND'", "AND"),
    ("SELECT * FROM", "the query ends too early, after 'FROM'", "FROM"),
    ("SELECT * FROM ev WHERE k = = 1", "syntax error near '='", "="),
    ("SELECT * FROM ev WHERE k = ? AND k = = 1", "syntax error near '='", "= 1"),
    ("SELECT * FROM ev WHERE k = 1 AND k =", "the query ends too early, after '='", "="),
    ("SELECT COUNT(*) FROM ev GROUP BY", "GROUP BY names nothing to group by", "GROUP BY"),
    ("SELECT COUNT(*) FROM ev a, ev b GROUP BY", "GROUP BY names nothing to group by", "GROUP BY"),
    ("SELECT COUNT(*) FROM ev group by LIMIT 3", "GROUP BY names nothing to group by", "group by"),
]


@pytest.mark.parametrize("sql,message,at", TYPOS)
def test_syntax_errors_name_what_the_user_wrote(opened, sql, message, at):
    db = opened()
    with pytest.raises(SqlError) as e:
        db.sql(sql, [1] if "?" in sql else None)
    text = str(e.value)
    assert message in text, text
    assert "sqlglot" not in text and "<class" not in text and "Required keyword" not in text
    assert e.value.sql == sql and e.value.position is not None
    assert sql[e.value.position:].startswith(at), (e.value.position, text)


# -- JSON Patch errors ---------------------------------------------------------------------------
PATCHES = [  # (operations, what the message must say)
    ([{"op": "remove", "path": "/a/b"}], "patch operation 0 (remove /a/b): path /a/b does not exist in the document"),
    ([{"op": "replace", "path": "/nope", "value": 1}], "path /nope does not exist in the document"),
    ([{"op": "add", "path": "/q/r", "value": 1}], "path /q does not exist in the document, so /q/r cannot be added"),
    ([{"op": "add", "path": "/x", "value": 1}, {"op": "remove", "path": "/list/7"}],
     "patch operation 1 (remove /list/7): path /list/7 does not exist in the document (an array of 3 items)"),
    ([{"op": "add", "path": "/a/c/d", "value": 1}], "path /a/c/d goes through /a/c, which holds a number"),
    ([{"op": "move", "from": "/gone", "path": "/a/z"}], "from: path /gone does not exist in the document"),
    ([{"op": "test", "path": "/a/c", "value": 2}], "the value at /a/c is not the tested value"),
    ([{"op": "frobnicate", "path": "/a"}], "patch operation 0: Unknown operation 'frobnicate'"),
    ([{"op": "remove", "path": "a"}], "a path is a JSON Pointer"),
    ({"op": "remove", "path": "/a"}, "a JSON Patch is a list of operations"),
]


@pytest.mark.parametrize("ops,message", PATCHES)
def test_patch_errors_name_the_path_not_the_document(db, ops, message):
    coll = db.create_collection("p")
    doc = {"_id": "d", "a": {"c": 1}, "list": [1, 2, 3], "secret": "s3cret " * 1000}
    coll.ingest([doc])
    with pytest.raises(SchemaError) as e:
        coll.patch("d", ops)
    assert message in str(e.value)
    assert "s3cret" not in str(e.value) and len(str(e.value)) < 300
    assert e.value.__cause__ is None and (e.value.__context__ is None or e.value.__suppress_context__)  # no document
    assert coll.get("d")["list"] == [1, 2, 3] and "x" not in coll.get("d")  # nothing was applied


def test_the_service_refuses_a_result_over_its_max_result_bytes(tmp_path):
    """``rtindex serve --limit max_result_bytes=N``: its query processes open the database with
    that budget, so a large result is refused (413, naming the limit) before it is built."""
    from tests.serving import Served

    s = Served(str(tmp_path / "db"), "--limit", "max_result_bytes=50000")
    try:
        with s.client() as c:
            c.post("/v1/collections", json={"name": "ev", "shards": 2})
            fence = c.post("/v1/collections/ev/docs", json=[_doc(i) for i in range(2_000)]).json()["fence"]
            for sql in ("SELECT * FROM ev", "SELECT _id, text FROM ev"):  # the index path; the column scan
                r = c.post("/v1/query", json={"sql": sql, "min_fence": fence})
                assert r.status_code == 413, r.text
                assert r.json()["limit"] == "max_result_bytes" and "2000 rows" in r.json()["message"]
            r = c.post("/v1/query", json={"sql": "SELECT _id FROM ev WHERE k = 3 LIMIT 5", "min_fence": fence})
            assert r.status_code == 200 and len(r.json()["rows"]) == 5
            bad = c.patch("/v1/collections/ev/docs/7", json=[{"op": "remove", "path": "/o/zz"}])
            assert bad.status_code == 400 and "path /o/zz does not exist in the document" in bad.json()["message"]
            assert "xxxxx" not in bad.json()["message"]  # not the document
    finally:
        assert s.stop() == 0, "".join(s.output)
