import inspect

import rtindex


def test_public_names_are_pinned():
    assert sorted(rtindex.__all__) == [
        "AccessDeniedError", "AlreadyExistsError", "ClosedError", "Collection", "CorruptionError", "Database", "FenceError", "IngestError", "IngestStats",
        "IngestWarning", "InvalidArgumentError", "ItemError", "KafkaSource", "LockedError", "NotADatabaseError", "NotFoundError", "OverloadedError", "Postings", "QueryTimeoutError", "ReadOnlyError", "Result", "ResultTooLargeError", "RtindexError", "SchemaError",
        "Snapshot", "SqlError", "StorageError", "UnavailableError", "UnsupportedSqlError", "connect", "documents_of",
        "open", "open_cluster",
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
    assert issubclass(rtindex.IngestError, ValueError) and issubclass(rtindex.IngestWarning, UserWarning)
    assert issubclass(rtindex.InvalidArgumentError, ValueError)
    for name in ("StorageError", "ClosedError", "NotFoundError", "SchemaError", "OverloadedError",
                 "AccessDeniedError", "IngestError"):
        assert issubclass(getattr(rtindex, name), rtindex.RtindexError)


def _public_callables():
    """Every public function, class and method a user reaches from ``import rtindex``: the
    exported names, and the types its calls hand back (``connect`` -> RemoteDatabase ->
    RemoteCollection, ``Database.explain`` -> Plan)."""
    from rtindex.client import RemoteCollection, RemoteDatabase
    from rtindex.sql.plan import Plan

    tops = {name: getattr(rtindex, name) for name in rtindex.__all__}
    tops.update(RemoteDatabase=RemoteDatabase, RemoteCollection=RemoteCollection, Plan=Plan)
    for name, obj in tops.items():
        yield name, obj
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for attr, member in inspect.getmembers(obj):
                if attr.startswith("_"):
                    continue
                static = inspect.getattr_static(obj, attr)
                if isinstance(static, property) or callable(member):
                    yield f"{name}.{attr}", static.fget if isinstance(static, property) else member


def test_public_callables_have_real_signatures_and_docstrings():
    """What help() and an editor show: named parameters, not ``**kwargs``, and a docstring.

    Exceptions are left out of the signature check: like the builtins they extend, they take
    a message (those with fields of their own, such as ``SqlError``, name them)."""
    catch_alls, undocumented = [], []
    for name, obj in _public_callables():
        if not inspect.getdoc(obj):
            undocumented.append(name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            continue
        params = inspect.signature(obj).parameters.values()
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            catch_alls.append(f"{name}{inspect.signature(obj)}")
    assert not catch_alls, f"name the parameters of: {catch_alls}"
    assert not undocumented, f"write docstrings for: {undocumented}"


def test_the_check_sees_public_methods_and_properties():
    names = dict(_public_callables())
    for name in ("connect", "open", "Database.sql", "Database.closed", "Collection.ingest", "Snapshot.term",
                 "Result.columns", "Postings.row_ids", "RemoteDatabase.sql", "RemoteCollection.ingest"):
        assert name in names, name
