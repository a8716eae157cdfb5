#!/usr/bin/env python
"""RowStoreCache: search-then-aggregate queries with the cache off and warm, same data, same run.

    python benchmarks/rowcache.py [--quick] [--clicks N] [--events N] [--cities C] [--pb-values K]
                                  [--seconds S] [--rounds R] [--cache-mb MB] [--shards S] [--dir DIR]

What is measured: the index path of a selective query is "posting-list lookup, then add
fields" (fetch the matched rows: a RocksDB read plus a JSON decode per row, then pick the
fields out of them), then, for aggregates, DuckDB over the fetched values. The RowStoreCache
(rtindex/rowcache.py, docs/architecture.md) keeps decoded rows, so a warm cache replaces the
read and the decode by a hash lookup. Two queries, one client:

* CTR: ``SELECT product_id, SUM(CAST(clicks AS FLOAT)) / (SUM(CAST(impressions AS FLOAT))
  + 1.0) AS ctr FROM product_clicks WHERE city = :city GROUP BY product_id ORDER BY ctr DESC
  LIMIT 100`` (benchmarks/query.py's text) over ``product_clicks`` rows (default 10,000,000;
  --quick 1,000,000; 300 cities, so one city matches ~0.33% of the rows), a different city
  each time: a fixed set of ``--cities`` (40) distinct cities in random order;
* events: ``SELECT _id, generator_identifier, processBy FROM events WHERE processBy = :p``
  (three scalar fields) over RockBench events (default 1,000,000; --quick 100,000), ``p``
  from a fixed set of ``--pb-values`` (300) values drawn uniformly from the distinct
  processBy values present in the data (as benchmarks/query.py draws them; processBy is
  Zipf-distributed, so most values match a handful of rows). The set is drawn uniformly from
  the generator's whole domain and then restricted to the values the data holds, which is a
  uniform draw among the present values and lets the expected answers be collected while
  loading.

Data is generated while it is loaded (not kept in memory): ``rtindex.open(dir)``,
``create_collection(name, shards=4)``, ``coll.ingest(docs, batch_size=10_000)``, then
``coll.flush()``, so every segment is sealed (the steady state); then the database is closed.
The same directory is then opened again and again, alternating the two phases
``--rounds`` times (default 2: off, warm, off, warm) so that machine noise affects both alike:

* cache off: ``rtindex.open(dir, row_cache_bytes=0)``; one unmeasured pass over each
  parameter set (RocksDB block cache, DuckDB and plan cache warm), then measuring;
* cache warm: ``rtindex.open(dir, row_cache_bytes=N)``; one unmeasured pass over each
  parameter set fills the cache (N is computed from the matched rows' JSON sizes: a cached
  row is charged what rtindex/rowcache.py charges (5x its JSON size + 64 bytes); 25% headroom; ``--cache-mb`` overrides it; the
  cache's bytes and entries after filling are printed and a warning is printed if anything
  was evicted), then measuring.

Each measurement runs whole passes over the parameter set, in the same order in both phases,
until ``--seconds / --rounds`` have passed (``--seconds``: default 10, --quick 5, per query
kind and phase). Per query, ``res = db.sql(text, params)``; ``res.access`` must be "index"
(the run stops, printing the plan, if the planner picks the column scan). Figures, per
query kind and phase, over all rounds: add-fields ms per query (``res.timings["fetch"]``:
matched rows -> values), plan and DuckDB ms, end-to-end p50/p95 ms (``res.seconds``), QPS
(queries / wall time of the measuring loop, which also materializes the rows) and the
cache's hit rate over the measured queries only (the difference of ``db.stats()
["row_cache"]`` counters around them). Medians are over every measured query of the phase.

Correctness: in every round, after the unmeasured pass and one run of each checked
parameter (so in the warm phase the checked results come from cached rows), a few
parameters of each kind (the first measured ones, the processBy values of popularity rank
10 (~0.75% of the events) and 1000, absent values) are run and compared with the answers
computed from the generated data while loading, and with their first run (round 1, cache
off): the same rows, ctr within 1e-6 relative. Any disagreement is printed and the exit
status is 1.

Prints progress to stderr; EXPLAIN of one query of each kind, a table (with the targets,
not asserted: add_fields_speedup >= 4 and e2e_speedup >= 3 on the CTR query) and, as the
LAST stdout line, one JSON object (add_fields_speedup, e2e_speedup, ctr_p50_ms_cache_off,
ctr_p50_ms_cache_warm, ctr_add_fields_p50_ms_cache_off, ..., hit_rate, the same prefixed
``events_``, rows per query, cache bytes/entries, peak_rss_mb, ...).

--quick (1,000,000 product_clicks rows, 100,000 events, 5 s per kind and phase) takes about
one minute on a shared 2-core machine (60 s measured; ~30 s of it generating and loading the
data), so it keeps the full 100,000 events. The default sizes need ~1.7 GiB of row cache
(as charged: 40 cities x ~33,000 rows, plus the events') and ~10 minutes (9.5 measured),
~7 of them loading.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import orjson  # noqa: E402

from benchmarks import datagen  # noqa: E402
from benchmarks.ingest import (  # noqa: E402
    EVENT_TIME_BASE_US,
    Progress,
    _fmt,
    dir_size_mb,
    log,
    peak_rss_mb,
)
from benchmarks.query import CTR_LIMIT, RT_CTR, _close  # noqa: E402
from rtindex.rowcache import DECODED_BYTES_PER_JSON_BYTE, ENTRY_BYTES  # noqa: E402

RT_EVENTS = "SELECT _id, generator_identifier, processBy FROM events WHERE processBy = :p"
KINDS = ("ctr", "events")
PHASES = ("off", "warm")
# What rtindex/rowcache.py charges for a cached row (bytes per JSON byte, plus an entry).
CACHED_BYTES_PER_JSON_BYTE = DECODED_BYTES_PER_JSON_BYTE
CACHE_ENTRY_BYTES = ENTRY_BYTES
# ingest adds "_event_time" (microseconds) to a document without one: ',"_event_time":' + 16 digits
EVENT_TIME_JSON_BYTES = 31
MiB = 1 << 20
TARGETS = {"add_fields_speedup": 4.0, "e2e_speedup": 3.0}


# ---------------------------------------------------------------------------
# Workload: parameter sets and expected answers, collected while loading
# ---------------------------------------------------------------------------


@dataclass
class Kind:
    name: str  # "ctr" or "events"
    collection: str
    text: str
    key: str  # the placeholder's name
    params: list  # measured, in this order, in both phases
    check: list  # verified parameters
    truth: dict = field(default_factory=dict)  # param -> expected result (see expected())
    cached_bytes: dict = field(default_factory=dict)  # param -> what its rows cost in the cache
    matched: dict = field(default_factory=dict)  # param -> matched rows (from the data)


def clicks_stream(n: int, seed: int, kind: Kind) -> Iterator[dict]:
    """product_clicks rows, recording per city the rows' cache cost and, for the checked
    cities, the (clicks, impressions) sums per product."""
    watch = set(kind.params) | set(kind.check)
    agg: dict[str, dict[int, list[int]]] = {c: {} for c in kind.check}
    size: dict[str, int] = dict.fromkeys(watch, 0)
    count: dict[str, int] = dict.fromkeys(watch, 0)
    dumps = orjson.dumps
    for r in datagen.product_clicks(n, seed=seed):
        c = r["city"]
        if c in watch:
            raw = len(dumps(r)) + (0 if "_event_time" in r else EVENT_TIME_JSON_BYTES)
            size[c] += raw * CACHED_BYTES_PER_JSON_BYTE + CACHE_ENTRY_BYTES
            count[c] += 1
            a = agg.get(c)
            if a is not None:
                s = a.setdefault(r["product_id"], [0, 0])
                s[0] += r["clicks"]
                s[1] += r["impressions"]
        yield r
    kind.cached_bytes, kind.matched = size, count
    for c, per in agg.items():
        ctr = {pid: ck / (imp + 1.0) for pid, (ck, imp) in per.items()}
        kind.truth[c] = (ctr, sorted(ctr.items(), key=lambda kv: -kv[1])[:CTR_LIMIT])


def events_stream(n: int, seed: int, kind: Kind, candidates: set[str]) -> Iterator[dict]:
    """RockBench events, recording for the candidate processBy values (and the checked
    ones) the matched rows' (_id, generator_identifier, processBy) and their cache cost."""
    watch = candidates | set(kind.check)
    rows: dict[str, list[tuple]] = {}
    size: dict[str, int] = {}
    dumps = orjson.dumps
    for d in datagen.rockbench_events(n, seed=seed, event_time_us=EVENT_TIME_BASE_US):
        p = d.get("processBy")
        if p in watch:
            rows.setdefault(p, []).append((d["_id"], d["generator_identifier"], p))
            raw = len(dumps(d)) + (0 if "_event_time" in d else EVENT_TIME_JSON_BYTES)
            size[p] = size.get(p, 0) + raw * CACHED_BYTES_PER_JSON_BYTE + CACHE_ENTRY_BYTES
        yield d
    kind.truth = {p: sorted(rows.get(p, [])) for p in watch}
    kind.cached_bytes = {p: size.get(p, 0) for p in watch}
    kind.matched = {p: len(rows.get(p, [])) for p in watch}


def load(path: str, args: argparse.Namespace, n_clicks: int, n_events: int, res: dict) -> dict[str, Kind]:
    """Generate and load both collections (flushed: all sealed), draw the parameter sets and
    collect the expected answers; returns the two query kinds."""
    import rtindex

    rng = random.Random(args.seed)
    cities = rng.sample(datagen.city_names(), min(args.cities, len(datagen.city_names())))
    ctr = Kind("ctr", "product_clicks", RT_CTR, "city", cities,
               check=list(dict.fromkeys(cities[:3] + ["NOWHERE0"])))
    # Uniform over the generator's domain, later restricted to the values present: a uniform
    # draw among the present values whose answers can be recorded while loading.
    n_cand = min(datagen.PROCESS_BY_CARDINALITY, max(20 * args.pb_values, 2000))
    cand = [datagen.process_by_value(r) for r in rng.sample(range(datagen.PROCESS_BY_CARDINALITY), n_cand)]
    events = Kind("events", "events", RT_EVENTS, "p", [],
                  check=[datagen.process_by_value(10), datagen.process_by_value(1000), "host-absent"])

    db = rtindex.open(path)
    try:
        for kind, n, unit, stream in (
            (ctr, n_clicks, "rows", lambda: clicks_stream(n_clicks, args.seed, ctr)),
            (events, n_events, "docs", lambda: events_stream(n_events, args.seed, events, set(cand))),
        ):
            cname = kind.collection
            coll = db.create_collection(cname, shards=args.shards)
            log(f"rtindex: generating and loading {n:,} {cname} ({args.shards} shards, batch {args.batch}) ...")
            p = Progress(f"load {cname}", n, unit=unit)
            t0 = time.perf_counter()
            stats = coll.ingest(p.wrap(stream()), batch_size=args.batch)
            coll.flush()  # every segment sealed, merges done: the steady state
            p.finish(" (generation included; flushed: all data sealed)")
            res[f"load_{cname}_seconds"] = time.perf_counter() - t0
            if stats.errors:
                raise RuntimeError(f"rtindex {cname}: {len(stats.errors):,} ingest errors, e.g. {stats.errors[:3]}")
            cnt = coll.count()
            if cnt != n:
                raise RuntimeError(f"rtindex {cname}: count() is {cnt:,} after ingesting {n:,} documents")
            st = coll.stats()["shards"]
            sealed, mem = sum(s["sealed_segments"] for s in st), sum(s["memory_segments"] for s in st)
            log(f"rtindex: {cname}: {cnt:,} documents, {sealed} sealed / {mem} in-memory segments")
            res[f"{cname}_segments_sealed"], res[f"{cname}_segments_in_memory"] = sealed, mem
            del stats
            gc.collect()
    finally:
        db.close()
    res["disk_mb"] = dir_size_mb(path)

    present = [p for p in cand if events.matched.get(p)]
    events.params = present[:args.pb_values]
    if len(events.params) < args.pb_values:
        log(f"!! only {len(events.params)} of the {n_cand} candidate processBy values occur in the data "
            f"(wanted {args.pb_values})")
    if not events.params:
        raise RuntimeError("no processBy value of the candidates occurs in the data")
    events.check = list(dict.fromkeys(events.params[:3] + events.check))
    # free the answers of candidates that are neither measured nor checked
    keep = set(events.params) | set(events.check)
    events.truth = {p: v for p, v in events.truth.items() if p in keep}
    log(f"parameters: {len(ctr.params)} cities ({_mean([ctr.matched[c] for c in ctr.params]):,.0f} rows each), "
        f"{len(events.params)} processBy values ({_mean([events.matched[p] for p in events.params]):,.1f} rows "
        f"each, max {max(events.matched[p] for p in events.params):,}); checked: "
        + ", ".join(f"{p!r} ({events.matched.get(p, 0):,} rows)" for p in events.check))
    return {"ctr": ctr, "events": events}


def _mean(xs: list) -> float:
    return sum(xs) / len(xs) if xs else 0.0


# ---------------------------------------------------------------------------
# Running and checking
# ---------------------------------------------------------------------------


def result_of(kind: Kind, rows: list[dict]) -> Any:
    if kind.name == "ctr":
        return [(r["product_id"], r["ctr"]) for r in rows]
    return sorted((r["_id"], r["generator_identifier"], r["processBy"]) for r in rows)


def ctr_problems(got: list[tuple], ctr: dict[int, float], top: list[tuple]) -> list[str]:
    errs = []
    if len(got) != len(top):
        errs.append(f"{len(got)} rows, expected {len(top)}")
    if len({pid for pid, _ in got}) != len(got):
        errs.append("duplicate products")
    for i, (pid, c) in enumerate(got):
        if pid not in ctr or not _close(c, ctr[pid]):
            errs.append(f"product {pid}: ctr {c!r}, expected {ctr.get(pid)!r}")
        if i < len(top) and not _close(c, top[i][1]):
            errs.append(f"row {i}: ctr {c!r} (product {pid}), expected {top[i][1]!r} (product {top[i][0]})")
    return errs


def same_ctr(a: list[tuple], b: list[tuple]) -> list[str]:
    """Off vs warm: the same products, each ctr within REL_TOL."""
    errs = []
    da, db_ = dict(a), dict(b)
    if len(a) != len(b) or set(da) != set(db_):
        errs.append(f"{len(a)} vs {len(b)} rows; products only in one: {sorted(set(da) ^ set(db_))[:8]}")
    errs += [f"product {pid}: ctr {c!r} vs {db_[pid]!r}" for pid, c in da.items()
             if pid in db_ and not _close(c, db_[pid])]
    return errs


def check(db: Any, kinds: dict[str, Kind], phase: str, rnd: int, seen: dict, problems: list[str]) -> None:
    """Run the checked parameters, compare with the expected answers and with the other
    phase's results (``seen``: (kind, param) -> (phase, result) of the first run)."""
    for kind in kinds.values():
        for p in kind.check:
            res = db.sql(kind.text, {kind.key: p})
            got = result_of(kind, res.rows())
            where = f"cache {phase}, round {rnd}: {kind.name} query with :{kind.key}={p!r}"
            if res.access != "index":
                problems.append(f"{where}: ran on the {res.access} path, not the index path")
            if kind.name == "ctr":
                ctr, top = kind.truth.get(p, ({}, []))
                errs = ctr_problems(got, ctr, top)
            else:
                want = kind.truth.get(p, [])
                errs = [] if got == want else [f"{len(got):,} rows, expected {len(want):,}; missing "
                                               f"{sorted(set(want) - set(got))[:3]}, extra {sorted(set(got) - set(want))[:3]}"]
            if (kind.name, p) in seen:  # the first run (round 1, cache off)
                other, prev = seen[(kind.name, p)]
                diff = same_ctr(prev, got) if kind.name == "ctr" else (
                    [] if prev == got else [f"{len(prev):,} vs {len(got):,} rows"])
                errs += [f"differs from {other}: {e}" for e in diff]
            else:
                seen[(kind.name, p)] = (f"cache {phase}, round {rnd}", got)
            if errs:
                problems.append(f"{where}: " + "; ".join(errs[:6])
                                + (f"; ... {len(errs) - 6} more" if len(errs) > 6 else "")
                                + f"; got first rows {got[:3]}")


class PlannerChoseScan(AssertionError):
    pass


def run_pass(db: Any, kind: Kind, rec: dict | None = None) -> None:
    """One pass over the parameter set; with ``rec``, each query's figures are appended."""
    clock = time.perf_counter
    for p in kind.params:
        params = {kind.key: p}
        res = db.sql(kind.text, params)
        n = len(res.rows())  # the client materializes the rows
        if res.access != "index":
            raise PlannerChoseScan(f"the planner ran the {kind.name} query with :{kind.key}={p!r} on the "
                                   f"{res.access} path, not the index path:\n{db.explain(kind.text, params)}")
        if rec is not None:
            t = res.timings
            rec["e2e"].append(res.seconds)
            rec["fetch"].append(t["fetch"])
            rec["plan"].append(t.get("plan", 0.0))
            rec["duckdb"].append(t.get("duckdb", 0.0))
            rec["matched"].append(res.plan.matched_rows)
            rec["result"].append(n)
    if rec is not None:
        rec["t_end"] = clock()


def new_record() -> dict:
    return {"e2e": [], "fetch": [], "plan": [], "duckdb": [], "matched": [], "result": [], "wall": 0.0,
            "queries": 0, "passes": 0, "hits": 0, "misses": 0, "evictions": 0, "round_p50_ms": []}


def measure(db: Any, kind: Kind, seconds: float, rec: dict, label: str) -> None:
    """Whole passes over ``kind.params`` for at least ``seconds``; appends to ``rec``."""
    before = db.stats()["row_cache"]
    n0 = len(rec["e2e"])
    start = time.perf_counter()
    passes = 0
    while passes == 0 or rec["t_end"] - start < seconds:
        run_pass(db, kind, rec)
        passes += 1
    el = rec["t_end"] - start
    after = db.stats()["row_cache"]
    k = len(rec["e2e"]) - n0
    rec["wall"] += el
    rec["queries"] += k
    rec["passes"] += passes
    for c in ("hits", "misses", "evictions"):
        rec[c] += after[c] - before[c]
    p50 = float(np.median(rec["e2e"][n0:])) * 1e3
    rec["round_p50_ms"].append(p50)
    hm = (after["hits"] - before["hits"], after["misses"] - before["misses"])
    log(f"  [{label}] {k:,} queries ({passes} passes) in {el:.1f}s: {k / el:,.1f} q/s, p50 {p50:.3f} ms, "
        f"add fields p50 {float(np.median(rec['fetch'][n0:])) * 1e3:.3f} ms"
        + (f", cache hits {hm[0]:,} misses {hm[1]:,}" if sum(hm) else ""))


def summarize(rec: dict) -> dict[str, Any]:
    ms = {k: np.array(rec[k]) * 1e3 for k in ("e2e", "fetch", "plan", "duckdb")}
    lookups = rec["hits"] + rec["misses"]
    return {
        "p50_ms": float(np.percentile(ms["e2e"], 50)),
        "p95_ms": float(np.percentile(ms["e2e"], 95)),
        "p99_ms": float(np.percentile(ms["e2e"], 99)),
        "add_fields_p50_ms": float(np.percentile(ms["fetch"], 50)),
        "add_fields_p95_ms": float(np.percentile(ms["fetch"], 95)),
        "plan_p50_ms": float(np.percentile(ms["plan"], 50)),
        "duckdb_p50_ms": float(np.percentile(ms["duckdb"], 50)),
        "qps": rec["queries"] / rec["wall"],
        "queries": rec["queries"],
        "passes": rec["passes"],
        "matched_rows_per_query": _mean(rec["matched"]),
        "result_rows_per_query": _mean(rec["result"]),
        "hit_rate": rec["hits"] / lookups if lookups else None,
        "row_lookups": lookups,
        "evictions": rec["evictions"],
        "round_p50_ms": [round(x, 3) for x in rec["round_p50_ms"]],
    }


def bench(path: str, kinds: dict[str, Kind], cache_bytes: int, args: argparse.Namespace,
          res: dict, reports: list[str], problems: list[str]) -> dict[str, dict]:
    """Alternate cache-off and cache-warm phases; returns phase -> kind -> record."""
    import rtindex

    recs = {ph: {k: new_record() for k in kinds} for ph in PHASES}
    seen: dict = {}
    slice_s = args.seconds / args.rounds
    for rnd in range(1, args.rounds + 1):
        for phase in PHASES:
            db = rtindex.open(path, row_cache_bytes=0 if phase == "off" else cache_bytes)
            try:
                gc.collect()
                t0 = time.perf_counter()
                for kind in kinds.values():
                    run_pass(db, kind)  # unmeasured: block cache, DuckDB, plan cache; fills the row cache
                    for p in kind.check:  # so that the checked results, too, come from the cache
                        db.sql(kind.text, {kind.key: p}).rows()
                check(db, kinds, phase, rnd, seen, problems)
                rc = db.stats()["row_cache"]
                log(f"round {rnd}, cache {phase}: unmeasured pass + checks {time.perf_counter() - t0:.1f}s; row cache "
                    f"{rc['bytes'] / MiB:,.1f} MiB in {rc['entries']:,} entries (capacity "
                    f"{rc['capacity_bytes'] / MiB:,.0f} MiB), {rc['evictions']:,} evictions")
                if phase == "warm":
                    if rc["evictions"]:
                        log(f"!! the row cache evicted {rc['evictions']:,} rows while filling: --cache-mb too small")
                    if rnd == 1:
                        res.update({"cache_bytes": rc["bytes"], "cache_entries": rc["entries"],
                                    "cache_fill_evictions": rc["evictions"]})
                if rnd == 1 and not reports:
                    for kind in kinds.values():
                        p = kind.params[0]
                        reports.append(f"rtindex EXPLAIN {kind.text}   -- :{kind.key} = {p!r}\n"
                                       f"{db.explain(kind.text, {kind.key: p})}")
                for kind in kinds.values():
                    gc.collect()
                    measure(db, kind, slice_s, recs[phase][kind.name], f"{kind.name} cache {phase} r{rnd}")
            finally:
                db.close()
    return recs


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _x(a: Any, b: Any) -> Any:
    return a / b if a and b else None


def print_table(r: dict) -> None:
    g = r.get
    print()
    print(f"RowStoreCache benchmark: {r['n_clicks']:,} product_clicks rows, {r['n_events']:,} events; one client; "
          f"shards={r['shards']}, all data sealed; {r['rounds']} rounds of (cache off, cache warm), "
          f"{r['seconds']:g}s per query kind and phase; row_cache_bytes={r['row_cache_bytes'] / MiB:,.0f} MiB")
    hdr = f"{'metric':<34} {'cache off':>11} {'cache warm':>11} {'off/warm':>9}   target"
    for kind, label, pfx in (("ctr", f"CTR by city ({r['ctr_params']} cities)", "ctr_"),
                             ("events", f"events by processBy ({r['events_params']} values)", "events_")):
        print()
        print(f"{label}: {_fmt(g(pfx + 'matched_rows_per_query'), 1)} matched rows/query, "
              f"{_fmt(g(pfx + 'result_rows_per_query'), 1)} result rows/query")
        print(hdr)
        print("-" * len(hdr))
        sp = "" if kind == "ctr" else "events_"
        for name, key, d, tkey in (
            ("add fields p50 ms", "add_fields_p50_ms", 3, "add_fields_speedup"),
            ("add fields p95 ms", "add_fields_p95_ms", 3, None),
            ("plan p50 ms", "plan_p50_ms", 3, None),
            ("duckdb p50 ms", "duckdb_p50_ms", 3, None),
            ("end-to-end p50 ms", "p50_ms", 3, "e2e_speedup"),
            ("end-to-end p95 ms", "p95_ms", 3, None),
            ("QPS (one client)", "qps", 1, None),
        ):
            a, b = g(f"{pfx}{key}_cache_off"), g(f"{pfx}{key}_cache_warm")
            ratio = (b / a if a and b else None) if key == "qps" else _x(a, b)
            tgt = ""
            if tkey is not None and kind == "ctr":
                v = g(sp + tkey)
                tgt = f">= {TARGETS[tkey]:g}x ({'met' if v is not None and v >= TARGETS[tkey] else 'NOT met'})"
            print(f"{name:<34} {_fmt(a, d):>11} {_fmt(b, d):>11} {_fmt(ratio, 2) + 'x' if ratio else '-':>9}   {tgt}")
        hr = g(pfx.replace("ctr_", "") + "hit_rate")
        print(f"{'row cache hit rate (measured)':<34} {'-':>11} {_fmt(hr * 100 if hr is not None else None, 2):>10}%")
        print("-" * len(hdr))
    print(f"row cache after filling: {g('cache_bytes', 0) / MiB:,.1f} MiB in {g('cache_entries', 0):,} entries "
          f"(estimated {g('cache_estimated_bytes', 0) / MiB:,.1f} MiB; capacity {g('row_cache_bytes') / MiB:,.0f} MiB), "
          f"{g('cache_fill_evictions')} evictions while filling, {g('evictions_measured')} while measuring")
    print(f"process peak RSS {_fmt(g('peak_rss_mb'))} MB (the load's RocksDB memtables and segment builders "
          f"included; the data is generated while loading, not kept)")
    print(f"load (generation included, not measured): product_clicks {_fmt(g('load_product_clicks_seconds'), 1)}s, "
          f"events {_fmt(g('load_events_seconds'), 1)}s; on disk {_fmt(g('disk_mb'))} MB; total "
          f"{g('total_seconds'):.0f}s")
    print(f"results checked (expected answers and cache off vs warm): "
          f"{'all agree' if g('checks_agree') else 'MISMATCHES'} ({g('check_mismatches')} problems)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="1M product_clicks rows, 100k events, 5 s per kind and phase (< 2 min)")
    ap.add_argument("--clicks", type=int, default=None, help="product_clicks rows (default 10,000,000)")
    ap.add_argument("--events", type=int, default=None, help="events (default 1,000,000)")
    ap.add_argument("--cities", type=int, default=40, help="cities in the CTR parameter set (default 40)")
    ap.add_argument("--pb-values", type=int, default=300, help="processBy values in the events parameter set "
                    "(default 300)")
    ap.add_argument("--seconds", type=float, default=None, help="measuring time per query kind and phase, split "
                    "over the rounds (default 10; --quick 5)")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of (cache off, cache warm) (default 2)")
    ap.add_argument("--cache-mb", type=int, default=None, help="row_cache_bytes of the warm phase in MiB "
                    "(default: what the parameter sets' rows need, +25%%)")
    ap.add_argument("--shards", type=int, default=4, help="shards per collection (default 4)")
    ap.add_argument("--batch", type=int, default=10_000, help="ingest batch size (default 10,000)")
    ap.add_argument("--dir", default=None, help="parent of the temporary working directory (default /tmp)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the working directory (the database)")
    args = ap.parse_args(argv)

    n_clicks = args.clicks if args.clicks is not None else (1_000_000 if args.quick else 10_000_000)
    n_events = args.events if args.events is not None else (100_000 if args.quick else 1_000_000)
    if args.seconds is None:
        args.seconds = 5.0 if args.quick else 10.0
    if n_clicks < 1 or n_events < 1 or args.cities < 1 or args.pb_values < 1 or args.rounds < 1:
        ap.error("--clicks, --events, --cities, --pb-values and --rounds must be positive")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="rtindex-rowcache-", dir=args.dir)
    path = os.path.join(workdir, "rtindex")
    t_start = time.perf_counter()
    log(f"rowcache benchmark: {n_clicks:,} product_clicks rows, {n_events:,} events, {args.rounds} rounds, "
        f"{args.seconds:g}s per kind and phase, shards={args.shards}, dir={workdir}")

    from rtindex import _impl

    res: dict[str, Any] = {"rtindex_impl": _impl.IMPLEMENTATION}
    reports: list[str] = []
    problems: list[str] = []
    try:
        kinds = load(path, args, n_clicks, n_events, res)
        need = sum(kinds["ctr"].cached_bytes[c] for c in kinds["ctr"].params) + sum(
            kinds["events"].cached_bytes.get(p, 0) for p in dict.fromkeys(kinds["events"].params + kinds["events"].check))
        cache_bytes = args.cache_mb * MiB if args.cache_mb is not None else max(64, math.ceil(need * 1.25 / MiB)) * MiB
        log(f"row cache for the warm phase: {cache_bytes / MiB:,.0f} MiB (the parameter sets' rows: "
            f"~{need / MiB:,.1f} MiB as charged by the cache)")
        res.update({"row_cache_bytes": cache_bytes, "cache_estimated_bytes": need})
        recs = bench(path, kinds, cache_bytes, args, res, reports, problems)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"kept {workdir}")

    figs: dict[str, dict] = {ph: {k: summarize(recs[ph][k]) for k in KINDS} for ph in PHASES}
    out: dict[str, Any] = {}
    for kind in KINDS:
        pfx = "" if kind == "ctr" else "events_"
        off, warm = figs["off"][kind], figs["warm"][kind]
        out[f"{pfx}add_fields_speedup"] = _x(off["add_fields_p50_ms"], warm["add_fields_p50_ms"])
        out[f"{pfx}e2e_speedup"] = _x(off["p50_ms"], warm["p50_ms"])
        out[f"{pfx}qps_speedup"] = _x(warm["qps"], off["qps"])
        for ph in PHASES:
            f = figs[ph][kind]
            out[f"{kind}_p50_ms_cache_{ph}"] = f["p50_ms"]
            out[f"{kind}_p95_ms_cache_{ph}"] = f["p95_ms"]
            out[f"{kind}_add_fields_p50_ms_cache_{ph}"] = f["add_fields_p50_ms"]
            out[f"{kind}_qps_cache_{ph}"] = f["qps"]
        out[f"{pfx}hit_rate"] = warm["hit_rate"]
        out[f"{kind}_matched_rows_per_query"] = warm["matched_rows_per_query"]
        out[f"{kind}_result_rows_per_query"] = warm["result_rows_per_query"]
        for ph in PHASES:
            for k in ("add_fields_p95_ms", "plan_p50_ms", "duckdb_p50_ms", "p99_ms", "queries", "passes",
                      "round_p50_ms"):
                out[f"{kind}_{k}_cache_{ph}"] = figs[ph][kind][k]
        if figs["off"][kind]["matched_rows_per_query"] != warm["matched_rows_per_query"]:
            problems.append(f"{kind}: matched rows per query differ between the phases "
                            f"({figs['off'][kind]['matched_rows_per_query']} vs {warm['matched_rows_per_query']})")
        if figs["off"][kind]["row_lookups"]:
            problems.append(f"{kind}: the cache-off phase counted {figs['off'][kind]['row_lookups']} cache lookups")
    out["cache_bytes"] = res.pop("cache_bytes", None)
    out["cache_entries"] = res.pop("cache_entries", None)
    out["evictions_measured"] = sum(figs["warm"][k]["evictions"] for k in KINDS)
    out["peak_rss_mb"] = peak_rss_mb()
    for k in sorted(res):
        out[k] = res[k]
    out.update({
        "targets": {k: v for k, v in TARGETS.items()},
        "targets_met": {k: bool(out.get(k) is not None and out[k] >= v) for k, v in TARGETS.items()},
        "n_clicks": n_clicks,
        "n_events": n_events,
        "ctr_params": len(kinds["ctr"].params),
        "events_params": len(kinds["events"].params),
        "checks_agree": not problems,
        "check_mismatches": len(problems),
        "seconds": args.seconds,
        "rounds": args.rounds,
        "shards": args.shards,
        "batch": args.batch,
        "total_seconds": time.perf_counter() - t_start,
    })
    for line in problems:
        log(f"!! MISMATCH {line}")
    print()
    for text in reports:
        print(text)
        print()
    print_table(out)
    out = {k: ((round(v, 4) if math.isfinite(v) else None) if isinstance(v, float) else v) for k, v in out.items()}
    print(json.dumps(out))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
