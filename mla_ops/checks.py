"""Input validation shared by the Python API, the ``torch.ops.mla`` ops and their fake impls.

Each ``check_*`` routine looks only at metadata (dtype, rank, shape, stride, device), so it
runs unchanged on real, fake and meta tensors, never synchronises the device, and raises
before any launch. A message always starts with the argument's name and says what was
expected and what was given: ``ValueError`` for shapes and values, ``TypeError`` for types
and dtypes.
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = [
    "FP8_DTYPES",
    "check_decode_verify",
    "check_warmup_decode_verify",
    "check_context_attention",
]

FP8_DTYPES = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
    if hasattr(torch, name)
)
ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32,)


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def _tensor(name: str, t, *, rank: int | Sequence[int] | None = None, dtypes=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if rank is not None:
        ranks = (rank,) if isinstance(rank, int) else tuple(rank)
        if t.dim() not in ranks:
            want = " or ".join(f"{r}-D" for r in ranks)
            raise ValueError(f"{name}: expected a {want} tensor, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name}: expected dtype in ({names}), got {t.dtype}")


def _shape(name: str, t: torch.Tensor, expected: Sequence[int]) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)}, got {tuple(t.shape)}")


def _inner_contiguous(name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name}: the last dimension must be contiguous (stride 1), got strides {t.stride()}"
        )


def _int(name: str, v, *, minimum: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if v < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {v}")


def _same_device(device: torch.device, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise ValueError(f"{name}: expected a tensor on {device} (the device of q), got {t.device}")


def _cache_layout(k_buffer: torch.Tensor, page_size: int) -> None:
    """``[num_pages, page_size, 1, Lk]`` or ``[num_pages * page_size, 1, Lk]``."""
    _tensor("k_buffer", k_buffer, rank=(3, 4), dtypes=ACT_DTYPES + FP8_DTYPES)
    if k_buffer.shape[-2] != 1:
        raise ValueError(
            f"k_buffer: expected one latent KV head (shape[-2] == 1), got shape {tuple(k_buffer.shape)}"
        )
    _int("page_size", page_size, minimum=1)
    if k_buffer.dim() == 4 and k_buffer.shape[1] != page_size:
        raise ValueError(
            f"page_size: {page_size} does not match k_buffer's pages of {k_buffer.shape[1]} tokens "
            f"(shape {tuple(k_buffer.shape)})"
        )
    if k_buffer.dim() == 3:
        if k_buffer.shape[0] % page_size != 0:
            raise ValueError(
                f"page_size: a 3-D k_buffer of {k_buffer.shape[0]} tokens is not a whole number "
                f"of pages of {page_size}"
            )
        if page_size > 1 and k_buffer.shape[0] > page_size and k_buffer.stride(0) == 0:
            raise ValueError("k_buffer: token stride 0 is not a valid cache layout")
    _inner_contiguous("k_buffer", k_buffer)


def _latent_dims(k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> tuple[int, int]:
    _tensor("v_buffer", v_buffer, rank=k_buffer.dim())
    if v_buffer.dtype != k_buffer.dtype:
        raise TypeError(f"v_buffer: expected the dtype of k_buffer ({k_buffer.dtype}), got {v_buffer.dtype}")
    if tuple(v_buffer.shape[:-1]) != tuple(k_buffer.shape[:-1]):
        raise ValueError(
            f"v_buffer: expected k_buffer[..., :Lv] with leading shape {tuple(k_buffer.shape[:-1])}, "
            f"got shape {tuple(v_buffer.shape)}"
        )
    # V is read from K (SPEC: only v_buffer's width is used), so its strides are not checked:
    # traced graphs hand the op a functionalized copy rather than the view.
    Lk, Lv = k_buffer.shape[-1], v_buffer.shape[-1]
    rope = Lk - Lv
    if not _is_pow2(Lv) or rope < 0 or (rope > 0 and not _is_pow2(rope)):
        raise ValueError(
            f"v_buffer: expected Lk = Lv + rope with Lv and rope powers of two (576 = 512 + 64), "
            f"got Lk={Lk}, Lv={Lv}"
        )
    return Lk, Lv


def check_decode_verify(
    q, k_buffer, v_buffer, o, lse, req_to_token, seq_lens, real_seq_lens, qlen,
    attn_logits, num_kv_splits, sm_scale, page_size, k_scale=None,
) -> tuple[int, int, int, int]:
    """Validate a ``decode_attention_fwd_verify`` call; returns ``(batch, num_heads, Lk, Lv)``."""
    _tensor("q", q, rank=3, dtypes=ACT_DTYPES)
    dev = q.device
    _cache_layout(k_buffer, page_size)
    if k_buffer.dtype not in FP8_DTYPES and k_buffer.dtype != q.dtype:
        raise TypeError(
            f"k_buffer: expected the dtype of q ({q.dtype}) or an fp8 dtype, got {k_buffer.dtype}"
        )
    Lk, Lv = _latent_dims(k_buffer, v_buffer)
    rows, heads = q.shape[0], q.shape[1]
    if q.shape[2] != Lk:
        raise ValueError(f"q: expected head dim Lk={Lk} (k_buffer.shape[-1]), got shape {tuple(q.shape)}")
    _inner_contiguous("q", q)
    _int("qlen", qlen, minimum=1)
    if rows % qlen != 0:
        raise ValueError(f"qlen: q has {rows} rows, not a multiple of qlen={qlen} (rows are [B*qlen, ...])")
    batch = rows // qlen
    _tensor("o", o, rank=3, dtypes=(q.dtype,))
    _shape("o", o, (rows, heads, Lv))
    _inner_contiguous("o", o)
    _tensor("lse", lse, rank=2, dtypes=(torch.float32,))
    _shape("lse", lse, (rows, heads))
    _tensor("req_to_token", req_to_token, rank=2, dtypes=INDEX_DTYPES)
    if req_to_token.shape[0] < batch:
        raise ValueError(
            f"req_to_token: expected one row per request ({batch}), got shape {tuple(req_to_token.shape)}"
        )
    _tensor("seq_lens", seq_lens, rank=1, dtypes=INDEX_DTYPES)
    _shape("seq_lens", seq_lens, (batch,))
    if real_seq_lens is not None:
        _tensor("real_seq_lens", real_seq_lens, rank=1, dtypes=INDEX_DTYPES)
        _shape("real_seq_lens", real_seq_lens, (batch,))
    _int("num_kv_splits", num_kv_splits, minimum=1)
    if num_kv_splits > 1 or attn_logits is not None:
        if attn_logits is None:
            raise ValueError(f"attn_logits: a workspace is required when num_kv_splits={num_kv_splits} > 1")
        _tensor("attn_logits", attn_logits, rank=4, dtypes=(torch.float32,))
        if num_kv_splits > 1:
            need = (rows, heads, num_kv_splits, Lv + 1)
            got = tuple(attn_logits.shape)
            if got[0] < rows or got[1] != heads or got[2] != num_kv_splits or got[3] < Lv + 1:
                raise ValueError(
                    f"attn_logits: workspace too small for num_kv_splits={num_kv_splits}: expected "
                    f"[B*qlen, H, num_kv_splits, Lv+1] = {need} (at least), got {got}"
                )
            _inner_contiguous("attn_logits", attn_logits)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (float, int)):
        raise TypeError(f"sm_scale: expected a float, got {type(sm_scale).__name__}")
    if k_scale is not None:
        _tensor("k_scale", k_scale, dtypes=(torch.float32,))
        if k_scale.numel() != 1:
            raise ValueError(f"k_scale: expected a scalar tensor, got shape {tuple(k_scale.shape)}")
    _same_device(
        dev, k_buffer=k_buffer, v_buffer=v_buffer, o=o, lse=lse, req_to_token=req_to_token,
        seq_lens=seq_lens, real_seq_lens=real_seq_lens, attn_logits=attn_logits, k_scale=k_scale,
    )
    return batch, heads, Lk, Lv


def check_warmup_decode_verify(
    q, k_buffer, o, lse, req_to_token, has_real, qlens, attn_logits, sm_scale, page_size,
    k_scale=None,
) -> None:
    """Validate a ``warmup_decode_attention_fwd_verify`` call (row counts are free)."""
    _tensor("q", q, rank=3, dtypes=ACT_DTYPES)
    _cache_layout(k_buffer, page_size)
    if k_buffer.dtype not in FP8_DTYPES and k_buffer.dtype != q.dtype:
        raise TypeError(
            f"k_buffer: expected the dtype of q ({q.dtype}) or an fp8 dtype, got {k_buffer.dtype}"
        )
    Lk = k_buffer.shape[-1]
    if q.shape[2] != Lk:
        raise ValueError(f"q: expected head dim Lk={Lk} (k_buffer.shape[-1]), got shape {tuple(q.shape)}")
    _tensor("o", o, rank=3, dtypes=(q.dtype,))
    Lv = o.shape[-1]
    rope = Lk - Lv
    if not _is_pow2(Lv) or rope < 0 or (rope > 0 and not _is_pow2(rope)):
        raise ValueError(
            f"o: expected Lv with Lk = Lv + rope, both powers of two, got Lk={Lk}, Lv={Lv}"
        )
    if o.shape[1] != q.shape[1]:
        raise ValueError(f"o: expected {q.shape[1]} heads (q.shape[1]), got shape {tuple(o.shape)}")
    _tensor("lse", lse, rank=2, dtypes=(torch.float32,))
    if lse.shape[1] != q.shape[1]:
        raise ValueError(f"lse: expected {q.shape[1]} heads (q.shape[1]), got shape {tuple(lse.shape)}")
    _tensor("req_to_token", req_to_token, rank=2, dtypes=INDEX_DTYPES)
    if not isinstance(has_real, bool):
        raise TypeError(f"has_real: expected a bool, got {type(has_real).__name__}")
    if isinstance(qlens, (int, torch.Tensor)) or len(qlens) == 0:
        raise ValueError(f"qlens: expected a non-empty list of ints, got {qlens!r}")
    for t in qlens:
        _int("qlens", t, minimum=1)
    if attn_logits is not None:
        _tensor("attn_logits", attn_logits, dtypes=(torch.float32,))
    if k_scale is not None:
        _tensor("k_scale", k_scale, dtypes=(torch.float32,))
        if k_scale.numel() != 1:
            raise ValueError(f"k_scale: expected a scalar tensor, got shape {tuple(k_scale.shape)}")
    _same_device(q.device, k_buffer=k_buffer, o=o, lse=lse, req_to_token=req_to_token,
                 attn_logits=attn_logits, k_scale=k_scale)


def _window(name: str, w) -> None:
    if w is None:
        return
    _int(name, w, minimum=0)


def check_context_attention(
    q, k, v, o, b_start_loc, b_seq_len, max_input_len, is_causal=True, softmax_scale=None,
    sliding_window_q=None, sliding_window_k=None, sinks=None,
) -> tuple[int, int, int, int]:
    """Validate a ``context_attention_fwd`` call; returns ``(batch, heads_q, heads_kv, head_dim)``."""
    _tensor("q", q, rank=3, dtypes=ACT_DTYPES)
    for name, t in (("k", k), ("v", v), ("o", o)):
        _tensor(name, t, rank=3, dtypes=(q.dtype,))
    total, hq, d = q.shape
    if k.shape[2] != d:
        raise ValueError(f"k: expected head dim {d} (q.shape[2]), got shape {tuple(k.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if k.shape[0] != total:
        raise ValueError(f"k: expected {total} tokens (q.shape[0]), got shape {tuple(k.shape)}")
    hkv = k.shape[1]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"k: query heads ({hq}) must be a multiple of KV heads ({hkv})")
    _shape("o", o, (total, hq, d))
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
        _inner_contiguous(name, t)
    _tensor("b_start_loc", b_start_loc, rank=1, dtypes=(torch.int32, torch.int64))
    _tensor("b_seq_len", b_seq_len, rank=1, dtypes=(torch.int32, torch.int64))
    if b_start_loc.shape[0] != b_seq_len.shape[0]:
        raise ValueError(
            f"b_seq_len: expected one length per start in b_start_loc ({b_start_loc.shape[0]}), "
            f"got {b_seq_len.shape[0]}"
        )
    _int("max_input_len", max_input_len, minimum=0)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal: expected a bool, got {type(is_causal).__name__}")
    if softmax_scale is not None and (
        isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (float, int))
    ):
        raise TypeError(f"softmax_scale: expected a float or None, got {type(softmax_scale).__name__}")
    _window("sliding_window_q", sliding_window_q)
    _window("sliding_window_k", sliding_window_k)
    if sinks is not None:
        _tensor("sinks", sinks, rank=1, dtypes=ACT_DTYPES)
        _shape("sinks", sinks, (hq,))
    _same_device(q.device, k=k, v=v, o=o, b_start_loc=b_start_loc, b_seq_len=b_seq_len, sinks=sinks)
    return b_seq_len.shape[0], hq, hkv, d
