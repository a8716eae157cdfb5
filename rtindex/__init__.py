"""rtindex: a real-time indexing database for semi-structured JSON.

>>> import rtindex
>>> db = rtindex.open(path)                      # doctest: +SKIP
>>> db = rtindex.connect(url, api_key=key)       # doctest: +SKIP
>>> db = rtindex.open_cluster("auto")           # doctest: +SKIP
"""

from rtindex.client import connect
from rtindex.cluster import open_cluster
from rtindex.collection import Collection, IngestStats
from rtindex.database import Database, open
from rtindex.documents import ItemError, documents_of
from rtindex.errors import (
    AccessDeniedError,
    AlreadyExistsError,
    ClosedError,
    CorruptionError,
    FenceError,
    LockedError,
    IngestError,
    IngestWarning,
    InvalidArgumentError,
    NotADatabaseError,
    ReadOnlyError,
    NotFoundError,
    OverloadedError,
    QueryTimeoutError,
    ResultTooLargeError,
    RtindexError,
    SchemaError,
    SqlError,
    StorageError,
    UnavailableError,
    UnsupportedSqlError,
)
from rtindex.sql.result import Result
from rtindex.snapshot import Postings, Snapshot
from rtindex.sources import KafkaSource

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "AlreadyExistsError",
    "ClosedError",
    "Collection",
    "CorruptionError",
    "Database",
    "FenceError",
    "IngestError",
    "IngestStats",
    "IngestWarning",
    "InvalidArgumentError",
    "ItemError",
    "KafkaSource",
    "LockedError",
    "NotADatabaseError",
    "ReadOnlyError",
    "NotFoundError",
    "OverloadedError",
    "QueryTimeoutError",
    "Postings",
    "Result",
    "ResultTooLargeError",
    "RtindexError",
    "SchemaError",
    "Snapshot",
    "SqlError",
    "StorageError",
    "UnavailableError",
    "UnsupportedSqlError",
    "documents_of",
    "connect",
    "open",
    "open_cluster",
]
