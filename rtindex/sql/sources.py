"""Any read-only SELECT over collections: every collection reference becomes a frame.

What the single-collection form of :mod:`rtindex.sql.parse` does not take (JOINs, subqueries,
CTEs, UNION, DISTINCT, window functions, FILTER, GROUP BY ALL, other DuckDB functions) is
planned here:

- every reference to a collection (in FROM or a JOIN, at any depth: subqueries, CTEs, set
  operations) is found, and its fields: a qualified name (``e.x``, ``coll.x``) belongs to
  that reference; an unqualified one to the only collection of its SELECT, or, when a SELECT
  reads several, to those of them whose documents hold it (decided per execution, from the
  snapshot);
- the top-level AND conjuncts of a SELECT's WHERE that name one reference's fields only and
  that the index answers become that reference's *index part*, and leave the text (not under
  an outer JOIN, where they would change which rows are padded with NULLs);
- each collection is read once per execution however often it is referenced: the union of
  its references' rows, with a mask column per reference when their index parts differ;
- DuckDB runs the user's query with each reference replaced by its frame and each field by
  its frame column, named by its dotted path (so output names are the user's).

The sandbox holds as in the single-collection form: one SELECT; FROM reads collections, CTEs,
subqueries and VALUES only (no table functions, no file names: a name that is neither a CTE
nor a collection is an error when the query runs); functions that read files or settings are
refused; DuckDB itself runs locked down (rtindex/duck.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sqlglot import exp

from rtindex.errors import SqlError, UnsupportedSqlError
from rtindex.sql import predicates as P
from rtindex.sql.parse import (
    DIALECT,
    POSITIONAL,
    Path,
    Query,
    _duck_time_function,
    _normalize_time_functions,
    _Parser,
    _time_function,
    collection_name,
    conjuncts,
)

# functions that read files, the environment or the catalog: refused wherever they appear
# (DuckDB's sandbox refuses file access too; this names the construct for the user)
_DENIED_FUNCTION = re.compile(r"(read_.*|glob|query|query_table|sniff_csv|getenv|parquet_.*|iceberg_.*|delta_.*|"
                              r"duckdb_.*|pragma_.*|which_secret|load_aws_credentials|json_execute_serialized_sql|"
                              r"from_json.*|current_setting|getvariable)", re.IGNORECASE | re.DOTALL)
_PUSHABLE_JOINS = ("", "INNER", "CROSS")
MASK = "__m"  # mask columns of a frame read for references with different index parts


@dataclass
class Reference:
    """One occurrence of a collection in the query."""

    collection: str
    alias: str  # its name in the DuckDB text
    index: P.Pred | None = None  # the WHERE conjuncts the index answers for it
    residual: str | None = None  # the rest of its SELECT's WHERE (DuckDB evaluates it), as SQL
    fields: dict[Path, str] = field(default_factory=dict)  # fields it surely reads -> frame column
    star: bool = False  # SELECT * over it: every top-level field
    mask: str | None = None  # its mask column, when its collection's frame has several


@dataclass
class Source:
    """One collection of the query, read once per execution into the frame ``frame``."""

    collection: str
    frame: str
    references: list[Reference]
    where: P.Pred | None  # what the index narrows it to (None: every row)
    fields: dict[Path, str]
    star: bool

    @property
    def masks(self) -> dict[str, P.Pred]:
        return {r.mask: r.index for r in self.references if r.mask is not None}


@dataclass
class MultiQuery:
    """A checked query over collection references, shared by every execution of its text."""

    sql: str
    sources: list[Source]
    duck_sql: str  # over the frames of ``sources``
    duck_params: dict[str, P.Operand]
    # (references of one SELECT, path, whether all its FROM items are collections): an
    # unqualified field of a SELECT over several; it goes to the frames of the collections
    # that hold it (none holds it: the first one's, as a column of nulls, when all are collections)
    unresolved: list[tuple[tuple[Reference, ...], Path, bool]]
    param_style: str | None = None
    n_positional: int = 0

    def source_query(self, src: Source, fields: dict[Path, str]) -> Query:
        """The single-collection Query that reads ``src`` (an access path's input)."""
        return Query(sql=self.sql, collection=src.collection, where=src.where, fields=fields,
                     duck_sql='SELECT * FROM "frame"', outputs=[], plain=None, star=src.star,
                     param_style=self.param_style, n_positional=self.n_positional)


def _flatten_parenthesized_joins(tree: exp.Expression) -> None:
    """``FROM (a JOIN b ON ...) JOIN c ...`` is ``FROM a JOIN b ON ... JOIN c ...``: joins
    associate to the left, so parentheses around the first FROM item's joins change nothing.
    (Parenthesized joins elsewhere, or named ``(a JOIN b) AS x``, are refused as FROM items.)"""
    for select in list(tree.find_all(exp.Select)):
        source = select.args.get("from_") or select.args.get("from")
        if source is None:
            continue
        item = source.this
        while (isinstance(item, exp.Subquery) and not item.alias and isinstance(item.this, exp.Table)
               and item.this.args.get("joins")):
            inner = item.this
            joins = inner.args["joins"]
            inner.set("joins", None)
            source.set("this", inner)
            select.set("joins", [*joins, *(select.args.get("joins") or [])])
            item = inner


def parse_general(sql: str) -> MultiQuery:
    """The MultiQuery of ``sql``, or a SqlError saying what is refused and where."""
    return _GeneralParser(sql).parse_general()


class _GeneralParser(_Parser):
    def __init__(self, sql: str):
        super().__init__(sql)
        self.refs: dict[int, Reference] = {}  # id(Table node) -> its reference
        self.scopes: dict[int, list[exp.Expression]] = {}  # id(Select) -> its FROM and JOIN items
        self.ctes: set[str] = set()
        self.current: Reference | None = None  # the reference field_path resolves for (index parts)
        self.unresolved: list[tuple[tuple[Reference, ...], Path, bool]] = []

    # -- checking ----------------------------------------------------------------------
    def parse_general(self) -> MultiQuery:
        tree = self.statement()
        if not isinstance(tree, (exp.Select, exp.SetOperation)):
            raise self.unsupported(f"{tree.key.upper()} statement (only SELECT)", tree)
        _normalize_time_functions(tree)
        _flatten_parenthesized_joins(tree)
        self.check(tree)
        self.ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
        for select in tree.find_all(exp.Select):
            self.scope(select)
        for select in tree.find_all(exp.Select):
            self.split(select)
        text = self.rewrite_tree(tree)
        sources = self.sources()
        for src in sources:
            for ref in src.references:
                for table in [t for t in text.find_all(exp.Table) if t.meta.get("rtindex_ref") is ref]:
                    table.replace(self.frame_expression(src, ref))
        positional = {str(p.this) for p in self.placeholders if str(p.this).startswith(POSITIONAL)}
        if positional and len(positional) != len({str(p.this) for p in self.placeholders}):
            raise SqlError("use either :name or ? parameters, not both", self.sql)
        self.refuse_is_missing(text.sql(DIALECT), tree)
        return MultiQuery(sql=self.sql, sources=sources, duck_sql=text.sql(DIALECT),
                          duck_params=dict(self.duck_params), unresolved=self.unresolved,
                          param_style=("positional" if positional else "named") if self.placeholders else None,
                          n_positional=len(positional))

    def check(self, tree: exp.Expression) -> None:
        """Refuse what would reach outside the collections (the sandbox's first line)."""
        for node in tree.walk():
            if isinstance(node, exp.Select):
                for arg in ("into", "locks", "sample", "connect", "match"):
                    if node.args.get(arg):
                        raise self.unsupported(arg.upper(), node)
            if isinstance(node, exp.TableSample):  # never dropped silently: every row would come back
                raise self.unsupported("sampling (TABLESAMPLE): a query reads every row it selects", node)
            if isinstance(node, (exp.Lateral, exp.Pivot, exp.Command)):
                raise self.unsupported(node.key.upper(), node)
            if isinstance(node, exp.Table):
                if not isinstance(node.this, exp.Identifier):
                    raise self.unsupported(f"{_call_name(node.this)} in FROM (FROM reads collections, CTEs and "
                                           "subqueries)", node)
                if node.args.get("catalog"):
                    raise self.unsupported("a catalog in FROM (name a collection: coll, or workspace.coll)", node)
            if isinstance(node, (exp.Func, exp.Anonymous)):
                name = _call_name(node)
                if _DENIED_FUNCTION.fullmatch(name):
                    raise self.unsupported(f"function {name.upper()} (a query reads collections only)", node)
            if isinstance(node, exp.DataType) and node.this == exp.DataType.Type.USERDEFINED:
                raise self.unsupported(f"type {node.sql(DIALECT)}", node)

    def scope(self, select: exp.Select) -> None:
        """The FROM and JOIN items of ``select``; a collection among them becomes a Reference."""
        source = select.args.get("from_") or select.args.get("from")
        items = ([source.this] if source is not None else []) + [j.this for j in select.args.get("joins") or []]
        for item in items:
            if isinstance(item, exp.Table):
                name = item.name
                if not item.text("db") and name.lower() in self.ctes:
                    continue
                coll = collection_name(item.text("db") or None, name)
                ref = Reference(coll, item.alias or coll.rpartition(".")[2])
                self.refs[id(item)] = ref
                item.meta["rtindex_ref"] = ref
            elif isinstance(item, exp.Subquery) and not isinstance(item.this, exp.Query):
                raise self.unsupported("a named parenthesized join ((a JOIN b) AS x): qualify fields by the "
                                       "collections' own names or aliases", item)
            elif not isinstance(item, (exp.Subquery, exp.Values)):
                raise self.unsupported(f"{item.key.upper()} in FROM (FROM reads collections, CTEs and subqueries)",
                                       item)
        self.scopes[id(select)] = items
        for join in select.args.get("joins") or []:
            if join.method:
                raise self.unsupported(f"{join.method} JOIN (name the columns: JOIN ... USING (a) or ON)", join)
            for name in join.args.get("using") or []:  # both sides read the field
                for item in items:
                    if id(item) in self.refs:
                        self.refs[id(item)].fields.setdefault((name.name,), name.name)
        for star in select.expressions:
            if isinstance(star, exp.Star):
                for item in items:
                    if id(item) in self.refs:
                        self.refs[id(item)].star = True
            elif isinstance(star, exp.Column) and isinstance(star.this, exp.Star):
                ref = self.qualifier(select, [p.name for p in star.parts[:-1]])
                if ref is not None:
                    ref[0].star = True

    # -- resolving fields -----------------------------------------------------------
    def scope_refs(self, select: exp.Select) -> list[Reference]:
        return [self.refs[id(i)] for i in self.scopes.get(id(select), []) if id(i) in self.refs]

    def qualifier(self, select: exp.Select | None, parts: list[str]) -> tuple[Reference, int] | None:
        """The reference ``parts`` starts with (and how many parts name it), searching
        ``select`` and the SELECTs around it (a correlated subquery names outer references)."""
        while select is not None:
            for ref in self.scope_refs(select):
                table = ref.collection.rpartition(".")[2]
                if ref.alias != table:  # FROM coll AS a: only a names it (as in SQL), so an outer coll is reachable
                    if parts and parts[0] == ref.alias:
                        return ref, 1
                    continue
                if len(parts) >= 2 and collection_name(parts[0], parts[1]) == ref.collection:
                    return ref, 2
                if parts and parts[0] in (ref.alias, ref.collection):
                    return ref, 1
            select = select.find_ancestor(exp.Select)
        return None

    def names_other_source(self, select: exp.Select | None, name: str) -> bool:
        """Whether ``name`` is the name of a FROM item (a CTE, a subquery) that is no collection,
        in ``select`` or around it."""
        while select is not None:
            for item in self.scopes.get(id(select), []):
                if id(item) not in self.refs and item.alias_or_name == name:
                    return True
            select = select.find_ancestor(exp.Select)
        return False

    def resolve(self, node: exp.Expression) -> tuple[Reference | None, tuple[Reference, ...], Path] | None:
        """(reference, candidates, path) of a field reference: the reference when the text
        decides it, else the references of its SELECT whose documents may hold it; None when
        it is not a collection's field (an alias, a CTE's or subquery's column)."""
        parts = _parts(node)
        if not parts:
            return None
        select = node.find_ancestor(exp.Select)
        if select is None:
            return None
        found = self.qualifier(select, parts)
        if found is not None:
            ref, n = found
            return (ref, (ref,), tuple(parts[n:])) if len(parts) > n else None
        if len(parts) == 1 and parts[0] in _aliases(select) and _clause(node, select) not in ("expressions", "where"):
            return None  # an output alias (GROUP BY, HAVING, ORDER BY); WHERE reads the documents' field
        if len(parts) > 1 and self.names_other_source(select, parts[0]):
            return None  # a column of a CTE or subquery
        lam = node.find_ancestor(exp.Lambda)
        while lam is not None:
            if parts[0] in {p.name for p in lam.expressions}:
                return None  # a lambda's parameter (list_transform(l, x -> x + 1))
            lam = lam.find_ancestor(exp.Lambda)
        refs = self.scope_refs(select)
        items = self.scopes.get(id(select), [])
        if not refs:
            return None
        if len(items) == 1:
            return refs[0], (refs[0],), tuple(parts)
        if len(parts) > 1:
            owner = next((item.alias_or_name for item in items if id(item) not in self.refs
                          and isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select)
                          and parts[0] in (e.alias_or_name for e in item.this.expressions)), refs[0].alias)
            raise self.unsupported(f"the nested field {'.'.join(parts)} without its collection or subquery in a "
                                   f"SELECT over several (write {owner}.{'.'.join(parts)})", node)
        return None, tuple(refs), tuple(parts)

    def field_path(self, node: exp.Expression) -> Path | None:
        """For :meth:`predicate`: the path of a field of the reference whose index part is made."""
        if not isinstance(node, (exp.Column, exp.Dot)) or not _parts(node):
            return None
        found = self.resolve(node)
        if found is None or found[0] is not self.current:
            return None
        return found[2]

    # -- WHERE --------------------------------------------------------------------------
    def split(self, select: exp.Select) -> None:
        """Move the conjuncts of ``select``'s WHERE the index answers into its references' index parts."""
        where = select.args.get("where")
        refs = self.scope_refs(select)
        if where is None or not refs:
            return
        joins = select.args.get("joins") or []
        pushable = all(j.side == "" and (j.kind or "") in _PUSHABLE_JOINS for j in joins)
        kept: list[exp.Expression] = []
        for conjunct in conjuncts(where.this):
            target = self.only_reference(conjunct, refs) if pushable else None
            pred = None
            if target is not None:
                self.current = target
                try:
                    pred = self.predicate(conjunct)
                except UnsupportedSqlError:
                    pred = None
                finally:
                    self.current = None
            if pred is None:
                kept.append(conjunct)
            else:
                target.index = pred if target.index is None else P.And((target.index, pred))
        residual = exp.and_(*kept, copy=False) if kept else None
        for ref in refs:
            ref.residual = residual.sql(DIALECT) if residual is not None else None
        if residual is None:
            where.pop()
        else:
            where.set("this", residual)

    def only_reference(self, conjunct: exp.Expression, refs: list[Reference]) -> Reference | None:
        """The one reference of ``refs`` (its SELECT's) every field of ``conjunct`` surely
        belongs to, or None (an outer reference's field in a correlated subquery is no
        predicate on the outer rows)."""
        if conjunct.find(exp.Subquery, exp.Select):
            return None
        named = set()
        for col in conjunct.find_all(exp.Column):
            found = self.resolve(col)
            if found is None or found[0] is None or all(found[0] is not r for r in refs):
                return None
            named.add(id(found[0]))
        return next(r for r in refs if id(r) in named) if len(named) == 1 else None

    # -- the DuckDB text -------------------------------------------------------------
    def rewrite_tree(self, tree: exp.Expression) -> exp.Expression:
        """Fields -> frame columns, placeholders -> DuckDB parameters, time functions -> DuckDB."""
        def fix(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Placeholder):
                return self.duck_placeholder(n)
            name = _time_function(n)
            if name is not None:  # its argument is rewritten while it still sits in the tree
                return _duck_time_function(name, n.expressions[0].transform(fix, copy=False))
            if isinstance(n, (exp.Column, exp.Dot)) and _parts(n) and not isinstance(n.this, exp.Star):
                found = self.resolve(n)
                if found is None:
                    return n
                ref, candidates, path = found
                column = ".".join(path)
                if ref is not None:
                    ref.fields.setdefault(path, column)
                    qualified = bool(self.qualifier(n.find_ancestor(exp.Select), _parts(n)))
                    return exp.column(column, table=ref.alias if qualified else None, quoted=True)
                items = self.scopes.get(id(n.find_ancestor(exp.Select)), [])
                self.unresolved.append((candidates, path, len(candidates) == len(items)))
                return exp.column(column, quoted=True)
            if isinstance(n, exp.Star) and n.parent is not None and isinstance(n.parent, exp.Select):
                hidden = sorted({c for ref in self.scope_refs(n.parent) for p, c in ref.fields.items() if len(p) > 1})
                if hidden:
                    n = n.copy()
                    n.set("except_", [*(n.args.get("except_") or []), *(exp.column(c, quoted=True) for c in hidden)])
                return n
            return n
        # in place (scopes are known by node identity): fields first, so that the hidden
        # columns a * leaves out are known, then the stars
        tree = tree.transform(lambda n: n if isinstance(n, exp.Star) else fix(n), copy=False)
        return tree.transform(lambda n: fix(n) if isinstance(n, exp.Star) else n, copy=False)

    def sources(self) -> list[Source]:
        by_collection: dict[str, list[Reference]] = {}
        for ref in self.refs.values():
            by_collection.setdefault(ref.collection, []).append(ref)
        out = []
        for i, (coll, refs) in enumerate(by_collection.items()):
            parts = [r.index for r in refs]
            if all(p == parts[0] for p in parts):
                where = parts[0]
            else:
                where = None if any(p is None for p in parts) else P.Or(tuple(dict.fromkeys(parts)))
                for j, ref in enumerate(refs):
                    if ref.index is not None:
                        ref.mask = f"{MASK}{j}"
            fields: dict[Path, str] = {}
            for ref in refs:
                fields.update(ref.fields)
            out.append(Source(coll, f"__c{i}", refs, where, fields, any(r.star for r in refs)))
        return out

    def frame_expression(self, src: Source, ref: Reference) -> exp.Expression:
        """What a reference reads in the DuckDB text: its collection's frame (its rows of it)."""
        masks = list(src.masks)
        if not masks:
            return exp.Table(this=exp.to_identifier(src.frame, quoted=True),
                             alias=exp.TableAlias(this=exp.to_identifier(ref.alias, quoted=True)))
        star = exp.Star(except_=[exp.column(m, quoted=True) for m in masks])
        inner = exp.select(star).from_(exp.Table(this=exp.to_identifier(src.frame, quoted=True)))
        if ref.mask is not None:
            inner = inner.where(exp.column(ref.mask, quoted=True))
        return exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier(ref.alias, quoted=True)))


def _parts(node: exp.Expression) -> list[str]:
    """The names of a Column (with its qualifiers) and the Dot chain on it; [] for anything else."""
    names: list[str] = []
    while isinstance(node, exp.Dot):
        if not isinstance(node.expression, exp.Identifier):
            return []
        names.append(node.expression.name)
        node = node.this
    if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
        return []
    return [p.name for p in node.parts] + list(reversed(names))


def _aliases(select: exp.Select) -> set[str]:
    return {e.alias for e in select.expressions if isinstance(e, exp.Alias)}


def _clause(node: exp.Expression, select: exp.Select) -> str:
    """The argument of ``select`` that ``node`` is in: ``expressions`` (the SELECT list),
    ``where``, ``group``, ``order``, ..."""
    while node.parent is not None and node.parent is not select:
        node = node.parent
    return node.arg_key


def _call_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return node.name
    if isinstance(node, exp.Func):
        return node.sql_name()
    return node.key
