"""maintenance: a seal moves a mutable segment's rows into the segment file (the row store
never holds them); rows an older version kept in the row store move out at their seal and
a flush gives that space back; a merge carries the rows of files written before rows moved
into them."""

from __future__ import annotations

import os
import shutil
import threading
import time

import orjson

import rtindex
from rtindex import datagen, keys, maintenance
from rtindex._impl import tail_rows
from rtindex.keys import from_u64, u64
from rtindex.shard import TAILS_DIR, tail_path
from rtindex.storage import Store
from tests.test_segfile import _without_rows

T = 1_700_000_000_000_000  # an _event_time, so that documents read back equal those given


def _rows_in_row_store(shard, lo: int, hi: int) -> int:
    return sum(1 for _ in shard.store.scan("rows", u64(lo), u64(hi)))


def _sealed(shard):
    return [v for v in shard.state.views if v.sealed]


def test_a_seal_moves_rows_into_its_file_and_reads_find_them(tmp_path):
    with rtindex.open(str(tmp_path / "db"), seal_rows=100, row_cache_bytes=0) as db:  # every fetch reads
        c = db.create_collection("c", shards=1)
        docs = [{"_id": i, "_event_time": T + i, "v": "x" * (i % 300)} for i in range(350)]
        c.ingest(docs)
        c.flush()
        shard = c._shards[0]
        sealed = _sealed(shard)
        assert sealed and all(v.seg.file.has_rows for v in sealed)
        assert _rows_in_row_store(shard, 0, 1 << 40) == 0  # segment files and the tail file hold them
        assert sorted(c.snapshot().fetch(c.snapshot().all()), key=lambda d: d["_id"]) == docs
        assert [c.get(i) for i in (0, 99, 100, 349)] == [docs[i] for i in (0, 99, 100, 349)]
        tails = list(shard.store.scan("meta", keys.META_TAIL, keys.prefix_upper_bound(keys.META_TAIL)))
        active = shard.state.views[-1]
        assert [(keys.meta_tail_base(k), from_u64(v)) for k, v in tails] == [(active.base, active.seg.fid)]


def _as_an_older_version_left_it(shard_path: str) -> None:
    """Put a closed shard's unsealed rows into the row store and drop its mutable segment
    files and their ``T`` records: what a version that kept unsealed rows there left."""
    store = Store(shard_path)
    tails = [(keys.meta_tail_base(k), from_u64(v))
             for k, v in store.scan("meta", keys.META_TAIL, keys.prefix_upper_bound(keys.META_TAIL))]
    next_row = from_u64(store.get("meta", keys.META_NEXT_ROW))
    wb = store.batch()
    for base, fid in tails:
        raws = tail_rows(tail_path(shard_path, base, fid), 0, next_row - base)
        wb.put_all("rows", [u64(base + o) for o in range(len(raws))], raws)
        wb.delete("meta", keys.meta_tail(base))
    store.write(wb)
    store.close()
    shutil.rmtree(os.path.join(shard_path, TAILS_DIR))


def test_rows_an_older_version_kept_in_the_row_store_move_out_and_flush_gives_the_space_back(tmp_path):
    path = str(tmp_path / "db")
    docs = [{"_id": i, "_event_time": T, "pad": os.urandom(300).hex()} for i in range(6000)]
    with rtindex.open(path, seal_rows=100_000) as db:
        c = db.create_collection("c", shards=1)
        c.ingest(docs)
        shard_path = c._shards[0].path
    _as_an_older_version_left_it(shard_path)
    with rtindex.open(path, seal_rows=2000, row_cache_bytes=0) as db:
        c = db["c"]
        shard = c._shards[0]
        assert shard.row_store_end == 6000 and not os.listdir(os.path.join(shard_path, TAILS_DIR))[1:]
        shard.store.flush_memtables()
        before = shard.store._cf["rows"].property_int_value("rocksdb.total-sst-files-size")
        c.flush()
        after = shard.store._cf["rows"].property_int_value("rocksdb.total-sst-files-size")
        assert before > 6000 * 300 and after < before / 4
        assert _rows_in_row_store(shard, 0, 1 << 40) == 0
        assert sorted(c.snapshot().fetch(c.snapshot().all()), key=lambda d: d["_id"]) == docs


def test_a_merge_carries_the_rows_of_older_files(tmp_path):
    path = str(tmp_path / "db")
    docs = {i: {"_id": i, "_event_time": T, "v": i} for i in range(300)}
    with rtindex.open(path, seal_rows=100, merge_factor=8) as db:
        c = db.create_collection("c", shards=1)
        for lo in range(0, 300, 100):  # three segments of 100
            c.ingest([docs[i] for i in range(lo, lo + 100)])
        c.flush()
        shard = c._shards[0]
        old = [(v.seg.file.path, v.base, [v.seg.row(o) for o in v.seg.live]) for v in _sealed(shard)]
        shard_path = shard.path
    assert len(old) == 3
    store = Store(shard_path)  # as before rows moved: the files without them, the row store with them
    wb = store.batch()
    for file_path, base, raws in old:
        _without_rows(file_path)
        wb.put_all("rows", [u64(base + o) for o in range(len(raws))], raws)
    store.write(wb)
    store.close()
    with rtindex.open(path, seal_rows=100, merge_factor=4, row_cache_bytes=0) as db:
        c = db["c"]
        shard = c._shards[0]
        assert [v.seg.file.has_rows for v in _sealed(shard)] == [False] * 3
        assert sorted(c.snapshot().fetch(c.snapshot().all()), key=lambda d: d["_id"]) == list(docs.values())
        for i in range(0, 300, 7):  # replace some, then a fourth seal makes a merge of four
            docs[i] = {"_id": i, "_event_time": T, "v": -i}
        docs.update({300 + i: {"_id": 300 + i, "_event_time": T} for i in range(100 - 43)})
        c.ingest([docs[i] for i in range(0, 300, 7)] + [docs[300 + i] for i in range(100 - 43)])
        c.flush()
        sealed = _sealed(shard)
        assert len(sealed) == 1 and sealed[0].seg.file.has_rows
        assert _rows_in_row_store(shard, 0, sealed[0].base + sealed[0].seg.n) == 0
        got = c.snapshot().fetch(c.snapshot().all())
        assert sorted(got, key=lambda d: d["_id"]) == [docs[k] for k in sorted(docs)]
        assert orjson.loads(sealed[0].seg.row(sealed[0].seg.live.max())) in got


def test_a_wait_is_not_failed_by_an_attempt_that_began_before_it(tmp_path, monkeypatch):
    """A seal already under way when flush() starts waiting, and failing after that (its
    cause gone meanwhile), is retried at once; flush() reports only attempts it waited for."""
    from rtindex import columns

    encode = columns.encode
    started, release = threading.Event(), threading.Event()

    def fails_once(values):
        if not started.is_set():
            started.set()
            release.wait(10)
            raise OSError("transient")
        return encode(values)

    monkeypatch.setattr(columns, "encode", fails_once)
    db = rtindex.open(str(tmp_path / "db"), seal_rows=10)
    c = db.create_collection("c", shards=1)
    c.ingest([{"_id": i} for i in range(10)])  # rotates: the sealer's first attempt blocks
    assert started.wait(10)
    outcome = []
    waiter = threading.Thread(target=lambda: outcome.append(_try(c.flush)))
    waiter.start()
    time.sleep(0.2)  # flush() is waiting for the seal
    release.set()
    waiter.join(10)
    assert not waiter.is_alive() and outcome == [None]
    assert len(_sealed(c._shards[0])) == 1 and c.get(3)["_id"] == 3
    db.close()


def _disk_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:  # removed by the background meanwhile
                pass
    return total


def _within(path: str, limit: int, seconds: float) -> int:
    """The disk bytes under ``path`` once at most ``limit``, or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while (used := _disk_bytes(path)) > limit and time.monotonic() < deadline:
        time.sleep(0.1)
    return used


def test_an_idle_shard_gives_back_the_space_of_replaced_versions(tmp_path, monkeypatch):
    """A working set small next to seal_rows, rewritten again and again, takes several times
    the disk of its clean load (replaced versions in the mutable segments, WAL files,
    change log records, tombstones). Once writes stop, the idle shards give it back to
    within 2x of the clean load, and so do shards closed before they went idle, once
    reopened; a reopen brings none of it back."""
    monkeypatch.setattr(maintenance, "IDLE_SECONDS", 1.0)
    path = str(tmp_path / "db")
    versions = [list(datagen.rockbench_events(6000, seed=v, event_time_us=T)) for v in range(2)]
    opts = {"seal_rows": 1500, "reader_grace_seconds": 0}
    with rtindex.open(path, **opts) as db:
        c = db.create_collection("c", shards=2)
        c.ingest(versions[0])
        c.flush()
        load = _disk_bytes(path)
        for r in range(1, 5):
            c.ingest(versions[r % 2])
        assert _disk_bytes(path) > 2 * load
        deadline = time.monotonic() + 30
        used = _within(path, 2 * load, 30)
        # the disk can drop below the bound as one shard's idle seal is done and the
        # other's is still to come: both are waited for, within the same 30 s
        while not all(s.state.views[-1].limit == 0 for s in c._shards) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert used <= 2 * load, f"{used / load:.2f}x the clean load after idle"
        assert all(s.state.views[-1].limit == 0 for s in c._shards)
        for r in range(2):  # more rewrites, and a close before the shards go idle
            c.ingest(versions[r % 2])
        assert _disk_bytes(path) > 2 * load
    with rtindex.open(path, **opts) as db:
        used = _within(path, 2 * load, 30)
        assert used <= 2 * load, f"{used / load:.2f}x the clean load after reopen and idle"
        c = db["c"]
        assert len(c) == 6000
        assert [c.get(d["_id"]) for d in versions[1][::500]] == versions[1][::500]
    with rtindex.open(path, **opts) as db:
        used = _disk_bytes(path)
        assert used <= 2 * load, f"{used / load:.2f}x the clean load after another reopen"
        assert len(db["c"]) == 6000


def _try(fn):
    try:
        fn()
    except Exception as e:  # the test asserts on what came back
        return e
    return None
