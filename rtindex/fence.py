"""Write fences: read-your-writes across processes.

A fence is a short string a writer hands out after a write (``IngestStats.fence``,
``Collection.fence()``); a reader process given it can tell whether it already sees that
write (``Database.caught_up``) or wait until it does (``Database.wait_for``).

It lists, for one collection, each shard's change counter (rtindex/notify.py) after the
write: a reader shard that applied a counter at least that high sees the write, because
the writer bumps the counter only after a write is durable and published, and a reader
records the counter it read *before* catching up. The collection's creation stamp is part
of the fence, so a fence of a dropped collection is not mistaken for one of a newer
collection of the same name.

Format: ``<collection>/<creation stamp>/<counter>.<counter>...`` (one counter per shard).
"""

from __future__ import annotations

from dataclasses import dataclass

from rtindex.errors import FenceError


@dataclass(frozen=True)
class Fence:
    collection: str
    created: int
    counters: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.collection}/{self.created}/{'.'.join(map(str, self.counters))}"

    @classmethod
    def parse(cls, text: str) -> "Fence":
        try:
            name, created, counters = text.split("/")
            fence = cls(name, int(created), tuple(int(c) for c in counters.split(".")))
        except (AttributeError, ValueError):
            raise FenceError(f"not a write fence: {text!r} (use the fence a write returned)") from None
        if not name or not fence.counters or min(fence.counters) < 0 or fence.created < 0:
            raise FenceError(f"not a write fence: {text!r} (use the fence a write returned)")
        return fence
