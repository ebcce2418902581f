"""mla_ops.host: the launchers' integer helpers agree with triton's, and the device guard."""

from __future__ import annotations

import contextlib

import pytest
import torch
import triton

from mla_ops import host


@pytest.mark.parametrize("n", [0, 1, 2, 3, 15, 16, 17, 72, 80, 96, 255, 256, 257, 576, 4097,
                               131071, 131072, 131073])
def test_next_power_of_2_is_tritons(n):
    assert host.next_power_of_2(n) == triton.next_power_of_2(n)


@pytest.mark.parametrize("b", [1, 3, 16, 64, 128])
@pytest.mark.parametrize("a", [0, 1, 15, 16, 17, 127, 128, 129, 3520, 131073])
def test_cdiv_is_tritons(a, b):
    assert host.cdiv(a, b) == triton.cdiv(a, b)


def test_device_guard_switches_only_to_another_cuda_device():
    assert isinstance(host.device_guard(torch.device("cpu")), contextlib.nullcontext)
    if torch.cuda.device_count() < 2:
        pytest.skip("another CUDA device is needed to see the guard switch")
    with host.device_guard(torch.device("cuda", 1)):
        assert torch.cuda.current_device() == 1
