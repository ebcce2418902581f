"""Launch tables of the encoder attention, one per architecture, as data.

A table is a list of rules. The first rule is the architecture's base configuration; each
later rule has a ``match`` dict and overrides the keys it names when every condition holds.
Conditions (all optional):

- ``split``: ``[BLOCK_D, BLOCK_D_TAIL]`` of the launch, e.g. ``[64, 16]`` for head dims 72, 80;
- ``aligned``: the HEAD_STRIDE_ALIGNED_8 hint is on (every token/head stride % 8 == 0);
- ``head_dim_max`` / ``head_dim_min``: bounds on the real head dim;
- ``causal``: the launch is causal.

Base-rule-only key: ``unaligned_copy`` — views whose token/head strides are not multiples of 8
elements run on aligned copies instead of the hint-less kernel (sm_90: Triton 3.6 miscompiled
that kernel on the H200, see benchmarks/results/h200/README_prefill.md).

Launch keys: ``BLOCK_M``, ``BLOCK_N``, ``num_warps``, ``num_stages``, ``tma`` (K/V through
tensor descriptors; taken only where the alignment hint holds, for 16-bit dtypes), and
``waves_per_eu`` (HIP only; dropped elsewhere). The sm_90 table is ``tables/sm_90.json``, written by
``benchmarks/benchmark_vit_prefill_attn.py --sweep`` on an H200: a retune is a data change.
"""

from __future__ import annotations

import json
import os

__all__ = ["TABLES", "LAUNCH_KEYS", "table_for", "select", "SM90_TABLE_PATH", "load_table"]

LAUNCH_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "waves_per_eu", "tma")

SM90_TABLE_PATH = os.path.join(os.path.dirname(__file__), "tables", "sm_90.json")

# Anything without a table of its own (sm_80, sm_89, gfx942, the interpreter). The Ampere
# habit: 128-row blocks, 64-key tiles, 8 warps once the head dim passes 64, smaller tiles for
# the 256-wide heads whose fp32 accumulator would not fit in registers otherwise.
GENERIC = [
    {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
    {"match": {"head_dim_max": 64}, "num_warps": 4},
    {"match": {"head_dim_min": 129}, "BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
]

# Seed 001 (Radeon 8060S): the RDNA tile of vllm-project#58225 (BLOCK_N capped at 32; 4 warps
# at head dim 64, 8 above), and the narrow tile BLOCK_N=16 with 4 warps taken only for the
# (64, 16) split with the alignment hint on; a padded 72-wide view (no hint, scalar loads)
# keeps the wider tile, where the narrow one regresses (2.676 vs 2.449 ms). No waves_per_eu
# override helped, so none is set.
GFX1151 = [
    {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 8, "num_stages": 1},
    {"match": {"head_dim_max": 64}, "num_warps": 4},
    {"match": {"split": [64, 16], "aligned": True}, "BLOCK_N": 16, "num_warps": 4},
]

# Used until a sweep has written tables/sm_90.json: wgmma wants 64 rows per warpgroup, so
# 128-row blocks on 8 warps, 64-key tiles, 3 stages of cp.async.
SM90_FALLBACK = [
    {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "unaligned_copy": True},
    {"match": {"head_dim_min": 129}, "BLOCK_N": 32, "num_stages": 2},
]


def load_table(path: str) -> list[dict] | None:
    """The ``rules`` list of a sweep-written JSON table, or None when there is none."""
    try:
        with open(path) as f:
            return json.load(f)["rules"]
    except FileNotFoundError:
        return None


TABLES: dict[str, list[dict]] = {
    "generic": GENERIC,
    "gfx1151": GFX1151,
    "sm_90": load_table(SM90_TABLE_PATH) or SM90_FALLBACK,
}


def table_for(arch: str) -> list[dict]:
    return TABLES.get(arch, TABLES["generic"])


def _matches(cond: dict, facts: dict) -> bool:
    for key, want in cond.items():
        if key == "split":
            if list(facts["split"]) != list(want):
                return False
        elif key == "head_dim_max":
            if facts["head_dim"] > want:
                return False
        elif key == "head_dim_min":
            if facts["head_dim"] < want:
                return False
        elif key in ("aligned", "causal"):
            if bool(facts[key]) != bool(want):
                return False
        else:
            raise KeyError(f"unknown match condition {key!r} in a prefill launch table")
    return True


def select(arch: str, *, head_dim: int, split: tuple[int, int], aligned: bool, causal: bool) -> dict:
    """The launch configuration of ``arch`` for these facts: base rule, then matching overrides."""
    rules = table_for(arch)
    facts = {"head_dim": head_dim, "split": split, "aligned": aligned, "causal": causal}
    cfg = {k: v for k, v in rules[0].items() if k != "match"}
    for rule in rules[1:]:
        if _matches(rule.get("match", {}), facts):
            cfg.update({k: v for k, v in rule.items() if k != "match"})
    return cfg
