"""Encoder (ViT) attention with a split head dim: ``kernels`` (jit only), ``launch`` (checks,
grid, launch, capture harness), ``configs`` (per-architecture launch tables)."""

from .launch import context_attention_fwd, head_dim_split, head_stride_aligned_8

__all__ = ["context_attention_fwd", "head_dim_split", "head_stride_aligned_8"]
