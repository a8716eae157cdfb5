"""Planning one query over one collection: binds parameters, evaluates the index part, picks
the access path by cost and returns the Plan (rtindex/sql/plan.py); nothing is fetched or
scanned here.

Access paths (docs/sql.md has the rules, EXPLAIN shows the numbers):

- **index**: WHERE becomes posting-list algebra on the snapshot; the matching rows are
  fetched from the row store. A plain projection (or ``SELECT *``) is answered right there;
  anything else runs in DuckDB over an Arrow table of the fields it needs (read from the
  column store at the matched rows when the column scan could read them: ``by_column``).
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
from dataclasses import replace
from collections.abc import Callable, Mapping, Sequence  # (typing's isinstance is slow)
from datetime import datetime, timezone
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from rtindex import keys
from rtindex.errors import NotFoundError, SqlError
from rtindex.segments import OverBudget
from rtindex.sql import frames, small, typed
from rtindex.sql import predicates as P
from rtindex.sql.plan import Path, Plan, ScanSpec

if TYPE_CHECKING:
    from rtindex.snapshot import Snapshot
    from rtindex.sql.parse import Query
    from rtindex.sql.sources import MultiQuery

# Cost model, in microseconds, from benchmarks/query.py --quick (the measured figures are in
# docs/benchmarks.md, "Queries"): ROW_COST is fetching, decoding and framing one matched
# row; COLUMN_COST reading and filtering one value of one column in a scan.
ROW_COST = 8.0
COLUMN_COST = 0.035
SCAN_OVERHEAD = 400.0
ACCESS = ("index", "scan")
STAR_BLOCKER = "SELECT * reads whole documents"  # why the column scan cannot answer SELECT *
STAR_REASON = f"the column scan cannot: {STAR_BLOCKER}"
# the index path aggregates this many matched rows at most in numpy and Arrow (small.py): beyond
# them DuckDB's per-call cost no longer matters and its threads pay
SMALL_ROWS = 100_000


def plan(q: Query, snap: Snapshot, params: Any, access: str | None = None, *, explain: bool = False,
         outer_compared: frozenset[str] | None = None) -> Plan:
    """The plan of ``q`` over ``snap`` with ``params``. ``access``: force a path where the
    query allows it. ``explain``: also the size of each WHERE leaf and the DuckDB text typed
    by what the index knows of the rows it reads (a run types it by the values it reads).
    ``outer_compared``: ``q`` reads a frame of a query over several collections, which
    compares these frame columns (it types them itself)."""
    if access is not None and access not in ACCESS:
        raise ValueError(f"access must be one of {ACCESS} or None, not {access!r}")
    checked = check_params(q, params)
    p = _Planner(q, snap, checked)
    leaves = tuple(P.leaves(q.where)) if q.where is not None else ()
    for leaf in leaves:  # bad values are errors whichever path runs
        if isinstance(leaf, P.Like):
            P.like_prefix(p.bind(leaf.pattern), q.sql, leaf.position)
        elif isinstance(leaf, (P.Compare, P.ArrayContains)):
            p.bind(leaf.value)
    total = snap.count()
    ncols = max(1, len(set(q.fields) | {leaf.path for leaf in leaves}))
    blocker = p.scan_blocker(leaves)
    chosen, reason, scan_cost = None, "", None
    if blocker is not None:
        chosen, reason = "index", f"the column scan cannot: {blocker}"
        if access == "scan":
            reason += "; access='scan' ignored"
    else:
        scan_cost = total * ncols * COLUMN_COST + SCAN_OVERHEAD
        if access is not None:
            chosen, reason = access, f"access={access!r} requested"
    rows = None
    if chosen != "scan":
        if q.where is None:
            rows = snap.all()
        else:
            budget = [max(1024, int(scan_cost / ROW_COST))] if chosen is None else None
            try:
                rows = P.IndexEvaluator(snap, p.bind, budget).true(q.where)
            except OverBudget:
                rows = None
    matched = len(rows) if rows is not None else None
    index_cost = matched * ROW_COST if matched is not None else None
    if chosen is None:
        if rows is None:
            chosen, reason = "scan", "a range predicate covers more terms than the index path's budget"
        elif index_cost <= scan_cost:
            chosen, reason = "index", "fewer rows to fetch than column values to scan"
        else:
            chosen, reason = "scan", "scanning columns is cheaper than fetching the matched rows"
    # (a frame of a query over several collections is read from the rows)
    by_column = q.plain is None and not q.star and blocker is None and chosen == "index" and outer_compared is None
    compared = outer_compared if outer_compared is not None else typed.compared(q.duck_sql)
    duck_params = MappingProxyType(duck_param_values(q.duck_params, checked, q.sql))
    spec = p.scan_spec(leaves, narrowed=by_column) if chosen == "scan" or by_column else None
    planned = Plan(q.collection, chosen, reason, total, matched, index_cost_us=index_cost, scan_cost_us=scan_cost,
                   residual=q.residual, by_column=by_column, query=q, snapshot=snap, params=checked,
                   duck_params=duck_params, rows=rows if chosen == "index" else None,
                   tags=MappingProxyType(p.tags), scan=spec, compared=compared,
                   outer=outer_compared is not None, leaves=leaves)
    more: dict[str, Any] = {}
    if spec is not None:
        text, types, columns = scan_text(planned)
        found = small_plan(planned, columns) if by_column and matched <= SMALL_ROWS else None
        more.update(duckdb_sql=text, small=found, arrow=found is not None,
                    scan=replace(spec, frame_types=MappingProxyType(types), frame_columns=MappingProxyType(columns)))
    elif explain and q.plain is None:
        more["duckdb_sql"] = index_text(planned, frame_types(planned))
    if explain and q.where is not None:
        more["predicates"] = tuple(p.leaf_sizes(q.where, unbounded=blocker is not None))
    return replace(planned, **more) if more else planned


class _Planner:
    """What planning one query reads of its snapshot, read once."""

    def __init__(self, q: Query, snap: Snapshot, params: Mapping | Sequence):
        self.q = q
        self.snap = snap
        self.params = params
        self.tags: dict[Path, tuple[int, ...]] = {}

    def bind(self, operand: P.Operand) -> Any:
        return bind_operand(operand, self.params, self.q.sql)

    def column_tags(self, path: Path) -> tuple[int, ...]:
        if path not in self.tags:
            self.tags[path] = column_tags(self.snap, path)
        return self.tags[path]

    def scan_blocker(self, leaves: tuple) -> str | None:
        """Why the column scan cannot answer this query (None: it can)."""
        q = self.q
        if q.star:
            return STAR_BLOCKER
        if any(isinstance(x, P.ArrayContains) for x in leaves):
            return "ARRAY_CONTAINS reads array elements"
        for path in q.fields:
            if keys.ARRAY in self.column_tags(path):
                return f"{'.'.join(path)} holds arrays"
        for path in dict.fromkeys(list(q.fields) + [leaf.path for leaf in leaves]):
            if self.snap.has_type(path, "object"):
                return f"{'.'.join(path)} holds objects"
        return None

    def scan_spec(self, leaves: tuple, narrowed: bool) -> ScanSpec:
        """The typed columns the scan reads (the query's fields, and WHERE's unless the index
        applied it: ``narrowed``) and WHERE compiled over them."""
        q = self.q
        names: dict[tuple[Path, int], str] = {}
        columns = []
        read = list(q.fields) + ([] if narrowed else [leaf.path for leaf in leaves])
        for path in dict.fromkeys(read):
            for tag in self.column_tags(path):
                names[(path, tag)] = f"c{len(columns)}"
                columns.append((path, keys.TAG_NAMES[tag]))
        where, where_params = "", {}
        if q.where is not None and not narrowed:
            comp = P.ScanCompiler(lambda p, t: f'"{names[(p, t)]}"' if (p, t) in names else None, self.bind)
            where, where_params = comp.compile(q.where), comp.params
        return ScanSpec(tuple(columns), MappingProxyType(names), where, MappingProxyType(where_params))

    def frame_types(self, rows, compared: frozenset[str]) -> dict[str, str | None]:
        """typed.columns_of the index path's frame, from the kinds of values the index holds
        for ``rows`` (what frames.column makes of them), without reading them."""
        out: dict[str, str | None] = {}
        evaluator = P.IndexEvaluator(self.snap, self.bind)
        for path, name in self.q.fields.items():
            tags = set(self.column_tags(path)) | ({keys.OBJECT} if self.snap.has_type(path, "object") else set())
            kinds, big = evaluator.kinds(path, tags, rows)
            how = frames.mixing(kinds, big)
            if how == frames.TEXT:
                out[name] = typed.MIXED if name in compared else typed.MIXED_TEXT
            elif how == frames.DOUBLE:
                out[name] = typed.NUM
            elif not kinds:  # nulls, typed as the collection's one kind of scalar (frames.nulls_typed)
                scalars = [t for t in tags if t not in (keys.NULL, keys.ARRAY, keys.OBJECT)]
                out[name] = (None if path == frames.EVENT_TIME else typed.family_of_tags(scalars)) \
                    if len(scalars) == 1 else typed.NOTHING
            else:
                out[name] = None if path == frames.EVENT_TIME else typed.family_of_tags(kinds)
        out["__pos"] = typed.NUM
        return out

    def leaf_sizes(self, pred: P.Pred, unbounded: bool) -> list[tuple[str, int | None]]:
        out = []
        for leaf in dict.fromkeys(P.leaves(pred)):
            budget = None if unbounded else [max(1024, self.snap.count() // 4)]
            try:
                n = len(P.IndexEvaluator(self.snap, self.bind, budget).true(leaf))
            except OverBudget:
                n = None
            out.append((leaf_text(leaf, self.bind), n))
        return out


def scan_text(plan: Plan, kinds: dict | None = None) -> tuple[str, dict[str, str | None], dict[str, str | None]]:
    """The DuckDB statement over the column scan of ``plan`` (its CTE ``frame`` reads the
    scan), the types of that frame's columns and the scan column each one is when just one.
    ``kinds``: the kinds of values each mixed field holds in the rows read (the executor
    learns them), else the collection's."""
    q, spec = plan.query, plan.scan
    selects = []
    frame_types: dict[str, str | None] = {}
    frame_columns: dict[str, str | None] = {}
    for path, fname in q.fields.items():
        cols = {tag: f'"{c}"' for (p, tag), c in spec.names.items() if p == path}
        present, big = (kinds or {}).get(path, (cols, False))
        value = frames.value_sql(present, big)
        frame_columns[fname] = value[1:-1] if re.fullmatch(r'"c\d+"', value) else None
        selects.append(f'{value} AS "{fname}"')
        how = frames.mixing(set(present) - {keys.ARRAY, keys.OBJECT}, big)
        if how == frames.TEXT and fname in plan.compared:  # rule 2 in DuckDB: shadow columns (typed)
            frame_types[fname] = typed.MIXED
            selects.extend(f'{sql} AS "{typed.shadow(fname, fam)}"' for fam, sql in typed.scan_shadows(present).items())
        elif how == frames.TEXT:
            frame_types[fname] = typed.MIXED_TEXT
        elif value == "NULL":  # no value in the rows read
            frame_types[fname] = typed.NOTHING
        else:
            frame_types[fname] = typed.NUM if how == frames.DOUBLE else typed.family_of_tags(present)
    where = f" WHERE {spec.where}" if spec.where else ""
    inner = ", ".join(selects) if selects else "1 AS __one"
    text = f'WITH "frame" AS (SELECT {inner} FROM "scan"{where}) {typed_text(plan, frame_types)}{limit_tail(plan)}'
    return text, frame_types, frame_columns


def index_text(plan: Plan, frame_types: Mapping[str, str | None]) -> str:
    """The index path's DuckDB statement over a frame of these column types."""
    return typed_text(plan, frame_types) + limit_tail(plan)


def typed_text(plan: Plan, frame_types: Mapping[str, str | None]) -> str:
    """The query's DuckDB text with rule 2 applied over its frame (typed.rewrite); a frame
    read for a query over several collections is typed by that query instead."""
    if plan.outer:
        return plan.query.duck_sql
    return typed.rewrite(plan.query.duck_sql, {"frame": frame_types}, plan.duck_params)


def limit_tail(plan: Plan) -> str:
    limit, offset = limits(plan)
    return (f" LIMIT {int(limit)}" if limit is not None else "") + (f" OFFSET {int(offset)}" if offset else "")


def limits(plan: Plan) -> tuple[int | None, int]:
    q = plan.query
    return int_param(q.limit, plan.params, q.sql), int_param(q.offset, plan.params, q.sql) or 0


def small_plan(plan: Plan, frame_columns: Mapping[str, str | None]) -> small.SmallPlan | None:
    """The Arrow plan of an aggregate over the few rows the index matched (rtindex/sql/small.py),
    when the frame columns it reads are plain typed columns; else None (DuckDB runs it)."""
    found = small.compile_plan(plan.query.duck_sql)
    if found is None or any(frame_columns.get(c) is None for c in found.columns):
        return None
    return found


def frame_types(plan: Plan) -> dict[str, str | None]:
    """typed.columns_of the frame ``plan`` reads into, as far as the index knows the rows
    it reads (a run types it by the values it reads)."""
    if plan.scan is not None:
        return dict(plan.scan.frame_types)
    return _Planner(plan.query, plan.snapshot, plan.params).frame_types(plan.rows, plan.compared)


def column_tags(snap: Snapshot, path: Path) -> tuple[int, ...]:
    """The type tags of ``path``'s columns in the collection."""
    return tuple(keys.TAGS_BY_NAME[t] for t in snap.column_types(path))


def snapshot_of(lookup: Callable[[str], Any], collection: str, sql: str) -> Snapshot:
    """A snapshot of ``collection`` (``lookup``: name -> Collection), or SqlError naming it."""
    try:
        coll = lookup(collection)
    except NotFoundError:
        raise SqlError(f"no collection {collection!r}", sql) from None
    return coll.snapshot()


# -- parameters -------------------------------------------------------------------------
def check_params(q: Query | MultiQuery, params: Any) -> Mapping | Sequence:
    """``params`` as the query takes them, or SqlError saying what is wrong with them."""
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


def duck_param_values(ops: Mapping[str, P.Operand], params: Mapping | Sequence, sql: str) -> dict[str, Any]:
    """The values of DuckDB parameters: a datetime stays a timestamp (naive means UTC), so
    that UNIX_MICROS(:t) or ``_event_time > :t`` in SELECT work."""
    out = {}
    for name, op in ops.items():
        v = operand_value(op, params, sql)
        if isinstance(v, datetime):
            out[name] = v if v.tzinfo is not None else v.replace(tzinfo=timezone.utc)
        else:
            out[name] = P.check_value(v, sql, op.position)
    return out


# -- EXPLAIN's text of predicates ---------------------------------------------------------
def pred_text(p: P.Pred, bind) -> str:
    """A predicate as EXPLAIN shows it, with its values bound."""
    if isinstance(p, (P.And, P.Or)):
        word = " AND " if isinstance(p, P.And) else " OR "
        return "(" + word.join(pred_text(q, bind) for q in p.items) + ")"
    if isinstance(p, P.Not):
        return f"NOT {pred_text(p.item, bind)}"
    return leaf_text(p, bind)


def leaf_text(leaf: P.Pred, bind) -> str:
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
