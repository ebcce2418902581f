#!/usr/bin/env python
"""A/B of two source trees in one process: the current ``mla_ops`` against a copy of another
tree's (``--base-tree``, e.g. an older commit's ``mla_ops/`` under ``.ab_base/``), imported
side by side (``benchmarks/trees.py``), on the decode grid and the encoder shapes.

Per point both versions run on the same inputs through the public call both have
(``decode_attention_fwd_verify`` with each version's own table config and split cap;
``context_attention_fwd``), each into its own outputs. Their outputs must agree (decode: o
within ``decode.CHECK_RTOL`` of max|o| and lse within ``decode.CHECK_LSE_ATOL``; encoder: o
within 5e-2; all finite), eagerly and again from the captured graphs, so a side that computes
nothing cannot pass for a fast one. Then each side's CUDA graph is timed in ``--rounds`` rounds,
interleaved (A B, B A, A B, ...), each timing the median of ``replays`` prequeued replays
(``harness.time_replays``). Per point: A and B µs (median over rounds), ``ratio`` = median of
the per-round ratios B/A (> 1: the current tree is slower), and its spread (max - min of the
per-round ratios). Per family one line: the median and max ratio over its points.

``--base-tree .`` loads the current tree itself as the base (same vs same: the in-process noise
floor); ``--same`` adds a third side, the current tree loaded again, timed in the same rounds,
so that one run reports both the A/B and its floor (``noise_ratio`` = same/current).

    PYTHONPATH=. python benchmarks/ab_tree.py --base-tree .ab_base --family decode prefill \\
        --same --json $OUT/ab_tree.json

``--case 16,4,1,8192,fp8 ...`` A/Bs those decode points instead of the grid; ``--kernels`` adds
each side's per-kernel GPU times per point (``harness.kernel_profile`` on its captured graph).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import cli  # noqa: E402  (first: --interpret must precede triton's import)
from benchmarks import results  # noqa: E402
from benchmarks.shapes import (  # noqa: E402
    DEFAULT_SM_SCALE,
    INTERPRET_CASE,
    PREFILL_INTERPRET,
    PREFILL_SHAPES,
    SHAPES,
    grid_points,
    parse_case,
)

PROG = "ab_tree.py"
FAMILIES = ("decode", "prefill")
PREFILL_CAUSAL = {"C7": (4, 4096, 16, 72), "C8": (4, 4096, 16, 80)}  # prefill.PREFILL_CAUSAL_SHAPES
PREFILL_ALL = {**PREFILL_SHAPES, **PREFILL_CAUSAL}
PREFILL_ATOL = 5e-2  # ab_prefill.py's: the encoder's variants agree within it
BASE_NAME, SAME_NAME = "mla_ops_ab_base", "mla_ops_ab_same"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-tree", default=".ab_base", metavar="DIR",
                   help="the A side: a tree holding mla_ops/ (default .ab_base; '.' is the "
                        "current tree: same vs same)")
    p.add_argument("--same", action="store_true",
                   help="also time the current tree loaded a second time (the noise floor, "
                        "in the same rounds)")
    p.add_argument("--family", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    p.add_argument("--named", action="store_true",
                   help="decode: M1-M7 only (default: the 48-point grid, H 16/128 x qlen 1/2/4 "
                        "x 4 (B, L) x bf16/fp8)")
    p.add_argument("--case", nargs="+", default=[], type=parse_case, metavar="H,qlen,B,L[,fp8]",
                   help="decode: these points instead of the grid (heads, verify tokens, batch, "
                        "keys, fp8 for an fp8 cache)")
    p.add_argument("--kernels", action="store_true",
                   help="decode: also each side's per-kernel GPU times and ends at every point "
                        "(one profiled replay of its graph after the timing rounds): which "
                        "stage differs")
    p.add_argument("--prefill-shape", nargs="+", metavar="NAME",
                   help="P1 ... P8, C7, C8 (comma or space separated; default all)")
    p.add_argument("--rounds", type=cli.positive, default=10)
    p.add_argument("--replays", type=cli.positive, default=200,
                   help="at most this many graph replays per timing")
    p.add_argument("--target-ms", type=float, default=40.0,
                   help="replays per timing: as many as fit in this (at least 20)")
    p.add_argument("--time-limit-s", type=float, default=420.0,
                   help="points not started by then are skipped (and listed); the JSON is "
                        "written after every point")
    cli.add_jobs(p, "min(8, CPUs - 1)")
    cli.add_common(p)
    args = p.parse_args(argv)
    if args.case and args.named:
        p.error("--case and --named: one or the other")
    if args.interpret and (args.named or args.prefill_shape or args.case):
        p.error("--interpret runs one tiny point per family on the CPU; the shapes need a GPU")
    args.prefill_shape = (cli.split_names(p, args.prefill_shape, list(PREFILL_ALL),
                                          "--prefill-shape") or list(PREFILL_ALL))
    if not os.path.isfile(os.path.join(args.base_tree, "mla_ops", "__init__.py")):
        p.error(f"--base-tree: {args.base_tree} holds no mla_ops/__init__.py")
    return args


# --- sides --------------------------------------------------------------------------------------

class Side:
    """One version of the code: ``label`` (``base`` / ``current`` / ``same``), its package,
    the tree it came from (None: the current package, as imported)."""

    def __init__(self, label: str, tree: str | None, name: str):
        from benchmarks import trees

        self.label, self.tree, self.name = label, tree, name
        self.mod = trees.load(tree, name)
        self.info = {"label": label, **trees.describe(self.mod, tree)}


def load_sides(args) -> list[Side]:
    from benchmarks import trees

    base = os.path.abspath(args.base_tree)
    sides = [Side("base", base, BASE_NAME), Side("current", None, "mla_ops")]
    if args.same:
        sides.append(Side("same", str(trees.ROOT), SAME_NAME))
    return sides


# --- timing -------------------------------------------------------------------------------------

def interleave(timers: dict, rounds: int) -> dict[str, list[float]]:
    """``{label: [one time per round]}``, the order reversed every other round (A B, B A, ...)
    so that neither side always runs first."""
    labels = list(timers)
    times: dict[str, list[float]] = {label: [] for label in labels}
    for r in range(rounds):
        for label in (labels if r % 2 == 0 else labels[::-1]):
            times[label].append(timers[label]())
    return times


def timers_for(fns: dict, device: str, args) -> tuple[dict, dict, int]:
    """``(timers, graphs, replays)``: on a GPU one CUDA graph per side, captured once, each
    timing ``replays`` prequeued replays of it (the count planned from the first side's time);
    on a CPU one call's wall time."""
    from benchmarks import harness

    if device != "cuda":
        return {k: (lambda fn=fn: harness.time_wall_us(fn)) for k, fn in fns.items()}, {}, 1
    import torch

    graphs = {k: harness.capture_graph(fn) for k, fn in fns.items()}
    first = next(iter(graphs.values()))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        first.replay()
    end.record()
    end.synchronize()
    replays, cycles = harness.replay_plan(start.elapsed_time(end) * 1e3 / 3, args.replays,
                                          args.target_ms, prequeue=True)
    timers = {k: (lambda g=g: harness.time_replays(g.replay, replays, cycles))
              for k, g in graphs.items()}
    return timers, graphs, replays


def summarize_times(times: dict[str, list[float]], a: str = "base", b: str = "current") -> dict:
    ratios = [tb / ta for ta, tb in zip(times[a], times[b])]
    ta, tb = statistics.median(times[a]), statistics.median(times[b])
    return {"a_us": ta, "b_us": tb, "ratio": statistics.median(ratios),
            "spread": max(ratios) - min(ratios), "ratios": ratios,
            "a_times_us": times[a], "b_times_us": times[b],
            "a_spread": (max(times[a]) - min(times[a])) / ta,
            "b_spread": (max(times[b]) - min(times[b])) / tb}


def noise_fields(times: dict[str, list[float]]) -> dict:
    if "same" not in times:
        return {}
    s = summarize_times(times, "current", "same")
    return {"same_us": s["b_us"], "noise_ratio": s["ratio"], "noise_spread": s["spread"],
            "noise_ratios": s["ratios"], "same_times_us": times["same"]}


# --- checks -------------------------------------------------------------------------------------

def decode_agreement(outs: dict, rtol: float) -> dict:
    """Every side's (o, lse) finite and within the tolerance of the base side's."""
    import torch

    from benchmarks import decode

    ref_o, ref_lse = outs["base"]
    res = {"ok": True}
    for label, (o, lse) in outs.items():
        finite = bool(torch.isfinite(o).all() and torch.isfinite(lse).all())
        r = decode.judge(decode.compare(o, lse, ref_o, ref_lse), rtol)
        r["finite"] = finite
        r["ok"] = r["ok"] and finite
        res[label] = r
        res["ok"] &= r["ok"]
    return res


def prefill_agreement(outs: dict) -> dict:
    import torch

    ref = outs["base"].float()
    res = {"ok": True}
    for label, o in outs.items():
        finite = bool(torch.isfinite(o).all())
        diff = float((o.float() - ref).abs().max())
        ok = finite and diff == diff and diff <= PREFILL_ATOL
        res[label] = {"max_abs_diff": diff, "finite": finite, "ok": ok}
        res["ok"] &= ok
    return res


def run_checked(fns: dict, outputs: dict, device: str) -> None:
    """Poison every side's outputs with NaN, then run every side once."""
    import torch

    for label, fn in fns.items():
        for t in outputs[label]:
            t.fill_(float("nan"))
        fn()
    if device == "cuda":
        torch.cuda.synchronize()


def replay_checked(graphs: dict, outputs: dict) -> None:
    import torch

    for label, g in graphs.items():
        for t in outputs[label]:
            t.fill_(float("nan"))
        g.replay()
    torch.cuda.synchronize()


# --- the two families ---------------------------------------------------------------------------

def decode_points(args) -> list:
    if args.interpret:
        return [INTERPRET_CASE]
    if args.named:
        return [s.case for s in SHAPES.values()]
    if args.case:
        return list(args.case)
    return grid_points(qlens=(1, 2, 4))


def prefill_points(args) -> list[tuple]:
    """``(name, (B, S, H, D), causal)``."""
    if args.interpret:
        return [("interpret", PREFILL_INTERPRET, False)]
    return [(n, PREFILL_ALL[n], n in PREFILL_CAUSAL) for n in args.prefill_shape]


def decode_plans(sides, cases, device, act) -> dict:
    from benchmarks import trees

    return {(c.key, s.label): trees.decode_launch(s.mod, c, act, device)
            for c in cases for s in sides}


def precompile(sides, dcases, dplans, ppoints, dtype: str, args) -> None:
    from benchmarks import compile_pool, trees

    jobs = compile_pool.default_jobs() if args.jobs is None else args.jobs
    specs: dict = {}
    for c in dcases:
        for s in sides:
            cfg, splits = dplans[(c.key, s.label)]
            k, spec = trees.decode_spec(s.tree, s.name, c, dtype, splits, cfg,
                                        sources=s.info["sources_sha256"])
            specs.setdefault(k, spec)
    for _name, shape, causal in ppoints:
        for s in sides:
            k, spec = trees.prefill_spec(s.tree, s.name, shape, causal, dtype,
                                         sources=s.info["sources_sha256"])
            specs.setdefault(k, spec)
    budget = max(30.0, min(300.0, args.deadline - time.monotonic() - 60.0))
    compile_pool.precompile(trees.compile_job, specs, jobs, budget_s=budget)


def run_decode_point(sides, case, plans, device, dtype: str, args) -> dict:
    import torch

    from benchmarks import decode, trees
    from benchmarks.shapes import LV

    act = decode.DTYPES[dtype]
    inp = decode.make_inputs(case, device, act, seed=args.seed)
    fns, outputs, row = {}, {}, {"family": "decode", "point": case.key,
                                 "shape": case.name or case.key}
    for s in sides:
        cfg, splits = plans[(case.key, s.label)]
        o, lse = torch.empty_like(inp.o), torch.empty_like(inp.lse)
        logits = None if splits == 1 else torch.empty(
            inp.q.shape[0], case.H, splits, LV + 1, dtype=torch.float32, device=device)
        fns[s.label] = trees.decode_call(s.mod, inp, case.qlen, splits, DEFAULT_SM_SCALE,
                                         case.page_size, o, lse, logits)
        outputs[s.label] = (o, lse)
        row[f"{s.label}_config"], row[f"{s.label}_splits"] = cfg, splits
    row["same_launch"] = all(row[f"{s.label}_config"] == row["base_config"]
                             and row[f"{s.label}_splits"] == row["base_splits"] for s in sides)
    rtol = decode.CHECK_RTOL[dtype]
    run_checked(fns, outputs, device)
    row["check"] = decode_agreement(outputs, rtol)
    timers, graphs, replays = timers_for(fns, device, args)
    if graphs:
        replay_checked(graphs, outputs)
        row["graph_check"] = decode_agreement(outputs, rtol)
    times = interleave(timers, args.rounds)
    row.update(replays=replays, **summarize_times(times), **noise_fields(times))
    if args.kernels and graphs:
        from benchmarks import harness

        row["kernels"] = {label: harness.kernel_profile(g.replay) for label, g in graphs.items()}
    row["ok"] = row["check"]["ok"] and row.get("graph_check", {"ok": True})["ok"]
    return row


def run_prefill_point(sides, name, shape, causal, device, dtype: str, args) -> dict:
    import torch

    from benchmarks import prefill, trees

    b, s_len, h, d = shape
    inputs = prefill.make_inputs(b, s_len, h, d, prefill.DTYPES[dtype], device)
    fns, outputs = {}, {}
    for s in sides:
        o = torch.empty_like(inputs[3])
        fns[s.label] = trees.prefill_call(s.mod, inputs, o, s_len, causal)
        outputs[s.label] = (o,)
    row = {"family": "prefill", "point": name, "shape": name, "B": b, "S": s_len, "H": h, "D": d,
           "causal": causal}
    run_checked(fns, outputs, device)
    row["check"] = prefill_agreement({k: v[0] for k, v in outputs.items()})
    timers, graphs, replays = timers_for(fns, device, args)
    if graphs:
        replay_checked(graphs, outputs)
        row["graph_check"] = prefill_agreement({k: v[0] for k, v in outputs.items()})
    times = interleave(timers, args.rounds)
    row.update(replays=replays, **summarize_times(times), **noise_fields(times))
    row["ok"] = row["check"]["ok"] and row.get("graph_check", {"ok": True})["ok"]
    return row


# --- report -------------------------------------------------------------------------------------

def point_line(row: dict) -> str:
    if "error" in row:
        return f"  {row['shape']:28s} ERROR {row['error']}"
    noise = (f"  same/current x{row['noise_ratio']:.4f} (spread {row['noise_spread']:.2%})"
             if "noise_ratio" in row else "")
    launch = "" if row.get("same_launch", True) else "  [launch differs]"
    line = (f"  {row['shape']:28s} base {row['a_us']:9.2f} us  current {row['b_us']:9.2f} us  "
            f"x{row['ratio']:.4f} (spread {row['spread']:.2%}){noise}"
            f"{'' if row['ok'] else '  DISAGREE'}{launch}")
    for label, prof in row.get("kernels", {}).items():
        kernels = ", ".join(f"{name} {us:.2f}" for name, us in prof["kernels_us"].items())
        ends = ", ".join(f"{e:.2f}" for _n, _s, e in prof.get("timeline_us", []))
        line += (f"\n    {label:8s} kernels (us): {kernels}; max gap {prof['max_gap_us']:.2f}"
                 + (f"; ends at {ends}" if ends else ""))
    return line


def family_summary(rows: list[dict]) -> dict:
    """Median and max of the ratios (and of the noise ratios) over a family's timed points."""
    timed = [r for r in rows if "ratio" in r]
    if not timed:
        return {"points": 0}
    top = max(timed, key=lambda r: r["ratio"])
    out = {"points": len(timed), "median_ratio": statistics.median(r["ratio"] for r in timed),
           "max_ratio": top["ratio"], "max_at": top["shape"],
           "min_ratio": min(r["ratio"] for r in timed),
           "disagree": [r["shape"] for r in timed if not r["ok"]]}
    if all("noise_ratio" in r for r in timed):
        worst = max(timed, key=lambda r: abs(r["noise_ratio"] - 1))
        out.update(noise_median_ratio=statistics.median(r["noise_ratio"] for r in timed),
                   noise_max_dev=abs(worst["noise_ratio"] - 1), noise_max_at=worst["shape"])
    return out


def summary_line(family: str, s: dict, skipped: int, errors: int) -> str:
    if not s["points"]:
        return f"{family}: no point timed ({skipped} skipped, {errors} errors)"
    line = (f"{family}: current/base median x{s['median_ratio']:.4f}, max x{s['max_ratio']:.4f} "
            f"({s['max_at']}), min x{s['min_ratio']:.4f} over {s['points']} points")
    if "noise_median_ratio" in s:
        line += (f"; same/current median x{s['noise_median_ratio']:.4f}, max |dev| "
                 f"{s['noise_max_dev']:.2%} ({s['noise_max_at']})")
    if s["disagree"]:
        line += f"; DISAGREE at {s['disagree']}"
    if skipped or errors:
        line += f"; {skipped} skipped, {errors} errors"
    return line


def main(argv: Sequence[str] | None = None) -> int:
    argv, args, device = cli.start(argv, parse_args, PROG)
    if device is None:
        return 2
    args.deadline = time.monotonic() + args.time_limit_s
    import torch

    dtype = "fp16" if args.interpret else "bf16"
    env = results.env_info()
    cli.banner("tree A/B", env)
    sides = load_sides(args)
    for s in sides:
        print(f"  {s.label:8s} {s.info['package']:16s} {s.info['tree']} (sources "
              f"{s.info['sources_sha256']})")
    if sides[0].info["sources_sha256"] == sides[1].info["sources_sha256"]:
        print("  base and current are the same sources: same vs same (the noise floor)")
    command = results.command_line(PROG, argv)
    dcases = decode_points(args) if "decode" in args.family else []
    ppoints = prefill_points(args) if "prefill" in args.family else []
    dplans = decode_plans(sides, dcases, device, torch.float16 if args.interpret
                          else torch.bfloat16)
    if device == "cuda":
        precompile(sides, dcases, dplans, ppoints, dtype, args)

    rows: list[dict] = []
    skipped: dict[str, list[str]] = {f: [] for f in FAMILIES}
    work = ([("decode", c.name or c.key, c) for c in dcases]
            + [("prefill", n, (n, shape, causal)) for n, shape, causal in ppoints])

    def write():
        if args.json:
            summary = {f: family_summary([r for r in rows if r["family"] == f])
                       for f in args.family}
            results.write_json(args.json, rows, command=command, env=env,
                               sides=[s.info for s in sides], summary=summary,
                               skipped=skipped, rounds=args.rounds, dtype=dtype)

    family = None
    for fam, label, what in work:
        if fam != family:
            family = fam
            print(f"{fam}:", flush=True)
        if time.monotonic() > args.deadline:
            skipped[fam].append(label)
            continue
        try:
            if fam == "decode":
                row = run_decode_point(sides, what, dplans, device, dtype, args)
            else:
                row = run_prefill_point(sides, *what, device, dtype, args)
        except Exception as e:  # noqa: BLE001 - one point's failure is a row, not the run
            from benchmarks import compile_pool

            row = {"family": fam, "point": label, "shape": label,
                   "error": compile_pool.short_error(e), "ok": False}
            if compile_pool.is_sticky(e):  # the CUDA context is gone: nothing more can run
                rows.append(row)
                print(point_line(row), flush=True)
                break
        rows.append(row)
        print(point_line(row), flush=True)
        write()
        if device == "cuda":
            torch.cuda.empty_cache()

    print()
    summaries = {}
    for fam in args.family:
        fam_rows = [r for r in rows if r["family"] == fam]
        summaries[fam] = family_summary(fam_rows)
        print(summary_line(fam, summaries[fam], len(skipped[fam]),
                           sum("error" in r for r in fam_rows)))
    write()
    if args.json:
        print(f"wrote {args.json}")
    bad = [r for r in rows if not r["ok"]]
    return 1 if bad or any(skipped.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
