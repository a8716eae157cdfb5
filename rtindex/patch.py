"""RFC 6902 JSON Patch for Collection.patch, with errors that name the path.

jsonpatch applies the operations; when one fails, its message is not shown, because it can
embed the whole document ("member 'q' not found in {...}": megabytes, and data the caller
may not want in a log). Instead the failed operation is looked at here, against the document
as the operations before it left it, and the message names the operation and the path.
"""

from __future__ import annotations

from typing import Any

import jsonpatch
from jsonpointer import JsonPointer, JsonPointerException

from rtindex.errors import SchemaError
from rtindex.rowcache import copy_json

_MISSING = object()


def apply_patch(doc: dict, ops: Any) -> Any:
    """``doc`` with the operations ``ops`` applied (``doc`` itself is left as it was);
    SchemaError naming the operation (its index, op and path) and what is wrong."""
    if not isinstance(ops, list):
        raise SchemaError(f"a JSON Patch is a list of operations, not {type(ops).__name__}")
    new = copy_json(doc)
    for i, op in enumerate(ops):
        if not isinstance(op, dict):
            raise SchemaError(f"patch operation {i} is {type(op).__name__}, not an object like "
                              '{"op": "replace", "path": "/a", "value": 1}')
        try:
            new = jsonpatch.apply_patch(new, [op], in_place=True)
        except jsonpatch.InvalidJsonPatch as e:  # names the operation's own fields only
            raise SchemaError(f"patch operation {i}: {e}") from None
        except (jsonpatch.JsonPatchException, JsonPointerException, TypeError, ValueError, KeyError, IndexError):
            # not chained: jsonpatch's message may hold the whole document
            what = f"patch operation {i} ({op.get('op')} {op.get('path')})"
            raise SchemaError(f"{what}: {_why(new, op)}", _json_path(op.get("path"))) from None
    return new


def _why(doc: Any, op: dict) -> str:
    """Why ``op`` cannot apply to ``doc``, in terms of its paths."""
    kind, path = op.get("op"), op.get("path")
    try:
        if kind in ("move", "copy"):
            problem = _lookup(doc, op.get("from"))
            if problem is not None:
                return f"from: {problem}"
        if kind in ("remove", "replace", "test"):
            problem = _lookup(doc, path)
            if problem is not None:
                return problem
            if kind == "test":
                return f"the value at {path} is not the tested value"
            return f"cannot {kind} {path}"
        parts = JsonPointer(path).parts
        if not parts:
            return "cannot apply it to the whole document"
        parent = JsonPointer.from_parts(parts[:-1]).path
        problem = _lookup(doc, parent)
        if problem is not None:
            return f"{problem}, so {path} cannot be added"
        target = JsonPointer(parent).resolve(doc)
        if isinstance(target, list):
            return f"{parts[-1]!r} is not an index of the array at {parent or '/'} (0 to {len(target)}, or -)"
        if not isinstance(target, dict):
            return f"path {path} goes through {parent}, which holds {_kind(target)}, not an object or array"
        return f"cannot add {path}"
    except JsonPointerException:
        return "a path is a JSON Pointer: empty, or starting with / (like /a/0/b)"


def _lookup(doc: Any, pointer: Any) -> str | None:
    """Why ``pointer`` names no value in ``doc``; None when it does."""
    if not isinstance(pointer, str):
        return f"the path must be a string, not {type(pointer).__name__}"
    parts = JsonPointer(pointer).parts
    node = doc
    for depth, part in enumerate(parts):
        here = JsonPointer.from_parts(parts[:depth + 1]).path
        if isinstance(node, dict):
            if part not in node:
                return f"path {here} does not exist in the document"
            node = node[part]
        elif isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                return f"path {here} does not exist in the document (an array of {len(node)} items)"
            node = node[int(part)]
        else:
            above = JsonPointer.from_parts(parts[:depth]).path
            return f"path {pointer} goes through {above}, which holds {_kind(node)}, not an object or array"
    return None


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    return "a string" if isinstance(v, str) else type(v).__name__


def _json_path(pointer: Any) -> str:
    """``$.a[0].b`` for the JSON Pointer ``/a/0/b`` (SchemaError.path's notation)."""
    try:
        parts = JsonPointer(pointer).parts if isinstance(pointer, str) else []
    except JsonPointerException:
        parts = []
    return "$" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in parts)
