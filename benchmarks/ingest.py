#!/usr/bin/env python
"""Ingest throughput and size on disk: rtindex vs SQLite (JSON + expression indexes) vs DuckDB
(typed tables) vs chDB (in-process ClickHouse, MergeTree tables).

    python benchmarks/ingest.py [--quick] [--events N] [--tsbs N] [--clicks N] [--shards S]
                                [--batch B] [--systems rtindex,sqlite,duckdb,chdb] [--dir DIR] [--keep]

Data (benchmarks/datagen.py) is generated once, in memory, before anything is timed:
RockBench-style events (~1.25 KB, ~60 leaf fields; default 1,000,000, --quick 100,000), also
serialized to NDJSON (which counts the input bytes and is the NDJSON input), TSBS ``cpu``
rows (default 2,000,000, --quick 300,000) and ``product_clicks`` rows (six small flat
fields; default 10,000,000, --quick 1,000,000). The size of each data set as JSON (orjson,
no newlines) is measured too. Then, one system after the other, each data set in turn, a
batch of ``--batch`` documents per call or transaction:

* rtindex (one database, ``--shards`` shards per collection; each time includes
  ``coll.flush()``, which waits for background sealing and merging):
  - "events": ``coll.ingest(docs, batch_size=B)`` over the dicts (the notebook case);
  - "events_ndjson": the same events as NDJSON bytes (the service case), one
    ``coll.ingest(view)`` per ``B`` whole lines, ``view`` a memoryview of the NDJSON buffer;
  - "cpu": the TSBS rows as dicts;
  - "product_clicks": the clicks as dicts;
  - "product_clicks_arrow": the clicks as one pyarrow Table (built from the dicts before
    the timing), ``coll.ingest(table, batch_size=B)``, converted column-wise by rtindex.
* SQLite (a file per data set, WAL, synchronous=NORMAL; indexes exist before the load, as
  a real-time index needs them; one transaction per batch, serialization included):
  events as ``events(id TEXT PRIMARY KEY, doc TEXT)`` with expression indexes on
  json_extract(doc, '$.processBy' / '$.generator_identifier' / '$._event_time') and a side
  table ``event_emails(email, id)`` indexed on email (how arrays get indexed in SQLite),
  from the dicts (``orjson.dumps`` per document) and, in a second file, from the NDJSON
  lines (each line's text is stored; ``_id`` and the emails are read by json_extract and
  json_each, so no Python parse); TSBS rows in a typed table indexed on (hostname, ts);
  clicks in a typed table (``executemany`` of tuples) indexed on city, what the CTR query
  of benchmarks/query.py filters on.
* DuckDB (a file per data set): typed tables whose schema is inferred once from a sample
  (scalars -> typed columns, objects -> STRUCT, arrays -> LIST); per batch
  ``pa.Table.from_pylist`` + ``INSERT INTO ... BY NAME SELECT * FROM batch`` (conversion
  included), then CHECKPOINT.
* chDB (``chdb.session.Session`` in the working directory; skipped, figures null, when
  ``import chdb`` fails): MergeTree tables with the schema ClickHouse infers from a sample,
  loaded as benchmarks/query.py loads them (``INSERT ... FORMAT JSONEachRow`` per batch,
  serialization included, then ``OPTIMIZE TABLE ... FINAL``): events ORDER BY processBy
  with a bloom filter index on emails, TSBS rows ORDER BY (tags.hostname, ts), clicks
  ORDER BY (city, product_id).

On disk, per system and data set (``<system>_<events|tsbs|clicks>_disk_mb``), is measured
once the data is settled: rtindex's collection directories after ``db.close()`` (which
flushes RocksDB's memtables), SQLite's and DuckDB's files after the connection is closed,
chDB's active parts (``system.parts``) after OPTIMIZE FINAL. ``<system>_disk_mb`` is their
sum, the same data in every system (rtindex's NDJSON and Arrow copies are reported on their
own); ``rtindex_<set>_disk_vs_json`` compares with the data's size as JSON
(``<set>_json_mb``).

Prints progress to stderr, a table with the issue's targets to stdout, and as the LAST
stdout line one JSON object (events_docs_per_s, events_ndjson_docs_per_s, tsbs_rows_per_s,
clicks_rows_per_s, clicks_arrow_rows_per_s, the same prefixed sqlite_ / duckdb_ / chdb_,
the ratios to the peers (ratio_events_vs_sqlite, ratio_clicks_arrow_vs_sqlite, ...), disk
and JSON sizes, targets_missed (the targets measured and not met), peak_rss_mb,
...). Values are null for a system or a phase that could not run: its error is in
``<system>_error`` or ``<system>_<phase>_error`` (phase: events, events_ndjson, tsbs,
clicks, clicks_arrow), and the other phases and systems still run.
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
from dataclasses import dataclass
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


def files_mb(*paths: str) -> float:
    """The size of those of ``paths`` that exist (a database file and its write-ahead log)."""
    return sum(os.path.getsize(p) for p in paths if os.path.exists(p)) / MB


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


DATA_SETS = ("events", "tsbs", "clicks")  # the data every system loads (disk totals are over these)


@dataclass
class Data:
    """The generated input, shared by every system."""

    events: list[dict]
    ndjson: bytearray  # the events, one JSON document a line
    ndjson_cuts: list[int]  # batch i of the NDJSON is ndjson[cuts[i]:cuts[i + 1]]: whole lines
    batch: int  # lines per NDJSON batch (the last one may have fewer)
    tsbs: list[dict]
    clicks: list[dict]
    json_bytes: dict[str, int]  # data set -> its size as JSON (orjson, without newlines)

    def ndjson_batches(self) -> Iterator[tuple[memoryview, int]]:
        """(whole lines, how many) per batch: views, so no copy of the buffer is made."""
        with memoryview(self.ndjson) as view:  # released after: the bytearray can be resized again
            for i, (a, b) in enumerate(zip(self.ndjson_cuts, self.ndjson_cuts[1:])):
                yield view[a:b], min(self.batch, len(self.events) - i * self.batch)


def _json_bytes(label: str, rows: list[dict], unit: str) -> int:
    p = Progress(f"json size {label}", len(rows), unit=unit)
    dumps = orjson.dumps
    n = sum(len(dumps(r)) for r in p.wrap(rows))
    p.finish(f", {n / MB:,.1f} MB")
    return n


def generate(n_events: int, n_tsbs: int, n_clicks: int, batch: int, seed: int) -> tuple[Data, float]:
    t0 = time.perf_counter()
    with generating_input():
        p = Progress("gen events", n_events)
        events = list(p.wrap(datagen.rockbench_events(n_events, seed=seed, event_time_us=EVENT_TIME_BASE_US)))
        p.finish()
        p = Progress("gen ndjson", n_events)
        ndjson = bytearray()  # grown in place: no second copy of ~1.3 GB at 1M events
        cuts = [0]
        for i, d in enumerate(p.wrap(events), 1):
            ndjson += orjson.dumps(d)
            ndjson += b"\n"
            if i % batch == 0 or i == n_events:
                cuts.append(len(ndjson))
        event_bytes = len(ndjson) - n_events  # orjson bytes, without the newlines
        p.finish(f", {event_bytes / MB:,.1f} MB, {event_bytes / max(1, n_events):,.0f} B/doc")
        p = Progress("gen tsbs", n_tsbs, unit="rows")
        tsbs = list(p.wrap(datagen.tsbs_cpu_rows(n_tsbs, seed=seed)))
        p.finish()
        p = Progress("gen clicks", n_clicks, unit="rows")
        clicks = list(p.wrap(datagen.product_clicks(n_clicks, seed=seed)))
        p.finish()
        json_bytes = {"events": event_bytes, "tsbs": _json_bytes("tsbs", tsbs, "rows"),
                      "clicks": _json_bytes("clicks", clicks, "rows")}
    return Data(events, ndjson, cuts, batch, tsbs, clicks, json_bytes), time.perf_counter() - t0


class InputGuard:
    """Detects a system that mutates the input documents (a sample of each data set,
    serialized before), and puts the originals back: events from the NDJSON copy, TSBS
    and clicks rows generated again (the generators are deterministic)."""

    def __init__(self, data: Data, seed: int):
        self.data, self.seed = data, seed
        self.sample = {name: self._fingerprint(getattr(data, name)) for name in DATA_SETS}

    @staticmethod
    def _fingerprint(rows: list[dict]) -> list[tuple[int, bytes]]:
        step = max(1, len(rows) // 1000)
        return [(i, orjson.dumps(rows[i])) for i in range(0, len(rows), step)]

    def restore_if_mutated(self, who: str) -> None:
        for name, sample in self.sample.items():
            rows = getattr(self.data, name)
            if all(orjson.dumps(rows[i]) == fp for i, fp in sample):
                continue
            log(f"!! {who} mutated the input {name}; putting the originals back")
            gc.unfreeze()
            if name == "events":
                fresh = [orjson.loads(line) for line in self.data.ndjson.splitlines()]
            elif name == "tsbs":
                fresh = list(datagen.tsbs_cpu_rows(len(rows), seed=self.seed))
            else:
                fresh = list(datagen.product_clicks(len(rows), seed=self.seed))
            setattr(self.data, name, fresh)
            del rows, fresh
            gc.collect()
            gc.freeze()


def _checked(who: str, n: int, errors: list, given: int) -> None:
    if errors:
        log(f"!! {who}: {len(errors):,} ingest errors, e.g. {errors[:3]}")
    if n != given - len(errors):
        log(f"!! {who}: stats.n={n:,} but {given:,} documents given and {len(errors):,} errors")


# ---------------------------------------------------------------------------
# rtindex
# ---------------------------------------------------------------------------


def _rtindex_load(coll: Any, label: str, total: int, unit: str,
                  ingest: Callable[[Progress], tuple[int, list, int]]) -> tuple[int, list, int, float, float]:
    """Time ``ingest(progress) -> (n, errors, stored bytes)`` and the ``coll.flush()`` after
    it; returns (n, errors, stored bytes, seconds with the flush, seconds of the flush)."""
    p = Progress(label, total, unit=unit)
    t0 = time.perf_counter()
    n, errors, stored = ingest(p)
    t_ingest = time.perf_counter() - t0
    coll.flush()
    dt = time.perf_counter() - t0
    p.done = n
    p.finish(f" (ingest {t_ingest:.2f}s + flush {dt - t_ingest:.2f}s)")
    _checked(label, n, errors, total)
    return n, errors, stored, dt, dt - t_ingest


def bench_rtindex(data: Data, args: argparse.Namespace, workdir: str) -> dict:
    import pyarrow as pa

    import rtindex
    from rtindex import _impl

    res: dict[str, Any] = {"rtindex_impl": _impl.IMPLEMENTATION}
    path = os.path.join(workdir, "rtindex")
    B, S = args.batch, args.shards
    events, tsbs, clicks = data.events, data.tsbs, data.clicks
    event_bytes = data.json_bytes["events"]
    dirs: dict[str, str] = {}  # phase -> its collection's directory, measured after close
    db = rtindex.open(path)

    def collection(name: str, key: str) -> Any:
        coll = db.create_collection(name, shards=S)
        dirs[key] = coll.path
        return coll

    def dicts(coll: Any, rows: list[dict]) -> Callable[[Progress], tuple[int, list, int]]:
        def ingest(p: Progress) -> tuple[int, list, int]:
            stats = coll.ingest(p.wrap(rows), batch_size=B)
            return stats.n, stats.errors, stats.bytes
        return ingest

    def events_phase() -> dict:
        coll = collection("events", "events")
        log(f"rtindex: ingesting {len(events):,} events as dicts ({S} shards, batch {B}) ...")
        with RssSampler() as rs:
            n, errors, stored, dt, t_flush = _rtindex_load(coll, "rtindex events", len(events), "docs",
                                                           dicts(coll, events))
        return {
            "events_docs_per_s": n / dt,
            "events_mb_per_s": event_bytes * (n / max(1, len(events))) / MB / dt,
            "rtindex_events_seconds": dt,
            "rtindex_events_flush_seconds": t_flush,
            "rtindex_events_n": n,
            "rtindex_events_errors": len(errors),
            "rtindex_stored_mb": stored / MB,
            "rtindex_rss_before_mb": rs.start_mb,
            "rtindex_rss_peak_mb": rs.peak_mb,
            "rtindex_rss_after_mb": rs.end_mb,
            "rtindex_rss_increase_mb": rs.peak_mb - rs.start_mb,
        }

    def events_ndjson_phase() -> dict:
        coll = collection("events_ndjson", "events_ndjson")
        log(f"rtindex: ingesting the {len(events):,} events as NDJSON bytes, {B} lines a call ...")

        def ingest(p: Progress) -> tuple[int, list, int]:
            n, errors, stored, given = 0, [], 0, 0
            for lines, count in data.ndjson_batches():
                stats = coll.ingest(lines, batch_size=B)
                n, stored = n + stats.n, stored + stats.bytes
                errors += stats.errors
                given += count
                p.update(given)
            return n, errors, stored

        n, errors, _, dt, t_flush = _rtindex_load(coll, "rtindex events ndjson", len(events), "docs", ingest)
        return {
            "events_ndjson_docs_per_s": n / dt,
            "events_ndjson_mb_per_s": event_bytes * (n / max(1, len(events))) / MB / dt,
            "rtindex_events_ndjson_seconds": dt,
            "rtindex_events_ndjson_flush_seconds": t_flush,
            "rtindex_events_ndjson_errors": len(errors),
        }

    def tsbs_phase() -> dict:
        coll = collection("cpu", "tsbs")
        log(f"rtindex: ingesting {len(tsbs):,} TSBS rows ...")
        n, errors, _, dt, _ = _rtindex_load(coll, "rtindex tsbs", len(tsbs), "rows", dicts(coll, tsbs))
        return {"tsbs_rows_per_s": n / dt, "rtindex_tsbs_seconds": dt, "rtindex_tsbs_errors": len(errors)}

    def clicks_phase() -> dict:
        coll = collection("product_clicks", "clicks")
        log(f"rtindex: ingesting {len(clicks):,} product_clicks rows as dicts ...")
        n, errors, _, dt, _ = _rtindex_load(coll, "rtindex clicks", len(clicks), "rows", dicts(coll, clicks))
        return {"clicks_rows_per_s": n / dt, "rtindex_clicks_seconds": dt, "rtindex_clicks_errors": len(errors)}

    def clicks_arrow_phase() -> dict:
        t0 = time.perf_counter()
        table = pa.Table.from_pylist(clicks)  # what the user has in hand: not timed
        t_table = time.perf_counter() - t0
        log(f"rtindex: ingesting the {len(clicks):,} product_clicks rows as a pyarrow Table "
            f"({table.nbytes / MB:,.1f} MB, built in {t_table:.1f}s) ...")
        coll = collection("product_clicks_arrow", "clicks_arrow")

        def ingest(p: Progress) -> tuple[int, list, int]:
            stats = coll.ingest(table, batch_size=B)
            return stats.n, stats.errors, stats.bytes

        n, errors, _, dt, _ = _rtindex_load(coll, "rtindex clicks arrow", len(clicks), "rows", ingest)
        return {"clicks_arrow_rows_per_s": n / dt, "rtindex_clicks_arrow_seconds": dt,
                "rtindex_clicks_arrow_errors": len(errors), "rtindex_clicks_arrow_table_seconds": t_table}

    try:
        run_guarded("rtindex_events", events_phase, res)
        run_guarded("rtindex_events_ndjson", events_ndjson_phase, res)
        if tsbs:
            run_guarded("rtindex_tsbs", tsbs_phase, res)
        if clicks:
            run_guarded("rtindex_clicks", clicks_phase, res)
            run_guarded("rtindex_clicks_arrow", clicks_arrow_phase, res)
    finally:
        db.close()  # flushes RocksDB's memtables: what is on disk is now settled
    for key, d in dirs.items():
        if f"rtindex_{key}_error" not in res:  # a collection whose load failed is not measured
            res[f"rtindex_{key}_disk_mb"] = dir_size_mb(d)
    return res


# ---------------------------------------------------------------------------
# SQLite
# ---------------------------------------------------------------------------

_TSBS_TAGS = ("hostname", "region", "datacenter", "rack", "os", "arch", "team", "service",
              "service_version", "service_environment")
_TSBS_METRICS = ("usage_user", "usage_system", "usage_idle", "usage_nice", "usage_iowait", "usage_irq",
                 "usage_softirq", "usage_steal", "usage_guest", "usage_guest_nice")
_CLICKS_COLS = ("_id", "city", "product_id", "clicks", "impressions", "ts")

_SQLITE_EVENTS = """
    CREATE TABLE events (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
    CREATE INDEX events_process_by ON events (json_extract(doc, '$.processBy'));
    CREATE INDEX events_generator ON events (json_extract(doc, '$.generator_identifier'));
    CREATE INDEX events_event_time ON events (json_extract(doc, '$._event_time'));
    CREATE TABLE event_emails (email TEXT NOT NULL, id TEXT NOT NULL);
    CREATE INDEX event_emails_email ON event_emails (email);
"""


@contextlib.contextmanager
def _sqlite_file(path: str, schema: str, res: dict, disk_key: str) -> Iterator[sqlite3.Connection]:
    """A new SQLite database file with ``schema``; once it is closed (the WAL checkpointed
    into the file and removed), its size goes to ``res[disk_key]``."""
    con = sqlite3.connect(path, isolation_level=None)  # explicit transactions
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        con.executescript(schema)
        yield con
    finally:
        con.close()
    res[disk_key] = files_mb(path, path + "-wal")


def _sqlite_load(con: sqlite3.Connection, label: str, total: int, unit: str, items: Iterable[Any],
                 write: Callable[[Any], int]) -> float:
    """Time ``write(item) -> rows written`` of each of ``items``, a transaction each."""
    p = Progress(label, total, unit=unit)
    t0 = time.perf_counter()
    done = 0
    for item in items:
        con.execute("BEGIN")
        done += write(item)
        con.execute("COMMIT")
        p.update(done)
    dt = time.perf_counter() - t0
    p.finish()
    return dt


def bench_sqlite(data: Data, args: argparse.Namespace, workdir: str) -> dict:
    B = args.batch
    res: dict[str, Any] = {"sqlite_version": sqlite3.sqlite_version}
    events, tsbs, clicks = data.events, data.tsbs, data.clicks
    event_bytes = data.json_bytes["events"]
    dumps = orjson.dumps

    def events_phase() -> dict:
        with _sqlite_file(os.path.join(workdir, "events.db"), _SQLITE_EVENTS, res, "sqlite_events_disk_mb") as con:
            def write(batch: list[dict]) -> int:
                rows = [(d["_id"], dumps(d).decode()) for d in batch]
                email_rows = [(e, d["_id"]) for d in batch for e in d.get("emails") or ()]
                con.executemany("INSERT OR REPLACE INTO events (id, doc) VALUES (?, ?)", rows)
                con.executemany("INSERT INTO event_emails (email, id) VALUES (?, ?)", email_rows)
                return len(batch)

            log(f"sqlite: inserting {len(events):,} events from dicts (batch {B}) ...")
            dt = _sqlite_load(con, "sqlite events", len(events), "docs", batches(events, B), write)
        return {"sqlite_events_docs_per_s": len(events) / dt, "sqlite_events_mb_per_s": event_bytes / MB / dt,
                "sqlite_events_seconds": dt}

    def events_ndjson_phase() -> dict:
        # Each line's text is stored as it came; SQLite reads the _id and emails out of it.
        with _sqlite_file(os.path.join(workdir, "events_ndjson.db"), _SQLITE_EVENTS, res,
                          "sqlite_events_ndjson_disk_mb") as con:
            def write(batch: tuple[memoryview, int]) -> int:
                rows = [(line,) for line in str(batch[0], "utf-8").split("\n")[:-1]]
                con.executemany("INSERT OR REPLACE INTO events (id, doc) VALUES (json_extract(?1, '$._id'), ?1)",
                                rows)
                con.executemany("INSERT INTO event_emails (email, id) "
                                "SELECT value, json_extract(?1, '$._id') FROM json_each(?1, '$.emails')", rows)
                return len(rows)

            log(f"sqlite: inserting the {len(events):,} events from NDJSON lines ...")
            dt = _sqlite_load(con, "sqlite events ndjson", len(events), "docs", data.ndjson_batches(), write)
            n_rows, n_emails = (con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                                for t in ("events", "event_emails"))
        want_emails = sum(len(d.get("emails") or ()) for d in events)
        if n_rows != len(events) or n_emails != want_emails:
            log(f"!! sqlite ndjson: {n_rows:,} events and {n_emails:,} emails stored, "
                f"expected {len(events):,} and {want_emails:,}")
        return {"sqlite_events_ndjson_docs_per_s": len(events) / dt,
                "sqlite_events_ndjson_mb_per_s": event_bytes / MB / dt, "sqlite_events_ndjson_seconds": dt}

    def tsbs_phase() -> dict:
        cols = _TSBS_TAGS + ("ts",) + _TSBS_METRICS
        schema = ("CREATE TABLE cpu (" + ", ".join([f"{c} TEXT" for c in _TSBS_TAGS] + ["ts INTEGER NOT NULL"]
                                                   + [f"{m} INTEGER" for m in _TSBS_METRICS])
                  + "); CREATE INDEX cpu_host_ts ON cpu (hostname, ts);")
        sql = f"INSERT INTO cpu ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
        with _sqlite_file(os.path.join(workdir, "tsbs.db"), schema, res, "sqlite_tsbs_disk_mb") as con:
            def write(batch: list[dict]) -> int:
                con.executemany(sql, [tuple(r["tags"][t] for t in _TSBS_TAGS) + (r["ts"],)
                                      + tuple(r[m] for m in _TSBS_METRICS) for r in batch])
                return len(batch)

            log(f"sqlite: inserting {len(tsbs):,} TSBS rows ...")
            dt = _sqlite_load(con, "sqlite tsbs", len(tsbs), "rows", batches(tsbs, B), write)
        return {"sqlite_tsbs_rows_per_s": len(tsbs) / dt, "sqlite_tsbs_seconds": dt}

    def clicks_phase() -> dict:
        schema = """
            CREATE TABLE product_clicks (id TEXT PRIMARY KEY, city TEXT NOT NULL, product_id INTEGER NOT NULL,
                                         clicks INTEGER NOT NULL, impressions INTEGER NOT NULL, ts INTEGER NOT NULL);
            CREATE INDEX product_clicks_city ON product_clicks (city);
        """
        sql = f"INSERT OR REPLACE INTO product_clicks VALUES ({', '.join('?' * len(_CLICKS_COLS))})"
        with _sqlite_file(os.path.join(workdir, "clicks.db"), schema, res, "sqlite_clicks_disk_mb") as con:
            def write(batch: list[dict]) -> int:
                con.executemany(sql, [tuple(r[c] for c in _CLICKS_COLS) for r in batch])
                return len(batch)

            log(f"sqlite: inserting {len(clicks):,} product_clicks rows (typed table, executemany) ...")
            dt = _sqlite_load(con, "sqlite clicks", len(clicks), "rows", batches(clicks, B), write)
        return {"sqlite_clicks_rows_per_s": len(clicks) / dt, "sqlite_clicks_seconds": dt}

    run_guarded("sqlite_events", events_phase, res)
    run_guarded("sqlite_events_ndjson", events_ndjson_phase, res)
    if tsbs:
        run_guarded("sqlite_tsbs", tsbs_phase, res)
    if clicks:
        run_guarded("sqlite_clicks", clicks_phase, res)
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


# Objects become named Tuples and arrays Arrays; a field absent from a row reads as its
# type's default instead of NULL (MergeTree keys cannot be Nullable).
CH_INFER = " SETTINGS schema_inference_make_columns_nullable = 0"


def _ch_quote(text: str) -> str:
    """``text`` for inside a ClickHouse '...' literal (only the --dir path is spliced in)."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


def _chdb_load(sess, table: str, rows: list[dict], order_by: str, index: str, workdir: str, B: int,
               unit: str) -> float:
    """Create ``table`` as a MergeTree ``ORDER BY order_by`` (plus a data-skipping ``index``
    if given) with the schema ClickHouse infers from a 10,000-row sample (outside the
    timing, as DuckDB's schema), then time the load: INSERT ... FORMAT JSONEachRow per batch
    and OPTIMIZE ... FINAL, which merges the parts into one, the steady state (rtindex's
    flush)."""
    sample = os.path.join(workdir, f"{table}_sample.ndjson")
    with open(sample, "wb") as f:
        f.write(b"\n".join(orjson.dumps(r) for r in rows[:10_000]))
    sess.query(f"CREATE TABLE {table} ENGINE = MergeTree ORDER BY {order_by} EMPTY AS "
               f"SELECT * FROM file('{_ch_quote(sample)}', JSONEachRow)" + CH_INFER)
    os.remove(sample)
    if index:
        sess.query(f"ALTER TABLE {table} ADD INDEX {index}")
    dumps = orjson.dumps
    p = Progress(f"chdb {table}", len(rows), unit=unit)
    t0 = time.perf_counter()
    done = 0
    for batch in batches(rows, B):
        sess.query(f"INSERT INTO {table} FORMAT JSONEachRow\n" + b"\n".join(dumps(r) for r in batch).decode())
        done += len(batch)
        p.update(done)
    sess.query(f"OPTIMIZE TABLE {table} FINAL")
    dt = time.perf_counter() - t0
    p.finish(" (OPTIMIZE FINAL included)")
    return dt


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


def bench_duckdb(data: Data, args: argparse.Namespace, workdir: str) -> dict:
    import duckdb

    res: dict[str, Any] = {"duckdb_version": duckdb.__version__}
    event_bytes = data.json_bytes["events"]

    def phase(name: str, table: str, unit: str) -> Callable[[], dict]:
        """Load data set ``name`` into ``table`` of its own file, whose size is measured once
        it is closed."""
        def run() -> dict:
            rows = getattr(data, name)
            path = os.path.join(workdir, f"{name}.duckdb")
            con = duckdb.connect(path)
            try:
                log(f"duckdb: inserting {len(rows):,} {name} {unit} (batch {args.batch}) ...")
                dt = _duckdb_load(con, table, rows, args.batch, f"duckdb {name}", unit)
                n = con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
                if n != len(rows):
                    log(f"!! duckdb: {table} has {n:,} rows, expected {len(rows):,}")
            finally:
                con.close()
            out = {f"duckdb_{name}_{unit}_per_s": len(rows) / dt, f"duckdb_{name}_seconds": dt,
                   f"duckdb_{name}_disk_mb": files_mb(path, path + ".wal")}
            if name == "events":
                out["duckdb_events_mb_per_s"] = event_bytes / MB / dt
            return out
        return run

    run_guarded("duckdb_events", phase("events", "events", "docs"), res)
    if data.tsbs:
        run_guarded("duckdb_tsbs", phase("tsbs", "cpu", "rows"), res)
    if data.clicks:
        run_guarded("duckdb_clicks", phase("clicks", "product_clicks", "rows"), res)
    return res


# ---------------------------------------------------------------------------
# chDB (ClickHouse in-process)
# ---------------------------------------------------------------------------


def bench_chdb(data: Data, args: argparse.Namespace, workdir: str) -> dict:
    try:
        import chdb
        from chdb import session
    except ImportError as e:
        log(f"chdb: skipped, it cannot be imported ({e}; pip install chdb): its figures are null")
        return {"chdb_skipped": f"import chdb failed: {e}"}
    # benchmarks/query.py imports this module, so its loader is imported once both are loaded

    # data set -> table, sort key and skip index a ClickHouse user would choose for lookups
    tables = {"events": ("events", "processBy", "emails_bloom emails TYPE bloom_filter GRANULARITY 1"),
              "tsbs": ("cpu", "(tags.hostname, ts)", ""),
              "clicks": ("product_clicks", "(city, product_id)", "")}
    sess = session.Session(os.path.join(workdir, "session"))
    res: dict[str, Any] = {"chdb_version": chdb.__version__}

    def phase(name: str, unit: str) -> Callable[[], dict]:
        def run() -> dict:
            rows = getattr(data, name)
            table, order_by, index = tables[name]
            log(f"chdb: inserting {len(rows):,} {name} {unit} (batch {args.batch}) ...")
            dt = _chdb_load(sess, table, rows, order_by, index, workdir, args.batch, unit)
            n = int(str(sess.query(f"SELECT count() FROM {table}", "TabSeparated")))
            if n != len(rows):
                log(f"!! chdb: {table} has {n:,} rows, expected {len(rows):,}")
            out = {f"chdb_{name}_{unit}_per_s": len(rows) / dt, f"chdb_{name}_seconds": dt}
            if name == "events":
                out["chdb_events_mb_per_s"] = data.json_bytes["events"] / MB / dt
            return out
        return run

    try:
        res["chdb_clickhouse_version"] = str(sess.query("SELECT version()", "TabSeparated")).strip()
        run_guarded("chdb_events", phase("events", "docs"), res)
        if data.tsbs:
            run_guarded("chdb_tsbs", phase("tsbs", "rows"), res)
        if data.clicks:
            run_guarded("chdb_clicks", phase("clicks", "rows"), res)
        # after OPTIMIZE FINAL: the one active part of each table (merged-away parts linger
        # on disk until ClickHouse's cleanup, minutes later)
        sizes = str(sess.query("SELECT table, sum(bytes_on_disk) FROM system.parts "
                               "WHERE active AND database = currentDatabase() GROUP BY table", "TabSeparated"))
        on_disk = dict(line.split("\t") for line in sizes.splitlines())
        for name, (table, _, _) in tables.items():
            if table in on_disk and f"chdb_{name}_error" not in res:
                res[f"chdb_{name}_disk_mb"] = int(on_disk[table]) / MB
    finally:
        sess.close()
    return res


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------

SYSTEMS = ("rtindex", "sqlite", "duckdb", "chdb")
PEERS = SYSTEMS[1:]
# (name, rtindex's rate, the peer's rate): rtindex's rate over the peer's
RATIOS = (
    [(f"ratio_{s}_vs_{peer}", f"{s}_{u}_per_s", f"{peer}_{s}_{u}_per_s")
     for s, u in (("events", "docs"), ("tsbs", "rows"), ("clicks", "rows")) for peer in PEERS]
    + [("ratio_events_ndjson_vs_sqlite", "events_ndjson_docs_per_s", "sqlite_events_ndjson_docs_per_s"),
       ("ratio_clicks_arrow_vs_sqlite", "clicks_arrow_rows_per_s", "sqlite_clicks_rows_per_s")]
)
# the targets: (what, figure, goal, whether the figure must be at least the goal or at most)
TARGETS = (
    ("events from dicts >= 60,000 docs/s", "events_docs_per_s", 60_000, True),
    ("events from dicts >= 1.5x SQLite", "ratio_events_vs_sqlite", 1.5, True),
    ("events from NDJSON >= 60,000 docs/s", "events_ndjson_docs_per_s", 60_000, True),
    ("events from NDJSON >= 1.5x SQLite's", "ratio_events_ndjson_vs_sqlite", 1.5, True),
    ("TSBS >= 200,000 rows/s", "tsbs_rows_per_s", 200_000, True),
    ("TSBS >= 1.5x SQLite", "ratio_tsbs_vs_sqlite", 1.5, True),
    ("clicks from dicts >= 1.5x SQLite", "ratio_clicks_vs_sqlite", 1.5, True),
    ("clicks as Arrow >= SQLite's executemany", "ratio_clicks_arrow_vs_sqlite", 1.0, True),
    ("events on disk <= their JSON", "rtindex_events_disk_vs_json", 1.0, False),
    ("TSBS on disk <= its JSON", "rtindex_tsbs_disk_vs_json", 1.0, False),
    ("clicks on disk <= their JSON", "rtindex_clicks_disk_vs_json", 1.0, False),
)


def derived(r: dict, data: Data) -> dict:
    """Disk totals, JSON sizes and the ratios, from the systems' figures ``r``."""
    out: dict[str, Any] = {f"{s}_json_mb": data.json_bytes[s] / MB for s in DATA_SETS}
    for system in SYSTEMS:
        sizes = [r[k] for k in (f"{system}_{s}_disk_mb" for s in DATA_SETS) if r.get(k) is not None]
        if sizes:
            out[f"{system}_disk_mb"] = sum(sizes)
    for s in DATA_SETS:
        disk = r.get(f"rtindex_{s}_disk_mb")
        if disk is not None and data.json_bytes[s]:
            out[f"rtindex_{s}_disk_vs_json"] = disk / (data.json_bytes[s] / MB)
    for name, a, b in RATIOS:
        if r.get(a) and r.get(b):
            out[name] = r[a] / r[b]
    return out


def missed_targets(r: dict) -> list[str]:
    return [what for what, key, goal, at_least in TARGETS
            if r.get(key) is not None and (r[key] < goal if at_least else r[key] > goal)]


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

    def each(key: str) -> tuple:  # rtindex's figure, then each peer's
        return (g(key),) + tuple(g(f"{peer}_{key}") for peer in PEERS)

    rows = [
        ("events docs/s", each("events_docs_per_s"), 0),
        ("events MB/s", each("events_mb_per_s"), 2),
        ("events NDJSON docs/s", (g("events_ndjson_docs_per_s"), g("sqlite_events_ndjson_docs_per_s"), None, None), 0),
        ("events NDJSON MB/s", (g("events_ndjson_mb_per_s"), g("sqlite_events_ndjson_mb_per_s"), None, None), 2),
        ("tsbs rows/s", each("tsbs_rows_per_s"), 0),
        ("clicks rows/s", each("clicks_rows_per_s"), 0),
        ("clicks Arrow rows/s [1]", (g("clicks_arrow_rows_per_s"), g("sqlite_clicks_rows_per_s"), None, None), 0),
        ("events on disk MB", (g("rtindex_events_disk_mb"),) + tuple(g(f"{p}_events_disk_mb") for p in PEERS), 1),
        ("tsbs on disk MB", (g("rtindex_tsbs_disk_mb"),) + tuple(g(f"{p}_tsbs_disk_mb") for p in PEERS), 1),
        ("clicks on disk MB", (g("rtindex_clicks_disk_mb"),) + tuple(g(f"{p}_clicks_disk_mb") for p in PEERS), 1),
        ("on disk MB (3 sets)", (g("rtindex_disk_mb"),) + tuple(g(f"{p}_disk_mb") for p in PEERS), 1),
    ]
    hdr = (f"{'metric':<24} {'rtindex':>11} {'sqlite':>11} {'duckdb':>11} {'chdb':>11} "
           f"{'rt/sqlite':>9} {'rt/duckdb':>9} {'rt/chdb':>9}")
    print()
    print(f"Ingest benchmark: {r['n_events']:,} events ({r['event_bytes_per_doc']:.0f} B/doc, "
          f"{r['event_mb']:.1f} MB), {r['n_tsbs']:,} TSBS rows, {r['n_clicks']:,} product_clicks rows; "
          f"shards={r['shards']}, batch={r['batch']}")
    print(hdr)
    print("-" * len(hdr))
    for name, (a, *peers), d in rows:
        print(f"{name:<24} {_fmt(a, d):>11} " + " ".join(f"{_fmt(v, d):>11}" for v in peers) + " "
              + " ".join(f"{_ratio(a, v):>9}" for v in peers))
    print("-" * len(hdr))
    print("[1] rtindex from a pyarrow Table, against SQLite's executemany of the dicts' tuples")
    print("as JSON: " + ", ".join(f"{s} {_fmt(g(f'{s}_json_mb'), 1)} MB" for s in DATA_SETS)
          + "; rtindex on disk / JSON: "
          + ", ".join(f"{s} {_ratio(g(f'rtindex_{s}_disk_mb'), g(f'{s}_json_mb'))}" for s in DATA_SETS)
          + f"; rtindex's second copies: events_ndjson {_fmt(g('rtindex_events_ndjson_disk_mb'), 1)} MB, "
          f"clicks_arrow {_fmt(g('rtindex_clicks_arrow_disk_mb'), 1)} MB")
    if g("rtindex_rss_peak_mb") is not None:
        print(f"rtindex RSS during events ingest: {g('rtindex_rss_before_mb'):,.0f} MB -> peak "
              f"{g('rtindex_rss_peak_mb'):,.0f} MB (+{g('rtindex_rss_increase_mb'):,.0f} MB)")
    print("targets:")
    missed = set(missed_targets(r))
    for what, key, _goal, _at_least in TARGETS:
        v = g(key)
        state = "-" if v is None else ("MISSED" if what in missed else "met")
        print(f"  {what:<42} {_fmt(v, 0 if v is not None and v >= 1000 else 2):>10}  {state}")
    for k in sorted(k for k in r if k.endswith("_error") or k == "chdb_skipped"):
        print(f"{k}: {g(k)}")
    print(f"process peak RSS: {g('peak_rss_mb'):,.0f} MB (includes the in-memory input data: "
          f"{g('data_rss_mb'):,.0f} MB after generation); data generation {g('gen_seconds'):.1f}s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="100k events, 300k TSBS rows, 1M product_clicks rows (~3 min)")
    ap.add_argument("--events", type=int, default=None, help="number of events (default 1,000,000)")
    ap.add_argument("--tsbs", type=int, default=None, help="number of TSBS cpu rows (default 2,000,000)")
    ap.add_argument("--clicks", type=int, default=None, help="number of product_clicks rows (default 10,000,000)")
    ap.add_argument("--shards", type=int, default=4, help="rtindex shards per collection (default 4)")
    ap.add_argument("--batch", type=int, default=10_000, help="batch / transaction size (default 10,000)")
    ap.add_argument("--dir", default=None, help="parent of the temporary working directory (default /tmp)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    args = ap.parse_args(argv)

    n_events = args.events if args.events is not None else (100_000 if args.quick else 1_000_000)
    n_tsbs = args.tsbs if args.tsbs is not None else (300_000 if args.quick else 2_000_000)
    n_clicks = args.clicks if args.clicks is not None else (1_000_000 if args.quick else 10_000_000)
    if n_events < 1 or n_tsbs < 0 or n_clicks < 0 or args.batch < 1:
        ap.error("--events and --batch must be positive, --tsbs and --clicks at least 0")
    systems = {s.strip() for s in args.systems.split(",") if s.strip()}
    unknown = systems - set(SYSTEMS)
    if unknown:
        ap.error(f"unknown systems: {', '.join(sorted(unknown))} (choose from {', '.join(SYSTEMS)})")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="rtindex-ingest-", dir=args.dir)
    t_start = time.perf_counter()
    log(f"ingest benchmark: {n_events:,} events, {n_tsbs:,} TSBS rows, {n_clicks:,} product_clicks rows, "
        f"shards={args.shards}, batch={args.batch}, dir={workdir}")

    results: dict[str, Any] = {}
    try:
        data, gen_s = generate(n_events, n_tsbs, n_clicks, args.batch, args.seed)
        data_rss = rss_mb()
        log(f"data ready in {gen_s:.1f}s; RSS {data_rss:,.0f} MB")
        guard = InputGuard(data, args.seed)
        for name, fn in (("rtindex", bench_rtindex), ("sqlite", bench_sqlite), ("duckdb", bench_duckdb),
                         ("chdb", bench_chdb)):
            if name not in systems:
                continue
            sub = os.path.join(workdir, name)
            os.makedirs(sub, exist_ok=True)
            run_guarded(name, lambda: fn(data, args, sub), results)
            guard.restore_if_mutated(name)
            if not args.keep:
                shutil.rmtree(sub, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"kept {workdir}")
    results.update(derived(results, data))

    head = ("events_docs_per_s", "events_mb_per_s", "events_ndjson_docs_per_s", "events_ndjson_mb_per_s",
            "tsbs_rows_per_s", "clicks_rows_per_s", "clicks_arrow_rows_per_s",
            "sqlite_events_docs_per_s", "sqlite_events_ndjson_docs_per_s", "sqlite_tsbs_rows_per_s",
            "sqlite_clicks_rows_per_s", "duckdb_events_docs_per_s", "chdb_events_docs_per_s",
            "rtindex_disk_mb", "rtindex_events_disk_mb", "rtindex_tsbs_disk_mb", "rtindex_clicks_disk_mb",
            "events_json_mb", "rtindex_events_disk_vs_json")
    out: dict[str, Any] = {k: results.get(k) for k in head}
    out["peak_rss_mb"] = peak_rss_mb()
    for k in sorted(results):
        if k not in out:
            out[k] = results[k]
    out.update({
        "n_events": n_events,
        "n_tsbs": n_tsbs,
        "n_clicks": n_clicks,
        "shards": args.shards,
        "batch": args.batch,
        "event_mb": data.json_bytes["events"] / MB,
        "event_bytes_per_doc": data.json_bytes["events"] / n_events,
        "data_rss_mb": data_rss,
        "gen_seconds": gen_s,
        "total_seconds": time.perf_counter() - t_start,
        "targets_missed": missed_targets(results),
    })
    print_table(out)
    out = {k: ((round(v, 3) if math.isfinite(v) else None) if isinstance(v, float) else v) for k, v in out.items()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
