"""Row cache: the reference ``rtindex._py.lru`` and its compiled twin ``rtindex._ext._lru``.

Tests run on both implementations (the ``lru`` fixture) unless they check what only the
twin does (buffers of numpy ints, its capacity limit, thread safety). The core is a hypothesis
state machine against an independent model (an OrderedDict of key -> (value, nbytes) with
byte accounting and the counters of the reference's docstring): after every step
``keys_lru()``, ``stats()``, ``len`` and membership must equal the model's. Then edge cases
(bad keys and sizes, capacity 0, reference counts, finalizers that re-enter the cache, the
cyclic GC starting inside a call, large tables), ``copy_json`` on generated JSON, and eight
threads hammering one cache (the twin only: the reference is not thread-safe).

Scale with ``HYPOTHESIS_PROFILE`` (dev, ci, thorough). When green: dev ~11 s, ci ~18 s
(the threaded test takes 2 s).
"""

from __future__ import annotations

import array
import gc
import importlib.machinery
import random
import sys
import threading
import time
import weakref
from collections import OrderedDict

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import rtindex._ext._lru as ext_lru
import rtindex._py.lru as py_lru

KEY_MAX = (1 << 64) - 1


@pytest.fixture(params=[py_lru, ext_lru], ids=["py", "ext"])
def lru(request):
    return request.param


class Val:
    """A cached value: compared by identity, weak-referenceable, knows its key."""

    __slots__ = ("key", "__weakref__")

    def __init__(self, key):
        self.key = key

    def __repr__(self):
        return f"Val({self.key})@{id(self):x}"


def expected_key_error(k):
    if isinstance(k, bool) or not isinstance(k, int):
        return TypeError
    return OverflowError


def consistent(cache, size_of=None):
    """Structural invariants that hold whatever happened (threads, re-entrant finalizers)."""
    keys = cache.keys_lru()
    s = cache.stats()
    assert len(keys) == len(set(keys)) == s["entries"] == len(cache)
    assert s["bytes"] <= s["capacity_bytes"] == cache.capacity_bytes
    for k in keys:
        assert k in cache
    if size_of is not None:
        assert s["bytes"] == sum(size_of(k) for k in keys)
    return keys


# ------------------------------------------------------------------------ the model


class Model:
    """What the cache must hold: an OrderedDict (LRU first) with byte accounting."""

    def __init__(self, capacity):
        self.cap = capacity
        self.od: OrderedDict = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = self.inserts = self.evictions = 0

    def get(self, k):
        if k not in self.od:
            self.misses += 1
            return None
        self.hits += 1
        self.od.move_to_end(k)
        return self.od[k][0]

    def put(self, k, v, n):
        if k in self.od:
            self.bytes -= self.od.pop(k)[1]
        if n > self.cap:
            return
        self.od[k] = (v, n)
        self.bytes += n
        self.inserts += 1
        while self.bytes > self.cap:
            _, (_, m) = self.od.popitem(last=False)
            self.bytes -= m
            self.evictions += 1

    def discard(self, k):
        if k not in self.od:
            return False
        self.bytes -= self.od.pop(k)[1]
        return True

    def clear(self):
        self.od.clear()
        self.bytes = 0

    def stats(self):
        return {"hits": self.hits, "misses": self.misses, "inserts": self.inserts,
                "evictions": self.evictions, "bytes": self.bytes, "entries": len(self.od),
                "capacity_bytes": self.cap}


# ------------------------------------------------------------------------ the machine

# Small key space (hits and replacements are frequent) with keys at both ends of uint64.
HIGH_KEYS = (2**63 - 1, 2**63, 2**64 - 2, KEY_MAX)
keys_st = st.one_of(st.integers(0, 9), st.integers(0, 9), st.sampled_from(HIGH_KEYS))
bad_keys_st = st.sampled_from((-1, -(2**63), -(2**64), 2**64, 2**70, 1.0, 0.0, True, False,
                               "1", b"1", None, 1j))
# Small sizes (evictions are frequent), zero, and sizes far above any capacity used here.
nbytes_st = st.one_of(st.integers(0, 12), st.integers(0, 3),
                      st.sampled_from((2**63 - 1, 2**63, KEY_MAX, 2**64, 2**70)))
bad_nbytes_st = st.sampled_from((-1, -(2**70), True, False, 1.0, "1", None))
SEQ_FORMS = ("list", "tuple", "iter", "array", "memoryview", "numpy", "numpy-strided",
             "numpy-reversed", "numpy-int64")


def as_form(ints, form, impl):
    """``ints`` in the container ``form``; the reference gets numpy vectors as lists of
    Python ints (it iterates, and numpy scalars are not ints: only the twin reads buffers)."""
    ints = list(ints)
    if form.startswith("numpy") and impl is py_lru:
        return ints
    if form == "list":
        return ints
    if form == "tuple":
        return tuple(ints)
    if form == "iter":
        return iter(ints)
    if form in ("array", "memoryview") and all(0 <= x <= KEY_MAX for x in ints):
        a = array.array("Q", ints)
        return a if form == "array" else memoryview(a)
    if form == "numpy" and all(0 <= x <= KEY_MAX for x in ints):
        return np.array(ints, dtype=np.uint64)
    if form == "numpy-strided" and all(0 <= x <= KEY_MAX for x in ints):
        return np.array([x for i in ints for x in (i, 7)], dtype=np.uint64)[::2]
    if form == "numpy-reversed" and all(0 <= x <= KEY_MAX for x in ints):
        return np.array(ints[::-1], dtype=np.uint64)[::-1]
    if form == "numpy-int64" and all(-(2**63) <= x < 2**63 for x in ints):
        return np.array(ints, dtype=np.int64)
    return ints


class CacheMachine(RuleBasedStateMachine):
    impl = py_lru  # set per run

    def __init__(self):
        super().__init__()
        self.cache = None
        self.model = None

    def value(self, k):
        return Val(k)

    @initialize(capacity=st.sampled_from((0, 1, 3, 10, 25, 60)))
    def setup(self, capacity):
        self.cache = self.impl.RowCache(capacity)
        self.model = Model(capacity)

    # -- reads -------------------------------------------------------------
    @rule(k=keys_st)
    def get(self, k):
        want = self.model.get(k)
        assert self.cache.get(k) is want

    @rule(ks=st.lists(keys_st, max_size=12), form=st.sampled_from(SEQ_FORMS))
    def get_many(self, ks, form):
        # repeated keys in one call: each repetition is a hit that touches the entry again
        want = [self.model.get(k) for k in ks]
        got = self.cache.get_many(as_form(ks, form, self.impl))
        assert type(got) is list and len(got) == len(want)
        for g, w in zip(got, want):
            assert g is w

    @rule(ks=st.lists(keys_st, max_size=12), form=st.sampled_from(SEQ_FORMS))
    def charged(self, ks, form):
        """The sizes of the cached ones and the count of the others; nothing is touched."""
        held = [self.model.od.get(k) for k in ks]
        want = (sum(h[1] for h in held if h is not None), sum(h is None for h in held))
        before = self.cache.stats()
        assert self.cache.charged(as_form(ks, form, self.impl)) == want
        assert self.cache.stats() == before

    @rule(before=st.lists(keys_st, max_size=4), bad=bad_keys_st, after=st.lists(keys_st, max_size=3),
          form=st.sampled_from(("list", "tuple", "iter", "numpy-int64")))
    def get_many_bad_key(self, before, bad, after, form):
        """The keys before the bad one take effect (counted, touched), then the error."""
        ks = before + [bad] + after
        arg = as_form(ks, form, self.impl) if type(bad) is int else ks
        with pytest.raises(expected_key_error(bad)):
            self.cache.get_many(arg)
        for k in before:
            self.model.get(k)

    @rule(k=keys_st)
    def contains(self, k):
        assert (k in self.cache) == (k in self.model.od)

    @rule(bad=bad_keys_st, op=st.sampled_from(("get", "put", "discard", "contains")))
    def bad_key(self, bad, op):
        with pytest.raises(expected_key_error(bad)):
            if op == "get":
                self.cache.get(bad)
            elif op == "put":
                self.cache.put(bad, Val(0), 1)
            elif op == "discard":
                self.cache.discard(bad)
            else:
                bad in self.cache  # noqa: B015 - the lookup raises

    # -- writes ------------------------------------------------------------
    @rule(k=keys_st, n=nbytes_st)
    def put(self, k, n):
        v = self.value(k)
        self.cache.put(k, v, n)
        self.model.put(k, v, n)

    @rule(k=keys_st, n=nbytes_st)
    def put_same_object(self, k, n):
        """Replacing an entry by the value it holds already."""
        v = self.model.od[k][0] if k in self.model.od else self.value(k)
        self.cache.put(k, v, n)
        self.model.put(k, v, n)

    @rule(items=st.lists(st.tuples(keys_st, nbytes_st), max_size=10),
          kform=st.sampled_from(SEQ_FORMS), sform=st.sampled_from(SEQ_FORMS))
    def put_many(self, items, kform, sform):
        ks = [k for k, _ in items]
        ns = [n for _, n in items]
        vs = [self.value(k) for k in ks]
        self.cache.put_many(as_form(ks, kform, self.impl), iter(vs) if kform == "iter" else vs,
                            as_form(ns, sform, self.impl))
        for k, v, n in zip(ks, vs, ns):
            self.model.put(k, v, n)

    @rule(items=st.lists(st.tuples(keys_st, st.integers(0, 12)), max_size=6), data=st.data(),
          what=st.sampled_from(("key", "value", "nbytes")))
    def put_many_bad_item(self, items, data, what):
        """The puts before the bad item take effect, then the error."""
        ks = [k for k, _ in items]
        ns = [n for _, n in items]
        vs = [self.value(k) for k in ks]
        j = data.draw(st.integers(0, len(items)), label="bad at")
        if what == "key":
            bad = data.draw(bad_keys_st, label="bad key")
            ks.insert(j, bad)
            vs.insert(j, Val(0))
            ns.insert(j, 1)
            err = expected_key_error(bad)
        elif what == "value":
            ks.insert(j, 0)
            vs.insert(j, None)
            ns.insert(j, 1)
            err = ValueError
        else:
            ks.insert(j, 0)
            vs.insert(j, Val(0))
            ns.insert(j, data.draw(bad_nbytes_st, label="bad nbytes"))
            err = ValueError
        with pytest.raises(err):
            self.cache.put_many(ks, vs, ns)
        for k, v, n in zip(ks[:j], vs[:j], ns[:j]):
            self.model.put(k, v, n)

    @rule(n=st.integers(0, 3), extra=st.sampled_from(("keys", "values", "sizes")))
    def put_many_length_mismatch(self, n, extra):
        ks, vs, ns = [1] * n, [Val(1)] * n, [1] * n
        {"keys": ks, "values": vs, "sizes": ns}[extra].append(ns[0] if n else 1)
        with pytest.raises(ValueError, match="same length"):
            self.cache.put_many(ks, vs, ns)

    @rule(k=keys_st, n=st.integers(0, 5), bad=bad_nbytes_st)
    def put_bad(self, k, n, bad):
        with pytest.raises(ValueError):
            self.cache.put(k, None, n)
        with pytest.raises(ValueError):
            self.cache.put(k, Val(k), bad)

    @rule(k=keys_st)
    def discard(self, k):
        assert self.cache.discard(k) == self.model.discard(k)

    @rule()
    def clear(self):
        self.cache.clear()
        self.model.clear()

    # -- invariants --------------------------------------------------------
    @invariant()
    def agrees_with_model(self):
        if self.cache is None:
            return
        assert self.cache.keys_lru() == list(self.model.od)
        assert self.cache.stats() == self.model.stats()
        assert len(self.cache) == len(self.model.od)
        assert self.model.bytes <= self.model.cap
        for k in (0, 5, KEY_MAX):
            assert (k in self.cache) == (k in self.model.od)


def test_state_machine(lru):
    machine = type(f"CacheMachine_{lru.__name__.rsplit('.', 1)[-1]}", (CacheMachine,), {"impl": lru})
    run_state_machine_as_test(machine, settings=settings(
        settings.default,
        max_examples=settings.default.max_examples * 5,  # each example takes milliseconds
        stateful_step_count=60,
    ))


# ------------------------------------------------------------------------ edge cases


def test_compiled():
    assert ext_lru.RowCache is not py_lru.RowCache
    assert ext_lru.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert ext_lru.RowCache.__module__ == "rtindex._ext._lru"
    assert type(ext_lru.RowCache.get).__name__ == "cython_function_or_method"
    assert type(ext_lru.copy_json).__name__ == "cython_function_or_method"
    assert not hasattr(ext_lru.RowCache(1), "__dict__")


@pytest.mark.parametrize("bad", [-1, -(2**64), 2**64, 2**100, 1.0, float("nan"), True, False, "3", b"3",
                                 None, 3j, [3], np.uint64(3), np.int64(3)])
def test_bad_keys(lru, bad):
    c = lru.RowCache(100)
    c.put(3, Val(3), 1)
    err = expected_key_error(bad)
    for call in (lambda: c.get(bad), lambda: c.put(bad, Val(0), 1), lambda: c.discard(bad),
                 lambda: bad in c, lambda: c.get_many([3, bad]), lambda: c.get_many((bad,)),
                 lambda: c.put_many([bad], [Val(0)], [1])):
        with pytest.raises(err) as info:
            call()
        if err is TypeError:
            assert str(info.value) == f"row cache keys are ints, not {type(bad).__name__}"
        else:
            assert str(info.value) == f"row cache key {bad} is outside 0 .. 2**64-1"
    assert c.keys_lru() == [3]
    assert c.stats()["hits"] == 1  # get_many([3, bad]) counted the hit before the bad key


def test_key_bounds(lru):
    c = lru.RowCache(100)
    for k in (0, 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, KEY_MAX - 1, KEY_MAX):
        v = Val(k)
        c.put(k, v, 1)
        assert c.get(k) is v
        assert k in c
    assert c.keys_lru() == [0, 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, KEY_MAX - 1, KEY_MAX]

    class MyInt(int):
        pass

    c.put(MyInt(7), "seven", 1)
    assert c.get(7) == "seven"
    assert c.get(MyInt(KEY_MAX)) is not None
    assert c.keys_lru()[-2:] == [7, KEY_MAX]


@pytest.mark.parametrize("bad", [-1, -(2**70), True, False, 1.0, "1", None, np.int64(1)])
def test_bad_nbytes(lru, bad):
    c = lru.RowCache(100)
    with pytest.raises(ValueError) as info:
        c.put(1, Val(1), bad)
    assert str(info.value) == f"nbytes must be a non-negative int, not {bad!r}"
    with pytest.raises(ValueError):
        c.put_many([1], [Val(1)], [bad])
    with pytest.raises(ValueError, match="None cannot be cached"):
        c.put(1, None, 1)
    assert len(c) == 0 and c.stats()["inserts"] == 0


def test_negative_sizes_in_a_buffer():
    c = ext_lru.RowCache(100)
    with pytest.raises(ValueError, match="nbytes must be a non-negative int, not -5"):
        c.put_many(np.array([1, 2], dtype=np.uint64), [Val(1), Val(2)], np.array([1, -5], dtype=np.int64))
    assert c.keys_lru() == [1]
    with pytest.raises(OverflowError, match="row cache key -2 is outside"):
        c.put_many(np.array([3, -2], dtype=np.int64), [Val(3), Val(2)], [1, 1])
    assert c.keys_lru() == [1, 3]


@pytest.mark.parametrize("bad", [-1, True, 1.0, "10", None])
def test_bad_capacity(lru, bad):
    with pytest.raises(ValueError, match="capacity_bytes must be a non-negative int"):
        lru.RowCache(bad)


def test_capacity_limit():
    """The twin's one restriction: capacity_bytes below 2**63 (so byte sums fit a uint64)."""
    assert ext_lru.RowCache(2**63 - 1).capacity_bytes == 2**63 - 1
    with pytest.raises(ValueError, match="below 2"):
        ext_lru.RowCache(2**63)
    c = ext_lru.RowCache(2**63 - 1)
    c.put_many([1, 2, 3], ["a", "b", "c"], [2**62, 2**62, 2**63 - 1])
    assert c.keys_lru() == [3] and c.stats()["bytes"] == 2**63 - 1 and c.stats()["evictions"] == 2


def test_capacity_zero(lru):
    c = lru.RowCache(0)
    c.put(1, Val(1), 1)
    c.put_many([2, 3], [Val(2), Val(3)], [5, 2**70])
    assert len(c) == 0 and c.keys_lru() == [] and c.get(1) is None
    assert c.stats() == {"hits": 0, "misses": 1, "inserts": 0, "evictions": 0, "bytes": 0,
                         "entries": 0, "capacity_bytes": 0}
    # an entry charged 0 bytes fits any budget, as the reference says
    v = Val(4)
    c.put(4, v, 0)
    assert c.get(4) is v and c.stats()["bytes"] == 0


def test_too_large_entry_drops_the_old_one(lru):
    c = lru.RowCache(10)
    c.put(1, Val(1), 4)
    c.put(2, Val(2), 4)
    c.put(1, Val(1), 11)
    assert c.keys_lru() == [2] and c.stats()["bytes"] == 4
    assert c.stats()["inserts"] == 2 and c.stats()["evictions"] == 0


def test_refcounts(lru):
    c = lru.RowCache(10)
    v = Val(1)
    base = sys.getrefcount(v)
    c.put(1, v, 3)
    assert sys.getrefcount(v) == base + 1
    assert c.get(1) is v
    assert sys.getrefcount(v) == base + 1
    got = c.get_many([1, 1, 2, 1])
    assert sys.getrefcount(v) == base + 4
    del got
    got = c.get_many(array.array("Q", [1, 1]))
    assert sys.getrefcount(v) == base + 3
    del got
    c.put(1, v, 2)  # replaced by itself
    assert sys.getrefcount(v) == base + 1
    c.put_many([1, 1], [v, v], [1, 1])
    assert sys.getrefcount(v) == base + 1
    assert c.discard(1) and not c.discard(1)
    assert sys.getrefcount(v) == base
    c.put(1, v, 11)  # too large: not kept
    assert sys.getrefcount(v) == base
    for k in range(3):
        c.put(k, v, 1)
    assert sys.getrefcount(v) == base + 3
    c.clear()
    assert sys.getrefcount(v) == base
    misses = list(range(1000))
    none_before = sys.getrefcount(None)
    for _ in range(1000):
        c.get_many(misses)  # a million Nones: a leak of one per miss would show
    assert abs(sys.getrefcount(None) - none_before) < 1000


@pytest.mark.parametrize("how", ["evict", "evict_many", "discard", "clear", "replace", "too_large",
                                 "dealloc", "failed_put_many"])
def test_no_reference_kept(lru, how):
    c = lru.RowCache(10)
    vals = [Val(k) for k in range(5)]
    refs = [weakref.ref(v) for v in vals]
    c.put_many(range(5), vals, [2] * 5)
    del vals
    assert all(r() is not None for r in refs)
    if how == "evict":
        c.put(9, Val(9), 10)
    elif how == "evict_many":
        c.put_many([9, 10, 11, 12, 13], [Val(9)] * 5, [2] * 5)
    elif how == "discard":
        for k in range(5):
            c.discard(k)
    elif how == "clear":
        c.clear()
    elif how == "replace":
        c.put_many(range(5), ["x"] * 5, [2] * 5)
    elif how == "too_large":
        for k in range(5):
            c.put(k, "x", 11)
    elif how == "dealloc":
        del c
    else:  # the evicted values are released even though put_many raises half-way
        with pytest.raises(TypeError):
            c.put_many([20, 21, 22, 23, 24, "x"], ["y"] * 6, [2] * 6)
    assert all(r() is None for r in refs), how


def test_finalizer_reenters_the_cache(lru):
    """A value whose __del__ calls back into the cache while it is being evicted, replaced,
    discarded or cleared: no crash, and the cache is consistent after every call.

    Both implementations also guarantee that a finalizer finds the cache consistent: they
    release dropped values only once a call's changes are complete, with the budget holding."""
    size = lambda k: k % 5 + 1  # noqa: E731
    c = lru.RowCache(40)
    log = []
    active = [True]
    clear = c.clear

    class Reentrant:
        def __init__(self, key, depth):
            self.key = key
            self.depth = depth

        def __del__(self):
            if not active[0]:
                return
            log.append(self.key)
            consistent(c, size)
            c.get_many([self.key, 1, 2, 3])
            if self.depth < 3:  # whose values re-enter in turn when evicted
                nk = 1000 + 10 * self.key + self.depth
                c.put(nk, Reentrant(nk, self.depth + 1), size(nk))
            c.put_many([7, 8, 9], [Val(7), Val(8), Val(9)], [size(7), size(8), size(9)])
            c.discard(self.key + 1)
            if self.key % 4 == 0:
                clear()
            consistent(c, size)

    rng = random.Random(1)
    for _ in range(300):
        k = rng.randrange(60)
        c.put(k, Reentrant(k, 0), size(k))
        if rng.random() < 0.1:
            c.put_many([k + 1, k + 2], [Reentrant(k + 1, 0), Reentrant(k + 2, 0)], [size(k + 1), size(k + 2)])
        if rng.random() < 0.05:
            clear()
        if rng.random() < 0.1:
            c.discard(rng.randrange(60))
        consistent(c, size)
    assert len(log) > 100
    clear()
    consistent(c, size)
    active[0] = False  # the values refer to the cache (through __del__): break the cycle
    c.clear()
    assert len(c) == 0


def test_gc_inside_calls(lru):
    """The cyclic GC may start in any allocation; its finalizers re-enter the cache."""
    size = lambda k: k % 3 + 1  # noqa: E731
    c = lru.RowCache(30)
    ran = []
    clear = c.clear if lru is ext_lru else lambda: [c.discard(k) for k in c.keys_lru()]

    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            if not active[0]:
                return
            ran.append(1)
            c.put_many([1, 2, 3], [Val(1), Val(2), Val(3)], [size(1), size(2), size(3)])
            c.get_many([1, 2, 3, 4])
            if len(ran) % 7 == 0:
                clear()

    old = gc.get_threshold()
    rng = random.Random(2)
    active = [True]
    try:
        gc.set_threshold(1, 1, 1)
        for _ in range(2000):
            Cycle()
            ks = [rng.randrange(40) for _ in range(rng.randrange(1, 8))]
            op = rng.random()
            if op < 0.4:
                got = c.get_many(ks)
                assert all(v is None or v.key == k for k, v in zip(ks, got))
            elif op < 0.8:
                c.put_many(ks, [Val(k) for k in ks], [size(k) for k in ks])
            else:
                c.keys_lru()
                c.stats()
            consistent(c, size)
    finally:
        gc.set_threshold(*old)
    assert ran
    consistent(c, size)
    active[0] = False
    gc.collect()


def test_many_entries(lru):
    """200k entries: the table doubles many times; then 100k gets in one call."""
    n = 200_000
    c = lru.RowCache(10**12)
    vals = [Val(k) for k in range(n)]
    base = 7 << 40  # shard 7, row ids 0 .. n-1
    for k, v in zip(range(n), vals):
        c.put(base + k, v, 100)
    assert len(c) == n and c.stats()["bytes"] == 100 * n
    keys = array.array("Q", range(base + n - 100_000, base + n))
    got = c.get_many(keys)
    assert len(got) == 100_000
    assert all(g is vals[k - base] for k, g in zip(keys, got))
    assert c.get_many(list(range(base + n, base + n + 1000))) == [None] * 1000
    # every second entry discarded: backward-shift deletion through long probe runs
    for k in range(0, n, 2):
        assert c.discard(base + k)
    assert len(c) == n // 2
    got = c.get_many(np.arange(base, base + n, dtype=np.uint64)) if lru is ext_lru else \
        c.get_many(range(base, base + n))
    assert all((g is None) if k % 2 == 0 else (g is vals[k]) for k, g in enumerate(got))
    assert c.keys_lru() == list(range(base + 1, base + n, 2))  # every get touched in key order


def test_many_evictions_against_model(lru):
    """A larger key space than the state machine: long runs of put/get/discard vs the model."""
    rng = random.Random(3)
    c = lru.RowCache(5000)
    m = Model(5000)
    for step in range(60_000):
        k = rng.randrange(3000) if rng.random() < 0.9 else KEY_MAX - rng.randrange(100)
        op = rng.random()
        if op < 0.5:
            n = rng.randrange(6)
            v = Val(k)
            c.put(k, v, n)
            m.put(k, v, n)
        elif op < 0.85:
            assert c.get(k) is m.get(k)
        else:
            assert c.discard(k) == m.discard(k)
        if step % 5000 == 0:
            assert c.keys_lru() == list(m.od)
    assert c.keys_lru() == list(m.od)
    assert c.stats() == m.stats()


def test_get_many_inputs(lru):
    c = lru.RowCache(100)
    v1, v2 = Val(1), Val(2)
    c.put_many([1, 2], [v1, v2], [1, 1])
    assert c.get_many([]) == [] and c.get_many(()) == [] and c.get_many(array.array("Q")) == []
    assert c.get_many(k for k in (2, 3, 1)) == [v2, None, v1]
    assert c.get_many(range(3)) == [None, v1, v2]
    assert c.get_many(array.array("B", [1, 2])) == [v1, v2]  # other buffers are iterated
    assert c.get_many(array.array("q", [2, 1])) == [v2, v1]
    assert c.get_many(b"\x01\x02") == [v1, v2]
    with pytest.raises(TypeError):
        c.get_many(5)
    if lru is ext_lru:
        assert c.get_many(np.array([2, 1, 9], dtype=np.uint64)) == [v2, v1, None]
        assert c.get_many(np.array([[1, 2], [2, 1]], dtype=np.uint64)[:, 1]) == [v2, v1]
        with pytest.raises(TypeError):  # a 2-D buffer is iterated: its rows are not ints
            c.get_many(np.array([[1, 2]], dtype=np.uint64))
        with pytest.raises(TypeError):  # so is a non-native byte order: numpy scalars
            c.get_many(np.array([1], dtype=">u8" if sys.byteorder == "little" else "<u8"))
        c.put_many(np.array([5, 6], dtype=np.uint64), (Val(5), Val(6)), np.array([1, 1], dtype=np.uint64))
        assert c.keys_lru()[-2:] == [5, 6]


def test_stats_and_counters(lru):
    c = lru.RowCache(10)
    c.put_many([1, 2, 3], ["a", "b", "c"], [4, 4, 4])  # 3 evicts 1
    c.get(1)
    c.get(2)
    c.get_many([2, 3, 4])
    c.put(2, "B", 1)
    c.discard(3)
    c.clear()
    assert c.stats() == {"hits": 3, "misses": 2, "inserts": 4, "evictions": 1, "bytes": 0,
                         "entries": 0, "capacity_bytes": 10}
    assert c.capacity_bytes == 10


# ------------------------------------------------------------------------ copy_json

json_leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-(2**70), 2**70),
                        st.floats(allow_nan=False), st.text(max_size=5))
json_values = st.recursive(
    json_leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=4), inner, max_size=5)),
    max_leaves=40,
)


def walk_pairs(a, b):
    """Check that ``b`` copies ``a``: same structure, containers distinct, leaves identical."""
    if isinstance(a, dict):
        assert type(b) is dict and b is not a
        assert list(a) == list(b)
        for k in a:
            walk_pairs(a[k], b[k])
    elif isinstance(a, list):
        assert type(b) is list and b is not a
        assert len(a) == len(b)
        for x, y in zip(a, b):
            walk_pairs(x, y)
    else:
        assert b is a  # immutable leaves are shared


@given(json_values)
def test_copy_json(value):
    for impl in (py_lru, ext_lru):
        c = impl.copy_json(value)
        assert c == value
        walk_pairs(value, c)
    assert ext_lru.copy_json(value) == py_lru.copy_json(value)


def test_copy_json_is_independent(lru):
    doc = orjson.loads(orjson.dumps({"a": [1, {"b": [2, 3]}, []], "c": {"d": {}}, "e": "s"}))
    c = lru.copy_json(doc)
    c["a"][1]["b"].append(4)
    c["c"]["d"]["x"] = 1
    c["a"].pop()
    c["e"] = "t"
    assert doc == {"a": [1, {"b": [2, 3]}, []], "c": {"d": {}}, "e": "s"}


def test_copy_json_subclasses(lru):
    class D(dict):
        pass

    class L(list):
        pass

    class S(str):
        pass

    v = D(a=L([1, D(b=2)]), c=S("x"), d=(1, [2]))
    c = lru.copy_json(v)
    assert type(c) is dict and type(c["a"]) is list and type(c["a"][1]) is dict
    assert c == {"a": [1, {"b": 2}], "c": "x", "d": (1, [2])}
    assert c["c"] is v["c"] and c["d"] is v["d"]  # anything but dict and list is shared
    assert lru.copy_json(5) == 5 and lru.copy_json(None) is None and lru.copy_json([]) == []


def test_copy_json_deep(lru):
    v: object = 1
    for _ in range(100):
        v = {"a": [v]}
    assert lru.copy_json(v) == v
    for _ in range(100_000):
        v = [v]
    with pytest.raises(RecursionError):
        lru.copy_json(v)


# ------------------------------------------------------------------------ threads


def test_threads(lru):
    """8 threads of get_many/put_many/discard on one cache for ~2 s: no crash, consistent."""
    size = lambda k: k % 7 + 1  # noqa: E731
    c = lru.RowCache(600)
    errors = []
    stop = time.monotonic() + 2.0

    def work(seed):
        rng = random.Random(seed)
        try:
            while time.monotonic() < stop:
                ks = [rng.randrange(400) for _ in range(rng.randint(1, 16))]
                op = rng.random()
                if op < 0.4:
                    arg = array.array("Q", ks) if rng.random() < 0.5 else ks
                    got = c.get_many(arg)
                    assert all(v is None or v.key == k for k, v in zip(ks, got))
                elif op < 0.8:
                    c.put_many(ks, [Val(k) for k in ks], [size(k) for k in ks])
                elif op < 0.95:
                    c.discard(ks[0])
                else:
                    c.put(ks[0], Val(ks[0]), size(ks[0]))
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors
    keys = consistent(c, size)
    s = c.stats()
    assert len(keys) == s["entries"] and s["bytes"] == sum(size(k) for k in keys)
    assert s["inserts"] > 1000 and s["hits"] > 1000
    assert all(v.key == k for k, v in zip(keys, c.get_many(keys)))


# ------------------------------------------------------------------------ speed (printed only)


def _best(f, repeat=5):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def test_speed_report(capsys):
    n = 10_000
    keys = array.array("Q", random.Random(4).sample(range(1 << 40), n))
    klist = list(keys)
    lines = []
    for impl in (py_lru, ext_lru):
        c = impl.RowCache(1 << 40)
        c.put_many(klist, [{"k": k} for k in klist], [100] * n)
        t_buf = _best(lambda: c.get_many(keys))
        t_list = _best(lambda: c.get_many(klist))
        lines.append(f"{impl.__name__}: get_many of {n} keys: array('Q') {t_buf / n * 1e9:.1f} ns/key, "
                     f"list {t_list / n * 1e9:.1f} ns/key")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_untrack_json_hides_rows_from_the_gc(lru):
    import gc

    doc = {"a": [1, {"b": [2, 3]}], "c": {"d": "x"}, "e": []}
    same = lru.untrack_json(doc)
    assert same is doc and doc == {"a": [1, {"b": [2, 3]}], "c": {"d": "x"}, "e": []}
    containers = [doc, doc["a"], doc["a"][1], doc["a"][1]["b"], doc["c"], doc["e"]]
    if lru is ext_lru:
        assert not any(gc.is_tracked(x) for x in containers)
        copy = lru.copy_json(doc)
        assert gc.is_tracked(copy) and gc.is_tracked(copy["a"])  # copies are ordinary objects
    assert lru.untrack_json(5) == 5 and lru.untrack_json("s") == "s"
