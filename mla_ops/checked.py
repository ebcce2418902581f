"""Checked mode: validate the metadata only the data can show wrong, before any launch.

Serving runs trust their index metadata, as they must for speed: a page index past the cache,
a length past the block table, a start past the packed tokens or a NaN among the LSEs a merge
weighs by cannot be seen without reading the tensors, which synchronises the device. Checked
mode reads them. It is off by default and
switched on by the environment variable ``MLA_OPS_CHECKED=1``, or in code::

    with mla_ops.checked_mode():          # or mla_ops.set_checked_mode(True)
        engine.step(...)

Each failure is a ``ValueError`` that names the argument, the request and the value. Checked
mode refuses to run inside a CUDA-graph capture (it synchronises). The plain-PyTorch reference
(the ops' CPU kernels) synchronises anyway, so it always validates.

When off, nothing here runs: the launch path is one flag test (the environment is read at
import, and again by ``set_checked_mode(None)``). The kernels then clamp such metadata so that
nothing faults, and mark what it touched with NaN (the README's "Bad input" section).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

import torch

from .host import cache_geometry

__all__ = ["ENV", "enabled", "checked_mode", "set_checked_mode",
           "validate_decode_verify", "validate_context_attention", "validate_merge_attn_states",
           "validate_rescale_attn_partial", "local_length"]

ENV = "MLA_OPS_CHECKED"


def _from_env() -> bool:
    return os.environ.get(ENV, "0") not in ("", "0")


_on = _from_env()  # the switch every launch reads


def enabled() -> bool:
    return _on


def _switched() -> None:
    """The C++ replays skip checked mode's host checks: tell them (mla_ops.fastpath)."""
    fastpath = sys.modules.get(__package__ + ".fastpath")
    if fastpath is not None:
        fastpath.sync()


def set_checked_mode(on: bool | None) -> None:
    """Turn checked mode on or off for this process (None: back to ``MLA_OPS_CHECKED``)."""
    global _on
    _on = _from_env() if on is None else bool(on)
    _switched()


@contextlib.contextmanager
def checked_mode(on: bool = True) -> Iterator[None]:
    """Checked mode on (or off) inside the block."""
    global _on
    saved, _on = _on, bool(on)
    _switched()
    try:
        yield
    finally:
        _on = saved
        _switched()


def _refuse_capture(op: str, device: torch.device) -> None:
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{op}: checked mode reads the metadata on the host (a device sync), which a CUDA "
            f"graph capture cannot do; capture with checked mode off (unset {ENV} or leave "
            f"mla_ops.checked_mode()) and validate with an eager call before capturing")


def _first_bad(bad: torch.Tensor) -> tuple[int, ...] | None:
    """Index of the first True of ``bad`` (one host sync), or None."""
    if not bool(bad.any()):
        return None
    return tuple(int(i) for i in bad.nonzero()[0])


def local_length(n: torch.Tensor, cp_world: int, cp_rank: int, cp_interleave: int) -> torch.Tensor:
    """Keys of global positions ``[0, n)`` that rank ``cp_rank`` holds when blocks of
    ``cp_interleave`` tokens go round-robin over ``cp_world`` ranks (``n`` itself when 1)."""
    if cp_world == 1:
        return n
    span = cp_world * cp_interleave
    rem = n % span - cp_rank * cp_interleave
    return n // span * cp_interleave + rem.clamp(0, cp_interleave)


def validate_decode_verify(q, k_buffer, v_buffer, o, lse, req_to_token, seq_lens, real_seq_lens,
                           qlen, attn_logits, num_kv_splits, sm_scale, page_size, k_scale=None,
                           cp_world=1, cp_rank=0, cp_interleave=1, qo_indptr=None,
                           tree_mask=None) -> None:
    """Lengths non-negative, ``real_seq_lens <= seq_lens``, lengths within the block table,
    every page a request's length touches inside the cache; ``qo_indptr`` from 0,
    non-decreasing, each request at most ``qlen`` rows, ending within q's rows; no
    ``tree_mask`` bit at or past its request's draft count. Arguments already spec-checked."""
    _refuse_capture("decode_verify", q.device)
    batch = seq_lens.shape[0]
    if qo_indptr is not None:
        _validate_qo_indptr(qo_indptr, qlen, q.shape[0])
    if tree_mask is not None:
        _validate_tree_mask(tree_mask, qlen, batch, qo_indptr)
    if batch == 0:
        return
    lens = seq_lens.long()
    bad = _first_bad(lens < 0)
    if bad is not None:
        raise ValueError(f"seq_lens: request {bad[0]} has length {int(lens[bad])}; lengths must "
                         "be >= 0")
    if real_seq_lens is not None:
        real = real_seq_lens.long()
        bad = _first_bad((real < 0) | (real > lens))
        if bad is not None:
            raise ValueError(
                f"real_seq_lens: request {bad[0]} has real length {int(real[bad])} with "
                f"seq_lens {int(lens[bad])}; expected 0 <= real_seq_lens <= seq_lens")
    local = local_length(lens, cp_world, cp_rank, cp_interleave)
    capacity = req_to_token.shape[1] * page_size
    bad = _first_bad(local > capacity)
    if bad is not None:
        what = "length" if cp_world == 1 else f"length on rank {cp_rank} ({int(local[bad])} keys)"
        raise ValueError(
            f"seq_lens: request {bad[0]} has {what} {int(lens[bad])}, more than its block table "
            f"holds ({req_to_token.shape[1]} pages of {page_size} = {capacity} tokens)")
    num_pages = cache_geometry(k_buffer, page_size)[0]
    table = req_to_token[:batch].long()
    slot = torch.arange(table.shape[1], device=table.device)
    touched = slot[None, :] < (local[:, None] + page_size - 1) // page_size
    bad = _first_bad(touched & ((table < 0) | (table >= num_pages)))
    if bad is not None:
        b, j = bad
        raise ValueError(
            f"req_to_token: request {b} maps its page {j} to cache page {int(table[b, j])}, "
            f"outside the cache's [0, {num_pages}) pages")


def _validate_qo_indptr(qo_indptr: torch.Tensor, qlen: int, rows: int) -> None:
    ptr = qo_indptr.long()
    if int(ptr[0]) != 0:
        raise ValueError(f"qo_indptr: qo_indptr[0] is {int(ptr[0])}; expected 0 (request 0's "
                         "rows start at row 0)")
    counts = ptr[1:] - ptr[:-1]
    bad = _first_bad(counts < 0)
    if bad is not None:
        b = bad[0]
        raise ValueError(f"qo_indptr: request {b} ends at row {int(ptr[b + 1])}, before it "
                         f"starts ({int(ptr[b])}); expected non-decreasing offsets")
    bad = _first_bad(counts > qlen)
    if bad is not None:
        b = bad[0]
        raise ValueError(f"qo_indptr: request {b} has {int(counts[b])} draft rows, more than "
                         f"qlen={qlen} (qlen is the largest request's count)")
    if int(ptr[-1]) > rows:
        raise ValueError(f"qo_indptr: the last request ends at row {int(ptr[-1])} "
                         f"(qo_indptr[B]), past q's {rows} rows")


def _validate_tree_mask(tree_mask: torch.Tensor, qlen: int, batch: int,
                        qo_indptr: torch.Tensor | None) -> None:
    """No bit at or past the request's draft count (those draft tokens do not exist)."""
    rows = tree_mask.shape[0]
    if qo_indptr is None:
        n = torch.full((rows,), qlen, dtype=torch.long, device=tree_mask.device)
        req = torch.arange(rows, device=tree_mask.device) // qlen
    else:
        ptr = qo_indptr.long()
        counts = ptr[1:] - ptr[:-1]
        row = torch.arange(rows, device=tree_mask.device)
        req = torch.searchsorted(ptr[1:], row, right=True)  # the request each row falls in
        inside = row < ptr[-1]
        n = torch.where(inside, counts[req.clamp(max=max(batch - 1, 0))], 64) if batch else \
            torch.full((rows,), 64, dtype=torch.long, device=tree_mask.device)
    # Bits j >= n: (mask >> n) != 0, with n == 64 allowing every bit (arithmetic shift: a mask
    # with bit 63 set is negative).
    above = torch.where(n >= 64, torch.zeros_like(tree_mask), tree_mask >> n.clamp(max=63))
    bad = _first_bad(above != 0)
    if bad is not None:
        r = bad[0]
        j = int(n[r]) + int(above[r]).bit_length() - 1 if int(above[r]) > 0 else 63
        raise ValueError(
            f"tree_mask: row {r} (request {int(req[r])}, {int(n[r])} draft tokens) sets bit "
            f"{j}, at or past its request's draft count (mask {int(tree_mask[r]):#x})")


def validate_context_attention(q, k, v, o, b_start_loc, b_seq_len, max_input_len, *rest) -> None:
    """Starts and lengths non-negative, every sequence inside the packed tokens, no two
    sequences overlapping, and ``max_input_len >= max(b_seq_len)``."""
    _refuse_capture("context_attention", q.device)
    if b_seq_len.shape[0] == 0:
        return
    starts, lens = b_start_loc.long(), b_seq_len.long()
    total = q.shape[0]
    for name, values in (("b_start_loc", starts), ("b_seq_len", lens)):
        bad = _first_bad(values < 0)
        if bad is not None:
            raise ValueError(f"{name}: sequence {bad[0]} has {name} {int(values[bad])}; expected "
                             ">= 0")
    bad = _first_bad(starts + lens > total)
    if bad is not None:
        raise ValueError(
            f"b_seq_len: sequence {bad[0]} covers tokens [{int(starts[bad])}, "
            f"{int(starts[bad] + lens[bad])}), past the {total} packed tokens of q")
    bad = _first_bad(lens > max_input_len)
    if bad is not None:
        raise ValueError(f"max_input_len: {max_input_len} is below sequence {bad[0]}'s length "
                         f"{int(lens[bad])}")
    live = (lens > 0).nonzero().flatten()
    order = live[torch.argsort(starts[live], stable=True)]
    ends = starts[order] + lens[order]
    bad = _first_bad(starts[order[1:]] < ends[:-1])
    if bad is not None:
        a, b = int(order[bad[0]]), int(order[bad[0] + 1])
        raise ValueError(
            f"b_start_loc: sequence {b} starts at {int(starts[b])}, inside sequence {a} "
            f"([{int(starts[a])}, {int(starts[a] + lens[a])})); sequences must not overlap")


def _validate_lse_parts(op: str, lse_parts: torch.Tensor) -> None:
    """No NaN among the partials' LSEs: a NaN weight makes its whole row NaN. ``-inf`` and
    ``+inf`` are valid (a partial that saw no key; ``+inf`` is FlashAttention-2's marker)."""
    _refuse_capture(op, lse_parts.device)
    bad = _first_bad(torch.isnan(lse_parts))
    if bad is not None:
        p, row, head = bad
        raise ValueError(
            f"lse_parts: partial {p} has LSE nan at row {row}, head {head}; an LSE must be a "
            "number, or -inf (or +inf) for a partial that saw no key")


def validate_merge_attn_states(o_parts, lse_parts, o, lse=None) -> None:
    """No NaN in ``lse_parts``. Arguments already spec-checked."""
    _validate_lse_parts("merge_attn_states", lse_parts)


def validate_rescale_attn_partial(o_part, lse_parts, part, o_out, lse_out=None) -> None:
    """No NaN in ``lse_parts`` (any partial's: each one's feeds the merged LSE)."""
    _validate_lse_parts("rescale_attn_partial", lse_parts)
