"""The tolerance rule of the kernel tests (``builders.assert_matches``) is tight enough to see a
small bug: a kernel that drops one block of keys, or reads one wrong block, fails it.

The rule (flash-attention's): the kernel's error against a float64 reference is at most
``builders.K`` times the error of plain PyTorch computing the same attention in the kernel's
dtype, plus a small floor, request by request. Fixed tolerances sized for bf16 (o 2e-2, lse
1e-2) could not see one 64-key block dropped at L = 32k; these tests show this rule does:

* on CPU, the Triton kernel in the interpreter (fp16, L = 2048) run on a wrong length (16 keys
  short) or with one page of 16 keys redirected, and the encoder kernel reading one wrong block;
* on CPU at the GPU tests' own shape and dtype (bf16 and fp8, L = 32k, H = 16, 512 + 64):
  the reference itself, rounded to bf16 as a kernel's output is, passes, and the same 64 keys
  short fails (this is what the GPU tests' comparison sees, without the kernel);
* on the GPU, the kernel itself at L = 32k, 64 keys short.
"""

from __future__ import annotations

import pytest
import torch

from builders import FLOOR, FP8, K, ToleranceError, assert_accurate, decode_case, encoder_case

SMALL_SPLITS = {"BLOCK_N": 16, "SPLIT_ALIGN": 16, "MIN_SPLIT_LEN": 16}


def _fails(check, label):
    with pytest.raises(ToleranceError, match=label) as e:
        check()
    return str(e.value)


def test_tolerance_sees_a_dropped_block(device):
    """The interpreter's kernel on request 0's length 16 short (16 of 2048 keys dropped) fails
    the rule for request 0 only; the right length passes."""
    case = decode_case(device, batch=2, heads=4, qlen=2, lens=(2048, 300), page=16,
                       dtype=torch.float16)
    o, lse = case.run(4, SMALL_SPLITS)
    errs = case.assert_matches(o, lse)
    case.seq_lens[0] -= 16  # the kernel sees 16 keys fewer than the reference will
    o_bad, lse_bad = case.run(4, SMALL_SPLITS)
    case.seq_lens[0] += 16
    _fails(lambda: case.assert_matches(o_bad, lse_bad), "request 0")
    # Request 1 is untouched by the mutant, and stays within the rule.
    assert torch.equal(o_bad[2:], o[2:]) and errs["o"]["request 1"][0] <= K * errs["o"]["request 1"][1]


def test_tolerance_sees_a_wrong_block(device):
    """One page of request 0 (16 keys in the middle) read from a page no request owns."""
    case = decode_case(device, batch=2, heads=4, qlen=2, lens=(2048, 300), page=16,
                       dtype=torch.float16, spare_pages=1)
    owned = set(case.req_to_token.flatten().tolist())
    spare = next(p for p in range(case.k_buffer.shape[0]) if p not in owned)
    good = case.req_to_token[0, 64].item()
    case.req_to_token[0, 64] = spare
    o_bad, lse_bad = case.run(4, SMALL_SPLITS)
    case.req_to_token[0, 64] = good
    _fails(lambda: case.assert_matches(o_bad, lse_bad), "request 0")


@pytest.mark.parametrize("cache", ["bf16", "fp8"])
def test_tolerance_sees_a_dropped_block_at_the_gpu_shape(cache):
    """The GPU tests' comparison at their 32k shape, the kernel replaced by the reference
    computed in fp32 and rounded to bf16 (as a kernel's o is): right, it passes; 64 keys short
    (one block of the sm_90 table), it fails by a wide margin in lse."""
    case = decode_case("cpu", batch=1, heads=16, qlen=2, lens=(32768,), page=64, Lv=512,
                       rope=64, dtype=torch.bfloat16,
                       cache_dtype=FP8 if cache == "fp8" else None)
    o, lse = case.reference(torch.float32)
    case.assert_matches(o.to(torch.bfloat16), lse)
    case.seq_lens[0] -= 64
    o_bad, lse_bad = case.reference(torch.float32)
    case.seq_lens[0] += 64
    errs = case.assert_matches(o_bad.to(torch.bfloat16), lse_bad, k=1e30)  # measure only
    err, base = errs["lse"]["request 0"]
    # The rule fails it (err > K * base + floor), with a margin: a 4x looser K would too.
    assert err > 4 * K * base + FLOOR[torch.bfloat16], \
        f"a dropped block costs only {err / base:.1f}x PyTorch's error"


def test_encoder_tolerance_sees_a_wrong_block(device):
    """The encoder kernel run on keys/values of which one 16-token block of sequence 1 was
    replaced (a kernel reading the wrong tile) fails the rule for sequence 1 only."""
    case = encoder_case(device, lens=(24, 160), hq=2, hkv=1, d=64, dtype=torch.float16,
                        causal=False)
    config = {"BLOCK_M": 32, "BLOCK_N": 16}
    case.assert_matches(case.run(config=config))
    good_k, good_v = case.k.clone(), case.v.clone()
    case.k[24 + 80:24 + 96] = torch.randn_like(case.k[:16])
    case.v[24 + 80:24 + 96] = torch.randn_like(case.v[:16])
    o_bad = case.run(config=config)
    case.k.copy_(good_k)
    case.v.copy_(good_v)
    msg = _fails(lambda: case.assert_matches(o_bad), "sequence 1")
    assert "sequence 0" not in msg


# The LSEs of rank 0 of test_parallel's w3-I5-fp16-a2a-triton (float64): rounded to fp16, all
# four survive +0.3 -0.3 exactly, so a noise floor drawn that way (flash-attention's own tests)
# would be 0 for them.
RANK0_LSE = [1.9932238709523589, 1.0097588689454025, 4.216246947760894, 3.6885939420392972]


def test_floor_admits_the_outputs_own_rounding():
    """Where plain PyTorch's error is 0, the rule's floor still admits an fp32 result a rounding
    away from float64 (the sharded step's LSE was once refused at 0.7 ulp of fp32 by a floor
    drawn as 0), and nothing much larger: 1e-4 off fails."""
    ref = torch.tensor(RANK0_LSE, dtype=torch.float64)
    r16 = ref.half()
    assert torch.equal(r16 + 0.3 - 0.3, r16), "the case where a drawn noise floor is 0"
    exact = ref.float()
    one_ulp_off = torch.nextafter(exact, torch.full_like(exact, float("inf")))
    assert_accurate("lse", one_ulp_off, ref, ref, torch.float16)
    with pytest.raises(ToleranceError, match="lse, all"):
        assert_accurate("lse", exact + 1e-4, ref, ref, torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
def test_gpu_tolerance_sees_a_dropped_block(device, cache):
    """The kernel itself at L = 32k (bf16 q, H = 16, 512 + 64, the table's config), request 0
    64 keys short: the GPU tests' comparison fails it; the right length passes."""
    case = decode_case(device, batch=2, heads=16, qlen=2, lens=(32768, 5000), page=64, Lv=512,
                       rope=64, dtype=torch.bfloat16,
                       cache_dtype=FP8 if cache == "fp8" else None)
    o, lse = case.run(16)
    case.assert_matches(o, lse)
    case.seq_lens[0] -= 64
    o_bad, lse_bad = case.run(16)
    case.seq_lens[0] += 64
    _fails(lambda: case.assert_matches(o_bad, lse_bad), "request 0")
