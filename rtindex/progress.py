"""Feedback on long ingests: a progress bar where someone can see it, and Ctrl-C that lands
between batches, so that an interrupted ingest knows exactly what it stored.

The bar is tqdm's: widgets in a Jupyter kernel that has ipywidgets (``tqdm.auto``), text on
stderr anywhere else. By default (``progress=None``) it is shown only when stderr is a
terminal or the code runs in a notebook kernel, and only once the work has taken
:data:`DELAY` seconds, so short calls and scripts whose output is piped stay quiet: the bar
is not even made before then (a notebook saves every widget made, shown or not). In a
notebook the bar is removed when the work is done, so the saved notebook does not keep it.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

DELAY = 2.0  # seconds before a bar is made when progress=None


def in_notebook() -> bool:
    """Whether this runs in a Jupyter (IPython) kernel."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


def _someone_watches() -> bool:
    stderr = sys.stderr
    try:
        return in_notebook() or (stderr is not None and stderr.isatty())
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False


class Progress:
    """A bar over documents (unit ``"docs"``, total: the input's length when known) or over
    bytes of a file (unit ``"B"``, total: its size); after the bar, the other rate (MB/s of
    JSON stored, or documents/s) and the count of failed documents."""

    def __init__(self, setting: bool | None, total: int | None, unit: str, desc: str):
        self.unit = unit
        self.bar = None
        self.docs = self.bytes = self.done = 0  # done: the bar's count (documents, or bytes of the file)
        self.t0 = time.perf_counter()
        self._make = None  # makes the bar, once it is to be shown
        self.delay = DELAY if setting is None else 0.0
        show = _someone_watches() if setting is None else bool(setting)
        if not show:
            return
        notebook = in_notebook()
        if notebook and importlib.util.find_spec("ipywidgets") is not None:
            from tqdm.auto import tqdm
        else:  # without ipywidgets tqdm.auto would warn and draw text anyway
            from tqdm.std import tqdm

        def make(initial: int):
            return tqdm(total=total, desc=desc, unit=" docs" if unit == "docs" else unit, unit_scale=True,
                        unit_divisor=1024 if unit == "B" else 1000, initial=initial, leave=not notebook)
        self._make = make
        if not self.delay:
            self.bar = make(0)

    def update(self, docs: int, nbytes: int, errors: int, position: int | None = None) -> None:
        """After a batch: ``docs`` read, ``nbytes`` of JSON stored, ``errors`` so far,
        ``position`` in the file (unit "B")."""
        if self._make is None:
            return
        self.docs += docs
        self.bytes += nbytes
        done = self.docs if self.unit == "docs" else (position or 0)
        bar = self.bar
        if bar is None:  # made once the work has taken the delay
            if time.perf_counter() - self.t0 < self.delay:
                self.done = done
                return
            bar = self.bar = self._make(self.done)
        step = done - bar.n
        if bar.total is not None and bar.n + step > bar.total:
            bar.total = bar.n + step  # an input longer than it said: tqdm would warn
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        rate = (f"{self.bytes / elapsed / 1e6:.1f} MB/s" if self.unit == "docs"
                else f"{self.docs:,} docs, {self.docs / elapsed:,.0f} docs/s")
        bar.set_postfix_str(rate + (f", {errors:,} failed" if errors else ""), refresh=False)
        bar.update(step)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class CtrlC:
    """Ctrl-C during an ingest (``with CtrlC() as ctrl_c:``): raised at once between
    batches, held back while a batch is written (``with ctrl_c.batch():``) and raised when
    it is done. A batch is then stored in every shard and counted, or not begun: never
    half-written with the writer's bookkeeping cut short.

    A KeyboardInterrupt raised by a signal handler can land in a finalizer (a ``__del__``
    that the GC ran), where Python prints it and drops it; an endless input would then go
    on forever. So a press is also remembered, and the end of the next batch raises it.
    Only the main thread gets signals; with a SIGINT handler other than Python's own,
    nothing is changed.
    """

    def __init__(self) -> None:
        self.pressed = False
        self._writing = False
        self._installed = False

    def __enter__(self) -> "CtrlC":
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def _on_sigint(self, signum: int, frame: object) -> None:
        self.pressed = True
        if not self._writing:
            raise KeyboardInterrupt

    @contextmanager
    def batch(self) -> Iterator[None]:
        self._writing = True
        try:
            yield
        finally:
            self._writing = False
        if self.pressed:
            raise KeyboardInterrupt
