#!/usr/bin/env python
"""What each memory option of ``rtindex.open`` costs: peak RSS of a demo-sized session.

    python benchmarks/memory_defaults.py [--events 50000] [--runs defaults,old,...]

Each run is a fresh process: open a new database with some options, ingest ``--events``
generated RockBench events (made on the fly, never held: the RSS is rtindex's), then read
every document once in chunks (``Snapshot.fetch``: fills the row cache and RocksDB's block
cache) and run a GROUP BY over the column store. Reported: RSS after import, after the
ingest, and at its peak; ingest seconds, and the seconds of the reads. ``old`` is the
earlier, larger defaults (256 MiB for the block cache, the write buffers and the row cache;
96 MiB seal_bytes); the ``old, ...`` runs change one of them; ``defaults`` is today's.
The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MIB = 1 << 20
# the earlier, larger defaults
OLD = {"block_cache_bytes": 256 * MIB, "write_buffer_bytes": 256 * MIB, "row_cache_bytes": 256 * MIB,
       "seal_bytes": 96 * MIB}
RUNS = {
    "defaults": {},
    "old": OLD,
    **{f"old, {name}={mib} MiB": {**OLD, name: mib * MIB} for name, mib in (
        ("block_cache_bytes", 32), ("write_buffer_bytes", 32), ("write_buffer_bytes", 64), ("row_cache_bytes", 32),
        ("row_cache_bytes", 64), ("seal_bytes", 16), ("seal_bytes", 32))},
}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


def one_run(n: int, options: dict) -> dict:
    """In this process: the session described in the module docstring."""
    import pandas  # noqa: F401 - as in a notebook (and pyarrow imports it anyway, maybe in a sealer thread)

    import rtindex
    from rtindex import datagen

    start = rss_mb()
    peak = [start]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.05):
            peak[0] = max(peak[0], rss_mb())
    threading.Thread(target=sample, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="rtindex-memdef-") as work:
        with rtindex.open(os.path.join(work, "db"), **options) as db:
            coll = db.create_collection("ev", shards=4)
            t0 = time.perf_counter()
            for i in range(0, n, 10_000):
                coll.ingest(datagen.rockbench_events(min(10_000, n - i), seed=1, start_id=i))
            ingest_s = time.perf_counter() - t0
            after_ingest = rss_mb()
            t0 = time.perf_counter()
            snap = coll.snapshot()
            rows = snap.all()
            for off in range(0, n, 5_000):
                snap.fetch(rows, 5_000, offset=off, copy=False)
            db.sql("SELECT event_type, COUNT(*) AS n FROM ev GROUP BY event_type").rows()
            read_s = time.perf_counter() - t0
            stop.set()
            peak[0] = max(peak[0], rss_mb())
    return {"start_rss_mb": round(start), "after_ingest_rss_mb": round(after_ingest), "peak_rss_mb": round(peak[0]),
            "ingest_s": round(ingest_s, 2), "read_s": round(read_s, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--runs", default=";".join(RUNS), help=f"separated by ';', of: {'; '.join(RUNS)}")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # a run's options, as JSON: run it here
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(one_run(args.events, json.loads(args.child))))
        return 0
    out = {}
    for name in args.runs.split(";"):
        proc = subprocess.run([sys.executable, __file__, "--events", str(args.events), "--child",
                               json.dumps(RUNS[name])], capture_output=True, text=True, check=True)
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name:<34} {out[name]}", file=sys.stderr, flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
