"""Storage: what the shards of one database share in RocksDB (the write buffer budget)."""

from __future__ import annotations

import glob
import os
import time

import pytest

import rtindex
from rtindex import storage


def shard_entries(shard) -> int:
    """Entries in the active memtables of every column family of ``shard``."""
    return sum(shard.store._cf[cf].property_int_value("rocksdb.num-entries-active-mem-table") or 0
               for cf in storage.CFS)


def active_entries(coll) -> int:
    return sum(shard_entries(s) for s in coll._shards)


def sst_files(coll) -> int:
    return len(glob.glob(os.path.join(coll.path, "shard-*", "*.sst")))


def docs(prefix: str, n: int, start: int = 0) -> list[dict]:
    """Documents whose ``_id`` entries fill memtables (the rows go to mutable segment files)."""
    return [{"_id": f"{prefix}-{i}-" + "x" * 400, "n": i} for i in range(start, start + n)]


def test_an_idle_collection_gives_its_write_buffers_back(tmp_path):
    """RocksDB flushes only the memtables of the instance being written when the shared
    budget is spent: without more, a collection loaded and left alone would hold its share,
    and each later write elsewhere would flush a memtable of one write."""
    with rtindex.open(str(tmp_path / "db"), write_buffer_bytes=32 << 20) as db:
        idle = db.create_collection("idle", shards=2)
        wb = db._runtime.write_buffers.manager
        loaded = 0
        while wb.get_usage() < (32 << 20) * 3 // 4:  # 3/4 of the budget, no flush yet
            idle.ingest(docs("a", 2_000, loaded), batch_size=2_000)
            loaded += 2_000
        assert active_entries(idle) > 0
        time.sleep(storage.WriteBuffers.IDLE_SECONDS + 0.05)
        busy = db.create_collection("busy", shards=1)
        writes = 40
        for w in range(writes):
            busy.ingest(docs("b", 250, w * 250), batch_size=250)
        deadline = time.monotonic() + 10
        while all(shard_entries(s) for s in idle._shards) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not all(shard_entries(s) for s in idle._shards), "no idle shard was flushed"
        # (a loaded machine may flush a few times before the idle shards give their share back)
        assert sst_files(busy) < writes // 4, "the busy collection flushed its memtables again and again"
        assert idle.count() == loaded and busy.count() == writes * 250


def test_a_collection_being_written_keeps_its_memtables(tmp_path, monkeypatch):
    """Only stores idle for IDLE_SECONDS are flushed: of two collections written in turn
    with the budget spent, neither flushes the other's memtables at every write."""
    monkeypatch.setattr(storage.WriteBuffers, "IDLE_SECONDS", 5.0)  # the loop below takes less
    with rtindex.open(str(tmp_path / "db"), write_buffer_bytes=32 << 20) as db:
        a, b = db.create_collection("a", shards=1), db.create_collection("b", shards=1)
        wb = db._runtime.write_buffers.manager
        for w in range(200):
            a.ingest(docs("a", 1_000, w * 1_000), batch_size=1_000)
            time.sleep(storage.WriteBuffers.CHECK_SECONDS)
            spent = wb.get_usage() >= (32 << 20) * 7 // 8
            b.ingest(docs("b", 1_000, w * 1_000), batch_size=1_000)  # checks the budget
            if spent:
                break
            time.sleep(storage.WriteBuffers.CHECK_SECONDS)
        else:
            pytest.fail("the write buffer budget was never spent")
        time.sleep(0.5)  # any flush that was asked for is done
        assert active_entries(a) > 0


def fill(store: storage.Store, mb: int, tag: bytes) -> None:
    for start in range(0, mb * 1024, 1024):
        b = store.batch()
        b.put_all("rows", [tag + i.to_bytes(8, "big") for i in range(start, start + 1024)], [b"v" * 1000] * 1024)
        store.write(b)


def flushed(store: storage.Store) -> bool:
    return store.memtable_bytes() < storage.WriteBuffers.MIN_FLUSH_BYTES


def test_the_shards_of_the_collection_being_written_are_left_alone(tmp_path, monkeypatch):
    """While a batch goes to one shard the others wait: they are not idle, and flushing
    them would double the flushes of a plain load. Only other collections' shards are."""
    monkeypatch.setattr(storage.WriteBuffers, "IDLE_SECONDS", 0.0)
    monkeypatch.setattr(storage.WriteBuffers, "CHECK_SECONDS", 0.0)
    wb = storage.WriteBuffers(32 << 20)
    a1, a2, b1 = (storage.Store(str(tmp_path / c / s), create=True, write_buffers=wb)
                  for c, s in (("a", "shard-000"), ("a", "shard-001"), ("b", "shard-000")))
    try:
        fill(b1, 6, b"b")
        fill(a2, 12, b"a")  # the largest: flushed first, were it eligible
        assert a2.memtable_bytes() > b1.memtable_bytes() > 0
        start = 0
        while not flushed(b1) and start < 20 * 1024:  # a1's writes spend the budget
            fill(a1, 1, b"x" + start.to_bytes(4, "big"))
            start += 1024
        deadline = time.monotonic() + 10
        while not flushed(b1) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flushed(b1)
        assert not flushed(a2)
    finally:
        for st in (a1, a2, b1):
            st.close()


def test_flushing_a_closed_store_does_nothing(tmp_path):
    """An idle store may be closed while another's write decides to flush it."""
    wb = storage.WriteBuffers(8 << 20)
    st = storage.Store(str(tmp_path / "s"), create=True, write_buffers=wb)
    st.close()
    st.flush_memtables(wait=True)


def filter_bytes(store: storage.Store, cf: str) -> int:
    props = store._cf[cf].property_value("rocksdb.aggregated-table-properties")
    return int(props.split("filter block size=")[1].split(";")[0])


def test_rows_have_no_bloom_filter_and_ids_have_one(tmp_path):
    """A row is read by a row id the index gave, which exists: a filter would never spare a
    read. An ``_id`` is looked up before each write, and most are new: the filter answers."""
    st = storage.Store(str(tmp_path / "s"), create=True)
    try:
        b = st.batch()
        b.put_all("rows", [i.to_bytes(8, "big") for i in range(1_000)], [b'{"v":1}'] * 1_000)
        b.put_all("ids", [b"id-%d" % i for i in range(1_000)], [i.to_bytes(8, "big") for i in range(1_000)])
        st.write(b)
        st.flush_memtables()
        assert filter_bytes(st, "rows") == 0
        assert filter_bytes(st, "ids") > 1_000
        assert st.get("rows", (999).to_bytes(8, "big")) == b'{"v":1}' and st.get("rows", (1_000).to_bytes(8, "big")) is None
    finally:
        st.close()


def test_the_rocksdb_log_is_bounded(tmp_path, monkeypatch):
    """RocksDB's info LOG grows by a few KB a flush; a long-running writer's must not grow
    without bound (it rolls at LOG_FILE_BYTES and keeps two files)."""
    monkeypatch.setattr(storage, "LOG_FILE_BYTES", 64 << 10)
    st = storage.Store(str(tmp_path / "s"), create=True)
    try:
        for i in range(500):
            b = st.batch()
            b.put("meta", b"k%d" % i, b"v")
            st.write(b)
            st.flush_memtables()
    finally:
        st.close()
    logs = glob.glob(str(tmp_path / "s" / "LOG*"))
    assert len(logs) == 2 and sum(os.path.getsize(f) for f in logs) < 2 * (64 << 10) + (16 << 10)


def wal_files(path) -> set[str]:
    """The names of the WAL files of the RocksDB instance at ``path``."""
    return {os.path.basename(f) for f in glob.glob(os.path.join(str(path), "*.log"))}


LEVEL0_TRIGGER = 4  # RocksDB's level0_file_num_compaction_trigger (its default)


def meta_level0_files(store: storage.Store) -> int:
    return store._cf["meta"].property_int_value("rocksdb.num-files-at-level0")


def test_a_secondary_sees_current_values_after_the_writer_deleted_the_wal_it_read(tmp_path):
    """A RocksDB secondary skips a WAL file the writer deleted (its writes are in SST files
    by then), but what it had replayed of that file stays in its memtables and hides the
    newer values of the same keys: from gets at once, from iterators once RocksDB compacted
    the flushed files into the last level (which rewrites their keys). A catch-up that
    finds the WAL file it was reading gone opens the secondary again."""
    w = storage.Store(str(tmp_path / "s"), create=True)
    r = storage.Store(str(tmp_path / "s"), secondary_path=str(tmp_path / "secondary"))
    try:
        b = w.batch()
        b.put("meta", b"N", b"0")
        b.put("meta", b"S", b"old")
        w.write(b)
        r.catch_up()
        assert r.get("meta", b"N") == b"0" and r.get("meta", b"S") == b"old"
        read = wal_files(tmp_path / "s")
        b = w.batch()
        b.put("meta", b"N", b"1")
        b.delete("meta", b"S")
        w.write(b)
        for n in range(2, LEVEL0_TRIGGER + 1):  # a level-0 file a flush: RocksDB compacts them
            w.flush_memtables()
            b = w.batch()
            b.put("meta", b"N", b"%d" % n)
            w.write(b)
        w.flush_memtables()
        deadline = time.monotonic() + 10
        while meta_level0_files(w) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert meta_level0_files(w) == 0, "RocksDB did not compact the flushed files"
        assert not read & wal_files(tmp_path / "s"), "the WAL file the secondary read was not deleted"
        r.catch_up()
        last = b"%d" % LEVEL0_TRIGGER
        assert r.get("meta", b"N") == last and r.get("meta", b"S") is None
        assert list(r.scan("meta", b"")) == [(b"N", last)]
    finally:
        r.close()
        w.close()


def test_a_compaction_drops_the_tombstones_of_a_file_it_moves_down_whole(tmp_path):
    """Delete records written and deleted before a flush leave a file of tombstones only;
    RocksDB moves such a file to the last level whole, keeping them, unless the compaction
    rewrites the last level too (what an idle shard's tidy-up relies on)."""
    st = storage.Store(str(tmp_path / "s"), create=True)
    try:
        b = st.batch()
        keys = [b"D" + i.to_bytes(8, "big") for i in range(20_000)]
        for k in keys:
            b.put("meta", k, b"")
        for k in keys:
            b.delete("meta", k)
        st.write(b)
        st.flush_memtables()
        assert st.sst_bytes("meta") > 20_000
        st.compact("meta")
        assert st.sst_bytes("meta") == 0
    finally:
        st.close()
