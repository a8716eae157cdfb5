"""What a user reads when a query is refused, fails or looks wrong: in the words they wrote.

Three sources would otherwise leak internals: sqlglot's node names (``COLUMN``,
``NULLSAFENEQ``, ``GROUP_CONCAT`` for ``string_agg``), DuckDB's errors about the statement
rtindex generated (frame columns ``f0``, ``c1``, the CTE ``frame``), and nothing at all for a
query that runs but almost surely is not what was meant (a misspelled field is just
missing in every document). This module turns each into a message about the user's text:
:func:`as_written` for constructs, :func:`duckdb_error` for DuckDB's errors, and
:func:`query_warnings` for ``Result.warnings``.
"""

from __future__ import annotations

import difflib
import functools
import re
from typing import Any, Callable, Iterable, Mapping

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.tokens import Token, TokenType

DIALECT = "duckdb"
_OPEN = {TokenType.L_PAREN: TokenType.R_PAREN, TokenType.L_BRACKET: TokenType.R_BRACKET}
_CLOSE = {v: k for k, v in _OPEN.items()}


# -- constructs, as written ----------------------------------------------------------------
@functools.lru_cache(maxsize=16)  # one text's constructs are named one after the other
def _tokens(text: str) -> list[Token]:
    try:
        return Dialect.get_or_raise(DIALECT).tokenize(text)
    except sqlglot.errors.SqlglotError:  # the parser read it, so this is not expected; then no span
        return []


def span(node: exp.Expression, text: str) -> tuple[int, int] | None:
    """(start, end) (end exclusive) of ``node`` in ``text``, the text sqlglot parsed: from the
    first to the last token its subtree remembers, widened to a call's name and brackets
    (sqlglot keeps positions of names and literals, not of the node itself)."""
    marks = [(n.meta["start"], n.meta["end"]) for n in node.walk()
             if isinstance(n, exp.Expression) and "start" in n.meta and "end" in n.meta]
    tokens = _tokens(text)
    if not marks or not tokens:
        return None
    lo, hi = min(s for s, _ in marks), max(e for _, e in marks)
    i = next((k for k, t in enumerate(tokens) if t.start >= lo), None)
    j = next((k for k in range(len(tokens) - 1, -1, -1) if tokens[k].end <= hi), None)
    if i is None or j is None or j < i:
        return None
    if isinstance(node, exp.Func) and i >= 2 and tokens[i - 1].token_type == TokenType.L_PAREN:
        i -= 2  # string_agg(x, ','): the name, then "(", come before the first argument
    if isinstance(node, exp.Bracket) and j + 1 < len(tokens) and tokens[j + 1].token_type == TokenType.L_BRACKET:
        j += 1  # m[1]: sqlglot may keep no position of the index
    depth = 0
    for t in tokens[i:j + 1]:
        depth += (t.token_type in _OPEN) - (t.token_type in _CLOSE)
    while depth > 0 and j + 1 < len(tokens):  # lower(s: take the closing bracket too
        j += 1
        depth += (tokens[j].token_type in _OPEN) - (tokens[j].token_type in _CLOSE)
    return tokens[i].start, tokens[j].end + 1


def as_written(node: exp.Expression, text: str, internal: str, sql: str,
               original: Callable[[int], int]) -> tuple[str, int | None]:
    """How to name ``node`` (which ``internal``, sqlglot's name for it, would describe) and
    where it starts in ``sql``, the user's text (``text`` is what sqlglot parsed, ``original``
    maps its positions back to ``sql``): ``function string_agg`` for a call, ``INSERT`` for a
    statement, ``'a + b'`` for the rest."""
    if node.parent is None:  # a statement: named by its first word (INSERT, COPY, ...)
        first = next(iter(_tokens(text)), None)
        return (internal, None) if first is None else (sql[original(first.start):original(first.end + 1)],
                                                       original(first.start))
    where = span(node, text)
    if where is None:
        return internal, None
    start, end = original(where[0]), original(where[1])
    written = " ".join(sql[start:end].split())
    if isinstance(node, (exp.Func, exp.Anonymous)):
        name = re.match(r"[^\s(]+", written)
        return f"function {name.group(0) if name else written}", start
    return f"'{written}'", start


def keyword_position(keyword: str, text: str) -> int | None:
    """Where the SQL keyword (``DISTINCT``, ``JOIN``, ``WITH``, ...) first appears in ``text``."""
    word = keyword.upper()
    for t in _tokens(text):
        if t.text.upper() in (word, word.rstrip("S")) and t.token_type not in (TokenType.STRING, TokenType.IDENTIFIER):
            return t.start
    return None


# -- DuckDB's errors, in terms of the query ------------------------------------------------
# words of the statements rtindex generates that the user never wrote: frame columns (f0),
# scan columns (c0), parameters (p0, w0), aggregates of the typing pass (k0), row positions
_INTERNAL = re.compile(r'"?\b([fcpwk]\d+|__pos|__one|__q\d+|_shard|_row_id)\b"?')
_MIXED = re.compile(r"argument types '(sum|avg|\+|-|\*|/)\(VARCHAR", re.IGNORECASE)


def duckdb_error(line: str, names: Mapping[str, str]) -> str:
    """A message for DuckDB's error (its first ``line``) about a statement rtindex generated:
    the internal names replaced by what the user wrote (``names``: internal -> the user's
    field, else "a column"), DuckDB's phase ("Binder Error: ") dropped (other kinds, such
    as "Out of Memory Error", kept), and what to do for the errors a user can fix."""
    kind, sep, body = line.partition(" Error: ")
    if not sep:
        kind, body = "", line
    if kind == "Parser":  # the generated text does not parse: a construct rtindex passes on wrongly
        return ("rtindex cannot run this query: a construct in it is not carried over to DuckDB correctly "
                "(docs/sql.md lists the dialect; rewrite that part, or report it)")

    def user(m: re.Match) -> str:
        return names.get(m.group(1), "a column")
    # values are quoted '...' (Could not convert string 'c1'): only the rest names columns
    parts = re.split(r"('(?:[^']|'')*')", body.strip())
    body = "".join(p if p.startswith("'") else _INTERNAL.sub(user, p) for p in parts)
    body = body.removesuffix(" You might need to add explicit type casts.").rstrip(".")
    body = body.replace('"frame"', "the collection").replace('"scan"', "the collection")
    if _MIXED.search(body):
        body += (": a field that holds text in the rows the query reads, or values of several types (numbers "
                 "and strings, say), is text (docs/sql.md, Types and comparisons); TRY_CAST(x AS DOUBLE) "
                 "gives the numbers back")
    elif "must appear in the GROUP BY clause" in body:
        body += ": add it to GROUP BY, or use it inside an aggregate such as MIN or MAX"
    elif "Type INT128" in body and "out of range" in body:  # a 128-bit SUM returned as 64 bits (execute.py)
        body += (": the sum of these integers does not fit 64 bits; CAST(SUM(x) AS DOUBLE) or "
                 "CAST(SUM(x) AS DECIMAL(38, 0)) keeps it")
    elif kind == "Conversion" and "Could not convert" in body:
        body += ": use TRY_CAST to get NULL where a value does not convert"
    elif "Cannot compare values of type" in body:
        body = re.sub(r"\b(\w+)_LITERAL\b", r"\1", body.removesuffix(" - an explicit cast is required")) + (
            ": a field that holds values of several types is text where rtindex cannot tell what it is compared "
            "with (docs/sql.md, Types and comparisons); CAST or TRY_CAST one side")
    elif "No function matches" in body:
        body += ": CAST the arguments to the types the function takes"
    # the phase that failed means nothing to a user (Binder); a resource or permission does
    body = body.replace("column a column", "a column")
    return body if kind in ("", "Binder", "Conversion") else f"{kind} Error: {body}"


# -- warnings --------------------------------------------------------------------------------
def query_warnings(sql: str, collection: str, used: Iterable[tuple[str, ...]], exists: Callable[[tuple[str, ...]], bool],
                   known: Callable[[], set[tuple[str, ...]]],
                   holds_arrays: Callable[[tuple[str, ...]], bool] = lambda p: False) -> list[str]:
    """Warnings for a valid query that almost surely does not say what was meant: a field
    no document of the collection has (``exists`` false: it is NULL in every row), named
    with the nearest field it does have (``LANG`` when only ``lang`` exists; ``known()``
    lists them, asked only then); a WHERE that names an output alias (``SELECT a AS x
    ... WHERE x = 1`` reads the documents' field x: WHERE runs before SELECT); or a path
    through a field that holds arrays in some documents (``holds_arrays``): there it names
    no single value (docs/sql.md, rule 1), while the user most likely meant the elements'."""
    paths = list(dict.fromkeys(used))
    out = []
    for path in paths:
        through = next((path[:i] for i in range(1, len(path)) if holds_arrays(path[:i])), None)
        if through is not None and exists(path):
            name, arr, rest = ".".join(path), ".".join(through), ".".join(path[len(through):])
            out.append(f"{name} goes through {arr}, which holds arrays: in those documents {name} names no single "
                       f"value and is NULL (docs/sql.md, rule 1). To test the elements' {rest}, unnest them: "
                       f"SELECT ... FROM (SELECT *, UNNEST({arr}) AS e FROM {collection}) WHERE e.{rest} = ...")
    missing = [p for p in paths if not exists(p)]
    if not missing:
        return out
    aliases, in_where = _aliases_in_where(sql)
    dotted = sorted(".".join(p) for p in known())
    for path in missing:
        name = ".".join(path)
        if name in aliases and name in in_where:
            out.append(f"WHERE reads the field {name} of the documents, which none has, not the output alias "
                       f"{name} (WHERE runs before SELECT): repeat the expression in WHERE, or filter in HAVING")
            continue
        near = ([n for n in dotted if n.lower() == name.lower()]
                or difflib.get_close_matches(name, dotted, n=1, cutoff=0.6))
        hint = f": did you mean {near[0]}?" if near else ""
        out.append(f"no document of collection {collection!r} has the field {name} (it is NULL in every row){hint}")
    return out


_NUMBER_TYPES = ("int", "float")
_MICROS_BELOW = 10**13  # an int literal compared with a time: as microseconds, before 1970-04-27


def literal_warnings(compared: Iterable[tuple[tuple[str, ...], str, Any]],
                     holds: Callable[[tuple[str, ...], str], bool]) -> list[str]:
    """Warnings for a literal of another type than the field holds (``compared``: path,
    operator and literal of each comparison in WHERE; ``holds(path, type name)``: whether
    some document may hold a value of that type there): a number field compared with a
    string, or a string field with a number, is never TRUE (docs/sql.md, rule 2); a time
    compared with a small integer reads it as microseconds, where seconds were likely meant."""
    out = []
    for path, op, lit in dict.fromkeys(compared):
        name = ".".join(path)
        numbers = any(holds(path, t) for t in _NUMBER_TYPES)
        strings = holds(path, "string")
        if isinstance(lit, str) and numbers and not strings:
            try:
                as_number = str(int(lit)) if lit.strip().lstrip("+-").isdigit() else repr(float(lit))
            except ValueError:
                as_number = "a number"
            out.append(f"{name} holds numbers and {lit!r} is a string, so {name} {op} {lit!r} is never TRUE "
                       f"(docs/sql.md, rule 2): write {name} {op} {as_number}")
        elif isinstance(lit, (int, float)) and not isinstance(lit, bool) and strings and not numbers \
                and not holds(path, "timestamp"):
            out.append(f"{name} holds strings and {lit!r} is a number, so {name} {op} {lit!r} is never TRUE "
                       f"(docs/sql.md, rule 2): write {name} {op} '{lit}'")
        elif isinstance(lit, int) and not isinstance(lit, bool) and abs(lit) < _MICROS_BELOW \
                and holds(path, "timestamp") and not numbers:
            out.append(f"{name} is a time, and {lit} compares with it as microseconds since 1970: for seconds "
                       f"write {name} {op} TIMESTAMP_SECONDS({lit}), for milliseconds TIMESTAMP_MILLIS({lit})")
    return out


def _aliases_in_where(sql: str) -> tuple[set[str], set[str]]:
    """(output aliases, names of columns in WHERE) of a SELECT text; empty if it does not parse."""
    try:
        tree = sqlglot.parse_one(sql, read=DIALECT)
    except sqlglot.errors.SqlglotError:
        return set(), set()
    where = tree.args.get("where") if isinstance(tree, exp.Select) else None
    if where is None:
        return set(), set()
    aliases = {e.alias for e in tree.expressions if isinstance(e, exp.Alias)}
    return aliases, {c.name for c in where.find_all(exp.Column)}
