"""``torch.ops.mla``: schemas, fake implementations and device kernels of every op.

The ops mutate caller-provided outputs and return nothing, so the fake implementations only
validate. CPU runs the plain-PyTorch reference, or the Triton kernels themselves when
``TRITON_INTERPRET=1``; CUDA and HIP run the Triton kernels. No autograd formula is
registered: the ops are inference-only.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import checks, reference
from .platform import interpreter_enabled

__all__ = ["LIB", "SCHEMAS"]

LIB = "mla"

# The schemas custom_op infers from the signatures below, pinned by tests/test_library.py and
# mirrored by csrc_meta/.
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


# --- decode verify --------------------------------------------------------------------------


def _decode_verify_cpu(q, k_buffer, v_buffer, o, lse, req_to_token, seq_lens, real_seq_lens,
                       qlen, attn_logits, num_kv_splits, sm_scale, page_size, k_scale=None):
    out, out_lse = reference.decode_verify_ref(
        q, k_buffer, v_buffer.shape[-1], req_to_token, seq_lens, real_seq_lens, qlen,
        sm_scale, page_size, k_scale,
    )
    o.copy_(out)
    lse.copy_(out_lse)


def _decode_verify_triton(*args, **kwargs):
    from .decode_verify.launch import decode_attention_fwd_verify

    decode_attention_fwd_verify(*args, **kwargs)


@torch.library.custom_op(
    f"{LIB}::decode_verify", mutates_args=("o", "lse", "attn_logits"), schema=SCHEMAS["decode_verify"]
)
def decode_verify(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    real_seq_lens: Optional[torch.Tensor],
    qlen: int,
    attn_logits: Optional[torch.Tensor],
    num_kv_splits: int,
    sm_scale: float,
    page_size: int,
    k_scale: Optional[torch.Tensor] = None,
) -> None:
    """Causal MLA verify attention; writes ``o`` ``[B*qlen, H, Lv]`` and ``lse`` ``[B*qlen, H]``."""
    raise AssertionError("mla::decode_verify has no kernel for this device")  # replaced below


@decode_verify.register_fake
def _(q, k_buffer, v_buffer, o, lse, req_to_token, seq_lens, real_seq_lens, qlen, attn_logits,
      num_kv_splits, sm_scale, page_size, k_scale=None):
    checks.check_decode_verify(q, k_buffer, v_buffer, o, lse, req_to_token, seq_lens,
                               real_seq_lens, qlen, attn_logits, num_kv_splits, sm_scale,
                               page_size, k_scale)


@decode_verify.register_kernel("cpu")
def _(*args):
    checks.check_decode_verify(*args)
    if interpreter_enabled():
        _decode_verify_triton(*args)
    else:
        _decode_verify_cpu(*args)


@decode_verify.register_kernel("cuda")
def _(*args):
    _decode_verify_triton(*args)  # validates first


# --- warmup ---------------------------------------------------------------------------------


@torch.library.custom_op(
    f"{LIB}::warmup_decode_verify", mutates_args=(), schema=SCHEMAS["warmup_decode_verify"]
)
def warmup_decode_verify(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    req_to_token: torch.Tensor,
    has_real: bool,
    qlens: Sequence[int],
    attn_logits: Optional[torch.Tensor],
    sm_scale: float,
    page_size: int,
    k_scale: Optional[torch.Tensor] = None,
) -> None:
    """Compile every verify launch variant serving can reach; changes no visible tensor."""
    raise AssertionError("mla::warmup_decode_verify has no kernel for this device")


@warmup_decode_verify.register_fake
def _(q, k_buffer, o, lse, req_to_token, has_real, qlens, attn_logits, sm_scale, page_size,
      k_scale=None):
    checks.check_warmup_decode_verify(q, k_buffer, o, lse, req_to_token, has_real, qlens,
                                      attn_logits, sm_scale, page_size, k_scale)


@warmup_decode_verify.register_kernel("cpu")
def _(*args):
    checks.check_warmup_decode_verify(*args)
    if interpreter_enabled():
        from .decode_verify.launch import warmup_decode_attention_fwd_verify

        warmup_decode_attention_fwd_verify(*args)
    # The reference path compiles nothing, so there is nothing to warm.


@warmup_decode_verify.register_kernel("cuda")
def _(*args):
    from .decode_verify.launch import warmup_decode_attention_fwd_verify

    warmup_decode_attention_fwd_verify(*args)


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

    context_attention_fwd(*args)


@torch.library.custom_op(
    f"{LIB}::context_attention", mutates_args=("o",), schema=SCHEMAS["context_attention"]
)
def context_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    b_start_loc: torch.Tensor,
    b_seq_len: torch.Tensor,
    max_input_len: int,
    is_causal: bool = True,
    softmax_scale: Optional[float] = None,
    sliding_window_q: Optional[int] = None,
    sliding_window_k: Optional[int] = None,
    sinks: Optional[torch.Tensor] = None,
) -> None:
    """Encoder attention on packed ``[total, H, D]`` sequences; writes ``o``."""
    raise AssertionError("mla::context_attention has no kernel for this device")


@context_attention.register_fake
def _(q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal=True, softmax_scale=None,
      sliding_window_q=None, sliding_window_k=None, sinks=None):
    checks.check_context_attention(q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal,
                                   softmax_scale, sliding_window_q, sliding_window_k, sinks)


@context_attention.register_kernel("cpu")
def _(*args):
    checks.check_context_attention(*args)
    if interpreter_enabled():
        _context_attention_triton(*args)
    else:
        _context_attention_cpu(*args)


@context_attention.register_kernel("cuda")
def _(*args):
    _context_attention_triton(*args)
