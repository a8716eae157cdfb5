"""Result: what a SQL query returns, as rows or as Arrow, converted only when asked."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa

from rtindex.sql import frames

if TYPE_CHECKING:
    import pandas

    from rtindex.sql.engine import Plan


class Result:
    """Rows of one query. ``rows()`` gives dicts, ``arrow()`` a pyarrow Table, ``df()`` a
    pandas DataFrame; iterating yields the dicts. ``access`` says which path ran ("index" or
    "scan"), ``plan`` why, ``seconds`` how long it took and ``timings`` where that went
    (seconds per stage: ``plan`` (parse, lookups, choice), ``fetch`` (index path: rows to
    values, "add fields"), ``scan`` (column scan), ``duckdb``).

    Documents (``SELECT *``) come back as stored; as Arrow, their top-level fields become
    columns, typed as docs/sql.md describes.
    """

    def __init__(self, columns: list[str] | None, *, rows: list[dict] | None = None,
                 table: pa.Table | None = None, access: str = "index"):
        self._columns = columns
        self._rows = rows
        self._table = table
        self.access = access
        self.plan: Plan | None = None
        self.seconds = 0.0
        self.timings: dict[str, float] = {}

    @property
    def columns(self) -> list[str]:
        """Output column names (for ``SELECT *``: the top-level fields of the rows)."""
        if self._columns is None:
            self._columns = self.arrow().column_names
        return list(self._columns)

    def rows(self) -> list[dict[str, Any]]:
        """Every row as a dict of column name -> value."""
        if self._rows is None:
            self._rows = self._table.to_pylist()
        return self._rows

    def arrow(self) -> pa.Table:
        """Every row as a pyarrow Table."""
        if self._table is None:
            self._table = frames.rows_table(self._rows)
            if self._columns is not None and not self._table.column_names and self._columns:
                self._table = pa.table({c: pa.nulls(0) for c in self._columns})
        return self._table

    def df(self) -> "pandas.DataFrame":
        """Every row as a pandas DataFrame (needs pandas installed)."""
        if importlib.util.find_spec("pandas") is None:
            raise ImportError("Result.df() needs pandas: pip install pandas")
        return self.arrow().to_pandas()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows())

    def __len__(self) -> int:
        return len(self._rows) if self._rows is not None else self._table.num_rows

    def __repr__(self) -> str:
        return f"<rtindex.Result {len(self)} rows via {self.access} path>"
