"""notify: what a writer publishes to readers through shared memory (a shard's signal, the
database's wake-up word), compiled and reference, and a wake-up across processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import pytest

from rtindex._py import notify as py_notify

try:
    from rtindex._ext import _notify as cy_notify
except ImportError:  # pragma: no cover - depends on the build
    if os.environ.get("RTINDEX_PURE_PYTHON") != "1":
        raise
    cy_notify = None

IMPLS = [pytest.param(py_notify, id="python"),
         pytest.param(cy_notify, id="cython", marks=pytest.mark.skipif(cy_notify is None, reason="not built"))]


@pytest.mark.parametrize("impl", IMPLS)
def test_a_watch_reads_what_the_signal_published(impl, tmp_path):
    path = str(tmp_path / "signal")
    watch = impl.Watch(path)
    assert watch.read() is None  # no file yet
    sig = impl.Signal(path, 7)
    assert watch.read() is None  # nothing published yet
    t0 = time.time()
    sig.bump(100, 3, 5, [(0, 11), (90, 12)])
    count, next_row, at, gen, log_seq, epoch, tails = watch.read()
    assert (count, next_row, gen, log_seq, epoch, tails) == (1, 100, 3, 5, 7, ((0, 11), (90, 12)))
    assert t0 - 1 <= at <= time.time() + 1
    sig.bump(120, 3, 6, [(90, 12)])
    assert watch.read()[:2] == (2, 120) and watch.read()[6] == ((90, 12),)
    assert sig.count == 2
    sig.close()
    again = impl.Signal(path, 8)  # a new writer goes on counting
    assert again.count == 2
    again.bump(120, 4, 6, [])
    assert watch.read()[0] == 3 and watch.read()[5] == 8 and watch.read()[6] == ()
    with pytest.raises(ValueError, match="at most"):
        again.bump(1, 1, 1, [(i, i) for i in range(impl.MAX_SEGMENTS + 1)])
    again.close()
    watch.close()


@pytest.mark.skipif(cy_notify is None, reason="not built")
@pytest.mark.parametrize("impl", IMPLS)
def test_a_writer_killed_mid_update_leaves_the_last_state_readable(impl, tmp_path):
    """A writer killed while publishing leaves the sequence odd: readers get the last state
    they read (waiting a little the first time, not at all after), until a successor publishes."""
    path = str(tmp_path / "signal")
    watch = impl.Watch(path)
    impl.Signal(path, 7).bump(100, 3, 5, [(0, 11)])
    before = watch.read()
    with open(path, "r+b") as f:  # what a kill in the middle of bump() leaves
        seq = int.from_bytes(f.read(8), "little")
        f.seek(0)
        f.write((seq + 1).to_bytes(8, "little"))
    t0 = time.perf_counter()
    assert watch.read() == before
    assert time.perf_counter() - t0 < 0.1
    t0 = time.perf_counter()
    for _ in range(100):
        assert watch.read() == before
    assert time.perf_counter() - t0 < 0.05  # known stuck: no more waiting
    successor = impl.Signal(path, 8)
    successor.bump(150, 4, 5, [(100, 12)])
    assert watch.read()[1:2] == (150,) and watch.read()[5] == 8


def test_a_watch_never_sees_half_an_update(tmp_path):
    """A reader thread reads while a writer bumps as fast as it can: every read is whole
    (the fields of one bump belong together)."""
    path = str(tmp_path / "signal")
    sig = cy_notify.Signal(path, 1)
    watch = cy_notify.Watch(path)
    stop = threading.Event()
    bad = []

    def read():
        while not stop.is_set():
            got = watch.read()
            if got is None:
                continue
            count, next_row, _, gen, log_seq, _, tails = got
            if not (next_row == gen * 10 == log_seq * 100 and tails == ((next_row, count),)):
                bad.append(got)

    t = threading.Thread(target=read)
    t.start()
    for i in range(1, 20000):
        sig.bump(i * 100, i * 10, i, [(i * 100, sig.count + 1)])
    stop.set()
    t.join()
    assert not bad, bad[:3]


@pytest.mark.parametrize("impl", IMPLS)
def test_the_wake_word(impl, tmp_path):
    path = str(tmp_path / "wake")
    reader = impl.Wake(path, False)
    assert reader.value == 0  # no file yet: polls
    writer = impl.Wake(path, True)
    seen = reader.value
    writer.ring()
    assert reader.value == seen + 1
    t0 = time.monotonic()
    reader.wait(seen, 5.0)  # moved already: returns at once
    assert time.monotonic() - t0 < 1.0
    reader.close()
    writer.close()


def _ring_later(path: str, delay: float, q) -> None:
    w = cy_notify.Wake(path, True)
    time.sleep(delay)
    q.put(time.monotonic())
    w.ring()
    w.close()


@pytest.mark.skipif(cy_notify is None or not cy_notify.HAVE_FUTEX, reason="futex: Linux only")
def test_a_ring_in_another_process_wakes_a_waiter_at_once(tmp_path):
    path = str(tmp_path / "wake")
    cy_notify.Wake(path, True).close()  # the file exists
    waiter = cy_notify.Wake(path, False)
    seen = waiter.value
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_ring_later, args=(path, 1.0, q))
    p.start()
    waiter.wait(seen, 30.0)  # a long timeout: only the ring ends it early
    woke = time.monotonic()
    rang = q.get(timeout=30)
    p.join(30)
    assert waiter.value == seen + 1
    assert woke - rang < 0.5, f"woke {woke - rang:.3f} s after the ring"
    waiter.close()


@pytest.mark.skipif(cy_notify is None or not cy_notify.HAVE_FUTEX, reason="futex: Linux only")
def test_a_wait_times_out(tmp_path):
    path = str(tmp_path / "wake")
    w = cy_notify.Wake(path, True)
    t0 = time.monotonic()
    w.wait(w.value, 0.2)
    assert 0.15 <= time.monotonic() - t0 < 5
    w.close()
