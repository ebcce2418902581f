"""The benchmark package on the CPU: the named shapes and roofline formulas, the timing and
results helpers, each script's command line (``--interpret`` runs through the Triton
interpreter), the compile pool's protocol, the decode sweep's planning and the tables both
sweeps write through ``mla_ops.tuning``, and FlashMLA's column with a stand-in module. A fake
kernel (the plain-PyTorch reference) stands in where a whole path is exercised many times."""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import types

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builders import decode_case, encoder_case  # noqa: E402

from benchmarks import (  # noqa: E402
    ab_decode_verify,
    ab_prefill,
    benchmark_decode_verify,
    benchmark_vit_prefill_attn,
    cli,
    compile_pool,
    decode,
    harness,
    kernel_times,
    prefill,
    results,
    shapes,
    sweep_decode_verify,
    vit_towers_e2e,
)
from benchmarks import decode_sweep as ds  # noqa: E402
from mla_ops import platform, tuning  # noqa: E402
from mla_ops.decode_verify.configs import VERIFY_DEFAULT_CONFIG, select_verify_config  # noqa: E402
from mla_ops.decode_verify.splits import verify_num_kv_splits  # noqa: E402
from mla_ops.reference import decode_verify_ref  # noqa: E402

# The anchors' decode table (H200, 2026-11-30): shape -> (H, qlen, B, L, fp8, roofline µs)
ANCHORS = {
    "M1": (16, 2, 1, 8192, False, 2.2),
    "M2": (16, 2, 32, 4096, False, 35.9),
    "M3": (16, 4, 128, 4096, False, 145.7),
    "M4": (16, 2, 16, 32768, True, 71.0),
    "M5": (128, 1, 128, 4096, False, 215.2),
    "M6": (128, 4, 32, 4096, False, 215.0),
    "M7": (128, 2, 16, 32768, True, 430.4),
}
bench = benchmark_decode_verify

# The interpreter runs and the CPU-side config expectations (no Gluon family on a CPU) hold on
# a machine without a GPU; the GPU runs the scripts themselves.
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(),
                              reason="CPU semantics (interpreter, no sm_90 Gluon family)")


# --- shapes and formulas ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ANCHORS))
def test_named_shapes_and_their_roofline_column(name):
    H, qlen, B, L, fp8, roof_us = ANCHORS[name]
    s = shapes.SHAPES[name]
    c = s.case
    assert (c.H, c.qlen, c.B, c.L, c.fp8, c.page_size, c.name) == (H, qlen, B, L, fp8, 64, name)
    us, _ = shapes.roofline(shapes.unique_bytes(c), shapes.flops(c), 4.27, 678.5)
    assert us == pytest.approx(roof_us, rel=0.02)
    assert s.roofline_us == pytest.approx(roof_us, rel=1e-3)


def test_m1_bytes_and_flops_by_hand():
    c = shapes.SHAPES["M1"].case
    rows = 1 * 2 * 16
    assert shapes.kv_bytes(c) == 8192 * 576 * 2 == 9_437_184
    assert shapes.unique_bytes(c) == 9_437_184 + rows * (576 * 2 + 512 * 2 + 4)
    assert shapes.flops(c) == 2 * 16 * (576 + 512) * (8191 + 8192)
    assert shapes.roofline(shapes.unique_bytes(c), shapes.flops(c), 4.27, 678.5)[1] == "memory"
    for name in ("M5", "M6", "M7"):
        c = shapes.SHAPES[name].case
        assert shapes.roofline(shapes.unique_bytes(c), shapes.flops(c), 4.27, 678.5)[1] == "compute"


def test_fp8_cache_halves_the_kv_bytes_only():
    bf = shapes.Case(16, 2, 16, 32768, False)
    f8 = shapes.Case(16, 2, 16, 32768, True)
    assert shapes.kv_bytes(bf) == 2 * shapes.kv_bytes(f8)
    assert (shapes.unique_bytes(f8) - shapes.kv_bytes(f8)
            == shapes.unique_bytes(bf) - shapes.kv_bytes(bf))
    assert shapes.flops(bf) == shapes.flops(f8)


def test_row_limits_and_the_per_token_feed():
    assert shapes.row_limits(10, 3) == [8, 9, 10]
    assert shapes.row_limits(10, 3, L_real=8) == [8, 8, 8]
    assert shapes.row_limits(2, 4) == [0, 0, 1, 2]
    assert shapes.sum_row_limits(5, 10, 3) == 5 * 27
    assert shapes.baseline_seq_lens(10, 3, 2) == [8, 9, 10, 8, 9, 10]
    b = shapes.baseline_case(shapes.SHAPES["M3"].case)
    assert (b.H, b.qlen, b.B, b.L, b.name) == (16, 1, 512, 4096, None)
    assert shapes.SHAPES["M1"].case.key == "H16-q2-B1-L8192-bf16-p64"


def test_targets():
    t = shapes.SHAPES["M1"].target
    assert t.met(9.9, 0.1, 1.0) and not t.met(10.1, 1.0, 1000.0)
    t = shapes.SHAPES["M2"].target
    assert t.met(1e6, 0.85, 0.0) and not t.met(1.0, 0.84, 1000.0)
    t = shapes.SHAPES["M7"].target
    assert t.met(1e6, 0.0, 400.0) and not t.met(1.0, 1.0, 399.0)
    assert [shapes.SHAPES[n].target.describe() for n in ("M1", "M4", "M5")] == \
        ["<=10us", ">=80%", ">=400TF"]


def test_prefill_shapes_and_flops():
    assert shapes.PREFILL_SHAPES["P2"] == (1, 3520, 16, 72)
    assert shapes.PREFILL_SHAPES["P8"] == (4, 4096, 16, 80)
    assert shapes.prefill_tflops(1, 1000, 2, 64, False, 1.0) == pytest.approx(
        4 * 1000**2 * 2 * 64 / 1e-3 / 1e12)
    assert shapes.prefill_tflops(1, 1000, 2, 64, True, 1.0) == pytest.approx(
        shapes.prefill_tflops(1, 1000, 2, 64, False, 2.0))


# --- harness, results, cli ----------------------------------------------------------------------


def test_rotation_calls_each_copy_and_time_call_counts_per_call(monkeypatch):
    seen = []
    fn = harness.rotating(seen.append, ["a", "b", "c"])
    fn()
    assert seen == ["a", "b", "c"]
    monkeypatch.setattr(harness, "time_wall_us", lambda f: 1200.0)
    assert harness.time_call(fn, "cpu", calls_per_fn=3) == (400.0, 1)
    assert harness.time_ms(fn, "cpu") == pytest.approx(1.2)
    nominal = shapes.ANCHOR_CEILINGS
    assert harness.ceilings("cpu", True, nominal) == nominal
    # graph replays: prequeued by default, as many as fit in the target time, 20 to the cap
    assert harness.replay_plan(100.0, 200, 60.0, True) == (200, harness.PREQUEUE_CYCLES)
    assert harness.replay_plan(1000.0, 200, 60.0, False) == (60, 0)
    assert harness.replay_plan(1e5, 200, 60.0, True)[0] == 20
    assert harness.l2_bytes("cpu") is None


def test_json_carries_env_command_and_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("MLA_OPS_COMMIT", "abc1234")
    path = tmp_path / "sub" / "r.json"
    results.write_json(path, [{"x": 1.5}], {"copy_TBps": 4.0},
                       command=results.command_line("x.py", ["--shape", "M1 M2"]))
    doc = json.loads(path.read_text())
    assert doc["env"]["commit"] == "abc1234" and doc["env"]["torch"] == torch.__version__
    assert doc["command"] == "python benchmarks/x.py --shape 'M1 M2'"
    assert doc["ceilings"] == {"copy_TBps": 4.0} and doc["rows"] == [{"x": 1.5}]


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="no git executable")


@needs_git
@pytest.mark.skipif(not (ROOT / ".git").exists(),
                    reason="this tree is not a git checkout (a copy without .git, as on the "
                           "device): it has no commit of its own to compare")
def test_commit_is_this_checkouts_head(monkeypatch):
    monkeypatch.delenv("MLA_OPS_COMMIT", raising=False)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert results.git_commit().split("+")[0] == head


@needs_git
def test_commit_of_a_tree_without_its_own_checkout_is_none(tmp_path, monkeypatch):
    """No checkout, or a tree inside another repository: None (not the outer repository's
    commit); a checkout: its HEAD, ``+dirty`` when a tracked file changed."""
    monkeypatch.delenv("MLA_OPS_COMMIT", raising=False)
    monkeypatch.setattr(results, "ROOT", tmp_path)  # not a checkout
    assert results.git_commit() is None
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "f").write_text("1")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "f"], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    (repo / "sub").mkdir()
    monkeypatch.setattr(results, "ROOT", repo / "sub")  # a tree inside another repository
    assert results.git_commit() is None
    monkeypatch.setattr(results, "ROOT", repo)
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert results.git_commit() == head
    (repo / "f").write_text("2")
    assert results.git_commit() == head + "+dirty"


def test_print_table(capsys):
    results.print_table([{"a": 1.23456, "b": None}, {"a": 12345.6, "b": "x"}], ["a", "b"])
    assert capsys.readouterr().out.splitlines() == ["    a  b", " 1.23   ", "12346  x"]


def test_split_names():
    p = cli.argparse.ArgumentParser()
    known = ["M1", "M2", "M3"]
    assert cli.split_names(p, ["M2", "M1,M3"], known) == ["M2", "M1", "M3"]
    assert cli.split_names(p, ["all"], known) == known
    assert cli.split_names(p, None, known) is None
    with pytest.raises(SystemExit):
        cli.split_names(p, ["M4"], known)


# --- the decode benchmark's command line ---------------------------------------------------------


@pytest.mark.parametrize("argv, names", [
    ([], list(ANCHORS)),
    (["--shape", "M3"], ["M3"]),
    (["--shape", "all"], list(ANCHORS)),
    (["--shape", "M1,M4"], ["M1", "M4"]),
    (["--shape", "M7", "M2"], ["M7", "M2"]),
], ids=["default", "one", "all", "comma", "spaces"])
def test_shape_names(argv, names):
    assert [c.name for c in bench.resolve_cases(bench.parse_args(argv))] == names


@pytest.mark.parametrize("argv", [
    ["--shape", "M9"],
    ["--shape", "M1", "--heads", "16"],
    ["--shape", "M2", "--fp8"],
    ["--heads", "0"],
    ["--splits", "0"],
    ["--rotate", "0"],
    ["--interpret", "--shape", "M1"],
    ["--family", "cuda"],
], ids=["unknown", "shape-and-grid", "shape-fp8", "zero-heads", "zero-splits", "zero-rotate",
        "interpret-named", "bad-family"])
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
    (c,) = bench.resolve_cases(bench.parse_args(["--shape", "M2", "--page-size", "16"]))
    assert (c.name, c.page_size, c.B) == ("M2", 16, 32)
    args = bench.parse_args(["--interpret"])
    assert args.dtype == "fp16" and bench.resolve_cases(args) == [shapes.INTERPRET_CASE]


def test_launch_knobs_become_config_overrides():
    args = bench.parse_args(["--shape", "M3", "--block-h", "32", "--block-n", "16",
                             "--num-warps", "4", "--num-stages", "3", "--qsplit", "1",
                             "--min-split-len", "128", "--tma", "0", "--splits", "6"])
    assert decode.launch_overrides(args) == {"BLOCK_H": 32, "BLOCK_N": 16, "num_warps": 4,
                                             "num_stages": 3, "QSPLIT": 1, "MIN_SPLIT_LEN": 128,
                                             "TMA": 0}
    assert args.splits == 6
    assert decode.launch_overrides(bench.parse_args([])) == {}
    over = decode.launch_overrides(bench.parse_args(["--family", "gluon", "--block-n", "16"]))
    assert over == {"family": "gluon", "BLOCK_N": 16}
    assert decode.family_only(over) == {"family": "gluon"} and decode.family_only({}) == {}
    assert {k for k, _ in decode.KNOBS.values()} == set(VERIFY_DEFAULT_CONFIG)


# --- configs and split counts through the tuning module ------------------------------------------


@CPU_ONLY
def test_configs_and_splits_are_the_launchers(monkeypatch):
    api = decode.load_api()
    api.sm_count = 132
    m1, m2 = shapes.SHAPES["M1"].case, shapes.SHAPES["M2"].case
    with platform.mock_platform("sm_90", sm_count=132, interpret=False):
        cfg = decode.effective_config(api, m2, {"BLOCK_N": 16})
        assert cfg == {**select_verify_config(32, 2, 16), "BLOCK_N": 16}
        assert decode.effective_config(api, m2, None) == select_verify_config(32, 2, 16)
        assert decode.effective_config(api, shapes.SHAPES["M4"].case, None) == \
            select_verify_config(16, 2, 16, fp8=True)
        with pytest.raises(ValueError, match="unknown kernel family 'cutlass'"):
            decode.effective_config(api, m2, {"family": "cutlass"})
        with pytest.raises(ValueError, match="SWAP_AB with num_stages 1 is refused"):
            decode.effective_config(api, m2, {"SWAP_AB": 1, "num_stages": 1})
        # the split cap of plan_verify: the config's own BLOCK_H and MIN_SPLIT_LEN
        cfg = decode.effective_config(api, m1, None)
        assert decode.default_splits(api, m1, cfg) == verify_num_kv_splits(8192, 1, 2, 16) == 66
        cfg = decode.effective_config(api, m1, {"SPLIT_WORK": 128})  # the heuristic's target
        assert decode.default_splits(api, m1, cfg) == 64
        cfg = decode.effective_config(api, m2, {"BLOCK_H": 16})
        assert decode.default_splits(api, m2, cfg) == 2 != decode.default_splits(
            api, m2, decode.effective_config(api, m2, None))
    # the cache is a fact of the selection: a table may choose by it
    kernel = tuning.KERNELS["decode_verify"]
    kernel.builtin["bench-test"] = {"arch": "bench-test", "rules": [
        {"match": {"cache": "fp8"}, "config": {"BLOCK_N": 16}}, {"config": {}}]}
    tuning.table.cache_clear()
    try:
        with platform.mock_platform("bench-test", interpret=False):
            assert decode.effective_config(api, shapes.SHAPES["M4"].case, None)["BLOCK_N"] == 16
            assert decode.effective_config(api, m2, None)["BLOCK_N"] == 32
    finally:
        del kernel.builtin["bench-test"]
        tuning.table.cache_clear()


def test_table_config_is_complete_ordered_and_names_only_another_family():
    got = decode.table_config({"family": "triton", "QSPLIT": 1, "BLOCK_H": 16, "kpack": 2})
    assert list(got) == [*VERIFY_DEFAULT_CONFIG, "kpack"]
    assert got == {**VERIFY_DEFAULT_CONFIG, "QSPLIT": 1, "BLOCK_H": 16, "kpack": 2}
    assert decode.table_config({"family": "cutlass", "X": 1}) == {"family": "cutlass", "X": 1}
    got = decode.table_config({"family": "gluon", "QK_FIRST": 1})
    assert list(got)[:2] == ["family", "BLOCK_H"] and got["QK_FIRST"] == 1


# --- inputs, calls and checks --------------------------------------------------------------------


def test_inputs_are_random_and_paged_by_a_permutation():
    c = shapes.Case(4, 3, 3, 70, True, 16)
    inp = decode.make_inputs(c, "cpu", torch.float16, rotate=2)
    pages = math.ceil(70 / 16)
    assert inp.req_to_token.shape == (3, pages) and inp.req_to_token.dtype == torch.int32
    assert sorted(inp.req_to_token.flatten().tolist()) == list(range(3 * pages))
    assert inp.req_to_token.flatten().tolist() != list(range(3 * pages))
    assert len(inp.kv) == 2 and not torch.equal(inp.kv[0].float(), inp.kv[1].float())
    assert inp.kv[0].dtype == torch.float8_e4m3fn and inp.k_scale is not None
    assert inp.kv[0].float().abs().max() > 0 and inp.q.abs().min() >= 0 and inp.q.abs().max() > 0
    assert inp.seq_lens.tolist() == [70] * 3
    b = decode.make_baseline_inputs(c, inp)
    assert b.req_to_token.shape == (9, pages)
    assert torch.equal(b.req_to_token[3:6], inp.req_to_token[1:2].expand(3, -1))
    assert b.seq_lens.tolist() == [68, 69, 70] * 3
    assert b.q is inp.q and b.o is not inp.o


def test_compare_flags_nan_and_measures_error():
    ref_o, ref_lse = torch.randn(4, 2, 8), torch.randn(4, 2)
    ok = decode.judge(decode.compare(ref_o + 1e-4, ref_lse, ref_o, ref_lse), 1e-3)
    assert ok["ok"] and ok["err_o_rel"] < 1e-3 and ok["err_lse_abs"] == 0 and not ok["nan"]
    o = ref_o.clone()
    o[1, 1, 3] = float("nan")
    bad = decode.compare(o, ref_lse, ref_o, ref_lse)
    assert bad["nan"] and bad["err_o_rel"] == float("inf")
    lse = ref_lse.clone()
    lse[0, 0] = float("-inf")  # a row that sees keys reported as empty
    assert decode.compare(ref_o, lse, ref_o, ref_lse)["err_lse_abs"] == float("inf")
    empty = ref_lse.clone()
    empty[0, 0] = float("-inf")  # a row that sees no key given a finite lse
    assert decode.compare(ref_o, ref_lse, ref_o, empty)["err_lse_abs"] == float("inf")
    assert not decode.judge(decode.compare(ref_o * 1.1, ref_lse, ref_o, ref_lse), 1e-2)["ok"]
    # check_call poisons the outputs first: a call that writes nothing fails, even after a good one
    c = shapes.Case(2, 2, 1, 20, False, 16)
    inp = decode.make_inputs(c, "cpu", torch.float16)
    ref = decode_verify_ref(inp.q, inp.kv[0], 512, inp.req_to_token, inp.seq_lens, None, 2,
                            0.1352, 16)

    def good():
        inp.o.copy_(ref[0])
        inp.lse.copy_(ref[1])

    assert decode.check_call(good, inp, ref, 1e-2)["ok"]
    assert not decode.check_call(lambda: None, inp, ref, 1e-2)["ok"]


def test_make_call_runs_the_kernel_on_each_copy(device):
    """The benchmark's call, on the builders' variable-length batch, through the real kernel:
    the tolerance rule of the tests holds, and the rotation runs every cache copy."""
    case = decode_case(device, batch=2, heads=2, qlen=2, lens=(37, 50), page=16, Lv=512,
                       rope=64, dtype=torch.float16)
    o, lse, _ = case.outputs()
    inp = decode.Inputs(case.q, [case.k_buffer, case.k_buffer.clone()], case.req_to_token,
                        case.seq_lens, case.k_scale, o, lse)
    api = decode.load_api()
    seen = []
    kernel = api.decode_attention_fwd_verify
    api.decode_attention_fwd_verify = lambda q, k, *a, **kw: (seen.append(k),
                                                              kernel(q, k, *a, **kw))
    decode.make_call(api, inp, 2, 2, case.sm_scale, 16, {"BLOCK_N": 16})()
    assert [k is c for k, c in zip(seen, inp.kv)] == [True, True]
    case.assert_matches(inp.o, inp.lse)
    assert decode.check_call(decode.make_call(api, inp, 2, 1, case.sm_scale, 16, None, 1),
                             inp, case.reference(), decode.CHECK_RTOL["fp16"])["ok"]


def _fake_api(bad_block_h=None, raise_stages=None):
    """The reference as the kernel, with the real tuning module's selection and checks."""

    def kernel(q, k, v, o, lse, rtt, seq, real, qlen, logits, splits, sm_scale, page,
               k_scale=None, *, config=None):
        cfg = select_verify_config(1, qlen, q.shape[1], config=config)
        if raise_stages is not None and cfg["num_stages"] == raise_stages:
            raise RuntimeError("out of resource: shared memory, Required: 300000")
        ro, rl = decode_verify_ref(q, k, v.shape[-1], rtt, seq, real, qlen, sm_scale, page,
                                   k_scale)
        o.copy_(ro + (1.0 if cfg["BLOCK_H"] == bad_block_h else 0.0))
        lse.copy_(rl)

    def splits(L, B, qlen, H, sm, block_h=None, min_work_per_split=None, balance=None):
        return 2 if block_h == 32 else 3

    return decode.Api(kernel, select_verify_config, splits, decode_verify_ref, 132)


CEILINGS = dict(shapes.ANCHOR_CEILINGS)


@CPU_ONLY
def test_run_case_on_cpu_checks_times_and_fills_every_field():
    args = bench.parse_args(["--interpret", "--check"])
    row = decode.run_case(_fake_api(), shapes.INTERPRET_CASE, args, "cpu", CEILINGS, None)
    for k in ("time_us", "unique_bytes", "TBps", "TFLOPs", "roofline_us", "roofline_frac",
              "baseline_us", "speedup", "num_kv_splits", "config", "check", "baseline_check",
              "baseline_num_kv_splits", "baseline_config"):
        assert k in row, k
    assert row["check"]["ok"] and row["baseline_check"]["ok"]
    assert row["num_kv_splits"] == 2 and row["config"]["BLOCK_H"] == 32
    assert row["baseline_num_kv_splits"] == 2 and row["speedup"] == pytest.approx(
        row["baseline_us"] / row["time_us"])
    assert "flashmla_us" not in row
    json.dumps(row)
    table, columns = decode.table([row])
    assert columns == decode.TABLE_COLUMNS and table[0]["cache"] == "fp16"


@pytest.mark.parametrize("argv, prequeue", [([], True), (["--no-prequeue"], False)])
def test_timing_method(monkeypatch, argv, prequeue):
    """Graph replays behind a queued GPU sleep unless --no-prequeue, the same for ours and the
    feed, per call of an L2 rotation."""
    seen = []

    def time_call(fn, device, **kw):
        seen.append(kw)
        return 10.0, 20

    monkeypatch.setattr(harness, "time_call", time_call)
    args = bench.parse_args(["--interpret", "--rotate", "3", "--replays", "50", *argv])
    row = decode.run_case(_fake_api(), shapes.INTERPRET_CASE, args, "cpu", CEILINGS, None)
    assert seen == [dict(max_replays=50, calls_per_fn=3, prequeue=prequeue)] * 2
    assert row["prequeued"] is prequeue and row["rotate"] == 3


@CPU_ONLY
def test_the_feed_keeps_its_own_config_but_the_family():
    args = bench.parse_args(["--interpret", "--block-n", "16", "--splits", "5"])
    row = decode.run_case(_fake_api(), shapes.INTERPRET_CASE, args, "cpu", CEILINGS, None)
    assert row["config"]["BLOCK_N"] == 16 and row["num_kv_splits"] == 5
    assert row["baseline_config"]["BLOCK_N"] == 32 and row["baseline_num_kv_splits"] == 2
    specs = bench.compile_specs(_fake_api(), [shapes.INTERPRET_CASE], args)
    assert [s["config"] for s in specs] == [{"BLOCK_N": 16}, {}]
    assert [(s["qlen"], s["splits"]) for s in specs] == [(2, 5), (1, 2)]
    args = bench.parse_args(["--interpret", "--family", "triton", "--block-n", "16"])
    assert bench.compile_specs(_fake_api(), [shapes.INTERPRET_CASE], args)[1]["config"] == \
        {"family": "triton"}


def test_check_fails_the_run_on_a_wrong_kernel():
    args = bench.parse_args(["--interpret", "--check", "--block-h", "16"])
    with pytest.raises(SystemExit) as e:
        decode.run_case(_fake_api(bad_block_h=16), shapes.INTERPRET_CASE, args, "cpu", CEILINGS,
                        None)
    assert e.value.code == 1


# --- FlashMLA beside ours -------------------------------------------------------------------------


def _fake_flashmla(wrong=False):
    """flash_mla's two calls and layouts (q [B, s_q, H, 576], o [B, s_q, H, 512], lse
    [B, H, s_q]), computed by the reference."""
    calls = []

    def get_mla_metadata(cache_seqlens, heads_per_k, h_k):
        calls.append(("meta", heads_per_k, h_k))
        return "meta", None

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, meta,
                               num_splits, softmax_scale=None, causal=False):
        assert meta == "meta" and num_splits is None and causal
        B, s_q, H, D = q.shape
        calls.append(("call", k_cache))
        o, lse = decode_verify_ref(q.reshape(B * s_q, H, D), k_cache, head_dim_v, block_table,
                                   cache_seqlens, None, s_q, softmax_scale, k_cache.shape[1])
        o = o.to(q.dtype) + (1.0 if wrong else 0.0)
        return o.view(B, s_q, H, head_dim_v), lse.view(B, s_q, H).transpose(1, 2)

    return types.SimpleNamespace(get_mla_metadata=get_mla_metadata,
                                 flash_mla_with_kvcache=flash_mla_with_kvcache, calls=calls)


def test_flashmla_runs_in_its_layouts_beside_ours(monkeypatch):
    c = shapes.Case(4, 3, 2, 100, False, 64)
    assert decode.flashmla_applies(c, "bf16", "cuda")
    assert not decode.flashmla_applies(shapes.Case(4, 3, 2, 100, True, 64), "bf16", "cuda")
    assert not decode.flashmla_applies(shapes.Case(4, 3, 2, 100, False, 16), "bf16", "cuda")
    assert not decode.flashmla_applies(c, "fp16", "cuda")
    fm = _fake_flashmla()
    inp = decode.make_inputs(c, "cpu", torch.float16, rotate=2)
    fn, first = decode.flashmla_call(fm, inp, c, 0.1352)
    o, lse = first()
    ref_o, ref_lse = decode_verify_ref(inp.q, inp.kv[0], 512, inp.req_to_token, inp.seq_lens,
                                       None, 3, 0.1352, 64)
    assert decode.judge(decode.compare(o, lse, ref_o, ref_lse), 1e-2)["ok"]
    assert fm.calls[0] == ("meta", 3 * 4, 1)
    fm.calls.clear()
    fn()
    assert [k is kv for (_, k), kv in zip(fm.calls, inp.kv)] == [True, True]
    monkeypatch.setitem(sys.modules, "flash_mla", None)  # not installed: no column, no message
    assert decode.load_flashmla() is None


@pytest.mark.parametrize("wrong", [False, True])
def test_flashmla_column_is_checked_and_timed(monkeypatch, wrong):
    monkeypatch.setattr(decode, "flashmla_applies", lambda case, dtype, device: True)
    args = bench.parse_args(["--interpret", "--check", "--no-baseline"])
    row = decode.run_case(_fake_api(), shapes.INTERPRET_CASE, args, "cpu", CEILINGS, None,
                          _fake_flashmla(wrong))
    assert row["flashmla_check"]["ok"] is not wrong
    assert ("flashmla_us" in row) is not wrong  # a wrong FlashMLA gets no time
    if not wrong:
        assert row["vs_flashmla"] == pytest.approx(row["flashmla_us"] / row["time_us"])
        _, columns = decode.table([row])
        assert columns[-4:] == ["flashmla_us", "vs_flashmla", "target", "pass"]


# --- the scripts, in this process ----------------------------------------------------------------


@CPU_ONLY
def test_benchmark_interpret_run_writes_json(tmp_path, capsys):
    out = tmp_path / "d.json"
    assert bench.main(["--interpret", "--check", "--no-baseline", "--min-split-len", "16",
                       "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["check"]["ok"] and row["num_kv_splits"] > 1 and row["config"]["MIN_SPLIT_LEN"] == 16
    assert doc["command"].startswith("python benchmarks/benchmark_decode_verify.py --interpret")
    assert doc["ceilings"]["source"].startswith("nominal") and "commit" in doc["env"]
    assert "time_us" in capsys.readouterr().out


def test_benchmark_family_the_machine_cannot_run_fails_by_name():
    """--family gluon where the sm_90 Gluon kernel cannot run (here: the interpreter) is the
    launcher's clear refusal, never a silent fall back to another family's timing."""
    with pytest.raises(ValueError, match="config: the gluon family cannot run this launch"):
        bench.main(["--interpret", "--family", "gluon"])


@CPU_ONLY
def test_drafts_interpret_run_checks_and_writes_json(tmp_path, capsys):
    """--drafts: each workload checked against the reference and timed against the causal
    verify of the same rows, the padded batch (ragged ones) and the flat per-token feed."""
    out = tmp_path / "t.json"
    assert bench.main(["--interpret", "--drafts", "eagle8,ragged8", "--check",
                       "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    eagle, ragged = doc["rows"]
    assert eagle["drafts"] == "eagle8" and eagle["rows"] == 2 * 8 and eagle["check"]["ok"]
    assert "padded_us" not in eagle and eagle["causal_rows"] == 16 and eagle["tree_target"] == 1.1
    assert ragged["rows"] == sum(ragged["draft_counts"]) and ragged["check"]["ok"]
    assert all(1 <= n <= 8 for n in ragged["draft_counts"]) and ragged["padded_rows"] == 16
    assert ragged["padded_target"] == pytest.approx(0.8 * 16 / ragged["rows"])
    for r in doc["rows"]:
        assert r["time_us"] > 0 and r["causal_us"] > 0 and r["flat_us"] > 0
    assert "vs_causal" in capsys.readouterr().out


def test_drafts_grid_and_bad_arguments():
    cases = bench.resolve_draft_cases(bench.parse_args(["--drafts", "all"]))
    assert [(d.name, c.H, c.qlen, c.B, c.L) for d, c in cases][:2] == [
        ("eagle8", 16, 8, 32, 4096), ("eagle8", 128, 8, 32, 4096)]
    assert {d.name for d, _ in cases} == set(shapes.DRAFTS)
    cases = bench.resolve_draft_cases(bench.parse_args(["--drafts", "eagle16", "--heads", "64",
                                                        "--batch", "4", "--seq-len", "100"]))
    assert [(c.H, c.qlen, c.B, c.L) for _, c in cases] == [(64, 16, 4, 100)]
    for bad in (["--drafts", "eagle9"], ["--drafts", "eagle8", "--shape", "M1"],
                ["--drafts", "ragged8", "--qlen", "4"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_ab_interpret_times_variants_and_reports_refused_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(decode, "load_api", _fake_api)
    out = tmp_path / "ab.json"
    assert ab_decode_verify.main(["--interpret", "--rounds", "2", "--variant", "{}",
                                  '{"BLOCK_N": 16, "splits": 3, "name": "n16"}',
                                  '{"family": "cutlass"}', "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r.get("variant") for r in rows] == ['{"family": "cutlass"}', "table", "n16"]
    assert "unknown kernel family" in rows[0]["error"]
    assert rows[1]["ratio"] == 1.0 and len(rows[2]["times_us"]) == 2
    assert rows[2]["num_kv_splits"] == 3 and rows[2]["config"]["BLOCK_N"] == 16
    monkeypatch.setattr(decode, "load_api", lambda: _fake_api(bad_block_h=16))
    assert ab_decode_verify.main(["--interpret", "--rounds", "1", "--variant",
                                  '{"BLOCK_H": 16}']) == 1


def test_ab_cache_runs_named_shapes_with_other_caches():
    args = ab_decode_verify.parse_args(["--shape", "M7", "M2", "--cache", "fp8", "bf16"])
    got = [(c.name, c.key) for c in ab_decode_verify.resolve_cases(args)]
    assert got == [("M7", "H128-q2-B16-L32768-fp8-p64"), (None, "H128-q2-B16-L32768-bf16-p64"),
                   (None, "H16-q2-B32-L4096-fp8-p64"), ("M2", "H16-q2-B32-L4096-bf16-p64")]
    own = ab_decode_verify.resolve_cases(ab_decode_verify.parse_args(["--shape", "M4"]))
    assert [(c.name, c.fp8) for c in own] == [("M4", True)]
    for bad in (["--grid", "--cache", "bf16"], ["--shape", "M4", "--cache", "fp16"]):
        with pytest.raises(SystemExit):
            ab_decode_verify.parse_args(bad)


def test_ab_case_runs_other_shapes_alone_or_after_the_named_ones():
    alone = ab_decode_verify.resolve_cases(ab_decode_verify.parse_args(
        ["--case", "16,4,1,8192,fp8", "128,1,2,100"]))
    assert [c.key for c in alone] == ["H16-q4-B1-L8192-fp8-p64", "H128-q1-B2-L100-bf16-p64"]
    both = ab_decode_verify.resolve_cases(ab_decode_verify.parse_args(
        ["--shape", "M1", "--case", "16,1,1,8192"]))
    assert [(c.name, c.key) for c in both] == [("M1", "H16-q2-B1-L8192-bf16-p64"),
                                               (None, "H16-q1-B1-L8192-bf16-p64")]
    for bad in (["--case", "16,4,1"], ["--case", "16,4,1,8192,fp16"], ["--case", "16,0,1,8"],
                ["--grid", "--case", "16,4,1,8192"]):
        with pytest.raises(SystemExit):
            ab_decode_verify.parse_args(bad)


def test_prefill_arguments():
    a = benchmark_vit_prefill_attn.parse_args(["--shape", "P2,P3", "--bm", "64", "--nw", "4",
                                               "--tma", "0", "--no-hint", "--no-split",
                                               "--backend", "TRITON_ATTN,sdpa-cudnn"])
    assert a.shape == ["P2", "P3"] and a.backend == "mla,sdpa-cudnn" and a.dtype == "bf16"
    assert prefill.launch_overrides(a) == {"BLOCK_M": 64, "num_warps": 4, "tma": False,
                                           "aligned": False, "split_head_dim": False}
    assert prefill.launch_overrides(a)["tma"] is False  # a bool, as the tables write it
    c = benchmark_vit_prefill_attn.parse_args(["--bn", "64", "--config", '{"PINGPONG": 0, "BLOCK_N": 128}'])
    assert prefill.launch_overrides(c) == {"BLOCK_N": 128, "PINGPONG": 0}  # --config last
    assert prefill.family_config("mla-gluon", prefill.launch_overrides(c))["family"] == "gluon"
    with pytest.raises(SystemExit):
        benchmark_vit_prefill_attn.parse_args(["--config", "{PINGPONG: 0}"])  # not JSON
    assert benchmark_vit_prefill_attn.shapes(a)[0] == ("P2", 1, 3520, 16, 72)
    a = benchmark_vit_prefill_attn.parse_args(["--seq", "100", "--head-dim", "80"])
    assert benchmark_vit_prefill_attn.shapes(a) == [("custom", 1, 100, 16, 80)]
    assert len(benchmark_vit_prefill_attn.parse_args(["--shape", "all"]).shape) == 10
    a = benchmark_vit_prefill_attn.parse_args(["--shape", "C7", "--backend", "mla-gluon,mla-triton"])
    assert benchmark_vit_prefill_attn.shapes(a) == [("C7", 4, 4096, 16, 72)]
    assert a.backend == "mla-gluon,mla-triton"
    assert prefill.family_config("mla-gluon", {"BLOCK_N": 64}) == {"BLOCK_N": 64, "family": "gluon"}
    assert prefill.family_config("mla", {}) is None
    for bad in (["--shape", "P9"], ["--backend", "sdpa-magic"], ["--interpret", "--shape", "P1"]):
        with pytest.raises(SystemExit):
            benchmark_vit_prefill_attn.parse_args(bad)


def test_prefill_direct_launch_is_the_api_launch(device):
    """The benchmark launches the kernel itself, with the launch context_attention_fwd makes."""
    case = encoder_case(device, lens=(40,), hq=2, hkv=2, d=72, causal=False)
    o = case.output()
    fn, cfg = prefill.mla_fn((case.q, case.k, case.v, o, case.b_start_loc, case.b_seq_len), 40,
                             False, {"BLOCK_M": 32, "BLOCK_N": 16})
    fn()
    case.assert_matches(o)
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_D"], cfg["BLOCK_D_TAIL"]) == (32, 16, 64, 16)


@CPU_ONLY
def test_prefill_interpret_run_and_sweep(tmp_path):
    out, table, log = tmp_path / "p.json", tmp_path / "t.json", tmp_path / "log.json"
    main = benchmark_vit_prefill_attn.main
    assert main(["--interpret", "--backend", "mla,mla-triton,mla-gluon,sdpa-default", "--json",
                 str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["max_abs_err"] < 1e-2 and row["ratio"] == pytest.approx(
        row["sdpa-default_ms"] / row["mla_ms"])
    # The portable family forced beside the table's launch; Gluon is skipped by the interpreter.
    assert row["mla-triton_max_abs_err"] < 1e-2 and "mla-gluon_ms" not in row
    assert row["target_ratio"] == 1.2 and row["config"]["BLOCK_D_TAIL"] == 16
    assert main(["--interpret", "--sweep", "--table-out", str(table), "--log", str(log)]) == 0
    text = table.read_text()
    rules = json.loads(text)["rules"]
    assert rules[0]["match"] == {"split": "64+16"} and rules[0]["points"][0]["head_dim"] == 72
    current = tuning.table("prefill", platform.current().arch)["rules"]
    gluon = [r for r in current if r["config"].get("family") == "gluon"]
    assert rules == gluon + rules[len(gluon):len(gluon) + 1] + [r for r in current if r not in gluon]
    assert len(json.loads(log.read_text())["rows"]) == 2


@CPU_ONLY
def test_prefill_ab_interpret_run_compares_variants(tmp_path, monkeypatch):
    out = tmp_path / "ab.json"
    variants = ['{}', '{"BLOCK_M": 16, "BLOCK_N": 16, "name": "small"}']
    assert ab_prefill.main(["--interpret", "--rounds", "2", "--variant", *variants,
                            "--json", str(out)]) == 0
    table, small = json.loads(out.read_text())["rows"]
    assert (table["variant"], small["variant"]) == ("table", "small")
    assert table["ratio"] == 1.0 and small["ratio"] == pytest.approx(small["ms"] / table["ms"])
    assert len(small["times_ms"]) == 2 and small["config"]["BLOCK_N"] == 16
    assert table["max_abs_diff"] == 0.0 and 0.0 < small["max_abs_diff"] < 1e-2 and small["ok"]
    # A variant whose output is off fails the run.
    real = prefill.mla_fn

    def off_by_one(inputs, seq, causal, config):
        fn, cfg = real(inputs, seq, causal, config)
        if not config or config.get("BLOCK_M") != 16:
            return fn, cfg
        return (lambda: (fn(), inputs[3].add_(1.0))), cfg

    monkeypatch.setattr(prefill, "mla_fn", off_by_one)
    assert ab_prefill.main(["--interpret", "--rounds", "1", "--graph", "--variant", *variants]) == 1
    # The same output as an ablation ("check": false) is timed, not compared.
    ablation = ['{}', '{"BLOCK_M": 16, "BLOCK_N": 16, "check": false}']
    assert ab_prefill.main(["--interpret", "--rounds", "1", "--variant", *ablation,
                            "--json", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][1]
    assert row["max_abs_diff"] > 0.5 and row["ok"] and not row["checked"]
    with pytest.raises(SystemExit):
        ab_prefill.parse_args(["--variant", "[1]"])
    with pytest.raises(SystemExit):  # the reference variant itself must be checked
        ab_prefill.parse_args(["--variant", '{"check": false}', '{}'])


def test_prefill_sweep_rules_and_the_table_they_make():
    def m(d, c, ms):
        return {"D": d, "cand": list(c), "ms": ms}

    a, b, c = (128, 64, 8, 3, True), (64, 64, 4, 3, False), (128, 32, 8, 2, True)
    splits = {(64, 16): [72, 80], (128, 0): [128], (256, 0): [256]}
    meas = [m(72, a, 1.0), m(80, a, 1.0), m(72, b, 0.9), m(80, b, 1.2),  # a: 2.0 < b: 2.1
            m(72, c, 0.5),  # c has no time at 80: not a candidate of the split
            m(128, b, 2.0), m(128, a, 2.5), {"D": 128, "cand": list(c), "error": "x"}]
    rules = prefill.choose_rules(splits, meas)
    assert [r["match"] for r in rules] == [{"split": "64+16"}, {"split": "128+0"}]
    assert rules[0]["config"] == prefill.cand_config(a)
    assert rules[0]["points"][0] == {"head_dim": 72, "ms": 1.0, "best_ms": 0.5, "candidates": 3}
    assert rules[1]["config"] == prefill.cand_config(b)
    text = prefill.table_with(rules, "sm_90", "test", {})
    table = json.loads(text)
    committed = tuning.table("prefill", "sm_90")["rules"]
    gluon = [r for r in committed if r["config"].get("family") == "gluon"]
    kept = [r for r in committed if r not in gluon
            and r.get("match", {}).get("split") not in ("64+16", "128+0")]
    # The Gluon rules (not swept) stay first; the swept splits' portable rules are replaced.
    assert gluon and table["rules"] == gluon + rules + kept
    assert len(kept) == len(committed) - len(gluon) - 2
    kernel = tuning.KERNELS["prefill"]
    kernel.builtin["bench-test"] = json.loads(text)
    tuning.table.cache_clear()
    try:
        facts = {"head_dim": 80, "split": "64+16", "aligned": True, "causal": False, "gluon": False}
        assert tuning.select("prefill", facts, arch="bench-test")["BLOCK_M"] == 128
        facts = {"head_dim": 256, "split": "256+0", "aligned": True, "causal": False,
                 "gluon": False}
        assert tuning.select("prefill", facts, arch="bench-test")["BLOCK_N"] == 32
    finally:
        del kernel.builtin["bench-test"]
        tuning.table.cache_clear()


@CPU_ONLY  # forcing the portable family launches Triton on CPU tensors: the interpreter only
def test_towers_interpret_run(tmp_path):
    out = tmp_path / "t.json"
    assert vit_towers_e2e.main(["--interpret", "--towers", "qwen2.5-vl", "--images", "2",
                                "--attn", "mla,mla-triton,sdpa", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["tower"] == "qwen2.5-vl" and row["images"] == 2
    assert row["rel_err"] < 1e-4 and row["speedup"] == pytest.approx(
        row["sdpa_ms"] / row["mla_ms"])
    # The portable family forced through the script's custom op: the same answers.
    assert row["rel_err_mla-triton"] < 1e-4 and row["speedup_mla-triton"] == pytest.approx(
        row["sdpa_ms"] / row["mla-triton_ms"])


# --- the scripts as commands ----------------------------------------------------------------------

def test_without_gpu_or_interpret_a_script_says_so(capsys, monkeypatch):
    if not torch.cuda.is_available():
        assert cli.pick_device(False, "x.py") is None
        err = capsys.readouterr().err
        assert err.startswith("x.py: no CUDA/HIP GPU") and "--interpret" in err
    assert cli.pick_device(True, "x.py") == "cpu"
    asked = []
    monkeypatch.setattr(cli, "pick_device", lambda interpret, prog: asked.append((interpret, prog)))
    mains = [bench.main, sweep_decode_verify.main, ab_decode_verify.main,
             benchmark_vit_prefill_attn.main, vit_towers_e2e.main, ab_prefill.main]
    assert [m([]) for m in mains] == [2] * 6
    assert asked == [(False, m.__module__.split(".")[-1] + ".py") for m in mains]


@CPU_ONLY
def test_a_script_runs_as_a_command_from_anywhere(tmp_path):
    """Run from another directory, without PYTHONPATH or TRITON_INTERPRET: the script finds the
    package and, for --interpret, sets TRITON_INTERPRET itself before triton is imported."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    out = tmp_path / "d.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "benchmark_decode_verify.py"),
                          "--interpret", "--no-baseline", "--json", str(out)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "Triton interpreter" in run.stdout
    assert json.loads(out.read_text())["rows"][0]["time_us"] > 0


def test_every_script_documents_its_flags(capsys):
    flags = {
        bench.parse_args: ["--shape", "--heads", "--qlen", "--batch", "--seq-len", "--page-size",
                           "--fp8", "--splits", "--block-h", "--tma", "--family", "--rotate",
                           "--no-prequeue", "--no-flashmla", "--json", "--check", "--interpret"],
        sweep_decode_verify.parse_args: ["--budget-s", "--write", "--log", "--resume", "--jobs",
                                         "--quick", "--stages", "--interpret"],
        ab_decode_verify.parse_args: ["--shape", "--variant", "--rounds", "--no-prequeue",
                                      "--json", "--interpret"],
        benchmark_vit_prefill_attn.parse_args: [
            "--seq", "--heads", "--head-dim", "--backend", "--bm", "--bn", "--nw", "--ns", "--we",
            "--shape", "--ceilings", "--sweep", "--json", "--workers", "--interpret"],
        vit_towers_e2e.main: ["--towers", "--images", "--rep-ms", "--json", "--interpret"],
    }
    for parse, want in flags.items():
        with pytest.raises(SystemExit) as e:
            parse(["--help"])
        assert e.value.code == 0
        text = capsys.readouterr().out
        assert [f for f in want if not re.search(rf"(?<![\w-]){f}(?![\w-])", text)] == [], \
            parse.__module__


# --- the decode sweep: grid, planning, table -----------------------------------------------------

GROUPS_H = ds.parse_groups(ds.DEFAULT_HEADS_GROUPS)
GROUPS_Q = ds.parse_groups(ds.DEFAULT_QLEN_GROUPS)


def _defaults(p):
    rows = p.B * p.qlen * p.H
    return {**VERIFY_DEFAULT_CONFIG, "BLOCK_H": 64, "num_warps": 8, "num_stages": 3,
            "MIN_SPLIT_LEN": 256 if rows <= 640 else 512, "S2_BLOCK_S": 16}


def _splits_of(p, cfg):
    return max(1, min(8, 132 // max(1, p.B * math.ceil(p.qlen * p.H / cfg["BLOCK_H"]))))


def test_grid_has_every_named_shape():
    grid = shapes.grid_points()
    assert len(grid) == 2 * 4 * 4 * 2
    assert sorted(p.name for p in grid if p.name) == list(ANCHORS)
    tiles = shapes.tile_points(grid)
    assert {p.name for p in tiles if p.name} == set(ANCHORS) and len(tiles) == 9
    assert sorted(p.name for p in shapes.tile_points(grid, True)) == list(ANCHORS)
    assert not any(p.name for p in shapes.grid_points(page_size=16))


def test_groups_and_batch_bins():
    assert ds.parse_groups("1,2/4") == [[1, 2], [4]]
    for bad in ("1,2/2", "0/1"):
        with pytest.raises(ValueError):
            ds.parse_groups(bad)
    assert all(ds.group_of(h, GROUPS_H) is not None for h in (8, 16, 32, 64, 128))
    assert all(ds.group_of(q, GROUPS_Q) is not None for q in range(1, 17))
    assert ds.batch_bins([32, 1, 128, 16, 1]) == [(1, 4), (16, 22), (32, 64), (128, None)]


def _ok(res, p, cfg, t, splits=None, stage="tile"):
    s = _splits_of(p, cfg) if splits is None else splits
    res.add({"point": p.key, "config": cfg, "splits": s, "heuristic": splits is None,
             "status": "ok", "time_us": t, "stage": stage})


def test_planning_follows_the_stages():
    grid = shapes.grid_points()
    tiles = shapes.tile_points(grid)
    res = ds.Results()
    space = ds.Space()

    def plan(stage):
        return ds.plan_stage(stage, tiles, grid, res, _defaults, _splits_of, space, 132, GROUPS_H)

    assert len(plan("default")) == len(tiles)
    tile = plan("tile")
    assert len(tile) == len(tiles) * (18 + len(space.swap_ab_tiles))
    assert all(t[2] == _splits_of(t[0], t[1]) and t[3] for t in tile)
    for i, (p, c, s, _) in enumerate(tile):  # BLOCK_N=16, 4 warps wins everywhere
        _ok(res, p, c, 10.0 + (c["BLOCK_N"] != 16) + (c["num_warps"] != 4) + 0.01 * i)
    assert plan("tile") == []  # measured already
    pipe = plan("pipeline")
    assert len({(p.key, c["BLOCK_H"]) for p, c, _, _ in pipe}) == 2 * len(tiles)
    assert all(c["BLOCK_N"] == 16 and c["num_warps"] == 4 for _, c, _, _ in pipe)
    for p, c, s, _ in pipe:
        _ok(res, p, c, 5.0 if c["num_stages"] == 4 else 20.0)
    feats = plan("features")
    assert feats and all(not (p.fp8 and c["TMA"]) for p, c, _, _ in feats)
    # MIN_SPLIT_LEN only where cdiv(L, splits) < 512; the stage-2 knobs only with > 1 split
    for p, c, s, _ in plan("splitlen"):
        assert s > 1 and math.ceil(p.L / s) < 512 and c["num_stages"] == 4
    for p, c, s, _ in plan("s2block") + plan("s2warps") + plan("pdl"):
        assert s > 1
    short = shapes.Case(16, 2, 1, 300)  # one split: MIN_SPLIT_LEN changes nothing there
    _ok(res, short, _defaults(short), 1.0, splits=1)
    _ok(res, short, _defaults(short), 1.0)
    assert ds.plan_stage("splitlen", [short], [short], res, _defaults, lambda p, c: 1, space,
                         132, GROUPS_H) == []
    splits = plan("splits")
    assert splits and all(not h and s != _splits_of(p, c) for p, c, s, h in splits)
    per_point = {}
    for p, c, s, h in plan("grid"):
        per_point.setdefault(p.key, []).append(c)
    others = [p for p in grid if p not in tiles]  # the tile points have their default measured
    assert set(per_point) >= {p.key for p in others}
    for p in tiles:
        assert _defaults(p) not in per_point.get(p.key, [])
    for p in others:
        cfgs = per_point[p.key]
        assert _defaults(p) in cfgs and 1 < len(cfgs) <= 1 + space.grid_candidates
        # the nearest tile points' winners: same heads group, so BLOCK_N 16 / 4 warps / 4 stages
        assert all(c["num_stages"] == 4 for c in cfgs if c != _defaults(p))


def test_quick_space_plans_fewer_runs():
    grid = shapes.grid_points()
    full = ds.plan_stage("tile", shapes.tile_points(grid), grid, ds.Results(), _defaults,
                         _splits_of, ds.Space(), 132, GROUPS_H)
    q = ds.QUICK_SPACE
    quick = ds.plan_stage("tile", shapes.tile_points(grid, q.named_only), grid, ds.Results(),
                          _defaults, _splits_of, q, 132, GROUPS_H)
    assert len(full) == 9 * (18 + 3) and len(quick) == 7 * (8 + 3)


def test_grid_stage_times_a_bins_candidates_on_each_of_its_points():
    """Every point of a table bin (heads group, qlen group, batch) gets the same candidates, so
    the bin's choice can weigh each of them on all its points."""
    grid = shapes.grid_points()
    tiles = shapes.tile_points(grid)
    res = ds.Results()
    for i, p in enumerate(tiles):  # a distinct winner per tile point
        _ok(res, p, {**_defaults(p), "BLOCK_N": 16 + i}, 1.0)
    tasks = ds.plan_stage("grid", tiles, grid, res, _defaults, _splits_of, ds.Space(), 132,
                          GROUPS_H, GROUPS_Q)
    per_point: dict[str, set] = {}
    for p, c, s, h in tasks:
        if c != _defaults(p):
            per_point.setdefault(p.key, set()).add(ds.config_key(c))

    def bin_of(p):
        return ds.group_of(p.H, GROUPS_H), ds.group_of(p.qlen, GROUPS_Q), p.B

    bins: dict[tuple, set] = {}
    for p in grid:
        bins.setdefault(bin_of(p), set()).update(per_point.get(p.key, set()))
    assert any(len(v) > 1 for v in bins.values())
    for p in grid:
        measured = {ds.config_key(r["config"]) for r in res.records if r["point"] == p.key}
        assert bins[bin_of(p)] <= per_point.get(p.key, set()) | measured, p.key


def test_nearest_winners_stay_in_the_heads_group():
    grid = shapes.grid_points()
    tiles = [t for t in shapes.tile_points(grid) if t.H == 16 or t.name == "M5"]
    res = ds.Results()
    for i, p in enumerate(tiles):
        _ok(res, p, {**_defaults(p), "BLOCK_N": 16 + i}, 1.0)
    m6 = shapes.SHAPES["M6"].case
    assert ds.nearest_winners(m6, tiles, res, GROUPS_H, 3) == res.top(
        shapes.SHAPES["M5"].case.key, 1)
    m2 = shapes.SHAPES["M2"].case  # its own winner first, then the nearest (qlen, cache, batch)
    got = ds.nearest_winners(m2, tiles, res, GROUPS_H, 2)
    assert got[0] == res.top(m2.key, 1)[0] and len(got) == 2


def test_choose_config_minimises_the_geometric_mean_ratio():
    p1, p2 = shapes.Case(16, 2, 32, 4096), shapes.Case(16, 2, 32, 4096, True)
    a = {**_defaults(p1), "BLOCK_H": 32}
    b = {**_defaults(p1), "BLOCK_H": 64}
    res = ds.Results()
    _ok(res, p1, a, 10.0)
    _ok(res, p2, a, 30.0)  # a: 1.0 and 1.5x
    _ok(res, p1, b, 12.0)
    _ok(res, p2, b, 20.0)  # b: 1.2x and 1.0: geomean 1.095 < 1.225
    cfg, ev = ds.choose_config([p1, p2], res, a)
    assert cfg == b and [e["ratio"] for e in ev] == [1.2, 1.0]
    # the geometric mean, not the worst ratio: x (1.0, 1.3) beats y (1.2, 1.2) and z (1.5, 1.0)
    res2 = ds.Results()
    x, y, z = ({**a, "BLOCK_N": n} for n in (16, 32, 64))
    for cfg, t1, t2 in ((x, 10.0, 13.0), (y, 12.0, 12.0), (z, 15.0, 10.0)):
        _ok(res2, p1, cfg, t1)
        _ok(res2, p2, cfg, t2)
    assert ds.choose_config([p1, p2], res2, None)[0] == x
    _ok(res, p1, {**a, "BLOCK_N": 16}, 10.0)  # a tie on p1's only point: the preferred wins
    assert ds.choose_config([p1], res, a)[0] == a
    assert ds.choose_config([shapes.Case(8, 1, 1, 64)], res, a) == (None, [])


def test_results_meet_a_resumed_logs_configs():
    """A log's configs (older: fewer keys, or "family" spelled out) are the candidates they were."""
    p = shapes.SHAPES["M2"].case
    old = {k: v for k, v in VERIFY_DEFAULT_CONFIG.items() if k not in ("TMA", "PDL")}
    res = ds.Results([{"point": p.key, "config": {**old, "family": "triton"}, "splits": 4,
                       "heuristic": True, "status": "ok", "time_us": 1.0, "stage": "tile"}])
    assert res.has(p.key, dict(VERIFY_DEFAULT_CONFIG), 4) and not res.has(p.key, old, 5)
    assert res.top(p.key, 1) == [VERIFY_DEFAULT_CONFIG]


def _winner(p):
    return 32 if p.H <= 32 else 64, 16 if p.B <= 16 else 64  # BLOCK_H by heads, BLOCK_N by batch


def _synthetic_rules():
    """Full grid; each point's winner is _winner(p), 15% faster than a config with one of the
    two wrong, 30% than one with both."""
    grid = shapes.grid_points()
    res = ds.Results()
    for i, p in enumerate(grid):
        for bh in (32, 64):
            for bn in (16, 64):
                wrong = ((bh, bn)[0] != _winner(p)[0]) + ((bh, bn)[1] != _winner(p)[1])
                _ok(res, p, {**_defaults(p), "BLOCK_H": bh, "BLOCK_N": bn},
                    100.0 + 15.0 * wrong + 0.001 * i, stage="grid")
    return grid, ds.build_rules(grid, res, _defaults, GROUPS_H, GROUPS_Q)


def test_sweep_table_is_what_the_tuning_module_selects():
    grid, rules = _synthetic_rules()
    assert len(rules) < 2 * 4 * 4 and "match" not in rules[-1]
    assert all(set(r["config"]) == set(VERIFY_DEFAULT_CONFIG) and r["points"] for r in rules)
    assert all(set(r["match"]) <= {"num_heads", "qlen", "rows_max"} for r in rules[:-1])
    text = ds.table_text(rules, "sm_90", "test run", {"gpu": "test"})
    table = json.loads(text)
    # The Gluon-family rules in force stay first (the sweep times the portable kernel only).
    gluon = [r for r in tuning.table("decode_verify", "sm_90")["rules"]
             if r["config"].get("family") == "gluon"]
    assert gluon, "the sm_90 table has Gluon rules"
    assert table["rules"] == gluon + rules and table["kernel"] == "decode_verify"
    kernel = tuning.KERNELS["decode_verify"]
    kernel.builtin["bench-test"] = table
    tuning.table.cache_clear()
    try:
        from mla_ops.decode_verify.configs import verify_facts

        for p in grid:
            got = tuning.select("decode_verify", verify_facts(p.B, p.qlen, p.H, fp8=p.fp8),
                                arch="bench-test")
            assert (got["BLOCK_H"], got["BLOCK_N"]) == _winner(p), p.key
            assert got["MIN_SPLIT_LEN"] == _defaults(p)["MIN_SPLIT_LEN"], p.key
    finally:
        del kernel.builtin["bench-test"]
        tuning.table.cache_clear()
    with pytest.raises(ValueError, match="last rule must match every launch"):
        ds.table_text(rules[:-1], "sm_90", "test", {})
    bad = [{"config": {**rules[-1]["config"], "SWAP_AB": 1, "num_stages": 1}}]
    with platform.mock_platform("sm_90", interpret=False):
        with pytest.raises(ValueError, match="refused"):
            ds.table_text(bad, "sm_90", "test", {})


def test_rules_merge_neighbours_and_drop_what_the_last_rule_says():
    """Per heads group, qlen groups that chose the same config become one rule; a group's
    trailing rule equal to the last (catch-all) rule goes."""
    grid = shapes.grid_points(heads=(16, 128), qlens=(1, 2), bl=((1, 4096),), caches=(False,))
    a, b = ({**VERIFY_DEFAULT_CONFIG, "BLOCK_N": n} for n in (16, 64))
    res = ds.Results()
    for p in grid:
        _ok(res, p, a, 100.0 if p.H == 16 else 130.0)
        _ok(res, p, b, 100.0 if p.H == 128 else 131.0)  # b: the worse overall, the last rule a
    rules = ds.build_rules(grid, res, lambda p: a, GROUPS_H, GROUPS_Q)
    assert [(r.get("match"), r["config"]) for r in rules] == [
        ({"num_heads": GROUPS_H[1], "qlen": [1, 2]}, b), (None, a)]


def test_sweep_end_to_end_with_a_fake_kernel(tmp_path, monkeypatch, capsys):
    """The whole sweep on the CPU path: wrong answers and refused configs are discarded, the log
    and a valid table come out, and a resumed run keeps the log and measures nothing twice."""
    monkeypatch.setattr(decode, "load_api", lambda: _fake_api(bad_block_h=16, raise_stages=1))
    table_path, log_path = tmp_path / "t.json", tmp_path / "log.json"
    argv = ["--interpret", "--write", str(table_path), "--log", str(log_path), "--budget-s", "60"]
    assert sweep_decode_verify.main(argv) == 0
    log = json.loads(log_path.read_text())
    status = {}
    for r in log["records"]:
        status.setdefault(r["status"], []).append(r)
    assert status["ok"] and log["sweep"]["complete"] and log["sweep"]["split_findings"]
    assert all(r["config"]["BLOCK_H"] == 16 for r in status["wrong"])
    assert all(r["config"]["num_stages"] == 1 and "shared memory" in r["msg"]
               for r in status["error"])
    table = json.loads(table_path.read_text())
    assert table["kernel"] == "decode_verify" and "1/1 grid points measured" in table["source"]
    best = min(status["ok"], key=lambda r: r["time_us"] if r["heuristic"] else 1e30)
    assert table["rules"][-1]["config"] == best["config"]
    first = {ds.Results.key(r["point"], r["config"], r["splits"]): r.get("time_us")
             for r in log["records"]}
    assert sweep_decode_verify.main(argv + ["--resume", str(log_path)]) == 0
    records = json.loads(log_path.read_text())["records"]
    again = {ds.Results.key(r["point"], r["config"], r["splits"]): r.get("time_us")
             for r in records}
    assert len(again) == len(records)  # one record per measurement
    assert all(again[k] == t for k, t in first.items())  # kept, not measured again


# --- the compile pool -----------------------------------------------------------------------------


_CONTEXT_LOST = []


def _pool_job(spec):
    if _CONTEXT_LOST:
        raise AssertionError("ran in a process whose CUDA context is gone")
    if spec["what"] == "crash":
        _CONTEXT_LOST.append(True)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    if spec["what"] == "bad":
        raise ValueError("config: refused")


def test_compile_pool_protocol():
    """One worker: a job that loses the CUDA context poisons its process, whose later jobs go to
    a fresh one; a refused job is that job's error only; a process without the device raises."""
    specs = {k: {"what": k, "device": "cpu"} for k in ("ok", "crash", "after", "bad")}
    pool = compile_pool.CompilePool(1, _pool_job)
    try:
        out = pool.run(specs)
        assert {k: v[0] for k, v in out.items()} == {"ok": "ok", "crash": "crash",
                                                     "after": "ok", "bad": "error"}
        assert "illegal memory access" in out["crash"][1] and "refused" in out["bad"][1]
        if not torch.cuda.is_available():
            with pytest.raises(RuntimeError, match="cannot use the device"):
                pool.run({"x": {"what": "ok", "device": "cuda"}})
    finally:
        pool.close()

def test_precompile_with_no_processes_leaves_it_to_the_caller(capsys):
    assert compile_pool.precompile(_pool_job, {"a": {"what": "crash"}}, 0) == {}
    assert capsys.readouterr().out == ""


def test_decode_compile_job_in_the_pool():
    """The real decode job in a worker (the kernel under the interpreter): a good variant
    compiles, a config the tuning module refuses is that variant's error."""
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("exercised on the GPU by the scripts themselves")
    c = shapes.Case(16, 1, 1, 16, False, 16)
    good = decode.compile_spec(c, "fp16", 1, {"BLOCK_H": 16, "BLOCK_N": 16}, device="cpu")
    bad = decode.compile_spec(c, "fp16", 1, {"family": "cutlass"}, device="cpu")
    specs = decode.specs_by_key([good, bad, dict(good)])
    assert len(specs) == 2
    out = compile_pool.precompile(decode.compile_job, specs, 2)
    assert out[decode.compile_key(good)][0] == "ok", out
    st, msg, _ = out[decode.compile_key(bad)]
    assert st == "error" and "unknown kernel family 'cutlass'" in msg


def test_compile_key_ignores_batch_and_split_count_but_not_single_split():
    spec = decode.compile_spec
    a = spec(shapes.Case(16, 2, 1, 8192), "bf16", 4, {"BLOCK_H": 64})
    b = spec(shapes.Case(16, 2, 32, 4096), "bf16", 8, {"BLOCK_H": 64})
    c = spec(shapes.Case(16, 2, 32, 4096), "bf16", 1, {"BLOCK_H": 64})
    d = spec(shapes.Case(16, 2, 32, 4096), "bf16", 8, {"BLOCK_H": 32})
    assert decode.compile_key(a) == decode.compile_key(b)
    assert decode.compile_key(b) != decode.compile_key(c)
    assert decode.compile_key(b) != decode.compile_key(d)


def test_ncu_stalls_attributes_samples_to_partitions_and_mbarriers(tmp_path):
    """ncu_stalls.py on a hand-made SASS table: two partitions (setmaxnreg between them), one
    busy with a poll loop on an mbarrier and a wgmma wait, one of idle warps that is left out."""
    from benchmarks import ncu_stalls

    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
            "stall_long_sb", "stall_barrier", "stall_long_sb (Not Issued)"]
    body = [  # (source, samples, executed, long_sb, barrier)
        ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8", 0, 4096, 0, 0),
        ("HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24", 10, 65536, 0, 0),
        ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 20, 65536, 0, 20),
        ("SYNCS.PHASECHK.TRANS64.TRYWAIT P3, [UR4+0x38558], R4", 5, 65536, 5, 0),
        ("@!P3 BRA 0x7f0", 45, 65536, 45, 0),
        ("SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR4+0x38568], RZ", 20, 65536, 0, 0),
        ("USETMAXREG.DEALLOC.CTAPOOL 0x18", 0, 512, 0, 0),
        ("BAR.SYNC.DEFER_BLOCKING 0x1", 0, 512, 0, 0),
        ("NOP", 100, 512, 0, 100),
    ]
    path = tmp_path / "k_sass.csv"
    lines = ['"Kernel Name","_verify_stage1_seesaw",', ",".join(f'"{h}"' for h in head)]
    lines += [",".join(f'"{v}"' for v in (f"0x{i:x}", src, s, e, lsb, bar, 0))
              for i, (src, s, e, lsb, bar) in enumerate(body)]
    path.write_text("\n".join(lines) + "\n")
    text = ncu_stalls.summarize(str(path), top=4)
    assert "_verify_stage1_seesaw): 200 samples" in text
    assert "SASS [0, 6): 50.0% of the samples, 1 HGMMA; mbarrier waits 50%, wgmma waits 20%" in text
    assert "waits on `UR4+0x38558`: 50.0%" in text
    assert "arrives on: `UR4+0x38568`" in text
    assert "idle warps (padding a partition to a warpgroup): 50.0%" in text
    assert "SASS [6," not in text  # the idle partition is not listed as a busy one


def test_kernel_times_parses_its_cases_and_says_when_there_is_no_gpu(capsys):
    """kernel_times.py: named shapes and H,qlen,B,L[,fp8] cases, bad ones refused with the flag
    named; without a GPU it says so and exits 2 (the profiler times CUDA kernels)."""
    args = kernel_times.parse_args(["--shape", "M2,M3", "--case", "16,4,32,4096", "128,2,16,32768,fp8",
                                    "--variant", '{"STAGE_OUT": 1}'])
    assert args.shape == ["M2", "M3"] and args.overrides == {"STAGE_OUT": 1}
    assert [(c.H, c.qlen, c.B, c.L, c.fp8) for c in args.case] == [(16, 4, 32, 4096, False),
                                                                    (128, 2, 16, 32768, True)]
    for bad in (["--case", "16,4,32"], ["--case", "16,4,32,4096,bf8"], ["--case", "16,x,32,4096"],
                ["--shape", "M9"], ["--shape", "M2", "--variant", "[1]"], []):
        with pytest.raises(SystemExit):
            kernel_times.parse_args(bad)
        assert capsys.readouterr().err
    if not torch.cuda.is_available():
        assert kernel_times.main(["--shape", "M2"]) == 2
        assert capsys.readouterr().err.startswith("kernel_times.py: no CUDA/HIP GPU")
    assert kernel_times.parse_args(["--shape", "M2", "--timeline"]).timeline
    assert kernel_times.parse_args(["--shape", "M2", "--flashmla"]).flashmla
    assert not kernel_times.parse_args(["--shape", "M2"]).flashmla
    assert kernel_times.parse_args(["--shape", "M2", "--rotate", "3"]).rotate == 3
    assert kernel_times.parse_args(["--shape", "M2"]).rotate == 1


@pytest.mark.parametrize("balanced", [False, True], ids=["plain", "balanced"])
def test_kernel_times_timeline_names_each_cta(balanced):
    """--timeline's summary: each CTA's request and split by the launch's order (a balanced one
    takes the batch's pieces request by request, ``splits.balanced_piece_order``, request -1
    past them), times in µs from the first start, the span, the SMs, their idle share and the
    CTAs that end last."""
    from mla_ops.decode_verify.splits import balanced_piece_order

    rb, batch, splits = 2, 3, 2
    marks = [[10_000 + 1_000 * pid, 20_000 + 1_000 * pid, 100 + pid % 6] for pid in range(rb * batch * splits)]
    pieces = balanced_piece_order([10, 500, 90], splits, 2) if balanced else None
    tl = kernel_times.summarize_timeline(marks, rb, batch, splits, pieces)
    ctas = tl["ctas"]
    if balanced:  # pieces: request 0 one, request 1 two, request 2 one; slots 4 and 5 empty
        assert pieces == [(0, 0), (1, 0), (1, 1), (2, 0)]
        assert ctas[5][:3] == [5, 1, 1] and ctas[7][:3] == [7, 2, 0] and ctas[9][:3] == [9, -1, -1]
    else:  # (row block, split, request): pid 7 is row block 1 of request 1, split 1
        assert ctas[7][:3] == [7, 1, 1] and ctas[5][:3] == [5, 1, 0]
    assert ctas[0][3:6] == [100, 0.0, 10.0] and ctas[11][3:6] == [105, 11.0, 21.0]
    assert ctas[0][6:] == [None] * 3 and tl["phases_us"] is None  # no schedule marks: no phases
    # the swap-AB / seesaw marks (Q landed, loop done, output stored): per CTA and the median
    marks = [m + [m[0] + 2_000, m[0] + 2_000 + 500 * pid, m[1] - 1_000] for pid, m in enumerate(marks)]
    tl = kernel_times.summarize_timeline(marks, rb, batch, splits, pieces)
    assert tl["ctas"][3][6:] == [5.0, 6.5, 12.0]
    assert tl["phases_us"] == {"to_q": 2.0, "loop": 3.0, "store": 4.5, "to_end": 1.0}  # upper medians
    assert tl["span_us"] == 21.0 and tl["sms"] == 6 and tl["ctas_n"] == 12
    assert tl["idle_share"] == round(1 - 12 * 10.0 / (6 * 21.0), 4)  # one CTA at a time per SM
    assert [c[0] for c in tl["last"]] == [11, 10, 9, 8, 7]
    assert "boundary_us" not in tl and all(len(c) == 9 for c in tl["ctas"])  # no segment marks


def test_kernel_times_timeline_times_the_grid_segment_boundary():
    """The balanced grid's segment marks (``marks[pid][6:16]``: each of a CTA's first two segments'
    Q and first block asked for, Q landed, loop done, output stored): every CTA row ends with
    the ten times (None where not written), and ``boundary_us`` is the median over the CTAs of
    two segments of each event of the second segment, and of the first's store, from the first
    segment's loop end."""
    def cta(pid, two):
        start = 1_000 * pid
        seg0 = [start + 100, start + 200, start + 2_000, start + 30_000, start + 33_000]
        seg1 = ([start + 29_000 + 100 * pid, start + 28_000, start + 36_000 + 1_000 * pid, start + 50_000,
                 start + 53_000] if two else [-1] * 5)
        return [start, start + 60_000, pid, seg0[2], seg1[3] if two else seg0[3], seg1[4] if two else seg0[4]] \
            + seg0 + seg1

    marks = [cta(pid, two=pid % 2 == 1) for pid in range(6)]  # CTAs 1, 3, 5 hold two segments
    tl = kernel_times.summarize_timeline(marks, 1, 6, 1, [(pid, 0) for pid in range(6)])
    assert len(tl["ctas"][0]) == 19 and tl["ctas"][0][14:] == [None] * 5
    assert tl["ctas"][3][9:14] == [3.1, 3.2, 5.0, 33.0, 36.0]
    # from the first loop's end: the store 3 us; Q asked -1 + 0.1 pid (pid 1, 3, 5: median pid 3),
    # the block -2, Q landed 6 + pid
    assert tl["boundary_us"] == {"ctas": 3, "store": 3.0, "q_asked": -0.7, "block_asked": -2.0, "q_landed": 9.0}
    marks = [m[:6] + m[6:11] + [-1] * 5 for m in marks]  # no CTA of two segments
    assert kernel_times.summarize_timeline(marks, 1, 6, 1, None)["boundary_us"] is None
