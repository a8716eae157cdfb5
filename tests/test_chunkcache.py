"""ChunkCache (decoded column chunks under a byte budget) and the compressed chunks it holds."""

from __future__ import annotations

import pyarrow as pa
import pytest

import rtindex
from rtindex import columns
from rtindex.chunkcache import ChunkCache


def test_least_recently_used_entries_leave_first():
    c = ChunkCache(100)
    c.put("a", 1, 40)
    c.put("b", 2, 40)
    assert c.get("a") == 1  # now b is the oldest
    c.put("c", 3, 40)
    assert c.get("b") is None and c.get("a") == 1 and c.get("c") == 3
    assert c.stats()["bytes"] == 80 and c.stats()["entries"] == 2


def test_a_value_over_the_budget_is_not_kept_and_zero_keeps_nothing():
    c = ChunkCache(100)
    c.put("big", 1, 101)
    assert c.get("big") is None and c.stats()["bytes"] == 0
    off = ChunkCache(0)
    off.put("x", 1, 1)
    assert off.get("x") is None


def test_putting_a_key_again_replaces_its_size():
    c = ChunkCache(100)
    c.put("a", 1, 60)
    c.put("a", 2, 30)
    assert c.get("a") == 2 and c.stats()["bytes"] == 30


@pytest.mark.parametrize("arr", [
    pa.array(range(10_000), pa.int64()),
    pa.array([f"s{i % 7}" if i % 5 else None for i in range(10_000)], pa.large_string()),
    pa.array([1.5, None, -0.0] * 3000, pa.float64()),
    pa.array([True, False, None] * 10, pa.bool_()),  # small: stored plain
])
def test_chunks_round_trip_compressed_when_large(arr):
    data = columns.encode(arr)
    assert columns.decode(data).equals(arr)
    if arr.nbytes >= columns.COMPRESS_MIN:
        assert data.size < arr.nbytes / 2  # these compress well; a plain stream is larger than arr
    plain = pa.BufferOutputStream()  # a chunk written before compression (or a small one) reads too
    with pa.ipc.new_stream(plain, pa.schema([("v", arr.type)])) as w:
        w.write_batch(pa.record_batch([arr], names=["v"]))
    assert columns.decode(plain.getvalue()).equals(arr)


def test_queries_read_sealed_columns_through_the_cache(tmp_path):
    with rtindex.open(str(tmp_path / "db"), column_cache_bytes=64 << 20) as db:
        c = db.create_collection("c", shards=2)
        c.ingest([{"_id": i, "city": f"c{i % 30}", "n": i} for i in range(20_000)])
        c.flush()
        q = "SELECT city, SUM(n) AS s FROM c GROUP BY city ORDER BY city"
        first = db.sql(q).rows()
        got = db.stats()["column_cache"]
        assert got["entries"] > 0 and got["misses"] > 0 and 0 < got["bytes"] <= got["capacity"]
        assert db.sql(q).rows() == first  # the second time from the cache
        assert db.stats()["column_cache"]["hits"] > got["hits"]
        assert first[0] == {"city": "c0", "s": sum(range(0, 20_000, 30))}
    with rtindex.open(str(tmp_path / "db"), column_cache_bytes=0) as db:  # every read decodes
        assert db.sql(q).rows() == first
        assert db.stats()["column_cache"]["entries"] == 0


def test_column_cache_bytes_must_be_a_non_negative_int(tmp_path):
    with pytest.raises(ValueError, match="column_cache_bytes"):
        rtindex.open(str(tmp_path / "db"), column_cache_bytes=-1)


def test_a_chunk_written_in_parts_reads_as_their_concatenation():
    parts = [pa.array([f"v{i}" for i in range(n)], pa.large_string()) for n in (3000, 0, 1, 5000)]
    data = columns.encode_parts(pa.large_string(), iter(parts))
    assert columns.decode(data).equals(pa.concat_arrays(parts))
    assert columns.decode(columns.encode_parts(pa.int64(), [])).equals(pa.array([], pa.int64()))
