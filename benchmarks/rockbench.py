#!/usr/bin/env python
"""RockBench over HTTP: data latency of ``rtindex serve`` under a steady write stream.

    python benchmarks/rockbench.py [--quick] [--seconds S] [--mb-per-s R | --small] [--tick-ms T]
                                   [--eval-interval-ms E] [--shards N] [--dir DIR] [--keep]

RockBench's method (rockset/rockbench, DESTINATION=Rockset), against a freshly started
``rtindex serve --query-workers 1`` (own temporary data directory, started as
tests/serving.py does), with the Rockset-compatible routes it uses:

* this process creates collection ``bench`` (``POST /v1/orgs/self/ws/commons/collections``);
* a *generator* process (benchmarks/_service.py ``paced_writer``) writes RockBench-style
  events (``rtindex.datagen``, ~1.25 KB as JSON; ``_event_time`` = the wall clock in
  microseconds when the request is built, ``generator_identifier`` = a random id of this run)
  to ``POST /v1/orgs/self/ws/commons/collections/bench/docs`` (``{"data": [...]}``,
  ``Authorization: ApiKey``) on one keep-alive connection, one request per ``--tick-ms``
  (10) ms with the documents due by then at ``--mb-per-s`` (default 20); a request that
  returns late is followed by one carrying the documents due since (at most 10 ticks'
  worth), so the rate holds while the server keeps up. ``--small``: RockBench's small mode,
  10 documents per request, 50 requests per second (tick 20 ms).
* an *evaluator* process, on its own connection, runs RockBench's query
  ``select UNIX_MICROS(max(_event_time)) as ts from "commons"."bench" where
  generator_identifier = '<id>' and _event_time > TIMESTAMP_SECONDS(<now - 120>)`` via
  ``POST /v1/orgs/self/queries`` over and over (``--eval-interval-ms`` pause between, default
  10) and records **data latency = now - ts** with ``now`` taken when the reply arrives (as
  RockBench does; same machine, same clock, microseconds).

Read the latency with two things in mind: (1) it includes the query's own round trip
(``query_p50_ms``...: the time from sending the query to its reply); (2) it includes the time
since the generator built its newest request, up to one tick (on average half a tick) even
when every write is visible at once, because documents are stamped per request, as RockBench's
batches are. ``visible_gap_*_ms`` separates that out: ``_event_time`` of the newest
*acknowledged* write when the query was sent minus ``ts`` (0 when everything acknowledged was
visible), i.e. how far behind acknowledged writes the query process's answer was.

Also recorded: per-write HTTP latency (``write_p50_ms``...), achieved rate, errors (HTTP
errors and per-document ERROR items), CPU of every process (server supervisor, ingest,
query; generator; evaluator; psutil, % of one core over the measured window), and at the
end whether the collection holds every document written (``converged``).

The first ``--warmup`` (3) seconds are not measured. Full run: 120 s of load; ``--quick``:
25 s (about 1 minute in all). The LAST stdout line is one JSON object (target_mb_per_s,
achieved_mb_per_s, latency_p50_ms, latency_p95_ms, latency_p99_ms, docs_per_s, write_p50_ms,
write_p99_ms, samples, errors, cpu_pct, ...). Targets, at the target rate, as PASS/FAIL lines
on stderr: latency p50 <= 20 ms, p99 <= 70 ms, and the generator at >= 95% of its target rate.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import secrets
import string
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._service import (  # noqa: E402
    CpuMeter, RawClient, cleanup_dir, log, paced_writer, server_pids, server_problems, start_server)
from benchmarks.figures import check, rnd, summary  # noqa: E402

TARGET_P50_MS = 20.0
TARGET_P99_MS = 70.0
WS, COLL = "commons", "bench"
DOCS_PATH = f"/v1/orgs/self/ws/{WS}/collections/{COLL}/docs"
QUERY_PATH = "/v1/orgs/self/queries"
ROCKBENCH_SQL = ('select UNIX_MICROS(max(_event_time)) as ts from "commons"."bench" '
                 "where generator_identifier = '{gid}' and _event_time > TIMESTAMP_SECONDS({since})")


def evaluator_main(url: str, key: str, opts: dict, ready: Any, go: Any, stop: Any, shared: Any,
                   results: Any) -> None:
    """RockBench's evaluator: the latest _event_time of this generator, over and over."""
    try:
        import orjson

        client = RawClient(url, key)
        pause = opts["eval_interval_ms"] / 1000.0
        latency: list[float] = []
        at: list[float] = []  # time.time() of each latency sample (for --plot)
        query_ms: list[float] = []
        gap_ms: list[float] = []
        server_ms: list[float] = []
        staleness_ms: list[float] = []
        errors = empty = 0
        first_error = None
        ready.set()
        while not go.wait(0.1):
            if stop.is_set():
                return
        while not stop.is_set():
            t_send = time.time_ns() // 1000
            acked = shared[2]
            sql = ROCKBENCH_SQL.format(gid=opts["gen_id"], since=t_send // 1_000_000 - 120)
            try:
                status, reply = client.post(QUERY_PATH, orjson.dumps({"sql": {"query": sql}}))
            except Exception as e:  # noqa: BLE001 - counted, reported
                status, reply = 0, repr(e).encode()
            t_recv = time.time_ns() // 1000
            if status != 200:
                errors += 1
                if first_error is None:
                    first_error = f"{status}: {reply[:300]!r}"
            else:
                r = orjson.loads(reply)
                ts = r["results"][0]["ts"] if r.get("results") else None
                if ts is None:
                    empty += 1  # nothing of this generator visible yet
                elif t_send / 1e6 >= shared[0]:
                    latency.append((t_recv - ts) / 1000.0)
                    at.append(t_send / 1e6)
                    query_ms.append((t_recv - t_send) / 1000.0)
                    gap_ms.append(max(0.0, acked - ts) / 1000.0)
                    st = r.get("stats") or {}
                    if st.get("elapsed_ms") is not None:
                        server_ms.append(st["elapsed_ms"])
                    if st.get("staleness_ms") is not None:
                        staleness_ms.append(st["staleness_ms"])
            if pause:
                time.sleep(pause)
        client.close()
        results.put(("evaluator", {"latency": latency, "at": at, "query_ms": query_ms, "gap_ms": gap_ms,
                                   "server_ms": server_ms, "staleness_ms": staleness_ms,
                                   "errors": errors, "empty": empty, "first_error": first_error}))
    except BaseException as e:  # noqa: BLE001 - reported to the orchestrator
        results.put(("evaluator", {"error": f"evaluator: {type(e).__name__}: {e}",
                                   "traceback": traceback.format_exc()}))


def _wait_ready(ev: Any, procs: list, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not ev.wait(0.1):
        if time.monotonic() > deadline or not all(p.is_alive() for p in procs):
            return ev.is_set()
    return True


def _count(client: RawClient, gen_id: str) -> int | None:
    import orjson

    sql = f"SELECT COUNT(*) AS n FROM commons.bench WHERE generator_identifier = '{gen_id}'"
    status, reply = client.post(QUERY_PATH, orjson.dumps({"sql": {"query": sql}}))
    return orjson.loads(reply)["results"][0]["n"] if status == 200 else None


def run(args: argparse.Namespace, seconds: float, work: str) -> dict:
    import orjson

    out: dict[str, Any] = {"errors": []}
    data = os.path.join(work, "data")
    log(f"starting rtindex serve --query-workers 1 on {data} ...")
    served = start_server(data, "--query-workers", "1")
    procs: list = []
    got: dict[str, dict] = {}
    try:
        log(f"  {served.url}; creating collection {WS}.{COLL} (shards={args.shards})")
        admin = RawClient(served.url, served.admin_key)
        status, reply = admin.post(f"/v1/orgs/self/ws/{WS}/collections",
                                   orjson.dumps({"name": COLL, "shards": args.shards}))
        if status != 200:
            raise RuntimeError(f"creating the collection: {status} {reply[:300]!r}")
        gen_id = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(10))
        ctx = mp.get_context("spawn")
        ready_w, ready_e, go, stop = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
        shared = ctx.Array("d", [1e300, 0.0, 0.0])
        results = ctx.Queue()
        wopts = {"path": DOCS_PATH, "rockset": True, "gen_id": gen_id, "id_prefix": gen_id,
                 "pool": args.pool, "seed": args.seed, "tick_ms": 20.0 if args.small else args.tick_ms,
                 "mb_per_s": args.mb_per_s, "fixed_docs": 10 if args.small else 0, "max_catchup": 10}
        eopts = {"gen_id": gen_id, "eval_interval_ms": args.eval_interval_ms}
        writer = ctx.Process(target=paced_writer, name="generator",
                             args=(served.url, served.admin_key, wopts, ready_w, go, stop, shared, results))
        evaluator = ctx.Process(target=evaluator_main, name="evaluator",
                                args=(served.url, served.admin_key, eopts, ready_e, go, stop, shared, results))
        writer.start()
        evaluator.start()
        procs = [writer, evaluator]
        if not (_wait_ready(ready_w, procs, 120) and _wait_ready(ready_e, procs, 120)):
            raise RuntimeError("the generator or the evaluator did not start")
        pids = {**server_pids(served), "generator": writer.pid, "evaluator": evaluator.pid}
        log(f"  processes: {pids}")
        shared[0] = time.time() + args.warmup
        go.set()
        log(f"  generator {gen_id}: {'small mode (10 docs x 50/s)' if args.small else f'{args.mb_per_s} MB/s'}, "
            f"a request every {wopts['tick_ms']:.0f} ms; {args.warmup:.0f}s warm-up, then {seconds:.0f}s measured")
        time.sleep(args.warmup)
        meter = CpuMeter(pids).start()
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            time.sleep(min(5.0, max(0.0, t_end - time.perf_counter())))
            if not all(p.is_alive() for p in procs):
                raise RuntimeError("the generator or the evaluator died")
            behind_ms = (shared[1] - shared[2]) / 1000
            log(f"  {seconds - max(0.0, t_end - time.perf_counter()):.0f}s: newest write sent "
                f"{behind_ms:.1f} ms after the newest acknowledged one")
        out["cpu_pct"] = meter.stop()
        out["window_seconds"] = seconds
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        out["errors"].append(f"{type(e).__name__}: {e}")
        log(traceback.format_exc())
    finally:
        if procs:
            stop.set()
            deadline = time.monotonic() + 60
            while len(got) < len(procs) and time.monotonic() < deadline:
                try:
                    who, res = results.get(timeout=0.5)
                    got[who] = res
                except queue.Empty:
                    if not any(p.is_alive() for p in procs):
                        break
            for p in procs:
                p.join(30)
                if p.is_alive():
                    out["errors"].append(f"{p.name} hung; terminated")
                    p.terminate()
        w = got.get("writer", {})
        if "docs" in w and "gen_id" in locals():
            deadline = time.monotonic() + 30
            n = None
            while time.monotonic() < deadline:
                try:
                    n = _count(admin, gen_id)
                except Exception:  # noqa: BLE001
                    n = None
                if n == w["docs_acked"]:
                    break
                time.sleep(0.2)
            out["documents_stored"] = n
            out["converged"] = n == w["docs_acked"]
        out["server_problems"] = server_problems(served)
        log("stopping the server ...")
        out["server_exit"] = served.stop()
    for who, res in got.items():
        if "error" in res:
            out["errors"].append(res["error"])
            log(res.get("traceback", ""))
        else:
            out[who] = res
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="25 s of load (about 1 minute in all)")
    ap.add_argument("--seconds", type=float, default=None, help="measured seconds of load (default 120; quick 25)")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of load before measuring (default 3)")
    ap.add_argument("--mb-per-s", type=float, default=20.0, help="generator's target rate, MB/s of JSON (default 20)")
    ap.add_argument("--small", action="store_true", help="RockBench's small mode: 10 docs x 50 writes/s")
    ap.add_argument("--tick-ms", type=float, default=10.0, help="one write request per ... ms (default 10)")
    ap.add_argument("--eval-interval-ms", type=float, default=10.0,
                    help="evaluator's pause between queries, ms (default 10)")
    ap.add_argument("--shards", type=int, default=4, help="shards of the collection (default 4)")
    ap.add_argument("--pool", type=int, default=20_000, help="generated events cycled by the generator")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None, help="parent of the temporary working directory (default /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    ap.add_argument("--plot", default=None, help="write a PNG of data latency and query round trip over time")
    args = ap.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (25.0 if args.quick else 120.0)
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="rtindex-rockbench-", dir=args.dir)
    t_start = time.perf_counter()
    log(f"rockbench over HTTP: dir={work}")
    try:
        res = run(args, seconds, work)
    finally:
        cleanup_dir(work, args.keep)

    w, e = res.get("writer", {}), res.get("evaluator", {})
    lat = summary(e.get("latency", []))
    q = summary(e.get("query_ms", []))
    gap = summary(e.get("gap_ms", []))
    srv = summary(e.get("server_ms", []))
    stale = summary(e.get("staleness_ms", []))
    wr = summary(w.get("write_ms", []))
    target_mb = w.get("target_mb_per_s") if args.small else args.mb_per_s
    out: dict[str, Any] = {
        "mode": "small" if args.small else "rate",
        "target_mb_per_s": target_mb,
        "achieved_mb_per_s": w.get("mb_per_s"),
        "latency_p50_ms": lat["p50"], "latency_p95_ms": lat["p95"], "latency_p99_ms": lat["p99"],
        "latency_max_ms": lat["max"], "latency_mean_ms": lat["mean"],
        "samples": lat["n"],
        "docs_per_s": w.get("docs_per_s"), "target_docs_per_s": w.get("target_docs_per_s"),
        "avg_doc_bytes": w.get("avg_doc_bytes"),
        "write_p50_ms": wr["p50"], "write_p95_ms": wr["p95"], "write_p99_ms": wr["p99"], "write_max_ms": wr["max"],
        "writes": w.get("requests"), "max_batch_docs": w.get("max_batch"), "late_ticks": w.get("late_ticks"),
        "query_p50_ms": q["p50"], "query_p95_ms": q["p95"], "query_p99_ms": q["p99"],
        "query_server_p50_ms": srv["p50"], "query_server_p99_ms": srv["p99"],
        "visible_gap_p50_ms": gap["p50"], "visible_gap_p95_ms": gap["p95"], "visible_gap_p99_ms": gap["p99"],
        "reader_staleness_p50_ms": stale["p50"], "reader_staleness_p99_ms": stale["p99"],
        "errors": (w.get("errors") or 0) + (e.get("errors") or 0),
        "write_errors": w.get("errors"), "item_errors": w.get("item_errors"), "query_errors": e.get("errors"),
        "first_write_error": w.get("first_error"), "first_query_error": e.get("first_error"),
        "queries_before_data": e.get("empty"),
        "documents_written": w.get("docs"), "documents_acknowledged": w.get("docs_acked"),
        "documents_stored": res.get("documents_stored"),
        "converged": res.get("converged"),
        "cpu_pct": res.get("cpu_pct"),
        "tick_ms": 20.0 if args.small else args.tick_ms, "eval_interval_ms": args.eval_interval_ms,
        "shards": args.shards, "seconds": seconds,
        "server_problems": res.get("server_problems"), "server_exit": res.get("server_exit"),
        "failures": res["errors"],
        "total_seconds": time.perf_counter() - t_start,
    }
    rate_ok = lambda v: bool(out["target_docs_per_s"]) and v >= 0.95 * out["target_docs_per_s"]  # noqa: E731
    check("data latency p50 <= 20 ms", out["latency_p50_ms"], lambda v: v <= TARGET_P50_MS, "{:.2f} ms")
    check("data latency p99 <= 70 ms", out["latency_p99_ms"], lambda v: v <= TARGET_P99_MS, "{:.2f} ms")
    check("generator at >= 95% of its target rate", out["docs_per_s"], rate_ok, "{:,.0f} docs/s")
    for msg in res["errors"]:
        log(f"!! {msg}")
    if args.plot:
        plot(args.plot, e, out)
    print(json.dumps(rnd(out)))
    return 1 if res["errors"] else 0


def plot(path: str, e: dict, out: dict) -> None:
    """Data latency and the evaluator's round trip over the measured time (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    at = e.get("at") or []
    if not at:
        log("--plot: no latency samples to plot")
        return
    t0 = at[0]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.plot([t - t0 for t in at], e["latency"], ".", ms=3, label="data latency (now - newest _event_time)")
    ax.plot([t - t0 for t in at], e["query_ms"], ".", ms=3, alpha=0.6, label="evaluator query round trip")
    ax.set_xlabel("seconds")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.set_title(f"rtindex serve, RockBench method: target {out['target_mb_per_s']} MB/s, "
                 f"achieved {out['achieved_mb_per_s'] or 0:.1f} MB/s; p50 {out['latency_p50_ms']} ms, "
                 f"p99 {out['latency_p99_ms']} ms", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"plot: {path}")


if __name__ == "__main__":
    sys.exit(main())
