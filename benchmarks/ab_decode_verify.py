#!/usr/bin/env python
"""A/B of decode-verify launch variants: for each shape, every variant is checked against the
fp32 reference and timed in the same process, interleaved, and reported as a ratio to the first
(the selected table config unless the first variant overrides it). Timings are noisy across
runs; ratios inside one run are what NOTES.md compares.

A variant is a JSON object of config overrides (``configs.VERIFY_DEFAULT_CONFIG`` keys, or
``"family"``) with an optional ``"splits"`` (``num_kv_splits``; default
``verify_num_kv_splits`` for its BLOCK_H and SPLIT_WORK), ``"logits_cols"`` (the split
workspace's row width, default Lv + 1 = 513; 528 makes each partial row start 32-byte aligned)
and ``"name"``; ``{}`` is the table as selected. A variant the tuning module refuses (e.g.
SWAP_AB with one stage on CUDA) is reported and skipped.

    PYTHONPATH=. python benchmarks/ab_decode_verify.py --shape M1 M2 \
        --variant '{}' '{"TMA": 1}' '{"PERSISTENT": 1}' '{"splits": 16, "S2_BLOCK_DV": 128}' \
        --json $OUT/ab.json

``--case H,qlen,B,L[,fp8]`` adds other shapes (``--case 16,4,1,8192,fp8``: the grid's
``H16-q4-B1-L8192-fp8-p64``); named with ``--case`` alone, only those run.

``--cache bf16 fp8`` runs each named shape with each listed cache instead of its own (M7 with a
bf16 cache beside its fp8 one); a shape with another cache than its own is labelled as a grid
point (``H128-q2-B16-L32768-bf16-p64``).

``--spread`` gives the requests lengths drawn uniformly from ``[qlen, L]`` (seeded; a batch as
serving sees it, mean about L / 2) instead of L each: where balanced splits (``BALANCE``) differ
from the split count of equal lengths. Bandwidth and FLOP rates are then of the drawn lengths.

``--rounds N`` times each variant N times, round-robin (median of each round's graph-replay
median is reported, with the spread), so that a drift of the machine hits all variants alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import cli  # noqa: E402  (first: --interpret must precede triton's import)
from benchmarks import compile_pool, decode, harness, results  # noqa: E402
from benchmarks.shapes import (  # noqa: E402
    DEFAULT_SM_SCALE,
    INTERPRET_CASE,
    SHAPES,
    flops,
    grid_points,
    parse_case,
    unique_bytes,
)

PROG = "ab_decode_verify.py"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", nargs="+", metavar="NAME",
                   help="named shapes (M1 ... M7, comma or space separated; default all)")
    p.add_argument("--case", nargs="+", default=[], type=parse_case, metavar="H,qlen,B,L[,fp8]",
                   help="other shapes (heads, verify tokens, batch, keys, fp8 for an fp8 cache), "
                        "after the named ones; with --case alone, no named shape runs")
    p.add_argument("--grid", action="store_true",
                   help="the representative grid instead (H 16/128 x qlen 1/2/4 x (B, L) in "
                        "(1, 8k), (32, 4k), (128, 4k), (16, 32k) x bf16/fp8)")
    p.add_argument("--cache", nargs="+", choices=("bf16", "fp8"),
                   help="each named shape with each of these caches instead of its own")
    p.add_argument("--variant", nargs="+", default=["{}"], help="JSON config overrides")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--spread", action="store_true",
                   help="request lengths drawn uniformly from [qlen, L] instead of L each")
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--no-prequeue", action="store_true",
                   help="also time each variant from an idle GPU (host launch latency included)")
    cli.add_jobs(p, "min(8, CPUs - 1)")
    cli.add_common(p)
    args = p.parse_args(argv)
    if args.interpret and (args.shape or args.case):
        p.error("--interpret runs a tiny shape on the CPU; the named shapes need a GPU")
    if args.grid and args.case:
        p.error("--case and --grid: one or the other")
    if args.cache and (args.grid or args.interpret):
        p.error("--cache applies to the named shapes (the grid has both caches)")
    args.shape = cli.split_names(p, args.shape, list(SHAPES)) or ([] if args.case else list(SHAPES))
    try:
        args.variants = [json.loads(v) for v in args.variant]
    except json.JSONDecodeError as e:
        p.error(f"--variant: {e}")
    if not all(isinstance(v, dict) for v in args.variants):
        p.error("--variant: each variant is a JSON object")
    return args


def resolve_variant(api: decode.Api, case, v: dict) -> tuple[str, dict, int, dict]:
    """``(label, overrides, splits, config)``; raises the tuning module's ValueError."""
    v = dict(v)
    label = v.pop("name", None) or (json.dumps(v, sort_keys=True) if v else "table")
    splits = v.pop("splits", None)
    cfg = decode.effective_config(api, case, v)
    return label, v, splits or decode.default_splits(api, case, cfg), cfg


def resolve_cases(args: argparse.Namespace) -> list:
    """The cases ``args`` name: the interpreter's one, the grid, or the named shapes (each with
    every ``--cache``: its own keeps its name, another cache makes it a grid-style point)."""
    if args.interpret:
        return [INTERPRET_CASE]
    if args.grid:
        return grid_points(qlens=(1, 2, 4))
    cases = []
    for n in args.shape:
        case = SHAPES[n].case
        for cache in args.cache or [case.cache]:
            fp8 = cache == "fp8"
            cases.append(case if fp8 == case.fp8 else dataclasses.replace(case, fp8=fp8, name=None))
    return cases + list(args.case)


def main(argv: Sequence[str] | None = None) -> int:
    argv, args, device = cli.start(argv, parse_args, PROG)
    if device is None:
        return 2
    import torch

    dtype = "fp16" if args.interpret else "bf16"
    cases = resolve_cases(args)
    api = decode.load_api()
    env = results.env_info()
    cli.banner("decode_verify A/B", env)
    variants: dict = {}  # case -> [(label, overrides, splits, config)]
    rows = []
    for case in cases:
        variants[case] = []
        for v in args.variants:
            try:
                variants[case].append(resolve_variant(api, case, v))
            except ValueError as e:
                print(f"  {case.label}: variant {json.dumps(v)} refused: {e}")
                rows.append({"shape": case.name or case.label, "variant": json.dumps(v),
                             "error": str(e)})
    if device == "cuda":
        jobs = compile_pool.default_jobs() if args.jobs is None else args.jobs
        specs = [decode.compile_spec(c, dtype, s, over)
                 for c, vs in variants.items() for _l, over, s, _c in vs]
        compile_pool.precompile(decode.compile_job, decode.specs_by_key(specs), jobs, budget_s=400)

    failed = False
    for case, vs in variants.items():
        if not vs:
            continue
        inp = decode.make_inputs(case, device, decode.DTYPES[dtype], seed=args.seed)
        scale = 1.0  # the drawn lengths' share of the full ones (rates below)
        if args.spread:
            scale = decode.spread_lengths(inp, case, args.seed)
        ref = decode.reference(api, inp, case, DEFAULT_SM_SCALE)
        calls = []
        for label, over, splits, cfg in vs:
            fn = decode.make_call(api, inp, case.qlen, splits, DEFAULT_SM_SCALE, case.page_size,
                                  over or None)
            chk = decode.check_call(fn, inp, ref, decode.CHECK_RTOL[dtype])
            failed |= not chk["ok"]
            calls.append((label, over, splits, cfg, fn, chk))
        timers = {c[0]: (lambda fn=c[4]: harness.time_call(fn, device, args.replays)[0])
                  for c in calls}
        if args.no_prequeue:
            timers.update({f"{c[0]} (idle)": (lambda fn=c[4]: harness.time_call(
                fn, device, args.replays, prequeue=False)[0]) for c in calls})
        times = harness.interleaved(timers, args.rounds)
        first = statistics.median(times[calls[0][0]])
        nbytes, nflops = unique_bytes(case, 2) * scale, flops(case) * scale
        print(f"{case.name or '-'} ({case.label}):")
        for label, over, splits, cfg, _fn, chk in calls:
            t = statistics.median(times[label])
            row = {"shape": case.name or case.label, "variant": label, "overrides": over,
                   "lens": "spread" if args.spread else "equal",
                   "num_kv_splits": splits, "config": cfg, "time_us": t,
                   "times_us": times[label], "ratio": t / first,
                   "TBps": nbytes / (t * 1e-6) / 1e12, "TFLOPs": nflops / (t * 1e-6) / 1e12,
                   "check": chk}
            extra = ""
            if args.no_prequeue:
                row["idle_time_us"] = statistics.median(times[f"{label} (idle)"])
                extra = f", from idle {row['idle_time_us']:.1f} us"
            rows.append(row)
            spread = (max(times[label]) - min(times[label])) / t
            print(f"  {label:60s} splits {splits:4d}: {t:8.1f} us (x{t / first:.3f}, spread "
                  f"{spread:.1%}) {row['TBps']:.2f} TB/s {row['TFLOPs']:.0f} TFLOP/s, err "
                  f"{chk['err_o_rel']:.1e}{' FAIL' if not chk['ok'] else ''}{extra}")
        del inp, ref, calls
        if device == "cuda":
            torch.cuda.empty_cache()
    cli.write_rows(args.json, rows, command=results.command_line(PROG, argv), env=env)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
