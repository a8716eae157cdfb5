"""kill -9 of the service's processes under writes: what a client was told must hold.

A real ``rtindex serve`` takes writes from client threads (native routes: JSON arrays, NDJSON,
deletes, patches; Rockset's route) while its ingest process is SIGKILLed at random moments,
while it starts and while a seal or merge writes a segment file, and its query processes too.
Then, read at a fence: every acknowledged document once, at its last acknowledged version or
a later one sent unanswered; nothing never sent; no shard's part of an unanswered batch half
there; a batch sent again there once; a fenced read never older than its fence. One more test:
a write cut off with its query process is not stored over a newer one. Replay the operations
with RTINDEX_SEED=<seed> (not the kill moments); a kill run ends with a ``service-crash:`` line.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import orjson
import pytest

from rtindex import documents
from rtindex.server.ingest_app import BATCH_DOCS
from tests.reliability import record
from tests.serving import Served

NATIVE = "nat"  # JSON arrays, NDJSON, deletes and patches; string ids
NATIVE_SHARDS = 3
WORKSPACE, ROCKSET = "crash", "rs"  # Rockset's route; the rtindex collection "crash.rs"; integer ids
ROCKSET_SHARDS = 2
BIG = "big"  # one shard written in volume (serve has no seal_rows option): its segments are sealed and merged
BIG_IDS = 15_000  # the working set of its upserts
DEEP = 70  # nesting of a document the service must refuse (over max_depth)
PAGE = 20_000  # rows per query of the final read
QUERY_WORKERS = 2
REQUEST_TIMEOUT = 60.0  # seconds; a request that takes longer counts as unanswered
HEALTHY_SECONDS = 120.0  # a process that is not back by then never comes back
ABSENT = None  # the state of a document that is not stored


def collection_sql(coll: str) -> str:
    return '"crash"."rs"' if coll == f"{WORKSPACE}.{ROCKSET}" else coll


@dataclass
class Op:
    """One request: what it writes (``_id`` -> version, or ABSENT for a delete)."""

    serial: int  # its documents' version ("v")
    coll: str
    kind: str  # "json", "ndjson", "rockset", "delete", "patch"
    states: dict
    order: list  # the ids of a batch in body order (a batch's parts are cut by position)
    refused: set = field(default_factory=set)  # ids of documents the service must refuse
    attempts: int = 0
    body: bytes = b""


class Ledger:
    """One client's view of its own ids (no other client writes them)."""

    def __init__(self, coll: str, shards: int, marker):
        self.coll = coll
        self.shards = shards
        self.marker = marker  # an id every batch writes again: readers follow it by fence
        self.acked: dict = {}  # _id -> state after the last acknowledged write of it
        self.maybe: dict = {}  # _id -> states of unanswered writes sent after that
        self.sent: dict = {}  # _id -> versions ever sent
        self.last_op: dict = {}  # _id -> serial of the last request that wrote it
        self.refused: set = set()
        self.abandoned: list[Op] = []  # unanswered and not sent again
        self.retried: list[Op] = []  # unanswered, sent again until answered

    def can_be_absent(self, doc_id) -> bool:
        return self.acked.get(doc_id) is ABSENT or ABSENT in self.maybe.get(doc_id, ())

    def can_be_present(self, doc_id) -> bool:
        return self.acked.get(doc_id) is not ABSENT or any(m is not ABSENT for m in self.maybe.get(doc_id, ()))


class Harness:
    def __init__(self, tmp_path, rand, test: str):
        self.rand = rand
        self.seed = rand.seed_value
        self.test = test
        self.data = str(tmp_path / "db")
        self.s: Served | None = None
        self.stop = threading.Event()  # writers: finish the request under way, then end
        self.abort = threading.Event()  # everyone: end now (the test failed)
        self.lock = threading.Lock()
        self.kills: list[tuple[str, float]] = []  # (what, monotonic time just before the SIGKILL)
        self.published: dict = {}  # collection -> (marker, version, fence) of its newest acknowledged batch
        self.counts: Counter = Counter()
        self.cycle_log: list[str] = []
        self.phases: dict[str, float] = {}  # seconds: starting, killing, the final checks
        self.problems: list[str] = []
        self.writers: list[Writer] = []
        self.reader: FenceReader | None = None

    # ---------------------------------------------------------------- shared
    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] += n

    def problem(self, kind: str, msg: str) -> None:
        with self.lock:
            self.counts[kind] += 1
            self.problems.append(f"{kind}: {msg}")

    def publish(self, coll: str, marker, version: int, fence: str) -> None:
        with self.lock:
            self.published[coll] = (marker, version, fence)

    def query_killed_during(self, t0: float, t1: float) -> bool:
        """Whether a query process was killed while a request was under way: the ingest
        process may still store what that process had relayed to it, after the client saw
        the failure, so the client must send it again before it writes those ids anew."""
        with self.lock:
            return any(what == "query" and t0 - 1.0 <= t <= t1 for what, t in self.kills)

    def client(self) -> httpx.Client:
        return self.s.client(timeout=httpx.Timeout(REQUEST_TIMEOUT, connect=10.0))

    # ---------------------------------------------------------------- kills
    def _sigkill(self, what: str, pid: int) -> None:
        with self.lock:
            self.kills.append((what, time.monotonic()))
        os.kill(pid, signal.SIGKILL)

    def ingest_pid(self) -> int:
        pids = self.s.children()["ingest"]
        if len(pids) != 1:
            raise RuntimeError(f"expected one ingest process, found {pids}")
        return pids[0]

    def kill_ingest(self) -> str:
        """A random moment of writing."""
        ran = self.rand.uniform(0.1, 1.0)
        time.sleep(ran)
        self._sigkill("ingest", self.ingest_pid())
        self.count("ingest_kills")
        return f"ingest process killed {ran:.2f} s into writing"

    def kill_ingest_starting(self) -> str:
        """Kill it, then kill the process started in its place while it opens the database
        (recovery: the WAL, mutable segments indexed again, leftovers removed)."""
        pid = self.ingest_pid()
        self._sigkill("ingest", pid)
        new = self.s.replaced("ingest", pid, HEALTHY_SECONDS)[0]
        ran = self.rand.uniform(0.0, 1.5)
        time.sleep(ran)
        self._sigkill("ingest", new)
        self.count("ingest_kills", 2)
        self.count("starting_kills")
        return f"ingest process killed, and the next one {ran:.2f} s after it started"

    def segment_work(self) -> str | None:
        """What BIG's shard is writing a segment file for, judged from its directory: a seal
        while a rotated mutable segment waits (two tail bases), else a merge."""
        shard = os.path.join(self.data, "collections", BIG, "shard-000")
        try:
            writing = [n for n in os.listdir(os.path.join(shard, "segments")) if n.endswith(".tmp")]
            if not writing:
                return None
            bases = {n.split("-")[0] for n in os.listdir(os.path.join(shard, "tails"))}
        except FileNotFoundError:
            return None
        return "seal" if len(bases) >= 2 else "merge"

    def kill_in_segment_write(self, want: str) -> str:
        """Wait for BIG's shard to write a segment file for a seal or a merge (``want``
        first, either after a while), and kill the ingest process at a random moment of it."""
        t0 = time.monotonic()
        doing = None
        while True:
            doing = self.segment_work()
            waited = time.monotonic() - t0
            if doing == want or (doing is not None and waited > 30) or waited > 90:
                break
            time.sleep(0.002)
        seen, waited = doing, time.monotonic() - t0
        time.sleep(self.rand.uniform(0.0, 0.15))
        doing = self.segment_work()  # what was under way at the kill
        self._sigkill("ingest", self.ingest_pid())
        self.count("ingest_kills")
        self.count(f"{doing}_kills" if doing else "after_segment_kills")
        return (f"ingest process killed while {'a ' + doing if doing else 'no seal or merge'} wrote a segment "
                f"file (wanted: a {want}; saw a {seen} after {waited:.1f} s)")

    def kill_query(self) -> str:
        """Kill a query process; the one started in its place must answer a read of the
        newest acknowledged fence with that state or a newer one."""
        time.sleep(self.rand.uniform(0.1, 1.0))
        before = self.s.children()["query"]
        pid = self.rand.choice(before)
        self._sigkill("query", pid)
        self.count("query_kills")
        after = self.s.replaced("query", pid, HEALTHY_SECONDS)
        new = next(p for p in after if p not in before)
        deadline = time.monotonic() + HEALTHY_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.02)
            with self.lock:
                pub = self.published.get(NATIVE)
            with self.client() as c:
                try:  # a new connection lands on either query process: use it once it is the new one
                    hz = c.get("/healthz")
                    if hz.status_code != 200 or hz.json().get("pid") != new or pub is None:
                        continue
                    marker, version, fence = pub
                    r = c.post("/v1/query", json={"sql": f"SELECT v FROM {NATIVE} WHERE _id = :id",
                                                  "parameters": {"id": marker}, "min_fence": fence,
                                                  "timeout_ms": 30_000})
                except httpx.TransportError:
                    continue
            rows = r.json().get("rows") if r.status_code == 200 else None
            if not rows or rows[0]["v"] < version:
                self.problem("stale_reads", f"the restarted query process {new} answered a read at the fence "
                                            f"of version {version} of {marker!r} with {r.status_code}: {r.text[:300]}")
            self.count("query_catchups")
            return f"query process {pid} killed; {new} in its place read at the fence of version {version}"
        raise RuntimeError(f"the restarted query process {new} never took a connection:\n"
                           + "".join(self.s.output[-40:]))

    # ---------------------------------------------------------------- the run
    def start(self) -> None:
        self.s = Served(self.data, "--query-workers", str(QUERY_WORKERS))
        with self.client() as c:
            for name, shards in ((NATIVE, NATIVE_SHARDS), (BIG, 1)):
                r = c.post("/v1/collections", json={"name": name, "shards": shards})
                assert r.status_code == 201, r.text
            r = c.post(f"/v1/orgs/self/ws/{WORKSPACE}/collections", json={"name": ROCKSET, "shards": ROCKSET_SHARDS})
            assert r.status_code == 200, r.text
        def rng(k: int) -> random.Random:  # each client's own sequence
            return random.Random(self.seed * 10 + k)

        self.writers = [NativeWriter(self, rng(1)), RocksetWriter(self, rng(2)), BigWriter(self, rng(3))]
        self.reader = FenceReader(self, rng(4))
        for t in (*self.writers, self.reader):
            t.start()

    def run(self, plan: list[str]) -> None:
        t0 = time.monotonic()
        self.start()
        self.phases["start"] = time.monotonic() - t0
        try:
            self.rand.shuffle(plan)
            kill = {"ingest": self.kill_ingest, "starting": self.kill_ingest_starting, "query": self.kill_query,
                    "seal": lambda: self.kill_in_segment_write("seal"),
                    "merge": lambda: self.kill_in_segment_write("merge")}
            for i, action in enumerate(plan + ["none"]):
                t = time.monotonic()
                self.s.healthy(HEALTHY_SECONDS)
                if i:
                    self.cycle_log[-1] += f"; all processes answer {time.monotonic() - t:.1f} s later"
                if action == "none":
                    break
                self.cycle_log.append(f"cycle {i}: {kill[action]()}")
                self.count("cycles")
                for w in self.writers:
                    if w.error is not None:
                        raise w.error
            time.sleep(0.5)  # writes after the last restart
            self.phases["kills"] = time.monotonic() - t0 - self.phases["start"]
            self.stop.set()
            for w in self.writers:
                w.join(HEALTHY_SECONDS * 2)
                if w.is_alive():
                    raise RuntimeError(f"{w.name} did not finish its requests:\n" + "".join(self.s.output[-40:]))
                if w.error is not None:
                    raise w.error
            self.reader.join(30)
            self.s.healthy(HEALTHY_SECONDS)
            for w in self.writers:
                w.final_write()
            self.verify()
            self.phases["check"] = time.monotonic() - t0 - self.phases["start"] - self.phases["kills"]
        finally:
            self.abort.set()
            self.stop.set()
            t_stop = time.monotonic()
            code = self.s.stop() if self.s is not None else 0
            self.phases["stop"] = time.monotonic() - t_stop
        if code != 0:
            self.problem("service", f"rtindex serve ended with status {code}")
        self.report(time.monotonic() - t0)

    # ---------------------------------------------------------------- checks
    def observe(self, c: httpx.Client, coll: str, fence: str) -> dict:
        """_id -> the versions of its rows, read through a query process at ``fence``."""
        got: dict = {}
        offset = 0
        while True:
            r = c.post("/v1/query", json={"sql": f"SELECT _id, v FROM {collection_sql(coll)} ORDER BY _id, v "
                                                 f"LIMIT {PAGE} OFFSET {offset}",
                                          "min_fence": fence, "timeout_ms": 60_000})
            assert r.status_code == 200, r.text
            rows = r.json()["rows"]
            for row in rows:
                got.setdefault(row["_id"], []).append(row["v"])
            if len(rows) < PAGE:
                return got
            offset += PAGE

    def verify(self) -> None:
        with self.client() as c:
            for w in self.writers:
                led = w.ledger
                rows = self.observe(c, led.coll, w.fence)
                self.count("documents", len(rows))
                # the same connection, so the same query process, which followed to the fence
                listed = {x["name"]: x["documents"] for x in c.get("/v1/collections").json()["collections"]}
                if listed.get(led.coll) != len(rows):
                    self.problem("counts", f"{led.coll} lists {listed.get(led.coll)} documents, "
                                           f"a query finds {len(rows)}")
                self.check_ledger(led, rows)
                self.check_batches(led, rows)
                self.check_retries(led, rows)
                self.check_rows_by_id(c, led, rows)

    def check_ledger(self, led: Ledger, rows: dict) -> None:
        self.count("acknowledged", sum(1 for s in led.acked.values() if s is not ABSENT))
        for doc_id, vs in rows.items():
            if len(vs) > 1:
                self.problem("duplicated", f"{led.coll} _id {doc_id!r} has {len(vs)} rows, versions {vs}")
            if doc_id not in led.sent or any(v not in led.sent[doc_id] for v in vs):
                self.problem("phantoms", f"{led.coll} _id {doc_id!r} at versions {vs}: never sent "
                                         f"(sent: {sorted(led.sent.get(doc_id, ()))[-5:]})")
            elif doc_id in led.refused:
                self.problem("phantoms", f"{led.coll} _id {doc_id!r} is stored, though the service refused it")
        for doc_id in led.sent:
            vs = rows.get(doc_id, [])
            got = vs[-1] if vs else ABSENT
            if got != led.acked.get(doc_id, ABSENT) and got not in led.maybe.get(doc_id, ()):
                self.problem("lost", f"{led.coll} _id {doc_id!r}: stored {got}, acknowledged "
                                     f"{led.acked.get(doc_id, ABSENT)}, sent unanswered after that: "
                                     f"{led.maybe.get(doc_id, '-')}; all sent: {sorted(led.sent[doc_id])[-6:]}")

    def check_batches(self, led: Ledger, rows: dict) -> None:
        """An unanswered batch: per part of it that one ``ingest()`` call wrote to one shard,
        all of its documents there at the batch's version, or none. Judged on the ids no
        later request wrote."""
        for op in led.abandoned:
            if op.kind not in ("json", "ndjson", "rockset"):
                continue
            parts: dict = {}
            for pos, doc_id in enumerate(op.order):
                if doc_id in op.refused or led.last_op.get(doc_id) != op.serial:
                    continue
                key = (pos // BATCH_DOCS, documents.shard_of(documents.encode_id(doc_id), led.shards))
                parts.setdefault(key, {})[doc_id] = (rows.get(doc_id) or [ABSENT])[-1] == op.serial
            landed = [p for p in parts.values() if all(p.values())]
            half = [(k, p) for k, p in parts.items() if len(set(p.values())) > 1]
            self.count("abandoned_parts", len(parts))
            self.count("abandoned_parts_stored", len(landed))
            if landed and len(landed) < len(parts):
                self.count("abandoned_partly_stored")  # some batches or shards of it, not all
            for (sub, shard), p in half:
                there = sorted(str(k) for k, v in p.items() if v)[:5]
                missing = sorted(str(k) for k, v in p.items() if not v)[:5]
                self.problem("half_batches", f"{led.coll} request {op.serial} ({op.kind}, {len(op.order)} documents), "
                                             f"batch {sub}, shard {shard}: {sum(p.values())} of {len(p)} there "
                                             f"(there: {there}, missing: {missing})")

    def check_retries(self, led: Ledger, rows: dict) -> None:
        """A batch sent again after a kill: each of its documents there once, at its version
        (where no later request wrote it)."""
        for op in led.retried:
            for doc_id, state in op.states.items():
                if doc_id in op.refused or led.last_op.get(doc_id) != op.serial:
                    continue
                vs = rows.get(doc_id, [])
                if vs != ([] if state is ABSENT else [state]):
                    self.problem("lost", f"{led.coll} _id {doc_id!r} of request {op.serial} ({op.kind}), sent "
                                         f"{op.attempts} times: rows at versions {vs}, expected {state}")
                else:
                    self.count("retried_documents")

    def check_rows_by_id(self, c: httpx.Client, led: Ledger, rows: dict) -> None:
        """A sample read one at a time by ``_id`` (the row store's path, not the index's)."""
        if led.coll != NATIVE:
            return
        sample = self.rand.sample(sorted(led.sent), min(40, len(led.sent)))
        for doc_id in sample:
            r = c.get(f"/v1/collections/{NATIVE}/docs/{doc_id}")
            got = r.json()["v"] if r.status_code == 200 else ABSENT
            want = (rows.get(doc_id) or [ABSENT])[-1]
            if got != want:
                self.problem("lost", f"GET {NATIVE}/docs/{doc_id} gives version {got}, the query {want}")

    def report(self, seconds: float) -> None:
        c = self.counts
        line = " ".join(f"{k}={c[k]}" for k in (
            "cycles", "ingest_kills", "starting_kills", "seal_kills", "merge_kills", "after_segment_kills",
            "query_kills", "query_catchups", "requests", "unanswered", "retried", "retried_documents",
            "retry_found_stored", "abandoned", "abandoned_partly_stored", "abandoned_parts", "abandoned_parts_stored",
            "acknowledged", "documents", "fenced_reads", "lost", "duplicated", "phantoms", "half_batches",
            "stale_reads"))
        print("\n".join(self.cycle_log))
        phases = " ".join(f"{k}_s={v:.0f}" for k, v in self.phases.items())
        out = self.s.output
        starts = [i for i, x in enumerate(out) if "Traceback" in x]  # logged by the service
        tracebacks = len(starts)
        for i in starts[:3]:
            print("service log:", "".join(out[max(i - 2, 0):i + 30]))
        print(f"service-crash: seed={self.seed} {line} tracebacks={tracebacks} seconds={seconds:.0f} {phases}")
        failures = sum(c[k] for k in ("lost", "duplicated", "phantoms", "half_batches", "stale_reads", "counts",
                                      "service"))
        record(self.test, "service processes killed (SIGKILL) under writes: acknowledged documents there once, "
                          "no phantoms, no half batches, fenced reads never older",
               c["cycles"], "kill cycles", failures, acknowledged=c["acknowledged"], lost=c["lost"],
               duplicated=c["duplicated"], phantoms=c["phantoms"], half_batches=c["half_batches"],
               stale_reads=c["stale_reads"])
        if self.problems:
            shown = "\n".join(self.problems[:25])
            raise AssertionError(f"[seed={self.seed} data={self.data}] {len(self.problems)} broken promises:\n"
                                 f"{shown}\nservice output (end):\n" + "".join(self.s.output[-30:]))


class Writer(threading.Thread):
    """A client thread: requests one after another, each until it is answered or abandoned."""

    abandon = 0.4  # how often an unanswered request is given up (its ids then never written again)

    def __init__(self, h: Harness, rand: random.Random, ledger: Ledger, name: str):
        super().__init__(name=name, daemon=True)
        self.h = h
        self.rand = rand
        self.ledger = ledger
        self.serial = 0
        self.next_id = 0
        self.fence = ""
        self.error: BaseException | None = None

    # what a subclass decides
    def next_op(self) -> Op:
        raise NotImplementedError

    def fresh_id(self):
        raise NotImplementedError

    def path(self, op: Op) -> tuple[str, str, str]:
        """(method, path, content type) of a request."""
        raise NotImplementedError

    # ---------------------------------------------------------------- sending
    def run(self) -> None:
        try:
            with self.h.client() as c:
                self.c = c
                while not self.h.stop.is_set() and not self.h.abort.is_set():
                    self.send(self.next_op())
        except BaseException as e:  # the main thread reports it
            self.error = e

    def batch(self, kind: str, ids: list, refuse: bool = False, pad: int = 16) -> Op:
        self.serial += 1
        led = self.ledger
        ids = ids + ([led.marker] if led.marker is not None else [])
        self.rand.shuffle(ids)
        op = Op(self.serial, led.coll, kind, {i: self.serial for i in ids}, ids)
        docs = [{"_id": i, "v": self.serial, "w": self.name, "pad": "x" * self.rand.randrange(pad)} for i in ids]
        if refuse:  # a document the service refuses (too deep): an item error, never stored
            bad = self.fresh_id()
            deep: dict = {"x": 1}
            for _ in range(DEEP):
                deep = {"d": deep}
            at = self.rand.randrange(len(docs) + 1)
            docs.insert(at, {"_id": bad, "v": self.serial, "deep": deep})
            op.order.insert(at, bad)
            op.states[bad] = self.serial
            op.refused.add(bad)
            led.refused.add(bad)
        if kind == "ndjson":
            op.body = b"".join(orjson.dumps(d) + b"\n" for d in docs)
        elif kind == "rockset":
            op.body = orjson.dumps({"data": docs})
        else:
            op.body = orjson.dumps(docs)
        return op

    def send(self, op: Op) -> None:
        led = self.ledger
        for doc_id, state in op.states.items():
            led.last_op[doc_id] = op.serial
            if state is not ABSENT:
                led.sent.setdefault(doc_id, set()).add(state)
            else:
                led.sent.setdefault(doc_id, set())
        wait = 0.05
        while True:
            op.attempts += 1
            self.h.count("requests")
            t0 = time.monotonic()
            must_retry = False
            method, path, ctype = self.path(op)
            try:
                r = self.c.request(method, path, content=op.body or None,
                                   headers={"Content-Type": ctype} if ctype else None)
                reply = r.json() if r.status_code in (200, 404) else None
            except httpx.TimeoutException:
                r, reply, must_retry = None, None, True  # it may still be under way
            except (httpx.TransportError, orjson.JSONDecodeError, ValueError):
                r, reply = None, None
            if reply is not None and self.answered(op, r.status_code, reply):
                if op.attempts > 1:
                    led.retried.append(op)
                    self.h.count("retried")
                return
            if r is not None and r.status_code not in (200, 429, 502, 503, 504) and not (
                    r.status_code == 404 and op.kind in ("delete", "patch")):
                what = f"{op.kind} request {op.serial} to {path} answered {r.status_code}: {r.text[:300]}"
                if r.status_code < 500:  # a request the service refuses: the harness's own mistake
                    raise AssertionError(what)
                self.h.problem("service", what)
            self.h.count("unanswered")
            for doc_id, state in op.states.items():
                led.maybe.setdefault(doc_id, set()).add(state)
            must_retry = must_retry or self.h.query_killed_during(t0, time.monotonic())
            if self.h.abort.is_set():
                return
            if op.attempts == 1 and not must_retry and self.rand.random() < self.abandon:
                led.abandoned.append(op)
                self.h.count("abandoned")
                self.retire(op)
                return
            time.sleep(wait)
            wait = min(wait * 2, 0.5)

    def retire(self, op: Op) -> None:
        """An abandoned request's ids are never written again (so that what it left can be judged)."""

    def answered(self, op: Op, status: int, reply) -> bool:
        """Take an answer into the ledger: True when it acknowledges the request."""
        led = self.ledger
        if op.kind == "delete":
            doc_id = next(iter(op.states))
            if status == 404 and not led.can_be_absent(doc_id):
                self.h.problem("lost", f"{led.coll} delete of {doc_id!r} answered 404, but it was acknowledged "
                                       f"at version {led.acked.get(doc_id)}")
            self.ack(op, {doc_id: ABSENT}, reply.get("fence"))
            return True
        if op.kind == "patch":
            doc_id, v = next(iter(op.states.items()))
            if status == 404:
                if not led.can_be_absent(doc_id):
                    self.h.problem("lost", f"{led.coll} patch of {doc_id!r} answered 404, but it was "
                                           f"acknowledged at version {led.acked.get(doc_id)}")
                self.ack(op, {doc_id: ABSENT}, reply.get("fence"))
                return True
            if reply["document"].get("v") != v:
                self.h.problem("lost", f"{led.coll} patch of {doc_id!r} to version {v} gave {reply['document']}")
            self.ack(op, {doc_id: v}, reply["fence"])
            return True
        if status != 200:
            return False
        items = reply["data"] if op.kind == "rockset" else reply["items"]
        if len(items) != len(op.order):
            self.h.problem("service", f"request {op.serial}: {len(items)} statuses for {len(op.order)} documents")
            return False
        stored = {}
        for doc_id, it in zip(op.order, items):
            if doc_id in op.refused:
                if it["status"] != "ERROR":
                    self.h.problem("phantoms", f"{led.coll} {doc_id!r} (too deep) was answered {it}")
                continue
            if it["status"] not in ("ADDED", "REPLACED") or it["_id"] != doc_id:
                self.h.problem("service", f"{led.coll} request {op.serial}: {doc_id!r} answered {it}")
                continue
            if it["status"] == "ADDED" and not led.can_be_absent(doc_id):
                self.h.problem("duplicated", f"{led.coll} {doc_id!r} answered ADDED at version {op.serial}, "
                                             f"but version {led.acked.get(doc_id)} was acknowledged before")
            if it["status"] == "REPLACED" and not led.can_be_present(doc_id):
                self.h.problem("phantoms", f"{led.coll} {doc_id!r} answered REPLACED at version {op.serial}, "
                                           f"but nothing of it was stored before")
            if it["status"] == "REPLACED" and op.attempts > 1 and led.acked.get(doc_id) is ABSENT:
                self.h.count("retry_found_stored")  # what the first attempt stored, the retry replaced
            stored[doc_id] = op.serial
        fence = reply.get("last_offset") if op.kind == "rockset" else reply.get("fence")
        self.ack(op, stored, fence)
        if led.marker in stored:
            self.h.publish(led.coll, led.marker, op.serial, fence)
        return True

    def ack(self, op: Op, stored: dict, fence: str | None) -> None:
        led = self.ledger
        for doc_id in op.states:
            led.maybe.pop(doc_id, None)
        led.acked.update(stored)
        if fence:
            self.fence = fence

    def final_write(self) -> None:
        """One more acknowledged batch (the marker alone, or one document): its fence covers
        every write before it, for the final read."""
        with self.h.client() as c:
            self.c = c
            op = self.batch("rockset" if isinstance(self, RocksetWriter) else "json",
                            [] if self.ledger.marker is not None else [self.fresh_id()])
            self.send(op)


class NativeWriter(Writer):
    def __init__(self, h: Harness, rand: random.Random):
        super().__init__(h, rand, Ledger(NATIVE, NATIVE_SHARDS, "m-native"), "native")
        self.active: list = []

    def fresh_id(self):
        self.next_id += 1
        return f"n-{self.next_id}"

    def path(self, op: Op):
        if op.kind in ("delete", "patch"):
            doc_id = next(iter(op.states))
            return ("DELETE" if op.kind == "delete" else "PATCH", f"/v1/collections/{NATIVE}/docs/{doc_id}",
                    None if op.kind == "delete" else "application/json")
        return "POST", f"/v1/collections/{NATIVE}/docs", ("application/x-ndjson" if op.kind == "ndjson"
                                                          else "application/json")

    def next_op(self) -> Op:
        led = self.ledger
        x = self.rand.random()
        present = [i for i in self.rand.sample(self.active, min(8, len(self.active)))
                   if led.acked.get(i) is not ABSENT and i not in led.maybe]
        if x < 0.1 and present:
            self.serial += 1
            return Op(self.serial, NATIVE, "delete", {present[0]: ABSENT}, [present[0]])
        if x < 0.2 and present:
            self.serial += 1
            op = Op(self.serial, NATIVE, "patch", {present[0]: self.serial}, [present[0]])
            op.body = orjson.dumps([{"op": "replace", "path": "/v", "value": self.serial}])
            return op
        n = self.rand.choice([1, 5, 40, 150, 400]) if self.rand.random() > 0.04 else self.rand.randrange(1200, 2600)
        old = self.rand.sample(self.active, min(n // 2, len(self.active)))
        new = [self.fresh_id() for _ in range(n - len(old))]
        self.active.extend(new)
        if len(self.active) > 3000:
            self.active = self.active[-3000:]
        return self.batch(self.rand.choice(["json", "ndjson"]), old + new, refuse=self.rand.random() < 0.1)

    def retire(self, op: Op) -> None:
        gone = set(op.states)
        self.active = [i for i in self.active if i not in gone]


class RocksetWriter(Writer):
    def __init__(self, h: Harness, rand: random.Random):
        super().__init__(h, rand, Ledger(f"{WORKSPACE}.{ROCKSET}", ROCKSET_SHARDS, 0), "rockset")
        self.active: list = []

    def fresh_id(self):
        self.next_id += 1
        return self.next_id

    def path(self, op: Op):
        return "POST", f"/v1/orgs/self/ws/{WORKSPACE}/collections/{ROCKSET}/docs", "application/json"

    def next_op(self) -> Op:
        n = self.rand.choice([1, 10, 60, 200])
        old = self.rand.sample(self.active, min(n // 2, len(self.active)))
        new = [self.fresh_id() for _ in range(n - len(old))]
        self.active = (self.active + new)[-2000:]
        return self.batch("rockset", old + new, refuse=self.rand.random() < 0.05)

    def retire(self, op: Op) -> None:
        gone = set(op.states)
        self.active = [i for i in self.active if i not in gone]


class BigWriter(Writer):
    """Batches of upserts over a working set, enough rows to seal BIG's shard every few
    seconds and merge its segments."""

    abandon = 0.25

    def __init__(self, h: Harness, rand: random.Random):
        super().__init__(h, rand, Ledger(BIG, 1, None), "big")
        self.active = list(range(BIG_IDS))
        self.next_id = BIG_IDS

    def fresh_id(self):
        self.next_id += 1
        return self.next_id

    def path(self, op: Op):
        return "POST", f"/v1/collections/{BIG}/docs", "application/json"

    def next_op(self) -> Op:
        return self.batch("json", self.rand.sample(self.active, BATCH_DOCS), pad=120)

    def retire(self, op: Op) -> None:
        gone = set(op.states)
        self.active = [i for i in self.active if i not in gone]
        self.active += [self.fresh_id() for _ in range(BIG_IDS - len(self.active))]


class FenceReader(threading.Thread):
    """Reads each collection's marker with the fence of its newest acknowledged version,
    from new connections now and then (so from every query process, restarted ones too):
    the answer is never older than that version."""

    def __init__(self, h: Harness, rand: random.Random):
        super().__init__(name="fence-reader", daemon=True)
        self.h = h
        self.rand = rand

    def run(self) -> None:
        h = self.h
        c = h.client()
        try:
            while not h.stop.is_set() and not h.abort.is_set():
                time.sleep(0.03)
                with h.lock:
                    pub = list(h.published.items())
                if not pub:
                    continue
                if self.rand.random() < 0.1:
                    c.close()
                    c = h.client()
                coll, (marker, version, fence) = self.rand.choice(pub)
                try:
                    r = c.post("/v1/query", json={"sql": f"SELECT v FROM {collection_sql(coll)} WHERE _id = :id",
                                                  "parameters": {"id": marker}, "min_fence": fence,
                                                  "timeout_ms": 20_000})
                except httpx.TransportError:
                    continue
                if r.status_code != 200:
                    if r.status_code not in (408, 429, 503):
                        h.problem("stale_reads", f"a fenced read of {coll} answered {r.status_code}: {r.text[:300]}")
                    continue
                rows = r.json()["rows"]
                h.count("fenced_reads")
                if not rows or rows[0]["v"] < version:
                    h.problem("stale_reads", f"{coll}: a read at the fence of version {version} of {marker!r} "
                                             f"answered {rows}")
        finally:
            c.close()


def test_a_write_cut_off_with_its_query_process_is_not_stored_after_a_newer_one(tmp_path):
    """A write's relaying query process dies: its client sees the connection close, writes
    a newer version of one of its documents and gets it acknowledged. The ingest process
    must not then store the old write over it (it finishes what the dead process had relayed,
    batch after batch, after the client saw the failure)."""
    import psutil

    n = 90_000  # a write long enough to be under way for a while
    s = Served(str(tmp_path / "db"), "--query-workers", "2")
    try:
        with s.client() as c:
            assert c.post("/v1/collections", json={"name": "c", "shards": 2}).status_code == 201
        body = orjson.dumps([{"_id": i, "v": 1, "pad": "x" * 50} for i in range(n)])
        host, port = s.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(f"POST /v1/collections/c/docs HTTP/1.1\r\nHost: x\r\nAuthorization: ApiKey "
                         f"{s.admin_key}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
                         f"\r\n\r\n".encode() + body)
            count = {"sql": "SELECT COUNT(*) AS n FROM c"}
            with s.client() as c:  # the first batch is stored: the whole body reached the ingest process
                while c.post("/v1/query", json=count).json()["rows"][0]["n"] == 0:
                    time.sleep(0.01)
            mine = sock.getsockname()[1]
            relaying = [q for q in s.children()["query"]
                        if any(k.raddr and k.raddr.port == mine for k in psutil.Process(q).net_connections("tcp"))]
            os.kill(relaying[0], signal.SIGKILL)
            sock.settimeout(30)
            assert sock.recv(65536) == b"", "the write was answered before its query process died"
        with s.client() as c:  # the client saw the failure; it writes a newer version of the last document
            r = c.post("/v1/collections/c/docs", json=[{"_id": n - 1, "v": 2}])
            assert r.status_code == 200 and r.json()["items"][0]["status"] in ("ADDED", "REPLACED"), r.text
            stored_before = c.post("/v1/query", json={**count, "min_fence": r.json()["fence"]}).json()["rows"][0]["n"]
            last, still = -1, time.monotonic()  # until the old write is done: all stored, or no more for a while
            while last < n and time.monotonic() - still < 5:
                now = c.post("/v1/query", json=count).json()["rows"][0]["n"]
                last, still = now, (still if now == last else time.monotonic())
                time.sleep(0.05)
            got = c.post("/v1/query", json={"sql": "SELECT v FROM c WHERE _id = :id", "parameters": {"id": n - 1},
                                            "min_fence": r.json()["fence"]}).json()["rows"]
        record("tests/test_service_crash.py::test_a_write_cut_off_with_its_query_process_is_not_stored_after_a_newer_one",
               "a write whose query process was killed is not stored over a newer acknowledged one", 1,
               "kills", int(got != [{"v": 2}]), documents=n, stored_when_the_newer_was_acknowledged=stored_before)
        assert got == [{"v": 2}], (
            f"the acknowledged version 2 of _id {n - 1} was overwritten by the write whose connection had "
            f"closed (the ingest process went on storing it: {stored_before} of its {n} documents were stored "
            f"when version 2 was acknowledged): {got}")
    finally:
        s.stop()


def _run(tmp_path, rand, test: str, plan: dict) -> None:
    h = Harness(tmp_path, rand, test)
    h.run([action for action, n in plan.items() for _ in range(n)])


def test_service_survives_kills(tmp_path, rand):
    _run(tmp_path, rand, "tests/test_service_crash.py::test_service_survives_kills",
         {"ingest": 2, "starting": 1, "seal": 1, "query": 1})


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_service_survives_kills_long(tmp_path, rand):
    _run(tmp_path, rand, "tests/test_service_crash.py::test_service_survives_kills_long",
         {"ingest": 85, "starting": 8, "seal": 6, "merge": 6, "query": 4})
