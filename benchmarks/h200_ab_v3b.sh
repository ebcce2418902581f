#!/usr/bin/env bash
# v3, second round (NOTES.md): PDL for stage 2, two CTAs per SM (num_stages 1: 111 KB of shared
# memory), swap-AB 32-row tiles for M3, A/B'd against TMA in one process; the launch-feature GPU
# tests first; then the quick sweep over the space with the v3 features (table to $OUT).
set -u
source "$(dirname "$0")/_device_env.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_decode_verify.py \
  -k "features or falls_back or poisoned" 2>&1 | tee "$OUT/pytest_features.log" | tail -4

AB="timeout ${AB_TIMEOUT:-200} python3 benchmarks/ab_decode_verify.py --rounds 3"
S2='"PDL": 1, "S2_BLOCK_DV": 64, "S2_BLOCK_S": 32'
$AB --shape M1 --json "$OUT/ab2_m1.json" --variant '{}' "{$S2}" '{"S2_BLOCK_DV": 64, "S2_BLOCK_S": 32}' \
  '{"num_stages": 1}' "{\"num_stages\": 1, $S2}" "{\"TMA\": 1, $S2}" 2>&1 | grep -v "^compiled" | tail -8
$AB --shape M2 M4 --json "$OUT/ab2_m2m4.json" --variant '{}' '{"TMA": 1}' '{"TMA": 1, "num_stages": 1}' \
  '{"num_stages": 1}' "{\"TMA\": 1, $S2}" "{$S2}" 2>&1 | grep -v "^compiled" | tail -16
SW='"SWAP_AB": 1, "BLOCK_H": 32, "BLOCK_N": 64, "num_warps": 4, "QSPLIT": 1, "TMA": 1'
$AB --shape M3 --json "$OUT/ab2_m3.json" --variant '{"TMA": 1}' '{"TMA": 1, "PERSISTENT": 1}' \
  "{$SW, \"num_stages\": 2}" "{$SW, \"num_stages\": 1}" '{"TMA": 1, "num_stages": 1}' 2>&1 | grep -v "^compiled" | tail -8

budget=${SWEEP_BUDGET:-240}
timeout $((budget + 60)) python3 benchmarks/sweep_decode_verify.py --quick --budget-s "$budget" \
  --write "$OUT/sm_90.json" --log "$OUT/sweep_log.json" 2>&1 | tail -30
