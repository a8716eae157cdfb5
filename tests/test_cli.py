"""The command line, run as a user runs it: every command in a real subprocess (`python -m
rtindex ...`), on real databases, beside a live writer process where that matters."""

from __future__ import annotations

import csv
import importlib.metadata
import io
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import time

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rtindex
from rtindex import outputs, shell


def test_demo_runs_and_reruns(tmp_path):
    for _ in range(2):
        out = subprocess.run([sys.executable, "-m", "rtindex", "demo", "--events", "3000", "--shards", "2",
                              "--dir", str(tmp_path / "demo")], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "ingested 3,000 docs" in out.stdout
        assert "find it by processBy: 1 doc" in out.stdout
        assert "delete -> True; 3,000 docs" in out.stdout


def test_demo_rejects_bad_arguments(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rtindex", "demo", "--events", "0", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--events must be positive" in out.stderr


def run_demo(path, *extra):
    return subprocess.run([sys.executable, "-m", "rtindex", "demo", "--events", "1000", "--shards", "2",
                           "--dir", str(path), *extra], capture_output=True, text=True, timeout=300)


def test_demo_leaves_a_collection_named_events_alone(tmp_path):
    """The demo used to drop "events" in --dir without a word: a user's data, gone."""
    with rtindex.open(str(tmp_path / "db")) as db:
        db.create_collection("events", shards=1).ingest([{"_id": i, "mine": True} for i in range(5)])
    out = run_demo(tmp_path / "db")
    assert out.returncode == 0, out.stderr
    assert "collection 'demo_events'" in out.stdout
    with rtindex.open(str(tmp_path / "db")) as db:
        assert db.collection_names() == ["demo_events", "events"]
        assert len(db["events"]) == 5 and db["events"].get(3)["mine"] is True
        assert len(db["demo_events"]) == 1000


def test_demo_refuses_a_demo_events_collection_it_did_not_create(tmp_path):
    with rtindex.open(str(tmp_path / "db")) as db:
        db.create_collection("demo_events", shards=1).ingest([{"_id": "x"}])
    out = run_demo(tmp_path / "db")
    assert out.returncode == 1
    assert "already has a collection 'demo_events' that rtindex demo did not create" in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    with rtindex.open(str(tmp_path / "db")) as db:
        assert len(db["demo_events"]) == 1 and db["demo_events"].get("x") is not None


def test_demo_refuses_a_folder_that_is_not_a_database(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    out = run_demo(tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert f"rtindex demo: {tmp_path} is not an rtindex database" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


# -- rtindex --version, sql, collections, the shell --------------------------------------------

FOOTER = re.compile(r"^(\d[\d,]*) rows? \([\d,]+\.\d ms, (index|scan) path\)$")


def cli(*args, stdin: str | None = None, env: dict | None = None, timeout: float = 120):
    """``rtindex ARGS`` in a real subprocess (the shell's history kept out of the home dir)."""
    return subprocess.run([sys.executable, "-m", "rtindex", *map(str, args)], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "RTINDEX_HISTORY": "", **(env or {})})


def one_line_error(out, prefix: str) -> str:
    """The failure of a command: exit status 1 and one line on stderr, no traceback."""
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(prefix), out.stderr
    return out.stderr.strip()


DOCS = [{"_id": i, "kind": "ab"[i % 2], "n": i, "name": f"user{i}", "tags": ["x", str(i)],
         "note": "long " * 20 if i == 3 else None} for i in range(10)]


@pytest.fixture
def data(tmp_path):
    """A database with a collection "events" (2 shards), closed: the CLI opens it itself."""
    path = tmp_path / "data"
    with rtindex.open(str(path)) as db:
        db.create_collection("events", shards=2).ingest(DOCS)
    return path


def test_version_matches_the_installed_package():
    out = cli("--version")
    assert out.returncode == 0
    assert out.stdout == f"rtindex {importlib.metadata.version('rtindex')}\n" == f"rtindex {rtindex.__version__}\n"


@pytest.mark.parametrize("command, words", [("sql", ["--param NAME=VALUE", "parquet", "RTINDEX_HISTORY"]),
                                            ("collections", ["--format", "reader"]),
                                            ("import", ["--shards N", ".parquet", ".gz", "rtindex serve",
                                                        "--json-path PATH"])])
def test_every_command_explains_itself(command, words):
    out = cli(command, "--help")
    assert out.returncode == 0
    for word in words:
        assert word in out.stdout
    assert command in cli("--help").stdout


def test_sql_prints_an_aligned_table_with_a_footer(data):
    out = cli("sql", data, "SELECT kind, COUNT(*) AS n, MAX(name) AS last FROM events GROUP BY kind ORDER BY kind")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:4] == ["kind  n  last",
                         "----  -  -----",
                         "a     5  user8",
                         "b     5  user9"]
    assert FOOTER.match(lines[4]) and lines[4].startswith("2 rows (") and len(lines) == 5


def test_sql_prints_the_warnings_of_a_result(data, tmp_path):
    """A field no document has is a warning with what was probably meant: under the table,
    or on standard error when the output is data (CSV, JSON, Parquet), one-shot or in the shell."""
    query = "SELECT _id FROM events WHERE nmae = 'user1'"
    out = cli("sql", data, query)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert FOOTER.match(lines[-2]) and lines[-1].startswith("warning: ") and "did you mean name?" in lines[-1]
    for fmt in ("csv", "json"):
        out = cli("sql", data, query, "--format", fmt)
        assert out.returncode == 0 and "warning" not in out.stdout
        assert "did you mean name?" in out.stderr.splitlines()[-1]
    out = cli("sql", data, query, "--format", "parquet", "--output", tmp_path / "r.parquet")
    assert out.returncode == 0 and "did you mean name?" in out.stderr
    out = cli("sql", data, stdin=query + ";\n")
    assert out.returncode == 0 and "did you mean name?" in out.stdout.splitlines()[-1]


def test_sql_cuts_long_cells_and_shows_null_and_json(data):
    out = cli("sql", data, "SELECT _id, note, tags FROM events WHERE _id IN (2, 3) ORDER BY _id", "--max-width", "12")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:4] == ["_id  note          tags",
                         "---  ------------  ---------",
                         '  2  NULL          ["x","2"]',
                         '  3  long long l…  ["x","3"]']
    assert FOOTER.match(lines[4]).group(1) == "2"


def test_sql_formats_carry_the_same_rows(data, tmp_path):
    q = "SELECT _id, kind, n, tags FROM events ORDER BY _id"
    with rtindex.open(str(data), role="reader") as db:
        expected = db.sql(q).rows()
    out = cli("sql", data, q, "--format", "json")
    assert out.returncode == 0 and FOOTER.match(out.stderr.strip())  # data only on stdout
    assert [orjson.loads(line) for line in out.stdout.splitlines()] == expected
    out = cli("sql", data, q, "--format", "csv")
    assert list(csv.DictReader(io.StringIO(out.stdout))) == [
        {"_id": str(r["_id"]), "kind": r["kind"], "n": str(r["n"]), "tags": orjson.dumps(r["tags"]).decode()}
        for r in expected]
    import pyarrow.parquet as pq

    out = cli("sql", data, q, "--format", "parquet", "--output", tmp_path / "rows.parquet")
    assert out.returncode == 0 and FOOTER.match(out.stdout.strip()).group(1) == "10"
    assert pq.read_table(tmp_path / "rows.parquet").to_pylist() == expected
    out = cli("sql", data, q, "--output", tmp_path / "rows.txt")
    assert out.stdout == ""
    assert (tmp_path / "rows.txt").read_text().splitlines()[0].split() == ["_id", "kind", "n", "tags"]


def test_sql_binds_params_as_json_or_text(data):
    q = "SELECT _id FROM events WHERE n >= :low AND kind = :kind ORDER BY _id"
    out = cli("sql", data, q, "--param", "low=6", "--param", "kind=b", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert [orjson.loads(x)["_id"] for x in out.stdout.splitlines()] == [7, 9]
    # "6" as JSON is the string "6": compared with the number n it matches nothing
    out = cli("sql", data, "SELECT _id FROM events WHERE name = :name", "--param", 'name="user4"', "--format", "json")
    assert out.stdout == '{"_id":4}\n'


def test_sql_errors_are_one_clear_line(data, tmp_path):
    assert "syntax" in one_line_error(cli("sql", data, "SELECT FROM WHERE"), "rtindex sql: ")
    assert "no collection 'nope'" in one_line_error(cli("sql", data, "SELECT * FROM nope"), "rtindex sql: ")
    msg = one_line_error(cli("sql", tmp_path / "missing", "SELECT 1"), "rtindex sql: ")
    assert f"no database at {tmp_path / 'missing'}" in msg
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    assert "is not an rtindex database" in one_line_error(cli("sql", tmp_path / "notes", "SELECT 1"), "rtindex sql: ")
    out = cli("sql", data, "SELECT * FROM events", "--format", "parquet")
    assert "--output" in one_line_error(out, "rtindex sql: ")
    assert "NAME=VALUE" in one_line_error(cli("sql", data, "SELECT * FROM events", "--param", "x"), "rtindex sql: ")
    assert sorted(p.name for p in (tmp_path / "notes").iterdir()) == ["a.txt"]


def test_collections_lists_documents_shards_and_size(data):
    out = cli("collections", data)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["name", "documents", "shards", "disk"]
    assert lines[2].split()[:3] == ["events", "10", "2"] and re.fullmatch(r"[\d.]+[kMG]?B", lines[2].split()[3])
    out = cli("collections", data, "--format", "json")
    (row,) = [orjson.loads(x) for x in out.stdout.splitlines()]
    assert row["name"] == "events" and row["documents"] == 10 and row["shards"] == 2
    on_disk = sum(f.stat().st_size for f in (data / "collections" / "events").rglob("*") if f.is_file())
    assert row["disk_bytes"] == on_disk


SCRIPT = textwrap.dedent("""\
    -- a comment; not a statement
    SELECT COUNT(*) AS n
      FROM events;
    SELECT name FROM events WHERE name = 'user;1'; SELECT kind FROM events WHERE _id = 4;
    SELEC oops;
    .collections
    SELECT _id FROM events WHERE _id = 9""")


def test_shell_runs_statements_piped_into_it(data):
    out = cli("sql", data, stdin=SCRIPT)
    assert out.returncode == 1  # one statement failed; the others ran
    assert "rtindex>" not in out.stdout  # no prompts when stdin is not a terminal
    lines = out.stdout.splitlines()
    footers = [i for i, line in enumerate(lines) if FOOTER.match(line)]
    assert [line.split() for line in lines[:footers[0]]] == [["n"], ["--"], ["10"]]
    assert lines[footers[0] + 1:footers[1]] == ["name", "----"]  # 'user;1' is no name: no rows
    assert lines[footers[1] + 1:footers[2]] == ["kind", "----", "a"]
    assert lines[footers[2] + 1].split() == ["name", "documents", "shards", "disk"]  # .collections
    assert lines[footers[2] + 3].split()[:3] == ["events", "10", "2"]
    assert [line.split() for line in lines[footers[2] + 4:footers[3]]] == [["_id"], ["---"], ["9"]]
    assert len(footers) == 4 and len(lines) == footers[3] + 1
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    script = "SELECT _id FROM events WHERE _id < 2 ORDER BY _id;\n.quit\nSELEC;"
    out = cli("sql", data, "--format", "json", stdin=script)
    assert out.returncode == 0 and out.stdout == '{"_id":0}\n{"_id":1}\n'


def test_shell_on_a_terminal_prompts_and_keeps_history(data, tmp_path):
    """A real pseudo-terminal: the prompt, a statement over two lines, an error that leaves
    the shell running, Ctrl-D, and the history file (one entry per statement)."""
    import pty
    import select

    history = tmp_path / "history"
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "rtindex", "sql", str(data)], stdin=slave, stdout=slave,
                            stderr=slave, env={**os.environ, "RTINDEX_HISTORY": str(history), "TERM": "dumb"})
    os.close(slave)

    def until(marker: bytes) -> str:
        seen, deadline = b"", time.monotonic() + 60
        while not seen.endswith(marker):
            assert time.monotonic() < deadline and proc.poll() is None, seen
            if select.select([master], [], [], 0.1)[0]:
                seen += os.read(master, 4096)
        return seen.decode().replace("\r\n", "\n")

    try:
        assert "statements end with ';'" in until(b"rtindex> ")
        os.write(master, b"SELECT COUNT(*) AS n\n")
        until(b"    ...> ")
        os.write(master, b"FROM events;\n")
        assert "\n n\n--\n10\n1 row (" in until(b"rtindex> ")
        os.write(master, b"SELECT nope FROM;\n")
        assert "error: " in until(b"rtindex> ")
        os.write(master, b"\x04")  # Ctrl-D
        assert proc.wait(timeout=30) == 0
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert history.read_text().splitlines() == ["SELECT COUNT(*) AS n FROM events;", "SELECT nope FROM;"]


WRITER = textwrap.dedent("""\
    import sys, rtindex
    with rtindex.open(sys.argv[1]) as db:
        coll = db.create_collection("live", shards=2)
        n = 0
        for line in sys.stdin:  # each line: ingest that many more documents, then say how many
            k = int(line)
            coll.ingest([{"_id": n + i, "v": n + i} for i in range(k)])
            n += k
            print(n, flush=True)
    """)


def test_sql_and_collections_work_beside_a_live_writer(tmp_path):
    path = tmp_path / "db"
    with subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as writer:
        for more, total in ((100, 100), (150, 250)):
            writer.stdin.write(f"{more}\n")
            writer.stdin.flush()
            assert writer.stdout.readline() == f"{total}\n"  # acknowledged: the next command sees it
            out = cli("sql", path, "SELECT COUNT(*) AS n, MAX(v) AS top FROM live", "--format", "json")
            assert out.returncode == 0, out.stderr
            assert orjson.loads(out.stdout) == {"n": total, "top": total - 1}
            out = cli("collections", path, "--format", "json")
            assert orjson.loads(out.stdout)["documents"] == total
        out = cli("sql", path, stdin="SELECT COUNT(*) AS n FROM live;\n")
        assert out.stdout.split()[:3] == ["n", "---", "250"]
        (tmp_path / "more.ndjson").write_text('{"_id": "x"}\n')
        msg = one_line_error(cli("import", path, "live", tmp_path / "more.ndjson"), "rtindex import: ")
        assert f"(pid {writer.pid})" in msg and "post the files to it instead" in msg
        assert "POST /v1/collections/live/docs" in msg
        writer.stdin.close()
        assert writer.wait(timeout=60) == 0


def test_import_reports_each_file_and_fails_for_a_file_it_cannot_read(tmp_path):
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    files = tmp_path / "in"
    files.mkdir()
    (files / "a.ndjson").write_text('{"_id": 1, "v": 1}\n{"_id": 1.5}\nnot json\n{"_id": 2, "v": 2}\n')
    (files / "b.json.gz").write_bytes(gzip.compress(b'[{"_id": "b", "v": 3}]'))
    pq.write_table(pa.table({"_id": [10, 11], "v": [10, 11]}), files / "c.parquet")
    (files / "d.parquet").write_bytes(b"not parquet at all")
    (files / "e.csv").write_text("_id,v\n1,2\n")
    paths = [files / n for n in ("a.ndjson", "b.json.gz", "c.parquet", "d.parquet", "e.csv")]
    out = cli("import", tmp_path / "db", "events", *paths, "--shards", "3")
    assert out.returncode == 1 and "Traceback" not in out.stderr  # d and e failed; the others were stored
    lines = out.stdout.splitlines()
    assert lines[0] == "created collection 'events' with 3 shards"
    summary = r": (\d+) docs? stored, (\d+) failed, [\d.]+ s \([\d,]+ docs/s, [\d.,]+ MB/s\)$"
    assert [re.fullmatch(re.escape(str(p)) + summary, line).groups() for p, line in zip(paths, lines[1:4])] == [
        ("2", "2"), ("1", "0"), ("2", "0")]
    assert lines[4] == "collection 'events' now has 5 docs"
    err = out.stderr.splitlines()
    assert err[0].startswith("  line 2: _id must be a string or an integer") and err[1].startswith("  line 3: ")
    assert err[2].startswith(f"{paths[3]}: failed: ") and err[3].startswith(f"{paths[4]}: failed: cannot tell")
    with rtindex.open(str(tmp_path / "db"), role="reader") as db:
        # ints and a string in one column: text, by docs/sql.md's typing rule
        assert sorted(d["_id"] for d in db.sql("SELECT _id FROM events").rows()) == ["1", "10", "11", "2", "b"]
    out = cli("import", tmp_path / "db", "events", paths[2])  # again: the same documents, replaced
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "collection 'events' now has 5 docs"


def test_import_of_one_object_holding_documents_says_so_and_json_path_stores_them(tmp_path):
    answer = tmp_path / "twitter.json"
    answer.write_text(orjson.dumps({"statuses": [{"id": i} for i in range(100)]}, option=orjson.OPT_INDENT_2).decode())
    out = cli("import", tmp_path / "db", "tweets", answer)
    assert out.returncode == 0 and "1 doc stored" in out.stdout
    assert "its field statuses is an array of 100 objects: import with --json-path 'statuses'" in out.stderr
    out = cli("import", tmp_path / "db", "statuses", answer, "--json-path", "statuses")
    assert out.returncode == 0 and "100 docs stored" in out.stdout and "note" not in out.stderr
    out = cli("import", tmp_path / "db", "statuses", answer, "--json-path", "nope")
    assert out.returncode == 1 and "no field 'nope' (its fields: 'statuses')" in out.stderr


def test_import_refuses_a_missing_file_a_bad_name_or_shard_count(tmp_path):
    good, db = tmp_path / "a.ndjson", tmp_path / "db"
    good.write_text('{"_id": 1}\n')
    msg = one_line_error(cli("import", db, "events", good, tmp_path / "typo.ndjson"), "rtindex import: ")
    assert msg == f"rtindex import: no file {tmp_path / 'typo.ndjson'}: nothing imported"
    assert not db.exists()
    msg = one_line_error(cli("import", db, "bad name", good), "rtindex import: ")
    assert "invalid collection name 'bad name'" in msg
    msg = one_line_error(cli("import", db, "ok", good, "--shards", "0"), "rtindex import: ")
    assert "shards must be an integer from 1" in msg


def test_sql_json_output_imports_back_as_the_same_documents(data, tmp_path):
    out = cli("sql", data, "SELECT * FROM events", "--format", "json", "--output", tmp_path / "events.ndjson")
    assert out.returncode == 0 and FOOTER.match(out.stdout.strip()).group(1) == "10"
    out = cli("import", tmp_path / "copy", "events", tmp_path / "events.ndjson")
    assert out.returncode == 0, out.stderr
    with rtindex.open(str(data), role="reader") as a, rtindex.open(str(tmp_path / "copy"), role="reader") as b:
        assert sorted(a.sql("SELECT * FROM events").rows(), key=lambda d: d["_id"]) == \
            sorted(b.sql("SELECT * FROM events").rows(), key=lambda d: d["_id"])


REFERENCE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "reference.md"
# what differs from run to run: timings, rates and sizes; and the width of a column's rule
VARYING = re.compile(r"[\d,]+(\.\d+)?(?= ms| s | docs/s| MB/s)|\b[\d.]+[kMG]?B\b|\d{5,}|-{2,}")


def command_line_examples() -> list[tuple[str, str | None]]:
    """The ```sh blocks of the reference's "Command line" section, each with the ```text block
    right after it (its output, as a terminal shows it) when there is one."""
    text = REFERENCE.read_text()
    section = text[text.index("\n## Command line\n"):]
    section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
    blocks = re.findall(r"(?ms)^```(\w+)\n(.*?)^```\n?(\s*)", section)
    out = []
    for i, (lang, code, gap) in enumerate(blocks):
        if lang == "sh":
            after = blocks[i + 1] if i + 1 < len(blocks) and not gap.strip() else None
            out.append((code, after[1] if after and after[0] == "text" else None))
    return out


def test_the_reference_command_line_examples_run_as_written(tmp_path):
    """Each shell example of docs/reference.md, run in order in one directory with the
    installed ``rtindex`` script, prints what the text after it shows (timings aside)."""
    bin_dir = pathlib.Path(sys.executable).parent
    assert (bin_dir / "rtindex").exists(), "install the package: pip install -e ."
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "RTINDEX_HISTORY": ""}
    examples = command_line_examples()
    assert len(examples) >= 5
    for code, expected in examples:
        out = subprocess.run(["bash", "-e", "-c", code], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=300)
        assert out.returncode == 0, (code, out.stdout)
        if expected is not None:
            assert VARYING.sub("#", out.stdout).split() == VARYING.sub("#", expected).split(), (code, out.stdout)


# -- in process: the pieces the commands are made of -----------------------------------------

def test_a_result_over_max_result_bytes_streams_to_csv_json_and_parquet(tmp_path, capsys):
    """Exports of any size: a result the database refuses to build whole (ResultTooLargeError)
    is written a batch at a time from Result.arrow_reader(); a table of it is refused."""
    import pyarrow.parquet as pq

    from rtindex import cli

    docs = [{"_id": i, "s": "x" * 50, "o": {"k": i}} for i in range(300)]
    with rtindex.open(str(tmp_path / "db"), max_result_bytes=2000) as db:
        db.create_collection("c", shards=2).ingest(docs)
        result = db.sql("SELECT _id, s, o FROM c ORDER BY _id")
        with pytest.raises(rtindex.ResultTooLargeError):
            result.rows()
        out = io.StringIO()
        cli._write_result(result, "json", out, 40)
        assert [orjson.loads(line) for line in out.getvalue().splitlines()] == docs
        out = io.StringIO()
        cli._write_result(result, "csv", out, 40)
        lines = list(csv.reader(io.StringIO(out.getvalue())))
        assert lines[0] == ["_id", "s", "o"] and lines[1:3] == [["0", "x" * 50, '{"k":0}'], ["1", "x" * 50, '{"k":1}']]
        cli._write_parquet(result, str(tmp_path / "c.parquet"))
        assert pq.read_table(tmp_path / "c.parquet").to_pylist() == docs
        with pytest.raises(cli.UsageError, match="--format csv, json or parquet"):
            cli._write_result(result, "table", io.StringIO(), 40)
    # written to a file, so the footers went to stdout
    assert [FOOTER.match(line).group(1) for line in capsys.readouterr().out.splitlines()] == ["300", "300"]


def test_table_aligns_wide_characters_and_numbers():
    rows = [{"name": "東京", "n": 5}, {"name": "ab", "n": 12345}, {"name": None, "n": None}]
    text = outputs.table(["name", "n"], rows)
    assert text.splitlines() == ["name      n",
                                 "----  -----",
                                 "東京      5",
                                 "ab    12345",
                                 "NULL   NULL"]


LITERAL = st.text(st.characters(codec="utf-8", exclude_characters="'"), max_size=12)


@given(st.lists(st.lists(LITERAL, min_size=1, max_size=3), min_size=1, max_size=4),
       st.sampled_from([";", "; ", ";\n", ";\n\n  "]))
def test_splitter_cuts_at_semicolons_outside_strings(literals, separator):
    """Semicolons, newlines and comment marks inside string literals never cut a statement."""
    statements = ["SELECT " + ", ".join("'" + s + "'" for s in group) for group in literals]
    splitter, found = shell.Splitter(), []
    for line in (separator.join(statements) + ";").split("\n"):  # what the shell reads: lines
        found += splitter.feed(line)
    assert found == statements and not splitter.pending
