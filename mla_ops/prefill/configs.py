"""Launch configurations of the encoder attention, registered with :mod:`mla_ops.tuning`.

Facts a table rule may match (``mla_ops.tuning`` has the rule format):

- ``head_dim``: the real head dim; ``split``: ``"<BLOCK_D>+<BLOCK_D_TAIL>"`` of the launch,
  e.g. ``"64+16"`` for head dims 72 and 80;
- ``aligned``: the 8-element head-stride hint holds (every token/head stride % 8 == 0);
- ``causal``: the launch is causal;
- ``gluon``: the sm_90 Gluon kernel (``gluon_launch.py``) can run this launch: a CUDA GPU of
  capability 9.0, triton 3.6, fp16/bf16, a supported split, no sliding window, every stride
  8-element aligned (``gluon_launch.gluon_unsupported_shape`` says why not). Rules of the
  ``gluon`` family must match ``"gluon": true``.

Config keys of the ``triton`` family: ``BLOCK_M``, ``BLOCK_N``, ``num_warps``, ``num_stages``,
``tma`` (K/V through tensor descriptors; taken only where the alignment hint holds, for 16-bit
dtypes), ``waves_per_eu`` (HIP only; 0: unset), and two launch choices a caller may override:
``split_head_dim`` (False pads the head dim to the next power of two instead of main + tail)
and ``aligned`` (False drops the alignment hint; True applies it only where the strides allow).

Config keys of the ``gluon`` family: ``gluon_launch.GLUON_DEFAULT_CONFIG`` (documented there).

``tables/sm_90.json`` was written by ``benchmarks/benchmark_vit_prefill_attn.py --sweep`` on an
H200: a retune is a data change.
"""

from __future__ import annotations

import pathlib
from typing import Any

from .. import tuning
from .gluon_launch import GLUON_DEFAULT_CONFIG

__all__ = ["PREFILL_DEFAULT_CONFIG", "KERNEL", "prefill_facts", "select_prefill_config"]

PREFILL_DEFAULT_CONFIG: dict[str, Any] = {
    "BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2, "tma": False,
    "waves_per_eu": 0, "split_head_dim": True, "aligned": True,
}

# Anything without a table of its own (sm_80, sm_89, gfx942, the interpreter). The Ampere
# habit: 128-row blocks, 64-key tiles, 8 warps once the head dim passes 64, smaller tiles for
# the 256-wide heads whose fp32 accumulator would not fit in registers otherwise.
_GENERIC = {
    "arch": "default",
    "source": "generic (Ampere habits)",
    "rules": [
        {"match": {"head_dim_max": 64}, "config": {"num_warps": 4}},
        {"match": {"head_dim_min": 129},
         "config": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}},
        {"config": {}},
    ],
}

# Radeon 8060S measurements: the RDNA tile of vllm-project#58225 (BLOCK_N capped at 32; 4 warps
# at head dim 64, 8 above), and the narrow tile BLOCK_N=16 with 4 warps taken only for the
# (64, 16) split with the alignment hint on; a padded 72-wide view (no hint, scalar loads)
# keeps the wider tile, where the narrow one regresses (2.676 vs 2.449 ms). No waves_per_eu
# override helped, so none is set.
_GFX1151 = {
    "arch": "gfx1151",
    "source": "Radeon 8060S measurements",
    "rules": [
        {"match": {"split": "64+16", "aligned": True},
         "config": {"BLOCK_M": 128, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}},
        {"match": {"head_dim_max": 64},
         "config": {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}},
        {"config": {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 8, "num_stages": 1}},
    ],
}

KERNEL = tuning.register(tuning.Kernel(
    name="prefill",
    defaults={"triton": PREFILL_DEFAULT_CONFIG, "gluon": GLUON_DEFAULT_CONFIG},
    facts=("head_dim", "split", "aligned", "causal", "gluon"),
    builtin={"default": _GENERIC, "gfx1151": _GFX1151},
    table_dir=pathlib.Path(__file__).parent / "tables",
))


def prefill_facts(head_dim: int, split: tuple[int, int], aligned: bool, causal: bool,
                  gluon: bool = False) -> dict:
    return {"head_dim": head_dim, "split": f"{split[0]}+{split[1]}", "aligned": bool(aligned),
            "causal": bool(causal), "gluon": bool(gluon)}


def select_prefill_config(head_dim: int, split: tuple[int, int], aligned: bool, causal: bool,
                          config: dict[str, Any] | None = None, *, gluon: bool = False
                          ) -> dict[str, Any]:
    return tuning.select("prefill", prefill_facts(head_dim, split, aligned, causal, gluon),
                         config=config)
