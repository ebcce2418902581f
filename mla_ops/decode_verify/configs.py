"""Launch configurations of the decode-verify kernels, registered with :mod:`mla_ops.tuning`.

Facts a table rule may match (``mla_ops.tuning`` has the rule format):

- ``rows``: ``batch * qlen * num_heads``; ``num_heads``; ``qlen``;
- ``cache``: ``"fp8"`` or ``"16bit"``;
- ``gluon``: whether the sm_90 Gluon family can run this launch (CUDA capability 9, the triton
  its Gluon code is written for, a cache and head dims it covers; ``launch.py`` decides).

``tables/sm_90.json`` is written by ``benchmarks/sweep_decode_verify.py``; gfx942 has a built-in
table from MI300X sweeps; everything else uses ``"default"``.

Config keys of the ``triton`` family (the portable kernels in ``kernels.py``):

- ``BLOCK_H``: rows (verify token, head) per stage-1 program; ``BLOCK_N``: KV tokens per tile.
- ``num_warps`` / ``num_stages``: stage-1 launch; ``QSPLIT``: split the ``Lv``-wide part of Q,
  K and the accumulator into two halves (two narrower dots).
- ``SWAP_AB``: compute the transposed problem (``S^T = K Q^T``, ``O^T = V^T P^T``) so that the
  tile's rows are the MMA's N instead of its M: on Hopper, wgmma's M is 64 per warpgroup while
  N is any multiple of 8, so a 32-row tile (H=16, qlen=2) pads no MMA. Combines with QSPLIT.
- ``SPLIT_ALIGN`` / ``MIN_SPLIT_LEN``: a request of length L is cut into chunks of
  ``max(cdiv(L, splits), MIN_SPLIT_LEN)`` rounded up to ``SPLIT_ALIGN``.
- ``SPLIT_WORK``: the keys per split the split-cap heuristic (``splits.verify_num_kv_splits``)
  aims for: the portable tables were swept at 64, the Gluon family measured best at its 256.
  (M1: 66 splits, 14.4 us on the H200; 64 splits from MIN_SPLIT_LEN 128, 16.8 us.)
- ``S2_BLOCK_S`` / ``s2_num_warps``: splits per step and warps of the stage-2 merge;
  ``S2_BLOCK_DV``: columns of ``o`` per stage-2 program (0: all ``Lv``).
- ``TMA``: K tiles by bulk tensor copies through host-built descriptors where they apply
  (``launch._tma_descriptors``), else the pointer path.
- ``PDL``: stage 2 as a programmatic dependent launch of stage 1 (CUDA capability 9+); both
  families' stage 1 let it be scheduled from their start (``griddepcontrol.launch_dependents``).
- ``PERSISTENT``: 0, or stage-1 programs per SM looping over the work.
- ``BALANCE``: 0, or b >= 2: balanced splits (``splits.py``): the split cap is b times the
  equal-length count and each request takes pieces by its share of the batch's keys (stage 1
  of both families, stage 2 reading every slot). Only where the workspace has two splits or
  more; a launch of one split (no workspace) runs as without it.
- HIP only: ``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack`` (launch kwargs).

The ``gluon`` family's keys are documented with its kernels (``gluon_launch.py``); its
stage 2 is the portable one, with the ``S2_*`` / ``s2_num_warps`` / ``PDL`` keys above.
"""

from __future__ import annotations

import pathlib
from typing import Any

from .. import tuning
from .gluon_launch import GLUON_DEFAULT_CONFIG

__all__ = ["VERIFY_DEFAULT_CONFIG", "HIP_LAUNCH_KEYS", "KERNEL", "verify_facts",
           "select_verify_config"]

HIP_LAUNCH_KEYS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")

# Generic: 32-row tiles on 4 warps (mma.sync-sized), modest splits. Also the interpreter's.
VERIFY_DEFAULT_CONFIG: dict[str, Any] = {
    "BLOCK_H": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "QSPLIT": 0, "SWAP_AB": 0,
    "SPLIT_ALIGN": 64, "MIN_SPLIT_LEN": 256, "S2_BLOCK_S": 8, "s2_num_warps": 4,
    "S2_BLOCK_DV": 0, "TMA": 0, "PERSISTENT": 0, "PDL": 0, "SPLIT_WORK": 64, "BALANCE": 0,
}

# MI300X sweeps (bf16, page 16): few rows (B*qlen*H <= 640) take
# 32-row tiles and short splits so more KV splits fill the 304 CUs; otherwise 64-row tiles with
# Q split in two 256-wide halves and the next K tile prefetched (num_stages 2) halve the KV
# re-reads per request.
_GFX942 = {
    "arch": "gfx942",
    "source": "MI300X sweeps (bf16, page 16)",
    "rules": [
        {"match": {"rows_max": 640}, "config": {
            "BLOCK_H": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "QSPLIT": 0,
            "SPLIT_ALIGN": 32, "MIN_SPLIT_LEN": 128, "S2_BLOCK_S": 16, "s2_num_warps": 4,
            "waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 1}},
        {"config": {
            "BLOCK_H": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "QSPLIT": 1,
            "SPLIT_ALIGN": 64, "MIN_SPLIT_LEN": 256, "S2_BLOCK_S": 16, "s2_num_warps": 4,
            "waves_per_eu": 1, "matrix_instr_nonkdim": 16, "kpack": 1}},
    ],
}


def _check_config(cfg: dict[str, Any], where: str) -> None:
    """Configs the running compiler is known to miscompile are refused, tables included."""
    if (cfg["family"] == "triton" and cfg["SWAP_AB"] and cfg["num_stages"] < 2
            and tuning.workaround_active("swap_ab_min_stages")):
        w = tuning.WORKAROUNDS["swap_ab_min_stages"]
        raise ValueError(f"{where}: SWAP_AB with num_stages {cfg['num_stages']} is refused on "
                         f"CUDA with this triton ({w.why}); use num_stages >= 2")


# The sm_90 Gluon stage 1 (gluon_launch.py documents its keys), with the portable stage 2's
# keys for the split merge it shares.
GLUON_FAMILY_CONFIG: dict[str, Any] = {
    **GLUON_DEFAULT_CONFIG,
    "S2_BLOCK_S": 8, "s2_num_warps": 4, "S2_BLOCK_DV": 0, "PDL": 0, "SPLIT_WORK": 256,
}

KERNEL = tuning.register(tuning.Kernel(
    name="decode_verify",
    defaults={"triton": VERIFY_DEFAULT_CONFIG, "gluon": GLUON_FAMILY_CONFIG},
    facts=("rows", "num_heads", "qlen", "cache", "gluon"),
    builtin={"default": {"arch": "default", "source": "generic", "rules": [{"config": {}}]},
             "gfx942": _GFX942},
    table_dir=pathlib.Path(__file__).parent / "tables",
    extra_keys=HIP_LAUNCH_KEYS,
    check_config=_check_config,
))


def verify_facts(batch: int, qlen: int, num_heads: int, *, fp8: bool = False,
                 gluon: bool = False) -> dict[str, Any]:
    return {"rows": batch * qlen * num_heads, "num_heads": num_heads, "qlen": qlen,
            "cache": "fp8" if fp8 else "16bit", "gluon": gluon}


def select_verify_config(batch: int, qlen: int, num_heads: int, *, fp8: bool = False,
                         gluon: bool = False, config: dict[str, Any] | None = None
                         ) -> dict[str, Any]:
    """Launch config for ``batch`` requests of ``qlen`` verify tokens and ``num_heads`` heads
    on the current platform's table (``config`` laid over it). Returns a fresh dict."""
    return tuning.select("decode_verify", verify_facts(batch, qlen, num_heads, fp8=fp8,
                                                       gluon=gluon), config=config)
