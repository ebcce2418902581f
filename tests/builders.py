"""The inputs of every test of the ``mla`` ops, and the one rule their outputs are held to.

Every test file builds its inputs here (``from builders import decode_case, encoder_case``):
one builder per op, so a rule about inputs (random data, scattered pages, poisoned outputs) is
kept once. The API below is stable; other test files (the benchmarks' tests too) rely on it.

Decode verify (``mla::decode_verify``)::

    case = decode_case(device, batch=2, heads=4, qlen=2, lens=(37, 100), page=16)
    o, lse = case.run(num_kv_splits=2)        # mla_ops.decode_attention_fwd_verify
    case.assert_matches(o, lse)               # the tolerance rule, below
    args = case.op_args(num_kv_splits=2)      # keyword args of torch.ops.mla.decode_verify
    torch.ops.mla.decode_verify(**args)
    meta = case.meta_args(num_kv_splits=2)    # the same, as meta tensors (C++ Meta kernels)

Encoder attention (``mla::context_attention``)::

    case = encoder_case(device, lens=(5, 9, 0, 3), hq=4, hkv=2, d=72, dtype=torch.float16)
    o = case.run(config={"BLOCK_M": 32})      # mla_ops.context_attention_fwd
    case.assert_matches(o)
    args = case.op_args()                     # keyword args of torch.ops.mla.context_attention

Ragged draft counts and draft trees (``qo_indptr`` / ``tree_mask`` of the verify op)::

    case = decode_case(device, batch=3, heads=4, qlen=4, lens=(30, 2, 90), page=16,
                       draft_counts=(4, 0, 3), extra_rows=2,       # rows past qo_indptr[B]
                       trees=[eagle_tree(2, 2, 4), [], random_ancestor_tree(3)])
    o, lse = case.run(num_kv_splits=2)        # passes qo_indptr= and tree_mask=
    case.assert_matches(o, lse)               # also: rows past qo_indptr[B] still NaN

Some requests / sequences only (the others given out-of-range metadata on purpose)::

    sub = case.subset([0, 2])                 # the same tensors, requests 0 and 2 only
    sub.assert_matches(o[case.rows([0, 2])], lse[case.rows([0, 2])])   # decode
    sub.assert_matches(o, outside_untouched=False)                     # encoder (o is packed)

What the builders promise:

* inputs are random, never zeros (``randn``; an all-zero tensor hides swapped arguments);
* the pages of each request are scattered over the cache in a random order (a permutation),
  with spare pages no request owns; the cache may be 4-D ``[pages, page, 1, Lk]``, 3-D
  ``[pages * page, 1, Lk]`` or a layer's view of a cross-layer cache (``layout``), 16-bit or
  fp8 with ``k_scale``; ``poison_past_end`` fills every cache slot at or past its request's
  length with NaN, as a reused page can hold;
* every output (``o``, ``lse``, the workspace) is a fresh tensor poisoned with NaN before each
  call (``op_args`` / ``run`` make new ones each time), so an unwritten element shows;
* ``op_args`` hands out the case's own input tensors (not copies): editing one edits the case.

The tolerance rule (``assert_matches``), flash-attention's: the kernel's error against a
float64 reference of the same (low-precision) inputs must be at most ``K`` times the error of
plain PyTorch computing the same attention in the kernel's dtype (:func:`lowp_attention`), plus
a small absolute floor, compared per request (decode) or per sequence (encoder) so that a short
request's coarser rounding never hides a long one's error. Rows that see no key must be exactly
``o = 0``, ``lse = -inf``. See ``K`` and ``FLOOR`` for the numbers and why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
from typing import Any, Callable, Sequence

import torch

import mla_ops  # noqa: F401  (registers torch.ops.mla)
from mla_ops.draft_trees import chain_parents, eagle_parents, masks_from_parents, random_parents
from mla_ops.numerics import FP8_DTYPES
from mla_ops.reference import (cache_pages, context_attention_ref, decode_verify_ref,
                               verify_request_rows, verify_visible)

__all__ = ["interpret", "SM_SCALE", "FP8", "K", "FLOOR", "DecodeCase", "decode_case", "EncoderCase",
           "encoder_case", "lowp_attention", "assert_within", "assert_accurate", "to_meta", "guarded",
           "ToleranceError", "chain_tree", "random_ancestor_tree", "eagle_tree", "tree_masks"]

SM_SCALE = 0.1352  # DeepSeek's MLA scale (1/sqrt(192) * mscale**2)
FP8 = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn
FP8_K_SCALE = 0.37

# K: the kernel may be K times as far from the float64 answer as PyTorch in the kernel's dtype.
# PyTorch in bf16/fp16 rounds the scores, the probabilities and the output to that dtype; the
# kernels keep the scores and the running sums in fp32 and round only P (before the P @ V dot)
# and the output, so they are closer than PyTorch, as flash-attention's kernels are (its tests
# use 2). Measured here: at most ~1x PyTorch's error in o (the output's own rounding dominates
# both), 1/100 of it or less in lse. 3 leaves room for the fp32 reorderings of a split KV
# (stage 2's merge, exp2 for exp) where PyTorch's error happens to be small, and stays tight:
# 64 keys dropped at L = 32k cost ~4x PyTorch's bf16 error in o and ~40x in lse; 16 keys at
# L = 2048, over 100x in fp16 (tests/test_tolerance.py shows each failing).
K = 3
# FLOOR: an absolute allowance for groups where PyTorch's error is ~0 (a row over one key gives
# o = v exactly in any dtype): 1/64 of an ulp at 1.0 for the 16-bit dtypes; for fp32, where
# PyTorch's own error (~3e-7) is below what a reordering of the kernel's sums costs, 16 ulps.
# Far below what a dropped block costs (~2e-3 in o and lse at L = 32k, bf16).
FLOOR = {torch.float16: 2.0 ** -16, torch.bfloat16: 2.0 ** -13, torch.float32: 2.0 ** -19}


@contextlib.contextmanager
def interpret(on: bool):
    """``TRITON_INTERPRET`` for the ops' CPU kernels: on, the Triton kernels under the
    interpreter; off, the plain-PyTorch reference (triton's own import is unaffected)."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if on else "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


class ToleranceError(AssertionError):
    """The kernel's output is further from the float64 reference than the rule allows."""


# --- the comparison ---------------------------------------------------------------------------


def lowp_attention(q, kv_k, kv_v, scale, visible=None, sinks=None, v_scale=None):
    """Attention as plain PyTorch computes it in the dtype of ``q`` (no upcast of the inputs):
    scores from a matmul in that dtype (fp32 accumulation, rounded to the dtype), a softmax in
    fp32 whose probabilities are rounded to the dtype, ``P @ V`` in the dtype. (Each matmul is
    done as cuBLAS does a bf16/fp16 one, fp32 products and sums rounded once to the dtype: CPU
    bf16 GEMMs with long reductions are 20x slower and no more faithful.)

    q ``[..., m, D]``, kv_k ``[..., n, D]``, kv_v ``[..., n, Dv]`` (an fp8 cache converted to
    the dtype, which is exact, with its scale folded into ``scale`` and ``v_scale``, as the
    kernels do); ``visible`` a bool mask broadcastable to ``[..., m, n]``; ``sinks`` ``[...]``
    per-head logits added to the denominator only. Returns ``o`` (dtype of q) and ``lse``
    (fp32, natural log; ``-inf`` and ``o = 0`` for rows that see nothing).
    """
    s = _mm(q, kv_k.transpose(-1, -2)).float() * scale
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    cat = s
    if sinks is not None:
        sink = sinks.float()[..., None, None].expand(*s.shape[:-1], 1)
        cat = torch.cat([s, sink], dim=-1)
    lse = torch.logsumexp(cat, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - safe[..., None]).to(q.dtype)
    o = _mm(p, kv_v)
    return (o if v_scale is None else o * v_scale), lse


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` in the dtype of ``a``: fp32 products and sums, the result rounded once."""
    return torch.matmul(a.float(), b.float()).to(a.dtype)


def _err(x: torch.Tensor, ref: torch.Tensor) -> float:
    if x.numel() == 0:
        return 0.0
    return float((x.double() - ref.double()).abs().max())


def assert_within(name: str, got, ref, lowp, groups: Sequence[tuple[str, Any]], dtype,
                  k: float = K, floor: float | None = None) -> dict:
    """``|got - ref| <= k * |lowp - ref| + floor``, maxima taken per group.

    ``groups``: ``(label, index)`` pairs selecting each request's elements (rows with no key
    already removed by the caller). Raises :class:`ToleranceError` naming the first group that
    fails; returns ``{label: (kernel error, PyTorch error)}`` for tests that report margins.
    """
    floor = FLOOR[dtype] if floor is None else floor
    out = {}
    for label, idx in groups:
        e, base = _err(got[idx], ref[idx]), _err(lowp[idx], ref[idx])
        out[label] = (e, base)
        if not e <= k * base + floor:
            raise ToleranceError(
                f"{name}, {label}: error {e:.3g} against the float64 reference exceeds "
                f"{k} x {base:.3g} (PyTorch in {str(dtype).replace('torch.', '')}) + "
                f"{floor:.3g}")
    return out


def assert_accurate(name: str, got, ref, lowp, dtype, k: float = K,
                    floor: float | None = None) -> dict:
    """The rule of :func:`assert_within` over a whole tensor: ``got`` has no NaN, and where
    the float64 ``ref`` is finite ``|got - ref| <= k * |lowp - ref| + floor`` (``lowp``: plain
    PyTorch's result in ``dtype``). The pattern of rows with no key (``-inf``) is the caller's
    to check."""
    _assert_no_nan(**{name: got})
    return assert_within(name, got, ref, lowp, [("all", torch.isfinite(ref))], dtype, k, floor)


def _assert_no_nan(**tensors):
    for name, t in tensors.items():
        assert not torch.isnan(t).any(), f"NaN in {name}: an element was not written"


# --- decode verify ----------------------------------------------------------------------------

DECODE_ARGS = ("q", "k_buffer", "v_buffer", "o", "lse", "req_to_token", "seq_lens",
               "real_seq_lens", "qlen", "attn_logits", "num_kv_splits", "sm_scale", "page_size",
               "k_scale")


@dataclasses.dataclass
class DecodeCase:
    """A verify batch: the tensors an engine passes (see :func:`decode_case`)."""

    q: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    req_to_token: torch.Tensor
    seq_lens: torch.Tensor
    real_seq_lens: torch.Tensor | None
    qlen: int
    page_size: int
    k_scale: torch.Tensor | None
    sm_scale: float = SM_SCALE
    qo_indptr: torch.Tensor | None = None  # [B+1] int32: ragged draft counts (qlen the most)
    tree_mask: torch.Tensor | None = None  # [rows] int64: draft trees

    @property
    def Lv(self) -> int:
        return self.v_buffer.shape[-1]

    @property
    def batch(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def heads(self) -> int:
        return self.q.shape[1]

    def outputs(self, num_kv_splits: int = 1):
        """Fresh ``o``, ``lse`` and workspace (None for one split), all NaN."""
        rows, heads = self.q.shape[:2]
        dev = self.q.device
        o = torch.full((rows, heads, self.Lv), float("nan"), dtype=self.q.dtype, device=dev)
        lse = torch.full((rows, heads), float("nan"), dtype=torch.float32, device=dev)
        logits = None
        if num_kv_splits > 1:
            logits = torch.full((rows, heads, num_kv_splits, self.Lv + 1), float("nan"),
                                dtype=torch.float32, device=dev)
        return o, lse, logits

    def args(self, o, lse, logits, num_kv_splits: int) -> tuple:
        """Positional arguments of the op around the given outputs."""
        return (self.q, self.k_buffer, self.v_buffer, o, lse, self.req_to_token, self.seq_lens,
                self.real_seq_lens, self.qlen, logits, num_kv_splits, self.sm_scale,
                self.page_size, self.k_scale)

    def op_args(self, num_kv_splits: int = 1) -> dict:
        """Keyword arguments of ``torch.ops.mla.decode_verify`` (schema order, so
        ``*args.values()`` is the positional call when the case has neither ``qo_indptr`` nor
        ``tree_mask``, which are only there when set), with fresh NaN outputs."""
        args = dict(zip(DECODE_ARGS, self.args(*self.outputs(num_kv_splits), num_kv_splits)))
        for name in ("qo_indptr", "tree_mask"):
            if getattr(self, name) is not None:
                args[name] = getattr(self, name)
        return args

    def spans(self) -> list[tuple[int, int]]:
        """``(first row, rows)`` of each request (``reference.verify_request_rows``)."""
        return verify_request_rows(self.batch, self.qlen, self.qo_indptr)

    @property
    def used_rows(self) -> int:
        """Rows that belong to a request: all of q's, or ``qo_indptr[B]``."""
        return self.q.shape[0] if self.qo_indptr is None else int(self.qo_indptr[-1])

    def meta_args(self, num_kv_splits: int = 1) -> dict:
        """:meth:`op_args` as meta tensors of the same shapes, strides and dtypes."""
        return to_meta(self.op_args(num_kv_splits), views={"v_buffer": ("k_buffer", self.Lv)})

    def warmup_args(self, qlens=(1, 2), num_kv_splits: int = 2, has_real: bool = True) -> dict:
        """Keyword arguments of ``torch.ops.mla.warmup_decode_verify``."""
        a = self.op_args(num_kv_splits)
        return dict(q=a["q"], k_buffer=a["k_buffer"], o=a["o"], lse=a["lse"],
                    req_to_token=a["req_to_token"], has_real=has_real, qlens=list(qlens),
                    attn_logits=a["attn_logits"], sm_scale=self.sm_scale,
                    page_size=self.page_size, k_scale=self.k_scale)

    def run(self, num_kv_splits: int = 1, config: dict | None = None,
            fn: Callable | None = None):
        """Run ``fn`` (default ``mla_ops.decode_attention_fwd_verify`` with ``config``) on
        fresh poisoned outputs; returns ``(o, lse)``."""
        args = self.op_args(num_kv_splits)
        if fn is None:
            mla_ops.decode_attention_fwd_verify(**args, config=config)
        else:
            assert config is None, "config= is an argument of the function, not of the op"
            fn(**args)
        return args["o"], args["lse"]

    def reference(self, compute_dtype: torch.dtype = torch.float32):
        """``mla_ops.reference.decode_verify_ref`` on the case (``o``, ``lse`` in
        ``compute_dtype``)."""
        return decode_verify_ref(self.q, self.k_buffer, self.Lv, self.req_to_token,
                                 self.seq_lens, self.real_seq_lens, self.qlen, self.sm_scale,
                                 self.page_size, self.k_scale, compute_dtype=compute_dtype,
                                 qo_indptr=self.qo_indptr, tree_mask=self.tree_mask)

    def lowp_reference(self):
        """The same attention in the dtype of q, as plain PyTorch computes it
        (:func:`lowp_attention`): the yardstick of the tolerance rule."""
        dtype = self.q.dtype
        rows, heads, Lk = self.q.shape
        pages = cache_pages(self.k_buffer, self.page_size)
        fp8 = self.k_buffer.dtype in FP8_DTYPES and self.k_scale is not None
        kscale = float(self.k_scale) if fp8 else 1.0
        vscale = kscale if fp8 else None
        o = torch.zeros(rows, heads, self.Lv, dtype=dtype, device=self.q.device)
        lse = torch.full((rows, heads), float("-inf"), device=self.q.device)
        lens = self.seq_lens.tolist()
        reals = (self.real_seq_lens.tolist() if self.real_seq_lens is not None
                 else [None] * self.batch)
        for b, (r0, n) in enumerate(self.spans()):
            if n <= 0:
                continue
            keys = torch.arange(max(lens[b], 0), device=self.q.device)
            tree = None if self.tree_mask is None else self.tree_mask[r0:r0 + n]
            visible = verify_visible(lens[b], reals[b], n, keys, tree)  # [n, keys]
            seen = visible.any(dim=0).nonzero()
            m = int(seen.max()) + 1 if len(seen) else 0
            if m == 0:
                continue
            table = self.req_to_token[b, : math.ceil(m / self.page_size)].long()
            kv = pages[table].reshape(-1, Lk)[:m].to(dtype)
            qb = self.q[r0:r0 + n].transpose(0, 1)  # [H, n, Lk]
            ob, lb = lowp_attention(qb, kv, kv[:, : self.Lv], self.sm_scale * kscale,
                                    visible[None, :, :m], v_scale=vscale)
            o[r0:r0 + n] = ob.transpose(0, 1)
            lse[r0:r0 + n] = lb.transpose(0, 1)
        return o, lse

    def rows(self, requests: Sequence[int]) -> torch.Tensor:
        """The rows of ``q`` / ``o`` / ``lse`` that belong to ``requests``, in that order."""
        spans = self.spans()
        return torch.tensor([spans[b][0] + t for b in requests for t in range(spans[b][1])],
                            dtype=torch.long, device=self.q.device)

    def subset(self, requests: Sequence[int]) -> "DecodeCase":
        """The same batch with only ``requests`` (their q rows, block-table rows, lengths; the
        same cache): its reference is theirs, whatever the other requests' metadata holds."""
        idx = torch.tensor(list(requests), dtype=torch.long, device=self.q.device)
        rows = self.rows(requests)
        qo_indptr = None
        if self.qo_indptr is not None:
            counts = [self.spans()[b][1] for b in requests]
            qo_indptr = torch.tensor([0, *itertools.accumulate(counts)], dtype=torch.int32,
                                     device=self.q.device)
        return dataclasses.replace(
            self, q=self.q[rows], req_to_token=self.req_to_token[idx].clone(),
            seq_lens=self.seq_lens[idx].clone(),
            real_seq_lens=None if self.real_seq_lens is None else self.real_seq_lens[idx].clone(),
            qo_indptr=qo_indptr,
            tree_mask=None if self.tree_mask is None else self.tree_mask[rows].clone())

    def assert_matches(self, o, lse, k: float = K, floor: float | None = None) -> dict:
        """The tolerance rule (module docstring), request by request, for ``o`` and ``lse``;
        rows without a key exactly ``o = 0``, ``lse = -inf``; rows of no request (from
        ``qo_indptr[B]`` on) still NaN, as the outputs were made. Returns the errors measured."""
        used = self.used_rows
        assert o[used:].isnan().all() and lse[used:].isnan().all(), \
            "a row past qo_indptr[B] (no request's) was written"
        o, lse = o[:used], lse[:used]
        _assert_no_nan(o=o, lse=lse)
        ref_o, ref_lse = self.reference(torch.float64)
        low_o, low_lse = self.lowp_reference()
        ref_o, ref_lse, low_o, low_lse = ref_o[:used], ref_lse[:used], low_o[:used], low_lse[:used]
        empty = torch.isinf(ref_lse)
        assert torch.equal(torch.isinf(lse), empty) and (lse[empty] < 0).all(), \
            "lse is -inf exactly where a row sees no key"
        assert (o[empty] == 0).all(), "o is 0 where a row sees no key"
        groups = []
        for b, (r0, n) in enumerate(self.spans()):
            rows = torch.zeros_like(empty)
            rows[r0:r0 + n] = True
            groups.append((f"request {b}", rows & ~empty))
        dtype = self.q.dtype
        errs = {"o": assert_within("o", o, ref_o, low_o, groups, dtype, k, floor)}
        # lse: fp32 in every dtype; PyTorch's error is that of scores rounded to the dtype.
        errs["lse"] = assert_within("lse", lse, ref_lse, low_lse, groups, dtype, k, floor)
        return errs


def decode_case(device, *, batch: int, heads: int, qlen: int, lens: Sequence[int], page: int,
                Lv: int = 64, rope: int = 32, real: Sequence[int] | None = None,
                dtype: torch.dtype = torch.float32, cache_dtype: torch.dtype | None = None,
                layout: str = "4d", q_strided: bool = False, spare_pages: int = 3,
                poison_past_end: bool = False, score_std: float = 1.0,
                k_scale: float | None = None, sm_scale: float = SM_SCALE,
                draft_counts: Sequence[int] | None = None, extra_rows: int = 0,
                trees: Sequence[Sequence[int]] | None = None) -> DecodeCase:
    """A random verify batch.

    Args:
        batch, heads, qlen: ``q`` is ``[batch * qlen, heads, Lv + rope]``.
        lens / real: per-request ``seq_lens`` / ``real_seq_lens`` (None: no real lengths).
        page: tokens per page; each request owns ``ceil(max(lens) / page)`` pages (its block
            table row), drawn by a random permutation of the cache's pages, plus
            ``spare_pages`` that no request owns.
        dtype: of q and o; cache_dtype: of the cache (default dtype; :data:`FP8` quantizes
            ``N(0, 1) / k_scale`` and sets ``k_scale``, default 0.37).
        layout: ``"4d"`` ``[pages, page, 1, Lk]``, ``"3d"`` ``[pages * page, 1, Lk]``, or
            ``"cross"``: layer 1 of a ``[pages, page, 3, Lk]`` cross-layer cache (page stride
            3x the page).
        q_strided: q is a view with a row stride wider than ``Lk``.
        poison_past_end: every cache slot at or past its request's length is NaN.
        score_std: q is scaled so that the scores ``q . k * sm_scale`` have this standard
            deviation: 1 spreads each row's attention over many keys, where a dropped block
            shows (tests/test_tolerance.py); larger values make it peaky (the running max then
            moves a lot), where a block holding none of the few heavy keys changes the output
            less than bf16 rounding does: no tolerance on the output can see it there. (q of
            N(0, 1) gives 0.1352 * sqrt(576) = 3.2 at Lk = 576.)
        k_scale: also for a 16-bit cache, where the kernels ignore it.
        draft_counts: ragged draft counts (each at most ``qlen``): request b has
            ``draft_counts[b]`` rows, given to the op as ``qo_indptr``; q then has their sum
            plus ``extra_rows`` rows (rows of no request, which the op must leave alone).
        trees: per request, the int masks of its rows (bit j: sees draft token j), given to the
            op as ``tree_mask`` (rows of no request get random bits); see :func:`tree_masks`.
    """
    cache_dtype = cache_dtype or dtype
    Lk = Lv + rope
    pages_per_req = max(1, math.ceil(max(lens) / page)) if len(lens) else 1
    num_pages = batch * pages_per_req + spare_pages
    layers = 3 if layout == "cross" else 1
    raw = torch.randn(num_pages, page, layers, Lk, device=device)
    table = torch.randperm(num_pages, device=device)[: batch * pages_per_req]
    if poison_past_end:
        live = torch.zeros(num_pages, page, dtype=torch.bool, device=device)
        for b, length in enumerate(lens):
            for j, pg in enumerate(table[b * pages_per_req:(b + 1) * pages_per_req].tolist()):
                live[pg, : max(0, min(page, length - j * page))] = True
        raw[~live] = float("nan")
    scale_t = None
    if cache_dtype in FP8_DTYPES:
        k_scale = FP8_K_SCALE if k_scale is None else k_scale
        raw = (raw / k_scale).clamp(-200, 200).to(cache_dtype)
    else:
        raw = raw.to(cache_dtype)
    if k_scale is not None:
        scale_t = torch.tensor(float(k_scale), dtype=torch.float32, device=device)
    if layout == "cross":
        k_buffer = raw[:, :, 1:2, :]
    elif layout == "3d":
        k_buffer = raw.reshape(num_pages * page, 1, Lk)
    elif layout == "4d":
        k_buffer = raw
    else:
        raise ValueError(f"layout: {layout!r}")
    req_to_token = table.view(batch, pages_per_req).to(torch.int32)
    q_std = score_std / (sm_scale * math.sqrt(Lk))
    qo_indptr = None
    rows = batch * qlen
    if draft_counts is not None:
        assert len(draft_counts) == batch and all(0 <= n <= qlen for n in draft_counts)
        qo_indptr = torch.tensor([0, *itertools.accumulate(draft_counts)], dtype=torch.int32,
                                 device=device)
        rows = int(qo_indptr[-1]) + extra_rows
    tree_mask = None
    if trees is not None:
        counts = draft_counts if draft_counts is not None else [qlen] * batch
        tree_mask = tree_masks(trees, counts, rows, device)
    q = (torch.randn(rows, heads, Lk + (32 if q_strided else 0), device=device)
         * q_std).to(dtype)[..., :Lk]
    if q_strided:
        assert not q.is_contiguous()
    seq_lens = torch.tensor(list(lens), dtype=torch.int32, device=device)
    real_seq_lens = (None if real is None
                     else torch.tensor(list(real), dtype=torch.int32, device=device))
    return DecodeCase(q, k_buffer, k_buffer[..., :Lv], req_to_token, seq_lens, real_seq_lens,
                      qlen, page, scale_t, sm_scale, qo_indptr, tree_mask)


# --- draft trees ------------------------------------------------------------------------------


def chain_tree(n: int) -> list[int]:
    """The causal chain of ``n`` drafts: draft i sees drafts 0..i (what ``tree_mask=None`` is)."""
    return masks_from_parents(chain_parents(n))


def random_ancestor_tree(n: int, generator: torch.Generator | None = None,
                         shuffle: bool = False) -> list[int]:
    """``n`` drafts, each the child of a random earlier one (draft 0 the root); with
    ``shuffle`` numbered in a random order (a parent may come after its child): the kernels
    must not assume any order."""
    return masks_from_parents(random_parents(n, generator, shuffle))


def eagle_tree(topk: int, depth: int, n: int, generator: torch.Generator | None = None
               ) -> list[int]:
    """An SGLang-style EAGLE draft tree of ``n`` tokens (``mla_ops.draft_trees.eagle_parents``:
    topk candidates per level under the best topk of the level above, ``depth`` levels, the n
    best by cumulative score, parents first)."""
    return masks_from_parents(eagle_parents(topk, depth, n, generator))


def tree_masks(trees: Sequence[Sequence[int]], counts: Sequence[int], rows: int,
               device) -> torch.Tensor:
    """``[rows]`` int64 ``tree_mask`` from per-request masks (request b's ``counts[b]`` rows
    laid one request after another); rows of no request hold random bits."""
    out = torch.randint(-(2 ** 62), 2 ** 62, (rows,), dtype=torch.int64)
    r = 0
    for masks, n in zip(trees, counts):
        assert len(masks) == n, f"a tree of {len(masks)} masks for {n} draft rows"
        for m in masks:
            out[r] = m - (1 << 64) if m >= 1 << 63 else m  # bit 63 as the sign bit
            r += 1
    return out.to(device)


# --- encoder attention ------------------------------------------------------------------------

ENCODER_ARGS = ("q", "k", "v", "o", "b_start_loc", "b_seq_len", "max_input_len", "is_causal",
                "softmax_scale", "sliding_window_q", "sliding_window_k", "sinks")


@dataclasses.dataclass
class EncoderCase:
    """Packed variable-length sequences (see :func:`encoder_case`)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    b_start_loc: torch.Tensor
    b_seq_len: torch.Tensor
    max_input_len: int
    is_causal: bool = True
    softmax_scale: float | None = None
    sliding_window_q: int | None = None
    sliding_window_k: int | None = None
    sinks: torch.Tensor | None = None
    head_stride: int | None = None  # o's layout: the head stride of q/k/v/o (None: dense)

    def output(self) -> torch.Tensor:
        """A fresh ``o`` in q's layout (a padded view when the inputs are), all NaN."""
        return _with_head_stride(torch.full(self.q.shape, float("nan"), dtype=self.q.dtype,
                                            device=self.q.device), self.head_stride, fill=None)

    def op_args(self, **changes) -> dict:
        """Keyword arguments of ``torch.ops.mla.context_attention`` (schema order) with a fresh
        NaN ``o``; ``changes`` replace any of them."""
        args = dict(zip(ENCODER_ARGS, (
            self.q, self.k, self.v, self.output(), self.b_start_loc, self.b_seq_len,
            self.max_input_len, self.is_causal, self.softmax_scale, self.sliding_window_q,
            self.sliding_window_k, self.sinks)))
        args.update(changes)
        return args

    def meta_args(self) -> dict:
        return to_meta(self.op_args())

    def run(self, config: dict | None = None, fn: Callable | None = None) -> torch.Tensor:
        """Run ``fn`` (default ``mla_ops.context_attention_fwd`` with ``config``) on a fresh
        poisoned ``o``; returns it."""
        args = self.op_args()
        if fn is None:
            mla_ops.context_attention_fwd(**args, config=config)
        else:
            assert config is None, "config= is an argument of the function, not of the op"
            fn(**args)
        return args["o"]

    def reference(self, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return context_attention_ref(self.q, self.k, self.v, self.b_start_loc, self.b_seq_len,
                                     self.is_causal, self.softmax_scale, self.sliding_window_q,
                                     self.sliding_window_k, self.sinks,
                                     compute_dtype=compute_dtype)

    def lowp_reference(self, query_chunk: int = 1024) -> torch.Tensor:
        """The same attention in the dtype of q, as plain PyTorch computes it."""
        q, k, v = self.q, self.k, self.v
        total, hq, d = q.shape
        group = hq // k.shape[1]
        scale = self.softmax_scale if self.softmax_scale is not None else 1.0 / math.sqrt(d)
        o = torch.zeros(total, hq, v.shape[-1], dtype=q.dtype, device=q.device)
        wq, wk = self.sliding_window_q, self.sliding_window_k
        for start, n in zip(self.b_start_loc.tolist(), self.b_seq_len.tolist()):
            if n == 0:
                continue
            kb = k[start:start + n].repeat_interleave(group, dim=1).transpose(0, 1)
            vb = v[start:start + n].repeat_interleave(group, dim=1).transpose(0, 1)
            j = torch.arange(n, device=q.device)
            for i0 in range(0, n, query_chunk):
                i1 = min(n, i0 + query_chunk)
                i = torch.arange(i0, i1, device=q.device)[:, None]
                keep = torch.ones(i1 - i0, n, dtype=torch.bool, device=q.device)
                if self.is_causal:
                    keep &= j[None, :] <= i
                if wq:
                    keep &= (i - j[None, :]) <= wq
                if wk:
                    keep &= (j[None, :] - i) <= wk
                qb = q[start + i0:start + i1].transpose(0, 1)
                ob, _ = lowp_attention(qb, kb, vb, scale, keep[None], self.sinks)
                o[start + i0:start + i1] = ob.transpose(0, 1)
        return o

    def subset(self, sequences: Sequence[int]) -> "EncoderCase":
        """The same packed tensors with only ``sequences`` (their starts and lengths): its
        reference and :meth:`assert_matches` cover those, whatever the others' metadata holds."""
        idx = torch.tensor(list(sequences), dtype=torch.long, device=self.q.device)
        lens = self.b_seq_len[idx].clone()
        return dataclasses.replace(self, b_start_loc=self.b_start_loc[idx].clone(), b_seq_len=lens,
                                   max_input_len=int(lens.max()) if len(sequences) else 0)

    def inside(self) -> torch.Tensor:
        """``[total]`` bool: the tokens of some sequence."""
        mask = torch.zeros(self.q.shape[0], dtype=torch.bool, device=self.q.device)
        for s, n in zip(self.b_start_loc.tolist(), self.b_seq_len.tolist()):
            mask[s:s + n] = True
        return mask

    def assert_matches(self, o, k: float = K, floor: float | None = None,
                       outside_untouched: bool = True) -> dict:
        """The tolerance rule, sequence by sequence; tokens outside every sequence are still
        NaN (the op never writes them) unless ``outside_untouched`` is False."""
        inside = self.inside()
        _assert_no_nan(o=o[inside])
        if outside_untouched:
            assert o[~inside].isnan().all(), "a token outside every sequence was written"
        ref, low = self.reference(torch.float64), self.lowp_reference()
        groups = [(f"sequence {i}", slice(s, s + n)) for i, (s, n) in
                  enumerate(zip(self.b_start_loc.tolist(), self.b_seq_len.tolist())) if n]
        return {"o": assert_within("o", o, ref, low, groups, self.q.dtype, k, floor)}


def _with_head_stride(t: torch.Tensor, head_stride: int | None, fill="randn") -> torch.Tensor:
    """``t`` ``[T, H, D]`` copied into a view whose head stride is ``head_stride`` >= D (the
    padding random, never zeros), or ``t`` itself when None."""
    if head_stride is None or head_stride == t.shape[-1]:
        return t
    total, h, d = t.shape
    buf = (torch.randn(total, h, head_stride, device=t.device).to(t.dtype) if fill == "randn"
           else torch.empty(total, h, head_stride, dtype=t.dtype, device=t.device))
    view = buf[:, :, :d]
    view.copy_(t)
    return view


def encoder_case(device, *, lens: Sequence[int], hq: int, hkv: int, d: int,
                 dtype: torch.dtype = torch.float16, gap: int = 0, head_stride: int | None = None,
                 causal: bool = True, softmax_scale: float | None = None,
                 window_q: int | None = None, window_k: int | None = None,
                 sinks: bool | torch.Tensor = False, index_dtype=torch.int32) -> EncoderCase:
    """Random packed sequences: sequence i starts where i-1 ended plus ``gap`` unused tokens.

    ``head_stride``: q/k/v (and every ``o`` made for the case) are views whose head stride is
    ``head_stride`` >= d (random padding). ``sinks``: True for random per-head sink logits
    (one far above the scores), or the tensor itself. ``max_input_len`` is ``max(lens)``.
    """
    starts, pos = [], 0
    for n in lens:
        starts.append(pos)
        pos += n + gap
    total = pos
    q, k, v = (torch.randn(total, h, d, device=device).to(dtype) for h in (hq, hkv, hkv))
    q, k, v = (_with_head_stride(t, head_stride) for t in (q, k, v))
    if sinks is True:
        sinks = torch.randn(hq, device=device) * 2
        sinks[0] = 6.0  # rows of head 0 mostly attend the sink
    elif sinks is False:
        sinks = None
    return EncoderCase(
        q, k, v, torch.tensor(starts, dtype=index_dtype, device=device),
        torch.tensor(list(lens), dtype=index_dtype, device=device), max(lens, default=0),
        causal, softmax_scale, window_q, window_k, sinks, head_stride)


# --- memory that faults past a tensor ---------------------------------------------------------


def guarded(t: torch.Tensor, side: str = "end") -> torch.Tensor:
    """A CPU copy of ``t`` between two unmapped pages, flush against the one after it
    (``side="end"``: a read even one element past its end faults) or the one before it
    (``"start"``: a read before its first element faults). Under the interpreter a kernel that
    reads outside a tensor then dies with SIGSEGV instead of reading a neighbour's bytes, so a
    test (in a child process) sees every out-of-bounds access. Linux / POSIX mmap only."""
    import ctypes
    import mmap

    t = t.contiguous()
    nbytes = t.numel() * t.element_size()
    page = mmap.PAGESIZE
    span = max(1, -(-nbytes // page)) * page
    buf = mmap.mmap(-1, span + 2 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    for off in (0, page + span):
        if libc.mprotect(ctypes.c_void_p(base + off), page, 0) != 0:
            raise OSError(ctypes.get_errno(), "mprotect")
    offset = page + (span - nbytes if side == "end" else 0)
    out = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset)
    out = out.view(t.dtype).view(t.shape)
    out.copy_(t)
    return out


# --- meta tensors -----------------------------------------------------------------------------


def to_meta(args: dict, views: dict[str, tuple[str, int]] | None = None) -> dict:
    """Every tensor of ``args`` as a meta tensor of the same shape, strides and dtype;
    ``views``: ``{name: (base, width)}`` makes ``args[name]`` the view ``base[..., :width]``
    of the converted base (``v_buffer`` is a view of ``k_buffer``)."""
    out = {}
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            value = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                        device="meta")
        out[name] = value
    for name, (base, width) in (views or {}).items():
        out[name] = out[base][..., :width]
    return out
