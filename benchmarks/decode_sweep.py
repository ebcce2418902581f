"""The decode-verify sweep: what each stage measures, the measurements, and the table they make.

Table (written through ``mla_ops.tuning.format_table``, the one writer of table JSON): rules
matched first-to-last on the facts of ``mla_ops.decode_verify.configs``. The sweep writes, per
heads group (``--heads-groups``) x qlen group (``--qlen-groups``) x batch bin (one bin per batch
size of the grid, edges at geometric midpoints, expressed as ``rows_max`` with the group's
grid heads and largest grid qlen), a rule ``{"match": {"num_heads": [...], "qlen": [...],
"rows_max": N}, "config": {...}, "points": [...]}``, merged where neighbours chose the same
config, and a last rule without ``match``. Every config is complete. ``points`` is the
evidence (per grid point the time of the chosen config, the best time measured there, their
ratio); an empty list marks a rule no measurement backs (it keeps the config the current table
selects). Each rule takes the config with the best geometric mean of ``time / best time at
that point`` over its grid points (bf16 and fp8 caches alike: the rules do not match on the
cache), timed at the split count ``verify_num_kv_splits`` gives for that config's BLOCK_H and
MIN_SPLIT_LEN (what ``plan_verify`` and the benchmark pass).

Search (stages, pruned, each candidate checked before it is timed):

1. ``default``  the selected config on the tile points (M1–M7 and two more);
2. ``tile``     BLOCK_H x BLOCK_N x num_warps, plus the swap-AB tiles, on the tile points;
3. ``pipeline`` num_stages x QSPLIT around the best tiles of each tile point;
4. ``features`` TMA x PERSISTENT x QSPLIT around them (TMA for 16-bit caches only);
5. ``splitlen`` MIN_SPLIT_LEN where it changes the chunking; ``s2block``, ``s2warps``, ``pdl``:
   the stage-2 merge (only where there is more than one split);
6. ``splits``   split counts around ``verify_num_kv_splits`` (findings in the log: a table
   cannot carry a split count);
7. ``grid``     every grid point with its selected config and the best configs of the nearest
   tile points, each bin's candidates on every point of the bin.

A config the tuning module refuses on this machine (``tuning.select``'s checks, e.g. SWAP_AB
with one stage on CUDA) fails like one that does not compile and is never timed.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from typing import Any, Callable, Iterable, Sequence

import torch

from benchmarks import compile_pool, decode, harness, results
from benchmarks.shapes import Case

# --- the space ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Space:
    """The launch space the stages explore."""

    BLOCK_H: tuple = (16, 32, 64)
    BLOCK_N: tuple = (16, 32, 64)
    num_warps: tuple = (4, 8)
    num_stages: tuple = (1, 2, 3, 4)
    QSPLIT: tuple = (0, 1)
    MIN_SPLIT_LEN: tuple = (64, 128, 256, 512)
    # 128: the merge of up to 128 splits in one step (H16 q1 B1 with 64-key splits: 0.73 of 16
    # a step on the H200, benchmarks/NOTES.md); 64 lost to 32 wherever both were measured.
    S2_BLOCK_S: tuple = (4, 8, 16, 32, 128)
    s2_num_warps: tuple = (1, 2, 4, 8)
    # Swap-AB tiles (rows as wgmma's N): one warpgroup, small row tiles, BLOCK_N as M.
    swap_ab_tiles: tuple = ((16, 64, 4), (32, 32, 4), (32, 64, 4))  # (BLOCK_H, BLOCK_N, warps)
    # Launch features: K tiles by TMA (16-bit caches only: fp8 falls back), the persistent
    # grid, stage 2 split by columns, stage 2 by programmatic dependent launch.
    TMA: tuple = (0, 1)
    PERSISTENT: tuple = (0, 1)
    S2_BLOCK_DV: tuple = (0, 64)
    PDL: tuple = (0, 1)
    split_factors: tuple = (0.5, 2, 4)  # around verify_num_kv_splits (plus 1 split)
    pipeline_top: int = 2  # tiles of each tile point whose stages / QSPLIT are explored
    grid_candidates: int = 3  # best configs of the nearest tile points tried per grid point
    named_only: bool = False  # tile points: M1–M7 only


# About a third of the full sweep's compiles: fits one 240 s budget more surely.
QUICK_SPACE = Space(BLOCK_H=(32, 64), BLOCK_N=(32, 64), num_warps=(4, 8), num_stages=(1, 2, 3),
                    QSPLIT=(0, 1), MIN_SPLIT_LEN=(128, 256, 512), S2_BLOCK_S=(8, 16),
                    s2_num_warps=(2, 4), split_factors=(0.5, 2), pipeline_top=1,
                    grid_candidates=2, named_only=True)

INTERPRET_SPACE = Space(BLOCK_H=(16, 32), BLOCK_N=(16,), num_warps=(4,), num_stages=(1, 2),
                        swap_ab_tiles=((16, 16, 4),),
                        QSPLIT=(0, 1), MIN_SPLIT_LEN=(16, 64), S2_BLOCK_S=(2, 8),
                        s2_num_warps=(4,), split_factors=(2,), pipeline_top=2,
                        grid_candidates=1, S2_BLOCK_DV=(0, 16))

STAGES = ("default", "tile", "pipeline", "features", "splitlen", "s2block", "s2warps", "pdl",
          "splits", "grid")
DEFAULT_HEADS_GROUPS = "1,2,4,8,16,32/64,128,256"
DEFAULT_QLEN_GROUPS = "1/2/3,4/" + ",".join(str(q) for q in range(5, 17))


def config_key(cfg: dict) -> str:
    return json.dumps(cfg, sort_keys=True)


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


# --- measurements -------------------------------------------------------------------------------


class Results:
    """Every measured (point, config, split count), as log records (configs as tables hold them,
    so that a resumed log's records meet the candidates they were)."""

    def __init__(self, records: Iterable[dict] = ()):
        self.records: list[dict] = []
        self._index: dict[tuple, dict] = {}
        for r in records:
            self.add(r)

    @staticmethod
    def key(pkey: str, cfg: dict, splits: int) -> tuple:
        return (pkey, config_key(cfg), int(splits))

    def add(self, rec: dict) -> None:
        rec = {**rec, "config": decode.table_config(rec["config"])}
        k = self.key(rec["point"], rec["config"], rec["splits"])
        if k in self._index:
            self.records.remove(self._index[k])
        self._index[k] = rec
        self.records.append(rec)

    def has(self, pkey: str, cfg: dict, splits: int) -> bool:
        return self.key(pkey, decode.table_config(cfg), splits) in self._index

    def timed(self, pkey: str, heuristic_only: bool = True) -> list[dict]:
        """ok records of a point, fastest first."""
        out = [r for r in self.records if r["point"] == pkey and r["status"] == "ok"
               and (r.get("heuristic") or not heuristic_only)]
        return sorted(out, key=lambda r: r["time_us"])

    def top(self, pkey: str, n: int) -> list[dict]:
        """The n fastest distinct configs of a point at their default split count."""
        return [r["config"] for r in self._fastest(pkey).values()][:n]

    def point_times(self, pkey: str) -> dict[str, float]:
        """config key -> time µs at the default split count."""
        return {k: r["time_us"] for k, r in self._fastest(pkey).items()}

    def _fastest(self, pkey: str) -> dict[str, dict]:
        """config key -> the point's fastest record of that config, fastest first."""
        out: dict[str, dict] = {}
        for r in self.timed(pkey):
            out.setdefault(config_key(r["config"]), r)
        return out


# --- planning: what each stage measures, from what the earlier ones found ----------------------

Task = tuple  # (point, config, splits, heuristic)


def plan_stage(stage: str, tiles: list[Case], grid: list[Case], res: Results,
               defaults: Callable[[Case], dict], splits_of: Callable[[Case, dict], int],
               space: Space, sm_count: int, heads_groups: list[list[int]],
               qlen_groups: list[list[int]] | None = None) -> list[Task]:
    """The (point, config, splits, heuristic) tasks of ``stage`` not measured yet.

    The grid stage measures, at every point of a table bin (heads group, qlen group, batch),
    the nearest winners of all of the bin's points, so that the configs the table compares for
    that bin were timed on each of its points (a winner timed on one point only cannot be
    chosen for the bin).
    """
    tasks: list[Task] = []
    bin_candidates: dict[tuple, list[dict]] = {}

    def bin_of(q: Case) -> tuple:
        return (group_of(q.H, heads_groups),
                group_of(q.qlen, qlen_groups) if qlen_groups else q.qlen, q.B)

    if stage == "grid":
        for q in grid:
            cands = bin_candidates.setdefault(bin_of(q), [])
            for c in nearest_winners(q, tiles, res, heads_groups, space.grid_candidates):
                if c not in cands:
                    cands.append(c)

    def add(p, cfg, splits=None):
        heuristic = splits is None
        s = splits_of(p, cfg) if heuristic else splits
        if not res.has(p.key, cfg, s):
            tasks.append((p, cfg, s, heuristic))

    for p in (grid if stage == "grid" else tiles):
        best = res.top(p.key, 1)
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
            for c in res.top(p.key, space.pipeline_top):
                for ns, qs in itertools.product(space.num_stages, space.QSPLIT):
                    add(p, {**c, "num_stages": ns, "QSPLIT": qs})
        elif stage == "features":
            for c in res.top(p.key, space.pipeline_top):
                for tma, pers, qs in itertools.product(space.TMA, space.PERSISTENT, space.QSPLIT):
                    if tma and p.fp8:
                        continue  # the launcher takes fp8 caches through the pointer path
                    add(p, {**c, "TMA": tma, "PERSISTENT": pers, "QSPLIT": qs})
        elif best and stage in ("splitlen", "s2block", "s2warps", "pdl", "splits"):
            c = best[0]
            s = splits_of(p, c)
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
    unique: dict[tuple, Task] = {}
    for t in tasks:
        unique.setdefault(Results.key(t[0].key, decode.table_config(t[1]), t[2]), t)
    order = {p.key: i for i, p in enumerate(grid + tiles)}
    return sorted(unique.values(), key=lambda t: order.get(t[0].key, 0))


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
        for c in res.top(t.key, 1):
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


def choose_config(points: list[Case], res: Results,
                  prefer: dict | None) -> tuple[dict | None, list[dict]]:
    """The config with the best geometric mean of time/best over ``points`` (only configs timed
    on the most of them compete; ``prefer`` wins ties). ``(None, [])`` with no measurement."""
    times = {p.key: res.point_times(p.key) for p in points}
    times = {k: v for k, v in times.items() if v}
    if not times:
        return None, []
    cover: dict[str, list[str]] = {}
    for pk, t in times.items():
        for ck in t:
            cover.setdefault(ck, []).append(pk)
    most = max(len(v) for v in cover.values())
    pref = config_key(decode.table_config(prefer)) if prefer else None

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


def build_rules(grid: list[Case], res: Results, defaults: Callable[[Case], dict],
                heads_groups: list[list[int]], qlen_groups: list[list[int]]) -> list[dict]:
    """The table's rules (module docstring) from the measurements in ``res``."""
    buckets: list[dict] = []  # {"heads", "qlen", "rows_max", "config", "points"}
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
            merged: list[dict] = []
            for b, hi in batch_bins([p.B for p in qpts]):
                pts = [p for p in qpts if p.B == b]
                cfg, evidence = choose_config(pts, res, defaults(pts[0]))
                bk = {"heads": list(hg), "qlen": list(qg),
                      "rows_max": None if hi is None else hi * q_rep * h_rep,
                      "config": decode.table_config(cfg or defaults(pts[0])), "points": evidence}
                # neighbours in batch with the same config merge into the upper one
                if merged and merged[-1]["config"] == bk["config"]:
                    bk["points"] = merged[-1]["points"] + bk["points"]
                    merged[-1] = bk
                else:
                    merged.append(bk)
            per_qgroup.append(merged)
        # qlen groups that each reduced to one bucket with the same config merge
        out: list[list[dict]] = []
        for m in per_qgroup:
            if out and len(m) == 1 and len(out[-1]) == 1 and out[-1][0]["config"] == m[0]["config"]:
                prev = out[-1][0]
                out[-1] = [{**prev, "qlen": prev["qlen"] + m[0]["qlen"],
                            "points": prev["points"] + m[0]["points"]}]
            else:
                out.append(m)
        buckets.extend(b for m in out for b in m)
    cfg, evidence = choose_config(grid, res, None)
    last = decode.table_config(cfg or defaults(max(grid, key=lambda p: p.B * p.qlen * p.H)))
    # A group's trailing buckets that chose the catch-all's config are redundant: the launches
    # they match fall through to it (buckets of other groups never match them).
    for i in range(len(buckets) - 1, -1, -1):
        bk = buckets[i]
        nxt = buckets[i + 1] if i + 1 < len(buckets) else None
        last_of_group = nxt is None or (nxt["heads"], nxt["qlen"]) != (bk["heads"], bk["qlen"])
        if last_of_group and bk["config"] == last:
            del buckets[i]
    rules = []
    for bk in buckets:
        match = {"num_heads": bk["heads"], "qlen": bk["qlen"]}
        if bk["rows_max"] is not None:
            match["rows_max"] = bk["rows_max"]
        rules.append({"match": match, "config": bk["config"], "points": bk["points"]})
    return rules + [{"config": last, "points": evidence}]


def table_text(rules: list[dict], arch: str, source: str, env: dict) -> str:
    """The table file's text, validated by the tuning module (which raises ValueError): the
    Gluon-family rules of ``arch``'s table in force first (the sweep times the portable kernel
    only; those rules come from the family A/B, ``ab_decode_verify.py --grid``), then ``rules``."""
    from mla_ops import tuning
    from mla_ops.decode_verify.configs import KERNEL

    gluon = [r for r in tuning.table(KERNEL.name, arch)["rules"]
             if r["config"].get("family") == "gluon"]
    return tuning.format_table(KERNEL.name, arch, gluon + rules, source, env)


def split_findings(tiles: list[Case], res: Results) -> list[dict]:
    """Per tile point: the best config at verify_num_kv_splits' count vs the best count."""
    out = []
    for p in tiles:
        h = res.timed(p.key)
        if not h:
            continue
        best_cfg = config_key(h[0]["config"])
        same = [r for r in res.timed(p.key, heuristic_only=False)
                if config_key(r["config"]) == best_cfg]
        best_any = min(same, key=lambda r: r["time_us"])
        out.append({"point": p.key, "heuristic_splits": h[0]["splits"],
                    "heuristic_us": round(h[0]["time_us"], 3), "best_splits": best_any["splits"],
                    "best_us": round(best_any["time_us"], 3),
                    "gain": round(h[0]["time_us"] / best_any["time_us"], 4)})
    return out


def print_summary(rules: list[dict], tiles: list[Case], res: Results) -> None:
    rows = []
    for r in rules:
        c, m = r["config"], r.get("match", {})
        pts = [e for e in r.get("points", []) if "ratio" in e]
        rows.append({
            "heads": ",".join(map(str, m["num_heads"])) if "num_heads" in m else "*",
            "qlen": ",".join(map(str, m["qlen"])) if "qlen" in m else "*",
            "rows_max": m.get("rows_max", "-"),
            "cfg": f"H{c.get('BLOCK_H')} N{c.get('BLOCK_N')} w{c.get('num_warps')} "
                   f"s{c.get('num_stages')} q{c.get('QSPLIT')} m{c.get('MIN_SPLIT_LEN')} "
                   f"S{c.get('S2_BLOCK_S')}/{c.get('s2_num_warps')}",
            "measured": "yes" if r.get("points") else "no",
            "worst": max((e["ratio"] for e in pts), default=""),
        })
    print()
    results.print_table(rows, ["heads", "qlen", "rows_max", "cfg", "measured", "worst"])
    best = []
    for p in tiles:
        t = res.timed(p.key)
        if t:
            d = [r for r in t if r["stage"] == "default"]
            best.append({"point": p.name or p.key, "best_us": t[0]["time_us"],
                         "default_us": d[0]["time_us"] if d else "",
                         "gain": d[0]["time_us"] / t[0]["time_us"] if d else ""})
    if best:
        print()
        results.print_table(best, ["point", "best_us", "default_us", "gain"])


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
    check of every candidate, CUDA-graph timing. ``args``: ``dtype``, ``jobs``, ``seed``,
    ``sm_scale``, ``ref_check``, ``max_replays``, ``target_ms`` of the sweep's command line."""

    def __init__(self, api: decode.Api, args: Any, device: str, res: Results, budget: Budget,
                 log_fn: Callable[[], None]):
        self.api, self.args, self.device, self.res, self.budget = api, args, device, res, budget
        self.log_fn = log_fn
        self.act = decode.DTYPES[args.dtype]
        self.rtol = decode.CHECK_RTOL[args.dtype] * 1.5  # two kernels' roundings
        self.compiled: dict[tuple, tuple] = {}
        self.pool = (compile_pool.CompilePool(args.jobs, decode.compile_job)
                     if device == "cuda" and args.jobs > 0 else None)
        self._point = None
        self._inputs = None
        self._ref = None
        self.out_of_time = False
        self.ref_points: set[str] = set()

    def close(self):
        if self.pool is not None:
            self.pool.close()

    def defaults(self, p: Case) -> dict:
        return decode.table_config(self.api.select_verify_config(p.B, p.qlen, p.H, fp8=p.fp8))

    def splits_of(self, p: Case, cfg: dict) -> int:
        return decode.default_splits(self.api, p, cfg)

    def _spec(self, t: Task) -> dict:
        return decode.compile_spec(t[0], self.args.dtype, t[2], t[1])

    def precompile(self, tasks: list[Task]) -> None:
        if self.pool is None:
            return
        specs = {k: s for k, s in decode.specs_by_key([self._spec(t) for t in tasks]).items()
                 if k not in self.compiled}
        if not specs:
            return
        t0 = time.monotonic()
        try:
            deadline = time.monotonic() + max(0.0, self.budget.left() - 5)
            done = self.pool.run(specs, deadline=deadline)
        except Exception as e:  # noqa: BLE001 - no worker processes: compile here instead
            print(f"    WARNING: the compile processes failed ({type(e).__name__}: {e}); compiling "
                  "in this process from now on (a crashing config would end the sweep)", flush=True)
            self.pool.close()
            self.pool = None
            return
        self.compiled.update(done)
        bad = sum(1 for v in done.values() if v[0] != "ok")
        print(f"    compiled {len(done)}/{len(specs)} variants in {time.monotonic() - t0:.1f} s "
              f"({bad} refused)", flush=True)

    def _load(self, p: Case):
        if self._point == p.key:
            return
        self._inputs = self._ref = None
        if self.device == "cuda":
            torch.cuda.empty_cache()
        self._inputs = decode.make_inputs(p, self.device, self.act, seed=self.args.seed)
        self._point = p.key
        self._ref = self._reference(p)

    def _reference(self, p: Case):
        """The selected config's output, checked against the fp32 reference on the tile points
        (or on every point with ``--ref-check all``); the fp32 reference if it disagrees."""
        inp = self._inputs
        want_fp32 = self.args.ref_check == "all" or (
            self.args.ref_check == "tiles" and p.key in self.ref_points)
        out = None
        try:
            fn = decode.make_call(self.api, inp, p.qlen, self.splits_of(p, self.defaults(p)),
                                  self.args.sm_scale, p.page_size, None)
            inp.o.fill_(float("nan"))
            inp.lse.fill_(float("nan"))
            fn()
            out = (inp.o.clone(), inp.lse.clone())
        except Exception as e:  # noqa: BLE001
            if compile_pool.is_sticky(e):
                raise
            print(f"    {p.key}: the selected config fails ({type(e).__name__}: {e}); "
                  "checking against the fp32 reference", flush=True)
        if not want_fp32 and out is not None:
            return out
        fp32 = decode.reference(self.api, inp, p, self.args.sm_scale)
        if out is not None:
            cmp = decode.judge(decode.compare(*out, *fp32), decode.CHECK_RTOL[self.args.dtype])
            if cmp["ok"]:
                return out
            print(f"    WARNING {p.key}: the selected config disagrees with the fp32 reference "
                  f"({cmp}); candidates are checked against fp32", flush=True)
        return fp32

    def measure(self, t: Task, stage: str) -> dict:
        p, cfg, splits, heuristic = t
        rec = {"point": p.key, "H": p.H, "qlen": p.qlen, "B": p.B, "L": p.L, "fp8": p.fp8,
               "page_size": p.page_size, "config": cfg, "splits": splits, "heuristic": heuristic,
               "stage": stage}
        if self.pool is not None:
            st = self.compiled.get(decode.compile_key(self._spec(t)))
            if st is None:
                return {}  # not compiled within the budget: left for --resume
            if st[0] != "ok":
                rec.update(status="compile_error", msg=st[1])
                return rec
        try:
            self._load(p)
            fn = decode.make_call(self.api, self._inputs, p.qlen, splits, self.args.sm_scale,
                                  p.page_size, cfg)
            chk = decode.check_call(fn, self._inputs, self._ref, self.rtol)
            rec.update(err_o_rel=chk["err_o_rel"], err_lse_abs=chk["err_lse_abs"])
            if not chk["ok"]:
                rec.update(status="wrong")
                return rec
            t_us, reps = harness.time_call(fn, self.device, self.args.max_replays,
                                           target_ms=self.args.target_ms)
            rec.update(status="ok", time_us=t_us, replays=reps)
        except Exception as e:  # noqa: BLE001
            if compile_pool.is_sticky(e):
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
