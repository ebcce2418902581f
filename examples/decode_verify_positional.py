"""Decode verify through the positional call (the argument order of ``mla::decode_verify``).

Runs as ``python examples/decode_verify_positional.py``. The caller picks the split cap and owns
the workspace; ``torch.ops.mla.warmup_decode_verify`` compiles every launch variant first, so
that on a GPU the call can be captured in a CUDA graph, which is then replayed on new contents.
On a CPU (fp32, small sizes) the call runs eagerly on the ops' CPU kernels. The result is
checked against the float64 reference; the exit status is 1 if it is off.
"""

import torch

import mla_ops
from example_step import DEVICE as device, DTYPE as dtype, LV as Lv
from example_step import check, max_error, new_contents, step_tensors
from mla_ops.reference import decode_verify_ref

B, qlen, H, page, max_seq_len = (32, 4, 16, 64, 4096) if device == "cuda" else (4, 2, 16, 16, 256)
sm_scale = 0.1352
# q [B*qlen, H, 576] (request b's token t: row b*qlen + t), one layer's cache [pages, page, 1, 576]
kv_cache, q, o, lse, block_table, seq_lens = step_tensors(B, B * qlen, H, page, max_seq_len)
real_seq_lens = torch.empty_like(seq_lens)


def write_new_step():
    new_contents(kv_cache, q, block_table, seq_lens, qlen, max_seq_len)
    real_seq_lens.copy_(seq_lens - torch.randint(0, qlen, (B,), device=device,
                                                 dtype=torch.int32))  # padded drafts


cfg = mla_ops.select_verify_config(B, qlen, H)
splits = mla_ops.verify_num_kv_splits(max_seq_len, B, qlen, H)  # follows cfg's BLOCK_H
attn_logits = torch.empty(B * qlen, H, splits, Lv + 1, device=device, dtype=torch.float32)


def verify():
    mla_ops.decode_attention_fwd_verify(
        q, kv_cache, kv_cache[..., :Lv], o, lse, block_table, seq_lens, real_seq_lens,
        qlen, attn_logits, splits, sm_scale, page,
        k_scale=None)  # scalar fp32 tensor for an fp8 cache


# Compile every variant the table can select for these heads and the qlens served (here one),
# with one split and several, with real_seq_lens (True); writes none of these tensors.
torch.ops.mla.warmup_decode_verify(q, kv_cache, o, lse, block_table, True,  # has_real
                                   [qlen], attn_logits, sm_scale, page, None)
if device == "cuda":
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # records the launch; computes nothing yet
        verify()
    write_new_step()
    graph.replay()
    torch.cuda.synchronize()
    print("captured the call in a CUDA graph and replayed it on new contents")
else:
    write_new_step()
    verify()
    print("CPU: no CUDA graphs, so the call ran eagerly")

ref_o, ref_lse = decode_verify_ref(q, kv_cache, Lv, block_table, seq_lens, real_seq_lens, qlen,
                                   sm_scale, page, compute_dtype=torch.float64)
check(f"positional verify B{B} q{qlen} H{H} (BLOCK_H {cfg['BLOCK_H']}, {splits} KV splits)",
      (max_error(o, ref_o), max_error(lse, ref_lse)))
