"""Triton kernels merging partial attention states by LSE (``@triton.jit`` only; launchers in
launch.py).

A partial state of one (row, head) over a set of keys is its normalized output ``o_p`` and its
natural-log ``lse_p``; over disjoint key sets they merge exactly into
``lse = log sum_p exp(lse_p)`` and ``o = sum_p exp(lse_p - lse) o_p``. A partial with
``lse_p = -inf`` saw no key: it weighs 0 and its ``o_p`` is never read (a rank that holds none of
a row's keys may leave anything there). ``lse_p = +inf`` means the same, as in vLLM's merge:
FlashAttention-2 writes +inf for a row with no key (FA3 writes -inf), and a real LSE is never
infinite, so every LSE is read through :func:`_empty_if_inf` before anything else sees it.
Every program handles one (row, head) and a block of ``BLOCK_D`` columns, and runs the partials'
LSEs through an online max / sum in fp32 like the verify kernel's stage 2, with ``-inf`` made
safe: a block of partials that are all ``-inf`` must not turn ``exp(-inf - -inf)`` into NaN.
"""

import triton
import triton.language as tl


@triton.jit
def _empty_if_inf(lse):
    """A partial's LSE as the merge reads it: ``+inf`` (FlashAttention-2's empty row) is ``-inf``,
    a partial that saw no key; anything else unchanged."""
    return tl.where(lse == float("inf"), float("-inf"), lse)


@triton.jit
def _lse_step(m_i, l_i, lse_p):
    """One online step over a block ``lse_p [BLOCK_P]`` of partials' LSEs (masked ones ``-inf``):
    ``(m_new, m_safe, alpha, w)`` with ``w = exp(lse_p - m_safe)`` and ``l * alpha + sum(w)``
    the new running sum. ``m_safe`` is ``m_new``, or 0 while every partial so far is ``-inf``."""
    m_new = tl.maximum(m_i, tl.max(lse_p, axis=0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)  # 0 while m_i is -inf
    w = tl.exp(lse_p - m_safe)  # [BLOCK_P]; 0 for -inf partials
    return m_new, m_safe, alpha, w, l_i * alpha + tl.sum(w, axis=0)


@triton.jit
def _program_tile(num_heads, head_dim, BLOCK_D: tl.constexpr):
    """This program's ``(row, head, pid_d, offs_d, mask_d)``: program 0 runs ``row * H + head``
    (int64: rows * H may pass 2**31 / D), program 1 the block of ``BLOCK_D`` columns."""
    pid = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    return pid // num_heads, pid % num_heads, pid_d, offs_d, offs_d < head_dim


@triton.jit(do_not_specialize=["num_parts", "num_heads"])
def _merge_attn_states(
    O_Parts,  # [P, rows, H, D]
    Lse_Parts,  # [P, rows, H] fp32
    O,  # [rows, H, D]
    Lse,  # [rows, H] fp32, or None
    num_parts,
    num_heads,
    head_dim,
    stride_op_p,
    stride_op_m,
    stride_op_h,
    stride_lp_p,
    stride_lp_m,
    stride_lp_h,
    stride_om,
    stride_oh,
    stride_lm,
    stride_lh,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    row, head, pid_d, offs_d, mask_d = _program_tile(num_heads, head_dim, BLOCK_D)
    p_lse = Lse_Parts + row * stride_lp_m + head * stride_lp_h
    p_o = O_Parts + row * stride_op_m + head * stride_op_h
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for p0 in range(0, num_parts, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        lse_p = _empty_if_inf(tl.load(p_lse + offs_p * stride_lp_p, mask=offs_p < num_parts,
                                      other=float("-inf")))
        m_i, m_safe, alpha, w, l_i = _lse_step(m_i, l_i, lse_p)
        # Partials that saw no key are not read at all: their o may be garbage (NaN).
        seen = lse_p > float("-inf")
        o_p = tl.load(p_o + offs_p[:, None].to(tl.int64) * stride_op_p + offs_d[None, :],
                      mask=seen[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_P, BLOCK_D]
        acc = acc * alpha + tl.sum(w[:, None] * o_p.to(tl.float32), axis=0)
    has_key = l_i > 0.0
    out = tl.where(has_key, acc / tl.where(has_key, l_i, 1.0), 0.0)
    tl.store(O + row * stride_om + head * stride_oh + offs_d, out.to(O.dtype.element_ty), mask=mask_d)
    if WRITE_LSE:
        if pid_d == 0:
            lse = tl.where(has_key, m_i + tl.log(tl.where(has_key, l_i, 1.0)), float("-inf"))
            tl.store(Lse + row * stride_lm + head * stride_lh, lse)


@triton.jit(do_not_specialize=["part", "num_parts", "num_heads", "heads_per_chunk"])
def _rescale_attn_partial(
    O_Part,  # [rows, H, D] partial `part`'s o
    Lse_Parts,  # [P, rows, H] fp32: every partial's LSE
    O_Out,  # [rows, C, H / C, D]: o_part's share of the merged o
    Lse_Out,  # [rows, H] fp32 merged LSE, or None
    part,
    num_parts,
    num_heads,
    head_dim,
    heads_per_chunk,
    stride_o_m,
    stride_o_h,
    stride_lp_p,
    stride_lp_m,
    stride_lp_h,
    stride_out_m,
    stride_out_c,
    stride_out_h,
    stride_lo_m,
    stride_lo_h,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    """``O_Out = exp(lse_part - lse) * O_Part`` with ``lse`` the merged LSE: summed over the
    partials (a reduce-scatter / all-reduce across ranks), these give the merged o. The output's
    heads come in ``C`` chunks of ``heads_per_chunk`` with their own stride, so that a
    reduce-scatter's input ``[C, rows, H / C, D]`` is written in place, without a transpose."""
    row, head, pid_d, offs_d, mask_d = _program_tile(num_heads, head_dim, BLOCK_D)
    p_lse = Lse_Parts + row * stride_lp_m + head * stride_lp_h
    m_i = float("-inf")
    l_i = 0.0
    for p0 in range(0, num_parts, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        lse_p = _empty_if_inf(tl.load(p_lse + offs_p * stride_lp_p, mask=offs_p < num_parts,
                                      other=float("-inf")))
        m_i, m_safe, alpha, w, l_i = _lse_step(m_i, l_i, lse_p)
    has_key = l_i > 0.0
    lse = tl.where(has_key, m_i + tl.log(tl.where(has_key, l_i, 1.0)), float("-inf"))
    lse_own = _empty_if_inf(tl.load(p_lse + part * stride_lp_p))
    seen = lse_own > float("-inf")  # then has_key too, and lse is finite
    w_own = tl.where(seen, tl.exp(lse_own - tl.where(seen, lse, 0.0)), 0.0)
    # Not read at all where this partial saw no key (columns masked off by a zero bound).
    o = tl.load(O_Part + row * stride_o_m + head * stride_o_h + offs_d,
                mask=offs_d < tl.where(seen, head_dim, 0), other=0.0)
    chunk = head // heads_per_chunk
    head_in_chunk = head - chunk * heads_per_chunk
    p_out = O_Out + row * stride_out_m + chunk * stride_out_c + head_in_chunk * stride_out_h
    tl.store(p_out + offs_d, (o.to(tl.float32) * w_own).to(O_Out.dtype.element_ty), mask=mask_d)
    if WRITE_LSE:
        if pid_d == 0:
            tl.store(Lse_Out + row * stride_lo_m + head * stride_lo_h, lse)
