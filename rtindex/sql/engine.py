"""Runs a checked query: binds parameters, picks the access path by cost, produces a Result.

Access paths (docs/sql.md has the rules, EXPLAIN shows the numbers):

- **index**: WHERE becomes posting-list algebra on the snapshot; the matching rows are
  fetched from the row store. A plain projection (or ``SELECT *``) is answered right there;
  anything else runs in DuckDB over an Arrow table of the fields it needs.
- **scan**: the column store's typed columns of the needed fields are read for every row,
  and DuckDB filters (WHERE compiled to typed column expressions) and computes the rest.

The choice compares estimated costs: ``rows matched x ROW_COST`` for the index path against
``rows in collection x columns x COLUMN_COST + SCAN_OVERHEAD`` for the scan. Range predicates
are looked up with a term budget, so a range over most of a high-cardinality field gives up
early and picks the scan. Some queries have only one path: ``SELECT *``, UNNEST, arrays or
objects in the output, and ARRAY_CONTAINS need the index path (rows or element postings).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from collections.abc import Callable, Iterator, Mapping, Sequence  # (typing's isinstance is slow)
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rtindex import keys
from rtindex.errors import NotFoundError, ResultTooLargeError, SqlError
from rtindex.result import Result
from rtindex.rowcache import copy_json, json_bytes
from rtindex.segments import OverBudget
from rtindex.sql import frames, messages, small, typed
from rtindex.sql import predicates as P
from rtindex.sql.execute import DuckEngine, OutputTooLarge, time_limit
from rtindex.sql.multi import MultiExecution, access_of, reference_lines
from rtindex.sql.parse import PlanCache, Query
from rtindex.sql.sources import MultiQuery

if TYPE_CHECKING:
    from rtindex.snapshot import Postings, Snapshot

# Cost model, in microseconds, from benchmarks/query.py --quick (the measured figures are in
# docs/benchmarks.md, "Queries"): ROW_COST is fetching, decoding and framing one matched
# row; COLUMN_COST reading and filtering one value of one column in a scan.
ROW_COST = 8.0
COLUMN_COST = 0.035
SCAN_OVERHEAD = 400.0
ACCESS = ("index", "scan")
STAR_BLOCKER = "SELECT * reads whole documents"  # why the column scan cannot answer SELECT *
STAR_REASON = f"the column scan cannot: {STAR_BLOCKER}"
WARNINGS_MEMO = 1024  # query texts whose warnings are remembered (SqlEngine.warnings_memo)
# rows of an index-path result measured to estimate its size before it is fetched in full
SAMPLE_ROWS = 16
# up to this many matched rows, the kinds of values a mixed field holds in them are read from
# the rows (fetched anyway); past it from posting lists, which hold no rows in memory
MIXING_FROM_ROWS = 4096
# the index path aggregates this many matched rows at most in numpy and Arrow (small.py): beyond
# them DuckDB's per-call cost no longer matters and its threads pay
SMALL_ROWS = 100_000


@dataclass
class Plan:
    """What runs for one execution, and why: EXPLAIN prints it."""

    collection: str
    access: str
    reason: str
    total_rows: int
    matched_rows: int | None  # exact, from posting lists (None: the scan was chosen first)
    predicates: list[tuple[str, int | None]] = field(default_factory=list)  # leaf, rows where TRUE
    index_cost_us: float | None = None
    scan_cost_us: float | None = None
    duckdb_sql: str | None = None
    residual: str | None = None  # the part of WHERE the index does not answer: DuckDB evaluates it
    by_column: bool = False  # index path: the fields are read from the column store at the matched rows
    arrow: bool = False  # the aggregate was computed with numpy and Arrow, not DuckDB (rtindex/sql/small.py)
    # a query over collection references: the plan of each collection it reads, and lines
    # on its references (index part, residual, estimated rows)
    sources: list[Plan] = field(default_factory=list)
    references: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.sources and not self.collection:
            return f"query over no collection\n  DuckDB: {self.duckdb_sql}"
        if self.sources:
            lines = [f"query over {len(self.sources)} collection(s): {self.access} ({self.reason})"]
            for src in self.sources:
                lines.extend(str(src).splitlines()[:-1])  # its own DuckDB line is not run
                lines.extend(src.references)
            lines.append(f"  DuckDB: {self.duckdb_sql}")
            return "\n".join(lines)
        lines = [f"collection {self.collection}: {self.access} path ({self.reason})",
                 f"  rows in collection: {self.total_rows}"]
        if self.matched_rows is not None:
            lines.append(f"  rows matched by the index: {self.matched_rows}")
        for text, n in self.predicates:
            lines.append(f"  predicate {text}: {'over the term budget' if n is None else f'{n} rows'}")
        if self.by_column:
            lines.append("  fields: read from the column store at the matched rows")
        if self.residual is not None:
            lines.append(f"  residual (DuckDB): {self.residual}")
        if self.index_cost_us is not None:
            lines.append(f"  estimated cost, index path: {self.index_cost_us:,.0f} us")
        if self.scan_cost_us is not None:
            lines.append(f"  estimated cost, column scan: {self.scan_cost_us:,.0f} us")
        if self.arrow:
            lines.append("  aggregated with numpy and Arrow compute over the matched rows (DuckDB runs the statement "
                         "below where the values need it)")
        lines.append(f"  DuckDB: {self.duckdb_sql}" if self.duckdb_sql else "  DuckDB: not used")
        return "\n".join(lines)


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
        """Run one query; its DuckDB work stops ``timeout_ms`` from now (QueryTimeoutError)."""
        with time_limit(timeout_ms):
            return self._sql(text, params, access)

    def _sql(self, text: str, params: Any, access: str | None) -> Result:
        t0 = time.perf_counter()
        q = self._plans.get(text)
        if isinstance(q, MultiQuery):
            return self._sql_multi(q, params, access, t0)
        if q.point is not None and access is None:
            res = self._point(q, params, t0)
            if res is not None:
                return res
        run = _Execution(self, q, params, access)
        plan = run.choose()
        run.timings["plan"] = time.perf_counter() - t0
        res = run.run(plan)
        res.plan = plan
        res.warnings = run.warnings()
        res.timings = run.timings
        res.seconds = time.perf_counter() - t0
        return res

    def try_point(self, text: str, params: Any, max_rows: int) -> Result | None:
        """The answer of ``text`` if it is a point query matching at most ``max_rows`` rows
        (work bounded by that), else None: run it with :meth:`sql`."""
        t0 = time.perf_counter()
        q = self._plans.get(text)
        if isinstance(q, MultiQuery) or q.point is None:
            return None
        return self._point(q, params, t0, max_rows)

    def _point(self, q: Query, params: Any, t0: float, max_rows: int | None = None) -> Result | None:
        """A point query (``Query.point``): the result, plan and warnings of the general
        index path, which is the only path for documents, without building what its
        choice and its other cases need (an _Execution, the scan's blockers, the planner's
        evaluator state). A lookup that returns a row or two is a few microseconds of
        posting lists and cached rows; those objects cost several times that, and a
        key-value lookup is what this kind of query is run for, at high rates
        (tests/test_sql_point.py checks the two paths agree). None: a result over
        ``max_result_bytes``, which the general path refuses (with a stream to read it), or
        of more than ``max_rows`` rows when given."""
        checked = _check_params(q, params)
        leaf = q.point
        value = bind_operand(leaf.value, checked, q.sql)
        limit, offset = int_param(q.limit, checked, q.sql), int_param(q.offset, checked, q.sql) or 0
        snap = snapshot_of(self._lookup, q)
        rows = snap.matching(leaf.path, value, contains=isinstance(leaf, P.ArrayContains))
        n = len(rows)
        plan = Plan(q.collection, "index", STAR_REASON, snap.count(), n, index_cost_us=n * ROW_COST)
        n_out = max(0, n - offset) if limit is None else max(0, min(n - offset, limit))
        if max_rows is not None and n_out > max_rows:
            return None
        budget = self.max_result_bytes
        t1 = time.perf_counter()
        charge = [0]
        if budget is not None and n_out > SAMPLE_ROWS:  # estimated, as run_plain does, before fetching all
            snap.fetch(rows, SAMPLE_ROWS, offset=offset, copy=False, charge=charge)
            if charge[0] * n_out // SAMPLE_ROWS > budget:
                return None
        measure = budget is not None and n_out <= SAMPLE_ROWS
        docs = snap.fetch(rows, n_out, offset=offset, charge=charge if measure else None)
        t2 = time.perf_counter()
        if measure and charge[0] > budget:
            return None
        res = Result(None, rows=docs, access="index")
        res.plan = plan
        res.warnings = result_warnings(self, q, snap, [leaf])
        res.timings = {"plan": t1 - t0, "fetch": t2 - t1}
        res.seconds = time.perf_counter() - t0
        return res

    def _sql_multi(self, q: MultiQuery, params: Any, access: str | None, t0: float) -> Result:
        """A query over collection references (rtindex/sql/multi.py)."""
        run = MultiExecution(self, q, params, access)
        plans = run.plans()
        run.timings["plan"] = time.perf_counter() - t0
        res = run.run(plans)
        res.plan = _multi_plan(plans, run.duckdb_sql)
        res.warnings = [w for source_run in run.runs for w in source_run.warnings()]
        res.timings = run.timings
        res.seconds = time.perf_counter() - t0
        return res

    def explain(self, text: str, params: Any = None, access: str | None = None) -> Plan:
        q = self._plans.get(text)
        if isinstance(q, MultiQuery):
            run = MultiExecution(self, q, params, access)
            plans = run.plans(explain=True)
            for src, source_run, plan in zip(q.sources, run.runs, plans):
                plan.references = reference_lines(source_run, plan, src.references)
            return _multi_plan(plans, run.duck_text(run.frames(plans), run.duck_params()))  # typed over the frames: they are read
        run = _Execution(self, q, params, access)
        plan = run.choose(explain=True)
        # the text DuckDB would run: typed by the rows the path reads (rule 2), so they are read
        run.plan = plan
        if plan.access == "scan" or run.columnar():
            plan.duckdb_sql = run.scan_text(plan)[0]
            plan.arrow = run.small_plan() is not None
        elif q.plain is None:
            plan.duckdb_sql = run.index_text(plan, run.frame(run.snap.fetch(run.rows, copy=False)))
        return plan


class _Execution:
    """One execution of a query: bound parameters, one snapshot of the collection."""

    def __init__(self, engine: SqlEngine, q: Query, params: Any, access: str | None):
        if access is not None and access not in ACCESS:
            raise ValueError(f"access must be one of {ACCESS} or None, not {access!r}")
        self.engine = engine
        self.q = q
        self.forced = access
        self.params = _check_params(q, params)
        self.leaves = list(P.leaves(q.where)) if q.where is not None else []
        for leaf in self.leaves:  # bad values are errors whichever path runs
            if isinstance(leaf, P.Like):
                P.like_prefix(self.bind(leaf.pattern), q.sql, leaf.position)
            elif isinstance(leaf, (P.Compare, P.ArrayContains)):
                self.bind(leaf.value)
        self.snap: Snapshot = snapshot_of(engine._lookup, q)
        self.rows = None  # Postings of the index path, once computed
        # the index path's matched rows when the fields a query needs are read from the column
        # store at them (add fields by column: no whole documents), else None
        self.narrowed: Postings | None = None
        self.timings: dict[str, float] = {}  # seconds per stage: plan, fetch or scan, duckdb
        self.types: dict[tuple[str, ...], list[int]] = {}
        self._mixing: dict[tuple[str, ...], str | None] | None = None  # of a plain projection's fields
        # the frame columns a DuckDB text compares (typed.compared): this query's, or, when this
        # execution reads a frame for a query over several collections, that query's (set by it)
        self.outer_compared: frozenset[str] | None = None

    # -- parameters -----------------------------------------------------------------
    def bind(self, operand: P.Operand) -> Any:
        """The value an operand compares as (datetimes as microseconds)."""
        return bind_operand(operand, self.params, self.q.sql)

    def int_param(self, operand: P.Operand | None) -> int | None:
        return int_param(operand, self.params, self.q.sql)

    # -- choosing -------------------------------------------------------------------
    def column_tags(self, path: tuple[str, ...]) -> list[int]:
        if path not in self.types:
            self.types[path] = [keys.TAGS_BY_NAME[t] for t in self.snap.column_types(path)]
        return self.types[path]

    def scan_blocker(self) -> str | None:
        """Why the column scan cannot answer this query (None: it can)."""
        q = self.q
        if q.star:
            return STAR_BLOCKER
        if any(isinstance(x, P.ArrayContains) for x in self.leaves):
            return "ARRAY_CONTAINS reads array elements"
        for path in q.fields:
            if keys.ARRAY in self.column_tags(path):
                return f"{'.'.join(path)} holds arrays"
        for path in dict.fromkeys(list(q.fields) + [leaf.path for leaf in self.leaves]):
            if self.snap.has_type(path, "object"):
                return f"{'.'.join(path)} holds objects"
        return None

    def choose(self, explain: bool = False) -> Plan:
        q = self.q
        total = self.snap.count()
        plan = Plan(q.collection, "index", "", total, None, residual=q.residual)
        ncols = max(1, len(set(q.fields) | {leaf.path for leaf in self.leaves}))
        blocker = self.scan_blocker()
        access = None
        if blocker is not None:
            access, plan.reason = "index", f"the column scan cannot: {blocker}"
            if self.forced == "scan":
                plan.reason += "; access='scan' ignored"
        else:
            plan.scan_cost_us = total * ncols * COLUMN_COST + SCAN_OVERHEAD
            if self.forced is not None:
                access, plan.reason = self.forced, f"access={self.forced!r} requested"
        self.blocker = blocker
        if access != "scan":
            if q.where is None:
                self.rows = self.snap.all()
            else:
                budget = [max(1024, int(plan.scan_cost_us / ROW_COST))] if access is None else None
                try:
                    self.rows = P.IndexEvaluator(self.snap, self.bind, budget).true(q.where)
                except OverBudget:
                    self.rows = None
            if self.rows is not None:
                plan.matched_rows = len(self.rows)
                plan.index_cost_us = plan.matched_rows * ROW_COST
        if access is None:
            if self.rows is None:
                access, plan.reason = "scan", "a range predicate covers more terms than the index path's budget"
            elif plan.index_cost_us <= plan.scan_cost_us:
                access, plan.reason = "index", "fewer rows to fetch than column values to scan"
            else:
                access, plan.reason = "scan", "scanning columns is cheaper than fetching the matched rows"
        plan.access = access
        if explain and q.where is not None:
            plan.predicates = self.leaf_sizes(q.where, unbounded=blocker is not None)
        return plan

    def leaf_sizes(self, pred: P.Pred, unbounded: bool) -> list[tuple[str, int | None]]:
        out = []
        for leaf in dict.fromkeys(P.leaves(pred)):
            budget = None if unbounded else [max(1024, self.snap.count() // 4)]
            try:
                n = len(P.IndexEvaluator(self.snap, self.bind, budget).true(leaf))
            except OverBudget:
                n = None
            out.append((_leaf_text(leaf, self.bind), n))
        return out

    # -- running ----------------------------------------------------------------------
    def run(self, plan: Plan) -> Result:
        self.plan = plan
        if plan.access == "scan":
            return self.run_scan(plan)
        return self.run_index(plan)

    def limits(self) -> tuple[int | None, int]:
        return self.int_param(self.q.limit), self.int_param(self.q.offset) or 0

    def run_index(self, plan: Plan) -> Result:
        """The index path. Under a budget (``max_result_bytes``) the size of what it builds is
        estimated from a sample before the rest is fetched, and DuckDB's output is measured
        as it comes; a result over the budget comes back unbuilt (see :meth:`refused`).

        A query DuckDB finishes reads the fields it needs from the column store at the
        matched rows when the column scan could read them (no arrays, objects or SELECT *):
        the scan path's statement over fewer rows, so the values are typed the same way."""
        if self.q.plain is not None:
            return self.run_plain()
        if self.columnar():
            return self.run_scan(plan)
        return self.run_index_duck(plan)

    def columnar(self) -> bool:
        """Whether the index path reads its fields by column (sets ``narrowed``, see run_index)."""
        if self.q.plain is None and not self.q.star and self.blocker is None and self.plan.access == "index":
            self.narrowed = self.rows
            self.plan.by_column = True
        return self.narrowed is not None

    def run_plain(self) -> Result:
        """Documents or a plain projection: the rows are built right here, without DuckDB."""
        q = self.q
        limit, offset = self.limits()
        n_out = max(0, len(self.rows) - offset)
        if limit is not None:
            n_out = min(n_out, limit)
        budget = self.engine.max_result_bytes
        columns = None if q.star else q.outputs
        t0 = time.perf_counter()

        def chunks(batch_rows: int) -> Iterator[list[dict]]:
            for start in range(0, n_out, batch_rows):
                yield self.plain_rows(self.snap.fetch(self.rows, min(batch_rows, n_out - start),
                                                      offset=offset + start, copy=False))

        def stream(batch_rows: int) -> pa.RecordBatchReader:
            return frames.rows_reader(lambda: chunks(batch_rows), columns)
        if budget is not None and n_out > SAMPLE_ROWS:  # refuse before fetching it all
            sample, size = self.plain_fetch(SAMPLE_ROWS, offset, copy=False, measure=True)
            size = size * n_out // len(sample)
            if size > budget:
                self.timings["fetch"] = time.perf_counter() - t0
                return self.refused(columns, n_out, size, True, stream)
        # documents of SELECT * are copies: the user's to keep
        measure = budget is not None and n_out <= SAMPLE_ROWS  # a few rows: measured, not estimated
        rows, size = self.plain_fetch(n_out, offset, copy=q.star, measure=measure)
        self.timings["fetch"] = time.perf_counter() - t0
        if measure and size > budget:
            return self.refused(columns, n_out, size, False, stream)
        return Result(columns, rows=rows, access="index")

    def plain_fetch(self, limit: int, offset: int, copy: bool, measure: bool) -> tuple[list[dict], int]:
        """plain_rows of ``limit`` matched rows after ``offset``, and with ``measure`` what
        they take (rtindex.rowcache.json_bytes; for documents as stored, known to the row
        cache), else 0."""
        charge = [0] if measure and self.q.star and not self.q.star_except else None
        rows = self.plain_rows(self.snap.fetch(self.rows, limit, offset=offset, copy=copy, charge=charge))
        if not measure:
            return rows, 0
        return rows, charge[0] if charge is not None else json_bytes(rows)

    def run_index_duck(self, plan: Plan) -> Result:
        """Aggregates, ORDER BY, expressions: DuckDB over a frame of the fields they use."""
        q = self.q
        budget = self.engine.max_result_bytes
        t0 = time.perf_counter()
        docs = self.snap.fetch(self.rows, copy=False)  # shared, read-only: only read into Arrow
        frame = self.frame(docs)
        t1 = time.perf_counter()
        self.timings["fetch"] = t1 - t0
        text, params = self.index_text(plan, frame), self.duck_params()
        plan.duckdb_sql = text

        def stream(batch_rows: int) -> pa.RecordBatchReader:
            frame = self.frame(self.snap.fetch(self.rows, copy=False))
            return self.engine.duck().stream(text, {"frame": frame}, params, batch_rows, query=self.names())
        try:
            out = self.engine.duck().run(text, {"frame": frame}, params, None if q.star else budget,
                                         query=self.names())
        except OutputTooLarge as e:
            return self.refused(e.columns, e.rows, e.nbytes, False, stream)
        finally:
            self.timings["duckdb"] = time.perf_counter() - t1
        if not q.star:
            return Result(out.column_names, table=out, access="index")
        if budget is not None and out.num_rows:  # the documents are not built yet: estimate them
            sample = self.star_rows(out.slice(0, SAMPLE_ROWS), docs, copy=False)
            size = json_bytes(sample) * out.num_rows // len(sample)
            if size > budget:
                return self.refused(None, out.num_rows, size, out.num_rows > SAMPLE_ROWS, self.star_stream)
        return Result(None, rows=self.star_rows(out, docs, copy=True), access="index")

    def star_stream(self, batch_rows: int) -> pa.RecordBatchReader:
        """``SELECT *, <expressions>`` in batches. DuckDB computes the expressions and the order
        over the fields they use, so the matched documents stay in memory (as the row cache's
        shared objects) while the batches are read."""
        docs = self.snap.fetch(self.rows, copy=False)
        frame = self.frame(docs)
        out = self.engine.duck().run(self.index_text(self.plan, frame),
                                     {"frame": frame}, self.duck_params(), query=self.names())

        def chunks() -> Iterator[list[dict]]:
            for batch in out.to_batches(batch_rows):
                yield self.star_rows(batch, docs, copy=False)
        return frames.rows_reader(chunks)

    def plain_rows(self, docs: list[dict]) -> list[dict]:
        """Output rows of a query the index path answers without DuckDB (``q.plain``), each
        field typed by the kinds of values it holds in the rows WHERE selects (frames.mixing)."""
        q = self.q
        if q.star:
            return [{k: v for k, v in d.items() if k not in q.star_except} for d in docs] if q.star_except else docs
        if self._mixing is None:
            self._mixing = self.plain_mixing()
        how = self._mixing
        if not any(how.values()):  # the common case: every field holds one kind
            return [{name: frames.output_value(path, frames.get_path(d, path)) for name, path in q.plain} for d in docs]
        return [{name: frames.mixed_value(how[path], frames.output_value(path, frames.get_path(d, path)))
                 for name, path in q.plain} for d in docs]

    def plain_mixing(self) -> dict[tuple[str, ...], str | None]:
        """frames.mixing of each projected field over the matched rows: nothing to learn where
        the whole collection holds one kind; else from the values when the query reads every
        matched row and they are few, else from posting lists (LIMIT or OFFSET leaves some
        unread, or a result too large to hold twice, maybe over max_result_bytes)."""
        out, docs = {}, None
        limit, offset = self.limits()
        for _, path in self.q.plain:
            kinds = set(self.column_tags(path)) | ({keys.OBJECT} if self.snap.has_type(path, "object") else set())
            if frames.mixing(kinds, big_ints=True) is None:
                out[path] = None
            elif offset == 0 and (limit is None or limit >= len(self.rows)) and len(self.rows) <= MIXING_FROM_ROWS:
                docs = self.snap.fetch(self.rows, copy=False) if docs is None else docs
                out[path] = frames.mixing_of(frames.values(docs, path))
            else:
                out[path] = frames.mixing(*P.IndexEvaluator(self.snap, self.bind).kinds(path, kinds, self.rows))
        return out

    def compared(self) -> frozenset[str]:
        """The frame columns the DuckDB text compares: a mixed one gets shadow columns (typed)."""
        return self.outer_compared if self.outer_compared is not None else typed.compared(self.q.duck_sql)

    def frame(self, docs: list[dict]) -> pa.Table:
        """The table DuckDB reads on the index path: the fields the query uses (with the shadow
        columns of those mixed ones it compares), and ``__pos``, each row's position in
        ``docs`` (also: a frame needs one column)."""
        compared = self.compared()
        named: list[tuple[str, pa.Array]] = []
        for path, name in self.q.fields.items():
            vals = frames.values(docs, path)
            col = frames.nulls_typed(frames.column(vals, path), self.column_tags(path))
            named.extend(typed.with_shadows(name, vals, col, compared))
        named.append(("__pos", pa.array(np.arange(len(docs), dtype=np.int64))))
        return frames.table([n for n, _ in named], [c for _, c in named])

    def star_rows(self, out: pa.Table | pa.RecordBatch, docs: list[dict], copy: bool) -> list[dict]:
        """``SELECT *, <expressions>`` rows: the documents at ``out``'s ``__pos``, plus its other columns."""
        extras = [n for n in out.column_names if n != "__pos"]
        rows = []
        for r in out.to_pylist():
            d = copy_json(docs[r["__pos"]]) if copy else docs[r["__pos"]]
            row = {k: v for k, v in d.items() if k not in self.q.star_except}
            row.update((n, r[n]) for n in extras)
            rows.append(row)
        return rows

    def refused(self, columns: list[str] | None, rows: int, size: int, estimated: bool,
                stream: Callable[[int], pa.RecordBatchReader]) -> Result:
        """A Result over the budget: its rows are not built (reading them raises
        ResultTooLargeError), ``stream`` reads it in batches."""
        error = ResultTooLargeError(rows, size, self.engine.max_result_bytes, estimated=estimated, sql=self.q.sql)
        return Result(columns, access=self.plan.access, refused=error, stream=stream)

    def warnings(self) -> list[str]:
        return result_warnings(self.engine, self.q, self.snap, self.leaves)

    def names(self) -> tuple[str, dict[str, str]]:
        """The user's text, and what the internal names of its DuckDB statements stand for:
        a DuckDB error names those (messages.duckdb_error)."""
        names = {f: ".".join(p) for p, f in self.q.fields.items()}
        names.update((c, ".".join(p)) for (p, _), c in getattr(self, "_scan_cols", {}).items())
        names.update((n, "a parameter") for n in self.q.duck_params)
        names["__pos"] = "*"
        return self.q.sql, names

    def duck_params(self) -> dict[str, Any]:
        """Parameters of the DuckDB text: a datetime stays a timestamp there (naive means UTC,
        as in WHERE), so that UNIX_MICROS(:t) or ``_event_time > :t`` in SELECT work."""
        return self.bind_duck_params(self.q.duck_params)

    def bind_duck_params(self, ops: dict[str, P.Operand]) -> dict[str, Any]:
        """The values of the DuckDB parameters ``ops`` (see :meth:`duck_params`)."""
        return duck_param_values(ops, self.params, self.q.sql)

    def duck_text(self, plan: Plan, kinds: dict | None = None, frame_types: dict | None = None) -> str:
        """The DuckDB statement of this execution (frame = the scan's CTE on the scan path;
        ``kinds``: the :meth:`scan_kinds` of its mixed fields, else typed by the collection;
        ``frame_types``: typed.columns_of the index path's frame, to apply rule 2 over it)."""
        q = self.q
        limit, offset = self.limits()
        tail = (f" LIMIT {int(limit)}" if limit is not None else "") + (f" OFFSET {int(offset)}" if offset else "")
        if plan.access != "scan" and self.narrowed is None:
            return self.typed_text(frame_types or {}) + tail
        self._scan_cols: dict[tuple[tuple[str, ...], int], str] = {}
        specs = []
        read = list(q.fields)  # and WHERE's fields, unless the index applied it (narrowed)
        if self.narrowed is None:
            read += [leaf.path for leaf in self.leaves]
        for path in dict.fromkeys(read):
            for tag in self.column_tags(path):
                name = f"c{len(specs)}"
                self._scan_cols[(path, tag)] = name
                specs.append((path, keys.TAG_NAMES[tag]))
        self._scan_specs = specs
        selects = []
        compared = self.compared()
        frame_types: dict[str, str | None] = {}
        self._frame_columns: dict[str, str | None] = {}  # frame column -> the scan column it is, if just one
        for path, fname in q.fields.items():
            cols = {tag: f'"{c}"' for (p, tag), c in self._scan_cols.items() if p == path}
            present, big = (kinds or {}).get(path, (cols, False))
            value = frames.value_sql(present, big)
            self._frame_columns[fname] = value[1:-1] if re.fullmatch(r'"c\d+"', value) else None
            selects.append(f'{value} AS "{fname}"')
            how = frames.mixing(set(present) - {keys.ARRAY, keys.OBJECT}, big)
            if how == frames.TEXT and fname in compared:  # rule 2 in DuckDB: shadow columns (typed)
                frame_types[fname] = typed.MIXED
                selects.extend(f'{sql} AS "{typed.shadow(fname, fam)}"'
                               for fam, sql in typed.scan_shadows(present).items())
            elif how == frames.TEXT:
                frame_types[fname] = typed.MIXED_TEXT
            elif value == "NULL":  # no value in the rows read
                frame_types[fname] = typed.NOTHING
            else:
                frame_types[fname] = typed.NUM if how == frames.DOUBLE else typed.family_of_tags(present)
        where = ""
        self._scan_params: dict[str, Any] = {}
        self._scan_where = ""
        if q.where is not None and self.narrowed is None:  # (narrowed: the index applied it)
            comp = P.ScanCompiler(lambda p, t: f'"{self._scan_cols[(p, t)]}"' if (p, t) in self._scan_cols else None,
                                  self.bind)
            self._scan_where = comp.compile(q.where)
            where = " WHERE " + self._scan_where
            self._scan_params = comp.params
        self.scan_frame_types = frame_types
        inner = ", ".join(selects) if selects else "1 AS __one"
        return f'WITH "frame" AS (SELECT {inner} FROM "scan"{where}) {self.typed_text(frame_types)}{tail}'

    def index_text(self, plan: Plan, frame: pa.Table) -> str:
        """The index path's DuckDB text, typed over the frame it reads."""
        return self.duck_text(plan, frame_types=typed.columns_of(frame.schema))

    def typed_text(self, frame_types: dict[str, str | None]) -> str:
        """This query's DuckDB text with rule 2 applied over its frame (typed.rewrite); a
        frame read for a query over several collections is rewritten by that query instead."""
        if self.outer_compared is not None:
            return self.q.duck_sql
        return typed.rewrite(self.q.duck_sql, {"frame": frame_types}, self.duck_params())

    def scan_text(self, plan: Plan) -> tuple[str, pa.Table]:
        """The column scan, and the DuckDB text over it, its mixed fields typed by the rows
        WHERE selects (scan_kinds)."""
        text = self.duck_text(plan)
        table = self.scan()
        kinds = self.scan_kinds(table)
        return (self.duck_text(plan, kinds) if kinds else text), table

    def scan(self) -> pa.Table:
        """The columns duck_text's scan reads, named as it names them."""
        table = self.snap.scan(self._scan_specs, rows=self.narrowed)
        return table.rename_columns(["_shard", "_row_id"] + [f"c{i}" for i in range(len(self._scan_specs))])

    def run_scan(self, plan: Plan) -> Result:
        t0 = time.perf_counter()
        text, table = self.scan_text(plan)
        plan.duckdb_sql = text
        params = {**self.duck_params(), **self._scan_params}

        def stream(batch_rows: int) -> pa.RecordBatchReader:
            return self.engine.duck().stream(text, {"scan": self.scan()}, params, batch_rows, query=self.names())
        t1 = time.perf_counter()
        self.timings["scan" if self.narrowed is None else "fetch"] = t1 - t0
        out = self.run_small(plan, table)
        if out is not None:
            self.timings["arrow"] = time.perf_counter() - t1
            return Result(out.column_names, table=out, access=plan.access)
        try:
            out = self.engine.duck().run(text, {"scan": table}, params, self.engine.max_result_bytes,
                                         query=self.names())
        except OutputTooLarge as e:
            return self.refused(e.columns, e.rows, e.nbytes, False, stream)
        finally:
            self.timings["duckdb"] = time.perf_counter() - t1
        return Result(out.column_names, table=out, access=plan.access)

    def small_plan(self) -> small.SmallPlan | None:
        """The Arrow plan of an aggregate over the few rows the index matched (rtindex/sql/small.py),
        when the frame columns it reads are plain typed columns; else None (DuckDB runs it)."""
        if self.narrowed is None or len(self.narrowed) > SMALL_ROWS:
            return None
        found = small.compile_plan(self.q.duck_sql)
        if found is None or any(self._frame_columns.get(c) is None for c in found.columns):
            return None
        return found

    def run_small(self, plan: Plan, table: pa.Table) -> pa.Table | None:
        """small_plan's result over the narrowed scan ``table``, or None for DuckDB to run."""
        found = self.small_plan()
        if found is None:
            return None
        limit, offset = self.limits()
        out = found.run({c: table.column(self._frame_columns[c]).combine_chunks() for c in found.columns},
                        table.num_rows, limit, offset)
        budget = self.engine.max_result_bytes
        if out is None or (budget is not None and out.nbytes > budget):
            return None  # (DuckDB's run measures it and refuses it, with a stream to read it)
        plan.arrow = True
        return out

    def scan_kinds(self, table: pa.Table) -> dict[tuple[str, ...], tuple[dict[int, str], bool]]:
        """(typed columns of the kinds present, an int beyond 2**53?) of each field that holds
        values of several kinds in the collection, over the rows WHERE selects: what types it
        (frames.value_sql), as the index path types it by the rows it fetches. One pass of
        counts, only when some field is mixed."""
        mixed = {}
        for path in self.q.fields:
            cols = {tag: f'"{c}"' for (p, tag), c in self._scan_cols.items() if p == path}
            if frames.mixing(set(cols), big_ints=True) is not None:
                mixed[path] = cols
        if not mixed:
            return {}
        aggs = {path: frames.kinds_sql(cols) for path, cols in mixed.items()}
        where = f" WHERE {self._scan_where}" if self._scan_where else ""
        selects = [a for path in aggs for a in aggs[path]]
        text = f'SELECT {", ".join(f"{a} AS k{i}" for i, a in enumerate(selects))} FROM "scan"{where}'
        counts = iter(self.engine.duck().run(text, {"scan": table}, self._scan_params, query=self.names())
                      .to_pylist()[0].values())
        return {path: frames.scan_kinds(mixed[path], [next(counts) for _ in aggs[path]]) for path in mixed}


def snapshot_of(lookup: Callable[[str], Any], q: Query) -> Snapshot:
    """A snapshot of the collection ``q`` reads (``lookup``: name -> Collection)."""
    try:
        coll = lookup(q.collection)
    except NotFoundError:
        raise SqlError(f"no collection {q.collection!r}", q.sql) from None
    return coll.snapshot()


def result_warnings(engine: SqlEngine, q: Query, snap: Snapshot, leaves: list[P.Pred]) -> list[str]:
    """Result.warnings: fields no document of the collection has (messages.query_warnings).

    Worked out again only when rows were written since (per shard ``next_row_id``): a
    field that deletes alone made disappear is noticed at the next write."""
    key, written = (q.collection, q.sql), snap.next_row_ids
    memo = engine.warnings_memo.get(key)
    if memo is not None and memo[0] == written:
        return list(memo[1])
    found = []
    if snap.count():
        def exists(path: tuple[str, ...]) -> bool:
            return bool(snap.column_types(path)) or any(snap.has_type(path, t) for t in keys.TAGS_BY_NAME)
        used = list(q.fields) + [leaf.path for leaf in leaves]
        found = messages.query_warnings(q.sql, q.collection, used, exists, snap.field_paths)
    if len(engine.warnings_memo) >= WARNINGS_MEMO:
        engine.warnings_memo.clear()
    engine.warnings_memo[key] = (written, found)
    return list(found)


def bind_operand(operand: P.Operand, params: Mapping | Sequence, sql: str) -> Any:
    """The value an operand compares as (datetimes as microseconds)."""
    if isinstance(operand, P.Const):
        return operand.value
    return P.check_value(operand_value(operand, params, sql), sql, operand.position)


def int_param(operand: P.Operand | None, params: Mapping | Sequence, sql: str) -> int | None:
    """The value of a LIMIT or OFFSET operand (None: there is none)."""
    if operand is None:
        return None
    v = operand.value if isinstance(operand, P.Const) else params[operand.key]
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise SqlError(f"LIMIT and OFFSET take a non-negative integer, not {v!r}", sql)
    return v


def operand_value(operand: P.Operand, params: Mapping | Sequence, sql: str) -> Any:
    """The value of an operand as given or computed (a datetime stays one)."""
    if isinstance(operand, P.Const):
        return operand.value
    if isinstance(operand, P.Call):
        return P.call_value(operand.name, operand_value(operand.arg, params, sql), sql, operand.position)
    return params[operand.key]


def duck_param_values(ops: dict[str, P.Operand], params: Mapping | Sequence, sql: str) -> dict[str, Any]:
    """The values of DuckDB parameters: a datetime stays a timestamp (naive means UTC)."""
    out = {}
    for name, op in ops.items():
        v = operand_value(op, params, sql)
        if isinstance(v, datetime):
            out[name] = v if v.tzinfo is not None else v.replace(tzinfo=timezone.utc)
        else:
            out[name] = P.check_value(v, sql, op.position)
    return out


def _check_params(q: Query | MultiQuery, params: Any) -> Mapping | Sequence:
    if q.param_style is None:
        if params:
            raise SqlError("parameters given to a query that has none", q.sql)
        return {}
    if q.param_style == "positional":
        if not isinstance(params, (list, tuple)):
            raise SqlError(f"this query has {q.n_positional} ? parameter(s): pass a list", q.sql)
        if len(params) != q.n_positional:
            raise SqlError(f"this query has {q.n_positional} ? parameter(s), {len(params)} given", q.sql)
        return params
    if type(params) is not dict and not isinstance(params, Mapping):  # (an ABC test costs a microsecond)
        raise SqlError("this query has :name parameters: pass a dict", q.sql)
    return _NamedParams(params, q.sql)


class _NamedParams:
    def __init__(self, params: Mapping, sql: str):
        self.params = params
        self.sql = sql

    def __getitem__(self, key: str) -> Any:
        try:
            return self.params[key]
        except KeyError:
            raise SqlError(f"no value for parameter :{key}", self.sql) from None


def _multi_plan(plans: list[Plan], duckdb_sql: str) -> Plan:
    return Plan(", ".join(p.collection for p in plans), access_of(plans), "each collection read once, into a frame",
                sum(p.total_rows for p in plans), None, sources=plans, duckdb_sql=duckdb_sql)


def pred_text(p: P.Pred, bind) -> str:
    """A predicate as EXPLAIN shows it, with its values bound."""
    if isinstance(p, (P.And, P.Or)):
        word = " AND " if isinstance(p, P.And) else " OR "
        return "(" + word.join(pred_text(q, bind) for q in p.items) + ")"
    if isinstance(p, P.Not):
        return f"NOT {pred_text(p.item, bind)}"
    return _leaf_text(p, bind)


def _leaf_text(leaf: P.Pred, bind) -> str:
    path = ".".join(leaf.path)
    if isinstance(leaf, P.Compare):
        return f"{path} {leaf.op} {bind(leaf.value)!r}"
    if isinstance(leaf, P.IsNull):
        return f"{path} IS NULL"
    if isinstance(leaf, P.IsMissing):
        return f"IS_MISSING({path})"
    if isinstance(leaf, P.Like):
        return f"{path} LIKE {bind(leaf.pattern)!r}"
    return f"ARRAY_CONTAINS({path}, {bind(leaf.value)!r})"
