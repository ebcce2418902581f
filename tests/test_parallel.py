"""Decode context parallelism: the sharding helpers, the verify kernel's sharded path, and the
whole step (mla_ops.context_parallel) across processes.

CPU CI: the local-length formulas against a brute-force count (the kernel's own Triton helper
included); the reference's sharded path merged over ranks against the full reference; the
kernel's sharded path in the interpreter against the reference on each rank's shard; and the
step on 2 and 3 gloo processes against float64 attention over the full cache (three processes
spawn once and run every case, the 2-rank ones on a subgroup; a case's failure is reported
under its own test id), its capture-and-replay path included.

GPU: the kernel's sharded path in bf16 at serving shapes, and (2 GPUs, NCCL) the step on the
Triton kernels with every merge method, then captured in a CUDA graph and replayed on new data.

Inputs are random (never zeros), every output and internal buffer is NaN before each call, the
local cache is NaN past each request's local length, and accuracy follows the tests' one rule
(``builders.assert_accurate``: flash-attention's).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import traceback

import pytest
import torch
import triton
import triton.language as tl

import mla_ops  # noqa: F401  (registers torch.ops.mla)
from mla_ops import platform
from mla_ops.context_parallel import (
    CPAttnCombiner,
    check_context_parallel,
    CPVerify,
    shard_kv_cache,
    shard_lengths,
    shard_positions,
)
from mla_ops.decode_verify.kernels import _cp_local_len
from mla_ops.decode_verify.launch import (
    decode_attention_fwd_verify,
    warmup_decode_attention_fwd_verify,
)
from mla_ops.reference import cp_global_positions, decode_verify_ref, merge_attn_states_ref

from builders import assert_accurate

SM_SCALE = 0.1352
SMALL_SPLITS = {"BLOCK_N": 16, "SPLIT_ALIGN": 16, "MIN_SPLIT_LEN": 16}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def brute_local_len(n: int, world: int, rank: int, interleave: int) -> int:
    return sum(1 for p in range(n) if (p // interleave) % world == rank)


# --- the local-length helpers ---------------------------------------------------------------

GEOMETRIES = [(w, r, i) for w in (1, 2, 3, 4) for r in range(w) for i in (1, 3, 16, 64)]


@pytest.mark.parametrize("world,rank,interleave", GEOMETRIES)
def test_shard_lengths_is_the_brute_force_count(world, rank, interleave):
    ns = list(range(0, 3 * world * interleave + 5)) + [10_000, 131_071]
    want = [brute_local_len(n, world, rank, interleave) for n in ns]
    assert [shard_lengths(n, world, rank, interleave) for n in ns] == want
    got = shard_lengths(torch.tensor(ns, dtype=torch.int32), world, rank, interleave)
    assert got.dtype == torch.int32 and got.tolist() == want
    assert want == [len(cp_global_positions(n, world, rank, interleave)) for n in ns]


def test_shard_positions_maps_to_the_local_order():
    for world, rank, interleave in [(2, 1, 16), (3, 0, 1), (3, 2, 5), (4, 3, 64)]:
        n = 5 * world * interleave + 7
        pos = torch.arange(n)
        owned, local = shard_positions(pos, world, rank, interleave)
        mine = cp_global_positions(n, world, rank, interleave)
        assert torch.equal(pos[owned], mine)
        assert torch.equal(local[owned], torch.arange(len(mine)))
        # Elsewhere (what the docstring says): the rank's slot at the same offset of the round,
        # the slot of another token, so a slot mapping must mask it with ``owned``.
        span = world * interleave
        same_offset = pos // span * span + rank * interleave + pos % interleave
        its_owned, its_local = shard_positions(same_offset, world, rank, interleave)
        assert its_owned.all() and torch.equal(local, its_local)
        assert torch.equal(local, pos // span * interleave + pos % interleave)


@triton.jit
def _local_len_probe(N, Out, cp_rank, count, CP_WORLD: tl.constexpr, CP_INTERLEAVE: tl.constexpr,
                     BLOCK: tl.constexpr):
    # Test harness: runs the kernels' own helper on a vector of lengths.
    offs = tl.arange(0, BLOCK)
    n = tl.load(N + offs, mask=offs < count, other=0)
    tl.store(Out + offs, _cp_local_len(n, cp_rank, CP_WORLD, CP_INTERLEAVE), mask=offs < count)


@pytest.mark.parametrize("world,interleave", [(2, 1), (2, 16), (3, 64), (4, 5)])
def test_kernel_local_len_helper_is_the_brute_force_count(device, world, interleave):
    ns = list(range(0, 2 * world * interleave + 3)) + [4097, 65_537]
    block = triton.next_power_of_2(len(ns))
    n = torch.tensor(ns, dtype=torch.int32, device=device)
    for rank in range(world):
        out = torch.full_like(n, -1)
        _local_len_probe[(1,)](n, out, rank, len(ns), CP_WORLD=world, CP_INTERLEAVE=interleave,
                               BLOCK=block)
        assert out.tolist() == [brute_local_len(v, world, rank, interleave) for v in ns], rank


@pytest.mark.parametrize("kw,exc,name", [
    (dict(cp_world=0), ValueError, "cp_world:"),
    (dict(cp_world=2, cp_rank=2), ValueError, "cp_rank:"),
    (dict(cp_world=2, cp_rank=-1), ValueError, "cp_rank:"),
    (dict(cp_world=2, cp_interleave=0), ValueError, "cp_interleave:"),
    (dict(cp_world=2.0), TypeError, "cp_world:"),
    (dict(cp_world=2, cp_rank=True), TypeError, "cp_rank:"),
])
def test_bad_context_parallel_args_name_the_argument(device, kw, exc, name):
    full = {"cp_world": 1, "cp_rank": 0, "cp_interleave": 1, **kw}
    with pytest.raises(exc, match=f"^{name}"):
        check_context_parallel(**full)
    case = make_global(Case("bad", 2, 2, 2, (5, 9), None, 16, 1, "fp32"), device)
    o = torch.full((4, 2, 32), float("nan"), device=device)
    lse = torch.full((4, 2), float("nan"), device=device)
    with pytest.raises(exc, match=f"^{name}"):
        decode_attention_fwd_verify(case.q, case.cache, case.cache[..., :32], o, lse, case.table,
                                    case.lens, None, 2, None, 1, SM_SCALE, 16, None, **full)
    assert torch.isnan(o).all(), "refused before any launch"


# --- cases: a global batch, sharded -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    world: int
    heads: int
    qlen: int
    lens: tuple
    real: tuple | None
    page: int
    interleave: int
    dtype: str
    method: str = "rs"
    kernel: str = "reference"
    splits: int = 3
    comm_dtype: str | None = None
    Lv: int = 32
    rope: int = 16
    seed: int = 0
    capture: bool = False  # run_capture_case: eager, then captured and replayed on new data


@dataclasses.dataclass
class Global:
    q: torch.Tensor
    cache: torch.Tensor  # [pages, page, 1, Lk], NaN past every request's end
    table: torch.Tensor
    lens: torch.Tensor
    real: torch.Tensor | None


def make_global(case: Case, device) -> Global:
    """The full (unsharded) batch, the same in every process (seeded)."""
    g = torch.Generator().manual_seed(1000 + case.seed)
    dtype = DTYPES[case.dtype]
    B = len(case.lens)
    per_req = max(1, math.ceil(max(case.lens) / case.page))
    num_pages = B * per_req + 2
    Lk = case.Lv + case.rope
    cache = torch.randn(num_pages, case.page, 1, Lk, generator=g)
    table = torch.randperm(num_pages, generator=g)[: B * per_req].view(B, per_req).int()
    live = torch.zeros(num_pages, case.page, dtype=torch.bool)
    for b, n in enumerate(case.lens):
        for j in range(per_req):
            live[table[b, j], : max(0, min(case.page, n - j * case.page))] = True
    cache[~live] = float("nan")
    q = torch.randn(B * case.qlen, case.heads, Lk, generator=g)
    real = None if case.real is None else torch.tensor(case.real, dtype=torch.int32, device=device)
    return Global(q.to(device=device, dtype=dtype), cache.to(device=device, dtype=dtype),
                  table.to(device), torch.tensor(case.lens, dtype=torch.int32, device=device), real)


def shard(case: Case, glob: Global, rank: int):
    """Rank ``rank``'s cache (NaN past each local length, two spare pages) and block table, the
    pages handed out in a random order."""
    gen = torch.Generator(device=glob.cache.device).manual_seed(77 + rank)
    return shard_kv_cache(glob.cache, glob.table, glob.lens, case.page, case.world, rank,
                          case.interleave, pad_value=float("nan"), spare_pages=2, generator=gen)


def full_references(case: Case, glob: Global):
    """float64 attention over the full cache, and plain PyTorch's in the case's dtype."""
    args = (glob.q, glob.cache, case.Lv, glob.table, glob.lens, glob.real, case.qlen, SM_SCALE,
            case.page)
    ref = decode_verify_ref(*args, compute_dtype=torch.float64)
    pt = decode_verify_ref(*args, compute_dtype=DTYPES[case.dtype])
    return ref, pt


def check_against_full(name, case: Case, o, lse, ref, pt, heads: slice):
    """The merged result of ``heads`` against the full attention (the tolerance rule), the
    -inf pattern exact, o exactly 0 on rows that see no key."""
    dtype = DTYPES[case.dtype]
    ref_o, ref_lse = ref[0][:, heads], ref[1][:, heads]
    assert_accurate(f"{name} o", o, ref_o, pt[0][:, heads], dtype)
    assert_accurate(f"{name} lse", lse, ref_lse, pt[1][:, heads], dtype)
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), f"{name}: -inf pattern differs"
    assert (o[empty] == 0).all(), f"{name}: rows with no key must get o = 0"


# --- the reference's sharded path, merged, is the full reference ------------------------------


@pytest.mark.parametrize("world,interleave", [(2, 1), (2, 16), (3, 5), (3, 64), (4, 16)])
def test_reference_shards_merge_to_the_full_reference(world, interleave):
    case = Case("ref", world, 3, 3, (1, 2, 37, 130, 200), (1, 0, 37, 100, 199), 16, interleave,
                "fp32")
    glob = make_global(case, "cpu")
    ref, _ = full_references(case, glob)
    parts = []
    for rank in range(world):
        cache, table = shard(case, glob, rank)
        parts.append(decode_verify_ref(glob.q, cache, case.Lv, table, glob.lens, glob.real,
                                       case.qlen, SM_SCALE, case.page, None, torch.float64,
                                       world, rank, interleave))
    o, lse = merge_attn_states_ref(torch.stack([p[0] for p in parts]),
                                   torch.stack([p[1] for p in parts]), torch.float64)
    torch.testing.assert_close(o, ref[0], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, ref[1], atol=1e-12, rtol=1e-12)


# --- the kernel's sharded path, per rank, against the reference on the same shard -------------

KERNEL_CP = [
    # id, world, rank, interleave, splits, config overrides, mock sm_90 with 1 SM
    ("w2-r0-I1-1split", 2, 0, 1, 1, {}, False),
    ("w2-r1-I16-3splits", 2, 1, 16, 3, {}, False),
    ("w3-r2-I64-4splits", 3, 2, 64, 4, {}, False),
    ("w3-r1-I5-2splits-swap", 3, 1, 5, 2,
     {"SWAP_AB": 1, "BLOCK_N": 64, "BLOCK_H": 32, "num_warps": 4}, False),
    ("w2-r1-I16-persistent-tma", 2, 1, 16, 3, {"TMA": 1, "QSPLIT": 1, "PERSISTENT": 1}, True),
    ("w4-r3-I16-s2-block-dv", 4, 3, 16, 5, {"S2_BLOCK_DV": 16}, False),
]


@pytest.mark.parametrize("world,rank,interleave,splits,config,mock", [c[1:] for c in KERNEL_CP],
                         ids=[c[0] for c in KERNEL_CP])
def test_kernel_cp_path_matches_reference(device, world, rank, interleave, splits, config, mock):
    case = Case("k", world, 4, 3, (2, 45, 230), (2, 0, 200), 16, interleave, "fp16")
    glob = make_global(case, device)
    cache, table = shard(case, glob, rank)
    rows, heads, Lv = glob.q.shape[0], case.heads, case.Lv
    o = torch.full((rows, heads, Lv), float("nan"), dtype=glob.q.dtype, device=device)
    lse = torch.full((rows, heads), float("nan"), device=device)
    ws = torch.full((rows, heads, splits, Lv + 1), float("nan"), device=device) if splits > 1 else None
    cp = (world, rank, interleave)
    with platform.mock_platform("sm_90", sm_count=1) if mock else _nullcontext():
        decode_attention_fwd_verify(glob.q, cache, cache[..., :Lv], o, lse, table, glob.lens,
                                    glob.real, case.qlen, ws, splits, SM_SCALE, case.page, None,
                                    *cp, config={**SMALL_SPLITS, **config})
    args = (glob.q, cache, Lv, table, glob.lens, glob.real, case.qlen, SM_SCALE, case.page, None)
    ref_o, ref_lse = decode_verify_ref(*args, torch.float64, *cp)
    pt_o, pt_lse = decode_verify_ref(*args, torch.float16, *cp)
    assert_accurate("o", o, ref_o, pt_o, torch.float16)
    assert_accurate("lse", lse, ref_lse, pt_lse, torch.float16)
    empty = torch.isinf(ref_lse)
    assert empty.any() and not empty.all(), "the case should have rows this rank sees and rows it does not"
    assert torch.equal(torch.isneginf(lse), empty) and (o[empty] == 0).all()


def test_kernel_cp_splits_cut_the_local_length(device):
    """With the cache sharded, each request's splits cut its LOCAL length: the splits that hold
    keys of row t (finite LSE in the workspace) are exactly the first
    ``cdiv(local_lim_t, chunk)``, ``chunk = align(max(cdiv(local_L, splits), MIN_SPLIT_LEN))``.
    (Cutting the global length instead gives the same o, but fewer, longer splits.)"""
    world, rank, interleave, splits = 2, 1, 16, 4
    case = Case("k", world, 2, 2, (300, 700), (300, 500), 16, interleave, "fp32")
    glob = make_global(case, device)
    cache, table = shard(case, glob, rank)
    rows, heads, Lv = glob.q.shape[0], case.heads, case.Lv
    o = torch.full((rows, heads, Lv), float("nan"), device=device)
    lse = torch.full((rows, heads), float("nan"), device=device)
    ws = torch.full((rows, heads, splits, Lv + 1), float("nan"), device=device)
    decode_attention_fwd_verify(glob.q, cache, cache[..., :Lv], o, lse, table, glob.lens, glob.real,
                                case.qlen, ws, splits, SM_SCALE, case.page, None, world, rank,
                                interleave, config=SMALL_SPLITS)
    align, min_len = SMALL_SPLITS["SPLIT_ALIGN"], SMALL_SPLITS["MIN_SPLIT_LEN"]
    for b, (L, L_real) in enumerate(zip(case.lens, case.real)):
        local_L = brute_local_len(L, world, rank, interleave)
        chunk = math.ceil(max(math.ceil(local_L / splits), min_len) / align) * align
        for t in range(case.qlen):
            lim = brute_local_len(max(min(L - case.qlen + 1 + t, L_real), 0), world, rank, interleave)
            want = [s < min(math.ceil(lim / chunk), splits) for s in range(splits)]
            got = torch.isfinite(ws[b * case.qlen + t, :, :, Lv])  # [heads, splits]
            assert got.tolist() == [want] * heads, (b, t, lim, chunk)


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# --- the step over gloo processes -------------------------------------------------------------

# Ragged lengths, lengths below qlen and real lengths of 0 (rows that see no key at all), a rank
# that holds none of a request (interleave 64 > L), every merge method, fp32 / fp16 / bf16 on the
# reference path, and the Triton kernels (the interpreter) end to end.
GLOO_CASES = [
    Case("w2-I1-fp32-rs-ragged", 2, 4, 2, (1, 37, 130), None, 16, 1, "fp32"),
    Case("w2-I16-fp16-rs-real", 2, 4, 3, (2, 50, 129), (0, 50, 64), 16, 16, "fp16", seed=1),
    Case("w2-I64-fp16-ar-below-qlen", 2, 4, 4, (3, 200), None, 64, 64, "fp16", method="ar", seed=2),
    Case("w2-I64-bf16-a2a", 2, 4, 2, (63, 64, 65, 300), (63, 10, 65, 300), 64, 64, "bf16",
         method="a2a", seed=3),
    Case("w2-I16-fp32-a2a-real", 2, 2, 3, (17, 90), (0, 40), 1, 16, "fp32", method="a2a", seed=4),
    Case("w2-I1-bf16-rs-fp32-sum", 2, 4, 2, (33, 100), None, 16, 1, "bf16", comm_dtype="fp32",
         seed=5),
    Case("w2-I16-fp16-rs-triton", 2, 4, 2, (40, 100), (40, 70), 16, 16, "fp16", kernel="triton",
         seed=6),
    Case("w2-I16-fp16-ar-fp32-sum", 2, 3, 2, (2, 77), (0, 77), 16, 16, "fp16", method="ar",
         comm_dtype="fp32", seed=8),
    # The capture-and-replay path of the NCCL test (replays are plain calls on CPU).
    Case("w2-I16-fp16-rs-replays", 2, 4, 2, (40, 130, 7), (40, 100, 7), 16, 16, "fp16",
         capture=True, seed=14),
    Case("w3-I1-fp32-rs-ragged", 3, 3, 2, (1, 37, 130), None, 16, 1, "fp32", seed=9),
    Case("w3-I16-fp16-ar-real", 3, 4, 3, (2, 50, 129), (1, 50, 64), 16, 16, "fp16", method="ar",
         seed=10),
    Case("w3-I64-fp16-a2a-empty-ranks", 3, 6, 2, (10, 64, 129, 200), None, 64, 64, "fp16",
         method="a2a", seed=11),
    Case("w3-I16-bf16-rs-real", 3, 3, 4, (4, 100, 250), (0, 100, 180), 16, 16, "bf16", seed=12),
    Case("w3-I5-fp16-a2a-triton", 3, 3, 2, (3, 48), (3, 30), 16, 5, "fp16", method="a2a",
         kernel="triton", seed=13),
]


def _heads(case: Case, rank: int) -> slice:
    if case.method == "ar":
        return slice(0, case.heads)
    hl = case.heads // case.world
    return slice(rank * hl, (rank + 1) * hl)


def _poison(step: CPVerify) -> None:
    """NaN into every buffer the step and its combiner own (nothing may survive from before)."""
    for obj in (step, step.combiner):
        for v in vars(obj).values():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                v.fill_(float("nan"))


def make_step(case: Case, group, device) -> CPVerify:
    """A step for the case's batch plus one request (calls use a prefix of its buffers)."""
    return CPVerify(group, max_batch=len(case.lens) + 1, max_qlen=case.qlen, num_heads=case.heads,
                    Lv=case.Lv, Lk=case.Lv + case.rope, dtype=DTYPES[case.dtype], device=device,
                    page_size=case.page, sm_scale=SM_SCALE, interleave=case.interleave,
                    num_kv_splits=case.splits, method=case.method,
                    comm_dtype=DTYPES[case.comm_dtype] if case.comm_dtype else None,
                    kernel=case.kernel, config=SMALL_SPLITS)


def run_gloo_case(case: Case, rank: int, group) -> None:
    """One case on this rank: the step on the shard vs float64 attention over the full cache
    (and, for the Triton cases, vs the single-process op on the full cache). Raises on error.

    Every collective runs before any check, so that a failed check on one rank cannot leave
    the others waiting in a collective it skipped."""
    glob = make_global(case, "cpu")
    cache, table = shard(case, glob, rank)
    step = make_step(case, group, "cpu")
    _poison(step)
    o, lse = [t.clone() for t in step(glob.q, cache, table, glob.lens, glob.real, case.qlen)]
    if case.kernel == "reference":
        # Again on the same (reused) buffers, poisoned: the same answer, bit for bit.
        _poison(step)
        o2, lse2 = step(glob.q, cache, table, glob.lens, glob.real, case.qlen)
        assert torch.equal(o2, o) and torch.equal(lse2, lse), "a second call differs"
    ref, pt = full_references(case, glob)
    heads = _heads(case, rank)
    check_against_full(case.id, case, o, lse, ref, pt, heads)
    if case.kernel == "triton" and rank == 0:  # (one rank suffices: it is the same op)
        rows = glob.q.shape[0]
        op_o = torch.full((rows, case.heads, case.Lv), float("nan"), dtype=glob.q.dtype)
        op_lse = torch.full((rows, case.heads), float("nan"))
        ws = torch.empty(rows, case.heads, case.splits, case.Lv + 1)
        torch.ops.mla.decode_verify(glob.q, glob.cache, glob.cache[..., : case.Lv], op_o, op_lse,
                                    glob.table, glob.lens, glob.real, case.qlen, ws, case.splits,
                                    SM_SCALE, case.page, None)
        # The sharded step is about as accurate as the single-process op on the full cache.
        dtype = DTYPES[case.dtype]
        assert_accurate(f"{case.id} o vs the op", o, ref[0][:, heads], op_o[:, heads], dtype)
        assert_accurate(f"{case.id} lse vs the op", lse, ref[1][:, heads], op_lse[:, heads], dtype)


def _capture(fn, device):
    """``(outputs, replay)`` of ``fn`` captured in a CUDA graph. Elsewhere (the gloo run of this
    path) ``replay`` calls ``fn`` again: the step returns views of buffers it owns, so the
    outputs are refreshed in place either way."""
    if device.type != "cuda":
        return fn(), fn
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # thread_local: the NCCL watchdog thread may query its events while this thread captures.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        out = fn()
    return out, graph.replay


def run_capture_case(case: Case, rank: int, device, group=None) -> None:
    """Eager step vs the full attention, then the step captured (a CUDA graph on GPUs) and
    replayed on new queries, cache contents and (shorter) lengths, each replay checked the same
    way. All collectives (eager, capture, replays) run before any check (see run_gloo_case)."""
    glob = make_global(case, device)
    cache, table = shard(case, glob, rank)
    step = CPVerify(group, max_batch=len(case.lens), max_qlen=case.qlen, num_heads=case.heads,
                    Lv=case.Lv, Lk=case.Lv + case.rope, dtype=DTYPES[case.dtype], device=device,
                    page_size=case.page, sm_scale=SM_SCALE, interleave=case.interleave,
                    num_kv_splits=case.splits, method=case.method,
                    comm_dtype=DTYPES[case.comm_dtype] if case.comm_dtype else None,
                    kernel=case.kernel)
    heads = _heads(case, rank)
    lens = glob.lens.clone()
    real = glob.real.clone() if glob.real is not None else None
    _poison(step)
    o, lse = step(glob.q, cache, table, lens, real, case.qlen)  # eager: compiles, inits NCCL
    done = [("eager", o.clone(), lse.clone(), dataclasses.replace(glob, q=glob.q.clone()))]

    (o_g, lse_g), replay = _capture(lambda: step(glob.q, cache, table, lens, real, case.qlen),
                                    device)
    gen = torch.Generator(device=device).manual_seed(5)
    for trial in range(2):
        # New queries and cache contents at the same lengths (so the same local page order and
        # table), then shorter lengths: a prefix of the global sequence is held as a prefix of
        # every rank's local sequence, so the captured cache and table still describe it.
        new = make_global(dataclasses.replace(case, seed=case.seed + 100 + trial), device)
        new_cache, new_table = shard(case, new, rank)
        assert torch.equal(new_table, table)
        new.lens = torch.minimum(glob.lens, torch.randint(0, max(case.lens) + 1, lens.shape,
                                                          generator=gen, device=device).int())
        glob.q.copy_(new.q)
        cache.copy_(new_cache)
        lens.copy_(new.lens)
        if real is not None:
            new.real = torch.minimum(new.lens, glob.real)
            real.copy_(new.real)
        _poison(step)
        replay()
        done.append((f"replay {trial}", o_g.clone(), lse_g.clone(), new))
    if device.type == "cuda":
        torch.cuda.synchronize()
    for name, o, lse, g in done:
        check_against_full(f"{case.id} {name}", case, o, lse, *full_references(case, g), heads)


GLOO_PROCESSES = 3


def _gloo_worker(rank: int, world: int, init_file: str, out_dir: str, cases: list) -> None:
    """All cases in one set of processes: the 3-rank cases on the default group, the 2-rank ones
    on a subgroup of ranks 0 and 1 (rank 2 waits), so that the group plumbing is exercised and
    the processes start once."""
    import torch.distributed as dist

    # One thread per process: the ranks share the CI machine's cores, and idle intra-op threads
    # spinning beside another rank's interpreter slowed a case tenfold.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    groups = {world: None, 2: dist.new_group([0, 1])}
    results = {}
    try:
        for case in cases:
            if rank < case.world:
                try:
                    if case.capture:
                        run_capture_case(case, rank, torch.device("cpu"), groups[case.world])
                    else:
                        run_gloo_case(case, rank, groups[case.world])
                    results[case.id] = None
                except Exception:  # noqa: BLE001 - reported under the case's own test id
                    results[case.id] = traceback.format_exc()
            dist.barrier()
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()


def _spawn(fn, world: int, tmp_path, *args) -> list[dict]:
    import torch.multiprocessing as mp

    init = tmp_path / "init"
    mp.start_processes(fn, args=(world, str(init), str(tmp_path), *args), nprocs=world,
                       join=True, start_method="spawn")
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def gloo_results(tmp_path_factory):
    return _spawn(_gloo_worker, GLOO_PROCESSES, tmp_path_factory.mktemp("gloo"), GLOO_CASES)


@pytest.mark.parametrize("case", GLOO_CASES, ids=[c.id for c in GLOO_CASES])
def test_gloo_step_matches_full_attention(gloo_results, case):
    if case.kernel == "triton" and torch.cuda.is_available():
        pytest.skip("the Triton kernels on CPU tensors run in the interpreter (CPU CI); on a GPU "
                    "machine the NCCL cases run them")
    for rank, results in enumerate(gloo_results[: case.world]):
        err = results.get(case.id, "not run")
        assert err is None, f"rank {rank}:\n{err}"


def test_step_rejects_bad_arguments(tmp_path):
    """Argument errors name the argument (on a one-process gloo group)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        kw = dict(max_rows=4, num_heads=3, head_dim=16, dtype=torch.float32, device="cpu")
        with pytest.raises(ValueError, match="^method:"):
            CPAttnCombiner(None, method="ring", **kw)
        with pytest.raises(ValueError, match="^kernel:"):
            CPAttnCombiner(None, kernel="cuda", **kw)
        comb = CPAttnCombiner(None, **kw)
        with pytest.raises(ValueError, match="^o_part:"):
            comb(torch.zeros(5, 3, 16), torch.zeros(5, 3))
        with pytest.raises(ValueError, match="^lse_part:"):
            comb(torch.zeros(2, 3, 16), torch.zeros(2, 3, dtype=torch.float64))
        with pytest.raises(ValueError, match="^max_seq_len:"):
            CPVerify(None, max_batch=1, max_qlen=2, num_heads=2, Lv=32, Lk=48, dtype=torch.float32,
                     device="cpu", page_size=16, sm_scale=0.1, interleave=1)
        with pytest.raises(ValueError, match="^cp_interleave:"):
            CPVerify(None, max_batch=1, max_qlen=2, num_heads=2, Lv=32, Lk=48, dtype=torch.float32,
                     device="cpu", page_size=16, sm_scale=0.1, interleave=0, num_kv_splits=1)
    finally:
        dist.destroy_process_group()


# --- GPU --------------------------------------------------------------------------------------

GPU_KERNEL_CP = [
    # id, world, rank, interleave, qlen, heads, lens, real, splits
    ("w2-r1-I64-H16-q2", 2, 1, 64, 2, 16, (1, 700, 4097, 63), None, 4),
    ("w2-r0-I1-H128-q4", 2, 0, 1, 4, 128, (3, 3000), (3, 2000), 6),
    ("w4-r2-I16-H16-q8", 4, 2, 16, 8, 16, (9, 1023, 20000), (9, 0, 20000), 16),
]


def _gluon_why(device) -> str | None:
    from mla_ops.decode_verify.gluon_launch import gluon_unsupported_shape

    return gluon_unsupported_shape(torch.device(device), torch.bfloat16, torch.bfloat16, 16, 576,
                                   512, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("world,rank,interleave,qlen,heads,lens,real,splits",
                         [c[1:] for c in GPU_KERNEL_CP], ids=[c[0] for c in GPU_KERNEL_CP])
@pytest.mark.parametrize("config", [None, {"SWAP_AB": 1, "BLOCK_N": 64, "BLOCK_H": 32,
                                           "num_warps": 4, "num_stages": 2},
                                    {"family": "gluon"},
                                    {"family": "gluon", "SCHEDULE": "alt", "QK_FIRST": 1},
                                    {"family": "gluon", "SCHEDULE": "redundant"},
                                    {"family": "gluon", "PDL": 1}],
                         ids=["table", "swap-h32", "gluon", "gluon-qkfirst", "gluon-redundant", "gluon-pdl"])
def test_gpu_kernel_cp_path_matches_reference(device, world, rank, interleave, qlen, heads, lens,
                                              real, splits, config):
    """A rank's partial over its shard, on the table's config and on each kernel family and
    schedule (the Gluon family on sm_90 with triton 3.6 only)."""
    if config and config.get("family") == "gluon":
        if _gluon_why(device):
            pytest.skip(f"no Gluon family here: {_gluon_why(device)}")
    elif config and heads >= 64:
        config = {**config, "BLOCK_H": 64, "num_warps": 8}
    case = Case("g", world, heads, qlen, lens, real, 64, interleave, "bf16", Lv=512, rope=64)
    glob = make_global(case, device)
    cache, table = shard(case, glob, rank)
    rows = glob.q.shape[0]
    o = torch.full((rows, heads, 512), float("nan"), dtype=torch.bfloat16, device=device)
    lse = torch.full((rows, heads), float("nan"), device=device)
    ws = torch.empty(rows, heads, splits, 513, device=device)
    cp = (world, rank, interleave)
    decode_attention_fwd_verify(glob.q, cache, cache[..., :512], o, lse, table, glob.lens,
                                glob.real, qlen, ws, splits, SM_SCALE, 64, None, *cp, config=config)
    args = (glob.q, cache, 512, table, glob.lens, glob.real, qlen, SM_SCALE, 64, None)
    ref_o, ref_lse = decode_verify_ref(*args, torch.float64, *cp)
    pt_o, pt_lse = decode_verify_ref(*args, torch.bfloat16, *cp)
    assert_accurate("o", o, ref_o, pt_o, torch.bfloat16)
    assert_accurate("lse", lse, ref_lse, pt_lse, torch.bfloat16)
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty) and (o[empty] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128], ids=["H16-portable", "H128-table"])
def test_gpu_cp_warmup_then_capture_compiles_nothing(device, heads):
    """The warmup with the context-parallel arguments compiles what a sharded capture needs,
    for every rank (cp_rank is not compiled in), with one split and several. H16 here (128 rows)
    runs the portable kernel; H128 the table's Gluon family on sm_90."""
    from test_decode_verify import _CompileCounter

    world, interleave, qlen, page, splits = 2, 64, 2, 64, 4
    case = Case("w", world, heads, qlen, (3000, 700, 5, 4000), (3000, 0, 5, 3500), page,
                interleave, "bf16", Lv=512, rope=64)
    glob = make_global(case, device)
    cache, table = shard(case, glob, 1)
    rows = glob.q.shape[0]
    o = torch.empty(rows, heads, 512, dtype=torch.bfloat16, device=device)
    lse = torch.empty(rows, heads, device=device)
    ws = torch.empty(rows, heads, splits, 513, device=device)
    warmup_decode_attention_fwd_verify(glob.q, cache, o, lse, table, True, [qlen], ws, SM_SCALE,
                                       page, None, world, 1, interleave)
    counter = _CompileCounter()
    with counter:
        before = counter.cached()
        graphs = {}
        for rank in (0, 1):
            for n in (1, splits):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    decode_attention_fwd_verify(glob.q, cache, cache[..., :512], o, lse, table,
                                                glob.lens, glob.real, qlen, ws if n > 1 else None,
                                                n, SM_SCALE, page, None, world, rank, interleave)
                graphs[rank, n] = g
        assert counter.hooked == 0 and counter.cached() == before, "a capture compiled a kernel"
    o.fill_(float("nan"))
    lse.fill_(float("nan"))
    graphs[1, splits].replay()
    args = (glob.q, cache, 512, table, glob.lens, glob.real, qlen, SM_SCALE, page, None)
    ref_o, ref_lse = decode_verify_ref(*args, torch.float64, world, 1, interleave)
    pt_o, pt_lse = decode_verify_ref(*args, torch.bfloat16, world, 1, interleave)
    assert_accurate("o", o, ref_o, pt_o, torch.bfloat16)
    assert_accurate("lse", lse, ref_lse, pt_lse, torch.bfloat16)


NCCL_CASES = [
    Case("nccl-I64-H16-q2-rs", 2, 16, 2, (1, 700, 4097, 63), None, 64, 64, "bf16", "rs", "triton",
         4, Lv=512, rope=64, seed=20),
    Case("nccl-I1-H16-q4-ar", 2, 16, 4, (3, 1500, 2049), (3, 0, 1800), 64, 1, "bf16", "ar",
         "triton", 4, Lv=512, rope=64, seed=21),
    Case("nccl-I16-H128-q2-a2a", 2, 128, 2, (2, 3000), (2, 2500), 64, 16, "bf16", "a2a", "triton",
         6, Lv=512, rope=64, seed=22),
    Case("nccl-I64-H16-q2-rs-fp32-sum", 2, 16, 2, (65, 5000), None, 64, 64, "bf16", "rs", "triton",
         8, comm_dtype="fp32", Lv=512, rope=64, seed=23),
]


def _nccl_worker(rank: int, world: int, init_file: str, out_dir: str, cases: list) -> None:
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120),
                            device_id=device)
    results = {}
    try:
        for case in cases:
            try:
                run_capture_case(case, rank, device)
                results[case.id] = None
            except Exception:  # noqa: BLE001
                results[case.id] = traceback.format_exc()
            dist.barrier()
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def nccl_results(tmp_path_factory):
    return _spawn(_nccl_worker, 2, tmp_path_factory.mktemp("nccl"), NCCL_CASES)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 GPUs")
@pytest.mark.parametrize("case", NCCL_CASES, ids=[c.id for c in NCCL_CASES])
def test_nccl_step_matches_full_attention_and_replays(nccl_results, case):
    for rank, results in enumerate(nccl_results):
        err = results.get(case.id, "not run")
        assert err is None, f"rank {rank}:\n{err}"

