"""Term-dictionary blocks: the Cython module against the pure-Python oracle, and both against
brute force (dicts of sets). Corrupt input must raise CorruptionError, never crash."""

from __future__ import annotations

import bisect
import itertools
import os
import random
import struct
from array import array

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap, FrozenBitMap

import rtindex._py.blocks as P
from rtindex.errors import CorruptionError

if os.environ.get("RTINDEX_PURE_PYTHON") == "1":
    C = None
    IMPLS = [P]
else:
    import rtindex._ext._blocks as C

    IMPLS = [C, P]

needs_cython = pytest.mark.skipif(C is None, reason="RTINDEX_PURE_PYTHON=1: no compiled module to compare")
impls = pytest.mark.parametrize("M", IMPLS, ids=lambda m: "cython" if m is C else "python")
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MAXU = 2**32 - 1

# ---- strategies -----------------------------------------------------------------------

EDGE_TERMS = [b"", b"\x00", b"\xff", b"\x00\x00", b"\xff\xff", b"a\x00", b"a"]
# terms as a segment has them: a column key, often the start of a value, then the rest
PREFIXES = [b"\x01path\x00\x05", b"\x01path\x00\x05user", b"\x01path\x00\x06", b"\x01"]
terms_st = (
    st.binary(max_size=8)
    | st.sampled_from(EDGE_TERMS)
    | st.tuples(st.sampled_from(PREFIXES), st.binary(max_size=4)).map(b"".join)
)


@st.composite
def dense_st(draw):
    n = draw(st.integers(60, 5000))
    step = draw(st.sampled_from([1, 1, 2, 3, 17, 1000]))
    start = draw(st.integers(0, MAXU - n * step))
    return list(range(start, start + n * step, step))


@st.composite
def sparse_st(draw):
    n = draw(st.integers(60, 200))
    lo = draw(st.sampled_from([0, 2**20, MAXU - 2**24]))
    return sorted(random.Random(draw(st.integers())).sample(range(lo, lo + 2**24), n))


offset_st = st.integers(0, 1000) | st.integers(0, MAXU) | st.integers(MAXU - 100, MAXU)
postings_st = st.one_of(
    st.builds(lambda v: [v], offset_st),
    st.lists(offset_st, min_size=1, max_size=70, unique=True).map(sorted),
    dense_st(),
    sparse_st(),
)


@st.composite
def entries_st(draw, max_size=40):
    pairs = draw(st.lists(st.tuples(terms_st, postings_st), max_size=max_size, unique_by=lambda p: p[0]))
    return sorted(pairs)


targets_st = st.sampled_from([1, 40, 200, 1000, 16384])


def build(M, entries, target=16384, as_bitmap=()):
    w = M.BlockWriter(target)
    out = []
    for i, (t, vals) in enumerate(entries):
        p = BitMap(vals) if i in as_bitmap else array("I", vals)
        r = w.add(t, p)
        if r is not None:
            out.append(r)
    r = w.finish()
    if r is not None:
        out.append(r)
    assert w.n_terms == len(entries)
    return out


def old_posting(vals):
    """(kind, posting) as formats 1 and 2 stored a set: raw uint32 offsets, or roaring when
    ``4 + serialized < 4k``."""
    if len(vals) >= 64:
        ser = BitMap(vals).serialize()
        if 4 + len(ser) < 4 * len(vals):
            return 1, struct.pack("<I", len(vals)) + ser
    return 0, struct.pack(f"<{len(vals)}I", *vals)


def old_blocks(entries, target=16384, fmt=1):
    """Format 1 or 2 blocks of sorted ``(term, offsets)`` pairs, as writers made them before
    format 3 (layouts in rtindex/_py/blocks.py): segment files written then must still read."""
    out, pending = [], []

    def flush():
        table_end = 12 + 4 * len(pending)
        offs = [table_end]
        for _, entry in pending:
            offs.append(offs[-1] + len(entry))
        table = struct.pack(f"<{len(pending) + 2}I", len(pending), *offs)
        out.append((pending[0][0], b"RTB" + bytes([fmt]) + table + b"".join(e for _, e in pending)))
        pending.clear()

    for t, vals in entries:
        kind, post = old_posting(vals)
        if fmt == 1:
            pending.append((t, struct.pack("<I", len(t) | kind << 30) + t + post))
        else:
            shared = P._shared_len(pending[0][0], t) if pending else 0
            head = P._varint(shared) + P._varint((len(t) - shared) << 1 | kind)
            pending.append((t, head + t[shared:] + post))
        if 12 + 4 * len(pending) + sum(len(e) for _, e in pending) >= target:
            flush()
    if pending:
        flush()
    return out


def offsets(block):
    """The offsets table of a format 3 block."""
    n, width = struct.unpack_from("<IB", block, 4)
    return struct.unpack_from(f"<{n + 1}{'H' if width == 2 else 'I'}", block, 9)


def find_block(blocks, term):
    i = bisect.bisect_right([f for f, _ in blocks], term) - 1
    return blocks[max(i, 0)][1]


def outcome(fn):
    """The result of fn(), "corrupt" for CorruptionError, "overflow" for a shift that does not
    fit (merge only); nothing else may escape."""
    try:
        return ("ok", fn())
    except CorruptionError:
        return ("corrupt",)
    except ValueError as e:
        assert "does not fit in uint32" in str(e)
        return ("overflow",)


# ---- writing --------------------------------------------------------------------------


@needs_cython
@SETTINGS
@given(entries=entries_st(), target=targets_st, data=st.data())
def test_writer_matches_reference_bytes(entries, target, data):
    as_bitmap = data.draw(st.sets(st.integers(0, max(len(entries) - 1, 0))))
    blocks_c = build(C, entries, target, as_bitmap)
    blocks_p = build(P, entries, target)
    assert blocks_c == blocks_p
    for i, (first, block) in enumerate(blocks_c):
        assert first == C.block_first_last(block)[0]
        if i < len(blocks_c) - 1:
            assert len(block) >= target
        # a block is emitted as soon as it reaches the target: without its last entry it was smaller
        off = offsets(block)
        n = len(off) - 1
        assert block[8] == (2 if len(block) <= 0xFFFF else 4)
        assert n == 1 or P._block_size(n - 1, off[n - 1] - off[0]) < target


@impls
@SETTINGS
@given(entries=entries_st(), target=targets_st, probes=st.lists(terms_st, max_size=10))
def test_round_trip(M, entries, target, probes):
    blocks = build(M, entries, target, as_bitmap=range(0, len(entries), 2))
    assert sum(len(M.block_items(b)) for _, b in blocks) == len(entries)
    got = [item for _, b in blocks for item in M.block_items(b)]
    assert got == [(t, BitMap(v)) for t, v in entries]
    for t, vals in entries:
        block = find_block(blocks, t)
        assert M.block_get(block, t) == BitMap(vals)
        assert M.block_cardinality(block, t) == len(vals)
    present = {t for t, _ in entries}
    for t in probes:
        if t in present or not blocks:
            continue
        block = find_block(blocks, t)
        assert M.block_get(block, t) is None
        assert M.block_cardinality(block, t) == 0
    for first, block in blocks:
        terms = [t for t, _ in M.block_items(block)]
        assert M.block_first_last(block) == (terms[0], terms[-1]) and first == terms[0]


def term_filter(M, blocks):
    b = M.TermFilterBuilder()
    for _, block in blocks:
        b.add_block(block)
    return b.finish()


@impls
@SETTINGS
@given(entries=entries_st(), target=targets_st, probes=st.lists(terms_st, max_size=10),
       pad=st.integers(0, 5), filtered=st.booleans())
def test_term_index_finds_what_brute_force_finds(M, entries, target, probes, pad, filtered):
    # the blocks laid out back to back behind ``pad`` bytes, as in a segment file
    blocks = build(M, entries, target)
    data, positions = bytearray(b"x" * pad), []
    for _, block in blocks:
        positions.append((len(data), len(block)))
        data += block
    flt = term_filter(M, blocks) if filtered else None
    index = M.TermIndex(bytes(data), [f for f, _ in blocks], positions, flt)
    want = {t: BitMap(v) for t, v in entries}
    empty = M.TermIndex(b"", [], [], term_filter(M, []) if filtered else None)
    assert all(index.may_contain(t) for t in want)  # a filter never rules out a present term
    for t in [t for t, _ in entries] + probes:
        assert index.get(t) == want.get(t)
        assert M.terms_get([index, empty, index], t) == ([(0, want[t]), (2, want[t])] if t in want else [])


# ---- term filter ----------------------------------------------------------------------

filter_terms_st = st.lists(terms_st | st.binary(min_size=9, max_size=40), max_size=300, unique=True).map(sorted)


@needs_cython
@SETTINGS
@given(terms=filter_terms_st, target=targets_st)
def test_term_filter_matches_reference_bytes(terms, target):
    blocks = build(C, [(t, [1]) for t in terms], target)
    flt = term_filter(C, blocks)
    assert flt == term_filter(P, blocks)
    c = C.TermIndex(b"", [], [], flt)
    p = P.TermIndex(b"", [], [], flt)
    for t in terms + [t + b"\x00" for t in terms[:50]]:
        assert c.may_contain(t) == p.may_contain(t)


@impls
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), n=st.integers(1, 3000), keyed=st.booleans())
def test_term_filter_false_positive_rate(M, seed, n, keyed):
    """About 1% of absent terms pass (10 bits per term, k = 7); the bound leaves room."""
    rnd = random.Random(seed)
    if keyed:  # terms as a segment has them: one path, values that differ in a few bytes
        terms = sorted({b"\x01emails\x00\x05" + b"user%d@example.com" % rnd.randrange(10**9) for _ in range(n)})
    else:
        terms = sorted({rnd.randbytes(rnd.randrange(12)) for _ in range(n)})
    index = M.TermIndex(b"", [], [], term_filter(M, build(M, [(t, [1]) for t in terms])))
    assert all(index.may_contain(t) for t in terms)
    absent = [b"\xfe" + rnd.randbytes(rnd.randrange(1, 24)) for _ in range(20_000)]
    assert sum(index.may_contain(t) for t in absent) <= 0.02 * len(absent)


def test_term_filter_format_is_pinned():
    """The hash and the bits of one term, byte by byte: the filter is part of the on-disk layout."""
    assert P._hash(b"") == 0xF52A15E9A9B5E89B
    assert P._hash(b"a") == 0x02C0BDBF481420F8
    bits = bytearray(64)
    for bit in (113, 161, 195, 382, 399, 476, 484):
        bits[bit >> 3] |= 1 << (bit & 7)
    want = b"RTF\x01" + struct.pack("<II", 1, 7) + bytes(bits)
    for M in IMPLS:
        assert term_filter(M, build(M, [(b"a", [1])])) == want
        assert term_filter(M, []) == b"RTF\x01" + struct.pack("<II", 1, 7) + bytes(64)


def filter_outcome(M, flt):
    try:
        M.TermIndex(b"", [], [], flt)
        return "ok"
    except CorruptionError:
        return "corrupt"


@impls
@pytest.mark.parametrize("flt", [
    b"",
    b"RTF\x01" + struct.pack("<I", 1),  # short header
    b"RTX\x01" + struct.pack("<II", 1, 7) + bytes(64),  # magic
    b"RTF\x02" + struct.pack("<II", 1, 7) + bytes(64),  # a future version
    b"RTF\x01" + struct.pack("<II", 0, 7),  # no blocks
    b"RTF\x01" + struct.pack("<II", 1, 0) + bytes(64),  # k = 0
    b"RTF\x01" + struct.pack("<II", 1, 17) + bytes(64),  # k too large
    b"RTF\x01" + struct.pack("<II", 2, 7) + bytes(64),  # fewer blocks than it says
    b"RTF\x01" + struct.pack("<II", 1, 7) + bytes(65),  # more
], ids=["empty", "short", "magic", "version", "no-blocks", "k0", "k17", "short-bits", "long-bits"])
def test_malformed_filters_are_refused(M, flt):
    with pytest.raises(CorruptionError, match="term filter"):
        M.TermIndex(b"", [], [], flt)


@SETTINGS
@given(edits=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 255)), min_size=1, max_size=3),
       cut=st.integers(0, 200))
def test_mutated_filters_agree(edits, cut):
    """Both implementations accept or refuse the same damaged filters; an accepted one is a
    well-formed filter (its bits cannot be checked: the segment file's checksum covers them)."""
    flt = bytearray(term_filter(P, build(P, [(b"t%03d" % i, [1]) for i in range(100)])))
    for pos, byte in edits:
        flt[pos] = byte
    flt = bytes(flt[:len(flt) - cut])
    results = {filter_outcome(M, flt) for M in IMPLS}
    assert len(results) == 1
    if results == {"ok"}:
        n_blocks, k = struct.unpack_from("<II", flt, 4)
        assert flt[:4] == b"RTF\x01" and 1 <= k <= 16 and len(flt) == 12 + 64 * n_blocks


@impls
def test_term_filter_builder_validates_blocks(M):
    b = M.TermFilterBuilder()
    with pytest.raises(CorruptionError):
        b.add_block(b"RTB\x01")
    with pytest.raises(TypeError):
        b.add_block(12)
    for buf in (bytearray, memoryview):  # any contiguous buffer
        b.add_block(buf(build(M, [(b"a", [1]), (b"b", [2])])[0][1]))
    assert b.n_terms == 4
    with pytest.raises(TypeError):
        M.TermIndex(b"", [], [], None).may_contain("a")


@impls
def test_term_index_refuses_blocks_outside_its_data(M):
    blocks = build(M, [(b"a", [1])])
    with pytest.raises(CorruptionError, match="outside"):
        M.TermIndex(blocks[0][1], [b"a"], [(1, len(blocks[0][1]))])
    with pytest.raises(ValueError, match="positions"):
        M.TermIndex(blocks[0][1], [b"a"], [])
    with pytest.raises(TypeError):
        M.TermIndex(blocks[0][1], [b"a"], [(0, len(blocks[0][1]))]).get("a")


@impls
@SETTINGS
@given(entries=entries_st(max_size=30), target=targets_st, data=st.data())
def test_block_range_matches_brute_force(M, entries, target, data):
    blocks = build(M, entries, target)
    bound = st.none() | terms_st | st.sampled_from([t for t, _ in entries] or [b""])
    for _, block in blocks:
        lo, hi = data.draw(bound), data.draw(bound)
        items = M.block_items(block)
        want = [(t, bm) for t, bm in items if (lo is None or t >= lo) and (hi is None or t < hi)]
        assert M.block_range(block, lo, hi) == want
        if C is not None:
            assert C.block_range(block, lo, hi) == P.block_range(block, lo, hi)


def test_format_is_pinned():
    """One tiny block, byte by byte: the format is part of the on-disk layout."""
    for M in IMPLS:
        w = M.BlockWriter()
        assert w.add(b"key:a", array("I", [5])) is None
        assert w.add(b"key:b", array("I", [1, 2])) is None
        assert w.add(b"kz", array("I", range(100))) is None
        first, block = w.finish()
        entry_a = bytes([0, 5 << 1]) + b"key:a" + bytes([5])  # shared 0, 5 bytes, raw: varint 5
        entry_b = bytes([4, 1 << 1]) + b"b" + bytes([1, 0])  # "key:" + "b"; 1, then gap 1 - 1
        entry_z = bytes([1, 1 << 1 | 1]) + b"z" + struct.pack("<I", 100) + BitMap(range(100)).serialize()
        table_end = 9 + 2 * 4
        ends = list(itertools.accumulate([len(entry_a), len(entry_b), len(entry_z)], initial=table_end))
        want = b"RTB\x03" + struct.pack("<IB4H", 3, 2, *ends) + entry_a + entry_b + entry_z
        assert (first, block) == (b"key:a", want)
        assert w.finish() is None
        # a long shared prefix and a long suffix take two-byte varints
        w.add(b"p" * 200, array("I", [1]))
        w.add(b"p" * 130 + b"q" * 150, array("I", [2]))
        block = w.finish()[1]
        assert block[15:218] == bytes([0, 0x90, 0x03]) + b"p" * 200  # shared 0, tail 200 << 1 = 400
        second = offsets(block)[1]
        assert block[second:second + 154] == bytes([0x82, 0x01, 0xAC, 0x02]) + b"q" * 150  # 130, 150 << 1


@impls
@pytest.mark.parametrize("vals, raw", [
    ([0], [0]),
    ([MAXU], [0xFF, 0xFF, 0xFF, 0xFF, 0x0F]),  # 5 bytes, the longest
    ([0, 1, 2, 3], [0, 0, 0, 0]),  # gaps of 1 store 0
    ([127, 255, 384], [0x7F, 0x7F, 0x80, 0x01]),  # gap 128 stores 127 (1 byte), 129 stores 128 (2)
    ([128], [0x80, 0x01]),
    ([0, MAXU], [0, 0xFE, 0xFF, 0xFF, 0xFF, 0x0F]),  # the largest gap
    ([2**14 - 1, 2**21 + 2**14 - 1], [0xFF, 0x7F, 0xFF, 0xFF, 0x7F]),
])
def test_raw_varints_are_pinned(M, vals, raw):
    """A raw posting is the varint of its first offset, then of each gap minus 1, to the end."""
    w = M.BlockWriter()
    w.add(b"t", array("I", vals))
    _, block = w.finish()
    assert block[offsets(block)[0]:] == bytes([0, 1 << 1]) + b"t" + bytes(raw)
    assert M.block_get(block, b"t") == BitMap(vals)
    assert M.block_cardinality(block, b"t") == len(vals)
    assert list(M.merge_blocks([([block], 0, None)])) == [(b"t", block)]


@impls
def test_offsets_table_width(M):
    """The offsets table takes 2 bytes an offset while the block's size fits in 16 bits, 4 from
    65536 bytes on (a huge entry, or a huge target)."""

    def block_of(term_len, n=1, impl=M):
        w = impl.BlockWriter(1 << 20)
        for i in range(n):
            w.add(b"%04d" % i + b"x" * term_len, array("I", [i]))
        block = w.finish()[1]
        if impl is not P:  # the compiled writer writes the reference's bytes
            assert block == block_of(term_len, n, P)
        return block

    # header 9, table 2 * 2, entry: shared, tail, the 4-byte term, offset 0
    assert len(block_of(0)) == 9 + 4 + (1 + 1 + 4 + 1) and block_of(0)[8] == 2
    for size in (0xFFFE, 0xFFFF, 0x10000, 0x10001):
        term_len = size - 22  # the tail varint takes 3 bytes (2 ** 14 <= 2 * (4 + term_len) < 2 ** 21)
        block = block_of(term_len)
        # at 0xFFFF and below a 2-byte table; else 4 bytes an offset, 4 more bytes in all
        assert len(block) == (size if size <= 0xFFFF else size + 4)
        assert block[8] == (2 if len(block) <= 0xFFFF else 4)
        assert offsets(block) == (13 if block[8] == 2 else 17, len(block))
        assert M.block_items(block) == [(b"0000" + b"x" * term_len, BitMap([0]))]
    many = block_of(20, n=3000)  # many entries past 64 KiB
    assert many[8] == 4 and len(offsets(many)) == 3001
    assert M.block_get(many, b"2999" + b"x" * 20) == BitMap([2999])
    assert list(M.merge_blocks([([many], 0, None)], 1 << 20)) == [(b"0000" + b"x" * 20, many)]
    halves = list(M.merge_blocks([([many], 0, None)], len(many) // 2))  # 2-byte tables again
    assert [b[8] for _, b in halves] == [2, 2] and sum(len(M.block_items(b)) for _, b in halves) == 3000


V1_PINNED = (  # the pinned block of format 1 (what test_format_is_pinned checked before format 2)
    b"RTB\x01"
    + struct.pack("<I", 2)
    + struct.pack("<III", 20, 29, 42)
    + struct.pack("<I", 1) + b"a" + struct.pack("<I", 5)
    + struct.pack("<I", 1) + b"b" + struct.pack("<II", 1, 2)
)
V2_PINNED = (  # the pinned block of format 2 (what test_format_is_pinned checked before format 3)
    b"RTB\x02"
    + struct.pack("<I", 2)
    + struct.pack("<III", 20, 31, 38)
    + bytes([0, 5 << 1]) + b"key:a" + struct.pack("<I", 5)
    + bytes([4, 1 << 1]) + b"b" + struct.pack("<I", 7)
)


@impls
def test_format_2_still_reads(M):
    """Segment files written before format 3 hold format 2 blocks: every reader takes them."""
    assert M.block_items(V2_PINNED) == [(b"key:a", BitMap([5])), (b"key:b", BitMap([7]))]
    assert M.block_get(V2_PINNED, b"key:b") == BitMap([7]) and M.block_get(V2_PINNED, b"key:c") is None
    assert M.block_cardinality(V2_PINNED, b"key:a") == 1
    assert M.block_first_last(V2_PINNED) == (b"key:a", b"key:b")
    merged = list(M.merge_blocks([([V2_PINNED], 0, None)]))
    assert merged == build(M, [(b"key:a", [5]), (b"key:b", [7])])  # a merge writes format 3


@impls
def test_format_1_still_reads(M):
    """Segment files written before format 2 hold format 1 blocks: every reader takes them."""
    assert M.block_items(V1_PINNED) == [(b"a", BitMap([5])), (b"b", BitMap([1, 2]))]
    assert M.block_get(V1_PINNED, b"b") == BitMap([1, 2]) and M.block_get(V1_PINNED, b"c") is None
    assert M.block_cardinality(V1_PINNED, b"b") == 2
    assert M.block_first_last(V1_PINNED) == (b"a", b"b")
    assert M.TermIndex(V1_PINNED, [b"a"], [(0, len(V1_PINNED))]).get(b"a") == BitMap([5])
    merged = list(M.merge_blocks([([V1_PINNED], 0, None)]))
    assert merged == build(M, [(b"a", [5]), (b"b", [1, 2])])  # a merge writes format 3


@impls
@SETTINGS
@given(entries=entries_st(), target=targets_st, probes=st.lists(terms_st, max_size=10), data=st.data(),
       fmt=st.sampled_from([1, 2]))
def test_old_formats_read_as_format_3(M, entries, target, probes, data, fmt):
    """Every read of a format 1 or 2 block answers as the format 3 block of the same entries."""
    old, new = old_blocks(entries, target, fmt), build(M, entries, target)
    assert [item for _, b in old for item in M.block_items(b)] == [(t, BitMap(v)) for t, v in entries]
    for first, block in old:
        assert M.block_first_last(block) == (first, M.block_items(block)[-1][0])
    want = {t: BitMap(v) for t, v in entries}
    data_old = b"".join(b for _, b in old)
    positions = list(zip(itertools.accumulate([len(b) for _, b in old], initial=0), [len(b) for _, b in old]))
    index = M.TermIndex(data_old, [f for f, _ in old], positions, term_filter(M, old))
    assert term_filter(M, old) == term_filter(M, new)
    for t in [t for t, _ in entries] + probes:
        assert index.get(t) == want.get(t)
        if old:
            block = find_block(old, t)
            assert M.block_get(block, t) == want.get(t)
            assert M.block_cardinality(block, t) == len(want.get(t, ()))
    for _, block in old:
        lo, hi = data.draw(st.none() | terms_st), data.draw(st.none() | terms_st)
        assert M.block_range(block, lo, hi) == [
            (t, bm) for t, bm in M.block_items(block) if (lo is None or t >= lo) and (hi is None or t < hi)
        ]
    # merging old blocks (alone or beside new ones) gives what writing the result gives
    assert list(M.merge_blocks([([b for _, b in old], 0, None)], target)) == build(M, entries, target)
    mixed = list(M.merge_blocks([([b for _, b in old], 0, None), ([b for _, b in new], 0, BitMap())], target))
    assert mixed == build(M, entries, target)


@impls
@SETTINGS
@given(prefix=st.binary(min_size=4, max_size=40), suffixes=st.lists(st.binary(max_size=6), min_size=2,
                                                                    max_size=50, unique=True))
def test_shared_prefixes_are_stored_once(M, prefix, suffixes):
    """Terms that share a prefix with the block's first term store only the rest: each entry
    is two one-byte varints, its suffix and its posting (one offset < 128: one byte)."""
    entries = [(prefix + x, [i]) for i, x in enumerate(sorted(suffixes))]
    (_, old), = old_blocks(entries)
    (_, new), = build(M, entries)
    assert M.block_items(new) == M.block_items(old)
    first = entries[0][0]
    suffixes = [len(t) - (P._shared_len(first, t) if i else 0) for i, (t, _) in enumerate(entries)]
    assert len(new) == 9 + 2 * (len(entries) + 1) + sum(2 + n + 1 for n in suffixes)


@impls
def test_encoding_choice(M):
    """Roaring for sets of >= 64 offsets whose bitmap is smaller than their varints, raw below
    64 or when raw is smaller."""

    def kind_of(vals):
        w = M.BlockWriter()
        w.add(b"t", array("I", vals))
        block = w.finish()[1]
        assert block[13:16] == bytes([0, 1 << 1 | (block[14] & 1)]) + b"t"  # shared 0, tail, term
        assert M.block_get(block, b"t") == BitMap(vals)
        return block[14] & 1

    assert kind_of(list(range(63))) == 0
    assert kind_of(list(range(64))) == 1  # one run
    assert kind_of(list(range(0, 64 * 2**16, 2**16))) == 0  # one value per 64K chunk
    assert kind_of(list(range(5000))) == 1
    assert kind_of([MAXU]) == 0
    # gaps below 128 take a byte each raw, 2 in a roaring array: raw (in uint32, roaring won)
    assert kind_of(list(range(0, 200, 2))) == 0
    assert kind_of(list(range(0, 40000, 5))) == 0  # 8000 bytes raw, an 8 KiB bitset roaring
    assert kind_of(list(range(0, 60000, 5))) == 1  # 12000 raw: the bitset wins
    # the choice is exact: 4 + len(serialized) against the varints' bytes
    vals = [0] + list(range(2, 256, 2))
    assert kind_of(vals) == (1 if 4 + len(BitMap(vals).serialize()) < len(P._raw_bytes(array("I", vals))) else 0)


@impls
def test_big_postings_and_extremes(M):
    entries = [
        (b"", [0, MAXU]),
        (b"\x00", list(range(MAXU - 5000, MAXU + 1))),
        (b"\x00\xff", list(range(0, 10**6, 3))),
        (b"\xff", [MAXU]),
    ]
    blocks = build(M, entries, target=1)
    assert len(blocks) == 4
    for t, vals in entries:
        assert M.block_get(find_block(blocks, t), t) == BitMap(vals)
        assert M.block_cardinality(find_block(blocks, t), t) == len(vals)


@impls
def test_add_validates(M):
    w = M.BlockWriter(target_bytes=1)
    assert w.add(b"b", array("I", [1])) is not None  # target 1: every add emits a block
    with pytest.raises(ValueError):
        w.add(b"b", array("I", [2]))  # equal term, across a block boundary
    with pytest.raises(ValueError):
        w.add(b"a", array("I", [2]))
    with pytest.raises(ValueError):
        w.add(b"c", array("I", [3, 3]))
    with pytest.raises(ValueError):
        w.add(b"c", array("I", [4, 3]))
    with pytest.raises(TypeError):
        w.add("c", array("I", [1]))
    with pytest.raises(TypeError):
        w.add(b"c", [1])
    with pytest.raises(TypeError):
        w.add(b"c", array("i", [1]))
    with pytest.raises(TypeError):
        w.add(b"c", array("Q", [1]))
    assert w.add(b"c", array("I")) is None  # empty postings are skipped
    assert w.add(b"c", BitMap()) is None
    assert w.add(b"a", array("I")) is None  # ... without an order check
    assert w.n_terms == 1
    assert w.add(b"c", FrozenBitMap([7])) is not None
    assert w.n_terms == 2
    assert w.finish() is None
    for bad in (0, -5):
        with pytest.raises(ValueError):
            M.BlockWriter(bad)
    for bad in (1.5, "16", True):
        with pytest.raises(TypeError):
            M.BlockWriter(bad)


@impls
def test_lookups_validate_arguments(M):
    block = build(M, [(b"a", [1])])[0][1]
    with pytest.raises(TypeError):
        M.block_get(block, "a")
    with pytest.raises(TypeError):
        M.block_range(block, "a", None)
    with pytest.raises(TypeError):
        M.block_get(12, b"a")
    # any contiguous buffer works
    for buf in (bytearray(block), memoryview(block)):
        assert M.block_get(buf, b"a") == BitMap([1])
        assert M.block_items(buf) == [(b"a", BitMap([1]))]


# ---- merging --------------------------------------------------------------------------


@st.composite
def merge_case(draw):
    n_inputs = draw(st.integers(0, 4))
    inputs = []
    for _ in range(n_inputs):
        entries = draw(entries_st(max_size=25))
        top = max((v[-1] for _, v in entries), default=0)
        shift = draw(st.sampled_from([0, 1, 10**6]) | st.integers(0, MAXU - top))
        assume(top + shift <= MAXU)
        all_vals = sorted({x for _, v in entries for x in v})
        some_vals = st.sampled_from(all_vals) if all_vals else st.just(0)
        deleted = draw(st.none() | st.sets(some_vals, max_size=30))
        if deleted is not None and draw(st.booleans()):
            deleted.add(draw(offset_st))  # deletes of offsets no term holds are harmless
        target = draw(targets_st)
        inputs.append((entries, shift, None if deleted is None else BitMap(deleted), target))
    return inputs, draw(targets_st)


def brute_merge(inputs):
    want: dict[bytes, set[int]] = {}
    for entries, shift, deleted, _ in inputs:
        for t, vals in entries:
            s = want.setdefault(t, set())
            s.update(v + shift for v in vals if deleted is None or v not in deleted)
    return [(t, sorted(s)) for t, s in sorted(want.items()) if s]


def run_merge(M, inputs, target, block_impl=None):
    block_impl = block_impl or M
    args = [(iter([b for _, b in build(block_impl, e, tg)]), sh, d) for e, sh, d, tg in inputs]
    return list(M.merge_blocks(args, target))


@impls
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=merge_case())
def test_merge_matches_brute_force(M, case):
    inputs, target = case
    want = brute_merge(inputs)
    got = run_merge(M, inputs, target)
    assert [item for _, b in got for item in M.block_items(b)] == [(t, BitMap(v)) for t, v in want]
    # encoding is a function of the sets: merging equals writing the result directly
    assert got == build(M, want, target)


@needs_cython
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=merge_case(), bitset=st.booleans())
def test_merge_matches_reference_bytes(case, bitset):
    inputs, target = case
    old = C._test_set_bitset_limit(1 << 27 if bitset else 0)  # 0: deletes use binary search
    try:
        got = run_merge(C, inputs, target)
    finally:
        C._test_set_bitset_limit(old)
    assert got == run_merge(P, inputs, target)


@impls
def test_merge_many_small_terms(M):
    """Long runs through the fast path (raw, small, shared terms), many output blocks."""
    rnd = random.Random(5)
    segs = []
    for s in range(3):
        entries = [
            (b"k%06d" % i, sorted(rnd.sample(range(1000), rnd.randint(1, 5)))) for i in range(s, 3000, s + 1)
        ]
        deleted = BitMap(rnd.sample(range(1000), 50))
        segs.append((entries, 1000 * s, deleted, 512))
    got = run_merge(M, segs, 700)
    want = brute_merge(segs)
    assert [item for _, b in got for item in M.block_items(b)] == [(t, BitMap(v)) for t, v in want]
    if C is not None and M is C:
        assert got == run_merge(P, segs, 700)


@impls
def test_merge_streams(M):
    """A merge holds one block per input: it pulls input blocks as it emits output."""
    entries = [(b"t%05d" % i, [i]) for i in range(5000)]
    blocks = [b for _, b in build(M, entries, 256)]
    pulled = [0, 0]

    def feed(k):
        for b in blocks:
            pulled[k] += 1
            yield b

    gen = M.merge_blocks([(feed(0), 0, None), (feed(1), 5000, None)], 256)
    next(gen)
    assert max(pulled) <= 2 < len(blocks)
    rest = list(gen)
    assert pulled == [len(blocks), len(blocks)] and len(rest) > 10


@impls
def test_merge_edge_cases(M):
    assert list(M.merge_blocks([])) == []
    assert list(M.merge_blocks([(iter([]), 0, None)])) == []
    blocks = [b for _, b in build(M, [(b"a", [1, 2]), (b"b", [3])])]
    # everything deleted: nothing left
    assert list(M.merge_blocks([(blocks, 0, BitMap([1, 2, 3]))])) == []
    # FrozenBitMap deletes, empty deletes
    out = list(M.merge_blocks([(blocks, 0, FrozenBitMap([2])), (blocks, 10, BitMap())]))
    assert M.block_items(out[0][1]) == [(b"a", BitMap([1, 11, 12])), (b"b", BitMap([3, 13]))]
    # roaring postings with deletes of every kind
    big = [b for _, b in build(M, [(b"a", list(range(1000))), (b"b", list(range(0, 5000, 2)))])]
    for deleted in (FrozenBitMap(range(0, 2000, 4)), BitMap(range(0, 2000, 4), copy_on_write=True)):
        out = list(M.merge_blocks([(big, 0, deleted), (big, 5000, None)]))
        assert M.block_items(out[0][1]) == [
            (b"a", BitMap(range(1000)) - BitMap(range(0, 2000, 4)) | BitMap(range(5000, 6000))),
            (b"b", BitMap(range(0, 5000, 2)) - BitMap(range(0, 2000, 4)) | BitMap(range(5000, 10000, 2))),
        ]
    # argument errors are raised at call time
    with pytest.raises(ValueError):
        M.merge_blocks([(blocks, -1, None)])
    with pytest.raises(ValueError):
        M.merge_blocks([(blocks, 2**32, None)])
    with pytest.raises(TypeError):
        M.merge_blocks([(blocks, 1.0, None)])
    with pytest.raises(TypeError):
        M.merge_blocks([(blocks, 0, {1})])
    with pytest.raises(TypeError):
        M.merge_blocks([(blocks, 0)])
    with pytest.raises(ValueError):
        M.merge_blocks([], target_bytes=0)


@impls
@pytest.mark.parametrize("vals", [[5, MAXU - 1], list(range(MAXU - 100, MAXU))])
def test_merge_shift_overflow(M, vals):
    blocks = [b for _, b in build(M, [(b"a", vals)])]
    with pytest.raises(ValueError):
        list(M.merge_blocks([(blocks, 2, None)]))
    # deleting the offsets that would overflow makes the shift fine
    out = list(M.merge_blocks([(blocks, 2, BitMap(v for v in vals if v + 2 > MAXU))]))
    assert M.block_items(out[0][1]) == [(b"a", BitMap(v + 2 for v in vals if v + 2 <= MAXU))]


# ---- corruption -----------------------------------------------------------------------


def read_all(M, block, term, lo, hi):
    return [
        outcome(lambda: M.block_get(block, term)),
        outcome(lambda: M.block_cardinality(block, term)),
        outcome(lambda: M.block_range(block, lo, hi)),
        outcome(lambda: M.block_range(block, None, None)),
        outcome(lambda: M.block_items(block)),
        outcome(lambda: M.block_first_last(block)),
        outcome(lambda: list(M.merge_blocks([([block], 0, None), ([block], 7, BitMap([3]))], 64))),
        outcome(lambda: term_filter(M, [(b"", block)])),
    ]


def check_same(block, term, lo=None, hi=None):
    results = [read_all(M, block, term, lo, hi) for M in IMPLS]
    assert all(r == results[0] for r in results)
    return results[0]


@SETTINGS
@given(block=st.binary(max_size=300), term=terms_st)
def test_random_bytes(block, term):
    check_same(block, term)


@st.composite
def header_like(draw):
    """Random bytes behind a plausible header (either format), to get past the first checks."""
    n = draw(st.integers(1, 6))
    body = draw(st.binary(max_size=120))
    size = 12 + 4 * n + len(body)
    offs = draw(st.lists(st.integers(0, size + 8), min_size=n - 1, max_size=n - 1))
    table = [12 + 4 * n] + offs + [size]
    return draw(st.sampled_from([b"RTB\x01", b"RTB\x02"])) + struct.pack(f"<{n + 2}I", n, *table) + body


@st.composite
def header_like_3(draw):
    """Random bytes behind a plausible format 3 header (either offset width)."""
    n = draw(st.integers(1, 6))
    width = draw(st.sampled_from([2, 4, 2, 3]))
    body = draw(st.binary(max_size=120))
    size = 9 + max(width, 2) * (n + 1) + len(body)
    offs = draw(st.lists(st.integers(0, size + 8), min_size=n - 1, max_size=n - 1))
    table = [9 + max(width, 2) * (n + 1)] + offs + [size]
    return b"RTB\x03" + struct.pack(f"<IB{n + 1}{'I' if width == 4 else 'H'}", n, width, *table) + body


@SETTINGS
@given(block=header_like() | header_like_3(), term=terms_st)
def test_random_entries(block, term):
    check_same(block, term)


@st.composite
def raw_entry_block(draw):
    """A format 3 block of one term whose raw posting is random bytes (bad varints, overflows)."""
    posting = draw(st.binary(min_size=1, max_size=12)
                   | st.lists(st.sampled_from([b"\xff\xff\xff\xff\x0f", b"\x80", b"\x00", b"\x7f",
                                               b"\xff\xff\xff\xff\x10", b"\x80\x80\x80\x80\x80\x01"]),
                              min_size=1, max_size=4).map(b"".join))
    entry = bytes([0, 1 << 1]) + b"t" + posting
    return b"RTB\x03" + struct.pack("<IBHH", 1, 2, 13, 13 + len(entry)) + entry


@SETTINGS
@given(block=raw_entry_block(), term=st.sampled_from([b"t", b"s", b"u"]))
def test_random_raw_postings(block, term):
    """A raw posting that is not varints of increasing uint32 offsets is corrupt, alike in
    both implementations (the cardinality reads no more than the varints' last bytes)."""
    results = check_same(block, term)
    try:
        want = P._Block(block).raw(16, len(block))
    except CorruptionError:
        return
    assert results[0] == (("ok", BitMap(want)) if term == b"t" else ("ok", None))


def sample_blocks():
    """Format 3 blocks (random terms, then terms sharing a long prefix), then format 2 and
    format 1 ones."""
    rnd = random.Random(11)
    vals = [[1], [3, 9], list(range(100, 400)), list(range(0, 2**24, 2**16 + 1))[:80], [MAXU]]

    def pairs(prefix, n):
        terms = sorted({prefix + bytes(rnd.randrange(256) for _ in range(rnd.randrange(6))) for _ in range(n)})
        return [(t, vals[i % len(vals)]) for i, t in enumerate(terms)]

    plain, keyed = pairs(b"", 40), pairs(PREFIXES[1], 30)
    return [b for _, b in build(P, plain, 200) + build(P, keyed, 200) + old_blocks(keyed, 200, 2)
            + old_blocks(plain, 200)]


SAMPLES = sample_blocks()


def test_truncations_are_corrupt():
    for block in SAMPLES[:3] + SAMPLES[-2:]:
        for cut in range(len(block)):
            results = check_same(block[:cut], b"x", b"a", b"z")
            assert all(r == ("corrupt",) for r in results)


@SETTINGS
@given(
    which=st.integers(0, len(SAMPLES) - 1),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
    term=terms_st,
    lo=st.none() | terms_st,
    hi=st.none() | terms_st,
)
def test_mutations(which, edits, term, lo, hi):
    block = bytearray(SAMPLES[which])
    for pos, byte in edits:
        block[pos % len(block)] = byte
    check_same(bytes(block), term, lo, hi)


def test_corrupt_order_in_merge():
    """Inputs whose terms go backwards (within a block or across blocks) are corrupt."""
    w = P.BlockWriter()
    b1 = w.add(b"b", array("I", [1])) or w.finish()
    w2 = P.BlockWriter()
    w2.add(b"a", array("I", [2]))
    b2 = w2.finish()
    for M in IMPLS:
        with pytest.raises(CorruptionError):
            list(M.merge_blocks([([b1[1], b2[1]], 0, None)]))
        with pytest.raises(CorruptionError):
            list(M.merge_blocks([([b1[1], b1[1]], 0, None)]))
        with pytest.raises(TypeError):
            list(M.merge_blocks([([12], 0, None)]))


@SETTINGS
@given(vals=postings_st)
def test_surely_raw_is_only_a_shortcut(vals):
    """The quick 'raw wins' test never contradicts the rule it short-cuts."""
    a = array("I", vals)
    if P._surely_raw(a) and len(a) >= 64:
        assert 4 + len(BitMap(a).serialize()) >= len(P._raw_bytes(a)) == P._raw_size(a)
    if C is not None:
        assert C._test_surely_raw(a) == P._surely_raw(a)
