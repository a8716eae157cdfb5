"""Checked queries by SQL text: the single-collection form where it fits, else the general
one (rtindex/sql/sources.py), kept in a bounded cache so a repeated query is parsed once."""

from __future__ import annotations

import threading
from collections import OrderedDict

from rtindex.errors import SqlError, UnsupportedSqlError
from rtindex.sql.parse import Query, _Parser
from rtindex.sql.sources import MultiQuery, parse_general

PLAN_CACHE_SIZE = 512


def parse_query(sql: str) -> Query | MultiQuery:
    """The checked plan of ``sql``: a single-collection Query when it fits that form (the
    index answers its WHERE, or DuckDB the residual over one frame), else a MultiQuery over
    every collection reference (rtindex/sql/sources.py)."""
    try:
        return _Parser(sql).parse()
    except UnsupportedSqlError:
        return parse_general(sql)


class PlanCache:
    """Checked queries by SQL text, least recently used evicted first; thread-safe."""

    def __init__(self, size: int = PLAN_CACHE_SIZE):
        self.size = size
        self._plans: OrderedDict[str, Query | MultiQuery] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, sql: str) -> Query | MultiQuery:
        if not isinstance(sql, str):
            raise SqlError(f"SQL must be a string, not {type(sql).__name__}")
        # A hit takes no lock: each OrderedDict call is atomic, and with a lock every query
        # thread queued behind one the GIL had paused inside it, so two threads ran slower
        # than one (measured: docs/benchmarks.md, "Queries")
        q = self._plans.get(sql)
        if q is not None:
            try:
                self._plans.move_to_end(sql)
            except KeyError:  # evicted meanwhile
                pass
            return q
        q = parse_query(sql)
        with self._lock:
            self._plans[sql] = q
            while len(self._plans) > self.size:
                self._plans.popitem(last=False)
        return q

    def cached(self, sql: str) -> Query | MultiQuery | None:
        """The checked query of ``sql`` if it is in the cache, else None (nothing parsed)."""
        return self._plans.get(sql) if isinstance(sql, str) else None

    def __len__(self) -> int:
        return len(self._plans)
