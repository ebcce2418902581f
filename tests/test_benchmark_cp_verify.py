"""benchmarks/benchmark_cp_verify.py on the CPU: its grid and plan, and the whole script on two
gloo processes through the plain-PyTorch reference (the code path the GPU run takes, minus the
graphs and NCCL)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import benchmark_cp_verify as bench  # noqa: E402


def test_the_full_grid_is_the_issues():
    cases = bench.resolve_cases(bench.parse_args([]))
    shapes = {(c.H, c.qlen, c.B, c.L) for c in cases}
    assert shapes == {(h, q, b, L) for h in (16, 128) for q in (2, 4) for b in (1, 8, 32)
                      for L in (131072, 524288, 1048576)}
    assert {c.method for c in cases} == {"rs", "a2a"} and {c.interleave for c in cases} == {64}


def test_quick_is_small_and_budgeted():
    a = bench.parse_args(["--quick"])
    cases = bench.resolve_cases(a)
    assert len(cases) == 3 and {c.method for c in cases} == {"rs"} and a.budget_s == 200.0
    assert max(c.kv_bytes() for c in cases) < 2 << 30


def test_grid_flags_and_bad_values():
    a = bench.parse_args(["--heads", "128", "--qlen", "4", "--batch", "32", "--seq-len", "1048576",
                          "--method", "rs", "ar", "--interleave", "1", "64"])
    cases = bench.resolve_cases(a)
    assert len(cases) == 4 and cases[0].kv_bytes() == 32 * 1048576 * 576 * 2
    assert cases[0].rank_kv_bytes(2) == cases[0].kv_bytes() // 2
    for bad in (["--batch", "0"], ["--interpret"], ["--method", "ring"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_dry_run_prints_the_plan(capsys):
    assert bench.main(["--dry-run", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "3 case(s)" in out and "H128-q4-B8-L131072-I64-rs" in out


def test_cpu_run_writes_json_and_prints_the_table_last(tmp_path):
    out = tmp_path / "cp.json"
    r = subprocess.run([sys.executable, "benchmarks/benchmark_cp_verify.py", "--cpu", "--check",
                        "--method", "rs", "a2a", "--json", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4 and all(row["check"]["ok"] for row in rows)
    for row in rows:
        for key in ("step_us", "compute_us", "merge_us", "comm_share", "single_us", "speedup",
                    "splits_local", "world"):
            assert row[key] is not None, key
        assert row["world"] == 2
    lines = r.stdout.strip().splitlines()
    assert lines[-5].split()[:4] == ["H", "qlen", "B", "L"], r.stdout
