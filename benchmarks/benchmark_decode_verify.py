#!/usr/bin/env python
"""Decode-verify benchmark: the ANCHORS shapes M1–M7 (or any grid) against this machine's roofline
and against the same work fed one row per verify token (qlen = 1).

Per shape it prints and writes (``--json``): the median CUDA-graph replay time, unique bytes,
TB/s, TFLOP/s, the roofline time from the ceilings measured in the same run (copy bandwidth and
bf16 matmul rate, ``_common.measure_ceilings``), the roofline fraction, the ANCHORS target and
pass/fail, and the baseline: the same verify batch as ``B*qlen`` requests of ``qlen = 1`` each
(block table repeated per token, per-token lengths ``L - qlen + 1 + t``), the way an engine
without a verify kernel runs it, with its own default config and split count, and our speedup.

Roofline (ANCHORS.md):
    unique bytes = B*L*576*(2 bf16 | 1 fp8) + q, o, lse once
    FLOPs        = 2*H*(576+512)*sum of row limits
    roofline us  = max(bytes / copy bandwidth, FLOPs / matmul rate)

Inputs: bf16 q (``--dtype``), bf16 or fp8 e4m3fn cache (``--fp8``, with ``k_scale``), Lk=576,
Lv=512, page 64, sm_scale 0.1352, random data (never zeros), pages assigned by a random
permutation, ``seq_lens = L`` for every request. The KV is not rotated: a shape whose KV fits
in L2 (M1: 9.4 MB) is reported as is and flagged ``kv_fits_l2``; ``--rotate N`` cycles N
copies of the cache through the captured graph for an L2-cold figure.

Run on the GPU from the repository root (the full ``--shape all`` run with its baselines and
ceilings takes well under 90 s on an H200, compiles included):

    PYTHONPATH=. python benchmarks/benchmark_decode_verify.py --shape all --check \
        --json benchmarks/results/h200/decode_verify.json
    PYTHONPATH=. python benchmarks/benchmark_decode_verify.py --shape M3 --block-h 64 --num-stages 3
    PYTHONPATH=. python benchmarks/benchmark_decode_verify.py --heads 16 128 --qlen 1 2 4 \
        --batch 32 --seq-len 4096 --fp8

On a CPU, ``--interpret`` runs a tiny shape through the Triton interpreter (fp16, no graphs,
nominal ceilings): it exercises the whole code path, its times mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import pathlib
import sys
import time
from typing import Any, Callable, Sequence

# TRITON_INTERPRET must be set before triton is first imported (torch may import it).
if "--interpret" in sys.argv[1:]:
    os.environ["TRITON_INTERPRET"] = "1"

_ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402

LK, LV = 576, 512
DEFAULT_PAGE_SIZE = 64
DEFAULT_SM_SCALE = 0.1352
# The ceilings ANCHORS.md's roofline column was computed with (one H200, 2026-11-30).
ANCHOR_COPY_TBPS = 4.27
ANCHOR_MM_TFLOPS = 678.5
# Every key of a launch config, in the order configs.py defines them (one place).
from mla_ops.decode_verify.configs import VERIFY_DEFAULT_CONFIG  # noqa: E402

LAUNCH_KEYS = tuple(VERIFY_DEFAULT_CONFIG)


# --- shapes and the roofline --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Target:
    """What ANCHORS/issue 4 ask of a shape: ``kind`` is ``time_us`` (at most ``value`` µs),
    ``roofline_frac`` (at least ``value`` of the measured roofline) or ``tflops`` (at least
    ``value`` TFLOP/s); ``target_us`` is the ANCHORS table's µs column."""

    kind: str
    value: float
    target_us: float

    def met(self, time_us: float, roofline_frac: float, tflops: float) -> bool:
        if self.kind == "time_us":
            return time_us <= self.value
        if self.kind == "roofline_frac":
            return roofline_frac >= self.value
        if self.kind == "tflops":
            return tflops >= self.value
        raise ValueError(f"unknown target kind {self.kind!r}")

    def describe(self) -> str:
        return {"time_us": f"<={self.value:g}us", "roofline_frac": f">={self.value:.0%}",
                "tflops": f">={self.value:g}TF"}[self.kind]


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmarked launch: ``B`` requests of ``qlen`` verify tokens over ``L`` keys each."""

    H: int
    qlen: int
    B: int
    L: int
    fp8: bool = False
    page_size: int = DEFAULT_PAGE_SIZE
    name: str | None = None  # "M1" … for the ANCHORS shapes

    @property
    def cache(self) -> str:
        return "fp8" if self.fp8 else "bf16"

    @property
    def label(self) -> str:
        grid = f"H{self.H}-q{self.qlen}-B{self.B}-L{self.L}-{self.cache}-p{self.page_size}"
        return f"{self.name} ({grid})" if self.name else grid


@dataclasses.dataclass(frozen=True)
class AnchorShape:
    case: Case
    title: str
    vllm_us: float  # ANCHORS: vLLM 0.33 Triton MLA decode fed one row per token
    roofline_us: float  # ANCHORS' roofline column (4.27 TB/s, 678.5 TFLOP/s)
    target: Target


def _shape(name, title, H, qlen, B, L, fp8, vllm_us, roofline_us, kind, value, target_us):
    return AnchorShape(Case(H, qlen, B, L, fp8, DEFAULT_PAGE_SIZE, name), title, vllm_us,
                       roofline_us, Target(kind, value, target_us))


# ANCHORS.md "Decode verify" table; targets as issue 4 states them.
SHAPES: dict[str, AnchorShape] = {
    s.case.name: s
    for s in (
        _shape("M1", "latency", 16, 2, 1, 8192, False, 54.7, 2.2, "time_us", 10.0, 10.0),
        _shape("M2", "TP8", 16, 2, 32, 4096, False, 175.2, 35.9, "roofline_frac", 0.85, 42.0),
        _shape("M3", "TP8 long draft", 16, 4, 128, 4096, False, 1291.9, 145.7, "roofline_frac",
               0.80, 182.0),
        _shape("M4", "TP8 fp8", 16, 2, 16, 32768, True, 698.8, 71.0, "roofline_frac", 0.80, 89.0),
        _shape("M5", "DP-attention", 128, 1, 128, 4096, False, 2478.4, 215.2, "tflops", 400.0,
               365.0),
        _shape("M6", "DP-attention verify", 128, 4, 32, 4096, False, 2289.9, 215.0, "tflops",
               400.0, 365.0),
        _shape("M7", "DP-attention fp8", 128, 2, 16, 32768, True, 4917.0, 430.4, "tflops", 400.0,
               730.0),
    )
}

# What --interpret runs when no grid is given: small enough for the CPU interpreter, still a
# partial last page, two verify tokens and more than one KV split.
INTERPRET_CASE = Case(H=16, qlen=2, B=2, L=80, fp8=False, page_size=16, name=None)


def row_limits(L: int, qlen: int, L_real: int | None = None) -> list[int]:
    """Keys each verify token of one request sees: ``max(min(L - qlen + 1 + t, L_real), 0)``."""
    real = L if L_real is None else L_real
    return [max(min(L - qlen + 1 + t, real), 0) for t in range(qlen)]


def sum_row_limits(B: int, L: int, qlen: int) -> int:
    return B * sum(row_limits(L, qlen))


def kv_bytes(case: Case, lk: int = LK) -> int:
    """The cache the batch reads once: ``B*L*Lk`` elements of 2 (bf16) or 1 (fp8) bytes."""
    return case.B * case.L * lk * (1 if case.fp8 else 2)


def unique_bytes(case: Case, act_bytes: int = 2, lk: int = LK, lv: int = LV) -> int:
    """ANCHORS' unique bytes: the KV once, plus q, o (dtype of q) and the fp32 lse once."""
    rows = case.B * case.qlen * case.H
    return kv_bytes(case, lk) + rows * (lk * act_bytes + lv * act_bytes + 4)


def flops(case: Case, lk: int = LK, lv: int = LV) -> int:
    """``2*H*(Lk+Lv)*sum of row limits``: QK^T over Lk plus PV over Lv, causal rows only."""
    return 2 * case.H * (lk + lv) * sum_row_limits(case.B, case.L, case.qlen)


def roofline(nbytes: float, nflops: float, copy_TBps: float, mm_TFLOPs: float) -> tuple[float, str]:
    """``(µs, "memory" | "compute")``: the larger of the two ceilings' times."""
    t_mem = nbytes / (copy_TBps * 1e12) * 1e6
    t_mm = nflops / (mm_TFLOPs * 1e12) * 1e6
    return (t_mem, "memory") if t_mem >= t_mm else (t_mm, "compute")


def baseline_seq_lens(L: int, qlen: int, B: int) -> list[int]:
    """Per-token KV lengths of the one-row-per-token feed: request ``b*qlen + t`` sees
    ``L - qlen + 1 + t`` keys, exactly the verify row limits."""
    return row_limits(L, qlen) * B


# --- arguments ----------------------------------------------------------------------------------

_KNOB_FLAGS = {  # flag dest -> config key
    "block_h": "BLOCK_H",
    "block_n": "BLOCK_N",
    "num_warps": "num_warps",
    "num_stages": "num_stages",
    "qsplit": "QSPLIT",
    "swap_ab": "SWAP_AB",
    "split_align": "SPLIT_ALIGN",
    "min_split_len": "MIN_SPLIT_LEN",
    "s2_block_s": "S2_BLOCK_S",
    "s2_num_warps": "s2_num_warps",
    "s2_block_dv": "S2_BLOCK_DV",
    "tma": "TMA",
    "persistent": "PERSISTENT",
    "pdl": "PDL",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Decode-verify benchmark: ANCHORS shapes M1-M7 or any grid, against the "
        "roofline and the one-row-per-token (qlen=1) feed.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="shapes: " + "; ".join(
            f"{n}={s.title}: H{s.case.H} qlen{s.case.qlen} B{s.case.B} L{s.case.L} {s.case.cache}"
            for n, s in SHAPES.items()),
    )
    g = p.add_argument_group("what to run")
    g.add_argument("--shape", nargs="+", metavar="NAME",
                   help="ANCHORS shapes by name (M1 ... M7, comma or space separated) or 'all' "
                   "(the default when no grid flag is given)")
    g.add_argument("--heads", nargs="+", type=int, help="grid: query heads H")
    g.add_argument("--qlen", nargs="+", type=int, help="grid: verify tokens per request")
    g.add_argument("--batch", nargs="+", type=int, help="grid: requests B")
    g.add_argument("--seq-len", nargs="+", type=int, help="grid: KV length L of every request")
    g.add_argument("--fp8", action="store_true", help="grid: fp8 (e4m3fn) cache with k_scale")
    g.add_argument("--page-size", type=int, default=None,
                   help=f"tokens per cache page (default {DEFAULT_PAGE_SIZE})")
    g.add_argument("--sm-scale", type=float, default=DEFAULT_SM_SCALE)
    g.add_argument("--dtype", choices=("bf16", "fp16"), default=None,
                   help="q/o dtype (default bf16; fp16 under --interpret)")
    k = p.add_argument_group("launch (override the selected config; the baseline keeps its own)")
    k.add_argument("--splits", type=int, help="num_kv_splits (default: verify_num_kv_splits "
                   "with the BLOCK_H of the config in use)")
    k.add_argument("--block-h", type=int)
    k.add_argument("--block-n", type=int)
    k.add_argument("--num-warps", type=int)
    k.add_argument("--num-stages", type=int)
    k.add_argument("--qsplit", type=int, choices=(0, 1))
    k.add_argument("--swap-ab", type=int, choices=(0, 1),
                   help="rows as wgmma's N: S^T = K Q^T, O^T = V^T P^T")
    k.add_argument("--split-align", type=int)
    k.add_argument("--min-split-len", type=int)
    k.add_argument("--s2-block-s", type=int)
    k.add_argument("--s2-num-warps", type=int)
    k.add_argument("--s2-block-dv", type=int, help="columns of o per stage-2 program (0: all)")
    k.add_argument("--tma", type=int, choices=(0, 1), help="K tiles by bulk tensor copies")
    k.add_argument("--persistent", type=int, help="stage-1 programs per SM (0: one per work item)")
    k.add_argument("--pdl", type=int, choices=(0, 1), help="stage 2 by programmatic dependent launch")
    o = p.add_argument_group("measurement")
    o.add_argument("--no-baseline", action="store_true", help="skip the qlen=1 feed")
    o.add_argument("--no-ceilings", action="store_true",
                   help="skip measuring the ceilings; use ANCHORS' 4.27 TB/s and 678.5 TFLOP/s")
    o.add_argument("--check", action="store_true",
                   help="compare one call (and the baseline's) with the fp32 reference first; "
                   "exit 1 on NaN or a large error")
    o.add_argument("--replays", type=int, default=200, help="most graph replays per timing")
    o.add_argument("--no-prequeue", action="store_true",
                   help="time each replay from an idle GPU, the host's launch latency included "
                   "(the default queues a GPU sleep ahead of the start event, so the time is the "
                   "graph's own, as inside a model's graph; matters for µs-scale shapes like M1)")
    o.add_argument("--rotate", type=int, default=1,
                   help="N copies of the cache cycled through the graph (L2-cold timing)")
    o.add_argument("--jobs", type=int, default=None,
                   help="processes compiling the launch variants in parallel before timing "
                   "(default: min(8, CPUs - 1); 0 compiles in this process)")
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--json", metavar="PATH", help="write the rows (with env and ceilings) here")
    o.add_argument("--interpret", action="store_true",
                   help="CPU smoke run through the Triton interpreter: tiny shape, fp16, no graphs")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    grid = any(getattr(args, f) is not None for f in ("heads", "qlen", "batch", "seq_len"))
    if args.shape is not None:
        names = [n.strip() for s in args.shape for n in s.split(",") if n.strip()]
        if [n.lower() for n in names] == ["all"]:
            names = list(SHAPES)
        unknown = [n for n in names if n not in SHAPES]
        if unknown:
            parser.error(f"--shape: unknown {unknown}; choose from {list(SHAPES)} or 'all'")
        if grid:
            parser.error("--shape names fixed shapes: give either --shape or the grid flags "
                         "(--heads --qlen --batch --seq-len)")
        if args.fp8:
            parser.error("--fp8: the named shapes fix their cache dtype (M4, M7 are fp8); use "
                         "the grid flags for another combination")
        args.shape = names
    for f in ("heads", "qlen", "batch", "seq_len"):
        vals = getattr(args, f)
        if vals is not None and any(v < 1 for v in vals):
            parser.error(f"--{f.replace('_', '-')}: values must be >= 1, got {vals}")
    if args.splits is not None and args.splits < 1:
        parser.error("--splits must be >= 1")
    if args.rotate < 1:
        parser.error("--rotate must be >= 1")
    if args.interpret and args.shape:
        parser.error("--interpret runs a tiny shape on the CPU; the named shapes need a GPU "
                     "(give small grid flags instead)")
    if args.page_size is not None and args.page_size < 1:
        parser.error("--page-size must be >= 1")
    if args.dtype is None:
        args.dtype = "fp16" if args.interpret else "bf16"
    return args


def resolve_cases(args: argparse.Namespace) -> list[Case]:
    """The cases to run, in order: named shapes, the grid's product, or the interpreter's one."""
    page = args.page_size
    grid = any(getattr(args, f) is not None for f in ("heads", "qlen", "batch", "seq_len"))
    if args.shape:
        cases = [SHAPES[n].case for n in args.shape]
        return [dataclasses.replace(c, page_size=page) if page else c for c in cases]
    if grid:
        m1 = SHAPES["M1"].case if not args.interpret else INTERPRET_CASE
        heads = args.heads or [m1.H]
        qlens = args.qlen or [m1.qlen]
        batches = args.batch or [m1.B]
        lens = args.seq_len or [m1.L]
        page = page or (m1.page_size if args.interpret else DEFAULT_PAGE_SIZE)
        return [Case(h, q, b, L, args.fp8, page) for h, q, b, L in
                itertools.product(heads, qlens, batches, lens)]
    if args.interpret:
        c = dataclasses.replace(INTERPRET_CASE, fp8=args.fp8)
        return [dataclasses.replace(c, page_size=page) if page else c]
    return [SHAPES[n].case for n in SHAPES] if not page else [
        dataclasses.replace(SHAPES[n].case, page_size=page) for n in SHAPES]


def launch_overrides(args: argparse.Namespace) -> dict[str, int]:
    """Config keys the command line sets (empty: the selected config as is)."""
    return {key: getattr(args, dest) for dest, key in _KNOB_FLAGS.items()
            if getattr(args, dest) is not None}


# --- the kernel API (imported late: the parser and formulas work without it) ---------------------


@dataclasses.dataclass
class Api:
    decode_attention_fwd_verify: Callable[..., None]
    select_verify_config: Callable[[int, int, int], dict]
    verify_num_kv_splits: Callable[..., int]
    decode_verify_ref: Callable[..., tuple]
    sm_count: int


def load_api() -> Api:
    from mla_ops import platform
    from mla_ops.decode_verify.launch import (
        decode_attention_fwd_verify,
        select_verify_config,
        verify_num_kv_splits,
    )
    from mla_ops.reference import decode_verify_ref

    return Api(decode_attention_fwd_verify, select_verify_config, verify_num_kv_splits,
               decode_verify_ref, platform.current().sm_count)


def effective_config(api: Api, case: Case, overrides: dict | None) -> dict:
    cfg = dict(api.select_verify_config(case.B, case.qlen, case.H))
    cfg.update(overrides or {})
    return cfg


def default_splits(api: Api, case: Case, cfg: dict) -> int:
    return api.verify_num_kv_splits(case.L, case.B, case.qlen, case.H, api.sm_count,
                                    block_h=cfg["BLOCK_H"])


def baseline_case(case: Case) -> Case:
    """The one-row-per-token feed's launch shape: B*qlen requests of qlen 1."""
    return dataclasses.replace(case, qlen=1, B=case.B * case.qlen, name=None)


# --- inputs -------------------------------------------------------------------------------------

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
FP8_K_SCALE = 0.25  # the cache holds k / k_scale


@dataclasses.dataclass
class Inputs:
    q: torch.Tensor  # [B*qlen, H, Lk]
    kv: list[torch.Tensor]  # rotate copies of [pages, page_size, 1, Lk]
    req_to_token: torch.Tensor  # [B, pages per request] int32, a random permutation of pages
    seq_lens: torch.Tensor  # [B] int32
    k_scale: torch.Tensor | None
    o: torch.Tensor
    lse: torch.Tensor
    workspaces: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)

    def attn_logits(self, splits: int) -> torch.Tensor | None:
        if splits == 1:
            return None
        ws = self.workspaces.get(splits)
        if ws is None:
            rows, heads = self.q.shape[0], self.q.shape[1]
            ws = torch.empty(rows, heads, splits, LV + 1, dtype=torch.float32, device=self.q.device)
            self.workspaces[splits] = ws
        return ws


def make_inputs(case: Case, device: str, act_dtype: torch.dtype, rotate: int = 1,
                seed: int = 0) -> Inputs:
    """Random q and cache (never zeros), pages of every request drawn by a random permutation."""
    gen = torch.Generator(device=device).manual_seed(seed)
    pages_per_req = math.ceil(case.L / case.page_size)
    num_pages = case.B * pages_per_req
    perm = torch.randperm(num_pages, generator=gen, device=device).to(torch.int32)
    req_to_token = perm.view(case.B, pages_per_req).contiguous()
    k_scale = None
    kvs = []
    for _ in range(rotate):
        kv = torch.randn(num_pages, case.page_size, 1, LK, generator=gen, device=device,
                         dtype=act_dtype)
        if case.fp8:
            kv = kv.to(torch.float8_e4m3fn)  # N(0,1) / k_scale in e4m3's range
        kvs.append(kv)
    if case.fp8:
        k_scale = torch.tensor(FP8_K_SCALE, dtype=torch.float32, device=device)
    rows = case.B * case.qlen
    q = 0.5 * torch.randn(rows, case.H, LK, generator=gen, device=device, dtype=act_dtype)
    seq_lens = torch.full((case.B,), case.L, dtype=torch.int32, device=device)
    o = torch.empty(rows, case.H, LV, dtype=act_dtype, device=device)
    lse = torch.empty(rows, case.H, dtype=torch.float32, device=device)
    return Inputs(q, kvs, req_to_token, seq_lens, k_scale, o, lse)


def make_baseline_inputs(case: Case, inp: Inputs) -> Inputs:
    """The verify batch as B*qlen requests of one row: same q rows, same cache, the block table
    repeated per token, lengths ``L - qlen + 1 + t``."""
    dev = inp.q.device
    lens = baseline_seq_lens(case.L, case.qlen, case.B)
    return Inputs(
        q=inp.q,
        kv=inp.kv,
        req_to_token=inp.req_to_token.repeat_interleave(case.qlen, dim=0).contiguous(),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
        k_scale=inp.k_scale,
        o=torch.empty_like(inp.o),
        lse=torch.empty_like(inp.lse),
    )


def make_call(api: Api, inp: Inputs, qlen: int, splits: int, sm_scale: float, page_size: int,
              overrides: dict | None, kv_index: int | None = None) -> Callable[[], None]:
    """``fn()`` running the kernel once per cache copy (or on copy ``kv_index`` only)."""
    kw = {"config": dict(overrides)} if overrides else {}
    logits = inp.attn_logits(splits)
    kvs = inp.kv if kv_index is None else [inp.kv[kv_index]]
    views = [(kv, kv[..., :LV]) for kv in kvs]

    def fn():
        for kv, v in views:
            api.decode_attention_fwd_verify(inp.q, kv, v, inp.o, inp.lse, inp.req_to_token,
                                            inp.seq_lens, None, qlen, logits, splits, sm_scale,
                                            page_size, inp.k_scale, **kw)

    return fn


# --- correctness ---------------------------------------------------------------------------------

CHECK_RTOL = {"bf16": 2e-2, "fp16": 1e-2}
CHECK_LSE_ATOL = 2e-2


def compare(o: torch.Tensor, lse: torch.Tensor, ref_o: torch.Tensor, ref_lse: torch.Tensor) -> dict:
    """Max error of o relative to max|ref o| and max absolute lse error; NaN anywhere is
    reported as an infinite error."""
    o32, ref32 = o.float(), ref_o.float()
    nan = bool(torch.isnan(o32).any() or torch.isnan(lse).any())
    denom = max(float(ref32.abs().max()), 1e-6)
    err_o = float((o32 - ref32).abs().max()) / denom
    finite = torch.isfinite(ref_lse)
    same_inf = bool(torch.equal(torch.isfinite(lse), finite))
    err_lse = float((lse[finite] - ref_lse[finite]).abs().max()) if finite.any() else 0.0
    if nan or not same_inf or math.isnan(err_o) or math.isnan(err_lse):
        err_o = err_lse = float("inf")
    return {"err_o_rel": err_o, "err_lse_abs": err_lse, "nan": nan}


def check_call(fn: Callable[[], None], inp: Inputs, ref: tuple, rtol: float) -> dict:
    inp.o.fill_(float("nan"))
    inp.lse.fill_(float("nan"))
    fn()
    if inp.q.is_cuda:
        torch.cuda.synchronize()
    res = compare(inp.o, inp.lse, *ref)
    res["ok"] = res["err_o_rel"] <= rtol and res["err_lse_abs"] <= CHECK_LSE_ATOL
    return res


# --- timing -------------------------------------------------------------------------------------


PREQUEUE_CYCLES = 100_000  # ~50 µs at the H200's 1.98 GHz: the host enqueues a replay in less


def time_call(fn: Callable[[], None], device: str, max_replays: int, target_ms: float = 60.0,
              calls_per_fn: int = 1, prequeue: bool = True) -> tuple[float, int]:
    """(median µs of one kernel call, replays). GPU: CUDA-graph replays, as many as fit in about
    ``target_ms`` (at least 20, at most ``max_replays``). CPU: the wall time of one call."""
    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6 / calls_per_fn, 1
    from benchmarks._common import time_cuda_graph

    fn()  # compiles outside the estimate
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    end.synchronize()
    est_us = max(start.elapsed_time(end) * 1e3 / 3, 1.0)
    replays = int(min(max_replays, max(20, target_ms * 1e3 / est_us)))
    cycles = PREQUEUE_CYCLES if prequeue else 0
    return time_cuda_graph(fn, replays=replays, prequeue_cycles=cycles) / calls_per_fn, replays


# --- parallel compile: worker processes run each launch variant once, filling triton's disk
# cache, so that this process only loads binaries. Errors there are reported, not raised. ----

_WORKER_POISON: str | None = None
_STICKY = ("illegal memory access", "unspecified launch failure", "misaligned address",
           "illegal instruction", "device-side assert", "CUDA error")


def compile_spec(case: Case, act: str, splits: int, overrides: dict | None,
                 device: str = "cuda") -> dict:
    """Picklable description of one launch variant (what triton specializes on)."""
    return {"H": case.H, "qlen": case.qlen, "L": case.L, "fp8": case.fp8,
            "page_size": case.page_size, "act": act, "splits": splits,
            "config": dict(overrides or {}), "device": device}


def compile_key(spec: dict) -> tuple:
    pages = math.ceil(spec["L"] / spec["page_size"])
    return (spec["H"], spec["qlen"], spec["fp8"], spec["page_size"], pages % 16 == 0, spec["act"],
            spec["splits"] == 1, tuple(sorted(spec["config"].items())))


def compile_worker(spec: dict) -> tuple[str, str, float]:
    """Run one launch variant on scratch tensors (one page, page 0 everywhere): ``(status,
    message, seconds)`` with status ``ok``, ``error`` (compile/launch refused: shared memory,
    bad config), ``crash`` (this process's CUDA context is gone), ``retry`` (an earlier spec
    crashed this process) or ``unavailable`` (this process cannot use the device at all)."""
    global _WORKER_POISON
    if _WORKER_POISON is not None:
        return "retry", _WORKER_POISON, 0.0
    t0 = time.perf_counter()
    dev = spec.get("device", "cuda")
    try:  # a process that cannot use the device at all says so, and blames no config
        torch.zeros(1, device=dev).add_(1)
        if dev == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        return "unavailable", f"{type(e).__name__}: {e}"[:400], 0.0
    try:
        api = load_api()
        act = _DTYPES[spec["act"]]
        H, qlen, page = spec["H"], spec["qlen"], spec["page_size"]
        rows = qlen  # batch and the split count are not specialized on: one request suffices
        pages = math.ceil(spec["L"] / page)
        kv = torch.zeros(1, page, 1, LK, device=dev, dtype=act)
        if spec["fp8"]:
            kv = kv.to(torch.float8_e4m3fn)
        k_scale = torch.ones((), dtype=torch.float32, device=dev) if spec["fp8"] else None
        q = torch.zeros(rows, H, LK, device=dev, dtype=act)
        o = torch.empty(rows, H, LV, device=dev, dtype=act)
        lse = torch.empty(rows, H, device=dev, dtype=torch.float32)
        rtt = torch.zeros(1, pages, dtype=torch.int32, device=dev)
        seq = torch.full((1,), min(spec["L"], 4 * page), dtype=torch.int32, device=dev)
        s = spec["splits"]
        ws = None if s == 1 else torch.empty(rows, H, s, LV + 1, device=dev, dtype=torch.float32)
        kw = {"config": spec["config"]} if spec["config"] else {}
        api.decode_attention_fwd_verify(q, kv, kv[..., :LV], o, lse, rtt, seq, None, qlen, ws,
                                        s, DEFAULT_SM_SCALE, page, k_scale, **kw)
        if dev == "cuda":
            torch.cuda.synchronize()
        return "ok", "", time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - reported to the parent
        msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:400]
        if any(s in str(e) for s in _STICKY):
            _WORKER_POISON = msg
            return "crash", msg, time.perf_counter() - t0
        return "error", msg, time.perf_counter() - t0


class CompilePool:
    """Worker processes (spawned, so each has its own CUDA context) that run ``compile_worker``."""

    def __init__(self, jobs: int):
        self.jobs = jobs
        self._ex = None

    def _executor(self):
        if self._ex is None:
            import concurrent.futures
            import multiprocessing

            self._ex = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"))
        return self._ex

    def run(self, specs: list[dict], deadline: float | None = None) -> dict[tuple, tuple]:
        """``compile_key -> (status, message, seconds)`` for the specs done before ``deadline``
        (``time.monotonic()``); a worker that lost its context hands its specs back for the
        next round (three rounds at most). Raises RuntimeError if the workers cannot use the
        device at all (e.g. an exclusive-process GPU): compile in this process then."""
        import concurrent.futures

        todo = {}
        for s in specs:
            todo.setdefault(compile_key(s), s)
        out: dict[tuple, tuple] = {}
        for _ in range(3):
            if not todo or self.jobs <= 0:
                break
            ex = self._executor()
            futs = {ex.submit(_worker_entry, s): k for k, s in todo.items()}
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            retry = {}
            try:
                for fut in concurrent.futures.as_completed(futs, timeout=timeout):
                    k = futs[fut]
                    try:
                        res = fut.result()
                    except Exception as e:  # noqa: BLE001 - a dead worker process
                        res = ("retry", f"{type(e).__name__}: {e}", 0.0)
                    if res[0] == "unavailable":
                        raise RuntimeError(f"a compile process cannot use the device: {res[1]}")
                    if res[0] == "retry":
                        retry[k] = todo[k]
                    else:
                        out[k] = res
            except concurrent.futures.TimeoutError:
                self.close()
                return out
            if retry:  # some worker's CUDA context died: start fresh processes
                self.close()
            todo = retry
        return out

    def close(self):
        if self._ex is not None:
            procs = list(getattr(self._ex, "_processes", {}).values())
            self._ex.shutdown(wait=False, cancel_futures=True)
            for p in procs:  # our own workers, by their handles
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(timeout=5)
            self._ex = None


def _worker_entry(spec: dict) -> tuple[str, str, float]:
    # Importable by name in the spawned process (a script's __main__ functions are not always).
    from benchmarks.benchmark_decode_verify import compile_worker as fn

    return fn(spec)


def default_jobs() -> int:
    return max(0, min(8, (os.cpu_count() or 1) - 1))


# --- one case -----------------------------------------------------------------------------------


def run_case(api: Api, case: Case, args: argparse.Namespace, device: str, ceilings: dict,
             l2_bytes: int | None) -> dict:
    act = _DTYPES[args.dtype]
    act_bytes = torch.empty((), dtype=act).element_size()
    overrides = launch_overrides(args)
    cfg = effective_config(api, case, overrides)
    splits = args.splits or default_splits(api, case, cfg)
    inp = make_inputs(case, device, act, rotate=args.rotate, seed=args.seed)
    rtol = CHECK_RTOL[args.dtype]

    row: dict[str, Any] = {"shape": case.name, "H": case.H, "qlen": case.qlen, "B": case.B,
                           "L": case.L, "page_size": case.page_size,
                           "cache": "fp8" if case.fp8 else args.dtype,
                           "dtype": args.dtype, "Lk": LK, "Lv": LV, "sm_scale": args.sm_scale,
                           "rows": case.B * case.qlen * case.H, "config": cfg,
                           "overrides": overrides, "num_kv_splits": splits,
                           "rotate": args.rotate}

    base = bcase = binp = bcfg = None
    if not args.no_baseline:
        bcase = baseline_case(case)
        bcfg = effective_config(api, bcase, None)
        bsplits = default_splits(api, bcase, bcfg)
        binp = make_baseline_inputs(case, inp)

    if args.check:
        ref = api.decode_verify_ref(inp.q, inp.kv[0], LV, inp.req_to_token, inp.seq_lens, None,
                                    case.qlen, args.sm_scale, case.page_size, inp.k_scale)
        fn0 = make_call(api, inp, case.qlen, splits, args.sm_scale, case.page_size, overrides, 0)
        res = check_call(fn0, inp, ref, rtol)
        row["check"] = res
        print(f"  check {case.label}: o rel err {res['err_o_rel']:.2e}, "
              f"lse abs err {res['err_lse_abs']:.2e} -> {'ok' if res['ok'] else 'FAIL'}")
        if binp is not None:
            fnb = make_call(api, binp, 1, bsplits, args.sm_scale, case.page_size, None, 0)
            bres = check_call(fnb, binp, ref, rtol)
            row["baseline_check"] = bres
            print(f"  check {case.label} qlen=1 feed: o rel err {bres['err_o_rel']:.2e}, "
                  f"lse abs err {bres['err_lse_abs']:.2e} -> {'ok' if bres['ok'] else 'FAIL'}")
            res = {"ok": res["ok"] and bres["ok"]}
        del ref
        if not res["ok"]:
            print(f"FAIL: {case.label} disagrees with decode_verify_ref (tolerance: o {rtol:g} "
                  f"relative, lse {CHECK_LSE_ATOL:g} absolute)", file=sys.stderr)
            sys.exit(1)

    fn = make_call(api, inp, case.qlen, splits, args.sm_scale, case.page_size, overrides)
    t_us, replays = time_call(fn, device, args.replays, calls_per_fn=args.rotate,
                               prequeue=not args.no_prequeue)

    nbytes, nflops = unique_bytes(case, act_bytes), flops(case)
    roof_us, bound = roofline(nbytes, nflops, ceilings["copy_TBps"], ceilings["bf16_mm_TFLOPs"])
    anchor_roof_us, _ = roofline(nbytes, nflops, ANCHOR_COPY_TBPS, ANCHOR_MM_TFLOPS)
    kvb = kv_bytes(case)
    row.update(
        time_us=t_us, replays=replays, prequeued=not args.no_prequeue, unique_bytes=nbytes, kv_bytes=kvb, flops=nflops,
        TBps=nbytes / (t_us * 1e-6) / 1e12, TFLOPs=nflops / (t_us * 1e-6) / 1e12,
        roofline_us=roof_us, roofline_bound=bound, roofline_frac=roof_us / t_us,
        roofline_us_anchor_ceilings=anchor_roof_us,
        l2_bytes=l2_bytes,
        kv_fits_l2=(None if l2_bytes is None else kvb * args.rotate <= l2_bytes),
    )
    if case.name:
        anchor = SHAPES[case.name]
        row.update(
            vllm_anchor_us=anchor.vllm_us, anchors_roofline_us=anchor.roofline_us,
            target=dataclasses.asdict(anchor.target), target_desc=anchor.target.describe(),
            passed=anchor.target.met(t_us, row["roofline_frac"], row["TFLOPs"]),
        )
    if binp is not None:
        fnb = make_call(api, binp, 1, bsplits, args.sm_scale, case.page_size, None)
        b_us, b_rep = time_call(fnb, device, args.replays, calls_per_fn=args.rotate,
                                 prequeue=not args.no_prequeue)
        row.update(baseline_us=b_us, baseline_replays=b_rep, baseline_num_kv_splits=bsplits,
                   baseline_config=bcfg, baseline_roofline_frac=roof_us / b_us,
                   speedup=b_us / t_us)
    del inp, binp, base
    return row


TABLE_COLUMNS = ["shape", "H", "qlen", "B", "L", "cache", "splits", "time_us", "roof_us",
                 "roof_frac", "TB/s", "TFLOP/s", "base_us", "speedup", "target", "pass"]


def table_rows(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        out.append({
            "shape": r["shape"] or "-", "H": r["H"], "qlen": r["qlen"], "B": r["B"], "L": r["L"],
            "cache": r["cache"] + ("*L2" if r.get("kv_fits_l2") else ""),
            "splits": r["num_kv_splits"], "time_us": r["time_us"], "roof_us": r["roofline_us"],
            "roof_frac": r["roofline_frac"], "TB/s": r["TBps"], "TFLOP/s": r["TFLOPs"],
            "base_us": r.get("baseline_us", ""), "speedup": r.get("speedup", ""),
            "target": r.get("target_desc", ""),
            "pass": {True: "PASS", False: "fail"}.get(r.get("passed"), ""),
        })
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from benchmarks._common import pick_device

    device = pick_device(args.interpret, "benchmark_decode_verify")
    if device is None:
        return 2
    from benchmarks._common import env_info, measure_ceilings, print_table, write_json

    cases = resolve_cases(args)
    api = load_api()
    overrides = launch_overrides(args)
    env = env_info()
    print(f"decode_verify benchmark on {env.get('gpu') or 'cpu (Triton interpreter)'}, "
          f"torch {env['torch']}, triton {env['triton']}, {len(cases)} case(s)")

    if device == "cuda" and not args.no_ceilings:
        ceilings = measure_ceilings()
        ceilings["source"] = "measured in this run"
    else:
        ceilings = {"copy_TBps": ANCHOR_COPY_TBPS, "bf16_mm_TFLOPs": ANCHOR_MM_TFLOPS,
                    "source": "ANCHORS.md nominal (not measured)"}
    print(f"ceilings: copy {ceilings['copy_TBps']:.2f} TB/s, bf16 matmul "
          f"{ceilings['bf16_mm_TFLOPs']:.1f} TFLOP/s ({ceilings['source']})")
    l2 = None
    if device == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None)

    jobs = default_jobs() if args.jobs is None else args.jobs
    if device == "cuda" and jobs > 0:
        specs = []
        for c in cases:
            cfg = effective_config(api, c, overrides)
            specs.append(compile_spec(c, args.dtype, args.splits or default_splits(api, c, cfg),
                                      overrides))
            if not args.no_baseline:
                b = baseline_case(c)
                specs.append(compile_spec(b, args.dtype,
                                          default_splits(api, b, effective_config(api, b, None)),
                                          None))
        t0 = time.perf_counter()
        pool = CompilePool(jobs)
        try:
            done = pool.run(specs, deadline=time.monotonic() + 300)
            bad = [v[1] for v in done.values() if v[0] != "ok"]
            print(f"compiled {len(done)} launch variants in {time.perf_counter() - t0:.1f} s "
                  f"with {jobs} processes" + (f"; {len(bad)} failed there, e.g. {bad[0]}"
                                              if bad else ""))
        except Exception as e:  # noqa: BLE001 - only a head start; this process compiles anyway
            print(f"note: parallel compile unavailable ({type(e).__name__}: {e}); compiling here")
        finally:
            pool.close()

    rows = []
    for case in cases:
        t0 = time.perf_counter()
        row = run_case(api, case, args, device, ceilings, l2)
        rows.append(row)
        base = f", qlen=1 feed {row['baseline_us']:.1f} us ({row['speedup']:.2f}x)" \
            if "baseline_us" in row else ""
        print(f"  {case.label}: {row['time_us']:.1f} us, {row['roofline_frac']:.0%} of roofline "
              f"{row['roofline_us']:.1f} us ({row['roofline_bound']}), {row['TBps']:.2f} TB/s, "
              f"{row['TFLOPs']:.0f} TFLOP/s{base}  [{time.perf_counter() - t0:.1f} s]")
        if device == "cuda":
            torch.cuda.empty_cache()

    if args.json:
        write_json(args.json, rows, ceilings)
        print(f"wrote {args.json}")
    if any(r.get("kv_fits_l2") for r in rows):
        print("note: '*L2' marks a KV working set that fits in L2 (graph replays re-read it from "
              "L2); --rotate N gives an L2-cold figure")
    print()
    print_table(table_rows(rows), TABLE_COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
