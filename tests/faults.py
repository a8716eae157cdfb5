"""Fault injection for rtindex's storage layer (a test helper, not a test module).

:func:`inject` monkeypatches every public function and every public method of every public
class of the storage modules, found with :mod:`inspect` when it is entered (so it follows the
engine while its internals move), counts the calls made through them, from every thread
together, and makes the k-th one raise::

    with inject(at=7) as fault:           # the 7th storage call raises
        coll.ingest(docs)
    fault.fired                           # [Call(k=7, name='Store.write', thread='MainThread')]

    with inject() as dry:                 # a dry run: nothing fails, every call is recorded
        scenario()
    len(dry.calls), [c.name for c in dry.calls]      # "a fault at every storage call": k = 1..len

    with inject(at=7, sticky=True) as fault:          # a disk that stays full: call 7 and every
        ...                                           # later one fail ...
        fault.clear()                                 # ... until space is freed

A transient fault (the default) fires once, at call ``at``: it is cleared as soon as it fires.

Targets (``targets=``): modules, classes, or module names; a module name that cannot be
imported because the module does not exist is skipped (``rtindex.segfile`` appears during
the rewrite). Default: ``rtindex.storage`` (the one importer of rocksdict: ``Store``,
``Batch``, its functions) and ``rtindex.segfile`` (segment files). For a module, its own
public functions and the public methods (plain, static, class) of its own public classes are
patched; properties, dunder and ``_private`` names are not. A function that another
``rtindex`` module imported by name (``from rtindex.segfile import write_segment``) is
patched there too, and a call from one patched function to another counts as a call of its
own (both are places where the storage can fail).

Errors (``error=``): by default ``StorageError("injected fault at <call>")`` for the storage
module and ``OSError(ENOSPC, "No space left on device (injected at <call>)")`` for
``segfile`` (it does file I/O itself, so an OS error is what it would see). ``error`` may be
an exception instance (a copy is raised each time), an exception class, or a callable
``error(call) -> BaseException``.

``exclude=`` names methods/functions to leave alone entirely (not counted, never failing),
by bare name (``"close"``) or qualified (``"Store.close"``); :data:`READ_ONLY` and
:data:`CLOSE` are ready-made sets. ``match=`` (a predicate on :class:`Call`) restricts which
calls are counted at all, e.g. only calls from background threads.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import functools
import importlib
import importlib.machinery
import inspect
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import pytest

from rtindex.errors import StorageError

DEFAULT_TARGETS = ("rtindex.storage", "rtindex.segfile")

# names of calls that only read (today's Store and segfile), and of closing: tests that must
# not fail there pass them as ``exclude``
READ_ONLY = frozenset({"get", "multi_get", "scan", "scan_keys", "last_key", "approximate_size", "catch_up",
                       "segment_ids", "open_segment", "block", "blocks", "column", "column_bytes", "file_name"})
CLOSE = frozenset({"close"})


@dataclass(frozen=True)
class Call:
    """One call through a patched function: its number (1-based, all threads counted
    together), qualified name and the thread that made it."""

    k: int
    name: str
    thread: str
    main: bool  # made for the caller: by the main thread, or the indexer thread it hands puts to (else background)

    def __str__(self) -> str:
        return f"#{self.k} {self.name} [{self.thread}]"


class Fault:
    """What :func:`inject` yields: the call log, the calls that failed, and ``clear()``."""

    def __init__(self, at: int | None = None, *, sticky: bool = False, error: Any = None,
                 match: Callable[[Call], bool] | None = None):
        if at is not None and at < 1:
            raise ValueError("calls are numbered from 1")
        self.at = at
        self.sticky = sticky
        self._error = error
        self._match = match
        self.calls: list[Call] = []  # every counted call, in order
        self.fired: list[Call] = []  # the calls that raised
        self.cleared = False
        self.patched: list[str] = []  # qualified names that were patched
        self.skipped: list[str] = []  # names that could not be patched (e.g. C types)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        mode = "dry run" if self.at is None else f"at={self.at}{' sticky' if self.sticky else ''}"
        return f"<Fault {mode}: {len(self.calls)} calls, fired {[str(c) for c in self.fired]}>"

    @property
    def active(self) -> bool:
        """Whether the next counted call would raise (a sticky fault that fired and is not
        cleared, or a fault whose call has not come yet)."""
        if self.at is None or self.cleared:
            return False
        return len(self.calls) + 1 == self.at or (self.sticky and len(self.calls) + 1 >= self.at)

    def clear(self) -> None:
        """The cause is gone (space freed): no later call fails."""
        self.cleared = True

    def names(self) -> list[str]:
        return [c.name for c in self.calls]

    def _before_call(self, name: str, default_error: Callable[[str], BaseException]) -> None:
        t = threading.current_thread()
        with self._lock:
            call = Call(len(self.calls) + 1, name, t.name,
                        t is threading.main_thread() or t.name.startswith("rtindex-indexer"))
            if self._match is not None and not self._match(call):
                return
            self.calls.append(call)
            fail = (self.at is not None and not self.cleared
                    and (call.k == self.at or (self.sticky and call.k > self.at)))
            if fail:
                self.fired.append(call)
                if not self.sticky:
                    self.cleared = True
        if fail:
            raise self._make_error(call, default_error)

    def _make_error(self, call: Call, default_error: Callable[[str], BaseException]) -> BaseException:
        e = self._error
        if e is None:
            return default_error(str(call))
        if isinstance(e, BaseException):
            return copy.copy(e)
        if isinstance(e, type) and issubclass(e, BaseException):
            return e(f"injected fault at {call}")
        return e(call)


def _storage_error(where: str) -> BaseException:
    return StorageError(f"injected fault at {where}")


def _disk_full(where: str) -> BaseException:
    return OSError(errno.ENOSPC, f"No space left on device (injected at {where})")


def default_error_for(module_name: str) -> Callable[[str], BaseException]:
    return _disk_full if module_name.rsplit(".", 1)[-1] == "segfile" else _storage_error


def _resolve(target: Any) -> Any | None:
    if isinstance(target, str):
        parent, _, _ = target.rpartition(".")
        if parent:
            # only a module that is really in its package's directory (an editable install's
            # finder would also hand out a module of another checkout)
            pkg = importlib.import_module(parent)
            if importlib.machinery.PathFinder.find_spec(target, getattr(pkg, "__path__", None)) is None:
                return None  # the module does not exist (yet): nothing to patch
        return importlib.import_module(target)
    return target


def _class_members(cls: type) -> Iterator[tuple[Any, str, str, Any, str]]:
    for name, raw in list(vars(cls).items()):
        if name.startswith("_"):
            continue
        if inspect.isfunction(raw) or isinstance(raw, (staticmethod, classmethod)):
            yield cls, name, f"{cls.__name__}.{name}", raw, cls.__module__


def _members(target: Any) -> Iterator[tuple[Any, str, str, Any, str]]:
    """(owner, attribute, qualified name, raw attribute, module name) of what to patch."""
    if inspect.ismodule(target):
        mod = target.__name__
        short = mod.rsplit(".", 1)[-1]
        for name, obj in list(vars(target).items()):
            if name.startswith("_") or getattr(obj, "__module__", None) != mod:
                continue
            if inspect.isfunction(obj):
                yield target, name, f"{short}.{name}", obj, mod
            elif inspect.isclass(obj) and not issubclass(obj, BaseException):
                yield from _class_members(obj)
    elif inspect.isclass(target):
        yield from _class_members(target)
    else:
        raise TypeError(f"cannot inject faults into {target!r}: give modules, classes or module names")


def _wrap(raw: Any, qualname: str, fault: Fault, default_error: Callable[[str], BaseException]) -> Any:
    func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        fault._before_call(qualname, default_error)
        return func(*args, **kwargs)

    return type(raw)(wrapper) if isinstance(raw, (staticmethod, classmethod)) else wrapper


@contextlib.contextmanager
def inject(at: int | None = None, *, targets: Iterable[Any] = DEFAULT_TARGETS, sticky: bool = False,
           error: Any = None, exclude: Iterable[str] = (), match: Callable[[Call], bool] | None = None
           ) -> Iterator[Fault]:
    """Patch the storage layer for the duration of the ``with``; yields the :class:`Fault`.

    ``at=None`` is a dry run (count and record only). See the module docstring.
    """
    fault = Fault(at, sticky=sticky, error=error, match=match)
    exclude = frozenset(exclude)
    undo: list[tuple[Any, str, Any]] = []
    try:
        for target in targets:
            target = _resolve(target)
            if target is None:
                continue
            for owner, attr, qual, raw, mod in _members(target):
                if attr in exclude or qual in exclude:
                    continue
                wrapped = _wrap(raw, qual, fault, default_error_for(mod))
                try:
                    setattr(owner, attr, wrapped)
                except (TypeError, AttributeError):
                    fault.skipped.append(qual)
                    continue
                undo.append((owner, attr, raw))
                fault.patched.append(qual)
                if inspect.ismodule(owner):  # also where other rtindex modules imported it by name
                    for mname, m in list(sys.modules.items()):
                        if m is None or m is owner or not (mname == "rtindex" or mname.startswith("rtindex.")):
                            continue
                        for alias, val in list(vars(m).items()):
                            if val is raw:
                                setattr(m, alias, wrapped)
                                undo.append((m, alias, raw))
        yield fault
    finally:
        for owner, attr, raw in reversed(undo):
            setattr(owner, attr, raw)


@pytest.fixture
def inject_faults():
    """A fixture form of :func:`inject`: ``fault = inject_faults(at=3)``; undone at teardown
    (import it into a test module to use it)."""
    with contextlib.ExitStack() as stack:
        yield lambda *a, **kw: stack.enter_context(inject(*a, **kw))
