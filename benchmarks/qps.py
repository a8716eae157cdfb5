#!/usr/bin/env python
"""Query throughput of ``rtindex serve`` with closed-loop clients, while it ingests.

    python benchmarks/qps.py [--quick] [--events N] [--clients C] [--seconds S] [--writer-mb R]
                             [--query-workers W] [--max-concurrent M] [--max-queued Q]
                             [--client auto|http.client|httpx] [--pg auto|off] [--dir DIR] [--keep]

Data: RockBench events (``rtindex.datagen``; 1,000,000, ``--quick`` 100,000) loaded into
collection ``ev`` (4 shards) *embedded* (``rtindex.open(path)``, ingest, ``flush()``, close)
before the server starts; then ``rtindex serve --data`` on that directory
(``--query-workers`` 2: one per core, as one query process is GIL-bound at about one core;
``--max-concurrent-queries`` 4 and ``--max-queued-queries`` 2 per query process unless given:
room for the clients of phases 1-4, and a queue short enough that 3x the clients are
refused, which the server's default of 64 would absorb).

Clients: ``--clients`` (6) processes (``multiprocessing``, spawn), each with one keep-alive
connection, closed loop (the next request as soon as the reply is read; a 429 is retried at
once: the worst case for the server). Which client: before the phases this process sends
400 ``POST /v1/noop`` with ``httpx.Client`` and with ``http.client`` and measures the CPU each
costs per request (``client_cpu_us``); the cheaper one is used (the clients share the 2 cores
with the server). Parameters are drawn at random per request: processBy uniformly from the
distinct values in the loaded data, emails from those that occur in it
(``datagen.sample_emails``).

All phases run while a background writer process (benchmarks/_service.py ``paced_writer``)
POSTs new RockBench events to ``/v1/collections/ev/docs`` at ``--writer-mb`` (10) MB/s, one
request every 10 ms. Phases, ``--seconds`` each (8; full 20; the first 0.5 s not measured):

1. ``noop``: ``POST /v1/noop`` (same auth + admission path, no query): the ceiling;
2. ``processby``: ``SELECT * FROM ev WHERE processBy = :p`` (``POST /v1/query``);
3. ``email``: ``SELECT * FROM ev WHERE ARRAY_CONTAINS(emails, :e)``;
4. ``mix``: both, 50/50 per request (the reference for 5);
5. ``overload``: the same mix with ``--overload-factor`` (3) x the clients: time to answer
   429 (p50/p95) and the p95 of the admitted queries vs phase 4's.

Figures (LAST stdout line, one JSON object): qps (phases 2+3 together: queries answered 200
per second), p50_ms, p95_ms, p99_ms (both kinds' latencies pooled), ceiling_rps,
ratio_to_ceiling, rejected_429, the same per kind (``processby_qps``...), the overload
figures (``overload_429_p50_ms``, ``overload_429_p95_ms``, ``overload_admitted_p95_ms``,
``overload_p95_ratio``...), the writer's achieved rate, CPU % per process (server processes,
writer, clients summed) per phase, and a PostgreSQL comparison or the reason there is none.

Targets (PASS/FAIL on stderr): qps >= 60% of the ceiling with p95 <= 10 ms while ingesting;
under 3x overload, 429 answered in < 5 ms (p95) and admitted p95 <= 2x the p95 of phase 4;
and the writer reaching 95% of its rate (else "while ingesting at 10 MB/s" did not hold).

PostgreSQL (``--pg auto``): if ``initdb``/``pg_ctl``/``psql``/``pgbench`` are on PATH, a
private cluster is made in the work directory (run as the ``postgres`` user when this runs
as root), ``ev(id text primary key, doc jsonb)`` loaded with the same events (``COPY``),
with an expression index on ``doc->>'processBy'`` and a GIN index on ``doc->'emails'``, and
``pgbench`` (C clients, as many as ours, prepared statements, closed loop) runs the two
queries (``doc->>'processBy' = $1``, ``doc->'emails' ? $1``) on the same parameters, with
no concurrent writes: a reference point for a mature server, not a like-for-like race
(pgbench's C clients cost far less CPU than Python ones). Otherwise it says so and skips it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import random
import shutil
import subprocess
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
    CLIENTS, CpuMeter, cleanup_dir, client_cpu_per_request, log, paced_writer, server_pids, server_problems,
    start_server)
from benchmarks.figures import check, rnd, summary  # noqa: E402

COLL = "ev"
SQL = {"processby": f"SELECT * FROM {COLL} WHERE processBy = :p",
       "email": f"SELECT * FROM {COLL} WHERE ARRAY_CONTAINS(emails, :e)"}
PARAM_NAME = {"processby": "p", "email": "e"}
N_PARAMS = 20_000
MEASURE_AFTER = 0.5  # seconds of each phase not measured
TARGET_RATIO = 0.60
TARGET_P95_MS = 10.0
TARGET_429_MS = 5.0
TARGET_OVERLOAD_RATIO = 2.0


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def load(path: str, n: int, shards: int, seed: int, pg_tsv: str | None) -> tuple[dict, float]:
    """Generate and ingest ``n`` events embedded; the query parameters. ``pg_tsv``: also
    write each event as a line of PostgreSQL's COPY text format (id, JSON) there."""
    import gc

    import orjson

    import rtindex
    from benchmarks.ingest import Progress
    from rtindex import datagen

    t0 = time.perf_counter()
    distinct: set[str] = set()
    sample: list[dict] = []
    db = rtindex.open(path)
    tsv = open(pg_tsv, "wb") if pg_tsv else None
    try:
        coll = db.create_collection(COLL, shards=shards)
        p = Progress("load", n)
        chunk = 20_000
        for start in range(0, n, chunk):
            gc.disable()  # building many containers; no gc.freeze() (nanobind then reports leaks at exit)
            try:
                docs = list(datagen.rockbench_events(min(chunk, n - start), seed=seed, start_id=start))
            finally:
                gc.enable()
            for d in docs:
                if "processBy" in d:
                    distinct.add(d["processBy"])
                if tsv is not None:
                    tsv.write(d["_id"].encode() + b"\t" + orjson.dumps(d).replace(b"\\", b"\\\\") + b"\n")
            if len(sample) < 100_000:
                sample.extend({"emails": d.get("emails")} for d in docs[: 100_000 - len(sample)])
            coll.ingest(docs)
            p.update(start + len(docs))
        coll.flush()
        p.finish()
    finally:
        db.close()
        if tsv is not None:
            tsv.close()
    rng = random.Random(seed)
    values = sorted(distinct)
    emails = datagen.sample_emails(sample, k=N_PARAMS, seed=seed)
    rng.shuffle(emails)
    params = {"processby": [rng.choice(values) for _ in range(N_PARAMS)], "email": emails}
    return params, time.perf_counter() - t0


def _load_main(args: tuple, results: Any) -> None:
    try:
        results.put(load(*args))
    except BaseException as e:  # noqa: BLE001 - reported to the orchestrator
        results.put(RuntimeError(f"loading: {type(e).__name__}: {e}\n{traceback.format_exc()}"))


def load_in_child(*args: Any) -> tuple[dict, float]:
    """:func:`load` in a child process: this one never holds the data or the database."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    p = ctx.Process(target=_load_main, name="loader", args=(args, results))
    p.start()
    while True:
        try:
            res = results.get(timeout=1.0)
            break
        except queue.Empty:
            if not p.is_alive():
                raise RuntimeError(f"the loading process exited with code {p.exitcode}") from None
    p.join(60)
    if isinstance(res, BaseException):
        raise res
    return res


# ---------------------------------------------------------------------------
# Client processes
# ---------------------------------------------------------------------------


def client_main(idx: int, url: str, key: str, client_kind: str, params: dict, cmds: Any, results: Any) -> None:
    """Closed loop on commands (phase, kind, t_start, t_measure, t_end) until None."""
    try:
        import orjson

        client = CLIENTS[client_kind](url, key)
        rng = random.Random(1000 + idx)
        results.put((idx, "ready", {}))
        while True:
            cmd = cmds.get()
            if cmd is None:
                break
            phase, kind, t_start, t_measure, t_end = cmd
            ok: dict[str, list[float]] = {"noop": [], "processby": [], "email": []}
            rej: dict[str, list[float]] = {"noop": [], "processby": [], "email": []}
            other: dict[str, int] = {}
            first_other = None
            bad_reply = 0
            now = time.time()
            if t_start > now:
                time.sleep(t_start - now)
            while True:
                now = time.time()
                if now >= t_end:
                    break
                k = kind if kind != "mix" else ("processby" if rng.random() < 0.5 else "email")
                if k == "noop":
                    path, body = "/v1/noop", b"{}"
                else:
                    vals = params[k]
                    path = "/v1/query"
                    body = orjson.dumps({"sql": SQL[k], "parameters": {PARAM_NAME[k]: vals[rng.randrange(len(vals))]}})
                t0 = time.perf_counter()
                try:
                    status, reply = client.post(path, body)
                except Exception as e:  # noqa: BLE001 - counted
                    status, reply = 0, repr(e).encode()
                ms = (time.perf_counter() - t0) * 1000
                if now < t_measure:
                    continue
                if status == 200:
                    ok[k].append(ms)
                    if not reply.startswith(b'{"rows":'):
                        bad_reply += 1
                elif status == 429:
                    rej[k].append(ms)
                else:
                    other[str(status)] = other.get(str(status), 0) + 1
                    if first_other is None:
                        first_other = f"{status}: {reply[:300]!r}"
            results.put((idx, phase, {"ok": ok, "rej": rej, "other": other, "first_other": first_other,
                                      "bad_reply": bad_reply}))
        client.close()
    except BaseException as e:  # noqa: BLE001 - reported to the orchestrator
        results.put((idx, "error", {"error": f"client {idx}: {type(e).__name__}: {e}",
                                    "traceback": traceback.format_exc()}))


def run_phase(name: str, kind: str, n_clients: int, seconds: float, clients: list, cmd_qs: list, results: Any,
              pids: dict) -> dict:
    t_start = time.time() + 0.3
    t_measure = t_start + MEASURE_AFTER
    t_end = t_start + seconds
    for q in cmd_qs[:n_clients]:
        q.put((name, kind, t_start, t_measure, t_end))
    time.sleep(max(0.0, t_measure - time.time()))
    meter = CpuMeter({**pids, **{f"client{i}": clients[i].pid for i in range(n_clients)}}).start()
    time.sleep(max(0.0, t_end - time.time()))
    cpu = meter.stop()
    got: list[dict] = []
    deadline = time.monotonic() + 120
    while len(got) < n_clients and time.monotonic() < deadline:
        try:
            _idx, phase, res = results.get(timeout=1.0)
        except queue.Empty:
            if not all(c.is_alive() for c in clients[:n_clients]):
                raise RuntimeError(f"{name}: a client process died")
            continue
        if phase == "error":
            raise RuntimeError(res["error"] + "\n" + res.get("traceback", ""))
        if phase == name:
            got.append(res)
    window = t_end - t_measure
    out: dict[str, Any] = {"clients": n_clients, "seconds": window}
    kinds = ("noop",) if kind == "noop" else ("processby", "email")
    all_ok: list[float] = []
    all_rej: list[float] = []
    for k in kinds:
        ok = [v for r in got for v in r["ok"][k]]
        rej = [v for r in got for v in r["rej"][k]]
        all_ok += ok
        all_rej += rej
        s = summary(ok)
        out[k] = {"qps": len(ok) / window, "p50_ms": s["p50"], "p95_ms": s["p95"], "p99_ms": s["p99"],
                  "max_ms": s["max"], "answered": len(ok), "rejected_429": len(rej),
                  "rejected_429_per_s": len(rej) / window}
    s = summary(all_ok)
    r = summary(all_rej)
    out.update({"qps": len(all_ok) / window, "p50_ms": s["p50"], "p95_ms": s["p95"], "p99_ms": s["p99"],
                "max_ms": s["max"], "rejected_429": len(all_rej), "rejected_429_per_s": len(all_rej) / window,
                "rejected_p50_ms": r["p50"], "rejected_p95_ms": r["p95"], "rejected_p99_ms": r["p99"],
                "other_errors": {}, "bad_replies": sum(x["bad_reply"] for x in got)})
    for x in got:
        for st, c in x["other"].items():
            out["other_errors"][st] = out["other_errors"].get(st, 0) + c
        if x["first_other"] and "first_other_error" not in out:
            out["first_other_error"] = x["first_other"]
    machine = cpu.pop("machine", None)
    clients_cpu = sum(v for k, v in cpu.items() if k.startswith("client"))
    out["cpu_pct"] = {**{k: v for k, v in cpu.items() if not k.startswith("client")}, "clients": clients_cpu,
                      "total": sum(cpu.values()), "machine": machine}
    out["cpu_us_per_answer"] = {k: v / 100 * window * 1e6 / len(all_ok) if all_ok and v is not None else None
                                for k, v in out["cpu_pct"].items()}
    log(f"  [{name}] {n_clients} clients: {out['qps']:,.0f}/s answered, p50 {_f(s['p50'])} p95 {_f(s['p95'])} "
        f"p99 {_f(s['p99'])} ms; 429: {len(all_rej):,} (p95 {_f(r['p95'])} ms); other errors {out['other_errors']}; "
        f"CPU % {', '.join(f'{k} {v:.0f}' for k, v in out['cpu_pct'].items())}")
    return out


def _f(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}"


# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------

PG_TOOLS = ("initdb", "pg_ctl", "psql", "pgbench")


def pg_missing() -> list[str]:
    return [t for t in PG_TOOLS if shutil.which(t) is None]


def run_pg(work: str, copy: str, n_rows: int, params: dict, n_clients: int, seconds: float) -> dict:
    """The PostgreSQL reference (see the module doc)."""
    import pwd

    as_user: list[str] = []
    uid = gid = None
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        pw = pwd.getpwnam("postgres")
        uid, gid = pw.pw_uid, pw.pw_gid
        as_user = ["runuser", "-u", "postgres", "--"]
    base = os.path.join(work, "pg")
    pgdata, sock = os.path.join(base, "data"), os.path.join(base, "sock")
    os.makedirs(sock)
    if uid is not None:
        for d in (work, base, sock):
            os.chmod(d, 0o755)
        os.chown(base, uid, gid)
        os.chown(sock, uid, gid)
    env = {**os.environ, "PGHOST": sock, "PGPORT": "5433", "PGDATABASE": "postgres", "PGUSER": "postgres"}

    def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(as_user + cmd, env=env, check=True, capture_output=True, text=True, **kw)

    log("PostgreSQL: initdb + start (private cluster, unix socket only) ...")
    sh(["initdb", "-D", pgdata, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
    conf = ["-c", "listen_addresses=", "-c", f"unix_socket_directories={sock}", "-c", "port=5433",
            "-c", "shared_buffers=512MB", "-c", "fsync=off", "-c", "synchronous_commit=off",
            "-c", "max_connections=100", "-c", "jit=off"]
    sh(["pg_ctl", "-D", pgdata, "-w", "-l", os.path.join(base, "log"), "-o", " ".join(conf), "start"])
    out: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        os.chmod(copy, 0o644)
        for name, vals in params.items():
            with open(os.path.join(base, f"{name}.tsv"), "w") as f:
                for i, v in enumerate(vals):
                    f.write(f"{i + 1}\t{v}\n")
        if uid is not None:
            for fn in os.listdir(base):
                if fn.endswith(".tsv"):
                    os.chown(os.path.join(base, fn), uid, gid)
        sh(["psql", "-v", "ON_ERROR_STOP=1", "-q", "-c", f"""
            CREATE TABLE ev (id text PRIMARY KEY, doc jsonb NOT NULL);
            COPY ev FROM '{copy}';
            CREATE INDEX ev_pb ON ev ((doc->>'processBy'));
            CREATE INDEX ev_em ON ev USING gin ((doc->'emails'));
            CREATE TABLE p_processby (i int PRIMARY KEY, v text);
            CREATE TABLE p_email (i int PRIMARY KEY, v text);
            COPY p_processby FROM '{os.path.join(base, "processby.tsv")}';
            COPY p_email FROM '{os.path.join(base, "email.tsv")}';""", "-c", "VACUUM ANALYZE"])
        out["load_seconds"] = time.perf_counter() - t0
        log(f"  loaded {n_rows:,} rows + indexes in {out['load_seconds']:.1f}s")
        queries = {"processby": "SELECT doc FROM ev WHERE doc->>'processBy' = :v;",
                   "email": "SELECT doc FROM ev WHERE doc->'emails' ? :v;"}
        for kind, q in queries.items():
            n = len(params[kind])
            script = os.path.join(base, f"{kind}.sql")
            # the parameter is fetched in the same transaction; its cost is measured separately below
            with open(script, "w") as f:
                f.write(f"\\set i random(1, {n})\nSELECT v AS v FROM p_{kind} WHERE i = :i \\gset\n{q}\n")
            with open(os.path.join(base, f"{kind}_lookup.sql"), "w") as f:
                f.write(f"\\set i random(1, {n})\nSELECT v AS v FROM p_{kind} WHERE i = :i \\gset\n")
            plan = sh(["psql", "-At", "-c", "EXPLAIN " + q.replace(":v", f"'{params[kind][0]}'")]).stdout
            res = {}
            for label, f in (("query", script), ("lookup", os.path.join(base, f"{kind}_lookup.sql"))):
                logp = os.path.join(base, f"log_{kind}_{label}")
                r = sh(["pgbench", "-n", "-M", "prepared", "-c", str(n_clients), "-j", str(n_clients),
                        "-T", str(max(1, int(seconds))), "-f", f, "-l", "--log-prefix", logp, "postgres"],
                       cwd=base)
                lat: list[float] = []
                for fn in os.listdir(base):
                    if fn.startswith(os.path.basename(logp) + "."):
                        with open(os.path.join(base, fn)) as lf:
                            for line in lf:
                                parts = line.split()
                                if len(parts) >= 3 and parts[2].isdigit():
                                    lat.append(int(parts[2]) / 1000.0)
                tps = None
                for line in r.stdout.splitlines():
                    if line.startswith("tps ="):
                        tps = float(line.split()[2])
                s = summary(lat)
                res[label] = {"tps": tps, "p50_ms": s["p50"], "p95_ms": s["p95"], "p99_ms": s["p99"], "n": s["n"]}
            out[kind] = {"qps": res["query"]["tps"], "p50_ms": res["query"]["p50_ms"], "p95_ms": res["query"]["p95_ms"],
                         "p99_ms": res["query"]["p99_ms"], "param_lookup_p50_ms": res["lookup"]["p50_ms"],
                         "plan": " | ".join(ln.strip() for ln in plan.splitlines()[:3])}
            log(f"  [pg {kind}] {n_clients} pgbench clients: {out[kind]['qps'] or 0:,.0f} tx/s, "
                f"p50 {_f(out[kind]['p50_ms'])} p95 {_f(out[kind]['p95_ms'])} ms "
                f"(of which the parameter lookup alone: p50 {_f(out[kind]['param_lookup_p50_ms'])} ms); "
                f"plan: {out[kind]['plan'][:100]}")
    finally:
        try:
            sh(["pg_ctl", "-D", pgdata, "-m", "fast", "-w", "stop"])
        except subprocess.CalledProcessError as e:
            log(f"  pg_ctl stop failed: {e.stderr}")
    return out


# ---------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------


def run(args: argparse.Namespace, work: str) -> dict:
    out: dict[str, Any] = {"errors": [], "phases": {}}
    data = os.path.join(work, "data")
    missing = pg_missing() if args.pg == "auto" else list(PG_TOOLS)
    pg_tsv = os.path.join(work, "ev.tsv") if not missing else None
    log(f"loading {args.events:,} events embedded into {data} (in a child process) ...")
    params, out["load_seconds"] = load_in_child(data, args.events, args.shards, args.seed, pg_tsv)
    log(f"  loaded in {out['load_seconds']:.1f}s; {len(set(params['processby'])):,} distinct processBy drawn, "
        f"{len(params['email']):,} emails")
    flags = ["--query-workers", str(args.query_workers), "--max-concurrent-queries", str(args.max_concurrent),
             "--max-queued-queries", str(args.max_queued)]
    log(f"starting rtindex serve {' '.join(flags)} ...")
    served = start_server(data, *flags)
    ctx = mp.get_context("spawn")
    procs: list = []
    cmd_qs: list = []
    stop = ctx.Event()
    wresults = ctx.Queue()
    writer = None
    try:
        url, key = served.url, served.admin_key
        log(f"  {url}; measuring client CPU per request on /v1/noop ...")
        cost = client_cpu_per_request(url, key, "/v1/noop", b"{}")
        out["client_cpu_us"] = cost
        client_kind = min(cost, key=cost.get) if args.client == "auto" else args.client
        out["client"] = client_kind
        log(f"  client CPU per request: {', '.join(f'{k} {v:.0f} us' for k, v in cost.items())}: using {client_kind}")
        n_over = args.clients * args.overload_factor
        results = ctx.Queue()
        for i in range(n_over):
            q = ctx.Queue()
            p = ctx.Process(target=client_main, name=f"client{i}", args=(i, url, key, client_kind, params, q, results))
            p.start()
            procs.append(p)
            cmd_qs.append(q)
        ready = 0
        deadline = time.monotonic() + 120
        while ready < n_over:
            _idx, phase, res = results.get(timeout=max(1.0, deadline - time.monotonic()))
            if phase == "error":
                raise RuntimeError(res["error"])
            ready += phase == "ready"
        w_ready, go = ctx.Event(), ctx.Event()
        shared = ctx.Array("d", [0.0, 0.0, 0.0])
        wopts = {"path": f"/v1/collections/{COLL}/docs", "rockset": False, "gen_id": "qps-writer",
                 "id_prefix": "live", "pool": 10_000, "seed": args.seed + 1, "tick_ms": 10.0,
                 "mb_per_s": args.writer_mb, "max_catchup": 10, "client": "http.client"}
        if args.writer_mb > 0:
            writer = ctx.Process(target=paced_writer, name="writer",
                                 args=(url, key, wopts, w_ready, go, stop, shared, wresults))
            writer.start()
            if not w_ready.wait(120):
                raise RuntimeError("the writer did not start")
            go.set()
            log(f"  background writer: {args.writer_mb} MB/s into {COLL}; 2 s warm-up")
            time.sleep(2.0)
        pids = server_pids(served)
        if writer is not None:
            pids["writer"] = writer.pid
        phases = [("noop", "noop", args.clients), ("processby", "processby", args.clients),
                  ("email", "email", args.clients), ("mix", "mix", args.clients), ("overload", "mix", n_over)]
        for name, kind, n in phases:
            log(f"phase {name}: {n} clients, {args.seconds:.0f}s ...")
            out["phases"][name] = run_phase(name, kind, n, args.seconds, procs, cmd_qs, results, pids)
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        out["errors"].append(f"{type(e).__name__}: {e}")
        log(traceback.format_exc())
    finally:
        stop.set()
        for q in cmd_qs:
            q.put(None)
        if writer is not None:
            try:
                _who, res = wresults.get(timeout=60)
                if "error" in res:
                    out["errors"].append(res["error"])
                else:
                    res.update(summary(res.pop("write_ms", []), "write_ms_"))
                    out["writer"] = res
            except queue.Empty:
                out["errors"].append("the writer did not report")
            writer.join(30)
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.terminate()
        out["server_problems"] = server_problems(served)
        log("stopping the server ...")
        out["server_exit"] = served.stop()
    if missing:
        why = ("--pg off" if args.pg == "off" else
               f"PostgreSQL is not available ({', '.join(missing)} not on PATH)")
        log(f"PostgreSQL comparison skipped: {why}")
        out["pg"] = {"skipped": why}
    elif not out["errors"]:
        try:
            out["pg"] = run_pg(work, pg_tsv, args.events, params, args.clients, args.seconds)
        except Exception as e:  # noqa: BLE001 - the comparison is optional
            msg = getattr(e, "stderr", "") or ""
            log(f"PostgreSQL comparison failed: {e} {msg}")
            out["pg"] = {"failed": f"{type(e).__name__}: {e} {msg}"[:500]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k events, 8 s per phase")
    ap.add_argument("--events", type=int, default=None, help="events loaded (default 1,000,000; quick 100,000)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per phase (default 20; quick 8)")
    ap.add_argument("--clients", type=int, default=6, help="closed-loop client processes (default 6)")
    ap.add_argument("--overload-factor", type=int, default=3, help="clients in the overload phase, x --clients")
    ap.add_argument("--writer-mb", type=float, default=10.0, help="background writer, MB/s (default 10; 0: none)")
    ap.add_argument("--query-workers", type=int, default=2, help="rtindex serve --query-workers (default 2)")
    ap.add_argument("--max-concurrent", type=int, default=4, help="--max-concurrent-queries (default 4)")
    ap.add_argument("--max-queued", type=int, default=2, help="--max-queued-queries (default 2)")
    ap.add_argument("--client", choices=("auto", *CLIENTS), default="auto",
                    help="HTTP client of the client processes (default: the one measured cheaper)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--pg", choices=("auto", "off"), default="auto", help="PostgreSQL comparison if available")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None, help="parent of the temporary working directory (default /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    args = ap.parse_args(argv)
    args.events = args.events or (100_000 if args.quick else 1_000_000)
    args.seconds = args.seconds or (8.0 if args.quick else 20.0)
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="rtindex-qps-", dir=args.dir)
    t_start = time.perf_counter()
    log(f"qps benchmark: {args.events:,} events, {args.clients} clients ({args.clients * args.overload_factor} "
        f"in overload), {args.seconds:.0f}s per phase, writer {args.writer_mb} MB/s, dir={work}")
    try:
        res = run(args, work)
    finally:
        cleanup_dir(work, args.keep)

    ph = res.get("phases", {})
    noop, pb, em, mix, over = (ph.get(k, {}) for k in ("noop", "processby", "email", "mix", "overload"))
    # qps and latency of the two query kinds together (phases 2 and 3)
    lat_q = [x for x in (pb, em) if x]
    qps = sum(x["qps"] for x in lat_q) / len(lat_q) if lat_q else None
    ceiling = noop.get("qps")

    def worst(key: str) -> Any:
        vals = [x[key] for x in lat_q if x.get(key) is not None]
        return max(vals) if vals else None

    out: dict[str, Any] = {
        "qps": qps,
        "p50_ms": worst("p50_ms"), "p95_ms": worst("p95_ms"), "p99_ms": worst("p99_ms"),
        "ceiling_rps": ceiling,
        "ratio_to_ceiling": qps / ceiling if qps and ceiling else None,
        "rejected_429": sum(x.get("rejected_429", 0) for x in lat_q) if lat_q else None,
    }
    for k, x in (("processby", pb), ("email", em)):
        out.update({f"{k}_qps": x.get("qps"), f"{k}_p50_ms": x.get("p50_ms"), f"{k}_p95_ms": x.get("p95_ms"),
                    f"{k}_p99_ms": x.get("p99_ms"), f"{k}_rejected_429": x.get("rejected_429"),
                    f"{k}_ratio_to_ceiling": x["qps"] / ceiling if x.get("qps") and ceiling else None})
    out.update({
        "ceiling_p50_ms": noop.get("p50_ms"), "ceiling_p95_ms": noop.get("p95_ms"),
        "ceiling_rejected_429": noop.get("rejected_429"),
        "mix_qps": mix.get("qps"), "mix_p95_ms": mix.get("p95_ms"), "mix_rejected_429": mix.get("rejected_429"),
        "overload_clients": over.get("clients"),
        "overload_qps": over.get("qps"),
        "overload_429_per_s": over.get("rejected_429_per_s"),
        "overload_429_p50_ms": over.get("rejected_p50_ms"), "overload_429_p95_ms": over.get("rejected_p95_ms"),
        "overload_429_p99_ms": over.get("rejected_p99_ms"),
        "overload_admitted_p50_ms": over.get("p50_ms"), "overload_admitted_p95_ms": over.get("p95_ms"),
        "overload_p95_ratio": over["p95_ms"] / mix["p95_ms"] if over.get("p95_ms") and mix.get("p95_ms") else None,
    })
    for k in ("processby", "email"):
        o = over.get(k, {})
        out[f"overload_{k}_qps"] = o.get("qps")
        out[f"overload_{k}_p95_ms"] = o.get("p95_ms")
        out[f"overload_{k}_rejected_429"] = o.get("rejected_429")
    w = res.get("writer", {})
    out.update({
        "writer_target_mb_per_s": args.writer_mb, "writer_mb_per_s": w.get("mb_per_s"),
        "writer_docs_per_s": w.get("docs_per_s"), "writer_errors": w.get("errors"),
        "writer_write_p50_ms": w.get("write_ms_p50"), "writer_write_p99_ms": w.get("write_ms_p99"),
        "writer_first_error": w.get("first_error"),
        "client": res.get("client"), "client_cpu_us": res.get("client_cpu_us"),
        "cpu_pct": {k: x.get("cpu_pct") for k, x in ph.items()},
        "other_errors": {k: x.get("other_errors") for k, x in ph.items() if x.get("other_errors")},
        "first_other_error": next((x["first_other_error"] for x in ph.values() if x.get("first_other_error")), None),
        "bad_replies": sum(x.get("bad_replies", 0) for x in ph.values()),
        "pg": res.get("pg"),
        "events": args.events, "clients": args.clients, "seconds_per_phase": args.seconds,
        "query_workers": args.query_workers, "max_concurrent_queries": args.max_concurrent,
        "max_queued_queries": args.max_queued, "load_seconds": res.get("load_seconds"),
        "server_problems": res.get("server_problems"), "server_exit": res.get("server_exit"),
        "failures": res["errors"], "total_seconds": time.perf_counter() - t_start,
    })
    pg = res.get("pg") or {}
    for k in ("processby", "email"):
        if isinstance(pg.get(k), dict) and pg[k].get("qps") and out.get(f"{k}_qps"):
            out[f"{k}_qps_vs_pg"] = out[f"{k}_qps"] / pg[k]["qps"]
    check("qps >= 60% of the no-op ceiling while ingesting", out["ratio_to_ceiling"],
          lambda v: v >= TARGET_RATIO, "{:.0%}" + f" ({_f(qps)} of {_f(ceiling)}/s)")
    check("query p95 <= 10 ms while ingesting (worst kind)", out["p95_ms"], lambda v: v <= TARGET_P95_MS, "{:.2f} ms")
    check("3x overload: 429 answered in < 5 ms (p95)", out["overload_429_p95_ms"], lambda v: v < TARGET_429_MS,
          "{:.2f} ms" + f" ({out['overload_429_per_s'] or 0:,.0f} 429/s)")
    check("3x overload: admitted p95 <= 2x the p95 at 1x", out["overload_p95_ratio"],
          lambda v: v <= TARGET_OVERLOAD_RATIO,
          "{:.2f}x" + f" ({_f(out['overload_admitted_p95_ms'])} vs {_f(out['mix_p95_ms'])} ms)")
    check("background writer at >= 95% of its target while queried", out["writer_mb_per_s"],
          lambda v: v >= 0.95 * args.writer_mb, "{:.2f} MB/s" + f" of {args.writer_mb}")
    if isinstance(pg, dict) and "skipped" in pg:
        log(f"PostgreSQL: not compared: {pg['skipped']}")
    for msg in res["errors"]:
        log(f"!! {msg}")
    print(json.dumps(rnd(out)))
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
