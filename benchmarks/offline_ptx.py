#!/usr/bin/env python
"""Compile the decode-verify kernels for sm_90a offline (no GPU) exactly as the launcher would
launch them, and write their PTX / TTGIR, one file per launch variant and stage.

Used to show that a change leaves the compiled code of a launch path unchanged: run it on two
trees and diff the output folders (line info is off, so only code differences show)::

    git archive <old commit> | tar -x -C /tmp/old
    TRITON_DISABLE_LINE_INFO=1 PYTHONPATH=/tmp/old python benchmarks/offline_ptx.py /tmp/ptx_old
    TRITON_DISABLE_LINE_INFO=1 PYTHONPATH=. python benchmarks/offline_ptx.py /tmp/ptx_new
    diff -r /tmp/ptx_old /tmp/ptx_new

How: the launcher runs on CPU tensors under a mocked sm_90 platform (with TMA and programmatic
dependent launch allowed), the two kernels' ``[grid](...)`` calls are recorded instead of
launched, and each call goes through Triton's own binder (the specialization a real launch
computes: constexprs, None arguments, alignment and divisibility of pointers and ints) into
``triton.compile`` for ``GPUTarget("cuda", 90, 32)``. ``--cp-world N`` passes the context-
parallel arguments (on trees that have them).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("offline_ptx: unset TRITON_INTERPRET (the kernels are compiled, not interpreted)")

import torch  # noqa: E402

# (name, batch, heads, qlen, splits, fp8, has_real, config overrides)
VARIANTS = [
    ("h16-q2-table-1split", 1, 16, 2, 1, False, False, None),
    ("h16-q2-table-8split-real", 32, 16, 2, 8, False, True, None),
    ("h16-q4-swap-h32-tma-pdl", 8, 16, 4, 4, False, False,
     {"SWAP_AB": 1, "BLOCK_H": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "TMA": 1,
      "PDL": 1}),
    ("h128-q2-h64-qsplit-persistent", 16, 128, 2, 4, False, False,
     {"BLOCK_H": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2, "QSPLIT": 1, "PERSISTENT": 2}),
    ("h16-q2-fp8-swap-qsplit", 16, 16, 2, 4, True, False,
     {"SWAP_AB": 1, "BLOCK_H": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "QSPLIT": 1}),
]


class _Recorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kw)`` is recorded."""

    def __init__(self, fn, calls):
        self.fn, self.calls = fn, calls

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((self.fn, args, kw))


def _compile(fn, args, kw, target):
    from triton.compiler import ASTSource, compile, make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kw)
    options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, specialization, options)
    return compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                   options=options.__dict__)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="folder for <variant>.<stage>.ptx / .ttgir")
    p.add_argument("--only", nargs="*", help="variant names (default: all)")
    p.add_argument("--cp-world", type=int, default=1)
    p.add_argument("--cp-rank", type=int, default=0)
    p.add_argument("--cp-interleave", type=int, default=1)
    args = p.parse_args(argv)

    from triton.backends.compiler import GPUTarget

    from mla_ops import platform
    from mla_ops.decode_verify import kernels, launch

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = GPUTarget("cuda", 90, 32)
    launch._is_sm90_plus = lambda device, plat: True  # TMA and PDL as on an H200
    real_kernels = (kernels._fwd_verify_stage1, kernels._fwd_verify_stage2)
    Lk, Lv, page = 576, 512, 64
    for name, batch, heads, qlen, splits, fp8, has_real, config in VARIANTS:
        if args.only and name not in args.only:
            continue
        calls = []
        kernels._fwd_verify_stage1 = _Recorder(real_kernels[0], calls)
        kernels._fwd_verify_stage2 = _Recorder(real_kernels[1], calls)
        try:
            rows = batch * qlen
            cache = torch.zeros(batch * 4, page, 1, Lk, dtype=torch.bfloat16)
            k_scale = None
            if fp8:
                cache, k_scale = cache.to(torch.float8_e4m3fn), torch.ones(())
            q = torch.zeros(rows, heads, Lk, dtype=torch.bfloat16)
            o = torch.empty(rows, heads, Lv, dtype=torch.bfloat16)
            lse = torch.empty(rows, heads)
            table = torch.zeros(batch, 4, dtype=torch.int32)
            lens = torch.full((batch,), 200, dtype=torch.int32)
            ws = torch.empty(rows, heads, splits, Lv + 1) if splits > 1 else None
            cp = {}
            if args.cp_world > 1:
                cp = dict(cp_world=args.cp_world, cp_rank=args.cp_rank,
                          cp_interleave=args.cp_interleave)
            with platform.mock_platform("sm_90"):
                launch.decode_attention_fwd_verify(
                    q, cache, cache[..., :Lv], o, lse, table, lens, lens if has_real else None,
                    qlen, ws, splits, 0.1352, page, k_scale, config=config, **cp)
        finally:
            kernels._fwd_verify_stage1, kernels._fwd_verify_stage2 = real_kernels
        for stage, (fn, a, kw) in enumerate(calls, start=1):
            compiled = _compile(fn, a, kw, target)
            for ext in ("ptx", "ttgir"):
                (out / f"{name}.stage{stage}.{ext}").write_text(compiled.asm[ext])
            print(f"{name} stage {stage}: {len(compiled.asm['ptx'])} B of PTX", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
