"""rtindex/sources.py against a real Kafka broker (tests/kafka_broker.py) and a real client:
several partitions, each message's document stored once, a restart of the consumer, a write
that failed in one shard and not the other, poison messages, a topic that does not exist
yet, a broker that goes away and comes back; pause, resume, remove, and bad definitions."""

from __future__ import annotations

import re
import time
import uuid

import orjson
import pytest

import rtindex
from tests.kafka_broker import Broker, why_not

REASON = why_not()
if REASON is not None:
    pytest.skip(REASON, allow_module_level=True)
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402


def new_topic(broker: Broker, partitions: int = 3, name: str | None = None) -> str:
    name = name or f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # (kept until its futures are done)
    for fut in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)]).values():
        fut.result(30)
    return name


def produce(broker: Broker, topic: str, values: list, partitions: int = 3) -> None:
    """Each value (a dict as JSON, bytes as they are) to partition ``i % partitions``."""
    p = ck.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i, v in enumerate(values):
        p.produce(topic, v if isinstance(v, bytes) else orjson.dumps(v), partition=i % partitions)
    assert p.flush(30) == 0


def wait_for(what, timeout: float = 60.0):
    """``what()`` once it is truthy; fails with its last value after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() > end:
            assert got, f"still {got!r} after {timeout} s"
            return got
        time.sleep(0.05)


def count(coll) -> int:
    return coll.stats()["documents"]


def ids(db, name: str) -> list:
    return sorted(r["_id"] for r in db.sql(f"SELECT _id FROM {name}").rows())


def test_a_topic_of_three_partitions_is_stored_once_with_ids_of_its_offsets(kafka, tmp_path):
    topic = new_topic(kafka)
    produce(kafka, topic, [{"_id": f"k{i}", "i": i} if i % 2 else {"i": i} for i in range(300)])
    with rtindex.open(str(tmp_path / "db")) as db:
        coll = db.create_collection("ev", shards=2)
        st = coll.add_source(rtindex.KafkaSource(kafka.bootstrap, topic))
        assert st["name"] == topic.replace("-", "_") or st["name"] == topic
        wait_for(lambda: count(coll) == 300)
        got = ids(db, "ev")
        assert len(got) == 300 and len(set(got)) == 300
        assert sum(1 for i in got if i.startswith(f"{topic}:")) == 150  # no _id: topic:partition:offset
        status = wait_for(lambda: (s := coll.source(st["name"]))["lag_total"] == 0 and s["messages"] == 300 and s)
        assert set(status["offsets"]) == {0, 1, 2} and sum(status["offsets"].values()) == 300
        assert db.stats()["collections"]["ev"]["sources"][0]["documents"] == 300


def test_a_restarted_consumer_goes_on_where_every_shard_stored(kafka, tmp_path):
    topic = new_topic(kafka)
    produce(kafka, topic, [{"i": i} for i in range(90)])
    with rtindex.open(str(tmp_path / "db")) as db:
        coll = db.create_collection("ev", shards=3)
        coll.add_source(rtindex.KafkaSource(kafka.bootstrap, topic, name="src"))
        wait_for(lambda: count(coll) == 90)
    produce(kafka, topic, [{"i": i} for i in range(90, 150)])  # while no consumer runs
    with rtindex.open(str(tmp_path / "db")) as db:  # the source starts again by itself
        coll = db["ev"]
        wait_for(lambda: count(coll) == 150)
        time.sleep(0.5)
        assert count(coll) == 150 and len(set(ids(db, "ev"))) == 150


def test_a_batch_stored_in_one_shard_and_not_the_other_is_completed_once(kafka, tmp_path, monkeypatch):
    """A write that fails in the second shard (as a crash between the two would leave it):
    after reopening, what the first shard stored is not stored again and the rest is."""
    topic = new_topic(kafka, partitions=1)
    produce(kafka, topic, [{"_id": f"d{i}", "i": i} for i in range(200)], partitions=1)
    with rtindex.open(str(tmp_path / "db")) as db:
        coll = db.create_collection("ev", shards=2)
        second = coll._shards[1]
        real = second.put_many
        calls = []

        def failing(items, generated=frozenset(), meta=()):
            calls.append(len(items))
            if items:  # the first batch with documents for this shard fails here
                raise rtindex.StorageError("injected: the second shard's write failed")
            return real(items, generated, meta)

        monkeypatch.setattr(second, "put_many", failing)
        coll.add_source(rtindex.KafkaSource(kafka.bootstrap, topic, name="src"))
        st = wait_for(lambda: (s := coll.source("src"))["state"] == "failed" and s)
        assert "injected" in st["last_error"]
        first_only = count(coll)
        assert 0 < first_only < 200  # the first shard's part of the batch is stored
        monkeypatch.setattr(second, "put_many", real)
    with rtindex.open(str(tmp_path / "db")) as db:
        coll = db["ev"]
        wait_for(lambda: count(coll) == 200)
        time.sleep(0.5)
        assert ids(db, "ev") == sorted(f"d{i}" for i in range(200))
        rows = db.sql("SELECT i FROM ev").rows()
        assert sorted(r["i"] for r in rows) == list(range(200))


def test_poison_messages_go_to_the_error_log_and_the_rest_is_stored(kafka, tmp_path):
    topic = new_topic(kafka, partitions=1)
    values = [{"i": 0}, b"not json", b"[1, 2]", {"i": 3}, b'{"a": NaN}', b'{"deep": ' * 100 + b"1" + b"}" * 100,
              {"i": 6}]
    produce(kafka, topic, values, partitions=1)
    with rtindex.open(str(tmp_path / "db")) as db:
        coll = db.create_collection("ev", shards=2)
        coll.add_source(rtindex.KafkaSource(kafka.bootstrap, topic, name="src"))
        st = wait_for(lambda: (s := coll.source("src"))["messages"] == 7 and s)
        assert count(coll) == 3
        bad = sorted((e["partition"], e["offset"]) for e in st["recent_errors"])
        assert bad == [(0, 1), (0, 2), (0, 4), (0, 5)] and st["errors"] == 4
        with open(st["error_log"], "rb") as f:
            logged = [orjson.loads(line) for line in f]
        logged.sort(key=lambda e: e["offset"])  # (in the order they were found, a batch's puts last)
        assert [e["offset"] for e in logged] == [1, 2, 4, 5]
        assert "JSON object" in logged[1]["error"] and all(e["error"] for e in logged)


def test_the_collections_transformation_shapes_what_a_source_stores(kafka, tmp_path):
    """Messages go through the transformation: its WHERE is counted as filtered, a message
    it fails on goes to the error log, one it leaves without an _id gets its offset's; a new
    transformation applies to the messages stored after it is set."""
    topic = new_topic(kafka, partitions=1)
    produce(kafka, topic, [{"i": 0, "secret": 1}, {"i": "one"}, {"i": 2, "skip": True}, {"i": 3, "key": "k3"}],
            partitions=1)
    with rtindex.open(str(tmp_path / "db")) as db:
        coll = db.create_collection("ev", shards=2, transformation=(
            "SELECT * EXCEPT (secret, key), i * 10 AS i10, key AS _id FROM _input WHERE skip IS NULL"))
        coll.add_source(rtindex.KafkaSource(kafka.bootstrap, topic, name="src"))
        st = wait_for(lambda: (s := coll.source("src"))["messages"] == 4 and s)
        assert (st["documents"], st["filtered"], st["errors"]) == (2, 1, 1)
        assert "ingest transformation failed" in st["recent_errors"][0]["error"] and st["recent_errors"][0]["offset"] == 1
        assert coll.get(f"{topic}:0:0") == {"_id": f"{topic}:0:0", "i": 0, "i10": 0,
                                            "_event_time": coll.get(f"{topic}:0:0")["_event_time"]}
        assert coll.get("k3")["i10"] == 30
        coll.set_transformation("SELECT *, 'v2' AS version FROM _input")
        produce(kafka, topic, [{"i": 4}], partitions=1)
        wait_for(lambda: coll.get(f"{topic}:0:4") is not None)
        assert coll.get(f"{topic}:0:4")["version"] == "v2" and "version" not in coll.get("k3")


def test_a_topic_made_after_the_source_is_consumed_when_it_appears(kafka, tmp_path):
    topic = f"later-{uuid.uuid4().hex[:8]}"
    with rtindex.open(str(tmp_path / "db")) as db:
        coll = db.create_collection("ev", shards=2)
        coll.add_source(rtindex.KafkaSource(kafka.bootstrap, topic, name="src"))
        time.sleep(1.0)
        assert count(coll) == 0 and coll.source("src")["state"] != "failed"
        new_topic(kafka, 2, topic)
        produce(kafka, topic, [{"i": i} for i in range(20)], partitions=2)
        wait_for(lambda: count(coll) == 20, timeout=90)


def test_a_broker_that_goes_away_and_comes_back(kafka, tmp_path):
    topic = new_topic(kafka, partitions=2)
    produce(kafka, topic, [{"i": i} for i in range(40)], partitions=2)
    with rtindex.open(str(tmp_path / "db")) as db:
        coll = db.create_collection("ev", shards=2)
        coll.add_source(rtindex.KafkaSource(kafka.bootstrap, topic, name="src"))
        wait_for(lambda: count(coll) == 40)
        kafka.kill()
        time.sleep(2.0)
        assert coll.source("src")["state"] != "failed"
        kafka.start()
        produce(kafka, topic, [{"i": i} for i in range(40, 80)], partitions=2)
        wait_for(lambda: count(coll) == 80, timeout=90)
        time.sleep(0.5)
        assert count(coll) == 80


def test_pause_resume_remove_and_the_definition_kept_across_reopen(kafka, tmp_path):
    topic = new_topic(kafka, partitions=1)
    produce(kafka, topic, [{"i": i} for i in range(10)], partitions=1)
    with rtindex.open(str(tmp_path / "db")) as db:
        coll = db.create_collection("ev", shards=1)
        coll.add_source(rtindex.KafkaSource(kafka.bootstrap, topic, name="src"))
        wait_for(lambda: count(coll) == 10)
        assert coll.pause_source("src")["paused"]
        wait_for(lambda: coll.source("src")["state"] == "paused")
        produce(kafka, topic, [{"i": i} for i in range(10, 20)], partitions=1)
        time.sleep(1.0)
        assert count(coll) == 10
        with pytest.raises(rtindex.AlreadyExistsError):
            coll.add_source(rtindex.KafkaSource(kafka.bootstrap, topic, name="src"))
    with rtindex.open(str(tmp_path / "db")) as db:  # still paused after reopening
        coll = db["ev"]
        time.sleep(1.0)
        assert count(coll) == 10 and coll.source("src")["paused"]
        coll.resume_source("src")
        wait_for(lambda: count(coll) == 20)
        coll.remove_source("src")
        assert coll.sources() == []
        assert coll._shards[0].source_offsets("src") == {}
        with pytest.raises(rtindex.NotFoundError):
            coll.source("src")


@pytest.mark.parametrize("bad, words", [
    (dict(start="middle"), "start must be one of"),
    (dict(format="avro"), "format must be one of"),
    (dict(name="a b"), "invalid source name"),
    (dict(topic=""), "topic must be a non-empty string"),
    (dict(options={"enable.auto.commit": True}), "may not set 'enable.auto.commit'"),
    (dict(options={"client.id": ["x"]}), "must be a string, number or boolean"),
])
def test_a_bad_definition_is_refused_naming_the_problem(tmp_path, bad, words):
    with rtindex.open(str(tmp_path / "db")) as db:
        coll = db.create_collection("ev", shards=1)
        args = {"bootstrap_servers": "127.0.0.1:9", "topic": "t", **bad}
        with pytest.raises(rtindex.InvalidArgumentError, match=words):
            coll.add_source(rtindex.KafkaSource(**args))
        assert coll.sources() == []


def test_the_service_runs_a_source_in_its_ingest_process(kafka, tmp_path):
    """The routes: add (admin), list and get (read; secrets in options not shown), pause,
    resume, remove; the documents reach the query processes."""
    from tests.serving import Served

    topic = new_topic(kafka, partitions=2)
    produce(kafka, topic, [{"i": i} for i in range(50)], partitions=2)
    s = Served(str(tmp_path / "db"))
    try:
        with s.client() as c:
            assert c.post("/v1/collections", json={"name": "ev", "shards": 2}).status_code == 201
            read_key = c.post("/v1/keys", json={"role": "read"}).json()["key"]
            body = {"kind": "kafka", "bootstrap_servers": kafka.bootstrap, "topic": topic, "name": "src",
                    "options": {"sasl.password": "hunter2", "client.id": "rt"}}
            with s.client(read_key) as reader:
                assert reader.post("/v1/collections/ev/sources", json=body).status_code == 403
            r = c.post("/v1/collections/ev/sources", json=body)
            assert r.status_code == 201, r.text
            assert r.json()["options"] == {"sasl.password": "***", "client.id": "rt"}
            assert c.post("/v1/collections/ev/sources", json=body).status_code == 409
            assert c.post("/v1/collections/ev/sources", json={"topic": topic}).status_code == 400
            assert c.post("/v1/collections/ev/sources", json={**body, "start": "middle"}).status_code == 400
            for unsafe in ("plugin.library.paths", "ssl.ca.location", "sasl.kerberos.kinit.cmd"):
                r = c.post("/v1/collections/ev/sources", json={**body, "name": "x", "options": {unsafe: "/tmp/x"}})
                assert r.status_code == 400 and unsafe in r.json()["message"], r.text

            def queried() -> int:
                return c.post("/v1/query", json={"sql": "SELECT COUNT(*) AS n FROM ev"}).json()["rows"][0]["n"]
            wait_for(lambda: queried() == 50)
            with s.client(read_key) as reader:
                listed = reader.get("/v1/collections/ev/sources").json()["sources"]
            assert [x["name"] for x in listed] == ["src"] and "hunter2" not in str(listed)
            st = wait_for(lambda: (x := c.get("/v1/collections/ev/sources/src").json())["caught_up"] and x)
            assert st["documents"] == 50 and set(st["offsets"]) == {"0", "1"}
            metric = re.compile(r'^rtindex_source\{(?=.*collection="ev")(?=.*source="src")(?=.*counter="documents")'
                                r'[^}]*\} 50\.0$', re.M)
            wait_for(lambda: metric.search(c.get("/metrics").text), timeout=10)
            assert c.post("/v1/collections/ev/sources/src/pause").json()["paused"]
            assert c.post("/v1/collections/ev/sources/src/resume").json()["paused"] is False
            assert c.delete("/v1/collections/ev/sources/src").json() == {"name": "src", "removed": True}
            assert c.get("/v1/collections/ev/sources/src").status_code == 404
            assert c.get("/v1/collections/nope/sources").status_code == 404
    finally:
        assert s.stop() == 0, "".join(s.output)


def test_a_collection_has_at_most_max_sources(tmp_path):
    from rtindex.sources import MAX_SOURCES

    with rtindex.open(str(tmp_path / "db")) as db:
        coll = db.create_collection("ev", shards=1)
        for i in range(MAX_SOURCES):  # a broker nobody listens on: each waits, none fails
            coll.add_source(rtindex.KafkaSource("127.0.0.1:9", f"t{i}"))
        with pytest.raises(rtindex.InvalidArgumentError, match=f"has {MAX_SOURCES} sources"):
            coll.add_source(rtindex.KafkaSource("127.0.0.1:9", "one-more"))
        assert len(coll.sources()) == MAX_SOURCES


@pytest.mark.parametrize("cycles", [pytest.param(3, id="default"), pytest.param(30, id="slow", marks=pytest.mark.slow)])
def test_sigkill_of_the_ingest_process_stores_each_message_once(kafka, tmp_path, rand, cycles):
    """``rtindex serve`` consuming a topic that a producer keeps writing, its ingest process
    SIGKILLed at random moments and restarted by the supervisor: at the end every message
    is stored, and stored once (the shards assigned exactly one row per message: a replayed
    message that a shard had stored would have taken another)."""
    import os
    import signal
    import threading

    from tests.serving import Served

    topic = new_topic(kafka, partitions=3)
    stop = threading.Event()
    produced = [0]

    def producer() -> None:
        p = ck.Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
        i = 0
        while not stop.is_set():
            for _ in range(200):
                p.produce(topic, orjson.dumps({"seq": i, "pad": "x" * 100}), partition=i % 3)
                i += 1
            assert p.flush(30) == 0
            produced[0] = i
            time.sleep(0.02)

    s = Served(str(tmp_path / "db"))
    try:
        with s.client() as c:
            assert c.post("/v1/collections", json={"name": "ev", "shards": 2}).status_code == 201
            r = c.post("/v1/collections/ev/sources", json={"bootstrap_servers": kafka.bootstrap, "topic": topic,
                                                            "name": "src"})
            assert r.status_code == 201, r.text
            feeding = threading.Thread(target=producer)
            feeding.start()
            try:
                for _ in range(cycles):
                    time.sleep(rand.uniform(0.1, 1.5))
                    (pid,) = s.children()["ingest"]
                    os.kill(pid, signal.SIGKILL)
                    wait_for(lambda: s.children()["ingest"] not in ([], [pid]), timeout=60)
            finally:
                stop.set()
                feeding.join(60)
            total = produced[0]

            def stored() -> int:
                r = c.post("/v1/query", json={"sql": "SELECT COUNT(*) AS n, COUNT(DISTINCT seq) AS d FROM ev"})
                if r.status_code != 200:
                    return -1  # (the ingest process may still be coming back)
                row = r.json()["rows"][0]
                assert row["n"] == row["d"], row
                return row["n"]
            wait_for(lambda: stored() == total, timeout=180)
    finally:
        assert s.stop() == 0, "".join(s.output)
    with rtindex.open(str(tmp_path / "db")) as db:
        coll = db["ev"]
        coll.pause_source("src")
        assert sum(sh["next_row_id"] for sh in coll.stats()["shards"]) == total
        assert sorted(r["seq"] for r in db.sql("SELECT seq FROM ev").rows()) == list(range(total))
