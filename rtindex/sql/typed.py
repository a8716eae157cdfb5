"""Rule 2 (typed comparisons, docs/sql.md) where DuckDB evaluates a condition.

The index answers the index part of WHERE by rule 2: a value of one JSON type compares only
with values of its *family* (numbers, strings, bools). DuckDB evaluates everything else (a
residual, a JOIN condition, a subquery, CASE WHEN) over frames, where a field holding values
of several types is one text column (the projection rule, rtindex/sql/frames.py): DuckDB
would compare ``'7'`` with 7 as equal, or fail casting ``'x'`` to a number. So a frame gives
such a field, when the DuckDB text uses it in a comparison, *shadow columns*: one per family
(:func:`shadow`), each holding the field's values of that family and NULL elsewhere, and the
DuckDB text is rewritten (:func:`rewrite`) so that each comparison, ``LIKE``, ``IN``,
``BETWEEN``, ``IS [NOT] DISTINCT FROM`` and boolean use of the field reads the shadow of the
other operand's family: a row whose value is of another family gets NULL (UNKNOWN, so
``NOT`` stays three-valued). Two mixed fields compare family by family (the first family
both hold decides; none: NULL). Outputs (the SELECT list, GROUP BY, ORDER BY) keep the text
column. A field of one type gets no shadow columns; only its comparisons with a value of
another family change, to UNKNOWN (DuckDB alone would cast ``'7'`` to 7, or fail).

The family of the other operand is read from the text: literals, parameters (by their
bound value), frame columns (by their Arrow type), CASTs, arithmetic, string and numeric
functions, MIN/MAX and the like of a column, CASE and COALESCE whose results share a
family, a subquery's one column, a CTE's or a derived table's column (by the expression
it outputs). An operand of unknown family (a CASE of mixed results, a recursive CTE's
column, a mixed field passed on by a CTE) leaves the comparison as DuckDB types it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

import pyarrow as pa
import sqlglot
from sqlglot import exp

from rtindex import keys
from rtindex.errors import SqlError
from rtindex.sql import frames as F
from rtindex.sql.messages import duckdb_error

NUM, TEXT, BOOL = "num", "text", "bool"
FAMILIES = (NUM, TEXT, BOOL)
MIXED = "mixed"  # a frame column with shadow columns
MIXED_TEXT = "mixed-text"  # a frame column of a mixed field without them (not compared): its text
NOTHING = "nothing"  # a frame column with no value in the rows read: every comparison of it is UNKNOWN
_COMPARISONS = (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE)
_NULL_SAFE = (exp.NullSafeEQ, exp.NullSafeNEQ)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod)
_NUMERIC_FUNCTIONS = (exp.Length, exp.Count, exp.ApproxDistinct)
_NUMERIC_OF_NUMERIC = (exp.Abs, exp.Round, exp.Floor, exp.Ceil, exp.Sum, exp.Avg, exp.Neg)
_OF_ITS_ARGUMENT = (exp.Min, exp.Max, exp.AnyValue, exp.First, exp.Last)  # a value of the column
_TEXT_FUNCTIONS = (exp.Lower, exp.Upper, exp.Concat, exp.DPipe, exp.Substring, exp.Trim)
# where a bare column is a condition
_CONDITIONS = (exp.Where, exp.Having, exp.Not, exp.And, exp.Or)
_DIALECT = "duckdb"


def shadow(column: str, family: str) -> str:
    """The name of the shadow column of ``column`` (a frame column) for ``family``."""
    return f"__{family}:{column}"


def shadow_arrays(values: list) -> dict[str, pa.Array]:
    """The shadow columns of a mixed field's values (Python values, one per row): numbers
    (int64 when all are ints, else float64: an int beyond 2**53 among floats is rounded),
    strings and bools, each NULL where the value is of another family or null."""
    nums = [v if type(v) in (int, float) else None for v in values]
    try:
        num = pa.array(nums)
    except (pa.ArrowInvalid, OverflowError):
        num = pa.array([None if v is None else float(v) for v in nums], type=pa.float64())
    if pa.types.is_null(num.type):
        num = num.cast(pa.float64())
    return {NUM: num,
            TEXT: pa.array([v if type(v) is str else None for v in values], type=pa.string()),
            BOOL: pa.array([v if type(v) is bool else None for v in values], type=pa.bool_())}


def with_shadows(name: str, values: list, column: pa.Array,
                 compared: frozenset[str]) -> list[tuple[str, pa.Array]]:
    """A frame's column ``name`` (``column``, of ``values``) and, when the DuckDB text
    compares it (``compared``, see :func:`compared`) and it mixes types, its shadow columns."""
    out = [(name, column)]
    # only a mixed field's column is large_string (frames.column): one type costs nothing here
    if name in compared and pa.types.is_large_string(column.type) and F.mixing_of(values) == F.TEXT:
        out.extend((shadow(name, f), arr) for f, arr in shadow_arrays(values).items())
    return out


def scan_shadows(cols: Mapping[int, str]) -> dict[str, str]:
    """The shadow columns of a mixed field on the column scan, as DuckDB expressions over its
    typed columns of the kinds the rows hold (type tag -> column), as :func:`shadow_arrays`
    types them."""
    ints, floats = cols.get(keys.INT), cols.get(keys.FLOAT)
    if ints and floats:
        num = f"COALESCE(CAST({ints} AS DOUBLE), {floats})"
    else:
        num = ints or floats or "CAST(NULL AS DOUBLE)"
    return {NUM: num, TEXT: cols.get(keys.STRING) or "CAST(NULL AS VARCHAR)",
            BOOL: cols.get(keys.BOOL) or "CAST(NULL AS BOOLEAN)"}


def family_of_tags(tags) -> str | None:
    """The family of a field's values of type tags ``tags`` (None: none or several families)."""
    fams = {_TAG_FAMILY.get(t) for t in tags if t != keys.NULL}
    return fams.pop() if len(fams) == 1 else None


_TAG_FAMILY = {keys.INT: NUM, keys.FLOAT: NUM, keys.STRING: TEXT, keys.BOOL: BOOL}


def family_of_type(t: pa.DataType) -> str | None:
    """The family of the values of an Arrow column type (None: a timestamp, a list, ...)."""
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return NUM
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return TEXT
    return BOOL if pa.types.is_boolean(t) else None


def columns_of(schema: pa.Schema) -> dict[str, str | None]:
    """Frame column -> its family, MIXED when the frame has its shadow columns, or MIXED_TEXT
    for a mixed field's text column without them."""
    names = set(schema.names)
    shadows = {shadow(n, f) for n in names for f in FAMILIES}
    # only a mixed field's column is large_string (frames.column)
    return {f.name: MIXED if shadow(f.name, TEXT) in names else
            MIXED_TEXT if pa.types.is_large_string(f.type) else NOTHING if pa.types.is_null(f.type)
            else family_of_type(f.type) for f in schema if f.name not in shadows}


@lru_cache(maxsize=512)
def compared(sql: str) -> frozenset[str]:
    """Names of the columns the DuckDB text ``sql`` uses where rule 2 types them: the
    frame columns that get shadow columns when they are mixed."""
    try:
        tree = sqlglot.parse_one(sql, read=_DIALECT)
    except sqlglot.errors.ParseError:  # the text made for DuckDB does not read back: a construct carried over wrongly
        raise SqlError(duckdb_error("Parser Error: the text made for DuckDB", {})) from None
    return frozenset(c.name for c in _typed_uses(tree))


def rewrite(sql: str, frames: Mapping[str, Mapping[str, str | None]], params: Mapping[str, Any]) -> str:
    """``sql`` with rule 2 applied to the mixed columns of ``frames`` (frame table name ->
    :func:`columns_of`); ``params``: the DuckDB parameters' values. Parsed and rewritten
    once per text and typing of its frames (cached): a text whose comparisons need no change
    comes back as it is."""
    key_frames = tuple(sorted((f, tuple(sorted(cols.items(), key=lambda kv: kv[0])))
                              for f, cols in frames.items()))
    key_params = tuple(sorted((k, _family_of_value(v)) for k, v in params.items()))
    return _rewrite(sql, key_frames, key_params)


@lru_cache(maxsize=512)
def _rewrite(sql: str, frames: tuple, params: tuple) -> str:
    tree = sqlglot.parse_one(sql, read=_DIALECT)
    changed = _Rewriter({f: dict(cols) for f, cols in frames}, dict(params)).apply(tree)
    return tree.sql(_DIALECT) if changed else sql


def _family_of_value(v: Any) -> str | None:
    if isinstance(v, bool):
        return BOOL
    if isinstance(v, (int, float)):
        return NUM
    return TEXT if isinstance(v, str) else None


def _unparen(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _position(node: exp.Expression) -> tuple[exp.Expression | None, str]:
    """The node ``node`` is an operand of, through parentheses, and under which argument."""
    parent, child = node.parent, node
    while isinstance(parent, exp.Paren):
        parent, child = parent.parent, parent
    return parent, child.arg_key


def _is_condition(node: exp.Expression) -> bool:
    """Whether ``node`` stands where a boolean is expected (WHERE v, NOT v, ON v, CASE WHEN v)."""
    parent, key = _position(node)
    return isinstance(parent, _CONDITIONS) or (isinstance(parent, exp.Join) and key == "on") or (
        isinstance(parent, exp.If) and key == "this")


def _typed_uses(tree: exp.Expression) -> Iterator[exp.Column]:
    """The columns of ``tree`` used where rule 2 types them."""
    for node in tree.find_all(exp.Column):
        if isinstance(node.this, exp.Star):
            continue
        parent, key = _position(node)
        if isinstance(parent, _COMPARISONS + _NULL_SAFE + (exp.In, exp.Between)) or (
                isinstance(parent, (exp.Like, exp.ILike, exp.Is)) and key == "this") or _is_condition(node):
            yield node


class _Rewriter:
    def __init__(self, frames: dict[str, dict[str, str | None]], params: dict[str, str | None]):
        self.frames = frames
        self.params = params

    def apply(self, tree: exp.Expression) -> bool:
        """Rewrite ``tree`` in place; whether anything changed."""
        changed = False
        # innermost first (reversed pre-order): an operand, a subquery say, is rewritten
        # before what compares it, and a replaced node's own nodes are done already
        for node in reversed(list(tree.find_all(*_COMPARISONS, *_NULL_SAFE, exp.In, exp.Between, exp.Like,
                                                exp.ILike, exp.Is, exp.Column, bfs=False))):
            new = self.typed(node)
            if new is not None:
                node.replace(new)
                changed = True
        for star in list(tree.find_all(exp.Star)):
            changed = self.hide_shadows(star) or changed
        return changed

    # -- what a node compares as --------------------------------------------------
    def frame_of(self, col: exp.Column) -> tuple[str, str] | None:
        """(frame table, column) a column reads, searching its SELECT and those around it."""
        name, table = col.name, col.table
        select = col.find_ancestor(exp.Select)
        while select is not None:
            for item in _items(select):
                frame = self.frame_table(item)
                if table and item.alias_or_name == table:
                    return (frame, name) if frame is not None and name in self.frames[frame] else None
                if not table and frame is not None and name in self.frames[frame]:
                    return frame, name
            select = select.find_ancestor(exp.Select)
        return None

    def passes_mixed(self, output: exp.Expression) -> bool:
        """Whether a CTE's or derived table's output is a mixed field's column, as it is."""
        output = _unparen(output)
        if not isinstance(output, exp.Column):
            return False
        found = self.frame_of(output)
        if found is not None:
            return self.frames[found[0]][found[1]] in (MIXED, MIXED_TEXT)
        inner = self.derived_output(output)
        return inner is None or self.passes_mixed(inner)

    def derived_output(self, col: exp.Column) -> exp.Expression | None:
        """The expression a column of a CTE or a derived table reads (its output of that name),
        searching the FROM items of its SELECT and those around it; None for a recursive CTE."""
        name, table = col.name, col.table
        select = col.find_ancestor(exp.Select)
        while select is not None:
            for item in _items(select):
                if table and item.alias_or_name != table:
                    continue
                query = item.this if isinstance(item, exp.Subquery) else self.cte(item)
                if isinstance(query, exp.Select):
                    if any(cte.this is query for cte in _ancestors(col, exp.CTE)) \
                            or any(outer is query for outer in _ancestors(col, exp.Select)):
                        return None  # a CTE that reads itself, or a derived table read from inside it
                    for out in query.expressions:
                        if out.alias_or_name == name and not isinstance(out, exp.Star):
                            return out.unalias()
            select = select.find_ancestor(exp.Select)
        return None

    @staticmethod
    def cte(item: exp.Expression) -> exp.Expression | None:
        """The query of the CTE a FROM item names (None: not a CTE)."""
        if not isinstance(item, exp.Table) or item.text("db"):
            return None
        for node in _ancestors(item, exp.Expression):
            with_ = node.args.get("with_") or node.args.get("with")
            for cte in with_.expressions if with_ is not None else ():
                if cte.alias == item.name:
                    return cte.this
        return None

    def frame_table(self, item: exp.Expression) -> str | None:
        """The frame a FROM item reads: a frame table, or ``(SELECT * FROM frame ...)`` (a mask's
        subquery: its rows of the frame, every column)."""
        if isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select):
            inner = item.this
            if (len(_items(inner)) == 1 and len(inner.expressions) == 1
                    and isinstance(inner.expressions[0], exp.Star)):
                item = _items(inner)[0]
        if isinstance(item, exp.Table) and not item.text("db") and item.name in self.frames:
            return item.name
        return None

    def family(self, node: exp.Expression) -> str | None:
        node = _unparen(node)
        if isinstance(node, exp.Literal):
            return TEXT if node.is_string else NUM
        if isinstance(node, exp.Boolean):
            return BOOL
        if isinstance(node, exp.Placeholder):
            return self.params.get(str(node.this))
        if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
            found = self.frame_of(node)
            if found is not None:
                fam = self.frames[found[0]][found[1]]
                return TEXT if fam == MIXED_TEXT else fam
            output = self.derived_output(node)
            if output is None or self.passes_mixed(output):  # a mixed field passed on has no shadows
                return None
            return self.family(output)
        if isinstance(node, (exp.Cast, exp.TryCast)):
            to = node.args.get("to")
            if to is None:
                return None
            if to.is_type(*exp.DataType.NUMERIC_TYPES):
                return NUM
            if to.is_type(*exp.DataType.TEXT_TYPES):
                return TEXT
            return BOOL if to.is_type(exp.DataType.Type.BOOLEAN) else None
        if isinstance(node, _ARITHMETIC):
            return NUM if self.family(node.this) == NUM and self.family(node.expression) == NUM else None
        if isinstance(node, _NUMERIC_FUNCTIONS):
            return NUM
        if isinstance(node, _NUMERIC_OF_NUMERIC):
            return NUM if self.family(node.this) == NUM else None
        if isinstance(node, _TEXT_FUNCTIONS):
            return TEXT
        if isinstance(node, _OF_ITS_ARGUMENT):  # over a mixed column: one of its text values
            fam = self.family(node.this)
            return TEXT if fam == MIXED else fam
        if isinstance(node, (exp.Case, exp.Coalesce)):  # the family all its results share
            results = ([i.args.get("true") for i in node.args.get("ifs") or []] + [node.args.get("default")]
                       if isinstance(node, exp.Case) else [node.this, *node.expressions])
            fams = {self.family(r) for r in results if r is not None and not isinstance(_unparen(r), exp.Null)}
            fams = {TEXT if f == MIXED else f for f in fams}
            return fams.pop() if len(fams) == 1 else None
        if isinstance(node, exp.Subquery):
            node = node.this
        if isinstance(node, exp.Select) and len(node.expressions) == 1:
            return self.family(node.expressions[0].unalias())
        return None

    def mixed(self, node: exp.Expression) -> exp.Column | None:
        node = _unparen(node)
        return node if isinstance(node, exp.Column) and self.family(node) == MIXED else None

    # -- the rewrite ----------------------------------------------------------------
    def typed(self, node: exp.Expression) -> exp.Expression | None:
        """The rule-2 form of ``node``, or None to leave it."""
        if isinstance(node, exp.Column):
            return _shadow(node, BOOL) if _is_condition(node) and self.mixed(node) is not None else None
        if isinstance(node, _COMPARISONS):
            return self.compare(type(node), node.this, node.expression)
        if isinstance(node, _NULL_SAFE):
            same = self.not_distinct(node.this, node.expression)
            if same is None:
                return None
            return same if isinstance(node, exp.NullSafeEQ) else exp.Not(this=exp.Paren(this=same))
        col = self.mixed(node.this)
        if col is None:
            return self.typed_one_type(node)
        if isinstance(node, exp.In):
            query = node.args.get("query")
            if query is not None:
                fam = self.family(query)
                if fam not in FAMILIES:
                    return None
                node.set("this", _shadow(col, fam))
                return node
            items = [self.compare(exp.EQ, col, e) or exp.EQ(this=col.copy(), expression=e)
                     for e in node.expressions]
            return exp.Paren(this=exp.or_(*items, copy=False))
        if isinstance(node, exp.Between):
            lo = self.compare(exp.GTE, col, node.args["low"])
            hi = self.compare(exp.LTE, col, node.args["high"])
            return exp.Paren(this=exp.and_(lo, hi, copy=False)) if lo is not None and hi is not None else None
        if isinstance(node, (exp.Like, exp.ILike)):
            node.set("this", _shadow(col, TEXT))
            return node
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Boolean):
            node.set("this", _shadow(col, BOOL))
            return node
        return None

    def typed_one_type(self, node: exp.Expression) -> exp.Expression | None:
        """IN, BETWEEN and LIKE of a field of one type with values of another family (or of a
        field with no value in the rows read): UNKNOWN there."""
        nothing = isinstance(node, (exp.Between, exp.Like, exp.ILike)) or (
            isinstance(node, exp.In) and not node.args.get("query"))  # (NULL NOT IN (<no rows>) is TRUE)
        if nothing and self.family(node.this) == NOTHING:
            return _unknown(node.this, *(v for k, v in node.args.items() if k != "this" and isinstance(v, exp.Expression)),
                            *node.expressions)
        if isinstance(node, (exp.Like, exp.ILike)) and self.family(node.this) in (NUM, BOOL):
            return _unknown(node.this, node.expression)  # a number or bool is never LIKE a pattern
        if isinstance(node, exp.In) and not node.args.get("query") and node.expressions:
            if not any(self.families_differ(node.this, e) for e in node.expressions):
                return None
            items = [self.compare(exp.EQ, node.this, e) or exp.EQ(this=node.this.copy(), expression=e)
                     for e in node.expressions]
            return exp.Paren(this=exp.or_(*items, copy=False))
        if isinstance(node, exp.Between) and any(self.families_differ(node.this, node.args[k]) for k in ("low", "high")):
            lo = self.compare(exp.GTE, node.this, node.args["low"]) or exp.GTE(this=node.this.copy(),
                                                                                 expression=node.args["low"])
            hi = self.compare(exp.LTE, node.this, node.args["high"]) or exp.LTE(this=node.this.copy(),
                                                                                  expression=node.args["high"])
            return exp.Paren(this=exp.and_(lo, hi, copy=False))
        return None

    def compare(self, cls: type, left: exp.Expression, right: exp.Expression) -> exp.Expression | None:
        """``left <cls> right`` by rule 2 (None: DuckDB's comparison is rule 2's)."""
        lcol, rcol = self.mixed(left), self.mixed(right)
        if NOTHING in (self.family(left), self.family(right)):
            return _unknown(left, right)
        if lcol is None and rcol is None:
            return _unknown(left, right) if self.families_differ(left, right) else None
        if lcol is not None and rcol is not None:  # family by family: the one both hold decides
            return exp.Coalesce(this=cls(this=_shadow(lcol, NUM), expression=_shadow(rcol, NUM)),
                                expressions=[cls(this=_shadow(lcol, f), expression=_shadow(rcol, f))
                                             for f in (TEXT, BOOL)])
        if lcol is not None:
            fam = self.family(right)
            return cls(this=_shadow(lcol, fam), expression=right.copy()) if fam in FAMILIES else None
        if rcol is not None:
            fam = self.family(left)
            return cls(this=left.copy(), expression=_shadow(rcol, fam)) if fam in FAMILIES else None
        return None

    def families_differ(self, left: exp.Expression, right: exp.Expression) -> bool:
        """Whether a field of one type (a frame column) is compared with a value of another
        family: DuckDB would cast one to the other (``7 = '7'`` is TRUE there) or fail."""
        if not any(isinstance(_unparen(n), exp.Column) for n in (left, right)):
            return False
        fl, fr = self.family(left), self.family(right)
        return fl in FAMILIES and fr in FAMILIES and fl != fr

    def not_distinct(self, left: exp.Expression, right: exp.Expression) -> exp.Expression | None:
        """``left IS NOT DISTINCT FROM right`` by rule 2: both NULL, or values of one family
        that are equal (values of different families are distinct); never NULL."""
        lcol, rcol = self.mixed(left), self.mixed(right)
        if lcol is None and rcol is None:
            if not self.families_differ(left, right):
                return None
            return exp.Paren(this=exp.and_(exp.Is(this=left.copy(), expression=exp.Null()),
                                           exp.Is(this=right.copy(), expression=exp.Null())))
        both_null = exp.and_(exp.Is(this=left.copy(), expression=exp.Null()),
                             exp.Is(this=right.copy(), expression=exp.Null()))
        if lcol is not None and rcol is not None:
            equal = exp.Coalesce(this=self.compare(exp.EQ, lcol, rcol), expressions=[exp.false()])
            return exp.Paren(this=exp.or_(both_null, equal))
        col, other = (lcol, right) if lcol is not None else (rcol, left)
        fam = self.family(other)
        if fam not in FAMILIES:
            return None
        equal = exp.Coalesce(this=exp.EQ(this=_shadow(col, fam), expression=other.copy()),
                             expressions=[exp.false()])
        return exp.Paren(this=exp.or_(both_null, equal))

    def hide_shadows(self, star: exp.Star) -> bool:
        """Leave the shadow columns out of a ``*`` (a mask's subquery passes them on)."""
        node = star.parent if isinstance(star.parent, exp.Column) else star
        select = node.parent
        if not isinstance(select, exp.Select) or node.arg_key != "expressions":
            return False
        if isinstance(select.parent, exp.Subquery) and self.frame_table(select.parent) is not None:
            return False
        table = node.table if isinstance(node, exp.Column) else ""
        hidden = []
        for item in _items(select):
            frame = self.frame_table(item)
            if frame is not None and (not table or item.alias_or_name == table):
                hidden.extend(shadow(c, f) for c, fam in self.frames[frame].items() if fam == MIXED
                              for f in FAMILIES)
        if hidden:
            star.set("except_", [*(star.args.get("except_") or []),
                                 *(exp.column(h, quoted=True) for h in dict.fromkeys(hidden))])
        return bool(hidden)


def _ancestors(node: exp.Expression, kind: type) -> Iterator[exp.Expression]:
    """The nodes of type ``kind`` above ``node``, nearest first."""
    node = node.parent
    while node is not None:
        if isinstance(node, kind):
            yield node
        node = node.parent


def _items(select: exp.Select) -> list[exp.Expression]:
    source = select.args.get("from_") or select.args.get("from")
    return ([source.this] if source is not None else []) + [j.this for j in select.args.get("joins") or []]


def _unknown(*operands: exp.Expression) -> exp.Expression:
    """NULL (UNKNOWN), naming every operand: a parameter among them stays in the text."""
    every = exp.and_(*(exp.Is(this=o.copy(), expression=exp.Null()) for o in operands))
    return exp.Case(ifs=[exp.If(this=every, true=exp.cast(exp.Null(), "BOOLEAN"))])


def _shadow(col: exp.Column, family: str) -> exp.Column:
    return exp.column(shadow(col.name, family), table=col.table or None, quoted=True)
