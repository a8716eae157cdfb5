"""The read interface of rtindex.Snapshot over a collection's shard groups on a cluster.

The coordinator's planner and executor are the ones of a single process; they read through
this object, which asks each group's query actor for what they would have read locally: the
posting lists of a lookup (kept here as posting parts of global shards, so that ``&``, ``|``
and ``-`` combine them without a round trip), documents at row ids, columns of a scan. Every
group is asked at once, and each answer comes from the snapshot that the query actor pinned
when this one was opened, so a query sees one state of every shard. A point query on
``_id`` asks only the group that holds that ``_id``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rtindex import documents, keys
from rtindex.cluster.groups import Parts
from rtindex.duck import HUGEINT_COLUMNS
from rtindex.segments import OverBudget
from rtindex.snapshot import Postings

Path = str | Sequence[str]
# Calls of groups at once: (group, snapshot token, method, args, kwargs) each -> their answers
Fanout = Callable[[list[tuple[int, int, str, tuple, dict]]], list[Any]]
# Pins every group's snapshot: {group: (method, args, kwargs) to run on it at once} -> per
# group (token, documents, rows written per shard, column types, has types, that call's answer)
Opener = Callable[[dict[int, tuple]], list[tuple]]


class ClusterSnapshot:
    """What one read of a collection on a cluster sees: the snapshots its query actors
    pin when it is first read (rtindex/cluster/database.py opens them). A point query on
    ``_id`` that reads it first pins them and asks the one group in the same round trip."""

    def __init__(self, name: str, shards_per_group: int, groups: int, opener: Opener, fanout: Fanout,
                 typed_paths: list, has_types: list, asked: Callable[[str, Any], None]):
        self.name = name
        self._k = shards_per_group
        self._groups = groups
        self._opener = opener
        self._fanout = fanout
        self._asked = asked  # told each planner question this snapshot had to ask
        self._typed_paths, self._has_types = typed_paths, has_types
        self._tokens: list[int] | None = None
        self._count = 0
        self._rows: tuple[int, ...] = ()
        self._memo: dict[tuple, Any] = {}

    def _open(self, then: dict[int, tuple] | None = None) -> list:
        """Pin the groups' snapshots (once); the answers of ``then``'s calls, per group."""
        if self._tokens is not None:
            raise AssertionError("a snapshot is opened once")
        opened = self._opener(then or {})
        self._tokens = [o[0] for o in opened]
        self._count = sum(o[1] for o in opened)
        self._rows = tuple(n for o in opened for n in o[2])
        for i, path in enumerate(self._typed_paths):
            self._memo[("column_types", path)] = _union_types(o[3][i] for o in opened)
        for i, (path, type_name) in enumerate(self._has_types):
            self._memo[("has_type", path, type_name)] = any(o[4][i] for o in opened)
        return [o[5] for o in opened]

    @property
    def next_row_ids(self) -> tuple[int, ...]:
        """Rows written per shard (global shard order), as Snapshot.next_row_ids."""
        if self._tokens is None:
            self._open()
        return self._rows

    # -- one call per group -----------------------------------------------------
    def _each(self, method: str, args: tuple = (), kwargs: dict | None = None,
              groups: Iterable[int] | None = None, per_group: Callable[[int], tuple] | None = None) -> list:
        groups = range(self._groups) if groups is None else list(groups)
        if self._tokens is None:
            self._open()
        calls = []
        for g in groups:
            a, kw = per_group(g) if per_group is not None else (args, kwargs or {})
            calls.append((g, self._tokens[g], method, a, kw))
        return list(zip(groups, self._fanout(calls)))

    def _postings(self, method: str, *args, budget: list[int] | None = None, **kwargs) -> Postings:
        if budget is not None:
            kwargs["budget"] = [budget[0]]
        parts: dict[tuple[int, int], Any] = {}
        used = 0
        for g, (found, counted) in self._each(method, args, kwargs):
            for (shard, base), bm in found.parts.items():
                parts[(g * self._k + shard, base)] = bm
            if budget is not None:
                used += budget[0] - counted["budget"]
        if budget is not None:
            budget[0] -= used
            if budget[0] < 0:
                raise OverBudget()
        return Postings(self, parts)

    def _split(self, rows: Postings) -> dict[int, dict[tuple[int, int], Any]]:
        """The parts of ``rows`` per group, in the group's own shard numbers."""
        if rows._snap is not self:
            raise ValueError("rows of another snapshot")
        out: dict[int, dict] = {}
        for (shard, base), bm in rows._parts.items():
            out.setdefault(shard // self._k, {})[(shard % self._k, base)] = bm
        return out

    # -- lookups ------------------------------------------------------------
    def count(self) -> int:
        if self._tokens is None:
            self._open()
        return self._count

    def all(self) -> Postings:
        return self._postings("all")

    def term(self, path: Path, value: Any) -> Postings:
        return self._postings("term", path, value)

    def elements(self, path: Path, value: Any) -> Postings:
        return self._postings("elements", path, value)

    def matching(self, path: Path, value: Any, contains: bool = False) -> Postings:
        return self._postings("matching", path, value, contains)

    def range(self, path: Path, lo: Any = None, hi: Any = None, *, lo_inclusive: bool = True,
              hi_inclusive: bool = False, budget: list[int] | None = None) -> Postings:
        return self._postings("range", path, lo, hi, lo_inclusive=lo_inclusive, hi_inclusive=hi_inclusive,
                              budget=budget)

    def prefix(self, path: Path, prefix: str, budget: list[int] | None = None) -> Postings:
        return self._postings("prefix", path, prefix, budget=budget)

    def exists(self, path: Path, types: Iterable[str] | None = None) -> Postings:
        return self._postings("exists", path, None if types is None else list(types))

    def missing(self, path: Path) -> Postings:
        return self._postings("missing", path)

    def arrays(self, path: Path, include_self: bool = True) -> Postings:
        return self._postings("arrays", path, include_self)

    def point(self, path: Path, value: Any, contains: bool = False, limit: int | None = None, offset: int = 0,
              max_rows: int | None = None, charge: list[int] | None = None) -> tuple[int, list[dict] | None]:
        """Snapshot.point: on ``_id``, only the group holding that ``_id`` is asked; else every
        group for its first ``offset + limit`` rows, cut here in shard order."""
        home = self.group_of(path, value, contains)
        kwargs = {"limit": limit if home is not None or limit is None else offset + limit,
                  "offset": offset if home is not None else 0,
                  "max_rows": max_rows if home is not None or max_rows is None else offset + max_rows,
                  "charge": None if charge is None else [0]}
        n, docs = 0, []
        if home is not None and self._tokens is None:  # pinned and asked in one round trip
            answers = [(home, self._open({home: ("point", (path, value, contains), kwargs)})[home])]
        else:
            answers = self._each("point", (path, value, contains), kwargs, groups=None if home is None else [home])
        for _, ((n_g, docs_g), counted) in answers:
            n += n_g
            if docs is not None and docs_g is not None:
                docs.extend(docs_g)
            else:
                docs = None
            if charge is not None:
                charge[0] += counted["charge"]
        n_out = max(0, n - offset) if limit is None else min(max(0, n - offset), limit)
        if docs is None or max_rows is not None and n_out > max_rows:
            return n, None
        if home is None:
            docs = docs[offset:] if limit is None else docs[offset: offset + limit]
        return n, docs

    def group_of(self, path: Path, value: Any, contains: bool) -> int | None:
        """The group that alone can hold rows where ``_id`` equals ``value``, or None (another
        field, or a value that is not an ``_id``'s own kind: ``_id = 1.0`` matches 1 too)."""
        if contains or keys.split_path(path) != ("_id",) or isinstance(value, bool) \
                or not isinstance(value, (str, int)):
            return None
        try:
            id_key = documents.encode_id(value)
        except Exception:  # (no document can have it: any group answers none)
            return 0
        return documents.shard_of(id_key, self._k * self._groups) // self._k

    # -- rows and columns ---------------------------------------------------
    def fetch(self, rows: Postings, limit: int | None = None, *, offset: int = 0, copy: bool = True,
              charge: list[int] | None = None) -> list[dict]:
        """Snapshot.fetch: each group reads its part of ``rows`` after the rows of the groups
        before it, as one process reads its shards in order."""
        asks: dict[int, tuple] = {}
        wanted = None if limit is None else limit
        for g, parts in sorted(self._split(rows).items()):
            n = sum(len(bm) for bm in parts.values())
            if offset >= n:
                offset -= n
                continue
            take = n - offset if wanted is None else min(wanted, n - offset)
            asks[g] = (Parts(parts), take, offset)
            offset = 0
            if wanted is not None:
                wanted -= take
                if wanted <= 0:
                    break
        out: list[dict] = []
        found = self._each("fetch", groups=asks, per_group=lambda g: (
            (asks[g][0], asks[g][1]), {"offset": asks[g][2], "copy": False,
                                       "charge": None if charge is None else [0]}))
        for _, (docs, counted) in found:
            out.extend(docs)
            if charge is not None:
                charge[0] += counted["charge"]
        return out

    def scan(self, specs: Sequence[tuple[Path, str]], rows: Postings | None = None) -> pa.Table:
        split = self._split(rows) if rows is not None else {}
        specs = [(keys.split_path(p), t) for p, t in specs]
        found = self._each("scan", per_group=lambda g: (
            (specs,), {} if rows is None else {"rows": Parts(split.get(g, {}))}))
        tables = []
        for g, (table, _) in found:
            if g and table.num_rows:
                shard = pc.add(table.column(0).cast(pa.int32()), g * self._k).cast(pa.uint16())
                table = table.set_column(0, "c0", shard)
            tables.append(table)
        names = ["_shard", "_row_id"] + [f"{'.'.join(p)}:{t}" for p, t in specs]
        return pa.concat_tables(tables).rename_columns(names)

    def partial(self, specs: Sequence[tuple[Path, str]], rows: Postings | None, text: str,
                params: dict) -> pa.Table:
        """Every group's rows of the partial aggregate ``text`` (rtindex/sql/partial.py) over
        its scan of ``specs`` (of ``rows``, when given), named ``c0``, ``c1``, ... as the
        executor's scan names them: the aggregate runs next to the data, its rows come here."""
        split = self._split(rows) if rows is not None else {}
        specs = [(keys.split_path(p), t) for p, t in specs]
        found = self._each("partial", per_group=lambda g: (
            (specs, None if rows is None else Parts(split.get(g, {})), text, params), {}))
        tables = [table for _, (table, _) in found]
        hugeint = {n for t in tables for n in (t.schema.metadata or {}).get(HUGEINT_COLUMNS, b"").decode().split(",") if n}
        out = pa.concat_tables([t.replace_schema_metadata(None) for t in tables], promote_options="permissive")
        return out.replace_schema_metadata({HUGEINT_COLUMNS: ",".join(sorted(hugeint)).encode()})

    # -- what planners ask ----------------------------------------------------
    def has_type(self, path: Path, type_name: str) -> bool:
        key = ("has_type", keys.split_path(path), type_name)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = any(out for _, (out, _) in self._each("has_type", (key[1], type_name)))
            self._asked("has_type", key[1:])
        return found

    def column_types(self, path: Path) -> list[str]:
        key = ("column_types", keys.split_path(path))
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = _union_types(out for _, (out, _) in self._each("column_types", (key[1],)))
            self._asked("column_types", key[1])
        return list(found)

    def field_paths(self) -> set[tuple[str, ...]]:
        found = self._memo.get(("field_paths",))
        if found is None:
            found = self._memo[("field_paths",)] = set().union(
                *(out for _, (out, _) in self._each("field_paths")))
        return set(found)


def _union_types(answers: Iterable[list[str]]) -> list[str]:
    """column_types of several groups as one collection's: in the order of their tags."""
    tags = {keys.TAGS_BY_NAME[t] for names in answers for t in names}
    return [keys.TAG_NAMES[t] for t in sorted(tags)]
