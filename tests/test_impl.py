"""The compiled extensions are what rtindex runs, unless RTINDEX_PURE_PYTHON=1 asks otherwise."""

from __future__ import annotations

import os

from rtindex import _impl


def test_implementation():
    if os.environ.get("RTINDEX_PURE_PYTHON") == "1":
        assert _impl.IMPLEMENTATION == "python"
        assert _impl.SegmentBuilder.__module__ == "rtindex._py.segment"
    else:
        assert _impl.IMPLEMENTATION == "cython"
        assert _impl.SegmentBuilder.__module__ == "rtindex._ext._segment"
