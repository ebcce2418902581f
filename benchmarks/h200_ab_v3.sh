#!/usr/bin/env bash
# v3 leads (NOTES.md): TMA K tiles, the persistent grid, the column-split stage 2 and split
# counts for M1, each A/B'd against the table in one process; the new paths' GPU tests first;
# then Nsight Compute on M2's stage 1 (table vs TMA). One device call; results in $OUT.
set -u
source "$(dirname "$0")/_device_env.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_decode_verify.py \
  -k "gpu_launch_features or features or falls_back or poisoned" 2>&1 | tee "$OUT/pytest_features.log" | tail -6

AB="timeout ${AB_TIMEOUT:-240} python3 benchmarks/ab_decode_verify.py --rounds 3"
$AB --shape M2 M3 M4 --json "$OUT/ab_h16.json" --variant '{}' '{"TMA": 1}' '{"PERSISTENT": 1}' \
  '{"TMA": 1, "PERSISTENT": 1}' '{"TMA": 1, "BLOCK_N": 32, "num_stages": 3}' \
  '{"TMA": 1, "BLOCK_N": 32, "num_stages": 4}' 2>&1 | grep -v "^compiled" | tail -24
$AB --shape M1 --no-prequeue --json "$OUT/ab_m1.json" --variant '{}' '{"TMA": 1}' \
  '{"S2_BLOCK_DV": 128}' '{"S2_BLOCK_DV": 64, "S2_BLOCK_S": 32}' \
  '{"splits": 16, "S2_BLOCK_DV": 64, "S2_BLOCK_S": 16}' '{"splits": 32, "S2_BLOCK_DV": 64, "S2_BLOCK_S": 32}' \
  '{"splits": 128, "MIN_SPLIT_LEN": 64, "S2_BLOCK_DV": 64, "S2_BLOCK_S": 32}' \
  '{"splits": 1}' 2>&1 | tail -12
$AB --shape M5 M6 M7 --json "$OUT/ab_h128.json" --variant '{}' '{"TMA": 1}' '{"PERSISTENT": 1}' \
  '{"TMA": 1, "PERSISTENT": 1}' '{"TMA": 1, "BLOCK_N": 32, "num_stages": 3}' 2>&1 | tail -20

if command -v ncu >/dev/null; then
  for v in '{}' '{"TMA": 1}'; do
    tag=$(echo "$v" | tr -dc 'A-Za-z0-9')
    timeout 120 ncu --clock-control none -k regex:_fwd_verify_stage1 -c 1 -s 3 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section Occupancy --section LaunchStats \
      python3 benchmarks/ab_decode_verify.py --shape M2 --rounds 1 --replays 20 --variant "$v" \
      > "$OUT/ncu_M2_${tag:-table}.txt" 2>&1
    grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Shared Memory Configuration Size|Block Limit" \
      "$OUT/ncu_M2_${tag:-table}.txt" | head -24
  done
fi
