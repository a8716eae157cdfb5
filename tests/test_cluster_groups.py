"""The actors of a shard group as plain objects (Ray only hosts them): the writer stores and
reports positions of its part; the query actor waits for a fence, pins snapshots by token
and lets the oldest go."""

from __future__ import annotations

import threading

import pytest

from rtindex.cluster import groups
from rtindex.cluster.groups import GroupReader, GroupStoppedError, GroupWriter, Parts, SnapshotExpiredError
from rtindex.errors import RtindexError


@pytest.fixture
def group(tmp_path):
    w = GroupWriter(str(tmp_path / "g"), "c", 2, {"seal_rows": 8})
    r = GroupReader(str(tmp_path / "g"), "c", {"seal_rows": 8})
    yield w, r
    r.close()
    w.close()


def test_the_writer_reports_its_part_by_position(group):
    w, _ = group
    got = w.ingest([{"_id": 1}, {"_id": 1.5}, {"_id": 2, "a": 1}], "report")
    assert got["n"] == 2 and [e.index for e in got["errors"]] == [1]
    assert got["doc_ids"][0] == 1 and got["doc_ids"][2] == 2 and got["fence"]
    assert w.ingest([{"_id": 2, "a": 2}], "report")["replaced"] == [0]
    found, fence = w.delete(1)
    assert found and fence


def test_a_stopped_writer_finishes_the_write_under_way_and_refuses_later_ones(group, monkeypatch):
    w, _ = group
    entered, release = threading.Event(), threading.Event()
    ingest = w.coll.ingest

    def slow(*a, **k):
        entered.set()
        release.wait(10)
        return ingest(*a, **k)
    monkeypatch.setattr(w.coll, "ingest", slow)
    got = []
    writing = threading.Thread(target=lambda: got.append(w.ingest([{"_id": 1}], "report")))
    writing.start()
    entered.wait(10)
    closing = threading.Thread(target=w.close)
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()  # waits for the write under way
    release.set()
    writing.join(10)
    closing.join(10)
    assert got[0]["n"] == 1 and w.db.closed
    for call in (lambda: w.ingest([{"_id": 2}], "report"), lambda: w.delete(1), lambda: w.fence(), w.flush):
        with pytest.raises(GroupStoppedError, match="stopped for a move"):
            call()


def test_the_reader_sees_what_a_fence_covers_and_pins_snapshots(group, monkeypatch):
    w, r = group
    fence = w.ingest([{"_id": i, "a": i % 3} for i in range(20)], "report")["fence"]
    token, count, written, types, has, then, lag = r.open(fence, [("a",)], [(("a",), "int"), (("a",), "string")],
                                                     ("point", (("_id",), 4), {}))
    assert count == 20 and sum(written) == 20 and types == [["int"]] and has == [True, False]
    assert then[0][1][0]["_id"] == 4  # the call made on the snapshot just pinned
    assert set(lag) == {"rows", "ms"}
    assert r.open(fence, [], [])[0] == token  # nothing new: the same snapshot, the same token
    parts, _ = r.call(token, "term", (("a",), 1), {})
    assert isinstance(parts, Parts)
    docs, counted = r.call(token, "fetch", (parts,), {"charge": [0]})
    assert sorted(d["_id"] for d in docs) == [i for i in range(20) if i % 3 == 1] and counted["charge"] > 0
    assert r.get(5, fence)["_id"] == 5
    monkeypatch.setattr(groups, "SNAPSHOTS_KEPT", 1)
    w.ingest([{"_id": 99}], "report")
    newer = r.open(w.fence(), [], [])[0]
    assert newer != token
    with pytest.raises(SnapshotExpiredError):
        r.call(token, "count", (), {})
    assert r.call(newer, "count", (), {})[0] == 21


def test_a_fence_the_reader_cannot_reach_is_an_error(group, monkeypatch):
    w, r = group
    fence = w.ingest([{"_id": 1}], "report")["fence"]
    monkeypatch.setattr(groups, "FENCE_WAIT_SECONDS", 0.0)
    monkeypatch.setattr(r.db, "caught_up", lambda f: False)
    with pytest.raises(RtindexError, match="did not catch up"):
        r.open(fence, [], [])
