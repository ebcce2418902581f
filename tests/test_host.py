"""mla_ops.host: the launchers' integer helpers agree with triton's, and the device guard."""

from __future__ import annotations

import contextlib

import pytest
import torch
import triton

from mla_ops import host


@pytest.mark.parametrize("n", [0, 1, 2, 3, 15, 16, 17, 72, 80, 96, 255, 256, 257, 576, 4097,
                               131071, 131072, 131073])
def test_next_power_of_2_is_tritons(n):
    assert host.next_power_of_2(n) == triton.next_power_of_2(n)


@pytest.mark.parametrize("b", [1, 3, 16, 64, 128])
@pytest.mark.parametrize("a", [0, 1, 15, 16, 17, 127, 128, 129, 3520, 131073])
def test_cdiv_is_tritons(a, b):
    assert host.cdiv(a, b) == triton.cdiv(a, b)


def test_device_guard_switches_only_to_another_cuda_device():
    assert isinstance(host.device_guard(torch.device("cpu")), contextlib.nullcontext)
    if torch.cuda.device_count() < 2:
        pytest.skip("another CUDA device is needed to see the guard switch")
    with host.device_guard(torch.device("cuda", 1)):
        assert torch.cuda.current_device() == 1


# --- what a call on CPU tensors runs (host.public_launcher) --------------------------------------

# Each case: a bf16 problem small enough for the interpreter, checked by the tolerance rule.
_BF16_VERIFY = dict(batch=2, heads=4, qlen=2, lens=[70, 5], page=16, dtype=torch.bfloat16)
_BF16_ENCODER = dict(lens=[33, 17], hq=2, hkv=2, d=72, dtype=torch.bfloat16)


def _merge_case(dtype):
    g = torch.Generator().manual_seed(1)
    o_parts = torch.randn(3, 4, 2, 40, generator=g).to(dtype)
    lse_parts = torch.randn(3, 4, 2, generator=g) * 3
    lse_parts[1, 0] = float("-inf")
    return o_parts, lse_parts


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs CPU tensors")
@pytest.mark.parametrize("entry", ["function", "op", "plan"])
def test_bf16_under_the_interpreter_is_computed_in_fp32(entry):
    """Triton's interpreter computes bf16 wrongly (errors of 1e9); every public entry of
    decode verify runs it on fp32 copies and rounds once, so bf16 meets bf16's rule."""
    import mla_ops
    from builders import decode_case, interpret

    case = decode_case("cpu", **_BF16_VERIFY)
    with interpret(True):
        if entry == "plan":
            plan = mla_ops.plan_verify(case.batch, case.qlen, case.heads, 128,
                                       dtype=torch.bfloat16, device="cpu", page_size=case.page_size,
                                       head_dim=case.k_buffer.shape[-1], v_head_dim=case.Lv)
            plan.alloc_workspace()
            args = case.op_args(plan.num_kv_splits)
            plan.run(args["q"], case.k_buffer, args["o"], args["lse"], args["req_to_token"],
                     args["seq_lens"], sm_scale=case.sm_scale)
            o, lse = args["o"], args["lse"]
        else:
            o, lse = case.run(num_kv_splits=2,
                              fn=torch.ops.mla.decode_verify if entry == "op" else None)
    case.assert_matches(o, lse)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs CPU tensors")
def test_bf16_encoder_and_merge_under_the_interpreter():
    from builders import encoder_case, interpret

    from mla_ops.merge.launch import merge_attn_states
    from mla_ops.reference import merge_attn_states_ref

    case = encoder_case("cpu", **_BF16_ENCODER)
    with interpret(True):
        o = case.run()
        o_parts, lse_parts = _merge_case(torch.bfloat16)
        merged = torch.full((4, 2, 40), float("nan"), dtype=torch.bfloat16)
        merged_lse = torch.full((4, 2), float("nan"))
        merge_attn_states(o_parts, lse_parts, merged, merged_lse)
    case.assert_matches(o)
    ref_o, ref_lse = merge_attn_states_ref(o_parts.float(), lse_parts)
    # the fp32 merge rounded once to bf16: within one bf16 ulp (2^-8 relative) of fp32's
    assert ((merged.float() - ref_o).abs() <= ref_o.abs() * 2.0 ** -8).all()
    assert torch.allclose(merged_lse, ref_lse, rtol=1e-6, atol=0)


def test_cpu_tensors_without_the_interpreter_run_the_reference():
    """The public functions on CPU tensors outside the interpreter run the ops' plain-PyTorch
    CPU kernels (as the ops do), never a Triton launch ("0 active drivers")."""
    import mla_ops
    from builders import decode_case, encoder_case, interpret

    from mla_ops.merge.launch import merge_attn_states, rescale_attn_partial
    from mla_ops.reference import merge_attn_states_ref, rescale_attn_partial_ref

    case = decode_case("cpu", **{**_BF16_VERIFY, "dtype": torch.float32})
    enc = encoder_case("cpu", **{**_BF16_ENCODER, "dtype": torch.float32})
    o_parts, lse_parts = _merge_case(torch.float32)
    with interpret(False):
        o, lse = case.run(num_kv_splits=2)
        with pytest.raises(ValueError, match="^config: the gluon family cannot run this launch"):
            case.run(num_kv_splits=2, config={"family": "gluon"})  # never a silent reference
        mla_ops.warmup_decode_attention_fwd_verify(**case.warmup_args())
        # a plan's warmup passes its config: nothing to compile on the reference, not refused
        mla_ops.warmup_decode_attention_fwd_verify(**case.warmup_args(), config={"family": "triton"})
        enc_o = enc.run()
        merged, merged_lse = torch.empty(4, 2, 40), torch.empty(4, 2)
        merge_attn_states(o_parts, lse_parts, merged, merged_lse)
        share, share_lse = torch.empty(4, 2, 40), torch.empty(4, 2)
        rescale_attn_partial(o_parts[1], lse_parts, 1, share, share_lse)
    case.assert_matches(o, lse)
    enc.assert_matches(enc_o)
    assert torch.equal(merged, merge_attn_states_ref(o_parts, lse_parts)[0])
    assert torch.equal(share, rescale_attn_partial_ref(o_parts[1], lse_parts, 1)[0])


@pytest.mark.parametrize("triton_v,numpy_v,bad", [("3.6.0", "2.3.5", False), ("3.6.0", "2.4.0", True),
                                                  ("3.7.1", "2.4.6", False), ("3.9.0", "2.4.6", False)])
def test_the_interpreter_names_a_numpy_it_cannot_run_with(triton_v, numpy_v, bad, monkeypatch):
    import numpy

    from mla_ops import platform

    monkeypatch.setattr(triton, "__version__", triton_v)
    monkeypatch.setattr(numpy, "__version__", numpy_v)
    why = platform.interpreter_problem.__wrapped__()
    assert (why is not None) == bad
    if bad:
        assert "numpy<2.4" in why and triton_v in why
