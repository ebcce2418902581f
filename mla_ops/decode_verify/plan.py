"""Plan once per batch bucket, run per layer: the verify API for serving engines.

A :class:`VerifyPlan` fixes, for one batch bucket (the batch size a CUDA graph is captured
for), everything the positional API leaves to the caller: the launch config the table selects,
the split cap (from that config's own ``BLOCK_H`` and ``SPLIT_WORK``), the split workspace
(owned by the plan), and the SM count it planned for. ``run`` takes
the per-step tensors with the metadata keyword-only (``seq_lens`` and ``real_seq_lens`` cannot
be swapped), checks the call against the plan — another batch bucket, cache dtype, head count
or page size is a clear error — and calls ``torch.ops.mla.decode_verify``, so a compiled model
traces it and a CUDA graph captures it::

    plan = mla_ops.plan_verify(batch=32, qlen=4, num_heads=16, max_seq_len=32768,
                               dtype=torch.bfloat16, kv_dtype=torch.bfloat16,
                               device="cuda", page_size=64)
    plan.alloc_workspace()
    plan.warmup(q, kv_cache, o, lse, block_table, sm_scale=0.1352)   # before capture
    for layer in layers:                                              # per step, per layer
        plan.run(q, kv_cache[layer], o, lse, block_table, seq_lens,
                 real_seq_lens=real, sm_scale=0.1352)

FlashInfer's ``BatchMLAPagedAttentionWrapper`` (plan/run, owned workspace) and FlashMLA's
scheduling metadata (made once, checked on reuse) are the models.

Ragged draft counts (``plan_verify(..., varlen=True)``): ``qlen`` is the most draft rows a
request of the bucket has and ``batch`` the most requests; ``run`` then requires
``qo_indptr`` (``[B+1]`` int32, request b's rows ``q[qo_indptr[b]:qo_indptr[b+1]]``) and q may
have any number of rows up to ``batch * qlen`` (a captured graph keeps one static R; rows from
``qo_indptr[B]`` on are not written). Any plan's ``run`` takes ``tree_mask`` (``[R]`` int64
draft trees). A plan without ``varlen=True`` refuses ``qo_indptr``.
"""

from __future__ import annotations

import dataclasses
import types
import weakref
import torch

from .. import platform
from ..checked import local_length
from ..numerics import FP8_DTYPES
from .gluon_launch import grid_takes
from .launch import launch_config, warmup_decode_attention_fwd_verify
from .splits import verify_num_kv_splits

__all__ = ["VerifyPlan", "plan_verify"]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclasses.dataclass(frozen=True, eq=False)
class VerifyPlan:
    """One batch bucket's launch plan (build it with :func:`plan_verify`).

    Frozen: ``batch`` (the bucket's largest batch), ``qlen``, ``num_heads``, ``max_seq_len``,
    ``dtype`` (of q and o), ``kv_dtype``, ``device``, ``page_size``, ``head_dim`` (Lk),
    ``v_head_dim`` (Lv), ``config`` (read-only mapping), ``num_kv_splits``, ``sm_count``, the
    context-parallel layout and ``varlen`` (ragged draft counts: ``qlen`` the most a request
    has). Batches up to ``batch`` that select the same config run on it.
    """

    batch: int
    qlen: int
    num_heads: int
    max_seq_len: int
    dtype: torch.dtype
    kv_dtype: torch.dtype
    device: torch.device
    page_size: int
    head_dim: int
    v_head_dim: int
    config: types.MappingProxyType
    num_kv_splits: int
    sm_count: int
    cp_world: int = 1
    cp_rank: int = 0
    cp_interleave: int = 1
    varlen: bool = False
    _workspace: list = dataclasses.field(default_factory=lambda: [None], repr=False)
    # The batches of this bucket: up to ``batch``, selecting this config (computed once, so
    # that run() traces under torch.compile without walking the tuning tables).
    batches: frozenset = dataclasses.field(default=frozenset(), repr=False)
    # The (dtype, device, shape) of q and the cache of calls that passed _check: a run with
    # the same ones is not checked again (a set lookup instead of ~20 attribute tests).
    _passed: set = dataclasses.field(default_factory=set, repr=False)
    # [(a weak reference to the cache, its values view, its address)] of the last run (_values_of).
    _v_view: list = dataclasses.field(default_factory=lambda: [None], repr=False)

    @property
    def workspace_shape(self) -> tuple[int, ...] | None:
        """``[batch*qlen, H, num_kv_splits, Lv+1]`` fp32, or None with one split."""
        if self.num_kv_splits == 1:
            return None
        return (self.batch * self.qlen, self.num_heads, self.num_kv_splits, self.v_head_dim + 1)

    @property
    def workspace(self) -> torch.Tensor | None:
        return self._workspace[0]

    def alloc_workspace(self) -> torch.Tensor | None:
        """Allocate (once) and return the split workspace; call it outside any capture."""
        if self.workspace_shape is not None and self._workspace[0] is None:
            self._workspace[0] = torch.empty(self.workspace_shape, dtype=torch.float32,
                                             device=self.device)
        return self._workspace[0]

    def warmup(self, q, kv_cache, o, lse, block_table, *, sm_scale: float,
               k_scale: torch.Tensor | None = None, has_real=(False, True),
               has_tree=None) -> None:
        """Compile every variant :meth:`run` can launch (with and without ``real_seq_lens``,
        and for a ``varlen`` plan with and without ``tree_mask``, unless told: ``has_tree``
        defaults to ``(False, True)`` for a varlen plan, ``False`` otherwise), on scratch
        tensors with these tensors' strides; writes nothing they hold. Allocates the workspace
        and the default ``k_scale``: call it before capturing."""
        self._check(q, kv_cache, o, lse, warm=True)
        self.alloc_workspace()
        if has_tree is None:
            has_tree = (False, True) if self.varlen else False
        trees = has_tree if isinstance(has_tree, (tuple, list)) else (has_tree,)
        for real in (has_real if isinstance(has_real, (tuple, list)) else (has_real,)):
            for tree in trees:
                warmup_decode_attention_fwd_verify(
                    q, kv_cache, o, lse, block_table, bool(real), [self.qlen], self.workspace,
                    sm_scale, self.page_size, k_scale, self.cp_world, self.cp_rank,
                    self.cp_interleave, self.varlen, bool(tree), batches=[self.batch],
                    config=dict(self.config))

    def run(self, q, kv_cache, o, lse, block_table, seq_lens, *, real_seq_lens=None,
            qo_indptr=None, tree_mask=None, k_scale=None, sm_scale: float) -> None:
        """``torch.ops.mla.decode_verify`` with this plan's split cap and workspace (bad
        metadata: as ``decode_attention_fwd_verify`` says, NaN rows for the request).

        Args: q ``[B*qlen, H, Lk]`` (B <= the plan's batch, in its config bucket; a varlen
        plan: ``[R, H, Lk]``, R <= batch*qlen), kv_cache ``[num_pages, page_size, 1, Lk]`` (or
        3-D), o ``[R, H, Lv]`` and lse ``[R, H]`` written, block_table ``[B, max_pages]``
        int32, seq_lens / real_seq_lens ``[B]`` int32, qo_indptr ``[B+1]`` int32 (required by
        a varlen plan, refused by others), tree_mask ``[R]`` int64 or None, k_scale for an fp8
        cache. Raises ValueError/TypeError naming the argument when the call does not match
        the plan (the op then checks everything else).
        """
        self._check(q, kv_cache, o, lse, qo_indptr=qo_indptr)
        if self.num_kv_splits > 1 and self.workspace is None:
            raise RuntimeError("plan: call alloc_workspace() (or warmup()) before run(), "
                               "outside any CUDA-graph capture")
        if qo_indptr is None and tree_mask is None:
            torch.ops.mla.decode_verify(
                q, kv_cache, self._values_of(kv_cache), o, lse, block_table, seq_lens,
                real_seq_lens, self.qlen, self.workspace, self.num_kv_splits, sm_scale,
                self.page_size, k_scale, self.cp_world, self.cp_rank, self.cp_interleave)
        else:
            torch.ops.mla.decode_verify(
                q, kv_cache, self._values_of(kv_cache), o, lse, block_table, seq_lens,
                real_seq_lens, self.qlen, self.workspace, self.num_kv_splits, sm_scale,
                self.page_size, k_scale, self.cp_world, self.cp_rank, self.cp_interleave,
                qo_indptr, tree_mask)

    def _values_of(self, kv_cache: torch.Tensor) -> torch.Tensor:
        """The latent's first Lv columns: one view per cache (an eager call saves making it),
        made afresh under tracing (no address to compare)."""
        if torch.compiler.is_compiling():
            return kv_cache[..., :self.v_head_dim]
        seen = self._v_view[0]
        if seen is None or seen[0]() is not kv_cache or seen[2] != kv_cache.data_ptr():
            seen = self._v_view[0] = (weakref.ref(kv_cache), kv_cache[..., :self.v_head_dim],
                                      kv_cache.data_ptr())
        return seen[1]

    def _check(self, q, kv_cache, o, lse, warm: bool = False, qo_indptr=None) -> None:
        if not warm and (qo_indptr is None) == self.varlen:
            if self.varlen:
                raise ValueError("qo_indptr: this plan was made with varlen=True (ragged draft "
                                 "counts): run() requires qo_indptr, [B+1] int32 row offsets")
            raise ValueError("qo_indptr: this plan was made without varlen=True; plan the "
                             "bucket with plan_verify(..., varlen=True) for ragged draft counts")
        seen = None
        if not warm and type(q) is torch.Tensor and type(kv_cache) is torch.Tensor:
            seen = (q.dtype, q.device, q.shape, kv_cache.dtype, kv_cache.device, kv_cache.shape,
                    None if qo_indptr is None or type(qo_indptr) is not torch.Tensor
                    else qo_indptr.shape)
            if seen in self._passed:
                return
        self._check_all(q, kv_cache, o, lse, warm, qo_indptr)
        if seen is not None and len(self._passed) < 64:
            self._passed.add(seen)

    def _check_all(self, q, kv_cache, o, lse, warm: bool, qo_indptr=None) -> None:
        for name, t in (("q", q), ("kv_cache", kv_cache), ("o", o), ("lse", lse)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if q.dtype != self.dtype:
            raise TypeError(f"q: dtype {_name(q.dtype)}, but the plan was made for "
                            f"{_name(self.dtype)}")
        if kv_cache.dtype != self.kv_dtype:
            raise TypeError(f"kv_cache: dtype {_name(kv_cache.dtype)}, but the plan was made "
                            f"for a {_name(self.kv_dtype)} cache")
        if q.device != self.device or kv_cache.device != self.device:
            bad = "q" if q.device != self.device else "kv_cache"
            raise ValueError(f"{bad}: on {(q if bad == 'q' else kv_cache).device}, but the plan "
                             f"was made for {self.device}")
        if q.dim() != 3 or q.shape[1] != self.num_heads or q.shape[2] != self.head_dim:
            raise ValueError(f"q: expected [B*{self.qlen}, {self.num_heads}, {self.head_dim}] as "
                             f"planned, got shape {tuple(q.shape)}")
        if kv_cache.dim() == 4 and kv_cache.shape[1] != self.page_size:
            raise ValueError(f"kv_cache: pages of {kv_cache.shape[1]} tokens, but the plan was "
                             f"made for pages of {self.page_size}")
        if warm:
            return
        rows = q.shape[0]
        if self.varlen:
            if not isinstance(qo_indptr, torch.Tensor) or qo_indptr.dim() != 1:
                raise ValueError(f"qo_indptr: expected a 1-D tensor of [B+1] row offsets, got "
                                 f"{getattr(qo_indptr, 'shape', type(qo_indptr).__name__)}")
            if rows > self.batch * self.qlen:
                raise ValueError(f"q: {rows} rows exceed the plan's {self.batch} requests of at "
                                 f"most {self.qlen} draft rows ({self.batch * self.qlen}); plan "
                                 f"the larger bucket")
            batch = qo_indptr.shape[0] - 1
            if batch > self.batch:
                raise ValueError(f"qo_indptr: a batch of {batch} requests exceeds the plan's "
                                 f"{self.batch}; plan the larger bucket")
            if batch > 0 and batch not in self.batches:
                raise ValueError(
                    f"qo_indptr: a batch of {batch} requests selects another launch config than "
                    f"the plan's bucket (planned for a batch of {self.batch}); plan one bucket "
                    f"per captured batch size")
            return
        if rows % self.qlen:
            raise ValueError(f"q: {rows} rows is not a whole number of requests of qlen "
                             f"{self.qlen}")
        batch = rows // self.qlen
        if batch > self.batch:
            raise ValueError(f"q: a batch of {batch} requests exceeds the plan's {self.batch}; "
                             f"plan the larger bucket")
        if batch and batch not in self.batches:
            raise ValueError(
                f"q: a batch of {batch} requests selects another launch config than the plan's "
                f"bucket (planned for a batch of {self.batch}); plan one bucket per captured "
                f"batch size")


def plan_verify(batch: int, qlen: int, num_heads: int, max_seq_len: int, *,
                dtype: torch.dtype, kv_dtype: torch.dtype | None = None,
                device: torch.device | str = "cuda", page_size: int, head_dim: int = 576,
                v_head_dim: int = 512, sm_count: int | None = None,
                num_kv_splits: int | None = None, cp_world: int = 1, cp_rank: int = 0,
                cp_interleave: int = 1, varlen: bool = False) -> VerifyPlan:
    """Plan a batch bucket: the config the table selects for ``batch`` requests of ``qlen``
    verify tokens and ``num_heads`` heads, the split cap for sequences up to ``max_seq_len``
    keys (on this rank, with context parallelism) on ``sm_count`` SMs (default: this GPU's),
    and the workspace shape. ``num_kv_splits`` overrides the split cap. ``varlen``: ragged
    draft counts, up to ``qlen`` per request (``run`` then requires ``qo_indptr``)."""
    for name, v in (("batch", batch), ("qlen", qlen), ("num_heads", num_heads),
                    ("max_seq_len", max_seq_len), ("page_size", page_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    # launch_config reads the cache's dtype, device and head dim only.
    probe = torch.empty(0, 1, head_dim, dtype=kv_dtype, device=device)
    cfg = launch_config(batch, qlen, num_heads, probe, v_head_dim, q_dtype=dtype,
                        page_size=page_size)
    sm_count = platform.current().sm_count if sm_count is None else sm_count
    local_max = int(local_length(torch.tensor(max_seq_len), cp_world, cp_rank, cp_interleave))
    if num_kv_splits is None:
        num_kv_splits = verify_num_kv_splits(max(1, local_max), batch, qlen, num_heads, sm_count,
                                             block_h=cfg["BLOCK_H"],
                                             min_work_per_split=cfg["SPLIT_WORK"],
                                             balance=cfg.get("BALANCE", 0),
                                             grid=grid_takes(cfg, qlen, num_heads, fp8=kv_dtype in FP8_DTYPES,
                                                             tree=False, ragged=varlen,
                                                             context_parallel=cp_world > 1, single=False))
    same = frozenset(b for b in range(1, batch + 1) if b == batch or launch_config(
        b, qlen, num_heads, probe, v_head_dim, q_dtype=dtype, page_size=page_size) == cfg)
    if not isinstance(varlen, bool):
        raise TypeError(f"varlen: expected a bool, got {type(varlen).__name__}")
    return VerifyPlan(batch, qlen, num_heads, max_seq_len, dtype, kv_dtype, device, page_size,
                      head_dim, v_head_dim, types.MappingProxyType(dict(cfg)), num_kv_splits,
                      sm_count, cp_world, cp_rank, cp_interleave, varlen, batches=same)

