"""The whole rtindex exception hierarchy, nothing else.

Errors that mean a builtin (a missing key, a bad value) also inherit that builtin, so
``except KeyError`` and ``except ValueError`` keep working for callers who don't know us.
"""

from __future__ import annotations


class RtindexError(Exception):
    """Base class of every error rtindex raises."""


class StorageError(RtindexError):
    """RocksDB failed underneath us (I/O error, lock held by another process, ...)."""


class CorruptionError(StorageError):
    """On-disk data does not decode: a bug or a damaged disk; restore from a backup."""


class NotADatabaseError(RtindexError, ValueError):
    """A path that is not an rtindex database this version can open.

    Raised instead of writing into a folder that holds something else (a file, a project,
    a database of a newer format), so that opening the wrong path never changes it.
    """


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


class UnsupportedSqlError(SqlError):
    """Valid SQL that rtindex does not run (yet): the message names the construct."""
