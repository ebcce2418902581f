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
# Imported lazily: registering the ops must not import triton's kernels.

def _decode_verify_cuda(*args):
    from .decode_verify.launch import decode_attention_fwd_verify

    decode_attention_fwd_verify(*args)


def _decode_verify_cpu(*args):
    if interpreter_enabled():
        return _decode_verify_cuda(*args)
    from .reference import decode_verify_op_ref

    decode_verify_op_ref(*args)


def _warmup_decode_verify_cuda(*args):
    from .decode_verify.launch import warmup_decode_attention_fwd_verify

    warmup_decode_attention_fwd_verify(*args)


def _warmup_decode_verify_cpu(*args):
    if interpreter_enabled():
        return _warmup_decode_verify_cuda(*args)
    CHECKS["warmup_decode_verify"](*args)  # the reference compiles nothing: nothing to warm


def _context_attention_cuda(*args):
    from .prefill.launch import context_attention_fwd

    context_attention_fwd(*args)


def _context_attention_cpu(*args):
    if interpreter_enabled():
        return _context_attention_cuda(*args)
    from .reference import context_attention_op_ref

    context_attention_op_ref(*args)


def _merge_attn_states_cuda(*args):
    from .merge.launch import merge_attn_states

    merge_attn_states(*args)


def _merge_attn_states_cpu(o_parts, lse_parts, o, lse=None):
    if interpreter_enabled():
        return _merge_attn_states_cuda(o_parts, lse_parts, o, lse)
    from .reference import merge_attn_states_ref

    CHECKS["merge_attn_states"](o_parts, lse_parts, o, lse)
    out, out_lse = merge_attn_states_ref(o_parts, lse_parts)
    o.copy_(out)
    if lse is not None:
        lse.copy_(out_lse)


def _rescale_attn_partial_cuda(*args):
    from .merge.launch import rescale_attn_partial

    rescale_attn_partial(*args)


def _rescale_attn_partial_cpu(o_part, lse_parts, part, o_out, lse_out=None):
    if interpreter_enabled():
        return _rescale_attn_partial_cuda(o_part, lse_parts, part, o_out, lse_out)
    from .reference import rescale_attn_partial_ref

    CHECKS["rescale_attn_partial"](o_part, lse_parts, part, o_out, lse_out)
    out, out_lse = rescale_attn_partial_ref(o_part, lse_parts, part)
    o_out.copy_(out.view(o_out.shape))
    if lse_out is not None:
        lse_out.copy_(out_lse)


# op -> {dispatch key: kernel}. HIP tensors dispatch to the CUDA key.
KERNELS: dict[str, dict[str, Callable]] = {
    "decode_verify": {"CPU": _decode_verify_cpu, "CUDA": _decode_verify_cuda},
    "warmup_decode_verify": {"CPU": _warmup_decode_verify_cpu, "CUDA": _warmup_decode_verify_cuda},
    "context_attention": {"CPU": _context_attention_cpu, "CUDA": _context_attention_cuda},
    "merge_attn_states": {"CPU": _merge_attn_states_cpu, "CUDA": _merge_attn_states_cuda},
    "rescale_attn_partial": {"CPU": _rescale_attn_partial_cpu,
                             "CUDA": _rescale_attn_partial_cuda},
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


def _register_grad_refusal(lib: torch.library.Library, name: str) -> None:
    """Autograd-key kernel of ``mla::<name>``: refuse grad, else run the op below autograd.

    The one place that uses torch's private dispatcher API (``_AutoDispatchBelowAutograd``,
    ``_after_autograd_keyset``, ``OpOverload.redispatch``): custom_op's public
    ``register_autograd`` refuses mutating ops, and its default kernel runs them with grad on
    and leaves the outputs silently detached. ``tests/test_library.py`` fails when these move.
    """
    op = getattr(getattr(torch.ops, LIB), name).default
    names = [a.name for a in op._schema.arguments]

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
        if str(op._schema) != f"{LIB}::{name}{SCHEMAS[name]}":
            raise RuntimeError(
                f"mla_ops: the C++ library {EXTENSION} defines {op._schema}, but this package "
                f"expects {LIB}::{name}{SCHEMAS[name]}: it is stale. Rebuild it "
                f"(pip install --no-build-isolation -e .) or set {_ext.ENV_NO_EXT}=1.")
        for key, kernel in KERNELS[name].items():
            _LIB.impl(name, kernel, key)


if EXTENSION is None:
    _define_in_python()
else:
    _register_onto_cpp()
