"""torch.ops.mla: schemas, opcheck, torch.compile, autograd refusal and bad input.

On a CPU-only machine the ops' CPU kernels run the Triton kernels in the interpreter
(conftest sets TRITON_INTERPRET=1); with a GPU the same tests also run on CUDA tensors.
"""

import math

import expecttest
import pytest
import torch

import mla_ops  # noqa: F401  (registers torch.ops.mla)
from mla_ops import reference

HAS_GPU = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_GPU else [])
ACT = torch.float16 if not HAS_GPU else torch.bfloat16


def verify_args(device, B=2, H=4, qlen=2, page=16, Lv=64, rope=32, splits=1, dtype=torch.float16,
                lens=(37, 20), real=None):
    Lk = Lv + rope
    max_pages = math.ceil(max(lens) / page)
    num_pages = B * max_pages + 2
    cache = torch.randn(num_pages, page, 1, Lk, device=device, dtype=dtype)
    table = torch.randperm(num_pages, device=device)[: B * max_pages].reshape(B, max_pages).int()
    rows = B * qlen
    q = torch.randn(rows, H, Lk, device=device, dtype=dtype)
    o = torch.full((rows, H, Lv), float("nan"), device=device, dtype=dtype)
    lse = torch.full((rows, H), float("nan"), device=device, dtype=torch.float32)
    seq_lens = torch.tensor(lens, device=device, dtype=torch.int32)
    real_lens = None if real is None else torch.tensor(real, device=device, dtype=torch.int32)
    logits = (torch.empty(rows, H, splits, Lv + 1, device=device, dtype=torch.float32)
              if splits > 1 else None)
    return (q, cache, cache[..., :Lv], o, lse, table, seq_lens, real_lens, qlen, logits, splits,
            0.1352, page, None)


def context_args(device, lens=(5, 9), hq=4, hkv=2, d=72, dtype=torch.float16, causal=True):
    total = sum(lens)
    q = torch.randn(total, hq, d, device=device, dtype=dtype)
    k = torch.randn(total, hkv, d, device=device, dtype=dtype)
    v = torch.randn(total, hkv, d, device=device, dtype=dtype)
    o = torch.full_like(q, float("nan"))
    starts = torch.tensor([0, *list(torch.tensor(lens).cumsum(0)[:-1].tolist())], device=device,
                          dtype=torch.int32)
    seq = torch.tensor(lens, device=device, dtype=torch.int32)
    return (q, k, v, o, starts, seq, max(lens), causal, None, None, None, None)


class TestSchemas(expecttest.TestCase):
    def test_schemas_pinned(self):
        self.assertExpectedInline(
            str(torch.ops.mla.decode_verify.default._schema),
            """mla::decode_verify(Tensor q, Tensor k_buffer, Tensor v_buffer, Tensor(a!) o, Tensor(b!) lse, Tensor req_to_token, Tensor seq_lens, Tensor? real_seq_lens, int qlen, Tensor(c!)? attn_logits, int num_kv_splits, float sm_scale, int page_size, Tensor? k_scale=None) -> ()""",
        )
        self.assertExpectedInline(
            str(torch.ops.mla.warmup_decode_verify.default._schema),
            """mla::warmup_decode_verify(Tensor q, Tensor k_buffer, Tensor o, Tensor lse, Tensor req_to_token, bool has_real, int[] qlens, Tensor? attn_logits, float sm_scale, int page_size, Tensor? k_scale=None) -> ()""",
        )
        self.assertExpectedInline(
            str(torch.ops.mla.context_attention.default._schema),
            """mla::context_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) o, Tensor b_start_loc, Tensor b_seq_len, int max_input_len, bool is_causal=True, float? softmax_scale=None, int? sliding_window_q=None, int? sliding_window_k=None, Tensor? sinks=None) -> ()""",
        )


# --- the ops compute what the references compute --------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [1, 3], ids=["split1", "split3"])
def test_decode_verify_op_matches_reference(device, splits):
    args = verify_args(device, splits=splits, real=(30, 0))
    torch.ops.mla.decode_verify(*args)
    q, cache, v, o, lse, table, seq, real, qlen, _, _, scale, page, _ = args
    o_ref, lse_ref = reference.decode_verify_ref(q, cache, v.shape[-1], table, seq, real, qlen,
                                                 scale, page)
    torch.testing.assert_close(o.float(), o_ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-3, atol=1e-3)
    # Request 1 sees no key at all: lse -inf, o 0, never NaN.
    assert torch.isneginf(lse[2:]).all() and (o[2:] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_context_attention_op_matches_reference(device):
    args = context_args(device)
    torch.ops.mla.context_attention(*args)
    q, k, v, o, starts, seq = args[:6]
    ref = reference.context_attention_ref(q, k, v, starts, seq, True)
    torch.testing.assert_close(o.float(), ref, rtol=2e-2, atol=2e-2)


# --- opcheck --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [1, 2], ids=["split1", "split2"])
def test_opcheck_decode_verify(device, splits):
    args = verify_args(device, B=1, H=2, lens=(9,), splits=splits, dtype=ACT if device == "cuda" else torch.float16)
    torch.library.opcheck(torch.ops.mla.decode_verify.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_warmup_decode_verify(device):
    q, cache, _, o, lse, table, *_ = verify_args(device, B=1, H=2, lens=(9,), splits=2)
    logits = torch.empty(2, 2, 2, 65, device=device)
    torch.library.opcheck(torch.ops.mla.warmup_decode_verify.default,
                          (q, cache, o, lse, table, True, [1, 2], logits, 0.1352, 16, None))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_context_attention(device):
    args = context_args(device, lens=(3, 4), d=32)
    torch.library.opcheck(torch.ops.mla.context_attention.default, args)


# --- torch.compile --------------------------------------------------------------------------


class _Step(torch.nn.Module):
    """A model step calling all three ops, as a serving engine would."""

    def forward(self, x, cache, table, seq_lens, starts, lens, qlen: int, page: int):
        rows, H, Lk = x.shape
        Lv = 64
        o = torch.empty(rows, H, Lv, dtype=x.dtype, device=x.device)
        lse = torch.empty(rows, H, dtype=torch.float32, device=x.device)
        torch.ops.mla.decode_verify(x * 2, cache, cache[..., :Lv], o, lse, table, seq_lens, None,
                                    qlen, None, 1, 0.1352, page, None)
        y = o[..., :32].contiguous()
        out = torch.empty_like(y)
        torch.ops.mla.context_attention(y, y, y, out, starts, lens, rows, False, None, None,
                                        None, None)
        return out.sum(-1) + lse


def test_compile_fullgraph_matches_eager(device):
    q, cache, _, _, _, table, seq, _, qlen, _, _, _, page, _ = verify_args(device, dtype=ACT if device == "cuda" else torch.float16)
    starts = torch.tensor([0, 2], device=device, dtype=torch.int32)
    lens = torch.tensor([2, 2], device=device, dtype=torch.int32)
    model = _Step()
    eager = model(q, cache, table, seq, starts, lens, qlen, page)
    compiled = torch.compile(model, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    got = compiled(q, cache, table, seq, starts, lens, qlen, page)
    torch.testing.assert_close(got, eager, rtol=1e-2, atol=1e-2)


def test_compile_fullgraph_inductor_cpu():
    # Inductor on CPU needs a C++ toolchain; the op stays opaque in the graph either way.
    args = context_args("cpu", lens=(3, 4), d=32)

    def f(q, k, v, starts, seq):
        o = torch.empty_like(q)
        torch.ops.mla.context_attention(q, k, v, o, starts, seq, 4, True, None, None, None, None)
        return o * 2

    q, k, v, _, starts, seq = args[:6]
    eager = f(q, k, v, starts, seq)
    got = torch.compile(f, fullgraph=True)(q, k, v, starts, seq)
    torch.testing.assert_close(got, eager)


# --- autograd -------------------------------------------------------------------------------


def test_backward_raises_inference_only():
    q, k, v, o, starts, seq, *rest = context_args("cpu", lens=(3,), d=16)
    q.requires_grad_(True)
    with pytest.raises(RuntimeError, match="inference-only"):
        torch.ops.mla.context_attention(q, k, v, o, starts, seq, *rest)
        o.sum().backward()


# --- bad input ------------------------------------------------------------------------------


def _bad_verify_cases():
    def mod(i, value):
        def make():
            args = list(verify_args("cpu", splits=2))
            args[i] = value(args) if callable(value) else value
            return args
        return make

    return [
        ("q-dtype-int", "q", mod(0, lambda a: a[0].to(torch.int32))),
        ("q-rank", "q", mod(0, lambda a: a[0][0])),
        ("k_buffer-dtype-mismatch", "k_buffer", mod(1, lambda a: a[1].float())),
        ("v_buffer-not-pow2", "v_buffer", mod(2, lambda a: a[1][..., :48])),
        ("o-shape", "o", mod(3, lambda a: a[3][:, :, :32])),
        ("o-dtype", "o", mod(3, lambda a: a[3].float())),
        ("lse-not-fp32", "lse", mod(4, lambda a: a[4].half())),
        ("req_to_token-int64", "req_to_token", mod(5, lambda a: a[5].long())),
        ("seq_lens-shape", "seq_lens", mod(6, lambda a: a[6][:1])),
        ("real_seq_lens-shape", "real_seq_lens", mod(7, lambda a: a[6][:1])),
        ("qlen-rows", "qlen", mod(8, 3)),
        ("workspace-too-small", "attn_logits", mod(9, lambda a: a[9][..., :10])),
        ("workspace-missing", "attn_logits", mod(9, None)),
        ("num_kv_splits-zero", "num_kv_splits", mod(10, 0)),
        ("page_size-mismatch", "page_size", mod(12, 64)),
        ("k_scale-shape", "k_scale", mod(13, lambda a: torch.ones(2))),
        ("k_buffer-two-heads", "k_buffer", mod(1, lambda a: a[1].expand(-1, -1, 2, -1))),
    ]


BAD_VERIFY = _bad_verify_cases()


@pytest.mark.parametrize("name,arg,make", BAD_VERIFY, ids=[c[0] for c in BAD_VERIFY])
def test_decode_verify_bad_input_names_argument(name, arg, make):
    for call in (mla_ops.decode_attention_fwd_verify, torch.ops.mla.decode_verify):
        args = make()
        o_before = args[3].clone() if isinstance(args[3], torch.Tensor) else None
        with pytest.raises((ValueError, TypeError), match=arg):
            call(*args)
        if o_before is not None:  # nothing was launched: o is untouched (still NaN)
            assert torch.equal(o_before.isnan(), args[3].isnan())


def test_decode_verify_bad_input_in_fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        args = list(verify_args("cpu", splits=2))
        args[4] = args[4].half()
        with pytest.raises(TypeError, match="lse"):
            torch.ops.mla.decode_verify(*args)


def _bad_context_cases():
    def mod(i, value):
        def make():
            args = list(context_args("cpu"))
            args[i] = value(args) if callable(value) else value
            return args
        return make

    return [
        ("k-head-dim", "k", mod(1, lambda a: a[1][..., :64].contiguous())),
        ("gqa-not-multiple", "k", mod(1, lambda a: torch.randn(a[1].shape[0], 3, 72).half())),
        ("starts-lengths-size", "b_seq_len", mod(5, lambda a: a[5][:1])),
        ("v-dtype", "v", mod(2, lambda a: a[2].float())),
        ("o-shape", "o", mod(3, lambda a: a[3][:, :2])),
        ("sinks-shape", "sinks", mod(11, lambda a: torch.zeros(3))),
        ("window-negative", "sliding_window_q", mod(9, -2)),
        ("q-int", "q", mod(0, lambda a: a[0].int())),
    ]


BAD_CONTEXT = _bad_context_cases()


@pytest.mark.parametrize("name,arg,make", BAD_CONTEXT, ids=[c[0] for c in BAD_CONTEXT])
def test_context_attention_bad_input_names_argument(name, arg, make):
    for call in (mla_ops.context_attention_fwd, torch.ops.mla.context_attention):
        args = make()
        with pytest.raises((ValueError, TypeError), match=arg):
            call(*args)


@pytest.mark.gpu
def test_mixed_devices_rejected():
    args = list(verify_args("cuda", dtype=torch.bfloat16))
    args[6] = args[6].cpu()
    with pytest.raises(ValueError, match="seq_lens"):
        torch.ops.mla.decode_verify(*args)
