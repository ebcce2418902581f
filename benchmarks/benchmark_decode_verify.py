#!/usr/bin/env python
"""Decode-verify benchmark: the named shapes M1–M7 (or any grid) against this machine's roofline,
the same work fed one row per verify token (qlen = 1), and FlashMLA where ``flash_mla`` imports.

Per shape (printed, and written with ``--json``): the median CUDA-graph replay time (replays
queued behind a GPU sleep, ``--no-prequeue``: from idle), unique bytes, TB/s, TFLOP/s, the
roofline from the ceilings measured in the same run (``shapes.roofline``), the target, and the
qlen=1 feed (``B*qlen`` requests of one row, the block table repeated per token, lengths ``L -
qlen + 1 + t``, its own config and split count) with our speedup over it. Inputs: random q
and cache, pages by a random permutation, page 64, sm_scale 0.1352. A KV that fits in L2 (M1)
is flagged ``*L2``; ``--rotate N`` cycles N cache copies for an L2-cold time.

    PYTHONPATH=. python benchmarks/benchmark_decode_verify.py --shape all --check --json $OUT/d.json
    PYTHONPATH=. python benchmarks/benchmark_decode_verify.py --shape M3 --block-h 64 --num-stages 3
    PYTHONPATH=. python benchmarks/benchmark_decode_verify.py --heads 16 128 --qlen 1 2 4 \
        --batch 32 --seq-len 4096 --fp8
    PYTHONPATH=. python benchmarks/benchmark_decode_verify.py --drafts all --check --json $OUT/t.json

``--drafts`` (ragged draft counts and EAGLE trees, ``shapes.DRAFTS``) times the verify call with
``qo_indptr`` / ``tree_mask`` at H 16 and 128, B 32, L 4096 (or ``--heads`` / ``--batch`` /
``--seq-len``) against the causal verify of the same rows, every request padded to the most
drafts, and the flat one-row-per-token feed with per-row lengths; the table's ``pass`` is the
issue's bar (a tree <= 1.1x the causal verify; a ragged batch faster than the padded one by
>= 0.8 x padded / real rows).

``--interpret`` runs a tiny shape on the CPU through the Triton interpreter (fp16, no graphs,
nominal ceilings): the whole code path, times that mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import time
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import cli  # noqa: E402  (first: --interpret must precede triton's import)
from benchmarks import compile_pool, decode, harness, results  # noqa: E402
from benchmarks.shapes import (  # noqa: E402
    ANCHOR_CEILINGS,
    DEFAULT_PAGE_SIZE,
    DEFAULT_SM_SCALE,
    DRAFT_BATCH,
    DRAFT_HEADS,
    DRAFT_SEQ_LEN,
    DRAFTS,
    INTERPRET_CASE,
    INTERPRET_DRAFTS,
    SHAPES,
    Case,
)

PROG = "benchmark_decode_verify.py"
GRID_FLAGS = ("heads", "qlen", "batch", "seq_len")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Decode-verify benchmark: shapes M1-M7 or any grid, against the roofline, "
        "the one-row-per-token (qlen=1) feed and FlashMLA where it is installed.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="shapes: " + "; ".join(
            f"{n}={s.title}: H{s.case.H} qlen{s.case.qlen} B{s.case.B} L{s.case.L} {s.case.cache}"
            for n, s in SHAPES.items()),
    )
    g = p.add_argument_group("what to run")
    g.add_argument("--shape", nargs="+", metavar="NAME",
                   help="named shapes (M1 ... M7, comma or space separated) or 'all' (the "
                   "default when no grid flag is given)")
    g.add_argument("--heads", nargs="+", type=cli.positive, help="grid: query heads H")
    g.add_argument("--qlen", nargs="+", type=cli.positive, help="grid: verify tokens per request")
    g.add_argument("--batch", nargs="+", type=cli.positive, help="grid: requests B")
    g.add_argument("--seq-len", nargs="+", type=cli.positive,
                   help="grid: KV length L of every request")
    g.add_argument("--fp8", action="store_true", help="grid: fp8 (e4m3fn) cache with k_scale")
    g.add_argument("--drafts", nargs="+", metavar="NAME",
                   help="draft workloads instead of shapes: " + ", ".join(
                       f"{n} ({d.title})" for n, d in DRAFTS.items()) + "; or 'all' (with "
                   "--heads / --batch / --seq-len: default H 16 128, B 32, L 4096)")
    g.add_argument("--page-size", type=cli.positive, default=None,
                   help=f"tokens per cache page (default {DEFAULT_PAGE_SIZE})")
    g.add_argument("--sm-scale", type=float, default=DEFAULT_SM_SCALE)
    g.add_argument("--dtype", choices=("bf16", "fp16"), default=None,
                   help="q/o dtype (default bf16; fp16 under --interpret)")
    decode.add_launch_flags(p)
    o = p.add_argument_group("measurement")
    o.add_argument("--no-baseline", action="store_true", help="skip the qlen=1 feed")
    o.add_argument("--no-flashmla", action="store_true",
                   help="do not time FlashMLA even where flash_mla imports")
    o.add_argument("--no-ceilings", action="store_true",
                   help="skip measuring the ceilings; use the anchors' 4.27 TB/s and 678.5 "
                   "TFLOP/s")
    o.add_argument("--check", action="store_true",
                   help="compare one call (and the baseline's) with the fp32 reference first; "
                   "exit 1 on NaN or a large error")
    o.add_argument("--replays", type=int, default=200, help="most graph replays per timing")
    o.add_argument("--no-prequeue", action="store_true",
                   help="time each replay from an idle GPU, the host's launch latency included "
                   "(the default queues a GPU sleep ahead of the start event, so the time is the "
                   "graph's own, as inside a model's graph; matters for µs-scale shapes like M1)")
    o.add_argument("--rotate", type=cli.positive, default=1,
                   help="N copies of the cache cycled through the graph (L2-cold timing)")
    cli.add_jobs(o, "min(8, CPUs - 1)")
    cli.add_common(o, json_help="write the rows (with env and ceilings) here")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    grid = any(getattr(args, f) is not None for f in GRID_FLAGS)
    args.shape = cli.split_names(parser, args.shape, list(SHAPES))
    args.drafts = cli.split_names(parser, args.drafts, list(DRAFTS), "--drafts")
    if args.drafts is not None and (args.shape is not None or args.qlen is not None):
        parser.error("--drafts sets the draft counts: give neither --shape nor --qlen with it")
    if args.shape is not None:
        if grid:
            parser.error("--shape names fixed shapes: give either --shape or the grid flags "
                         "(--heads --qlen --batch --seq-len)")
        if args.fp8:
            parser.error("--fp8: the named shapes fix their cache dtype (M4, M7 are fp8); use "
                         "the grid flags for another combination")
    if args.interpret and args.shape and args.drafts is None:
        parser.error("--interpret runs a tiny shape on the CPU; the named shapes need a GPU "
                     "(give small grid flags instead)")
    if args.dtype is None:
        args.dtype = "fp16" if args.interpret else "bf16"
    return args


def resolve_cases(args: argparse.Namespace) -> list[Case]:
    """The cases to run, in order: named shapes, the grid's product, or the interpreter's one."""
    page = args.page_size
    if args.shape:
        cases = [SHAPES[n].case for n in args.shape]
    elif any(getattr(args, f) is not None for f in GRID_FLAGS):
        first = INTERPRET_CASE if args.interpret else SHAPES["M1"].case
        page = page or first.page_size
        return [Case(h, q, b, L, args.fp8, page) for h, q, b, L in itertools.product(
            args.heads or [first.H], args.qlen or [first.qlen], args.batch or [first.B],
            args.seq_len or [first.L])]
    elif args.interpret:
        cases = [dataclasses.replace(INTERPRET_CASE, fp8=args.fp8)]
    else:
        cases = [s.case for s in SHAPES.values()]
    return [dataclasses.replace(c, page_size=page) if page else c for c in cases]


def resolve_draft_cases(args: argparse.Namespace) -> list[tuple]:
    """``(drafts, case)`` of the --drafts mode: each workload at each H, B, L of the grid
    (the case's qlen is the workload's most drafts)."""
    if args.interpret:
        d = INTERPRET_DRAFTS
        heads, batches, lens, page = (args.heads or [d["H"]], args.batch or [d["B"]],
                                      args.seq_len or [d["L"]], args.page_size or d["page_size"])
    else:
        heads, batches, lens = (args.heads or list(DRAFT_HEADS), args.batch or [DRAFT_BATCH],
                                args.seq_len or [DRAFT_SEQ_LEN])
        page = args.page_size or DEFAULT_PAGE_SIZE
    return [(DRAFTS[n], Case(h, DRAFTS[n].max_drafts, b, L, args.fp8, page))
            for n in args.drafts for h in heads for b in batches for L in lens]


def run_drafts(args: argparse.Namespace, argv: list[str], device: str) -> int:
    """The --drafts mode: every workload's row, the table, the JSON."""
    api = decode.load_api()
    cases = resolve_draft_cases(args)
    env = results.env_info()
    cli.banner("decode_verify draft workloads", env, f", {len(cases)} case(s)")
    rows = []
    for drafts, case in cases:
        t0 = time.perf_counter()
        row = decode.run_drafts_case(api, drafts, case, args, device)
        rows.append(row)
        print(decode.drafts_line(row, time.perf_counter() - t0), flush=True)
        if device == "cuda":
            import torch

            torch.cuda.empty_cache()
    table, columns = decode.drafts_table(rows)
    cli.finish(rows, columns, args.json, command=results.command_line(PROG, argv), env=env,
               table=table)
    return 0


def compile_specs(api: decode.Api, cases: list[Case], args: argparse.Namespace) -> list[dict]:
    """Every launch the run makes (raises the tuning module's ValueError for a bad config)."""
    return [decode.compile_spec(c, args.dtype, splits, over)
            for case in cases for c, over, _cfg, splits in decode.launches(api, case, args)]


def main(argv: Sequence[str] | None = None) -> int:
    argv, args, device = cli.start(argv, parse_args, PROG)
    if device is None:
        return 2
    if args.drafts is not None:
        return run_drafts(args, argv, device)
    cases = resolve_cases(args)
    api = decode.load_api()
    try:
        specs = compile_specs(api, cases, args)
    except ValueError as e:  # an unknown family, a refused or unknown config key
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    env = results.env_info()
    cli.banner("decode_verify benchmark", env, f", {len(cases)} case(s)")
    ceilings = harness.ceilings(device, not args.no_ceilings, ANCHOR_CEILINGS)
    print(f"ceilings: copy {ceilings['copy_TBps']:.2f} TB/s, bf16 matmul "
          f"{ceilings['bf16_mm_TFLOPs']:.1f} TFLOP/s ({ceilings['source']})")
    l2 = harness.l2_bytes(device)
    flashmla = None if args.no_flashmla or device != "cuda" else decode.load_flashmla()
    if flashmla is not None:
        print(f"FlashMLA from {os.path.dirname(flashmla.__file__)}: timed beside ours on the "
              "bf16 page-64 shapes")
    if device == "cuda":
        jobs = compile_pool.default_jobs() if args.jobs is None else args.jobs
        compile_pool.precompile(decode.compile_job, decode.specs_by_key(specs), jobs)

    rows = []
    for case in cases:
        t0 = time.perf_counter()
        row = decode.run_case(api, case, args, device, ceilings, l2, flashmla)
        rows.append(row)
        print(decode.case_line(case, row, time.perf_counter() - t0), flush=True)
        if device == "cuda":
            import torch

            torch.cuda.empty_cache()

    if any(r.get("kv_fits_l2") for r in rows):
        print("note: '*L2' marks a KV working set that fits in L2 (graph replays re-read it from "
              "L2); --rotate N gives an L2-cold figure")
    table, columns = decode.table(rows)
    cli.finish(rows, columns, args.json, command=results.command_line(PROG, argv), env=env,
               ceilings=ceilings, table=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
