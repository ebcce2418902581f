"""Draft trees as ``decode_attention_fwd_verify``'s ``tree_mask``: from parent arrays, and the
tree shapes tests and benchmarks draw (EAGLE's, random ones).

A request's draft tree of ``n`` tokens is given by its parents: ``parents[i]`` is the draft
token that token ``i`` continues, ``-1`` for one that continues the verified prefix (the root,
in EAGLE's layout the last verified token itself). Token ``i`` sees itself and its ancestors,
so bit ``j`` of its mask is set when ``j`` is ``i`` or an ancestor of ``i``. Tokens may be
numbered in any order (the kernels test bits, they do not walk the tree); engines lay them out
parents first. Everything here is host-side Python run once per step on the host (an engine
builds its masks on the device however it likes).
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["masks_from_parents", "tree_mask_from_parents", "chain_parents", "random_parents",
           "eagle_parents"]

MAX_DRAFTS = 64  # the bits of one int64


def masks_from_parents(parents: Sequence[int]) -> list[int]:
    """The ``n`` masks (Python ints, bit j: sees draft token j) of one request's tree."""
    n = len(parents)
    if n > MAX_DRAFTS:
        raise ValueError(f"parents: a tree of at most {MAX_DRAFTS} draft tokens, got {n}")
    masks: list[int | None] = [None] * n

    def mask(i: int, depth: int = 0) -> int:
        if depth > n:
            raise ValueError(f"parents: a cycle through draft token {i}")
        if masks[i] is None:
            p = parents[i]
            if not -1 <= p < n or p == i:
                raise ValueError(f"parents: draft token {i} has parent {p}; expected -1 or "
                                 f"another of the {n} tokens")
            masks[i] = (1 << i) | (0 if p < 0 else mask(p, depth + 1))
        return masks[i]

    return [mask(i) for i in range(n)]


def tree_mask_from_parents(parents: Sequence[Sequence[int]], *, rows: int | None = None,
                           device: torch.device | str | None = None) -> torch.Tensor:
    """``tree_mask`` ``[rows]`` int64 of a batch: request b's rows (``len(parents[b])`` of them,
    laid one request after another, as ``qo_indptr`` lays them) hold its tree's masks; rows past
    them (``rows`` defaults to their count) hold 0. Bit 63 is the sign bit."""
    masks = [m for p in parents for m in masks_from_parents(p)]
    rows = len(masks) if rows is None else rows
    if rows < len(masks):
        raise ValueError(f"rows: {rows} rows hold fewer than the trees' {len(masks)} tokens")
    signed = [m - (1 << 64) if m >= 1 << 63 else m for m in masks]
    return torch.tensor(signed + [0] * (rows - len(masks)), dtype=torch.int64, device=device)


def chain_parents(n: int) -> list[int]:
    """The causal chain: token i continues token i - 1 (what ``tree_mask=None`` means)."""
    return list(range(-1, n - 1))


def random_parents(n: int, generator: torch.Generator | None = None,
                   shuffle: bool = False) -> list[int]:
    """``n`` tokens, each continuing a random earlier one (token 0 the root); ``shuffle``
    numbers them in a random order (a parent may then come after its child)."""
    parents = [-1] + [int(torch.randint(0, i, (), generator=generator)) for i in range(1, n)]
    if n == 0:
        return []
    if not shuffle or n < 2:
        return parents
    perm = torch.randperm(n, generator=generator).tolist()  # the new index of token i
    out = [0] * n
    for i, p in enumerate(parents):
        out[perm[i]] = -1 if p < 0 else perm[p]
    return out


def eagle_parents(topk: int, depth: int, n: int, generator: torch.Generator | None = None
                  ) -> list[int]:
    """An EAGLE draft tree of ``n`` tokens, SGLang's shape: the root (the last verified
    token), ``topk`` candidates under it, and at each further level ``topk`` children under
    each of the ``topk`` best candidates of the level above, ``depth`` levels of candidates in
    all; then the ``n`` best nodes by cumulative score (a child never scores above its parent,
    so every chosen node's ancestors are chosen), parents first, as SGLang's
    ``build_tree_kernel_efficient`` lays them out. Scores are random."""
    parents, scores, level = [-1], [0.0], [0]
    frontier = [0]
    for d in range(1, depth + 1):
        children = []
        for p in frontier:
            for logp in torch.rand(topk, generator=generator).clamp_min(1e-6).log().tolist():
                parents.append(p)
                scores.append(scores[p] + logp)
                level.append(d)
                children.append(len(parents) - 1)
        frontier = sorted(children, key=lambda c: -scores[c])[:topk]
    if not 1 <= n <= len(parents):
        raise ValueError(f"n: a topk {topk} x depth {depth} tree has 1 to {len(parents)} "
                         f"nodes, got {n}")
    keep = sorted(sorted(range(len(parents)), key=lambda i: (-scores[i], i))[:n],
                  key=lambda i: (level[i], i))
    index = {old: new for new, old in enumerate(keep)}
    return [-1 if parents[i] < 0 else index[parents[i]] for i in keep]
