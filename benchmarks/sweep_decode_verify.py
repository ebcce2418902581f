#!/usr/bin/env python
"""Sweep the decode-verify launch space on this GPU and write the table ``configs.py`` reads.

A retune is a data change: this script measures, then rewrites
``mla_ops/decode_verify/tables/<arch>.json`` (``--write``); no code changes.

Table format (what ``mla_ops/decode_verify/configs.py`` reads)
---------------------------------------------------------------
::

    {
      "arch": "sm_90",
      "source": "<what measured it: script, GPU, torch, triton, date, coverage>",
      "buckets": [
        {"num_heads": [1, 2, 4, 8, 16, 32], "qlen": [2], "max_rows": 128,
         "config": {"BLOCK_H": 64, "BLOCK_N": 32, "num_warps": 8, "num_stages": 3, "QSPLIT": 0,
                    "SPLIT_ALIGN": 64, "MIN_SPLIT_LEN": 256, "S2_BLOCK_S": 16,
                    "s2_num_warps": 4},
         "measured": true, "points": [...]},
        ...,
        {"config": {...}, "measured": true, "points": [...]}
      ],
      "sweep": {...}
    }

Selection: ``rows = batch * qlen * num_heads``; the first bucket whose filters all hold gives
the config (laid over ``VERIFY_DEFAULT_CONFIG``). Filters, each optional: ``max_rows`` (rows <=
max_rows; null: any), ``num_heads`` (num_heads in the list), ``qlen`` (qlen in the list). The
last bucket has no filter and matches every launch. Every ``config`` is complete (all nine
keys). Other keys (``measured``, ``points`` — the evidence: per grid point the time of the
chosen config, the best time measured there and their ratio —, the top-level ``sweep`` record
with env, grid and split findings) are for people and are ignored by the selection.

Buckets are built per heads group (``--heads-groups``) x qlen group (``--qlen-groups``) x batch
bin (one bin per batch size of the grid, edges at geometric midpoints, expressed as
``max_rows`` with the group's grid heads and largest grid qlen), then merged where neighbours
chose the same config. Each bucket takes the config with the best geometric mean of
``time / best time at that point`` over its grid points (bf16 and fp8 caches alike, since the
selection does not see the cache dtype), timed at the split count ``verify_num_kv_splits``
gives for that config's ``BLOCK_H`` (what the benchmark and serving pass). A bucket with no
measurement keeps the config the current table selects (``"measured": false``).

Search (stages, pruned, each candidate checked before it is timed):

1. ``default``  the selected config on the tile points (the ANCHORS shapes M1–M7 and two more);
2. ``tile``     BLOCK_H x BLOCK_N x num_warps (3 x 3 x 2) on the tile points;
3. ``pipeline`` num_stages x QSPLIT around the two best tiles of each tile point;
4. ``splitlen`` MIN_SPLIT_LEN where it changes the chunking; ``s2block``, ``s2warps``: the
   stage-2 merge (only where there is more than one split);
5. ``splits``   split counts around ``verify_num_kv_splits`` (reported as findings; the table
   cannot carry a split count, see ``sweep.split_findings``);
6. ``grid``     every grid point (H 16/128 x qlen 1/2/4/8 x (B, L) in (1, 8k), (32, 4k),
   (128, 4k), (16, 32k) x bf16/fp8) with its selected config and the best configs of the
   nearest tile points.

Every candidate's output is compared with the selected config's (itself compared with the fp32
reference on the tile points) once; a wrong answer is discarded. A config that fails to compile
or exceeds shared memory is skipped: worker processes (``--jobs``) compile every variant of a
stage in parallel and report failures, so this process only runs variants that ran there. The
time budget (``--budget-s``) covers everything; what did not fit is left for ``--resume`` with
the log of this run. The table and the log are rewritten after every stage.

On the H200 (from the repository root; the device machine returns only what is under $OUT)::

    PYTHONPATH=. python benchmarks/sweep_decode_verify.py --budget-s 240 \
        --write $OUT/sm_90.json --log $OUT/sweep_log.json
    # continue where the budget stopped it (copy the log into the tree first):
    PYTHONPATH=. python benchmarks/sweep_decode_verify.py --resume sweep_log.json \
        --write $OUT/sm_90.json --log $OUT/sweep_log.json

Compiles dominate: the full space is about 300 distinct kernel variants plus a few hundred timed
runs, likely more than one 240 s budget; ``--quick`` (M1–M7 only, a smaller space) is about a
third of that. Either way each stage's table is written as soon as it is measured, and a run cut
by the budget says so (``sweep.complete: false`` in the table) and continues with ``--resume``.

On a CPU, ``--interpret`` sweeps a tiny space on a tiny shape through the Triton interpreter
(no table is written unless ``--write`` is given).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import pathlib
import sys
import time
from typing import Any, Callable, Iterable, Sequence

if "--interpret" in sys.argv[1:]:
    os.environ["TRITON_INTERPRET"] = "1"

_ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402

from benchmarks import benchmark_decode_verify as bench  # noqa: E402
from benchmarks.benchmark_decode_verify import LAUNCH_KEYS, Case  # noqa: E402
from mla_ops.decode_verify.configs import MIN_SWAP_AB_STAGES  # noqa: E402
from mla_ops.decode_verify.configs import VERIFY_DEFAULT_CONFIG  # noqa: E402

HIP_KEYS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
TABLE_DIR = _ROOT / "mla_ops" / "decode_verify" / "tables"

GRID_HEADS = (16, 128)
GRID_QLENS = (1, 2, 4, 8)
GRID_BL = ((1, 8192), (32, 4096), (128, 4096), (16, 32768))
# Tile points beyond M1–M7: the longest draft and single-token decode at H=16.
EXTRA_TILE_POINTS = (Case(16, 8, 32, 4096, False), Case(16, 1, 128, 4096, False))
DEFAULT_HEADS_GROUPS = "1,2,4,8,16,32/64,128,256"
DEFAULT_QLEN_GROUPS = "1/2/3,4/" + ",".join(str(q) for q in range(5, 17))


@dataclasses.dataclass(frozen=True)
class Space:
    """The launch space the stages explore."""

    BLOCK_H: tuple = (16, 32, 64)
    BLOCK_N: tuple = (16, 32, 64)
    num_warps: tuple = (4, 8)
    num_stages: tuple = (1, 2, 3, 4)
    QSPLIT: tuple = (0, 1)
    MIN_SPLIT_LEN: tuple = (64, 128, 256, 512)
    S2_BLOCK_S: tuple = (4, 8, 16, 32)
    s2_num_warps: tuple = (1, 2, 4, 8)
    # Swap-AB tiles (rows as wgmma's N): one warpgroup, small row tiles, BLOCK_N as M.
    swap_ab_tiles: tuple = ((16, 64, 4), (32, 32, 4), (32, 64, 4))  # (BLOCK_H, BLOCK_N, warps)
    # Launch features (v3): K tiles by TMA (16-bit caches only: fp8 falls back), the
    # persistent grid, stage 2 split by columns, stage 2 by programmatic dependent launch.
    TMA: tuple = (0, 1)
    PERSISTENT: tuple = (0, 1)
    S2_BLOCK_DV: tuple = (0, 64)
    PDL: tuple = (0, 1)
    split_factors: tuple = (0.5, 2, 4)  # around verify_num_kv_splits (plus 1 split)
    pipeline_top: int = 2  # tiles of each tile point whose stages / QSPLIT are explored
    grid_candidates: int = 3  # best configs of the nearest tile points tried per grid point
    anchors_only: bool = False  # tile points: M1–M7 only


# About a third of the full sweep's compiles: fits one 240 s budget more surely.
QUICK_SPACE = Space(BLOCK_H=(32, 64), BLOCK_N=(32, 64), num_warps=(4, 8), num_stages=(1, 2, 3),
                    QSPLIT=(0, 1), MIN_SPLIT_LEN=(128, 256, 512), S2_BLOCK_S=(8, 16),
                    s2_num_warps=(2, 4), split_factors=(0.5, 2), pipeline_top=1,
                    grid_candidates=2, anchors_only=True)


INTERPRET_SPACE = Space(BLOCK_H=(16, 32), BLOCK_N=(16,), num_warps=(4,), num_stages=(1, 2),
                        swap_ab_tiles=((16, 16, 4),),
                        QSPLIT=(0, 1), MIN_SPLIT_LEN=(16, 64), S2_BLOCK_S=(2, 8),
                        s2_num_warps=(4,), split_factors=(2,), pipeline_top=2,
                        grid_candidates=1, S2_BLOCK_DV=(0, 16))

STAGES = ("default", "tile", "pipeline", "features", "splitlen", "s2block", "s2warps", "pdl",
          "splits", "grid")


def point_key(p: Case) -> str:
    return f"H{p.H}-q{p.qlen}-B{p.B}-L{p.L}-{'fp8' if p.fp8 else 'bf16'}-p{p.page_size}"


def config_key(cfg: dict) -> str:
    return json.dumps(cfg, sort_keys=True)


def grid_points(heads=GRID_HEADS, qlens=GRID_QLENS, bl=GRID_BL, caches=(False, True),
                page_size=bench.DEFAULT_PAGE_SIZE) -> list[Case]:
    """The representative grid, each ANCHORS shape carrying its name."""
    named = {(s.case.H, s.case.qlen, s.case.B, s.case.L, s.case.fp8): n for n, s in bench.SHAPES.items()}
    pts = []
    for h, q, (b, L), fp8 in itertools.product(heads, qlens, bl, caches):
        name = named.get((h, q, b, L, fp8)) if page_size == bench.DEFAULT_PAGE_SIZE else None
        pts.append(Case(h, q, b, L, fp8, page_size, name))
    return pts


def tile_points(grid: list[Case], anchors_only: bool = False) -> list[Case]:
    """The grid's ANCHORS shapes plus ``EXTRA_TILE_POINTS``; the whole grid if it has none."""
    page = grid[0].page_size if grid else bench.DEFAULT_PAGE_SIZE
    extra = set() if anchors_only else {
        point_key(dataclasses.replace(c, page_size=page)) for c in EXTRA_TILE_POINTS}
    pts = [p for p in grid if p.name or point_key(p) in extra]
    return pts or list(grid)


def parse_groups(text: str) -> list[list[int]]:
    """``"1,2,4/8,16"`` -> ``[[1, 2, 4], [8, 16]]``."""
    groups = [[int(v) for v in g.split(",") if v.strip()] for g in text.split("/")]
    groups = [g for g in groups if g]
    flat = [v for g in groups for v in g]
    if len(flat) != len(set(flat)):
        raise ValueError(f"groups {text!r}: a value appears twice")
    if any(v < 1 for v in flat):
        raise ValueError(f"groups {text!r}: values must be >= 1")
    return groups


def group_of(value: int, groups: list[list[int]]) -> int | None:
    for i, g in enumerate(groups):
        if value in g:
            return i
    return None


# --- results ------------------------------------------------------------------------------------


class Results:
    """Every measured (point, config, split count), as log records."""

    def __init__(self, records: Iterable[dict] = ()):
        self.records: list[dict] = []
        self._index: dict[tuple, dict] = {}
        for r in records:
            self.add(r)

    @staticmethod
    def key(pkey: str, cfg: dict, splits: int) -> tuple:
        return (pkey, config_key(cfg), int(splits))

    def add(self, rec: dict) -> None:
        k = self.key(rec["point"], rec["config"], rec["splits"])
        if k in self._index:
            self.records.remove(self._index[k])
        self._index[k] = rec
        self.records.append(rec)

    def has(self, pkey: str, cfg: dict, splits: int) -> bool:
        return self.key(pkey, cfg, splits) in self._index

    def timed(self, pkey: str, heuristic_only: bool = True) -> list[dict]:
        """ok records of a point, fastest first."""
        out = [r for r in self.records if r["point"] == pkey and r["status"] == "ok"
               and (r.get("heuristic") or not heuristic_only)]
        return sorted(out, key=lambda r: r["time_us"])

    def top(self, pkey: str, n: int) -> list[dict]:
        """The n fastest distinct configs of a point at their default split count."""
        seen, out = set(), []
        for r in self.timed(pkey):
            k = config_key(r["config"])
            if k not in seen:
                seen.add(k)
                out.append(r["config"])
            if len(out) == n:
                break
        return out

    def point_times(self, pkey: str) -> dict[str, float]:
        """config key -> time µs at the default split count."""
        out: dict[str, float] = {}
        for r in self.timed(pkey):
            out.setdefault(config_key(r["config"]), r["time_us"])
        return out


# --- planning: what each stage measures, from what the earlier ones found ----------------------

Task = tuple  # (point, config, splits, heuristic)


def plan_stage(stage: str, tiles: list[Case], grid: list[Case], res: Results,
               defaults: Callable[[Case], dict], splits_of: Callable[[Case, int], int],
               space: Space, sm_count: int, heads_groups: list[list[int]],
               qlen_groups: list[list[int]] | None = None) -> list[Task]:
    """The (point, config, splits, heuristic) tasks of ``stage`` not measured yet.

    The grid stage measures, at every point of a table bucket's bin (heads group, qlen group,
    batch), the nearest winners of all of the bin's points, so that the configs the table
    compares for that bin were timed on each of its points (a winner timed on one point only
    cannot be chosen for the bin).
    """
    tasks: list[Task] = []
    bin_candidates: dict[tuple, list[dict]] = {}
    if stage == "grid":
        def bin_of(q: Case) -> tuple:
            return (group_of(q.H, heads_groups),
                    group_of(q.qlen, qlen_groups) if qlen_groups else q.qlen, q.B)

        for q in grid:
            cands = bin_candidates.setdefault(bin_of(q), [])
            for c in nearest_winners(q, tiles, res, heads_groups, space.grid_candidates):
                if c not in cands:
                    cands.append(c)

    def add(p, cfg, splits=None):
        heuristic = splits is None
        s = splits_of(p, cfg["BLOCK_H"]) if heuristic else splits
        if not res.has(point_key(p), cfg, s):
            tasks.append((p, cfg, s, heuristic))

    for p in (grid if stage == "grid" else tiles):
        pk = point_key(p)
        best = res.top(pk, 1)
        if stage == "default":
            add(p, defaults(p))
        elif stage == "tile":
            for bh, bn, nw in itertools.product(space.BLOCK_H, space.BLOCK_N, space.num_warps):
                add(p, {**defaults(p), "BLOCK_H": bh, "BLOCK_N": bn, "num_warps": nw,
                        "SWAP_AB": 0})
            for bh, bn, nw in space.swap_ab_tiles:
                add(p, {**defaults(p), "BLOCK_H": bh, "BLOCK_N": bn, "num_warps": nw,
                        "SWAP_AB": 1, "num_stages": 2})
        elif stage == "pipeline":
            for c in res.top(pk, space.pipeline_top):
                for ns, qs in itertools.product(space.num_stages, space.QSPLIT):
                    if c.get("SWAP_AB") and ns < MIN_SWAP_AB_STAGES:
                        continue  # the launcher refuses it (see configs.MIN_SWAP_AB_STAGES)
                    add(p, {**c, "num_stages": ns, "QSPLIT": qs})
        elif stage == "features":
            for c in res.top(pk, space.pipeline_top):
                for tma, pers, qs in itertools.product(space.TMA, space.PERSISTENT, space.QSPLIT):
                    if tma and p.fp8:
                        continue  # the launcher takes fp8 caches through the pointer path
                    add(p, {**c, "TMA": tma, "PERSISTENT": pers, "QSPLIT": qs})
        elif best and stage in ("splitlen", "s2block", "s2warps", "pdl", "splits"):
            c = best[0]
            s = splits_of(p, c["BLOCK_H"])
            if stage == "splitlen":
                # MIN_SPLIT_LEN only matters where it lengthens the chunks cdiv(L, splits).
                if s > 1 and math.ceil(p.L / s) < max(space.MIN_SPLIT_LEN):
                    for m in space.MIN_SPLIT_LEN:
                        add(p, {**c, "MIN_SPLIT_LEN": m})
            elif stage == "s2block" and s > 1:
                for b, dv in itertools.product(space.S2_BLOCK_S, space.S2_BLOCK_DV):
                    add(p, {**c, "S2_BLOCK_S": b, "S2_BLOCK_DV": dv})
            elif stage == "s2warps" and s > 1:
                for w in space.s2_num_warps:
                    add(p, {**c, "s2_num_warps": w})
            elif stage == "pdl" and s > 1:
                for v in space.PDL:
                    add(p, {**c, "PDL": v})
            elif stage == "splits":
                for n in sorted({1, *(int(s * f) for f in space.split_factors)}):
                    n = max(1, min(n, 2 * sm_count))
                    if n != s:
                        add(p, c, splits=n)
        elif stage == "grid":
            add(p, defaults(p))
            for c in bin_candidates[bin_of(p)]:
                add(p, c)
    # one task per key, points kept together
    seen, out = set(), []
    for t in tasks:
        k = Results.key(point_key(t[0]), t[1], t[2])
        if k not in seen:
            seen.add(k)
            out.append(t)
    order = {point_key(p): i for i, p in enumerate(grid + tiles)}
    return sorted(out, key=lambda t: order.get(point_key(t[0]), 0))


def nearest_winners(p: Case, tiles: list[Case], res: Results, heads_groups: list[list[int]],
                    n: int) -> list[dict]:
    """Best configs of the tile points nearest to ``p`` (same heads group, then qlen, cache,
    batch), distinct, at most n."""
    g = group_of(p.H, heads_groups)

    def dist(t: Case) -> tuple:
        return (group_of(t.H, heads_groups) != g, abs(math.log2(t.qlen) - math.log2(p.qlen)),
                t.fp8 != p.fp8, abs(math.log2(t.B) - math.log2(p.B)))

    out, seen = [], set()
    for t in sorted(tiles, key=dist):
        if group_of(t.H, heads_groups) != g:
            continue
        for c in res.top(point_key(t), 1):
            k = config_key(c)
            if k not in seen:
                seen.add(k)
                out.append(c)
        if len(out) >= n:
            break
    return out


# --- the table ----------------------------------------------------------------------------------


def batch_bins(batches: Sequence[int]) -> list[tuple[int, int | None]]:
    """``(batch, upper edge)`` per grid batch size; edges at geometric midpoints, the last
    open."""
    bs = sorted(set(batches))
    out = []
    for i, b in enumerate(bs):
        hi = int(math.sqrt(b * bs[i + 1])) if i + 1 < len(bs) else None
        out.append((b, hi))
    return out


def choose_config(points: list[Case], res: Results, prefer: dict | None) -> tuple[dict | None, list[dict]]:
    """The config with the best geometric mean of time/best over ``points`` (only configs timed
    on the most of them compete; ``prefer`` wins ties). ``(None, [])`` with no measurement."""
    times = {point_key(p): res.point_times(point_key(p)) for p in points}
    times = {k: v for k, v in times.items() if v}
    if not times:
        return None, []
    cover: dict[str, list[str]] = {}
    for pk, t in times.items():
        for ck in t:
            cover.setdefault(ck, []).append(pk)
    most = max(len(v) for v in cover.values())
    pref = config_key(prefer) if prefer else None

    def score(ck):
        logs = [math.log(times[pk][ck] / min(times[pk].values())) for pk in cover[ck]]
        return (math.exp(sum(logs) / len(logs)), ck != pref, ck)

    best = min((ck for ck, pks in cover.items() if len(pks) == most), key=score)
    evidence = []
    for pk, t in sorted(times.items()):
        row = {"point": pk, "best_us": round(min(t.values()), 3), "candidates": len(t)}
        if best in t:
            row.update(time_us=round(t[best], 3), ratio=round(t[best] / min(t.values()), 4))
        evidence.append(row)
    return json.loads(best), evidence


def build_table(grid: list[Case], res: Results, defaults: Callable[[Case], dict],
                heads_groups: list[list[int]], qlen_groups: list[list[int]], arch: str,
                source: str, sweep_info: dict | None = None) -> dict:
    """The table (see the module docstring) from the measurements in ``res``."""
    buckets: list[dict] = []
    for hg in heads_groups:
        hpts = [p for p in grid if p.H in hg]
        if not hpts:
            continue
        h_rep = max(p.H for p in hpts)
        per_qgroup = []
        for qg in qlen_groups:
            qpts = [p for p in hpts if p.qlen in qg]
            if not qpts:
                continue
            q_rep = max(p.qlen for p in qpts)
            fine = []
            for b, hi in batch_bins([p.B for p in qpts]):
                pts = [p for p in qpts if p.B == b]
                cfg, evidence = choose_config(pts, res, defaults(pts[0]))
                measured = cfg is not None
                if cfg is None:
                    cfg = defaults(pts[0])
                fine.append({"num_heads": list(hg), "qlen": list(qg),
                             "max_rows": None if hi is None else hi * q_rep * h_rep,
                             "config": cfg, "measured": measured, "points": evidence})
            # neighbours in batch with the same config merge into the upper one
            merged: list[dict] = []
            for bk in fine:
                if merged and merged[-1]["config"] == bk["config"]:
                    bk = {**bk, "measured": bk["measured"] or merged[-1]["measured"],
                          "points": merged[-1]["points"] + bk["points"]}
                    merged[-1] = bk
                else:
                    merged.append(bk)
            per_qgroup.append(merged)
        # qlen groups that each reduced to one bucket with the same config merge
        out: list[list[dict]] = []
        for m in per_qgroup:
            if (out and len(m) == 1 and len(out[-1]) == 1
                    and out[-1][0]["config"] == m[0]["config"]):
                prev = out[-1][0]
                out[-1] = [{**prev, "qlen": prev["qlen"] + m[0]["qlen"],
                            "measured": prev["measured"] or m[0]["measured"],
                            "points": prev["points"] + m[0]["points"]}]
            else:
                out.append(m)
        buckets.extend(b for m in out for b in m)
    cfg, evidence = choose_config(grid, res, None)
    measured = cfg is not None
    if cfg is None:
        cfg = defaults(max(grid, key=lambda p: p.B * p.qlen * p.H))
    # A group's trailing buckets that chose the catch-all's config are redundant: the launches
    # they match fall through to it (buckets of other groups never match them).
    pruned = list(buckets)
    for i in range(len(pruned) - 1, -1, -1):
        bk = pruned[i]
        nxt = pruned[i + 1] if i + 1 < len(pruned) else None
        last_of_group = nxt is None or (nxt["num_heads"], nxt["qlen"]) != (bk["num_heads"], bk["qlen"])
        if last_of_group and bk["config"] == cfg:
            del pruned[i]
    buckets = pruned
    buckets.append({"config": cfg, "measured": measured, "points": evidence})
    order = ["num_heads", "qlen", "max_rows", "config", "measured", "points"]
    buckets = [{k: bk[k] for k in order if k in bk} for bk in buckets]  # filters first
    for bk in buckets:
        bk["config"] = ordered_config(bk["config"])
    table = {"arch": arch, "source": source, "buckets": buckets}
    if sweep_info is not None:
        table["sweep"] = sweep_info
    validate_table(table)
    return table


def ordered_config(cfg: dict) -> dict:
    """The config completed with the defaults of keys it lacks (a table written before a key
    existed), its keys in LAUNCH_KEYS order (then HIP keys, then any other)."""
    cfg = {**VERIFY_DEFAULT_CONFIG, **cfg}
    keys = [k for k in (*LAUNCH_KEYS, *HIP_KEYS) if k in cfg]
    keys += sorted(k for k in cfg if k not in keys)
    return {k: cfg[k] for k in keys}


def format_table(table: dict) -> str:
    """JSON text of a table, one line per config and per evidence row (``json.loads`` gives the
    table back)."""
    one = lambda v: json.dumps(v)  # noqa: E731
    lines = ["{"]
    head = [k for k in table if k not in ("buckets", "sweep")]
    for k in head:
        lines.append(f"  {one(k)}: {one(table[k])},")
    lines.append('  "buckets": [')
    for i, bk in enumerate(table["buckets"]):
        parts = []
        filters = [f"{one(k)}: {one(bk[k])}" for k in ("num_heads", "qlen", "max_rows") if k in bk]
        if filters:
            parts.append("    " + ", ".join(filters))
        for k, v in bk.items():
            if k in ("num_heads", "qlen", "max_rows"):
                continue
            if k == "points" and v:
                rows = ",\n".join(f"      {one(r)}" for r in v)
                parts.append(f"    {one(k)}: [\n{rows}\n    ]")
            else:
                parts.append(f"    {one(k)}: {one(v)}")
        end = "," if i + 1 < len(table["buckets"]) else ""
        lines.append("   {\n" + ",\n".join(parts) + "\n   }" + end)
    lines.append("  ]" + ("," if "sweep" in table else ""))
    if "sweep" in table:
        body = json.dumps(table["sweep"], indent=1).replace("\n", "\n  ")
        lines.append(f'  "sweep": {body}')
    lines.append("}")
    return "\n".join(lines) + "\n"


def validate_table(table: dict) -> None:
    """What configs.py requires of a table; raises ValueError."""
    buckets = table.get("buckets")
    if not buckets:
        raise ValueError("table: no buckets")
    if any(buckets[-1].get(k) is not None for k in ("max_rows", "num_heads", "qlen")):
        raise ValueError("table: the last bucket must match every launch (no filters)")
    for i, b in enumerate(buckets):
        cfg = b.get("config")
        if not isinstance(cfg, dict):
            raise ValueError(f"table: bucket {i} has no config")
        unknown = set(cfg) - set(LAUNCH_KEYS) - set(HIP_KEYS)
        if unknown:
            raise ValueError(f"table: bucket {i}: unknown config keys {sorted(unknown)}")
        missing = set(LAUNCH_KEYS) - set(cfg)
        if missing:
            raise ValueError(f"table: bucket {i}: incomplete config, missing {sorted(missing)}")
        if b.get("max_rows") is not None and not (isinstance(b["max_rows"], int) and b["max_rows"] > 0):
            raise ValueError(f"table: bucket {i}: max_rows must be a positive int or null")
        for k in ("num_heads", "qlen"):
            if b.get(k) is not None and not all(isinstance(v, int) for v in b[k]):
                raise ValueError(f"table: bucket {i}: {k} must be a list of ints")


def select_from_table(table: dict, batch: int, qlen: int, num_heads: int) -> dict:
    """The config a table gives a launch: the rule configs.select_verify_config applies."""
    rows = batch * qlen * num_heads
    for b in table["buckets"]:
        if b.get("max_rows") is not None and rows > b["max_rows"]:
            continue
        if b.get("num_heads") is not None and num_heads not in b["num_heads"]:
            continue
        if b.get("qlen") is not None and qlen not in b["qlen"]:
            continue
        return dict(b["config"])
    raise ValueError("table: no bucket matches (the last must match everything)")


def write_table(path: str | os.PathLike, table: dict) -> None:
    validate_table(table)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        f.write(format_table(table))
    os.replace(tmp, path)


def split_findings(tiles: list[Case], res: Results) -> list[dict]:
    """Per tile point: the best config at verify_num_kv_splits' count vs the best count."""
    out = []
    for p in tiles:
        pk = point_key(p)
        h = res.timed(pk)
        if not h:
            continue
        best_cfg = config_key(h[0]["config"])
        same = [r for r in res.timed(pk, heuristic_only=False) if config_key(r["config"]) == best_cfg]
        best_any = min(same, key=lambda r: r["time_us"])
        out.append({"point": pk, "heuristic_splits": h[0]["splits"],
                    "heuristic_us": round(h[0]["time_us"], 3), "best_splits": best_any["splits"],
                    "best_us": round(best_any["time_us"], 3),
                    "gain": round(h[0]["time_us"] / best_any["time_us"], 4)})
    return out


# --- measuring ----------------------------------------------------------------------------------


class Budget:
    def __init__(self, seconds: float, reserve: float = 8.0):
        self.t0 = time.monotonic()
        self.deadline = self.t0 + seconds - reserve

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


class Runner:
    """Measures tasks on the device: inputs of one point at a time, its reference output, a
    check of every candidate, CUDA-graph timing."""

    def __init__(self, api, args, device: str, res: Results, budget: Budget, log_fn):
        self.api, self.args, self.device, self.res, self.budget = api, args, device, res, budget
        self.log_fn = log_fn
        self.act = bench._DTYPES[args.dtype]
        self.rtol = bench.CHECK_RTOL[args.dtype] * 1.5  # two kernels' roundings
        self.compiled: dict[tuple, tuple] = {}
        self.pool = bench.CompilePool(args.jobs) if device == "cuda" and args.jobs > 0 else None
        self._point = None
        self._inputs = None
        self._ref = None
        self.out_of_time = False
        self.ref_points: set[str] = set()

    def close(self):
        if self.pool is not None:
            self.pool.close()

    def defaults(self, p: Case) -> dict:
        return dict(self.api.select_verify_config(p.B, p.qlen, p.H))

    def splits_of(self, p: Case, block_h: int) -> int:
        return self.api.verify_num_kv_splits(p.L, p.B, p.qlen, p.H, self.api.sm_count,
                                             block_h=block_h)

    def _spec(self, t: Task) -> dict:
        return bench.compile_spec(t[0], self.args.dtype, t[2], t[1])

    def precompile(self, tasks: list[Task]) -> None:
        if self.pool is None:
            return
        specs = [self._spec(t) for t in tasks]
        specs = [s for s in specs if bench.compile_key(s) not in self.compiled]
        if not specs:
            return
        t0 = time.monotonic()
        try:
            done = self.pool.run(specs, deadline=time.monotonic() + max(0.0, self.budget.left() - 5))
        except Exception as e:  # noqa: BLE001 - no worker processes: compile here instead
            print(f"    WARNING: the compile processes failed ({type(e).__name__}: {e}); compiling "
                  "in this process from now on (a crashing config would end the sweep)", flush=True)
            self.pool.close()
            self.pool = None
            return
        self.compiled.update(done)
        bad = sum(1 for v in done.values() if v[0] != "ok")
        print(f"    compiled {len(done)}/{len({bench.compile_key(s) for s in specs})} variants in "
              f"{time.monotonic() - t0:.1f} s ({bad} refused)", flush=True)

    def _load(self, p: Case):
        if self._point == point_key(p):
            return
        self._inputs = self._ref = None
        if self.device == "cuda":
            torch.cuda.empty_cache()
        self._inputs = bench.make_inputs(p, self.device, self.act, seed=self.args.seed)
        self._point = point_key(p)
        self._ref = self._reference(p)

    def _reference(self, p: Case):
        """The selected config's output, checked against the fp32 reference on the tile points
        (or on every point with ``--ref-check all``); the fp32 reference if it disagrees."""
        inp = self._inputs
        d = self.defaults(p)
        fp32 = None
        want_fp32 = self.args.ref_check == "all" or (
            self.args.ref_check == "tiles" and point_key(p) in self.ref_points)
        out = None
        try:
            fn = bench.make_call(self.api, inp, p.qlen, self.splits_of(p, d["BLOCK_H"]),
                                 self.args.sm_scale, p.page_size, None)
            inp.o.fill_(float("nan"))
            inp.lse.fill_(float("nan"))
            fn()
            out = (inp.o.clone(), inp.lse.clone())
        except Exception as e:  # noqa: BLE001
            if _sticky(e):
                raise
            print(f"    {point_key(p)}: the selected config fails ({type(e).__name__}: {e}); "
                  "checking against the fp32 reference", flush=True)
            want_fp32 = True
        if want_fp32 or out is None:
            fp32 = self.api.decode_verify_ref(inp.q, inp.kv[0], bench.LV, inp.req_to_token,
                                              inp.seq_lens, None, p.qlen, self.args.sm_scale,
                                              p.page_size, inp.k_scale)
            if out is not None:
                cmp = bench.compare(*out, *fp32)
                if cmp["err_o_rel"] > bench.CHECK_RTOL[self.args.dtype] or \
                        cmp["err_lse_abs"] > bench.CHECK_LSE_ATOL:
                    print(f"    WARNING {point_key(p)}: the selected config disagrees with the "
                          f"fp32 reference ({cmp}); candidates are checked against fp32",
                          flush=True)
                    out = None
            if out is None:
                return fp32
        return out

    def measure(self, t: Task, stage: str) -> dict:
        p, cfg, splits, heuristic = t
        rec = {"point": point_key(p), "H": p.H, "qlen": p.qlen, "B": p.B, "L": p.L, "fp8": p.fp8,
               "page_size": p.page_size, "config": cfg, "splits": splits, "heuristic": heuristic,
               "stage": stage}
        ck = bench.compile_key(self._spec(t))
        if self.pool is not None:
            st = self.compiled.get(ck)
            if st is None:
                return {}  # not compiled within the budget: left for --resume
            if st[0] != "ok":
                rec.update(status="compile_error", msg=st[1])
                return rec
        try:
            self._load(p)
            fn = bench.make_call(self.api, self._inputs, p.qlen, splits, self.args.sm_scale,
                                 p.page_size, cfg)
            chk = bench.check_call(fn, self._inputs, self._ref, self.rtol)
            rec.update(err_o_rel=chk["err_o_rel"], err_lse_abs=chk["err_lse_abs"])
            if not chk["ok"]:
                rec.update(status="wrong")
                return rec
            t_us, reps = bench.time_call(fn, self.device, self.args.max_replays,
                                         target_ms=self.args.target_ms)
            rec.update(status="ok", time_us=t_us, replays=reps)
        except Exception as e:  # noqa: BLE001
            if _sticky(e):
                raise
            rec.update(status="error", msg=f"{type(e).__name__}: {e}"[:400])
        return rec

    def run_stage(self, stage: str, tasks: list[Task]) -> int:
        if not tasks:
            return 0
        print(f"  stage {stage}: {len(tasks)} runs ({self.budget.left():.0f} s left)", flush=True)
        self.precompile(tasks)
        n = lost = 0
        for t in tasks:
            if self.budget.left() <= 0:
                self.out_of_time = True
                break
            rec = self.measure(t, stage)
            if not rec:  # its variant was not compiled: budget, or a worker lost it
                lost += 1
                continue
            self.res.add(rec)
            n += 1
        if lost:
            self.out_of_time = True
            print(f"    {lost} runs skipped: their variants were not compiled in time "
                  "(or their compile process died); --resume retries them", flush=True)
        self.log_fn()
        return n


def _sticky(e: BaseException) -> bool:
    return any(s in str(e) for s in bench._STICKY)


# --- main ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Sweep the decode-verify launch space and write the per-arch config table.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Table format and search: see the module docstring (python -c 'import "
        "benchmarks.sweep_decode_verify as s; help(s)').",
    )
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="wall-clock budget for the whole sweep, compiles included")
    p.add_argument("--write", metavar="PATH",
                   help="table path (default mla_ops/decode_verify/tables/<arch>.json; under "
                   "--interpret nothing is written unless given)")
    p.add_argument("--log", metavar="PATH", default="sweep_decode_verify_log.json",
                   help="JSON log of every measured point")
    p.add_argument("--resume", metavar="LOG", help="start from this log's measurements")
    p.add_argument("--stages", default=",".join(STAGES),
                   help=f"comma-separated subset of {','.join(STAGES)}")
    p.add_argument("--heads", nargs="+", type=int, default=list(GRID_HEADS))
    p.add_argument("--qlen", nargs="+", type=int, default=list(GRID_QLENS))
    p.add_argument("--bl", nargs="+", default=[f"{b}x{L}" for b, L in GRID_BL],
                   help="(batch, seq len) pairs as BxL")
    p.add_argument("--cache", nargs="+", choices=("bf16", "fp8"), default=["bf16", "fp8"])
    p.add_argument("--page-size", type=int, default=bench.DEFAULT_PAGE_SIZE)
    p.add_argument("--sm-scale", type=float, default=bench.DEFAULT_SM_SCALE)
    p.add_argument("--heads-groups", default=DEFAULT_HEADS_GROUPS,
                   help="heads lists of the table's buckets, '/'-separated")
    p.add_argument("--qlen-groups", default=DEFAULT_QLEN_GROUPS,
                   help="qlen lists of the table's buckets, '/'-separated")
    p.add_argument("--ref-check", choices=("tiles", "all", "none"), default="tiles",
                   help="where the selected config is checked against the fp32 reference")
    p.add_argument("--jobs", type=int, default=None,
                   help="compile processes (default: CPUs - 2, at most 16; 0: compile here)")
    p.add_argument("--max-replays", type=int, default=100)
    p.add_argument("--target-ms", type=float, default=20.0, help="replay time per timing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="a smaller space (tile points M1-M7 only, fewer tiles, stages, split "
                   "lengths; one tile per point explored further): about a third of the compiles")
    p.add_argument("--interpret", action="store_true",
                   help="CPU smoke run through the Triton interpreter: tiny shape and space")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.bl_pairs = [tuple(int(v) for v in s.lower().split("x")) for s in args.bl]
        if any(len(t) != 2 or min(t) < 1 for t in args.bl_pairs):
            raise ValueError
    except ValueError:
        parser.error(f"--bl: expected BxL pairs like 32x4096, got {args.bl}")
    args.stage_list = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in args.stage_list if s not in STAGES]
    if unknown:
        parser.error(f"--stages: unknown {unknown}; choose from {list(STAGES)}")
    try:
        args.heads_group_list = parse_groups(args.heads_groups)
        args.qlen_group_list = parse_groups(args.qlen_groups)
    except ValueError as e:
        parser.error(str(e))
    if args.budget_s <= 0:
        parser.error("--budget-s must be positive")
    if args.jobs is None:
        args.jobs = max(0, min(16, (os.cpu_count() or 1) - 2))
    args.dtype = "fp16" if args.interpret else "bf16"
    if args.interpret:
        args.jobs = 0
        if "--heads" not in (argv if argv is not None else sys.argv[1:]):
            c = bench.INTERPRET_CASE
            args.heads, args.qlen, args.bl_pairs, args.cache = [c.H], [c.qlen], [(c.B, c.L)], ["bf16"]
            args.page_size = c.page_size
    missing = [h for h in args.heads if group_of(h, args.heads_group_list) is None]
    if missing:
        parser.error(f"--heads {missing} are in no --heads-groups group")
    missing = [q for q in args.qlen if group_of(q, args.qlen_group_list) is None]
    if missing:
        parser.error(f"--qlen {missing} are in no --qlen-groups group")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from benchmarks._common import pick_device

    device = pick_device(args.interpret, "sweep_decode_verify")
    if device is None:
        return 2
    from benchmarks._common import env_info

    budget = Budget(args.budget_s, reserve=8.0 if device == "cuda" else 1.0)
    api = bench.load_api()
    from mla_ops import platform

    arch = platform.current().arch
    env = env_info()
    space = INTERPRET_SPACE if args.interpret else QUICK_SPACE if args.quick else Space()
    grid = grid_points(args.heads, args.qlen, args.bl_pairs,
                       tuple(c == "fp8" for c in args.cache), args.page_size)
    tiles = tile_points(grid, space.anchors_only)
    write_path = args.write
    if write_path is None and not args.interpret:
        write_path = str(TABLE_DIR / f"{arch}.json")
        if arch != "sm_90":
            print(f"note: this GPU is {arch}; configs.py reads tables/sm_90.json only", flush=True)

    prior = []
    if args.resume:
        with open(args.resume) as f:
            prior = json.load(f).get("records", [])
    res = Results(prior)
    print(f"decode_verify sweep on {env.get('gpu') or 'cpu (Triton interpreter)'} ({arch}), "
          f"torch {env['torch']}, triton {env['triton']}: {len(grid)} grid points, {len(tiles)} "
          f"tile points, budget {args.budget_s:.0f} s, {args.jobs} compile processes"
          + (f", {len(prior)} records resumed" if prior else ""), flush=True)

    def write_log():
        if args.log:
            d = os.path.dirname(os.path.abspath(args.log))
            os.makedirs(d, exist_ok=True)
            with open(args.log, "w") as f:
                json.dump({"format": "sweep_decode_verify log 1", "env": env, "arch": arch,
                           "args": {k: v for k, v in vars(args).items() if _jsonable(v)},
                           "elapsed_s": round(budget.elapsed(), 1), "records": res.records},
                          f, indent=1)
                f.write("\n")

    runner = Runner(api, args, device, res, budget, write_log)
    runner.ref_points = {point_key(p) for p in tiles}

    def table_now() -> dict:
        measured = sum(1 for p in grid if res.point_times(point_key(p)))
        source = (f"benchmarks/sweep_decode_verify.py on {env.get('gpu')} ({arch}), torch "
                  f"{env['torch']}, triton {env['triton']}, {env['date']}: {measured}/{len(grid)} "
                  f"grid points measured, {len(res.records)} runs, bf16 q, page {args.page_size}")
        info = {"env": env, "grid": [point_key(p) for p in grid],
                "tile_points": [point_key(p) for p in tiles],
                "heads_groups": args.heads_group_list, "qlen_groups": args.qlen_group_list,
                "split_findings": split_findings(tiles, res),
                "complete": not runner.out_of_time}
        return build_table(grid, res, runner.defaults, args.heads_group_list,
                           args.qlen_group_list, arch, source, info)

    status = 0
    try:
        for stage in STAGES:
            if stage not in args.stage_list:
                continue
            if budget.left() <= 0:
                runner.out_of_time = True
                break
            tasks = plan_stage(stage, tiles, grid, res, runner.defaults, runner.splits_of, space,
                               api.sm_count, args.heads_group_list, args.qlen_group_list)
            runner.run_stage(stage, tasks)
            if write_path:
                write_table(write_path, table_now())
    except Exception as e:  # noqa: BLE001
        if not _sticky(e):
            raise
        print(f"ABORT: the CUDA context is lost ({type(e).__name__}: {e}); the log and table "
              "hold what was measured; rerun with --resume", file=sys.stderr)
        status = 3
    finally:
        runner.close()
        write_log()

    if write_path and status == 0:
        table = table_now()
        write_table(write_path, table)
        print(f"wrote {write_path}")
    else:
        table = table_now()
    if args.log:
        print(f"wrote {args.log} ({len(res.records)} records)")
    print(f"sweep {'stopped by the budget' if runner.out_of_time else 'complete'} after "
          f"{budget.elapsed():.0f} s" + ("; continue with --resume" if runner.out_of_time else ""))
    print_summary(table, tiles, res)
    return status


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except TypeError:
        return False


def print_summary(table: dict, tiles: list[Case], res: Results) -> None:
    from benchmarks._common import print_table

    rows = []
    for b in table["buckets"]:
        c = b["config"]
        pts = [e for e in b.get("points", []) if "ratio" in e]
        rows.append({
            "heads": ",".join(map(str, b["num_heads"])) if b.get("num_heads") else "*",
            "qlen": ",".join(map(str, b["qlen"])) if b.get("qlen") else "*",
            "max_rows": b.get("max_rows") or "-",
            "cfg": f"H{c['BLOCK_H']} N{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']} "
                   f"q{c['QSPLIT']} m{c['MIN_SPLIT_LEN']} S{c['S2_BLOCK_S']}/{c['s2_num_warps']}",
            "measured": "yes" if b.get("measured") else "no",
            "worst": max((e["ratio"] for e in pts), default=""),
        })
    print()
    print_table(rows, ["heads", "qlen", "max_rows", "cfg", "measured", "worst"])
    best = []
    for p in tiles:
        t = res.timed(point_key(p))
        if t:
            d = [r for r in t if r["stage"] == "default"]
            best.append({"point": p.name or point_key(p), "best_us": t[0]["time_us"],
                         "default_us": d[0]["time_us"] if d else "",
                         "gain": d[0]["time_us"] / t[0]["time_us"] if d else ""})
    if best:
        print()
        print_table(best, ["point", "best_us", "default_us", "gain"])


if __name__ == "__main__":
    sys.exit(main())
