"""Decode verify through the positional call (the argument order of ``mla::decode_verify``).

Runs as ``python examples/decode_verify_positional.py``. The caller picks the split cap and owns
the workspace; ``torch.ops.mla.warmup_decode_verify`` compiles every launch variant first, so
that on a GPU the call can be captured in a CUDA graph, which is then replayed on new contents.
On a CPU (fp32, small sizes) the call runs eagerly on the ops' CPU kernels. The result is
checked against the float64 reference; the exit status is 1 if it is off.
"""

import sys

import torch

import mla_ops
from mla_ops.reference import decode_verify_ref

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if device == "cuda" else torch.float32

B, qlen, H, Lv, rope, page, max_seq_len = (
    (32, 4, 16, 512, 64, 64, 4096) if device == "cuda" else (4, 2, 16, 512, 64, 16, 256))
Lk, sm_scale = Lv + rope, 0.1352
pages_per_request = -(-max_seq_len // page)

kv_cache = torch.empty(B * pages_per_request, page, 1, Lk, device=device, dtype=dtype)
q = torch.empty(B * qlen, H, Lk, device=device, dtype=dtype)  # request b's token t: row b*qlen + t
o = torch.empty(B * qlen, H, Lv, device=device, dtype=dtype)
lse = torch.empty(B * qlen, H, device=device, dtype=torch.float32)
block_table = torch.empty(B, pages_per_request, device=device, dtype=torch.int32)
seq_lens = torch.empty(B, device=device, dtype=torch.int32)
real_seq_lens = torch.empty(B, device=device, dtype=torch.int32)


def write_new_step():
    q.normal_()
    kv_cache.normal_()
    block_table.copy_(torch.randperm(B * pages_per_request).view(B, -1))
    lens = torch.randint(qlen, max_seq_len + 1, (B,))
    seq_lens.copy_(lens)
    real_seq_lens.copy_(lens - torch.randint(0, qlen, (B,)))  # padded drafts


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
err_o = (o.double() - ref_o).abs().max().item()
err_lse = (lse.double() - ref_lse).abs().max().item()
# o is stored in q's dtype: in bf16 (8 significant bits) its rounding and that of the softmax
# weights reach ~1e-2 at |o| ~ 4; lse is fp32 either way.
tol_o, tol_lse = (3e-2, 1e-3) if dtype == torch.bfloat16 else (1e-4, 1e-4)
ok = err_o <= tol_o and err_lse <= tol_lse
print(f"positional verify B{B} q{qlen} H{H} {str(dtype)[6:]} on {device}, BLOCK_H "
      f"{cfg['BLOCK_H']}, {splits} KV splits: max |o - ref| = {err_o:.2e} (tol {tol_o:g}), "
      f"max |lse - ref| = {err_lse:.2e} (tol {tol_lse:g}): {'OK' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
