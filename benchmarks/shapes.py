"""The named shapes, the anchors measured on them, the roofline formulas and the sweep grids.

Decode verify: M1–M7 (MLA, ``Lk = 576`` = 512 latent + 64 rope, ``Lv = 512``, page 64,
``sm_scale`` 0.1352). Their anchors were measured on one H200 (132 SMs, torch 2.11.0+cu130,
triton 3.6.0) on 2026-11-30:

- ``vllm_us``: vLLM 0.33's Triton MLA decode (``decode_attention_fwd(..., is_mla=True)``) fed
  the way its TRITON_MLA backend feeds a verify batch: one row per verify token, the block
  table repeated per token, per-row causal lengths, ``num_kv_splits = min(next_pow2(L // 512),
  2 * SMs)``; CUDA-graph medians.
- ``roofline_us``: ``max(unique bytes / 4.27 TB/s, FLOPs / 678.5 TFLOP/s)``, the ceilings of
  that machine (device-to-device copy, bytes read + written; an 8192³ bf16 matmul), with
  unique bytes and FLOPs as :func:`unique_bytes` and :func:`flops` count them.

Encoder attention: P1–P8 (bf16, non-causal, 16 heads). The targets of both kernels were set
with these anchors on 2026-11-30; :class:`Target` and :data:`PREFILL_TARGET_RATIO` hold them.
"""

from __future__ import annotations

import dataclasses
import itertools

LK, LV = 576, 512
DEFAULT_PAGE_SIZE = 64
DEFAULT_SM_SCALE = 0.1352

# The ceilings of the anchors' H200 (the roofline column of SHAPES): used where a run does
# not measure its own (``--no-ceilings``, the interpreter).
ANCHOR_CEILINGS = {"copy_TBps": 4.27, "bf16_mm_TFLOPs": 678.5,
                   "source": "nominal: the anchors' H200, 2026-11-30 (not measured)"}


# --- decode verify ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Target:
    """What is asked of a shape: ``kind`` is ``time_us`` (at most ``value`` µs),
    ``roofline_frac`` (at least ``value`` of the measured roofline) or ``tflops`` (at least
    ``value`` TFLOP/s); ``target_us`` is the same target as a time at the anchors' ceilings."""

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
    """One decode-verify launch: ``B`` requests of ``qlen`` verify tokens over ``L`` keys."""

    H: int
    qlen: int
    B: int
    L: int
    fp8: bool = False
    page_size: int = DEFAULT_PAGE_SIZE
    name: str | None = None  # "M1" … for the named shapes

    @property
    def cache(self) -> str:
        return "fp8" if self.fp8 else "bf16"

    @property
    def key(self) -> str:
        """``H16-q2-B1-L8192-bf16-p64``: how sweep logs and tables name a point."""
        return f"H{self.H}-q{self.qlen}-B{self.B}-L{self.L}-{self.cache}-p{self.page_size}"

    @property
    def label(self) -> str:
        return f"{self.name} ({self.key})" if self.name else self.key


def parse_case(text: str) -> Case:
    """``H,qlen,B,L[,fp8]`` (heads, verify tokens, batch, keys, fp8 for an fp8 cache) as a
    ``Case``; an ``argparse`` type, so a bad one is a usage error naming it."""
    import argparse

    parts = text.split(",")
    if len(parts) not in (4, 5) or (len(parts) == 5 and parts[4] != "fp8"):
        raise argparse.ArgumentTypeError(f"{text!r}: H,qlen,B,L or H,qlen,B,L,fp8")
    try:
        H, qlen, B, L = (int(p) for p in parts[:4])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: H, qlen, B and L are integers") from None
    if min(H, qlen, B, L) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: H, qlen, B and L are positive")
    return Case(H, qlen, B, L, fp8=len(parts) == 5)


@dataclasses.dataclass(frozen=True)
class NamedShape:
    case: Case
    title: str
    vllm_us: float  # the anchor: vLLM 0.33's Triton MLA decode, fed one row per verify token
    roofline_us: float  # at the anchors' ceilings (ANCHOR_CEILINGS)
    target: Target


def _shape(name, title, H, qlen, B, L, fp8, vllm_us, roofline_us, kind, value, target_us):
    return NamedShape(Case(H, qlen, B, L, fp8, DEFAULT_PAGE_SIZE, name), title, vllm_us,
                      roofline_us, Target(kind, value, target_us))


SHAPES: dict[str, NamedShape] = {
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
# partial last page and two verify tokens (more than one KV split takes --min-split-len 16).
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
    """The KV once, plus q, o (dtype of q) and the fp32 lse once."""
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


def baseline_case(case: Case) -> Case:
    """The one-row-per-token feed's launch shape: ``B*qlen`` requests of qlen 1."""
    return dataclasses.replace(case, qlen=1, B=case.B * case.qlen, name=None)


def baseline_seq_lens(L: int, qlen: int, B: int) -> list[int]:
    """Per-token KV lengths of the one-row-per-token feed: request ``b*qlen + t`` sees
    ``L - qlen + 1 + t`` keys, exactly the verify row limits."""
    return row_limits(L, qlen) * B


# --- draft workloads: ragged draft counts and EAGLE trees (issue 24) ---------------------------


@dataclasses.dataclass(frozen=True)
class Drafts:
    """A verify batch's drafts: ``max_drafts`` rows a request at most (the kernel's qlen);
    ``tree``: each request's drafts an EAGLE tree of ``(topk, depth)``
    (``mla_ops.draft_trees.eagle_parents``), else a chain; ``ragged``: each request's draft
    count drawn uniformly from ``(lo, hi)``, else ``max_drafts`` each."""

    name: str
    title: str
    max_drafts: int
    tree: tuple[int, int] | None = None
    ragged: tuple[int, int] | None = None


DRAFTS: dict[str, Drafts] = {d.name: d for d in (
    Drafts("eagle8", "EAGLE tree, topk 2 x depth 3 + root: 8 drafts", 8, tree=(2, 3)),
    Drafts("eagle16", "EAGLE tree, topk 4 x depth 4 pruned to 16 drafts", 16, tree=(4, 4)),
    Drafts("ragged8", "ragged chains, qlen_b uniform in 1..8", 8, ragged=(1, 8)),
    Drafts("ragged8-eagle", "ragged EAGLE trees (topk 2 x depth 3), qlen_b uniform in 1..8", 8,
           tree=(2, 3), ragged=(1, 8)),
)}
# The --drafts mode's grid unless --heads / --batch / --seq-len say otherwise; under
# --interpret: 2 heads, 2 requests of 80 keys, pages of 16.
DRAFT_HEADS, DRAFT_BATCH, DRAFT_SEQ_LEN = (16, 128), 32, 4096
INTERPRET_DRAFTS = dict(H=2, B=2, L=80, page_size=16)


def draft_counts(drafts: Drafts, B: int, seed: int) -> list[int]:
    """Each request's draft count (``qlen_b``), drawn with ``seed``."""
    import random

    if drafts.ragged is None:
        return [drafts.max_drafts] * B
    rng = random.Random(seed)
    return [rng.randint(*drafts.ragged) for _ in range(B)]


# --- the decode sweep's grid --------------------------------------------------------------------

GRID_HEADS = (16, 128)
GRID_QLENS = (1, 2, 4, 8)
GRID_BL = ((1, 8192), (32, 4096), (128, 4096), (16, 32768))
# Tile points beyond M1–M7: the longest draft and single-token decode at H=16.
EXTRA_TILE_POINTS = (Case(16, 8, 32, 4096, False), Case(16, 1, 128, 4096, False))


def grid_points(heads=GRID_HEADS, qlens=GRID_QLENS, bl=GRID_BL, caches=(False, True),
                page_size=DEFAULT_PAGE_SIZE) -> list[Case]:
    """The representative grid, each named shape carrying its name."""
    named = {(s.case.H, s.case.qlen, s.case.B, s.case.L, s.case.fp8): n for n, s in SHAPES.items()}
    pts = []
    for h, q, (b, L), fp8 in itertools.product(heads, qlens, bl, caches):
        name = named.get((h, q, b, L, fp8)) if page_size == DEFAULT_PAGE_SIZE else None
        pts.append(Case(h, q, b, L, fp8, page_size, name))
    return pts


def tile_points(grid: list[Case], named_only: bool = False) -> list[Case]:
    """The grid's named shapes plus ``EXTRA_TILE_POINTS``; the whole grid if it has none."""
    page = grid[0].page_size if grid else DEFAULT_PAGE_SIZE
    extra = set() if named_only else {
        dataclasses.replace(c, page_size=page).key for c in EXTRA_TILE_POINTS}
    pts = [p for p in grid if p.name or p.key in extra]
    return pts or list(grid)


# --- encoder attention --------------------------------------------------------------------------

# name -> (batch, seq, heads, head_dim)
PREFILL_SHAPES = {
    "P1": (1, 3520, 16, 64),
    "P2": (1, 3520, 16, 72),
    "P3": (1, 3520, 16, 80),
    "P4": (1, 3520, 16, 96),
    "P5": (1, 3520, 16, 128),
    "P6": (1, 3520, 16, 256),
    "P7": (4, 4096, 16, 72),
    "P8": (4, 4096, 16, 80),
}
# Targets by head dim, as a multiple of the fastest SDPA backend's speed.
PREFILL_TARGET_RATIO = {64: 1.0, 72: 1.2, 80: 1.2, 96: 1.0, 128: 1.0, 256: 0.8}
# What --interpret runs when no shape is given (the CPU interpreter: tiny, the 64+16 split).
PREFILL_INTERPRET = (1, 48, 2, 72)


def prefill_tflops(batch: int, seq: int, heads: int, head_dim: int, causal: bool,
                   ms: float) -> float:
    """``4*B*S^2*H*D`` (halved when causal) at the real head dim, per ``ms``."""
    nflops = 4.0 * batch * seq * seq * heads * head_dim * (0.5 if causal else 1.0)
    return nflops / (ms * 1e-3) / 1e12


# --- ViT towers (end to end) --------------------------------------------------------------------

# SigLIP (Gemma 3's encoder) and Qwen2.5-VL's vision tower, at 896x896 images, patch 14.
TOWERS = {
    "siglip": dict(layers=27, width=1152, heads=16, mlp=4304, swiglu=False, rms=False),
    "qwen2.5-vl": dict(layers=32, width=1280, heads=16, mlp=3420, swiglu=True, rms=True),
}
TOWER_IMAGE, TOWER_PATCH = 896, 14
# --interpret: two layers of 2 heads of 40 over a 56x56 image (16 tokens).
INTERPRET_TOWER = dict(layers=2, width=80, heads=2, mlp=96, swiglu=True, rms=True)
INTERPRET_IMAGE = 56
