"""Aggregates of a few matched rows in numpy and Arrow compute, without DuckDB's per-call cost.

A DuckDB call costs about a millisecond however few rows it reads (binding, planning, an
Arrow scan, converting the result): most of a search-then-aggregate query once the index
has narrowed a million rows to a few thousand, whose aggregation itself takes tens of
microseconds. For the common shape of such a query this module computes the same result:
groups numbered in one compiled pass (integer keys; Arrow's dictionary_encode for others),
aggregates summed with numpy (bincount, ufunc.at), outputs computed and sorted with Arrow
compute:

    SELECT <group fields and aggregate expressions> FROM frame [GROUP BY fields]
    [ORDER BY outputs] [LIMIT n] [OFFSET m]

where an aggregate is COUNT(*), or COUNT, SUM, AVG, MIN or MAX of a field or of its CAST
to BIGINT, DOUBLE or REAL, and an expression combines aggregates, grouped fields and number
literals with ``+ - * /`` and unary minus. :func:`compile_plan` takes the DuckDB text the
SQL layer generated (over frame columns ``f0``, ``f1``, ...) and returns a
:class:`SmallPlan`, or None for any other shape; :meth:`SmallPlan.run` returns None when
the data leaves DuckDB's semantics uncertain (see there). Either way DuckDB then runs it.

The result is DuckDB's, types included (tests/test_sql_small.py compares them on generated
data): SUM of ints is a 64-bit int (as the SQL layer returns DuckDB's 128-bit sums), SUM of
floats and AVG are DOUBLE, MIN and MAX keep their argument's type, COUNT is BIGINT;
``+ - * /`` with a DOUBLE give a DOUBLE, else with a REAL a REAL, and ints stay ints except
under ``/`` (a DOUBLE; ``x / 0`` is infinite, as in DuckDB); an int with a decimal literal
(``SUM(x) + 1.0``) is a DECIMAL in DuckDB, a shape this module leaves to it. Floating-point sums may differ from
DuckDB's in the last bits (the order of additions differs; DuckDB's own order depends on
its threads), so rows whose ORDER BY values tie within that rounding may come in another
order. Rows whose ORDER BY values tie exactly come in the order of their groups' first rows
(DuckDB's order of them is arbitrary).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

from rtindex._impl import factorize

INT, FLOAT, DOUBLE, TEXT, BOOL = "int", "float", "double", "text", "bool"
NUMBERS = (INT, FLOAT, DOUBLE)
_ARROW = {INT: pa.int64(), FLOAT: pa.float32(), DOUBLE: pa.float64(), TEXT: pa.string(), BOOL: pa.bool_()}
_CASTS = {exp.DataType.Type.BIGINT: INT, exp.DataType.Type.DOUBLE: DOUBLE, exp.DataType.Type.FLOAT: FLOAT}
_AGGREGATES = {exp.Sum: "sum", exp.Avg: "mean", exp.Min: "min", exp.Max: "max", exp.Count: "count"}
_ARITHMETIC = {exp.Add: "add_checked", exp.Sub: "subtract_checked", exp.Mul: "multiply_checked"}
INT64_MAX = (1 << 63) - 1


class _Unsupported(Exception):
    """A shape this module does not compute (DuckDB runs it)."""


@dataclass(frozen=True)
class _Aggregate:
    """One aggregate: ``fn`` (count, sum, mean, min or max) of frame column ``column`` cast
    to ``cast`` (None: as it is; COUNT(*): column None)."""

    fn: str
    column: str | None
    cast: str | None


# an output expression, evaluated over the grouped table: (name -> array) -> (array, type)
_Eval = Callable[[dict[str, pa.Array]], tuple[pa.Array, str]]


class SmallPlan:
    """A query of the shape above, ready to run over frame columns."""

    def __init__(self, keys: list[str], aggregates: list[_Aggregate], outputs: list[tuple[str, _Eval]],
                 order: list[tuple[str, bool, bool]], columns: set[str]):
        self.keys = keys  # frame columns grouped by
        self.aggregates = aggregates
        self.outputs = outputs  # (output name, its expression)
        self.order = order  # (output name, descending, nulls first)
        self.columns = columns  # frame columns read

    def run(self, frame: dict[str, pa.Array], n: int, limit: int | None, offset: int) -> pa.Table | None:
        """The result over ``frame`` (``n`` rows; frame column -> values, each of one type: BIGINT,
        DOUBLE, VARCHAR or BOOLEAN), or None where DuckDB must decide: a column of another
        type, an integer sum that could pass 64 bits (DuckDB sums into 128 bits and the SQL
        layer reports one that does not fit), an integer overflow in ``+ - *``, or a NaN
        among the values ORDER BY sorts (Arrow and DuckDB place NaN differently)."""
        types = {}
        for name in self.columns:
            t = _type_of(frame[name].type)
            if t is None:
                return None
            types[name] = t
        groups = _Groups([frame[k] for k in self.keys], [types[k] for k in self.keys], n)
        env: dict = dict(zip(self.keys, groups.keys))
        for i, agg in enumerate(self.aggregates):
            if agg.column is None:  # COUNT(*)
                env[f"__agg{i}"] = pa.array(groups.sizes)
                continue
            values = frame[agg.column]
            t = agg.cast or types[agg.column]
            if agg.cast is not None and agg.cast != types[agg.column]:
                if types[agg.column] != INT:
                    return None  # a float rounded to an int, a string or a bool: DuckDB's conversion rules
                if agg.fn in ("min", "max"):  # (sum and mean convert in numpy; a count needs no cast)
                    values = values.cast(_ARROW[agg.cast], safe=False)  # (rounded to nearest, as DuckDB does)
            if agg.fn in ("sum", "mean") and t not in NUMBERS:
                return None
            env[f"__agg{i}"] = groups.aggregate(agg.fn, values, t)
            if env[f"__agg{i}"] is None:
                return None
        env["__types"] = {**types, **{f"__agg{i}": _result_type(a, types) for i, a in enumerate(self.aggregates)}}
        try:
            cols = [(name, *evaluate(env)) for name, evaluate in self.outputs]
        except (pa.ArrowInvalid, _Unsupported):  # an integer overflow (DuckDB reports it), or types it decides
            return None
        if any(t not in _ARROW or not isinstance(arr, pa.Array) for _, arr, t in cols):
            return None  # a constant output: DuckDB types it
        arrays = {name: arr.cast(_ARROW[t]) if arr.type != _ARROW[t] else arr for name, arr, t in cols}
        out = pa.table(arrays)
        if not self.order:
            return out.slice(offset, limit) if offset or limit is not None else out
        if any(pa.types.is_floating(arrays[name].type) and pc.is_nan(arrays[name]).true_count for name, _, _ in self.order):
            return None
        if len(self.order) == 1 and limit is not None and 0 < offset + limit < len(out):  # the first few of many
            name, descending, _ = self.order[0]
            col = arrays[name]
            if not col.null_count and col.type in (pa.int64(), pa.float64(), pa.float32()):
                return out.take(_top(col.to_numpy(), descending, offset + limit)[offset:])
        idx = pc.sort_indices(out, sort_keys=[(n, "descending" if d else "ascending", "at_start" if f else "at_end")
                                              for n, d, f in self.order])
        return out.take(idx.slice(offset, limit) if offset or limit is not None else idx)


class _Groups:
    """The rows of a frame split into groups by the values of its key columns, computed with
    numpy: Arrow's group_by has a fixed cost per call (acero) far above numpy's bincount
    (docs/benchmarks.md, "Queries"). NULL is a group of its own, and 0.0 and -0.0 are one
    group, as all NaNs are (as DuckDB groups them). Groups come in the order of their first
    rows (so rows an ORDER BY ties come in that order; DuckDB's is arbitrary)."""

    def __init__(self, keys: list[pa.Array], types: list[str], n: int):
        self.count = 1  # (no keys: one group, even of no rows)
        self.codes = np.zeros(n, dtype=np.intp)  # row -> its group
        self.keys: list[pa.Array] = []  # each key column's value per group
        if keys:
            keys = [_normal_floats(k) if t == DOUBLE else k for k, t in zip(keys, types)]
            self.codes, self.count, distinct = _factorize(keys[0])
            for key in keys[1:]:  # (re-numbered per key: the combined codes stay below n * n)
                codes, count, _ = _factorize(key)
                self.codes, self.count, _ = _factorize(pa.array(self.codes * count + codes))
            if len(keys) == 1:
                self.keys = [distinct]
            else:  # the key values of the first row of each group (new groups come in increasing order)
                first = np.flatnonzero(np.diff(np.maximum.accumulate(self.codes), prepend=-1) > 0)
                self.keys = [k.take(first) for k in keys]
        self.sizes = np.bincount(self.codes, minlength=self.count)

    def aggregate(self, fn: str, values: pa.Array, t: str) -> pa.Array | None:
        """``fn`` (count, sum, mean, min or max) of ``values`` (of type ``t``, or ints to be
        cast to ``t`` for a sum or a mean) per group;
        None for an integer SUM or AVG whose sum could pass 64 bits."""
        codes, valid = self.codes, None
        if values.null_count:
            valid = values.is_valid().to_numpy(zero_copy_only=False)
            codes = codes[valid]
        counts = self.sizes if valid is None else np.bincount(codes, minlength=self.count)
        if fn == "count":
            return pa.array(counts)
        empty = counts == 0  # null in SUM, AVG, MIN and MAX
        mask = empty if empty.any() else None
        if fn in ("min", "max"):
            return self.extreme(fn, values, valid, mask)
        x = (values if valid is None else values.drop_null()).to_numpy()
        if t == FLOAT:  # CAST(x AS REAL): rounded to nearest, as DuckDB does (a DOUBLE cast is bincount's)
            x = x.astype(np.float32)
        if t == INT:  # summed exactly, as DuckDB does (into 128 bits) for SUM and AVG
            if len(x) and max(-int(x.min()), int(x.max())) * len(x) > INT64_MAX:
                return None
            total = np.zeros(self.count, dtype=np.int64)
            np.add.at(total, codes, x)
        else:
            total = np.bincount(codes, weights=x, minlength=self.count)  # (adds in float64, in row order)
        return pa.array(total if fn == "sum" else total / np.maximum(counts, 1), mask=mask)

    def extreme(self, fn: str, values: pa.Array, valid: np.ndarray | None, mask: np.ndarray | None) -> pa.Array:
        """MIN or MAX per group by rank (Arrow's order: strings by bytes, NaN above every
        number, as in DuckDB), then the value of a row of that rank."""
        ranks = pc.rank(values, sort_keys="ascending", tiebreaker="dense").to_numpy()  # 1, 2, ...: equal values alike
        row_of = np.zeros(len(ranks) + 1, dtype=np.intp)
        row_of[ranks] = np.arange(len(ranks))
        codes = self.codes
        if valid is not None:
            codes, ranks = codes[valid], ranks[valid]
        if fn == "min":
            best = np.full(self.count, len(row_of) - 1, dtype=ranks.dtype)
            np.minimum.at(best, codes, ranks)
        else:
            best = np.zeros(self.count, dtype=ranks.dtype)
            np.maximum.at(best, codes, ranks)
        return values.take(pa.array(row_of[best], mask=mask))


def _top(values: np.ndarray, descending: bool, k: int) -> np.ndarray:
    """The first ``k`` (< len(values)) positions of a stable sort of ``values`` (numbers, no
    NaN), without sorting them all: the usual ORDER BY x LIMIT k over many groups, where it
    beats Arrow's sort_indices (docs/benchmarks.md, "Queries")."""
    n = len(values)
    if descending:  # every value at least the k-th largest, then the stable descending order of those
        candidates = np.flatnonzero(values >= np.partition(values, n - k)[n - k])
        picked = values[candidates][::-1]
        order = (len(picked) - 1 - np.argsort(picked, kind="stable"))[::-1]
    else:
        candidates = np.flatnonzero(values <= np.partition(values, k - 1)[k - 1])
        order = np.argsort(values[candidates], kind="stable")
    return candidates[order[:k]]


def _factorize(values: pa.Array) -> tuple[np.ndarray, int, pa.Array]:
    """(a group number per value, the number of groups, the value of each group): equal
    values (and nulls) alike, numbered in the order they first come. 64-bit integers, the
    usual key, in one compiled pass (rtindex._impl.factorize); other types with Arrow."""
    if values.type == pa.int64():
        ints = values.fill_null(0).to_numpy() if values.null_count else values.to_numpy()
        valid = values.is_valid().to_numpy(zero_copy_only=False).view(np.uint8) if values.null_count else None
        codes, count, firsts = factorize(np.ascontiguousarray(ints), valid)
        return codes, count, values.take(firsts) if values.null_count else pa.array(ints[firsts])
    enc = pc.dictionary_encode(values, null_encoding="encode")
    return enc.indices.to_numpy().astype(np.intp), len(enc.dictionary), enc.dictionary


def _normal_floats(arr: pa.Array) -> pa.Array:
    """``arr`` with -0.0 as 0.0 and every NaN the same NaN: the values DuckDB groups together
    (Arrow's dictionary_encode compares the bits)."""
    arr = pc.add(arr, 0.0)  # (-0.0 + 0.0 is 0.0)
    return pc.if_else(pc.is_nan(arr), np.nan, arr)


def _type_of(t: pa.DataType) -> str | None:
    for name, arrow in _ARROW.items():
        if t == arrow or (name == TEXT and t == pa.large_string()):
            return name if name != FLOAT else None  # a frame has no REAL columns
    return None


def _result_type(agg: _Aggregate, types: dict[str, str]) -> str:
    if agg.fn == "count":
        return INT
    t = agg.cast or types[agg.column]
    if agg.fn == "mean" or (agg.fn == "sum" and t != INT):
        return DOUBLE
    return t


@lru_cache(maxsize=512)
def compile_plan(sql: str) -> SmallPlan | None:
    """The SmallPlan of a DuckDB text over ``frame``, or None when it is not of the shape
    this module computes."""
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
        return _Compiler().select(tree)
    except (_Unsupported, sqlglot.errors.SqlglotError):
        return None


class _Compiler:
    def __init__(self):
        self.aggregates: list[_Aggregate] = []
        self.keys: list[str] = []
        self.columns: set[str] = set()

    def select(self, tree: exp.Expression) -> SmallPlan:
        if not isinstance(tree, exp.Select):
            raise _Unsupported("not a plain SELECT")
        allowed = {"expressions", "from", "from_", "group", "order"}
        if set(k for k, v in tree.args.items() if v) - allowed:
            raise _Unsupported("a clause other than GROUP BY and ORDER BY")
        source = tree.args.get("from_") or tree.args.get("from")
        if source is None or not isinstance(source.this, exp.Table) or source.this.name != "frame" or source.this.alias:
            raise _Unsupported("not FROM frame")
        group = tree.args.get("group")
        if group is not None:
            if set(k for k, v in group.args.items() if v) != {"expressions"}:
                raise _Unsupported("GROUP BY ALL, ROLLUP, CUBE or GROUPING SETS")
            for g in group.expressions:
                self.keys.append(self.frame_column(g))
        outputs, shown = [], {}  # shown: a grouped frame column -> the output that is it
        for item in tree.expressions:
            if not isinstance(item, exp.Alias):
                raise _Unsupported("an output without a name")
            outputs.append((item.alias, self.expression(item.this)))
            if isinstance(item.this, exp.Column):
                shown.setdefault(item.this.name, item.alias)
        if not self.aggregates and not self.keys:
            raise _Unsupported("no aggregate")
        order = []
        names = [name for name, _ in outputs]
        for o in (tree.args["order"].expressions if tree.args.get("order") else []):
            target = o.this
            if isinstance(target, exp.Literal) and not target.is_string and target.this.isdigit():
                pos = int(target.this)
                if not 1 <= pos <= len(names):
                    raise _Unsupported("an ORDER BY position out of range")
                name = names[pos - 1]
            elif isinstance(target, exp.Column) and not target.table and target.name in names:
                name = target.name
            elif isinstance(target, exp.Column) and not target.table and target.name in shown:
                name = shown[target.name]
            else:
                raise _Unsupported("ORDER BY of something other than an output")
            order.append((name, bool(o.args.get("desc")), bool(o.args.get("nulls_first"))))
        return SmallPlan(self.keys, self.aggregates, outputs, order, self.columns | set(self.keys))

    def frame_column(self, node: exp.Expression) -> str:
        if not isinstance(node, exp.Column) or node.table or isinstance(node.this, exp.Star):
            raise _Unsupported("not a frame column")
        self.columns.add(node.name)
        return node.name

    def expression(self, node: exp.Expression) -> _Eval:
        if isinstance(node, exp.Paren):
            return self.expression(node.this)
        if isinstance(node, exp.Column):
            name = self.frame_column(node)
            if name not in self.keys:
                raise _Unsupported("a field neither grouped nor aggregated")
            return lambda env: (env[name], env["__types"][name])
        if type(node) in _AGGREGATES:
            return self.aggregate(node)
        if isinstance(node, exp.Literal) and not node.is_string:
            return self.literal(node.this)
        if isinstance(node, exp.Neg):
            inner = self.expression(node.this)

            def neg(env):
                arr, t = inner(env)
                if t not in NUMBERS:
                    raise _Unsupported("minus of a non-number")
                return pc.negate_checked(arr), t
            return neg
        if type(node) in _ARITHMETIC or isinstance(node, exp.Div):
            if isinstance(node, exp.Div) and (node.args.get("typed") or node.args.get("safe")):
                raise _Unsupported("integer or safe division")
            return self.arithmetic(node)
        raise _Unsupported(f"{type(node).__name__}")

    def literal(self, text: str) -> _Eval:
        if text.isdigit():
            value = int(text)
            if value > INT64_MAX:
                raise _Unsupported("an integer literal beyond 64 bits")
            return lambda env: (pa.scalar(value, pa.int64()), "int-literal")
        return lambda env: (pa.scalar(float(text), pa.float64()), "decimal-literal")

    def aggregate(self, node: exp.Expression) -> _Eval:
        fn = _AGGREGATES[type(node)]
        arg = node.this
        if isinstance(node, exp.Count) and isinstance(arg, exp.Star):
            self.aggregates.append(_Aggregate("count", None, None))
        else:
            if isinstance(arg, exp.Distinct) or node.args.get("ignore_nulls") is not None:
                raise _Unsupported("DISTINCT or IGNORE NULLS in an aggregate")
            cast = None
            if isinstance(arg, exp.Cast) and not isinstance(arg, exp.TryCast):
                cast = _CASTS.get(arg.args["to"].this)
                if cast is None or arg.args["to"].expressions:
                    raise _Unsupported("a CAST to another type")
                arg = arg.this
            self.aggregates.append(_Aggregate(fn, self.frame_column(arg), cast))
        key = f"__agg{len(self.aggregates) - 1}"
        return lambda env: (env[key], env["__types"][key])

    def arithmetic(self, node: exp.Expression) -> _Eval:
        left, right = self.expression(node.this), self.expression(node.expression)
        divide = isinstance(node, exp.Div)
        fn = "divide" if divide else _ARITHMETIC[type(node)]  # (floats: x / 0 is infinite, as in DuckDB)

        def evaluate(env):
            (a, ta), (b, tb) = left(env), right(env)
            t = _arithmetic_type(ta, tb, divide)
            return getattr(pc, fn)(_as(a, t), _as(b, t)), t
        return evaluate


def _as(value: pa.Array | pa.Scalar, t: str) -> pa.Array | pa.Scalar:
    """``value`` as type ``t`` (a cast only when it is another type: each costs a call)."""
    return value if value.type == _ARROW[t] else pc.cast(value, _ARROW[t], safe=False)


def _arithmetic_type(ta: str, tb: str, divide: bool) -> str:
    """DuckDB's result type of ``a op b`` (checked against DuckDB in tests): with a DOUBLE it
    is DOUBLE, else with a REAL it is REAL (literals of either kind join them); ints stay
    ints under ``+ - *`` and divide into a DOUBLE; an int beside a decimal literal is a
    DECIMAL, and literals alone are typed by DuckDB: both left to it."""
    kinds = {ta, tb}
    if not kinds <= {*NUMBERS, "int-literal", "decimal-literal"} or kinds <= {"int-literal", "decimal-literal"}:
        raise _Unsupported("arithmetic of non-numbers, or of literals only")
    if DOUBLE in kinds:
        return DOUBLE
    if FLOAT in kinds:
        return FLOAT
    if "decimal-literal" in kinds:
        raise _Unsupported("an int beside a decimal literal (DuckDB: DECIMAL)")
    return DOUBLE if divide else INT
