"""decode_attention_fwd_verify against the plain-PyTorch reference.

Without a GPU the kernels run in Triton's interpreter on small shapes (fp32, fp16, fp8 -> fp16:
the interpreter computes bf16 wrongly); ``@pytest.mark.gpu`` tests cover bf16/fp16/fp8 at
serving shapes, split caps 1..16, warmup + capture with no compilation, and torch.compile.
Outputs are poisoned with NaN before each call; inputs are random, never zeros.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import mla_ops  # noqa: F401  (registers torch.ops.mla)
from mla_ops import platform
from mla_ops.decode_verify import kernels
from mla_ops.decode_verify.launch import (
    _tma_descriptors,
    select_verify_config,
    _unit_scale,
    decode_attention_fwd_verify,
    warmup_decode_attention_fwd_verify,
)
from mla_ops.reference import decode_verify_ref

SM_SCALE = 0.1352
# Small splits so that short interpreter sequences still cut into several splits.
SMALL_SPLITS = {"BLOCK_N": 16, "SPLIT_ALIGN": 16, "MIN_SPLIT_LEN": 16}
FP8 = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn
# The swap-AB variant (rows = the MMA's N) at the tile shapes Hopper would run it with; laid
# over a case's own config, so small-split cases keep their small splits (and then have KV
# blocks straddling split ends: masked tails).
SWAP = {
    "swap-h32": {"SWAP_AB": 1, "BLOCK_N": 64, "BLOCK_H": 32, "num_warps": 4},
    "swap-h16": {"SWAP_AB": 1, "BLOCK_N": 64, "BLOCK_H": 16, "num_warps": 4},
    "swap-h64": {"SWAP_AB": 1, "BLOCK_N": 64, "BLOCK_H": 64, "num_warps": 4},
    # fp8 under SWAP_AB reads V^T separately, per half with QSPLIT.
    "swap-h32-qsplit": {"SWAP_AB": 1, "BLOCK_N": 64, "BLOCK_H": 32, "num_warps": 4, "QSPLIT": 1},
}


@dataclasses.dataclass
class Case:
    """A verify batch: tensors as an engine passes them."""

    q: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    req_to_token: torch.Tensor
    seq_lens: torch.Tensor
    real_seq_lens: torch.Tensor | None
    qlen: int
    page_size: int
    k_scale: torch.Tensor | None

    @property
    def Lv(self) -> int:
        return self.v_buffer.shape[-1]

    def outputs(self, num_kv_splits: int):
        rows, heads = self.q.shape[:2]
        o = torch.full((rows, heads, self.Lv), float("nan"), dtype=self.q.dtype, device=self.q.device)
        lse = torch.full((rows, heads), float("nan"), dtype=torch.float32, device=self.q.device)
        logits = None
        if num_kv_splits > 1:
            logits = torch.full((rows, heads, num_kv_splits, self.Lv + 1), float("nan"),
                                dtype=torch.float32, device=self.q.device)
        return o, lse, logits

    def args(self, o, lse, logits, num_kv_splits):
        return (self.q, self.k_buffer, self.v_buffer, o, lse, self.req_to_token, self.seq_lens,
                self.real_seq_lens, self.qlen, logits, num_kv_splits, SM_SCALE, self.page_size,
                self.k_scale)

    def run(self, num_kv_splits: int, config=None):
        o, lse, logits = self.outputs(num_kv_splits)
        decode_attention_fwd_verify(*self.args(o, lse, logits, num_kv_splits), config=config)
        return o, lse

    def reference(self):
        return decode_verify_ref(self.q, self.k_buffer, self.Lv, self.req_to_token, self.seq_lens,
                                 self.real_seq_lens, self.qlen, SM_SCALE, self.page_size,
                                 self.k_scale)


def make_case(device, *, batch, heads, qlen, lens, page, Lv=64, rope=32, real=None,
              dtype=torch.float32, cache_dtype=None, layout="4d", q_strided=False,
              spare_pages=3, poison_past_end=False) -> Case:
    """Random q and cache; pages of each request scattered over the cache in random order.

    poison_past_end: every cache slot at or past its request's length (the rest of the last
    page, the unused pages of the table, the spare pages) holds NaN, as a reused page can.
    """
    cache_dtype = cache_dtype or dtype
    Lk = Lv + rope
    pages_per_req = max(1, math.ceil(max(lens) / page))
    num_pages = batch * pages_per_req + spare_pages
    layers = 3 if layout == "cross" else 1
    raw = torch.randn(num_pages, page, layers, Lk, device=device)
    table = torch.randperm(num_pages, device=device)[: batch * pages_per_req]
    if poison_past_end:
        live = torch.zeros(num_pages, page, dtype=torch.bool, device=device)
        for b, length in enumerate(lens):
            for j, pg in enumerate(table[b * pages_per_req:(b + 1) * pages_per_req].tolist()):
                live[pg, : max(0, min(page, length - j * page))] = True
        raw[~live] = float("nan")
    if cache_dtype == FP8:
        k_scale = torch.tensor(0.37, device=device)
        raw = (raw / 0.37).clamp(-200, 200).to(FP8)
    else:
        k_scale = None
        raw = raw.to(cache_dtype)
    if layout == "cross":  # layer 1 of a [pages, page, layers, Lk] cross-layer cache
        k_buffer = raw[:, :, 1:2, :]
    elif layout == "3d":
        k_buffer = raw.reshape(num_pages * page, 1, Lk)
    else:
        k_buffer = raw
    req_to_token = table.view(batch, pages_per_req).to(torch.int32)
    q = torch.randn(batch * qlen, heads, Lk + (32 if q_strided else 0), device=device).to(dtype)
    q = q[..., :Lk]
    if q_strided:
        assert not q.is_contiguous()
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    real_seq_lens = None if real is None else torch.tensor(real, dtype=torch.int32, device=device)
    return Case(q, k_buffer, k_buffer[..., :Lv], req_to_token, seq_lens, real_seq_lens, qlen, page,
                k_scale)


def tolerances(dtype, cache_dtype):
    if dtype == torch.float32:
        return dict(atol=2e-5, rtol=2e-5), dict(atol=2e-5, rtol=2e-5)
    if dtype == torch.float16:
        return dict(atol=5e-3, rtol=1e-2), dict(atol=2e-3, rtol=1e-3)
    return dict(atol=2e-2, rtol=2e-2), dict(atol=1e-2, rtol=1e-3)  # bf16


def assert_matches(case: Case, o, lse, cache_dtype=None):
    ref_o, ref_lse = case.reference()
    assert not torch.isnan(o).any() and not torch.isnan(lse).any(), "NaN in the output"
    o_tol, lse_tol = tolerances(case.q.dtype, cache_dtype)
    torch.testing.assert_close(lse, ref_lse, **lse_tol)
    torch.testing.assert_close(o.float(), ref_o, **o_tol)
    # Rows without a key: exactly o = 0 and lse = -inf.
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), empty)
    assert (o[empty] == 0).all()


# --- interpreter (CI) and GPU: small shapes -------------------------------------------------

# (id, make_case kwargs, num_kv_splits, config override)
SMALL_CASES = [
    ("B3-H4-q2-p16-fp32", dict(batch=3, heads=4, qlen=2, lens=(1, 37, 100), page=16), 1, None),
    ("B3-H4-q3-p1-fp16-3d-real", dict(batch=3, heads=4, qlen=3, lens=(2, 50, 129), real=(0, 50, 64),
                                      page=1, dtype=torch.float16, layout="3d"), 4, SMALL_SPLITS),
    ("B2-H5-q4-p64-fp16", dict(batch=2, heads=5, qlen=4, lens=(3, 200), page=64,
                               dtype=torch.float16), 3, SMALL_SPLITS),
    ("B2-H4-q2-p16-fp8", dict(batch=2, heads=4, qlen=2, lens=(45, 170), page=16,
                              dtype=torch.float16, cache_dtype=FP8), 2, SMALL_SPLITS),
    ("B2-H2-q2-p16-fp16-576", dict(batch=2, heads=2, qlen=2, lens=(70, 130), page=16, Lv=512,
                                   rope=64, dtype=torch.float16), 2, SMALL_SPLITS),
    ("B2-H3-q2-p64-fp32-128+64-cross-qstrided", dict(batch=2, heads=3, qlen=2, lens=(64, 90), page=64,
                                                     Lv=128, rope=64, layout="cross", q_strided=True),
     2, SMALL_SPLITS),
    ("B2-H4-q4-p16-fp32-below-qlen", dict(batch=2, heads=4, qlen=4, lens=(1, 3), page=16), 2, None),
    ("B2-H4-q2-p16-fp32-real0", dict(batch=2, heads=4, qlen=2, lens=(40, 40), real=(0, 17), page=16),
     3, SMALL_SPLITS),
]


@pytest.mark.parametrize("variant", ["plain", *SWAP])
@pytest.mark.parametrize("kw,splits,config", [c[1:] for c in SMALL_CASES],
                         ids=[c[0] for c in SMALL_CASES])
def test_matches_reference(device, kw, splits, config, variant):
    case = make_case(device, **kw)
    if variant != "plain":
        config = {**(config or {}), **SWAP[variant]}
    o, lse = case.run(splits, config)
    assert_matches(case, o, lse, kw.get("cache_dtype"))


@pytest.mark.parametrize("config", [None, SMALL_SPLITS, {**SMALL_SPLITS, "QSPLIT": 1, "BLOCK_H": 16},
                                    {**SMALL_SPLITS, **SWAP["swap-h32"]},
                                    {**SMALL_SPLITS, **SWAP["swap-h16"], "BLOCK_N": 32, "QSPLIT": 1}],
                         ids=["table", "small-splits", "qsplit-h16", "swap-h32", "swap-qsplit-h16"])
def test_split_caps_agree(device, config):
    """Every split cap gives the reference's answer (and each other's)."""
    case = make_case(device, batch=2, heads=4, qlen=3, lens=(23, 150), page=16,
                     dtype=torch.float32)
    o1, lse1 = case.run(1, config)
    assert_matches(case, o1, lse1)
    for splits in (2, 3, 5, 8):
        o, lse = case.run(splits, config)
        torch.testing.assert_close(lse, lse1, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(o, o1, atol=1e-5, rtol=1e-5)


# Launch features laid over a case's own config: K tiles by bulk tensor copies (TMA), the
# persistent grid (the SM count mocked to 1 so that each program loops over several work items),
# and stage 2 split by columns of o.
FEATURES = {
    "tma-qsplit": {"TMA": 1, "QSPLIT": 1},
    "tma": {"TMA": 1},
    "tma-swap": {**SWAP["swap-h32"], "BLOCK_N": 16, "TMA": 1, "QSPLIT": 1},
    "persistent": {"PERSISTENT": 2},
    "persistent-tma-swap": {**SWAP["swap-h16"], "BLOCK_N": 16, "TMA": 1, "PERSISTENT": 1},
    "s2-block-dv": {"S2_BLOCK_DV": 16},
}
FEATURE_CASES = [
    ("B2-H4-q2-p16-fp16", dict(batch=2, heads=4, qlen=2, lens=(45, 170), page=16,
                               dtype=torch.float16)),
    ("B2-H4-q2-p16-fp8", dict(batch=2, heads=4, qlen=2, lens=(45, 170), page=16,
                              dtype=torch.float16, cache_dtype=FP8)),
    ("B3-H3-q3-p64-fp32-128+64-cross-real", dict(batch=3, heads=3, qlen=3, lens=(2, 64, 150),
                                                real=(2, 0, 100), page=64, Lv=128, rope=64,
                                                layout="cross")),
]


@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("kw", [c[1] for c in FEATURE_CASES], ids=[c[0] for c in FEATURE_CASES])
def test_launch_features_match_reference(device, kw, feature):
    """Each launch feature, with several splits and one, on a cache that is NaN past every
    request's end (the bulk copies read whole pages; only the masked tail may touch them)."""
    case = make_case(device, poison_past_end=True, **kw)
    config = {**SMALL_SPLITS, **FEATURES[feature]}
    with platform.mock_platform("sm_90", sm_count=1):
        if config.get("TMA"):
            # The bulk copy applies to 16-bit caches; fp8 ones keep the pointer path (slower
            # through TMA on the H200, see launch._tma_descriptors).
            cfg = {**select_verify_config(2, case.qlen, case.q.shape[1]), **config}
            Lk, Lv = case.k_buffer.shape[-1], case.Lv
            desc = _tma_descriptors(case.k_buffer, case.page_size, Lk, Lv, cfg, platform.current())[0]
            assert (desc is None) == (kw.get("cache_dtype") == FP8), "TMA applied wrongly"
        for splits in (1, 3):
            o, lse = case.run(splits, config)
            assert_matches(case, o, lse, kw.get("cache_dtype"))


@pytest.mark.parametrize("why,kw,config", [
    ("page-not-multiple-of-block", dict(page=1, layout="3d"), {}),
    ("split-align-not-multiple", dict(page=16), {"SPLIT_ALIGN": 8, "BLOCK_N": 16}),
    ("block-straddles-pages", dict(page=16), {"BLOCK_N": 32, "SPLIT_ALIGN": 32}),
    ("token-stride-unaligned", dict(page=16, dtype=torch.float16), {"pad_tokens": 4}),  # 200 B
])
def test_tma_falls_back_where_it_does_not_apply(device, why, kw, config):
    """Where a bulk tensor copy cannot describe the cache, the pointer path runs the same
    config (and stays right)."""
    case = make_case(device, batch=2, heads=2, qlen=2, lens=(20, 40), **kw)
    config = dict(config)
    pad = config.pop("pad_tokens", 0)
    if pad:  # the same cache in a wider buffer: token stride Lk + pad elements
        wide = torch.randn(*case.k_buffer.shape[:-1], case.k_buffer.shape[-1] + pad,
                           device=device).to(case.k_buffer.dtype)
        wide[..., :-pad] = case.k_buffer
        case.k_buffer, case.v_buffer = wide[..., :-pad], wide[..., :case.Lv]
    config = {"BLOCK_N": 16, "SPLIT_ALIGN": 16, "MIN_SPLIT_LEN": 16, "TMA": 1, **config}
    cfg = {**select_verify_config(2, 2, 2), **config}
    Lk, Lv = case.k_buffer.shape[-1], case.Lv
    assert _tma_descriptors(case.k_buffer, case.page_size, Lk, Lv, cfg, platform.current()) == (None, None)
    o, lse = case.run(2, config)
    assert_matches(case, o, lse)


def test_poisoned_cache_pointer_path(device):
    """The pointer path's masked tail never lets NaN past a request's end into the output."""
    case = make_case(device, batch=3, heads=4, qlen=2, lens=(1, 37, 100), page=16,
                     poison_past_end=True)
    for config, splits in ((None, 1), (SMALL_SPLITS, 4), ({**SMALL_SPLITS, **SWAP["swap-h32"]}, 3)):
        o, lse = case.run(splits, config)
        assert_matches(case, o, lse)


def test_op_matches_function_bitwise(device):
    case = make_case(device, batch=2, heads=4, qlen=2, lens=(20, 77), page=16, dtype=torch.float16)
    o_f, lse_f = case.run(2)
    o_op, lse_op, logits = case.outputs(2)
    torch.ops.mla.decode_verify(*case.args(o_op, lse_op, logits, 2))
    assert torch.equal(o_op, o_f) and torch.equal(lse_op, lse_f)


def test_warmup_changes_no_visible_tensor(device):
    case = make_case(device, batch=2, heads=4, qlen=2, lens=(20, 77), page=16, dtype=torch.float16)
    o, lse, logits = case.outputs(3)
    for t in (o, lse, logits):
        t.copy_(torch.randn_like(t, dtype=torch.float32))
    before = [t.clone() for t in (case.q, case.k_buffer, o, lse, logits, case.req_to_token)]
    warmup_decode_attention_fwd_verify(case.q, case.k_buffer, o, lse, case.req_to_token, True,
                                       [1, 2], logits, SM_SCALE, case.page_size)
    torch.ops.mla.warmup_decode_verify(case.q, case.k_buffer, o, lse, case.req_to_token, False,
                                       [2], logits, SM_SCALE, case.page_size)
    after = (case.q, case.k_buffer, o, lse, logits, case.req_to_token)
    for b, a in zip(before, after):
        assert torch.equal(b.view(torch.uint8), a.view(torch.uint8))


def test_default_k_scale_made_once(device):
    assert _unit_scale(torch.device(device)) is _unit_scale(torch.device(device))


# --- bad input: the checks name the argument -----------------------------------------------


def _bad(device, **changes):
    case = make_case(device, batch=2, heads=4, qlen=2, lens=(5, 9), page=16)
    o, lse, logits = case.outputs(2)
    args = dict(zip(
        ["q", "k_buffer", "v_buffer", "o", "lse", "req_to_token", "seq_lens", "real_seq_lens",
         "qlen", "attn_logits", "num_kv_splits", "sm_scale", "page_size", "k_scale"],
        case.args(o, lse, logits, 2),
    ))
    for k, fn in changes.items():
        args[k] = fn(args)
    return args


BAD = [
    ("q-int-dtype", TypeError, "q:", dict(q=lambda a: a["q"].to(torch.int32))),
    ("lse-fp16", TypeError, "lse:", dict(lse=lambda a: a["lse"].half())),
    ("Lk-not-Lv-plus-pow2", ValueError, "v_buffer:",
     dict(v_buffer=lambda a: a["k_buffer"][..., :48])),
    ("page-size-mismatch", ValueError, "page_size:", dict(page_size=lambda a: 32)),
    ("rows-not-multiple-of-qlen", ValueError, "qlen:", dict(qlen=lambda a: 3)),
    ("workspace-too-small", ValueError, "attn_logits:",
     dict(attn_logits=lambda a: a["attn_logits"][:, :, :1], num_kv_splits=lambda a: 2)),
    ("workspace-missing", ValueError, "attn_logits:", dict(attn_logits=lambda a: None)),
    ("seq-lens-int64", TypeError, "seq_lens:", dict(seq_lens=lambda a: a["seq_lens"].long())),
]


@pytest.mark.parametrize("exc,name,changes", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_names_the_argument(device, exc, name, changes):
    args = _bad(device, **changes)
    with pytest.raises(exc, match=name):
        decode_attention_fwd_verify(*args.values())
    with pytest.raises(exc, match=name):
        torch.ops.mla.decode_verify(*args.values())


def test_mixed_devices_rejected(device):
    args = _bad(device, seq_lens=lambda a: a["seq_lens"].to("meta"))
    with pytest.raises(ValueError, match="seq_lens:"):
        decode_attention_fwd_verify(*args.values())


def test_unknown_config_key_rejected(device):
    case = make_case(device, batch=1, heads=4, qlen=2, lens=(5,), page=16)
    with pytest.raises(ValueError, match="config"):
        case.run(1, {"BLOCK_M": 16})


# --- GPU ------------------------------------------------------------------------------------

GPU_DTYPES = {"bf16": (torch.bfloat16, None), "fp16": (torch.float16, None),
              "fp8": (torch.bfloat16, FP8)}

# (id, kwargs, num_kv_splits, dtypes): qlen 1..8, H 16/20/64/128, page 1/16/64/128, lengths 1,
# below qlen, not multiples of page/block/split, up to 32k. Each variant compiles on the device,
# so not every dtype runs on every shape.
GPU_SHAPES = [
    ("B4-H16-q1-p64", dict(batch=4, heads=16, qlen=1, lens=(1, 700, 4097, 63), page=64), 4,
     ("bf16", "fp8")),
    ("B4-H16-q2-p64", dict(batch=4, heads=16, qlen=2, lens=(1, 2, 1000, 8191), page=64), 8,
     ("bf16", "fp16", "fp8")),
    ("B3-H20-q3-p16", dict(batch=3, heads=20, qlen=3, lens=(2, 333, 2049), real=(2, 0, 1500),
                           page=16), 5, ("bf16", "fp16")),
    ("B2-H64-q4-p1", dict(batch=2, heads=64, qlen=4, lens=(3, 1337), page=1), 3, ("bf16",)),
    ("B2-H128-q5-p128", dict(batch=2, heads=128, qlen=5, lens=(4, 3000), page=128), 6,
     ("bf16", "fp8")),
    ("B2-H16-q6-p16", dict(batch=2, heads=16, qlen=6, lens=(5, 515), page=16), 1, ("bf16",)),
    ("B2-H16-q7-p64-3d", dict(batch=2, heads=16, qlen=7, lens=(6, 777), page=64, layout="3d"), 2,
     ("bf16",)),
    ("B2-H16-q8-p64-cross-qstrided", dict(batch=2, heads=16, qlen=8, lens=(9, 1023), page=64,
                                          layout="cross", q_strided=True), 4, ("bf16", "fp16")),
    ("B1-H16-q2-p64-32k", dict(batch=1, heads=16, qlen=2, lens=(32768,), page=64), 16,
     ("bf16", "fp8")),
    ("B2-H128-q2-p64-32k", dict(batch=2, heads=128, qlen=2, lens=(32000, 5), page=64), 8,
     ("bf16",)),
]
GPU_PARAMS = [
    pytest.param(kw, splits, dt, id=f"{name}-{dt}")
    for name, kw, splits, dts in GPU_SHAPES
    for dt in dts
]
# Swap-AB at Hopper tile shapes (4 warps: one warpgroup, wgmma M = BLOCK_N for the scores and
# M = Lv for P @ V); the 64-row tile on 8 warps for H=128.
GPU_SWAP = {
    "swap-h32": {"SWAP_AB": 1, "BLOCK_N": 64, "BLOCK_H": 32, "num_warps": 4, "num_stages": 2},
    "swap-h64": {"SWAP_AB": 1, "BLOCK_N": 64, "BLOCK_H": 64, "num_warps": 8, "num_stages": 2},
    # The fp8 candidates: QSPLIT halves what each converted operand holds in registers.
    "swap-h32-qsplit": {"SWAP_AB": 1, "BLOCK_N": 64, "BLOCK_H": 32, "num_warps": 4, "num_stages": 2,
                        "QSPLIT": 1},
    "swap-h32-n32": {"SWAP_AB": 1, "BLOCK_N": 32, "BLOCK_H": 32, "num_warps": 4, "num_stages": 2},
}


def _gpu_swap_variants(heads, dt):
    if heads >= 64:
        return ("swap-h64",)
    return ("swap-h32", "swap-h32-qsplit", "swap-h32-n32") if dt == "fp8" else ("swap-h32",)


GPU_SWAP_PARAMS = [
    pytest.param(kw, splits, dt, GPU_SWAP[sw], id=f"{name}-{dt}-{sw}")
    for name, kw, splits, dts in GPU_SHAPES
    for dt in dts if dt in ("bf16", "fp8")
    for sw in _gpu_swap_variants(kw["heads"], dt)
]


@pytest.mark.gpu
@pytest.mark.parametrize("kw,splits,dtype_name", GPU_PARAMS)
def test_gpu_matches_reference(device, kw, splits, dtype_name):
    dtype, cache_dtype = GPU_DTYPES[dtype_name]
    case = make_case(device, Lv=512, rope=64, dtype=dtype, cache_dtype=cache_dtype, **kw)
    o, lse = case.run(splits)
    assert_matches(case, o, lse, cache_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("kw,splits,dtype_name,config", GPU_SWAP_PARAMS)
def test_gpu_swap_ab_matches_reference(device, kw, splits, dtype_name, config):
    dtype, cache_dtype = GPU_DTYPES[dtype_name]
    case = make_case(device, Lv=512, rope=64, dtype=dtype, cache_dtype=cache_dtype, **kw)
    o, lse = case.run(splits, config)
    assert_matches(case, o, lse, cache_dtype)


GPU_FEATURES = {
    "tma-swap-h32-qsplit": {**GPU_SWAP["swap-h32-qsplit"], "TMA": 1},
    "tma-h64-qsplit": {"BLOCK_H": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2, "QSPLIT": 1,
                       "TMA": 1},
    # 512-wide blocks: Triton issues them as several hardware boxes.
    "tma-swap-h32": {**GPU_SWAP["swap-h32"], "TMA": 1},
    "tma-h64": {"BLOCK_H": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2, "TMA": 1},
    "persistent-swap-h32": {**GPU_SWAP["swap-h32"], "PERSISTENT": 1},
    "persistent-tma-h64": {"BLOCK_H": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2,
                           "QSPLIT": 1, "TMA": 1, "PERSISTENT": 2},
    "s2-block-dv-128": {"S2_BLOCK_DV": 128, "S2_BLOCK_S": 32},
    "pdl-s2-block-dv-64": {"PDL": 1, "S2_BLOCK_DV": 64},
}
GPU_FEATURE_SHAPES = ("B4-H16-q2-p64", "B2-H128-q5-p128", "B1-H16-q2-p64-32k",
                      "B2-H16-q8-p64-cross-qstrided", "B2-H64-q4-p1")
GPU_FEATURE_PARAMS = [
    pytest.param(kw, splits, dt, GPU_FEATURES[f], id=f"{name}-{dt}-{f}")
    for name, kw, splits, dts in GPU_SHAPES if name in GPU_FEATURE_SHAPES
    for dt in dts if dt in ("bf16", "fp8")
    for f in GPU_FEATURES
]


@pytest.mark.gpu
@pytest.mark.parametrize("kw,splits,dtype_name,config", GPU_FEATURE_PARAMS)
def test_gpu_launch_features_match_reference(device, kw, splits, dtype_name, config):
    """TMA, the persistent grid and the column-split stage 2 at serving shapes, on a cache
    that is NaN past every request's end (page 1 falls back to the pointer path)."""
    dtype, cache_dtype = GPU_DTYPES[dtype_name]
    case = make_case(device, Lv=512, rope=64, dtype=dtype, cache_dtype=cache_dtype,
                     poison_past_end=True, **kw)
    for s in sorted({1, splits}):
        o, lse = case.run(s, config)
        assert_matches(case, o, lse, cache_dtype)


@pytest.mark.gpu
def test_gpu_unpipelined_swap_ab_refused(device):
    """SWAP_AB with num_stages 1 gave wrong answers on the H200 (Triton 3.6): refused by name."""
    case = make_case(device, batch=1, heads=16, qlen=2, lens=(300,), page=64, Lv=512, rope=64,
                     dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="config: SWAP_AB"):
        case.run(2, {**GPU_SWAP["swap-h32"], "num_stages": 1})


@pytest.mark.gpu
@pytest.mark.parametrize("feature", ["tma-swap-h32-qsplit", "persistent-tma-h64", "pdl-s2-block-dv-64"])
def test_gpu_features_capture_and_replay(device, feature):
    """Each launch feature captured in a CUDA graph (host descriptors baked in, the persistent
    grid, the programmatic edge of PDL) replays right on new lengths, tables and queries."""
    config = GPU_FEATURES[feature]
    batch, heads, qlen, page, pages_per, splits = 4, 16, 2, 64, 24, 4
    case = make_case(device, batch=batch, heads=heads, qlen=qlen, lens=(page * pages_per,) * batch,
                     page=page, Lv=512, rope=64, dtype=torch.bfloat16, poison_past_end=False)
    o, lse, logits = case.outputs(splits)
    case.run(splits, config)  # compiles outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        decode_attention_fwd_verify(*case.args(o, lse, logits, splits), config=config)
    for _ in range(3):
        case.seq_lens.copy_(torch.randint(1, page * pages_per + 1, (batch,), device=device,
                                          dtype=torch.int32))
        case.req_to_token.copy_(case.req_to_token[torch.randperm(batch, device=device)])
        case.q.normal_()
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
        g.replay()
        assert_matches(case, o, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [None, GPU_SWAP["swap-h32"]], ids=["table", "swap-h32"])
@pytest.mark.parametrize("qlen", [1, 4])
def test_gpu_every_split_cap_agrees(device, qlen, config):
    case = make_case(device, batch=3, heads=16, qlen=qlen, lens=(7, 2500, 9000), real=(7, 2500, 8000),
                     page=64, Lv=512, rope=64, dtype=torch.bfloat16)
    o1, lse1 = case.run(1, config)
    assert_matches(case, o1, lse1)
    for splits in range(2, 17):
        o, lse = case.run(splits, config)
        torch.testing.assert_close(lse, lse1, atol=1e-3, rtol=1e-4)
        torch.testing.assert_close(o, o1, atol=2e-2, rtol=2e-2)


def _compilations():
    """A counter of Triton compilations of the verify kernels (hook + cache sizes)."""
    import triton

    count = {"hook": 0}

    def hook(*args, **kwargs):
        count["hook"] += 1
        return None

    knobs = getattr(triton, "knobs", None)
    prev = None
    if knobs is not None and hasattr(knobs.runtime, "jit_post_compile_hook"):
        prev = knobs.runtime.jit_post_compile_hook
        knobs.runtime.jit_post_compile_hook = hook

    def cache_size():
        n = 0
        for fn in (kernels._fwd_verify_stage1, kernels._fwd_verify_stage2):
            for entry in getattr(fn, "device_caches", {}).values():
                n += len(entry[0]) if isinstance(entry, tuple) else 0
        return n

    def restore():
        if knobs is not None and hasattr(knobs.runtime, "jit_post_compile_hook"):
            knobs.runtime.jit_post_compile_hook = prev

    return count, cache_size, restore


@pytest.mark.gpu
@pytest.mark.parametrize("fp8,qlens", [(False, [1, 4]), (True, [2])], ids=["bf16-q1-q4", "fp8-q2"])
def test_gpu_warmup_then_capture_compiles_nothing(device, fp8, qlens):
    heads, batch, splits, pages_per = 16, 8, 4, 40
    page = 64
    cache_dtype = FP8 if fp8 else None
    base = make_case(device, batch=batch, heads=heads, qlen=4, lens=(page * pages_per,) * batch,
                     page=page, Lv=512, rope=64, dtype=torch.bfloat16, cache_dtype=cache_dtype,
                     layout="cross")
    k_buffer = base.k_buffer
    k_scale = None  # fp8 without k_scale uses the cached default (created by the warmup)
    max_rows = batch * max(qlens)
    q_all = torch.randn(max_rows, heads, 576, device=device, dtype=torch.bfloat16)
    o_all = torch.empty(max_rows, heads, 512, device=device, dtype=torch.bfloat16)
    lse_all = torch.empty(max_rows, heads, device=device, dtype=torch.float32)
    logits = torch.empty(max_rows, heads, splits, 513, device=device, dtype=torch.float32)
    table = torch.empty(batch, pages_per, dtype=torch.int32, device=device)
    seq_lens = torch.empty(batch, dtype=torch.int32, device=device)
    real = torch.empty(batch, dtype=torch.int32, device=device)
    warmup_decode_attention_fwd_verify(q_all, k_buffer, o_all, lse_all, table, True, qlens, logits,
                                       SM_SCALE, page, k_scale)

    count, cache_size, restore = _compilations()
    try:
        graphs = {}
        before = cache_size()
        for qlen in qlens:
            rows = batch * qlen
            table.copy_(base.req_to_token[:, :pages_per])
            seq_lens.fill_(qlen)
            real.fill_(qlen)
            for num_splits in (1, splits):
                args = (q_all[:rows], k_buffer, k_buffer[..., :512], o_all[:rows], lse_all[:rows],
                        table, seq_lens, real, qlen, logits[:rows] if num_splits > 1 else None,
                        num_splits, SM_SCALE, page, k_scale)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    torch.ops.mla.decode_verify(*args)
                graphs[(qlen, num_splits)] = (g, args)
        assert count["hook"] == 0 and cache_size() == before, "a capture compiled a kernel"
    finally:
        restore()

    for (qlen, num_splits), (g, args) in graphs.items():
        for trial in range(2):
            lens = torch.randint(1, page * pages_per + 1, (batch,), device=device, dtype=torch.int32)
            seq_lens.copy_(lens)
            real.copy_(torch.minimum(lens, torch.randint(0, page * pages_per, (batch,), device=device,
                                                         dtype=torch.int32)))
            table.copy_(torch.randperm(base.req_to_token.numel(), device=device)[: batch * pages_per]
                        .remainder(k_buffer.shape[0]).view(batch, pages_per).int())
            q_all.normal_()
            o_all.fill_(float("nan"))
            lse_all.fill_(float("nan"))
            g.replay()
            rows = batch * qlen
            # k_scale None: the kernel used the cached unit default, as the reference does.
            case = Case(q_all[:rows], k_buffer, k_buffer[..., :512], table, seq_lens, real, qlen,
                        page, None)
            assert_matches(case, o_all[:rows], lse_all[:rows], cache_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_gpu_torch_compile(device, mode):
    torch._dynamo.reset()
    heads, qlen, splits, page = 16, 2, 4, 64
    case = make_case(device, batch=4, heads=heads, qlen=qlen, lens=(100, 2000, 3000, 129), page=page,
                     Lv=512, rope=64, dtype=torch.bfloat16)
    ref = case.reference()

    def step(q, k_buffer, req_to_token, seq_lens):
        o = torch.empty(q.shape[0], heads, 512, dtype=q.dtype, device=q.device)
        lse = torch.empty(q.shape[0], heads, dtype=torch.float32, device=q.device)
        logits = torch.empty(q.shape[0], heads, splits, 513, dtype=torch.float32, device=q.device)
        torch.ops.mla.decode_verify(q, k_buffer, k_buffer[..., :512], o, lse, req_to_token,
                                    seq_lens, None, qlen, logits, splits, SM_SCALE, page, None)
        return o * 1, lse

    compiled = torch.compile(step, fullgraph=True, mode=mode)
    for _ in range(3):  # warm-up, record, replay under reduce-overhead
        o, lse = compiled(case.q, case.k_buffer, case.req_to_token, case.seq_lens)
        torch.testing.assert_close(lse, ref[1], atol=1e-2, rtol=1e-3)
        torch.testing.assert_close(o.float(), ref[0], atol=2e-2, rtol=2e-2)
    # New lengths reach the kernel through the same graph.
    case.seq_lens.copy_(torch.tensor([3000, 7, 64, 1], dtype=torch.int32, device=device))
    ref = case.reference()
    o, lse = compiled(case.q, case.k_buffer, case.req_to_token, case.seq_lens)
    torch.testing.assert_close(lse, ref[1], atol=1e-2, rtol=1e-3)
    torch.testing.assert_close(o.float(), ref[0], atol=2e-2, rtol=2e-2)
