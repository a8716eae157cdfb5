"""``rtindex demo``: generated RockBench-style events in an embedded database, looked up and
queried with timings, so a first run shows what rtindex does and how fast."""

from __future__ import annotations

import itertools
import statistics
import sys
import time

import rtindex

DEMO_COLLECTION = "demo_events"  # never "events": that name is the user's
DEMO_MARK = {"created_by": "rtindex demo"}  # in the manifest of the collection the demo made


class DemoRefused(Exception):
    """The demo would have to replace data it did not create: it stops instead."""


def _timed(fn, repeat: int = 50) -> tuple[object, float]:
    """(last result, median milliseconds) of ``repeat`` calls."""
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1000)
    return out, statistics.median(times)


def _demo_collection(db: rtindex.Database, shards: int) -> rtindex.Collection:
    """A fresh collection for the demo, in a database that may hold the user's data.

    The demo only ever replaces a collection it made itself (marked in its manifest): a
    collection of that name that the user made is theirs, and the demo refuses to touch it.
    """
    name = DEMO_COLLECTION
    if name in db:
        mark = db._manifest(name).get("created_by")
        if mark != DEMO_MARK["created_by"]:
            raise DemoRefused(
                f"database {db.path} already has a collection {name!r} that rtindex demo did not create; "
                f"the demo leaves it alone. Run the demo with another --dir, or drop {name!r} yourself "
                f"if you no longer need it")
        db.drop_collection(name)  # the demo's own, from an earlier run
    return db._create_collection(name, shards, extra=DEMO_MARK)


def demo(path: str, n_events: int, shards: int, out=sys.stdout) -> dict:
    """Load generated RockBench-style events into ``path`` and show lookups with timings.

    Writes only to its own collection ``demo_events`` (replaced on every run), so pointing
    ``--dir`` at a database with other collections costs them nothing.
    """
    from rtindex import datagen

    def say(*a):
        print(*a, file=out, flush=True)

    with rtindex.open(path) as db:
        events = _demo_collection(db, shards)
        say(f"rtindex demo: database at {db.path}, collection {events.name!r} with {shards} shards")
        say(f"ingesting {n_events:,} generated events (~1.25 KB, 60 fields, nested objects and arrays; "
            f"every field indexed three ways) ...")
        # made a chunk at a time as they are ingested (all of them at once as Python objects
        # would be most of the demo's memory); the rates count the ingest calls' time only
        generated = datagen.rockbench_events(n_events, seed=1)
        total, step, secs, last, sample = 0, 2_000, 0.0, time.perf_counter(), None
        for i in range(0, n_events, step):
            docs = list(itertools.islice(generated, step))
            if i <= n_events // 2 < i + len(docs):
                sample = docs[n_events // 2 - i]
            t = time.perf_counter()
            total += events.ingest(docs).bytes
            now = time.perf_counter()
            secs += now - t
            if now - last > 2 or i + step >= n_events:
                say(f"  {i + len(docs):>10,} docs  {(i + len(docs)) / secs:>9,.0f} docs/s")
                last = now
        say(f"ingested {len(events):,} docs in {secs:.2f} s: {n_events / secs:,.0f} docs/s, "
            f"{total / secs / 1e6:.1f} MB/s")

        pb, email = sample["processBy"], sample["emails"][0]
        snap = events.snapshot()
        doc, get_ms = _timed(lambda: events.get(sample["_id"]))
        n_pb, pb_ms = _timed(lambda: len(snap.term("processBy", pb)))
        rows, fetch_ms = _timed(lambda: snap.fetch(snap.term("emails", email)))
        t_lo = sample["_event_time"]
        n_rng, rng_ms = _timed(lambda: len(snap.range("_event_time", t_lo, t_lo + 1_000_000)), repeat=10)
        say("")
        line = lambda label, ms: say(f"  {label:<62}{ms:9.3f} ms")  # noqa: E731
        line(f"get({sample['_id']!r}) -> {len(doc)} top-level fields", get_ms)
        line(f"processBy = {pb!r}: {n_pb} docs", pb_ms)
        line(f"emails contains {email!r}: {len(rows)} docs fetched", fetch_ms)
        line(f"_event_time in a 1 s window: {n_rng:,} docs", rng_ms)

        say("")
        say("SQL (db.sql; the planner picks the index path or a column scan, see db.explain):")
        for text, params in (
            (f"SELECT * FROM {DEMO_COLLECTION} WHERE processBy = :p", {"p": pb}),
            (f"SELECT _id, device.os.name FROM {DEMO_COLLECTION} WHERE ARRAY_CONTAINS(emails, :e)", {"e": email}),
            (f"SELECT device.os.name AS os, COUNT(*) AS n, AVG(duration_ms) AS avg_ms FROM {DEMO_COLLECTION} "
             "WHERE processBy = :p GROUP BY os ORDER BY n DESC", {"p": pb}),
            (f"SELECT event_type, COUNT(*) AS n FROM {DEMO_COLLECTION} GROUP BY event_type ORDER BY n DESC LIMIT 3", None),
        ):
            db.sql(text, params)  # first run: plan cached, rows cached
            res, ms = _timed(lambda: db.sql(text, params), repeat=5)
            say(f"  {text}")
            line(f"    -> {len(res)} rows, {res.access} path", ms)

        # freshness: a write is visible to the very next read
        say("")
        t = time.perf_counter()
        events.ingest([{"_id": "fresh-1", "processBy": "demo-writer", "emails": ["me@example.com"]}])
        seen = len(events.snapshot().term("processBy", "demo-writer"))
        fresh_ms = (time.perf_counter() - t) * 1000
        line(f"ingest one doc, then find it by processBy: {seen} doc", fresh_ms)
        events.patch("fresh-1", [{"op": "replace", "path": "/processBy", "value": "patched"}])
        say(f"after patch: {len(events.snapshot().term('processBy', 'patched'))} doc with processBy='patched'; "
            f"delete -> {events.delete('fresh-1')}; {len(events):,} docs")
        return {"docs_per_s": n_events / secs, "get_ms": get_ms, "term_ms": pb_ms, "fresh_ms": fresh_ms}
