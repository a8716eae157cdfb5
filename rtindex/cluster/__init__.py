"""Collections spread over a Ray cluster, with the API of one database: rtindex.open_cluster.

Ray is imported only when a cluster is opened (``pip install rtindex[cluster]``).
"""

from __future__ import annotations

from typing import Any


def open_cluster(address: str = "auto", *, root: str | None = None, query_actors: int = 1,
                 options: dict[str, Any] | None = None, call_timeout: float = 30.0, local_reads: bool = True):
    """The database of a Ray cluster (``address``: ``"auto"``, ``"HOST:6379"`` or
    ``"ray://HOST:10001"``): a :class:`rtindex.cluster.database.ClusterDatabase`, whose
    collections are spread over the cluster's storage nodes (docs/scale-out.md).

    ``root``: the directory, on every storage node, under which the groups of shards live
    (needed by the first coordinator of a cluster; later ones read it from the catalog).
    ``query_actors``: query actors per shard group. ``options``: what each group's database
    is opened with (rtindex.open's options, such as ``seal_rows`` or ``row_cache_bytes``), for
    the collections this coordinator creates. ``call_timeout``: seconds a group may take to
    answer before its shards are reported unavailable (UnavailableError). ``local_reads``:
    read the groups whose directories are on this machine in this process, without a Ray
    call (rtindex/cluster/local.py); False reads every group through its query actors.
    """
    from rtindex.cluster.database import ClusterDatabase
    return ClusterDatabase(address, root, query_actors, options or {}, call_timeout, local_reads)
