"""Time limits of queries in a running ``rtindex serve``: a query past its timeout_ms stops (its
CPU and its query slot are free again, the next queries are admitted), queries whose work
could not be interrupted are refused or stopped, and the service stops in seconds while
queries run."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import psutil
import pytest

from rtindex.server.query_app import RUNAWAY_EXIT, RUNAWAY_SECONDS
from tests.serving import Served

CROSS = "SELECT COUNT(*) AS n FROM c a1, c a2, c a3, c a4, c a5, c a6"  # 200**6 rows: never ends by itself
FAST = "SELECT COUNT(*) AS n FROM c"
PATTERN = "(a|b)*a(a|b){20}$"  # a regular expression that scans all of a long text
IDLE_CORES = 0.3  # what an idle query process uses is far below this; a query left running, a core or more


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A service of 2 query slots and 4 queued, with collection ``c``: 200 documents."""
    s = Served(str(tmp_path_factory.mktemp("timeouts") / "db"), "--max-concurrent-queries", "2",
               "--max-queued-queries", "4")
    try:
        with s.client() as c:
            c.post("/v1/collections", json={"name": "c", "shards": 2})
            fence = c.post("/v1/collections/c/docs", json=[{"_id": i, "k": i % 7, "pat": PATTERN + "|x" * (i % 5)}
                                                           for i in range(200)]).json()["fence"]
            r = c.post("/v1/query", json={"sql": FAST, "min_fence": fence})
            assert r.json()["rows"] == [{"n": 200}], r.text
        yield s
    finally:
        assert s.stop() == 0, "".join(s.output)


def _query_process(s: Served) -> psutil.Process:
    return psutil.Process(s.children()["query"][0])


def _cores_used(proc: psutil.Process, seconds: float) -> float:
    """The CPU ``proc`` uses over the next ``seconds`` (every thread), in cores."""
    def cpu() -> float:
        t = proc.cpu_times()
        return t.user + t.system
    c0, t0 = cpu(), time.monotonic()
    time.sleep(seconds)
    return (cpu() - c0) / (time.monotonic() - t0)


def _flood(s: Served, sql: str, timeout_ms: int, clients: int, per_client: int) -> tuple[Counter, float]:
    """``clients`` threads each sending ``sql`` ``per_client`` times: the statuses, and the
    monotonic time the last reply came."""
    statuses: Counter = Counter()
    last = [0.0]
    lock = threading.Lock()

    def client() -> None:
        with s.client() as c:
            for _ in range(per_client):
                status = c.post("/v1/query", json={"sql": sql, "timeout_ms": timeout_ms}).status_code
                with lock:
                    statuses[status] += 1
                    last[0] = max(last[0], time.monotonic())
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return statuses, last[0]


def _answers_at_once(s: Served, after: float) -> None:
    """A fast query is answered 200 right after ``after``, and the query process is idle."""
    with s.client() as c:
        r = c.post("/v1/query", json={"sql": FAST})
        assert r.status_code == 200 and r.json()["rows"] == [{"n": 200}], r.text
        assert time.monotonic() - after < 3.0  # admitted at once: no slot is held by a stopped query
        assert c.get("/healthz").status_code == 200
    time.sleep(max(0.0, after + 0.1 - time.monotonic()))
    assert _cores_used(_query_process(s), 0.5) < IDLE_CORES


def test_a_flood_of_timed_out_queries_leaves_slots_and_cpu_free(served):
    statuses, last = _flood(served, CROSS, 300, clients=8, per_client=3)
    assert set(statuses) <= {408, 429} and statuses[408] >= 6, statuses
    _answers_at_once(served, last)


REFUSED = [  # (sql, what the 400 says): each would make one huge value, which no interrupt stops
    ("SELECT length(repeat('x', 2000000000)) AS n FROM c LIMIT 1", "repeat() would make a value of more than"),
    ("SELECT len(range(1000000000)) AS n FROM c LIMIT 1", "range() would make a value of more than"),
    ("SELECT unnest(generate_series(1, 1000000000)) AS n FROM c LIMIT 1", "generate_series() would make"),
    ("SELECT len(generate_series(TIMESTAMP '2000-01-01', TIMESTAMP '2001-01-01', INTERVAL 1 SECOND)) AS n FROM c",
     "generate_series() would make"),
    ("SELECT length(lpad('x', 2000000000, 'y')) AS n FROM c LIMIT 1", "lpad() would make"),
    ("SELECT len(list_resize([1], 1000000000)) AS n FROM c LIMIT 1", "list_resize() would make"),
    ("SELECT len(system.main.range(1000000000)) AS n FROM c LIMIT 1", "not through the system catalog"),
    ("SELECT " + "abs(" * 200 + "k" + ")" * 200 + " AS x FROM c", "more than 32 deep"),
]


@pytest.mark.parametrize("sql,message", REFUSED)
def test_queries_that_could_not_be_stopped_are_refused_at_once(served, sql, message):
    t0 = time.monotonic()
    with served.client() as c:
        r = c.post("/v1/query", json={"sql": sql, "timeout_ms": 1000})
    assert r.status_code == 400 and message in r.json()["message"], r.text
    assert time.monotonic() - t0 < 3.0


def test_what_they_allow_still_runs(served):
    with served.client() as c:
        r = c.post("/v1/query", json={"sql": "SELECT length(repeat('ab', 1000)) AS a, len(range(1, 100000, 2)) AS b, "
                                             "len(generate_series(TIMESTAMP '2000-01-01', TIMESTAMP '2000-01-02', "
                                             "INTERVAL 1 HOUR)) AS c, rpad('a', 3, 'b') AS d FROM c LIMIT 1"})
        assert r.status_code == 200 and r.json()["rows"] == [{"a": 2000, "b": 50000, "c": 25, "d": "abb"}], r.text


def test_a_regular_expression_over_long_texts_stops(served):
    """DuckDB checks for an interrupt between batches of rows: a query whose every row scans
    a long text stops within a batch (its 408 may come first: its slot is held until then),
    then frees its CPU and its slot."""
    sql = "SELECT COUNT(*) AS n FROM c a1, c a2 WHERE regexp_matches(repeat('ab', 500000), a1.pat)"
    statuses, last = _flood(served, sql, 300, clients=2, per_client=1)
    assert statuses == {408: 2}, statuses
    proc = _query_process(served)
    while _cores_used(proc, 0.2) >= IDLE_CORES:
        assert time.monotonic() - last < RUNAWAY_SECONDS, "the batch did not end"
    _answers_at_once(served, time.monotonic())


def test_stopping_the_service_does_not_wait_for_running_queries(tmp_path):
    s = Served(str(tmp_path / "db"))
    with s.client() as c:
        c.post("/v1/collections", json={"name": "c", "shards": 1})
        fence = c.post("/v1/collections/c/docs", json=[{"_id": i} for i in range(200)]).json()["fence"]
        assert c.post("/v1/query", json={"sql": FAST, "min_fence": fence}).status_code == 200
    errors: list[Exception] = []

    def slow() -> None:
        try:
            with s.client(timeout=120) as c:
                c.post("/v1/query", json={"sql": CROSS, "timeout_ms": 120_000})
        except httpx.TransportError as e:  # the connection is closed under it
            errors.append(e)
    threads = [threading.Thread(target=slow) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # running
    t0 = time.monotonic()
    assert s.stop() == 0, "".join(s.output)
    assert time.monotonic() - t0 < 20.0  # not the queries' 120 s
    for t in threads:
        t.join(30)
    assert len(errors) == 3


@pytest.mark.slow
def test_a_long_flood_leaves_the_service_answering(served):
    """Slow queries with short limits from 6 clients for about 20 s, /healthz and fast queries
    answered throughout, and the process idle after."""
    stop = time.monotonic() + 20.0
    fast: list[int] = []

    def prober() -> None:
        with served.client() as c:
            while time.monotonic() < stop:
                fast.append(c.get("/healthz").status_code)
                time.sleep(0.2)
    probe = threading.Thread(target=prober)
    probe.start()
    statuses: Counter = Counter()
    last = 0.0
    while time.monotonic() < stop:
        got, last = _flood(served, CROSS, 200, clients=6, per_client=3)
        statuses.update(got)
    probe.join()
    assert set(statuses) <= {408, 429} and statuses[408] >= 20, statuses
    assert fast and set(fast) == {200}
    _answers_at_once(served, last)


@pytest.mark.slow
def test_a_query_no_interrupt_reaches_restarts_its_process(tmp_path):
    """One batch of 2,000 rows, each scanning an 8 MB text (tens of seconds on a fast core):
    DuckDB cannot stop it within the batch, so the query process exits RUNAWAY_SECONDS
    after the 408 and another takes over."""
    s = Served(str(tmp_path / "db"))
    try:
        with s.client() as c:
            c.post("/v1/collections", json={"name": "r", "shards": 1})
            fence = c.post("/v1/collections/r/docs", json=[{"_id": i, "pat": PATTERN + "|x" * (i % 5)}
                                                           for i in range(2000)]).json()["fence"]
            r = c.post("/v1/query", json={"sql": "SELECT COUNT(*) AS n FROM r", "min_fence": fence})
            assert r.status_code == 200, r.text
            pid = s.children()["query"][0]
            text = " || ".join(["repeat('ab', 500000) || repeat('ba', 500000)"] * 4)  # 8 MB a row
            sql = f"SELECT COUNT(*) AS n FROM r WHERE regexp_matches({text}, pat)"
            t0 = time.monotonic()
            r = c.post("/v1/query", json={"sql": sql, "timeout_ms": 500})
            assert r.status_code == 408, r.text
            while s.children()["query"] in ([], [pid]):
                assert time.monotonic() - t0 < RUNAWAY_SECONDS + 30, "".join(s.output)
                time.sleep(0.1)
            assert time.monotonic() - t0 >= RUNAWAY_SECONDS
            r = c.post("/v1/query", json={"sql": "SELECT COUNT(*) AS n FROM r"}, timeout=120)
            assert r.status_code == 200 and r.json()["rows"] == [{"n": 2000}]
        said = "".join(s.output)
        assert "cannot be interrupted" in said and f"exited (code {RUNAWAY_EXIT})" in said, said
    finally:
        assert s.stop() == 0, "".join(s.output)
