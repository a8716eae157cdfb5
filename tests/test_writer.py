"""writer: a batch's rows live in the mutable segment's file, which a ``T`` record names, and
a restarted writer reads them back from there, published to readers or not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import rtindex
from rtindex import keys
from rtindex.errors import CorruptionError
from rtindex.keys import from_u64
from rtindex.shard import TAILS_DIR

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tail_records(shard) -> list[tuple[int, int]]:
    return [(keys.meta_tail_base(k), from_u64(v))
            for k, v in shard.store.scan("meta", keys.META_TAIL, keys.prefix_upper_bound(keys.META_TAIL))]


def test_each_unsealed_segment_has_its_record_and_a_seal_drops_it(tmp_path):
    with rtindex.open(str(tmp_path / "db"), seal_rows=100) as db:
        c = db.create_collection("c", shards=1)
        shard = c._shards[0]
        for lo in range(0, 450, 50):
            c.ingest([{"_id": i, "v": i} for i in range(lo, lo + 50)])
            unsealed = [(v.base, v.seg.fid) for v in shard.state.views if not v.sealed]
            assert _tail_records(shard) == unsealed
        c.flush()
        assert _tail_records(shard) == [(v.base, v.seg.fid) for v in shard.state.views if not v.sealed]
        assert len(shard.state.views) > 1 and sum(1 for _ in shard.store.scan("rows", b"", b"\xff" * 9)) == 0


def test_a_writer_killed_after_storing_a_batch_and_before_publishing_it_loses_nothing(tmp_path):
    path = str(tmp_path / "db")
    code = textwrap.dedent(f"""
        import os, signal
        import rtindex
        from rtindex.writer import ShardWriter
        db = rtindex.open({path!r}, seal_rows=10_000)
        c = db.create_collection("c", shards=1)
        c.ingest([{{"_id": i, "v": i}} for i in range(500)])
        ShardWriter._publish = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # stored, then gone
        c.ingest([{{"_id": i, "v": -i}} for i in range(300, 800)])
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    with rtindex.open(path) as db:
        got = db.sql("SELECT _id, v FROM c ORDER BY _id").rows()
        assert got == [{"_id": i, "v": i if i < 300 else -i} for i in range(800)]
        assert db["c"].get(799)["v"] == -799 and db["c"].get(299)["v"] == 299


def test_a_mutable_segment_file_cut_short_is_reported(tmp_path):
    path = str(tmp_path / "db")
    with rtindex.open(path) as db:
        c = db.create_collection("c", shards=1)
        c.ingest([{"_id": i, "pad": "x" * 200} for i in range(5_000)])
        tails = os.path.join(c._shards[0].path, TAILS_DIR)
    (name,) = os.listdir(tails)
    with open(os.path.join(tails, name), "r+b") as f:
        f.truncate(64 << 10)
    with pytest.raises(CorruptionError, match="cannot be read from their mutable segment file"):
        rtindex.open(path)


def test_sync_makes_the_mutable_segment_file_durable_too(tmp_path):
    path = str(tmp_path / "db")
    with rtindex.open(path, sync=True, seal_rows=300) as db:
        c = db.create_collection("c", shards=1)
        for lo in range(0, 1000, 100):
            c.ingest([{"_id": i, "v": i} for i in range(lo, lo + 100)])
    with rtindex.open(path) as db:
        assert db.sql("SELECT COUNT(*) AS n, SUM(v) AS s FROM c").rows() == [{"n": 1000, "s": 499500}]
