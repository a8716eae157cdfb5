"""Relays write requests from a query process to the ingest process, bytes unparsed.

A query process shares the public port with the other query processes; the ingest process
listens only on a private Unix socket. Writes that reach a query process are passed on
as they arrive (the body streamed in, the reply streamed out) over one pooled HTTP
connection per in-flight request, so a query process spends a copy of the bytes on a
write, not the parsing and indexing of it. The path goes on as the client sent it, still
percent-encoded, so the ingest process decodes and routes exactly what this process
authorized.
"""

from __future__ import annotations

from urllib.parse import quote

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse

from .http import HttpError, too_large

_PASSED = {"content-type", "content-length", "accept"}


class Relay:
    def __init__(self, socket_path: str, max_body_bytes: int):
        self.max_body_bytes = max_body_bytes
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=socket_path, retries=0),
            base_url="http://ingest", timeout=httpx.Timeout(None, connect=5.0),
            # an idle connection is closed here, before the ingest process's longer keep-alive
            # timeout (ServerConfig.keep_alive_timeout_s) would close it from its side
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16, keepalive_expiry=5.0))

    async def forward(self, request: Request) -> StreamingResponse:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            # refused here: the ingest process would refuse it too, but only once the
            # relay had sent it the whole body
            raise too_large("max_body_bytes", self.max_body_bytes, "the request body")
        headers = [(k, v) for k, v in request.headers.items() if k in _PASSED]
        # the raw bytes: a decoded path may hold characters no URL can carry unescaped
        raw = request.scope.get("raw_path") or quote(request.scope["path"]).encode()
        if any(seg in (b".", b"..") for seg in raw.split(b"/")):
            # httpx would resolve them, relaying a write to another route than the one the
            # key was checked for: ".../docs/../../victim" would drop "victim"
            raise HttpError(400, "BadRequest", "a path segment is '.' or '..'; send such a document _id "
                                               "percent-encoded (%2E)")
        query = request.scope.get("query_string", b"")
        try:
            url = httpx.URL("http://ingest", raw_path=raw + (b"?" + query if query else b""))
        except (httpx.InvalidURL, UnicodeDecodeError):
            raise HttpError(400, "BadRequest", "the request's path or query string is not a valid URL") from None
        req = self._client.build_request(request.method, url, headers=headers, content=request.stream())
        try:
            resp = await self._client.send(req, stream=True)
        except httpx.TransportError:
            raise HttpError(503, "Unavailable", "the ingest process is not reachable right now (it may be "
                                                "restarting); retry the write", headers=[(b"retry-after", b"1")]) from None
        out_headers = {k: v for k, v in resp.headers.items() if k in ("content-type", "retry-after")}
        return StreamingResponse(resp.aiter_raw(), status_code=resp.status_code, headers=out_headers,
                                 background=BackgroundTask(resp.aclose))

    async def healthy(self) -> bool:
        try:
            return (await self._client.get("/healthz")).status_code == 200
        except httpx.TransportError:
            return False

    async def aclose(self) -> None:
        await self._client.aclose()
