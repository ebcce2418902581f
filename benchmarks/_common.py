"""Shared benchmark plumbing: environment record, the machine's two ceilings, timing, JSON.

Every benchmark measures the ceilings in the same run it times kernels, because these machines
are noisy and a figure only means something beside its own roofline.
"""

from __future__ import annotations

import datetime
import json
import os
import platform as _py_platform
import statistics
import sys
from typing import Callable

import torch


def env_info() -> dict:
    """GPU, torch, triton, date: carried by every JSON result."""
    import triton

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": _py_platform.python_version(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, sm_count=props.multi_processor_count,
                    cuda=torch.version.cuda, hip=torch.version.hip)
    else:
        info.update(gpu=None)
    return info


def pick_device(interpret: bool, prog: str) -> str | None:
    """``"cpu"`` under ``--interpret``, ``"cuda"`` on a GPU, else None after saying why."""
    if interpret:
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    print(f"{prog}: no CUDA/HIP GPU here. Run it on the GPU machine, or pass "
          "--interpret for a tiny CPU smoke run through the Triton interpreter.",
          file=sys.stderr)
    return None


def time_cuda_graph(fn: Callable[[], None], replays: int = 200, warmup: int = 3,
                    prequeue_cycles: int = 0) -> float:
    """Median microseconds of one ``fn()`` over CUDA-graph replays (launch gaps excluded).

    ``prequeue_cycles``: before each replay a ``torch.cuda._sleep`` of that many GPU cycles is
    queued ahead of the start event, so that the host has enqueued the event and the graph
    before the GPU reaches them: the time is then the graph's own, without the host's launch
    latency, the way a layer runs inside a model's graph. For microsecond-scale calls (a
    latency-bound decode step) that latency is otherwise part of the figure.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays):
        if prequeue_cycles:
            torch.cuda._sleep(prequeue_cycles)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def time_do_bench(fn: Callable[[], None], warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median milliseconds of ``fn()`` by ``triton.testing.do_bench``."""
    import triton

    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def measure_ceilings(copy_bytes: int = 4 << 30, mm: int = 8192) -> dict:
    """This machine's copy bandwidth (bytes read + written per s) and bf16 matmul FLOP/s."""
    src = torch.empty(copy_bytes // 2, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy_ms = time_do_bench(lambda: dst.copy_(src))
    a = torch.randn(mm, mm, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(mm, mm, device="cuda", dtype=torch.bfloat16)
    mm_ms = time_do_bench(lambda: torch.matmul(a, b))
    del src, dst, a, b
    torch.cuda.empty_cache()
    return {
        "copy_TBps": 2 * (copy_bytes // 2) / (copy_ms * 1e-3) / 1e12,
        "bf16_mm_TFLOPs": 2 * mm**3 / (mm_ms * 1e-3) / 1e12,
    }


def write_json(path: str, rows: list[dict], ceilings: dict | None = None) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"env": env_info(), "ceilings": ceilings, "rows": rows}, f, indent=1)
        f.write("\n")


def print_table(rows: list[dict], columns: list[str]) -> None:
    """A short fixed-width table of ``columns`` from ``rows`` (benchmarks print it last)."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c)
              for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))
