"""What GPU this is: the one place the architecture is detected.

Everything that depends on the hardware (config tables, HIP launch kwargs, the SM count the
split heuristics use) asks :func:`current`. Tests pretend to be another GPU with
:func:`mock_platform`, the single override point.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
from typing import Iterator

import torch

__all__ = ["Platform", "current", "mock_platform", "interpreter_enabled", "interpreter_problem"]


@dataclasses.dataclass(frozen=True)
class Platform:
    """Facts about the device the kernels run on.

    arch: ``"sm_90"`` (CUDA capability 9.0), ``"gfx942"`` (HIP ``gcnArchName`` without its
    feature suffix), ``"cpu"`` when no GPU is present.
    """

    arch: str
    is_hip: bool
    is_cuda: bool
    sm_count: int
    interpret: bool
    device_name: str

    @property
    def has_gpu(self) -> bool:
        return self.is_cuda or self.is_hip

    @property
    def cuda_capability(self) -> tuple[int, int] | None:
        """``(major, minor)`` of a CUDA GPU (``"sm_90"``: ``(9, 0)``), None for any other."""
        if not self.is_cuda or not self.arch.startswith("sm_"):
            return None
        return divmod(int(self.arch[3:]), 10)


def interpreter_enabled() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=1)
def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run the kernels with the installed packages, or None.

    triton 3.6's interpreter takes ``int()`` of one-element arrays (a loaded loop bound), which
    numpy 2.4 made an error; triton 3.7 and later do not."""
    import importlib.util

    if importlib.util.find_spec("numpy") is None:
        return "Triton's interpreter needs numpy, which is not installed (pip install numpy)"
    import numpy
    import triton

    from .tuning import _version_tuple

    if _version_tuple(triton.__version__) < (3, 7) and _version_tuple(numpy.__version__) >= (2, 4):
        return (f"triton {triton.__version__}'s interpreter fails with numpy {numpy.__version__} "
                "(int() of a one-element array): install numpy<2.4 or triton>=3.7")
    return None


@functools.lru_cache(maxsize=1)
def _detect() -> Platform:
    interpret = interpreter_enabled()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        is_hip = torch.version.hip is not None
        if is_hip:
            arch = props.gcnArchName.split(":")[0]
        else:
            arch = f"sm_{props.major}{props.minor}"
        return Platform(
            arch=arch,
            is_hip=is_hip,
            is_cuda=not is_hip,
            sm_count=props.multi_processor_count,
            interpret=interpret,
            device_name=props.name,
        )
    # No GPU: the interpreter still runs the Triton kernels on CPU tensors. The SM count only
    # feeds the split heuristics, so give it a Hopper-sized value that keeps them meaningful.
    return Platform(
        arch="cpu", is_hip=False, is_cuda=False, sm_count=132, interpret=interpret,
        device_name="cpu",
    )


_override: Platform | None = None


def current() -> Platform:
    """The platform in force: the mocked one inside :func:`mock_platform`, else the detected one."""
    return _override if _override is not None else _detect()


@contextlib.contextmanager
def mock_platform(arch: str, sm_count: int | None = None, is_hip: bool | None = None,
                  interpret: bool | None = None) -> Iterator[Platform]:
    """Pretend to run on ``arch`` (``"sm_90"``, ``"gfx942"``, ``"gfx1151"``, ``"sm_80"``, …).

    Only host-side decisions (config selection, launch kwargs, compiler workarounds) see the
    mock; kernels still run wherever the tensors live. ``interpret`` defaults to whether
    ``TRITON_INTERPRET`` is set.
    """
    global _override
    if is_hip is None:
        is_hip = arch.startswith("gfx")
    default_sms = {"sm_90": 132, "gfx942": 304, "gfx1151": 40}.get(arch, 108)
    plat = Platform(
        arch=arch,
        is_hip=is_hip,
        is_cuda=not is_hip,
        sm_count=sm_count if sm_count is not None else default_sms,
        interpret=interpreter_enabled() if interpret is None else interpret,
        device_name=f"mocked {arch}",
    )
    saved, _override = _override, plat
    _changed()
    try:
        yield plat
    finally:
        _override = saved
        _changed()


def _changed() -> None:
    """Recorded launches were selected for the platform in force: forget the C++ replays'
    (mla_ops.fastpath; the Python replays key on the platform)."""
    fastpath = sys.modules.get(__package__ + ".fastpath")
    if fastpath is not None:
        fastpath.selection_changed()
