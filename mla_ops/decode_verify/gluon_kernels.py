"""Gluon (``triton.experimental.gluon``, triton 3.6) stage 1 of the MLA decode-verify attention
for sm_90 (Hopper): ``@gluon.jit`` kernels only; the host side is ``gluon_launch.py``.

One CTA per (row block, request, KV split): the work items, the split chunking and the output
layout of the portable stage 1 (``kernels._fwd_verify_stage1``), so that the portable stage 2
merges these partials unchanged. A row block is 64 (verify token, head) rows of one request:
row ``r`` is token ``tok0 + r // HEAD_BOX`` and head ``head0 + r % HEAD_BOX``
(``HEAD_BOX = min(H, 64)``). Rows past the request's tokens are padding: computed on whatever
Q the TMA box brings (the next request's rows, or zeros past the tensor), never stored.

Three kernels, each with three partitions (``gl.warp_specialize``): a 1-warp **producer** that
TMA-loads the Q tile once (9 column tiles ``[64, 64]``) and the KV blocks ``[BLOCK_N, Lk]`` of
the split through a rank-3 host descriptor ``[num_pages, page_size, Lk]`` (one block-table read
per block; a strided cache, such as a layer's view of a cross-layer cache, is the descriptor's
page stride), each block as 9 column tiles ``[BLOCK_N, 64]`` into a 2-stage ring; and two
4-warp **consumer** warpgroups that split the 512 V columns, i.e. the output (group w owns
``O[:, 256w:256w+256]``).

- ``_verify_stage1_alt`` (the default; fp8 caches too): block j's scores ``S = Q K^T`` and its
  softmax are computed by group ``j % 2`` only, which publishes P (bf16) and the rescale
  factor through shared memory; both groups then add their half of ``P V``. See the comment
  above ``_producer_alt``. With an fp8 cache a 4-warp converter partition replaces the
  producer warp (the comment above ``_converter_pair``).
- ``_verify_stage1_seesaw`` (bf16 caches where the sm_90 table picks it; fp8 as a config):
  FlashMLA's order over block pairs: block b's softmax by group 0, b + 1's by group 1, only
  the running row max between the two softmaxes, each group's own P from registers and the
  other's (rescaled into the pair's last frame) from shared memory, ring parts refilled at
  their last reader. See the comment above ``_producer_seesaw``. With an fp8 cache converter
  warps fill the ring as for alt, by the seesaw's parts (``_converter_seesaw``).
- ``_verify_stage1_ws`` ("redundant"): each group computes the scores of every block itself
  (the same wgmmas: 53% of the FLOPs done twice), the online softmax in registers and its half
  of ``P V`` with P from registers; the groups never wait for each other.
- ``_verify_stage1_swapab`` ("swapab": bf16 requests of at most 32 rows where the sm_90 table
  picks it; fp8 as a config): the block's 64 keys are the wgmma's M and the request's 16 or
  32 rows its N (``S^T = K Q^T``, ``O^T += V^T P^T``), each group computing the scores itself
  as in the redundant kernel; the alt kernel's ring and producer warp. With an fp8 cache the
  converter warps stage blocks in the Q rows the request leaves unread (the comment above
  ``_staging_tile``). See the comment above ``_swapab_scores``. ALT_BLOCKS (the config's
  ``SWAPAB_BLOCKS``, the sm_90 table's fp8 form): the groups take alternate blocks instead, each
  with all of O^T, merged at the split's end (``_consumer_swapab_blocks``).

fp8 (e4m3) caches (``KV_FP8``). As in the portable kernel, an fp8 cache's dots run in fp16
(every e4m3 value is exact in fp16; fp8 -> fp16 is one cvt per two values, fp8 -> bf16 three):
Q is converted in shared memory once (clamped to fp16's finite range), P is fp16, ``k_scale``
is folded into the score scale and into the final ``1 / l``. The alt kernel's converter warps
TMA each fp8 block into the ring stage it will occupy as fp16 and dequantize it there, so the
consumer groups run the bf16 schedule unchanged on fp16 tiles. The redundant kernel's producer
loads the fp8 tile into an fp8 ring and the consumer groups dequantize it into one fp16 tile
(each its own V half and half of the rope columns' rows, meeting at an mbarrier); the fp8
stage goes back to the producer as soon as it is converted.

Ragged draft counts and draft trees (``VARLEN`` / ``HAS_TREE``, constexprs: without them the
kernels are unchanged): a request's rows start at ``Qo_Indptr[b]`` (``_work``), a row block
past its ``qlen_b`` rows does nothing, and the masked tail blocks test each row's tree mask
(``_tree_visible``); as in the portable kernel (``kernels.py``'s docstring).

NaN guard: the cache tokens of a page past a request's length may hold NaN. Scores of keys
past a row's limit are replaced by -inf (``where``, whatever the key holds), and in the last
block of a CTA the V rows past its last key are zeroed in shared memory before any P.V wgmma
reads them (0 * NaN would be NaN): bf16: each group zeroes its own V half; fp8: the
conversion writes zeros there.

Out-of-range metadata (checked mode off): the semantics of the portable kernel (its module
docstring). A page index outside the cache cannot fault here (the copy engine fills an
out-of-bounds box with zeros), but it must not pass silently: each consumer group checks the
table entries of its split's keys ``[split_start, min(split_end, req_lim))`` itself (one
vectorized load per 128 pages, before its first wait, so it overlaps the Q copy; a flag
handed over by the producer warp would need its own barrier) and a marked request gets NaN in
o and lse (the split's partials, which the portable stage 2 turns into NaN rows). A length past
the block table (``kv_capacity``) is clamped in ``_work``, so the producer never reads the
table past the request's row, and marks the request.

Output: each group stores o (or the split's partial) for its 256 columns. With STAGE_OUT (the
pair schedules; the sm_90 table's rules at H >= 64 and at H 16/32 with qlen >= 4) it first
writes its scaled accumulators into the ring, which is free once both groups are past their
block loops, then stores a row per warp store (``_store_staged``). Storing from the accumulator
layout (the redundant kernel, and rules with fewer rows) writes 8 rows x 32 bytes per store,
and every sector of a 4-byte-aligned partial row (``Lv + 1`` floats) in two halves.

Register budget: 232 per consumer thread, 24 for the producer (``setmaxnreg``; the first
consumer group is the default partition and keeps the parent's 248); 40 for the fp8
converter warps (the first group then keeps 232). Descriptors of shared
tiles that do not change across the block loop are indexed with an opaque zero so that the
compiler recomputes them per block instead of keeping ~25 of them live (that spilled).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..gluon_support import tma  # hopper's tma under one name on every triton of the range

from .kernels import _LN2, _cp_local_len, _request_rows  # shared with the portable kernel
from .splits import balanced_splits, split_chunk

# The partition-wide barrier: ``thread_barrier`` in triton 3.6, ``barrier`` from 3.7 on.
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

_BM = gl.constexpr(64)  # rows per CTA: one wgmma M
_DT = gl.constexpr(64)  # columns per shared tile: 128 B of 16-bit values, one swizzle row


@gluon.constexpr_function
def _wgmma_layout(n):
    """The accumulator layout of a 64-row wgmma of instruction N ``n`` on one warpgroup."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.jit
def _row_limit(tok, seq_len, real_len, qlen):
    """``max(min(L - qlen + 1 + t, L_real), 0)`` of verify token t (scalar or tensor)."""
    return gl.maximum(gl.minimum(seq_len - qlen + 1 + tok, real_len), 0)


@gluon.jit
def _local(n, cp_rank, CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr):
    """Global positions ``[0, n)`` -> how many of them this rank holds (context parallelism:
    ``kernels._cp_local_len``); ``n`` itself on a single GPU."""
    if CP_WORLD > 1:
        return _cp_local_len(n, cp_rank, CP_WORLD, CP_INTERLEAVE)
    else:
        return n


@gluon.jit
def _work(Seq_Lens, Real_Lens, num_kv_splits, qlen, num_heads, kv_capacity, TOK_BOX: gl.constexpr,
          HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr, MIN_SPLIT_LEN: gl.constexpr,
          BLOCK_N: gl.constexpr, cp_rank, CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr,
          Qo_Indptr, num_rows, VARLEN: gl.constexpr, HAS_TREE: gl.constexpr, BALANCE: gl.constexpr,
          SEGMENT: gl.constexpr = False, seg=None):
    """This CTA's work item, from its program id (SEGMENT: the balanced grid's segment ``seg``,
    ``_grid_segment``'s ``(request, slot, segments, first block, end block)``). Every partition computes it itself (scalar
    work on kernel arguments), rather than keeping the parent's values live across the
    warp-specialized region (that spilled the default partition's registers).

    ``qlen`` is the most rows a request has; the request's own (``qlen_b``, from
    ``_first_row(row_base, ...)``) are read from ``Qo_Indptr`` when VARLEN. A row block past them
    does no work. HAS_TREE: the limits are the request's (its prefix every row's, its keys the
    tree's to pick)."""
    rb_per_tok = num_heads // HEAD_BOX  # row blocks per token (H >= 64), else 1
    row_blocks = (qlen + TOK_BOX - 1) // TOK_BOX * rb_per_tok
    pid = gl.program_id(0)
    # Row blocks vary fastest: the row blocks of one (request, split) run side by side and
    # share its KV tiles through L2.
    pid_rb = pid % row_blocks
    if SEGMENT:
        pid_rb = 0  # (one row block a request: the swap-AB schedule's)
        pid_b = seg[0]
        pid_s = seg[1]
        k_req = seg[2]
    elif BALANCE:
        # The batch's pieces request by request (``_balanced_piece``); a CTA past them has
        # returned (``_holds_piece``).
        batch = gl.num_programs(0) // (row_blocks * num_kv_splits)
        req, pid_s, k_req = _balanced_piece(Seq_Lens, Real_Lens, pid // row_blocks, batch, num_kv_splits,
                                            kv_capacity, cp_rank, CP_WORLD, CP_INTERLEAVE, BALANCE)
        pid_b = gl.maximum(req, 0)
    else:
        pid_bs = pid // row_blocks
        pid_s = pid_bs % num_kv_splits
        pid_b = pid_bs // num_kv_splits
    tok0 = (pid_rb // rb_per_tok) * TOK_BOX  # first token of the row block, in the request
    head0 = (pid_rb % rb_per_tok) * HEAD_BOX
    seq_len = gl.load(Seq_Lens + pid_b)
    real_len = gl.load(Real_Lens + pid_b)  # Seq_Lens itself when there are no real lengths
    if VARLEN:
        row_base, qlen_b, rows_bad = _request_rows(Qo_Indptr, pid_b, num_rows, qlen)
    else:
        # The request's first row is pid_b * qlen: computed where it is used (``_first_row``),
        # so that the kernel without ragged rows is exactly what it was before them.
        row_base = pid_b
        qlen_b = qlen
    tok_last = gl.minimum(tok0 + TOK_BOX, qlen_b) - 1
    # Limits grow with the token. Under context parallelism they, and the length the splits
    # cut, are this rank's local ones (a row's keys are a prefix of the local cache); seq_len
    # stays global for the consumers' per-row limits (``_local(_row_limit(...))``).
    if HAS_TREE:
        gl.static_assert(CP_WORLD == 1)  # (refused by the argument spec)
        min_lim = gl.maximum(gl.minimum(seq_len - qlen_b, real_len), 0)
        max_lim = gl.maximum(gl.minimum(seq_len, real_len), 0)
    else:
        min_lim = _local(_row_limit(tok0, seq_len, real_len, qlen_b), cp_rank, CP_WORLD, CP_INTERLEAVE)
        max_lim = _local(_row_limit(tok_last, seq_len, real_len, qlen_b), cp_rank, CP_WORLD, CP_INTERLEAVE)
    if VARLEN:
        max_lim = gl.where(tok0 < qlen_b, max_lim, 0)  # no row of the request here: no work
    local_len = _local(seq_len, cp_rank, CP_WORLD, CP_INTERLEAVE)
    # A (local) length past the block table is clamped to it (no table read leaves the
    # request's row) and marks the request, as does a negative one.
    len_bad = (seq_len < 0) | (local_len > kv_capacity)
    if VARLEN:
        len_bad = len_bad | rows_bad
    local_len = gl.minimum(local_len, kv_capacity)
    # The keys of the request's last row: the table entries the whole request reads.
    req_lim = _local(_row_limit(qlen_b - 1, seq_len, real_len, qlen_b), cp_rank, CP_WORLD, CP_INTERLEAVE)
    # Split s covers [s * chunk, min((s + 1) * chunk, L)), as in the portable kernel. BALANCE:
    # the request is cut into k_req pieces by its share of the batch's keys.
    if SEGMENT:
        split_start = seg[3] * BLOCK_N
        split_end = gl.minimum(seg[4] * BLOCK_N, local_len)
    else:
        if not BALANCE:
            k_req = num_kv_splits
        chunk = split_chunk(local_len, k_req, SPLIT_ALIGN, MIN_SPLIT_LEN)
        split_start = pid_s * chunk
        split_end = gl.minimum(split_start + chunk, local_len)
    kv_end = gl.minimum(split_end, max_lim)  # no row of the tile needs keys past this
    full_end = gl.minimum(split_end, min_lim)  # every valid row sees every key below this
    n_blocks = gl.cdiv(gl.maximum(kv_end - split_start, 0), BLOCK_N)
    return (pid_b, pid_s, tok0, head0, seq_len, real_len, split_start, kv_end, full_end, max_lim, n_blocks,
            split_end, req_lim, len_bad, row_base, qlen_b, k_req)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _balance_keys(Seq_Lens, Real_Lens, offs, batch, kv_capacity, cp_rank, CP_WORLD: gl.constexpr,
                  CP_INTERLEAVE: gl.constexpr):
    """The keys requests ``offs`` bring to a balanced launch (``splits.balanced_splits``):
    ``min(local(max(min(L, L_real), 0)), kv_capacity)``, 0 past the batch."""
    m = offs < batch
    n = gl.maximum(gl.minimum(gl.load(Seq_Lens + offs, mask=m, other=0),
                              gl.load(Real_Lens + offs, mask=m, other=0)), 0)
    return gl.minimum(_local(n, cp_rank, CP_WORLD, CP_INTERLEAVE), kv_capacity)


@gluon.jit
def _balanced_piece(Seq_Lens, Real_Lens, piece, batch, num_kv_splits, kv_capacity, cp_rank,
                    CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, BALANCE: gl.constexpr):
    """``(request, slot, k)`` of a balanced launch's piece ``piece`` (``splits.py``; the
    portable kernel's ``_balanced_piece``): the batch's pieces numbered request by request, so
    that they take the grid's first CTAs and the CTAs past them return at once (request -1).
    Two passes over the lengths, 4 requests a lane (one 16-byte load each) and every warp of the
    calling partition holding all 128 of a step, so the sums stay in a warp: a batch of up to 128
    costs two load round trips. (int32 sums: a batch holds far fewer than 2^31 keys.)"""
    KEYS_L: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])
    W: gl.constexpr = 128
    total = batch * 0
    for b0 in range(0, batch, W):
        offs = b0 + gl.arange(0, W, layout=KEYS_L)
        total += gl.sum(_balance_keys(Seq_Lens, Real_Lens, offs, batch, kv_capacity, cp_rank, CP_WORLD,
                                      CP_INTERLEAVE), axis=0)
    req = batch * 0 - 1
    slot = batch * 0
    k_req = batch * 0 + 1
    base = batch * 0
    for b0 in range(0, batch, W):
        offs = b0 + gl.arange(0, W, layout=KEYS_L)
        n = _balance_keys(Seq_Lens, Real_Lens, offs, batch, kv_capacity, cp_rank, CP_WORLD, CP_INTERLEAVE)
        k = gl.where(offs < batch, balanced_splits(n, total, batch, num_kv_splits, BALANCE), 0)
        end = base + gl.associative_scan(k, 0, _add)  # past request r's last piece
        hit = (end - k <= piece) & (piece < end)
        req = gl.maximum(req, gl.max(gl.where(hit, offs, -1), axis=0))
        slot = gl.maximum(slot, gl.max(gl.where(hit, piece - (end - k), 0), axis=0))
        k_req = gl.maximum(k_req, gl.max(gl.where(hit, k, 0), axis=0))
        base += gl.sum(k, axis=0)
    return req, slot, k_req


@gluon.jit
def _holds_piece(Seq_Lens, Real_Lens, num_kv_splits, qlen, num_heads, kv_capacity, TOK_BOX: gl.constexpr,
                 HEAD_BOX: gl.constexpr, cp_rank, CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr,
                 BALANCE: gl.constexpr):
    """Whether this CTA of a balanced launch holds one of the batch's pieces (``_work``'s
    mapping, ``_balanced_piece``). The kernels return at once where not, before their barriers
    and partitions: such a CTA has nothing to write (each request's last piece fills its unused
    slots, ``_store_out``)."""
    rb_per_tok = num_heads // HEAD_BOX
    row_blocks = (qlen + TOK_BOX - 1) // TOK_BOX * rb_per_tok
    batch = gl.num_programs(0) // (row_blocks * num_kv_splits)
    req, _, _ = _balanced_piece(Seq_Lens, Real_Lens, gl.program_id(0) // row_blocks, batch, num_kv_splits,
                                kv_capacity, cp_rank, CP_WORLD, CP_INTERLEAVE, BALANCE)
    return req >= 0


@gluon.jit
def _grid_blocks(Seq_Lens, Real_Lens, offs, batch, kv_capacity, BLOCK_N: gl.constexpr):
    """The blocks requests ``offs`` bring to the balanced grid (``splits.py``): at least 1 each
    (a request without keys still has its rows to write), 0 past the batch."""
    n = _balance_keys(Seq_Lens, Real_Lens, offs, batch, kv_capacity, None, 1, 1)
    return gl.where(offs < batch, gl.maximum(gl.cdiv(n, BLOCK_N), 1), 0)


@gluon.jit
def _grid_cta_of(p, units, g):
    """The CTA of the balanced grid whose unit range ``[c U // g, (c + 1) U // g)`` holds unit
    ``p`` (scalars; int64 products)."""
    return (((p.to(gl.int64) + 1) * g - 1) // units).to(gl.int32)


@gluon.jit
def _grid_requests(Seq_Lens, Real_Lens, batch, num_kv_splits, kv_capacity, BLOCK_N: gl.constexpr,
                   REQUEST_COST: gl.constexpr):
    """This CTA's share of the balanced grid (``splits.py``; the host's ``grid_segments``):
    ``(r0, r1, u0, lo, hi, g, units)``, its requests ``[r0, r1)``, the units before request
    ``r0``, its unit range ``[lo, hi)``, the CTAs that hold work (``g``: at most the grid, fewer
    where one request would otherwise span more than ``num_kv_splits`` of them) and the batch's
    units. Two passes over the lengths, 128 requests a step and every warp of the calling
    partition holding all of them (as ``_balanced_piece``); a request meets this CTA where its
    blocks' units reach into ``[lo, hi)`` (for ``lo = c U // g``: unit ``p``'s CTA is below c
    exactly where ``p < lo``), so the passes compare int32 units; int64 only for the bounds."""
    KEYS_L: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])
    W: gl.constexpr = 128
    units = batch * 0
    span = batch * 0  # the most units past its first that one request's blocks take
    for b0 in range(0, batch, W):
        offs = b0 + gl.arange(0, W, layout=KEYS_L)
        nb = _grid_blocks(Seq_Lens, Real_Lens, offs, batch, kv_capacity, BLOCK_N)
        units += gl.sum(gl.where(offs < batch, nb + REQUEST_COST, 0), axis=0)
        span = gl.maximum(span, gl.max(nb - 1, axis=0))
    units = gl.maximum(units, 1)
    g = gl.num_programs(0)
    # A request's blocks [p, p + span] meet ceil(span g / U) + 1 CTAs at most: <= the slots.
    cap = (num_kv_splits - 1).to(gl.int64) * units // gl.maximum(span, 1)
    g = gl.where(span > 0, gl.minimum(g.to(gl.int64), gl.maximum(cap, 1)).to(gl.int32), g)
    c = gl.program_id(0).to(gl.int64)
    lo = (c * units // g).to(gl.int32)
    hi = ((c + 1) * units // g).to(gl.int32)
    r0 = batch * 0
    r1 = batch * 0
    u0 = batch * 0
    base = batch * 0
    for b0 in range(0, batch, W):
        offs = b0 + gl.arange(0, W, layout=KEYS_L)
        nb = _grid_blocks(Seq_Lens, Real_Lens, offs, batch, kv_capacity, BLOCK_N)
        u = gl.where(offs < batch, nb + REQUEST_COST, 0)
        first = base + gl.associative_scan(u, 0, _add) - u + REQUEST_COST  # the request's first block's unit
        before = (offs < batch) & (first + nb <= lo)  # its last block's CTA is below this one
        r0 += gl.sum(before.to(gl.int32), axis=0)
        u0 += gl.sum(gl.where(before, u, 0), axis=0)
        r1 += gl.sum(((offs < batch) & (first < hi)).to(gl.int32), axis=0)  # its first block's CTA <= this one
        base += gl.sum(u, axis=0)
    return r0, r1, u0, lo, hi, g, units


@gluon.jit
def _grid_segment(Seq_Lens, Real_Lens, r, u0, lo, hi, g, units, kv_capacity, BLOCK_N: gl.constexpr,
                  REQUEST_COST: gl.constexpr, valid=True):
    """Request ``r``'s segment in this CTA of the balanced grid, its units starting at ``u0``:
    ``(seg, u0 of the next request)``, ``seg = (r, slot, segments, b0, b1)`` for ``_work``:
    the request's blocks ``[b0, b1)`` (none where this CTA's range falls between two of its
    blocks' CTAs), in slot ``slot`` of its ``segments`` CTAs. Nothing is read where not
    ``valid`` (the producer's read ahead past its CTA's last request): ``seg`` then names
    request 0 and holds no blocks, so that the facts read from it stay inside the batch."""
    n = gl.load(Seq_Lens + r, mask=valid, other=0)
    n = gl.minimum(gl.maximum(gl.minimum(n, gl.load(Real_Lens + r, mask=valid, other=0)), 0), kv_capacity)
    nb = gl.cdiv(n, BLOCK_N)
    first = u0 + REQUEST_COST
    c_first = _grid_cta_of(first, units, g)
    c_last = _grid_cta_of(first + gl.maximum(nb, 1) - 1, units, g)
    b0 = gl.minimum(gl.maximum(lo - first, 0), nb)
    b1 = gl.minimum(gl.maximum(hi - first, 0), nb)
    # (past the CTA's requests: request 0's facts, which exist, with no blocks)
    seg = (gl.where(valid, r, 0), gl.program_id(0) - c_first, c_last - c_first + 1, b0, b1)
    return seg, u0 + gl.maximum(nb, 1) + REQUEST_COST


@gluon.jit
def _first_row(row_base, qlen, VARLEN: gl.constexpr):
    """The request's first row of q / o / lse from ``_work``'s ``row_base``: itself (VARLEN),
    or ``pid_b * qlen`` (``row_base`` is then ``pid_b``)."""
    if VARLEN:
        return row_base
    else:
        return row_base * qlen


_TL_SLOTS = gl.constexpr(16)  # int64 slots per CTA of the timeline probe (``_cta_mark``)
_TL_SEGMENTS = gl.constexpr(2)  # the balanced grid's segments it marks (``_cta_mark_segment``)


@gluon.jit
def _cta_mark(Timeline, slot: gl.constexpr, TIMELINE: gl.constexpr):
    """The CTA timeline probe (``TIMELINE``, off in every launch but ``benchmarks/kernel_times.py
    --timeline``'s): ``%globaltimer`` (ns) into ``Timeline[pid, slot]`` (``[grid, 16]`` int64):
    0 the CTA's start, 1 its end (also where a balanced launch's CTA returns at once); the
    swap-AB and seesaw schedules' first consumer group adds 3 its Q tile landed, 4 its block
    loop done, 5 its output stored. At the start the SM it runs on goes into ``Timeline[pid,
    2]``. Slots 6-15: the balanced grid's first two segments (``_cta_mark_segment``). The
    calling partition's threads store the same values. Without it the kernels are unchanged."""
    if TIMELINE:
        t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False,
                                      pack=1)
        row = Timeline + gl.program_id(0) * _TL_SLOTS
        gl.store(row + slot, t)
        if slot == 0:
            sm = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=True, pack=1)
            gl.store(row + 2, sm.to(gl.int64))


@gluon.jit
def _cta_mark_segment(Timeline, k, event: gl.constexpr, TIMELINE: gl.constexpr):
    """The timeline probe at the balanced grid's segment ``k`` (the CTA's k-th, runtime; only the
    first ``_TL_SEGMENTS`` are marked): ``Timeline[pid, 6 + 5 k + event]``, event 0 its Q
    requested and 1 its first block requested (the producer), 2 its Q landed and its facts
    read, 3 its block loop done, 4 its output stored (the first consumer group)."""
    if TIMELINE:
        t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False,
                                      pack=1)
        gl.store(Timeline + gl.program_id(0) * _TL_SLOTS + 6 + 5 * k + event, t, mask=k < _TL_SEGMENTS)


@gluon.jit
def _launch_dependents(LAUNCH_DEPENDENTS: gl.constexpr):
    """With LAUNCH_DEPENDENTS, ``griddepcontrol.launch_dependents`` at the CTA's start: stage 2,
    launched as this grid's programmatic dependent, may then be scheduled as soon as every CTA
    of this grid has started (or exited) instead of when the last one exits, so its launch and
    its programs' start overlap stage 1's tail; stage 2 waits (``griddepcontrol.wait``) for this
    grid's completion and memory before it reads a partial. One thread's issue counts for the
    CTA (later issues are no-ops), so the default partition issues it. Without it the kernel is
    unchanged (stage 2 then may launch only when stage 1 has exited)."""
    if LAUNCH_DEPENDENTS:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def _tree_visible(Tree_Mask, row0, tok0, qlen_b, draft_start, start, BLOCK_N: gl.constexpr,
                  HEAD_BOX: gl.constexpr, ROW: gl.constexpr, COL: gl.constexpr):
    """``[64, BLOCK_N]``: whether each row of the tile sees each key of the block
    ``[start, start + BLOCK_N)`` under its draft-tree mask: key ``draft_start + j`` needs bit j
    of the row's mask; keys before ``draft_start`` (the prefix) are every row's. The masks are
    read here, in the masked tail blocks only, rather than kept live across the block loop.

    Each row's mask is first aligned to the block (bit c: key ``start + c``, the prefix's bits
    set) with 64-bit shifts on the rows' two values per thread; the tile's test is then a
    32-bit shift of one of its halves per element (a 64-bit shift per element spilled ~100
    bytes of registers)."""
    gl.static_assert(BLOCK_N <= 64)
    rows = gl.arange(0, _BM, layout=ROW)
    tok = tok0 + rows // HEAD_BOX
    tree = gl.load(Tree_Mask + (row0 + tok).to(gl.int64), mask=tok < qlen_b, other=0)  # [64] int64
    d0 = start - draft_start  # draft index of the block's first key
    right = gl.minimum(gl.maximum(d0, 0), 63).to(gl.int64)
    left = gl.minimum(gl.maximum(-d0, 0), 63).to(gl.int64)
    window = gl.where(d0 >= 0, tree >> right, (tree << left) | ((left * 0 + 1 << left) - 1))
    window = gl.where(d0 <= -64, -1, window)  # the whole block before the drafts
    lo = window.to(gl.int32)  # bits 0-31 (truncation)
    hi = (window >> 32).to(gl.int32)
    cols = gl.arange(0, BLOCK_N, layout=COL)
    word = gl.where(cols[None, :] < 32, lo[:, None], hi[:, None])
    return ((word >> (cols & 31)[None, :]) & 1) != 0


@gluon.jit
def _request_marked(Req_to_Token, stride_req_b, pid_b, split_start, split_end, req_lim, len_bad, page_size,
                    num_pages, NW: gl.constexpr):
    """Whether this CTA's request is marked (o, lse := NaN): a bad length, or a table entry of
    the split's keys ``[split_start, min(split_end, req_lim))`` outside ``[0, num_pages)``
    (one unsigned compare: a negative index is huge as uint32). Every row block of the request reads the
    same entries, so all of them agree; ``NW`` warps of the calling partition."""
    # 128 entries per load, 4 contiguous per lane, every warp holding all of them: the reduction
    # stays inside a warp (no shared memory, no barrier between the partition's warps).
    PAGES_L: gl.constexpr = gl.BlockedLayout([4], [32], [NW], [0])
    W: gl.constexpr = 128
    req_row = pid_b.to(gl.int64) * stride_req_b
    pg_end = gl.cdiv(gl.minimum(split_end, req_lim), page_size)
    marked = len_bad
    for j0 in range(split_start // page_size, pg_end, W):
        offs = j0 + gl.arange(0, W, layout=PAGES_L)
        pages = gl.load(Req_to_Token + req_row + offs, mask=offs < pg_end, other=0)
        outside = pages.to(gl.uint32, bitcast=True) >= num_pages.to(gl.uint32)
        marked = marked | (gl.max(outside.to(gl.int32), axis=0) > 0)
    return marked


@gluon.jit
def _consumer_prologue(q_bar, Seq_Lens, Real_Lens, Req_to_Token, stride_req_b, num_kv_splits, qlen, num_heads,
                       page_size, num_pages, kv_capacity, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr,
                       SPLIT_ALIGN: gl.constexpr, MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, cp_rank,
                       CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows,
                       VARLEN: gl.constexpr, HAS_TREE: gl.constexpr, BALANCE: gl.constexpr, ROW: gl.constexpr, N_ROWS: gl.constexpr = 64,
                       SEGMENT: gl.constexpr = False, seg=None, q_phase=0):
    """What a consumer group of any schedule does before its block loop: its work item
    (``_work``), each row's key limit, the table check of its request, then the wait for the Q
    tile. Returns ``(pid_s, tok0, head0, seq_len, split_start, kv_end, full_end, n_blocks,
    row_base, qlen_b, lim, marked)``: ``lim`` ``[N_ROWS]`` (layout ROW: the block's first
    N_ROWS rows) capped at ``kv_end``, ``marked`` from ``_request_marked``. SEGMENT: the
    balanced grid's segment ``seg`` (``_work``), whose Q copy completes ``q_bar``'s phase
    ``q_phase`` (it is loaded for every segment, one without blocks too)."""
    (pid_b, pid_s, tok0, head0, seq_len, real_len, split_start, kv_end, full_end, max_lim, n_blocks,
     split_end, req_lim, len_bad, row_base, qlen_b, k_req) = _work(
        Seq_Lens, Real_Lens, num_kv_splits, qlen, num_heads, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN,
        MIN_SPLIT_LEN, BLOCK_N, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE,
        SEGMENT, seg)
    rows = gl.arange(0, N_ROWS, layout=ROW)
    tok = tok0 + rows // HEAD_BOX  # verify token of each row, in the request
    if HAS_TREE:  # every row's limit is the request's; the tree picks its keys below it
        lim = gl.minimum(tok * 0 + max_lim, kv_end)
    else:
        row_valid = tok < qlen_b
        # Padding rows see what the tile's last valid row sees: finite, never stored.
        lim = _local(_row_limit(tok, seq_len, real_len, qlen_b), cp_rank, CP_WORLD, CP_INTERLEAVE)
        lim = gl.where(row_valid, lim, max_lim)
        lim = gl.minimum(lim, kv_end)  # [64]: also ends at the split end
    # Issued before the first wait: its table reads overlap the Q copy.
    marked = _request_marked(Req_to_Token, stride_req_b, pid_b, split_start, split_end, req_lim, len_bad,
                             page_size, num_pages, 4)
    if SEGMENT:
        mbarrier.wait(q_bar, q_phase)
    else:
        mbarrier.wait(q_bar, 0, pred=n_blocks > 0)
    return pid_s, tok0, head0, seq_len, split_start, kv_end, full_end, n_blocks, row_base, qlen_b, lim, marked, k_req


@gluon.jit
def _producer(q_desc, k_desc, q_smem, kv_smem, q_bar, kv_ready, kv_empty,
              Req_to_Token, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size,
              kv_capacity, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
              MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, N_DT: gl.constexpr,
              cp_rank, CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows,
              VARLEN: gl.constexpr, HAS_TREE: gl.constexpr, BALANCE: gl.constexpr):
    """1 warp: the Q tile once, then the KV blocks of the split through the ring."""
    (pid_b, pid_s, tok0, head0, seq_len, real_len, split_start, kv_end, full_end, max_lim, n_blocks,
     split_end, req_lim, len_bad, row_base, qlen_b, k_req) = _work(
        Seq_Lens, Real_Lens, num_kv_splits, qlen, num_heads, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN,
        MIN_SPLIT_LEN, BLOCK_N, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE)
    # Nothing is loaded for an empty work item, so no copy can outlive the CTA.
    if n_blocks > 0:
        mbarrier.expect(q_bar, N_DT * q_desc.block_type.nbytes)
        for c in gl.static_range(N_DT):
            tma.async_load(q_desc, [_first_row(row_base, qlen, VARLEN) + tok0, head0, c * _DT], q_bar,
                                            q_smem.index(c))
    req_row = pid_b.to(gl.int64) * stride_req_b
    # The block-table entry of block i + 1 is read while block i waits for its stage.
    page = gl.load(Req_to_Token + req_row + split_start // page_size, mask=n_blocks > 0, other=0)
    for i in range(n_blocks):
        s = i % NUM_STAGES
        start = split_start + i * BLOCK_N
        page_next = gl.load(Req_to_Token + req_row + (start + BLOCK_N) // page_size,
                            mask=i + 1 < n_blocks, other=0)
        mbarrier.wait(kv_empty.index(s), ((i // NUM_STAGES) & 1) ^ 1)
        bar = kv_ready.index(s)
        mbarrier.expect(bar, N_DT * k_desc.block_type.nbytes)
        tok = start % page_size
        for c in gl.static_range(N_DT):
            tma.async_load(k_desc, [page, tok, c * _DT], bar, kv_smem.index(s * N_DT + c))
        page = page_next


@gluon.jit
def _convert_tile(src, dst, n_valid, row0: gl.constexpr, ROWS: gl.constexpr, LAYOUT: gl.constexpr):
    """``dst[row0:row0+ROWS] = src[row0:row0+ROWS]`` as fp16, rows ``>= n_valid`` zeroed."""
    x = src.slice(row0, ROWS).load(LAYOUT)
    kk = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, LAYOUT))
    y = gl.where((kk < n_valid)[:, None], x.to(gl.float16), 0.0)
    dst.slice(row0, ROWS).store(y)


@gluon.jit
def _mask_tail(sc, start, full_end, lim, Tree_Mask, row_base, qlen, tok0, qlen_b, seq_len, BLOCK_N: gl.constexpr,
               HEAD_BOX: gl.constexpr, VARLEN: gl.constexpr, HAS_TREE: gl.constexpr, BALANCE: gl.constexpr, ROW: gl.constexpr,
               COL: gl.constexpr):
    """Scores ``sc`` of the block ``[start, start + BLOCK_N)``, -inf where a row does not see
    the key (past its limit or the split end, outside its draft tree), whatever the cache holds
    there; only a block past ``full_end`` has such keys."""
    if start + BLOCK_N > full_end:
        keys = start + gl.arange(0, BLOCK_N, layout=COL)
        visible = keys[None, :] < lim[:, None]
        if HAS_TREE:
            visible = visible & _tree_visible(Tree_Mask, _first_row(row_base, qlen, VARLEN), tok0, qlen_b,
                                              seq_len - qlen_b, start, BLOCK_N, HEAD_BOX, ROW, COL)
        sc = gl.where(visible, sc, float("-inf"))
    return sc


@gluon.jit
def _online_softmax(sc, m_prev, l_i):
    """One block of the online softmax (base 2): the new row max, the rescale of what came
    before, P and the row sums. A row that has seen no key keeps m = -inf; subtracting 0 then
    keeps exp2(-inf + inf) out."""
    m_new = gl.maximum(m_prev, gl.max(sc, axis=1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_prev - m_safe)
    p = gl.exp2(sc - m_safe[:, None])
    return m_new, alpha, p, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _consumer(WG: gl.constexpr, shared, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
              MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
              N_DT: gl.constexpr, LV: gl.constexpr, SINGLE: gl.constexpr, KV_FP8: gl.constexpr,
              cp_rank, CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, Tree_Mask, num_rows,
              VARLEN: gl.constexpr, HAS_TREE: gl.constexpr, BALANCE: gl.constexpr):
    """One consumer warpgroup: output columns ``[WG * LV/2, (WG + 1) * LV/2)``. ``shared``: the
    runtime arguments both groups take (``_verify_stage1_ws`` builds it)."""
    (q_smem, kv_smem, kvc_smem, q_bar, kv_ready, kv_empty, conv_done, conv_free, Seq_Lens, Real_Lens, O, Lse, Mid,
     K_Scale, qk_scale, num_kv_splits, qlen, num_heads, Req_to_Token, stride_req_b, page_size, num_pages,
     kv_capacity, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h, stride_mid_s) = shared
    MMA: gl.constexpr = _wgmma_layout(BLOCK_N)  # the scores
    MMA_O: gl.constexpr = _wgmma_layout(_DT)  # this group's O, four [64, 64] accumulators
    P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_O, k_width=2)
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)
    ROW_O: gl.constexpr = gl.SliceLayout(1, MMA_O)
    COL: gl.constexpr = gl.SliceLayout(0, MMA)
    TILE_L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])  # a [rows, 64] tile
    V_TILES: gl.constexpr = LV // _DT // 2  # V column tiles of this group
    V0: gl.constexpr = WG * V_TILES
    if KV_FP8:
        CDT: gl.constexpr = gl.float16  # the dots' dtype
    else:
        CDT: gl.constexpr = gl.bfloat16

    (pid_s, tok0, head0, seq_len, split_start, kv_end, full_end, n_blocks, row_base, qlen_b, lim,
     marked, k_req) = _consumer_prologue(q_bar, Seq_Lens, Real_Lens, Req_to_Token, stride_req_b, num_kv_splits, qlen,
                                  num_heads, page_size, num_pages, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN,
                                  MIN_SPLIT_LEN, BLOCK_N, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows,
                                  VARLEN, HAS_TREE, BALANCE, ROW)

    if KV_FP8:
        # Q to fp16 in place (clamped to fp16's range: an out-of-range q saturates instead of
        # turning the scores into inf / NaN); each group converts its share of the tiles,
        # which the other group reads after the first conv_done.
        QT_L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        if n_blocks > 0:
            for c in gl.static_range(WG, N_DT, 2):
                qt = q_smem.index(c).reshape([_BM, _DT])
                x = gl.minimum(gl.maximum(qt.load(QT_L).to(gl.float32), -65504.0), 65504.0)
                qt.reinterpret(gl.float16, [_BM, _DT], qt.layout).store(x.to(gl.float16))
    acc0 = gl.zeros([_BM, _DT], gl.float32, MMA_O)
    acc1 = gl.zeros([_BM, _DT], gl.float32, MMA_O)
    acc2 = gl.zeros([_BM, _DT], gl.float32, MMA_O)
    acc3 = gl.zeros([_BM, _DT], gl.float32, MMA_O)
    m_i = gl.full([_BM], float("-inf"), gl.float32, ROW)
    l_i = gl.zeros([_BM], gl.float32, ROW)
    k_scale = gl.load(K_Scale)
    scale = qk_scale * k_scale  # scores of a dequantized cache: q . (k * k_scale)

    for i in range(n_blocks):
        s = i % NUM_STAGES
        start = split_start + i * BLOCK_N
        mbarrier.wait(kv_ready.index(s), (i // NUM_STAGES) & 1)
        if KV_FP8:
            # Dequantize (to fp16) this group's V half and half of the rope tile's rows into
            # the shared fp16 tile, once both groups are done with the previous block.
            mbarrier.wait(conv_free, (i & 1) ^ 1)
            n_valid = kv_end - start  # keys past it are zeroed (NaN guard)
            for c in gl.static_range(V_TILES):
                _convert_tile(kv_smem.index(s * N_DT + V0 + c).reshape([BLOCK_N, _DT]),
                              kvc_smem.index(V0 + c), n_valid, 0, BLOCK_N, TILE_L)
            _convert_tile(kv_smem.index(s * N_DT + N_DT - 1).reshape([BLOCK_N, _DT]),
                          kvc_smem.index(N_DT - 1), n_valid, WG * (BLOCK_N // 2), BLOCK_N // 2, TILE_L)
            fence_async_shared()
            mbarrier.arrive(kv_empty.index(s), count=1)  # the fp8 stage is free again
            mbarrier.arrive(conv_done, count=1)
            mbarrier.wait(conv_done, i & 1)
            # Always tile 0 of the fp16 block; written as a product with an opaque zero (seq_len
            # is never negative) so that the compiler recomputes the 9 K descriptors per block
            # instead of keeping them live across the loop (that spilled registers).
            k_base = i * (seq_len < 0).to(gl.int32)
            k_tiles = kvc_smem
        else:
            k_base = s * N_DT
            k_tiles = kv_smem
            if start + BLOCK_N > kv_end:
                # The tail block: zero this group's V rows past the last key. Done before the
                # score wgmmas, which mask those keys anyway (the other group may be reading
                # them for its scores now, and masks them too).
                kk = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, TILE_L))
                keep = (kk < kv_end - start)[:, None]
                for c in gl.static_range(V_TILES):
                    t = kv_smem.index(k_base + V0 + c).reshape([BLOCK_N, _DT])
                    x = t.load(TILE_L)
                    t.store(gl.where(keep, x, gl.zeros_like(x)))
                fence_async_shared()
        # S = Q K^T over all Lk columns: 9 async wgmmas on one accumulator.
        qk = warpgroup_mma(_q_tile(q_smem, 0, CDT),
                           _k_tile(k_tiles, k_base, BLOCK_N, KV_FP8).permute((1, 0)),
                           gl.zeros([_BM, BLOCK_N], gl.float32, MMA), use_acc=False, is_async=True)
        for c in gl.static_range(1, N_DT):
            qk = warpgroup_mma(_q_tile(q_smem, c, CDT),
                               _k_tile(k_tiles, k_base + c, BLOCK_N, KV_FP8).permute((1, 0)),
                               qk, is_async=True)
        qk = warpgroup_mma_wait(0, deps=(qk, ))
        qk = _mask_tail(qk * scale, start, full_end, lim, Tree_Mask, row_base, qlen, tok0, qlen_b, seq_len, BLOCK_N,
                        HEAD_BOX, VARLEN, HAS_TREE, BALANCE, ROW, COL)
        m_i, alpha, p, l_i = _online_softmax(qk, m_i, l_i)
        alpha_o = gl.convert_layout(alpha, ROW_O)[:, None]
        acc0 = acc0 * alpha_o
        acc1 = acc1 * alpha_o
        acc2 = acc2 * alpha_o
        acc3 = acc3 * alpha_o
        p_op = gl.convert_layout(p.to(CDT), P_OP)
        acc0 = warpgroup_mma(p_op, _k_tile(k_tiles, k_base + V0 + 0, BLOCK_N, KV_FP8), acc0, is_async=True)
        acc1 = warpgroup_mma(p_op, _k_tile(k_tiles, k_base + V0 + 1, BLOCK_N, KV_FP8), acc1, is_async=True)
        acc2 = warpgroup_mma(p_op, _k_tile(k_tiles, k_base + V0 + 2, BLOCK_N, KV_FP8), acc2, is_async=True)
        acc3 = warpgroup_mma(p_op, _k_tile(k_tiles, k_base + V0 + 3, BLOCK_N, KV_FP8), acc3, is_async=True)
        acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(acc0, acc1, acc2, acc3))
        if KV_FP8:
            mbarrier.arrive(conv_free, count=1)
        else:
            mbarrier.arrive(kv_empty.index(s), count=1)

    # k_scale dequantizes V too.
    _store_out(WG, acc0, acc1, acc2, acc3, gl.convert_layout(l_i, ROW_O), gl.convert_layout(m_i, ROW_O),
               k_scale, marked, O, Lse, Mid, row_base, pid_s, tok0, head0, qlen, qlen_b, stride_om, stride_oh,
               stride_lm, stride_lh, stride_mid_m, stride_mid_h, stride_mid_s, HEAD_BOX, LV, SINGLE, VARLEN, MMA_O,
               k_req=k_req, BALANCE=BALANCE, n_slots=num_kv_splits)


@gluon.jit
def _q_tile(q_smem, c, CDT: gl.constexpr):
    """Column tile ``c`` of the Q tile as a ``[64, 64]`` shared view of dtype CDT (fp16: Q was
    converted in place)."""
    qt = q_smem.index(c).reshape([_BM, _DT])
    if CDT != q_smem.dtype:
        qt = qt.reinterpret(CDT, [_BM, _DT], qt.layout)
    return qt


@gluon.jit
def _k_tile(tiles, idx, BLOCK_N: gl.constexpr, KV_FP8: gl.constexpr):
    """Column tile ``idx`` of the KV block as a ``[BLOCK_N, 64]`` shared view."""
    if KV_FP8:
        return tiles.index(idx)  # the fp16 tile: [BLOCK_N, 64] already
    else:
        return tiles.index(idx).reshape([BLOCK_N, _DT])  # a TMA destination [1, BLOCK_N, 64]


@gluon.jit(do_not_specialize=["stride_req_b", "stride_mid_m", "stride_mid_h", "stride_mid_s", "stride_om",
                              "stride_oh", "stride_lm", "stride_lh", "num_kv_splits", "qlen", "num_heads",
                              "page_size", "num_pages", "kv_capacity", "cp_rank", "num_rows"],
           do_not_specialize_on_alignment=["Qo_Indptr", "Tree_Mask"])
def _verify_stage1_ws(
    q_desc,  # [B*qlen, H, Lk] bf16, boxes [TOK_BOX, HEAD_BOX, 64]
    k_desc,  # [num_pages, PAGE_SIZE, Lk] cache (bf16 or fp8 e4m3), boxes [1, BLOCK_N, 64]
    qk_scale,  # sm_scale * log2(e)
    Req_to_Token,  # [B, max_pages] int32
    Seq_Lens,  # [B] int32
    Real_Lens,  # [B] int32 (Seq_Lens when there are no real lengths)
    Mid,  # the split workspace [B*qlen, H, num_kv_splits, Lv + 1] fp32 (unused when SINGLE)
    O,  # [B*qlen, H, Lv] (written when SINGLE)
    Lse,  # [B*qlen, H] fp32 (written when SINGLE)
    K_Scale,  # [] fp32
    stride_req_b, stride_mid_m, stride_mid_h, stride_mid_s, stride_om, stride_oh, stride_lm, stride_lh,
    num_kv_splits, qlen, num_heads, page_size,
    num_pages,  # pages in the cache (a table entry outside [0, num_pages) marks its request)
    kv_capacity,  # max_pages * page_size (0 for an empty cache): longer (local) lengths are clamped
    cp_rank,  # CP_WORLD > 1: this rank (context parallelism); None otherwise (a constexpr None)
    LV: gl.constexpr, LK: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    SPLIT_ALIGN: gl.constexpr, MIN_SPLIT_LEN: gl.constexpr, SINGLE: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    CP_WORLD: gl.constexpr = 1,  # ranks the cache is sharded over (kernels.py's top comment)
    CP_INTERLEAVE: gl.constexpr = 1,  # tokens per round-robin block of the sharded cache
    Qo_Indptr=None,  # VARLEN: [B+1] int32 row offsets of the requests (ragged draft counts)
    Tree_Mask=None,  # HAS_TREE: [rows] int64 draft-tree masks (bit j: sees draft token j)
    num_rows=None,  # VARLEN: rows of q / o / lse
    VARLEN: gl.constexpr = False,  # qlen is then the most rows a request has
    HAS_TREE: gl.constexpr = False, BALANCE: gl.constexpr = 0,
    LAUNCH_DEPENDENTS: gl.constexpr = False,  # stage 2 follows by PDL (``_launch_dependents``)
    Timeline=None, TIMELINE: gl.constexpr = False,  # the CTA timeline probe (``_cta_mark``)
):
    """Stage 1, one CTA per (row block, request, split); see the module docstring. Launched
    with ``num_warps=4`` (the first consumer group; the other group and the producer warp are
    warp-specialized workers)."""
    _launch_dependents(LAUNCH_DEPENDENTS)
    _cta_mark(Timeline, 0, TIMELINE)
    N_DT: gl.constexpr = LK // _DT
    TOK_BOX: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_BOX: gl.constexpr = q_desc.block_type.shape[1]
    if BALANCE:
        if not _holds_piece(Seq_Lens, Real_Lens, num_kv_splits, qlen, num_heads, kv_capacity, TOK_BOX, HEAD_BOX,
                            cp_rank, CP_WORLD, CP_INTERLEAVE, BALANCE):
            _cta_mark(Timeline, 1, TIMELINE)
            return
    gl.static_assert(TOK_BOX * HEAD_BOX == _BM)
    gl.static_assert(LV == 8 * _DT)
    KV_FP8: gl.constexpr = k_desc.dtype.is_fp8()

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [N_DT, TOK_BOX, HEAD_BOX, _DT], q_desc.layout)
    kv_smem = gl.allocate_shared_memory(k_desc.dtype, [NUM_STAGES * N_DT, 1, BLOCK_N, _DT], k_desc.layout)
    if KV_FP8:
        # The dequantized block, read by the wgmmas.
        kvc_smem = gl.allocate_shared_memory(gl.float16, [N_DT, BLOCK_N, _DT],
                                             gl.NVMMASharedLayout.get_default_for([BLOCK_N, _DT], gl.float16))
    else:
        kvc_smem = kv_smem  # unused
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    conv_done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    conv_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(conv_done, count=2)
    mbarrier.init(conv_free, count=2)
    for st in gl.static_range(NUM_STAGES):
        mbarrier.init(kv_ready.index(st), count=1)
        mbarrier.init(kv_empty.index(st), count=2)  # both consumer groups release a stage

    # The consumer groups' arguments: the runtime values both take, in one tuple (a tuple held in
    # a variable may carry only those: triton 3.6 turns its constexprs into tensors, and the
    # None of an absent cp_rank / Qo_Indptr / Tree_Mask / num_rows is one), then the rest.
    shared = (q_smem, kv_smem, kvc_smem, q_bar, kv_ready, kv_empty, conv_done, conv_free, Seq_Lens, Real_Lens, O,
              Lse, Mid, K_Scale, qk_scale, num_kv_splits, qlen, num_heads, Req_to_Token, stride_req_b, page_size,
              num_pages, kv_capacity, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h,
              stride_mid_s)
    gl.warp_specialize([
        (_consumer, (0, shared, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, NUM_STAGES, N_DT, LV,
                     SINGLE, KV_FP8, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, Tree_Mask, num_rows, VARLEN,
                     HAS_TREE, BALANCE)),
        (_consumer, (1, shared, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, NUM_STAGES, N_DT, LV,
                     SINGLE, KV_FP8, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, Tree_Mask, num_rows, VARLEN,
                     HAS_TREE, BALANCE)),
        (_producer, (q_desc, k_desc, q_smem, kv_smem, q_bar, kv_ready, kv_empty,
                     Req_to_Token, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads,
                     page_size, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, NUM_STAGES,
                     N_DT, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    mbarrier.invalidate(q_bar)
    mbarrier.invalidate(conv_done)
    mbarrier.invalidate(conv_free)
    for st in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(kv_ready.index(st))
        mbarrier.invalidate(kv_empty.index(st))
    _cta_mark(Timeline, 1, TIMELINE)


# ---------------------------------------------------------------------------------------------
# The alternating schedule (bf16 caches): no redundant score wgmma.
#
# Block j is *owned* by consumer group j % 2 (it lives in stage j % 2 of a 2-stage ring, so a
# group's own blocks are always in its own stage). The owner computes S_j = Q K_j^T alone and
# the softmax of block j against the running row max of blocks < j (kept in shared memory,
# ``sm_smem``), and publishes P_j (bf16, ``sp_smem[j % 2]``) and the rescale factor
# alpha_j = exp2(m_{j-1} - m_j) (``sa_smem[j % 2]``) through ``p_ready[j % 2]``. Both groups
# then rescale their half of O by alpha_j and add P_j V_j[:, half] (wgmma, P from shared
# memory). The softmaxes run in block order, one group after the other; a group's score wgmmas
# for its next block and the other group's P.V wgmma run meanwhile. Each group keeps the row
# sums of its own blocks (rescaled by every alpha); the two are added at the end.
#
# The ring is tracked per half block: half 0 = column tiles 0-3 (group 0's V half), half 1 =
# tiles 4-8 (group 1's V half and the rope). A half goes back to the producer when its group's
# P.V wgmma on it is done (the owner's score wgmma, which also reads it, is done before P is
# published). The rope tile of Q lives in registers (``q_rope``), so that Q (64 KB) + 2 KV
# stages (144 KB) + 2 P tiles (16 KB) fit in 227 KB; it is TMA'd into ``sp_smem[1]`` first,
# which group 1 only writes after group 0 has read it (after ``p_ready[0]``).
# ---------------------------------------------------------------------------------------------


@gluon.jit
def _pair_smem(q_desc, k_desc, LK: gl.constexpr, LV: gl.constexpr, BLOCK_N: gl.constexpr,
               NUM_STAGES: gl.constexpr):
    """The large shared tiles of the two schedules over a pair of groups (alt, seesaw; bf16
    caches, 2 stages): Q's tiles but the rope one, the KV ring, and two P tiles (the rope
    tile of Q lands in the second first: ``_pair_load_q``)."""
    N_DT: gl.constexpr = LK // _DT
    TOK_BOX: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_BOX: gl.constexpr = q_desc.block_type.shape[1]
    gl.static_assert(TOK_BOX * HEAD_BOX == _BM)
    gl.static_assert(LV == 8 * _DT)
    gl.static_assert(NUM_STAGES == 2)
    if k_desc.dtype.is_fp8():
        # The dots run in fp16 (the module docstring): Q, the ring and P hold fp16, written by
        # the converter warps (``_converter_pair``); the fp8 blocks land in the ring itself.
        CDT: gl.constexpr = gl.float16
        RING_L: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)
    else:
        CDT: gl.constexpr = k_desc.dtype
        RING_L: gl.constexpr = k_desc.layout
    q_smem = gl.allocate_shared_memory(CDT, [N_DT - 1, TOK_BOX, HEAD_BOX, _DT], q_desc.layout)
    kv_smem = gl.allocate_shared_memory(CDT, [2 * N_DT, 1, BLOCK_N, _DT], RING_L)
    sp_smem = gl.allocate_shared_memory(CDT, [2, _BM, BLOCK_N],
                                        gl.NVMMASharedLayout.get_default_for([_BM, BLOCK_N], CDT))
    return q_smem, kv_smem, sp_smem


@gluon.jit
def _pair_load_q(q_desc, q_smem, sp_smem, q_bar, n_blocks, row_base, qlen, tok0, head0, N_DT: gl.constexpr,
                 VARLEN: gl.constexpr):
    """The producer's Q copy in the pair schedules: tiles 0-7 to ``q_smem``, the rope tile to
    ``sp_smem[1]`` (its consumers hold it in registers before a P is written there); nothing
    for an empty work item."""
    TOK_BOX: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_BOX: gl.constexpr = q_desc.block_type.shape[1]
    if n_blocks > 0:
        q_tok = _first_row(row_base, qlen, VARLEN) + tok0
        mbarrier.expect(q_bar, N_DT * q_desc.block_type.nbytes)
        for c in gl.static_range(N_DT - 1):
            dst = q_smem.index(c)
            if q_smem.dtype != q_desc.dtype:  # fp8 caches: bf16 Q lands in the fp16 tiles
                dst = dst.reinterpret(q_desc.dtype, [TOK_BOX, HEAD_BOX, _DT], q_desc.layout)
            tma.async_load(q_desc, [q_tok, head0, c * _DT], q_bar, dst)
        rope_dst = sp_smem.index(1).reinterpret(q_desc.dtype, [TOK_BOX, HEAD_BOX, _DT], q_desc.layout)
        tma.async_load(q_desc, [q_tok, head0, (N_DT - 1) * _DT], q_bar, rope_dst)


@gluon.jit
def _fill_work(q_desc, q_smem, sp_smem, q_bar, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads,
               kv_capacity, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
               MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, N_DT: gl.constexpr, cp_rank,
               CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows, VARLEN: gl.constexpr,
               HAS_TREE: gl.constexpr, BALANCE: gl.constexpr, LOAD_Q: gl.constexpr):
    """The opening of the partitions that fill the pair schedules' ring (producer or converter
    warps): the CTA's work item, Q's copy requested (LOAD_Q: the partition that loads it) and
    ``(split_start, n_blocks, req_row)``: the split's first key, its blocks and the offset of the
    request's row of the block table."""
    (pid_b, pid_s, tok0, head0, seq_len, real_len, split_start, kv_end, full_end, max_lim, n_blocks,
     split_end, req_lim, len_bad, row_base, qlen_b, k_req) = _work(
        Seq_Lens, Real_Lens, num_kv_splits, qlen, num_heads, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN,
        MIN_SPLIT_LEN, BLOCK_N, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE)
    if LOAD_Q:
        _pair_load_q(q_desc, q_smem, sp_smem, q_bar, n_blocks, row_base, qlen, tok0, head0, N_DT, VARLEN)
    return split_start, n_blocks, pid_b.to(gl.int64) * stride_req_b


@gluon.jit
def _pair_row_sums(WG: gl.constexpr, l_i, sl_smem, l_bar, ROW: gl.constexpr):
    """My row sums plus the other group's, once both are final (pair schedules)."""
    sl_smem.index(WG).store(l_i)
    mbarrier.arrive(l_bar, count=1)
    mbarrier.wait(l_bar, 0)
    l_i = l_i + sl_smem.index(1 - WG).load(ROW)
    return l_i


@gluon.jit
def _producer_alt(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, ready, empty,
                  Req_to_Token, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size,
                  kv_capacity, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
                  MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, N_DT: gl.constexpr, cp_rank,
                  CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows,
                  VARLEN: gl.constexpr, HAS_TREE: gl.constexpr, BALANCE: gl.constexpr):
    """1 warp: Q (tiles 0-7 to ``q_smem``, the rope tile to ``sp_smem[1]``), then each block
    into stage ``i % 2`` by halves, the owner's half first (it is freed first)."""
    split_start, n_blocks, req_row = _fill_work(
        q_desc, q_smem, sp_smem, q_bar, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads,
        kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, cp_rank, CP_WORLD,
        CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE, True)
    _alt_blocks(k_desc, kv_smem, ready, empty, Req_to_Token, req_row, split_start, n_blocks, page_size, 0, BLOCK_N,
                N_DT)


@gluon.jit
def _alt_blocks(k_desc, kv_smem, ready, empty, Req_to_Token, req_row, split_start, n_blocks, page_size, g0,
                BLOCK_N: gl.constexpr, N_DT: gl.constexpr):
    """The alt producer's block loop: the split's ``n_blocks`` blocks from key ``split_start``,
    block i into stage ``(g0 + i) % 2`` by halves, the owner's half first (``g0``: the blocks the
    ring took before, across the balanced grid's segments)."""
    page = gl.load(Req_to_Token + req_row + split_start // page_size, mask=n_blocks > 0, other=0)
    for i in range(n_blocks):
        start = split_start + i * BLOCK_N
        page_next = gl.load(Req_to_Token + req_row + (start + BLOCK_N) // page_size,
                            mask=i + 1 < n_blocks, other=0)
        _alt_block(k_desc, kv_smem, ready, empty, g0 + i, page, start % page_size, N_DT)
        page = page_next


@gluon.jit
def _alt_block(k_desc, kv_smem, ready, empty, i, page, tok, N_DT: gl.constexpr):
    """The ring's block ``i`` (tokens ``[tok, tok + BLOCK_N)`` of cache page ``page``) into
    stage ``i % 2`` by halves, the owner's half first, each once its readers released it."""
    HALF0: gl.constexpr = (N_DT - 1) // 2  # tiles in half 0 (4); half 1 has the rest (5)
    s = i % 2
    ph = ((i // 2) & 1) ^ 1
    for hh in gl.static_range(2):
        h = (s + hh) % 2  # the owner's half first
        mbarrier.wait(empty.index(2 * s + h), ph)
        bar = ready.index(2 * s + h)
        if h == 0:
            mbarrier.expect(bar, HALF0 * k_desc.block_type.nbytes)
            for c in gl.static_range(HALF0):
                tma.async_load(k_desc, [page, tok, c * _DT], bar, kv_smem.index(s * N_DT + c))
        else:
            mbarrier.expect(bar, (N_DT - HALF0) * k_desc.block_type.nbytes)
            for c in gl.static_range(HALF0, N_DT):
                tma.async_load(k_desc, [page, tok, c * _DT], bar, kv_smem.index(s * N_DT + c))


# fp8 caches on the pair schedules: a 4-warp converter partition replaces the producer warp.
# The fp8 block (36 KB) is TMA'd into the ring stage it will occupy as fp16 (72 KB): each part
# of the stage (here the alt schedule's halves: tiles 0-3 and 4-8) receives its own fp8 tiles
# in its upper end, so a part is refilled as soon as its readers release it, as with bf16. The
# converter then dequantizes the part in place, two tiles per step in column order: fp16 tile c
# covers fp8 tiles already converted and, for the part's last tile, its own bytes, so every
# thread has read a step before any writes it, and written it before any reads the next (the
# partition barriers of ``_dequant_part``; written out, they are the ones the compiler put
# there by itself: the SASS is the same). The converter also turns Q to fp16 in place before
# the consumers' first wait (``q_conv``). Its registers are what the consumer groups leave of
# the budget (8 of fp8 and 16 of fp16 per thread and tile).


@gluon.jit
def _fp8_tile(kv_smem, g0, C: gl.constexpr, c, k_desc, BLOCK_N: gl.constexpr):
    """The fp8 staging tile of column tile ``c`` of a ring part of ``C`` fp16 tiles that starts
    at ring tile ``g0`` (``stage * N_DT + first column tile``): the fp16 ring ``kv_smem`` seen
    as fp8 tiles of 4 KB (two per fp16 tile), the part's fp8 tiles at its upper end."""
    N_DT: gl.constexpr = kv_smem.shape[0] // 2
    ring8 = kv_smem.reinterpret(k_desc.dtype, [4 * N_DT, 1, BLOCK_N, _DT], k_desc.layout)
    return ring8.index(2 * g0 + C + c)


@gluon.jit
def _dequant_part(kv_smem, s, t0, C: gl.constexpr, k_desc, BLOCK_N: gl.constexpr):
    """Column tiles ``t0 .. t0 + C - 1`` of stage ``s``: fp8 staging -> fp16 ring tile, in order
    (by the partition's warps)."""
    N_DT: gl.constexpr = kv_smem.shape[0] // 2
    CV_L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [gl.num_warps(), 1], [1, 0])  # 16 B of fp8 per load
    g0 = s * N_DT + t0
    # Two tiles per step: their loads overlap. Every thread of the partition has read a step's
    # fp8 bytes before any writes the fp16 tiles over them (the step's fp16 bytes cover fp8
    # bytes of this step and of earlier ones), and has written a step before any reads the next.
    for c in gl.static_range(0, C, 2):
        if c > 0:
            _barrier()
        y0 = _fp8_tile(kv_smem, g0, C, c, k_desc, BLOCK_N).reshape([BLOCK_N, _DT]).load(CV_L).to(gl.float16)
        if c + 1 < C:
            x1 = _fp8_tile(kv_smem, g0, C, c + 1, k_desc, BLOCK_N).reshape([BLOCK_N, _DT]).load(CV_L)
            y1 = x1.to(gl.float16)
            _barrier()
            kv_smem.index(g0 + c).reshape([BLOCK_N, _DT]).store(y0)
            kv_smem.index(g0 + c + 1).reshape([BLOCK_N, _DT]).store(y1)
        else:
            _barrier()
            kv_smem.index(g0 + c).reshape([BLOCK_N, _DT]).store(y0)


@gluon.jit
def _dequant_rows(kv_smem, s, t0, C: gl.constexpr, k_desc, BLOCK_N: gl.constexpr):
    """``_dequant_part`` in units of 16 rows per warp (a 4-warp partition: a tile per unit, 2
    warps: half a tile), each thread holding its 32 fp8 values of a unit, not their fp16, over
    the unit's partition barrier: a partition of 24 registers per thread runs it. In order, the
    fp16 rows of a unit cover only fp8 bytes read in this unit or an earlier one (a part's fp8
    tiles lie at its upper end), so one barrier per unit, between its loads and its stores,
    suffices. (Fewer, only where a unit's stores cover fp8 bytes, compile to the same SASS:
    the compiler puts a barrier between a load and a store of the same shared buffer.)"""
    N_DT: gl.constexpr = kv_smem.shape[0] // 2
    NW: gl.constexpr = gl.num_warps()
    ROWS: gl.constexpr = 16 * NW
    CV_L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [NW, 1], [1, 0])  # 16 B of fp8 per load
    g0 = s * N_DT + t0
    for c in gl.static_range(C):
        for r in gl.static_range(0, BLOCK_N, ROWS):
            x = _fp8_tile(kv_smem, g0, C, c, k_desc, BLOCK_N).reshape([BLOCK_N, _DT]).slice(r, ROWS).load(CV_L)
            _barrier()
            kv_smem.index(g0 + c).reshape([BLOCK_N, _DT]).slice(r, ROWS).store(x.to(gl.float16))


@gluon.jit
def _q_to_fp16(t):
    """A ``[64, 64]`` Q tile holding bf16 bits -> fp16 in place, clamped to fp16's range (an
    out-of-range q saturates instead of turning the scores into inf / NaN); by 16 rows in a
    partition of fewer than 4 warps (16 values per thread at a time)."""
    NW: gl.constexpr = gl.num_warps()
    QT_L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    ROWS: gl.constexpr = 64 if NW >= 4 else 8 * NW
    for r in gl.static_range(0, 64, ROWS):
        u = t.slice(r, ROWS) if ROWS < 64 else t
        x = u.reinterpret(gl.bfloat16, u.shape, u.layout).load(QT_L).to(gl.float32)
        u.store(gl.minimum(gl.maximum(x, -65504.0), 65504.0).to(gl.float16))


@gluon.jit
def _stage_part(k_desc, kv_smem, bar, s, t0, C: gl.constexpr, page, tok, BLOCK_N: gl.constexpr):
    """TMA of column tiles ``t0 .. t0 + C - 1`` of the fp8 block at (``page``, ``tok``) into
    their staging tiles of stage ``s``; ``bar`` counts the bytes."""
    N_DT: gl.constexpr = kv_smem.shape[0] // 2
    mbarrier.expect(bar, C * k_desc.block_type.nbytes)
    for c in gl.static_range(C):
        tma.async_load(k_desc, [page, tok, (t0 + c) * _DT], bar,
                       _fp8_tile(kv_smem, s * N_DT + t0, C, c, k_desc, BLOCK_N))


@gluon.jit
def _stage_half(k_desc, kv_smem, staged, s, h: gl.constexpr, page, tok, HALF0: gl.constexpr,
                BLOCK_N: gl.constexpr):
    """TMA of half ``h`` of the fp8 block at (``page``, ``tok``) into its staging tiles of stage
    ``s`` (``staged[2s + h]`` counts the bytes)."""
    N_DT: gl.constexpr = kv_smem.shape[0] // 2
    bar = staged.index(2 * s + h)
    if h == 0:
        _stage_part(k_desc, kv_smem, bar, s, 0, HALF0, page, tok, BLOCK_N)
    else:
        _stage_part(k_desc, kv_smem, bar, s, HALF0, N_DT - HALF0, page, tok, BLOCK_N)


@gluon.jit
def _convert_q(q_smem, sp_smem, q_bar, q_conv, N_DT: gl.constexpr):
    """The converter warps' Q: once its copy landed, its tiles turned to fp16 in place (the rope
    tile in ``sp_smem[1]``), then ``q_conv`` released to the consumer groups."""
    mbarrier.wait(q_bar, 0)
    for c in gl.static_range(N_DT - 1):
        _q_to_fp16(q_smem.index(c).reshape([_BM, _DT]))
    _q_to_fp16(sp_smem.index(1))
    fence_async_shared()
    mbarrier.arrive(q_conv, count=1)


@gluon.jit
def _converter_start(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, Req_to_Token, Seq_Lens,
                     Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size, kv_capacity,
                     TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
                     MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, N_DT: gl.constexpr, cp_rank,
                     CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows, VARLEN: gl.constexpr,
                     HAS_TREE: gl.constexpr, BALANCE: gl.constexpr, OWNER_FIRST: gl.constexpr, STAGE_NEXT: gl.constexpr):
    """The converter warps' start: ``_fill_work`` (Q's copy requested), then for a work item
    with blocks, blocks 0 and 1 staged in their ring stages (both start free; OWNER_FIRST: a
    block's owner's half first, as the alt schedule reads them, else half 0 first), then Q, once
    landed, turned to fp16 in place (``q_conv``), and with STAGE_NEXT (swap-AB) block 2 into the
    staging tiles (``_stage_swapab``). Returns ``_fill_work``'s ``(split_start, n_blocks, req_row)``."""
    split_start, n_blocks, req_row = _fill_work(
        q_desc, q_smem, sp_smem, q_bar, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads,
        kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, cp_rank, CP_WORLD,
        CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE, True)
    HALF0: gl.constexpr = (N_DT - 1) // 2  # tiles in half 0 (4); half 1 has the rest (5)
    if n_blocks > 0:
        for b in gl.static_range(2):
            if b < n_blocks:
                start = split_start + b * BLOCK_N
                page = gl.load(Req_to_Token + req_row + start // page_size)
                H0: gl.constexpr = b if OWNER_FIRST else 0
                _stage_half(k_desc, kv_smem, staged, b, H0, page, start % page_size, HALF0, BLOCK_N)
                _stage_half(k_desc, kv_smem, staged, b, 1 - H0, page, start % page_size, HALF0, BLOCK_N)
        _convert_q(q_smem, sp_smem, q_bar, q_conv, N_DT)
        if STAGE_NEXT and n_blocks > 2:
            _barrier()  # every warp's Q writes done before the copy engine writes their upper rows
            start = split_start + 2 * BLOCK_N
            page = gl.load(Req_to_Token + req_row + start // page_size)
            _stage_swapab(k_desc, q_smem, sp_smem, staged.index(4), 0, page, start % page_size, HALF0, BLOCK_N)
            _stage_swapab(k_desc, q_smem, sp_smem, staged.index(5), 1, page, start % page_size, HALF0, BLOCK_N)
    return split_start, n_blocks, req_row


@gluon.jit
def _converter_pair(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty,
                    Req_to_Token, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size,
                    kv_capacity, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
                    MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, N_DT: gl.constexpr, cp_rank,
                    CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows,
                    VARLEN: gl.constexpr, HAS_TREE: gl.constexpr, BALANCE: gl.constexpr):
    """4 warps (fp8 caches, alt schedule): Q and the fp8 blocks by TMA, both turned to fp16 in
    shared memory (see above). Blocks 0 and 1 are requested before Q converts (both stages start
    free); then after each half of block i is dequantized (the owner's half first), a half of
    block i + 1 is requested once block i - 1 released it (its owner's half first). Each of
    those releases needs at most block i (the other group's, with QK_FIRST, its scores of block
    i), so no wait here depends on a block not yet dequantized."""
    split_start, n_blocks, req_row = _converter_start(
        q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, Req_to_Token, Seq_Lens, Real_Lens,
        stride_req_b, num_kv_splits, qlen, num_heads, page_size, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN,
        MIN_SPLIT_LEN, BLOCK_N, N_DT, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN,
        HAS_TREE, BALANCE, True, False)
    HALF0: gl.constexpr = (N_DT - 1) // 2  # tiles in half 0 (4); half 1 has the rest (5)
    for i in range(n_blocks):
        s = i % 2
        s1 = 1 - s  # block i + 1's stage (block i - 1's until released)
        start1 = split_start + (i + 1) * BLOCK_N
        more = (i >= 1) & (i + 1 < n_blocks)  # block i + 1 not requested yet
        page1 = gl.load(Req_to_Token + req_row + start1 // page_size, mask=more, other=0)
        for hh in gl.static_range(2):
            h = (s + hh) % 2
            mbarrier.wait(staged.index(2 * s + h), (i // 2) & 1)
            if h == 0:
                _dequant_part(kv_smem, s, 0, HALF0, k_desc, BLOCK_N)
            else:
                _dequant_part(kv_smem, s, HALF0, N_DT - HALF0, k_desc, BLOCK_N)
            fence_async_shared()
            mbarrier.arrive(ready.index(2 * s + h), count=1)
            if more:
                h1 = (s1 + hh) % 2
                mbarrier.wait(empty.index(2 * s1 + h1), (((i + 1) // 2) & 1) ^ 1)
                _stage_half(k_desc, kv_smem, staged, s1, h1, page1, start1 % page_size, HALF0, BLOCK_N)


@gluon.jit
def _fill_alt(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty, Req_to_Token, Seq_Lens,
              Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size, kv_capacity, TOK_BOX: gl.constexpr,
              HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr, MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr,
              N_DT: gl.constexpr, cp_rank, CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows,
              VARLEN: gl.constexpr, HAS_TREE: gl.constexpr, BALANCE: gl.constexpr, KV_FP8: gl.constexpr):
    """The alt kernel's partition that fills the ring: the converter warps for an fp8 cache,
    the producer warp otherwise (``q_conv`` and ``staged`` are then unused)."""
    if KV_FP8:
        _converter_pair(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty, Req_to_Token,
                        Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size, kv_capacity,
                        TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, cp_rank, CP_WORLD,
                        CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE)
    else:
        _producer_alt(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, ready, empty, Req_to_Token, Seq_Lens,
                      Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size, kv_capacity, TOK_BOX,
                      HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, cp_rank, CP_WORLD, CP_INTERLEAVE,
                      Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE)


@gluon.jit
def _zero_v_tail(kv_smem, base, V0: gl.constexpr, V_TILES: gl.constexpr, n_valid, BLOCK_N: gl.constexpr):
    """Zero rows ``>= n_valid`` of this group's V tiles of a block (NaN guard of the tail)."""
    TILE_L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    kk = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, TILE_L))
    keep = (kk < n_valid)[:, None]
    for c in gl.static_range(V_TILES):
        t = kv_smem.index(base + V0 + c).reshape([BLOCK_N, _DT])
        x = t.load(TILE_L)
        t.store(gl.where(keep, x, gl.zeros_like(x)))
    fence_async_shared()


@gluon.jit
def _issue_scores(WG: gl.constexpr, q_smem, q_rope, kv_smem, ready, base, zero, ph, qk,
                  BLOCK_N: gl.constexpr, N_DT: gl.constexpr):
    """Issue ``S = Q K^T`` of the block in tiles ``base ..``: 9 async wgmmas, this group's V
    half's tiles first (they are loaded first); returns the in-flight accumulator."""
    HALF0: gl.constexpr = (N_DT - 1) // 2  # tiles of half 0; half 1: the rest, rope included
    if WG == 0:
        mbarrier.wait(ready.index(base // N_DT * 2 + 0), ph)
        qk = warpgroup_mma(q_smem.index(zero).reshape([_BM, _DT]),
                           kv_smem.index(base).reshape([BLOCK_N, _DT]).permute((1, 0)),
                           qk, use_acc=False, is_async=True)
        for c in gl.static_range(1, HALF0):
            qk = warpgroup_mma(q_smem.index(c + zero).reshape([_BM, _DT]),
                               kv_smem.index(base + c).reshape([BLOCK_N, _DT]).permute((1, 0)), qk, is_async=True)
        mbarrier.wait(ready.index(base // N_DT * 2 + 1), ph)
        for c in gl.static_range(HALF0, N_DT - 1):
            qk = warpgroup_mma(q_smem.index(c + zero).reshape([_BM, _DT]),
                               kv_smem.index(base + c).reshape([BLOCK_N, _DT]).permute((1, 0)), qk, is_async=True)
        qk = warpgroup_mma(q_rope, kv_smem.index(base + N_DT - 1).reshape([BLOCK_N, _DT]).permute((1, 0)),
                           qk, is_async=True)
    else:
        mbarrier.wait(ready.index(base // N_DT * 2 + 1), ph)
        qk = warpgroup_mma(q_rope, kv_smem.index(base + N_DT - 1).reshape([BLOCK_N, _DT]).permute((1, 0)),
                           qk, use_acc=False, is_async=True)
        for c in gl.static_range(HALF0, N_DT - 1):
            qk = warpgroup_mma(q_smem.index(c + zero).reshape([_BM, _DT]),
                               kv_smem.index(base + c).reshape([BLOCK_N, _DT]).permute((1, 0)), qk, is_async=True)
        mbarrier.wait(ready.index(base // N_DT * 2 + 0), ph)
        for c in gl.static_range(0, HALF0):
            qk = warpgroup_mma(q_smem.index(c + zero).reshape([_BM, _DT]),
                               kv_smem.index(base + c).reshape([BLOCK_N, _DT]).permute((1, 0)), qk, is_async=True)
    return qk


@gluon.jit
def _pv_prev(kv_smem, sp_smem, sa_smem, p_ready, sp, jp, l_i, acc0, acc1, acc2, acc3, split_start, kv_end,
             V0: gl.constexpr, V_TILES: gl.constexpr, BLOCK_N: gl.constexpr, N_DT: gl.constexpr,
             ROW: gl.constexpr, NAMED: gl.constexpr = False):
    """The other group's block jp (stage / P tile sp): wait for its P and alpha (NAMED: on named
    barrier 8 + sp), rescale my O half and row sums, zero the tail's V rows, issue my half of
    P V. Returns (l, the 4 in-flight accumulators)."""
    _take_over(p_ready.index(sp), (jp // 2) & 1, NAMED, 8 + sp)
    alpha = sa_smem.index(sp).load(ROW)
    l_i = l_i * alpha
    acc0 = acc0 * alpha[:, None]
    acc1 = acc1 * alpha[:, None]
    acc2 = acc2 * alpha[:, None]
    acc3 = acc3 * alpha[:, None]
    start_p = split_start + jp * BLOCK_N
    if start_p + BLOCK_N > kv_end:
        _zero_v_tail(kv_smem, sp * N_DT, V0, V_TILES, kv_end - start_p, BLOCK_N)
    t0, t1, t2, t3 = _pv_issue(sp_smem.index(sp), kv_smem, sp * N_DT + V0, acc0, acc1, acc2, acc3, BLOCK_N)
    return l_i, t0, t1, t2, t3


@gluon.jit
def _pv_issue(p_sm, kv_smem, v_base, acc0, acc1, acc2, acc3, BLOCK_N: gl.constexpr):
    """Issue ``P V`` on V tiles ``v_base .. v_base + 3`` into the four O accumulators (P from
    shared memory); returns them in flight."""
    t0 = warpgroup_mma(p_sm, kv_smem.index(v_base + 0).reshape([BLOCK_N, _DT]), acc0, is_async=True)
    t1 = warpgroup_mma(p_sm, kv_smem.index(v_base + 1).reshape([BLOCK_N, _DT]), acc1, is_async=True)
    t2 = warpgroup_mma(p_sm, kv_smem.index(v_base + 2).reshape([BLOCK_N, _DT]), acc2, is_async=True)
    t3 = warpgroup_mma(p_sm, kv_smem.index(v_base + 3).reshape([BLOCK_N, _DT]), acc3, is_async=True)
    return t0, t1, t2, t3


@gluon.jit
def _softmax_publish(qk, l_i, qk_scale, j, s, split_start, full_end, lim, sp_smem, sa_smem, sm_smem, p_free,
                     p_ready, Tree_Mask, row_base, qlen, tok0, qlen_b, seq_len, BLOCK_N: gl.constexpr,
                     HEAD_BOX: gl.constexpr, VARLEN: gl.constexpr, HAS_TREE: gl.constexpr, BALANCE: gl.constexpr, ROW: gl.constexpr,
                     COL: gl.constexpr, NAMED: gl.constexpr = False):
    """The softmax of my block j (scores ``qk``) against the running row max of blocks < j
    (``sm_smem``); publishes P_j, alpha_j and m_j (tile ``s``; NAMED: on named barrier 8 + s)
    once both groups are done with P_{j-2}'s tile. Keys past a row's limit (or outside its
    draft tree) are masked in the tail blocks. Returns (l, alpha_j)."""
    sc = _mask_tail(qk * qk_scale, split_start + j * BLOCK_N, full_end, lim, Tree_Mask, row_base, qlen, tok0, qlen_b,
                    seq_len, BLOCK_N, HEAD_BOX, VARLEN, HAS_TREE, BALANCE, ROW, COL)
    m_prev = sm_smem.load(ROW)
    m_prev = gl.where(j > 0, m_prev, float("-inf"))  # (garbage before block 0)
    m_new, alpha, p, l_i = _online_softmax(sc, m_prev, l_i)
    _take_over(p_free.index(s), ((j // 2) & 1) ^ 1, NAMED, 12 + s, j >= 2)
    sp_smem.index(s).store(p.to(sp_smem.dtype))
    sa_smem.index(s).store(alpha)
    sm_smem.store(m_new)
    fence_async_shared()
    _hand_over(p_ready.index(s), NAMED, 8 + s)
    return l_i, alpha


@gluon.jit
def _pv_own(acc0, acc1, acc2, acc3, alpha, kv_smem, sp_smem, empty, p_free, s, base, start, kv_end,
            WG: gl.constexpr, V0: gl.constexpr, V_TILES: gl.constexpr, BLOCK_N: gl.constexpr,
            NAMED: gl.constexpr = False):
    """My half of P_j V_j for my block j (stage and P tile ``s``): rescale O by alpha_j, zero
    the tail's V rows, the wgmmas, then release my half of the stage and the P tile (NAMED:
    the tile's named barrier counts the other group only; my own use is over in program order
    before I write the tile again)."""
    acc0 = acc0 * alpha[:, None]
    acc1 = acc1 * alpha[:, None]
    acc2 = acc2 * alpha[:, None]
    acc3 = acc3 * alpha[:, None]
    if start + BLOCK_N > kv_end:
        _zero_v_tail(kv_smem, base, V0, V_TILES, kv_end - start, BLOCK_N)
    acc0, acc1, acc2, acc3 = _pv_issue(sp_smem.index(s), kv_smem, base + V0, acc0, acc1, acc2, acc3, BLOCK_N)
    acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(acc0, acc1, acc2, acc3))
    mbarrier.arrive(empty.index(2 * s + WG), count=1)  # my half of my block j is done
    if not NAMED:
        mbarrier.arrive(p_free.index(s), count=1)
    return acc0, acc1, acc2, acc3


@gluon.jit
def _consumer_alt(WG: gl.constexpr, shared, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
                  MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, N_DT: gl.constexpr,
                  LV: gl.constexpr, SINGLE: gl.constexpr, QK_FIRST: gl.constexpr, cp_rank,
                  CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, Tree_Mask, num_rows,
                  VARLEN: gl.constexpr, HAS_TREE: gl.constexpr, BALANCE: gl.constexpr, KV_FP8: gl.constexpr,
                  EARLY_RELEASE: gl.constexpr, STAGE_OUT: gl.constexpr, NAMED: gl.constexpr):
    """Consumer group WG of the alternating schedule (see above): owns blocks j = WG (mod 2)
    and output columns ``[WG * LV/2, (WG + 1) * LV/2)``. ``shared``: the runtime arguments
    both groups take (``_verify_stage1_alt`` builds it). KV_FP8: the ring holds the fp16 blocks
    the converter warps wrote; ``k_scale`` scales the scores and o. NAMED: P_j passes to the
    other group on named barrier 8 + j % 2 (``_named_barrier``) instead of the mbarrier
    ``p_ready``: the owner arrives once per block, the other group syncs once; the other group
    frees P_j's tile on named barrier 12 + j % 2 where block j + 2 follows, and the owner syncs
    on it before it writes P_{j+2}. So each named barrier alternates: the owner publishes block
    j + 2 only after the other group freed P_j's tile."""
    (q_smem, kv_smem, sp_smem, sm_smem, sa_smem, sl_smem, q_bar, ready, empty, p_ready, p_free, l_bar, Seq_Lens,
     Real_Lens, O, Lse, Mid, K_Scale, qk_scale, num_kv_splits, qlen, num_heads, Req_to_Token, stride_req_b,
     page_size, num_pages, kv_capacity, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h,
     stride_mid_s) = shared
    MMA: gl.constexpr = _wgmma_layout(BLOCK_N)  # the scores
    OP_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)
    COL: gl.constexpr = gl.SliceLayout(0, MMA)
    V_TILES: gl.constexpr = LV // _DT // 2
    V0: gl.constexpr = WG * V_TILES

    (pid_s, tok0, head0, seq_len, split_start, kv_end, full_end, n_blocks, row_base, qlen_b, lim,
     marked, k_req) = _consumer_prologue(q_bar, Seq_Lens, Real_Lens, Req_to_Token, stride_req_b, num_kv_splits, qlen,
                                  num_heads, page_size, num_pages, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN,
                                  MIN_SPLIT_LEN, BLOCK_N, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows,
                                  VARLEN, HAS_TREE, BALANCE, ROW)

    if KV_FP8:
        v_scale = gl.load(K_Scale)
        qk_scale = qk_scale * v_scale  # scores of a dequantized cache: q . (k * k_scale)
    else:
        v_scale = 1.0
    q_rope = sp_smem.index(1).load(OP_A)  # [64, 64] bf16 (fp16), the A operand of the rope wgmma
    acc0 = gl.zeros([_BM, _DT], gl.float32, MMA)  # my O half, by 64 columns
    acc1 = gl.zeros([_BM, _DT], gl.float32, MMA)
    acc2 = gl.zeros([_BM, _DT], gl.float32, MMA)
    acc3 = gl.zeros([_BM, _DT], gl.float32, MMA)
    l_i = gl.zeros([_BM], gl.float32, ROW)
    qk = gl.zeros([_BM, BLOCK_N], gl.float32, MMA)

    # Iterations j = WG, WG + 2, ... <= n_blocks: my blocks j < n_blocks and the other group's j - 1.
    n_iter = gl.where(n_blocks > 0, (n_blocks - WG) // 2 + 1, 0)
    for it in range(n_iter):
        j = WG + 2 * it  # my block; this iteration first does my half of the other group's j - 1
        # My blocks are always in my stage (s == j % 2 == WG). Written with an opaque zero (seq_len
        # is never negative) so that the compiler recomputes the ~25 shared-memory descriptors per
        # block instead of keeping them live across the loop (that spilled 1.6 KB).
        zero = it * (seq_len < 0).to(gl.int32)
        s = WG + zero
        base = s * N_DT
        # (Asynchronous accumulators never leave the branch that issued them in flight, or
        # ptxas serializes the wgmmas: every branch below ends with a full wait.)
        sp = 1 - WG + zero  # stage and P tile of the other group's block j - 1
        if QK_FIRST:
            # My scores first (they only need my block's tiles), then my half of P_{j-1} V_{j-1}
            # once the other group has published P_{j-1}: the scores run during its softmax.
            if j < n_blocks:
                tq = _issue_scores(WG, q_smem, q_rope, kv_smem, ready, base, zero, (j // 2) & 1, qk,
                                   BLOCK_N, N_DT)
                if j >= 1:
                    l_i, t0, t1, t2, t3 = _pv_prev(kv_smem, sp_smem, sa_smem, p_ready, sp, j - 1, l_i, acc0, acc1,
                                                   acc2, acc3, split_start, kv_end, V0, V_TILES, BLOCK_N, N_DT,
                                                   ROW, NAMED)
                    qk, acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(tq, t0, t1, t2, t3))
                    mbarrier.arrive(empty.index(2 * sp + WG), count=1)  # my half of block j - 1 is done
                    _hand_over(p_free.index(sp), NAMED, 12 + sp, j + 1 < n_blocks)
                else:
                    qk = warpgroup_mma_wait(0, deps=(tq, ))
            else:
                l_i, t0, t1, t2, t3 = _pv_prev(kv_smem, sp_smem, sa_smem, p_ready, sp, j - 1, l_i, acc0, acc1,
                                               acc2, acc3, split_start, kv_end, V0, V_TILES, BLOCK_N, N_DT, ROW, NAMED)
                acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))
                mbarrier.arrive(empty.index(2 * sp + WG), count=1)  # my half of block j - 1 is done
                _hand_over(p_free.index(sp), NAMED, 12 + sp, j + 1 < n_blocks)
        else:
            # My half of P_{j-1} V_{j-1} first, my scores queued behind it.
            if j >= 1 and EARLY_RELEASE:
                # ... or issued once it is done and my half of block j - 1 is released: the
                # ring's refill does not wait for my scores (nor for block j to be ready).
                l_i, t0, t1, t2, t3 = _pv_prev(kv_smem, sp_smem, sa_smem, p_ready, sp, j - 1, l_i, acc0, acc1,
                                               acc2, acc3, split_start, kv_end, V0, V_TILES, BLOCK_N, N_DT, ROW, NAMED)
                acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))
                mbarrier.arrive(empty.index(2 * sp + WG), count=1)  # my half of block j - 1 is done
                _hand_over(p_free.index(sp), NAMED, 12 + sp, j + 1 < n_blocks)
                if j < n_blocks:
                    tq = _issue_scores(WG, q_smem, q_rope, kv_smem, ready, base, zero, (j // 2) & 1, qk,
                                       BLOCK_N, N_DT)
                    qk = warpgroup_mma_wait(0, deps=(tq, ))
            elif j >= 1:
                l_i, t0, t1, t2, t3 = _pv_prev(kv_smem, sp_smem, sa_smem, p_ready, sp, j - 1, l_i, acc0, acc1,
                                               acc2, acc3, split_start, kv_end, V0, V_TILES, BLOCK_N, N_DT, ROW, NAMED)
                if j < n_blocks:
                    tq = _issue_scores(WG, q_smem, q_rope, kv_smem, ready, base, zero, (j // 2) & 1, qk,
                                       BLOCK_N, N_DT)
                    qk, acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(tq, t0, t1, t2, t3))
                else:
                    acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))
                mbarrier.arrive(empty.index(2 * sp + WG), count=1)  # my half of block j - 1 is done
                _hand_over(p_free.index(sp), NAMED, 12 + sp, j + 1 < n_blocks)
            else:
                tq = _issue_scores(WG, q_smem, q_rope, kv_smem, ready, base, zero, 0, qk, BLOCK_N, N_DT)
                qk = warpgroup_mma_wait(0, deps=(tq, ))
        if j < n_blocks:
            l_i, alpha = _softmax_publish(qk, l_i, qk_scale, j, s, split_start, full_end, lim, sp_smem, sa_smem,
                                          sm_smem, p_free, p_ready, Tree_Mask, row_base, qlen, tok0, qlen_b, seq_len,
                                          BLOCK_N, HEAD_BOX, VARLEN, HAS_TREE, BALANCE, ROW, COL, NAMED)
            acc0, acc1, acc2, acc3 = _pv_own(acc0, acc1, acc2, acc3, alpha, kv_smem, sp_smem, empty, p_free, s, base,
                                             split_start + j * BLOCK_N, kv_end, WG, V0, V_TILES, BLOCK_N, NAMED)

    # l = my row sums + the other group's; m = the last published running max.
    l_i = _pair_row_sums(WG, l_i, sl_smem, l_bar, ROW)
    m_i = gl.where(n_blocks > 0, sm_smem.load(ROW), float("-inf"))
    _store_out(WG, acc0, acc1, acc2, acc3, l_i, m_i, v_scale, marked, O, Lse, Mid, row_base, pid_s, tok0, head0, qlen,
               qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h, stride_mid_s,
               HEAD_BOX, LV, SINGLE, VARLEN, MMA, kv_smem, STAGE_OUT, k_req, BALANCE, num_kv_splits)


@gluon.jit
def _out_tile(kv_smem, WG: gl.constexpr, t: gl.constexpr):
    """The fp32 ``[64, 64]`` shared tile where group WG stages output tile ``t`` (0-3) before
    ``_store_out`` writes it: the ring seen as 16 KB fp32 tiles (two 16-bit ring tiles each),
    group WG's four after the other group's. Called after ``_pair_row_sums``: both groups have
    retired every wgmma of their block loops, and no copy or conversion fills the ring past the
    split's last block, so the whole ring is free."""
    N_DT: gl.constexpr = kv_smem.shape[0] // 2
    BLOCK_N: gl.constexpr = kv_smem.shape[2]
    gl.static_assert(kv_smem.dtype.primitive_bitwidth == 16)
    gl.static_assert(BLOCK_N == _BM)
    gl.static_assert(N_DT >= 8)
    # 8-byte units XOR-ed by row: the accumulator layout's stores (8 rows x 4 threads x 8 bytes)
    # spread over the banks, a row's 64 values stay one row for the coalesced reads.
    OUT_L: gl.constexpr = gl.SwizzledSharedLayout(2, 1, 8, [1, 0])
    return kv_smem.reinterpret(gl.float32, [N_DT, _BM, _DT], OUT_L).index(4 * WG + t)


@gluon.jit
def _store_staged(WG: gl.constexpr, kv_smem, acc0, acc1, acc2, acc3, inv_l, base, row_valid_st,
                  ST: gl.constexpr, DT: gl.constexpr):
    """The group's four output tiles scaled by ``inv_l`` through shared memory (``_out_tile``),
    then to ``base`` (``[64, 1]`` row pointers of this group's first column, layout ST) with
    each warp store writing 32 consecutive values of one row: whole 32-byte sectors, where the
    accumulator layout's stores (8 rows x 32 bytes each) cut every sector of a 4-byte-aligned
    row in two (the split workspace's rows are ``Lv + 1`` floats)."""
    _out_tile(kv_smem, WG, 0).store(acc0 * inv_l)
    _out_tile(kv_smem, WG, 1).store(acc1 * inv_l)
    _out_tile(kv_smem, WG, 2).store(acc2 * inv_l)
    _out_tile(kv_smem, WG, 3).store(acc3 * inv_l)
    _barrier()  # the group's warps: every tile written before any is read back
    cols = gl.arange(0, _DT, layout=gl.SliceLayout(0, ST))
    mask = row_valid_st[:, None] & (cols[None, :] < _DT)
    ptr = base + cols[None, :]
    gl.store(ptr, _out_tile(kv_smem, WG, 0).load(ST).to(DT), mask=mask)
    gl.store(ptr + _DT, _out_tile(kv_smem, WG, 1).load(ST).to(DT), mask=mask)
    gl.store(ptr + 2 * _DT, _out_tile(kv_smem, WG, 2).load(ST).to(DT), mask=mask)
    gl.store(ptr + 3 * _DT, _out_tile(kv_smem, WG, 3).load(ST).to(DT), mask=mask)


@gluon.jit
def _out_rows(rows, tok0, head0, qlen_b, row_base, qlen, HEAD_BOX: gl.constexpr, VARLEN: gl.constexpr):
    """Where the block's rows ``rows`` go in o / lse / the split workspace: ``(q_row, head,
    valid)``, q's row (int64) and head of each, and whether it is one of the request's rows."""
    tok = tok0 + rows // HEAD_BOX
    head = head0 + rows % HEAD_BOX
    q_row = (_first_row(row_base, qlen, VARLEN) + tok).to(gl.int64)
    return q_row, head, tok < qlen_b


@gluon.jit
def _store_lse(lse, q_row, head, valid, Lse, Mid, pid_s, stride_lm, stride_lh, stride_mid_m, stride_mid_h,
               stride_mid_s, LV: gl.constexpr, SINGLE: gl.constexpr):
    """The rows' lse: into ``Lse`` (one split), or after the split's partial o in ``Mid``."""
    if SINGLE:
        gl.store(Lse + q_row * stride_lm + head * stride_lh, lse, mask=valid)
    else:
        gl.store(Mid + q_row * stride_mid_m + head * stride_mid_h + pid_s * stride_mid_s + LV, lse, mask=valid)


@gluon.jit
def _final_scales(l_i, m_i, v_scale, marked):
    """A split's (or the launch's) end for each row: ``(v_scale / l, lse)`` from the row sums
    and the running max (base 2); a row that saw no key gets 0 and -inf, a marked request NaN
    in both."""
    has_key = l_i > 0.0
    inv_l = gl.where(has_key, v_scale / gl.where(has_key, l_i, 1.0), 0.0)
    inv_l = gl.where(marked, float("nan"), inv_l)
    lse = gl.where(has_key, (m_i + gl.log2(gl.where(has_key, l_i, 1.0))) * _LN2, float("-inf"))
    lse = gl.where(marked, float("nan"), lse)
    return inv_l, lse


@gluon.jit
def _fill_lse(value: gl.constexpr, Mid, row_base, s0, s1, tok0, head0, qlen, qlen_b, stride_mid_m, stride_mid_h,
              stride_mid_s, HEAD_BOX: gl.constexpr, LV: gl.constexpr, VARLEN: gl.constexpr):
    """The slots ``[s0, s1)`` of ``Mid`` a balanced launch's request does not use
    (``_store_out``), its rows' lse := ``value``: -inf past its last piece (stage 2 gives them no
    weight), +inf in slot 1 of a request written straight to o (stage 2 leaves its rows alone)."""
    L: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    q_row, head, valid = _out_rows(gl.arange(0, _BM, layout=L), tok0, head0, qlen_b, row_base, qlen, HEAD_BOX,
                                   VARLEN)
    base = Mid + q_row * stride_mid_m + head * stride_mid_h + LV
    for s in range(s0, s1):
        gl.store(base + s * stride_mid_s, gl.full([_BM], value, gl.float32, L), mask=valid)


@gluon.jit
def _store_out(WG: gl.constexpr, acc0, acc1, acc2, acc3, l_i, m_i, v_scale, marked, O, Lse, Mid, row_base, pid_s,
               tok0, head0, qlen, qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h,
               stride_mid_s, HEAD_BOX: gl.constexpr, LV: gl.constexpr, SINGLE: gl.constexpr,
               VARLEN: gl.constexpr, MMA: gl.constexpr, kv_smem=None, STAGE_OUT: gl.constexpr = False,
               k_req=None, BALANCE: gl.constexpr = 0, n_slots=None):
    """The CTA's output (``_store_out_to``). BALANCE: the request's ``k_req`` pieces decide
    where: one piece straight to o / lse, marking slot 1 (``_fill_lse``, +inf) so that stage 2
    leaves the request alone; several: each to its slot of ``Mid``, the last one setting the
    slots past them (up to ``n_slots``) to -inf: the CTAs of those slots have returned."""
    if BALANCE:
        if k_req == 1:
            _store_out_to(WG, acc0, acc1, acc2, acc3, l_i, m_i, v_scale, marked, O, Lse, Mid, row_base, pid_s,
                          tok0, head0, qlen, qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m,
                          stride_mid_h, stride_mid_s, HEAD_BOX, LV, True, VARLEN, MMA, kv_smem, STAGE_OUT)
            if WG == 0:
                _fill_lse(float("inf"), Mid, row_base, 1, 2, tok0, head0, qlen, qlen_b, stride_mid_m,
                          stride_mid_h, stride_mid_s, HEAD_BOX, LV, VARLEN)
        elif pid_s < k_req:
            _store_out_to(WG, acc0, acc1, acc2, acc3, l_i, m_i, v_scale, marked, O, Lse, Mid, row_base, pid_s,
                          tok0, head0, qlen, qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m,
                          stride_mid_h, stride_mid_s, HEAD_BOX, LV, False, VARLEN, MMA, kv_smem, STAGE_OUT)
            if WG == 0 and pid_s == k_req - 1:
                _fill_lse(float("-inf"), Mid, row_base, k_req, n_slots, tok0, head0, qlen, qlen_b, stride_mid_m,
                          stride_mid_h, stride_mid_s, HEAD_BOX, LV, VARLEN)
    else:
        _store_out_to(WG, acc0, acc1, acc2, acc3, l_i, m_i, v_scale, marked, O, Lse, Mid, row_base, pid_s, tok0,
                      head0, qlen, qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h,
                      stride_mid_s, HEAD_BOX, LV, SINGLE, VARLEN, MMA, kv_smem, STAGE_OUT)


@gluon.jit
def _store_out_to(WG: gl.constexpr, acc0, acc1, acc2, acc3, l_i, m_i, v_scale, marked, O, Lse, Mid, row_base, pid_s,
                  tok0, head0, qlen, qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h,
                  stride_mid_s, HEAD_BOX: gl.constexpr, LV: gl.constexpr, SINGLE: gl.constexpr,
                  VARLEN: gl.constexpr, MMA: gl.constexpr, kv_smem=None, STAGE_OUT: gl.constexpr = False):
    """o (or the split's partial o and its lse) of this group's columns from its four
    ``[64, 64]`` accumulators: rows that saw no key get o = 0 and lse = -inf; a marked request
    NaN in both. The request's ``qlen_b`` rows start at row ``_first_row(row_base, qlen, VARLEN)``
    of o / lse / Mid. STAGE_OUT (the pair schedules, after ``_pair_row_sums``): o goes through
    the group's V half of the ring, ``_store_staged``."""
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)
    COL: gl.constexpr = gl.SliceLayout(0, MMA)
    inv_l, lse = _final_scales(l_i, m_i, v_scale, marked)
    inv_l = inv_l[:, None]
    q_row, head, row_valid = _out_rows(gl.arange(0, _BM, layout=ROW), tok0, head0, qlen_b, row_base, qlen,
                                       HEAD_BOX, VARLEN)
    cols = gl.arange(0, _DT, layout=COL)
    mask = row_valid[:, None] & (cols[None, :] < _DT)
    col0 = WG * (LV // 2)
    if STAGE_OUT:
        # 4 warps, each row's 64 values by 32 threads: one row per warp store.
        ST: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
        q_row_st, head_st, valid_st = _out_rows(gl.arange(0, _BM, layout=gl.SliceLayout(1, ST)), tok0, head0,
                                                qlen_b, row_base, qlen, HEAD_BOX, VARLEN)
        if SINGLE:
            base = O + q_row_st * stride_om + head_st * stride_oh + col0
            _store_staged(WG, kv_smem, acc0, acc1, acc2, acc3, inv_l, base[:, None], valid_st, ST,
                          O.dtype.element_ty)
        else:
            base = Mid + q_row_st * stride_mid_m + head_st * stride_mid_h + pid_s * stride_mid_s + col0
            _store_staged(WG, kv_smem, acc0, acc1, acc2, acc3, inv_l, base[:, None], valid_st, ST,
                          gl.float32)
        if WG == 0:
            _store_lse(lse, q_row, head, row_valid, Lse, Mid, pid_s, stride_lm, stride_lh, stride_mid_m,
                       stride_mid_h, stride_mid_s, LV, SINGLE)
    elif SINGLE:
        p_o = O + q_row[:, None] * stride_om + head[:, None] * stride_oh + col0 + cols[None, :]
        gl.store(p_o, (acc0 * inv_l).to(O.dtype.element_ty), mask=mask)
        gl.store(p_o + _DT, (acc1 * inv_l).to(O.dtype.element_ty), mask=mask)
        gl.store(p_o + 2 * _DT, (acc2 * inv_l).to(O.dtype.element_ty), mask=mask)
        gl.store(p_o + 3 * _DT, (acc3 * inv_l).to(O.dtype.element_ty), mask=mask)
        if WG == 0:
            _store_lse(lse, q_row, head, row_valid, Lse, Mid, pid_s, stride_lm, stride_lh, stride_mid_m,
                       stride_mid_h, stride_mid_s, LV, True)
    else:
        p_m = (Mid + q_row[:, None] * stride_mid_m + head[:, None] * stride_mid_h
               + pid_s * stride_mid_s + col0 + cols[None, :])
        gl.store(p_m, acc0 * inv_l, mask=mask)
        gl.store(p_m + _DT, acc1 * inv_l, mask=mask)
        gl.store(p_m + 2 * _DT, acc2 * inv_l, mask=mask)
        gl.store(p_m + 3 * _DT, acc3 * inv_l, mask=mask)
        if WG == 0:
            _store_lse(lse, q_row, head, row_valid, Lse, Mid, pid_s, stride_lm, stride_lh, stride_mid_m,
                       stride_mid_h, stride_mid_s, LV, False)


@gluon.jit
def _converter_barriers(q_bar, ready, N_PARTS: gl.constexpr, KV_FP8: gl.constexpr):
    """The barriers of the converter warps (fp8 caches on the pair schedules): ``q_conv`` (Q
    is fp16 now) and ``staged`` (the fp8 bytes of a ring part landed, one per part, as
    ``ready``), initialized; for a bf16 cache ``q_bar`` and ``ready`` stand in (unused)."""
    if KV_FP8:
        q_conv = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        staged = gl.allocate_shared_memory(gl.int64, [N_PARTS, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_conv, count=1)
        for i in gl.static_range(N_PARTS):
            mbarrier.init(staged.index(i), count=1)
    else:
        q_conv = q_bar
        staged = ready
    return q_conv, staged


@gluon.jit
def _invalidate_converter_barriers(q_conv, staged, N_PARTS: gl.constexpr, KV_FP8: gl.constexpr):
    if KV_FP8:
        mbarrier.invalidate(q_conv)
        for i in gl.static_range(N_PARTS):
            mbarrier.invalidate(staged.index(i))


@gluon.jit(do_not_specialize=["stride_req_b", "stride_mid_m", "stride_mid_h", "stride_mid_s", "stride_om",
                              "stride_oh", "stride_lm", "stride_lh", "num_kv_splits", "qlen", "num_heads",
                              "page_size", "num_pages", "kv_capacity", "cp_rank", "num_rows"],
           do_not_specialize_on_alignment=["Qo_Indptr", "Tree_Mask"])
def _verify_stage1_alt(
    q_desc, k_desc, qk_scale, Req_to_Token, Seq_Lens, Real_Lens, Mid, O, Lse, K_Scale,
    stride_req_b, stride_mid_m, stride_mid_h, stride_mid_s, stride_om, stride_oh, stride_lm, stride_lh,
    num_kv_splits, qlen, num_heads, page_size, num_pages, kv_capacity, cp_rank,
    LV: gl.constexpr, LK: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    SPLIT_ALIGN: gl.constexpr, MIN_SPLIT_LEN: gl.constexpr, SINGLE: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, QK_FIRST: gl.constexpr = False,
    EARLY_RELEASE: gl.constexpr = False,
    CP_WORLD: gl.constexpr = 1, CP_INTERLEAVE: gl.constexpr = 1,
    Qo_Indptr=None, Tree_Mask=None, num_rows=None, VARLEN: gl.constexpr = False,
    HAS_TREE: gl.constexpr = False, BALANCE: gl.constexpr = 0, LAUNCH_DEPENDENTS: gl.constexpr = False, STAGE_OUT: gl.constexpr = False,
    NAMED_EXCHANGE: gl.constexpr = False,
    Timeline=None, TIMELINE: gl.constexpr = False,  # the CTA timeline probe (``_cta_mark``)
):
    """Stage 1 with the alternating schedule (same arguments as ``_verify_stage1_ws``;
    NUM_STAGES must be 2). An fp8 cache runs the converter partition (``_converter_pair``, 4
    warps, PRODUCER_REGS registers) instead of the producer warp. NAMED_EXCHANGE: each P
    passes between the groups on a named barrier (``_consumer_alt``)."""
    _launch_dependents(LAUNCH_DEPENDENTS)
    _cta_mark(Timeline, 0, TIMELINE)
    N_DT: gl.constexpr = LK // _DT
    TOK_BOX: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_BOX: gl.constexpr = q_desc.block_type.shape[1]
    if BALANCE:
        if not _holds_piece(Seq_Lens, Real_Lens, num_kv_splits, qlen, num_heads, kv_capacity, TOK_BOX, HEAD_BOX,
                            cp_rank, CP_WORLD, CP_INTERLEAVE, BALANCE):
            _cta_mark(Timeline, 1, TIMELINE)
            return
    KV_FP8: gl.constexpr = k_desc.dtype.is_fp8()
    q_smem, kv_smem, sp_smem = _pair_smem(q_desc, k_desc, LK, LV, BLOCK_N, NUM_STAGES)
    ROWS_L: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    sm_smem = gl.allocate_shared_memory(gl.float32, [_BM], ROWS_L)
    sa_smem = gl.allocate_shared_memory(gl.float32, [2, _BM], ROWS_L)
    sl_smem = gl.allocate_shared_memory(gl.float32, [2, _BM], ROWS_L)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())  # [stage * 2 + half]
    empty = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    l_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(l_bar, count=2)
    for i in gl.static_range(4):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)  # a half is released by the group whose V it is
    for i in gl.static_range(2):
        mbarrier.init(p_ready.index(i), count=1)
        mbarrier.init(p_free.index(i), count=2)
    q_conv, staged = _converter_barriers(q_bar, ready, 4, KV_FP8)

    # The consumer groups' arguments as in _verify_stage1_ws: the runtime values both take in one
    # tuple, then the rest. (The consumers' Q barrier: q_conv, which is q_bar for bf16.)
    shared = (q_smem, kv_smem, sp_smem, sm_smem, sa_smem, sl_smem, q_conv, ready, empty, p_ready, p_free, l_bar,
              Seq_Lens, Real_Lens, O, Lse, Mid, K_Scale, qk_scale, num_kv_splits, qlen, num_heads, Req_to_Token,
              stride_req_b, page_size, num_pages, kv_capacity, stride_om, stride_oh, stride_lm, stride_lh,
              stride_mid_m, stride_mid_h, stride_mid_s)
    gl.warp_specialize([
        (_consumer_alt, (0, shared, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, LV, SINGLE,
                         QK_FIRST, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, Tree_Mask, num_rows, VARLEN,
                         HAS_TREE, BALANCE, KV_FP8, EARLY_RELEASE, STAGE_OUT, NAMED_EXCHANGE)),
        (_consumer_alt, (1, shared, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, LV, SINGLE,
                         QK_FIRST, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, Tree_Mask, num_rows, VARLEN,
                         HAS_TREE, BALANCE, KV_FP8, EARLY_RELEASE, STAGE_OUT, NAMED_EXCHANGE)),
        (_fill_alt, (q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty, Req_to_Token,
                     Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size, kv_capacity,
                     TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, cp_rank, CP_WORLD,
                     CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE, KV_FP8)),
    ], [4, 4 if KV_FP8 else 1], [CONSUMER_REGS, PRODUCER_REGS])
    mbarrier.invalidate(q_bar)
    mbarrier.invalidate(l_bar)
    for i in gl.static_range(4):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(p_ready.index(i))
        mbarrier.invalidate(p_free.index(i))
    _invalidate_converter_barriers(q_conv, staged, 4, KV_FP8)
    _cta_mark(Timeline, 1, TIMELINE)


# ---------------------------------------------------------------------------------------------
# The swap-AB schedule (few rows: a request's qlen * H <= 32, H < 64). The other pair schedules
# give every wgmma the block's 64 rows as M, so 16 or 32 rows pay a 64-row MMA; here the 64 keys
# of a block are M and the R (16 or 32) rows are N:
#
#   S^T [64 keys, R] = K Q^T   (A: the ring's K tiles as they are; B: Q's first R rows, transposed)
#   O^T [256 columns, R] += V^T P^T   (A: the group's V tiles, transposed; B: P^T in shared memory)
#
# Each group computes the block's scores itself (2.4 MFLOP at R = 32, against 4.7 for a 64-row
# QK) and keeps the softmax state of every row, so nothing passes between the groups; a group
# owns O's columns [256 WG, 256 WG + 256). A ring half is released by both groups (count 2):
# the other group's half once my scores are done, mine once my P^T V^T is. The ring, Q's tiles
# and the producer warp are the alt kernel's (fp8: ``_converter_swapab``, below); the
# two P tiles hold the rope tile of Q (``sp_smem[1]``, read by every block's scores) and the two
# groups' P^T (``sp_smem[0]``, 4 KB each at R = 32).
# ---------------------------------------------------------------------------------------------


@gluon.jit
def _swapab_scores(q_smem, sp_smem, kv_smem, ready, s, ph, zero, R: gl.constexpr, BLOCK_N: gl.constexpr,
                   N_DT: gl.constexpr, MMA: gl.constexpr):
    """Issue ``S^T = K Q^T`` (``[BLOCK_N, R]``) of the block in stage ``s``, half 0 (tiles 0-3)
    then half 1 (tiles 4-7 and the rope tile); returns the in-flight accumulator."""
    HALF0: gl.constexpr = (N_DT - 1) // 2
    base = s * N_DT
    st = gl.zeros([BLOCK_N, R], gl.float32, MMA)
    mbarrier.wait(ready.index(2 * s), ph)
    for c in gl.static_range(HALF0):
        st = warpgroup_mma(kv_smem.index(base + c).reshape([BLOCK_N, _DT]),
                           q_smem.index(c + zero).reshape([_BM, _DT]).slice(0, R).permute((1, 0)), st,
                           is_async=True)
    mbarrier.wait(ready.index(2 * s + 1), ph)
    for c in gl.static_range(HALF0, N_DT - 1):
        st = warpgroup_mma(kv_smem.index(base + c).reshape([BLOCK_N, _DT]),
                           q_smem.index(c + zero).reshape([_BM, _DT]).slice(0, R).permute((1, 0)), st,
                           is_async=True)
    st = warpgroup_mma(kv_smem.index(base + N_DT - 1).reshape([BLOCK_N, _DT]),
                       sp_smem.index(1).slice(0, R).permute((1, 0)), st, is_async=True)
    return st


@gluon.jit
def _swapab_half_scores(WG: gl.constexpr, q_smem, sp_smem, kv_smem, ready, s, ph, zero, R: gl.constexpr,
                        BLOCK_N: gl.constexpr, N_DT: gl.constexpr, MMA: gl.constexpr):
    """``SPLIT_SCORES``: group WG's share of ``S^T = K Q^T`` for the block in stage ``s``, over
    the columns of its own ring half only (group 0: tiles 0-3; group 1: tiles 4-7 and the rope
    tile), the half whose V columns it multiplies; returns the in-flight partial."""
    HALF0: gl.constexpr = (N_DT - 1) // 2
    base = s * N_DT
    st = gl.zeros([BLOCK_N, R], gl.float32, MMA)
    mbarrier.wait(ready.index(2 * s + WG), ph)
    C0: gl.constexpr = 0 if WG == 0 else HALF0
    C1: gl.constexpr = HALF0 if WG == 0 else N_DT - 1
    for c in gl.static_range(C0, C1):
        st = warpgroup_mma(kv_smem.index(base + c).reshape([BLOCK_N, _DT]),
                           q_smem.index(c + zero).reshape([_BM, _DT]).slice(0, R).permute((1, 0)), st,
                           is_async=True)
    if WG == 1:
        st = warpgroup_mma(kv_smem.index(base + N_DT - 1).reshape([BLOCK_N, _DT]),
                           sp_smem.index(1).slice(0, R).permute((1, 0)), st, is_async=True)
    return st


@gluon.jit
def _partial_slot(q_smem, WG, slot, R: gl.constexpr):
    """``SPLIT_SCORES``: the fp32 ``[NU, KU, R]`` shared view (``[64, R]`` in NU units of KU
    keys) where group WG leaves its partial scores of a block with ``slot = j % 2``: rows
    32-63 of Q tiles ``(2 WG + slot) NU ...``, which a request of R <= 32 rows leaves unread
    (4 KB each; the fp8 converter stages there instead, so bf16 caches only)."""
    N_Q: gl.constexpr = q_smem.shape[0]
    KU: gl.constexpr = 1024 // R  # keys per 4 KB unit
    NU: gl.constexpr = _DT // KU
    X_L: gl.constexpr = gl.SwizzledSharedLayout(2, 1, 8, [2, 1, 0])
    q32 = q_smem.reinterpret(gl.float32, [N_Q // NU, NU, 2 * KU, R], X_L)
    return q32.index(2 * WG + slot).slice(KU, KU, dim=1)


@gluon.jit
def _exchange_scores(WG: gl.constexpr, st, q_smem, slot, R: gl.constexpr, MMA: gl.constexpr):
    """``SPLIT_SCORES``: the block's whole ``S^T`` from group WG's partial ``st``: each group
    stores its partial, both meet at named barrier 8 (256 threads), each adds the other's. The
    sum is commutative, so both groups hold the same scores (and the same P, row max and row
    sums). A slot is rewritten two blocks later, past the next block's meeting, which the
    reader reaches only after this read."""
    KU: gl.constexpr = 1024 // R
    NU: gl.constexpr = _DT // KU
    mine = gl.reshape(st, [NU, KU, R])
    _partial_slot(q_smem, WG, slot, R).store(mine)
    _named_barrier(False, 8)
    other = _partial_slot(q_smem, 1 - WG, slot, R).load(mine.type.layout)
    return st + gl.convert_layout(gl.reshape(other, [_DT, R]), MMA)


@gluon.jit
def _swapab_softmax(st, qk_scale, start, full_end, lim, m_i, l_i, BLOCK_N: gl.constexpr, KEY: gl.constexpr,
                    LEAN_SOFTMAX: gl.constexpr = 0, red=None):
    """One block's online softmax in the swap-AB layout (``st``: S^T ``[BLOCK_N keys, R rows]``):
    keys past a row's limit masked, returns ``(p, alpha, m_i, l_i)`` (P^T unnormalized, each
    row's rescale of its O^T column, the new running max and row sums). The keys are the
    wgmma's M, spread over the group's 4 warps, so each reduction over them crosses warps
    (triton's: two shared-memory rounds, three group barriers). LEAN_SOFTMAX >= 1: ``l_i`` is
    ``[BLOCK_N, R]``, the rows' sums kept per key and reduced once after the loop
    (``_swapab_row_sums``); 2: the row max too by ``_swapab_col_max`` (one barrier, ``red``)."""
    sc = st * qk_scale
    if start + BLOCK_N > full_end:  # keys past a row's limit or the split's end
        keys = start + gl.arange(0, BLOCK_N, layout=KEY)
        sc = gl.where(keys[:, None] < lim[None, :], sc, float("-inf"))
    if LEAN_SOFTMAX >= 2:
        m_new = gl.maximum(m_i, _swapab_col_max(sc, red))
    else:
        m_new = gl.maximum(m_i, gl.max(sc, axis=0))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(sc - m_safe[None, :])
    if LEAN_SOFTMAX >= 1:
        l_i = l_i * alpha[None, :] + p
    else:
        l_i = l_i * alpha + gl.sum(p, axis=0)
    return p, alpha, m_new, l_i


@gluon.constexpr_function
def _warp_partials_layout(rows):
    """The ``[4, R]`` layout of the 4 warps' partial maxima as ``_swapab_col_max`` reads them
    back: the 4 in each thread's registers, R spread as the swap-AB row vectors are
    (``rows``: the linear layout of ``SliceLayout(0, _wgmma_layout(R))``), so that their max
    over the 4 is that layout with no data movement."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, b[0]] for b in rows.reg_bases] + [[1, 0], [2, 0]],
        lane_bases=[[0, b[0]] for b in rows.lane_bases], warp_bases=[[0, b[0]] for b in rows.warp_bases],
        block_bases=[], shape=[4, rows.shape[0]])


@gluon.jit
def _swapab_col_max(sc, red):
    """The max over the keys of ``sc`` (``[64 keys, R]``, the wgmma accumulator layout, where
    warp w holds keys 16w..16w+15) with one group barrier: each warp's max over its own keys
    (shuffles), the 4 partials through ``red`` (the group's ``[4, R]`` fp32 shared tile, an
    allocation of its own so that no other shared access orders against it: the next block
    rewrites it only after the P^T barrier, which every warp passes after this read), each
    thread the max of the 4. Returns ``[R]`` along ``SliceLayout(0, layout of sc)``."""
    R: gl.constexpr = sc.shape[1]
    gl.static_assert(sc.shape[0] == 64)
    RQ: gl.constexpr = gl.SliceLayout(0, sc.type.layout)
    part = gl.max(gl.reshape(sc, [4, 16, R]), axis=1)  # [4, R]: warp w's max (the reshape keeps w on dim 0)
    red.store(part)
    _barrier()
    parts = red.load(_warp_partials_layout(gl.to_linear_layout(RQ, [R])))
    return gl.convert_layout(gl.max(parts, axis=0), RQ, assert_trivial=True)


@gluon.jit
def _swapab_row_sums(l_i, LEAN_SOFTMAX: gl.constexpr):
    """The rows' sums after the block loop: ``l_i`` itself, or (LEAN_SOFTMAX >= 1) its sum over the keys."""
    if LEAN_SOFTMAX >= 1:
        return gl.sum(l_i, axis=0)
    else:
        return l_i


@gluon.jit
def _swapab_epilogue(WG: gl.constexpr, own0, own1, own2, own3, l_i, m_i, v_scale, marked, O, Lse, Mid, row_base,
                     pid_s, tok0, head0, qlen, qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m,
                     stride_mid_h, stride_mid_s, HEAD_BOX: gl.constexpr, LV: gl.constexpr, SINGLE: gl.constexpr,
                     VARLEN: gl.constexpr, R: gl.constexpr, MMA: gl.constexpr, k_req, BALANCE: gl.constexpr,
                     n_slots):
    """``_swapab_out`` where ``_store_out`` would store (BALANCE: by the request's pieces)."""
    if BALANCE:
        if k_req == 1:
            _swapab_out(WG, own0, own1, own2, own3, l_i, m_i, v_scale, marked, O, Lse, Mid, row_base, pid_s,
                        tok0, head0, qlen, qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m,
                        stride_mid_h, stride_mid_s, HEAD_BOX, LV, True, VARLEN, R, MMA)
            if WG == 0:
                _fill_lse(float("inf"), Mid, row_base, 1, 2, tok0, head0, qlen, qlen_b, stride_mid_m,
                          stride_mid_h, stride_mid_s, HEAD_BOX, LV, VARLEN)
        elif pid_s < k_req:
            _swapab_out(WG, own0, own1, own2, own3, l_i, m_i, v_scale, marked, O, Lse, Mid, row_base, pid_s,
                        tok0, head0, qlen, qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m,
                        stride_mid_h, stride_mid_s, HEAD_BOX, LV, False, VARLEN, R, MMA)
            if WG == 0 and pid_s == k_req - 1:
                _fill_lse(float("-inf"), Mid, row_base, k_req, n_slots, tok0, head0, qlen, qlen_b, stride_mid_m,
                          stride_mid_h, stride_mid_s, HEAD_BOX, LV, VARLEN)
    else:
        _swapab_out(WG, own0, own1, own2, own3, l_i, m_i, v_scale, marked, O, Lse, Mid, row_base, pid_s, tok0,
                    head0, qlen, qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h,
                    stride_mid_s, HEAD_BOX, LV, SINGLE, VARLEN, R, MMA)


@gluon.jit
def _swapab_out(WG: gl.constexpr, own0, own1, own2, own3, l_i, m_i, v_scale, marked, O, Lse, Mid, row_base,
                pid_s, tok0, head0, qlen, qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m,
                stride_mid_h, stride_mid_s, HEAD_BOX: gl.constexpr, LV: gl.constexpr, SINGLE: gl.constexpr,
                VARLEN: gl.constexpr, R: gl.constexpr, MMA: gl.constexpr):
    """Group WG's columns of o (or the split's partial) from its four O^T tiles, and (group 0)
    the rows' lse: as ``_store_out`` for the swap-AB layout (rows along N)."""
    RQ: gl.constexpr = gl.SliceLayout(0, MMA)
    KEY: gl.constexpr = gl.SliceLayout(1, MMA)
    inv_l, lse = _final_scales(l_i, m_i, v_scale, marked)
    q_row, head, row_valid = _out_rows(gl.arange(0, R, layout=RQ), tok0, head0, qlen_b, row_base, qlen, HEAD_BOX,
                                       VARLEN)
    cols = gl.arange(0, _DT, layout=KEY)
    mask = row_valid[None, :] & (cols[:, None] < _DT)
    col0 = WG * (LV // 2)
    if SINGLE:
        base = (O + q_row * stride_om + head * stride_oh + col0)[None, :]
        DT: gl.constexpr = O.dtype.element_ty
    else:
        base = (Mid + q_row * stride_mid_m + head * stride_mid_h + pid_s * stride_mid_s + col0)[None, :]
        DT: gl.constexpr = gl.float32
    _swapab_store(own0, 0, inv_l, base, cols, mask, DT)
    _swapab_store(own1, 1, inv_l, base, cols, mask, DT)
    _swapab_store(own2, 2, inv_l, base, cols, mask, DT)
    _swapab_store(own3, 3, inv_l, base, cols, mask, DT)
    if WG == 0:
        _store_lse(lse, q_row, head, row_valid, Lse, Mid, pid_s, stride_lm, stride_lh, stride_mid_m, stride_mid_h,
                   stride_mid_s, LV, SINGLE)


@gluon.jit
def _swapab_store(acc, t: gl.constexpr, inv_l, base, cols, mask, DT: gl.constexpr):
    """Output tile ``t`` of a group (``acc``: O^T ``[64 columns, R rows]``) scaled by ``inv_l``
    to ``base`` (``[1, R]`` pointers of the rows' first column of this group) + ``cols``."""
    gl.store(base + t * _DT + cols[:, None], (acc * inv_l[None, :]).to(DT), mask=mask)


@gluon.jit
def _swapab_start(shared, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
                  MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, cp_rank, CP_WORLD: gl.constexpr,
                  CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows, VARLEN: gl.constexpr, BALANCE: gl.constexpr, KV_FP8: gl.constexpr,
                  RQ: gl.constexpr, R: gl.constexpr, SEGMENT: gl.constexpr = False, seg=None, q_phase=0):
    """A swap-AB consumer group's opening: ``_consumer_prologue``'s facts of the work item (the
    R rows' limits along ``RQ``; SEGMENT: the balanced grid's segment ``seg``, its Q in
    ``q_bar``'s phase ``q_phase``), then the score scale and ``v_scale`` (KV_FP8: ``k_scale``
    scales the scores of a dequantized cache, q . (k * k_scale), and o; else 1)."""
    (q_smem, kv_smem, sp_smem, q_bar, ready, empty, Seq_Lens, Real_Lens, O, Lse, Mid, K_Scale, qk_scale,
     num_kv_splits, qlen, num_heads, Req_to_Token, stride_req_b, page_size, num_pages, kv_capacity, stride_om,
     stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h, stride_mid_s) = shared
    gl.static_assert(TOK_BOX * HEAD_BOX == _BM)
    (pid_s, tok0, head0, seq_len, split_start, kv_end, full_end, n_blocks, row_base, qlen_b, lim,
     marked, k_req) = _consumer_prologue(q_bar, Seq_Lens, Real_Lens, Req_to_Token, stride_req_b, num_kv_splits, qlen,
                                  num_heads, page_size, num_pages, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN,
                                  MIN_SPLIT_LEN, BLOCK_N, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows,
                                  VARLEN, False, BALANCE, RQ, R, SEGMENT, seg, q_phase)
    if KV_FP8:
        v_scale = gl.load(K_Scale)
        qk_scale = qk_scale * v_scale
    else:
        v_scale = 1.0
    return (pid_s, tok0, head0, seq_len, split_start, kv_end, full_end, n_blocks, row_base, qlen_b, lim, marked,
            qk_scale, v_scale, k_req)


@gluon.jit
def _swapab_fresh(R: gl.constexpr, BLOCK_N: gl.constexpr, MMA: gl.constexpr, RQ: gl.constexpr,
                  LEAN_SOFTMAX: gl.constexpr):
    """A swap-AB group's state before a split's first block: its O^T half by 64 columns (four
    ``[64, R]`` zeros), the rows' sums (LEAN_SOFTMAX >= 1: by key, ``[BLOCK_N, R]``; see
    ``_swapab_softmax``) and running max. Returns ``(acc0, acc1, acc2, acc3, l_i, m_i)``."""
    if LEAN_SOFTMAX >= 1:
        l_i = gl.zeros([BLOCK_N, R], gl.float32, MMA)
    else:
        l_i = gl.zeros([R], gl.float32, RQ)
    return (gl.zeros([_DT, R], gl.float32, MMA), gl.zeros([_DT, R], gl.float32, MMA),
            gl.zeros([_DT, R], gl.float32, MMA), gl.zeros([_DT, R], gl.float32, MMA), l_i,
            gl.full([R], float("-inf"), gl.float32, RQ))


@gluon.jit
def _swapab_loop(WG: gl.constexpr, q_smem, kv_smem, sp_smem, ready, empty, pt, red, n_blocks, g0, split_start,
                 kv_end, full_end, lim, qk_scale, seq_len, acc0, acc1, acc2, acc3, m_i, l_i, BLOCK_N: gl.constexpr,
                 N_DT: gl.constexpr, V0: gl.constexpr, V_TILES: gl.constexpr, R: gl.constexpr, MMA: gl.constexpr,
                 KEY: gl.constexpr, SPLIT_SCORES: gl.constexpr, LEAN_SOFTMAX: gl.constexpr,
                 Q_FREE: gl.constexpr = False, q_free=None):
    """``_consumer_swapab``'s block loop over the split's ``n_blocks`` blocks, block j in ring
    stage ``(g0 + j) % 2`` (``g0``: the blocks the ring took before it, across the balanced
    grid's segments). Q_FREE: arrives on ``q_free`` once its last reads of Q are done (after
    the last block's scores), so that the next segment's Q may be loaded under the rest.
    Returns ``(acc0, acc1, acc2, acc3, m_i, l_i)``."""
    nz = (seq_len < 0).to(gl.int32)  # an opaque zero (see _consumer_alt)
    for j in range(n_blocks):
        zero = j * nz
        s = (g0 + j) % 2 + zero
        ph = ((g0 + j) // 2) & 1
        start = split_start + j * BLOCK_N
        if SPLIT_SCORES:
            st = _swapab_half_scores(WG, q_smem, sp_smem, kv_smem, ready, s, ph, zero, R, BLOCK_N, N_DT, MMA)
            st = warpgroup_mma_wait(0, deps=(st, ))
            st = _exchange_scores(WG, st, q_smem, (g0 + j) % 2 + zero, R, MMA)
        else:
            st = _swapab_scores(q_smem, sp_smem, kv_smem, ready, s, ph, zero, R, BLOCK_N, N_DT, MMA)
            st = warpgroup_mma_wait(0, deps=(st, ))
            mbarrier.arrive(empty.index(2 * s + 1 - WG), count=1)  # the other group's half: my scores are done
        if Q_FREE:  # (SPLIT_SCORES: the exchange through Q's unread rows is done too)
            if j == n_blocks - 1:
                mbarrier.arrive(q_free, count=1)  # my last reads of Q: the next segment's may land
        p, alpha, m_i, l_i = _swapab_softmax(st, qk_scale, start, full_end, lim, m_i, l_i, BLOCK_N, KEY,
                                             LEAN_SOFTMAX, red)
        acc0 = acc0 * alpha[None, :]
        acc1 = acc1 * alpha[None, :]
        acc2 = acc2 * alpha[None, :]
        acc3 = acc3 * alpha[None, :]
        if start + BLOCK_N > kv_end:
            # Keys past the end have P = 0, but V rows there may hold anything (0 * NaN). The
            # other group may still be reading these rows for its scores (without
            # SPLIT_SCORES): those are masked.
            _zero_v_tail(kv_smem, s * N_DT, V0, V_TILES, kv_end - start, BLOCK_N)
        pt.store(p.to(pt.dtype))
        fence_async_shared()
        _barrier()  # every warp's P^T rows written before the wgmmas read them
        vb = s * N_DT + V0
        t0 = warpgroup_mma(kv_smem.index(vb + 0).reshape([BLOCK_N, _DT]).permute((1, 0)), pt, acc0, is_async=True)
        t1 = warpgroup_mma(kv_smem.index(vb + 1).reshape([BLOCK_N, _DT]).permute((1, 0)), pt, acc1, is_async=True)
        t2 = warpgroup_mma(kv_smem.index(vb + 2).reshape([BLOCK_N, _DT]).permute((1, 0)), pt, acc2, is_async=True)
        t3 = warpgroup_mma(kv_smem.index(vb + 3).reshape([BLOCK_N, _DT]).permute((1, 0)), pt, acc3, is_async=True)
        acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))
        mbarrier.arrive(empty.index(2 * s + WG), count=1)  # my half: my P^T V^T is done with it
    return acc0, acc1, acc2, acc3, m_i, l_i


@gluon.jit
def _consumer_swapab(WG: gl.constexpr, shared, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr,
                     SPLIT_ALIGN: gl.constexpr, MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr,
                     N_DT: gl.constexpr, LV: gl.constexpr, SINGLE: gl.constexpr, cp_rank, CP_WORLD: gl.constexpr,
                     CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows, VARLEN: gl.constexpr, BALANCE: gl.constexpr, KV_FP8: gl.constexpr,
                     R: gl.constexpr, Timeline, TIMELINE: gl.constexpr, SPLIT_SCORES: gl.constexpr = False,
                     LEAN_SOFTMAX: gl.constexpr = 0, red_smem=None):
    """Consumer group WG of the swap-AB schedule (see above): every block's scores, the softmax
    of the R rows, and O^T's columns ``[WG * LV/2, (WG + 1) * LV/2)``. KV_FP8: the ring holds the
    fp16 blocks the converter warps wrote; ``k_scale`` scales the scores and o. SPLIT_SCORES
    (bf16): the group computes the scores over its own ring half's columns only and the two
    partials are summed through shared memory (``_exchange_scores``), so that each K tile and Q
    tile is read by one group instead of both; a ring half is then read by its group alone.
    LEAN_SOFTMAX (bf16): the softmax's reductions over the keys off the block's chain
    (``_swapab_softmax``; 2: ``red_smem`` ``[2, 4, R]``, a tile per group)."""
    (q_smem, kv_smem, sp_smem, q_bar, ready, empty, Seq_Lens, Real_Lens, O, Lse, Mid, K_Scale, qk_scale,
     num_kv_splits, qlen, num_heads, Req_to_Token, stride_req_b, page_size, num_pages, kv_capacity, stride_om,
     stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h, stride_mid_s) = shared
    MMA: gl.constexpr = _wgmma_layout(R)  # [64, R]: S^T, and O^T by 64 columns
    RQ: gl.constexpr = gl.SliceLayout(0, MMA)  # one value per row (query token, head)
    KEY: gl.constexpr = gl.SliceLayout(1, MMA)  # one per key of S^T, or per column of O^T
    V_TILES: gl.constexpr = LV // _DT // 2
    V0: gl.constexpr = WG * V_TILES
    (pid_s, tok0, head0, seq_len, split_start, kv_end, full_end, n_blocks, row_base, qlen_b, lim, marked, qk_scale,
     v_scale, k_req) = _swapab_start(shared, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, cp_rank, CP_WORLD,
                              CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, BALANCE, KV_FP8, RQ, R)
    if WG == 0:
        _cta_mark(Timeline, 3, TIMELINE)
    # My P^T: half of P tile 0 (tile 1 keeps Q's rope tile for every block's scores).
    PT_L: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=2 * R, element_bitwidth=16)
    pt = sp_smem.index(0).reinterpret(sp_smem.dtype, [2 * BLOCK_N, R], PT_L).slice(WG * BLOCK_N, BLOCK_N)
    acc0, acc1, acc2, acc3, l_i, m_i = _swapab_fresh(R, BLOCK_N, MMA, RQ, LEAN_SOFTMAX)
    if LEAN_SOFTMAX >= 2:
        red = red_smem.index(WG)
    else:
        red = None
    acc0, acc1, acc2, acc3, m_i, l_i = _swapab_loop(
        WG, q_smem, kv_smem, sp_smem, ready, empty, pt, red, n_blocks, 0, split_start, kv_end, full_end, lim,
        qk_scale, seq_len, acc0, acc1, acc2, acc3, m_i, l_i, BLOCK_N, N_DT, V0, V_TILES, R, MMA, KEY, SPLIT_SCORES,
        LEAN_SOFTMAX)

    if WG == 0:
        _cta_mark(Timeline, 4, TIMELINE)
    l_i = _swapab_row_sums(l_i, LEAN_SOFTMAX)
    _swapab_epilogue(WG, acc0, acc1, acc2, acc3, l_i, m_i, v_scale, marked, O, Lse, Mid, row_base, pid_s, tok0, head0,
                     qlen, qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h,
                     stride_mid_s, HEAD_BOX, LV, SINGLE, VARLEN, R, MMA, k_req, BALANCE, num_kv_splits)
    if WG == 0:
        _cta_mark(Timeline, 5, TIMELINE)


@gluon.jit
def _consumer_swapab_grid(WG: gl.constexpr, shared, q_free, batch, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr,
                          SPLIT_ALIGN: gl.constexpr, MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr,
                          N_DT: gl.constexpr, LV: gl.constexpr, R: gl.constexpr, REQUEST_COST: gl.constexpr,
                          SPLIT_SCORES: gl.constexpr = False, LEAN_SOFTMAX: gl.constexpr = 0, red_smem=None,
                          Timeline=None, TIMELINE: gl.constexpr = False):
    """Consumer group WG of the swap-AB schedule on the balanced grid (``_verify_stage1_swapab``
    with GRID): ``_consumer_swapab``'s work for each of this CTA's segments in turn, the ring's
    blocks counted across them; after a segment's last scores the group arrives on ``q_free``,
    so that the producer loads the next segment's Q (and its first blocks) under this one's
    P.V and output. Each segment's output goes where a balanced launch's piece would
    (``_swapab_epilogue``: straight to o for a request of one segment). The timeline probe
    (``_cta_mark``): 3 when the first segment's Q landed, 4 and 5 when each segment's loop ended
    and its output was stored (the last segment's remain); the first segments' own marks
    (``_cta_mark_segment``)."""
    (q_smem, kv_smem, sp_smem, q_bar, ready, empty, Seq_Lens, Real_Lens, O, Lse, Mid, K_Scale, qk_scale,
     num_kv_splits, qlen, num_heads, Req_to_Token, stride_req_b, page_size, num_pages, kv_capacity, stride_om,
     stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h, stride_mid_s) = shared
    MMA: gl.constexpr = _wgmma_layout(R)
    RQ: gl.constexpr = gl.SliceLayout(0, MMA)
    KEY: gl.constexpr = gl.SliceLayout(1, MMA)
    V_TILES: gl.constexpr = LV // _DT // 2
    V0: gl.constexpr = WG * V_TILES
    PT_L: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=2 * R, element_bitwidth=16)
    pt = sp_smem.index(0).reinterpret(sp_smem.dtype, [2 * BLOCK_N, R], PT_L).slice(WG * BLOCK_N, BLOCK_N)
    if LEAN_SOFTMAX >= 2:
        red = red_smem.index(WG)
    else:
        red = None
    r0, r1, u0, lo, hi, g, units = _grid_requests(Seq_Lens, Real_Lens, batch, num_kv_splits, kv_capacity, BLOCK_N,
                                                  REQUEST_COST)
    blocks = r0 * 0  # the ring's blocks before this segment
    for r in range(r0, r1):
        seg, u0 = _grid_segment(Seq_Lens, Real_Lens, r, u0, lo, hi, g, units, kv_capacity, BLOCK_N, REQUEST_COST)
        (pid_s, tok0, head0, seq_len, split_start, kv_end, full_end, n_blocks, row_base, qlen_b, lim, marked,
         qk_scale_r, v_scale, k_req) = _swapab_start(shared, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N,
                                                     None, 1, 1, None, None, False, 0, False, RQ, R, True, seg,
                                                     (r - r0) & 1)
        if WG == 0:
            if r == r0:
                _cta_mark(Timeline, 3, TIMELINE)
            _cta_mark_segment(Timeline, r - r0, 2, TIMELINE)
        acc0, acc1, acc2, acc3, l_i, m_i = _swapab_fresh(R, BLOCK_N, MMA, RQ, LEAN_SOFTMAX)
        acc0, acc1, acc2, acc3, m_i, l_i = _swapab_loop(
            WG, q_smem, kv_smem, sp_smem, ready, empty, pt, red, n_blocks, blocks, split_start, kv_end, full_end,
            lim, qk_scale_r, seq_len, acc0, acc1, acc2, acc3, m_i, l_i, BLOCK_N, N_DT, V0, V_TILES, R, MMA, KEY,
            SPLIT_SCORES, LEAN_SOFTMAX, True, q_free)
        if n_blocks == 0:
            mbarrier.arrive(q_free, count=1)  # (a segment without blocks reads no Q)
        blocks += n_blocks
        if WG == 0:
            _cta_mark(Timeline, 4, TIMELINE)
            _cta_mark_segment(Timeline, r - r0, 3, TIMELINE)
        l_i = _swapab_row_sums(l_i, LEAN_SOFTMAX)
        _swapab_epilogue(WG, acc0, acc1, acc2, acc3, l_i, m_i, v_scale, marked, O, Lse, Mid, row_base, pid_s, tok0,
                         head0, qlen, qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h,
                         stride_mid_s, HEAD_BOX, LV, False, False, R, MMA, k_req, 1, num_kv_splits)
        if WG == 0:
            _cta_mark(Timeline, 5, TIMELINE)
            _cta_mark_segment(Timeline, r - r0, 4, TIMELINE)


@gluon.jit
def _producer_grid(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_free, ready, empty, Req_to_Token, Seq_Lens,
                   Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size, kv_capacity, batch,
                   TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
                   MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, N_DT: gl.constexpr,
                   REQUEST_COST: gl.constexpr, Timeline, TIMELINE: gl.constexpr):
    """The alt producer warp on the balanced grid, for each of this CTA's segments: its Q once
    both groups are done reading the previous one's (``q_free``), then its blocks into the
    ring, counted across segments. The next segment's facts (its lengths, work item and first
    page) are read as soon as this one's last block is issued, under the ring's last two
    blocks. The timeline probe marks each segment's Q and first block requested
    (``_cta_mark_segment``). (A segment's first block before its Q, from the first or the
    second segment on, was slower: NOTES.md, the balanced grid.)"""
    r0, r1, u0, lo, hi, g, units = _grid_requests(Seq_Lens, Real_Lens, batch, num_kv_splits, kv_capacity, BLOCK_N,
                                                  REQUEST_COST)
    seg, u0 = _grid_segment(Seq_Lens, Real_Lens, r0, u0, lo, hi, g, units, kv_capacity, BLOCK_N, REQUEST_COST,
                            r0 < r1)
    item = _grid_fill_item(Seq_Lens, Real_Lens, Req_to_Token, stride_req_b, num_kv_splits, qlen, num_heads, page_size,
                           kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, seg, r0 < r1)
    blocks = r0 * 0
    for r in range(r0, r1):
        split_start, n_blocks, req_row, pid_b, tok0, head0, page = item
        mbarrier.wait(q_free, ((r - r0) & 1) ^ 1, pred=r > r0)
        _pair_load_q(q_desc, q_smem, sp_smem, q_bar, 1, pid_b, qlen, tok0, head0, N_DT, False)  # (whatever its blocks)
        _cta_mark_segment(Timeline, r - r0, 0, TIMELINE)
        if n_blocks > 0:
            _alt_block(k_desc, kv_smem, ready, empty, blocks, page, split_start % page_size, N_DT)
            _cta_mark_segment(Timeline, r - r0, 1, TIMELINE)
        _alt_blocks(k_desc, kv_smem, ready, empty, Req_to_Token, req_row, split_start + BLOCK_N,
                    gl.maximum(n_blocks - 1, 0), page_size, blocks + 1, BLOCK_N, N_DT)
        blocks += n_blocks
        seg, u0 = _grid_segment(Seq_Lens, Real_Lens, r + 1, u0, lo, hi, g, units, kv_capacity, BLOCK_N,
                                REQUEST_COST, r + 1 < r1)
        item = _grid_fill_item(Seq_Lens, Real_Lens, Req_to_Token, stride_req_b, num_kv_splits, qlen, num_heads,
                               page_size, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, seg,
                               r + 1 < r1)


@gluon.jit
def _grid_fill_item(Seq_Lens, Real_Lens, Req_to_Token, stride_req_b, num_kv_splits, qlen, num_heads, page_size,
                    kv_capacity, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
                    MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, seg, valid):
    """What the balanced grid's producer needs of segment ``seg``: ``(split_start, n_blocks,
    req_row, pid_b, tok0, head0, page)``, its first key, its blocks, its request's row of the
    block table, the request, Q's first token and head in it and its first block's page
    (nothing read where not ``valid``)."""
    (pid_b, pid_s, tok0, head0, seq_len, real_len, split_start, kv_end, full_end, max_lim, n_blocks,
     split_end, req_lim, len_bad, row_base, qlen_b, k_req) = _work(
        Seq_Lens, Real_Lens, num_kv_splits, qlen, num_heads, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN,
        MIN_SPLIT_LEN, BLOCK_N, None, 1, 1, None, None, False, False, 0, True, seg)
    n_blocks = gl.where(valid, n_blocks, 0)
    req_row = pid_b.to(gl.int64) * stride_req_b
    page = gl.load(Req_to_Token + req_row + split_start // page_size, mask=n_blocks > 0, other=0)
    return split_start, n_blocks, req_row, pid_b, tok0, head0, page


@gluon.jit
def _x_tile(kv_smem, WG: gl.constexpr, t: gl.constexpr, R: gl.constexpr):
    """The fp32 ``[64, R]`` shared tile where group WG leaves O^T tile ``t`` (0-3) of the other
    group's columns for the merge (``ALT_BLOCKS``): inside WG's own ring stage, which only WG
    reads and nothing refills past its last block."""
    N_X: gl.constexpr = kv_smem.shape[0] * kv_smem.shape[2] * kv_smem.shape[3] // (2 * _DT * R)
    X_L: gl.constexpr = gl.SwizzledSharedLayout(2, 1, 8, [1, 0])
    return kv_smem.reinterpret(gl.float32, [N_X, _DT, R], X_L).index(WG * (N_X // 2) + t)


@gluon.jit
def _consumer_swapab_blocks(WG: gl.constexpr, shared, sx_smem, x_bar, TOK_BOX: gl.constexpr,
                            HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr, MIN_SPLIT_LEN: gl.constexpr,
                            BLOCK_N: gl.constexpr, N_DT: gl.constexpr, LV: gl.constexpr, SINGLE: gl.constexpr,
                            cp_rank, CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows,
                            VARLEN: gl.constexpr, BALANCE: gl.constexpr, KV_FP8: gl.constexpr, R: gl.constexpr):
    """Consumer group WG of the swap-AB schedule with ``ALT_BLOCKS``: the blocks of ring stage
    WG (j = WG, WG + 2, ...), their scores, softmax and all of O^T's 512 columns (eight
    ``[64, R]`` accumulators), so that each block's scores are computed once and one group's
    softmax runs under the other's wgmmas. At the end each group leaves its row max, row sums
    and the other group's columns in shared memory (``sx_smem``, ``_x_tile``), and stores its
    own columns of the merged partial, as ``_consumer_swapab`` does."""
    (q_smem, kv_smem, sp_smem, q_bar, ready, empty, Seq_Lens, Real_Lens, O, Lse, Mid, K_Scale, qk_scale,
     num_kv_splits, qlen, num_heads, Req_to_Token, stride_req_b, page_size, num_pages, kv_capacity, stride_om,
     stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h, stride_mid_s) = shared
    MMA: gl.constexpr = _wgmma_layout(R)
    RQ: gl.constexpr = gl.SliceLayout(0, MMA)
    KEY: gl.constexpr = gl.SliceLayout(1, MMA)
    V_TILES: gl.constexpr = LV // _DT
    (pid_s, tok0, head0, seq_len, split_start, kv_end, full_end, n_blocks, row_base, qlen_b, lim, marked, qk_scale,
     v_scale, k_req) = _swapab_start(shared, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, cp_rank, CP_WORLD,
                              CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, BALANCE, KV_FP8, RQ, R)
    PT_L: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=2 * R, element_bitwidth=16)
    pt = sp_smem.index(0).reinterpret(sp_smem.dtype, [2 * BLOCK_N, R], PT_L).slice(WG * BLOCK_N, BLOCK_N)
    acc0 = gl.zeros([_DT, R], gl.float32, MMA)  # O^T by 64 columns, all eight
    acc1 = gl.zeros([_DT, R], gl.float32, MMA)
    acc2 = gl.zeros([_DT, R], gl.float32, MMA)
    acc3 = gl.zeros([_DT, R], gl.float32, MMA)
    acc4 = gl.zeros([_DT, R], gl.float32, MMA)
    acc5 = gl.zeros([_DT, R], gl.float32, MMA)
    acc6 = gl.zeros([_DT, R], gl.float32, MMA)
    acc7 = gl.zeros([_DT, R], gl.float32, MMA)
    l_i = gl.zeros([R], gl.float32, RQ)
    m_i = gl.full([R], float("-inf"), gl.float32, RQ)
    nz = (seq_len < 0).to(gl.int32)  # an opaque zero (see _consumer_alt)
    for j in range(WG, n_blocks, 2):
        zero = j * nz
        s = WG + zero
        ph = (j // 2) & 1
        start = split_start + j * BLOCK_N
        st = _swapab_scores(q_smem, sp_smem, kv_smem, ready, s, ph, zero, R, BLOCK_N, N_DT, MMA)
        st = warpgroup_mma_wait(0, deps=(st, ))
        p, alpha, m_i, l_i = _swapab_softmax(st, qk_scale, start, full_end, lim, m_i, l_i, BLOCK_N, KEY)
        acc0 = acc0 * alpha[None, :]
        acc1 = acc1 * alpha[None, :]
        acc2 = acc2 * alpha[None, :]
        acc3 = acc3 * alpha[None, :]
        acc4 = acc4 * alpha[None, :]
        acc5 = acc5 * alpha[None, :]
        acc6 = acc6 * alpha[None, :]
        acc7 = acc7 * alpha[None, :]
        if start + BLOCK_N > kv_end:  # V rows past the end may hold anything (0 * NaN)
            _zero_v_tail(kv_smem, s * N_DT, 0, V_TILES, kv_end - start, BLOCK_N)
        pt.store(p.to(pt.dtype))
        fence_async_shared()
        _barrier()  # every warp's P^T rows written before the wgmmas read them
        vb = s * N_DT
        t0 = warpgroup_mma(kv_smem.index(vb + 0).reshape([BLOCK_N, _DT]).permute((1, 0)), pt, acc0, is_async=True)
        t1 = warpgroup_mma(kv_smem.index(vb + 1).reshape([BLOCK_N, _DT]).permute((1, 0)), pt, acc1, is_async=True)
        t2 = warpgroup_mma(kv_smem.index(vb + 2).reshape([BLOCK_N, _DT]).permute((1, 0)), pt, acc2, is_async=True)
        t3 = warpgroup_mma(kv_smem.index(vb + 3).reshape([BLOCK_N, _DT]).permute((1, 0)), pt, acc3, is_async=True)
        t4 = warpgroup_mma(kv_smem.index(vb + 4).reshape([BLOCK_N, _DT]).permute((1, 0)), pt, acc4, is_async=True)
        t5 = warpgroup_mma(kv_smem.index(vb + 5).reshape([BLOCK_N, _DT]).permute((1, 0)), pt, acc5, is_async=True)
        t6 = warpgroup_mma(kv_smem.index(vb + 6).reshape([BLOCK_N, _DT]).permute((1, 0)), pt, acc6, is_async=True)
        t7 = warpgroup_mma(kv_smem.index(vb + 7).reshape([BLOCK_N, _DT]).permute((1, 0)), pt, acc7, is_async=True)
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = warpgroup_mma_wait(
            0, deps=(t0, t1, t2, t3, t4, t5, t6, t7))
        mbarrier.arrive(empty.index(2 * s), count=1)  # the block's stage goes back whole
        mbarrier.arrive(empty.index(2 * s + 1), count=1)

    # The merge of the two groups' halves of the split: m and l, and the other group's columns.
    if WG == 0:
        x0, x1, x2, x3 = acc4, acc5, acc6, acc7
        own0, own1, own2, own3 = acc0, acc1, acc2, acc3
    else:
        x0, x1, x2, x3 = acc0, acc1, acc2, acc3
        own0, own1, own2, own3 = acc4, acc5, acc6, acc7
    _x_tile(kv_smem, WG, 0, R).store(x0)
    _x_tile(kv_smem, WG, 1, R).store(x1)
    _x_tile(kv_smem, WG, 2, R).store(x2)
    _x_tile(kv_smem, WG, 3, R).store(x3)
    sx_smem.index(WG).store(m_i)
    sx_smem.index(2 + WG).store(l_i)
    mbarrier.arrive(x_bar, count=1)
    mbarrier.wait(x_bar, 0)
    m_o = sx_smem.index(1 - WG).load(RQ)
    l_o = sx_smem.index(3 - WG).load(RQ)
    m_t = gl.maximum(m_i, m_o)
    m_safe = gl.where(m_t == float("-inf"), 0.0, m_t)
    a_me = gl.exp2(m_i - m_safe)
    a_o = gl.exp2(m_o - m_safe)
    l_t = l_i * a_me + l_o * a_o
    own0 = own0 * a_me[None, :] + _x_tile(kv_smem, 1 - WG, 0, R).load(MMA) * a_o[None, :]
    own1 = own1 * a_me[None, :] + _x_tile(kv_smem, 1 - WG, 1, R).load(MMA) * a_o[None, :]
    own2 = own2 * a_me[None, :] + _x_tile(kv_smem, 1 - WG, 2, R).load(MMA) * a_o[None, :]
    own3 = own3 * a_me[None, :] + _x_tile(kv_smem, 1 - WG, 3, R).load(MMA) * a_o[None, :]

    _swapab_epilogue(WG, own0, own1, own2, own3, l_t, m_t, v_scale, marked, O, Lse, Mid, row_base, pid_s, tok0, head0,
                     qlen, qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h,
                     stride_mid_s, HEAD_BOX, LV, SINGLE, VARLEN, R, MMA, k_req, BALANCE, num_kv_splits)


@gluon.jit(do_not_specialize=["stride_req_b", "stride_mid_m", "stride_mid_h", "stride_mid_s", "stride_om",
                              "stride_oh", "stride_lm", "stride_lh", "num_kv_splits", "qlen", "num_heads",
                              "page_size", "num_pages", "kv_capacity", "cp_rank", "num_rows", "batch"],
           do_not_specialize_on_alignment=["Qo_Indptr"])
def _verify_stage1_swapab(
    q_desc, k_desc, qk_scale, Req_to_Token, Seq_Lens, Real_Lens, Mid, O, Lse, K_Scale,
    stride_req_b, stride_mid_m, stride_mid_h, stride_mid_s, stride_om, stride_oh, stride_lm, stride_lh,
    num_kv_splits, qlen, num_heads, page_size, num_pages, kv_capacity, cp_rank,
    LV: gl.constexpr, LK: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    SPLIT_ALIGN: gl.constexpr, MIN_SPLIT_LEN: gl.constexpr, SINGLE: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, ROWS: gl.constexpr = 32,
    CP_WORLD: gl.constexpr = 1, CP_INTERLEAVE: gl.constexpr = 1,
    Qo_Indptr=None, num_rows=None, VARLEN: gl.constexpr = False, LAUNCH_DEPENDENTS: gl.constexpr = False,
    ALT_BLOCKS: gl.constexpr = False, BALANCE: gl.constexpr = 0, SPLIT_SCORES: gl.constexpr = False,
    LEAN_SOFTMAX: gl.constexpr = 0,  # the softmax's reductions off the block's chain (``_swapab_softmax``)
    Timeline=None, TIMELINE: gl.constexpr = False,  # the CTA timeline probe (``_cta_mark``)
    GRID: gl.constexpr = False, REQUEST_COST: gl.constexpr = 2, batch=None,  # the balanced grid (``splits.py``)
):
    """Stage 1 with the swap-AB schedule (the arguments of ``_verify_stage1_alt`` but draft
    trees; NUM_STAGES must be 2): ROWS (16 or 32) >= the request's qlen * H rows, which are the
    first of its one 64-row block. An fp8 cache runs the staging converter partition. ALT_BLOCKS:
    the groups take alternate blocks, each with all of O^T (``_consumer_swapab_blocks``), instead
    of every block's scores for half of O^T each. SPLIT_SCORES (bf16, not with ALT_BLOCKS): each
    group the scores over its ring half's columns, the partials summed through shared memory.
    LEAN_SOFTMAX (bf16, not with ALT_BLOCKS): 1 the rows' sums reduced once after the loop, 2 and the
    row max with one group barrier a block (``_swapab_softmax``). GRID (bf16, not with ALT_BLOCKS,
    ragged rows or context parallelism; a split workspace): the balanced grid of ``splits.py``,
    each CTA the ``batch`` requests' blocks of its unit range, a segment per request it meets
    (``_consumer_swapab_grid``, ``_producer_grid``); REQUEST_COST: the units a request costs
    beside its blocks."""
    _launch_dependents(LAUNCH_DEPENDENTS)
    _cta_mark(Timeline, 0, TIMELINE)
    N_DT: gl.constexpr = LK // _DT
    TOK_BOX: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_BOX: gl.constexpr = q_desc.block_type.shape[1]
    if BALANCE:
        if not _holds_piece(Seq_Lens, Real_Lens, num_kv_splits, qlen, num_heads, kv_capacity, TOK_BOX, HEAD_BOX,
                            cp_rank, CP_WORLD, CP_INTERLEAVE, BALANCE):
            _cta_mark(Timeline, 1, TIMELINE)
            return
    KV_FP8: gl.constexpr = k_desc.dtype.is_fp8()
    gl.static_assert(ROWS == 16 or ROWS == 32)
    gl.static_assert(not SPLIT_SCORES or not (KV_FP8 or ALT_BLOCKS))
    gl.static_assert(LEAN_SOFTMAX == 0 or not (KV_FP8 or ALT_BLOCKS))
    gl.static_assert(not GRID or not (KV_FP8 or ALT_BLOCKS or VARLEN or SINGLE or BALANCE or CP_WORLD > 1))
    q_smem, kv_smem, sp_smem = _pair_smem(q_desc, k_desc, LK, LV, BLOCK_N, NUM_STAGES)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())  # [stage * 2 + half]
    empty = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(4):
        mbarrier.init(ready.index(i), count=1)
        # both groups read every tile (scores); with ALT_BLOCKS a stage is one group's, with
        # SPLIT_SCORES a half is one group's
        mbarrier.init(empty.index(i), count=1 if ALT_BLOCKS or SPLIT_SCORES else 2)
    q_conv, staged = _converter_barriers(q_bar, ready, 6, KV_FP8)  # 4 ring parts, 2 staging halves

    shared = (q_smem, kv_smem, sp_smem, q_conv, ready, empty, Seq_Lens, Real_Lens, O, Lse, Mid, K_Scale, qk_scale,
              num_kv_splits, qlen, num_heads, Req_to_Token, stride_req_b, page_size, num_pages, kv_capacity,
              stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h, stride_mid_s)
    if ALT_BLOCKS:
        # the merge's row max and row sums of both groups: [m0, m1, l0, l1]
        sx_smem = gl.allocate_shared_memory(gl.float32, [4, ROWS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        x_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(x_bar, count=2)
        gl.warp_specialize([
            (_consumer_swapab_blocks, (0, shared, sx_smem, x_bar, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN,
                                       BLOCK_N, N_DT, LV, SINGLE, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr,
                                       num_rows, VARLEN, BALANCE, KV_FP8, ROWS)),
            (_consumer_swapab_blocks, (1, shared, sx_smem, x_bar, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN,
                                       BLOCK_N, N_DT, LV, SINGLE, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr,
                                       num_rows, VARLEN, BALANCE, KV_FP8, ROWS)),
            (_fill_swapab, (q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty,
                            Req_to_Token, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads,
                            page_size, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT,
                            cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, BALANCE, KV_FP8)),
        ], [4, 4 if KV_FP8 else 1], [CONSUMER_REGS, PRODUCER_REGS])
        mbarrier.invalidate(x_bar)
    elif GRID:
        if LEAN_SOFTMAX >= 2:
            red_smem = gl.allocate_shared_memory(gl.float32, [2, 4, ROWS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        else:
            red_smem = sp_smem
        q_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_free, count=2)  # both groups done reading a segment's Q
        gl.warp_specialize([
            (_consumer_swapab_grid, (0, shared, q_free, batch, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N,
                                     N_DT, LV, ROWS, REQUEST_COST, SPLIT_SCORES, LEAN_SOFTMAX, red_smem, Timeline,
                                     TIMELINE)),
            (_consumer_swapab_grid, (1, shared, q_free, batch, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N,
                                     N_DT, LV, ROWS, REQUEST_COST, SPLIT_SCORES, LEAN_SOFTMAX, red_smem, Timeline,
                                     TIMELINE)),
            (_producer_grid, (q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_free, ready, empty, Req_to_Token,
                              Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size,
                              kv_capacity, batch, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT,
                              REQUEST_COST, Timeline, TIMELINE)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
        mbarrier.invalidate(q_free)
    else:
        if LEAN_SOFTMAX >= 2:  # each group's 4 warps' partial row maxima (_swapab_col_max)
            red_smem = gl.allocate_shared_memory(gl.float32, [2, 4, ROWS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        else:
            red_smem = sp_smem  # unread (a partition's arguments cannot be None)
        gl.warp_specialize([
            (_consumer_swapab, (0, shared, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, LV, SINGLE,
                                cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, BALANCE, KV_FP8, ROWS, Timeline,
                                TIMELINE, SPLIT_SCORES, LEAN_SOFTMAX, red_smem)),
            (_consumer_swapab, (1, shared, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, LV, SINGLE,
                                cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, BALANCE, KV_FP8, ROWS, Timeline,
                                TIMELINE, SPLIT_SCORES, LEAN_SOFTMAX, red_smem)),
            (_fill_swapab, (q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty,
                            Req_to_Token, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads,
                            page_size, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT,
                            cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, BALANCE, KV_FP8)),
        ], [4, 4 if KV_FP8 else 1], [CONSUMER_REGS, PRODUCER_REGS])
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(4):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
    _invalidate_converter_barriers(q_conv, staged, 6, KV_FP8)
    _cta_mark(Timeline, 1, TIMELINE)


# fp8 caches on the swap-AB schedule. The alt converter stages each fp8 half block in the ring
# half it will occupy, so a half is refilled only after both groups released it: release -> TMA
# -> conversion -> ready, one HBM round trip on every block's path. Here the request's R <= 32
# rows leave the upper 32 rows of every Q tile and of P tile 1 unread (9 x 4 KB: one fp8 block),
# so blocks from 2 on are staged there as soon as the previous one is converted out of them, and
# a released ring half waits only for its conversion. Blocks 0 and 1 (the ring is free, Q's
# copy is still landing in the staging rows) are staged in place as in ``_converter_pair``.


@gluon.jit
def _staging_tile(q_smem, sp_smem, c: gl.constexpr, k_desc, BLOCK_N: gl.constexpr):
    """fp8 staging tile ``c`` (column tile ``c`` of a block, 4 KB) of the swap-AB converter:
    rows 32-63 of Q tile ``c``, or of P tile 1 for the rope tile (``c = 8``)."""
    N_Q: gl.constexpr = q_smem.shape[0]
    if c < N_Q:
        q8 = q_smem.reinterpret(k_desc.dtype, [2 * N_Q, 1, BLOCK_N, _DT], k_desc.layout)
        t = q8.index(2 * c + 1)
    else:
        p8 = sp_smem.reinterpret(k_desc.dtype, [4, 1, BLOCK_N, _DT], k_desc.layout)
        t = p8.index(3)
    return t


@gluon.jit
def _stage_swapab(k_desc, q_smem, sp_smem, bar, h: gl.constexpr, page, tok, HALF0: gl.constexpr,
                  BLOCK_N: gl.constexpr):
    """TMA of half ``h`` of the fp8 block at (``page``, ``tok``) into its staging tiles."""
    N_DT: gl.constexpr = q_smem.shape[0] + 1
    T0: gl.constexpr = 0 if h == 0 else HALF0
    C: gl.constexpr = HALF0 if h == 0 else N_DT - HALF0
    mbarrier.expect(bar, C * k_desc.block_type.nbytes)
    for c in gl.static_range(C):
        tma.async_load(k_desc, [page, tok, (T0 + c) * _DT], bar, _staging_tile(q_smem, sp_smem, T0 + c, k_desc,
                                                                                 BLOCK_N))


@gluon.jit
def _dequant_staged(q_smem, sp_smem, kv_smem, s, h: gl.constexpr, HALF0: gl.constexpr, k_desc,
                    BLOCK_N: gl.constexpr):
    """Half ``h`` of the staged fp8 block -> its fp16 tiles in ring stage ``s``, a tile per step,
    the next tile's fp8 loads issued before this tile's fp16 stores (different buffers: no
    barrier between a step's loads and its stores; the compiler's barrier before each store,
    whose predecessor wrote the same ring, then waits with the next loads in flight)."""
    N_DT: gl.constexpr = q_smem.shape[0] + 1
    T0: gl.constexpr = 0 if h == 0 else HALF0
    C: gl.constexpr = HALF0 if h == 0 else N_DT - HALF0
    CV_L: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [gl.num_warps(), 1], [1, 0])  # 16 B of fp8 per load
    g0 = s * N_DT + T0
    x = _staging_tile(q_smem, sp_smem, T0, k_desc, BLOCK_N).reshape([BLOCK_N, _DT]).load(CV_L)
    for c in gl.static_range(C):
        y = x.to(gl.float16)
        if c + 1 < C:
            x = _staging_tile(q_smem, sp_smem, T0 + c + 1, k_desc, BLOCK_N).reshape([BLOCK_N, _DT]).load(CV_L)
        kv_smem.index(g0 + c).reshape([BLOCK_N, _DT]).store(y)


@gluon.jit
def _converter_swapab(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty,
                      Req_to_Token, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size,
                      kv_capacity, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
                      MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, N_DT: gl.constexpr, cp_rank,
                      CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows,
                      VARLEN: gl.constexpr, BALANCE: gl.constexpr):
    """4 warps (fp8 caches, swap-AB schedule; see above): Q and blocks 0 and 1 as in
    ``_converter_pair`` (``staged[0..3]``: the ring's parts), Q to fp16, then block 2 into the
    staging tiles (``staged[4 + h]``); block i >= 2's half h is dequantized from there into its
    ring half once both groups released it, and block i + 1's half h staged right after."""
    split_start, n_blocks, req_row = _converter_start(
        q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, Req_to_Token, Seq_Lens, Real_Lens,
        stride_req_b, num_kv_splits, qlen, num_heads, page_size, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN,
        MIN_SPLIT_LEN, BLOCK_N, N_DT, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN,
        False, BALANCE, False, True)
    HALF0: gl.constexpr = (N_DT - 1) // 2  # tiles in half 0 (4); half 1 has the rest (5)
    for i in range(n_blocks):
        s = i % 2
        start1 = split_start + (i + 1) * BLOCK_N
        more = (i >= 2) & (i + 1 < n_blocks)  # block i + 1 goes to the staging tiles after block i
        page1 = gl.load(Req_to_Token + req_row + start1 // page_size, mask=more, other=0)
        for h in gl.static_range(2):
            if i < 2:
                mbarrier.wait(staged.index(2 * s + h), 0)
                if h == 0:
                    _dequant_part(kv_smem, s, 0, HALF0, k_desc, BLOCK_N)
                else:
                    _dequant_part(kv_smem, s, HALF0, N_DT - HALF0, k_desc, BLOCK_N)
            else:
                mbarrier.wait(staged.index(4 + h), i & 1)
                mbarrier.wait(empty.index(2 * s + h), ((i // 2) & 1) ^ 1)
                _dequant_staged(q_smem, sp_smem, kv_smem, s, h, HALF0, k_desc, BLOCK_N)
            fence_async_shared()
            mbarrier.arrive(ready.index(2 * s + h), count=1)
            if more:
                _barrier()  # every warp's reads of the staging half done before it is refilled
                _stage_swapab(k_desc, q_smem, sp_smem, staged.index(4 + h), h, page1, start1 % page_size, HALF0,
                              BLOCK_N)


@gluon.jit
def _fill_swapab(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty, Req_to_Token,
                 Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size, kv_capacity,
                 TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
                 MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, N_DT: gl.constexpr, cp_rank,
                 CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows, VARLEN: gl.constexpr,
                 BALANCE: gl.constexpr, KV_FP8: gl.constexpr):
    """The swap-AB kernel's partition that fills the ring: the staging converter warps for an
    fp8 cache, the alt producer warp otherwise."""
    if KV_FP8:
        _converter_swapab(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty,
                          Req_to_Token, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads,
                          page_size, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT,
                          cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, BALANCE)
    else:
        _producer_alt(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, ready, empty, Req_to_Token, Seq_Lens,
                      Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size, kv_capacity, TOK_BOX,
                      HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, cp_rank, CP_WORLD, CP_INTERLEAVE,
                      Qo_Indptr, num_rows, VARLEN, False, BALANCE)


# ---------------------------------------------------------------------------------------------
# The seesaw schedule, as FlashMLA's sm90 decode kernel runs it, over block pairs
# (b, b + 1): block b (stage 0) is group 0's, b + 1 (stage 1) group 1's; group g owns O's
# columns [256g, 256g + 256) and its row sums. Only the running row max crosses between the
# two softmaxes (``sm_smem[g]`` through ``m_ready[g]``), published as soon as it is reduced:
#
#   group 0: softmax(b) from m_{b-1} -> m_b published -> O_L *= alpha; O_L += P_b V_b[:, L]
#            with P_b from registers -> waits for m_{b+1} -> stores P_b * exp2(m_b - m_{b+1})
#            (bf16) into ``sp_smem[0]`` -> O_L *= exp2(m_b - m_{b+1}) -> O_L += P_{b+1} V_{b+1}[:, L]
#            (P from ``sp_smem[1]``) -> scores of b + 2.
#   group 1: waits for m_b -> softmax(b + 1) -> m_{b+1} published -> O_R *= alpha;
#            O_R += P_{b+1} V_{b+1}[:, R] from registers -> stores P_{b+1} into ``sp_smem[1]`` ->
#            O_R += P_b V_b[:, R] (P_b already in m_{b+1}'s frame) -> scores of b + 3.
#
# So each softmax runs while the other group's wgmmas are queued, and no P store, fence or
# P.V wait lies between two softmaxes. Each stage is tracked in three parts: L = tiles 0-3
# (released by group 0 after its P.V on them), R = tiles 4-7 (group 1), rope = tile 8
# (released by the block's owner once its scores are done). The producer refills a part as
# soon as it is released, rope first, then the owner's half; a group's scores wait part by
# part in that order. An odd last block is group 0's alone (group 1 only adds its P_b V_b[:, R]).
# ---------------------------------------------------------------------------------------------


@gluon.jit
def _seesaw_block(k, STAGE: gl.constexpr, N_PROD: gl.constexpr):
    """The block a seesaw producer fills in its k-th step: every block with one producer; with
    two, producer 0 blocks 0, 1, 2, 4, 6, ... (both first blocks, after Q, in the order the
    consumers need them) and producer 1 blocks 3, 5, 7, ... (stage 1's refills)."""
    if N_PROD == 1:
        return k
    elif STAGE == 0:
        return k + gl.maximum(k - 2, 0)
    else:
        return 2 * k + 3


@gluon.jit
def _producer_seesaw(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, ready, empty,
                     Req_to_Token, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size,
                     kv_capacity, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
                     MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, N_DT: gl.constexpr, cp_rank,
                     CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows,
                     VARLEN: gl.constexpr, HAS_TREE: gl.constexpr, BALANCE: gl.constexpr, STAGE_ORDER: gl.constexpr,
                     STAGE: gl.constexpr, N_PROD: gl.constexpr):
    """1 warp: Q as in ``_producer_alt`` (producer 0), then each block into stage ``i % 2`` by
    parts (rope, then the V halves in the order they are released: the owner's half first, or
    with STAGE_ORDER the left half, then the right), each as soon as its ``empty`` barrier
    passes. N_PROD 2: this warp refills only stage STAGE (``_seesaw_block``), so that one
    stage's late part does not hold back the other stage's refill."""
    split_start, n_blocks, req_row = _fill_work(
        q_desc, q_smem, sp_smem, q_bar, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads,
        kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, cp_rank, CP_WORLD,
        CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE, STAGE == 0)
    if N_PROD == 1:
        n_mine = n_blocks
    elif STAGE == 0:
        n_mine = gl.minimum(n_blocks, 2) + gl.maximum(n_blocks - 1, 0) // 2
    else:
        n_mine = gl.maximum(n_blocks - 2, 0) // 2
    page = gl.load(Req_to_Token + req_row + (split_start + _seesaw_block(0, STAGE, N_PROD) * BLOCK_N) // page_size,
                   mask=n_mine > 0, other=0)
    HALF: gl.constexpr = (N_DT - 1) // 2  # tiles per V half (4); the rope tile is the last
    for k in range(n_mine):
        i = _seesaw_block(k, STAGE, N_PROD)
        s = i % 2
        ph = ((i // 2) & 1) ^ 1
        start = split_start + i * BLOCK_N
        page_next = gl.load(Req_to_Token + req_row + (split_start + _seesaw_block(k + 1, STAGE, N_PROD) * BLOCK_N)
                            // page_size, mask=k + 1 < n_mine, other=0)
        tok = start % page_size
        mbarrier.wait(empty.index(3 * s + 2), ph)
        bar = ready.index(3 * s + 2)
        mbarrier.expect(bar, k_desc.block_type.nbytes)
        tma.async_load(k_desc, [page, tok, (N_DT - 1) * _DT], bar, kv_smem.index(s * N_DT + N_DT - 1))
        for hh in gl.static_range(2):
            part = (s * (1 - STAGE_ORDER) + hh) % 2  # the owner's half first, or left first
            mbarrier.wait(empty.index(3 * s + part), ph)
            bar = ready.index(3 * s + part)
            mbarrier.expect(bar, HALF * k_desc.block_type.nbytes)
            for c in gl.static_range(HALF):
                t = part * HALF + c
                tma.async_load(k_desc, [page, tok, t * _DT], bar, kv_smem.index(s * N_DT + t))
        page = page_next


@gluon.jit
def _converter_seesaw(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty,
                      Req_to_Token, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size,
                      kv_capacity, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
                      MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, N_DT: gl.constexpr, cp_rank,
                      CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows,
                      VARLEN: gl.constexpr, HAS_TREE: gl.constexpr, BALANCE: gl.constexpr, STAGE_ORDER: gl.constexpr,
                      STAGE: gl.constexpr, N_CONV: gl.constexpr):
    """fp8 caches on the seesaw: the converter warps (``_converter_pair``'s staging and
    dequantization, by the seesaw's three parts per stage: rope, then the V halves in the order
    ``_producer_seesaw`` loads them). Converter 0 loads Q and turns it to fp16. N_CONV 1: one
    partition fills both stages; it dequantizes block i whole before it requests block i + 1
    (the releases of block i - 1 that the request waits for need block i's scores, all of its
    parts). N_CONV 2: converter STAGE fills stage STAGE only (blocks STAGE, STAGE + 2, ...) and
    requests block i + 2's parts as block i releases them; neither stage's refill waits behind
    the other's."""
    (pid_b, pid_s, tok0, head0, seq_len, real_len, split_start, kv_end, full_end, max_lim, n_blocks,
     split_end, req_lim, len_bad, row_base, qlen_b, k_req) = _work(
        Seq_Lens, Real_Lens, num_kv_splits, qlen, num_heads, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN,
        MIN_SPLIT_LEN, BLOCK_N, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE)
    HALF: gl.constexpr = (N_DT - 1) // 2  # tiles per V half (4); the rope tile is the last
    # (``_fill_work``'s steps, req_row before Q's copy: in its order ptxas allocates this kernel's
    # registers differently, 84 instead of 48 bytes of spills offline)
    req_row = pid_b.to(gl.int64) * stride_req_b
    if STAGE == 0:
        _pair_load_q(q_desc, q_smem, sp_smem, q_bar, n_blocks, row_base, qlen, tok0, head0, N_DT, VARLEN)
    # Both stages start free: the first block of each stage this partition fills is requested
    # before Q converts.
    for b in gl.static_range(STAGE, 2, N_CONV):
        if b < n_blocks:
            start = split_start + b * BLOCK_N
            page = gl.load(Req_to_Token + req_row + start // page_size)
            _stage_part(k_desc, kv_smem, staged.index(3 * b + 2), b, N_DT - 1, 1, page, start % page_size, BLOCK_N)
            for hh in gl.static_range(2):
                part = (b * (1 - STAGE_ORDER) + hh) % 2
                _stage_part(k_desc, kv_smem, staged.index(3 * b + part), b, part * HALF, HALF, page,
                            start % page_size, BLOCK_N)
    if STAGE == 0:
        if n_blocks > 0:
            _convert_q(q_smem, sp_smem, q_bar, q_conv, N_DT)
    if N_CONV == 1:
        n_mine = n_blocks
    else:
        n_mine = gl.maximum(n_blocks - STAGE + 1, 0) // 2
    for k in range(n_mine):
        i = N_CONV * k + STAGE
        if N_CONV == 1:
            s = i % 2
        else:
            s = STAGE
        # Block i: its parts in the order they were requested, each handed over once dequantized.
        mbarrier.wait(staged.index(3 * s + 2), (i // 2) & 1)
        _dequant_rows(kv_smem, s, N_DT - 1, 1, k_desc, BLOCK_N)
        fence_async_shared()
        mbarrier.arrive(ready.index(3 * s + 2), count=1)
        for hh in gl.static_range(2):
            part = (s * (1 - STAGE_ORDER) + hh) % 2
            mbarrier.wait(staged.index(3 * s + part), (i // 2) & 1)
            _dequant_rows(kv_smem, s, part * HALF, HALF, k_desc, BLOCK_N)
            fence_async_shared()
            mbarrier.arrive(ready.index(3 * s + part), count=1)
        # The next block of the stage(s) filled here: block i + 1 (N_CONV 1; blocks 0 and 1 were
        # requested above) or i + 2, part by part as the block two back releases them.
        j = i + N_CONV
        more = (j < n_blocks) & (j >= 2)
        if more:
            if N_CONV == 1:
                sj = 1 - s
            else:
                sj = s
            ph = ((j // 2) & 1) ^ 1
            startj = split_start + j * BLOCK_N
            pagej = gl.load(Req_to_Token + req_row + startj // page_size)
            mbarrier.wait(empty.index(3 * sj + 2), ph)
            _stage_part(k_desc, kv_smem, staged.index(3 * sj + 2), sj, N_DT - 1, 1, pagej, startj % page_size,
                        BLOCK_N)
            for hh in gl.static_range(2):
                part = (sj * (1 - STAGE_ORDER) + hh) % 2
                mbarrier.wait(empty.index(3 * sj + part), ph)
                _stage_part(k_desc, kv_smem, staged.index(3 * sj + part), sj, part * HALF, HALF, pagej,
                            startj % page_size, BLOCK_N)


@gluon.jit
def _fill_seesaw(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty, Req_to_Token,
                 Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size, kv_capacity,
                 TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr, SPLIT_ALIGN: gl.constexpr,
                 MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr, N_DT: gl.constexpr, cp_rank,
                 CP_WORLD: gl.constexpr, CP_INTERLEAVE: gl.constexpr, Qo_Indptr, num_rows, VARLEN: gl.constexpr,
                 HAS_TREE: gl.constexpr, BALANCE: gl.constexpr, STAGE_ORDER: gl.constexpr, STAGE: gl.constexpr, N_FILL: gl.constexpr,
                 KV_FP8: gl.constexpr):
    """A partition that fills the seesaw's ring: converter warps for an fp8 cache, a producer
    warp otherwise (``q_conv`` and ``staged`` are then unused); N_FILL of them, this one
    filling stage STAGE (N_FILL 2) or both."""
    if KV_FP8:
        _converter_seesaw(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty,
                          Req_to_Token, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads,
                          page_size, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT,
                          cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE, STAGE_ORDER,
                          STAGE, N_FILL)
    else:
        _producer_seesaw(q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, ready, empty, Req_to_Token, Seq_Lens,
                         Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads, page_size, kv_capacity,
                         TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, cp_rank, CP_WORLD,
                         CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE, STAGE_ORDER, STAGE, N_FILL)


@gluon.jit
def _seesaw_scores(WG: gl.constexpr, q_smem, q_rope, kv_smem, ready, zero, ph, qk, BLOCK_N: gl.constexpr,
                   N_DT: gl.constexpr, STAGE_ORDER: gl.constexpr):
    """Issue ``S = Q K^T`` of group WG's next block (stage WG) part by part, in the order the
    producer loads them (rope, my V half, the other half; with STAGE_ORDER rope, left, right);
    returns the in-flight accumulator."""
    HALF: gl.constexpr = (N_DT - 1) // 2
    base = (WG + zero) * N_DT
    mbarrier.wait(ready.index(3 * WG + 2), ph)
    qk = warpgroup_mma(q_rope, kv_smem.index(base + N_DT - 1).reshape([BLOCK_N, _DT]).permute((1, 0)),
                       qk, use_acc=False, is_async=True)
    for hh in gl.static_range(2):
        part = (WG * (1 - STAGE_ORDER) + hh) % 2  # my half first, or left first
        mbarrier.wait(ready.index(3 * WG + part), ph)
        for c in gl.static_range(HALF):
            t = part * HALF + c
            qk = warpgroup_mma(q_smem.index(t + zero).reshape([_BM, _DT]),
                               kv_smem.index(base + t).reshape([BLOCK_N, _DT]).permute((1, 0)), qk, is_async=True)
    return qk


@gluon.jit
def _seesaw_max(qk, m_prev, qk_scale, start, full_end, lim, Tree_Mask, row_base, qlen, tok0, qlen_b, seq_len,
                BLOCK_N: gl.constexpr, HEAD_BOX: gl.constexpr, VARLEN: gl.constexpr, HAS_TREE: gl.constexpr, BALANCE: gl.constexpr,
                ROW: gl.constexpr, COL: gl.constexpr):
    """The masked, scaled scores of the block at ``start`` and the new running row max."""
    sc = _mask_tail(qk * qk_scale, start, full_end, lim, Tree_Mask, row_base, qlen, tok0, qlen_b, seq_len, BLOCK_N,
                    HEAD_BOX, VARLEN, HAS_TREE, BALANCE, ROW, COL)
    return sc, gl.maximum(m_prev, gl.max(sc, axis=1))


@gluon.jit
def _seesaw_exp(sc, m_frame, m_new, l_i, acc0, acc1, acc2, acc3):
    """P = exp2(S - m_new), and O and the row sums moved from frame ``m_frame`` to ``m_new``
    (a row that has seen no key keeps m = -inf; subtracting 0 then keeps exp2(-inf + inf)
    out). Returns (P, l, the four accumulators)."""
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_frame - m_safe)
    p = gl.exp2(sc - m_safe[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, l_i, acc0 * alpha[:, None], acc1 * alpha[:, None], acc2 * alpha[:, None], acc3 * alpha[:, None]


@gluon.jit
def _named_barrier(ARRIVE: gl.constexpr, ID, pred=None):
    """A hardware named barrier of both consumer groups (256 threads): ``bar.arrive`` (the
    group that hands something over; it does not wait) or ``bar.sync`` (the group that takes
    it; it waits for the other group's 128 arrivals). Every thread executes it, so no group
    barrier precedes it (an mbarrier arrive is one thread's after a ``bar.sync`` of its 128).
    IDs 8 and up: triton 3.6 numbers its own partition barriers from 0 (0: the default
    partition, 1: the whole CTA, 2, 3, ...: the worker partitions). ``pred`` (a scalar, the
    same in every thread): only where it is nonzero, as a predicated instruction rather than a
    branch, so that wgmmas in flight across it do not make ptxas serialize them (C7514)."""
    if pred is None:
        if ARRIVE:
            gl.inline_asm_elementwise("bar.arrive $1, 256; // $0", "=r,r", [ID], dtype=gl.int32, is_pure=False,
                                      pack=1)
        else:
            gl.inline_asm_elementwise("bar.sync $1, 256; // $0", "=r,r", [ID], dtype=gl.int32, is_pure=False,
                                      pack=1)
    else:
        if ARRIVE:
            gl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p bar.arrive $1, 256; } // $0",
                                      "=r,r,r", [ID, pred.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)
        else:
            gl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p bar.sync $1, 256; } // $0",
                                      "=r,r,r", [ID, pred.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _hand_over(bar, NAMED: gl.constexpr, ID, pred=None):
    """Signal the other consumer group: an arrive on the mbarrier ``bar``, or (NAMED) on named
    barrier ID, there only where ``pred`` (a release that no later sync would match is left
    out; an mbarrier keeps its phase and needs no such care)."""
    if NAMED:
        _named_barrier(True, ID, pred)
    else:
        mbarrier.arrive(bar, count=1)


@gluon.jit
def _take_over(bar, ph, NAMED: gl.constexpr, ID, pred=None):
    """Wait for the other consumer group's ``_hand_over``: the mbarrier ``bar`` at phase ``ph``,
    or (NAMED) named barrier ID, there only where ``pred`` (a fresh P tile needs no wait)."""
    if NAMED:
        _named_barrier(False, ID, pred)
    else:
        mbarrier.wait(bar, ph)


@gluon.jit
def _seesaw_publish(x, slot, bar, NAMED: gl.constexpr = False, ID: gl.constexpr = 0):
    """Hand a tile or a row vector to the other group: store, fence, ``_hand_over``."""
    slot.store(x)
    fence_async_shared()
    _hand_over(bar, NAMED, ID)


@gluon.jit
def _consumer_seesaw(WG: gl.constexpr, shared, TOK_BOX: gl.constexpr, HEAD_BOX: gl.constexpr,
                     SPLIT_ALIGN: gl.constexpr, MIN_SPLIT_LEN: gl.constexpr, BLOCK_N: gl.constexpr,
                     N_DT: gl.constexpr, LV: gl.constexpr, SINGLE: gl.constexpr, cp_rank, CP_WORLD: gl.constexpr,
                     CP_INTERLEAVE: gl.constexpr, Qo_Indptr, Tree_Mask, num_rows, VARLEN: gl.constexpr,
                     HAS_TREE: gl.constexpr, BALANCE: gl.constexpr, STAGE_ORDER: gl.constexpr, KV_FP8: gl.constexpr,
                     STAGE_OUT: gl.constexpr, NAMED: gl.constexpr, Timeline, TIMELINE: gl.constexpr):
    """Consumer group WG of the seesaw schedule (see above). KV_FP8: the ring holds the fp16
    blocks the converter warps wrote; ``k_scale`` scales the scores and o. ``shared``: the runtime arguments
    both groups take (``_verify_stage1_seesaw`` builds it). STAGE_ORDER: group 1 multiplies
    the other group's P_b (stage 0) before its own P_{b+1}, so that stage 0 is free in the
    middle of the pair and block b + 2 loads under the pair's second half (without it, both
    stages are released at the end of the pair and group 0 waits for b + 2's right half).
    NAMED: the row maxima and the P tiles pass between the groups on hardware named barriers
    (``_named_barrier``, IDs 8-11: m_ready 0 / 1, p_ready 0 / 1; 12 / 13: p_free 0 / 1)
    instead of mbarriers. Each is one group's arrive and the other's sync once per pair (and
    in the odd last block), in an order the pair's other waits keep alternating: a group
    cannot hand over its next pair's max or P before the other took this pair's; a P tile is
    freed only where the owner writes it again, and the owner syncs only where it wrote it
    before."""
    (q_smem, kv_smem, sp_smem, sm_smem, sl_smem, q_bar, ready, empty, m_ready, p_ready, p_free, l_bar, Seq_Lens,
     Real_Lens, O, Lse, Mid, K_Scale, qk_scale, num_kv_splits, qlen, num_heads, Req_to_Token, stride_req_b, page_size,
     num_pages, kv_capacity, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h,
     stride_mid_s) = shared
    MMA: gl.constexpr = _wgmma_layout(BLOCK_N)  # the scores, and O by 64 columns
    OP_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)
    COL: gl.constexpr = gl.SliceLayout(0, MMA)
    V_TILES: gl.constexpr = LV // _DT // 2
    V0: gl.constexpr = WG * V_TILES
    if KV_FP8:
        v_scale = gl.load(K_Scale)
        qk_scale = qk_scale * v_scale  # scores of a dequantized cache: q . (k * k_scale)
    else:
        v_scale = 1.0

    (pid_s, tok0, head0, seq_len, split_start, kv_end, full_end, n_blocks, row_base, qlen_b, lim,
     marked, k_req) = _consumer_prologue(q_bar, Seq_Lens, Real_Lens, Req_to_Token, stride_req_b, num_kv_splits, qlen,
                                  num_heads, page_size, num_pages, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN,
                                  MIN_SPLIT_LEN, BLOCK_N, cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows,
                                  VARLEN, HAS_TREE, BALANCE, ROW)
    if WG == 0:
        _cta_mark(Timeline, 3, TIMELINE)

    q_rope = sp_smem.index(1).load(OP_A)  # read before group 1 stores its first P there
    acc0 = gl.zeros([_BM, _DT], gl.float32, MMA)  # my O half, by 64 columns
    acc1 = gl.zeros([_BM, _DT], gl.float32, MMA)
    acc2 = gl.zeros([_BM, _DT], gl.float32, MMA)
    acc3 = gl.zeros([_BM, _DT], gl.float32, MMA)
    l_i = gl.zeros([_BM], gl.float32, ROW)
    m_f = gl.full([_BM], float("-inf"), gl.float32, ROW)  # the frame of my O half and row sums
    qk = gl.zeros([_BM, BLOCK_N], gl.float32, MMA)
    nz = (seq_len < 0).to(gl.int32)  # an opaque zero (see _consumer_alt)

    # My first block's scores (block WG).
    if WG < n_blocks:
        qk = _seesaw_scores(WG, q_smem, q_rope, kv_smem, ready, nz, 0, qk, BLOCK_N, N_DT, STAGE_ORDER)
        qk = warpgroup_mma_wait(0, deps=(qk, ))
        mbarrier.arrive(empty.index(3 * WG + 2), count=1)

    n_pairs = n_blocks // 2
    for pr in range(n_pairs):
        zero = pr * nz
        ph = pr & 1
        start0 = split_start + 2 * pr * BLOCK_N  # block b (stage 0); b + 1 starts BLOCK_N later
        if WG == 0:
            sc, m_b = _seesaw_max(qk, m_f, qk_scale, start0, full_end, lim, Tree_Mask, row_base, qlen, tok0,
                                  qlen_b, seq_len, BLOCK_N, HEAD_BOX, VARLEN, HAS_TREE, BALANCE, ROW, COL)
            _seesaw_publish(m_b, sm_smem.index(0), m_ready.index(0), NAMED, 8)
            p, l_i, acc0, acc1, acc2, acc3 = _seesaw_exp(sc, m_f, m_b, l_i, acc0, acc1, acc2, acc3)
            # (block b is never the tail of a full pair: b + 1 starts before kv_end)
            t0, t1, t2, t3 = _pv_issue(gl.convert_layout(p.to(sp_smem.dtype), OP_A), kv_smem, zero + V0, acc0, acc1,
                                       acc2, acc3, BLOCK_N)
            _take_over(m_ready.index(1), ph, NAMED, 9)
            m_b1 = sm_smem.index(1).load(ROW)
            s1 = gl.exp2(m_b - gl.where(m_b1 == float("-inf"), 0.0, m_b1))  # m_b's frame -> m_{b+1}'s
            _take_over(p_free.index(0), ph ^ 1, NAMED, 12, pr > 0)
            _seesaw_publish((p * s1[:, None]).to(sp_smem.dtype), sp_smem.index(0), p_ready.index(0), NAMED, 10)
            acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))
            mbarrier.arrive(empty.index(0), count=1)  # L of stage 0
            l_i = l_i * s1
            m_f = m_b1
            acc0 = acc0 * s1[:, None]
            acc1 = acc1 * s1[:, None]
            acc2 = acc2 * s1[:, None]
            acc3 = acc3 * s1[:, None]
            _take_over(p_ready.index(1), ph, NAMED, 11)
            if start0 + 2 * BLOCK_N > kv_end:
                _zero_v_tail(kv_smem, N_DT + zero, V0, V_TILES, kv_end - start0 - BLOCK_N, BLOCK_N)
            t0, t1, t2, t3 = _pv_issue(sp_smem.index(1), kv_smem, N_DT + zero + V0, acc0, acc1, acc2, acc3, BLOCK_N)
            acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))
            mbarrier.arrive(empty.index(3), count=1)  # L of stage 1
            _hand_over(p_free.index(1), NAMED, 13, pr + 1 < n_pairs)  # P_{b+3} follows in the next pair
        else:
            _take_over(m_ready.index(0), ph, NAMED, 8)
            m_b = sm_smem.index(0).load(ROW)
            sc, m_b1 = _seesaw_max(qk, m_b, qk_scale, start0 + BLOCK_N, full_end, lim, Tree_Mask, row_base, qlen,
                                   tok0, qlen_b, seq_len, BLOCK_N, HEAD_BOX, VARLEN, HAS_TREE, BALANCE, ROW, COL)
            _seesaw_publish(m_b1, sm_smem.index(1), m_ready.index(1), NAMED, 9)
            p, l_i, acc0, acc1, acc2, acc3 = _seesaw_exp(sc, m_f, m_b1, l_i, acc0, acc1, acc2, acc3)
            m_f = m_b1
            if start0 + 2 * BLOCK_N > kv_end:
                _zero_v_tail(kv_smem, N_DT + zero, V0, V_TILES, kv_end - start0 - BLOCK_N, BLOCK_N)
            if STAGE_ORDER:
                pb = p.to(sp_smem.dtype)
                _take_over(p_free.index(1), ph ^ 1, NAMED, 13, pr > 0)
                _seesaw_publish(pb, sp_smem.index(1), p_ready.index(1), NAMED, 11)
                p_op = gl.convert_layout(pb, OP_A)
                _take_over(p_ready.index(0), ph, NAMED, 10)
                t0, t1, t2, t3 = _pv_issue(sp_smem.index(0), kv_smem, zero + V0, acc0, acc1, acc2, acc3, BLOCK_N)
                acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))
                mbarrier.arrive(empty.index(1), count=1)  # R of stage 0
                _hand_over(p_free.index(0), NAMED, 12, 2 * pr + 2 < n_blocks)  # P_{b+2} follows
                t0, t1, t2, t3 = _pv_issue(p_op, kv_smem, N_DT + zero + V0, acc0, acc1, acc2, acc3, BLOCK_N)
                acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))
                mbarrier.arrive(empty.index(3 + 1), count=1)  # R of stage 1
            else:
                t0, t1, t2, t3 = _pv_issue(gl.convert_layout(p.to(sp_smem.dtype), OP_A), kv_smem, N_DT + zero + V0,
                                           acc0, acc1, acc2, acc3, BLOCK_N)
                _take_over(p_free.index(1), ph ^ 1, NAMED, 13, pr > 0)
                _seesaw_publish(p.to(sp_smem.dtype), sp_smem.index(1), p_ready.index(1), NAMED, 11)
                acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))
                mbarrier.arrive(empty.index(3 + 1), count=1)  # R of stage 1
                _take_over(p_ready.index(0), ph, NAMED, 10)
                t0, t1, t2, t3 = _pv_issue(sp_smem.index(0), kv_smem, zero + V0, acc0, acc1, acc2, acc3, BLOCK_N)
                acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))
                mbarrier.arrive(empty.index(1), count=1)  # R of stage 0
                _hand_over(p_free.index(0), NAMED, 12, 2 * pr + 2 < n_blocks)  # P_{b+2} follows
        # My next block's scores (b + 2 or b + 3), once my wgmmas on this pair are done.
        if 2 * pr + 2 + WG < n_blocks:
            tq = _seesaw_scores(WG, q_smem, q_rope, kv_smem, ready, zero, ph ^ 1, qk, BLOCK_N, N_DT, STAGE_ORDER)
            qk = warpgroup_mma_wait(0, deps=(tq, ))
            mbarrier.arrive(empty.index(3 * WG + 2), count=1)  # the rope tile of my stage

    # An odd last block b (stage 0): group 0's softmax, both groups' P_b V_b; frames end at m_b.
    if n_blocks % 2 == 1:
        zero = n_pairs * nz
        ph = n_pairs & 1
        start0 = split_start + 2 * n_pairs * BLOCK_N
        if WG == 0:
            sc, m_b = _seesaw_max(qk, m_f, qk_scale, start0, full_end, lim, Tree_Mask, row_base, qlen, tok0,
                                  qlen_b, seq_len, BLOCK_N, HEAD_BOX, VARLEN, HAS_TREE, BALANCE, ROW, COL)
            _seesaw_publish(m_b, sm_smem.index(0), m_ready.index(0), NAMED, 8)
            p, l_i, acc0, acc1, acc2, acc3 = _seesaw_exp(sc, m_f, m_b, l_i, acc0, acc1, acc2, acc3)
            m_f = m_b
            if start0 + BLOCK_N > kv_end:
                _zero_v_tail(kv_smem, zero, V0, V_TILES, kv_end - start0, BLOCK_N)
            t0, t1, t2, t3 = _pv_issue(gl.convert_layout(p.to(sp_smem.dtype), OP_A), kv_smem, zero + V0, acc0, acc1,
                                       acc2, acc3, BLOCK_N)
            _take_over(p_free.index(0), ph ^ 1, NAMED, 12, n_pairs > 0)
            _seesaw_publish(p.to(sp_smem.dtype), sp_smem.index(0), p_ready.index(0), NAMED, 10)
            acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))
        else:
            _take_over(m_ready.index(0), ph, NAMED, 8)
            m_b = sm_smem.index(0).load(ROW)
            alpha = gl.exp2(m_f - gl.where(m_b == float("-inf"), 0.0, m_b))
            m_f = m_b
            l_i = l_i * alpha
            acc0 = acc0 * alpha[:, None]
            acc1 = acc1 * alpha[:, None]
            acc2 = acc2 * alpha[:, None]
            acc3 = acc3 * alpha[:, None]
            _take_over(p_ready.index(0), ph, NAMED, 10)
            if start0 + BLOCK_N > kv_end:
                _zero_v_tail(kv_smem, zero, V0, V_TILES, kv_end - start0, BLOCK_N)
            t0, t1, t2, t3 = _pv_issue(sp_smem.index(0), kv_smem, zero + V0, acc0, acc1, acc2, acc3, BLOCK_N)
            acc0, acc1, acc2, acc3 = warpgroup_mma_wait(0, deps=(t0, t1, t2, t3))

    if WG == 0:
        _cta_mark(Timeline, 4, TIMELINE)
    # l = my row sums + the other group's (both in the last block's frame).
    l_i = _pair_row_sums(WG, l_i, sl_smem, l_bar, ROW)
    _store_out(WG, acc0, acc1, acc2, acc3, l_i, m_f, v_scale, marked, O, Lse, Mid, row_base, pid_s, tok0, head0, qlen,
               qlen_b, stride_om, stride_oh, stride_lm, stride_lh, stride_mid_m, stride_mid_h, stride_mid_s,
               HEAD_BOX, LV, SINGLE, VARLEN, MMA, kv_smem, STAGE_OUT, k_req, BALANCE, num_kv_splits)
    if WG == 0:
        _cta_mark(Timeline, 5, TIMELINE)


@gluon.jit(do_not_specialize=["stride_req_b", "stride_mid_m", "stride_mid_h", "stride_mid_s", "stride_om",
                              "stride_oh", "stride_lm", "stride_lh", "num_kv_splits", "qlen", "num_heads",
                              "page_size", "num_pages", "kv_capacity", "cp_rank", "num_rows"],
           do_not_specialize_on_alignment=["Qo_Indptr", "Tree_Mask"])
def _verify_stage1_seesaw(
    q_desc, k_desc, qk_scale, Req_to_Token, Seq_Lens, Real_Lens, Mid, O, Lse, K_Scale,
    stride_req_b, stride_mid_m, stride_mid_h, stride_mid_s, stride_om, stride_oh, stride_lm, stride_lh,
    num_kv_splits, qlen, num_heads, page_size, num_pages, kv_capacity, cp_rank,
    LV: gl.constexpr, LK: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    SPLIT_ALIGN: gl.constexpr, MIN_SPLIT_LEN: gl.constexpr, SINGLE: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    CP_WORLD: gl.constexpr = 1, CP_INTERLEAVE: gl.constexpr = 1,
    Qo_Indptr=None, Tree_Mask=None, num_rows=None, VARLEN: gl.constexpr = False,
    HAS_TREE: gl.constexpr = False, BALANCE: gl.constexpr = 0, STAGE_ORDER: gl.constexpr = False, STAGE_PRODUCERS: gl.constexpr = False,
    LAUNCH_DEPENDENTS: gl.constexpr = False, STAGE_OUT: gl.constexpr = False,
    NAMED_EXCHANGE: gl.constexpr = False,
    Timeline=None, TIMELINE: gl.constexpr = False,  # the CTA timeline probe (``_cta_mark``)
):
    """Stage 1 with the seesaw schedule (same arguments as ``_verify_stage1_ws``, NUM_STAGES
    must be 2; STAGE_ORDER: see ``_consumer_seesaw``; STAGE_PRODUCERS: a filler partition per
    ring stage, see ``_producer_seesaw`` and ``_converter_seesaw``; NAMED_EXCHANGE: the handovers
    between the consumer groups on named barriers, see ``_consumer_seesaw``). An fp8 cache runs converter
    warps (4, or 2 per stage; PRODUCER_REGS registers) instead of the producer warp. Shared
    memory as in ``_verify_stage1_alt``."""
    _launch_dependents(LAUNCH_DEPENDENTS)
    _cta_mark(Timeline, 0, TIMELINE)
    N_DT: gl.constexpr = LK // _DT
    TOK_BOX: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_BOX: gl.constexpr = q_desc.block_type.shape[1]
    if BALANCE:
        if not _holds_piece(Seq_Lens, Real_Lens, num_kv_splits, qlen, num_heads, kv_capacity, TOK_BOX, HEAD_BOX,
                            cp_rank, CP_WORLD, CP_INTERLEAVE, BALANCE):
            _cta_mark(Timeline, 1, TIMELINE)
            return
    gl.static_assert(N_DT == 9)
    KV_FP8: gl.constexpr = k_desc.dtype.is_fp8()
    q_smem, kv_smem, sp_smem = _pair_smem(q_desc, k_desc, LK, LV, BLOCK_N, NUM_STAGES)
    ROWS_L: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    sm_smem = gl.allocate_shared_memory(gl.float32, [2, _BM], ROWS_L)  # [group]: its last row max
    sl_smem = gl.allocate_shared_memory(gl.float32, [2, _BM], ROWS_L)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())  # [stage * 3 + part]
    empty = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
    m_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    l_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(l_bar, count=2)
    for i in gl.static_range(6):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)  # each part has one releasing group
    for i in gl.static_range(2):
        mbarrier.init(m_ready.index(i), count=1)
        mbarrier.init(p_ready.index(i), count=1)
        mbarrier.init(p_free.index(i), count=1)
    q_conv, staged = _converter_barriers(q_bar, ready, 6, KV_FP8)

    # (the consumers' Q barrier: q_conv, which is q_bar for bf16)
    shared = (q_smem, kv_smem, sp_smem, sm_smem, sl_smem, q_conv, ready, empty, m_ready, p_ready, p_free, l_bar,
              Seq_Lens, Real_Lens, O, Lse, Mid, K_Scale, qk_scale, num_kv_splits, qlen, num_heads, Req_to_Token,
              stride_req_b, page_size, num_pages, kv_capacity, stride_om, stride_oh, stride_lm, stride_lh,
              stride_mid_m, stride_mid_h, stride_mid_s)
    # (the partitions' argument tuples are written out in both branches: bound to a name, a tuple
    # does not keep its None members as None in 3.6, and the kernel without ragged rows then
    # compiles their code)
    if STAGE_PRODUCERS:
        gl.warp_specialize([
            (_consumer_seesaw, (0, shared, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, LV, SINGLE,
                                cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, Tree_Mask, num_rows, VARLEN, HAS_TREE, BALANCE,
                                STAGE_ORDER, KV_FP8, STAGE_OUT, NAMED_EXCHANGE, Timeline, TIMELINE)),
            (_consumer_seesaw, (1, shared, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, LV, SINGLE,
                                cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, Tree_Mask, num_rows, VARLEN, HAS_TREE, BALANCE,
                                STAGE_ORDER, KV_FP8, STAGE_OUT, NAMED_EXCHANGE, Timeline, TIMELINE)),
            (_fill_seesaw, (q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty,
                            Req_to_Token, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads,
                            page_size, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT,
                            cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE, STAGE_ORDER,
                            0, 2, KV_FP8)),
            (_fill_seesaw, (q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty,
                            Req_to_Token, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads,
                            page_size, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT,
                            cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE, STAGE_ORDER,
                            1, 2, KV_FP8)),
        ], [4, 2 if KV_FP8 else 1, 2 if KV_FP8 else 1], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer_seesaw, (0, shared, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, LV, SINGLE,
                                cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, Tree_Mask, num_rows, VARLEN, HAS_TREE, BALANCE,
                                STAGE_ORDER, KV_FP8, STAGE_OUT, NAMED_EXCHANGE, Timeline, TIMELINE)),
            (_consumer_seesaw, (1, shared, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT, LV, SINGLE,
                                cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, Tree_Mask, num_rows, VARLEN, HAS_TREE, BALANCE,
                                STAGE_ORDER, KV_FP8, STAGE_OUT, NAMED_EXCHANGE, Timeline, TIMELINE)),
            (_fill_seesaw, (q_desc, k_desc, q_smem, kv_smem, sp_smem, q_bar, q_conv, staged, ready, empty,
                            Req_to_Token, Seq_Lens, Real_Lens, stride_req_b, num_kv_splits, qlen, num_heads,
                            page_size, kv_capacity, TOK_BOX, HEAD_BOX, SPLIT_ALIGN, MIN_SPLIT_LEN, BLOCK_N, N_DT,
                            cp_rank, CP_WORLD, CP_INTERLEAVE, Qo_Indptr, num_rows, VARLEN, HAS_TREE, BALANCE, STAGE_ORDER,
                            0, 1, KV_FP8)),
        ], [4, 4 if KV_FP8 else 1], [CONSUMER_REGS, PRODUCER_REGS])
    mbarrier.invalidate(q_bar)
    mbarrier.invalidate(l_bar)
    for i in gl.static_range(6):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(m_ready.index(i))
        mbarrier.invalidate(p_ready.index(i))
        mbarrier.invalidate(p_free.index(i))
    _invalidate_converter_barriers(q_conv, staged, 6, KV_FP8)
    _cta_mark(Timeline, 1, TIMELINE)
