"""Encoder (ViT) attention on packed variable-length sequences: three images of different
token counts in one call, non-causal, H16 D80 (Qwen2.5-VL's vision heads).

Runs as ``python examples/encoder_attention.py``: bf16 on a GPU (the Triton kernels), fp32 on a
CPU (the ops' CPU kernel; with ``TRITON_INTERPRET=1``, the Triton kernel in Triton's
interpreter). Checked against the float64 reference; the exit status is 1 if it is off.
"""

import sys

import torch

import mla_ops
from mla_ops.reference import context_attention_ref

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if device == "cuda" else torch.float32

H, D = 16, 80
tokens = [1024, 3600, 576] if device == "cuda" else [64, 100, 36]  # one sequence per image
b_seq_len = torch.tensor(tokens, dtype=torch.int32, device=device)
b_start_loc = torch.cumsum(b_seq_len, 0, dtype=torch.int32) - b_seq_len  # first token of each
max_input_len = max(tokens)

q, k, v = (torch.randn(sum(tokens), H, D, device=device, dtype=dtype) for _ in range(3))
o = torch.empty_like(q)  # q, k, v: [total_tokens, H, D], the sequences packed one after another
mla_ops.context_attention_fwd(q, k, v, o, b_start_loc, b_seq_len, max_input_len,
                              is_causal=False)  # GQA, sliding windows and sinks supported

ref = context_attention_ref(q, k, v, b_start_loc, b_seq_len, is_causal=False,
                            compute_dtype=torch.float64)
err = (o.double() - ref).abs().max().item()
tol = 1e-2 if dtype == torch.bfloat16 else 1e-4  # bf16 keeps 8 significant bits; |o| < 1 here
ok = err <= tol
print(f"encoder attention {len(tokens)} images {tokens} H{H} D{D} {str(dtype)[6:]} on {device}: "
      f"max |o - ref| = {err:.2e} (tol {tol:g}): {'OK' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
