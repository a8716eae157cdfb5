"""ClusterSnapshot against Snapshot, without Ray: shard groups as databases in this process,
their query actors' objects (GroupReader) called through pickling as Ray would, and one
database of all the shards as the reference. The same rows, documents, columns and SQL
answers; a point query on _id asks one group; fetches cut by offset and limit across groups."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rtindex
from rtindex import documents
from rtindex.cluster.groups import GroupReader, GroupWriter
from rtindex.cluster.snapshot import ClusterSnapshot
from rtindex.sql.engine import SqlEngine

GROUPS, K = 2, 2
OPTIONS = {"seal_rows": 8}


class _Cluster:
    """Groups of K shards each with a writer and a reader, and the reference database."""

    def __init__(self, root):
        self.writers = [GroupWriter(str(root / f"g{g}"), "c", K, OPTIONS) for g in range(GROUPS)]
        self.readers = [GroupReader(str(root / f"g{g}"), "c", OPTIONS) for g in range(GROUPS)]
        self.ref = rtindex.open(str(root / "one"), **OPTIONS)
        self.ref_coll = self.ref.create_collection("c", shards=GROUPS * K)
        self.rounds: list[list[int]] = []

    def ingest(self, docs: list[dict]) -> None:
        parts = [[] for _ in range(GROUPS)]
        for d in docs:
            parts[documents.shard_of(documents.encode_id(d["_id"]), GROUPS * K) // K].append(d)
        fences = [w.ingest(p, "report")["fence"] if p else None for w, p in zip(self.writers, parts)]
        self.fences = fences
        self.ref_coll.ingest(docs)

    def snapshot(self) -> ClusterSnapshot:
        """A snapshot whose round trips are counted in ``rounds`` (each: the groups asked)."""
        def opener(then):
            self.rounds.append(list(range(GROUPS)))
            return [pickle.loads(pickle.dumps(r.open(f, [], [], then.get(g))))
                    for g, (r, f) in enumerate(zip(self.readers, self.fences))]

        def fanout(calls):
            self.rounds.append([g for g, *_ in calls])
            out = []
            for g, token, method, args, kwargs in calls:
                args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))
                out.append(pickle.loads(pickle.dumps(self.readers[g].call(token, method, args, kwargs))))
            return out
        return ClusterSnapshot("c", K, GROUPS, opener, fanout, [], [], lambda *_: None)

    def close(self) -> None:
        for x in self.readers + self.writers:
            x.close()
        self.ref.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = _Cluster(tmp_path_factory.mktemp("groups"))
    c.ingest([{"_id": i, "a": i % 5, "s": f"s{i % 3}", "tags": ["x", f"t{i % 4}"], "m": i if i % 3 else str(i)}
              for i in range(120)])
    yield c
    c.close()


def test_lookups_give_the_same_rows(cluster):
    snap, ref = cluster.snapshot(), cluster.ref_coll.snapshot()
    assert snap.count() == ref.count() == 120
    for got, want in [(snap.term("a", 2), ref.term("a", 2)), (snap.range("a", 1, 3), ref.range("a", 1, 3)),
                      (snap.elements("tags", "t1"), ref.elements("tags", "t1")),
                      (snap.exists("m", ["string"]), ref.exists("m", ["string"])),
                      (snap.prefix("s", "s1"), ref.prefix("s", "s1")), (snap.missing("a"), ref.missing("a"))]:
        assert len(got) == len(want)
        assert sorted(d["_id"] for d in snap.fetch(got)) == sorted(d["_id"] for d in ref.fetch(want))
    both = snap.term("a", 2) & snap.elements("tags", "t1")
    assert {d["_id"] for d in snap.fetch(both)} == {i for i in range(120) if i % 5 == 2 and i % 4 == 1}
    assert snap.column_types("m") == ref.column_types("m") and snap.field_paths() == ref.field_paths()
    assert snap.has_type("m", "string") and not snap.has_type("a", "string")


@settings(max_examples=40, deadline=None)
@given(offset=st.integers(0, 130), limit=st.one_of(st.none(), st.integers(0, 130)))
def test_a_fetch_cuts_offset_and_limit_across_groups_in_shard_order(cluster, offset, limit):
    snap = cluster.snapshot()
    rows = snap.all()
    whole = snap.fetch(rows)
    want = whole[offset:] if limit is None else whole[offset:offset + limit]
    assert snap.fetch(rows, limit, offset=offset) == want
    n, docs = snap.point("a", 1, limit=limit, offset=offset)
    matching = [d for d in whole if d["a"] == 1]
    assert n == len(matching)
    assert docs == (matching[offset:] if limit is None else matching[offset:offset + limit])


def test_a_point_query_on_id_is_one_round_trip_that_asks_its_group(cluster):
    snap = cluster.snapshot()
    cluster.rounds.clear()
    n, docs = snap.point("_id", 17)
    assert n == 1 and docs[0]["_id"] == 17 and len(cluster.rounds) == 1  # pinned and asked at once
    assert snap.count() == 120 and len(cluster.rounds) == 1
    cluster.rounds.clear()
    assert snap.point("_id", 17)[0] == 1 and cluster.rounds == [[snap.group_of("_id", 17, False)]]
    cluster.rounds.clear()
    assert snap.point("_id", 17.0)[0] == 1 and cluster.rounds == [[0, 1]]  # 17.0 matches 17: every group


def test_a_scan_has_global_shard_numbers(cluster):
    snap, ref = cluster.snapshot(), cluster.ref_coll.snapshot()
    got = snap.scan([("a", "int"), ("m", "string")]).sort_by([("_shard", "ascending"), ("_row_id", "ascending")])
    want = ref.scan([("a", "int"), ("m", "string")]).sort_by([("_shard", "ascending"), ("_row_id", "ascending")])
    assert got.column_names == want.column_names
    assert sorted(got.column("_shard").to_pylist()) == sorted(want.column("_shard").to_pylist())
    assert sorted(got.column("a:int").to_pylist(), key=str) == sorted(want.column("a:int").to_pylist(), key=str)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) AS n FROM c",
    "SELECT a, COUNT(*) AS n FROM c WHERE s = 's1' GROUP BY a ORDER BY a",
    "SELECT _id FROM c WHERE ARRAY_CONTAINS(tags, 't2') AND m > 50 ORDER BY _id LIMIT 4 OFFSET 1",
    "SELECT * FROM c WHERE _id = 33",
    "SELECT m, a FROM c WHERE a IN (1, 4) ORDER BY _id DESC LIMIT 5",
])
def test_sql_gives_the_answers_of_one_database(cluster, sql):
    engine = SqlEngine(lambda name: cluster)
    try:
        for access in (None, "index", "scan"):
            want = cluster.ref.sql(sql, access=access)
            got = engine.sql(sql, None, access)
            assert got.access == want.access
            assert [{k: v for k, v in r.items() if k != "_event_time"} for r in got.rows()] == \
                   [{k: v for k, v in r.items() if k != "_event_time"} for r in want.rows()]
    finally:
        engine.close()


def test_an_aggregate_over_the_scan_is_split_between_the_groups_and_here(cluster):
    engine = SqlEngine(lambda name: cluster)
    try:
        sql = "SELECT s, COUNT(*) AS n, MIN(a) AS lo, AVG(a) AS mean FROM c WHERE a > 0 GROUP BY s ORDER BY n DESC, s"
        got, want = engine.sql(sql, None, "scan"), cluster.ref.sql(sql, access="scan")
        assert got.rows() == want.rows() and got.arrow().schema == want.arrow().schema
        assert got.plan.partial_sql is not None and "GROUP BY" in got.plan.partial_sql
        assert "partial aggregate, next to the data" in str(got.plan) and want.plan.partial_sql is None
        distinct = "SELECT COUNT(DISTINCT s) AS k FROM c"  # does not split: the columns come here
        assert engine.sql(distinct, None, "scan").plan.partial_sql is None
        assert engine.sql(distinct, None, "scan").rows() == cluster.ref.sql(distinct, access="scan").rows()
    finally:
        engine.close()


def test_a_sum_of_integers_past_64_bits_in_a_part_adds_up_as_in_one_database(tmp_path):
    big = _Cluster(tmp_path)
    try:
        big.ingest([{"_id": i, "i": v} for i, v in enumerate([2**63 - 1, 2**31, -2**63, 1, 2**63 - 1, -2**63])])
        engine = SqlEngine(lambda name: big)
        sql = "SELECT SUM(i) AS s, MAX(i) AS hi, COUNT(*) AS n FROM c"
        got = engine.sql(sql, None, "scan")
        assert got.plan.partial_sql is not None
        assert got.rows() == big.ref.sql(sql, access="scan").rows() == [{"s": 2**31 - 1, "hi": 2**63 - 1, "n": 6}]
        engine.close()
    finally:
        big.close()
