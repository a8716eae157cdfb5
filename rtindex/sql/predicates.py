"""WHERE clauses as a tree of typed predicates, evaluated two ways with one meaning.

The index path turns a predicate into posting lists; the column-scan path compiles it to a
DuckDB expression over the typed columns of the column store. Both follow the rules of
docs/sql.md:

- a comparison is *typed*: ``x = 5`` matches numbers equal to 5 (int, float or timestamp),
  never the string ``"5"``; a value of another type, an array, an object, null or a missing
  field makes the comparison UNKNOWN, and SQL's three-valued logic carries on (neither
  ``x = 5`` nor ``NOT x = 5`` matches such a row);
- a path reaches a value only through objects: below an array there is no single value
  (``ARRAY_CONTAINS`` and ``UNNEST`` reach elements);
- ``x IS NULL`` holds for JSON null and for a missing field; ``IS_MISSING(x)`` only for a
  missing one.

Three-valued logic on posting lists: every node yields the rows where it is TRUE and the
rows where it is FALSE; the rest are UNKNOWN. ``NOT`` swaps the two, ``AND``/``OR`` combine
them as Kleene's logic does, and FALSE sets are only computed under a ``NOT``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Union

from rtindex import keys
from rtindex.documents import to_event_time
from rtindex.errors import SqlError
from rtindex.snapshot import Postings

Path = tuple[str, ...]


@dataclass(frozen=True)
class Const:
    value: Any


@dataclass(frozen=True)
class Param:
    key: str | int  # a :name, or the 0-based index of a ?
    position: int | None = None


@dataclass(frozen=True)
class Call:
    """A time function of a value (TIMESTAMP_SECONDS(:t), ...), evaluated when bound."""

    name: str  # a key of TIME_FUNCTIONS
    arg: Any  # an Operand
    position: int | None = None


Operand = Union[Const, Param, Call]

@dataclass(frozen=True)
class Compare:
    path: Path
    op: str
    value: Operand


@dataclass(frozen=True)
class IsNull:
    path: Path


@dataclass(frozen=True)
class IsMissing:
    path: Path


@dataclass(frozen=True)
class Like:
    path: Path
    pattern: Operand
    position: int | None = None


@dataclass(frozen=True)
class ArrayContains:
    path: Path
    value: Operand


@dataclass(frozen=True)
class And:
    items: tuple


@dataclass(frozen=True)
class Or:
    items: tuple


@dataclass(frozen=True)
class Not:
    item: Any


Pred = Union[Compare, IsNull, IsMissing, Like, ArrayContains, And, Or, Not]


def leaves(p: Pred):
    """Every leaf predicate of ``p``, depth first."""
    if isinstance(p, (And, Or)):
        for q in p.items:
            yield from leaves(q)
    elif isinstance(p, Not):
        yield from leaves(p.item)
    else:
        yield p


# -- parameter binding ------------------------------------------------------------
Binder = Callable[[Operand], Any]


def check_value(v: Any, sql: str | None = None, position: int | None = None) -> Any:
    """A comparison value as the index compares it: datetimes become µs since the epoch."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, datetime):
        return to_event_time(v)
    raise SqlError(f"cannot compare a field with a value of type {type(v).__name__} "
                   "(use None, bool, int, float, str or datetime)", sql, position)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# Rockset's time functions: name -> (takes a timestamp (else an int), microseconds per unit)
TIME_FUNCTIONS = {"TIMESTAMP_SECONDS": (False, 1_000_000), "TIMESTAMP_MILLIS": (False, 1_000),
               "TIMESTAMP_MICROS": (False, 1), "UNIX_SECONDS": (True, 1_000_000), "UNIX_MILLIS": (True, 1_000),
               "UNIX_MICROS": (True, 1)}


def call_value(name: str, v: Any, sql: str | None = None, position: int | None = None) -> Any:
    """A time function of a bound value, as DuckDB computes it in SELECT: TIMESTAMP_* of an
    int -> an aware UTC datetime; UNIX_* of a datetime (naive means UTC) -> an int, rounded
    down; NULL -> None. Another type is a SqlError."""
    takes_timestamp, unit = TIME_FUNCTIONS[name]
    if v is None:
        return None
    if takes_timestamp:
        if not isinstance(v, datetime):
            raise SqlError(f"{name} takes a timestamp, not {type(v).__name__}", sql, position)
        return to_event_time(v) // unit
    if isinstance(v, bool) or not isinstance(v, int):
        raise SqlError(f"{name} takes an integer, not {type(v).__name__}", sql, position)
    try:
        return _EPOCH + timedelta(microseconds=v * unit)
    except OverflowError:
        raise SqlError(f"{name}({v}) is outside the range of timestamps", sql, position) from None


def domain_tags(v: Any) -> tuple[int, ...]:
    """The type tags a field value can have to be comparable with ``v``."""
    if v is None:
        return ()
    if isinstance(v, bool):
        return (keys.BOOL,)
    if isinstance(v, str):
        return (keys.STRING,)
    return (keys.INT, keys.FLOAT, keys.TIMESTAMP)


def like_prefix(pattern: Any, sql: str | None = None, position: int | None = None) -> tuple[str, bool]:
    """(text, is_prefix) of a LIKE pattern: ``'abc%'`` is a prefix, ``'abc'`` an equality;
    any other wildcard is unsupported (the index answers prefixes, not substrings)."""
    if not isinstance(pattern, str):
        raise SqlError(f"LIKE needs a string pattern, not {type(pattern).__name__}", sql, position)
    body, is_prefix = (pattern[:-1], True) if pattern.endswith("%") else (pattern, False)
    if "%" in body or "_" in body:
        raise SqlError(f"LIKE {pattern!r}: only a literal prefix followed by one % is supported "
                       "(no _ and no other %)", sql, position)
    return body, is_prefix


# -- the index path: posting lists -----------------------------------------------------
class IndexEvaluator:
    """TRUE / FALSE row sets of predicates on one snapshot.

    ``budget`` (a one-item list) caps the distinct terms that range lookups may read; past it
    ``rtindex.segments.OverBudget`` escapes, telling the planner to scan columns instead.
    """

    def __init__(self, snap, bind: Binder, budget: list[int] | None = None):
        self.snap = snap
        self.bind = bind
        self.budget = budget
        self._arrays: dict[tuple[Path, bool], Any] = {}
        self._all = None

    def none(self):
        """No rows (what a comparison with NULL is TRUE or FALSE for)."""
        return Postings(self.snap, {})

    def all(self):
        if self._all is None:
            self._all = self.snap.all()
        return self._all

    def arrays(self, path: Path, include_self: bool = True):
        k = (path, include_self)
        if k not in self._arrays:
            self._arrays[k] = self.snap.arrays(path, include_self)
        return self._arrays[k]

    def scalar(self, path: Path, tags: tuple[int, ...]):
        """Rows where ``path`` holds a single value of one of ``tags``."""
        if not tags:
            return self.none()
        return self.snap.exists(path, [keys.TAG_NAMES[t] for t in tags]) - self.arrays(path)

    def present(self, path: Path):
        """Rows where ``path`` reaches a value (null, arrays and objects included)."""
        return self.snap.exists(path) - self.arrays(path, include_self=False)

    def kinds(self, path: Path, candidates: set[int], rows) -> tuple[set[int], bool]:
        """The kinds of values (type tags among ``candidates``) ``path`` holds in ``rows``,
        and whether one of its ints is beyond frames.EXACT_INT: what types a projected field
        (frames.mixing) when the rows are not all fetched."""
        kinds = set()
        for tag in candidates - {keys.NULL}:
            held = (self.snap.exists(path, ["array"]) - self.arrays(path, include_self=False) if tag == keys.ARRAY
                    else self.scalar(path, (tag,)))
            if held & rows:
                kinds.add(tag)
        big = False
        if {keys.INT, keys.FLOAT} <= kinds:
            edge = 1 << 53
            beyond = (self.snap.range(path, edge, None, lo_inclusive=False)
                      | self.snap.range(path, None, -edge, hi_inclusive=False))
            big = bool(beyond & self.scalar(path, (keys.INT,)) & rows)
        return kinds, big

    def true(self, p: Pred):
        if isinstance(p, And):
            out = self.true(p.items[0])
            for q in p.items[1:]:
                if not out:
                    break
                out = out & self.true(q)
            return out
        if isinstance(p, Or):
            out = self.true(p.items[0])
            for q in p.items[1:]:
                out = out | self.true(q)
            return out
        if isinstance(p, Not):
            return self.false(p.item)
        if isinstance(p, Compare):
            v = self.bind(p.value)
            if v is None:
                return self.none()
            if p.op == "=":
                return self.snap.matching(p.path, v)
            if p.op == "<>":
                return self.scalar(p.path, domain_tags(v)) - self.snap.term(p.path, v)
            else:
                lo, hi = (v, None) if p.op in (">", ">=") else (None, v)
                hits = self.snap.range(p.path, lo, hi, lo_inclusive=p.op == ">=", hi_inclusive=p.op == "<=",
                                       budget=self.budget)
            return hits - self.arrays(p.path) if hits else hits
        if isinstance(p, IsNull):
            return (self.snap.term(p.path, None) - self.arrays(p.path)) | (self.all() - self.present(p.path))
        if isinstance(p, IsMissing):
            return self.all() - self.present(p.path)
        if isinstance(p, Like):
            text, is_prefix = like_prefix(self.bind(p.pattern))
            hits = self.snap.prefix(p.path, text, budget=self.budget) if is_prefix else self.snap.term(p.path, text)
            return hits - self.arrays(p.path) if hits else hits
        if isinstance(p, ArrayContains):
            return self.snap.matching(p.path, self.bind(p.value), contains=True)
        raise TypeError(f"not a predicate: {p!r}")

    def false(self, p: Pred):
        if isinstance(p, And):
            out = self.false(p.items[0])
            for q in p.items[1:]:
                out = out | self.false(q)
            return out
        if isinstance(p, Or):
            out = self.false(p.items[0])
            for q in p.items[1:]:
                if not out:
                    break
                out = out & self.false(q)
            return out
        if isinstance(p, Not):
            return self.true(p.item)
        if isinstance(p, (IsNull, IsMissing)):
            return self.all() - self.true(p)
        if isinstance(p, Compare):
            v = self.bind(p.value)
            return self.scalar(p.path, domain_tags(v)) - self.true(p) if v is not None else self.none()
        if isinstance(p, Like):
            return self.scalar(p.path, (keys.STRING,)) - self.true(p)
        if isinstance(p, ArrayContains):
            arrays = self.snap.exists(p.path, ["array"]) - self.arrays(p.path, include_self=False)
            if self.bind(p.value) is None:  # an element compared with NULL is UNKNOWN; no element, FALSE
                return arrays - self.snap.exists(p.path, [t for t in keys.TAGS_BY_NAME if t != "array"])
            return arrays - self.true(p)
        raise TypeError(f"not a predicate: {p!r}")


# -- the column-scan path: a DuckDB expression over typed columns ------------------------
def exact_operand(op: str, v: int | float, integral: bool) -> tuple[str, int | float] | bool:
    """``x op v`` for a column ``x`` of ints (``integral``) or of floats, rewritten so that
    DuckDB compares values of the column's own type: it would compare an int with a float as
    two floats, rounding ints beyond 2**53 (rule 2 of docs/sql.md compares exactly, as the
    index does). Returns (op, value), or a bool when every value of the column gives it."""
    if integral == isinstance(v, int):
        return op, v
    if integral:  # v is a float: which ints are below, equal to, above it
        if math.isnan(v):
            return op == "<>"
        if math.isinf(v):
            return op in (("<", "<=", "<>") if v > 0 else (">", ">=", "<>"))
        if not v.is_integer():
            if op in ("=", "<>"):
                return op == "<>"
            op, v = ("<=", math.floor(v)) if op in ("<", "<=") else (">=", math.ceil(v))
        n = int(v)
        if n > keys.INT_MAX:
            return op in ("<", "<=", "<>")
        if n < keys.INT_MIN:
            return op in (">", ">=", "<>")
        return op, n
    try:  # v is an int: the floats below, equal to, above it
        f = float(v)
    except OverflowError:
        return op in (("<", "<=", "<>") if v > 0 else (">", ">=", "<>"))
    if f == v:
        return op, f
    if op in ("=", "<>"):
        return op == "<>"
    below, above = (math.nextafter(f, -math.inf), f) if f > v else (f, math.nextafter(f, math.inf))
    return ("<=", below) if op in ("<", "<=") else (">=", above)


class ScanCompiler:
    """Compiles predicates to DuckDB SQL over the column store's typed columns.

    ``column(path, tag)`` names the column of that path and type in the scanned table, or
    returns None when no segment has one; values become named parameters in ``params``.
    """

    def __init__(self, column: Callable[[Path, int], str | None], bind: Binder):
        self.column = column
        self.bind = bind
        self.params: dict[str, Any] = {}

    def _param(self, v: Any) -> str:
        name = f"w{len(self.params)}"
        self.params[name] = v
        return "$" + name

    def _typed(self, path: Path, v: Any, op: str) -> str:
        parts = []
        for tag in domain_tags(v):
            col = self.column(path, tag)
            if col is None:
                continue
            lhs = f"epoch_us({col})" if tag == keys.TIMESTAMP else col
            exact = exact_operand(op, v, tag != keys.FLOAT) if tag in (keys.INT, keys.FLOAT, keys.TIMESTAMP) else (op, v)
            if isinstance(exact, bool):  # the same answer for every value of this column
                parts.append(f"CASE WHEN {col} IS NOT NULL THEN {str(exact).upper()} END")
            else:
                parts.append(f"({lhs} {exact[0]} {self._param(exact[1])})")
        if not parts:
            return "CAST(NULL AS BOOLEAN)"
        return parts[0] if len(parts) == 1 else f"COALESCE({', '.join(parts)})"

    def _all_null(self, path: Path, tags) -> str:
        cols = [c for c in (self.column(path, t) for t in tags) if c is not None]
        return "(" + " AND ".join(f"{c} IS NULL" for c in cols) + ")" if cols else "TRUE"

    def compile(self, p: Pred) -> str:
        if isinstance(p, And):
            return "(" + " AND ".join(self.compile(q) for q in p.items) + ")"
        if isinstance(p, Or):
            return "(" + " OR ".join(self.compile(q) for q in p.items) + ")"
        if isinstance(p, Not):
            return f"(NOT {self.compile(p.item)})"
        if isinstance(p, Compare):
            v = self.bind(p.value)
            return "CAST(NULL AS BOOLEAN)" if v is None else self._typed(p.path, v, p.op)
        if isinstance(p, IsNull):
            return self._all_null(p.path, [t for t in keys.TAG_NAMES if t not in (keys.NULL, keys.OBJECT)])
        if isinstance(p, IsMissing):
            return self._all_null(p.path, [t for t in keys.TAG_NAMES if t != keys.OBJECT])
        if isinstance(p, Like):
            text, is_prefix = like_prefix(self.bind(p.pattern))
            col = self.column(p.path, keys.STRING)
            if col is None:
                return "CAST(NULL AS BOOLEAN)"
            return f"starts_with({col}, {self._param(text)})" if is_prefix else f"({col} = {self._param(text)})"
        raise TypeError(f"no column-scan form for {p!r}")
