#!/usr/bin/env python
"""Ingest from a real Kafka broker into rtindex: a Kafka source's throughput against a direct
``ingest()`` of the same events, what an ingest transformation costs it, and how soon a
produced event can be read in a query process.

    python benchmarks/kafka.py [--quick] [--events N] [--shards S] [--pairs P] [--rate-mb R]
                               [--seconds S] [--warmup S] [--phases direct,kafka,transform,latency]
                               [--dir DIR] [--keep]

One broker serves the whole run: tests/kafka_broker.py's ``Broker`` (a single KRaft node on
127.0.0.1, a JVM). The first run on a machine downloads Kafka's jars from Maven Central into a
cache; later runs start from the cache. It needs Java 17+ (the reason is printed when it
cannot run). The client is confluent-kafka (``pip install 'rtindex[kafka]'``).

``--events`` RockBench-like events (``rtindex.datagen``, each with a unique ``_id``) are
generated once and serialized to NDJSON lines before anything is timed; the same lines are
produced, one message each, into topic ``events`` (3 partitions) before any phase starts,
and a throwaway consumer group commits once, so that the broker's group coordinator exists
before the first timed run.
Every run below is on a fresh database directory, collection ``events`` with ``--shards``
shards (default 2):

1. direct: ``coll.ingest(ndjson_bytes)``, all lines in one call; docs/s and MB/s (of the
   JSON, newlines left out, as in every MB/s here) from the call to its return.
2. kafka: ``coll.add_source(rtindex.KafkaSource(bootstrap, "events", group=<fresh>))``; the
   clock runs from ``add_source`` until the source's status says ``caught_up`` and
   ``len(coll)`` is the number of events (polled every 10 ms). ``kafka_startup_s`` is the
   part of it before the first documents were stored (connect, group join, assignment, the
   first batch); ``kafka_steady_docs_per_s`` leaves it and them out. Then ``lost`` = events - distinct ``_id``
   stored (every message of the topic carries one of the produced ids), checked by
   ``coll.get`` of a random sample too (``sample_missing``); ``duplicated`` = stored rows
   beyond one per ``_id`` (``COUNT(*) - COUNT(DISTINCT _id)`` and ``len(coll)`` against the
   distinct count); ``redelivered`` = messages the source consumed beyond one per event.
   Summed over every kafka and transform run.
3. transform: as kafka, on a collection created with an ingest transformation that renames
   5 fields, drops 10 and computes 2 (:data:`TRANSFORMATION`); each run checks a stored
   document's shape (``transform_checked``).

Each of ``--pairs`` rounds runs one of each, alternating the order (direct, kafka, transform
then transform, kafka, direct), so that drift on a shared machine hits both sides of each
ratio alike. Rates are the medians over rounds; ``ratio_to_direct`` is the median of the
rounds' kafka / direct rates, ``transform_cost_ratio`` that of kafka / transform rates (the
time per document with the transformation over that without it). A fresh collection
ingests faster before its first segments seal and merge than afterwards, on either path, so
the rates depend on ``--events``; compare runs of the same size.

4. latency: this process opens a fresh database as its writer, with a source on a fresh,
   empty topic ``latency`` (3 partitions); a *query process* (multiprocessing, "spawn":
   rocksdict does not survive a fork) opens the same directory with
   ``rtindex.open(path, role="reader")``; a *producer process* produces RockBench events at
   ``--rate-mb`` MB/s (default 10; librdkafka ``linger.ms`` 5) for ``--seconds``, and every
   20 ms a probe event ``probe-<k>`` that carries ``time.time()`` taken just before its
   ``produce()`` (a second producer, ``linger.ms`` 1). The query process polls every probe
   it knows of and has not seen yet with ``coll.get(id)``, sleeping 0.5 ms between rounds;
   a probe's latency is the time its ``get`` first returned it minus its produce time.
   Probes produced in the first ``--warmup`` seconds are left out. Reported: p50, p90, p99,
   max, the sample count, the MB/s and docs/s the producer reached (a warning when short of
   95% of ``--rate-mb``), whether every produced event was stored in the end, and the CPU
   (psutil, % of one core) of the writer, query, producer and broker processes meanwhile:
   the machine's cores are shared by all four.

Progress goes to stderr; a summary with the targets to stdout, and as the LAST line one JSON
object: ``ratio_to_direct``, ``latency_p50_ms``, ``latency_p99_ms``, ``lost``, ``duplicated``,
``transform_cost_ratio``, then the raw figures (``<phase>_docs_per_s``, ``<phase>_mb_per_s``,
per-round lists ``..._runs``, counts, ``rate_mb`` and the achieved rate, ``errors``, ...).
A figure is null when its phase did not run; a phase that failed is named in ``errors`` and
the exit status is 1 (130 after Ctrl-C or SIGTERM, which stop the broker and the child
processes and remove the working directory, as a normal end does).

Targets (printed as PASS/FAIL, not asserted): ratio_to_direct >= 0.8; at 10 MB/s latency
p50 <= 20 ms and p99 <= 100 ms; transform_cost_ratio <= 1.25. ``--quick`` (fewer events, one
round, a shorter latency phase) is meant to finish in under 3 minutes on 2 cores once the
jars are cached.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import random
import shutil
import signal
import statistics
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
from benchmarks.ingest import generating_input, log  # noqa: E402

MB = 1e6
COLLECTION = "events"
TOPIC = "events"
LATENCY_TOPIC = "latency"
PARTITIONS = 3
PHASES = ("direct", "kafka", "transform", "latency")

TARGET_RATIO = 0.8
TARGET_P50_MS = 20.0
TARGET_P99_MS = 100.0
TARGET_TRANSFORM = 1.25

RENAMED = {"processBy": "process_by", "event_type": "kind", "session_id": "session", "user_id": "account_id",
           "tier": "plan"}
DROPPED = ("generator_identifier", "is_test", "sampled", "flag_a", "flag_b", "shard_key", "version", "priority",
           "lang", "retries")
TRANSFORMATION = (
    "SELECT * EXCEPT (" + ", ".join([*RENAMED, *DROPPED]) + "),\n       "
    + ", ".join(f"{a} AS {b}" for a, b in RENAMED.items())
    + ",\n       LOWER(level) AS level_lower, duration_ms * 2 AS duration_ms_x2\nFROM _input")

PROBE_EVERY = 0.02  # seconds between probes in the latency phase
POLL_SLEEP = 0.0005  # the query process's sleep between rounds of gets
TICK = 0.005  # the producer's pacing step
WAIT_POLL = 0.01  # polling of a source's progress in the throughput phases


class PhaseError(Exception):
    """A phase could not run (said in ``errors``); the other phases go on."""


def _on_term(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")


# ---------------------------------------------------------------------------
# Data and the broker
# ---------------------------------------------------------------------------


def generate(n: int, seed: int) -> list[bytes]:
    """``n`` RockBench-like events as JSON lines (no newline), ``_id`` ``ev-0`` ...."""
    import orjson

    from rtindex import datagen

    with generating_input():
        return [orjson.dumps(d) for d in datagen.rockbench_events(n, seed=seed)]


def create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(30)
    deadline = time.monotonic() + 30
    while True:  # metadata with every partition led, so that the first produce does not wait
        md = admin.list_topics(topic, timeout=10).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == PARTITIONS and all(
                p.leader >= 0 for p in md.partitions.values()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic!r} has no leader for every partition")
        time.sleep(0.1)


def warm_groups(bootstrap: str, topic: str) -> None:
    """A throwaway consumer joins a group and commits once: the broker creates its offsets
    topic and coordinator now, not inside the first timed run."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "rtindex-bench-warmup",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 60
        while True:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                c.commit(message=m, asynchronous=False)
                return
            if time.monotonic() > deadline:
                raise RuntimeError("a warm-up consumer got no message in 60s")
    finally:
        c.close()


def produce_all(bootstrap: str, topic: str, lines: list[bytes]) -> float:
    """Every line as one message, delivered; returns the seconds it took."""
    from confluent_kafka import Producer

    failed: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                  "queue.buffering.max.kbytes": 1 << 20})
    t0 = time.perf_counter()
    for line in lines:
        while True:
            try:
                p.produce(topic, line, on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                p.poll(0.05)
        p.poll(0)
    left = p.flush(120)
    dt = time.perf_counter() - t0
    if left or failed:
        raise RuntimeError(f"producing into {topic!r}: {left} messages not delivered, {len(failed)} failed "
                           f"({failed[:1]})")
    return dt


# ---------------------------------------------------------------------------
# Throughput runs: direct, kafka, transform
# ---------------------------------------------------------------------------


def _count_rows(db: Any) -> tuple[int, int]:
    """(rows, distinct _id) of the collection, by SQL."""
    row = db.sql(f"SELECT COUNT(*) AS n, COUNT(DISTINCT _id) AS d FROM {COLLECTION}").rows()[0]
    return int(row["n"]), int(row["d"])


def run_direct(path: str, ndjson: bytes, n: int, nbytes: int, shards: int) -> dict:
    import rtindex

    db = rtindex.open(path)
    try:
        coll = db.create_collection(COLLECTION, shards=shards)
        t0 = time.perf_counter()
        stats = coll.ingest(ndjson, progress=False, errors="report")
        dt = time.perf_counter() - t0
        if stats.errors:
            raise PhaseError(f"direct: {len(stats.errors)} documents refused, e.g. {stats.errors[:1]}")
        if len(coll) != n:
            raise PhaseError(f"direct: {len(coll)} documents stored of {n}")
        return {"seconds": dt, "docs_per_s": n / dt, "mb_per_s": nbytes / MB / dt}
    finally:
        db.close()


def _check_transformed(coll: Any, lines: list[bytes]) -> bool:
    """A stored document has the transformation's shape: renamed, dropped, computed."""
    import orjson

    src = orjson.loads(lines[len(lines) // 2])
    got = coll.get(src["_id"])
    if got is None:
        raise PhaseError(f"transform: {src['_id']} not stored")
    bad = [f"{a} kept" for a in RENAMED if a in got]
    bad += [f"{b} != {a}" for a, b in RENAMED.items() if got.get(b) != src[a]]
    bad += [f"{d} kept" for d in DROPPED if d in got]
    if got.get("level_lower") != src["level"].lower():
        bad.append("level_lower wrong")
    if got.get("duration_ms_x2") != src["duration_ms"] * 2:
        bad.append("duration_ms_x2 wrong")
    if got.get("geo") != src["geo"]:
        bad.append("geo changed")
    if bad:
        raise PhaseError(f"transform: document {src['_id']} not as transformed: {', '.join(bad)}")
    return True


def run_kafka(path: str, bootstrap: str, lines: list[bytes], nbytes: int, shards: int, label: str,
              transformation: str | None, timeout: float) -> dict:
    """A fresh collection consuming the whole topic: time to caught up with every event."""
    import rtindex

    n = len(lines)
    db = rtindex.open(path)
    try:
        coll = db.create_collection(COLLECTION, shards=shards, transformation=transformation)
        if transformation is not None and coll.transformation != transformation:
            raise PhaseError("transform: coll.transformation is not the SQL given")
        src = rtindex.KafkaSource(bootstrap, TOPIC, group=f"rtindex-bench-{label}")
        t0 = time.perf_counter()
        name = coll.add_source(src)["name"]
        t_first = t_count = None
        n_first = 0  # documents stored at t_first
        last_n, last_change, checked = -1, t0, t0
        while True:  # len() every WAIT_POLL; the status (a larger dict) only when it can matter
            now = time.perf_counter()
            stored = len(coll)
            if stored and t_first is None:
                t_first, n_first = now, stored
            if stored >= n:
                if t_count is None:
                    t_count = now
                if coll.source(name)["caught_up"]:
                    break
            if stored != last_n:
                last_n, last_change = stored, now
            if now - checked >= 0.5:
                checked = now
                st = coll.source(name)
                if st["state"] == "failed":
                    raise PhaseError(f"{label}: the source failed: {st['last_error']}")
                if st["caught_up"] and now - last_change > 5:
                    log(f"  [{label}] caught up with {stored:,} of {n:,} documents stored: giving up waiting")
                    break
                if now - t0 > timeout:
                    log(f"  [{label}] not done after {timeout:.0f}s ({stored:,} of {n:,} stored, state "
                        f"{st['state']}, lag {st['lag_total']}): giving up waiting")
                    break
            time.sleep(WAIT_POLL)
        t_end = time.perf_counter()
        dt = t_end - t0
        st = coll.source(name)
        rows, distinct = _count_rows(db)
        stored = len(coll)
        sample = random.Random(0).sample(range(n), min(n, 1000))
        missing = sum(1 for i in sample if coll.get(f"ev-{i}") is None)
        out = {
            "seconds": dt, "docs_per_s": n / dt, "mb_per_s": nbytes / MB / dt,
            "startup_s": (t_first - t0) if t_first is not None else None,
            "steady_docs_per_s": ((n - n_first) / (t_end - t_first)) if t_first is not None and t_end > t_first
            else None,
            "count_to_caught_up_s": (t_end - t_count) if t_count is not None else None,
            "lost": n - distinct, "duplicated": max(rows - distinct, stored - distinct, 0),
            "redelivered": st["messages"] - n, "sample_missing": missing,
            "source_errors": st["errors"], "source_filtered": st.get("filtered", 0), "batches": st["batches"],
        }
        if transformation is not None:
            out["transform_checked"] = _check_transformed(coll, lines)
        return out
    finally:
        db.close()


# ---------------------------------------------------------------------------
# Latency: producer and query processes
# ---------------------------------------------------------------------------


def _quiet_child() -> None:
    """A child leaves Ctrl-C to the orchestrator, which stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def producer_main(bootstrap: str, opts: dict, ready: Any, go: Any, stop: Any, probes: Any, results: Any) -> None:
    """Background events at the target rate, and a probe every PROBE_EVERY seconds."""
    _quiet_child()
    try:
        import orjson
        from confluent_kafka import Producer

        from rtindex import datagen

        # each pooled event without its _id: a message is '{"_id":"..",' + the rest
        with generating_input():
            pool = [orjson.dumps({k: v for k, v in d.items() if k != "_id"})[1:]
                    for d in datagen.rockbench_events(opts["pool"], seed=opts["seed"] + 1)]
        avg = sum(len(b) for b in pool) / len(pool) + len(b'{"_id":"bg-0000000",')
        rate = opts["rate_mb"] * MB / avg  # background events per second
        failed: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(str(err))

        bg = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        pr = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
        for p in (bg, pr):  # connected and the topic's metadata known before the clock starts
            p.list_topics(LATENCY_TOPIC, timeout=10)
        ready.set()
        if not go.wait(120):
            raise RuntimeError("no start signal")
        P = len(pool)
        sent = nbytes = k = full = 0
        t0 = time.perf_counter()
        t_end = t0 + opts["seconds"]
        next_probe = t0
        while not stop.is_set():
            now = time.perf_counter()
            if now >= t_end:
                break
            due = min(int(rate * (now - t0 + TICK)) - sent, int(rate * 0.1) + 1)
            for _ in range(max(0, due)):
                msg = b'{"_id":"bg-%d",' % sent + pool[sent % P]
                try:
                    bg.produce(LATENCY_TOPIC, msg, on_delivery=delivered)
                except BufferError:
                    full += 1
                    break
                sent += 1
                nbytes += len(msg)
            bg.poll(0)
            if now >= next_probe:
                t = time.time()  # just before produce()
                msg = b'{"_id":"probe-%d","probe_t":%r,' % (k, t) + pool[(k * 7919) % P]
                pr.produce(LATENCY_TOPIC, msg, on_delivery=delivered)
                pr.poll(0)
                probes.value = k + 1
                k += 1
                nbytes += len(msg)
                next_probe += PROBE_EVERY
                if next_probe < now:  # fell behind: no burst of probes
                    next_probe = now + PROBE_EVERY
            pr.poll(0)
            pause = min(TICK, next_probe - time.perf_counter())
            if pause > 0:
                time.sleep(pause)
        dt = time.perf_counter() - t0
        left = bg.flush(30) + pr.flush(30)
        results.put(("producer", {
            "seconds": dt, "background": sent, "probes": k, "messages": sent + k, "bytes": nbytes,
            "mb_per_s": nbytes / MB / dt, "docs_per_s": (sent + k) / dt, "target_docs_per_s": rate + 1 / PROBE_EVERY,
            "avg_doc_bytes": avg, "queue_full": full, "undelivered": left, "failed": len(failed),
        }))
    except BaseException as e:  # noqa: BLE001 - reported to the orchestrator
        results.put(("producer", {"error": f"producer: {type(e).__name__}: {e}", "traceback": traceback.format_exc()}))


def reader_main(path: str, opts: dict, ready: Any, stop: Any, probes: Any, results: Any) -> None:
    """The query process: every pending probe polled with coll.get until it is visible."""
    _quiet_child()
    try:
        import rtindex
        from rtindex.errors import NotFoundError

        deadline = time.monotonic() + 60
        while True:
            try:
                db = rtindex.open(path, role="reader")
                coll = db[COLLECTION]
                break
            except (NotFoundError, KeyError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        try:
            ready.set()
            seen: list[tuple[float, float]] = []  # (produce time, latency s)
            pending: list[int] = []
            nxt = 0  # the first probe not yet pending
            give_up = None
            rounds = 0
            while True:
                known = probes.value
                while nxt < known:
                    pending.append(nxt)
                    nxt += 1
                # the next probe too: it may be produced (and then visible) before it is counted
                for k in (*pending, nxt):
                    doc = coll.get(f"probe-{k}")
                    if doc is not None:
                        t = time.time()
                        seen.append((doc["probe_t"], t - doc["probe_t"]))
                        if k == nxt:
                            nxt += 1
                        else:
                            pending.remove(k)
                rounds += 1
                if stop.is_set():
                    if give_up is None:
                        give_up = time.monotonic() + opts["drain_timeout"]
                    if (not pending and nxt >= probes.value) or time.monotonic() > give_up:
                        break
                time.sleep(POLL_SLEEP)
            results.put(("reader", {"seen": seen, "unseen": len(pending), "rounds": rounds,
                                    "documents": len(coll)}))
        finally:
            db.close()
    except BaseException as e:  # noqa: BLE001 - reported to the orchestrator
        results.put(("reader", {"error": f"query process: {type(e).__name__}: {e}",
                                "traceback": traceback.format_exc()}))


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process so far (every thread), or None."""
    import psutil

    if pid is None:
        return None
    try:
        c = psutil.Process(pid).cpu_times()
        return c.user + c.system
    except (psutil.Error, ValueError):
        return None


def run_latency(path: str, bootstrap: str, opts: dict, procs: list) -> dict:
    """This process writes (the source runs here); a producer and a query process beside it."""
    import rtindex

    create_topic(bootstrap, LATENCY_TOPIC)
    ctx = mp.get_context("spawn")
    ready_p, ready_r, go, stop = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
    probes = ctx.Value("q", 0, lock=False)
    results = ctx.Queue()
    got: dict[str, dict] = {}

    def collect(who: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while who not in got:
            try:
                k, v = results.get(timeout=0.2)
                got[k] = v
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise PhaseError(f"latency: no result from the {who}") from None
        if "error" in got[who]:
            log(got[who].get("traceback", ""))
            raise PhaseError(got[who]["error"])
        return got[who]

    def wait(ev: Any, who: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ev.wait(0.1):
            if not results.empty():
                k, v = results.get()
                got[k] = v
                if "error" in v:
                    collect(k, 0)
            if time.monotonic() > deadline or not all(p.is_alive() for p in procs):
                raise PhaseError(f"latency: the {who} did not start")

    db = rtindex.open(path)
    ok = False
    try:
        coll = db.create_collection(COLLECTION, shards=opts["shards"])
        name = coll.add_source(rtindex.KafkaSource(bootstrap, LATENCY_TOPIC, group="rtindex-bench-latency"))["name"]
        deadline = time.monotonic() + 60
        while len(coll.source(name)["offsets"]) < PARTITIONS:  # assigned: it consumes from now on
            if time.monotonic() > deadline:
                raise PhaseError(f"latency: the source was not assigned its partitions: {coll.source(name)}")
            time.sleep(0.05)
        producer = ctx.Process(target=producer_main, name="producer",
                               args=(bootstrap, opts, ready_p, go, stop, probes, results))
        reader = ctx.Process(target=reader_main, name="query", args=(path, opts, ready_r, stop, probes, results))
        for p in (producer, reader):
            p.start()
            procs.append(p)
        wait(ready_p, "producer", 120)
        wait(ready_r, "query process", 120)
        log(f"  [latency] producer pid {producer.pid}, query process pid {reader.pid}: "
            f"{opts['rate_mb']:g} MB/s for {opts['seconds']:.0f}s ...")
        t_go = time.time()
        go.set()
        t0 = time.perf_counter()
        last = t0
        pids = {"writer": os.getpid(), "query": reader.pid, "producer": producer.pid, "broker": opts["broker_pid"]}
        cpu0 = cpu1 = None  # (when, CPU seconds per process) at the window's start and end
        while producer.is_alive() and time.perf_counter() - t0 < opts["seconds"] + 60:
            producer.join(0.2)
            now = time.perf_counter()
            if now - t0 < opts["seconds"] - 0.1:
                snap = (now, {who: _cpu_seconds(pid) for who, pid in pids.items()})
                if now - t0 < opts["warmup"] or cpu0 is None:
                    cpu0 = snap
                else:
                    cpu1 = snap
            if time.perf_counter() - last >= 3:
                last = time.perf_counter()
                st = coll.source(name)
                log(f"  [latency] {last - t0:.0f}s: stored {len(coll):,}, source {st['messages_per_s']:,.0f} msg/s "
                    f"{st['bytes_per_s'] / MB:.1f} MB/s, lag {st['lag_total']:,}, probes {probes.value:,}")
        prod = collect("producer", 30)
        # every produced event stored before the query process is told to finish
        t_stop = time.perf_counter()
        while len(coll) < prod["messages"] and time.perf_counter() - t_stop < opts["drain_timeout"]:
            time.sleep(0.01)
        catchup = time.perf_counter() - t_stop
        stored = len(coll)
        stop.set()
        rd = collect("reader", opts["drain_timeout"] + 30)
        st = coll.source(name)
        ok = True
    finally:
        stop.set()
        if not ok:  # interrupted or failed: the children are not waited for
            for p in procs:
                if p.is_alive():
                    p.terminate()
        db.close()
    lat = sorted(ms * 1000 for t, ms in rd["seen"] if t >= t_go + opts["warmup"])
    cpu = {}
    if cpu0 is not None and cpu1 is not None and cpu1[0] > cpu0[0]:
        for who in pids:
            a, b = cpu0[1][who], cpu1[1][who]
            ok = a is not None and b is not None
            cpu[f"latency_cpu_pct_{who}"] = (b - a) / (cpu1[0] - cpu0[0]) * 100 if ok else None
    return {**cpu,
        "latency_p50_ms": percentile(lat, 50), "latency_p90_ms": percentile(lat, 90),
        "latency_p99_ms": percentile(lat, 99), "latency_max_ms": lat[-1] if lat else None,
        "latency_mean_ms": sum(lat) / len(lat) if lat else None, "latency_samples": len(lat),
        "latency_unseen": rd["unseen"], "latency_probes": prod["probes"],
        "latency_mb_per_s": prod["mb_per_s"], "latency_docs_per_s": prod["docs_per_s"],
        "latency_target_docs_per_s": prod["target_docs_per_s"], "latency_produced": prod["messages"],
        "latency_produce_failed": prod["failed"] + prod["undelivered"], "latency_queue_full": prod["queue_full"],
        "latency_stored": stored, "latency_converged": stored == prod["messages"],
        "latency_catchup_s": catchup, "latency_reader_documents": rd["documents"],
        "latency_reader_rounds": rd["rounds"], "latency_source_errors": st["errors"],
        "latency_avg_doc_bytes": prod["avg_doc_bytes"],
    }


# ---------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------


def _median(vals: list) -> float | None:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def run(args: argparse.Namespace, work: str, out: dict, procs: list) -> None:
    from tests.kafka_broker import Broker, why_not

    reason = why_not()
    if reason:
        raise PhaseError(f"no Kafka broker here: {reason}")
    phases = args.phases
    broker = Broker(os.path.join(work, "broker"), port=0)
    try:
        t = time.perf_counter()
        broker.start()
        out["broker_start_s"] = time.perf_counter() - t
        bootstrap = broker.bootstrap
        log(f"broker up at {bootstrap} in {out['broker_start_s']:.1f}s")
        throughput = [p for p in ("direct", "kafka", "transform") if p in phases]
        if throughput:
            t = time.perf_counter()
            lines = generate(args.events, args.seed)
            nbytes = sum(map(len, lines))  # the NDJSON's bytes, newlines left out
            out["gen_seconds"] = time.perf_counter() - t
            out["event_mb"] = nbytes / MB
            out["avg_doc_bytes"] = nbytes / len(lines)
            log(f"{len(lines):,} events generated ({nbytes / MB:,.1f} MB) in {out['gen_seconds']:.1f}s")
            ndjson = b"\n".join(lines) + b"\n" if "direct" in phases else b""
            if {"kafka", "transform"} & set(phases):
                create_topic(bootstrap, TOPIC)
                dt = produce_all(bootstrap, TOPIC, lines)
                out["produce_docs_per_s"] = len(lines) / dt
                log(f"produced into {TOPIC!r} ({PARTITIONS} partitions) in {dt:.1f}s "
                    f"({len(lines) / dt:,.0f} msg/s)")
                warm_groups(bootstrap, TOPIC)
            runs: dict[str, list[dict]] = {p: [] for p in throughput}
            for r in range(args.pairs):
                order = throughput if r % 2 == 0 else throughput[::-1]
                for phase in order:
                    path = os.path.join(work, f"{phase}-{r}")
                    label = f"{phase}-{r}"
                    log(f"round {r + 1}/{args.pairs}: {phase} ...")
                    try:
                        if phase == "direct":
                            res = run_direct(path, ndjson, len(lines), nbytes, args.shards)
                        else:
                            res = run_kafka(path, bootstrap, lines, nbytes, args.shards, label,
                                            TRANSFORMATION if phase == "transform" else None,
                                            timeout=max(120.0, len(lines) / 1000))
                    except PhaseError as e:
                        out["errors"].append(str(e))
                        log(f"!! {e}")
                        res = {}
                    finally:
                        if not args.keep:
                            shutil.rmtree(path, ignore_errors=True)
                    runs[phase].append(res)
                    if res:
                        extra = (f", startup {res['startup_s']:.2f}s, lost {res['lost']}, duplicated "
                                 f"{res['duplicated']}" if "lost" in res else "")
                        log(f"  [{label}] {res['docs_per_s']:,.0f} docs/s, {res['mb_per_s']:.1f} MB/s "
                            f"({res['seconds']:.2f}s){extra}")
            for phase, rs in runs.items():
                for k in ("docs_per_s", "mb_per_s", "seconds"):
                    out[f"{phase}_{k}_runs"] = [x.get(k) for x in rs]
                    out[f"{phase}_{k}"] = _median(out[f"{phase}_{k}_runs"])
                if phase != "direct":
                    out[f"{phase}_startup_s"] = _median([x.get("startup_s") for x in rs])
                    out[f"{phase}_steady_docs_per_s"] = _median([x.get("steady_docs_per_s") for x in rs])
                    out[f"{phase}_count_to_caught_up_s"] = _median([x.get("count_to_caught_up_s") for x in rs])
                    for k in ("lost", "duplicated", "redelivered", "sample_missing", "source_errors"):
                        vals = [x[k] for x in rs if k in x]
                        out[f"{phase}_{k}"] = sum(vals) if vals else None
            pairs = list(zip(runs.get("direct", []), runs.get("kafka", []))) if "direct" in runs else []
            out["ratio_to_direct_runs"] = [k["docs_per_s"] / d["docs_per_s"] for d, k in pairs if d and k]
            out["ratio_to_direct"] = _median(out["ratio_to_direct_runs"])
            out["ratio_to_direct_steady"] = _median([k["steady_docs_per_s"] / d["docs_per_s"] for d, k in pairs
                                                     if d and k and k.get("steady_docs_per_s")])
            tpairs = list(zip(runs.get("kafka", []), runs.get("transform", []))) if "kafka" in runs else []
            out["transform_cost_ratio_runs"] = [k["docs_per_s"] / t["docs_per_s"] for k, t in tpairs if k and t]
            out["transform_cost_ratio"] = _median(out["transform_cost_ratio_runs"])
            checked = [x.get("transform_checked") for x in runs.get("transform", []) if x]
            out["transform_checked"] = all(checked) if checked else None
            for k in ("lost", "duplicated", "redelivered", "sample_missing"):
                vals = [out.get(f"{p}_{k}") for p in ("kafka", "transform")]
                vals = [v for v in vals if v is not None]
                out[k] = sum(vals) if vals else None
            del lines, ndjson
        if "latency" in phases:
            log("latency ...")
            path = os.path.join(work, "latency")
            opts = {"seconds": args.seconds, "warmup": args.warmup, "rate_mb": args.rate_mb,
                    "shards": args.shards, "seed": args.seed, "pool": 20_000, "drain_timeout": 60.0,
                    "broker_pid": broker.pid}
            try:
                out.update(run_latency(path, bootstrap, opts, procs))
            except PhaseError as e:
                out["errors"].append(str(e))
                log(f"!! {e}")
            finally:
                for p in procs:
                    p.join(10)
                    if p.is_alive():
                        out["errors"].append(f"latency: the {p.name} process hung; terminated")
                        p.terminate()
                        p.join(10)
                if not args.keep:
                    shutil.rmtree(path, ignore_errors=True)
            if out.get("latency_p50_ms") is not None:
                log(f"  [latency] p50 {out['latency_p50_ms']:.1f} ms, p99 {out['latency_p99_ms']:.1f} ms, "
                    f"max {out['latency_max_ms']:.1f} ms over {out['latency_samples']} probes; produced "
                    f"{out['latency_mb_per_s']:.1f} MB/s")
    except Exception:
        if broker.running:
            log(broker.log_report())
        raise
    finally:
        for p in procs:  # (only an interrupt or a failure leaves one running here)
            if p.is_alive():
                p.terminate()
                p.join(10)
        broker.stop()


def summary(out: dict, args: argparse.Namespace) -> None:
    g = out.get

    def f(v: Any, fmt: str = "{:,.0f}") -> str:
        return "-" if v is None else fmt.format(v)

    print()
    print(f"Kafka ingest: {args.events:,} events ({f(g('avg_doc_bytes'))} B/doc), shards={args.shards}, "
          f"{args.pairs} round(s); latency at {args.rate_mb:g} MB/s for {args.seconds:g}s")
    print(f"{'run':<12} {'docs/s':>10} {'MB/s':>7} {'startup s':>9} {'steady docs/s':>13}")
    for p in ("direct", "kafka", "transform"):
        if g(f"{p}_docs_per_s") is not None:
            print(f"{p:<12} {f(g(f'{p}_docs_per_s')):>10} {f(g(f'{p}_mb_per_s'), '{:.1f}'):>7} "
                  f"{f(g(f'{p}_startup_s'), '{:.2f}'):>9} {f(g(f'{p}_steady_docs_per_s')):>13}")
    print(f"lost {f(g('lost'))}, duplicated {f(g('duplicated'))}, redelivered {f(g('redelivered'))}, "
          f"sample missing {f(g('sample_missing'))}")
    if g("latency_samples"):
        print(f"latency produce -> get in the query process: p50 {f(g('latency_p50_ms'), '{:.1f}')} ms, "
              f"p90 {f(g('latency_p90_ms'), '{:.1f}')} ms, p99 {f(g('latency_p99_ms'), '{:.1f}')} ms, "
              f"max {f(g('latency_max_ms'), '{:.1f}')} ms ({g('latency_samples')} probes); produced "
              f"{f(g('latency_mb_per_s'), '{:.1f}')} MB/s ({f(g('latency_docs_per_s'))} docs/s) of "
              f"{args.rate_mb:g}")
        print("  CPU % of a core meanwhile: " + ", ".join(
            f"{who} {f(g(f'latency_cpu_pct_{who}'))}" for who in ("writer", "query", "producer", "broker")))
    checks = [
        (f"ratio_to_direct >= {TARGET_RATIO:g}", g("ratio_to_direct"), lambda v: v >= TARGET_RATIO, "{:.2f}"),
        (f"latency p50 <= {TARGET_P50_MS:g} ms at {args.rate_mb:g} MB/s", g("latency_p50_ms"),
         lambda v: v <= TARGET_P50_MS, "{:.1f} ms"),
        (f"latency p99 <= {TARGET_P99_MS:g} ms at {args.rate_mb:g} MB/s", g("latency_p99_ms"),
         lambda v: v <= TARGET_P99_MS, "{:.1f} ms"),
        (f"transform_cost_ratio <= {TARGET_TRANSFORM:g}", g("transform_cost_ratio"),
         lambda v: v <= TARGET_TRANSFORM, "{:.2f}"),
        ("nothing lost or duplicated", None if g("lost") is None else (g("lost"), g("duplicated")),
         lambda v: v == (0, 0), "lost {0[0]}, duplicated {0[1]}"),
    ]
    missed = []
    print("targets:")
    for name, v, ok, fmt in checks:
        state = "-" if v is None else ("PASS" if ok(v) else "FAIL")
        if state == "FAIL":
            missed.append(name)
        print(f"  {state:<4} {name}: {'not measured' if v is None else fmt.format(v)}")
    out["targets_missed"] = missed
    if g("latency_mb_per_s") is not None and g("latency_mb_per_s") < 0.95 * args.rate_mb:
        print(f"  WARNING: the producer reached {g('latency_mb_per_s'):.1f} MB/s, short of {args.rate_mb:g}")
    for e in g("errors") or []:
        print(f"  error: {e}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer events, one round, a shorter latency phase")
    ap.add_argument("--events", type=int, default=None,
                    help="events per throughput run (default 300,000; quick 100,000)")
    ap.add_argument("--shards", type=int, default=2, help="shards of each collection (default 2)")
    ap.add_argument("--pairs", type=int, default=None,
                    help="rounds of direct/kafka/transform runs (default 2; quick 1)")
    ap.add_argument("--rate-mb", type=float, default=10.0,
                    help="production rate of the latency phase, MB/s (default 10)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds of production in the latency phase "
                    "(default 30; quick 10)")
    ap.add_argument("--warmup", type=float, default=None, help="first seconds of the latency phase left out "
                    "(default 2; quick 1.5)")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    ap.add_argument("--dir", default=None, help="parent of the temporary working directory (default the system's)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated events (default 0)")
    ap.add_argument("--keep", action="store_true", help="keep the working directory (databases, broker log)")
    args = ap.parse_args(argv)
    args.events = args.events if args.events is not None else (100_000 if args.quick else 300_000)
    args.pairs = args.pairs if args.pairs is not None else (1 if args.quick else 2)
    args.seconds = args.seconds if args.seconds is not None else (10.0 if args.quick else 30.0)
    args.warmup = args.warmup if args.warmup is not None else (1.5 if args.quick else 2.0)
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if not args.phases or set(args.phases) - set(PHASES):
        ap.error(f"--phases: a subset of {','.join(PHASES)}")
    if args.events < 1 or args.pairs < 1 or args.shards < 1 or args.rate_mb <= 0:
        ap.error("--events, --pairs, --shards and --rate-mb must be positive")
    if args.seconds <= args.warmup:
        ap.error("--seconds must be longer than --warmup")

    signal.signal(signal.SIGTERM, _on_term)
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="rtindex-kafka-", dir=args.dir)
    t_start = time.perf_counter()
    log(f"kafka benchmark: {args.events:,} events, {args.pairs} round(s), shards={args.shards}, latency at "
        f"{args.rate_mb:g} MB/s for {args.seconds:g}s, phases {','.join(args.phases)}, dir={work}")
    out: dict[str, Any] = {"ratio_to_direct": None, "latency_p50_ms": None, "latency_p99_ms": None, "lost": None,
                           "duplicated": None, "transform_cost_ratio": None, "errors": []}
    procs: list = []
    interrupted = False
    try:
        run(args, work, out, procs)
    except KeyboardInterrupt:
        interrupted = True
        out["errors"].append("interrupted")
        log("!! interrupted: stopping")
    except PhaseError as e:
        out["errors"].append(str(e))
        log(f"!! {e}")
    except Exception as e:  # noqa: BLE001 - reported in the JSON line
        out["errors"].append(f"{type(e).__name__}: {e}")
        traceback.print_exc(file=sys.stderr)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(10)
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    out.update({"events": args.events, "shards": args.shards, "pairs": args.pairs, "rate_mb": args.rate_mb,
                "seconds": args.seconds, "warmup": args.warmup, "partitions": PARTITIONS,
                "probe_every_ms": PROBE_EVERY * 1000, "phases": args.phases, "quick": args.quick,
                "transformation": TRANSFORMATION if "transform" in args.phases else None,
                "total_seconds": time.perf_counter() - t_start})
    summary(out, args)
    sys.stdout.flush()
    print(json.dumps(rnd(out)), flush=True)
    return 130 if interrupted else 1 if out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
