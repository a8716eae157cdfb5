"""Segment files: what is written reads back, damage is detected, a failed write leaves nothing."""

from __future__ import annotations

import os
import struct
import zlib

import pyarrow as pa
import orjson
import pytest
from pyroaring import FrozenBitMap

from rtindex import columns, keys, segfile
from rtindex._impl import SegmentBuilder, block_get
from rtindex.errors import CorruptionError, StorageError


def _segment(directory, segid=7, n=50):
    b = SegmentBuilder()
    b.add_json([orjson.dumps({"_id": i, "k": f"v{i % 5}", "x": i * 1.5}) for i in range(n)])
    cols = [(ck, columns.encode(values)) for ck, values in b.dense_columns()]
    return b, segfile.write_segment(str(directory), segid, 1000, n, FrozenBitMap(range(n)),
                                    b.write_blocks(256), cols, (b.row(i) for i in range(n)))


def test_round_trip(tmp_path):
    b, f = _segment(tmp_path)
    assert (f.base, f.n, list(f.live)) == (1000, 50, list(range(50)))
    assert segfile.segment_ids(str(tmp_path)) == [7]
    t = keys.term(("k",), keys.STRING, "v3")
    i = max(j for j, first in enumerate(f.block_keys) if first <= t)
    assert list(block_get(f.block(i), t)) == list(b.postings(t, 50))
    assert list(f.read_blocks()) == [f.block(i).to_pybytes() for i in range(len(f.block_keys))]
    assert len(f.block_keys) > 1
    x = f.column(keys.column_key(("x",), keys.FLOAT))
    assert x.to_pylist() == [i * 1.5 for i in range(50)]
    assert f.read_column(keys.column_key(("x",), keys.FLOAT)).equals(x)
    assert f.read_column(keys.column_key(("nope",), keys.INT)) is None
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
    b = SegmentBuilder()
    b.add_json([b'{"_id": 1}'])

    def blocks():
        yield next(iter(b.write_blocks(256)))
        raise OSError(28, "No space left on device")

    with pytest.raises(StorageError, match="No space left"):
        segfile.write_segment(str(tmp_path), 3, 0, 1, FrozenBitMap([0]), blocks(), [], [b"{}"])
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


# ---- the term filter -------------------------------------------------------------------

_TRAILER = struct.Struct("<QII8s")


def _rewrite_footer(path, edit):
    """Replace the footer of the file at ``path`` by ``edit(footer)``, with a valid trailer
    (so only what the edit did is wrong)."""
    with open(path, "rb") as fh:
        data = fh.read()
    foot_off, foot_len, _, magic = _TRAILER.unpack(data[-_TRAILER.size:])
    footer = edit(bytearray(data[foot_off:foot_off + foot_len]))
    with open(path, "wb") as fh:
        fh.write(data[:foot_off] + footer + _TRAILER.pack(foot_off, len(footer), zlib.crc32(footer), magic))


def _filter_section(footer):
    """(start of the section, start of the filter) in a footer: the section is the footer's
    tail ``u32 len(filter), u32 pad, pad zero bytes, filter``."""
    start = footer.rindex(b"RTF\x01")
    for pad in range(64):
        if struct.unpack_from("<II", footer, start - pad - 8) == (len(footer) - start, pad):
            return start - pad - 8, start
    raise AssertionError("no term filter section")


def _terms(n):
    present = [keys.term(("_id",), keys.INT, i) for i in range(n)]
    present += [keys.term(("k",), keys.STRING, f"v{i}") for i in range(5)]
    absent = [keys.term(("_id",), keys.INT, i) for i in range(n, n + 4000)]
    absent += [keys.term(("k",), keys.STRING, f"w{i}") for i in range(4000)]
    return present, absent


def test_point_lookups_ask_the_term_filter(tmp_path):
    b, f = _segment(tmp_path, n=500)
    index = f.term_index()
    present, absent = _terms(500)
    for t in present:  # no false negatives, and the postings are those written
        assert index.may_contain(t)
        assert list(index.get(t)) == list(b.postings(t, 500)) != []
    passed = sum(index.may_contain(t) for t in absent)
    assert passed <= 0.02 * len(absent)
    assert all(index.get(t) is None for t in absent)
    with open(f.path, "rb") as fh:
        data = fh.read()
    foot_off = _TRAILER.unpack(data[-_TRAILER.size:])[0]
    _, start = _filter_section(data[foot_off:-_TRAILER.size])
    assert (foot_off + start + 12) % 64 == 0  # bit blocks aligned: one probe, one cache line


def test_files_without_a_term_filter_still_work(tmp_path):
    """A file in the layout of before the filter (the footer ends after ``live``)."""
    b, f = _segment(tmp_path, n=500)
    _rewrite_footer(f.path, lambda footer: footer[:_filter_section(footer)[0]])
    old = segfile.open_segment(str(tmp_path), 7)
    assert (old.base, old.n, old.block_keys, old.column_keys) == (f.base, f.n, f.block_keys, f.column_keys)
    index = old.term_index()
    present, absent = _terms(500)
    assert all(index.may_contain(t) for t in absent)  # no filter: every segment may hold it
    for t in present:
        assert list(index.get(t)) == list(b.postings(t, 500)) != []
    assert all(index.get(t) is None for t in absent)


def _set_k(footer, k):
    struct.pack_into("<I", footer, _filter_section(footer)[1] + 8, k)
    return footer


def _bad_pad(footer):
    section, _ = _filter_section(footer)
    struct.pack_into("<I", footer, section + 4, 64)
    return footer


@pytest.mark.parametrize("edit", [
    lambda footer: footer[:-1],  # truncated filter
    lambda footer: footer + b"\x00",  # bytes after the filter
    lambda footer: _set_k(footer, 0),
    lambda footer: _set_k(footer, 99),
    lambda footer: footer[:_filter_section(footer)[0] + 3],  # a cut section header
    _bad_pad,
], ids=["truncated", "trailing", "k0", "k99", "cut-header", "pad"])
def test_a_damaged_term_filter_is_corruption(tmp_path, edit):
    _, f = _segment(tmp_path)
    _rewrite_footer(f.path, edit)
    with pytest.raises(CorruptionError, match=segfile.file_name(7)):
        segfile.open_segment(str(tmp_path), 7)


def test_a_flipped_filter_bit_fails_the_checksum(tmp_path):
    _, f = _segment(tmp_path)
    with open(f.path, "r+b") as fh:
        data = fh.read()
        fh.seek(data.rindex(b"RTF\x01") + 20)
        fh.write(bytes([data[data.rindex(b"RTF\x01") + 20] ^ 1]))
    with pytest.raises(CorruptionError, match="checksum"):
        segfile.open_segment(str(tmp_path), 7)


# ---- rows ------------------------------------------------------------------------------

def _rows(n):
    """Documents of varied sizes (some larger than a row block) as JSON text."""
    return [orjson.dumps({"_id": i, "pad": "x" * ((i * 7919) % 3000 if i % 50 else segfile.ROW_BLOCK_BYTES + i)})
            for i in range(n)]


def test_rows_round_trip_across_blocks(tmp_path):
    raws = _rows(400)
    b = SegmentBuilder()
    b.add_json(raws)
    f = segfile.write_segment(str(tmp_path), 5, 0, len(raws), FrozenBitMap(range(len(raws))),
                              b.write_blocks(4096), [], iter(raws))
    assert f.has_rows
    assert [f.row(r) for r in range(len(raws))] == raws
    assert [f.row(r) for r in reversed(range(len(raws)))] == raws[::-1]
    assert list(f.read_rows()) == raws
    reopened = segfile.open_segment(str(tmp_path), 5)
    assert [reopened.row(r) for r in (399, 0, 200, 1)] == [raws[r] for r in (399, 0, 200, 1)]


def test_rows_of_a_merge_follow_its_live_offsets(tmp_path):
    raws = _rows(30)
    live = FrozenBitMap(range(0, 60, 2))  # a merge output: every other offset kept
    b = SegmentBuilder()
    b.add_json(raws)
    f = segfile.write_segment(str(tmp_path), 6, 0, 60, live, b.write_blocks(4096), [], iter(raws))
    assert [f.row(r) for r in range(30)] == raws


def test_a_count_of_rows_other_than_live_is_refused_and_leaves_no_file(tmp_path):
    with pytest.raises(ValueError, match="3 live rows was given 2"):
        segfile.write_segment(str(tmp_path), 4, 0, 3, FrozenBitMap(range(3)), iter([]), [], [b"{}", b"{}"])
    assert os.listdir(tmp_path) == []


def _without_rows(path):
    """Rewrite a file in the layout of before rows: magic 1, no row fields in the footer."""
    with open(path, "rb") as fh:
        data = bytearray(fh.read())
    data[:8] = segfile.MAGIC_NO_ROWS
    data[-8:] = segfile.MAGIC_NO_ROWS
    with open(path, "wb") as fh:
        fh.write(data)

    def drop_row_fields(footer):
        section, _ = _filter_section(footer)
        return footer[:section - segfile._ROWS_POS.size] + footer[section:]
    _rewrite_footer(path, drop_row_fields)


def test_files_without_rows_still_open_and_say_so(tmp_path):
    b, f = _segment(tmp_path, n=200)
    _without_rows(f.path)
    old = segfile.open_segment(str(tmp_path), 7)
    assert not old.has_rows
    assert (old.base, old.n, old.block_keys, old.column_keys) == (f.base, f.n, f.block_keys, f.column_keys)
    present, _ = _terms(200)
    assert all(list(old.term_index().get(t)) == list(b.postings(t, 200)) for t in present)


def test_a_damaged_row_block_is_corruption_naming_the_file(tmp_path):
    raws = _rows(50)
    b = SegmentBuilder()
    b.add_json(raws)
    f = segfile.write_segment(str(tmp_path), 8, 0, 50, FrozenBitMap(range(50)), b.write_blocks(4096), [], iter(raws))
    table_off, _ = f._row_blocks
    off, packed, length = segfile._ROW_BLOCK.unpack_from(f._buf, table_off)
    with open(f.path, "r+b") as fh:  # a compressed block cut short: it cannot decode to its length
        fh.seek(table_off)
        fh.write(segfile._ROW_BLOCK.pack(off, packed // 2, length))
    damaged = segfile.open_segment(str(tmp_path), 8)
    with pytest.raises(CorruptionError, match=segfile.file_name(8)):
        damaged.row(0)
