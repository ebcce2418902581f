"""``torch.ops.mla``: registration of every op, from its spec (:mod:`mla_ops.spec`).

The ops mutate caller-provided outputs and return nothing, so a fake implementation is the
op's argument check. Device kernels: CUDA/HIP run the Triton launchers; CPU runs the
plain-PyTorch reference, or the Triton kernels themselves under ``TRITON_INTERPRET=1``. No
autograd formula is registered: calling an op with grad enabled on a tensor that requires grad
raises instead of silently detaching its outputs.

Who defines what is decided once, at import:

* ``mla_ops._C`` loaded (built from ``csrc_meta/`` by ``setup.py``; skipped with
  ``MLA_OPS_NO_EXT=1``): the C++ side defines the schemas, Meta kernels (generated from the same
  spec), the Autograd kernel that refuses grad and the ADInplaceOrView kernel; this module only
  adds the CPU and CUDA kernels.
* Otherwise ``torch.library.custom_op`` defines everything here.

Either way the schemas, checks, messages and kernels are the same. :data:`EXTENSION` is the
path of the loaded C++ library or None, :data:`EXTENSION_STATUS` one line saying which and why.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
from typing import Callable, Optional

import torch

from . import _ext, spec
from .platform import interpreter_enabled

__all__ = ["LIB", "SCHEMAS", "CHECKS", "EXTENSION", "EXTENSION_STATUS"]

LIB = "mla"
SCHEMAS = {name: op.schema for name, op in spec.OPS.items()}
# The compiled argument checks: the public functions and the fake implementations run these.
CHECKS: dict[str, Callable] = spec.python_checks()

EXTENSION: Optional[str] = _ext.load()
EXTENSION_STATUS: str = _ext.status(EXTENSION)


# --- device kernels -------------------------------------------------------------------------


def _lazy(path: str, attribute: str | None = None) -> Callable:
    """The function ``"module:name"`` of this package (or its ``attribute`` where it has one),
    imported at its first call: registering the ops must not import triton's kernels."""
    module, name = path.split(":")
    resolved: list[Callable] = []

    def kernel(*args):
        if not resolved:
            fn = getattr(importlib.import_module(module, __package__), name)
            resolved.append(getattr(fn, attribute, fn) if attribute else fn)
        resolved[0](*args)

    return kernel


def _kernels(launch: str, reference: Callable) -> dict[str, Callable]:
    """``{dispatch key: kernel}`` of one op (HIP tensors dispatch to the CUDA key): the Triton
    launcher on CUDA (its ``op_kernel``, which commits what it records to the C++ replays:
    :mod:`mla_ops.fastpath`), and on CPU under ``TRITON_INTERPRET=1``; else the plain-PyTorch
    one."""
    cuda, public = _lazy(launch, "op_kernel"), _lazy(launch)

    def cpu(*args):
        (public if interpreter_enabled() else reference)(*args)

    return {"CPU": cpu, "CUDA": cuda}


KERNELS: dict[str, dict[str, Callable]] = {
    "decode_verify": _kernels(".decode_verify.launch:decode_attention_fwd_verify",
                              _lazy(".reference:decode_verify_op_ref")),
    # The reference compiles nothing: nothing to warm but the check.
    "warmup_decode_verify": _kernels(".decode_verify.launch:warmup_decode_attention_fwd_verify",
                                     CHECKS["warmup_decode_verify"]),
    "context_attention": _kernels(".prefill.launch:context_attention_fwd",
                                  _lazy(".reference:context_attention_op_ref")),
    "merge_attn_states": _kernels(".merge.launch:merge_attn_states",
                                  _lazy(".reference:merge_attn_states_op_ref")),
    "rescale_attn_partial": _kernels(".merge.launch:rescale_attn_partial",
                                     _lazy(".reference:rescale_attn_partial_op_ref")),
}


# --- inference-only -------------------------------------------------------------------------

# Same words as inference_only() in csrc_meta/mla_meta.cpp.
INFERENCE_ONLY = (
    "{op} is inference-only (no autograd formula is registered), but {arg} requires grad: "
    "call it under torch.no_grad() or torch.inference_mode(), or pass tensors that do not "
    "require grad"
)

# torch 2.8 to 2.12 refuse to override custom_op's own Autograd kernel unless asked; 2.13 allows.
_OVERRIDE = ({"allow_override": True}
             if "allow_override" in inspect.signature(torch.library.Library.impl).parameters
             else {})


def schema_of(op: torch._ops.OpOverload) -> torch._C.FunctionSchema:
    """The registered schema of an op overload: ``OpOverload._schema``, torch's private
    attribute (no public accessor exists), read here only. ``tests/test_library.py`` pins it."""
    return op._schema


def _register_grad_refusal(lib: torch.library.Library, name: str) -> None:
    """Autograd-key kernel of ``mla::<name>``: refuse grad, else run the op below autograd.

    The one place that uses torch's private dispatcher API (``_AutoDispatchBelowAutograd``,
    ``_after_autograd_keyset``, ``OpOverload.redispatch``): custom_op's public
    ``register_autograd`` refuses mutating ops, and its default kernel runs them with grad on
    and leaves the outputs silently detached. ``tests/test_library.py`` fails when these move.
    """
    op = getattr(getattr(torch.ops, LIB), name).default
    names = [a.name for a in schema_of(op).arguments]

    def autograd_kernel(keyset, *args, **kwargs):
        if torch.is_grad_enabled():
            for arg, value in itertools.chain(zip(names, args), kwargs.items()):
                if isinstance(value, torch.Tensor) and value.requires_grad:
                    raise RuntimeError(INFERENCE_ONLY.format(op=f"{LIB}::{name}", arg=arg))
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *args, **kwargs)

    lib.impl(name, autograd_kernel, "Autograd", with_keyset=True, **_OVERRIDE)


# --- registration ---------------------------------------------------------------------------

# Keeps the Python registrations alive (a Library deregisters them when collected).
_LIB = torch.library.Library(LIB, "FRAGMENT")


def _fake(name: str) -> Callable:
    check = CHECKS[name]

    def fake(*args, **kwargs):
        check(*args, **kwargs)

    return fake


def _no_kernel(*args, **kwargs):
    raise AssertionError("mla ops have a kernel per device key")


def _define_in_python() -> None:
    for name, op_spec in spec.OPS.items():
        op = torch.library.custom_op(f"{LIB}::{name}", _no_kernel, mutates_args=op_spec.mutates,
                                     schema=op_spec.schema)
        op.register_fake(_fake(name))
        for key, kernel in KERNELS[name].items():
            op.register_kernel(key.lower())(kernel)
        _register_grad_refusal(_LIB, name)


def _register_onto_cpp() -> None:
    for name in spec.OPS:
        op = getattr(getattr(torch.ops, LIB), name).default
        if str(schema_of(op)) != f"{LIB}::{name}{SCHEMAS[name]}":
            raise RuntimeError(
                f"mla_ops: the C++ library {EXTENSION} defines {schema_of(op)}, but this package "
                f"expects {LIB}::{name}{SCHEMAS[name]}: it is stale. Rebuild it "
                f"(pip install --no-build-isolation -e .) or set {_ext.ENV_NO_EXT}=1.")
        for key, kernel in KERNELS[name].items():
            _LIB.impl(name, kernel, key)


if EXTENSION is None:
    _define_in_python()
else:
    _register_onto_cpp()
