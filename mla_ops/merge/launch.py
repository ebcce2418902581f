"""Host side of the LSE merge: argument checks and launches (kernels in ``kernels.py``).

Two operations on partial attention states ``(o_p, lse_p)`` of the same rows over disjoint key
sets (e.g. the shards of a context-parallel KV cache):

* :func:`merge_attn_states`: all P partials in one place -> the merged ``(o, lse)``.
* :func:`rescale_attn_partial`: one partial and every partial's LSE -> that partial's share
  ``exp(lse_p - lse) * o_p`` of the merged o, so that a sum across ranks (a reduce-scatter or
  all-reduce) completes the merge. This is what a context-parallel step runs after an
  all-gather of the LSEs.

Both are exact in fp32 (the partials are read in their dtype and combined in fp32), write
``o = 0`` and ``lse = -inf`` for rows no partial saw, never read the o of a partial whose LSE
is ``-inf`` and never produce NaN from ``-inf`` LSEs. Capture-safe: the checks read metadata
only, nothing is allocated and nothing synchronises.
"""

from __future__ import annotations

import torch
import triton

from . import kernels

__all__ = [
    "merge_attn_states",
    "check_merge_attn_states",
    "rescale_attn_partial",
    "check_rescale_attn_partial",
]

_STATE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Columns per program: a whole 512-wide MLA row (or any head dim up to it) per program; the
# partials are few (the context-parallel world size), so one [BLOCK_P, BLOCK_D] tile holds them.
_MAX_BLOCK_D = 512
_MAX_BLOCK_P = 16


def _tensor(name, t, rank, dtypes):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name}: expected a {rank}-D tensor, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name}: expected dtype in ({names}), got {t.dtype}")


def _shape(name, t, expected):
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)}, got {tuple(t.shape)}")


def _inner_contiguous(name, t):
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), got strides "
                         f"{t.stride()}")


def _same_device(ref_name, ref, **tensors):
    for name, t in tensors.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{name}: expected a tensor on {ref.device} (the device of {ref_name}), "
                             f"got {t.device}")


def check_merge_attn_states(o_parts, lse_parts, o, lse=None) -> tuple[int, int, int, int]:
    """Validate a :func:`merge_attn_states` call (metadata only); returns ``(P, rows, H, D)``."""
    _tensor("o", o, 3, _STATE_DTYPES)
    _tensor("o_parts", o_parts, 4, (o.dtype, torch.float32))
    num_parts, rows, heads, dim = o_parts.shape
    if num_parts < 1:
        raise ValueError(f"o_parts: expected at least one partial (shape[0] >= 1), got shape "
                         f"{tuple(o_parts.shape)}")
    _shape("o", o, (rows, heads, dim))
    _tensor("lse_parts", lse_parts, 3, (torch.float32,))
    _shape("lse_parts", lse_parts, (num_parts, rows, heads))
    if lse is not None:
        _tensor("lse", lse, 2, (torch.float32,))
        _shape("lse", lse, (rows, heads))
    _inner_contiguous("o_parts", o_parts)
    _inner_contiguous("o", o)
    _same_device("o", o, o_parts=o_parts, lse_parts=lse_parts, lse=lse)
    return num_parts, rows, heads, dim


def merge_attn_states(o_parts, lse_parts, o, lse=None) -> None:
    """Merge P partial attention states of the same rows over disjoint key sets, exactly.

    Args:
        o_parts: ``[P, rows, H, D]`` partial outputs (each normalized over its own keys),
            dtype of ``o`` or fp32; any strides, last dim contiguous. The partial of a
            context-parallel rank is ``o_parts[rank]``.
        lse_parts: ``[P, rows, H]`` fp32 natural-log LSE of each partial, ``-inf`` where it saw
            no key (its ``o_parts`` entries are then not read: they may hold anything).
        o: ``[rows, H, D]`` fp16/bf16/fp32 — written: ``sum_p exp(lse_p - lse) * o_p``, and 0
            where every partial is ``-inf``. Must not overlap the inputs.
        lse: ``[rows, H]`` fp32 or None — written (when given): ``log sum_p exp(lse_p)``,
            ``-inf`` where every partial is ``-inf``.

    Computed in fp32; no synchronisation, no allocation (safe to capture in a CUDA graph).
    """
    num_parts, rows, heads, dim = check_merge_attn_states(o_parts, lse_parts, o, lse)
    if rows == 0 or heads == 0 or dim == 0:
        return
    block_d = min(triton.next_power_of_2(dim), _MAX_BLOCK_D)
    block_p = min(triton.next_power_of_2(num_parts), _MAX_BLOCK_P)
    lse_strides = lse.stride() if lse is not None else (0, 0)
    kernels._merge_attn_states[(rows * heads, triton.cdiv(dim, block_d))](
        o_parts, lse_parts, o, lse,
        num_parts, heads, dim,
        *o_parts.stride()[:3],
        *lse_parts.stride(),
        *o.stride()[:2],
        *lse_strides,
        BLOCK_P=block_p,
        BLOCK_D=block_d,
        WRITE_LSE=lse is not None,
        num_warps=4,
    )


def check_rescale_attn_partial(o_part, lse_parts, part, o_out,
                               lse_out=None) -> tuple[int, int, int, int, int]:
    """Validate a :func:`rescale_attn_partial` call (metadata only); returns
    ``(P, rows, H, D, chunks)``."""
    _tensor("o_part", o_part, 3, _STATE_DTYPES)
    rows, heads, dim = o_part.shape
    _tensor("lse_parts", lse_parts, 3, (torch.float32,))
    num_parts = lse_parts.shape[0]
    if num_parts < 1:
        raise ValueError(f"lse_parts: expected at least one partial (shape[0] >= 1), got shape "
                         f"{tuple(lse_parts.shape)}")
    _shape("lse_parts", lse_parts, (num_parts, rows, heads))
    if isinstance(part, bool) or not isinstance(part, int):
        raise TypeError(f"part: expected an int, got {type(part).__name__}")
    if not 0 <= part < num_parts:
        raise ValueError(f"part: expected 0 <= part < {num_parts} (lse_parts.shape[0]), got {part}")
    if not isinstance(o_out, torch.Tensor):
        raise TypeError(f"o_out: expected a torch.Tensor, got {type(o_out).__name__}")
    if o_out.dim() == 3:
        _shape("o_out", o_out, (rows, heads, dim))
        chunks = 1
    elif o_out.dim() == 4:
        chunks = o_out.shape[1]
        if chunks < 1 or heads % chunks or tuple(o_out.shape) != (rows, chunks, heads // chunks, dim):
            raise ValueError(
                f"o_out: expected [rows, C, H/C, D] = ({rows}, C, {heads}/C, {dim}) with C dividing "
                f"H={heads}, got shape {tuple(o_out.shape)}")
    else:
        raise ValueError(f"o_out: expected a 3-D or 4-D tensor, got shape {tuple(o_out.shape)}")
    if o_out.dtype not in _STATE_DTYPES:
        raise TypeError(f"o_out: expected dtype in (float16, bfloat16, float32), got {o_out.dtype}")
    if lse_out is not None:
        _tensor("lse_out", lse_out, 2, (torch.float32,))
        _shape("lse_out", lse_out, (rows, heads))
    _inner_contiguous("o_part", o_part)
    _inner_contiguous("o_out", o_out)
    _same_device("o_part", o_part, lse_parts=lse_parts, o_out=o_out, lse_out=lse_out)
    return num_parts, rows, heads, dim, chunks


def rescale_attn_partial(o_part, lse_parts, part, o_out, lse_out=None) -> None:
    """Partial ``part``'s share of the merged attention state: ``o_out = exp(lse_part - lse) *
    o_part`` with ``lse = log sum_p exp(lse_parts[p])``, so that ``sum_p o_out_p`` over the
    partials (ranks) is :func:`merge_attn_states`' o. A context-parallel rank runs it after an
    all-gather of the LSEs, then reduce-scatters or all-reduces ``o_out``.

    Args:
        o_part: ``[rows, H, D]`` fp16/bf16/fp32 this partial's output; last dim contiguous. Not
            read where ``lse_parts[part]`` is ``-inf``.
        lse_parts: ``[P, rows, H]`` fp32 every partial's LSE (``lse_parts[part]`` is this one's).
        part: int, ``0 <= part < P`` (the rank). Not compiled in: all ranks share one binary.
        o_out: written: ``[rows, H, D]``, or ``[rows, C, H/C, D]`` (the heads in C chunks, each
            with its own stride: ``send.permute(1, 0, 2, 3)`` of a reduce-scatter input ``send
            [C, rows, H/C, D]``, written in place); fp16/bf16/fp32, last dim contiguous. 0 where
            this partial saw no key. May be ``o_part`` itself (each element is read before it is
            written, by the same program).
        lse_out: ``[rows, H]`` fp32 or None — written: the merged LSE.

    Computed in fp32; no synchronisation, no allocation (safe to capture in a CUDA graph).
    """
    num_parts, rows, heads, dim, chunks = check_rescale_attn_partial(o_part, lse_parts, part, o_out, lse_out)
    if rows == 0 or heads == 0 or dim == 0:
        return
    if o_out.dim() == 3:
        out_strides = (o_out.stride(0), 0, o_out.stride(1))
    else:
        out_strides = o_out.stride()[:3]
    block_d = min(triton.next_power_of_2(dim), _MAX_BLOCK_D)
    block_p = min(triton.next_power_of_2(num_parts), _MAX_BLOCK_P)
    lse_strides = lse_out.stride() if lse_out is not None else (0, 0)
    kernels._rescale_attn_partial[(rows * heads, triton.cdiv(dim, block_d))](
        o_part, lse_parts, o_out, lse_out,
        part, num_parts, heads, dim, heads // chunks,
        *o_part.stride()[:2],
        *lse_parts.stride(),
        *out_strides,
        *lse_strides,
        BLOCK_P=block_p,
        BLOCK_D=block_d,
        WRITE_LSE=lse_out is not None,
        num_warps=4,
    )
