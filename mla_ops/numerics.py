"""Constants every layer shares (kernels, launchers, references), each defined here once.

``LOG2E`` / ``LN2``: the kernels keep scores in log2 units (the softmax scale times log2(e),
so the softmax uses ``exp2``) and turn the LSE they write back into natural log (times ln 2).
Kernels wrap them as ``tl.constexpr`` / ``gl.constexpr``; launchers use :func:`exp2_scale`.

``FP8_DTYPES``: the fp8 cache dtypes of the installed torch. Their names are declared once, in
``spec.DTYPE_SETS`` (the argument rules and the C++ checks read them there; ``spec`` imports no
torch, so ``setup.py`` can load it before anything is installed): :func:`torch_dtypes`
resolves a set's names to this torch's dtypes.
"""

from __future__ import annotations

import math

import torch

from .spec import DTYPE_SETS

__all__ = ["LOG2E", "LN2", "exp2_scale", "torch_dtypes", "FP8_DTYPES"]

LOG2E = math.log2(math.e)  # 1.4426950408889634
LN2 = math.log(2.0)  # 0.6931471805599453


def exp2_scale(sm_scale: float) -> float:
    """The score scale of a kernel that works in log2 units: ``sm_scale * log2(e)``."""
    return float(sm_scale) * LOG2E


def torch_dtypes(set_name: str) -> tuple[torch.dtype, ...]:
    """The dtypes of ``spec.DTYPE_SETS[set_name]`` that this torch has."""
    return tuple(getattr(torch, n) for n in DTYPE_SETS[set_name] if hasattr(torch, n))


FP8_DTYPES = torch_dtypes("FP8")
