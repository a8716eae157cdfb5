"""Load shedding in the HTTP protocol: a query past admission is refused before an ASGI task exists.

Under overload most requests are refused, so a refusal's cost decides how much of the
query process's one event loop is left for the queries it admits. Refused in the ASGI
stack, a 429 costs a task, a scope, the key check and three ``send`` calls, several times
what parsing its request costs; every request, admitted or not, then waits in the kernel
for that loop. Here the HTTP parser's callbacks decide as soon as the headers are in:
a query route, a valid key of its role, and no slot or queue place free (``Admission.full``)
means the prebuilt 429 is written once the body has passed, and the connection stays
open. Every other request (not a query route, no key or a bad one, a pipelined request,
``Expect: 100-continue``) takes the ASGI path unchanged, where admission decides again.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Protocol

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class LoopLag:
    """Sheds a share of the queries while the event loop runs behind, CoDel's signal with an
    AIMD share.

    Slots bound how many queries run at once, not how much of the loop they take: a point
    query runs on the loop itself, and a freed slot is taken again at once. When the loop is
    the bottleneck, every request waits in the kernel until the loop reaches it, admitted or
    not, and no slot count shows it. A timer every ``tick`` seconds measures how late the loop
    runs it; when even the least late tick of a ``window`` is past ``target``, the window
    had two ticks or more (a standing backlog, not one long call: a loop held through a
    whole window runs one tick in it), and the loop's thread computed through at least
    ``busy`` of it (the loop is the bottleneck, so refusing some requests helps the rest: a
    loop that is late because the machine is busy, or because a query's thread holds the
    interpreter, refuses nobody), the share of queries refused at once grows by ``step``; otherwise it
    shrinks by a quarter of that. ``target`` 0 turns this off.
    The timer runs only while queries come: a window without one, and nothing refused,
    stops it until the next.
    """

    def __init__(self, target: float, tick: float = 0.002, window: float = 0.02, step: float = 0.1,
                 busy: float = 0.8):
        self.target = target
        self.busy = busy
        self.tick = tick
        self.window = window
        self.step = step
        self.share = 0.0  # of queries refused now
        self.lag = 0.0  # the least lag of the last window, seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = self._window_end = 0.0
        self._least = float("inf")
        self._ticks = 0  # in this window
        self._asked = False  # refuses() was called in this window
        self._cpu = self._window_start = 0.0  # the loop thread's CPU time and the loop's time at the window's start

    def start(self) -> None:
        if self.target > 0:
            self._loop = asyncio.get_running_loop()
            self._begin()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._loop = None

    def refuses(self) -> bool:
        self._asked = True
        if self._handle is None and self._loop is not None:
            self._begin()
        return self.share > 0.0 and random.random() < self.share

    def _begin(self) -> None:
        now = self._loop.time()
        self._window_start, self._cpu = now, time.thread_time()
        self._window_end = now + self.window
        self._least = float("inf")
        self._ticks = 0
        self._arm(now)

    def _arm(self, now: float) -> None:
        self._due = now + self.tick
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        now = self._loop.time()
        self._least = min(self._least, now - self._due)
        self._ticks += 1
        if now >= self._window_end:
            self.lag = self._least
            cpu = time.thread_time()
            computing = cpu - self._cpu >= self.busy * (now - self._window_start)
            self._window_start, self._cpu = now, cpu
            if self._least > self.target and self._ticks >= 2 and computing:
                self.share = min(1.0, self.share + self.step)
            else:
                self.share = max(0.0, self.share - self.step / 4)
            self._least, self._ticks = float("inf"), 0
            self._window_end = now + self.window
            if not self._asked and self.share == 0.0:
                self._handle = None  # idle: refuses() starts it again
                return
            self._asked = False
        self._arm(now)


# in an ASGI scope: the gate was asked for this request, and let it through
ASKED = "rtindex.shed_asked"


class Gate(Protocol):
    def shed(self, method: bytes, path: bytes, headers: list[tuple[bytes, bytes]]) -> bytes | None:
        """The whole response to send instead of answering, or None to answer."""


def raw_response(status: int, reason: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    """An HTTP/1.1 response's bytes, as uvicorn would write them (no server or date header)."""
    lines = [f"HTTP/1.1 {status} {reason}".encode(), b"content-type: application/json",
             b"content-length: " + str(len(body)).encode(), *(k + b": " + v for k, v in headers)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def shedding_protocol(gate: Gate) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with ``gate`` asked before each request's ASGI task."""

    class SheddingProtocol(HttpToolsProtocol):
        _refusal: bytes | None = None

        def on_headers_complete(self) -> None:
            asked = False
            if (not self.expect_100_continue and not self.pipeline
                    and (self.cycle is None or self.cycle.response_complete)):
                self._refusal = gate.shed(self.parser.get_method(), self.url.partition(b"?")[0], self.headers)
                if self._refusal is not None:
                    return
                asked = True
            super().on_headers_complete()
            if asked:  # (the task made just now has not run yet)
                self.scope[ASKED] = True

        def on_body(self, body: bytes) -> None:
            if self._refusal is None:
                super().on_body(body)

        def on_message_complete(self) -> None:
            refusal, self._refusal = self._refusal, None
            if refusal is None:
                return super().on_message_complete()
            self.transport.write(refusal)
            if self.parser.should_keep_alive():
                self.on_response_complete()  # as after any reply: count it, arm the keep-alive timer
            else:
                self.transport.close()

    return SheddingProtocol
