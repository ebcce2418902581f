"""How a request's keys are split across programs: the split cap the host chooses and the
chunking every kernel applies to it, in one module so that they cannot disagree.

The host picks a static cap ``num_kv_splits`` (:func:`verify_num_kv_splits`, safe to bake into
a CUDA graph). Each kernel then cuts a request of length ``L`` into chunks of
:func:`split_chunk` keys, ``max(cdiv(L, num_kv_splits), MIN_SPLIT_LEN)`` rounded up to
``SPLIT_ALIGN``: split ``s`` covers ``[s * chunk, min((s + 1) * chunk, L))``, so a short request
uses fewer splits than the cap. The portable stage 1, the Gluon stage 1 and the stage-2 merge
all call :func:`split_chunk` with the same config's ``SPLIT_ALIGN`` and ``MIN_SPLIT_LEN``.

Balanced splits (a config's ``BALANCE`` = b >= 2, the plan's launches): the cap is b times the
split count a batch of equal lengths would use (``verify_num_kv_splits`` multiplies it), and
stage 1 cuts request r into ``k_r`` pieces (:func:`balanced_splits`) by its share of the
batch's keys: ``k_r = round(cap // b * B * n_r / sum(n))`` within ``[1, cap]``, each piece
``split_chunk(L, k_r)``. Equal lengths give every request ``cap // b`` pieces, what the
launch without the key runs; with unequal ones a long request takes up to b times more pieces
and a short one fewer, so no CTA holds much more than the mean (the longest request no longer
sets the launch's time). The grid keeps the cap (static); its programs take the batch's pieces
request by request (:func:`balanced_piece_order`), so the sum(k) pieces start first and the
programs past them, which return at once, come last. A request of one piece is written straight
to o (no partial), and stage 2 leaves it alone (slot 1's lse is +inf); unused slots get lse -inf.

The balanced grid (a Gluon config's ``GRID``, the swap-AB kernel with a bf16 cache): the batch's
work is laid out as units, request by request ``REQUEST_COST`` units (its fixed cost: Q, the
table check, the output) then one per block of ``BLOCK_N`` keys (at least one, so that a request
without keys still writes its rows); ``U`` units in all. The grid is one CTA per SM, and CTA
``c`` of the ``g`` that hold work takes the units ``[c U // g, (c + 1) U // g)``: a segment of
every request whose blocks reach into that range (the blocks it holds, or none where its range
falls between two of the request's blocks), each written to slot ``c - c_first`` of the
request's ``c_last - c_first + 1`` CTAs, or straight to o where that is one, as the balanced
splits' pieces are, so that stage 2 merges them unchanged. A request's blocks ``[p, p + d]``
meet at most ``ceil(d g / U) + 1`` CTAs, so ``g = min(grid, (S - 1) U // d)`` for the longest
request's ``d`` keeps every request within the ``S`` slots of the workspace
(:func:`grid_num_kv_splits` picks S so that ragged batches keep the whole grid). The CTAs take
their segments in order and count the ring's blocks across them; the next segment's Q is loaded
as soon as both consumer groups are done reading the current one's. :func:`grid_segments` is
the kernel's arithmetic on the host.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import platform
from ..host import cdiv

__all__ = ["balanced_piece_order", "balanced_splits", "grid_num_kv_splits", "grid_segments", "split_chunk",
           "verify_num_kv_splits", "verify_row_blocks"]


@triton.jit
def split_chunk(seq_len, num_kv_splits, SPLIT_ALIGN: tl.constexpr, MIN_SPLIT_LEN: tl.constexpr):
    """Keys per split of a request of ``seq_len`` keys (scalar or tensor; plain integer
    arithmetic, so the Gluon kernels call it too)."""
    chunk = tl.maximum(tl.cdiv(seq_len, num_kv_splits), MIN_SPLIT_LEN)
    return tl.cdiv(chunk, SPLIT_ALIGN) * SPLIT_ALIGN


@triton.jit
def balanced_splits(n_keys, total_keys, batch, num_kv_splits, BALANCE: tl.constexpr):
    """Pieces of a request of ``n_keys`` keys in a balanced launch (the module's docstring):
    ``round(num_kv_splits // BALANCE * batch * n_keys / total_keys)`` within
    ``[1, num_kv_splits]`` (int64 arithmetic; 1 when the batch has no keys). Plain integer
    arithmetic on scalars, so the Gluon kernels call it too."""
    share = tl.maximum(num_kv_splits // BALANCE, 1).to(tl.int64) * batch * n_keys
    k = (2 * share + total_keys) // (2 * tl.maximum(total_keys, 1))
    return tl.minimum(tl.maximum(k, 1), num_kv_splits).to(tl.int32)


def balanced_piece_order(keys: list[int], num_kv_splits: int, balance: int) -> list[tuple[int, int]]:
    """``(request, slot)`` of each piece of a balanced launch, in the order its programs take
    them (the kernels' ``_balanced_piece`` on the host): ``keys`` each request's keys
    (``min(L, L_real)``, clamped to the block table), request by request, ``k_r`` slots each."""
    total, batch, target = sum(keys), len(keys), max(num_kv_splits // balance, 1)
    order = []
    for r, n in enumerate(keys):
        k = min(max((2 * target * batch * n + total) // (2 * max(total, 1)), 1), num_kv_splits)
        order += [(r, s) for s in range(k)]
    return order


def grid_segments(keys: list[int], grid: int, num_kv_splits: int, block_n: int = 64,
                  request_cost: int = 2) -> list[list[tuple[int, int, int, int, int]]]:
    """The balanced grid's segments (the module's docstring; the kernel's ``_grid_requests`` and
    ``_grid_segment`` on the host): for each of the ``grid`` CTAs, ``(request, slot, segments,
    b0, b1)`` of each segment it takes, in order. ``keys``: each request's keys
    (``min(L, L_real)`` clamped to the block table)."""
    blocks = [max(cdiv(max(n, 0), block_n), 1) for n in keys]
    units = max(sum(b + request_cost for b in blocks), 1)
    span = max([b - 1 for b in blocks], default=0)
    g = min(grid, max((num_kv_splits - 1) * units // span, 1)) if span > 0 else grid
    firsts, u = [], 0
    for b in blocks:
        firsts.append(u + request_cost)
        u += b + request_cost
    out = []
    for c in range(grid):
        lo, hi = c * units // g, (c + 1) * units // g
        segs = []
        for r, (n, first, b) in enumerate(zip(keys, firsts, blocks)):
            if first + b <= lo or first >= hi:  # its last block's CTA below c, or its first above
                continue
            nb = cdiv(max(n, 0), block_n)
            c_first = ((first + 1) * g - 1) // units
            c_last = ((first + b) * g - 1) // units
            segs.append((r, c - c_first, c_last - c_first + 1, min(max(lo - first, 0), nb),
                         min(max(hi - first, 0), nb)))
        out.append(segs)
    return out


def grid_num_kv_splits(batch: int, sm_count: int | None = None) -> int:
    """The balanced grid's split cap (its slots per request): ``1 + cdiv(2 * sm_count, batch)``,
    which keeps the whole grid at work while the longest request holds up to twice the mean
    (uniformly ragged lengths; the kernel narrows the grid where one holds more, so any cap of
    2 or more is correct)."""
    sm_count = platform.current().sm_count if sm_count is None else sm_count
    return 1 + cdiv(2 * max(1, sm_count), max(1, batch))


def verify_row_blocks(qlen: int, num_heads: int, block_h: int) -> int:
    """Stage-1 row blocks per request: ``cdiv(qlen * num_heads, block_h)``."""
    return cdiv(qlen * num_heads, block_h)


def verify_num_kv_splits(
    max_seq_len: int,
    batch: int,
    qlen: int,
    num_heads: int,
    sm_count: int | None = None,
    block_h: int | None = None,
    occupancy: float = 1.0,
    min_work_per_split: int | None = None,
    max_splits: int = 8,
    balance: int | None = None,
    grid: bool | None = None,
) -> int:
    """Static upper bound on KV splits (safe to bake into a CUDA graph).

    The kernels chunk each request's own length (:func:`split_chunk`), so this only caps the
    split count. ``occupancy`` is the number of resident stage-1 programs per SM/CU. If one
    split of every request fits in a single dispatch round, use as many splits as fit in that
    round; otherwise pick n <= max_splits minimising rounds(n) / n (the idle tail of the last
    round), preferring fewer splits within 5% of the best.

    ``block_h`` and ``min_work_per_split`` default to the config the table selects for this
    batch (its ``BLOCK_H`` and ``SPLIT_WORK``), and ``sm_count`` to this GPU's: the programs per
    split, and so the cap, follow the tile the launch will run (a fixed 32-row guess disagrees
    with the sm_90 table's 16/64-row tiles, which cost up to 2x on the H200 and twice the
    workspace at M1).

    ``balance`` (default: the config's ``BALANCE``): a config that balances its splits gets
    ``balance`` times the count as its cap (the module's docstring), at least 2.

    ``grid`` (default: the config's ``GRID``): a launch on the balanced grid gets
    :func:`grid_num_kv_splits` (the launches the grid does not take, fp8 caches, draft trees,
    ragged draft counts, context-parallel ranks, run the config without it on that cap).
    """
    if block_h is None or min_work_per_split is None or balance is None or grid is None:
        # Imported here: configs -> gluon_launch -> gluon_kernels -> kernels -> this module.
        from .configs import select_verify_config

        cfg = select_verify_config(batch, qlen, num_heads)
        block_h = cfg["BLOCK_H"] if block_h is None else block_h
        min_work_per_split = (cfg["SPLIT_WORK"] if min_work_per_split is None
                              else min_work_per_split)
        balance = cfg.get("BALANCE", 0) if balance is None else balance
        grid = bool(cfg.get("GRID", 0)) if grid is None else grid
    if grid:
        return grid_num_kv_splits(batch, sm_count)
    sm_count = platform.current().sm_count if sm_count is None else sm_count
    programs_per_split = max(1, batch) * verify_row_blocks(qlen, num_heads, block_h)
    ideal = cdiv(max(1, max_seq_len), max(1, min_work_per_split))
    slots = max(1, int(occupancy * sm_count))
    if programs_per_split <= slots:
        n = slots // programs_per_split
    else:
        cost = [
            (cdiv(n * programs_per_split, slots) / n, n)
            for n in range(1, max(1, min(ideal, max_splits)) + 1)
        ]
        best = min(c for c, _ in cost)
        n = min(n for c, n in cost if c <= best * 1.05)
    n = max(1, min(ideal, n, sm_count * 2))
    return n * balance if balance and balance >= 2 else n
