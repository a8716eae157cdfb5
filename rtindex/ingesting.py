"""Interpreter settings while documents are ingested: the cyclic GC paused, threads
switched more often.

- **The cyclic garbage collector is paused.** Ingest makes and drops millions of
  containers (the dicts and lists of parsed documents, a batch of them alive at a time)
  and creates no reference cycles, but the collector, triggered by allocation counts,
  keeps traversing them, more so the more objects the process holds: with it running,
  ingest is much slower, NDJSON most (measured: docs/benchmarks.md, "Ingest"). Between
  batches :func:`collect_young` collects the young generations, so cycles that the
  caller's own code (a generator feeding ingest) makes are still freed; older ones wait
  for the next full collection after the ingest.
- **The interpreter switches threads every 0.5 ms instead of 5.** The ingest thread holds
  the GIL nearly all the time, and the sealer thread needs it between its native steps
  (hundreds per segment: a copy, an Arrow call, a write per column), each time waiting for
  the ingest thread's switch interval. With 5 ms the sealer falls behind, so every shard
  keeps its maximum of in-memory segments waiting, a large share of the RSS while
  streaming events; with 0.5 ms it keeps up, and ingest is as fast.

Both hold while any thread is inside :func:`ingest_mode`, and are undone when the last one
leaves (a collector the caller had turned off stays off; the caller's interval comes back).
"""

from __future__ import annotations

import gc
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

SWITCH_INTERVAL = 0.0005

_lock = threading.Lock()
_inside = 0  # threads inside ingest_mode()
_gc_was_enabled = False  # as found by the first of them
_interval_was = 0.005


@contextmanager
def ingest_mode() -> Iterator[None]:
    global _inside, _gc_was_enabled, _interval_was
    with _lock:
        if _inside == 0:
            _gc_was_enabled = gc.isenabled()
            _interval_was = sys.getswitchinterval()
            gc.disable()
            sys.setswitchinterval(min(_interval_was, SWITCH_INTERVAL))
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0:
                sys.setswitchinterval(_interval_was)
                if _gc_was_enabled:
                    gc.enable()


def collect_young() -> None:
    """Collect generations 0 and 1: objects made since the last collection that are still
    alive, which between two ingest batches are few (the batch before is gone)."""
    gc.collect(1)
