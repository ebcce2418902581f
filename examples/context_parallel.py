"""Decode context parallelism: one verify step over a KV cache sharded along the sequence.

Runs as ``torchrun --nproc-per-node 2 examples/context_parallel.py``: with a GPU per rank, NCCL,
bf16, the Triton kernels and the whole step captured in a CUDA graph; otherwise gloo on the CPU,
fp32, the ops' CPU kernels, eagerly. Each rank checks its heads of the merged result against
the single-device float64 reference over the whole cache; a rank exits 1 if they are off.
"""

import os
import sys

import torch
import torch.distributed as dist

from mla_ops.context_parallel import CPVerify, shard_kv_cache
from mla_ops.reference import decode_verify_ref

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
cuda = torch.cuda.device_count() >= world  # a GPU per rank, else every rank on the CPU
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
dist.init_process_group("nccl" if cuda else "gloo", **({"device_id": device} if cuda else {}))

torch.manual_seed(0)  # the same seed on every rank: the same global cache and queries
B, qlen, H, Lv, rope, page, interleave, sm_scale = 4, 2, 16, 512, 64, 64, 64, 0.1352
dtype = torch.bfloat16 if cuda else torch.float32
L = torch.tensor([1000, 5000, 64, 3], dtype=torch.int32, device=device)  # GLOBAL lengths
pages = -(-int(L.max()) // page)
cache = torch.randn(B * pages, page, 1, Lv + rope, device=device, dtype=dtype)
table = torch.randperm(B * pages, device=device).to(torch.int32).view(B, pages)
q = torch.randn(B * qlen, H, Lv + rope, device=device, dtype=dtype)

# This rank's shard (an engine writes it directly, with shard_positions as the slot mapping).
local_cache, local_table = shard_kv_cache(cache, table, L, page, world, rank, interleave)

step = CPVerify(None, max_batch=B, max_qlen=qlen, num_heads=H, Lv=Lv, Lk=Lv + rope,
                dtype=dtype, device=device, page_size=page, sm_scale=sm_scale,
                interleave=interleave, max_seq_len=8192, method="rs")
o, lse = step(q, local_cache, local_table, L, None, qlen)  # eager once: compiles, inits NCCL
# o: [B*qlen, H/world, Lv], lse: [B*qlen, H/world]: this rank's heads, merged over all ranks

if cuda:  # the whole step in a CUDA graph; replays read the same tensors' new contents
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # NCCL's watchdog thread
        o, lse = step(q, local_cache, local_table, L, None, qlen)
    q.normal_()  # a new step's queries, the same on every rank
    graph.replay()
    torch.cuda.synchronize()

# Check this rank's heads against the single-device reference over the whole cache.
ref_o, ref_lse = decode_verify_ref(q, cache, Lv, table, L, None, qlen, sm_scale, page,
                                   compute_dtype=torch.float64)
heads = slice(rank * H // world, (rank + 1) * H // world)
err_o = (o.double() - ref_o[:, heads]).abs().max().item()
err_lse = (lse.double() - ref_lse[:, heads]).abs().max().item()
# bf16 on the GPUs: o's rounding and the shares' bf16 sum; fp32 on the CPU.
tol_o, tol_lse = (3e-2, 1e-3) if dtype == torch.bfloat16 else (1e-4, 1e-4)
ok = err_o <= tol_o and err_lse <= tol_lse
print(f"rank {rank}/{world} ({'nccl' if cuda else 'gloo'}, {str(dtype)[6:]}): max |o - ref| = "
      f"{err_o:.2e} (tol {tol_o:g}), max |lse - ref| = {err_lse:.2e} (tol {tol_lse:g}): "
      f"{'OK' if ok else 'FAILED'}")
dist.destroy_process_group()
sys.exit(0 if ok else 1)
