"""plan_verify: a plan per batch bucket gives the table's config and split, owns its workspace,
refuses calls it was not made for, traces under torch.compile and replays in CUDA graphs; and
the end-to-end serving step runs on it."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import mla_ops
from mla_ops.decode_verify.launch import launch_config
from mla_ops.decode_verify.splits import verify_num_kv_splits
from mla_ops.platform import mock_platform

from builders import SM_SCALE, decode_case

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _plan_for(case, max_len, **kw):
    return mla_ops.plan_verify(case.batch, case.qlen, case.heads, max_len, dtype=case.q.dtype,
                               kv_dtype=case.k_buffer.dtype, device=case.q.device,
                               page_size=case.page_size, head_dim=case.k_buffer.shape[-1],
                               v_head_dim=case.Lv, **kw)


def _run(plan, case, **kw):
    args = case.op_args(plan.num_kv_splits)
    plan.run(args["q"], case.k_buffer, args["o"], args["lse"], args["req_to_token"],
             args["seq_lens"], real_seq_lens=args["real_seq_lens"], k_scale=args["k_scale"],
             sm_scale=SM_SCALE, **kw)
    return args["o"], args["lse"]


@pytest.mark.parametrize("splits", [1, 3], ids=["one-split", "three-splits"])
def test_plan_run_matches_reference(device, splits):
    case = decode_case(device, batch=3, heads=4, qlen=2, lens=(1, 40, 100), page=16, Lv=64,
                       rope=32, dtype=torch.float16, real=(1, 33, 100))
    plan = _plan_for(case, 100, num_kv_splits=splits)
    plan.alloc_workspace()
    assert (plan.workspace is None) == (splits == 1)
    o, lse = _run(plan, case)
    case.assert_matches(o, lse)
    # a smaller batch of the same bucket runs on the same plan
    small = decode_case(device, batch=2, heads=4, qlen=2, lens=(7, 60), page=16, Lv=64,
                        rope=32, dtype=torch.float16)
    o, lse = _run(plan, small)
    small.assert_matches(o, lse)


@pytest.mark.parametrize("arch", ["sm_90", "gfx942", "sm_80"])
@pytest.mark.parametrize("H,qlen,B,L", [(16, 2, 1, 8192), (16, 2, 32, 4096), (16, 4, 128, 4096),
                                        (128, 1, 128, 4096), (128, 4, 32, 4096),
                                        (128, 2, 16, 32768)],
                         ids=["M1", "M2", "M3", "M5", "M6", "H128-q2-32k"])
def test_plan_holds_the_tables_config_and_split(arch, H, qlen, B, L):
    """What the tuned table gives (its config; the split from that config's BLOCK_H and
    SPLIT_WORK), not fixed defaults."""
    with mock_platform(arch, interpret=False):
        plan = mla_ops.plan_verify(B, qlen, H, L, dtype=torch.bfloat16, device="cpu",
                                   page_size=64)
        probe = torch.empty(0, 1, 576, dtype=torch.bfloat16)
        cfg = launch_config(B, qlen, H, probe, 512, q_dtype=torch.bfloat16, page_size=64)
        assert dict(plan.config) == cfg
        assert plan.num_kv_splits == verify_num_kv_splits(
            L, B, qlen, H, block_h=cfg["BLOCK_H"], min_work_per_split=cfg["SPLIT_WORK"])
        assert plan.num_kv_splits == verify_num_kv_splits(L, B, qlen, H)  # the new default
        assert plan.workspace_shape in (None, (B * qlen, H, plan.num_kv_splits, 513))


@pytest.mark.parametrize("what,message,exc", [
    ("batch-too-large", "^q: a batch of 5 requests exceeds the plan's 3", ValueError),
    ("cache-dtype", "^kv_cache: dtype float32, but the plan was made for a float16 cache",
     TypeError),
    ("q-dtype", "^q: dtype float32, but the plan was made for float16", TypeError),
    ("heads", r"^q: expected \[B\*2, 4, 96\] as planned", ValueError),
    ("page-size", "^kv_cache: pages of 32 tokens, but the plan was made for pages of 16",
     ValueError),
    ("metadata-positional", "takes 7 positional arguments", TypeError),
])
@pytest.mark.parametrize("after_a_good_call", [False, True], ids=["fresh", "after-a-good-call"])
def test_plan_refuses_calls_it_was_not_made_for(device, what, message, exc, after_a_good_call):
    """Refused before any launch, also on a plan that has run a good call (which it remembers,
    so as not to check the same tensors' metadata again)."""
    case = decode_case(device, batch=3, heads=4, qlen=2, lens=(5, 40, 70), page=16, Lv=64,
                       rope=32, dtype=torch.float16, real=(5, 40, 66))
    plan = _plan_for(case, 100, num_kv_splits=2)
    plan.alloc_workspace()
    if after_a_good_call:
        _run(plan, case)
    args = case.op_args(2)
    q, kv, o, lse = args["q"], case.k_buffer, args["o"], args["lse"]
    table, lens, real = args["req_to_token"], args["seq_lens"], args["real_seq_lens"]
    if what == "batch-too-large":
        q = torch.randn(10, 4, 96, device=device, dtype=torch.float16)
    elif what == "cache-dtype":
        kv = kv.float()
    elif what == "q-dtype":
        q = q.float()
    elif what == "heads":
        q = q[:, :2]
    elif what == "page-size":
        kv = kv.reshape(kv.shape[0] // 2, 32, 1, -1)
    with pytest.raises(exc, match=message):
        if what == "metadata-positional":  # seq_lens and real_seq_lens cannot be swapped
            plan.run(q, kv, o, lse, table, lens, real, sm_scale=SM_SCALE)
        else:
            plan.run(q, kv, o, lse, table, lens, real_seq_lens=real, sm_scale=SM_SCALE)
    assert torch.isnan(o).all(), "a refused call wrote o"


def test_plan_refuses_another_config_bucket():
    """On the sm_90 table, H16 qlen 2 runs one config up to 128 rows (4 requests) and another
    above: a plan for 32 requests refuses a batch of 4, which would run the other config."""
    with mock_platform("sm_90", interpret=False):
        plan = mla_ops.plan_verify(32, 2, 16, 4096, dtype=torch.float16, device="cpu",
                                   page_size=64)
        q = torch.randn(8, 16, 576, dtype=torch.float16)
        kv = torch.randn(4, 64, 1, 576, dtype=torch.float16)
        with pytest.raises(ValueError, match="^q: a batch of 4 requests selects another launch "
                                             "config than the plan's bucket"):
            plan.run(q, kv, torch.empty(8, 16, 512, dtype=torch.float16), torch.empty(8, 16),
                     torch.zeros(4, 1, dtype=torch.int32), torch.ones(4, dtype=torch.int32),
                     sm_scale=SM_SCALE)


def test_plan_traces_under_torch_compile(device):
    torch._dynamo.reset()
    case = decode_case(device, batch=2, heads=4, qlen=2, lens=(30, 77), page=16, Lv=64, rope=32,
                       dtype=torch.float16, real=(30, 70))
    plan = _plan_for(case, 100, num_kv_splits=2)
    plan.alloc_workspace()

    def step(q, kv, table, lens, real):
        o = torch.empty(q.shape[0], q.shape[1], 64, dtype=q.dtype, device=q.device)
        lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
        plan.run(q, kv, o, lse, table, lens, real_seq_lens=real, sm_scale=SM_SCALE)
        return o, lse

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    args = case.op_args(2)
    o, lse = compiled(args["q"], case.k_buffer, args["req_to_token"], args["seq_lens"],
                      args["real_seq_lens"])
    case.assert_matches(o, lse)


def test_serving_step_e2e_interpret():
    """The e2e step (verify engine and qlen=1 feed engine) against the plain-PyTorch model."""
    sys.path.insert(0, ROOT)
    from benchmarks import serving_step_e2e

    if not os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the --interpret mode runs where the interpreter does (the GPU run is the "
                    "benchmark itself)")
    assert serving_step_e2e.main(["--interpret", "--steps", "2", "--batches", "1", "2"]) == 0


@pytest.mark.gpu
def test_gpu_plan_per_bucket_captured_and_replayed(device):
    """One captured graph per batch bucket after the plan's warmup, replayed with new lengths,
    real lengths and block tables."""
    for batch in (1, 4, 32):
        case = decode_case(device, batch=batch, heads=16, qlen=3, lens=(2000,) * batch, page=64,
                           Lv=512, rope=64, dtype=torch.bfloat16, real=(1999,) * batch)
        plan = _plan_for(case, 2048)
        args = case.op_args(plan.num_kv_splits)
        q, o, lse = args["q"], args["o"], args["lse"]
        table, lens, real = args["req_to_token"], args["seq_lens"], args["real_seq_lens"]
        plan.warmup(q, case.k_buffer, o, lse, table, sm_scale=SM_SCALE)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            plan.run(q, case.k_buffer, o, lse, table, lens, real_seq_lens=real, sm_scale=SM_SCALE)
        gen = torch.Generator(device="cpu").manual_seed(batch)
        for _ in range(3):
            lens.copy_(torch.randint(1, 2049, (batch,), generator=gen).int())
            real.copy_((lens - torch.randint(0, 3, (batch,), generator=gen).int().to(device))
                       .clamp(min=0))
            table.copy_(table[torch.randperm(batch, generator=gen).to(device)])
            q.normal_()
            o.fill_(float("nan"))
            lse.fill_(float("nan"))
            g.replay()
            case.assert_matches(o, lse)
