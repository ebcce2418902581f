"""Encoder (ViT) attention: our kernel launched directly, beside PyTorch SDPA's backends.

    PYTHONPATH=. python3 benchmarks/benchmark_vit_prefill_attn.py --shape all --json out.json
    PYTHONPATH=. python3 benchmarks/benchmark_vit_prefill_attn.py --seq 3520 --heads 16 \
        --head-dim 72 --bm 128 --bn 64 --nw 8 --ns 3
    PYTHONPATH=. python3 benchmarks/benchmark_vit_prefill_attn.py --sweep   # rewrites the sm_90 table

Times are medians of ``triton.testing.do_bench`` (ms); TFLOP/s counts 4·B·S²·H·D (halved when
causal) at the real head dim, so padding shows as lost throughput. ``ratio`` is the fastest
SDPA backend's time over ours (> 1: we are faster). The sweep searches (BLOCK_M, BLOCK_N,
num_warps, num_stages, TMA or pointer loads) per head-dim split, compiling candidates in parallel worker processes
first (Triton's disk cache is shared), then timing them one by one in this process.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks._common import env_info, measure_ceilings, print_table, time_do_bench, write_json  # noqa: E402

# ANCHORS.md prefill table, in its order: (batch, seq, heads, head_dim).
SHAPES = {
    "P1": (1, 3520, 16, 64),
    "P2": (1, 3520, 16, 72),
    "P3": (1, 3520, 16, 80),
    "P4": (1, 3520, 16, 96),
    "P5": (1, 3520, 16, 128),
    "P6": (1, 3520, 16, 256),
    "P7": (4, 4096, 16, 72),
    "P8": (4, 4096, 16, 80),
}
# ANCHORS.md targets, as a multiple of SDPA's fastest backend's speed.
TARGET_RATIO = {64: 1.0, 72: 1.2, 80: 1.2, 96: 1.0, 128: 1.0, 256: 0.8}
SDPA_BACKENDS = ("default", "flash", "efficient", "cudnn")
BACKENDS = ("mla",) + tuple(f"sdpa-{b}" for b in SDPA_BACKENDS)

# Sweep: representative head dims of each split the sm_90 table keys on, and the candidates.
SWEEP_SPLITS = {(64, 0): [64], (64, 16): [72, 80], (64, 32): [96], (128, 0): [128], (256, 0): [256]}
CANDIDATES = [  # (BLOCK_M, BLOCK_N, num_warps, num_stages, K/V through TMA descriptors)
    (128, 64, 8, 2, False), (128, 64, 8, 3, False), (128, 128, 8, 2, False), (128, 64, 4, 3, False),
    (64, 64, 4, 3, False),
    (128, 64, 8, 2, True), (128, 64, 8, 3, True), (128, 64, 8, 4, True), (128, 128, 8, 2, True),
    (128, 128, 8, 3, True), (128, 64, 4, 3, True), (64, 64, 4, 3, True),
]
CANDIDATES_256 = [
    (128, 32, 8, 2, True), (128, 64, 8, 2, True), (128, 32, 8, 3, True), (64, 64, 4, 2, True),
    (64, 32, 4, 2, True), (128, 32, 8, 2, False), (64, 64, 4, 2, False), (128, 64, 8, 1, False),
]


def cand_overrides(c) -> dict:
    return dict(BLOCK_M=c[0], BLOCK_N=c[1], num_warps=c[2], num_stages=c[3], tma=c[4])


def make_inputs(batch, seq, heads, head_dim, dtype=torch.bfloat16, device="cuda"):
    total = batch * seq
    q, k, v = (torch.randn(total, heads, head_dim, dtype=dtype, device=device) for _ in range(3))
    o = torch.empty_like(q)
    b_start = torch.arange(batch, dtype=torch.int32, device=device) * seq
    b_len = torch.full((batch,), seq, dtype=torch.int32, device=device)
    return q, k, v, o, b_start, b_len


def mla_fn(inputs, seq, causal, overrides):
    """A closure launching ``context_attention_kernel`` directly with the launch we would make."""
    from mla_ops.prefill import launch as L
    from mla_ops.prefill.kernels import context_attention_kernel

    q, k, v, o, b_start, b_len = inputs
    with L.launch_overrides(**overrides):
        lau = L.build_launch(q, k, v, o, b_start, b_len, seq, causal)
    grid, kwargs = lau.grid, lau.kwargs
    if kwargs["USE_TMA"]:
        L._ensure_allocator()
    return (lambda: context_attention_kernel[grid](**kwargs)), lau.config


def sdpa_fn(inputs, batch, seq, causal, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, _, _, _ = inputs
    # [B*S, H, D] -> [B, H, S, D] views, as a ViT calls SDPA (no copies).
    qs, ks, vs = (t.view(batch, seq, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
    f = torch.nn.functional.scaled_dot_product_attention
    if backend == "default":
        return lambda: f(qs, ks, vs, is_causal=causal)
    which = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def run():
        with sdpa_kernel([which]):
            return f(qs, ks, vs, is_causal=causal)

    return run


def tflops(batch, seq, heads, head_dim, causal, ms):
    flops = 4.0 * batch * seq * seq * heads * head_dim * (0.5 if causal else 1.0)
    return flops / (ms * 1e-3) / 1e12


def overrides_from(args) -> dict:
    ov = {}
    for key, val in (("BLOCK_M", args.bm), ("BLOCK_N", args.bn), ("num_warps", args.nw),
                     ("num_stages", args.ns), ("waves_per_eu", args.we)):
        if val is not None:
            ov[key] = val
    if args.tma is not None:
        ov["tma"] = bool(args.tma)
    if args.no_hint:
        ov["aligned"] = False
    if args.no_split:
        ov["split_head_dim"] = False
    return ov


def bench_shape(name, batch, seq, heads, head_dim, args, overrides):
    inputs = make_inputs(batch, seq, heads, head_dim)
    row = {"shape": name, "B": batch, "S": seq, "H": heads, "D": head_dim, "causal": args.causal}
    backends = BACKENDS if args.backend == "all" else tuple(args.backend.split(","))
    for be in backends:
        try:
            if be == "mla":
                fn, cfg = mla_fn(inputs, seq, args.causal, overrides)
                row["config"] = cfg
            else:
                fn = sdpa_fn(inputs, batch, seq, args.causal, be[len("sdpa-"):])
            fn()
            torch.cuda.synchronize()
            ms = time_do_bench(fn, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
        except Exception as exc:  # a backend that does not support this shape
            row[f"{be}_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            continue
        row[f"{be}_ms"] = ms
        row[f"{be}_tflops"] = tflops(batch, seq, heads, head_dim, args.causal, ms)
    sdpa = [row[f"{be}_ms"] for be in backends if be.startswith("sdpa") and f"{be}_ms" in row]
    if sdpa and "mla_ms" in row:
        row["sdpa_best_ms"] = min(sdpa)
        row["ratio"] = min(sdpa) / row["mla_ms"]
        row["target_ratio"] = TARGET_RATIO.get(head_dim)
        row["meets_target"] = row["target_ratio"] is None or row["ratio"] >= row["target_ratio"]
    # Correctness beside the timing: a wrong fast kernel is not a result.
    if "mla_ms" in row and seq <= 4096:
        from mla_ops.reference import context_attention_ref

        q, k, v, o, b_start, b_len = inputs
        mla_fn(inputs, seq, args.causal, overrides)[0]()
        n = min(seq, 512)  # check the first sequence's first 512 queries against all keys
        ref = context_attention_ref(q[:seq], k[:seq], v[:seq], b_start[:1], b_len[:1], args.causal,
                                    query_chunk=512)
        row["max_abs_err"] = (o[:n].float() - ref[:n]).abs().max().item()
    del inputs
    return row


# --- sweep ------------------------------------------------------------------------------------


def _compile_one(job):
    """Worker: compile (and launch once, tiny) one candidate, filling Triton's disk cache."""
    head_dim, cand = job
    from mla_ops.prefill import launch as L

    try:
        q, k, v, o, b_start, b_len = make_inputs(1, 256, 16, head_dim)
        with L.launch_overrides(**cand_overrides(cand)):
            L.context_attention_fwd(q, k, v, o, b_start, b_len, 256, False)
        torch.cuda.synchronize()
        return job, None
    except Exception as exc:
        return job, f"{type(exc).__name__}: {str(exc)[:200]}"


def sweep(args):
    jobs = []
    for split, dims in SWEEP_SPLITS.items():
        cands = CANDIDATES_256 if split == (256, 0) else CANDIDATES
        jobs += [(d, c) for d in dims for c in cands]
    t0 = time.time()
    failed = {}
    with cf.ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn")) as ex:
        for job, err in ex.map(_compile_one, jobs):
            if err:
                failed[job] = err
    print(f"sweep: compiled {len(jobs)} candidates in {time.time() - t0:.1f}s ({len(failed)} failed)", flush=True)
    batch, seq, heads = 1, 3520, 16
    results = []
    best_rules = []
    for split, dims in SWEEP_SPLITS.items():
        cands = CANDIDATES_256 if split == (256, 0) else CANDIDATES
        per_cand = {}
        for d in dims:
            inputs = make_inputs(batch, seq, heads, d)
            for c in cands:
                if (d, c) in failed:
                    results.append({"D": d, "cand": c, "error": failed[(d, c)]})
                    continue
                fn, _ = mla_fn(inputs, seq, False, cand_overrides(c))
                try:
                    ms = time_do_bench(fn, warmup_ms=5, rep_ms=30)
                except Exception as exc:
                    results.append({"D": d, "cand": c, "error": f"{type(exc).__name__}: {exc}"[:200]})
                    continue
                results.append({"D": d, "cand": c, "ms": ms,
                                "tflops": tflops(batch, seq, heads, d, False, ms)})
                per_cand.setdefault(c, []).append(ms)
            del inputs
        complete = {c: sum(v) for c, v in per_cand.items() if len(v) == len(dims)}
        if not complete:
            continue
        c = min(complete, key=complete.get)
        best_rules.append({"match": {"split": list(split)}, **cand_overrides(c)})
        print(f"sweep: split {split} dims {dims}: best {c} {complete[c]:.4f} ms", flush=True)
    from mla_ops.prefill import configs

    table = {
        "about": "sm_90 launch table written by benchmarks/benchmark_vit_prefill_attn.py --sweep "
                 f"(B={batch} S={seq} H={heads} bf16 non-causal, do_bench medians)",
        "env": env_info(),
        "rules": list(configs.SM90_FALLBACK) + best_rules,
        "measurements": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.table_out)), exist_ok=True)
    with open(args.table_out, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    print(f"sweep: wrote {args.table_out}")
    print_table([{"D": r["D"], "cand": str(r["cand"]), "ms": r.get("ms", float("nan")),
                  "tflops": r.get("tflops", float("nan"))} for r in results],
                ["D", "cand", "ms", "tflops"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default=None, help="P1..P8 (comma-separated) or 'all'")
    p.add_argument("--seq", type=int, default=3520)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=72)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--backend", default="all",
                   help="comma-separated of " + ", ".join(BACKENDS) + "; or 'all' (default). "
                        "TRITON_ATTN is an alias of mla")
    p.add_argument("--bm", type=int)
    p.add_argument("--bn", type=int)
    p.add_argument("--nw", type=int)
    p.add_argument("--ns", type=int)
    p.add_argument("--we", type=int, help="waves_per_eu (HIP only)")
    p.add_argument("--tma", type=int, choices=(0, 1), help="K/V through tensor descriptors (1) or pointers (0)")
    p.add_argument("--no-hint", action="store_true", help="drop the HEAD_STRIDE_ALIGNED_8 hint")
    p.add_argument("--no-split", action="store_true", help="pad the head dim to a power of 2")
    p.add_argument("--warmup-ms", type=int, default=25)
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--ceilings", action="store_true", help="measure copy/matmul ceilings too")
    p.add_argument("--json", default=None, help="write results here")
    p.add_argument("--sweep", action="store_true", help="search the sm_90 table and write it")
    p.add_argument("--table-out", default=os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mla_ops", "prefill", "tables", "sm_90.json"))
    p.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    args = p.parse_args(argv)
    args.backend = args.backend.replace("TRITON_ATTN", "mla")

    if args.sweep:
        sweep(args)
        return
    overrides = overrides_from(args)
    if args.shape:
        names = list(SHAPES) if args.shape == "all" else args.shape.split(",")
        shapes = [(n, *SHAPES[n]) for n in names]
    else:
        shapes = [("custom", args.batch, args.seq, args.heads, args.head_dim)]
    ceilings = measure_ceilings() if args.ceilings else None
    rows = []
    for name, b, s, h, d in shapes:
        row = bench_shape(name, b, s, h, d, args, overrides)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        write_json(args.json, rows, ceilings)
    cols = ["shape", "B", "S", "D"] + [f"{be}_ms" for be in BACKENDS] + ["mla_tflops", "ratio", "target_ratio"]
    print_table(rows, cols)


if __name__ == "__main__":
    main()
