"""Launchers run under the device of their tensors: with every tensor on cuda:1 while the
current device is cuda:0, each op computes the right answer on cuda:1 and puts nothing on
cuda:0 (scratch, default k_scale, TMA descriptors' global scratch included). Needs 2 GPUs."""

from __future__ import annotations

import pytest
import torch

import mla_ops

from builders import SM_SCALE, assert_accurate, decode_case, encoder_case

two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                              reason="needs 2 GPUs")


@pytest.fixture
def on_device_1():
    torch.cuda.set_device(0)
    torch.cuda.synchronize(0)
    before = torch.cuda.memory_allocated(0)
    yield torch.device("cuda", 1)
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0, "a launcher changed the current device"
    assert torch.cuda.memory_allocated(0) == before, "something was allocated on cuda:0"


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_decode_verify_on_the_tensors_device(on_device_1, splits, fp8):
    case = decode_case(on_device_1, batch=4, heads=16, qlen=2, lens=(3, 900, 4000, 4097),
                       page=64, Lv=512, rope=64, dtype=torch.bfloat16,
                       cache_dtype=torch.float8_e4m3fn if fp8 else None, real=(3, 900, 3999, 4097))
    o, lse = case.run(num_kv_splits=splits)
    case.assert_matches(o, lse)
    args = case.op_args(splits)
    torch.ops.mla.decode_verify(**args)
    case.assert_matches(args["o"], args["lse"])


@pytest.mark.gpu
@two_gpus
def test_plan_warmup_and_run_on_the_tensors_device(on_device_1):
    case = decode_case(on_device_1, batch=8, heads=16, qlen=3, lens=(2000,) * 8, page=64,
                       Lv=512, rope=64, dtype=torch.bfloat16)
    plan = mla_ops.plan_verify(8, 3, 16, 2048, dtype=torch.bfloat16, device=on_device_1,
                               page_size=64)
    args = case.op_args(plan.num_kv_splits)
    plan.warmup(args["q"], case.k_buffer, args["o"], args["lse"], args["req_to_token"],
                sm_scale=SM_SCALE)
    assert plan.workspace is None or plan.workspace.device == on_device_1
    plan.run(args["q"], case.k_buffer, args["o"], args["lse"], args["req_to_token"],
             args["seq_lens"], sm_scale=SM_SCALE)
    case.assert_matches(args["o"], args["lse"])


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("d", [72, 128])
def test_encoder_on_the_tensors_device(on_device_1, d):
    """D 72 and 128 take the TMA path on sm_90 (device-side descriptors: global scratch from
    the allocator, which must come from cuda:1)."""
    case = encoder_case(on_device_1, lens=(300, 0, 517), hq=16, hkv=16, d=d,
                        dtype=torch.bfloat16)
    o = case.run()
    case.assert_matches(o)


@pytest.mark.gpu
@two_gpus
def test_merge_on_the_tensors_device(on_device_1):
    o_parts = torch.randn(2, 8, 16, 512, device=on_device_1, dtype=torch.bfloat16)
    lse_parts = torch.randn(2, 8, 16, device=on_device_1)
    o = torch.full((8, 16, 512), float("nan"), device=on_device_1, dtype=torch.bfloat16)
    lse = torch.full((8, 16), float("nan"), device=on_device_1)
    torch.ops.mla.merge_attn_states(o_parts, lse_parts, o, lse)
    from mla_ops.reference import merge_attn_states_ref

    ref_o, ref_lse = merge_attn_states_ref(o_parts.double(), lse_parts.double(), torch.float64)
    pt_o, pt_lse = merge_attn_states_ref(o_parts, lse_parts.to(torch.bfloat16), torch.bfloat16)
    assert_accurate("o", o, ref_o, pt_o, torch.bfloat16)
    assert_accurate("lse", lse, ref_lse, pt_lse, torch.bfloat16)
