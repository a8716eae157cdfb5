"""What a reliability suite tried and found, for docs/reliability.md's table.

A suite calls :func:`record` once a test has run its cases; when the environment names a
file in ``RTINDEX_RELIABILITY_LOG`` the record is appended there as one JSON line
(benchmarks/reliability.py runs the suites and makes the table from those lines), and it
is printed either way, so a run with ``-s`` shows it too.
"""

from __future__ import annotations

import os

import orjson

LOG_ENV = "RTINDEX_RELIABILITY_LOG"


def record(test: str, what: str, cases: int, unit: str, failures: int, **found: int) -> None:
    """``cases`` of ``unit`` (kill cycles, fault points, requests) tried by ``test``, which
    checks ``what``; ``failures`` of them broke a promise; ``found``: counts worth a column
    (acknowledged documents, lost ones, 5xx answers...)."""
    line = {"test": test, "what": what, "cases": cases, "unit": unit, "failures": failures, **found}
    print("reliability", orjson.dumps(line).decode())
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "ab") as f:
            f.write(orjson.dumps(line) + b"\n")
