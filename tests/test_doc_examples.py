"""Every ```python block of README.md and docs/*.md runs as written, the way a user pastes it.

The blocks of one file run in order in one namespace, in a fresh empty working directory,
and then all again in a new namespace in the same directory: a user runs an example script
twice, and the second run must not trip over what the first left (a collection that
exists, a directory that is there). A file whose blocks call ``rtindex.connect`` gets a
real ``rtindex serve`` (tests/serving.py) whose URL and admin key are in ``RTINDEX_URL``
and ``RTINDEX_API_KEY``, where its text tells the reader to put them; one whose blocks make
a ``KafkaSource`` gets a real Kafka broker (tests/kafka_broker.py) at ``KAFKA_BOOTSTRAP``;
one whose blocks call ``rtindex.open_cluster`` gets a real local Ray cluster of two storage
nodes (tests/ray_cluster.py) at ``RAY_ADDRESS``, where ``ray start`` leaves a user's.

A block that cannot run (one that shows a traceback, say) says so where a reader sees it:
``<!-- no-run: why -->`` on the line before its fence. Such blocks are counted, and that
count must stay small.

A failure names the file and line of the block; the traceback shows the markdown's own lines.
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

import pytest

import rtindex
from rtindex.client import RemoteDatabase
from rtindex.cluster.database import ClusterDatabase
from tests.serving import Served

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON = {"python", "py", "python3"}
NO_RUN = re.compile(r"^\s*<!--\s*no-run:\s*\S.*-->\s*$")
MAX_NO_RUN = 2  # blocks in all the docs that may be shown without being run
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")


@dataclass
class Block:
    path: pathlib.Path
    line: int  # 1-based line of the first line of code (after the opening fence)
    code: str
    run: bool  # False: marked <!-- no-run: ... --> in the text

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_blocks(path: pathlib.Path) -> list[Block]:
    """The Python code blocks of a markdown file, in order (fences as CommonMark reads them:
    ``` or ~~~, at least three, closed by the same character at least as many times; a
    fence indented inside a list item has that indent removed from its lines)."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m["indent"]), m["fence"], m["info"].lower()
        start = i + 1
        end = start
        while end < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        if info in PYTHON:
            code = "\n".join(ln[indent:] if ln.startswith(" " * indent) else ln.lstrip() for ln in lines[start:end])
            before = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
            blocks.append(Block(path, start + 1, code, run=not NO_RUN.match(before)))
        i = end + 1
    return blocks


def _run(blocks: list[Block], attempt: int) -> None:
    """Run the blocks in one fresh namespace, as one script; close the databases it left
    open, as the end of a script's process would."""
    ns: dict = {"__name__": "__main__"}
    try:
        for b in blocks:
            # padded so that the code's line numbers are the markdown file's: a traceback
            # shows the very line of the docs that failed
            code = compile("\n" * (b.line - 1) + b.code + "\n", str(b.path), "exec")
            try:
                exec(code, ns)  # noqa: S102 - running the documentation is the point
            except BaseException as e:
                e.add_note(f"in the python block at {b.where} (run {attempt} of the file's examples)")
                raise
    finally:
        for value in list(ns.values()):
            if isinstance(value, (rtindex.Database, RemoteDatabase, ClusterDatabase)):
                value.close()


@pytest.fixture
def served_env(tmp_path, monkeypatch):
    """Start ``rtindex serve`` and put its URL and admin key where the docs read them."""
    started: list[Served] = []

    def start() -> None:
        s = Served(str(tmp_path / "server-data"))
        started.append(s)
        monkeypatch.setenv("RTINDEX_URL", s.url)
        monkeypatch.setenv("RTINDEX_API_KEY", s.admin_key)

    yield start
    for s in started:
        assert s.stop() == 0, "".join(s.output)


@pytest.fixture
def broker_env(tmp_path, monkeypatch):
    """Start a Kafka broker (tests/kafka_broker.py) and put its address where the docs read it."""
    started = []

    def start() -> None:
        from tests.kafka_broker import Broker, why_not

        if why_not() is not None:
            pytest.skip(why_not())
        b = Broker(tmp_path / "kafka")
        started.append(b.start())
        monkeypatch.setenv("KAFKA_BOOTSTRAP", b.bootstrap)

    yield start
    for b in started:
        b.stop()


@pytest.fixture
def ray_env(tmp_path, monkeypatch):
    """Start a local Ray cluster (tests/ray_cluster.py) and put its address where ``ray start`` would."""
    from tests import ray_cluster

    started = []

    def start() -> None:
        cluster = ray_cluster.local(nodes=2)
        started.append(cluster)
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)

    yield start
    for cluster in started:
        ray_cluster.stop(cluster)


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_examples_run_as_written(path, tmp_path, monkeypatch, served_env, broker_env, ray_env):
    blocks = [b for b in python_blocks(path) if b.run]
    if not blocks:
        return  # a page with no Python to run (shell, JSON, text blocks only)
    if any("rtindex.connect(" in b.code for b in blocks):
        served_env()
    if any("KafkaSource(" in b.code for b in blocks):
        broker_env()
    if any("rtindex.open_cluster(" in b.code for b in blocks):
        ray_env()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for attempt in (1, 2):
        _run(blocks, attempt)


def test_blocks_that_do_not_run_are_few_and_marked():
    skipped = [b.where for p in FILES for b in python_blocks(p) if not b.run]
    assert len(skipped) <= MAX_NO_RUN, f"too many examples are marked no-run: {skipped}"


def test_the_block_finder_sees_fences_as_markdown_does(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("text\n```python\na = 1\n```\n\n<!-- no-run: shows an error -->\n```python\nboom(\n```\n"
                  "1. a list item:\n\n   ```py\n   b = 2\n   ```\n````python\n```\nnot the end\n````\n"
                  "```sh\nls\n```\n")
    got = [(b.line, b.code, b.run) for b in python_blocks(md)]
    assert got == [(3, "a = 1", True), (8, "boom(", False), (13, "b = 2", True), (16, "```\nnot the end", True)]
