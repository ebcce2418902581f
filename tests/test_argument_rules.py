"""Every always-on argument rule of ``mla_ops/spec.py``, on every path an argument can take.

Each bad argument raises ``ValueError`` (shapes, values) or ``TypeError`` (dtypes, types) whose
message starts with the argument's name (``^name: ``), before anything is launched (``o`` is
untouched, still the NaN it was poisoned with), on:

* ``function``: ``mla_ops.decode_attention_fwd_verify`` / ``context_attention_fwd`` /
  ``warmup_decode_attention_fwd_verify`` (the launchers' checks);
* ``op``: ``torch.ops.mla.<op>`` on the device's kernel (on CPU, the Triton kernel under the
  interpreter; on a GPU, the Triton kernel);
* ``op-reference``: ``torch.ops.mla.<op>`` on CPU with ``TRITON_INTERPRET=0``, whose kernel is
  the plain-PyTorch reference (``reference.decode_verify_op_ref``, ...);
* ``fake``: ``torch.ops.mla.<op>`` under ``FakeTensorMode`` (what torch.compile traces with:
  the fake implementation, or the C++ Meta kernel when ``mla_ops._C`` defined the ops).

``tests/test_csrc_meta.py`` checks that the C++ Meta kernels raise the same errors, message
for message, on meta tensors.
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import mla_ops
from mla_ops import fastpath
from mla_ops.reference import decode_verify_ref

from builders import FP8, decode_case, encoder_case, interpret

PATHS = ["function", "op", "op-reference", "fake"]
NAN, INF = float("nan"), float("inf")


def strided(t: torch.Tensor) -> torch.Tensor:
    """The values of ``t`` in a view whose last dimension has stride 2 (not contiguous)."""
    return torch.stack([t, t], -1).flatten(-2)[..., ::2]


@pytest.fixture(params=["python", "C++"])
def cpp_route(request, monkeypatch):
    """The public function on the Python path, and on the route where it hands its arguments
    to the op as they are (the C++ replays; on CPU tensors too, as the tests' dry run does):
    a wrongly typed argument must leave that route for the checks that name it."""
    if request.param == "C++":
        monkeypatch.setattr(fastpath, "_cpp_route", [True, True])
    return request.param


def _call(path, function, op, args, device):
    """Call ``args`` on ``path``; returns the ``o`` the call was given (None for fake)."""
    if path == "function":
        function(**args)
    elif path == "op":
        op(**args)
    elif path == "op-reference":
        with interpret(False):
            op(**args)
    else:
        with FakeTensorMode() as mode:
            fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                    for k, v in args.items()}
            op(**fake)


def _expect_refusal(path, function, op, args, device, exc, arg):
    out = args.get("o")
    before = out.clone() if isinstance(out, torch.Tensor) else None
    with pytest.raises(exc, match=rf"^{arg}: "):
        _call(path, function, op, args, device)
    if before is not None and path != "fake":  # nothing ran: o is bit for bit as it was
        same = out.contiguous().view(torch.uint8), before.contiguous().view(torch.uint8)
        assert torch.equal(*same), "o was written"


def _device_for(path, device):
    return "cpu" if path == "op-reference" else device


# --- decode_verify ----------------------------------------------------------------------------


def _dv(device, num_kv_splits=2, **kw):
    spec = dict(batch=2, heads=4, qlen=2, lens=(5, 40), real=(5, 33), page=16, Lv=64, rope=32,
                dtype=torch.float16)
    return decode_case(device, **{**spec, **kw}).op_args(num_kv_splits)


def _edit(**changes):
    """A bad case: the valid arguments with ``changes`` (values, or functions of the args)."""
    def make(device):
        args = _dv(device)
        for name, value in changes.items():
            args[name] = value(args) if callable(value) else value
        return args
    return make


def _head_dims(Lv, rope):
    """A consistent call (q, cache, o, workspace) whose head dims break the rule."""
    return lambda device: _dv(device, Lv=Lv, rope=rope)


# (id, argument named, exception, make(device) -> args, paths it applies to)
DECODE_BAD = [
    ("q-int", "q", TypeError, _edit(q=lambda a: a["q"].to(torch.int32))),
    ("q-rank", "q", ValueError, _edit(q=lambda a: a["q"][0])),
    ("q-head-dim", "q", ValueError, _edit(q=lambda a: a["q"][..., :80])),
    ("q-inner-strided", "q", ValueError, _edit(q=lambda a: strided(a["q"]))),
    ("k_buffer-dtype", "k_buffer", TypeError, _edit(k_buffer=lambda a: a["k_buffer"].float())),
    ("k_buffer-two-heads", "k_buffer", ValueError,
     _edit(k_buffer=lambda a: a["k_buffer"].expand(-1, -1, 2, -1))),
    ("v_buffer-Lv48", "v_buffer", ValueError, _edit(v_buffer=lambda a: a["k_buffer"][..., :48])),
    ("o-shape", "o", ValueError, _edit(o=lambda a: a["o"][:, :, :32])),
    ("o-dtype", "o", TypeError, _edit(o=lambda a: a["o"].float())),
    ("lse-fp16", "lse", TypeError, _edit(lse=lambda a: a["lse"].half())),
    ("req_to_token-int64", "req_to_token", TypeError,
     _edit(req_to_token=lambda a: a["req_to_token"].long())),
    ("seq_lens-int64", "seq_lens", TypeError, _edit(seq_lens=lambda a: a["seq_lens"].long())),
    ("seq_lens-shape", "seq_lens", ValueError, _edit(seq_lens=lambda a: a["seq_lens"][:1])),
    ("real_seq_lens-shape", "real_seq_lens", ValueError,
     _edit(real_seq_lens=lambda a: a["real_seq_lens"][:1])),
    ("qlen-rows", "qlen", ValueError, _edit(qlen=3)),
    ("num_kv_splits-zero", "num_kv_splits", ValueError, _edit(num_kv_splits=0)),
    ("attn_logits-small", "attn_logits", ValueError,
     _edit(attn_logits=lambda a: a["attn_logits"][..., :10])),
    ("attn_logits-missing", "attn_logits", ValueError, _edit(attn_logits=None)),
    ("page_size-mismatch", "page_size", ValueError, _edit(page_size=32)),
    ("k_scale-shape", "k_scale", ValueError,
     _edit(k_scale=lambda a: torch.ones(2, device=a["q"].device))),
    ("k_scale-fp16", "k_scale", TypeError,
     _edit(k_scale=lambda a: torch.ones((), dtype=torch.float16, device=a["q"].device))),
    # index tensors: the last dimension contiguous (same values, stride 2)
    ("req_to_token-strided", "req_to_token", ValueError,
     _edit(req_to_token=lambda a: strided(a["req_to_token"]))),
    ("seq_lens-strided", "seq_lens", ValueError, _edit(seq_lens=lambda a: strided(a["seq_lens"]))),
    ("real_seq_lens-strided", "real_seq_lens", ValueError,
     _edit(real_seq_lens=lambda a: strided(a["real_seq_lens"]))),
    # sm_scale: finite and > 0
    *[(f"sm_scale-{v}", "sm_scale", ValueError, _edit(sm_scale=v))
      for v in (NAN, INF, -INF, 0.0, -0.1)],
    # head dims: Lv a power of two in [16, 512], rope 0 or a power of two in [16, 128]
    *[(f"Lv{lv}-rope{rope}", "v_buffer", ValueError, _head_dims(lv, rope))
      for lv, rope in ((1, 32), (3, 32), (8, 32), (8, 0), (64, 1), (64, 3), (64, 8), (1024, 64),
                       (512, 256), (48, 16))],
    # context parallelism: cp_world >= 1, 0 <= cp_rank < cp_world, cp_interleave >= 1
    ("cp_world-0", "cp_world", ValueError, _edit(cp_world=0)),
    ("cp_rank-negative", "cp_rank", ValueError, _edit(cp_rank=-1)),
    ("cp_rank-1-of-1", "cp_rank", ValueError, _edit(cp_rank=1)),
    ("cp_rank-2-of-2", "cp_rank", ValueError, _edit(cp_world=2, cp_rank=2)),
    ("cp_interleave-0", "cp_interleave", ValueError, _edit(cp_interleave=0)),
]
# Types the schema itself refuses on the ops' paths (the dispatcher's message): function only.
DECODE_BAD_TYPES = [
    ("cp_world-float", "cp_world", TypeError, _edit(cp_world=2.0)),
    ("qlen-bool", "qlen", TypeError, _edit(qlen=True)),
    ("sm_scale-str", "sm_scale", TypeError, _edit(sm_scale="0.1")),
    ("k_scale-float", "k_scale", TypeError, _edit(k_scale=1.0)),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("arg,exc,make", [c[1:] for c in DECODE_BAD], ids=[c[0] for c in DECODE_BAD])
def test_decode_verify_bad_argument(device, path, arg, exc, make):
    args = make(_device_for(path, device))
    _expect_refusal(path, mla_ops.decode_attention_fwd_verify, torch.ops.mla.decode_verify, args,
                    device, exc, arg)


@pytest.mark.parametrize("arg,exc,make", [c[1:] for c in DECODE_BAD_TYPES],
                         ids=[c[0] for c in DECODE_BAD_TYPES])
def test_decode_verify_bad_argument_type(device, cpp_route, arg, exc, make):
    _expect_refusal("function", mla_ops.decode_attention_fwd_verify, None, make(device), device,
                    exc, arg)


def test_decode_verify_mixed_devices(device):
    args = _edit(seq_lens=lambda a: a["seq_lens"].to("meta"))(device)
    _expect_refusal("function", mla_ops.decode_attention_fwd_verify, None, args, device,
                    ValueError, "seq_lens")


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["function", "op"])
def test_decode_verify_mixed_devices_gpu(path):
    args = _edit(seq_lens=lambda a: a["seq_lens"].cpu())("cuda")
    _expect_refusal(path, mla_ops.decode_attention_fwd_verify, torch.ops.mla.decode_verify, args,
                    "cuda", ValueError, "seq_lens")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("Lv,rope", [(16, 0), (16, 16), (512, 128)], ids=["16+0", "16+16", "512+128"])
def test_decode_verify_edge_head_dims_accepted(device, path, Lv, rope):
    """The ends of the allowed ranges run (the rule refuses exactly what lies outside)."""
    args = _dv(_device_for(path, device), Lv=Lv, rope=rope, lens=(5, 20), real=(5, 17),
               dtype=torch.float32 if path != "fake" else torch.float16)
    _call(path, mla_ops.decode_attention_fwd_verify, torch.ops.mla.decode_verify, args, device)
    if path != "fake":
        assert not args["o"].isnan().any()


@pytest.mark.parametrize("path", PATHS)
def test_decode_verify_sm_scale_int_accepted(device, path):
    args = _dv(_device_for(path, device))
    args["sm_scale"] = 1
    _call(path, mla_ops.decode_attention_fwd_verify, torch.ops.mla.decode_verify, args, device)


# --- warmup_decode_verify ---------------------------------------------------------------------


def _wu(device, **kw):
    spec = dict(batch=2, heads=4, qlen=2, lens=(5, 40), page=16, Lv=64, rope=32,
                dtype=torch.float16)
    return decode_case(device, **{**spec, **kw}).warmup_args(qlens=(1, 2))


def _wu_edit(**changes):
    def make(device):
        args = _wu(device)
        for name, value in changes.items():
            args[name] = value(args) if callable(value) else value
        return args
    return make


WARMUP_BAD = [
    ("q-rank", "q", ValueError, _wu_edit(q=lambda a: a["q"][0])),
    ("o-Lv8", "o", ValueError, lambda device: _wu(device, Lv=8)),
    ("o-Lv1024", "o", ValueError, lambda device: _wu(device, Lv=1024, rope=64)),
    ("o-rope8", "o", ValueError, lambda device: _wu(device, Lv=64, rope=8)),
    ("lse-heads", "lse", ValueError, _wu_edit(lse=lambda a: a["lse"][:, :3])),
    ("req_to_token-strided", "req_to_token", ValueError,
     _wu_edit(req_to_token=lambda a: strided(a["req_to_token"]))),
    ("qlens-empty", "qlens", ValueError, _wu_edit(qlens=[])),
    ("qlens-zero", "qlens", ValueError, _wu_edit(qlens=[1, 0])),
    *[(f"sm_scale-{v}", "sm_scale", ValueError, _wu_edit(sm_scale=v)) for v in (NAN, INF, 0.0)],
    ("cp_world-0", "cp_world", ValueError, _wu_edit(cp_world=0)),
    ("cp_rank-3-of-2", "cp_rank", ValueError, _wu_edit(cp_world=2, cp_rank=3)),
    ("cp_interleave-0", "cp_interleave", ValueError, _wu_edit(cp_interleave=0)),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("arg,exc,make", [c[1:] for c in WARMUP_BAD], ids=[c[0] for c in WARMUP_BAD])
def test_warmup_bad_argument(device, path, arg, exc, make):
    args = make(_device_for(path, device))
    _expect_refusal(path, mla_ops.warmup_decode_attention_fwd_verify,
                    torch.ops.mla.warmup_decode_verify, args, device, exc, arg)


# --- context_attention ------------------------------------------------------------------------


def _ca(device, **kw):
    spec = dict(lens=(5, 9), hq=4, hkv=2, d=72, dtype=torch.float16)
    return encoder_case(device, **{**spec, **kw}).op_args()


def _ca_edit(**changes):
    def make(device):
        args = _ca(device)
        for name, value in changes.items():
            args[name] = value(args) if callable(value) else value
        return args
    return make


def _ca_sinks(sinks):
    def make(device):
        return _ca(device, sinks=sinks(device))
    return make


ENCODER_BAD = [
    ("q-int", "q", TypeError, _ca_edit(q=lambda a: a["q"].int())),
    ("q-rank", "q", ValueError, _ca_edit(q=lambda a: a["q"][0])),
    ("k-dtype", "k", TypeError, _ca_edit(k=lambda a: a["k"].float())),
    ("v-dtype", "v", TypeError, _ca_edit(v=lambda a: a["v"].float())),
    ("k-head-dim", "k", ValueError, _ca_edit(k=lambda a: a["k"][..., :64],
                                             v=lambda a: a["v"][..., :64])),
    ("v-shape", "v", ValueError, _ca_edit(v=lambda a: a["v"][..., :64])),
    ("k-tokens", "k", ValueError, _ca_edit(k=lambda a: a["k"][:10], v=lambda a: a["v"][:10])),
    ("hq-not-multiple", "k", ValueError,
     _ca_edit(k=lambda a: torch.randn(14, 3, 72, device=a["q"].device).half(),
              v=lambda a: torch.randn(14, 3, 72, device=a["q"].device).half())),
    ("o-shape", "o", ValueError, _ca_edit(o=lambda a: a["o"][:, :2])),
    ("o-inner-strided", "o", ValueError, _ca_edit(o=lambda a: strided(a["o"]))),
    ("b_start_loc-float", "b_start_loc", TypeError,
     _ca_edit(b_start_loc=lambda a: a["b_start_loc"].float())),
    ("b_seq_len-count", "b_seq_len", ValueError, _ca_edit(b_seq_len=lambda a: a["b_seq_len"][:1])),
    ("max_input_len-negative", "max_input_len", ValueError, _ca_edit(max_input_len=-1)),
    ("sliding_window_q-negative", "sliding_window_q", ValueError, _ca_edit(sliding_window_q=-1)),
    ("sliding_window_k-negative", "sliding_window_k", ValueError, _ca_edit(sliding_window_k=-3)),
    ("sinks-shape", "sinks", ValueError, _ca_sinks(lambda d: torch.zeros(3, device=d))),
    ("sinks-int", "sinks", TypeError, _ca_sinks(lambda d: torch.zeros(4, dtype=torch.int32,
                                                                        device=d))),
    # index tensors (and sinks): the last dimension contiguous
    ("b_start_loc-strided", "b_start_loc", ValueError,
     _ca_edit(b_start_loc=lambda a: strided(a["b_start_loc"]))),
    ("b_seq_len-strided", "b_seq_len", ValueError,
     _ca_edit(b_seq_len=lambda a: strided(a["b_seq_len"]))),
    ("sinks-strided", "sinks", ValueError, _ca_sinks(lambda d: strided(torch.randn(4, device=d)))),
    # softmax_scale: None, or finite and > 0
    *[(f"softmax_scale-{v}", "softmax_scale", ValueError, _ca_edit(softmax_scale=v))
      for v in (NAN, INF, -INF, 0.0, -0.5)],
    # head dim in [16, 256]
    *[(f"D{d}", "q", ValueError, (lambda d: lambda device: _ca(device, d=d))(d))
      for d in (1, 3, 8, 15, 257, 512)],
]
ENCODER_BAD_TYPES = [
    ("is_causal-int", "is_causal", TypeError, _ca_edit(is_causal=1)),
    ("max_input_len-float", "max_input_len", TypeError, _ca_edit(max_input_len=9.0)),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("arg,exc,make", [c[1:] for c in ENCODER_BAD], ids=[c[0] for c in ENCODER_BAD])
def test_context_attention_bad_argument(device, path, arg, exc, make):
    args = make(_device_for(path, device))
    _expect_refusal(path, mla_ops.context_attention_fwd, torch.ops.mla.context_attention, args,
                    device, exc, arg)


@pytest.mark.parametrize("arg,exc,make", [c[1:] for c in ENCODER_BAD_TYPES],
                         ids=[c[0] for c in ENCODER_BAD_TYPES])
def test_context_attention_bad_argument_type(device, cpp_route, arg, exc, make):
    _expect_refusal("function", mla_ops.context_attention_fwd, None, make(device), device, exc,
                    arg)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("d", [16, 256], ids=["D16", "D256"])
def test_context_attention_edge_head_dims_accepted(device, path, d):
    args = _ca(_device_for(path, device), d=d)
    _call(path, mla_ops.context_attention_fwd, torch.ops.mla.context_attention, args, device)
    if path != "fake":
        assert not args["o"].isnan().any()


# --- k_scale on a 16-bit cache ----------------------------------------------------------------


def test_k_scale_is_ignored_for_a_16_bit_cache(device):
    """A k_scale passed with a 16-bit cache changes nothing, on each path: the CPU reference,
    the Triton kernel (the function; the op on the device) and the op's reference kernel all
    give their k_scale-free answer. (On an fp8 cache the same k_scale does matter.)"""
    case = decode_case(device, batch=2, heads=4, qlen=2, lens=(45, 70), page=16,
                       dtype=torch.float16, k_scale=2.5)
    plain = dataclasses.replace(case, k_scale=None)
    assert float(case.k_scale) == 2.5
    # The reference.
    for got, want in zip(case.reference(), plain.reference()):
        assert torch.equal(got, want)
    # The Triton kernel, through the function and through the op.
    o, lse = plain.run(2)
    plain.assert_matches(o, lse)
    for fn in (None, torch.ops.mla.decode_verify):
        o_k, lse_k = case.run(2, fn=fn)
        assert torch.equal(o_k, o) and torch.equal(lse_k, lse)
    # The op's CPU kernel with the reference.
    cpu = dataclasses.replace(case, **{f.name: getattr(case, f.name).cpu()
                                       for f in dataclasses.fields(case)
                                       if isinstance(getattr(case, f.name), torch.Tensor)})
    with interpret(False):
        o_r, lse_r = cpu.run(2, fn=torch.ops.mla.decode_verify)
    cpu_plain = dataclasses.replace(cpu, k_scale=None)
    ref_o, ref_lse = cpu_plain.reference()
    assert torch.equal(o_r, ref_o.to(o_r.dtype)) and torch.equal(lse_r, ref_lse)
    cpu_plain.assert_matches(o_r, lse_r)
    # Sanity: the same scale on an fp8 cache is applied.
    f8 = decode_case(device, batch=1, heads=4, qlen=2, lens=(45,), page=16, dtype=torch.float16,
                     cache_dtype=FP8, k_scale=2.5)
    o8, lse8 = f8.run(1)
    o8_unscaled, _ = dataclasses.replace(f8, k_scale=None).run(1)
    f8.assert_matches(o8, lse8)
    assert not torch.allclose(o8.float(), o8_unscaled.float(), atol=1e-2)
    assert math.isclose(float(f8.k_scale), 2.5)
    ref8, _ = decode_verify_ref(f8.q, f8.k_buffer, f8.Lv, f8.req_to_token, f8.seq_lens, None, 2,
                                f8.sm_scale, f8.page_size, 2.5)
    torch.testing.assert_close(ref8, f8.reference()[0])
