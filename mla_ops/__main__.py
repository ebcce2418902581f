"""``python -m mla_ops``: environment report plus a checked, timed run of both kernels.

On a GPU the Triton kernels run on a realistic serving problem; on a CPU the ops' CPU kernels
(the plain-PyTorch reference) run, or with ``--interpret`` the Triton kernels themselves in
Triton's interpreter at a small size. Each result is checked against the reference in
float64; the exit status is non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time


def _parse(argv):
    p = argparse.ArgumentParser(
        prog="python -m mla_ops",
        description="Report the environment, then run, check and time decode verify and "
        "encoder attention on the best device present.",
    )
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="where to run (auto: cuda when available, else cpu)")
    p.add_argument("--interpret", action="store_true",
                   help="on CPU, run the Triton kernels in Triton's interpreter (small problem)")
    p.add_argument("--only", choices=("verify", "prefill"), default=None,
                   help="run only one of the two kernels")
    p.add_argument("--repeats", type=int, default=20, help="timed repetitions (median reported)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the inputs")
    return p.parse_args(argv)


def _timeit(fn, device, repeats):
    import torch

    fn()  # warm (compiles on the first call)
    if device == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
    else:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    return times[len(times) // 2]


def _rel_err(x, ref):
    import torch

    x, ref = x.double(), ref.double()
    finite = torch.isfinite(ref)
    if torch.isnan(x).any():
        return math.inf
    if not torch.equal(torch.isfinite(x), finite):
        return math.inf
    return float((x[finite] - ref[finite]).norm() / ref[finite].norm().clamp_min(1e-30))


def run_verify(device, small, repeats):
    import torch

    import mla_ops
    from mla_ops import reference

    if small:
        B, H, qlen, L, page, Lv, rope, dtype = 2, 4, 2, 96, 16, 64, 32, torch.float16
    elif device == "cuda":
        B, H, qlen, L, page, Lv, rope, dtype = 32, 16, 2, 4096, 64, 512, 64, torch.bfloat16
    else:
        B, H, qlen, L, page, Lv, rope, dtype = 8, 16, 2, 2048, 64, 512, 64, torch.float32
    Lk = Lv + rope
    pages_per_req = math.ceil(L / page)
    num_pages = B * pages_per_req
    cache = torch.randn(num_pages, page, 1, Lk, device=device, dtype=dtype)
    table = torch.randperm(num_pages, device=device).reshape(B, pages_per_req).int()
    q = torch.randn(B * qlen, H, Lk, device=device, dtype=dtype)
    o = torch.full((B * qlen, H, Lv), float("nan"), device=device, dtype=dtype)
    lse = torch.full((B * qlen, H), float("nan"), device=device)
    seq_lens = torch.full((B,), L, device=device, dtype=torch.int32)
    sms = mla_ops.platform.current().sm_count
    cfg = mla_ops.select_verify_config(B, qlen, H)
    splits = mla_ops.verify_num_kv_splits(L, B, qlen, H, sms, block_h=cfg["BLOCK_H"])
    logits = (torch.empty(B * qlen, H, splits, Lv + 1, device=device) if splits > 1 else None)
    sm_scale = 0.1352
    args = (q, cache, cache[..., :Lv], o, lse, table, seq_lens, None, qlen, logits, splits,
            sm_scale, page, None)
    print(f"decode verify: B={B} H={H} qlen={qlen} L={L} page={page} Lk={Lk} Lv={Lv} "
          f"{str(dtype).replace('torch.', '')} splits={splits} config={cfg}")
    us = _timeit(lambda: torch.ops.mla.decode_verify(*args), device, repeats)
    o_ref, lse_ref = reference.decode_verify_ref(q, cache, Lv, table, seq_lens, None, qlen,
                                                 sm_scale, page, compute_dtype=torch.float64)
    err_o, err_lse = _rel_err(o, o_ref), _rel_err(lse, lse_ref)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    kv_bytes = B * L * Lk * cache.element_size()
    ok = err_o < tol and err_lse < tol
    print(f"  eager op call (dispatch included) {us:.1f} us  KV {kv_bytes / 1e6:.1f} MB -> {kv_bytes / us / 1e6:.2f} TB/s  "
          f"rel err o {err_o:.2e} lse {err_lse:.2e}  {'OK' if ok else 'FAIL'}")
    return ok


def run_prefill(device, small, repeats):
    import torch

    from mla_ops import reference

    if small:
        lens, H, D, dtype = [33, 17], 2, 72, torch.float16
    elif device == "cuda":
        lens, H, D, dtype = [3520], 16, 72, torch.bfloat16
    else:
        lens, H, D, dtype = [1024, 512], 16, 72, torch.float32
    total = sum(lens)
    q, k, v = (torch.randn(total, H, D, device=device, dtype=dtype) for _ in range(3))
    o = torch.full_like(q, float("nan"))
    starts = torch.tensor([sum(lens[:i]) for i in range(len(lens))], device=device,
                          dtype=torch.int32)
    seq = torch.tensor(lens, device=device, dtype=torch.int32)
    args = (q, k, v, o, starts, seq, max(lens), False, None, None, None, None)
    print(f"encoder attention: lens={lens} H={H} D={D} {str(dtype).replace('torch.', '')} "
          "non-causal")
    us = _timeit(lambda: torch.ops.mla.context_attention(*args), device, repeats)
    ref = reference.context_attention_ref(q, k, v, starts, seq, False,
                                          compute_dtype=torch.float64)
    err = _rel_err(o, ref)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    flops = sum(4 * n * n * H * D for n in lens)
    ok = err < tol
    print(f"  eager op call (dispatch included) {us:.1f} us  {flops / us / 1e6:.1f} TFLOP/s  rel err {err:.2e}  "
          f"{'OK' if ok else 'FAIL'}")
    return ok


def _interpreter_process(argv) -> int | None:
    """Triton picks the interpreter when a kernel is defined, and ``python -m mla_ops`` has
    imported the package (and its kernels) before ``main`` runs: rerun this command in a
    process that has ``TRITON_INTERPRET=1`` from its start. Returns its exit status (2 when
    the interpreter cannot run here), or None when this process already is one."""
    from .platform import interpreter_enabled

    from .platform import interpreter_problem

    why = interpreter_problem()
    if why is not None:
        print(f"--interpret: {why}", file=sys.stderr)
        return 2
    if interpreter_enabled():
        return None
    import subprocess

    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.call([sys.executable, "-m", "mla_ops", *argv], env=env)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parse(argv)
    if args.interpret:
        status = _interpreter_process(argv)
        if status is not None:
            return status
    import torch

    if args.device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no GPU is visible to torch", file=sys.stderr)
        return 2
    if args.interpret and device == "cuda":
        print("--interpret runs on CPU tensors; use --device cpu or leave --device auto on a "
              "machine without a GPU", file=sys.stderr)
        return 2

    import triton

    import mla_ops
    from mla_ops.platform import current, interpreter_enabled

    torch.manual_seed(args.seed)
    plat = current()
    if device == "cpu":
        # What the kernels will really see (a process whose kernels were defined before the
        # interpreter was on would not run them there).
        path = ("Triton kernels in the interpreter" if plat.interpret and interpreter_enabled()
                else "the plain-PyTorch reference (the ops' CPU kernels; no GPU present)")
    else:
        path = "Triton kernels"
    print(f"mla_ops {mla_ops.__version__}  torch {torch.__version__}  triton {triton.__version__}")
    print(f"device: {plat.device_name if device == 'cuda' else 'cpu'}  arch: {plat.arch}  "
          f"SMs/CUs: {plat.sm_count if plat.has_gpu else '-'}  "
          f"{'HIP' if plat.is_hip else 'CUDA' if plat.is_cuda else 'no GPU'}")
    from mla_ops import tuning

    tables = ", ".join(f"{k} '{tuning.table(k, plat.arch).get('arch')}'" for k in tuning.KERNELS)
    print(f"config tables: {tables}")
    print(f"op library: {mla_ops.library.EXTENSION_STATUS}")
    from mla_ops import gluon_support

    why = gluon_support.gluon_available() or (gluon_support.sm90_reason(torch.device(device))
                                              if device == "cuda" else "no CUDA GPU")
    print(f"sm_90 Gluon kernels: {'used where the tables choose them' if why is None else why}"
          f"{'' if why is None else ' -> the portable Triton kernels run'}")
    from mla_ops import fastpath

    print(f"eager launches: {fastpath.path(device)}")
    unchecked = tuning.unchecked_workarounds()
    if unchecked:
        print(f"compiler workarounds kept on, not yet re-checked on this triton: "
              f"{', '.join(unchecked)}")
    print(f"running: {path}")
    small = device == "cpu" and interpreter_enabled()
    ok = True
    with torch.inference_mode():
        if args.only in (None, "verify"):
            ok &= run_verify(device, small, args.repeats)
        if args.only in (None, "prefill"):
            ok &= run_prefill(device, small, args.repeats)
    print("all checks passed" if ok else "CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
