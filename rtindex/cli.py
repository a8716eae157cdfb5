"""Command line: ``rtindex demo``, ``serve``, ``keys``, ``sql``, ``collections``, ``import``
(also ``python -m rtindex ...``); docs/reference.md, "Command line", describes each."""

from __future__ import annotations

import argparse
import builtins
import contextlib
import itertools
import os
import sys
import time
from typing import IO, Iterable, Iterator

import orjson
from tqdm import tqdm

import rtindex
from rtindex import outputs

DEFAULT_DIR = "rtindex-data"


def _keys(args, parser) -> int:
    from rtindex.server.auth import KeyStore

    store = KeyStore(args.data)
    if args.action == "create":
        key, entry = store.create(args.role, args.name)
        print(f"{key}\n(id {entry['id']}, role {entry['role']}; shown once, stored hashed)")
    elif args.action == "list":
        for k in store.list():
            print(f"{k['id']}  {k['role']:<5}  {time.strftime('%Y-%m-%d %H:%M', time.localtime(k['created']))}  {k['name']}")
    else:
        if not args.id:
            parser.error("keys revoke needs --id")
        if not store.revoke(args.id):
            print(f"rtindex keys: no key with id {args.id!r}", file=sys.stderr)
            return 1
        print(f"revoked {args.id}")
    return 0


class UsageError(Exception):
    """A command given what it cannot work with (a missing directory, parquet without a file):
    reported in one line, like every RtindexError, never with a traceback."""


# what a command reports in one line (its message says what was wrong), never as a traceback:
# a mistake in the command, the database's refusal (bad SQL, no such collection), a file error
FAILURES = (UsageError, rtindex.RtindexError, OSError)


def _open_reader(path: str) -> rtindex.Database:
    """The database at ``path`` as a reader: it takes no lock, so it works beside a running
    ``rtindex serve`` or any other writer, and sees their writes as they are made."""
    if not os.path.isdir(path):
        raise UsageError(f"no database at {path} (check the path: it is the directory given to "
                         "rtindex.open, rtindex serve --data or rtindex import)")
    db = rtindex.open(path, role="reader")
    try:
        db.refresh()  # every write acknowledged before this command started
    except BaseException:
        db.close()
        raise
    return db


def _params(pairs: list[str]) -> dict | None:
    """``--param NAME=VALUE`` pairs as a dict: VALUE is JSON when it parses (``7``, ``true``,
    ``"7"``, ``[1, 2]``), else the string as typed."""
    if not pairs:
        return None
    params = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise UsageError(f"--param {pair!r}: write NAME=VALUE, e.g. --param user=alice")
        try:
            params[name] = orjson.loads(value)
        except orjson.JSONDecodeError:
            params[name] = value
    return params


@contextlib.contextmanager
def _destination(path: str | None) -> Iterator[IO[str]]:
    """Standard output, or the file ``--output`` names (replaced)."""
    if path is None:
        yield sys.stdout
        return
    with builtins.open(path, "w", encoding="utf-8", newline="") as f:
        yield f


def _columns_and_rows(result: rtindex.Result, fmt: str) -> tuple[list[str], Iterable[dict]]:
    """The rows to write: as the query returned them (``SELECT *``: the documents as stored),
    or, for a result over the database's ``max_result_bytes`` written as CSV or JSON, read a
    batch at a time from ``Result.arrow_reader()`` (typed columns: a field a document lacks
    is null there), so that an export of any size takes little memory."""
    try:
        rows = result.rows()
    except rtindex.ResultTooLargeError as e:
        if fmt == "table":  # no one reads that many rows on a screen
            raise UsageError(f"{e.message}; or write it with --format csv, json or parquet, which "
                             "stream it") from None
        reader = result.arrow_reader()
        return reader.schema.names, itertools.chain.from_iterable(b.to_pylist() for b in reader)
    return (result.columns if fmt != "json" else []), rows


def _write_result(result: rtindex.Result, fmt: str, out: IO[str], max_width: int) -> None:
    """One result in a text format; a table ends with its footer, so a person sees the count
    and the time with it, while CSV and JSON stay data only: their footer goes to standard
    output when they go to a file, else to standard error."""
    columns, rows = _columns_and_rows(result, fmt)
    outputs.write_text(columns, rows, fmt, out, max_width)
    foot = outputs.footer(len(result), result.seconds, result.access)
    print(foot, file=out if fmt == "table" else sys.stderr if out is sys.stdout else sys.stdout, flush=True)
    _write_warnings(result, out if fmt == "table" else sys.stderr)


def _write_warnings(result: rtindex.Result, out: IO[str]) -> None:
    """``Result.warnings`` (a field no document has, with what was probably meant), one line
    each under the footer: on standard error unless they go under a table."""
    for w in result.warnings:
        print(f"warning: {w}", file=out, flush=True)


def _write_parquet(result: rtindex.Result, path: str) -> None:
    """The result's Arrow batches into a Parquet file, one at a time (any size)."""
    import pyarrow.parquet as pq

    reader = result.arrow_reader()
    with pq.ParquetWriter(path, reader.schema) as writer:
        for batch in reader:
            writer.write_batch(batch)


def _sql(args) -> int:
    params = _params(args.param)
    if args.format == "parquet" and args.output is None:
        raise UsageError("--format parquet writes a file: add --output FILE.parquet")
    with _open_reader(args.dir) as db:
        if args.query is None:
            return _shell(db, args)
        result = db.sql(args.query, params)
        if args.format == "parquet":
            _write_parquet(result, args.output)
            print(outputs.footer(len(result), result.seconds, result.access))
            _write_warnings(result, sys.stderr)
            return 0
        with _destination(args.output) as out:
            _write_result(result, args.format, out, args.max_width)
    return 0


def _shell(db: rtindex.Database, args) -> int:
    from rtindex import shell

    if args.format == "parquet":
        raise UsageError("the shell runs many statements; --format parquet writes one result: "
                         "give the query on the command line")
    if args.param:
        raise UsageError("--param binds the parameters of a query given on the command line; "
                         "the shell takes none")
    with _destination(args.output) as out:
        return shell.run(lambda sql: _write_result(db.sql(sql), args.format, out, args.max_width),
                         {".collections": lambda: _write_collections(db, args.format, out)},
                         failures=FAILURES, interactive=sys.stdin.isatty(),
                         banner=f"rtindex {rtindex.__version__}: SQL on {db.path} (reading; statements end "
                                f"with ';', .help for help, Ctrl-D to leave)")


def _disk_bytes(path: str) -> int:
    """Bytes of the files under ``path`` (a writer may remove one as we look: it counts 0)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _write_collections(db: rtindex.Database, fmt: str, out: IO[str]) -> None:
    """Name, documents, shards and size on disk of each collection; in a table the size reads
    as ``1.23MB``, in CSV and JSON it is ``disk_bytes``."""
    columns = ["name", "documents", "shards", "disk" if fmt == "table" else "disk_bytes"]
    rows = []
    for name in db.collection_names():
        coll = db[name]
        size = _disk_bytes(coll.path)
        rows.append(dict(zip(columns, (name, len(coll), coll.n_shards,
                                       tqdm.format_sizeof(size, "B") if fmt == "table" else size))))
    outputs.write_text(columns, rows, fmt, out)


def _collections(args) -> int:
    with _open_reader(args.dir) as db, _destination(args.output) as out:
        _write_collections(db, args.format, out)
    return 0


ERRORS_SHOWN = 5  # per file; IngestStats.errors has them all


def _where(path: str, index: int) -> str:
    """Where a failed document was in its file, as a person finds it there."""
    name = path.lower().removesuffix(".gz")
    if name.endswith((".ndjson", ".jsonl")):
        return f"line {index + 1}"
    if name.endswith(".parquet"):
        return f"row {index} (0-based)"
    return f"document {index} (0-based: array item, or line - 1)"


def _import_file(coll: rtindex.Collection, path: str, batch_size: int, json_path: str | None = None) -> bool:
    """Ingest one file and print what happened; False when it failed entirely."""
    try:
        stats = coll.ingest_file(path, errors="report", batch_size=batch_size, json_path=json_path)
        size = os.path.getsize(path)
    except (rtindex.RtindexError, ValueError, OSError) as e:  # unreadable: not JSON/Parquet, gzip, a typo
        print(f"{path}: failed: {e}", file=sys.stderr)
        return False
    secs = max(stats.seconds, 1e-9)
    print(f"{path}: {stats.n:,} doc{'' if stats.n == 1 else 's'} stored, {len(stats.errors):,} failed, "
          f"{stats.seconds:.2f} s ({stats.n / secs:,.0f} docs/s, {size / secs / 1e6:,.1f} MB/s)", flush=True)
    for err in stats.errors[:ERRORS_SHOWN]:
        print(f"  {_where(path, err.index)}: {err.message} (at {err.path})", file=sys.stderr)
    if len(stats.errors) > ERRORS_SHOWN:
        print(f"  ... and {len(stats.errors) - ERRORS_SHOWN:,} more", file=sys.stderr)
    for note in stats.notes:  # (the option of the library's advice is --json-path here)
        print(f"  note: {note.replace('pass json_path=', 'import with --json-path ')}", file=sys.stderr)
    return stats.n > 0 or not stats.errors


def _import(args) -> int:
    if args.batch_size < 1:
        raise UsageError("--batch-size must be positive")
    missing = [f for f in args.files if not os.path.isfile(f)]
    if missing:  # before anything is made: a typo must not leave an empty collection behind
        raise UsageError(f"no file {', '.join(missing)}: nothing imported")
    try:
        db = rtindex.open(args.dir)
    except rtindex.LockedError as e:
        raise UsageError(f"{e}. If that is a running rtindex serve, post the files to it instead "
                         f"(POST /v1/collections/{args.collection}/docs, docs/service.md), or stop it "
                         "and import again") from None
    with db:
        if args.collection in db:
            coll = db[args.collection]
            if args.shards is not None and args.shards != coll.n_shards:
                print(f"note: collection {args.collection!r} exists with {coll.n_shards} shards; --shards "
                      f"applies only to a collection the import creates", file=sys.stderr)
        else:
            try:
                coll = db.create_collection(args.collection, shards=4 if args.shards is None else args.shards)
            except ValueError as e:  # the name or the shard count: the message says which, and the rules
                raise UsageError(str(e)) from None
            print(f"created collection {coll.name!r} with {coll.n_shards} shards")
        ok = True
        try:
            for path in args.files:
                ok = _import_file(coll, path, args.batch_size, args.json_path) and ok
        except KeyboardInterrupt as e:
            for note in getattr(e, "__notes__", ()):  # what was stored stays stored: say how much
                print(note, file=sys.stderr)
            return 130
        print(f"collection {coll.name!r} now has {len(coll):,} docs")
    return 0 if ok else 1


IMPORT_EXAMPLES = """\
examples:
  rtindex import rtindex-data events events.ndjson
  rtindex import rtindex-data events day-*.ndjson.gz old.parquet --shards 8

Formats, by the file's name: .ndjson and .jsonl (one document a line), .json (a JSON array,
or NDJSON), each also gzip'd (.gz), and .parquet (one document a row). A bad document is
reported (the first few, with their line or row) and the others are stored. Exit status 1
when a file could not be read at all or none of its documents could be stored.
The import writes, so it needs the database to itself: beside a running rtindex serve,
post the files to the service instead (docs/service.md)."""
SQL_EXAMPLES = """\
examples:
  rtindex sql rtindex-data "SELECT kind, COUNT(*) AS n FROM events GROUP BY kind"
  rtindex sql rtindex-data "SELECT * FROM events WHERE user = :u" --param u=alice
  rtindex sql rtindex-data "SELECT * FROM events" --format json --output events.ndjson
  rtindex sql rtindex-data                   # a shell: statements end with ';'
  rtindex sql rtindex-data < queries.sql     # a script, one statement after another

--param NAME=VALUE binds :NAME; VALUE is JSON when it parses (7, true, "7", [1,2]), else text.
The database is opened as a reader: it works beside a running rtindex serve or other writer.
The shell keeps its history in $RTINDEX_HISTORY (default ~/.rtindex_history; empty: none)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtindex", description="rtindex command line")
    parser.add_argument("--version", action="version", version=f"rtindex {rtindex.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("demo", help="load generated events into an embedded database and query them")
    p.add_argument("--dir", default=DEFAULT_DIR, help=f"database directory (default: ./{DEFAULT_DIR})")
    p.add_argument("--events", type=int, default=200_000, help="how many events to generate (default 200,000)")
    p.add_argument("--shards", type=int, default=4)
    p = sub.add_parser("serve", help="run the HTTP service: one ingest process, N query processes (docs/service.md)")
    p.add_argument("--data", default=DEFAULT_DIR, help=f"database directory, made if missing (default: ./{DEFAULT_DIR})")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--query-workers", type=int, default=1, help="query processes (default 1)")
    p.add_argument("--max-concurrent-queries", type=int, default=4, help="per query process (default 4)")
    p.add_argument("--max-queued-queries", type=int, default=None,
                   help="per query process (default: as many as --max-concurrent-queries)")
    p.add_argument("--queue-timeout-ms", type=int, default=1000, help="longest wait for a query slot (default 1000)")
    p.add_argument("--max-loop-lag-ms", type=float, default=1.0,
                   help="refuse a share of queries while a query process's event loop runs this late "
                        "(default 1; 0: never)")
    p.add_argument("--no-auth", action="store_true", help="no API keys (refused unless --host is a loopback address)")
    p.add_argument("--demo", action="store_true", help="load demo events into a collection 'demo_events' if it is missing")
    p.add_argument("--ray", default="", metavar="ADDRESS",
                   help="serve the collections of this Ray cluster (auto, HOST:6379 or ray://HOST:10001; "
                        "docs/scale-out.md); --data then keeps only the service's keys and metrics")
    p.add_argument("--ray-root", default="", metavar="DIR",
                   help="with --ray, for a cluster without collections yet: where its storage nodes keep them")
    p.add_argument("--limit", action="append", default=[], metavar="NAME=VALUE",
                   help="change a request limit, e.g. --limit max_body_bytes=16777216 (docs/service.md, Limits)")
    p = sub.add_parser("keys", help="manage the service's API keys")
    p.add_argument("action", choices=["create", "list", "revoke"])
    p.add_argument("--data", default=DEFAULT_DIR, help=f"database directory (default: ./{DEFAULT_DIR})")
    p.add_argument("--role", choices=["read", "write", "admin"], default="read", help="for create (default read)")
    p.add_argument("--name", default="", help="for create: a note saying whose key it is")
    p.add_argument("--id", help="for revoke: the key's id (from list)")

    p = sub.add_parser("sql", help="run a SQL query, or a SQL shell, on a database",
                       description="Run one SELECT on the database in DIR and print its rows, or with no "
                                   "query, a SQL shell. docs/sql.md has the dialect.",
                       epilog=SQL_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", metavar="DIR", help="the database directory")
    p.add_argument("query", metavar="QUERY", nargs="?", help="one SELECT; leave out for the shell")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="bind :NAME (repeatable)")
    _output_options(p, outputs.FORMATS,
                    "table (default; with a footer: rows, time, access path), csv, json (JSON lines: one "
                    "object a row) or parquet (needs --output)")
    p.add_argument("--max-width", type=int, default=outputs.DEFAULT_MAX_WIDTH, metavar="N",
                   help=f"cut table cells longer than N characters (default {outputs.DEFAULT_MAX_WIDTH}; 0: never)")

    p = sub.add_parser("collections", help="list the collections of a database with their sizes",
                       description="List the collections in DIR: documents, shards and size on disk. Opens the "
                                   "database as a reader, so it works beside a running writer.")
    p.add_argument("dir", metavar="DIR", help="the database directory")
    _output_options(p, outputs.TEXT_FORMATS, "table (default), csv or json (JSON lines, sizes in disk_bytes)")

    p = sub.add_parser("import", help="ingest NDJSON, JSON or Parquet files into a collection",
                       description="Ingest FILEs into COLLECTION of the database in DIR (both made when "
                                   "missing), with a progress bar on a terminal and a summary per file.",
                       epilog=IMPORT_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", metavar="DIR", help="the database directory (made when missing)")
    p.add_argument("collection", metavar="COLLECTION", help="the collection (made when missing)")
    p.add_argument("files", metavar="FILE", nargs="+", help="files to ingest, in this order")
    p.add_argument("--shards", type=int, metavar="N", help="shards of a collection the import creates (default 4)")
    p.add_argument("--json-path", metavar="PATH", help="store the elements of the array at this dotted path "
                                                       "of each file's one JSON document (such as statuses)")
    p.add_argument("--batch-size", type=int, default=1000, metavar="N",
                   help="documents per write batch (default 1000)")

    p = sub.add_parser("rebalance", help="move shard groups of a Ray cluster's collections to its least loaded nodes",
                       description="Move shard groups from the storage nodes that hold the most to those that "
                                   "hold the fewest (a node just added holds none), one group at a time, while "
                                   "the collections stay readable (docs/scale-out.md).")
    p.add_argument("address", metavar="ADDRESS", nargs="?", default="auto",
                   help="the Ray cluster: auto (default), HOST:6379 or ray://HOST:10001")
    return parser


def _rebalance(args: argparse.Namespace) -> int:
    """``rtindex rebalance``: one line per group moved."""
    db = rtindex.open_cluster(args.address)
    try:
        moves, nodes = db.rebalance(), db.nodes()
    finally:
        db.close()
    for m in moves:
        print(f"moved {m['collection']} group {m['group']}: node {m['from']} -> node {m['to']}")
    print(f"{len(moves)} group{'' if len(moves) == 1 else 's'} moved; storage nodes: {', '.join(nodes)}")
    return 0


def _output_options(p: argparse.ArgumentParser, formats: tuple[str, ...], what: str) -> None:
    p.add_argument("--format", choices=formats, default="table", help=what)
    p.add_argument("--output", "-o", metavar="FILE", help="write there instead of to standard output")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        from rtindex.server.config import ServerConfig, parse_limits
        from rtindex.server.supervisor import serve

        try:
            limits = parse_limits(args.limit)
        except ValueError as e:
            parser.error(str(e))
        return serve(ServerConfig(data=args.data, host=args.host, port=args.port, query_workers=args.query_workers,
                                  max_concurrent_queries=args.max_concurrent_queries,
                                  max_queued_queries=args.max_queued_queries, queue_timeout_ms=args.queue_timeout_ms,
                                  max_loop_lag_ms=args.max_loop_lag_ms,
                                  auth=not args.no_auth, demo=args.demo, ray=args.ray, ray_root=args.ray_root,
                                  limits=limits))
    if args.command == "keys":
        return _keys(args, parser)
    if args.command == "demo":
        if args.events < 1:
            parser.error("--events must be positive")
        from rtindex.demo import DemoRefused, demo

        try:
            demo(args.dir, args.events, args.shards)
        except (DemoRefused, rtindex.NotADatabaseError, rtindex.StorageError) as e:
            # a refusal to touch the user's data, not a crash: say why, without a traceback
            print(f"rtindex demo: {e}", file=sys.stderr)
            return 1
        return 0
    command = {"sql": _sql, "collections": _collections, "import": _import, "rebalance": _rebalance}[args.command]
    try:
        return command(args)
    except BrokenPipeError:  # `rtindex sql ... | head` stopped reading: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python flushes stdout at exit
        return 0
    except FAILURES as e:
        # what went wrong with the user's query, path or file: one line, no traceback
        print(f"rtindex {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
