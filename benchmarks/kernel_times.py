#!/usr/bin/env python3
"""Per-kernel GPU times of decode-verify launches: each case's launch (the table's config, or
``--variant``'s overrides) captured ``--calls`` times in one CUDA graph, one replay traced by
``torch.profiler``; each kernel's mean time per call, the replay's time per call and the largest
gap between kernels. Splits a launch's time into stage 1, stage 2 and the gaps between them,
which ``ab_decode_verify.py`` (the whole launch) cannot.

    python benchmarks/kernel_times.py --shape M2 M3 --case 16,4,32,4096 16,1,32,4096,fp8 \\
        --variant '{"STAGE_OUT": 1}' --json kernel_times.json

GPU only (the profiler times CUDA kernels): on a machine without one it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import cli  # noqa: E402
from benchmarks import decode, harness, results  # noqa: E402
from benchmarks.shapes import DEFAULT_SM_SCALE, SHAPES, Case, parse_case  # noqa: E402

PROG = "kernel_times.py"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", nargs="+", default=[], metavar="NAME",
                   help="named shapes (M1 ... M7, comma or space separated)")
    p.add_argument("--case", nargs="+", default=[], type=parse_case, metavar="H,qlen,B,L[,fp8]",
                   help="other shapes: heads, verify tokens, batch, keys, and fp8 for an fp8 cache")
    p.add_argument("--variant", default="{}", help="JSON config overrides (default: the table's)")
    p.add_argument("--calls", type=cli.positive, default=20, help="launches per captured graph")
    p.add_argument("--spread", action="store_true",
                   help="request lengths drawn uniformly from [qlen, L] (decode.spread_lengths)")
    p.add_argument("--json", metavar="PATH", help="write the rows (with the environment) here")
    args = p.parse_args(argv)
    args.shape = cli.split_names(p, args.shape, SHAPES, "--shape") if args.shape else []
    try:
        args.overrides = json.loads(args.variant)
    except json.JSONDecodeError as e:
        p.error(f"--variant: {e}")
    if not isinstance(args.overrides, dict):
        p.error("--variant: a JSON object")
    if not args.shape and not args.case:
        p.error("give --shape and/or --case")
    return args


def kernel_times(api: decode.Api, case: Case, overrides: dict, calls: int, spread: bool = False) -> dict:
    import torch

    cfg = decode.effective_config(api, case, overrides or None)
    splits = decode.default_splits(api, case, cfg)
    inp = decode.make_inputs(case, "cuda", torch.bfloat16)
    if spread:
        decode.spread_lengths(inp, case)
    fn = decode.make_call(api, inp, case.qlen, splits, DEFAULT_SM_SCALE, case.page_size, overrides or None)
    fn()  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    prof = harness.kernel_profile(graph.replay, calls)
    return {"shape": case.name or case.label, "num_kv_splits": splits, "config": cfg,
            "overrides": overrides, "lens": "spread" if spread else "equal", "per_call_us": prof["per_call_us"],
            "kernels_us": prof["kernels_us"], "max_gap_us": prof["max_gap_us"]}


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if cli.pick_device(False, PROG) is None:
        return 2
    api = decode.load_api()
    env = results.env_info()
    cli.banner("decode_verify kernel times", env)
    rows = []
    for case in [SHAPES[n].case for n in args.shape] + list(args.case):
        row = kernel_times(api, case, args.overrides, args.calls, args.spread)
        rows.append(row)
        kernels = ", ".join(f"{n.split('(')[0][:28]} {t:.2f}" for n, t in row["kernels_us"].items())
        print(f"  {row['shape']:32s} splits {row['num_kv_splits']:3d}: {row['per_call_us']:8.2f} us per call "
              f"({kernels}; largest gap {row['max_gap_us']:.2f})", flush=True)
    cli.write_rows(args.json, rows, command=results.command_line(PROG, argv), env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
