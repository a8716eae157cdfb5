"""The coordinator: a Database API over a Ray cluster's shard groups.

Writes are routed by ``_id`` (``crc32 % shards``, as in one process) to the writer actor of
the shard's group, every group's part at once; a batch is acknowledged when every part is
durable. Queries are planned and finished here by the SQL engine of one process, reading
through rtindex/cluster/snapshot.py: lookups, fetches and scans run in the groups' query
actors, next to the data. A group that cannot be reached is an UnavailableError naming its
shards, never a partial answer.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from dataclasses import replace
from typing import Any

import orjson
import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayTaskError

from rtindex import documents
from rtindex._impl import scan_top
from rtindex.collection import IngestStats, check_ingest_options
from rtindex.cluster.groups import GroupFiles, GroupReader, GroupStoppedError, GroupWriter, SnapshotExpiredError
from rtindex.cluster.local import Answered, LocalReader
from rtindex.cluster.placement import (
    CATALOG, HEAD_RESOURCE, NAMESPACE, SLIVER, Catalog, group_path, node_addresses, node_names, pinned,
)
from rtindex.cluster.snapshot import ClusterSnapshot
from rtindex.database import MAX_RESULT_BYTES, _canonical, check_new_collection
from rtindex.documents import ItemError
from rtindex.fence import Fence
from rtindex.errors import (
    ClosedError, FenceError, InvalidArgumentError, NotFoundError, RtindexError, SchemaError, UnavailableError,
)
from rtindex.inputs import open_input
from rtindex.sql.engine import SqlEngine
from rtindex.sql.plan import Plan
from rtindex.sql.result import Result

log = logging.getLogger("rtindex")

NOT_YET = "{what} are not available on a cluster's collections yet (docs/scale-out.md)"
SEND_DOCS = 5000  # documents routed per round of writes to the groups
ATTEMPTS = 3  # runs of a query whose snapshot a restarted query actor no longer holds
ASKED_MAX = 4096  # planner questions remembered per collection, asked again with each snapshot
OPTIONS_DEFAULT = {"row_cache_bytes": 32 << 20, "column_cache_bytes": 64 << 20}


class ClusterDatabase:
    """The collections of a Ray cluster, with rtindex.Database's API (open it with
    rtindex.open_cluster). Several coordinators may share a cluster."""

    def __init__(self, address: str, root: str | None, query_actors: int, options: dict, call_timeout: float,
                 local_reads: bool = True):
        if isinstance(query_actors, bool) or not isinstance(query_actors, int) or query_actors < 1:
            raise InvalidArgumentError(f"query_actors must be a positive integer, not {query_actors!r}")
        if not ray.is_initialized():
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
        self._catalog = _catalog(root)
        self.root = ray.get(self._catalog.root_path.remote())
        if root is not None and root != self.root:
            raise InvalidArgumentError(f"this cluster keeps its collections under {self.root!r}, not {root!r}")
        self.query_actors = query_actors
        self.options = {**OPTIONS_DEFAULT, **options}
        self.call_timeout = call_timeout
        # node-local reads (rtindex/cluster/local.py): this machine's address, None when off
        self._here = ray.util.get_node_ip_address() if local_reads and not address.startswith("ray://") else None
        self._addresses: dict[str, str] = {}
        self._collections: dict[str, ClusterCollection] = {}
        # the result budget is the coordinator's (it builds the results); the rest is the groups'
        self._sql = SqlEngine(self.collection, self.options.get("max_result_bytes", MAX_RESULT_BYTES))
        self._closed = False

    # -- collections ------------------------------------------------------------
    def nodes(self) -> list[str]:
        """The storage nodes that are up (Ray nodes with an ``rtindex-node:NAME`` resource)."""
        return node_names(ray.nodes())

    def on_this_machine(self, node: str) -> bool:
        """True when storage node ``node`` runs on this process's machine and node-local
        reads are on."""
        if self._here is None:
            return False
        if node not in self._addresses:
            self._addresses = node_addresses(ray.nodes())
        return self._addresses.get(node) == self._here

    def create_collection(self, name: str, shards: int = 4, exist_ok: bool = False, *,
                          groups: int | None = None, transformation: str | None = None) -> ClusterCollection:
        """A collection of ``shards`` shards in ``groups`` groups (default: one per storage
        node, as many as divide ``shards``), each group on a storage node. ``transformation``:
        not on a cluster yet (InvalidArgumentError when given)."""
        self._check()
        check_new_collection(name, shards)
        if transformation is not None:
            raise InvalidArgumentError(NOT_YET.format(what="ingest transformations"))
        nodes = self.nodes()
        if not nodes:
            raise UnavailableError("no storage node is up: start Ray nodes with a resource "
                                   "'rtindex-node:NAME' (docs/scale-out.md)", [])
        if groups is None:
            groups = max(g for g in range(1, min(len(nodes), shards) + 1) if shards % g == 0)
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or shards % groups:
            raise InvalidArgumentError(f"groups must be a positive integer that divides shards ({shards}), "
                                       f"not {groups!r}")
        try:
            spec = ray.get(self._catalog.create.remote(name, shards, groups, nodes, self.options))
        except RayTaskError as e:
            if exist_ok and isinstance(e.cause, RtindexError) and "already exists" in str(e.cause):
                return self.collection(name)
            raise e.cause from None
        coll = self._collections[name] = ClusterCollection(self, name, spec)
        coll.start()
        return coll

    def collection(self, name: str) -> ClusterCollection:
        """An existing collection (NotFoundError if there is none)."""
        self._check()
        name = _canonical(name)
        coll = self._collections.get(name)
        if coll is None:
            spec = ray.get(self._catalog.specs.remote()).get(name) if isinstance(name, str) else None
            if spec is None:
                raise NotFoundError(f"no collection {name!r} (create it with db.create_collection({name!r}))")
            coll = self._collections[name] = ClusterCollection(self, name, spec)
        return coll

    __getitem__ = collection

    def __contains__(self, name: str) -> bool:
        return _canonical(name) in self.collection_names()

    def collection_names(self) -> list[str]:
        self._check()
        return sorted(ray.get(self._catalog.specs.remote()))

    def drop_collection(self, name: str) -> None:
        """Delete a collection: its actors and every group's directory."""
        coll = self.collection(name)
        coll.drop()
        ray.get(self._catalog.drop.remote(coll.name))
        self._collections.pop(coll.name, None)

    # -- queries ----------------------------------------------------------------
    def sql(self, sql: str, params: Any = None, *, access: str | None = None,
            timeout_ms: float | None = None) -> Result:
        """Database.sql over the cluster: the same dialect and the same answers."""
        self._check()
        res = self._again(lambda: self._sql.sql(sql, params, access, timeout_ms))
        if res.plan is not None:
            res.plan = self._placed(res.plan)
        return res

    def try_point(self, sql: str, params: Any = None, *, max_rows: int = 64) -> Result | None:
        """Database.try_point over the cluster."""
        self._check()
        return self._again(lambda: self._sql.try_point(sql, params, max_rows))

    def caught_up(self, fence: str) -> bool:
        """Whether reads started now see every write ``fence`` covers (a cluster collection's
        fence, from an ingest or Collection.fence in any coordinator): the reads of this one
        wait for those writes from now on, in each group's query actor, so it is True once
        the fence is known good (FenceError when it is not a fence of that collection)."""
        self._check()
        f = Fence.parse(fence)
        try:
            coll = self.collection(f.collection)
        except NotFoundError:
            return True  # dropped: nothing left to wait for
        coll.wait_for(f)
        return True

    def lag(self) -> dict:
        """The worst lag of a query actor behind its writer that this coordinator's reads
        saw (rows not indexed yet, milliseconds), as of each collection's last snapshot."""
        self._check()
        lags = [c.lag for c in list(self._collections.values())]
        return {"rows": sum(r for r, _ in lags), "ms": max((ms for _, ms in lags), default=0.0)}

    def explain(self, sql: str, params: Any = None, *, access: str | None = None) -> Plan:
        """Database.explain, with what runs where: each group's node and actors."""
        self._check()
        return self._placed(self._again(lambda: self._sql.explain(sql, params, access)))

    def _again(self, run):
        """``run()``, again when a restarted query actor dropped the snapshot it read."""
        for attempt in range(ATTEMPTS):
            try:
                return run()
            except (SnapshotExpiredError, UnavailableError) as e:
                if attempt == ATTEMPTS - 1 or isinstance(e, UnavailableError) and not e.moved:
                    raise

    def _placed(self, plan: Plan) -> Plan:
        names = [p.collection for p in plan.sources] if plan.sources else [plan.collection]
        lines = []
        for name in names:
            if name and name in self._collections:
                lines.extend(self._collections[name].placement())
        lines.append("  coordinator: plan, residual WHERE, DuckDB, merge of the groups' answers")
        return replace(plan, placement=tuple(lines))

    def rebalance(self) -> list[dict]:
        """Move shard groups from the storage nodes that hold the most to those that hold the
        fewest (a node just added holds none), until they differ by one at most; returns the
        moves made (collection, group, from, to). Each collection stays readable while its
        group moves; writes to that group wait for the move (UnavailableError after
        ``call_timeout``)."""
        self._check()
        moves = []
        for name, spec in sorted(ray.get(self._catalog.specs.remote()).items()):
            for g, node in sorted(spec.get("moving", {}).items()):  # a move that stopped half way
                coll = self._collections.get(name) or ClusterCollection(self, name, spec, settled=False)
                coll.move(int(g), node)
                moves.append({"collection": name, "group": int(g), "from": spec["nodes"][int(g)], "to": node})
                self._collections[name] = coll
        while True:
            nodes = self.nodes()
            specs = ray.get(self._catalog.specs.remote())
            held = {n: [] for n in nodes}
            for name, spec in sorted(specs.items()):
                for g, node in enumerate(spec["nodes"]):
                    held.setdefault(node, []).append((name, g))
            most = max((n for n in held if n in nodes), key=lambda n: (len(held[n]), n), default=None)
            least = min(nodes, key=lambda n: (len(held[n]), n), default=None)
            if most is None or len(held[most]) - len(held[least]) <= 1:
                return moves
            name, g = held[most][-1]
            self.collection(name).move(g, least)
            moves.append({"collection": name, "group": g, "from": most, "to": least})

    def stats(self) -> dict:
        """Per collection: documents and, per group, its node and its writer's shard stats."""
        self._check()
        return {"root": self.root, "nodes": self.nodes(), "role": "coordinator", "row_cache": {},
                "collections": {n: self.collection(n).stats() for n in self.collection_names()}, "lag": self.lag()}

    def close(self) -> None:
        """Forget this coordinator's handles and close its node-local readers; the
        cluster's actors and data stay."""
        self._closed = True
        self._sql.close()
        for coll in self._collections.values():
            coll.close_local()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> ClusterDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self) -> None:
        if self._closed:
            raise ClosedError("the cluster database is closed")

    # -- calls of the groups' actors ------------------------------------------------
    def wait(self, refs: list, coll: ClusterCollection, groups: list[int], again=None) -> list:
        """The answers of ``refs`` (one call per group of ``groups``): an error raised in an
        actor as itself; UnavailableError naming the shards of every group that is gone or
        did not answer in ``call_timeout`` seconds. A group that moved is UnavailableError
        too (``moved``), unless ``again(g)`` makes the call anew: then it goes once to the
        group's actor on its new node."""
        deadline = time.monotonic() + self.call_timeout
        out, gone = [], []
        for ref, g in zip(refs, groups):
            for attempt in range(2):
                if isinstance(ref, Answered):  # (a node-local reader's)
                    if ref.error is None:
                        out.append(ref.value)
                        break
                    if not ref.moved:
                        raise ref.error
                    moved: Exception = ref.error
                    coll.refresh()
                    raise coll.unavailable([g], moved, moved=True) from None
                try:
                    out.append(ray.get(ref, timeout=max(0.0, deadline - time.monotonic())))
                    break
                except RayTaskError as e:
                    if not isinstance(e.cause, GroupStoppedError):
                        raise e.cause from None
                    moved = e.cause
                except ActorDiedError as e:  # stopped for good: moved or dropped (by another coordinator)
                    moved = e
                except (RayActorError, GetTimeoutError) as e:
                    gone.append((g, e))
                    try:
                        ray.cancel(ref)  # (a call waiting for its actor's node: not run when it returns)
                    except Exception:  # noqa: BLE001 - already finished or its actor is gone: nothing to stop
                        pass
                    break
                coll.refresh()  # (waits for the move to end)
                if again is None or attempt:
                    raise coll.unavailable([g], moved, moved=True) from None
                ref, deadline = again(g), time.monotonic() + self.call_timeout
        if gone:
            raise coll.unavailable([g for g, _ in gone], gone[0][1])
        return out


def _catalog(root: str | None):
    """The cluster's catalog actor, made by the first coordinator (which says ``root``)."""
    try:
        return ray.get_actor(CATALOG, namespace=NAMESPACE)
    except ValueError:
        if root is None:
            raise InvalidArgumentError("this Ray cluster has no rtindex collections yet: give open_cluster a "
                                       "root, the directory to keep them under on every storage node") from None
    return ray.remote(Catalog).options(
        name=CATALOG, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0,
        resources={HEAD_RESOURCE: SLIVER}, max_restarts=-1, max_task_retries=-1).remote(os.path.abspath(root))


def _wait_dead(actors: list, timeout: float) -> None:
    """Return once each of ``actors`` (killed) answers no more, or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    for a in actors:
        while time.monotonic() < deadline:
            try:
                ray.get(a.ready.remote(), timeout=1.0)
            except RayActorError:
                break
            except GetTimeoutError:
                continue
            time.sleep(0.05)  # (answered: not dead yet)


class ClusterCollection:
    """A collection spread over shard groups: routes writes, opens snapshots."""

    def __init__(self, db: ClusterDatabase, name: str, spec: dict, settled: bool = True):
        self._db = db
        self.name = name
        if settled and spec.get("moving"):
            spec = self._settled()
        self.n_shards, self.groups = spec["shards"], spec["groups"]
        self.k = self.n_shards // self.groups
        self.nodes: list[str] = list(spec["nodes"])
        self._options = spec["options"]
        self.created = spec["created"]
        self._fences: list[str | None] = [None] * self.groups  # the writes this coordinator's reads must see
        self.lag = (0, 0.0)  # (rows, ms) behind their writers, worst of the query actors at the last snapshot
        self._created: list[int] | None = None  # per group, when its own database made the collection
        self._writers = [self._writer(g) for g in range(self.groups)]
        self._readers: list[list] | None = None  # per group: its query actors, or one LocalReader
        self._stale: list[list] = []  # the readers before a refresh (local ones kept if still good)
        self._starting = threading.Lock()
        self._turn = itertools.count()
        self._asked: dict[str, dict] = {"column_types": {}, "has_type": {}}

    # -- actors -----------------------------------------------------------------
    def _path(self, g: int) -> str:
        return group_path(self._db.root, self.nodes[g], self.name, g)

    def _actor(self, cls, label: str, g: int, *args):
        return ray.remote(cls).options(
            name=f"{self.name}/{g}/{label}", namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
            num_cpus=0, resources=pinned(self.nodes[g]), max_restarts=-1, max_task_retries=-1,
            max_concurrency=8).remote(*args)

    def _writer(self, g: int):
        return self._actor(GroupWriter, "writer", g, self._path(g), self.name, self.k, self._options)

    def _reader_actors(self, g: int) -> list:
        """The query actors of group ``g`` on its node (named by it: while a group moves, the
        old node's serve reads until the new node's are up)."""
        return [self._actor(GroupReader, f"{self.nodes[g]}/reader{i}", g, self._path(g), self.name, self._options)
                for i in range(self._db.query_actors)]

    def refresh(self) -> None:
        """Read the collection's placement again and find its actors by name: after another
        coordinator moved a group, the handles this one held are of stopped actors."""
        try:
            spec = self._settled()
        except NotFoundError:  # dropped by another coordinator: forget it here too
            self.close_local()
            self._db._collections.pop(self.name, None)
            raise
        self.nodes = list(spec["nodes"])
        self._writers = [self._writer(g) for g in range(self.groups)]
        with self._starting:
            if self._readers is not None:
                self._stale, self._readers = self._readers, None

    def _settled(self) -> dict:
        """The collection's placement once none of its groups is moving (a writer started
        during a move would write where the group is leaving): UnavailableError when one
        still is after ``call_timeout`` seconds."""
        deadline = time.monotonic() + self._db.call_timeout
        while True:
            spec = ray.get(self._db._catalog.specs.remote()).get(self.name)
            if spec is None:
                raise NotFoundError(f"no collection {self.name!r} (dropped)")
            moving = sorted(int(g) for g in spec.get("moving", {}))
            if not moving:
                return spec
            if time.monotonic() > deadline:
                k = spec["shards"] // spec["groups"]
                shards = [s for g in moving for s in range(g * k, g * k + k)]
                raise UnavailableError(f"shards {shards} of collection {self.name!r} are moving to another node "
                                       "(rtindex rebalance); retry when the move is done", shards)
            time.sleep(0.05)

    def readers(self) -> list[list]:
        """The readers of each group (made once the writers have made the groups): its
        query actors, or a LocalReader when its directory is on this machine."""
        readers = self._readers
        if readers is None:
            self.start()
            readers = self._readers
        return readers

    def start(self) -> None:
        """Wait for the writers (a new group is made by its writer), then start the readers."""
        with self._starting:
            if self._readers is not None:
                return
            self._db.wait([w.ready.remote() for w in self._writers], self, list(range(self.groups)))
            stale = {rs[0].path: rs[0] for rs in self._stale if isinstance(rs[0], LocalReader)}
            readers = [self._reader_set(g, stale) for g in range(self.groups)]
            actors = [(r, g) for g, rs in enumerate(readers) for r in rs if not isinstance(r, LocalReader)]
            self._db.wait([r.ready.remote() for r, _ in actors], self, [g for _, g in actors])
            for r in stale.values():  # (a query still reading one is run again: Answered.moved)
                r.close()
            self._stale, self._readers = [], readers

    def _reader_set(self, g: int, stale: dict[str, LocalReader]) -> list:
        """Group ``g``'s readers: this process's own when its directory is on this machine
        (a good one of ``stale`` is taken from it), else its query actors."""
        path = self._path(g)
        if self._db.on_this_machine(self.nodes[g]) and os.path.isdir(path):
            old = stale.pop(path, None)
            if old is not None and not old.leaving():
                return [old]
            if old is not None:
                old.close()
            try:
                return [LocalReader(path, self.name, self._options)]
            except (RtindexError, OSError) as e:  # (not readable from here: its query actors can)
                log.warning("rtindex: reading group %d of %r through its query actors: %s", g, self.name, e)
        return self._reader_actors(g)

    def close_local(self) -> None:
        """Close this coordinator's node-local readers (ClusterDatabase.close)."""
        with self._starting:
            for rs in (self._readers or []) + self._stale:
                for r in rs:
                    if isinstance(r, LocalReader):
                        r.close()
            self._readers, self._stale = None, []

    def placement(self) -> list[str]:
        """EXPLAIN's lines: where each group's shards are read."""
        readers = self.readers()
        return [f"  shards {g * self.k}-{g * self.k + self.k - 1} (group {g}): on node {self.nodes[g]!r}, "
                f"written by actor {self.name}/{g}/writer, read "
                + ("in this process (its directory is on this machine) " if isinstance(readers[g][0], LocalReader)
                   else f"by {self._db.query_actors} query actor(s) ")
                + "(index lookups, documents, column scans)" for g in range(self.groups)]

    def unavailable(self, groups: list[int], cause: Exception, moved: bool = False) -> UnavailableError:
        shards = [s for g in groups for s in range(g * self.k, g * self.k + self.k)]
        where = ", ".join(f"group {g} on node {self.nodes[g]!r}" for g in groups)
        if moved:
            return UnavailableError(f"shards {shards} of collection {self.name!r} moved (now {where}); "
                                    "run it again", shards, moved=True)
        why = "did not answer in time" if isinstance(cause, GetTimeoutError) else "is not running"
        return UnavailableError(f"shards {shards} of collection {self.name!r} are unavailable: the actor of "
                                f"{where} {why}; retry once the node is back", shards)

    # -- writes -----------------------------------------------------------------
    def _group_of(self, doc_id: Any) -> int:
        return documents.shard_of(documents.encode_id(doc_id), self.n_shards) // self.k

    # -- what one database's collections have, and a cluster's not yet ---------------
    transformation = None  # (Collection.transformation: none on a cluster)

    def set_transformation(self, sql: str | None) -> None:
        raise InvalidArgumentError(NOT_YET.format(what="ingest transformations"))

    def add_source(self, source: Any, exist_ok: bool = False) -> dict:
        raise InvalidArgumentError(NOT_YET.format(what="sources"))

    def sources(self) -> list[dict]:
        return []

    # -- fences: a cluster collection's is the groups' counters in shard order ----------
    def fence(self) -> str:
        """A write fence covering every write to this collection acknowledged so far (its
        groups' writers are asked): give it to ``caught_up`` of any coordinator."""
        return self._cluster_fence(self._write("fence", list(range(self.groups)), lambda _: ()))

    def _cluster_fence(self, group_fences: list[str | None]) -> str:
        """The collection's fence of its groups' (None: none needed of that group)."""
        counters = tuple(c for f in group_fences for c in (Fence.parse(f).counters if f else (0,) * self.k))
        return str(Fence(self.name, self.created, counters))

    def wait_for(self, f: Fence) -> None:
        """Make this coordinator's reads wait for the writes ``f`` covers (FenceError if it
        is not a fence of this collection)."""
        if f.created != self.created or len(f.counters) != self.n_shards:
            raise FenceError(f"not a write fence of collection {self.name!r} as it is now: {f}")
        created = self._group_created()
        for g in range(self.groups):
            local = Fence(self.name, created[g], f.counters[g * self.k:(g + 1) * self.k])
            known = Fence.parse(self._fences[g]) if self._fences[g] else None
            if known is not None and known.created == local.created:
                local = Fence(self.name, local.created, tuple(map(max, known.counters, local.counters)))
            self._fences[g] = str(local)

    def _group_created(self) -> list[int]:
        """When each group's own database made the collection (what its fences carry)."""
        if self._created is None:
            fences = self._write("fence", list(range(self.groups)), lambda _: ())
            self._created = [Fence.parse(f).created for f in fences]
        return self._created

    def ingest(self, docs: Any, batch_size: int = 1000, *, errors: str = "warn",
               progress: bool | None = None, json_path: str | None = None) -> IngestStats:
        """Collection.ingest: each document to its shard's group (an ``_id`` is given here to
        a document without one), every group's part at once; stored and durable once
        counted in the returned stats, whose ``fence`` covers them. ``progress``: no bar
        on a cluster yet (accepted, for code written for one database)."""
        check_ingest_options(batch_size, errors)
        t0 = time.perf_counter()
        stats = IngestStats()
        written: dict[tuple, Any] = {}
        with open_input(docs, batch_size, json_path) as inp:
            while True:
                chunk = list(itertools.islice(inp.items, SEND_DOCS))
                if not chunk:
                    break
                self._send(chunk, stats, written)
        stats.ids = list(written.values())
        stats.n = len(stats.ids)
        stats.fence = self._cluster_fence(self._fences)
        stats.errors.sort(key=lambda e: e.index)
        stats.replaced.sort()
        stats.seconds = time.perf_counter() - t0
        stats._settle(errors, stacklevel=3)
        return stats

    def _send(self, chunk: list[tuple[int, Any]], stats: IngestStats, written: dict) -> None:
        parts: list[list] = [[] for _ in range(self.groups)]
        at: list[list[int]] = [[] for _ in range(self.groups)]
        for pos, doc in chunk:
            if isinstance(doc, SchemaError):
                stats.errors.append(ItemError(pos, None, doc.path, doc.message))
                continue
            g, doc = self._routed(doc)
            parts[g].append(doc)
            at[g].append(pos)
        sent = [g for g in range(self.groups) if parts[g]]
        answers = self._write("ingest", sent, lambda g: (parts[g], "report"))
        stored: list[tuple[int, Any]] = []
        for g, got in zip(sent, answers):
            where = at[g]
            stats.bytes += got["bytes"]
            stats.errors.extend(replace(e, index=where[e.index]) for e in got["errors"])
            stats.replaced.extend(where[i] for i in got["replaced"])
            failed = {e.index for e in got["errors"]}
            stored.extend((where[i], doc_id) for i, doc_id in got["doc_ids"].items() if i not in failed)
            stats.doc_ids.update((where[i], doc_id) for i, doc_id in got["doc_ids"].items())
            self._fences[g] = got["fence"]
        for _, doc_id in sorted(stored, key=lambda p: p[0]):
            written.setdefault((type(doc_id) is str, doc_id), doc_id)

    def _routed(self, doc: Any) -> tuple[int, Any]:
        """The group of one input document, and the document as sent (given an ``_id`` when
        it has none). JSON text (an NDJSON line, an element of an array, bytes) goes as it
        came when its ``_id`` can be read without parsing it. What has no usable ``_id``
        (not an object, an ``_id`` of another type) goes to group 0, which says why as one
        process would."""
        text = doc.raw if isinstance(doc, documents.Line) else doc if isinstance(doc, bytes) else None
        if text is not None:
            status, doc_id, id_key, _, close, members = scan_top(text)
            if status == 0 and id_key is not None:
                return documents.shard_of(id_key, self.n_shards) // self.k, doc
            if status == 0 and doc_id is None:
                new = documents.new_id()
                spliced = text[:close].rstrip() + (b"," if members else b"") + b'"_id":' + orjson.dumps(new) + b"}"
                return self._group_of(new), documents.Line(None, spliced)
            try:
                parsed = orjson.loads(text)
            except orjson.JSONDecodeError:
                parsed = None
            if not isinstance(parsed, dict):
                return 0, doc
            doc = parsed
        if not isinstance(doc, dict):
            return 0, doc
        doc_id = doc.get("_id")
        if doc_id is None:
            doc_id = documents.new_id()
            doc = {**doc, "_id": doc_id}
        try:
            return self._group_of(doc_id), doc
        except SchemaError:
            return 0, doc

    def _write(self, method: str, groups: list[int], args) -> list:
        """``method(*args(g))`` of the writer of each of ``groups``; a group that moved gets
        it again on its new node (a writer stopped for a move ran none of it)."""
        def call(g: int):
            return getattr(self._writers[g], method).remote(*args(g))
        return self._db.wait([call(g) for g in groups], self, groups, again=call)

    def delete(self, doc_id: Any) -> bool:
        g = self._group_of(doc_id)
        found, self._fences[g] = self._write("delete", [g], lambda _: (doc_id,))[0]
        return found

    def patch(self, doc_id: Any, ops: list[dict]) -> dict:
        g = self._group_of(doc_id)
        doc, self._fences[g] = self._write("patch", [g], lambda _: (doc_id, ops))[0]
        return doc

    def flush(self) -> None:
        """Seal every group's in-memory segments (Collection.flush)."""
        self._write("flush", list(range(self.groups)), lambda _: ())

    def move(self, g: int, node: str, chunk_bytes: int = 8 << 20) -> None:
        """Move group ``g`` to storage node ``node``: mark the old directory as leaving, stop
        its writer (its data flushed and closed), copy the directory there in chunks, start
        its writer and readers there, then stop the old readers (which served reads until
        then) and remove the old directory."""
        old_node, old_path, old_readers = self.nodes[g], self._path(g), self.readers()[g]
        ray.get(self._db._catalog.begin_move.remote(self.name, g, node))
        files = ray.remote(GroupFiles).options(num_cpus=0, resources=pinned(old_node))
        src, dst = files.remote(), ray.remote(GroupFiles).options(num_cpus=0, resources=pinned(node)).remote()
        ray.get(src.mark.remote(old_path))
        try:
            ray.get(self._writers[g].close.remote(), timeout=self._db.call_timeout)
        except (RayActorError, GetTimeoutError):
            pass  # (stopped already: a move that stopped half way, finished now)
        ray.kill(self._writers[g], no_restart=True)
        new_path = group_path(self._db.root, node, self.name, g)
        ray.get(dst.remove.remote(new_path))  # (the remains of an earlier move that stopped)
        for rel, size in ray.get(src.listing.remote(old_path)):
            offset = 0
            while True:
                data = ray.get(src.read.remote(old_path, rel, offset, chunk_bytes))
                ray.get(dst.write.remote(new_path, rel, offset, data))
                offset += len(data)
                if offset >= size:
                    break
        spec = ray.get(self._db._catalog.move.remote(self.name, g, node))
        self.nodes = list(spec["nodes"])
        self._writers[g] = self._writer(g)
        self._db.wait([self._writers[g].ready.remote()], self, [g])
        new_readers = self._reader_set(g, {})
        actors = [r for r in new_readers if not isinstance(r, LocalReader)]
        self._db.wait([r.ready.remote() for r in actors], self, [g] * len(actors))
        self._readers[g] = new_readers
        old_actors = [r for r in old_readers if not isinstance(r, LocalReader)]
        for r in old_readers:
            if isinstance(r, LocalReader):
                r.close()
            else:
                ray.kill(r, no_restart=True)
        _wait_dead(old_actors, self._db.call_timeout)  # (a reader still up would see its files go)
        ray.get(src.remove.remote(old_path))
        for a in (src, dst):
            ray.kill(a)

    def drop(self) -> None:
        """Remove the collection's actors and directories (ClusterDatabase.drop_collection)."""
        for rs in self.readers():
            for r in rs:
                if isinstance(r, LocalReader):
                    r.close()
                else:
                    ray.kill(r, no_restart=True)
        self._db.wait([w.drop.remote() for w in self._writers], self, list(range(self.groups)))
        for w in self._writers:
            ray.kill(w, no_restart=True)

    # -- reads ------------------------------------------------------------------
    def _reader(self, g: int):
        rs = self.readers()[g]
        return rs[next(self._turn) % len(rs)]

    @staticmethod
    def _ask(reader: Any, method: str, *args: Any) -> Any:
        """``method(*args)`` of a group's reader: a Ray call of a query actor, or a call in
        this process of a LocalReader."""
        return reader.ask(method, *args) if isinstance(reader, LocalReader) else getattr(reader, method).remote(*args)

    def get(self, doc_id: Any) -> dict | None:
        g = self._group_of(doc_id)
        return self._db.wait([self._ask(self._reader(g), "get", doc_id, self._fences[g])], self, [g])[0]

    def count(self) -> int:
        return self.snapshot().count()

    __len__ = count

    def snapshot(self) -> ClusterSnapshot:
        """One consistent read of every group, each as of at least this coordinator's
        last write to it (rtindex/cluster/snapshot.py)."""
        if any(isinstance(rs[0], LocalReader) and rs[0].leaving() for rs in self.readers()):
            spec = ray.get(self._db._catalog.specs.remote()).get(self.name)
            if spec is None or spec["nodes"] != self.nodes:  # (moved, or dropped: else still moving)
                self.refresh()
        readers = [self._reader(g) for g in range(self.groups)]
        typed, has = list(self._asked["column_types"]), list(self._asked["has_type"])
        groups = list(range(self.groups))
        fences = list(self._fences)

        def opener(then: dict[int, tuple]) -> list:
            refs = [self._ask(r, "open", fences[g], typed, has, then.get(g)) for g, r in enumerate(readers)]
            opened = self._db.wait(refs, self, groups)
            self.lag = (sum(o[6]["rows"] for o in opened), max(o[6]["ms"] for o in opened))
            return opened

        def fanout(calls: list[tuple[int, int, str, tuple, dict]]) -> list:
            refs = [self._ask(readers[g], "call", token, method, args, kwargs)
                    for g, token, method, args, kwargs in calls]
            return self._db.wait(refs, self, [c[0] for c in calls])
        return ClusterSnapshot(self.name, self.k, self.groups, opener, fanout, typed, has, self._remember)

    def _remember(self, question: str, key: Any) -> None:
        asked = self._asked[question]
        if len(asked) < ASKED_MAX:
            asked[key] = True

    def stats(self) -> dict:
        got = self._write("stats", list(range(self.groups)), lambda _: ())
        shards = [{**sh, "shard": g * self.k + sh["shard"], "node": self.nodes[g]}
                  for g, st in enumerate(got) for sh in st["shards"]]
        return {"name": self.name, "documents": sum(s["documents"] for s in got), "shards": shards,
                "groups": [{"group": g, "node": self.nodes[g], "shards": s["shards"]} for g, s in enumerate(got)]}
