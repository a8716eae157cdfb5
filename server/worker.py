"""A child process of ``rtindex serve``: ``python -m rtindex.server.worker ingest|query``.

The supervisor passes the configuration in ``RTINDEX_SERVER_CONFIG`` (JSON) and, to query
processes, the shared listening socket as file descriptor ``RTINDEX_LISTEN_FD``.
"""

from __future__ import annotations

import os
import socket
import sys


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when the supervisor dies, however it dies, so a killed
    supervisor never leaves a writer holding the data directory's lock."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: the supervisor's stop() is what ends us
    if os.getppid() == 1:  # the supervisor died before prctl took effect
        sys.exit(1)


def tune_runtime(role: str) -> None:
    """The interpreter settings of a service process (the figures behind them are in
    docs/benchmarks.md, "The service"):

    - The objects alive after start-up (modules, the open database) are frozen out of the
      cyclic GC, and its first threshold raised. Parsing a large write body makes tens of
      thousands of objects and with them a full collection over the whole heap, several
      times the cost of the parse itself. Collections still run, far less often.
    - A query process switches threads every 1 ms instead of 5: while a query runs in a
      worker thread, the event loop (429s, relayed writes, small queries) waits for the
      GIL at most that long.
    - pyarrow imports pandas the first time ``pa.array`` converts Python values (its pandas
      shim), which the first query of each process would pay. Done here, before the freeze.
    """
    import gc

    import pyarrow as pa

    pa.array([0])
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    if role == "query":
        sys.setswitchinterval(0.001)


DEMO_COLLECTION = "demo_events"
DEMO_EVENTS = 20_000


def load_demo(db) -> None:
    """``rtindex serve --demo``: RockBench-style events in ``demo_events`` when it is missing
    (the supervisor waits for the ingest process to listen, so queries find them)."""
    if DEMO_COLLECTION in db:
        return
    from rtindex import datagen

    print(f"loading {DEMO_EVENTS:,} demo events into collection {DEMO_COLLECTION!r} ...", flush=True)
    db.create_collection(DEMO_COLLECTION, shards=2).ingest(datagen.rockbench_events(DEMO_EVENTS, seed=1),
                                                           progress=False)


def _cluster(config, options: dict):
    """The collections of the Ray cluster at ``config.ray`` (docs/scale-out.md)."""
    import rtindex

    return rtindex.open_cluster(config.ray, root=config.ray_root or None, options=options)


def main(role: str) -> int:
    from .config import ServerConfig

    _die_with_parent()
    config = ServerConfig.from_json(os.environ["RTINDEX_SERVER_CONFIG"])
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = config.metrics_dir  # before prometheus_client loads
    import uvicorn

    import rtindex

    common = dict(log_level="warning", access_log=False, http="httptools", lifespan="on",
                  timeout_keep_alive=config.keep_alive_timeout_s,  # see ServerConfig
                  timeout_graceful_shutdown=30, server_header=False, date_header=False)
    if role == "ingest":
        from . import ingest_app

        if config.ray:
            db = _cluster(config, {"max_document_bytes": config.limits.max_document_bytes,
                                   "max_depth": config.limits.max_depth})
        else:
            db = rtindex.open(config.data, max_document_bytes=config.limits.max_document_bytes,
                              max_depth=config.limits.max_depth)
        if config.demo:
            load_demo(db)
        app = ingest_app.build_app(db, config)
        server = uvicorn.Server(uvicorn.Config(app, uds=config.ingest_socket, **common))
        sockets = None
    elif role == "query":
        from . import query_app

        db = (_cluster(config, {"max_result_bytes": config.limits.max_result_bytes}) if config.ray else
              rtindex.open(config.data, role="reader", max_result_bytes=config.limits.max_result_bytes))
        from .shedding import shedding_protocol

        app = query_app.build_app(db, config)
        server = uvicorn.Server(uvicorn.Config(app, **{**common, "http": shedding_protocol(app)}))
        sockets = [socket.socket(fileno=int(os.environ["RTINDEX_LISTEN_FD"]))]
    else:
        print(f"unknown role {role!r}", file=sys.stderr)
        return 2
    tune_runtime(role)
    try:
        server.run(sockets=sockets)  # until SIGTERM/SIGINT: stops accepting, finishes requests
    finally:
        db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
