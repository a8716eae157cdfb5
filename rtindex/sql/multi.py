"""Runs a MultiQuery (rtindex/sql/sources.py): one frame per collection, then DuckDB over them.

Each collection of the query is read once, from one snapshot, by the access path its cost
picks (rtindex/sql/engine.py's planner, unchanged): the index narrows it to the union of its
references' index parts, or the column scan reads it. Its frame holds the fields the query
uses, typed by the rows read (docs/sql.md), every top-level field when a ``*`` reads it, and
one mask column per reference when the references' index parts differ. DuckDB then runs the
rewritten query over the frames; the result budget (``max_result_bytes``) applies to that
result, not to the frames (they are inputs).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rtindex.result import Result
from rtindex.sql import frames, typed
from rtindex.sql import predicates as P
from rtindex.sql.execute import OutputTooLarge
from rtindex.sql.sources import MultiQuery, Reference, Source

if TYPE_CHECKING:
    from rtindex.sql.engine import Plan, SqlEngine, _Execution


class _FrameEngine:
    """The SqlEngine as an access path that reads a frame sees it: without the result budget
    (a frame is an input of the query, not its result)."""

    max_result_bytes = None

    def __init__(self, engine: SqlEngine):
        self._lookup = engine._lookup
        self.duck = engine.duck
        self.warnings_memo = engine.warnings_memo


class MultiExecution:
    """One execution of a MultiQuery: bound parameters, one snapshot per collection."""

    def __init__(self, engine: SqlEngine, q: MultiQuery, params: Any, access: str | None):
        from rtindex.sql.engine import _check_params, _Execution  # engine dispatches to this module
        self.engine = engine
        self.q = q
        self.params = _check_params(q, params)
        self.runs: list[_Execution] = []
        home: dict[int, int] = {}
        compared = typed.compared(q.duck_sql)  # a mixed field it compares gets shadow columns (typed)
        for i, src in enumerate(q.sources):
            # masks are computed on posting lists: such a collection is read by the index path
            forced = "index" if src.masks else access
            self.runs.append(_Execution(_FrameEngine(engine), q.source_query(src, dict(src.fields)), params, forced))
            self.runs[-1].outer_compared = compared
            home.update((id(ref), i) for ref in src.references)
        for candidates, path, fallback in q.unresolved:  # unqualified, in a SELECT over several
            where = list(dict.fromkeys(home[id(ref)] for ref in candidates))
            holding = [i for i in where if self.runs[i].snap.column_types(path)]
            for i in holding or (where[:1] if fallback else []):
                self.runs[i].q.fields.setdefault(path, ".".join(path))
        self.timings: dict[str, float] = {}
        self.duckdb_sql: str | None = None  # the text run() gave DuckDB

    def plans(self, explain: bool = False) -> list[Plan]:
        plans = [run.choose(explain=explain) for run in self.runs]
        for src, plan in zip(self.q.sources, plans):
            if src.masks:
                plan.reason = "references with different index parts: their union, a mask per reference"
        return plans

    def frames(self, plans: list[Plan]) -> dict[str, pa.Table]:
        """The frame of each collection, by the name the DuckDB text reads it as."""
        return {src.frame: self.frame(run, plan, src) for src, run, plan in zip(self.q.sources, self.runs, plans)}

    def duck_text(self, tables: dict[str, pa.Table], params: dict[str, Any]) -> str:
        """The DuckDB text with rule 2 applied over these frames (typed.rewrite); ``params``:
        :meth:`duck_params`."""
        return typed.rewrite(self.q.duck_sql, {name: typed.columns_of(t.schema) for name, t in tables.items()},
                             params)

    def run(self, plans: list[Plan]) -> Result:
        t0 = time.perf_counter()
        tables = self.frames(plans)
        t1 = time.perf_counter()
        self.timings["fetch"] = t1 - t0
        params = self.duck_params()
        duck = self.engine.duck()
        budget = self.engine.max_result_bytes
        access = access_of(plans)
        text = self.duckdb_sql = self.duck_text(tables, params)

        def stream(batch_rows: int) -> pa.RecordBatchReader:
            return duck.stream(text, tables, params, batch_rows)
        try:
            out = duck.run(text, tables, params, budget)
        except OutputTooLarge as e:
            from rtindex.errors import ResultTooLargeError
            error = ResultTooLargeError(e.rows, e.nbytes, budget, estimated=False, sql=self.q.sql)
            return Result(e.columns, access=access, refused=error, stream=stream)
        finally:
            self.timings["duckdb"] = time.perf_counter() - t1
        return Result(out.column_names, table=out, access=access)

    def duck_params(self) -> dict[str, Any]:
        from rtindex.sql.engine import duck_param_values
        return duck_param_values(self.q.duck_params, self.params, self.q.sql)

    def frame(self, run: _Execution, plan: Plan, src: Source) -> pa.Table:
        """The frame of one collection: its rows the access path read, as Arrow columns."""
        run.plan = plan
        if plan.access == "scan":  # a mixed field's text column is large_string, as on the index path
            table = run.run_scan(plan).arrow()
            return table.cast(pa.schema([f.with_type(pa.large_string())
                                         if run.scan_frame_types.get(f.name) == typed.MIXED_TEXT else f
                                         for f in table.schema]))
        docs = run.snap.fetch(run.rows, copy=False)  # shared, read-only: only read into Arrow
        paths: dict[tuple[str, ...], str] = {}
        if src.star:  # every top-level field, in order of first appearance (as SELECT * shows them)
            for d in docs:
                for k in d:
                    paths.setdefault((k,), k)
        for path, name in run.q.fields.items():
            paths.setdefault(path, name)
        compared = run.compared()
        named: list[tuple[str, pa.Array]] = []
        for path, name in paths.items():
            vals = frames.values(docs, path)
            named.extend(typed.with_shadows(name, vals, frames.column(vals, path), compared))
        names, cols = [n for n, _ in named], [c for _, c in named]
        if src.masks:
            evaluator = P.IndexEvaluator(run.snap, run.bind)
            for name, part in src.masks.items():
                names.append(name)
                cols.append(pa.array(_members(run.rows, evaluator.true(part))))
        if not names:  # a frame of no fields still has its rows
            names, cols = ["__one"], [pa.array(np.ones(len(docs), dtype=np.int8))]
        return frames.table(names, cols)


def access_of(plans: list[Plan]) -> str:
    """``index`` or ``scan`` when every collection was read one way, else ``index+scan``;
    ``none`` for a query that reads no collection (``SELECT 1 + 1``)."""
    kinds = sorted({p.access for p in plans})
    return kinds[0] if len(kinds) == 1 else "+".join(kinds) if kinds else "none"


def _members(rows, part) -> np.ndarray:
    """For each row of ``rows`` (in fetch order), whether it is in ``part``."""
    inside = part.by_shard()
    out = [np.isin(ids, inside.get(shard, np.empty(0, dtype=np.uint64))) for shard, ids in rows.by_shard().items()]
    return np.concatenate(out) if out else np.zeros(0, dtype=bool)


def reference_lines(run: _Execution, plan: Plan, refs: list[Reference]) -> list[str]:
    """EXPLAIN's lines for the references of one collection: index part, residual, rows."""
    from rtindex.sql.engine import pred_text
    lines = []
    for ref in refs:
        if ref.index is None:
            n = plan.total_rows
        else:
            n = len(P.IndexEvaluator(run.snap, run.bind).true(ref.index))
        part = pred_text(ref.index, run.bind) if ref.index is not None else "none"
        lines.append(f"  reference {ref.collection} AS {ref.alias}: index part: {part}; "
                     f"residual: {ref.residual or 'none'}; estimated rows: {n}")
    return lines
