"""What every launcher shares on the host: what a call on CPU tensors runs, the device guard,
integer arithmetic in plain Python, and the bounds a paged cache's kernels clamp their
metadata into.

``triton.cdiv`` and ``triton.next_power_of_2`` are ``ConstexprFunction`` objects in triton 3.6:
about 4 µs a call on the host, paid on every eager launch (an encoder run outside a CUDA graph,
the positional decode API). Launchers use these instead; kernels keep ``tl.cdiv``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import threading
from typing import Callable

import torch

from .platform import interpreter_enabled, interpreter_problem

__all__ = ["cdiv", "next_power_of_2", "device_guard", "cache_geometry", "cache_bounds",
           "public_launcher", "made_outside_graph_pools"]


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints, ``b > 0``."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n``, for ``n >= 1`` (0 for 0, as triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def device_guard(device: torch.device):
    """Run launches (and the scratch they allocate) on ``device``, not the current device."""
    if device.type != "cuda" or device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def cache_geometry(k_buffer: torch.Tensor, page_size: int) -> tuple[int, int, int]:
    """``(num_pages, page stride, token stride)``, strides in elements, of a paged cache
    ``[num_pages, page_size, 1, Lk]`` or ``[num_pages * page_size, 1, Lk]`` (any page stride:
    a layer's view of a cross-layer cache). Shapes only: no sync."""
    if k_buffer.dim() == 4:
        return k_buffer.shape[0], k_buffer.stride(0), k_buffer.stride(1)
    return k_buffer.shape[0] // page_size, k_buffer.stride(0) * page_size, k_buffer.stride(0)


def cache_bounds(k_buffer: torch.Tensor, req_to_token: torch.Tensor, page_size: int
                 ) -> tuple[int, int]:
    """``(num_pages, kv_capacity)`` of a paged cache ``[num_pages, page_size, 1, Lk]`` or
    ``[num_pages * page_size, 1, Lk]`` and its block table ``[B, max_pages]``: the range page
    indices are clamped into, and the tokens a table row holds (``max_pages * page_size``,
    capped at int32). An empty cache gives ``(1, 0)``: a capacity of 0 means no key is read
    (every request with one is marked), and the page bound stays one the kernels can compare
    and clamp against. Shapes only: no sync."""
    num_pages = cache_geometry(k_buffer, page_size)[0]
    if num_pages == 0:
        return 1, 0
    return num_pages, min(req_to_token.shape[1] * page_size, 2**31 - 1)


@functools.lru_cache(maxsize=None)
def _op_args(op: str) -> tuple[str, ...]:
    """The argument names of ``mla::<op>``, in order."""
    from .spec import OPS, parse_schema

    return tuple(a.name for a in parse_schema(OPS[op].schema))


@functools.lru_cache(maxsize=None)
def _written(op: str) -> tuple[bool, ...]:
    """Per argument of ``mla::<op>``: whether the op writes it (``Tensor(a!)`` in its schema)."""
    from .spec import OPS, parse_schema

    return tuple(a.written for a in parse_schema(OPS[op].schema))


def _in_fp32(launch: Callable, op: str, args: tuple, kwargs: dict) -> None:
    """``launch`` with every bf16 tensor as an fp32 copy, the written ones copied back.

    Triton's interpreter computes bf16 wrongly (it has no bf16 arithmetic: errors of 1e9); fp32
    inputs hold bf16 values exactly, so the result is the fp32 kernel's, rounded once."""
    from .spec import python_checks

    names = _op_args(op)
    # The arguments as given are checked first: fp32 copies could pass where bf16 may not
    # (fp32 partials merge into an fp16 o; bf16 ones do not).
    python_checks()[op](*args, **{k: v for k, v in kwargs.items() if k in names})
    written = dict(zip(names, _written(op)))
    positional = dict(zip(names, args))
    wide = {k: v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16 else v
            for k, v in {**positional, **kwargs}.items()}
    launch(*(wide[k] for k in positional), **{k: wide[k] for k in kwargs})
    for k, v in {**positional, **kwargs}.items():
        if wide[k] is not v and written.get(k, False):
            v.copy_(wide[k])


def public_launcher(op: str, reference: str, *, launches: bool = True
                    ) -> Callable[[Callable], Callable]:
    """The public function of ``mla::<op>`` on every device: a GPU tensor goes to the
    decorated launcher; a CPU tensor to the op's plain-PyTorch CPU kernel (``reference``,
    ``"module:name"`` in this package), or under ``TRITON_INTERPRET=1`` to the launcher, which
    then runs the Triton kernels in the interpreter, bf16 computed in fp32 (never a driver
    error, never the interpreter's bf16 garbage). The op's first argument tells the device.
    A ``config=`` (launch overrides) on CPU tensors outside the interpreter is refused by name
    where the function ``launches`` (the reference has nothing to configure); a warmup, which
    only compiles, takes it and does nothing."""

    def wrap(launch: Callable) -> Callable:
        # The op's own kernel passes every schema argument positionally; those the function
        # takes keyword-only (after its positional ones) are passed to it by name.
        positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                         for p in inspect.signature(launch).parameters.values())

        @functools.wraps(launch)
        def call(*args, **kwargs):
            if len(args) > positional:
                kwargs.update(zip(_op_args(op)[positional:], args[positional:]))
                args = args[:positional]
            first = args[0] if args else kwargs.get(_op_args(op)[0])
            if isinstance(first, torch.Tensor) and first.is_cpu:
                if not interpreter_enabled():
                    config = kwargs.get("config")
                    if config and launches:
                        family = config.get("family", "table's")
                        raise ValueError(
                            f"config: the {family} family cannot run this launch: CPU tensors "
                            f"run the plain-PyTorch reference, which has no launch to configure "
                            f"(set TRITON_INTERPRET=1 before triton is imported to run the "
                            f"Triton kernels in the interpreter)")
                    module, name = reference.split(":")
                    kernel = getattr(importlib.import_module(module, __package__), name)
                    # The op's arguments only (the warmup's batches= means nothing here).
                    names = _op_args(op)
                    return kernel(*args, **{k: v for k, v in kwargs.items() if k in names})
                why = interpreter_problem()
                if why is not None:
                    raise RuntimeError(f"TRITON_INTERPRET is set, but {why}")
                if any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16
                       for a in (*args, *kwargs.values())):
                    return _in_fp32(launch, op, args, kwargs)
            return launch(*args, **kwargs)

        return call

    return wrap


def made_outside_graph_pools(make: Callable[[], torch.Tensor], device: torch.device) -> torch.Tensor:
    """``make()``, for a CUDA device on a helper thread: a tensor a launcher keeps beyond the
    call (a default scale per device) must not come from a CUDA graph's private memory pool.
    torch.compile's CUDA graph trees route every allocation of the thread that warms up or
    records a graph into that pool (``_cuda_beginAllocateCurrentThreadToPool``); a kept tensor
    made there is an untracked live allocation ("Detected 1 tensor(s) in the cudagraph pool
    not tracked as outputs") whose memory a later replay may reuse. The helper thread allocates
    from the default pool and waits for its stream before the tensor is handed over."""
    if device.type != "cuda":
        return make()
    out: list = []

    def run() -> None:
        try:
            with torch.cuda.device(device):
                t = make()
                torch.cuda.current_stream(device).synchronize()
            out.append(t)
        except BaseException as e:  # handed to the caller's thread
            out.append(e)

    worker = threading.Thread(target=run, name="mla_ops-alloc")
    worker.start()
    worker.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]
