"""One parallel compile pool for every benchmark and sweep.

Worker processes (spawned, so each has its own CUDA context) run a job per launch variant once
on scratch tensors, which fills Triton's on-disk cache: the measuring process then only loads
binaries. A job is a module-level function ``job(spec)`` (picklable by name: a library module's,
never a script's ``__main__``) that raises on failure; the pool reports per variant ``(status,
message, seconds)``:

- ``ok``; ``error``: the compile or launch was refused (shared memory, a config the tuning
  module refuses, ...): that variant only;
- ``crash``: the job lost its process's CUDA context (``STICKY`` errors); the process refuses
  every later job (``retry``), which the pool hands to fresh processes (three rounds at most);
- ``unavailable``: the process cannot use the device at all (e.g. an exclusive-process GPU):
  :meth:`CompilePool.run` raises, and the caller compiles in its own process instead.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time
from typing import Any, Callable, Hashable, Mapping

# Messages after which a CUDA context is unusable.
STICKY = ("illegal memory access", "unspecified launch failure", "misaligned address",
          "illegal instruction", "device-side assert", "CUDA error")

Result = tuple  # (status, message, seconds)

_POISON: str | None = None  # this worker's context is gone: why


def is_sticky(e: BaseException | str) -> bool:
    return any(s in str(e) for s in STICKY)


def short_error(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:400]


def default_jobs(cap: int = 8, reserve: int = 1) -> int:
    """Worker processes: the CPUs less ``reserve``, at most ``cap`` (0: compile in-process)."""
    return max(0, min(cap, (os.cpu_count() or 1) - reserve))


def execute(job: Callable[[dict], Any], spec: dict) -> Result:
    """Run ``job(spec)`` in a worker: the status protocol of the module docstring."""
    global _POISON
    if _POISON is not None:
        return "retry", _POISON, 0.0
    import torch

    dev = spec.get("device", "cuda")
    try:  # a process that cannot use the device at all says so, and blames no config
        torch.zeros(1, device=dev).add_(1)
        if dev == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        return "unavailable", f"{type(e).__name__}: {e}"[:400], 0.0
    t0 = time.perf_counter()
    try:
        job(spec)
        if dev == "cuda":
            torch.cuda.synchronize()
        return "ok", "", time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - reported to the parent
        msg = short_error(e)
        if is_sticky(e):
            _POISON = msg
            return "crash", msg, time.perf_counter() - t0
        return "error", msg, time.perf_counter() - t0


class CompilePool:
    """``jobs`` spawned worker processes running ``job`` on specs."""

    def __init__(self, jobs: int, job: Callable[[dict], Any]):
        self.jobs = jobs
        self.job = job
        self._ex: concurrent.futures.ProcessPoolExecutor | None = None

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._ex is None:
            self._ex = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"))
        return self._ex

    def run(self, specs: Mapping[Hashable, dict],
            deadline: float | None = None) -> dict[Hashable, Result]:
        """``key -> (status, message, seconds)`` for the specs done before ``deadline``
        (``time.monotonic()``); variants whose worker lost its context go to fresh workers (three
        rounds at most). Raises RuntimeError if the workers cannot use the device at all."""
        todo = dict(specs)
        out: dict[Hashable, Result] = {}
        for _ in range(3):
            if not todo or self.jobs <= 0:
                break
            ex = self._executor()
            futs = {ex.submit(execute, self.job, s): k for k, s in todo.items()}
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            retry = {}
            try:
                for fut in concurrent.futures.as_completed(futs, timeout=timeout):
                    k = futs[fut]
                    try:
                        res = fut.result()
                    except Exception as e:  # noqa: BLE001 - a dead worker process
                        res = ("retry", f"{type(e).__name__}: {e}", 0.0)
                    if res[0] == "unavailable":
                        raise RuntimeError(f"a compile process cannot use the device: {res[1]}")
                    if res[0] == "retry":
                        retry[k] = todo[k]
                    else:
                        out[k] = res
            except concurrent.futures.TimeoutError:
                self.close()
                return out
            if retry:  # some worker's CUDA context died: start fresh processes
                self.close()
            todo = retry
        return out

    def close(self) -> None:
        if self._ex is not None:
            procs = list(getattr(self._ex, "_processes", {}).values())
            self._ex.shutdown(wait=False, cancel_futures=True)
            for p in procs:  # our own workers, by their handles
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(timeout=5)
            self._ex = None


def precompile(job: Callable[[dict], Any], specs: Mapping[Hashable, dict], jobs: int,
               budget_s: float = 300.0) -> dict[Hashable, Result]:
    """A head start for a benchmark: compile ``specs`` with ``jobs`` processes and say how it
    went. Failures are only reported (the measuring process compiles and fails on its own)."""
    if jobs <= 0 or not specs:
        return {}
    t0 = time.perf_counter()
    pool = CompilePool(jobs, job)
    try:
        done = pool.run(specs, deadline=time.monotonic() + budget_s)
    except Exception as e:  # noqa: BLE001 - only a head start; this process compiles anyway
        print(f"note: parallel compile unavailable ({type(e).__name__}: {e}); compiling here")
        return {}
    finally:
        pool.close()
    bad = [v[1] for v in done.values() if v[0] != "ok"]
    print(f"compiled {len(done)} launch variants in {time.perf_counter() - t0:.1f} s with {jobs} "
          f"processes" + (f"; {len(bad)} failed there, e.g. {bad[0]}" if bad else ""), flush=True)
    return done
