"""The numbers ``benchmarks/plot.py`` draws, read from the committed H200 results (no
matplotlib here: the tests check these numbers on any machine).

Decode verify: each M1–M7 shape's unique bytes (the KV once, q, o and the fp32 lse) and FLOPs
(``2·H·(Lk+Lv)·Σ row limits``: QKᵀ over 576 columns and PV over 512, causal rows only), as
``benchmarks/shapes.py`` counts them, give its arithmetic intensity (FLOP/byte); each
implementation's time gives its achieved bandwidth (unique bytes / time) and TFLOP/s. The same
work is charged to every implementation, so one that reads the KV more than once (vLLM's
one-row-per-token feed) shows a lower bandwidth, not more bytes. Encoder: TFLOP/s
``4·B·S²·H·D`` (halved when causal) per implementation and head dim.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.shapes import SHAPES, Case, flops, prefill_tflops, unique_bytes  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "h200"
# The committed files each plot reads (MANIFEST.md lists their commands).
DECODE_TABLE = RESULTS / "v22" / "decode_verify_flashmla.json"  # mla_ops: the table's launch
DECODE_ANCHORS = RESULTS / "anchors_decode.json"  # vLLM, FlashMLA, that machine's ceilings
DECODE_GRID = RESULTS / "v5" / "ab_grid_families_summary.json"  # the 48-point grid
ENCODER = RESULTS / "v6" / "prefill.json"  # P1–P8, C7, C8 with SDPA's backends
SOURCES = (DECODE_TABLE, DECODE_ANCHORS, DECODE_GRID, ENCODER)

# The H200 SXM's datasheet peaks (the measured ceilings come from DECODE_ANCHORS).
HBM_PEAK_TBPS = 4.8
BF16_DENSE_PEAK_TFLOPS = 989.4

# Encoder implementations: label -> the key prefix of a benchmark_vit_prefill_attn.py row.
ENCODER_IMPLS = {"mla_ops (table)": "mla", "mla_ops portable": "mla-triton",
                 "SDPA cuDNN": "sdpa-cudnn", "SDPA flash": "sdpa-flash"}


def _load(path: pathlib.Path) -> dict:
    with open(path) as f:
        return json.load(f)


def _work(case: Case) -> dict:
    nbytes, nflops = unique_bytes(case), flops(case)
    return {"bytes": nbytes, "flops": nflops, "intensity": nflops / nbytes}


def _achieved(work: dict, us: float) -> dict:
    return {"us": us, "TBps": work["bytes"] / (us * 1e-6) / 1e12,
            "TFLOPs": work["flops"] / (us * 1e-6) / 1e12}


def ceilings() -> dict:
    """The roofs of the decode plot: datasheet peaks and the anchors' measured ceilings."""
    measured = _load(DECODE_ANCHORS)["ceilings"]
    return {"hbm_peak_TBps": HBM_PEAK_TBPS, "bf16_peak_TFLOPs": BF16_DENSE_PEAK_TFLOPS,
            "copy_TBps": measured["copy_TBps"], "bf16_mm_TFLOPs": measured["bf16_mm_TFLOPs"]}


def decode_points() -> list[dict]:
    """M1–M7: ``{"shape", "case", "bytes", "flops", "intensity", "impls": {name: {"us",
    "TBps", "TFLOPs"}}}`` for mla_ops (the table's launch and the family it ran), FlashMLA
    (``"sparse": True`` where only its sparse fp8 kernel applies) and vLLM Triton."""
    # (an A/B file's rows name their variant; benchmark_decode_verify.py's are the table's launch)
    ours = {r["shape"]: r for r in _load(DECODE_TABLE)["rows"] if r.get("variant", "table") == "table"}
    anchors = {r["shape"]: r for r in _load(DECODE_ANCHORS)["rows"]}
    points = []
    for name, shape in SHAPES.items():
        work = _work(shape.case)
        row, anchor = ours[name], anchors[name]
        impls = {
            "mla_ops": {**_achieved(work, row["time_us"]),
                        "family": row["config"].get("family", "triton")},
            "FlashMLA": {**_achieved(work, anchor["flashmla_us"]),
                         "sparse": anchor["flashmla_kernel"] != "dense"},
            "vLLM Triton": _achieved(work, anchor["vllm_us"]),
        }
        points.append({"shape": name, "case": shape.case, **work, "impls": impls})
    return points


_KEY = re.compile(r"H(\d+)-q(\d+)-B(\d+)-L(\d+)-(bf16|fp8)-p(\d+)")


def parse_key(key: str) -> Case:
    """``H16-q2-B1-L8192-bf16-p64`` (``Case.key``), or a named shape's name (``M1``, as the
    A/B files name the grid's named points), back to its case."""
    if key in SHAPES:
        return SHAPES[key].case
    m = _KEY.fullmatch(key)
    if m is None:
        raise ValueError(f"not a decode case key: {key!r}")
    h, q, b, L, cache, page = m.groups()
    return Case(int(h), int(q), int(b), int(L), cache == "fp8", int(page))


def grid_points() -> list[dict]:
    """The 48-point grid at the faster of the two families (what the sm_90 table routes to):
    ``{"key", "case", "bytes", "flops", "intensity", "family", "us", "TBps", "TFLOPs"}``."""
    doc = _load(DECODE_GRID)
    points = []
    for row in doc["sources"][0]["rows"]:
        times = {fam: row["time"][f"family={fam}"] for fam in ("triton", "gluon")}
        fam = min(times, key=times.get)
        work = _work(parse_key(row["shape"]))
        points.append({"key": row["shape"], "case": parse_key(row["shape"]), **work,
                       "family": fam, **_achieved(work, times[fam])})
    return points


def encoder_points() -> list[dict]:
    """P1–P8, C7, C8: ``{"shape", "B", "S", "H", "D", "causal", "family", "impls": {label:
    {"ms", "TFLOPs"}}}``, ``family`` being what the table's launch ran."""
    points = []
    for row in _load(ENCODER)["rows"]:
        impls = {}
        for label, key in ENCODER_IMPLS.items():
            ms = row[f"{key}_ms"]
            impls[label] = {"ms": ms, "TFLOPs": prefill_tflops(row["B"], row["S"], row["H"],
                                                               row["D"], row["causal"], ms)}
        points.append({k: row[k] for k in ("shape", "B", "S", "H", "D", "causal")}
                      | {"family": (row.get("config") or {}).get("family", "triton"),
                         "impls": impls})
    return points
