"""Placement: storage nodes from Ray's node list, groups to the least loaded nodes, and the
catalog kept across a restart of its actor (a plain object here: Ray only hosts it)."""

from __future__ import annotations

import os

import pytest

from rtindex.cluster.placement import Catalog, group_path, node_addresses, node_names, pinned, place
from rtindex.errors import AlreadyExistsError, NotFoundError


def test_storage_nodes_are_the_live_ones_with_the_resource():
    nodes = [{"Alive": True, "Resources": {"CPU": 1, "rtindex-node:b": 1}},
             {"Alive": True, "Resources": {"CPU": 1, "node:__internal_head__": 1}},
             {"Alive": False, "Resources": {"rtindex-node:c": 1}},
             {"Alive": True, "Resources": {"rtindex-node:a": 1}}]
    assert node_names(nodes) == ["a", "b"]
    assert pinned("a") == {"rtindex-node:a": 0.001}
    for n, ip in zip(nodes, ["10.0.0.2", "10.0.0.1", "10.0.0.3", "10.0.0.4"]):
        n["NodeManagerAddress"] = ip
    assert node_addresses(nodes) == {"b": "10.0.0.2", "a": "10.0.0.4"}


def test_groups_go_to_the_least_loaded_nodes_first():
    assert place(4, ["a", "b"], {}) == ["a", "b", "a", "b"]
    assert place(2, ["a", "b", "c"], {"a": 2, "b": 1}) == ["c", "b"]


def test_the_catalog_is_kept_on_disk(tmp_path):
    cat = Catalog(str(tmp_path))
    spec = cat.create("c", 4, 2, ["a", "b"], {"seal_rows": 8})
    assert spec["nodes"] == ["a", "b"] and spec["options"] == {"seal_rows": 8}
    with pytest.raises(AlreadyExistsError):
        cat.create("c", 4, 2, ["a", "b"], {})
    assert cat.create("d", 2, 1, ["a", "b"], {})["nodes"] == ["a"]  # a and b hold one each: a by name
    cat.move("d", 0, "b")
    again = Catalog(str(tmp_path))  # a restarted catalog actor reads what was kept
    assert again.specs()["d"]["nodes"] == ["b"] and again.specs()["c"] == spec
    again.drop("c")
    with pytest.raises(NotFoundError):
        again.drop("c")
    assert list(Catalog(str(tmp_path)).specs()) == ["d"]
    assert group_path("/r", "a", "ws.c", 1) == os.path.join("/r", "a", "ws.c.g1")
