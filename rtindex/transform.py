"""Ingest transformations: one SQL ``SELECT ... FROM _input [WHERE ...]`` a collection applies
to every incoming document, compiled once into a Python function (docs/sources.md).

Rockset's shape: ``*`` keeps the input's fields, ``* EXCEPT (a, b.c)`` drops some, ``b.*``
lifts an object's fields to the top (``b.* EXCEPT (c)`` too), ``expr AS name`` adds or
replaces a field (an explicit projection wins over a field ``*`` brought), and WHERE keeps
only the documents it holds for. ``AS _id`` and ``AS _event_time`` set the document's key
and time. A projection whose value is NULL (a missing field, a CAST of nothing) is left out
of the document.

Everything is checked when the transformation is set: one SELECT over ``_input``, no
JOIN, GROUP BY, ORDER BY, LIMIT, DISTINCT, subquery, aggregate or parameter, and only the
functions of :data:`FUNCTIONS`; anything else is a SqlError naming it and where it is. A
document the transformation cannot take (``x * 2`` where ``x`` is a string, a CAST that
fails) is refused with a SchemaError saying why, and the other documents go on.

A document given as JSON text (NDJSON, a JSON array, a Kafka message) takes a shorter way
when the transformation only drops, renames and computes top-level fields: the compiled
``top_rewrite`` copies the members kept and renamed as text and checks the dropped ones
against JSON's grammar, as a parse would; only the fields an expression or WHERE reads
are parsed. :meth:`Transformation.text` is that way; anything it cannot take goes the dict way.

Values are JSON values and datetimes (from CAST AS TIMESTAMP and the time functions);
operators follow docs/sql.md: comparisons are within a type family (numbers, strings,
bools, timestamps; across families UNKNOWN), logic is three-valued, ``/`` divides as
floats and a division by zero is NULL, as in DuckDB.
"""

from __future__ import annotations

import math
import operator
import re
from datetime import datetime, timezone
from typing import Any, Callable

import orjson
import sqlglot
from sqlglot import exp

from rtindex import documents
from rtindex._impl import top_rewrite
from rtindex.errors import SchemaError, SqlError
from rtindex.sql import messages
from rtindex.sql.predicates import TIME_FUNCTIONS, call_value
from rtindex.sql.syntax import check_depth, check_nesting, syntax_error

DIALECT = "duckdb"
INPUT = "_input"
MAX_SQL = 64 << 10  # characters of a transformation's text
Fn = Callable[[dict], Any]
_SAME = lambda pos: pos  # noqa: E731 (positions in the parsed text are the user's)
# sqlglot's own nodes for some of Rockset's time functions (by version): name -> node class
_TIME_NODES = {cls: name for cls, name in ((getattr(exp, "UnixSeconds", None), "UNIX_SECONDS"),
                                           (getattr(exp, "UnixMillis", None), "UNIX_MILLIS"),
                                           (getattr(exp, "UnixMicros", None), "UNIX_MICROS")) if cls is not None}
INT_TYPES = {"BIGINT", "INT", "INTEGER", "SMALLINT", "TINYINT", "HUGEINT", "UBIGINT", "UINT"}
FLOAT_TYPES = {"DOUBLE", "FLOAT", "REAL", "DECIMAL"}
TEXT_TYPES = {"VARCHAR", "TEXT", "STRING", "CHAR", "NCHAR", "NVARCHAR"}
TIME_TYPES = {"TIMESTAMP", "TIMESTAMPNTZ", "TIMESTAMPTZ"}
# what a transformation may call, for the error that lists them
FUNCTIONS = ("CAST", "TRY_CAST", "COALESCE", "NULLIF", "IF", "CONCAT", "CONCAT_WS", "LOWER", "UPPER", "TRIM",
             "LENGTH", "ARRAY_LENGTH", "SUBSTRING", "REPLACE", "ABS", "ROUND", "FLOOR", "CEIL",
             *sorted(TIME_FUNCTIONS))


FALLBACK = object()  # Transformation.text: this text goes the dict way


class Transformation:
    """A checked, compiled ingest transformation: ``t(doc)`` is the document to store, or
    None when WHERE leaves it out; SchemaError when the document cannot be transformed.
    The input document is never changed."""

    __slots__ = ("sql", "_run", "_text")

    def __init__(self, sql: str):
        if not isinstance(sql, str) or not sql.strip():
            raise SqlError("an ingest transformation is a SELECT ... FROM _input text, not "
                           f"{type(sql).__name__ if not isinstance(sql, str) else 'an empty text'}")
        if len(sql) > MAX_SQL:
            raise SqlError(f"an ingest transformation is at most {MAX_SQL} characters, not {len(sql)}")
        self.sql = sql
        self._run, self._text = _Compiler(sql).compile()

    def __call__(self, doc: dict) -> dict | None:
        try:
            return self._run(doc)
        except _Failed as e:
            raise SchemaError(f"the ingest transformation failed: {e.args[0]}") from None
        except RecursionError:
            raise SchemaError("the ingest transformation failed: the document nests too deep") from None

    @property
    def takes_text(self) -> bool:
        """Whether :meth:`text` can rewrite documents given as text."""
        return self._text is not None

    def text(self, raw: bytes) -> Any:
        """The JSON text to store for the document ``raw``, the same document ``t(parsed)``
        makes (its members in another order); None when WHERE leaves it out; FALLBACK when
        it must be parsed and go the dict way (a text the scan cannot read, a dropped or
        read value that is not JSON: the parse says what is wrong)."""
        try:
            return self._text(raw)
        except _Failed as e:
            raise SchemaError(f"the ingest transformation failed: {e.args[0]}") from None
        except (orjson.JSONDecodeError, RecursionError):
            return FALLBACK

    def __repr__(self) -> str:
        return f"Transformation({self.sql!r})"


class _Failed(Exception):
    """A document the transformation cannot take, and why."""


class _Compiler:
    """The checks and the closures of one transformation text."""

    def __init__(self, sql: str):
        self.sql = sql
        self.alias = INPUT  # what names the input in the text (FROM _input AS i: also i)
        self.reads: set = set()  # the top-level fields the expressions read

    def error(self, what: str, node: exp.Expression | None) -> SqlError:
        if node is None:
            return SqlError(f"ingest transformation: {what}", self.sql)
        written, pos = messages.as_written(node, self.sql, type(node).__name__, self.sql, _SAME)
        return SqlError(f"ingest transformation: {what}: {written}", self.sql, pos)

    def statement(self) -> exp.Select:
        check_nesting(self.sql, self.sql, _SAME)
        try:
            trees = [t for t in sqlglot.parse(self.sql, read=DIALECT) if t is not None]
        except sqlglot.errors.SqlglotError as e:
            raise syntax_error(self.sql, self.sql, e, _SAME, lambda word: word) from e
        except RecursionError:
            raise SqlError("ingest transformation: it nests too deep to be read", self.sql) from None
        if len(trees) != 1:
            raise SqlError(f"ingest transformation: expected one SELECT, got {len(trees)} statements", self.sql)
        tree = trees[0]
        check_depth(self.sql, tree)
        if not isinstance(tree, exp.Select):
            raise self.error("it must be one SELECT ... FROM _input, not", tree)
        for key, what in (("with_", "WITH"), ("joins", "JOIN"), ("group", "GROUP BY (rollups)"),
                          ("having", "HAVING"), ("order", "ORDER BY"), ("limit", "LIMIT"), ("offset", "OFFSET"),
                          ("distinct", "DISTINCT"), ("laterals", "LATERAL"), ("qualify", "QUALIFY"),
                          ("windows", "WINDOW")):
            if tree.args.get(key):
                node = tree.args[key]
                raise self.error(f"{what} is not taken (a transformation sees one document at a time)",
                                 node[0] if isinstance(node, list) else node)
        source = tree.args.get("from_") or tree.args.get("from")
        table = source.this if source is not None else None
        if not isinstance(table, exp.Table) or table.name != INPUT or table.args.get("db"):
            raise self.error("the documents are read FROM _input", table if table is not None else tree)
        if table.alias:
            self.alias = table.alias
        for node in tree.find_all(exp.Placeholder, exp.Parameter):
            raise self.error("parameters are not taken (write the value)", None)
        for node in tree.find_all(exp.Subquery, exp.Exists):
            raise self.error("subqueries are not taken", node)
        return tree

    def compile(self) -> tuple[Callable[[dict], dict | None], Callable[[bytes], Any] | None]:
        tree = self.statement()
        where = self.expr(tree.args["where"].this) if tree.args.get("where") else None
        drops: list[tuple] | None = None  # paths * EXCEPT leaves out; None: no *
        lifts: list[tuple[Fn, frozenset]] = []  # b.* [EXCEPT (...)]: the object, the names it leaves out
        renames: list[tuple[str, str]] = []  # (output name, input field) of plain top-level fields
        computed: list[tuple[str, Fn]] = []
        names: set[str] = set()
        for item in tree.expressions:
            if isinstance(item, exp.Star):
                if drops is not None:
                    raise self.error("* is given twice", item)
                drops = [self.path(c) for c in item.args.get("except_") or item.args.get("except") or ()]
                if item.args.get("replace") or item.args.get("rename"):
                    raise self.error("* REPLACE/RENAME is not taken (write * EXCEPT (a), expr AS a)", item)
                continue
            if isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
                obj = self.path_fn(self.path(item, star=True))
                leave = item.this.args.get("except_") or item.this.args.get("except") or ()
                lifts.append((obj, frozenset(self.top_name(c) for c in leave)))
                continue
            name, node = (item.alias, item.this) if isinstance(item, exp.Alias) else (None, item)
            if name is None:
                if not isinstance(node, (exp.Column, exp.Dot)):
                    raise self.error("a computed field needs a name: write `... AS name`", node)
                path = self.path(node)
                name = next((p for p in reversed(path) if isinstance(p, str)), None)
                if name is None:
                    raise self.error("this field needs a name: write `... AS name`", node)
            if name in names:
                raise self.error(f"the field {name!r} is given twice", item)
            names.add(name)
            plain = self.path(node) if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star) else None
            if plain is not None and len(plain) == 1:
                renames.append((name, plain[0]))
            else:
                computed.append((name, self.expr(node)))
        if drops is None and not lifts and not names:
            raise SqlError("ingest transformation: it selects nothing", self.sql)
        text = None
        if drops is not None and not lifts and all(len(p) == 1 for p in drops):
            text = _text_way(where, [p[0] for p in drops], renames, computed, self.reads)
        return _assemble(where, drops, lifts, renames, computed), text

    # -- field references -------------------------------------------------------------
    def path(self, node: exp.Expression, star: bool = False) -> tuple:
        """The path of a field reference (``a``, ``a.b``, ``_input.a``, ``a[1].b``, ``"a b"``)."""
        parts: list = []
        cur = node
        while True:
            if isinstance(cur, exp.Column):
                names = [p.name for p in reversed(cur.parts[:-1] if star else cur.parts)]
                if star and not isinstance(cur.this, exp.Star):
                    raise self.error("only an object's fields can be lifted with .*", node)
                parts.extend(names)
                break
            if isinstance(cur, exp.Dot):
                if not isinstance(cur.expression, exp.Identifier):
                    raise self.error("a field name is expected after the dot", cur)
                parts.append(cur.expression.name)
                cur = cur.this
            elif isinstance(cur, exp.Bracket):
                if len(cur.expressions) != 1 or not isinstance(cur.expressions[0], exp.Literal):
                    raise self.error("an index must be one literal number or name", cur)
                key = cur.expressions[0]
                parts.append(key.name if key.is_string else int(key.name))
                cur = cur.this
            else:
                raise self.error("a field reference is expected", cur)
        parts.reverse()
        if len(parts) > 1 and parts[0] == self.alias:
            parts = parts[1:]
        if not parts:
            raise self.error("a field reference is expected", node)
        return tuple(parts)

    def top_name(self, node: exp.Expression) -> str:
        path = self.path(node)
        if len(path) != 1 or not isinstance(path[0], str):
            raise self.error("EXCEPT of an object's .* names its own fields", node)
        return path[0]

    def path_fn(self, path: tuple) -> Fn:
        self.reads.add(path[0])
        if len(path) == 1:
            key = path[0]
            return lambda d: d.get(key)

        def get(d: dict) -> Any:
            v: Any = d
            for p in path:
                if type(v) is dict:
                    v = v.get(p) if isinstance(p, str) else None
                elif type(v) is list and isinstance(p, int):
                    v = v[p] if -len(v) <= p < len(v) else None
                else:
                    return None
            return v
        return get

    # -- expressions -----------------------------------------------------------------
    def expr(self, node: exp.Expression) -> Fn:
        if isinstance(node, (exp.Column, exp.Dot, exp.Bracket)):
            if isinstance(node, exp.Column) and isinstance(node.this, exp.Star):
                raise self.error("a .* stands alone in the SELECT list", node)
            return self.path_fn(self.path(node))
        if isinstance(node, exp.Paren):
            return self.expr(node.this)
        if isinstance(node, exp.Literal):
            value = node.name if node.is_string else _number(node.name)
            return lambda d: value
        if isinstance(node, exp.Null):
            return lambda d: None
        if isinstance(node, exp.Boolean):
            value = bool(node.this)
            return lambda d: value
        op = _ARITHMETIC.get(type(node))
        if op is not None:
            return self.arithmetic(node, op)
        cmp = _COMPARISONS.get(type(node))
        if cmp is not None:
            return self.comparison(node, cmp)
        build = _BUILDERS.get(type(node))
        if build is not None:
            return build(self, node)
        if isinstance(node, exp.Anonymous) and node.name.upper() in TIME_FUNCTIONS or type(node) in _TIME_NODES:
            name = node.name.upper() if isinstance(node, exp.Anonymous) else _TIME_NODES[type(node)]
            args = node.expressions if isinstance(node, exp.Anonymous) else [node.this]
            if len(args) != 1:
                raise self.error(f"{name} takes one argument", node)
            return self.time_function(name, self.expr(args[0]), node)
        if isinstance(node, (exp.Func, exp.Anonymous)):
            raise self.error(f"this function is not taken (a transformation calls {', '.join(FUNCTIONS)})", node)
        raise self.error("this is not taken", node)

    def text_of(self, node: exp.Expression) -> str:
        written, _ = messages.as_written(node, self.sql, type(node).__name__, self.sql, _SAME)
        return written

    def arithmetic(self, node: exp.Binary, op: Callable[[Any, Any], Any]) -> Fn:
        a, b, what = self.expr(node.this), self.expr(node.expression), self.text_of(node)
        numbers = (int, float)

        def failed(x: Any, y: Any) -> _Failed:
            bad = x if not _is_number(x) else y
            return _Failed(f"{what} takes numbers, not {_type(bad)} {_short(bad)}")

        literal = node.expression
        if isinstance(literal, exp.Literal) and not literal.is_string:  # x * 2: one call a document
            y = _number(literal.name)

            def run_literal(d: dict) -> Any:
                x = a(d)
                if x is None:
                    return None
                if type(x) not in numbers:
                    raise failed(x, y)
                v = op(x, y)
                return None if type(v) is float and not math.isfinite(v) else v
            return run_literal

        def run(d: dict) -> Any:
            x, y = a(d), b(d)
            if x is None or y is None:
                return None
            if type(x) not in numbers or type(y) not in numbers:
                raise failed(x, y)
            v = op(x, y)
            return None if type(v) is float and not math.isfinite(v) else v
        return run

    def comparison(self, node: exp.Binary, op: Callable[[Any, Any], bool]) -> Fn:
        a, b = self.expr(node.this), self.expr(node.expression)

        def run(d: dict) -> bool | None:
            x, y = a(d), b(d)
            if x is None or y is None or _family(x) != _family(y):
                return None
            return op(x, y)
        return run

    def time_function(self, name: str, arg: Fn, node: exp.Expression) -> Fn:
        what = self.text_of(node)

        def run(d: dict) -> Any:
            try:
                return call_value(name, arg(d))
            except SqlError as e:
                raise _Failed(f"{what}: {e.message}") from None
        return run


def _assemble(where: Fn | None, drops: list[tuple] | None, lifts: list, renames: list, computed: list):
    """The function of a transformation from its parts (see _Compiler.compile)."""
    top_drops = tuple(p[0] for p in drops or () if len(p) == 1)
    deep_drops = [p for p in drops or () if len(p) > 1]

    def run(doc: dict) -> dict | None:
        if where is not None and where(doc) is not True:
            return None
        if drops is None:
            out: dict = {}
        else:
            out = doc.copy()
            for k in top_drops:
                out.pop(k, None)
            for p in deep_drops:
                _drop(out, p)
        for obj, leave in lifts:
            v = obj(doc)
            if type(v) is dict:
                for k, x in v.items():
                    if k not in leave:
                        out[k] = x
        for name, key in renames:
            v = doc.get(key)
            if v is None:
                out.pop(name, None)
            else:
                out[name] = v
        for name, fn in computed:
            v = fn(doc)
            if v is None:
                out.pop(name, None)
            else:
                out[name] = v
        return out
    return run


def _text_way(where: Fn | None, drops: list[str], renames: list, computed: list, reads: set):
    """Transformation.text for a transformation of ``*`` with top-level drops, renames and
    computed fields (see the module doc); None when a name is written with an escape in
    JSON (the scan compares names as written)."""
    def key(name: str) -> bytes:
        return orjson.dumps(name)[1:-1]
    replaced = [name for name, _ in renames] + [name for name, _ in computed]
    dropped = list(dict.fromkeys([*drops, *replaced]))  # left out of the text that is kept
    read = [k for k in dict.fromkeys([*(src for _, src in renames), *reads]) if k not in dropped]
    keys = tuple(key(k) for k in [*dropped, *read])
    if any(b"\\" in k for k in keys):  # (the names made are among the keys dropped)
        return None
    n_drop = len(dropped)
    position = {k: i for i, k in enumerate([*dropped, *read])}
    # the values read, as one JSON array the scan writes (null for an absent one: a read
    # of either is NULL); the scan checks those it drops
    reading = list(dict.fromkeys(reads))
    parse = tuple(position[name] for name in reading)
    new: list = [None] * len(keys)  # the renames, made by the scan: where the source is
    for name, src in renames:
        if new[position[src]] is not None:  # (one name a source: the scan writes one)
            return None
        new[position[src]] = orjson.dumps(name) + b":"
    renamed = tuple(new)
    made = [(orjson.dumps(name) + b":", fn) for name, fn in computed]
    loads, dumps = orjson.loads, orjson.dumps

    def run(raw: bytes) -> Any:
        got = top_rewrite(raw, keys, n_drop, renamed, parse)
        if got is None:
            return FALLBACK
        kept, values = got
        doc = dict(zip(reading, loads(values))) if parse else {}
        if where is not None and where(doc) is not True:
            return None
        parts = [kept] if kept else []
        for name, fn in made:
            v = fn(doc)
            if v is not None:
                parts.append(name + dumps(v if type(v) is not datetime else documents.json_value(v)))
        return b"{" + b",".join(parts) + b"}"
    return run


def _drop(out: dict, path: tuple) -> None:
    """Leave ``path`` out of ``out``, copying the objects on the way (never the input's)."""
    head, rest = path[0], path[1:]
    v = out.get(head)
    if type(v) is dict and isinstance(rest[0], str) and rest[0] in v:
        v = out[head] = dict(v)
        if len(rest) == 1:
            del v[rest[0]]
        else:
            _drop(v, rest)


# -- values -------------------------------------------------------------------------
def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def _is_number(v: Any) -> bool:
    return (type(v) is int or type(v) is float) and v is not True and v is not False


def _family(v: Any) -> type:
    t = type(v)
    return float if t is int else t


def _type(v: Any) -> str:
    return {str: "a string", bool: "a boolean", dict: "an object", list: "an array", int: "a number",
            float: "a number", datetime: "a timestamp"}.get(type(v), type(v).__name__)


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _divide(x: Any, y: Any) -> Any:
    return None if y == 0 else x / y


def _int_divide(x: Any, y: Any) -> Any:
    return None if y == 0 else x // y


def _mod(x: Any, y: Any) -> Any:
    return None if y == 0 else math.fmod(x, y) if type(x) is float or type(y) is float else \
        (abs(x) % abs(y)) * (1 if x >= 0 else -1)


# (a float result that is not finite, an overflow, is NULL: JSON has no such number)
_ARITHMETIC = {exp.Add: operator.add, exp.Sub: operator.sub, exp.Mul: operator.mul, exp.Div: _divide,
               exp.IntDiv: _int_divide,
               exp.Mod: _mod}
_COMPARISONS = {exp.EQ: lambda x, y: x == y, exp.NEQ: lambda x, y: x != y, exp.LT: lambda x, y: x < y,
                exp.LTE: lambda x, y: x <= y, exp.GT: lambda x, y: x > y, exp.GTE: lambda x, y: x >= y}


def _text(v: Any) -> str:
    """A value as CAST(... AS VARCHAR) writes it."""
    if type(v) is str:
        return v
    if v is True or v is False:
        return "true" if v else "false"
    if type(v) is datetime:
        return v.isoformat(sep=" ")
    if type(v) in (dict, list):
        return orjson.dumps(v).decode()
    return repr(v) if type(v) is float else str(v)


def _cast(v: Any, to: str, what: str) -> Any:
    """``v`` as the SQL type ``to``; _Failed when it cannot be."""
    try:
        if to in TEXT_TYPES:
            return _text(v)
        if to in INT_TYPES:
            if v is True or v is False:
                return int(v)
            if type(v) is float:
                return int(_round_half_away(v))
            if type(v) is str:
                s = v.strip()
                return int(s) if re.fullmatch(r"[+-]?\d+", s) else int(_round_half_away(float(s)))
            if type(v) is int:
                return v
        elif to in FLOAT_TYPES:
            if type(v) is str or (type(v) is int and v is not True and v is not False):
                f = float(v)
                if math.isfinite(f):
                    return f
            elif type(v) is float:
                return v
        elif to == "BOOLEAN":
            if v is True or v is False:
                return v
            if type(v) is int:
                return v != 0
            if type(v) is str and v.strip().lower() in ("true", "t", "1", "false", "f", "0"):
                return v.strip().lower() in ("true", "t", "1")
        elif to in TIME_TYPES:
            if type(v) is datetime:
                return v
            if type(v) is str:
                t = datetime.fromisoformat(v.strip())
                return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)
    except (ValueError, OverflowError):
        pass
    raise _Failed(f"{what}: cannot cast {_type(v)} {_short(v)} to {to}")


def _truth(v: Any) -> bool | None:
    return v if v is True or v is False or v is None else None


# -- builders of the other nodes -----------------------------------------------------
def _logic(decides: bool) -> Callable[[_Compiler, exp.Binary], Fn]:
    """AND (``decides`` False: one FALSE makes it FALSE) or OR (one TRUE makes it TRUE),
    three-valued: otherwise UNKNOWN if either side is."""
    def build(c: _Compiler, node: exp.Binary) -> Fn:
        a, b = c.expr(node.this), c.expr(node.expression)

        def run(d: dict) -> bool | None:
            x = _truth(a(d))
            if x is decides:
                return decides
            y = _truth(b(d))
            if y is decides:
                return decides
            return None if x is None or y is None else not decides
        return run
    return build


def _not(c: _Compiler, node: exp.Not) -> Fn:
    a = c.expr(node.this)

    def run(d: dict) -> bool | None:
        x = _truth(a(d))
        return None if x is None else not x
    return run


def _is(c: _Compiler, node: exp.Is) -> Fn:
    a, target = c.expr(node.this), node.expression
    if isinstance(target, exp.Null):
        return lambda d: a(d) is None
    if isinstance(target, exp.Boolean):
        value = bool(target.this)
        return lambda d: a(d) is value
    raise c.error("IS takes NULL, TRUE or FALSE", node)


def _distinct(c: _Compiler, node: exp.Binary) -> Fn:
    a, b = c.expr(node.this), c.expr(node.expression)
    same = isinstance(node, exp.NullSafeEQ)

    def run(d: dict) -> bool:
        x, y = a(d), b(d)
        equal = (x is None and y is None) or (x is not None and y is not None and _family(x) == _family(y)
                                              and x == y)
        return equal if same else not equal
    return run


def _in(c: _Compiler, node: exp.In) -> Fn:
    if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
        raise c.error("IN takes a list of values here", node)
    a = c.expr(node.this)
    options = [c.expr(e) for e in node.expressions]

    def run(d: dict) -> bool | None:
        x = a(d)
        if x is None:
            return None
        unknown = False
        for o in options:
            y = o(d)
            if y is None or _family(x) != _family(y):
                unknown = True
            elif x == y:
                return True
        return None if unknown else False
    return run


def _between(c: _Compiler, node: exp.Between) -> Fn:
    a, lo, hi = c.expr(node.this), c.expr(node.args["low"]), c.expr(node.args["high"])

    def run(d: dict) -> bool | None:
        x, y, z = a(d), lo(d), hi(d)
        if x is None or y is None or z is None or not _family(x) == _family(y) == _family(z):
            return None
        return y <= x <= z
    return run


def _like(c: _Compiler, node: exp.Binary) -> Fn:
    a, pattern = c.expr(node.this), node.expression
    if not (isinstance(pattern, exp.Literal) and pattern.is_string):
        raise c.error("LIKE takes a literal pattern here", node)
    body = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern.name)
    match = re.compile(body, re.S | (re.I if isinstance(node, exp.ILike) else 0)).fullmatch

    def run(d: dict) -> bool | None:
        x = a(d)
        return None if type(x) is not str else match(x) is not None
    return run


def _case(c: _Compiler, node: exp.Case) -> Fn:
    subject = c.expr(node.this) if node.this is not None else None
    whens = [(c.expr(w.this), c.expr(w.args["true"])) for w in node.args.get("ifs") or ()]
    default = c.expr(node.args["default"]) if node.args.get("default") is not None else (lambda d: None)

    def run(d: dict) -> Any:
        s = subject(d) if subject is not None else None
        for cond, then in whens:
            v = cond(d)
            if subject is not None:
                if s is not None and v is not None and _family(s) == _family(v) and s == v:
                    return then(d)
            elif v is True:
                return then(d)
        return default(d)
    return run


def _if(c: _Compiler, node: exp.If) -> Fn:
    cond, then = c.expr(node.this), c.expr(node.args["true"])
    other = c.expr(node.args["false"]) if node.args.get("false") is not None else (lambda d: None)
    return lambda d: then(d) if cond(d) is True else other(d)


def _coalesce(c: _Compiler, node: exp.Coalesce) -> Fn:
    args = [c.expr(node.this), *(c.expr(e) for e in node.expressions)]

    def run(d: dict) -> Any:
        for a in args:
            v = a(d)
            if v is not None:
                return v
        return None
    return run


def _nullif(c: _Compiler, node: exp.Nullif) -> Fn:
    a, b = c.expr(node.this), c.expr(node.expression)

    def run(d: dict) -> Any:
        x, y = a(d), b(d)
        return None if x is not None and y is not None and _family(x) == _family(y) and x == y else x
    return run


def _cast_builder(c: _Compiler, node: exp.Cast) -> Fn:
    to = node.to.this.name if hasattr(node.to.this, "name") else str(node.to.this)
    to = to.upper()
    known = INT_TYPES | FLOAT_TYPES | TEXT_TYPES | TIME_TYPES | {"BOOLEAN"}
    if to not in known:
        raise c.error(f"CAST to {node.to.sql(DIALECT)} is not taken (BIGINT, DOUBLE, VARCHAR, BOOLEAN "
                      "or TIMESTAMP)", node)
    a, what, safe = c.expr(node.this), c.text_of(node), isinstance(node, exp.TryCast) or node.args.get("safe")

    def run(d: dict) -> Any:
        v = a(d)
        if v is None:
            return None
        if not safe:
            return _cast(v, to, what)
        try:
            return _cast(v, to, what)
        except _Failed:
            return None
    return run


def _concat(c: _Compiler, node: exp.Concat) -> Fn:
    args = [c.expr(e) for e in node.expressions]
    return lambda d: "".join(_text(v) for v in (a(d) for a in args) if v is not None)


def _concat_ws(c: _Compiler, node: exp.ConcatWs) -> Fn:
    sep, *args = [c.expr(e) for e in node.expressions]

    def run(d: dict) -> Any:
        s = sep(d)
        if s is None:
            return None
        return _text(s).join(_text(v) for v in (a(d) for a in args) if v is not None)
    return run


def _dpipe(c: _Compiler, node: exp.DPipe) -> Fn:
    a, b = c.expr(node.this), c.expr(node.expression)

    def run(d: dict) -> Any:
        x, y = a(d), b(d)
        return None if x is None or y is None else _text(x) + _text(y)
    return run


def _string_fn(method: Callable[[str], Any]) -> Callable[[_Compiler, exp.Expression], Fn]:
    def build(c: _Compiler, node: exp.Expression) -> Fn:
        if isinstance(node, exp.Trim) and (node.args.get("expression") is not None or node.args.get("position")):
            raise c.error("TRIM takes one string here", node)
        a, what = c.expr(node.this), c.text_of(node)

        def run(d: dict) -> Any:
            v = a(d)
            if v is None:
                return None
            if type(v) is not str:
                raise _Failed(f"{what} takes a string, not {_type(v)} {_short(v)}")
            return method(v)
        return run
    return build


def _length(c: _Compiler, node: exp.Expression) -> Fn:
    a, what = c.expr(node.this), c.text_of(node)

    def run(d: dict) -> Any:
        v = a(d)
        if v is None:
            return None
        if type(v) not in (str, list):
            raise _Failed(f"{what} takes a string or an array, not {_type(v)} {_short(v)}")
        return len(v)
    return run


def _substring(c: _Compiler, node: exp.Substring) -> Fn:
    a, start = c.expr(node.this), c.expr(node.args["start"]) if node.args.get("start") else (lambda d: 1)
    length = c.expr(node.args["length"]) if node.args.get("length") else None
    what = c.text_of(node)

    def run(d: dict) -> Any:
        s, i = a(d), start(d)
        n = length(d) if length is not None else None
        if s is None or i is None or (length is not None and n is None):
            return None
        if type(s) is not str or type(i) is not int or (n is not None and type(n) is not int):
            raise _Failed(f"{what} takes a string and integer positions")
        i = i - 1 if i > 0 else max(len(s) + i, 0) if i < 0 else 0
        return s[i:] if n is None else s[i:i + max(n, 0)]
    return run


def _replace(c: _Compiler, node: exp.Replace) -> Fn:
    a, old, new = c.expr(node.this), c.expr(node.expression), c.expr(node.args["replacement"])
    what = c.text_of(node)

    def run(d: dict) -> Any:
        s, x, y = a(d), old(d), new(d)
        if s is None or x is None or y is None:
            return None
        if type(s) is not str or type(x) is not str or type(y) is not str:
            raise _Failed(f"{what} takes strings")
        return s.replace(x, y)
    return run


def _number_fn(method: Callable[[Any], Any]) -> Callable[[_Compiler, exp.Expression], Fn]:
    def build(c: _Compiler, node: exp.Expression) -> Fn:
        if node.args.get("decimals") is not None and not isinstance(node, exp.Round):
            raise c.error("this function takes one number here", node)
        a, what = c.expr(node.this), c.text_of(node)
        digits = c.expr(node.args["decimals"]) if isinstance(node, exp.Round) and node.args.get("decimals") else None

        def run(d: dict) -> Any:
            v = a(d)
            if v is None:
                return None
            if not _is_number(v):
                raise _Failed(f"{what} takes a number, not {_type(v)} {_short(v)}")
            if digits is None:
                return method(v)
            n = digits(d)
            if type(n) is not int:
                raise _Failed(f"{what} takes an integer number of digits")
            return _round_half_away(v, n)
        return run
    return build


def _round_half_away(v: Any, digits: int = 0) -> Any:
    """ROUND as DuckDB rounds: halves away from zero; an int stays an int."""
    if type(v) is int and digits >= 0:
        return v
    scale = 10.0 ** digits
    r = math.floor(abs(v) * scale + 0.5) / scale
    r = r if v >= 0 else -r
    return int(r) if type(v) is int else r


def _whole(f: Callable[[float], int]) -> Callable[[Any], Any]:
    """FLOOR or CEIL: a float stays a float (DuckDB's DOUBLE), an int is itself."""
    return lambda v: v if type(v) is int else float(f(v))


_BUILDERS: dict[type, Callable[[_Compiler, Any], Fn]] = {
    exp.And: _logic(False), exp.Or: _logic(True), exp.Not: _not, exp.Is: _is, exp.NullSafeEQ: _distinct,
    exp.NullSafeNEQ: _distinct, exp.In: _in, exp.Between: _between, exp.Like: _like, exp.ILike: _like,
    exp.Case: _case, exp.If: _if, exp.Coalesce: _coalesce, exp.Nullif: _nullif, exp.Cast: _cast_builder,
    exp.TryCast: _cast_builder, exp.Concat: _concat, exp.ConcatWs: _concat_ws, exp.DPipe: _dpipe,
    exp.Lower: _string_fn(str.lower), exp.Upper: _string_fn(str.upper), exp.Trim: _string_fn(str.strip),
    exp.Length: _length, exp.ArraySize: _length, exp.Substring: _substring, exp.Replace: _replace,
    exp.Abs: _number_fn(abs), exp.Round: _number_fn(_round_half_away), exp.Floor: _number_fn(_whole(math.floor)),
    exp.Ceil: _number_fn(_whole(math.ceil)), exp.Neg: _number_fn(lambda v: -v),
}
