"""Start and stop a real ``rtindex serve`` (supervisor, ingest and query processes) for tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import httpx

START_SECONDS = 90


class Served:
    """``rtindex serve --port 0 ...`` in a subprocess; ``url``, ``admin_key``, ``client()``."""

    def __init__(self, data: str, *args: str, cwd: str | None = None):
        self.data = data
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
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
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
