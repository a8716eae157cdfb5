"""DuckDB behind a sandbox: the only module of rtindex that imports duckdb.

The SQL layer hands us a generated SELECT over Arrow tables it has already built; DuckDB
only does the relational work (GROUP BY, ORDER BY, aggregates, expressions). User input
reaches this text only through the whitelist upstream and bound parameters, but the
engine is locked down anyway, so that a hole upstream still cannot read or write files,
reach the network, load extensions, attach databases or change settings.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import duckdb
import pyarrow as pa

from rtindex.errors import ClosedError, SqlError

CHECKED_STATEMENTS = 1024  # parsed-and-checked statements kept, by SQL text

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
        for statement in _LOCKDOWN:
            self._con.execute(statement)
        # Guards _con, _running and _checked; close() waits on it for in-flight runs to stop.
        self._cond = threading.Condition()
        self._running: set[duckdb.DuckDBPyConnection] = set()
        # SQL text -> its one checked SELECT statement: the SQL layer runs the same few texts
        # over and over, and parsing one again costs as much as a small query's execution
        self._checked: OrderedDict[str, duckdb.Statement] = OrderedDict()

    def run(self, sql: str, tables: Mapping[str, pa.Table], params: Mapping[str, Any] | None = None) -> pa.Table:
        """Run one SELECT over the given Arrow tables (registered under those names for this call only) with named parameters ($name in the text) and return the result as a pyarrow Table."""
        with self._cond:
            if self._con is None:
                raise ClosedError("the SQL engine is closed")
            # A cursor is a connection of its own to the same database (and config):
            # safe to use from this thread while others use theirs, and the views
            # register() makes are temporary to it, so names never meet across calls.
            cursor = self._con.cursor()
            self._running.add(cursor)
        try:
            statement = self._statement(cursor, sql)
            for name, table in tables.items():
                cursor.register(name, table)  # a view over memory: no external access needed
            # sql() on the checked statement runs exactly what was checked, and its
            # relation hands Arrow over without the copy a DB-API result makes.
            return cursor.sql(statement, params=None if params is None else dict(params)).to_arrow_table()
        except duckdb.Error as e:
            if self._con is None:  # close() interrupted us
                raise ClosedError("the SQL engine was closed while the query ran") from e
            # DuckDB's first line says what is wrong; the rest is the text echoed with
            # a caret or tuning advice (SET threads=...) that does not apply here.
            raise SqlError(str(e).partition("\n")[0] or type(e).__name__, sql=sql) from e
        finally:
            with self._cond:  # so close() never interrupts a closed cursor (that raises)
                cursor.close()  # drops the registered views with it
                self._running.discard(cursor)
                self._cond.notify_all()

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
            # DuckDB refuses to close a connection whose cursors are busy. An interrupt
            # that comes before a query starts is lost, hence again until all are out.
            while self._running:
                for cursor in self._running:
                    cursor.interrupt()
                self._cond.wait(0.01)
        con.close()


def _one_select(cursor: duckdb.DuckDBPyConnection, sql: str) -> duckdb.Statement:
    """The single statement of ``sql`` if it is a SELECT; parsing it executes nothing."""
    statements = cursor.extract_statements(sql)
    if len(statements) != 1:
        raise SqlError(f"expected exactly one SQL statement, got {len(statements)}", sql=sql)
    if statements[0].type != duckdb.StatementType.SELECT:
        raise SqlError(f"only SELECT can run, not {statements[0].type.name}", sql=sql)
    return statements[0]
