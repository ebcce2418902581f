"""merge_attn_states and rescale_attn_partial (mla_ops.merge) against the plain-PyTorch reference.

Without a GPU the kernels run in Triton's interpreter (fp16/fp32: the interpreter computes bf16
wrongly); ``@pytest.mark.gpu`` adds bf16, serving shapes and CUDA-graph capture. Inputs are
random (never zeros), outputs are NaN before every call, the partials of a ``-inf`` LSE hold NaN
(they must not be read), and accuracy follows the tests' one rule (``builders.assert_accurate``).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from builders import assert_accurate, interpret
from mla_ops.merge.launch import merge_attn_states, rescale_attn_partial
from mla_ops.reference import merge_attn_states_ref, rescale_attn_partial_ref

NEG_INF = float("-inf")


def make_parts(device, P, rows, heads, dim, dtype, *, dead=(), all_dead_rows=(), lse_scale=4.0,
               parts_dtype=None):
    """Random partials; ``dead``: (p, row, head) whose LSE is -inf; ``all_dead_rows``: rows whose
    every partial is -inf. The o of every dead partial is NaN."""
    o_parts = torch.randn(P, rows, heads, dim, device=device).to(parts_dtype or dtype)
    lse_parts = torch.randn(P, rows, heads, device=device) * lse_scale + 3.0
    for p, r, h in dead:
        lse_parts[p, r, h] = NEG_INF
    for r in all_dead_rows:
        lse_parts[:, r] = NEG_INF
    dead_mask = torch.isinf(lse_parts)
    o_parts[dead_mask] = float("nan")
    return o_parts, lse_parts


def outputs(device, rows, heads, dim, dtype):
    o = torch.full((rows, heads, dim), float("nan"), dtype=dtype, device=device)
    lse = torch.full((rows, heads), float("nan"), dtype=torch.float32, device=device)
    return o, lse


def check_merge(o_parts, lse_parts, o, lse, dtype):
    ref_o, ref_lse = merge_attn_states_ref(o_parts.double(), lse_parts.double(), torch.float64)
    pt_o, pt_lse = merge_attn_states_ref(o_parts, lse_parts.to(dtype) if dtype != torch.float32
                                         else lse_parts, dtype)
    assert_accurate("o", o, ref_o, pt_o, dtype)
    if lse is not None:
        assert_accurate("lse", lse, ref_lse, pt_lse, dtype)
        empty = torch.isinf(ref_lse)
        assert torch.equal(torch.isinf(lse), empty) and (lse[empty] < 0).all()
    empty = torch.isinf(ref_lse)
    assert (o[empty] == 0).all(), "rows with no key must get o = 0"


# --- interpreter (CI) and GPU ---------------------------------------------------------------

MERGE_CASES = [
    # id, P, rows, heads, dim, dtype, dead, all_dead_rows
    ("P2-fp32", 2, 5, 4, 64, torch.float32, [], []),
    ("P3-fp16-dead", 3, 6, 3, 40, torch.float16, [(0, 0, 0), (2, 1, 2), (1, 4, 1)], [2]),
    ("P1-fp32", 1, 3, 2, 16, torch.float32, [(0, 1, 1)], []),
    ("P5-fp32-D72", 5, 4, 2, 72, torch.float32, [(p, 0, 0) for p in range(4)], [3]),
    ("P20-fp16-two-p-blocks", 20, 2, 2, 32, torch.float16, [(p, 1, 0) for p in range(16)], []),
    ("P4-fp16-D512", 4, 2, 2, 512, torch.float16, [(3, 0, 1)], [1]),
]


@pytest.mark.parametrize("P,rows,heads,dim,dtype,dead,all_dead", [c[1:] for c in MERGE_CASES],
                         ids=[c[0] for c in MERGE_CASES])
def test_merge_matches_reference(device, P, rows, heads, dim, dtype, dead, all_dead):
    o_parts, lse_parts = make_parts(device, P, rows, heads, dim, dtype, dead=dead,
                                    all_dead_rows=all_dead)
    o, lse = outputs(device, rows, heads, dim, dtype)
    merge_attn_states(o_parts, lse_parts, o, lse)
    check_merge(o_parts, lse_parts, o, lse, dtype)


def test_merge_fp32_parts_into_fp16_and_no_lse(device):
    """Partials in fp32 (a workspace) merged into an fp16 o, the lse output left out."""
    o_parts, lse_parts = make_parts(device, 3, 4, 2, 32, torch.float16, parts_dtype=torch.float32,
                                    dead=[(1, 2, 1)], all_dead_rows=[0])
    o, _ = outputs(device, 4, 2, 32, torch.float16)
    merge_attn_states(o_parts, lse_parts, o, None)
    check_merge(o_parts, lse_parts, o, None, torch.float16)


def test_merge_strided_inputs(device):
    """Partials as a strided view (a [rows, P, H, D] buffer permuted) and a strided o."""
    P, rows, heads, dim = 3, 4, 4, 32
    big = torch.randn(rows, P, heads, dim + 8, device=device)
    o_parts = big[..., :dim].permute(1, 0, 2, 3)
    lse_parts = (torch.randn(rows, heads, P, device=device) * 3).permute(2, 0, 1)
    lse_parts[1, 2, 3] = NEG_INF
    o_wide = torch.full((rows, heads, dim + 16), float("nan"), device=device)
    o = o_wide[..., 8 : 8 + dim]
    lse = torch.full((heads, rows), float("nan"), device=device).t()
    merge_attn_states(o_parts, lse_parts, o, lse)
    check_merge(o_parts, lse_parts, o, lse, torch.float32)
    assert torch.isnan(o_wide[..., :8]).all() and torch.isnan(o_wide[..., 8 + dim :]).all()


def test_merge_extreme_lse(device):
    """LSEs far apart (1e4) or all equal: weights computed relative to the max, never overflow."""
    P, rows, heads, dim = 3, 3, 2, 16
    o_parts = torch.randn(P, rows, heads, dim, device=device)
    lse_parts = torch.tensor([[[1e4, -1e4], [0.0, 0.0], [88.0, -88.0]],
                              [[-1e4, 1e4], [0.0, 0.0], [89.0, -89.0]],
                              [[NEG_INF, 0.0], [0.0, 0.0], [90.0, NEG_INF]]], device=device)
    o, lse = outputs(device, rows, heads, dim, torch.float32)
    merge_attn_states(o_parts, lse_parts, o, lse)
    check_merge(o_parts, lse_parts, o, lse, torch.float32)


def test_merge_all_partials_empty(device):
    """Every partial -inf (and NaN o): lse -inf, o exactly 0."""
    o_parts = torch.full((3, 2, 2, 16), float("nan"), device=device)
    lse_parts = torch.full((3, 2, 2), NEG_INF, device=device)
    o, lse = outputs(device, 2, 2, 16, torch.float32)
    merge_attn_states(o_parts, lse_parts, o, lse)
    assert (o == 0).all() and torch.isneginf(lse).all()


def test_merge_zero_rows_is_a_no_op(device):
    o_parts, lse_parts = make_parts(device, 2, 0, 2, 16, torch.float32)
    o, lse = outputs(device, 0, 2, 16, torch.float32)
    merge_attn_states(o_parts, lse_parts, o, lse)


@pytest.mark.parametrize("dtype,out_dtype,chunks", [
    (torch.float32, torch.float32, 1), (torch.float16, torch.float16, 2),
    (torch.float16, torch.float32, 4),
], ids=["fp32", "fp16-chunked", "fp16-into-fp32-chunked"])
def test_rescale_shares_sum_to_the_merge(device, dtype, out_dtype, chunks):
    """Each partial's share against the reference; the shares summed in float64 give the
    merge; the chunked output (a reduce-scatter's input) is laid out by head chunk."""
    P, rows, heads, dim = 3, 5, 4, 48
    o_parts, lse_parts = make_parts(device, P, rows, heads, dim, dtype,
                                    dead=[(0, 0, 0), (2, 3, 1)], all_dead_rows=[4])
    total = torch.zeros(rows, heads, dim, dtype=torch.float64, device=device)
    for p in range(P):
        send = torch.full((chunks, rows, heads // chunks, dim), float("nan"), dtype=out_dtype,
                          device=device)
        lse = torch.full((rows, heads), float("nan"), device=device)
        rescale_attn_partial(o_parts[p], lse_parts, p, send.permute(1, 0, 2, 3), lse)
        share = send.permute(1, 0, 2, 3).reshape(rows, heads, dim)
        ref_share, ref_lse = rescale_attn_partial_ref(o_parts[p].double(), lse_parts.double(), p,
                                                      torch.float64)
        pt_share, _ = rescale_attn_partial_ref(o_parts[p], lse_parts, p, dtype)
        assert_accurate(f"share {p}", share, ref_share, pt_share, out_dtype)
        assert_accurate("lse", lse, ref_lse, ref_lse.float(), torch.float32)
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
        total += share.double()
    ref_o, _ = merge_attn_states_ref(o_parts.double(), lse_parts.double(), torch.float64)
    tol = 4 * (1e-3 if torch.float16 in (dtype, out_dtype) else 1e-6)
    torch.testing.assert_close(total, ref_o, atol=tol, rtol=tol)


def test_rescale_in_place(device):
    """o_out may be o_part itself."""
    o_parts, lse_parts = make_parts(device, 2, 3, 2, 32, torch.float32, dead=[(1, 0, 0)])
    o = o_parts[1].clone()
    rescale_attn_partial(o, lse_parts, 1, o, None)
    ref, _ = rescale_attn_partial_ref(o_parts[1], lse_parts, 1)
    torch.testing.assert_close(o, ref, atol=1e-6, rtol=1e-6)


# --- +inf: an empty partial, as in vLLM's merge, on every path ------------------------------

POS_INF = float("inf")

# id, P, rows, heads, dim, dtype, {(p, row, head): LSE}; every other LSE is random and finite
INF_CASES = [
    ("one-partial", 2, 3, 2, 32, torch.float32, {(1, 0, 0): POS_INF, (0, 2, 1): POS_INF}),
    ("all-partials", 3, 2, 2, 40, torch.float16,
     {(p, 1, h): POS_INF for p in range(3) for h in range(2)}),
    ("mixed-with-neg-inf", 4, 3, 2, 32, torch.float16,
     {(0, 0, 0): POS_INF, (1, 0, 0): NEG_INF,  # two empty, two real partials
      (0, 1, 1): POS_INF, (1, 1, 1): NEG_INF, (2, 1, 1): POS_INF, (3, 1, 1): NEG_INF,  # none
      (3, 2, 0): POS_INF, (2, 2, 1): NEG_INF}),
]


def _inf_parts(device, P, rows, heads, dim, dtype, lses):
    """Random partials with the given LSEs set; the o of every infinite one is NaN (an empty
    partial's o must not be read). Returns them and the same LSEs with +inf written as -inf,
    which is what +inf must mean."""
    o_parts, lse_parts = make_parts(device, P, rows, heads, dim, dtype)
    for at, value in lses.items():
        lse_parts[at] = value
    o_parts[torch.isinf(lse_parts)] = float("nan")
    return o_parts, lse_parts, lse_parts.masked_fill(torch.isposinf(lse_parts), NEG_INF)


def _paths(device):
    """Every path of one op: the launcher (Triton), the op on the device's kernel and, on a CPU,
    the op's plain-PyTorch kernel (the interpreter off)."""
    paths = [("function", None, False), ("op", True if device == "cpu" else None, True)]
    return paths + ([("op-cpu-kernel", False, True)] if device == "cpu" else [])


def _kernel(triton_kernel):
    """The op's CPU kernel as the path asks (None: whatever the device runs)."""
    return contextlib.nullcontext() if triton_kernel is None else interpret(triton_kernel)


@pytest.mark.parametrize("P,rows,heads,dim,dtype,lses", [c[1:] for c in INF_CASES],
                         ids=[c[0] for c in INF_CASES])
def test_merge_pos_inf_lse_is_an_empty_partial(device, P, rows, heads, dim, dtype, lses):
    """``+inf`` merges exactly as ``-inf`` (the partial is dropped, its o not read) on the
    launcher, the op and the op's CPU kernel, and in the reference; all paths agree."""
    o_parts, lse_parts, as_empty = _inf_parts(device, P, rows, heads, dim, dtype, lses)
    ref_o, ref_lse = merge_attn_states_ref(o_parts, lse_parts)
    want_o, want_lse = merge_attn_states_ref(o_parts, as_empty)
    assert torch.equal(ref_lse, want_lse) and torch.equal(ref_o, want_o), "reference"
    results = {}
    for name, triton_kernel, via_op in _paths(device):
        o, lse = outputs(device, rows, heads, dim, dtype)
        with _kernel(triton_kernel):
            (torch.ops.mla.merge_attn_states if via_op else merge_attn_states)(
                o_parts, lse_parts, o, lse)
        check_merge(o_parts, as_empty, o, lse, dtype)  # against the -inf input's float64 merge
        results[name] = (o, lse)
    first_o, first_lse = results["function"]
    for name, (o, lse) in results.items():
        torch.testing.assert_close(o, first_o, msg=lambda m: f"{name} vs function: {m}")
        torch.testing.assert_close(lse, first_lse, msg=lambda m: f"{name} vs function: {m}")


@pytest.mark.parametrize("P,rows,heads,dim,dtype,lses", [c[1:] for c in INF_CASES],
                         ids=[c[0] for c in INF_CASES])
def test_rescale_pos_inf_lse_is_an_empty_partial(device, P, rows, heads, dim, dtype, lses):
    """Each partial's share with ``+inf`` LSEs is its share with ``-inf`` in their place (0 for
    the partial itself, never NaN), on every path; the shares sum to the merge."""
    o_parts, lse_parts, as_empty = _inf_parts(device, P, rows, heads, dim, dtype, lses)
    merged, _ = merge_attn_states_ref(o_parts.double(), as_empty.double(), torch.float64)
    for name, triton_kernel, via_op in _paths(device):
        total = torch.zeros(rows, heads, dim, dtype=torch.float64, device=device)
        for p in range(P):
            ref_share, ref_lse = rescale_attn_partial_ref(o_parts[p].double(), as_empty.double(),
                                                          p, torch.float64)
            pt_share, pt_lse = rescale_attn_partial_ref(o_parts[p], lse_parts, p, dtype)
            want_share, want_lse = rescale_attn_partial_ref(o_parts[p], as_empty, p, dtype)
            assert torch.equal(pt_share, want_share) and torch.equal(pt_lse, want_lse), \
                f"reference, partial {p}"
            share = torch.full((rows, heads, dim), float("nan"), dtype=dtype, device=device)
            lse = torch.full((rows, heads), float("nan"), device=device)
            with _kernel(triton_kernel):
                (torch.ops.mla.rescale_attn_partial if via_op else rescale_attn_partial)(
                    o_parts[p], lse_parts, p, share, lse)
            assert_accurate(f"{name}: share {p}", share, ref_share, pt_share, dtype)
            assert_accurate(f"{name}: lse", lse, ref_lse, ref_lse.float(), torch.float32)
            assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)) and (lse[torch.isinf(lse)]
                                                                            < 0).all(), name
            assert (share[torch.isinf(as_empty[p])] == 0).all(), f"{name}: empty partial {p}"
            total += share.double()
        tol = 4 * (1e-3 if dtype == torch.float16 else 1e-6)
        torch.testing.assert_close(total, merged, atol=tol, rtol=tol,
                                   msg=lambda m: f"{name}: shares summed: {m}")


# --- bad input names the argument -----------------------------------------------------------


def _op_kernels(device):
    """What a bad argument must be refused by besides the function: the op on the device's
    kernel, and on a CPU also the op's plain-PyTorch kernel (the interpreter off)."""
    return [True] + ([False] if device == "cpu" else [])


def _merge_args(device):
    o_parts, lse_parts = make_parts(device, 2, 3, 2, 16, torch.float16)
    o, lse = outputs(device, 3, 2, 16, torch.float16)
    return dict(o_parts=o_parts, lse_parts=lse_parts, o=o, lse=lse)


MERGE_BAD = [
    ("o_parts-3d", ValueError, "o_parts:", lambda a: a["o_parts"][0]),
    ("o_parts-bf16-into-fp16", TypeError, "o_parts:", lambda a: a["o_parts"].bfloat16()),
    ("o_parts-not-a-tensor", TypeError, "o_parts:", lambda a: [a["o_parts"]]),
    ("o_parts-zero-parts", ValueError, "o_parts:", lambda a: a["o_parts"][:0]),
    ("lse_parts-fp16", TypeError, "lse_parts:", lambda a: a["lse_parts"].half()),
    ("lse_parts-wrong-P", ValueError, "lse_parts:", lambda a: a["lse_parts"][:1]),
    ("o-wrong-heads", ValueError, "o:", lambda a: a["o"][:, :1]),
    ("o-int", TypeError, "o:", lambda a: a["o"].int()),
    ("o-inner-stride", ValueError, "o:", lambda a: a["o"].transpose(1, 2).contiguous().transpose(1, 2)),
    ("lse-wrong-shape", ValueError, "lse:", lambda a: a["lse"][:2]),
    ("lse-fp64", TypeError, "lse:", lambda a: a["lse"].double()),
    ("lse-other-device", ValueError, "lse:", lambda a: a["lse"].to("meta")),
]


@pytest.mark.parametrize("exc,name,change", [b[1:] for b in MERGE_BAD], ids=[b[0] for b in MERGE_BAD])
def test_merge_bad_input_names_the_argument(device, exc, name, change):
    args = _merge_args(device)
    arg = name.rstrip(":")
    args[arg] = change(args)
    before = args["o"].clone() if arg != "o" else None
    with pytest.raises(exc, match=f"^{name}"):
        merge_attn_states(**args)
    if isinstance(args[arg], torch.Tensor):  # (the op's schema refuses other types itself)
        for triton_kernel in _op_kernels(device):  # the op: its kernel runs the spec's check
            with interpret(triton_kernel if device == "cpu" else False):
                with pytest.raises(exc, match=f"^{name}"):
                    torch.ops.mla.merge_attn_states(**args)
    if before is not None:  # refused before any launch: o untouched (still NaN)
        assert torch.isnan(args["o"]).all()


RESCALE_BAD = [
    ("part-out-of-range", ValueError, "part:", dict(part=2)),
    ("part-float", TypeError, "part:", dict(part=1.0)),
    ("o_out-chunks-not-dividing", ValueError, "o_out:",
     dict(o_out=lambda d: torch.empty(3, 3, 1, 16, device=d))),
    ("o_out-wrong-shape", ValueError, "o_out:", dict(o_out=lambda d: torch.empty(3, 2, 8, device=d))),
    ("lse_parts-wrong-rows", ValueError, "lse_parts:",
     dict(lse_parts=lambda d: torch.zeros(2, 4, 2, device=d))),
    ("lse_out-fp16", TypeError, "lse_out:", dict(lse_out=lambda d: torch.empty(3, 2, device=d).half())),
]


@pytest.mark.parametrize("exc,name,change", [b[1:] for b in RESCALE_BAD], ids=[b[0] for b in RESCALE_BAD])
def test_rescale_bad_input_names_the_argument(device, exc, name, change):
    o_parts, lse_parts = make_parts(device, 2, 3, 2, 16, torch.float32)
    args = dict(o_part=o_parts[0], lse_parts=lse_parts, part=0,
                o_out=torch.empty(3, 2, 16, device=device), lse_out=None)
    for k, v in change.items():
        args[k] = v(device) if callable(v) else v
    with pytest.raises(exc, match=f"^{name}"):
        rescale_attn_partial(**args)
    if all(isinstance(args[k], torch.Tensor) or k == "part" and isinstance(args[k], int)
           for k in change):  # (the op's schema refuses other types itself)
        for triton_kernel in _op_kernels(device):
            with interpret(triton_kernel if device == "cpu" else False):
                with pytest.raises(exc, match=f"^{name}"):
                    torch.ops.mla.rescale_attn_partial(**args)


# --- GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("P,rows,heads", [(2, 128, 16), (8, 64, 128), (3, 1, 16)],
                         ids=["P2-B64q2-H16", "P8-H128", "P3-one-row"])
def test_gpu_merge_serving_shapes(device, dtype, P, rows, heads):
    dim = 512
    dead = [(p, r, h) for p in range(P) for r in range(0, rows, 7) for h in range(0, heads, 5)
            if (p + r + h) % 3 == 0]
    o_parts, lse_parts = make_parts(device, P, rows, heads, dim, dtype, dead=dead,
                                    all_dead_rows=[rows // 2])
    o, lse = outputs(device, rows, heads, dim, dtype)
    merge_attn_states(o_parts, lse_parts, o, lse)
    check_merge(o_parts, lse_parts, o, lse, dtype)
    share = torch.full((rows, heads, dim), float("nan"), dtype=dtype, device=device)
    rescale_attn_partial(o_parts[P - 1], lse_parts, P - 1, share, None)
    ref, _ = rescale_attn_partial_ref(o_parts[P - 1].double(), lse_parts.double(), P - 1, torch.float64)
    pt, _ = rescale_attn_partial_ref(o_parts[P - 1], lse_parts, P - 1, dtype)
    assert_accurate("share", share, ref, pt, dtype)


@pytest.mark.gpu
def test_gpu_merge_and_rescale_capture_and_replay(device):
    """Both kernels captured in one CUDA graph replay right on new partials (no allocation or
    synchronisation inside)."""
    P, rows, heads, dim, dtype = 2, 32, 16, 512, torch.bfloat16
    o_parts, lse_parts = make_parts(device, P, rows, heads, dim, dtype)
    o, lse = outputs(device, rows, heads, dim, dtype)
    send = torch.empty(2, rows, heads // 2, dim, dtype=dtype, device=device)
    lse2 = torch.empty(rows, heads, device=device)

    def step():
        merge_attn_states(o_parts, lse_parts, o, lse)
        rescale_attn_partial(o_parts[1], lse_parts, 1, send.permute(1, 0, 2, 3), lse2)

    step()  # compiles outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for trial in range(3):
        new_o, new_lse = make_parts(device, P, rows, heads, dim, dtype,
                                    dead=[(trial % P, trial, trial)], all_dead_rows=[trial + 3])
        o_parts.copy_(new_o)
        lse_parts.copy_(new_lse)
        for t in (o, lse, send, lse2):
            t.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check_merge(o_parts, lse_parts, o, lse, dtype)
        ref, _ = rescale_attn_partial_ref(o_parts[1].double(), lse_parts.double(), 1, torch.float64)
        pt, _ = rescale_attn_partial_ref(o_parts[1], lse_parts, 1, dtype)
        assert_accurate("share", send.permute(1, 0, 2, 3).reshape(rows, heads, dim), ref, pt, dtype)
