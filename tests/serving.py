"""Start and stop a real ``rtindex serve`` (supervisor, ingest and query processes) for tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

START_SECONDS = 90


class Served:
    """``rtindex serve --port 0 ...`` in a subprocess; ``url``, ``admin_key``, ``client()``."""

    def __init__(self, data: str, *args: str, cwd: str | None = None):
        self.data = data
        self.query_workers = int(args[args.index("--query-workers") + 1]) if "--query-workers" in args else 1
        self.output: list[str] = []
        self.proc = subprocess.Popen(  # -P: the installed rtindex, whatever the working directory
            [sys.executable, "-P", "-m", "rtindex", "serve", "--data", data, "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.url = ""
        self.admin_key: str | None = None
        ready = threading.Event()

        def read():
            for line in self.proc.stdout:
                self.output.append(line)
                m = re.search(r"rtindex serve: (http://\S+)", line)
                if m:
                    self.url = m.group(1)
                m = re.search(r"admin API key .*: (rtk_\S+)", line)
                if m:
                    self.admin_key = m.group(1)
                if "stop with Ctrl-C" in line:
                    ready.set()
            ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not ready.wait(START_SECONDS) or self.proc.poll() is not None or not self.url:
            self.stop()
            raise RuntimeError("rtindex serve did not start:\n" + "".join(self.output))

    def client(self, key: str | None = "admin", **kw) -> httpx.Client:
        key = self.admin_key if key == "admin" else key
        headers = {"Authorization": f"ApiKey {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=kw.pop("timeout", 30), **kw)

    def children(self) -> dict[str, list[int]]:
        """PIDs of the worker processes by role ("ingest", "query"), from /proc."""
        out: dict[str, list[int]] = {"ingest": [], "query": []}
        for entry in self._child_pids():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if ppid == self.proc.pid and b"rtindex.server.worker" in args:
                out[args[args.index(b"rtindex.server.worker") + 1].decode()].append(int(entry))
        return out

    def _child_pids(self) -> list[str]:
        """The supervisor's children from its threads' ``children`` files (a few reads, where
        scanning every process of a busy machine costs milliseconds a call), else every PID."""
        try:
            tasks = os.listdir(f"/proc/{self.proc.pid}/task")
            pids = []
            for tid in tasks:
                with open(f"/proc/{self.proc.pid}/task/{tid}/children") as f:
                    pids += f.read().split()
            return pids
        except OSError:
            return [e for e in os.listdir("/proc") if e.isdigit()]

    def replaced(self, role: str, old: int, timeout: float = START_SECONDS) -> list[int]:
        """The PIDs of the ``role`` processes once the supervisor started one in place of
        ``old`` (which died); RuntimeError with the service's output when it has not within
        ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            pids = self.children()[role]
            if old not in pids and len(pids) == (1 if role == "ingest" else self.query_workers):
                return pids
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"no {role} process came in place of {old} within {timeout} s:\n"
                                   + "".join(self.output[-40:]))
            time.sleep(0.02)

    def healthy(self, timeout: float = START_SECONDS) -> None:
        """Wait until every process runs and ``/healthz`` answers with the ingest process
        reachable; RuntimeError with the service's output when that takes over ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(self.url + "/healthz", timeout=5).status_code == 200:
                    pids = self.children()
                    if len(pids["ingest"]) == 1 and len(pids["query"]) == self.query_workers:
                        return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the service was not healthy again within {timeout} s:\n"
                                   + "".join(self.output[-40:]))
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)  # it ends at the end of the output
        self.proc.stdout.close()
        return self.proc.returncode


def module_service(where: Path, *args: str) -> Iterator[Served]:
    """A Served for a module's fixture (``yield from module_service(tmp_path_factory.mktemp(...))``):
    it must stop cleanly, with no traceback in its output (nothing failed inside either
    process, even where every reply looked right)."""
    s = Served(str(where / "db"), *args)
    yield s
    code = s.stop()
    out = "".join(s.output)
    assert code == 0 and "Traceback" not in out, out
