"""Host side of the encoder attention: checks, launch configuration, grid, launch.

``context_attention_fwd`` validates its arguments (``mla_ops.checks``), works out the launch
facts once (the head-dim split, whether every stride allows the alignment hint), asks the
architecture's table (``configs.py``) for the tile, and launches
``kernels.context_attention_kernel``. ``capture_launches`` records the launch instead of
running it, so tests can assert every architecture's choice on any machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Iterator

import torch
import triton

from .. import checks
from ..platform import current
from . import configs
from .kernels import context_attention_kernel

__all__ = [
    "context_attention_fwd",
    "head_dim_split",
    "head_stride_aligned_8",
    "build_launch",
    "capture_launches",
    "launch_overrides",
    "Launch",
]

_LOG2E = 1.4426950408889634


def head_dim_split(head_dim: int, enabled: bool = True) -> tuple[int, int]:
    """``(BLOCK_D, BLOCK_D_TAIL)`` covering ``head_dim`` lanes.

    A power-of-2 main block of half the padded width plus a power-of-2 tail of at least 16
    (72, 80 -> (64, 16); 88, 96 -> (64, 32)), kept only where it narrows the extent: 112 would
    be 64 + 64, the same 128 lanes, so it stays (128, 0). Powers of two are always (D, 0).
    """
    full = triton.next_power_of_2(head_dim)
    if not enabled or head_dim == full:
        return full, 0
    main = full // 2
    tail = max(16, triton.next_power_of_2(head_dim - main))
    if main + tail < full:
        return main, tail
    return full, 0


def head_stride_aligned_8(*tensors: torch.Tensor) -> bool:
    """True when every token and head stride of every tensor is a multiple of 8 elements.

    Then each head's row starts 16-byte aligned (fp16/bf16), which the kernel asserts with
    ``tl.multiple_of`` because Triton only infers divisibility by 16 for integer arguments.
    Storage offsets count too: a view that starts mid-row is not aligned.
    """
    for t in tensors:
        if t.stride(0) % 8 or t.stride(1) % 8 or t.storage_offset() % 8:
            return False
    return True


@dataclasses.dataclass
class Launch:
    """One kernel launch: its grid and every keyword argument (tensors, ints, constexprs)."""

    grid: tuple[int, int, int]
    kwargs: dict
    copied: bool = False  # q/k/v/o were unaligned views, run on aligned copies

    @property
    def config(self) -> dict:
        """The tuning-relevant part, as the tests' expect tables print it."""
        keys = ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_D_TAIL", "HEAD_STRIDE_ALIGNED_8",
                "USE_TMA", "num_warps", "num_stages", "waves_per_eu")
        return {k: self.kwargs[k] for k in keys if k in self.kwargs}


_overrides: dict = {}
_capture: list | None = None


@contextlib.contextmanager
def launch_overrides(**overrides) -> Iterator[None]:
    """Force launch values: any of ``configs.LAUNCH_KEYS``, plus ``split_head_dim`` (bool) and
    ``aligned`` (bool; False drops the alignment hint, True is only honoured when the strides
    allow it). For benchmarks, sweeps and tests; serving never sets it."""
    global _overrides
    saved, _overrides = _overrides, {**_overrides, **overrides}
    try:
        yield
    finally:
        _overrides = saved


@contextlib.contextmanager
def capture_launches() -> Iterator[list[Launch]]:
    """Record every launch ``context_attention_fwd`` would make, without running the kernel."""
    global _capture
    saved, _capture = _capture, []
    try:
        yield _capture
    finally:
        _capture = saved


def build_launch(q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal=True,
                 softmax_scale=None, sliding_window_q=None, sliding_window_k=None,
                 sinks=None) -> Launch:
    """The launch ``context_attention_fwd`` makes for these (already checked) arguments."""
    total, hq, head_dim = q.shape
    hkv = k.shape[1]
    batch = b_seq_len.shape[0]
    plat = current()
    split = head_dim_split(head_dim, _overrides.get("split_head_dim", True))
    aligned = head_stride_aligned_8(q, k, v, o) and _overrides.get("aligned", True)
    cfg = configs.select(plat.arch, head_dim=head_dim, split=split, aligned=aligned,
                         causal=is_causal)
    cfg.update({key: _overrides[key] for key in configs.LAUNCH_KEYS if key in _overrides})
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    kwargs = dict(
        Q=q, K=k, V=v, O=o, Sinks=sinks if sinks is not None else q,
        B_Start_Loc=b_start_loc, B_Seq_Len=b_seq_len,
        qk_scale=float(softmax_scale) * _LOG2E,
        window_q=int(sliding_window_q or 0), window_k=int(sliding_window_k or 0),
        stride_qt=q.stride(0), stride_qh=q.stride(1),
        stride_kt=k.stride(0), stride_kh=k.stride(1),
        stride_vt=v.stride(0), stride_vh=v.stride(1),
        stride_ot=o.stride(0), stride_oh=o.stride(1),
        kv_group=hq // hkv,
        HEAD_DIM=head_dim,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
        BLOCK_D=split[0], BLOCK_D_TAIL=split[1],
        IS_CAUSAL=bool(is_causal),
        HAS_WINDOW_Q=bool(sliding_window_q), HAS_WINDOW_K=bool(sliding_window_k),
        HAS_SINKS=sinks is not None,
        HEAD_STRIDE_ALIGNED_8=aligned,
        NUM_M_BLOCKS_REVERSED=bool(is_causal),
        NUM_STAGES=cfg["num_stages"],
        # The copy engine needs 16-byte aligned bases and strides: the aligned-8 facts.
        USE_TMA=bool(cfg.get("tma")) and aligned and q.element_size() <= 2,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if plat.is_hip and cfg.get("waves_per_eu"):
        kwargs["waves_per_eu"] = cfg["waves_per_eu"]
    grid = (triton.cdiv(max_input_len, cfg["BLOCK_M"]), hq, batch)
    return Launch(grid=grid, kwargs=kwargs)


def _aligned_view(t: torch.Tensor, init: bool = True) -> torch.Tensor:
    """A copy of ``t`` ``[T, H, D]`` in a buffer whose head stride is D rounded up to 8."""
    total, heads, head_dim = t.shape
    buf = torch.empty(total, heads, -(-head_dim // 8) * 8, dtype=t.dtype, device=t.device)
    view = buf[..., :head_dim]
    if init:
        view.copy_(t)
    return view


def _needs_unaligned_copy(q, k, v, o) -> bool:
    """The arch's table asks for aligned copies of views the alignment hint cannot cover."""
    if head_stride_aligned_8(q, k, v, o) or _overrides.get("aligned", True) is False:
        return False
    return bool(configs.table_for(current().arch)[0].get("unaligned_copy", False))


def context_attention_fwd(q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal=True,
                          softmax_scale=None, sliding_window_q=None, sliding_window_k=None,
                          sinks=None) -> None:
    """Encoder (ViT) attention on packed variable-length sequences; writes ``o``.

    Args:
        q: ``[total, Hq, D]`` fp16/bf16/fp32, last dim contiguous (any token/head strides).
        k, v: ``[total, Hkv, D]``, dtype of q, Hq a multiple of Hkv (head h reads KV head
            ``h // (Hq // Hkv)``).
        o: ``[total, Hq, D]`` output, dtype of q. Mutated: the rows of every sequence; rows
            outside all sequences are left as they were.
        b_start_loc, b_seq_len: ``[B]`` int32/int64 first token and length of each sequence.
        max_input_len: an upper bound on ``b_seq_len`` (sizes the grid; no device sync).
        is_causal: query i sees keys j <= i of its own sequence (top-left).
        softmax_scale: defaults to ``1/sqrt(D)``; must be positive.
        sliding_window_q / sliding_window_k: when > 0, keep ``i - j <= w`` / ``j - i <= w``.
        sinks: ``[Hq]`` per-head null logits (natural log, unscaled) added to the denominator.
    """
    checks.check_context_attention(q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal,
                                   softmax_scale, sliding_window_q, sliding_window_k, sinks)
    if softmax_scale is not None and not softmax_scale > 0:
        # The unmasked interior folds the scale into max(qk) * scale, true only for scale > 0.
        raise ValueError(f"softmax_scale: expected a positive float, got {softmax_scale}")
    o_user = None
    if _needs_unaligned_copy(q, k, v, o):
        # sm_90 with Triton 3.6: the kernel without the alignment hint (scalar loads, no
        # cp.async pipelining) computed wrong tail lanes and once faulted on the H200, so views
        # whose strides are not multiples of 8 run on aligned copies instead. o is copied in
        # too, so rows outside every sequence come back unchanged.
        o_user = o
        q, k, v, o = (_aligned_view(t) for t in (q, k, v, o))
    launch = build_launch(q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal,
                          softmax_scale, sliding_window_q, sliding_window_k, sinks)
    launch.copied = o_user is not None
    if _capture is not None:
        _capture.append(launch)
        return
    if min(launch.grid) == 0 or q.shape[0] == 0:
        return
    if launch.kwargs["USE_TMA"]:
        _ensure_allocator()
    context_attention_kernel[launch.grid](**launch.kwargs)
    if o_user is not None:
        o_user.copy_(o)


def _tma_scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator() -> None:
    """Device-side tensor descriptors need global scratch (128 bytes each per program).

    Taken from PyTorch's caching allocator, which also serves it inside a CUDA graph capture.
    Installed only when a TMA launch is made and nobody installed one before. Triton keeps the
    allocator in a ContextVar (per thread), so this is checked at every such launch.
    """
    try:
        from triton.runtime import _allocation

        holder = _allocation._allocator
        current_alloc = holder.get() if hasattr(holder, "get") else holder
        missing = isinstance(current_alloc, _allocation.NullAllocator)
    except (ImportError, AttributeError):  # another Triton layout: install ours
        missing = True
    if missing:
        triton.set_allocator(_tma_scratch)
