"""Small JSON files written whole: atomically, fsync'ed, and read back checked."""

from __future__ import annotations

import builtins
import os

import orjson

from rtindex.errors import CorruptionError, StorageError


def write_json_atomic(path: str, obj: dict) -> None:
    """Write ``obj`` to ``path`` so that a crash leaves the old file or the new one, whole.

    The data is fsync'ed before the rename, and the directory after it, so the name that
    appears always points at complete contents.
    """
    tmp = path + ".tmp"
    try:
        with builtins.open(tmp, "wb") as f:
            f.write(orjson.dumps(obj))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as e:
        raise StorageError(f"cannot write {path}: {e}") from e


def read_json(path: str, what: str) -> dict:
    """A JSON object from ``path``; CorruptionError naming the file if it is not one."""
    try:
        with builtins.open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise StorageError(f"cannot read {what} {path}: {e}") from e
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise CorruptionError(f"{what} {path} is not valid JSON ({e}); restore it from a backup") from e
    if not isinstance(obj, dict):
        raise CorruptionError(f"{what} {path} holds {type(obj).__name__}, not a JSON object; "
                              "restore it from a backup")
    return obj
