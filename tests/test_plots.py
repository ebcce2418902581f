"""``benchmarks/plot.py``: the numbers it draws come from the committed results and agree with
the README's tables (no matplotlib needed), and, where matplotlib is installed, the whole plot
runs; without it, importing the module fails with a message naming the ``plot`` extra."""

from __future__ import annotations

import importlib
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import plot_data, shapes  # noqa: E402

README = (ROOT / "README.md").read_text()


def _readme_table(first_header: str) -> dict[str, list[str]]:
    """The README table whose header row starts ``| first_header |``: shape -> its cells."""
    lines = README.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


def _num(cell: str) -> float:
    return float(re.match(r"[\d.]+", cell).group())


def test_every_source_is_committed_and_in_the_manifest():
    manifest = (ROOT / "benchmarks" / "results" / "MANIFEST.md").read_text()
    for path in plot_data.SOURCES:
        assert path.is_file(), path
        assert f"`h200/{path.relative_to(plot_data.RESULTS).as_posix()}`" in manifest, path


def test_decode_points_are_the_readme_table_and_the_shapes():
    points = plot_data.decode_points()
    assert [p["shape"] for p in points] == list(shapes.SHAPES)
    table = _readme_table("shape | H | qlen")
    for p in points:
        row, case = table[p["shape"]], p["case"]
        assert [int(row[1]), int(row[2]), int(row[3]), int(row[4])] == [case.H, case.qlen, case.B,
                                                                       case.L]
        # µs (kernel), FlashMLA µs, vLLM µs: the README rounds the committed JSON.
        assert _num(row[6]) == pytest.approx(p["impls"]["mla_ops"]["us"], abs=0.051)
        assert _num(row[10]) == pytest.approx(p["impls"]["FlashMLA"]["us"], abs=0.051)
        assert _num(row[11]) == pytest.approx(p["impls"]["vLLM Triton"]["us"], abs=0.051)
        family = "Gluon" if p["impls"]["mla_ops"]["family"] == "gluon" else "Triton"
        assert family in row[6]
        assert ("*" in row[10]) == p["impls"]["FlashMLA"]["sparse"]
        # The anchors' vLLM column is the one benchmarks/shapes.py holds.
        assert p["impls"]["vLLM Triton"]["us"] == shapes.SHAPES[p["shape"]].vllm_us
        # Intensity: FLOPs over unique bytes, ~60 FLOP/B for H16 qlen 2 (bf16), up to ~940.
        assert p["intensity"] == pytest.approx(p["flops"] / p["bytes"])
        us = p["impls"]["mla_ops"]["us"]
        assert p["impls"]["mla_ops"]["TBps"] == pytest.approx(p["bytes"] / us / 1e6)
    assert points[0]["intensity"] == pytest.approx(60, rel=0.01)  # M1
    assert points[-1]["intensity"] == pytest.approx(939, rel=0.01)  # M7


def test_decode_roofline_inputs_are_physical():
    roofs = plot_data.ceilings()
    assert roofs["copy_TBps"] < roofs["hbm_peak_TBps"]
    assert roofs["bf16_mm_TFLOPs"] < roofs["bf16_peak_TFLOPs"]
    grid = plot_data.grid_points()
    assert len(grid) == len(shapes.grid_points(qlens=(1, 2, 4))) == 48
    assert {g["family"] for g in grid} == {"triton", "gluon"}
    for p in grid + [p["impls"][k] | p for p in plot_data.decode_points() for k in p["impls"]]:
        assert 0 < p["TBps"] <= roofs["hbm_peak_TBps"], p  # no point above the HBM roof
        assert 0 < p["TFLOPs"] <= roofs["bf16_peak_TFLOPs"], p
    # M1 in the grid is M1 of the named shapes.
    m1 = next(g for g in grid if g["key"] == "M1")
    assert m1["case"] == shapes.SHAPES["M1"].case
    assert plot_data.parse_key("H128-q4-B16-L32768-fp8-p64") == shapes.Case(128, 4, 16, 32768,
                                                                            True, 64)


def test_encoder_points_are_the_readme_table():
    points = plot_data.encoder_points()
    table = _readme_table("shape | B | S | D | causal")
    assert [p["shape"] for p in points] == list(table)
    for p in points:
        row = table[p["shape"]]
        assert [int(row[1]), int(row[2]), int(row[3])] == [p["B"], p["S"], p["D"]]
        assert (row[4] == "yes") == p["causal"]
        # table (family) | portable | SDPA cuDNN | SDPA flash, in ms to 3 decimals
        for cell, label in zip(row[5:9], plot_data.ENCODER_IMPLS):
            assert _num(cell) == pytest.approx(p["impls"][label]["ms"], abs=0.00051), (p, label)
        assert ("Gluon" in row[5]) == (p["family"] == "gluon")
        ms = p["impls"]["SDPA cuDNN"]["ms"]
        assert p["impls"]["SDPA cuDNN"]["TFLOPs"] == pytest.approx(
            shapes.prefill_tflops(p["B"], p["S"], p["H"], p["D"], p["causal"], ms))


def test_plot_module_names_the_extra_without_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.delitem(sys.modules, "benchmarks.plot", raising=False)
    extra = r"optional extra 'plot'.*pip install --no-build-isolation -e '\.\[plot\]'"
    with pytest.raises(ImportError, match=extra):
        importlib.import_module("benchmarks.plot")
    monkeypatch.delitem(sys.modules, "benchmarks.plot", raising=False)


def test_plot_draws_both_figures(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks import plot

    written = plot.main(["--out", str(tmp_path)])
    assert [p.name for p in written] == [plot.DECODE_PNG, plot.ENCODER_PNG]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
        assert (plot_data.RESULTS / p.name).is_file(), f"{p.name} is not committed"
        assert f"(benchmarks/results/h200/{p.name})" in README, f"the README does not show {p.name}"
