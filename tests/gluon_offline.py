"""Offline sm_90a compiles of Gluon kernels, shared by the Gluon test modules (CPU CI).

``compile_sm90a`` compiles a ``@gluon.jit`` function for ``GPUTarget("cuda", 90, 32)`` from a
signature and constexprs (no GPU, no launch) and runs the ptxas that triton uses for sm_90 on its PTX;
``ptxas_facts`` reads what the tests assert from the result: registers, spill bytes, whether
ptxas serialized the wgmmas, shared memory, wgmma / TMA present, the setmaxnreg values.
``run_in_subprocess`` runs a module's compile loop outside ``TRITON_INTERPRET`` (the suite runs
under the interpreter on CPU machines, and Gluon only compiles outside it); ``run_once`` does it
once per test session when pytest-xdist spreads a module over several workers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import triton


def tensordesc(block, dtype_name: str, gdt) -> str:
    """The signature string of a host TMA descriptor with boxes ``block`` of ``gdt``."""
    from triton.experimental.gluon import language as gl

    layout = gl.NVMMASharedLayout.get_default_for(block, gdt)
    return f"tensordesc<{dtype_name}[{', '.join(map(str, block))}],{layout!r}>"


def compile_sm90a(fn, signature: dict, constexprs: dict, num_warps: int):
    """``(kernel, ptxas -v stderr)`` of ``fn`` compiled for sm_90a."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    constexprs = dict(constexprs)
    for param in fn.params:  # defaults: triton 3.6 fills them in itself, later ones do not
        if param.name not in signature and param.name not in constexprs and param.has_default:
            constexprs[param.name] = param.default
    sig = dict(signature)
    sig.update({k: "constexpr" for k in constexprs})
    kernel = triton.compile(GluonASTSource(fn, sig, constexprs),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path  # the one triton compiles sm_90 with (3.9: ptxas-blackwell)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(kernel.asm["ptx"])
        report = subprocess.run([ptxas, "-v", "-arch=sm_90a", path, "-o", os.path.join(d, "k.cubin")],
                                capture_output=True, text=True, check=True).stderr
    return kernel, report


def ptxas_facts(kernel, report: str) -> dict:
    ptx = kernel.asm["ptx"]
    return {
        "regs": int(re.search(r"Used (\d+) registers", report).group(1)),
        "spills": int(re.search(r"(\d+) bytes spill stores", report).group(1)),
        "serialized": "serialized" in report,
        "shared": kernel.metadata.shared,
        "wgmma": "wgmma.mma_async" in ptx,
        "tma": "cp.async.bulk.tensor" in ptx,
        "launch_dependents": "griddepcontrol.launch_dependents" in ptx,
        "timeline": ptx.count("%globaltimer"),  # the CTA timeline probe's clock reads
        "setmaxnreg": sorted({int(v) for v in re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)}),
    }


def run_in_subprocess(module: str, func: str, timeout: int = 900, shard=(0, 1)) -> list:
    """Run ``module.func()`` (which prints one JSON line per variant, starting with ``[``) in a
    subprocess without TRITON_INTERPRET; returns the parsed lines."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, os.path.join(root, "tests"), env.get("PYTHONPATH", "")])
    env[SHARD_ENV] = "{}/{}".format(*shard)
    out = subprocess.run([sys.executable, "-c", f"import {module} as t; t.{func}()"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("[")]



SHARD_ENV = "MLA_OPS_OFFLINE_SHARD"  # "i/n": the compile loop's share (run_once)


def shard_of(items: list) -> list:
    """The items of this compile loop's share (``SHARD_ENV``, every n-th from i); all of them
    when the variable is unset."""
    i, n = map(int, os.environ.get(SHARD_ENV, "0/1").split("/"))
    return items[i::n]


def run_once(tmp_path_factory, module: str, func: str, timeout: int = 900) -> list:
    """``run_in_subprocess(module, func)`` once per test session, spread over the pytest-xdist
    workers. Each worker that runs a test of the module computes its module-scoped fixture
    itself, so two workers compiled every variant twice. Here the loop is cut into one share
    per worker (``shard_of``): a worker compiles its own share first, then, share by share
    under a file lock in the folder the session's workers share, reads the shares the others
    left there, or compiles one that nobody has."""
    try:
        import fcntl
    except ImportError:  # not POSIX: each worker compiles everything
        return run_in_subprocess(module, func, timeout)
    root, worker = tmp_path_factory.getbasetemp(), os.environ.get("PYTEST_XDIST_WORKER")
    n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) if worker else 1
    if worker:
        root = root.parent  # pytest-N, this session's; each worker has its own folder below it
    me = int(worker[2:]) % n if worker else 0  # "gw1" -> 1
    out = []
    for k in [me] + [i for i in range(n) if i != me]:
        path = root / f"{module}.{func}.{k}of{n}.json"
        with open(root / f"{module}.{func}.{k}of{n}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                path.write_text(json.dumps(run_in_subprocess(module, func, timeout, shard=(k, n))))
            out += json.loads(path.read_text())
    return out
