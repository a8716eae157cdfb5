#!/usr/bin/env python
"""What the HTTP framework costs a query, in-process: the lean path against FastAPI's.

    python benchmarks/http_path.py [--quick] [--requests N]

The query process's app (server/query_app.py) is driven directly through ASGI, with no
sockets and no HTTP parsing, so what is measured is what differs between the two paths:
auth, admission, routing, body reading, validation and the reply.
``lean`` sends ``POST /v1/query`` (and ``/v1/noop``) straight to the query service behind
the pure-ASGI admission layer. ``fastapi`` builds the same app with ``lean=False``, so
those routes go through FastAPI's router, its pydantic body model and its Response. Both
run the same query code.

Each of ``noop`` (no query) and ``query`` (``SELECT * FROM ev WHERE k = :k``, one row of a
small collection) is measured as CPU microseconds per request, the median of 5 rounds.
The last line printed is one JSON object: ``{lean,fastapi}_{noop,query}_us`` and
``fastapi_extra_us`` (FastAPI minus lean, for a query).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.ingest import log  # noqa: E402


def build(path: str, lean: bool):
    import rtindex
    from rtindex.server import query_app
    from rtindex.server.config import ServerConfig

    config = ServerConfig(data=path, auth=True, ingest_socket=os.path.join(path, "unused.sock"))
    db = rtindex.open(path, role="reader")
    return db, query_app.build_app(db, config, lean=lean)


async def drive(app, path: str, body: bytes, key: str, n: int) -> float:
    """CPU microseconds per request over ``n`` requests."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                         (b"authorization", f"ApiKey {key}".encode()),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000)}
    statuses = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg):
        if msg["type"] == "http.response.start":
            statuses.append(msg["status"])

    t0 = time.process_time()
    for _ in range(n):
        await app(dict(scope), receive, send)
    cpu = time.process_time() - t0
    bad = [s for s in statuses if s != 200]
    if bad:
        raise SystemExit(f"{path}: status {bad[0]}")
    return cpu / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--requests", type=int)
    args = ap.parse_args()
    n = args.requests or (2_000 if args.quick else 10_000)

    import rtindex
    from rtindex.server.auth import KeyStore

    tmp = tempfile.mkdtemp(prefix="rtindex-http-path-")
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="rtindex-metrics-"))
    with rtindex.open(tmp) as w:
        w.create_collection("ev", shards=2).ingest([{"_id": i, "k": i, "s": f"v{i}"} for i in range(1000)])
    key, _ = KeyStore(tmp).create("read")
    query = json.dumps({"sql": "SELECT * FROM ev WHERE k = :k", "parameters": {"k": 7}}).encode()
    out = {}
    for label, lean in (("lean", True), ("fastapi", False)):
        db, app = build(tmp, lean)
        try:
            for kind, path, body in (("noop", "/v1/noop", b"{}"), ("query", "/v1/query", query)):
                asyncio.run(drive(app, path, body, key, n // 10))  # warm: plans, caches, imports
                rounds = [asyncio.run(drive(app, path, body, key, n)) for _ in range(5)]
                out[f"{label}_{kind}_us"] = round(statistics.median(rounds), 1)
                log(f"{label:>8} {kind:<6} {out[f'{label}_{kind}_us']:8.1f} us CPU/request "
                    f"(rounds: {', '.join(f'{r:.0f}' for r in rounds)})")
        finally:
            db.close()
    out["fastapi_extra_us"] = round(out["fastapi_query_us"] - out["lean_query_us"], 1)
    out["requests_per_round"] = n
    print(json.dumps(out))


if __name__ == "__main__":
    main()
