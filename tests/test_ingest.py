"""ingesting: the interpreter settings ingest runs under, and that they are undone."""

from __future__ import annotations

import gc
import sys
import threading

import pytest

from rtindex import ingesting


def test_ingest_runs_with_the_collector_paused_and_short_switches_then_restores(db):
    c = db.create_collection("c")
    seen = []

    def docs():
        for i in range(3):
            seen.append((gc.isenabled(), sys.getswitchinterval()))
            yield {"_id": i}

    before = (gc.isenabled(), sys.getswitchinterval())
    c.ingest(docs())
    assert seen == [(False, ingesting.SWITCH_INTERVAL)] * 3
    assert (gc.isenabled(), sys.getswitchinterval()) == before

    def broken():
        yield {"_id": 9}
        raise RuntimeError("the caller's generator fails")

    with pytest.raises(RuntimeError):
        c.ingest(broken())
    assert (gc.isenabled(), sys.getswitchinterval()) == before


def test_a_collector_the_caller_turned_off_stays_off():
    gc.disable()
    try:
        with ingesting.ingest_mode():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_settings_hold_until_the_last_of_several_threads_leaves():
    before = sys.getswitchinterval()
    first_in, second_out = threading.Event(), threading.Event()
    states = []

    def other():
        with ingesting.ingest_mode():
            first_in.set()
            second_out.wait(5)
            states.append((gc.isenabled(), sys.getswitchinterval()))

    t = threading.Thread(target=other)
    t.start()
    first_in.wait(5)
    with ingesting.ingest_mode():
        pass
    second_out.set()  # this thread left first: the other one still ingests
    t.join(5)
    assert states == [(False, ingesting.SWITCH_INTERVAL)]
    assert gc.isenabled() and sys.getswitchinterval() == before
