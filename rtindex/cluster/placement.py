"""Where a cluster's collections live: the storage nodes, the catalog, the group directories.

A storage node is a Ray node started with a custom resource ``rtindex-node:NAME`` (any
name, unique in the cluster, the same when the node comes back): actors that must run next
to a group's directory ask for a sliver of that resource, so Ray places them there and
nowhere else, and restarts them there once the node is back. The catalog (one detached
actor on the head node, kept in ``ROOT/catalog.json``) says, for each collection, its shard
count, its groups and the node of each group; every coordinator reads it, so several
coordinators (notebooks, HTTP services) share one cluster's collections.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from rtindex.errors import AlreadyExistsError, NotFoundError
from rtindex.jsonfile import read_json, write_json_atomic

NODE_RESOURCE = "rtindex-node:"
NAMESPACE = "rtindex"
CATALOG = "catalog"
HEAD_RESOURCE = "node:__internal_head__"
SLIVER = 0.001  # of a node's resource: any number of actors fit beside each other


def node_names(nodes: list[dict]) -> list[str]:
    """Storage node names of ``ray.nodes()`` that are alive, sorted."""
    return sorted(k[len(NODE_RESOURCE):] for n in nodes if n.get("Alive")
                  for k in n.get("Resources", {}) if k.startswith(NODE_RESOURCE))


def node_addresses(nodes: list[dict]) -> dict[str, str]:
    """Storage node name -> the IP address of its machine, of ``ray.nodes()`` that are alive."""
    return {k[len(NODE_RESOURCE):]: n["NodeManagerAddress"] for n in nodes if n.get("Alive")
            for k in n.get("Resources", {}) if k.startswith(NODE_RESOURCE)}


def pinned(node: str) -> dict[str, float]:
    """Actor resources that place it on storage node ``node``."""
    return {NODE_RESOURCE + node: SLIVER}


def group_path(root: str, node: str, collection: str, group: int) -> str:
    """The directory of one shard group on its node."""
    return os.path.join(root, node, f"{collection}.g{group}")


def place(groups: int, nodes: list[str], load: dict[str, int]) -> list[str]:
    """A node for each of ``groups`` new groups: the least loaded first (``load``: groups a
    node holds already), ties by name."""
    load = {n: load.get(n, 0) for n in nodes}
    out = []
    for _ in range(groups):
        node = min(nodes, key=lambda n: (load[n], n))
        load[node] += 1
        out.append(node)
    return out


class Catalog:
    """The cluster's collections (a detached actor on the head node): name -> spec, with
    ``shards``, ``groups``, ``nodes`` (one per group), ``options`` (what each group's
    database is opened with), ``created``, and ``moving`` (group -> the node it is moving
    to, while it moves)."""

    def __init__(self, root: str):
        self.root = root
        self.path = os.path.join(root, "catalog.json")
        self._lock = threading.Lock()
        os.makedirs(root, exist_ok=True)
        self._specs: dict[str, dict] = read_json(self.path, "cluster catalog") if os.path.exists(self.path) else {}

    def root_path(self) -> str:
        return self.root

    def specs(self) -> dict[str, dict]:
        with self._lock:
            return dict(self._specs)

    def create(self, name: str, shards: int, groups: int, nodes: list[str], options: dict) -> dict:
        with self._lock:
            if name in self._specs:
                raise AlreadyExistsError(f"collection {name!r} already exists")
            spec = {"shards": shards, "groups": groups, "nodes": place(groups, nodes, self._load()),
                    "options": options, "created": time.time_ns()}
            self._save({**self._specs, name: spec})
            return spec

    def begin_move(self, name: str, group: int, node: str) -> dict:
        """Mark ``group`` as moving to ``node``: no coordinator starts its writer until
        :meth:`move` says where it is (a rebalance finishes a move that stopped half way)."""
        with self._lock:
            spec = self._get(name)
            spec = {**spec, "moving": {**spec.get("moving", {}), str(group): node}}
            self._save({**self._specs, name: spec})
            return spec

    def move(self, name: str, group: int, node: str) -> dict:
        """``group`` is now on ``node`` (and no longer moving)."""
        with self._lock:
            spec = self._get(name)
            nodes = list(spec["nodes"])
            nodes[group] = node
            moving = {k: v for k, v in spec.get("moving", {}).items() if k != str(group)}
            spec = {**spec, "nodes": nodes, "moving": moving}
            self._save({**self._specs, name: spec})
            return spec

    def drop(self, name: str) -> None:
        with self._lock:
            self._get(name)
            self._save({k: v for k, v in self._specs.items() if k != name})

    def _get(self, name: str) -> dict:
        spec = self._specs.get(name)
        if spec is None:
            raise NotFoundError(f"no collection {name!r}")
        return spec

    def _load(self) -> dict[str, int]:
        load: dict[str, int] = {}
        for spec in self._specs.values():
            for node in spec["nodes"]:
                load[node] = load.get(node, 0) + 1
        return load

    def _save(self, specs: dict[str, Any]) -> None:
        write_json_atomic(self.path, specs)  # the file first: what is answered is what is kept
        self._specs = specs
