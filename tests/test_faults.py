"""Failure atomicity: a storage fault at every storage call.

A *scenario* is a fixed sequence of operations (ingests of new ids and upserts, an ``_id``
twice in one batch, deletes, a patch, flushes) on a database with tiny segments
(``seal_rows=8, merge_factor=2``), so sealing, merging and the clean-up of merged-away
segments ("garbage") all run during it; the expected content is a plain dict ``_id -> doc``.

A dry run (tests/faults.py, nothing fails) counts the storage calls the scenario makes; then,
for each k (all of them under ``-m slow``, a sample of about 60 otherwise, always including
the first and last call of every kind of call), the scenario runs on a fresh database with a
fault at storage call k. The rules checked:

* An operation that raises must raise ``StorageError`` (never ``CorruptionError``, never a
  raw ``OSError``), and only because the fault hit one of its own storage calls (a failure
  of background work never surfaces on the operation that triggered it; ``flush()`` alone
  may report a background failure). It leaves no trace: not in ``get``, not in ``len``,
  not later (checked right after, and at the end, live and after a reopen).
* An operation that returns is applied to the model and its result checked.
* After the fault is gone (transient: it fires once; sticky: it lasts for three more
  operations, then is cleared), operations succeed again *without reopening*, and
  ``flush()`` succeeds within a few seconds (background work is retried).
* Then the collection equals the model: ``len``, ``get`` of every id ever used (deleted
  ones give None), ``SELECT _id, v ... ORDER BY _id``, term lookups through a snapshot;
  and again after close and reopen.

With ``shards=2`` a failed ingest may have stored the part of the batch of a shard written
before the failure: per shard, all of a failed call's documents or none.

Failures are collected over all k and reported together: ``k``, the call that failed
(``#k Store.write [MainThread]``) and what went wrong.
"""

from __future__ import annotations

import inspect
import itertools
import re
import sys
import threading
import time
from pathlib import Path

import jsonpatch
import pytest

import rtindex
from rtindex import documents
from rtindex.errors import CorruptionError, NotFoundError, StorageError
from tests.reliability import record

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults import Call, Fault, inject  # noqa: E402

sys.path.remove(str(Path(__file__).resolve().parent))

ET = 1_700_000_000_000_000
VALUES = (0, 1, 2, 3)  # the values of "v": each is looked up as a term
STICKY_OPS = 3  # a sticky fault lasts for this many operations after it first fires
FLUSH_DEADLINE = 10.0  # seconds for flush() to succeed once the cause is gone (retries have backoff)
BLOCKED = 20.0  # seconds an operation may take while a sticky fault lasts before it counts as blocked
SAMPLE = 60  # k values per variant in the default run


class Violation(AssertionError):
    pass


def open_options(**over) -> dict:
    """Tiny segments so that seal, merge and garbage happen in a short scenario; no grace
    period for dropped segments, when the option exists."""
    params = set(inspect.signature(rtindex.open).parameters) | set(inspect.signature(rtindex.Database).parameters)
    opts = {"seal_rows": 8, "merge_factor": 2}
    if "reader_grace_seconds" in params:
        opts["reader_grace_seconds"] = 0
    opts.update(over)
    return opts


# ---------------------------------------------------------------------------- the scenarios

def make_doc(i: int, g: int) -> dict:
    """Document ``d<i>``, version ``g`` (every version written is distinct)."""
    return {"_id": f"d{i:03d}", "v": (i + g) % 4, "g": g, "p": {"q": g % 5, "s": f"w{i % 3}"},
            "tags": [f"t{g % 3}", i], "_event_time": ET + g}


def _ingest(g, *ids):
    return ("ingest", [make_doc(i, next(g)) for i in ids])


def scenario_ops() -> list[tuple]:
    g = itertools.count(1)
    return [
        _ingest(g, *range(0, 6)),  # new documents
        _ingest(g, 1, 3, 6, 7),  # upserts and new ones: the in-memory segment passes seal_rows
        ("delete", "d000"),
        _ingest(g, *range(8, 14), 9),  # d009 twice in one call: the later version is stored
        ("patch", "d002", [{"op": "replace", "path": "/v", "value": 3},
                           {"op": "add", "path": "/p/r", "value": "patched"}]),
        _ingest(g, 4, 5, 6, 7, 8, 14, 15),  # a second seal, a merge
        ("delete", "d005"),
        ("delete", "nope"),  # not there: False
        ("flush",),
        _ingest(g, *range(0, 14)),  # upserts over sealed segments (d000 again): deletes, merges, garbage
        ("delete", "d010"),
        _ingest(g, 20, 21),
        ("flush",),
    ]


def after_ops() -> list[tuple]:
    """Run once the fault is gone: every one must succeed, without reopening."""
    g = itertools.count(1000)
    return [
        _ingest(g, 16, 17, 18, 1),
        ("delete", "d002"),
        _ingest(g, 3, 19, 20),
        ("flush",),
    ]


def all_ids() -> set:
    ids = {"nope"}
    for op in scenario_ops() + after_ops():
        if op[0] == "ingest":
            ids.update(d["_id"] for d in op[1])
        else:
            ids.add(op[1]) if len(op) > 1 else None
    return ids


def describe(op: tuple) -> str:
    if op[0] == "ingest":
        return f"ingest({[d['_id'] for d in op[1]]})"
    return f"{op[0]}({op[1]!r})" if len(op) > 1 else f"{op[0]}()"


# ---------------------------------------------------------------------------- one run

class Run:
    """The scenario on a fresh database at ``path`` with ``fault`` installed, against a model."""

    def __init__(self, path: str, shards: int):
        self.path = path
        self.shards = shards
        self.fault: Fault | None = None  # installed by run_with_fault
        self.model: dict = {}
        self.db = rtindex.open(path, **open_options())
        self.coll = self.db.create_collection("c", shards=shards)
        self.deferred: list[tuple] = []  # failed ops to check for traces once the fault is cleared
        self.flush_errors: list[str] = []  # StorageErrors flush() reported (allowed, noted)

    def close(self) -> None:
        try:
            self.db.close()
        except Exception:
            pass

    # -- operations
    def apply(self, op: tuple) -> None:
        """Run ``op``; on success check its result and apply it to the model."""
        coll, kind = self.coll, op[0]
        if kind == "ingest":
            docs = op[1]
            stats = coll.ingest(docs)
            distinct = list(dict.fromkeys(d["_id"] for d in docs))
            if stats.errors or stats.n != len(distinct) or stats.ids != distinct:
                raise Violation(f"{describe(op)} returned {stats!r} ids={stats.ids} errors={stats.errors}")
            for d in docs:
                self.model[d["_id"]] = d
        elif kind == "delete":
            existed = coll.delete(op[1])
            if existed != (op[1] in self.model):
                raise Violation(f"{describe(op)} returned {existed}, expected {op[1] in self.model}")
            self.model.pop(op[1], None)
        elif kind == "patch":
            _, doc_id, patch = op
            if doc_id not in self.model:
                try:
                    coll.patch(doc_id, patch)
                except NotFoundError:
                    return
                raise Violation(f"{describe(op)} of a document that is not there did not raise NotFoundError")
            want = jsonpatch.apply_patch(self.model[doc_id], patch)
            got = coll.patch(doc_id, patch)
            if got != want:
                raise Violation(f"{describe(op)} returned {got}, expected {want}")
            self.model[doc_id] = got
        elif kind == "flush":
            coll.flush()
        else:
            raise ValueError(kind)

    def step(self, op: tuple) -> bool:
        """Run one operation under the rules (module docstring); True if it succeeded."""
        f = self.fault
        fired_before = len(f.fired)
        watchdog = None
        blocked = []
        if f.sticky and not f.cleared:
            def unblock():
                blocked.append(True)
                f.clear()
            watchdog = threading.Timer(BLOCKED, unblock)
            watchdog.start()
        try:
            self.apply(op)
            return True
        except StorageError as e:
            err = e
        except Violation:
            raise
        except BaseException as e:
            raise Violation(f"{describe(op)} raised {type(e).__name__}: {e} (only StorageError may reach the caller)") from e
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if blocked:
                raise Violation(f"{describe(op)} blocked for {BLOCKED:.0f} s while the storage fault lasted "
                                "(it should fail with StorageError or go on)")
        # it raised StorageError: allowed only if the fault explains it
        if isinstance(err, CorruptionError):
            raise Violation(f"{describe(op)} raised {type(err).__name__}: {err}") from err
        own = [c for c in f.fired[fired_before:] if c.main]
        background = [c for c in f.fired if not c.main]
        lasting = f.sticky and f.fired and not f.cleared
        if not (own or lasting or (op[0] == "flush" and background)):
            why = ("background work failed (that must be retried, not reported here)" if background and not
                   [c for c in f.fired if c.main] else "the fault was gone")
            raise Violation(f"{describe(op)} raised {type(err).__name__}: {err}; but none of its own storage "
                            f"calls failed: {why} (fault fired at: {[str(c) for c in f.fired[:4]]}): the shard "
                            "must keep working once the cause is gone, without a reopen") from err
        if op[0] == "flush":
            self.flush_errors.append(str(err))
        if f.active:
            self.deferred.append(op)  # cannot read while the storage fails
        else:
            self.check_no_trace(op)
        return False

    def check_no_trace(self, op: tuple) -> None:
        """A failed operation changed nothing (with shards > 1, a failed ingest changed
        nothing or everything in each shard: what landed is applied to the model)."""
        kind = op[0]
        if kind == "ingest":
            last = {d["_id"]: d for d in op[1]}
            groups: dict[int, list] = {}
            for doc_id in last:
                groups.setdefault(documents.shard_of(documents.encode_id(doc_id), self.shards), []).append(doc_id)
            for shard, ids in sorted(groups.items()):
                got = {i: self.coll.get(i) for i in ids}
                old = [i for i in ids if got[i] == self.model.get(i)]
                new = [i for i in ids if got[i] == last[i]]
                if self.shards > 1 and len(new) == len(ids):
                    for i in ids:
                        self.model[i] = last[i]
                    continue
                if len(old) != len(ids):
                    what = "some of" if self.shards > 1 else "a trace of"
                    raise Violation(f"failed {describe(op)} left {what} its documents in shard {shard}: "
                                    f"{ {i: got[i] for i in ids if i not in old} } (model: "
                                    f"{ {i: self.model.get(i) for i in ids if i not in old} })")
        elif kind in ("delete", "patch"):
            got = self.coll.get(op[1])
            if got != self.model.get(op[1]):
                raise Violation(f"failed {describe(op)} changed the document: {got} (model: {self.model.get(op[1])})")
        n = len(self.coll)
        if n != len(self.model):
            raise Violation(f"after failed {describe(op)}: len() is {n}, the model has {len(self.model)}")

    def flush_until_ok(self) -> None:
        deadline = time.monotonic() + FLUSH_DEADLINE
        while True:
            try:
                self.coll.flush()
                return
            except StorageError as e:
                if isinstance(e, CorruptionError) or time.monotonic() > deadline:
                    raise Violation(f"flush() still raises {type(e).__name__} {FLUSH_DEADLINE:.0f} s after the "
                                    f"cause is gone: {e}") from e
                self.flush_errors.append(str(e))
                time.sleep(0.05)

    # -- the whole run
    def run(self, sticky_ops: int = STICKY_OPS) -> None:
        f = self.fault
        ops_since_fired = 0
        for op in scenario_ops():
            self.step(op)
            if f.fired:
                ops_since_fired += 1
                if f.sticky and not f.cleared and ops_since_fired >= sticky_ops:
                    self.clear_fault()
        self.n_scenario_calls = len(f.calls)
        self.clear_fault()
        for op in after_ops():
            if op[0] == "flush":
                self.flush_until_ok()
                continue
            if not self.step(op):
                raise Violation(f"{describe(op)} failed after the fault was cleared (must succeed without reopen)")

    def clear_fault(self) -> None:
        self.fault.clear()
        for op in self.deferred:
            self.check_no_trace(op)
        self.deferred = []

    def check(self, where: str) -> None:
        problems = check_collection(self.db, self.coll, self.model)
        if problems:
            raise Violation(f"{where}: " + "; ".join(problems[:6]) + (f" (+{len(problems) - 6} more)" if len(problems) > 6 else ""))

    def reopen(self) -> None:
        try:
            self.db.close()
        except Exception as e:
            raise Violation(f"close() raised {type(e).__name__}: {e}") from e
        self.db = rtindex.open(self.path, **open_options())
        self.coll = self.db["c"]


def check_collection(db, coll, model: dict) -> list[str]:
    """Differences between the collection and the model, by every read path."""
    problems: list[str] = []
    for name, check in (("len/get", _check_get), ("SQL", _check_sql), ("snapshot", _check_snapshot)):
        try:
            check(db, coll, model, problems)
        except Exception as e:
            problems.append(f"{name} raised {type(e).__name__}: {e}")
    return problems


def _check_get(db, coll, model: dict, problems: list[str]) -> None:
    n = len(coll)
    if n != len(model):
        problems.append(f"len() is {n}, the model has {len(model)}")
    for doc_id in sorted(all_ids()):
        got = coll.get(doc_id)
        if got != model.get(doc_id):
            problems.append(f"get({doc_id!r}) is {got}, the model has {model.get(doc_id)}")


def _check_sql(db, coll, model: dict, problems: list[str]) -> None:
    rows = db.sql("SELECT _id, v FROM c ORDER BY _id").rows()
    want = [{"_id": i, "v": model[i]["v"]} for i in sorted(model)]
    if rows != want:
        problems.append(f"SELECT _id, v FROM c ORDER BY _id gave {rows}, the model has {want}")


def _check_snapshot(db, coll, model: dict, problems: list[str]) -> None:
    snap = coll.snapshot()
    if snap.count() != len(model):
        problems.append(f"snapshot count is {snap.count()}, the model has {len(model)}")
    for x in VALUES:
        got = sorted(snap.fetch(snap.term("v", x)), key=lambda d: d["_id"])
        want_docs = sorted((d for d in model.values() if d["v"] == x), key=lambda d: d["_id"])
        if got != want_docs:
            problems.append(f"term v={x} found {[d['_id'] for d in got]} "
                            f"(versions {[d['g'] for d in got]}), the model has "
                            f"{[d['_id'] for d in want_docs]} (versions {[d['g'] for d in want_docs]})")


def run_with_fault(path: str, shards: int, out: list | None = None, **fault_options) -> tuple[Run, Fault]:
    """On a fresh database (opened before the fault is installed): the scenario with the
    fault (``inject(**fault_options)``, also appended to ``out``), the operations after it,
    the checks live and after a reopen."""
    r = Run(path, shards)
    try:
        with inject(**fault_options) as fault:
            if out is not None:
                out.append(fault)
            r.fault = fault
            r.run()
            r.check("live")
            r.reopen()
            r.check("after reopen")
    finally:
        r.close()
    return r, fault


# ---------------------------------------------------------------------------- the loops

def dry_run(tmp_path: Path, shards: int) -> list[Call]:
    r, dry = run_with_fault(str(tmp_path / "dry"), shards)
    calls = dry.calls[: r.n_scenario_calls]
    assert calls, "the scenario made no storage call: the fault wrapper patched nothing?"
    assert any(not c.main for c in calls), "no storage call from a background thread: nothing was sealed or merged"
    return calls


def pick_ks(calls: list[Call], limit: int | None) -> list[int]:
    """Every k, or about ``limit``: the first and last 3, the first and last call of every
    (name, main thread or not), and evenly spaced ones."""
    n = len(calls)
    if limit is None or n <= limit:
        return list(range(1, n + 1))
    ks = set(range(1, 4)) | set(range(n - 2, n + 1))
    by_kind: dict[tuple, list[int]] = {}
    for c in calls:
        by_kind.setdefault((c.name, c.main), []).append(c.k)
    for k_list in by_kind.values():
        ks.update((k_list[0], k_list[-1]))
    room = max(limit - len(ks), 0)
    ks.update(1 + round(i * (n - 1) / max(room - 1, 1)) for i in range(room))
    return sorted(ks)


def fault_loop(tmp_path: Path, shards: int, sticky: bool, limit: int | None, test: str) -> None:
    calls = dry_run(tmp_path, shards)
    ks = pick_ks(calls, limit)
    failures = []
    t0 = time.monotonic()
    for k in ks:
        out: list[Fault] = []
        try:
            run_with_fault(str(tmp_path / f"k{k}"), shards, out, at=k, sticky=sticky)
        except Violation as e:
            failures.append((k, out[0].fired[:1] if out else [], str(e)))
        except Exception as e:  # a read or a reopen that failed, ...
            failures.append((k, out[0].fired[:1] if out else [], f"unexpected {type(e).__name__}: {e}"))
    record(test, f"{'sticky' if sticky else 'transient'} storage fault at one call of a scenario "
                 f"({shards} shard{'s' if shards > 1 else ''}): nothing acknowledged lost, nothing half "
                 "written, the shard keeps working", len(ks), "fault points", len(failures), storage_calls=len(calls))
    if failures:
        by_site: dict[str, int] = {}
        for _, fired, _ in failures:
            site = fired[0].name + (" (main)" if fired[0].main else " (background)") if fired else "(not fired)"
            by_site[site] = by_site.get(site, 0) + 1
        lines = [f"  k={k} {fired[0] if fired else '(fault did not fire)'}: {msg[:400]}" for k, fired, msg in failures[:25]]
        pytest.fail(f"{len(failures)} of {len(ks)} fault points failed ({len(calls)} storage calls in the scenario, "
                    f"{time.monotonic() - t0:.1f} s; {'sticky' if sticky else 'transient'} fault, shards={shards}).\n"
                    f"by call site: {by_site}\n" + "\n".join(lines), pytrace=False)


@pytest.mark.timeout(300)
def test_fault_at_sampled_storage_calls(tmp_path, request):
    fault_loop(tmp_path, shards=1, sticky=False, limit=SAMPLE, test=request.node.nodeid)


@pytest.mark.timeout(300)
def test_sticky_fault_at_sampled_storage_calls(tmp_path, request):
    """A disk that stays full for three operations, then space is freed."""
    fault_loop(tmp_path, shards=1, sticky=True, limit=SAMPLE // 2, test=request.node.nodeid)


@pytest.mark.timeout(300)
def test_fault_at_sampled_storage_calls_two_shards(tmp_path, request):
    fault_loop(tmp_path, shards=2, sticky=False, limit=SAMPLE // 2, test=request.node.nodeid)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("shards,sticky", [(1, False), (1, True), (2, False)],
                         ids=["transient", "sticky", "transient-2-shards"])
def test_fault_at_every_storage_call(tmp_path, shards, sticky, request):
    fault_loop(tmp_path, shards=shards, sticky=sticky, limit=None, test=request.node.nodeid)


# ---------------------------------------------------------------------------- focused tests

def _names_shard(message: str, shard: int) -> bool:
    return re.search(rf"shard[\s_#-]*0*{shard}\b", message) is not None


@pytest.mark.timeout(120)
def test_failed_write_names_shard_and_cause_and_shard_keeps_working(tmp_path):
    """A fault at each storage call of one ingest (and one delete): StorageError naming the
    shard and the cause, no trace, and the very next write succeeds (no reopen)."""
    db = rtindex.open(str(tmp_path / "db"), **open_options())
    try:
        coll = db.create_collection("c", shards=2)
        model = {}
        seq = itertools.count()

        def fresh(n):
            return [make_doc(100 + next(seq), 7) for _ in range(n)]

        coll.ingest(base := fresh(3))
        model.update({d["_id"]: d for d in base})
        problems = []
        wedged = False
        for kind in ("ingest", "delete"):
            if wedged:
                break
            target = base[0]["_id"]
            with inject() as dry:
                if kind == "ingest":
                    coll.ingest(probe := fresh(1))
                    model[probe[0]["_id"]] = probe[0]
                else:
                    coll.delete(target)
            if kind == "delete":
                coll.ingest([model[target]])  # put it back
            n = sum(1 for c in dry.calls if c.main)
            assert n, f"{kind} made no storage call"
            for k in range(1, n + 1):
                doc = fresh(1)[0]
                doc_id = doc["_id"] if kind == "ingest" else target
                shard = documents.shard_of(documents.encode_id(doc_id), 2)
                with inject(at=k, match=lambda c: c.main) as fault:
                    try:
                        coll.ingest([doc]) if kind == "ingest" else coll.delete(doc_id)
                        ok = True
                    except StorageError as e:
                        ok = False
                        msg = str(e)
                        if isinstance(e, CorruptionError) or not _names_shard(msg, shard) or "injected" not in msg:
                            problems.append(f"{kind}, fault at {fault.fired}: {type(e).__name__}({msg!r}) "
                                            f"does not name shard {shard} and the cause")
                    except Exception as e:
                        ok = False
                        problems.append(f"{kind}, fault at {fault.fired}: {type(e).__name__}: {e} (not a StorageError)")
                if ok:
                    if kind == "ingest":
                        model[doc_id] = doc
                    else:
                        model.pop(doc_id)
                if coll.get(doc_id) != model.get(doc_id) or len(coll) != len(model):
                    problems.append(f"{kind}, fault at {fault.fired}: left a trace: get={coll.get(doc_id)} "
                                    f"len={len(coll)} (model {len(model)})")
                try:  # the shard keeps working without a reopen
                    if kind == "delete" and doc_id not in model:
                        coll.ingest([base[0]])
                        model[doc_id] = base[0]
                    coll.ingest(after := fresh(1))
                    model[after[0]["_id"]] = after[0]
                except Exception as e:
                    problems.append(f"{kind}, fault at {fault.fired}: the next ingest raised "
                                    f"{type(e).__name__}: {e}")
                    wedged = True
                    break
        assert not problems, "\n".join(problems)
    finally:
        try:
            db.close()
        except Exception:
            pass


@pytest.mark.timeout(120)
def test_background_failure_is_retried_not_wedging_the_shard(tmp_path):
    """Every storage call of background work (seal, merge, garbage) fails until cleared:
    ingest and reads go on; flush() raises StorageError while it lasts; once cleared,
    flush() succeeds and nothing is lost or half there, live and after reopen."""
    path = str(tmp_path / "db")
    db = rtindex.open(path, **open_options())
    model = {}
    try:
        coll = db.create_collection("c", shards=1)
        with inject(at=1, sticky=True, match=lambda c: not c.main) as fault:
            g = itertools.count(1)
            problems = []
            for i, batch in enumerate((range(0, 6), range(6, 12), range(3, 9), range(12, 15), range(1, 4))):
                if i == 2:  # the first seal has been handed to the background: let it fail
                    deadline = time.monotonic() + 10
                    while not fault.fired and time.monotonic() < deadline:
                        time.sleep(0.01)
                    assert fault.fired, "no background storage call was made: nothing to test"
                    time.sleep(0.2)  # and let its error be recorded
                docs = [make_doc(i, next(g)) for i in batch]
                try:
                    coll.ingest(docs)
                    model.update({d["_id"]: d for d in docs})
                except Exception as e:
                    problems.append(f"ingest #{i} while background work fails raised {type(e).__name__}: {e} "
                                    f"(background failures are retried; they must not wedge the shard)")
                    break
            if not problems:
                problems += [f"while background work fails: {p}" for p in check_collection(db, coll, model)]
                result = []
                t = threading.Thread(target=lambda: result.append(_outcome(coll.flush)), daemon=True)
                t.start()
                t.join(30)
                if t.is_alive():
                    problems.append("flush() blocked for 30 s while background work kept failing "
                                    "(it should raise StorageError)")
                elif not isinstance(result[0], StorageError) or isinstance(result[0], CorruptionError):
                    problems.append(f"flush() while background work fails gave {result[0]!r}, not StorageError")
            fault.clear()
            if problems:
                pytest.fail("\n".join(problems), pytrace=False)
            deadline = time.monotonic() + FLUSH_DEADLINE
            while True:
                try:
                    coll.flush()
                    break
                except StorageError as e:
                    if time.monotonic() > deadline:
                        pytest.fail(f"flush() still raises {FLUSH_DEADLINE:.0f} s after the cause is gone: {e!r}")
                    time.sleep(0.05)
            docs = [make_doc(i, next(g)) for i in range(15, 20)]
            coll.ingest(docs)
            model.update({d["_id"]: d for d in docs})
            coll.flush()
        problems = check_collection(db, coll, model)
        assert not problems, problems
        db.close()
        db = rtindex.open(path, **open_options())
        problems = check_collection(db, db["c"], model)
        assert not problems, f"after reopen: {problems}"
    finally:
        try:
            db.close()
        except Exception:
            pass


def _outcome(fn):
    try:
        fn()
        return "returned"
    except BaseException as e:
        return e
