"""SQL for one Database: the plan cache, the sandboxed DuckDB, and the way from a SQL text
to a Result: parse (cached), plan (rtindex/sql/planner.py), execute
(rtindex/sql/executor.py), or the short way of a point query; a query over several
collections through rtindex/sql/multi.py. EXPLAIN returns the plan without running it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rtindex import keys
from rtindex.duck import DuckEngine, check_time_limit, time_limit
from rtindex.sql import messages, multi, planner
from rtindex.sql import predicates as P
from rtindex.sql.executor import SAMPLE_ROWS, execute
from rtindex.sql.parse import Query
from rtindex.sql.plan import Plan
from rtindex.sql.planner import ROW_COST, STAR_REASON, bind_operand, check_params, int_param, snapshot_of
from rtindex.sql.queries import PlanCache
from rtindex.sql.result import Result
from rtindex.sql.sources import MultiQuery

if TYPE_CHECKING:
    from rtindex.snapshot import Snapshot

WARNINGS_MEMO = 1024  # query texts whose warnings are remembered (SqlEngine.warnings_memo)


class SqlEngine:
    """SQL for one Database: the plan cache and the sandboxed DuckDB live here. It reaches
    collections only through ``lookup`` (a name -> Collection callable)."""

    def __init__(self, lookup: Callable[[str], Any], max_result_bytes: int | None = None):
        self._lookup = lookup
        self.max_result_bytes = max_result_bytes  # None: no budget (see ResultTooLargeError)
        self._plans = PlanCache()
        # (collection, SQL text) -> (rows written per shard when worked out, Result.warnings):
        # whether a field exists changes only when documents arrive, and every query asks
        self.warnings_memo: dict[tuple[str, str], tuple[tuple[int, ...], list[str]]] = {}
        self._duck: DuckEngine | None = None
        self._lock = threading.Lock()

    def duck(self) -> DuckEngine:
        with self._lock:
            if self._duck is None:
                self._duck = DuckEngine()
            return self._duck

    def close(self) -> None:
        with self._lock:
            if self._duck is not None:
                self._duck.close()

    # ------------------------------------------------------------------------------
    def sql(self, text: str, params: Any = None, access: str | None = None, timeout_ms: float | None = None) -> Result:
        """Run one query; it stops ``timeout_ms`` from now (QueryTimeoutError): DuckDB's work is
        interrupted, and the work around it checks the limit between its steps."""
        with time_limit(timeout_ms):
            return self._sql(text, params, access)

    def _sql(self, text: str, params: Any, access: str | None) -> Result:
        t0 = time.perf_counter()
        q = self._plans.get(text)
        check_time_limit()  # parsing a long text is a step of its own
        if isinstance(q, MultiQuery):
            return self._sql_multi(q, params, access, t0)
        if q.point is not None and access is None:
            res = self._point(q, params, t0)
            if res is not None:
                return res
        snap = snapshot_of(self._lookup, q.collection, q.sql)
        plan = planner.plan(q, snap, params, access)
        check_time_limit()
        t1 = time.perf_counter()
        res = execute(plan, self.duck, self.max_result_bytes)
        res.timings = {"plan": t1 - t0, **res.timings}
        res.warnings = self.warnings(q, snap, plan.leaves)
        res.seconds = time.perf_counter() - t0
        return res

    def try_point(self, text: str, params: Any, max_rows: int) -> Result | None:
        """The answer of ``text`` if it is a point query matching at most ``max_rows`` rows
        (work bounded by that), else None: run it with :meth:`sql`. A text not parsed
        before is None too: parsing a long text is work no row count bounds."""
        t0 = time.perf_counter()
        q = self._plans.cached(text)
        if q is None or isinstance(q, MultiQuery) or q.point is None:
            return None
        return self._point(q, params, t0, max_rows)

    def _point(self, q: Query, params: Any, t0: float, max_rows: int | None = None) -> Result | None:
        """A point query (``Query.point``): the result, plan and warnings of the general
        index path, which is the only path for documents, without building what its
        choice and its other cases need (the scan's blockers, the planner's evaluator
        state, the executor): from the terms to the copied rows it is one compiled call
        (Snapshot.point). A key-value lookup is what this kind of query is run for, at
        high rates (tests/test_sql_point.py checks the two paths agree). None: more than
        ``max_rows`` rows when given; under ``max_result_bytes``, more rows than the
        general path measures rather than estimates (it estimates the rest from a sample
        and refuses, with a stream to read it, what is over the budget), or a measured
        result over it."""
        checked = check_params(q, params)
        leaf = q.point
        value = bind_operand(leaf.value, checked, q.sql)
        limit, offset = int_param(q.limit, checked, q.sql), int_param(q.offset, checked, q.sql) or 0
        snap = snapshot_of(self._lookup, q.collection, q.sql)
        budget = self.max_result_bytes
        if budget is not None:  # a few rows are measured; more are estimated from a sample by the general path
            max_rows = SAMPLE_ROWS if max_rows is None else min(max_rows, SAMPLE_ROWS)
        charge = [0] if budget is not None else None
        t1 = time.perf_counter()
        n, docs = snap.point(leaf.path, value, isinstance(leaf, P.ArrayContains), limit, offset, max_rows, charge)
        t2 = time.perf_counter()
        if docs is None or budget is not None and charge[0] > budget:
            return None
        plan = Plan(q.collection, "index", STAR_REASON, snap.count(), n, index_cost_us=n * ROW_COST)
        res = Result(None, rows=docs, access="index")
        res.plan = plan
        res.warnings = self.warnings(q, snap, (leaf,))
        res.timings = {"plan": t1 - t0, "fetch": t2 - t1}
        res.seconds = time.perf_counter() - t0
        return res

    def _sql_multi(self, q: MultiQuery, params: Any, access: str | None, t0: float) -> Result:
        """A query over collection references (rtindex/sql/multi.py)."""
        plan = multi.plan(q, self._lookup, params, access)
        check_time_limit()
        t1 = time.perf_counter()
        res = multi.execute(plan, self.duck, self.max_result_bytes)
        res.timings = {"plan": t1 - t0, **res.timings}
        res.warnings = [w for src in plan.sources for w in self.warnings(src.query, src.snapshot, src.leaves)]
        res.seconds = time.perf_counter() - t0
        return res

    def explain(self, text: str, params: Any = None, access: str | None = None) -> Plan:
        """The plan of ``text``, made and not run: nothing is fetched or scanned."""
        q = self._plans.get(text)
        if isinstance(q, MultiQuery):
            return multi.plan(q, self._lookup, params, access, explain=True)
        return planner.plan(q, snapshot_of(self._lookup, q.collection, q.sql), params, access, explain=True)

    def warnings(self, q: Query, snap: Snapshot, leaves: tuple) -> list[str]:
        """Result.warnings: fields no document of the collection has, paths through arrays
        (messages.query_warnings), literals of another type than their field holds
        (messages.literal_warnings).

        Worked out again only when rows were written since (per shard ``next_row_id``): a
        field that deletes alone made disappear is noticed at the next write."""
        key, written = (q.collection, q.sql), snap.next_row_ids
        memo = self.warnings_memo.get(key)
        if memo is not None and memo[0] == written:
            return list(memo[1])
        found = []
        if snap.count():
            def exists(path: tuple[str, ...]) -> bool:
                return bool(snap.column_types(path)) or any(snap.has_type(path, t) for t in keys.TAGS_BY_NAME)
            used = list(q.fields) + [leaf.path for leaf in leaves]
            found = messages.query_warnings(q.sql, q.collection, used, exists, snap.field_paths,
                                            lambda path: snap.has_type(path, "array"))
            compared = [(leaf.path, leaf.op if isinstance(leaf, P.Compare) else "=", leaf.value.value)
                        for leaf in leaves if isinstance(getattr(leaf, "value", None), P.Const)]
            found += messages.literal_warnings(compared, snap.has_type)
        if len(self.warnings_memo) >= WARNINGS_MEMO:
            self.warnings_memo.clear()
        self.warnings_memo[key] = (written, found)
        return list(found)
