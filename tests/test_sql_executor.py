"""The executor's fetch of rows into frames (rtindex/sql/executor.py, and the frames of
rtindex/sql/multi.py): rows come in steps, and a query past its time limit stops between
them instead of reading every row first."""

from __future__ import annotations

import time

import pytest

import rtindex
from rtindex.snapshot import Snapshot
from rtindex.sql import executor

ROWS = 40_000
SECONDS_A_ROW = 5e-5  # the whole fetch takes 2 s; a step about FETCH_PROBE_ROWS of that


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    with rtindex.open(tmp_path_factory.mktemp("executor") / "db") as d:
        d.create_collection("c", shards=2).ingest([{"_id": i, "k": i % 2, "v": i} for i in range(ROWS)])
        yield d


@pytest.fixture
def slow_rows(monkeypatch):
    """Snapshot.fetch taking SECONDS_A_ROW a row, as rows read from disk one at a time may."""
    fetch = Snapshot.fetch

    def slow(self, rows, limit=None, **kw):
        got = fetch(self, rows, limit, **kw)
        time.sleep(SECONDS_A_ROW * len(got))
        return got
    monkeypatch.setattr(Snapshot, "fetch", slow)


def test_steps_give_every_row_once(db):
    snap = db["c"].snapshot()
    rows = snap.all()
    whole = snap.fetch(rows)
    assert executor.fetch_in_steps(snap, rows) == whole
    assert executor.fetch_in_steps(snap, rows, limit=5000, offset=ROWS - 3000) == whole[ROWS - 3000:]
    assert executor.fetch_in_steps(snap, rows, offset=ROWS + 1) == []


@pytest.mark.parametrize("sql", [
    "SELECT * FROM c WHERE k = 1",  # one collection, its documents fetched
    "SELECT COUNT(*) AS n FROM c a JOIN c b ON a.v = b.v WHERE a.k = 1",  # each collection read into a frame
])
def test_a_query_stops_between_steps_at_its_limit(db, slow_rows, sql):
    t0 = time.perf_counter()
    with pytest.raises(rtindex.QueryTimeoutError):
        db.sql(sql, access="index", timeout_ms=300)
    assert time.perf_counter() - t0 < 1.5  # the fetch alone takes 2 s (1 s a side of the join)
