#!/usr/bin/env python
"""The README's two plots, from the committed H200 results (``plot_data.py`` reads them):

- ``decode_roofline.png``: M1–M7 for mla_ops (the table's launch), FlashMLA and vLLM's Triton
  MLA decode, and the 48-point grid, as achieved TB/s against arithmetic intensity (FLOP/byte)
  under the H200's roofs: HBM (4.8 TB/s datasheet, the measured copy ceiling) and bf16 tensor
  cores (989 TFLOP/s datasheet dense, the measured matmul), a compute roof being a line of
  slope -1 on these axes (TB/s = TFLOP/s ÷ FLOP/byte);
- ``encoder_vs_sdpa.png``: the encoder (the table's launch and the portable kernel) against
  SDPA's cuDNN and flash backends, TFLOP/s by head dim.

    pip install --no-build-isolation -e '.[plot]'
    python benchmarks/plot.py [--out DIR]      # default benchmarks/results/h200

Needs matplotlib (the ``plot`` extra); importing this module without it raises ImportError
naming the extra.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Sequence

try:
    import matplotlib
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("benchmarks/plot.py needs matplotlib, the optional extra 'plot' of "
                      "mla_ops: pip install --no-build-isolation -e '.[plot]' "
                      "(or pip install matplotlib)") from e

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import plot_data  # noqa: E402

DECODE_PNG = "decode_roofline.png"
ENCODER_PNG = "encoder_vs_sdpa.png"
STYLE = {"mla_ops": ("tab:red", "o"), "FlashMLA": ("tab:blue", "s"),
         "vLLM Triton": ("tab:gray", "^")}
ENCODER_STYLE = {"mla_ops (table)": ("tab:red", "o", "-"),
                 "mla_ops portable": ("tab:orange", "o", ":"),
                 "SDPA cuDNN": ("tab:blue", "s", "-"), "SDPA flash": ("tab:green", "^", "-")}


def _sources(fig, *paths, note=""):
    """A footer naming the committed files a figure was drawn from."""
    root = plot_data.RESULTS.parent
    names = ", ".join(str(p.relative_to(root)) for p in paths)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.text(0.01, 0.01, f"{note}\nbenchmarks/results/: {names}", fontsize=7, color="dimgray")


def decode_figure():
    roofs = plot_data.ceilings()
    points = plot_data.decode_points()
    grid = plot_data.grid_points()
    fig, ax = plt.subplots(figsize=(8.5, 5.6), dpi=110)
    lo, hi = 15.0, 3000.0
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for tbps, tflops, style, label in (
            (roofs["hbm_peak_TBps"], roofs["bf16_peak_TFLOPs"], "-",
             f"H200 datasheet: {roofs['hbm_peak_TBps']:g} TB/s HBM, "
             f"{roofs['bf16_peak_TFLOPs']:g} TFLOP/s bf16 dense"),
            (roofs["copy_TBps"], roofs["bf16_mm_TFLOPs"], "--",
             f"measured: {roofs['copy_TBps']:g} TB/s copy, "
             f"{roofs['bf16_mm_TFLOPs']:g} TFLOP/s bf16 matmul")):
        ax.plot(xs, [min(tbps, tflops / x) for x in xs], style, color="black", lw=1.2,
                label=label)
    ax.scatter([g["intensity"] for g in grid], [g["TBps"] for g in grid], s=14,
               color="lightgray", zorder=1,
               label="mla_ops, 48-point grid (the faster family)")
    for name, (color, marker) in STYLE.items():
        xs_ = [p["intensity"] for p in points]
        ys_ = [p["impls"][name]["TBps"] for p in points]
        hollow = [bool(p["impls"][name].get("sparse")) for p in points]
        solid = [(x, y) for x, y, h in zip(xs_, ys_, hollow) if not h]
        ax.scatter(*zip(*solid), color=color, marker=marker, s=42, zorder=3, label=name)
        if any(hollow):  # FlashMLA's fp8: its sparse kernel, the only one it has
            other = [(x, y) for x, y, h in zip(xs_, ys_, hollow) if h]
            ax.scatter(*zip(*other), facecolors="none", edgecolors=color, marker=marker, s=42,
                       zorder=3, label=f"{name}, sparse fp8 kernel (no dense fp8)")
    for p in points:
        ours = p["impls"]["mla_ops"]
        ax.annotate(f"{p['shape']}", (p["intensity"], ours["TBps"]), textcoords="offset points",
                    xytext=(5, 4), fontsize=8, color="tab:red")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(0.03, 8)
    ax.set_xlabel("arithmetic intensity, FLOP / unique byte (KV once + q, o, lse)")
    ax.set_ylabel("achieved TB/s (unique bytes / time)")
    ax.set_title("MLA decode verify on one H200: M1–M7 and the 48-point grid", fontsize=11)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=7.5, loc="lower left")
    _sources(fig, plot_data.DECODE_TABLE, plot_data.DECODE_ANCHORS, plot_data.DECODE_GRID,
             note="mla_ops: the table's launch, CUDA-graph replays; FlashMLA, vLLM: the "
                  "anchors' run")
    return fig


def encoder_figure():
    points = plot_data.encoder_points()
    panels = [("B1 S3520 H16, non-causal", lambda p: p["B"] == 1 and not p["causal"]),
              ("B4 S4096 H16, non-causal", lambda p: p["B"] == 4 and not p["causal"]),
              ("B4 S4096 H16, causal", lambda p: p["B"] == 4 and p["causal"])]
    fig, axes = plt.subplots(1, 3, figsize=(11, 4.2), dpi=110, sharey=True,
                             gridspec_kw={"width_ratios": [3, 1.2, 1.2]})
    for ax, (title, keep) in zip(axes, panels):
        pts = sorted((p for p in points if keep(p)), key=lambda p: p["D"])
        dims = [p["D"] for p in pts]
        for label, (color, marker, line) in ENCODER_STYLE.items():
            ax.plot(range(len(pts)), [p["impls"][label]["TFLOPs"] for p in pts], line,
                    color=color, marker=marker, ms=5, label=label)
        ax.set_xticks(range(len(pts)))
        ax.set_xticklabels([f"{d}\n{p['shape']}" for d, p in zip(dims, pts)], fontsize=8)
        ax.set_xlim(-0.4, len(pts) - 0.6)
        ax.set_title(title, fontsize=9.5)
        ax.set_xlabel("head dim")
        ax.grid(True, lw=0.3, alpha=0.5)
    axes[0].set_ylabel("TFLOP/s (4·B·S²·H·D, halved when causal)")
    axes[0].set_ylim(0, None)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("Encoder attention on one H200, bf16: mla_ops against SDPA", fontsize=11)
    _sources(fig, plot_data.ENCODER, note="eager calls, do_bench medians")
    return fig


def main(argv: Sequence[str] | None = None) -> list[pathlib.Path]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(plot_data.RESULTS),
                   help="folder for the PNGs (default: benchmarks/results/h200)")
    args = p.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in ((DECODE_PNG, decode_figure), (ENCODER_PNG, encoder_figure)):
        fig = make()
        # Fixed metadata, so that the same data gives the same file.
        fig.savefig(out / name, metadata={"Software": None})
        plt.close(fig)
        written.append(out / name)
        print(f"wrote {out / name}")
    return written


if __name__ == "__main__":
    main()
