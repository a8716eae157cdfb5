"""sqlglot -> a checked :class:`Query`: what to look up, which fields to read, what DuckDB runs.

A SQL text is parsed once (rtindex/sql/queries.py caches it by text) and checked against a whitelist of
constructs: anything else is an :class:`UnsupportedSqlError` naming the construct and where
it is. Parameters stay parameters: ``:name`` and ``?`` become predicate operands bound per
execution, or DuckDB named parameters; no value is ever spliced into SQL text.

The DuckDB text of a query reads a table called ``frame``: one column ``f<i>`` per field the
query uses outside WHERE (and ``__pos``, the row's position, for ``SELECT *``); WHERE is
gone from it because the access path has applied it already.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.tokens import TokenType

from rtindex.errors import SqlError, UnsupportedSqlError
from rtindex.sql import frames, messages
from rtindex.sql import predicates as P
from rtindex.sql.syntax import check_depth, check_nesting, syntax_error

DIALECT = "duckdb"

AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)
SCALAR_FUNCTIONS = (exp.Lower, exp.Upper, exp.Length, exp.Abs, exp.Round, exp.Floor, exp.Ceil, exp.Coalesce,
                    exp.Concat, exp.DPipe, exp.Case, exp.If, exp.Cast, exp.TryCast)
OPERATORS = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Neg, exp.Paren, exp.Not, exp.And,
             exp.Or, exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE, exp.Is, exp.In, exp.Between, exp.Like,
             exp.ILike, exp.NullSafeEQ, exp.NullSafeNEQ)
STRUCTURE = (exp.Select, exp.From, exp.Table, exp.TableAlias, exp.Identifier, exp.Column, exp.Dot, exp.Star,
             exp.Alias, exp.Literal, exp.Boolean, exp.Null, exp.Placeholder, exp.Group, exp.Having, exp.Order,
             exp.Ordered, exp.Limit, exp.Offset, exp.Where, exp.Distinct, exp.DataType, exp.Explode, exp.Unnest,
             exp.ArrayContains)
ALLOWED = AGGREGATES + SCALAR_FUNCTIONS + OPERATORS + STRUCTURE
CAST_TYPES = {"BIGINT", "INT", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT", "DECIMAL", "VARCHAR", "TEXT",
              "BOOLEAN", "TIMESTAMP", "TIMESTAMPTZ", "DATE"}
COMPARISONS = {exp.EQ: "=", exp.NEQ: "<>", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}
FLIPPED = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
MISSING_FUNCTION = "IS_MISSING"
EVENT_TIME = ("_event_time",)
Path = tuple[str, ...]
# Rockset's default workspace: ``commons.coll`` is the collection ``coll``; any other
# workspace is part of the name (``ws.coll``, see rtindex/database.py)
DEFAULT_WORKSPACE = "commons"
# Rockset's time functions (P.TIME_FUNCTIONS) reach this module as Anonymous calls: the
# parser turns sqlglot's own nodes for some of them (UnixMicros, ...) into such calls first,
# so the rest of it sees one spelling whatever the sqlglot version.
TIME_FUNCTIONS = P.TIME_FUNCTIONS
_SQLGLOT_TIME_NODES = {cls: name for cls, name in (
    (getattr(exp, "UnixSeconds", None), "UNIX_SECONDS"), (getattr(exp, "UnixMillis", None), "UNIX_MILLIS"),
    (getattr(exp, "UnixMicros", None), "UNIX_MICROS")) if cls is not None}


def collection_name(workspace: str | None, name: str) -> str:
    """The collection a (workspace, name) of FROM names: the default workspace is no
    prefix, another one is (``"ws"."c"`` and ``"ws.c"`` are both ``ws.c``)."""
    full = f"{workspace}.{name}" if workspace else name
    prefix = DEFAULT_WORKSPACE + "."
    return full.removeprefix(prefix)


def _time_function(node: exp.Expression) -> str | None:
    """The TIME_FUNCTIONS name of a call node, or None."""
    if isinstance(node, exp.Anonymous) and isinstance(node.this, str) and node.name.upper() in TIME_FUNCTIONS:
        return node.name.upper()
    return None


def _normalize_time_functions(tree: exp.Expression) -> None:
    """sqlglot's nodes for UNIX_SECONDS & co. -> Anonymous calls of TIME_FUNCTIONS names
    (in place), so that checking, WHERE and rewriting deal with one form."""
    if not _SQLGLOT_TIME_NODES:
        return
    for node in list(tree.find_all(*_SQLGLOT_TIME_NODES)):
        args = [node.this, *(v for k, v in node.args.items() if k != "this" and v is not None)]
        call = exp.Anonymous(this=_SQLGLOT_TIME_NODES[type(node)], expressions=args)
        call.meta.update(node.meta)
        node.replace(call)


@dataclass
class Query:
    """A checked SELECT on one collection; shared by every execution of the same text."""

    sql: str
    collection: str
    where: P.Pred | None
    fields: dict[Path, str]  # field path -> frame column, for everything outside WHERE
    duck_sql: str  # what DuckDB runs over ``frame`` (a plain projection on the index path skips it)
    outputs: list[str]  # output column names, in SELECT order
    plain: list[tuple[str, Path]] | None  # (name, path) of a projection needing no DuckDB
    star: bool  # SELECT * (documents come from the row store)
    star_except: frozenset[str] = frozenset()
    limit: P.Operand | None = None
    offset: P.Operand | None = None
    param_style: str | None = None  # "named", "positional" or None
    n_positional: int = 0
    duck_params: dict[str, P.Operand] = field(default_factory=dict)  # $name in duck_sql -> operand
    residual: str | None = None  # the part of WHERE DuckDB evaluates (in duck_sql), as SQL

    @cached_property
    def point(self) -> P.Compare | P.ArrayContains | None:
        """WHERE's one leaf when this is a point query, else None: documents (``SELECT *``,
        no EXCEPT, ORDER BY or expressions) where one field equals a value or one array
        contains it (LIMIT and OFFSET allowed). The shape of a key-value lookup, which the
        engine runs without its general planning (SqlEngine.sql says why)."""
        w = self.where
        if not self.star or self.plain is None or self.star_except or self.residual is not None:
            return None
        if (isinstance(w, P.Compare) and w.op == "=") or isinstance(w, P.ArrayContains):
            return w
        return None


POSITIONAL = "__q"  # ? placeholders are renamed $__q0, $__q1, ... in order of appearance


def _normalize_params(sql: str) -> tuple[str, list[tuple[int, int]]]:
    """The text with parameters spelled the one way sqlglot parses reliably, ``$name``, and
    the (position in the new text, characters added so far) pairs that map positions back.

    ``:name`` becomes ``$name`` (same length): sqlglot's DuckDB parser reads ``((:p = x``
    as a DuckDB prefix alias. ``?`` becomes ``$__q<i>``, numbered in order of appearance,
    whatever order the tree is walked in later. Only placeholder tokens change, and a
    space is added at the end of a text that changed.
    """
    try:
        tokens = Dialect.get_or_raise(DIALECT).tokenize(sql)
    except sqlglot.errors.SqlglotError:
        return sql, []  # the parser reports it
    out, shifts, last, extra, n = [], [], 0, 0, 0
    for prev, t in zip([None, *tokens], tokens):
        if t.token_type == TokenType.PLACEHOLDER and t.text == "?":
            name = f"${POSITIONAL}{n}"
            n += 1
            out.append(sql[last:t.start])
            out.append(name)
            last = t.end + 1
            extra += len(name) - 1
            shifts.append((t.start + extra, extra))
        elif (prev is not None and prev.token_type == TokenType.COLON and prev.end + 1 == t.start
              and t.token_type == TokenType.VAR):
            out.append(sql[last:prev.start])
            out.append("$")
            last = prev.end + 1
    out.append(sql[last:])
    text = "".join(out)
    if text != sql:  # sqlglot's tokenizer refuses ``$p ... ''`` when the '' ends the text
        text += " "
    return text, shifts


class _Parser:
    """One parse: turns the sqlglot tree into a Query, checking every node."""

    def __init__(self, sql: str):
        self.sql = sql
        self.text, self._shifts = _normalize_params(sql)
        self.fields: dict[Path, str] = {}
        self.placeholders: list[exp.Placeholder] = []
        self.duck_params: dict[str, P.Operand] = {}
        self.alias: str | None = None
        self.collection = ""  # what FROM names, workspace included (see collection_name)
        self.table = ""  # the collection's name without its workspace (a field may be qualified by it)

    def position(self, node: exp.Expression | None) -> int | None:
        """Character offset in the user's text of the first token of ``node``, if known."""
        if node is None:
            return None
        for n in node.walk():
            start = n.meta.get("start") if isinstance(n, exp.Expression) else None
            if start is not None:
                return self.original(start)
        return None

    def original(self, pos: int) -> int:
        extra = 0
        for at, added in self._shifts:
            if at <= pos:
                extra = added
        return pos - extra

    def error(self, message: str, node: exp.Expression | None = None) -> SqlError:
        return SqlError(message, self.sql, self.position(node))

    def refuse_is_missing(self, duck_sql: str, tree: exp.Expression) -> None:
        """IS_MISSING is answered by posting lists only: a frame has one NULL for null and for
        missing. One left where DuckDB evaluates the query (an OR with a condition the index
        cannot answer, CASE, FILTER, a SELECT item) is refused, never sent on."""
        if re.search(rf"\b{MISSING_FUNCTION}\s*\(", duck_sql, re.IGNORECASE):
            node = next((n for n in tree.find_all(exp.Anonymous) if n.name.upper() == MISSING_FUNCTION), tree)
            raise self.unsupported(f"{MISSING_FUNCTION} where DuckDB evaluates it: the index answers it only in WHERE, "
                                   f"at the top level or under AND/OR/NOT with conditions the index answers "
                                   f"(x IS NULL holds for null and missing alike)", node)

    def unsupported(self, what: str, node: exp.Expression) -> UnsupportedSqlError:
        """The error for ``what`` (which may start with _describe(node) or a keyword), naming
        the construct as the user wrote it and pointing at it (rtindex/sql/messages.py)."""
        position, internal = self.position(node), _describe(node)
        if what.startswith(internal):
            written, start = messages.as_written(node, self.text, internal, self.sql, self.original)
            what, position = written + what[len(internal):], start if start is not None else position
        elif what.split(" ", 1)[0].isupper() and isinstance(node, exp.Select):  # DISTINCT, JOINS, WITH, ...
            start = messages.keyword_position(what.split(" ", 1)[0], self.text)
            position = self.original(start) if start is not None else position
        return UnsupportedSqlError(f"unsupported: {what}", self.sql, position)

    # -- fields and operands --------------------------------------------------------
    def field_path(self, node: exp.Expression) -> Path | None:
        """The document path a Column (or Dot chain) names, or None if it is not a field."""
        if isinstance(node, exp.Dot):
            names = []
            while isinstance(node, exp.Dot):
                if not isinstance(node.expression, exp.Identifier):
                    return None
                names.append(node.expression.name)
                node = node.this
            base = self.field_path(node)
            return base + tuple(reversed(names)) if base is not None else None
        if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
            return None
        parts = tuple(p.name for p in node.parts)
        if len(parts) > 2 and collection_name(parts[0], parts[1]) == self.collection:
            parts = parts[2:]  # ws.coll.field (or commons.coll.field)
        elif len(parts) > 1 and (parts[0] == self.alias or collection_name(None, parts[0]) == self.collection
                                 or parts[0] == self.table):
            parts = parts[1:]
        return parts

    def operand(self, node: exp.Expression) -> P.Operand | None:
        if isinstance(node, exp.Paren):
            return self.operand(node.this)
        if isinstance(node, exp.Placeholder):
            return self.param(node)
        if isinstance(node, exp.Null):
            return P.Const(None)
        if isinstance(node, exp.Boolean):
            return P.Const(node.this)
        if isinstance(node, exp.Literal):
            if node.is_string:
                return P.Const(node.this)
            return P.Const(_number(node.this))
        if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            return P.Const(-_number(node.this.this))
        name = _time_function(node)
        if name is not None:  # TIMESTAMP_SECONDS(1700000000): evaluated when the query is bound
            self.check_arity(name, node)
            arg = self.operand(node.expressions[0])
            return P.Call(name, arg, self.position(node)) if arg is not None else None
        return None

    def check_arity(self, name: str, node: exp.Expression) -> None:
        if len(node.expressions) != 1:
            raise self.error(f"{name} takes one argument, not {len(node.expressions)}", node)

    def param(self, node: exp.Placeholder) -> P.Param:
        name = str(node.this)
        key: str | int = int(name[len(POSITIONAL):]) if name.startswith(POSITIONAL) else name
        self.placeholders.append(node)
        return P.Param(key, self.position(node))

    def duck_placeholder(self, node: exp.Placeholder) -> exp.Placeholder:
        """The user's parameter as the next $p<i> of the DuckDB text (``duck_params``)."""
        name = f"p{len(self.duck_params)}"
        self.duck_params[name] = self.param(node)
        return exp.Placeholder(this=name)

    # -- WHERE ---------------------------------------------------------------------
    def predicate(self, node: exp.Expression) -> P.Pred:
        if isinstance(node, exp.Paren):
            return self.predicate(node.this)
        if isinstance(node, (exp.And, exp.Or)):
            cls = P.And if isinstance(node, exp.And) else P.Or
            items = []
            for side in (node.this, node.expression):
                q = self.predicate(side)
                items.extend(q.items if type(q) is cls else [q])  # flatten a AND (b AND c)
            return cls(tuple(items))
        if isinstance(node, exp.Not):
            return P.Not(self.predicate(node.this))
        if type(node) in COMPARISONS:
            op = COMPARISONS[type(node)]
            path, value = self.field_path(node.this), self.operand(node.expression)
            if path is None or value is None:
                path, value, op = self.field_path(node.expression), self.operand(node.this), FLIPPED[op]
            if path is None or value is None:
                raise self.unsupported(f"comparison {node.sql(DIALECT)} in WHERE (compare a field with a value "
                                       "or parameter)", node)
            if path == EVENT_TIME and isinstance(value, P.Const) and isinstance(value.value, str):
                # an ISO-8601 text: DuckDB reads it as a timestamp
                raise self.unsupported("_event_time compared with a string in the index", node)
            return P.Compare(path, op, value)
        if isinstance(node, exp.In):
            path = self.where_field(node.this, node)
            if node.args.get("query") is not None or not node.expressions:
                raise self.unsupported("IN needs a list of values (no subqueries)", node)
            return P.Or(tuple(P.Compare(path, "=", self.where_operand(e)) for e in node.expressions))
        if isinstance(node, exp.Between):
            path = self.where_field(node.this, node)
            lo, hi = self.where_operand(node.args["low"]), self.where_operand(node.args["high"])
            return P.And((P.Compare(path, ">=", lo), P.Compare(path, "<=", hi)))
        if isinstance(node, exp.Is):
            if not isinstance(node.expression, exp.Null):
                raise self.unsupported("IS supports only IS [NOT] NULL", node)
            return P.IsNull(self.where_field(node.this, node))
        if isinstance(node, exp.Like):
            if node.args.get("escape") is not None:
                raise self.unsupported("LIKE ... ESCAPE", node)
            pattern = self.where_operand(node.expression)
            if isinstance(pattern, P.Const) and not _index_pattern(pattern.value):
                raise self.unsupported("a LIKE pattern other than a literal prefix in the index", node)
            like = P.Like(self.where_field(node.this, node), pattern, self.position(node))
            return P.Not(like) if node.args.get("negate") else like  # x NOT LIKE p
        if isinstance(node, exp.ArrayContains):
            return P.ArrayContains(self.where_field(node.this, node), self.where_operand(node.expression))
        if isinstance(node, exp.Anonymous) and node.name.upper() == MISSING_FUNCTION:
            if len(node.expressions) != 1:
                raise self.error("IS_MISSING takes one field", node)
            return P.IsMissing(self.where_field(node.expressions[0], node))
        raise self.unsupported(f"{_describe(node)} in WHERE (WHERE combines comparisons of a field with a "
                           "value: =, <>, <, <=, >, >=, IN, BETWEEN, IS [NOT] NULL, IS_MISSING, LIKE 'prefix%', "
                           "ARRAY_CONTAINS)", node)

    def split_where(self, node: exp.Expression) -> tuple[P.Pred | None, exp.Expression | None]:
        """WHERE as (what the index answers, the residual DuckDB evaluates): its top-level AND
        conjuncts that :meth:`predicate` reads go to the index, the others stay SQL."""
        index, rest = [], []
        for conjunct in conjuncts(node):
            try:
                index.append(self.predicate(conjunct))
            except UnsupportedSqlError:
                rest.append(conjunct)
        pred = (index[0] if len(index) == 1 else P.And(tuple(index))) if index else None
        return pred, exp.and_(*rest, copy=False) if rest else None

    def where_field(self, node: exp.Expression, parent: exp.Expression) -> Path:
        path = self.field_path(node)
        if path is None:
            raise self.unsupported(f"{_describe(node)} where WHERE needs a field", parent)
        return path

    def where_operand(self, node: exp.Expression) -> P.Operand:
        value = self.operand(node)
        if value is None:
            raise self.unsupported(f"{_describe(node)} where WHERE needs a value or parameter", node)
        return value

    # -- the rest ---------------------------------------------------------------------
    def check_nodes(self, tree: exp.Expression) -> None:
        for node in tree.walk():
            if isinstance(node, ALLOWED):
                if isinstance(node, exp.DataType) and node.this.name not in CAST_TYPES:
                    raise self.unsupported(f"type {node.sql(DIALECT)} (CAST to one of {', '.join(sorted(CAST_TYPES))})",
                                       node)
                continue
            if isinstance(node, exp.Anonymous) and node.name.upper() == MISSING_FUNCTION:
                continue
            name = _time_function(node)
            if name is not None:
                self.check_arity(name, node)
                continue
            raise self.unsupported(_describe(node), node)

    def frame_column(self, path: Path) -> str:
        if path not in self.fields:
            self.fields[path] = f"f{len(self.fields)}"
        return self.fields[path]

    def rewrite(self, node: exp.Expression, aliases: set[str]) -> exp.Expression:
        """Field references -> frame columns; placeholders -> $p<i> DuckDB parameters."""
        def fix(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Placeholder):
                return self.duck_placeholder(n)
            if isinstance(n, exp.Column) and len(n.parts) == 1 and n.name in aliases:
                return n
            name = _time_function(n)
            if name is not None:  # rewritten here: transform() does not visit a replacement's children
                return _duck_time_function(name, self.rewrite(n.expressions[0], aliases))
            path = self.field_path(n) if isinstance(n, (exp.Column, exp.Dot)) else None
            if path is not None:
                return exp.column(self.frame_column(path), quoted=True)
            return n
        return node.transform(fix, copy=True)

    def statement(self) -> exp.Expression:
        """The one statement of the text (a syntax error in the user's words otherwise)."""
        check_nesting(self.sql, self.text, self.original)
        try:
            trees = sqlglot.parse(self.text, read=DIALECT)
        except sqlglot.errors.SqlglotError as e:
            raise syntax_error(self.sql, self.text, e, self.original,
                               lambda word: "?" if word.startswith("$" + POSITIONAL) else word) from e
        except RecursionError:  # nesting check_nesting does not count, too deep for the parser
            raise SqlError("the query nests too deep to be read: flatten it, or split it into several "
                           "queries", self.sql) from None
        trees = [t for t in trees if t is not None]
        if len(trees) != 1:
            raise SqlError(f"expected one statement, got {len(trees)}", self.sql)
        check_depth(self.sql, trees[0])
        for dot in trees[0].find_all(exp.Dot):
            if isinstance(dot.this, (exp.Literal, exp.Boolean)):
                # a field of a number, string or boolean (``0 .x``): none has one, and the text
                # made of it for DuckDB (0.x) reads as something else
                raise self.unsupported(f"a field of the value {dot.this.sql(DIALECT)} (only objects have fields)", dot)
        for group in trees[0].find_all(exp.Group):  # (sqlglot reads "GROUP BY" with nothing after it)
            if not any(group.args.get(k) for k in ("expressions", "all", "rollup", "cube", "grouping_sets")):
                pos = messages.keyword_position("GROUP BY", self.text)
                raise SqlError("syntax error: GROUP BY names nothing to group by (give one or more fields or "
                               "expressions, or leave GROUP BY out)", self.sql,
                               self.original(pos) if pos is not None else None)
        return trees[0]

    def parse(self) -> Query:
        tree = self.statement()
        if not isinstance(tree, exp.Select):
            raise self.unsupported(f"{_describe(tree)} statement (only SELECT)", tree)
        for arg in ("with_", "with", "joins", "laterals", "windows", "qualify", "distinct", "into", "pivots",
                    "sample", "locks", "kind", "prewhere", "connect", "match"):
            if tree.args.get(arg):
                raise self.unsupported(f"{arg.rstrip('_').upper()} (a query reads one collection)", tree)
        group = tree.args.get("group")
        if group is not None and group.args.get("all"):
            raise self.unsupported("GROUP BY ALL in the single-collection form", group)
        _normalize_time_functions(tree)
        self.check_nodes(tree)
        source = tree.args.get("from_") or tree.args.get("from")
        if source is None or not isinstance(source.this, exp.Table) or not isinstance(source.this.this,
                                                                                        exp.Identifier):
            raise self.unsupported("a SELECT without FROM <collection>", tree)
        table = source.this
        if table.args.get("catalog"):
            raise self.unsupported("a catalog in FROM (name a collection: coll, or workspace.coll)", table)
        self.collection = collection_name(table.text("db") or None, table.name)
        self.table = self.collection.rpartition(".")[2]
        self.alias = table.alias or None

        where = tree.args.get("where")
        pred, residual = self.split_where(where.this) if where is not None else (None, None)

        limit = self.limit_operand(tree.args.get("limit"))
        offset = self.limit_operand(tree.args.get("offset"))
        query = self.select_part(tree, pred, limit, offset, residual)
        positional = {str(p.this) for p in self.placeholders if str(p.this).startswith(POSITIONAL)}
        if positional and len(positional) != len({str(p.this) for p in self.placeholders}):
            raise SqlError("use either :name or ? parameters, not both", self.sql)
        query.param_style = ("positional" if positional else "named") if self.placeholders else None
        query.n_positional = len(positional)
        return query

    def limit_operand(self, node: exp.Expression | None) -> P.Operand | None:
        if node is None:
            return None
        value = self.operand(node.expression)
        if value is None or isinstance(value, P.Call) or (isinstance(value, P.Const) and (not isinstance(value.value, int)
                                                            or isinstance(value.value, bool) or value.value < 0)):
            raise self.error("LIMIT and OFFSET take a non-negative integer or a parameter", node)
        return value

    def select_part(self, tree: exp.Select, pred, limit, offset, residual: exp.Expression | None) -> Query:
        items = tree.expressions
        aliases = {e.alias for e in items if isinstance(e, exp.Alias)}
        stars = [e for e in items if isinstance(e, exp.Star)]
        for e in items:
            if isinstance(e, exp.Column) and isinstance(e.this, exp.Star):
                stars.append(e)
        if len(stars) > 1:
            raise self.unsupported("more than one *", stars[1])
        star_except: frozenset[str] = frozenset()
        if stars:
            exc = stars[0].args.get("except_") or stars[0].args.get("except") or []
            names = []
            for c in exc:
                path = self.field_path(c)
                if path is None or len(path) != 1:
                    raise self.unsupported("* EXCEPT of a nested field (name top-level fields)", c)
                names.append(path[0])
            star_except = frozenset(names)
            for key in ("replace", "rename"):
                if stars[0].args.get(key):
                    raise self.unsupported(f"* {key.upper()}", stars[0])
        grouped = bool(tree.args.get("group")) or bool(tree.args.get("having")) or any(
            e.find(*AGGREGATES) for e in items)
        if stars and grouped:
            raise self.error("SELECT * cannot be combined with GROUP BY or aggregates", stars[0])

        outputs: list[str] = []
        plain: list[tuple[str, Path]] | None = ([] if not grouped and not tree.args.get("order") and residual is None
                                                else None)
        select_sql: list[str] = []
        for e in items:
            if e in stars:
                select_sql.append('"__pos"')
                continue
            inner = e.this if isinstance(e, exp.Alias) else e
            path = self.field_path(inner)
            name = frames.unique_name(e.alias if isinstance(e, exp.Alias) else
                           (".".join(path) if path is not None else inner.sql(DIALECT)), outputs)
            outputs.append(name)
            if plain is not None:
                if path is not None:
                    plain.append((name, path))
                else:
                    plain = None
            select_sql.append(f"{self.rewrite(inner, set()).sql(DIALECT)} AS {_quote(name)}")
        if stars and plain is not None:
            plain = [] if len(items) == 1 else None  # * with expressions: DuckDB computes the extras
        text = "SELECT " + ", ".join(select_sql) + ' FROM "frame"'
        if residual is not None:
            text += " WHERE " + self.rewrite(residual, set()).sql(DIALECT)
        group = tree.args.get("group")
        if group is not None:
            text += " GROUP BY " + ", ".join(self.rewrite(g, aliases).sql(DIALECT) for g in group.expressions)
        having = tree.args.get("having")
        if having is not None:
            text += " HAVING " + self.rewrite(having.this, aliases).sql(DIALECT)
        order = tree.args.get("order")
        if order is not None:
            text += " ORDER BY " + ", ".join(self.rewrite(o, aliases).sql(DIALECT) for o in order.expressions)
        self.refuse_is_missing(text, tree)
        return Query(sql=self.sql, collection=self.collection, where=pred, fields=dict(self.fields),
                     duck_sql=text, outputs=outputs, plain=plain, star=bool(stars), star_except=star_except,
                     limit=limit, offset=offset, duck_params=dict(self.duck_params),
                     residual=residual.sql(DIALECT) if residual is not None else None)


def _duck_time_function(name: str, arg: exp.Expression) -> exp.Expression:
    """DuckDB for a TIME_FUNCTIONS call over an already rewritten argument.

    Timestamps are TIMESTAMPTZ (what ``_event_time`` is in a frame and in a scan), built as
    ``to_timestamp(0) + to_microseconds(n)``: an instant, whatever DuckDB's session time
    zone. The argument of TIMESTAMP_* must be an integer (to_microseconds takes no other
    type). UNIX_* read an instant exactly with epoch_us and round down (towards the past, as
    Rockset and BigQuery do); the COALESCE types a bare NULL (or a column of nulls) without
    shifting a TIMESTAMP by the session's time zone, as a CAST to TIMESTAMPTZ would.
    """
    takes_timestamp, unit = TIME_FUNCTIONS[name]
    if not takes_timestamp:
        us = arg if unit == 1 else exp.Mul(this=exp.Paren(this=arg), expression=_bigint(unit))
        return exp.Paren(this=exp.Add(this=exp.Anonymous(this="to_timestamp", expressions=[exp.Literal.number(0)]),
                                      expression=exp.Anonymous(this="to_microseconds", expressions=[us])))
    typed = exp.Coalesce(this=arg, expressions=[exp.cast(exp.Null(), "TIMESTAMP")])
    us = exp.Anonymous(this="epoch_us", expressions=[typed])
    if unit == 1:
        return us
    # floor division: DuckDB's // truncates towards zero; a - (a mod u, made non-negative)
    # is a multiple of u, so the division below is exact
    rem = exp.Mod(this=exp.Paren(this=exp.Add(this=exp.Paren(this=exp.Mod(this=us.copy(), expression=_bigint(unit))),
                                              expression=_bigint(unit))),
                  expression=_bigint(unit))
    return exp.Paren(this=exp.IntDiv(this=exp.Paren(this=exp.Sub(this=us, expression=rem)), expression=_bigint(unit)))


def _bigint(n: int) -> exp.Expression:
    return exp.cast(exp.Literal.number(n), "BIGINT")


def conjuncts(node: exp.Expression) -> Iterator[exp.Expression]:
    """The top-level AND operands of a condition (through parentheses)."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        yield from conjuncts(node.this)
        yield from conjuncts(node.expression)
    else:
        yield node


def _index_pattern(pattern: object) -> bool:
    """Whether the index answers LIKE ``pattern`` (a string: a literal prefix, or no wildcard)."""
    try:
        P.like_prefix(pattern)
    except SqlError:
        return not isinstance(pattern, str)  # not a string: the index path's error says so
    return True


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def _describe(node: exp.Expression) -> str:
    if isinstance(node, (exp.Anonymous, exp.Func)):
        name = node.name if isinstance(node, exp.Anonymous) else node.sql_name()
        return f"function {name.upper()}"
    return node.key.upper().replace("_", " ")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
