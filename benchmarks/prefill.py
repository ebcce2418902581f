"""Encoder (ViT) attention measurement: inputs, our kernel's launch, SDPA's backends beside it,
one shape's row, and the sweep that writes the encoder kernel's table.

Times are medians of ``triton.testing.do_bench`` (ms); TFLOP/s counts 4·B·S²·H·D (halved when
causal) at the real head dim, so padding shows as lost throughput. ``ratio`` is the fastest
SDPA backend's time over ours (> 1: we are faster).

The sweep times (BLOCK_M, BLOCK_N, num_warps, num_stages, TMA or pointer loads) per head-dim
split on B=1 S=3520 H=16, non-causal, compiling the candidates in the compile pool first. Its
table: one rule per split, ``{"match": {"split": "64+16"}, "config": {...}, "points": [...]}``
(the candidate with the least summed time over the split's head dims; ``points``: its time and
the best of any candidate per head dim), followed by the rules of the table in force that
match no measured split (the fallbacks for every other launch), written through
``mla_ops.tuning.format_table``.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from benchmarks import compile_pool, harness
from benchmarks.shapes import PREFILL_TARGET_RATIO, prefill_tflops

SDPA_BACKENDS = ("default", "flash", "efficient", "cudnn")
# "mla": the launch the table picks; "mla-triton" / "mla-gluon": the portable kernel / the sm_90
# Gluon kernel forced through config={"family": ...} (the gluon one errors, and the row says
# why, where that kernel cannot run the shape).
MLA_BACKENDS = ("mla", "mla-triton", "mla-gluon")
BACKENDS = MLA_BACKENDS + tuple(f"sdpa-{b}" for b in SDPA_BACKENDS)
# Causal rows of the encoder benchmark: name -> (batch, seq, heads, head_dim).
PREFILL_CAUSAL_SHAPES = {"C7": (4, 4096, 16, 72), "C8": (4, 4096, 16, 80)}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# --- the launch ---------------------------------------------------------------------------------


def make_inputs(batch, seq, heads, head_dim, dtype=torch.bfloat16, device="cuda"):
    total = batch * seq
    q, k, v = (torch.randn(total, heads, head_dim, dtype=dtype, device=device) for _ in range(3))
    o = torch.empty_like(q)
    b_start = torch.arange(batch, dtype=torch.int32, device=device) * seq
    b_len = torch.full((batch,), seq, dtype=torch.int32, device=device)
    return q, k, v, o, b_start, b_len


def family_config(backend: str, overrides: dict | None) -> dict | None:
    """The ``config=`` of an ``mla*`` backend: the overrides, with the family it forces."""
    if backend == "mla":
        return overrides or None
    return {**(overrides or {}), "family": backend[len("mla-"):]}


def mla_fn(inputs, seq, causal, config: dict | None):
    """``(fn, launch config)``: ``fn`` launches the kernel directly with the launch
    ``context_attention_fwd`` would make (``config`` laid over the table's): the portable
    ``context_attention_kernel``, or the Gluon kernel where the launch is of that family."""
    from mla_ops.prefill import launch as L
    from mla_ops.prefill.kernels import context_attention_kernel

    q, k, v, o, b_start, b_len = inputs
    lau = L.build_launch(q, k, v, o, b_start, b_len, seq, causal, config=config or None)
    if lau.copied or lau.family == "gluon":  # aligned copies, or the Gluon launcher's descriptors
        return (lambda: L.run_launch(lau)), lau.config
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


def launch_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Config keys the command line sets."""
    ov: dict[str, Any] = {}
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
    if args.config:
        ov.update(args.config)
    return ov


def bench_shape(name, batch, seq, heads, head_dim, args, overrides, device,
                causal: bool | None = None) -> dict:
    """One shape: ours (each ``mla*`` backend asked for) and each SDPA backend timed in the same
    process, ours checked against the reference. ``causal`` defaults to ``args.causal``."""
    causal = args.causal if causal is None else causal
    inputs = make_inputs(batch, seq, heads, head_dim, DTYPES[args.dtype], device)
    row = {"shape": name, "B": batch, "S": seq, "H": heads, "D": head_dim, "causal": causal,
           "dtype": args.dtype}
    backends = BACKENDS if args.backend == "all" else tuple(args.backend.split(","))
    if device != "cuda":  # the interpreter cannot run Gluon
        backends = tuple(be for be in backends if be != "mla-gluon")
    for be in backends:
        try:
            if be in MLA_BACKENDS:
                fn, cfg = mla_fn(inputs, seq, causal, family_config(be, overrides))
                row["config" if be == "mla" else f"{be}_config"] = cfg
            else:
                fn = sdpa_fn(inputs, batch, seq, causal, be[len("sdpa-"):])
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            ms = harness.time_ms(fn, device, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
        except Exception as exc:  # noqa: BLE001 - a backend that does not support this shape
            row[f"{be}_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            continue
        row[f"{be}_ms"] = ms
        row[f"{be}_tflops"] = prefill_tflops(batch, seq, heads, head_dim, causal, ms)
    sdpa = [row[f"{be}_ms"] for be in backends if be.startswith("sdpa") and f"{be}_ms" in row]
    if sdpa:
        row["sdpa_best_ms"] = min(sdpa)
        for be in MLA_BACKENDS:
            if f"{be}_ms" in row:
                row["ratio" if be == "mla" else f"{be}_ratio"] = min(sdpa) / row[f"{be}_ms"]
        if "mla_ms" in row:
            row["target_ratio"] = PREFILL_TARGET_RATIO.get(head_dim)
            row["meets_target"] = (row["target_ratio"] is None
                                   or row["ratio"] >= row["target_ratio"])
    # Correctness beside the timing: a wrong fast kernel is not a result.
    if seq <= 4096:
        from mla_ops.reference import context_attention_ref

        q, k, v, o, b_start, b_len = inputs
        ref = None
        n = min(seq, 512)  # check the first sequence's first 512 queries against all keys
        for be in MLA_BACKENDS:
            if f"{be}_ms" not in row:
                continue
            if ref is None:
                ref = context_attention_ref(q[:seq], k[:seq], v[:seq], b_start[:1], b_len[:1],
                                            causal, query_chunk=512)
            o.fill_(float("nan"))  # the output of this call, not a stale one
            mla_fn(inputs, seq, causal, family_config(be, overrides))[0]()
            key = "max_abs_err" if be == "mla" else f"{be}_max_abs_err"
            row[key] = (o[:n].float() - ref[:n]).abs().max().item()
    del inputs
    return row


TABLE_COLUMNS = (["shape", "B", "S", "D", "causal"] + [f"{be}_ms" for be in BACKENDS]
                 + ["mla_tflops", "ratio", "mla-triton_ratio", "mla-gluon_ratio", "target_ratio"])

# --- the sweep ----------------------------------------------------------------------------------

# Representative head dims of each split the sm_90 table keys on, and the candidates.
SWEEP_SPLITS = {(64, 0): [64], (64, 16): [72, 80], (64, 32): [96], (128, 0): [128],
                (256, 0): [256]}
SWEEP_SHAPE = (1, 3520, 16)  # batch, seq, heads
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
# --interpret: one split, two candidates, a tiny shape.
INTERPRET_SWEEP = ({(64, 16): [72]}, (1, 32, 1), [(16, 16, 4, 1, False), (32, 16, 4, 1, False)])


def cand_config(c) -> dict:
    return dict(BLOCK_M=c[0], BLOCK_N=c[1], num_warps=c[2], num_stages=c[3], tma=c[4])


def split_fact(split: tuple[int, int]) -> str:
    """How the tables name a split (``mla_ops.prefill.configs.prefill_facts``)."""
    from mla_ops.prefill.configs import prefill_facts

    return prefill_facts(0, split, True, False)["split"]


def compile_job(spec: dict) -> None:
    """The compile pool's job: one candidate launched once on a small input."""
    from mla_ops.prefill.launch import context_attention_fwd

    q, k, v, o, b_start, b_len = make_inputs(1, spec["seq"], spec["heads"], spec["head_dim"],
                                             DTYPES[spec["dtype"]], spec["device"])
    context_attention_fwd(q, k, v, o, b_start, b_len, spec["seq"], False,
                          config=cand_config(spec["cand"]))


def sweep(args: argparse.Namespace, device: str, env: dict) -> tuple[list[dict], list[dict], str]:
    """``(rules, measurements, source)`` of a sweep (module docstring)."""
    splits, (batch, seq, heads), cands = (INTERPRET_SWEEP if args.interpret else
                                          (SWEEP_SPLITS, SWEEP_SHAPE, None))

    def cands_of(split):
        return cands or (CANDIDATES_256 if split == (256, 0) else CANDIDATES)

    specs = {(d, c): {"head_dim": d, "cand": c, "seq": min(seq, 256), "heads": heads,
                      "dtype": args.dtype, "device": device}
             for split, dims in splits.items() for d in dims for c in cands_of(split)}
    done = compile_pool.precompile(compile_job, specs, args.jobs if device == "cuda" else 0)
    failed = {k: v[1] for k, v in done.items() if v[0] != "ok"}
    measurements = []
    for split, dims in splits.items():
        for d in dims:
            inputs = make_inputs(batch, seq, heads, d, DTYPES[args.dtype], device)
            for c in cands_of(split):
                rec = {"D": d, "cand": c}
                if (d, c) in failed:
                    rec["error"] = failed[(d, c)]
                else:
                    try:
                        fn, _ = mla_fn(inputs, seq, False, cand_config(c))
                        ms = harness.time_ms(fn, device, warmup_ms=5, rep_ms=30)
                        rec.update(ms=ms, tflops=prefill_tflops(batch, seq, heads, d, False, ms))
                    except Exception as exc:  # noqa: BLE001
                        rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
                measurements.append(rec)
            del inputs
    rules = choose_rules(splits, measurements)
    source = (f"benchmarks/benchmark_vit_prefill_attn.py --sweep on {env.get('gpu') or 'cpu'} "
              f"(B={batch} S={seq} H={heads} {args.dtype} non-causal, do_bench medians), "
              f"{env['date'][:10]}")
    return rules, measurements, source


def choose_rules(splits: dict, measurements: list[dict]) -> list[dict]:
    """Per split, the candidate with the least summed time over the split's head dims (among
    those timed on all of them), as a rule with its evidence."""
    rules = []
    for split, dims in splits.items():
        per_cand: dict[tuple, dict[int, float]] = {}
        for m in measurements:
            if m["D"] in dims and "ms" in m:
                per_cand.setdefault(tuple(m["cand"]), {})[m["D"]] = m["ms"]
        complete = {c: sum(t.values()) for c, t in per_cand.items() if len(t) == len(dims)}
        if not complete:
            continue
        best = min(complete, key=complete.get)
        points = [{"head_dim": d, "ms": round(per_cand[best][d], 5),
                   "best_ms": round(min(t[d] for t in per_cand.values() if d in t), 5),
                   "candidates": sum(1 for t in per_cand.values() if d in t)} for d in dims]
        rules.append({"match": {"split": split_fact(split)}, "config": cand_config(best),
                      "points": points})
        print(f"sweep: split {split_fact(split)} dims {dims}: best {best} "
              f"{complete[best]:.4f} ms", flush=True)
    return rules


def table_with(rules: list[dict], arch: str, source: str, env: dict) -> str:
    """The table text: the Gluon-family rules of ``arch``'s table in force (the sweep times the
    portable kernel only; they stay first, under the ``gluon`` fact), ``rules``, then the
    portable rules in force that match no split ``rules`` measured; validated by the tuning
    module."""
    from mla_ops import tuning
    from mla_ops.prefill.configs import KERNEL

    measured = {r["match"]["split"] for r in rules}
    current = tuning.table(KERNEL.name, arch)["rules"]
    gluon = [r for r in current if r["config"].get("family") == "gluon"]
    kept = [r for r in current if r["config"].get("family", "triton") != "gluon"
            and r.get("match", {}).get("split") not in measured]
    return tuning.format_table(KERNEL.name, arch, gluon + rules + kept, source, env)
