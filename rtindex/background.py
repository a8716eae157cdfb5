"""Background workers: sealing and merging run beside ingest, never inside an ingest call.

One thread per kind of work for the whole database (two cores: more threads would only
fight over the GIL). A task may be submitted with a delay: failed work is retried with
backoff, and the clean-up of dropped segments waits out the readers' grace period. A task
that fails records its own error (the shard that owns it reports it); the worker only logs.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Callable

log = logging.getLogger("rtindex")


class Worker:
    """A daemon thread running submitted callables: in order of due time, then submission."""

    def __init__(self, name: str):
        self.name = name
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None], bool]] = []
        self._seq = itertools.count()
        self._running = 0  # tasks taken off the heap and not finished
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"rtindex-{name}", daemon=True)
        self._thread.start()

    def submit(self, task: Callable[[], None], delay: float = 0.0, *, retry: bool = False) -> None:
        """Run ``task`` on the worker thread, not before ``delay`` seconds from now. A
        ``retry`` (of failed work) may be brought forward by :meth:`hurry`."""
        with self._cv:
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._seq), task, retry))
            self._cv.notify_all()

    def hurry(self) -> None:
        """Make every waiting retry due now (someone waits for the work: try it again at once)."""
        with self._cv:
            now = time.monotonic()
            self._heap = [(now if r else due, seq, task, r) for due, seq, task, r in self._heap]
            heapq.heapify(self._heap)
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._stopping:
                        return
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        task = heapq.heappop(self._heap)[2]
                        self._running += 1
                        break
                    self._cv.wait(self._heap[0][0] - now if self._heap else None)
            try:
                task()
            except BaseException:  # the task records its own error; never kill the worker
                log.exception("rtindex background task failed in %s", self.name)
            finally:
                task = None  # don't pin the task's objects (and their clean-up) while idle
                with self._cv:
                    self._running -= 1
                    self._cv.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no task is running and none is due (tasks delayed into the future,
        like a retry after a failure, are not waited for)."""
        def idle() -> bool:
            return self._running == 0 and not (self._heap and self._heap[0][0] <= time.monotonic())

        with self._cv:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not idle():
                wait = None
                if self._heap and self._running == 0:
                    wait = max(self._heap[0][0] - time.monotonic(), 0.001)
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    wait = left if wait is None else min(wait, left)
                self._cv.wait(wait)
            return True

    def stop(self) -> None:
        """Finish the running task, drop the queued ones (their work is redone at the next
        open: unsealed rows are re-indexed from the row store, garbage found again)."""
        with self._cv:
            self._stopping = True
            self._heap.clear()
            self._cv.notify_all()
        self._thread.join()
