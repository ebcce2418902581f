"""Decode verify as an engine runs it: plan once per batch bucket, warm up, run per layer.

Runs as ``python examples/decode_verify_plan.py``. On a GPU: bf16, DeepSeek-like sizes, the
per-layer loop captured once in a CUDA graph and replayed after new contents are written into
the same tensors. On a CPU: fp32, small sizes, the same loop run eagerly by the ops' CPU kernels
(with ``TRITON_INTERPRET=1``, by the Triton kernels in Triton's interpreter). Every layer is
checked against the float64 reference; the exit status is 1 if a result is off.
"""

import torch

import mla_ops
from example_step import DEVICE as device, DTYPE as dtype, LV as Lv
from example_step import check, max_error, new_contents, step_tensors
from mla_ops.reference import decode_verify_ref

# One batch bucket: B requests verifying qlen draft tokens each, H heads, latent dims 512 + 64.
B, qlen, H, page, layers, max_seq_len = (
    (32, 4, 16, 64, 4, 4096) if device == "cuda" else (4, 2, 16, 16, 2, 256))
sm_scale = 0.1352

plan = mla_ops.plan_verify(B, qlen, H, max_seq_len=max_seq_len, dtype=dtype, kv_dtype=dtype,
                           device=device, page_size=page)
# Frozen in the plan: the launch config the table selects for this bucket, the split cap
# (from that config's own tile and split sizes), the workspace shape and the SM count.
plan.alloc_workspace()  # the plan owns its workspace

# A cross-layer cache [pages, page, layers, 576]; per layer, q [B*qlen, H, 576] (token t of
# request b at row b*qlen + t), o [B*qlen, H, 512] and lse [B*qlen, H] fp32.
kv_cache, q, o, lse, block_table, seq_lens = step_tensors(B, B * qlen, H, page, max_seq_len, layers)
real = torch.empty_like(seq_lens)  # fewer keys than seq_lens where drafts are padding


def write_new_step():
    """The engine's next step: new contents in the same tensors."""
    new_contents(kv_cache, q, block_table, seq_lens, qlen, max_seq_len)
    real.copy_(seq_lens - torch.randint(0, qlen, (B,), device=device, dtype=torch.int32))


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
    err_o = max(err_o, max_error(o[layer], ref_o))
    err_lse = max(err_lse, max_error(lse[layer], ref_lse))
check(f"decode verify B{B} q{qlen} H{H}", (err_o, err_lse))
