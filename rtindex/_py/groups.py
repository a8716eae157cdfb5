"""Group numbers of 64-bit integer keys: the reference of ``rtindex/_ext/_groups.pyx``.

``factorize(values, valid=None)`` -> ``(codes, count, firsts)``: ``values`` a contiguous
int64 array, ``valid`` None or a uint8 array (0: that row's key is NULL). Equal keys get the
same group number, NULL keys one group of their own; groups are numbered 0, 1, ... in the
order of their first rows. ``codes`` (intp) holds each row's group, ``firsts`` (intp) the
row where each group first comes.
"""

from __future__ import annotations

import numpy as np


def factorize(values: np.ndarray, valid: np.ndarray | None = None) -> tuple[np.ndarray, int, np.ndarray]:
    if valid is not None and len(valid) != len(values):
        raise ValueError(f"{len(valid)} validity flags for {len(values)} values")
    ids: dict = {}
    codes = np.empty(len(values), dtype=np.intp)
    firsts = []
    for i, v in enumerate(values.tolist()):
        key = None if valid is not None and not valid[i] else ("v", v)
        g = ids.get(key)
        if g is None:
            g = ids[key] = len(firsts)
            firsts.append(i)
        codes[i] = g
    return codes, len(firsts), np.array(firsts, dtype=np.intp)
