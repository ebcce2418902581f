"""Decode context parallelism (DCP) for the MLA verify kernel over a ``torch.distributed`` group.

The latent KV cache of every request is sharded along the sequence over the N ranks of a
process group, round-robin in blocks of ``interleave`` tokens: global block ``i`` (tokens
``[i*I, (i+1)*I)``) lives on rank ``i % N``, stored contiguously and in order in that rank's
own paged cache, under that rank's own block table. A verify step then:

1. runs the verify kernel on each rank over its shard, for all H heads and every verify row
   (``decode_attention_fwd_verify(..., cp_world=N, cp_rank=r, cp_interleave=I)``: global
   lengths in, local table and cache), giving a partial ``o [B*qlen, H, Lv]`` and
   ``lse [B*qlen, H]`` per rank, ``lse = -inf`` where the rank holds none of a row's keys;
2. merges the partials exactly by their LSE across the group (:class:`CPAttnCombiner`).

Merge methods (``method=``), each two collectives and one small kernel:

* ``"rs"`` (default; vLLM's ``cp_lse_ag_out_rs``): all-gather the LSEs (``N*rows*H`` fp32,
  small), rescale the own partial by ``exp(lse_r - lse)`` (:func:`rescale_attn_partial`,
  written straight into the reduce-scatter's head-chunked input), reduce-scatter over heads:
  each rank ends with the merged o of its ``H/N`` heads, as the o-projection of a
  tensor-parallel attention layer wants it. The sum runs in ``comm_dtype`` (default: o's dtype,
  NCCL adding the N shares in bf16; ``torch.float32`` doubles the bytes for an fp32 sum).
* ``"ar"``: the same with an all-reduce: every rank gets all H heads (N/2 times the bytes of
  ``"rs"`` on a ring).
* ``"a2a"``: all-to-all of the partials themselves (o and LSE, by head chunk), then
  :func:`merge_attn_states` over the N partials of the own heads: the same bytes as ``"rs"``,
  an exact fp32 merge with a single rounding, and no rescale pass, but one copy of o into
  head-chunk order first. Which of ``"rs"`` and ``"a2a"`` is faster is measured by
  ``benchmarks/benchmark_cp_verify.py``.

Capture-safe: the step allocates nothing (buffers for a batch bucket are made once, in the
constructor), never synchronises the host, and its shapes are static, so an engine captures it
in a CUDA graph (NCCL collectives on the current stream). Run it once eagerly before capturing:
that compiles the kernels, creates the default ``k_scale`` and the NCCL communicator.

On a gloo group with CPU tensors the same step runs the plain-PyTorch reference (or the Triton
kernels under ``TRITON_INTERPRET=1``): the CPU tests' path.

Helpers for engines and tests: :func:`shard_lengths` (each request's local length),
:func:`shard_positions` (which rank holds a global position, and where: the slot mapping of new
tokens) and :func:`shard_kv_cache` (a rank's cache and block table cut out of a global one).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from . import platform, reference
from .decode_verify.gluon_launch import grid_takes
from .decode_verify.launch import decode_attention_fwd_verify, launch_config
from .decode_verify.splits import verify_num_kv_splits
from .merge.launch import merge_attn_states, rescale_attn_partial
from .numerics import FP8_DTYPES


def check_context_parallel(cp_world, cp_rank, cp_interleave) -> None:
    """The context-parallel layout's arguments, for the helpers here (the ops check the same
    through their spec): ints with ``1 <= cp_world``, ``0 <= cp_rank < cp_world`` and
    ``cp_interleave >= 1``."""
    for name, v, lo in (("cp_world", cp_world, 1), ("cp_rank", cp_rank, 0),
                        ("cp_interleave", cp_interleave, 1)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
        if v < lo:
            raise ValueError(f"{name}: expected an int >= {lo}, got {v}")
    if cp_rank >= cp_world:
        raise ValueError(f"cp_rank: expected 0 <= cp_rank < cp_world={cp_world}, got {cp_rank}")

__all__ = [
    "shard_lengths",
    "shard_positions",
    "shard_kv_cache",
    "CPAttnCombiner",
    "CPVerify",
    "METHODS",
]

METHODS = ("rs", "ar", "a2a")
_KERNELS = ("auto", "triton", "reference")

# torch >= 2.13 names them *_single; older releases only have *_into_tensor / *_tensor.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# --- sharding helpers -----------------------------------------------------------------------


def shard_lengths(seq_lens, world: int, rank: int, interleave: int):
    """Local lengths: how many of the global positions ``[0, L)`` rank ``rank`` holds.

    ``seq_lens``: an int or an integer tensor of global lengths (>= 0), any shape and device.
    Returns the same kind (a tensor of the same dtype): ``I`` per whole cycle of ``N*I``
    positions plus the rank's part of the last, partial one. Tensor ops only (no
    synchronisation; capture-safe). The verify kernel computes the same thing itself from the
    global lengths; engines need it to size local block tables and split caps.
    """
    check_context_parallel(world, rank, interleave)
    cycle = world * interleave
    if isinstance(seq_lens, torch.Tensor):
        cycles = torch.div(seq_lens, cycle, rounding_mode="floor")
        part = (seq_lens - cycles * cycle - rank * interleave).clamp(0, interleave)
        return cycles * interleave + part
    if isinstance(seq_lens, bool) or not isinstance(seq_lens, int):
        raise TypeError(f"seq_lens: expected an int or an integer tensor, got {type(seq_lens).__name__}")
    cycles = seq_lens // cycle
    return cycles * interleave + min(max(seq_lens - cycles * cycle - rank * interleave, 0), interleave)


def shard_positions(positions: torch.Tensor, world: int, rank: int, interleave: int):
    """Where global token positions live: ``(owned, local)`` for rank ``rank``.

    ``positions``: integer tensor (>= 0) of global positions, e.g. the positions of the verify
    tokens being written to the cache. ``owned``: bool, the position is on this rank;
    ``local``: its position in this rank's local sequence, valid where owned. Where not, it is
    the local position of this rank's token at the same offset of the same round of
    ``world * interleave`` positions (``p // (world * interleave) * interleave + p %
    interleave``): a slot of another token, before or after ``p`` depending on which rank
    holds ``p`` (neither the previous nor the next local slot in general), so a slot mapping
    must mask it, e.g. ``torch.where(owned, local, -1)``. Capture-safe tensor ops.
    """
    check_context_parallel(world, rank, interleave)
    block = torch.div(positions, interleave, rounding_mode="floor")
    owned = block % world == rank
    local = torch.div(block, world, rounding_mode="floor") * interleave + positions % interleave
    return owned, local


def shard_kv_cache(
    k_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    world: int,
    rank: int,
    interleave: int,
    *,
    pad_value: float = 0.0,
    spare_pages: int = 0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s cache and block table cut out of a global paged cache (tests, benchmarks,
    engines moving a prefilled request into a sharded layout). Synchronising; not for capture.

    Args:
        k_buffer: global cache ``[num_pages, page_size, 1, Lk]`` or ``[num_pages*page_size, 1,
            Lk]``, any page stride.
        req_to_token: ``[B, max_pages]`` global block table; seq_lens: ``[B]`` global lengths.
        pad_value: what the local slots past each request's local length hold (NaN for tests:
            the kernel must never let them into a result).
        spare_pages: extra pages (all ``pad_value``) at the end of the local cache.
        generator: when given, the pages are handed out in a random order (scattered tables).

    Returns:
        ``(local_cache [local_pages, page_size, 1, Lk], local_table [B, max_local_pages] int32)``
        with request b's local tokens (global positions ``cp_global_positions(L_b, ...)``) in
        order on pages ``local_table[b, :cdiv(local_len_b, page_size)]``; the rest of the table
        is 0.
    """
    check_context_parallel(world, rank, interleave)
    dev = k_buffer.device
    pages = reference.cache_pages(k_buffer, page_size)  # [num_pages, page_size, Lk]
    lens = seq_lens.tolist()
    local_lens = [shard_lengths(int(n), world, rank, interleave) for n in lens]
    per_req = [math.ceil(n / page_size) for n in local_lens]
    total = sum(per_req) + spare_pages
    order = torch.arange(total, device=dev)
    if generator is not None:
        order = order[torch.randperm(total, generator=generator, device=generator.device).to(dev)]
    local = torch.full((max(total, 1), page_size, 1, pages.shape[-1]), pad_value,
                       dtype=k_buffer.dtype, device=dev)
    table = torch.zeros(len(lens), max(max(per_req, default=0), 1), dtype=torch.int32, device=dev)
    flat = local.view(-1, pages.shape[-1])
    first = 0
    for b, n in enumerate(local_lens):
        mine = order[first : first + per_req[b]]
        table[b, : per_req[b]] = mine.to(torch.int32)
        first += per_req[b]
        if n == 0:
            continue
        gpos = reference.cp_global_positions(lens[b], world, rank, interleave).to(dev)  # [n]
        src_page = req_to_token[b].long()[gpos // page_size]
        j = torch.arange(n, device=dev)
        flat[mine[j // page_size] * page_size + j % page_size] = pages[src_page, gpos % page_size]
    return local, table


# --- the merge across ranks -------------------------------------------------------------------


def _use_triton(kernel: str, device: torch.device) -> bool:
    if kernel == "auto":
        return device.type != "cpu" or platform.interpreter_enabled()
    return kernel == "triton"


class CPAttnCombiner:
    """Merges each rank's partial ``(o, lse)`` across a process group into the exact attention
    result. Owns its communication buffers, sized for up to ``max_rows`` rows, so that a call
    allocates nothing and can be captured in a CUDA graph.

    Args:
        group: the context-parallel process group (None: the default group). NCCL with CUDA
            tensors, or gloo with CPU tensors.
        max_rows: most rows (``B*qlen``) a call merges.
        num_heads: H, the heads of every rank's partial (a multiple of the group size for
            ``"rs"`` and ``"a2a"``).
        head_dim: the width of o (Lv).
        dtype: dtype of the partial and merged o.
        device: the rank's device.
        method: ``"rs"``, ``"ar"`` or ``"a2a"`` (see the module's doc).
        comm_dtype: ``"rs"`` / ``"ar"``: the dtype the shares are summed in (default: dtype).
        kernel: ``"auto"`` (Triton on a GPU or under ``TRITON_INTERPRET=1``, else the
            plain-PyTorch reference), ``"triton"`` or ``"reference"``.

    Calling it with ``o_part [rows, H, D]`` (dtype) and ``lse_part [rows, H]`` (fp32) returns
    ``(o, lse)``: ``"rs"`` / ``"a2a"`` the rank's heads ``[rank*H/N, (rank+1)*H/N)``, as
    ``o [rows, H/N, D]`` and ``lse [rows, H/N]``; ``"ar"`` all heads. They are views of the
    combiner's buffers, overwritten by its next call. The inputs are not modified.
    """

    def __init__(self, group, *, max_rows: int, num_heads: int, head_dim: int, dtype: torch.dtype,
                 device, method: str = "rs", comm_dtype: torch.dtype | None = None,
                 kernel: str = "auto"):
        if method not in METHODS:
            raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
        if kernel not in _KERNELS:
            raise ValueError(f"kernel: expected one of {_KERNELS}, got {kernel!r}")
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if method != "ar" and num_heads % self.world:
            raise ValueError(f"num_heads: method {method!r} splits the heads over the "
                             f"{self.world} ranks; {num_heads} is not a multiple of it")
        self.method, self.kernel = method, kernel
        self.max_rows, self.num_heads, self.head_dim = max_rows, num_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.comm_dtype = comm_dtype or dtype
        if method == "a2a" and self.comm_dtype != dtype:
            raise ValueError("comm_dtype: the a2a method exchanges the partials in their own dtype")
        n, h, d = self.world, num_heads, head_dim
        hl = h if method == "ar" else h // n
        self.local_heads = hl

        def buf(numel, dt):
            return torch.empty(numel, dtype=dt, device=self.device)

        # Flat buffers; a call uses contiguous views of their first elements (_view).
        self._lse_all = buf(n * max_rows * h, torch.float32)  # gathered LSEs, or a2a's received
        self._lse_out = buf(max_rows * h, torch.float32)  # merged LSE
        if method == "a2a":
            self._send_o = buf(max_rows * h * d, dtype)  # own partial in head-chunk order
            self._send_lse = buf(max_rows * h, torch.float32)
            self._recv_o = buf(max_rows * h * d, dtype)  # [N, rows, H/N, D]
            self._out = buf(max_rows * hl * d, dtype)
        else:
            self._send_o = buf(max_rows * h * d, self.comm_dtype)  # rescaled share
            self._out = (buf(max_rows * hl * d, self.comm_dtype) if method == "rs" else self._send_o)
            # Cast target when the sum runs in another dtype than o's.
            self._out_cast = buf(max_rows * hl * d, dtype) if self.comm_dtype != dtype else None

    @staticmethod
    def _view(flat: torch.Tensor, *shape: int) -> torch.Tensor:
        return flat[: math.prod(shape)].view(shape)

    def __call__(self, o_part: torch.Tensor, lse_part: torch.Tensor):
        rows = o_part.shape[0]
        n, h, d, hl, r = self.world, self.num_heads, self.head_dim, self.local_heads, self.rank
        if tuple(o_part.shape) != (rows, h, d) or o_part.dtype != self.dtype:
            raise ValueError(f"o_part: expected [rows, {h}, {d}] {self.dtype}, got "
                             f"{tuple(o_part.shape)} {o_part.dtype}")
        if tuple(lse_part.shape) != (rows, h) or lse_part.dtype != torch.float32:
            raise ValueError(f"lse_part: expected [{rows}, {h}] float32, got "
                             f"{tuple(lse_part.shape)} {lse_part.dtype}")
        if rows > self.max_rows:
            raise ValueError(f"o_part: {rows} rows, more than max_rows={self.max_rows}")
        triton = _use_triton(self.kernel, o_part.device)
        lse_all = self._view(self._lse_all, n, rows, h)
        lse_out = self._view(self._lse_out, rows, h)

        if self.method == "a2a":
            send_o = self._view(self._send_o, n, rows, hl, d)
            send_lse = self._view(self._send_lse, n, rows, hl)
            send_o.copy_(o_part.view(rows, n, hl, d).transpose(0, 1))
            send_lse.copy_(lse_part.view(rows, n, hl).transpose(0, 1))
            recv_o = self._view(self._recv_o, n, rows, hl, d)  # [p]: rank p's partial, own heads
            recv_lse = self._view(self._lse_all, n, rows, hl)
            dist.all_to_all_single(recv_o, send_o, group=self.group)
            dist.all_to_all_single(recv_lse, send_lse, group=self.group)
            out = self._view(self._out, rows, hl, d)
            lse = self._view(self._lse_out, rows, hl)
            if self.kernel == "auto":  # the op: Triton on a GPU, the reference on CPU
                torch.ops.mla.merge_attn_states(recv_o, recv_lse, out, lse)
            elif triton:
                merge_attn_states(recv_o, recv_lse, out, lse)
            else:
                ref_o, ref_lse = reference.merge_attn_states_ref(recv_o, recv_lse)
                out.copy_(ref_o)
                lse.copy_(ref_lse)
            return out, lse

        _all_gather(lse_all.view(n * rows, h), lse_part.contiguous(), group=self.group)
        if self.method == "rs":
            send = self._view(self._send_o, n, rows, hl, d)  # [C = N, rows, H/N, D]
            share = send.permute(1, 0, 2, 3)  # [rows, N, H/N, D] view: head h at chunk h // (H/N)
        else:
            send = self._view(self._send_o, rows, h, d)
            share = send
        if self.kernel == "auto":
            torch.ops.mla.rescale_attn_partial(o_part, lse_all, r, share, lse_out)
        elif triton:
            rescale_attn_partial(o_part, lse_all, r, share, lse_out)
        else:
            ref_o, ref_lse = reference.rescale_attn_partial_ref(o_part, lse_all, r)
            share.copy_(ref_o.view(share.shape))
            lse_out.copy_(ref_lse)
        if self.method == "rs":
            out = self._view(self._out, rows, hl, d)
            _reduce_scatter(out, send.view(n * rows, hl, d), group=self.group)
            lse = lse_out[:, r * hl : (r + 1) * hl]
        else:
            out = send
            dist.all_reduce(out, group=self.group)
            lse = lse_out
        if self._out_cast is not None:
            cast = self._view(self._out_cast, *out.shape)
            cast.copy_(out)
            out = cast
        return out, lse


# --- the verify step ---------------------------------------------------------------------------


class CPVerify:
    """One decode-context-parallel verify step for a batch bucket: the verify kernel on this
    rank's shard, then the merge across the group (:class:`CPAttnCombiner`).

    Args:
        group: the context-parallel process group (None: the default group).
        max_batch / max_qlen: the bucket: at most ``max_batch`` requests of ``max_qlen`` rows.
        num_heads: H query heads (all of them: in vLLM's DCP, the TP ranks' query heads are
            all-gathered over the DCP group first).
        Lv / Lk: latent and full head dims (512 / 576 for DeepSeek).
        dtype / device: q's dtype and this rank's device.
        kv_dtype: the cache's dtype (default: ``dtype``); with the page size it decides which
            kernel family the table runs, whose tiles and split work the split cap follows.
        page_size: tokens per page of the local cache.
        sm_scale: softmax scale.
        interleave: tokens per round-robin block of the sharded cache.
        num_kv_splits: the kernel's split cap (static); default from ``verify_num_kv_splits``
            on the longest LOCAL length of ``max_seq_len`` (then required).
        method / comm_dtype / kernel: see :class:`CPAttnCombiner`.
        config: launch-config overrides passed to the kernel (benchmarks, tests).

    Calling it with ``(q, k_buffer, req_to_token, seq_lens, real_seq_lens, qlen, k_scale)``:
    ``q [B*qlen, H, Lk]`` (B <= max_batch, qlen <= max_qlen), the rank's LOCAL cache and block
    table, the GLOBAL ``seq_lens`` / ``real_seq_lens`` (``[B]`` int32) returns the merged
    ``(o, lse)`` of this rank's heads (or all heads for ``"ar"``): views of internal buffers,
    overwritten by the next call. Nothing the caller passed is modified.
    """

    def __init__(self, group, *, max_batch: int, max_qlen: int, num_heads: int, Lv: int, Lk: int,
                 dtype: torch.dtype, device, page_size: int, sm_scale: float, interleave: int,
                 kv_dtype: torch.dtype | None = None, max_seq_len: int | None = None,
                 num_kv_splits: int | None = None,
                 method: str = "rs", comm_dtype: torch.dtype | None = None, kernel: str = "auto",
                 config: dict[str, Any] | None = None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        check_context_parallel(self.world, self.rank, interleave)
        self.interleave = interleave
        self.num_heads, self.Lv, self.Lk = num_heads, Lv, Lk
        self.page_size, self.sm_scale = page_size, sm_scale
        self.config = dict(config) if config else None
        self.kernel = kernel
        self.max_rows = max_batch * max_qlen
        if num_kv_splits is None:
            if max_seq_len is None:
                raise ValueError("max_seq_len: required when num_kv_splits is not given")
            local_max = shard_lengths(max_seq_len, self.world, self.rank, interleave)
            # The config the rank's launches select (launch_config reads the cache's dtype,
            # device and head dim only): its row tile and split work set the cap.
            probe = torch.empty(0, 1, Lk, dtype=kv_dtype or dtype, device=device)
            cfg = launch_config(max_batch, max_qlen, num_heads, probe, Lv, self.config,
                                q_dtype=dtype, page_size=page_size)
            num_kv_splits = verify_num_kv_splits(max(1, local_max), max_batch, max_qlen,
                                                 num_heads, platform.current().sm_count,
                                                 block_h=cfg["BLOCK_H"],
                                                 min_work_per_split=cfg["SPLIT_WORK"],
                                                 balance=cfg.get("BALANCE", 0),
                                                 grid=grid_takes(cfg, max_qlen, num_heads,
                                                                 fp8=(kv_dtype or dtype) in FP8_DTYPES, tree=False,
                                                                 ragged=False, context_parallel=self.world > 1,
                                                                 single=False))
        self.num_kv_splits = num_kv_splits
        dev = torch.device(device)
        self._o_part = torch.empty(self.max_rows * num_heads * Lv, dtype=dtype, device=dev)
        self._lse_part = torch.empty(self.max_rows * num_heads, dtype=torch.float32, device=dev)
        self._attn_logits = None
        if num_kv_splits > 1:
            self._attn_logits = torch.empty(self.max_rows, num_heads, num_kv_splits, Lv + 1,
                                            dtype=torch.float32, device=dev)
        self.combiner = CPAttnCombiner(group, max_rows=self.max_rows, num_heads=num_heads,
                                       head_dim=Lv, dtype=dtype, device=dev, method=method,
                                       comm_dtype=comm_dtype, kernel=kernel)

    def partial(self, q, k_buffer, req_to_token, seq_lens, real_seq_lens, qlen, k_scale=None):
        """Step 1 alone: this rank's partial ``(o [B*qlen, H, Lv], lse [B*qlen, H])`` (views of
        internal buffers) over its shard."""
        if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.shape[1] != self.num_heads:
            raise ValueError(f"q: expected [B*qlen, {self.num_heads}, {self.Lk}] (all heads), got "
                             f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
        rows = q.shape[0]
        if rows > self.max_rows:
            raise ValueError(f"q: {rows} rows, more than max_batch * max_qlen = {self.max_rows}")
        o = CPAttnCombiner._view(self._o_part, rows, self.num_heads, self.Lv)
        lse = CPAttnCombiner._view(self._lse_part, rows, self.num_heads)
        cp = (self.world, self.rank, self.interleave)
        if self.kernel == "auto" and not self.config:
            torch.ops.mla.decode_verify(
                q, k_buffer, k_buffer[..., : self.Lv], o, lse, req_to_token, seq_lens,
                real_seq_lens, qlen, self._attn_logits, self.num_kv_splits, self.sm_scale,
                self.page_size, k_scale, *cp)
        elif _use_triton(self.kernel, q.device):
            decode_attention_fwd_verify(
                q, k_buffer, k_buffer[..., : self.Lv], o, lse, req_to_token, seq_lens,
                real_seq_lens, qlen, self._attn_logits, self.num_kv_splits, self.sm_scale,
                self.page_size, k_scale, *cp, config=self.config)
        else:
            ref_o, ref_lse = reference.decode_verify_ref(
                q, k_buffer, self.Lv, req_to_token, seq_lens, real_seq_lens, qlen, self.sm_scale,
                self.page_size, k_scale, torch.float32, *cp)
            o.copy_(ref_o)
            lse.copy_(ref_lse)
        return o, lse

    def __call__(self, q, k_buffer, req_to_token, seq_lens, real_seq_lens, qlen, k_scale=None):
        o_part, lse_part = self.partial(q, k_buffer, req_to_token, seq_lens, real_seq_lens, qlen,
                                        k_scale)
        return self.combiner(o_part, lse_part)
