"""What every launcher shares on the host: the device guard, and integer arithmetic in plain
Python.

``triton.cdiv`` and ``triton.next_power_of_2`` are ``ConstexprFunction`` objects in triton 3.6:
about 4 µs a call on the host, paid on every eager launch (an encoder run outside a CUDA graph,
the positional decode API). Launchers use these instead; kernels keep ``tl.cdiv``.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["cdiv", "next_power_of_2", "device_guard"]


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
