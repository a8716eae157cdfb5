"""Hostile input against a real ``rtindex serve``: what a careless or malicious client sends.

One served data directory takes generated and hand-made requests: every operation of its
OpenAPI document (schemathesis), documents in every write format (hypothesis), SQL token
soups and mutated queries, DuckDB escape attempts, path traversal in collection names and
mangled API keys. Each reply must be a 2xx (with per-item errors) or a 4xx whose message
names the problem: never a 5xx, never a dropped connection. Documents acknowledged stay
readable as they were sent, and no reply carries anything of the machine: canary files
beside the data directory and in /tmp, a canary in the server's environment, the admin
key's hash, /etc/passwd, or a path of the server that the request did not name.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
import secrets
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import rtindex
from rtindex import documents
from rtindex.server.config import Limits
from tests.reliability import record
from tests.serving import Served

LIMITS = Limits()
SLOW = 20  # how many times more cases the slow run tries
SCALES = [pytest.param(1, id="default"), pytest.param(SLOW, id="slow", marks=pytest.mark.slow)]
ENV_CANARY = "RTINDEX_HOSTILE_CANARY"
INT64 = (-(1 << 63), (1 << 63) - 1)
QUERY_MS = 3_000  # timeout_ms of every generated query: a costly one is a 408, not a stall


def _settings(examples: int) -> settings:
    """Hypothesis for a batch of requests: no shrinking (a case that breaks a promise is
    counted and kept as its request, not raised), no example database."""
    return settings(max_examples=examples, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck))


# --------------------------------------------------------------------------- the host
@dataclass
class Host:
    served: Served
    parent: Path  # the data directory's parent
    data: Path
    tmp_canary: Path
    secrets: tuple[str, ...]  # no reply may carry one
    paths: tuple[str, ...]  # the server's paths and the admin key: no reply may carry one its request did not name


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """A served data directory with canaries planted around it: a file beside it, a file in
    /tmp and a variable in the server's environment, each holding a random token."""
    parent = tmp_path_factory.mktemp("hostile")
    tokens = [secrets.token_hex(16) for _ in range(3)]
    (parent / "canary.csv").write_text(f"name,token\ncanary,{tokens[0]}\n")
    fd, tmp = tempfile.mkstemp(prefix="rtindex-canary-", suffix=".csv")
    with os.fdopen(fd, "w") as f:
        f.write(f"name,token\ncanary,{tokens[1]}\n")
    os.environ[ENV_CANARY] = tokens[2]  # Served passes os.environ to the server it starts
    try:
        served = Served(str(parent / "db"))
    finally:
        del os.environ[ENV_CANARY]
    try:
        runtime = []  # the supervisor's private directory and socket, from a child's config
        for pid in served.children()["ingest"] + served.children()["query"]:
            for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                name, _, value = item.partition(b"=")
                if name == b"RTINDEX_SERVER_CONFIG":
                    config = json.loads(value)
                    runtime += [config["ingest_socket"], config["metrics_dir"]]
        repo = str(Path(rtindex.__file__).resolve().parents[1])
        key_hash = hashlib.sha256(served.admin_key.encode()).hexdigest()
        paths = {str(parent), tmp, repo, sys.prefix, served.admin_key, *runtime} - {""}
        yield Host(served, parent, parent / "db", Path(tmp), (*tokens, key_hash, "root:x:0:0"),
                   tuple(sorted(paths, key=len, reverse=True)))
    finally:
        code = served.stop()
        os.unlink(tmp)
    assert code == 0, "".join(served.output[-60:])


@pytest.fixture
def tally(host):
    """A test's Tally; its clients closed at the end, whatever happened."""
    t = Tally(host)
    yield t
    t.close()


def listing(root: Path, skip: Path | None = None) -> set[str]:
    """Every path under ``root`` (``skip`` and what is under it left out)."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        if skip is not None and Path(dirpath) == skip:
            dirnames.clear()
            continue
        out.update(os.path.join(dirpath, n) for n in dirnames + filenames)
    return out - ({str(skip)} if skip is not None else set())


# --------------------------------------------------------------------------- requests
@dataclass
class Tally:
    """What a test's requests found: every request counted, every reply checked for a 5xx
    and for anything of the machine; the first broken promises kept as reproductions."""

    host: Host
    requests: int = 0
    server_errors: int = 0
    dropped: int = 0
    leaks: int = 0
    failures: int = 0  # replies that broke a promise of their own (a wrong status, a lost document)
    notes: list[str] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)

    def note(self, what: str) -> None:
        if len(self.notes) < 12:
            self.notes.append(what[:1500])

    def fail(self, what: str) -> None:
        self.failures += 1
        self.note("FAILED " + what)

    def client(self, key: str | None = "admin") -> Probe:
        probe = Probe(self, key)
        self.probes.append(probe)
        return probe

    def close(self) -> None:
        for probe in self.probes:
            probe.client.close()

    def look(self, status: int, body: bytes, headers: list[tuple[str, str]], sent: str, case: str) -> None:
        """Count a 5xx and whatever of the machine the reply shows."""
        if status >= 500:
            self.server_errors += 1
            self.note(f"{status} for {case}: {body[:300]!r}")
        text = body.decode("utf-8", "replace") + "\n" + "\n".join(f"{k}: {v}" for k, v in headers)
        found = [s for s in self.host.secrets if s in text]
        found += [p for p in self.host.paths if p in text and p not in sent]
        if found:
            self.leaks += 1
            self.note(f"LEAK of {found} in the reply to {case}: {text[:500]!r}")

    def raw(self, data: bytes, case: str) -> tuple[int, bytes] | None:
        """Send bytes on a new connection; the reply's (status, body), or None when the
        server closed the connection without a reply (counted as dropped)."""
        host, port = self.host.served.url.removeprefix("http://").split(":")
        self.requests += 1
        buf = b""
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            try:
                sock.sendall(data)
                while True:
                    head, sep, body = buf.partition(b"\r\n\r\n")
                    m = re.search(rb"(?im)^content-length: *(\d+)", head)
                    if sep and m and len(body) >= int(m.group(1)):
                        break
                    chunk = sock.recv(1 << 16)
                    if not chunk:
                        break
                    buf += chunk
            except OSError as e:
                if not buf:
                    self.dropped += 1
                    self.note(f"dropped: {case}: {e!r}")
                    return None
        m = re.match(rb"HTTP/1\.[01] (\d{3}) ", buf)
        if m is None:
            self.dropped += 1
            self.note(f"no reply to {case}: {buf[:200]!r}")
            return None
        head, _, body = buf.partition(b"\r\n\r\n")
        headers = [tuple(line.decode("latin-1").partition(":")[::2]) for line in head.split(b"\r\n")[1:]]
        self.look(int(m.group(1)), body, headers, data.decode("utf-8", "replace"), case)
        return int(m.group(1)), body

    def add(self, other: Tally) -> None:
        """Count what ``other`` found too."""
        for name in ("requests", "server_errors", "dropped", "leaks", "failures"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for note in other.notes:
            self.note(note)

    def record(self, request, what: str) -> int:
        """One line for docs/reliability.md's table; the number of broken promises."""
        failures = self.failures + self.server_errors + self.dropped + self.leaks
        record(request.node.nodeid, what, self.requests, "requests", failures, server_errors=self.server_errors,
               dropped=self.dropped, leaks=self.leaks)
        return failures


class Probe:
    """One keep-alive client for a batch of cases (see Tally)."""

    def __init__(self, tally: Tally, key: str | None):
        self.tally = tally
        # idle connections kept as long as the server keeps them (httpx's shorter default
        # would close one while a slow case is generated, and look like the server's doing)
        self.client = tally.host.served.client(key, timeout=60, limits=httpx.Limits(keepalive_expiry=110))
        self.connects = 0  # TCP connections the client opened
        self.closes = 0  # replies that said the server closes the connection
        self.previous: tuple[str, bool] | None = None  # the last request, and whether its reply closed

    def _trace(self, event: str, info: dict) -> None:
        if event == "connection.connect_tcp.complete":
            self.connects += 1

    def send(self, method: str, url: str, *, target: bytes | None = None, **kw) -> httpx.Response | None:
        """The reply, checked (Tally.look); None when the connection dropped (counted)."""
        ext: dict[str, Any] = {"trace": self._trace}
        if target is not None:  # the request line's path as it is, not as httpx would normalize it
            ext["target"] = target
        request = self.client.build_request(method, url, extensions=ext, **kw)
        sent = " ".join([method, str(request.url), unquote(str(request.url)), (target or b"").decode("latin-1"),
                         unquote((target or b"").decode("latin-1")), request.content.decode("utf-8", "replace"),
                         *(v for _, v in request.headers.items())])
        case = f"{method} {unquote(str(request.url))[:300]!r} body {request.content[:300]!r}"
        self.tally.requests += 1
        connects = self.connects
        try:
            r = self.client.send(request)
        except httpx.TransportError as e:
            self.tally.dropped += 1
            self.tally.note(f"dropped: {case}: {e!r}")
            return None
        if self.connects > connects and self.previous is not None and not self.previous[1]:
            self.tally.note(f"a new connection after the reply to {self.previous[0]}")
        closed = r.headers.get("connection", "").lower() == "close"
        self.closes += closed
        self.previous = (case, closed)
        self.tally.look(r.status_code, r.content, list(r.headers.multi_items()), sent, case)
        r.case = case  # what a failure note names
        return r

    def expect(self, r: httpx.Response | None, statuses: set[int] | range, why: str) -> bool:
        """The reply has one of ``statuses``, and a 4xx says what was wrong; else a failure."""
        if r is None or r.status_code >= 500:
            return False  # counted already
        if r.status_code not in statuses:
            self.tally.fail(f"{why}: {r.status_code} (expected {sorted(statuses)[:6]}) for {r.case}: {r.text[:300]}")
            return False
        if 400 <= r.status_code < 500 and not names_the_problem(r):
            self.tally.fail(f"{why}: a {r.status_code} that says nothing for {r.case}: {r.text[:300]}")
            return False
        return True

    def finish(self) -> None:
        """The client still works on the connection it kept: one more request, and no
        connection was closed by the server without saying so."""
        r = self.send("GET", "/healthz")
        if r is not None and r.status_code != 200:
            self.tally.fail(f"the client no longer works after its batch: {r.status_code}")
        if self.connects > 1 + self.closes:
            self.tally.dropped += self.connects - 1 - self.closes
            self.tally.note(f"the server closed {self.connects - 1 - self.closes} keep-alive connections unasked")
        self.client.close()


def names_the_problem(r: httpx.Response) -> bool:
    """A 4xx in the service's error shape with a message (or FastAPI's ``detail`` list)."""
    try:
        body = r.json()
    except ValueError:
        return False
    if not isinstance(body, dict):
        return False
    if isinstance(body.get("message"), str) and body["message"].strip() and isinstance(body.get("type"), str):
        return True
    return r.status_code == 422 and bool(body.get("detail"))


def make_key(probe: Probe, role: str) -> str:
    r = probe.send("POST", "/v1/keys", json={"role": role, "name": f"hostile {role}"})
    assert r is not None and r.status_code == 201, r and r.text
    return r.json()["key"]


def created(probe: Probe, name: str, shards: int = 1) -> None:
    r = probe.send("POST", "/v1/collections", json={"name": name, "shards": shards})
    assert r is not None and r.status_code in (201, 409), r and r.text


# --------------------------------------------------------------------------- 1. OpenAPI
def _transport(kw: dict) -> dict | None:
    """schemathesis's request (requests' keywords) as httpx's, or None when httpx could not
    send it as it is (a header value with a line break: a client refuses to, so no server
    sees it; the raw-socket cases of the key test send such bytes)."""
    headers = {k: v for k, v in kw.get("headers", {}).items()}
    for k, v in headers.items():
        if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", k) or re.search(r"[\x00-\x1f\x7f]", str(v)):
            return None
        try:
            str(v).encode("latin-1")
        except UnicodeEncodeError:
            return None
    out: dict[str, Any] = {"headers": headers, "params": kw.get("params") or None}
    if kw.get("cookies"):
        headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in kw["cookies"].items())
    if "json" in kw:
        out["content"] = json.dumps(kw["json"]).encode()
        headers.setdefault("Content-Type", "application/json")
    elif kw.get("data") is not None:
        data = kw["data"]
        out["content"] = data if isinstance(data, bytes) else str(data).encode()
    return out


@pytest.mark.parametrize("scale", SCALES)
def test_every_openapi_operation_takes_generated_requests(request, host, tally, scale):
    """schemathesis generates requests for every operation of /openapi.json, conforming
    (positive) and not (negative), with the admin key: no 5xx (its not_a_server_error
    check), every 4xx names the problem, no drop, no leak. A collection it makes is
    dropped afterwards; one of more than 4 shards is made with fewer (one of a thousand
    shards is slow to make, and says nothing more about hostile input)."""
    auth = {"Authorization": f"ApiKey {host.served.admin_key}"}
    schema = schemathesis.openapi.from_url(host.served.url + "/openapi.json", headers=auth)
    probe = tally.client()
    before = {c["name"] for c in probe.send("GET", "/v1/collections").json()["collections"]}
    examples = 5 * scale
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 18
    for operation in operations:
        for mode in schemathesis.GenerationMode:
            @given(operation.as_strategy(generation_mode=mode))
            @_settings(examples)
            def case(case):
                kw = case.as_transport_kwargs(base_url=host.served.url, headers=auth)
                if (operation.method.upper(), operation.path) == ("POST", "/v1/collections"):
                    body = kw.get("json")
                    if isinstance(body, dict) and type(body.get("shards")) is int and body["shards"] > 4:
                        kw["json"] = {**body, "shards": 1 + body["shards"] % 4}
                sendable = _transport(kw)
                if sendable is None:
                    return
                r = probe.send(kw["method"], kw["url"], **sendable)
                if r is None:
                    return
                case.validate_response(r, checks=[schemathesis.checks.not_a_server_error])
                if 400 <= r.status_code < 500 and not names_the_problem(r):
                    tally.fail(f"a {r.status_code} that says nothing for {r.case}: {r.text[:300]}")

            server_errors = tally.server_errors
            try:
                case()
            except (Exception, BaseExceptionGroup) as e:  # what schemathesis's check found, when the run ends
                what = f"schemathesis, {operation.method.upper()} {operation.path} ({mode.value}): {e}"
                if tally.server_errors == server_errors:  # (a 5xx is counted already)
                    tally.fail(what)
                else:
                    tally.note(what)
    for name in {c["name"] for c in probe.send("GET", "/v1/collections").json()["collections"]} - before:
        probe.send("DELETE", f"/v1/collections/{quote(name, safe='')}")
    probe.finish()
    failures = tally.record(request, "OpenAPI operations, generated requests: no 5xx, drop or leak")
    assert failures == 0, "\n".join(tally.notes)


# --------------------------------------------------------------------------- 2. documents
# what an item's error must mention for each problem of a document
SAYS = {"depth": ("nesting",), "utf8": ("UTF-8", "surrogate"), "duplicate": ("duplicate",),
        "nonfinite": ("NaN", "Infinity", "non-finite"), "int": ("64-bit",), "json": ("JSON",),
        "object": ("object",), "_id": ("_id",), "_event_time": ("_event_time",), "size": ("max_document_bytes",)}
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def _depth(text: bytes) -> int:
    """How deep the containers of a JSON text nest (the document itself is 1)."""
    depth = deepest = 0
    for m in re.finditer(rb"[\[\]{}]", _STRINGS.sub(b'""', text)):
        depth += 1 if m.group() in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _surrogates(v: Any) -> bool:
    """A string or key holding a lone surrogate (a JSON escape of one, or an undecodable
    byte as the decoder kept it)."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(v, dict):
        return any(_surrogates(k) or _surrogates(x) for k, x in v.items())
    if isinstance(v, list):
        return any(_surrogates(x) for x in v)
    return False


def verdict(text: bytes) -> tuple[set[str], Any]:
    """The problems of one document's JSON text by the documented rules (none: it is
    stored), found independently of rtindex's parsers, and the document it means."""
    problems: set[str] = set()
    depth = _depth(text)
    if depth > LIMITS.max_depth:
        problems.add("depth")
        if depth > 400:
            return problems, None
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError:
        problems.add("utf8")
        s = text.decode("utf-8", "surrogateescape")

    def pairs(items):
        names = [k for k, _ in items]
        if len(set(names)) != len(names):
            problems.add("duplicate")
        if any(_surrogates(k) or _surrogates(v) for k, v in items):  # (a value a later key drops, too)
            problems.add("utf8")
        return dict(items)

    def nonfinite(name):
        problems.add("nonfinite")
        return 0.0

    def integer(token):
        try:
            v = int(token)
        except ValueError:  # more digits than Python converts: far outside 64 bits
            problems.add("int")
            return 0
        if not INT64[0] <= v <= INT64[1]:
            problems.add("int")
        return v

    def real(token):
        v = float(token)
        if math.isinf(v):
            problems.add("nonfinite")
        return v

    try:
        doc = json.loads(s, object_pairs_hook=pairs, parse_constant=nonfinite, parse_int=integer, parse_float=real)
    except (ValueError, RecursionError):
        problems.add("json")
        return problems, None
    if _surrogates(doc):
        problems.add("utf8")
    if not isinstance(doc, dict):
        problems.add("object")
        return problems, None
    if doc.get("_id") is not None:
        try:
            documents.encode_id(doc["_id"])
        except Exception:  # noqa: BLE001 - refused, however the rule says it
            problems.add("_id")
    if doc.get("_event_time") is not None:
        try:
            documents.event_time_of(doc["_event_time"], 0, True)
        except Exception:  # noqa: BLE001
            problems.add("_event_time")
    return problems, doc


def _dumps(s: str, ascii_only: bool = True) -> bytes:
    return json.dumps(s, ensure_ascii=ascii_only).encode("utf-8")


EDGE_NUMBERS = [b"-9223372036854775809", b"-9223372036854775808", b"9223372036854775807", b"9223372036854775808",
                b"18446744073709551615", b"18446744073709551616", b"1" + b"0" * 400, b"1e400", b"-1e400", b"1e-400",
                b"-0", b"-0.0", b"0.1", b"1E+2", b"2.5e-3", b"NaN", b"Infinity", b"-Infinity", b"9007199254740993",
                b"1.7976931348623157e308", b"5e-324"]
EDGE_STRINGS = [b'""', b'"\\u0000"', b'"\\ud800"', b'"x\\udfff"', b'"\\ud83d\\ude00"', b'"\xff"', b'"\xc0\xaf"',
                b'"\xed\xa0\x80"', b'"\xf4\x90\x80\x80"', b'"\xe2\x82"', b'"\\/"', b'"\\"\\\\"', b'"\xe2\x80\xa8"',
                b'"\xef\xbb\xbf"', b'"\xf0\x9f\x98\x80"', b'"a\x01b"', b'"\\x41"', b'"\\u12"', b'"a\tb"']
LEAVES = st.one_of(
    st.integers(-(1 << 66), 1 << 66).map(lambda i: str(i).encode()),
    st.sampled_from(EDGE_NUMBERS),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: json.dumps(f).encode()),
    st.text(max_size=20).map(_dumps),
    st.text(max_size=20).map(lambda s: _dumps(s, False)),
    st.sampled_from(EDGE_STRINGS),
    st.sampled_from([b"true", b"false", b"null"]),
    st.integers(1, 100_000).map(lambda n: b'"' + b"x" * n + b'"'),
)
KEYS = st.one_of(st.text(max_size=8).map(_dumps), st.sampled_from([b'"a"', b'"b"', b'""', b'"a.b"', b'"\\ud800"',
                                                                    b'"\xff"', b'"[0]"', b'"$"', b'"_id"']))
WS = st.sampled_from([b"", b" ", b"\t", b"\r\n ", b"\n"])


def _array(children):
    return st.tuples(st.lists(children, max_size=5), WS).map(lambda a: b"[" + a[1] + (b"," + a[1]).join(a[0]) + b"]")


def _object(children):
    return st.tuples(st.lists(st.tuples(KEYS, children), max_size=5), WS).map(
        lambda a: b"{" + a[1] + b",".join(k + b":" + a[1] + v for k, v in a[0]) + b"}")


VALUES = st.recursive(LEAVES, lambda c: st.one_of(_array(c), _object(c)), max_leaves=12)


def nested(depth: int, kinds: str, leaf: bytes = b"1") -> bytes:
    """``leaf`` inside ``depth`` containers, of the kinds ``kinds`` names in turn (o, a)."""
    out = leaf
    for i in range(depth):
        out = b'{"d":' + out + b"}" if kinds[i % len(kinds)] == "o" else b"[" + out + b"]"
    return out


DEEP = st.builds(nested, st.integers(60, 66), st.sampled_from(["o", "a", "oa"]))
VERY_DEEP = st.builds(lambda depth, kinds: b'{"v":' + nested(depth, kinds) + b"}",
                      st.sampled_from([1_000, 100_000]), st.sampled_from(["o", "a", "oa"]))
ODD_IDS = [b'""', b'"\\u0000"', b'"\\n"', b'" "', b'"a/b"', b'"%2e%2e"', b'"../x"', b'"?x#y"', b'"\\ud800"',
           b'"' + b"i" * 1024 + b'"', b'"' + b"i" * 1025 + b'"', b'"' + "é".encode() * 512 + b'"',
           b'"' + "é".encode() * 513 + b'"', b'"007"', b'"\\t\\r"', b'"\xff"', b"1.5", b"true", b"false", b"null",
           b"[]", b"{}", b'{"a":1}', b"[1]", b"9223372036854775808", b"-9223372036854775809", b"1e3", b"-0"]
IDS = st.one_of(st.none(), st.text(max_size=24).map(lambda s: _dumps("s" + s)),
                st.integers(INT64[0], INT64[1]).map(lambda i: str(i).encode()), st.sampled_from(ODD_IDS))
EVENT_TIMES = [b"1700000000000000", b"1700000000", b"1700000000000", b"1700000000000000000", b'"2024-01-01T00:00:00Z"',
               b'"2024-02-30"', b'"garbage"', b"1.5", b"true", b"null", b"-1", b"9223372036854775807", b"{}"]


@st.composite
def doc_texts(draw) -> bytes:
    kind = draw(st.sampled_from(["object"] * 12 + ["deep", "deep", "root", "very deep"]))
    if kind == "root":  # not an object
        return draw(st.one_of(LEAVES, _array(VALUES)))
    if kind == "very deep":  # deeper than the verdict parses: nothing else wrong with it
        return draw(VERY_DEEP)
    items = draw(st.lists(st.tuples(KEYS.filter(lambda k: k != b'"_id"'), VALUES), max_size=6))
    if kind == "deep":
        items.append((b'"v"', draw(DEEP)))
    doc_id = draw(IDS)
    if doc_id is not None:
        items.insert(draw(st.integers(0, len(items))), (b'"_id"', doc_id))
        if draw(st.integers(0, 30)) == 0:  # the _id twice
            items.append((b'"_id"', draw(IDS.filter(lambda v: v is not None))))
    if draw(st.integers(0, 6)) == 0:
        items.append((b'"_event_time"', draw(st.sampled_from(EVENT_TIMES))))
    ws = draw(WS)
    return ws + b"{" + b",".join(k + b":" + v for k, v in items) + b"}" + ws


FORMATS = ("array", "ndjson", "rockset")


def body_of(texts: list[bytes], fmt: str, sep: bytes = b"\n") -> tuple[bytes, str]:
    """(body, Content-Type) of documents given as JSON texts, in one of FORMATS."""
    if fmt == "ndjson":  # a line break between tokens is only whitespace: a space keeps the line one
        return sep.join(t.replace(b"\n", b" ") for t in texts) + sep, "application/x-ndjson"
    array = b"[" + b",".join(texts) + b"]"
    return (array if fmt == "array" else b'{"data": ' + array + b"}"), "application/json"


def short(text: bytes, limit: int = 600) -> str:
    """A text for a failure note: runs of one byte collapsed (``x{*5000}``), cut at ``limit``."""
    return repr(re.sub(rb"(.)\1{15,}", lambda m: m.group(1) + b"{*%d}" % len(m.group()), text, flags=re.S)[:limit])


def _key(doc_id: Any) -> tuple[str, Any]:
    return type(doc_id).__name__, doc_id


@dataclass
class Store:
    """The documents a collection acknowledged (the last write of each ``_id``), to read back."""

    name: str
    read_each: bool = True  # read a write's documents back at once (else only in read_all)
    acked: dict = field(default_factory=dict)
    fence: str | None = None  # of the last write that stored something

    def url(self, fmt: str) -> str:
        return (f"/v1/orgs/self/ws/commons/collections/{self.name}/docs" if fmt == "rockset"
                else f"/v1/collections/{self.name}/docs")

    def path(self, doc_id: Any) -> str:
        named = quote(doc_id, safe="") if isinstance(doc_id, str) else str(doc_id)
        return f"/v1/collections/{self.name}/docs/{named}"

    def write(self, probe: Probe, texts: list[bytes], fmt: str, sep: bytes = b"\n",
              expect: list[tuple[set[str], Any]] | None = None) -> None:
        """Send ``texts`` in ``fmt``; check each item's status against its verdict, and read
        back what was stored."""
        tally = probe.tally
        expect = expect or [verdict(t) for t in texts]
        body, ctype = body_of(texts, fmt, sep)
        r = probe.send("POST", self.url(fmt), content=body, headers={"Content-Type": ctype})
        if not probe.expect(r, {200}, f"a write of {len(texts)} documents as {fmt}"):
            return
        items = r.json()["data" if fmt == "rockset" else "items"]
        if len(items) != len(texts):
            tally.fail(f"{len(items)} items for {len(texts)} documents: {r.case}")
            return
        batch: dict = {}
        for text, (problems, doc), item in zip(texts, expect, items):
            if problems:
                error = item.get("error") or ""
                # a text that is not JSON may be refused for any problem met before the syntax error
                says = [w for p in (SAYS if "json" in problems else problems) for w in SAYS[p]]
                if item["status"] != "ERROR":
                    tally.fail(f"accepted a document with {sorted(problems)} ({fmt}): {short(text)} -> {item}; "
                               f"the request: {short(body, 1200)}")
                elif not any(w.lower() in error.lower() for w in says):
                    tally.fail(f"an error that does not name {sorted(problems)} ({fmt}): {error[:300]!r} "
                               f"for {short(text)}")
                continue
            doc_id = doc.get("_id")
            if item["status"] not in ("ADDED", "REPLACED") or item.get("error") is not None:
                tally.fail(f"refused a valid document ({fmt}): {short(text)} -> {item}")
                continue
            if doc_id is None:
                doc_id = item["_id"]
            elif item["_id"] != doc_id or type(item["_id"]) is not type(doc_id):
                tally.fail(f"the reply's _id {item['_id']!r} is not the document's {doc_id!r}")
            seen = _key(doc_id) in self.acked or _key(doc_id) in batch
            if item["status"] != ("REPLACED" if seen else "ADDED"):
                tally.fail(f"{item['status']} for {'a' if seen else 'no'} stored _id {doc_id!r} ({fmt})")
            want = dict(doc)
            want["_id"] = doc_id
            et = doc.get("_event_time")
            if et is None or not isinstance(et, int):
                want.pop("_event_time", None)  # made by the server, or converted: not compared
            batch[_key(doc_id)] = (doc_id, want)
        self.acked.update(batch)
        if batch:
            self.fence = r.json()["last_offset" if fmt == "rockset" else "fence"]
            if self.read_each:
                self.caught_up(probe)
                for doc_id, want in batch.values():
                    self.read(probe, doc_id, want)

    def caught_up(self, probe: Probe) -> None:
        """A read goes to a query process: wait there for the last write (its fence)."""
        if self.fence is not None:
            probe.expect(query(probe, f"SELECT COUNT(*) AS n FROM {self.name}", min_fence=self.fence), {200},
                         "a query waiting for a write's fence")

    def read(self, probe: Probe, doc_id: Any, want: dict) -> None:
        r = probe.send("GET", self.path(doc_id))
        if r is None or r.status_code >= 500:
            return
        if r.status_code != 200:
            probe.tally.fail(f"an acknowledged document is not readable: {doc_id!r}: {r.status_code} {r.text[:200]}")
            return
        got = r.json()
        if "_event_time" not in want:
            got.pop("_event_time", None)
        if got != want:
            probe.tally.fail(f"read back {json.dumps(got)[:400]} for {json.dumps(want)[:400]}")

    def read_all(self, probe: Probe) -> None:
        """Every acknowledged document, still there as it was acknowledged."""
        self.caught_up(probe)
        for doc_id, want in self.acked.values():
            self.read(probe, doc_id, want)


@pytest.mark.parametrize("scale", SCALES)
def test_generated_documents_in_every_format(request, host, tally, scale):
    """Hypothesis documents (nested values, edge numbers and strings, invalid UTF-8, NaN,
    integers past 64 bits, duplicate keys, odd ``_id`` and ``_event_time`` values, deep
    nesting, non-object roots) as a JSON array, NDJSON and Rockset's body: each item's
    status agrees with the documented rules, each error names the problem, and every
    acknowledged document reads back as it was sent."""
    probe = tally.client()
    store = Store(f"hx_docs_{request.node.callspec.id}")
    created(probe, store.name, shards=2)

    @given(st.lists(doc_texts(), min_size=1, max_size=6), st.sampled_from(FORMATS),
           st.sampled_from([b"\n", b"\r\n", b"\n\n"]))
    @_settings(40 * scale)
    def batch(texts, fmt, sep):
        store.write(probe, texts, fmt, sep)

    batch()
    store.read_all(probe)
    probe.finish()
    failures = tally.record(request, "generated documents, 3 write formats: per-item verdicts, read back")
    assert failures == 0, "\n".join(tally.notes)


def _sized(n: int, doc_id: str) -> bytes:
    """A document of exactly ``n`` bytes, with its ``_id`` and ``_event_time`` (nothing to add)."""
    head = b'{"_id":"' + doc_id.encode() + b'","_event_time":1700000000000000,"s":"'
    return head + b"x" * (n - len(head) - 2) + b'"}'


def hand_made() -> list[tuple[str, bytes]]:
    """(name, JSON text) of documents at and past every limit, and of every odd kind."""
    cases = []
    for depth in (62, 63, 64, 65, 1_000, 100_000):
        for kinds in ("o", "a", "oa"):
            cases.append((f"depth {depth + 1} {kinds}", b'{"_id":"deep%d%s","v":' % (depth, kinds.encode())
                          + nested(depth, kinds) + b"}"))
    cap = LIMITS.max_document_bytes
    for n in (cap - 1, cap, cap + 1):
        cases.append((f"{n} bytes", _sized(n, f"size{n}")))
    cases.append((f"{cap - 20} bytes before what is added", b'{"s":"' + b"x" * (cap - 28) + b'"}'))
    cases.append(("an array of 300,000 numbers", b'{"_id":"arr","a":[' + b",".join([b"7"] * 300_000) + b"]}"))
    cases.append(("a string of 3 MiB", b'{"_id":"str","s":"' + "é".encode() * (3 << 19) + b'"}'))
    for root in (b"1", b'"x"', b"null", b"true", b"[]", b"[{}]", b"{}", b'{"_id":"ws"}  '):
        cases.append((f"root {root!r}", root))
    for value in EDGE_NUMBERS + EDGE_STRINGS:
        cases.append((f"value {value[:40]!r}", b'{"_id":"v%s","x":%s,"y":[%s],"z":{"w":%s}}'
                      % (hashlib.md5(value).hexdigest().encode(), value, value, value)))
    for doc_id in ODD_IDS:
        cases.append((f"_id {doc_id[:30]!r}", b'{"_id":%s,"k":1}' % doc_id))
    for et in EVENT_TIMES:
        cases.append((f"_event_time {et!r}",
                      b'{"_id":"et%s","_event_time":%s}' % (hashlib.md5(et).hexdigest().encode(), et)))
    cases += [("a key twice", b'{"_id":"dup1","k":1,"k":2}'), ("the _id twice", b'{"_id":"dup2","_id":"dup3"}'),
              ("a nested key twice", b'{"_id":"dup4","o":{"k":1,"k":1}}'),
              ("a key of a lone surrogate", b'{"_id":"sur","\\udc00":1}'),
              ("a byte order mark first", b'\xef\xbb\xbf{"_id":"bom"}'),
              ("a NUL key", b'{"_id":"nul","\\u0000":1}'), ("an empty key", b'{"_id":"empty","":1}')]
    return cases


@pytest.mark.parametrize("scale", SCALES)
def test_hand_made_documents_at_and_past_every_limit(request, host, tally, scale):
    """Each hand-made document (hand_made) beside a good one, in one format in turn (the
    slow run: in each, each write read back at once): its item status agrees with the
    documented rules, the good one is stored, and all read back."""
    probe = tally.client()
    store = Store(f"hx_hand_{scale}", read_each=scale > 1)
    created(probe, store.name, shards=2)
    good = b'{"_id":"good","k":1}'
    for i, (name, text) in enumerate(hand_made()):
        problems, doc = verdict(text)
        if name.endswith("before what is added"):  # the _id and _event_time the server adds pass the limit
            problems, doc = {"size"}, None
        elif len(text.strip()) > LIMITS.max_document_bytes:
            problems = problems | {"size"}
        for fmt in (FORMATS if scale > 1 else [FORMATS[i % 3]]):
            if fmt == "ndjson" and b"\n" in text:
                continue
            if fmt != "ndjson" and text.startswith(b"\xef\xbb\xbf"):  # not an array of JSON values: the body is refused
                body, ctype = body_of([text, good], fmt)
                r = probe.send("POST", store.url(fmt), content=body, headers={"Content-Type": ctype})
                if probe.expect(r, {400}, "an array holding a byte order mark") and "JSON" not in r.json()["message"]:
                    tally.fail(f"the refusal does not say the body is not JSON: {r.text[:200]}")
                continue
            store.write(probe, [text, good], fmt, expect=[(problems, doc), verdict(good)])
    store.read_all(probe)
    probe.finish()
    failures = tally.record(request, "hand-made documents at and past each limit, 3 write formats")
    assert failures == 0, "\n".join(tally.notes)


OUT_OF_RANGE = [b"-9223372036854775809", b"9223372036854775808", b"18446744073709551615", b"18446744073709551616"]
@pytest.mark.parametrize("route", [
    "array", "ndjson", "rockset", "rockset, a body the splitter does not read", "patch", "rockset patch"])
def test_an_integer_outside_64_bits_is_refused_on_every_route(request, host, tally, route):
    """The library's rule (an integer outside the signed 64-bit range is refused, per
    item) on every route that takes a value: the three write formats, Rockset's body with
    a member name the scan does not read (``d\\u0061ta``: parsed whole), and both JSON
    Patch routes. The bounds themselves are stored exactly."""
    probe = tally.client()
    name = "hx_ints_" + re.sub(r"\W", "_", route)
    created(probe, name)
    store = Store(name)
    store.write(probe, [b'{"_id":"p","x":0}'], "array")
    for n in OUT_OF_RANGE + [b"-9223372036854775808", b"9223372036854775807"]:
        refused = n in OUT_OF_RANGE
        text = b'{"_id":"i%s","x":%s,"y":[%s]}' % (n, n, n)
        if route in FORMATS:
            store.write(probe, [text], route)
            continue
        if route.startswith("rockset,"):
            r = probe.send("POST", f"/v1/orgs/self/ws/commons/collections/{name}/docs",
                           content=b'{"d\\u0061ta": [' + text + b"]}", headers={"Content-Type": "application/json"})
            if probe.expect(r, {200}, "a Rockset write parsed whole"):
                item = r.json()["data"][0]
                if (item["status"] == "ERROR") != refused:
                    tally.fail(f"{item} for {text!r}")
            continue
        op = b'[{"op":"add","path":"/x","value":%s}]' % n
        if route == "patch":
            r = probe.send("PATCH", f"/v1/collections/{name}/docs/p", content=op,
                           headers={"Content-Type": "application/json"})
            ok = probe.expect(r, {400} if refused else {200}, f"a patch adding {n.decode()}")
            if ok and refused and "64-bit" not in r.json()["message"]:
                tally.fail(f"the refusal does not name the 64-bit range: {r.text}")
        else:
            r = probe.send("PATCH", f"/v1/orgs/self/ws/commons/collections/{name}/docs",
                           content=b'{"data":[{"_id":"p","patch":%s}]}' % op,
                           headers={"Content-Type": "application/json"})
            if probe.expect(r, {200}, f"a Rockset patch adding {n.decode()}"):
                item = r.json()["data"][0]
                if (item["status"] == "ERROR") != refused or (refused and "64-bit" not in item["error"]):
                    tally.fail(f"{item} for a patch adding {n.decode()}")
        if not refused and r is not None and r.status_code == 200:
            store.acked[_key("p")] = ("p", {"_id": "p", "x": int(n)})
            store.fence = r.json()["fence" if route == "patch" else "last_offset"]
            store.caught_up(probe)
            store.read(probe, "p", {"_id": "p", "x": int(n)})
    store.read_all(probe)
    probe.finish()
    failures = tally.record(request, f"integers past 64 bits, {route}: refused per item")
    assert failures == 0, "\n".join(tally.notes)


# --------------------------------------------------------------------------- 3. SQL
SQL_COLLECTION = "hx_sql"
VALID_QUERIES = [
    "SELECT * FROM hx_sql WHERE k = 1",
    "SELECT k, COUNT(*) AS n FROM hx_sql GROUP BY k ORDER BY k",
    "SELECT s FROM hx_sql WHERE s LIKE 'v1%' LIMIT 5",
    "SELECT o.x, a FROM hx_sql WHERE ARRAY_CONTAINS(a, 3)",
    "SELECT AVG(f) AS m FROM hx_sql WHERE b = TRUE",
    "SELECT _id FROM hx_sql WHERE k IN (1, 2) AND f > 0.5 ORDER BY _id DESC LIMIT 3",
    "WITH c AS (SELECT k FROM hx_sql WHERE k > 0) SELECT COUNT(*) AS n FROM c",
    "SELECT x.k FROM hx_sql x JOIN hx_sql y ON x._id = y._id WHERE y.k = 2",
    "SELECT CASE WHEN k > 1 THEN 'hi' ELSE 'lo' END AS c FROM hx_sql",
    "SELECT k FROM hx_sql WHERE _id = :p",
    "SELECT CAST(k AS VARCHAR) || s AS t FROM hx_sql",
    "SELECT k FROM hx_sql WHERE k BETWEEN 1 AND 2 UNION ALL SELECT k FROM hx_sql WHERE k = 0",
    "SELECT k, SUM(f) OVER (PARTITION BY k) AS w FROM hx_sql",
    "SELECT COUNT(DISTINCT s) AS d FROM hx_sql WHERE s IS NOT NULL",
    "SELECT UNIX_MICROS(MAX(_event_time)) AS t FROM hx_sql",
    "SELECT * FROM (SELECT k, s FROM hx_sql) q WHERE q.k = 1",
    "SELECT k FROM hx_sql WHERE EXISTS (SELECT 1 FROM hx_sql z WHERE z.k = hx_sql.k) LIMIT 2",
    "SELECT k, MAX(f) AS m FROM hx_sql GROUP BY k HAVING COUNT(*) > 1",
    "SELECT LOWER(s) AS l, LENGTH(s) AS n FROM \"hx_sql\" WHERE NOT b",
    "SELECT * EXCLUDE (o) FROM commons.hx_sql WHERE k <> ? LIMIT 4",
]
SQL_TOKENS = (
    "SELECT FROM WHERE GROUP BY ORDER HAVING LIMIT OFFSET AS AND OR NOT IN IS NULL TRUE FALSE LIKE ILIKE BETWEEN "
    "CASE WHEN THEN ELSE END JOIN LEFT RIGHT FULL OUTER INNER CROSS ON USING UNION ALL DISTINCT WITH EXISTS CAST "
    "TRY_CAST OVER PARTITION ROWS RANGE UNNEST ARRAY STRUCT MAP INTERVAL DESC ASC NULLS FIRST LAST QUALIFY WINDOW "
    "FILTER EXCLUDE REPLACE COLUMNS LATERAL RECURSIVE VALUES INSERT UPDATE DELETE COPY ATTACH PRAGMA SET CALL "
    "INSTALL LOAD EXPORT DESCRIBE SHOW SUMMARIZE EXPLAIN PIVOT SAMPLE TABLESAMPLE INTO "
    "k s f b a o o.x _id _event_time hx_sql hx_sql.k x t nope \"k\" \"weird\"\"name\" commons.hx_sql \"hx_sql\" "
    "COUNT(*) SUM AVG MIN MAX LOWER UPPER LENGTH ABS ROUND COALESCE ARRAY_CONTAINS UNIX_MICROS TIMESTAMP_SECONDS "
    "CONCAT SUBSTRING REGEXP_MATCHES LIST_VALUE range repeat getenv read_csv version current_setting "
    "0 1 -1 42 3.14 1e400 -0.0 9223372036854775807 9223372036854775808 99999999999999999999999 0x10 .5 1e "
    "'x' '' 'it''s' ' \" $$d$$ E'\\x' DATE TIMESTAMP '2024-01-01' :p ? $1 :\"x\" @p "
    "( ) , . * ; = <> != < > <= >= + - / % || :: -> ->> [ ] { } : # ~ ^ & | -- /* */ ` \\"
).split(" ") + ["\n", "\t", "\x00", "é", "\u202e", "😀", "\ufeff"]
SQL_TOKEN = st.one_of(st.sampled_from(SQL_TOKENS), st.text(max_size=6),
                      st.integers(-(1 << 70), 1 << 70).map(str), st.text(max_size=8).map(lambda s: "'" + s + "'"))
_TOKENIZE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\d+\.?\d*|\w+|<>|!=|<=|>=|\|\||::|->|\S")
JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
                                 st.floats(allow_nan=False, allow_infinity=False),
                                 st.text(max_size=10)),
                       lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
                       max_leaves=6)


@st.composite
def mutated(draw) -> str:
    """A valid query with one token deleted, duplicated, swapped with another, replaced or inserted."""
    tokens = _TOKENIZE.findall(draw(st.sampled_from(VALID_QUERIES)))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(tokens) - 1))
        how = draw(st.sampled_from(["delete", "duplicate", "swap", "replace", "insert"]))
        if how == "delete" and len(tokens) > 1:
            del tokens[i]
        elif how == "duplicate":
            tokens.insert(i, tokens[i])
        elif how == "swap":
            j = draw(st.integers(0, len(tokens) - 1))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif how == "replace":
            tokens[i] = draw(SQL_TOKEN)
        else:
            tokens.insert(i, draw(SQL_TOKEN))
    return " ".join(tokens)


FLAT = {"CTEs", "a long name", "UNION chain", "comments"}  # long, not deep: they may run


def deep_queries(long: int) -> list[tuple[str, str]]:
    """(name, SQL) of nesting past the documented limits (docs/sql.md, "Safety"), of every
    construct sqlglot's parser recurses into, and of flat chains ``long`` terms long (past
    the parsed tree's limit; the parser reads a chain whole before it is refused)."""
    n = 300
    out = [
        ("parentheses", "SELECT " + "(" * 33 + "1" + ")" * 33 + " AS x FROM hx_sql"),
        ("parentheses 10,000", "SELECT " + "(" * 10_000 + "1" + ")" * 10_000),
        ("unclosed parentheses", "SELECT " + "(" * 40_000),
        ("subqueries", "SELECT * FROM " + "(SELECT * FROM " * 40 + "hx_sql" + ")" * 40),
        ("OR chain", "SELECT * FROM hx_sql WHERE " + " OR ".join(["k = 1"] * long)),
        ("+ chain", "SELECT " + " + ".join(["1"] * long)),
        ("|| chain", "SELECT " + " || ".join(["'a'"] * long)),
        ("UNION chain", " UNION ALL ".join(["SELECT 1 AS x"] * (long // 4))),
        ("NOT", "SELECT " + "NOT " * long + "TRUE"),
        ("NOT 300", "SELECT " + "NOT " * n + "TRUE"),
        ("minus", "SELECT " + "- " * long + "1"),
        ("plus", "SELECT " + "+ " * long + "1"),
        ("tilde", "SELECT " + "~ " * long + "1"),
        ("CASE", "SELECT " + "CASE WHEN TRUE THEN " * n + "1" + " END" * n),
        ("CASE ELSE", "SELECT " + "CASE WHEN FALSE THEN 0 ELSE " * n + "1" + " END" * n),
        ("arrays", "SELECT " + "[" * n + "1" + "]" * n),
        ("structs", "SELECT " + "{'a': " * n + "1" + "}" * n),
        ("subscripts", "SELECT a" + "[1]" * long + " FROM hx_sql"),
        ("STRUCT types", "SELECT CAST(NULL AS " + "STRUCT<a " * n + "INT" + ">" * n + ")"),
        ("MAP types", "SELECT CAST(NULL AS " + "MAP<INT, " * long + "INT" + ">" * long + ")"),
        ("array types", "SELECT CAST(NULL AS INT" + "[]" * long + ")"),
        ("INTERVAL", "SELECT " + "INTERVAL " * n + "1 DAY"),
        ("casts", "SELECT 1" + "::INT" * long),
        ("IS NULL", "SELECT k" + " IS NULL" * long + " FROM hx_sql"),
        ("arrows", "SELECT o" + "->'x'" * long + " FROM hx_sql"),
        ("lambdas", "SELECT list_transform([1], " + "x -> " * long + "1)"),
        ("dots", "SELECT o" + ".x" * long + " FROM hx_sql"),
        ("function calls", "SELECT " + "abs(" * n + "1" + ")" * n),
        ("NOT (", "SELECT " + "NOT (" * n + "TRUE" + ")" * n),
        ("CTEs", "WITH " + ", ".join(f"t{i} AS (SELECT * FROM {'hx_sql' if i == 0 else f't{i - 1}'})"
                                     for i in range(long // 8)) + f" SELECT COUNT(*) AS n FROM t{long // 8 - 1}"),
        ("comments", "SELECT 1 " + "/*" * long + "x" + "*/" * long),
        ("max_sql_chars", "SELECT * FROM hx_sql WHERE k IN (" + ",".join(["1"] * 60_000) + ")"),
        ("a long name", 'SELECT "' + "n" * 90_000 + '" FROM hx_sql'),
    ]
    return out


def _seed_sql(probe: Probe) -> None:
    created(probe, SQL_COLLECTION, shards=2)
    docs = [{"_id": i, "k": i % 3, "s": f"v{i}", "f": i / 7, "b": i % 2 == 0, "a": [i, i + 1, 3], "o": {"x": i}}
            for i in range(40)]
    r = probe.send("POST", f"/v1/collections/{SQL_COLLECTION}/docs", json=docs)
    assert r is not None and r.status_code == 200, r and r.text


def query(probe: Probe, sql: str, parameters: Any = None, rockset: bool = False,
          min_fence: str | None = None) -> httpx.Response | None:
    if rockset:
        return probe.send("POST", "/v1/orgs/self/queries",
                          json={"sql": {"query": sql, "parameters": parameters, "timeout_ms": QUERY_MS}})
    body: dict[str, Any] = {"sql": sql, "timeout_ms": QUERY_MS if min_fence is None else 30_000}
    if parameters is not None:
        body["parameters"] = parameters
    if min_fence is not None:
        body["min_fence"] = min_fence
    return probe.send("POST", "/v1/query", json=body)


QUERY_STATUSES = {200, 400, 404, 408, 413}
ROCKSET_TYPES = st.one_of(st.sampled_from(["int", "float", "bool", "string", "timestamp", "INT", "nope"]), JSONISH)


@pytest.mark.parametrize("scale", SCALES)
def test_sql_token_soups_mutations_and_deep_nesting(request, host, tally, scale):
    """Random sequences of SQL keywords, names, literals and punctuation; valid queries
    with tokens deleted, duplicated, swapped, replaced or inserted; nesting past the
    documented limits of every construct that recurses: each a 2xx or a 4xx naming the
    problem (past a nesting limit: the limit), on both query routes, with hostile
    parameters."""
    probe = tally.client()
    _seed_sql(probe)
    for name, sql in deep_queries(600 if scale == 1 else 5_000):
        r = query(probe, sql)
        if probe.expect(r, {200, 400} if name in FLAT else {400, 413}, f"nesting: {name}") and name not in FLAT:
            message = r.json()["message"]
            if r.status_code == 400 and not re.search(r"deep|max_sql_chars", message):
                tally.fail(f"nesting {name}: the refusal does not name the limit: {message[:200]}")

    @given(st.one_of(st.lists(SQL_TOKEN, min_size=1, max_size=30).map(" ".join),
                     st.lists(SQL_TOKEN, min_size=1, max_size=30).map(lambda t: "SELECT " + " ".join(t)),
                     st.lists(SQL_TOKEN, min_size=1, max_size=40).map("".join),
                     mutated()),
           st.one_of(st.none(), st.dictionaries(st.sampled_from(["p", "x", ""]), JSONISH, max_size=2),
                     st.lists(JSONISH, max_size=2), JSONISH),
           st.integers(0, 3), st.lists(st.tuples(st.sampled_from(["p", "x", ""]), ROCKSET_TYPES, JSONISH), max_size=2))
    @_settings(150 * scale)
    def soup(sql, parameters, route, rockset_parameters):
        if route == 3:  # Rockset's route: parameters as [{"name", "type", "value"}]
            r = query(probe, sql, [{"name": n, "type": t, "value": v} for n, t, v in rockset_parameters], rockset=True)
        else:
            r = query(probe, sql, parameters)
        probe.expect(r, QUERY_STATUSES, "a generated query")

    soup()
    probe.finish()
    failures = tally.record(request, "SQL token soups, mutated queries, deep nesting: 2xx or 4xx")
    assert failures == 0, "\n".join(tally.notes)


def test_a_costly_query_text_does_not_stall_the_other_requests(request, host, tally):
    """A query of nearly max_sql_chars whose parse is slow (an OR chain, refused once
    parsed; any read key may send one) does not stall the query process: /healthz, asked
    meanwhile on another connection, answers within a second."""
    aside = Tally(host)  # (what the thread sending the costly query counts, added at the end)
    slow, probe = aside.client(), tally.client()
    tally.probes.append(slow)  # (closed with the test's own)
    sql = "SELECT * FROM hx_stall WHERE " + " OR ".join(["k = 1"] * ((LIMITS.max_sql_chars - 40) // 9))
    replies: list = []
    thread = threading.Thread(target=lambda: replies.append(query(slow, sql)))
    thread.start()
    waits = []
    while thread.is_alive():
        t0 = time.monotonic()
        probe.expect(probe.send("GET", "/healthz"), {200}, "health while a costly query is parsed")
        waits.append(time.monotonic() - t0)
        time.sleep(0.05)
    thread.join()
    slow.expect(replies[0], {400, 404, 408}, "a costly query")
    if max(waits) > 1.0:
        tally.fail(f"/healthz waited {max(waits):.1f} s while a query was parsed")
    slow.finish()
    probe.finish()
    tally.add(aside)
    failures = tally.record(request, "a costly query text: the other requests are answered meanwhile")
    assert failures == 0, "\n".join(tally.notes)


# --------------------------------------------------------------------------- 4. DuckDB escapes
ESCAPE_COLLECTION = "hx_esc"
TABLE_CONTEXTS = ["SELECT * FROM {}", "FROM {}", "SELECT * FROM hx_esc WHERE k IN (SELECT * FROM {})",
                  "WITH c AS (SELECT * FROM {}) SELECT * FROM c", "SELECT (SELECT COUNT(*) FROM {}) AS n",
                  "SELECT * FROM hx_esc JOIN {} ON TRUE", "SELECT k FROM hx_esc UNION ALL SELECT * FROM {}",
                  "SELECT * FROM (SELECT * FROM {}) s"]
SCALAR_CONTEXTS = ["SELECT {} AS v", "SELECT {} AS v FROM hx_esc", "SELECT k FROM hx_esc WHERE s = {}",
                   "WITH c AS (SELECT {} AS v) SELECT v FROM c", "SELECT k FROM hx_esc WHERE k IN (SELECT {})",
                   "SELECT k FROM hx_esc ORDER BY {}",
                   "SELECT k, COUNT(*) AS n FROM hx_esc GROUP BY k HAVING MAX({}) > ''",
                   "SELECT * FROM (SELECT {} AS v) s"]


def escapes(host: Host, written: dict[str, str], every_context: bool) -> list[str]:
    """Queries that try to reach files, the network, the environment, settings or
    extensions, at the top level and inside subqueries and CTEs (``every_context``: each
    payload in every context, else tables in one and scalars in two, in turn)."""
    files = ["/etc/passwd", str(host.parent / "canary.csv"), str(host.tmp_canary),
             str(host.data / "_server" / "api_keys.json"), "/proc/self/environ", str(host.parent), "/etc/*",
             "http://127.0.0.1:9/x.csv", "https://example.com/x.parquet", "s3://bucket/x.parquet"]
    tables = ["duckdb_settings()", "duckdb_extensions()", "duckdb_secrets()", "duckdb_databases()",
              "pragma_database_list()", "range(3)", "information_schema.tables", "duckdb_temporary_files()",
              "which_secret('s3://x', 's3')", "system.main.duckdb_settings()", "main.hx_esc"]
    for f in files:
        q = f.replace("'", "''")
        tables += [f"read_csv('{q}')", f"read_csv_auto('{q}')", f"read_text('{q}')", f"read_blob('{q}')",
                   f"read_json('{q}')", f"read_json_auto('{q}')", f"read_ndjson_objects('{q}')", f"read_parquet('{q}')",
                   f"parquet_scan('{q}')", f"glob('{q}')", f"'{q}'", f'"{f}"', f"sniff_csv('{q}')",
                   f"query('SELECT * FROM read_csv(''{q}'')')", f"query_table('{q}')", f"read_csv(['{q}'])",
                   f"read_csv('{q}', header = false, sep = '|')", f'"read_csv"(\'{q}\')', f"main.read_text('{q}')"]
    env = ENV_CANARY
    scalars = [f"getenv('{env}')", f"\"getenv\"('{env}')", f"main.getenv('{env}')", f"'{env}'.getenv()",
               f"GETENV('{env}')", "getenv('HOME')", "current_setting('home_directory')",
               "current_setting('temp_directory')", "current_setting('allowed_paths')",
               "current_setting('enable_external_access')", "getvariable('x')",
               "(SELECT content FROM read_text('/etc/passwd'))", f"list_transform([1], x -> getenv('{env}'))",
               "to_json(getenv('PATH'))", f"concat('', getenv('{env}'))",
               f"(SELECT token FROM read_csv('{files[1]}'))", "(SELECT MAX(value) FROM duckdb_settings())",
               f"[getenv('{env}') FOR x IN [1]]", "json_execute_serialized_sql('x')",
               f"CAST(getenv('{env}') AS VARCHAR)"]
    w = {k: v.replace("'", "''") for k, v in written.items()}
    out = [f"COPY (SELECT 1 AS x) TO '{w['csv']}'", f"COPY hx_esc TO '{w['tmp']}' (FORMAT CSV)",
           f"EXPORT DATABASE '{w['dir']}'", f"IMPORT DATABASE '{w['dir']}'", f"ATTACH '{w['db']}' AS x",
           "ATTACH ':memory:' AS m", "DETACH x", "INSTALL httpfs", "LOAD httpfs", f"LOAD '{w['csv']}'",
           "FORCE INSTALL httpfs FROM 'http://127.0.0.1:9'", "SET enable_external_access = true",
           "SET disabled_filesystems = ''", "SET lock_configuration = false", "RESET lock_configuration",
           "SET GLOBAL memory_limit = '1TB'", "PRAGMA enable_profiling", "PRAGMA database_list", "PRAGMA version",
           "CALL pragma_version()", "CALL duckdb_settings()", "CHECKPOINT", "VACUUM", "USE x",
           f"CREATE TABLE t AS SELECT * FROM read_csv('{files[0]}')",
           "CREATE SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')",
           "CREATE MACRO m(x) AS x", "INSERT INTO hx_esc VALUES (1)", "DELETE FROM hx_esc", "DROP TABLE hx_esc",
           "UPDATE hx_esc SET k = 1", f"SELECT 1; COPY (SELECT 1) TO '{w['csv']}'",
           f"SELECT 1; ATTACH '{w['db']}' AS y",
           "SELECT 1; SET enable_external_access = true", f"EXPLAIN SELECT * FROM read_csv('{files[0]}')",
           "SUMMARIZE hx_esc", "DESCRIBE hx_esc", "SHOW TABLES", "SHOW ALL TABLES",
           f"SELECT * FROM hx_esc; SELECT * FROM read_text('{files[0]}')",
           f"WITH x AS (COPY (SELECT 1) TO '{w['csv']}') SELECT 1", f"COPY (SELECT getenv('{env}')) TO '{w['tmp']}'",
           f"SELECT * FROM hx_esc WHERE k = 1 INTO OUTFILE '{w['csv']}'"]
    for i, t in enumerate(tables):
        chosen = TABLE_CONTEXTS if every_context else [TABLE_CONTEXTS[i % 8]]
        out += [c.format(t) for c in chosen]
    for i, s in enumerate(scalars):
        chosen = SCALAR_CONTEXTS if every_context else [SCALAR_CONTEXTS[i % 8], SCALAR_CONTEXTS[(i + 5) % 8]]
        out += [c.format(s) for c in chosen]
    return out


def _variants(sql: str, scale: int) -> list[str]:
    """The query as written (the default run), or two other spellings of it (the slow run:
    other whitespace or comments, and keywords in lower case)."""
    if scale == 1:
        return [sql]
    return [sql.replace(" ", "\n\t ") if len(sql) % 2 else "/* x */ " + sql + " -- y",
            re.sub(r"\b([A-Z]+)\b", lambda m: m.group().lower(), sql)]


@pytest.mark.parametrize("scale", SCALES)
def test_duckdb_escape_attempts_are_refused(request, host, tally, scale):
    """Files (the canaries, /etc/passwd, the key file, /proc/self/environ), the network,
    the environment, settings and extensions, reached for through /v1/query and Rockset's
    route, at the top level and inside subqueries and CTEs, and through parameters: each
    refused with a 4xx; no file written anywhere they name, none added beside the data
    directory, no canary in any reply."""
    probe = tally.client()
    created(probe, ESCAPE_COLLECTION)
    probe.send("POST", f"/v1/collections/{ESCAPE_COLLECTION}/docs",
               json=[{"_id": i, "k": i, "s": "x"} for i in range(3)])
    tag = secrets.token_hex(4)
    written = {"csv": str(host.parent / f"escape-{tag}.csv"), "tmp": f"/tmp/rtindex-escape-{tag}.csv",
               "dir": str(host.parent / f"exported-{tag}"), "db": str(host.parent / f"attached-{tag}.db")}
    before = listing(host.parent, host.data)
    for i, sql in enumerate(escapes(host, written, every_context=scale > 1)):
        for variant in _variants(sql, scale):
            r = query(probe, variant, rockset=i % 4 == 3)
            probe.expect(r, {400, 404, 408, 413}, "an escape attempt")
    for sql, params in [("SELECT * FROM read_csv(:f)", {"f": "/etc/passwd"}),
                        ("SELECT getenv(:e) AS v", {"e": ENV_CANARY}),
                        ("SELECT * FROM hx_esc WHERE s = :f", {"f": "/etc/passwd"}),
                        ("SELECT * FROM ?", ["/etc/passwd"]),
                        ("SELECT current_setting(?) AS v", ["home_directory"])]:
        r = query(probe, sql, params)
        ran = probe.expect(r, {200, 400, 404}, "a parameter naming a file") and r.status_code == 200
        if ran and "hx_esc" not in sql:
            tally.fail(f"ran: {sql} with {params}: {r.text[:200]}")
    for path in written.values():
        if os.path.exists(path):
            tally.fail(f"an escape attempt wrote {path}")
    after = listing(host.parent, host.data)
    if after != before:
        tally.fail(f"files appeared beside the data directory: {sorted(after - before)[:5]}")
    probe.finish()
    failures = tally.record(request, "DuckDB escape attempts: refused, nothing written, no canary")
    assert failures == 0, "\n".join(tally.notes)


# --------------------------------------------------------------------------- 5. path traversal
_PART = r"[A-Za-z_][A-Za-z0-9_\-]{0,127}"
_VALID_NAME = re.compile(rf"(?:{_PART})(?:\.{_PART})?")


def valid_name(name: str) -> bool:
    """The documented rule for a collection name (docs/reference.md, create_collection)."""
    return bool(_VALID_NAME.fullmatch(name)) and len(name) <= 240 and not name.startswith("commons.")


def hostile_names(host: Host) -> list[str]:
    """Names that try to leave the data directory, or are otherwise not names. (A name
    ending in a line break: test_a_collection_name_ending_in_a_line_break_is_refused.)"""
    return ["..", ".", "../x", "../../etc", "..%2fx", "%2e%2e", "%2e%2e%2fx", "a/b", "/etc/passwd", "/tmp/x",
            "\\..\\x", "..\\x", "x" * 300, "x" * 129, "a" * 120 + "." + "b" * 125, "a\x00b", "\x00", "é", "名前",
            "a b", "a\nb", "a\tb", "\r", "x.y.z", "ws.", ".x", "commons.x", "", " ", "a%00b", "%", "%25", "?",
            "#", "~", "$HOME", "`id`", "a;b", "'a'", '"a"', "\u202e", "\ufeffa", "a\u0301", "ａ", "-x", "0a",
            "../" + host.data.name, str(host.data), str(host.parent) + "/evil", "x/../../y", "...", "....",
            "CON", "_server", "collections", "a-b_c", "ws.c"]


@pytest.mark.parametrize("scale", SCALES)
def test_path_traversal_in_collection_names(request, host, tally, scale):
    """Each hostile name on create (both APIs, and as Rockset's workspace), write (URL
    percent-encoded, and as the raw request target), read, patch, query and drop: a name
    outside the documented rule is refused with a 4xx, and nothing is made outside the
    data directory (the listing of its parent is unchanged; the collections directory
    holds only valid names)."""
    probe = tally.client()
    names = hostile_names(host)
    before = listing(host.parent, host.data)
    absent = [n for n in names if n.startswith("/") and not os.path.exists(n)]
    for turn, name in enumerate(names):
        check_name(probe, name, every_route=scale > 1, turn=turn)
    if scale > 1:
        @given(st.lists(st.one_of(st.text(max_size=10), st.sampled_from(["..", "/", "\\", "%2e", "%2f", ".", "\x00"])),
                        min_size=1, max_size=6).map("".join))
        @_settings(20 * scale)
        def generated(name):
            if not name.endswith(("\n", "\r")):
                check_name(probe, name)

        generated()
    after = listing(host.parent, host.data)
    if after != before:
        tally.fail(f"made outside the data directory: {sorted(after - before)[:5]}")
    for n in absent:
        if os.path.exists(n):
            tally.fail(f"made {n}")
    for entry in os.listdir(host.data / "collections"):
        if entry != ".wake" and not valid_name(entry):
            tally.fail(f"a collection directory of an invalid name: {entry!r}")
    probe.finish()
    failures = tally.record(request, "path traversal in collection names: 4xx, nothing made outside")
    assert failures == 0, "\n".join(tally.notes)


NAMED_ROUTES = (("POST", "/v1/collections/{}/docs", {"json": [{"_id": "t"}]}),
                ("GET", "/v1/collections/{}/docs/t", {}),
                ("PATCH", "/v1/collections/{}/docs/t", {"json": [{"op": "add", "path": "/x", "value": 1}]}),
                ("DELETE", "/v1/collections/{}/docs/t", {}),
                ("POST", "/v1/orgs/self/ws/commons/collections/{}/docs", {"json": {"data": [{"_id": "t"}]}}),
                ("POST", "/v1/orgs/self/ws/{}/collections/c/docs", {"json": {"data": [{"_id": "t"}]}}))


def check_name(probe: Probe, name: str, every_route: bool = True, turn: int = 0) -> None:
    """The routes that take a collection name, given ``name``: every one, or (not
    ``every_route``) the creates, the query, the drop and two of NAMED_ROUTES, by ``turn``."""
    valid = valid_name(name)
    made = set()
    for url, body in (("/v1/collections", {"name": name, "shards": 1}),
                      ("/v1/orgs/self/ws/commons/collections", {"name": name, "shards": 1})):
        r = probe.send("POST", url, json=body)
        if probe.expect(r, {200, 201, 409} if valid else range(400, 500), f"create {name!r}") and r.status_code < 300:
            made.add(name)
    ws_valid = name == "commons" or valid_name(f"{name}.c")
    r = probe.send("POST", f"/v1/orgs/self/ws/{quote(name, safe='')}/collections", json={"name": "c", "shards": 1})
    if probe.expect(r, {200, 409} if ws_valid else range(400, 500), f"create c in workspace {name!r}") \
            and r.status_code == 200:
        made.add(f"{name}.c")
    encodings = [quote(name, safe="")]
    raw = name.encode("utf-8", "surrogatepass")
    # the name as it is in the request line; one with a dot segment (.., .) is
    # test_a_path_with_dot_segments_reaches_only_the_route_it_was_checked_for's
    if re.fullmatch(rb"[\x21-\x7e]+", raw) and not {".", ".."} & set(name.split("/")):
        encodings.append(None)
    for enc in encodings:
        def target(path: str) -> dict:
            if enc is not None:
                return {}
            return {"target": path.replace("{}", "\0").encode().replace(b"\0", raw)}

        for method, path, kw in (NAMED_ROUTES if every_route else NAMED_ROUTES[turn % 3::3]):
            url = path.format(enc if enc is not None else "placeholder")
            sent = unquote(path.format(enc)) if enc is not None else target(path)["target"].decode("latin-1")
            if re.split(r"[?#]", sent)[0].endswith("/"):
                continue  # test_a_path_ending_in_a_slash_is_answered_not_redirected's
            r = probe.send(method, url, **kw, **target(path))
            exists = (name in made and "/ws/{}" not in path) or (f"{name}.c" in made and "/ws/{}" in path)
            probe.expect(r, range(200, 500) if exists else range(400, 500), f"{method} {path} of {name!r}")
    r = query(probe, 'SELECT COUNT(*) AS n FROM "' + name.replace('"', '""') + '"')
    probe.expect(r, {200} if name in made else {400, 404, 408, 413}, f"a query of {name!r}")
    for m in made:
        r = probe.send("DELETE", f"/v1/collections/{quote(m, safe='')}")
        probe.expect(r, {200}, f"drop {m!r}")
    if not made and name and not name.endswith("/"):  # (a path ending in a slash, decoded:
        # test_a_path_ending_in_a_slash_is_answered_not_redirected)
        r = probe.send("DELETE", f"/v1/collections/{quote(name, safe='')}")
        probe.expect(r, range(400, 500), f"drop {name!r}")


def test_a_collection_name_ending_in_a_line_break_is_refused(request, host, tally):
    """``{"name": "abc\\n"}`` on both create routes: a 400, and no collection made."""
    probe = tally.client()
    for url in ("/v1/collections", "/v1/orgs/self/ws/commons/collections"):
        name = f"hx_nl_{len(url)}\n"
        r = probe.send("POST", url, json={"name": name, "shards": 1})
        probe.expect(r, {400}, f"create {name!r}")
    for entry in os.listdir(host.data / "collections"):
        if entry.startswith("hx_nl_"):
            tally.fail(f"made the collection directory {entry!r}")
    probe.finish()
    failures = tally.record(request, "a collection name ending in a line break: refused")
    assert failures == 0, "\n".join(tally.notes)


def test_a_path_with_dot_segments_reaches_only_the_route_it_was_checked_for(request, host, tally):
    """``DELETE /v1/collections/x/docs/../../victim`` with a write key is a document
    delete (the role it was checked for), never a drop of ``victim`` (admin); a relayed
    write whose path has dot segments is refused with a 4xx in the error shape."""
    admin = tally.client()
    created(admin, "hx_victim")
    writer = tally.client(make_key(admin, "write"))
    r = writer.send("DELETE", "/placeholder", target=b"/v1/collections/x/docs/../../hx_victim")
    writer.expect(r, range(400, 500), "a write key's delete with dot segments")
    for method, target in (("POST", b"/v1/collections/../docs"), ("POST", b"/v1/collections/./docs"),
                           ("PATCH", b"/v1/collections/hx_victim/docs/../../../v1/orgs/self/ws/commons/collections/x"
                                     b"/docs"),
                           ("DELETE", b"/v1/collections/hx_victim/docs/a/../b")):
        r = admin.send(method, "/placeholder", target=target, json=[{"_id": 1}])
        admin.expect(r, range(400, 500), f"{method} {target!r}")
    time.sleep(1)  # a drop reaches the query process's list within its follow interval
    names = [c["name"] for c in admin.send("GET", "/v1/collections").json()["collections"]]
    if "hx_victim" not in names:
        tally.fail("a write key dropped a collection through a path with dot segments")
    admin.finish()
    writer.finish()
    failures = tally.record(request, "paths with dot segments: only the route whose role was checked")
    assert failures == 0, "\n".join(tally.notes)


def test_a_path_ending_in_a_slash_is_answered_not_redirected(request, host, tally):
    """An empty collection name (``DELETE /v1/collections/``), or a name whose ``?`` or
    ``#`` ends the path there: a 4xx in the error shape, not a redirect."""
    probe = tally.client()
    for method, target in (("DELETE", b"/v1/collections/"), ("GET", b"/v1/collections/"),
                           ("PATCH", b"/v1/collections/?/docs/t"), ("POST", b"/v1/collections/#/docs")):
        r = probe.send(method, "/placeholder", target=target, json=[{"_id": 1}])
        probe.expect(r, range(400, 500), f"{method} {target!r}")
    probe.finish()
    failures = tally.record(request, "paths ending in a slash: answered, not redirected")
    assert failures == 0, "\n".join(tally.notes)


# --------------------------------------------------------------------------- 6. keys
KEYED_ROUTES = [("GET", "/v1/collections", None), ("POST", "/v1/query", {"sql": "SELECT 1 AS x"}),
                ("POST", "/v1/collections/hx_auth/docs", [{"_id": 1}]),
                ("POST", "/v1/collections", {"name": "hx_auth2"}),
                ("GET", "/v1/keys", None), ("GET", "/metrics", None), ("DELETE", "/v1/keys/k_000000000000", None),
                ("GET", "/v1/collections/hx_auth/docs/1", None),
                ("POST", "/v1/orgs/self/queries", {"sql": {"query": "SELECT 1"}})]
ROLE_OF = {"/v1/collections/hx_auth/docs": "write", "/v1/keys": "admin", "/v1/keys/k_000000000000": "admin"}


def denied_headers(admin: str, revoked: str) -> list[tuple[str, dict, dict]]:
    """(what, headers, query parameters) that must not pass as a key."""
    unknown = "rtk_" + base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    out = [("no key", {}, {}), ("the scheme alone", {"Authorization": "ApiKey"}, {}),
           ("Bearer alone", {"Authorization": "Bearer"}, {}),
           ("an unknown key", {"Authorization": f"ApiKey {unknown}"}, {}),
           ("a revoked key", {"Authorization": f"ApiKey {revoked}"}, {}),
           ("Basic", {"Authorization": "Basic " + base64.b64encode(f"admin:{admin}".encode()).decode()}, {}),
           ("Digest", {"Authorization": f"Digest {admin}"}, {}),
           ("a key and more", {"Authorization": f"ApiKey {admin}x"}, {}),
           ("a key cut short", {"Authorization": f"ApiKey {admin[:-1]}"}, {}),
           ("a key in capitals", {"Authorization": f"ApiKey {admin.upper()}"}, {}),
           ("a tab for a space", {"Authorization": f"ApiKey\t{admin}"}, {}),
           ("the key twice", {"Authorization": f"ApiKey {admin} {admin}"}, {}),
           ("a 64 KiB key", {"Authorization": "ApiKey " + "k" * (64 << 10)}, {}),
           ("a 1 MiB key", {"Authorization": "ApiKey " + "k" * (1 << 20)}, {}),
           ("a UTF-8 key", {"Authorization": "ApiKey ключ😀".encode()}, {}),
           ("a Latin-1 key", {"Authorization": b"ApiKey " + admin.encode() + b"\xff"}, {}),
           ("the key's hash", {"Authorization": "ApiKey " + hashlib.sha256(admin.encode()).hexdigest()}, {}),
           ("the key as a cookie", {"Cookie": f"Authorization=ApiKey {admin}; api_key={admin}"}, {}),
           ("the key in X-Api-Key", {"X-Api-Key": admin, "Api-Key": admin}, {}),
           ("the key in Proxy-Authorization", {"Proxy-Authorization": f"ApiKey {admin}"}, {})]
    for p in ("api_key", "apikey", "key", "token", "access_token", "Authorization"):
        value = admin if p != "Authorization" else f"ApiKey {admin}"
        out.append((f"the key in the query string as {p}", {}, {p: value}))
    return out


def raw_requests(admin: bytes) -> list[tuple[str, bytes]]:
    """(what, bytes) of key headers no HTTP client would send."""
    get = b"GET /v1/collections HTTP/1.1\r\nHost: x\r\n"
    return [("a NUL in the key", get + b"Authorization: ApiKey " + admin + b"\x00\r\n\r\n"),
            ("an empty key", get + b"Authorization: ApiKey \r\n\r\n"),
            ("a bare CR", get + b"Authorization: ApiKey " + admin + b"\rX: y\r\n\r\n"),
            ("no colon", get + b"Authorization ApiKey " + admin + b"\r\n\r\n"),
            ("a folded header", get + b"Authorization: ApiKey\r\n " + admin + b"\r\n\r\n"),
            ("a 200 KiB header", get + b"Authorization: ApiKey " + b"k" * (200 << 10) + b"\r\n\r\n"),
            ("20,000 headers", get + b"".join(b"X-%d: v\r\n" % i for i in range(20_000)) + b"\r\n"),
            ("a UTF-8 header name", get + "Authorizätion: ApiKey ".encode() + admin + b"\r\n\r\n"),
            ("the key in the request line", b"GET /v1/collections?api_key=" + admin + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
            ("a key of control characters", get + b"Authorization: ApiKey \x01\x02\x1b[2J\r\n\r\n"),
            ("HTTP/9.9", b"GET /v1/collections HTTP/9.9\r\nHost: x\r\n\r\n"),
            ("a TLS hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64)]


@pytest.mark.parametrize("scale", SCALES)
def test_hostile_key_headers_are_refused(request, host, tally, scale):
    """No key, malformed, unknown, revoked, oversized and misplaced keys (query string,
    cookie, other headers) on routes of every role: 401; keys of a lower role: 403;
    malformed HTTP: a 4xx; never a 5xx, a pass or a leak."""
    admin = tally.client()
    created(admin, "hx_auth")
    keys = {role: make_key(admin, role) for role in ("read", "write")}
    r = admin.send("POST", "/v1/keys", json={"role": "admin", "name": "hostile revoked"})
    revoked = r.json()
    admin.send("DELETE", f"/v1/keys/{revoked['id']}")
    deadline = time.monotonic() + 10
    anyone = tally.client(None)
    gone = {"Authorization": f"ApiKey {revoked['key']}"}
    while anyone.send("GET", "/v1/collections", headers=gone).status_code != 401:
        assert time.monotonic() < deadline, "a revoked key still works"
        time.sleep(0.2)
    cases = denied_headers(host.served.admin_key, revoked["key"])
    for n, (method, path, body) in enumerate(KEYED_ROUTES):
        for i, (what, headers, params) in enumerate(cases):
            if scale == 1 and i % len(KEYED_ROUTES) not in (n, (n + 4) % len(KEYED_ROUTES)):
                continue  # the default run: each on two routes, in turn
            r = anyone.send(method, path, json=body, headers=headers, params=params or None)
            anyone.expect(r, {401}, f"{what} on {method} {path}")
        need = ROLE_OF.get(path, "admin" if (method, path) == ("POST", "/v1/collections") else "read")
        for role, key in keys.items():
            for scheme in ("ApiKey", "Bearer", "apikey"):
                r = anyone.send(method, path, json=body, headers={"Authorization": f"{scheme} {key}"})
                allowed = ["read", "write", "admin"].index(role) >= ["read", "write", "admin"].index(need)
                anyone.expect(r, range(200, 500) if allowed else {403}, f"a {role} key on {method} {path}")
                if r is not None and allowed and r.status_code in (401, 403):
                    tally.fail(f"a {role} key refused on {method} {path}: {r.text[:200]}")
    for what, data in raw_requests(host.served.admin_key.encode()):
        got = tally.raw(data, what)
        if got is not None and not 400 <= got[0] < 500:
            tally.fail(f"{what}: {got[0]} {got[1][:200]!r}")
    if scale > 1:
        @given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                         st.sampled_from([b"ApiKey ", b"Bearer ", b"apikey  "]).flatmap(
                             lambda s: st.binary(max_size=80).map(lambda b: s + b))))
        @_settings(40 * scale)
        def generated(value):
            value = value.strip(b" \t")
            if not value or re.search(rb"[\x00-\x08\x0a-\x1f\x7f]", value):
                return  # a control character: no client sends it (raw_requests has the server's answer)
            r = anyone.send("GET", "/v1/collections", headers={"Authorization": value})
            anyone.expect(r, {401}, f"Authorization: {value[:80]!r}")

        generated()
    admin.finish()
    anyone.finish()
    failures = tally.record(request, "hostile key headers: 401/403, never 5xx")
    assert failures == 0, "\n".join(tally.notes)


def test_a_key_request_that_is_not_an_object_is_answered_in_the_error_shape(request, host, tally):
    """``POST /v1/keys`` with ``[]``, ``1`` or text that is not JSON: a 400 in the one
    error shape of docs/service.md, like every other route's."""
    probe = tally.client()
    for body in (b"[]", b"1", b"null", b"{not json"):
        r = probe.send("POST", "/v1/keys", content=body, headers={"Content-Type": "application/json"})
        if probe.expect(r, {400}, f"a key request of {body!r}") and "detail" in r.json():
            tally.fail(f"not the error shape: {r.text}")
    probe.finish()
    failures = tally.record(request, "POST /v1/keys with a body that is not an object: the error shape")
    assert failures == 0, "\n".join(tally.notes)
