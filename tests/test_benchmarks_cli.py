"""The decode-verify benchmark and sweep scripts, on the CPU: their shape tables and roofline
formulas against ANCHORS.md, argument parsing, the sweep's planning and the table it writes
(read back through configs.py's own selection). The kernel itself is not run here: a fake one
(the plain-PyTorch reference) stands in where a script's whole path is exercised."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import benchmark_decode_verify as bench  # noqa: E402
from benchmarks import sweep_decode_verify as sweep  # noqa: E402

# ANCHORS.md, "Decode verify": shape -> (H, qlen, B, L, fp8, roofline µs)
ANCHORS = {
    "M1": (16, 2, 1, 8192, False, 2.2),
    "M2": (16, 2, 32, 4096, False, 35.9),
    "M3": (16, 4, 128, 4096, False, 145.7),
    "M4": (16, 2, 16, 32768, True, 71.0),
    "M5": (128, 1, 128, 4096, False, 215.2),
    "M6": (128, 4, 32, 4096, False, 215.0),
    "M7": (128, 2, 16, 32768, True, 430.4),
}


# --- shapes and formulas ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ANCHORS))
def test_shape_table_is_anchors(name):
    H, qlen, B, L, fp8, _ = ANCHORS[name]
    c = bench.SHAPES[name].case
    assert (c.H, c.qlen, c.B, c.L, c.fp8, c.page_size, c.name) == (H, qlen, B, L, fp8, 64, name)


@pytest.mark.parametrize("name", list(ANCHORS))
def test_roofline_matches_anchors_column(name):
    *_, expected_us = ANCHORS[name]
    c = bench.SHAPES[name].case
    us, _ = bench.roofline(bench.unique_bytes(c), bench.flops(c), 4.27, 678.5)
    assert us == pytest.approx(expected_us, rel=0.02)
    assert bench.SHAPES[name].roofline_us == pytest.approx(expected_us, rel=1e-3)


def test_m1_bytes_and_flops_by_hand():
    c = bench.SHAPES["M1"].case
    rows = 1 * 2 * 16
    assert bench.kv_bytes(c) == 8192 * 576 * 2 == 9_437_184
    assert bench.unique_bytes(c) == 9_437_184 + rows * (576 * 2 + 512 * 2 + 4)
    assert bench.flops(c) == 2 * 16 * (576 + 512) * (8191 + 8192)
    _, bound = bench.roofline(bench.unique_bytes(c), bench.flops(c), 4.27, 678.5)
    assert bound == "memory"


def test_fp8_cache_halves_the_kv_bytes_only():
    bf = bench.Case(16, 2, 16, 32768, False)
    f8 = bench.Case(16, 2, 16, 32768, True)
    assert bench.kv_bytes(bf) == 2 * bench.kv_bytes(f8)
    q_o_lse = bench.unique_bytes(bf) - bench.kv_bytes(bf)
    assert bench.unique_bytes(f8) - bench.kv_bytes(f8) == q_o_lse
    assert bench.flops(bf) == bench.flops(f8)


def test_h128_shapes_are_compute_bound():
    for name in ("M5", "M6", "M7"):
        c = bench.SHAPES[name].case
        assert bench.roofline(bench.unique_bytes(c), bench.flops(c), 4.27, 678.5)[1] == "compute"


def test_row_limits_and_the_per_token_feed():
    assert bench.row_limits(10, 3) == [8, 9, 10]
    assert bench.row_limits(10, 3, L_real=8) == [8, 8, 8]
    assert bench.row_limits(2, 4) == [0, 0, 1, 2]
    assert bench.sum_row_limits(5, 10, 3) == 5 * 27
    assert bench.baseline_seq_lens(10, 3, 2) == [8, 9, 10, 8, 9, 10]
    b = bench.baseline_case(bench.SHAPES["M3"].case)
    assert (b.H, b.qlen, b.B, b.L, b.name) == (16, 1, 512, 4096, None)


def test_targets():
    t = bench.SHAPES["M1"].target
    assert t.met(9.9, 0.1, 1.0) and not t.met(10.1, 1.0, 1000.0)
    t = bench.SHAPES["M2"].target
    assert t.met(1e6, 0.85, 0.0) and not t.met(1.0, 0.84, 1000.0)
    t = bench.SHAPES["M4"].target
    assert t.kind == "roofline_frac" and t.value == 0.80
    t = bench.SHAPES["M7"].target
    assert t.met(1e6, 0.0, 400.0) and not t.met(1.0, 1.0, 399.0)


# --- benchmark arguments ------------------------------------------------------------------------


def test_default_runs_every_named_shape():
    cases = bench.resolve_cases(bench.parse_args([]))
    assert [c.name for c in cases] == list(ANCHORS)


@pytest.mark.parametrize("argv, names", [
    (["--shape", "M3"], ["M3"]),
    (["--shape", "all"], list(ANCHORS)),
    (["--shape", "M1,M4"], ["M1", "M4"]),
    (["--shape", "M7", "M2"], ["M7", "M2"]),
], ids=["one", "all", "comma", "spaces"])
def test_shape_names(argv, names):
    cases = bench.resolve_cases(bench.parse_args(argv))
    assert [c.name for c in cases] == names


@pytest.mark.parametrize("argv", [
    ["--shape", "M9"],
    ["--shape", "M1", "--heads", "16"],
    ["--shape", "M2", "--fp8"],
    ["--heads", "0"],
    ["--splits", "0"],
    ["--interpret", "--shape", "M1"],
], ids=["unknown", "shape-and-grid", "shape-fp8", "zero-heads", "zero-splits", "interpret-named"])
def test_bad_arguments_exit(argv, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2


def test_grid_flags_make_the_product():
    args = bench.parse_args(["--heads", "16", "128", "--qlen", "1", "4", "--batch", "8",
                             "--seq-len", "1000", "--fp8", "--page-size", "16"])
    cases = bench.resolve_cases(args)
    assert [(c.H, c.qlen) for c in cases] == [(16, 1), (16, 4), (128, 1), (128, 4)]
    assert all(c.B == 8 and c.L == 1000 and c.fp8 and c.page_size == 16 and c.name is None
               for c in cases)


def test_page_size_applies_to_named_shapes():
    (c,) = bench.resolve_cases(bench.parse_args(["--shape", "M2", "--page-size", "16"]))
    assert (c.name, c.page_size, c.B) == ("M2", 16, 32)


def test_launch_knobs_become_config_overrides():
    args = bench.parse_args(["--shape", "M3", "--block-h", "32", "--block-n", "16",
                             "--num-warps", "4", "--num-stages", "3", "--qsplit", "1",
                             "--min-split-len", "128", "--splits", "6"])
    assert bench.launch_overrides(args) == {"BLOCK_H": 32, "BLOCK_N": 16, "num_warps": 4,
                                            "num_stages": 3, "QSPLIT": 1, "MIN_SPLIT_LEN": 128}
    assert args.splits == 6
    assert bench.launch_overrides(bench.parse_args([])) == {}
    assert set(bench._KNOB_FLAGS.values()) == set(bench.LAUNCH_KEYS)


def test_interpret_runs_a_tiny_fp16_case():
    args = bench.parse_args(["--interpret"])
    (c,) = bench.resolve_cases(args)
    assert args.dtype == "fp16" and c == bench.INTERPRET_CASE
    assert c.B * c.L * c.H < 10_000


# --- benchmark inputs and the whole case path, with the reference as the kernel -----------------


def _fake_api(bad_block_h=None, raise_stages=None):
    from mla_ops.reference import decode_verify_ref

    def kernel(q, k, v, o, lse, rtt, seq, real, qlen, logits, splits, sm_scale, page, k_scale=None,
               *, config=None):
        cfg = {**_select(0, 0, 0), **(config or {})}
        if raise_stages is not None and cfg["num_stages"] == raise_stages:
            raise RuntimeError("out of resource: shared memory, Required: 300000")
        ro, rl = decode_verify_ref(q, k, v.shape[-1], rtt, seq, real, qlen, sm_scale, page, k_scale)
        if cfg["BLOCK_H"] == bad_block_h:
            ro = ro + 1.0
        o.copy_(ro)
        lse.copy_(rl)

    def _select(batch, qlen, heads):
        return {"BLOCK_H": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "QSPLIT": 0,
                "SPLIT_ALIGN": 64, "MIN_SPLIT_LEN": 256, "S2_BLOCK_S": 8, "s2_num_warps": 4}

    def splits(L, B, qlen, H, sm, block_h=32, **kw):
        return 2 if block_h == 32 else 3

    return bench.Api(kernel, _select, splits, decode_verify_ref, 132)


def test_inputs_are_random_and_paged_by_a_permutation():
    c = bench.Case(4, 3, 3, 70, True, 16)
    inp = bench.make_inputs(c, "cpu", torch.float16)
    pages = math.ceil(70 / 16)
    assert inp.req_to_token.shape == (3, pages) and inp.req_to_token.dtype == torch.int32
    assert sorted(inp.req_to_token.flatten().tolist()) == list(range(3 * pages))
    assert inp.req_to_token.flatten().tolist() != list(range(3 * pages))
    assert inp.kv[0].dtype == torch.float8_e4m3fn and inp.k_scale is not None
    assert inp.kv[0].float().abs().min() >= 0 and inp.kv[0].float().abs().max() > 0
    assert inp.q.abs().max() > 0 and inp.seq_lens.tolist() == [70] * 3
    b = bench.make_baseline_inputs(c, inp)
    assert b.req_to_token.shape == (9, pages)
    assert torch.equal(b.req_to_token[3:6], inp.req_to_token[1:2].expand(3, -1))
    assert b.seq_lens.tolist() == [68, 69, 70] * 3
    assert b.q is inp.q and b.o is not inp.o


def test_compare_flags_nan_and_measures_error():
    ref_o, ref_lse = torch.randn(4, 2, 8), torch.randn(4, 2)
    ok = bench.compare(ref_o + 1e-4, ref_lse, ref_o, ref_lse)
    assert ok["err_o_rel"] < 1e-3 and ok["err_lse_abs"] == 0 and not ok["nan"]
    o = ref_o.clone()
    o[1, 1, 3] = float("nan")
    bad = bench.compare(o, ref_lse, ref_o, ref_lse)
    assert bad["nan"] and bad["err_o_rel"] == float("inf")


def test_run_case_on_cpu_checks_times_and_fills_every_field(capsys):
    args = bench.parse_args(["--interpret", "--check"])
    api = _fake_api()
    row = bench.run_case(api, bench.INTERPRET_CASE, args, "cpu",
                         {"copy_TBps": 4.27, "bf16_mm_TFLOPs": 678.5}, None)
    for k in ("time_us", "unique_bytes", "TBps", "TFLOPs", "roofline_us", "roofline_frac",
              "baseline_us", "speedup", "num_kv_splits", "config", "check", "baseline_check"):
        assert k in row, k
    assert row["check"]["ok"] and row["baseline_check"]["ok"]
    assert row["num_kv_splits"] == 2 and row["config"]["BLOCK_H"] == 32
    json.dumps(row)  # JSON-able


def test_check_fails_the_run_on_a_wrong_kernel():
    args = bench.parse_args(["--interpret", "--check", "--block-h", "16"])
    with pytest.raises(SystemExit) as e:
        bench.run_case(_fake_api(bad_block_h=16), bench.INTERPRET_CASE, args, "cpu",
                       {"copy_TBps": 4.27, "bf16_mm_TFLOPs": 678.5}, None)
    assert e.value.code == 1


def test_compile_key_ignores_batch_and_split_count_but_not_single_split():
    a = bench.compile_spec(bench.Case(16, 2, 1, 8192), "bf16", 4, {"BLOCK_H": 64})
    b = bench.compile_spec(bench.Case(16, 2, 32, 4096), "bf16", 8, {"BLOCK_H": 64})
    c = bench.compile_spec(bench.Case(16, 2, 32, 4096), "bf16", 1, {"BLOCK_H": 64})
    d = bench.compile_spec(bench.Case(16, 2, 32, 4096), "bf16", 8, {"BLOCK_H": 32})
    assert bench.compile_key(a) == bench.compile_key(b)
    assert bench.compile_key(b) != bench.compile_key(c)
    assert bench.compile_key(b) != bench.compile_key(d)


# --- scripts as commands --------------------------------------------------------------------------


def _script(name, *argv, env=None):
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("name, flags", [
    ("benchmark_decode_verify.py", ["--shape", "--heads", "--qlen", "--batch", "--seq-len",
                                    "--page-size", "--fp8", "--splits", "--block-h", "--block-n",
                                    "--num-warps", "--num-stages", "--qsplit", "--min-split-len",
                                    "--json", "--check", "--interpret"]),
    ("sweep_decode_verify.py", ["--budget-s", "--write", "--log", "--resume", "--jobs",
                                "--quick", "--stages", "--interpret"]),
])
def test_help_works_on_cpu(name, flags):
    out = _script(name, "--help")
    assert out.returncode == 0, out.stderr
    for f in flags:
        assert f in out.stdout, f


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a GPU-less machine")
@pytest.mark.parametrize("name", ["benchmark_decode_verify.py", "sweep_decode_verify.py"])
def test_without_gpu_or_interpret_the_scripts_say_so(name):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = _script(name, env=env)
    assert out.returncode == 2
    assert "--interpret" in out.stderr and "GPU" in out.stderr


# --- sweep: grid, planning, table ---------------------------------------------------------------

GROUPS_H = sweep.parse_groups(sweep.DEFAULT_HEADS_GROUPS)
GROUPS_Q = sweep.parse_groups(sweep.DEFAULT_QLEN_GROUPS)


def _defaults(p):
    rows = p.B * p.qlen * p.H
    return {"BLOCK_H": 64, "BLOCK_N": 32, "num_warps": 8, "num_stages": 3, "QSPLIT": 0,
            "SPLIT_ALIGN": 64, "MIN_SPLIT_LEN": 256 if rows <= 640 else 512, "S2_BLOCK_S": 16,
            "s2_num_warps": 4, "SWAP_AB": 0, "S2_BLOCK_DV": 0, "TMA": 0, "PERSISTENT": 0, "PDL": 0}


def _splits_of(p, block_h):
    return max(1, min(8, 132 // max(1, p.B * math.ceil(p.qlen * p.H / block_h))))


def test_grid_is_the_issue_grid_with_every_anchor_shape():
    grid = sweep.grid_points()
    assert len(grid) == 2 * 4 * 4 * 2
    assert sorted(p.name for p in grid if p.name) == list(ANCHORS)
    tiles = sweep.tile_points(grid)
    assert {p.name for p in tiles if p.name} == set(ANCHORS) and len(tiles) == 9
    quick = sweep.tile_points(grid, sweep.QUICK_SPACE.anchors_only)
    assert sorted(p.name for p in quick) == list(ANCHORS)


def test_parse_groups():
    assert sweep.parse_groups("1,2/4") == [[1, 2], [4]]
    with pytest.raises(ValueError):
        sweep.parse_groups("1,2/2")
    assert all(sweep.group_of(h, GROUPS_H) is not None for h in (8, 16, 32, 64, 128))
    assert all(sweep.group_of(q, GROUPS_Q) is not None for q in range(1, 17))


def test_batch_bins_cover_every_batch():
    assert sweep.batch_bins([32, 1, 128, 16, 1]) == [(1, 4), (16, 22), (32, 64), (128, None)]


def _ok(res, p, cfg, t, splits=None, stage="tile"):
    s = _splits_of(p, cfg["BLOCK_H"]) if splits is None else splits
    res.add({"point": sweep.point_key(p), "config": cfg, "splits": s, "heuristic": splits is None,
             "status": "ok", "time_us": t, "stage": stage})


def test_planning_follows_the_stages():
    grid = sweep.grid_points()
    tiles = sweep.tile_points(grid)
    res = sweep.Results()
    space = sweep.Space()
    plan = lambda st: sweep.plan_stage(st, tiles, grid, res, _defaults, _splits_of, space, 132,  # noqa: E731
                                       GROUPS_H)
    assert len(plan("default")) == len(tiles)
    tile = plan("tile")
    assert len(tile) == len(tiles) * (18 + len(space.swap_ab_tiles))
    assert all(t[2] == _splits_of(t[0], t[1]["BLOCK_H"]) and t[3] for t in tile)
    for i, (p, c, s, _) in enumerate(tile):  # BLOCK_N=16, 4 warps wins everywhere
        _ok(res, p, c, 10.0 + (c["BLOCK_N"] != 16) + (c["num_warps"] != 4) + 0.01 * i)
    assert plan("tile") == []  # measured already
    pipe = plan("pipeline")
    assert len({(sweep.point_key(p), c["BLOCK_H"]) for p, c, _, _ in pipe}) == 2 * len(tiles)
    assert all(c["BLOCK_N"] == 16 and c["num_warps"] == 4 for _, c, _, _ in pipe)
    for p, c, s, _ in pipe:
        _ok(res, p, c, 5.0 if c["num_stages"] == 4 else 20.0)
    # MIN_SPLIT_LEN only where cdiv(L, splits) < 512; the stage-2 knobs only with > 1 split
    for p, c, s, _ in plan("splitlen"):
        assert s > 1 and math.ceil(p.L / s) < 512 and c["num_stages"] == 4
    for p, c, s, _ in plan("s2block") + plan("s2warps"):
        assert s > 1
    splits = plan("splits")
    assert splits and all(not h and s != _splits_of(p, c["BLOCK_H"]) for p, c, s, h in splits)
    gridp = plan("grid")
    per_point = {}
    for p, c, s, h in gridp:
        per_point.setdefault(sweep.point_key(p), []).append(c)
    others = [p for p in grid if p not in tiles]  # the tile points have their default measured
    assert set(per_point) >= {sweep.point_key(p) for p in others}
    for p in tiles:
        assert _defaults(p) not in per_point.get(sweep.point_key(p), [])
    for p in others:
        cfgs = per_point[sweep.point_key(p)]
        assert _defaults(p) in cfgs and 1 < len(cfgs) <= 1 + space.grid_candidates
        # the nearest tile points' winners: same heads group, so BLOCK_N 16 / 4 warps / 4 stages
        assert all(c["num_stages"] == 4 for c in cfgs if c != _defaults(p))


def test_quick_space_plans_fewer_runs():
    grid = sweep.grid_points()
    full = sweep.plan_stage("tile", sweep.tile_points(grid), grid, sweep.Results(), _defaults,
                            _splits_of, sweep.Space(), 132, GROUPS_H)
    q = sweep.QUICK_SPACE
    quick = sweep.plan_stage("tile", sweep.tile_points(grid, q.anchors_only), grid,
                             sweep.Results(), _defaults, _splits_of, q, 132, GROUPS_H)
    assert len(full) == 9 * (18 + 3) and len(quick) == 7 * (8 + 3)


def test_choose_config_minimises_the_geometric_mean_ratio():
    p1, p2 = bench.Case(16, 2, 32, 4096), bench.Case(16, 2, 32, 4096, True)
    a = {**_defaults(p1), "BLOCK_H": 32}
    b = {**_defaults(p1), "BLOCK_H": 64}
    res = sweep.Results()
    _ok(res, p1, a, 10.0)
    _ok(res, p2, a, 30.0)  # a: 1.0 and 1.5x
    _ok(res, p1, b, 12.0)
    _ok(res, p2, b, 20.0)  # b: 1.2x and 1.0: geomean 1.095 < 1.225
    cfg, ev = sweep.choose_config([p1, p2], res, a)
    assert cfg == b and [e["ratio"] for e in ev] == [1.2, 1.0]
    assert sweep.choose_config([bench.Case(8, 1, 1, 64)], res, a) == (None, [])


def _synthetic_table(tmp_path):
    """Full grid; BLOCK_H 32 is 30% faster at H<=32, BLOCK_H 64 at H=128."""
    grid = sweep.grid_points()
    res = sweep.Results()
    for i, p in enumerate(grid):
        for bh in (32, 64):
            slow = (bh == 64) == (p.H <= 32)
            _ok(res, p, {**_defaults(p), "BLOCK_H": bh}, (130.0 if slow else 100.0) + 0.001 * i,
                stage="grid")
    table = sweep.build_table(grid, res, _defaults, GROUPS_H, GROUPS_Q, "sm_90", "test run",
                              {"note": "synthetic"})
    path = tmp_path / "sm_90.json"
    sweep.write_table(path, table)
    return grid, table, path


def test_table_round_trips_and_selects_each_points_winner(tmp_path):
    grid, table, path = _synthetic_table(tmp_path)
    loaded = json.loads(path.read_text())
    assert loaded == table
    sweep.validate_table(loaded)
    assert loaded["arch"] == "sm_90" and loaded["sweep"] == {"note": "synthetic"}
    assert all(set(b["config"]) == set(bench.LAUNCH_KEYS) for b in loaded["buckets"])
    for p in grid:
        cfg = sweep.select_from_table(loaded, p.B, p.qlen, p.H)
        assert cfg["BLOCK_H"] == (32 if p.H <= 32 else 64), sweep.point_key(p)
        assert cfg["MIN_SPLIT_LEN"] == _defaults(p)["MIN_SPLIT_LEN"]
    # few buckets after merging: no bucket repeats its successor's config within a group
    assert len(loaded["buckets"]) < 2 * 4 * 4


def test_table_is_what_configs_py_reads(tmp_path, monkeypatch):
    configs = pytest.importorskip("mla_ops.decode_verify.configs")
    from mla_ops import platform

    grid, table, path = _synthetic_table(tmp_path)
    loaded = json.loads(path.read_text())
    configs._validate(loaded)
    monkeypatch.setitem(configs.TABLES, "sm_90", loaded)
    with platform.mock_platform("sm_90", sm_count=132):
        for H in (8, 16, 20, 32, 64, 128):
            for q in (1, 2, 3, 4, 8, 12):
                for B in (1, 2, 8, 16, 24, 32, 100, 128, 512):
                    want = {**configs.VERIFY_DEFAULT_CONFIG,
                            **sweep.select_from_table(loaded, B, q, H)}
                    assert configs.select_verify_config(B, q, H) == want, (B, q, H)


def test_validate_rejects_what_configs_py_would():
    cfg = _defaults(bench.Case(16, 2, 1, 64))
    ok = {"arch": "sm_90", "buckets": [{"max_rows": 64, "config": cfg}, {"config": cfg}]}
    sweep.validate_table(ok)
    for bad in (
        {"arch": "x", "buckets": [{"max_rows": 64, "config": cfg}]},
        {"arch": "x", "buckets": [{"config": {**cfg, "BLOCK_M": 1}}]},
        {"arch": "x", "buckets": [{"config": {k: v for k, v in cfg.items() if k != "QSPLIT"}}]},
        {"arch": "x", "buckets": []},
    ):
        with pytest.raises(ValueError):
            sweep.validate_table(bad)


def test_sweep_end_to_end_with_a_fake_kernel(tmp_path, monkeypatch, capsys):
    """The whole sweep on the CPU path: wrong answers and refused configs are discarded, the log
    and a valid table come out, and a resumed run keeps the log and measures nothing twice
    (it may go further: each stage replans around the best configs found so far)."""
    monkeypatch.setattr(bench, "load_api", lambda: _fake_api(bad_block_h=16, raise_stages=1))
    table_path, log_path = tmp_path / "t.json", tmp_path / "log.json"
    argv = ["--interpret", "--write", str(table_path), "--log", str(log_path), "--budget-s", "60"]
    assert sweep.main(argv) == 0
    log = json.loads(log_path.read_text())
    status = {}
    for r in log["records"]:
        status.setdefault(r["status"], []).append(r)
    assert status["ok"]
    assert all(r["config"]["BLOCK_H"] == 16 for r in status["wrong"])
    assert all(r["config"]["num_stages"] == 1 and "shared memory" in r["msg"] for r in status["error"])
    table = json.loads(table_path.read_text())
    sweep.validate_table(table)
    best = min(status["ok"], key=lambda r: r["time_us"] if r["heuristic"] else 1e30)
    c = bench.INTERPRET_CASE
    assert sweep.select_from_table(table, c.B, c.qlen, c.H) == sweep.ordered_config(best["config"])
    n = len(log["records"])
    assert sweep.main(argv + ["--resume", str(log_path)]) == 0
    records = json.loads(log_path.read_text())["records"]
    keys = [sweep.Results.key(r["point"], r["config"], r["splits"]) for r in records]
    assert len(keys) == len(set(keys)) >= n  # kept everything, measured nothing twice


def test_compile_pool_reports_good_and_refused_variants():
    """The worker processes on the CPU (the real kernel under the interpreter)."""
    pytest.importorskip("mla_ops.decode_verify.launch")
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("exercised on the GPU by the scripts themselves")
    c = bench.Case(16, 1, 1, 16, False, 16)
    good = bench.compile_spec(c, "fp16", 1, {"BLOCK_H": 16, "BLOCK_N": 16}, device="cpu")
    bad = bench.compile_spec(c, "fp16", 1, {"BLOCK_H": 16, "NOT_A_KEY": 1}, device="cpu")
    pool = bench.CompilePool(2)
    try:
        out = pool.run([good, bad, dict(good)])
        assert len(out) == 2
        assert out[bench.compile_key(good)][0] == "ok", out
        st, msg, _ = out[bench.compile_key(bad)]
        assert st == "error" and "NOT_A_KEY" in msg
        # workers that cannot reach the device blame no config: the caller compiles itself
        with pytest.raises(RuntimeError, match="cannot use the device"):
            pool.run([bench.compile_spec(c, "fp16", 1, {"BLOCK_N": 32}, device="cuda")])
    finally:
        pool.close()


def test_grid_stage_times_a_bins_candidates_on_each_of_its_points():
    """Every point of a table bin (heads group, qlen group, batch) gets the same candidates, so
    the bin's choice can weigh each of them on all its points (a q4-B1 winner timed only at
    q4-B1 could not be chosen for a bin that also holds q8-B1)."""
    grid = sweep.grid_points()
    tiles = sweep.tile_points(grid)
    res = sweep.Results()
    for i, p in enumerate(tiles):  # a distinct winner per tile point
        _ok(res, p, {**_defaults(p), "BLOCK_N": 16 + i}, 1.0)
    qgroups = GROUPS_Q
    tasks = sweep.plan_stage("grid", tiles, grid, res, _defaults, _splits_of, sweep.Space(), 132,
                             GROUPS_H, qgroups)
    per_point: dict[str, set] = {}
    for p, c, s, h in tasks:
        if c != _defaults(p):
            per_point.setdefault(sweep.point_key(p), set()).add(sweep.config_key(c))
    bins: dict[tuple, list[set]] = {}
    for p in grid:
        key = (sweep.group_of(p.H, GROUPS_H), sweep.group_of(p.qlen, qgroups), p.B)
        bins.setdefault(key, []).append(per_point.get(sweep.point_key(p), set()))
    # points already measured with a candidate drop it from their tasks: compare the union
    assert any(len(v) > 1 for v in bins.values())
    for key, sets in bins.items():
        union = set().union(*sets)
        for p in grid:
            if (sweep.group_of(p.H, GROUPS_H), sweep.group_of(p.qlen, qgroups), p.B) != key:
                continue
            measured = {sweep.config_key(r["config"]) for r in res.records
                        if r["point"] == sweep.point_key(p)}
            assert union <= per_point.get(sweep.point_key(p), set()) | measured, key
