#!/usr/bin/env python
"""The short form of A/B results (``ab_decode_verify.py``, ``ab_prefill.py``): one row per
shape with each variant's median time, the family that ran, the split count, the host time
where measured, the round-to-round spread and which variants failed their check; the configs,
per-round times, error figures and bandwidth columns of the raw rows are left out. Several
inputs go into one file, each with its ``env`` and ``command``.

    python benchmarks/summarize_ab.py RAW.json [RAW.json ...] --json SUMMARY.json \
        [--from-commit HASH]

``--from-commit`` records where the raw files can be read again once they leave the tree
(``git show HASH:<path>``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import Any, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import results  # noqa: E402

def variant_name(variant: str) -> str:
    """``table`` for ``{}``, the ``name`` a variant carries, else its overrides as ``K=V,...``
    (``{"TMA": 1, "splits": 66}`` -> ``TMA=1,splits=66``)."""
    try:
        over = json.loads(variant)
    except (TypeError, ValueError):
        return variant  # already a name: "table", "portable", "sdpa-cudnn"
    if not isinstance(over, dict):
        return variant
    if "name" in over:
        return str(over["name"])
    return ",".join(f"{k}={v}" for k, v in over.items()) or "table"


def _round(v: float) -> float:
    return float(f"{v:.5g}")


def summarize(raw: dict, path: str) -> dict:
    """``{"file", "env", "command", "unit", "rows"}`` of one raw A/B document; a row per shape:
    ``time`` (median, µs or ms as ``unit`` says) per variant in the raw order (the first is
    what the ratios of the raw file were taken against), ``family`` per variant where its
    config names one (``sdpa-*`` have none), ``splits`` where the raw row has them,
    ``host_us`` where measured, the round-to-round ``spread`` ((max - min) / median) and
    ``failed``: the variants whose check failed (absent when none did)."""
    unit = "us" if any("time_us" in r for r in raw["rows"]) else "ms"
    rows: dict[str, dict] = {}
    for r in raw["rows"]:
        out = rows.setdefault(r["shape"], {"shape": r["shape"], "time": {}})
        name = variant_name(r["variant"])
        out["time"][name] = _round(r["time_us"] if unit == "us" else r["ms"])
        cfg = r.get("config")
        if isinstance(cfg, dict):
            out.setdefault("family", {})[name] = cfg.get("family", "triton")
        if "num_kv_splits" in r:
            out.setdefault("splits", {})[name] = r["num_kv_splits"]
        if "host_us" in r:
            out.setdefault("host_us", {})[name] = _round(r["host_us"])
        if "idle_time_us" in r:
            out.setdefault("idle_time_us", {})[name] = _round(r["idle_time_us"])
        check = r.get("check")
        ok = check.get("ok") if isinstance(check, dict) else r.get("ok")
        if ok is False:
            out.setdefault("failed", []).append(name)
        rounds = r.get("times_us") or r.get("times_ms") or []
        if len(rounds) > 1:
            mid = sorted(rounds)[len(rounds) // 2]
            out.setdefault("spread", {})[name] = round((max(rounds) - min(rounds)) / mid, 4)
    return {"file": path, "env": raw.get("env"), "command": raw.get("command"), "unit": unit,
            "rows": list(rows.values())}


def dumps(doc: dict) -> str:
    """Indented JSON with each row on one line (a summary is read by eye as well)."""
    rows = {}

    def mark(src):
        key = f"@@rows{len(rows)}@@"
        rows[key] = ",\n".join("    " + json.dumps(r, ensure_ascii=False) for r in src["rows"])
        return {**src, "rows": key}

    text = json.dumps({**doc, "sources": [mark(s) for s in doc["sources"]]}, indent=1,
                      ensure_ascii=False)
    for key, body in rows.items():
        text = text.replace(json.dumps(key), "[\n" + body + "\n   ]")
    return text + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("raw", nargs="+", help="A/B JSON files (rows with shape, variant, times)")
    p.add_argument("--json", required=True, help="the summary to write")
    p.add_argument("--from-commit", help="a commit whose tree holds the raw files")
    args = p.parse_args(argv)
    root = results.ROOT
    sources = []
    for path in args.raw:
        rel = os.path.relpath(pathlib.Path(path).resolve(), root)
        with open(path) as f:
            sources.append(summarize(json.load(f), rel))
    doc = {"summary_of": [s["file"] for s in sources], "raw_at_commit": args.from_commit,
           "command": results.command_line("summarize_ab.py", argv or sys.argv[1:]),
           "sources": sources}
    results.write_text(args.json, dumps(doc))
    print(f"{sum(len(s['rows']) for s in sources)} rows from {len(sources)} files -> {args.json}")


if __name__ == "__main__":
    main()
