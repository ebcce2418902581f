"""The Gluon (sm_90) stage 1 of decode verify: offline compiles (CPU) and correctness (GPU).

CPU (no GPU needed; skipped where triton is not 3.6.x or has no Gluon): every launch variant of
the config proposed for the sm_90 table compiles to an sm_90a cubin; ptxas reports no spills
(fp8: at most 8 bytes, two scalars spilled once outside the loop), registers within the
warp-specialize budget, shared memory within the 227 KB a CTA may have.

GPU (``@pytest.mark.gpu``; the H100/H200 only, skipped elsewhere): stage 1 here, the portable
stage 2 for split caps > 1, against ``mla_ops.reference.decode_verify_ref`` on fresh random
data, outputs poisoned with NaN before each call and the cache poisoned with NaN past each
request's end; the tests' tolerance rule (``builders.assert_accurate``): the error against a
float64 reference is at most ``builders.K`` times the error of plain PyTorch computing in bf16.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from mla_ops import gluon_support
from mla_ops.decode_verify import gluon_launch as gla
from mla_ops.decode_verify import kernels  # noqa: F401
from mla_ops.decode_verify import launch
from mla_ops.host import cache_bounds
from mla_ops.platform import mock_platform
from mla_ops.reference import decode_verify_ref

from builders import assert_accurate
from gluon_offline import compile_sm90a, ptxas_facts, run_once, shard_of, tensordesc

SM_SCALE = 0.1352
LK, LV = 576, 512
SMEM_LIMIT = 232448  # bytes of shared memory one CTA may have on sm_90 (227 KB)
FP8 = torch.float8_e4m3fn

# The Gluon configs of the sm_90 table (each rule's stage-1 keys over the family's defaults);
# the schedules (alt, alt with QK_FIRST, seesaw with STAGE_PRODUCERS, with and without
# STAGE_ORDER, redundant; fp8: alt with EARLY_RELEASE and redundant) are all compiled for each
# (the seesaw's fp8 forms and the swap-AB schedule's once each, below).
def _table_configs() -> dict:
    from mla_ops import tuning

    out = {}
    for i, rule in enumerate(tuning.table("decode_verify", "sm_90")["rules"]):
        if rule["config"].get("family") == "gluon":
            cfg = {**gla.GLUON_DEFAULT_CONFIG,
                   **{k: v for k, v in rule["config"].items() if k in gla.GLUON_DEFAULT_CONFIG}}
            key = tuple(sorted((k, v) for k, v in cfg.items() if k not in ("SCHEDULE", "QK_FIRST", "EARLY_RELEASE",
                                                                                 "STAGE_ORDER", "STAGE_PRODUCERS",
                                                                                 "STAGE_OUT")))
            out.setdefault(key, (f"rule{i}", cfg))
    return dict(out.values())


PROPOSED_CONFIGS = _table_configs()

_GLUON_WHY = gla.gluon_available()  # why the Gluon kernels may not run here
_BUILD_WHY = gluon_support.gluon_buildable()  # why they may not even compile here
# Spill limits and wgmma serialization are facts of the compiler the kernels were checked with on
# the GPU; on another triton of the range the variants must build and fit, and their spills and
# serialization are only reported.
_GPU_CHECKED = _GLUON_WHY is None


def _is_hopper() -> bool:
    return (torch.cuda.is_available() and torch.version.hip is None
            and torch.cuda.get_device_capability() == (9, 0))


# --- offline compiles (CPU) ----------------------------------------------------------------------


def _filler_regs(cfg: dict, schedule: str, fp8: bool) -> int:
    """Registers of the partition that fills the ring: the producer warp, or the converter
    warps of an fp8 cache on the alt and swap-AB schedules (as ``launch_verify_stage1_gluon``
    picks them; the seesaw's converter warps run in the producer's registers)."""
    return (cfg["CONVERTER_REGS"] if fp8 and (schedule.startswith("alt") or schedule.startswith("swapab"))
            else cfg["PRODUCER_REGS"])


def _compile(cfg: dict, num_heads: int, fp8: bool, single: bool, schedule: str = "redundant",
             cp: bool = False, drafts: bool = False):
    """The sm_90a cubin of one launch variant and ptxas's report: (kernel, ptxas stderr).
    ``cp``: a context-parallel rank's kernel (2 ranks, interleave 64; the rank a runtime int).
    ``drafts``: with ragged draft counts and draft trees (``qo_indptr`` and ``tree_mask``).
    A schedule name ending in ``-out``: with STAGE_OUT (the table's form at H >= 64 and at H 16/32
    with qlen >= 4)."""
    from triton.experimental.gluon import language as gl

    from mla_ops.decode_verify import gluon_kernels as gk

    timeline = schedule.endswith("-tl")  # the CTA timeline probe (gluon_launch.cta_timeline)
    schedule = schedule.removesuffix("-tl")
    grid = schedule.endswith("-grid")  # the balanced grid (the config's GRID; swap-AB, splits)
    schedule = schedule.removesuffix("-grid")
    balance = schedule.endswith("-bal")  # balanced splits (the config's BALANCE 2)
    schedule = schedule.removesuffix("-bal")
    stage_out = schedule.endswith("-out")
    schedule = schedule.removesuffix("-out")
    named = schedule.endswith("-named")  # the seesaw's handovers on named barriers (NAMED_EXCHANGE)
    schedule = schedule.removesuffix("-named")
    head_box = min(num_heads, 64)
    kname, kdt = ("fp8e4nv", gl.float8e4nv) if fp8 else ("bf16", gl.bfloat16)
    sig = {"q_desc": tensordesc([64 // head_box, head_box, 64], "bf16", gl.bfloat16),
           "k_desc": tensordesc([1, cfg["BLOCK_N"], 64], kname, kdt), "qk_scale": "fp32",
           "Req_to_Token": "*i32", "Seq_Lens": "*i32", "Real_Lens": "*i32", "Mid": "*fp32",
           "O": "*bf16", "Lse": "*fp32", "K_Scale": "*fp32"}
    for name in ("stride_req_b", "stride_mid_m", "stride_mid_h", "stride_mid_s", "stride_om",
                 "stride_oh", "stride_lm", "stride_lh", "num_kv_splits", "qlen", "num_heads",
                 "page_size", "num_pages", "kv_capacity"):
        sig[name] = "i32"
    constexprs = {"LV": LV, "LK": LK, "BLOCK_N": cfg["BLOCK_N"], "NUM_STAGES": cfg["NUM_STAGES"],
                  "SPLIT_ALIGN": cfg["SPLIT_ALIGN"], "MIN_SPLIT_LEN": cfg["MIN_SPLIT_LEN"],
                  "SINGLE": single, "PRODUCER_REGS": _filler_regs(cfg, schedule, fp8),
                  "CONSUMER_REGS": cfg["CONSUMER_REGS"]}
    if cp:
        sig["cp_rank"] = "i32"
        constexprs.update(CP_WORLD=2, CP_INTERLEAVE=64)
    else:
        constexprs.update(cp_rank=None, CP_WORLD=1, CP_INTERLEAVE=1)
    if drafts:
        sig.update(Qo_Indptr="*i32", Tree_Mask="*i64", num_rows="i32")
        constexprs.update(VARLEN=True, HAS_TREE=True)
    fn = {"alt": gk._verify_stage1_alt, "alt-qkfirst": gk._verify_stage1_alt, "alt-early": gk._verify_stage1_alt,
          "alt-pdl": gk._verify_stage1_alt, "seesaw": gk._verify_stage1_seesaw,
          "swapab": gk._verify_stage1_swapab}.get(
              "seesaw" if schedule.startswith("seesaw") else "swapab" if schedule.startswith("swapab") else schedule,
              gk._verify_stage1_ws)
    if schedule.startswith("swapab"):  # a request's rows in 32 wgmma columns (H16 qlen 2; 16: H16 qlen 1)
        sig.pop("Tree_Mask", None)
        constexprs.pop("HAS_TREE", None)
        constexprs["ROWS"] = 16 if schedule.endswith("16") else 32
    if schedule.startswith("swapab-split"):  # each group the scores over its half (SPLIT_SCORES)
        constexprs["SPLIT_SCORES"] = True
    if "-lean" in schedule:  # the softmax's reductions off the block's chain (LEAN_SOFTMAX 1 / 2)
        constexprs["LEAN_SOFTMAX"] = int(schedule.split("-lean")[1][0])
    if schedule == "swapab-blocks":  # the groups take alternate blocks (the config's SWAPAB_BLOCKS)
        constexprs["ALT_BLOCKS"] = True
    if schedule == "alt-qkfirst":
        constexprs["QK_FIRST"] = True
    if schedule == "alt-early":
        constexprs["EARLY_RELEASE"] = True
    if schedule == "alt-pdl":  # stage 2 as a programmatic dependent (the config's PDL)
        constexprs["LAUNCH_DEPENDENTS"] = True
    if stage_out:
        constexprs["STAGE_OUT"] = True
    if named:
        constexprs["NAMED_EXCHANGE"] = True
    if balance:
        assert not single, "balanced splits need a workspace (splits > 1)"
        constexprs["BALANCE"] = 2
    if timeline:
        sig["Timeline"] = "*i64"
        constexprs["TIMELINE"] = True
    if grid:
        assert not single, "the balanced grid needs a workspace (splits > 1)"
        sig["batch"] = "i32"
        constexprs["GRID"] = True
        if timeline:  # the probe's launch gives the grid's producer the registers the groups leave
            constexprs["PRODUCER_REGS"] = gla.probe_producer_regs(cfg)
    if schedule.startswith("seesaw-stage"):
        constexprs["STAGE_ORDER"] = True
    if schedule.endswith("-prod"):
        constexprs["STAGE_PRODUCERS"] = True
    return compile_sm90a(fn, sig, constexprs, cfg["num_warps"])


# (config, H, schedule, fp8, one split, context parallel). H16 and H128 differ only in the Q box
# and SINGLE only in the epilogue's stores: each kernel is compiled at (H16, splits > 1) and
# (H128, one split), which covers both of each and keeps this test near a minute on a 2-core
# machine. A context-parallel rank's kernel differs only in its limits: one of each schedule.
# The redundant fp8 kernel, which no table rule picks since the converter warps (a config
# only), is compiled once.
# Every table rule at H >= 64 stages its output (STAGE_OUT, the "-out" names): the pair schedules
# are compiled so at H128, without it at H16, and with it once more at H16 (qlen >= 4 there).
VARIANTS = [(name, h, sched + ("-out" if h == 128 and sched != "redundant" else ""), fp8, single, False, False)
            for name in sorted(PROPOSED_CONFIGS)
            for sched, fp8 in (("alt", False), ("redundant", False), ("alt-early", True))
            for h, single in ((16, False), (128, True))]
VARIANTS += [(name, 16, "redundant", True, False, False, False) for name in sorted(PROPOSED_CONFIGS)]
VARIANTS += [(name, 128, "alt-qkfirst-out", False, False, False, False) for name in sorted(PROPOSED_CONFIGS)]
# The PDL trigger (one instruction at the CTA's start, gated by a constexpr shared by the three
# kernels): once, where it matters (splits, so a stage 2 follows).
VARIANTS += [(sorted(PROPOSED_CONFIGS)[0], 16, "alt-pdl", False, False, False, False)]
VARIANTS += [(name, h, sched + ("-out" if h == 128 else ""), False, single, False, False)
             for name in sorted(PROPOSED_CONFIGS)
             for sched in ("seesaw-prod", "seesaw-stage-prod") for h, single in ((16, False), (128, True))]
VARIANTS += [(sorted(PROPOSED_CONFIGS)[0], 16, sched, fp8, False, False, False)
             for sched, fp8 in (("alt-out", False), ("seesaw-prod-out", False), ("alt-early-out", True))]
# fp8 on the seesaw (converter warps in the producer's place: 4, or 2 per stage), once each form.
VARIANTS += [(sorted(PROPOSED_CONFIGS)[0], h, sched, True, single, False, False)
             for h, sched, single in ((16, "seesaw", False), (128, "seesaw-prod", True),
                                      (16, "seesaw-stage-prod", False))]
VARIANTS += [(sorted(PROPOSED_CONFIGS)[0], h, sched, fp8, False, True, False)
             for h, sched, fp8 in ((16, "alt", False), (16, "alt-early", True), (128, "alt-qkfirst", False),
                                   (128, "seesaw", False))]
# Ragged draft counts and draft trees (qo_indptr + tree_mask): each kernel once at H16 and once
# at H128 (their masks differ only in the tail blocks' test and the row offsets).
VARIANTS += [(sorted(PROPOSED_CONFIGS)[0], h, sched, fp8, single, False, True)
             for (h, single), (sched, fp8) in zip(((16, False), (128, True), (16, True), (128, False)),
                                                  (("alt", False), ("redundant", False),
                                                   ("alt-early", True), ("alt-qkfirst", False)))]
VARIANTS += [(sorted(PROPOSED_CONFIGS)[0], 16, "seesaw", False, False, False, True)]
# The swap-AB schedule (H < 64 only) in the table's two forms: bf16 with splits, fp8 with the
# groups taking alternate blocks (SWAPAB_BLOCKS) and one split (the launcher runs alt for draft
# trees, ragged draft counts and context-parallel ranks).
VARIANTS += [(sorted(PROPOSED_CONFIGS)[0], 16, sched, fp8, single, False, False)
             for sched, fp8, single in (("swapab", False, False), ("swapab-blocks", True, True))]
# Swap-AB with the scores split between the groups (SPLIT_SCORES, bf16 only): R 32 with splits
# and R 16 (H16 qlen 1, one unit of Q's unread rows per partial) with one split.
VARIANTS += [(sorted(PROPOSED_CONFIGS)[0], 16, sched, False, single, False, False)
             for sched, single in (("swapab-split", False), ("swapab-split16", True))]
# Swap-AB with the softmax's reductions over the keys off the block's chain (LEAN_SOFTMAX, bf16
# only): the rows' sums after the loop (1), and the row max through its own shared tile (2), at
# R 32 with splits, R 16 with one split, and with SPLIT_SCORES.
VARIANTS += [(sorted(PROPOSED_CONFIGS)[0], 16, sched, False, single, False, False)
             for sched, single in (("swapab-lean1", False), ("swapab-lean2", False), ("swapab-lean2-16", True),
                                   ("swapab-split-lean2", False))]
# The handovers between the consumer groups on named barriers (NAMED_EXCHANGE), in the table's
# forms of the two schedules that hand over: the seesaw at H128 (one split) and H16 (splits),
# fp8 alt at H128.
VARIANTS += [(sorted(PROPOSED_CONFIGS)[0], h, sched, fp8, single, False, False)
             for h, sched, fp8, single in ((128, "seesaw-stage-prod-named-out", False, True),
                                           (16, "seesaw-stage-prod-named-out", False, False),
                                           (128, "alt-early-named-out", True, False))]
# Balanced splits (BALANCE 2; only with splits): the epilogue that writes o, the split's slot or
# an lse fill by the request's pieces, after the staged and the accumulator-layout stores, the
# swap-AB one, and the fillers' work items (producer warps, converter warps).
VARIANTS += [(sorted(PROPOSED_CONFIGS)[0], h, sched, fp8, False, False, False)
             for h, sched, fp8 in ((16, "alt-bal", False), (128, "seesaw-stage-prod-named-out-bal", False),
                                   (16, "swapab-blocks-bal", True))]
# The CTA timeline probe (kernel_times.py --timeline) in the two kernels it was made to look at
# (M2's swap-AB, the seesaw of M3 / M5): the same registers and spills as without it.
VARIANTS += [(sorted(PROPOSED_CONFIGS)[0], h, sched, False, single, False, False)
             for h, sched, single in ((16, "swapab-tl", False), (128, "seesaw-stage-prod-named-out-tl", True))]
# The balanced grid (GRID, bf16 swap-AB with splits): the table's form (LEAN_SOFTMAX 1) and the
# one with SPLIT_SCORES and LEAN_SOFTMAX 2.
VARIANTS += [(sorted(PROPOSED_CONFIGS)[0], 16, sched, False, False, False, False)
             for sched in ("swapab-lean1-grid", "swapab-split-lean2-grid")]
# Its producer with the probe's segment marks.
VARIANTS += [(sorted(PROPOSED_CONFIGS)[0], 16, "swapab-lean1-grid-tl", False, False, False, False)]
# On a triton the GPU does not run (the unpinned CI job), where spills and serialization are
# not asserted, each kernel and schedule is built once, its Q box and epilogue alternating (H16
# with splits, H128 with one), plus one context-parallel and three draft-tree kernels: every
# constexpr branch of the code compiles, in half the time of the full list.
BUILD_ONLY = {("alt", False, 16), ("redundant", False, 128), ("alt-early-out", True, 128), ("redundant", True, 16),
              ("alt-qkfirst-out", False, 128), ("seesaw-prod-out", False, 128), ("seesaw-stage-prod", False, 16),
              ("seesaw-prod", True, 128), ("swapab-blocks", True, 16),
              ("seesaw-stage-prod-named-out", False, 128), ("alt-early-named-out", True, 128),
              ("alt-bal", False, 16), ("swapab-tl", False, 16), ("swapab-split", False, 16),
              ("swapab-lean2", False, 16), ("swapab-lean1-grid", False, 16),
              ("swapab-lean1-grid-tl", False, 16)}
if not _GPU_CHECKED:
    VARIANTS = [v for v in VARIANTS if (v[2], v[3], v[1]) in BUILD_ONLY and not (v[5] or v[6])
                or (v[5] and v[2] == "alt-early") or (v[6] and v[2] in ("alt", "alt-early", "seesaw"))]

def _report(name, num_heads, schedule, fp8, single, cp, drafts=False) -> dict:
    cfg = PROPOSED_CONFIGS[name]
    kernel, report = _compile(cfg, num_heads, fp8, single, schedule, cp, drafts)
    # (QK_FIRST: ptxas waits for the in-flight score wgmmas before the O rescale: warning C7517,
    # an injected wait, not a serialization of the wgmmas.)
    return ptxas_facts(kernel, report)


def _compile_all_main() -> None:  # run in a subprocess (see offline_reports)
    import json
    import sys
    for v in shard_of(VARIANTS):
        sys.stdout.write(json.dumps([list(v), _report(*v)]) + "\n")


@pytest.fixture(scope="module")
def offline_reports(tmp_path_factory):
    """All variants compiled once, in a subprocess without TRITON_INTERPRET (the test suite
    runs under the interpreter on CPU machines, and Gluon only compiles outside it).

    The CPU CI's check, with the ptxas triton ships: on a GPU machine the GPU tests below run
    the same variants, and the image's triton may pair its PTX with another ptxas (the H200's
    rejected the standalone ptxas call with status 255 while its own launches compiled)."""
    if torch.cuda.is_available():
        pytest.skip("offline sm_90a compiles are the CPU CI's check; the GPU runs the kernels")
    reports = run_once(tmp_path_factory, "tests.test_gluon_verify", "_compile_all_main", 600)
    return {tuple(k): r for k, r in reports}


# Spill bytes ptxas reports per kernel: scalars spilled once outside the block loop (checked
# in the SASS when these limits were set); the redundant bf16 kernel spills nothing.
MAX_SPILL = {("redundant", False): 0, ("redundant", True): 8, ("alt", False): 32, ("alt-qkfirst", False): 32,
             ("alt-pdl", False): 32,
             ("seesaw", False): 48, ("seesaw-prod", False): 48, ("seesaw-stage-prod", False): 120,
             ("alt-early", True): 80, ("seesaw", True): 56, ("seesaw-prod", True): 40,
             ("seesaw-stage-prod", True): 104, ("swapab", False): 8, ("swapab", True): 40,
             ("swapab-split", False): 8, ("swapab-split16", False): 8,
             ("swapab-lean1", False): 8, ("swapab-lean2", False): 8, ("swapab-lean2-16", False): 8,
             ("swapab-split-lean2", False): 8,
             ("swapab-blocks", False): 48, ("swapab-blocks", True): 104}
# (alt-early fp8, the converter partition's kernel: H16 60 bytes, H128 one split 72; in the SASS
# of H128 the first group and the converter reload nothing inside their loops, the second group
# about six words per block.)
# (seesaw: H16 8 bytes, H128 one split 44: scalars stored before the pair loop; group 1 reloads
# three of them per block pair, read in the SASS. With STAGE_ORDER group 1 keeps its P beside O
# over the other group's P.V: H16 76 bytes, H128 116; it reloads about ten words per pair.
# fp8 on the seesaw: H16 52 bytes, H128 one split 48 (the 4-warp converter 5 stores, 9 loads in
# its SASS; the first consumer group keeps 248 registers as for bf16 and spills about nothing);
# 2 converter warps per stage: 32 / 32, with STAGE_ORDER 100 / 88.)
# (swapab-blocks: bf16 44 bytes, fp8 88-96, with eight O^T accumulators per group: the first
# group reloads nothing inside its loop, the second one word per block, read in the SASS.)
# A context-parallel rank's kernel keeps a few more scalars (rank, local lengths): alt H16 spills
# 40 bytes, stored before each group's block loop and reloaded after it (read in the SASS).
CP_EXTRA_SPILL = 16
# Ragged rows and draft trees (qo_indptr + tree_mask; triton 3.6): alt 104-116 bytes, redundant
# 12-20, fp8 28. Read in the SASS of alt H16: stored before the block loop and reloaded after
# it, but for one reload per block at each group's loop head and a few in the masked tail
# blocks' tree test. The kernels without them are unchanged (their PTX is the same as before).
DRAFTS_EXTRA_SPILL = 96
# ... but the fp8 alt kernel with both (H128, one split) spills 216 bytes in all.
MAX_SPILL_DRAFTS = {("alt-early", True): 224}
# Balanced splits: the epilogue keeps both destinations' pointers and strides (o / lse and the
# workspace) and the request's piece count: alt H16 40 bytes, the seesaw 12, swap-AB 20,
# swapab-blocks fp8 100, fp8 seesaw 108 (52 without). Read in the SASS of alt H16, swap-AB and
# the fp8 seesaw: stored before the groups' block loops and reloaded after them; the loops
# reload what they did without the key.
BALANCE_EXTRA_SPILL = 56
# The balanced grid: the segment loop's scalars (the CTA's unit range, the next request's first
# unit, the ring's block count) and the epilogue's two destinations: 44 bytes with LEAN_SOFTMAX 1
# and with SPLIT_SCORES + LEAN_SOFTMAX 2 (swap-AB alone: 0). Read in the SASS of the first: the
# kernel's arguments stored at its start and reloaded once per segment, outside the block loops;
# the producer warp (24 registers) keeps one word in local memory across its segment loop.
GRID_EXTRA_SPILL = 48


@pytest.mark.skipif(_BUILD_WHY is not None, reason=f"no Gluon API of the kernels here: {_BUILD_WHY}")
@pytest.mark.parametrize("variant", VARIANTS, ids=["{}-H{}-{}-{}-{}{}{}".format(
    n, h, s, "fp8" if f else "bf16", "splits1" if g else "splitsN", "-cp2" if c else "",
    "-drafts" if d else "") for n, h, s, f, g, c, d in VARIANTS])
def test_offline_compile_sm90a(variant, offline_reports):
    """Every launch variant of each proposed config: an sm_90a cubin with wgmma and TMA, (almost)
    no spills, no serialized wgmma, registers within the warp-specialize budget, shared memory
    within 227 KB. (H16 and H128 differ in the Q box; qlen, H, page size and the split cap are
    runtime values.)"""
    name, _, schedule, fp8, _, cp, drafts = variant
    cfg = PROPOSED_CONFIGS[name]
    r = offline_reports[tuple(variant)]
    assert r["wgmma"] and r["tma"], r
    # The PDL trigger is in the kernel with LAUNCH_DEPENDENTS only (the others are unchanged).
    assert r["launch_dependents"] == (schedule == "alt-pdl"), r
    # The timeline probe's clock reads: at the start and the end (and at a balanced CTA's early
    # return); none without it.
    timeline = schedule.endswith("-tl")
    assert r["timeline"] >= 2 if timeline else r["timeline"] == 0, r
    schedule = schedule.removesuffix("-tl")
    # (the spill limits below hold with STAGE_OUT, NAMED_EXCHANGE and the probe too)
    balance = schedule.endswith("-bal")
    grid = schedule.endswith("-grid")
    schedule = schedule.removesuffix("-bal").removesuffix("-grid").removesuffix("-out").removesuffix("-named")
    if _GPU_CHECKED:
        # Serialized wgmmas and spills are facts of the compiler the GPU runs (triton 3.6): on
        # 3.9 the seesaw kernel's wgmmas are serialized for register pressure (C7512), but the
        # GPU never runs it there (``gluon_available``).
        assert not r["serialized"], r
        limit = (MAX_SPILL[(schedule, fp8)] + (CP_EXTRA_SPILL if cp else 0) + (DRAFTS_EXTRA_SPILL if drafts else 0)
                 + (BALANCE_EXTRA_SPILL if balance else 0) + (GRID_EXTRA_SPILL if grid else 0))
        if drafts:
            limit = max(limit, MAX_SPILL_DRAFTS.get((schedule, fp8), 0))
        assert r["spills"] <= limit, r
    # 12 warps launched (consumer group, consumer group, producer warp padded to a group): the
    # launch allocation is at most 65536 / 384 registers; setmaxnreg then moves them around.
    assert r["regs"] * 384 <= 65536, r
    filler = gla.probe_producer_regs(cfg) if grid and timeline else _filler_regs(cfg, schedule, fp8)
    assert cfg["CONSUMER_REGS"] in r["setmaxnreg"] and filler in r["setmaxnreg"], r
    assert 2 * cfg["CONSUMER_REGS"] + filler <= 3 * (65536 // 384 // 8 * 8), cfg
    assert r["shared"] <= SMEM_LIMIT, r


# --- which launches the Gluon family takes (CPU: the GPU is the mocked platform) ------------------


@pytest.mark.parametrize("qlen,heads,tree,ragged,cp,takes", [
    (1, 16, False, False, False, True), (2, 16, False, False, False, True), (1, 32, False, False, False, True),
    (4, 8, False, False, False, True), (3, 16, False, False, False, False), (2, 32, False, False, False, False),
    (1, 64, False, False, False, False), (1, 128, False, False, False, False), (2, 16, True, False, False, False),
    (2, 16, False, True, False, False), (2, 16, False, False, True, False)])
def test_swapab_takes_requests_of_at_most_32_rows(qlen, heads, tree, ragged, cp, takes):
    """The swap-AB schedule runs a launch whose requests have at most 32 rows (H < 64), without
    draft trees, ragged draft counts or context parallelism; the launcher runs alt for the
    others (a config or table rule naming it stays valid for every launch)."""
    assert gla.swapab_takes(qlen, heads, tree=tree, ragged=ragged, context_parallel=cp) is takes


def _recorded_launch(qlen, heads, cfg, monkeypatch, tree=False, splits=1, balance=0, fp8=False):
    """``launch_verify_stage1_gluon`` with ``cfg`` on a small bf16 (``fp8``: e4m3) case (CPU:
    descriptors and the launch recorded, not run), ``splits`` (a workspace when > 1) and the
    launcher's ``balance``: ``(kernel, its keyword arguments)``."""
    if gla._gk is None:
        pytest.skip("the Gluon kernels do not import here")
    seen = {}
    monkeypatch.setattr(gla, "_descriptors", lambda *a: ("q_desc", "k_desc"))
    monkeypatch.setattr(gla, "launch", lambda fn, grid, *args, **kw: seen.update(fn=fn, kw=kw, grid=grid))
    B, page = 2, 64
    q = torch.randn(B * qlen, heads, LK, dtype=torch.bfloat16)
    k = torch.randn(4, page, 1, LK, dtype=torch.bfloat16)
    if fp8:
        k = k.to(torch.float8_e4m3fn)
    table = torch.zeros(B, 4, dtype=torch.int32)
    lens = torch.full((B,), 100, dtype=torch.int32)
    o = torch.empty(B * qlen, heads, LV, dtype=torch.bfloat16)
    lse = torch.empty(B * qlen, heads, dtype=torch.float32)
    tree_mask = torch.ones(B * qlen, qlen, dtype=torch.int64) if tree else None
    mid = torch.empty(B * qlen, heads, splits, LV + 1) if splits > 1 else None
    gla.launch_verify_stage1_gluon(q, k, torch.ones(()), table, lens, lens, False, o, lse, mid, qlen, splits, 0.1,
                                   page, LV, cfg, tree_mask=tree_mask, balance=balance)
    _recorded_launch.grid = seen["grid"]
    return seen["fn"], seen["kw"]


@pytest.mark.parametrize("qlen,cfg,fp8,tree,splits,passed", [
    (2, {}, False, False, 4, True), (1, {}, False, False, 4, True), (2, {"SPLIT_SCORES": 1}, False, False, 4, True),
    (2, {}, False, False, 1, False), (2, {}, True, False, 4, False), (3, {}, False, False, 4, False),
    (2, {}, False, True, 4, False), (2, {"SWAPAB_BLOCKS": 1}, False, False, 4, False),
    (2, {"BALANCE": 2}, False, False, 4, False)])
@pytest.mark.parametrize("key", [0, 1])
def test_grid_reaches_the_bf16_swapab_kernel_with_splits_only(qlen, cfg, fp8, tree, splits, passed, key,
                                                              monkeypatch):
    """GRID runs the swap-AB kernel of a bf16 cache with a workspace on the balanced grid (one
    CTA per SM, the batch and REQUEST_COST passed), only when set; a single split, an fp8 cache,
    draft trees, alt (what swap-AB does not take), SWAPAB_BLOCKS and BALANCE run the grid of
    (row block, request, split) without the keys, as ``grid_takes`` tells the launcher's stage 2."""
    from mla_ops.platform import current

    full = {"SCHEDULE": "swapab", "GRID": key, "REQUEST_COST": 3, **cfg}
    _, kw = _recorded_launch(qlen, 16, full, monkeypatch, tree=tree, splits=splits, fp8=fp8,
                             balance=cfg.get("BALANCE", 0) if splits > 1 else 0)
    on = bool(key and passed)
    assert gla.grid_takes(full, qlen, 16, fp8=fp8, tree=tree, ragged=False, context_parallel=False,
                          single=splits == 1) is on
    assert kw.get("GRID") == (True if on else None)
    assert (kw.get("batch"), kw.get("REQUEST_COST")) == ((2, 3) if on else (None, None))
    assert _recorded_launch.grid == ((current().sm_count,) if on else (gla.gluon_row_blocks(qlen, 16) * 2 * splits,))


@pytest.mark.parametrize("schedule,heads,qlen", [("alt", 16, 4), ("seesaw", 128, 1), ("swapab", 16, 2),
                                                 ("redundant", 16, 4)])
@pytest.mark.parametrize("splits,balance,passed", [(4, 2, 2), (4, 0, None), (1, 2, None)])
def test_balance_reaches_every_schedule_with_splits(schedule, heads, qlen, splits, balance, passed, monkeypatch):
    """The launcher passes BALANCE to every schedule's kernel when the launch balances and has a
    workspace, and not otherwise (without it each kernel is the one before the key)."""
    _, kw = _recorded_launch(qlen, heads, {"SCHEDULE": schedule}, monkeypatch, splits=splits, balance=balance)
    assert kw.get("BALANCE") == passed


def test_cta_timeline_reaches_the_launch_only_inside(monkeypatch):
    """``gluon_launch.cta_timeline``: the launch inside it passes the buffer and TIMELINE (each
    kernel's probe), outside it neither (the kernel without the probe); every call inside takes
    the full launch path (a replay would not pass the buffer), the setting restored after; a
    buffer too short for the grid or of another kind is refused by name."""
    from mla_ops import fastpath

    monkeypatch.setenv(fastpath.ENV_OFF, "0")
    grid = gla.gluon_row_blocks(2, 16) * 2 * 4  # _recorded_launch: 2 requests, 4 splits
    buf = torch.full((grid, gla.TIMELINE_SLOTS), -1, dtype=torch.int64)
    with gla.cta_timeline(buf):
        assert os.environ[fastpath.ENV_OFF] == "1" and fastpath.status() is not None
        _, kw = _recorded_launch(2, 16, {"SCHEDULE": "swapab"}, monkeypatch, splits=4)
        assert kw["Timeline"] is buf and kw["TIMELINE"] is True
        with pytest.raises(ValueError, match="^cta_timeline: a buffer of 1 rows"):
            with gla.cta_timeline(buf[:1]):
                _recorded_launch(2, 16, {"SCHEDULE": "swapab"}, monkeypatch, splits=4)
    assert os.environ[fastpath.ENV_OFF] == "0"
    _, kw = _recorded_launch(2, 16, {"SCHEDULE": "swapab"}, monkeypatch, splits=4)
    assert "Timeline" not in kw and "TIMELINE" not in kw
    for bad in (buf.int(), buf[:, :3], buf[0]):
        with pytest.raises(ValueError, match=r"^buffer: expected a \[grid, 16\] int64 tensor"):
            with gla.cta_timeline(bad):
                pass


@pytest.mark.parametrize("qlen,heads,tree,kernel,rows", [
    (2, 16, False, "_verify_stage1_swapab", 32), (1, 16, False, "_verify_stage1_swapab", 16),
    (1, 32, False, "_verify_stage1_swapab", 32), (3, 16, False, "_verify_stage1_alt", None),
    (2, 16, True, "_verify_stage1_alt", None)])
@pytest.mark.parametrize("blocks", [0, 1])
def test_swapab_config_launches_the_kernel_that_takes_it(qlen, heads, tree, kernel, rows, blocks, monkeypatch):
    """The launcher with ``SCHEDULE: swapab``: the swap-AB kernel with ROWS 16 / 32 and
    ALT_BLOCKS as the config's SWAPAB_BLOCKS where ``swapab_takes``, the alt kernel (with its
    own keys) otherwise."""
    fn, kw = _recorded_launch(qlen, heads, {"SCHEDULE": "swapab", "SWAPAB_BLOCKS": blocks}, monkeypatch, tree)
    assert fn is getattr(gla._gk, kernel)
    assert kw.get("ROWS") == rows
    assert kw.get("ALT_BLOCKS") == (bool(blocks) if rows else None)


@pytest.mark.parametrize("qlen,cfg,fp8,passed", [
    (2, {}, False, True), (1, {}, False, True), (2, {"SWAPAB_BLOCKS": 1}, False, None), (2, {}, True, None),
    (3, {}, False, None)])
@pytest.mark.parametrize("key", [0, 1])
def test_split_scores_reaches_the_bf16_swapab_kernel_only(qlen, cfg, fp8, passed, key, monkeypatch):
    """SPLIT_SCORES is passed to the swap-AB kernel of a bf16 cache without SWAPAB_BLOCKS, only
    when set (the fp8 converter stages blocks in the Q rows its partials would use; alt, which
    runs what swap-AB does not take, has no such key)."""
    fn, kw = _recorded_launch(qlen, 16, {"SCHEDULE": "swapab", "SPLIT_SCORES": key, **cfg}, monkeypatch, fp8=fp8)
    assert fn is (gla._gk._verify_stage1_swapab if qlen <= 2 else gla._gk._verify_stage1_alt)
    assert kw.get("SPLIT_SCORES") == (passed if key else None)


@pytest.mark.parametrize("qlen,cfg,fp8,passed", [
    (2, {}, False, True), (1, {}, False, True), (2, {"SPLIT_SCORES": 1}, False, True),
    (2, {"SWAPAB_BLOCKS": 1}, False, None), (2, {}, True, None), (3, {}, False, None)])
@pytest.mark.parametrize("key", [0, 1, 2])
def test_lean_softmax_reaches_the_bf16_swapab_kernel_only(qlen, cfg, fp8, passed, key, monkeypatch):
    """LEAN_SOFTMAX is passed, as its value, to the swap-AB kernel of a bf16 cache without
    SWAPAB_BLOCKS, only when set (the fp8 and the alternate-blocks consumers keep triton's
    reductions; alt, which runs what swap-AB does not take, has no such key)."""
    fn, kw = _recorded_launch(qlen, 16, {"SCHEDULE": "swapab", "LEAN_SOFTMAX": key, **cfg}, monkeypatch, fp8=fp8)
    assert fn is (gla._gk._verify_stage1_swapab if qlen <= 2 else gla._gk._verify_stage1_alt)
    assert kw.get("LEAN_SOFTMAX") == (key if key and passed else None)


@pytest.mark.parametrize("schedule,heads,qlen,kernel,named", [
    ("alt", 16, 4, "_verify_stage1_alt", True), ("seesaw", 128, 1, "_verify_stage1_seesaw", True),
    ("swapab", 16, 2, "_verify_stage1_swapab", None), ("redundant", 16, 4, "_verify_stage1_ws", None),
    ("swapab", 16, 3, "_verify_stage1_alt", True)])
@pytest.mark.parametrize("key", [0, 1])
def test_named_exchange_reaches_the_schedules_that_hand_over(schedule, heads, qlen, kernel, named, key,
                                                             monkeypatch):
    """NAMED_EXCHANGE is passed to the two schedules whose consumer groups hand P over (alt,
    also where swap-AB gives a launch to alt, and the seesaw), only when set (without it the
    kernel is the one before the key), and never to the others."""
    fn, kw = _recorded_launch(qlen, heads, {"SCHEDULE": schedule, "NAMED_EXCHANGE": key}, monkeypatch)
    assert fn is getattr(gla._gk, kernel)
    assert kw.get("NAMED_EXCHANGE") == (named if key else None)


# (mocked arch, page size, the reason contains; None: the family covers the launch)
ROUTES = [("sm_90", 64, None), ("sm_90", 128, None), ("sm_90", 16, "page_size 16"),
          ("sm_90", 32, "page_size 32"), ("sm_90", 96, "page_size 96"),
          ("sm_80", 64, "sm_90 only"), ("sm_100", 64, "sm_90 only"), ("gfx942", 64, "HIP")]


@pytest.mark.parametrize("arch,page_size,why", ROUTES,
                         ids=[f"{a}-p{p}" for a, p, _ in ROUTES])
def test_gluon_fact_follows_the_platform_and_the_page_size(arch, page_size, why, monkeypatch):
    """The fact the table routes on, on a mocked GPU (``sm90_reason`` asks
    ``platform.current()``, so the mock reaches it on any machine): the Gluon stage 1 covers a
    bf16 launch at 576 / 512 on sm_90 only, and only pages of whole 64-token KV blocks (a block
    is one TMA box inside one page). The triton-version gate is lifted so that the rules after
    it are reached whatever triton runs the test."""
    monkeypatch.setattr(gla, "gluon_available", lambda: None)
    with mock_platform(arch, interpret=False):
        got = gla.gluon_unsupported_shape(torch.device("cuda"), torch.bfloat16, torch.bfloat16,
                                          16, LK, LV, page_size)
    if why is None:
        assert got is None
    else:
        assert got is not None and why in got, got


# --- GPU correctness -----------------------------------------------------------------------------

needs_hopper = pytest.mark.skipif(not _is_hopper() or _GLUON_WHY is not None,
                                  reason=f"the Gluon kernel runs on sm_90 with a GPU-checked triton only ({_GLUON_WHY})")


def make_case(B, H, qlen, L, page_size, fp8=False, layout="4d", real=None, seed=0, device="cuda",
              extra_pages=3, lens=None):
    """Random q and cache (never zeros), pages of every request drawn by a random permutation,
    the cache NaN past each request's end (and on unused pages). ``layout``: ``4d``
    ``[pages, page, 1, Lk]``, ``3d`` ``[pages * page, 1, Lk]``, ``xlayer`` layer 1 of a
    ``[pages, page, 3, Lk]`` cross-layer cache. ``lens``: per-request L (default all L);
    ``real``: per-request real lengths or None."""
    g = torch.Generator(device=device).manual_seed(seed)
    lens = list(lens) if lens is not None else [L] * B
    pages_per_req = max(1, math.ceil(max(max(lens), 1) / page_size))
    num_pages = B * pages_per_req + extra_pages
    perm = torch.randperm(num_pages, generator=g, device=device)[: B * pages_per_req]
    table = perm.view(B, pages_per_req).to(torch.int32)
    k_scale = None
    layers = 3 if layout == "xlayer" else 1
    full = torch.randn(num_pages, page_size, layers, LK, generator=g, device=device)
    if fp8:
        k_scale = torch.tensor(0.25, dtype=torch.float32, device=device)
        full = (full * 2.0).to(FP8)
    else:
        full = full.to(torch.bfloat16)
    # NaN past each request's end and on pages no request uses.
    used = torch.zeros(num_pages, page_size, dtype=torch.bool, device=device)
    for b, n in enumerate(lens):
        for j in range(pages_per_req):
            used[table[b, j], : max(0, min(page_size, n - j * page_size))] = True
    if fp8:
        full.view(torch.uint8)[~used] = 0x7F  # e4m3fn NaN
    else:
        full[~used] = float("nan")
    if layout == "xlayer":
        k = full[:, :, 1:2, :]
    elif layout == "3d":
        k = full.view(num_pages * page_size, 1, LK)
    else:
        k = full
    q = (0.5 * torch.randn(B * qlen, H, LK, generator=g, device=device)).to(torch.bfloat16)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    real_t = None if real is None else torch.tensor(real, dtype=torch.int32, device=device)
    return dict(q=q, k=k, table=table, seq_lens=seq_lens, real=real_t, qlen=qlen,
                page_size=page_size, k_scale=k_scale)


def gluon_verify(c, num_kv_splits, cfg=None, outs=None):
    """The op through the Gluon stage 1 (+ the portable stage 2 for a split cap > 1), outputs
    poisoned with NaN first. Returns (o, lse)."""
    cfg = {**gla.GLUON_DEFAULT_CONFIG, **(cfg or {})}
    q = c["q"]
    rows, heads = q.shape[:2]
    if outs is None:
        o = torch.full((rows, heads, LV), float("nan"), dtype=q.dtype, device=q.device)
        lse = torch.full((rows, heads), float("nan"), dtype=torch.float32, device=q.device)
        mid = None
        if num_kv_splits > 1:
            mid = torch.full((rows, heads, num_kv_splits, LV + 1), float("nan"),
                             dtype=torch.float32, device=q.device)
    else:
        o, lse, mid = outs
    why = gla.gluon_unsupported_reason(q, c["k"], c["page_size"], LV, cfg)
    assert why is None, why
    k_scale = c["k_scale"] if c["k_scale"] is not None else torch.ones((), dtype=torch.float32, device=q.device)
    has_real = c["real"] is not None
    real = c["real"] if has_real else c["seq_lens"]
    # PDL: stage 2 a programmatic dependent of stage 1, which lets it launch from its start.
    pdl = bool(cfg.get("PDL")) and num_kv_splits > 1
    balance = cfg.get("BALANCE", 0) if num_kv_splits > 1 else 0  # balanced splits need a workspace
    # the balanced grid leaves its partials as balanced splits do (stage 2 reads every slot)
    pieces = balance or gla.grid_takes(cfg, c["qlen"], heads, fp8=c["k"].dtype == FP8, tree=False, ragged=False,
                                       context_parallel=False, single=num_kv_splits == 1)
    gla.launch_verify_stage1_gluon(q, c["k"], k_scale, c["table"], c["seq_lens"], real, has_real, o,
                                   lse, mid, c["qlen"], num_kv_splits, SM_SCALE, c["page_size"], LV, cfg,
                                   launch_dependents=pdl, balance=balance)
    if num_kv_splits > 1:  # the portable stage 2, as the launcher runs it after Gluon
        stage2 = {**cfg, "S2_BLOCK_S": 8, "S2_BLOCK_DV": 0, "s2_num_warps": 4}
        capacity = cache_bounds(c["k"], c["table"], c["page_size"])[1]
        launch._launch_stage2(stage2, mid, o, lse, c["seq_lens"], real, has_real,
                              mid.stride()[:3], c["qlen"], heads, num_kv_splits, LV, None, pdl,
                              capacity, balance=pieces)
    return o, lse


def reference(c, dtype):
    return decode_verify_ref(c["q"], c["k"], LV, c["table"], c["seq_lens"], c["real"], c["qlen"],
                             SM_SCALE, c["page_size"], c["k_scale"], compute_dtype=dtype)


def check(c, o, lse):
    """The tests' tolerance rule (``builders.assert_accurate``) against float64, plain PyTorch
    in bf16 the yardstick; exact -inf / 0 for rows without a key, no NaN."""
    ref_o, ref_lse = reference(c, torch.float64)
    pt_o, pt_lse = reference(c, torch.bfloat16)
    dead = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), dead), "rows without a key must have lse -inf, and only they"
    assert (o[dead] == 0).all(), "rows without a key must have o = 0"
    assert_accurate("o", o, ref_o, pt_o, torch.bfloat16)
    assert_accurate("lse", lse, ref_lse, pt_lse, torch.bfloat16)


# (id, B, H, qlen, L or per-request lens, page, fp8, layout, real lens, split caps)
GPU_CASES = [
    ("H16-q2-B3-p64-4d", 3, 16, 2, [700, 64, 1000], 64, False, "4d", None, (1, 3, 8)),
    ("H16-q1-B2-p64-3d", 2, 16, 1, [513, 77], 64, False, "3d", None, (1, 4)),
    ("H16-q4-B2-p128-xlayer", 2, 16, 4, [900, 130], 128, False, "xlayer", None, (1, 3)),
    ("H16-q8-B2-p64-real", 2, 16, 8, [300, 5], 64, False, "4d", [290, 0], (1, 2)),
    ("H16-q3-B4-p64-short", 4, 16, 3, [2, 1, 3, 200], 64, False, "4d", None, (1, 2)),
    ("H16-q5-B2-p128-real", 2, 16, 5, [1024, 129], 128, False, "3d", [1024, 3], (1, 5)),
    ("H128-q1-B2-p64-4d", 2, 128, 1, [600, 65], 64, False, "4d", None, (1, 3)),
    ("H128-q2-B2-p128-xlayer", 2, 128, 2, [777, 1], 128, False, "xlayer", [700, 1], (1, 4)),
    ("H128-q4-B1-p64-3d", 1, 128, 4, [400], 64, False, "3d", None, (1, 2)),
    ("H32-q2-B2-p64-4d", 2, 32, 2, [333, 64], 64, False, "4d", None, (1, 2)),
    ("fp8-H16-q2-B3-p64-4d", 3, 16, 2, [700, 64, 1000], 64, True, "4d", None, (1, 3)),
    ("fp8-H16-q4-B2-p128-xlayer", 2, 16, 4, [500, 3], 128, True, "xlayer", [500, 0], (1, 2)),
    ("fp8-H128-q2-B2-p64-3d", 2, 128, 2, [640, 100], 64, True, "3d", None, (1, 3)),
    ("fp8-H16-q8-B1-p64-real", 1, 16, 8, [1500], 64, True, "4d", [1400], (1, 8)),
]


SCHEDULES = {"alt": {"SCHEDULE": "alt"}, "alt-qkfirst": {"SCHEDULE": "alt", "QK_FIRST": 1},
             "alt-early": {"SCHEDULE": "alt", "EARLY_RELEASE": 1},
             "seesaw": {"SCHEDULE": "seesaw"}, "seesaw-stage": {"SCHEDULE": "seesaw", "STAGE_ORDER": 1},
             "seesaw-prod": {"SCHEDULE": "seesaw", "STAGE_PRODUCERS": 1},
             "seesaw-stage-prod": {"SCHEDULE": "seesaw", "STAGE_ORDER": 1, "STAGE_PRODUCERS": 1},
             "redundant": {"SCHEDULE": "redundant"},
             # stage 2 as stage 1's programmatic dependent, scheduled from stage 1's start
             "alt-pdl": {"SCHEDULE": "alt", "PDL": 1}, "alt-early-pdl": {"SCHEDULE": "alt", "EARLY_RELEASE": 1, "PDL": 1},
             "seesaw-prod-pdl": {"SCHEDULE": "seesaw", "STAGE_PRODUCERS": 1, "PDL": 1},
             # o through shared memory, coalesced (STAGE_OUT)
             "alt-stageout": {"SCHEDULE": "alt", "STAGE_OUT": 1},
             "alt-early-stageout": {"SCHEDULE": "alt", "EARLY_RELEASE": 1, "STAGE_OUT": 1},
             "seesaw-stage-prod-stageout": {"SCHEDULE": "seesaw", "STAGE_ORDER": 1, "STAGE_PRODUCERS": 1,
                                            "STAGE_OUT": 1},
             # keys as the wgmma's M, rows as N (the cases of <= 32 rows per request: H16 q1/q2;
             # the others run alt)
             "swapab": {"SCHEDULE": "swapab"},
             # the same, the two groups taking alternate blocks (all of O^T each, merged at the end)
             "swapab-blocks": {"SCHEDULE": "swapab", "SWAPAB_BLOCKS": 1},
             # the same, each group the scores over its own half of the columns (bf16; fp8 runs
             # plain swap-AB)
             "swapab-split": {"SCHEDULE": "swapab", "SPLIT_SCORES": 1},
             # the same, the softmax's reductions over the keys off the block's chain (bf16; fp8 runs
             # plain swap-AB): the rows' sums after the loop, and the row max by one barrier
             "swapab-lean1": {"SCHEDULE": "swapab", "LEAN_SOFTMAX": 1},
             "swapab-lean2": {"SCHEDULE": "swapab", "LEAN_SOFTMAX": 2},
             "swapab-split-lean2": {"SCHEDULE": "swapab", "SPLIT_SCORES": 1, "LEAN_SOFTMAX": 2},
             # the handovers between the consumer groups on named barriers (NAMED_EXCHANGE)
             "alt-named": {"SCHEDULE": "alt", "NAMED_EXCHANGE": 1},
             "alt-qkfirst-named": {"SCHEDULE": "alt", "QK_FIRST": 1, "NAMED_EXCHANGE": 1},
             "alt-early-stageout-named": {"SCHEDULE": "alt", "EARLY_RELEASE": 1, "STAGE_OUT": 1, "NAMED_EXCHANGE": 1},
             "seesaw-named": {"SCHEDULE": "seesaw", "NAMED_EXCHANGE": 1},
             "seesaw-stage-prod-stageout-named": {"SCHEDULE": "seesaw", "STAGE_ORDER": 1, "STAGE_PRODUCERS": 1,
                                                  "STAGE_OUT": 1, "NAMED_EXCHANGE": 1},
             # balanced splits (pieces by the request's share of the batch's keys; with splits)
             "alt-balance": {"SCHEDULE": "alt", "BALANCE": 2},
             "alt-early-stageout-balance": {"SCHEDULE": "alt", "EARLY_RELEASE": 1, "STAGE_OUT": 1, "BALANCE": 2},
             "seesaw-stage-prod-stageout-named-balance": {"SCHEDULE": "seesaw", "STAGE_ORDER": 1,
                                                          "STAGE_PRODUCERS": 1, "STAGE_OUT": 1,
                                                          "NAMED_EXCHANGE": 1, "BALANCE": 2},
             "redundant-balance": {"SCHEDULE": "redundant", "BALANCE": 2},
             "swapab-balance": {"SCHEDULE": "swapab", "BALANCE": 2},
             "swapab-blocks-balance": {"SCHEDULE": "swapab", "SWAPAB_BLOCKS": 1, "BALANCE": 3},
             "swapab-split-balance": {"SCHEDULE": "swapab", "SPLIT_SCORES": 1, "BALANCE": 2},
             "swapab-lean2-balance": {"SCHEDULE": "swapab", "LEAN_SOFTMAX": 2, "BALANCE": 2},
             # the balanced grid (one CTA per SM, each an equal share of the batch's blocks across
             # requests; bf16 swap-AB with splits, the others run without it)
             "swapab-lean1-grid": {"SCHEDULE": "swapab", "LEAN_SOFTMAX": 1, "GRID": 1},
             "swapab-split-lean2-grid": {"SCHEDULE": "swapab", "SPLIT_SCORES": 1, "LEAN_SOFTMAX": 2, "GRID": 1}}

# Cases only the swap-AB schedule takes besides GPU_CASES' H16 q1 / q2: H32 q1 (32 rows of one
# token) on a cross-layer cache with pages of 128, H16 q1 fp8 with padded drafts, H8 q4 (8
# heads, four tokens), H16 q2 fp8 with 16 splits of a long request beside one of a single key.
SWAPAB_CASES = [
    ("H32-q1-B3-p128-xlayer", 3, 32, 1, [900, 1, 300], 128, False, "xlayer", None, (1, 4)),
    ("fp8-H16-q1-B2-p64-real", 2, 16, 1, [777, 64], 64, True, "3d", [700, 64], (1, 4)),
    ("H8-q4-B2-p64-4d", 2, 8, 4, [500, 70], 64, False, "4d", None, (1, 2)),
    ("fp8-H16-q2-B2-p64-long", 2, 16, 2, [4000, 1], 64, True, "4d", None, (1, 16)),
]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("case", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gluon_matches_reference(case, schedule):
    _check_case(case, SCHEDULES[schedule])


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("case", SWAPAB_CASES, ids=[c[0] for c in SWAPAB_CASES])
@pytest.mark.parametrize("schedule", ["swapab", "swapab-blocks", "swapab-balance", "swapab-blocks-balance",
                                      "swapab-split", "swapab-split-balance", "swapab-lean1", "swapab-lean2",
                                      "swapab-split-lean2", "swapab-lean2-balance"])
def test_gluon_swapab_matches_reference(case, schedule):
    _check_case(case, SCHEDULES[schedule])


# The balanced grid's own cases (bf16, rows of a request <= 32: the launches it takes):
# ragged lengths with a request of one key beside long ones, padded drafts with a request of no
# real key, more requests than one step of the kernel's passes over the lengths (128), a batch
# one request dominates (the kernel narrows the grid to the slots), H8 q4 of equal lengths;
# caps from 2 up to the grid's own (None: ``splits.grid_num_kv_splits``).
GRID_CASES = [
    ("H16-q2-B6-ragged", 6, 16, 2, [4000, 64, 1, 900, 2500, 130], 64, None, (2, 4, None)),
    ("H16-q1-B5-real-p128", 5, 16, 1, [3000, 200, 1200, 70, 5], 128, [2990, 0, 1200, 70, 5], (3, None)),
    ("H16-q2-B150", 150, 16, 2, [1 + (i * 977) % 3000 for i in range(150)], 64, None, (2, None)),
    ("H16-q2-B3-dominant", 3, 16, 2, [8000, 1, 64], 64, None, (2, 5, None)),
    ("H8-q4-B40-equal", 40, 8, 4, [2048] * 40, 64, None, (None,)),
]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("schedule", ["swapab-lean1-grid", "swapab-split-lean2-grid"])
@pytest.mark.parametrize("case", GRID_CASES, ids=[c[0] for c in GRID_CASES])
def test_gluon_grid_matches_reference(case, schedule):
    """The balanced grid meets the rule, and its workspace shows the segments of the host's
    mirror of the kernel's arithmetic (``splits.grid_segments``): a request of one segment went
    straight to o (slot 1's lse +inf), one of k segments has every slot below k written (no
    NaN) and -inf past k."""
    from mla_ops.decode_verify.splits import grid_num_kv_splits, grid_segments
    from mla_ops.platform import current

    _, B, H, qlen, lens, page, real, caps = case
    cfg = {**gla.GLUON_DEFAULT_CONFIG, **SCHEDULES[schedule]}
    c = make_case(B, H, qlen, None, page, real=real, lens=lens, seed=B + qlen)
    capacity = cache_bounds(c["k"], c["table"], c["page_size"])[1]
    keys = [min(max(min(n, r), 0), capacity) for n, r in zip(lens, real or lens)]
    sms = current().sm_count  # the grid the launcher runs
    for cap in caps:
        cap = cap or grid_num_kv_splits(B, sms)
        rows = B * qlen
        o = torch.full((rows, H, LV), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((rows, H), float("nan"), dtype=torch.float32, device="cuda")
        mid = torch.full((rows, H, cap, LV + 1), float("nan"), dtype=torch.float32, device="cuda")
        gluon_verify(c, cap, cfg, outs=(o, lse, mid))
        torch.cuda.synchronize()
        check(c, o, lse)
        segments = {}
        for cta in grid_segments(keys, sms, cap, cfg["BLOCK_N"], cfg["REQUEST_COST"]):
            for r, _, k, _, _ in cta:
                segments[r] = k
        assert sorted(segments) == list(range(B)) and max(segments.values()) <= cap
        slot_lse = mid[..., LV].view(B, qlen, H, cap)
        for r, k in segments.items():
            if k == 1:
                assert (slot_lse[r, :, :, 1] == float("inf")).all(), f"request {r}: one segment, slot 1 +inf"
            else:
                assert not slot_lse[r, :, :, :k].isnan().any(), f"request {r}: {k} segments, each slot written"
                assert (slot_lse[r, :, :, k:] == float("-inf")).all(), f"request {r}: slots past {k} unused"
        if cap == grid_num_kv_splits(B, sms):  # (a small cap may narrow the grid to one CTA a request)
            assert max(segments.values()) > 1, "the case spreads a request over CTAs"


def _check_case(case, cfg):
    _, B, H, qlen, lens, page, fp8, layout, real, caps = case
    c = make_case(B, H, qlen, None, page, fp8=fp8, layout=layout, real=real, lens=lens, seed=B + qlen)
    for splits in caps:
        o, lse = gluon_verify(c, splits, cfg)
        torch.cuda.synchronize()
        check(c, o, lse)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("fp8,schedule", [(False, "alt"), (False, "seesaw"), (False, "seesaw-stage"),
                                          (False, "seesaw-prod"), (False, "seesaw-stage-prod"),
                                          (True, "redundant"), (True, "alt-early"), (True, "seesaw"),
                                          (True, "seesaw-prod"), (True, "seesaw-stage-prod"),
                                          (False, "alt-pdl"), (False, "seesaw-prod-pdl"), (True, "alt-early-pdl"),
                                          (False, "alt-stageout"), (False, "seesaw-stage-prod-stageout"),
                                          (True, "alt-early-stageout"), (False, "seesaw-stage-prod-stageout-named"),
                                          (True, "alt-early-stageout-named"), (False, "alt-qkfirst-named"),
                                          (False, "alt-balance"), (False, "seesaw-stage-prod-stageout-named-balance"),
                                          (True, "alt-early-stageout-balance")],
                         ids=["bf16-alt", "bf16-seesaw", "bf16-seesaw-stage", "bf16-seesaw-prod",
                              "bf16-seesaw-stage-prod", "fp8-redundant", "fp8-alt-early", "fp8-seesaw",
                              "fp8-seesaw-prod", "fp8-seesaw-stage-prod", "bf16-alt-pdl", "bf16-seesaw-prod-pdl",
                              "fp8-alt-early-pdl", "bf16-alt-stageout", "bf16-seesaw-stage-prod-stageout",
                              "fp8-alt-early-stageout", "bf16-seesaw-stage-prod-stageout-named",
                              "fp8-alt-early-stageout-named", "bf16-alt-qkfirst-named", "bf16-alt-balance",
                              "bf16-seesaw-stage-prod-stageout-named-balance", "fp8-alt-early-stageout-balance"])
def test_gluon_cuda_graph_replay_new_inputs(fp8, schedule):
    _graph_replay(fp8, SCHEDULES[schedule])


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("schedule", ["swapab", "swapab-blocks", "swapab-blocks-balance", "swapab-split",
                                      "swapab-lean2", "swapab-lean1-grid"])
def test_gluon_swapab_cuda_graph_replay_new_inputs(fp8, schedule):
    _graph_replay(fp8, SCHEDULES[schedule], qlen=2)


def _graph_replay(fp8, cfg=None, qlen=3):
    """Captured once, replayed on new lengths, block tables and queries copied into the same
    tensors: the same answers as the reference each time; nothing allocated in the capture."""
    B, H, page, splits = 3, 16, 64, 4
    c = make_case(B, H, qlen, None, page, fp8=fp8, lens=[900, 300, 40], real=[900, 300, 40], seed=1)
    rows = B * qlen
    o = torch.empty(rows, H, LV, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(rows, H, dtype=torch.float32, device="cuda")
    mid = torch.empty(rows, H, splits, LV + 1, dtype=torch.float32, device="cuda")
    gluon_verify(c, splits, cfg, outs=(o, lse, mid))  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gluon_verify(c, splits, cfg, outs=(o, lse, mid))
    # New batches of the same shapes (at most 15 pages per request, so the cache and the
    # table keep their shapes): everything copied into the captured tensors.
    for seed, lens, real in [(2, [64, 901, 5], [64, 0, 5]), (3, [960, 2, 700], [959, 2, 700])]:
        n = make_case(B, H, qlen, None, page, fp8=fp8, lens=lens, real=real, seed=seed)
        for key in ("q", "k", "table", "seq_lens", "real"):
            assert c[key].shape == n[key].shape, key
            c[key].copy_(n[key])
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
        mid.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(c, o, lse)
