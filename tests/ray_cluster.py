"""A real Ray cluster on this machine for the cluster tests: a head and storage nodes started
by Ray's own multi-node test utility, each node a set of real processes (raylet, workers)
with a small object store, and a coordinator (rtindex.open_cluster) in the test process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import ray
from ray.cluster_utils import Cluster

import rtindex

OBJECT_STORE_BYTES = 80 << 20  # Ray's smallest: the tests move little


@contextlib.contextmanager
def started(root: str, nodes: int = 2, local_reads: bool = False, **options) -> Iterator[tuple[Cluster, object]]:
    """A head (no storage) and ``nodes`` storage nodes named a, b, ...; the coordinator keeps
    collections under ``root`` with the group databases opened with ``options``, and reads
    through the query actors unless ``local_reads`` (every node is on this machine)."""
    cluster = local(nodes)
    try:
        yield cluster, rtindex.open_cluster(cluster.address, root=root, options=options, local_reads=local_reads)
    finally:
        stop(cluster)


def local(nodes: int) -> Cluster:
    """A head (no storage) and ``nodes`` storage nodes named a, b, ..., all up."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": OBJECT_STORE_BYTES})
    cluster.storage = {}  # name -> the node's handle (Cluster.remove_node takes it)
    for name in "abcdefgh"[:nodes]:
        add_node(cluster, name)
    cluster.wait_for_nodes()
    return cluster


def stop(cluster: Cluster) -> None:
    """Disconnect this process and stop every node's processes."""
    ray.shutdown()
    cluster.shutdown()


def add_node(cluster: Cluster, name: str):
    """A storage node named ``name`` (the same name again: the node is back)."""
    node = cluster.storage[name] = cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES,
                                                    resources={f"rtindex-node:{name}": 1})
    return node
