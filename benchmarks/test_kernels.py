"""Micro-benchmarks of the compiled kernels, with pytest-benchmark (not part of the test run).

    python -m pytest benchmarks/test_kernels.py [--benchmark-json out.json]

- the one-pass indexer (``SegmentBuilder.add_json``) per kind of document: RockBench events
  (~1.25 KB, ~60 fields, nested), TSBS ``cpu`` rows, ``product_clicks`` rows; each round
  indexes 1,000 documents into a fresh builder, in memory and in a file readers could map;
- the top-level scan ingest reads ``_id`` and ``_event_time`` with (``scan_top``);
- a term lookup in a mutable segment of 25,000 events (``postings``), a hit and a miss;
- a row-cache hit (``RowCache.get``);
- a point lookup from terms to copied rows (``PointLookup.rows``) in a sealed collection of
  25,000 events, its rows cached;
- the gather of one column at 200 matched rows of each of 16 chunks (``gather``), 8-byte
  values and strings.

Figures are per call; divide the indexer's by 1,000 for a document. docs/benchmarks.md has
the current ones.
"""

from __future__ import annotations

import orjson
import pytest

from rtindex import datagen, keys
import numpy as np
import pyarrow as pa

import rtindex
from rtindex import columns
from rtindex._ext._gather import gather
from rtindex._ext._lru import RowCache
from rtindex._ext._segment import SegmentBuilder, scan_top

N = 1000


@pytest.fixture(scope="module")
def data():
    return {
        "events": [orjson.dumps(d) for d in datagen.rockbench_events(N, seed=1)],
        "tsbs": [orjson.dumps(d) for d in datagen.tsbs_cpu_rows(N)],
        "clicks": [orjson.dumps(d) for d in datagen.product_clicks(N)],
    }


@pytest.mark.parametrize("kind", ["events", "tsbs", "clicks"])
def test_index_in_memory(benchmark, data, kind):
    docs = data[kind]

    def run(b):
        offsets, errors = b.add_json(docs)
        assert not errors

    benchmark.pedantic(run, setup=lambda: ((SegmentBuilder(),), {}), rounds=30)


@pytest.mark.parametrize("kind", ["events", "tsbs"])
def test_index_in_a_file(benchmark, data, kind, tmp_path):
    docs = data[kind]
    made = []

    def setup():
        b = SegmentBuilder(tmp_path / f"s{len(made)}.rtt")
        made.append(b)
        return (b,), {}

    benchmark.pedantic(lambda b: b.add_json(docs), setup=setup, rounds=30)
    for b in made:
        b.close()
        b.unlink()


def test_scan_top(benchmark, data):
    docs = data["events"]
    benchmark(lambda: [scan_top(d) for d in docs])


@pytest.fixture(scope="module")
def segment():
    b = SegmentBuilder()
    docs = [orjson.dumps(d) for d in datagen.rockbench_events(25_000, seed=2)]
    for i in range(0, len(docs), 1000):
        b.add_json(docs[i : i + 1000])
    first = orjson.loads(docs[7])
    hit = keys.encode_path(("processBy",)) + bytes((keys.STRING,)) + keys.encode_string(first["processBy"])
    miss = keys.encode_path(("processBy",)) + bytes((keys.STRING,)) + keys.encode_string("no-such-host")
    return b, hit, miss


def test_term_lookup_hit(benchmark, segment):
    b, hit, _ = segment
    assert len(benchmark(b.postings, hit, b.n_rows))


def test_term_lookup_miss(benchmark, segment):
    b, _, miss = segment
    assert not len(benchmark(b.postings, miss, b.n_rows))


def test_row_cache_hit(benchmark):
    cache = RowCache(64 << 20)
    row = orjson.loads(orjson.dumps(next(iter(datagen.rockbench_events(1, seed=3)))))
    cache.put(42, row, 4096)
    assert benchmark(cache.get, 42) is row


@pytest.fixture(scope="module")
def sealed(tmp_path_factory):
    db = rtindex.open(str(tmp_path_factory.mktemp("point") / "db"))
    c = db.create_collection("events", shards=4)
    c.ingest(list(datagen.rockbench_events(25_000, seed=2)))
    c.flush()
    yield c.snapshot()
    db.close()


def test_point_lookup(benchmark, sealed):
    # a selective value, as a point query's: one of the least frequent of a sample
    value = min({d["processBy"] for d in sealed.fetch(sealed.all(), 500)},
                key=lambda v: len(sealed.matching("processBy", v)))
    n, docs = benchmark(sealed.point, "processBy", value)
    assert n == len(docs) > 0


@pytest.mark.parametrize("kind", ["int", "string"])
def test_gather(benchmark, kind):
    rng = np.random.default_rng(1)
    values = rng.integers(0, 10_000, 60_000)
    arr = pa.array(values) if kind == "int" else pa.array([f"p{v}" for v in values], type=pa.large_string())
    parts = [columns.Chunk(arr).part(np.sort(rng.choice(len(arr), 200, replace=False)).astype(np.int64))
             for _ in range(16)]
    benchmark(gather, 2 if kind == "string" else 0, parts)
