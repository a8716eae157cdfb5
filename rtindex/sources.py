"""Sources a collection owns: a Kafka topic consumed into it, exactly once (docs/sources.md).

Exactly once comes from where the offsets live. Each shard stores, in the same atomic
write as its part of a batch, the next offset of every partition of the batch
(``keys.meta_source_offset``), whether the batch held documents for it or not. After a
crash, consumption resumes from the smallest stored offset of each partition, and a shard
skips a replayed message below its own stored offset: a shard that stored its part before
the crash does not store it again, one that did not stores it now. A message without an
``_id`` gets one made of its topic, partition and offset, so a replay routes it to the same
shard. Offsets are committed to the group too, once the batch is durable, for monitoring
tools only.

A source runs on a thread of the process that writes the collection (the library's writer,
or the service's ingest process). It pulls a batch, stores it, then pulls the next: the
broker holds what is not stored yet, nothing is buffered here beyond one batch.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from rtindex import documents, ingest, keys
from rtindex._impl import scan_top
from rtindex.errors import InvalidArgumentError, SchemaError
from rtindex.transform import FALLBACK, Transformation

if TYPE_CHECKING:
    from rtindex.collection import Collection

STARTS = ("earliest", "latest")
FORMATS = ("json",)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,127}")
# settings a source makes itself (exactly once depends on them): not taken in options
_RESERVED = frozenset({"bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store",
                       "auto.offset.reset", "enable.partition.eof", "isolation.level"})
# librdkafka settings that read files, load libraries or run commands on the machine
_UNSAFE = re.compile(r"plugin|location|kinit|keytab|\.cmd$|_cb$|interceptor|path|\.pem$|ssl_key|ssl\.key"
                     r"|keystore|ssl\.certificate|ssl\.ca|ssl\.crl|engine", re.I)
MAX_SOURCES = 16  # per collection
_SECRET = re.compile(r"password|secret|key|token|credential", re.I)  # options never shown in a status
BATCH_MESSAGES = ingest.PUT_DOCS  # a batch at most, per shard of the collection
POLL_SECONDS = 0.05  # the longest a poll waits for a message when there is none
IN_FLIGHT = 2  # batches under way at once: the next is read and prepared while one is put
LAG_EVERY = 1.0  # seconds between reads of the partitions' high watermarks
ERRORS_KEPT = 100  # recent per-message errors in status(); all of them are in the error log
ERROR_LOG_BYTES = 16 << 20  # the error log is rotated past this (one older file is kept)


@dataclass(frozen=True)
class KafkaSource:
    """A Kafka topic to consume into a collection: ``coll.add_source(KafkaSource(...))``.

    ``start``: where a partition begins the first time (later, where the collection's
    stored offsets say). ``group``: the consumer group (default ``rtindex-<collection>-<name>``).
    ``name``: the source's name in its collection (default: the topic's, made a name).
    ``options``: more librdkafka settings (``security.protocol``, ``sasl.*``, ...).
    """

    bootstrap_servers: str
    topic: str
    group: str | None = None
    start: str = "earliest"
    format: str = "json"
    name: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def checked(self, collection: str) -> "KafkaSource":
        """This source with its defaults filled in; InvalidArgumentError naming what is wrong."""
        for what in ("bootstrap_servers", "topic"):
            v = getattr(self, what)
            if not isinstance(v, str) or not v.strip():
                raise InvalidArgumentError(f"KafkaSource {what} must be a non-empty string, not {v!r}")
        if self.start not in STARTS:
            raise InvalidArgumentError(f"KafkaSource start must be one of {STARTS}, not {self.start!r}")
        if self.format not in FORMATS:
            raise InvalidArgumentError(f"KafkaSource format must be one of {FORMATS}, not {self.format!r}")
        if not isinstance(self.options, dict) or not all(isinstance(k, str) for k in self.options):
            raise InvalidArgumentError("KafkaSource options must be a dict of librdkafka settings")
        for k, v in self.options.items():
            if k in _RESERVED:
                raise InvalidArgumentError(f"KafkaSource options may not set {k!r}: the source sets it (use the "
                                           "source's own arguments)")
            if not isinstance(v, (str, int, float, bool)):
                raise InvalidArgumentError(f"KafkaSource option {k!r} must be a string, number or boolean")
        name = self.name if self.name is not None else re.sub(r"[^A-Za-z0-9_-]", "_", self.topic)
        if not name[:1].isalpha() and name[:1] != "_":
            name = "_" + name
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidArgumentError(f"invalid source name {name!r}: use letters, digits, _ and -, starting "
                                       "with a letter or _ (at most 128 characters)")
        group = self.group if self.group is not None else f"rtindex-{collection}-{name}"
        return KafkaSource(self.bootstrap_servers, self.topic, group, self.start, self.format, name,
                           dict(self.options))

    def definition(self) -> dict:
        """As kept in the collection's ``sources.json`` and shown in its status."""
        return {"kind": "kafka", **asdict(self)}

    @classmethod
    def from_definition(cls, d: dict) -> "KafkaSource":
        """The source a :meth:`definition` describes."""
        d = {k: v for k, v in d.items() if k != "kind"}
        return cls(**d)


def unsafe_options(options: dict) -> list[str]:
    """The settings of ``options`` that reach the machine (files, libraries, commands): the
    service refuses them, where the key's holder is not the machine's owner."""
    return [k for k in options if isinstance(k, str) and _UNSAFE.search(k)]


def message_id(topic: str, partition: int, offset: int) -> str:
    """The ``_id`` of a message's document that has none: the same on every replay."""
    return f"{topic}:{partition}:{offset}"


class SourceRunner:
    """One source consuming into one collection, on a thread of its own."""

    def __init__(self, coll: "Collection", source: KafkaSource, paused: bool = False):
        import confluent_kafka  # noqa: F401 - fail here, with the install hint, not on the thread

        self.coll = coll
        self.source = source
        self.name = source.name
        self._stop = threading.Event()
        self._paused = paused
        self._thread: threading.Thread | None = None
        self._consumer = None
        self.state = "paused" if paused else "starting"
        self.last_error: str | None = None
        self.errors: deque[dict] = deque(maxlen=ERRORS_KEPT)
        self.counts = {"messages": 0, "bytes": 0, "documents": 0, "filtered": 0, "errors": 0, "batches": 0}
        self._rate = (time.monotonic(), 0, 0)  # (when, messages, bytes) of the last rate sample
        self.rates = {"messages_per_s": 0.0, "bytes_per_s": 0.0}
        self.positions: dict[int, int] = {}  # partition -> next offset stored in every shard
        self._stored: list[dict[int, int]] = []  # per shard: partition -> next offset it has stored
        self.high: dict[int, int] = {}  # partition -> high watermark, read every LAG_EVERY
        self._lag_read = 0.0
        self._in_flight: deque = deque()  # batches whose puts are under way, oldest first
        self._error_log = os.path.join(coll.path, "sources", f"{self.name}.errors.ndjson")

    # -- control ------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"rtindex-source-{self.coll.name}-{self.name}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the batch under way is stored (it is durable or not begun)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused

    def status(self) -> dict:
        """What ``coll.sources()``, ``db.stats()`` and the service show of this source."""
        lag = {p: max(0, self.high[p] - self.positions.get(p, 0)) for p in self.high}
        definition = self.source.definition()
        definition["options"] = {k: "***" if _SECRET.search(k) else v for k, v in definition["options"].items()}
        return {"name": self.name, **definition, "state": self.state, "paused": self._paused,
                **self.counts, **self.rates, "lag": lag, "lag_total": sum(lag.values()),
                "caught_up": bool(self.high) and set(self.high) >= set(self.positions) and not any(lag.values()),
                "offsets": dict(self.positions), "last_error": self.last_error,
                "recent_errors": list(self.errors), "error_log": self._error_log}

    # -- the thread -------------------------------------------------------------------
    def _run(self) -> None:
        from confluent_kafka import Consumer

        conf = {"bootstrap.servers": self.source.bootstrap_servers, "group.id": self.source.group,
                "enable.auto.commit": False, "enable.auto.offset.store": False,
                "auto.offset.reset": self.source.start, "topic.metadata.refresh.interval.ms": 1000,
                "error_cb": self._client_error, **self.source.options}
        try:
            consumer = self._consumer = Consumer(conf)
            consumer.subscribe([self.source.topic], on_assign=self._on_assign)
            self.state = "waiting for partitions"
            while not self._stop.is_set():
                if self._paused:
                    self._wait_paused(consumer)
                    continue
                # the first message as soon as there is one, then what the client holds
                # already: a batch is as large as the backlog allows, and never waited for
                first = consumer.poll(POLL_SECONDS if not self._in_flight else 0)
                if first is None:
                    self._drain()  # nothing new: what is under way is finished now
                    self._sample(consumer)
                    continue
                msgs = [first, *consumer.consume(BATCH_MESSAGES * self.coll.n_shards - 1, 0)]
                got = [m for m in msgs if m.error() is None]
                for m in msgs:
                    if m.error() is not None:
                        self._client_error(m.error())
                if got:
                    self._store(got)
                    self.state = "running"
                self._sample(consumer)
            self._drain()
        except Exception as e:  # noqa: BLE001 - the source stops; status() says why
            self.state = "failed"
            self.last_error = f"{type(e).__name__}: {e}"
        finally:
            try:
                self._drain()  # (after a failure: the puts under way end before the shards may close)
            except Exception:  # noqa: BLE001 - the failure is the one status() shows
                pass
            if self._consumer is not None:
                try:
                    self._consumer.close()
                except Exception:  # noqa: BLE001 - closing a consumer whose broker is gone
                    pass
            if self.state != "failed":
                self.state = "stopped"

    def _wait_paused(self, consumer) -> None:
        """Hold the partitions until resumed or stopped, still polling (the group keeps
        this consumer): a message polled meanwhile is sought back, never dropped."""
        from confluent_kafka import TopicPartition

        self._drain()
        self.state = "paused"
        if consumer.assignment():
            consumer.pause(consumer.assignment())
        while self._paused and not self._stop.is_set():
            m = consumer.poll(0.1)
            if m is not None and m.error() is None:
                tp = TopicPartition(self.source.topic, m.partition(), m.offset())
                consumer.seek(tp)
                consumer.pause([tp])
        if consumer.assignment():
            consumer.resume(consumer.assignment())

    def _client_error(self, err) -> None:
        """librdkafka's errors: transient ones (a broker away, a topic not there yet) are
        shown, and consumption goes on as the client retries."""
        from confluent_kafka import KafkaError

        if err.code() == KafkaError._PARTITION_EOF:
            return
        self.last_error = err.str()
        if err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            self.state = "waiting for topic"
        elif err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self.state = "broker unreachable"

    def _on_assign(self, consumer, partitions) -> None:
        """Start each assigned partition where every shard has stored it (the first time,
        where ``start`` says, recorded in every shard before anything is consumed)."""
        self._drain()
        stored = self._stored = [s.source_offsets(self.name) for s in self.coll._shards]
        first: list = []
        for tp in partitions:
            have = [st[tp.partition] for st in stored if tp.partition in st]
            if have:
                tp.offset = min(have)
            else:
                low, high = consumer.get_watermark_offsets(tp, timeout=10)
                tp.offset = low if self.source.start == "earliest" else high
                first.append(tp)
            self.positions[tp.partition] = tp.offset
        if first:  # written before consuming, so that a crash never leaves a shard without it
            meta = [(keys.meta_source_offset(self.name, tp.partition), keys.u64(tp.offset)) for tp in first]
            for s, done in zip(self.coll._shards, stored):
                s.put_many([], meta=meta)
                done.update((tp.partition, tp.offset) for tp in first)
        consumer.assign(partitions)
        if self._paused:
            consumer.pause(partitions)
        else:
            self.state = "running"

    def _store(self, msgs: list) -> None:
        """One batch into every shard, with the partitions' next offsets, skipping in each
        shard what it stored before (see the module doc)."""
        transform = self.coll._transform  # the collection's, as it is for this batch
        chunk: list = []
        where: list[tuple[int, int]] = []  # (partition, offset) of each chunk item
        ends: dict[int, int] = {}
        nbytes = 0
        for m in msgs:
            p, o, value = m.partition(), m.offset(), m.value()
            ends[p] = max(ends.get(p, 0), o + 1)
            nbytes += len(value or b"")
            doc = self._item(value or b"", p, o, transform)
            if doc is None:
                continue
            chunk.append((len(chunk), doc))
            where.append((p, o))
        prepared = ingest.prepare(chunk, self.coll._limits, self.coll.n_shards) if chunk else None
        for e in prepared.errors if prepared is not None else ():
            self._log_error(*where[e.index], f"{e.path}: {e.message}" if e.path else e.message)
        meta = [(keys.meta_source_offset(self.name, p), keys.u64(o)) for p, o in sorted(ends.items())]
        indexers = self.coll._runtime.indexers
        puts = []
        for s, shard in enumerate(self.coll._shards):
            done = self._stored[s]
            items = [] if prepared is None else [
                it for it in prepared.per_shard[s] if where[it[0]][1] >= done.get(where[it[0]][0], 0)]
            if indexers:  # shard s always on the same thread: its puts stay in order
                puts.append(indexers[s % len(indexers)].submit(shard.put_many, items, meta=meta))
            else:
                puts.append(ingest._Done(shard.put_many, items, meta=meta))
        self.counts["messages"] += len(msgs)
        self.counts["bytes"] += nbytes
        self._in_flight.append((puts, where, ends, msgs))
        while len(self._in_flight) >= IN_FLIGHT:
            self._finish_first()

    def _finish_first(self) -> None:
        """Wait for the oldest batch's puts: then it is durable in every shard, and its
        offsets are the collection's and are committed to the group."""
        puts, where, ends, msgs = self._in_flight.popleft()
        stored = 0
        failed = None
        for s, put in enumerate(puts):
            try:
                errors, _, out = put.result()
            except BaseException as e:  # noqa: BLE001 - after the other puts are waited for
                failed = failed or e
                continue
            for idx, e in errors:
                self._log_error(*where[idx], e.message)
            stored += sum(1 for it in out if it[4] >= 0)
            self._stored[s].update(ends)
        if failed is not None:
            raise failed
        self.positions.update(ends)
        self.counts["documents"] += stored
        self.counts["batches"] += 1
        if self._consumer is not None:
            self._consumer.commit(offsets=self._commit_offsets(msgs), asynchronous=True)

    def _drain(self) -> None:
        """Wait for every batch under way (before the partitions change, a pause, a stop)."""
        while self._in_flight:
            self._finish_first()

    def _item(self, value: bytes, partition: int, offset: int, transform: Transformation | None) -> Any:
        """What ingest takes for a message: its JSON text as it came (or as the
        transformation rewrote it) with the ``_id`` of its offset added where it has none,
        or the document parsed (the text way could not take it); None when it is not
        stored (logged as an error, or counted as filtered)."""
        text: Any = value if transform is None else None
        if transform is not None and transform.takes_text:
            try:
                text = transform.text(value)
            except SchemaError as e:
                self._log_error(partition, offset, e.message)
                return None
            if text is None:
                self.counts["filtered"] += 1
                return None
        if text is not None and text is not FALLBACK:
            status, doc_id, _, _, close, members = scan_top(text)
            if status == 0:
                if doc_id is not None:
                    return documents.Line(None, text)
                return documents.Line(None, text[:close].rstrip() + (b"," if members else b"") + b'"_id":' +
                                      orjson.dumps(message_id(self.source.topic, partition, offset)) + b"}")
        doc = self._document(value, partition, offset)
        if doc is not None and transform is not None:
            try:
                doc = transform(doc)
            except SchemaError as e:
                self._log_error(partition, offset, e.message)
                return None
            if doc is None:
                self.counts["filtered"] += 1
        if doc is not None and "_id" not in doc:
            doc["_id"] = message_id(self.source.topic, partition, offset)
        return doc

    def _document(self, value: bytes | None, partition: int, offset: int) -> dict | None:
        """A message's document, or None (logged) when it is not a JSON object."""
        try:
            doc = orjson.loads(value or b"")
        except orjson.JSONDecodeError as e:
            self._log_error(partition, offset, f"not JSON: {e}")
            return None
        if type(doc) is not dict:
            self._log_error(partition, offset, f"a document must be a JSON object, not {type(doc).__name__}")
            return None
        return doc

    def _log_error(self, partition: int, offset: int, why: str) -> None:
        entry = {"partition": partition, "offset": offset, "error": why, "at": time.time()}
        self.errors.append(entry)
        self.counts["errors"] += 1
        os.makedirs(os.path.dirname(self._error_log), exist_ok=True)
        if os.path.exists(self._error_log) and os.path.getsize(self._error_log) > ERROR_LOG_BYTES:
            os.replace(self._error_log, self._error_log + ".1")
        with open(self._error_log, "ab") as f:
            f.write(orjson.dumps(entry) + b"\n")

    def _commit_offsets(self, msgs: list) -> list:
        from confluent_kafka import TopicPartition

        return [TopicPartition(self.source.topic, p, o) for p, o in
                {m.partition(): self.positions[m.partition()] for m in msgs}.items()]

    def _sample(self, consumer) -> None:
        """Rates and high watermarks, once every LAG_EVERY seconds."""
        now = time.monotonic()
        if now - self._lag_read < LAG_EVERY:
            return
        self._lag_read = now
        t, m, b = self._rate
        if now > t:
            self.rates = {"messages_per_s": (self.counts["messages"] - m) / (now - t),
                          "bytes_per_s": (self.counts["bytes"] - b) / (now - t)}
        self._rate = (now, self.counts["messages"], self.counts["bytes"])
        for tp in consumer.assignment():
            # the end each fetch reply carries, cached by the client; asking the broker
            # waits behind the consumer's own pending fetch (fetch.wait.max.ms a partition),
            # so only a partition not fetched yet is asked
            try:
                _, high = consumer.get_watermark_offsets(tp, cached=True)
                if high < 0:
                    _, high = consumer.get_watermark_offsets(tp, timeout=1, cached=False)
            except Exception:  # noqa: BLE001 - a broker away: the lag shown is the last read
                continue
            if high >= 0:
                self.high[tp.partition] = high
