"""The reference documents every public name and every public method."""

from __future__ import annotations

import inspect
import pathlib

import rtindex

REFERENCE = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "reference.md").read_text()


def test_every_public_name_is_documented():
    missing = [name for name in rtindex.__all__ if f"`{name}`" not in REFERENCE]
    assert not missing, f"add these to docs/reference.md: {missing}"


def test_every_public_method_is_documented():
    missing = []
    for cls in (rtindex.Database, rtindex.Collection, rtindex.Snapshot, rtindex.Postings, rtindex.Result):
        for name, member in inspect.getmembers(cls):
            if name.startswith("_") or not callable(member):
                continue
            if f"{cls.__name__}.{name}" not in REFERENCE:
                missing.append(f"{cls.__name__}.{name}")
    assert not missing, f"add these to docs/reference.md: {missing}"


def test_public_methods_have_docstrings():
    missing = [f"{cls.__name__}.{n}" for cls in (rtindex.Database, rtindex.Collection, rtindex.Snapshot, rtindex.Result)
               for n, m in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_") and not m.__doc__]
    assert not missing, f"write docstrings for: {missing}"
