"""Helpers shared by the benchmarks of ``rtindex serve`` (benchmarks/rockbench.py, benchmarks/qps.py).

* :func:`start_server`: a real ``rtindex serve --port 0`` in a subprocess (tests/serving.py's
  ``Served``: URL and admin key parsed from its banner, worker PIDs from /proc).
* :class:`CpuMeter`: CPU time (user + system, all threads) of named processes over a window,
  via psutil, as % of one core.
* Two keep-alive HTTP/1.1 clients with one interface, ``post(path, body) -> (status, bytes)``:
  :class:`RawClient` (``http.client``) and :class:`HttpxClient` (``httpx.Client``);
  :func:`client_cpu_per_request` measures what each costs the calling process.
* :func:`paced_writer`: a process body that POSTs RockBench events at a target MB/s, one
  request per tick (used by rockbench.py as the generator and by qps.py as the background
  writer).
* :func:`summary` (percentiles), :func:`check` (PASS/FAIL lines), :func:`rnd` (JSON rounding).
"""

from __future__ import annotations

import http.client
import sys
import time
import traceback
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.ingest import log  # noqa: E402

MB = 1e6


# ---------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------


def start_server(data: str, *args: str):
    """``rtindex serve --data DATA --port 0 ARGS...``: a ``Served`` (``url``, ``admin_key``,
    ``children()``, ``output``, ``stop()``), the one the tests use."""
    from tests.serving import Served

    return Served(data, *args)


def server_pids(served) -> dict[str, int]:
    """{"supervisor": pid, "ingest": pid, "query": pid, "query2": pid, ...}."""
    out = {"supervisor": served.proc.pid}
    ch = served.children()
    for role in ("ingest", "query"):
        for i, pid in enumerate(sorted(ch.get(role, []))):
            out[role if i == 0 else f"{role}{i + 1}"] = pid
    return out


def server_problems(served) -> list[str]:
    """Lines of the server's output after its banner that look like trouble."""
    words = ("Traceback", "Error", "error", "exited", "restarting", "WARNING", "failed")
    return [ln.rstrip() for ln in served.output if any(w in ln for w in words)][:20]


class CpuMeter:
    """CPU of named processes between ``start()`` and ``stop()``, % of one core."""

    def __init__(self, pids: dict[str, int]):
        import psutil

        self.procs = {}
        for name, pid in pids.items():
            try:
                self.procs[name] = psutil.Process(pid)
            except psutil.Error:
                pass
        self.t0 = 0.0
        self.c0: dict[str, float] = {}

    def _cpu(self) -> dict[str, float]:
        import psutil

        out = {}
        for name, p in self.procs.items():
            try:
                c = p.cpu_times()
                out[name] = c.user + c.system
            except psutil.Error:
                pass
        return out

    def start(self) -> "CpuMeter":
        import psutil

        psutil.cpu_percent(None)
        self.t0, self.c0 = time.perf_counter(), self._cpu()
        return self

    def stop(self) -> dict[str, float]:
        """% of one core per process, and ``machine``: every process of the machine (ours
        and anyone else's) in % of one core, out of ``psutil.cpu_count() * 100``."""
        import psutil

        wall = time.perf_counter() - self.t0
        c1 = self._cpu()
        out = {name: (c1[name] - self.c0[name]) / wall * 100 for name in c1 if name in self.c0 and wall > 0}
        out["machine"] = psutil.cpu_percent(None) * (psutil.cpu_count() or 1)
        return out


# ---------------------------------------------------------------------------
# HTTP clients
# ---------------------------------------------------------------------------

_RETRYABLE = (http.client.RemoteDisconnected, http.client.BadStatusLine, ConnectionResetError,
              BrokenPipeError, ConnectionAbortedError)


class RawClient:
    """One keep-alive connection with ``http.client``; reconnects once when the server has
    closed an idle connection (uvicorn closes them after 5 s)."""

    kind = "http.client"

    def __init__(self, url: str, key: str | None, timeout: float = 60.0):
        u = urlsplit(url)
        self.host, self.port, self.timeout = u.hostname, u.port, timeout
        self.headers = {"Content-Type": "application/json", "Connection": "keep-alive"}
        if key:
            self.headers["Authorization"] = f"ApiKey {key}"
        self.conn = self._connect()

    def _connect(self) -> http.client.HTTPConnection:
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        c.connect()
        import socket

        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return c

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        for attempt in (0, 1):
            try:
                self.conn.request("POST", path, body, self.headers)
                r = self.conn.getresponse()
                return r.status, r.read()
            except _RETRYABLE:
                self.conn.close()
                if attempt:
                    raise
                self.conn = self._connect()
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


class HttpxClient:
    """One keep-alive ``httpx.Client`` (a pool of one connection)."""

    kind = "httpx"

    def __init__(self, url: str, key: str | None, timeout: float = 60.0):
        import httpx

        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"ApiKey {key}"
        self.c = httpx.Client(base_url=url, headers=headers, timeout=timeout,
                              limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        r = self.c.post(path, content=body)
        return r.status_code, r.content

    def close(self) -> None:
        self.c.close()


CLIENTS = {"http.client": RawClient, "httpx": HttpxClient}


def client_cpu_per_request(url: str, key: str, path: str, body: bytes, n: int = 400) -> dict[str, float]:
    """CPU of this process per request (us, user + system), for each client kind, over
    ``n`` sequential requests (after 20 unmeasured ones). Interleaved twice to even out noise."""
    out: dict[str, list[float]] = {k: [] for k in CLIENTS}
    for _round in range(2):
        for kind, cls in CLIENTS.items():
            c = cls(url, key)
            try:
                for _ in range(20):
                    c.post(path, body)
                t0 = time.process_time()
                for _ in range(n):
                    status, _b = c.post(path, body)
                    if status != 200:
                        raise RuntimeError(f"{kind}: {path} answered {status}: {_b[:200]!r}")
                out[kind].append((time.process_time() - t0) / n * 1e6)
            finally:
                c.close()
    return {k: min(v) for k, v in out.items()}


# ---------------------------------------------------------------------------
# The paced writer (a process body)
# ---------------------------------------------------------------------------


def _pool_parts(n: int, seed: int, drop: tuple[str, ...]) -> tuple[list[bytes], float]:
    """RockBench events serialized once without the fields in ``drop``: each part is the
    object's text after its opening brace (so a request splices its own fields in front)."""
    import orjson

    from rtindex import datagen

    parts = []
    for d in datagen.rockbench_events(n, seed=seed, event_time_us=0):
        for k in drop:
            d.pop(k, None)
        parts.append(orjson.dumps(d)[1:])
    return parts, sum(len(p) for p in parts) / len(parts)


def paced_writer(url: str, key: str, opts: dict, ready: Any, go: Any, stop: Any, shared: Any, results: Any) -> None:
    """POST RockBench events to ``opts["path"]`` at ``opts["mb_per_s"]`` (or, with
    ``opts["fixed_docs"]``, that many documents per tick), one request every
    ``opts["tick_ms"]``; a request that ran late is followed by one with the documents due
    since (at most ``opts["max_catchup"]`` ticks' worth). Each document gets ``_id``
    ``{prefix}-{seq}``, ``_event_time`` = time.time() in microseconds when its request is
    built, and ``generator_identifier`` = ``opts["gen_id"]``. ``opts["rockset"]``: the body
    is ``{"data": [...]}``, else a JSON array.

    ``shared`` (a ``multiprocessing.Array("d")``): [0] = time.time() from which write
    latencies count (set by the orchestrator), [1] = ``_event_time`` of the newest request
    sent, [2] = that of the newest request acknowledged with 200. Results: one
    ("writer", dict) on ``results``."""
    try:
        client = CLIENTS[opts.get("client", "http.client")](url, key)
        gen_id = opts["gen_id"]
        parts, avg_part = _pool_parts(opts["pool"], opts["seed"], ("_id", "_event_time", "generator_identifier"))
        prefix = opts["id_prefix"]
        # "_id", "_event_time" (16 digits) and "generator_identifier", spliced in front
        head_len = len(f'{{"_id":"{prefix}-{10**6}","_event_time":{10**15},"generator_identifier":"{gen_id}",')
        avg_bytes = avg_part + head_len
        interval = opts["tick_ms"] / 1000.0
        if opts.get("fixed_docs"):
            per_tick = float(opts["fixed_docs"])
        else:
            per_tick = opts["mb_per_s"] * MB / avg_bytes * interval
        rate = per_tick / interval
        cap = max(1, int(per_tick * opts.get("max_catchup", 10)))
        path = opts["path"]
        rockset = opts.get("rockset", False)
        P = len(parts)
        gid = gen_id.encode()
        pfx = prefix.encode()
        ready.set()
        while not go.wait(0.1):
            if stop.is_set():
                return
        write_ms: list[float] = []
        errors = 0
        first_error = None
        item_errors = 0
        sent = sent_bytes = acked = 0
        requests = 0
        max_batch = 0
        late_ticks = 0
        t0 = time.perf_counter()
        k_prev = -1
        while not stop.is_set():
            now = time.perf_counter()
            k = int((now - t0) / interval)
            if k > k_prev + 1:
                late_ticks += k - k_prev - 1
            k_prev = k
            n = min(cap, int(per_tick * (k + 1)) - sent)
            if n > 0:
                et = time.time_ns() // 1000
                head = b'{"_id":"' + pfx + b"-%d" + b'","_event_time":' + str(et).encode() + \
                       b',"generator_identifier":"' + gid + b'",'
                docs = [(head % j) + parts[j % P] for j in range(sent, sent + n)]
                body = b",".join(docs)
                body = (b'{"data":[' + body + b"]}") if rockset else (b"[" + body + b"]")
                with shared.get_lock():
                    shared[1] = float(et)
                t1 = time.perf_counter()
                t1_wall = time.time()
                try:
                    status, reply = client.post(path, body)
                except Exception as e:  # noqa: BLE001 - counted, reported
                    status, reply = 0, repr(e).encode()
                ms = (time.perf_counter() - t1) * 1000
                if status == 200:
                    with shared.get_lock():
                        shared[2] = float(et)
                    bad = reply.count(b'"ERROR"') if b'"ERROR"' in reply else 0
                    item_errors += bad
                    acked += n - bad
                else:
                    errors += 1
                    if first_error is None:
                        first_error = f"{status}: {reply[:300]!r}"
                if t1_wall >= shared[0]:
                    write_ms.append(ms)
                sent += n
                sent_bytes += len(body)
                requests += 1
                max_batch = max(max_batch, n)
            pause = t0 + (k + 1) * interval - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        elapsed = time.perf_counter() - t0
        client.close()
        results.put(("writer", {
            "docs": sent, "docs_acked": acked, "requests": requests, "seconds": elapsed,
            "docs_per_s": sent / elapsed, "mb_per_s": sent_bytes / MB / elapsed,
            "target_docs_per_s": rate, "target_mb_per_s": rate * avg_bytes / MB, "avg_doc_bytes": avg_bytes,
            "max_batch": max_batch, "late_ticks": late_ticks, "errors": errors, "item_errors": item_errors,
            "first_error": first_error, "write_ms": write_ms,
        }))
    except BaseException as e:  # noqa: BLE001 - reported to the orchestrator
        results.put(("writer", {"error": f"writer: {type(e).__name__}: {e}", "traceback": traceback.format_exc()}))


def cleanup_dir(path: str, keep: bool) -> None:
    import shutil

    if keep:
        log(f"kept {path}")
    else:
        shutil.rmtree(path, ignore_errors=True)
