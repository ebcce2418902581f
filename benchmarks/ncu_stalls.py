#!/usr/bin/env python
"""Where a warp-specialized kernel's warps wait, from Nsight Compute's SASS page with its stall
samples (``ncu --import R.ncu-rep --page source --print-source sass --csv``; the profile needs
``--section SourceCounters``). For each partition of the kernel (the SASS between two
``USETMAXREG``; the idle warps that pad a partition to a warpgroup are left out) it prints
its share of the samples, its stall reasons, the share spent waiting on wgmma results
(``WARPGROUP.DEPBAR``) and on each mbarrier (a ``SYNCS.PHASECHK`` poll loop, named by its
shared-memory address as the SASS spells it) and which mbarriers it arrives on, which tells
the ring's ``ready``/``empty`` barriers from the groups' handoffs.

    python benchmarks/ncu_stalls.py ncu_M5_sass.csv [more.csv ...] [--top 8] > stalls.md
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys
from typing import Sequence

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
MIN_SHARE = 0.02  # partitions with fewer of the samples are not printed
IDLE_EXEC = 2048  # a region whose busiest instruction ran fewer times holds only idle warps


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_sass(path: str) -> tuple[str, list[dict]]:
    """(kernel name, one dict per SASS instruction) of an ncu source-page CSV."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    kernel = rows[0][1] if rows and len(rows[0]) > 1 else "?"
    header, body = rows[1], rows[2:]
    return kernel, [dict(zip(header, r)) for r in body]


def partitions(sass: list[dict]) -> list[tuple[int, int]]:
    """[start, end) index ranges between the USETMAXREG instructions."""
    cuts = [i for i, ins in enumerate(sass) if "USETMAXREG" in ins["Source"]]
    bounds = [0] + cuts + [len(sass)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def summarize(path: str, top: int) -> str:
    kernel, sass = read_sass(path)
    stalls = [k for k in sass[0] if k.startswith("stall_") and "(Not Issued)" not in k] if sass else []
    total = sum(_num(i[SAMPLES]) for i in sass) or 1.0
    out = [f"## {path.rsplit('/', 1)[-1]} ({kernel}): {total:.0f} samples", ""]
    idle = 0.0
    for a, b in partitions(sass):
        seg = sass[a:b]
        n = sum(_num(i[SAMPLES]) for i in seg)
        if max(_num(i[EXECUTED]) for i in seg) < IDLE_EXEC:
            idle += n
            continue
        if n / total < MIN_SHARE:
            continue
        reasons = collections.Counter()
        for i in seg:
            for s in stalls:
                reasons[s[len("stall_"):]] += _num(i[s])
        r_total = sum(reasons.values()) or 1.0
        waits, arrives = collections.Counter(), collections.Counter()
        depbar = 0.0
        for k in range(a, b):
            src = seg[k - a]["Source"]
            m = re.search(r"TRYWAIT P\d+, \[([^\]]+)\]", src)
            if m:  # the poll and the branch that loops back to it
                waits[m.group(1)] += _num(sass[k][SAMPLES]) + (_num(sass[k + 1][SAMPLES]) if k + 1 < len(sass) else 0)
            m = re.search(r"SYNCS\.ARRIVE\S* RZ, \[([^\]]+)\]", src)
            if m:
                arrives[m.group(1)] += 1
            if "WARPGROUP.DEPBAR" in src:
                depbar += _num(sass[k][SAMPLES])
        hgmma = sum(1 for i in seg if "HGMMA" in i["Source"])
        out.append(f"- SASS [{a}, {b}): {n / total:.1%} of the samples, {hgmma} HGMMA; "
                   f"mbarrier waits {sum(waits.values()) / n:.0%}, wgmma waits {depbar / n:.0%}; "
                   + ", ".join(f"{k} {v / r_total:.0%}" for k, v in reasons.most_common(5)))
        for addr, v in waits.most_common(top):
            if v / n >= 0.005:
                out.append(f"  - waits on `{addr}`: {v / n:.1%}")
        if arrives:
            out.append("  - arrives on: " + ", ".join(f"`{k}`" for k in sorted(arrives)))
    out.append(f"- idle warps (padding a partition to a warpgroup): {idle / total:.1%} of the samples")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", nargs="+", help="ncu --page source --print-source sass --csv output")
    p.add_argument("--top", type=int, default=8, help="mbarriers listed per partition")
    args = p.parse_args(argv)
    for path in args.csv:
        sys.stdout.write(summarize(path, args.top) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
