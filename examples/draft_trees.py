"""Decode verify of EAGLE draft trees, with a different draft count per request.

Runs as ``python examples/draft_trees.py``. A plan made with ``varlen=True`` takes
``qo_indptr`` (request b's rows are ``q[qo_indptr[b]:qo_indptr[b+1]]``) and ``tree_mask`` (bit j
of a row: it sees draft token j of its request), built here from each request's parent array.
On a GPU the step is captured in a CUDA graph once and replayed on new trees, counts and
contents; on a CPU (fp32) it runs eagerly on the ops' CPU kernels. Checked against the float64
reference; the exit status is 1 if it is off.
"""

import torch

import mla_ops
from example_step import DEVICE as device, DTYPE as dtype, LV as Lv
from example_step import check, max_error, new_contents, step_tensors
from mla_ops.reference import decode_verify_ref

B, max_drafts, H, page, max_seq_len = (
    (32, 8, 16, 64, 4096) if device == "cuda" else (3, 8, 16, 16, 256))
sm_scale = 0.1352
rows = B * max_drafts  # static: a captured graph keeps its shapes; unused rows are not written
kv_cache, q, o, lse, block_table, seq_lens = step_tensors(B, rows, H, page, max_seq_len)
qo_indptr = torch.empty(B + 1, device=device, dtype=torch.int32)
tree_mask = torch.empty(rows, device=device, dtype=torch.int64)


def draft_trees(step):
    """Each request's drafts as a parent array (-1: continues the verified prefix): an EAGLE
    tree of 8 (topk 2 x depth 3 + root), a chain of 3, none (not speculating this step)."""
    eagle8 = [-1, 0, 0, 1, 1, 2, 3, 4]  # token i continues token parents[i]
    shapes = (eagle8, [-1, 0, 1], [])
    return [shapes[(b + step) % 3] for b in range(B)]


def write_new_step(step):
    parents = draft_trees(step)
    counts = torch.tensor([len(p) for p in parents])
    qo_indptr.copy_(torch.cat([torch.zeros(1), counts.cumsum(0)]))  # request b's rows
    tree_mask.copy_(mla_ops.tree_mask_from_parents(parents, rows=rows))  # bit j: sees draft j
    # Each request's length includes its drafts, already written to the cache (its last keys).
    new_contents(kv_cache, q, block_table, seq_lens, max_drafts, max_seq_len)
    o.fill_(float("nan"))


plan = mla_ops.plan_verify(B, max_drafts, H, max_seq_len=max_seq_len, dtype=dtype,
                           device=device, page_size=page, varlen=True)  # run takes qo_indptr
plan.alloc_workspace()


def step():
    plan.run(q, kv_cache, o, lse, block_table, seq_lens,
             qo_indptr=qo_indptr,  # [B+1] int32 row offsets (ragged draft counts)
             tree_mask=tree_mask,  # [rows] int64, or None for each request's causal chain
             sm_scale=sm_scale)


write_new_step(0)
if device == "cuda":
    plan.warmup(q, kv_cache, o, lse, block_table, sm_scale=sm_scale)  # varlen: trees included
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    write_new_step(1)  # other trees and counts, new contents: the same captured graph
    graph.replay()
    torch.cuda.synchronize()
    print("captured the step in a CUDA graph and replayed it on new trees and draft counts")
else:
    step()
    print("CPU: no CUDA graphs, so the step ran eagerly")

used = int(qo_indptr[-1])  # rows from qo_indptr[B] on belong to no request
ref_o, ref_lse = decode_verify_ref(q, kv_cache, Lv, block_table, seq_lens, None, max_drafts,
                                   sm_scale, page, compute_dtype=torch.float64,
                                   qo_indptr=qo_indptr, tree_mask=tree_mask)
untouched = bool(o[used:].isnan().all())
check(f"draft-tree verify B{B} (up to {max_drafts} drafts, {used} rows) H{H}",
      (max_error(o[:used], ref_o[:used]), max_error(lse[:used], ref_lse[:used])),
      extra=[("rows past qo_indptr[B] untouched", untouched)])
