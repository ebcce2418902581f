#!/usr/bin/env python
"""Sweep the decode-verify launch space on this GPU and write the table the launcher reads
(``mla_ops/decode_verify/tables/<arch>.json``, or ``--write``): a retune is a data change. The
stages, the checks and how rules are chosen: ``benchmarks/decode_sweep.py``. The budget
(``--budget-s``) covers compiles too; the table and the log are rewritten after every stage,
and ``--resume LOG`` continues a run the budget stopped. ``--quick`` (M1–M7, a smaller space)
needs about a third of the full sweep's compiles.

    PYTHONPATH=. python benchmarks/sweep_decode_verify.py --quick --budget-s 240 \
        --write $OUT/sm_90.json --log $OUT/sweep_log.json

``--interpret`` sweeps a tiny space on a tiny shape on the CPU (no table unless ``--write``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import cli  # noqa: E402  (first: --interpret must precede triton's import)
from benchmarks import compile_pool, decode, results  # noqa: E402
from benchmarks import decode_sweep as ds  # noqa: E402
from benchmarks.shapes import (  # noqa: E402
    DEFAULT_PAGE_SIZE,
    DEFAULT_SM_SCALE,
    GRID_BL,
    GRID_HEADS,
    GRID_QLENS,
    INTERPRET_CASE,
    grid_points,
    tile_points,
)

PROG = "sweep_decode_verify.py"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Sweep the decode-verify launch space and write the per-arch config table.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Table format and search: python -c 'import benchmarks.decode_sweep as s; help(s)'",
    )
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="wall-clock budget for the whole sweep, compiles included")
    p.add_argument("--write", metavar="PATH",
                   help="table path (default mla_ops/decode_verify/tables/<arch>.json; under "
                   "--interpret nothing is written unless given)")
    p.add_argument("--log", metavar="PATH", default="sweep_decode_verify_log.json",
                   help="JSON log of every measured point")
    p.add_argument("--resume", metavar="LOG", help="start from this log's measurements")
    p.add_argument("--stages", default=",".join(ds.STAGES),
                   help=f"comma-separated subset of {','.join(ds.STAGES)}")
    p.add_argument("--heads", nargs="+", type=int, default=list(GRID_HEADS))
    p.add_argument("--qlen", nargs="+", type=int, default=list(GRID_QLENS))
    p.add_argument("--bl", nargs="+", default=[f"{b}x{L}" for b, L in GRID_BL],
                   help="(batch, seq len) pairs as BxL")
    p.add_argument("--cache", nargs="+", choices=("bf16", "fp8"), default=["bf16", "fp8"])
    p.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE)
    p.add_argument("--sm-scale", type=float, default=DEFAULT_SM_SCALE)
    p.add_argument("--heads-groups", default=ds.DEFAULT_HEADS_GROUPS,
                   help="heads lists of the table's rules, '/'-separated")
    p.add_argument("--qlen-groups", default=ds.DEFAULT_QLEN_GROUPS,
                   help="qlen lists of the table's rules, '/'-separated")
    p.add_argument("--ref-check", choices=("tiles", "all", "none"), default="tiles",
                   help="where the selected config is checked against the fp32 reference")
    cli.add_jobs(p, "CPUs - 2, at most 16")
    p.add_argument("--max-replays", type=int, default=100)
    p.add_argument("--target-ms", type=float, default=20.0, help="replay time per timing")
    p.add_argument("--quick", action="store_true",
                   help="a smaller space (tile points M1-M7 only, fewer tiles, stages, split "
                   "lengths; one tile per point explored further): about a third of the compiles")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--interpret", action="store_true",
                   help="CPU smoke run through the Triton interpreter: tiny shape and space")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.bl_pairs = [tuple(int(v) for v in s.lower().split("x")) for s in args.bl]
        if any(len(t) != 2 or min(t) < 1 for t in args.bl_pairs):
            raise ValueError
    except ValueError:
        parser.error(f"--bl: expected BxL pairs like 32x4096, got {args.bl}")
    args.stage_list = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in args.stage_list if s not in ds.STAGES]
    if unknown:
        parser.error(f"--stages: unknown {unknown}; choose from {list(ds.STAGES)}")
    try:
        args.heads_group_list = ds.parse_groups(args.heads_groups)
        args.qlen_group_list = ds.parse_groups(args.qlen_groups)
    except ValueError as e:
        parser.error(str(e))
    if args.budget_s <= 0:
        parser.error("--budget-s must be positive")
    if args.jobs is None:
        args.jobs = compile_pool.default_jobs(cap=16, reserve=2)
    args.dtype = "fp16" if args.interpret else "bf16"
    if args.interpret:
        args.jobs = 0
        if "--heads" not in argv:
            c = INTERPRET_CASE
            args.heads, args.qlen, args.bl_pairs, args.cache = [c.H], [c.qlen], [(c.B, c.L)], ["bf16"]
            args.page_size = c.page_size
    for flag, vals, groups in (("--heads", args.heads, args.heads_group_list),
                               ("--qlen", args.qlen, args.qlen_group_list)):
        missing = [v for v in vals if ds.group_of(v, groups) is None]
        if missing:
            parser.error(f"{flag} {missing} are in no {flag}-groups group")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv, args, device = cli.start(argv, parse_args, PROG)
    if device is None:
        return 2
    from mla_ops import platform
    from mla_ops.decode_verify.configs import KERNEL

    budget = ds.Budget(args.budget_s, reserve=8.0 if device == "cuda" else 1.0)
    api = decode.load_api()
    arch = platform.current().arch
    env = results.env_info()
    space = ds.INTERPRET_SPACE if args.interpret else ds.QUICK_SPACE if args.quick else ds.Space()
    grid = grid_points(args.heads, args.qlen, args.bl_pairs,
                       tuple(c == "fp8" for c in args.cache), args.page_size)
    tiles = tile_points(grid, space.named_only)
    write_path = args.write
    if write_path is None and not args.interpret:
        write_path = str(KERNEL.table_dir / f"{arch}.json")
    prior = []
    if args.resume:
        with open(args.resume) as f:
            prior = json.load(f).get("records", [])
    res = ds.Results(prior)
    cli.banner(f"decode_verify sweep ({arch})", env,
               f": {len(grid)} grid points, {len(tiles)} tile points, budget "
               f"{args.budget_s:.0f} s, {args.jobs} compile processes"
               + (f", {len(prior)} records resumed" if prior else ""))

    def sweep_info() -> dict:
        return {"grid": [p.key for p in grid], "tile_points": [p.key for p in tiles],
                "heads_groups": args.heads_group_list, "qlen_groups": args.qlen_group_list,
                "split_findings": ds.split_findings(tiles, res),
                "complete": not runner.out_of_time}

    def write_log():
        if args.log:
            results.write_text(args.log, json.dumps(
                {"format": "sweep_decode_verify log 1", "env": env, "arch": arch,
                 "command": results.command_line(PROG, argv),
                 "args": vars(args),
                 "elapsed_s": round(budget.elapsed(), 1), "sweep": sweep_info(),
                 "records": res.records}, indent=1) + "\n")

    def table_now() -> tuple[list[dict], str]:
        rules = ds.build_rules(grid, res, runner.defaults, args.heads_group_list,
                               args.qlen_group_list)
        measured = sum(1 for p in grid if res.point_times(p.key))
        source = (f"benchmarks/{PROG} on {env.get('gpu')} ({arch}), torch {env['torch']}, triton "
                  f"{env['triton']}, {env['date']}: {measured}/{len(grid)} grid points measured, "
                  f"{len(res.records)} runs, bf16 q, page {args.page_size}"
                  + ("; stopped by its budget (--resume continues it)"
                     if runner.out_of_time else ""))
        return rules, ds.table_text(rules, arch, source, env)

    runner = ds.Runner(api, args, device, res, budget, write_log)
    runner.ref_points = {p.key for p in tiles}
    status = 0
    try:
        for stage in ds.STAGES:
            if stage not in args.stage_list:
                continue
            if budget.left() <= 0:
                runner.out_of_time = True
                break
            tasks = ds.plan_stage(stage, tiles, grid, res, runner.defaults, runner.splits_of,
                                  space, api.sm_count, args.heads_group_list, args.qlen_group_list)
            runner.run_stage(stage, tasks)
            if write_path:
                results.write_text(write_path, table_now()[1])
    except Exception as e:  # noqa: BLE001
        if not compile_pool.is_sticky(e):
            raise
        print(f"ABORT: the CUDA context is lost ({type(e).__name__}: {e}); the log and table "
              "hold what was measured; rerun with --resume", file=sys.stderr)
        status = 3
    finally:
        runner.close()
        write_log()

    rules, text = table_now()
    if write_path and status == 0:
        results.write_text(write_path, text)
        print(f"wrote {write_path}")
    if args.log:
        print(f"wrote {args.log} ({len(res.records)} records)")
    print(f"sweep {'stopped by the budget' if runner.out_of_time else 'complete'} after "
          f"{budget.elapsed():.0f} s" + ("; continue with --resume" if runner.out_of_time else ""))
    ds.print_summary(rules, tiles, res)
    return status


if __name__ == "__main__":
    sys.exit(main())
