import rtindex


def test_public_names_are_pinned():
    assert sorted(rtindex.__all__) == [
        "AccessDeniedError", "AlreadyExistsError", "ClosedError", "Collection", "CorruptionError", "Database", "FenceError", "IngestStats",
        "ItemError", "NotADatabaseError", "NotFoundError", "OverloadedError", "Postings", "ReadOnlyError", "Result", "RtindexError", "SchemaError",
        "Snapshot", "SqlError", "StorageError", "UnsupportedSqlError", "connect", "open",
    ]
    for name in rtindex.__all__:
        assert getattr(rtindex, name) is not None


def test_errors_inherit_the_builtins_they_mean():
    assert issubclass(rtindex.NotFoundError, KeyError)
    assert issubclass(rtindex.SchemaError, ValueError)
    assert issubclass(rtindex.SqlError, ValueError)
    assert issubclass(rtindex.UnsupportedSqlError, rtindex.SqlError)
    assert issubclass(rtindex.CorruptionError, rtindex.StorageError)
    assert issubclass(rtindex.AccessDeniedError, PermissionError)
    for name in ("StorageError", "ClosedError", "NotFoundError", "SchemaError", "OverloadedError",
                 "AccessDeniedError"):
        assert issubclass(getattr(rtindex, name), rtindex.RtindexError)
