"""The ops inside ``torch.compile(fullgraph=True)``: an encoder attention module and a decode
verify step, each traced with no graph break.

Runs as ``python examples/compile.py``: bf16 on a GPU (the Triton kernels), fp32 on a CPU (the
ops' CPU kernels; inductor needs a C++ compiler there). The compiled results must match the
float64 references, and on a GPU equal the eager calls' bit for bit; the exit status is 1 if they
do not. (On a CPU the ops' kernels are plain PyTorch, whose matmuls CI has seen take another path
from one compiled call to the next, 3.27e-05 off against eager's 9.30e-07, so there the eager
and compiled results must each match the reference, and whether they are equal is printed.)
"""

import sys

import torch

import mla_ops
from mla_ops.reference import context_attention_ref, decode_verify_ref

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if device == "cuda" else torch.float32


# --- encoder attention: the ops mutate caller-allocated outputs and return nothing --------------
class Attention(torch.nn.Module):
    def forward(self, q, k, v, starts, lens, max_len: int):
        o = torch.empty_like(q)
        torch.ops.mla.context_attention(q, k, v, o, starts, lens, max_len, False)
        return o


model = torch.compile(Attention(), fullgraph=True)  # or mode="reduce-overhead" on a GPU

H, D, tokens = 16, 72, [49, 81]  # two images of 7x7 and 9x9 patches
lens = torch.tensor(tokens, dtype=torch.int32, device=device)
starts = torch.cumsum(lens, 0, dtype=torch.int32) - lens
q, k, v = (torch.randn(sum(tokens), H, D, device=device, dtype=dtype) for _ in range(3))
o = model(q, k, v, starts, lens, max(tokens))
o_eager = Attention()(q, k, v, starts, lens, max(tokens))
ref = context_attention_ref(q, k, v, starts, lens, is_causal=False, compute_dtype=torch.float64)
err_enc = (o.double() - ref).abs().max().item()
same_enc = torch.equal(o, o_eager)

# --- decode verify: plan.run calls torch.ops.mla.decode_verify and traces the same way -----------
B, qlen, page, L = 2, 2, 16, 100
plan = mla_ops.plan_verify(B, qlen, H, max_seq_len=L, dtype=dtype, device=device, page_size=page)
plan.alloc_workspace()  # outside the compiled function: it allocates once


def verify(q, kv_cache, block_table, seq_lens):
    o = q.new_empty(q.shape[0], H, 512)
    lse = q.new_empty(q.shape[0], H, dtype=torch.float32)
    plan.run(q, kv_cache, o, lse, block_table, seq_lens, sm_scale=0.1352)
    return o, lse


compiled_verify = torch.compile(verify, fullgraph=True)

pages = -(-L // page)
kv_cache = torch.randn(B * pages, page, 1, 576, device=device, dtype=dtype)
block_table = torch.randperm(B * pages, device=device).to(torch.int32).view(B, pages)
seq_lens = torch.tensor([L, 37], dtype=torch.int32, device=device)
qv = torch.randn(B * qlen, H, 576, device=device, dtype=dtype)
o_dec, lse_dec = compiled_verify(qv, kv_cache, block_table, seq_lens)
o_dec_eager, lse_dec_eager = verify(qv, kv_cache, block_table, seq_lens)
ref_o, ref_lse = decode_verify_ref(qv, kv_cache, 512, block_table, seq_lens, None, qlen, 0.1352,
                                   page, compute_dtype=torch.float64)
err_dec = max((o_dec.double() - ref_o).abs().max().item(),
              (lse_dec.double() - ref_lse).abs().max().item())
same_dec = torch.equal(o_dec, o_dec_eager) and torch.equal(lse_dec, lse_dec_eager)

tol = 3e-2 if dtype == torch.bfloat16 else 1e-4  # bf16: a few of its ulps at |o| of a few units
err_enc_eager = (o_eager.double() - ref).abs().max().item()
err_dec_eager = max((o_dec_eager.double() - ref_o).abs().max().item(),
                    (lse_dec_eager.double() - ref_lse).abs().max().item())
ok = max(err_enc, err_dec, err_enc_eager, err_dec_eager) <= tol and (device == "cpu" or (same_enc and same_dec))
print(f"torch.compile(fullgraph=True) on {device}, {str(dtype)[6:]}: encoder max |o - ref| = "
      f"{err_enc:.2e}, decode verify max |o, lse - ref| = {err_dec:.2e} (tol {tol:g}); equal to "
      f"eager: {same_enc and same_dec}: {'OK' if ok else 'FAILED'}")
if not ok:  # what a failure needs to be diagnosed from a CI log
    err_eager = err_enc_eager
    where = (o.double() - ref).abs().flatten().argmax().item()
    print(f"encoder: eager max |o - ref| = {err_eager:.2e}, max |compiled - eager| = "
          f"{(o - o_eager).abs().max().item():.2e} at flat index {where}; a second compiled call "
          f"equals the first: {torch.equal(model(q, k, v, starts, lens, max(tokens)), o)}; "
          f"threads {torch.get_num_threads()}; mla_ops._C: {mla_ops.library.EXTENSION_STATUS}",
          file=sys.stderr)
sys.exit(0 if ok else 1)
