"""Splitting an aggregate's DuckDB text in two: a partial aggregate that each part of the
data computes where it lives, and the final one that merges the parts' answers.

The text is the scan path's (``WITH "frame" AS (...) SELECT ... FROM "frame" [GROUP BY
...]``, rtindex/sql/planner.py). COUNT, SUM, MIN and MAX merge by SUM, SUM, MIN and MAX of
the parts; AVG is carried as a sum and a count. Anything else (DISTINCT, other aggregates,
window functions, subqueries, a column outside the grouping keys) keeps the text whole:
:func:`split` says None and the rows travel instead.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pyarrow as pa
import sqlglot
from sqlglot import exp

from rtindex.duck import HUGEINT_COLUMNS

PARTS = "parts"  # the table the final text reads: every part's partial rows
RAW_PARTS = "parts_raw"  # the parts as they came, when some of their sums are 128-bit
# (sqlglot names these two args from_ and with_ since 28, from and with before)
_FROM = "from_" if "from_" in exp.Select.arg_types else "from"
_WITH = "with_" if "with_" in exp.Select.arg_types else "with"
_MERGE = {exp.Sum: exp.Sum, exp.Min: exp.Min, exp.Max: exp.Max}


@dataclass(frozen=True)
class Split:
    partial: str  # over "scan", as the whole text was: one row per group of each part
    final: str  # over PARTS


@functools.lru_cache(maxsize=1024)  # (a query's text repeats: parsing and writing it again costs more than it)
def split(text: str) -> Split | None:
    """The two halves of ``text``, or None when it cannot be split (see the module doc)."""
    try:
        tree = sqlglot.parse_one(text, read="duckdb")
    except sqlglot.errors.SqlglotError:
        return None
    if not isinstance(tree, exp.Select) or tree.args.get("distinct") or tree.args.get("qualify") \
            or _from_name(tree) != "frame" or tree.args.get("joins") or tree.find(exp.Window) \
            or tree.find(exp.Subquery) is not None and _outer_subquery(tree):
        return None
    aggs = [a for a in tree.find_all(exp.AggFunc) if a.find_ancestor(exp.With) is None]
    if not aggs or any(type(a) not in (*_MERGE, exp.Count, exp.Avg) or a.find(exp.Distinct) for a in aggs):
        return None
    keys = list(tree.args["group"].expressions) if tree.args.get("group") else []
    if any(k.find(exp.AggFunc) or isinstance(k, exp.Literal) for k in keys):
        return None  # (GROUP BY 1: an ordinal, not an expression of the frame)
    parts: list[exp.Expression] = [k.copy().as_(f"g{i}") for i, k in enumerate(keys)]
    merged: dict[str, exp.Expression] = {}  # an aggregate's text -> what merges its parts
    for a in aggs:
        text, j = a.sql(dialect="duckdb"), len(parts)
        if text in merged:
            continue
        if isinstance(a, exp.Avg):
            parts.append(exp.Sum(this=a.this.copy()).as_(f"p{j}"))
            parts.append(exp.Count(this=a.this.copy()).as_(f"p{j + 1}"))
            merged[text] = exp.Div(this=exp.Sum(this=exp.column(f"p{j}")),
                                   expression=exp.Sum(this=exp.column(f"p{j + 1}")))
        elif isinstance(a, exp.Count):
            parts.append(a.copy().as_(f"p{j}"))
            merged[text] = exp.Cast(this=exp.Sum(this=exp.column(f"p{j}")), to=exp.DataType.build("BIGINT"))
        else:
            parts.append(a.copy().as_(f"p{j}"))
            merged[text] = _MERGE[type(a)](this=exp.column(f"p{j}"))
    partial = tree.copy()
    for arg in ("having", "order", "limit", "offset"):
        partial.set(arg, None)
    partial.set("expressions", parts)
    partial.set("group", exp.Group(expressions=[k.copy() for k in keys]) if keys else None)

    key_cols = {k.sql(dialect="duckdb"): f"g{i}" for i, k in enumerate(keys)}

    def merge(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Alias):
            return node
        text = node.sql(dialect="duckdb")
        if text in merged:
            return merged[text].copy()
        return exp.column(key_cols[text]) if text in key_cols else node
    final = tree.copy()
    final.set(_WITH, None)
    final.set("where", None)
    final = final.transform(merge, copy=False)
    final.set(_FROM, exp.From(this=exp.to_table(PARTS)))
    final.set("group", exp.Group(expressions=[exp.column(f"g{i}") for i in range(len(keys))]) if keys else None)
    allowed = {p.alias for p in parts} | {e.alias for e in final.expressions if isinstance(e, exp.Alias)}
    if any(c.name not in allowed for c in final.find_all(exp.Column)):
        return None  # a frame column outside the keys and the aggregates
    return Split(partial.sql(dialect="duckdb"), final.sql(dialect="duckdb"))


def _from_name(tree: exp.Select) -> str | None:
    src = tree.args.get(_FROM)
    return src.this.name if src is not None and isinstance(src.this, exp.Table) else None


def _outer_subquery(tree: exp.Select) -> bool:
    return any(s.find_ancestor(exp.With) is None for s in tree.find_all(exp.Subquery))


def final_over(final: str, parts: pa.Table) -> tuple[str, dict[str, pa.Table]]:
    """The final text and its tables over ``parts``: sums of integers that a part kept
    128-bit (named in ``HUGEINT_COLUMNS``, as decimal128 in Arrow) are HUGEINT again, so
    that the merged sum is typed as one process's."""
    hugeint = {n for n in (parts.schema.metadata or {}).get(HUGEINT_COLUMNS, b"").decode().split(",") if n}
    if not hugeint:
        return final, {PARTS: parts}
    cols = ", ".join(f'CAST("{n}" AS HUGEINT) AS "{n}"' if n in hugeint else f'"{n}"' for n in parts.column_names)
    return f'WITH "{PARTS}" AS (SELECT {cols} FROM "{RAW_PARTS}") {final}', {RAW_PARTS: parts}
