"""context_attention_fwd against the float64 reference, by the tolerance rule of
``tests/builders.py`` (kernel error <= K x the error of PyTorch in the kernel's dtype).

On CPU the Triton interpreter runs the kernel (fp16/fp32 only: the interpreter computes bf16
wrongly) with small tiles forced through ``config=``, so short sequences still walk all three
phases (masked head, unmasked interior, masked tail). On a GPU the real tiles run on bf16/fp16
and lengths up to 4k. Inputs come from ``builders.encoder_case``: random, outputs poisoned with
NaN before every call (tokens outside every sequence must stay NaN). Bad arguments are
``tests/test_argument_rules.py``'s; the launch each architecture picks,
``tests/test_context_attention_configs.py``'s.
"""

from __future__ import annotations

import pytest
import torch

import mla_ops  # noqa: F401  (registers torch.ops.mla)
from mla_ops.platform import interpreter_enabled, mock_platform
from mla_ops.prefill import launch as L

from builders import encoder_case

INTERP = interpreter_enabled()
# Small tiles for the interpreter: several interior blocks already at 70 tokens.
SMALL_TILES = dict(BLOCK_M=32, BLOCK_N=16) if INTERP else {}


def _run(case, **config):
    """The kernel on a fresh poisoned o (small tiles under the interpreter), checked."""
    o = case.run(config={**SMALL_TILES, **config} or None)
    case.assert_matches(o)
    return o


HEAD_DIMS = [64, 72, 80, 88, 96, 112, 128, 256]


# --- interpreter (CPU) and GPU alike --------------------------------------------------------


# Every head dim causal; without the mask, in the interpreter, one dim per kind of lane split
# (head_dim_split: 64 + 0, 64 + 16 with masked tail lanes, 64 + 32, 128 with masked lanes,
# 256): the causal mask does not depend on the split.
HEAD_DIM_CASES = [(d, c) for c in (False, True) for d in HEAD_DIMS
                  if c or not INTERP or d in (64, 72, 96, 112, 256)]


@pytest.mark.parametrize("head_dim,causal", HEAD_DIM_CASES,
                         ids=[f"D{d}-{'causal' if c else 'full'}" for d, c in HEAD_DIM_CASES])
def test_head_dims(device, head_dim, causal):
    lens = [1, 19, 70] if INTERP else [1, 17, 128, 1000, 4096, 333]
    _run(encoder_case(device, lens=lens, hq=2, hkv=1, d=head_dim, causal=causal))


@pytest.mark.parametrize("head_dim", [16, 40], ids=["D16", "D40"])
def test_narrow_head_dims(device, head_dim):
    """The narrowest heads the spec allows: one 16-wide block, and a 32 + 16 split."""
    _run(encoder_case(device, lens=[3, 45], hq=2, hkv=2, d=head_dim, causal=True))


@pytest.mark.parametrize("head_dim", [72, 96], ids=["D72", "D96"])
def test_fp32(device, head_dim):
    if not INTERP:
        pytest.skip("fp32 runs tf32 dots on the GPU; the interpreter covers it exactly")
    _run(encoder_case(device, lens=[5, 40], hq=2, hkv=2, d=head_dim, dtype=torch.float32))


@pytest.mark.parametrize("hq,hkv", [(4, 2), (6, 1), (3, 3)], ids=["Hq4-Hkv2", "Hq6-Hkv1", "Hq3-Hkv3"])
def test_gqa(device, hq, hkv):
    _run(encoder_case(device, lens=[33, 50], hq=hq, hkv=hkv, d=80, causal=False))


WINDOWS = [(7, None), (None, 5), (9, 4), (0, 6), (40, 33)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("wq,wk", WINDOWS, ids=[f"wq{a}-wk{b}" for a, b in WINDOWS])
def test_windows(device, wq, wk, causal):
    lens = [3, 70] if INTERP else [3, 700, 2049]
    scale = 4 if not INTERP else 1
    _run(encoder_case(device, lens=lens, hq=2, hkv=1, d=72, causal=causal,
                      window_q=None if wq is None else wq * scale,
                      window_k=None if wk is None else wk * scale))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sinks(device, causal):
    # Sinks comparable to the logits and one far above them (rows then mostly attend the sink).
    case = encoder_case(device, lens=[1, 26, 64], hq=4, hkv=2, d=72, causal=causal, sinks=True)
    _run(case)
    case.sliding_window_q = 8
    _run(case)


def test_softmax_scale(device):
    _run(encoder_case(device, lens=[30, 41], hq=2, hkv=1, d=80, softmax_scale=0.3))


def test_int64_indices(device):
    _run(encoder_case(device, lens=[30, 41], hq=2, hkv=1, d=80, index_dtype=torch.int64))


def test_rows_outside_sequences_untouched(device):
    """Tokens in the gaps between sequences (and of an empty sequence) stay NaN."""
    case = encoder_case(device, lens=[5, 0, 40, 17], hq=2, hkv=1, d=72, gap=3, causal=False)
    o = _run(case)
    assert o[~case.inside()].isnan().all() and (~case.inside()).sum() == 12


@pytest.mark.parametrize("head_stride,aligned", [(80, True), (75, False)],
                         ids=["stride80-hint", "stride75-nohint"])
def test_padded_head_stride_72(device, head_stride, aligned):
    case = encoder_case(device, lens=[1, 45, 70] if INTERP else [1, 45, 3520], hq=2, hkv=1, d=72,
                        head_stride=head_stride, causal=False)
    args = case.op_args()
    assert L.head_stride_aligned_8(args["q"], args["k"], args["v"], args["o"]) is aligned
    launch = L.build_launch(**args, config={"family": "triton"})  # the portable kernel's hint
    # Where the compiler needs it (CUDA, this triton) unaligned views run on aligned copies.
    assert launch.kwargs["HEAD_STRIDE_ALIGNED_8"] is (aligned or launch.copied)
    _run(case)


def test_o_in_its_own_layout(device):
    """o's token and head strides differ from q's (a view of a wider buffer): each is indexed by
    its own strides (an o addressed with q's would land its rows on the wrong tokens)."""
    case = encoder_case(device, lens=[3, 40, 17], hq=2, hkv=1, d=72, gap=1, causal=True)
    total, hq, d = case.q.shape
    wide = torch.full((total, hq + 1, d + 8), float("nan"), dtype=case.q.dtype, device=device)
    o = wide[:, 1:, :d]  # token stride 3 * 80, head stride 80: q's are 2 * 72 and 72
    mla_ops.context_attention_fwd(**case.op_args(o=o), config=SMALL_TILES or None)
    case.assert_matches(o)
    assert wide[:, 0].isnan().all() and wide[:, 1:, d:].isnan().all()  # nothing else written


def test_unaligned_copy_path(device):
    """Where the workaround applies (sm_90's CUDA backend), an odd-stride view runs on aligned
    copies and o is written back; tokens outside the sequences survive the round trip."""
    case = encoder_case(device, lens=[5, 40, 17], hq=2, hkv=1, d=72, gap=2, head_stride=75)
    with mock_platform("sm_90", interpret=False):
        launch = L.build_launch(**case.op_args(), config={"tma": False})
        assert launch.copied and launch.kwargs["HEAD_STRIDE_ALIGNED_8"]
        assert launch.kwargs["Q"].stride(1) % 8 == 0
        o = _run(case, tma=False)
    assert o[5:7].isnan().all()  # the gap after the first sequence


@pytest.mark.parametrize("head_dim", [64, 128], ids=["D64", "D128"])
def test_split_off_bit_identical_pow2(device, head_dim):
    """A power-of-2 head dim runs the same single-block portable kernel with the split logic on
    or off."""
    case = encoder_case(device, lens=[9, 70], hq=2, hkv=1, d=head_dim)
    args = case.op_args()
    portable = {**SMALL_TILES, "family": "triton"}
    on = L.build_launch(**args, config=portable)
    off = L.build_launch(**args, config={**portable, "split_head_dim": False})
    assert on.config == off.config and on.config["BLOCK_D_TAIL"] == 0
    o_on = case.run(config=portable)
    o_off = case.run(config={**portable, "split_head_dim": False})
    assert torch.equal(o_on, o_off)


def test_split_on_changes_the_launch_for_non_pow2(device):
    """The counterpart: for D72 the split is (64, 16) on and (128, 0) off (so the bit-identity
    above is no accident of a config that ignores split_head_dim)."""
    args = encoder_case(device, lens=[9], hq=2, hkv=1, d=72).op_args()
    on = L.build_launch(**args).config
    off = L.build_launch(**args, config={"split_head_dim": False}).config
    assert (on["BLOCK_D"], on["BLOCK_D_TAIL"]) == (64, 16)
    assert (off["BLOCK_D"], off["BLOCK_D_TAIL"]) == (128, 0)


TMA_CASES = [(72, False, None), (80, True, None), (256, True, 40), (96, False, 33)]


@pytest.mark.parametrize("tma", [False, True], ids=["ptr", "tma"])
@pytest.mark.parametrize("head_dim,causal,window", TMA_CASES,
                         ids=[f"D{d}-{'causal' if c else 'full'}-w{w}" for d, c, w in TMA_CASES])
def test_tma_and_pointer_loads(device, head_dim, causal, window, tma):
    """K/V through tensor descriptors (zero-filled past the sequence and the head dim) or pointers."""
    lens = [1, 45, 70] if INTERP else [1, 45, 3520, 129]
    case = encoder_case(device, lens=lens, hq=4, hkv=2, d=head_dim, causal=causal,
                        dtype=torch.float16 if INTERP else torch.bfloat16, window_q=window)
    assert L.build_launch(**case.op_args(), config={"tma": tma}).kwargs["USE_TMA"] is tma
    _run(case, tma=tma)


@pytest.mark.parametrize("head_dim", [72, 96], ids=["D72", "D96"])
def test_split_off_non_pow2_still_correct(device, head_dim):
    _run(encoder_case(device, lens=[9, 40], hq=2, hkv=1, d=head_dim, causal=False),
         split_head_dim=False)


def test_op_matches_function(device):
    case = encoder_case(device, lens=[3, 40], hq=4, hkv=2, d=80, causal=False)
    o = case.run(config=SMALL_TILES or None)
    o_op = case.run(fn=torch.ops.mla.context_attention)
    case.assert_matches(o_op)
    if SMALL_TILES:  # the op runs the table's tiles: equal up to the rule
        case.assert_matches(o)
    else:
        assert torch.equal(o, o_op)


def test_unknown_config_key_rejected(device):
    case = encoder_case(device, lens=[3], hq=2, hkv=1, d=64)
    args = case.op_args()
    with pytest.raises(ValueError, match=r"^config: unknown config keys \['BLOCK_H'\]"):
        mla_ops.context_attention_fwd(**args, config={"BLOCK_H": 16})
    assert args["o"].isnan().all()


# --- GPU only -----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=[f"D{d}" for d in HEAD_DIMS])
def test_bf16_gpu(device, head_dim, causal):
    _run(encoder_case(device, lens=[1, 4096, 17, 700, 2048, 64], hq=4, hkv=2, d=head_dim,
                      dtype=torch.bfloat16, causal=causal))


@pytest.mark.gpu
@pytest.mark.parametrize("wq,wk", WINDOWS[:3], ids=[f"wq{a}-wk{b}" for a, b in WINDOWS[:3]])
def test_bf16_windows_sinks_gpu(device, wq, wk):
    case = encoder_case(device, lens=[5, 1500, 4000], hq=16, hkv=16, d=80, dtype=torch.bfloat16,
                        window_q=wq and wq * 64, window_k=wk and wk * 64,
                        sinks=torch.randn(16, device=device, dtype=torch.bfloat16))
    _run(case)


@pytest.mark.gpu
def test_compile_fullgraph_gpu(device):
    case = encoder_case(device, lens=[100, 256], hq=16, hkv=16, d=72, dtype=torch.bfloat16,
                        causal=False)

    class Attn(torch.nn.Module):
        def forward(self, q, k, v, b_start, b_len):
            o = torch.empty_like(q)
            torch.ops.mla.context_attention(q, k, v, o, b_start, b_len, 256, False)
            return o * 1

    compiled = torch.compile(Attn(), fullgraph=True)
    case.assert_matches(compiled(case.q, case.k, case.v, case.b_start_loc, case.b_seq_len),
                        outside_untouched=False)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [72, 80, 128], ids=["D72-tma", "D80-tma", "D128"])
def test_cuda_graph_capture_and_replay_gpu(device, head_dim):
    """The op captured in a CUDA graph replays correctly on new data in the same buffers.

    The sm_90 table reads K/V through tensor descriptors whose scratch Triton asks for at launch
    (from PyTorch's allocator), so capture must survive that too.
    """
    case = encoder_case(device, lens=[300, 77, 1024], hq=16, hkv=16, d=head_dim,
                        dtype=torch.bfloat16, causal=False)
    args = case.op_args()
    torch.ops.mla.context_attention(**args)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.mla.context_attention(**args)
    for _ in range(2):
        for t in (case.q, case.k, case.v):
            t.copy_(torch.randn_like(t))
        args["o"].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        case.assert_matches(args["o"])


@pytest.mark.gpu
def test_compile_reduce_overhead_gpu(device):
    """torch.compile(mode="reduce-overhead") (CUDA graph trees) around the encoder op."""
    case = encoder_case(device, lens=[200, 129], hq=16, hkv=16, d=80, dtype=torch.bfloat16,
                        causal=False)

    def attend(q, k, v):
        o = torch.empty_like(q)
        torch.ops.mla.context_attention(q, k, v, o, case.b_start_loc, case.b_seq_len,
                                        case.max_input_len, False)
        return o * 1.0

    compiled = torch.compile(attend, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # warm, record, replay
        for t in (case.q, case.k, case.v):
            t.copy_(torch.randn_like(t))
        got = compiled(case.q, case.k, case.v).clone()
        case.assert_matches(got, outside_untouched=False)
