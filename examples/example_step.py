"""What the decode examples share and an engine does its own way: where they run, the step's
paged tensors with random contents, and the check against the float64 reference.

Not an example itself: ``decode_verify_plan.py``, ``decode_verify_positional.py`` and
``draft_trees.py`` import it (``python examples/<script>.py`` puts this folder on the path).
"""

import sys

import torch

torch.manual_seed(0)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# bf16 on a GPU; fp32 on a CPU, where the ops' CPU kernels (or Triton's interpreter) run.
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
LV, ROPE = 512, 64  # DeepSeek's latent and rope dims: q and the cache hold Lk = 576 per head


def step_tensors(B, rows, H, page, max_seq_len, layers=None):
    """The step's tensors, allocated once (a CUDA graph reads what they hold at each replay):
    ``kv_cache`` ``[pages, page, layers or 1, 576]``, ``q`` ``[rows, H, 576]``, ``o``
    ``[rows, H, 512]``, ``lse`` ``[rows, H]`` fp32 (each with a leading ``[layers]`` when
    ``layers`` is given), ``block_table`` ``[B, pages per request]`` and ``seq_lens`` ``[B]``
    int32. Their contents are not written here: ``new_contents`` does."""
    lead = () if layers is None else (layers,)
    pages_per_request = -(-max_seq_len // page)
    kv_cache = torch.empty(B * pages_per_request, page, layers or 1, LV + ROPE, device=DEVICE,
                           dtype=DTYPE)
    q = torch.empty(*lead, rows, H, LV + ROPE, device=DEVICE, dtype=DTYPE)
    o = torch.empty(*lead, rows, H, LV, device=DEVICE, dtype=DTYPE)
    lse = torch.empty(*lead, rows, H, device=DEVICE, dtype=torch.float32)
    block_table = torch.empty(B, pages_per_request, device=DEVICE, dtype=torch.int32)
    seq_lens = torch.empty(B, device=DEVICE, dtype=torch.int32)  # keys, the drafts included
    return kv_cache, q, o, lse, block_table, seq_lens


def new_contents(kv_cache, q, block_table, seq_lens, min_len, max_seq_len):
    """What the engine does between steps: new queries and cache contents, each request's pages
    drawn at random from the cache, lengths uniform in ``[min_len, max_seq_len]``."""
    q.normal_()
    kv_cache.normal_()
    block_table.copy_(torch.randperm(kv_cache.shape[0]).view(block_table.shape))
    seq_lens.copy_(torch.randint(min_len, max_seq_len + 1, seq_lens.shape))


def check(what, errors, extra=()):
    """Print ``what`` with the largest errors against the float64 reference and exit 1 if one
    is over its tolerance or an ``extra`` condition ``(label, bool)`` fails. ``errors``: the
    largest ``|o - ref|`` and ``|lse - ref|``."""
    err_o, err_lse = errors
    # o is stored in q's dtype: in bf16 (8 significant bits) its rounding and that of the
    # softmax weights reach ~1e-2 at |o| ~ 4; lse is fp32 either way.
    tol_o, tol_lse = (3e-2, 1e-3) if DTYPE == torch.bfloat16 else (1e-4, 1e-4)
    ok = err_o <= tol_o and err_lse <= tol_lse and all(good for _, good in extra)
    notes = "".join(f", {label}: {good}" for label, good in extra)
    print(f"{what} {str(DTYPE)[6:]} on {DEVICE}: max |o - ref| = {err_o:.2e} (tol {tol_o:g}), "
          f"max |lse - ref| = {err_lse:.2e} (tol {tol_lse:g}){notes}: {'OK' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)


def max_error(out, ref):
    return (out.double() - ref).abs().max().item()
