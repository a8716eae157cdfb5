"""Fast checks of the data generators (rtindex/datagen.py, used by the benchmarks and the demo)."""

from __future__ import annotations

import collections
import random

import orjson
import pytest

from rtindex import datagen

T0 = 1_700_000_000_000_000
N_EVENTS = 8_000


@pytest.fixture(scope="module")
def events():
    return list(datagen.rockbench_events(N_EVENTS, seed=7, event_time_us=T0))


def test_events_deterministic(events):
    again = list(datagen.rockbench_events(3000, seed=7, event_time_us=T0))
    assert again == events[:3000]
    other = list(datagen.rockbench_events(200, seed=8, event_time_us=T0))
    assert other != events[:200]
    # a prefix does not depend on n
    assert list(datagen.rockbench_events(50, seed=7, event_time_us=T0)) == events[:50]


def test_events_size_and_leaf_count(events):
    sizes = [len(orjson.dumps(d)) for d in events]
    avg = sum(sizes) / len(sizes)
    assert 1100 <= avg <= 1400, avg
    leaves = [datagen.count_leaf_fields(d) for d in events[:2000]]
    avg_leaves = sum(leaves) / len(leaves)
    assert 50 <= avg_leaves <= 70, avg_leaves
    assert min(leaves) >= 45


def test_events_shape(events):
    ids = [d["_id"] for d in events]
    assert len(set(ids)) == len(ids)
    assert ids[0] == "ev-0" and ids[-1] == f"ev-{N_EVENTS - 1}"
    for j, d in enumerate(events[:1000]):
        assert d["_event_time"] == T0 + j * 1000
        assert isinstance(d["generator_identifier"], int) and 0 <= d["generator_identifier"] < 2**63
        assert isinstance(d["processBy"], str) and d["processBy"].startswith("host-")
        assert 1 <= len(d["emails"]) <= 5
        assert all("@" in e for e in d["emails"])
        assert isinstance(d["device"]["os"]["name"], str)
        assert isinstance(d["geo"]["lat"], float)
        assert 1 <= len(d["items"]) and all({"sku", "qty", "price"} <= set(it) for it in d["items"])
    counts = collections.Counter(len(d["emails"]) for d in events)
    assert set(counts) == {1, 2, 3, 4, 5}
    gids = {d["generator_identifier"] for d in events}
    assert len(gids) == len(events)
    # mixed types, nulls and occasionally missing fields
    assert any(d["retries"] is None for d in events) and any(isinstance(d["retries"], int) for d in events)
    assert any("referrer" not in d for d in events) and any("referrer" in d for d in events)
    assert any("postal_code" not in d["geo"] for d in events)
    assert {type(d["success"]) for d in events} == {bool}
    # start_id shifts ids
    shifted = next(datagen.rockbench_events(1, start_id=123, event_time_us=T0))
    assert shifted["_id"] == "ev-123"


def test_event_time_defaults_to_now():
    import time

    before = time.time_ns() // 1000
    d = next(datagen.rockbench_events(1))
    after = time.time_ns() // 1000
    assert before <= d["_event_time"] <= after


def test_process_by_distribution(events):
    c = collections.Counter(d["processBy"] for d in events)
    assert len(c) > 2500  # many distinct values ...
    top = c.most_common(10)
    assert top[0][1] / N_EVENTS > 0.03  # ... with a Zipf-like head (expected ~8%)
    assert sum(v for _, v in top) / N_EVENTS > 0.15
    assert top[0][0] == datagen.process_by_value(0)
    # helper picks values that exist in the data (popular ones)
    rng = random.Random(1)
    picks = [datagen.random_process_by(rng, top=50) for _ in range(20)]
    assert all(p in c for p in picks)
    assert all(p in c for p in datagen.sample_process_by(events, k=20, seed=3))
    assert abs(datagen.process_by_rank_probability(0) - top[0][1] / N_EVENTS) < 0.02


def test_emails_pool_and_sampling(events):
    addrs = {datagen.email_address(k) for k in range(0, datagen.EMAIL_POOL_SIZE, 997)}
    assert len(addrs) == len(range(0, datagen.EMAIL_POOL_SIZE, 997))  # bijective pool
    present = {e for d in events for e in d["emails"]}
    assert len(present) > 12_000
    sample = datagen.sample_emails(events, k=25, seed=2)
    assert len(sample) == 25 and len(set(sample)) == 25
    assert all(e in present for e in sample)
    assert sample == datagen.sample_emails(events, k=25, seed=2)


def test_tsbs_rows():
    rows = list(datagen.tsbs_cpu_rows(2500, seed=3, hosts=1000))
    assert rows == list(datagen.tsbs_cpu_rows(2500, seed=3, hosts=1000))
    tag_keys = {
        "hostname", "region", "datacenter", "rack", "os", "arch", "team", "service",
        "service_version", "service_environment",
    }
    metrics = {
        "usage_user", "usage_system", "usage_idle", "usage_nice", "usage_iowait", "usage_irq",
        "usage_softirq", "usage_steal", "usage_guest", "usage_guest_nice",
    }
    for r in rows:
        assert set(r) == {"tags", "ts"} | metrics
        assert set(r["tags"]) == tag_keys and all(isinstance(v, str) for v in r["tags"].values())
        assert all(isinstance(r[m], int) and 0 <= r[m] <= 100 for m in metrics)
    assert rows[0]["ts"] == datagen.TSBS_START_US
    assert rows[999]["ts"] == rows[0]["ts"]
    assert rows[1000]["ts"] - rows[0]["ts"] == 10_000_000
    assert rows[2000]["ts"] - rows[0]["ts"] == 20_000_000
    assert rows[1]["tags"]["hostname"] == "host_1" and rows[1001]["tags"] == rows[1]["tags"]
    assert rows[1001]["tags"] is not rows[1]["tags"]
    assert len({r["tags"]["hostname"] for r in rows}) == 1000
    assert len(list(datagen.tsbs_cpu_rows(7, hosts=3))) == 7


def test_product_clicks():
    n = 60_000
    rows = list(datagen.product_clicks(n, seed=1))
    assert rows[:100] == list(datagen.product_clicks(100, seed=1))
    assert len({r["_id"] for r in rows}) == n
    names = set(datagen.city_names(300))
    assert len(names) == 300 and "UNITED ST2" in names
    c = collections.Counter(r["city"] for r in rows)
    assert set(c) == names
    share = c["UNITED ST2"] / n
    assert 0.5 / 300 < share < 1.5 / 300
    assert max(c.values()) / n < 2 / 300
    for r in rows[:5000]:
        assert 0 <= r["clicks"] <= r["impressions"]
        assert 0 <= r["product_id"] < 10_000
    ts = [r["ts"] for r in rows]
    assert ts == sorted(ts)
    assert datagen.random_city(5) in names


def test_leaf_paths():
    doc = {"a": 1, "b": {"c": None, "d": [1, 2]}, "e": [{"f": 1}, {"g": 2}], "h": []}
    assert datagen.leaf_paths(doc) == {"a", "b.c", "b.d[]", "e[].f", "e[].g", "h[]"}


def test_to_ndjson(events):
    blob = datagen.to_ndjson(events[:10])
    lines = blob.rstrip(b"\n").split(b"\n")
    assert [orjson.loads(x) for x in lines] == events[:10]
