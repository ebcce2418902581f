"""The plain-PyTorch references against naive per-row loops (CPU, float64).

The references are the oracle of every kernel test, so they are checked here against the
most literal reading of SPEC.md: one query row at a time, one key at a time.
"""

import math

import pytest
import torch

from mla_ops.reference import context_attention_ref, decode_verify_ref


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


def _make_verify(B, H, qlen, lens, page_size, Lv=32, rope=16, num_pages=None, fp8=False, four_d=True,
                 real=None):
    Lk = Lv + rope
    max_pages = max(1, max(math.ceil(max(lens) / page_size), 1))
    num_pages = num_pages or B * max_pages + 3
    cache = torch.randn(num_pages, page_size, 1, Lk)
    if fp8:
        cache = (cache * 4).to(torch.float8_e4m3fn)
    if not four_d:
        cache = cache.reshape(num_pages * page_size, 1, Lk)
    table = torch.randperm(num_pages)[: B * max_pages].reshape(B, max_pages).to(torch.int32)
    q = torch.randn(B * qlen, H, Lk)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    real_lens = None if real is None else torch.tensor(real, dtype=torch.int32)
    return q, cache, table, seq_lens, real_lens


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
    fp8 = case.get("fp8", False)
    q, cache, table, seq_lens, real = _make_verify(**case)
    k_scale = torch.tensor(0.37) if fp8 else None
    scale = 0.1352
    o, lse = decode_verify_ref(q, cache, 32, table, seq_lens, real, case["qlen"], scale,
                               case["page_size"], k_scale, compute_dtype=torch.float64)
    o_n, lse_n = _naive_verify(q, cache, 32, table, seq_lens, real, case["qlen"], scale,
                               case["page_size"], float(k_scale) if fp8 else 1.0)
    torch.testing.assert_close(o, o_n, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(lse, lse_n, rtol=1e-9, atol=1e-9)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()


def test_verify_reference_empty_rows_are_zero_and_minus_inf():
    q, cache, table, seq_lens, _ = _make_verify(B=2, H=2, qlen=3, lens=[1, 10], page_size=4)
    real = torch.tensor([5, 0], dtype=torch.int32)
    o, lse = decode_verify_ref(q, cache, 32, table, seq_lens, real, 3, 0.2, 4)
    # Request 0: L=1, qlen=3 -> limits max(min(-1+t, 5), 0) = 0, 0, 1.
    assert torch.isinf(lse[0:2]).all() and (lse[0:2] < 0).all()
    assert (o[0:2] == 0).all()
    assert torch.isfinite(lse[2]).all()
    # Request 1: real length 0 hides every key.
    assert torch.isinf(lse[3:6]).all() and (o[3:6] == 0).all()


def test_verify_reference_strided_cross_layer_view():
    # A layer's view into a [num_pages, layers, page, 1, Lk] cache has a page stride of
    # layers * page * Lk; the reference must follow the view, not the storage.
    q, cache, table, seq_lens, _ = _make_verify(B=2, H=2, qlen=2, lens=[30, 17], page_size=8)
    big = torch.randn(cache.shape[0], 3, 8, 1, cache.shape[-1])
    big[:, 1] = cache
    view = big[:, 1]
    assert view.stride(0) == 3 * 8 * cache.shape[-1]
    o1, l1 = decode_verify_ref(q, view, 32, table, seq_lens, None, 2, 0.3, 8)
    o2, l2 = decode_verify_ref(q, cache, 32, table, seq_lens, None, 2, 0.3, 8)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


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
    d, lens = 8, [5, 1, 7]
    starts = [0, 5, 6]
    total = sum(lens)
    q = torch.randn(total, case["hq"], d)
    k = torch.randn(total, case["hkv"], d)
    v = torch.randn(total, case["hkv"], d)
    sinks = torch.randn(case["hq"]) if case["sinks"] else None
    o = context_attention_ref(q, k, v, torch.tensor(starts), torch.tensor(lens), case["causal"],
                              None, case["wq"], case["wk"], sinks, compute_dtype=torch.float64,
                              query_chunk=3)
    o_n = _naive_context(q, k, v, starts, lens, case["causal"], 1 / math.sqrt(d), case["wq"],
                         case["wk"], sinks)
    torch.testing.assert_close(o, o_n, rtol=1e-9, atol=1e-9)
