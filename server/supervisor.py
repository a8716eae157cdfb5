"""``rtindex serve``: starts the ingest process and the query processes, watches them,
restarts any that dies, and stops them in order on SIGTERM or Ctrl-C.

The supervisor binds the public port itself and hands the listening socket to each query
process (they accept from one queue, so a busy process takes fewer connections). The
ingest process gets a Unix socket in a private directory. On shutdown the query processes
stop first (no new writes can arrive), then the ingest process finishes the writes it has
and closes the database: a write that was answered is in the WAL either way.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import TextIO

import httpx

import rtindex

from .auth import KeyStore
from .config import ServerConfig
from .worker import DEMO_COLLECTION
START_TIMEOUT = 120.0  # an ingest process may replay a large WAL before it listens
# seconds a stopping process gets to finish what it is doing before SIGKILL. A query process
# holds nothing that must be saved (it is a replica; its temporary files are under the
# supervisor's runtime directory), so a query still running is cut short; the ingest
# process finishes the writes it has and closes the database.
QUERY_STOP_SECONDS = 5.0
INGEST_STOP_SECONDS = 40.0
RESTART_BACKOFF = (0.1, 0.5, 1.0, 2.0, 5.0)


class Supervisor:
    def __init__(self, config: ServerConfig, out: TextIO = sys.stdout):
        config.check()
        self.config = config
        self.out = out
        self.runtime = tempfile.mkdtemp(prefix="rtindex-serve-")
        config.ingest_socket = os.path.join(self.runtime, "ingest.sock")
        config.metrics_dir = os.path.join(self.runtime, "metrics")
        os.makedirs(config.metrics_dir)
        self.sock: socket.socket | None = None
        self.ingest: subprocess.Popen | None = None
        self.queries: list[subprocess.Popen | None] = []
        self.restarts = 0
        self._stopping = False

    def say(self, *a) -> None:
        print(*a, file=self.out, flush=True)

    # ------------------------------------------------------------ starting
    def prepare(self) -> str | None:
        """Make the database if needed and the first admin key (returned). The demo data is
        loaded by the ingest process, not here: the supervisor lives as long as the service,
        and would keep the memory of loading it for nothing (docs/benchmarks.md, "Memory
        defaults")."""
        cfg = self.config
        with rtindex.open(cfg.data):  # creates it, or checks it is one
            pass
        return KeyStore(cfg.data).ensure_admin() if cfg.auth else None

    def _env(self) -> dict:
        env = dict(os.environ)
        env["RTINDEX_SERVER_CONFIG"] = self.config.to_json()
        env["PROMETHEUS_MULTIPROC_DIR"] = self.config.metrics_dir
        return env

    def _tmp(self) -> str:
        """The temporary directory of the query processes (a replica's files), removed with
        the runtime directory: also what a query process killed or crashed left there."""
        path = os.path.join(self.runtime, "tmp")
        os.makedirs(path, exist_ok=True)
        return path

    def _spawn(self, role: str) -> subprocess.Popen:
        env = self._env()
        fds: tuple = ()
        if role == "query":
            env["RTINDEX_LISTEN_FD"] = str(self.sock.fileno())
            env["TMPDIR"] = self._tmp()
            fds = (self.sock.fileno(),)
        # -P: not the current directory first on sys.path, or a checkout of the source (the
        # README's case: `rtindex serve` run from the repository) would shadow the installed
        # package and its compiled extensions. Own session: a Ctrl-C in the terminal reaches
        # only the supervisor, which stops the children in order.
        return subprocess.Popen([sys.executable, "-P", "-m", "rtindex.server.worker", role], env=env,
                                pass_fds=fds, start_new_session=True)

    def start(self) -> None:
        """Listen, then make the database and the first admin key (a start that cannot
        listen makes no key nobody was shown), then start the processes; a key made by a
        start that fails after that is shown with the failure."""
        cfg = self.config
        try:
            self.sock = socket.create_server((cfg.host, cfg.port), backlog=4096)
        except OSError as e:
            raise SystemExit(f"rtindex serve: cannot listen on {cfg.host}:{cfg.port}: {e.strerror}") from None
        self.sock.set_inheritable(True)
        self.port = self.sock.getsockname()[1]
        admin_key = self.prepare()
        try:
            self.ingest = self._spawn("ingest")
            self._wait_ready("ingest", lambda: self._ping_ingest())
            self.queries = [self._spawn("query") for _ in range(cfg.query_workers)]
            self._wait_ready("query", lambda: self._ping_public())
        except SystemExit:
            if admin_key:
                self.say(f"  the admin API key this start made (shown once, stored hashed; keep it): {admin_key}")
            raise
        self._banner(admin_key)

    def _ping_ingest(self) -> bool:
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=self.config.ingest_socket), timeout=2) as c:
                return c.get("http://ingest/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def _ping_public(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def _wait_ready(self, what: str, ping) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ping():
            procs = [self.ingest] + [q for q in self.queries if q is not None]
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                self.stop()
                raise SystemExit(f"rtindex serve: the {what} process exited with code {dead[0].returncode} "
                                 "while starting (its error is above)")
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"rtindex serve: the {what} process did not answer within {START_TIMEOUT:.0f} s")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        host = self.config.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    def _banner(self, admin_key: str | None) -> None:
        cfg = self.config
        self.say(f"rtindex serve: {self.url}  (data: {os.path.abspath(cfg.data)}; 1 ingest process, "
                 f"{cfg.query_workers} query process{'es' if cfg.query_workers > 1 else ''})")
        self.say(f"  API docs: {self.url}/docs")
        auth = ""
        if not cfg.auth:
            self.say("  authentication is off (--no-auth): anyone on this machine can read and write")
        elif admin_key:
            self.say(f"  admin API key (shown once, stored hashed; keep it): {admin_key}")
            auth = f" -H 'Authorization: ApiKey {admin_key}'"
        else:
            self.say(f"  API keys: use one you made before (a new admin key: rtindex keys create --data "
                     f"{shlex.quote(cfg.data)} --role admin)")
            auth = " -H 'Authorization: ApiKey YOUR_KEY'"
        coll = DEMO_COLLECTION if cfg.demo else "events"
        sql = (f"SELECT event_type, COUNT(*) AS n FROM {coll} GROUP BY event_type ORDER BY n DESC LIMIT 3"
               if cfg.demo else "SELECT COUNT(*) AS n FROM events")
        self.say("  try:")
        self.say(f"    curl -s {self.url}/v1/query{auth} -H 'Content-Type: application/json' "
                 f"-d '{{\"sql\": \"{sql}\"}}'")
        self.say("  stop with Ctrl-C")

    # ------------------------------------------------------------ running
    def run(self) -> int:
        """Start, then watch the children until SIGTERM/SIGINT."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.start()
        failures = 0
        while not self._stopping:
            time.sleep(0.2)
            if self._stopping:
                break
            restarted = self._restart_dead()
            failures = failures + 1 if restarted else 0
            if failures:
                time.sleep(RESTART_BACKOFF[min(failures, len(RESTART_BACKOFF)) - 1])
        self.stop()
        return 0

    def _on_signal(self, signum, frame) -> None:
        self._stopping = True

    def _restart_dead(self) -> bool:
        from .metrics import process_died

        restarted = False
        if self.ingest is not None and self.ingest.poll() is not None:
            self.say(f"rtindex serve: the ingest process exited ({self._how(self.ingest)}); restarting it")
            process_died(self.ingest.pid, self.config.metrics_dir)
            self.ingest = self._spawn("ingest")
            restarted = True
        for i, q in enumerate(self.queries):
            if q is not None and q.poll() is not None:
                self.say(f"rtindex serve: query process {q.pid} exited ({self._how(q)}); restarting it")
                process_died(q.pid, self.config.metrics_dir)
                self.queries[i] = self._spawn("query")
                restarted = True
        self.restarts += restarted
        return restarted

    @staticmethod
    def _how(p: subprocess.Popen) -> str:
        rc = p.returncode
        return f"signal {signal.Signals(-rc).name}" if rc < 0 else f"code {rc}"

    def stop(self) -> None:
        """Query processes first, then the ingest process; each gets SIGTERM and time to
        finish what it is doing (QUERY_STOP_SECONDS, INGEST_STOP_SECONDS), then SIGKILL."""
        self._stopping = True
        if self.sock is not None:  # refuse new connections now, instead of queueing them for no one
            self.sock.close()
            self.sock = None
        for group, seconds in (([q for q in self.queries if q is not None], QUERY_STOP_SECONDS),
                               ([self.ingest] if self.ingest else [], INGEST_STOP_SECONDS)):
            for p in group:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + seconds
            for p in group:
                try:
                    p.wait(timeout=max(deadline - time.monotonic(), 0.0))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.runtime, ignore_errors=True)


def serve(config: ServerConfig) -> int:
    try:
        sup = Supervisor(config)
    except ValueError as e:
        print(f"rtindex serve: {e}", file=sys.stderr)
        return 2
    try:
        return sup.run()
    except (rtindex.NotADatabaseError, rtindex.StorageError) as e:
        print(f"rtindex serve: {e}", file=sys.stderr)
        sup.stop()
        return 1
