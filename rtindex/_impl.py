"""Pick the compiled hot paths, or the pure-Python reference when asked to.

A silent fallback would hide a 10-100x slowdown, so a missing extension is an ImportError
with a build hint unless ``RTINDEX_PURE_PYTHON=1`` is set (the test suite runs both).

The commonest way to miss them is not a broken install but the source tree: after
``pip install .``, Python run from the checkout imports ``./rtindex`` (never compiled)
instead of the installed package. The hint says so, and names both copies.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder
from pathlib import Path

SOURCE_MARKERS = ("pyproject.toml", "setup.py")  # beside the package: a source checkout


def _other_copy(package: Path) -> Path | None:
    """Where ``import rtindex`` would find another rtindex, if ``package`` were not first
    on the path: the installed one that a source tree shadows (None if there is none)."""
    here = package.resolve()
    for finder in sys.meta_path:
        try:
            if finder is PathFinder:  # sys.path, without the directory holding this copy
                others = [p for p in sys.path if Path(p or os.curdir).resolve() != here.parent]
                spec = PathFinder.find_spec("rtindex", others)
            else:  # import hooks, such as the one an editable install adds
                find_spec = getattr(finder, "find_spec", None)
                spec = find_spec("rtindex", None) if find_spec is not None else None
        except Exception:  # noqa: BLE001 - a third-party hook's failure only costs the hint detail
            continue
        if spec is not None and spec.origin:
            found = Path(spec.origin).resolve().parent
            if found != here:
                return found
    return None


def missing_extensions_hint(package: Path) -> str:
    """Why the compiled extensions of the rtindex at ``package`` did not import, and what to do."""
    pure = "or set RTINDEX_PURE_PYTHON=1 for the slow reference code"
    root = package.resolve().parent
    if not any((root / marker).is_file() for marker in SOURCE_MARKERS):
        return (f"rtindex's compiled extensions are missing from {package}: reinstall with `pip install .` "
                f"(needs a C compiler), {pure}")
    installed = _other_copy(package)
    if installed is not None:
        return (f"you are importing the source tree at {package}, which shadows the installed rtindex at "
                f"{installed}: run from another directory, or `pip install -e .` in {root} to build the "
                f"source tree in place (needs a C compiler)")
    return (f"you are importing the source tree at {package}, whose compiled extensions are not built: "
            f"run `pip install -e .` in {root} (needs a C compiler), {pure}")


if os.environ.get("RTINDEX_PURE_PYTHON") == "1":
    from rtindex._py.blocks import (
        TermFilterBuilder,
        TermIndex,
        block_first_last,
        block_get,
        block_items,
        block_range,
        merge_blocks,
        terms_get,
    )
    from rtindex._py.gather import gather
    from rtindex._py.groups import factorize
    from rtindex._py.lru import RowCache, copy_json, untrack_json
    from rtindex._py.notify import HAVE_FUTEX, MAX_SEGMENTS, Signal, Wake, Watch
    from rtindex._py.point import PointLookup
    from rtindex._py.segment import (
        SegmentBuilder,
        identify_texts,
        member_span,
        nonfinite_path,
        scan_top,
        split_array,
        tail_rows,
        top_rewrite,
    )

    IMPLEMENTATION = "python"
else:
    try:
        from rtindex._ext._blocks import (
            TermFilterBuilder,
            TermIndex,
            block_first_last,
            block_get,
            block_items,
            block_range,
            merge_blocks,
            terms_get,
        )
        from rtindex._ext._gather import gather
        from rtindex._ext._groups import factorize
        from rtindex._ext._lru import RowCache, copy_json, untrack_json
        from rtindex._ext._notify import HAVE_FUTEX, MAX_SEGMENTS, Signal, Wake, Watch
        from rtindex._ext._point import PointLookup
        from rtindex._ext._segment import (
            SegmentBuilder,
            identify_texts,
            member_span,
            nonfinite_path,
            scan_top,
            split_array,
            tail_rows,
            top_rewrite,
        )
    except ImportError as e:  # pragma: no cover - depends on the build (tests/test_impl.py runs it)
        raise ImportError(missing_extensions_hint(Path(__file__).resolve().parent)) from e

    IMPLEMENTATION = "cython"

__all__ = [
    "HAVE_FUTEX",
    "IMPLEMENTATION",
    "MAX_SEGMENTS",
    "PointLookup",
    "RowCache",
    "SegmentBuilder",
    "Signal",
    "TermFilterBuilder",
    "TermIndex",
    "block_first_last",
    "block_get",
    "block_items",
    "block_range",
    "copy_json",
    "factorize",
    "gather",
    "identify_texts",
    "member_span",
    "merge_blocks",
    "nonfinite_path",
    "scan_top",
    "split_array",
    "tail_rows",
    "terms_get",
    "top_rewrite",
    "untrack_json",
    "Wake",
    "Watch",
]
