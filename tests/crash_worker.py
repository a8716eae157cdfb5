"""Crash-test worker: writes to an rtindex database forever, until it is killed (kill -9).

Usage: python crash_worker.py DIR SEED [ACKLOG]

It opens ``rtindex.open(DIR, seal_rows=200, merge_factor=2)`` (so segments are sealed and
merged all the time), creates or opens collection "c" (3 shards) and loops: ingest batches
(upserts of ids from a pool, some new ids, sometimes the same id twice in a batch), deletes
and patches. Every document carries ``v``, a write counter that increases across runs (each
value is written once), a nested payload, and ``chk``, a checksum over all its other fields.

The ack log (ACKLOG, default DIR + ".acks") gets, for every call, one ``begin`` line written
and fsynced BEFORE the call (what the call may write) and one ``ack`` line written and
fsynced after it RETURNED (so the write was acknowledged). To halve the fsyncs, an ack is
written together with the next call's begin (or before a flush/snapshot), still before
anything else is written: an ack lost to a kill only makes the check weaker for that call.
A kill can tear the last line; the reader ignores a partial last line, and this worker
truncates it away when it starts.

Protocol with the parent (tests/test_crash.py): prints ``OPENING`` right before
rtindex.open and ``READY`` once the collection is open, on stdout. Anything on stderr (a
traceback, a logged background failure) means something went wrong; on an unexpected
error the worker exits with status 3.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import traceback

import jsonpatch
import orjson

SEAL_ROWS = 200
MERGE_FACTOR = 2
SHARDS = 3
POOL = 400  # ids 0..199 (ints) and "s0".."s199" (strings); plus fresh "n<v>" ids
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
OPEN_OPTIONS = {"seal_rows": SEAL_ROWS, "merge_factor": MERGE_FACTOR}


def checksum(doc: dict) -> str:
    """Over every field but ``chk`` itself (``_id`` and ``_event_time`` included)."""
    body = {k: v for k, v in doc.items() if k != "chk"}
    return hashlib.sha1(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()[:20]


def snapshot_content(s) -> list:
    return sorted((d["v"], d["chk"]) for d in s.fetch(s.all()))


def pool_id(i: int):
    return i if i < POOL // 2 else f"s{i - POOL // 2}"


def make_doc(rng: random.Random, doc_id, v: int) -> dict:
    p: dict = {
        "a": rng.randrange(1000),
        "s": rng.choice(WORDS) + str(v % 7),
        "arr": [rng.randrange(100) for _ in range(rng.randrange(6))],
        "f": round(rng.uniform(-1000, 1000), rng.randrange(1, 6)),
        "flag": rng.random() < 0.5,
    }
    if rng.random() < 0.5:
        p["objs"] = [{"x": rng.randrange(10), "y": [rng.choice(WORDS) for _ in range(rng.randrange(3))]}
                     for _ in range(rng.randrange(1, 4))]
    if rng.random() < 0.3:
        p["deep"] = {"l1": {"l2": {"l3": v, "w": rng.choice(WORDS)}}}
    if rng.random() < 0.3:
        p["nul"] = None
    r = rng.random()  # a field whose type changes from document to document
    p["m"] = rng.randrange(50) if r < 0.3 else rng.choice(WORDS) if r < 0.6 else \
        [rng.randrange(5), rng.choice(WORDS)] if r < 0.8 else rng.random()
    if rng.random() < 0.05:
        p["blob"] = "x" * rng.randrange(1000, 20000)  # some bigger documents
    doc = {"_id": doc_id, "v": v, "_event_time": 1_600_000_000_000_000 + v * 1000,
           "tag": rng.choice(WORDS[:4]), "p": p}
    doc["chk"] = checksum(doc)
    return doc


class AckLog:
    def __init__(self, path: str):
        self.path = path
        # cut a line torn by the previous kill, so that new lines start on a line boundary
        if os.path.exists(path):
            with open(path, "rb") as f:
                data = f.read()
            keep = data.rfind(b"\n") + 1
            if keep != len(data):
                with open(path, "r+b") as f:
                    f.truncate(keep)
                    f.flush()
                    os.fsync(f.fileno())
        else:
            data = b""
            keep = 0
        self.max_v = 0
        for line in data[:keep].splitlines():
            rec = orjson.loads(line)
            if rec["t"] == "begin":
                if rec["op"] == "ingest":
                    self.max_v = max([self.max_v] + [w[1] for w in rec["w"]])
                elif rec["op"] == "patch":
                    self.max_v = max(self.max_v, rec["v"])
        self.f = open(path, "ab")
        self.pending_ack: dict | None = None

    def write(self, rec: dict | None = None) -> None:
        """Append (after the delayed ack of the previous call, if any) and fsync.

        An ack is written together with the next call's begin record: one fsync per call.
        """
        out = b""
        if self.pending_ack is not None:
            out += orjson.dumps(self.pending_ack) + b"\n"
            self.pending_ack = None
        if rec is not None:
            out += orjson.dumps(rec) + b"\n"
        if out:
            self.f.write(out)
            self.f.flush()
            os.fsync(self.f.fileno())

    def ack(self, rec: dict) -> None:
        self.pending_ack = rec


def main() -> None:
    path, seed = sys.argv[1], int(sys.argv[2])
    log_path = sys.argv[3] if len(sys.argv) > 3 else path.rstrip("/") + ".acks"
    rng = random.Random(seed)
    log = AckLog(log_path)
    v = log.max_v  # every v this worker writes is larger than any v ever attempted before

    import rtindex

    print("OPENING", flush=True)
    db = rtindex.open(path, **OPEN_OPTIONS)
    coll = db.create_collection("c", shards=SHARDS, exist_ok=True)
    log.write({"t": "start", "pid": os.getpid(), "seed": seed, "v0": v})
    print("READY", flush=True)

    seq = 0
    held = []  # (snapshot, count, content): kept a while, so merged-away segments stay referenced
    while True:
        seq += 1
        r = rng.random()
        if r < 0.60:  # ingest a batch
            n = rng.choice([1, 1, 2, 5, 10, 20, 50]) if rng.random() < 0.7 else rng.randrange(1, 300)
            batch = []
            for _ in range(n):
                v += 1
                if rng.random() < 0.03:
                    doc_id = f"n{v}"
                elif batch and rng.random() < 0.03:
                    doc_id = rng.choice(batch)["_id"]  # the same id twice in one batch
                else:
                    doc_id = pool_id(rng.randrange(POOL))
                batch.append(make_doc(rng, doc_id, v))
            last = {}
            for d in batch:  # the last write of an id in a batch is what stays
                last[orjson.dumps(d["_id"])] = [d["_id"], d["v"], d["chk"]]
            log.write({"t": "begin", "seq": seq, "op": "ingest", "n": n, "w": list(last.values())})
            stats = coll.ingest(batch)
            # an _id twice in one batch is one document: counted once, listed at its first appearance
            if stats.errors or stats.n != len(last) or stats.ids != [w[0] for w in last.values()]:
                raise AssertionError(f"ingest of {n} documents: {stats!r} errors={stats.errors[:3]}")
            log.ack({"t": "ack", "seq": seq, "n": stats.n})
        elif r < 0.80:  # delete one id (present or not)
            doc_id = pool_id(rng.randrange(POOL))
            log.write({"t": "begin", "seq": seq, "op": "delete", "id": doc_id})
            existed = coll.delete(doc_id)
            log.ack({"t": "ack", "seq": seq, "existed": existed})
        elif r < 0.95:  # patch a present document
            doc_id = pool_id(rng.randrange(POOL))
            cur = coll.get(doc_id)
            if cur is None:
                continue
            v += 1
            ops = [{"op": "replace", "path": "/v", "value": v},
                   {"op": "add", "path": "/p/patched", "value": {"by": v, "w": rng.choice(WORDS)}},
                   {"op": "replace", "path": "/tag", "value": rng.choice(WORDS[:4])}]
            if cur["p"].get("arr"):
                ops.append({"op": "remove", "path": "/p/arr/0"})
            ops.append({"op": "add", "path": "/p/arr/-", "value": v % 100})
            if "deep" in cur["p"]:
                ops.append({"op": "remove", "path": "/p/deep"})
            new = jsonpatch.apply_patch(cur, ops)
            chk = checksum(new)
            ops.append({"op": "replace", "path": "/chk", "value": chk})
            log.write({"t": "begin", "seq": seq, "op": "patch", "id": doc_id, "from_v": cur["v"],
                       "v": v, "chk": chk})
            got = coll.patch(doc_id, ops)
            if got["v"] != v or got["chk"] != chk or checksum(got) != chk:
                raise AssertionError(f"patch of {doc_id!r} returned {got!r}, expected v={v} chk={chk}")
            log.ack({"t": "ack", "seq": seq})
        elif r < 0.99:  # readers: hold a snapshot for a while, so merges happen under readers
            log.write()  # acks are never held back across anything but the next call's begin
            s = coll.snapshot()
            held.append((s, s.count(), snapshot_content(s)))
            if len(held) > 3 or rng.random() < 0.3:
                # a snapshot never changes, even after the merges and clean-ups since it was taken
                s, count, content = held.pop(0)
                try:
                    now = snapshot_content(s)
                except Exception as e:
                    raise AssertionError(f"a snapshot held since {count} rows were visible can no longer "
                                         f"fetch them (rows deleted under a live snapshot?): {e!r}") from e
                if len(content) != count or s.count() != count or now != content:
                    raise AssertionError(f"a held snapshot changed: count {count} -> {s.count()}, "
                                         f"{len(content)} -> {len(now)} rows")
        else:  # seal every memory segment and wait for background work
            log.write()
            coll.flush()


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(3)
