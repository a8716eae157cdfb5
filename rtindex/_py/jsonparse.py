"""Reference strict JSON document parser: small and obviously correct, the oracle for the compiled scanner.

``parse_document(raw)`` reads one document (a JSON object) from UTF-8 bytes and returns it as
Python values: dict (insertion order), :class:`RawList`, str, int, float, True/False, None.
The one-pass scanner of ``rtindex/_ext/_segment.pyx`` follows the same rules and must give the
same result on every input, the same :class:`~rtindex.errors.SchemaError` (message and path)
included. The parser reads left to right and raises at the first problem, the moment it sees it.

Syntax errors say ``invalid JSON at byte {pos}: {what}`` (path ``$``); ``pos`` is a 0-based byte
offset, ``len(raw)`` for ``unexpected end of input``. Whitespace is space, tab, LF and CR only.
Numbers follow ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?`` and end at the first byte that
cannot continue them (the container judges that byte). Strings must be valid UTF-8 (RFC 3629,
checked byte by byte) without control characters; ``\\uD800``-``\\uDBFF`` must be followed at
once by ``\\uDC00``-``\\uDFFF``. Schema errors carry the path of the value concerned: a lone
surrogate escape, a duplicate key, an integer outside int64, a number that overflows a double,
and nesting deeper than ``max_depth`` (the root object is level 1).

It recurses once per nesting level: keep ``max_depth`` below a few hundred.
"""

from __future__ import annotations

import math
from typing import Any

from rtindex.errors import SchemaError
from rtindex.keys import INT_MAX, INT_MIN, json_path

WHITESPACE = b" \t\n\r"
HEX_DIGITS = b"0123456789abcdefABCDEF"
DIGITS = b"0123456789"
ESCAPES = {ord('"'): '"', ord("\\"): "\\", ord("/"): "/", ord("b"): "\b", ord("f"): "\f",
           ord("n"): "\n", ord("r"): "\r", ord("t"): "\t"}
LITERALS = {ord("t"): (b"true", True), ord("f"): (b"false", False), ord("n"): (b"null", None)}
# What a document that is not an object is, by its first byte.
NOT_AN_OBJECT = {ord("["): "an array", ord('"'): "a string", ord("-"): "a number",
                 ord("t"): "a boolean", ord("f"): "a boolean", ord("n"): "null",
                 **{d: "a number" for d in DIGITS}}


class RawList(list):
    """A JSON array; ``json`` is its source text without the whitespace outside strings."""

    json: str


def parse_document(raw: bytes, max_depth: int = 64) -> dict:
    """The JSON object in ``raw``; SchemaError at the first problem (see the module docstring)."""
    return _Parser(bytes(raw), max_depth).document()


def syntax_error(pos: int, what: str) -> SchemaError:
    return SchemaError(f"invalid JSON at byte {pos}: {what}", "$")


def unexpected(c: int) -> str:
    return f"unexpected character '{chr(c)}'" if 0x21 <= c <= 0x7E else f"unexpected byte 0x{c:02x}"


def utf8_length(raw: bytes, i: int) -> int:
    """The length of the valid UTF-8 sequence whose lead byte raw[i] is >= 0x80; 0 if it is
    not one (a bad lead byte, an overlong form, a surrogate, above U+10FFFF, cut short)."""
    c = raw[i]
    if 0xC2 <= c <= 0xDF:
        need, lo, hi = 2, 0x80, 0xBF
    elif 0xE0 <= c <= 0xEF:
        need, lo, hi = 3, 0xA0 if c == 0xE0 else 0x80, 0x9F if c == 0xED else 0xBF
    elif 0xF0 <= c <= 0xF4:
        need, lo, hi = 4, 0x90 if c == 0xF0 else 0x80, 0x8F if c == 0xF4 else 0xBF
    else:
        return 0  # a continuation byte, C0/C1 (always overlong) or F5..FF
    seq = raw[i : i + need]
    if len(seq) < need or not lo <= seq[1] <= hi or not all(0x80 <= b <= 0xBF for b in seq[2:]):
        return 0
    return need


def minify(text: bytes) -> str:
    """``text`` (valid JSON) without the whitespace outside strings."""
    out = bytearray()
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash: the next byte is escaped
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in WHITESPACE:
            continue
        out.append(c)
    return out.decode("utf-8")


class _Parser:
    """Each method takes the position where its token starts and returns (value, end)."""

    def __init__(self, raw: bytes, max_depth: int):
        self.raw = raw
        self.max_depth = max_depth

    def byte(self, i: int) -> int:
        """raw[i]; unexpected end of input when there is none."""
        if i >= len(self.raw):
            raise syntax_error(len(self.raw), "unexpected end of input")
        return self.raw[i]

    def skip_ws(self, i: int) -> int:
        while i < len(self.raw) and self.raw[i] in WHITESPACE:
            i += 1
        return i

    def document(self) -> dict:
        i = self.skip_ws(0)
        if i == len(self.raw):
            raise SchemaError("empty document", "$")
        c = self.raw[i]
        if c != ord("{"):
            if c in NOT_AN_OBJECT:
                raise SchemaError(f"a document must be a JSON object, not {NOT_AN_OBJECT[c]}", "$")
            raise self.not_a_value(i)
        doc, i = self.object(i, [], 1)
        i = self.skip_ws(i)
        if i < len(self.raw):
            raise syntax_error(i, "unexpected content after the document")
        return doc

    def not_a_value(self, i: int) -> SchemaError:
        """The error for raw[i], a byte that cannot start a value."""
        c = self.raw[i]
        if c == ord("N") or c == ord("I"):
            return syntax_error(i, "NaN and Infinity are not JSON numbers")
        return syntax_error(i, unexpected(c))

    def check_depth(self, level: int, path: list):
        if level > self.max_depth:
            raise SchemaError(f"nesting deeper than {self.max_depth} levels", json_path(path))

    def value(self, i: int, path: list, level: int) -> tuple[Any, int]:
        """The value at ``path`` starting at raw[i], inside a container of level ``level``."""
        c = self.byte(i)
        if c == ord("{"):
            return self.object(i, path, level + 1)
        if c == ord("["):
            return self.array(i, path, level + 1)
        if c == ord('"'):
            return self.string(i + 1, path, "string")
        if c == ord("-") or c in DIGITS:
            return self.number(i, path)
        if c in LITERALS:
            word, v = LITERALS[c]
            if self.raw[i : i + len(word)] != word:
                raise syntax_error(i, unexpected(c))
            return v, i + len(word)
        raise self.not_a_value(i)

    def object(self, i: int, path: list, level: int) -> tuple[dict, int]:
        self.check_depth(level, path)
        obj: dict = {}
        i = self.skip_ws(i + 1)
        if self.byte(i) == ord("}"):
            return obj, i + 1
        while True:
            if self.byte(i) != ord('"'):
                raise syntax_error(i, "expected a string key")
            key, i = self.string(i + 1, path, "key")  # a key's lone surrogate: the object's path
            if key in obj:
                raise SchemaError("duplicate key in an object", json_path(path + [key]))
            i = self.skip_ws(i)
            if self.byte(i) != ord(":"):
                raise syntax_error(i, "expected ':' after an object key")
            v, i = self.value(self.skip_ws(i + 1), path + [key], level)
            obj[key] = v
            i = self.skip_ws(i)
            c = self.byte(i)
            if c == ord("}"):
                return obj, i + 1
            if c != ord(","):
                raise syntax_error(i, "expected ',' or '}' after an object member")
            i = self.skip_ws(i + 1)

    def array(self, i: int, path: list, level: int) -> tuple[RawList, int]:
        self.check_depth(level, path)
        start = i
        out = RawList()
        i = self.skip_ws(i + 1)
        if self.byte(i) == ord("]"):
            i += 1
        else:
            while True:
                v, i = self.value(i, path + [len(out)], level)
                out.append(v)
                i = self.skip_ws(i)
                c = self.byte(i)
                if c == ord("]"):
                    i += 1
                    break
                if c != ord(","):
                    raise syntax_error(i, "expected ',' or ']' after an array element")
                i = self.skip_ws(i + 1)
        out.json = minify(self.raw[start:i])
        return out, i

    def number(self, i: int, path: list) -> tuple[int | float, int]:
        raw, start = self.raw, i
        if raw[i] == ord("-"):
            i += 1
            if raw[i : i + 1] == b"I":
                raise syntax_error(start, "NaN and Infinity are not JSON numbers")
        i = i + 1 if raw[i : i + 1] == b"0" else self.digits(i)
        is_int = True
        if raw[i : i + 1] == b".":
            i = self.digits(i + 1)
            is_int = False
        if raw[i : i + 1] in (b"e", b"E"):
            i += 1
            if raw[i : i + 1] in (b"+", b"-"):
                i += 1
            i = self.digits(i)
            is_int = False
        text = raw[start:i].decode("ascii")
        if is_int:
            # More than 20 characters is out of range; it also keeps int() off huge texts.
            if len(text) > 20 or not INT_MIN <= int(text) <= INT_MAX:
                raise SchemaError("integer outside the signed 64-bit range", json_path(path))
            return int(text), i
        v = float(text)
        if not math.isfinite(v):
            raise SchemaError(f"non-finite number {v!r} (JSON has no NaN or Infinity)", json_path(path))
        return v, i

    def digits(self, i: int) -> int:
        """The end of the run of digits at raw[i]; invalid number at i if there is none."""
        j = i
        while j < len(self.raw) and self.raw[j] in DIGITS:
            j += 1
        if j == i:
            raise syntax_error(i, "invalid number")
        return j

    def string(self, i: int, path: list, noun: str) -> tuple[str, int]:
        """The string whose first byte after the opening quote is raw[i]; ``noun`` ("string" or
        "key") and ``path`` are what a lone surrogate error says."""
        raw, pieces = self.raw, []
        while True:
            c = self.byte(i)
            if c == ord('"'):
                return "".join(pieces), i + 1
            if c < 0x20:
                raise syntax_error(i, "control character in a string")
            if c == ord("\\"):
                piece, i = self.escape(i, path, noun)
            elif c >= 0x80:
                n = utf8_length(raw, i)
                if n == 0:
                    raise syntax_error(i, "invalid UTF-8 in a string")
                piece, i = raw[i : i + n].decode("utf-8"), i + n
            else:
                piece, i = chr(c), i + 1
            pieces.append(piece)

    def escape(self, i: int, path: list, noun: str) -> tuple[str, int]:
        """The escape whose backslash is raw[i]."""
        c = self.byte(i + 1)
        if c in ESCAPES:
            return ESCAPES[c], i + 2
        if c != ord("u"):
            raise syntax_error(i, "invalid escape")
        for k in range(i + 2, i + 6):  # digit by digit: the end of input, else a non-hex digit
            if self.byte(k) not in HEX_DIGITS:
                raise syntax_error(i, "invalid \\u escape")
        u = int(self.raw[i + 2 : i + 6], 16)
        if 0xD800 <= u <= 0xDBFF:
            after = self.raw[i + 6 : i + 12]  # a low surrogate escape must follow at once
            if (len(after) == 6 and after[:2] == b"\\u" and all(b in HEX_DIGITS for b in after[2:])
                    and 0xDC00 <= int(after[2:], 16) <= 0xDFFF):
                return chr(0x10000 + ((u - 0xD800) << 10) + (int(after[2:], 16) - 0xDC00)), i + 12
        if 0xD800 <= u <= 0xDFFF:
            raise SchemaError(f"{noun} is not valid UTF-8 (lone surrogate)", json_path(path))
        return chr(u), i + 6
