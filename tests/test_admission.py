"""server/admission.py: at most max_concurrent run, at most max_queued wait (for at most the
queue timeout), the rest are refused at once with 429 and Retry-After, before their body is
read; and the default queue depth of ``rtindex serve``."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from rtindex.server.admission import Admission
from rtindex.server.config import ServerConfig

PATH = "/v1/query"


class App:
    """The app behind admission: each request waits until the test releases it."""

    def __init__(self):
        self.running = 0
        self.gates: list[asyncio.Event] = []

    async def __call__(self, scope, receive, send):
        self.running += 1
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        self.running -= 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    def release(self) -> None:
        self.gates.pop(0).set()


async def _call(adm: Admission, **scope) -> tuple[int, dict, bytes, bool]:
    """One request through ``adm`` (``scope``: more keys of its scope): status, headers,
    body, and whether its body was read."""
    read = False
    sent: list[dict] = []

    async def receive():
        nonlocal read
        read = True
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(msg):
        sent.append(msg)
    await adm({"type": "http", "path": PATH, "method": "POST", "headers": [], **scope}, receive, send)
    return sent[0]["status"], dict(sent[0]["headers"]), sent[1]["body"], read


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_past_the_slots_and_the_queue_requests_are_refused_at_once_unread():
    async def main():
        app = App()
        adm = Admission(app, {PATH}, max_concurrent=2, max_queued=1, queue_timeout=10.0)
        calls = [asyncio.create_task(_call(adm)) for _ in range(3)]
        await _settle()
        assert app.running == 2 and adm.executing == 2 and adm.queued == 1
        status, headers, body, read = await asyncio.wait_for(_call(adm), 1.0)  # the 4th: nowhere to go
        assert status == 429 and headers[b"retry-after"] == b"1" and not read
        err = orjson.loads(body)
        assert err["type"] == "TooManyRequests" and err["limit"] == "max_concurrent_queries"
        assert "queue is full" in err["message"] and "runs 2 queries at once and queues 1" in err["message"]
        app.release()  # the queued one takes the freed slot
        await _settle()
        assert app.running == 2 and adm.queued == 0 and adm.executing == 2
        app.release()
        app.release()
        assert [c[0] for c in await asyncio.gather(*calls)] == [200, 200, 200]
        assert adm.executing == 0
    asyncio.run(main())


def test_a_queued_request_waits_at_most_the_queue_timeout():
    async def main():
        app = App()
        adm = Admission(app, {PATH}, max_concurrent=1, max_queued=4, queue_timeout=0.05)
        first = asyncio.create_task(_call(adm))
        await _settle()
        status, _, body, read = await asyncio.wait_for(_call(adm), 1.0)
        assert status == 429 and not read and b"queue timeout (50 ms)" in body
        assert adm.queued == 0 and adm.executing == 1
        app.release()
        assert (await first)[0] == 200
    asyncio.run(main())


def test_other_paths_pass_untouched():
    async def main():
        app = App()
        adm = Admission(app, {PATH}, max_concurrent=1, max_queued=0, queue_timeout=1.0)

        async def other():
            async def receive():
                return {"type": "http.request", "body": b"", "more_body": False}
            sent = []

            async def send(msg):
                sent.append(msg)
            await adm({"type": "http", "path": "/healthz", "method": "GET", "headers": []}, receive, send)
            return sent[0]["status"]
        tasks = [asyncio.create_task(other()) for _ in range(3)]
        await _settle()
        assert app.running == 3 and adm.executing == 0
        for _ in tasks:
            app.release()
        assert await asyncio.gather(*tasks) == [200, 200, 200]
    asyncio.run(main())


@pytest.mark.parametrize("concurrent,queued,depth", [(4, None, 4), (8, None, 8), (4, 0, 0), (2, 16, 16)])
def test_the_default_queue_is_as_deep_as_the_slots(concurrent, queued, depth):
    """A query admitted under overload then waits about as long as one runs."""
    cfg = ServerConfig(data="x", max_concurrent_queries=concurrent, max_queued_queries=queued)
    cfg.check()
    assert cfg.queue_depth == depth
    assert ServerConfig.from_json(cfg.to_json()).queue_depth == depth


def test_the_cli_default_leaves_the_queue_to_the_slots():
    from rtindex.cli import _parser

    args = _parser().parse_args(["serve", "--data", "x"])
    assert args.max_queued_queries is None and args.max_concurrent_queries == 4
    with pytest.raises(ValueError, match="max-queued-queries"):
        ServerConfig(data="x", max_queued_queries=-1).check()


class Behind:
    """A LoopLag that refuses every draw, and counts them."""

    def __init__(self):
        self.draws = 0

    def refuses(self) -> bool:
        self.draws += 1
        return True


def test_a_request_the_protocol_let_through_is_not_drawn_for_the_lag_again():
    """The protocol (server/shedding.py) drew for the loop's lag already: a second draw
    would refuse 1-(1-p)^2 of the queries instead of p."""
    from rtindex.server.shedding import ASKED

    async def main():
        app = App()
        lag = Behind()
        adm = Admission(app, {PATH}, max_concurrent=2, max_queued=2, queue_timeout=1.0, lag=lag)
        status, _, _, _ = await _call(adm)
        assert status == 429 and lag.draws == 1
        call = asyncio.create_task(_call(adm, **{ASKED: True}))
        await _settle()
        assert app.running == 1 and lag.draws == 1
        app.release()
        assert (await call)[0] == 200
    asyncio.run(main())
