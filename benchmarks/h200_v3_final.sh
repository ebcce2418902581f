#!/usr/bin/env bash
# v3 close: the GPU suite on the committed table (extension built), 16-warp tiles for H=128
# A/B'd against the table, and Nsight Compute on M1 (stage 1 / stage 2 durations).
set -u
source "$(dirname "$0")/_device_env.sh"
SUITE_TIMEOUT=${SUITE_TIMEOUT:-330} bash benchmarks/h200_session.sh test 2>&1 | tail -22
timeout 150 python3 benchmarks/ab_decode_verify.py --rounds 3 --shape M5 M6 --json "$OUT/ab3_h128.json" \
  --variant '{}' '{"num_warps": 16}' '{"num_warps": 16, "TMA": 0}' 2>&1 | grep -v "^compiled" | tail -8
if command -v ncu >/dev/null; then
  timeout 90 ncu --clock-control none -k regex:_fwd_verify -c 2 -s 6 --section SpeedOfLight \
    --section LaunchStats python3 benchmarks/ab_decode_verify.py --shape M1 --rounds 1 --replays 20 \
    > "$OUT/ncu_M1.txt" 2>&1
  grep -E "_fwd_verify_stage|Duration|DRAM Throughput|Grid Size|Block Size" "$OUT/ncu_M1.txt" | head -14
fi
