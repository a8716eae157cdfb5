"""Figures every benchmark reports: percentiles, summaries, PASS/FAIL lines, rounding for
the final JSON line."""

from __future__ import annotations

import math
from typing import Any, Callable

from benchmarks.ingest import log


def percentile(sorted_vals: list[float], q: float) -> float | None:
    if not sorted_vals:
        return None
    k = min(len(sorted_vals) - 1, max(0, math.ceil(q / 100 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def summary(vals: list[float], prefix: str = "") -> dict[str, Any]:
    """{prefix}p50/p95/p99/max/mean (same unit as vals) and {prefix}n."""
    s = sorted(vals)
    return {f"{prefix}p50": percentile(s, 50), f"{prefix}p95": percentile(s, 95),
            f"{prefix}p99": percentile(s, 99), f"{prefix}max": s[-1] if s else None,
            f"{prefix}mean": sum(s) / len(s) if s else None, f"{prefix}n": len(s)}


def check(name: str, value: Any, ok: Callable[[Any], bool], fmt: str = "{}") -> bool:
    passed = value is not None and bool(ok(value))
    log(f"{'PASS' if passed else 'FAIL'}: {name}: {'not measured' if value is None else fmt.format(value)}")
    return passed


def rnd(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 3) if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: rnd(x) for k, x in v.items()}
    if isinstance(v, list):
        return [rnd(x) for x in v]
    return v
