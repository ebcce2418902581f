"""Timing: CUDA-graph replays (prequeued behind a GPU sleep, or from idle), ``do_bench``, L2
rotation over copies of the data, and the machine's two ceilings.

Every benchmark measures the ceilings in the same run it times kernels, because these machines
are noisy and a figure only means something beside its own roofline. On a CPU (``--interpret``)
the same calls return the wall time of one call: the code path runs, the times mean nothing.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence, TypeVar

import torch

T = TypeVar("T")

# Queued ahead of each replay's start event: ~50 µs at the H200's 1.98 GHz, longer than the
# host takes to enqueue the event and the graph.
PREQUEUE_CYCLES = 100_000


def time_cuda_graph(fn: Callable[[], None], replays: int = 200, warmup: int = 3,
                    prequeue_cycles: int = 0) -> float:
    """Median microseconds of one ``fn()`` over CUDA-graph replays (launch gaps excluded).

    ``prequeue_cycles``: before each replay a ``torch.cuda._sleep`` of that many GPU cycles is
    queued ahead of the start event, so that the host has enqueued the event and the graph
    before the GPU reaches them: the time is then the graph's own, without the host's launch
    latency, the way a layer runs inside a model's graph. For microsecond-scale calls (a
    latency-bound decode step) that latency is otherwise part of the figure.
    """
    graph = capture_graph(fn, warmup)
    return time_replays(graph.replay, replays, prequeue_cycles)


def capture_graph(fn: Callable[[], None], warmup: int = 3) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of one ``fn()``, after ``warmup`` eager calls on a side stream, replayed
    three times (and synchronized) before it is returned."""
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
    return graph


def time_replays(replay: Callable[[], None], replays: int, prequeue_cycles: int = 0,
                 before: Callable[[], None] | None = None) -> float:
    """Median microseconds of ``replay()`` (an already captured graph's), each call between two
    events, behind a GPU sleep of ``prequeue_cycles`` when nonzero; ``before()`` runs on the
    host ahead of each (a barrier between ranks, say)."""
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays):
        if before is not None:
            before()
        if prequeue_cycles:
            torch.cuda._sleep(prequeue_cycles)
        start.record()
        replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def time_call(fn: Callable[[], None], device: str, max_replays: int = 200,
              target_ms: float = 60.0, calls_per_fn: int = 1,
              prequeue: bool = True) -> tuple[float, int]:
    """``(median µs of one kernel call, replays)``. GPU: CUDA-graph replays, as many as fit in
    about ``target_ms`` (at least 20, at most ``max_replays``), each prequeued unless
    ``prequeue`` is False. ``fn`` may make ``calls_per_fn`` calls (an L2 rotation,
    :func:`rotating`): the time is per call. CPU: the wall time of one ``fn()``."""
    if device != "cuda":
        return time_wall_us(fn) / calls_per_fn, 1
    fn()  # compiles outside the estimate
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    end.synchronize()
    replays, cycles = replay_plan(start.elapsed_time(end) * 1e3 / 3, max_replays, target_ms,
                                  prequeue)
    return time_cuda_graph(fn, replays=replays, prequeue_cycles=cycles) / calls_per_fn, replays


TIMELINE_CALLS = 4  # kernel_profile keeps each kernel's start and end up to this many calls


def kernel_profile(replay: Callable[[], None], calls: int = 1, replays: int = 1) -> dict:
    """Per-kernel GPU times of a captured graph (``replay`` runs it; it holds ``calls`` launches):
    ``replays`` replays traced by ``torch.profiler``. Returns ``kernels_us`` (each kernel name's
    mean time per occurrence), ``per_call_us`` (first kernel start to last kernel end, per
    call), ``max_gap_us`` (the largest gap between consecutive kernels) and, for at most
    :data:`TIMELINE_CALLS` calls, ``timeline_us``: each kernel's start and end from the first
    kernel's start (with a few calls: how one call's kernels overlap the next one's)."""
    replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            replay()
        torch.cuda.synchronize()
    evs = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda e: e.time_range.start)
    if not evs:
        return {"kernels_us": {}, "per_call_us": 0.0, "max_gap_us": 0.0}
    per: dict[str, list[float]] = {}
    for e in evs:
        per.setdefault(e.name, []).append(e.time_range.elapsed_us())
    gaps = [b.time_range.start - a.time_range.end for a, b in zip(evs, evs[1:])]
    span = evs[-1].time_range.end - evs[0].time_range.start
    t0 = evs[0].time_range.start
    return {"kernels_us": {name: sum(v) / len(v) for name, v in per.items()},
            "per_call_us": span / (calls * replays), "max_gap_us": max(gaps, default=0.0),
            # (name, start, end) from the first kernel's start: under PDL a dependent's own
            # time includes its wait for the kernel before it, its end does not lie.
            "timeline_us": [(e.name, e.time_range.start - t0, e.time_range.end - t0) for e in evs]
            if calls * replays <= TIMELINE_CALLS else []}


def replay_plan(est_us: float, max_replays: int, target_ms: float,
                prequeue: bool) -> tuple[int, int]:
    """``(replays, prequeue cycles)`` of a timing: as many replays of an ``est_us`` call as fit
    in ``target_ms`` (at least 20, at most ``max_replays``), each behind
    :data:`PREQUEUE_CYCLES` of GPU sleep unless ``prequeue`` is False."""
    replays = int(min(max_replays, max(20, target_ms * 1e3 / max(est_us, 1.0))))
    return replays, PREQUEUE_CYCLES if prequeue else 0


def interleaved(timers: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """``{label: [one time per round]}``: every timer run once per round, round-robin, so that a
    drift of the machine (clocks, temperature, a neighbour) hits every label alike."""
    times: dict[str, list[float]] = {label: [] for label in timers}
    for _ in range(rounds):
        for label, timer in timers.items():
            times[label].append(timer())
    return times


def time_do_bench(fn: Callable[[], None], warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median milliseconds of ``fn()`` by ``triton.testing.do_bench``."""
    import triton

    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def time_ms(fn: Callable[[], None], device: str, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Milliseconds of ``fn()``: ``do_bench``'s median on a GPU, one call's wall time on a CPU."""
    if device == "cuda":
        return time_do_bench(fn, warmup_ms=warmup_ms, rep_ms=rep_ms)
    return time_wall_us(fn) * 1e-3


def time_wall_us(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def rotating(call: Callable[[T], None], copies: Sequence[T]) -> Callable[[], None]:
    """``fn()`` running ``call(copy)`` for each copy in turn. Timed with ``calls_per_fn =
    len(copies)``, N copies whose total exceeds the L2 give an L2-cold time per call."""
    copies = list(copies)

    def fn():
        for c in copies:
            call(c)

    return fn


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
        "source": "measured in this run",
    }


def ceilings(device: str, measure: bool, nominal: dict) -> dict:
    """The ceilings measured here (GPU, ``measure``), else ``nominal`` (which names its source)."""
    if device == "cuda" and measure:
        return measure_ceilings()
    return dict(nominal)


def l2_bytes(device: str) -> int | None:
    if device != "cuda":
        return None
    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None)
