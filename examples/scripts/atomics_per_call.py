#!/usr/bin/env python3
"""Atomic read-modify-write instructions executed per call, by function.

An atomic read-modify-write (a `lock`-prefixed instruction, or an `xchg` with memory: every
lock and unlock, reference count, task wake) cost about 7 ns on the VM of earlier sessions
and about 2 ns on the AMD EPYC VM of 2026-11-29, a cost callgrind's instruction counts do
not show. This counts them exactly: callgrind records
how often each instruction ran (`--dump-instr=yes`), objdump says which instructions are
atomic. Two runs with different call counts cancel out setup and teardown, as for the
instruction count (see `examples/src/bin/callcost.rs` for the commands).

usage: atomics_per_call.py BINARY CALLGRIND_OUT_SMALL CALLGRIND_OUT_LARGE CALLS_BETWEEN [ROWS]
"""

import re
import subprocess
import sys
from collections import Counter

# `lock add`, `lock cmpxchg`, `lock xadd`, ...; and `xchg` with a memory operand, which is
# atomic without the prefix.
LOCKED = re.compile(r"^lock\s+(\w+)")
XCHG_MEMORY = re.compile(r"^xchg\s+\S*\(")


def atomic_instructions(binary):
    """Address -> (function, mnemonic) for every atomic read-modify-write in `binary`."""
    listing = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "-C", binary],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = {}
    function = "?"
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            function = header.group(1)
            continue
        insn = re.match(r"^\s+([0-9a-f]+):\s+(.*)$", line)
        if not insn:
            continue
        text = insn.group(2)
        locked = LOCKED.match(text)
        if locked:
            found[int(insn.group(1), 16)] = (function, locked.group(1))
        elif XCHG_MEMORY.match(text):
            found[int(insn.group(1), 16)] = (function, "xchg")
    return found


def executions(callgrind_out, binary, atomic):
    """(function, mnemonic) -> times run, from a `--dump-instr=yes --compress-pos=no
    --compress-strings=no` callgrind file, counting the binary's own code only."""
    counts = Counter()
    in_binary = False
    call_cost_next = False
    for line in open(callgrind_out):
        if line.startswith("ob="):
            in_binary = line[3:].strip().endswith(binary.split("/")[-1])
            continue
        if line.startswith("calls="):
            # The line after `calls=` is the call's inclusive cost, not an instruction's.
            call_cost_next = True
            continue
        if not line.startswith("0x"):
            continue
        if call_cost_next:
            call_cost_next = False
            continue
        if not in_binary:
            continue
        fields = line.split()
        address = int(fields[0], 16)
        if address in atomic and len(fields) >= 3:
            # One Ir per execution: the instruction's cost is how often it ran.
            counts[atomic[address]] += int(fields[2])
    return counts


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    binary, small, large, calls = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    rows = int(sys.argv[5]) if len(sys.argv) > 5 else 40
    atomic = atomic_instructions(binary)
    before = executions(small, binary, atomic)
    after = executions(large, binary, atomic)
    per_call = {key: (after[key] - before.get(key, 0)) / calls for key in after}
    total = sum(per_call.values())
    for (function, mnemonic), n in sorted(per_call.items(), key=lambda kv: -kv[1])[:rows]:
        if n >= 0.01:
            print(f"{n:7.2f}  {mnemonic:8}  {function[:140]}")
    print(f"{total:7.2f}  atomic read-modify-writes per call")


if __name__ == "__main__":
    main()
