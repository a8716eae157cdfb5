"""rtindex/jsonfile.py: a JSON file is replaced whole, and one that is not a JSON object is
refused naming the file."""

from __future__ import annotations

import os

import pytest

from rtindex.errors import CorruptionError, StorageError
from rtindex.jsonfile import read_json, write_json_atomic


def test_written_whole_and_read_back(tmp_path):
    path = str(tmp_path / "f.json")
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2, "b": [1, 2]})
    assert read_json(path, "test file") == {"a": 2, "b": [1, 2]}
    assert os.listdir(tmp_path) == ["f.json"]  # no temporary file left


@pytest.mark.parametrize("text, words", [(b"{", "is not valid JSON"), (b"[1]", "holds list, not a JSON object")])
def test_a_damaged_file_is_refused_naming_it(tmp_path, text, words):
    path = tmp_path / "f.json"
    path.write_bytes(text)
    with pytest.raises(CorruptionError, match=words) as e:
        read_json(str(path), "test file")
    assert str(path) in str(e.value)


def test_a_missing_directory_is_a_storage_error(tmp_path):
    with pytest.raises(StorageError, match="cannot write"):
        write_json_atomic(str(tmp_path / "missing" / "f.json"), {})
    with pytest.raises(StorageError, match="cannot read test file"):
        read_json(str(tmp_path / "missing.json"), "test file")
