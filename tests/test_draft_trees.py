"""Ragged draft counts (``qo_indptr``) and EAGLE draft trees (``tree_mask``) in decode verify
(issue 24), against the float64 reference by the tolerance rule of ``tests/builders.py``.

Without a GPU the portable kernels run in Triton's interpreter on small shapes (fp32, fp16, fp8
-> fp16); ``@pytest.mark.gpu`` tests run both families (the portable kernel and the sm_90 Gluon
one, each forced by ``config={"family": ...}``) at serving shapes in bf16 and fp8, page sizes 1
to 128, CUDA-graph capture and replay with new offsets, masks, lengths and tables, warmup then
capture compiling nothing, and torch.compile. Inputs: ``builders.decode_case`` (random, pages
in a random order, outputs poisoned with NaN before each call; rows past ``qo_indptr[B]`` must
stay NaN). Trees: random ancestor trees (also numbered in a random order), SGLang-style EAGLE
trees (topk x depth, pruned to the best n) up to 64 drafts, arbitrary bit patterns.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import mla_ops
from mla_ops import checked, platform
from mla_ops.decode_verify.launch import decode_attention_fwd_verify

from builders import (FP8, SM_SCALE, chain_tree, decode_case, eagle_tree, interpret,
                      random_ancestor_tree, to_meta)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Small splits so that short interpreter sequences still cut into several splits.
SMALL = {"BLOCK_N": 16, "SPLIT_ALIGN": 16, "MIN_SPLIT_LEN": 16}
# Launch variants of the portable kernel laid over SMALL (each one compiles its own masks).
VARIANTS = {
    "plain": {},
    "swap-h32": {"SWAP_AB": 1, "BLOCK_H": 32, "num_warps": 4},
    "swap-h16-qsplit": {"SWAP_AB": 1, "BLOCK_H": 16, "QSPLIT": 1, "num_warps": 4},
    "tma-persistent": {"TMA": 1, "PERSISTENT": 1, "BLOCK_H": 16},
}


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _bits(n, seed):
    """Arbitrary masks of n rows over n drafts (not a tree; the kernel does not care)."""
    g = _g(seed)
    return [int(torch.randint(0, 1 << n, (), generator=g)) if n < 63 else
            int(torch.randint(0, 1 << 62, (), generator=g)) for _ in range(n)]


# (id, decode_case kwargs) -- every case has several KV splits' worth of keys.
TREE_CASES = [
    ("B3-H4-q8-p16-fp32-ancestor", dict(
        batch=3, heads=4, qlen=8, lens=(9, 40, 100), page=16,
        trees=[random_ancestor_tree(8, _g(1)), random_ancestor_tree(8, _g(2), shuffle=True),
               random_ancestor_tree(8, _g(3))])),
    ("B2-H4-q8-p16-fp16-eagle2x3", dict(
        batch=2, heads=4, qlen=8, lens=(37, 90), page=16, dtype=torch.float16,
        trees=[eagle_tree(2, 3, 8, _g(4)), eagle_tree(2, 3, 8, _g(5))])),
    ("B2-H2-q16-p16-fp32-eagle4x4", dict(
        batch=2, heads=2, qlen=16, lens=(16, 77), page=16,
        trees=[eagle_tree(4, 4, 16, _g(6)), eagle_tree(4, 4, 16, _g(7))])),
    ("B2-H2-q64-p64-fp16-64drafts", dict(
        batch=2, heads=2, qlen=64, lens=(64, 110), page=64, dtype=torch.float16,
        trees=[eagle_tree(8, 8, 64, _g(8)), random_ancestor_tree(64, _g(9), shuffle=True)])),
    ("B2-H4-q8-p16-fp8-eagle2x3", dict(
        batch=2, heads=4, qlen=8, lens=(45, 120), page=16, dtype=torch.float16, cache_dtype=FP8,
        trees=[eagle_tree(2, 3, 8, _g(10)), eagle_tree(2, 3, 8, _g(11))])),
    # real_seq_lens cutting into the drafts (and to 0); lengths shorter than the draft count.
    ("B3-H4-q8-p16-fp32-real-short", dict(
        batch=3, heads=4, qlen=8, lens=(40, 5, 100), real=(35, 5, 0), page=16,
        trees=[random_ancestor_tree(8, _g(12)), random_ancestor_tree(8, _g(13)), chain_tree(8)])),
    ("B2-H3-q6-p1-fp32-3d-bits", dict(
        batch=2, heads=3, qlen=6, lens=(30, 50), page=1, layout="3d",
        trees=[_bits(6, 14), _bits(6, 15)])),
]

RAGGED_CASES = [
    # qlen_b = 0 and = qlen, a length shorter than its drafts, real lengths, rows past qo_indptr[B].
    ("B4-H4-q4-p16-fp32-ragged", dict(
        batch=4, heads=4, qlen=4, lens=(10, 3, 50, 2), real=(10, 3, 45, 2), page=16,
        draft_counts=(0, 4, 1, 3), extra_rows=3)),
    ("B3-H16-q8-p16-fp16-ragged", dict(  # BLOCK_H 32 = 2 tokens: whole row blocks past qlen_b
        batch=3, heads=16, qlen=8, lens=(48, 17, 70), page=16, dtype=torch.float16,
        draft_counts=(8, 1, 5), extra_rows=0)),
    ("B3-H3-q5-p64-fp16-ragged-tree", dict(
        batch=3, heads=3, qlen=5, lens=(70, 4, 129), real=(70, 4, 100), page=64,
        dtype=torch.float16, draft_counts=(5, 0, 2), extra_rows=1,
        trees=[random_ancestor_tree(5, _g(16)), [], random_ancestor_tree(2, _g(17))])),
    ("B3-H4-q8-p16-fp8-ragged-eagle", dict(
        batch=3, heads=4, qlen=8, lens=(33, 64, 100), page=16, dtype=torch.float16,
        cache_dtype=FP8, draft_counts=(8, 3, 6), extra_rows=2,
        trees=[eagle_tree(2, 3, 8, _g(18)), eagle_tree(2, 1, 3, _g(19)),
               eagle_tree(4, 2, 6, _g(20))])),
    ("B2-H2-q4-p16-fp32-all-empty", dict(
        batch=2, heads=2, qlen=4, lens=(20, 30), page=16, draft_counts=(0, 0), extra_rows=2)),
]
CASES = TREE_CASES + RAGGED_CASES


def _run(case, splits, variant):
    config = {**SMALL, **VARIANTS[variant]}
    with platform.mock_platform("sm_90", sm_count=1):  # the persistent grid loops
        return case.run(splits, config)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("kw", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_matches_reference(device, kw, variant):
    case = decode_case(device, poison_past_end=True, **kw)
    for splits in (1, 3):
        o, lse = _run(case, splits, variant)
        case.assert_matches(o, lse)


def _with(case, **changes):
    import dataclasses

    return dataclasses.replace(case, **changes)


@pytest.mark.parametrize("variant", ["plain", "swap-h32"])
def test_chain_mask_and_uniform_offsets_equal_the_uniform_call(device, variant):
    """The causal chain as a tree, and ``qo_indptr`` of ``qlen`` rows per request, give the
    uniform call's answer (bit for bit on the portable kernel)."""
    case = decode_case(device, batch=3, heads=4, qlen=4, lens=(2, 40, 100), real=(2, 40, 90),
                       page=16, dtype=torch.float16)
    R = case.q.shape[0]
    chain = torch.tensor(chain_tree(4) * 3, dtype=torch.int64, device=device)
    indptr = torch.arange(0, R + 1, 4, dtype=torch.int32, device=device)
    for splits in (1, 3):
        o, lse = _run(case, splits, variant)
        case.assert_matches(o, lse)
        for changes in ({"tree_mask": chain}, {"qo_indptr": indptr},
                        {"tree_mask": chain, "qo_indptr": indptr}):
            o2, lse2 = _run(_with(case, **changes), splits, variant)
            if device == "cpu":
                assert torch.equal(o2, o) and torch.equal(lse2, lse), changes
            else:
                _with(case, **changes).assert_matches(o2, lse2)


def test_ragged_equals_each_request_alone(device):
    """A ragged batch gives each request what a uniform call of its own draft count gives."""
    case = decode_case(device, batch=3, heads=4, qlen=5, lens=(30, 60, 9), page=16,
                       draft_counts=(5, 2, 3), extra_rows=1,
                       trees=[random_ancestor_tree(5, _g(30)), chain_tree(2),
                              random_ancestor_tree(3, _g(31))])
    o, lse = _run(case, 2, "plain")
    case.assert_matches(o, lse)
    for b, (r0, n) in enumerate(case.spans()):
        alone = decode_case(device, batch=1, heads=4, qlen=n, lens=(int(case.seq_lens[b]),),
                            page=16)
        alone = _with(alone, q=case.q[r0:r0 + n], k_buffer=case.k_buffer,
                      v_buffer=case.v_buffer, req_to_token=case.req_to_token[b:b + 1],
                      tree_mask=case.tree_mask[r0:r0 + n])
        o1, lse1 = _run(alone, 2, "plain")
        torch.testing.assert_close(o1, o[r0:r0 + n], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse1, lse[r0:r0 + n], rtol=1e-5, atol=1e-6)


# --- the op, its CPU kernel, torch.compile, the plan ------------------------------------------


def _tree_case(device, dtype=torch.float16):
    return decode_case(device, batch=3, heads=4, qlen=6, lens=(20, 77, 5), page=16, dtype=dtype,
                       draft_counts=(6, 0, 4), extra_rows=2,
                       trees=[eagle_tree(2, 3, 6, _g(40)), [], random_ancestor_tree(4, _g(41))])


def test_op_matches_function_bitwise(device):
    case = _tree_case(device)
    o_f, lse_f = case.run(2)
    o_op, lse_op = case.run(2, fn=torch.ops.mla.decode_verify)
    assert torch.equal(o_op.nan_to_num(7.0), o_f.nan_to_num(7.0))
    assert torch.equal(lse_op.nan_to_num(7.0), lse_f.nan_to_num(7.0))
    case.assert_matches(o_op, lse_op)


def test_op_cpu_reference_kernel(device):
    """The op's CPU kernel outside the interpreter (the plain-PyTorch reference): the same
    rows written, the rest untouched."""
    if device != "cpu":
        pytest.skip("the reference path is the CPU kernel")
    case = _tree_case("cpu", torch.float32)
    with interpret(False):
        o, lse = case.run(2, fn=torch.ops.mla.decode_verify)
    case.assert_matches(o, lse)


def test_positional_callers_unchanged(device):
    """The schema's new arguments come last, with defaults: the old positional call works."""
    case = decode_case(device, batch=2, heads=4, qlen=2, lens=(20, 50), page=16)
    args = case.op_args(1)
    torch.ops.mla.decode_verify(*args.values())
    case.assert_matches(args["o"], args["lse"])


def test_compile_fullgraph_with_offsets_and_masks(device):
    """torch.compile(fullgraph=True) of a step passing qo_indptr and tree_mask: no graph break,
    the eager answer (CPU: the op's CPU kernel; GPU: the Triton kernels)."""
    torch._dynamo.reset()
    case = _tree_case(device, torch.float16 if device == "cpu" else torch.bfloat16)
    heads, Lv = case.heads, case.Lv

    def step(q, k_buffer, table, seq_lens, qo_indptr, tree_mask):
        o = torch.full((q.shape[0], heads, Lv), float("nan"), dtype=q.dtype, device=q.device)
        lse = torch.full((q.shape[0], heads), float("nan"), dtype=torch.float32,
                         device=q.device)
        torch.ops.mla.decode_verify(q, k_buffer, k_buffer[..., :Lv], o, lse, table, seq_lens,
                                    None, case.qlen, None, 1, SM_SCALE, case.page_size, None,
                                    qo_indptr=qo_indptr, tree_mask=tree_mask)
        return o * 1, lse

    inputs = (case.q, case.k_buffer, case.req_to_token, case.seq_lens, case.qo_indptr,
              case.tree_mask)
    eager = step(*inputs)
    compiled = torch.compile(step, fullgraph=True,
                             backend="inductor" if device == "cuda" else "aot_eager")
    got = compiled(*inputs)
    for g, e in zip(got, eager):
        assert torch.equal(g.nan_to_num(7.0), e.nan_to_num(7.0))
    case.assert_matches(*got)


def test_meta_shapes_trace(device):
    """The fake implementation accepts the new arguments as meta tensors."""
    case = _tree_case(device)
    args = to_meta(case.op_args(2), views={"v_buffer": ("k_buffer", case.Lv)})
    torch.ops.mla.decode_verify(**args)


def test_plan_varlen_runs_and_refuses(device):
    from mla_ops import plan_verify

    case = _tree_case(device)
    plan = plan_verify(3, 6, case.heads, 128, dtype=case.q.dtype, device=device, page_size=16,
                       head_dim=case.q.shape[-1], v_head_dim=case.Lv, varlen=True,
                       num_kv_splits=2)
    plan.alloc_workspace()
    o, lse, _ = case.outputs(1)
    plan.run(case.q, case.k_buffer, o, lse, case.req_to_token, case.seq_lens,
             qo_indptr=case.qo_indptr, tree_mask=case.tree_mask, sm_scale=SM_SCALE)
    case.assert_matches(o, lse)
    # Without tree_mask: the causal chain of each request.
    o, lse, _ = case.outputs(1)
    plan.run(case.q, case.k_buffer, o, lse, case.req_to_token, case.seq_lens,
             qo_indptr=case.qo_indptr, sm_scale=SM_SCALE)
    _with(case, tree_mask=None).assert_matches(o, lse)
    with pytest.raises(ValueError, match=r"^qo_indptr: this plan was made with varlen=True"):
        plan.run(case.q, case.k_buffer, o, lse, case.req_to_token, case.seq_lens,
                 sm_scale=SM_SCALE)
    big = torch.zeros(3 * 6 + 1, *case.q.shape[1:], dtype=case.q.dtype, device=device)
    with pytest.raises(ValueError, match=r"^q: 19 rows exceed the plan's 3 requests"):
        plan.run(big, case.k_buffer, big[..., :case.Lv], big[..., 0].float(), case.req_to_token,
                 case.seq_lens, qo_indptr=case.qo_indptr, sm_scale=SM_SCALE)
    uniform = plan_verify(3, 6, case.heads, 128, dtype=case.q.dtype, device=device,
                          page_size=16, head_dim=case.q.shape[-1], v_head_dim=case.Lv)
    o, lse, _ = case.outputs(1)
    with pytest.raises(ValueError, match=r"^qo_indptr: this plan was made without varlen=True"):
        uniform.run(case.q, case.k_buffer, o, lse, case.req_to_token, case.seq_lens,
                    qo_indptr=case.qo_indptr, sm_scale=SM_SCALE)
    assert o.isnan().all()
    with pytest.raises(TypeError, match=r"^varlen: expected a bool"):
        plan_verify(3, 6, case.heads, 128, dtype=case.q.dtype, device=device, page_size=16,
                    varlen=1)


def test_plan_uniform_takes_a_tree(device):
    """A plan without varlen runs draft trees of uniform draft counts."""
    from mla_ops import plan_verify

    case = decode_case(device, batch=2, heads=4, qlen=8, lens=(30, 90), page=16,
                       trees=[eagle_tree(2, 3, 8, _g(50)), random_ancestor_tree(8, _g(51))])
    plan = plan_verify(2, 8, 4, 128, dtype=case.q.dtype, device=device, page_size=16,
                       head_dim=case.q.shape[-1], v_head_dim=case.Lv)
    plan.alloc_workspace()
    o, lse, _ = case.outputs(1)
    plan.run(case.q, case.k_buffer, o, lse, case.req_to_token, case.seq_lens,
             tree_mask=case.tree_mask, sm_scale=SM_SCALE)
    case.assert_matches(o, lse)


def test_warmup_covers_the_new_variants(device):
    """The warmup op takes varlen / has_tree and writes nothing visible."""
    case = _tree_case(device)
    a = case.op_args(2)
    before = a["o"].clone()
    torch.ops.mla.warmup_decode_verify(a["q"], a["k_buffer"], a["o"], a["lse"],
                                       a["req_to_token"], True, [6], a["attn_logits"], SM_SCALE,
                                       case.page_size, None, 1, 0, 1, True, True)
    assert torch.equal(a["o"].nan_to_num(7.0), before.nan_to_num(7.0))


# --- context parallelism -----------------------------------------------------------------------


def test_context_parallel_ragged_matches_reference(device):
    """Ragged draft counts on a context-parallel rank: the rank's partial, as the reference
    computes it over the keys the rank holds."""
    from mla_ops.context_parallel import shard_kv_cache
    from mla_ops.reference import decode_verify_ref

    case = decode_case(device, batch=3, heads=4, qlen=4, lens=(70, 3, 130), page=16,
                       draft_counts=(4, 3, 1), extra_rows=1)
    world, interleave = 2, 16
    for rank in range(world):
        cache, table = shard_kv_cache(case.k_buffer, case.req_to_token, case.seq_lens, 16, world,
                                      rank, interleave)
        o, lse, ws = case.outputs(2)
        decode_attention_fwd_verify(case.q, cache, cache[..., :case.Lv], o, lse, table,
                                    case.seq_lens, None, 4, ws, 2, SM_SCALE, 16, None, world,
                                    rank, interleave, qo_indptr=case.qo_indptr, config=SMALL)
        ref_o, ref_lse = decode_verify_ref(case.q, cache, case.Lv, table,
                                           case.seq_lens, None, 4, SM_SCALE, 16,
                                           compute_dtype=torch.float64, cp_world=world,
                                           cp_rank=rank, cp_interleave=interleave,
                                           qo_indptr=case.qo_indptr)
        used = case.used_rows
        assert o[used:].isnan().all()
        assert torch.equal(torch.isinf(lse[:used]), torch.isinf(ref_lse[:used]))
        torch.testing.assert_close(o[:used].double(), ref_o[:used], rtol=1e-4, atol=1e-5)
        live = torch.isfinite(ref_lse[:used])
        torch.testing.assert_close(lse[:used][live].double(), ref_lse[:used][live], rtol=1e-4,
                                   atol=1e-5)


def test_context_parallel_tree_refused(device):
    case = _tree_case(device)
    args = case.op_args(1)
    with pytest.raises(ValueError, match=r"^tree_mask: draft trees are not supported with "
                                         r"context parallelism \(cp_world=2\)"):
        decode_attention_fwd_verify(**args, cp_world=2, cp_rank=0, cp_interleave=16)
    assert args["o"].isnan().all()


# --- bad input -----------------------------------------------------------------------------------

def _i32(*v, device="cpu"):
    return torch.tensor(v, dtype=torch.int32, device=device)


# (id, exception, message start, edit of the op's keyword arguments)
BAD = [
    ("indptr-dtype", TypeError, "qo_indptr: expected dtype in (int32), got torch.int64",
     lambda a: {"qo_indptr": a["qo_indptr"].long()}),
    ("indptr-rank", ValueError, "qo_indptr: expected a 1-D tensor",
     lambda a: {"qo_indptr": a["qo_indptr"][None]}),
    ("indptr-empty", ValueError, "qo_indptr: expected [B+1] offsets (at least one)",
     lambda a: {"qo_indptr": a["qo_indptr"][:0]}),
    ("indptr-strided", ValueError, "qo_indptr: the last dimension must be contiguous",
     lambda a: {"qo_indptr": torch.stack([a["qo_indptr"]] * 2, 1)[:, 0]}),
    ("indptr-length", ValueError, "req_to_token: expected one row per request (4)",
     lambda a: {"qo_indptr": torch.cat([a["qo_indptr"], a["qo_indptr"][-1:]])}),
    ("indptr-type", TypeError, "qo_indptr: expected a torch.Tensor or None, got list",
     lambda a: {"qo_indptr": [0, 6, 6, 10]}),
    ("tree-dtype", TypeError, "tree_mask: expected dtype in (int64), got torch.int32",
     lambda a: {"tree_mask": a["tree_mask"].int()}),
    ("tree-rank", ValueError, "tree_mask: expected a 1-D tensor",
     lambda a: {"tree_mask": a["tree_mask"][:, None]}),
    ("tree-length", ValueError, "tree_mask: expected shape (12,), got (11,)",
     lambda a: {"tree_mask": a["tree_mask"][:-1]}),
    ("tree-strided", ValueError, "tree_mask: the last dimension must be contiguous",
     lambda a: {"tree_mask": torch.stack([a["tree_mask"]] * 2, 1)[:, 0]}),
    ("tree-qlen-65", ValueError, "tree_mask: a request's draft tokens are the bits of one int64, "
     "so qlen must be at most 64, got qlen=65", lambda a: {"qlen": 65}),
    ("tree-cp", ValueError, "tree_mask: draft trees are not supported with context parallelism",
     lambda a: {"cp_world": 2, "cp_rank": 1}),
]


@pytest.mark.parametrize("exc,message,edit", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
@pytest.mark.parametrize("path", ["function", "op", "meta"])
def test_bad_argument_named_before_launch(device, path, exc, message, edit):
    if "torch.Tensor or None" in message and path != "function":
        pytest.skip("the dispatcher refuses a list for a Tensor? argument itself")
    case = _tree_case(device)
    args = case.op_args(1)
    args.update(edit(args))
    if path == "meta":
        args = to_meta(args, views={"v_buffer": ("k_buffer", case.Lv)})
    o_before = args["o"].clone()
    fn = decode_attention_fwd_verify if path == "function" else torch.ops.mla.decode_verify
    with pytest.raises(exc, match="^" + re.escape(message)):
        fn(**args)
    if path != "meta":
        assert torch.equal(args["o"].nan_to_num(7.0), o_before.nan_to_num(7.0))


def test_bad_warmup_arguments_named(device):
    case = _tree_case(device)
    a = case.warmup_args(qlens=(2, 65))
    with pytest.raises(ValueError, match=r"^has_tree: a request's draft tokens are the bits of "
                                         r"one int64, so every qlen must be at most 64"):
        torch.ops.mla.warmup_decode_verify(**a, has_tree=True)
    a = case.warmup_args(qlens=(2,))
    with pytest.raises(ValueError, match=r"^has_tree: draft trees are not supported with context"):
        torch.ops.mla.warmup_decode_verify(**a, cp_world=2, has_tree=True)
    from mla_ops.decode_verify.launch import warmup_decode_attention_fwd_verify

    with pytest.raises(TypeError, match=r"^varlen: expected a bool, got int"):
        warmup_decode_attention_fwd_verify(**a, varlen=1)


@pytest.mark.gpu
def test_gpu_offsets_on_another_device_named(device):
    case = _tree_case(device)
    for name in ("qo_indptr", "tree_mask"):
        args = case.op_args(1)
        args[name] = args[name].cpu()
        with pytest.raises(ValueError, match=f"^{name}: expected a tensor on cuda"):
            decode_attention_fwd_verify(**args)
        assert args["o"].isnan().all()


def _set(name, index, value):
    def change(args):
        args[name] = args[name].clone()
        args[name][index] = value

    return change


# Metadata only the data shows wrong: named in checked mode (and always on the CPU kernel).
CHECKED_BAD = [
    ("indptr-first", "qo_indptr: qo_indptr[0] is 1; expected 0", _set("qo_indptr", 0, 1)),
    ("indptr-decreasing", "qo_indptr: request 1 ends at row 5, before it starts (6)",
     _set("qo_indptr", 2, 5)),
    ("indptr-over-qlen", "qo_indptr: request 2 has 7 draft rows, more than qlen=6",
     _set("qo_indptr", 3, 13)),
    ("indptr-past-rows", "qo_indptr: the last request ends at row 13 (qo_indptr[B]), past q's 12",
     lambda a: (_set("qo_indptr", 3, 13)(a), a.update(qlen=7))),
    ("tree-bit-past-drafts", "tree_mask: row 8 (request 2, 4 draft tokens) sets bit 4",
     _set("tree_mask", 8, 0b10001)),
    ("tree-bit-63", "tree_mask: row 0 (request 0, 6 draft tokens) sets bit 63",
     _set("tree_mask", 0, -1)),
]


@pytest.mark.parametrize("message,change", [c[1:] for c in CHECKED_BAD],
                         ids=[c[0] for c in CHECKED_BAD])
@pytest.mark.parametrize("path", ["function-checked", "op-reference"])
def test_bad_offsets_and_masks_named_in_checked_mode(device, path, message, change):
    if path == "op-reference" and device != "cpu":
        pytest.skip("the reference path is the CPU kernel")
    case = _tree_case(device)
    args = case.op_args(2)
    change(args)
    o_before = args["o"].clone()
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        if path == "function-checked":
            with mla_ops.checked_mode():
                decode_attention_fwd_verify(**args)
        else:
            with interpret(False):
                torch.ops.mla.decode_verify(**args)
    assert torch.equal(args["o"].nan_to_num(7.0), o_before.nan_to_num(7.0))


def test_checked_mode_accepts_valid_offsets_and_masks(device):
    case = _tree_case(device)
    args = case.op_args(2)
    with mla_ops.checked_mode():
        decode_attention_fwd_verify(**args)
    case.assert_matches(args["o"], args["lse"])


# (id, qo_indptr of the 12 rows, qlen 6: the rows marked NaN, the requests still right)
UNCHECKED = [
    ("past-rows", (0, 6, 6, 14), (6, 12), (0,)),  # request 2 clamped to rows [6, 12)
    ("decreasing", (0, 6, 3, 10), (6, 9), ()),  # 2 starts inside 0: [3, 9) (7 > 6 rows)
    ("negative", (0, -2, 6, 10), (0, 6), (2,)),  # request 1 from -2: rows [0, 6)
    ("over-qlen", (0, 7, 7, 10), (0, 6), (2,)),  # request 0 has 7 > qlen rows: [0, 6)
]


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("indptr,marked,right", [c[1:] for c in UNCHECKED],
                         ids=[c[0] for c in UNCHECKED])
def test_unchecked_bad_offsets_mark_their_request(device, indptr, marked, right, splits):
    """Checked mode off: offsets are clamped into q's rows and to at most qlen rows (never an
    address outside o / lse / the workspace) and a request whose offsets needed it gets NaN in
    the rows it was clamped to; the others are right."""
    from mla_ops.reference import decode_verify_ref

    case = _tree_case(device, torch.float32)
    args = case.op_args(splits)
    args["qo_indptr"] = _i32(*indptr, device=device)
    with checked.checked_mode(False):
        decode_attention_fwd_verify(**args, config=SMALL)
    o, lse = args["o"], args["lse"]
    assert o[marked[0]:marked[1]].isnan().all() and lse[marked[0]:marked[1]].isnan().all()
    for b in right:
        r0, n = indptr[b], indptr[b + 1] - indptr[b]
        ref_o, ref_lse = decode_verify_ref(
            case.q[r0:r0 + n], case.k_buffer, case.Lv, case.req_to_token[b:b + 1],
            case.seq_lens[b:b + 1], None, n, SM_SCALE, case.page_size,
            compute_dtype=torch.float64, tree_mask=case.tree_mask[r0:r0 + n])
        torch.testing.assert_close(o[r0:r0 + n].double(), ref_o, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(lse[r0:r0 + n].double(), ref_lse, rtol=1e-4, atol=1e-5)


GUARDED = textwrap.dedent(r"""
    import sys
    sys.path.insert(0, "tests")
    import torch, mla_ops
    from builders import decode_case, guarded, random_ancestor_tree

    case = decode_case("cpu", batch=3, heads=4, qlen=6, lens=(20, 40, 5), page=16,
                       draft_counts=(6, 0, 4), extra_rows=0,
                       trees=[random_ancestor_tree(6), [], random_ancestor_tree(4)])
    for indptr in ((0, 6, 6, 14), (0, 6, 3, 10), (0, -5, 6, 10), (0, 2 ** 30, 6, 10)):
        for splits in (1, 3):
            print("case", indptr, splits, flush=True)
            args = case.op_args(splits)
            for name in ("q", "o", "lse", "tree_mask", "attn_logits"):
                if args[name] is not None:
                    args[name] = guarded(args[name])
            args["qo_indptr"] = guarded(torch.tensor(indptr, dtype=torch.int32))
            mla_ops.decode_attention_fwd_verify(**args, config={"BLOCK_H": 32, "BLOCK_N": 16,
                                                              "SPLIT_ALIGN": 16,
                                                              "MIN_SPLIT_LEN": 16})
    print("all cases done", flush=True)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="guarded pages need Linux mmap")
def test_unchecked_bad_offsets_never_touch_memory_outside(device):
    """Every row-indexed tensor flush against an unmapped page: a read or write one row past
    q / o / lse / tree_mask / the workspace (or past qo_indptr) kills the child process."""
    if device != "cpu":
        pytest.skip("guarded host pages: the interpreter's loads are host reads")
    env = {**os.environ, "PYTHONPATH": ROOT, "TRITON_INTERPRET": "1", checked.ENV: "0"}
    proc = subprocess.run([sys.executable, "-c", GUARDED], capture_output=True, text=True,
                          timeout=900, cwd=ROOT, env=env)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1:] == ["all cases done"], (
        f"exit {proc.returncode} (-11: an access outside a tensor)\n{proc.stdout[-1000:]}\n"
        f"{proc.stderr[-2000:]}")


# --- eager replays (mla_ops.fastpath) ------------------------------------------------------------


def _fastpath_main() -> None:  # in a subprocess without TRITON_INTERPRET (test_fastpath's)
    import json
    import random

    import test_fastpath as tf
    from mla_ops import fastpath

    recorded = mla_ops.decode_attention_fwd_verify.__wrapped__  # the replaying launcher
    rng = random.Random(0)
    makes = []
    for i in range(10):
        qlen, heads, batch = rng.choice([2, 4, 8]), rng.choice([4, 16]), rng.choice([1, 2, 3])
        counts = tuple(rng.randint(0, qlen) for _ in range(batch))
        ragged, tree, splits = rng.random() < 0.7, rng.random() < 0.7, rng.choice([1, 3])
        for twin in (None, "no-tree", "no-offsets", "more-rows"):
            kw = dict(batch=batch, heads=heads, qlen=qlen, lens=[rng.randint(1, 90)] * batch,
                      page=rng.choice([1, 16]), dtype=torch.float16)
            if ragged and twin != "no-offsets":
                kw.update(draft_counts=counts, extra_rows=1 + (twin == "more-rows"))
            if tree and twin != "no-tree":
                n = counts if "draft_counts" in kw else (qlen,) * batch
                kw.update(trees=[random_ancestor_tree(c, _g(i)) for c in n])

            def make(kw=kw, splits=splits):
                args = decode_case("cpu", **kw).op_args(splits)
                extra = {k: args.pop(k) for k in ("qo_indptr", "tree_mask") if k in args}
                return tuple(args.values()), extra

            makes.append(make)
    out = {"replays": 0, "calls": 0, "cpp_replays": None}
    with tf.fake_dispatch():
        for rnd in range(3):
            for make in makes if rnd == 0 else rng.sample(makes, len(makes)):
                args, kw = make()
                before = len(fastpath._RECORDS)
                tf._LOG.clear()
                recorded(*args, **kw)
                fast = list(tf._LOG)
                tf._LOG.clear()
                recorded.full_path(*args, **kw)
                tf._same_launches(fast, list(tf._LOG))
                out["calls"] += 1
                out["replays"] += len(fastpath._RECORDS) == before
    cpp = fastpath._cpp()
    if cpp is not None:  # the C++ replays, dry: the parameter bytes Triton's launcher passes
        out["cpp_replays"] = 0
        with tf.cpp_dry_run():
            for rnd in range(3):
                for make in makes if rnd == 0 else rng.sample(makes, len(makes)):
                    args, kw = make()
                    cpp.take_log()
                    tf._LOG.clear()
                    recorded(*args, **kw)  # the op: replayed in C++, or recorded and committed
                    got, python = cpp.take_log(), list(tf._LOG)
                    tf._LOG.clear()
                    recorded.full_path(*args, **kw)
                    full = list(tf._LOG)
                    if not got:
                        tf._same_launches(python, full)
                        continue
                    assert not python and len(got) == len(full)
                    for (function, grid, block, shared, *_, params), (k, g, a) in zip(got, full):
                        assert function == k.function and grid == g
                        want = tf._launcher_params(k, a)
                        assert len(params) == len(want), (len(params), len(want))
                        for i, (x, y) in enumerate(zip(params, want)):
                            assert x == y, f"{k.src.fn.__name__} parameter {i}: {x.hex()} != {y.hex()}"
                    out["cpp_replays"] += 1
    print("[" + json.dumps(out) + "]")


def test_eager_replays_launch_what_the_full_path_launches():
    """A recorded eager call with qo_indptr / tree_mask replays exactly the full path's
    launches (kernel, grid, arguments: the offsets and masks of the new call), and a call
    without them, or with more rows, is another geometry (``tests/test_fastpath.py``'s fake
    dispatch: Triton's binder for sm_90 without a GPU); with ``mla_ops._C``, the C++ replays
    too (its dry run: the parameter bytes Triton's launcher would pass)."""
    if torch.cuda.is_available():
        pytest.skip("the fake dispatch stands in for a GPU")
    from gluon_offline import run_in_subprocess

    out = run_in_subprocess("tests.test_draft_trees", "_fastpath_main", 600)[0][0]
    assert out["replays"] >= 2 * 40 and out["calls"] == 3 * 40, out
    from mla_ops import fastpath

    if fastpath._cpp() is not None:  # (mla_ops._C loaded: its replays too, dry)
        assert out["cpp_replays"] >= 2 * 40, out


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["triton", "gluon"])
def test_gpu_eager_replay_bitwise(device, family):
    """Eager calls with qo_indptr / tree_mask on the H200: recorded, replayed on new offsets and
    masks (the same tensors' new contents, and new tensors), bit for bit the full path's."""
    from mla_ops import fastpath

    if fastpath.status() is not None:
        pytest.skip(f"replays are off here: {fastpath.status()}")
    if family == "gluon" and _gluon_why() is not None:
        pytest.skip(f"the Gluon family does not run here: {_gluon_why()}")
    config = {"family": family}
    recorded = decode_attention_fwd_verify.__wrapped__
    for seed, heads in ((1000, 16), (1001, 128)):
        gen = _g(seed)
        counts = tuple(torch.randint(0, 9, (4,), generator=gen).tolist())
        case = _gpu_case(device, "bf16", batch=4, heads=heads, qlen=8, lens=(700, 64, 3000, 9),
                         page=64, draft_counts=counts, extra_rows=2,
                         trees=[random_ancestor_tree(n, gen) for n in counts])
        args = case.op_args(3)
        kw = {k: args.pop(k) for k in ("qo_indptr", "tree_mask")}
        outs = (args["o"], args["lse"])
        recorded(*args.values(), **kw, config=config)  # records
        kw["tree_mask"] = kw["tree_mask"].flip(0).contiguous()  # new masks, new tensor
        for t in outs:
            t.fill_(float("nan"))
        recorded(*args.values(), **kw, config=config)  # a replay
        got = [t.clone() for t in outs]
        assert fastpath.record_of("decode_verify", *args.values(), **kw, config=config)
        for t in outs:
            t.fill_(float("nan"))
        recorded.full_path(*args.values(), **kw, config=config)
        for a, b in zip(got, outs):
            assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), "replay != full path"


# --- GPU: both families at serving shapes --------------------------------------------------------

GPU_DTYPES = {"bf16": (torch.bfloat16, None), "fp8": (torch.bfloat16, FP8)}


def _gpu_case(device, dtype_name, **kw):
    dtype, cache_dtype = GPU_DTYPES[dtype_name]
    return decode_case(device, Lv=512, rope=64, dtype=dtype, cache_dtype=cache_dtype,
                       poison_past_end=True, **kw)


def _eagle_batch(batch, topk, depth, n, seed):
    return [eagle_tree(topk, depth, n, _g(seed + b)) for b in range(batch)]


# (id, decode_case kwargs, split caps) at H16 / H128, pages 1 / 16 / 64 / 128
GPU_CASES = [
    ("H16-B4-eagle8-p64", dict(batch=4, heads=16, qlen=8, lens=(9, 700, 4097, 63), page=64,
                               trees=_eagle_batch(4, 2, 3, 8, 100)), (1, 4)),
    ("H16-B3-eagle16-p128-real", dict(batch=3, heads=16, qlen=16, lens=(16, 3000, 515),
                                      real=(16, 2990, 500), page=128,
                                      trees=_eagle_batch(3, 4, 4, 16, 200)), (1, 5)),
    ("H16-B2-anc64-p64", dict(batch=2, heads=16, qlen=64, lens=(64, 2049), page=64,
                              trees=[random_ancestor_tree(64, _g(300), shuffle=True),
                                     eagle_tree(8, 8, 64, _g(301))]), (1, 3)),
    ("H128-B2-eagle8-p64", dict(batch=2, heads=128, qlen=8, lens=(1337, 70), page=64,
                                trees=_eagle_batch(2, 2, 3, 8, 400)), (1, 3)),
    ("H16-B4-ragged-p16", dict(batch=4, heads=16, qlen=8, lens=(5, 333, 2049, 100),
                               real=(5, 300, 2049, 0), page=16, draft_counts=(8, 0, 3, 6),
                               extra_rows=5), (1, 4)),
    ("H16-B3-ragged-tree-p1", dict(batch=3, heads=16, qlen=6, lens=(3, 1000, 90), page=1,
                                   draft_counts=(4, 6, 1), extra_rows=2,
                                   trees=[random_ancestor_tree(4, _g(500)),
                                          eagle_tree(2, 2, 6, _g(501)), [1]]), (1, 2)),
    ("H128-B3-ragged-tree-p64", dict(batch=3, heads=128, qlen=8, lens=(600, 65, 3000),
                                     page=64, draft_counts=(8, 2, 5), extra_rows=1,
                                     trees=[eagle_tree(2, 3, 8, _g(600)), chain_tree(2),
                                            random_ancestor_tree(5, _g(601))]), (1, 4)),
    ("H128-B2-ragged-p128", dict(batch=2, heads=128, qlen=4, lens=(4, 3001), page=128,
                                 draft_counts=(1, 4), extra_rows=0), (1, 6)),
]
FAMILIES = {"table": None, "triton": {"family": "triton"}, "gluon": {"family": "gluon"}}


def _gluon_why():
    from mla_ops.decode_verify.gluon_launch import gluon_unsupported_shape

    if not torch.cuda.is_available():
        return "no GPU"
    return gluon_unsupported_shape(torch.device("cuda"), torch.bfloat16, torch.bfloat16, 16,
                                   576, 512, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype_name", list(GPU_DTYPES))
@pytest.mark.parametrize("kw,caps", [c[1:] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES])
def test_gpu_matches_reference(device, kw, caps, dtype_name, family):
    if family == "gluon":
        why = _gluon_why()
        if why is not None:
            pytest.skip(f"the Gluon family does not run here: {why}")
        if kw["page"] % 64:
            pytest.skip("the Gluon family takes pages of multiples of 64")
        if kw["heads"] not in (16, 128):
            pytest.skip("H 16 / 128 only")
    case = _gpu_case(device, dtype_name, **kw)
    for splits in caps:
        o, lse = case.run(splits, FAMILIES[family])
        case.assert_matches(o, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["triton", "gluon"])
def test_gpu_chain_mask_equals_uniform_call(device, family):
    if family == "gluon" and _gluon_why() is not None:
        pytest.skip(f"the Gluon family does not run here: {_gluon_why()}")
    case = _gpu_case(device, "bf16", batch=4, heads=16, qlen=4, lens=(3, 700, 4097, 64),
                     page=64)
    chain = torch.tensor(chain_tree(4) * 4, dtype=torch.int64, device=device)
    indptr = torch.arange(0, 17, 4, dtype=torch.int32, device=device)
    for splits in (1, 4):
        o, lse = case.run(splits, FAMILIES[family])
        for changes in ({"tree_mask": chain}, {"qo_indptr": indptr}):
            o2, lse2 = _with(case, **changes).run(splits, FAMILIES[family])
            _with(case, **changes).assert_matches(o2, lse2)
            # The same arithmetic (extra blocks only add p = 0): equal up to a bf16 ulp or two.
            torch.testing.assert_close(o2, o, rtol=0, atol=1.6e-2)
            torch.testing.assert_close(lse2, lse, rtol=0, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["plan", "triton", "gluon"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_gpu_capture_replay_new_offsets_and_masks(device, family, fp8):
    """Warmup (a varlen plan's, or the function's for a forced family), then one capture with
    tree masks; replays on new draft counts, trees, lengths, tables and queries copied into the
    captured tensors compile nothing and match the reference each time."""
    if family == "gluon" and _gluon_why() is not None:
        pytest.skip(f"the Gluon family does not run here: {_gluon_why()}")
    from test_decode_verify import _CompileCounter

    from mla_ops import plan_verify
    from mla_ops.decode_verify.launch import warmup_decode_attention_fwd_verify

    B, H, qlen, page, pages_per, splits = 8, 16, 8, 64, 40, 4
    base = _gpu_case(device, "fp8" if fp8 else "bf16", batch=B, heads=H, qlen=qlen,
                     lens=(page * pages_per,) * B, page=page, draft_counts=(qlen,) * B,
                     trees=_eagle_batch(B, 2, 3, 8, 700))
    rows = B * qlen
    q, o = base.q.clone(), torch.empty(rows, H, 512, dtype=torch.bfloat16, device=device)
    lse = torch.empty(rows, H, dtype=torch.float32, device=device)
    ws = torch.empty(rows, H, splits, 513, dtype=torch.float32, device=device)
    table, seq_lens = base.req_to_token.clone(), base.seq_lens.clone()
    indptr, tree = base.qo_indptr.clone(), base.tree_mask.clone()
    kv, k_scale = base.k_buffer, base.k_scale
    if family == "plan":
        plan = plan_verify(B, qlen, H, page * pages_per, dtype=torch.bfloat16,
                           kv_dtype=kv.dtype, device=device, page_size=page, varlen=True)
        plan.warmup(q, kv, o, lse, table, sm_scale=SM_SCALE, k_scale=k_scale, has_real=False)

        def step():
            plan.run(q, kv, o, lse, table, seq_lens, qo_indptr=indptr, tree_mask=tree,
                     k_scale=k_scale, sm_scale=SM_SCALE)
    else:
        config = FAMILIES[family]
        warmup_decode_attention_fwd_verify(q, kv, o, lse, table, False, [qlen], ws, SM_SCALE,
                                           page, k_scale, varlen=True, has_tree=True,
                                           batches=[B], config=config)

        def step():
            decode_attention_fwd_verify(q, kv, kv[..., :512], o, lse, table, seq_lens, None, qlen,
                                        ws, splits, SM_SCALE, page, k_scale, qo_indptr=indptr,
                                        tree_mask=tree, config=config)
    with _CompileCounter() as count:
        before = count.cached()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        assert count.hooked == 0 and count.cached() == before, "the capture compiled a kernel"
    for trial in range(3):
        gen = _g(800 + trial)
        counts = torch.randint(0, qlen + 1, (B,), generator=gen).tolist()
        lens = torch.randint(1, page * pages_per + 1, (B,), generator=gen)
        lens[0] = page * pages_per  # the same block-table width as the captured one
        new = _gpu_case(device, "fp8" if fp8 else "bf16", batch=B, heads=H, qlen=qlen,
                        lens=tuple(lens.tolist()),
                        page=page, draft_counts=counts, extra_rows=rows - sum(counts),
                        trees=[random_ancestor_tree(n, gen) for n in counts])
        # The new table is a permutation of all the cache's pages, spare ones included, which
        # are NaN in the captured cache (poison_past_end): the new cache goes in too.
        assert new.k_buffer.shape == kv.shape and new.k_buffer.dtype == kv.dtype
        if fp8:
            assert torch.equal(new.k_scale, k_scale)
        for dst, src in ((q, new.q), (table, new.req_to_token), (seq_lens, new.seq_lens),
                         (indptr, new.qo_indptr), (tree, new.tree_mask), (kv, new.k_buffer)):
            dst.copy_(src)
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _with(new, q=q, k_buffer=kv, v_buffer=kv[..., :512], k_scale=k_scale
              ).assert_matches(o, lse)


@pytest.mark.gpu
def test_gpu_torch_compile_reduce_overhead(device, monkeypatch):
    torch._dynamo.reset()
    # As in a fresh process: the first call (the graph warm-up) makes the default k_scale.
    from mla_ops.decode_verify import launch

    monkeypatch.setattr(launch, "_UNIT_SCALE", {})
    case = _gpu_case(device, "bf16", batch=4, heads=16, qlen=8, lens=(100, 2000, 3000, 129),
                     page=64, draft_counts=(8, 2, 0, 5), extra_rows=2,
                     trees=[eagle_tree(2, 3, 8, _g(900)), chain_tree(2), [],
                            random_ancestor_tree(5, _g(901))])

    def step(q, k_buffer, table, seq_lens, qo_indptr, tree_mask):
        o = torch.full((q.shape[0], 16, 512), float("nan"), dtype=q.dtype, device=q.device)
        lse = torch.full((q.shape[0], 16), float("nan"), dtype=torch.float32, device=q.device)
        logits = torch.empty(q.shape[0], 16, 4, 513, dtype=torch.float32, device=q.device)
        torch.ops.mla.decode_verify(q, k_buffer, k_buffer[..., :512], o, lse, table, seq_lens,
                                    None, 8, logits, 4, SM_SCALE, 64, None,
                                    qo_indptr=qo_indptr, tree_mask=tree_mask)
        return o * 1, lse

    compiled = torch.compile(step, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        o, lse = compiled(case.q, case.k_buffer, case.req_to_token, case.seq_lens,
                          case.qo_indptr, case.tree_mask)
        case.assert_matches(o, lse)
