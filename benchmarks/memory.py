#!/usr/bin/env python
"""Bounded memory: stream generated events into rtindex and report peak RSS.

    python benchmarks/memory.py [--quick] [--events N] [--shards S] [--dir DIR]

Events are generated on the fly (never held in memory), so the RSS measured is rtindex's:
mutable segments (sealed by size), pending seals (at most 2 per shard), RocksDB memtables
(one shared budget) and block cache. Full run: 5,000,000 events; --quick: 500,000.

A reader process (``role="reader"``) follows the writer meanwhile, counting the collection
every 0.1 s; its peak RSS (``reader_peak_rss_mb``) is what following costs it: the
writer's segment files and mutable segments it maps, its RocksDB secondaries.

First, whether ``seal_bytes`` bounds what it says: one in-memory segment builder is filled
with ``--builder-events`` events (25,000: a shard's ``seal_rows``), each generated, parsed
from its JSON and dropped, and the RSS it adds (``builder_taken_mb``) is set against what
the builder counts (``builder_counted_mb``, its ``nbytes``, which ``seal_bytes`` is compared
with). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rtindex  # noqa: E402
from rtindex import datagen  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def builder_bytes(n: int) -> tuple[float, float]:
    """(MB the builder counts, MB of RSS it adds) for ``n`` events indexed into one builder."""
    import gc

    import orjson

    from rtindex._impl import SegmentBuilder

    docs = datagen.rockbench_events(n + 3000, seed=5)
    for _, doc in zip(range(3000), docs):  # the generator's word pools, made on first use
        orjson.loads(orjson.dumps(doc))
    gc.collect()
    before = rss_mb()
    builder = SegmentBuilder()
    for doc in docs:
        builder.add_json([orjson.dumps(doc)])
    gc.collect()
    taken = rss_mb() - before
    counted = builder.nbytes / 1e6
    del builder
    return counted, taken


def follow(path: str, ready, stop, out) -> None:
    """A reader process: follow the database at ``path`` until ``stop``; put its peak RSS (MB)."""
    db = None
    while db is None:
        try:
            db = rtindex.open(path, role="reader")
            coll = db["events"]
        except (rtindex.NotFoundError, rtindex.NotADatabaseError):
            if db is not None:
                db.close()
                db = None
            time.sleep(0.05)
    ready.set()
    n = 0
    while not stop.wait(0.1):
        n = len(coll)
    db.close()
    out.put((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, n))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--events", type=int)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--builder-events", type=int, default=25_000)
    args = ap.parse_args(argv)
    n = args.events or (500_000 if args.quick else 5_000_000)
    counted, taken = builder_bytes(args.builder_events)
    print(f"one builder of {args.builder_events:,} events: counts {counted:,.1f} MB, takes {taken:,.1f} MB of RSS "
          f"({counted / taken:.2f}x)", file=sys.stderr, flush=True)
    work = tempfile.mkdtemp(prefix="rtindex-mem-", dir=args.dir)
    peak = [rss_mb()]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.2):
            peak[0] = max(peak[0], rss_mb())

    threading.Thread(target=sample, daemon=True).start()
    start_rss = rss_mb()
    t0 = time.perf_counter()
    done = 0
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    ready, halt, got = ctx.Event(), ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=follow, args=(os.path.join(work, "db"), ready, halt, got))
    reader_peak = None
    try:
        with rtindex.open(os.path.join(work, "db")) as db:
            coll = db.create_collection("events", shards=args.shards)
            reader.start()
            ready.wait(120)
            step = 50_000
            last = t0
            for i in range(0, n, step):
                coll.ingest(datagen.rockbench_events(min(step, n - i), seed=3, start_id=i), batch_size=10_000)
                done = min(i + step, n)
                if time.perf_counter() - last > 5:
                    last = time.perf_counter()
                    print(f"  {done:>10,} events  {done / (last - t0):>8,.0f}/s  RSS {rss_mb():,.0f} MB "
                          f"(peak {peak[0]:,.0f})", file=sys.stderr, flush=True)
            coll.flush()
            secs = time.perf_counter() - t0
            count = len(coll)
            time.sleep(0.5)
            halt.set()
            reader_peak, reader_saw = got.get(timeout=120)
            reader.join(60)
    finally:
        stop.set()
        if reader.is_alive():
            reader.kill()
        shutil.rmtree(work, ignore_errors=True)
    out = {
        "events": done,
        "documents": count,
        "seconds": round(secs, 1),
        "docs_per_s": round(done / secs),
        "start_rss_mb": round(start_rss),
        "peak_rss_mb": round(max(peak[0], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)),
        "builder_events": args.builder_events,
        "builder_counted_mb": round(counted, 1),
        "builder_taken_mb": round(taken, 1),
        "builder_counted_vs_taken": round(counted / taken, 2),
        "reader_peak_rss_mb": round(reader_peak) if reader_peak is not None else None,
        "reader_documents": reader_saw if reader_peak is not None else None,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
