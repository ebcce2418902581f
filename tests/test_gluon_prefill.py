"""The Gluon (sm_90) encoder attention: routing (any machine), offline compiles (CPU), correctness
(GPU).

Routing: the sm_90 table picks the ``gluon`` family only where the ``gluon`` fact holds, and
``gluon_unsupported_shape`` names what the portable kernel keeps (windows, fp32, unsupported
splits, other GPUs).

CPU (skipped where triton is not 3.6.x or has no Gluon, and on GPU machines, which run the
kernels instead): every Gluon config of the sm_90 table, at each head-dim split it serves,
causal and not, compiles to an sm_90a cubin with wgmma and TMA; ptxas reports no spills,
registers within the warp-specialize budget, shared memory within 227 KB.

GPU (``@pytest.mark.gpu``; H100/H200 with triton 3.6 only): the Gluon launch (asserted to be
the Gluon family) against the float64 reference by flash-attention's rule
(``builders.encoder_case``: random packed sequences, NaN-poisoned outputs, tokens outside every
sequence untouched), at head dims 64/72/80/96/128/256, causal and not, varlen with gaps, GQA,
sinks, fp16; and a CUDA-graph capture replayed on new inputs.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import mla_ops  # noqa: F401  (registers torch.ops.mla)
from mla_ops import gluon_support, tuning
from mla_ops.prefill import gluon_launch as gla
from mla_ops.prefill import launch as L
from mla_ops.prefill.configs import select_prefill_config
from mla_ops.prefill.kernels import exp2_fma

from builders import encoder_case
from gluon_offline import compile_sm90a, ptxas_facts, run_once, shard_of, tensordesc

_GLUON_WHY = gla.gluon_available()  # why the Gluon kernels may not run here
_BUILD_WHY = gluon_support.gluon_buildable()  # why they may not even compile here
# Spill limits are facts of the compiler the kernels were checked with on the GPU; on another
# triton of the range the variants must build and fit, and their spills are only reported.
_GPU_CHECKED = _GLUON_WHY is None
SMEM_LIMIT = gla.SMEM_LIMIT


def _is_hopper() -> bool:
    return (torch.cuda.is_available() and torch.version.hip is None
            and torch.cuda.get_device_capability() == (9, 0))


# --- routing (any machine) ------------------------------------------------------------------------


def _gluon_rules():
    return [r for r in tuning.table("prefill", "sm_90")["rules"]
            if r["config"].get("family") == "gluon"]


def test_a_family_whose_kernels_do_not_import_says_why():
    module, available = gluon_support.load_kernels("mla_ops.merge")  # it has no gluon_kernels
    assert module is None
    why = available()
    assert why is not None and why.startswith(gluon_support.gluon_available() or
                                              "mla_ops.merge.gluon_kernels does not import")
    # Both families' kernels import wherever the Gluon API is one they are written for.
    from mla_ops.decode_verify import gluon_launch as dgla

    assert (gla._gk is None) == (dgla._gk is None) == (_BUILD_WHY is not None)


@pytest.mark.skipif(_GLUON_WHY is not None, reason=f"no Gluon of triton 3.6 here: {_GLUON_WHY}")
def test_descriptors_share_one_shared_layout_per_box():
    """Building the layout costs as much host time as the rest of a descriptor, and an eager
    encoder call makes six: it is built once per (box, dtype)."""
    from mla_ops import gluon_support

    t = torch.zeros(64, 2, 80, dtype=torch.bfloat16)
    a, b = gla._descriptor(t, 64, 64), gla._descriptor(t[:32], 64, 64)
    assert a.layout is b.layout and a.block_shape == [64, 1, 64] and b.shape == [32, 2, 80]
    assert a.layout == gluon_support.gl.NVMMASharedLayout.get_default_for([64, 1, 64],
                                                                          gluon_support.gl.bfloat16)
    assert gla._descriptor(t, 64, 16).layout is not a.layout  # another box, another layout


def test_gluon_rules_need_the_gluon_fact():
    assert set(tuning.KERNELS["prefill"].defaults) == {"triton", "gluon"}
    rules = _gluon_rules()
    assert rules, "the sm_90 table routes some launches to the Gluon kernel"
    for rule in rules:
        assert rule.get("match", {}).get("gluon") is True, rule
    with _mock_sm90():
        for d in (64, 72, 80, 96, 128, 256):
            split = L.head_dim_split(d)
            for causal in (False, True):
                assert select_prefill_config(d, split, True, causal, gluon=False)["family"] == "triton"
                # D 64: the portable kernel was faster on the H200; every other
                # verified head dim runs the Gluon kernel where it can.
                want = "triton" if d == 64 else "gluon"
                assert select_prefill_config(d, split, True, causal, gluon=True)["family"] == want


@pytest.mark.parametrize("head_dim", [72, 80, 96, 128, 256])
def test_sm90_table_gluon_config_is_supported(head_dim):
    """Every config the table gives a Gluon launch passes the kernel's own config checks (no
    rule hands the kernel a tile it refuses)."""
    split = L.head_dim_split(head_dim)
    with _mock_sm90():
        cfg = select_prefill_config(head_dim, split, True, False, gluon=True)
    assert cfg["family"] == "gluon"
    c = {k: cfg[k] for k in gla.GLUON_DEFAULT_CONFIG}
    assert gla.gluon_shared_bytes(split, c) <= SMEM_LIMIT - 2048
    assert not (split[0] == 256 and c["BLOCK_N"] > 64)


def _mock_sm90():
    from mla_ops.platform import mock_platform

    return mock_platform("sm_90", interpret=False)


UNSUPPORTED = [  # (dtype, head_dim, windowed, device, the reason contains)
    (torch.float32, 72, False, "cuda", "fp16 / bf16"),
    (torch.bfloat16, 40, False, "cuda", "64 + 0/16/32"),
    (torch.bfloat16, 160, False, "cuda", "no tail beside"),
    (torch.bfloat16, 88, False, "cuda", "not yet checked on the GPU"),
    (torch.bfloat16, 72, True, "cuda", "sliding windows"),
    (torch.bfloat16, 72, False, "cpu", "not a CUDA tensor"),
]


@pytest.mark.parametrize("dtype,head_dim,windowed,device,why", UNSUPPORTED,
                         ids=["fp32", "D40", "D160", "D88", "window", "cpu"])
def test_unsupported_reasons(dtype, head_dim, windowed, device, why):
    """What the Gluon kernel does not cover gets a reason (the portable kernel runs it). The GPU
    is a mocked sm_90, so the test runs on any machine."""
    if _GLUON_WHY is not None:
        pytest.skip(f"no Gluon here: {_GLUON_WHY}")
    split = L.head_dim_split(head_dim)
    with _mock_sm90():
        got = gla.gluon_unsupported_shape(torch.device(device), dtype, head_dim, split, windowed)
    assert got is not None and why in got, got


def test_supported_shapes():
    if _GLUON_WHY is not None:
        pytest.skip(f"no Gluon here: {_GLUON_WHY}")
    cuda = torch.device("cuda")
    with _mock_sm90():
        for d in (64, 72, 80, 96, 128, 256):
            for dt in (torch.float16, torch.bfloat16):
                split = L.head_dim_split(d)
                cfg = {"BLOCK_N": 64} if d > 128 else {}
                assert gla.gluon_unsupported_shape(cuda, dt, d, split, False, cfg) is None, d
                # The table's fact (no config yet: its rule brings BLOCK_N) holds for every one.
                assert gla.gluon_unsupported_shape(cuda, dt, d, split, False) is None, d
        split = L.head_dim_split(256)
        why = gla.gluon_unsupported_shape(cuda, torch.bfloat16, 256, split, False,
                                          {"BLOCK_N": 128})
    assert why and "BLOCK_N 64" in why


def test_meta_launches_stay_portable():
    """Without a CUDA device (meta tensors, the config tests' mocked sm_90) the fact is False:
    the portable launch, whatever the table's Gluon rules say."""
    buf = torch.empty(3520, 16, 72, dtype=torch.bfloat16, device="meta")
    idx = torch.zeros(1, dtype=torch.int32, device="meta")
    with _mock_sm90():
        launch = L.build_launch(buf, buf, buf, buf, idx, idx, 3520, False)
    assert launch.family == "triton"


# --- offline compiles (CPU) -----------------------------------------------------------------------

# Head dims per split the Gluon rules may serve, compiled causal and not with the config the
# sm_90 table gives each (splits the table keeps on the portable kernel are skipped).
SPLIT_DIMS = {(64, 0): 64, (64, 16): 72, (64, 32): 96, (128, 0): 128, (256, 0): 256}


def _variants():
    out = []
    for split, d in SPLIT_DIMS.items():
        for causal in (False, True):
            with _mock_sm90():
                cfg = select_prefill_config(d, split, True, causal, gluon=True)
            if cfg["family"] == "gluon":
                out.append((d, causal, {k: cfg[k] for k in gla.GLUON_DEFAULT_CONFIG}))
    return out


VARIANTS = _variants()


def _compile(head_dim: int, causal: bool, cfg: dict, sinks: bool = False, exp2: int = 0):
    from triton.experimental.gluon import language as gl

    from mla_ops.prefill import gluon_kernels as gk

    main, tail = L.head_dim_split(head_dim)
    bn = cfg["BLOCK_N"]
    bf = gl.bfloat16
    sig = {"q_desc": tensordesc([64, 1, main], "bf16", bf),
           "qt_desc": tensordesc([64, 1, tail or main], "bf16", bf),
           "k_desc": tensordesc([bn, 1, main], "bf16", bf),
           "kt_desc": tensordesc([bn, 1, tail or main], "bf16", bf),
           "v_desc": tensordesc([bn, 1, main], "bf16", bf),
           "vt_desc": tensordesc([bn, 1, tail or main], "bf16", bf),
           "O": "*bf16", "Sinks": "*bf16", "B_Start_Loc": "*i32", "B_Seq_Len": "*i32",
           "qk_scale": "fp32", "stride_ot": "i32", "stride_oh": "i32", "kv_group": "i32",
           "total_tokens": "i32", "max_input_len": "i32"}
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_N=bn, NUM_STAGES=cfg["NUM_STAGES"],
                      IS_CAUSAL=causal, HAS_SINKS=sinks, PIPELINE=bool(cfg["PIPELINE"]),
                      PINGPONG=bool(cfg["PINGPONG"] and cfg["PIPELINE"]), P_SMEM=bool(cfg["P_SMEM"]),
                      PRODUCER_REGS=cfg["PRODUCER_REGS"], CONSUMER_REGS=cfg["CONSUMER_REGS"],
                      EXP2=exp2)
    return compile_sm90a(gk.prefill_fwd_ws, sig, constexprs, cfg["num_warps"])


# The exponentials partly on the FMA pipes (EXP2_FMA), compiled at D 72 with the table's config.
EXP2_VARIANTS = (2, 4)


def _compile_all_main() -> None:  # run in a subprocess (see offline_reports)
    import json
    import sys

    d72 = next(v for v in VARIANTS if v[:2] == (72, False))
    jobs = [(*v, 0) for v in VARIANTS] + [(*d72, exp2) for exp2 in EXP2_VARIANTS]
    for d, causal, cfg, exp2 in shard_of(jobs):
        kernel, report = _compile(d, causal, cfg, exp2=exp2)
        facts = {**ptxas_facts(kernel, report), "ex2": kernel.asm["ptx"].count("ex2.approx")}
        sys.stdout.write(json.dumps([[d, causal, exp2], facts]) + "\n")


@pytest.fixture(scope="module")
def offline_reports(tmp_path_factory):
    """All variants compiled once, in a subprocess without TRITON_INTERPRET (CPU CI's check;
    GPU machines run the kernels themselves below)."""
    if torch.cuda.is_available():
        pytest.skip("offline sm_90a compiles are the CPU CI's check; the GPU runs the kernels")
    reports = run_once(tmp_path_factory, "tests.test_gluon_prefill", "_compile_all_main", 900)
    return {tuple(k): r for k, r in reports}


@pytest.mark.skipif(_BUILD_WHY is not None, reason=f"no Gluon API of the kernels here: {_BUILD_WHY}")
@pytest.mark.parametrize("variant", VARIANTS,
                         ids=[f"D{d}-{'causal' if c else 'full'}-BN{cfg['BLOCK_N']}-ns{cfg['NUM_STAGES']}"
                              f"-pipe{cfg['PIPELINE']}-pp{cfg['PINGPONG']}" for d, c, cfg in VARIANTS])
def test_offline_compile_sm90a(variant, offline_reports):
    d, causal, cfg = variant
    r = offline_reports[(d, causal, 0)]
    assert r["wgmma"] and r["tma"], r
    assert not r["serialized"], r
    if _GPU_CHECKED:
        assert r["spills"] == 0, r
    # 12 warps launched (two consumer groups, the producer warp padded to a group): the launch
    # allocation is at most 65536 / 384 registers; setmaxnreg then moves them around.
    assert r["regs"] * 384 <= 65536, r
    assert cfg["CONSUMER_REGS"] in r["setmaxnreg"] and cfg["PRODUCER_REGS"] in r["setmaxnreg"], r
    assert r["shared"] <= SMEM_LIMIT, r


@pytest.mark.skipif(_BUILD_WHY is not None, reason=f"no Gluon API of the kernels here: {_BUILD_WHY}")
@pytest.mark.parametrize("exp2", EXP2_VARIANTS, ids=[f"EXP2_FMA{e}" for e in EXP2_VARIANTS])
def test_offline_exp2_on_the_fma_pipes(exp2, offline_reports):
    """Half (2) or a quarter (4) of each score tile's exponentials leave the MUFU; the tile is
    split and joined inside each thread's registers (the kernel asserts every conversion
    trivial, or it would not compile), nothing goes through shared memory, nothing spills."""
    base, r = offline_reports[(72, False, 0)], offline_reports[(72, False, exp2)]
    assert r["wgmma"] and r["tma"] and not r["serialized"], r
    assert r["spills"] == base["spills"] and r["shared"] == base["shared"], (r, base)
    # 1/EXP2_FMA of the score tiles' ex2.approx left (the row rescale factors' few stay).
    moved = base["ex2"] - r["ex2"]
    assert moved > 0 and abs(moved * exp2 - base["ex2"]) <= 0.1 * base["ex2"], (base, r)


@triton.jit
def _apply_exp2_fma(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, exp2_fma(tl.load(X + offs)))


def test_exp2_fma_against_float64():
    """kernels.exp2_fma, the FMA-pipe exponential of the Gluon kernel's EXP2_FMA, run as a plain
    Triton kernel (the interpreter on a CPU): relative error within 1.1e-4 (13 bits, below a
    16-bit P's rounding) over the range a softmax feeds it, 1 exactly at 0, 0 exactly below
    -127 and at -inf (masked scores)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    special = torch.tensor([0.0, -0.5, -1.0, -125.9, -126.0, -127.0, -300.0, float("-inf")])
    x = torch.cat([-torch.rand(4096 - len(special), generator=g) * 126.0, special]).to(device)
    y = torch.full_like(x, float("nan"))
    _apply_exp2_fma[(1,)](x, y, 4096)
    y, x = y.cpu().double(), x.cpu().double()
    exact = torch.exp2(x)
    normal = x >= -126.0
    rel = ((y - exact).abs() / exact)[normal]
    assert rel.max().item() <= 1.1e-4, rel.max().item()
    assert y[-8].item() == 1.0 and (y[x <= -127.0] == 0.0).all(), y[-8:]


# --- GPU correctness ------------------------------------------------------------------------------

needs_hopper = pytest.mark.skipif(not _is_hopper() or _GLUON_WHY is not None,
                                  reason=f"the Gluon kernel runs on sm_90 with a GPU-checked triton only ({_GLUON_WHY})")

SCHEDULES = {"table": {}, "simple": {"PIPELINE": 0, "PINGPONG": 0},
             "pipe": {"PIPELINE": 1, "PINGPONG": 0}, "pingpong": {"PIPELINE": 1, "PINGPONG": 1},
             "exp2-fma-half": {"EXP2_FMA": 2}, "exp2-fma-quarter": {"EXP2_FMA": 4}}


def _gluon_config(head_dim, schedule):
    cfg = {"family": "gluon", **SCHEDULES[schedule]}
    if head_dim > 128:
        cfg["BLOCK_N"] = 64
    return cfg


def _run_gluon(case, schedule="table"):
    args = case.op_args()
    launch = L.build_launch(**args, config=_gluon_config(case.q.shape[-1], schedule))
    assert launch.family == "gluon", launch.config
    L.run_launch(launch)
    return args["o"]


HEAD_DIMS = [64, 72, 80, 96, 128, 256]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=[f"D{d}" for d in HEAD_DIMS])
def test_gluon_head_dims(head_dim, causal, schedule):
    case = encoder_case("cuda", lens=[1, 17, 128, 1000, 333, 2100], hq=4, hkv=2, d=head_dim,
                        causal=causal, gap=3, dtype=torch.bfloat16)
    case.assert_matches(_run_gluon(case, schedule))


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gluon_sinks_gqa_fp16(causal):
    case = encoder_case("cuda", lens=[1, 26, 64, 300], hq=6, hkv=2, d=72, causal=causal,
                        sinks=True, dtype=torch.bfloat16)
    case.assert_matches(_run_gluon(case))
    case = encoder_case("cuda", lens=[5, 0, 40, 17, 700], hq=6, hkv=1, d=80, causal=causal,
                        gap=3, dtype=torch.float16)
    case.assert_matches(_run_gluon(case))


@pytest.mark.gpu
@needs_hopper
def test_gluon_is_the_table_choice_and_windows_stay_portable():
    case = encoder_case("cuda", lens=[70, 300], hq=2, hkv=1, d=72, causal=False,
                        dtype=torch.bfloat16)
    assert L.build_launch(**case.op_args()).family == "gluon"
    case.sliding_window_q = 16
    assert L.build_launch(**case.op_args()).family == "triton"
    case.assert_matches(case.run())
    with pytest.raises(ValueError, match="gluon family cannot run"):
        L.build_launch(**case.op_args(), config={"family": "gluon"})


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("head_dim", [72, 128], ids=["D72", "D128"])
def test_gluon_cuda_graph_replay_new_inputs(head_dim):
    """Captured once (nothing allocated in the launch path), replayed on new q/k/v and lengths
    copied into the captured tensors: the reference's answers each time."""
    case = encoder_case("cuda", lens=[900, 300, 40], hq=4, hkv=2, d=head_dim, causal=True,
                        dtype=torch.bfloat16)
    args = case.op_args()
    cfg = _gluon_config(head_dim, "table")
    mla_ops.context_attention_fwd(**args, config=cfg)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mla_ops.context_attention_fwd(**args, config=cfg)
    for seed, lens in [(1, [900, 300, 40]), (2, [40, 800, 400])]:
        torch.manual_seed(seed)
        new = encoder_case("cuda", lens=lens, hq=4, hkv=2, d=head_dim, causal=True,
                           dtype=torch.bfloat16)
        for name in ("q", "k", "v", "b_start_loc", "b_seq_len"):
            getattr(case, name).copy_(getattr(new, name))
        args["o"].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        case.assert_matches(args["o"])
