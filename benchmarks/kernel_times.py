#!/usr/bin/env python3
"""Per-kernel GPU times of decode-verify launches: each case's launch (the table's config, or
``--variant``'s overrides) captured ``--calls`` times in one CUDA graph, one replay traced by
``torch.profiler``; each kernel's mean time per call, the replay's time per call and the largest
gap between kernels. Splits a launch's time into stage 1, stage 2 and the gaps between them,
which ``ab_decode_verify.py`` (the whole launch) cannot.

    python benchmarks/kernel_times.py --shape M2 M3 --case 16,4,32,4096 16,1,32,4096,fp8 \\
        --variant '{"STAGE_OUT": 1}' --json kernel_times.json

``--flashmla`` adds, where ``flash_mla`` imports and FlashMLA's dense kernel serves the case
(bf16, page 64), the same capture and trace of FlashMLA's call (``row["flashmla"]``): its main
kernel and its combine beside our stage 1 and stage 2, on the same card in the same process.

``--timeline`` adds, for a launch whose stage 1 is the Gluon family's, one more eager call with
the CTA timeline probe on (``gluon_launch.cta_timeline``; the call after the one that compiles
it): each CTA's request, split, SM, start
and end in µs from the launch's first start (``timeline.ctas``), the launch's span, the SMs it
used and their share of idle time, and the CTAs that end last: how the CTAs were dispatched,
where the per-kernel times say only how long the launch took. The swap-AB and seesaw schedules
also mark when a CTA's Q tile landed, its block loop ended and its output was stored
(``timeline.phases_us``: the median CTA's time in each); the balanced grid marks its CTAs' first
two segments too (``timeline.boundary_us``: what a segment boundary costs, and where).

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
    p.add_argument("--rotate", type=cli.positive, default=1, metavar="N",
                   help="N copies of the cache, a call on each in turn (N > 1: no KV in L2 from the call before)")
    p.add_argument("--spread", action="store_true",
                   help="request lengths drawn uniformly from [qlen, L] (decode.spread_lengths)")
    p.add_argument("--timeline", action="store_true",
                   help="each Gluon stage-1 CTA's SM, start and end (one more eager call)")
    p.add_argument("--flashmla", action="store_true",
                   help="FlashMLA's kernels too, where flash_mla imports and serves the case")
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


def kernel_times(api: decode.Api, case: Case, overrides: dict, calls: int, spread: bool = False,
                 timeline: bool = False, flashmla=None, rotate: int = 1) -> dict:
    import torch

    cfg = decode.effective_config(api, case, overrides or None)
    splits = decode.default_splits(api, case, cfg)
    inp = decode.make_inputs(case, "cuda", torch.bfloat16, rotate=rotate)
    if spread:
        decode.spread_lengths(inp, case)
    fn = decode.make_call(api, inp, case.qlen, splits, DEFAULT_SM_SCALE, case.page_size, overrides or None)
    prof = captured_profile(fn, calls, rotate)
    fm = None
    if flashmla is not None and decode.flashmla_applies(case, "bf16", "cuda"):
        fm = captured_profile(decode.flashmla_call(flashmla, inp, case, DEFAULT_SM_SCALE)[0], calls, rotate)
    row = {"shape": case.name or case.label, "num_kv_splits": splits, "config": cfg,
           "overrides": overrides, "lens": "spread" if spread else "equal", "per_call_us": prof["per_call_us"],
           "rotate": rotate, "kernels_us": prof["kernels_us"], "max_gap_us": prof["max_gap_us"],
           "timeline_us": prof["timeline_us"]}
    if fm is not None:
        row["flashmla"] = fm
    if timeline:
        row["timeline"] = cta_timeline(api, case, cfg, splits, inp, overrides)
    return row


def captured_profile(fn, calls: int, copies: int = 1) -> dict:
    """``fn`` (one launch per cache copy: ``copies`` launches) compiled, captured ``calls`` times
    in one CUDA graph and one replay traced: ``harness.kernel_profile``'s time per launch,
    kernels, largest gap and (a few launches) timeline."""
    import torch

    fn()  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    prof = harness.kernel_profile(graph.replay, calls * copies)
    return {k: prof[k] for k in ("per_call_us", "kernels_us", "max_gap_us", "timeline_us")}


def cta_timeline(api: decode.Api, case: Case, cfg: dict, splits: int, inp, overrides: dict) -> dict | None:
    """One eager call of ``case``'s launch with the CTA probe on (the module's docstring);
    None where its stage 1 is not the Gluon family's."""
    import torch

    from mla_ops.decode_verify import gluon_launch
    from mla_ops.decode_verify.splits import balanced_piece_order

    if cfg.get("family") != "gluon":
        return None
    row_blocks = gluon_launch.gluon_row_blocks(case.qlen, case.H)
    grid = row_blocks * case.B * splits
    on_grid = cfg.get("GRID") and gluon_launch.grid_takes(cfg, case.qlen, case.H, fp8=case.fp8, tree=False,
                                                          ragged=False, context_parallel=False, single=splits == 1)
    if on_grid:  # the balanced grid: one CTA per SM
        grid = api.sm_count
    buf = torch.full((grid, gluon_launch.TIMELINE_SLOTS), -1, dtype=torch.int64, device="cuda")
    fn = decode.make_call(api, inp, case.qlen, splits, DEFAULT_SM_SCALE, case.page_size, overrides or None,
                          kv_index=0)
    with gluon_launch.cta_timeline(buf):
        fn()  # compiles the kernel with the probe; the GPU idles meanwhile
        fn()  # the call the timeline shows
    torch.cuda.synchronize()
    pieces = None
    if on_grid:  # each CTA named by its first segment's (request, slot) (splits.grid_segments)
        from mla_ops.decode_verify.splits import grid_segments

        segs = grid_segments(inp.seq_lens.clamp(min=0).tolist(), grid, splits, cfg["BLOCK_N"], cfg["REQUEST_COST"])
        return summarize_timeline(buf.cpu().tolist(), 1, case.B, splits,
                                  [(s[0][0], s[0][1]) if s else (-1, -1) for s in segs])
    if cfg.get("BALANCE") and splits > 1:
        keys = inp.seq_lens.clamp(min=0).tolist()
        pieces = balanced_piece_order(keys, splits, cfg["BALANCE"])
    return summarize_timeline(buf.cpu().tolist(), row_blocks, case.B, splits, pieces)


# The balanced grid's marks of a CTA's first two segments (``gluon_kernels._cta_mark_segment``),
# five per segment, in the order of ``marks[pid][6:16]``.
SEGMENT_EVENTS = ("q_asked", "block_asked", "q_landed", "loop_done", "stored")


def summarize_timeline(marks: list, row_blocks: int, batch: int, splits: int,
                       pieces: list | None = None) -> dict:
    """``marks[pid] = [start, end, SM, Q landed, loop done, output stored, *segments]`` (ns; the
    last three -1 where the schedule does not mark them, ``gluon_kernels._cta_mark``) of every
    CTA -> the timeline's summary and its CTAs ``[pid, request, split, SM, start, end, Q, loop,
    stored]`` (µs from the first start; None where not marked). A launch orders its CTAs (row
    block, request, split); a balanced one (``pieces``, its ``(request, slot)`` order:
    ``splits.balanced_piece_order``) (row block, piece), request -1 past the pieces. The idle
    share counts one CTA at a time per SM, as the Gluon stage 1 runs. ``phases_us``: the
    median over the marked CTAs of start -> Q, Q -> loop done, loop -> stored, stored -> end.

    The balanced grid also marks its CTAs' first two segments (``marks[pid][6:16]``,
    :data:`SEGMENT_EVENTS` each): each CTA row then ends with those ten times, and
    ``boundary_us`` is the median, over the CTAs of two segments or more, of what passes
    between them, from the first segment's loop done: its output stored (``store``), the
    producer asking for the second segment's Q and first block (``q_asked``, ``block_asked``;
    negative where before), and the second segment's Q landed and facts read (``q_landed``)."""
    t0 = min(m[0] for m in marks)

    def us(t):
        return round((t - t0) / 1e3, 3) if t >= 0 else None

    def median(xs):
        xs = sorted(xs)
        return round(xs[len(xs) // 2], 3)

    segmented = any(t >= 0 for m in marks for t in m[6:16])
    ctas = []
    for pid, m in enumerate(marks):
        start, end, sm = m[:3]
        if pieces is not None:
            piece = pid // row_blocks
            req, split = pieces[piece] if piece < len(pieces) else (-1, -1)
        else:
            req, split = pid // (row_blocks * splits), (pid // row_blocks) % splits
        row = [pid, req, split, sm, us(start), us(end)] + [us(t) for t in (list(m[3:6]) + [-1] * 3)[:3]]
        if segmented:
            row += [us(t) for t in (list(m[6:16]) + [-1] * 10)[:10]]
        ctas.append(row)
    span = max(c[5] for c in ctas)
    sms = sorted({c[3] for c in ctas})
    busy = sum(c[5] - c[4] for c in ctas)
    last = sorted(ctas, key=lambda c: c[5])[-5:][::-1]
    marked = [c for c in ctas if None not in c[6:9]]
    phases = None
    if marked:
        phases = {"to_q": median(c[6] - c[4] for c in marked), "loop": median(c[7] - c[6] for c in marked),
                  "store": median(c[8] - c[7] for c in marked), "to_end": median(c[5] - c[8] for c in marked)}
    out = {"span_us": span, "ctas_n": len(ctas), "sms": len(sms),
           "idle_share": round(1 - busy / (len(sms) * span), 4) if span > 0 else 0.0,
           "phases_us": phases, "last": last}
    if segmented:
        two = [dict(zip(SEGMENT_EVENTS, c[9:14])) | {"next": dict(zip(SEGMENT_EVENTS, c[14:19]))} for c in ctas
               if None not in c[9:19]]
        out["boundary_us"] = None if not two else {
            "ctas": len(two),
            "store": median(s["stored"] - s["loop_done"] for s in two),
            **{k: median(s["next"][k] - s["loop_done"] for s in two) for k in ("q_asked", "block_asked", "q_landed")}}
    out["ctas"] = ctas
    return out


def short_name(name: str) -> str:
    """A kernel's name without its template arguments, signature and namespaces."""
    return name.split("(")[0].split("<")[0].split("::")[-1].strip()[:32]


def print_timeline(timeline: list) -> None:
    """Each kernel's start and end (µs from the first start) of a capture of a few launches."""
    if timeline:
        print("      " + ", ".join(f"{short_name(n)} {a:.2f}-{b:.2f}" for n, a, b in timeline), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if cli.pick_device(False, PROG) is None:
        return 2
    api = decode.load_api()
    env = results.env_info()
    cli.banner("decode_verify kernel times", env)
    flashmla = decode.load_flashmla() if args.flashmla else None
    if args.flashmla and flashmla is None:
        print("note: flash_mla does not import here: no FlashMLA rows", flush=True)
    rows = []
    for case in [SHAPES[n].case for n in args.shape] + list(args.case):
        row = kernel_times(api, case, args.overrides, args.calls, args.spread, args.timeline, flashmla,
                           args.rotate)
        rows.append(row)
        kernels = ", ".join(f"{short_name(n)} {t:.2f}" for n, t in row["kernels_us"].items())
        print(f"  {row['shape']:32s} splits {row['num_kv_splits']:3d}: {row['per_call_us']:8.2f} us per call "
              f"({kernels}; largest gap {row['max_gap_us']:.2f})", flush=True)
        print_timeline(row["timeline_us"])
        fm = row.get("flashmla")
        if fm:
            kernels = ", ".join(f"{short_name(n)} {t:.2f}" for n, t in fm["kernels_us"].items())
            print(f"  {'  FlashMLA':32s}            {fm['per_call_us']:8.2f} us per call ({kernels}; "
                  f"largest gap {fm['max_gap_us']:.2f})", flush=True)
            print_timeline(fm["timeline_us"])
        tl = row.get("timeline")
        if tl:
            pid, req, split, sm, start, end = tl["last"][0][:6]
            print(f"    timeline: {tl['ctas_n']} CTAs on {tl['sms']} SMs over {tl['span_us']:.2f} us, "
                  f"idle {tl['idle_share']:.1%}; last: request {req} split {split} on SM {sm}, "
                  f"{start:.2f}-{end:.2f} us", flush=True)
            if tl["phases_us"]:
                print("    median CTA: " + ", ".join(f"{k} {v:.2f}" for k, v in tl["phases_us"].items()) + " us",
                      flush=True)
            if tl.get("boundary_us"):
                b = tl["boundary_us"]
                print(f"    segment boundary (median of {b['ctas']} CTAs, from the first loop's end): "
                      + ", ".join(f"{k} {v:.2f}" for k, v in b.items() if k != "ctas") + " us", flush=True)
    cli.write_rows(args.json, rows, command=results.command_line(PROG, argv), env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
