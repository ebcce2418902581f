"""torch.ops.mla: schemas, the ops against the references, opcheck, torch.compile, autograd
refusal.

On a CPU-only machine the ops' CPU kernels run the Triton kernels in the interpreter
(conftest sets TRITON_INTERPRET=1); with a GPU the same tests also run on CUDA tensors. Bad
arguments on every path are ``tests/test_argument_rules.py``'s; the C++ side against the Python
one, ``tests/test_csrc_meta.py``'s.
"""

import expecttest
import pytest
import torch

import mla_ops  # noqa: F401  (registers torch.ops.mla)
from mla_ops import library

from builders import decode_case, encoder_case

HAS_GPU = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_GPU else [])
ACT = torch.float16 if not HAS_GPU else torch.bfloat16


def _verify(device, batch=2, heads=4, lens=(37, 20), real=None, dtype=torch.float16):
    return decode_case(device, batch=batch, heads=heads, qlen=2, lens=lens, real=real, page=16,
                       Lv=64, rope=32, dtype=dtype)


class TestSchemas(expecttest.TestCase):
    def test_schemas_pinned(self):
        self.assertExpectedInline(
            str(library.schema_of(torch.ops.mla.decode_verify.default)),
            """mla::decode_verify(Tensor q, Tensor k_buffer, Tensor v_buffer, Tensor(a!) o, Tensor(b!) lse, Tensor req_to_token, Tensor seq_lens, Tensor? real_seq_lens, int qlen, Tensor(c!)? attn_logits, int num_kv_splits, float sm_scale, int page_size, Tensor? k_scale=None, int cp_world=1, int cp_rank=0, int cp_interleave=1, Tensor? qo_indptr=None, Tensor? tree_mask=None) -> ()""",
        )
        self.assertExpectedInline(
            str(library.schema_of(torch.ops.mla.warmup_decode_verify.default)),
            """mla::warmup_decode_verify(Tensor q, Tensor k_buffer, Tensor o, Tensor lse, Tensor req_to_token, bool has_real, int[] qlens, Tensor? attn_logits, float sm_scale, int page_size, Tensor? k_scale=None, int cp_world=1, int cp_rank=0, int cp_interleave=1, bool varlen=False, bool has_tree=False) -> ()""",
        )
        self.assertExpectedInline(
            str(library.schema_of(torch.ops.mla.context_attention.default)),
            """mla::context_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) o, Tensor b_start_loc, Tensor b_seq_len, int max_input_len, bool is_causal=True, float? softmax_scale=None, int? sliding_window_q=None, int? sliding_window_k=None, Tensor? sinks=None) -> ()""",
        )


# --- the ops compute what the references compute --------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [1, 3], ids=["split1", "split3"])
def test_decode_verify_op_matches_reference(device, splits):
    case = _verify(device, real=(30, 0))
    o, lse = case.run(splits, fn=torch.ops.mla.decode_verify)
    case.assert_matches(o, lse)
    # Request 1 sees no key at all: lse -inf, o 0, never NaN.
    assert torch.isneginf(lse[2:]).all() and (o[2:] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_context_attention_op_matches_reference(device):
    case = encoder_case(device, lens=(5, 9), hq=4, hkv=2, d=72)
    case.assert_matches(case.run(fn=torch.ops.mla.context_attention))


def test_cp_defaults_are_no_context_parallelism(device):
    """cp_world=1, cp_rank=0, cp_interleave=1 spelled out give the call without them, bit for
    bit, on the function and the op (the context-parallel kernels land later)."""
    case = _verify(device, real=(30, 7))
    o, lse = case.run(2)
    for fn in (mla_ops.decode_attention_fwd_verify, torch.ops.mla.decode_verify):
        args = case.op_args(2)
        fn(**args, cp_world=1, cp_rank=0, cp_interleave=1)
        assert torch.equal(args["o"], o) and torch.equal(args["lse"], lse)


# --- opcheck --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [1, 2], ids=["split1", "split2"])
def test_opcheck_decode_verify(device, splits):
    args = _verify(device, batch=1, heads=2, lens=(9,),
                   dtype=ACT if device == "cuda" else torch.float16).op_args(splits)
    torch.library.opcheck(torch.ops.mla.decode_verify.default, (), args)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_warmup_decode_verify(device):
    args = _verify(device, batch=1, heads=2, lens=(9,)).warmup_args(qlens=[1, 2])
    torch.library.opcheck(torch.ops.mla.warmup_decode_verify.default, (), args)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_context_attention(device):
    args = encoder_case(device, lens=(3, 4), hq=4, hkv=2, d=32).op_args()
    torch.library.opcheck(torch.ops.mla.context_attention.default, (), args)


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
        return out * 1, lse  # exact glue: compiled and eager agree bit for bit


def test_compile_fullgraph_matches_eager(device):
    case = _verify(device, dtype=ACT if device == "cuda" else torch.float16)
    starts = torch.tensor([0, 2], device=device, dtype=torch.int32)
    lens = torch.tensor([2, 2], device=device, dtype=torch.int32)
    inputs = (case.q, case.k_buffer, case.req_to_token, case.seq_lens, starts, lens, case.qlen,
              case.page_size)
    model = _Step()
    eager = model(*inputs)
    compiled = torch.compile(model, fullgraph=True,
                             backend="inductor" if device == "cuda" else "aot_eager")
    got = compiled(*inputs)
    assert all(torch.equal(g, e) for g, e in zip(got, eager))
    assert not any(t.isnan().any() for t in got)


def test_compile_fullgraph_inductor_cpu():
    # Inductor on CPU needs a C++ toolchain; the op stays opaque in the graph either way.
    case = encoder_case("cpu", lens=(3, 4), hq=4, hkv=2, d=32)

    def f(q, k, v, starts, seq):
        o = torch.empty_like(q)
        torch.ops.mla.context_attention(q, k, v, o, starts, seq, 4, True, None, None, None, None)
        return o * 2

    inputs = (case.q, case.k, case.v, case.b_start_loc, case.b_seq_len)
    eager = f(*inputs)
    got = torch.compile(f, fullgraph=True)(*inputs)
    torch.testing.assert_close(got, eager)


# --- autograd -------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["decode_verify", "context_attention"])
def test_backward_raises_inference_only(op):
    if op == "decode_verify":
        args = _verify("cpu").op_args()
    else:
        args = encoder_case("cpu", lens=(3,), hq=2, hkv=2, d=16).op_args()
    args["q"] = args["q"].detach().requires_grad_(True)
    o_before = args["o"].clone()
    with pytest.raises(RuntimeError, match=rf"^mla::{op} is inference-only \(no autograd "
                                           r"formula is registered\), but q requires grad"):
        getattr(torch.ops.mla, op)(**args)
    assert torch.equal(args["o"].isnan(), o_before.isnan())
    with torch.no_grad():
        getattr(torch.ops.mla, op)(**args)
    assert not args["o"].requires_grad


def test_grad_refusal_kernel_works_on_this_torch(monkeypatch):
    """``library._register_grad_refusal`` (the one user of torch's private dispatcher API:
    ``_AutoDispatchBelowAutograd``, ``_after_autograd_keyset``, ``OpOverload.redispatch``) on a
    custom op of its own, whichever side defined the mla ops here: it refuses grad, and without
    grad runs the op below autograd. Fails when torch moves that API."""
    @torch.library.custom_op("mla_grad_refusal_test::twice_", mutates_args=("o",))
    def twice_(x: torch.Tensor, o: torch.Tensor) -> None:
        o.copy_(x * 2)

    lib = torch.library.Library("mla_grad_refusal_test", "FRAGMENT")
    monkeypatch.setattr(library, "LIB", "mla_grad_refusal_test")
    library._register_grad_refusal(lib, "twice_")
    op = torch.ops.mla_grad_refusal_test.twice_
    x, o = torch.randn(3, requires_grad=True), torch.zeros(3)
    with pytest.raises(RuntimeError, match=r"^mla_grad_refusal_test::twice_ is inference-only "
                                           r".*, but x requires grad"):
        op(x, o)
    assert (o == 0).all()
    with torch.no_grad():
        op(x, o)
    assert torch.equal(o, x.detach() * 2)
    op(x.detach(), o.fill_(0))  # grad enabled, nothing requires it: runs
    assert torch.equal(o, x.detach() * 2)
