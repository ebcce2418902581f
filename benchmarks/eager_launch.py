#!/usr/bin/env python
"""What an eager call costs: per op, shape and entry point, the host time to enqueue one call
(``enqueue``), the time per call until the GPU is done (``wall``, ``calls`` back-to-back calls
without a sync inside, then one), and the same call replayed from a CUDA graph (``graph``: the
kernels alone). Each mla_ops entry is timed on every launch path (``mla_ops.fastpath``): the
C++ replays (``mla_ops._C``, the default where it is loaded), the Python replays, and the full
Python path (``MLA_OPS_TRITON_DISPATCH=1``: checks, tables, Triton's JIT dispatch on every
call); the default path's output is checked bitwise against the full path's. Anchors in the same process: FlashMLA where ``flash_mla`` imports (decode), SDPA cuDNN
and flash (encoder). Entries are interleaved over ``--rounds``; medians.

    PYTHONPATH=. python benchmarks/eager_launch.py --json $OUT/eager_launch.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import cli, decode, harness, prefill, results  # noqa: E402
from benchmarks.shapes import LV, SHAPES, DEFAULT_SM_SCALE  # noqa: E402

PROG = "eager_launch.py"
DECODE = ("M1", "M2", "M6")
ENCODER = {"B1-S1024-D80": (1, 1024, 16, 80), "B1-S3520-D72": (1, 3520, 16, 72),
           "B4-S4096-D80": (4, 4096, 16, 80)}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--decode", nargs="*", default=list(DECODE), metavar="NAME",
                   help=f"decode shapes (default {' '.join(DECODE)})")
    p.add_argument("--encoder", nargs="*", default=list(ENCODER), metavar="NAME",
                   help=f"encoder shapes (default {' '.join(ENCODER)})")
    p.add_argument("--calls", type=cli.positive, default=200, help="back-to-back calls per timing")
    p.add_argument("--rounds", type=cli.positive, default=5, help="interleaved rounds")
    p.add_argument("--interpret", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", help="write the rows (with the environment) here")
    return p.parse_args(argv)


PATHS = ("cpp", "python", "full")  # C++ replays, Python replays, the full Python path


def _paths() -> tuple[str, ...]:
    from mla_ops import fastpath

    return PATHS if fastpath._cpp_route[0] else ("python", "full")


def _use_path(path: str) -> None:
    """Make eager calls take ``path``: the C++ replays (mla_ops._C, the default where it is
    loaded), the Python replays (mla_ops.fastpath without _C), or the full Python path
    (MLA_OPS_TRITON_DISPATCH=1)."""
    from mla_ops import fastpath

    if path == "full":
        os.environ[fastpath.ENV_OFF] = "1"
    else:
        os.environ.pop(fastpath.ENV_OFF, None)
    cpp = fastpath._cpp()
    if cpp is not None and fastpath._static_reason() is None:
        fastpath._cpp_route[0] = path == "cpp"
        if path == "cpp":
            fastpath.sync()
        else:
            cpp.set_state(False, ())


def _full_path(on: bool):
    _use_path("full" if on else _paths()[0])


def time_eager(fn: Callable[[], None], calls: int) -> tuple[float, float]:
    """``(enqueue µs, wall µs)`` per call over ``calls`` back-to-back calls."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e6 / calls, (t2 - t0) * 1e6 / calls


def decode_entries(name: str) -> tuple[dict[str, tuple[Callable, bool]], Callable]:
    """``({entry: (fn, ours)}, outputs)`` of one decode shape."""
    import torch

    import mla_ops

    case = SHAPES[name].case
    inp = decode.make_inputs(case, "cuda", torch.bfloat16)
    kv = inp.kv[0]
    plan = mla_ops.plan_verify(case.B, case.qlen, case.H, case.L, dtype=torch.bfloat16,
                               device="cuda", page_size=case.page_size)
    plan.alloc_workspace()
    plan.warmup(inp.q, kv, inp.o, inp.lse, inp.req_to_token, sm_scale=DEFAULT_SM_SCALE)
    splits = plan.num_kv_splits
    ws = plan.workspace
    args = (inp.q, kv, kv[..., :LV], inp.o, inp.lse, inp.req_to_token, inp.seq_lens, None,
            case.qlen, ws, splits, DEFAULT_SM_SCALE, case.page_size, None)
    entries = {
        "plan.run": (lambda: plan.run(inp.q, kv, inp.o, inp.lse, inp.req_to_token, inp.seq_lens,
                                      sm_scale=DEFAULT_SM_SCALE), True),
        "function": (lambda: mla_ops.decode_attention_fwd_verify(*args), True),
        "op": (lambda: torch.ops.mla.decode_verify(*args), True),
    }
    fm = decode.load_flashmla()
    if fm is not None and decode.flashmla_applies(case, "bf16", "cuda"):
        fn, _ = decode.flashmla_call(fm, inp, case, DEFAULT_SM_SCALE)
        entries["FlashMLA"] = (fn, False)
    return entries, lambda: (inp.o.clone(), inp.lse.clone())


def encoder_entries(name: str) -> tuple[dict[str, tuple[Callable, bool]], Callable]:
    import torch

    import mla_ops

    b, s, h, d = ENCODER[name]
    inputs = prefill.make_inputs(b, s, h, d)
    q, k, v, o, start, lens = inputs
    args = (q, k, v, o, start, lens, s, False, None, None, None, None)
    entries = {
        "function": (lambda: mla_ops.context_attention_fwd(*args), True),
        "op": (lambda: torch.ops.mla.context_attention(*args), True),
        "SDPA cuDNN": (prefill.sdpa_fn(inputs, b, s, False, "cudnn"), False),
        "SDPA flash": (prefill.sdpa_fn(inputs, b, s, False, "flash"), False),
    }
    return entries, lambda: (o.clone(),)


def measure(op: str, shape: str, entries: dict, outputs: Callable, args) -> list[dict]:
    import torch

    timers, rows = {}, {}
    paths = _paths()
    for entry, (fn, ours) in entries.items():
        for path in (paths if ours else (None,)):
            label = entry if path in (None, paths[0]) else f"{entry} ({path} path)"

            def timer(fn=fn, path=path):
                if path is not None:
                    _use_path(path)
                try:
                    fn()
                    return time_eager(fn, args.calls)
                finally:
                    _use_path(paths[0])

            timers[label] = timer
            rows[label] = {"op": op, "shape": shape, "entry": entry,
                           "path": path if ours else "anchor"}
    # Bitwise: a replay runs the kernels the full path runs.
    for entry, (fn, ours) in entries.items():
        if ours:
            _full_path(True)
            fn()
            want = outputs()
            _full_path(False)
            fn()
            fn()
            got = outputs()
            rows[entry]["bitwise_equal_to_full_path"] = all(torch.equal(a, b)
                                                            for a, b in zip(got, want))
    times = harness.interleaved(timers, args.rounds)
    out = []
    for label, row in rows.items():
        enq = [t[0] for t in times[label]]
        wall = [t[1] for t in times[label]]
        fn = entries[row["entry"]][0]
        if row["path"] != "anchor":
            _use_path(row["path"])
        try:
            graph = harness.time_cuda_graph(fn, replays=100, prequeue_cycles=harness.PREQUEUE_CYCLES)
        finally:
            _use_path(paths[0])
        row.update(label=label, enqueue_us=statistics.median(enq), wall_us=statistics.median(wall),
                   graph_us=graph, enqueue_rounds_us=enq, wall_rounds_us=wall)
        out.append(row)
    anchor = next((r for r in out if r["path"] == "anchor"), None)
    for r in out:
        if anchor is not None:
            r["enqueue_vs_" + anchor["entry"].replace(" ", "_")] = r["enqueue_us"] / anchor["enqueue_us"]
        print(f"  {shape:14s} {r['label']:28s} enqueue {r['enqueue_us']:7.1f} us  wall "
              f"{r['wall_us']:7.1f} us  graph {r['graph_us']:7.1f} us"
              + (f"  bitwise {r['bitwise_equal_to_full_path']}" if "bitwise_equal_to_full_path" in r
                 else ""), flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv, args, device = cli.start(argv, parse_args, PROG)
    if device != "cuda":
        print(f"{PROG}: needs a GPU (eager launch costs are a GPU host's)", file=sys.stderr)
        return 2
    import torch

    from mla_ops import fastpath

    env = results.env_info()
    env["launch_path"] = fastpath.path()
    cli.banner("eager launch costs", env, f"; {env['launch_path']}")
    rows = []
    with torch.inference_mode():
        for name in args.decode:
            entries, outputs = decode_entries(name)
            rows += measure("decode_verify", name, entries, outputs, args)
        for name in args.encoder:
            entries, outputs = encoder_entries(name)
            rows += measure("context_attention", name, entries, outputs, args)
    cli.finish(rows, ["op", "shape", "label", "enqueue_us", "wall_us", "graph_us"], args.json,
               command=" ".join([PROG, *argv]), env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
