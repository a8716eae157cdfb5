#!/usr/bin/env python
"""Live read replicas: how soon a reader process sees what the writer ingests, and what
following costs it.

    python benchmarks/replica.py [--quick] [--seconds S] [--rate-mb R] [--probe get|sql] [--dir DIR]

Three processes (``multiprocessing``, "spawn" start method: rocksdict
and background threads do not survive a fork): this one orchestrates; a *writer* opens the
database with default options, creates collection ``events`` (``--shards``, default 4) and
ingests RockBench events (``rtindex.datagen``) at ``--rate-mb`` MB/s of JSON (default 10,
~8k events/s of ~1.27 KB), one ``ingest()`` call every ``--interval-ms`` (10) ms with the
documents due by then (a slow call is caught up by the next ones, at most ``--max-catchup``
ticks' worth at once). Its documents are a pool of ``--pool`` generated events (generated
before the clock starts), cycled, each a shallow copy with a new ``_id`` ``ev-{seq}``.
Before each ``ingest()`` the writer puts the batch number and the seq of its last document
in shared memory, and after the call returns, ``time.time()`` for that batch (so a reader
knows the id to look for before the call returns and is never told late by a writer busy
with its own threads). A *reader* opens the same directory with
``rtindex.open(path, role="reader")`` once the writer has created the collection (and retries
``db["events"]`` while it raises NotFoundError). Two phases, each on a fresh database and a
fresh pair of processes, ``--seconds`` of ingest each (the first ``--warmup`` seconds are
not measured):

(a) follow: the reader only follows (it opens the database and waits on an event).
    ``reader_cpu_pct`` = its process CPU time (user + system, all threads, psutil, read by
    this process) over the measured window / wall time x 100: the cost of keeping up. When
    the writer stops, the reader is checked: its last document visible (``follow_catchup_ms``
    after the writer's last ``ingest()`` returned) and ``len()`` equal to what was written
    (``follow_converged``).
(b) poll: the reader takes the newest batch in flight and probes its last ``_id`` until it
    is visible: ``--probe get`` (default) ``coll.get(_id)``, or ``--probe sql``:
    ``SELECT _id FROM events WHERE _id = :id``; latency = time when the successful probe
    returned - time when that batch's ``ingest()`` returned, 0 if it was visible before
    (counted in ``latency_visible_before_return``). Between probes it sleeps ``--poll-us``
    (100 us) so that its own follow thread gets the GIL (0: a pure busy loop, which can hold
    the GIL for the interpreter's 5 ms switch interval). Batches written while one is being
    probed are skipped, so there is about one sample per probe round-trip, up to one per
    batch.

Reported (the last line printed is one JSON object): ``latency_p50_ms``, ``latency_p99_ms``
(also p90, p99.9, max, sample count, timeouts), ``docs_per_s`` (the writer's achieved rate
over phase (b), with ``mb_per_s`` and the target), ``reader_cpu_pct`` (phase (a)), plus
the writer's CPU, the poll phase's reader CPU and the reader's catch-up. Values are null
for a phase that could not run; the error is in ``errors`` and the exit status is 1.

Targets (2 cores, at 10 MB/s): p50 <= 1 ms, p99 <= 5 ms, reader_cpu_pct <= 5;
a PASS/FAIL line for each (and for the writer reaching 95% of its target rate) on stderr.

Full run: 60 s of ingest per phase (about 2.5 minutes in all); --quick: 20 s per phase
(about 1 minute).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.figures import percentile, rnd  # noqa: E402
from benchmarks.ingest import log  # noqa: E402

MB = 1e6
TARGET_P50_MS = 1.0
TARGET_P99_MS = 5.0
TARGET_READER_CPU_PCT = 5.0
COLLECTION = "events"

# Shared memory between the writer and the reader (one ``multiprocessing.Array("d")``, under
# its lock): [batch in flight, seq of its last document, last acknowledged batch, documents
# acknowledged], then a ring of (seq of the last document, time.time() when ingest()
# returned) per batch, so that a reader can take a batch's id *before* ingest() returns
# (it is then never told late by a writer busy elsewhere) and its return time afterwards.
RING = 4096
_PENDING_BATCH, _PENDING_SEQ, _ACKED_BATCH, _ACKED_DOCS, _HEAD = 0, 1, 2, 3, 4


def new_shared(ctx: Any) -> Any:
    return ctx.Array("d", [-1.0, -1.0, -1.0, 0.0] + [-1.0, 0.0] * RING)


def _ring(batch: int) -> int:
    return _HEAD + 2 * (batch % RING)


def read_ack(latest: Any, batch: int) -> tuple[int, float] | None:
    """(seq, return time) of ``batch`` once it is acknowledged (None before, or if the
    ring has moved past it)."""
    with latest.get_lock():
        if latest[_ACKED_BATCH] < batch:
            return None
        i = _ring(batch)
        seq, t = latest[i], latest[i + 1]
        if latest[_ACKED_BATCH] - batch >= RING:
            return None
    return int(seq), t


def last_ack(latest: Any) -> tuple[int, int, float, int]:
    """(batch, seq, return time, documents) of the newest acknowledged batch."""
    with latest.get_lock():
        b = int(latest[_ACKED_BATCH])
        if b < 0:
            return -1, -1, 0.0, 0
        i = _ring(b)
        return b, int(latest[i]), latest[i + 1], int(latest[_ACKED_DOCS])


class Aborted(Exception):
    """The orchestrator gave up on the phase before it started (the other process failed)."""


def _wait_for_start(go: Any, done: Any, timeout: float) -> None:
    """Wait for the start signal; Aborted if ``done`` is set first."""
    deadline = time.monotonic() + timeout
    while not go.wait(0.1):
        if done.is_set():
            raise Aborted("phase abandoned before it started")
        if time.monotonic() > deadline:
            raise TimeoutError("no start signal")


def _error(who: str, e: BaseException) -> dict:
    if isinstance(e, Aborted):
        return {"aborted": True}
    return {"error": f"{who}: {type(e).__name__}: {e}", "traceback": traceback.format_exc()}


# ---------------------------------------------------------------------------
# Writer process
# ---------------------------------------------------------------------------


def writer_main(path: str, opts: dict, ready: Any, go: Any, done: Any, latest: Any, results: Any) -> None:
    """Create the collection, then ingest at the target rate for opts["seconds"]."""
    try:
        import orjson

        import rtindex
        from benchmarks.ingest import generating_input
        from rtindex import datagen

        with generating_input():
            pool = list(datagen.rockbench_events(opts["pool"], seed=opts["seed"], start_id=0))
        avg_bytes = sum(len(orjson.dumps(d)) for d in pool) / len(pool)
        rate = opts["rate_mb"] * MB / avg_bytes  # documents per second
        interval = opts["interval_ms"] / 1000
        cap = max(1, int(rate * interval * opts["max_catchup"]))

        db = rtindex.open(path)
        try:
            db.create_collection(COLLECTION, shards=opts["shards"])
            coll = db[COLLECTION]
            ready.set()
            _wait_for_start(go, done, opts["start_timeout"])
            P = len(pool)
            sent = 0
            batches = 0
            max_batch = 0
            max_behind = 0.0
            ingest_ms: list[float] = []
            t0 = time.perf_counter()
            t_end = t0 + opts["seconds"]
            t_last = t0
            while True:
                now = time.perf_counter()
                if now >= t_end:
                    break
                k = int((now - t0) / interval)  # the tick we are in
                max_behind = max(max_behind, now - (t0 + k * interval))
                n = min(cap, int(rate * (k + 1) * interval) - sent)
                if n > 0:
                    docs = []
                    for j in range(sent, sent + n):
                        d = dict(pool[j % P])
                        d["_id"] = f"ev-{j}"
                        docs.append(d)
                    seq = sent + n - 1  # the batch's last document
                    with latest.get_lock():
                        latest[_PENDING_BATCH] = batches
                        latest[_PENDING_SEQ] = seq
                    t1 = time.perf_counter()
                    coll.ingest(docs, batch_size=n)
                    t_ret = time.time()
                    t_last = time.perf_counter()
                    with latest.get_lock():
                        i = _ring(batches)
                        latest[i] = seq
                        latest[i + 1] = t_ret
                        latest[_ACKED_BATCH] = batches
                        latest[_ACKED_DOCS] = sent + n
                    ingest_ms.append((t_last - t1) * 1000)
                    sent += n
                    batches += 1
                    max_batch = max(max_batch, n)
                pause = t0 + (k + 1) * interval - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
            elapsed = t_last - t0
            done.set()
            ingest_ms.sort()
            results.put(("writer", {
                "sent": sent,
                "seconds": elapsed,
                "docs_per_s": sent / elapsed if elapsed > 0 else None,
                "mb_per_s": sent * avg_bytes / MB / elapsed if elapsed > 0 else None,
                "target_docs_per_s": rate,
                "target_mb_per_s": opts["rate_mb"],
                "avg_doc_bytes": avg_bytes,
                "batches": batches,
                "max_batch": max_batch,
                "ingest_ms_p50": percentile(ingest_ms, 50),
                "ingest_ms_p99": percentile(ingest_ms, 99),
                "ingest_ms_max": ingest_ms[-1] if ingest_ms else None,
            }))
        finally:
            done.set()
            db.close()
    except BaseException as e:  # noqa: BLE001 - reported to the orchestrator
        done.set()
        results.put(("writer", _error("writer", e)))


# ---------------------------------------------------------------------------
# Reader process
# ---------------------------------------------------------------------------


def _open_reader(path: str, timeout: float) -> tuple[Any, Any]:
    """Open ``path`` as a reader and wait until the collection is there."""
    import rtindex
    from rtindex.errors import NotFoundError

    deadline = time.monotonic() + timeout
    while True:
        try:
            db = rtindex.open(path, role="reader")
            break
        except TypeError as e:
            if "role" in str(e):
                raise RuntimeError("rtindex.open() does not accept role='reader' (read replicas are not "
                                   "implemented in this version)") from e
            raise
        except NotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    while True:
        try:
            return db, db[COLLECTION]
        except (NotFoundError, KeyError):
            if time.monotonic() > deadline:
                db.close()
                raise
            time.sleep(0.01)


def _lag_fields(stats: Any, prefix: str = "", inside: bool = False) -> dict:
    """Every number in ``db.stats()`` under a ``*lag*`` / ``*behind*`` key (``stats()["lag"]``
    is ``{"rows": .., "ms": ..}``, and so is each shard's), flattened."""
    out: dict[str, Any] = {}
    if isinstance(stats, dict):
        for k, v in stats.items():
            name = f"{prefix}{k}"
            hit = inside or "lag" in str(k) or "behind" in str(k)
            if isinstance(v, (dict, list)):
                out.update(_lag_fields(v, name + ".", hit))
            elif hit and isinstance(v, (int, float)) and not isinstance(v, bool):
                out[name] = v
    elif isinstance(stats, list):
        for i, v in enumerate(stats):
            out.update(_lag_fields(v, f"{prefix}{i}.", inside))
    return out


def _wait_visible(probe: Any, doc_id: str, timeout: float, poll_s: float) -> float | None:
    """time.time() when ``doc_id`` was first seen, or None after ``timeout`` seconds."""
    deadline = time.time() + timeout
    while True:
        if probe(doc_id):
            return time.time()
        if time.time() > deadline:
            return None
        if poll_s:
            time.sleep(poll_s)


def reader_main(path: str, mode: str, opts: dict, ready: Any, go: Any, done: Any, latest: Any,
                window: Any, results: Any) -> None:
    try:
        db, coll = _open_reader(path, opts["open_timeout"])
        try:
            if opts["probe"] == "sql":
                def probe(doc_id: str) -> bool:
                    return len(db.sql(f"SELECT _id FROM {COLLECTION} WHERE _id = :id", {"id": doc_id})) > 0
            else:
                def probe(doc_id: str) -> bool:
                    return coll.get(doc_id) is not None
            poll_s = opts["poll_us"] / 1e6
            ready.set()
            _wait_for_start(go, done, opts["start_timeout"])
            res: dict[str, Any] = {}
            if mode == "follow":
                done.wait(opts["seconds"] + opts["start_timeout"])
            else:
                measure_from = window[0]
                lat: list[float] = []
                timeouts = probes = early = 0
                last = -1
                while not done.is_set():
                    with latest.get_lock():
                        b, seq = int(latest[_PENDING_BATCH]), int(latest[_PENDING_SEQ])
                    if b <= last:
                        if poll_s:
                            time.sleep(poll_s)
                        continue
                    last = b
                    seen = _wait_visible(probe, f"ev-{seq}", opts["visible_timeout"], poll_s)
                    probes += 1
                    if seen is None:
                        timeouts += 1
                        continue
                    ack = read_ack(latest, b)
                    while ack is None and not done.is_set():  # visible before ingest() returned
                        time.sleep(poll_s or 1e-5)
                        ack = read_ack(latest, b)
                    if ack is None or ack[0] != seq or ack[1] < measure_from:
                        continue
                    ms = (seen - ack[1]) * 1000
                    if ms < 0:
                        early += 1
                        ms = 0.0
                    lat.append(ms)
                lat.sort()
                res.update({"samples": len(lat), "timeouts": timeouts, "probed_batches": probes,
                            "visible_before_return": early,
                            "latency_p50_ms": percentile(lat, 50), "latency_p90_ms": percentile(lat, 90),
                            "latency_p99_ms": percentile(lat, 99), "latency_p999_ms": percentile(lat, 99.9),
                            "latency_max_ms": lat[-1] if lat else None,
                            "latency_mean_ms": sum(lat) / len(lat) if lat else None})
            # the writer has stopped: the reader must converge to everything it wrote
            _b, seq, t, sent = last_ack(latest)
            if seq >= 0:
                seen = _wait_visible(probe, f"ev-{seq}", opts["converge_timeout"], 0.001)
                res["catchup_ms"] = (seen - t) * 1000 if seen is not None else None
            res["documents"] = len(coll)
            res["writer_sent"] = sent
            res["converged"] = res["documents"] == sent
            try:
                res["lag"] = _lag_fields(db.stats())
            except Exception as e:  # noqa: BLE001 - informative only
                res["lag"] = {"error": f"{type(e).__name__}: {e}"}
            results.put(("reader", res))
        finally:
            db.close()
    except BaseException as e:  # noqa: BLE001 - reported to the orchestrator
        results.put(("reader", _error("reader", e)))


# ---------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------


def _wait(ev: Any, procs: list, timeout: float) -> bool:
    """Wait for ``ev`` while every process is alive."""
    deadline = time.monotonic() + timeout
    while not ev.wait(0.1):
        if time.monotonic() > deadline or not all(p.is_alive() for p in procs):
            return ev.is_set()
    return True


def _cpu(p: Any) -> float | None:
    import psutil

    try:
        c = psutil.Process(p.pid).cpu_times()
        return c.user + c.system
    except (psutil.Error, ValueError):
        return None


def run_phase(mode: str, path: str, opts: dict) -> dict:
    """One writer + one reader on a fresh database; ``mode`` is "follow" or "poll"."""
    ctx = mp.get_context("spawn")
    ready_w, ready_r, go, done = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
    latest = new_shared(ctx)
    window = ctx.Array("d", [0.0])  # time.time() from which latency samples count
    results = ctx.Queue()
    out: dict[str, Any] = {"errors": []}
    writer = ctx.Process(target=writer_main, name=f"writer-{mode}",
                         args=(path, opts, ready_w, go, done, latest, results))
    reader = ctx.Process(target=reader_main, name=f"reader-{mode}",
                         args=(path, mode, opts, ready_r, go, done, latest, window, results))
    procs = [writer]
    got: dict[str, dict] = {}

    def collect(timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(got) < len(procs) and time.monotonic() < deadline:
            try:
                who, res = results.get(timeout=0.2)
                got[who] = res
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    try:
                        while True:
                            who, res = results.get_nowait()
                            got[who] = res
                    except queue.Empty:
                        break

    try:
        writer.start()
        if not _wait(ready_w, procs, opts["start_timeout"]):
            raise RuntimeError("the writer did not start")
        reader.start()
        procs.append(reader)
        if not _wait(ready_r, procs, opts["open_timeout"] + 30):
            raise RuntimeError("the reader did not open the database")
        window[0] = time.time() + opts["warmup"]
        go.set()
        log(f"  [{mode}] writer pid {writer.pid}, reader pid {reader.pid}: ingesting for {opts['seconds']:.0f}s ...")
        time.sleep(opts["warmup"])
        c0 = {"reader": _cpu(reader), "writer": _cpu(writer)}
        t0 = time.perf_counter()
        if not _wait(done, procs, opts["seconds"] + 60):
            raise RuntimeError("the writer did not finish")
        wall = time.perf_counter() - t0
        c1 = {"reader": _cpu(reader), "writer": _cpu(writer)}
        for who in ("reader", "writer"):
            if c0[who] is not None and c1[who] is not None and wall > 0:
                out[f"{who}_cpu_pct"] = (c1[who] - c0[who]) / wall * 100
        out["window_seconds"] = wall
    except Exception as e:  # noqa: BLE001 - report what the children said
        out["errors"].append(f"{mode}: {e}")
    finally:
        done.set()
        collect(opts["converge_timeout"] + 60)
        for p in procs:
            p.join(60)
            if p.is_alive():
                out["errors"].append(f"{mode}: {p.name} hung; terminated")
                p.terminate()
                p.join(10)
    for who, res in got.items():
        if res.get("aborted"):
            continue
        if "error" in res:
            out["errors"].append(f"{mode}: {res['error']}")
            log(res.get("traceback", ""))
        else:
            out[who] = res
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20 s of ingest per phase (about 1 minute)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds of ingest per phase (default 60)")
    ap.add_argument("--warmup", type=float, default=1.0, help="first seconds of a phase not measured (default 1)")
    ap.add_argument("--rate-mb", type=float, default=10.0, help="writer's target rate in MB/s of JSON (default 10)")
    ap.add_argument("--interval-ms", type=float, default=10.0, help="one ingest() call every ... ms (default 10)")
    ap.add_argument("--max-catchup", type=float, default=10.0,
                    help="largest batch, in ticks' worth of documents, when the writer is behind (default 10)")
    ap.add_argument("--shards", type=int, default=4, help="shards of the collection (default 4)")
    ap.add_argument("--pool", type=int, default=20_000, help="generated events cycled by the writer (default 20,000)")
    ap.add_argument("--probe", choices=("get", "sql"), default="get",
                    help="how the reader looks for a document: coll.get() or a SQL point query (default get)")
    ap.add_argument("--poll-us", type=float, default=100.0,
                    help="sleep between a reader's probes, microseconds (default 100; 0 = busy loop)")
    ap.add_argument("--phases", default="follow,poll", help="comma-separated subset of follow,poll")
    ap.add_argument("--dir", default=None, help="parent of the temporary working directory (default /tmp)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    args = ap.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (20.0 if args.quick else 60.0)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if not phases or set(phases) - {"follow", "poll"}:
        ap.error("--phases: follow and/or poll")
    if seconds <= args.warmup:
        ap.error("--seconds must be longer than --warmup")
    opts = {
        "seconds": seconds, "warmup": args.warmup, "rate_mb": args.rate_mb, "interval_ms": args.interval_ms,
        "max_catchup": args.max_catchup, "shards": args.shards, "pool": args.pool, "probe": args.probe,
        "poll_us": args.poll_us, "seed": args.seed,
        "start_timeout": 180.0, "open_timeout": 60.0, "visible_timeout": 5.0, "converge_timeout": 30.0,
    }
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="rtindex-replica-", dir=args.dir)
    t_start = time.perf_counter()
    log(f"replica benchmark: {seconds:.0f}s per phase at {args.rate_mb} MB/s, a batch every {args.interval_ms} ms, "
        f"shards={args.shards}, probe={args.probe}, dir={work}")

    res: dict[str, dict] = {}
    try:
        for mode in phases:
            log(f"phase {mode} ...")
            res[mode] = run_phase(mode, os.path.join(work, mode), opts)
            if not args.keep:
                shutil.rmtree(os.path.join(work, mode), ignore_errors=True)
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    follow, poll = res.get("follow", {}), res.get("poll", {})
    fr, pr = follow.get("reader", {}), poll.get("reader", {})
    pw, fw = poll.get("writer", {}), follow.get("writer", {})
    w = pw or fw
    out: dict[str, Any] = {
        "latency_p50_ms": pr.get("latency_p50_ms"),
        "latency_p99_ms": pr.get("latency_p99_ms"),
        "docs_per_s": w.get("docs_per_s"),
        "reader_cpu_pct": follow.get("reader_cpu_pct") if fr else None,
        "latency_p90_ms": pr.get("latency_p90_ms"),
        "latency_p999_ms": pr.get("latency_p999_ms"),
        "latency_max_ms": pr.get("latency_max_ms"),
        "latency_mean_ms": pr.get("latency_mean_ms"),
        "latency_samples": pr.get("samples"),
        "latency_timeouts": pr.get("timeouts"),
        "latency_visible_before_return": pr.get("visible_before_return"),
        "mb_per_s": w.get("mb_per_s"),
        "target_docs_per_s": w.get("target_docs_per_s"),
        "target_mb_per_s": args.rate_mb,
        "avg_doc_bytes": w.get("avg_doc_bytes"),
        "writer_ingest_ms_p50": w.get("ingest_ms_p50"),
        "writer_ingest_ms_p99": w.get("ingest_ms_p99"),
        "writer_max_batch": w.get("max_batch"),
        "writer_cpu_pct": poll.get("writer_cpu_pct") if pw else follow.get("writer_cpu_pct"),
        "follow_writer_docs_per_s": fw.get("docs_per_s"),
        "poll_reader_cpu_pct": poll.get("reader_cpu_pct") if pr else None,
        "follow_catchup_ms": fr.get("catchup_ms"),
        "follow_converged": fr.get("converged"),
        "poll_catchup_ms": pr.get("catchup_ms"),
        "poll_converged": pr.get("converged"),
        "reader_lag_at_end": fr.get("lag", pr.get("lag")),
        "probe": args.probe,
        "poll_us": args.poll_us,
        "seconds_per_phase": seconds,
        "shards": args.shards,
        "interval_ms": args.interval_ms,
        "errors": [e for r in res.values() for e in r.get("errors", [])],
        "total_seconds": time.perf_counter() - t_start,
    }
    checks = [
        (f"latency p50 <= {TARGET_P50_MS:g} ms", out["latency_p50_ms"], lambda v: v <= TARGET_P50_MS, "{:.2f} ms"),
        (f"latency p99 <= {TARGET_P99_MS:g} ms", out["latency_p99_ms"], lambda v: v <= TARGET_P99_MS, "{:.2f} ms"),
        (f"following reader <= {TARGET_READER_CPU_PCT:g}% of a core", out["reader_cpu_pct"], lambda v: v <= TARGET_READER_CPU_PCT,
         "{:.1f}%"),
        ("writer at >= 95% of its target rate", out["docs_per_s"],
         lambda v: bool(out["target_docs_per_s"]) and v >= 0.95 * out["target_docs_per_s"], "{:,.0f} docs/s"),
    ]
    for name, v, ok, fmt in checks:
        log(f"{'FAIL' if v is None or not ok(v) else 'PASS'}: {name}: "
            f"{'not measured' if v is None else fmt.format(v)}")
    for e in out["errors"]:
        log(f"!! {e}")

    print(json.dumps(rnd(out)))
    return 1 if out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
