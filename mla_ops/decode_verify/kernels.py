"""Triton kernels of the MLA decode-verify attention (``@triton.jit`` only; launchers in launch.py).

Stage 1: one program per (row block, request, KV split). A row block is ``BLOCK_H`` of the
``qlen * H`` (verify token, head) rows of one request, row ``r`` being token ``r // H`` and head
``r % H``. Every row of a request reads the same latent KV, so the program loads each KV tile
``[BLOCK_N, Lk]`` once through the block table and uses it for all of its rows: as K for
``QK = q_main @ k_main^T + q_pe @ k_pe^T`` and, its first ``Lv`` columns, as V for ``P @ V``.

Stage 2: one program per (row, head, column block of o) merges that row's existing splits by
their LSE.

Scores are kept in log2 units (``sm_scale * log2(e)`` folded into one scale) so the softmax
uses ``exp2``; the LSE written out is natural-log.

Launch features, each a constexpr set from the config (``configs.py``): ``SWAP_AB`` (rows as the
MMA's N), ``QSPLIT`` (the Lv part in two halves), ``USE_TMA`` (unmasked KV blocks by bulk tensor
copies through host descriptors), ``PERSISTENT`` (programs loop over the stage-1 work) and
``USE_PDL`` (stage 2 as a programmatic dependent launch of stage 1).

Ragged draft counts (``VARLEN``): request b's rows are ``[Qo_Indptr[b], Qo_Indptr[b+1])`` of
q / o / lse (and the workspace), ``qlen_b <= QLEN`` of them, its drafts its last ``qlen_b``
keys; the grid is still laid out for ``QLEN`` rows a request, and a row block or stage-2
program past the request's rows does nothing. Draft trees (``HAS_TREE``): bit j of a row's
int64 mask says it sees draft token j (key ``L - qlen_b + j``); every row's limit is then the
request's, the unmasked blocks end where the drafts start, and only the masked tail tests the
bits. Both are constexprs: a launch without them compiles to the kernels without them.

Decode context parallelism (``CP_WORLD > 1``): the cache is sharded along the sequence over
``CP_WORLD`` ranks in round-robin blocks of ``CP_INTERLEAVE`` tokens, and this launch attends
over rank ``cp_rank``'s shard. Lengths come in global, the block table is the rank's own; each
program turns the row limits and the request length into local ones (``_cp_local_len``), and
everything after that (splits, masks, table reads) is the single-GPU code on local positions.
``CP_WORLD == 1`` (``cp_rank`` None) compiles to exactly the single-GPU kernel.

Out-of-range metadata (checked mode off, nothing validated on the host): every page index read
from the block table is clamped into ``[0, num_pages)`` before it forms an address (an index
outside reads page ``num_pages - 1``), and a length past the block table
(``seq_len > kv_capacity``, local under context parallelism) is clamped to it, so no input
makes an address outside the cache or the table. Such a request is *marked*: every row gets
``o = NaN`` and ``lse = NaN``. It is marked when ``seq_len < 0``, when
``seq_len > kv_capacity``, or when a page index its keys ``[0, min(seq_len, real_len))`` map to
is outside the cache (pages only a length past ``real_len`` would touch are never read and
never mark). The block loops pay one unsigned min (the clamp: a negative index is huge as
uint32) and one unsigned max (the running largest index, compared with ``num_pages`` once
after the loops) per index they load anyway. Before the loops each program also checks the
table entries of its split that only later rows of the request read (rarely any; never with
qlen 1, where it is not compiled), so every row block agrees. Split partials carry the mark as
NaN, and stage 2 merges the lse of all the request's splits, so a NaN partial makes the row's
sum NaN, which it turns into NaN rows explicitly (its ``has_key`` test would read a NaN sum as
"no key").
"""

import triton
import triton.language as tl

from ..numerics import LN2
from .splits import balanced_splits, split_chunk

try:  # programmatic dependent launch (triton >= 3.4); the launcher only asks for it when present
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_PDL = True
except ImportError:
    gdc_launch_dependents = gdc_wait = None
    HAS_PDL = False

_LN2 = tl.constexpr(LN2)


@triton.jit
def _cp_local_len(n, cp_rank, CP_WORLD: tl.constexpr, CP_INTERLEAVE: tl.constexpr):
    """How many of the global positions ``[0, n)`` rank ``cp_rank`` holds (``n >= 0``, any shape).

    Global block ``i`` (positions ``[i*I, (i+1)*I)``) lives on rank ``i % W``, stored in order,
    so the positions a rank holds below ``n`` are a prefix of its local cache of this length:
    ``I`` per whole cycle of ``W*I`` positions, plus the rank's part of the last, partial cycle.
    """
    CYCLE: tl.constexpr = CP_WORLD * CP_INTERLEAVE
    cycles = n // CYCLE
    part = tl.minimum(tl.maximum(n - cycles * CYCLE - cp_rank * CP_INTERLEAVE, 0), CP_INTERLEAVE)
    return cycles * CP_INTERLEAVE + part


@triton.jit
def _balance_keys(Seq_Lens, Real_Lens, offs, batch, kv_capacity, cp_rank, CP_WORLD: tl.constexpr,
                  CP_INTERLEAVE: tl.constexpr):
    """The keys requests ``offs`` bring to a balanced launch (``splits.balanced_splits``):
    ``min(local(max(min(L, L_real), 0)), kv_capacity)``, 0 past the batch."""
    m = offs < batch
    n = tl.maximum(tl.minimum(tl.load(Seq_Lens + offs, mask=m, other=0),
                              tl.load(Real_Lens + offs, mask=m, other=0)), 0)
    if CP_WORLD > 1:
        n = _cp_local_len(n, cp_rank, CP_WORLD, CP_INTERLEAVE)
    return tl.minimum(n, kv_capacity)


@triton.jit
def _balanced_piece(Seq_Lens, Real_Lens, piece, batch, num_kv_splits, kv_capacity, cp_rank,
                    CP_WORLD: tl.constexpr, CP_INTERLEAVE: tl.constexpr, BALANCE: tl.constexpr):
    """``(request, slot, k)`` of a balanced launch's piece ``piece`` (``splits.py``): the
    batch's pieces are numbered request by request (request r's ``k_r`` after the earlier
    ones'), so they fill the grid's first slots and its CTAs past them have nothing to do:
    request -1 there. Two passes over the lengths, 128 requests a step: their sum, then each
    request's pieces and where they start."""
    total = (batch * 0).to(tl.int64)
    for b0 in range(0, batch, 128):
        offs = b0 + tl.arange(0, 128)
        total += tl.sum(_balance_keys(Seq_Lens, Real_Lens, offs, batch, kv_capacity, cp_rank, CP_WORLD,
                                      CP_INTERLEAVE).to(tl.int64), axis=0)
    req = batch * 0 - 1
    slot = batch * 0
    k_req = batch * 0 + 1
    base = batch * 0
    for b0 in range(0, batch, 128):
        offs = b0 + tl.arange(0, 128)
        n = _balance_keys(Seq_Lens, Real_Lens, offs, batch, kv_capacity, cp_rank, CP_WORLD, CP_INTERLEAVE)
        k = tl.where(offs < batch, balanced_splits(n, total, batch, num_kv_splits, BALANCE), 0)
        end = base + tl.cumsum(k, axis=0)  # past request r's last piece
        hit = (end - k <= piece) & (piece < end)
        req = tl.maximum(req, tl.max(tl.where(hit, offs, -1), axis=0))
        slot = tl.maximum(slot, tl.max(tl.where(hit, piece - (end - k), 0), axis=0))
        k_req = tl.maximum(k_req, tl.max(tl.where(hit, k, 0), axis=0))
        base += tl.sum(k, axis=0)
    return req, slot, k_req


@triton.jit
def _request_rows(Qo_Indptr, pid_b, num_rows, max_rows):
    """``(first row, rows, bad)`` of request ``pid_b`` from ``Qo_Indptr`` (ragged draft counts),
    clamped so that no row outside ``[0, num_rows)`` and no more than ``max_rows`` rows are ever
    addressed; ``bad`` when clamping changed anything (offsets negative, decreasing, past the
    rows or more than ``max_rows`` apart): the request is then marked like one with out-of-range
    metadata.

    Scalar loads and integer arithmetic only, so the Gluon kernels call it too: ``max_rows`` is
    the constexpr QLEN here and the runtime ``qlen`` there."""
    start = tl.load(Qo_Indptr + pid_b)
    end = tl.load(Qo_Indptr + pid_b + 1)
    row_base = tl.minimum(tl.maximum(start, 0), num_rows)
    count = tl.minimum(tl.minimum(tl.maximum(end, row_base), num_rows) - row_base, max_rows)
    bad = (start < 0) | (end < start) | (end > num_rows) | (end - start > max_rows)
    return row_base, count, bad


@triton.jit
def _page_in_cache(page, num_pages):
    """``(page clamped into [0, num_pages), the index as uint32)``, any shape. As unsigned, a
    negative index is huge, so one unsigned min clamps both ends (to ``num_pages - 1``); the
    caller keeps the running unsigned max of the raw indices, and the request is marked when
    it reaches ``num_pages`` (module docstring): one min and one max per index read."""
    raw = page.to(tl.uint32, bitcast=True)
    return tl.minimum(raw, num_pages.to(tl.uint32) - 1), raw


@triton.jit
def _kv_offsets(
    Req_to_Token, req_row, start_n, offs_n, load_mask, stride_kpage, stride_ktok, num_pages,
    PAGE_SIZE: tl.constexpr, ONE_PAGE: tl.constexpr, MASKED: tl.constexpr,
):
    """int64 element offsets ``[BLOCK_N]`` of the tokens ``offs_n`` of one request in the cache,
    and the page indices read, as uint32 (scalar with ONE_PAGE, else ``[BLOCK_N]``; see
    ``_page_in_cache``).

    Page offsets are int64 because a cross-layer cache view has page strides of
    ``layers * page_size * Lk`` elements, past int32 in big caches.
    """
    tok_off = (offs_n % PAGE_SIZE).to(tl.int64) * stride_ktok  # [BLOCK_N]
    if ONE_PAGE:
        # The whole KV block lies in one page (start_n < kv_end <= L): one table read.
        page, raw = _page_in_cache(tl.load(Req_to_Token + req_row + start_n // PAGE_SIZE), num_pages)
        return page.to(tl.int64) * stride_kpage + tok_off, raw
    else:
        if MASKED:
            # Table entries past the split end may not exist: read page 0 there (loads masked).
            pages = tl.load(Req_to_Token + req_row + offs_n // PAGE_SIZE, mask=load_mask, other=0)
        else:
            pages = tl.load(Req_to_Token + req_row + offs_n // PAGE_SIZE)
        pages, raw = _page_in_cache(pages, num_pages)
        return pages.to(tl.int64) * stride_kpage + tok_off, raw


@triton.jit
def _tree_visible(tree_rows, d0, BLOCK_N: tl.constexpr, KEY_AX: tl.constexpr):
    """Which keys of a block each row sees under its draft-tree mask: ``[BLOCK_H, BLOCK_N]``
    (``KEY_AX`` 1; 0: transposed). Key ``c`` of the block is draft token ``j = d0 + c`` (``d0``:
    the block's first key minus the drafts' first); it needs bit j of the row's mask
    (``tree_rows`` ``[BLOCK_H]`` int64), and ``j < 0`` (the prefix) is every row's. (One 64-bit
    shift per score: aligning each row's mask to the block first and testing 32-bit halves,
    as the Gluon kernel does, spilled more here, offline for sm_90a.)"""
    draft = d0 + tl.arange(0, BLOCK_N)  # [BLOCK_N] draft index of each key
    shift = tl.minimum(tl.maximum(draft, 0), 63).to(tl.int64)
    bit = (tl.expand_dims(tree_rows, KEY_AX) >> tl.expand_dims(shift, 1 - KEY_AX)) & 1
    return (tl.expand_dims(draft, 1 - KEY_AX) < 0) | (bit != 0)


@triton.jit
def _score_dot(q, k, acc, SWAP_AB: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Scores of rows q against keys k, added to acc (None: none).

    Plain: ``q [BLOCK_H, D] @ k^T -> [BLOCK_H, BLOCK_N]``. SWAP_AB: q comes in transposed
    (``[D, BLOCK_H]``) and ``k [BLOCK_N, D] @ q -> [BLOCK_N, BLOCK_H]``, so that the tile's few
    rows are the MMA's N (any multiple of 8 on Hopper's wgmma) instead of its M (64 per
    warpgroup), and A is the K tile as loaded (K-major).
    """
    if SWAP_AB:
        # k may still be the cache's dtype (fp8): converted here, at its use, so that the
        # converted tile is not kept live across the softmax (see _attend_block).
        return tl.dot(k.to(q.dtype), q, acc, input_precision=DOT_PRECISION)
    else:
        return tl.dot(q, tl.trans(k), acc, input_precision=DOT_PRECISION)


@triton.jit
def _value_dot(p, v, acc, SWAP_AB: tl.constexpr, V_T: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``acc + P @ V``: plain ``p [BLOCK_H, BLOCK_N] @ v -> [BLOCK_H, D]``; SWAP_AB the transposed
    ``v^T @ p [BLOCK_N, BLOCK_H] -> [D, BLOCK_H]``: M = D, A = the K tile read transposed
    (MN-major, which 16-bit wgmma takes from shared memory), B = p. V_T: v is already
    ``[D, BLOCK_N]`` (loaded transposed)."""
    if SWAP_AB:
        if V_T:
            return tl.dot(v.to(p.dtype), p, acc, input_precision=DOT_PRECISION)
        else:
            # Transposed before it is converted (a no-op for a 16-bit cache).
            return tl.dot(tl.trans(v).to(p.dtype), p, acc, input_precision=DOT_PRECISION)
    else:
        return tl.dot(p, v, acc, input_precision=DOT_PRECISION)


@triton.jit
def _load_tile(ptrs, mask, MASKED: tl.constexpr):
    if MASKED:
        return tl.load(ptrs, mask=mask, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _attend_block(
    acc0, acc1, m_i, l_i,
    q0, q1, q_pe,
    K_Buffer, K_Desc, Kpe_Desc, Req_to_Token, req_row, start_n, kv_end, row_lim,
    stride_kpage, stride_ktok, qk_scale, num_pages, tree_rows, draft_start,
    BLOCK_N: tl.constexpr, BLOCK_DMODEL: tl.constexpr, BLOCK_DPE: tl.constexpr,
    PAGE_SIZE: tl.constexpr, ONE_PAGE: tl.constexpr, QSPLIT: tl.constexpr, MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SWAP_AB: tl.constexpr, USE_TMA: tl.constexpr,
    HAS_TREE: tl.constexpr,
):
    """One KV block ``[start_n, start_n + BLOCK_N)`` for all rows of the tile (online softmax).

    Unmasked (MASKED 0) is only used for blocks entirely below every row's limit and the split
    end, so neither the loads nor the scores need a mask there.

    HAS_TREE: ``tree_rows`` ``[BLOCK_H]`` int64 holds each row's draft-tree mask, and a masked
    block also hides draft token ``j = key - draft_start`` (``j >= 0``) from the rows whose bit
    j is clear. (Unmasked blocks hold only prefix keys, which every row sees.)

    SWAP_AB: the transposed problem (see ``_score_dot``). q0 / q1 / q_pe are ``[D, BLOCK_H]``,
    acc0 / acc1 ``[D, BLOCK_H]``, the scores ``[BLOCK_N, BLOCK_H]``; the key axis, along which
    the softmax reduces, is axis 0 instead of 1. Everything else is shared.

    USE_TMA: the tile comes by bulk tensor copies through the host-built descriptors ``K_Desc``
    (``[num_pages, PAGE_SIZE, Lk]`` boxes ``[1, BLOCK_N, D0]``) and ``Kpe_Desc`` (boxes
    ``[1, BLOCK_N, BLOCK_DPE]``), addressed by (page, token in page, column): one table read
    per block (the launcher only sets it with ONE_PAGE). Only unmasked blocks use it: the
    tokens of a page past ``kv_end`` are inside the descriptor's bounds and may hold NaN, and
    zeroing them would take the tile through registers, so the tail blocks keep the masked
    pointer loads.

    Also returns the block's raw page indices as uint32 (clamped for the loads: see
    ``_page_in_cache``).
    """
    KEY_AX: tl.constexpr = 1 - SWAP_AB  # axis of the scores along which keys run
    offs_n = start_n + tl.arange(0, BLOCK_N)
    load_mask = offs_n < kv_end  # [BLOCK_N]
    HALF: tl.constexpr = BLOCK_DMODEL // 2
    D0: tl.constexpr = HALF if QSPLIT else BLOCK_DMODEL
    if QSPLIT:
        offs_d = tl.arange(0, HALF)
    else:
        offs_d = tl.arange(0, BLOCK_DMODEL)
    TMA_HERE: tl.constexpr = USE_TMA and not MASKED
    if TMA_HERE:
        page, raw = _page_in_cache(tl.load(Req_to_Token + req_row + start_n // PAGE_SIZE), num_pages)
        tok0 = start_n % PAGE_SIZE
        k0 = K_Desc.load([page, tok0, 0]).reshape(BLOCK_N, D0)
        kv_off = offs_n  # unused
        p_k0 = K_Buffer  # unused
    else:
        kv_off, raw = _kv_offsets(Req_to_Token, req_row, start_n, offs_n, load_mask, stride_kpage,
                                  stride_ktok, num_pages, PAGE_SIZE, ONE_PAGE, MASKED)  # [BLOCK_N] int64
        p_k0 = K_Buffer + kv_off[:, None] + offs_d[None, :]
        k0 = _load_tile(p_k0, load_mask[:, None], MASKED)  # [BLOCK_N, D0]
    if not SWAP_AB:
        # An fp8 cache is converted in registers, once for both dots. (SWAP_AB converts at
        # each dot instead, so that no converted [BLOCK_N, Lv] copy lives across the softmax.)
        k0 = k0.to(q0.dtype)
    qk = _score_dot(q0, k0, None, SWAP_AB, DOT_PRECISION)  # [BLOCK_H, BLOCK_N] fp32 (SWAP_AB: transposed)
    if QSPLIT:
        if TMA_HERE:
            k1 = K_Desc.load([page, tok0, HALF]).reshape(BLOCK_N, HALF)
        else:
            k1 = _load_tile(p_k0 + HALF, load_mask[:, None], MASKED)  # [BLOCK_N, HALF]
        if not SWAP_AB:
            k1 = k1.to(q0.dtype)
        qk = _score_dot(q1, k1, qk, SWAP_AB, DOT_PRECISION)
    if BLOCK_DPE > 0:
        if TMA_HERE:
            k_pe = Kpe_Desc.load([page, tok0, BLOCK_DMODEL]).reshape(BLOCK_N, BLOCK_DPE)
        else:
            offs_dpe = BLOCK_DMODEL + tl.arange(0, BLOCK_DPE)
            p_kpe = K_Buffer + kv_off[:, None] + offs_dpe[None, :]
            k_pe = _load_tile(p_kpe, load_mask[:, None], MASKED)  # [BLOCK_N, BLOCK_DPE]
        qk = _score_dot(q_pe, k_pe.to(q0.dtype), qk, SWAP_AB, DOT_PRECISION)
    qk = qk * qk_scale
    if MASKED:
        # Per-row causal / real-length limit; also masks the block's tokens past the split end
        # (row_lim is capped by kv_end for that purpose).
        visible = tl.expand_dims(offs_n, 1 - KEY_AX) < tl.expand_dims(row_lim, KEY_AX)  # [BLOCK_H, BLOCK_N]
        if HAS_TREE:
            visible = visible & _tree_visible(tree_rows, start_n - draft_start, BLOCK_N, KEY_AX)
        qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=KEY_AX))  # [BLOCK_H]
    # A row that has seen no key yet keeps m = -inf; subtracting 0 instead keeps
    # exp2(-inf - -inf) = NaN out of alpha and p.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_safe)  # [BLOCK_H]
    p = tl.math.exp2(qk - tl.expand_dims(m_safe, KEY_AX))  # [BLOCK_H, BLOCK_N]
    l_i = l_i * alpha + tl.sum(p, axis=KEY_AX)
    p = p.to(q0.dtype)
    # The accumulators' row axis is the scores' (axis 0, SWAP_AB: axis 1).
    alpha_acc = tl.expand_dims(alpha, KEY_AX)
    # V is the first Lv columns of the K tile already in registers/shared memory.
    v0 = k0
    if QSPLIT:
        v1 = k1
    else:
        v1 = k0  # unused
    V_T: tl.constexpr = SWAP_AB and (K_Buffer.dtype.element_ty != q0.dtype) and not TMA_HERE
    if V_T:
        # A converted (fp8) cache under SWAP_AB: V^T is read again, transposed, instead of
        # transposing K in registers. Triton feeds a converted wgmma operand from registers, and
        # made the register transpose of K next to its load, live across the softmax (sm_90
        # offline: 1.9 KB spilled at BLOCK_N 64; 1.2 KB with this, 0.4 KB with QSPLIT). The
        # second load gets its own pipelined shared buffer and is converted at the dot; it
        # reads the lines the first one is fetching, so it is served by L2.
        p_v0 = K_Buffer + kv_off[None, :] + offs_d[:, None]  # [D0, BLOCK_N]
        v0 = _load_tile(p_v0, load_mask[None, :], MASKED)
    acc0 = _value_dot(p, v0, acc0 * alpha_acc, SWAP_AB, V_T, DOT_PRECISION)  # [BLOCK_H, D0]
    if QSPLIT:
        if V_T:
            # Read after the first half's dot, so that only one converted half is live.
            v1 = _load_tile(p_v0 + HALF, load_mask[None, :], MASKED)  # [HALF, BLOCK_N]
        acc1 = _value_dot(p, v1, acc1 * alpha_acc, SWAP_AB, V_T, DOT_PRECISION)  # [BLOCK_H, HALF]
    return acc0, acc1, m_new, l_i, raw


@triton.jit
def _stage1_program(
    pid, Q, K_Buffer, K_Desc, Kpe_Desc, qk_scale, Req_to_Token, Seq_Lens, Real_Lens, Mid, O, Lse,
    stride_req_b, stride_qm, stride_qh, stride_kpage, stride_ktok, stride_mid_m, stride_mid_h,
    stride_mid_s, stride_om, stride_oh, stride_lm, stride_lh, K_Scale, batch, num_kv_splits,
    num_pages, kv_capacity, Qo_Indptr, Tree_Mask, num_rows,
    QLEN: tl.constexpr, NUM_HEADS: tl.constexpr, HAS_REAL: tl.constexpr, BLOCK_DMODEL: tl.constexpr,
    BLOCK_DPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    SPLIT_ALIGN: tl.constexpr, MIN_SPLIT_LEN: tl.constexpr, PAGE_SIZE: tl.constexpr,
    QSPLIT: tl.constexpr, SINGLE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    FP8_DOT_FP16: tl.constexpr, SWAP_AB: tl.constexpr, USE_TMA: tl.constexpr, cp_rank,
    CP_WORLD: tl.constexpr, CP_INTERLEAVE: tl.constexpr, VARLEN: tl.constexpr,
    HAS_TREE: tl.constexpr, BALANCE: tl.constexpr,
):
    """Stage 1 for one (row block, request, split) ``pid``: the arguments of
    ``_fwd_verify_stage1`` (documented there). A function of its own so that the non-persistent
    grid runs it without a loop around it: a loop that runs once cost M2 8% on the H200
    (``PERSISTENT 1`` with one program per work item)."""
    ROW_BLOCKS: tl.constexpr = (QLEN * NUM_HEADS + BLOCK_H - 1) // BLOCK_H
    # Row blocks vary fastest so the row blocks of one (request, split) run side by side and
    # share its KV tiles through L2.
    pid_rb = pid % ROW_BLOCKS
    if BALANCE:
        # The batch's pieces request by request (``_balanced_piece``). A program past them
        # takes the last request at slot num_kv_splits, past its pieces: no keys, no stores.
        req, pid_s, k_req = _balanced_piece(Seq_Lens, Real_Lens, pid // ROW_BLOCKS, batch, num_kv_splits,
                                            kv_capacity, cp_rank, CP_WORLD, CP_INTERLEAVE, BALANCE)
        pid_b = tl.where(req < 0, batch - 1, req)
        pid_s = tl.where(req < 0, num_kv_splits, pid_s)
    else:
        pid_bs = pid // ROW_BLOCKS
        pid_s = pid_bs % num_kv_splits
        pid_b = pid_bs // num_kv_splits

    seq_len = tl.load(Seq_Lens + pid_b)
    if HAS_REAL:
        real_len = tl.load(Real_Lens + pid_b)
    else:
        real_len = seq_len

    # The request's rows of q / o / lse: qlen_b of them from row_base.
    if VARLEN:
        row_base, qlen_b, rows_bad = _request_rows(Qo_Indptr, pid_b, num_rows, QLEN)
    else:
        qlen_b = QLEN  # (row_base = pid_b * QLEN, computed where it is used)
    offs_r = pid_rb * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H] rows of the request
    row_valid = offs_r < qlen_b * NUM_HEADS
    tok = offs_r // NUM_HEADS
    head = offs_r % NUM_HEADS
    if HAS_TREE:
        # Any row may see any key of the request: the tree decides, in the masked blocks from
        # the drafts' first key on; the prefix before it is every row's.
        tl.static_assert(CP_WORLD == 1)
        draft_start = seq_len - qlen_b
        row_lim = tl.minimum(seq_len, real_len) + tok * 0
    else:
        draft_start = seq_len  # unused
        row_lim = tl.minimum(seq_len - qlen_b + 1 + tok, real_len)
    row_lim = tl.where(row_valid, tl.maximum(row_lim, 0), 0)  # [BLOCK_H]
    # The keys the request's last row sees: the table entries the whole request reads.
    req_lim = tl.maximum(tl.minimum(seq_len, real_len), 0)
    marked = seq_len < 0
    if VARLEN:
        marked = marked | rows_bad
    if CP_WORLD > 1:
        # Global limits and length -> this rank's: a row's keys are a prefix of the local cache,
        # and the splits cut the local length. Everything below is in local positions.
        row_lim = _cp_local_len(row_lim, cp_rank, CP_WORLD, CP_INTERLEAVE)
        req_lim = _cp_local_len(req_lim, cp_rank, CP_WORLD, CP_INTERLEAVE)
        seq_len = _cp_local_len(seq_len, cp_rank, CP_WORLD, CP_INTERLEAVE)
    # A length past the block table (kv_capacity: 0 for an empty cache) is clamped to it and
    # marks the request; kv_end below never passes it, so no table read leaves the row.
    marked = marked | (seq_len > kv_capacity)
    seq_len = tl.minimum(seq_len, kv_capacity)
    min_lim = tl.min(tl.where(row_valid, row_lim, 2147483647), axis=0)
    max_lim = tl.max(row_lim, axis=0)
    if HAS_TREE:
        min_lim = tl.minimum(min_lim, tl.maximum(tl.minimum(draft_start, real_len), 0))
    if VARLEN:
        min_lim = tl.minimum(min_lim, max_lim)  # a row block past the request's rows has none

    # Split s of request b covers [s * chunk, min((s + 1) * chunk, L)); BALANCE: of its k_req
    # pieces, by its share of the batch's keys.
    if not BALANCE:
        k_req = num_kv_splits
    chunk = split_chunk(seq_len, k_req, SPLIT_ALIGN, MIN_SPLIT_LEN)
    split_start = pid_s * chunk
    split_end = tl.minimum(split_start + chunk, seq_len)
    kv_end = tl.minimum(split_end, max_lim)  # no row of the tile needs keys past this
    full_end = tl.minimum(split_end, min_lim)  # every row of the tile sees keys below this
    full_end = split_start + tl.maximum(full_end - split_start, 0) // BLOCK_N * BLOCK_N

    # The table entries of this split that the block loops below do not read but later rows
    # of the request do (pages of keys [kv_end, min(split_end, req_lim)) not holding a key
    # below kv_end: none for the request's last row block, and for the others none unless
    # kv_end falls on a page boundary, or pages are shorter than qlen), so that every row
    # block of the request marks it alike. Checked first, while nothing else is live: only a
    # flag is carried through the loops. QLEN == 1: every row has the request's limit, so the
    # loops read every entry the request reads and there is none to check; not compiled, so
    # that no loop and no branch on the loaded length sit ahead of the first KV load (fd03dc4
    # vs this check: H16 q1 B1 L8k +9% on the H200, one or two blocks per program; offline
    # sm_90a, the guard takes that launch's stage 1 from 3440 to 3384 SASS, fd03dc4 3361).
    req_row = pid_b.to(tl.int64) * stride_req_b
    if QLEN > 1:
        EXTRA: tl.constexpr = 16
        pg_lo = tl.where(kv_end > split_start, tl.cdiv(kv_end, PAGE_SIZE), split_start // PAGE_SIZE)
        pg_end = tl.cdiv(tl.minimum(split_end, req_lim), PAGE_SIZE)
        for j0 in range(pg_lo, pg_end, EXTRA):
            offs_j = j0 + tl.arange(0, EXTRA)
            pages = tl.load(Req_to_Token + req_row + offs_j, mask=offs_j < pg_end, other=0)
            marked = marked | (tl.max(pages.to(tl.uint32, bitcast=True), axis=0) >= num_pages.to(tl.uint32))

    # Queries of the tile, kept for the whole pass.
    if VARLEN:
        q_row = (row_base + tok).to(tl.int64)
    else:
        q_row = (pid_b * QLEN + tok).to(tl.int64)
    p_q = Q + q_row[:, None] * stride_qm + head[:, None] * stride_qh  # [BLOCK_H, 1]
    if HAS_TREE:
        tree_rows = tl.load(Tree_Mask + q_row, mask=row_valid, other=0)  # [BLOCK_H] int64
    else:
        tree_rows = row_lim  # unused
    HALF: tl.constexpr = BLOCK_DMODEL // 2
    if QSPLIT:
        offs_d = tl.arange(0, HALF)
        q0 = tl.load(p_q + offs_d[None, :], mask=row_valid[:, None], other=0.0)  # [BLOCK_H, HALF]
        q1 = tl.load(p_q + HALF + offs_d[None, :], mask=row_valid[:, None], other=0.0)
    else:
        offs_d = tl.arange(0, BLOCK_DMODEL)
        q0 = tl.load(p_q + offs_d[None, :], mask=row_valid[:, None], other=0.0)  # [BLOCK_H, Lv]
        q1 = q0  # unused
    if BLOCK_DPE > 0:
        offs_dpe = BLOCK_DMODEL + tl.arange(0, BLOCK_DPE)
        q_pe = tl.load(p_q + offs_dpe[None, :], mask=row_valid[:, None], other=0.0)  # [BLOCK_H, BLOCK_DPE]
    else:
        q_pe = q0  # unused
    if FP8_DOT_FP16:
        # fp8 cache, bf16 q: the dots run in fp16, not bf16. fp8 -> fp16 is one cvt per two
        # values, fp8 -> bf16 three (via fp16), and the conversion of every K tile is what
        # bounds an fp8 cache. Every e4m3 value is exact in fp16 and so is a bf16 q within
        # fp16's range (its 10-bit mantissa holds bf16's 8); |q| is clamped to fp16's finite
        # maximum so an out-of-range q saturates instead of turning the scores into inf/NaN.
        q0 = tl.clamp(q0.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
        q1 = tl.clamp(q1.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
        q_pe = tl.clamp(q_pe.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    D0: tl.constexpr = HALF if QSPLIT else BLOCK_DMODEL
    if SWAP_AB:
        # Transposed once, outside the KV loop: the B operand of the score dots, [D, BLOCK_H].
        q0 = tl.trans(q0)
        q1 = tl.trans(q1)
        q_pe = tl.trans(q_pe)
        acc0 = tl.zeros([D0, BLOCK_H], dtype=tl.float32)
    else:
        acc0 = tl.zeros([BLOCK_H, D0], dtype=tl.float32)
    acc1 = acc0  # used when QSPLIT only
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)

    k_scale = tl.load(K_Scale)
    qk_scale = qk_scale * k_scale  # scores of a dequantized cache: q . (k * k_scale)
    # A KV block never straddles a page when pages and split starts are multiples of it.
    ONE_PAGE: tl.constexpr = (PAGE_SIZE % BLOCK_N == 0) and (SPLIT_ALIGN % BLOCK_N == 0)
    # The largest page index read, as uint32 (a negative one is huge): a running max per block
    # (a scalar with ONE_PAGE, else per token of the block), reduced once after the loops.
    if ONE_PAGE:
        page_max = tl.zeros([], dtype=tl.uint32)
    else:
        page_max = tl.zeros([BLOCK_N], dtype=tl.uint32)

    # The split's blocks in two loops (a static loop around them: one kernel loop each), which
    # differ only in their range, the row limits and MASKED. MASKED 0: the blocks below every
    # row's limit, no masks. MASKED 1: the tail where rows' limits (or the split end) fall:
    # loads bounded by kv_end, scores by each row's limit, capped at kv_end for that.
    for MASKED in tl.static_range(2):
        if MASKED:
            lo, hi, lim = full_end, kv_end, tl.minimum(row_lim, kv_end)
        else:
            lo, hi, lim = split_start, full_end, row_lim
        for start_n in range(lo, hi, BLOCK_N):
            acc0, acc1, m_i, l_i, raw = _attend_block(
                acc0, acc1, m_i, l_i, q0, q1, q_pe, K_Buffer, K_Desc, Kpe_Desc, Req_to_Token, req_row, start_n,
                kv_end, lim, stride_kpage, stride_ktok, qk_scale, num_pages, tree_rows, draft_start,
                BLOCK_N, BLOCK_DMODEL, BLOCK_DPE, PAGE_SIZE, ONE_PAGE, QSPLIT, MASKED, DOT_PRECISION, SWAP_AB,
                USE_TMA, HAS_TREE,
            )
            page_max = tl.maximum(page_max, raw)
    if not ONE_PAGE:
        page_max = tl.max(page_max, axis=0)
    marked = marked | (page_max >= num_pages.to(tl.uint32))

    # Rows that saw no key (lim == 0, or nothing of theirs in this split): o = 0, lse = -inf.
    # A marked request: o = NaN and lse = NaN in every row.
    has_key = l_i > 0.0
    inv_l = tl.where(has_key, k_scale / tl.where(has_key, l_i, 1.0), 0.0)  # V dequantized too
    inv_l = tl.where(marked, float("nan"), inv_l)
    lse = tl.where(has_key, (m_i + tl.math.log2(tl.where(has_key, l_i, 1.0))) * _LN2, float("-inf"))
    lse = tl.where(marked, float("nan"), lse)
    if SWAP_AB:
        # Back to [BLOCK_H, D] rows for the shared store paths.
        acc0 = tl.trans(acc0)
        acc1 = tl.trans(acc1)
    out0 = acc0 * inv_l[:, None]
    if QSPLIT:
        out1 = acc1 * inv_l[:, None]
    if BALANCE:
        # One piece: straight to o / lse, slot 1's lse +inf (stage 2 leaves the request alone);
        # several: each piece to its slot, the last one setting the slots past them to -inf.
        # (A program past its request's pieces writes nothing.)
        # (Vector tests: triton 3.9's interpreter cannot mask with a loaded scalar's test.)
        k_rows = q_row * 0 + k_req
        s_rows = q_row * 0 + pid_s
        o_rows = row_valid & (k_rows == 1) & (s_rows == 0)
        mid_rows = row_valid & (k_rows > 1) & (s_rows < k_rows)
        p_o = O + q_row[:, None] * stride_om + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(p_o, out0.to(O.dtype.element_ty), mask=o_rows[:, None])
        if QSPLIT:
            tl.store(p_o + HALF, out1.to(O.dtype.element_ty), mask=o_rows[:, None])
        tl.store(Lse + q_row * stride_lm + head * stride_lh, lse, mask=o_rows)
        p_mid = Mid + q_row[:, None] * stride_mid_m + head[:, None] * stride_mid_h + pid_s * stride_mid_s
        tl.store(p_mid + offs_d[None, :], out0, mask=mid_rows[:, None])
        if QSPLIT:
            tl.store(p_mid + HALF + offs_d[None, :], out1, mask=mid_rows[:, None])
        p_row_lse = Mid + q_row * stride_mid_m + head * stride_mid_h + BLOCK_DMODEL
        tl.store(p_row_lse + pid_s * stride_mid_s, lse, mask=mid_rows)
        tl.store(p_row_lse + stride_mid_s, tl.full([BLOCK_H], float("inf"), tl.float32), mask=o_rows)
        last = (k_req > 1) & (pid_s == k_req - 1)
        for s in range(k_req, tl.where(last, num_kv_splits, k_req)):
            tl.store(p_row_lse + s * stride_mid_s, tl.full([BLOCK_H], float("-inf"), tl.float32), mask=row_valid)
    elif SINGLE:
        p_o = O + q_row[:, None] * stride_om + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(p_o, out0.to(O.dtype.element_ty), mask=row_valid[:, None])
        if QSPLIT:
            tl.store(p_o + HALF, out1.to(O.dtype.element_ty), mask=row_valid[:, None])
        tl.store(Lse + q_row * stride_lm + head * stride_lh, lse, mask=row_valid)
    else:
        p_mid = Mid + q_row[:, None] * stride_mid_m + head[:, None] * stride_mid_h + pid_s * stride_mid_s
        tl.store(p_mid + offs_d[None, :], out0, mask=row_valid[:, None])
        if QSPLIT:
            tl.store(p_mid + HALF + offs_d[None, :], out1, mask=row_valid[:, None])
        p_mid_lse = Mid + q_row * stride_mid_m + head * stride_mid_h + pid_s * stride_mid_s + BLOCK_DMODEL
        tl.store(p_mid_lse, lse, mask=row_valid)


@triton.jit(do_not_specialize=["stride_mid_m", "stride_mid_h", "stride_mid_s", "batch", "num_kv_splits",
                               "num_pages", "kv_capacity", "cp_rank", "num_rows"],
            do_not_specialize_on_alignment=["Qo_Indptr", "Tree_Mask"])
def _fwd_verify_stage1(
    Q,  # [B*qlen, H, Lk]
    K_Buffer,  # paged latent cache, element offsets computed from the page / token strides
    K_Desc,  # USE_TMA: descriptor of K_Buffer as [num_pages, PAGE_SIZE, Lk], boxes [1, BLOCK_N, D0]
    Kpe_Desc,  # USE_TMA: the same, boxes [1, BLOCK_N, BLOCK_DPE] (None otherwise)
    qk_scale,  # sm_scale * log2(e)
    Req_to_Token,  # [B, max_pages] int32
    Seq_Lens,  # [B] int32
    Real_Lens,  # [B] int32 (Seq_Lens when HAS_REAL is False)
    Mid,  # the split workspace [B*qlen, H, num_kv_splits, Lv + 1] fp32 (o when SINGLE)
    O,  # [B*qlen, H, Lv]
    Lse,  # [B*qlen, H] fp32
    stride_req_b, stride_qm, stride_qh, stride_kpage, stride_ktok,
    stride_mid_m, stride_mid_h, stride_mid_s, stride_om, stride_oh, stride_lm, stride_lh,
    K_Scale,  # [] fp32
    batch,
    num_kv_splits,
    num_pages,  # pages in the cache: page indices are clamped into [0, num_pages)
    kv_capacity,  # max_pages * PAGE_SIZE (0 for an empty cache): longer (local) lengths are clamped
    cp_rank,  # CP_WORLD > 1: this rank; None otherwise (a constexpr None: not a kernel argument)
    Qo_Indptr,  # VARLEN: [B+1] int32, request b's rows [Qo_Indptr[b], Qo_Indptr[b+1]) (else None)
    Tree_Mask,  # HAS_TREE: [rows] int64, bit j: the row sees draft token j (else None)
    num_rows,  # VARLEN: rows of q / o / lse (request rows are clamped into them; else None)
    QLEN: tl.constexpr,  # verify tokens per request (VARLEN: the most a request has)
    NUM_HEADS: tl.constexpr,
    HAS_REAL: tl.constexpr,
    BLOCK_DMODEL: tl.constexpr,
    BLOCK_DPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    SPLIT_ALIGN: tl.constexpr,
    MIN_SPLIT_LEN: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    QSPLIT: tl.constexpr,
    SINGLE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 q (no silent tf32), "tf32" (unused) otherwise
    FP8_DOT_FP16: tl.constexpr,  # fp8 cache with a bf16 q: dots in fp16 (see below)
    SWAP_AB: tl.constexpr,  # run the transposed problem (rows = the MMA's N); see _score_dot
    USE_TMA: tl.constexpr,  # K tiles by bulk tensor copies (see _attend_block)
    PERSISTENT: tl.constexpr,  # grid smaller than the work: each program loops over pids
    USE_PDL: tl.constexpr,  # stage 2 follows by programmatic dependent launch (see stage 2)
    CP_WORLD: tl.constexpr,  # context-parallel ranks (1: the single-GPU kernel; see the top)
    CP_INTERLEAVE: tl.constexpr,  # tokens per round-robin block of the sharded cache
    VARLEN: tl.constexpr = False,  # ragged draft counts through Qo_Indptr (see the top)
    HAS_TREE: tl.constexpr = False,  # draft trees through Tree_Mask (see the top)
    BALANCE: tl.constexpr = 0,  # balanced splits (``splits.py``): pieces by the request's share
):
    if USE_PDL:
        # Stage 2 may be launched now; it waits for this grid's completion before reading Mid.
        gdc_launch_dependents()
    if PERSISTENT:
        # Programs stride over the (row block, request, split) ids in launch order, so the
        # ones running at a time still share their requests' KV tiles through L2.
        ROW_BLOCKS: tl.constexpr = (QLEN * NUM_HEADS + BLOCK_H - 1) // BLOCK_H
        total = ROW_BLOCKS * batch * num_kv_splits
        for pid in range(tl.program_id(0), total, tl.num_programs(0)):
            _stage1_program(
                pid, Q, K_Buffer, K_Desc, Kpe_Desc, qk_scale, Req_to_Token, Seq_Lens, Real_Lens,
                Mid, O, Lse, stride_req_b, stride_qm, stride_qh, stride_kpage, stride_ktok,
                stride_mid_m, stride_mid_h, stride_mid_s, stride_om, stride_oh, stride_lm,
                stride_lh, K_Scale, batch, num_kv_splits, num_pages, kv_capacity, Qo_Indptr, Tree_Mask,
                num_rows, QLEN, NUM_HEADS, HAS_REAL, BLOCK_DMODEL,
                BLOCK_DPE, BLOCK_N, BLOCK_H, SPLIT_ALIGN, MIN_SPLIT_LEN, PAGE_SIZE, QSPLIT, SINGLE,
                DOT_PRECISION, FP8_DOT_FP16, SWAP_AB, USE_TMA, cp_rank, CP_WORLD, CP_INTERLEAVE,
                VARLEN, HAS_TREE, BALANCE,
            )
    else:
        _stage1_program(
            tl.program_id(0), Q, K_Buffer, K_Desc, Kpe_Desc, qk_scale, Req_to_Token, Seq_Lens,
            Real_Lens, Mid, O, Lse, stride_req_b, stride_qm, stride_qh, stride_kpage, stride_ktok,
            stride_mid_m, stride_mid_h, stride_mid_s, stride_om, stride_oh, stride_lm, stride_lh,
            K_Scale, batch, num_kv_splits, num_pages, kv_capacity, Qo_Indptr, Tree_Mask, num_rows,
            QLEN, NUM_HEADS, HAS_REAL, BLOCK_DMODEL, BLOCK_DPE,
            BLOCK_N, BLOCK_H, SPLIT_ALIGN, MIN_SPLIT_LEN, PAGE_SIZE, QSPLIT, SINGLE, DOT_PRECISION,
            FP8_DOT_FP16, SWAP_AB, USE_TMA, cp_rank, CP_WORLD, CP_INTERLEAVE, VARLEN, HAS_TREE, BALANCE,
        )


@triton.jit(do_not_specialize=["stride_mid_m", "stride_mid_h", "stride_mid_s", "num_kv_splits",
                               "kv_capacity", "cp_rank", "num_rows"],
            do_not_specialize_on_alignment=["Qo_Indptr"])
def _fwd_verify_stage2(
    Mid,  # the split workspace [B*qlen, H, num_kv_splits, Lv + 1] fp32
    O,  # [B*qlen, H, Lv]
    Lse,  # [B*qlen, H] fp32
    Seq_Lens,
    Real_Lens,
    stride_mid_m, stride_mid_h, stride_mid_s, stride_om, stride_oh, stride_lm, stride_lh,
    num_kv_splits,
    kv_capacity,  # as in stage 1
    cp_rank,  # as in stage 1
    Qo_Indptr,  # as in stage 1
    num_rows,  # as in stage 1
    QLEN: tl.constexpr,
    HAS_REAL: tl.constexpr,
    SPLIT_ALIGN: tl.constexpr,
    MIN_SPLIT_LEN: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    Lv: tl.constexpr,
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent of stage 1
    CP_WORLD: tl.constexpr,
    CP_INTERLEAVE: tl.constexpr,
    VARLEN: tl.constexpr = False,  # as in stage 1
    HAS_TREE: tl.constexpr = False,  # as in stage 1
    BALANCE: tl.constexpr = 0,  # stage 1 balanced its splits (``splits.py``): every slot is written
):
    pid_m = tl.program_id(0)  # token t of request b: b * QLEN + t (its q row, unless VARLEN)
    pid_h = tl.program_id(1)
    pid_d = tl.program_id(2)  # columns [pid_d * BLOCK_DV, (pid_d + 1) * BLOCK_DV) of o
    pid_b = pid_m // QLEN
    tok = pid_m % QLEN
    if VARLEN:
        row_base, qlen_b, rows_bad = _request_rows(Qo_Indptr, pid_b, num_rows, QLEN)
        row = row_base + tok
        row_ok = tok < qlen_b  # else a token the request does not have: nothing read or written
    else:
        row = pid_m
        qlen_b = QLEN
    seq_len = tl.load(Seq_Lens + pid_b)
    if HAS_REAL:
        real_len = tl.load(Real_Lens + pid_b)
    else:
        real_len = seq_len
    if HAS_TREE:  # the row's splits are all the request's (the tree picks its keys)
        lim = tl.maximum(tl.minimum(seq_len, real_len), 0)
    else:
        lim = tl.maximum(tl.minimum(seq_len - qlen_b + 1 + tok, real_len), 0)
    req_lim = tl.maximum(tl.minimum(seq_len, real_len), 0)  # the request's last row's limit
    len_bad = seq_len < 0
    if VARLEN:
        len_bad = len_bad | rows_bad
    if CP_WORLD > 1:  # local limits and length, as in stage 1
        lim = _cp_local_len(lim, cp_rank, CP_WORLD, CP_INTERLEAVE)
        req_lim = _cp_local_len(req_lim, cp_rank, CP_WORLD, CP_INTERLEAVE)
        seq_len = _cp_local_len(seq_len, cp_rank, CP_WORLD, CP_INTERLEAVE)
    # A length past the block table: clamped and marked, as in stage 1.
    len_bad = len_bad | (seq_len > kv_capacity)
    seq_len = tl.minimum(seq_len, kv_capacity)
    # Same chunking as stage 1; the row's splits are those starting below its limit, the
    # request's those starting below its last row's.
    p_mid = Mid + row.to(tl.int64) * stride_mid_m + pid_h * stride_mid_h
    if USE_PDL:
        # Launched before stage 1 has finished: the launch and everything above (the lengths'
        # loads, the chunking: inputs stage 1 does not write) under stage 1's tail; this waits
        # until stage 1 completed and its writes are visible, before the first read of Mid.
        gdc_wait()
    if BALANCE:
        # Stage 1 wrote every slot's lse this step: a piece's, or -inf for a slot the request
        # does not use, or +inf in slot 1 of a request of one piece, which stage 1 wrote
        # straight to o / lse (nothing to merge, nothing to write). A slot's o is read where
        # its lse is finite (a NaN lse makes the row NaN through its weight).
        if VARLEN:
            done = tl.load(p_mid + stride_mid_s + Lv, mask=row_ok, other=0.0) == float("inf")
        else:
            done = tl.load(p_mid + stride_mid_s + Lv) == float("inf")
        n_req = tl.where(done, 0, num_kv_splits)
        n_splits = n_req
    else:
        chunk = split_chunk(seq_len, num_kv_splits, SPLIT_ALIGN, MIN_SPLIT_LEN)
        n_splits = tl.minimum(tl.cdiv(lim, chunk), num_kv_splits)
        n_req = tl.minimum(tl.cdiv(req_lim, chunk), num_kv_splits)
    if VARLEN:
        n_req = tl.where(row_ok, n_req, 0)

    offs_d = pid_d * BLOCK_DV + tl.arange(0, BLOCK_DV)
    mask_d = offs_d < Lv
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for s0 in range(0, n_req, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        # The lse of every split of the request is merged: stage 1 writes each (row, split)
        # entry, -inf where the row has no key in the split (weight 0, o 0: not loaded), NaN
        # for a marked request. Only the row's own splits' o is loaded.
        lse_s = tl.load(p_mid + offs_s * stride_mid_s + Lv, mask=offs_s < n_req,
                        other=float("-inf"))  # [BLOCK_S]
        mask_s = offs_s < n_splits
        if BALANCE:
            mask_s = mask_s & (lse_s > float("-inf"))
        o_s = tl.load(p_mid + offs_s[:, None] * stride_mid_s + offs_d[None, :],
                      mask=mask_s[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_S, BLOCK_DV]
        m_new = tl.maximum(m_i, tl.max(lse_s, axis=0))
        # -inf while the row has no key yet (its later splits only): keeps NaN out of alpha.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        w = tl.exp(lse_s - m_safe)  # [BLOCK_S]; NaN for a NaN partial, whatever max did
        acc = acc * alpha + tl.sum(w[:, None] * o_s, axis=0)
        l_i = l_i * alpha + tl.sum(w, axis=0)
        m_i = m_new
    has_key = l_i > 0.0
    out = tl.where(has_key, acc / tl.where(has_key, l_i, 1.0), 0.0)
    lse = tl.where(has_key, m_i + tl.log(tl.where(has_key, l_i, 1.0)), float("-inf"))
    # A marked request: a NaN partial in any of the request's splits made l NaN (exp and sum
    # keep it, whether or not max dropped it), or a bad length. Explicitly NaN: the has_key
    # test above turns a NaN l into o = 0, lse = -inf.
    marked = len_bad | (l_i != l_i)
    out = tl.where(marked, float("nan"), out)
    lse = tl.where(marked, float("nan"), lse)
    if VARLEN:
        # (A vector mask: triton 3.9's interpreter cannot combine a loaded scalar's test with one.)
        mask_d = mask_d & (offs_d * 0 + tok < qlen_b)
    if BALANCE:
        mask_d = mask_d & ((offs_d * 0 + done.to(tl.int32)) == 0)
    tl.store(O + row.to(tl.int64) * stride_om + pid_h * stride_oh + offs_d,
             out.to(O.dtype.element_ty), mask=mask_d)
    if pid_d == 0:
        if BALANCE:
            write_lse = done == 0
            if VARLEN:
                write_lse = write_lse & row_ok
            if write_lse:
                tl.store(Lse + row.to(tl.int64) * stride_lm + pid_h * stride_lh, lse)
        elif VARLEN:
            if row_ok:
                tl.store(Lse + row.to(tl.int64) * stride_lm + pid_h * stride_lh, lse)
        else:
            tl.store(Lse + row.to(tl.int64) * stride_lm + pid_h * stride_lh, lse)
