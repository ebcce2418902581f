#!/usr/bin/env python
"""Decode-context-parallel verify benchmark: the sharded step across N GPUs against one GPU.

Per shape (H, qlen, B, L; page 64, bf16 q and cache, Lk 576, Lv 512) and merge method it
measures, each as the median over CUDA-graph replays:

- ``step_us``: the whole step (``mla_ops.context_parallel.CPVerify``: the verify kernel on each
  rank's shard, then the LSE merge across ranks), the slowest rank's median;
- ``compute_us``: the verify kernel alone on each rank's shard (the step's part 1), slowest rank;
- ``merge_us``: the merge alone (rescale / merge kernel and the collectives), slowest rank;
  ``comm_share = 1 - compute_us / step_us``;
- ``single_us``: the single-GPU kernel on the whole cache, on rank 0, where the whole cache fits
  (``speedup = single_us / step_us``).

Step replays are timed behind a barrier and a queued GPU sleep, so that both ranks' graphs start
together and the host's launch latency is excluded.

Run it on the GPUs (self-spawns one process per GPU when not started by torchrun)::

    PYTHONPATH=. timeout 300 torchrun --nproc-per-node 2 benchmarks/benchmark_cp_verify.py \\
        --quick --json $OUT/cp.json
    PYTHONPATH=. torchrun --nproc-per-node 2 benchmarks/benchmark_cp_verify.py --check \\
        --json $OUT/cp_verify.json          # the full grid
    PYTHONPATH=. python benchmarks/benchmark_cp_verify.py --heads 128 --qlen 4 --batch 32 \\
        --seq-len 1048576 --method rs a2a ar

Progress goes to stdout (flushed, rank 0 only); the JSON is rewritten after every case, so a
run cut short by ``timeout`` or ``--budget-s`` keeps what it measured. On a CPU, ``--dry-run``
prints the plan (cases, memory) and ``--cpu`` runs a tiny grid on 2 gloo processes through the
plain-PyTorch reference (``--interpret``: the Triton kernels in the interpreter): the whole code
path, times meaningless.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import math
import os
import pathlib
import socket
import statistics
import sys
import time
from typing import Sequence

if "--interpret" in sys.argv[1:]:  # before triton is first imported
    os.environ["TRITON_INTERPRET"] = "1"

_ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from benchmarks import harness  # noqa: E402
from benchmarks.shapes import DEFAULT_PAGE_SIZE as PAGE  # noqa: E402
from benchmarks.shapes import DEFAULT_SM_SCALE as SM_SCALE  # noqa: E402
from benchmarks.shapes import LK, LV  # noqa: E402
from benchmarks.shapes import Case as Shape  # noqa: E402

FULL_GRID = dict(heads=[16, 128], qlen=[2, 4], batch=[1, 8, 32],
                 seq_len=[131072, 524288, 1048576])
QUICK_GRID = [(16, 2, 1, 131072), (16, 2, 8, 131072), (128, 4, 8, 131072)]
CPU_GRID = [(16, 2, 2, 300), (4, 4, 3, 130)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case(Shape):
    """A decode-verify shape on a context-parallel step: the cache sharded in round-robin
    blocks of ``interleave`` tokens, the partials merged by ``method``."""

    interleave: int
    method: str

    @property
    def label(self) -> str:
        return f"H{self.H}-q{self.qlen}-B{self.B}-L{self.L}-I{self.interleave}-{self.method}"

    def kv_bytes(self) -> int:
        return self.B * self.L * LK * 2

    def rank_kv_bytes(self, world: int) -> int:
        return self.B * math.ceil(math.ceil(self.L / world) / PAGE) * PAGE * LK * 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("what to run (default: the full grid H 16/128 x qlen 2/4 x B 1/8/32 "
                             "x L 128k/512k/1M)")
    g.add_argument("--quick", action="store_true",
                   help=f"three shapes {QUICK_GRID}, method rs, --budget-s 200 unless given")
    g.add_argument("--heads", nargs="+", type=int)
    g.add_argument("--qlen", nargs="+", type=int)
    g.add_argument("--batch", nargs="+", type=int)
    g.add_argument("--seq-len", nargs="+", type=int)
    g.add_argument("--interleave", nargs="+", type=int, default=None,
                   help="tokens per round-robin block (default 64, the page)")
    g.add_argument("--method", nargs="+", choices=("rs", "ar", "a2a"), default=None,
                   help="merge methods (default: rs a2a; --quick: rs)")
    o = p.add_argument_group("measurement")
    o.add_argument("--replays", type=int, default=100, help="timed replays per figure")
    o.add_argument("--no-single", action="store_true", help="skip the single-GPU baseline")
    o.add_argument("--check", action="store_true",
                   help="first compare the step with the single-GPU kernel on the same data "
                   "(each rank builds the whole cache: needs memory for it); exit 1 on a mismatch")
    o.add_argument("--budget-s", type=float, default=None,
                   help="start no new case after this many seconds (the JSON keeps what ran)")
    o.add_argument("--json", metavar="PATH", help="write the rows here (rewritten after each case)")
    o.add_argument("--seed", type=int, default=0)
    c = p.add_argument_group("without GPUs")
    c.add_argument("--dry-run", action="store_true", help="print the plan and memory; run nothing")
    c.add_argument("--cpu", action="store_true",
                   help="tiny grid on gloo processes with CPU tensors (the reference kernels)")
    c.add_argument("--interpret", action="store_true", help="with --cpu: the Triton interpreter")
    c.add_argument("--nproc", type=int, default=2,
                   help="processes to spawn when not started by torchrun (default 2)")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    a = p.parse_args(argv)
    if a.interpret and not a.cpu:
        p.error("--interpret goes with --cpu")
    for f in ("heads", "qlen", "batch", "seq_len", "interleave"):
        vals = getattr(a, f)
        if vals is not None and any(v < 1 for v in vals):
            p.error(f"--{f.replace('_', '-')}: values must be >= 1, got {vals}")
    if a.nproc < 1 or a.replays < 1:
        p.error("--nproc and --replays must be >= 1")
    if a.method is None:
        a.method = ["rs"] if (a.quick or a.cpu) else ["rs", "a2a"]
    if a.interleave is None:
        a.interleave = [16] if a.cpu else [PAGE]
    if a.budget_s is None and a.quick:
        a.budget_s = 200.0
    return a


def resolve_cases(a: argparse.Namespace) -> list[Case]:
    grid = any(getattr(a, f) is not None for f in ("heads", "qlen", "batch", "seq_len"))
    if grid:
        shapes = list(itertools.product(a.heads or FULL_GRID["heads"], a.qlen or FULL_GRID["qlen"],
                                        a.batch or FULL_GRID["batch"],
                                        a.seq_len or FULL_GRID["seq_len"]))
    elif a.cpu:
        shapes = CPU_GRID
    elif a.quick:
        shapes = QUICK_GRID
    else:
        shapes = list(itertools.product(*FULL_GRID.values()))
    return [Case(h, q, b, L, interleave=i, method=m) for (h, q, b, L), i, m in
            itertools.product(shapes, a.interleave, a.method)]


# --- process group --------------------------------------------------------------------------


def _log(*args) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(a: argparse.Namespace) -> torch.device:
    backend = "gloo" if a.cpu else "nccl"
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if a.cpu:
        torch.set_num_threads(1)
        dev = torch.device("cpu")
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=300))
    else:
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group(backend, rank=rank, world_size=world, device_id=dev,
                                timeout=datetime.timedelta(seconds=600))
    return dev


def _spawned_entry(rank: int, world: int, port: int, argv: list[str]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rc = run(parse_args(argv))
    if rc:
        raise SystemExit(rc)


# --- timing ---------------------------------------------------------------------------------


def _max_over_ranks(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64,
                     device="cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def time_graph(fn, replays: int, collective: bool) -> float:
    """Median µs of ``fn()`` over CUDA-graph replays on this rank. ``collective``: ``fn``
    communicates, so every replay starts after a barrier and a queued GPU sleep, so that the
    ranks' graphs start together (the skew between hosts is not timed)."""
    if not torch.cuda.is_available() or dist.get_backend() != "nccl":
        times = []
        for _ in range(min(replays, 3)):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # compiles, creates the NCCL communicator: outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # thread_local: the NCCL watchdog thread may query its events while this thread captures.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    us = harness.time_replays(graph.replay, replays, harness.PREQUEUE_CYCLES,
                              before=dist.barrier if collective else None)
    del graph
    return us


# --- one case -------------------------------------------------------------------------------


def _sharded_inputs(case: Case, world: int, rank: int, dev, gen, full: bool):
    """(q, local cache, local table, global seq_lens, whole cache and table or None)."""
    from mla_ops.context_parallel import shard_kv_cache, shard_lengths

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    q = 0.5 * torch.randn(case.B * case.qlen, case.H, LK, generator=gen, device=dev, dtype=dtype)
    lens = torch.full((case.B,), case.L, dtype=torch.int32, device=dev)
    if full:  # the whole cache (the same on every rank: same seed), sharded
        pages = math.ceil(case.L / PAGE)
        cache = torch.randn(case.B * pages, PAGE, 1, LK, generator=gen, device=dev, dtype=dtype)
        table = torch.randperm(case.B * pages, generator=gen, device=dev).view(case.B, pages).int()
        local, local_table = shard_kv_cache(cache, table, lens, PAGE, world, rank, case.interleave)
        return q, local, local_table, lens, (cache, table)
    pages = math.ceil(shard_lengths(case.L, world, rank, case.interleave) / PAGE)
    local = torch.randn(max(1, case.B * pages), PAGE, 1, LK, generator=gen, device=dev, dtype=dtype)
    local_table = torch.randperm(max(1, case.B * pages), generator=gen, device=dev)
    local_table = local_table[: case.B * pages].view(case.B, pages).int()
    return q, local, local_table, lens, None


def _fits(nbytes: int, dev) -> bool:
    if dev.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(dev)
    return nbytes < 0.85 * free


def run_case(case: Case, a: argparse.Namespace, dev, kernel: str) -> dict:
    from benchmarks.decode import compare
    from mla_ops import platform
    from mla_ops.context_parallel import CPVerify
    from mla_ops.decode_verify.launch import decode_attention_fwd_verify, select_verify_config
    from mla_ops.decode_verify.splits import verify_num_kv_splits

    world, rank = dist.get_world_size(), dist.get_rank()
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    row = {**dataclasses.asdict(case), "world": world, "page_size": PAGE, "Lk": LK, "Lv": LV,
           "kv_bytes": case.kv_bytes(), "rank_kv_bytes": case.rank_kv_bytes(world)}
    full = a.check and _fits(case.kv_bytes() + case.rank_kv_bytes(world), dev)
    q, cache, table, lens, whole = _sharded_inputs(case, world, rank, dev, gen, full)
    step = CPVerify(None, max_batch=case.B, max_qlen=case.qlen, num_heads=case.H, Lv=LV, Lk=LK,
                    dtype=q.dtype, device=dev, page_size=PAGE, sm_scale=SM_SCALE,
                    interleave=case.interleave, max_seq_len=case.L, method=case.method,
                    kernel=kernel)
    row["splits_local"] = step.num_kv_splits

    def step_fn():
        step(q, cache, table, lens, None, case.qlen)

    def compute_fn():
        step.partial(q, cache, table, lens, None, case.qlen)

    o_part, lse_part = step.partial(q, cache, table, lens, None, case.qlen)
    o_part, lse_part = o_part.clone(), lse_part.clone()

    def merge_fn():
        step.combiner(o_part, lse_part)

    if whole is not None:  # --check: the step against the single-GPU kernel, this rank's heads
        o, lse = step(q, cache, table, lens, None, case.qlen)
        ref_o = torch.empty(q.shape[0], case.H, LV, dtype=q.dtype, device=dev)
        ref_lse = torch.empty(q.shape[0], case.H, dtype=torch.float32, device=dev)
        _single(case, q, whole, lens, ref_o, ref_lse, kernel)
        heads = slice(0, case.H) if case.method == "ar" else slice(
            rank * case.H // world, (rank + 1) * case.H // world)
        res = compare(o, lse, ref_o[:, heads], ref_lse[:, heads])
        ok = res["err_o_rel"] <= 2e-2 and res["err_lse_abs"] <= 2e-2
        res["ok"] = bool(_max_over_ranks(0.0 if ok else 1.0) == 0.0)
        row["check"] = res
        _log(f"  check {case.label}: o rel err {res['err_o_rel']:.2e}, lse abs err "
             f"{res['err_lse_abs']:.2e} -> {'ok' if res['ok'] else 'FAIL'}")
        del ref_o, ref_lse

    row["step_us"] = _max_over_ranks(time_graph(step_fn, a.replays, collective=True))
    row["compute_us"] = _max_over_ranks(time_graph(compute_fn, a.replays, collective=False))
    row["merge_us"] = _max_over_ranks(time_graph(merge_fn, a.replays, collective=True))
    row["comm_share"] = max(0.0, 1.0 - row["compute_us"] / row["step_us"])
    del step, o_part, lse_part, cache, table

    if not a.no_single:
        single_us = None
        if rank == 0 and _fits(case.kv_bytes() * (1 if whole is not None else 2), dev):
            if whole is None:
                pages = math.ceil(case.L / PAGE)
                whole = (torch.randn(case.B * pages, PAGE, 1, LK, generator=gen, device=dev,
                                     dtype=q.dtype),
                         torch.randperm(case.B * pages, generator=gen, device=dev)
                         .view(case.B, pages).int())
            o1 = torch.empty(q.shape[0], case.H, LV, dtype=q.dtype, device=dev)
            l1 = torch.empty(q.shape[0], case.H, dtype=torch.float32, device=dev)
            cfg = select_verify_config(case.B, case.qlen, case.H)
            splits = verify_num_kv_splits(case.L, case.B, case.qlen, case.H,
                                          platform.current().sm_count, block_h=cfg["BLOCK_H"])
            ws = (torch.empty(q.shape[0], case.H, splits, LV + 1, device=dev)
                  if splits > 1 else None)
            row["splits_single"] = splits

            def single_fn():
                if kernel == "reference":
                    _single(case, q, whole, lens, o1, l1, kernel)
                else:
                    decode_attention_fwd_verify(q, whole[0], whole[0][..., :LV], o1, l1, whole[1],
                                                lens, None, case.qlen, ws, splits, SM_SCALE, PAGE)

            single_us = time_graph(single_fn, a.replays, collective=False)
            del o1, l1, ws
        del whole
        flag = torch.tensor([single_us if single_us is not None else -1.0], dtype=torch.float64,
                            device=dev if dev.type == "cuda" else "cpu")
        dist.broadcast(flag, src=0)
        single_us = float(flag.item())
        row["single_us"] = single_us if single_us >= 0 else None
        row["speedup"] = row["single_us"] / row["step_us"] if row["single_us"] else None
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return row


def _single(case, q, whole, lens, o, lse, kernel):
    """The single-GPU verify over the whole cache into (o, lse)."""
    from mla_ops.decode_verify.launch import decode_attention_fwd_verify
    from mla_ops.reference import decode_verify_ref

    if kernel == "reference":
        ro, rl = decode_verify_ref(q, whole[0], LV, whole[1], lens, None, case.qlen, SM_SCALE, PAGE)
        o.copy_(ro)
        lse.copy_(rl)
    else:
        decode_attention_fwd_verify(q, whole[0], whole[0][..., :LV], o, lse, whole[1], lens, None,
                                    case.qlen, None, 1, SM_SCALE, PAGE)


TABLE_COLUMNS = ["H", "qlen", "B", "L", "I", "method", "splits", "step_us", "compute_us",
                 "merge_us", "comm%", "single_us", "speedup"]


def table_rows(rows: list[dict]) -> list[dict]:
    return [{"H": r["H"], "qlen": r["qlen"], "B": r["B"], "L": r["L"], "I": r["interleave"],
             "method": r["method"], "splits": r.get("splits_local", ""),
             "step_us": r["step_us"], "compute_us": r["compute_us"], "merge_us": r["merge_us"],
             "comm%": 100 * r["comm_share"],
             "single_us": r.get("single_us") if r.get("single_us") is not None else "-",
             "speedup": r.get("speedup") if r.get("speedup") is not None else "-"}
            for r in rows]


def run(a: argparse.Namespace) -> int:
    from benchmarks.results import env_info, print_table, write_json

    dev = _init(a)
    world, rank = dist.get_world_size(), dist.get_rank()
    kernel = "auto" if (not a.cpu or a.interpret) else "reference"
    cases = resolve_cases(a)
    env = env_info()
    _log(f"cp verify benchmark: {world} ranks ({dist.get_backend()}), "
         f"{env.get('gpu') or 'cpu'}, torch {env['torch']}, triton {env['triton']}, "
         f"{len(cases)} case(s), kernels: {kernel}")
    t_start = time.monotonic()
    rows, rc = [], 0
    try:
        for i, case in enumerate(cases):
            over = a.budget_s is not None and time.monotonic() - t_start > a.budget_s
            if _max_over_ranks(1.0 if over else 0.0):
                _log(f"budget of {a.budget_s:.0f} s spent: {len(cases) - i} case(s) not run")
                break
            t0 = time.perf_counter()
            _log(f"[{i + 1}/{len(cases)}] {case.label} ...")
            row = run_case(case, a, dev, kernel)
            rows.append(row)
            if row.get("check") and not row["check"]["ok"]:
                rc = 1
            single = (f", single GPU {row['single_us']:.1f} us ({row['speedup']:.2f}x)"
                      if row.get("single_us") else "")
            _log(f"  step {row['step_us']:.1f} us = compute {row['compute_us']:.1f} us + "
                 f"{100 * row['comm_share']:.0f}% (merge alone {row['merge_us']:.1f} us)"
                 f"{single}  [{time.perf_counter() - t0:.1f} s]")
            if a.json and rank == 0:
                write_json(a.json, rows)
    finally:
        if a.json and rank == 0 and rows:
            write_json(a.json, rows)
            _log(f"wrote {a.json}")
        if rank == 0 and rows:
            print()
            print_table(table_rows(rows), TABLE_COLUMNS)
            sys.stdout.flush()
        dist.destroy_process_group()
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    if a.dry_run:
        world = int(os.environ.get("WORLD_SIZE", a.nproc))
        cases = resolve_cases(a)
        print(f"cp verify benchmark plan: {world} ranks, {len(cases)} case(s)")
        for c in cases:
            print(f"  {c.label}: whole cache {c.kv_bytes() / 2**30:.1f} GiB, per rank "
                  f"{c.rank_kv_bytes(world) / 2**30:.1f} GiB")
        return 0
    if not a.cpu and not torch.cuda.is_available():
        print("benchmark_cp_verify: no GPU here; use --dry-run or --cpu", file=sys.stderr)
        return 2
    if "RANK" in os.environ:  # torchrun
        return run(a)
    nproc = a.nproc if a.cpu else min(a.nproc, torch.cuda.device_count())
    if nproc < 2:
        print(f"benchmark_cp_verify: needs 2 processes, have {nproc} GPU(s)", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    mp.start_processes(_spawned_entry, args=(nproc, _free_port(), argv), nprocs=nproc, join=True,
                       start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
