"""What every Gluon (sm_90) kernel family of the package checks on the host, in one place: the
triton versions the Gluon code builds on and those it was checked on a GPU with, whether its
API imports, the small compatibility layer over the API's renames, whether the GPU is a CUDA
GPU of compute capability 9.0, and the routing between a kernel's Gluon and portable families
(:func:`select_family`).

The kernel families (``decode_verify.gluon_launch``, ``prefill.gluon_launch``) add their own
shape and dtype rules on top; what they do not cover runs on the portable kernels.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any, Callable, Sequence

import torch
import triton

from . import platform, tuning

__all__ = ["GLUON_TRITON_VERSIONS", "GLUON_GPU_CHECKED", "gluon_buildable", "gluon_available",
           "load_kernels", "sm90_reason", "select_family", "TensorDescriptor", "gl", "tma",
           "descriptor"]

# The triton versions whose Gluon API the kernels are written for: they build on each (CPU CI
# compiles every variant for sm_90a on the lowest and the newest, tests/test_gluon_*.py).
GLUON_TRITON_VERSIONS = ("3.6", "3.7", "3.8", "3.9")
# The versions on which the Gluon kernels were run and checked on an H200: they run on the GPU
# only there; on another version the table routes every launch to the portable kernels.
GLUON_GPU_CHECKED = ("3.6",)

try:  # the Gluon API of triton 3.6 to 3.9
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import tma as _tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    _IMPORT_ERROR = None
except Exception as e:  # pragma: no cover - depends on the installed triton
    gl = TensorDescriptor = _tma = None
    _IMPORT_ERROR = f"{type(e).__name__}: {e}"


def _tma_compat() -> ModuleType | None:
    """Hopper's ``tma`` module under the names the kernels use, ``async_load`` and
    ``async_store``, on every triton of the range: triton 3.7 renamed 3.6's
    ``async_copy_global_to_shared`` / ``async_copy_shared_to_global`` (same arguments) and 3.9
    made the old names raise. A module object, so that ``@gluon.jit`` code reads it as a global."""
    if _tma is None:
        return None
    compat = ModuleType("mla_ops.gluon_support.tma")
    compat.__dict__.update({k: v for k, v in vars(_tma).items() if not k.startswith("__")})
    if not hasattr(_tma, "async_load"):  # triton 3.6
        compat.async_load = _tma.async_copy_global_to_shared
        compat.async_store = _tma.async_copy_shared_to_global
    return compat


tma = _tma_compat()

if gl is not None and not hasattr(gl.shared_memory_descriptor, "reinterpret"):
    # triton 3.6 names it ``_reinterpret``; 3.7 on, ``reinterpret`` (same arguments). The
    # kernels call the public name; on 3.6 it is the same method under its later name.
    gl.shared_memory_descriptor.reinterpret = gl.shared_memory_descriptor._reinterpret


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def gluon_buildable() -> str | None:
    """None if this triton has the Gluon API the kernels are written for (they import and
    compile), else why not."""
    if _minor(triton.__version__) not in GLUON_TRITON_VERSIONS:
        return (f"triton {triton.__version__}: the Gluon kernels are written for triton "
                f"{', '.join(GLUON_TRITON_VERSIONS)}")
    if _IMPORT_ERROR is not None:
        return f"triton.experimental.gluon does not import: {_IMPORT_ERROR}"
    return None


def gluon_available() -> str | None:
    """None if the Gluon kernels may run on this triton (they build, and were checked on a GPU
    with it), else why not."""
    why = gluon_buildable()
    if why is None and _minor(triton.__version__) not in GLUON_GPU_CHECKED:
        why = (f"triton {triton.__version__}: the Gluon kernels build on it but were checked on "
               f"a GPU only with triton {', '.join(GLUON_GPU_CHECKED)}")
    return why


def load_kernels(package: str) -> tuple[ModuleType | None, Callable[[], str | None]]:
    """``(package.gluon_kernels or None, availability)``: the family's kernel module, where
    this triton's Gluon API is one the kernels are written for and the module imports, and its
    ``gluon_available``: None if the kernels import and may run here, else why not."""
    module, error = None, gluon_buildable()
    if error is None:
        try:
            module = importlib.import_module(".gluon_kernels", package)
        except Exception as e:  # pragma: no cover - depends on the installed triton
            error = f"{package}.gluon_kernels does not import: {type(e).__name__}: {e}"

    def available() -> str | None:
        return gluon_available() or error

    return module, available


def sm90_reason(device: torch.device) -> str | None:
    """None for a CUDA device of compute capability 9.0 (wgmma, TMA, setmaxnreg), else why not.

    The GPU is the one :func:`mla_ops.platform.current` describes (``mock_platform`` in tests);
    ``device`` says whether the launch's tensors are on it."""
    if device.type != "cuda":
        return "not a CUDA tensor"
    plat = platform.current()
    if plat.is_hip:
        return "HIP: the Gluon kernels are NVIDIA sm_90 only"
    if plat.interpret:
        return "Triton's interpreter runs the portable kernels only"
    if plat.cuda_capability != (9, 0):
        return f"compute capability {plat.cuda_capability} ({plat.arch}): sm_90 only (wgmma)"
    return None


def select_family(kernel: str, facts: dict[str, Any], config: dict[str, Any] | None,
                  unsupported: str | None,
                  tensors_unsupported: Callable[[dict[str, Any]], str | None] | None = None,
                  ) -> dict[str, Any]:
    """The config a launch of ``kernel`` runs, whose ``"family"`` says which kernels run it.

    The table's rule for ``facts`` plus the ``gluon`` fact, with ``config`` laid over it. The
    fact holds where the Gluon family covers launches of these facts (``unsupported``, the
    family's reason when it does not, is None), unless ``config`` asks for the portable family
    or sets a key the Gluon family does not have: then the portable family's own rule is the
    base. Where the result is the Gluon family, ``tensors_unsupported(cfg)`` (None: not known
    yet, as for a plan or a warmup) names what only the tensors show, such as a base pointer
    off 16 bytes: the portable family runs such a launch, and a ``config`` that asked for the
    Gluon family by name is refused (ValueError), never silently ignored.
    """
    gluon = unsupported is None
    if gluon and config and (config.get("family") == "triton" or "family" not in config and
                             not set(config) <= set(tuning.KERNELS[kernel].defaults["gluon"])):
        gluon = False
    cfg = tuning.select(kernel, {**facts, "gluon": gluon}, config=config)
    if cfg["family"] != "gluon" or tensors_unsupported is None:
        return cfg
    why = tensors_unsupported(cfg)
    if why is None:
        return cfg
    if config and config.get("family") == "gluon":
        raise ValueError(f"config: the gluon family cannot run this launch: {why}")
    return tuning.select(kernel, {**facts, "gluon": False},
                         config={**(config or {}), "family": "triton"})


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
