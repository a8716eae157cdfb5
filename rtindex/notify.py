"""Change signals from the writer process to its readers: each shard's published state (its
``signal`` file) and the database's wake-up word (``collections/.wake``). The compiled version
(rtindex/_ext/_notify.pyx) says how; rtindex/_py/notify.py is the same in Python."""

from __future__ import annotations

from rtindex._impl import HAVE_FUTEX, MAX_SEGMENTS, Signal, Wake, Watch

WAKE_FILE = ".wake"  # in the database's collections/ directory (not a collection name)

__all__ = ["HAVE_FUTEX", "MAX_SEGMENTS", "Signal", "WAKE_FILE", "Wake", "Watch"]
