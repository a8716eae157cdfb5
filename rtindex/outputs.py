"""How the command line writes rows: an aligned table for people, CSV, JSON lines or Parquet.

The table is drawn here rather than by pandas: ``DataFrame.to_string`` turns an integer
column with a NULL into floats (``3`` becomes ``3.0``) and right-aligns text, which misreads
query results. Every format writes a value the same way: objects, arrays and booleans as
JSON (as they were stored), times in ISO 8601, NULL as ``NULL`` in a table and as an empty
field in CSV.
"""

from __future__ import annotations

import csv
import datetime as dt
import unicodedata
from typing import IO, Any, Iterable, Sequence

import orjson

FORMATS = ("table", "csv", "json", "parquet")
TEXT_FORMATS = FORMATS[:3]  # what can go to a terminal or a pipe
DEFAULT_MAX_WIDTH = 40
_ESCAPES = str.maketrans({"\n": "\\n", "\r": "\\r", "\t": "\\t"})  # one table row is one line


def cell_text(value: Any) -> str | None:
    """``value`` as text, None for NULL (see the module docstring for the rules)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (dict, list, bool)):
        return orjson.dumps(value, default=str).decode()
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    return str(value)


def _width(text: str) -> int:
    """Columns ``text`` takes on a terminal: wide (CJK) characters two, combining marks none."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
               for c in text)


def _truncate(text: str, max_width: int) -> str:
    if not max_width or _width(text) <= max_width:
        return text
    out, used = [], 1  # 1: the ellipsis
    for c in text:
        used += _width(c)
        if used > max_width:
            break
        out.append(c)
    return "".join(out) + "…"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def table(columns: Sequence[str], rows: Sequence[dict], max_width: int = DEFAULT_MAX_WIDTH) -> str:
    """Rows as aligned text columns under a header: numbers right-aligned, text left-aligned,
    each cell cut to ``max_width`` characters with "…" (0: no limit)."""
    cells = [[_truncate((cell_text(r.get(c)) or "NULL").translate(_ESCAPES), max_width) for c in columns]
             for r in rows]
    header = [_truncate(c, max_width) for c in columns]
    widths = [max([_width(h)] + [_width(row[i]) for row in cells]) for i, h in enumerate(header)]
    right = [bool(rows) and all(_is_number(r.get(c)) or r.get(c) is None for r in rows) for c in columns]

    def line(texts: list[str]) -> str:
        return "  ".join(" " * (w - _width(t)) + t if r else t + " " * (w - _width(t))
                         for t, w, r in zip(texts, widths, right)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(row) for row in cells)]) + "\n"


def write_text(columns: Sequence[str], rows: Iterable[dict], fmt: str, out: IO[str],
               max_width: int = DEFAULT_MAX_WIDTH) -> None:
    """Write rows to a text stream as ``table``, ``csv`` (a header line, then one line a row)
    or ``json`` (JSON lines: one object a row, as ``rtindex import`` reads them back). CSV and
    JSON are written as the rows come, so an iterator of any length takes little memory."""
    if fmt == "table":
        out.write(table(columns, list(rows), max_width))
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([cell_text(r.get(c)) for c in columns] for r in rows)
    elif fmt == "json":
        for r in rows:
            out.write(orjson.dumps(r, default=str, option=orjson.OPT_NON_STR_KEYS).decode())
            out.write("\n")
    else:
        raise ValueError(f"unknown text format {fmt!r}; one of {', '.join(TEXT_FORMATS)}")


def footer(n_rows: int, seconds: float, access: str) -> str:
    """The line under a result: ``3 rows (1.2 ms, index path)``."""
    return f"{n_rows:,} row{'' if n_rows == 1 else 's'} ({seconds * 1000:,.1f} ms, {access} path)"
