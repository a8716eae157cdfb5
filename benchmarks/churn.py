#!/usr/bin/env python
"""Reclaimed storage under churn: rewrite a fixed working set and watch the disk.

    python benchmarks/churn.py [--quick] [--docs N] [--rounds R] [--shards S] [--batch B] [--no-fresh] [--dir DIR]
    python benchmarks/churn.py --working-sets 1000,6000,100000 [--rounds R] [--idle SECONDS] [--shards S]
                               [--seal-rows N]

A fixed working set of N RockBench events (``rtindex.datagen``, ids ``ev-0`` ..
``ev-{N-1}``) is loaded into a fresh database (``--shards`` shards, default options) and
``flush()``-ed; then the same ``_id``s are rewritten R times, every other field changed
from one round to the next (the target: under sustained upserts of a fixed working set, the
on-disk size stays within 2x of the size right after one clean load).

Input: ``--variants`` (default 4) versions of the working set are generated in memory
before anything is timed, one per seed, same ids; the load uses version 0 and round r
version ``r % V``, so consecutive rounds always differ (an upsert is a full rewrite:
nothing is deduplicated, so cycling V versions churns storage like R different seeds
without holding R copies in memory). Nothing else runs between the timed calls, so
background sealing/merging is not hidden in untimed gaps.

Measured:
* ``load_docs_per_s``: N / (``coll.ingest(version 0)`` + ``coll.flush()``), wall clock;
* ``disk_mb_after_load``: bytes of every file under the database directory (os.walk: SST
  files, WALs, MANIFESTs, LOGs, everything), after that flush;
* ``churn_docs_per_s``: R x N / (the R ``ingest()`` calls + one final ``coll.flush()``);
  a per-round line on stderr gives round, disk MB (and WAL MB), SST files, segments
  (sealed+in memory) and docs/s;
* ``disk_mb_after_churn``, ``sst_files_after_churn`` (``*.sst`` under the database
  directory) after the final flush; ``disk_ratio`` = after churn / after load,
  ``sst_ratio`` likewise, ``churn_vs_load`` = churn / load throughput; ``after_load``,
  ``after_churn``, ``after_close`` split the bytes into SST files, WALs (``*.log``) and
  the rest; ``disk_mb_after_close`` (the database closed, same directory); ``documents``
  (must still be N); ``per_round``.
* ``fresh_docs_per_s`` (skip with --no-fresh): a second fresh database takes the same
  volume, (R + 1) x N documents, in the same calls but every one with a new ``_id``
  (a shallow copy with the new id, made inside the timed call: ~1 us of ~70 us per
  document), timed the same way: ``churn_vs_fresh``. This is the fairer "clean load" for
  the throughput target: the initial load of N documents has fixed costs and, when N is
  below the shards' ``seal_rows``, seals everything at ``flush()`` with nothing to
  overlap, so at --quick size it is slower per document than the churn that follows.
  ``fresh_disk_mb`` is what keeping every version would cost.

Targets, with a PASS/FAIL line for each on stderr:
* disk after churn within 2x of after load: ``disk_ratio <= 2.0``;
* SST files bounded: read here as ``sst_files_after_churn <= 2 x sst_files_after_load``
  (the count also appears per round, so growth without bound is visible);
* churn throughput within 20% of a clean load: ``churn_vs_load >= 0.8`` and
  ``churn_vs_fresh >= 0.8``.

``--working-sets N1,N2,...`` measures instead how disk comes back once writes stop, for each
working set size in turn (a fresh database each, default options, so ``seal_rows`` 25,000
unless ``--seal-rows`` and ``reader_grace_seconds`` 30 s): load and ``flush()`` (the clean
load), R rewrites with no flush after them, then the database left idle for ``--idle``
seconds (default 60, the disk sampled every second), closed and opened again. Per size:
``disk_mb_after_load``, ``disk_mb_peak`` (the largest after a rewrite),
``disk_mb_after_churn`` (after the last rewrite), ``disk_mb_after_idle``,
``disk_mb_after_reopen`` (opened again, nothing written) and each one's ratio to the load,
``reclaimed_s`` (idle seconds until the disk was within 2x of the load for good; None if
never), the load and churn rates (the churn: ingest calls only) and the split of the bytes
after idle and after reopen. Target: within 2x after idle and after reopen, for every size.

If ``rtindex.open`` accepts ``reader_grace_seconds`` (a delay before dropped segments' files
are deleted, for readers that may still use them), it is passed as 0, since no reader
follows this database; otherwise the database is opened with defaults only.

Full run: 100,000 documents x 20 rounds (2.1M writes, plus 2.1M for the fresh reference:
about 6 minutes, 3.4 GB peak RSS, ~8 GB of temporary disk before the fix); --quick: 20,000
documents x 20 rounds (about 1 minute, 1.7 GB peak RSS). The last line printed is one JSON
object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import rtindex  # noqa: E402
from rtindex import datagen  # noqa: E402

from benchmarks.figures import rnd  # noqa: E402
from benchmarks.ingest import EVENT_TIME_BASE_US, generating_input, log, rss_mb  # noqa: E402

MB = 1e6
TARGET_DISK_RATIO = 2.0
TARGET_SST_RATIO = 2.0
TARGET_CHURN_VS_LOAD = 0.8


def disk_usage(path: str) -> dict[str, int]:
    """Bytes of every file under ``path`` (``bytes``), split into ``*.sst`` files
    (``sst_bytes``, count in ``sst``), RocksDB WALs (``*.log``: ``wal_bytes``), segment
    files (``segments/``: ``segment_bytes``), mutable segment files (``tails/``:
    ``tail_bytes``) and the rest (MANIFEST, OPTIONS, info LOGs, rtindex's small files:
    ``other_bytes``)."""
    u = {"bytes": 0, "sst": 0, "sst_bytes": 0, "wal_bytes": 0, "segment_bytes": 0, "tail_bytes": 0,
         "other_bytes": 0}
    for root, _dirs, files in os.walk(path):
        folder = os.path.basename(root)
        for f in files:
            try:
                size = os.path.getsize(os.path.join(root, f))
            except OSError:  # deleted by a background thread meanwhile
                continue
            u["bytes"] += size
            if f.endswith(".sst"):
                u["sst"] += 1
                u["sst_bytes"] += size
            elif f.endswith(".log"):
                u["wal_bytes"] += size
            elif folder == "segments":
                u["segment_bytes"] += size
            elif folder == "tails":
                u["tail_bytes"] += size
            else:
                u["other_bytes"] += size
    return u


def breakdown(u: dict[str, int]) -> str:
    return (f"{u['bytes'] / MB:,.1f} MB (sst {u['sst_bytes'] / MB:,.1f} MB in {u['sst']} files, "
            f"wal {u['wal_bytes'] / MB:,.1f} MB, segments {u['segment_bytes'] / MB:,.1f} MB, "
            f"tails {u['tail_bytes'] / MB:,.1f} MB, other {u['other_bytes'] / MB:,.1f} MB)")


def breakdown_mb(u: dict[str, int]) -> dict[str, float]:
    return {"sst_mb": u["sst_bytes"] / MB, "wal_mb": u["wal_bytes"] / MB, "segments_mb": u["segment_bytes"] / MB,
            "tails_mb": u["tail_bytes"] / MB, "other_mb": u["other_bytes"] / MB}


def open_db(path: str) -> tuple[Any, bool]:
    """Open with ``reader_grace_seconds=0`` when the engine knows that option."""
    try:
        return rtindex.open(path, reader_grace_seconds=0), True
    except TypeError as e:
        if "reader_grace_seconds" not in str(e):
            raise
        return rtindex.open(path), False


def segments(coll: Any) -> str:
    try:
        sh = coll.stats()["shards"]
        return f"{sum(s.get('sealed_segments', 0) for s in sh)}+{sum(s.get('memory_segments', 0) for s in sh)}"
    except Exception:  # noqa: BLE001 - stats() is informative only
        return "?"


def churn_run(path: str, sets: list[list[dict]], args: argparse.Namespace) -> dict[str, Any]:
    """Load version 0, flush, then rewrite the same ids ``args.rounds`` times."""
    n, rounds, variants = len(sets[0]), args.rounds, len(sets)
    db, grace_passed = open_db(path)
    try:
        coll = db.create_collection("events", shards=args.shards)
        # -- clean load -----------------------------------------------------------
        t0 = time.perf_counter()
        stats = coll.ingest(sets[0], batch_size=args.batch)
        t_ingest = time.perf_counter() - t0
        coll.flush()
        load_s = time.perf_counter() - t0
        if stats.errors:
            log(f"!! load: {len(stats.errors):,} ingest errors, e.g. {stats.errors[:3]}")
        load = disk_usage(path)
        log(f"load: {n:,} docs in {load_s:.2f}s (ingest {t_ingest:.2f}s + flush {load_s - t_ingest:.2f}s), "
            f"{n / load_s:,.0f} docs/s; disk {breakdown(load)}; segments {segments(coll)}")

        # -- churn ----------------------------------------------------------------
        churn_s = 0.0
        errors = 0
        per_round: list[dict] = []
        for r in range(1, rounds + 1):
            docs = sets[r % variants]
            t0 = time.perf_counter()
            stats = coll.ingest(docs, batch_size=args.batch)
            dt = time.perf_counter() - t0
            churn_s += dt
            errors += len(stats.errors)
            u = disk_usage(path)
            per_round.append({"round": r, "disk_mb": round(u["bytes"] / MB, 1), "sst_files": u["sst"],
                              "wal_mb": round(u["wal_bytes"] / MB, 1), "docs_per_s": round(n / dt)})
            log(f"  round {r:>3}/{rounds}: disk {u['bytes'] / MB:8,.1f} MB ({u['bytes'] / load['bytes']:5.2f}x, "
                f"wal {u['wal_bytes'] / MB:6,.1f})  sst {u['sst']:5}  segments {segments(coll):>7}  "
                f"{n / dt:8,.0f} docs/s (ingest only)")
        t0 = time.perf_counter()
        coll.flush()
        flush_s = time.perf_counter() - t0
        churn_s += flush_s
        if errors:
            log(f"!! churn: {errors:,} ingest errors")
        churn = disk_usage(path)
        documents = len(coll)
        log(f"churn: {rounds * n:,} docs in {churn_s:.2f}s (final flush {flush_s:.2f}s), "
            f"{rounds * n / churn_s:,.0f} docs/s; disk {breakdown(churn)}; segments {segments(coll)}; "
            f"{documents:,} documents")
    finally:
        db.close()
    closed = disk_usage(path)
    log(f"after close: disk {breakdown(closed)}")
    return {"load_s": load_s, "load": load, "churn_s": churn_s, "flush_s": flush_s, "churn": churn,
            "closed": closed, "documents": documents, "per_round": per_round, "grace_passed": grace_passed}


def fresh_run(path: str, sets: list[list[dict]], args: argparse.Namespace) -> dict[str, Any]:
    """The reference "clean load" of the same volume: (rounds + 1) x N documents with new
    ids, in the same calls (one ingest() of N per round), timed like load + churn."""
    n, rounds, variants = len(sets[0]), args.rounds, len(sets)
    db, _ = open_db(path)
    try:
        coll = db.create_collection("events", shards=args.shards)
        t_total = 0.0
        for r in range(rounds + 1):
            docs = sets[r % variants]
            prefix = f"fresh-{r}-"
            t0 = time.perf_counter()
            # a shallow copy with a new _id (~1 us/doc, ~2% of the per-document cost)
            coll.ingest(({**d, "_id": prefix + str(i)} for i, d in enumerate(docs)), batch_size=args.batch)
            t_total += time.perf_counter() - t0
        t0 = time.perf_counter()
        coll.flush()
        t_total += time.perf_counter() - t0
        documents = len(coll)
        u = disk_usage(path)
    finally:
        db.close()
    rate = (rounds + 1) * n / t_total
    log(f"fresh: {(rounds + 1) * n:,} new docs in {t_total:.2f}s, {rate:,.0f} docs/s; disk {breakdown(u)}; "
        f"{documents:,} documents")
    return {"fresh_docs_per_s": rate, "fresh_disk_mb": u["bytes"] / MB, "fresh_sst_files": u["sst"],
            "fresh_documents": documents}


def working_set_run(path: str, sets: list[list[dict]], args: argparse.Namespace) -> dict[str, Any]:
    """Load version 0 and flush (the clean load), rewrite the same ids ``args.rounds`` times
    without a flush, leave the database idle for ``args.idle`` seconds, close it and open it
    again; the disk after each step."""
    n, variants = len(sets[0]), len(sets)
    opts = {"seal_rows": args.seal_rows} if args.seal_rows else {}
    db = rtindex.open(path, **opts)
    try:
        coll = db.create_collection("events", shards=args.shards)
        t0 = time.perf_counter()
        coll.ingest(sets[0], batch_size=args.batch)
        coll.flush()
        load_s = time.perf_counter() - t0
        load = disk_usage(path)
        peak = load["bytes"]
        churn_s = 0.0
        for r in range(1, args.rounds + 1):
            t0 = time.perf_counter()
            coll.ingest(sets[r % variants], batch_size=args.batch)
            churn_s += time.perf_counter() - t0
            peak = max(peak, disk_usage(path)["bytes"])
        churned = disk_usage(path)
        log(f"{n:,} documents: load {breakdown(load)}; after {args.rounds} rewrites {breakdown(churned)}")
        started = time.monotonic()
        samples: list[tuple[float, int]] = []
        while True:
            idle = disk_usage(path)
            waited = time.monotonic() - started
            samples.append((waited, idle["bytes"]))
            if waited >= args.idle:
                break
            time.sleep(min(1.0, args.idle - waited))
        over = [t for t, b in samples if b > TARGET_DISK_RATIO * load["bytes"]]
        later = [t for t, _ in samples if not over or t > over[-1]]
        reclaimed_s = later[0] if later else None
        documents = len(coll)
    finally:
        db.close()
    log(f"  idle {args.idle:.0f} s: {breakdown(idle)}; within 2x "
        + ("never" if reclaimed_s is None else f"after {reclaimed_s:.0f} s"))
    db = rtindex.open(path, **opts)
    try:
        reopened = disk_usage(path)
        documents_reopened = len(db["events"])
    finally:
        db.close()
    log(f"  reopened: {breakdown(reopened)}")

    def ratio(u: dict[str, int]) -> float:
        return u["bytes"] / load["bytes"]

    return {"docs": n, "disk_mb_after_load": load["bytes"] / MB, "disk_mb_peak": peak / MB,
            "disk_mb_after_churn": churned["bytes"] / MB, "disk_mb_after_idle": idle["bytes"] / MB,
            "disk_mb_after_reopen": reopened["bytes"] / MB, "ratio_peak": peak / load["bytes"],
            "ratio_after_churn": ratio(churned), "ratio_after_idle": ratio(idle),
            "ratio_after_reopen": ratio(reopened), "reclaimed_s": reclaimed_s,
            "load_docs_per_s": n / load_s, "churn_docs_per_s": args.rounds * n / churn_s,
            "after_idle": breakdown_mb(idle), "after_reopen": breakdown_mb(reopened), "documents": documents,
            "documents_after_reopen": documents_reopened}


def working_sets_main(args: argparse.Namespace, sizes: list[int], variants: int, t_start: float) -> int:
    """``--working-sets``: one working_set_run per size, then the PASS/FAIL lines and one JSON line."""
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    runs = []
    for n in sizes:
        with generating_input():
            sets = [list(datagen.rockbench_events(n, seed=args.seed + 1000 * v, start_id=0,
                                                  event_time_us=EVENT_TIME_BASE_US + v * 10**9))
                    for v in range(variants)]
        work = tempfile.mkdtemp(prefix="rtindex-churn-", dir=args.dir)
        try:
            runs.append(working_set_run(os.path.join(work, "db"), sets, args))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        del sets
    ok = True
    for w in runs:
        for name, key in (("after idle", "ratio_after_idle"), ("after reopen", "ratio_after_reopen")):
            passed = w[key] <= TARGET_DISK_RATIO
            ok &= passed
            log(f"{'PASS' if passed else 'FAIL'}: {w['docs']:,} documents, disk {name} <= 2x after load: "
                f"{w[key]:.2f}x")
        passed = w["documents"] == w["documents_after_reopen"] == w["docs"]
        ok &= passed
        log(f"{'PASS' if passed else 'FAIL'}: {w['docs']:,} documents, working set intact: {w['documents']:,}, "
            f"{w['documents_after_reopen']:,} after reopen")
    print(json.dumps(rnd({"working_sets": runs, "rounds": args.rounds, "variants": variants,
                          "shards": args.shards, "batch": args.batch, "idle_seconds": args.idle,
                          "seal_rows": args.seal_rows,
                          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                          "total_seconds": time.perf_counter() - t_start, "pass": ok})))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20,000 documents x 20 rounds (about 1 minute)")
    ap.add_argument("--docs", type=int, default=None, help="working set size (default 100,000)")
    ap.add_argument("--rounds", type=int, default=20, help="rewrites of the working set (default 20)")
    ap.add_argument("--variants", type=int, default=4,
                    help="versions of the working set generated up front, cycled (default 4, at least 2)")
    ap.add_argument("--shards", type=int, default=4, help="shards of the collection (default 4)")
    ap.add_argument("--batch", type=int, default=10_000, help="ingest batch_size (default 10,000)")
    ap.add_argument("--no-fresh", action="store_true",
                    help="skip the reference load of the same volume with new ids (halves the run time)")
    ap.add_argument("--dir", default=None, help="parent of the temporary working directory (default /tmp)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    ap.add_argument("--working-sets", default=None,
                    help="comma-separated working set sizes: measure disk after idle and reopen for each")
    ap.add_argument("--idle", type=float, default=60.0,
                    help="with --working-sets: seconds the database is left idle after the churn (default 60)")
    ap.add_argument("--seal-rows", type=int, default=None,
                    help="with --working-sets: rtindex.open's seal_rows (default: rtindex's default)")
    args = ap.parse_args(argv)
    n = args.docs if args.docs is not None else (20_000 if args.quick else 100_000)
    rounds = args.rounds
    if n < 1 or rounds < 1:
        ap.error("--docs and --rounds must be positive")
    variants = max(2, min(args.variants, rounds + 1))
    if args.working_sets:
        sizes = [int(x.replace("_", "")) for x in args.working_sets.split(",") if x.strip()]
        if not sizes or min(sizes) < 1 or args.idle < 0:
            ap.error("--working-sets takes positive sizes, --idle a number of seconds")
        log(f"churn benchmark, working sets {sizes}: {rounds} rewrites, {variants} versions, "
            f"shards={args.shards}, batch={args.batch}, idle {args.idle:.0f} s")
        return working_sets_main(args, sizes, variants, time.perf_counter())

    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="rtindex-churn-", dir=args.dir)
    t_start = time.perf_counter()
    log(f"churn benchmark: {n:,} documents x {rounds} rounds, {variants} versions, shards={args.shards}, "
        f"batch={args.batch}, dir={work}")

    t0 = time.perf_counter()
    with generating_input():
        sets = [list(datagen.rockbench_events(n, seed=args.seed + 1000 * v, start_id=0,
                                              event_time_us=EVENT_TIME_BASE_US + v * 10**9))
                for v in range(variants)]
    gen_s = time.perf_counter() - t0
    log(f"data ready in {gen_s:.1f}s ({variants} x {n:,} documents); RSS {rss_mb():,.0f} MB")

    try:
        c = churn_run(os.path.join(work, "db"), sets, args)
        fresh: dict[str, Any] = {}
        if not args.no_fresh:
            fresh = fresh_run(os.path.join(work, "fresh"), sets, args)
            if not args.keep:
                shutil.rmtree(os.path.join(work, "fresh"), ignore_errors=True)
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    load, churn, closed = c["load"], c["churn"], c["closed"]
    load_rate = n / c["load_s"]
    churn_rate = rounds * n / c["churn_s"]
    out: dict[str, Any] = {
        "disk_mb_after_load": load["bytes"] / MB,
        "disk_mb_after_churn": churn["bytes"] / MB,
        "sst_files_after_churn": churn["sst"],
        "churn_docs_per_s": churn_rate,
        "load_docs_per_s": load_rate,
        "disk_ratio": churn["bytes"] / load["bytes"],
        "churn_vs_load": churn_rate / load_rate,
        "sst_files_after_load": load["sst"],
        "sst_ratio": churn["sst"] / max(1, load["sst"]),
        "fresh_docs_per_s": fresh.get("fresh_docs_per_s"),
        "churn_vs_fresh": churn_rate / fresh["fresh_docs_per_s"] if fresh else None,
        "fresh_disk_mb": fresh.get("fresh_disk_mb"),
        "fresh_sst_files": fresh.get("fresh_sst_files"),
        "disk_mb_after_close": closed["bytes"] / MB,
        "sst_files_after_close": closed["sst"],
        "after_load": breakdown_mb(load),
        "after_churn": breakdown_mb(churn),
        "after_close": breakdown_mb(closed),
        "documents": c["documents"],
        "docs": n,
        "rounds": rounds,
        "variants": variants,
        "shards": args.shards,
        "batch": args.batch,
        "reader_grace_seconds_0": c["grace_passed"],
        "load_seconds": c["load_s"],
        "churn_seconds": c["churn_s"],
        "churn_final_flush_seconds": c["flush_s"],
        "gen_seconds": gen_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "total_seconds": time.perf_counter() - t_start,
        "per_round": c["per_round"],
    }
    checks = [
        ("disk after churn <= 2x after load", out["disk_ratio"] <= TARGET_DISK_RATIO,
         f"{out['disk_mb_after_churn']:,.1f} / {out['disk_mb_after_load']:,.1f} MB = {out['disk_ratio']:.2f}x"),
        ("sst files bounded (<= 2x after load)", out["sst_ratio"] <= TARGET_SST_RATIO,
         f"{churn['sst']} / {load['sst']} = {out['sst_ratio']:.2f}x"),
        ("churn throughput >= 80% of the initial load", out["churn_vs_load"] >= TARGET_CHURN_VS_LOAD,
         f"{churn_rate:,.0f} / {load_rate:,.0f} docs/s = {out['churn_vs_load']:.2f}"),
    ]
    if fresh:
        checks.append(("churn throughput >= 80% of a fresh load of the same volume",
                       out["churn_vs_fresh"] >= TARGET_CHURN_VS_LOAD,
                       f"{churn_rate:,.0f} / {fresh['fresh_docs_per_s']:,.0f} docs/s = {out['churn_vs_fresh']:.2f}"))
    checks.append(("working set intact", c["documents"] == n, f"{c['documents']:,} documents, {n:,} expected"))
    for name, ok, detail in checks:
        log(f"{'PASS' if ok else 'FAIL'}: {name}: {detail}")
    out["pass"] = all(ok for _, ok, _ in checks)

    print(json.dumps(rnd(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
