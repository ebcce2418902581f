"""context_attention_fwd against the plain-PyTorch reference.

On CPU the Triton interpreter runs the kernel (fp16/fp32 only: the interpreter computes bf16
wrongly) with small tiles forced, so short sequences still walk all three phases (masked head,
unmasked interior, masked tail). On a GPU the real tiles run on bf16/fp16 and lengths up to 4k.
Outputs are poisoned with NaN before every call; inputs are fresh random data.
"""

from __future__ import annotations

import pytest
import torch

import mla_ops  # noqa: F401  (registers torch.ops.mla)
from mla_ops.platform import interpreter_enabled
from mla_ops.prefill import launch as L
from mla_ops.reference import context_attention_ref

INTERP = interpreter_enabled()
# Small tiles for the interpreter: several interior blocks already at 70 tokens.
SMALL_TILES = dict(BLOCK_M=32, BLOCK_N=16)
TOL = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 2.5e-2}


def _pack(lens, hq, hkv, head_dim, dtype, device, gap=0):
    """Random packed q/k/v, NaN-poisoned o, starts (``gap`` unused tokens after each sequence)."""
    starts, pos = [], 0
    for n in lens:
        starts.append(pos)
        pos += n + gap
    total = pos
    q = torch.randn(total, hq, head_dim, dtype=dtype, device=device)
    k = torch.randn(total, hkv, head_dim, dtype=dtype, device=device)
    v = torch.randn(total, hkv, head_dim, dtype=dtype, device=device)
    o = torch.full_like(q, float("nan"))
    b_start = torch.tensor(starts, dtype=torch.int32, device=device)
    b_len = torch.tensor(lens, dtype=torch.int32, device=device)
    return q, k, v, o, b_start, b_len


def _check(q, k, v, o, b_start, b_len, causal, wq=None, wk=None, sinks=None, scale=None):
    L.context_attention_fwd(q, k, v, o, b_start, b_len, int(b_len.max()), causal, scale, wq, wk, sinks)
    ref = context_attention_ref(q, k, v, b_start, b_len, causal, scale, wq, wk, sinks)
    tol = TOL[q.dtype]
    for s, n in zip(b_start.tolist(), b_len.tolist()):
        got = o[s : s + n].float()
        assert not got.isnan().any(), "a row of a sequence was not written"
        torch.testing.assert_close(got, ref[s : s + n], atol=tol, rtol=tol)


def _maybe_small_tiles():
    return L.launch_overrides(**SMALL_TILES) if INTERP else L.launch_overrides()


HEAD_DIMS = [64, 72, 80, 88, 96, 112, 128, 256]


# --- interpreter (CPU) and GPU alike --------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=[f"D{d}" for d in HEAD_DIMS])
def test_head_dims(device, head_dim, causal):
    dtype = torch.float16
    lens = [1, 19, 70] if INTERP else [1, 17, 128, 1000, 4096, 333]
    with _maybe_small_tiles():
        _check(*_pack(lens, 2, 1, head_dim, dtype, device), causal)


@pytest.mark.parametrize("head_dim", [72, 96], ids=["D72", "D96"])
def test_fp32(device, head_dim):
    if not INTERP:
        pytest.skip("fp32 runs tf32 dots on the GPU; the interpreter covers it exactly")
    with _maybe_small_tiles():
        _check(*_pack([5, 40], 2, 2, head_dim, torch.float32, device), True)


@pytest.mark.parametrize("hq,hkv", [(4, 2), (6, 1), (3, 3)], ids=["Hq4-Hkv2", "Hq6-Hkv1", "Hq3-Hkv3"])
def test_gqa(device, hq, hkv):
    with _maybe_small_tiles():
        _check(*_pack([33, 50], hq, hkv, 80, torch.float16, device), False)


WINDOWS = [(7, None), (None, 5), (9, 4), (0, 6), (40, 33)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("wq,wk", WINDOWS, ids=[f"wq{a}-wk{b}" for a, b in WINDOWS])
def test_windows(device, wq, wk, causal):
    lens = [3, 70] if INTERP else [3, 700, 2049]
    scale = 4 if not INTERP else 1
    with _maybe_small_tiles():
        _check(*_pack(lens, 2, 1, 72, torch.float16, device), causal,
               wq=None if wq is None else wq * scale, wk=None if wk is None else wk * scale)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sinks(device, causal):
    q, k, v, o, b_start, b_len = _pack([1, 26, 64], 4, 2, 72, torch.float16, device)
    # Sinks comparable to the logits and some far above them (rows then mostly attend the sink).
    sinks = torch.randn(4, device=device, dtype=torch.float32) * 2
    sinks[0] = 6.0
    with _maybe_small_tiles():
        _check(q, k, v, o, b_start, b_len, causal, sinks=sinks)
        _check(q, k, v, o.fill_(float("nan")), b_start, b_len, causal, wq=8, sinks=sinks)


def test_softmax_scale(device):
    with _maybe_small_tiles():
        _check(*_pack([30, 41], 2, 1, 80, torch.float16, device), True, scale=0.3)


def test_rows_outside_sequences_untouched(device):
    q, k, v, o, b_start, b_len = _pack([5, 0, 40, 17], 2, 1, 72, torch.float16, device, gap=3)
    with _maybe_small_tiles():
        _check(q, k, v, o, b_start, b_len, False)
    inside = torch.zeros(q.shape[0], dtype=torch.bool)
    for s, n in zip(b_start.tolist(), b_len.tolist()):
        inside[s : s + n] = True
    assert o[~inside.to(o.device)].isnan().all()


def _strided(t, head_stride):
    """A view of ``t`` ``[T, H, D]`` whose head stride is ``head_stride`` >= D (padded)."""
    total, h, d = t.shape
    buf = torch.randn(total, h, head_stride, dtype=t.dtype, device=t.device)
    view = buf[:, :, :d]
    view.copy_(t)
    return view


@pytest.mark.parametrize("head_stride,aligned", [(80, True), (75, False)], ids=["stride80-hint", "stride75-nohint"])
def test_padded_head_stride_72(device, head_stride, aligned):
    q, k, v, o, b_start, b_len = _pack([1, 45, 70] if INTERP else [1, 45, 3520], 2, 1, 72,
                                       torch.float16, device)
    q, k, v, o = (_strided(t, head_stride) for t in (q, k, v, o))
    o.fill_(float("nan"))
    assert L.head_stride_aligned_8(q, k, v, o) is aligned
    with L.capture_launches() as launches:
        L.context_attention_fwd(q, k, v, o, b_start, b_len, 70, False)
    # An arch whose table asks for it runs unaligned views on aligned copies (launch.copied).
    assert launches[0].kwargs["HEAD_STRIDE_ALIGNED_8"] is (aligned or launches[0].copied)
    with _maybe_small_tiles():
        _check(q, k, v, o, b_start, b_len, False)


def test_unaligned_copy_path(device):
    """sm_90's table runs an odd-stride view on aligned copies; rows outside sequences survive."""
    from mla_ops.platform import mock_platform

    q, k, v, o, b_start, b_len = _pack([5, 40, 17], 2, 1, 72, torch.float16, device, gap=2)
    q, k, v, o = (_strided(t, 75) for t in (q, k, v, o))
    o.fill_(float("nan"))
    with mock_platform("sm_90"), _maybe_small_tiles(), L.launch_overrides(tma=False):
        with L.capture_launches() as launches:
            L.context_attention_fwd(q, k, v, o, b_start, b_len, 40, True)
        assert launches[0].copied
        _check(q, k, v, o, b_start, b_len, True)
    assert o[5:7].isnan().all()  # the gap after the first sequence


@pytest.mark.parametrize("head_dim", [64, 128], ids=["D64", "D128"])
def test_split_off_bit_identical_pow2(device, head_dim):
    """A power-of-2 head dim runs the same single-block kernel with the split logic on or off."""
    q, k, v, o, b_start, b_len = _pack([9, 70], 2, 1, head_dim, torch.float16, device)
    o2 = o.clone()
    with _maybe_small_tiles():
        with L.capture_launches() as on:
            L.context_attention_fwd(q, k, v, o, b_start, b_len, 70, True)
        with L.launch_overrides(split_head_dim=False), L.capture_launches() as off:
            L.context_attention_fwd(q, k, v, o, b_start, b_len, 70, True)
        assert on[0].config == off[0].config and on[0].config["BLOCK_D_TAIL"] == 0
        L.context_attention_fwd(q, k, v, o, b_start, b_len, 70, True)
        with L.launch_overrides(split_head_dim=False):
            L.context_attention_fwd(q, k, v, o2, b_start, b_len, 70, True)
    assert torch.equal(o, o2)


TMA_CASES = [(72, False, None), (80, True, None), (256, True, 40), (96, False, 33)]


@pytest.mark.parametrize("tma", [False, True], ids=["ptr", "tma"])
@pytest.mark.parametrize("head_dim,causal,window", TMA_CASES,
                         ids=[f"D{d}-{'causal' if c else 'full'}-w{w}" for d, c, w in TMA_CASES])
def test_tma_and_pointer_loads(device, head_dim, causal, window, tma):
    """K/V through tensor descriptors (zero-filled past the sequence and the head dim) or pointers."""
    lens = [1, 45, 70] if INTERP else [1, 45, 3520, 129]
    with _maybe_small_tiles(), L.launch_overrides(tma=tma):
        _check(*_pack(lens, 4, 2, head_dim, torch.float16 if INTERP else torch.bfloat16, device),
               causal, wq=window)


@pytest.mark.parametrize("head_dim", [72, 96], ids=["D72", "D96"])
def test_split_off_non_pow2_still_correct(device, head_dim):
    with _maybe_small_tiles(), L.launch_overrides(split_head_dim=False):
        _check(*_pack([9, 40], 2, 1, head_dim, torch.float16, device), False)


def test_op_matches_function(device):
    q, k, v, o, b_start, b_len = _pack([3, 40], 4, 2, 80, torch.float16, device)
    o2 = o.clone()
    with _maybe_small_tiles():
        L.context_attention_fwd(q, k, v, o, b_start, b_len, 40, False)
        torch.ops.mla.context_attention(q, k, v, o2, b_start, b_len, 40, False)
    assert torch.equal(o, o2)


# --- bad input --------------------------------------------------------------------------------


def _good(device="cpu"):
    q, k, v, o, b_start, b_len = _pack([4, 6], 4, 2, 72, torch.float16, device)
    return dict(q=q, k=k, v=v, o=o, b_start_loc=b_start, b_seq_len=b_len, max_input_len=6)


BAD = {
    "k-head-dim": (lambda a: a.update(k=a["k"][..., :64], v=a["v"][..., :64]), ValueError, "k"),
    "v-shape": (lambda a: a.update(v=a["v"][..., :64]), ValueError, "v"),
    "hq-not-multiple": (lambda a: a.update(k=torch.randn(10, 3, 72, dtype=torch.float16),
                                           v=torch.randn(10, 3, 72, dtype=torch.float16)),
                        ValueError, "k"),
    "starts-vs-lens": (lambda a: a.update(b_seq_len=a["b_seq_len"][:1]), ValueError, "b_seq_len"),
    "k-dtype": (lambda a: a.update(k=a["k"].float()), TypeError, "k"),
    "q-dtype-int": (lambda a: a.update(q=a["q"].to(torch.int32)), TypeError, "q"),
    "lens-float": (lambda a: a.update(b_seq_len=a["b_seq_len"].float()), TypeError, "b_seq_len"),
    "o-shape": (lambda a: a.update(o=a["o"][:, :2]), ValueError, "o"),
    "neg-window": (lambda a: a.update(sliding_window_q=-1), ValueError, "sliding_window_q"),
    "sinks-shape": (lambda a: a.update(sinks=torch.zeros(3)), ValueError, "sinks"),
    "scale-nonpositive": (lambda a: a.update(softmax_scale=0.0), ValueError, "softmax_scale"),
}


@pytest.mark.parametrize("name", list(BAD), ids=list(BAD))
def test_bad_input(name):
    mutate, exc, arg = BAD[name]
    args = _good()
    mutate(args)
    with L.capture_launches() as launches, pytest.raises(exc, match=rf"^{arg}\b"):
        L.context_attention_fwd(**args)
    assert not launches


# --- GPU only -----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=[f"D{d}" for d in HEAD_DIMS])
def test_bf16_gpu(device, head_dim, causal):
    lens = [1, 4096, 17, 700, 2048, 64]
    _check(*_pack(lens, 4, 2, head_dim, torch.bfloat16, device), causal)


@pytest.mark.gpu
@pytest.mark.parametrize("wq,wk", WINDOWS[:3], ids=[f"wq{a}-wk{b}" for a, b in WINDOWS[:3]])
def test_bf16_windows_sinks_gpu(device, wq, wk):
    q, k, v, o, b_start, b_len = _pack([5, 1500, 4000], 16, 16, 80, torch.bfloat16, device)
    sinks = torch.randn(16, device=device, dtype=torch.bfloat16)
    _check(q, k, v, o, b_start, b_len, True, wq=wq and wq * 64, wk=wk and wk * 64, sinks=sinks)


@pytest.mark.gpu
def test_compile_fullgraph_gpu(device):
    class Attn(torch.nn.Module):
        def forward(self, q, k, v, b_start, b_len):
            o = torch.empty_like(q)
            torch.ops.mla.context_attention(q, k, v, o, b_start, b_len, 256, False)
            return o * 2

    q, k, v, o, b_start, b_len = _pack([100, 256], 16, 16, 72, torch.bfloat16, device)
    compiled = torch.compile(Attn(), fullgraph=True)
    got = compiled(q, k, v, b_start, b_len)
    ref = context_attention_ref(q, k, v, b_start, b_len, False) * 2
    torch.testing.assert_close(got.float(), ref, atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [72, 80, 128], ids=["D72-tma", "D80-tma", "D128"])
def test_cuda_graph_capture_and_replay_gpu(device, head_dim):
    """The op captured in a CUDA graph replays correctly on new data in the same buffers.

    The sm_90 table reads K/V through tensor descriptors whose scratch Triton asks for at launch
    (from PyTorch's allocator), so capture must survive that too.
    """
    lens = [300, 77, 1024]
    q, k, v, o, b_start, b_len = _pack(lens, 16, 16, head_dim, torch.bfloat16, device)
    args = (q, k, v, o, b_start, b_len, max(lens), False, None, None, None, None)
    torch.ops.mla.context_attention(*args)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.mla.context_attention(*args)
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = context_attention_ref(q, k, v, b_start, b_len, False)
        assert not o.isnan().any()
        torch.testing.assert_close(o.float(), ref, rtol=TOL[torch.bfloat16], atol=TOL[torch.bfloat16])


@pytest.mark.gpu
def test_compile_reduce_overhead_gpu(device):
    """torch.compile(mode="reduce-overhead") (CUDA graph trees) around the encoder op."""
    lens = [200, 129]
    q, k, v, _, b_start, b_len = _pack(lens, 16, 16, 80, torch.bfloat16, device)

    def attend(q, k, v):
        o = torch.empty_like(q)
        torch.ops.mla.context_attention(q, k, v, o, b_start, b_len, max(lens), False)
        return o * 1.0

    compiled = torch.compile(attend, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # warm, record, replay
        q2, k2, v2 = (torch.randn_like(t) for t in (q, k, v))
        got = compiled(q2, k2, v2).clone()
        ref = context_attention_ref(q2, k2, v2, b_start, b_len, False)
        torch.testing.assert_close(got.float(), ref, rtol=TOL[torch.bfloat16], atol=TOL[torch.bfloat16])
