"""Column values at matched rows, across segments, in one call: the reference of
``rtindex/_ext/_gather.pyx``, with numpy.

A part is one chunk's share of the rows: ``(values, offsets, valid, start, positions)``,
``values`` None for a chunk the segment does not have (all null); else Arrow's buffers of
the chunk (for 8-byte values and bits the data buffer, for large strings the bytes, with
``offsets`` their int64 offsets; ``valid`` the validity bitmap or None), ``start`` the
array's offset into them, and ``positions`` the rows to take (an int64 array). 8-byte values
need not be aligned in their buffer (a chunk mapped from a segment file).

``gather(kind, parts)`` -> ``(null_count, validity, data, offsets)``: the buffers of one
Arrow array holding every part's values one after the other: the validity bitmap (None
when nothing is null), the data (8-byte values, bits, or string bytes) and, for strings,
the int64 offsets.
"""

from __future__ import annotations

import numpy as np

FIXED8, BITS, STRING = 0, 1, 2


def _bits(buf, at: np.ndarray) -> np.ndarray:
    bitmap = np.frombuffer(buf, dtype=np.uint8)
    return ((bitmap[at >> 3] >> (at & 7).astype(np.uint8)) & 1).astype(bool)


def _items(buf, n: int) -> np.ndarray:
    return np.frombuffer(buf, dtype="V8", count=n)


def gather(kind: int, parts: list[tuple]) -> tuple[int, bytes | None, bytes, bytes | None]:
    valid, data, lengths = [], [], []
    for values, offsets, validity, start, positions in parts:
        at = np.asarray(positions, dtype=np.int64) + start
        m = len(at)
        if values is None:
            valid.append(np.zeros(m, dtype=bool))
            data.append(np.zeros(m * 8 if kind == FIXED8 else (0 if kind == STRING else m),
                                 dtype=np.uint8 if kind != BITS else bool))
            lengths.append(np.zeros(m, dtype=np.int64))
            continue
        valid.append(_bits(validity, at) if validity is not None else np.ones(m, dtype=bool))
        if kind == FIXED8:
            data.append(_items(values, int(at.max()) + 1 if m else 0)[at].view(np.uint8) if m
                        else np.zeros(0, np.uint8))
        elif kind == BITS:
            data.append(_bits(values, at))
        else:
            offs = _items(offsets, int(at.max()) + 2 if m else 0).view(np.int64)
            starts, ends = offs[at], offs[at + 1] if m else offs[at]
            raw = np.frombuffer(values, dtype=np.uint8)
            data.append(np.concatenate([np.zeros(0, np.uint8)] + [raw[s:e] for s, e in zip(starts, ends)]))
            lengths.append(ends - starts)
    ok = np.concatenate([np.zeros(0, bool)] + valid)
    nulls = int(len(ok) - np.count_nonzero(ok))
    validity = np.packbits(ok, bitorder="little").tobytes() if nulls else None
    if kind == BITS:
        return nulls, validity, np.packbits(np.concatenate([np.zeros(0, bool)] + data),
                                            bitorder="little").tobytes(), None
    out = np.concatenate([np.zeros(0, np.uint8)] + data).tobytes()
    if kind == FIXED8:
        return nulls, validity, out, None
    offsets_out = np.zeros(len(ok) + 1, dtype=np.int64)
    np.cumsum(np.concatenate([np.zeros(0, np.int64)] + lengths), out=offsets_out[1:])
    return nulls, validity, out, offsets_out.tobytes()
