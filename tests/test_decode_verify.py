"""decode_attention_fwd_verify against the float64 reference, by the tolerance rule of
``tests/builders.py`` (kernel error <= K x the error of PyTorch in the kernel's dtype).

Without a GPU the kernels run in Triton's interpreter on small shapes (fp32, fp16, fp8 -> fp16:
the interpreter computes bf16 wrongly); ``@pytest.mark.gpu`` tests cover bf16/fp16/fp8 at
serving shapes, split caps 1..16, warmup + capture with no compilation, and torch.compile.
Inputs come from ``builders.decode_case``: random, never zeros, pages in a random order, outputs
poisoned with NaN before each call. Bad arguments are ``tests/test_argument_rules.py``'s.
"""

from __future__ import annotations

import itertools
import types

import pytest
import torch

import mla_ops  # noqa: F401  (registers torch.ops.mla)
from mla_ops import platform
from mla_ops.decode_verify import kernels, launch
from mla_ops.decode_verify.launch import (
    _tma_descriptors,
    decode_attention_fwd_verify,
    warmup_decode_attention_fwd_verify,
)

from builders import FP8, SM_SCALE, DecodeCase, decode_case

# Small splits so that short interpreter sequences still cut into several splits.
SMALL_SPLITS = {"BLOCK_N": 16, "SPLIT_ALIGN": 16, "MIN_SPLIT_LEN": 16}
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


# --- interpreter (CI) and GPU: small shapes -------------------------------------------------

# (id, decode_case kwargs, num_kv_splits, config override)
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
    # Peaky attention (scores of std 4): the running max jumps, so the rescaling is exercised.
    ("B2-H4-q2-p16-fp16-peaky", dict(batch=2, heads=4, qlen=2, lens=(90, 170), page=16,
                                     dtype=torch.float16, score_std=4.0), 3, SMALL_SPLITS),
    ("B2-H2-q2-p16-fp16-16+16", dict(batch=2, heads=2, qlen=2, lens=(33, 70), page=16, Lv=16,
                                     rope=16, dtype=torch.float16), 2, SMALL_SPLITS),
    ("B2-H2-q2-p16-fp32-32+0", dict(batch=2, heads=2, qlen=2, lens=(33, 70), page=16, Lv=32,
                                    rope=0), 2, SMALL_SPLITS),
]


@pytest.mark.parametrize("variant", ["plain", *SWAP])
@pytest.mark.parametrize("kw,splits,config", [c[1:] for c in SMALL_CASES],
                         ids=[c[0] for c in SMALL_CASES])
def test_matches_reference(device, kw, splits, config, variant):
    case = decode_case(device, **kw)
    if variant != "plain":
        config = {**(config or {}), **SWAP[variant]}
    o, lse = case.run(splits, config)
    case.assert_matches(o, lse)


def _run_with_wide_workspace(case, splits, extra_cols, config):
    """The case run with a NaN workspace ``extra_cols`` floats wider than Lv + 1 per row (the
    spec takes ``attn_logits.shape[3] >= Lv + 1``); returns ``(o, lse, columns past Lv + 1)``."""
    args = case.op_args(splits)
    rows, heads = case.q.shape[:2]
    args["attn_logits"] = torch.full((rows, heads, splits, case.Lv + 1 + extra_cols), float("nan"),
                                     dtype=torch.float32, device=case.q.device)
    mla_ops.decode_attention_fwd_verify(**args, config=config)
    return args["o"], args["lse"], args["attn_logits"][..., case.Lv + 1:]


@pytest.mark.parametrize("extra_cols", [7, 15])
@pytest.mark.parametrize("variant", ["plain", "swap-h16"])
def test_wider_workspace_rows_match_reference(device, extra_cols, variant):
    """A workspace with rows wider than Lv + 1 (15 more: each row 64-byte aligned) gives the
    reference's results, and nothing is written past a row's Lv + 1 floats."""
    case = decode_case(device, batch=2, heads=4, qlen=2, lens=(45, 130), page=16, Lv=32, rope=16,
                       dtype=torch.float16)
    config = {**SMALL_SPLITS, **(SWAP[variant] if variant != "plain" else {})}
    o, lse, pad = _run_with_wide_workspace(case, 3, extra_cols, config)
    case.assert_matches(o, lse)
    assert pad.isnan().all(), "a split's partial was written past its Lv + 1 floats"


@pytest.mark.parametrize("config", [None, SMALL_SPLITS, {**SMALL_SPLITS, "QSPLIT": 1, "BLOCK_H": 16},
                                    {**SMALL_SPLITS, **SWAP["swap-h32"]},
                                    {**SMALL_SPLITS, **SWAP["swap-h16"], "BLOCK_N": 32, "QSPLIT": 1}],
                         ids=["table", "small-splits", "qsplit-h16", "swap-h32", "swap-qsplit-h16"])
def test_every_split_cap_matches_reference(device, config):
    """Every split cap meets the rule on its own (fp32: within a few ulps of float64)."""
    case = decode_case(device, batch=2, heads=4, qlen=3, lens=(23, 150), page=16,
                       dtype=torch.float32)
    for splits in (1, 2, 3, 5, 8):
        o, lse = case.run(splits, config)
        case.assert_matches(o, lse)


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
    case = decode_case(device, poison_past_end=True, **kw)
    config = {**SMALL_SPLITS, **FEATURES[feature]}
    with platform.mock_platform("sm_90", sm_count=1):
        if config.get("TMA"):
            # The bulk copy applies to 16-bit caches; fp8 ones keep the pointer path (slower
            # through TMA on the H200, see launch._tma_descriptors).
            cfg = launch.launch_config(case.batch, case.qlen, case.heads, case.k_buffer, case.Lv,
                                       config)
            Lk, Lv = case.k_buffer.shape[-1], case.Lv
            desc = _tma_descriptors(case.k_buffer, case.page_size, Lk, Lv, cfg, platform.current())[0]
            assert (desc is None) == (kw.get("cache_dtype") == FP8), "TMA applied wrongly"
        for splits in (1, 3):
            o, lse = case.run(splits, config)
            case.assert_matches(o, lse)


# --- balanced splits (BALANCE: splits.py) ---------------------------------------------------

def balanced_pieces(case, cap: int, balance: int) -> list[int]:
    """What ``splits.balanced_splits`` gives each request of ``case`` (a plain mirror of it on
    the host): ``round(cap // balance * B * n / sum(n))`` in ``[1, cap]``, n the keys the
    request reads (``min(L, L_real)``; the single-GPU kernel)."""
    lens = case.seq_lens.tolist()
    real = case.real_seq_lens.tolist() if case.real_seq_lens is not None else lens
    n = [max(min(a, b), 0) for a, b in zip(lens, real)]
    total, batch, target = sum(n), len(n), max(cap // balance, 1)
    return [min(max((2 * target * batch * x + total) // (2 * max(total, 1)), 1), cap) for x in n]


# (id, decode_case kwargs, split cap, BALANCE): lengths far apart, so that the pieces differ
# per request (long ones take up to BALANCE x the equal-length count, short ones fewer), one
# request of one piece beside split ones; padded drafts; fp8; equal lengths.
BALANCE_CASES = [
    ("B5-H4-q2-uneven-fp16", dict(batch=5, heads=4, qlen=2, lens=(1, 30, 200, 300, 64), page=16,
                                  dtype=torch.float16), 4, 2),
    ("B4-H3-q3-real-fp32", dict(batch=4, heads=3, qlen=3, lens=(250, 40, 129, 3), real=(100, 40, 0, 3),
                                page=16), 6, 2),
    ("B3-H4-q2-fp8", dict(batch=3, heads=4, qlen=2, lens=(45, 170, 300), page=16, dtype=torch.float16,
                          cache_dtype=FP8), 6, 3),
    ("B3-H2-q1-equal-fp32", dict(batch=3, heads=2, qlen=1, lens=(96, 96, 96), page=16), 4, 2),
    ("B2-H4-q4-cap2-fp16", dict(batch=2, heads=4, qlen=4, lens=(20, 300), page=16, dtype=torch.float16), 2, 2),
    # more requests than one step of the kernels' passes over the lengths (128)
    ("B130-H2-q1-fp32", dict(batch=130, heads=2, qlen=1, lens=tuple(1 + (37 * i) % 100 for i in range(130)),
                             page=16), 2, 2),
]


@pytest.mark.parametrize("variant", ["plain", "swap-h16", "persistent"])
@pytest.mark.parametrize("kw,cap,balance", [c[1:] for c in BALANCE_CASES], ids=[c[0] for c in BALANCE_CASES])
def test_balanced_splits_match_reference(device, kw, cap, balance, variant):
    """Balanced splits meet the rule, and the workspace shows how each request was cut: a
    request of one piece went straight to o (slot 1's lse +inf, nothing else written), one of
    k pieces has lse -inf in its slots past k and no NaN below (every slot written)."""
    if kw["batch"] > 128 and variant != "plain":
        pytest.skip("the batch's passes are the same code in every variant (slow in the interpreter)")
    case = decode_case(device, **kw)
    config = {**SMALL_SPLITS, "BALANCE": balance}
    if variant == "swap-h16":
        config.update(SWAP["swap-h16"], BLOCK_N=16)
    args = case.op_args(cap)
    with platform.mock_platform("sm_90", sm_count=1) if variant == "persistent" else _nothing():
        if variant == "persistent":
            config["PERSISTENT"] = 2  # 2 programs looping over every (row block, request, slot)
        decode_attention_fwd_verify(**args, config=config)
    case.assert_matches(args["o"], args["lse"])
    slot_lse = args["attn_logits"][..., case.Lv]  # [rows, H, cap]
    for (r0, n), k in zip(case.spans(), balanced_pieces(case, cap, balance)):
        lse_b = slot_lse[r0:r0 + n]
        if k == 1:
            assert (lse_b[:, :, 1] == float("inf")).all(), "one piece: slot 1 tells stage 2 it is done"
            assert lse_b[:, :, 2:].isnan().all() and lse_b[:, :, 0].isnan().all(), "one piece: no partial"
        else:
            assert not lse_b[:, :, :k].isnan().any(), f"{k} pieces: every slot below {k} written"
            assert (lse_b[:, :, k:] == float("-inf")).all(), f"{k} pieces: the slots past {k} unused"


def _nothing():
    import contextlib
    return contextlib.nullcontext()


def test_balanced_piece_order_is_each_request_k_pieces_in_turn():
    """The host mirror of the kernels' piece order (``splits.balanced_piece_order``, which the
    CTA timeline names its CTAs by): request by request, slots 0..k-1 each, k as the rule."""
    from mla_ops.decode_verify.splits import balanced_piece_order

    case = decode_case("cpu", batch=5, heads=4, qlen=2, lens=(1, 30, 200, 300, 64), page=16)
    ks = balanced_pieces(case, 8, 2)
    assert balanced_piece_order(case.seq_lens.tolist(), 8, 2) == [(r, s) for r, k in enumerate(ks) for s in range(k)]
    assert len(set(ks)) > 2  # (the case cuts its requests differently)


def test_balanced_splits_of_equal_lengths_are_the_plain_count():
    """Equal lengths: every request gets ``cap // balance`` pieces, the count a launch
    without the key runs with ``verify_num_kv_splits``' own (un-multiplied) cap."""
    from mla_ops.decode_verify.splits import verify_num_kv_splits
    for batch, L in ((3, 96), (32, 4096), (128, 4096)):
        plain = verify_num_kv_splits(L, batch, 2, 16, 132, block_h=64, min_work_per_split=256, balance=0)
        cap = verify_num_kv_splits(L, batch, 2, 16, 132, block_h=64, min_work_per_split=256, balance=2)
        assert cap == 2 * plain
        case = types.SimpleNamespace(seq_lens=torch.full((batch,), L), real_seq_lens=None)
        assert balanced_pieces(case, cap, 2) == [plain] * batch


# --- the balanced grid (GRID: splits.py, the swap-AB Gluon kernel) ----------------------------

GRID_KEYS = {  # each request's keys: ragged, equal, none, one request dominating, more than 128
    "ragged": [4000, 64, 1, 900, 2500, 130], "equal": [4096] * 32, "empty": [0, 0, 0],
    "dominant": [100000, 0, 64, 1], "B300": [1 + (i * 977) % 3000 for i in range(300)],
    "one": [70], "uniform128": [2 + (i * 7919) % 4095 for i in range(128)],
}


@pytest.mark.parametrize("name", sorted(GRID_KEYS))
@pytest.mark.parametrize("cap", [2, 3, None])
@pytest.mark.parametrize("grid", [132, 7])
def test_grid_segments_cover_every_block_once(name, cap, grid):
    """The kernel's arithmetic on the host (``splits.grid_segments``): every request has
    segments in slots 0..k-1 of its k <= cap CTAs, one each and each CTA's in request order,
    whose blocks tile the request's blocks exactly once (a request without keys: one segment of
    none); no CTA holds more blocks than its even share of the units (blocks + REQUEST_COST a
    request) rounded up."""
    from mla_ops.decode_verify.splits import grid_num_kv_splits, grid_segments

    keys = GRID_KEYS[name]
    cap = cap or grid_num_kv_splits(len(keys), grid)
    segs = grid_segments(keys, grid, cap, 64, 2)
    assert len(segs) == grid
    by_req = {}
    for c, cta in enumerate(segs):
        assert [s[0] for s in cta] == sorted(s[0] for s in cta)
        for r, slot, k, b0, b1 in cta:
            by_req.setdefault(r, []).append((slot, k, b0, b1))
    assert sorted(by_req) == list(range(len(keys)))
    units = sum(max(-(-n // 64), 1) + 2 for n in keys)
    for r, n in enumerate(keys):
        got = by_req[r]
        k = got[0][1]
        assert {g[1] for g in got} == {k} and 1 <= k <= cap
        assert sorted(g[0] for g in got) == list(range(k))
        ranges = sorted((b0, b1) for _, _, b0, b1 in got if b1 > b0)
        covered = 0
        for b0, b1 in ranges:
            assert b0 == covered, (r, ranges)
            covered = b1
        assert covered == -(-n // 64)
    # the CTAs that hold work: the grid, or fewer where the longest request's blocks would meet
    # more than cap of them (the module's docstring)
    span = max(max(-(-n // 64), 1) - 1 for n in keys)
    g = min(grid, max((cap - 1) * units // span, 1)) if span else grid
    assert not any(segs[g:]), "the CTAs past g hold nothing"
    for cta in segs:
        assert sum(b1 - b0 for _, _, _, b0, b1 in cta) <= -(-units // g)


def test_grid_split_cap_keeps_ragged_batches_on_the_whole_grid():
    """``verify_num_kv_splits(grid=True)`` is ``grid_num_kv_splits``: ``1 + cdiv(2 SMs, B)``, so
    a batch whose longest request holds twice the mean keeps every CTA (the kernel narrows the
    grid only past that); a batch one request dominates is narrowed to fit the cap."""
    from mla_ops.decode_verify.splits import grid_num_kv_splits, grid_segments, verify_num_kv_splits

    for batch, cap in ((1, 265), (32, 10), (64, 6), (128, 4), (300, 2)):
        assert grid_num_kv_splits(batch, 132) == cap
        assert verify_num_kv_splits(4096, batch, 2, 16, 132, block_h=64, min_work_per_split=256, balance=0,
                                    grid=True) == cap
    for batch in (32, 64, 128):
        keys = [2 + (i * 7919) % 4095 for i in range(batch)]  # uniform in [2, 4096]
        segs = grid_segments(keys, 132, grid_num_kv_splits(batch, 132))
        assert all(cta for cta in segs), "every CTA holds work"
    segs = grid_segments([100000, 64, 1], 132, 4)
    assert 0 < sum(1 for cta in segs if cta) < 132


@pytest.mark.parametrize("why,kw,config", [
    ("page-not-multiple-of-block", dict(page=1, layout="3d"), {}),
    ("split-align-not-multiple", dict(page=16), {"SPLIT_ALIGN": 8, "BLOCK_N": 16}),
    ("block-straddles-pages", dict(page=16), {"BLOCK_N": 32, "SPLIT_ALIGN": 32}),
    ("token-stride-unaligned", dict(page=16, dtype=torch.float16), {"pad_tokens": 4}),  # 200 B
])
def test_tma_falls_back_where_it_does_not_apply(device, why, kw, config):
    """Where a bulk tensor copy cannot describe the cache, the pointer path runs the same
    config (and stays right)."""
    case = decode_case(device, batch=2, heads=2, qlen=2, lens=(20, 40), **kw)
    config = dict(config)
    pad = config.pop("pad_tokens", 0)
    if pad:  # the same cache in a wider buffer: token stride Lk + pad elements
        wide = torch.randn(*case.k_buffer.shape[:-1], case.k_buffer.shape[-1] + pad,
                           device=device).to(case.k_buffer.dtype)
        wide[..., :-pad] = case.k_buffer
        case.k_buffer, case.v_buffer = wide[..., :-pad], wide[..., :case.Lv]
    config = {"BLOCK_N": 16, "SPLIT_ALIGN": 16, "MIN_SPLIT_LEN": 16, "TMA": 1, **config}
    cfg = launch.launch_config(2, 2, 2, case.k_buffer, case.Lv, config)
    Lk, Lv = case.k_buffer.shape[-1], case.Lv
    assert cfg["TMA"] == 1
    assert _tma_descriptors(case.k_buffer, case.page_size, Lk, Lv, cfg, platform.current()) == (None, None)
    o, lse = case.run(2, config)
    case.assert_matches(o, lse)


def test_poisoned_cache_pointer_path(device):
    """The pointer path's masked tail never lets NaN past a request's end into the output."""
    case = decode_case(device, batch=3, heads=4, qlen=2, lens=(1, 37, 100), page=16,
                       poison_past_end=True)
    for config, splits in ((None, 1), (SMALL_SPLITS, 4), ({**SMALL_SPLITS, **SWAP["swap-h32"]}, 3)):
        o, lse = case.run(splits, config)
        case.assert_matches(o, lse)


def test_op_matches_function_bitwise(device):
    case = decode_case(device, batch=2, heads=4, qlen=2, lens=(20, 77), page=16,
                       dtype=torch.float16)
    o_f, lse_f = case.run(2)
    o_op, lse_op = case.run(2, fn=torch.ops.mla.decode_verify)
    assert torch.equal(o_op, o_f) and torch.equal(lse_op, lse_f)


def test_warmup_changes_no_visible_tensor(device):
    case = decode_case(device, batch=2, heads=4, qlen=2, lens=(20, 77), page=16,
                       dtype=torch.float16)
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


def test_fp8_cache_without_k_scale_is_unscaled(device):
    """k_scale=None on an fp8 cache means a scale of 1 (the default the launcher makes once
    per device, before any capture): the reference's answer for k_scale=None, not the case's
    own 0.37."""
    case = decode_case(device, batch=2, heads=4, qlen=2, lens=(45, 70), page=16,
                       dtype=torch.float16, cache_dtype=FP8)
    case.k_scale = None
    o, lse = case.run(2, SMALL_SPLITS)
    case.assert_matches(o, lse)


def test_unknown_config_key_rejected(device):
    case = decode_case(device, batch=1, heads=4, qlen=2, lens=(5,), page=16)
    with pytest.raises(ValueError, match=r"^config: unknown config keys \['BLOCK_M'\]"):
        case.run(1, {"BLOCK_M": 16})


def test_unpipelined_swap_ab_refused_where_the_compiler_bug_applies(device):
    """SWAP_AB with num_stages 1 miscompiles on CUDA with this triton: the launcher refuses it
    (before any launch, o untouched) where the workaround is active, runs it elsewhere."""
    case = decode_case(device, batch=1, heads=4, qlen=2, lens=(40,), page=16)
    bad = {**SMALL_SPLITS, **SWAP["swap-h32"], "num_stages": 1}
    args = case.op_args(2)
    with platform.mock_platform("sm_90", interpret=False):
        with pytest.raises(ValueError, match="^config: SWAP_AB with num_stages 1 is refused on "
                                             "CUDA with this triton"):
            decode_attention_fwd_verify(**args, config=bad)
    assert args["o"].isnan().all()
    if platform.interpreter_enabled():  # the interpreter has no such bug
        o, lse = case.run(2, bad)
        case.assert_matches(o, lse)


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
    # Peaky attention (scores of std 4): the running max moves by large steps.
    ("B2-H16-q2-p64-peaky", dict(batch=2, heads=16, qlen=2, lens=(17, 9000), page=64,
                                 score_std=4.0), 4, ("bf16", "fp8")),
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


def _gpu_case(device, dtype_name, **kw):
    dtype, cache_dtype = GPU_DTYPES[dtype_name]
    return decode_case(device, Lv=512, rope=64, dtype=dtype, cache_dtype=cache_dtype, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bf16", "fp8"])
@pytest.mark.parametrize("heads,qlen", [(16, 2), (128, 2)], ids=["H16-q2", "H128-q2"])
def test_gpu_wider_workspace_rows_match_reference(device, heads, qlen, dtype_name):
    """The table's launch (swap-AB at H16, the 64-row schedules at H128) with 528-float
    workspace rows: the reference's results, nothing written past a row's 513 floats."""
    case = _gpu_case(device, dtype_name, batch=3, heads=heads, qlen=qlen, lens=(700, 1500, 2100), page=64)
    o, lse, pad = _run_with_wide_workspace(case, 4, 15, None)
    case.assert_matches(o, lse)
    assert pad.isnan().all(), "a split's partial was written past its Lv + 1 floats"


@pytest.mark.gpu
@pytest.mark.parametrize("kw,splits,dtype_name", GPU_PARAMS)
def test_gpu_matches_reference(device, kw, splits, dtype_name):
    case = _gpu_case(device, dtype_name, **kw)
    o, lse = case.run(splits)
    case.assert_matches(o, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("kw,splits,dtype_name,config", GPU_SWAP_PARAMS)
def test_gpu_swap_ab_matches_reference(device, kw, splits, dtype_name, config):
    case = _gpu_case(device, dtype_name, **kw)
    o, lse = case.run(splits, config)
    case.assert_matches(o, lse)


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
    case = _gpu_case(device, dtype_name, poison_past_end=True, **kw)
    for s in sorted({1, splits}):
        o, lse = case.run(s, config)
        case.assert_matches(o, lse)


# Balanced splits on the GPU at serving shapes, through the op with the table's config (the
# Gluon family where it takes the launch) and the portable one: lengths far apart (a request of
# one piece beside split ones), padded drafts, fp8; the slots show each request's pieces.
GPU_BALANCE = [
    ("B6-H16-q2-bf16", dict(batch=6, heads=16, qlen=2, lens=(4000, 64, 1, 900, 2500, 130), page=64), 8, "bf16"),
    ("B4-H16-q4-real-bf16", dict(batch=4, heads=16, qlen=4, lens=(3000, 200, 1200, 70), real=(2990, 0, 1200, 70),
                                 page=64), 6, "bf16"),
    ("B3-H128-q1-bf16", dict(batch=3, heads=128, qlen=1, lens=(5000, 300, 1000), page=64), 4, "bf16"),
    ("B5-H16-q2-fp8", dict(batch=5, heads=16, qlen=2, lens=(2000, 5, 700, 64, 3333), page=64), 8, "fp8"),
    ("B3-H128-q2-fp8", dict(batch=3, heads=128, qlen=2, lens=(4096, 100, 700), page=128), 4, "fp8"),
    # more requests than one pass of the kernels' batch sum (32 in the Gluon partitions, 128 in
    # the portable kernel) holds
    ("B150-H16-q4-bf16", dict(batch=150, heads=16, qlen=4, lens=tuple(1 + (i * 977) % 3000 for i in range(150)),
                              page=64), 2, "bf16"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["table", "triton"])
@pytest.mark.parametrize("kw,cap,dtype_name", [c[1:] for c in GPU_BALANCE], ids=[c[0] for c in GPU_BALANCE])
def test_gpu_balanced_splits_match_reference(device, kw, cap, dtype_name, family):
    dtype, cache = GPU_DTYPES[dtype_name]
    case = decode_case(device, dtype=dtype, cache_dtype=cache, **kw)
    config = {"BALANCE": 2} if family == "table" else {"family": "triton", "BALANCE": 2}
    args = case.op_args(cap)
    decode_attention_fwd_verify(**args, config=config)
    torch.cuda.synchronize()
    case.assert_matches(args["o"], args["lse"])
    slot_lse = args["attn_logits"][..., case.Lv]
    for (r0, n), k in zip(case.spans(), balanced_pieces(case, cap, 2)):
        lse_b = slot_lse[r0:r0 + n]
        if k == 1:
            assert (lse_b[:, :, 1] == float("inf")).all()
        else:
            assert not lse_b[:, :, :k].isnan().any() and (lse_b[:, :, k:] == float("-inf")).all()


@pytest.mark.gpu
def test_gpu_unpipelined_swap_ab_refused(device):
    """SWAP_AB with num_stages 1 gave wrong answers on the H200 (Triton 3.6): refused by name."""
    case = _gpu_case(device, "bf16", batch=1, heads=16, qlen=2, lens=(300,), page=64)
    with pytest.raises(ValueError, match="^config: SWAP_AB with num_stages 1 is refused on CUDA "
                                         "with this triton"):
        case.run(2, {**GPU_SWAP["swap-h32"], "num_stages": 1})


@pytest.mark.gpu
@pytest.mark.parametrize("feature", ["tma-swap-h32-qsplit", "persistent-tma-h64", "pdl-s2-block-dv-64"])
def test_gpu_features_capture_and_replay(device, feature):
    """Each launch feature captured in a CUDA graph (host descriptors baked in, the persistent
    grid, the programmatic edge of PDL) replays right on new lengths, tables and queries."""
    config = GPU_FEATURES[feature]
    batch, heads, qlen, page, pages_per, splits = 4, 16, 2, 64, 24, 4
    case = _gpu_case(device, "bf16", batch=batch, heads=heads, qlen=qlen,
                     lens=(page * pages_per,) * batch, page=page)
    args = case.op_args(splits)
    case.run(splits, config)  # compiles outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        decode_attention_fwd_verify(**args, config=config)
    for _ in range(3):
        case.seq_lens.copy_(torch.randint(1, page * pages_per + 1, (batch,), device=device,
                                          dtype=torch.int32))
        case.req_to_token.copy_(case.req_to_token[torch.randperm(batch, device=device)])
        case.q.copy_(torch.randn_like(case.q) * case.q.std())
        args["o"].fill_(float("nan"))
        args["lse"].fill_(float("nan"))
        g.replay()
        case.assert_matches(args["o"], args["lse"])


@pytest.mark.gpu
@pytest.mark.parametrize("config", [None, GPU_SWAP["swap-h32"]], ids=["table", "swap-h32"])
@pytest.mark.parametrize("qlen", [1, 4])
def test_gpu_every_split_cap_matches_reference(device, qlen, config):
    case = _gpu_case(device, "bf16", batch=3, heads=16, qlen=qlen, lens=(7, 2500, 9000),
                     real=(7, 2500, 8000), page=64)
    for splits in range(1, 17):
        o, lse = case.run(splits, config)
        case.assert_matches(o, lse)


@pytest.mark.gpu
def test_gpu_default_k_scale_made_before_capture(device, monkeypatch):
    """The default k_scale (an fp32 1.0 per device) cannot be made inside a capture (it would
    only be filled at replay): a capture before any eager call or warmup on that device is
    refused by name; after the warmup the same capture runs and replays right."""
    monkeypatch.setattr(launch, "_UNIT_SCALE", {})  # as in a fresh process
    case = _gpu_case(device, "fp8", batch=2, heads=16, qlen=2, lens=(300, 1000), page=64)
    case.k_scale = None
    args = case.op_args(2)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="^k_scale: the default k_scale is created on first "
                                           "use and cannot be made during a graph capture"):
        with torch.cuda.graph(g):
            torch.ops.mla.decode_verify(**args)
    torch.cuda.synchronize()
    warmup_decode_attention_fwd_verify(args["q"], args["k_buffer"], args["o"], args["lse"],
                                       args["req_to_token"], False, [2], args["attn_logits"],
                                       SM_SCALE, case.page_size)
    assert list(launch._UNIT_SCALE) == [args["q"].device]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.ops.mla.decode_verify(**args)
    g.replay()
    case.assert_matches(args["o"], args["lse"])


class _CompileCounter:
    """Counts Triton compilations (JIT cache misses) through ``knobs.runtime.
    jit_post_compile_hook``, which triton 3.6 calls after every compile (warm disk cache or
    not), and the in-process caches of the verify kernels (``JITFunction.device_caches[dev][0]``).
    Refuses to run where either mechanism is missing, rather than counting nothing."""

    def __init__(self):
        import triton

        knobs = getattr(triton, "knobs", None)
        if knobs is None or not hasattr(knobs.runtime, "jit_post_compile_hook"):
            raise RuntimeError(f"triton {triton.__version__} has no knobs.runtime."
                               "jit_post_compile_hook: this test cannot count compilations")
        for fn in (kernels._fwd_verify_stage1, kernels._fwd_verify_stage2):
            if not isinstance(getattr(fn, "device_caches", None), dict):
                raise RuntimeError(f"{fn}: no JITFunction.device_caches to count compiled "
                                   "variants in (the interpreter, or another triton)")
        self.knobs, self.hooked = knobs, 0

    def __enter__(self):
        self.prev = self.knobs.runtime.jit_post_compile_hook

        def hook(*args, **kwargs):
            self.hooked += 1
            if self.prev is not None:
                return self.prev(*args, **kwargs)
            return None

        self.knobs.runtime.jit_post_compile_hook = hook
        return self

    def __exit__(self, *exc):
        self.knobs.runtime.jit_post_compile_hook = self.prev

    @staticmethod
    def cached() -> int:
        n = 0
        for fn in (kernels._fwd_verify_stage1, kernels._fwd_verify_stage2):
            for entry in fn.device_caches.values():
                n += len(entry[0])
        return n


_FRESH = itertools.count()


def _compile_a_fresh_variant(device):
    """One launch of a variant no other test compiles (a stage-2 tile of its own)."""
    s2 = (2, 4, 32, 64)[next(_FRESH) % 4]
    case = _gpu_case(device, "bf16", batch=1, heads=16, qlen=2, lens=(700,), page=64)
    case.run(3, {"S2_BLOCK_S": s2, "s2_num_warps": 1, "BLOCK_N": 32, "MIN_SPLIT_LEN": 64})


@pytest.mark.gpu
@pytest.mark.parametrize("fp8,qlens", [(False, [1, 4]), (True, [2])], ids=["bf16-q1-q4", "fp8-q2"])
def test_gpu_warmup_then_capture_compiles_nothing(device, fp8, qlens):
    heads, batch, splits, pages_per = 16, 8, 4, 40
    page = 64
    base = _gpu_case(device, "fp8" if fp8 else "bf16", batch=batch, heads=heads, qlen=4,
                     lens=(page * pages_per,) * batch, page=page, layout="cross")
    k_buffer = base.k_buffer
    k_scale = None  # fp8 without k_scale uses the cached default (created by the warmup)
    max_rows = batch * max(qlens)
    q_all = torch.randn(max_rows, heads, 576, device=device, dtype=torch.bfloat16) * 0.3
    o_all = torch.empty(max_rows, heads, 512, device=device, dtype=torch.bfloat16)
    lse_all = torch.empty(max_rows, heads, device=device, dtype=torch.float32)
    logits = torch.empty(max_rows, heads, splits, 513, device=device, dtype=torch.float32)
    table = torch.empty(batch, pages_per, dtype=torch.int32, device=device)
    seq_lens = torch.empty(batch, dtype=torch.int32, device=device)
    real = torch.empty(batch, dtype=torch.int32, device=device)
    warmup_decode_attention_fwd_verify(q_all, k_buffer, o_all, lse_all, table, True, qlens, logits,
                                       SM_SCALE, page, k_scale)

    # The counter counts: a variant nobody compiled yet shows in both of its measures.
    with _CompileCounter() as probe:
        before = probe.cached()
        _compile_a_fresh_variant(device)
        assert probe.hooked >= 1 and probe.cached() > before, \
            "the compile counter missed a fresh compilation"

    graphs = {}
    with _CompileCounter() as count:
        before = count.cached()
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
        assert count.hooked == 0 and count.cached() == before, "a capture compiled a kernel"

    for (qlen, num_splits), (g, args) in graphs.items():
        for trial in range(2):
            lens = torch.randint(1, page * pages_per + 1, (batch,), device=device, dtype=torch.int32)
            seq_lens.copy_(lens)
            real.copy_(torch.minimum(lens, torch.randint(0, page * pages_per, (batch,), device=device,
                                                         dtype=torch.int32)))
            table.copy_(torch.randperm(base.req_to_token.numel(), device=device)[: batch * pages_per]
                        .remainder(k_buffer.shape[0]).view(batch, pages_per).int())
            q_all.normal_(std=0.3)
            o_all.fill_(float("nan"))
            lse_all.fill_(float("nan"))
            g.replay()
            rows = batch * qlen
            # k_scale None: the kernel used the cached unit default, as the reference does.
            case = DecodeCase(q_all[:rows], k_buffer, k_buffer[..., :512], table, seq_lens, real,
                              qlen, page, None)
            case.assert_matches(o_all[:rows], lse_all[:rows])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_gpu_torch_compile(device, mode, monkeypatch):
    torch._dynamo.reset()
    # As in a fresh process: the default k_scale is made in the first call, which
    # reduce-overhead runs in its graph warm-up (allocating from the graph's pool).
    monkeypatch.setattr(launch, "_UNIT_SCALE", {})
    heads, qlen, splits, page = 16, 2, 4, 64
    case = _gpu_case(device, "bf16", batch=4, heads=heads, qlen=qlen, lens=(100, 2000, 3000, 129),
                     page=page)

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
        case.assert_matches(o, lse)
    # New lengths reach the kernel through the same graph.
    case.seq_lens.copy_(torch.tensor([3000, 7, 64, 1], dtype=torch.int32, device=device))
    o, lse = compiled(case.q, case.k_buffer, case.req_to_token, case.seq_lens)
    case.assert_matches(o, lse)
