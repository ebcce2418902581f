"""Decode verify as an engine runs it: plan once per batch bucket, warm up, run per layer.

Runs as ``python examples/decode_verify_plan.py``. On a GPU: bf16, DeepSeek-like sizes, the
per-layer loop captured once in a CUDA graph and replayed after new contents are written into
the same tensors. On a CPU: fp32, small sizes, the same loop run eagerly by the ops' CPU kernels
(with ``TRITON_INTERPRET=1``, by the Triton kernels in Triton's interpreter). Every layer is
checked against the float64 reference; the exit status is 1 if a result is off.
"""

import sys

import torch

import mla_ops
from mla_ops.reference import decode_verify_ref

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if device == "cuda" else torch.float32

# One batch bucket: B requests verifying qlen draft tokens each, H heads, latent dims 512 + 64.
B, qlen, H, Lv, rope, page, layers, max_seq_len = (
    (32, 4, 16, 512, 64, 64, 4, 4096) if device == "cuda" else (4, 2, 16, 512, 64, 16, 2, 256))
Lk, sm_scale = Lv + rope, 0.1352
pages_per_request = -(-max_seq_len // page)

plan = mla_ops.plan_verify(B, qlen, H, max_seq_len=max_seq_len, dtype=dtype, kv_dtype=dtype,
                           device=device, page_size=page)
# Frozen in the plan: the launch config the table selects for this bucket, the split cap
# (from that config's own tile and split sizes), the workspace shape and the SM count.
plan.alloc_workspace()  # the plan owns its workspace

# The step's tensors, allocated once (a CUDA graph reads what they hold at each replay):
# a cross-layer cache [pages, page, layers, 576]; per layer, q [B*qlen, H, 576] (token t of
# request b at row b*qlen + t), o [B*qlen, H, 512] and lse [B*qlen, H] fp32.
kv_cache = torch.empty(B * pages_per_request, page, layers, Lk, device=device, dtype=dtype)
q = torch.empty(layers, B * qlen, H, Lk, device=device, dtype=dtype)
o = torch.empty(layers, B * qlen, H, Lv, device=device, dtype=dtype)
lse = torch.empty(layers, B * qlen, H, device=device, dtype=torch.float32)
block_table = torch.empty(B, pages_per_request, device=device, dtype=torch.int32)
seq_lens = torch.empty(B, device=device, dtype=torch.int32)  # keys, the draft tokens included
real = torch.empty(B, device=device, dtype=torch.int32)  # fewer where drafts are padding


def write_new_step():
    """What the engine does between steps: new queries and cache contents, lengths, pages."""
    q.normal_()
    kv_cache.normal_()
    block_table.copy_(torch.randperm(B * pages_per_request).view(B, -1))
    lens = torch.randint(qlen, max_seq_len + 1, (B,))
    seq_lens.copy_(lens)
    real.copy_(lens - torch.randint(0, qlen, (B,)))


def step():
    for layer in range(layers):  # each layer's view of the cross-layer cache
        plan.run(q[layer], kv_cache[:, :, layer:layer + 1], o[layer], lse[layer],
                 block_table, seq_lens,  # [B, max_pages] int32, [B] int32
                 real_seq_lens=real,  # keyword-only: seq_lens and real_seq_lens never swap
                 sm_scale=sm_scale)


# Compile every variant run() can launch (strides from these tensors; writes none of them).
plan.warmup(q[0], kv_cache[:, :, 0:1], o[0], lse[0], block_table, sm_scale=sm_scale)
if device == "cuda":
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # records the launches of every layer; computes nothing yet
        step()
    write_new_step()  # the engine's next step: new contents in the captured tensors
    graph.replay()
    torch.cuda.synchronize()
    print(f"captured {layers} layers in one CUDA graph and replayed it on new contents")
else:
    write_new_step()
    step()
    interpreted = mla_ops.platform.interpreter_enabled()
    kernels = ("the Triton kernels in Triton's interpreter" if interpreted
               else "the ops' CPU kernels")
    print(f"CPU: no CUDA graphs, so the same {layers}-layer loop ran eagerly, on {kernels}")

err_o = err_lse = 0.0
for layer in range(layers):
    ref_o, ref_lse = decode_verify_ref(q[layer], kv_cache[:, :, layer:layer + 1], Lv, block_table,
                                       seq_lens, real, qlen, sm_scale, page,
                                       compute_dtype=torch.float64)
    err_o = max(err_o, (o[layer].double() - ref_o).abs().max().item())
    err_lse = max(err_lse, (lse[layer].double() - ref_lse).abs().max().item())
# o is stored in q's dtype: in bf16 (8 significant bits) its rounding and that of the softmax
# weights reach ~1e-2 at |o| ~ 4; lse is fp32 either way.
tol_o, tol_lse = (3e-2, 1e-3) if dtype == torch.bfloat16 else (1e-4, 1e-4)
ok = err_o <= tol_o and err_lse <= tol_lse
print(f"decode verify B{B} q{qlen} H{H} {str(dtype)[6:]} on {device}: max |o - ref| = {err_o:.2e} "
      f"(tol {tol_o:g}), max |lse - ref| = {err_lse:.2e} (tol {tol_lse:g}): "
      f"{'OK' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
