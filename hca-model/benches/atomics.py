#!/usr/bin/env python3
"""Counts the atomic instructions a profiled run executed, per function.

This host has no hardware counters, and an atomic read-modify-write or fence (a
lock-prefixed instruction, `xchg`, `mfence`) costs several nanoseconds while counting as
one instruction in callgrind's totals. This reads a callgrind file made with
`--dump-instr=yes`, finds those instructions in each object's `objdump -d`, and sums
their executions.

    valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file=cg.out \\
        target/release/deps/throughput-HASH send --quick
    python3 hca-model/benches/atomics.py cg.out 20000

The second argument (messages in the run) turns the counts into counts per message.
"""

import re
import subprocess
import sys
from collections import Counter, defaultdict

# (`xchg %ax,%ax`, a register with itself, is a two-byte no-op the assembler pads with.)
ATOMIC = re.compile(r"\s*([0-9a-f]+):\s+(lock\b|xchg(?!\s+%(\w+),%\3$)|mfence)")
NAMED = re.compile(r"(c?(?:ob|fn))=\((\d+)\)(?: (.*))?")


def executions(path):
    """(object id, function id, address) -> times executed; and the ids' names."""
    counts = defaultdict(int)
    names = {"ob": {}, "fn": {}}
    ob = fn = None
    addr = 0
    after_call = False
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            m = NAMED.match(line)
            if m:
                kind, ident, name = m.groups()
                if name:
                    names[kind.lstrip("c")][ident] = name
                if kind == "ob":
                    ob = ident
                elif kind == "fn":
                    fn = ident
                continue
            if line.startswith("calls="):
                # The next cost line is the call's inclusive cost, not executions.
                after_call = True
                continue
            if not line or line[0] not in "0123456789+-*":
                continue
            fields = line.split()
            pos = fields[0]
            if pos.startswith("0x"):
                addr = int(pos, 16)
            elif pos[0] == "+":
                addr += int(pos[1:], 0)
            elif pos[0] == "-":
                addr -= int(pos[1:], 0)
            if after_call:
                after_call = False
                continue
            if len(fields) >= 3:
                counts[(ob, fn, addr)] += int(fields[2])
    return counts, names


def atomic_addresses(obj):
    out = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", obj], capture_output=True, text=True
    ).stdout
    return {int(m.group(1), 16) for m in map(ATOMIC.match, out.splitlines()) if m}


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    counts, names = executions(sys.argv[1])
    per = int(sys.argv[2]) if len(sys.argv) == 3 else 1
    atomics = {
        ob: atomic_addresses(path)
        for ob, path in names["ob"].items()
        if path.startswith("/")
    }
    by_fn = Counter()
    for (ob, fn, addr), n in counts.items():
        if addr in atomics.get(ob, ()):
            by_fn[names["fn"].get(fn, fn)] += n
    for name, n in by_fn.most_common():
        if n / per >= 0.01:
            print(f"{n / per:8.2f}  {name[:120]}")
    print(f"{sum(by_fn.values()) / per:8.2f}  in all")


if __name__ == "__main__":
    main()
