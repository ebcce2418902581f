"""The plain-PyTorch references against naive per-row loops (CPU, float64).

The references are the oracle of every kernel test (and the ops' CPU kernels), so they are
checked here against the most literal reading of their docstrings: one query row at a time,
one key at a time. Inputs from ``builders``.
"""

import math

import pytest
import torch

from mla_ops.reference import context_attention_op_ref, context_attention_ref, decode_verify_op_ref

from builders import FP8, decode_case, encoder_case


def _naive_verify(q, k_buffer, Lv, req_to_token, seq_lens, real_seq_lens, qlen, sm_scale,
                  page_size, k_scale):
    rows, H, Lk = q.shape
    flat = k_buffer.reshape(-1, page_size, Lk) if k_buffer.dim() == 4 else k_buffer.reshape(-1, page_size, Lk)
    o = torch.zeros(rows, H, Lv, dtype=torch.float64)
    lse = torch.full((rows, H), -math.inf, dtype=torch.float64)
    for r in range(rows):
        b, t = divmod(r, qlen)
        L = int(seq_lens[b])
        L_real = int(real_seq_lens[b]) if real_seq_lens is not None else L
        lim = max(min(L - qlen + 1 + t, L_real), 0)
        keys = []
        for n in range(lim):
            page = int(req_to_token[b, n // page_size])
            keys.append(flat[page, n % page_size].double() * k_scale)
        if not keys:
            continue
        kv = torch.stack(keys)
        for h in range(H):
            s = kv @ q[r, h].double() * sm_scale
            m = s.max()
            p = torch.exp(s - m)
            lse[r, h] = m + torch.log(p.sum())
            o[r, h] = (p / p.sum()) @ kv[:, :Lv]
    return o, lse


def _case(B, H, qlen, lens, page_size, Lv=32, rope=16, fp8=False, four_d=True, real=None):
    return decode_case("cpu", batch=B, heads=H, qlen=qlen, lens=lens, page=page_size, Lv=Lv,
                       rope=rope, real=real, cache_dtype=FP8 if fp8 else None,
                       layout="4d" if four_d else "3d", score_std=2.0)


VERIFY_CASES = [
    dict(id="B2-H3-q2-p16-4d", B=2, H=3, qlen=2, lens=[37, 5], page_size=16),
    dict(id="B2-H2-q3-p1-3d", B=2, H=2, qlen=3, lens=[9, 4], page_size=1, four_d=False),
    dict(id="B3-H2-q4-p64-real", B=3, H=2, qlen=4, lens=[70, 6, 3], page_size=64, real=[68, 0, 2]),
    dict(id="B2-H2-q2-p16-fp8", B=2, H=2, qlen=2, lens=[20, 33], page_size=16, fp8=True),
    dict(id="B2-H1-q4-p16-short", B=2, H=1, qlen=4, lens=[2, 0], page_size=16),
]


@pytest.mark.parametrize("case", VERIFY_CASES, ids=[c["id"] for c in VERIFY_CASES])
def test_verify_reference_matches_naive(case):
    case = dict(case)
    case.pop("id")
    c = _case(**case)
    o, lse = c.reference(torch.float64)
    scale = float(c.k_scale) if c.k_scale is not None else 1.0
    o_n, lse_n = _naive_verify(c.q, c.k_buffer, c.Lv, c.req_to_token, c.seq_lens,
                               c.real_seq_lens, c.qlen, c.sm_scale, c.page_size, scale)
    torch.testing.assert_close(o, o_n, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(lse, lse_n, rtol=1e-9, atol=1e-9)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()


def test_verify_reference_empty_rows_are_zero_and_minus_inf():
    c = _case(B=2, H=2, qlen=3, lens=[1, 10], page_size=4, real=[5, 0])
    o, lse = c.reference()
    # Request 0: L=1, qlen=3 -> limits max(min(-1+t, 5), 0) = 0, 0, 1.
    assert torch.isinf(lse[0:2]).all() and (lse[0:2] < 0).all()
    assert (o[0:2] == 0).all()
    assert torch.isfinite(lse[2]).all()
    # Request 1: real length 0 hides every key.
    assert torch.isinf(lse[3:6]).all() and (o[3:6] == 0).all()


def test_verify_reference_strided_cross_layer_view():
    # A layer's view into a [num_pages, page, layers, Lk] cache has a page stride of
    # page * layers * Lk; the reference must follow the view, not the storage.
    c = _case(B=2, H=2, qlen=2, lens=[30, 17], page_size=8)
    cross = decode_case("cpu", batch=2, heads=2, qlen=2, lens=[30, 17], page=8, Lv=32, rope=16,
                        layout="cross")
    assert cross.k_buffer.stride(0) == 8 * 3 * 48
    c.k_buffer, c.v_buffer = cross.k_buffer, cross.v_buffer
    dense = cross.k_buffer.contiguous()
    assert dense.stride(0) == 8 * 48
    o1, l1 = c.reference()
    c.k_buffer, c.v_buffer = dense, dense[..., :32]
    o2, l2 = c.reference()
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


def test_verify_reference_ignores_k_scale_for_a_16_bit_cache():
    """As the kernels do: k_scale dequantizes an fp8 cache only."""
    c = _case(B=2, H=2, qlen=2, lens=[30, 17], page_size=8)
    o1, l1 = c.reference()
    c.k_scale = torch.tensor(2.5)
    o2, l2 = c.reference()
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    f8 = _case(B=2, H=2, qlen=2, lens=[30, 17], page_size=8, fp8=True)
    o3, _ = f8.reference()
    f8.k_scale = torch.tensor(2.5)
    o4, _ = f8.reference()
    assert not torch.allclose(o3, o4)


def test_op_references_write_what_the_ops_write():
    """The ops' CPU kernels: decode writes all of o and lse; the encoder writes the rows of every
    sequence and leaves the others as they were."""
    c = _case(B=2, H=2, qlen=2, lens=[30, 17], page_size=8)
    args = c.op_args(1)
    decode_verify_op_ref(*args.values())
    o, lse = c.reference()
    assert torch.equal(args["o"], o) and torch.equal(args["lse"], lse)
    e = encoder_case("cpu", lens=[5, 0, 7], hq=2, hkv=1, d=16, gap=2, dtype=torch.float32)
    args = e.op_args()
    context_attention_op_ref(*args.values())
    inside = e.inside()
    assert args["o"][~inside].isnan().all()
    assert torch.equal(args["o"][inside], e.reference()[inside])


def _naive_context(q, k, v, starts, lens, causal, scale, wq, wk, sinks):
    total, hq, d = q.shape
    group = hq // k.shape[1]
    o = torch.zeros(total, hq, d, dtype=torch.float64)
    for s0, n in zip(starts, lens):
        for h in range(hq):
            for i in range(n):
                logits, vals = [], []
                for j in range(n):
                    if causal and j > i:
                        continue
                    if wq and i - j > wq:
                        continue
                    if wk and j - i > wk:
                        continue
                    logits.append(float(q[s0 + i, h].double() @ k[s0 + j, h // group].double()) * scale)
                    vals.append(v[s0 + j, h // group].double())
                if sinks is not None:
                    denom_extra = math.exp(float(sinks[h]))
                else:
                    denom_extra = 0.0
                if not logits:
                    continue
                m = max(logits)
                if sinks is not None:
                    m = max(m, float(sinks[h]))
                w = [math.exp(x - m) for x in logits]
                z = sum(w) + denom_extra * math.exp(-m)
                o[s0 + i, h] = sum(wi * vi for wi, vi in zip(w, vals)) / z
    return o


CONTEXT_CASES = [
    dict(id="noncausal-H2", hq=2, hkv=2, causal=False, wq=None, wk=None, sinks=False),
    dict(id="causal-gqa4:2", hq=4, hkv=2, causal=True, wq=None, wk=None, sinks=False),
    dict(id="window-q3", hq=2, hkv=1, causal=False, wq=3, wk=None, sinks=False),
    dict(id="window-k2", hq=2, hkv=2, causal=False, wq=None, wk=2, sinks=False),
    dict(id="window-both-causal", hq=2, hkv=2, causal=True, wq=2, wk=1, sinks=False),
    dict(id="sinks-causal", hq=2, hkv=1, causal=True, wq=None, wk=None, sinks=True),
]


@pytest.mark.parametrize("case", CONTEXT_CASES, ids=[c["id"] for c in CONTEXT_CASES])
def test_context_reference_matches_naive(case):
    d, lens = 8, [5, 1, 7]  # the reference takes any head dim (the kernel's rule is >= 16)
    e = encoder_case("cpu", lens=lens, hq=case["hq"], hkv=case["hkv"], d=d, dtype=torch.float32,
                     gap=1, causal=case["causal"], window_q=case["wq"], window_k=case["wk"],
                     sinks=case["sinks"])
    starts = e.b_start_loc.tolist()
    assert starts == [0, 6, 8]
    o = context_attention_ref(e.q, e.k, e.v, e.b_start_loc, e.b_seq_len, case["causal"], None,
                              case["wq"], case["wk"], e.sinks, compute_dtype=torch.float64,
                              query_chunk=3)
    o_n = _naive_context(e.q, e.k, e.v, starts, lens, case["causal"], 1 / math.sqrt(d),
                         case["wq"], case["wk"], e.sinks)
    torch.testing.assert_close(o, o_n, rtol=1e-9, atol=1e-9)
