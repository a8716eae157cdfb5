"""A sealed Segment and the MemSegment it was sealed from answer every read the same way.

The shard's reads go through the segment classes without asking which kind they hold, so
the two kinds must agree: postings, term ranges, column tags and keys, scans, takes, the
live count. Each example indexes generated documents into a mutable segment, seals it the
way the sealer does, and compares the two (with a row limit that shows every row, and for
the mutable segment a smaller one too).
"""

from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap, FrozenBitMap

from rtindex import columns, keys, segfile
from rtindex._impl import SegmentBuilder
from rtindex.chunkcache import ChunkCache
from rtindex.segments import MemSegment, Segment, View
from tests.jsontext import REPEATING, documents


def _seal(tmp_path, b) -> Segment:
    n = b.n_rows
    file = segfile.write_segment(str(tmp_path), 1, b.base, n, FrozenBitMap(range(n)), b.write_blocks(4096),
                                 ((ck, columns.encode(v)) for ck, v in b.dense_columns()), (b.row(i) for i in range(n)))
    return Segment(1, file)


def _indexable(docs) -> list[bytes]:
    """The documents a builder accepts (generated ones may hold integers past 64 bits)."""
    raws = [orjson.dumps(d) for d in docs]
    _, errors = SegmentBuilder(None, 0, 64).add_json(raws)
    bad = {i for i, _ in errors}
    return [r for i, r in enumerate(raws) if i not in bad]


def _pair(tmp_path, raws):
    b = SegmentBuilder(None, 100, 64)
    _, errors = b.add_json(raws)
    assert not errors
    return MemSegment(b), _seal(tmp_path, b)


def _terms(mem: MemSegment) -> list[bytes]:
    return [t for ck in mem.builder.column_keys() for t in mem.builder.column_terms(ck)]


def _values(a) -> list:
    """An array's values as Python values (timestamps as their integers: any int64 is one)."""
    return (a.view(pa.int64()) if pa.types.is_timestamp(a.type) else a).to_pylist()


DOCS = st.lists(st.one_of(REPEATING, documents()), min_size=1, max_size=30)


@settings(max_examples=40, deadline=None)
@given(docs=DOCS, data=st.data())
def test_sealed_and_mutable_agree(tmp_path_factory, docs, data):
    raws = _indexable(docs)
    assume(raws)
    mem, seg = _pair(tmp_path_factory.mktemp("seg"), raws)
    n = len(raws)
    cache = ChunkCache(1 << 20)
    assert mem.live_count(n) == seg.live_count(n) == n
    assert mem.all_offsets(n) == seg.all_offsets(n) == BitMap(range(n))
    assert set(mem.keys_of_columns(n)) == set(seg.keys_of_columns(n))
    for t in _terms(mem):
        assert mem.postings(t, n) == seg.postings(t, n), t
    for ck in mem.keys_of_columns(n):
        hi = keys.prefix_upper_bound(ck)
        assert mem.term_range(ck, hi, n, None) == seg.term_range(ck, hi, n, None)
        assert mem.has_terms(ck, n) and seg.has_terms(ck, n)
        path_key = ck[:-1]
        assert set(mem.column_tags(path_key, n)) == set(seg.column_tags(path_key, n))
        assert mem.has_columns([ck], n) == seg.has_columns([ck], n)
    assert not mem.postings(keys.term(("no such field",), keys.INT, 1), n)
    assert not seg.postings(keys.term(("no such field",), keys.INT, 1), n)

    colkeys = sorted(ck for ck in mem.keys_of_columns(n) if keys.tag_of(ck) in columns.ARROW_TYPES)
    m_off, m_cols = mem.scan(colkeys, n, cache)
    s_off, s_cols = seg.scan(colkeys, n, cache)
    assert m_off.to_pylist() == s_off.to_pylist() == list(range(n))
    for ck, a, b in zip(colkeys, m_cols, s_cols):
        assert _values(a) == _values(b), ck

    rows = BitMap(data.draw(st.lists(st.integers(0, n + 3), max_size=n + 4)))
    m_held, s_held = mem.held(rows, n), seg.held(rows, n)
    assert m_held == s_held == BitMap(r for r in rows if r < n)
    wanted = np.frombuffer(m_held.to_array(), dtype=np.uint32)
    m_taken = mem.take(colkeys, wanted, n, cache)
    s_taken = seg.take(colkeys, wanted, n, cache)
    for ck, a, b in zip(colkeys, m_taken, s_taken):
        assert _values(columns.gather(keys.tag_of(ck), [a])) == _values(columns.gather(keys.tag_of(ck), [b]))

    # rows: each kind holds them (a sealed one in its file), the same bytes in any order
    assert [mem.row(i) for i in range(n)] == raws
    order = data.draw(st.permutations(range(n)))
    assert [seg.row(i) for i in order] == [raws[i] for i in order]
    assert mem.row(n) is None and seg.row(n) is None


@settings(max_examples=20, deadline=None)
@given(docs=st.lists(REPEATING, min_size=2, max_size=20), data=st.data())
def test_mutable_limit_hides_later_rows(docs, data):
    """A mutable segment's reads show only the rows below the limit a view holds."""
    b = SegmentBuilder(None, 0, 64)
    b.add_json([orjson.dumps(d) for d in docs])
    mem = MemSegment(b)
    limit = data.draw(st.integers(0, len(docs)))
    for t in _terms(mem):
        assert max(mem.postings(t, limit), default=-1) < limit
        full = mem.postings(t, len(docs))
        assert mem.postings(t, limit) == BitMap(o for o in full if o < limit)
    assert mem.all_offsets(limit) == BitMap(range(limit))
    assert mem.held(BitMap(range(len(docs))), limit) == BitMap(range(limit))
    view = View(mem, limit, FrozenBitMap([0]) if limit else FrozenBitMap())
    assert view.n_live() == max(limit - 1, 0)
    assert not view.sealed


def test_sealed_view_counts_live_rows(tmp_path):
    mem, seg = _pair(tmp_path, [orjson.dumps({"a": i}) for i in range(5)])
    assert View(seg, 5, FrozenBitMap([1, 3])).n_live() == 3
    assert View(seg, 5, FrozenBitMap()).sealed and seg.holds(4) and not seg.holds(5)
    assert mem.holds(4)
