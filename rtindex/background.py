"""Background workers: sealing and merging run beside ingest, never inside an ingest call.

One thread per kind of work for the whole database (two cores: more threads would only
fight over the GIL). A task that fails records its exception on the worker; the shard that
owns the task re-raises it on its next write so errors are never silently lost.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

log = logging.getLogger("rtindex")


class Worker:
    """A daemon thread running submitted callables in order."""

    def __init__(self, name: str):
        self.name = name
        self._q: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._idle = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name=f"rtindex-{name}", daemon=True)
        self._thread.start()

    def submit(self, task: Callable[[], None]) -> None:
        with self._idle:
            self._pending += 1
        self._q.put(task)

    def _run(self) -> None:
        while True:
            task = self._q.get()
            if task is None:
                return
            try:
                task()
            except BaseException:  # the task records its own error; never kill the worker
                log.exception("rtindex background task failed in %s", self.name)
            finally:
                task = None  # don't pin the task's objects (and their clean-up) while idle
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every submitted task has finished."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def stop(self) -> None:
        self._q.put(None)
        self._thread.join()
