#!/usr/bin/env python
"""Query latency and throughput: rtindex vs SQLite (JSON + expression indexes) vs DuckDB (typed
table) vs chDB (in-process ClickHouse, MergeTree tables).

    python benchmarks/query.py [--quick] [--events N] [--clicks N] [--seconds S] [--shards S]
                               [--batch B] [--systems rtindex,sqlite,duckdb,chdb] [--dir DIR]

Data (benchmarks/datagen.py) is generated once, in memory, before anything is loaded:
RockBench-style events (default 1,000,000; --quick 100,000) and ``product_clicks`` rows
(default 10,000,000; --quick 1,000,000; 300 cities, so one city is ~0.33% of the rows).
Then, one system after the other, in this process: load both data sets (the loading time
is printed, it is not the measured figure), then run three queries with one client:

* ``SELECT * FROM events WHERE processBy = :p``, ``p`` drawn uniformly from the distinct
  values that occur in the data (processBy is Zipf-distributed, so most values match a
  handful of rows and a few match thousands: a random parameter of a selective query;
  drawing with the data's own skew instead would make ~8% of the queries return the top
  value's 8% of all events);
* ``SELECT * FROM events WHERE ARRAY_CONTAINS(emails, :e)``, ``e`` an address that occurs
  in the data (``datagen.sample_emails``);
* ``SELECT product_id, SUM(CAST(clicks AS FLOAT)) / (SUM(CAST(impressions AS FLOAT)) + 1.0)
  AS ctr FROM product_clicks WHERE city = :city GROUP BY product_id ORDER BY ctr DESC
  LIMIT 100``, a different random city each time (``datagen.random_city``).

Each kind runs for ``--seconds`` (default 10; --quick 4) after a short warm-up, cycling
through one parameter list that is the same for every system (a slower system runs a
shorter prefix of it); figures are QPS and p50/p95/p99 latency of single queries.

rtindex is then measured a second time per kind, right after its single-client run of that
kind, with two threads querying the same ``db`` at once for ``--seconds`` (no extra
warm-up): thread t cycles through every second parameter starting at t, so together they
walk the single client's list. Figures: total QPS of both threads, p50/p95/p99 over all
their queries, and the QPS ratio to one thread (``<kind>_qps_2threads``,
``<kind>_p50_ms_2threads``, ``<kind>_qps_2threads_vs_1thread``, ...).

The systems, and how SELECT * rows reach Python (every system hands back full rows as
Python objects, so the comparison includes materialization):

* rtindex: ``db.sql(text, params).rows()`` -> list of dicts (documents as stored). Data is
  loaded with ``coll.ingest`` and then ``coll.flush()``: every segment sealed and merges
  done, the steady state of a collection, not its in-memory tail. Opened with a 256 MiB
  block cache (SQLite's page cache size) and ``max_result_bytes=None``, as the other
  systems build results of any size.
* SQLite (file, WAL, 256 MiB page cache): ``events(id TEXT PRIMARY KEY, doc TEXT)`` with an
  expression index on ``json_extract(doc, '$.processBy')``; emails in a side table
  ``event_emails(email, id)`` with an index on (email, id), joined back by id (how arrays are
  indexed in SQLite); rows are ``fetchall()`` of the JSON text, each parsed by
  ``orjson.loads`` into a dict. ``product_clicks(id, doc)`` likewise, with an expression
  index on the city; the aggregate reads the fields with ``json_extract``.
* DuckDB (file, default threads): native typed tables (schema inferred once as in
  benchmarks/ingest.py: objects -> STRUCT, arrays -> LIST, so emails is VARCHAR[] and the
  filter is ``list_contains(emails, ?)``), no index; rows are ``fetchall()`` of all columns:
  tuples whose STRUCT values are dicts and LIST values lists.
* chDB (``chdb.session.Session`` on a directory in the working directory; skipped, figures
  null, when ``import chdb`` fails): MergeTree tables with the schema ClickHouse infers
  from a 10,000-row JSONEachRow sample (objects -> named Tuples, arrays -> Arrays, absent
  fields read as defaults rather than NULL), laid out as a ClickHouse user would for these
  lookups: ``events ORDER BY processBy`` with a ``bloom_filter`` skip index on ``emails``
  (the filter is ``has(emails, {e:String})``), ``product_clicks ORDER BY (city,
  product_id)``. Loaded by ``INSERT ... FORMAT JSONEachRow`` per batch, then ``OPTIMIZE
  TABLE ... FINAL`` (one part, the steady state; in the load time). Parameters are bound
  as typed ``{name:String}`` placeholders; the CTR query divides integer sums as Float64.
  Rows are the JSONEachRow output, one ``orjson.loads`` per row: dicts for SELECT *,
  [product_id, ctr] for CTR. ``EXPLAIN indexes = 1`` of each kind is printed.

Correctness: on a few parameters of each kind (the most popular processBy, absent values,
...) every system's result is compared with the answer computed in Python from the
generated data: the same ``_id`` set for SELECT *, and the same top products for the CTR
query (ctr within 1e-6 relative; ties may order differently). rtindex's and SQLite's rows
are also compared with the source documents (DuckDB's and chDB's typed rows fill absent
fields with NULLs or defaults, so only their ``_id`` values are compared). Disagreements are printed with the query,
the parameter and both results.

Prints progress to stderr; EXPLAIN of one query of each kind, a table and, as the LAST
stdout line, one JSON object (processby_qps, processby_p50_ms, ..., ctr_p95_ms, the same
prefixed sqlite_, duckdb_ and chdb_, the two-thread figures above, processby_qps_vs_sqlite,
email_qps_vs_chdb, ..., ctr_speedup_vs_fastest_peer (fastest p50 of SQLite and DuckDB /
rtindex's p50), ctr_speedup_vs_chdb (chDB's p50 / rtindex's p50), row counts, peak_rss_mb,
...). Values are null for a system that could not run.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import orjson  # noqa: E402

from benchmarks import datagen  # noqa: E402
from benchmarks.ingest import (  # noqa: E402
    EVENT_TIME_BASE_US,
    Progress,
    RssSampler,
    _chdb_load,
    _duckdb_load,
    _fmt,
    batches,
    dir_size_mb,
    generating_input,
    log,
    peak_rss_mb,
    rss_mb,
    run_guarded,
)

KINDS = ("processby", "email", "ctr")
N_PARAMS = 20_000  # measured parameters per kind (cycled if a system gets through them all)
N_WARM_PARAMS = 200
BLOCK_CACHE_MB = 256  # SQLite's page cache and rtindex's RocksDB block cache (besides its row cache)
CTR_LIMIT = 100
REL_TOL = 1e-6

# rtindex's dialect (the text)
RT_PB = "SELECT * FROM events WHERE processBy = :p"
RT_EMAIL = "SELECT * FROM events WHERE ARRAY_CONTAINS(emails, :e)"
RT_CTR = ("SELECT product_id, SUM(CAST(clicks AS FLOAT)) / (SUM(CAST(impressions AS FLOAT)) + 1.0) AS ctr "
          "FROM product_clicks WHERE city = :city GROUP BY product_id ORDER BY ctr DESC LIMIT 100")

SQLITE_PB = "SELECT doc FROM events WHERE json_extract(doc, '$.processBy') = ?"
SQLITE_EMAIL = "SELECT doc FROM events WHERE id IN (SELECT id FROM event_emails WHERE email = ?)"
SQLITE_CTR = ("SELECT json_extract(doc, '$.product_id') AS product_id, "
              "SUM(CAST(json_extract(doc, '$.clicks') AS FLOAT)) "
              "/ (SUM(CAST(json_extract(doc, '$.impressions') AS FLOAT)) + 1.0) AS ctr "
              "FROM product_clicks WHERE json_extract(doc, '$.city') = ? "
              "GROUP BY 1 ORDER BY ctr DESC LIMIT 100")

DUCK_PB = "SELECT * FROM events WHERE processBy = ?"
DUCK_EMAIL = "SELECT * FROM events WHERE list_contains(emails, ?)"
DUCK_CTR = ("SELECT product_id, SUM(CAST(clicks AS FLOAT)) / (SUM(CAST(impressions AS FLOAT)) + 1.0) AS ctr "
            "FROM product_clicks WHERE city = ? GROUP BY product_id ORDER BY ctr DESC LIMIT 100")

# ClickHouse: parameters are typed placeholders bound by the server, never spliced into the
# text; the integer sums are exact and ``/`` always divides as Float64.
CH_PB = "SELECT * FROM events WHERE processBy = {p:String}"
CH_EMAIL = "SELECT * FROM events WHERE has(emails, {e:String})"
CH_CTR = ("SELECT product_id, sum(clicks) / (sum(impressions) + 1.0) AS ctr "
          "FROM product_clicks WHERE city = {city:String} GROUP BY product_id ORDER BY ctr DESC LIMIT 100")
SYSTEMS = ("rtindex", "sqlite", "duckdb", "chdb")
THREADS = 2  # rtindex readers sharing one database in the concurrent measurement


# ---------------------------------------------------------------------------
# Data, parameters and the expected answers
# ---------------------------------------------------------------------------


@dataclass
class Workload:
    events: list[dict]
    clicks: list[dict]
    params: dict[str, list]  # kind -> measured parameters (same order for every system)
    warm: dict[str, list]  # kind -> warm-up parameters
    check: dict[str, list]  # kind -> parameters whose results are verified
    truth_ids: dict[str, dict[Any, list[str]]] = field(default_factory=dict)  # kind -> param -> sorted _ids
    truth_docs: dict[str, dict] = field(default_factory=dict)  # _id -> source document, for the checked ids
    truth_ctr: dict[str, dict[int, float]] = field(default_factory=dict)  # city -> product -> ctr (float64)


def generate(n_events: int, n_clicks: int, seed: int) -> tuple[list[dict], list[dict], float]:
    t0 = time.perf_counter()
    with generating_input():
        p = Progress("gen events", n_events)
        events = list(p.wrap(datagen.rockbench_events(n_events, seed=seed, event_time_us=EVENT_TIME_BASE_US)))
        p.finish()
        p = Progress("gen clicks", n_clicks, unit="rows")
        clicks = list(p.wrap(datagen.product_clicks(n_clicks, seed=seed)))
        p.finish()
    return events, clicks, time.perf_counter() - t0


def make_workload(events: list[dict], clicks: list[dict], seed: int) -> Workload:
    t0 = time.perf_counter()
    rng = random.Random(seed)
    distinct = sorted({d["processBy"] for d in events if "processBy" in d})
    pb = [rng.choice(distinct) for _ in range(N_PARAMS)]
    pb_warm = [rng.choice(distinct) for _ in range(N_WARM_PARAMS)]
    emails = datagen.sample_emails(events, k=N_PARAMS, seed=seed)
    rng.shuffle(emails)  # a reservoir keeps early finds in front
    email_warm = datagen.sample_emails(events, k=N_WARM_PARAMS, seed=seed + 1)
    cities = [datagen.random_city(rng) for _ in range(N_PARAMS)]
    city_warm = [datagen.random_city(rng) for _ in range(N_WARM_PARAMS)]
    w = Workload(
        events, clicks,
        params={"processby": pb, "email": emails, "ctr": cities},
        warm={"processby": pb_warm, "email": email_warm, "ctr": city_warm},
        check={
            # the most popular value (~8% of the events), a few drawn ones, one that is absent
            "processby": list(dict.fromkeys([datagen.process_by_value(0)] + pb[:4] + ["host-absent"])),
            "email": list(dict.fromkeys(emails[:5] + ["nobody@absent.invalid"])),
            "ctr": list(dict.fromkeys(cities[:3] + ["NOWHERE0"])),
        },
    )
    # Expected answers, straight from the generated data.
    pb_set, em_set = set(w.check["processby"]), set(w.check["email"])
    pb_ids: dict[Any, list[str]] = {p: [] for p in w.check["processby"]}
    em_ids: dict[Any, list[str]] = {e: [] for e in w.check["email"]}
    for d in events:
        hit = False
        if d.get("processBy") in pb_set:
            pb_ids[d["processBy"]].append(d["_id"])
            hit = True
        for e in set(d.get("emails") or ()):
            if e in em_set:
                em_ids[e].append(d["_id"])
                hit = True
        if hit:
            w.truth_docs[d["_id"]] = d
    w.truth_ids = {"processby": {k: sorted(v) for k, v in pb_ids.items()},
                   "email": {k: sorted(v) for k, v in em_ids.items()}}
    city_set = set(w.check["ctr"])
    agg: dict[str, dict[int, list[int]]] = {c: {} for c in w.check["ctr"]}
    for r in clicks:
        if r["city"] in city_set:
            a = agg[r["city"]].setdefault(r["product_id"], [0, 0])
            a[0] += r["clicks"]
            a[1] += r["impressions"]
    w.truth_ctr = {c: {pid: ck / (imp + 1.0) for pid, (ck, imp) in per.items()} for c, per in agg.items()}
    log(f"parameters and expected answers ready in {time.perf_counter() - t0:.1f}s; checked: "
        + ", ".join(f"processBy={p!r}: {len(w.truth_ids['processby'][p]):,} rows" for p in w.check["processby"]))
    return w


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def measure(label: str, fn: Callable[[Any], int], params: list, warm: list, seconds: float) -> dict[str, Any]:
    """Warm up, then run ``fn`` on ``params`` in order (cycling) for ``seconds`` (at least 3
    queries); ``fn`` returns the number of rows it materialized."""
    t_warm = min(1.0, seconds / 4)
    t0 = time.perf_counter()
    i = 0
    while i == 0 or time.perf_counter() - t0 < t_warm:
        fn(warm[i % len(warm)])
        i += 1
    lat: list[float] = []
    rows = 0
    clock = time.perf_counter
    start = clock()
    deadline = start + seconds
    last_log = start
    k = 0
    while True:
        p = params[k % len(params)]
        t = clock()
        rows += fn(p)
        t2 = clock()
        lat.append(t2 - t)
        k += 1
        if t2 >= deadline and k >= 3:
            break
        if t2 - last_log >= 3.0:
            last_log = t2
            log(f"  [{label}] {k:,} queries, {k / (t2 - start):,.1f} q/s")
    el = clock() - start
    ms = np.percentile(np.array(lat) * 1e3, [50, 95, 99])
    out = {"qps": k / el, "p50_ms": float(ms[0]), "p95_ms": float(ms[1]), "p99_ms": float(ms[2]),
           "mean_ms": float(np.mean(lat) * 1e3), "max_ms": max(lat) * 1e3, "queries": k, "rows_per_query": rows / k,
           "warmup_queries": i}
    log(f"  [{label}] {k:,} queries in {el:.1f}s: {out['qps']:,.1f} q/s, p50 {out['p50_ms']:.2f} ms, "
        f"p95 {out['p95_ms']:.2f} ms, p99 {out['p99_ms']:.2f} ms, {out['rows_per_query']:,.1f} rows/query "
        f"(after {i} warm-up queries)")
    return out


def measure_threads(label: str, fn: Callable[[Any], int], params: list, seconds: float,
                    n_threads: int) -> dict[str, Any]:
    """Run ``fn`` from ``n_threads`` threads at once for ``seconds``, thread ``t`` cycling
    through ``params[t::n_threads]`` (together they walk the parameters the single client
    walked). No warm-up: it runs right after the single-client measurement of the same kind.
    QPS is all threads' queries over the wall time; percentiles are over every query's
    latency. The first error of any thread is raised here."""
    barrier = threading.Barrier(n_threads + 1)
    lats: list[list[float]] = [[] for _ in range(n_threads)]
    errors: list[BaseException] = []
    deadline = 0.0

    def client(t: int) -> None:
        mine, lat, clock = params[t::n_threads] or params, lats[t], time.perf_counter
        barrier.wait()
        try:
            k = 0
            while True:
                t1 = clock()
                fn(mine[k % len(mine)])
                t2 = clock()
                lat.append(t2 - t1)
                k += 1
                if t2 >= deadline or errors:
                    break
        except BaseException as e:  # noqa: BLE001 - handed to the measuring thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(t,), name=f"bench-{t}") for t in range(n_threads)]
    for th in threads:
        th.start()
    start = time.perf_counter()
    deadline = start + seconds
    barrier.wait()
    for th in threads:
        th.join()
    el = time.perf_counter() - start
    if errors:
        raise errors[0]
    lat_all = np.array([x for lat in lats for x in lat]) * 1e3
    k = len(lat_all)
    ms = np.percentile(lat_all, [50, 95, 99])
    out = {"qps": k / el, "p50_ms": float(ms[0]), "p95_ms": float(ms[1]), "p99_ms": float(ms[2]), "queries": k}
    log(f"  [{label}, {n_threads} threads] {k:,} queries in {el:.1f}s: {out['qps']:,.1f} q/s in total, "
        f"p50 {out['p50_ms']:.2f} ms, p95 {out['p95_ms']:.2f} ms, p99 {out['p99_ms']:.2f} ms "
        f"(per thread: {', '.join(f'{len(lat):,}' for lat in lats)} queries)")
    return out


@dataclass
class Ops:
    """One system's three queries. ``pb``/``email`` return the rows as Python objects,
    ``ctr`` a list of (product_id, ctr); ``ids`` takes the ``_id`` values out of rows and
    ``docs`` (optional) turns rows into documents comparable with the source ones."""

    pb: Callable[[str], list]
    email: Callable[[str], list]
    ctr: Callable[[str], list]
    ids: Callable[[list], list[str]]
    docs: Callable[[list], list[dict]] | None = None


def query_phase(name: str, ops: Ops, w: Workload, args: argparse.Namespace, checks: dict, res: dict,
                threads: int = 1) -> None:
    """Check results on the checked parameters (recorded in ``checks[name]``, compared in
    main), then measure each kind; a failing kind is reported and the others still run.
    With ``threads`` > 1 each kind is measured a second time from that many threads at once,
    right after its single-client run (figures ``<kind>_qps_<threads>threads``, ...)."""
    prefix = "" if name == "rtindex" else f"{name}_"
    got: dict[str, dict] = {"processby": {}, "email": {}, "ctr": {}, "doc_diffs": []}
    checks[name] = got
    run = {"processby": ops.pb, "email": ops.email}
    for kind in KINDS:
        try:
            for p in w.check[kind]:
                if kind == "ctr":
                    got["ctr"][p] = [(int(pid), float(c)) for pid, c in ops.ctr(p)]
                    continue
                rows = run[kind](p)
                got[kind][p] = sorted(ops.ids(rows))
                if ops.docs is not None:
                    for d in ops.docs(rows):
                        src = w.truth_docs.get(d.get("_id"))
                        if src is not None and d != src:
                            got["doc_diffs"].append((kind, p, d.get("_id"), d, src))
            if kind == "ctr":
                fn: Callable[[Any], int] = lambda p: len(ops.ctr(p))  # noqa: E731
            else:
                fn = (lambda f: lambda p: len(f(p)))(run[kind])
            log(f"{name}: measuring {kind} for {args.seconds:g}s ...")
            m = measure(f"{name} {kind}", fn, w.params[kind], w.warm[kind], args.seconds)
            for k, v in m.items():
                res[f"{prefix}{kind}_{k}"] = v
            if threads > 1:
                log(f"{name}: measuring {kind} for {args.seconds:g}s from {threads} threads ...")
                mt = measure_threads(f"{name} {kind}", fn, w.params[kind], args.seconds, threads)
                for k, v in mt.items():
                    res[f"{prefix}{kind}_{k}_{threads}threads"] = v
                res[f"{prefix}{kind}_qps_{threads}threads_vs_1thread"] = mt["qps"] / m["qps"]
        except Exception as e:  # noqa: BLE001 - a benchmark must survive a broken query
            log(f"!! {name} {kind} failed: {type(e).__name__}: {e}")
            traceback.print_exc(file=sys.stderr)
            res[f"{name}_{kind}_error"] = f"{type(e).__name__}: {e}"
        finally:
            gc.collect()


# ---------------------------------------------------------------------------
# rtindex
# ---------------------------------------------------------------------------


def bench_rtindex(w: Workload, args: argparse.Namespace, workdir: str, checks: dict, reports: list) -> dict:
    import rtindex
    from rtindex import _impl

    res: dict[str, Any] = {"rtindex_impl": _impl.IMPLEMENTATION}
    path = os.path.join(workdir, "rtindex")
    B, S = args.batch, args.shards
    # no result budget: the other systems build any result, and at 1M events the most
    # popular processBy value (checked below) matches ~80k documents, ~490 MiB as Python objects
    db = rtindex.open(path, row_cache_bytes=args.row_cache_mb << 20, block_cache_bytes=BLOCK_CACHE_MB << 20,
                      max_result_bytes=None)
    try:
        with RssSampler() as rs:
            for cname, data, unit in (("events", w.events, "docs"), ("product_clicks", w.clicks, "rows")):
                coll = db.create_collection(cname, shards=S)
                log(f"rtindex: loading {len(data):,} {cname} ({S} shards, batch {B}) ...")
                p = Progress(f"rtindex {cname}", len(data), unit=unit)
                t0 = time.perf_counter()
                stats = coll.ingest(p.wrap(data), batch_size=B)
                coll.flush()  # every segment sealed, merges done: the steady state
                p.finish(" (flushed: all data sealed)")
                res[f"rtindex_load_{cname}_seconds"] = time.perf_counter() - t0
                if stats.errors:
                    log(f"!! rtindex {cname}: {len(stats.errors):,} ingest errors, e.g. {stats.errors[:3]}")
                res[f"rtindex_{cname}_count"] = coll.count()
                st = coll.stats()["shards"]
                log(f"rtindex: {cname}: {coll.count():,} documents, "
                    f"{sum(s['sealed_segments'] for s in st)} sealed / {sum(s['memory_segments'] for s in st)} "
                    f"in-memory segments")
                del stats
        res["rtindex_load_rss_peak_mb"] = rs.peak_mb
        gc.collect()

        # rows(): list of dicts, the stored documents; ctr: rows() of {product_id, ctr}.
        def ctr(city: str) -> list:
            return [(r["product_id"], r["ctr"]) for r in db.sql(RT_CTR, {"city": city}).rows()]

        ops = Ops(
            pb=lambda p: db.sql(RT_PB, {"p": p}).rows(),
            email=lambda e: db.sql(RT_EMAIL, {"e": e}).rows(),
            ctr=ctr,
            ids=lambda rows: [r["_id"] for r in rows],
            docs=lambda rows: rows,
        )
        for kind, text, key, param in (("processby", RT_PB, "p", datagen.process_by_value(0)),
                                       ("processby", RT_PB, "p", w.check["processby"][1]),
                                       ("email", RT_EMAIL, "e", w.check["email"][0]),
                                       ("ctr", RT_CTR, "city", w.check["ctr"][0])):
            try:
                plan = db.explain(text, {key: param})
                reports.append(f"rtindex EXPLAIN {text}   -- :{key} = {param!r}\n{plan}")
                res[f"rtindex_{kind}_access"] = plan.access
            except Exception as e:  # noqa: BLE001
                reports.append(f"rtindex EXPLAIN {text} -- :{key} = {param!r}: FAILED {type(e).__name__}: {e}")
        with RssSampler() as rs:
            query_phase("rtindex", ops, w, args, checks, res, threads=THREADS)
        res["rtindex_query_rss_peak_mb"] = rs.peak_mb
    finally:
        db.close()
    res["rtindex_disk_mb"] = dir_size_mb(path)
    return res


# ---------------------------------------------------------------------------
# SQLite
# ---------------------------------------------------------------------------


def bench_sqlite(w: Workload, args: argparse.Namespace, workdir: str, checks: dict, reports: list) -> dict:
    path = os.path.join(workdir, "sqlite.db")
    B = args.batch
    con = sqlite3.connect(path, isolation_level=None)  # explicit transactions
    res: dict[str, Any] = {"sqlite_version": sqlite3.sqlite_version}
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute(f"PRAGMA cache_size=-{BLOCK_CACHE_MB * 1024}")  # KiB: as rtindex's block cache
        con.executescript("""
            CREATE TABLE events (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
            CREATE TABLE event_emails (email TEXT NOT NULL, id TEXT NOT NULL);
            CREATE TABLE product_clicks (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
        """)
        dumps = orjson.dumps
        log(f"sqlite: loading {len(w.events):,} events (batch {B}) ...")
        p = Progress("sqlite events", len(w.events))
        t0 = time.perf_counter()
        done = 0
        for batch in batches(w.events, B):
            rows = [(d["_id"], dumps(d).decode()) for d in batch]
            email_rows = [(e, d["_id"]) for d in batch for e in d.get("emails") or ()]
            con.execute("BEGIN")
            con.executemany("INSERT INTO events (id, doc) VALUES (?, ?)", rows)
            con.executemany("INSERT INTO event_emails (email, id) VALUES (?, ?)", email_rows)
            con.execute("COMMIT")
            done += len(batch)
            p.update(done)
        # Indexes after the bulk load (faster than maintaining them row by row).
        con.executescript("""
            CREATE INDEX events_process_by ON events (json_extract(doc, '$.processBy'));
            CREATE INDEX event_emails_email ON event_emails (email, id);
        """)
        p.finish(" (indexes included)")
        res["sqlite_load_events_seconds"] = time.perf_counter() - t0
        log(f"sqlite: loading {len(w.clicks):,} product_clicks ...")
        p = Progress("sqlite product_clicks", len(w.clicks), unit="rows")
        t0 = time.perf_counter()
        done = 0
        for batch in batches(w.clicks, B):
            rows = [(d["_id"], dumps(d).decode()) for d in batch]
            con.execute("BEGIN")
            con.executemany("INSERT INTO product_clicks (id, doc) VALUES (?, ?)", rows)
            con.execute("COMMIT")
            done += len(batch)
            p.update(done)
        con.execute("CREATE INDEX product_clicks_city ON product_clicks (json_extract(doc, '$.city'))")
        con.execute("ANALYZE")
        p.finish(" (index and ANALYZE included)")
        res["sqlite_load_product_clicks_seconds"] = time.perf_counter() - t0
        res["sqlite_disk_mb"] = dir_size_mb(workdir)

        for text, param in ((SQLITE_PB, w.check["processby"][0]), (SQLITE_EMAIL, w.check["email"][0]),
                            (SQLITE_CTR, w.check["ctr"][0])):
            plan = con.execute("EXPLAIN QUERY PLAN " + text, (param,)).fetchall()
            reports.append(f"sqlite EXPLAIN QUERY PLAN {text}\n" + "\n".join(f"  {r[-1]}" for r in plan))

        # fetchall() of the JSON text, each row parsed into a dict by orjson.
        loads = orjson.loads
        ops = Ops(
            pb=lambda p: [loads(r[0]) for r in con.execute(SQLITE_PB, (p,)).fetchall()],
            email=lambda e: [loads(r[0]) for r in con.execute(SQLITE_EMAIL, (e,)).fetchall()],
            ctr=lambda c: con.execute(SQLITE_CTR, (c,)).fetchall(),
            ids=lambda rows: [r["_id"] for r in rows],
            docs=lambda rows: rows,
        )
        with RssSampler() as rs:
            query_phase("sqlite", ops, w, args, checks, res)
        res["sqlite_query_rss_peak_mb"] = rs.peak_mb
    finally:
        con.close()
    return res


# ---------------------------------------------------------------------------
# DuckDB
# ---------------------------------------------------------------------------


def bench_duckdb(w: Workload, args: argparse.Namespace, workdir: str, checks: dict, reports: list) -> dict:
    import duckdb

    path = os.path.join(workdir, "duck.duckdb")
    con = duckdb.connect(path)
    res: dict[str, Any] = {"duckdb_version": duckdb.__version__}
    try:
        log(f"duckdb: loading {len(w.events):,} events (batch {args.batch}) ...")
        res["duckdb_load_events_seconds"] = _duckdb_load(con, "events", w.events, args.batch, "duckdb events", "docs")
        log(f"duckdb: loading {len(w.clicks):,} product_clicks ...")
        res["duckdb_load_product_clicks_seconds"] = _duckdb_load(con, "product_clicks", w.clicks, args.batch,
                                                                 "duckdb product_clicks", "rows")
        res["duckdb_disk_mb"] = dir_size_mb(workdir)
        for t in ("events", "product_clicks"):
            res[f"duckdb_{t}_count"] = con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
        emails_type = con.execute("SELECT data_type FROM information_schema.columns "
                                  "WHERE table_name = 'events' AND column_name = 'emails'").fetchall()
        log(f"duckdb: events.emails is {emails_type[0][0] if emails_type else '?'}")
        id_col = [r[0] for r in con.execute("DESCRIBE events").fetchall()].index("_id")

        # fetchall() of every column: tuples (STRUCT values as dicts, LIST values as lists).
        ops = Ops(
            pb=lambda p: con.execute(DUCK_PB, [p]).fetchall(),
            email=lambda e: con.execute(DUCK_EMAIL, [e]).fetchall(),
            ctr=lambda c: con.execute(DUCK_CTR, [c]).fetchall(),
            ids=lambda rows: [r[id_col] for r in rows],
        )
        with RssSampler() as rs:
            query_phase("duckdb", ops, w, args, checks, res)
        res["duckdb_query_rss_peak_mb"] = rs.peak_mb
    finally:
        con.close()
    return res


# ---------------------------------------------------------------------------
# chDB (ClickHouse in-process)
# ---------------------------------------------------------------------------

def bench_chdb(w: Workload, args: argparse.Namespace, workdir: str, checks: dict, reports: list) -> dict:
    try:
        import chdb
        from chdb import session
    except ImportError as e:
        log(f"chdb: skipped, it cannot be imported ({e}; pip install chdb): its figures are null")
        return {"chdb_skipped": f"import chdb failed: {e}"}

    sess = session.Session(os.path.join(workdir, "session"))
    res: dict[str, Any] = {"chdb_version": chdb.__version__}
    try:
        res["chdb_clickhouse_version"] = str(sess.query("SELECT version()", "TabSeparated")).strip()
        # How a ClickHouse user would lay the tables out for these lookups: events sorted by
        # processBy with a bloom filter over the emails array, product_clicks by (city, product).
        log(f"chdb: loading {len(w.events):,} events (batch {args.batch}) ...")
        res["chdb_load_events_seconds"] = _chdb_load(
            sess, "events", w.events, "processBy", "emails_bloom emails TYPE bloom_filter GRANULARITY 1",
            workdir, args.batch, "docs")
        log(f"chdb: loading {len(w.clicks):,} product_clicks ...")
        res["chdb_load_product_clicks_seconds"] = _chdb_load(
            sess, "product_clicks", w.clicks, "(city, product_id)", "", workdir, args.batch, "rows")
        res["chdb_disk_mb"] = dir_size_mb(workdir)
        for t in ("events", "product_clicks"):
            res[f"chdb_{t}_count"] = int(str(sess.query(f"SELECT count() FROM {t}", "TabSeparated")))

        for text, key, param in ((CH_PB, "p", w.check["processby"][0]), (CH_EMAIL, "e", w.check["email"][0]),
                                 (CH_CTR, "city", w.check["ctr"][0])):
            plan = str(sess.query("EXPLAIN indexes = 1 " + text, "TabSeparated", params={key: param}))
            reports.append(f"chdb EXPLAIN indexes = 1 {text}   -- {key} = {param!r}\n"
                           + "\n".join(f"  {line}" for line in plan.splitlines()))

        # JSONEachRow / JSONCompactEachRow output, one orjson.loads per row: dicts for SELECT *
        # (absent fields read as defaults, so only the _ids are compared), [product, ctr] lists.
        loads = orjson.loads

        def rows(text: str, fmt: str, params: dict) -> list:
            return [loads(line) for line in sess.query(text, fmt, params=params).bytes().splitlines()]

        ops = Ops(
            pb=lambda p: rows(CH_PB, "JSONEachRow", {"p": p}),
            email=lambda e: rows(CH_EMAIL, "JSONEachRow", {"e": e}),
            ctr=lambda c: rows(CH_CTR, "JSONCompactEachRow", {"city": c}),
            ids=lambda got: [r["_id"] for r in got],
        )
        with RssSampler() as rs:
            query_phase("chdb", ops, w, args, checks, res)
        res["chdb_query_rss_peak_mb"] = rs.peak_mb
    finally:
        sess.close()
    return res


# ---------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b)) + 1e-12


def _id_diff(got: list[str], want: list[str]) -> str:
    g, t = set(got), set(want)
    missing, extra = sorted(t - g), sorted(g - t)
    dup = len(got) - len(g)
    return (f"missing {len(missing)} {missing[:5]}, extra {len(extra)} {extra[:5]}"
            + (f", {dup} duplicated" if dup else ""))


def verify(w: Workload, checks: dict) -> tuple[list[str], dict[str, Any]]:
    """Mismatches (readable lines) and the row counts of the checked parameters."""
    problems: list[str] = []
    counts: dict[str, Any] = {}
    texts = {"processby": RT_PB, "email": RT_EMAIL}
    for kind in ("processby", "email"):
        for p in w.check[kind]:
            want = w.truth_ids[kind][p]
            line = {"expected": len(want)}
            for name, got in checks.items():
                if p not in got[kind]:
                    continue
                ids = got[kind][p]
                line[name] = len(ids)
                if ids != want:
                    others = ", ".join(f"{o} {len(c[kind][p])}" for o, c in checks.items()
                                       if o != name and p in c[kind])
                    problems.append(f"{name}: {texts[kind]} with {p!r}: {len(ids):,} rows, expected "
                                    f"{len(want):,} ({others}); {_id_diff(ids, want)}")
            counts[f"{kind} {p}"] = line
    for name, got in checks.items():
        for kind, p, _id, d, src in got["doc_diffs"][:5]:
            keys = sorted(k for k in set(d) | set(src) if d.get(k, "<missing>") != src.get(k, "<missing>"))
            problems.append(f"{name}: {texts[kind]} with {p!r}: row {_id} differs from the source document in "
                            f"{keys}: got {[d.get(k, '<missing>') for k in keys]}, "
                            f"stored {[src.get(k, '<missing>') for k in keys]}")
        if len(got["doc_diffs"]) > 5:
            problems.append(f"{name}: ... {len(got['doc_diffs']) - 5} more rows differ from their source documents")
    for city in w.check["ctr"]:
        truth = w.truth_ctr[city]
        top = sorted(truth.items(), key=lambda kv: -kv[1])[:CTR_LIMIT]
        line = {"expected": len(top)}
        for name, got in checks.items():
            if city not in got["ctr"]:
                continue
            rows = got["ctr"][city]
            line[name] = len(rows)
            errs = []
            if len(rows) != len(top):
                errs.append(f"{len(rows)} rows, expected {len(top)}")
            for i, (pid, c) in enumerate(rows):
                if pid not in truth or not _close(c, truth[pid]):
                    errs.append(f"product {pid}: ctr {c!r}, expected {truth.get(pid)!r}")
                if i < len(top) and not _close(c, top[i][1]):
                    errs.append(f"row {i}: ctr {c!r} (product {pid}), expected {top[i][1]!r} (product {top[i][0]})")
            if errs:
                problems.append(f"{name}: CTR query with city={city!r}: " + "; ".join(errs[:6])
                                + (f"; ... {len(errs) - 6} more" if len(errs) > 6 else "")
                                + f"; got top 5 {rows[:5]}, expected {top[:5]}")
        counts[f"ctr {city}"] = line
    return problems, counts


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _speedup(a: Any, b: Any, higher_is_better: bool) -> str:
    if a is None or b is None or not a or not b:
        return "-"
    return f"{(a / b if higher_is_better else b / a):.2f}x"


def print_table(r: dict) -> None:
    g = r.get
    peers = SYSTEMS[1:]
    rows = []
    for kind, label in (("processby", "processBy ="), ("email", "ARRAY_CONTAINS"), ("ctr", "CTR by city")):
        for m, d, hib in (("qps", 1, True), ("p50_ms", 2, False), ("p95_ms", 2, False), ("p99_ms", 2, False)):
            rows.append((f"{label} {m.replace('_ms', ' ms')}", f"{kind}_{m}", d, hib))
        rows.append((f"{label} rows/query", f"{kind}_rows_per_query", 1, None))
    print()
    print(f"Query benchmark: {r['n_events']:,} events, {r['n_clicks']:,} product_clicks rows; one client, "
          f"{r['seconds']:g}s per query kind after warm-up; rtindex shards={r['shards']}, data flushed "
          f"(all sealed) before querying")
    hdr = (f"{'metric':<28}" + "".join(f" {s:>10}" for s in SYSTEMS) + "".join(f" {'vs ' + s:>10}" for s in peers)
           + "   (vs: rtindex speedup, >1 = faster)")
    print(hdr)
    print("-" * len(hdr))
    for name, key, d, hib in rows:
        a = g(key)
        vals = [g(f"{s}_{key}") for s in peers]
        speedups = [_speedup(a, v, hib) if hib is not None else "" for v in vals]
        print(f"{name:<28} {_fmt(a, d):>10}" + "".join(f" {_fmt(v, d):>10}" for v in vals)
              + "".join(f" {x:>10}" for x in speedups))
    print("-" * len(hdr))
    for cname in ("events", "product_clicks"):
        k = f"load_{cname}_seconds"
        print(f"{'load ' + cname + ' s':<28}" + "".join(f" {_fmt(g(f'{s}_{k}'), 1):>10}" for s in SYSTEMS)
              + "   (not measured figures)")
    print(f"{'on disk MB (both tables)':<28}" + "".join(f" {_fmt(g(f'{s}_disk_mb'), 0):>10}" for s in SYSTEMS))
    print("-" * len(hdr))
    if any(g(f"{kind}_qps_{THREADS}threads") for kind in KINDS):
        print(f"rtindex, {THREADS} threads on one database at once (same parameters, split between them):")
    for kind, label in (("processby", "processBy ="), ("email", "ARRAY_CONTAINS"), ("ctr", "CTR by city")):
        if not g(f"{kind}_qps_{THREADS}threads"):
            continue
        qps, ratio = g(f"{kind}_qps_{THREADS}threads"), g(f"{kind}_qps_{THREADS}threads_vs_1thread")
        print(f"  {label:<16} {_fmt(qps, 1):>10} q/s in total ({_fmt(ratio, 2)}x one thread), "
              f"p50 {_fmt(g(f'{kind}_p50_ms_{THREADS}threads'), 2)} ms, "
              f"p99 {_fmt(g(f'{kind}_p99_ms_{THREADS}threads'), 2)} ms")
    print("-" * len(hdr))
    acc = ", ".join(f"{k} {g(f'rtindex_{k}_access')}" for k in KINDS if g(f"rtindex_{k}_access"))
    if acc:
        print(f"rtindex access paths (EXPLAIN): {acc}")
    if g("chdb_skipped"):
        print(f"chdb skipped: {g('chdb_skipped')}")
    print(f"results checked against the generated data: {'all agree' if g('checks_agree') else 'MISMATCHES'} "
          f"({g('check_mismatches')} problems)")
    for k in sorted(r):
        if k.endswith("_error"):
            print(f"{k}: {r[k]}")
    print(f"process peak RSS: {g('peak_rss_mb'):,.0f} MB (includes the in-memory input data: "
          f"{g('data_rss_mb'):,.0f} MB after generation); data generation {g('gen_seconds'):.1f}s; "
          f"total {g('total_seconds'):.0f}s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k events, 1M product_clicks rows, 4 s per kind (about 4 min)")
    ap.add_argument("--events", type=int, default=None, help="number of events (default 1,000,000)")
    ap.add_argument("--clicks", type=int, default=None, help="number of product_clicks rows (default 10,000,000)")
    ap.add_argument("--seconds", type=float, default=None, help="measuring time per query kind and system "
                    "(default 10; --quick 4)")
    ap.add_argument("--shards", type=int, default=4, help="rtindex shards per collection (default 4)")
    ap.add_argument("--row-cache-mb", type=int, default=None,
                    help="rtindex RowStoreCache budget in MiB (default 4,096; --quick 1,536: enough for both "
                         "quick data sets, as SQLite's and DuckDB's files sit whole in the OS page cache)")
    ap.add_argument("--batch", type=int, default=10_000, help="load batch / transaction size (default 10,000)")
    ap.add_argument("--dir", default=None, help="parent of the temporary working directory (default /tmp)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help=f"comma-separated subset of {','.join(SYSTEMS)} (default all)")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    args = ap.parse_args(argv)

    n_events = args.events if args.events is not None else (100_000 if args.quick else 1_000_000)
    n_clicks = args.clicks if args.clicks is not None else (1_000_000 if args.quick else 10_000_000)
    if args.row_cache_mb is None:
        args.row_cache_mb = 1536 if args.quick else 4096
    if args.seconds is None:
        args.seconds = 4.0 if args.quick else 10.0
    systems = {s.strip() for s in args.systems.split(",") if s.strip()}
    unknown = systems - set(SYSTEMS)
    if unknown:
        ap.error(f"unknown systems: {', '.join(sorted(unknown))}")
    if n_events < 1 or n_clicks < 1:
        ap.error("--events and --clicks must be positive")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="rtindex-query-", dir=args.dir)
    t_start = time.perf_counter()
    log(f"query benchmark: {n_events:,} events, {n_clicks:,} product_clicks rows, {args.seconds:g}s per kind, "
        f"shards={args.shards}, row cache {args.row_cache_mb} MiB, dir={workdir}")

    results: dict[str, Any] = {}
    checks: dict[str, dict] = {}
    reports: list[str] = []
    try:
        events, clicks, gen_s = generate(n_events, n_clicks, args.seed)
        data_rss = rss_mb()
        log(f"data ready in {gen_s:.1f}s; RSS {data_rss:,.0f} MB")
        w = make_workload(events, clicks, args.seed)
        step = max(1, n_events // 1000)
        fingerprint = [orjson.dumps(events[i]) for i in range(0, n_events, step)]
        for name, fn in (("rtindex", bench_rtindex), ("sqlite", bench_sqlite), ("duckdb", bench_duckdb),
                         ("chdb", bench_chdb)):
            if name not in systems:
                continue
            sub = os.path.join(workdir, name)
            os.makedirs(sub, exist_ok=True)
            run_guarded(name, lambda: fn(w, args, sub, checks, reports), results)
            if any(orjson.dumps(events[i]) != fp for i, fp in zip(range(0, n_events, step), fingerprint)):
                log(f"!! {name} mutated the input documents: the later systems load different data")
            if not args.keep:
                shutil.rmtree(sub, ignore_errors=True)
        problems, check_counts = verify(w, checks)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"kept {workdir}")

    for line in problems:
        log(f"!! MISMATCH {line}")
    out: dict[str, Any] = {}
    for prefix in ("", "sqlite_", "duckdb_", "chdb_"):
        for key in ("processby_qps", "processby_p50_ms", "processby_p99_ms", "email_qps", "email_p50_ms",
                    "email_p99_ms", "ctr_p50_ms", "ctr_p95_ms"):
            out[prefix + key] = results.get(prefix + key)
    for kind in KINDS:
        for key in (f"qps_{THREADS}threads", f"p50_ms_{THREADS}threads", f"p99_ms_{THREADS}threads",
                    f"qps_{THREADS}threads_vs_1thread"):
            out[f"{kind}_{key}"] = results.get(f"{kind}_{key}")
    for kind in ("processby", "email"):
        for peer in ("sqlite", "duckdb", "chdb"):
            a, b = results.get(f"{kind}_qps"), results.get(f"{peer}_{kind}_qps")
            out[f"{kind}_qps_vs_{peer}"] = a / b if a and b else None
    peers = [results[k] for k in ("sqlite_ctr_p50_ms", "duckdb_ctr_p50_ms") if results.get(k)]
    out["ctr_speedup_vs_fastest_peer"] = (min(peers) / results["ctr_p50_ms"]
                                          if peers and results.get("ctr_p50_ms") else None)
    a, b = results.get("ctr_p50_ms"), results.get("chdb_ctr_p50_ms")
    out["ctr_speedup_vs_chdb"] = b / a if a and b else None
    out["peak_rss_mb"] = peak_rss_mb()
    for k in sorted(results):
        if k not in out:
            out[k] = results[k]
    out.update({
        "n_events": n_events,
        "n_clicks": n_clicks,
        "check_rows": check_counts,
        "checks_agree": not problems,
        "check_mismatches": len(problems),
        "seconds": args.seconds,
        "shards": args.shards,
        "row_cache_mb": args.row_cache_mb,
        "batch": args.batch,
        "data_rss_mb": data_rss,
        "gen_seconds": gen_s,
        "total_seconds": time.perf_counter() - t_start,
    })
    print()
    for text in reports:
        print(text)
        print()
    print_table(out)
    out = {k: ((round(v, 3) if math.isfinite(v) else None) if isinstance(v, float) else v) for k, v in out.items()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
