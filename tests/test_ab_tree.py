"""The in-process tree A/B (``benchmarks/ab_tree.py``, ``benchmarks/trees.py``) on the CPU: a
second copy of the package imports beside the current one without registering ``torch.ops.mla``
again, the command line parses, and under the interpreter both sides run, agree and are timed;
a side whose output is off fails the run."""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mla_ops  # noqa: E402
from benchmarks import ab_tree, trees  # noqa: E402

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(),
                              reason="the interpreter run (a GPU runs the real grid)")


@pytest.fixture
def tree(tmp_path):
    """A copy of this checkout's mla_ops/ (sources only: no _C, no caches) as another tree."""
    shutil.copytree(ROOT / "mla_ops", tmp_path / "mla_ops",
                    ignore=shutil.ignore_patterns("__pycache__", "_C*", "*.so"))
    yield tmp_path
    for name in ("mla_ops_t_copy", ab_tree.BASE_NAME, ab_tree.SAME_NAME):
        trees.unload(name)


def test_a_copy_imports_beside_the_package_and_registers_nothing(tree, monkeypatch):
    calls = []
    for owner, attr in ((torch.library, "custom_op"), (torch.library, "define"),
                        (torch.ops, "load_library")):
        real = getattr(owner, attr)
        monkeypatch.setattr(owner, attr, lambda *a, _r=real, _n=attr, **k: (
            calls.append(_n), _r(*a, **k))[1])

    class Library(torch.library.Library):
        def __init__(self, *args, **kwargs):
            calls.append("Library")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(torch.library, "Library", Library)
    before = {name: getattr(torch.ops.mla, name).default._schema for name in
              ("decode_verify", "context_attention")}
    copy = trees.load(tree, "mla_ops_t_copy")
    assert calls == []  # no op defined, no kernel registered, no _C loaded
    assert {name: getattr(torch.ops.mla, name).default._schema for name in before} == before
    assert copy.library.STUB and copy.library.EXTENSION_STATUS == trees.STUB_STATUS
    assert "mla_ops_t_copy._ext" not in sys.modules
    # Every module of the copy is the copy's own, from its tree; the package is untouched.
    mods = {m: v for m, v in sys.modules.items() if m.startswith("mla_ops_t_copy.")}
    assert {"mla_ops_t_copy.decode_verify.kernels", "mla_ops_t_copy.prefill.launch"} <= set(mods)
    for m, v in mods.items():
        if getattr(v, "__file__", None):
            assert pathlib.Path(v.__file__).is_relative_to(tree / "mla_ops"), m
    assert copy.decode_attention_fwd_verify is not mla_ops.decode_attention_fwd_verify
    assert (copy.decode_verify.kernels._fwd_verify_stage1
            is not mla_ops.decode_verify.kernels._fwd_verify_stage1)
    assert copy.prefill.launch.__name__ == "mla_ops_t_copy.prefill.launch"
    assert mla_ops.decode_verify.launch.__file__.startswith(str(ROOT / "mla_ops"))
    # Loaded once; the same name from another tree is refused, and so is the package's own.
    assert trees.load(tree, "mla_ops_t_copy") is copy
    with pytest.raises(ValueError, match="already loaded"):
        trees.load(ROOT, "mla_ops_t_copy")
    with pytest.raises(ValueError, match="other than"):
        trees.load(tree, "mla_ops")
    assert trees.load(None) is mla_ops
    info = trees.describe(copy, tree)
    assert info["registers_ops"] is False and info["package"] == "mla_ops_t_copy"
    assert info["sources_sha256"] == trees.tree_hash(ROOT)  # a copy of the same sources
    assert trees.describe(mla_ops, None)["registers_ops"] is True


def test_a_tree_without_the_package_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no mla_ops/__init__.py"):
        trees.load(tmp_path, "mla_ops_t_none")
    assert "mla_ops_t_none" not in sys.modules


@pytest.mark.skipif(not (ROOT / ".ab_base" / "mla_ops").is_dir(),
                    reason="no .ab_base/ (an older commit's tree, ignored by git) here")
def test_the_ab_base_tree_loads():
    try:
        base = trees.load(ROOT / ".ab_base", "mla_ops_t_ab_base")
        assert base.library.STUB
        assert pathlib.Path(base.decode_verify.launch.__file__).is_relative_to(ROOT / ".ab_base")
        assert callable(base.context_attention_fwd) and callable(base.verify_num_kv_splits)
    finally:
        trees.unload("mla_ops_t_ab_base")


def test_arguments(tree):
    a = ab_tree.parse_args(["--base-tree", str(tree)])
    assert a.family == ["decode", "prefill"] and a.rounds == 10 and not a.same
    assert a.prefill_shape == ["P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8", "C7", "C8"]
    a = ab_tree.parse_args(["--base-tree", str(tree), "--family", "prefill", "--prefill-shape",
                            "P2,C7", "--same", "--rounds", "4"])
    assert a.prefill_shape == ["P2", "C7"] and a.same and a.family == ["prefill"]
    assert len(ab_tree.decode_points(ab_tree.parse_args(["--base-tree", str(tree)]))) == 48
    named = ab_tree.decode_points(ab_tree.parse_args(["--base-tree", str(tree), "--named"]))
    assert [c.name for c in named] == ["M1", "M2", "M3", "M4", "M5", "M6", "M7"]
    picked = ab_tree.parse_args(["--base-tree", str(tree), "--case", "16,4,1,8192,fp8",
                                 "128,1,1,8192", "--kernels"])
    assert [c.key for c in ab_tree.decode_points(picked)] == ["H16-q4-B1-L8192-fp8-p64",
                                                              "H128-q1-B1-L8192-bf16-p64"]
    assert picked.kernels
    for bad in (["--base-tree", str(tree), "--case", "16,4,1,8192", "--named"],
                ["--base-tree", str(tree), "--case", "16,4,1"],
                ["--base-tree", str(tree), "--interpret", "--case", "16,4,1,8192"]):
        with pytest.raises(SystemExit):
            ab_tree.parse_args(bad)
    for bad in (["--base-tree", str(tree / "nowhere")], ["--base-tree", str(tree), "--rounds", "0"],
                ["--base-tree", str(tree), "--interpret", "--named"],
                ["--base-tree", str(tree), "--prefill-shape", "P9"],
                ["--base-tree", str(tree), "--family", "merge"]):
        with pytest.raises(SystemExit):
            ab_tree.parse_args(bad)


def test_point_line_lists_each_sides_kernels():
    row = {"shape": "H16-q4-B1-L8192-fp8-p64", "a_us": 23.6, "b_us": 24.2, "ratio": 1.025,
           "spread": 0.01, "ok": True,
           "kernels": {"base": {"kernels_us": {"_fwd_verify_stage1": 19.0, "_fwd_verify_stage2": 2.9},
                                "per_call_us": 23.0, "max_gap_us": 0.2},
                       "current": {"kernels_us": {"_fwd_verify_stage1": 19.5, "_fwd_verify_stage2": 3.1},
                                   "per_call_us": 23.6, "max_gap_us": 0.1}}}
    lines = ab_tree.point_line(row).splitlines()
    assert len(lines) == 3 and "x1.0250" in lines[0]
    assert lines[1].split() == ["base", "kernels", "(us):", "_fwd_verify_stage1", "19.00,",
                                "_fwd_verify_stage2", "2.90;", "max", "gap", "0.20"]
    assert lines[2].split()[0] == "current" and "19.50" in lines[2]


def test_ratios_and_summaries():
    times = {"base": [10.0, 10.0, 10.0], "current": [10.1, 10.2, 9.9], "same": [10.1, 10.2, 9.9]}
    s = ab_tree.summarize_times(times)
    assert s["ratio"] == pytest.approx(1.01) and s["spread"] == pytest.approx(0.03)
    assert ab_tree.noise_fields(times)["noise_ratio"] == pytest.approx(1.0)
    rows = [{"shape": "a", "ratio": 1.002, "ok": True, "noise_ratio": 0.999},
            {"shape": "b", "ratio": 1.008, "ok": False, "noise_ratio": 1.003},
            {"shape": "c", "error": "x", "ok": False}]
    f = ab_tree.family_summary(rows)
    assert (f["points"], f["max_at"], f["disagree"]) == (2, "b", ["b"])
    assert f["median_ratio"] == pytest.approx(1.005) and f["noise_max_dev"] == pytest.approx(0.003)
    assert "DISAGREE" in ab_tree.summary_line("decode", f, 0, 1)


@CPU_ONLY
def test_interpret_run_times_both_sides_that_agree(tree, tmp_path, capsys):
    out = tmp_path / "ab.json"
    assert ab_tree.main(["--interpret", "--base-tree", str(tree), "--rounds", "2",
                         "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [s["label"] for s in doc["sides"]] == ["base", "current"]
    assert doc["sides"][0]["package"] == ab_tree.BASE_NAME and not doc["sides"][0]["registers_ops"]
    dec, pre = doc["rows"]
    assert (dec["family"], pre["family"]) == ("decode", "prefill")
    for row in (dec, pre):
        assert row["ok"] and row["check"]["ok"] and len(row["ratios"]) == 2
        assert row["ratio"] > 0 and row["a_us"] > 0 and row["b_us"] > 0
    # The same sources and the same inputs: the same numbers.
    assert dec["check"]["current"]["err_o_rel"] == 0.0 and dec["same_launch"]
    assert pre["check"]["current"]["max_abs_diff"] == 0.0
    assert set(doc["summary"]) == {"decode", "prefill"} and doc["summary"]["decode"]["points"] == 1
    text = capsys.readouterr().out
    assert "same vs same" in text and "decode: current/base median x" in text


@CPU_ONLY
def test_a_side_whose_output_is_off_fails_the_run(tree, tmp_path, monkeypatch, capsys):
    real = trees.prefill_call

    def off(mod, inputs, o, seq, causal):
        fn = real(mod, inputs, o, seq, causal)
        if mod.__name__ != ab_tree.SAME_NAME:
            return fn
        return lambda: (fn(), o.add_(1.0))

    monkeypatch.setattr(trees, "prefill_call", off)
    out = tmp_path / "ab.json"
    assert ab_tree.main(["--interpret", "--base-tree", str(tree), "--family", "prefill",
                         "--same", "--rounds", "1", "--json", str(out)]) == 1
    (row,) = json.loads(out.read_text())["rows"]
    assert not row["ok"] and row["check"]["current"]["ok"] and not row["check"]["same"]["ok"]
    assert "noise_ratio" in row
    assert "DISAGREE" in capsys.readouterr().out


def test_compile_jobs_one_per_binary_and_sources(tree, monkeypatch):
    """The pool's specs: one per (sources, launch Triton specializes on), so a side with the
    current sources (same vs same, --same) compiles nothing more."""
    from benchmarks import compile_pool

    seen = {}
    monkeypatch.setattr(compile_pool, "precompile",
                        lambda job, specs, jobs, budget_s: seen.update(job=job, specs=specs))
    args = ab_tree.parse_args(["--base-tree", str(tree), "--same", "--jobs", "2"])
    args.deadline = float("inf")
    sides = ab_tree.load_sides(args)
    assert [s.label for s in sides] == ["base", "current", "same"]
    cases = ab_tree.decode_points(args)
    plans = ab_tree.decode_plans(sides, cases, "cpu", torch.bfloat16)
    points = ab_tree.prefill_points(args)
    ab_tree.precompile(sides, cases, plans, points, "bf16", args)
    assert seen["job"] is trees.compile_job
    specs = list(seen["specs"].values())
    assert {s["name"] for s in specs} == {ab_tree.BASE_NAME}  # the first side of those sources
    assert sum(s["family"] == "prefill" for s in specs) == 10
    one_side = {trees.decode_spec(None, "x", c, "bf16", plans[(c.key, "current")][1],
                                  plans[(c.key, "current")][0])[0] for c in cases}
    assert sum(s["family"] == "decode" for s in specs) == len(one_side) < len(cases)


@CPU_ONLY
def test_compile_job_runs_each_family_of_a_copy(tree):
    from benchmarks.shapes import INTERPRET_CASE, PREFILL_INTERPRET

    cfg, splits = trees.decode_launch(trees.load(tree, "mla_ops_t_copy"), INTERPRET_CASE,
                                      torch.float16, "cpu")
    assert splits >= 1 and cfg["family"] == "triton"
    _key, spec = trees.decode_spec(str(tree), "mla_ops_t_copy", INTERPRET_CASE, "fp16", splits,
                                   cfg, device="cpu")
    trees.compile_job(spec)
    _key, spec = trees.prefill_spec(str(tree), "mla_ops_t_copy", PREFILL_INTERPRET, True, "fp16",
                                    device="cpu")
    trees.compile_job(spec)
