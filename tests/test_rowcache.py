"""The RowStoreCache inside the database: read-through, counters, copies, and correctness
under concurrent ingest, updates, deletes, seals, merges and queries. (The LRU structure
itself is tested against a model in test_lru.py.)"""

from __future__ import annotations

import random
import threading
import time

import pytest

import rtindex


def test_get_and_queries_fill_and_hit_the_cache(tmp_path):
    with rtindex.open(str(tmp_path / "d")) as db:
        c = db.create_collection("t", shards=2)
        c.ingest([{"_id": i, "g": i % 3, "o": {"x": [i]}} for i in range(30)])
        before = db.stats()["row_cache"]
        assert before["entries"] == 0 and before["capacity_bytes"] == 64 << 20  # the default
        assert c.get(4)["o"] == {"x": [4]}
        assert db.stats()["row_cache"]["misses"] == 1
        assert c.get(4)["g"] == 1
        after = db.stats()["row_cache"]
        assert after["hits"] == 1 and after["entries"] == 1 and after["inserts"] == 1 and after["bytes"] > 0
        rows = db.sql("SELECT _id, o.x FROM t WHERE g = 1").rows()
        assert len(rows) == 10
        st = db.stats()["row_cache"]
        assert st["entries"] == 10 and st["hits"] == 2  # _id 4 again


def test_callers_cannot_modify_cached_rows(db):
    c = db.create_collection("t")
    c.ingest([{"_id": 1, "a": {"b": [1, 2]}}])
    d = c.get(1)
    d["a"]["b"].append(3)
    d["new"] = 1
    assert c.get(1) == {"_id": 1, "a": {"b": [1, 2]}, "_event_time": d["_event_time"]}
    (row,) = db.sql("SELECT * FROM t").rows()
    row["a"]["b"].clear()
    (proj,) = db.sql("SELECT a, a.b FROM t WHERE _id = 1").rows()
    proj["a.b"].append(9)
    proj["a"]["b"].append(9)
    snap = c.snapshot()
    snap.fetch(snap.all())[0]["a"]["b"].append(7)
    assert c.get(1)["a"] == {"b": [1, 2]}


def test_small_budget_evicts_and_zero_disables(tmp_path):
    with rtindex.open(str(tmp_path / "small"), row_cache_bytes=20_000) as db:
        c = db.create_collection("t")
        c.ingest([{"_id": i, "pad": "x" * 200} for i in range(200)])
        for i in range(200):
            assert c.get(i)["_id"] == i
        st = db.stats()["row_cache"]
        assert st["evictions"] > 0 and st["bytes"] <= 20_000 and st["entries"] < 200
    with rtindex.open(str(tmp_path / "off"), row_cache_bytes=0) as db:
        c = db.create_collection("t")
        c.ingest([{"_id": 1}])
        assert c.get(1)["_id"] == 1 and len(db.sql("SELECT * FROM t")) == 1
        assert db.stats()["row_cache"]["entries"] == 0
    with pytest.raises(ValueError, match="row_cache_bytes"):
        rtindex.open(str(tmp_path / "bad"), row_cache_bytes=-1)


@pytest.mark.parametrize("cache_bytes", [0, 30_000, 64 << 20])
def test_concurrent_writes_and_reads_match_their_snapshots(tmp_path, cache_bytes):
    """A writer upserts, deletes and re-inserts (small segments, so seals and merges run
    all along); readers take a snapshot together with a copy of the model, then read at
    that snapshot while writing goes on, through a cache small enough to evict."""
    db = rtindex.open(str(tmp_path / "d"), row_cache_bytes=cache_bytes, seal_rows=300, merge_factor=2)
    c = db.create_collection("t", shards=2)
    model: dict[int, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[str] = []

    def doc(k: int, v: int) -> dict:
        return {"_id": k, "v": v, "g": k % 7, "chk": f"{k}:{v}", "pad": "p" * (k % 50)}

    def writer():
        rng = random.Random(1)
        version = 0
        try:
            while not stop.is_set():
                version += 1
                ks = rng.sample(range(400), 40)
                with lock:
                    c.ingest([doc(k, version) for k in ks[:30]])
                    for k in ks[:30]:
                        model[k] = version
                    for k in ks[30:]:
                        if c.delete(k) != (k in model):
                            errors.append(f"delete({k}) disagreed with the model")
                        model.pop(k, None)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(f"writer: {e!r}")

    def check(snap, expected: dict[int, int], where: str) -> None:
        got = snap.fetch(snap.all(), copy=False)
        pairs = sorted((d["_id"], d["v"]) for d in got)
        if pairs != sorted(expected.items()):
            errors.append(f"{where}: all rows differ from the model ({len(pairs)} vs {len(expected)})")
        for d in got:
            if d["chk"] != f"{d['_id']}:{d['v']}":
                errors.append(f"{where}: torn row {d}")
        g = random.randrange(7)
        ids = sorted(d["_id"] for d in snap.fetch(snap.term("g", g)))
        if ids != sorted(k for k in expected if k % 7 == g):
            errors.append(f"{where}: g = {g} differs")

    def reader(seed: int):
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                with lock:
                    snap = c.snapshot()
                    expected = dict(model)
                    if rng.random() < 0.3:  # SQL takes its own snapshot: run it inside the lock
                        g = rng.randrange(7)
                        rows = db.sql("SELECT _id, v FROM t WHERE g = :g", {"g": g}).rows()
                        if sorted((r["_id"], r["v"]) for r in rows) != sorted(
                                (k, v) for k, v in expected.items() if k % 7 == g):
                            errors.append(f"sql g = {g} differs from the model")
                time.sleep(rng.random() * 0.002)  # let writes, seals and merges run meanwhile
                check(snap, expected, f"reader {seed}")
        except Exception as e:  # pragma: no cover - reported below
            errors.append(f"reader {seed}: {e!r}")

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    time.sleep(3)
    stop.set()
    for t in threads:
        t.join()
    try:
        assert not errors, errors[:5]
        st = db.stats()["row_cache"]
        if cache_bytes:
            assert st["hits"] > 0 and st["bytes"] <= cache_bytes
        if cache_bytes == 30_000:
            assert st["evictions"] > 0
        with lock:
            check(c.snapshot(), dict(model), "final")
        assert not errors, errors[:5]
    finally:
        db.close()


def test_rows_past_the_cache_range_are_read_without_it():
    """A row id past ROW_MAX bypasses the cache (its key would not fit): read, decoded, not
    kept, and charged by its JSON size."""
    import orjson

    from rtindex.rowcache import ROW_MAX, RowStoreCache, json_bytes

    cache = RowStoreCache(1 << 20)
    shard = cache.new_shard_id()
    stored = {ROW_MAX - 1: {"_id": "a"}, ROW_MAX + 1: {"_id": "b"}}
    read = lambda ids: [orjson.dumps(stored[i]) for i in ids]  # noqa: E731
    for _ in range(2):
        charge = [0]
        docs = cache.rows(shard, [ROW_MAX - 1, ROW_MAX + 1], read, ROW_MAX + 2, charge)
        assert docs == [{"_id": "a"}, {"_id": "b"}] and charge[0] == json_bytes(docs)
    assert cache.stats()["entries"] == 0  # one key past the range: the whole call bypasses the cache
