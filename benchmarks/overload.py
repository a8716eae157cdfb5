#!/usr/bin/env python
"""How ``rtindex serve`` with its default admission settings behaves past its query capacity.

    python benchmarks/overload.py [--quick] [--events N] [--factor F] [--seconds S] [--soak S]
                                  [--writers W] [--writer-mb R] [--serve "ARGS"] [--dir DIR] [--keep]

Data: RockBench events (``rtindex.datagen``; 100,000, ``--quick`` 30,000) loaded into collection
``ev`` embedded before the server starts (benchmarks/qps.py ``load``); then ``rtindex serve``
on that directory with its defaults (plus ``--serve``, e.g. ``--serve "--max-queued-queries
64"`` for the earlier default).

Queries: ``SELECT * FROM ev WHERE processBy = :p`` and ``... ARRAY_CONTAINS(emails, :e)``, half
each, parameters drawn at random.

Phases (the first 0.5 s of each not measured):

1. ``unloaded``: as many closed-loop clients as the service runs queries at once
   (``--max-concurrent-queries`` x ``--query-workers``; benchmarks/qps.py ``client_main``: one
   keep-alive connection each, the next request as soon as the reply is read), ``--seconds``
   (quick 6, else 20): the service's *capacity* (queries answered a second) and the reference
   latencies, with every slot busy and nothing queued;
2. ``soak``: open loop (``opener_main``): requests arrive at ``--factor`` (3) x that capacity,
   at random (Poisson) times, each on an idle keep-alive connection or a new one, whatever
   happened to the ones before, for ``--soak`` seconds (quick 20, else 90). Latency counts from
   the request's send; ``late_ms`` says how far the generator itself fell behind its times, and
   an admitted query's ``stats`` (queued_ms, elapsed_ms) how much of it passed inside the
   service's admission and execution, the rest being the wait for its event loop;
3. ``soak_writes``: the same, while ``--writers`` (2) processes (benchmarks/_service.py
   ``paced_writer``) each POST new events at ``--writer-mb`` (10) MB/s, together about twice
   what the ingest process of this machine stores, for ``--seconds``.

Then the writers stop, one more write's fence is awaited, and every document a writer had
acknowledged (200) is looked for: ``lost_acked_writes`` counts those not found.

Figures (LAST stdout line, one JSON object): per phase the admitted queries' p50/p95/p99 and
rate, the 429s' count and p50/p95 latency; ``admitted_p95_ratio`` (soak p95 / unloaded p95);
RSS (MiB) of each server process after phase 1 and at the end; the writers' achieved MB/s,
acknowledged and lost documents; ``/healthz`` status and latency after; CPU % per process.

Targets (PASS/FAIL on stderr): 429 p95 < 5 ms under the soak; admitted p95 within 2x of
unloaded; no acknowledged write lost; ``/healthz`` 200 after; the query processes' RSS at the
end within 1.5x of after warm-up.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import shlex
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
    CpuMeter, cleanup_dir, log, paced_writer, server_pids, server_problems, start_server)
from benchmarks.figures import check, rnd, summary  # noqa: E402
from benchmarks.qps import COLL, PARAM_NAME, SQL, client_main, load_in_child, run_phase  # noqa: E402

TARGET_429_P95_MS = 5.0
TARGET_RATIO = 2.0
TARGET_RSS_GROWTH = 1.5
MIB = 1 << 20
OPENERS = 2  # open-loop generator processes
MAX_CONNECTIONS = 400  # per generator process: an arrival past that waits for a connection (counted)


def opener_main(idx: int, url: str, key: str, params: dict, cmds: Any, results: Any) -> None:
    """Open-loop load on commands (phase, rate per second, t_start, t_measure, t_end) until
    None: see the module doc. Reports latencies from the send of each request measured."""
    import asyncio
    import random
    from urllib.parse import urlsplit

    import orjson

    u = urlsplit(url)
    host, port = u.hostname, u.port
    rng = random.Random(3000 + idx)
    head = (f"POST /v1/query HTTP/1.1\r\nHost: {host}\r\nAuthorization: ApiKey {key}\r\n"
            "Content-Type: application/json\r\nContent-Length: ").encode()

    def request() -> bytes:
        k = "processby" if rng.random() < 0.5 else "email"
        vals = params[k]
        body = orjson.dumps({"sql": SQL[k], "parameters": {PARAM_NAME[k]: vals[rng.randrange(len(vals))]}})
        return head + str(len(body)).encode() + b"\r\n\r\n" + body

    async def exchange(conn: tuple, req: bytes) -> tuple[int, bytes]:
        reader, writer = conn
        writer.write(req)
        top = await reader.readuntil(b"\r\n\r\n")
        status = int(top[9:12])
        length = 0
        for line in top.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await reader.readexactly(length)

    async def phase(rate: float, t_start: float, t_measure: float, t_end: float) -> dict:
        idle: list[tuple] = []
        slots = asyncio.Semaphore(MAX_CONNECTIONS)
        got: dict[str, Any] = {"ok": [], "rej": [], "other": {}, "first_other": None, "late_ms": [],
                               "queued_ms": [], "server_ms": [], "waited_for_connection": 0, "connections": 0}
        tasks: set[asyncio.Task] = set()

        async def one(t_sched: float, req: bytes) -> None:
            measured = t_sched >= t_measure
            if slots.locked():
                got["waited_for_connection"] += measured
            async with slots:
                if measured:
                    got["late_ms"].append((time.time() - t_sched) * 1000)
                for attempt in (0, 1):
                    conn = idle.pop() if idle else None
                    fresh = conn is None
                    if fresh:
                        conn = await asyncio.open_connection(host, port)
                        got["connections"] += 1
                    t0 = time.perf_counter()
                    try:
                        status, reply = await exchange(conn, req)
                        break
                    except (asyncio.IncompleteReadError, ConnectionError) as e:  # closed while idle: once more
                        conn[1].close()
                        if fresh or attempt:
                            status, reply = 0, repr(e).encode()
                            conn = None
                            break
                ms = (time.perf_counter() - t0) * 1000
                if conn is not None:
                    idle.append(conn)
            if not measured:
                return
            if status == 200:
                got["ok"].append(ms)
                stats = orjson.loads(reply)["stats"]
                got["queued_ms"].append(stats["queued_ms"])
                got["server_ms"].append(stats["queued_ms"] + stats["elapsed_ms"])
            elif status == 429:
                got["rej"].append(ms)
            else:
                got["other"][str(status)] = got["other"].get(str(status), 0) + 1
                got["first_other"] = got["first_other"] or f"{status}: {reply[:300]!r}"

        t = t_start
        while t < t_end:
            pause = t - time.time()
            if pause > 0:
                await asyncio.sleep(pause)
            task = asyncio.create_task(one(t, request()))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            t += rng.expovariate(rate)
        if tasks:
            await asyncio.wait(tasks, timeout=60)
        for _, w in idle:
            w.close()
        return got

    try:
        results.put((idx, "ready", {}))
        while True:
            cmd = cmds.get()
            if cmd is None:
                break
            name, rate, t_start, t_measure, t_end = cmd
            results.put((idx, name, asyncio.run(phase(rate, t_start, t_measure, t_end))))
    except BaseException as e:  # noqa: BLE001 - reported to the orchestrator
        results.put((idx, "error", {"error": f"opener {idx}: {type(e).__name__}: {e}",
                                    "traceback": traceback.format_exc()}))


def open_phase(name: str, rate: float, seconds: float, cmd_qs: list, results: Any, pids: dict) -> dict:
    """``rate`` requests a second from the generators for ``seconds``: the phase's figures."""
    t_start = time.time() + 0.3
    t_measure, t_end = t_start + 0.5, t_start + seconds
    for q in cmd_qs:
        q.put((name, rate / len(cmd_qs), t_start, t_measure, t_end))
    time.sleep(max(0.0, t_measure - time.time()))
    meter = CpuMeter(pids).start()
    time.sleep(max(0.0, t_end - time.time()))
    cpu = meter.stop()
    got: list[dict] = []
    while len(got) < len(cmd_qs):
        _idx, phase, res = results.get(timeout=120)
        if phase == "error":
            raise RuntimeError(res["error"] + "\n" + res.get("traceback", ""))
        if phase == name:
            got.append(res)
    window = t_end - t_measure
    ok = [v for r in got for v in r["ok"]]
    rej = [v for r in got for v in r["rej"]]
    s, r, late = summary(ok), summary(rej), summary([v for x in got for v in x["late_ms"]])
    queued = summary([v for x in got for v in x["queued_ms"]])
    server = summary([v for x in got for v in x["server_ms"]])
    other: dict[str, int] = {}
    for x in got:
        for st, c in x["other"].items():
            other[st] = other.get(st, 0) + c
    out = {"offered_per_s": rate, "seconds": window, "qps": len(ok) / window, "p50_ms": s["p50"],
           "p95_ms": s["p95"], "p99_ms": s["p99"], "max_ms": s["max"], "rejected_429": len(rej),
           "rejected_429_per_s": len(rej) / window, "rejected_p50_ms": r["p50"], "rejected_p95_ms": r["p95"],
           "rejected_p99_ms": r["p99"], "other_errors": other,
           "first_other_error": next((x["first_other"] for x in got if x["first_other"]), None),
           "queued_p95_ms": queued["p95"], "server_p95_ms": server["p95"], "generator_late_p95_ms": late["p95"],
           "waited_for_connection": sum(x["waited_for_connection"] for x in got),
           "connections": sum(x["connections"] for x in got), "cpu_pct": cpu}
    log(f"  [{name}] offered {rate:,.0f}/s: {out['qps']:,.0f}/s answered, p50 {s['p50'] or 0:.2f} p95 "
        f"{s['p95'] or 0:.2f} p99 {s['p99'] or 0:.2f} ms; 429: {len(rej) / window:,.0f}/s, p50 {r['p50'] or 0:.2f} "
        f"p95 {r['p95'] or 0:.2f} ms; in the server p95 {server['p95'] or 0:.2f} ms (queued {queued['p95'] or 0:.2f});"
        f" other {other}; generator late p95 {late['p95'] or 0:.1f} ms; "
        f"CPU % {', '.join(f'{k} {v:.0f}' for k, v in cpu.items())}")
    return out


def rss_mib(pids: dict[str, int]) -> dict[str, float]:
    import psutil

    out = {}
    for name, pid in pids.items():
        try:
            out[name] = psutil.Process(pid).memory_info().rss / MIB
        except psutil.Error:
            pass
    return out


def serve_defaults(extra: list[str]) -> tuple[int, int]:
    """(--query-workers, --max-concurrent-queries) the server runs with: rtindex serve's
    defaults, or what ``extra`` says."""
    from rtindex.cli import _parser

    args = _parser().parse_args(["serve", "--data", "x", *extra])
    return args.query_workers, args.max_concurrent_queries


def found_docs(url: str, key: str, gen_ids: list[str]) -> dict[str, int]:
    """Documents of each writer in the collection, once a write made after theirs is visible."""
    import httpx

    with httpx.Client(base_url=url, headers={"Authorization": f"ApiKey {key}"}, timeout=120) as c:
        r = c.post(f"/v1/collections/{COLL}/docs", json=[{"_id": "overload-fence", "k": 1}])
        r.raise_for_status()
        fence = r.json()["fence"]
        out = {}
        for g in gen_ids:
            for _ in range(60):  # a 429 says when to come back, as any client would
                r = c.post("/v1/query", json={"sql": f"SELECT COUNT(*) AS n FROM {COLL} WHERE generator_identifier = :g",
                                              "parameters": {"g": g}, "min_fence": fence, "timeout_ms": 60_000})
                if r.status_code != 429:
                    break
                time.sleep(float(r.headers.get("retry-after", "1")))
            r.raise_for_status()
            out[g] = r.json()["rows"][0]["n"]
        return out


def run(args: argparse.Namespace, work: str) -> dict:
    out: dict[str, Any] = {"errors": [], "phases": {}}
    data = os.path.join(work, "data")
    log(f"loading {args.events:,} events embedded into {data} (in a child process) ...")
    params, out["load_seconds"] = load_in_child(data, args.events, 4, args.seed, None)
    extra = shlex.split(args.serve)
    workers, concurrent = serve_defaults(extra)
    n1 = workers * concurrent
    out.update({"query_workers": workers, "max_concurrent_queries": concurrent, "clients_1x": n1,
                "serve_args": extra})
    log(f"starting rtindex serve {' '.join(extra)} (query processes {workers}, {concurrent} queries at once each)")
    served = start_server(data, *extra)
    ctx = mp.get_context("spawn")
    procs: list = []
    cmd_qs: list = []
    stop = ctx.Event()
    wresults = ctx.Queue()
    writers: list = []
    try:
        url, key = served.url, served.admin_key
        results, oresults = ctx.Queue(), ctx.Queue()
        for i in range(n1 + OPENERS):
            q = ctx.Queue()
            p = (ctx.Process(target=client_main, name=f"client{i}", args=(i, url, key, "http.client", params, q,
                                                                          results)) if i < n1 else
                 ctx.Process(target=opener_main, name=f"opener{i - n1}", args=(i - n1, url, key, params, q, oresults)))
            p.start()
            procs.append(p)
            cmd_qs.append(q)
        for res_q in [results] * n1 + [oresults] * OPENERS:
            _idx, phase, res = res_q.get(timeout=120)
            if phase == "error":
                raise RuntimeError(res["error"])
        pids = server_pids(served)
        log("warm-up: 1x clients, 3 s")
        run_phase("warmup", "mix", n1, 3.0, procs, cmd_qs, results, pids)
        log(f"phase unloaded: {n1} closed-loop clients, {args.seconds:.0f} s")
        out["phases"]["unloaded"] = run_phase("unloaded", "mix", n1, args.seconds, procs, cmd_qs, results, pids)
        out["rss_mib_after_warmup"] = rss_mib(pids)
        opener_qs = cmd_qs[n1:]
        opener_pids = {**pids, **{f"opener{i}": p.pid for i, p in enumerate(procs[n1:])}}
        rate = out["phases"]["unloaded"]["qps"] * args.factor
        log(f"phase soak: open loop at {rate:,.0f}/s ({args.factor}x), {args.soak:.0f} s")
        out["phases"]["soak"] = open_phase("soak", rate, args.soak, opener_qs, oresults, opener_pids)
        if args.writers:
            w_ready = [ctx.Event() for _ in range(args.writers)]
            go = ctx.Event()
            shared = ctx.Array("d", [0.0, 0.0, 0.0])
            for i in range(args.writers):
                wopts = {"path": f"/v1/collections/{COLL}/docs", "rockset": False, "gen_id": f"overload-w{i}",
                         "id_prefix": f"w{i}", "pool": 5_000, "seed": args.seed + 1 + i, "tick_ms": 10.0,
                         "mb_per_s": args.writer_mb, "max_catchup": 10, "client": "http.client"}
                w = ctx.Process(target=paced_writer, name=f"writer{i}",
                                args=(url, key, wopts, w_ready[i], go, stop, shared, wresults))
                w.start()
                writers.append(w)
            for e in w_ready:
                if not e.wait(120):
                    raise RuntimeError("a writer did not start")
            go.set()
            wpids = {**opener_pids, **{f"writer{i}": w.pid for i, w in enumerate(writers)}}
            log(f"phase soak_writes: open loop at {rate:,.0f}/s and {args.writers} writers at {args.writer_mb} MB/s "
                f"each, {args.seconds:.0f} s")
            out["phases"]["soak_writes"] = open_phase("soak_writes", rate, args.seconds, opener_qs, oresults, wpids)
            stop.set()
            got = []
            for _ in writers:
                try:
                    got.append(wresults.get(timeout=120)[1])
                except queue.Empty:
                    out["errors"].append("a writer did not report")
            for w in writers:
                w.join(30)
            ws = []
            for res in got:
                if "error" in res:
                    out["errors"].append(res["error"])
                    continue
                res.update(summary(res.pop("write_ms", []), "write_ms_"))
                ws.append(res)
            found = found_docs(url, key, [f"overload-w{i}" for i in range(args.writers)])
            acked = sum(w["docs_acked"] for w in ws)
            out["writers"] = {
                "mb_per_s": sum(w["mb_per_s"] for w in ws), "target_mb_per_s": args.writer_mb * args.writers,
                "docs_sent": sum(w["docs"] for w in ws), "docs_acked": acked, "docs_found": sum(found.values()),
                "lost_acked_writes": max(0, acked - sum(found.values())),
                "errors": sum(w["errors"] for w in ws), "first_error": next((w["first_error"] for w in ws
                                                                             if w.get("first_error")), None),
                "write_p50_ms": max((w["write_ms_p50"] or 0) for w in ws) if ws else None,
                "write_p99_ms": max((w["write_ms_p99"] or 0) for w in ws) if ws else None}
        out["rss_mib_end"] = rss_mib(pids)
        import httpx

        t0 = time.perf_counter()
        r = httpx.get(f"{url}/healthz", timeout=30)
        out["healthz_after"] = {"status": r.status_code, "ms": (time.perf_counter() - t0) * 1000}
        meter = CpuMeter(pids).start()
        time.sleep(1.0)
        out["idle_cpu_pct_after"] = meter.stop()
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        out["errors"].append(f"{type(e).__name__}: {e}")
        log(traceback.format_exc())
    finally:
        stop.set()
        for q in cmd_qs:
            q.put(None)
        for p in procs + writers:
            p.join(30)
            if p.is_alive():
                p.terminate()
        out["server_problems"] = server_problems(served)
        log("stopping the server ...")
        t0 = time.perf_counter()
        out["server_exit"] = served.stop()
        out["stop_seconds"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="30k events, 6 s phases, a 20 s soak")
    ap.add_argument("--events", type=int, default=None, help="events loaded (default 100,000; quick 30,000)")
    ap.add_argument("--factor", type=int, default=3, help="clients in the soak, x the query capacity (default 3)")
    ap.add_argument("--seconds", type=float, default=None, help="unloaded and soak-with-writes phases (20; quick 6)")
    ap.add_argument("--soak", type=float, default=None, help="seconds of the soak (default 90; quick 20)")
    ap.add_argument("--writers", type=int, default=2, help="writer processes in the last phase (default 2; 0: none)")
    ap.add_argument("--writer-mb", type=float, default=10.0, help="MB/s each writer offers (default 10)")
    ap.add_argument("--serve", default="", help="more rtindex serve arguments, one string")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None, help="parent of the temporary working directory (default /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    args = ap.parse_args(argv)
    args.events = args.events or (30_000 if args.quick else 100_000)
    args.seconds = args.seconds or (6.0 if args.quick else 20.0)
    args.soak = args.soak or (20.0 if args.quick else 90.0)
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="rtindex-overload-", dir=args.dir)
    t_start = time.perf_counter()
    try:
        res = run(args, work)
    finally:
        cleanup_dir(work, args.keep)
    ph = res.get("phases", {})
    un, soak, sw = (ph.get(k, {}) for k in ("unloaded", "soak", "soak_writes"))
    rss0, rss1 = res.get("rss_mib_after_warmup", {}), res.get("rss_mib_end", {})
    growth = {k: rss1[k] / rss0[k] for k in rss0 if k in rss1 and rss0[k]}
    w = res.get("writers", {})
    out: dict[str, Any] = {
        "unloaded_qps": un.get("qps"), "unloaded_p50_ms": un.get("p50_ms"), "unloaded_p95_ms": un.get("p95_ms"),
        "soak_qps": soak.get("qps"), "soak_p50_ms": soak.get("p50_ms"), "soak_p95_ms": soak.get("p95_ms"),
        "soak_p99_ms": soak.get("p99_ms"),
        "admitted_p95_ratio": soak["p95_ms"] / un["p95_ms"] if soak.get("p95_ms") and un.get("p95_ms") else None,
        "soak_429_per_s": soak.get("rejected_429_per_s"),
        "soak_429_share": (soak["rejected_429"] / (soak["rejected_429"] + soak["qps"] * soak["seconds"])
                           if soak.get("seconds") else None),
        "soak_429_p50_ms": soak.get("rejected_p50_ms"), "soak_429_p95_ms": soak.get("rejected_p95_ms"),
        "soak_429_p99_ms": soak.get("rejected_p99_ms"),
        "soak_admitted_queued_p95_ms": soak.get("queued_p95_ms"), "soak_admitted_in_server_p95_ms": soak.get(
            "server_p95_ms"),
        "soak_writes_qps": sw.get("qps"), "soak_writes_p95_ms": sw.get("p95_ms"),
        "soak_writes_429_p95_ms": sw.get("rejected_p95_ms"),
        "writer_mb_per_s": w.get("mb_per_s"), "writer_target_mb_per_s": w.get("target_mb_per_s"),
        "writes_acked": w.get("docs_acked"), "writes_found": w.get("docs_found"),
        "lost_acked_writes": w.get("lost_acked_writes"), "writer_errors": w.get("errors"),
        "writer_first_error": w.get("first_error"), "write_p99_ms": w.get("write_p99_ms"),
        "rss_mib_after_warmup": rss0, "rss_mib_end": rss1, "rss_growth": growth,
        "healthz_after": res.get("healthz_after"), "idle_cpu_pct_after": res.get("idle_cpu_pct_after"),
        "other_errors": {k: x.get("other_errors") for k, x in ph.items() if x.get("other_errors")},
        "cpu_pct": {k: x.get("cpu_pct") for k, x in ph.items()},
        "soak_offered_per_s": soak.get("offered_per_s"), "soak_generator_late_p95_ms": soak.get(
            "generator_late_p95_ms"), "soak_waited_for_connection": soak.get("waited_for_connection"),
        "soak_connections": soak.get("connections"),
        "events": args.events, "factor": args.factor, "clients_1x": res.get("clients_1x"),
        "query_workers": res.get("query_workers"),
        "max_concurrent_queries": res.get("max_concurrent_queries"), "serve_args": res.get("serve_args"),
        "seconds": args.seconds, "soak_seconds": args.soak, "stop_seconds": res.get("stop_seconds"),
        "server_problems": res.get("server_problems"), "server_exit": res.get("server_exit"),
        "failures": res["errors"], "total_seconds": time.perf_counter() - t_start,
    }
    check(f"{args.factor}x soak: 429 answered in < {TARGET_429_P95_MS:g} ms (p95)", out["soak_429_p95_ms"],
          lambda v: v < TARGET_429_P95_MS, "{:.2f} ms")
    check(f"{args.factor}x soak: admitted p95 within {TARGET_RATIO:g}x of unloaded", out["admitted_p95_ratio"],
          lambda v: v <= TARGET_RATIO,
          "{:.2f}x" + f" ({out['soak_p95_ms'] or 0:.2f} vs {out['unloaded_p95_ms'] or 0:.2f} ms)")
    if args.writers:
        check("no acknowledged write lost", out["lost_acked_writes"], lambda v: v == 0, "{} lost")
    check("/healthz 200 after", (res.get("healthz_after") or {}).get("status"), lambda v: v == 200)
    check(f"query processes' RSS at the end within {TARGET_RSS_GROWTH:g}x of after warm-up",
          max((v for k, v in growth.items() if k.startswith("query")), default=None),
          lambda v: v <= TARGET_RSS_GROWTH, "{:.2f}x")
    for msg in res["errors"]:
        log(f"!! {msg}")
    print(json.dumps(rnd(out)))
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
