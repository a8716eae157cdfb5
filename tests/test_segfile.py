"""Segment files: what is written reads back, damage is detected, a failed write leaves nothing."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from pyroaring import FrozenBitMap

from rtindex import columns, keys, segfile
from rtindex._impl import SegmentBuilder, block_get
from rtindex.errors import CorruptionError, StorageError


def _segment(directory, segid=7, n=50):
    b = SegmentBuilder(64)
    for i in range(n):
        b.add({"_id": i, "k": f"v{i % 5}", "x": i * 1.5})
    cols = [(ck, columns.encode(columns.dense(ck[-1], offs, vals, n))) for ck, offs, vals in b.columns()]
    return b, segfile.write_segment(str(directory), segid, 1000, n, FrozenBitMap(range(n)),
                                    b.write_blocks(256), cols)


def test_round_trip(tmp_path):
    b, f = _segment(tmp_path)
    assert (f.base, f.n, list(f.live)) == (1000, 50, list(range(50)))
    assert segfile.segment_ids(str(tmp_path)) == [7]
    t = keys.term(("k",), keys.STRING, "v3")
    i = max(j for j, first in enumerate(f.block_keys) if first <= t)
    assert list(block_get(f.block(i), t)) == list(b.postings(t, 50))
    assert len(list(f.blocks())) == len(f.block_keys) > 1
    x = f.column(keys.column_key(("x",), keys.FLOAT))
    assert x.to_pylist() == [i * 1.5 for i in range(50)]
    assert f.column(keys.column_key(("nope",), keys.INT)) is None
    again = segfile.open_segment(str(tmp_path), 7)
    assert again.block_keys == f.block_keys and again.column_keys == f.column_keys


def test_columns_are_zero_copy_slices_of_the_map(tmp_path):
    _, f = _segment(tmp_path)
    raw = f.column_bytes(keys.column_key(("x",), keys.FLOAT))
    assert isinstance(raw, pa.Buffer) and raw.size > 0


@pytest.mark.parametrize("damage", ["truncate", "footer", "header"])
def test_damage_is_corruption_naming_the_file(tmp_path, damage):
    _segment(tmp_path)
    path = os.path.join(tmp_path, segfile.file_name(7))
    with open(path, "rb") as fh:
        data = bytearray(fh.read())
    if damage == "truncate":
        data = data[: len(data) - 10]
    elif damage == "footer":
        data[-40] ^= 0xFF  # inside the footer: its checksum no longer matches
    else:
        data[0] ^= 0xFF
    with open(path, "wb") as fh:
        fh.write(bytes(data))
    with pytest.raises(CorruptionError, match=segfile.file_name(7)):
        segfile.open_segment(str(tmp_path), 7)


def test_a_failed_write_leaves_no_file(tmp_path):
    def blocks():
        yield b"\x00first", b"x" * 10
        raise OSError(28, "No space left on device")

    with pytest.raises(StorageError, match="No space left"):
        segfile.write_segment(str(tmp_path), 3, 0, 1, FrozenBitMap([0]), blocks(), [])
    assert os.listdir(tmp_path) == []


def test_leftovers_and_removal(tmp_path):
    _segment(tmp_path)
    with open(os.path.join(tmp_path, segfile.file_name(9) + ".tmp"), "wb") as fh:
        fh.write(b"partial")
    segfile.remove_leftovers(str(tmp_path))
    assert os.listdir(tmp_path) == [segfile.file_name(7)]
    segfile.remove_segment(str(tmp_path), 7)
    segfile.remove_segment(str(tmp_path), 7)  # twice is fine (clean-up may run again)
    assert segfile.segment_ids(str(tmp_path)) == []
    assert segfile.segment_ids(str(tmp_path / "missing")) == []


def test_a_mapped_file_outlives_its_unlink(tmp_path):
    """What read replicas rely on: a reader keeps reading a segment the writer removed."""
    _, f = _segment(tmp_path)
    segfile.remove_segment(str(tmp_path), 7)
    assert f.column(keys.column_key(("x",), keys.FLOAT)).to_pylist()[:3] == [0.0, 1.5, 3.0]
