#!/usr/bin/env python3
"""Summarise the margins the oracle checks passed with, per call site.

Usage:
    FTN_TEST_MARGINS=/tmp/margins.txt cargo test     # (several runs append)
    python3 scripts/test_margins.py /tmp/margins.txt [top]

Each line of the file is "ratio file:line what", ratio being the check's
error over its allowance (a pass is <= 1). Prints the `top` call sites
(default 25) by their largest ratio, with the 99th percentile, the median
and the number of checks: a site whose largest ratio sits far above its
median has a heavy tail and may fail on a rare seed.
"""
import collections
import statistics
import sys


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    top = int(sys.argv[2]) if len(sys.argv) == 3 else 25
    sites = collections.defaultdict(list)
    with open(sys.argv[1], encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            parts = line.split(" ", 2)
            try:
                sites[parts[1]].append(float(parts[0]))
            except (IndexError, ValueError):
                print(f"line {n}: expected 'ratio file:line what', got {line!r}", file=sys.stderr)
                return 1
    rows = []
    for site, ratios in sites.items():
        ratios.sort()
        p99 = ratios[min(len(ratios) - 1, int(len(ratios) * 0.99))]
        rows.append((ratios[-1], p99, statistics.median(ratios), len(ratios), site))
    rows.sort(reverse=True)
    print(f"{'max':>6} {'p99':>6} {'median':>6} {'checks':>7}  call site")
    for worst, p99, med, count, site in rows[:top]:
        print(f"{worst:6.3f} {p99:6.3f} {med:6.3f} {count:7d}  {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
