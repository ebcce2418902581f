"""Plain-PyTorch implementations: the CPU kernels of the ``mla::`` ops and every test's oracle.

Computed in fp32 (or the ``compute_dtype`` asked for), one request at a time and vectorized
within it. Reading ``seq_lens`` on the host makes these synchronising; they are references, not
the serving path.
"""

from __future__ import annotations

import math

import torch

from .numerics import FP8_DTYPES

__all__ = [
    "decode_verify_ref",
    "context_attention_ref",
    "merge_attn_states_ref",
    "rescale_attn_partial_ref",
    "verify_row_limits",
    "verify_request_rows",
    "verify_visible",
    "cache_pages",
    "cp_global_positions",
    "decode_verify_op_ref",
    "context_attention_op_ref",
]

def cache_pages(k_buffer: torch.Tensor, page_size: int) -> torch.Tensor:
    """``[num_pages, page_size, Lk]`` view of a 3-D or 4-D latent cache (any page stride)."""
    if k_buffer.dim() == 3:
        k_buffer = k_buffer.unflatten(0, (-1, page_size))
    return k_buffer[:, :, 0, :]


def verify_row_limits(L: int, L_real: int | None, qlen: int) -> torch.Tensor:
    """``lim_t = max(min(L - qlen + 1 + t, L_real), 0)`` for t in [0, qlen): keys row t sees."""
    t = torch.arange(qlen)
    lim = L - qlen + 1 + t
    if L_real is not None:
        lim = torch.minimum(lim, torch.tensor(L_real))
    return lim.clamp(min=0)


def verify_request_rows(batch: int, qlen: int, qo_indptr: torch.Tensor | None = None
                        ) -> list[tuple[int, int]]:
    """``(first row, rows)`` of each request: ``(b*qlen, qlen)``, or with ragged draft counts
    ``(qo_indptr[b], qo_indptr[b+1] - qo_indptr[b])`` (a host read of ``qo_indptr``)."""
    if qo_indptr is None:
        return [(b * qlen, qlen) for b in range(batch)]
    ptr = qo_indptr.tolist()
    return [(ptr[b], ptr[b + 1] - ptr[b]) for b in range(batch)]


def verify_visible(L: int, L_real: int | None, qlen: int, keys: torch.Tensor,
                   tree_rows: torch.Tensor | None = None) -> torch.Tensor:
    """``[qlen, len(keys)]`` bool: which of the (global) key positions ``keys`` each of a
    request's ``qlen`` rows sees. Its draft tokens are its last ``qlen`` keys, ``[L - qlen, L)``;
    every row sees the prefix before them. Row i sees draft token j (key ``L - qlen + j``) when
    ``j <= i`` (the causal chain: keys below ``L - qlen + 1 + i``, ``verify_row_limits``) or,
    with ``tree_rows`` (``[qlen]`` int64 masks), when bit j of ``tree_rows[i]`` is set. Nothing
    at or past ``L_real`` (``L`` when None) is seen."""
    if tree_rows is None:
        lim = verify_row_limits(L, L_real, qlen).to(keys.device)
        return keys[None, :] < lim[:, None]
    end = L if L_real is None else min(L, L_real)
    j = keys - (L - qlen)  # draft index of each key (negative: the prefix)
    bit = (tree_rows.to(torch.int64)[:, None] >> j.clamp(0, 63)[None, :]) & 1
    return (keys < end)[None, :] & ((j < 0)[None, :] | (bit != 0))


def cp_global_positions(n: int, world: int, rank: int, interleave: int) -> torch.Tensor:
    """Global positions below ``n`` held by context-parallel rank ``rank``, in local order.

    Global block ``i`` (positions ``[i*interleave, (i+1)*interleave)``) lives on rank
    ``i % world``, stored in order: local key ``j`` of the rank holds global position
    ``cp_global_positions(...)[j]``. Enumerated, not computed by a formula, so that it can
    check the kernels' and helpers' closed forms.
    """
    pos = torch.arange(max(n, 0))
    return pos[(pos // interleave) % world == rank]


def decode_verify_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    Lv: int,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    real_seq_lens: torch.Tensor | None,
    qlen: int,
    sm_scale: float,
    page_size: int,
    k_scale: torch.Tensor | float | None = None,
    compute_dtype: torch.dtype = torch.float32,
    cp_world: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    qo_indptr: torch.Tensor | None = None,
    tree_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal (or draft-tree) MLA verify attention.

    Args:
        q: ``[B*qlen, H, Lk]``; request b's token t is row ``b*qlen + t``. With ``qo_indptr``
            (``[B+1]`` ints): ``[R, H, Lk]``, request b's rows ``qo_indptr[b]:qo_indptr[b+1]``
            (``qlen_b`` of them, its last ``qlen_b`` keys being its drafts).
        k_buffer: ``[num_pages, page_size, 1, Lk]`` or ``[num_pages*page_size, 1, Lk]``, any
            dtype. V is ``k_buffer[..., :Lv]``. An fp8 cache is dequantized by ``k_scale``;
            ``k_scale`` is ignored for 16-bit caches, as the kernels ignore it.
        req_to_token: ``[B, max_pages]`` int block table.
        seq_lens / real_seq_lens: ``[B]`` ints (real_seq_lens may be None).
        cp_world / cp_rank / cp_interleave: context parallelism, as in
            ``decode_attention_fwd_verify``: the lengths are global, ``k_buffer`` and
            ``req_to_token`` the rank's shard, whose local key ``j`` holds global position
            ``cp_global_positions(L, ...)[j]``; row t sees the local keys whose global position
            is below its limit. The result is the rank's partial (o, lse).
        tree_mask: ``[rows]`` int64 or None: row i of request b sees draft token j (key
            ``L - qlen_b + j``) iff bit j of its mask is set (None: the causal chain, j <= i);
            see :func:`verify_visible`.

    Returns:
        ``o`` ``[rows, H, Lv]`` and ``lse`` ``[rows, H]`` (natural log), both in
        ``compute_dtype``. Rows with no key, and rows of no request, get ``o = 0`` and
        ``lse = -inf``.
    """
    rows, heads, Lk = q.shape
    batch = seq_lens.shape[0]
    pages = cache_pages(k_buffer, page_size)
    scale = 1.0 if k_scale is None or k_buffer.dtype not in FP8_DTYPES else float(k_scale)
    o = torch.zeros(rows, heads, Lv, dtype=compute_dtype, device=q.device)
    lse = torch.full((rows, heads), float("-inf"), dtype=compute_dtype, device=q.device)
    lens = seq_lens.tolist()
    reals = real_seq_lens.tolist() if real_seq_lens is not None else [None] * batch
    for b, (r0, n) in enumerate(verify_request_rows(batch, qlen, qo_indptr)):
        if n <= 0:
            continue
        # Global position of each key this call holds: all of them, or the rank's shard.
        if cp_world > 1:
            gpos = cp_global_positions(lens[b], cp_world, cp_rank, cp_interleave).to(q.device)
        else:
            gpos = torch.arange(max(lens[b], 0), device=q.device)
        tree_rows = None if tree_mask is None else tree_mask[r0 : r0 + n]
        visible = verify_visible(lens[b], reals[b], n, gpos, tree_rows)  # [n, keys]
        seen = visible.any(dim=0).nonzero()
        n_keys = int(seen.max()) + 1 if len(seen) else 0  # the keys any row sees: a prefix
        if n_keys == 0:
            continue
        table = req_to_token[b, : math.ceil(n_keys / page_size)].long()
        kv = pages[table].reshape(-1, Lk)[:n_keys].to(compute_dtype) * scale  # [n, Lk]
        qb = q[r0 : r0 + n].to(compute_dtype)  # [n, H, Lk]
        s = torch.einsum("thd,nd->thn", qb, kv) * sm_scale
        s = s.masked_fill(~visible[:, None, :n_keys], float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)  # [n, H]; -inf where a row sees nothing
        safe = torch.where(torch.isinf(row_lse), torch.zeros_like(row_lse), row_lse)
        p = torch.exp(s - safe[..., None])
        o[r0 : r0 + n] = torch.einsum("thn,nd->thd", p, kv[:, :Lv])
        lse[r0 : r0 + n] = row_lse
    return o, lse


def _empty_if_inf(lse_parts: torch.Tensor) -> torch.Tensor:
    """Partials' LSEs as the merge reads them: ``+inf`` becomes ``-inf``, a partial that saw no
    key. FlashAttention-2 writes ``+inf`` for a row with no key where FA3 (and these kernels)
    write ``-inf``; a real LSE is never infinite, so vLLM's merge reads both as empty, and so do
    the merge kernels here (``mla_ops.merge.kernels._empty_if_inf``). NaN stays NaN."""
    return lse_parts.masked_fill(lse_parts == float("inf"), float("-inf"))


def merge_attn_states_ref(
    o_parts: torch.Tensor,
    lse_parts: torch.Tensor,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact merge of P partial attention states of the same rows over disjoint key sets.

    Args:
        o_parts: ``[P, ...rows, D]`` each partial's normalized output.
        lse_parts: ``[P, ...rows]`` natural-log LSE of each partial; ``-inf`` or ``+inf``: the
            partial saw no key (its o is not read, NaN there is harmless; +inf is
            FlashAttention-2's empty row).

    Returns:
        ``o [...rows, D]`` ``= sum_p exp(lse_p - lse) o_p`` and ``lse [...rows]``
        ``= log sum_p exp(lse_p)``, in ``compute_dtype``; ``o = 0``, ``lse = -inf`` where every
        partial is ``-inf``.
    """
    lse_p = _empty_if_inf(lse_parts.to(compute_dtype))
    lse = torch.logsumexp(lse_p, dim=0)  # -inf where all partials are
    empty = torch.isinf(lse) & (lse < 0)
    w = torch.exp(lse_p - torch.where(empty, torch.zeros_like(lse), lse))  # [P, ...rows]
    o_p = torch.where((lse_p == float("-inf"))[..., None], 0.0, o_parts.to(compute_dtype))
    o = (w[..., None] * o_p).sum(dim=0)
    return o, lse


def rescale_attn_partial_ref(
    o_part: torch.Tensor,
    lse_parts: torch.Tensor,
    part: int,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial ``part``'s share of the merged state: ``(exp(lse_part - lse) * o_part, lse)`` with
    ``lse = log sum_p exp(lse_parts[p])``; 0 where ``lse_parts[part]`` is ``-inf`` or ``+inf``
    (o_part not read there). Summed over the partials, the shares give
    :func:`merge_attn_states_ref`'s o.

    Args: ``o_part [...rows, D]``, ``lse_parts [P, ...rows]``. Returns ``([...rows, D],
    [...rows])`` in ``compute_dtype``.
    """
    lse_p = _empty_if_inf(lse_parts.to(compute_dtype))
    lse = torch.logsumexp(lse_p, dim=0)
    own = lse_p[part]
    seen = own > float("-inf")
    w = torch.where(seen, torch.exp(own - torch.where(seen, lse, torch.zeros_like(lse))), 0.0)
    o = torch.where(seen[..., None], o_part.to(compute_dtype), 0.0) * w[..., None]
    return o, lse


def context_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b_start_loc: torch.Tensor,
    b_seq_len: torch.Tensor,
    is_causal: bool = True,
    softmax_scale: float | None = None,
    sliding_window_q: int | None = None,
    sliding_window_k: int | None = None,
    sinks: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
    query_chunk: int = 1024,
) -> torch.Tensor:
    """Encoder attention on packed variable-length sequences.

    Args:
        q: ``[total, Hq, D]``; k, v: ``[total, Hkv, D]`` with Hq a multiple of Hkv (query head h
            reads KV head ``h // (Hq // Hkv)``).
        b_start_loc / b_seq_len: ``[B]`` first token and length of each sequence.
        is_causal: query i sees keys j <= i of its own sequence (top-left aligned).
        sliding_window_q: when > 0, query i sees keys with ``i - j <= window``.
        sliding_window_k: when > 0, query i sees keys with ``j - i <= window``.
        sinks: ``[Hq]`` per-head null logit (natural-log units, not scaled) that only adds
            ``exp(sink)`` to the softmax denominator.

    Returns:
        ``o`` ``[total, Hq, D]`` in ``compute_dtype``; tokens outside every sequence stay 0.
    """
    total, hq, d = q.shape
    group = hq // k.shape[1]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    o = torch.zeros(total, hq, v.shape[-1], dtype=compute_dtype, device=q.device)
    for start, n in zip(b_start_loc.tolist(), b_seq_len.tolist()):
        if n == 0:
            continue
        kb = k[start : start + n].to(compute_dtype).repeat_interleave(group, dim=1).transpose(0, 1)
        vb = v[start : start + n].to(compute_dtype).repeat_interleave(group, dim=1).transpose(0, 1)
        j = torch.arange(n, device=q.device)
        for i0 in range(0, n, query_chunk):
            i1 = min(n, i0 + query_chunk)
            qb = q[start + i0 : start + i1].to(compute_dtype).transpose(0, 1)  # [Hq, m, D]
            s = torch.matmul(qb, kb.transpose(1, 2)) * scale  # [Hq, m, n]
            i = torch.arange(i0, i1, device=q.device)[:, None]
            keep = torch.ones(i1 - i0, n, dtype=torch.bool, device=q.device)
            if is_causal:
                keep &= j[None, :] <= i
            if sliding_window_q:
                keep &= (i - j[None, :]) <= sliding_window_q
            if sliding_window_k:
                keep &= (j[None, :] - i) <= sliding_window_k
            s = s.masked_fill(~keep[None], float("-inf"))
            if sinks is not None:
                sink = sinks.to(compute_dtype)[:, None, None].expand(hq, i1 - i0, 1)
                lse = torch.logsumexp(torch.cat([s, sink], dim=-1), dim=-1)
            else:
                lse = torch.logsumexp(s, dim=-1)
            safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
            p = torch.exp(s - safe[..., None])
            o[start + i0 : start + i1] = torch.matmul(p, vb).transpose(0, 1)
    return o


def decode_verify_op_ref(q, k_buffer, v_buffer, o, lse, req_to_token, seq_lens, real_seq_lens,
                         qlen, attn_logits, num_kv_splits, sm_scale, page_size, k_scale=None,
                         cp_world=1, cp_rank=0, cp_interleave=1, qo_indptr=None, tree_mask=None):
    """The CPU kernel of ``mla::decode_verify``: checks the arguments and, since it synchronises
    anyway, the data (:mod:`mla_ops.checked`), then writes the rows of every request of ``o``
    and ``lse`` (with ``qo_indptr``, rows from ``qo_indptr[B]`` on are left as they were)."""
    from . import checked, spec

    args = (q, k_buffer, v_buffer, o, lse, req_to_token, seq_lens, real_seq_lens, qlen,
            attn_logits, num_kv_splits, sm_scale, page_size, k_scale, cp_world, cp_rank,
            cp_interleave, qo_indptr, tree_mask)
    spec.python_checks()["decode_verify"](*args)
    checked.validate_decode_verify(*args)
    out, out_lse = decode_verify_ref(q, k_buffer, v_buffer.shape[-1], req_to_token, seq_lens,
                                     real_seq_lens, qlen, sm_scale, page_size, k_scale,
                                     cp_world=cp_world, cp_rank=cp_rank,
                                     cp_interleave=cp_interleave, qo_indptr=qo_indptr,
                                     tree_mask=tree_mask)
    used = q.shape[0] if qo_indptr is None else int(qo_indptr[-1])
    o[:used].copy_(out[:used])
    lse[:used].copy_(out_lse[:used])


def context_attention_op_ref(q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal=True,
                             softmax_scale=None, sliding_window_q=None, sliding_window_k=None,
                             sinks=None):
    """The CPU kernel of ``mla::context_attention``: checks the arguments and the data, then
    writes the rows of every sequence of ``o`` (other rows are left as they were)."""
    from . import checked, spec

    args = (q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal, softmax_scale,
            sliding_window_q, sliding_window_k, sinks)
    spec.python_checks()["context_attention"](*args)
    checked.validate_context_attention(*args)
    out = context_attention_ref(q, k, v, b_start_loc, b_seq_len, is_causal, softmax_scale,
                                sliding_window_q, sliding_window_k, sinks)
    for start, n in zip(b_start_loc.tolist(), b_seq_len.tolist()):
        o[start: start + n].copy_(out[start: start + n])


def merge_attn_states_op_ref(o_parts, lse_parts, o, lse=None):
    """The CPU kernel of ``mla::merge_attn_states``: checks the arguments and, since it
    synchronises anyway, the data (:mod:`mla_ops.checked`), then writes ``o`` (and ``lse``)."""
    from . import checked, spec

    spec.python_checks()["merge_attn_states"](o_parts, lse_parts, o, lse)
    checked.validate_merge_attn_states(o_parts, lse_parts, o, lse)
    out, out_lse = merge_attn_states_ref(o_parts, lse_parts)
    o.copy_(out)
    if lse is not None:
        lse.copy_(out_lse)


def rescale_attn_partial_op_ref(o_part, lse_parts, part, o_out, lse_out=None):
    """The CPU kernel of ``mla::rescale_attn_partial``: checks the arguments and the data, then
    writes ``o_out`` (``[rows, H, D]`` or ``[rows, C, H/C, D]``) and ``lse_out``."""
    from . import checked, spec

    spec.python_checks()["rescale_attn_partial"](o_part, lse_parts, part, o_out, lse_out)
    checked.validate_rescale_attn_partial(o_part, lse_parts, part, o_out, lse_out)
    out, out_lse = rescale_attn_partial_ref(o_part, lse_parts, part)
    o_out.copy_(out.view(o_out.shape))
    if lse_out is not None:
        lse_out.copy_(out_lse)
