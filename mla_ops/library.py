"""``torch.ops.mla``: schemas, fake implementations and device kernels of every op.

The ops mutate caller-provided outputs and return nothing, so the fake implementations only
validate. CPU runs the plain-PyTorch reference, or the Triton kernels themselves when
``TRITON_INTERPRET=1``; CUDA and HIP run the Triton kernels. No autograd formula is
registered: the ops are inference-only, and calling one with grad enabled on a tensor that
requires grad raises (instead of silently detaching its outputs).

Who defines what, decided once at import:

* C++ library present (``csrc_meta/`` built by ``setup.py`` into ``mla_ops/_C``, loaded by
  :mod:`mla_ops._ext` unless ``MLA_OPS_NO_EXT=1``): the C++ side defines the schemas, the Meta
  kernels (which FakeTensor runs as the fake implementation), the Autograd kernel that refuses
  grad and the ADInplaceOrView kernel that bumps versions. This module only adds the CPU and
  CUDA kernels onto those schemas.
* No C++ library: ``torch.library.custom_op`` defines everything here, with the Python checks
  as fake implementations and the same inference-only Autograd kernel.

Either way the ops, schemas, checks (same messages, same exception types) and kernels are the
same; :data:`EXTENSION` says which side defined them.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Callable, Optional

import torch

from . import _ext, checks, reference
from .platform import interpreter_enabled

__all__ = [
    "LIB",
    "SCHEMAS",
    "EXTENSION",
    "decode_verify",
    "warmup_decode_verify",
    "context_attention",
]

LIB = "mla"

# The schemas, pinned by tests/test_library.py and tests/test_csrc_meta.py and defined
# identically by csrc_meta/mla_meta.cpp.
# Launch parameters (qlen, split cap, page size, windows) are plain ints: they pick kernel
# variants and are never symbolic.
SCHEMAS = {
    "decode_verify": (
        "(Tensor q, Tensor k_buffer, Tensor v_buffer, Tensor(a!) o, Tensor(b!) lse, "
        "Tensor req_to_token, Tensor seq_lens, Tensor? real_seq_lens, int qlen, "
        "Tensor(c!)? attn_logits, int num_kv_splits, float sm_scale, int page_size, "
        "Tensor? k_scale=None) -> ()"
    ),
    "warmup_decode_verify": (
        "(Tensor q, Tensor k_buffer, Tensor o, Tensor lse, Tensor req_to_token, bool has_real, "
        "int[] qlens, Tensor? attn_logits, float sm_scale, int page_size, "
        "Tensor? k_scale=None) -> ()"
    ),
    "context_attention": (
        "(Tensor q, Tensor k, Tensor v, Tensor(a!) o, Tensor b_start_loc, Tensor b_seq_len, "
        "int max_input_len, bool is_causal=True, float? softmax_scale=None, "
        "int? sliding_window_q=None, int? sliding_window_k=None, Tensor? sinks=None) -> ()"
    ),
}

_MUTATES = {
    "decode_verify": ("o", "lse", "attn_logits"),
    "warmup_decode_verify": (),
    "context_attention": ("o",),
}

# Path of the C++ library that defined the schemas and Meta kernels, or None when this module
# defined them with custom_op (pure-Python mode).
EXTENSION: Optional[str] = _ext.load()


# --- decode verify --------------------------------------------------------------------------


def _decode_verify_cpu(q, k_buffer, v_buffer, o, lse, req_to_token, seq_lens, real_seq_lens,
                       qlen, attn_logits, num_kv_splits, sm_scale, page_size, k_scale=None):
    out, out_lse = reference.decode_verify_ref(
        q, k_buffer, v_buffer.shape[-1], req_to_token, seq_lens, real_seq_lens, qlen,
        sm_scale, page_size, k_scale,
    )
    o.copy_(out)
    lse.copy_(out_lse)


def _decode_verify_triton(*args):
    from .decode_verify.launch import decode_attention_fwd_verify

    decode_attention_fwd_verify(*args)  # validates first


def _decode_verify_fake(*args):
    checks.check_decode_verify(*args)


def _decode_verify_cpu_kernel(*args):
    checks.check_decode_verify(*args)
    if interpreter_enabled():
        _decode_verify_triton(*args)
    else:
        _decode_verify_cpu(*args)


# --- warmup ---------------------------------------------------------------------------------


def _warmup_decode_verify_triton(*args):
    from .decode_verify.launch import warmup_decode_attention_fwd_verify

    warmup_decode_attention_fwd_verify(*args)


def _warmup_decode_verify_fake(*args):
    checks.check_warmup_decode_verify(*args)


def _warmup_decode_verify_cpu_kernel(*args):
    checks.check_warmup_decode_verify(*args)
    if interpreter_enabled():
        _warmup_decode_verify_triton(*args)
    # The reference path compiles nothing, so there is nothing to warm.


# --- encoder (prefill) attention ------------------------------------------------------------


def _context_attention_cpu(q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal=True,
                           softmax_scale=None, sliding_window_q=None, sliding_window_k=None,
                           sinks=None):
    out = reference.context_attention_ref(q, k, v, b_start_loc, b_seq_len, is_causal,
                                          softmax_scale, sliding_window_q, sliding_window_k, sinks)
    # Only tokens inside a sequence are written, as the kernel does.
    for start, n in zip(b_start_loc.tolist(), b_seq_len.tolist()):
        o[start : start + n].copy_(out[start : start + n])


def _context_attention_triton(*args):
    from .prefill.launch import context_attention_fwd

    context_attention_fwd(*args)  # validates first


def _context_attention_fake(*args):
    checks.check_context_attention(*args)


def _context_attention_cpu_kernel(*args):
    checks.check_context_attention(*args)
    if interpreter_enabled():
        _context_attention_triton(*args)
    else:
        _context_attention_cpu(*args)


# --- registration ---------------------------------------------------------------------------

# op -> (fake, {dispatch key: kernel}). HIP tensors dispatch to the CUDA key.
_IMPLS: dict[str, tuple[Callable, dict[str, Callable]]] = {
    "decode_verify": (
        _decode_verify_fake,
        {"CPU": _decode_verify_cpu_kernel, "CUDA": _decode_verify_triton},
    ),
    "warmup_decode_verify": (
        _warmup_decode_verify_fake,
        {"CPU": _warmup_decode_verify_cpu_kernel, "CUDA": _warmup_decode_verify_triton},
    ),
    "context_attention": (
        _context_attention_fake,
        {"CPU": _context_attention_cpu_kernel, "CUDA": _context_attention_triton},
    ),
}

# Same words as inference_only() in csrc_meta/mla_meta.cpp.
_INFERENCE_ONLY = (
    "{op} is inference-only (no autograd formula is registered), but {arg} requires grad: "
    "call it under torch.no_grad() or torch.inference_mode(), or pass tensors that do not "
    "require grad"
)


def _inference_only_kernel(op: torch._ops.OpOverload) -> Callable:
    """Autograd-key kernel: refuse grad, else run the op below autograd (no formula)."""
    names = [a.name for a in op._schema.arguments]

    def autograd_kernel(keyset, *args, **kwargs):
        if torch.is_grad_enabled():
            for name, a in itertools.chain(zip(names, args), kwargs.items()):
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    raise RuntimeError(_INFERENCE_ONLY.format(op=op._schema.name, arg=name))
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & torch._C._after_autograd_keyset, *args, **kwargs)

    return autograd_kernel


def _no_kernel(name: str) -> Callable:
    def kernel(*args, **kwargs):
        raise AssertionError(f"{LIB}::{name} has no kernel for this device")

    kernel.__name__ = name
    return kernel


def _override(lib: torch.library.Library, name: str, kernel: Callable, key: str) -> None:
    """``lib.impl`` over a kernel another Python Library registered (custom_op's own)."""
    if "allow_override" in inspect.signature(lib.impl).parameters:
        # torch 2.8 to 2.12 refuse by default; 2.13 allows by default.
        lib.impl(name, kernel, key, with_keyset=True, allow_override=True)
    else:
        # torch < 2.8 always refuses, by this record alone; the dispatcher itself allows it.
        torch.library._impls.discard(f"{LIB}/{name}/{key}")
        lib.impl(name, kernel, key, with_keyset=True)


# Keeps the Python registrations alive (a Library deregisters them when collected).
_LIBS: list[torch.library.Library] = []


def _define_in_python() -> dict[str, Callable]:
    """Pure-Python mode: custom_op defines each op, its fake impl and its device kernels."""
    ops = {}
    autograd_lib = torch.library.Library(LIB, "IMPL")
    _LIBS.append(autograd_lib)
    for name, (fake, kernels) in _IMPLS.items():
        op = torch.library.custom_op(
            f"{LIB}::{name}", _no_kernel(name), mutates_args=_MUTATES[name], schema=SCHEMAS[name]
        )
        op.register_fake(fake)
        for key, kernel in kernels.items():
            op.register_kernel(key.lower())(kernel)
        # Replace custom_op's generated Autograd kernel, which would run the op with grad on
        # and leave its outputs silently detached, by the one the C++ library registers.
        _override(autograd_lib, name, _inference_only_kernel(op._opoverload), "Autograd")
        ops[name] = op
    return ops


def _register_onto_cpp() -> dict[str, Callable]:
    """C++ mode: the schemas, Meta, Autograd and ADInplaceOrView kernels exist; add devices."""
    lib = torch.library.Library(LIB, "IMPL")
    _LIBS.append(lib)
    ops = {}
    for name, (_fake, kernels) in _IMPLS.items():
        op = getattr(getattr(torch.ops, LIB), name).default
        want = f"{LIB}::{name}{SCHEMAS[name]}"
        if str(op._schema) != want:
            raise RuntimeError(
                f"mla_ops: the C++ library {EXTENSION} defines {op._schema}, but this package "
                f"expects {want}: it is stale. Rebuild it (pip install --no-build-isolation -e .) "
                f"or set {_ext.ENV_NO_EXT}=1 before starting Python."
            )
        for key, kernel in kernels.items():
            lib.impl(name, kernel, key)
        ops[name] = op
    return ops


_OPS = _define_in_python() if EXTENSION is None else _register_onto_cpp()

# Callables with the ops' signatures: CustomOpDef objects in pure-Python mode, OpOverloads when
# the C++ library defined the schemas. Either is what torch.ops.mla.<name> runs.
decode_verify = _OPS["decode_verify"]
warmup_decode_verify = _OPS["warmup_decode_verify"]
context_attention = _OPS["context_attention"]
