"""Rockset compatibility: workspace-qualified collection names and the time functions
RockBench's evaluator uses (docs/sql.md, "Rockset compatibility"), on real databases and
on both access paths."""

from __future__ import annotations

import datetime as dt
import json

import pytest

import rtindex
from rtindex import SqlError, UnsupportedSqlError

ACCESS = [None, "index", "scan"]
UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)

# exactly what RockBench's evaluator sends (with its generator id)
ROCKBENCH = ('select UNIX_MICROS(max(_event_time)) as ts from "commons"."bench" where generator_identifier = '
             "'DPRzvn4A4r' and _event_time > TIMESTAMP_SECONDS(1795472272)")
WINDOW = 1795472272  # seconds


def us(seconds: int, micros: int = 0) -> int:
    return seconds * 1_000_000 + micros


# -- workspaces -------------------------------------------------------------------------------
def test_workspace_collection_through_every_spelling(db):
    c = db.create_collection("ws.coll", shards=2)
    assert c.name == "ws.coll" and db.collection_names() == ["ws.coll"] and "ws.coll" in db
    c.ingest([{"_id": i, "x": i} for i in range(10)])
    db.create_collection("coll").ingest([{"_id": 1, "x": 100}])  # the same name, default workspace
    for src in ('"ws"."coll"', "ws.coll", '"ws.coll"', 'ws."coll"'):
        for access in ACCESS:
            rows = db.sql(f"SELECT SUM(x) AS s FROM {src} WHERE x >= 5", access=access).rows()
            assert rows == [{"s": 35}], (src, access)
        # fields qualified by the collection, with or without its workspace, or by an alias
        got = db.sql(f"SELECT coll.x AS a, ws.coll.x AS b FROM {src} WHERE coll.x = 3").rows()
        assert got == [{"a": 3, "b": 3}], src
        assert db.sql(f"SELECT e.x FROM {src} e WHERE e.x = 4").rows() == [{"x": 4}]
    assert db.sql("SELECT x FROM coll").rows() == [{"x": 100}]


def test_commons_is_the_default_workspace(db):
    db.create_collection("bench").ingest([{"_id": 1, "x": 1}, {"_id": 2, "x": 2}])
    for src in ("bench", '"bench"', "commons.bench", '"commons"."bench"', '"commons.bench"', 'commons."bench"'):
        for access in ACCESS:
            assert db.sql(f"SELECT COUNT(*) AS n FROM {src} WHERE x > 0", access=access).rows() == [{"n": 2}]
        assert db.sql(f"SELECT bench.x FROM {src} WHERE commons.bench.x = 2").rows() == [{"x": 2}]
    assert db.collection("commons.bench") is db["bench"] and "commons.bench" in db
    assert db.collection_names() == ["bench"]
    db.drop_collection("commons.bench")
    assert db.collection_names() == [] and "bench" not in db


def test_commons_prefix_is_refused_at_creation(db):
    with pytest.raises(ValueError, match=r"default workspace.*'coll'"):
        db.create_collection("commons.coll")
    with pytest.raises(ValueError, match="default workspace"):
        db.create_collection("commons.coll", exist_ok=True)
    assert db.collection_names() == []
    db.create_collection("coll")
    with pytest.raises(ValueError, match="default workspace"):  # not a second way to reach it either
        db.create_collection("commons.coll", exist_ok=True)


@pytest.mark.parametrize("name", ["a.b.c", ".a", "a.", "a..b", "1a.b", "a.1b", "ws/coll", "ws. coll", "-a.b",
                                  "a" * 129, "ws." + "b" * 129, "a" * 129 + ".b", "a" * 120 + "." + "b" * 120,
                                  "", "../etc", "ws.c$", None, 5])
def test_invalid_names(db, name):
    with pytest.raises(ValueError, match=r"invalid collection name .*workspace\.collection"):
        db.create_collection(name)
    assert db.collection_names() == []


def test_longest_names_and_reopening(tmp_path):
    path = str(tmp_path / "db")
    long = "w" * 111 + "." + "c" * 128  # 240 characters: the most a name may have
    with rtindex.open(path) as db:
        db.create_collection(long).ingest([{"_id": 1}])
        db.create_collection("_ws-1.my_coll-2", shards=3).ingest([{"_id": i} for i in range(9)])
        db.create_collection("my_coll-2").ingest([{"_id": "x"}])
    with rtindex.open(path) as db:  # names come back from the directory names
        assert db.collection_names() == ["_ws-1.my_coll-2", "my_coll-2", long]
        assert len(db["_ws-1.my_coll-2"]) == 9 and len(db[long]) == 1
        assert db.sql('SELECT COUNT(*) AS n FROM "_ws-1"."my_coll-2"').rows() == [{"n": 9}]
    with rtindex.open(path, role="reader") as r:  # a reader names files after the collections
        assert r.collection_names() == ["_ws-1.my_coll-2", "my_coll-2", long] and len(r[long]) == 1


def test_reader_follows_workspace_collections(tmp_path):
    path = str(tmp_path / "db")
    with rtindex.open(path, seal_rows=50) as w:
        w.create_collection("ws.a", shards=2).ingest([{"_id": i, "v": i} for i in range(80)])
        with rtindex.open(path, role="reader") as r:
            assert r.collection_names() == ["ws.a"] and len(r["ws.a"]) == 80
            w.create_collection("ws2.a").ingest([{"_id": 1, "v": 7}])
            r.refresh()
            assert r.collection_names() == ["ws.a", "ws2.a"]
            assert r.sql("SELECT v FROM ws2.a").rows() == [{"v": 7}]
            assert r.sql('SELECT MAX(v) AS m FROM "ws"."a"', access="scan").rows() == [{"m": 79}]
            w.drop_collection("ws.a")
            r.refresh()
            assert r.collection_names() == ["ws2.a"]


def test_from_errors(db):
    db.create_collection("ws.c")
    with pytest.raises(SqlError, match="no collection 'ws.nope'"):
        db.sql("SELECT x FROM ws.nope")
    with pytest.raises(SqlError, match="no collection 'other.c'"):
        db.sql('SELECT x FROM "other"."c"')
    with pytest.raises(UnsupportedSqlError, match="catalog"):
        db.sql("SELECT x FROM cat.ws.c")


# -- the RockBench evaluator's query ---------------------------------------------------------
@pytest.fixture
def bench(db):
    """Two generators writing one event per second around WINDOW; some rows sealed."""
    c = db.create_collection("bench", shards=3)
    docs = []
    for i in range(-40, 40):
        gen = "DPRzvn4A4r" if i % 2 == 0 else "other-gen"
        docs.append({"_id": f"{gen}-{i}", "generator_identifier": gen, "_event_time": us(WINDOW + i, 123),
                     "payload": i})
    c.ingest(docs[:50])
    c.flush()
    c.ingest(docs[50:])
    return db


@pytest.mark.parametrize("access", ACCESS)
def test_rockbench_query(bench, access):
    res = bench.sql(ROCKBENCH, access=access)
    assert access is None or res.access == access
    rows = res.rows()
    assert rows == [{"ts": us(WINDOW + 38, 123)}]  # the newest DPRzvn4A4r event (even offsets)
    assert type(rows[0]["ts"]) is int and json.loads(json.dumps(rows)) == rows
    other = bench.sql(ROCKBENCH.replace("DPRzvn4A4r", "other-gen"), access=access).rows()
    assert other == [{"ts": us(WINDOW + 39, 123)}]  # per generator


@pytest.mark.parametrize("access", ACCESS)
def test_rockbench_query_is_null_when_nothing_is_in_the_window(bench, access):
    late = ROCKBENCH.replace(str(WINDOW), str(WINDOW + 40))
    assert bench.sql(late, access=access).rows() == [{"ts": None}]
    assert bench.sql(ROCKBENCH.replace("DPRzvn4A4r", "nobody"), access=access).rows() == [{"ts": None}]
    # the window is exclusive: an event exactly at TIMESTAMP_SECONDS(n) + 123 us is in, n + 39 s + 124 us not
    edge = ROCKBENCH.replace(str(WINDOW), str(WINDOW + 38))
    assert bench.sql(edge, access=access).rows() == [{"ts": us(WINDOW + 38, 123)}]


def test_rockbench_query_on_an_empty_collection(db):
    db.create_collection("bench")
    for access in ACCESS:
        assert db.sql(ROCKBENCH, access=access).rows() == [{"ts": None}]


@pytest.mark.parametrize("access", ACCESS)
@pytest.mark.parametrize("where, expected", [
    (f"_event_time > TIMESTAMP_SECONDS({WINDOW + 36})", [36, 37, 38, 39]),
    (f"TIMESTAMP_SECONDS({WINDOW + 36}) < _event_time", [36, 37, 38, 39]),
    (f"_event_time >= TIMESTAMP_MICROS({us(WINDOW + 37, 123)})", [37, 38, 39]),
    (f"_event_time < TIMESTAMP_MILLIS({(WINDOW - 38) * 1000})", [-40, -39]),
    (f"_event_time = TIMESTAMP_MICROS({us(WINDOW, 123)})", [0]),
    (f"_event_time BETWEEN TIMESTAMP_SECONDS({WINDOW}) AND TIMESTAMP_SECONDS({WINDOW + 2})", [0, 1]),
    (f"NOT _event_time <= TIMESTAMP_SECONDS({WINDOW + 37})", [37, 38, 39]),
    ("payload > UNIX_SECONDS(TIMESTAMP_SECONDS(37))", [38, 39]),
    ("payload = UNIX_MILLIS(TIMESTAMP_MICROS(-1))", [-1]),  # rounds down, as in SELECT
    ("_event_time > TIMESTAMP_SECONDS(NULL)", []),
    ("NOT _event_time > TIMESTAMP_SECONDS(NULL)", []),
    ("payload = UNIX_MICROS(NULL)", []),
])
def test_time_functions_in_where(bench, access, where, expected):
    rows = bench.sql(f"SELECT payload FROM bench WHERE {where}", access=access).rows()
    assert sorted(r["payload"] for r in rows) == expected


@pytest.mark.parametrize("access", ACCESS)
def test_time_functions_with_parameters(bench, access):
    q = "SELECT payload FROM commons.bench WHERE _event_time > TIMESTAMP_SECONDS(:t) AND payload < :p"
    assert bench.sql(q, {"t": WINDOW + 36, "p": 39}, access=access).rows() in ([{"payload": 36}, {"payload": 37},
                                                                                 {"payload": 38}],)
    assert bench.sql(q, {"t": None, "p": 39}, access=access).rows() == []
    q = "SELECT UNIX_MICROS(MAX(_event_time)) AS ts FROM bench WHERE _event_time < TIMESTAMP_SECONDS(?)"
    assert bench.sql(q, [WINDOW], access=access).rows() == [{"ts": us(WINDOW - 1, 123)}]


def test_time_function_errors(bench):
    with pytest.raises(SqlError, match="TIMESTAMP_SECONDS takes an integer, not str"):
        bench.sql("SELECT payload FROM bench WHERE _event_time > TIMESTAMP_SECONDS('x')")
    with pytest.raises(SqlError, match="TIMESTAMP_SECONDS takes an integer, not float"):
        bench.sql("SELECT payload FROM bench WHERE _event_time > TIMESTAMP_SECONDS(:t)", {"t": 1.5})
    with pytest.raises(SqlError, match="UNIX_MICROS takes a timestamp, not int"):
        bench.sql("SELECT payload FROM bench WHERE payload > UNIX_MICROS(5)")
    with pytest.raises(SqlError, match="outside the range"):
        bench.sql("SELECT payload FROM bench WHERE _event_time > TIMESTAMP_SECONDS(99999999999999)")
    with pytest.raises(SqlError, match="takes one argument"):
        bench.sql("SELECT TIMESTAMP_SECONDS(1, 2) FROM bench")
    with pytest.raises(SqlError, match="LIMIT"):
        bench.sql("SELECT payload FROM bench LIMIT UNIX_SECONDS(TIMESTAMP_SECONDS(3))")
    # a function of a field is no index predicate: DuckDB evaluates it over the frame
    assert len(bench.sql("SELECT payload FROM bench WHERE UNIX_MICROS(_event_time) > 5")) == len(bench.sql(
        "SELECT payload FROM bench WHERE _event_time > TIMESTAMP_MICROS(5)"))


# -- the functions in SELECT ------------------------------------------------------------------
@pytest.mark.parametrize("access", ACCESS)
def test_time_functions_in_select(bench, access):
    q = ("SELECT UNIX_MICROS(_event_time) AS us, UNIX_MILLIS(_event_time) AS ms, UNIX_SECONDS(_event_time) AS s, "
         "TIMESTAMP_SECONDS(payload) AS ts, TIMESTAMP_MILLIS(payload) AS tms, TIMESTAMP_MICROS(payload) AS tus, "
         "UNIX_MICROS(TIMESTAMP_SECONDS(payload)) AS back "
         "FROM bench WHERE payload IN (-3, 5) ORDER BY payload")
    rows = bench.sql(q, access=access).rows()
    assert rows == [
        {"us": us(WINDOW - 3, 123), "ms": (WINDOW - 3) * 1000, "s": WINDOW - 3,
         "ts": EPOCH - dt.timedelta(seconds=3), "tms": EPOCH - dt.timedelta(milliseconds=3),
         "tus": EPOCH - dt.timedelta(microseconds=3), "back": -3_000_000},
        {"us": us(WINDOW + 5, 123), "ms": (WINDOW + 5) * 1000, "s": WINDOW + 5,
         "ts": EPOCH + dt.timedelta(seconds=5), "tms": EPOCH + dt.timedelta(milliseconds=5),
         "tus": EPOCH + dt.timedelta(microseconds=5), "back": 5_000_000},
    ]
    # timestamps are comparable with _event_time in expressions, and round down before 1970
    q = (f"SELECT _event_time > TIMESTAMP_SECONDS({WINDOW}) AS after, UNIX_SECONDS(TIMESTAMP_MICROS(-1)) AS s, "
         f"UNIX_MILLIS(TIMESTAMP_MICROS(-1001)) AS ms FROM bench WHERE payload = 0")
    assert bench.sql(q, access=access).rows() == [{"after": True, "s": -1, "ms": -2}]


@pytest.mark.parametrize("access", ACCESS)
def test_time_functions_of_null(bench, access):
    q = ("SELECT TIMESTAMP_SECONDS(NULL) AS a, TIMESTAMP_MILLIS(NULL) AS b, TIMESTAMP_MICROS(NULL) AS c, "
         "UNIX_SECONDS(NULL) AS d, UNIX_MILLIS(NULL) AS e, UNIX_MICROS(NULL) AS f, "
         "UNIX_MICROS(TIMESTAMP_SECONDS(missing)) AS g, TIMESTAMP_SECONDS(missing) AS h "
         "FROM bench WHERE payload = 0")
    assert bench.sql(q, access=access).rows() == [dict.fromkeys("abcdefgh")]
    q = ("SELECT UNIX_SECONDS(MAX(_event_time)) AS a, UNIX_MILLIS(MIN(_event_time)) AS b, "
         "TIMESTAMP_MICROS(MAX(missing)) AS c FROM bench WHERE payload = 1000")  # no row: NULL aggregates
    assert bench.sql(q, access=access).rows() == [dict.fromkeys("abc")]
    q = "SELECT UNIX_MICROS(TIMESTAMP_SECONDS(:t)) AS a, UNIX_MILLIS(:ts) AS b FROM bench WHERE payload = 0"
    assert bench.sql(q, {"t": None, "ts": None}, access=access).rows() == [{"a": None, "b": None}]
    when = dt.datetime(2020, 1, 1, 0, 0, 1, 999, tzinfo=UTC)
    assert bench.sql(q, {"t": 2, "ts": when}, access=access).rows() == [{"a": 2_000_000, "b": 1577836801000}]
    # a datetime parameter is a timestamp in SELECT too (naive means UTC, as in WHERE)
    naive = dt.datetime.fromtimestamp(WINDOW, UTC).replace(tzinfo=None, microsecond=123)
    q = "SELECT payload, _event_time >= :t AS a, UNIX_MICROS(:t) AS b FROM bench WHERE payload IN (-1, 0) ORDER BY 1"
    assert bench.sql(q, {"t": naive}, access=access).rows() == [{"payload": -1, "a": False, "b": us(WINDOW, 123)},
                                                                {"payload": 0, "a": True, "b": us(WINDOW, 123)}]


def test_output_names_and_explain(bench):
    res = bench.sql("SELECT UNIX_MICROS(MAX(_event_time)) FROM commons.bench")
    assert res.columns == ["UNIX_MICROS(MAX(_event_time))"]
    text = str(bench.explain(ROCKBENCH))
    assert "collection bench" in text and f"_event_time > {us(WINDOW)}" in text
