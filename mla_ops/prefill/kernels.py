"""Triton kernels of the encoder (prefill) attention: ``@triton.jit`` only.

One program computes one ``BLOCK_M``-row block of queries of one (sequence, query head) pair
against that sequence's keys, flash-attention style (online softmax in base 2, the softmax
scale folded into the exponent). The head dim is covered by a power-of-2 main block of
``BLOCK_D`` lanes plus an optional power-of-2 tail of ``BLOCK_D_TAIL`` lanes (72 -> 64 + 16),
so a non-power-of-2 head dim does not pay for the next power of two. ``BLOCK_D_TAIL == 0``
removes every tail statement at compile time: that is exactly the single-block kernel.

The key range of a row block is walked in three phases: the blocks before the fully visible
range (masked), the fully visible interior (no mask, no bounds checks), the blocks after it
(masked). Blocks no row of the block can see (causal, windows, past the sequence) are never
loaded.

Out-of-range metadata (checked mode off, nothing validated on the host): a sequence whose start
or length is negative, or which ends past the ``total_tokens`` packed tokens, is clamped to
the packed tokens (``[start, start + len)`` intersected with ``[0, total_tokens)``), so no
address leaves q/k/v/o, and *marked*: its rows inside the packed tokens get ``o = NaN``. A
sequence longer than ``max_input_len`` gets ``o = NaN`` in its rows from ``max_input_len`` on
(the rows a grid of ``cdiv(max_input_len, BLOCK_M)`` row blocks would leave unwritten are
written NaN by the sequence's last row-block program; the rows below are computed). The fast
path pays a few scalar instructions per program and one ``[BLOCK_M]`` select in the epilogue.
"""

import triton
import triton.language as tl

# A finite "minus infinity" for the running max: a row that has seen only masked keys keeps
# m = _NEG_BIG, so exp2(m_old - m_new) is exp2(0) = 1 and never the NaN of (-inf) - (-inf).
_NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def program_sequence(B_Start_Loc, B_Seq_Len, total_tokens, REVERSED: tl.constexpr):
    """This program's ``(pid_m, head, batch)`` from the grid ``(row blocks, Hq, B)`` (the row
    blocks counted from the end where ``REVERSED``) and its sequence clamped into the packed
    tokens: ``seq_start`` int64, ``seq_len`` int32 and ``marked``, true where the metadata was
    not inside ``[0, total_tokens)``. Scalar integer code only, so the Gluon kernel
    (``gluon_kernels._tile``) calls it too: one clamping rule for both families."""
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    batch = tl.program_id(2)
    if REVERSED:
        pid_m = tl.num_programs(0) - 1 - pid_m
    seq_start = tl.load(B_Start_Loc + batch).to(tl.int64)
    seq_len = tl.load(B_Seq_Len + batch).to(tl.int64)
    seq_end = seq_start + seq_len  # int64: start + len may pass int32
    marked = (seq_start < 0) | (seq_len < 0) | (seq_end > total_tokens)
    seq_start = tl.minimum(tl.maximum(seq_start, 0), total_tokens)
    seq_len = (tl.minimum(tl.maximum(seq_end, seq_start), total_tokens) - seq_start).to(tl.int32)
    return pid_m, head, batch, seq_start, seq_len, marked


@triton.jit
def _token_offsets(seq_start, offs, stride, ALIGNED_8: tl.constexpr):
    """Element offsets ``(seq_start + offs) * stride`` of tokens ``offs`` of the sequence (int64:
    total * stride can pass 2**31 for long packed batches), hinted multiples of 8 where
    ``ALIGNED_8``. The hint annotates the product made here: put on a helper's argument it is
    dropped, and without the hints the kernel compiles to the hint-less one, which
    ``tuning.WORKAROUNDS["prefill_unaligned_copy"]`` avoids running (it miscompiles)."""
    rows = (seq_start + offs) * stride
    if ALIGNED_8:
        rows = tl.multiple_of(rows, 8)
    return rows


@triton.jit
def _load_tile(desc, ptrs, start, col0: tl.constexpr, row_ok, col_ok, USE_TMA: tl.constexpr,
               MASKED: tl.constexpr, MASK_COLS: tl.constexpr):
    """A ``[BLOCK_N, lanes]`` K or V tile of the keys from ``start``: from the descriptor at
    lane ``col0`` (TMA zero-fills past the sequence and the head dim), or through ``ptrs``
    (already at key ``start``), masked by the rows a masked block may not have and by the
    lanes past the head dim (``MASK_COLS``)."""
    if USE_TMA:
        x = desc.load([start, col0])
    elif MASKED:
        x = tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    elif MASK_COLS:
        x = tl.load(ptrs, mask=col_ok[None, :], other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _attn_block(
    acc, acc_t, m_i, l_i,
    q, q_t,
    p_k, p_kt, p_v, p_vt,
    k_desc, kt_desc, v_desc, vt_desc,
    offs_m, offs_n, seq_len,
    start_n, end_n,
    qk_scale, window_q, window_k,
    stride_kt, stride_vt,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_D_TAIL: tl.constexpr,
    MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
    HAS_WINDOW_Q: tl.constexpr, HAS_WINDOW_K: tl.constexpr,
    NUM_STAGES: tl.constexpr, USE_TMA: tl.constexpr,
):
    """Fold keys ``[start_n, end_n)`` (multiples of BLOCK_N apart) into the running softmax.

    ``p_k``/``p_v``: ``[BLOCK_N, BLOCK_D]`` pointers of the block at key 0 of the sequence,
    ``p_kt``/``p_vt`` the same for the tail lanes. ``MASKED`` blocks apply the sequence end,
    causal and window masks; unmasked (interior) blocks are known to be fully visible.
    With ``USE_TMA`` the tiles come from the tensor descriptors ``k_desc``/``v_desc`` (and
    ``kt_desc``/``vt_desc`` for the tail lanes) instead
    (``[seq_len, HEAD_DIM]`` views of this sequence and KV head: the copy engine zero-fills
    rows past the sequence and lanes past the head dim, so no load needs a mask).
    """
    offs_d = tl.arange(0, BLOCK_D)
    # Lanes past the head dim exist only when the block is wider than what it covers.
    MASK_D: tl.constexpr = HEAD_DIM < BLOCK_D
    MASK_DT: tl.constexpr = HEAD_DIM < BLOCK_D + BLOCK_D_TAIL
    d_ok = offs_d < HEAD_DIM
    if BLOCK_D_TAIL > 0:
        offs_dt = tl.arange(0, BLOCK_D_TAIL)
        dt_ok = offs_dt < HEAD_DIM - BLOCK_D

    for start in tl.range(start_n, end_n, BLOCK_N, num_stages=NUM_STAGES):
        start = tl.multiple_of(start, BLOCK_N)
        n_ok = (start + offs_n) < seq_len  # [BLOCK_N]
        # --- S = Q K^T over the main lanes, then accumulated over the tail lanes
        k = _load_tile(k_desc, p_k + start * stride_kt, start, 0, n_ok, d_ok, USE_TMA, MASKED, MASK_D)
        qk = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N] fp32
        if BLOCK_D_TAIL > 0:
            k_t = _load_tile(kt_desc, p_kt + start * stride_kt, start, BLOCK_D, n_ok, dt_ok, USE_TMA, MASKED,
                             MASK_DT)
            qk = tl.dot(q_t, tl.trans(k_t), qk)

        # --- online softmax in base 2 (qk_scale = softmax_scale * log2(e))
        if MASKED:
            cols = start + offs_n  # [BLOCK_N] key positions in the sequence
            visible = n_ok[None, :] & (offs_m[:, None] >= 0)  # [BLOCK_M, BLOCK_N]
            if IS_CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None])
            if HAS_WINDOW_Q:
                visible = visible & (offs_m[:, None] - cols[None, :] <= window_q)
            if HAS_WINDOW_K:
                visible = visible & (cols[None, :] - offs_m[:, None] <= window_k)
            qk = tl.where(visible, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))  # [BLOCK_M]
            p = tl.exp2(qk - m_new[:, None])  # [BLOCK_M, BLOCK_N]
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)  # [BLOCK_M]
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new

        # --- O += P V, one accumulator per lane block
        v = _load_tile(v_desc, p_v + start * stride_vt, start, 0, n_ok, d_ok, USE_TMA, MASKED, MASK_D)
        p_lo = p.to(v.dtype)
        acc = tl.dot(p_lo, v, acc * alpha[:, None])  # [BLOCK_M, BLOCK_D]
        if BLOCK_D_TAIL > 0:
            v_t = _load_tile(vt_desc, p_vt + start * stride_vt, start, BLOCK_D, n_ok, dt_ok, USE_TMA, MASKED,
                             MASK_DT)
            acc_t = tl.dot(p_lo, v_t, acc_t * alpha[:, None])  # [BLOCK_M, BLOCK_D_TAIL]
    return acc, acc_t, m_i, l_i


@triton.jit(do_not_specialize=["total_tokens", "max_input_len"])
def context_attention_kernel(
    Q, K, V, O, Sinks,
    B_Start_Loc, B_Seq_Len,
    qk_scale, window_q, window_k,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    kv_group, total_tokens, max_input_len,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_D_TAIL: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_WINDOW_Q: tl.constexpr, HAS_WINDOW_K: tl.constexpr,
    HAS_SINKS: tl.constexpr, HEAD_STRIDE_ALIGNED_8: tl.constexpr,
    NUM_M_BLOCKS_REVERSED: tl.constexpr, NUM_STAGES: tl.constexpr, USE_TMA: tl.constexpr,
):
    """Encoder attention on packed variable-length sequences.

    Q ``[total, Hq, HEAD_DIM]``, K/V ``[total, Hkv, HEAD_DIM]`` (Hq = kv_group * Hkv), O
    ``[total, Hq, HEAD_DIM]`` (mutated: rows of each sequence; other rows untouched), Sinks
    ``[Hq]`` (read when HAS_SINKS), B_Start_Loc/B_Seq_Len ``[B]`` int32/int64.
    Grid ``(max(cdiv(max_input_len, BLOCK_M), 1), Hq, B)``; ``total_tokens`` is q's row count.
    Out-of-range starts / lengths / ``max_input_len``: see the module docstring.

    HEAD_STRIDE_ALIGNED_8: every token and head stride of Q/K/V/O is a multiple of 8 elements
    (checked by the launcher on the real strides). Triton only infers divisibility by 16 of
    integer arguments, so at head dim 72 (stride 8 mod 16) it would otherwise assume nothing
    and fall back to scalar loads.

    USE_TMA (Hopper; needs HEAD_STRIDE_ALIGNED_8 and a ``triton.set_allocator`` scratch):
    K/V tiles through per-program tensor descriptors, loaded by the copy engine.
    """
    # NUM_M_BLOCKS_REVERSED: causal row blocks at the end of a sequence see the most keys, so
    # they start first and the last wave is made of short programs. Whether the sequence is
    # marked is read again in the epilogue.
    pid_m, cur_head, cur_batch, seq_start, seq_len, _ = program_sequence(
        B_Start_Loc, B_Seq_Len, total_tokens, NUM_M_BLOCKS_REVERSED)
    m_start = pid_m * BLOCK_M
    if m_start >= seq_len:
        return
    cur_kv_head = cur_head // kv_group

    # Head-axis offsets hoisted into locals so the alignment hint has something to annotate
    # (a hint on a kernel argument itself is dropped; the products below carry it, and the
    # token strides get theirs through the row offsets further down).
    off_qh = cur_head * stride_qh
    off_kh = cur_kv_head * stride_kh
    off_vh = cur_kv_head * stride_vh
    off_oh = cur_head * stride_oh
    if HEAD_STRIDE_ALIGNED_8:
        off_qh = tl.multiple_of(off_qh, 8)
        off_kh = tl.multiple_of(off_kh, 8)
        off_vh = tl.multiple_of(off_vh, 8)
        off_oh = tl.multiple_of(off_oh, 8)

    # A sequence longer than the grid reaches (max_input_len too small): the last row-block
    # program first writes NaN into its rows past the grid (never taken for valid metadata).
    # Here, before the main loop, through a flat 1-D tile: a [BLOCK_M, BLOCK_D] tile after the
    # loop held 42-69 more registers across the whole kernel (8 warps at D 64: 128 -> 170+,
    # half the occupancy: P1 30% slower on the H200).
    if pid_m == tl.num_programs(0) - 1:
        FILL: tl.constexpr = 256
        first = m_start + BLOCK_M  # the first row no program of the grid covers
        n_fill = tl.maximum(seq_len - first, 0) * HEAD_DIM
        for i0 in range(0, n_fill, FILL):
            idx = i0 + tl.arange(0, FILL)  # [FILL] elements of the rows past the grid
            row = (seq_start + first + idx // HEAD_DIM).to(tl.int64)
            p_f = O + off_oh + row * stride_ot + idx % HEAD_DIM
            tl.store(p_f, tl.full([FILL], float("nan"), O.dtype.element_ty), mask=idx < n_fill)

    offs_m = m_start + tl.arange(0, BLOCK_M)  # [BLOCK_M] query positions in the sequence
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < seq_len
    d_ok = offs_d < HEAD_DIM

    row_q = _token_offsets(seq_start, offs_m, stride_qt, HEAD_STRIDE_ALIGNED_8)  # [BLOCK_M]
    row_o = _token_offsets(seq_start, offs_m, stride_ot, HEAD_STRIDE_ALIGNED_8)
    p_q = Q + off_qh + row_q[:, None] + offs_d[None, :]  # [BLOCK_M, BLOCK_D]
    q = tl.load(p_q, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    row_k = _token_offsets(seq_start, offs_n, stride_kt, HEAD_STRIDE_ALIGNED_8)  # [BLOCK_N]
    row_v = _token_offsets(seq_start, offs_n, stride_vt, HEAD_STRIDE_ALIGNED_8)
    p_k = K + off_kh + row_k[:, None] + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    p_v = V + off_vh + row_v[:, None] + offs_d[None, :]  # [BLOCK_N, BLOCK_D]

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if BLOCK_D_TAIL > 0:
        offs_dt = BLOCK_D + tl.arange(0, BLOCK_D_TAIL)
        dt_ok = offs_dt < HEAD_DIM
        q_t = tl.load(Q + off_qh + row_q[:, None] + offs_dt[None, :],
                      mask=m_ok[:, None] & dt_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D_TAIL]
        p_kt = K + off_kh + row_k[:, None] + offs_dt[None, :]  # [BLOCK_N, BLOCK_D_TAIL]
        p_vt = V + off_vh + row_v[:, None] + offs_dt[None, :]
        acc_t = tl.zeros([BLOCK_M, BLOCK_D_TAIL], dtype=tl.float32)
    else:
        # Placeholders the dead tail code never reads.
        q_t = q
        p_kt = p_k
        p_vt = p_v
        acc_t = acc

    if USE_TMA:
        # [seq_len, HEAD_DIM] views of this sequence's K/V head: out-of-range rows and lanes
        # read as zero, so neither the sequence end nor the head-dim tail needs a load mask.
        k_base = K + off_kh + seq_start * stride_kt
        v_base = V + off_vh + seq_start * stride_vt
        k_desc = tl.make_tensor_descriptor(k_base, [seq_len, HEAD_DIM], [stride_kt, 1], [BLOCK_N, BLOCK_D])
        v_desc = tl.make_tensor_descriptor(v_base, [seq_len, HEAD_DIM], [stride_vt, 1], [BLOCK_N, BLOCK_D])
        if BLOCK_D_TAIL > 0:
            kt_desc = tl.make_tensor_descriptor(k_base, [seq_len, HEAD_DIM], [stride_kt, 1],
                                                [BLOCK_N, BLOCK_D_TAIL])
            vt_desc = tl.make_tensor_descriptor(v_base, [seq_len, HEAD_DIM], [stride_vt, 1],
                                                [BLOCK_N, BLOCK_D_TAIL])
        else:
            kt_desc = k_desc
            vt_desc = v_desc
    else:
        k_desc = p_k
        kt_desc = p_k
        v_desc = p_v
        vt_desc = p_v

    if HAS_SINKS:
        # The sink is a null logit in natural-log units, outside the softmax scale: start the
        # running softmax as if one key of logit `sink` had been seen with a zero value.
        sink = tl.load(Sinks + cur_head).to(tl.float32) * 1.4426950408889634
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + sink
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    else:
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + _NEG_BIG
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)

    # --- the key range [lo, hi) some row of the block sees, and the fully visible [full_lo, full_hi)
    m_last = tl.minimum(m_start + BLOCK_M, seq_len) - 1  # last real row of the block
    lo = 0
    hi = seq_len
    full_lo = 0
    full_hi = seq_len
    if IS_CAUSAL:
        hi = tl.minimum(hi, m_last + 1)
        full_hi = tl.minimum(full_hi, m_start + 1)
    if HAS_WINDOW_Q:
        lo = tl.maximum(lo, m_start - window_q)
        full_lo = tl.maximum(full_lo, m_last - window_q)
    if HAS_WINDOW_K:
        hi = tl.minimum(hi, m_last + window_k + 1)
        full_hi = tl.minimum(full_hi, m_start + window_k + 1)
    lo = (lo // BLOCK_N) * BLOCK_N
    hi_blk = tl.cdiv(hi, BLOCK_N) * BLOCK_N
    # Interior: whole blocks inside [full_lo, full_hi), clamped into [lo, hi_blk].
    mid_lo = tl.minimum(tl.maximum(tl.cdiv(full_lo, BLOCK_N) * BLOCK_N, lo), hi_blk)
    mid_hi = tl.minimum(tl.maximum((full_hi // BLOCK_N) * BLOCK_N, mid_lo), hi_blk)

    # The three ranges in order, unrolled at compile time: [lo, mid_lo) masked, the interior
    # [mid_lo, mid_hi) without masks, [mid_hi, hi_blk) masked.
    bounds = (lo, mid_lo, mid_hi, hi_blk)
    for part in tl.static_range(3):
        acc, acc_t, m_i, l_i = _attn_block(
            acc, acc_t, m_i, l_i, q, q_t, p_k, p_kt, p_v, p_vt, k_desc, kt_desc, v_desc, vt_desc,
            offs_m, offs_n, seq_len,
            bounds[part], bounds[part + 1], qk_scale, window_q, window_k, stride_kt, stride_vt,
            HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_D_TAIL,
            part != 1, IS_CAUSAL, HAS_WINDOW_Q, HAS_WINDOW_K, NUM_STAGES, USE_TMA)

    # --- epilogue: every real row saw at least its own key (or the sink), so l_i > 0 there.
    inv_l = 1.0 / tl.where(m_ok, l_i, 1.0)  # [BLOCK_M]; rows past the sequence are not stored
    # A marked sequence (its metadata read again here rather than held in a register across
    # the main loop: at D 96 that spilled), and rows from max_input_len on: NaN.
    raw_start = tl.load(B_Start_Loc + cur_batch).to(tl.int64)
    raw_len = tl.load(B_Seq_Len + cur_batch).to(tl.int64)
    marked = (raw_start < 0) | (raw_len < 0) | (raw_start + raw_len > total_tokens)
    inv_l = tl.where(marked | (offs_m >= max_input_len), float("nan"), inv_l)
    p_o = O + off_oh + row_o[:, None] + offs_d[None, :]  # [BLOCK_M, BLOCK_D]
    tl.store(p_o, (acc * inv_l[:, None]).to(O.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
    if BLOCK_D_TAIL > 0:
        p_ot = O + off_oh + row_o[:, None] + offs_dt[None, :]  # [BLOCK_M, BLOCK_D_TAIL]
        tl.store(p_ot, (acc_t * inv_l[:, None]).to(O.dtype.element_ty),
                 mask=m_ok[:, None] & dt_ok[None, :])


@triton.jit
def exp2_fma(x):
    """``2^x`` in fp32 for ``x <= 0`` on the FMA and integer pipes, no MUFU (FA4's trick): ``x``
    is split into the nearest integer n (adding 1.5 * 2^23 rounds it into the low mantissa bits)
    and f in [-0.5, 0.5]; 2^f by a degree-3 polynomial with 2^0 = 1 exact (relative error
    1.0e-4, 13.3 bits: below the rounding of a 16-bit P); n added to the exponent field. Below
    -127 (masked scores: -inf) it returns 0 exactly. The Gluon encoder kernel calls it on part
    of each score tile (``gluon_kernels._exp2_tile``)."""
    x = tl.maximum(x, -127.0)
    j = x + 12582912.0
    f = x - (j - 12582912.0)
    p = f * 0.05500892922282219 + 0.24221095442771912
    p = p * f + 0.6932829022407532
    p = p * f + 1.0
    bits = p.to(tl.int32, bitcast=True) + (j.to(tl.int32, bitcast=True) << 23)
    return bits.to(tl.float32, bitcast=True)
