"""tests/kafka_broker.py against a real broker: it starts and answers, comes back on the same
port after a stop or a SIGKILL with its topics' data, and a second fetch is a no-op.

One broker serves the module; a test that stops it starts it again. Skipped where no Java
17+ is on PATH; the produce/consume parts also need confluent-kafka.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests import kafka_broker as script
from tests.kafka_broker import Broker, fetch, ping, why_not

REASON = why_not()
needs_java = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def test_why_not_names_a_missing_java(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert why_not() == "java is not on PATH"


@needs_java
def test_starts_and_answers(kafka):
    host, port = kafka.bootstrap.split(":")
    assert host == "127.0.0.1" and int(port) == kafka.port
    assert kafka.running and kafka.answers()
    assert ping(host, int(port)) == 1  # one live broker in the cluster's metadata


@needs_java
def test_comes_back_on_the_same_port_after_stop_and_kill(kafka):
    bootstrap = kafka.bootstrap
    kafka.stop()
    assert not kafka.running and not kafka.answers(timeout=1)
    kafka.start()
    assert kafka.bootstrap == bootstrap and kafka.answers()
    kafka.kill()
    assert not kafka.running and not kafka.answers(timeout=1)
    kafka.start()
    assert kafka.bootstrap == bootstrap and kafka.answers()
    assert Broker(kafka.workdir).bootstrap == bootstrap  # a later Broker on the same dir


@needs_java
def test_a_topic_keeps_its_data_across_a_restart(kafka):
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for f in admin.create_topics([NewTopic(topic, num_partitions=3)]).values():
        f.result(30)
    producer = ck.Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all"})
    sent = {f"k{i}": f"v{i}" for i in range(100)}
    for k, v in sent.items():
        producer.produce(topic, key=k, value=v)
    assert producer.flush(30) == 0
    del producer, admin  # no client keeps reconnecting while the broker is down

    kafka.stop()
    kafka.start()
    got = consume(ck, kafka.bootstrap, topic, len(sent))
    assert len(got) == len(sent)
    assert {k: v for _, k, v in got} == sent
    assert {p for p, _, _ in got} == {0, 1, 2}


def consume(ck, bootstrap: str, topic: str, count: int,
            timeout: float = 60) -> list[tuple[int, str, str]]:
    """(partition, key, value) of ``count`` messages of ``topic`` read from its start by a
    new consumer group, or of as many as came in ``timeout`` seconds."""
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                            "auto.offset.reset": "earliest"})
    got = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.partition(), msg.key().decode(), msg.value().decode()))
    finally:
        consumer.close()
    return got


@needs_java
def test_fetch_is_a_noop_the_second_time(kafka, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("a second fetch went to the network")

    monkeypatch.setattr(script, "download", no_network)
    monkeypatch.setattr(script, "resolve", no_network)
    start = time.monotonic()
    jars = fetch()
    assert time.monotonic() - start < 1
    assert (jars / f"kafka_2.13-{script.KAFKA_VERSION}.jar").exists()


@needs_java
def test_a_taken_port_is_refused_before_the_jvm_starts(kafka, tmp_path):
    with pytest.raises(RuntimeError, match="is taken"):
        Broker(tmp_path, port=kafka.port).start()
