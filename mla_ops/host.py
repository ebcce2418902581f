"""What every launcher shares on the host: the device guard, integer arithmetic in plain
Python, and the bounds a paged cache's kernels clamp their metadata into.

``triton.cdiv`` and ``triton.next_power_of_2`` are ``ConstexprFunction`` objects in triton 3.6:
about 4 µs a call on the host, paid on every eager launch (an encoder run outside a CUDA graph,
the positional decode API). Launchers use these instead; kernels keep ``tl.cdiv``.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["cdiv", "next_power_of_2", "device_guard", "cache_bounds"]


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


def cache_bounds(k_buffer: torch.Tensor, req_to_token: torch.Tensor, page_size: int
                 ) -> tuple[int, int]:
    """``(num_pages, kv_capacity)`` of a paged cache ``[num_pages, page_size, 1, Lk]`` or
    ``[num_pages * page_size, 1, Lk]`` and its block table ``[B, max_pages]``: the range page
    indices are clamped into, and the tokens a table row holds (``max_pages * page_size``,
    capped at int32). An empty cache gives ``(1, 0)``: a capacity of 0 means no key is read
    (every request with one is marked), and the page bound stays one the kernels can compare
    and clamp against. Shapes only: no sync."""
    num_pages = k_buffer.shape[0] if k_buffer.dim() == 4 else k_buffer.shape[0] // page_size
    if num_pages == 0:
        return 1, 0
    return num_pages, min(req_to_token.shape[1] * page_size, 2**31 - 1)
