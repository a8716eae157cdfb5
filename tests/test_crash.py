"""kill -9 durability: a worker process writes (tests/crash_worker.py), gets SIGKILLed at a
random moment, and the database must reopen with every acknowledged write, no torn document,
and an index that agrees with the row store. Cycles reuse the same directory.

Replay the operation sequence with RTINDEX_SEED=<seed> (the kill moments are not replayable).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

import rtindex
from rtindex import documents
from tests.reliability import record

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import crash_worker  # noqa: E402  (shares the checksum and the open options)

sys.path.remove(str(HERE))

WORKER = HERE / "crash_worker.py"
REPO_ROOT = Path(rtindex.__file__).resolve().parent.parent
ABSENT = None


class CrashFailure(AssertionError):
    pass


def _state(doc: dict | None):
    """What we compare: (v, chk) of a stored document, or None."""
    return None if doc is None else (doc["v"], doc["chk"])


class CrashTest:
    def __init__(self, tmp_path: Path, rand):
        self.rand = rand
        self.seed = rand.seed_value
        self.dir = str(tmp_path / "db")
        self.acklog = str(tmp_path / "acks.ndjson")
        self.stderr_path = tmp_path / "worker.stderr"
        self.offset = 0  # ack log bytes already interpreted (always a line boundary)
        self.model: dict = {}  # _id -> (v, chk) of every present document, as observed last
        self.ids: dict = {}  # every _id ever written (a dict: ordered, so replayable)
        self.collection_expected = False
        self.open_time = 0.05
        self.cycle = -1
        self.segments = 0
        self.log_tail: list = []  # the records of the current cycle, for failure messages

    def fail(self, msg: str, cause: BaseException | None = None) -> None:
        tail = "\n".join(orjson.dumps(r).decode()[:300] for r in self.log_tail[-8:])
        raise CrashFailure(f"[seed={self.seed} cycle={self.cycle} dir={self.dir}] {msg}\n"
                           f"last ack-log records of this cycle:\n{tail}") from cause

    # ------------------------------------------------------------------ worker
    def run_worker(self) -> str:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        wseed = self.seed * 1000 + self.cycle
        early = self.cycle > 0 and self.rand.random() < 0.15  # kill while opening / recovering
        with open(self.stderr_path, "wb") as err:
            proc = subprocess.Popen([sys.executable, "-u", str(WORKER), self.dir, str(wseed), self.acklog],
                                    stdout=subprocess.PIPE, stderr=err, env=env, cwd=str(REPO_ROOT))
        try:
            t_open = self._wait_for(proc, b"OPENING")
            if early:
                time.sleep(self.rand.uniform(0, self.open_time * 1.5))
                how = "early"
            else:
                self._wait_for(proc, b"READY")
                self.open_time = 0.5 * self.open_time + 0.5 * (time.monotonic() - t_open)
                time.sleep(self.rand.uniform(0.2, 1.5))
                how = "running"
            if proc.poll() is not None:
                self._worker_died(proc, "exited by itself")
            proc.send_signal(signal.SIGKILL)
            rc = proc.wait(timeout=30)
        except BaseException:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            raise
        finally:
            proc.stdout.close()
        if rc != -signal.SIGKILL:
            self._worker_died(proc, f"ended with status {rc}, not by SIGKILL")
        err = self.stderr_path.read_bytes()
        if err.strip():
            self.fail(f"the worker wrote to stderr before it was killed:\n{err.decode(errors='replace')[-4000:]}")
        return how

    def _wait_for(self, proc, word: bytes, timeout: float = 120) -> float:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.fail(f"the worker did not print {word!r} within {timeout} s")
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if ready:
                line = proc.stdout.readline()
                if not line:
                    proc.wait(timeout=30)
                    self._worker_died(proc, f"closed its stdout before printing {word!r}")
                if line.strip() == word:
                    return time.monotonic()

    def _worker_died(self, proc, what: str) -> None:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        err = self.stderr_path.read_bytes().decode(errors="replace")
        self.fail(f"the worker {what} (exit status {proc.returncode}); its stderr:\n{err[-6000:]}")

    # ------------------------------------------------------------------ ack log
    def read_log(self):
        """The records appended since the last cycle: (expected, in_flight, stats).

        expected: _id -> (v, chk) or None, the state after every acknowledged call;
        in_flight: _id -> (v, chk) or None, what the one unacknowledged call may have left.
        """
        with open(self.acklog, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a partial last line (torn by the kill) is ignored
        lines = data[:end].splitlines()
        self.offset += end
        expected = dict(self.model)
        pending = None
        stats = {"acked": 0, "torn_tail": len(data) - end}
        self.log_tail = []
        for i, line in enumerate(lines):
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                self.fail(f"ack log line {i} of this cycle is not JSON (only the last may be torn): {line[:200]!r}")
            self.log_tail.append(rec)
            t = rec["t"]
            if t == "start":
                if pending is not None or i != 0:
                    self.fail(f"a start record in the middle of a run: {rec}")
                self.collection_expected = True
            elif t == "begin":
                if pending is not None:
                    self.fail(f"begin {rec['seq']} while {pending['seq']} was never acknowledged")
                pending = rec
                for doc_id in self._ids_of(rec):
                    self.ids[doc_id] = None
                if rec["op"] == "patch":
                    cur = expected.get(rec["id"])
                    if cur is None or cur[0] != rec["from_v"]:
                        self.fail(f"the worker patched {rec['id']!r} at v={rec['from_v']}, but the "
                                  f"acknowledged state is {cur}")
            elif t == "ack":
                if pending is None or pending["seq"] != rec["seq"]:
                    self.fail(f"ack {rec} does not match the pending call {pending}")
                if pending["op"] == "delete":
                    existed = expected.get(pending["id"]) is not None
                    if rec["existed"] != existed:
                        self.fail(f"delete({pending['id']!r}) returned {rec['existed']} in the worker, but "
                                  f"the acknowledged state says the document {'existed' if existed else 'did not'}: "
                                  f"{expected.get(pending['id'])}")
                expected.update(self._effect(pending))
                pending = None
                stats["acked"] += 1
            else:
                self.fail(f"unknown ack-log record {rec}")
        in_flight = self._effect(pending) if pending is not None else {}
        stats["in_flight"] = pending["op"] if pending is not None else None
        return expected, in_flight, stats

    @staticmethod
    def _ids_of(rec) -> list:
        return [w[0] for w in rec["w"]] if rec["op"] == "ingest" else [rec["id"]]

    @staticmethod
    def _effect(rec) -> dict:
        if rec["op"] == "ingest":
            return {w[0]: (w[1], w[2]) for w in rec["w"]}
        if rec["op"] == "delete":
            return {rec["id"]: None}
        return {rec["id"]: (rec["v"], rec["chk"])}

    # ------------------------------------------------------------------ checks
    def observe(self) -> dict:
        """Open the database, check it, and return _id -> stored document."""
        with rtindex.open(self.dir, **crash_worker.OPEN_OPTIONS) as db:
            if "c" not in db:
                if self.collection_expected or self.ids:
                    self.fail(f"collection 'c' is missing after reopening: {db!r}")
                return {}
            coll = db["c"]
            self.segments = sum(sh["sealed_segments"] for sh in coll.stats()["shards"])
            docs = {}
            for doc_id in self.ids:
                d = coll.get(doc_id)
                if d is not None:
                    docs[doc_id] = d
            self.check_documents(docs)
            self.check_index(coll, docs)
        return docs

    def check_documents(self, docs: dict) -> None:
        for doc_id, d in docs.items():
            if d.get("_id") != doc_id:
                self.fail(f"get({doc_id!r}) returned a document with _id {d.get('_id')!r}: {d}")
            if d.get("chk") != crash_worker.checksum(d):
                self.fail(f"document {doc_id!r} is not one the worker wrote (checksum mismatch): {d}")
        vs = [d["v"] for d in docs.values()]
        if len(set(vs)) != len(vs):
            self.fail("two stored documents have the same v")

    def check_index(self, coll, docs: dict) -> None:
        snap = coll.snapshot()
        n = len(docs)
        if snap.count() != n or len(coll) != n:
            self.fail(f"counts disagree: snapshot.count()={snap.count()} len(coll)={len(coll)}, "
                      f"documents found by get() over the {len(self.ids)} ids ever written: {n}")
        by_v = {d["v"]: d for d in docs.values()}
        for v, d in by_v.items():
            got = snap.fetch(snap.term("v", v))
            if got != [d]:
                self.fail(f"term('v', {v}) finds {got}, but get({d['_id']!r}) returns {d}")
        for name, rows in (("range('v', lo=0)", snap.range("v", lo=0)),
                           ("range('v', 0, 2**62, hi_inclusive=True)", snap.range("v", 0, 1 << 62, hi_inclusive=True)),
                           ("all()", snap.all())):
            got = snap.fetch(rows)
            if len(rows) != n or sorted(got, key=lambda d: d["v"]) != [by_v[v] for v in sorted(by_v)]:
                extra = sorted({x["v"] for x in got} - set(by_v))[:10]
                missing = sorted(set(by_v) - {x["v"] for x in got})[:10]
                self.fail(f"{name} returns {len(rows)} rows ({len(got)} fetched), the row store has {n} "
                          f"documents; v found only by the index: {extra}, only by get(): {missing}")
        if by_v:  # a range in the middle
            vs = sorted(by_v)
            lo, hi = vs[len(vs) // 3], vs[2 * len(vs) // 3]
            got = sorted(x["v"] for x in snap.fetch(snap.range("v", lo, hi)))
            if got != [v for v in vs if lo <= v < hi]:
                self.fail(f"range('v', {lo}, {hi}) returns the wrong rows")
        table = snap.scan([("v", "int"), ("chk", "string")])
        col = sorted(zip(table.column("v:int").to_pylist(), table.column("chk:string").to_pylist()))
        if col != sorted((v, d["chk"]) for v, d in by_v.items()):
            self.fail(f"the column store ({len(col)} rows of v, chk) disagrees with the row store ({n} documents)")
        # a sample of _id lookups through the index, present and absent
        sample = self.rand.sample(list(self.ids), min(50, len(self.ids)))
        for doc_id in sample:
            got = snap.fetch(snap.term("_id", doc_id))
            want = [docs[doc_id]] if doc_id in docs else []
            if got != want:
                self.fail(f"term('_id', {doc_id!r}) finds {got}, get() returns {want}")

    def verify(self, expected: dict, in_flight: dict, docs: dict) -> tuple[dict, int]:
        """Each id: the last acknowledged state, or what the unacknowledged call wrote."""
        landed = 0
        for doc_id in self.ids:
            got = _state(docs.get(doc_id))
            ack = expected.get(doc_id, ABSENT)
            if got == ack:
                continue
            if doc_id in in_flight and got == in_flight[doc_id]:
                landed += 1
                continue
            what = f", or {in_flight[doc_id]} from the unacknowledged call" if doc_id in in_flight else ""
            self.fail(f"_id {doc_id!r}: stored (v, chk) is {got}; expected the acknowledged {ack}{what}; "
                      f"stored document: {docs.get(doc_id)}")
        # one call writes each shard's part of a batch in one WriteBatch: all of it or nothing
        by_shard: dict[int, dict] = {}
        for doc_id, st in in_flight.items():
            shard = documents.shard_of(documents.encode_id(doc_id), crash_worker.SHARDS)
            by_shard.setdefault(shard, {})[doc_id] = _state(docs.get(doc_id)) == st
        for shard, got in by_shard.items():
            if len(set(got.values())) > 1:
                self.fail(f"the unacknowledged call landed partly in shard {shard}: "
                          f"{ {k: 'landed' if v else 'not landed' for k, v in got.items()} }")
        return {doc_id: _state(d) for doc_id, d in docs.items()}, landed

    # ------------------------------------------------------------------ the loop
    def run(self, cycles: int) -> list[str]:
        report = []
        for self.cycle in range(cycles):
            how = self.run_worker()
            if self.rand.random() < 0.3:
                # what a kill in the middle of writing a line leaves (rare for real: the worker
                # writes each line with one write()); the parent and the next worker skip it
                with open(self.acklog, "ab") as f:
                    f.write(b'{"t":"begin","seq":999999,"op":"ingest","n":1,"w":[["torn",'[: self.rand.randrange(1, 60)])
            expected, in_flight, stats = self.read_log()
            try:
                docs = self.observe()
                model, landed = self.verify(expected, in_flight, docs)
                again = self.observe()  # the checks closed the database: it must reopen the same
            except CrashFailure:
                raise
            except Exception as e:  # e.g. CorruptionError from open(): say which run it was
                self.fail(f"reopening and reading the database raised {e!r}", e)
            if {k: _state(d) for k, d in again.items()} != model:
                self.fail("a second reopen (after a clean close) sees different documents")
            self.model = model
            flying = f"{stats['in_flight']} ({landed} of {len(in_flight)} ids landed)" if in_flight else "nothing"
            report.append(f"cycle {self.cycle}: kill {how}, {stats['acked']} calls acknowledged, in flight: "
                          f"{flying}, torn tail {stats['torn_tail']} bytes, {len(model)} documents, "
                          f"{self.segments} sealed segments")
        return report


def _run(tmp_path, rand, cycles, test):
    t0 = time.monotonic()
    crash = CrashTest(tmp_path, rand)
    report = crash.run(cycles)  # raises at the first broken promise
    print(f"seed={rand.seed_value} {cycles} cycles in {time.monotonic() - t0:.1f} s")
    print("\n".join(report))
    record(test, "library writer killed (SIGKILL) mid-write: acknowledged writes kept, none half there",
           cycles, "kill cycles", 0, documents=len(crash.model))


def test_kill9_durability(tmp_path, rand, request):
    _run(tmp_path, rand, 6, request.node.nodeid)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_kill9_durability_long(tmp_path, rand, request):
    _run(tmp_path, rand, 40, request.node.nodeid)
