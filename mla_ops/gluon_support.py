"""What every Gluon (sm_90) kernel family of the package checks on the host, in one place: the
triton version the Gluon code is written for, whether its API imports, and whether a device
is a CUDA GPU of compute capability 9.0.

The kernel families (``decode_verify.gluon_launch``, ``prefill.gluon_launch``) add their own
shape and dtype rules on top and route what they do not cover to the portable kernels.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Callable, Sequence

import torch
import triton

__all__ = ["GLUON_TRITON_VERSIONS", "gluon_available", "load_kernels", "sm90_reason",
           "TensorDescriptor", "gl", "descriptor"]

GLUON_TRITON_VERSIONS = ("3.6",)  # the Gluon API this code is written for

try:  # the Gluon API of triton 3.6
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    _IMPORT_ERROR = None
except Exception as e:  # pragma: no cover - depends on the installed triton
    gl = TensorDescriptor = None
    _IMPORT_ERROR = f"{type(e).__name__}: {e}"


def gluon_available() -> str | None:
    """None if this triton has the Gluon API this code is written for, else why not."""
    if not triton.__version__.startswith(GLUON_TRITON_VERSIONS):
        return f"triton {triton.__version__} (the Gluon kernels are written for {GLUON_TRITON_VERSIONS})"
    if _IMPORT_ERROR is not None:
        return f"triton.experimental.gluon does not import: {_IMPORT_ERROR}"
    return None


def load_kernels(package: str) -> tuple[ModuleType | None, Callable[[], str | None]]:
    """``(package.gluon_kernels or None, availability)``: the family's kernel module, where it
    imports, and its ``gluon_available``: None if this triton has the Gluon API and the kernels
    import, else why not."""
    try:
        module, error = importlib.import_module(".gluon_kernels", package), None
    except Exception as e:  # pragma: no cover - depends on the installed triton
        module, error = None, f"{package}.gluon_kernels does not import: {type(e).__name__}: {e}"

    def available() -> str | None:
        return gluon_available() or error

    return module, available


def sm90_reason(device: torch.device) -> str | None:
    """None for a CUDA device of compute capability 9.0 (wgmma, TMA, setmaxnreg), else why not."""
    if device.type != "cuda":
        return "not a CUDA tensor"
    if torch.version.hip is not None:
        return "HIP: the Gluon kernels are NVIDIA sm_90 only"
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        return f"compute capability {cap}: sm_90 only (wgmma)"
    return None


@functools.lru_cache(maxsize=None)
def _shared_layout(block: tuple[int, ...], dtype) -> "gl.NVMMASharedLayout":
    return gl.NVMMASharedLayout.get_default_for(list(block), dtype)


def descriptor(t: torch.Tensor, shape: Sequence[int], strides: Sequence[int], block: Sequence[int],
               dtype) -> "TensorDescriptor":
    """A host TMA descriptor over ``t`` with boxes ``block`` of Gluon dtype ``dtype``.

    The shared-memory layout of a (box, dtype) is built once per process: building it costs
    about as much host time as the rest of the descriptor, and eager launches (an encoder run
    outside a CUDA graph) make several descriptors per call."""
    return TensorDescriptor(t, list(shape), list(strides), list(block), _shared_layout(tuple(block), dtype))
