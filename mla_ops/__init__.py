"""mla_ops: Triton attention kernels for LLM serving, registered as ``torch.ops.mla``.

Importing the package registers the ops (``mla::decode_verify``, ``mla::warmup_decode_verify``,
``mla::context_attention``). ``ARCHITECTURE.md`` maps the layers.
"""

from . import library  # noqa: F401  (registers torch.ops.mla)
from .checked import checked_mode, set_checked_mode
from .draft_trees import tree_mask_from_parents
from .decode_verify.launch import (
    _storage_view,
    decode_attention_fwd_verify,
    select_verify_config,
    warmup_decode_attention_fwd_verify,
)
from .decode_verify.plan import VerifyPlan, plan_verify
from .decode_verify.splits import verify_num_kv_splits, verify_row_blocks
from .prefill.launch import context_attention_fwd
from .reference import context_attention_ref, decode_verify_ref

__version__ = "0.2.0"

__all__ = [
    "plan_verify",
    "VerifyPlan",
    "decode_attention_fwd_verify",
    "select_verify_config",
    "verify_num_kv_splits",
    "verify_row_blocks",
    "warmup_decode_attention_fwd_verify",
    "_storage_view",
    "context_attention_fwd",
    "decode_verify_ref",
    "context_attention_ref",
    "checked_mode",
    "set_checked_mode",
    "tree_mask_from_parents",
]
