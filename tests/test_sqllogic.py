"""rtindex's own SQL logic tests: every record of tests/sqllogic/*.test on every engine.

A test per record and engine, named ``file.test:line-engine``: ``index`` and ``scan`` force
rtindex's access paths, ``duckdb`` runs the record in DuckDB over native tables (the oracle
the expected results were checked against, so a wrong expectation fails there). The data
statements before a record are loaded once per file and engine, in file order; the format
and the loading rules are in tests/sqllogic.py and docs/sql.md.
"""

from __future__ import annotations

import dataclasses
import pathlib
from decimal import Decimal

import pytest
import sqllogic

FILES = sorted((pathlib.Path(__file__).parent / "sqllogic").glob("*.test"))
RECORDS = {f.name: sqllogic.parse_file(f) for f in FILES}


def _cases():
    for name, records in RECORDS.items():
        for n, rec in enumerate(records):
            if rec.loads_data:
                continue
            for engine in sqllogic.ENGINES:
                marks = []
                if ("duckdb" if engine == "duckdb" else "rtindex") in rec.skip:
                    marks.append(pytest.mark.skip(reason=f"not run on {engine} (skipif/onlyif)"))
                elif engine in rec.xfail:
                    marks.append(pytest.mark.xfail(reason=rec.xfail[engine], strict=True))
                yield pytest.param(name, n, engine, id=f"{rec.id}-{engine}", marks=marks)


class _Loaded:
    """An engine with the data statements of one file applied up to some record."""

    def __init__(self, engine, name: str):
        self.engine, self.name, self.applied = engine, name, 0  # records [0, applied) seen

    def advance(self, upto: int) -> None:
        for rec in RECORDS[self.name][self.applied:upto]:
            if rec.loads_data:
                try:
                    self.engine.load(rec.sql)
                except Exception as e:
                    raise AssertionError(f"loading {rec.id} failed: {type(e).__name__}: {e}") from e
        self.applied = max(self.applied, upto)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(file, "rtindex" | "duckdb") -> _Loaded; rebuilt when a record comes before the
    data already loaded (tests run out of file order)."""
    loaded: dict[tuple[str, str], _Loaded] = {}

    def get(name: str, kind: str, upto: int) -> _Loaded:
        have = loaded.get((name, kind))
        records = RECORDS[name]
        if have is not None and any(r.loads_data for r in records[upto:have.applied]):
            have.engine.close()
            have = None
        if have is None:
            engine = (sqllogic.DuckdbEngine() if kind == "duckdb"
                      else sqllogic.RtindexEngine(str(tmp_path_factory.mktemp("sqllogic") / "db")))
            have = loaded[(name, kind)] = _Loaded(engine, name)
        have.advance(upto)
        return have

    yield get
    for have in loaded.values():
        have.engine.close()


@pytest.mark.parametrize(("name", "n", "engine"), list(_cases()))
def test_record(engines, name, n, engine):
    rec = RECORDS[name][n]
    loaded = engines(name, "duckdb" if engine == "duckdb" else "rtindex", n)
    other_path = sqllogic.check(rec, loaded.engine, engine)
    if other_path is not None:
        pytest.skip(f"rtindex cannot run this query on the {engine} path ({other_path}): checked on the other one")


# ------------------------------------------------------------------ the runner itself

RUNNER_TEST = """\
statement ok
CREATE TABLE t(_id INTEGER, a INTEGER, s VARCHAR)

statement ok
INSERT INTO t VALUES (1, 2, 'x'), (2, NULL, '')

statement ok
INSERT INTO t(_id) VALUES (3)

# xfail scan: why
onlyif rtindex
query IT rowsort
SELECT a, s FROM t
----
2\tx
NULL\t(empty)
NULL
NULL
"""


@pytest.fixture
def runner_file(tmp_path):
    path = tmp_path / "runner.test"
    path.write_text(RUNNER_TEST)
    return sqllogic.parse_file(path)


def test_records_are_parsed_with_conditions_and_annotations(runner_file):
    query = runner_file[-1]
    assert (query.id, query.types, query.sort, query.skip) == ("runner.test:12", "IT", "rowsort", {"duckdb"})
    assert query.xfail == {"scan": "why"}
    assert query.expected == ["2", "x", "NULL", "(empty)", "NULL", "NULL"]  # tab-separated and one per line
    assert [r.loads_data for r in runner_file] == [True, True, True, False]


def test_null_is_an_explicit_null_and_a_left_out_column_is_missing(tmp_path, runner_file):
    engine = sqllogic.RtindexEngine(str(tmp_path / "db"))
    try:
        for rec in runner_file[:-1]:
            engine.load(rec.sql)
        t = engine.db.collection("t")
        assert t.get(2)["a"] is None and t.get(2)["s"] == ""
        assert "a" not in t.get(3) and "s" not in t.get(3)
        assert sqllogic.check(runner_file[-1], engine, "index") is None
        wrong = dataclasses.replace(runner_file[-1], expected=["2", "x", "NULL", "(empty)", "NULL", "x"])
        with pytest.raises(AssertionError, match="wrong result"):
            sqllogic.check(wrong, engine, "index")
        star = dataclasses.replace(runner_file[-1], sql="SELECT * FROM t", types="IITI")
        assert "SELECT *" in sqllogic.check(star, engine, "scan")  # the scan path cannot: says why
    finally:
        engine.close()


@pytest.mark.parametrize(("value", "kind", "text"), [
    (7, "I", "7"), (Decimal(16), "I", "16"), (2.5, "R", "2.500"), (Decimal("1.25"), "R", "1.250"),
    (float("-inf"), "R", "-inf"), ("", "T", "(empty)"), ("7", "T", "7"), (None, "T", "NULL"), (None, "I", "NULL"),
])
def test_values_print_the_sqllogictest_way(value, kind, text):
    assert sqllogic.format_value(value, kind) == text


@pytest.mark.parametrize(("value", "kind"), [(7, "T"), ("7", "I"), (7, "R"), (2.5, "I"), (True, "I"), (True, "T")])
def test_a_value_of_another_type_than_its_column_fails(value, kind):
    with pytest.raises(AssertionError, match=f"a {kind} column holds"):
        sqllogic.format_value(value, kind)


def test_a_bad_record_names_its_line(tmp_path):
    path = tmp_path / "bad.test"
    path.write_text("query X\nSELECT 1\n----\n1\n")
    with pytest.raises(sqllogic.SqlLogicError, match="bad.test:1"):
        sqllogic.parse_file(path)
