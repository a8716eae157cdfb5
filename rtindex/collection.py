"""Collection: a named set of documents, split into shards by a hash of ``_id``."""

from __future__ import annotations

import itertools
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from rtindex import columnar, documents, ingest
from rtindex.documents import ItemError, Limits
from rtindex.errors import (
    AlreadyExistsError,
    ClosedError,
    CorruptionError,
    IngestError,
    IngestWarning,
    InvalidArgumentError,
    NotFoundError,
    ReadOnlyError,
    SchemaError,
    SqlError,
)
from rtindex.fence import Fence
from rtindex.jsonfile import read_json, write_json_atomic
from rtindex.inputs import Input, array_of_objects, open_file, open_input, slice_rows
from rtindex.patch import apply_patch
from rtindex.progress import CtrlC, Progress
from rtindex.runtime import Runtime
from rtindex.shard import Shard
from rtindex.snapshot import Snapshot
from rtindex.sources import MAX_SOURCES, KafkaSource, SourceRunner
from rtindex.transform import Transformation


@dataclass
class IngestStats:
    """What one ingest() call did.

    ``n`` counts distinct documents: an ``_id`` given twice in one call is one document
    (the later version replaced the earlier one within the call, so only one is stored),
    and ``ids`` lists each stored ``_id`` once, in the order of its first appearance in the
    input. ``bytes`` is the size of the version of each that is stored at the end. So
    ``n == len(ids)``, and a caller that counts ``n`` counts what a read will find.
    """

    n: int = 0  # distinct documents stored (an _id given twice counts once)
    bytes: int = 0  # their size as stored JSON (the last version of each)
    seconds: float = 0.0
    ids: list = field(default_factory=list)  # _id of each stored document, once, in order of first appearance
    errors: list[ItemError] = field(default_factory=list)  # documents not stored, and why
    replaced: list[int] = field(default_factory=list)  # input positions of documents that replaced a stored version
    fence: str = ""  # write fence covering this call (Database.wait_for in a reader process)
    doc_ids: dict = field(default_factory=dict, repr=False)  # input position -> the _id that document had or was given
    notes: list[str] = field(default_factory=list)  # what the call may not have done as meant (also warned)
    filtered: int = 0  # documents the collection's ingest transformation left out (its WHERE)

    def __repr__(self) -> str:
        return (f"IngestStats(n={self.n}, bytes={self.bytes}, seconds={self.seconds:.3f}, "
                f"errors={len(self.errors)}" + (f", filtered={self.filtered})" if self.filtered else ")"))

    def _tally(self, written: dict[Any, tuple[Any, int]], t0: float) -> None:
        """``n``, ``ids`` and ``bytes`` from ``written`` (id key -> (_id, size of its stored
        version); a dict keeps the first insertion's position when a key is assigned again),
        errors and replacements in input order, and the seconds since ``t0``: the end of an
        ingest, embedded (Collection) or over HTTP (RemoteCollection)."""
        self.ids = [doc_id for doc_id, _ in written.values()]
        self.n = len(written)
        self.bytes = sum(size for _, size in written.values())
        self.errors.sort(key=lambda e: e.index)
        self.replaced.sort()
        self.seconds = time.perf_counter() - t0

    def _settle(self, errors: str, stacklevel: int) -> None:
        """Act on failed documents as ``errors`` says (see Collection.ingest); ``stacklevel``
        makes the warning point at the caller of ``ingest()``."""
        if not self.errors or errors == "report":
            return
        k = len(self.errors)
        shown = "; ".join(str(e) for e in self.errors[:2]) + (f"; and {k - 2} more" if k > 2 else "")
        if self.n == 0:
            raise IngestError(f"no document was stored: {k} failed (all are in .stats.errors): {shown}", self)
        head = (f"{k} document{' was' if k == 1 else 's were'} not stored and the other {self.n} "
                f"{'was' if self.n == 1 else 'were'}")
        if errors == "raise":
            raise IngestError(f"{head} (all failures are in .stats.errors): {shown}", self)
        warnings.warn(IngestWarning(f"{head}: {shown}. All failures are in stats.errors; pass errors='report' "
                                    f"to ingest() to read them without this warning, or errors='raise' "
                                    f"to raise IngestError"), stacklevel=stacklevel)


ERRORS = ("warn", "report", "raise")
def check_ingest_options(batch_size: int, errors: str) -> None:
    """ValueError for a batch size or an ``errors`` choice ingest cannot use."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidArgumentError(f"batch_size must be a positive integer, not {batch_size!r}")
    if errors not in ERRORS:
        raise InvalidArgumentError(f"errors must be one of {', '.join(map(repr, ERRORS))}, not {errors!r}")


SOURCES_FILE = "sources.json"  # {name: {"source": its definition, "paused": bool}}
TRANSFORMATION_FILE = "transformation.json"  # {"sql": the text, "set": when (ns)}


def _shard_path(path: str, i: int) -> str:
    return os.path.join(path, f"shard-{i:03d}")


def _check_shard_exists(name: str, shard_path: str, n_shards: int) -> None:
    """CorruptionError naming the shard unless it is a RocksDB directory we can read.

    RocksDB writes ``CURRENT`` when it creates a database and never removes it, so a shard
    directory without one was emptied or damaged after the collection was made.
    """
    where = f"collection {name!r} lists {n_shards} shards in its manifest, but shard {shard_path}"
    restore = (f"restore {os.path.dirname(shard_path)} from a backup, or remove that directory "
               f"to give up the collection")
    if not os.path.isdir(shard_path):
        raise CorruptionError(f"{where} is missing; {restore}")
    current = os.path.join(shard_path, "CURRENT")
    if not os.path.isfile(current):
        raise CorruptionError(f"{where} has no RocksDB CURRENT file (it was emptied or damaged); {restore}")
    if not os.access(shard_path, os.R_OK | os.W_OK | os.X_OK) or not os.access(current, os.R_OK):
        raise CorruptionError(f"{where} is not readable and writable by this process "
                              f"(check its owner and permissions, or {restore})")


class Collection:
    """A handle on one collection; get it from ``db.create_collection()`` or ``db[name]``."""

    def __init__(self, runtime: Runtime, name: str, path: str, n_shards: int, *, created: int = 0,
                 create: bool = False):
        """``create`` is True only from Database.create_collection: only then may shards be
        made. Opening an existing collection first checks that every shard its manifest lists
        is there, because opening a missing one would silently make a fresh, empty shard (and
        its documents would be gone without a word). ``created`` is the creation stamp from
        the manifest (nanoseconds; 0 for collections made before it was recorded): write
        fences carry it."""
        self._runtime = runtime
        self.name = name
        self.created = created
        self.path = path
        self.n_shards = n_shards
        self._limits = runtime.limits
        self._closed = False
        self._shards: list = []  # ShardWriter, or ShardReader in a reader process
        # (generation, the snapshot of the shards' current states): made by the first read
        # after a shard publishes a state, handed to every read until the next one does
        self._generations = itertools.count()
        self._generation = next(self._generations)
        self._snapshot: tuple[int, Snapshot] | None = None
        if not create:
            for i in range(n_shards):
                _check_shard_exists(name, _shard_path(path, i), n_shards)
        try:
            for i in range(n_shards):
                self._shards.append(runtime.open_shard(_shard_path(path, i), i, create=create))
                self._shards[-1].on_publish = self._states_changed
        except BaseException:
            for s in self._shards:
                s.close()
            raise
        self._sources_lock = threading.Lock()
        self._runners: dict[str, SourceRunner] = {}
        self._transform = self._load_transformation()
        if not runtime.reader:
            for name, entry in self._source_definitions().items():
                self._run_source(KafkaSource.from_definition(entry["source"]), entry.get("paused", False))

    def __repr__(self) -> str:
        return f"<rtindex.Collection {self.name!r} shards={self.n_shards}>"

    @property
    def closed(self) -> bool:
        """True once its database was closed or the collection dropped: any use raises ClosedError."""
        return self._closed

    def _check(self) -> None:
        if self._closed:
            raise ClosedError(f"collection {self.name!r} is closed (its database was closed or dropped)")

    def _check_writable(self) -> None:
        self._check()
        if self._runtime.reader:
            raise ReadOnlyError(f"collection {self.name!r} is opened by a reader (role=\"reader\"): "
                                "write through the database's writer process")

    # -- writes -------------------------------------------------------------
    def ingest(self, docs: Any, batch_size: int = 1000, *, errors: str = "warn",
               progress: bool | None = None, json_path: str | None = None) -> IngestStats:
        """Store documents; each replaces any stored document with the same ``_id``.

        ``docs`` is an iterable of dicts; the bytes/str of a JSON array or of NDJSON; a file
        (a path as str or pathlib.Path, or an open file: NDJSON, JSON array, Parquet, also
        gzip'd JSON); a pandas DataFrame or a pyarrow Table/RecordBatch (see
        :mod:`rtindex.inputs`). Python values are stored as the JSON they mean (numpy
        numbers, datetimes as microseconds, ...: docs/reference.md has the table).

        A document is visible to every read that starts after the call returns, and durable
        (its shard's WAL) once it is counted in the returned stats. A bad document is listed
        in ``stats.errors`` (position, path, reason) and costs nothing else; ``errors``
        says what else happens then: ``"warn"`` an :class:`~rtindex.IngestWarning`,
        ``"report"`` nothing, ``"raise"`` an :class:`~rtindex.IngestError` (after storing
        the good ones). When every document fails, IngestError unless ``"report"``.
        The same ``_id`` twice in one call stores the later version and counts once (see
        :class:`IngestStats`). ``progress``: a bar with docs/s and MB/s (None: when someone
        can see it and the call takes over a second or two). Ctrl-C stops between
        batches; what was stored stays stored, and the KeyboardInterrupt says how much.

        ``json_path`` (``"statuses"``, ``"data.items"``): the documents are the elements of
        the array at that path of one JSON document (text or a file), as an API's answer
        holds them. JSON that is one object and was stored as one document, while it holds
        an array of objects, gets a note in ``stats.notes`` (and an IngestWarning unless
        ``errors="report"``) naming the ``json_path`` that would store them.
        """
        self._check_writable()
        check_ingest_options(batch_size, errors)
        return self._ingest(open_input(docs, batch_size, json_path), batch_size, errors, progress)

    def ingest_file(self, path: str | os.PathLike, *, progress: bool | None = None, errors: str = "warn",
                    batch_size: int = 1000, json_path: str | None = None) -> IngestStats:
        """Store the documents of a file, read in batches (never whole, but a JSON array).

        The format comes from the name: ``.ndjson``/``.jsonl`` (NDJSON; ``ItemError.index``
        is the line number - 1), ``.json`` (a JSON array, or NDJSON), ``.parquet`` (index:
        the row number), the JSON ones also ``.gz``. Otherwise as :meth:`ingest` (``json_path``
        too); the bar shows bytes of the file read.
        """
        self._check_writable()
        check_ingest_options(batch_size, errors)
        source = open_file(path, batch_size) if json_path is None else open_input(path, batch_size, json_path)
        return self._ingest(source, batch_size, errors, progress)

    def _ingest(self, source: Input, batch_size: int, errors: str, progress: bool | None) -> IngestStats:
        t0 = time.perf_counter()
        stats = IngestStats()
        limits = self._limits
        n_shards = self.n_shards
        written: dict[bytes, tuple[Any, int]] = {}  # id key -> (_id, size of the last stored version)
        bar = Progress(progress, source.total, source.unit, self.name)

        def done(c: ingest.Chunk) -> None:  # a chunk committed in every shard: count it
            stats.errors.extend(c.errors)
            stats.replaced.extend(c.replaced)
            stats.filtered += c.filtered
            stats.doc_ids.update(c.ids)
            total = 0
            ids = c.ids
            c.stored.sort()  # input order: the later version of an _id wins, and ids come out in order
            for idx, id_key, size in c.stored:
                written[id_key] = (ids[idx], size)
                total += size
            bar.update(len(c.ids) + len(c.errors), total, len(stats.errors), source.tell() if source.tell else None)

        transform = self._transform  # in force when the call began, for all of it
        pipe = ingest.Pipeline(self._shards, limits, self._runtime.indexers, done, transform)
        try:
            with source, CtrlC() as ctrl_c, ingest.ingest_mode():
                try:
                    for first, batch in source.batches or ():  # a table: column-wise (then items is empty)
                        if transform is not None:  # (row by row: the transformation takes dicts)
                            batch = list(slice_rows(first, batch))
                        with ctrl_c.batch():
                            nbytes = self._ingest_batch(first, batch, limits, n_shards, stats, written, pipe)
                        if nbytes is not None:
                            bar.update(len(batch), nbytes, len(stats.errors), None)
                        ingest.collect_young()
                    chunk: list = []
                    for item in source.items:
                        chunk.append(item)
                        if len(chunk) >= batch_size:
                            with ctrl_c.batch():
                                pipe.add(chunk)
                            chunk = []
                            ingest.collect_young()
                    with ctrl_c.batch():
                        if chunk:
                            pipe.add(chunk)
                        pipe.drain()
                except KeyboardInterrupt:
                    with ctrl_c.batch():
                        pipe.drain()  # what was begun is stored, then the interrupt goes on
                    raise
                except BaseException:
                    try:
                        pipe.drain()  # (nothing more is begun after a failed put)
                    except BaseException:
                        pass
                    raise
        except KeyboardInterrupt as e:
            e.add_note(f"rtindex: ingest into collection {self.name!r} was interrupted; the {len(written)} "
                       f"documents it had stored stay stored ({len(stats.errors)} failed)")
            raise
        finally:
            bar.close()
        stats.fence = self.fence()
        stats._tally(written, t0)
        if source.json_text and stats.n == 1 and not stats.errors:
            self._note_one_object(stats, errors)
        stats._settle(errors, stacklevel=4)  # _settle < _ingest < ingest < the caller
        return stats

    def _note_one_object(self, stats: IngestStats, errors: str) -> None:
        """JSON that was one object, stored as one document: if it holds an array of
        objects, those were probably the documents meant; say how to store them."""
        doc = self.get(stats.ids[0])
        found = array_of_objects(doc) if doc is not None else None
        if found is None:
            return
        path, n = found
        size = f"{stats.bytes / 1024:,.0f} KB" if stats.bytes >= 10_240 else f"{stats.bytes:,} bytes"
        note = (f"stored 1 document of {size}; its field {path} is an array of {n:,} "
                f"objects: pass json_path={path!r} to store them as documents")
        stats.notes.append(note)
        if errors != "report":
            warnings.warn(IngestWarning(note), stacklevel=4)

    def _ingest_batch(self, first: int, batch: pa.RecordBatch | list, limits: Limits, n_shards: int,
                      stats: IngestStats, written: dict[bytes, tuple[Any, int]], pipe: ingest.Pipeline) -> int | None:
        """Store a table's record batch (its first row at position ``first``) column-wise
        (rtindex.columnar), or row by row through ``pipe`` when that cannot be done exactly
        (or ``batch`` is rows already, see Input.batches: None, the pipeline counts them).
        Returns the bytes stored."""
        prepared = None if isinstance(batch, list) else columnar.prepare(batch, documents.now_us(), limits)
        if prepared is None:
            pipe.add(list(slice_rows(first, batch)))
            pipe.drain()
            return None
        for part in columnar.split(prepared, n_shards):
            rows = part.rows.tolist()
            shard = self._shards[part.shard]
            for start in range(0, len(rows), ingest.PUT_DOCS):
                at = rows[start : start + ingest.PUT_DOCS]
                replaced = shard.put_columns(prepared.names, [a.slice(start, ingest.PUT_DOCS) for a in part.arrays],
                                             [prepared.id_keys[i] for i in at], [prepared.json[i] for i in at],
                                             [prepared.generated[i] for i in at])
                stats.replaced.extend(first + at[k] for k in replaced)
        # every row was stored (put_columns stores all or raises); in input order, so that
        # of two versions of an _id the later one's size counts
        sizes = list(map(len, prepared.json))
        written.update(zip(prepared.id_keys, zip(prepared.ids, sizes)))
        stats.doc_ids.update(zip(range(first, first + len(prepared.ids)), prepared.ids))
        return sum(sizes)

    def _shard_for(self, doc_id: Any) -> tuple[Shard, bytes]:
        id_key = documents.encode_id(doc_id)
        return self._shards[documents.shard_of(id_key, self.n_shards)], id_key

    def delete(self, doc_id: Any) -> bool:
        """Delete a document by ``_id``; True if it existed."""
        self._check_writable()
        shard, id_key = self._shard_for(doc_id)
        return shard.delete_many([id_key])[0]

    def patch(self, doc_id: Any, ops: list[dict]) -> dict:
        """Apply an RFC 6902 JSON Patch to a stored document atomically; returns the new one.

        ``_id`` cannot be changed; removing ``_event_time`` keeps the old one.
        """
        self._check_writable()
        shard, id_key = self._shard_for(doc_id)
        with shard.write_lock:
            doc = shard.get(id_key)
            if doc is None:
                raise NotFoundError(f"no document with _id {doc_id!r} in collection {self.name!r}")
            new = apply_patch(doc, ops)  # SchemaError naming the operation and path that fail
            if not isinstance(new, dict):
                raise SchemaError("a patch must leave an object")
            if new.get("_id", doc_id) != doc_id:
                raise SchemaError("a patch cannot change _id", "$._id")
            new["_id"] = doc_id
            if new.get("_event_time") is None:
                new["_event_time"] = doc["_event_time"]
            _, _, d, raw = documents.prepare(new, self._limits, documents.now_us())
            errors, _, _ = shard.put_many([(0, id_key, d, raw)])
            if errors:
                raise errors[0][1]
            return d

    def fence(self) -> str:
        """A write fence covering every write to this collection acknowledged so far: give
        it to ``Database.wait_for`` (or the service's ``min_fence``) in a reader process to
        read your writes there. In a reader, the writes it sees so far."""
        self._check()
        return str(Fence(self.name, self.created, tuple(s.change_count for s in self._shards)))

    def flush(self) -> None:
        """Seal every in-memory segment and wait for background sealing and merging.

        Never needed for correctness (ingested documents are durable and visible at once);
        useful before measuring, or to make on-disk state compact.
        """
        self._check_writable()
        for s in self._shards:
            s.seal_now()
        for s in self._shards:
            s.wait_for_background()

    # -- reads --------------------------------------------------------------
    def get(self, doc_id: Any) -> dict | None:
        """The stored document with this ``_id``, or None."""
        self._check()
        shard, id_key = self._shard_for(doc_id)
        return shard.get(id_key)

    def __len__(self) -> int:
        self._check()
        return sum(s.state.count() for s in self._shards)

    def count(self) -> int:
        """Number of documents (same as ``len(collection)``)."""
        return len(self)

    def snapshot(self) -> Snapshot:
        """A consistent read view of every shard (see :class:`rtindex.Snapshot`)."""
        self._check()
        generation, cached = self._generation, self._snapshot
        if self._runtime.reader:  # rows arrive without a published state: compare the states
            states = [s.state for s in self._shards]
            if cached is not None and all(a is b for a, b in zip(cached[1].states, states)):
                return cached[1]
            snap = Snapshot(self, states)
            self._snapshot = (generation, snap)
            return snap
        if cached is not None and cached[0] == generation:
            return cached[1]
        snap = Snapshot(self)  # (of states at least as new as ``generation``)
        if self._generation == generation:  # no state published meanwhile: still current
            self._snapshot = (generation, snap)
        return snap

    def _states_changed(self) -> None:
        """A shard published a state (Shard.on_publish): the cached snapshot is out of date.
        Dropped at once rather than at the next read, which may be long in coming: it holds
        the segments a merge retired, and so their files."""
        self._generation = next(self._generations)
        self._snapshot = None

    # -- sources (rtindex/sources.py) --------------------------------------------------
    def add_source(self, source: KafkaSource, exist_ok: bool = False) -> dict:
        """Consume ``source`` into this collection, exactly once, from now on: on a thread of
        this process, and of every later writer of this database (the definition is kept in
        the collection's directory). Returns its status (see :meth:`sources`).
        ``exist_ok``: a source of that name and the same definition is no error."""
        self._check_writable()
        if not isinstance(source, KafkaSource):
            raise InvalidArgumentError(f"add_source takes a rtindex.KafkaSource, not {type(source).__name__}")
        source = source.checked(self.name)
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            raise InvalidArgumentError("a Kafka source needs confluent-kafka: pip install 'rtindex[kafka]'") from None
        with self._sources_lock:
            if source.name in self._runners:
                if exist_ok and self._runners[source.name].source == source:
                    return self._runners[source.name].status()
                raise AlreadyExistsError(f"collection {self.name!r} already has a source named {source.name!r}")
            if len(self._runners) >= MAX_SOURCES:
                raise InvalidArgumentError(f"collection {self.name!r} has {MAX_SOURCES} sources, the most it may have")
            self._save_source(source.name, {"source": source.definition(), "paused": False})
            self._run_source(source, False)
            return self._runners[source.name].status()

    def sources(self) -> list[dict]:
        """Each source's status: its definition, state (running, paused, waiting for topic,
        broker unreachable, failed), messages, bytes, documents and errors so far, rates,
        lag per partition (and ``caught_up``: every partition stored up to the end the
        broker last reported), the offsets stored, and the most recent per-message errors
        (all of them are in its ``error_log`` file)."""
        self._check()
        return [r.status() for r in self._runners.values()]

    def source(self, name: str) -> dict:
        """One source's status (see :meth:`sources`)."""
        return self._runner(name).status()

    def pause_source(self, name: str) -> dict:
        """Stop consuming (the position is kept) until :meth:`resume_source`, across reopens."""
        return self._set_paused(name, True)

    def resume_source(self, name: str) -> dict:
        """Consume again from where the paused source stopped."""
        return self._set_paused(name, False)

    def remove_source(self, name: str) -> None:
        """Stop consuming and forget the source, its stored offsets included: a source added
        again under that name starts where its ``start`` says."""
        self._check_writable()
        with self._sources_lock:
            runner = self._runner(name)
            runner.stop()
            del self._runners[name]
            self._save_source(name, None)
            for shard in self._shards:
                shard.drop_source(name)

    def _runner(self, name: str) -> SourceRunner:
        self._check()
        runner = self._runners.get(name)
        if runner is None:
            raise NotFoundError(f"collection {self.name!r} has no source named {name!r}")
        return runner

    def _set_paused(self, name: str, paused: bool) -> dict:
        self._check_writable()
        with self._sources_lock:
            runner = self._runner(name)
            self._save_source(name, {"source": runner.source.definition(), "paused": paused})
            runner.pause() if paused else runner.resume()
            return runner.status()

    def _source_definitions(self) -> dict:
        path = os.path.join(self.path, SOURCES_FILE)
        return read_json(path, "sources file") if os.path.exists(path) else {}

    def _save_source(self, name: str, entry: dict | None) -> None:
        defs = self._source_definitions()
        if entry is None:
            defs.pop(name, None)
        else:
            defs[name] = entry
        write_json_atomic(os.path.join(self.path, SOURCES_FILE), defs)

    def _run_source(self, source: KafkaSource, paused: bool) -> None:
        runner = SourceRunner(self, source, paused)
        self._runners[source.name] = runner
        runner.start()

    # -- the ingest transformation (rtindex/transform.py) ------------------------------
    @property
    def transformation(self) -> str | None:
        """The SQL of the ingest transformation applied to every incoming document, or None."""
        self._check()
        return self._transform.sql if self._transform is not None else None

    def set_transformation(self, sql: str | None) -> None:
        """Apply ``SELECT ... FROM _input [WHERE ...]`` to every document that arrives from
        now on, on every path (ingest, files, HTTP, sources); None removes it. Documents
        stored before keep their shape. The text is checked first: a SqlError names what
        is wrong and changes nothing. An ingest call under way goes on with the one it began
        with. See docs/sources.md."""
        self._check_writable()
        transform = Transformation(sql) if sql is not None else None
        path = os.path.join(self.path, TRANSFORMATION_FILE)
        if transform is None:
            if os.path.exists(path):
                os.remove(path)
        else:
            write_json_atomic(path, {"sql": sql, "set": time.time_ns()})
        self._transform = transform

    def _load_transformation(self) -> Transformation | None:
        path = os.path.join(self.path, TRANSFORMATION_FILE)
        if not os.path.exists(path):
            return None
        got = read_json(path, "transformation file")
        try:
            return Transformation(got["sql"])
        except (KeyError, TypeError, SqlError) as e:
            raise CorruptionError(f"collection {self.name!r}: its transformation file {path} does not hold a "
                                  f"transformation rtindex can apply ({e}); set it again or remove the file") from None

    def stats(self) -> dict:
        """Counts per shard: rows, sealed and in-memory segments, approximate disk bytes."""
        self._check()
        out = []
        for s in self._shards:
            st = s.state
            out.append({
                "shard": s.index,
                "documents": st.count(),
                "next_row_id": st.next_row_id,
                "sealed_segments": sum(1 for v in st.views if v.sealed),
                "memory_segments": sum(1 for v in st.views if not v.sealed),
                "disk_bytes": s.store.approximate_size(),
            })
            if self._runtime.reader:
                out[-1]["lag"] = s.lag()
        got = {"name": self.name, "documents": sum(x["documents"] for x in out), "shards": out}
        if self._runners:
            got["sources"] = self.sources()
        return got

    def _close(self) -> None:
        if self._closed:
            return
        for runner in list(self._runners.values()):
            runner.stop()
        try:
            if not self._runtime.reader:
                for s in self._shards:
                    s.wait_for_background()  # re-raises a background failure, after which ...
        finally:
            self._closed = True  # ... every shard is still closed
            self._snapshot = None  # (it holds segments: a closed collection has none to serve)
            for s in self._shards:
                s.close()
