"""The plan of one query as a value: what runs, over which rows, and why.

The planner (rtindex/sql/planner.py) makes it from a checked query, a snapshot and the
parameters; the executor (rtindex/sql/executor.py) runs it; EXPLAIN prints it. Nothing in a
plan changes after it is made: what a run learns (the DuckDB text typed by the rows it
read, an aggregate done without DuckDB) is in the copy that ``Result.plan`` holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from rtindex.snapshot import Postings, Snapshot
    from rtindex.sql.parse import Query
    from rtindex.sql.small import SmallPlan

Path = tuple[str, ...]


@dataclass(frozen=True)
class ScanSpec:
    """What the column scan reads, and the DuckDB text over it.

    ``columns``: (field, type name) of each typed column read, in order (DuckDB reads the
    i-th as ``c<i>``); ``names``: (field, type tag) -> that name. ``where``/``where_params``:
    the WHERE compiled to typed column expressions (empty when the index applied it).
    ``frame_types``/``frame_columns``: the types of the frame's columns, and the scan
    column each one is when just one, as the planner's text has them (by the collection's
    kinds of values; a run that finds fewer in the rows it reads types them again)."""

    columns: tuple[tuple[Path, str], ...]
    names: Mapping[tuple[Path, int], str]
    where: str
    where_params: Mapping[str, Any]
    frame_types: Mapping[str, str | None] = field(default_factory=dict)
    frame_columns: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """What runs for one execution of a query, and why: EXPLAIN prints it."""

    collection: str
    access: str  # "index" or "scan" ("index+scan", "none": a query over several collections)
    reason: str
    total_rows: int
    matched_rows: int | None  # exact, from posting lists (None: the scan was chosen first)
    predicates: tuple[tuple[str, int | None], ...] = ()  # leaf, rows where TRUE (EXPLAIN only)
    index_cost_us: float | None = None
    scan_cost_us: float | None = None
    duckdb_sql: str | None = None
    residual: str | None = None  # the part of WHERE the index does not answer: DuckDB evaluates it
    by_column: bool = False  # index path: the fields are read from the column store at the matched rows
    arrow: bool = False  # the aggregate is computed with numpy and Arrow, not DuckDB (rtindex/sql/small.py)
    partial_sql: str | None = None  # on a cluster: the partial aggregate each group ran (rtindex/sql/partial.py)
    # a query over collection references: the plan of each collection it reads, and lines
    # on its references (index part, residual, estimated rows)
    sources: tuple[Plan, ...] = ()
    references: tuple[str, ...] = ()
    placement: tuple[str, ...] = ()  # on a cluster: lines on what ran where (rtindex/cluster/database.py)
    # what the executor reads (not shown, not compared)
    query: Query | None = field(default=None, repr=False, compare=False)
    snapshot: Snapshot | None = field(default=None, repr=False, compare=False)
    params: Any = field(default=None, repr=False, compare=False)  # checked parameters
    duck_params: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    rows: Postings | None = field(default=None, repr=False, compare=False)  # the index path's row set
    tags: Mapping[Path, tuple[int, ...]] = field(default_factory=dict, repr=False, compare=False)
    scan: ScanSpec | None = field(default=None, repr=False, compare=False)
    small: SmallPlan | None = field(default=None, repr=False, compare=False)
    compared: frozenset[str] = field(default=frozenset(), repr=False, compare=False)  # frame columns typed by rule 2
    outer: bool = field(default=False, repr=False, compare=False)  # reads a frame of a query over several collections
    leaves: tuple = field(default=(), repr=False, compare=False)  # WHERE's leaf predicates

    def __str__(self) -> str:
        return "\n".join([self._text(), *self.placement])

    def _text(self) -> str:
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
        if self.partial_sql:
            lines.append(f"  partial aggregate, next to the data: {self.partial_sql}")
        lines.append(f"  DuckDB: {self.duckdb_sql}" if self.duckdb_sql else "  DuckDB: not used")
        return "\n".join(lines)
