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
is ``-inf`` and never produce NaN from ``-inf`` LSEs. An LSE of ``+inf`` is read as ``-inf``, an
empty partial, as vLLM's merge reads it (FlashAttention-2 writes ``+inf`` for a row with no key,
FA3 ``-inf``); the plain-PyTorch CPU kernels do the same. A NaN LSE is garbage in: checked mode
refuses it. Capture-safe (checked mode off): the checks read metadata only, nothing is allocated
and nothing synchronises.
"""

from __future__ import annotations

from .. import checked, spec
from ..fastpath import launch, recorded
from ..host import cdiv, device_guard, next_power_of_2, public_launcher
from . import kernels

__all__ = ["merge_attn_states", "rescale_attn_partial"]

_CHECK = spec.python_checks()

# Columns per program: a whole 512-wide MLA row (or any head dim up to it) per program; the
# partials are few (the context-parallel world size), so one [BLOCK_P, BLOCK_D] tile holds them.
_MAX_BLOCK_D = 512
_MAX_BLOCK_P = 16


@public_launcher("merge_attn_states", ".reference:merge_attn_states_op_ref")
@recorded("merge_attn_states")
def merge_attn_states(o_parts, lse_parts, o, lse=None) -> None:
    """Merge P partial attention states of the same rows over disjoint key sets, exactly.

    Args:
        o_parts: ``[P, rows, H, D]`` partial outputs (each normalized over its own keys),
            dtype of ``o`` or fp32; any strides, last dim contiguous. The partial of a
            context-parallel rank is ``o_parts[rank]``.
        lse_parts: ``[P, rows, H]`` fp32 natural-log LSE of each partial, ``-inf`` (or
            ``+inf``, FlashAttention-2's marker) where it saw no key (its ``o_parts`` entries
            are then not read: they may hold anything). Checked mode refuses NaN.
        o: ``[rows, H, D]`` fp16/bf16/fp32 — written: ``sum_p exp(lse_p - lse) * o_p``, and 0
            where every partial is empty. Must not overlap the inputs.
        lse: ``[rows, H]`` fp32 or None — written (when given): ``log sum_p exp(lse_p)``,
            ``-inf`` where every partial is empty (never ``+inf``).

    Computed in fp32; no synchronisation, no allocation (safe to capture in a CUDA graph).
    """
    num_parts, rows, heads, dim = _CHECK["merge_attn_states"](o_parts, lse_parts, o, lse)
    if checked.enabled():
        checked.validate_merge_attn_states(o_parts, lse_parts, o, lse)
    _launch(kernels._merge_attn_states, rows, heads, dim, num_parts, lse,
            o_parts, lse_parts, o, lse,
            num_parts, heads, dim,
            *o_parts.stride()[:3],
            *lse_parts.stride(),
            *o.stride()[:2])


@public_launcher("rescale_attn_partial", ".reference:rescale_attn_partial_op_ref")
@recorded("rescale_attn_partial")
def rescale_attn_partial(o_part, lse_parts, part, o_out, lse_out=None) -> None:
    """Partial ``part``'s share of the merged attention state: ``o_out = exp(lse_part - lse) *
    o_part`` with ``lse = log sum_p exp(lse_parts[p])``, so that ``sum_p o_out_p`` over the
    partials (ranks) is :func:`merge_attn_states`' o. A context-parallel rank runs it after an
    all-gather of the LSEs, then reduce-scatters or all-reduces ``o_out``.

    Args:
        o_part: ``[rows, H, D]`` fp16/bf16/fp32 this partial's output; last dim contiguous. Not
            read where ``lse_parts[part]`` is ``-inf`` or ``+inf``.
        lse_parts: ``[P, rows, H]`` fp32 every partial's LSE (``lse_parts[part]`` is this one's);
            ``-inf`` or ``+inf``: an empty partial, as in :func:`merge_attn_states`.
        part: int, ``0 <= part < P`` (the rank). Not compiled in: all ranks share one binary.
        o_out: written: ``[rows, H, D]``, or ``[rows, C, H/C, D]`` (the heads in C chunks, each
            with its own stride: ``send.permute(1, 0, 2, 3)`` of a reduce-scatter input ``send
            [C, rows, H/C, D]``, written in place); fp16/bf16/fp32, last dim contiguous. 0 where
            this partial saw no key. May be ``o_part`` itself (each element is read before it is
            written, by the same program).
        lse_out: ``[rows, H]`` fp32 or None — written: the merged LSE.

    Computed in fp32; no synchronisation, no allocation (safe to capture in a CUDA graph).
    """
    num_parts, rows, heads, dim = _CHECK["rescale_attn_partial"](o_part, lse_parts, part, o_out,
                                                                 lse_out)
    if checked.enabled():
        checked.validate_rescale_attn_partial(o_part, lse_parts, part, o_out, lse_out)
    chunks = o_out.shape[1] if o_out.dim() == 4 else 1
    if o_out.dim() == 3:
        out_strides = (o_out.stride(0), 0, o_out.stride(1))
    else:
        out_strides = o_out.stride()[:3]
    _launch(kernels._rescale_attn_partial, rows, heads, dim, num_parts, lse_out,
            o_part, lse_parts, o_out, lse_out,
            part, num_parts, heads, dim, heads // chunks,
            *o_part.stride()[:2],
            *lse_parts.stride(),
            *out_strides)


def _launch(kernel, rows: int, heads: int, dim: int, num_parts: int, lse_out, *args) -> None:
    """Launch a merge kernel under the device of its tensors: one program per (row, head) and
    block of up to ``_MAX_BLOCK_D`` columns, the partials read ``_MAX_BLOCK_P`` at a time.
    ``args``: the kernel's arguments up to the strides of ``lse_out``, which follow them (0
    where ``lse_out`` is None: then no LSE is written)."""
    if rows == 0 or heads == 0 or dim == 0:
        return
    block_d = min(next_power_of_2(dim), _MAX_BLOCK_D)
    block_p = min(next_power_of_2(num_parts), _MAX_BLOCK_P)
    lse_strides = lse_out.stride() if lse_out is not None else (0, 0)
    with device_guard(args[0].device):
        launch(kernel, (rows * heads, cdiv(dim, block_d)), *args, *lse_strides,
               BLOCK_P=block_p, BLOCK_D=block_d, WRITE_LSE=lse_out is not None, num_warps=4)
