"""Running a Plan (rtindex/sql/plan.py): fetch the matched rows or scan the columns it names,
hand the rest to DuckDB (or to numpy and Arrow for a small aggregate), build the Result.

Under a result budget (``max_result_bytes``) the size of what a path builds is estimated
from a sample before the rest is fetched, and DuckDB's output is measured as it comes; a
result over the budget comes back unbuilt, with a stream that reads it in batches.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rtindex import keys
from rtindex.duck import DuckEngine, OutputTooLarge, check_time_limit
from rtindex.errors import ResultTooLargeError
from rtindex.rowcache import copy_json, json_bytes
from rtindex.sql import frames, messages, partial, typed
from rtindex.sql import predicates as P
from rtindex.sql.plan import Path, Plan
from rtindex.sql.planner import bind_operand, column_tags, index_text, limits, scan_text, small_plan
from rtindex.sql.result import Result

if TYPE_CHECKING:
    from rtindex.sql.small import SmallPlan

# rows of an index-path result measured to estimate its size before it is fetched in full
SAMPLE_ROWS = 16
# up to this many matched rows, the kinds of values a mixed field holds in them are read from
# the rows (fetched anyway); past it from posting lists, which hold no rows in memory
MIXING_FROM_ROWS = 4096
# rows of a first fetch that show how fast the rest will come (see _Run.fetch), and about how
# long, in seconds, each later step may take before the query's time limit is checked again
FETCH_PROBE_ROWS = 2048
FETCH_STEP_SECONDS = 0.1


def execute(plan: Plan, duck: Callable[[], DuckEngine], max_result_bytes: int | None) -> Result:
    """Run ``plan`` (``duck``: the DuckDB engine, started when first needed); ``Result.plan`` is ``plan`` with the DuckDB text that ran (typed by the
    rows read) and whether numpy and Arrow aggregated instead. ``Result.timings``: seconds
    per stage (fetch or scan, duckdb or arrow)."""
    return _Run(plan, duck, max_result_bytes).result()


def scan_frame(plan: Plan, duck: Callable[[], DuckEngine]) -> tuple[pa.Table, dict[str, str | None]]:
    """The frame a scan plan reads into (no result budget: a frame is an input), and the
    types of its columns."""
    run = _Run(plan, duck, None)
    res = run.run_scan()
    return res.arrow(), run.frame_types


def fetch_in_steps(snap, rows, limit: int | None = None, offset: int = 0, copy: bool = True,
                   charge: list[int] | None = None) -> list[dict]:
    """``snap.fetch`` of ``rows``, with the query's time limit checked on the way: rows the
    row cache does not hold are read and decoded one at a time, the slow part of the index
    path. A first FETCH_PROBE_ROWS show how slow; the rest comes in steps of about
    FETCH_STEP_SECONDS (each step costs a pass over the row set, so rows that come fast come
    in few steps; a step is at most 4 times the one before, whose rows may all have been
    cached when the next ones are not)."""
    total = max(0, len(rows) - offset)
    total = total if limit is None else min(total, limit)
    out: list[dict] = []
    step = FETCH_PROBE_ROWS
    while len(out) < total:
        if out:
            check_time_limit()
        t0 = time.perf_counter()
        got = snap.fetch(rows, min(step, total - len(out)), offset=offset + len(out), copy=copy, charge=charge)
        if not got:
            break
        out += got
        per_row = (time.perf_counter() - t0) / len(got)
        step = min(4 * step, max(FETCH_PROBE_ROWS, int(FETCH_STEP_SECONDS / per_row) if per_row > 0 else total))
    return out


class _Run:
    """One execution of a plan: what it reads and measures on the way."""

    def __init__(self, plan: Plan, duck: Callable[[], DuckEngine], budget: int | None):
        self.plan = plan
        self.q = plan.query
        self.snap = plan.snapshot
        self.rows = plan.rows
        self.duck = duck
        self.budget = budget
        self.timings: dict[str, float] = {}
        self.ran_sql: str | None = plan.duckdb_sql
        self.arrow = False
        self.partial_sql: str | None = None  # run next to the data (a snapshot that can: a cluster's)
        self.frame_types: dict[str, str | None] = {}
        self._mixing: dict[Path, str | None] | None = None  # of a plain projection's fields

    def result(self) -> Result:
        plan = self.plan
        if plan.access == "scan" or plan.by_column:
            res = self.run_scan()
        elif self.q.plain is not None:
            res = self.run_plain()
            self.ran_sql = None
        else:
            res = self.run_index_duck()
        res.plan = replace(plan, duckdb_sql=self.ran_sql, arrow=self.arrow, partial_sql=self.partial_sql)
        res.timings = self.timings
        return res

    def bind(self, operand: P.Operand) -> Any:
        return bind_operand(operand, self.plan.params, self.q.sql)

    # -- the index path without DuckDB ------------------------------------------------
    def run_plain(self) -> Result:
        """Documents or a plain projection: the rows are built right here, without DuckDB."""
        q = self.q
        limit, offset = limits(self.plan)
        n_out = max(0, len(self.rows) - offset)
        if limit is not None:
            n_out = min(n_out, limit)
        columns = None if q.star else q.outputs
        t0 = time.perf_counter()

        def chunks(batch_rows: int) -> Iterator[list[dict]]:
            for start in range(0, n_out, batch_rows):
                yield self.plain_rows(self.snap.fetch(self.rows, min(batch_rows, n_out - start),
                                                      offset=offset + start, copy=False))

        def stream(batch_rows: int) -> pa.RecordBatchReader:
            return frames.rows_reader(lambda: chunks(batch_rows), columns)
        budget = self.budget
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
        rows = self.plain_rows(self.fetch(limit, offset, copy=copy, charge=charge))
        if not measure:
            return rows, 0
        return rows, charge[0] if charge is not None else json_bytes(rows)

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

    def plain_mixing(self) -> dict[Path, str | None]:
        """frames.mixing of each projected field over the matched rows: nothing to learn where
        the whole collection holds one kind; else from the values when the query reads every
        matched row and they are few, else from posting lists (LIMIT or OFFSET leaves some
        unread, or a result too large to hold twice, maybe over max_result_bytes)."""
        out, docs = {}, None
        limit, offset = limits(self.plan)
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

    def column_tags(self, path: Path) -> tuple[int, ...]:
        tags = self.plan.tags.get(path)
        return tags if tags is not None else column_tags(self.snap, path)

    # -- the index path with DuckDB ---------------------------------------------------
    def run_index_duck(self) -> Result:
        """Aggregates, ORDER BY, expressions: DuckDB over a frame of the fields they use."""
        q = self.q
        budget = self.budget
        t0 = time.perf_counter()
        docs = self.fetch(copy=False)  # shared, read-only: only read into Arrow
        frame = self.frame(docs)
        t1 = time.perf_counter()
        self.timings["fetch"] = t1 - t0
        text, params = index_text(self.plan, typed.columns_of(frame.schema)), dict(self.plan.duck_params)
        self.ran_sql = text

        def stream(batch_rows: int) -> pa.RecordBatchReader:
            frame = self.frame(self.snap.fetch(self.rows, copy=False))
            return self.duck().stream(text, {"frame": frame}, params, batch_rows, query=self.names())
        try:
            out = self.duck().run(text, {"frame": frame}, params, None if q.star else budget, query=self.names())
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
        out = self.duck().run(index_text(self.plan, typed.columns_of(frame.schema)), {"frame": frame},
                            dict(self.plan.duck_params), query=self.names())

        def chunks() -> Iterator[list[dict]]:
            for batch in out.to_batches(batch_rows):
                yield self.star_rows(batch, docs, copy=False)
        return frames.rows_reader(chunks)

    def fetch(self, limit: int | None = None, offset: int = 0, copy: bool = True,
              charge: list[int] | None = None) -> list[dict]:
        return fetch_in_steps(self.snap, self.rows, limit, offset, copy, charge)

    def frame(self, docs: list[dict]) -> pa.Table:
        """The table DuckDB reads on the index path: the fields the query uses (with the shadow
        columns of those mixed ones it compares), and ``__pos``, each row's position in
        ``docs`` (also: a frame needs one column)."""
        named: list[tuple[str, pa.Array]] = []
        for path, name in self.q.fields.items():
            check_time_limit()  # a field of many rows is a step of its own
            vals = frames.values(docs, path)
            col = frames.nulls_typed(frames.column(vals, path), list(self.column_tags(path)))
            named.extend(typed.with_shadows(name, vals, col, self.plan.compared))
        named.append(("__pos", pa.array(np.arange(len(docs), dtype=np.int64))))
        return frames.table([n for n, _ in named], [c for _, c in named])

    def star_rows(self, out: pa.Table | pa.RecordBatch, docs: list[dict], copy: bool) -> list[dict]:
        """``SELECT *, <expressions>`` rows: the documents at ``out``'s ``__pos``, plus its other columns."""
        extras = [n for n in out.column_names if n != "__pos"]
        rows = []
        for i, r in enumerate(out.to_pylist()):
            if not i % FETCH_PROBE_ROWS:
                check_time_limit()
            d = copy_json(docs[r["__pos"]]) if copy else docs[r["__pos"]]
            row = {k: v for k, v in d.items() if k not in self.q.star_except}
            row.update((n, r[n]) for n in extras)
            rows.append(row)
        return rows

    # -- the column scan (or the index path reading by column) --------------------------
    def run_scan(self) -> Result:
        # (a scan of the rows an index lookup matched is small: its columns travel cheaper than
        # a DuckDB statement in every group)
        if hasattr(self.snap, "partial") and not self.plan.by_column and not self.mixed_fields():
            pushed = self.run_partial()
            if pushed is not None:
                return pushed
        t0 = time.perf_counter()
        table = self.scan()
        check_time_limit()
        kinds = self.scan_kinds(table)
        if kinds:  # mixed fields: typed by the kinds the rows read hold
            text, self.frame_types, frame_columns = scan_text(self.plan, kinds)
        else:
            spec = self.plan.scan
            text, self.frame_types, frame_columns = self.plan.duckdb_sql, dict(spec.frame_types), spec.frame_columns
        self.ran_sql = text
        params = {**self.plan.duck_params, **self.plan.scan.where_params}

        def stream(batch_rows: int) -> pa.RecordBatchReader:
            return self.duck().stream(text, {"scan": self.scan()}, params, batch_rows, query=self.names())
        t1 = time.perf_counter()
        self.timings["scan" if not self.plan.by_column else "fetch"] = t1 - t0
        found = self.plan.small if not kinds else (small_plan(self.plan, frame_columns) if self.plan.small else None)
        out = self.run_small(found, frame_columns, table) if found is not None else None
        if out is not None:
            self.timings["arrow"] = time.perf_counter() - t1
            self.arrow = True
            return Result(out.column_names, table=out, access=self.plan.access)
        try:
            out = self.duck().run(text, {"scan": table}, params, self.budget, query=self.names())
        except OutputTooLarge as e:
            return self.refused(e.columns, e.rows, e.nbytes, False, stream)
        finally:
            self.timings["duckdb"] = time.perf_counter() - t1
        return Result(out.column_names, table=out, access=self.plan.access)

    def run_partial(self) -> Result | None:
        """An aggregate over the scan, split (rtindex/sql/partial.py): each part of the data
        aggregates where it lives (``snap.partial``: a cluster's query actors), DuckDB merges
        their rows here. None: the text does not split; the rows come here instead."""
        halves = partial.split(self.plan.duckdb_sql) if self.plan.duckdb_sql else None
        if halves is None:
            return None
        params = {**self.plan.duck_params, **self.plan.scan.where_params}
        t0 = time.perf_counter()
        parts = self.snap.partial(list(self.plan.scan.columns), self.rows if self.plan.by_column else None,
                                  halves.partial, _used(params, halves.partial))
        t1 = time.perf_counter()
        self.timings["scan" if not self.plan.by_column else "fetch"] = t1 - t0
        text, tables = partial.final_over(halves.final, parts)
        self.ran_sql, self.partial_sql = text, halves.partial
        final = _used(params, text)

        def stream(batch_rows: int) -> pa.RecordBatchReader:
            return self.duck().stream(text, tables, final, batch_rows, query=self.names())
        try:
            out = self.duck().run(text, tables, final, self.budget, query=self.names())
        except OutputTooLarge as e:
            return self.refused(e.columns, e.rows, e.nbytes, False, stream)
        finally:
            self.timings["duckdb"] = time.perf_counter() - t1
        return Result(out.column_names, table=out, access=self.plan.access)

    def scan(self) -> pa.Table:
        """The columns the plan's scan reads, named as its DuckDB text names them."""
        specs = self.plan.scan.columns
        table = self.snap.scan(list(specs), rows=self.rows if self.plan.by_column else None)
        return table.rename_columns(["_shard", "_row_id"] + [f"c{i}" for i in range(len(specs))])

    def run_small(self, found: SmallPlan, frame_columns: dict[str, str | None], table: pa.Table) -> pa.Table | None:
        """``found``'s result over the narrowed scan ``table``, or None for DuckDB to run."""
        limit, offset = limits(self.plan)
        out = found.run({c: table.column(frame_columns[c]).combine_chunks() for c in found.columns},
                        table.num_rows, limit, offset)
        if out is None or (self.budget is not None and out.nbytes > self.budget):
            return None  # (DuckDB's run measures it and refuses it, with a stream to read it)
        return out

    def mixed_fields(self) -> dict[Path, dict[int, str]]:
        """The scan columns, by type tag, of each field the query uses that holds values of
        several kinds in the collection."""
        spec = self.plan.scan
        mixed = {}
        for path in self.q.fields:
            cols = {tag: f'"{c}"' for (p, tag), c in spec.names.items() if p == path}
            if frames.mixing(set(cols), big_ints=True) is not None:
                mixed[path] = cols
        return mixed

    def scan_kinds(self, table: pa.Table) -> dict[Path, tuple[dict[int, str], bool]]:
        """(typed columns of the kinds present, an int beyond 2**53?) of each field that holds
        values of several kinds in the collection, over the rows WHERE selects: what types it
        (frames.value_sql), as the index path types it by the rows it fetches. One pass of
        counts, only when some field is mixed."""
        spec = self.plan.scan
        mixed = self.mixed_fields()
        if not mixed:
            return {}
        aggs = {path: frames.kinds_sql(cols) for path, cols in mixed.items()}
        where = f" WHERE {spec.where}" if spec.where else ""
        selects = [a for path in aggs for a in aggs[path]]
        text = f'SELECT {", ".join(f"{a} AS k{i}" for i, a in enumerate(selects))} FROM "scan"{where}'
        counts = iter(self.duck().run(text, {"scan": table}, dict(spec.where_params), query=self.names())
                      .to_pylist()[0].values())
        return {path: frames.scan_kinds(mixed[path], [next(counts) for _ in aggs[path]]) for path in mixed}

    # -- what every path shares -----------------------------------------------------
    def refused(self, columns: list[str] | None, rows: int, size: int, estimated: bool,
                stream: Callable[[int], pa.RecordBatchReader]) -> Result:
        """A Result over the budget: its rows are not built (reading them raises
        ResultTooLargeError), ``stream`` reads it in batches."""
        error = ResultTooLargeError(rows, size, self.budget, estimated=estimated, sql=self.q.sql)
        return Result(columns, access=self.plan.access, refused=error, stream=stream)

    def names(self) -> tuple[str, Callable[[str], str]]:
        """The user's text, and a DuckDB error's message told in its terms: the internal
        names of its DuckDB statements replaced by what they stand for (messages.duckdb_error)."""
        names = {f: ".".join(p) for p, f in self.q.fields.items()}
        if self.plan.scan is not None:
            names.update((c, ".".join(p)) for (p, _), c in self.plan.scan.names.items())
        names.update((n, "a parameter") for n in self.q.duck_params)
        names["__pos"] = "*"
        return self.q.sql, lambda message: messages.duckdb_error(message, names)


def _used(params: dict[str, Any], text: str) -> dict[str, Any]:
    """The parameters ``text`` names (DuckDB refuses others)."""
    return {k: v for k, v in params.items() if re.search(rf"\${re.escape(k)}\b", text)}
