#!/usr/bin/env python
"""A/B of decode-verify launch variants: for each shape, every variant is checked against the
fp32 reference and timed in the same process, interleaved, and reported as a ratio to the first
(the selected table config unless the first variant overrides it). Timings are noisy across
runs; ratios inside one run are what NOTES.md compares.

A variant is a JSON object of config overrides (``configs.VERIFY_DEFAULT_CONFIG`` keys) with an
optional ``"splits"`` (``num_kv_splits``; default ``verify_num_kv_splits`` for its BLOCK_H) and
``"name"``; ``{}`` is the table as selected.

    PYTHONPATH=. python benchmarks/ab_decode_verify.py --shape M1 M2 \
        --variant '{}' '{"TMA": 1}' '{"PERSISTENT": 1}' '{"splits": 16, "S2_BLOCK_DV": 128}' \
        --json $OUT/ab.json

``--rounds N`` times each variant N times, round-robin (median of each round's graph-replay
median is reported, with the spread), so that a drift of the machine hits all variants alike.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from typing import Sequence

_ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402

from benchmarks import benchmark_decode_verify as bench  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", nargs="+", default=list(bench.SHAPES), choices=list(bench.SHAPES))
    p.add_argument("--variant", nargs="+", default=["{}"], help="JSON config overrides")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--no-prequeue", action="store_true",
                   help="also time each variant from an idle GPU (host launch latency included)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH")
    return p.parse_args(argv)


def _split_variant(api, case, v: dict) -> tuple[str, dict, int, dict]:
    v = dict(v)
    label = v.pop("name", None) or (json.dumps(v, sort_keys=True) if v else "table")
    splits = v.pop("splits", None)
    cfg = bench.effective_config(api, case, v)
    return label, v, splits or bench.default_splits(api, case, cfg), cfg


def precompile(api, shapes: Sequence[str], variants: list[dict]) -> None:
    """Every (shape, variant) launch compiled by the benchmark's worker pool first."""
    jobs = bench.default_jobs()
    if jobs == 0:
        return
    specs = []
    for name in shapes:
        case = bench.SHAPES[name].case
        for v in variants:
            _label, over, splits, _cfg = _split_variant(api, case, v)
            specs.append(bench.compile_spec(case, "bf16", splits, over))
    t0 = time.perf_counter()
    pool = bench.CompilePool(jobs)
    try:
        done = pool.run(specs, deadline=time.monotonic() + 400)
        bad = [v[1] for v in done.values() if v[0] != "ok"]
        print(f"compiled {len(done)} launch variants in {time.perf_counter() - t0:.1f} s"
              + (f"; {len(bad)} failed, e.g. {bad[0]}" if bad else ""))
    except Exception as e:  # noqa: BLE001 - a head start only
        print(f"note: parallel compile unavailable ({type(e).__name__}: {e})")
    finally:
        pool.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("ab_decode_verify: needs a CUDA GPU", file=sys.stderr)
        return 2
    from benchmarks._common import env_info

    variants = [json.loads(v) for v in args.variant]
    api = bench.load_api()
    env = env_info()
    print(f"decode_verify A/B on {env.get('gpu')}, torch {env['torch']}, triton {env['triton']}")
    precompile(api, args.shape, variants)
    rows = []
    failed = False
    for name in args.shape:
        case = bench.SHAPES[name].case
        inp = bench.make_inputs(case, "cuda", torch.bfloat16, seed=args.seed)
        ref = api.decode_verify_ref(inp.q, inp.kv[0], bench.LV, inp.req_to_token, inp.seq_lens,
                                    None, case.qlen, bench.DEFAULT_SM_SCALE, case.page_size,
                                    inp.k_scale)
        calls = []
        for v in variants:
            label, v, splits, cfg = _split_variant(api, case, v)
            fn = bench.make_call(api, inp, case.qlen, splits, bench.DEFAULT_SM_SCALE,
                                 case.page_size, v or None)
            chk = bench.check_call(fn, inp, ref, bench.CHECK_RTOL["bf16"])
            failed |= not chk["ok"]
            calls.append((label, v, splits, cfg, fn, chk))
        times = {label: [] for label, *_ in calls}
        idle = {label: [] for label, *_ in calls}
        for _ in range(args.rounds):
            for label, _v, _s, _c, fn, _chk in calls:
                times[label].append(bench.time_call(fn, "cuda", args.replays)[0])
                if args.no_prequeue:
                    idle[label].append(bench.time_call(fn, "cuda", args.replays, prequeue=False)[0])
        first = statistics.median(times[calls[0][0]])
        nbytes, nflops = bench.unique_bytes(case, 2), bench.flops(case)
        print(f"{name} ({case.label}):")
        for label, v, splits, cfg, _fn, chk in calls:
            t = statistics.median(times[label])
            row = {"shape": name, "variant": label, "overrides": v, "num_kv_splits": splits,
                   "config": cfg, "time_us": t, "times_us": times[label], "ratio": t / first,
                   "TBps": nbytes / (t * 1e-6) / 1e12, "TFLOPs": nflops / (t * 1e-6) / 1e12,
                   "check": chk}
            extra = ""
            if idle[label]:
                row["idle_time_us"] = statistics.median(idle[label])
                extra = f", from idle {row['idle_time_us']:.1f} us"
            rows.append(row)
            spread = (max(times[label]) - min(times[label])) / t
            print(f"  {label:60s} splits {splits:4d}: {t:8.1f} us (x{t / first:.3f}, spread "
                  f"{spread:.1%}) {row['TBps']:.2f} TB/s {row['TFLOPs']:.0f} TFLOP/s, err "
                  f"{chk['err_o_rel']:.1e}{' FAIL' if not chk['ok'] else ''}{extra}")
        del inp, ref, calls
        torch.cuda.empty_cache()
    if args.json:
        from benchmarks._common import write_json

        write_json(args.json, rows)
        print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
