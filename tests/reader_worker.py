"""Worker processes for tests/test_reader.py: a writer that applies a deterministic sequence
of steps to collection "c", and a reader (``role="reader"``) that reads the whole collection
over and over and records what it saw.

    python reader_worker.py writer DIR --acks FILE --seed S --steps N [--shards K]
                                [--delay-ms D] [--until M] [--go FILE]
    python reader_worker.py reader DIR --out FILE --stop FILE [--seed S --steps N --shards K]

The sequence (:func:`build_steps`) is a pure function of (seed, steps): step ``k`` (1-based)
is one write call, atomic per shard in the engine: an ``ingest`` of new ids and upserts of
existing ones (one ``ingest()`` call, smaller than its batch_size), a ``delete`` of one
existing id, or a ``patch`` of one existing document. Every document carries ``v``, a
counter unique to each write, so a state is a set of (_id, v) pairs, and the model state
after steps 1..k is :func:`replay`.

Writer: opens DIR with small segments (``seal_rows=50, merge_factor=2``: seals and merges
all the time), creates "c" if it is not there, writes ``ready <pid>`` to the ack file,
waits for the ``--go`` file if given, then applies steps ``last acked + 1`` .. ``--until``
(default N), appending ``b<k>`` to the ack file before each call and ``<k>`` (flushed to the
kernel, so a kill -9 keeps it) after the call RETURNED. A step in flight when a writer was killed is applied again by
the next writer: every step is idempotent (same documents, same ``v``; a delete of an absent
id does nothing; a patch sets ``v`` to a fixed value). Exit status 0 after a clean close.

Reader: opens DIR with ``role="reader"`` (retrying while the database or "c" is not there
yet), then loops until the ``--stop`` file exists: read every (_id, v) of "c", alternating a
snapshot (``fetch(snapshot().all())``) and SQL (``SELECT _id, v FROM c``), and append one JSON
line per read to the out file: ``{"i", "t", "via", "n", "d", "sd"}`` (``d`` the digest of the
read: a sum of per-document hashes, so an order-free multiset digest; ``sd`` the same per
shard); the read's pairs are added (``"docs"``) when its digest is not one of the model's
(for the failure message). A read that raises is a line with ``"err"`` (a traceback): it
never stops the loop. The first line is ``{"ready": pid}`` (after the first read); at stop it
calls ``db.refresh()``, reads once more (``"final": true``), and writes ``{"closed": stats}``.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import os
import random
import sys
import time
import traceback
from pathlib import Path

import orjson

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # after PYTHONPATH: the test may point at another rtindex
    sys.path.append(str(REPO_ROOT))

COLLECTION = "c"
OPEN_OPTIONS = {"seal_rows": 50, "merge_factor": 2}
MASK = (1 << 64) - 1


# ---------------------------------------------------------------------- the sequence
def build_steps(seed: int, n: int, max_batch: int = 40) -> list[tuple]:
    """``n`` steps: ("ingest", [docs]) | ("delete", _id) | ("patch", _id, v).

    Deletes and patches only touch ids present at that point (so each step changes the
    state); ingests mix new ids (int and string) and upserts, sometimes an id twice."""
    rng = random.Random(seed)
    present: dict = {}  # _id -> v
    order: list = []  # ids ever created, for choosing
    steps: list[tuple] = []
    v = 0
    next_id = 0
    for k in range(1, n + 1):
        r = rng.random()
        if present and r < 0.15:
            doc_id = rng.choice([i for i in order if i in present])
            del present[doc_id]
            steps.append(("delete", doc_id))
            continue
        if present and r < 0.22:
            doc_id = rng.choice([i for i in order if i in present])
            v += 1
            present[doc_id] = v
            steps.append(("patch", doc_id, v))
            continue
        docs = []
        for _ in range(rng.randint(1, max_batch)):
            if order and rng.random() < 0.45:
                doc_id = rng.choice(order)  # an upsert (or a re-creation of a deleted id)
            else:
                doc_id = next_id if next_id % 3 else f"s{next_id}"
                next_id += 1
                order.append(doc_id)
            v += 1
            docs.append({"_id": doc_id, "v": v, "k": k, "g": v % 7, "pad": "x" * rng.randrange(0, 120)})
            present[doc_id] = v
        if rng.random() < 0.1:  # the same _id twice in one call: the later version wins
            d = dict(docs[0])
            v += 1
            d["v"] = v
            d["g"] = v % 7
            docs.append(d)
            present[d["_id"]] = v
        steps.append(("ingest", docs))
    return steps


def apply_step(state: dict, step: tuple) -> None:
    """The model: ``state`` (_id -> v) after ``step``."""
    if step[0] == "ingest":
        for d in step[1]:
            state[d["_id"]] = d["v"]
    elif step[0] == "delete":
        state.pop(step[1], None)
    else:
        state[step[1]] = step[2]


def replay(steps: list[tuple], k: int) -> dict:
    state: dict = {}
    for s in steps[:k]:
        apply_step(state, s)
    return state


_HASHES: dict = {}


def item_hash(doc_id, v) -> int:
    key = (type(doc_id).__name__, doc_id, v)
    h = _HASHES.get(key)
    if h is None:
        h = _HASHES[key] = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")
    return h


def shard_of(doc_id, shards: int) -> int:
    from rtindex import documents

    return documents.shard_of(documents.encode_id(doc_id), shards)


def digest(items, shards: int) -> tuple[int, list[int]]:
    """(digest of all, digest per shard) of an iterable of (_id, v)."""
    total = 0
    per = [0] * shards
    for doc_id, v in items:
        h = item_hash(doc_id, v)
        total = (total + h) & MASK
        s = shard_of(doc_id, shards)
        per[s] = (per[s] + h) & MASK
    return total, per


def model_digests(steps: list[tuple], shards: int) -> list[tuple[int, int, list[int]]]:
    """For every prefix j = 0..len(steps): (digest, documents, digests per shard)."""
    state: dict = {}
    total, per = 0, [0] * shards
    out = [(total, 0, list(per))]
    for s in steps:
        touched = [d["_id"] for d in s[1]] if s[0] == "ingest" else [s[1]]
        before = {doc_id: state.get(doc_id) for doc_id in touched}
        apply_step(state, s)
        for doc_id, old in before.items():
            new = state.get(doc_id)
            if old == new:
                continue
            sh = shard_of(doc_id, shards)
            if old is not None:
                h = item_hash(doc_id, old)
                total, per[sh] = (total - h) & MASK, (per[sh] - h) & MASK
            if new is not None:
                h = item_hash(doc_id, new)
                total, per[sh] = (total + h) & MASK, (per[sh] + h) & MASK
        out.append((total, len(state), list(per)))
    return out


# ---------------------------------------------------------------------- writer
def read_acks(path: str) -> list[int]:
    """Step numbers in the ack file (a torn last line is ignored)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    out = []
    for line in data.split(b"\n")[:-1]:
        if line.isdigit():
            out.append(int(line))
    return out


def writer_main(a: argparse.Namespace) -> int:
    import rtindex

    steps = build_steps(a.seed, a.steps)
    acked = read_acks(a.acks)
    start = (acked[-1] if acked else 0) + 1
    until = a.until or a.steps
    db = rtindex.open(a.dir, **OPEN_OPTIONS)
    try:
        coll = db.create_collection(COLLECTION, shards=a.shards, exist_ok=True)
        with open(a.acks, "a") as log:
            log.write(f"ready {os.getpid()}\n")
            log.flush()
            if a.go:
                while not os.path.exists(a.go):
                    time.sleep(0.005)
            for k in range(start, until + 1):
                step = steps[k - 1]
                log.write(f"b{k}\n")  # begun: a kill -9 from here to the ack is mid-batch
                log.flush()
                if step[0] == "ingest":
                    coll.ingest(step[1], batch_size=10_000)  # one call, one batch per shard
                elif step[0] == "delete":
                    coll.delete(step[1])
                else:
                    coll.patch(step[1], [{"op": "replace", "path": "/v", "value": step[2]},
                                         {"op": "replace", "path": "/g", "value": step[2] % 7}])
                log.write(f"{k}\n")
                log.flush()
                if a.delay_ms:
                    time.sleep(a.delay_ms / 1000)
            log.write("done\n")
            log.flush()
    finally:
        db.close()
    return 0


# ---------------------------------------------------------------------- reader
def read_collection(db, via: str) -> list[tuple]:
    """Every (_id, v) of the collection, by snapshot or by SQL."""
    if via == "sql":
        # _id holds ints and strings: SQL returns such a column as text (docs/sql.md), and our
        # string ids start with "s", so a string of digits is an int _id
        return [(int(r["_id"]) if isinstance(r["_id"], str) and r["_id"].isdigit() else r["_id"], r["v"])
                for r in db.sql(f"SELECT _id, v FROM {COLLECTION}").rows()]
    s = db[COLLECTION].snapshot()
    docs = s.fetch(s.all(), copy=False)
    if any(d is None for d in docs):
        raise AssertionError(f"snapshot fetch returned None for {sum(d is None for d in docs)} of "
                             f"{len(docs)} rows")
    return [(d["_id"], d["v"]) for d in docs]


def open_reader(path: str, timeout: float):
    import rtindex
    from rtindex.errors import NotADatabaseError, NotFoundError

    deadline = time.monotonic() + timeout
    db = None
    while True:
        try:
            if db is None:
                db = rtindex.open(path, role="reader")
            db[COLLECTION]
            return db
        except (NotFoundError, NotADatabaseError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def reader_main(a: argparse.Namespace) -> int:
    known = None
    if a.steps:
        known = {d for d, _, _ in model_digests(build_steps(a.seed, a.steps), a.shards)}
    out = open(a.out, "ab")  # noqa: SIM115 - open for the whole loop, closed at the end

    def emit(rec: dict) -> None:
        out.write(orjson.dumps(rec) + b"\n")
        out.flush()

    db = open_reader(a.dir, 30.0)
    i = 0
    if a.hang_dump:  # every thread's stack on stderr every N seconds (a stuck reader)
        faulthandler.dump_traceback_later(a.hang_dump, repeat=True)

    def one_read(final: bool = False) -> None:
        nonlocal i
        via = "sql" if i % 2 else "snapshot"
        t = time.time()
        rec: dict = {"i": i, "t": t, "via": via}
        try:
            items = read_collection(db, via)
            d, per = digest(items, a.shards)
            rec.update(n=len(items), d=d, sd=per)
            if known is not None and d not in known:
                rec["docs"] = sorted(items, key=repr)
        except Exception:  # noqa: BLE001 - recorded: the test fails on it
            rec["err"] = traceback.format_exc()
        if final:
            rec["final"] = True
        rec["t1"] = time.time()
        emit(rec)
        i += 1

    one_read()
    emit({"ready": os.getpid(), "seed": a.seed, "steps": a.steps, "shards": a.shards})
    while not os.path.exists(a.stop):
        one_read()
        if i % 100 == 0:
            st = db.stats()
            emit({"stats": {"lag": st.get("lag"), "follow_error": st.get("follow_error"), "shards": [
                [s["next_row_id"], s["documents"], s["lag"]] for s in st["collections"][COLLECTION]["shards"]]}})
        if a.pause_ms:
            time.sleep(a.pause_ms / 1000)
    try:
        db.refresh()
    except Exception:  # noqa: BLE001
        emit({"refresh_err": traceback.format_exc()})
    one_read(final=True)
    st = db.stats()
    emit({"closed": {"lag": st.get("lag"), "follow_error": st.get("follow_error")}})
    faulthandler.dump_traceback_later(10)  # a hang in close(): every thread's stack on stderr
    db.close()
    faulthandler.cancel_dump_traceback_later()
    out.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=("writer", "reader"))
    ap.add_argument("dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--acks")
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--until", type=int, default=0)
    ap.add_argument("--go")
    ap.add_argument("--out")
    ap.add_argument("--stop")
    ap.add_argument("--pause-ms", type=float, default=1.0)
    ap.add_argument("--hang-dump", type=float, default=0.0)
    a = ap.parse_args(argv)
    return writer_main(a) if a.role == "writer" else reader_main(a)


if __name__ == "__main__":
    sys.exit(main())
