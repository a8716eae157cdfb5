"""Prometheus metrics, aggregated over every process of the server.

prometheus_client's multiprocess mode: each process writes its samples to memory-mapped
files in a directory the supervisor makes (``PROMETHEUS_MULTIPROC_DIR``, set before
prometheus_client is imported), and whichever query process answers ``GET /metrics``
reads them all. So a scrape sees the ingest process and every query process, whichever
process the kernel hands the connection to.
"""

from __future__ import annotations

import asyncio
import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

REQUESTS = Counter("rtindex_http_requests_total", "HTTP requests answered", ["route", "status"])
LATENCY = Histogram("rtindex_http_request_seconds", "HTTP request latency", ["route"], buckets=_LATENCY_BUCKETS)
EXECUTING = Gauge("rtindex_queries_executing", "Queries executing now", multiprocess_mode="livesum")
QUEUED = Gauge("rtindex_queries_queued", "Queries waiting for a slot (queue depth)", multiprocess_mode="livesum")
REFUSED = Counter("rtindex_queries_refused_total", "Queries answered 429 by admission control")
WRITES_THROTTLED = Counter("rtindex_writes_throttled_total", "Write requests answered 429 (in-flight byte limit)")
QUERY_TIMEOUTS = Counter("rtindex_query_timeouts_total", "Queries that ran past their timeout")
INGEST_DOCS = Counter("rtindex_ingest_documents_total", "Documents stored")
INGEST_BYTES = Counter("rtindex_ingest_bytes_total", "Bytes of documents stored (as JSON)")
INGEST_ERRORS = Counter("rtindex_ingest_item_errors_total", "Documents refused with an item error")
STALENESS = Histogram("rtindex_query_staleness_seconds",
                         "How far behind the writer a query process was when a query ran (the data latency it saw)",
                         buckets=_LATENCY_BUCKETS)
READER_LAG_ROWS = Gauge("rtindex_reader_lag_rows", "Rows the query process has not indexed yet", ["pid"],
                        multiprocess_mode="liveall")
READER_LAG_MS = Gauge("rtindex_reader_lag_ms", "Milliseconds the query process is behind the writer", ["pid"],
                      multiprocess_mode="liveall")
ROW_CACHE = Gauge("rtindex_row_cache", "RowStoreCache counters of each process", ["pid", "counter"],
                  multiprocess_mode="liveall")

SOURCE = Gauge("rtindex_source", "Each source's counters (messages, bytes, documents, errors, lag_total, "
               "messages_per_s, bytes_per_s)", ["collection", "source", "counter"], multiprocess_mode="liveall")
_SOURCE_COUNTERS = ("messages", "bytes", "documents", "errors", "lag_total", "messages_per_s", "bytes_per_s")


class AdmissionGauges:
    """What server/admission.py reports, kept off its hot path."""

    def admission(self, executing: int, queued: int) -> None:
        EXECUTING.set(executing)
        QUEUED.set(queued)

    def refused(self) -> None:
        REFUSED.inc()


def observe_db(db) -> None:
    """A process's own database numbers, sampled when metrics are scraped."""
    stats = db.stats()
    pid = str(os.getpid())
    for name, value in stats["row_cache"].items():
        if isinstance(value, (int, float)):
            ROW_CACHE.labels(pid, name).set(value)
    for coll, cstats in stats["collections"].items():
        for src in cstats.get("sources", ()):
            for counter in _SOURCE_COUNTERS:
                SOURCE.labels(coll, src["name"], counter).set(src[counter])
    if "lag" in stats:
        READER_LAG_ROWS.labels(pid).set(stats["lag"]["rows"])
        READER_LAG_MS.labels(pid).set(stats["lag"]["ms"])


async def sample_forever(db, every: float = 1.0) -> None:
    """``observe_db`` once a second, in every process that has a database (the ingest
    process's row cache is on /metrics too), until cancelled."""
    while True:
        try:
            observe_db(db)
        except Exception:  # a closing database: the next sample is the next process's
            pass
        await asyncio.sleep(every)


def exposition() -> bytes:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return generate_latest(registry)


def process_died(pid: int, metrics_dir: str) -> None:
    """Drop a dead process's live gauges (the supervisor calls it; counters stay summed)."""
    multiprocess.mark_process_dead(pid, metrics_dir)
