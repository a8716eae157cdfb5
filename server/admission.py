"""Admission control for queries: pure ASGI, in front of the app, per query process.

At most ``max_concurrent`` queries execute at once; at most ``max_queued`` more wait, each
for at most ``queue_timeout``; anything past that is answered 429 with Retry-After at
once, before its body is read; so is a share of them while the event loop runs behind
(``LoopLag``, server/shedding.py). Under overload the process therefore does a bounded amount
of work per refused request (headers in, 429 out) and the admitted queries keep their
latency, instead of every query slowing down in an unbounded pile.

A slot is held until the app returns, which for a query that timed out is when its
worker thread has really stopped (server/query_app.py): the count is of work running,
not of replies pending.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from .http import HttpError, send_bytes
from .shedding import ASKED, LoopLag, raw_response


class Refusal:
    """A 429 made once, as ASGI's body and headers and as the bytes the protocol writes."""

    def __init__(self, body: bytes, headers: list[tuple[bytes, bytes]]):
        self.body = body
        self.headers = headers
        self.raw = raw_response(429, "Too Many Requests", body, headers)


class Admission:
    def __init__(self, app, paths: set[str], max_concurrent: int, max_queued: int,
                 queue_timeout: float, metrics=None, lag: LoopLag | None = None):
        self.app = app
        self.paths = paths
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.queue_timeout = queue_timeout
        self.metrics = metrics
        self.lag = lag
        self.executing = 0
        self._waiters: deque[asyncio.Future] = deque()
        # the refusals, made once: a refused request should cost as little as can be
        self._full = self._refusal("the query queue is full")
        self._late = self._refusal(f"no query slot within the queue timeout ({queue_timeout * 1000:.0f} ms)")
        self._behind = self._refusal("this query process is behind on the work it has (its event loop runs late)")

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in self.paths:
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        # a request the protocol asked about was drawn for the loop's lag already: drawing
        # again would refuse a larger share than the lag asks for
        refusal = self.refusal_now(lag=not scope.get(ASKED))
        if refusal is not None:
            return await self._refuse(send, refusal)
        if self.executing < self.max_concurrent and not self._waiters:
            self.executing += 1
        elif not await self._wait():
            return await self._refuse(send, self._late)
        scope["rtindex.queued_ms"] = (time.perf_counter() - t0) * 1000.0
        self._gauge()
        try:
            await self.app(scope, receive, send)
        finally:
            self._release()

    def refusal_now(self, lag: bool = True) -> Refusal | None:
        """The refusal of a query arriving now, or None when it may run or wait (``lag``:
        also the share the loop's lag refuses)."""
        if self.executing >= self.max_concurrent and len(self._waiters) >= self.max_queued:
            return self._full
        if lag and self.lag is not None and self.lag.refuses():
            return self._behind
        return None

    async def _wait(self) -> bool:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._gauge()
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.queue_timeout)
            return True
        except asyncio.TimeoutError:
            if fut.done():  # handed a slot just as the wait ran out: take it
                return True
            self._waiters.remove(fut)
            fut.cancel()
            return False
        except asyncio.CancelledError:  # the client went away while queued
            if fut.done() and not fut.cancelled():
                self._release()
            else:
                self._waiters.remove(fut)
                fut.cancel()
            raise

    def _release(self) -> None:
        while self._waiters:  # hand the slot straight to the oldest waiter
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                self._gauge()
                return
        self.executing -= 1
        self._gauge()

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.admission(self.executing, len(self._waiters))

    def _refusal(self, why: str) -> Refusal:
        """The 429 saying ``why``."""
        err = HttpError(429, "TooManyRequests", f"{why}: this query process runs {self.max_concurrent} queries at "
                                                f"once and queues {self.max_queued}; retry after the Retry-After "
                                                "seconds", limit="max_concurrent_queries",
                        headers=[(b"retry-after", b"1")])
        return Refusal(err.body(), err.headers)

    def count_refusal(self) -> None:
        if self.metrics is not None:
            self.metrics.refused()

    async def _refuse(self, send, refusal: Refusal) -> None:
        self.count_refusal()
        await send_bytes(send, 429, refusal.body, headers=refusal.headers)
