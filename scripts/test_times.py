"""Where a test run's time went: the totals by test module from pytest's JUnit XML, largest first.

    python scripts/test_times.py build/test-all.xml [--top 25]

`make test-all` writes the XML (`--junitxml`) and prints this table after its 25 slowest tests, so every CI log
says which modules to make faster. A test's time is its setup, call and teardown together, on the worker that ran
it: the column sums to the workers' time, not to the wall clock.
"""

from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def module_totals(path: Path) -> tuple[dict[str, tuple[float, int]], float]:
    """module -> (seconds, tests), and the seconds of all tests, from a JUnit XML report."""
    totals: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = ".".join(part for part in module if not part[:1].isupper()) or "?"
        totals[name][0] += float(case.get("time") or 0.0)
        totals[name][1] += 1
    return {name: (seconds, count) for name, (seconds, count) in totals.items()}, sum(s for s, _ in totals.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    if not args.report.is_file():
        print(f"test_times: no report at {args.report}", file=sys.stderr)
        return 2
    totals, overall = module_totals(args.report)
    print(f"test time by module (all workers together: {overall / 60:.1f} min in {len(totals)} modules)")
    for name, (seconds, count) in sorted(totals.items(), key=lambda item: -item[1][0])[: args.top]:
        print(f"{seconds:8.1f} s {100 * seconds / max(overall, 1e-9):5.1f}% {count:5d} tests  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
