"""Host side of the decode-verify attention: checks, split helpers, launch, warmup.

The kernels are in ``kernels.py`` (portable Triton) and ``gluon_kernels.py`` (sm_90), the
launch tables in ``configs.py`` and ``tables/``. Everything here is capture-safe: no host
synchronisation (unless checked mode is on, which refuses captures), no ``.item()``, no
allocation inside a launch (the default ``k_scale`` is made once per device, outside any
capture; TMA descriptors are host structs passed by value, so a captured graph holds them).
Launches run under the device of ``q``, whatever the current device is.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

try:  # host-side tensor descriptors (triton >= 3.4); without them TMA configs use pointers
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    TensorDescriptor = None

from .. import checked, platform, spec
from ..fastpath import launch, persistent, recorded
from ..gluon_support import select_family
from ..host import (cache_bounds, cache_geometry, cdiv, device_guard, made_outside_graph_pools,
                    next_power_of_2, public_launcher)
from ..numerics import FP8_DTYPES, exp2_scale
from . import kernels
from .configs import HIP_LAUNCH_KEYS, select_verify_config, verify_facts
from .gluon_launch import (
    grid_takes,
    gluon_unsupported_reason,
    gluon_unsupported_shape,
    launch_verify_stage1_gluon,
)
from .splits import verify_row_blocks

__all__ = [
    "decode_attention_fwd_verify",
    "select_verify_config",
    "warmup_decode_attention_fwd_verify",
    "_storage_view",
]

_CHECK = spec.python_checks()

# One fp32 1.0 per device: the k_scale of caches that need none. Made outside any capture and
# outside any CUDA graph's memory pool (a first call may run in torch.compile's graph warm-up).
_UNIT_SCALE: dict[torch.device, torch.Tensor] = {}


def _unit_scale(device: torch.device) -> torch.Tensor:
    t = _UNIT_SCALE.get(device)
    if t is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # A tensor made inside a capture is only filled at replay: unusable as a cache.
            raise RuntimeError(
                "k_scale: the default k_scale is created on first use and cannot be made during "
                "a graph capture; run warmup_decode_attention_fwd_verify (or one eager call) "
                "before capturing, or pass k_scale")
        t = persistent(made_outside_graph_pools(
            lambda: torch.ones((), dtype=torch.float32, device=device), device))
        _UNIT_SCALE[device] = t
    return t


def _storage_view(t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Contiguous ``shape`` over ``t``'s storage, or a new tensor if too small."""
    if math.prod(shape) > t.untyped_storage().nbytes() // t.element_size():
        return t.new_empty(shape)
    strides = [1]
    for size in reversed(shape[1:]):
        strides.insert(0, strides[0] * size)
    return torch.as_strided(t, shape, strides, 0)


def _is_sm90_plus(device: torch.device, plat) -> bool:
    """A CUDA GPU of capability 9.0 or more (TMA, programmatic dependent launch)."""
    return (not plat.interpret and device.type == "cuda"
            and (plat.cuda_capability or (0, 0)) >= (9, 0))


def _tma_descriptors(k_buffer, page_size, Lk, Lv, cfg, plat):
    """Host-built tensor descriptors of the cache for ``cfg["TMA"]``, or ``(None, None)`` where
    the bulk tensor copy does not apply (the pointer path then runs the same config).

    The cache is described as ``[num_pages, page_size, Lk]`` with its own page and token strides
    (a cross-layer view included), boxes ``[1, BLOCK_N, D0]`` for the ``Lv`` part (``D0``: half
    of it with QSPLIT) and ``[1, BLOCK_N, Lk - Lv]`` for the rope part (Triton issues a block
    wider than one hardware box, 256 elements, as several copies). It needs a CUDA GPU of
    capability 9 or more (or the interpreter), blocks that never straddle a page, a rope part
    and 16-byte aligned base and strides.
    """
    if not cfg["TMA"] or TensorDescriptor is None or k_buffer.dtype in FP8_DTYPES:
        # fp8: measured 2.3x slower through TMA on the H200 (M4): the tile is converted from
        # shared memory in registers either way.
        return None, None
    if not plat.interpret and not _is_sm90_plus(k_buffer.device, plat):
        return None, None
    block_n = cfg["BLOCK_N"]
    d0 = Lv // 2 if cfg["QSPLIT"] else Lv
    dpe = Lk - Lv
    if page_size % block_n or cfg["SPLIT_ALIGN"] % block_n or dpe == 0:
        return None, None
    num_pages, stride_kpage, stride_ktok = cache_geometry(k_buffer, page_size)
    esize = k_buffer.element_size()
    if k_buffer.data_ptr() % 16 or (stride_kpage * esize) % 16 or (stride_ktok * esize) % 16:
        return None, None
    if num_pages == 0:  # nothing to describe (and no key is read: see host.cache_bounds)
        return None, None
    shape = [num_pages, page_size, Lk]
    strides = [stride_kpage, stride_ktok, 1]
    return (TensorDescriptor(k_buffer, shape, strides, [1, block_n, d0]),
            TensorDescriptor(k_buffer, shape, strides, [1, block_n, dpe]))


def launch_config(batch: int, qlen: int, num_heads: int, k_buffer: torch.Tensor, Lv: int,
                  config: dict[str, Any] | None = None, *, q_dtype: torch.dtype | None = None,
                  page_size: int | None = None, q: torch.Tensor | None = None
                  ) -> dict[str, Any]:
    """The config a launch of these facts runs: the table's, ``config`` laid over it, and the
    facts of the launch that the table cannot see (a 16-wide Lv cannot be halved by QSPLIT).

    The table routes on whether the sm_90 Gluon family covers the launch (``gluon`` fact: GPU,
    triton, dtypes, head dims, page size); that needs ``q_dtype`` and ``page_size`` (without
    them the fact is False). Given ``q`` too (the launch's own tensors), a Gluon config that
    the tensors do not allow (``gluon_unsupported_reason``) falls back to the portable family
    (:func:`mla_ops.gluon_support.select_family`). Both families run a context-parallel rank's
    launch: the config does not depend on the world size.
    """
    if q_dtype is None or page_size is None:
        unsupported = "the launch's q dtype and page size are not given"
    else:
        unsupported = gluon_unsupported_shape(k_buffer.device, q_dtype, k_buffer.dtype,
                                              num_heads, k_buffer.shape[-1], Lv, page_size)
    tensors_unsupported = None
    if q is not None:
        def tensors_unsupported(cfg):
            return gluon_unsupported_reason(q, k_buffer, page_size, Lv, cfg)
    cfg = select_family("decode_verify",
                        verify_facts(batch, qlen, num_heads, fp8=k_buffer.dtype in FP8_DTYPES),
                        config, unsupported, tensors_unsupported)
    if cfg["family"] == "triton" and Lv < 32 and cfg.get("QSPLIT"):
        cfg["QSPLIT"] = 0  # the halves would be narrower than a dot's K of 16
    return cfg


@public_launcher("decode_verify", ".reference:decode_verify_op_ref")
@recorded("decode_verify", tables=("decode_verify",))
def decode_attention_fwd_verify(
    q, k_buffer, v_buffer, o, lse, req_to_token, seq_lens, real_seq_lens, qlen, attn_logits,
    num_kv_splits, sm_scale, page_size, k_scale=None, cp_world=1, cp_rank=0, cp_interleave=1, *,
    qo_indptr=None, tree_mask=None, config: dict[str, Any] | None = None,
):
    """Causal (or draft-tree) MLA verify attention over a per-request block table.

    Args:
        q: ``[B*qlen, H, Lk]`` bf16/fp16 (fp32 under the interpreter); request b's token t is
            row ``b*qlen + t`` (with ``qo_indptr``: ``[R, H, Lk]``, row ``qo_indptr[b] + t``);
            any row/head strides, last dim contiguous.
        k_buffer: paged latent cache ``[num_pages, page_size, 1, Lk]`` or
            ``[num_pages*page_size, 1, Lk]``, dtype of q or fp8 (with ``k_scale``); any page
            stride (a layer's view of a cross-layer cache).
        v_buffer: ``k_buffer[..., :Lv]``; V is read from the K tile, only its width is used.
        o: ``[B*qlen, H, Lv]`` dtype of q — written.
        lse: ``[B*qlen, H]`` fp32 natural-log LSE, ``-inf`` for rows with no key — written.
        req_to_token: ``[B, max_pages]`` int32 block table, one row per request (last dim
            contiguous).
        seq_lens: ``[B]`` int32 KV length L (verify tokens included), contiguous.
        real_seq_lens: ``[B]`` int32 or None; row t's limit is
            ``max(min(L - qlen + 1 + t, L_real), 0)``.
        qlen: verify tokens per request.
        attn_logits: fp32 workspace ``[rows of q, H, num_kv_splits, Lv+1]`` (or larger rows) —
            written when ``num_kv_splits > 1``; may be None when it is 1.
        num_kv_splits: static cap on KV splits per request; shorter requests use fewer.
        sm_scale: softmax scale (finite, positive).
        page_size: tokens per cache page.
        k_scale: scalar fp32 tensor dequantizing an fp8 cache; ignored for bf16/fp16.
        cp_world / cp_rank / cp_interleave: decode context parallelism. With ``cp_world > 1`` the
            cache is sharded along the sequence over ``cp_world`` ranks, global block ``i`` of
            ``cp_interleave`` tokens on rank ``i % cp_world``, and this call attends over rank
            ``cp_rank``'s shard: ``seq_lens`` / ``real_seq_lens`` stay the GLOBAL lengths,
            ``req_to_token`` and ``k_buffer`` are the rank's LOCAL block table and cache. Row
            t sees the local keys holding global positions below its limit, and ``o`` / ``lse``
            are that partial result (``lse = -inf``, ``o = 0`` where the rank holds none of its
            keys), to be merged across ranks by LSE (``mla_ops.context_parallel``). The split
            cap applies to the local length. ``cp_world == 1`` is the single-GPU kernel.
        qo_indptr: keyword-only ``[B+1]`` int32, ragged draft counts: request b's rows are
            ``q[qo_indptr[b]:qo_indptr[b+1]]``, ``qlen_b`` of them with ``0 <= qlen_b <= qlen``
            (``qlen`` is then the largest), its drafts being its last ``qlen_b`` keys (row t's
            limit is ``max(min(L - qlen_b + 1 + t, L_real), 0)``). q, o, lse (and the
            workspace) have R >= ``qo_indptr[B]`` rows; rows from ``qo_indptr[B]`` on are not
            written. None: ``qlen`` rows per request.
        tree_mask: keyword-only ``[R]`` int64 draft trees: row i of request b sees draft token j
            (key ``L - qlen_b + j``) iff bit j of ``tree_mask[row]`` is set, the prefix
            ``[0, L - qlen_b)`` always; keys at or past ``L_real`` never. ``qlen <= 64``; not
            with context parallelism. None: the causal chain (bit j set for j <= i), exactly
            the results without it.
        config: keyword-only overrides of the selected launch config (benchmarks, sweeps).

    Metadata only the data can show wrong is validated by checked mode (``mla_ops.checked``).
    With it off, nothing faults and nothing passes silently: page indices are clamped into the
    cache and lengths into the block table before they form an address, and a request with a
    page index outside ``[0, num_pages)`` among the keys it reads (``[0, min(L, L_real))``), a
    length past ``max_pages * page_size`` or a negative length gets ``o = NaN`` and
    ``lse = NaN`` in all its rows; the other requests are unaffected. ``qo_indptr`` offsets
    are clamped into ``[0, R]`` and a request's rows to at most ``qlen``: a request whose
    offsets needed it (negative, decreasing, past R, more than qlen rows) gets NaN in the rows
    it was clamped to (which may be another request's). ``tree_mask`` bits at or past a
    request's draft count name keys it does not have and are ignored.
    """
    args = (q, k_buffer, v_buffer, o, lse, req_to_token, seq_lens, real_seq_lens, qlen,
            attn_logits, num_kv_splits, sm_scale, page_size, k_scale, cp_world, cp_rank,
            cp_interleave, qo_indptr, tree_mask)
    batch, num_heads, Lk, Lv = _CHECK["decode_verify"](*args)
    if checked.enabled():
        checked.validate_decode_verify(*args)
    cfg = launch_config(batch, qlen, num_heads, k_buffer, Lv, config, q_dtype=q.dtype,
                        page_size=page_size, q=q)
    if batch == 0 or num_heads == 0 or q.shape[0] == 0:
        return
    with device_guard(q.device):
        _launch(cfg, q, k_buffer, o, lse, req_to_token, seq_lens, real_seq_lens, qlen,
                attn_logits, num_kv_splits, sm_scale, page_size, k_scale, Lk, Lv,
                cp_world, cp_rank, cp_interleave, batch, qo_indptr, tree_mask)


def _launch(cfg, q, k_buffer, o, lse, req_to_token, seq_lens, real_seq_lens, qlen, workspace,
            num_kv_splits, sm_scale, page_size, k_scale, Lk, Lv, cp_world, cp_rank,
            cp_interleave, batch, qo_indptr, tree_mask):
    """Stage 1, then (several splits) stage 2, of a checked call under its device."""
    plat = platform.current()
    num_heads = q.shape[1]
    single = num_kv_splits == 1
    # Balanced splits (``splits.py``): stage 1 cuts each request by its share of the batch's
    # keys, stage 2 reads every slot. Needs a workspace: one split runs as without the key.
    balance = 0 if single else int(cfg.get("BALANCE", 0))
    if single:
        # Stage 1 writes o / lse directly; o only stands in for the workspace pointer.
        ws_arg, ws_strides = o, (0, 0, 0)
    else:
        ws_arg, ws_strides = workspace, workspace.stride()[:3]
    if k_buffer.dtype not in FP8_DTYPES or k_scale is None:
        k_scale = _unit_scale(q.device)
    has_real = real_seq_lens is not None
    real = real_seq_lens if has_real else seq_lens
    # cp_world == 1: cp_rank goes in as None (a constexpr, not a kernel argument) so that the
    # single-GPU launch compiles to exactly the kernel without context parallelism; every rank
    # shares one binary (cp_rank is not specialized).
    cp_rank_arg = cp_rank if cp_world > 1 else None
    cp = {"CP_WORLD": cp_world, "CP_INTERLEAVE": cp_interleave if cp_world > 1 else 1}
    num_pages, kv_capacity = cache_bounds(k_buffer, req_to_token, page_size)
    # Ragged rows / draft trees: constexpr-gated, so that a call without them runs exactly the
    # kernels without them (None arguments are constexprs, not kernel arguments).
    drafts = {"VARLEN": qo_indptr is not None, "HAS_TREE": tree_mask is not None}
    num_rows = q.shape[0] if qo_indptr is not None else None
    # Programmatic dependent launch of stage 2 (CUDA capability 9+; captured in graphs as a
    # programmatic edge).
    use_pdl = bool(cfg["PDL"]) and kernels.HAS_PDL and not single and _is_sm90_plus(q.device, plat)
    if cfg["family"] == "gluon":
        # The balanced grid (``splits.py``) leaves its partials as balanced splits do: stage 2
        # reads every slot.
        pieces = balance or grid_takes(cfg, qlen, num_heads, fp8=k_buffer.dtype in FP8_DTYPES,
                                       tree=tree_mask is not None, ragged=qo_indptr is not None,
                                       context_parallel=cp_world > 1, single=single)
        launch_verify_stage1_gluon(q, k_buffer, k_scale, req_to_token, seq_lens, real, has_real,
                                   o, lse, workspace, qlen, num_kv_splits, sm_scale, page_size,
                                   Lv, cfg, cp_world, cp_rank, cp_interleave, batch=batch,
                                   qo_indptr=qo_indptr, tree_mask=tree_mask, launch_dependents=use_pdl,
                                   balance=balance)
        if not single:
            _launch_stage2(cfg, workspace, o, lse, seq_lens, real, has_real, ws_strides,
                           qlen, num_heads, num_kv_splits, Lv, cp_rank_arg, use_pdl, kv_capacity,
                           batch, qo_indptr, num_rows, drafts, balance=pieces, **cp)
        return
    _, stride_kpage, stride_ktok = cache_geometry(k_buffer, page_size)
    launch_kw = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    if plat.is_hip:
        launch_kw.update({k: cfg[k] for k in HIP_LAUNCH_KEYS if k in cfg})
    k_desc, kpe_desc = _tma_descriptors(k_buffer, page_size, Lk, Lv, cfg, plat)

    programs = verify_row_blocks(qlen, num_heads, cfg["BLOCK_H"]) * batch * num_kv_splits
    # PERSISTENT: never more programs than that many per SM, each looping over the work (one
    # compiled variant whatever the batch: the loop runs once when the work fits).
    persistent = cfg["PERSISTENT"] > 0
    grid = (min(programs, cfg["PERSISTENT"] * plat.sm_count) if persistent else programs,)
    launch(kernels._fwd_verify_stage1, grid,
        q, k_buffer, k_desc, kpe_desc, exp2_scale(sm_scale), req_to_token, seq_lens, real, ws_arg, o, lse,
        req_to_token.stride(0), q.stride(0), q.stride(1), stride_kpage, stride_ktok,
        *ws_strides,
        o.stride(0), o.stride(1), lse.stride(0), lse.stride(1),
        k_scale, batch, num_kv_splits, num_pages, kv_capacity, cp_rank_arg, qo_indptr, tree_mask,
        num_rows,
        QLEN=qlen,
        NUM_HEADS=num_heads,
        HAS_REAL=has_real,
        BLOCK_DMODEL=Lv,
        BLOCK_DPE=Lk - Lv,
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_H=cfg["BLOCK_H"],
        SPLIT_ALIGN=cfg["SPLIT_ALIGN"],
        MIN_SPLIT_LEN=cfg["MIN_SPLIT_LEN"],
        PAGE_SIZE=page_size,
        QSPLIT=bool(cfg["QSPLIT"]),
        SINGLE=single,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        FP8_DOT_FP16=k_buffer.dtype in FP8_DTYPES and q.dtype == torch.bfloat16,
        SWAP_AB=int(bool(cfg["SWAP_AB"])),
        USE_TMA=k_desc is not None,
        PERSISTENT=persistent,
        USE_PDL=use_pdl,
        **cp,
        **drafts,
        **({"BALANCE": balance} if balance else {}),
        **launch_kw,
    )
    if single:
        return
    _launch_stage2(cfg, workspace, o, lse, seq_lens, real, has_real, ws_strides, qlen,
                   num_heads, num_kv_splits, Lv, cp_rank_arg, use_pdl, kv_capacity, batch,
                   qo_indptr, num_rows, drafts, balance=balance, **cp)


def _launch_stage2(cfg, workspace, o, lse, seq_lens, real, has_real, ws_strides, qlen,
                   num_heads, num_kv_splits, Lv, cp_rank_arg, use_pdl, kv_capacity, batch=None,
                   qo_indptr=None, num_rows=None, drafts=None, balance=0, CP_WORLD=1, CP_INTERLEAVE=1):
    """The split merge (portable Triton), with the chunking of the config stage 1 ran and the
    ``kv_capacity`` of :func:`cache_bounds` (lengths past it are clamped and marked alike).
    One program per (request, token up to ``qlen``, head, column block): with ``qo_indptr``
    the tokens a request does not have write nothing. ``balance``: stage 1 balanced its splits
    (every slot written; a request of one piece already in o)."""
    block_dv = next_power_of_2(Lv)
    if cfg["S2_BLOCK_DV"]:
        block_dv = min(block_dv, cfg["S2_BLOCK_DV"])
    tokens = o.shape[0] if batch is None else batch * qlen  # == o.shape[0] without qo_indptr
    launch(kernels._fwd_verify_stage2, (tokens, num_heads, cdiv(Lv, block_dv)),
        workspace, o, lse, seq_lens, real,
        *ws_strides,
        o.stride(0), o.stride(1), lse.stride(0), lse.stride(1),
        num_kv_splits, kv_capacity, cp_rank_arg, qo_indptr, num_rows,
        QLEN=qlen,
        HAS_REAL=has_real,
        SPLIT_ALIGN=cfg["SPLIT_ALIGN"],
        MIN_SPLIT_LEN=cfg["MIN_SPLIT_LEN"],
        BLOCK_S=cfg["S2_BLOCK_S"],
        BLOCK_DV=block_dv,
        Lv=Lv,
        USE_PDL=use_pdl,
        CP_WORLD=CP_WORLD,
        CP_INTERLEAVE=CP_INTERLEAVE,
        **(drafts or {}),
        **({"BALANCE": 1} if balance else {}),
        num_warps=cfg["s2_num_warps"],
        num_stages=1,
        **({"launch_pdl": True} if use_pdl else {}),
    )


def _scratch_like(t: torch.Tensor, rows: int) -> torch.Tensor:
    """A fresh tensor with ``rows`` leading rows and ``t``'s strides, dtype, device and data
    pointer alignment (Triton specializes on pointer alignment; the warmup must hit the same
    variant as serving)."""
    shape = (rows, *t.shape[1:])
    span = 1 + sum((s - 1) * st for s, st in zip(shape, t.stride()) if s > 0)
    offset = t.storage_offset() % 64  # 64 elements >= 16 bytes of any dtype's alignment
    base = torch.empty(span + offset, dtype=t.dtype, device=t.device)
    return torch.as_strided(base, shape, t.stride(), offset)


def _check_warmup(*args, **kwargs) -> None:
    """The warmup of CPU tensors outside the interpreter: the CPU kernel compiles nothing, so
    the arguments' check is all there is to do."""
    _CHECK["warmup_decode_verify"](*args, **kwargs)


def reachable_batches(qlen: int, num_heads: int) -> list[int]:
    """One batch for each config the table can select for ``qlen`` and ``num_heads`` (both
    sides of every row bound), which is what a warmup must compile."""
    per_batch = qlen * num_heads
    batches = {1}
    from .. import tuning

    for bound in tuning.thresholds("decode_verify", "rows"):
        edge = bound // per_batch
        batches.update(b for b in (edge, edge + 1) if b >= 1)
    return sorted(batches)


@public_launcher("warmup_decode_verify", ".decode_verify.launch:_check_warmup", launches=False)
def warmup_decode_attention_fwd_verify(
    q, k_buffer, o, lse, req_to_token, has_real, qlens, attn_logits, sm_scale, page_size,
    k_scale=None, cp_world=1, cp_rank=0, cp_interleave=1, varlen=False, has_tree=False, *,
    batches: Sequence[int] | None = None, config: dict[str, Any] | None = None,
):
    """Compile every launch variant serving can reach for these tensors.

    For each qlen in ``qlens``: each config the arch's table can select for these heads (one
    representative batch per bucket, or the given ``batches``), with one split and with several
    (``attn_logits.shape[2]`` if given, else 2; every cap > 1 shares one variant), with
    real_seq_lens iff ``has_real``, with ``qo_indptr`` (ragged draft counts, qlen the largest)
    iff ``varlen`` and with ``tree_mask`` iff ``has_tree`` (their alignment is not specialized
    on: any ``qo_indptr`` / ``tree_mask`` tensor runs the variant compiled here). Each runs
    once on scratch tensors with the strides (and pointer alignment) of the real ones; no
    caller-visible tensor is written. Also creates the default ``k_scale`` so that a later
    capture allocates nothing.

    Args: as :func:`decode_attention_fwd_verify`; q/o/lse/req_to_token give strides, dtypes and
    heads only (their row counts are free); attn_logits may be None.
    """
    _CHECK["warmup_decode_verify"](q, k_buffer, o, lse, req_to_token, has_real, qlens,
                                   attn_logits, sm_scale, page_size, k_scale, cp_world, cp_rank,
                                   cp_interleave, varlen, has_tree)
    num_heads, Lv = q.shape[1], o.shape[-1]
    dev = q.device
    with device_guard(dev):
        _unit_scale(dev)
        splits_many = attn_logits.shape[2] if attn_logits is not None and attn_logits.dim() == 4 else 2
        splits_many = max(2, splits_many)
        v_buffer = k_buffer[..., :Lv]
        for qlen in qlens:
            seen = set()
            for batch in batches or reachable_batches(qlen, num_heads):
                cfg = launch_config(batch, qlen, num_heads, k_buffer, Lv, config, q_dtype=q.dtype,
                                    page_size=page_size)
                key = tuple(sorted(cfg.items()))
                if key in seen:
                    continue
                seen.add(key)
                rows = batch * qlen
                seq_lens = torch.full((batch,), qlen, dtype=torch.int32, device=dev)
                block_table = _scratch_like(req_to_token, batch).zero_()
                qo_indptr = (torch.arange(0, rows + 1, qlen, dtype=torch.int32, device=dev)
                             if varlen else None)
                tree_mask = (torch.full((rows,), (1 << qlen) - 1 if qlen < 64 else -1,
                                        dtype=torch.int64, device=dev) if has_tree else None)
                for num_kv_splits in (1, splits_many):
                    workspace = None
                    if num_kv_splits > 1:
                        workspace = torch.empty((rows, num_heads, num_kv_splits, Lv + 1),
                                                dtype=torch.float32, device=dev)
                    decode_attention_fwd_verify(
                        _scratch_like(q, rows).zero_(), k_buffer, v_buffer,
                        _scratch_like(o, rows), _scratch_like(lse, rows), block_table, seq_lens,
                        seq_lens if has_real else None, qlen, workspace, num_kv_splits, sm_scale,
                        page_size, k_scale, cp_world, cp_rank, cp_interleave,
                        qo_indptr=qo_indptr, tree_mask=tree_mask, config=config)
