#!/usr/bin/env python
"""Encoder (ViT) attention: our kernel launched directly beside PyTorch SDPA's backends, and the
sweep that writes the encoder kernel's table (``benchmarks/prefill.py`` says how both measure).

    PYTHONPATH=. python3 benchmarks/benchmark_vit_prefill_attn.py --shape all --ceilings \
        --json out.json   # P1-P8 and the causal C7/C8: the table's launch, the portable and
                          # the Gluon kernel forced (mla-triton, mla-gluon), SDPA's backends
    PYTHONPATH=. python3 benchmarks/benchmark_vit_prefill_attn.py --seq 3520 --heads 16 \
        --head-dim 72 --bm 128 --bn 64 --nw 8 --ns 3
    PYTHONPATH=. python3 benchmarks/benchmark_vit_prefill_attn.py --sweep  # tables/<arch>.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import cli  # noqa: E402  (first: --interpret must precede triton's import)
from benchmarks import compile_pool, harness, prefill, results  # noqa: E402
from benchmarks.shapes import ANCHOR_CEILINGS, PREFILL_INTERPRET, PREFILL_SHAPES  # noqa: E402

PROG = "benchmark_vit_prefill_attn.py"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", nargs="+", default=None,
                   help="P1 ... P8, C7, C8 (causal B4 S4096 at D 72 / 80; comma or space "
                   "separated) or 'all'")
    p.add_argument("--seq", type=int, default=None, help="custom shape (default 3520)")
    p.add_argument("--heads", type=int, default=None, help="custom shape (default 16)")
    p.add_argument("--head-dim", type=int, default=None, help="custom shape (default 72)")
    p.add_argument("--batch", type=int, default=None, help="custom shape (default 1)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--dtype", choices=tuple(prefill.DTYPES), default=None,
                   help="default bf16; fp16 under --interpret")
    p.add_argument("--backend", default="all",
                   help="comma-separated of " + ", ".join(prefill.BACKENDS) + "; or 'all' "
                   "(default). TRITON_ATTN is an alias of mla")
    p.add_argument("--bm", type=int)
    p.add_argument("--bn", type=int)
    p.add_argument("--nw", type=int)
    p.add_argument("--ns", type=int)
    p.add_argument("--we", type=int, help="waves_per_eu (HIP only)")
    p.add_argument("--tma", type=int, choices=(0, 1),
                   help="K/V through tensor descriptors (1) or pointers (0)")
    p.add_argument("--no-hint", action="store_true", help="drop the HEAD_STRIDE_ALIGNED_8 hint")
    p.add_argument("--no-split", action="store_true", help="pad the head dim to a power of 2")
    p.add_argument("--config", type=json.loads, default=None, metavar="JSON",
                   help="config keys laid over the table's, after the flags above: e.g. "
                   "'{\"PIPELINE\": 1, \"PINGPONG\": 0}' with --backend mla-gluon (the Gluon "
                   "kernel's schedules)")
    p.add_argument("--warmup-ms", type=int, default=25)
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--ceilings", action="store_true", help="measure copy/matmul ceilings too")
    p.add_argument("--sweep", action="store_true", help="search the table and write it")
    p.add_argument("--table-out", default=None,
                   help="the sweep's table (default mla_ops/prefill/tables/<arch>.json; under "
                   "--interpret nothing is written unless given)")
    p.add_argument("--log", default=None, help="the sweep's every measurement, as JSON")
    cli.add_jobs(p, "min(12, CPUs)", "--workers")
    cli.add_common(p)
    args = p.parse_args(argv)
    args.backend = args.backend.replace("TRITON_ATTN", "mla")
    unknown = set(args.backend.split(",")) - set(prefill.BACKENDS) - {"all"}
    if unknown:
        p.error(f"--backend: unknown {sorted(unknown)}; choose from {list(prefill.BACKENDS)}")
    args.shape = cli.split_names(p, args.shape, list(PREFILL_SHAPES) + list(prefill.PREFILL_CAUSAL_SHAPES))
    if args.interpret and args.shape:
        p.error("--interpret runs a tiny shape on the CPU; the named shapes need a GPU")
    if args.dtype is None:
        args.dtype = "fp16" if args.interpret else "bf16"
    if args.jobs is None:
        args.jobs = compile_pool.default_jobs(cap=12, reserve=0)
    return args


def shapes(args: argparse.Namespace) -> list[tuple]:
    """``(name, B, S, H, D)`` per shape asked for (the C shapes run causal, every shape with
    ``--causal``)."""
    if args.shape:
        return [(n, *(PREFILL_SHAPES.get(n) or prefill.PREFILL_CAUSAL_SHAPES[n])) for n in args.shape]
    base = PREFILL_INTERPRET if args.interpret else (1, 3520, 16, 72)
    given = (args.batch, args.seq, args.heads, args.head_dim)
    return [("custom", *(g if g is not None else b for g, b in zip(given, base)))]


def run_sweep(args, device, env, command) -> int:
    from mla_ops import platform
    from mla_ops.prefill.configs import KERNEL

    arch = platform.current().arch
    rules, measurements, source = prefill.sweep(args, device, env)
    if not rules:
        print("sweep: no split measured on every head dim; no table written", file=sys.stderr)
        return 1
    text = prefill.table_with(rules, arch, source, env)
    out = args.table_out or (None if args.interpret else str(KERNEL.table_dir / f"{arch}.json"))
    if out:
        results.write_text(out, text)
        print(f"sweep: wrote {out}")
    if args.log:
        results.write_json(args.log, measurements, command=command, env=env)
    results.print_table([{"D": r["D"], "cand": str(r["cand"]), "ms": r.get("ms", float("nan")),
                          "tflops": r.get("tflops", float("nan"))} for r in measurements],
                        ["D", "cand", "ms", "tflops"])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv, args, device = cli.start(argv, parse_args, PROG)
    if device is None:
        return 2
    env = results.env_info()
    command = results.command_line(PROG, argv)
    cli.banner("encoder attention " + ("sweep" if args.sweep else "benchmark"), env)
    if args.sweep:
        return run_sweep(args, device, env, command)
    overrides = prefill.launch_overrides(args)
    ceilings = harness.ceilings(device, True, ANCHOR_CEILINGS) if args.ceilings else None
    rows = []
    for name, b, s, h, d in shapes(args):
        causal = args.causal or name in prefill.PREFILL_CAUSAL_SHAPES
        row = prefill.bench_shape(name, b, s, h, d, args, overrides, device, causal)
        rows.append(row)
        print(json.dumps(row), flush=True)
    cli.finish(rows, prefill.TABLE_COLUMNS, args.json, command=command, env=env,
               ceilings=ceilings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
