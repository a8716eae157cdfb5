"""Live read replicas: ``rtindex.open(path, role="reader")``.

1. In one process: a reader follows a writer of the same directory (rows, upserts, deletes,
   patches, collections created and dropped, seals and merges); writes through it raise
   ReadOnlyError; ``stats()["lag"]``; SQL and snapshot reads equal the writer's.
2. Real processes (tests/reader_worker.py): a writer applies a deterministic sequence of
   steps (one write call each) and two reader processes read the whole collection over and
   over. Every read must equal the model after some prefix of the steps (never a partial
   one) and, per reader, the prefixes never go back; after the writer stops, readers
   converge to the final state by themselves. The writer is also restarted cleanly and
   killed with SIGKILL mid-batch, and a new writer process recovers and finishes the
   sequence: the readers keep serving meanwhile and follow the new writer.

A step touches several shards of a multi-shard collection, and the engine writes it shard by
shard (each shard's part is one atomic RocksDB write), so the whole-collection "never a
partial step" check runs on one-shard collections; multi-shard runs check it per shard.

3. Readers that lag: a reader that does not catch up while the writer writes, flushes (RocksDB
   deletes the WAL files the reader had read from) and compacts, in this process, while it
   catches up in a loop, and in another process stopped with SIGSTOP, then reads every
   document at its latest version.

Replay a sequence with RTINDEX_SEED=<seed> (the process timing is not replayable).
"""

from __future__ import annotations

import glob
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

import rtindex
from rtindex.errors import ClosedError, NotFoundError, ReadOnlyError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import reader_worker as rw  # the sequence, the model and the digests

sys.path.remove(str(HERE))

WORKER = HERE / "reader_worker.py"
REPO_ROOT = HERE.parent


def wait_until(cond, timeout: float, what: str, interval: float = 0.002):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)


# ===================================================================== 1. in one process
def content(coll) -> dict:
    """_id -> document (without _event_time) of every document, via a snapshot."""
    s = coll.snapshot()
    docs = s.fetch(s.all())
    assert None not in docs
    out = {d["_id"]: {k: v for k, v in d.items() if k != "_event_time"} for d in docs}
    assert len(out) == len(docs) == s.count()
    return out


def content_now(coll) -> dict | None:
    """content(), or None while a reader's state is behind (with ``reader_grace_seconds=0``
    rows a merge dropped may be gone for a state that is not the newest yet)."""
    try:
        return content(coll)
    except AssertionError:
        return None


def sql_rows(db, q: str, params=None) -> list:
    return sorted(repr(sorted(r.items())) for r in db.sql(q, params).rows())


QUERIES = [
    ("SELECT _id, v, g FROM c", None),
    ("SELECT count(*) AS n, sum(v) AS s, max(v) AS m FROM c", None),
    ("SELECT g, count(*) AS n FROM c GROUP BY g", None),
    ("SELECT _id, v FROM c WHERE g = 3", None),
    ("SELECT _id FROM c WHERE v >= :lo AND v < :hi", {"lo": 100, "hi": 400}),
    ("SELECT _id, v FROM c WHERE tag = 'b' ORDER BY v DESC LIMIT 7", None),
    ("SELECT _id FROM c WHERE _id = 17", None),
]


def same_reads(w, r, name: str = "c") -> None:
    """The reader's view of collection ``name`` equals the writer's (the reader caught up)."""
    wc, rc = w[name], r[name]
    assert content(rc) == content(wc)
    for q, p in QUERIES:
        if name == "c":
            assert sql_rows(r, q, p) == sql_rows(w, q, p), q
    ws, rs = wc.snapshot(), rc.snapshot()
    for path, val in (("g", 3), ("tag", "a"), ("_id", 17)):
        got = sorted(map(repr, (d["_id"] for d in rs.fetch(rs.term(path, val)))))
        assert got == sorted(map(repr, (d["_id"] for d in ws.fetch(ws.term(path, val))))), (path, val)
    got = sorted(d["_id"] for d in rs.fetch(rs.range("v", 50, 300)))
    assert got == sorted(d["_id"] for d in ws.fetch(ws.range("v", 50, 300)))
    for doc_id in (0, 1, 17, 99, 150, 10_000):
        a, b = rc.get(doc_id), wc.get(doc_id)
        assert (a and {k: v for k, v in a.items() if k != "_event_time"}) == \
               (b and {k: v for k, v in b.items() if k != "_event_time"}), doc_id


class Versions:
    """Documents with a write counter ``v``."""

    def __init__(self):
        self.v = 0

    def docs(self, ids) -> list[dict]:
        out = []
        for i in ids:
            self.v += 1
            out.append({"_id": i, "v": self.v, "g": self.v % 7, "tag": "abc"[i % 3], "arr": [i % 5, self.v % 3]})
        return out


@pytest.fixture
def pair(tmp_path):
    """(writer, reader) of one directory, in this process; small segments, no reader grace."""
    path = str(tmp_path / "db")
    w = rtindex.open(path, seal_rows=50, merge_factor=2, reader_grace_seconds=0)
    opened = [w]

    def open_reader(**options):
        r = rtindex.open(path, role="reader", **options)
        opened.append(r)
        return r

    yield w, open_reader
    for d in reversed(opened):
        d.close()


def test_reader_follows_writer_in_process(pair):
    w, open_reader = pair
    ver = Versions()
    wc = w.create_collection("c", shards=3)
    wc.ingest(ver.docs(range(120)))  # more than seal_rows: sealed segments and a tail
    r = open_reader()
    assert r.role == "reader" and r.collection_names() == ["c"]
    rc = r["c"]
    # what was there at open is there at once, with no refresh
    assert len(rc) == 120
    same_reads(w, r)

    # new rows become visible by themselves (the follower thread)
    wc.ingest(ver.docs(range(120, 200)))
    wait_until(lambda: len(rc) == 200, 5, "new rows in the reader")
    wait_until(lambda: content_now(rc) == content(wc), 5, "the reader to equal the writer")

    # upserts, deletes, a patch: visible after refresh()
    wc.ingest(ver.docs(range(0, 200, 3)))
    r.refresh()
    same_reads(w, r)
    for i in (5, 17, 18, 150):
        assert wc.delete(i)
    r.refresh()
    assert rc.get(5) is None and rc.get(17) is None and len(rc) == 196
    same_reads(w, r)
    new = wc.patch(1, [{"op": "replace", "path": "/v", "value": 99_999}, {"op": "add", "path": "/extra", "value": "p"}])
    r.refresh()
    got = rc.get(1)
    assert got["v"] == 99_999 and got["extra"] == "p" and got["_event_time"] == new["_event_time"]
    same_reads(w, r)
    assert r.stats()["lag"]["rows"] == 0

    # a collection created after the reader opened appears (by itself), and its rows
    wd = w.create_collection("d", shards=2)
    wd.ingest([{"_id": i, "x": i} for i in range(70)])
    wait_until(lambda: "d" in r, 5, "collection d in the reader")
    wait_until(lambda: len(r["d"]) == 70, 5, "the rows of d in the reader")
    assert r.collection_names() == ["c", "d"]
    assert sorted(d["x"] for d in content(r["d"]).values()) == list(range(70))
    # ... and a dropped one disappears (refresh() sees it at once)
    rd = r["d"]
    w.drop_collection("d")
    r.refresh()
    assert "d" not in r and r.collection_names() == ["c"]
    with pytest.raises(NotFoundError):
        r["d"]
    with pytest.raises(ClosedError):
        len(rd)
    # a new collection of the same name is followed from scratch
    w.create_collection("d", shards=1).ingest([{"_id": "only"}])
    r.refresh()
    assert [doc["_id"] for doc in content(r["d"]).values()] == ["only"]
    same_reads(w, r)


def test_an_old_snapshot_reads_the_rows_it_saw_after_a_merge(pair):
    """With reader_grace_seconds=0 the writer cleans up after a merge at once; a reader
    snapshot taken before still shows the dropped rows, and reads them from the segment
    files it maps, which hold the rows (the row store no longer does)."""
    w, open_reader = pair
    c = w.create_collection("c", shards=1)
    c.ingest([{"_id": i, "v": 0} for i in range(50)])
    c.flush()
    r = open_reader(row_cache_bytes=0)  # every fetch reads the row store
    snap = r["c"].snapshot()
    assert len(snap.fetch(snap.all())) == 50
    c.ingest([{"_id": i, "v": 1} for i in range(50)])  # every old row replaced
    c.flush()
    w._runtime.merger.wait_idle()  # the merge of the all-deleted segment and its clean-up
    r.refresh()
    fresh = r["c"].snapshot()
    assert [d["v"] for d in fresh.fetch(fresh.all())] == [1] * 50
    assert [d["v"] for d in snap.fetch(snap.all())] == [0] * 50


def test_reader_refuses_writes(pair):
    w, open_reader = pair
    wc = w.create_collection("c", shards=2)
    wc.ingest([{"_id": i, "v": i} for i in range(10)])
    r = open_reader()
    rc = r["c"]
    attempts = {
        "ingest": lambda: rc.ingest([{"_id": 100, "v": 1}]),
        "ingest bytes": lambda: rc.ingest(b'{"_id": 101}\n'),
        "delete": lambda: rc.delete(1),
        "patch": lambda: rc.patch(1, [{"op": "replace", "path": "/v", "value": 5}]),
        "flush": lambda: rc.flush(),
        "create_collection": lambda: r.create_collection("x"),
        "create_collection exist_ok": lambda: r.create_collection("c", exist_ok=True),
        "drop_collection": lambda: r.drop_collection("c"),
    }
    for what, call in attempts.items():
        with pytest.raises(ReadOnlyError):
            call()
            pytest.fail(f"{what} through a reader did not raise ReadOnlyError")
    assert issubclass(ReadOnlyError, rtindex.RtindexError)
    r.refresh()
    assert sorted(content(rc)) == list(range(10)) and rc.get(1)["v"] == 1
    assert r.collection_names() == ["c"] and w.collection_names() == ["c"]
    assert sorted(content(wc)) == list(range(10))
    # the writer is unaffected and the reader still follows
    wc.ingest([{"_id": 100, "v": 7}])
    wait_until(lambda: rc.get(100) is not None, 5, "a row written after the refused writes")


def test_reader_lag_stats(pair):
    w, open_reader = pair
    wc = w.create_collection("c", shards=2)
    r = open_reader()
    st = r.stats()
    assert st["role"] == "reader"
    assert set(st["lag"]) >= {"rows", "ms"} and st["lag"]["rows"] == 0
    assert all("lag" in s for s in st["collections"]["c"]["shards"])
    ver = Versions()
    for _ in range(5):
        wc.ingest(ver.docs(range(300)))
        lag = r.stats()["lag"]  # whatever the follower did meanwhile: numbers, never negative
        assert lag["rows"] >= 0 and lag["ms"] >= 0
        r.refresh()
        lag = r.stats()["lag"]
        assert lag["rows"] == 0, lag
        assert len(r["c"]) == 300
    assert "lag" not in w.stats()


def test_reader_equals_writer_across_seals_and_merges(pair, rand):
    """SQL and snapshot lookups on the reader equal the writer's after refresh(), while the
    writer seals every 50 rows per shard and merges pairs of segments in the background."""
    w, open_reader = pair
    ver = Versions()
    wc = w.create_collection("c", shards=2)
    r = open_reader()
    ids = list(range(400))
    for rnd in range(25):
        k = rand.randrange(1, 120)
        wc.ingest(ver.docs(rand.sample(ids, k)))  # upserts and new ids
        for i in rand.sample(ids, rand.randrange(0, 6)):
            wc.delete(i)
        if rnd % 5 == 4:
            i = rand.choice([d for d in range(400) if wc.get(d) is not None])
            wc.patch(i, [{"op": "replace", "path": "/g", "value": 3}])
        if rnd % 8 == 7:
            wc.flush()  # everything sealed and merged
        r.refresh()
        same_reads(w, r)
    stats = w.stats()["collections"]["c"]["shards"]
    assert sum(s["sealed_segments"] for s in stats) >= 2  # it did seal
    # the reader also converges by itself after the writer's background work settles
    wc.flush()
    wait_until(lambda: content_now(r["c"]) == content(wc), 5, "the reader to converge after flush")
    r.refresh()
    same_reads(w, r)
    assert r.stats()["lag"]["rows"] == 0 and r.stats()["follow_error"] is None


# ===================================================================== 2. processes
def _env() -> dict:
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + [str(REPO_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


class Run:
    """One directory, one sequence, writer processes one after another, reader processes."""

    def __init__(self, tmp_path: Path, seed: int, steps: int, shards: int):
        self.tmp = tmp_path
        self.dir = str(tmp_path / "db")
        self.seed, self.n, self.shards = seed, steps, shards
        self.acks = str(tmp_path / "acks")
        self.go = str(tmp_path / "go")
        self.stop = str(tmp_path / "stop")
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []
        self.readers: list[tuple[subprocess.Popen, Path]] = []
        self.steps = rw.build_steps(seed, steps)
        self.table = rw.model_digests(self.steps, shards)
        self.writers = 0
        self.events: list[tuple[float, str]] = []  # (time, what) for failure messages

    def note(self, what: str) -> None:
        self.events.append((time.time(), what))

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        err = self.tmp / f"{name}.stderr"
        with open(err, "wb") as f:
            p = subprocess.Popen([sys.executable, "-u", str(WORKER), *args], stdout=f, stderr=subprocess.STDOUT,
                                 env=_env(), cwd=str(REPO_ROOT))
        self.procs.append((name, p, err))
        return p

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.stderr").read_text(errors="replace")[-3000:]

    # ---------------------------------------------------------------- writer
    def start_writer(self, until: int = 0, delay_ms: float = 1.0, go: bool = False) -> subprocess.Popen:
        self.writers += 1
        name = f"writer{self.writers}"
        before = self._ready_count()
        args = ["writer", self.dir, "--acks", self.acks, "--seed", str(self.seed), "--steps", str(self.n),
                "--shards", str(self.shards), "--delay-ms", str(delay_ms)]
        if until:
            args += ["--until", str(until)]
        if go:
            args += ["--go", self.go]
        p = self._spawn(name, args)
        wait_until(lambda: self._ready_count() > before or self._died(p, name), 60, f"{name} to open")
        self.note(f"{name} open (pid {p.pid}) after step {self.acked()}")
        return p

    def _died(self, p: subprocess.Popen, name: str) -> bool:
        if p.poll() is not None:
            raise AssertionError(f"{name} exited with {p.returncode}:\n{self.output(name)}")
        return False

    def _ack_lines(self) -> list[bytes]:
        try:
            with open(self.acks, "rb") as f:
                return f.read().split(b"\n")[:-1]
        except FileNotFoundError:
            return []

    def _ready_count(self) -> int:
        return sum(1 for line in self._ack_lines() if line.startswith(b"ready"))

    def in_flight(self) -> int:
        """The step the writer began and has not acknowledged (0 if none)."""
        lines = self._ack_lines()
        return int(lines[-1][1:]) if lines and lines[-1].startswith(b"b") else 0

    def acked(self) -> int:
        a = rw.read_acks(self.acks)
        return a[-1] if a else 0

    def wait_writer(self, p: subprocess.Popen, timeout: float = 60) -> None:
        name = next(n for n, q, _ in self.procs if q is p)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} did not finish in {timeout}s (acked {self.acked()})") from None
        assert rc == 0, f"{name} exited with {rc}:\n{self.output(name)}"
        self.note(f"{name} exited after step {self.acked()}")

    # ---------------------------------------------------------------- readers
    def start_readers(self, n: int = 2) -> None:
        for j in range(n):
            name = f"reader{len(self.readers) + 1}"
            out = self.tmp / f"{name}.ndjson"
            p = self._spawn(name, ["reader", self.dir, "--out", str(out), "--stop", self.stop, "--seed",
                                   str(self.seed), "--steps", str(self.n), "--shards", str(self.shards)])
            self.readers.append((p, out))
        for k, (p, out) in enumerate(self.readers):
            wait_until(lambda out=out, p=p, k=k: b'"ready"' in self._raw(out) or self._died(p, f"reader{k + 1}"), 60,
                       f"reader{k + 1} to open")

    @staticmethod
    def _raw(out: Path) -> bytes:
        try:
            return out.read_bytes()
        except FileNotFoundError:
            return b""

    def records(self, out: Path) -> list[dict]:
        return [orjson.loads(line) for line in self._raw(out).split(b"\n")[:-1]]

    def reads_since(self, out: Path, t: float) -> list[dict]:
        return [r for r in self.records(out) if "i" in r and r["t"] >= t]

    def wait_converged(self, timeout: float = 10.0) -> float:
        """Each reader reads the final state by itself; the seconds the slowest took."""
        final = self.table[self.n][0]
        t0 = time.time()
        for k, (p, out) in enumerate(self.readers):
            wait_until(lambda out=out, p=p, k=k: any(r.get("d") == final for r in self.reads_since(out, t0 - 0.5))
                       or self._died(p, f"reader{k + 1}"), timeout,
                       f"reader{k + 1} to converge to the final state (step {self.n})", interval=0.02)
        return time.time() - t0

    def stop_readers(self, timeout: float = 20) -> list[str]:
        """Stop the readers (each refreshes, reads a last time, closes); the problems, if any
        (a reader that hangs in close() is killed, after it printed its threads' stacks)."""
        Path(self.stop).touch()
        problems = []
        for k, (p, _) in enumerate(self.readers):
            try:
                rc = p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
                problems.append(f"reader{k + 1} did not stop in {timeout}s:\n{self.output(f'reader{k + 1}')}")
                continue
            if rc != 0:
                problems.append(f"reader{k + 1} exited with {rc}:\n{self.output(f'reader{k + 1}')}")
        return problems

    def finish(self, strict: bool) -> list[dict]:
        """Readers converge by themselves, stop, and every read they made is checked; the
        first problem found is raised (the read checks first: they say the most)."""
        problems = []
        try:
            self.wait_converged()
        except AssertionError as e:
            problems.append(str(e))
        problems += self.stop_readers()
        summary = self.check(strict)
        assert not problems, "\n".join(problems)
        return summary

    def cleanup(self) -> None:
        Path(self.stop).touch()
        for _, p, _ in self.procs:
            if p.poll() is None:
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)

    # ---------------------------------------------------------------- checking
    def check(self, strict: bool) -> list[dict]:
        """Every read of every reader is a prefix of the steps, and never goes back.

        ``strict``: the whole collection at once (one-shard collections); otherwise each
        shard on its own. Returns, per reader, {"reads", "prefixes": distinct prefixes seen,
        "final": the prefix of its final read}."""
        summary = []
        by_d: dict[int, list[int]] = {}
        by_sd: list[dict[int, list[int]]] = [{} for _ in range(self.shards)]
        for j, (d, _, sd) in enumerate(self.table):
            by_d.setdefault(d, []).append(j)
            for s in range(self.shards):
                by_sd[s].setdefault(sd[s], []).append(j)
        for k, (_, out) in enumerate(self.readers):
            recs = self.records(out)
            reads = [r for r in recs if "i" in r]
            closed = [r for r in recs if "closed" in r]
            assert closed, f"reader{k + 1} did not finish (no 'closed' record)"
            errors = [r for r in reads if "err" in r] + [r for r in recs if "refresh_err" in r]
            assert not errors, f"reader{k + 1}: {len(errors)} reads failed; first:\n" \
                               f"{errors[0].get('err') or errors[0].get('refresh_err')}"
            assert [r["i"] for r in reads] == list(range(len(reads)))
            lo = 0
            los = [0] * self.shards
            seen = set()
            for r in reads:
                if strict:
                    lo = self._advance(k, r, lo, by_d.get(r["d"]), None)
                    seen.add(lo)
                for s in range(self.shards):
                    los[s] = self._advance(k, r, los[s], by_sd[s].get(r["sd"][s]), s)
                if not strict:
                    seen.add(tuple(los))
            last = reads[-1]
            assert last.get("final") and last["d"] == self.table[self.n][0], \
                f"reader{k + 1}'s final read (after refresh) is not the final state: {self._diff(last, self.n)}"
            assert closed[0]["closed"]["lag"]["rows"] == 0, closed[0]
            summary.append({"reads": len(reads), "prefixes": len(seen),
                            "via": {v: sum(1 for r in reads if r["via"] == v) for v in ("sql", "snapshot")}})
        return summary

    def _advance(self, k: int, r: dict, lo: int, cands: list[int] | None, shard: int | None) -> int:
        where = "" if shard is None else f" (shard {shard})"
        if not cands:
            raise AssertionError(
                f"reader{k + 1} read #{r['i']} ({r['via']}, {r['n']} documents) at {r['t']:.3f} is no prefix of the "
                f"steps{where}: {self._diff(r, lo)}\n{self._timeline(r['t'])}")
        later = [j for j in cands if j >= lo]
        if not later:
            raise AssertionError(f"reader{k + 1} went back in time{where}: read #{r['i']} ({r['via']}) saw the state "
                                 f"after step {max(cands)}, an earlier read saw step {lo}\n{self._timeline(r['t'])}")
        return later[0]

    def _diff(self, r: dict, j: int) -> str:
        if "docs" not in r:
            return f"digest {r.get('d')}, {r.get('n')} documents"
        got = {tuple(x) for x in r["docs"]}
        parts = []
        for jj in sorted({max(j - 1, 0), j, min(j + 1, self.n)}):
            want = set(rw.replay(self.steps, jj).items())
            miss, extra = sorted(want - got, key=repr), sorted(got - want, key=repr)
            parts.append(f"vs. the state after step {jj}: {len(miss)} missing {miss[:6]}, "
                         f"{len(extra)} unexpected {extra[:6]}")
        return "; ".join(parts)

    def _timeline(self, t: float) -> str:
        return "events: " + ", ".join(f"{what} at {ts:.3f}" for ts, what in self.events) + f" (read at {t:.3f})"


@pytest.fixture
def run_factory(tmp_path, rand):
    runs = []

    def make(steps: int, shards: int) -> Run:
        print(f"replay with RTINDEX_SEED={rand.seed_value}; files in {tmp_path}")  # shown on failure
        r = Run(tmp_path, rand.seed_value, steps, shards)
        runs.append(r)
        return r

    yield make
    for r in runs:
        r.cleanup()


def _sequence(run: Run, shards_strict: bool) -> list[dict]:
    # The writer sleeps between steps so that each reader, whose whole-collection reads take
    # tens of milliseconds on a busy machine, sees the sequence go by (the checks below ask
    # for 10 distinct states): a timing need, not a correctness one.
    w = run.start_writer(delay_ms=4.0, go=True)
    run.start_readers(2)
    Path(run.go).touch()
    run.note("go")
    run.wait_writer(w)
    return run.finish(strict=shards_strict)


@pytest.mark.timeout(180)
def test_two_reader_processes_see_prefixes(run_factory):
    run = run_factory(steps=300, shards=1)
    summary = _sequence(run, True)
    # the readers saw the sequence go by, not only its ends
    assert all(s["prefixes"] >= 10 and s["via"]["sql"] and s["via"]["snapshot"] for s in summary), summary


@pytest.mark.timeout(180)
def test_two_reader_processes_multi_shard(run_factory):
    """Per shard, every read is a prefix of the writer's batches. Across shards it need not be
    (docs/reference.md): an ingest writes its shards one after another."""
    run = run_factory(steps=250, shards=3)
    summary = _sequence(run, False)
    assert all(s["prefixes"] >= 10 for s in summary), summary


def _kill_and_recover(run: Run, rand, cycles: int) -> None:
    """Writers killed with SIGKILL while writing, each followed by a new writer process."""
    w = run.start_writer(delay_ms=0.5, go=True)
    run.start_readers(2)
    Path(run.go).touch()
    run.note("go")
    for c in range(cycles):
        target = min(run.acked() + rand.randrange(20, 60), run.n - 20)
        wait_until(lambda target=target, w=w: run.acked() >= target or w.poll() is not None, 60, f"step {target}")
        assert w.poll() is None, f"writer exited before it was killed:\n{run.output(f'writer{run.writers}')}"
        # kill it mid-batch: once a step has begun and is not acknowledged yet (best effort:
        # the step may complete between our look and the kill)
        wait_until(lambda w=w: run.in_flight() or w.poll() is not None, 5, "a step in flight")
        os.kill(w.pid, signal.SIGKILL)
        w.wait(10)
        t_kill = time.time()
        run.note(f"writer{run.writers} killed after step {run.acked()}"
                 + (f", in step {run.in_flight()}" if run.in_flight() else ""))
        # readers keep serving their last state while there is no writer: three complete
        # reads each (a read of the whole collection over SQL takes up to a few hundred ms
        # on 2 busy cores, so they are waited for, not counted in a fixed window)
        for k, (p, out) in enumerate(run.readers):
            wait_until(lambda out=out, p=p: len([r for r in run.reads_since(out, t_kill) if "t1" in r]) >= 3
                       or p.poll() is not None, 10, f"reader{k + 1} to make 3 reads without a writer")
            assert p.poll() is None, f"reader{k + 1} died when the writer was killed:\n{run.output(f'reader{k + 1}')}"
            during = run.reads_since(out, t_kill)
            bad = [r for r in during if "err" in r]
            assert not bad, f"reader{k + 1} failed while the writer was down:\n{bad[0]['err']}"
        w = run.start_writer(delay_ms=0.5)  # recovery; it re-applies the step that was in flight
    run.wait_writer(w)
    print(run._timeline(time.time()))
    run.finish(strict=run.shards == 1)


@pytest.mark.timeout(180)
def test_readers_survive_writer_kill(run_factory, rand):
    run = run_factory(steps=200, shards=1)
    _kill_and_recover(run, rand, cycles=1)


@pytest.mark.timeout(180)
def test_readers_survive_writer_clean_restart(run_factory):
    run = run_factory(steps=200, shards=1)
    w = run.start_writer(until=90, go=True)
    run.start_readers(2)
    Path(run.go).touch()
    run.wait_writer(w)
    t_down = time.time()
    time.sleep(0.3)  # no writer for a while: readers serve the state after step 90
    for k, (_, out) in enumerate(run.readers):
        assert any(r.get("d") == run.table[90][0] for r in run.reads_since(out, t_down)), \
            f"reader{k + 1} does not serve the state after step 90 while the writer is down"
    w = run.start_writer()
    run.wait_writer(w)
    run.finish(strict=True)


# ---------------------------------------------------------------- long variants
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_reader_processes_long(run_factory):
    run = run_factory(steps=1500, shards=1)
    _sequence(run, True)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("shards", [1, 3])
def test_readers_survive_repeated_writer_kills(run_factory, rand, shards):
    run = run_factory(steps=700, shards=shards)
    _kill_and_recover(run, rand, cycles=6)


def test_write_fences_give_read_your_writes(pair):
    """A fence from the writer tells a reader when it sees that write (the service's
    ``min_fence``); a fence of a dropped collection never waits for it forever."""
    w, open_reader = pair
    wc = w.create_collection("f", shards=2)
    r = open_reader()
    stats = wc.ingest([{"_id": i, "v": i} for i in range(10)])
    assert stats.fence == wc.fence() and w.caught_up(stats.fence)
    assert r.wait_for(stats.fence, timeout=5)
    assert len(r["f"]) == 10  # everything the fence covers is visible once it is reached
    for _ in range(3):  # each write's fence, then a read at once: the write is there
        s = wc.ingest([{"_id": 100, "v": len(r["f"])}])
        assert r.wait_for(s.fence, timeout=5)
        assert r["f"].get(100) == wc.get(100)
    wc.delete(3)
    assert r.wait_for(wc.fence(), timeout=5) and r["f"].get(3) is None

    # a collection the reader has not learned of yet: not caught up until it has
    nc = w.create_collection("g", shards=1)
    fence = nc.ingest([{"_id": 1}]).fence
    assert r.wait_for(fence, timeout=5) and r["g"].get(1) is not None
    # dropped and made again: the old fence does not wait, a new one does until followed
    w.drop_collection("g")
    nc = w.create_collection("g", shards=3)
    new_fence = nc.ingest([{"_id": 2}]).fence
    assert r.wait_for(new_fence, timeout=5) and r["g"].get(2) is not None
    assert r.caught_up(fence)

    for bad in ("", "f", "f/1/x", "f/-1/2", "a/b/c/d", 7):
        with pytest.raises(rtindex.FenceError, match="not a write fence"):
            r.caught_up(bad)
    assert not r.wait_for(f"f/{r['f'].created}/{10**9}.{10**9}", timeout=0.05)


def test_ingest_reports_which_documents_replaced_a_stored_one(db):
    c = db.create_collection("r", shards=2)
    assert c.ingest([{"_id": 1}, {"_id": 2}]).replaced == []
    s = c.ingest([{"_id": 3}, {"_id": 2}, {"_id": "bad", "x": float("nan")}, {"_id": 3}, {"_id": 1}], errors="report")
    assert s.replaced == [1, 3, 4] and s.n == 3


# ===================================================================== 3. readers that lag
def wal_files(coll) -> set[str]:
    """The WAL files of the RocksDB instances of every shard of ``coll``."""
    return set(glob.glob(os.path.join(coll.path, "shard-*", "*.log")))


LEVEL0_TRIGGER = 4  # RocksDB's level0_file_num_compaction_trigger (its default)


def level0_files(shard) -> int:
    return shard.store._cf["meta"].property_int_value("rocksdb.num-files-at-level0")


def churn(wc, ver: Versions, rand, rounds: int) -> None:
    """Rounds of upserts, new documents, deletes and a patch, each ending with the writer's
    memtables flushed: RocksDB starts a new WAL file and deletes the ones the flush emptied."""
    for _ in range(rounds):
        docs = ver.docs(rand.sample(range(400), 80))
        wc.ingest(docs)
        wc.patch(docs[-1]["_id"], [{"op": "replace", "path": "/g", "value": 3}])
        for i in rand.sample(range(400), 4):
            wc.delete(i)
        for s in wc._shards:
            s.store.flush_memtables()


def settle(wc) -> None:
    """End the way RocksDB may end a writer's busy spell: the writer's last writes flushed
    into SST files (no WAL file holds them any more) and these compacted into the last
    level, which rewrites their keys. RocksDB compacts once ``LEVEL0_TRIGGER`` files wait
    in level 0, so each shard deletes a document and flushes until a flush makes that many."""
    wc.flush()
    for shard in wc._shards:
        mine = [d["_id"] for d in content(wc).values() if wc._shard_for(d["_id"])[0] is shard]
        while True:
            assert wc.delete(mine.pop())
            shard.wait_for_background()
            shard.store.flush_memtables()
            if level0_files(shard) >= LEVEL0_TRIGGER:
                break
        wait_until(lambda shard=shard: level0_files(shard) == 0, 10, "RocksDB to compact level 0", 0.01)


def test_a_reader_that_lagged_reads_the_latest_versions_after_its_wal_files_went(pair, rand):
    """A reader that did not catch up while the writer wrote, flushed (deleting every WAL
    file the reader had read from) and compacted: its next refresh shows every document at
    its latest version (count, get, SQL, snapshot lookups), never what its RocksDB
    secondary replayed of the deleted files."""
    w, open_reader = pair
    ver = Versions()
    wc = w.create_collection("c", shards=2)
    wc.ingest(ver.docs(range(300)))
    r = open_reader()
    wait_until(lambda: len(r["c"]) == 300, 5, "the reader to show the documents")
    r._follower.stop()  # nothing catches the reader up until it is asked to
    read = wal_files(wc)
    churn(wc, ver, rand, rounds=8)
    settle(wc)
    assert not read & wal_files(wc), "the writer kept a WAL file the reader had read from"
    r.refresh()
    assert len(r["c"]) == len(wc)
    same_reads(w, r)


def test_a_reader_catching_up_while_the_writer_deletes_wal_files(pair, rand):
    """A thread refreshes and reads the reader over and over (with its follower thread) while
    the writer writes and flushes hard: no read or refresh fails, and the reader equals the
    writer once the writer stops."""
    w, open_reader = pair
    ver = Versions()
    wc = w.create_collection("c", shards=2)
    wc.ingest(ver.docs(range(300)))
    r = open_reader()
    rc = r["c"]
    stop = threading.Event()
    errors: list[str] = []
    reads = [0]

    def follow(rng: random.Random) -> None:
        while not stop.is_set():
            try:
                r.refresh()
                len(rc)
                rc.get(rng.randrange(400))
                r.sql("SELECT count(*) AS n FROM c WHERE g = 3").rows()
                reads[0] += 1
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

    t = threading.Thread(target=follow, args=(random.Random(rand.random()),))
    t.start()
    try:
        read = wal_files(wc)
        churn(wc, ver, rand, rounds=25)
        settle(wc)
    finally:
        stop.set()
        t.join()
    assert not read & wal_files(wc), "the writer kept a WAL file the reader had read from"
    assert not errors, f"{len(errors)} of {reads[0] + len(errors)} reads failed; first: {errors[0]}"
    assert reads[0] > 10
    r.refresh()
    same_reads(w, r)
    assert r.stats()["follow_error"] is None


@pytest.mark.timeout(120)
def test_a_reader_process_stopped_while_its_wal_files_went(tmp_path, rand):
    """A reader process stopped (SIGSTOP) while the writer writes, flushes and compacts
    catches up by itself once it runs again, the writer closed by then: it reads the
    writer's final state, and none of its reads or refreshes fail."""
    path = str(tmp_path / "db")
    out, stop = tmp_path / "reader.ndjson", tmp_path / "stop"
    w = rtindex.open(path, **rw.OPEN_OPTIONS)
    p = None
    try:
        wc = w.create_collection(rw.COLLECTION, shards=2)
        ver = Versions()
        wc.ingest(ver.docs(range(300)))
        with open(tmp_path / "reader.stderr", "wb") as f:
            p = subprocess.Popen([sys.executable, "-u", str(WORKER), "reader", path, "--out", str(out), "--stop",
                                  str(stop), "--shards", "2"], stdout=f, stderr=subprocess.STDOUT, env=_env(),
                                 cwd=str(REPO_ROOT))

        def records() -> list[dict]:
            return [orjson.loads(line) for line in Run._raw(out).split(b"\n")[:-1]]

        wait_until(lambda: any("ready" in x for x in records()) or p.poll() is not None, 60, "the reader to open")
        assert p.poll() is None, (tmp_path / "reader.stderr").read_text()
        os.kill(p.pid, signal.SIGSTOP)
        read = wal_files(wc)
        churn(wc, ver, rand, rounds=8)
        settle(wc)
        assert not read & wal_files(wc), "the writer kept a WAL file the reader had read from"
        want = rw.digest(((d["_id"], d["v"]) for d in content(wc).values()), 2)[0]
        w.close()  # no later write of the writer's can mend the reader's RocksDB for it
        t0 = time.time()
        os.kill(p.pid, signal.SIGCONT)
        wait_until(lambda: any(x.get("d") == want and x["t"] >= t0 for x in records()) or p.poll() is not None, 20,
                   "the reader to read the writer's final state", 0.02)
        stop.touch()
        assert p.wait(20) == 0, (tmp_path / "reader.stderr").read_text()
        recs = records()
        failed = [x.get("err") or x["refresh_err"] for x in recs if "err" in x or "refresh_err" in x]
        assert not failed, f"{len(failed)} reads failed; first:\n{failed[0]}"
        closed = next(x["closed"] for x in recs if "closed" in x)
        assert closed["follow_error"] is None and closed["lag"]["rows"] == 0, closed
    finally:
        if p is not None and p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait(10)
        w.close()


def test_a_reader_asked_for_an_invalid_name_does_not_look_on_disk(tmp_path):
    """A name no collection can have (a NUL byte, a path) is "no collection" on a reader, as
    on the writer: it is never looked up as a path (a NUL made it a ValueError, a 500 from
    the service; "../x" would read a manifest outside the database)."""
    with rtindex.open(tmp_path / "db") as w:
        w.create_collection("c").ingest([{"_id": 1}])
        (tmp_path / "x").mkdir()
        with rtindex.open(tmp_path / "db", role="reader") as r:
            for name in ("a\x00b", "\x00", "../c", "../../x", "c/"):
                assert name not in r
                with pytest.raises(rtindex.SqlError, match="no collection"):
                    r.sql(f'SELECT COUNT(*) AS n FROM "{name}"')
            assert r.sql("SELECT COUNT(*) AS n FROM c").rows() == [{"n": 1}]
