"""Node-local reads: a shard group whose directory is on the coordinator's own machine is
read in the coordinator's process, by the query actor's class (GroupReader) called without
Ray, as a query process reads what the ingest process indexed on one machine. A Ray call
costs a round trip through the raylets; a call of an object in this process costs none.

The group's writer stays an actor on its node. A move (ClusterCollection.move) marks the
old directory first (MOVING_MARK), so a coordinator reading it here notices, asks the
catalog where the group went, and reads from there: until its files are removed the old
directory answers as its query actors still do.
"""

from __future__ import annotations

import os
from typing import Any

from rtindex.cluster.groups import MOVING_MARK, GroupReader


class Answered:
    """What a call of a local reader gave, where a Ray call would give an object ref;
    ``moved``: the call failed with the directory leaving (run it where the group went)."""

    __slots__ = ("value", "error", "moved")

    def __init__(self, value: Any = None, error: BaseException | None = None, moved: bool = False):
        self.value, self.error, self.moved = value, error, moved


class LocalReader:
    """A group's reader in this process (``path``: its directory, on this machine)."""

    def __init__(self, path: str, collection: str, options: dict):
        self.path = path
        self.reader = GroupReader(path, collection, options)

    def ask(self, method: str, *args: Any) -> Answered:
        """``method(*args)`` of the reader; a snapshot's documents come as copies (a query
        actor's come pickled), so no caller ever holds the reader's cached objects."""
        if method == "call" and args[1] == "fetch":
            args = (*args[:3], {**args[3], "copy": True})
        try:
            return Answered(getattr(self.reader, method)(*args))
        except Exception as e:  # noqa: BLE001 - handed to the caller, as a Ray call's error is
            return Answered(error=e, moved=self.leaving())

    def leaving(self) -> bool:
        """True once a move of the group marked this directory (or removed it)."""
        return not os.path.isdir(self.path) or os.path.exists(os.path.join(self.path, MOVING_MARK))

    def close(self) -> None:
        self.reader.close()
