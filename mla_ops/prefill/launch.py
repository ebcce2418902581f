"""Host side of the encoder attention: checks, launch configuration, grid, launch.

``context_attention_fwd`` validates its arguments (the op's spec, :mod:`mla_ops.spec`), works
out the launch facts once (the head-dim split, whether every stride allows the alignment hint),
asks the architecture's table (``configs.py``, through :mod:`mla_ops.tuning`) for the kernel
family and its tile, with ``config=`` laid over it, and launches the portable
``kernels.context_attention_kernel`` or, where the table picks the ``gluon`` family (sm_90),
``gluon_kernels.prefill_fwd_ws`` (``gluon_launch.py``) under the device of ``q``. :func:`build_launch` returns that launch without running it, so tests can
assert every architecture's choice on any machine.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import triton

from .. import checked, fastpath, spec, tuning
from ..gluon_support import select_family
from ..host import cdiv, device_guard, next_power_of_2, public_launcher
from ..numerics import exp2_scale
from ..platform import current
from .configs import prefill_facts
from .gluon_launch import (
    GLUON_DEFAULT_CONFIG,
    gluon_unsupported_reason,
    gluon_unsupported_shape,
    launch_prefill_gluon,
)
from .kernels import context_attention_kernel

__all__ = [
    "context_attention_fwd",
    "head_dim_split",
    "head_stride_aligned_8",
    "build_launch",
    "Launch",
]

_CHECK = spec.python_checks()


def head_dim_split(head_dim: int, enabled: bool = True) -> tuple[int, int]:
    """``(BLOCK_D, BLOCK_D_TAIL)`` covering ``head_dim`` lanes.

    A power-of-2 main block of half the padded width plus a power-of-2 tail of at least 16
    (72, 80 -> (64, 16); 88, 96 -> (64, 32)), kept only where it narrows the extent: 112 would
    be 64 + 64, the same 128 lanes, so it stays (128, 0). Powers of two are always (D, 0).
    """
    full = next_power_of_2(head_dim)
    if not enabled or head_dim == full:
        return full, 0
    main = full // 2
    tail = max(16, next_power_of_2(head_dim - main))
    if main + tail < full:
        return main, tail
    return full, 0


def head_stride_aligned_8(*tensors: torch.Tensor) -> bool:
    """True when every token and head stride of every tensor is a multiple of 8 elements.

    Then each head's row starts 16-byte aligned (fp16/bf16), which the kernel asserts with
    ``tl.multiple_of`` because Triton only infers divisibility by 16 for integer arguments.
    The start counts too: a view that starts mid-row is not aligned (its address, in elements,
    is read rather than its storage offset, which says nothing of the storage's own address).
    """
    for t in tensors:
        token, head, _ = t.stride()
        if token % 8 or head % 8 or (t.data_ptr() // t.element_size()) % 8:
            return False
    return True


@dataclasses.dataclass
class Launch:
    """One kernel launch: its grid and every keyword argument (tensors, ints, constexprs)."""

    grid: tuple[int, int, int]
    kwargs: dict
    copied: bool = False  # q/k/v/o are aligned copies of unaligned views (see build_launch)
    out: torch.Tensor | None = None  # the caller's o, written back from the copy
    family: str = "triton"  # "gluon": kwargs are launch_prefill_gluon's

    @property
    def config(self) -> dict:
        """The tuning-relevant part, as the tests' expect tables print it."""
        if self.family == "gluon":
            return {"family": "gluon", "BLOCK_D": self.kwargs["split"][0],
                    "BLOCK_D_TAIL": self.kwargs["split"][1], **self.kwargs["cfg"]}
        keys = ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_D_TAIL", "HEAD_STRIDE_ALIGNED_8",
                "USE_TMA", "num_warps", "num_stages", "waves_per_eu")
        return {k: self.kwargs[k] for k in keys if k in self.kwargs} | (
            {"copied": True} if self.copied else {})


def build_launch(q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal=True,
                 softmax_scale=None, sliding_window_q=None, sliding_window_k=None,
                 sinks=None, *, config: dict[str, Any] | None = None) -> Launch:
    """The launch ``context_attention_fwd`` makes for these (already checked) arguments.

    Where the running compiler miscompiles the hint-less kernel (``tuning.WORKAROUNDS
    ["prefill_unaligned_copy"]``), views whose strides are not multiples of 8 elements are
    launched on aligned copies: ``Launch.copied``, and :func:`run_launch` copies ``o`` back.
    """
    total, hq, head_dim = q.shape
    hkv = k.shape[1]
    batch = b_seq_len.shape[0]
    plat = current()
    want = config or {}
    split = head_dim_split(head_dim, want.get("split_head_dim", True))
    strides_ok = head_stride_aligned_8(q, k, v, o)
    copied = None
    if (not strides_ok and want.get("aligned", True)
            and tuning.workaround_active("prefill_unaligned_copy", plat)):
        copied = o  # o is copied in too, so rows outside every sequence come back unchanged
        q, k, v, o = (_aligned_view(t) for t in (q, k, v, o))
        strides_ok = True
    aligned = strides_ok and want.get("aligned", True)
    windowed = bool(sliding_window_q) or bool(sliding_window_k)
    if strides_ok:
        unsupported = gluon_unsupported_shape(q.device, q.dtype, head_dim, split, windowed)
    else:
        unsupported = "token / head strides not multiples of 8 elements"
    cfg = select_family("prefill", prefill_facts(head_dim, split, aligned, is_causal), config,
                        unsupported,
                        lambda c: gluon_unsupported_reason(q, k, v, o, split, windowed, c))
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    if cfg["family"] == "gluon":
        kwargs = dict(q=q, k=k, v=v, o=o, b_start_loc=b_start_loc, b_seq_len=b_seq_len,
                      max_input_len=max_input_len, is_causal=bool(is_causal),
                      qk_scale=exp2_scale(softmax_scale), sinks=sinks, split=split,
                      cfg={key: cfg[key] for key in GLUON_DEFAULT_CONFIG})
        grid = (_row_blocks(max_input_len, cfg["BLOCK_M"]), q.shape[1], batch)
        return Launch(grid=grid, kwargs=kwargs, copied=copied is not None, out=copied,
                      family="gluon")
    kwargs = dict(
        Q=q, K=k, V=v, O=o, Sinks=sinks if sinks is not None else q,
        B_Start_Loc=b_start_loc, B_Seq_Len=b_seq_len,
        qk_scale=exp2_scale(softmax_scale),
        window_q=int(sliding_window_q or 0), window_k=int(sliding_window_k or 0),
        stride_qt=q.stride(0), stride_qh=q.stride(1),
        stride_kt=k.stride(0), stride_kh=k.stride(1),
        stride_vt=v.stride(0), stride_vh=v.stride(1),
        stride_ot=o.stride(0), stride_oh=o.stride(1),
        kv_group=hq // hkv,
        total_tokens=total, max_input_len=int(max_input_len),
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
        USE_TMA=bool(cfg["tma"]) and aligned and q.element_size() <= 2,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if plat.is_hip and cfg["waves_per_eu"]:
        kwargs["waves_per_eu"] = cfg["waves_per_eu"]
    grid = (_row_blocks(max_input_len, cfg["BLOCK_M"]), hq, batch)
    return Launch(grid=grid, kwargs=kwargs, copied=copied is not None, out=copied)


def _row_blocks(max_input_len: int, block_m: int) -> int:
    """Row blocks per sequence of the grid: ``cdiv(max_input_len, block_m)``, at least 1 so
    that a ``max_input_len`` of 0 with a non-empty sequence still reaches it (its rows are
    then marked NaN, as rows past any too-small ``max_input_len`` are)."""
    return max(1, cdiv(max_input_len, block_m))


def _aligned_view(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` ``[T, H, D]`` in a buffer whose head stride is D rounded up to 8."""
    total, heads, head_dim = t.shape
    buf = torch.empty(total, heads, -(-head_dim // 8) * 8, dtype=t.dtype, device=t.device)
    view = buf[..., :head_dim]
    view.copy_(t)
    return view


def run_launch(launch: Launch) -> None:
    """Run a launch made by :func:`build_launch` (under the device of its tensors)."""
    if launch.family == "gluon":
        q = launch.kwargs["q"]
        if min(launch.grid) == 0 or q.shape[0] == 0:
            return
        with device_guard(q.device):
            launch_prefill_gluon(**launch.kwargs)
            if launch.out is not None:
                launch.out.copy_(launch.kwargs["o"])
        return
    q = launch.kwargs["Q"]
    if min(launch.grid) == 0 or q.shape[0] == 0:
        return
    with device_guard(q.device):
        if launch.kwargs["USE_TMA"]:
            _ensure_allocator()
        fastpath.launch(context_attention_kernel, launch.grid, **launch.kwargs)
        if launch.out is not None:
            launch.out.copy_(launch.kwargs["O"])


@public_launcher("context_attention", ".reference:context_attention_op_ref")
@fastpath.recorded("context_attention", tables=("prefill",))
def context_attention_fwd(q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal=True,
                          softmax_scale=None, sliding_window_q=None, sliding_window_k=None,
                          sinks=None, *, config: dict[str, Any] | None = None) -> None:
    """Encoder (ViT) attention on packed variable-length sequences; writes ``o``.

    Args:
        q: ``[total, Hq, D]`` fp16/bf16/fp32, 16 <= D <= 256, last dim contiguous (any
            token/head strides).
        k, v: ``[total, Hkv, D]``, dtype of q, Hq a multiple of Hkv (head h reads KV head
            ``h // (Hq // Hkv)``).
        o: ``[total, Hq, D]`` output, dtype of q. Mutated: the rows of every sequence; rows
            outside all sequences are left as they were.
        b_start_loc, b_seq_len: ``[B]`` int32/int64 (contiguous) first token and length of
            each sequence.
        max_input_len: an upper bound on ``b_seq_len`` (sizes the grid; no device sync:
            checked mode verifies it). Rows of a longer sequence from ``max_input_len`` on get
            ``o = NaN`` (checked mode off).
        is_causal: query i sees keys j <= i of its own sequence (top-left).
        softmax_scale: defaults to ``1/sqrt(D)``; finite and positive.
        sliding_window_q / sliding_window_k: when > 0, keep ``i - j <= w`` / ``j - i <= w``.
        sinks: ``[Hq]`` per-head null logits (natural log, unscaled) added to the denominator.
        config: keyword-only overrides of the selected launch config (``configs.py`` keys).

    With checked mode off, a sequence whose start or length is negative, or that ends past the
    packed tokens, is clamped into them (nothing outside q/k/v/o is read or written) and its
    rows inside them get ``o = NaN``; the other sequences are unaffected.
    """
    args = (q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal, softmax_scale,
            sliding_window_q, sliding_window_k, sinks)
    _CHECK["context_attention"](*args)
    if checked.enabled():
        checked.validate_context_attention(*args)
    run_launch(build_launch(*args, config=config))


def _tma_scratch(size: int, alignment: int, stream):
    # Under the launch's device guard, "cuda" is the device of the tensors.
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
