#!/usr/bin/env python3
"""Simulated cache misses per call, in total and by function, from two callgrind runs.

With many connections a call's cost is its cache misses more than its instructions
(docs/doca.md, "Many connections"). callgrind's cache simulation counts them
(`--cache-sim=yes`, the last level sized as the machine's L2); two runs with different call
counts cancel out setup and teardown, as for the instruction count (see
`examples/src/bin/callcost.rs` for the commands). Given a second pair of runs (another
build), it prints the difference by function instead.

usage:
  misses_per_call.py SMALL LARGE CALLS_BETWEEN [ROWS]
  misses_per_call.py SMALL LARGE OTHER_SMALL OTHER_LARGE CALLS_BETWEEN [ROWS]

Figures are per call: Ir (instructions), and last-level misses (data reads, data writes and
instruction reads that missed the simulated last level). Run-to-run noise of the total is
about 3 misses per call with 1,000 connections: compare two pairs of each build before
trusting a smaller difference.
"""

import re
import subprocess
import sys
from collections import defaultdict

EVENTS = ("Ir", "DLmr", "DLmw", "ILmr")
NUMBER = r"([\d,]+|\.)(?:\s+\(\s*[\d.]+%\))?\s+"


def totals(path):
    """Event name -> total count of one callgrind output file."""
    names, counts = None, None
    with open(path) as f:
        for line in f:
            if line.startswith("events:"):
                names = line.split()[1:]
            elif line.startswith(("totals:", "summary:")):
                counts = [int(x) for x in line.split()[1:]]
    if names is None or counts is None:
        sys.exit(f"{path}: not a callgrind output file")
    return dict(zip(names, counts))


def by_function(path):
    """Function -> [Ir, LL misses] (self cost), inlined code counted where it was inlined."""
    out = subprocess.run(
        [
            "callgrind_annotate",
            "--inclusive=no",
            "--auto=no",
            "--threshold=100",
            "--show=" + ",".join(EVENTS),
            path,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    costs = defaultdict(lambda: [0, 0])
    row = re.compile(r"\s*" + NUMBER * len(EVENTS) + r"(\S.*)")
    for line in out.splitlines():
        m = row.match(line)
        if not m:
            continue
        values = [0 if x == "." else int(x.replace(",", "")) for x in m.groups()[:-1]]
        name = re.sub(r" \[[^]]*\]$", "", m.group(len(EVENTS) + 1).strip())
        if name.startswith(("PROGRAM", "file:function")):
            continue
        # `file:function`: the function is what a reader looks for; the file only says
        # which inlined code it ran.
        function = name.split(":", 1)[1] if ":" in name else name
        function = function.replace("::{{closure}}", "")
        costs[function][0] += values[0]
        costs[function][1] += sum(values[1:])
    return costs


def per_call(small, large, calls):
    """Function -> [Ir, misses] per call, and the totals per call."""
    a, b = by_function(small), by_function(large)
    zero = [0, 0]
    rows = {
        k: [(b.get(k, zero)[i] - a.get(k, zero)[i]) / calls for i in (0, 1)]
        for k in set(a) | set(b)
    }
    ta, tb = totals(small), totals(large)
    ir = (tb["Ir"] - ta["Ir"]) / calls
    misses = sum(tb.get(e, 0) - ta.get(e, 0) for e in EVENTS[1:]) / calls
    return rows, ir, misses


def main(argv):
    if len(argv) in (3, 4):
        small, large, calls = argv[0], argv[1], float(argv[2])
        rows_n = int(argv[3]) if len(argv) == 4 else 30
        rows, ir, misses = per_call(small, large, calls)
        print(f"per call: {ir:,.1f} instructions, {misses:.1f} last-level misses")
        print(f"{'misses':>7} {'Ir':>8}  function")
        for name, (fir, fm) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:rows_n]:
            print(f"{fm:7.1f} {fir:8.0f}  {name[:140]}")
    elif len(argv) in (5, 6):
        calls = float(argv[4])
        rows_n = int(argv[5]) if len(argv) == 6 else 30
        before, ir_a, miss_a = per_call(argv[0], argv[1], calls)
        after, ir_b, miss_b = per_call(argv[2], argv[3], calls)
        print(
            f"per call: {ir_a:,.1f} -> {ir_b:,.1f} instructions, "
            f"{miss_a:.1f} -> {miss_b:.1f} last-level misses"
        )
        print(f"{'change':>7} {'misses':>15} {'Ir':>17}  function")
        names = set(before) | set(after)
        zero = [0.0, 0.0]
        diffs = sorted(
            names, key=lambda k: -abs(after.get(k, zero)[1] - before.get(k, zero)[1])
        )
        for name in diffs[:rows_n]:
            x, y = before.get(name, zero), after.get(name, zero)
            print(
                f"{y[1] - x[1]:+7.1f} {x[1]:6.1f} -> {y[1]:6.1f} "
                f"{x[0]:7.0f} -> {y[0]:7.0f}  {name[:120]}"
            )
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
