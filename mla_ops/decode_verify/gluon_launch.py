"""Host side of the Gluon (sm_90) stage 1 of the decode-verify attention: support check,
TMA descriptors, grid, launch. The kernels are ``gluon_kernels._verify_stage1_alt``,
``_verify_stage1_seesaw`` and ``_verify_stage1_ws``.

The caller (``launch.py``) keeps the checks of the public API, the split count, the workspace
and the stage 2: this module only launches stage 1. With ``num_kv_splits == 1`` stage 1 writes
``o`` / ``lse`` itself; otherwise it writes the partials into the split workspace (the op's
``attn_logits``, ``[B*qlen, H, num_kv_splits, Lv + 1]`` fp32, each split's ``o`` normalized by
its own ``l`` in ``[..., :Lv]``, its natural-log LSE in ``[..., Lv]``) and the caller launches
the portable stage 2 (``kernels._fwd_verify_stage2``) with **this config's** ``SPLIT_ALIGN``
and ``MIN_SPLIT_LEN`` (both stages chunk by ``splits.split_chunk``).

Capture-safe: nothing is allocated and nothing waits for the device. The two TMA descriptors
are host structs passed by value (a captured graph holds them); they encode the cache's and
q's base pointers and strides, so a graph replays on the tensors it was captured with (as for
every other pointer argument).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from .. import platform
from ..fastpath import ENV_OFF, launch
from ..gluon_support import descriptor, gl, load_kernels, sm90_reason
from ..host import cache_bounds, cache_geometry, cdiv
from ..numerics import exp2_scale

__all__ = [
    "GLUON_DEFAULT_CONFIG",
    "gluon_available",
    "gluon_unsupported_shape",
    "gluon_unsupported_reason",
    "gluon_row_blocks",
    "swapab_takes",
    "grid_takes",
    "launch_verify_stage1_gluon",
    "cta_timeline",
]

# Config keys of the Gluon stage 1 (and their only / default values):
GLUON_DEFAULT_CONFIG: dict[str, Any] = {
    # rows (verify token, head) per CTA: one wgmma M. Fixed: the kernel is written for 64.
    "BLOCK_H": 64,
    # KV tokens per block (one TMA batch of 9 column tiles [BLOCK_N, 64]). Fixed at 64: a
    # block must lie in one page (page_size % BLOCK_N == 0) and is the scores wgmma's N.
    "BLOCK_N": 64,
    # KV ring depth. 2 is what fits: "alt": Q 64 KB + 2 x 72 KB + 2 P tiles of 8 KB = 231 KB of
    # the 227 KiB (232448 B) a CTA may have (fp8: the same, each fp8 block staged inside its
    # fp16 stage); "redundant": Q 72 KB + 2 x 72 KB = 221 KB; fp8: Q 72 KB + an fp16 block
    # 72 KB + 2 fp8 stages of 36 KB = 221 KB.
    "NUM_STAGES": 2,
    # split chunking, as in the portable kernel: chunks of max(cdiv(L, splits), MIN_SPLIT_LEN)
    # rounded up to SPLIT_ALIGN (a multiple of BLOCK_N). Stage 2 must use the same values.
    "SPLIT_ALIGN": 64,
    "MIN_SPLIT_LEN": 256,
    # registers per thread of each consumer warpgroup / of the producer warp (setmaxnreg).
    # 232 / 24: the parent's leftover of the 3 x 168 launch budget, 248, goes to the first
    # consumer group (the default partition). ptxas (sm_90a): redundant bf16 0 spills, fp8
    # <= 8 B, alt 4-24 B (scalars outside the block loop); other pairs spilled more.
    "CONSUMER_REGS": 232,
    "PRODUCER_REGS": 24,
    # fp8 caches on the alt schedule: registers per thread of the 4-warp converter partition
    # that replaces the producer warp (``_converter_pair``: two tiles at a time); with 232 per
    # consumer group the default partition keeps 232 of the 3 x 168. (The seesaw's converter
    # warps, ``_converter_seesaw``, convert 32 values per thread at a time in PRODUCER_REGS:
    # its first group needs the 248 that leaves it.)
    "CONVERTER_REGS": 40,
    # warps of the default partition (the first consumer warpgroup); the kernel has 4 + 4 + 1
    # (4 + 4 + 1 + 1 with STAGE_PRODUCERS; 4 + 4 + 4 with the fp8 converter warps).
    "num_warps": 4,
    # bf16 caches: "alt" (block j's scores and softmax by consumer group j % 2 only, P shared
    # through shared memory: gluon_kernels._verify_stage1_alt), "seesaw" (FlashMLA's order over
    # block pairs: only the row max between the two softmaxes, the owner's P from registers,
    # ring parts refilled at their last reader: _verify_stage1_seesaw) or "redundant" (both
    # groups compute every block's scores, no exchange: _verify_stage1_ws). fp8 caches: "alt"
    # and "seesaw" with converter warps that dequantize each block in its ring stage,
    # "redundant" (the consumer groups dequantize into one fp16 tile). Either cache: "swapab"
    # where a request's rows fit in 32 (``swapab_takes``), the 64 keys of a block as the
    # wgmma's M and the rows as its N (_verify_stage1_swapab); "alt" runs the launches it does
    # not take.
    "SCHEDULE": "alt",
    # "alt" only: a group issues the score wgmmas of its next block before it waits for the other
    # group's P (they overlap the other group's softmax) instead of after its P.V wgmma on it.
    "QK_FIRST": 0,
    # "alt" without QK_FIRST: a group waits for its P.V on the other group's block and releases
    # its half of that stage before it issues its next scores (instead of waiting for both).
    "EARLY_RELEASE": 0,
    # "seesaw" only: group 1 multiplies group 0's P before its own, so that a pair's first
    # stage is free in its middle and the next block loads under the pair's second half.
    "STAGE_ORDER": 0,
    # "seesaw" only: one producer warp per ring stage (in the producer warpgroup's idle padding;
    # fp8: 2 converter warps per stage), so that a part released late in one stage does not
    # hold back the other stage's refill.
    "STAGE_PRODUCERS": 0,
    # "alt" and "seesaw" (the redundant schedule ignores it): o (or the split's partial) goes to
    # global memory through the ring, free once both groups are past their block loops
    # (``gluon_kernels._out_tile``), a warp store per row's 32 consecutive values, instead of
    # straight from the accumulators (8 rows x 32 bytes per store: every sector of the split
    # workspace's 4-byte-aligned rows, Lv + 1 floats, written in two halves).
    "STAGE_OUT": 0,
    # "alt" and "seesaw": the P tiles (and the seesaw's row maxima) pass between the two consumer
    # groups on hardware named barriers (every thread's bar.arrive / bar.sync) instead of
    # mbarriers (a bar.sync of the group's 128 threads, then one thread's arrive; the taker polls
    # the phase). Passed to the kernel only when set (without it the kernel is the one before).
    "NAMED_EXCHANGE": 0,
    # "swapab" only: the two consumer groups take alternate blocks (a ring stage each), each with
    # all 512 columns of O^T, merged through shared memory at the split's end, instead of both
    # computing every block's scores for half of O^T each (gluon_kernels._consumer_swapab_blocks).
    "SWAPAB_BLOCKS": 0,
    # "swapab" with a bf16 cache, not with SWAPAB_BLOCKS: each group computes the scores over
    # its own ring half's 256 (+ 64 rope) columns and the two [64, R] fp32 partials are summed
    # through Q's unread shared rows (gluon_kernels._exchange_scores), so each K and Q tile is
    # read by one group instead of both. Passed to the kernel only when it applies.
    "SPLIT_SCORES": 0,
    # "swapab" with a bf16 cache, not with SWAPAB_BLOCKS: the softmax's reductions over a block's
    # keys (the wgmma's M, across the group's 4 warps) off the block's chain: 1 the rows' sums
    # kept per key and reduced once after the loop; 2 and the row max with one group barrier
    # (gluon_kernels._swapab_softmax). Passed to the kernel only when it applies.
    "LEAN_SOFTMAX": 0,
    # balanced splits (``splits.py``; the config keys of ``configs.py``): 0, or b >= 2. Passed
    # to the kernel only when set and the launch has splits.
    "BALANCE": 0,
    # "swapab" with a bf16 cache and splits (``grid_takes``): 1, the balanced grid of
    # ``splits.py``: one CTA per SM, each taking an equal share of the batch's blocks (and of
    # REQUEST_COST units per request) across request boundaries, a partial per request it meets,
    # the next one's Q loaded under the current one's tail; the split cap is its slot count
    # (``splits.grid_num_kv_splits``). Passed to the kernel only where it applies.
    "GRID": 0,
    "REQUEST_COST": 2,
}

_LK, _LV = 576, 512  # the head dims the kernel is written for (DeepSeek MLA)

# The kernels (None where they do not import) and gluon_available(): None, or why not.
_gk, gluon_available = load_kernels(__package__)


def swapab_takes(qlen: int, num_heads: int, *, tree: bool, ragged: bool, context_parallel: bool) -> bool:
    """Whether the "swapab" schedule runs a launch of these facts: a request's rows (qlen * H,
    H < 64) fit in its 32 wgmma columns, without a draft tree (the kernel has no tree mask),
    ragged draft counts or context parallelism (its ``qo_indptr`` and rank paths compile, but
    have not run on a GPU yet); "alt" runs the others."""
    return (num_heads < 64 and qlen * num_heads <= 32 and not tree and not ragged
            and not context_parallel)


def grid_takes(cfg: dict[str, Any], qlen: int, num_heads: int, *, fp8: bool, tree: bool, ragged: bool,
               context_parallel: bool, single: bool) -> bool:
    """Whether a launch of these facts runs on the balanced grid: the config's GRID on the bf16
    swap-AB kernel (``swapab_takes``, not SWAPAB_BLOCKS) with a split workspace, without
    BALANCE; the others run the config without it."""
    c = {**GLUON_DEFAULT_CONFIG, **(cfg or {})}
    return (bool(c["GRID"]) and c["SCHEDULE"] == "swapab" and not c["SWAPAB_BLOCKS"] and not c["BALANCE"]
            and not fp8 and not single
            and swapab_takes(qlen, num_heads, tree=tree, ragged=ragged, context_parallel=context_parallel))


def gluon_row_blocks(qlen: int, num_heads: int) -> int:
    """CTAs per (request, split): 64-row blocks, each of whole tokens (H <= 64) or of 64 heads
    of one token (H >= 64). Equals ``cdiv(qlen * H, 64)`` for the supported H."""
    if num_heads >= 64:
        return qlen * (num_heads // 64)
    return cdiv(qlen, 64 // num_heads)


def gluon_unsupported_shape(device: torch.device, q_dtype: torch.dtype, kv_dtype: torch.dtype,
                            num_heads: int, Lk: int, Lv: int, page_size: int,
                            cfg: dict[str, Any] | None = None) -> str | None:
    """None when the Gluon stage 1 can run launches of these facts (no tensors needed: the
    tables route on this), else a short reason (the portable kernel runs them).

    Supported: triton 3.6.x, a CUDA GPU of compute capability 9.0 (wgmma, TMA, setmaxnreg),
    bf16 q, a bf16 or fp8 e4m3 (``torch.float8_e4m3fn``) cache, ``Lk = 576`` and ``Lv = 512``,
    H a power of two that divides 64 or a multiple of 64, ``page_size`` a multiple of 64.
    Everything else (fp16 / fp32 q, other head dims, pages of 16 or 32 tokens, ...) gets a
    reason.
    """
    why = gluon_available()
    if why:
        return why
    c = {**GLUON_DEFAULT_CONFIG, **(cfg or {})}
    if c["BLOCK_H"] != 64 or c["BLOCK_N"] != 64:
        return f"BLOCK_H {c['BLOCK_H']} / BLOCK_N {c['BLOCK_N']}: the Gluon kernel is written for 64 / 64"
    if c["SPLIT_ALIGN"] % c["BLOCK_N"] or c["MIN_SPLIT_LEN"] < 1:
        return f"SPLIT_ALIGN {c['SPLIT_ALIGN']} must be a multiple of BLOCK_N {c['BLOCK_N']}"
    if c["NUM_STAGES"] < 2:
        return "NUM_STAGES must be >= 2"
    if c["SCHEDULE"] not in ("alt", "seesaw", "redundant", "swapab"):
        return f"SCHEDULE {c['SCHEDULE']!r}: 'alt', 'seesaw', 'redundant' or 'swapab'"
    if c["SCHEDULE"] in ("alt", "seesaw", "swapab") and c["NUM_STAGES"] != 2:
        return f"SCHEDULE {c['SCHEDULE']!r} is written for NUM_STAGES 2"
    why = sm90_reason(device)
    if why:
        return why
    if q_dtype != torch.bfloat16:
        return f"q dtype {q_dtype}: bf16 only"
    if kv_dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        return f"cache dtype {kv_dtype}: bf16 or float8_e4m3fn only"
    if Lk != _LK or Lv != _LV:
        return f"head dims Lk {Lk}, Lv {Lv}: only {_LK} / {_LV}"
    h = num_heads
    if not (h >= 1 and (64 % h == 0 if h < 64 else h % 64 == 0)):
        return f"H {h}: a power of two dividing 64, or a multiple of 64"
    if page_size % c["BLOCK_N"]:
        return f"page_size {page_size}: a multiple of {c['BLOCK_N']} only (a KV block is one TMA box in one page)"
    return None


def gluon_unsupported_reason(q, k_buffer, page_size, Lv, cfg) -> str | None:
    """:func:`gluon_unsupported_shape` for these tensors, plus what only the tensors show: the
    16-byte aligned base pointers and strides that TMA needs, unit last-dim strides."""
    if k_buffer.shape[-1] != q.shape[-1] or k_buffer.dim() not in (3, 4) or k_buffer.shape[-2] != 1:
        return "cache is not [pages, page_size, 1, Lk] / [pages * page_size, 1, Lk]"
    why = gluon_unsupported_shape(q.device, q.dtype, k_buffer.dtype, q.shape[1], q.shape[-1], Lv,
                                  page_size, cfg)
    if why:
        return why
    if q.stride(-1) != 1 or k_buffer.stride(-1) != 1:
        return "last dim not contiguous"
    _, s_page, s_tok = cache_geometry(k_buffer, page_size)
    qe, ke = q.element_size(), k_buffer.element_size()
    if q.data_ptr() % 16 or (q.stride(0) * qe) % 16 or (q.stride(1) * qe) % 16:
        return "q base / strides not 16-byte aligned (TMA)"
    if k_buffer.data_ptr() % 16 or (s_page * ke) % 16 or (s_tok * ke) % 16:
        return "cache base / strides not 16-byte aligned (TMA)"
    if k_buffer.dim() == 3 and k_buffer.shape[0] % page_size:
        return "3-D cache rows not a multiple of page_size"
    if cache_geometry(k_buffer, page_size)[0] == 0:
        return "the cache has no pages (a TMA descriptor needs one)"
    return None


def _descriptors(q, k_buffer, page_size, block_n):
    """Host TMA descriptors: q as ``[B*qlen, H, Lk]`` with boxes ``[64 / HEAD_BOX, HEAD_BOX, 64]``
    (``HEAD_BOX = min(H, 64)``: a box is one 64-row block), the cache as
    ``[num_pages, page_size, Lk]`` with boxes ``[1, block_n, 64]``."""
    head_box = min(q.shape[1], 64)
    q_desc = descriptor(q, q.shape, q.stride(), (64 // head_box, head_box, 64), gl.bfloat16)
    num_pages, s_page, s_tok = cache_geometry(k_buffer, page_size)
    kdt = gl.float8e4nv if k_buffer.dtype == torch.float8_e4m3fn else gl.bfloat16
    k_desc = descriptor(k_buffer, (num_pages, page_size, k_buffer.shape[-1]), (s_page, s_tok, 1),
                        (1, block_n, 64), kdt)
    return q_desc, k_desc


_TIMELINE: list = [None]  # the buffer of an open ``cta_timeline``
TIMELINE_SLOTS = 16  # int64 slots per CTA (gluon_kernels._TL_SLOTS)


@contextlib.contextmanager
def cta_timeline(buffer: torch.Tensor):
    """Inside it, every Gluon stage 1 launched writes each CTA's start and end (``%globaltimer``,
    ns), its SM and, in the swap-AB and seesaw schedules, when its Q tile landed, its block loop
    ended and its output was stored into ``buffer[pid]`` (``[grid, 16]`` int64 on the launch's
    device, -1 where not written beforehand; ``gluon_kernels._cta_mark``; slots 6-15: the
    balanced grid's first two segments, ``_cta_mark_segment``): how the CTAs of a launch were
    dispatched, which per-kernel times cannot show (``benchmarks/kernel_times.py --timeline``). Every call inside takes the
    full launch path (``fastpath.ENV_OFF`` set), since a replay would not pass the buffer."""
    if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.int64 or buffer.dim() != 2 \
            or buffer.shape[1] != TIMELINE_SLOTS:
        raise ValueError(f"buffer: expected a [grid, {TIMELINE_SLOTS}] int64 tensor")
    before, _TIMELINE[0] = os.environ.get(ENV_OFF), buffer
    os.environ[ENV_OFF] = "1"
    try:
        yield buffer
    finally:
        _TIMELINE[0] = None
        if before is None:
            os.environ.pop(ENV_OFF, None)
        else:
            os.environ[ENV_OFF] = before


def launch_verify_stage1_gluon(q, k_buffer, k_scale, req_to_token, seq_lens, real_lens, has_real,
                               o, lse, workspace, qlen, num_kv_splits, sm_scale, page_size, Lv, cfg,
                               cp_world=1, cp_rank=0, cp_interleave=1, *, batch=None,
                               qo_indptr=None, tree_mask=None, launch_dependents=False,
                               balance=0) -> None:
    """Launch the Gluon stage 1 (``gluon_unsupported_reason`` must have returned None).

    Args: as ``decode_attention_fwd_verify`` after its checks; ``real_lens`` is ``seq_lens``
    when ``has_real`` is False; ``workspace`` is the op's ``attn_logits`` (None when
    ``num_kv_splits == 1``: then ``o`` / ``lse`` are written here and there is no stage 2);
    ``k_scale`` a scalar fp32 tensor (1.0 for a bf16 cache); ``cfg`` the keys of
    :data:`GLUON_DEFAULT_CONFIG`; ``cp_*``: this launch is rank ``cp_rank`` of a
    context-parallel step (global lengths, the rank's local cache and block table), as in the
    portable kernel; ``qo_indptr`` (ragged draft counts: ``batch`` requests, ``qlen`` the most
    rows one has) and ``tree_mask`` (draft trees) as ``decode_attention_fwd_verify`` documents
    them, None for the kernel without them; ``launch_dependents``: the caller launches stage 2
    as this grid's programmatic dependent (``PDL``), and stage 1 lets it be scheduled from its
    start (``gluon_kernels._launch_dependents``); ``balance``: the config's ``BALANCE`` where the
    launch has splits (``splits.py``'s balanced splits), else 0.

    Out-of-range metadata is marked as in the portable kernel (``kernels.py``'s docstring): a
    request with a page index outside the cache among the keys it reads, or a length past
    its block table (or negative), gets NaN in ``o`` / ``lse`` (in its split partials).
    """
    c = {**GLUON_DEFAULT_CONFIG, **(cfg or {})}
    if batch is None:
        batch = q.shape[0] // qlen
    num_heads = q.shape[1]
    if batch == 0 or q.shape[0] == 0:
        return
    single = num_kv_splits == 1
    if single:
        ws_arg, ws_strides = lse, (0, 0, 0)  # lse only stands in for the unused pointer
    else:
        ws_arg, ws_strides = workspace, tuple(workspace.stride()[:3])
    q_desc, k_desc = _descriptors(q, k_buffer, page_size, c["BLOCK_N"])
    num_pages, kv_capacity = cache_bounds(k_buffer, req_to_token, page_size)
    grid = (gluon_row_blocks(qlen, num_heads) * batch * num_kv_splits,)
    fp8 = k_buffer.dtype == torch.float8_e4m3fn
    on_grid = grid_takes(c, qlen, num_heads, fp8=fp8, tree=tree_mask is not None, ragged=qo_indptr is not None,
                         context_parallel=cp_world > 1, single=single)
    if on_grid:  # one CTA per SM (static: capture-safe), whatever the batch and its lengths
        grid = (platform.current().sm_count,)
    kernel = _gk._verify_stage1_ws
    schedule = c["SCHEDULE"]
    if schedule == "swapab" and not swapab_takes(qlen, num_heads, tree=tree_mask is not None,
                                                 ragged=qo_indptr is not None, context_parallel=cp_world > 1):
        schedule = "alt"
    if schedule == "swapab":
        kernel = _gk._verify_stage1_swapab
    elif schedule == "alt":
        kernel = _gk._verify_stage1_alt
    elif schedule == "seesaw":
        kernel = _gk._verify_stage1_seesaw
    extra = {}
    if kernel is _gk._verify_stage1_alt:
        extra = {"QK_FIRST": bool(c["QK_FIRST"]), "EARLY_RELEASE": bool(c["EARLY_RELEASE"])}
        if c["NAMED_EXCHANGE"]:
            extra["NAMED_EXCHANGE"] = True
    elif kernel is _gk._verify_stage1_seesaw:
        extra = {"STAGE_ORDER": bool(c["STAGE_ORDER"]), "STAGE_PRODUCERS": bool(c["STAGE_PRODUCERS"])}
        if c["NAMED_EXCHANGE"]:
            extra["NAMED_EXCHANGE"] = True
    elif kernel is _gk._verify_stage1_swapab:
        extra = {"ROWS": 16 if qlen * num_heads <= 16 else 32, "ALT_BLOCKS": bool(c["SWAPAB_BLOCKS"])}
        if c["SPLIT_SCORES"] and not fp8 and not c["SWAPAB_BLOCKS"]:
            extra["SPLIT_SCORES"] = True
        if c["LEAN_SOFTMAX"] and not fp8 and not c["SWAPAB_BLOCKS"]:
            extra["LEAN_SOFTMAX"] = int(c["LEAN_SOFTMAX"])
        if on_grid:
            extra.update(GRID=True, REQUEST_COST=int(c["REQUEST_COST"]), batch=batch)
    if c["STAGE_OUT"] and kernel not in (_gk._verify_stage1_ws, _gk._verify_stage1_swapab):
        extra["STAGE_OUT"] = True
    # (the seesaw's converter warps run in the producer's registers: ``_dequant_rows``)
    filler_regs = (c["CONVERTER_REGS"] if fp8 and kernel in (_gk._verify_stage1_alt, _gk._verify_stage1_swapab)
                   else c["PRODUCER_REGS"])
    if on_grid and _TIMELINE[0] is not None:
        filler_regs = probe_producer_regs(c)
    launch(kernel, grid,
        q_desc, k_desc, exp2_scale(sm_scale), req_to_token, seq_lens,
        real_lens if has_real else seq_lens, ws_arg, o, lse, k_scale,
        req_to_token.stride(0), *ws_strides, o.stride(0), o.stride(1), lse.stride(0), lse.stride(1),
        num_kv_splits, qlen, num_heads, page_size, num_pages, kv_capacity,
        cp_rank if cp_world > 1 else None,  # None: a constexpr, the single-GPU kernel itself
        LV=Lv, LK=q.shape[-1], BLOCK_N=c["BLOCK_N"], NUM_STAGES=c["NUM_STAGES"],
        SPLIT_ALIGN=c["SPLIT_ALIGN"], MIN_SPLIT_LEN=c["MIN_SPLIT_LEN"], SINGLE=single,
        PRODUCER_REGS=filler_regs, CONSUMER_REGS=c["CONSUMER_REGS"],
        CP_WORLD=cp_world, CP_INTERLEAVE=cp_interleave if cp_world > 1 else 1,
        num_warps=c["num_warps"], **extra,
        # Ragged rows / draft trees: passed only when given, so that a call without them runs
        # exactly the kernel without them.
        **({"Qo_Indptr": qo_indptr, "num_rows": q.shape[0], "VARLEN": True}
           if qo_indptr is not None else {}),
        **({"Tree_Mask": tree_mask, "HAS_TREE": True} if tree_mask is not None else {}),
        **({"LAUNCH_DEPENDENTS": True} if launch_dependents and not single else {}),
        **({"BALANCE": balance} if balance and not single else {}),
        **_timeline_args(grid, q.device),
    )


def probe_producer_regs(cfg: dict[str, Any]) -> int:
    """The balanced grid's producer registers in a launch with the timeline probe: what the
    consumer groups leave of the 12 warps' budget (40 beside two groups of 232). Its segment
    marks need more than the producer's 24 (which spilled 180 B for 48 without the probe, in a
    loop that issues every block); with 40 it spills what the kernel without the probe does,
    and the producer does nothing else the registers would change."""
    c = {**GLUON_DEFAULT_CONFIG, **(cfg or {})}
    return 3 * (65536 // (3 * 128) // 8 * 8) - 2 * int(c["CONSUMER_REGS"])


def _timeline_args(grid: tuple, device: torch.device) -> dict:
    """The probe's arguments inside ``cta_timeline`` (none outside: the kernel without it)."""
    buffer = _TIMELINE[0]
    if buffer is None:
        return {}
    if buffer.shape[0] < grid[0] or buffer.device != device:
        raise ValueError(f"cta_timeline: a buffer of {buffer.shape[0]} rows on {buffer.device} for a "
                         f"launch of {grid[0]} CTAs on {device}")
    return {"Timeline": buffer, "TIMELINE": True}

