#!/usr/bin/env bash
# v3, third round (NOTES.md): TMA with QSPLIT 0 (512-wide blocks issued as several boxes; fewer
# dots, so fewer wgmma drains per KV block) against the table; the TMA GPU tests first; then
# the quick sweep resumed from the committed log (its features stage now crosses QSPLIT) and
# the M1-M7 benchmark on the table it writes.
set -u
source "$(dirname "$0")/_device_env.sh"
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_decode_verify.py \
  -k "gpu_launch_features and tma" 2>&1 | tee "$OUT/pytest_tma.log" | tail -3
timeout 200 python3 benchmarks/ab_decode_verify.py --rounds 2 --shape M1 M2 M3 M5 M6 \
  --json "$OUT/ab4_qsplit.json" --variant '{}' '{"QSPLIT": 0}' 2>&1 | grep -v "^compiled" | tail -16
RESUME=benchmarks/results/h200/decode_verify_sweep_log.json SWEEP_BUDGET=${SWEEP_BUDGET:-150} \
  SKIP_PREFILL=1 bash benchmarks/h200_session.sh tune 2>&1 | tail -24
