"""Launch configurations of the decode-verify kernels: one table per architecture, as data.

A table is an ordered list of buckets; the first bucket whose filters match a launch gives its
config, laid over :data:`VERIFY_DEFAULT_CONFIG`. Filters (all optional):

- ``max_rows``: ``batch * qlen * num_heads <= max_rows`` (``None``: any);
- ``num_heads`` / ``qlen``: a list of the values the bucket applies to.

The last bucket of a table must match everything. ``sm_90`` lives in ``tables/sm_90.json``,
written by ``benchmarks/sweep_decode_verify.py``, so a retune is a data change. Unknown
architectures use ``"default"``.

Config keys:

- ``BLOCK_H``: rows (verify token, head) per stage-1 program; ``BLOCK_N``: KV tokens per tile.
- ``num_warps`` / ``num_stages``: stage-1 launch; ``QSPLIT``: split the ``Lv``-wide part of Q,
  K and the accumulator into two halves (two narrower dots).
- ``SWAP_AB``: compute the transposed problem (``S^T = K Q^T``, ``O^T = V^T P^T``) so that the
  tile's rows are the MMA's N instead of its M: on Hopper, wgmma's M is 64 per warpgroup while
  N is any multiple of 8, so a 32-row tile (H=16, qlen=2) pads no MMA. Combines with QSPLIT.
- ``SPLIT_ALIGN`` / ``MIN_SPLIT_LEN``: a request of length L is cut into chunks of
  ``max(cdiv(L, splits), MIN_SPLIT_LEN)`` rounded up to ``SPLIT_ALIGN``.
- ``S2_BLOCK_S`` / ``s2_num_warps``: splits per step and warps of the stage-2 merge;
  ``S2_BLOCK_DV``: columns of ``o`` per stage-2 program (0: all ``Lv``), more programs for
  few rows.
- ``TMA``: load K tiles by bulk tensor copies through host-built descriptors where they apply
  (CUDA capability 9+, pages a multiple of ``BLOCK_N``, aligned strides; see
  ``launch._tma_descriptors``), else the pointer path.
- ``PDL``: launch stage 2 as a programmatic dependent of stage 1 (CUDA capability 9+), so
  its launch overlaps stage 1's tail.
- ``PERSISTENT``: 0, or stage-1 programs per SM: a grid of ``PERSISTENT * SMs`` programs loops
  over the (row block, request, split) work when there is more of it.
- HIP only: ``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack`` (launch kwargs).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from .. import platform

__all__ = [
    "VERIFY_DEFAULT_CONFIG",
    "MIN_SWAP_AB_STAGES",
    "swap_ab_stages_ok",
    "TABLES",
    "HIP_LAUNCH_KEYS",
    "select_verify_config",
    "reachable_verify_configs",
    "load_table",
]

TABLE_DIR = pathlib.Path(__file__).parent / "tables"

# The swap-AB loop unpipelined (num_stages 1) miscompiles on CUDA with Triton 3.6: on the H200
# it gave wrong results, a compile error or an illegal address depending on the tile
# (benchmarks/NOTES.md v3). The launcher refuses it there and tables must not select it.
MIN_SWAP_AB_STAGES = 2

# Launch kwargs that only exist on the HIP backend.
HIP_LAUNCH_KEYS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")

# Generic: 32-row tiles on 4 warps (mma.sync-sized), modest splits. Also the interpreter's.
VERIFY_DEFAULT_CONFIG: dict[str, Any] = {
    "BLOCK_H": 32,
    "BLOCK_N": 32,
    "num_warps": 4,
    "num_stages": 2,
    "QSPLIT": 0,
    "SWAP_AB": 0,
    "SPLIT_ALIGN": 64,
    "MIN_SPLIT_LEN": 256,
    "S2_BLOCK_S": 8,
    "s2_num_warps": 4,
    "S2_BLOCK_DV": 0,
    "TMA": 0,
    "PERSISTENT": 0,
    "PDL": 0,
}

# MI300X, as the seed describes its sweeps (bf16, page 16): few rows (B*qlen*H <= 640) take
# 32-row tiles and short splits so more KV splits fill the 304 CUs; otherwise 64-row tiles with
# Q split in two 256-wide halves and the next K tile prefetched (num_stages 2) halve the KV
# re-reads per request.
_GFX942 = {
    "arch": "gfx942",
    "source": "seed 000 (MI300X sweeps, bf16, page 16)",
    "buckets": [
        {
            "max_rows": 640,
            "config": {
                "BLOCK_H": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "QSPLIT": 0,
                "SPLIT_ALIGN": 32, "MIN_SPLIT_LEN": 128, "S2_BLOCK_S": 16, "s2_num_warps": 4,
                "waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 1,
            },
        },
        {
            "max_rows": None,
            "config": {
                "BLOCK_H": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "QSPLIT": 1,
                "SPLIT_ALIGN": 64, "MIN_SPLIT_LEN": 256, "S2_BLOCK_S": 16, "s2_num_warps": 4,
                "waves_per_eu": 1, "matrix_instr_nonkdim": 16, "kpack": 1,
            },
        },
    ],
}

_DEFAULT = {
    "arch": "default",
    "source": "generic",
    "buckets": [{"max_rows": None, "config": {}}],
}


def load_table(arch: str) -> dict[str, Any]:
    """The table ``tables/<arch>.json`` (``{"arch", "source", "buckets": [...]}``)."""
    with open(TABLE_DIR / f"{arch}.json") as f:
        table = json.load(f)
    _validate(table)
    return table


def _validate(table: dict[str, Any]) -> None:
    buckets = table["buckets"]
    last = buckets[-1]
    if any(last.get(k) is not None for k in ("max_rows", "num_heads", "qlen")):
        raise ValueError(f"config table {table['arch']}: the last bucket must match every launch")
    for b in buckets:
        unknown = set(b["config"]) - set(VERIFY_DEFAULT_CONFIG) - set(HIP_LAUNCH_KEYS)
        if unknown:
            raise ValueError(f"config table {table['arch']}: unknown config keys {sorted(unknown)}")
        cfg = {**VERIFY_DEFAULT_CONFIG, **b["config"]}
        if table["arch"].startswith("sm_") and not swap_ab_stages_ok(cfg):
            raise ValueError(f"config table {table['arch']}: SWAP_AB with num_stages "
                             f"{cfg['num_stages']} (< {MIN_SWAP_AB_STAGES}) miscompiles on CUDA")


def swap_ab_stages_ok(cfg: dict[str, Any]) -> bool:
    """False for the swap-AB loop with fewer than MIN_SWAP_AB_STAGES stages (CUDA only)."""
    return not cfg["SWAP_AB"] or cfg["num_stages"] >= MIN_SWAP_AB_STAGES


TABLES: dict[str, dict[str, Any]] = {
    "default": _DEFAULT,
    "gfx942": _GFX942,
    "sm_90": load_table("sm_90"),
}
for _t in TABLES.values():
    _validate(_t)


def _matches(bucket: dict[str, Any], rows: int, qlen: int, num_heads: int) -> bool:
    if bucket.get("max_rows") is not None and rows > bucket["max_rows"]:
        return False
    if bucket.get("num_heads") is not None and num_heads not in bucket["num_heads"]:
        return False
    if bucket.get("qlen") is not None and qlen not in bucket["qlen"]:
        return False
    return True


def _table() -> dict[str, Any]:
    return TABLES.get(platform.current().arch, TABLES["default"])


def select_verify_config(batch: int, qlen: int, num_heads: int) -> dict[str, Any]:
    """Launch config for ``batch`` requests of ``qlen`` verify tokens and ``num_heads`` heads.

    Looks up the table of ``platform.current().arch`` (``"default"`` when there is none); the
    first bucket matching ``rows = batch * qlen * num_heads`` wins. Returns a fresh dict.
    """
    rows = batch * qlen * num_heads
    for bucket in _table()["buckets"]:
        if _matches(bucket, rows, qlen, num_heads):
            cfg = dict(VERIFY_DEFAULT_CONFIG)
            cfg.update(bucket["config"])
            return cfg
    raise AssertionError("unreachable: the last bucket matches everything")


def reachable_verify_configs(qlen: int, num_heads: int) -> list[tuple[int, dict[str, Any]]]:
    """``(batch, config)`` with one representative batch for each distinct config the current
    table can select for ``qlen`` and ``num_heads``; what the warmup must compile."""
    per_batch = qlen * num_heads
    batches = {1}
    for bucket in _table()["buckets"]:
        if bucket.get("max_rows") is not None:
            edge = bucket["max_rows"] // per_batch
            batches.update(b for b in (edge, edge + 1) if b >= 1)
    seen: dict[tuple, tuple[int, dict[str, Any]]] = {}
    for batch in sorted(batches):
        cfg = select_verify_config(batch, qlen, num_heads)
        seen.setdefault(tuple(sorted(cfg.items())), (batch, cfg))
    return list(seen.values())
