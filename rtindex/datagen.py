"""Deterministic, fast data generators shared by the benchmarks, the demo and the notebooks.

Three workloads:

* :func:`rockbench_events` -- RockBench-style semi-structured events (~1.25 KB as
  orjson, ~60 leaf fields, nested objects, arrays of scalars and of objects, mixed
  types, nulls and occasionally missing fields).
* :func:`tsbs_cpu_rows` -- TSBS ``cpu``-like rows (10 string tags, a timestamp,
  10 integer metrics).
* :func:`product_clicks` -- a small flat fact table for SQL benchmarks.

Everything random is derived from ``seed`` (numpy ``default_rng`` for the bulk
values, drawn a chunk at a time), so the same arguments always give the same
documents -- except ``_event_time`` in :func:`rockbench_events` when
``event_time_us`` is None, which is the wall clock at generation (RockBench uses
it to measure ingest-to-query latency).

Value *pools* (process names, email addresses, cities, filler text) do not depend on
``seed``: ``"host-123"`` or an email address mean the same thing in every data set,
which lets benchmarks pick query parameters with the helpers below
(:func:`random_process_by`, :func:`email_address`, :func:`sample_emails`, ...).

Speed: values come from per-chunk numpy draws converted to Python lists and every string
from a precomputed pool. Materializing millions of documents in a list is much faster
with the cyclic GC disabled meanwhile (``gc.disable()``; see benchmarks/ingest.py), and
such a list takes several times the documents' JSON size in RAM.
The first k documents of any generator do not depend on ``n`` (whole chunks are drawn).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = [
    "PROCESS_BY_CARDINALITY",
    "EMAIL_POOL_SIZE",
    "TSBS_START_US",
    "rockbench_events",
    "tsbs_cpu_rows",
    "product_clicks",
    "process_by_value",
    "process_by_rank_probability",
    "random_process_by",
    "email_address",
    "sample_emails",
    "sample_process_by",
    "city_names",
    "random_city",
    "leaf_paths",
    "count_leaf_fields",
    "to_ndjson",
]

_CHUNK = 4096
FILLER_MIN, FILLER_MAX = 8, 30  # filler text lengths, tuned for ~1.25 KB events
_POOL_SEED = 0x5EED  # pools are the same for every data-set seed

# ---------------------------------------------------------------------------
# Pools
# ---------------------------------------------------------------------------

PROCESS_BY_CARDINALITY = 100_000
_PROCESS_BY_ZIPF_S = 1.0  # P(rank r) ~ 1 / (r + 1) ** s

EMAIL_POOL_SIZE = 1_000_000

_FIRST = [
    "james", "mary", "john", "patricia", "robert", "jennifer", "michael", "linda",
    "william", "elizabeth", "david", "barbara", "richard", "susan", "joseph", "jessica",
    "thomas", "sarah", "charles", "karen", "christopher", "nancy", "daniel", "lisa",
    "matthew", "betty", "anthony", "margaret", "mark", "sandra", "donald", "ashley",
    "steven", "kimberly", "paul", "emily", "andrew", "donna", "joshua", "michelle",
]  # 40
_LAST = [
    "smith", "johnson", "williams", "brown", "jones", "garcia", "miller", "davis",
    "rodriguez", "martinez", "hernandez", "lopez", "gonzalez", "wilson", "anderson",
    "thomas", "taylor", "moore", "jackson", "martin", "lee", "perez", "thompson", "white",
    "harris", "sanchez", "clark", "ramirez", "lewis", "robinson", "walker", "young",
    "allen", "king", "wright", "scott", "torres", "nguyen", "hill", "flores",
    "green", "adams", "nelson", "baker", "hall", "rivera", "campbell", "mitchell",
    "carter", "roberts",
]  # 50
_EMAIL_DOMAINS = [
    "gmail.com", "yahoo.com", "outlook.com", "aol.com", "icloud.com",
    "proton.me", "example.com", "corp.io", "mail.ru", "gmx.de",
]  # 10
# email k (0 <= k < EMAIL_POOL_SIZE) is a bijection of k:
#   first = k % 40, last = (k // 40) % 50, domain = (k // 2000) % 10, n = k // 20000
# built as _EMAIL_HEAD[k % 2000] + _EMAIL_TAIL[k // 2000] (no 1M-string table needed)
_NF, _NL, _ND = len(_FIRST), len(_LAST), len(_EMAIL_DOMAINS)
_EMAIL_HEAD = [f"{_FIRST[h % _NF]}.{_LAST[h // _NF]}" for h in range(_NF * _NL)]
_EMAIL_TAIL = [f"{t // _ND}@{_EMAIL_DOMAINS[t % _ND]}" for t in range(EMAIL_POOL_SIZE // (_NF * _NL))]
# number of addresses per event: 1..5 with P = .40, .25, .15, .12, .08 (mean 2.2)
_EMAIL_COUNT_CDF = np.cumsum([0.40, 0.25, 0.15, 0.12, 0.08])


def email_address(k: int) -> str:
    """The k-th address of the pool (unique for 0 <= k < EMAIL_POOL_SIZE)."""
    k = int(k) % EMAIL_POOL_SIZE
    return _EMAIL_HEAD[k % 2000] + _EMAIL_TAIL[k // 2000]


def process_by_value(rank: int) -> str:
    """processBy value of popularity ``rank`` (0 = most frequent)."""
    return _process_by_pool()[int(rank)]


@lru_cache(maxsize=1)
def _process_by_pool() -> list[str]:
    """Values ordered by popularity rank; the host numbers are a fixed permutation so
    that the most popular host is not ``host-0``."""
    perm = np.random.default_rng(_POOL_SEED).permutation(PROCESS_BY_CARDINALITY)
    return [f"host-{h}" for h in perm.tolist()]


@lru_cache(maxsize=1)
def _process_by_cdf() -> np.ndarray:
    w = 1.0 / np.power(np.arange(1, PROCESS_BY_CARDINALITY + 1, dtype=np.float64), _PROCESS_BY_ZIPF_S)
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    return cdf


def process_by_rank_probability(rank: int) -> float:
    """Probability that an event's processBy is the value of ``rank``."""
    cdf = _process_by_cdf()
    return float(cdf[rank] - (cdf[rank - 1] if rank > 0 else 0.0))


def random_process_by(rng: random.Random | np.random.Generator | int | None = None, top: int = 1000) -> str:
    """A processBy value among the ``top`` most popular ones: with the default 1000 the
    rarest candidate still has probability ~8e-5, i.e. ~8 hits per 100k events, so it
    exists in any data set of 100k+ events. Use ``top=PROCESS_BY_CARDINALITY`` for a
    uniform pick over the whole domain (may be absent from small data sets)."""
    top = max(1, min(int(top), PROCESS_BY_CARDINALITY))
    if rng is None or isinstance(rng, int):
        rng = random.Random(rng)
    if isinstance(rng, np.random.Generator):
        r = int(rng.integers(0, top))
    else:
        r = rng.randrange(top)
    return process_by_value(r)


def _zipf_ranks(gen: np.random.Generator, size: int) -> np.ndarray:
    return np.searchsorted(_process_by_cdf(), gen.random(size), side="right").clip(
        0, PROCESS_BY_CARDINALITY - 1
    )


# Small categorical pools for events -----------------------------------------

_EVENT_TYPES = [
    "page_view", "click", "add_to_cart", "remove_from_cart", "checkout", "purchase",
    "login", "logout", "signup", "search", "share", "like", "comment", "video_start",
    "video_stop", "error", "api_call", "download", "upload", "notification_open",
]
_TIERS = ["free", "basic", "pro", "enterprise"]
_STATUS_CODES = [200, 200, 200, 200, 200, 201, 204, 301, 302, 304, 400, 401, 403, 404, 429, 500, 502, 503]
_TAGS = [
    "alpha", "beta", "canary", "prod", "staging", "mobile", "web", "ios", "android",
    "promo", "holiday", "vip", "new-user", "returning", "ab-test-a", "ab-test-b",
    "internal", "partner", "organic", "paid",
]
_OS = [
    ("Android", ["10", "11", "12", "13", "14"]),
    ("iOS", ["15.7", "16.4", "16.6", "17.1", "17.4"]),
    ("Windows", ["10", "11"]),
    ("macOS", ["12.6", "13.5", "14.2", "14.4"]),
    ("Linux", ["5.15", "6.1", "6.5"]),
    ("ChromeOS", ["118", "120"]),
]
_OS_FLAT = [(name, v) for name, vs in _OS for v in vs]
_MANUFACTURERS = ["Samsung", "Apple", "Google", "Xiaomi", "OnePlus", "Lenovo", "Dell", "HP", "Asus", "Huawei"]
_MODELS = [f"{m[:3].upper()}-{k:03d}" for m in _MANUFACTURERS for k in range(20)]  # 200
_SCREENS = [(360, 800), (390, 844), (412, 915), (768, 1024), (1280, 800), (1366, 768), (1920, 1080), (2560, 1440)]
_BROWSERS = [("Chrome", ["118.0", "119.0", "120.0", "121.0"]), ("Safari", ["16.6", "17.1", "17.2"]),
             ("Firefox", ["119.0", "120.0", "121.0"]), ("Edge", ["119.0", "120.0"]), ("Opera", ["105.0"])]
_BROWSERS_FLAT = [(name, v) for name, vs in _BROWSERS for v in vs]
_LOCALES = ["en-US", "en-GB", "de-DE", "fr-FR", "es-ES", "pt-BR", "ja-JP", "zh-CN", "ko-KR", "it-IT", "nl-NL", "sv-SE"]
_ISPS = ["Comcast", "Verizon", "AT&T", "Vodafone", "Orange", "Deutsche Telekom", "NTT", "China Mobile",
         "Telefonica", "BT", "Charter", "T-Mobile"]
_CONN = ["wifi", "4g", "5g", "ethernet", "3g", None]
_COUNTRIES = [
    ("United States", "US"), ("Germany", "DE"),
    ("France", "FR"), ("United Kingdom", "GB"),
    ("Japan", "JP"), ("Brazil", "BR"),
    ("India", "IN"), ("Canada", "CA"),
    ("Australia", "AU"), ("Spain", "ES"),
    ("Italy", "IT"), ("Mexico", "MX"),
    ("South Korea", "KR"), ("Netherlands", "NL"),
    ("Sweden", "SE"),
]
_LEVELS = ["DEBUG", "INFO", "INFO", "WARN", "ERROR"]
_SOURCES = ["google", "bing", "twitter", "email", "direct", "partner"]
_CATEGORIES = ["books", "electronics", "toys", "garden", "grocery", "clothing", "sports", "beauty", "auto", "music"]
_WORDS = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et "
    "dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris nisi aliquip ex ea "
    "commodo consequat duis aute irure in reprehenderit voluptate velit esse cillum fugiat nulla pariatur "
    "excepteur sint occaecat cupidatat non proident sunt culpa qui officia deserunt mollit anim id est laborum "
    "stream index query shard segment rocks real time analytics event latency throughput vector filter"
).split()


@lru_cache(maxsize=1)
def _pools() -> dict[str, Any]:
    r = random.Random(_POOL_SEED)
    cities = []
    for ci, (country, code) in enumerate(_COUNTRIES):
        for k in range(40):  # 600 (city, country) combos
            name = f"{r.choice(_WORDS).capitalize()}{r.choice(_WORDS)}-{ci}{k}"
            lat = round(r.uniform(-60, 70), 4)
            lon = round(r.uniform(-170, 170), 4)
            cities.append((name, code, lat, lon, f"{r.randrange(10000, 99999)}"))

    def sentence(lo: int, hi: int) -> str:
        target = r.randint(lo, hi)
        out: list[str] = []
        n = 0
        while n < target:
            w = r.choice(_WORDS)
            out.append(w)
            n += len(w) + 1
        return " ".join(out)[:target]

    fillers = [sentence(FILLER_MIN, FILLER_MAX) for _ in range(8192)]
    ref_hosts = ["google.com", "bing.com", "twitter.com", "news.ycombinator.com", "facebook.com", "reddit.com"]
    referrers = [f"https://{r.choice(ref_hosts)}/{r.choice(_WORDS)}" for _ in range(256)]
    ips = [f"{r.randrange(1, 224)}.{r.randrange(256)}.{r.randrange(256)}.{r.randrange(1, 255)}" for _ in range(65536)]
    skus = [f"SKU-{k:06d}" for k in range(50_000)]
    hexes = [f"{r.getrandbits(64):016x}" for _ in range(65536)]
    return {
        "cities": cities, "fillers": fillers, "referrers": referrers, "ips": ips, "skus": skus, "hexes": hexes,
    }


# ---------------------------------------------------------------------------
# RockBench-style events
# ---------------------------------------------------------------------------


def rockbench_events(
    n: int,
    seed: int = 0,
    start_id: int = 0,
    event_time_us: int | None = None,
    event_time_step_us: int = 1000,
) -> Iterator[dict[str, Any]]:
    """Yield ``n`` RockBench-style events with ids ``ev-{start_id}`` .. ``ev-{start_id+n-1}``.

    ``_event_time``: if ``event_time_us`` is None, the wall clock (microseconds since
    the epoch) when each event is generated; otherwise ``event_time_us + j *
    event_time_step_us`` for the j-th event (deterministic). Values depend on
    ``(seed, start_id)``, so generating ``[0, n)`` in two calls with the same seed
    but different ``start_id`` does *not* give the same documents as one call.
    """
    gen = np.random.default_rng([seed, start_id, 0xE7E7])
    p = _pools()
    cities, fillers = p["cities"], p["fillers"]
    referrers, ips = p["referrers"], p["ips"]
    skus, hexes = p["skus"], p["hexes"]
    campaigns = [f"cmp-{k}" for k in range(1000)]
    pb_pool = _process_by_pool()
    e_head, e_tail = _EMAIL_HEAD, _EMAIL_TAIL
    n_os, n_br = len(_OS_FLAT), len(_BROWSERS_FLAT)
    clock = time.time_ns

    done = 0
    while done < n:
        # Always draw whole chunks (and use the first m rows) so that the first k
        # events of n are the same for every n >= k.
        m = min(_CHUNK, n - done)
        C = _CHUNK
        U = gen.random((C, 10))[:m]  # uniforms for booleans/branching
        I = gen.integers(0, 1 << 31, size=(C, 24))[:m].tolist()
        F = gen.random((C, 8))[:m]
        gid = gen.integers(0, 1 << 63, size=C, dtype=np.int64)[:m].tolist()
        pb = _zipf_ranks(gen, C)[:m].tolist()
        n_em = (np.searchsorted(_EMAIL_COUNT_CDF, gen.random(C), side="right").clip(0, 4) + 1)[:m].tolist()
        em = gen.integers(0, EMAIL_POOL_SIZE, size=(C, 5))[:m].tolist()
        n_items = gen.integers(1, 4, size=C)[:m].tolist()
        it = gen.integers(0, 1 << 31, size=(C, 3, 3))[:m].tolist()
        it_price = np.round(gen.random((C, 3)) * 500 + 0.5, 2)[:m].tolist()
        n_tags = gen.integers(0, 5, size=C)[:m].tolist()
        duration = np.round(gen.exponential(120.0, C), 3)[:m].tolist()
        score = np.round(F[:, 0] * 100, 4).tolist()
        battery = np.round(F[:, 1], 3).tolist()
        latency = np.round(F[:, 2] * 300, 2).tolist()
        cpu = np.round(F[:, 3] * 100, 2).tolist()
        load1 = np.round(F[:, 4] * 8, 2).tolist()
        load5 = np.round(F[:, 5] * 6, 2).tolist()
        amount = np.round(F[:, 6] * 1000, 2).tolist()
        Ub = (U < 0.5).tolist()
        U = U.tolist()

        for j in range(m):
            i = start_id + done + j
            ij = I[j]
            u = U[j]
            ub = Ub[j]
            city = cities[ij[0] % 600]
            os_name, os_ver = _OS_FLAT[ij[1] % n_os]
            br_name, br_ver = _BROWSERS_FLAT[ij[2] % n_br]
            sw, sh = _SCREENS[ij[3] % 8]
            ej = em[j]
            itj = it[j]
            pj = it_price[j]
            items = [
                {
                    "sku": skus[itj[k][0] % 50_000],
                    "qty": itj[k][1] % 10 + 1,
                    "price": pj[k],
                    "cat": _CATEGORIES[itj[k][2] % 10],
                }
                for k in range(n_items[j])
            ]
            geo = {
                "city": city[0],
                "country": city[1],
                "lat": city[2],
                "lon": city[3],
            }
            if u[0] > 0.1:
                geo["postal_code"] = city[4]
            doc = {
                "_id": f"ev-{i}",
                "_event_time": (clock() // 1000 if event_time_us is None
                                else event_time_us + (done + j) * event_time_step_us),
                "generator_identifier": gid[j],
                "processBy": pb_pool[pb[j]],
                "emails": [e_head[ej[k] % 2000] + e_tail[ej[k] // 2000] for k in range(n_em[j])],
                "event_type": _EVENT_TYPES[ij[4] % 20],
                "severity": ij[5] % 8,
                "status": _STATUS_CODES[ij[6] % 18],
                "success": ub[1],
                "duration_ms": duration[j],
                "bytes": ij[7] % 5_000_000,
                "retries": None if u[2] < 0.3 else ij[8] % 5,
                "session_id": hexes[ij[9] & 0xFFFF],
                "user_id": ij[10] % 10_000_000,
                "tier": _TIERS[ij[11] & 3],
                "score": score[j],
                "is_test": u[3] < 0.02,
                "tags": [_TAGS[(ij[12] + 7 * k) % 20] for k in range(n_tags[j])],
                "device": {
                    "os": {"name": os_name, "ver": os_ver},
                    "model": _MODELS[ij[14] % 200],
                    "maker": _MANUFACTURERS[(ij[14] % 200) // 20],
                    "screen": {"w": sw, "h": sh},
                    "battery": battery[j] if ub[4] else None,
                    "mobile": os_name in ("Android", "iOS"),
                },
                "geo": geo,
                "ua": {
                    "browser": {"name": br_name, "ver": br_ver},
                    "locale": _LOCALES[ij[15] % 12],
                },
                "network": {
                    "ip": ips[ij[16] & 0xFFFF],
                    "isp": _ISPS[ij[17] % 12],
                    "conn": _CONN[ij[17] % 6],
                    "rtt_ms": latency[j],
                },
                "items": items,
                "metrics": {
                    "cpu": cpu[j],
                    "mem_mb": ij[18] % 16384,
                    "load1": load1[j],
                    "load5": load5[j],
                },
                "payment": {
                    "amount": amount[j],
                    "currency": ("USD", "EUR", "GBP", "JPY", "BRL")[ij[20] % 5],
                    "method": ("card", "paypal", "apple_pay", "bank", None)[ij[20] % 5],
                },
                "text_0": fillers[ij[22] & 0x1FFF],
                "level": _LEVELS[(ij[22] >> 13) % 5],
                "lang": _LOCALES[ij[15] % 12][:2],
                "priority": ij[19] % 5,
                "sampled": u[9] < 0.1,
                "shard_key": ij[19] % 64,
                "version": ij[5] % 3 + 1,
                "flag_a": ub[5],
                "flag_b": ub[6],
            }
            if u[7] < 0.8:
                doc["referrer"] = referrers[ij[13] & 0xFF]
            if u[8] < 0.5:
                c = ij[15] % 1000
                doc["campaign"] = {"id": c, "name": campaigns[c], "source": _SOURCES[ij[23] % 6]}
            yield doc
        done += m


# ---------------------------------------------------------------------------
# TSBS cpu
# ---------------------------------------------------------------------------

TSBS_START_US = 1_451_606_400_000_000  # 2016-01-01T00:00:00Z, TSBS's default start
_TSBS_INTERVAL_US = 10_000_000
_TSBS_METRICS = (
    "usage_user", "usage_system", "usage_idle", "usage_nice", "usage_iowait",
    "usage_irq", "usage_softirq", "usage_steal", "usage_guest", "usage_guest_nice",
)
_TSBS_REGIONS = {
    "us-east-1": ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1e"],
    "us-west-1": ["us-west-1a", "us-west-1b"],
    "us-west-2": ["us-west-2a", "us-west-2b", "us-west-2c"],
    "eu-west-1": ["eu-west-1a", "eu-west-1b", "eu-west-1c"],
    "eu-central-1": ["eu-central-1a", "eu-central-1b"],
    "ap-southeast-1": ["ap-southeast-1a", "ap-southeast-1b"],
    "ap-southeast-2": ["ap-southeast-2a", "ap-southeast-2b"],
    "ap-northeast-1": ["ap-northeast-1a", "ap-northeast-1c"],
    "sa-east-1": ["sa-east-1a", "sa-east-1b", "sa-east-1c"],
}


def _tsbs_host_tags(hosts: int, seed: int) -> list[dict[str, str]]:
    r = random.Random(seed * 1_000_003 + 17)
    regions = list(_TSBS_REGIONS)
    out = []
    for h in range(hosts):
        region = r.choice(regions)
        out.append({
            "hostname": f"host_{h}",
            "region": region,
            "datacenter": r.choice(_TSBS_REGIONS[region]),
            "rack": str(r.randrange(100)),
            "os": r.choice(["Ubuntu16.10", "Ubuntu16.04LTS", "Ubuntu15.10"]),
            "arch": r.choice(["x64", "x86"]),
            "team": r.choice(["SF", "NYC", "LON", "CHI"]),
            "service": str(r.randrange(20)),
            "service_version": str(r.randrange(2)),
            "service_environment": r.choice(["production", "staging", "test"]),
        })
    return out


def tsbs_cpu_rows(n: int, seed: int = 0, hosts: int = 1000) -> Iterator[dict[str, Any]]:
    """Yield ``n`` TSBS ``cpu`` rows: hosts report in rounds (host_0 .. host_{hosts-1}),
    ``ts`` advances 10 s per round from 2016-01-01; metrics are bounded random walks
    in 0..100 per host. Each row gets its own copy of its host's ``tags`` dict."""
    if hosts <= 0:
        raise ValueError("hosts must be positive")
    gen = np.random.default_rng([seed, 0x75B5])
    tags = _tsbs_host_tags(hosts, seed)
    state = gen.integers(0, 101, size=(hosts, 10))
    metrics = _TSBS_METRICS
    done = 0
    rnd = 0
    while done < n:
        m = min(hosts, n - done)
        state = np.clip(state + gen.integers(-5, 6, size=(hosts, 10)), 0, 100)
        vals = state[:m].tolist()
        ts = TSBS_START_US + rnd * _TSBS_INTERVAL_US
        for h in range(m):
            row = dict(zip(metrics, vals[h]))
            yield {"tags": dict(tags[h]), "ts": ts, **row}
        done += m
        rnd += 1


# ---------------------------------------------------------------------------
# Product clicks
# ---------------------------------------------------------------------------

_CITY_PREFIXES = [
    "UNITED ST", "NEW YORK", "LOS ANGEL", "SAN FRANC", "CHICAGO", "HOUSTON", "PHOENIX",
    "PHILADELP", "SAN ANTON", "SAN DIEGO", "DALLAS", "SAN JOSE", "AUSTIN", "JACKSONVI",
    "FORT WORT", "COLUMBUS", "CHARLOTTE", "INDIANAPO", "SEATTLE", "DENVER", "WASHINGTO",
    "BOSTON", "EL PASO", "NASHVILLE", "DETROIT", "PORTLAND", "LAS VEGAS", "MEMPHIS",
    "LOUISVILL", "BALTIMORE",
]  # 30


def city_names(cities: int = 300) -> list[str]:
    """The ``cities`` distinct city strings used by :func:`product_clicks`
    ("UNITED ST0", "NEW YORK0", ..., "UNITED ST1", ...)."""
    P = len(_CITY_PREFIXES)
    return [f"{_CITY_PREFIXES[k % P]}{k // P}" for k in range(cities)]


def random_city(rng: random.Random | int | None = None, cities: int = 300) -> str:
    if rng is None or isinstance(rng, int):
        rng = random.Random(rng)
    return rng.choice(city_names(cities))


def product_clicks(
    n: int, seed: int = 0, cities: int = 300, products: int = 10_000, start_ts_us: int = TSBS_START_US
) -> Iterator[dict[str, Any]]:
    """Yield ``n`` rows ``{_id, city, product_id, clicks, impressions, ts}``; ``city`` is
    uniform over :func:`city_names` (each ~1/cities of the rows), ``product_id`` uniform
    in ``[0, products)``, ``impressions >= clicks``, ``ts`` increasing ~1 s per row."""
    gen = np.random.default_rng([seed, 0xC11C])
    names = city_names(cities)
    done = 0
    while done < n:
        m = min(_CHUNK, n - done)
        C = _CHUNK  # whole chunks: the first k rows of n are the same for every n >= k
        c = gen.integers(0, cities, size=C)[:m].tolist()
        pid = gen.integers(0, products, size=C)[:m].tolist()
        imp = gen.integers(0, 1000, size=C)
        clk = (imp * gen.random(C) * 0.2).astype(np.int64)
        dt = np.cumsum(gen.integers(0, 2_000_000, size=C)) + start_ts_us
        start_ts_us = int(dt[-1])
        imp_l, clk_l, ts_l = imp[:m].tolist(), clk[:m].tolist(), dt[:m].tolist()
        for j in range(m):
            yield {
                "_id": f"pc-{done + j}",
                "city": names[c[j]],
                "product_id": pid[j],
                "clicks": clk_l[j],
                "impressions": imp_l[j],
                "ts": ts_l[j],
            }
        done += m


# ---------------------------------------------------------------------------
# Helpers for benchmarks
# ---------------------------------------------------------------------------


def sample_emails(docs: Iterable[dict[str, Any]], k: int = 10, seed: int = 0, scan: int = 100_000) -> list[str]:
    """``k`` distinct email addresses that occur in ``docs`` (reservoir sample over the
    first ``scan`` documents). Good query parameters for array-membership lookups."""
    r = random.Random(seed)
    seen: set[str] = set()
    res: list[str] = []
    t = 0
    for idx, d in enumerate(docs):
        if idx >= scan:
            break
        for e in d.get("emails") or ():
            if e in seen:
                continue
            seen.add(e)
            if len(res) < k:
                res.append(e)
            else:
                s = r.randrange(t + 1)
                if s < k:
                    res[s] = e
            t += 1
    return res


def sample_process_by(docs: Iterable[dict[str, Any]], k: int = 10, seed: int = 0, scan: int = 100_000) -> list[str]:
    """``k`` processBy values that occur in ``docs``, drawn with the data's own skew
    (popular values are more likely), possibly with repeats."""
    vals = []
    for idx, d in enumerate(docs):
        if idx >= scan:
            break
        if "processBy" in d:
            vals.append(d["processBy"])
    if not vals:
        return []
    r = random.Random(seed)
    return [r.choice(vals) for _ in range(k)]


def leaf_paths(doc: Any, prefix: str = "") -> set[str]:
    """Distinct leaf paths of a document; array elements use ``[]`` (``items[].sku``),
    an array of scalars counts as one path (``emails[]``)."""
    out: set[str] = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            out |= leaf_paths(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(doc, list):
        if not doc:
            out.add(prefix + "[]")
        for v in doc:
            out |= leaf_paths(v, prefix + "[]")
    else:
        out.add(prefix)
    return out


def count_leaf_fields(doc: Any) -> int:
    return len(leaf_paths(doc))


def to_ndjson(docs: Iterable[dict[str, Any]]) -> bytes:
    import orjson

    return b"\n".join(orjson.dumps(d) for d in docs) + b"\n"
