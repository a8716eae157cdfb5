"""Pick the compiled hot paths, or the pure-Python reference when asked to.

A silent fallback would hide a 10-100x slowdown, so a missing extension is an ImportError
with a build hint unless ``RTINDEX_PURE_PYTHON=1`` is set (the test suite runs both).
"""

from __future__ import annotations

import os

if os.environ.get("RTINDEX_PURE_PYTHON") == "1":
    from rtindex._py.blocks import block_get, block_range, merge_blocks
    from rtindex._py.lru import RowCache, copy_json, untrack_json
    from rtindex._py.segment import SegmentBuilder

    IMPLEMENTATION = "python"
else:
    try:
        from rtindex._ext._blocks import block_get, block_range, merge_blocks
        from rtindex._ext._lru import RowCache, copy_json, untrack_json
        from rtindex._ext._segment import SegmentBuilder
    except ImportError as e:  # pragma: no cover - depends on the build
        raise ImportError(
            "rtindex's compiled extensions are missing: reinstall with `pip install .` "
            "(needs a C compiler), or set RTINDEX_PURE_PYTHON=1 for the slow reference code"
        ) from e

    IMPLEMENTATION = "cython"

__all__ = [
    "IMPLEMENTATION",
    "RowCache",
    "SegmentBuilder",
    "block_get",
    "block_range",
    "copy_json",
    "merge_blocks",
    "untrack_json",
]
