"""The README's usage examples run as written: each ``examples/*.py`` in a child process (its exit
status is its own check against the reference), and each README usage code block is lines of the
example script named above it."""

import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SCRIPTS = ["decode_verify_plan.py", "decode_verify_positional.py", "encoder_attention.py",
           "compile.py", "draft_trees.py"]
GPU = torch.cuda.is_available()


def _env(interpret: bool = False) -> dict:
    """The child's environment: this repo first on the path; the Triton interpreter only when
    asked (the suite's conftest turns it on in this process on a CPU machine)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


def _run(args, env, timeout=300):
    out = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=[s[:-3] for s in SCRIPTS])
def test_example_runs_and_matches_the_reference(script):
    """On a CPU: the ops' CPU kernels (the plain-PyTorch path); on a GPU: the Triton kernels."""
    stdout = _run([str(EXAMPLES / script)], _env())
    assert re.search(r": OK$", stdout, flags=re.M), stdout


@pytest.mark.skipif(GPU, reason="on a GPU the runs above already run the Triton kernels")
def test_plan_example_runs_the_triton_kernels_in_the_interpreter():
    stdout = _run([str(EXAMPLES / "decode_verify_plan.py")], _env(interpret=True))
    assert "on the Triton kernels in Triton's interpreter" in stdout, stdout
    assert re.search(r": OK$", stdout, flags=re.M), stdout


def test_context_parallel_example_runs_under_torchrun():
    """Two ranks: NCCL, the Triton kernels and a CUDA-graph replay with a GPU each; gloo and the
    CPU kernels otherwise. Each rank checks its heads against the reference."""
    import torch.distributed as dist

    two_gpus = GPU and torch.cuda.device_count() >= 2
    if not dist.is_available() or not (two_gpus or dist.is_gloo_available()):
        pytest.skip("torch.distributed (with gloo, or NCCL on 2 GPUs) is not available here")
    env = _env()
    env.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast on shared GPU machines
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", str(EXAMPLES / "context_parallel.py")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    # Each rank's verdict line; the two processes share the pipe, so one's newline can land after
    # the other's line ("...: OKrank 1/2 ...: OK" was seen in CI): a verdict runs to its own
    # ": OK" / ": FAILED" without crossing another rank's start, not to a line's end.
    verdicts = re.findall(r"rank (\d)/2 \((?:(?!rank \d/2 ).)*?: (OK|FAILED)", out.stdout)
    ranks = [r for r, verdict in verdicts if verdict == "OK"]
    if out.returncode != 0 and not re.search(r"^rank \d/2 ", out.stdout, flags=re.M) and re.search(
            r"RendezvousConnectionError|Address already in use|EADDRINUSE", out.stderr):
        pytest.skip(f"torchrun cannot start 2 processes here: {out.stderr.strip()[-500:]}")
    assert out.returncode == 0 and sorted(ranks) == ["0", "1"], (out.stdout[-3000:]
                                                                + out.stderr[-5000:])
    assert ("nccl" if two_gpus else "gloo") in out.stdout


def _readme_usage_blocks():
    """(script, block) for each python block of the README's usage sections, the script being
    the last ``examples/*.py`` the README names before the block."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## Usage")
    end = text.index("\n## ", start + 1)
    blocks, script = [], None
    for m in re.finditer(r"(examples/\w+\.py)|```python\n(.*?)```", text[start:end], flags=re.S):
        if m.group(1):
            script = m.group(1)
        else:
            blocks.append((script, m.group(2)))
    return blocks


def test_readme_usage_blocks_are_lines_of_the_examples():
    """The README shows the examples' essential lines: every line of a usage block is a line of
    the script named above it, so a snippet cannot drift from code that runs."""
    blocks = _readme_usage_blocks()
    assert len(blocks) >= 5, "README.md: the usage sections lost their examples"
    for script, block in blocks:
        assert script is not None, f"README.md: a usage block names no example script:\n{block}"
        lines = {line.strip() for line in (ROOT / script).read_text().splitlines()}
        missing = [line for line in block.splitlines() if line.strip()
                   and line.strip() not in lines]
        assert not missing, f"README.md: lines not in {script}: {missing}"
    named = {s for s, _ in blocks} | set(re.findall(r"examples/\w+\.py",
                                                   (ROOT / "README.md").read_text()))
    assert {f"examples/{s}" for s in SCRIPTS + ["context_parallel.py"]} <= named
