"""Node-local reads without Ray: a LocalReader answers as its query actor would, hands out
copies of documents, and says when a move marked or removed its directory, so that a
failed call is run again where the group went."""

from __future__ import annotations

import os
import shutil

import pytest

from rtindex.cluster.groups import MOVING_MARK, GroupFiles, GroupWriter
from rtindex.cluster.local import LocalReader
from rtindex.errors import ClosedError

OPTIONS = {"seal_rows": 8}


@pytest.fixture
def group(tmp_path):
    path = str(tmp_path / "g")
    w = GroupWriter(path, "c", 2, OPTIONS)
    r = LocalReader(path, "c", OPTIONS)
    yield w, r
    r.close()
    w.close()


def test_answers_come_as_a_query_actors_do(group):
    w, r = group
    fence = w.ingest([{"_id": i, "a": i % 3, "o": {"x": i}} for i in range(20)], "report")["fence"]
    opened = r.ask("open", fence, [], [], None)
    assert opened.error is None
    token, count = opened.value[:2]
    assert count == 20
    parts, _ = r.ask("call", token, "term", (("a",), 1), {}).value
    docs, _ = r.ask("call", token, "fetch", (parts,), {"copy": False}).value
    assert sorted(d["_id"] for d in docs) == [i for i in range(20) if i % 3 == 1]
    docs[0]["o"]["x"] = "changed"  # a copy: what the reader caches stays as stored
    again, _ = r.ask("call", token, "fetch", (parts,), {"copy": False}).value
    assert all(d["o"]["x"] == d["_id"] for d in again)
    assert r.ask("get", 4, fence).value["_id"] == 4


def test_an_error_is_handed_back_and_says_whether_the_group_left(group, tmp_path):
    w, r = group
    fence = w.ingest([{"_id": 1}], "report")["fence"]
    bad = r.ask("call", 12345, "count", (), {})
    assert bad.error is not None and not bad.moved and not r.leaving()
    GroupFiles().mark(r.path)
    assert r.leaving() and MOVING_MARK not in [rel for rel, _ in GroupFiles().listing(r.path)]
    assert r.ask("open", fence, [], [], None).error is None  # the old directory still answers
    r.close()
    closed = r.ask("open", fence, [], [], None)
    assert isinstance(closed.error, ClosedError) and closed.moved


def test_a_removed_directory_is_leaving(group):
    w, r = group
    w.close()
    shutil.rmtree(r.path)
    assert not os.path.exists(r.path) and r.leaving()
    GroupFiles().mark(r.path)  # (a move that stopped half way: nothing to mark)
    assert not os.path.exists(r.path)
