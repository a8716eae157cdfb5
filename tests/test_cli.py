"""`rtindex demo` runs end to end in a real subprocess, twice on the same directory."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_and_reruns(tmp_path):
    for _ in range(2):
        out = subprocess.run([sys.executable, "-m", "rtindex", "demo", "--events", "3000", "--shards", "2",
                              "--dir", str(tmp_path / "demo")], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "ingested 3,000 docs" in out.stdout
        assert "find it by processBy: 1 doc" in out.stdout
        assert "delete -> True; 3,000 docs" in out.stdout


def test_demo_rejects_bad_arguments(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rtindex", "demo", "--events", "0", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--events must be positive" in out.stderr
