"""Host side of the Gluon (sm_90) encoder attention: support check, TMA descriptors, grid,
launch. The kernel is ``gluon_kernels.prefill_fwd_ws``.

The caller (``launch.py``) keeps the op's checks and the table selection; this module says
whether the Gluon kernel covers a launch (:func:`gluon_unsupported_shape` on facts the table
routes on, :func:`gluon_unsupported_reason` on the tensors) and launches it.

Capture-safe: nothing is allocated and nothing waits for the device. The six TMA descriptors are
host structs passed by value (a captured graph holds them); they encode the base pointers and
strides of q / k / v, so a graph replays on the tensors it was captured with (as for every
other pointer argument).
"""

from __future__ import annotations

from typing import Any

import torch

from ..fastpath import launch
from ..gluon_support import descriptor, gl, load_kernels, sm90_reason
from ..host import cdiv

__all__ = [
    "GLUON_DEFAULT_CONFIG",
    "gluon_available",
    "gluon_unsupported_shape",
    "gluon_unsupported_reason",
    "gluon_shared_bytes",
    "launch_prefill_gluon",
]

# Config keys of the Gluon encoder kernel (and their only / default values):
GLUON_DEFAULT_CONFIG: dict[str, Any] = {
    # query rows per CTA: two consumer warpgroups of 64 rows (one wgmma M each). Fixed.
    "BLOCK_M": 128,
    # keys per block: the score wgmma's N. 128 up to head dim 128; 64 at 256 (the 64 x 256 fp32
    # accumulator takes 128 registers of a thread already).
    "BLOCK_N": 128,
    # K/V ring depth (separate K and V stages). Shared memory: Q 128 x D + stages x 2 x BLOCK_N
    # x D 16-bit values (gluon_shared_bytes), within 227 KB.
    "NUM_STAGES": 2,
    # 0: scores, softmax, P.V in sequence per block; 1: the P.V of block j - 1 in flight under
    # the softmax of block j (FA3's intra-warpgroup overlap).
    "PIPELINE": 1,
    # 1 (needs PIPELINE): the two groups take turns issuing their wgmmas, one group's softmax
    # under the other's wgmmas (FA3's ping-pong).
    "PINGPONG": 0,
    # 1: P goes to the P.V wgmmas through a shared tile per group (64 x BLOCK_N) instead of
    # registers.
    "P_SMEM": 0,
    # where the softmax's exponentials run: 0 on the MUFU; 2 (half of each score tile) or 4 (a
    # quarter) on the FMA pipes instead (prefill/kernels.exp2_fma, FA4's trick).
    "EXP2_FMA": 0,
    # 1: every exponential replaced by one FMA. An ablation for benchmarks (how much of the
    # time the exponentials cost): its results are wrong, and no table selects it.
    "EXP2_ABLATE": 0,
    # registers per thread of the second consumer group / of the producer warp (setmaxnreg);
    # the first group (the default partition) keeps the rest of the 3 x 168 launch budget.
    "CONSUMER_REGS": 240,
    "PRODUCER_REGS": 24,
    # warps of the default partition (the first consumer warpgroup); the kernel has 4 + 4 + 1.
    "num_warps": 4,
}

# Head dims the kernel was checked at on the H200 (tests/test_gluon_prefill.py's GPU cases).
# Others of a supported split (88, 112, ...) use the same code path (columns past the head dim
# read as zeros) but stay on the portable kernel until a GPU run has checked them.
VERIFIED_HEAD_DIMS = (64, 72, 80, 96, 128, 256)

SMEM_LIMIT = 232448  # bytes of shared memory a CTA may have on sm_90 (227 KB)

# The kernels (None where they do not import) and gluon_available(): None, or why not.
_gk, gluon_available = load_kernels(__package__)


def gluon_shared_bytes(split: tuple[int, int], cfg: dict[str, Any]) -> int:
    """Shared memory of one CTA (tiles only; the barriers and the row-sum scratch are about a
    kilobyte more): Q ``[128, D]`` + ``NUM_STAGES`` x (K + V) ``[BLOCK_N, D]`` (+ two P tiles
    ``[64, BLOCK_N]`` with ``P_SMEM``), 16-bit."""
    width = split[0] + split[1]
    p_tiles = 2 * 64 * cfg["BLOCK_N"] if cfg.get("P_SMEM") else 0
    return 2 * (width * (cfg["BLOCK_M"] + 2 * cfg["NUM_STAGES"] * cfg["BLOCK_N"]) + p_tiles)


def gluon_unsupported_shape(device: torch.device, dtype: torch.dtype, head_dim: int,
                            split: tuple[int, int], windowed: bool,
                            cfg: dict[str, Any] | None = None) -> str | None:
    """None when the Gluon kernel can run launches of these facts (no tensors needed: the table
    routes on this), else a short reason (the portable kernel runs them).

    Supported: triton 3.6.x, a CUDA GPU of compute capability 9.0, fp16 / bf16, head dims 64,
    72, 80, 96, 128 and 256 (:data:`VERIFIED_HEAD_DIMS`; the splits 64 + 0/16/32, 128 + 0,
    256 + 0), causal or not, GQA, sinks, variable lengths. Not supported: sliding windows
    (either side), fp32, other head dims (a tail beside a 128-wide block, 144-192, was never
    compiled; 88, 112 and the like were not checked on the GPU).
    """
    why = gluon_available()
    if why:
        return why
    c = {**GLUON_DEFAULT_CONFIG, **(cfg or {})}
    if c["BLOCK_M"] != 128:
        return f"BLOCK_M {c['BLOCK_M']}: the Gluon kernel is written for 128 (2 x 64 rows)"
    if c["BLOCK_N"] not in (64, 128):
        return f"BLOCK_N {c['BLOCK_N']}: 64 or 128"
    if c["NUM_STAGES"] < 2:
        return "NUM_STAGES must be >= 2"
    if c["PINGPONG"] and not c["PIPELINE"]:
        return "PINGPONG needs PIPELINE"
    if c["EXP2_FMA"] not in (0, 2, 4):
        return f"EXP2_FMA {c['EXP2_FMA']}: 0, 2 or 4"
    why = sm90_reason(device)
    if why:
        return why
    if dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {dtype}: fp16 / bf16 only (wgmma on 16-bit operands)"
    main, tail = split
    if main not in (64, 128, 256) or tail not in (0, 16, 32) or (main > 64 and tail):
        return (f"head dim {head_dim} (split {main}+{tail}): 64 + 0/16/32, 128 or 256 only "
                f"(no tail beside a 128-wide block: not compiled or measured)")
    if head_dim not in VERIFIED_HEAD_DIMS:
        return f"head dim {head_dim}: not yet checked on the GPU (verified: {VERIFIED_HEAD_DIMS})"
    if windowed:
        return "sliding windows run on the portable kernel"
    if cfg is None:
        # The table's fact: the launch's shape only. BLOCK_N and the ring depth come from the
        # rule it selects, checked against them here again before the launch.
        return None
    if main == 256 and c["BLOCK_N"] > 64:
        return "head dim 256 needs BLOCK_N 64 (registers)"
    if gluon_shared_bytes(split, c) > SMEM_LIMIT - 2048:
        return f"shared memory {gluon_shared_bytes(split, c)} B > 227 KB: fewer stages or BLOCK_N"
    return None


def gluon_unsupported_reason(q, k, v, o, split, windowed, cfg) -> str | None:
    """:func:`gluon_unsupported_shape` for these tensors, plus what only the tensors show: the
    copy engine needs 16-byte aligned bases and token / head strides (every stride a multiple
    of 8 elements) and unit last-dim strides."""
    why = gluon_unsupported_shape(q.device, q.dtype, q.shape[-1], split, windowed, cfg)
    if why:
        return why
    for name, t in (("q", q), ("k", k), ("v", v)):
        token, head, last = t.stride()
        if last != 1:
            return f"{name}: last dim not contiguous"
        size = t.element_size()
        if t.data_ptr() % 16 or (token * size) % 16 or (head * size) % 16:
            return f"{name}: base / token / head strides not 16-byte aligned (TMA)"
    if q.shape[0] >= 2**31 - 256:
        return "more than 2**31 tokens: TMA coordinates are 32-bit"
    return None


def _descriptor(t: torch.Tensor, rows: int, width: int):
    """A rank-3 host descriptor over ``t`` ``[tokens, heads, D]`` with boxes ``[rows, 1, width]``
    (columns past D read as zeros)."""
    gdt = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    return descriptor(t, t.shape, t.stride(), (rows, 1, width), gdt)


def launch_prefill_gluon(q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal,
                         qk_scale, sinks, split, cfg) -> None:
    """Launch the Gluon kernel (``gluon_unsupported_reason`` must have returned None).

    Args as ``launch.context_attention_fwd`` after its checks; ``qk_scale`` is the softmax scale
    times log2(e); ``split`` = ``(BLOCK_D, BLOCK_D_TAIL)``; ``cfg`` the keys of
    :data:`GLUON_DEFAULT_CONFIG`. Grid ``(max(cdiv(max_input_len, 128), 1), Hq, B)``.
    Out-of-range starts, lengths and ``max_input_len`` are clamped and marked as in the
    portable kernel (``o = NaN`` in the rows concerned), never read or written outside q/k/v/o.
    """
    c = {**GLUON_DEFAULT_CONFIG, **(cfg or {})}
    total, hq, head_dim = q.shape
    batch = b_seq_len.shape[0]
    if total == 0 or batch == 0 or hq == 0:
        return
    main, tail = split
    bn = c["BLOCK_N"]
    q_desc = _descriptor(q, 64, main)
    k_desc = _descriptor(k, bn, main)
    v_desc = _descriptor(v, bn, main)
    if tail:
        qt_desc, kt_desc, vt_desc = _descriptor(q, 64, tail), _descriptor(k, bn, tail), _descriptor(v, bn, tail)
    else:
        qt_desc, kt_desc, vt_desc = q_desc, k_desc, v_desc
    # At least one row block: a max_input_len of 0 with a non-empty sequence still marks it.
    grid = (max(1, cdiv(max_input_len, c["BLOCK_M"])), hq, batch)
    launch(_gk.prefill_fwd_ws, grid,
        q_desc, qt_desc, k_desc, kt_desc, v_desc, vt_desc, o,
        sinks if sinks is not None else o, b_start_loc, b_seq_len, float(qk_scale),
        o.stride(0), o.stride(1), hq // k.shape[1], total, int(max_input_len),
        HEAD_DIM=head_dim, BLOCK_N=bn, NUM_STAGES=c["NUM_STAGES"], IS_CAUSAL=bool(is_causal),
        HAS_SINKS=sinks is not None, PIPELINE=bool(c["PIPELINE"]),
        PINGPONG=bool(c["PINGPONG"] and c["PIPELINE"]), P_SMEM=bool(c["P_SMEM"]),
        PRODUCER_REGS=c["PRODUCER_REGS"], CONSUMER_REGS=c["CONSUMER_REGS"],
        EXP2=-1 if c["EXP2_ABLATE"] else int(c["EXP2_FMA"]),
        num_warps=c["num_warps"],
    )
