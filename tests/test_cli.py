"""`rtindex demo` runs end to end in a real subprocess, twice on the same directory."""

from __future__ import annotations

import subprocess
import sys


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
    import rtindex

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
    import rtindex

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
