"""What ``rtindex serve`` is configured with, passed to every process it starts."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, field, fields


@dataclass
class Limits:
    """Bounds on what one request may ask for; each refusal names the limit it hit."""

    max_body_bytes: int = 64 << 20  # one write request's body
    max_docs_per_request: int = 100_000
    max_document_bytes: int = 4 << 20  # one document (an NDJSON line, an array element)
    max_depth: int = 64  # nesting of one document
    max_sql_chars: int = 100_000
    default_query_ms: int = 30_000  # timeout_ms when a query gives none
    max_query_ms: int = 300_000  # the most timeout_ms may ask for
    max_result_rows: int = 100_000
    max_result_bytes: int = 64 << 20
    max_inflight_write_bytes: int = 256 << 20  # write bodies being received or ingested at once


@dataclass
class ServerConfig:
    data: str
    host: str = "127.0.0.1"
    port: int = 8000
    query_workers: int = 1
    max_concurrent_queries: int = 4  # per query process
    # per query process; None: as many as max_concurrent_queries, so that a query admitted
    # under overload waits about as long as one runs, not many times that (queue_depth)
    max_queued_queries: int | None = None
    queue_timeout_ms: int = 1_000  # a queued query that waits longer gets 429
    # a share of queries is refused while the query process's event loop runs this late
    # (server/shedding.py LoopLag); 0: never
    max_loop_lag_ms: float = 1.0
    # seconds an idle keep-alive connection stays open: longer than common clients keep idle
    # connections in their pools (Go's net/http among them), so the client closes first and
    # never sends a request on a connection the server is closing at that moment
    keep_alive_timeout_s: int = 120
    auth: bool = True
    demo: bool = False
    # a Ray cluster's address: the collections are the cluster's (rtindex.open_cluster), and
    # ``data`` keeps only the service's own state (API keys, metrics); ray_root: where a new
    # cluster keeps them on its storage nodes
    ray: str = ""
    ray_root: str = ""
    limits: Limits = field(default_factory=Limits)
    # filled in by the supervisor for its children
    ingest_socket: str = ""
    metrics_dir: str = ""

    @property
    def queue_depth(self) -> int:
        """How many queries may wait for a slot in each query process."""
        return self.max_concurrent_queries if self.max_queued_queries is None else self.max_queued_queries

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ServerConfig":
        d = json.loads(text)
        d["limits"] = Limits(**d["limits"])
        return cls(**d)

    def check(self) -> None:
        """ValueError with what to change, before anything starts."""
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be from 0 to 65535, not {self.port}")
        for name in ("query_workers", "max_concurrent_queries"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.max_queued_queries is not None and self.max_queued_queries < 0:
            raise ValueError("--max-queued-queries must be 0 or more")
        if not self.max_loop_lag_ms >= 0:
            raise ValueError("--max-loop-lag-ms must be 0 (off) or more")
        if not self.auth and not is_loopback(self.host):
            raise ValueError(f"--no-auth is only allowed on a loopback address (127.0.0.1, ::1, localhost), "
                             f"not on {self.host!r}: anyone who can reach it could read and write everything")


def parse_limits(items: list[str]) -> Limits:
    """``["max_body_bytes=1000", ...]`` (``--limit``) over the defaults; ValueError naming
    what is wrong."""
    names = [f.name for f in fields(Limits)]
    values = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in names:
            raise ValueError(f"--limit {item!r}: give NAME=VALUE, NAME one of {', '.join(names)}")
        try:
            values[name] = int(value)
        except ValueError:
            raise ValueError(f"--limit {item!r}: the value must be an integer") from None
        if values[name] <= 0:
            raise ValueError(f"--limit {item!r}: the value must be positive")
    return Limits(**values)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
