#!/usr/bin/env python
"""A collection spread over a Ray cluster (rtindex.open_cluster) against one process
(rtindex.open): what the coordinator and the round trips cost a query, whether the answers
are the same, and how ingest and query throughput would grow with storage nodes.

    python benchmarks/cluster.py [--quick] [--events N] [--clicks N] [--nodes N,N,...]
                                 [--seconds S] [--seed S] [--dir DIR] [--keep]

Every cluster is real and on this machine: Ray's multi-node test utility
(``ray.cluster_utils.Cluster``, as tests/ray_cluster.py) starts a head node (one CPU, no
storage resource) and storage nodes named a, b, ... (each a raylet with its own small object
store and the resource ``rtindex-node:NAME``), and this process is the coordinator
(``rtindex.open_cluster``). Each storage node is a set of real processes, but they all share
this machine's cores: compare figures within one run, not with another machine's.

Data (``rtindex.datagen``, generated once before anything is timed): ``--events``
RockBench-style events and ``--clicks`` ``product_clicks`` rows. Collections ``events`` and
``product_clicks`` have ``SHARDS`` shards everywhere (on a node count that does not divide
it, the next multiple of the node count); each group database (and the one process) is
opened with the same ``OPEN_OPTIONS``. Query parameters are drawn once: ``_id``
values of stored events, processBy values uniformly from those that occur (most match a
handful of events), email addresses that occur, random cities.

1. One process (``rtindex.open``): events, then clicks, ingested in batches of ``BATCH``
   documents and flushed (every segment sealed); the events' ingest rate and this process's
   CPU per document; then QPS and CPU per query of the processBy and CTR queries below, one
   client for ``--seconds`` each. It is closed while the clusters run and opened again for
   step 3.

2. Scale: for each node count N of ``--nodes``, a fresh cluster of N storage nodes; both
   collections with ``groups=N`` (one group of shards per node). Measured:

   * ingest: the events through the coordinator, ``BATCH`` documents per ``ingest()`` call,
     then ``flush()``: ``ingest_docs_per_s`` is events over the time of both (sealing is
     part of the cost of storing). The clicks are then loaded the same way (not measured).
   * queries, one client thread for ``--seconds`` each, after a short warm-up:
     ``SELECT * FROM events WHERE processBy = :p`` (``processby_qps``) and the CTR query of
     benchmarks/query.py, ``RT_CTR`` with a random ``:city`` (``ctr_qps``).
   * CPU during each of those phases: per storage node, the user + system CPU seconds of
     its raylet and every descendant of the raylet (the group's writer, its query actor,
     which follows the writer as a read replica does, Ray's agents), including children
     they reaped, from psutil before and after; the
     coordinator's own (this process: the planner, DuckDB, Ray's client side); and, for
     information, the head node's processes (GCS, the head's raylet, which moves the
     coordinator's objects, the catalog actor, the dashboard). Reported as CPU seconds per
     thousand documents ingested and CPU milliseconds per query, per node (a list in node
     order) and for the coordinator.

3. Overhead on one machine (the cluster of ``OVERHEAD_NODES`` storage nodes of step 2, or
   one started for it when that count is not in ``--nodes``), against the one process,
   all holding the same flushed data. Two coordinators of the cluster: ``cluster``, as
   ``open_cluster`` opens one by default (the groups whose directories are on its machine,
   here all of them, read in its own process: rtindex/cluster/local.py), and ``actors``
   (``local_reads=False``: every group read through its query actor, as a coordinator on
   a machine without storage reads; steps 2's coordinator is of this kind, so that the
   storage nodes do the reading their CPU figures are of).

   * point query ``SELECT * FROM events WHERE _id = :id`` on random stored ``_id`` values,
     run in blocks that alternate between the three (local, cluster, actors, then the
     reverse, ...), ``BLOCKS`` blocks each, ``--seconds`` per side in all; a block's p50
     latency, then the median over each side's blocks: ``point_overhead_ms`` = cluster -
     local, ``point_overhead_ms_actors`` = actors - local.
     Where the actors' time goes: ``ray_call_p50_ms`` (a no-op call of a query
     actor: one round trip), ``snapshot_open_p50_ms`` (``collection.snapshot().count()``:
     every group's query actor pins its snapshot, one round trip to every group, the first
     of a query) and ``get_p50_ms`` (``collection.get``: one round trip to the one group of
     the ``_id``).
   * the CTR query, random city, likewise: ``ctr_ratio`` = cluster p50 / local p50,
     ``ctr_ratio_actors`` = actors p50 / local p50.
   * ``answers_equal`` (both coordinators): a fixed list of queries (point by ``_id``, processBy, emails,
     CTR of a few cities, an absent value of each, COUNT and GROUP BY over the events and
     the clicks) answered by both; ``rows()`` must be equal, floats within ``REL_TOL``
     relative, as multisets when the query has no ORDER BY, else in the returned order,
     where rows of equal ORDER BY keys (ties) may come in any order and, when LIMIT cuts
     through the last tie, be any rows of it: both are right answers (the CTR query's
     ``ctr`` has ties). Disagreements are printed with the query and both answers.

The model (``predicted_*``, for N in ``MODEL_NODES``): N storage nodes on machines of one
core each and the coordinator on a core of its own; CPU is the only limit, so the busiest
of them bounds the rate. Ingest: with c0 the coordinator's CPU seconds per document and c1
the storage nodes' together (each document is stored by the one group its ``_id`` hashes
to, so N nodes share c1), the prediction is min(1 / c0, N / c1) documents per second, from
the costs measured on the ``OVERHEAD_NODES``-node cluster (or, if it was not measured, the
largest one). Queries: a query asks every group (opening its snapshot, then each lookup,
fetch or scan), so each node pays a fixed part f per query whatever N, besides its share
w / N of the work that is split by the data; the storage CPU per query summed over nodes is
fit over the measured node counts as w + f * N, and the coordinator's as a + b * N (more
groups, more calls to make and answers to merge), by least squares with no coefficient
below zero; the prediction is min(1 / (a + b * N), 1 / (f + w / N)) queries per second.
With one node count measured, b = w = 0: the coordinator and every node pay what they paid
then. ``query_model`` holds the coefficients. The model leaves out the network, which this
machine does not have, and the head node's work.

Progress and PASS/FAIL lines for the targets (``point_overhead_ms`` at most
``TARGET_POINT_OVERHEAD_MS``, ``ctr_ratio`` at most ``TARGET_CTR_RATIO``, ``answers_equal``)
go to stderr; a summary table to stdout, and as the LAST line one JSON object:
``answers_equal``, ``point_overhead_ms``, ``point_p50_ms_local``, ``point_p50_ms_cluster``,
``ctr_ratio``, ``ctr_p50_ms_local``, ``ctr_p50_ms_cluster``, the same through the query
actors (``point_overhead_ms_actors``, ``point_p50_ms_actors``, ``ctr_ratio_actors``,
``ctr_p50_ms_actors``), the round-trip figures,
``ingest_docs_per_s``, ``processby_qps``, ``ctr_qps`` (and p50s), the CPU figures (dicts:
node count -> value, or -> list of per-node values), ``predicted_ingest_docs_per_s``,
``predicted_query_qps`` (per query kind), ``query_model``, the one process's figures
(``..._local``), ``events``, ``clicks``, ``quick``, ``nodes``, ``errors``. A figure is null when its step failed; the
failure is named in ``errors`` and the exit status is 1.

``--quick`` (fewer events and clicks, shorter measurements) is meant to finish in a few
minutes on two cores; most of the time goes into starting clusters and loading data.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import orjson  # noqa: E402
import psutil  # noqa: E402

from benchmarks import datagen  # noqa: E402
from benchmarks.figures import check, rnd  # noqa: E402
from benchmarks.ingest import Progress, log  # noqa: E402
from benchmarks.query import CTR_LIMIT, RT_CTR, RT_EMAIL, RT_PB, generate  # noqa: E402

EVENTS, CLICKS = "events", "product_clicks"
SHARDS = 4
BATCH = 5000  # documents per ingest() call
OBJECT_STORE_BYTES = 80 << 20  # Ray's smallest object store, as tests/ray_cluster.py
OPEN_OPTIONS = {"row_cache_bytes": 64 << 20, "column_cache_bytes": 128 << 20}
OVERHEAD_NODES = 2
BLOCKS = 8  # alternating blocks per side in the overhead comparison
ROUND_TRIPS = 300  # calls per round-trip figure
MODEL_NODES = (1, 2, 4, 8)
REL_TOL = 1e-9
N_PARAMS = 20_000
TARGET_POINT_OVERHEAD_MS = 1.0
TARGET_CTR_RATIO = 2.0

RT_POINT = "SELECT * FROM events WHERE _id = :id"
NODE_NAMES = "abcdefghijklmnopqrstuvwxyz"


# ---------------------------------------------------------------------------
# Data and parameters
# ---------------------------------------------------------------------------


@dataclass
class Checked:
    """A query whose answers are compared: ``order_by`` names the output columns of its
    ORDER BY (None: no ORDER BY), ``limit`` its LIMIT."""

    label: str
    sql: str
    params: dict | None = None
    order_by: tuple[str, ...] | None = None
    limit: int | None = None


class Workload:
    def __init__(self, events: list[dict], clicks: list[dict], seed: int):
        self.events, self.clicks = events, clicks
        rng = random.Random(seed)
        self.ids = [events[rng.randrange(len(events))]["_id"] for _ in range(N_PARAMS)]
        distinct = sorted({d["processBy"] for d in events if "processBy" in d})
        self.pbs = [rng.choice(distinct) for _ in range(N_PARAMS)]
        self.cities = [datagen.random_city(rng) for _ in range(N_PARAMS)]
        self.has_emails = any(d.get("emails") for d in events[:1000])
        self.emails = datagen.sample_emails(events, k=8, seed=seed) if self.has_emails else []
        self.point = [{"id": i} for i in self.ids]
        self.processby = [{"p": p} for p in self.pbs]
        self.ctr = [{"city": c} for c in self.cities]

    def checked_queries(self) -> list[Checked]:
        """The queries answered by both the cluster and the one process."""
        out: list[Checked] = []
        for i in [*self.ids[:4], "ev-absent"]:
            out.append(Checked(f"point {i}", RT_POINT, {"id": i}))
        for p in dict.fromkeys([datagen.process_by_value(0), *self.pbs[:4], "host-absent"]):
            out.append(Checked(f"processBy {p}", RT_PB, {"p": p}))
        for e in [*self.emails[:4], "nobody@absent.invalid"] if self.has_emails else []:
            out.append(Checked(f"emails {e}", RT_EMAIL, {"e": e}))
        for c in dict.fromkeys([*self.cities[:4], "NOWHERE0"]):
            out.append(Checked(f"ctr {c}", RT_CTR, {"city": c}, ("ctr",), CTR_LIMIT))
        out += [
            Checked("count events", "SELECT COUNT(*) AS n FROM events"),
            Checked("count clicks", "SELECT COUNT(*) AS n, SUM(clicks) AS c, SUM(impressions) AS i "
                    "FROM product_clicks"),
            Checked("group by event_type", "SELECT event_type, COUNT(*) AS n, AVG(duration_ms) AS ms, "
                    "MAX(score) AS top FROM events GROUP BY event_type ORDER BY event_type", None, ("event_type",)),
            Checked("group by level", "SELECT level, COUNT(*) AS n FROM events WHERE status >= 400 GROUP BY level"),
            Checked("group by tier", "SELECT tier, COUNT(*) AS n, SUM(bytes) AS b FROM events WHERE severity > 2 "
                    "GROUP BY tier ORDER BY n DESC, tier", None, ("n", "tier")),
        ]
        return out


# ---------------------------------------------------------------------------
# CPU accounting
# ---------------------------------------------------------------------------


def _tree_cpu(roots: list[int]) -> float:
    """User + system CPU seconds of the processes ``roots`` and all their descendants
    (each counted once), with what they reaped of children that ended."""
    procs: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            p = psutil.Process(pid)
            procs[p.pid] = p
            for c in p.children(recursive=True):
                procs[c.pid] = c
        except psutil.Error:
            continue
    total = 0.0
    for p in procs.values():
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _own_cpu() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


class Meter:
    """CPU seconds of the coordinator (this process), the head node's processes and each
    storage node's raylet tree between start() and stop(), and the wall time."""

    def __init__(self, node_roots: list[list[int]], head_roots: list[int]):
        self.node_roots, self.head_roots = node_roots, head_roots

    def start(self) -> Meter:
        self._nodes = [_tree_cpu(r) for r in self.node_roots]
        self._head = _tree_cpu(self.head_roots)
        self._coord = _own_cpu()  # last: psutil's own work is left out of the coordinator's
        self._t = time.perf_counter()
        return self

    def stop(self) -> dict[str, Any]:
        wall = time.perf_counter() - self._t
        coord = _own_cpu() - self._coord
        return {"wall": wall, "coordinator": coord, "head": _tree_cpu(self.head_roots) - self._head,
                "nodes": [_tree_cpu(r) - b for r, b in zip(self.node_roots, self._nodes)]}


class LocalMeter:
    """The one process's CPU (this process) and wall time."""

    def start(self) -> LocalMeter:
        self._coord, self._t = _own_cpu(), time.perf_counter()
        return self

    def stop(self) -> dict[str, Any]:
        return {"wall": time.perf_counter() - self._t, "coordinator": _own_cpu() - self._coord}


# ---------------------------------------------------------------------------
# Clusters
# ---------------------------------------------------------------------------


class LocalCluster:
    """A head and ``n`` storage nodes on this machine, the coordinator in this process."""

    def __init__(self, n: int, root: str):
        import ray
        from ray.cluster_utils import Cluster

        self.n, self.root = n, root
        t0 = time.perf_counter()
        self.cluster = Cluster(initialize_head=True,
                               head_node_args={"num_cpus": 1, "object_store_memory": OBJECT_STORE_BYTES})
        try:
            self.storage = [self.cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES,
                                                  resources={f"rtindex-node:{name}": 1})
                            for name in NODE_NAMES[:n]]
            self.cluster.wait_for_nodes()
            import rtindex
            self.db = rtindex.open_cluster(self.cluster.address, root=root, options=dict(OPEN_OPTIONS),
                                           local_reads=False)
        except BaseException:
            ray.shutdown()
            self.cluster.shutdown()
            raise
        self.start_s = time.perf_counter() - t0

    def meter(self) -> Meter:
        roots = [[_raylet_pid(node)] for node in self.storage]
        head = [p.process.pid for infos in self.cluster.head_node.all_processes.values() for p in infos]
        return Meter(roots, head)

    def shutdown(self) -> None:
        import ray

        try:
            self.db.close()
        finally:
            ray.shutdown()
            self.cluster.shutdown()


def _raylet_pid(node: Any) -> int:
    from ray._private import ray_constants

    return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def load(coll: Any, docs: list[dict], label: str) -> float:
    """Ingest ``docs`` in BATCH-document calls, then flush; seconds taken."""
    p = Progress(label, len(docs))
    t0 = time.perf_counter()
    n = 0
    for i in range(0, len(docs), BATCH):
        batch = docs[i:i + BATCH]
        n += coll.ingest(batch, errors="raise").n
        p.update(i + len(batch))
    coll.flush()
    el = time.perf_counter() - t0
    p.finish(" (flushed)")
    if n != len(docs):
        raise RuntimeError(f"{label}: {n} documents stored of {len(docs)}")
    return el


def run_for(fn: Callable[[dict], Any], params: list[dict], seconds: float, start: int = 0) -> tuple[list[float], int]:
    """``fn`` on ``params`` in order from ``start`` (cycling) for ``seconds`` (at least three
    calls): each call's latency in seconds, and the index after the last parameter used."""
    lat: list[float] = []
    clock = time.perf_counter
    deadline = clock() + seconds
    k = start
    while True:
        t = clock()
        fn(params[k % len(params)])
        t2 = clock()
        lat.append(t2 - t)
        k += 1
        if t2 >= deadline and len(lat) >= 3:
            return lat, k


def p50_ms(lat: list[float]) -> float:
    return statistics.median(lat) * 1e3


def sql_fn(db: Any, text: str) -> Callable[[dict], int]:
    return lambda p: len(db.sql(text, p).rows())


def throughput(label: str, db: Any, text: str, params: list[dict], seconds: float, meter: Any) -> dict[str, Any]:
    """One client for ``seconds`` after a short warm-up; QPS, p50 and CPU per query."""
    fn = sql_fn(db, text)
    _, k = run_for(fn, params, min(1.0, seconds / 4))
    m = meter.start()
    lat, _ = run_for(fn, params, seconds, start=k)
    cpu = m.stop()
    n = len(lat)
    out = {"qps": n / cpu["wall"], "p50_ms": p50_ms(lat), "queries": n,
           "coordinator_cpu_ms": cpu["coordinator"] / n * 1e3}
    if "nodes" in cpu:
        out["node_cpu_ms"] = [c / n * 1e3 for c in cpu["nodes"]]
        out["head_cpu_ms"] = cpu["head"] / n * 1e3
    log(f"  [{label}] {n:,} queries in {cpu['wall']:.1f}s: {out['qps']:,.1f} q/s, p50 {out['p50_ms']:.2f} ms; "
        f"CPU ms/query: coordinator {out['coordinator_cpu_ms']:.2f}"
        + (f", nodes {', '.join(f'{c:.2f}' for c in out['node_cpu_ms'])}, head {out['head_cpu_ms']:.2f}"
           if "nodes" in cpu else ""))
    return out


def ingest_run(label: str, coll: Any, docs: list[dict], meter: Any) -> dict[str, Any]:
    m = meter.start()
    load(coll, docs, label)
    cpu = m.stop()
    k = len(docs) / 1000
    out = {"docs_per_s": len(docs) / cpu["wall"], "coordinator_cpu_s_per_1000": cpu["coordinator"] / k}
    if "nodes" in cpu:
        out["node_cpu_s_per_1000"] = [c / k for c in cpu["nodes"]]
        out["head_cpu_s_per_1000"] = cpu["head"] / k
    log(f"  [{label}] CPU s per 1000 docs: coordinator {out['coordinator_cpu_s_per_1000']:.3f}"
        + (f", nodes {', '.join(f'{c:.3f}' for c in out['node_cpu_s_per_1000'])}, "
           f"head {out['head_cpu_s_per_1000']:.3f}" if "nodes" in cpu else ""))
    return out


# ---------------------------------------------------------------------------
# Comparing answers
# ---------------------------------------------------------------------------


def _close(a: Any, b: Any) -> bool:
    if type(a) is float and type(b) is float:
        return a == b or math.isclose(a, b, rel_tol=REL_TOL) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _rounded(v: Any) -> Any:
    if type(v) is float:
        return float(f"{v:.6g}") if math.isfinite(v) else str(v)
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_rounded(x) for x in v]
    return v


def _sort_key(row: Any) -> bytes:
    return orjson.dumps(_rounded(row), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)


def _same_multiset(a: list, b: list) -> bool:
    return len(a) == len(b) and all(_close(x, y) for x, y in zip(sorted(a, key=_sort_key), sorted(b, key=_sort_key)))


def same_rows(got: list, want: list, order_by: tuple[str, ...] | None = None, limit: int | None = None) -> bool:
    """Equal answers: as multisets without ORDER BY; with it, in order, but rows whose
    ORDER BY keys are equal (a tie) in any order, and when LIMIT cuts through the last tie,
    any rows of it (both are right answers)."""
    if len(got) != len(want):
        return False
    if order_by is None:
        return _same_multiset(got, want)

    def key(r: dict) -> list:
        return [r.get(k) for k in order_by]
    if not all(_close(key(x), key(y)) for x, y in zip(got, want)):
        return False
    i = 0
    while i < len(want):
        j = i + 1
        while j < len(want) and _close(key(want[j]), key(want[i])):
            j += 1
        cut = limit is not None and len(want) == limit and j == len(want)
        if not cut and not _same_multiset(got[i:j], want[i:j]):
            return False
        i = j
    return True


def compare_answers(w: Workload, cdb: Any, ldb: Any) -> tuple[int, list[str]]:
    """(queries checked, labels of those whose answers differ)."""
    bad = []
    queries = w.checked_queries()
    for q in queries:
        try:
            want = ldb.sql(q.sql, q.params).rows()
            got = cdb.sql(q.sql, q.params).rows()
        except Exception as e:  # noqa: BLE001 - a failing query is a disagreement, reported
            log(f"!! answers: {q.label}: {type(e).__name__}: {e}")
            bad.append(q.label)
            continue
        if not same_rows(got, want, q.order_by, q.limit):
            bad.append(q.label)
            at = next((i for i, (x, y) in enumerate(zip(got, want)) if not _close(x, y)), min(len(got), len(want)))
            log(f"!! answers differ: {q.label}: {q.sql} {q.params}; from row {at}:\n"
                f"   local   ({len(want)} rows): {str(want[at:at + 5])[:600]}\n"
                f"   cluster ({len(got)} rows): {str(got[at:at + 5])[:600]}")
    log(f"answers: {len(queries) - len(bad)} of {len(queries)} queries agree")
    return len(queries), bad


# ---------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------


def open_local(path: str) -> Any:
    import rtindex

    return rtindex.open(path, **OPEN_OPTIONS)


def local_step(w: Workload, path: str, seconds: float) -> dict[str, Any]:
    """Load the one process and measure it; it is closed afterwards."""
    db = open_local(path)
    try:
        out: dict[str, Any] = {}
        ev = db.create_collection(EVENTS, shards=SHARDS)
        out["ingest"] = ingest_run("local events", ev, w.events, LocalMeter())
        out["clicks_load_s"] = load(db.create_collection(CLICKS, shards=SHARDS), w.clicks, "local clicks")
        out["processby"] = throughput("local processBy", db, RT_PB, w.processby, seconds, LocalMeter())
        out["ctr"] = throughput("local CTR", db, RT_CTR, w.ctr, seconds, LocalMeter())
        return out
    finally:
        db.close()


def scale_step(c: LocalCluster, w: Workload, seconds: float, measure: bool) -> dict[str, Any]:
    """Load both collections into the cluster (the events' ingest measured) and, when
    ``measure``, both queries' throughput."""
    out: dict[str, Any] = {"start_s": c.start_s}
    n = c.n
    shards = SHARDS if SHARDS % n == 0 else n * math.ceil(SHARDS / n)
    ev = c.db.create_collection(EVENTS, shards=shards, groups=n)
    meter = c.meter()
    out["ingest"] = ingest_run(f"{n} node(s) events", ev, w.events, meter)
    out["clicks_load_s"] = load(c.db.create_collection(CLICKS, shards=shards, groups=n), w.clicks,
                                f"{n} node(s) clicks")
    if measure:
        out["processby"] = throughput(f"{n} node(s) processBy", c.db, RT_PB, w.processby, seconds, meter)
        out["ctr"] = throughput(f"{n} node(s) CTR", c.db, RT_CTR, w.ctr, seconds, meter)
    return out


def alternate(label: str, fns: dict[str, Callable[[dict], Any]], params: list[dict], seconds: float) -> dict:
    """BLOCKS blocks per side, alternating (the sides in order, then reversed, ...),
    ``seconds`` per side in all; each side's block p50s and their median."""
    block = seconds / BLOCKS
    at = {side: run_for(fn, params, min(1.0, seconds / 4))[1] for side, fn in fns.items()}  # warm-up
    p50s: dict[str, list[float]] = {side: [] for side in fns}
    sides = list(fns)
    for b in range(BLOCKS):
        for side in (sides if b % 2 == 0 else sides[::-1]):
            lat, at[side] = run_for(fns[side], params, block, start=at[side])
            p50s[side].append(p50_ms(lat))
    med = {side: statistics.median(v) for side, v in p50s.items()}
    log(f"  [{label}] median of block p50s: " + ", ".join(f"{s} {med[s]:.3f} ms" for s in sides)
        + "; blocks: " + "; ".join(f"{s} " + " ".join(f"{x:.2f}" for x in p50s[s]) for s in sides))
    return {"p50_ms": med, "blocks": p50s}


def round_trips(c: LocalCluster, w: Workload) -> dict[str, float]:
    """Where a cluster point query's time goes: one actor round trip, opening a snapshot
    (pinned in every group), a get by _id (p50 ms of ROUND_TRIPS calls each, after as many
    warm-up calls)."""
    import ray

    coll = c.db.collection(EVENTS)
    reader = coll.readers()[0][0]
    calls = {
        "ray_call_p50_ms": lambda p: ray.get(reader.ready.remote()),
        "snapshot_open_p50_ms": lambda p: coll.snapshot().count(),
        "get_p50_ms": lambda p: coll.get(p["id"]),
    }
    out = {}
    for name, fn in calls.items():
        for p in w.point[:ROUND_TRIPS]:
            fn(p)
        lat = []
        for p in w.point[ROUND_TRIPS:2 * ROUND_TRIPS]:
            t = time.perf_counter()
            fn(p)
            lat.append(time.perf_counter() - t)
        out[name] = p50_ms(lat)
    log("  [round trips] " + ", ".join(f"{k} {v:.3f}" for k, v in out.items()))
    return out


def overhead_step(c: LocalCluster, w: Workload, local_path: str, seconds: float) -> dict[str, Any]:
    import rtindex

    ldb = open_local(local_path)
    near = rtindex.open_cluster(c.cluster.address)  # node-local reads, as by default
    try:
        adb = c.db
        out: dict[str, Any] = {}
        for name, db in (("cluster", near), ("actors", adb)):
            log(f"EXPLAIN ({name}) of the point query:\n{db.explain(RT_POINT, {'id': w.ids[0]})}")
        dbs = {"local": ldb, "cluster": near, "actors": adb}
        out["point"] = alternate("point", {k: sql_fn(db, RT_POINT) for k, db in dbs.items()}, w.point, seconds)
        out["ctr"] = alternate("CTR", {k: sql_fn(db, RT_CTR) for k, db in dbs.items()}, w.ctr, seconds)
        out["round_trips"] = round_trips(c, w)
        checked, near_bad = compare_answers(w, near, ldb)
        _, actors_bad = compare_answers(w, adb, ldb)
        out["checked"], out["mismatches"] = checked, [f"{q} (cluster)" for q in near_bad] + [
            f"{q} (actors)" for q in actors_bad]
        return out
    finally:
        near.close()
        ldb.close()


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


def _fit(points: list[tuple[int, float]], grows: bool) -> tuple[float, float]:
    """y = u + v * n by least squares over (n, y), neither coefficient below zero. From one
    point: all of y in v (``grows``, y = v * n) or all in u (y = u)."""
    if len(points) == 1:
        n, y = points[0]
        return (0.0, y / n) if grows else (y, 0.0)
    ns, ys = [p[0] for p in points], [p[1] for p in points]
    mn, my = statistics.fmean(ns), statistics.fmean(ys)
    sxx = sum((n - mn) ** 2 for n in ns)
    v = sum((n - mn) * (y - my) for n, y in points) / sxx if sxx else 0.0
    u = my - v * mn
    if v < 0:
        return max(0.0, my), 0.0
    if u < 0:
        return 0.0, sum(n * y for n, y in points) / sum(n * n for n in ns)
    return u, v


def model(scale: dict[int, dict]) -> dict[str, Any]:
    out: dict[str, Any] = {"predicted_ingest_docs_per_s": None, "predicted_query_qps": None,
                           "query_model": None, "model_from_nodes": None}
    ingested = {n: r["ingest"] for n, r in scale.items() if r.get("ingest")}
    if ingested:
        base = OVERHEAD_NODES if OVERHEAD_NODES in ingested else max(ingested)
        r = ingested[base]
        c0 = r["coordinator_cpu_s_per_1000"] / 1000
        c1 = sum(r["node_cpu_s_per_1000"]) / 1000
        out["model_from_nodes"] = base
        out["predicted_ingest_docs_per_s"] = {
            n: min(1 / c0 if c0 > 0 else math.inf, n / c1 if c1 > 0 else math.inf) for n in MODEL_NODES}
    qps: dict[str, dict] = {}
    coef: dict[str, dict] = {}
    for kind in ("processby", "ctr"):
        runs = {n: r[kind] for n, r in scale.items() if r.get(kind)}
        if not runs:
            continue
        a, b = _fit([(n, q["coordinator_cpu_ms"]) for n, q in runs.items()], grows=False)
        w, f = _fit([(n, sum(q["node_cpu_ms"])) for n, q in runs.items()], grows=True)
        coef[kind] = {"coordinator_ms": a, "coordinator_ms_per_node": b, "split_node_ms": w, "fixed_node_ms": f}
        qps[kind] = {n: 1e3 / max(a + b * n, f + w / n, 1e-9) for n in MODEL_NODES}
    if qps:
        out["predicted_query_qps"], out["query_model"] = qps, coef
    return out


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def guarded(name: str, fn: Callable[[], Any], errors: list[str]) -> Any:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a benchmark reports a broken step and goes on
        log(f"!! {name} failed: {type(e).__name__}: {e}")
        traceback.print_exc(file=sys.stderr)
        errors.append(f"{name}: {type(e).__name__}: {e}")
        return None


def with_cluster(n: int, root: str, errors: list[str], fn: Callable[[LocalCluster], Any]) -> Any:
    def run() -> Any:
        log(f"starting a cluster of {n} storage node(s) ...")
        c = LocalCluster(n, root)
        log(f"  cluster up in {c.start_s:.1f}s: nodes {c.db.nodes()}")
        try:
            return fn(c)
        finally:
            c.shutdown()
            shutil.rmtree(root, ignore_errors=True)
    return guarded(f"{n}-node cluster", run, errors)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="20,000 events, 200,000 clicks, 2.5 s per measurement (a few minutes)")
    ap.add_argument("--events", type=int, default=None, help="number of events (default 100,000; --quick 20,000)")
    ap.add_argument("--clicks", type=int, default=None,
                    help="number of product_clicks rows (default 1,000,000; --quick 200,000)")
    ap.add_argument("--nodes", default="1,2,4", help="storage node counts of the scale step (default 1,2,4)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="seconds per measurement: per query kind, per side of a comparison (default 6; --quick 2.5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None, help="parent of the temporary working directory (default /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    args = ap.parse_args(argv)
    n_events = args.events if args.events is not None else (20_000 if args.quick else 100_000)
    n_clicks = args.clicks if args.clicks is not None else (200_000 if args.quick else 1_000_000)
    seconds = args.seconds if args.seconds is not None else (2.5 if args.quick else 6.0)
    try:
        nodes = sorted({int(x) for x in args.nodes.split(",") if x.strip()})
    except ValueError:
        ap.error("--nodes: comma-separated positive integers")
    if not nodes or min(nodes) < 1 or max(nodes) > len(NODE_NAMES):
        ap.error(f"--nodes: comma-separated integers from 1 to {len(NODE_NAMES)}")
    if n_events < 2 * ROUND_TRIPS or n_clicks < 1 or seconds <= 0:
        ap.error(f"--events must be at least {2 * ROUND_TRIPS}, --clicks and --seconds positive")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="rtindex-cluster-", dir=args.dir)
    t_start = time.perf_counter()
    log(f"cluster benchmark: {n_events:,} events, {n_clicks:,} clicks, nodes {nodes}, {seconds:g}s per "
        f"measurement, {SHARDS} shards, dir={work}")

    errors: list[str] = []
    local: dict[str, Any] | None = None
    scale: dict[int, dict] = {}
    over: dict[str, Any] | None = None
    try:
        events, clicks, _ = generate(n_events, n_clicks, args.seed)
        w = Workload(events, clicks, args.seed)
        local_path = os.path.join(work, "local")
        log("one process ...")
        local = guarded("one process", lambda: local_step(w, local_path, seconds), errors)
        for n in nodes:
            def step(c: LocalCluster, n: int = n) -> None:
                nonlocal over
                scale[n] = scale_step(c, w, seconds, measure=True)
                if n == OVERHEAD_NODES and local is not None:
                    over = guarded("overhead", lambda: overhead_step(c, w, local_path, seconds), errors)
            with_cluster(n, os.path.join(work, f"cluster{n}"), errors, step)
        if OVERHEAD_NODES not in nodes and local is not None:
            def step_overhead(c: LocalCluster) -> None:
                nonlocal over
                scale_step(c, w, seconds, measure=False)
                over = guarded("overhead", lambda: overhead_step(c, w, local_path, seconds), errors)
            with_cluster(OVERHEAD_NODES, os.path.join(work, f"cluster{OVERHEAD_NODES}"), errors, step_overhead)
    except KeyboardInterrupt:
        errors.append("interrupted")
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    out = figures(scale, local, over, errors)
    out.update({"events": n_events, "clicks": n_clicks, "quick": args.quick, "nodes": nodes, "seconds": seconds,
                "shards": SHARDS, "batch": BATCH, "errors": errors,
                "total_seconds": time.perf_counter() - t_start})
    print_summary(out)
    print(json.dumps(rnd(out)))
    return 1 if errors else 0


def figures(scale: dict[int, dict], local: dict | None, over: dict | None, errors: list[str]) -> dict[str, Any]:
    def per_node(kind: str, key: str) -> dict[int, Any]:
        return {n: r[kind][key] for n, r in scale.items() if r.get(kind)}

    o = over or {}
    pt, ctr = o.get("point", {}).get("p50_ms", {}), o.get("ctr", {}).get("p50_ms", {})
    out: dict[str, Any] = {
        "answers_equal": (not o.get("mismatches")) if over else None,
        "answers_checked": o.get("checked"),
        "answers_differ": o.get("mismatches"),
        "point_overhead_ms": pt["cluster"] - pt["local"] if pt else None,
        "point_p50_ms_local": pt.get("local"),
        "point_p50_ms_cluster": pt.get("cluster"),
        "ctr_ratio": ctr["cluster"] / ctr["local"] if ctr else None,
        "ctr_p50_ms_local": ctr.get("local"),
        "ctr_p50_ms_cluster": ctr.get("cluster"),
        "point_overhead_ms_actors": pt["actors"] - pt["local"] if pt else None,
        "point_p50_ms_actors": pt.get("actors"),
        "ctr_ratio_actors": ctr["actors"] / ctr["local"] if ctr else None,
        "ctr_p50_ms_actors": ctr.get("actors"),
        **(o.get("round_trips") or {"ray_call_p50_ms": None, "snapshot_open_p50_ms": None, "get_p50_ms": None}),
        "point_block_p50s_ms": o.get("point", {}).get("blocks"),
        "ctr_block_p50s_ms": o.get("ctr", {}).get("blocks"),
        "ingest_docs_per_s": per_node("ingest", "docs_per_s"),
        "processby_qps": per_node("processby", "qps"),
        "ctr_qps": per_node("ctr", "qps"),
        "processby_p50_ms": per_node("processby", "p50_ms"),
        "ctr_p50_ms": per_node("ctr", "p50_ms"),
        "ingest_node_cpu_s_per_1000_docs": per_node("ingest", "node_cpu_s_per_1000"),
        "ingest_coordinator_cpu_s_per_1000_docs": per_node("ingest", "coordinator_cpu_s_per_1000"),
        "ingest_head_cpu_s_per_1000_docs": per_node("ingest", "head_cpu_s_per_1000"),
        "processby_node_cpu_ms_per_query": per_node("processby", "node_cpu_ms"),
        "processby_coordinator_cpu_ms_per_query": per_node("processby", "coordinator_cpu_ms"),
        "processby_head_cpu_ms_per_query": per_node("processby", "head_cpu_ms"),
        "ctr_node_cpu_ms_per_query": per_node("ctr", "node_cpu_ms"),
        "ctr_coordinator_cpu_ms_per_query": per_node("ctr", "coordinator_cpu_ms"),
        "ctr_head_cpu_ms_per_query": per_node("ctr", "head_cpu_ms"),
        **model(scale),
        "cluster_start_s": {n: r["start_s"] for n, r in scale.items()},
        "clicks_load_s": {n: r["clicks_load_s"] for n, r in scale.items() if "clicks_load_s" in r},
    }
    lo = local or {}
    out.update({
        "ingest_docs_per_s_local": lo.get("ingest", {}).get("docs_per_s"),
        "ingest_cpu_s_per_1000_docs_local": lo.get("ingest", {}).get("coordinator_cpu_s_per_1000"),
        "processby_qps_local": lo.get("processby", {}).get("qps"),
        "processby_cpu_ms_per_query_local": lo.get("processby", {}).get("coordinator_cpu_ms"),
        "ctr_qps_local": lo.get("ctr", {}).get("qps"),
        "ctr_cpu_ms_per_query_local": lo.get("ctr", {}).get("coordinator_cpu_ms"),
        "clicks_load_s_local": lo.get("clicks_load_s"),
    })
    return out


def print_summary(r: dict[str, Any]) -> None:
    def f(v: Any, d: int = 2) -> str:
        return "-" if v is None else f"{v:,.{d}f}"

    print()
    print(f"Cluster benchmark: {r['events']:,} events, {r['clicks']:,} product_clicks rows, {r['shards']} shards, "
          f"{r['seconds']:g}s per measurement; every node on this machine")
    print(f"overhead ({OVERHEAD_NODES} storage nodes vs one process):")
    print(f"  point p50: local {f(r['point_p50_ms_local'], 3)} ms, cluster {f(r['point_p50_ms_cluster'], 3)} ms, "
          f"overhead {f(r['point_overhead_ms'], 3)} ms; through query actors {f(r['point_p50_ms_actors'], 3)} ms, "
          f"overhead {f(r['point_overhead_ms_actors'], 3)} ms (one actor round trip {f(r['ray_call_p50_ms'], 3)} ms, "
          f"snapshot open {f(r['snapshot_open_p50_ms'], 3)} ms, get {f(r['get_p50_ms'], 3)} ms)")
    print(f"  CTR p50: local {f(r['ctr_p50_ms_local'])} ms, cluster {f(r['ctr_p50_ms_cluster'])} ms, "
          f"ratio {f(r['ctr_ratio'])}; through query actors {f(r['ctr_p50_ms_actors'])} ms, "
          f"ratio {f(r['ctr_ratio_actors'])}")
    print(f"  answers equal: {r['answers_equal']} ({r['answers_checked']} queries"
          + (f"; differ: {', '.join(r['answers_differ'])}" if r.get("answers_differ") else "") + ")")
    print(f"{'nodes':>6} {'ingest/s':>10} {'pB q/s':>8} {'CTR q/s':>8} {'ingest CPU s/1k: coord':>23} "
          f"{'nodes':>16} {'pB CPU ms/q: coord':>19} {'nodes':>16} {'CTR CPU ms/q: coord':>20} {'nodes':>16}")
    print(f"{'local':>6} {f(r['ingest_docs_per_s_local'], 0):>10} {f(r['processby_qps_local'], 1):>8} "
          f"{f(r['ctr_qps_local'], 1):>8} {f(r['ingest_cpu_s_per_1000_docs_local'], 3):>23} {'':>16} "
          f"{f(r['processby_cpu_ms_per_query_local']):>19} {'':>16} {f(r['ctr_cpu_ms_per_query_local']):>20}")
    for n in r["nodes"]:
        def nl(key: str, d: int = 2) -> str:
            v = r[key].get(n)
            return "-" if v is None else " ".join(f"{x:.{d}f}" for x in v)
        print(f"{n:>6} {f(r['ingest_docs_per_s'].get(n), 0):>10} {f(r['processby_qps'].get(n), 1):>8} "
              f"{f(r['ctr_qps'].get(n), 1):>8} {f(r['ingest_coordinator_cpu_s_per_1000_docs'].get(n), 3):>23} "
              f"{nl('ingest_node_cpu_s_per_1000_docs', 3):>16} "
              f"{f(r['processby_coordinator_cpu_ms_per_query'].get(n)):>19} "
              f"{nl('processby_node_cpu_ms_per_query'):>16} {f(r['ctr_coordinator_cpu_ms_per_query'].get(n)):>20} "
              f"{nl('ctr_node_cpu_ms_per_query'):>16}")
    if r.get("predicted_ingest_docs_per_s"):
        print(f"model (costs of the {r['model_from_nodes']}-node run; N machines of one core each):")
        print("  ingest docs/s: " + ", ".join(f"N={n}: {f(v, 0)}" for n, v in r["predicted_ingest_docs_per_s"].items()))
    for kind, pred in (r.get("predicted_query_qps") or {}).items():
        print(f"  {kind} q/s: " + ", ".join(f"N={n}: {f(v, 1)}" for n, v in pred.items()))
    check("point_overhead_ms", r["point_overhead_ms"], lambda v: v <= TARGET_POINT_OVERHEAD_MS, "{:.3f} ms")
    check("ctr_ratio", r["ctr_ratio"], lambda v: v <= TARGET_CTR_RATIO, "{:.2f}")
    check("answers_equal", r["answers_equal"], lambda v: v)
    for e in r["errors"]:
        print(f"error: {e}")


if __name__ == "__main__":
    sys.exit(main())
