"""server/shedding.py: requests refused in the HTTP protocol (a real uvicorn server on a
loopback port, raw sockets) never reach the app, keep their connection usable and keep
pipelined replies in order; ``LoopLag`` refuses a share of queries only while the loop runs
behind."""

from __future__ import annotations

import asyncio
import time

import pytest
import uvicorn

from rtindex.server.shedding import ASKED, LoopLag, raw_response, shedding_protocol

REFUSAL = raw_response(429, "Too Many Requests", b'{"type":"TooManyRequests"}', [(b"retry-after", b"1")])


class Gate:
    """Sheds every request for /shed."""

    def __init__(self):
        self.asked: list[tuple[bytes, bytes]] = []

    def shed(self, method, path, headers):
        self.asked.append((method, path))
        return REFUSAL if path == b"/shed" else None


class App:
    """Answers 200 with the path it was asked for, after reading the whole body; /slow waits."""

    def __init__(self):
        self.paths: list[str] = []
        self.asked: list[bool] = []  # whether the gate was asked, as the scope says

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            return await send({"type": "lifespan.shutdown.complete"})
        self.paths.append(scope["path"])
        self.asked.append(scope.get(ASKED, False))
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        if scope["path"] == "/slow":
            await asyncio.sleep(0.05)
        body = scope["path"].encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def serve(test) -> None:
    """Runs ``test(connect, app, gate)`` (a coroutine) against a served app; ``connect()``
    opens a connection (reader, writer), closed after the test."""
    async def main():
        opened = []

        async def connect():
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            opened.append(writer)
            return reader, writer

        app, gate = App(), Gate()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, http=shedding_protocol(gate),
                                               log_level="warning", lifespan="on"))
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            await asyncio.wait_for(test(connect, app, gate), 10)
        finally:
            for writer in opened:
                writer.close()
                await writer.wait_closed()
            server.should_exit = True
            await task
    asyncio.run(main())


def request(path: str, body: bytes = b"", *, close: bool = False, extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n{extra}"
    return (head + ("connection: close\r\n" if close else "") + "\r\n").encode() + body


async def reply(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One response: its status and body (each has a content-length, but 100 Continue)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = next((int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length")), 0)
    return int(lines[0].split()[1]), await reader.readexactly(length)


def test_a_shed_request_is_answered_without_the_app_and_its_connection_goes_on():
    async def test(connect, app, gate):
        reader, writer = await connect()
        for body in (b"", b"x" * 200_000):  # a large body is read past, not kept
            writer.write(request("/shed?x=1", body))
            assert await reply(reader) == (429, b'{"type":"TooManyRequests"}')
        writer.write(b"POST /shed HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"5\r\nhello\r\n0\r\n\r\n")
        assert (await reply(reader))[0] == 429
        writer.write(request("/ok"))  # the same connection, answered by the app
        assert await reply(reader) == (200, b"/ok")
        assert app.paths == ["/ok"]
        assert (b"POST", b"/shed") in gate.asked  # the query string is not part of the path
    serve(test)


def test_a_shed_request_that_asks_to_close_is_closed_after_its_429():
    async def test(connect, app, gate):
        reader, writer = await connect()
        writer.write(request("/shed", close=True))
        assert (await reply(reader))[0] == 429
        assert await reader.read() == b""  # closed by the server
        assert app.paths == []
    serve(test)


def test_pipelined_requests_are_not_shed_past_a_reply_still_running():
    async def test(connect, app, gate):
        reader, writer = await connect()
        writer.write(request("/slow") + request("/shed"))  # one write: the second waits for the first
        assert await reply(reader) == (200, b"/slow")
        assert await reply(reader) == (200, b"/shed")  # answered by the app, in order
        writer.write(request("/shed") + request("/shed") + request("/ok"))  # nothing running: each shed
        assert [await reply(reader) for _ in range(3)] == [
            (429, b'{"type":"TooManyRequests"}'), (429, b'{"type":"TooManyRequests"}'), (200, b"/ok")]
        # the scope says whether the gate was asked (admission then does not draw again)
        assert app.paths == ["/slow", "/shed", "/ok"] and app.asked == [True, False, True]
    serve(test)


def test_a_request_expecting_100_continue_goes_to_the_app():
    async def test(connect, app, gate):
        reader, writer = await connect()
        writer.write(request("/shed", b"{}", extra="expect: 100-continue\r\n"))
        status, body = await reply(reader)
        if status == 100:  # uvicorn sends 100 Continue once the app reads the body
            status, body = await reply(reader)
        assert (status, body) == (200, b"/shed")
    serve(test)


def _compute(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _run_lag(blocked_ms: float, seconds: float, lag: LoopLag, computing: bool = True) -> float:
    """The share ``lag`` refuses after ``seconds`` of a loop held ``blocked_ms`` out of every
    2 ms (0: idle), by its own thread's work (``computing``) or by waiting (as when the
    machine or another thread has the CPU)."""
    async def main():
        lag.start()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if blocked_ms:
                _compute(blocked_ms / 1000) if computing else time.sleep(blocked_ms / 1000)
            await asyncio.sleep(0 if blocked_ms else 0.002)
        lag.stop()
        return lag.share
    return asyncio.run(main())


def test_loop_lag_sheds_while_the_loop_runs_behind_and_stops_after():
    lag = LoopLag(target=0.001)
    assert _run_lag(0, 0.3, lag) == 0.0 and not lag.refuses()  # an idle loop: nothing refused
    assert _run_lag(3, 0.5, lag) == 1.0  # every tick 3 ms late: everything refused
    assert lag.lag > 0.001
    refused = sum(lag.refuses() for _ in range(1000))
    assert refused == 1000
    assert _run_lag(0, 1.5, lag) == 0.0  # free again: the share decays to nothing


def test_loop_lag_never_sheds_when_the_loop_is_late_without_computing():
    lag = LoopLag(target=0.001)
    assert _run_lag(3, 0.3, lag, computing=False) == 0.0  # late, but waiting: a busy machine


def test_loop_lag_never_sheds_for_one_long_call_on_the_loop():
    async def main():
        lag = LoopLag(target=0.001)
        lag.start()
        _compute(0.06)  # a long call on the loop (a collection opened there) as the window begins
        await asyncio.sleep(0.001)  # (the late tick runs, and ends the window)
        lag.stop()
        return lag.share
    assert asyncio.run(main()) == 0.0


def test_loop_lag_ticks_only_while_queries_come():
    async def main():
        lag = LoopLag(target=0.001)
        lag.start()
        await asyncio.sleep(0.1)
        stopped = lag._handle is None  # a window without a query: no timer
        lag.refuses()
        restarted = lag._handle is not None
        lag.stop()
        return stopped, restarted
    assert asyncio.run(main()) == (True, True)


def test_loop_lag_off():
    lag = LoopLag(target=0.0)
    assert _run_lag(3, 0.2, lag) == 0.0


@pytest.mark.parametrize("share", [0.25, 0.75])
def test_loop_lag_refuses_its_share(share):
    lag = LoopLag(target=0.001)
    lag.share = share
    refused = sum(lag.refuses() for _ in range(20_000))
    assert abs(refused / 20_000 - share) < 0.02


def test_the_service_sheds_a_query_past_admission_before_its_app_and_counts_it(tmp_path):
    """``rtindex serve`` of 1 slot and no queue, the slot held by a query that runs until its
    time limit: the next query is refused 429 (admission's body and Retry-After), counted,
    on a connection that stays usable; without a valid key it is a 401 as ever."""
    import re
    import threading

    import httpx

    from tests.serving import Served

    s = Served(str(tmp_path / "db"), "--max-concurrent-queries", "1", "--max-queued-queries", "0",
               "--max-loop-lag-ms", "0")
    try:
        with s.client() as c:
            c.post("/v1/collections", json={"name": "c", "shards": 1})
            fence = c.post("/v1/collections/c/docs", json=[{"_id": i} for i in range(200)]).json()["fence"]
            assert c.post("/v1/query", json={"sql": "SELECT COUNT(*) AS n FROM c", "min_fence": fence}).status_code == 200
        cross = "SELECT COUNT(*) AS n FROM c a1, c a2, c a3, c a4, c a5, c a6"  # runs until stopped

        def hold() -> None:
            with s.client() as c:
                assert c.post("/v1/query", json={"sql": cross, "timeout_ms": 3000}).status_code == 408

        holder = threading.Thread(target=hold)
        holder.start()
        time.sleep(0.5)
        with s.client() as c:
            refused = [c.post("/v1/query", json={"sql": "SELECT 1 AS x"}) for _ in range(3)]
            assert [r.status_code for r in refused] == [429] * 3
            assert refused[0].headers["retry-after"] == "1"
            err = refused[0].json()
            assert err["type"] == "TooManyRequests" and "queue is full" in err["message"]
            with httpx.Client(base_url=s.url, headers={"Authorization": "ApiKey nope"}) as bad:
                assert bad.post("/v1/query", json={"sql": "SELECT 1 AS x"}).status_code == 401
            holder.join(10)
            assert c.post("/v1/query", json={"sql": "SELECT 1 AS x"}).json()["rows"] == [{"x": 1}]
            text = c.get("/metrics").text
            refusals = float(re.search(r"^rtindex_queries_refused_total (\S+)$", text, re.M).group(1))
            by_route = float(re.search(r'^rtindex_http_requests_total\{route="/v1/query",status="429"\} (\S+)$',
                                       text, re.M).group(1))
            assert refusals == by_route == 3
    finally:
        assert s.stop() == 0, "".join(s.output)
