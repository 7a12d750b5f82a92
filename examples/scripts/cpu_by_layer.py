#!/usr/bin/env python3
"""CPU time per call by layer and by thread, with few and with many connections, from perf.

Where `misses_per_call.py` counts simulated cache misses, this measures time: `perf record`
samples the CPU (the `cpu-clock` software event, which this VM has; it has no hardware
counters) and each sample is put in the layer of the function it hit. Two runs per
connection count, with different call counts, cancel out connecting and tearing down, as for
the miss counts:

  for c in 64 1000; do for n in 200000 600000; do
    perf record -q -F 2999 -o pf.$c.$n.data \\
      target/perf/callcost --split --calls $n --connections $c --transport doca
  done; done
  python3 examples/scripts/cpu_by_layer.py 400000 \\
    pf.64.200000.data pf.64.600000.data pf.1000.200000.data pf.1000.600000.data

usage:
  cpu_by_layer.py CALLS_BETWEEN FEW_SMALL FEW_LARGE MANY_SMALL MANY_LARGE [FREQUENCY]

FREQUENCY is perf's `-F` (default 2999): samples per second of CPU. Figures are microseconds
of CPU per call, summed over threads (so with client and server on a thread each, a call's
wall time is about half). A sample counts in its own function only: a copy is "copies"
whoever made it. The layers:

  provider          the DOCA software provider (doca-sys), the emulated NIC
  lock waits        std's mutex spinning (`lock_contended`) and futex calls: over `doca://`
                    the provider's one lock (docs/doca.md, "Beneath the framework"), but
                    any contended lock or parked thread counts here
  doca transport    rdma-rpc-core's DOCA transport, and the receive queues transports share
  rpc layers        the rest of rdma-rpc-core: client, server, session, protocol, memory
  copies            memcpy / memmove / memset
  kernel            anything in the kernel (system calls, wake-ups, context switches)
  tokio, harness    the runtime; the benchmark's own code and the generated client
"""

import collections
import re
import subprocess
import sys


def layer(symbol, dso):
    if "lock_contended" in symbol or "futex" in symbol.lower():
        return "lock waits"
    if dso.startswith("[kernel"):
        return "kernel"
    if "doca_sys::software" in symbol or symbol.startswith("doca_"):
        return "provider"
    if "rdma_rpc_core::transport::doca" in symbol or "transport::common" in symbol:
        return "doca transport"
    if "rdma_rpc_core" in symbol:
        return "rpc layers"
    if any(s in symbol for s in ("memmove", "memcpy", "memset")):
        return "copies"
    if any(s in symbol for s in ("malloc", "free", "_int_")):
        return "malloc"
    if "tokio::" in symbol:
        return "tokio"
    if "examples::" in symbol:
        return "harness"
    return "other"


def samples(path):
    """(layer counts, thread counts) of one perf data file. The main thread is the one whose
    id is the process id (the client in `callcost --split`); others are named by their
    offset from it."""
    out = subprocess.run(
        ["perf", "script", "-i", path, "-F", "pid,tid,ip,sym,dso"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    layers, threads = collections.Counter(), collections.Counter()
    row = re.compile(r"\s*(\d+)/(\d+)\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)$")
    for line in out.splitlines():
        m = row.match(line)
        if not m:
            continue
        pid, tid, symbol, dso = m.groups()
        layers[layer(symbol, dso)] += 1
        thread = "main thread" if pid == tid else f"thread {int(tid) - int(pid):+d}"
        threads[thread] += 1
    return layers, threads


def per_call(small, large, calls, frequency):
    """Layer -> µs per call and thread -> µs per call, from a pair of runs."""
    (la, ta), (lb, tb) = samples(small), samples(large)
    scale = 1e6 / frequency / calls

    def diff(a, b):
        return {k: (b[k] - a.get(k, 0)) * scale for k in set(a) | set(b)}

    return diff(la, lb), diff(ta, tb)


def main(argv):
    if len(argv) not in (5, 6):
        sys.exit(__doc__)
    calls = float(argv[0])
    frequency = float(argv[5]) if len(argv) == 6 else 2999.0
    few_layers, few_threads = per_call(argv[1], argv[2], calls, frequency)
    many_layers, many_threads = per_call(argv[3], argv[4], calls, frequency)
    print(f"{'µs of CPU per call':<22} {'few':>7} {'many':>7} {'growth':>7}")
    for table in ((few_layers, many_layers), (few_threads, many_threads)):
        few, many = table
        for name in sorted(set(few) | set(many), key=lambda k: -many.get(k, 0.0)):
            x, y = few.get(name, 0.0), many.get(name, 0.0)
            if abs(x) < 0.005 and abs(y) < 0.005:
                continue
            print(f"  {name:<20} {x:7.2f} {y:7.2f} {y - x:+7.2f}")
        total_few, total_many = sum(few.values()), sum(many.values())
        print(
            f"  {'total':<20} {total_few:7.2f} {total_many:7.2f} "
            f"{total_many - total_few:+7.2f}   few / many {total_few / total_many:.2f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
