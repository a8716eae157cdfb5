"""DuckDB behind a sandbox: the only module of rtindex that imports duckdb (below both the
SQL layer and column-wise ingest, which makes rows' JSON text with it).

The SQL layer hands us a generated SELECT over Arrow tables it has already built; DuckDB
only does the relational work (GROUP BY, ORDER BY, aggregates, expressions). User input
reaches this text only through the whitelist upstream and bound parameters, but the
engine is locked down anyway, so that a hole upstream still cannot read or write files,
reach the network, load extensions, attach databases or change settings.
"""

from __future__ import annotations

import atexit
import json
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from typing import Any, Iterator

import duckdb
import pyarrow as pa

from rtindex.errors import ClosedError, QueryTimeoutError, RtindexError, SqlError

CHECKED_STATEMENTS = 1024  # parsed-and-checked statements kept, by SQL text
READ_BATCH_ROWS = 65_536  # rows per batch when a result is read in batches (DuckDB makes 2,048 at a time)
# seconds between interrupts of a query past its deadline: one that comes before DuckDB
# starts the query is lost, so it is sent again until the query is out
INTERRUPT_AGAIN = 0.01
# DuckDB checks for an interrupt between batches of rows, never inside one function call: a
# call that makes one huge value runs to its end. So the functions whose output size a
# query's arguments choose make at most this much per value (see _GUARDS), and a query past
# its time limit stops within a batch.
MAX_LIST_ITEMS = 100_000  # range, generate_series, list_resize
MAX_VALUE_BYTES = 1 << 20  # repeat, lpad, rpad

# the user's SQL text, and internal name -> the user's words for it (Result errors name those)
QueryContext = tuple[str, Callable[[str], str]]  # the user's SQL, and DuckDB's message told about it

_CONFIG = {
    # No files, no network, no Python replacement scans of the caller's variables.
    "enable_external_access": False,
    # Stated although external access off implies it: what a query names must be a
    # table we registered, never a pandas/Arrow variable found in some calling frame.
    "python_enable_replacements": False,
    "autoload_known_extensions": False,
    "autoinstall_known_extensions": False,
    "allow_community_extensions": False,
    # Else duckdb_secrets() and friends go looking in ~/.duckdb/stored_secrets.
    "allow_persistent_secrets": False,
    # Else a query that outgrows memory_limit spills into ./.tmp of whatever the
    # process's working directory is: we would rather fail the query.
    "temp_directory": "",
}

# Settings DuckDB accepts only once the database is running, then the lock: from here
# on SET/RESET/PRAGMA cannot change any option. enable_external_access=False still lets
# a query read the files an in-memory database "owns" (./:memory:, ./:memory:.wal, ...,
# see allowed_paths), so the local file system is switched off as well.
_LOCKDOWN = (
    "SET disabled_filesystems = 'LocalFileSystem'",
    "SET lock_configuration = true",
)


# count of the items range(a, b, c) or generate_series(a, b, c) make, for numbers and for
# times with an INTERVAL step alike (the casts through text bind for every type; NULL: no step)
_ITEMS3 = ("(CASE WHEN typeof(c) = 'INTERVAL' THEN (epoch(TRY_CAST(CAST(b AS VARCHAR) AS TIMESTAMPTZ)) - "
           "epoch(TRY_CAST(CAST(a AS VARCHAR) AS TIMESTAMPTZ))) / "
           "nullif(epoch(TRY_CAST(CAST(c AS VARCHAR) AS INTERVAL)), 0) ELSE (TRY_CAST(CAST(b AS VARCHAR) AS DOUBLE) - TRY_CAST(CAST(a AS VARCHAR) AS DOUBLE)) / "
           "nullif(TRY_CAST(CAST(c AS VARCHAR) AS DOUBLE), 0) END)")
_ITEMS2 = "(TRY_CAST(CAST(b AS VARCHAR) AS DOUBLE) - TRY_CAST(CAST(a AS VARCHAR) AS DOUBLE))"
_ITEMS1 = "TRY_CAST(CAST(a AS VARCHAR) AS DOUBLE)"


def _guarded(name: str, forms: list[tuple[str, str, str]], unit: str, limit: int) -> str:
    """A macro that shadows DuckDB's function ``name``: each form (its parameters, the one to
    guard, the size it would make) calls the built-in (system.main) with the guarded
    parameter replaced by an error when that size is over ``limit``. The guard is inside the
    argument, not around the call: DuckDB folds a call of constants into its value while it
    plans, before it would choose a branch of a CASE around it."""
    message = (f"{name}() would make a value of more than {limit:,} {unit}, the most one call may make "
               "(a function call cannot be interrupted: a larger one could outlast the time limit of the query)")
    return f"CREATE MACRO {name}" + ", ".join(
        f"({params}) AS system.main.{name}(" + ", ".join(
            f"CASE WHEN {size} > {limit} THEN error('{message}') ELSE {p} END" if p == guarded else p
            for p in params.split(", ")) + ")"
        for params, guarded, size in forms)


_RANGES = [("a", "a", _ITEMS1), ("a, b", "b", _ITEMS2), ("a, b, c", "c", _ITEMS3)]
# macros in the engine's own schema, which a call by the bare name finds before the built-in
_GUARDS = (
    _guarded("range", _RANGES, "items", MAX_LIST_ITEMS),
    _guarded("generate_series", _RANGES, "items", MAX_LIST_ITEMS),
    _guarded("list_resize", [("l, n", "n", "n"), ("l, n, fill", "n", "n")], "items", MAX_LIST_ITEMS),
    _guarded("array_resize", [("l, n", "n", "n"), ("l, n, fill", "n", "n")], "items", MAX_LIST_ITEMS),
    _guarded("repeat", [("s, n", "n", "CAST(n AS DOUBLE) * strlen(CAST(s AS VARCHAR))")], "bytes", MAX_VALUE_BYTES),
    _guarded("lpad", [("s, n, fill", "n", "n")], "bytes", MAX_VALUE_BYTES),
    _guarded("rpad", [("s, n, fill", "n", "n")], "bytes", MAX_VALUE_BYTES),
)

_limit = threading.local()  # this thread's (deadline, timeout_ms), see time_limit()


@contextmanager
def time_limit(timeout_ms: float | None) -> Iterator[None]:
    """DuckDB queries this thread runs inside stop ``timeout_ms`` after it is entered: the
    engine interrupts them then, and they raise QueryTimeoutError (None: no limit)."""
    before = getattr(_limit, "at", None)
    _limit.at = None if timeout_ms is None else (time.monotonic() + timeout_ms / 1000.0, timeout_ms)
    try:
        yield
    finally:
        _limit.at = before


def check_time_limit() -> None:
    """QueryTimeoutError if this thread's time_limit() has run out: what work outside DuckDB
    (building a query's inputs) calls between its steps, as DuckDB checks for interrupts
    between batches of rows."""
    limit = getattr(_limit, "at", None)
    if limit is not None and time.monotonic() >= limit[0]:
        raise _timeout_error(limit[1])


def _timeout_error(timeout_ms: float) -> QueryTimeoutError:
    return QueryTimeoutError(f"the query ran past timeout_ms={timeout_ms:g} and was stopped")


class OutputTooLarge(Exception):
    """A result over :meth:`DuckEngine.run`'s ``max_bytes``: its ``columns``, and the ``rows``
    and ``nbytes`` (Arrow) it had."""

    def __init__(self, columns: list[str], rows: int, nbytes: int):
        super().__init__(f"{rows} rows, {nbytes} bytes")
        self.columns = columns
        self.rows = rows
        self.nbytes = nbytes


class DuckEngine:
    """A sandboxed DuckDB database shared by every query of one rtindex Database."""

    def __init__(self, threads: int | None = None, memory_limit_bytes: int | None = None) -> None:
        if (threads is not None and threads < 1) or (memory_limit_bytes is not None and memory_limit_bytes < 1):
            raise ValueError("threads and memory_limit_bytes must be positive (or None for DuckDB's default)")
        config: dict[str, Any] = dict(_CONFIG)
        if threads is not None:
            config["threads"] = threads
        if memory_limit_bytes is not None:
            config["memory_limit"] = f"{memory_limit_bytes}B"
        self._con: duckdb.DuckDBPyConnection | None = duckdb.connect(":memory:", config=config)
        for statement in _GUARDS + _LOCKDOWN:
            self._con.execute(statement)
        # Guards _con, _running, _streams and _checked; close() waits on it for in-flight runs to stop.
        self._cond = threading.Condition()
        self._running: set[duckdb.DuckDBPyConnection] = set()
        # cursors of readers handed out by stream(), which run as fast as their consumers read
        self._streams: set[duckdb.DuckDBPyConnection] = set()
        # SQL text -> its one checked SELECT statement: the SQL layer runs the same few texts
        # over and over, and parsing one again costs as much as a small query's execution
        self._checked: OrderedDict[str, duckdb.Statement] = OrderedDict()
        # cursor -> (deadline, timeout_ms) of the queries run under time_limit(); a watchdog
        # thread (started with the first) interrupts them at their deadline
        self._deadlines: dict[duckdb.DuckDBPyConnection, tuple[float, float]] = {}
        self._timed_out: set[duckdb.DuckDBPyConnection] = set()
        self._watchdog: threading.Thread | None = None
        _OPEN.add(self)

    def run(self, sql: str, tables: Mapping[str, pa.Table], params: Mapping[str, Any] | None = None,
            max_bytes: int | None = None, query: QueryContext | None = None, exact_sums: bool = False) -> pa.Table:
        """Run one SELECT over the given Arrow tables (registered under those names for this
        call only) with named parameters ($name in the text) and return the result as a
        pyarrow Table. ``query``: the user's SQL text, and what its internal names stand
        for (see :meth:`_error`). With ``max_bytes``, a result that grows past it is not kept: the rest
        is only counted, batch by batch, and :class:`OutputTooLarge` says how big it was.
        ``exact_sums``: HUGEINT columns (sums of integers) stay 128-bit, as decimal128(38, 0)
        named in the schema's metadata (``HUGEINT_COLUMNS``), for a sum of sums to add up."""
        cursor = self._open_cursor(self._running)
        try:
            relation = self._relation(cursor, sql, tables, params, exact_sums)
            if exact_sums:
                hugeint = [n for n, t in zip(relation.columns, relation.types) if str(t) == "HUGEINT"]
                table = relation.to_arrow_table()
                return table.replace_schema_metadata({HUGEINT_COLUMNS: ",".join(hugeint).encode()})
            if max_bytes is None:
                return relation.to_arrow_table()
            reader = relation.to_arrow_reader(READ_BATCH_ROWS)
            kept: list[pa.RecordBatch] | None = []
            rows = size = 0
            for batch in reader:
                rows += batch.num_rows
                size += batch.nbytes
                if kept is not None and size <= max_bytes:
                    kept.append(batch)
                else:
                    kept = None
            if kept is None:
                raise OutputTooLarge(reader.schema.names, rows, size)
            return pa.Table.from_batches(kept, schema=reader.schema)
        except (duckdb.Error, OSError, pa.ArrowException) as e:
            raise self._error(e, sql, query, cursor) from e
        finally:
            self._close_cursor(cursor, self._running)

    def stream(self, sql: str, tables: Mapping[str, pa.Table], params: Mapping[str, Any] | None = None,
               batch_rows: int = READ_BATCH_ROWS, query: QueryContext | None = None) -> pa.RecordBatchReader:
        """:meth:`run`, as a reader of record batches (about ``batch_rows`` rows each) that
        DuckDB produces as they are read. Its cursor stays open until the reader is exhausted
        or dropped; close() does not wait for that: it interrupts the query, and the reader
        raises ClosedError."""
        cursor = self._open_cursor(self._streams)
        try:
            reader = self._relation(cursor, sql, tables, params).to_arrow_reader(batch_rows)
        except BaseException as e:
            error = self._error(e, sql, query, cursor) if isinstance(e, duckdb.Error) else None
            self._close_cursor(cursor, self._streams)
            if error is not None:
                raise error from e
            raise

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                while True:
                    if self._con is None:  # an interrupt that came before the query ran is lost
                        raise ClosedError("the SQL engine was closed while the result was read")
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        return
                    except (duckdb.Error, OSError, pa.ArrowException) as e:  # Arrow's reader: OSError
                        raise self._error(e, sql, query, cursor) from e
                    yield batch
            finally:
                self._close_cursor(cursor, self._streams)
        return pa.RecordBatchReader.from_batches(reader.schema, batches())

    def _open_cursor(self, registry: set) -> duckdb.DuckDBPyConnection:
        with self._cond:
            if self._con is None:
                raise ClosedError("the SQL engine is closed")
            # A cursor is a connection of its own to the same database (and config):
            # safe to use from this thread while others use theirs, and the views
            # register() makes are temporary to it, so names never meet across calls.
            limit = getattr(_limit, "at", None)
            if limit is not None and time.monotonic() >= limit[0]:
                raise _timeout_error(limit[1])
            cursor = self._con.cursor()
            registry.add(cursor)
            if limit is not None:
                self._deadlines[cursor] = limit
                if self._watchdog is None:
                    self._watchdog = threading.Thread(target=self._watch, name="rtindex-sql-deadlines", daemon=True)
                    self._watchdog.start()
                self._cond.notify_all()
            return cursor

    def _close_cursor(self, cursor: duckdb.DuckDBPyConnection, registry: set) -> None:
        with self._cond:  # so close() never interrupts a closed cursor (that raises)
            cursor.close()  # drops the registered views with it
            registry.discard(cursor)
            self._deadlines.pop(cursor, None)
            self._timed_out.discard(cursor)
            self._cond.notify_all()

    def _watch(self) -> None:
        """The watchdog thread: interrupt each query at its deadline (and again until it is out)."""
        with self._cond:
            while self._con is not None:
                now = time.monotonic()
                wait = None
                for cursor, (at, _) in self._deadlines.items():
                    if at <= now:
                        self._timed_out.add(cursor)
                        cursor.interrupt()
                        at = now + INTERRUPT_AGAIN
                    wait = at - now if wait is None else min(wait, at - now)
                self._cond.wait(wait)

    def _relation(self, cursor: duckdb.DuckDBPyConnection, sql: str, tables: Mapping[str, pa.Table],
                  params: Mapping[str, Any] | None, exact_sums: bool = False) -> duckdb.DuckDBPyRelation:
        statement = self._statement(cursor, sql)
        for name, table in tables.items():
            cursor.register(name, table)  # a view over memory: no external access needed
        # sql() on the checked statement runs exactly what was checked, and its
        # relation hands Arrow over without the copy a DB-API result makes.
        relation = cursor.sql(statement, params=None if params is None else dict(params))
        return relation if exact_sums else _hugeint_as_bigint(relation)

    def _error(self, e: Exception, sql: str, query: QueryContext | None = None,
               cursor: duckdb.DuckDBPyConnection | None = None) -> RtindexError:
        """DuckDB's error about the generated ``sql``, told about the user's query by
        ``query`` (its internal names, frame columns f0, scan columns c0, ..., are never
        shown otherwise: rtindex.sql.messages.duckdb_error)."""
        if self._con is None:  # close() interrupted us
            return ClosedError("the SQL engine was closed while the query ran")
        with self._cond:
            if cursor in self._timed_out:  # the watchdog interrupted it
                return _timeout_error(self._deadlines[cursor][1])
        # DuckDB's first line says what is wrong; the rest is the text echoed with
        # a caret or tuning advice (SET threads=...) that does not apply here.
        user_sql, tell = query if query is not None else (sql, str)
        return SqlError(tell(str(e).partition("\n")[0] or type(e).__name__), sql=user_sql)

    def _statement(self, cursor: duckdb.DuckDBPyConnection, sql: str) -> duckdb.Statement:
        with self._cond:
            statement = self._checked.get(sql)
            if statement is not None:
                self._checked.move_to_end(sql)
                return statement
        statement = _one_select(cursor, sql)
        with self._cond:
            self._checked[sql] = statement
            while len(self._checked) > CHECKED_STATEMENTS:
                self._checked.popitem(last=False)
        return statement

    def close(self) -> None:
        """Interrupt running queries, wait for them to stop, then free the database; idempotent."""
        with self._cond:
            con, self._con = self._con, None
            if con is None:
                return
            for cursor in self._streams:  # their readers raise ClosedError from now on
                cursor.interrupt()
            # DuckDB refuses to close a connection whose cursors are busy. An interrupt
            # that comes before a query starts is lost, hence again until all are out.
            while self._running:
                for cursor in self._running:
                    cursor.interrupt()
                self._cond.wait(0.01)
            self._checked.clear()
        con.close()


# DuckDB objects still alive when the interpreter shuts down make its bindings print
# "nanobind: leaked N instances!" at exit: what a script that never called db.close() got.
_OPEN: weakref.WeakSet[DuckEngine] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for engine in list(_OPEN):
        engine.close()


_json_local = threading.local()


def json_objects(names: list[str], arrays: list[pa.Array]) -> pa.Array:
    """Each row's JSON object text, keys ``names`` in order, by DuckDB's ``json_object``:
    how a table ingested column-wise gets its rows' text (rtindex.columnar). The names are
    bound as parameters, so any text is a key, as it is to a dict. Runs in this thread's
    own in-memory database, locked down as the query engine's is and on one thread (the
    caller's, which DuckDB releases the GIL for), not in a Database's query engine."""
    con = getattr(_json_local, "con", None)
    if con is None:
        con = duckdb.connect(":memory:", config={**_CONFIG, "threads": 1})
        for statement in _LOCKDOWN:
            con.execute(statement)
        _json_local.con = con
    batch = pa.record_batch(arrays, names=[f"c{i}" for i in range(len(arrays))])
    members = ", ".join(f"${i + 1}, c{i}" for i in range(len(arrays)))
    con.register("batch", batch)
    try:
        text = con.sql(f"SELECT json_object({members}) FROM batch", params=names).to_arrow_table().column(0)
    finally:
        con.unregister("batch")
    return text.combine_chunks() if text.num_chunks != 1 else text.chunk(0)


HUGEINT_COLUMNS = b"rtindex.hugeint"  # schema metadata of DuckEngine.run(exact_sums=True): its HUGEINT columns


def _hugeint_as_bigint(relation: duckdb.DuckDBPyRelation) -> duckdb.DuckDBPyRelation:
    """DuckDB sums integers into 128-bit HUGEINTs, which Arrow carries as decimal128(38, 0):
    a Python Decimal per value, and an object column in pandas, where a user expects the
    ints a SUM of ints is. So HUGEINT columns come out as BIGINT; a value beyond 64 bits is
    a conversion error naming the column (CAST the sum to DOUBLE or DECIMAL(38, 0) to keep it)."""
    types = [str(t) for t in relation.types]
    if "HUGEINT" not in types:
        return relation
    quote = '"'
    return relation.project(", ".join(
        f"CAST(#{i} AS BIGINT) AS {quote}{name.replace(quote, quote * 2)}{quote}" if t == "HUGEINT" else f"#{i}"
        for i, (name, t) in enumerate(zip(relation.columns, types), 1)))


def _one_select(cursor: duckdb.DuckDBPyConnection, sql: str) -> duckdb.Statement:
    """The single statement of ``sql`` if it is a SELECT; parsing it executes nothing."""
    statements = cursor.extract_statements(sql)
    if len(statements) != 1:
        raise SqlError(f"expected exactly one SQL statement, got {len(statements)}", sql=sql)
    if statements[0].type != duckdb.StatementType.SELECT:
        raise SqlError(f"only SELECT can run, not {statements[0].type.name}", sql=sql)
    if "system" in sql.lower() and _builtin_calls(cursor, sql):
        raise SqlError("call functions by their name alone, not through the system catalog "
                       "(system.main.<name>): that would get around their size limits", sql=sql)
    return statements[0]


def _builtin_calls(cursor: duckdb.DuckDBPyConnection, sql: str) -> bool:
    """Whether ``sql`` names a function through the ``system`` catalog, which reaches the
    built-in behind a macro of _GUARDS (DuckDB's own parse tree says; the text could hold
    the word anywhere)."""
    tree = json.loads(cursor.execute("SELECT json_serialize_sql($1)", [sql]).fetchall()[0][0])
    nodes = [tree]
    while nodes:
        node = nodes.pop()
        if isinstance(node, dict):
            if node.get("class") == "FUNCTION" and "system" in (str(node.get("catalog")).lower(),
                                                                 str(node.get("schema")).lower()):
                return True
            nodes.extend(node.values())
        elif isinstance(node, list):
            nodes.extend(node)
    return False
