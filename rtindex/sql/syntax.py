"""Syntax errors in the user's words: sqlglot's tokenize and parse errors -> SqlError.

sqlglot says where its parser gave up, in its own terms ("Required keyword: 'expression'
missing for <class '...Mul'>"), often a token or two after the mistake (``SELEC * FROM ev``
fails at FROM: ``SELEC *`` parses as a multiplication). So the message is made here from
the tokens: an unterminated string, quoted name or comment; an unbalanced parenthesis; a
misspelled keyword (with the keyword it resembles); GROUP or ORDER without BY; a query that
ends too early; else the token near which the text stopped making sense. Every message
names what the user wrote and where (``SqlError.position``).

Nesting is bounded before anything recursive sees the text (sqlglot's parser, the planner
and the code generators all recurse): at most ``MAX_NESTING`` levels of what the parser
recurses into (parentheses, brackets, braces, CASE, nested type parameters, prefix operators
in a row, subscripts in a chain), the parsed tree at most ``MAX_DEPTH`` levels (a chain of
ORs or of ``+`` is one level a term).
"""

from __future__ import annotations

import difflib
import re
from typing import Callable

import sqlglot
from sqlglot.dialects.dialect import Dialect
from sqlglot.tokens import Token, TokenType

from rtindex.errors import SqlError

MAX_NESTING = 32  # levels the parser recurses into, open at once (see check_nesting)
# what opens a level, and the token that closes it (a CASE ends at END)
_CLOSERS = {TokenType.L_PAREN: TokenType.R_PAREN, TokenType.L_BRACKET: TokenType.R_BRACKET,
            TokenType.L_BRACE: TokenType.R_BRACE, TokenType.CASE: TokenType.END}
# prefix operators: the parser recurses once for each of a run (NOT NOT x, - - x)
_PREFIX = frozenset({TokenType.NOT, TokenType.DASH, TokenType.PLUS, TokenType.TILDE, TokenType.PIPE_SLASH,
                     TokenType.DPIPE_SLASH, TokenType.INTERVAL})
# types whose parameters nest (STRUCT<a STRUCT<...>>): a < after one of them opens a level
_NESTED_TYPES = frozenset({TokenType.STRUCT, TokenType.MAP, TokenType.ARRAY, TokenType.LIST, TokenType.NESTED,
                           TokenType.OBJECT, TokenType.UNION})
MAX_DEPTH = 256  # levels of the parsed expression tree
KEYWORDS = ("SELECT", "FROM", "WHERE", "GROUP BY", "ORDER BY", "HAVING", "LIMIT", "OFFSET", "AND", "OR", "NOT",
            "BETWEEN", "LIKE", "IN", "IS", "NULL", "AS", "DISTINCT", "CASE", "WHEN", "THEN", "ELSE", "END", "CAST",
            "ASC", "DESC", "UNNEST", "EXCEPT", "GROUP", "ORDER", "BY", "TRUE", "FALSE")
# how close a word must be to a keyword to be taken for a misspelling of it (difflib's ratio:
# FORM/FROM 0.75, WHRE/WHERE 0.89, SELEC/SELECT 0.91)
CUTOFF = 0.75
# tokens a query can end with (any other last token asks for more: WHERE, AND, =, ...)
_VALUES = {TokenType.NUMBER, TokenType.STRING, TokenType.VAR, TokenType.IDENTIFIER, TokenType.R_PAREN,
           TokenType.STAR, TokenType.PLACEHOLDER, TokenType.PARAMETER, TokenType.NULL, TokenType.TRUE,
           TokenType.FALSE}
# sqlglot's tokenizer: "Missing ' from 1:27" (the delimiter it wanted, line:offset of the opening)
_MISSING = re.compile(r"^Missing (\S+) from \d+:(\d+)$")


def syntax_error(sql: str, text: str, error: sqlglot.errors.SqlglotError,
                 original: Callable[[int], int], shown: Callable[[str], str]) -> SqlError:
    """The SqlError for sqlglot's ``error`` on ``text`` (``sql`` with parameters renamed:
    ``original`` maps a position in it back to ``sql``, ``shown`` a token to how the user
    wrote it)."""
    if isinstance(error, sqlglot.errors.TokenError):
        what, pos, closer = _unreadable(text, error)
        if pos is None:
            return SqlError(f"syntax error: {what}", sql)
        err = SqlError(f"syntax error: {what} starting at {_line_column(text, pos)} (close it with {closer})", sql)
        err.position = original(pos)  # set here: the message says where already
        return err
    if isinstance(error, sqlglot.errors.ParseError):
        message, pos = _unparsable(text, error, shown)
        return SqlError(message, sql, original(pos) if pos is not None else None)
    return SqlError("syntax error: this is not a SELECT rtindex can read", sql)


def check_nesting(sql: str, text: str, original: Callable[[int], int]) -> None:
    """SqlError if what sqlglot's parser recurses into nests deeper than MAX_NESTING in
    ``text`` (before parsing: it recurses once a level, many frames deep for some, CASE).
    A level is opened by a parenthesis, bracket or brace, a CASE, a < after a nested type, a
    prefix operator (each of a run counts, and a run before an opener weighs on it) and a
    subscript after a subscript (``a[1][2]``: the parser recurses once for each of a chain).
    A text that does not tokenize is left to the parser's error."""
    try:
        tokens = Dialect.get_or_raise("duckdb").tokenize(text)
    except sqlglot.errors.SqlglotError:
        return
    open_: list[tuple[TokenType, int]] = []  # (closer, levels it weighs) of each level open
    depth = 0  # levels open: the sum of their weights
    run = 0  # prefix operators just before this token
    chained = 0  # weight of the subscript this token would continue the chain of, else 0
    previous = None
    for t in tokens:
        kind = t.token_type
        closer = _CLOSERS.get(kind)
        if kind == TokenType.LT and previous in _NESTED_TYPES:
            closer = TokenType.GT
        if closer is not None:
            weight = 1 + run + (chained if kind == TokenType.L_BRACKET else 0)
            open_.append((closer, weight))
            depth += weight
            run = 0
        elif kind in _PREFIX:
            run += 1
        else:
            run = 0
        chained = 0
        if open_ and kind == open_[-1][0]:
            _, weight = open_.pop()
            depth -= weight
            if kind in (TokenType.R_BRACKET, TokenType.R_BRACE):
                chained = weight
        if depth + run > MAX_NESTING:
            raise SqlError(f"the query nests parentheses, subqueries, CASE, brackets or operators more than "
                           f"{MAX_NESTING} deep (the limit): flatten it, or split it into several queries",
                           sql, original(t.start))
        previous = kind


def check_depth(sql: str, tree: sqlglot.exp.Expression) -> None:
    """SqlError if the parsed ``tree`` is deeper than MAX_DEPTH levels (measured without
    recursion): a long chain of OR, AND or arithmetic terms is that deep."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SqlError(f"the query's expressions nest more than {MAX_DEPTH} deep (the limit; a chain of "
                           f"OR, AND or + counts a level a term): write `x IN (...)` for a chain of "
                           f"OR x = ..., or split the query", sql)
        stack.extend((child, depth + 1) for child in node.iter_expressions())


def _line_column(text: str, pos: int) -> str:
    return f"line {text.count(chr(10), 0, pos) + 1}, column {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"


def _unreadable(text: str, error: sqlglot.errors.TokenError) -> tuple[str, int | None, str]:
    """What the tokenizer could not read, where it starts and what would close it."""
    cause: BaseException | None = error
    while cause is not None:
        m = _MISSING.match(str(cause))
        if m:
            return ("unterminated quoted name" if m.group(1) == '"' else "unterminated string"), int(m.group(2)), m.group(1)
        cause = cause.__cause__
    start = text.find("/*")
    if start >= 0 and text.find("*/", start + 2) < 0:
        return "unterminated comment", start, "*/"
    return "cannot split the text into SQL words", None, ""


def _unparsable(text: str, error: sqlglot.errors.ParseError,
                shown: Callable[[str], str]) -> tuple[str, int | None]:
    """A message for the parser's error, and the position it is about."""
    tokens = Dialect.get_or_raise("duckdb").tokenize(text)
    info = error.errors[0] if error.errors else {}
    if not tokens:
        return "syntax error: the text has no SQL in it", None
    at = next((i for i, t in enumerate(tokens) if (t.line, t.col) == (info.get("line"), info.get("col"))),
              len(tokens) - 1)
    paren = _unbalanced(tokens)
    if paren is not None:
        return paren
    for i, t in enumerate(tokens):  # GROUP or ORDER without BY
        if t.token_type == TokenType.VAR and t.text.upper() in ("GROUP", "ORDER") and (
                i + 1 == len(tokens) or tokens[i + 1].text.upper() != "BY"):
            return f"syntax error near '{t.text}': did you mean {t.text.upper()} BY?", t.start
    for t in dict.fromkeys([tokens[0], tokens[at - 1] if at else tokens[0], tokens[at]]):
        hint = _keyword_like(t)
        if hint is not None:
            return f"syntax error near '{shown(t.text)}': did you mean {hint}?", t.start
    t = tokens[at]
    if at == len(tokens) - 1 and t.token_type not in _VALUES:  # e.g. "... WHERE", "... AND"
        return f"syntax error: the query ends too early, after '{shown(t.text)}'", t.start
    expected = re.match(r"^Expecting (\S+)$", str(info.get("description", "")))
    return (f"syntax error near '{shown(t.text)}'" + (f": expected {expected.group(1)}" if expected else ""),
            t.start)


def _unbalanced(tokens: list[Token]) -> tuple[str, int] | None:
    """The parenthesis that is never closed, or the one that closes nothing."""
    opened: list[Token] = []
    for t in tokens:
        if t.token_type == TokenType.L_PAREN:
            opened.append(t)
        elif t.token_type == TokenType.R_PAREN:
            if not opened:
                return "syntax error: unbalanced parenthesis: this ')' closes nothing", t.start
            opened.pop()
    if opened:
        return "syntax error: unbalanced parenthesis: this '(' is never closed", opened[-1].start
    return None


def _keyword_like(t: Token) -> str | None:
    """The keyword an unquoted word that is not one resembles (a misspelling), else None."""
    word = t.text.upper()
    if t.token_type != TokenType.VAR or word in KEYWORDS or len(word) < 2:
        return None
    close = difflib.get_close_matches(word, KEYWORDS, n=1, cutoff=CUTOFF)
    return close[0] if close else None
