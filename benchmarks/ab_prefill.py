#!/usr/bin/env python
"""A/B of encoder-attention launch variants: for each shape, every variant (and the SDPA
backends asked for, as anchors) is timed in the same process, interleaved over ``--rounds``,
checked against the first variant's output, and reported as a ratio to the first. Timings are
noisy across runs; ratios inside one run are what NOTES.md compares.

A variant is a JSON object of config overrides (``{}``: the table as selected;
``{"family": "gluon", "PINGPONG": 0}``: the Gluon kernel's other schedule) with an optional
``"name"``, and ``"check": false`` for an ablation timed but not compared (``EXP2_ABLATE``
replaces exp2 with one FMA: its output is wrong by design). ``--host`` also times the host side of one eager call of each variant (the GPU held
busy by a queued sleep, so the host never waits for it): an encoder run outside a CUDA graph is
host-bound where this exceeds the kernel's time. ``--graph`` times CUDA-graph replays instead
(the kernels alone, as inside a captured model).

    PYTHONPATH=. python benchmarks/ab_prefill.py --shape P2 P7 C7 --sdpa cudnn --host \\
        --variant '{"family": "gluon", "PIPELINE": 0, "PINGPONG": 0}' '{"family": "gluon"}' \\
        --json $OUT/ab_prefill.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import cli  # noqa: E402  (first: --interpret must precede triton's import)
from benchmarks import harness, prefill, results  # noqa: E402
from benchmarks.shapes import PREFILL_INTERPRET, PREFILL_SHAPES  # noqa: E402

PROG = "ab_prefill.py"
SHAPES = {**PREFILL_SHAPES, **prefill.PREFILL_CAUSAL_SHAPES}  # name -> (B, S, H, D)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", nargs="+", metavar="NAME",
                   help="P1 ... P8, C7, C8 (the C shapes causal; comma or space separated; "
                        "default all)")
    p.add_argument("--variant", nargs="+", type=json.loads, default=[{}], metavar="JSON",
                   help="config overrides, one JSON object per variant")
    p.add_argument("--sdpa", nargs="*", default=["cudnn"], choices=prefill.SDPA_BACKENDS,
                   help="SDPA backends timed beside the variants (default cudnn)")
    p.add_argument("--rounds", type=cli.positive, default=5)
    p.add_argument("--rep-ms", type=int, default=100, help="do_bench time per timing")
    p.add_argument("--graph", action="store_true",
                   help="time CUDA-graph replays (the kernels alone) instead of eager do_bench")
    p.add_argument("--host", action="store_true", help="also time each variant's host side")
    cli.add_common(p)
    args = p.parse_args(argv)
    if args.interpret and args.shape:
        p.error("--interpret runs a tiny shape on the CPU; the named shapes need a GPU")
    args.shape = cli.split_names(p, args.shape, list(SHAPES)) or list(SHAPES)
    if not all(isinstance(v, dict) for v in args.variant):
        p.error("--variant: each variant is a JSON object")
    if args.variant[0].get("check", True) is False:
        p.error("--variant: the first variant is the one the others are checked against")
    return args


def host_us(fn, calls: int = 50) -> float:
    """Host microseconds per eager call, the GPU busy behind a queued sleep."""
    import torch

    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU time: longer than the calls' host time
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return us


def main(argv: Sequence[str] | None = None) -> int:
    argv, args, device = cli.start(argv, parse_args, PROG)
    if device is None:
        return 2

    dtype = prefill.DTYPES["fp16" if args.interpret else "bf16"]
    shapes = ({"interpret": PREFILL_INTERPRET} if args.interpret
              else {n: SHAPES[n] for n in args.shape})
    env = results.env_info()
    cli.banner("encoder attention A/B", env)
    rows, failed = [], False
    for name, (b, s, h, d) in shapes.items():
        causal = name in prefill.PREFILL_CAUSAL_SHAPES
        inputs = prefill.make_inputs(b, s, h, d, dtype, device)
        o = inputs[3]
        calls, first_out = [], None
        for v in args.variant:
            v = dict(v)
            label = v.pop("name", None) or (json.dumps(v, sort_keys=True) if v else "table")
            check = v.pop("check", True)
            fn, cfg = prefill.mla_fn(inputs, s, causal, v or None)
            o.fill_(float("nan"))
            fn()
            if first_out is None:
                first_out, err = o.clone(), 0.0
            else:
                err = (o.float() - first_out.float()).abs().max().item()
            # The variants' roundings differ; NaN fails; an ablation is only timed.
            ok = not check or (err == err and err <= 5e-2)
            failed |= not ok
            calls.append((label, fn, {"config": cfg, "max_abs_diff": err, "ok": ok,
                                      "checked": check}))
        if device == "cuda":
            calls += [(f"sdpa-{be}", prefill.sdpa_fn(inputs, b, s, causal, be), {})
                      for be in args.sdpa]
        if args.graph and device == "cuda":
            timers = {label: (lambda fn=fn: harness.time_cuda_graph(fn, replays=100) * 1e-3)
                      for label, fn, _ in calls}
        else:
            timers = {label: (lambda fn=fn: harness.time_ms(fn, device, rep_ms=args.rep_ms))
                      for label, fn, _ in calls}
        times = harness.interleaved(timers, args.rounds)
        first = statistics.median(times[calls[0][0]])
        print(f"{name} (B{b} S{s} H{h} D{d}{' causal' if causal else ''}):")
        for label, fn, extra in calls:
            t = statistics.median(times[label])
            row = {"shape": name, "variant": label, "ms": t, "times_ms": times[label],
                   "ratio": t / first, "spread": (max(times[label]) - min(times[label])) / t,
                   "tflops": prefill.prefill_tflops(b, s, h, d, causal, t), **extra}
            if args.host and device == "cuda":
                row["host_us"] = host_us(fn)
            rows.append(row)
            print(f"  {label:60s} {t:8.4f} ms (x{t / first:.3f}, spread {row['spread']:.1%})"
                  + (f", host {row['host_us']:.0f} us/call" if "host_us" in row else "")
                  + ("" if extra.get("ok", True) else f" FAIL diff {extra['max_abs_diff']:.2e}"))
    cli.write_rows(args.json, rows, command=results.command_line(PROG, argv), env=env)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
