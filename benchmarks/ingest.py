#!/usr/bin/env python
"""Ingest throughput: rtindex vs SQLite (JSON + expression indexes) vs DuckDB (typed table).

    python benchmarks/ingest.py [--quick] [--events N] [--tsbs N] [--shards S] [--batch B] [--dir DIR]

Data (benchmarks/datagen.py) is generated once, in memory, before anything is timed:
RockBench-style events (~1.25 KB, ~60 leaf fields; also serialized to NDJSON to count
input bytes) and TSBS ``cpu`` rows. Then, one system after the other:

* rtindex: ``coll.ingest(docs, batch_size=B)`` + ``coll.flush()`` (waits for background
  sealing), wall clock; collections "events" and "cpu" with ``--shards`` shards.
* SQLite (file, WAL, synchronous=NORMAL): ``events(id TEXT PRIMARY KEY, doc TEXT)`` with
  expression indexes on json_extract(doc, '$.processBy' / '$.generator_identifier' /
  '$._event_time') and a side table ``event_emails(email, id)`` indexed on email (how
  arrays get indexed in SQLite); one transaction per batch, orjson serialization
  included. TSBS rows go to a typed table indexed on (hostname, ts).
* DuckDB (file): typed table whose schema is inferred once from a sample (scalars ->
  typed columns, objects -> STRUCT, arrays -> LIST); per batch ``pa.Table.from_pylist``
  + ``INSERT INTO ... BY NAME SELECT * FROM batch`` (conversion included), then CHECKPOINT.

Prints progress to stderr, a table to stdout, and as the LAST stdout line one JSON
object (events_docs_per_s, events_mb_per_s, tsbs_rows_per_s, sqlite_events_docs_per_s,
duckdb_events_docs_per_s, peak_rss_mb, ...). Values are null for a system that could not
run (e.g. rtindex not importable -- the peers still run).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import resource
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import orjson  # noqa: E402

from benchmarks import datagen  # noqa: E402

MB = 1e6
EVENT_TIME_BASE_US = 1_700_000_000_000_000


# ---------------------------------------------------------------------------
# Utilities
# ---------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        try:
            import psutil

            return psutil.Process().memory_info().rss / 2**20
        except Exception:
            return float("nan")


def peak_rss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024 if sys.platform != "darwin" else r / 2**20


def dir_size_mb(path: str) -> float:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total / MB


class RssSampler:
    """Polls RSS in a thread to find the peak during one phase (ru_maxrss is process-wide
    and cannot be reset)."""

    def __init__(self, interval: float = 0.1):
        self.interval = interval
        self.start_mb = self.peak_mb = rss_mb()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_mb = max(self.peak_mb, rss_mb())

    def __enter__(self) -> "RssSampler":
        self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join()
        self.end_mb = rss_mb()
        self.peak_mb = max(self.peak_mb, self.end_mb)


class Progress:
    """A stderr line every ``every`` seconds for long phases."""

    def __init__(self, label: str, total: int, unit: str = "docs", every: float = 3.0):
        self.label, self.total, self.unit, self.every = label, total, unit, every
        self.t0 = self.last = time.perf_counter()
        self.done = 0

    def update(self, done: int) -> None:
        self.done = done
        now = time.perf_counter()
        if now - self.last >= self.every:
            self.last = now
            el = now - self.t0
            log(f"  [{self.label}] {done:,}/{self.total:,} {self.unit} "
                f"({done / el:,.0f}/s, {el:.0f}s, rss {rss_mb():,.0f} MB)")

    def wrap(self, it: Iterable[Any], check_every: int = 2048) -> Iterator[Any]:
        n = 0
        for x in it:
            yield x
            n += 1
            if n % check_every == 0:
                self.update(n)
        self.done = n

    def finish(self, extra: str = "") -> float:
        el = time.perf_counter() - self.t0
        log(f"  [{self.label}] done: {self.done:,} {self.unit} in {el:.2f}s"
            f" ({self.done / el if el > 0 else float('inf'):,.0f}/s){extra}")
        return el


def batches(seq: list, size: int) -> Iterator[list]:
    for i in range(0, len(seq), size):
        yield seq[i:i + size]


def run_guarded(name: str, fn: Callable[[], dict], results: dict) -> None:
    """Run one system's phase; a failure is reported and the benchmark goes on."""
    try:
        results.update(fn())
    except Exception as e:  # noqa: BLE001 - a benchmark must survive a broken system
        log(f"!! {name} failed: {type(e).__name__}: {e}")
        traceback.print_exc(file=sys.stderr)
        results[f"{name}_error"] = f"{type(e).__name__}: {e}"
    finally:
        gc.collect()


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def generating_input() -> Iterator[None]:
    """Around building a benchmark's input data: the cyclic GC off meanwhile (millions of
    fresh containers make list-building ~3x slower with it on), then one collection and a
    freeze, so the input, which lives for the whole run, stays out of every later GC pass
    and does not tax whichever system is being measured."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
    gc.collect()
    gc.freeze()


def generate(n_events: int, n_tsbs: int, seed: int) -> tuple[list[dict], bytearray, int, list[dict], float]:
    t0 = time.perf_counter()
    with generating_input():
        p = Progress("gen events", n_events)
        events = list(p.wrap(datagen.rockbench_events(n_events, seed=seed, event_time_us=EVENT_TIME_BASE_US)))
        p.finish()
        p = Progress("gen ndjson", n_events)
        ndjson = bytearray()  # grown in place: no second copy of ~1.3 GB at 1M events
        for d in p.wrap(events):
            ndjson += orjson.dumps(d)
            ndjson += b"\n"
        event_bytes = len(ndjson) - n_events  # orjson bytes, without the newlines
        p.finish(f", {event_bytes / MB:,.1f} MB, {event_bytes / max(1, n_events):,.0f} B/doc")
        p = Progress("gen tsbs", n_tsbs, unit="rows")
        tsbs = list(p.wrap(datagen.tsbs_cpu_rows(n_tsbs, seed=seed)))
        p.finish()
    return events, ndjson, event_bytes, tsbs, time.perf_counter() - t0


# ---------------------------------------------------------------------------
# rtindex
# ---------------------------------------------------------------------------


def bench_rtindex(events: list[dict], tsbs: list[dict], event_bytes: int, args: argparse.Namespace,
                  workdir: str) -> dict:
    import rtindex
    from rtindex import _impl

    res: dict[str, Any] = {"rtindex_impl": _impl.IMPLEMENTATION}
    path = os.path.join(workdir, "rtindex")
    B, S = args.batch, args.shards
    db = rtindex.open(path)
    try:
        with RssSampler() as rs:
            coll = db.create_collection("events", shards=S)
            log(f"rtindex: ingesting {len(events):,} events ({S} shards, batch {B}) ...")
            p = Progress("rtindex events", len(events))
            t0 = time.perf_counter()
            stats = coll.ingest(p.wrap(events), batch_size=B)
            t_ingest = time.perf_counter() - t0
            coll.flush()
            dt = time.perf_counter() - t0
            p.finish(f" (ingest {t_ingest:.2f}s + flush {dt - t_ingest:.2f}s)")
        n, errors = stats.n, stats.errors
        if errors:
            log(f"!! rtindex: {len(errors):,} ingest errors, e.g. {errors[:3]}")
        if n != len(events) - len(errors):
            log(f"!! rtindex: stats.n={n:,} but {len(events):,} docs given and {len(errors)} errors")
        res.update({
            "events_docs_per_s": n / dt,
            "events_mb_per_s": event_bytes * (n / max(1, len(events))) / MB / dt,
            "rtindex_events_seconds": dt,
            "rtindex_events_flush_seconds": dt - t_ingest,
            "rtindex_events_n": n,
            "rtindex_events_errors": len(errors),
            "rtindex_stored_mb": stats.bytes / MB,
            "rtindex_rss_before_mb": rs.start_mb,
            "rtindex_rss_peak_mb": rs.peak_mb,
            "rtindex_rss_after_mb": rs.end_mb,
            "rtindex_rss_increase_mb": rs.peak_mb - rs.start_mb,
        })
        del stats
        gc.collect()

        if tsbs:
            cpu = db.create_collection("cpu", shards=S)
            log(f"rtindex: ingesting {len(tsbs):,} TSBS rows ...")
            p = Progress("rtindex tsbs", len(tsbs), unit="rows")
            t0 = time.perf_counter()
            stats = cpu.ingest(p.wrap(tsbs), batch_size=B)
            cpu.flush()
            dt = time.perf_counter() - t0
            p.finish()
            n, errors = stats.n, stats.errors
            if errors:
                log(f"!! rtindex cpu: {len(errors):,} ingest errors, e.g. {errors[:3]}")
            res.update({"tsbs_rows_per_s": n / dt, "rtindex_tsbs_seconds": dt, "rtindex_tsbs_errors": len(errors)})
            del stats
    finally:
        db.close()
    res["rtindex_disk_mb"] = dir_size_mb(path)
    return res


# ---------------------------------------------------------------------------
# SQLite
# ---------------------------------------------------------------------------

_TSBS_TAGS = ("hostname", "region", "datacenter", "rack", "os", "arch", "team", "service",
              "service_version", "service_environment")
_TSBS_METRICS = ("usage_user", "usage_system", "usage_idle", "usage_nice", "usage_iowait", "usage_irq",
                 "usage_softirq", "usage_steal", "usage_guest", "usage_guest_nice")


def bench_sqlite(events: list[dict], tsbs: list[dict], event_bytes: int, args: argparse.Namespace,
                 workdir: str) -> dict:
    path = os.path.join(workdir, "sqlite.db")
    B = args.batch
    con = sqlite3.connect(path, isolation_level=None)  # explicit transactions
    res: dict[str, Any] = {"sqlite_version": sqlite3.sqlite_version}
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        con.executescript("""
            CREATE TABLE events (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
            CREATE INDEX events_process_by ON events (json_extract(doc, '$.processBy'));
            CREATE INDEX events_generator ON events (json_extract(doc, '$.generator_identifier'));
            CREATE INDEX events_event_time ON events (json_extract(doc, '$._event_time'));
            CREATE TABLE event_emails (email TEXT NOT NULL, id TEXT NOT NULL);
            CREATE INDEX event_emails_email ON event_emails (email);
        """)
        dumps = orjson.dumps
        log(f"sqlite: inserting {len(events):,} events (batch {B}) ...")
        p = Progress("sqlite events", len(events))
        t0 = time.perf_counter()
        done = 0
        for batch in batches(events, B):
            rows = [(d["_id"], dumps(d).decode()) for d in batch]
            email_rows = [(e, d["_id"]) for d in batch for e in d.get("emails") or ()]
            con.execute("BEGIN")
            con.executemany("INSERT OR REPLACE INTO events (id, doc) VALUES (?, ?)", rows)
            con.executemany("INSERT INTO event_emails (email, id) VALUES (?, ?)", email_rows)
            con.execute("COMMIT")
            done += len(batch)
            p.update(done)
        dt = time.perf_counter() - t0
        p.finish()
        res.update({
            "sqlite_events_docs_per_s": len(events) / dt,
            "sqlite_events_mb_per_s": event_bytes / MB / dt,
            "sqlite_events_seconds": dt,
        })

        if tsbs:
            cols = _TSBS_TAGS + ("ts",) + _TSBS_METRICS
            con.executescript(
                "CREATE TABLE cpu (" + ", ".join(
                    [f"{c} TEXT" for c in _TSBS_TAGS] + ["ts INTEGER NOT NULL"]
                    + [f"{m} INTEGER" for m in _TSBS_METRICS]
                ) + "); CREATE INDEX cpu_host_ts ON cpu (hostname, ts);"
            )
            sql = f"INSERT INTO cpu ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
            log(f"sqlite: inserting {len(tsbs):,} TSBS rows ...")
            p = Progress("sqlite tsbs", len(tsbs), unit="rows")
            t0 = time.perf_counter()
            done = 0
            for batch in batches(tsbs, B):
                rows = [tuple(r["tags"][t] for t in _TSBS_TAGS) + (r["ts"],) + tuple(r[m] for m in _TSBS_METRICS)
                        for r in batch]
                con.execute("BEGIN")
                con.executemany(sql, rows)
                con.execute("COMMIT")
                done += len(batch)
                p.update(done)
            dt = time.perf_counter() - t0
            p.finish()
            res.update({"sqlite_tsbs_rows_per_s": len(tsbs) / dt, "sqlite_tsbs_seconds": dt})
    finally:
        con.close()
    res["sqlite_disk_mb"] = dir_size_mb(workdir)
    return res


# ---------------------------------------------------------------------------
# DuckDB
# ---------------------------------------------------------------------------


def _arrow_schema(sample: list[dict]):
    """Schema a user would settle on: the union of the sample's fields, nested objects as
    structs, arrays as lists (inferred once, outside the timing)."""
    import pyarrow as pa

    t = pa.array(sample).type  # struct over the union of the sample's keys
    fields = []
    for f in t:
        if pa.types.is_null(f.type):  # never non-null in the sample: keep it as text
            f = pa.field(f.name, pa.string())
        fields.append(f)
    return pa.schema(fields)


def _duckdb_load(con, table: str, rows: list[dict], B: int, label: str, unit: str) -> float:
    import pyarrow as pa

    schema = _arrow_schema(rows[:10_000])
    con.register("batch_tbl", schema.empty_table())
    con.execute(f"CREATE TABLE {table} AS SELECT * FROM batch_tbl")
    con.unregister("batch_tbl")
    p = Progress(label, len(rows), unit=unit)
    t0 = time.perf_counter()
    done = 0
    for batch in batches(rows, B):
        tbl = pa.Table.from_pylist(batch, schema=schema)
        con.register("batch_tbl", tbl)
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM batch_tbl")
        con.unregister("batch_tbl")
        done += len(batch)
        p.update(done)
    con.execute("CHECKPOINT")
    dt = time.perf_counter() - t0
    p.finish()
    return dt


def bench_duckdb(events: list[dict], tsbs: list[dict], event_bytes: int, args: argparse.Namespace,
                 workdir: str) -> dict:
    import duckdb

    path = os.path.join(workdir, "duck.duckdb")
    con = duckdb.connect(path)
    res: dict[str, Any] = {"duckdb_version": duckdb.__version__}
    try:
        log(f"duckdb: inserting {len(events):,} events (batch {args.batch}) ...")
        dt = _duckdb_load(con, "events", events, args.batch, "duckdb events", "docs")
        n = con.execute("SELECT count(*) FROM events").fetchall()[0][0]
        if n != len(events):
            log(f"!! duckdb: events has {n:,} rows, expected {len(events):,}")
        res.update({
            "duckdb_events_docs_per_s": len(events) / dt,
            "duckdb_events_mb_per_s": event_bytes / MB / dt,
            "duckdb_events_seconds": dt,
        })
        if tsbs:
            log(f"duckdb: inserting {len(tsbs):,} TSBS rows ...")
            dt = _duckdb_load(con, "cpu", tsbs, args.batch, "duckdb tsbs", "rows")
            res.update({"duckdb_tsbs_rows_per_s": len(tsbs) / dt, "duckdb_tsbs_seconds": dt})
    finally:
        con.close()
    res["duckdb_disk_mb"] = dir_size_mb(workdir)
    return res


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _fmt(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _ratio(a: Any, b: Any) -> str:
    if a is None or b is None or not b:
        return "-"
    return f"{a / b:.2f}x"


def print_table(r: dict) -> None:
    g = r.get
    rows = [
        ("events docs/s", g("events_docs_per_s"), g("sqlite_events_docs_per_s"), g("duckdb_events_docs_per_s"), 0),
        ("events MB/s", g("events_mb_per_s"), g("sqlite_events_mb_per_s"), g("duckdb_events_mb_per_s"), 2),
        ("tsbs rows/s", g("tsbs_rows_per_s"), g("sqlite_tsbs_rows_per_s"), g("duckdb_tsbs_rows_per_s"), 0),
        ("on disk MB (all)", g("rtindex_disk_mb"), g("sqlite_disk_mb"), g("duckdb_disk_mb"), 1),
    ]
    hdr = f"{'metric':<18} {'rtindex':>12} {'sqlite':>12} {'duckdb':>12} {'rt/sqlite':>10} {'rt/duckdb':>10}"
    print()
    print(f"Ingest benchmark: {r['n_events']:,} events ({r['event_bytes_per_doc']:.0f} B/doc, "
          f"{r['event_mb']:.1f} MB), {r['n_tsbs']:,} TSBS rows; shards={r['shards']}, batch={r['batch']}")
    print(hdr)
    print("-" * len(hdr))
    for name, a, b, c, d in rows:
        print(f"{name:<18} {_fmt(a, d):>12} {_fmt(b, d):>12} {_fmt(c, d):>12} {_ratio(a, b):>10} {_ratio(a, c):>10}")
    print("-" * len(hdr))
    if g("rtindex_rss_peak_mb") is not None:
        print(f"rtindex RSS during events ingest: {g('rtindex_rss_before_mb'):,.0f} MB -> peak "
              f"{g('rtindex_rss_peak_mb'):,.0f} MB (+{g('rtindex_rss_increase_mb'):,.0f} MB)")
    for k in ("rtindex_error", "sqlite_error", "duckdb_error"):
        if g(k):
            print(f"{k}: {g(k)}")
    print(f"process peak RSS: {g('peak_rss_mb'):,.0f} MB (includes the in-memory input data: "
          f"{g('data_rss_mb'):,.0f} MB after generation); data generation {g('gen_seconds'):.1f}s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k events, 300k TSBS rows (< 2 min)")
    ap.add_argument("--events", type=int, default=None, help="number of events (default 1,000,000)")
    ap.add_argument("--tsbs", type=int, default=None, help="number of TSBS cpu rows (default 2,000,000)")
    ap.add_argument("--shards", type=int, default=4, help="rtindex shards per collection (default 4)")
    ap.add_argument("--batch", type=int, default=10_000, help="batch / transaction size (default 10,000)")
    ap.add_argument("--dir", default=None, help="parent of the temporary working directory (default /tmp)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--systems", default="rtindex,sqlite,duckdb",
                    help="comma-separated subset of rtindex,sqlite,duckdb")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    args = ap.parse_args(argv)

    n_events = args.events if args.events is not None else (100_000 if args.quick else 1_000_000)
    n_tsbs = args.tsbs if args.tsbs is not None else (300_000 if args.quick else 2_000_000)
    systems = {s.strip() for s in args.systems.split(",") if s.strip()}
    unknown = systems - {"rtindex", "sqlite", "duckdb"}
    if unknown:
        ap.error(f"unknown systems: {', '.join(sorted(unknown))}")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="rtindex-ingest-", dir=args.dir)
    t_start = time.perf_counter()
    log(f"ingest benchmark: {n_events:,} events, {n_tsbs:,} TSBS rows, shards={args.shards}, "
        f"batch={args.batch}, dir={workdir}")

    results: dict[str, Any] = {}
    try:
        events, ndjson, event_bytes, tsbs, gen_s = generate(n_events, n_tsbs, args.seed)
        data_rss = rss_mb()
        log(f"data ready in {gen_s:.1f}s; RSS {data_rss:,.0f} MB")
        # Fingerprints to detect a system that mutates the input documents.
        step = max(1, n_events // 1000)
        check_idx = list(range(0, n_events, step))
        fingerprint = [orjson.dumps(events[i]) for i in check_idx]

        def restore_if_mutated(who: str) -> None:
            nonlocal events
            if any(orjson.dumps(events[i]) != fp for i, fp in zip(check_idx, fingerprint)):
                log(f"!! {who} mutated the input documents; reloading them from the NDJSON copy")
                gc.unfreeze()
                events = [orjson.loads(line) for line in ndjson.splitlines()]
                gc.collect()
                gc.freeze()

        for name, fn in (("rtindex", bench_rtindex), ("sqlite", bench_sqlite), ("duckdb", bench_duckdb)):
            if name not in systems:
                continue
            sub = os.path.join(workdir, name)
            os.makedirs(sub, exist_ok=True)
            run_guarded(name, lambda: fn(events, tsbs, event_bytes, args, sub), results)
            restore_if_mutated(name)
            if not args.keep:
                shutil.rmtree(sub, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"kept {workdir}")

    out: dict[str, Any] = {
        "events_docs_per_s": results.get("events_docs_per_s"),
        "events_mb_per_s": results.get("events_mb_per_s"),
        "tsbs_rows_per_s": results.get("tsbs_rows_per_s"),
        "sqlite_events_docs_per_s": results.get("sqlite_events_docs_per_s"),
        "duckdb_events_docs_per_s": results.get("duckdb_events_docs_per_s"),
        "peak_rss_mb": peak_rss_mb(),
    }
    for k in sorted(results):
        if k not in out:
            out[k] = results[k]
    out.update({
        "n_events": n_events,
        "n_tsbs": n_tsbs,
        "shards": args.shards,
        "batch": args.batch,
        "event_mb": event_bytes / MB,
        "event_bytes_per_doc": event_bytes / max(1, n_events),
        "data_rss_mb": data_rss,
        "gen_seconds": gen_s,
        "total_seconds": time.perf_counter() - t_start,
    })
    for a, b in (("events_docs_per_s", "sqlite_events_docs_per_s"), ("events_docs_per_s", "duckdb_events_docs_per_s"),
                 ("tsbs_rows_per_s", "sqlite_tsbs_rows_per_s"), ("tsbs_rows_per_s", "duckdb_tsbs_rows_per_s")):
        if out.get(a) and out.get(b):
            out[f"ratio_{a.split('_')[0]}_vs_{b.split('_')[0]}"] = out[a] / out[b]
    print_table(out)
    out = {k: ((round(v, 3) if math.isfinite(v) else None) if isinstance(v, float) else v) for k, v in out.items()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
