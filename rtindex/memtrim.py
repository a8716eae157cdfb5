"""Freed memory handed back to the operating system after a seal or a merge.

A seal frees a whole in-memory segment (tens of MB of C buffers and the strs its terms
kept) and a merge the decoded columns of its inputs, but glibc's allocator keeps freed
heap pages for reuse, so the process's RSS stays at its high-water mark. ``malloc_trim``
returns the free pages, a sizeable share of the RSS while streaming events (measured:
docs/benchmarks.md, "Bounded memory"). Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

try:
    _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or None).malloc_trim
    _malloc_trim.argtypes = [ctypes.c_size_t]
    _malloc_trim.restype = ctypes.c_int
except (OSError, AttributeError):  # not glibc
    _malloc_trim = None


def release_free_memory() -> None:
    """Return the allocator's free pages to the OS (a few ms; the GIL is released)."""
    if _malloc_trim is not None:
        _malloc_trim(0)
