"""The whole rtindex exception hierarchy, nothing else.

Errors that mean a builtin (a missing key, a bad value) also inherit that builtin, so
``except KeyError`` and ``except ValueError`` keep working for callers who don't know us.
"""

from __future__ import annotations


class RtindexError(Exception):
    """Base class of every error rtindex raises."""


class StorageError(RtindexError):
    """RocksDB failed underneath us (I/O error, lock held by another process, ...)."""


class LockedError(StorageError):
    """Another process (or another Database in this one) is the database's writer: one writer
    at a time. ``pid`` is the holder's, when known. Read beside it with ``role="reader"``."""

    def __init__(self, message: str, pid: int | None = None):
        super().__init__(message)
        self.pid = pid


class CorruptionError(StorageError):
    """On-disk data does not decode: a bug or a damaged disk; restore from a backup."""


class NotADatabaseError(RtindexError, ValueError):
    """A path that is not an rtindex database this version can open.

    Raised instead of writing into a folder that holds something else (a file, a project,
    a database of a newer format), so that opening the wrong path never changes it.
    """


class InvalidArgumentError(RtindexError, ValueError):
    """An argument rtindex refuses: a collection name, a number of shards, an option of
    ``open()``, a time limit, a format. The message says what to give instead."""


class ReadOnlyError(RtindexError):
    """A write through a database opened with ``role="reader"``: write through the writer."""


class ClosedError(RtindexError):
    """A database, collection or snapshot was used after close()."""


class NotFoundError(RtindexError, KeyError):
    """A collection (or document) that does not exist."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class AccessDeniedError(RtindexError, PermissionError):
    """The service refused the API key (missing, revoked, or its role does not allow the
    request): 401 and 403 replies to ``rtindex.connect`` clients."""


class AlreadyExistsError(RtindexError, ValueError):
    """create_collection() on a name that is taken."""


class FenceError(RtindexError, ValueError):
    """A write fence string that no rtindex writer made (see rtindex/fence.py)."""


class SchemaError(RtindexError, ValueError):
    """A document that cannot be stored; ``path`` says where, like ``$.a[3].b``."""

    def __init__(self, message: str, path: str = "$", doc_index: int | None = None):
        self.path = path
        self.doc_index = doc_index
        where = f"document {doc_index}, " if doc_index is not None else ""
        super().__init__(f"{message} (at {where}{path})")
        self.message = message


class OverloadedError(RtindexError):
    """Too much work queued; retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0):
        super().__init__(message)
        self.retry_after = retry_after


class UnavailableError(RtindexError):
    """Shards of a collection on a cluster that cannot be reached now (their node is gone,
    or their actor did not come back in time); ``shards`` lists them. Nothing was answered
    from the others: a query never returns part of an answer."""

    def __init__(self, message: str, shards: list[int], moved: bool = False):
        super().__init__(message)
        self.shards = shards
        self.moved = moved  # the shards moved to another node: the same call may succeed at once


class SqlError(RtindexError, ValueError):
    """A SQL text that cannot run: bad syntax, an unknown collection, a type error.

    ``sql`` is the text; ``position`` is the 0-based character offset of the offending
    construct when known (else None), so a caller can point at it.
    """

    def __init__(self, message: str, sql: str | None = None, position: int | None = None):
        self.sql = sql
        self.position = position
        self.message = message
        where = ""
        if sql is not None and position is not None:
            line = sql.count("\n", 0, position) + 1
            col = position - (sql.rfind("\n", 0, position) + 1) + 1
            where = f" (line {line}, column {col})"
        super().__init__(message + where)


class QueryTimeoutError(RtindexError, TimeoutError):
    """A query ran past its ``timeout_ms`` and was stopped (embedded: its DuckDB work is
    interrupted and freed; served: the server answered 408), or no reply came within a
    client's ``timeout``."""


class UnsupportedSqlError(SqlError):
    """Valid SQL that rtindex does not run (yet): the message names the construct."""


class ResultTooLargeError(SqlError):
    """A result bigger than ``max_result_bytes`` (an option of ``rtindex.open``), refused
    before it is built: ``rows()``, ``arrow()`` and ``df()`` raise it, ``arrow_reader()``
    streams the result instead. ``rows`` and ``size_bytes`` say how big it was going to be
    (``estimated``: from a sample of its rows, else measured), ``max_result_bytes`` the budget.
    """

    def __init__(self, rows: int, size_bytes: int, max_result_bytes: int, *, estimated: bool,
                 sql: str | None = None):
        self.rows = rows
        self.size_bytes = size_bytes
        self.max_result_bytes = max_result_bytes
        self.estimated = estimated
        how = "about " if estimated else ""
        super().__init__(
            f"the result is {rows:,} rows, {how}{_size(size_bytes)}, over max_result_bytes={_size(max_result_bytes)}: "
            "add a LIMIT, select fewer fields or aggregate; read it in batches with Result.arrow_reader(); "
            "or raise max_result_bytes in rtindex.open (None: no limit)", sql)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


class IngestError(RtindexError, ValueError):
    """Documents of an ``ingest()`` call were not stored: raised with ``errors="raise"``
    when any failed, and whatever ``errors`` says (but ``"report"``) when all of them did.

    The good documents of the call are stored all the same; ``stats`` is the call's
    ``IngestStats`` (``stats.errors`` lists every failure, ``stats.ids`` what was stored).
    """

    def __init__(self, message: str, stats: object):
        super().__init__(message)
        self.stats = stats


class IngestWarning(UserWarning):
    """Some documents of an ``ingest()`` call were not stored (the default ``errors="warn"``);
    the others were. Pass ``errors="report"`` to read ``stats.errors`` without a warning."""
