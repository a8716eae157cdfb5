"""benchmarks/sqllogic_suite.py: SQLite's sqllogictest format, its result hash, and the
classification of a file's queries, on small inline files (the suite itself is not needed).

The md5 constants were computed outside Python (``printf '1\\n2\\n' | md5sum``).
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from benchmarks import sqllogic_suite as slt

FORMAT = """\
hash-threshold 4

statement ok
CREATE TABLE t1(a INTEGER)

onlyif sqlite # SQLite's own syntax
query I nosort
SELECT 1 FROM t1 NOT INDEXED
----
1

skipif mysql # another engine's known difference: still runs here
query II rowsort label-7
SELECT a, a*10 FROM t1
----
6 values hashing to eec09b499a9f85c0bf4b07134d807d7a

# a comment between records
query I nosort
SELECT a FROM t1
----
1
2

onlyif mssql
halt

halt

query I nosort
SELECT 1
----
1
"""


def test_records_are_parsed_with_conditions_hashes_and_halt():
    records = slt.parse(FORMAT)
    assert [(r.line, r.kind) for r in records] == [(3, "statement"), (13, "query"), (19, "query"), (28, "halt"),
                                                    (30, "query")]
    hashed, plain = records[1], records[2]
    assert (hashed.types, hashed.sort, hashed.hashed, hashed.values) == (
        "II", "rowsort", (6, "eec09b499a9f85c0bf4b07134d807d7a"), None)
    assert (plain.sql, plain.values, plain.hashed) == ("SELECT a FROM t1", ["1", "2"], None)


def test_the_hash_is_md5_of_each_value_and_a_newline():
    assert slt.md5_of(["1", "2"]) == "6ddb4095eb719e2a9f0a3f95677d24e0"
    rows = [(3, 30), (1, 10), (2, 20)]
    assert slt.md5_of(slt.result_values(rows, "II", "rowsort")) == "eec09b499a9f85c0bf4b07134d807d7a"


@pytest.mark.parametrize(("value", "kind", "text"), [
    (None, "I", "NULL"), (7, "I", "7"), (2.9, "I", "2"), (-2.9, "I", "-2"), (True, "I", "1"), ("12abc", "I", "12"),
    ("abc", "I", "0"), (Decimal(16), "I", "16"), (1, "R", "1.000"), (2.0005, "R", "2.001"), (Decimal("1.25"), "R", "1.250"),
    ("", "T", "(empty)"), ("a\tb", "T", "a@b"), ("é", "T", "@"), (7, "T", "7"), (2.0, "T", "2.0"), (2.5, "T", "2.5"),
])
def test_values_print_as_sqllogictest_prints_sqlite_s(value, kind, text):
    assert slt.format_value(value, kind) == text


def test_rowsort_sorts_rows_and_valuesort_values_as_strings():
    rows = [(10, 1), (9, 2)]
    assert slt.result_values(rows, "II", "rowsort") == ["10", "1", "9", "2"]
    assert slt.result_values(rows, "II", "valuesort") == ["1", "10", "2", "9"]
    assert slt.result_values(rows, "II", "nosort") == ["10", "1", "9", "2"]


def test_an_even_sample_of_queries():
    assert slt.choose(10, None) == set(range(10))
    assert slt.choose(10, 4) == {0, 2, 5, 7}
    assert slt.choose(3, 5) == {0, 1, 2}


CLASSIFY = """\
statement ok
CREATE TABLE t1(a INTEGER, b TEXT)

statement ok
INSERT INTO t1 VALUES(1, 'x'), (2, 'y')

statement ok
INSERT INTO t1(a) SELECT a + 2 FROM t1 WHERE a = 1

statement ok
CREATE INDEX t1a ON t1(a)

statement ok
CREATE VIEW v1 AS SELECT a FROM t1

query II rowsort
SELECT a, a*10 FROM t1
----
3 values hashing to 0a3b5a1b8dd1c9e2e3c9bd3e0f1b11a4

query II rowsort
SELECT a, a*10 FROM t1
----
6 values hashing to eec09b499a9f85c0bf4b07134d807d7a

query I nosort
SELECT a FROM t1 ORDER BY a/2, a DESC
----
1
3
2

query I nosort
SELECT COUNT(*) FROM read_csv('t1.csv')
----
0

query I nosort
SELECT a FROM v1
----
1
2
3

statement ok
DELETE FROM t1 WHERE a = 2

query IT rowsort
SELECT a, b FROM t1
----
1
x
3
NULL
"""


def test_each_query_is_classified(tmp_path, capsys):
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "c.test").write_text(CLASSIFY)
    out = slt.main(["--suite", str(tmp_path), "--files", "test/*.test"])
    printed = capsys.readouterr().out
    assert json.loads(printed.splitlines()[-1]) == out
    assert "1 x the same values in another order; the query divides" in printed
    # the first query's hash is wrong on purpose, and DuckDB agrees with rtindex: DuckDB's semantics
    # (so is `a/2`, float division in DuckDB, integer division in SQLite, which orders 3 before 2);
    # a table function is outside the sandbox: refused
    assert {k: out[k] for k in ("queries", "correct", "duckdb_semantics", "refused", "wrong", "error")} == {
        "queries": 5, "correct": 2, "duckdb_semantics": 2, "refused": 1, "wrong": 0, "error": 0}
    assert out["skipped"] == 2  # CREATE VIEW, and the query of the view


def test_a_missing_suite_says_what_to_give(tmp_path):
    with pytest.raises(SystemExit, match="checkout of sqllogictest"):
        slt.main(["--suite", str(tmp_path / "nowhere")])
