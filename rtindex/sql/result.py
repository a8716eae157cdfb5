"""Result: what a SQL query returns, as rows or as Arrow, converted only when asked."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pyarrow as pa

from rtindex.errors import ResultTooLargeError
from rtindex.sql import frames

if TYPE_CHECKING:
    import pandas

    from rtindex.sql.plan import Plan

BATCH_ROWS = 10_000  # arrow_reader()'s default batch size


class Result:
    """Rows of one query. ``rows()`` gives dicts, ``arrow()`` a pyarrow Table, ``df()`` a
    pandas DataFrame; iterating yields the dicts; ``arrow_reader()`` streams record batches.
    ``access`` says which path ran ("index" or "scan"), ``plan`` why, ``seconds`` how long it
    took and ``timings`` where that went (seconds per stage: ``plan`` (parse, lookups,
    choice), ``fetch`` (index path: rows to values, "add fields"), ``scan`` (column scan),
    ``duckdb``).

    Documents (``SELECT *``) come back as stored; as Arrow, their top-level fields become
    columns, typed as docs/sql.md describes.

    ``warnings`` (a list of str, usually empty) says when a valid query almost surely does
    not ask what was meant: a field that no document of the collection has (with the
    nearest one it has: ``LANG`` when only ``lang`` exists), a WHERE on an output alias.

    A result larger than the database's ``max_result_bytes`` is not built: ``Database.sql``
    returns it unread, ``rows()``, ``arrow()``, ``df()`` and iteration raise
    ResultTooLargeError, and ``arrow_reader()`` reads it in batches.
    """

    def __init__(self, columns: list[str] | None, *, rows: list[dict] | None = None,
                 table: pa.Table | None = None, access: str = "index",
                 refused: ResultTooLargeError | None = None,
                 stream: Callable[[int], pa.RecordBatchReader] | None = None):
        # two output columns of one name (SELECT a AS x, b AS x; SELECT * over a join):
        # the later ones are x_2, x_3... on every path, so that no value hides another
        if table is not None:
            table = frames.with_unique_names(table)
            columns = table.column_names if columns is not None else None
        elif columns is not None:
            columns = frames.unique_names(columns)
        self._columns = columns
        self._rows = rows
        self._table = table
        self._refused = refused  # set: the result is over budget; only stream() reads it
        self._stream = stream
        self.access = access
        self.plan: Plan | None = None
        self.seconds = 0.0
        self.timings: dict[str, float] = {}
        self.warnings: list[str] = []

    def _check_budget(self) -> None:
        if self._refused is not None:
            raise self._refused.with_traceback(None)

    @property
    def columns(self) -> list[str]:
        """Output column names (for ``SELECT *``: the top-level fields of the rows)."""
        if self._columns is None:
            self._columns = (self.arrow_reader().schema if self._refused is not None else self.arrow().schema).names
        return list(self._columns)

    def rows(self) -> list[dict[str, Any]]:
        """Every row as a dict of column name -> value."""
        self._check_budget()
        if self._rows is None:
            self._rows = self._table.to_pylist()
        return self._rows

    def arrow(self) -> pa.Table:
        """Every row as a pyarrow Table."""
        self._check_budget()
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

    def arrow_reader(self, batch_size: int = BATCH_ROWS) -> pa.RecordBatchReader:
        """Every row as a ``pyarrow.RecordBatchReader`` of batches of about ``batch_size``
        rows, typed as ``arrow()`` types them; never refused by ``max_result_bytes``.

        A result over that budget is read from the snapshot of the query as the batches are
        consumed, so memory stays bounded by a batch (plus, for the index path, what the
        query needs besides the rows: docs/sql.md says what). Index-path rows are read twice:
        once to learn every column and its type, once for the batches.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
        if self._refused is not None:
            reader = self._stream(batch_size)
            schema = frames.with_unique_names(reader.schema.empty_table()).schema
            if schema.names == reader.schema.names:
                return reader
            return pa.RecordBatchReader.from_batches(schema, (frames.with_unique_names(b) for b in reader))
        table = self.arrow()
        return pa.RecordBatchReader.from_batches(table.schema, (b for b in table.to_batches(max_chunksize=batch_size)
                                                                if b.num_rows))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows())

    def __len__(self) -> int:
        if self._refused is not None:
            return self._refused.rows
        return len(self._rows) if self._rows is not None else self._table.num_rows

    def __repr__(self) -> str:
        return f"<rtindex.Result {len(self)} rows via {self.access} path>"
