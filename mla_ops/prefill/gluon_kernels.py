"""Gluon (``triton.experimental.gluon``, triton 3.6) encoder attention for sm_90 (Hopper):
``@gluon.jit`` only; the host side is ``gluon_launch.py``.

One CTA per (128-row query tile, query head, sequence) of the packed variable-length batch,
the grid of the portable kernel (``kernels.context_attention_kernel``). Three partitions
(``gl.warp_specialize``), 9 warps:

- a 1-warp **producer**: TMA-loads the two 64-row halves of the Q tile once, then the K and V
  blocks ``[BLOCK_N, D]`` of the sequence's KV head into a ``NUM_STAGES`` ring (separate ready /
  empty mbarriers for K and V, so a K stage is refilled as soon as both groups' scores on it
  are done, before their P.V wgmmas on the V of the same block);
- two 4-warp **consumer** warpgroups, each owning 64 query rows (one wgmma M): scores
  ``S = Q K^T`` by wgmma, the online softmax in registers (base 2, the scale folded into one
  FMA), ``O += P V`` by wgmma with P from registers.

**Head-dim split.** A head dim that is not a power of two is covered as in the portable kernel
(``launch.head_dim_split``): a main block of ``BLOCK_D`` columns plus a tail of
``BLOCK_D_TAIL`` (72, 80 -> 64 + 16; 96 -> 64 + 32). Here the two are two K-chunks of one
score wgmma chain (``Q[:, :64] K[:, :64]^T + Q[:, 64:] K[:, 64:]^T``) and two accumulators
of the P.V wgmma (``[64, BLOCK_D]`` and ``[64, BLOCK_D_TAIL]``). Every tile is a box of a rank-3
host descriptor over ``[tokens, heads, D]``: a box's inner extent must be at least 16 bytes, so
the tail of D = 72 is a 16-wide box whose columns 72..79 lie past the head dim, and the copy
engine fills them with zeros (Q's and K's zeros add nothing to S; V's give output columns that
are never stored). Nothing is padded to the next power of two.

**Schedules** (constexprs, each a compile variant):

- ``PIPELINE = 0``: per block, scores, softmax, P.V, in sequence (the simple form);
- ``PIPELINE = 1`` (FA3's intra-warpgroup overlap): the score wgmmas of block j are issued, then
  the P.V wgmmas of block j - 1, and the softmax of block j runs while the P.V is in flight;
- ``PINGPONG = 1`` (with ``PIPELINE``; FA3's inter-warpgroup overlap): the two groups take
  turns to issue their wgmmas (two mbarriers, ``turn``), so that one group's softmax runs
  while the other's wgmmas occupy the tensor cores.
- ``P_SMEM = 1``: P reaches the P.V wgmmas through a shared tile per group instead of registers.

With ``PIPELINE``, ptxas moved the P.V wait above the softmax (where nothing then overlapped);
a shared-memory store of the row sums just before the wait keeps it below (``_step``). On the
H200 none of the schedules moved the time by more than a few percent (benchmarks/NOTES.md, v5);
the sm_90 table picks one per head-dim split.

**Masks.** A group's key blocks are walked in two loops: the blocks every row of the group sees
whole (no mask code at all), then the rest (the sequence end; causal: the diagonal), where
invisible scores become -inf. Both groups walk the same blocks (the CTA's key range), so their
barrier counts agree; a block fully invisible to a group (causal, ``BLOCK_N`` 64) is computed
masked, a no-op. The running max starts at a finite -1e30, so no row ever computes
``-inf - -inf``.

**NaN guard.** A KV block past the sequence's end reads the next sequence's tokens (or the
copy engine's zeros past the tensor). Their scores are masked; before the P.V wgmma of the last
block, each group zeroes the V rows past the sequence end in shared memory (0 * NaN is NaN, so
garbage in the gaps of a packed batch must not reach the accumulator).

**Out-of-range metadata** (checked mode off): as in the portable kernel (its module docstring).
``_tile`` clamps a sequence whose start or length is negative, or which ends past the
``total_tokens`` packed tokens, into them (every partition computes the same clamped bounds) and
marks it: its rows inside the packed tokens get ``o = NaN``. Rows from ``max_input_len`` on get
NaN too; those past the grid's last row block are written NaN by that block's consumer groups.

Register budget (``setmaxnreg``): ``CONSUMER_REGS`` for the second group, ``PRODUCER_REGS`` for
the producer warp; the first group is the default partition and keeps what is left.
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
# The portable kernel's grid and clamping rule and its FMA-pipe exponential, shared: plain
# @triton.jit helpers compile under Gluon's semantics as they are (the callee takes its caller's).
from .kernels import exp2_fma, program_sequence

_BM = gl.constexpr(64)  # query rows per consumer warpgroup (one wgmma M)
_NEG_BIG = gl.constexpr(-1.0e30)
_LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _tile(B_Start_Loc, B_Seq_Len, total_tokens, IS_CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr):
    """This CTA's work: (head, seq_start, seq_len, m_start, n_blocks, marked). Every partition
    computes it from the kernel arguments (cheap scalars) instead of keeping the parent's values
    live. The sequence is clamped into the packed tokens; ``marked``: it was not inside them."""
    # Causal: tiles at the end of a sequence see the most keys, so they start first.
    pid_m, head, _, seq_start, seq_len, marked = program_sequence(B_Start_Loc, B_Seq_Len,
                                                                  total_tokens, IS_CAUSAL)
    seq_start = seq_start.to(gl.int32)
    m_start = pid_m * (2 * _BM)
    kv_hi = seq_len
    if IS_CAUSAL:
        kv_hi = gl.minimum(kv_hi, m_start + 2 * _BM)
    n_blocks = gl.where(m_start < seq_len, gl.cdiv(kv_hi, BLOCK_N), 0)
    return head, seq_start, seq_len, m_start, n_blocks, marked


@gluon.jit
def _producer(q_desc, qt_desc, k_desc, kt_desc, v_desc, vt_desc,
              q_smem, qt_smem, k_smem, kt_smem, v_smem, vt_smem,
              q_bar, k_ready, k_empty, v_ready, v_empty, B_Start_Loc, B_Seq_Len, kv_group, total_tokens,
              BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, HAS_TAIL: gl.constexpr,
              NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """1 warp: the Q tile, then every K / V block of the CTA's key range through the ring."""
    head, seq_start, seq_len, m_start, n_blocks, marked = _tile(B_Start_Loc, B_Seq_Len, total_tokens,
                                                                IS_CAUSAL, BLOCK_N)
    kv_head = head // kv_group
    # Bytes each barrier expects (a box past the tensor still counts whole: zeros are written).
    if HAS_TAIL:
        Q_BYTES: gl.constexpr = q_desc.block_type.nbytes + qt_desc.block_type.nbytes
        KV_BYTES: gl.constexpr = k_desc.block_type.nbytes + kt_desc.block_type.nbytes
    else:
        Q_BYTES: gl.constexpr = q_desc.block_type.nbytes
        KV_BYTES: gl.constexpr = k_desc.block_type.nbytes
    if n_blocks > 0:  # nothing is loaded for an empty tile, so no copy outlives the CTA
        mbarrier.expect(q_bar, 2 * Q_BYTES)
        for g in gl.static_range(2):
            row = seq_start + m_start + g * _BM
            tma.async_load(q_desc, [row, head, 0], q_bar, q_smem.index(g))
            if HAS_TAIL:
                tma.async_load(qt_desc, [row, head, BLOCK_D], q_bar, qt_smem.index(g))
    for i in range(n_blocks):
        s = i % NUM_STAGES
        ph = ((i // NUM_STAGES) & 1) ^ 1  # a fresh barrier's phase 1 counts as complete
        row = seq_start + i * BLOCK_N
        mbarrier.wait(k_empty.index(s), ph)
        mbarrier.expect(k_ready.index(s), KV_BYTES)
        tma.async_load(k_desc, [row, kv_head, 0], k_ready.index(s), k_smem.index(s))
        if HAS_TAIL:
            tma.async_load(kt_desc, [row, kv_head, BLOCK_D], k_ready.index(s), kt_smem.index(s))
        mbarrier.wait(v_empty.index(s), ph)
        mbarrier.expect(v_ready.index(s), KV_BYTES)
        tma.async_load(v_desc, [row, kv_head, 0], v_ready.index(s), v_smem.index(s))
        if HAS_TAIL:
            tma.async_load(vt_desc, [row, kv_head, BLOCK_D], v_ready.index(s), vt_smem.index(s))


@gluon.jit
def _scores(q, qt, k_smem, kt_smem, s, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
            BLOCK_D_TAIL: gl.constexpr, MMA_S: gl.constexpr):
    """Issue ``S = Q K_s^T`` (main chunk, then the tail chunk) asynchronously."""
    HAS_TAIL: gl.constexpr = BLOCK_D_TAIL > 0
    k = k_smem.index(s).reshape([BLOCK_N, BLOCK_D])
    acc = warpgroup_mma(q, k.permute((1, 0)), gl.zeros([_BM, BLOCK_N], gl.float32, MMA_S),
                        use_acc=False, is_async=True)
    if HAS_TAIL:
        kt = kt_smem.index(s).reshape([BLOCK_N, BLOCK_D_TAIL])
        acc = warpgroup_mma(qt, kt.permute((1, 0)), acc, is_async=True)
    return acc


@gluon.jit
def _pv(p, pt, acc, acc_t, v_smem, vt_smem, s, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
        BLOCK_D_TAIL: gl.constexpr):
    """Issue ``O += P V_s`` (both accumulators) asynchronously."""
    acc = warpgroup_mma(p, v_smem.index(s).reshape([BLOCK_N, BLOCK_D]), acc, is_async=True)
    if BLOCK_D_TAIL > 0:
        acc_t = warpgroup_mma(pt, vt_smem.index(s).reshape([BLOCK_N, BLOCK_D_TAIL]), acc_t, is_async=True)
    return acc, acc_t


@gluon.jit
def _exp2_tile(x, BLOCK_N: gl.constexpr, MMA_S: gl.constexpr, EXP2: gl.constexpr):
    """``2^x`` of a score tile [64, BLOCK_N] (see ``_softmax``'s EXP2). A thread of the wgmma
    layout holds column pairs (2c, 2c + 1) and columns of both halves, so each split below is a
    split of its own registers: every layout conversion is trivial (asserted)."""
    if EXP2 == 0:
        p = gl.exp2(x)
    elif EXP2 == 2:
        x_even, x_odd = gl.split(gl.reshape(x, [64, BLOCK_N // 2, 2]))
        p = gl.reshape(gl.join(gl.exp2(x_even), exp2_fma(x_odd)), [64, BLOCK_N])
        p = gl.convert_layout(p, MMA_S, assert_trivial=True)
    elif EXP2 == 4:
        lo, hi = gl.split(gl.permute(gl.reshape(x, [64, 2, BLOCK_N // 2]), [0, 2, 1]))
        x_even, x_odd = gl.split(gl.reshape(lo, [64, BLOCK_N // 4, 2]))
        p_lo = gl.reshape(gl.join(gl.exp2(x_even), exp2_fma(x_odd)), [64, BLOCK_N // 2])
        p_lo = gl.convert_layout(p_lo, hi.type.layout, assert_trivial=True)
        p = gl.reshape(gl.permute(gl.join(p_lo, gl.exp2(hi)), [0, 2, 1]), [64, BLOCK_N])
        p = gl.convert_layout(p, MMA_S, assert_trivial=True)
    else:
        p = x * 0.0078125 + 1.0  # one FMA in place of each exponential (timing only)
    return p


@gluon.jit
def _softmax(qk, m_i, l_i, start, rows, seq_len, qk_scale, MASKED: gl.constexpr,
             IS_CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, MMA_S: gl.constexpr,
             EXP2: gl.constexpr):
    """Fold one block of raw scores ``qk`` [64, BLOCK_N] into (m, l); returns (p, alpha, m, l).
    ``EXP2`` says where the exponentials run: 0 all on the MUFU; 2 the odd columns, 4 the odd
    columns of the first half, on the FMA pipes (``kernels.exp2_fma``); -1 none at all (an
    ablation that times the kernel without them: wrong results)."""
    if MASKED:
        keys = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, MMA_S))
        visible = (keys < seq_len)[None, :] & (rows >= 0)[:, None]
        if IS_CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])
        qk = gl.where(visible, qk, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(qk, axis=1) * qk_scale)
    p = _exp2_tile(qk * qk_scale - m_new[:, None], BLOCK_N, MMA_S, EXP2)
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _zero_v_tail(v_smem, vt_smem, s, n_valid, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
                 BLOCK_D_TAIL: gl.constexpr):
    """Rows ``>= n_valid`` of V stage ``s`` := 0 (the NaN guard of the last block)."""
    TL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    kk = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, TL))
    keep = (kk < n_valid)[:, None]
    t = v_smem.index(s).reshape([BLOCK_N, BLOCK_D])
    x = t.load(TL)
    t.store(gl.where(keep, x, gl.zeros_like(x)))
    if BLOCK_D_TAIL > 0:
        TLT: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BLOCK_D_TAIL // 8), BLOCK_D_TAIL // 8], [4, 1], [1, 0])
        kt = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, TLT))
        tt = vt_smem.index(s).reshape([BLOCK_N, BLOCK_D_TAIL])
        y = tt.load(TLT)
        tt.store(gl.where((kt < n_valid)[:, None], y, gl.zeros_like(y)))
    fence_async_shared()


@gluon.jit
def _p_operands(p, p_buf, dt: gl.constexpr, P_SMEM: gl.constexpr, HAS_TAIL: gl.constexpr,
                P_OP: gl.constexpr, P_OPT: gl.constexpr):
    """P (fp32, score layout) as the A operands of the P.V wgmmas: registers in the dot-operand
    layouts of the main and tail accumulators, or (``P_SMEM``) stored once into this group's
    shared tile ``p_buf`` [64, BLOCK_N], which both wgmmas read."""
    p_lo = p.to(dt)
    if P_SMEM:
        p_buf.store(p_lo)
        fence_async_shared()
        return p_buf, p_buf
    else:
        p_op = gl.convert_layout(p_lo, P_OP)
        if HAS_TAIL:
            pt_op = gl.convert_layout(p_lo, P_OPT)
        else:
            pt_op = p_op
        return p_op, pt_op


@gluon.jit
def _step(i, acc, acc_t, m_i, l_i, p_prev, pt_prev, q, qt, rows, seq_len, qk_scale,
          k_smem, kt_smem, v_smem, vt_smem, k_ready, k_empty, v_ready, v_empty, turn, p_buf,
          l_buf, G: gl.constexpr, P_SMEM: gl.constexpr,
          MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
          NUM_STAGES: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
          BLOCK_D_TAIL: gl.constexpr, MMA_S: gl.constexpr, P_OP: gl.constexpr, P_OPT: gl.constexpr,
          ROW_O: gl.constexpr, ROW_OT: gl.constexpr, EXP2: gl.constexpr):
    """Pipelined block ``i >= 1``: scores of block i and P.V of block i - 1 in flight together,
    then the softmax of block i under the P.V. Returns the new state and P_i."""
    HAS_TAIL: gl.constexpr = BLOCK_D_TAIL > 0
    s = i % NUM_STAGES
    sp = (i - 1) % NUM_STAGES
    mbarrier.wait(k_ready.index(s), (i // NUM_STAGES) & 1)
    if PINGPONG:
        mbarrier.wait(turn.index(G), (i & 1) ^ (1 - G))
    qk = _scores(q, qt, k_smem, kt_smem, s, BLOCK_N, BLOCK_D, BLOCK_D_TAIL, MMA_S)
    mbarrier.wait(v_ready.index(sp), ((i - 1) // NUM_STAGES) & 1)
    acc, acc_t = _pv(p_prev, pt_prev, acc, acc_t, v_smem, vt_smem, sp, BLOCK_N, BLOCK_D, BLOCK_D_TAIL)
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - G), count=1)
    if HAS_TAIL:
        qk = warpgroup_mma_wait(2, deps=(qk, ))
    else:
        qk = warpgroup_mma_wait(1, deps=(qk, ))
    mbarrier.arrive(k_empty.index(s), count=1)
    p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, i * BLOCK_N, rows, seq_len, qk_scale, MASKED,
                                  IS_CAUSAL, BLOCK_N, MMA_S, EXP2)
    # P_i stays fp32 in the score registers until the P.V of block i - 1 is done: its bf16
    # operand registers are the ones that wgmma is still reading.
    # ptxas hoists a wgmma wait above independent code (here: to the top of the softmax, which
    # then overlapped nothing). A shared-memory store of the row sums, the softmax's last result,
    # pins it: the wait stays below the store. (deps= only orders the PTX; ptxas ignores it.)
    l_buf.store(l_i)
    acc, acc_t, p = warpgroup_mma_wait(0, deps=(acc, acc_t, p))
    mbarrier.arrive(v_empty.index(sp), count=1)
    acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
    if HAS_TAIL:
        acc_t = acc_t * gl.convert_layout(alpha, ROW_OT)[:, None]
    p_op, pt_op = _p_operands(p, p_buf, q.dtype, P_SMEM, HAS_TAIL, P_OP, P_OPT)
    return acc, acc_t, m_i, l_i, p_op, pt_op


@gluon.jit
def _step_simple(i, acc, acc_t, m_i, l_i, q, qt, rows, seq_len, qk_scale,
                 k_smem, kt_smem, v_smem, vt_smem, k_ready, k_empty, v_ready, v_empty,
                 MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr,
                 BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, BLOCK_D_TAIL: gl.constexpr,
                 MMA_S: gl.constexpr, P_OP: gl.constexpr, P_OPT: gl.constexpr,
                 ROW_O: gl.constexpr, ROW_OT: gl.constexpr, EXP2: gl.constexpr):
    """Block ``i`` in sequence: scores, softmax, rescale, P.V (no overlap inside the group)."""
    HAS_TAIL: gl.constexpr = BLOCK_D_TAIL > 0
    s = i % NUM_STAGES
    ph = (i // NUM_STAGES) & 1
    mbarrier.wait(k_ready.index(s), ph)
    qk = _scores(q, qt, k_smem, kt_smem, s, BLOCK_N, BLOCK_D, BLOCK_D_TAIL, MMA_S)
    qk = warpgroup_mma_wait(0, deps=(qk, ))
    mbarrier.arrive(k_empty.index(s), count=1)
    p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, i * BLOCK_N, rows, seq_len, qk_scale, MASKED,
                                  IS_CAUSAL, BLOCK_N, MMA_S, EXP2)
    acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
    if HAS_TAIL:
        acc_t = acc_t * gl.convert_layout(alpha, ROW_OT)[:, None]
    p_lo = p.to(q.dtype)
    p_op = gl.convert_layout(p_lo, P_OP)
    if HAS_TAIL:
        pt_op = gl.convert_layout(p_lo, P_OPT)
    else:
        pt_op = p_op
    mbarrier.wait(v_ready.index(s), ph)
    if MASKED:
        if (i + 1) * BLOCK_N > seq_len:
            _zero_v_tail(v_smem, vt_smem, s, seq_len - i * BLOCK_N, BLOCK_N, BLOCK_D, BLOCK_D_TAIL)
    acc, acc_t = _pv(p_op, pt_op, acc, acc_t, v_smem, vt_smem, s, BLOCK_N, BLOCK_D, BLOCK_D_TAIL)
    acc, acc_t = warpgroup_mma_wait(0, deps=(acc, acc_t))
    mbarrier.arrive(v_empty.index(s), count=1)
    return acc, acc_t, m_i, l_i


@gluon.jit
def _consumer(G: gl.constexpr, q_smem, qt_smem, k_smem, kt_smem, v_smem, vt_smem, p_smem, l_smem,
              q_bar, k_ready, k_empty, v_ready, v_empty, turn,
              O, Sinks, B_Start_Loc, B_Seq_Len, qk_scale, stride_ot, stride_oh, total_tokens,
              max_input_len, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
              BLOCK_D_TAIL: gl.constexpr, NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
              HAS_SINKS: gl.constexpr, PIPELINE: gl.constexpr, PINGPONG: gl.constexpr,
              P_SMEM: gl.constexpr, EXP2: gl.constexpr):
    """Consumer warpgroup ``G``: query rows ``[m_start + 64 G, m_start + 64 G + 64)``."""
    HAS_TAIL: gl.constexpr = BLOCK_D_TAIL > 0
    TAIL_N: gl.constexpr = BLOCK_D_TAIL if HAS_TAIL else 16  # placeholder width without a tail
    MMA_S: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BLOCK_N, 16])
    MMA_O: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BLOCK_D, 16])
    MMA_OT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, TAIL_N, 16])
    P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_O, k_width=2)
    P_OPT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_OT, k_width=2)
    ROW_S: gl.constexpr = gl.SliceLayout(1, MMA_S)
    ROW_O: gl.constexpr = gl.SliceLayout(1, MMA_O)
    ROW_OT: gl.constexpr = gl.SliceLayout(1, MMA_OT)

    head, seq_start, seq_len, m_start, n_blocks, marked = _tile(B_Start_Loc, B_Seq_Len, total_tokens,
                                                                IS_CAUSAL, BLOCK_N)
    row0 = m_start + G * _BM  # first query row of this group, in the sequence
    rows = row0 + gl.arange(0, _BM, layout=ROW_S)
    # Blocks [0, n_full) are seen whole by every row of the group; the rest need the mask.
    vis_hi = seq_len
    if IS_CAUSAL:
        vis_hi = gl.minimum(vis_hi, row0 + 1)
    n_full = gl.minimum(vis_hi // BLOCK_N, n_blocks)

    q = q_smem.index(G).reshape([_BM, BLOCK_D])
    p_buf = p_smem.index(G)
    l_buf = l_smem.index(G)
    if HAS_TAIL:
        qt = qt_smem.index(G).reshape([_BM, BLOCK_D_TAIL])
    else:
        qt = q
    if HAS_SINKS:
        sink = gl.load(Sinks + head).to(gl.float32) * _LOG2E
        m_i = gl.full([_BM], 0.0, gl.float32, ROW_S) + sink
        l_i = gl.full([_BM], 1.0, gl.float32, ROW_S)
    else:
        m_i = gl.full([_BM], _NEG_BIG, gl.float32, ROW_S)
        l_i = gl.zeros([_BM], gl.float32, ROW_S)
    acc = gl.zeros([_BM, BLOCK_D], gl.float32, MMA_O)
    acc_t = gl.zeros([_BM, TAIL_N], gl.float32, MMA_OT)

    mbarrier.wait(q_bar, 0, pred=n_blocks > 0)
    if PIPELINE:
        if n_blocks > 0:
            # Block 0: its scores and softmax alone (nothing to overlap with yet).
            if PINGPONG:
                mbarrier.wait(turn.index(G), 1 - G)
            mbarrier.wait(k_ready.index(0), 0)
            qk = _scores(q, qt, k_smem, kt_smem, 0, BLOCK_N, BLOCK_D, BLOCK_D_TAIL, MMA_S)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - G), count=1)
            qk = warpgroup_mma_wait(0, deps=(qk, ))
            mbarrier.arrive(k_empty.index(0), count=1)
            if n_full > 0:
                p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, 0, rows, seq_len, qk_scale, False,
                                              IS_CAUSAL, BLOCK_N, MMA_S, EXP2)
            else:
                p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, 0, rows, seq_len, qk_scale, True,
                                              IS_CAUSAL, BLOCK_N, MMA_S, EXP2)
            p_op, pt_op = _p_operands(p, p_buf, q.dtype, P_SMEM, HAS_TAIL, P_OP, P_OPT)
            # The turn of pipelined block i is phase i of the group's turn barrier (block 0
            # took phase 0 above; the P.V-only last turn takes phase n_blocks).
            for i in range(1, n_full):
                acc, acc_t, m_i, l_i, p_op, pt_op = _step(
                    i, acc, acc_t, m_i, l_i, p_op, pt_op, q, qt, rows, seq_len, qk_scale,
                    k_smem, kt_smem, v_smem, vt_smem, k_ready, k_empty, v_ready, v_empty, turn, p_buf, l_buf, G,
                    P_SMEM, False, IS_CAUSAL, PINGPONG, NUM_STAGES, BLOCK_N, BLOCK_D, BLOCK_D_TAIL,
                    MMA_S, P_OP, P_OPT, ROW_O, ROW_OT, EXP2)
            for i in range(gl.maximum(n_full, 1), n_blocks):
                acc, acc_t, m_i, l_i, p_op, pt_op = _step(
                    i, acc, acc_t, m_i, l_i, p_op, pt_op, q, qt, rows, seq_len, qk_scale,
                    k_smem, kt_smem, v_smem, vt_smem, k_ready, k_empty, v_ready, v_empty, turn, p_buf, l_buf, G,
                    P_SMEM, True, IS_CAUSAL, PINGPONG, NUM_STAGES, BLOCK_N, BLOCK_D, BLOCK_D_TAIL,
                    MMA_S, P_OP, P_OPT, ROW_O, ROW_OT, EXP2)
            # The last block's P.V.
            last = n_blocks - 1
            sl = last % NUM_STAGES
            mbarrier.wait(v_ready.index(sl), (last // NUM_STAGES) & 1)
            if n_blocks * BLOCK_N > seq_len:
                _zero_v_tail(v_smem, vt_smem, sl, seq_len - last * BLOCK_N, BLOCK_N, BLOCK_D, BLOCK_D_TAIL)
            if PINGPONG:
                mbarrier.wait(turn.index(G), (n_blocks & 1) ^ (1 - G))
            acc, acc_t = _pv(p_op, pt_op, acc, acc_t, v_smem, vt_smem, sl, BLOCK_N, BLOCK_D, BLOCK_D_TAIL)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - G), count=1)
            acc, acc_t = warpgroup_mma_wait(0, deps=(acc, acc_t))
            mbarrier.arrive(v_empty.index(sl), count=1)
    else:
        for i in range(0, n_full):
            acc, acc_t, m_i, l_i = _step_simple(
                i, acc, acc_t, m_i, l_i, q, qt, rows, seq_len, qk_scale,
                k_smem, kt_smem, v_smem, vt_smem, k_ready, k_empty, v_ready, v_empty,
                False, IS_CAUSAL, NUM_STAGES, BLOCK_N, BLOCK_D, BLOCK_D_TAIL,
                MMA_S, P_OP, P_OPT, ROW_O, ROW_OT, EXP2)
        for i in range(n_full, n_blocks):
            acc, acc_t, m_i, l_i = _step_simple(
                i, acc, acc_t, m_i, l_i, q, qt, rows, seq_len, qk_scale,
                k_smem, kt_smem, v_smem, vt_smem, k_ready, k_empty, v_ready, v_empty,
                True, IS_CAUSAL, NUM_STAGES, BLOCK_N, BLOCK_D, BLOCK_D_TAIL,
                MMA_S, P_OP, P_OPT, ROW_O, ROW_OT, EXP2)

    # Epilogue: every real row saw its own key (or the sink), so l > 0 there.
    rows_o = row0 + gl.arange(0, _BM, layout=ROW_O)
    ok = rows_o < seq_len
    inv_l = gl.convert_layout(1.0 / gl.where(l_i > 0.0, l_i, 1.0), ROW_O)
    # A marked sequence, and rows from max_input_len on: NaN.
    inv_l = gl.where(marked | (rows_o >= max_input_len), float("nan"), inv_l)
    tok = (seq_start + rows_o).to(gl.int64)
    p_o = O + tok[:, None] * stride_ot + head * stride_oh
    cols = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, MMA_O))
    gl.store(p_o + cols[None, :], (acc * inv_l[:, None]).to(O.dtype.element_ty),
             mask=ok[:, None] & (cols < HEAD_DIM)[None, :])
    if HAS_TAIL:
        rows_t = row0 + gl.arange(0, _BM, layout=ROW_OT)
        inv_t = gl.convert_layout(inv_l, ROW_OT)
        tok_t = (seq_start + rows_t).to(gl.int64)
        cols_t = BLOCK_D + gl.arange(0, BLOCK_D_TAIL, layout=gl.SliceLayout(0, MMA_OT))
        gl.store(O + tok_t[:, None] * stride_ot + head * stride_oh + cols_t[None, :],
                 (acc_t * inv_t[:, None]).to(O.dtype.element_ty),
                 mask=(rows_t < seq_len)[:, None] & (cols_t < HEAD_DIM)[None, :])

    # A sequence longer than the grid reaches (max_input_len too small): the last row block's
    # groups write NaN into its rows past the grid, 64 rows each per step (never taken for
    # valid metadata).
    if m_start + 2 * _BM == gl.num_programs(0) * (2 * _BM):
        for r0 in range(m_start + 2 * _BM + G * _BM, seq_len, 2 * _BM):
            rows_f = r0 + gl.arange(0, _BM, layout=ROW_O)
            tok_f = (seq_start + rows_f).to(gl.int64)
            gl.store(O + tok_f[:, None] * stride_ot + head * stride_oh + cols[None, :],
                     gl.full([_BM, BLOCK_D], float("nan"), O.dtype.element_ty, MMA_O),
                     mask=(rows_f < seq_len)[:, None] & (cols < HEAD_DIM)[None, :])
            if HAS_TAIL:
                rows_ft = r0 + gl.arange(0, _BM, layout=ROW_OT)
                tok_ft = (seq_start + rows_ft).to(gl.int64)
                cols_ft = BLOCK_D + gl.arange(0, BLOCK_D_TAIL, layout=gl.SliceLayout(0, MMA_OT))
                gl.store(O + tok_ft[:, None] * stride_ot + head * stride_oh + cols_ft[None, :],
                         gl.full([_BM, BLOCK_D_TAIL], float("nan"), O.dtype.element_ty, MMA_OT),
                         mask=(rows_ft < seq_len)[:, None] & (cols_ft < HEAD_DIM)[None, :])


@gluon.jit(do_not_specialize=["stride_ot", "stride_oh", "kv_group", "total_tokens", "max_input_len"])
def prefill_fwd_ws(
    q_desc,   # [total, Hq, D], boxes [64, 1, BLOCK_D]
    qt_desc,  # the same tensor, boxes [64, 1, BLOCK_D_TAIL] (q_desc when there is no tail)
    k_desc,   # [total, Hkv, D], boxes [BLOCK_N, 1, BLOCK_D]
    kt_desc,  # boxes [BLOCK_N, 1, BLOCK_D_TAIL]
    v_desc,
    vt_desc,
    O,        # [total, Hq, D] (rows of every sequence written)
    Sinks,    # [Hq] (read when HAS_SINKS)
    B_Start_Loc, B_Seq_Len,  # [B] int32 / int64
    qk_scale,  # softmax_scale * log2(e)
    stride_ot, stride_oh, kv_group,
    total_tokens,  # q's rows: sequences are clamped into them (and marked if they were not)
    max_input_len,  # rows from it on are NaN (the grid covers cdiv(max_input_len, 128) tiles)
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    IS_CAUSAL: gl.constexpr, HAS_SINKS: gl.constexpr, PIPELINE: gl.constexpr,
    PINGPONG: gl.constexpr, P_SMEM: gl.constexpr, PRODUCER_REGS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, EXP2: gl.constexpr = 0,
):
    """Encoder attention, grid ``(max(cdiv(max_input_len, 128), 1), Hq, B)``; see the module docstring.
    Launched with ``num_warps=4`` (the first consumer group; the other group and the producer
    warp are warp-specialized workers)."""
    BLOCK_D: gl.constexpr = q_desc.block_type.shape[2]
    HAS_TAIL: gl.constexpr = HEAD_DIM > BLOCK_D
    if HAS_TAIL:
        BLOCK_D_TAIL: gl.constexpr = qt_desc.block_type.shape[2]
    else:
        BLOCK_D_TAIL: gl.constexpr = 0
    dt: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dt, [2, _BM, 1, BLOCK_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dt, [NUM_STAGES, BLOCK_N, 1, BLOCK_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dt, [NUM_STAGES, BLOCK_N, 1, BLOCK_D], v_desc.layout)
    if HAS_TAIL:
        qt_smem = gl.allocate_shared_memory(dt, [2, _BM, 1, BLOCK_D_TAIL], qt_desc.layout)
        kt_smem = gl.allocate_shared_memory(dt, [NUM_STAGES, BLOCK_N, 1, BLOCK_D_TAIL], kt_desc.layout)
        vt_smem = gl.allocate_shared_memory(dt, [NUM_STAGES, BLOCK_N, 1, BLOCK_D_TAIL], vt_desc.layout)
    else:  # unused
        qt_smem = q_smem
        kt_smem = k_smem
        vt_smem = v_smem
    if P_SMEM:  # each group's P tile, the A operand of its P.V wgmmas
        p_smem = gl.allocate_shared_memory(dt, [2, _BM, BLOCK_N],
                                           gl.NVMMASharedLayout.get_default_for([_BM, BLOCK_N], dt))
    else:  # unused
        p_smem = q_smem
    # Each group's row sums, stored once per pipelined block only to pin a wgmma wait (_step).
    l_smem = gl.allocate_shared_memory(gl.float32, [2, _BM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for g in gl.static_range(2):
        mbarrier.init(turn.index(g), count=1)
    for st in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(st), count=1)
        mbarrier.init(v_ready.index(st), count=1)
        mbarrier.init(k_empty.index(st), count=2)  # both consumer groups release a stage
        mbarrier.init(v_empty.index(st), count=2)

    gl.warp_specialize([
        (_consumer, (0, q_smem, qt_smem, k_smem, kt_smem, v_smem, vt_smem, p_smem, l_smem,
                     q_bar, k_ready, k_empty, v_ready, v_empty, turn,
                     O, Sinks, B_Start_Loc, B_Seq_Len, qk_scale, stride_ot, stride_oh, total_tokens,
                     max_input_len, HEAD_DIM, BLOCK_N, BLOCK_D, BLOCK_D_TAIL, NUM_STAGES, IS_CAUSAL,
                     HAS_SINKS, PIPELINE, PINGPONG, P_SMEM, EXP2)),
        (_consumer, (1, q_smem, qt_smem, k_smem, kt_smem, v_smem, vt_smem, p_smem, l_smem,
                     q_bar, k_ready, k_empty, v_ready, v_empty, turn,
                     O, Sinks, B_Start_Loc, B_Seq_Len, qk_scale, stride_ot, stride_oh, total_tokens,
                     max_input_len, HEAD_DIM, BLOCK_N, BLOCK_D, BLOCK_D_TAIL, NUM_STAGES, IS_CAUSAL,
                     HAS_SINKS, PIPELINE, PINGPONG, P_SMEM, EXP2)),
        (_producer, (q_desc, qt_desc, k_desc, kt_desc, v_desc, vt_desc,
                     q_smem, qt_smem, k_smem, kt_smem, v_smem, vt_smem,
                     q_bar, k_ready, k_empty, v_ready, v_empty, B_Start_Loc, B_Seq_Len, kv_group,
                     total_tokens, BLOCK_N, BLOCK_D, HAS_TAIL, NUM_STAGES, IS_CAUSAL)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    mbarrier.invalidate(q_bar)
    for g in gl.static_range(2):
        mbarrier.invalidate(turn.index(g))
    for st in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(k_ready.index(st))
        mbarrier.invalidate(v_ready.index(st))
        mbarrier.invalidate(k_empty.index(st))
        mbarrier.invalidate(v_empty.index(st))
