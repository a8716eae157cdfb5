"""Python's cyclic garbage collector paused while documents are ingested.

Ingest makes and drops millions of containers (the dicts and lists of parsed documents, a
batch of them alive at a time) and creates no reference cycles. The collector, triggered by
allocation counts, keeps traversing them anyway, and more so the more objects the process
holds: measured on 100k RockBench events (docs/benchmarks.md), NDJSON ingest ran at 9.7k
docs/s with it and 19.3k without; dicts already in memory at 20k and 26k.

So automatic collection is off while any thread is inside :func:`paused`, and on again
when the last one leaves (unless it was off when the first one came in: the caller's
choice stands). Between batches :func:`collect_young` collects the young generations, so
cycles that the caller's own code (a generator feeding ingest) makes while it runs are
still freed; older ones wait for the next full collection after the ingest.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.Lock()
_inside = 0  # threads inside paused()
_was_enabled = False  # gc.isenabled() when the first of them came in


@contextmanager
def paused() -> Iterator[None]:
    global _inside, _was_enabled
    with _lock:
        if _inside == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0 and _was_enabled:
                gc.enable()


def collect_young() -> None:
    """Collect generations 0 and 1: objects made since the last collection that are still
    alive, which between two ingest batches are few (the batch before is gone)."""
    gc.collect(1)
