"""Decode-verify measurement, shared by the benchmark, the A/B script and the sweep.

The launch knobs of the command line, the config and split count a launch runs with (the
tuning table's, with overrides laid over it through ``mla_ops.tuning``), random paged inputs,
the kernel call (optionally rotating copies of the cache), the check against the fp32
reference, the compile job of the pool, FlashMLA beside ours when it is installed, and one
case's row of the benchmark; the draft workloads (ragged draft counts, EAGLE trees) of its
``--drafts`` mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import sys
from typing import Any, Callable

import torch

from benchmarks import cli, compile_pool, harness
from benchmarks.shapes import (
    LK,
    LV,
    ANCHOR_CEILINGS,
    DEFAULT_SM_SCALE,
    SHAPES,
    Case,
    Drafts,
    baseline_case,
    baseline_seq_lens,
    draft_counts,
    flops,
    kv_bytes,
    roofline,
    unique_bytes,
)
from mla_ops.decode_verify.configs import KERNEL
from mla_ops.draft_trees import chain_parents, eagle_parents, tree_mask_from_parents

# --- launch knobs -------------------------------------------------------------------------------

# flag -> (config key, help); every config key has one (tests/test_benchmarks_cli.py).
KNOBS = {
    "--block-h": ("BLOCK_H", "rows (verify token, head) per stage-1 program"),
    "--block-n": ("BLOCK_N", "KV tokens per tile"),
    "--num-warps": ("num_warps", None),
    "--num-stages": ("num_stages", None),
    "--qsplit": ("QSPLIT", "Lv part of Q, K and the accumulator in two halves (0/1)"),
    "--swap-ab": ("SWAP_AB", "rows as wgmma's N: S^T = K Q^T, O^T = V^T P^T (0/1)"),
    "--split-align": ("SPLIT_ALIGN", None),
    "--min-split-len": ("MIN_SPLIT_LEN", None),
    "--s2-block-s": ("S2_BLOCK_S", None),
    "--s2-num-warps": ("s2_num_warps", None),
    "--s2-block-dv": ("S2_BLOCK_DV", "columns of o per stage-2 program (0: all)"),
    "--tma": ("TMA", "K tiles by bulk tensor copies (0/1)"),
    "--persistent": ("PERSISTENT", "stage-1 programs per SM (0: one per work item)"),
    "--pdl": ("PDL", "stage 2 by programmatic dependent launch (0/1)"),
    "--split-work": ("SPLIT_WORK", "keys per split the default split cap aims for"),
    "--balance": ("BALANCE", "balanced splits: the cap x this, pieces by each request's share (0: off)"),
}


def add_launch_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "launch (override the selected config; the qlen=1 feed keeps its own, but the family)")
    g.add_argument("--family", choices=("table", "triton", "gluon"), default="table",
                   help="kernel family: the table's choice (default), or one named (passed as "
                   "config={'family': ...}; a family this mla_ops does not have is an error)")
    g.add_argument("--splits", type=cli.positive,
                   help="num_kv_splits (default: verify_num_kv_splits with the BLOCK_H and "
                   "SPLIT_WORK of the config in use)")
    for flag, (_key, text) in KNOBS.items():
        g.add_argument(flag, type=int, help=text)


def launch_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Config keys the command line sets (empty: the selected config as is)."""
    out: dict[str, Any] = {}
    if getattr(args, "family", "table") != "table":
        out["family"] = args.family
    for flag, (key, _text) in KNOBS.items():
        v = getattr(args, flag[2:].replace("-", "_"))
        if v is not None:
            out[key] = v
    return out


def family_only(overrides: dict | None) -> dict:
    """What of the overrides the qlen=1 feed takes: the kernel family."""
    return {"family": overrides["family"]} if overrides and "family" in overrides else {}


# --- the kernel API (imported late: tests stand a fake in) ---------------------------------------


@dataclasses.dataclass
class Api:
    decode_attention_fwd_verify: Callable[..., None]
    select_verify_config: Callable[..., dict]
    verify_num_kv_splits: Callable[..., int]
    decode_verify_ref: Callable[..., tuple]
    sm_count: int


def load_api() -> Api:
    from mla_ops import platform
    from mla_ops.decode_verify.launch import decode_attention_fwd_verify, select_verify_config
    from mla_ops.decode_verify.splits import verify_num_kv_splits
    from mla_ops.reference import decode_verify_ref

    return Api(decode_attention_fwd_verify, select_verify_config, verify_num_kv_splits,
               decode_verify_ref, platform.current().sm_count)


# Variant keys of the harness, not of the config: ``logits_cols``, the split workspace's row
# width (``attn_logits.shape[3]``, >= Lv + 1; the op reads and writes the first Lv + 1).
HARNESS_KEYS = ("logits_cols",)


def split_overrides(overrides: dict | None) -> tuple[dict | None, dict]:
    """``(config overrides or None, harness keys)`` of a variant's overrides."""
    over = dict(overrides or {})
    harness_keys = {k: over.pop(k) for k in HARNESS_KEYS if k in over}
    return over or None, harness_keys


def effective_config(api: Api, case: Case, overrides: dict | None, dtype: str = "bf16") -> dict:
    """The config the launcher runs for ``case`` with ``overrides``: the tuning module's
    selection and checks (a refused or unknown config raises its ValueError), with the facts
    only a launch has (whether the sm_90 Gluon family covers it) as the launcher computes them."""
    from mla_ops.decode_verify.launch import launch_config

    overrides = split_overrides(overrides)[0]

    device = "cuda" if torch.cuda.is_available() else "cpu"
    probe = torch.empty(0, 1, LK, device=device,
                        dtype=torch.float8_e4m3fn if case.fp8 else DTYPES[dtype])
    return dict(launch_config(case.B, case.qlen, case.H, probe, LV,
                              dict(overrides) if overrides else None, q_dtype=DTYPES[dtype],
                              page_size=case.page_size))


def default_splits(api: Api, case: Case, cfg: dict) -> int:
    """The split cap serving passes for ``cfg``: ``verify_num_kv_splits`` with its BLOCK_H and
    SPLIT_WORK (what ``plan_verify`` computes for the table's config; with ``GRID``, the
    balanced grid's cap where it takes the launch)."""
    extra = {}
    if cfg.get("GRID"):  # (a config key of this tree's mla_ops only: the A/B base has none)
        from mla_ops.decode_verify.gluon_launch import grid_takes

        extra["grid"] = grid_takes(cfg, case.qlen, case.H, fp8=case.fp8, tree=False, ragged=False,
                                   context_parallel=False, single=False)
    return api.verify_num_kv_splits(case.L, case.B, case.qlen, case.H, api.sm_count,
                                    block_h=cfg.get("BLOCK_H"),
                                    min_work_per_split=cfg.get("SPLIT_WORK"),
                                    balance=cfg.get("BALANCE", 0), **extra)


def launches(api: Api, case: Case, args: argparse.Namespace) -> list[tuple]:
    """``(case, overrides, config, splits)`` of each launch the benchmark makes for ``case``:
    the verify launch, then (unless ``--no-baseline``) the qlen=1 feed, which keeps its own
    config and split count but takes the family. Raises the tuning module's ValueError."""
    over = launch_overrides(args)
    cfg = effective_config(api, case, over)
    out = [(case, over, cfg, args.splits or default_splits(api, case, cfg))]
    if not args.no_baseline:
        bcase, bover = baseline_case(case), family_only(over)
        bcfg = effective_config(api, bcase, bover)
        out.append((bcase, bover, bcfg, default_splits(api, bcase, bcfg)))
    return out


def table_config(cfg: dict) -> dict:
    """``cfg`` as a table holds it: completed with its family's defaults, keys in the family's
    order (then the backend's extra keys), ``family`` written only when not ``triton``."""
    family = cfg.get("family", "triton")
    full = {**KERNEL.defaults.get(family, {}), **cfg}
    keys = [k for k in (*KERNEL.defaults.get(family, {}), *KERNEL.extra_keys) if k in full]
    keys += sorted(k for k in full if k not in keys and k != "family")
    out = {k: full[k] for k in keys}
    if family != "triton":
        out = {"family": family, **out}
    return out


# --- inputs -------------------------------------------------------------------------------------

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
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
    # the split workspaces made so far, by (splits, row width)
    workspaces: dict[tuple[int, int], torch.Tensor] = dataclasses.field(default_factory=dict)

    def attn_logits(self, splits: int, cols: int | None = None) -> torch.Tensor | None:
        """The split workspace ``[rows, H, splits, cols]`` (``cols`` >= Lv + 1, default Lv + 1:
        the op uses each row's first Lv + 1)."""
        if splits == 1:
            return None
        cols = cols or LV + 1
        ws = self.workspaces.get((splits, cols))
        if ws is None:
            rows, heads = self.q.shape[0], self.q.shape[1]
            ws = torch.empty(rows, heads, splits, cols, dtype=torch.float32, device=self.q.device)
            self.workspaces[(splits, cols)] = ws
        return ws


def make_inputs(case: Case, device: str, act_dtype: torch.dtype, rotate: int = 1,
                seed: int = 0) -> Inputs:
    """Random q and cache (never zeros), pages of every request drawn by a random permutation;
    ``rotate`` copies of the cache for an L2-cold timing."""
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


def spread_lengths(inp: Inputs, case: Case, seed: int = 0) -> float:
    """Replace ``inp``'s equal lengths by lengths drawn uniformly from ``[qlen, L]`` (seeded, in
    place: the block table already covers L); returns their mean over L."""
    gen = torch.Generator(device="cpu").manual_seed(1000 + seed)
    lens = torch.randint(case.qlen, case.L + 1, (case.B,), generator=gen, dtype=torch.int32)
    inp.seq_lens.copy_(lens.to(inp.seq_lens.device))
    return float(lens.double().mean()) / case.L


def make_baseline_inputs(case: Case, inp: Inputs) -> Inputs:
    """The verify batch as B*qlen requests of one row: same q rows, same cache, the block table
    repeated per token, lengths ``L - qlen + 1 + t``."""
    lens = baseline_seq_lens(case.L, case.qlen, case.B)
    return dataclasses.replace(
        inp, req_to_token=inp.req_to_token.repeat_interleave(case.qlen, dim=0).contiguous(),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=inp.q.device),
        o=torch.empty_like(inp.o), lse=torch.empty_like(inp.lse), workspaces={})


def make_call(api: Api, inp: Inputs, qlen: int, splits: int, sm_scale: float, page_size: int,
              overrides: dict | None, kv_index: int | None = None) -> Callable[[], None]:
    """``fn()`` running the kernel once per cache copy (or on copy ``kv_index`` only)."""
    overrides, hk = split_overrides(overrides)
    kw = {"config": overrides} if overrides else {}
    logits = inp.attn_logits(splits, hk.get("logits_cols"))
    kvs = inp.kv if kv_index is None else [inp.kv[kv_index]]

    def call(kv):
        api.decode_attention_fwd_verify(inp.q, kv, kv[..., :LV], inp.o, inp.lse, inp.req_to_token,
                                        inp.seq_lens, None, qlen, logits, splits, sm_scale,
                                        page_size, inp.k_scale, **kw)

    return harness.rotating(call, kvs)


def reference(api: Api, inp: Inputs, case: Case, sm_scale: float) -> tuple:
    return api.decode_verify_ref(inp.q, inp.kv[0], LV, inp.req_to_token, inp.seq_lens, None,
                                 case.qlen, sm_scale, case.page_size, inp.k_scale)


# --- correctness --------------------------------------------------------------------------------

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


def judge(res: dict, rtol: float) -> dict:
    res["ok"] = res["err_o_rel"] <= rtol and res["err_lse_abs"] <= CHECK_LSE_ATOL
    return res


def check_call(fn: Callable[[], None], inp: Inputs, ref: tuple, rtol: float) -> dict:
    inp.o.fill_(float("nan"))
    inp.lse.fill_(float("nan"))
    fn()
    if inp.q.is_cuda:
        torch.cuda.synchronize()
    return judge(compare(inp.o, inp.lse, *ref), rtol)


# --- the compile pool's job ---------------------------------------------------------------------


def compile_spec(case: Case, act: str, splits: int, overrides: dict | None,
                 device: str = "cuda") -> dict:
    """Picklable description of one launch variant (what triton specializes on)."""
    return {"H": case.H, "qlen": case.qlen, "L": case.L, "fp8": case.fp8,
            "page_size": case.page_size, "act": act, "splits": splits,
            "config": split_overrides(overrides)[0] or {}, "device": device}


def compile_key(spec: dict) -> tuple:
    pages = math.ceil(spec["L"] / spec["page_size"])
    return (spec["H"], spec["qlen"], spec["fp8"], spec["page_size"], pages % 16 == 0, spec["act"],
            spec["splits"] == 1, tuple(sorted(spec["config"].items())))


def specs_by_key(specs: list[dict]) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for s in specs:
        out.setdefault(compile_key(s), s)
    return out


def compile_job(spec: dict) -> None:
    """One launch variant on one request whose lengths stop after four pages: batch, lengths
    and the split count are not specialized on, the block table's width is."""
    case = Case(spec["H"], spec["qlen"], 1, spec["L"], spec["fp8"], spec["page_size"])
    inp = make_inputs(case, spec["device"], DTYPES[spec["act"]])
    inp.seq_lens.clamp_(max=4 * case.page_size)
    make_call(load_api(), inp, case.qlen, spec["splits"], DEFAULT_SM_SCALE, case.page_size,
              spec["config"] or None, kv_index=0)()


# --- FlashMLA beside ours (never a dependency) ---------------------------------------------------


def load_flashmla():
    """The ``flash_mla`` module if this Python can import it, else None (silently)."""
    try:
        import flash_mla
    except Exception:  # noqa: BLE001 - absent, or built for another torch: no column
        return None
    return flash_mla


def flashmla_applies(case: Case, dtype: str, device: str) -> bool:
    """FlashMLA's dense decode: bf16 q and cache, page 64, Lk 576 / Lv 512, on a GPU."""
    return device == "cuda" and dtype == "bf16" and not case.fp8 and case.page_size == 64


def flashmla_call(fm, inp: Inputs, case: Case, sm_scale: float):
    """``(fn, first)``: ``fn()`` runs FlashMLA once per cache copy, as :func:`make_call`;
    ``first()`` runs it on copy 0 and returns ``(o, lse)`` in our layouts. Causal with ``s_q =
    qlen`` is the verify rule (row t sees keys ``[0, L - qlen + 1 + t)``)."""
    q4 = inp.q.view(case.B, case.qlen, case.H, LK)
    # (scheduling metadata, None) on current FlashMLA (planned on the first call); the
    # (tile metadata, split counts) tensors of older versions, which take these arguments.
    meta, num_splits = fm.get_mla_metadata(inp.seq_lens, case.qlen * case.H, 1)

    def call(kv):
        return fm.flash_mla_with_kvcache(q4, kv, inp.req_to_token, inp.seq_lens, LV, meta,
                                         num_splits, softmax_scale=sm_scale, causal=True)

    def first():
        o, lse = call(inp.kv[0])  # [B, qlen, H, Lv], [B, H, qlen]
        rows = case.B * case.qlen
        return o.reshape(rows, case.H, LV), lse.transpose(1, 2).reshape(rows, case.H)

    return harness.rotating(call, inp.kv), first


# --- one case of the benchmark -------------------------------------------------------------------


def run_case(api: Api, case: Case, args: argparse.Namespace, device: str, ceilings: dict,
             l2: int | None, flashmla=None) -> dict:
    """Check (``--check``) and time one case, its qlen=1 feed and FlashMLA (when given and
    applicable): the benchmark's row. Exits 1 when our kernel disagrees with the reference."""
    act = DTYPES[args.dtype]
    act_bytes = torch.empty((), dtype=act).element_size()
    (_, overrides, cfg, splits), *feed = launches(api, case, args)
    inp = make_inputs(case, device, act, rotate=args.rotate, seed=args.seed)
    rtol = CHECK_RTOL[args.dtype]
    timing = dict(max_replays=args.replays, calls_per_fn=args.rotate,
                  prequeue=not args.no_prequeue)

    row: dict[str, Any] = {"shape": case.name, "H": case.H, "qlen": case.qlen, "B": case.B,
                           "L": case.L, "page_size": case.page_size,
                           "cache": "fp8" if case.fp8 else args.dtype,
                           "dtype": args.dtype, "Lk": LK, "Lv": LV, "sm_scale": args.sm_scale,
                           "rows": case.B * case.qlen * case.H, "config": cfg,
                           "overrides": overrides, "num_kv_splits": splits,
                           "rotate": args.rotate}

    binp = None
    if feed:
        ((_, bover, bcfg, bsplits),) = feed
        binp = make_baseline_inputs(case, inp)
    fm_ok = flashmla is not None and flashmla_applies(case, args.dtype, device)
    if fm_ok:
        fm_fn, fm_first = flashmla_call(flashmla, inp, case, args.sm_scale)

    if args.check:
        ref = reference(api, inp, case, args.sm_scale)
        ok = _check(row, "check", case.label,
                    make_call(api, inp, case.qlen, splits, args.sm_scale, case.page_size,
                              overrides, 0), inp, ref, rtol)
        if binp is not None:
            ok &= _check(row, "baseline_check", f"{case.label} qlen=1 feed",
                         make_call(api, binp, 1, bsplits, args.sm_scale, case.page_size, bover,
                                   0), binp, ref, rtol)
        if fm_ok:
            fm_ok = _check_flashmla(row, case, fm_first, ref, rtol)
        del ref
        if not ok:
            print(f"FAIL: {case.label} disagrees with decode_verify_ref (tolerance: o {rtol:g} "
                  f"relative, lse {CHECK_LSE_ATOL:g} absolute)", file=sys.stderr)
            sys.exit(1)

    fn = make_call(api, inp, case.qlen, splits, args.sm_scale, case.page_size, overrides)
    t_us, replays = harness.time_call(fn, device, **timing)

    nbytes, nflops = unique_bytes(case, act_bytes), flops(case)
    roof_us, bound = roofline(nbytes, nflops, ceilings["copy_TBps"], ceilings["bf16_mm_TFLOPs"])
    kvb = kv_bytes(case)
    row.update(
        time_us=t_us, replays=replays, prequeued=not args.no_prequeue, unique_bytes=nbytes,
        kv_bytes=kvb, flops=nflops,
        TBps=nbytes / (t_us * 1e-6) / 1e12, TFLOPs=nflops / (t_us * 1e-6) / 1e12,
        roofline_us=roof_us, roofline_bound=bound, roofline_frac=roof_us / t_us,
        roofline_us_anchor_ceilings=roofline(nbytes, nflops, ANCHOR_CEILINGS["copy_TBps"],
                                             ANCHOR_CEILINGS["bf16_mm_TFLOPs"])[0],
        l2_bytes=l2, kv_fits_l2=(None if l2 is None else kvb * args.rotate <= l2),
    )
    if case.name:
        named = SHAPES[case.name]
        row.update(
            vllm_anchor_us=named.vllm_us, anchors_roofline_us=named.roofline_us,
            target=dataclasses.asdict(named.target), target_desc=named.target.describe(),
            passed=named.target.met(t_us, row["roofline_frac"], row["TFLOPs"]),
        )
    if binp is not None:
        fnb = make_call(api, binp, 1, bsplits, args.sm_scale, case.page_size, bover)
        b_us, b_rep = harness.time_call(fnb, device, **timing)
        row.update(baseline_us=b_us, baseline_replays=b_rep, baseline_num_kv_splits=bsplits,
                   baseline_config=bcfg, baseline_roofline_frac=roof_us / b_us,
                   speedup=b_us / t_us)
    if fm_ok:
        try:
            f_us, f_rep = harness.time_call(fm_fn, device, **timing)
            row.update(flashmla_us=f_us, flashmla_replays=f_rep, vs_flashmla=f_us / t_us)
        except Exception as e:  # noqa: BLE001 - their kernel refusing a shape is a note
            row["flashmla_error"] = compile_pool.short_error(e)
    del inp, binp
    return row


def _check(row: dict, field: str, label: str, fn, inp: Inputs, ref: tuple, rtol: float) -> bool:
    res = check_call(fn, inp, ref, rtol)
    row[field] = res
    print(f"  check {label}: o rel err {res['err_o_rel']:.2e}, lse abs err "
          f"{res['err_lse_abs']:.2e} -> {'ok' if res['ok'] else 'FAIL'}")
    return res["ok"]


def _check_flashmla(row: dict, case: Case, first, ref: tuple, rtol: float) -> bool:
    """FlashMLA against the same reference: a wrong or failing FlashMLA gets no time."""
    try:
        res = judge(compare(*first(), *ref), rtol)
    except Exception as e:  # noqa: BLE001
        row["flashmla_error"] = compile_pool.short_error(e)
        return False
    row["flashmla_check"] = res
    print(f"  check {case.label} FlashMLA: o rel err {res['err_o_rel']:.2e}, lse abs err "
          f"{res['err_lse_abs']:.2e} -> {'ok' if res['ok'] else 'FAIL (not timed)'}")
    return res["ok"]


def case_line(case: Case, row: dict, seconds: float) -> str:
    base = (f", qlen=1 feed {row['baseline_us']:.1f} us ({row['speedup']:.2f}x)"
            if "baseline_us" in row else "")
    fm = (f", FlashMLA {row['flashmla_us']:.1f} us ({row['vs_flashmla']:.2f}x)"
          if "flashmla_us" in row else "")
    return (f"  {case.label}: {row['time_us']:.1f} us, {row['roofline_frac']:.0%} of roofline "
            f"{row['roofline_us']:.1f} us ({row['roofline_bound']}), {row['TBps']:.2f} TB/s, "
            f"{row['TFLOPs']:.0f} TFLOP/s{base}{fm}  [{seconds:.1f} s]")


TABLE_COLUMNS = ["shape", "H", "qlen", "B", "L", "cache", "splits", "time_us", "roof_us",
                 "roof_frac", "TB/s", "TFLOP/s", "base_us", "speedup", "target", "pass"]


def table(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """The printed table's rows and columns (FlashMLA's two only when some row has them)."""
    out = []
    for r in rows:
        out.append({
            "shape": r["shape"] or "-", "H": r["H"], "qlen": r["qlen"], "B": r["B"], "L": r["L"],
            "cache": r["cache"] + ("*L2" if r.get("kv_fits_l2") else ""),
            "splits": r["num_kv_splits"], "time_us": r["time_us"], "roof_us": r["roofline_us"],
            "roof_frac": r["roofline_frac"], "TB/s": r["TBps"], "TFLOP/s": r["TFLOPs"],
            "base_us": r.get("baseline_us", ""), "speedup": r.get("speedup", ""),
            "flashmla_us": r.get("flashmla_us", ""), "vs_flashmla": r.get("vs_flashmla", ""),
            "target": r.get("target_desc", ""),
            "pass": {True: "PASS", False: "fail"}.get(r.get("passed"), ""),
        })
    columns = list(TABLE_COLUMNS)
    if any("flashmla_us" in r for r in rows):
        columns[columns.index("target"):columns.index("target")] = ["flashmla_us", "vs_flashmla"]
    return out, columns


# --- draft workloads: ragged draft counts and EAGLE trees (--drafts) ----------------------------


def run_drafts_case(api: Api, drafts: Drafts, case: Case, args: argparse.Namespace,
                    device: str) -> dict:
    """One draft workload (``shapes.DRAFTS``) at ``case``'s H, B, L: the verify call with
    ``qo_indptr`` (ragged) and ``tree_mask`` (trees), timed against (a) the causal verify of the
    same rows (the same call without ``tree_mask``; a ragged chain: the uniform call at the mean
    draft count), (b) every request padded to the most drafts (ragged workloads), and (c) the
    flat feed, one row per draft token with its own length (what engines feed today). Checked
    against the reference first with ``--check`` (exits 1 when off). Returns the row."""
    act = DTYPES[args.dtype]
    qlen, B, H = drafts.max_drafts, case.B, case.H
    counts = draft_counts(drafts, B, args.seed)
    R = sum(counts)
    full = dataclasses.replace(case, qlen=qlen)
    inp = make_inputs(full, device, act, seed=args.seed)
    kv = inp.kv[0]
    ragged = drafts.ragged is not None
    qo_indptr = (torch.tensor([0, *itertools.accumulate(counts)], dtype=torch.int32,
                              device=device) if ragged else None)
    tree_mask = None
    if drafts.tree is not None:
        gen = torch.Generator().manual_seed(args.seed)
        tree_mask = tree_mask_from_parents(
            [eagle_parents(*drafts.tree, n, gen) if n else [] for n in counts], rows=R,
            device=device)
    overrides = launch_overrides(args)
    timing = dict(max_replays=args.replays, prequeue=not args.no_prequeue)
    kw_config = {"config": dict(overrides)} if overrides else {}

    def call(shape: Case, rows: int, table, seq_lens, **extra):
        """``(fn, o, lse, splits)``: the verify call of ``shape`` on q's first ``rows`` rows."""
        cfg = effective_config(api, shape, overrides, args.dtype)
        splits = args.splits or default_splits(api, shape, cfg)
        o = torch.empty(rows, H, LV, dtype=act, device=device)
        lse = torch.empty(rows, H, dtype=torch.float32, device=device)
        ws = (None if splits == 1 else
              torch.empty(rows, H, splits, LV + 1, dtype=torch.float32, device=device))
        q = inp.q[:rows]

        def fn():
            api.decode_attention_fwd_verify(q, kv, kv[..., :LV], o, lse, table, seq_lens, None,
                                            shape.qlen, ws, splits, args.sm_scale,
                                            case.page_size, inp.k_scale, **extra, **kw_config)

        return fn, o, lse, splits

    extra = {k: v for k, v in (("qo_indptr", qo_indptr), ("tree_mask", tree_mask))
             if v is not None}
    fn, o, lse, splits = call(full, R if ragged else B * qlen, inp.req_to_token, inp.seq_lens,
                              **extra)
    row: dict[str, Any] = {"drafts": drafts.name, "title": drafts.title, "H": H, "B": B,
                           "L": case.L, "page_size": case.page_size,
                           "cache": "fp8" if case.fp8 else args.dtype, "dtype": args.dtype,
                           "qlen": qlen, "draft_counts": counts, "rows": R,
                           "padded_rows": B * qlen, "num_kv_splits": splits,
                           "overrides": overrides}
    if args.check:
        ref = api.decode_verify_ref(inp.q[:o.shape[0]], kv, LV, inp.req_to_token, inp.seq_lens,
                                    None, qlen, args.sm_scale, case.page_size, inp.k_scale,
                                    qo_indptr=qo_indptr, tree_mask=tree_mask)
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        res = judge(compare(o[:R], lse[:R], ref[0][:R], ref[1][:R]), CHECK_RTOL[args.dtype])
        row["check"] = res
        print(f"  check {drafts.name} H{H} B{B}: o rel err {res['err_o_rel']:.2e}, lse abs err "
              f"{res['err_lse_abs']:.2e} -> {'ok' if res['ok'] else 'FAIL'}")
        if not res["ok"]:
            print(f"FAIL: {drafts.name} disagrees with decode_verify_ref", file=sys.stderr)
            sys.exit(1)
    row["time_us"] = harness.time_call(fn, device, **timing)[0]

    # (a) the causal verify of the same rows
    if tree_mask is not None:
        fa = call(full, o.shape[0], inp.req_to_token, inp.seq_lens,
                  **({"qo_indptr": qo_indptr} if ragged else {}))[0]
        row["causal_rows"] = R
    else:  # a ragged chain: the uniform call at the mean draft count
        mean = max(1, round(R / B))
        fa = call(dataclasses.replace(case, qlen=mean), B * mean, inp.req_to_token,
                  inp.seq_lens)[0]
        row["causal_rows"] = B * mean
    row["causal_us"] = harness.time_call(fa, device, **timing)[0]
    row["vs_causal"] = row["time_us"] / row["causal_us"]
    # (b) every request padded to the most drafts (the same kernel variant: a tree of chains)
    if ragged:
        pad = ({"tree_mask": tree_mask_from_parents([chain_parents(qlen)] * B, device=device)}
               if tree_mask is not None else {})
        fb = call(full, B * qlen, inp.req_to_token, inp.seq_lens, **pad)[0]
        row["padded_us"] = harness.time_call(fb, device, **timing)[0]
        row["padded_speedup"] = row["padded_us"] / row["time_us"]
        row["padded_target"] = 0.8 * (B * qlen) / max(R, 1)
        row["padded_pass"] = row["padded_speedup"] >= row["padded_target"]
    if tree_mask is not None:
        row["tree_target"] = 1.1
        row["tree_pass"] = row["vs_causal"] <= 1.1
    # (c) the flat feed: one request per draft token, its own length (a chain's: a tree's rows
    # cannot be fed so), the block table repeated per row
    if R:
        per_row = torch.tensor(counts, device=device)
        lens = torch.cat([torch.arange(case.L - n + 1, case.L + 1, device=device)
                          for n in counts]).to(torch.int32)
        table = inp.req_to_token.repeat_interleave(per_row, dim=0).contiguous()
        fc = call(dataclasses.replace(case, qlen=1, B=R), R, table, lens)[0]
        row["flat_us"] = harness.time_call(fc, device, **timing)[0]
        row["flat_speedup"] = row["flat_us"] / row["time_us"]
    del inp
    return row


def drafts_line(row: dict, seconds: float) -> str:
    parts = [f"{row['time_us']:.1f} us", f"causal {row['causal_us']:.1f} ({row['vs_causal']:.2f}x)"]
    if "padded_us" in row:
        parts.append(f"padded {row['padded_us']:.1f} ({row['padded_speedup']:.2f}x faster, "
                     f"target {row['padded_target']:.2f}x)")
    if "flat_us" in row:
        parts.append(f"flat feed {row['flat_us']:.1f} ({row['flat_speedup']:.2f}x)")
    return (f"  {row['drafts']} H{row['H']} B{row['B']} L{row['L']} ({row['rows']} rows): "
            + ", ".join(parts) + f"  [{seconds:.1f} s]")


DRAFTS_COLUMNS = ["drafts", "H", "B", "L", "rows", "time_us", "causal_us", "vs_causal",
                  "padded_us", "vs_padded", "target", "flat_us", "vs_flat", "pass"]


def drafts_table(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """The --drafts mode's printed table: ``vs_causal`` = ours / causal (trees: target <= 1.1),
    ``vs_padded`` = padded / ours (ragged: target >= 0.8 x padded / real rows), ``vs_flat`` =
    flat feed / ours."""
    out = []
    for r in rows:
        passes = [r[k] for k in ("tree_pass", "padded_pass") if k in r]
        target = "; ".join(t for t in (
            "tree<=1.1x" if "tree_pass" in r else "",
            f"pad>={r['padded_target']:.2f}x" if "padded_target" in r else "") if t)
        out.append({
            "drafts": r["drafts"], "H": r["H"], "B": r["B"], "L": r["L"], "rows": r["rows"],
            "time_us": r["time_us"], "causal_us": r["causal_us"], "vs_causal": r["vs_causal"],
            "padded_us": r.get("padded_us", ""), "vs_padded": r.get("padded_speedup", ""),
            "target": target, "flat_us": r.get("flat_us", ""),
            "vs_flat": r.get("flat_speedup", ""),
            "pass": ("PASS" if all(passes) else "fail") if passes else "",
        })
    return out, list(DRAFTS_COLUMNS)
