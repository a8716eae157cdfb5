"""Runs a MultiQuery (rtindex/sql/sources.py): one frame per collection, then DuckDB over them.

Each collection of the query is read once, from one snapshot, by the access path its cost
picks (rtindex/sql/planner.py, as for a query over one collection): the index narrows it to
the union of its references' index parts, or the column scan reads it. Its frame holds the fields the query
uses, typed by the rows read (docs/sql.md), every top-level field when a ``*`` reads it, and
one mask column per reference when the references' index parts differ. DuckDB then runs the
rewritten query over the frames; the result budget (``max_result_bytes``) applies to that
result, not to the frames (they are inputs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import numpy as np
import pyarrow as pa

from rtindex.duck import DuckEngine, OutputTooLarge, check_time_limit
from rtindex.errors import ResultTooLargeError
from rtindex.sql import frames, messages, planner, typed
from rtindex.sql import predicates as P
from rtindex.sql.executor import fetch_in_steps, scan_frame
from rtindex.sql.plan import Plan
from rtindex.sql.result import Result
from rtindex.sql.sources import MultiQuery, Reference, Source


def plan(q: MultiQuery, lookup: Callable[[str], Any], params: Any, access: str | None, *,
         explain: bool = False) -> Plan:
    """The plan of ``q``: one plan per collection it reads (``lookup``: name -> Collection),
    each made as for a query over that collection alone; with ``explain``, the lines of each
    reference and the DuckDB text typed by what the index knows of the frames."""
    checked = planner.check_params(q, params)
    snaps = [planner.snapshot_of(lookup, src.collection, q.sql) for src in q.sources]
    fields = [dict(src.fields) for src in q.sources]
    home = {id(ref): i for i, src in enumerate(q.sources) for ref in src.references}
    for candidates, path, fallback in q.unresolved:  # unqualified, in a SELECT over several
        where = list(dict.fromkeys(home[id(ref)] for ref in candidates))
        holding = [i for i in where if snaps[i].column_types(path)]
        for i in holding or (where[:1] if fallback else []):
            fields[i].setdefault(path, ".".join(path))
    compared = typed.compared(q.duck_sql)  # a mixed field it compares gets shadow columns (typed)
    plans = []
    for src, snap, own in zip(q.sources, snaps, fields):
        # masks are computed on posting lists: such a collection is read by the index path
        p = planner.plan(q.source_query(src, own), snap, params, "index" if src.masks else access,
                         explain=explain, outer_compared=compared)
        if src.masks:
            p = replace(p, reason="references with different index parts: their union, a mask per reference")
        if explain:
            p = replace(p, references=tuple(reference_lines(p, src.references)))
        plans.append(p)
    duck_params = MappingProxyType(planner.duck_param_values(q.duck_params, checked, q.sql))
    text = None
    if explain:
        text = typed.rewrite(q.duck_sql, {src.frame: {**planner.frame_types(p), **{m: typed.BOOL for m in src.masks}}
                                          for src, p in zip(q.sources, plans)}, duck_params)
    return Plan(", ".join(p.collection for p in plans), access_of(plans), "each collection read once, into a frame",
                sum(p.total_rows for p in plans), None, sources=tuple(plans), duckdb_sql=text, query=q,
                params=checked, duck_params=duck_params)


def execute(plan: Plan, duck: Callable[[], DuckEngine], budget: int | None) -> Result:
    """Run a plan of :func:`plan`: the frames, then DuckDB over them (the result budget
    applies to its result, not to the frames)."""
    q = plan.query
    t0 = time.perf_counter()
    tables = {src.frame: _frame(p, src, duck) for src, p in zip(q.sources, plan.sources)}
    t1 = time.perf_counter()
    params = dict(plan.duck_params)
    text = typed.rewrite(q.duck_sql, {name: typed.columns_of(t.schema) for name, t in tables.items()}, params)
    timings = {"fetch": t1 - t0}

    told = (q.sql, lambda message: messages.duckdb_error(message, {}))

    def stream(batch_rows: int) -> pa.RecordBatchReader:
        return duck().stream(text, tables, params, batch_rows, query=told)
    try:
        out = duck().run(text, tables, params, budget, query=told)
        res = Result(out.column_names, table=out, access=plan.access)
    except OutputTooLarge as e:
        error = ResultTooLargeError(e.rows, e.nbytes, budget, estimated=False, sql=q.sql)
        res = Result(e.columns, access=plan.access, refused=error, stream=stream)
    finally:
        timings["duckdb"] = time.perf_counter() - t1
    res.plan = replace(plan, duckdb_sql=text)
    res.timings = timings
    return res


def _frame(plan: Plan, src: Source, duck: Callable[[], DuckEngine]) -> pa.Table:
    """The frame of one collection: its rows the access path read, as Arrow columns."""
    if plan.access == "scan":  # a mixed field's text column is large_string, as on the index path
        table, frame_types = scan_frame(plan, duck)
        return table.cast(pa.schema([f.with_type(pa.large_string()) if frame_types.get(f.name) == typed.MIXED_TEXT
                                     else f for f in table.schema]))
    snap, rows, q = plan.snapshot, plan.rows, plan.query
    docs = fetch_in_steps(snap, rows, copy=False)  # shared, read-only: only read into Arrow
    paths: dict[tuple[str, ...], str] = {}
    if src.star:  # every top-level field, in order of first appearance (as SELECT * shows them)
        for d in docs:
            for k in d:
                paths.setdefault((k,), k)
    for path, name in q.fields.items():
        paths.setdefault(path, name)
    named: list[tuple[str, pa.Array]] = []
    for path, name in paths.items():
        check_time_limit()  # a field of many rows is a step of its own
        vals = frames.values(docs, path)
        named.extend(typed.with_shadows(name, vals, frames.column(vals, path), plan.compared))
    names, cols = [n for n, _ in named], [c for _, c in named]
    if src.masks:
        evaluator = P.IndexEvaluator(snap, lambda op: planner.bind_operand(op, plan.params, q.sql))
        for name, part in src.masks.items():
            names.append(name)
            cols.append(pa.array(_members(rows, evaluator.true(part))))
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


def reference_lines(plan: Plan, refs: list[Reference]) -> list[str]:
    """EXPLAIN's lines for the references of one collection: index part, residual, rows."""
    def bind(op: P.Operand) -> Any:
        return planner.bind_operand(op, plan.params, plan.query.sql)
    lines = []
    for ref in refs:
        n = plan.total_rows if ref.index is None else len(P.IndexEvaluator(plan.snapshot, bind).true(ref.index))
        part = planner.pred_text(ref.index, bind) if ref.index is not None else "none"
        lines.append(f"  reference {ref.collection} AS {ref.alias}: index part: {part}; "
                     f"residual: {ref.residual or 'none'}; estimated rows: {n}")
    return lines
