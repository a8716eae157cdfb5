"""``rtindex serve --ray ADDRESS``: the HTTP service over a real local Ray cluster's
collections, through its real processes (an ingest process and a query process, each a
coordinator), with the client a user has: writes, read-your-writes by fence, SQL, a
document by _id, and clear refusals of what a cluster does not do yet."""

from __future__ import annotations

import pytest
import ray_cluster

import rtindex
from tests.serving import Served


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    cluster = ray_cluster.local(nodes=2)
    try:
        s = Served(str(tmp_path_factory.mktemp("svc")), "--ray", cluster.address,
                   "--ray-root", str(tmp_path_factory.mktemp("cluster")))
        try:
            yield s, cluster
        finally:
            assert s.stop() == 0, "".join(s.output)
    finally:
        ray_cluster.stop(cluster)


def test_the_service_serves_a_clusters_collections(served):
    s, cluster = served
    db = rtindex.connect(s.url, api_key=s.admin_key)
    events = db.create_collection("events", shards=4)
    stats = events.ingest([{"_id": i, "kind": f"k{i % 3}", "n": i} for i in range(300)] + [{"_id": 1.5}],
                          errors="report")
    assert stats.n == 300 and [e.index for e in stats.errors] == [300]
    # the client reads its writes: its fence goes with the query, to another process
    rows = db.sql("SELECT kind, COUNT(*) AS c, SUM(n) AS s FROM events GROUP BY kind ORDER BY kind").rows()
    assert rows == [{"kind": f"k{k}", "c": 100, "s": sum(range(k, 300, 3))} for k in range(3)]
    assert events.get(7) == {"_id": 7, "kind": "k1", "n": 7, "_event_time": events.get(7)["_event_time"]}
    assert events.count() == 300
    events.patch(7, [{"op": "replace", "path": "/n", "value": 70}])
    assert db.sql("SELECT n FROM events WHERE _id = 7").rows() == [{"n": 70}]
    events.delete(8)
    assert events.get(8) is None
    with s.client() as http:
        listed = http.get("/v1/collections").json()["collections"]
        assert [(c["name"], c["shards"], c["documents"]) for c in listed] == [("events", 4, 299)]
        refused = http.put("/v1/collections/events/transformation", json={"sql": "SELECT * FROM _input"})
        assert refused.status_code == 400 and "not available on a cluster" in refused.json()["message"]
    # the collections are the cluster's: a coordinator of its own sees them
    mine = rtindex.open_cluster(cluster.address)
    assert mine.collection("events").count() == 299
    mine.close()
    db.drop_collection("events")
    assert "events" not in db.collection_names()
