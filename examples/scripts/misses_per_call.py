#!/usr/bin/env python3
"""Simulated cache misses per call, in total and by function, from two callgrind runs.

With many connections a call's cost is its cache misses more than its instructions
(docs/doca.md, "Many connections"). callgrind's cache simulation counts them
(`--cache-sim=yes`, the last level sized as the machine's L2); two runs with different call
counts cancel out setup and teardown, as for the instruction count (see
`examples/src/bin/callcost.rs` for the commands). Given a second pair of runs (another
build), it prints the difference by function instead. With `--lines`, by source line
instead of by function: code inlined into a function counts at its own file and line, so a
line of a hash table's lookup says which table's lookup it was only by the function named
after it. With 1,000 connections the misses are a long tail of lines that each touch one
per-connection structure once; this view shows which.

usage:
  misses_per_call.py [--lines] SMALL LARGE CALLS_BETWEEN [ROWS]
  misses_per_call.py [--lines] SMALL LARGE OTHER_SMALL OTHER_LARGE CALLS_BETWEEN [ROWS]

Figures are per call: Ir (instructions), and last-level misses (data reads, data writes and
instruction reads that missed the simulated last level). Run-to-run noise of the total is
about 3 misses per call with 1,000 connections: compare two pairs of each build before
trusting a smaller difference.
"""

import os
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


def by_line(path):
    """`file:line (function)` -> [Ir, LL misses] (self cost), read from the callgrind file
    itself: `callgrind_annotate` gives lines only for files it can open, and names inlined
    code's lines after the function they were inlined into."""
    names = {}
    costs = defaultdict(lambda: [0, 0])
    index = None
    file = inlined = function = None
    line = 0
    call_cost = False

    def name(kind, text):
        # `(id) name` defines a compressed name, `(id)` refers to one.
        m = re.match(r"\((\d+)\)(?:\s+(.*))?", text)
        if not m:
            return text
        if m.group(2):
            names[(kind, m.group(1))] = m.group(2)
        return names.get((kind, m.group(1)), "?")

    with open(path) as f:
        for raw in f:
            text = raw.rstrip("\n")
            if text.startswith("events:"):
                events = text.split()[1:]
                index = [events.index(e) for e in EVENTS]
            elif text.startswith("fl="):
                file, inlined = name("file", text[3:]), None
            elif text.startswith(("fi=", "fe=")):
                inlined = name("file", text[3:])
            elif text.startswith("fn="):
                function = name("fn", text[3:])
            elif text.startswith(("cfi=", "cfl=")):
                name("file", text[4:])
            elif text.startswith("cfn="):
                name("fn", text[4:])
            elif text.startswith("calls="):
                # The next cost line is the call's inclusive cost, not this line's own.
                call_cost = True
            elif text and (text[0].isdigit() or text[0] in "+-*"):
                fields = text.split()
                position = fields[0]
                if position[0] in "+-":
                    line += int(position)
                elif position != "*":
                    line = int(position)
                if call_cost:
                    call_cost = False
                    continue
                values = [int(x) for x in fields[1:]]
                values += [0] * (len(events) - len(values))
                own = [values[i] for i in index]
                where = re.sub(r"^/rustc/[0-9a-f]+/", "", inlined or file)
                where = where.removeprefix(os.getcwd() + "/")
                key = f"{where}:{line} ({function})"
                costs[key][0] += own[0]
                costs[key][1] += sum(own[1:])
    if index is None:
        sys.exit(f"{path}: not a callgrind output file")
    return costs


def per_call(small, large, calls, by=by_function):
    """Function (or line) -> [Ir, misses] per call, and the totals per call."""
    a, b = by(small), by(large)
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
    by, what = by_function, "function"
    if argv[:1] == ["--lines"]:
        by, what, argv = by_line, "file:line (function)", argv[1:]
    if len(argv) in (3, 4):
        small, large, calls = argv[0], argv[1], float(argv[2])
        rows_n = int(argv[3]) if len(argv) == 4 else 30
        rows, ir, misses = per_call(small, large, calls, by)
        print(f"per call: {ir:,.1f} instructions, {misses:.1f} last-level misses")
        print(f"{'misses':>7} {'Ir':>8}  {what}")
        for name, (fir, fm) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:rows_n]:
            print(f"{fm:7.1f} {fir:8.0f}  {name[:140]}")
    elif len(argv) in (5, 6):
        calls = float(argv[4])
        rows_n = int(argv[5]) if len(argv) == 6 else 30
        before, ir_a, miss_a = per_call(argv[0], argv[1], calls, by)
        after, ir_b, miss_b = per_call(argv[2], argv[3], calls, by)
        print(
            f"per call: {ir_a:,.1f} -> {ir_b:,.1f} instructions, "
            f"{miss_a:.1f} -> {miss_b:.1f} last-level misses"
        )
        print(f"{'change':>7} {'misses':>15} {'Ir':>17}  {what}")
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
