#!/usr/bin/env python
"""The table of docs/reliability.md, made from a run of the reliability suites.

    python benchmarks/reliability.py [--quick] [--write]

Runs the suites that attack rtindex on purpose (kills, injected storage faults, hostile
requests, floods of slow queries; ``SUITES``) with pytest, the slow ones too unless
``--quick``. Each test records what it tried (tests/reliability.py); pytest's JUnit XML says
whether it passed. The table (one row a test: what it checks, how many cases, what was
found, the result) is printed, and with ``--write`` it replaces the part of
docs/reliability.md between its two markers. The last line is one JSON line of totals.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- reliability table: benchmarks/reliability.py --write -->", "<!-- end of reliability table -->"
SUITES = ["tests/test_crash.py", "tests/test_faults.py", "tests/test_service_crash.py", "tests/test_hostile.py",
          "tests/test_timeouts.py"]
LOG_ENV = "RTINDEX_RELIABILITY_LOG"  # tests/reliability.py appends its records there


def run_suites(quick: bool, log: Path, junit: Path) -> int:
    suites = [s for s in SUITES if (ROOT / s).exists()]
    marker = ["-m", "not slow"] if quick else ["-m", "slow or not slow"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *marker, f"--junitxml={junit}", *suites]
    print("$", " ".join(cmd), file=sys.stderr)
    return subprocess.call(cmd, cwd=ROOT, env={**os.environ, LOG_ENV: str(log)})


def outcomes(junit: Path) -> dict[str, str]:
    """pytest's node id ('tests/file.py::test[id]') -> passed / failed / skipped, from its
    JUnit XML."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[name] = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
    return out


def table(records: list[dict], results: dict[str, str]) -> list[str]:
    rows = ["| test | what it checks | cases | found | result |", "|---|---|---|---|---|"]
    seen = set()
    for r in records:
        seen.add(r["test"])
        found = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in r.items()
                          if k not in ("test", "what", "cases", "unit", "failures"))
        result = results.get(r["test"], "not found in pytest's results")
        verdict = "passed" if result == "passed" and r["failures"] == 0 else f"**{result}**, {r['failures']} failing"
        rows.append(f"| `{r['test']}` | {r['what']} | {r['cases']:,} {r['unit']} | {found or '-'} | {verdict} |")
    for name, result in sorted(results.items()):
        if name not in seen and result == "failed":  # failed before it could record its cases
            rows.append(f"| `{name}` | (stopped before recording its cases) | - | - | **failed** |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the suites' quick tests (the default test run's)")
    ap.add_argument("--write", action="store_true", help="replace the table in docs/reliability.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log, junit = Path(tmp) / "records.jsonl", Path(tmp) / "junit.xml"
        code = run_suites(args.quick, log, junit)
        records = [orjson.loads(line) for line in log.read_bytes().splitlines()] if log.exists() else []
        results = outcomes(junit) if junit.exists() else {}
    rows = table(records, results)
    when = datetime.date.today().isoformat()
    head = (f"`python benchmarks/reliability.py{' --quick' if args.quick else ''} --write`, {when}, commit "
            f"{subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()}:")
    print("\n".join([head, "", *rows]))
    if args.write:
        text = DOC.read_text()
        if BEGIN not in text or END not in text:
            print(f"{DOC} has no table markers ({BEGIN} ... {END})", file=sys.stderr)
            return 2
        before, rest = text.split(BEGIN, 1)
        after = rest.split(END, 1)[1]
        DOC.write_text(before + BEGIN + "\n" + head + "\n\n" + "\n".join(rows) + "\n" + END + after)
    failing = sum(1 for r in records if r["failures"]) + sum(1 for v in results.values() if v == "failed")
    print(orjson.dumps({"tests": len(results), "records": len(records), "cases": sum(r["cases"] for r in records),
                        "failing": failing, "pytest_exit": code}).decode())
    return 0 if code == 0 and failing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
