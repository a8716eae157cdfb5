"""Database: what open() accepts and refuses, the writer lock, manifests, and IngestStats.

Each test here was a way to lose or corrupt data silently, found by using rtindex as a new
user would: it must fail loudly, naming what is wrong.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import orjson
import pytest

import rtindex
from rtindex.errors import CorruptionError, NotADatabaseError, StorageError


def listing(path) -> dict:
    """Every file under ``path`` with its bytes: to show a refused open changed nothing."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, path)] = fh.read()
    return out


def make_db(path, n=100, shards=4, name="ev") -> None:
    with rtindex.open(str(path)) as db:
        db.create_collection(name, shards=shards).ingest([{"_id": i, "v": i} for i in range(n)])


# -- the marker: only a database is opened, only an empty folder is made one ---------------


def test_create_writes_a_marker_with_the_format(tmp_path):
    with rtindex.open(str(tmp_path / "db")):
        pass
    marker = orjson.loads((tmp_path / "db" / "rtindex.json").read_bytes())
    assert marker == {"format": 2, "created_by": f"rtindex {rtindex.__version__}"}


def test_open_without_create_refuses_a_folder_that_is_not_a_database(tmp_path):
    (tmp_path / "README.md").write_text("my project")
    (tmp_path / "src").mkdir()
    before = listing(tmp_path)
    with pytest.raises(NotADatabaseError, match=r"not an rtindex database \(it has no rtindex.json\)") as e:
        rtindex.open(str(tmp_path), create=False)
    assert str(tmp_path) in str(e.value)
    assert isinstance(e.value, ValueError)
    assert listing(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["README.md", "src"]


def test_create_refuses_a_non_empty_folder_that_is_not_a_database(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(NotADatabaseError, match="is not empty: refusing to create a database in it"):
        rtindex.open(str(tmp_path), create=True)
    assert os.listdir(tmp_path) == ["notes.txt"]


def test_create_in_an_empty_existing_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with rtindex.open(str(tmp_path / "empty")) as db:
        db.create_collection("c").ingest([{"_id": 1}])
    with rtindex.open(str(tmp_path / "empty"), create=False) as db:
        assert len(db["c"]) == 1


def test_open_without_create_refuses_an_empty_folder(tmp_path):
    with pytest.raises(NotADatabaseError, match="empty directory.*pass create=True"):
        rtindex.open(str(tmp_path), create=False)
    assert os.listdir(tmp_path) == []


def test_open_refuses_a_file(tmp_path):
    (tmp_path / "f").write_bytes(b"data")
    with pytest.raises(NotADatabaseError, match="is a file"):
        rtindex.open(str(tmp_path / "f"))
    assert (tmp_path / "f").read_bytes() == b"data"


def test_a_newer_format_is_refused_naming_its_version(tmp_path):
    make_db(tmp_path / "db", n=1)
    (tmp_path / "db" / "rtindex.json").write_bytes(orjson.dumps({"format": 3, "created_by": "rtindex 9.0"}))
    with pytest.raises(NotADatabaseError, match=r"has format 3 \(made by rtindex 9.0\).*reads format 2"):
        rtindex.open(str(tmp_path / "db"))


def test_a_corrupt_marker_is_corruption_naming_it(tmp_path):
    make_db(tmp_path / "db", n=1)
    (tmp_path / "db" / "rtindex.json").write_bytes(b'{"format": ')
    with pytest.raises(CorruptionError, match="rtindex.json is not valid JSON"):
        rtindex.open(str(tmp_path / "db"))


def test_a_database_made_before_the_marker_is_refused_naming_its_format(tmp_path):
    """rtindex 0.1 wrote collections/ and no marker, with segments inside RocksDB (format 1):
    refused with a message that says so, and left exactly as it was."""
    make_db(tmp_path / "db", n=50)
    os.remove(tmp_path / "db" / "rtindex.json")
    os.remove(tmp_path / "db" / "writer.lock")
    assert os.listdir(tmp_path / "db") == ["collections"]
    with pytest.raises(NotADatabaseError, match="format 1 .*reads format 2 only"):
        rtindex.open(str(tmp_path / "db"), create=False)
    assert os.listdir(tmp_path / "db") == ["collections"]


def test_a_folder_with_collections_and_other_things_is_not_a_legacy_database(tmp_path):
    (tmp_path / "collections").mkdir()
    (tmp_path / "setup.py").write_text("")
    with pytest.raises(NotADatabaseError):
        rtindex.open(str(tmp_path), create=False)
    assert sorted(os.listdir(tmp_path)) == ["collections", "setup.py"]


def test_bad_options_leave_no_directory_behind(tmp_path):
    with pytest.raises(ValueError, match="seal_rows"):
        rtindex.open(str(tmp_path / "db"), seal_rows=0)
    assert not os.path.exists(tmp_path / "db")


# -- shards listed in the manifest must be there ---------------------------------------------


def test_a_missing_shard_is_corruption_not_a_fresh_empty_shard(tmp_path):
    make_db(tmp_path / "db")
    shard = tmp_path / "db" / "collections" / "ev" / "shard-002"
    shutil.rmtree(shard)
    for _ in range(2):  # the failed open released the writer lock: the same error again
        with pytest.raises(CorruptionError, match=f"shard {shard} is missing"):
            rtindex.open(str(tmp_path / "db"))
    assert not shard.exists()


def test_a_shard_without_rocksdb_current_is_corruption(tmp_path):
    make_db(tmp_path / "db")
    shard = tmp_path / "db" / "collections" / "ev" / "shard-001"
    shutil.rmtree(shard)
    shard.mkdir()  # emptied, as by a careless cleanup
    with pytest.raises(CorruptionError, match=f"shard {shard} has no RocksDB CURRENT file"):
        rtindex.open(str(tmp_path / "db"))
    assert os.listdir(shard) == []


def test_intact_shards_reopen_with_every_document(tmp_path):
    make_db(tmp_path / "db")
    with rtindex.open(str(tmp_path / "db")) as db:
        assert len(db["ev"]) == 100 and db["ev"].n_shards == 4


def test_create_collection_replaces_the_remains_of_a_crashed_drop(tmp_path):
    """drop_collection removes the manifest first: a directory without one is no collection,
    and a new collection of that name must not inherit its shards."""
    make_db(tmp_path / "db", n=100, shards=2)
    os.remove(tmp_path / "db" / "collections" / "ev" / "collection.json")
    with rtindex.open(str(tmp_path / "db")) as db:
        assert "ev" not in db
        assert len(db.create_collection("ev", shards=2)) == 0
    with rtindex.open(str(tmp_path / "db")) as db:
        assert len(db["ev"]) == 0


# -- manifests --------------------------------------------------------------------------------


@pytest.mark.parametrize("content, problem", [
    (b'{"shards": 4, "form', "is not valid JSON"),
    (b"[4]", "holds list, not a JSON object"),
    (b'{"format": 2}', "has shards=None"),
    (b'{"shards": "4", "format": 2}', "has shards='4'"),
    (b'{"shards": 0, "format": 2}', "has shards=0"),
    (b'{"shards": true, "format": 2}', "has shards=True"),
    (b'{"shards": 4, "format": 7}', "has format 7"),
])
def test_a_bad_manifest_is_corruption_naming_the_file(tmp_path, content, problem):
    make_db(tmp_path / "db", n=10)
    manifest = tmp_path / "db" / "collections" / "ev" / "collection.json"
    manifest.write_bytes(content)
    with pytest.raises(CorruptionError) as e:
        rtindex.open(str(tmp_path / "db"))
    assert str(manifest) in str(e.value) and problem in str(e.value)


def test_the_manifest_is_written_with_the_shard_count(tmp_path):
    with rtindex.open(str(tmp_path / "db")) as db:
        db.create_collection("c", shards=3)
    manifest = tmp_path / "db" / "collections" / "c" / "collection.json"
    written = orjson.loads(manifest.read_bytes())
    assert written == {"shards": 3, "format": 2, "created": written["created"]}
    assert isinstance(written["created"], int) and written["created"] > 0  # the creation stamp (ns)
    assert not os.path.exists(str(manifest) + ".tmp")


# -- one writer per database, across processes ------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, rtindex
    db = rtindex.open(sys.argv[1])
    print("open", flush=True)
    sys.stdin.readline()
    db.close()
""")

TRY_OPEN = textwrap.dedent("""
    import sys, rtindex
    try:
        rtindex.open(sys.argv[1]).close()
    except rtindex.LockedError as e:
        print("LockedError:", e.pid, e)
    else:
        print("opened")
""")


def run_python(code: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_second_writer_process_is_refused_even_for_an_empty_database(tmp_path):
    path = str(tmp_path / "db")
    with rtindex.open(path):  # no collections: no RocksDB lock anywhere
        out = run_python(TRY_OPEN, path)
        assert out.startswith(f"LockedError: {os.getpid()} "), out
        assert f"database {path} is open for writing in another process" in out
        assert f"pid {os.getpid()}" in out
    assert run_python(TRY_OPEN, path) == "opened\n"  # released by close()


def test_the_writer_lock_dies_with_its_process(tmp_path):
    """A kill -9'd writer leaves no stale lock: the kernel drops a flock with its process."""
    path = str(tmp_path / "db")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "open\n"
        with pytest.raises(StorageError, match=f"another process or handle \\(pid {holder.pid}\\)"):
            rtindex.open(path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
        holder.stdout.close()
        holder.stdin.close()
    with rtindex.open(path) as db:
        assert db.collection_names() == []
        assert (tmp_path / "db" / "writer.lock").read_text() == f"{os.getpid()}\n"


def test_the_writer_lock_is_released_when_close_fails(tmp_path, monkeypatch):
    path = str(tmp_path / "db")
    db = rtindex.open(path)
    db.create_collection("c").ingest([{"_id": 1}])
    stop = db._runtime.merger.stop

    def broken():
        raise StorageError("merger would not stop (test)")

    monkeypatch.setattr(db._runtime.merger, "stop", broken)
    with pytest.raises(StorageError, match="would not stop"):
        db.close()
    stop()
    assert run_python(TRY_OPEN, path) == "opened\n"


# -- IngestStats counts documents, not input items --------------------------------------------


def test_an_id_given_twice_in_one_ingest_counts_once(db):
    c = db.create_collection("c", shards=2)
    stats = c.ingest([{"_id": 1, "a": 1}, {"_id": 1, "a": 2}])
    assert (stats.n, stats.ids) == (1, [1])
    assert len(c) == 1 and c.get(1)["a"] == 2
    assert stats.bytes == len(orjson.dumps(c.get(1)))


@pytest.mark.parametrize("batch_size", [1, 2, 1000])
def test_ids_are_listed_once_in_order_of_first_appearance(db, batch_size):
    c = db.create_collection("c", shards=3)
    docs = [{"_id": "b", "v": 1}, {"_id": "a", "v": 2}, {"_id": 1}, {"_id": "b", "v": "longer value"},
            {"_id": "1"}, {"_id": "a", "v": 3}]
    stats = c.ingest(docs, batch_size=batch_size)  # batch_size=1: the repeats are in other chunks
    assert stats.ids == ["b", "a", 1, "1"] and stats.n == 4 == len(c)
    assert stats.bytes == sum(len(orjson.dumps(c.get(i))) for i in stats.ids)
    assert c.get("b")["v"] == "longer value" and c.get("a")["v"] == 3


def test_a_rejected_later_version_leaves_the_earlier_one_counted(db):
    c = db.create_collection("c")
    stats = c.ingest([{"_id": 7, "v": 1}, {"_id": 7, "v": float("nan")}], errors="report")
    assert [e.index for e in stats.errors] == [1]
    assert (stats.n, stats.ids) == (1, [7]) and c.get(7)["v"] == 1
    assert stats.bytes == len(orjson.dumps(c.get(7)))


def test_a_query_past_timeout_ms_stops(tmp_path):
    with rtindex.open(tmp_path / "db") as db:
        c = db.create_collection("c", shards=1)
        c.ingest([{"_id": i, "v": i} for i in range(200)])
        t0 = time.monotonic()
        with pytest.raises(rtindex.QueryTimeoutError, match="timeout_ms=300"):
            db.sql("SELECT COUNT(*) AS n FROM c a1, c a2, c a3, c a4, c a5, c a6", timeout_ms=300)
        assert time.monotonic() - t0 < 2.0
        c0 = time.process_time()
        time.sleep(0.3)
        assert time.process_time() - c0 < 0.1  # nothing of it runs on
        assert db.sql("SELECT COUNT(*) AS n FROM c", timeout_ms=1000).rows() == [{"n": 200}]
        for bad in (0, -5, "100", True):
            with pytest.raises(ValueError, match="timeout_ms"):
                db.sql("SELECT 1 AS x FROM c", timeout_ms=bad)


def test_a_reader_removes_what_killed_readers_left(tmp_path, monkeypatch):
    """A reader's directory for its secondaries is named with its process id: the next reader
    removes those of processes that are gone, and keeps a live one's."""
    import tempfile

    from rtindex import database

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    os.makedirs(tempfile.tempdir)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    left = tmp_path / "tmp" / f"{database.READER_DIR}{gone.pid}-x1"
    alive = tmp_path / "tmp" / f"{database.READER_DIR}{os.getpid()}-x2"
    other = tmp_path / "tmp" / "unrelated-dir"
    for d in (left, alive, other):
        (d / "shard").mkdir(parents=True)
    rtindex.open(tmp_path / "db").close()
    with rtindex.open(tmp_path / "db", role="reader"):
        mine = [e for e in os.listdir(tempfile.tempdir) if e.startswith(database.READER_DIR)]
        assert not left.exists() and alive.exists() and other.exists()
        assert len(mine) == 2  # the live one's, and this reader's
    assert sorted(os.listdir(tempfile.tempdir)) == sorted([alive.name, other.name])
