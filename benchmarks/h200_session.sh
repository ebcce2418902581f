#!/usr/bin/env bash
# Everything that needs the H200, one step per device call, from the repository root; results
# land in $OUT (default /tmp/mla_out). No install: torch and triton of the image, PYTHONPATH=.
#   bash benchmarks/h200_session.sh test    # build _C in place, the GPU suite, python3 -m mla_ops
#   bash benchmarks/h200_session.sh bench   # decode M1-M7 (feed, ceilings, FlashMLA if it imports)
#                                           # and encoder P1-P8 (SDPA backends, ceilings)
#   bash benchmarks/h200_session.sh tune    # the quick decode sweep (its table into the tree), bench
#   bash benchmarks/h200_session.sh towers  # the ViT towers end to end
#   bash benchmarks/h200_session.sh suite   # build _C in place, the GPU suite in two shuffled
#                                           # orders (SEEDS, default "11 22"), python3 -m mla_ops
#   bash benchmarks/h200_session.sh eager   # FlashMLA built from .flashmla/ when present
#                                           # (../shared/flashmla's kit), then eager_launch.py
#   bash benchmarks/h200_session.sh e2e     # the same FlashMLA build, then serving_step_e2e.py
#                                           # at B 32 and 128 (E2E_BATCHES), qlen 2 and 4, with
#                                           # its variant engine when E2E_VARIANT (JSON) is set
#   bash benchmarks/h200_session.sh bound   # where the Gluon encoder kernel's time goes: Nsight
#                                           # Compute's pipe and warp-state sections at P2 and
#                                           # P7 (ncu_P2.csv, ncu_P7.csv), then exp2 on MUFU /
#                                           # half / a quarter on the FMA pipes / ablated (one
#                                           # FMA), graph replays beside SDPA (ab_exp2.json)
#   bash benchmarks/h200_session.sh fp8bound  # M4 and M7 with fp8 and bf16 caches in one
#                                           # process (ab_fp8_bf16.json), then Nsight Compute's
#                                           # pipe, warp-state and memory sections of one Gluon
#                                           # stage 1 at M7: the table's fp8 launch and bf16 alt
#                                           # (ncu_M7_fp8.txt, ncu_M7_bf16_alt.txt, each one's
#                                           # SASS with its stall samples, *_sass.csv, and
#                                           # where each partition waits, *_stalls.md)
#   bash benchmarks/h200_session.sh bf16bound # the same profiles of the table's bf16 stage 1
#                                           # at M5 and M3 (ncu_M5_table*, ncu_M3_table*)
#   bash benchmarks/h200_session.sh balance # balanced splits (BALANCE 2): their GPU tests, the A/B
#                                           # against the table at the launches of one dispatch
#                                           # round, lengths spread and equal (ab_balance_*.json;
#                                           # with AB_BASE's tree too when carried: *_base_*),
#                                           # per-kernel times and CTA timelines at spread
#                                           # lengths (kt_*_spread.json) and the table's at equal
#                                           # lengths, M2 M3 M5 and H16 B32 L 512 / 1k (kt_*_equal.json)
#   bash benchmarks/h200_session.sh timeline # CTA timelines with each CTA's phases (Q landed, loop
#                                           # done, output stored): the table at equal lengths and
#                                           # both at spread lengths, M2 M3, and one request's
#                                           # 2 CTAs alone (kt_*.json)
#   bash benchmarks/h200_session.sh splitscores # swap-AB with SPLIT_SCORES: GPU tests, CTAs alone
#                                           # and M2's timeline (kt_*.json), the A/B beside plain
#                                           # swap-AB, the table and the seesaw (ab_split_scores.json)
#   bash benchmarks/h200_session.sh fewrows # H16 q2 (and q1): swap-AB (plain, SPLIT_SCORES,
#                                           # SWAPAB_BLOCKS) and the seesaw, one request in one CTA
#                                           # of 2-16 blocks (kt_one_*.json), the A/B at B 8-24 and
#                                           # M2 (ab_fewrows.json)
#   bash benchmarks/h200_session.sh lean    # swap-AB with LEAN_SOFTMAX 1 / 2: the A/B at M2 and
#                                           # the swap-AB table shapes (ab_lean.json), the GPU
#                                           # tests of the swap-AB schedules, one request in one
#                                           # CTA of 2, 8 and 16 blocks (kt_one_lean*.json)
#   bash benchmarks/h200_session.sh leangrid # LEAN_SOFTMAX 1 / 2 against the table at the grid's
#                                           # swap-AB points and at B 8 / 16, two runs in two
#                                           # processes (ab_lean_grid_run1.json, _run2.json)
#   bash benchmarks/h200_session.sh leanbw  # LEAN_SOFTMAX where each CTA's share of HBM is the
#                                           # H200's at M2 even on an H100: one split per request,
#                                           # 64-128 CTAs of 16 blocks (ab_lean_bw.json), one
#                                           # request's CTA alone with 1 and 2 + SPLIT_SCORES
#                                           # (kt_one_*_equal.json), then leangrid's run 1
#   bash benchmarks/h200_session.sh grid    # the balanced grid (GRID): its GPU tests beside the
#                                           # swap-AB and balance ones, then the A/B against the
#                                           # table at ragged (uniform in [qlen, L]) and equal
#                                           # lengths, two runs (ab_grid_{spread,equal}_run*.json)
#   bash benchmarks/h200_session.sh gridfm  # FlashMLA built, then per-kernel times of the table and
#                                           # of GRID beside FlashMLA's at ragged and equal lengths
#                                           # (kt_fm_{table,grid}_{spread,equal}.json), the serving
#                                           # step with a GRID engine (serving_step_grid.json)
#   bash benchmarks/h200_session.sh gridkt  # per kernel and CTA timelines of the table and GRID at
#                                           # M2, H16 q2 B16 / B128 equal and B64 spread, then the
#                                           # A/B of REQUEST_COST and S2_BLOCK_S (ab_grid_cost_*.json)
#   bash benchmarks/h200_session.sh gridcheck # GRID's GPU tests, its A/B against the table at
#                                           # ragged and equal lengths and its timelines with the
#                                           # segment boundaries, one call
#   bash benchmarks/h200_session.sh wsalign # the split workspace's rows 513 against 528 floats wide
#                                           # (32-byte aligned partial rows): the table and GRID at
#                                           # the split shapes, equal and ragged, then the CTA
#                                           # timelines of both at M2 (the store, the boundary),
#                                           # then the GPU tests of wider workspace rows
#   bash benchmarks/h200_session.sh merge2  # the merge behind the swap-AB stage 1: the Gluon GPU tests
#                                           # (-m gpu: 150 s without it ran out on an H100),
#                                           # the A/B of stage 2's keys (S2_BLOCK_S, S2_BLOCK_DV,
#                                           # s2_num_warps, PDL) at the swap-AB launches that split
#                                           # (ab_merge2.json), LEAN_SOFTMAX 0 beside the table there
#                                           # (ab_lean.json), then M1-M7 beside FlashMLA built
#                                           # from .flashmla/ (decode_verify_flashmla.json)
#   bash benchmarks/h200_session.sh flashcol # FlashMLA built from .flashmla/, then M1-M7 beside it
#                                           # (decode_verify_flashmla.json) and the serving step
#                                           # at B 32 / 128, qlen 2, with its FlashMLA engine
#                                           # (serving_step.json): the issue's final-run columns
#   bash benchmarks/h200_session.sh fixedcost # where H16's gap to FlashMLA lies: both sides per
#                                           # kernel at M2-M6 and H16 q2 B32 over L 1k-8k (each
#                                           # side's intercept and slope, kt_flashmla.json), M2's
#                                           # CTA timeline (kt_table_equal.json), then Nsight
#                                           # Compute's duration, SM-active spread and bytes of
#                                           # every kernel of both at M2 (ncu_m2_gap.csv)
#   bash benchmarks/h200_session.sh abtree  # AB_BASE (default .ab_base: carry it) against this
#                                           # tree in one process, decode grid + encoder, with
#                                           # the same-vs-same floor (ab_tree.py, ~4-6 min)
# Env: MLA_OPS_COMMIT=<hash> (the copy on the device has no .git: the JSON's env.commit),
# SWEEP_BUDGET (s, default 210), RESUME=<sweep log> (keep its measurements), SUITE_TIMEOUT (s).
# Carry .whl (expecttest) for the test suite.
set -u
OUT=${OUT:-/tmp/mla_out}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# Multi-GPU machines of this workplace: NVLink multicast stays off (NCCL, PyTorch, NVSHMEM).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
[ -n "${MLA_OPS_COMMIT:-}" ] || echo "note: MLA_OPS_COMMIT unset: the JSON's env.commit will be null"

test_() {
  python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 \
    || { echo "extension build failed:"; tail -20 "$OUT/build.log"; }
  timeout "${SUITE_TIMEOUT:-330}" python3 -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-14}" \
    tests 2>&1 | tee "$OUT/pytest.log" | tail -25
  timeout 90 python3 -m mla_ops 2>&1 | tee "$OUT/main.log"
}
suite() {
  python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 \
    || { echo "extension build failed:"; tail -20 "$OUT/build.log"; }
  for seed in ${SEEDS:-11 22}; do
    MLA_OPS_TEST_SEED=$seed timeout "${SUITE_TIMEOUT:-330}" python3 -m pytest -q -p no:cacheprovider \
      -n "${PYTEST_WORKERS:-14}" tests 2>&1 | tee "$OUT/pytest_seed$seed.log" | tail -12
  done
  timeout 90 python3 -m mla_ops 2>&1 | tee "$OUT/main.log"
}
flashmla() {  # the dense sm_90 extension only (about 2 minutes), importable from .flashmla/src
  [ -d .flashmla/src ] || { echo "no .flashmla/: FlashMLA is left out"; return 0; }
  ( export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 \
      NVCC_THREADS=2 FLASH_MLA_DISABLE_SM100=1 FLASH_MLA_DISABLE_FP16=1
    export PATH=$CUDA_HOME/bin:$PATH
    eval "$(python3 .flashmla/host_env.py "$PWD/.flashmla/src/build/linkdir")"
    cd .flashmla/src && FLASHMLA_EXT=dense timeout 420 python3 setup_sm90.py build_ext --inplace \
      -t build/tmp_dense -b build/lib_dense > "$OUT/build_flashmla.log" 2>&1 ) \
    && export PYTHONPATH=$PYTHONPATH:$PWD/.flashmla/src \
    || { echo "FlashMLA build failed:"; tail -15 "$OUT/build_flashmla.log"; }
}
eager() {
  flashmla
  timeout 300 python3 benchmarks/eager_launch.py --rounds 3 --json "$OUT/eager_launch.json" 2>&1 | tail -40
}
e2e() {  # the serving step with its FlashMLA engine (built from .flashmla/ when present)
  flashmla
  timeout 240 python3 benchmarks/serving_step_e2e.py --batches ${E2E_BATCHES:-32 128} --qlens 2 4 \
    ${E2E_VARIANT:+--variant "$E2E_VARIANT"} --json "$OUT/serving_step.json" 2>&1 | tail -12
}
bench() {
  timeout 150 python3 benchmarks/benchmark_decode_verify.py --shape all --check \
    --json "$OUT/decode_verify.json" 2>&1 | tail -14
  timeout 150 python3 benchmarks/benchmark_vit_prefill_attn.py --shape all --ceilings \
    --json "$OUT/prefill.json" 2>&1 | tail -10
}
tune() {
  budget=${SWEEP_BUDGET:-210}
  timeout $((budget + 60)) python3 benchmarks/sweep_decode_verify.py --quick --budget-s "$budget" \
    ${RESUME:+--resume "$RESUME"} --write "$OUT/sm_90.json" --log "$OUT/sweep_log.json" 2>&1 | tail -25
  if [ -s "$OUT/sm_90.json" ]; then cp "$OUT/sm_90.json" mla_ops/decode_verify/tables/sm_90.json; fi
  bench
}
towers() {
  timeout 300 python3 benchmarks/vit_towers_e2e.py --images 4 --rep-ms 100 \
    --json "$OUT/vit_towers_e2e.json" 2>&1 | tail -6
}

bound() {
  gluon='{"family": "gluon", "name": "mufu"}'
  for shape in P2 P7; do  # one replay of the kernel, after the warmup launches
    timeout 240 ncu --clock-control none --kernel-name regex:prefill_fwd_ws --launch-skip 3 \
      --launch-count 1 --section ComputeWorkloadAnalysis --section WarpStateStats \
      --section InstructionStats -o "$OUT/ncu_$shape" -f python3 benchmarks/ab_prefill.py \
      --shape "$shape" --variant "$gluon" --sdpa --rounds 1 --rep-ms 5 >> "$OUT/ncu.log" 2>&1 \
      && ncu --import "$OUT/ncu_$shape.ncu-rep" --page raw --csv > "$OUT/ncu_$shape.csv" \
      && rm -f "$OUT/ncu_$shape.ncu-rep" || { echo "ncu at $shape failed:"; tail -5 "$OUT/ncu.log"; }
  done
  timeout 360 python3 benchmarks/ab_prefill.py --shape P2 P3 P7 P8 C7 --graph --sdpa cudnn flash \
    --variant "$gluon" '{"family": "gluon", "EXP2_FMA": 2, "name": "fma-half"}' \
    '{"family": "gluon", "EXP2_FMA": 4, "name": "fma-quarter"}' \
    '{"family": "gluon", "EXP2_ABLATE": 1, "check": false, "name": "exp2-ablated"}' \
    --json "$OUT/ab_exp2.json" 2>&1 | tail -40
}

stage1_ncu() {  # $1 name, $2 shape, $3 cache, $4 variant: one Gluon stage 1 under Nsight Compute,
  # its sections (ncu_<name>.txt), its SASS with the warps' stall samples (ncu_<name>_sass.csv)
  # and where each partition waits (ncu_<name>_stalls.md, benchmarks/ncu_stalls.py)
  timeout 200 ncu --clock-control none --kernel-name regex:_verify_stage1 --launch-skip 4 \
    --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section MemoryWorkloadAnalysis_Tables --section SchedulerStats \
    --section SourceCounters --import-source no -o "$OUT/ncu_$1" -f python3 \
    benchmarks/ab_decode_verify.py --shape "$2" --cache "$3" --variant "$4" --rounds 1 \
    --replays 5 >> "$OUT/ncu.log" 2>&1 \
    && ncu --import "$OUT/ncu_$1.ncu-rep" --page details > "$OUT/ncu_$1.txt" \
    && ncu --import "$OUT/ncu_$1.ncu-rep" --page source --print-source sass --csv \
      > "$OUT/ncu_$1_sass.csv" \
    && python3 benchmarks/ncu_stalls.py "$OUT/ncu_$1_sass.csv" > "$OUT/ncu_$1_stalls.md" \
    && rm -f "$OUT/ncu_$1.ncu-rep" || { echo "ncu ($1) failed:"; tail -5 "$OUT/ncu.log"; }
}

fp8bound() {  # where an fp8 cache's time goes beside a bf16 one on the same shapes
  timeout 150 python3 benchmarks/ab_decode_verify.py --shape M4 M7 --cache fp8 bf16 --rounds 3 \
    --json "$OUT/ab_fp8_bf16.json" 2>&1 | tail -10
  stage1_ncu M7_fp8 M7 fp8 '{}'
  stage1_ncu M7_bf16_alt M7 bf16 '{"SCHEDULE":"alt"}'
}

bf16bound() {  # the table's bf16 Gluon stage 1 where FlashMLA leads most: H128 (M5) and H16 (M3)
  stage1_ncu M5_table M5 bf16 '{}'
  stage1_ncu M3_table M3 bf16 '{}'
}

kt() {  # CTA timelines: $1 name, $2 variant, $3 spread|equal, $4.. --shape / --case (kt_<name>_<lens>.json)
  local name=$1 variant=$2 lens=$3; shift 3
  timeout 75 python3 benchmarks/kernel_times.py "$@" $([ $lens = spread ] && echo --spread) \
    --calls 10 --timeline --variant "$variant" --json "$OUT/kt_${name}_$lens.json" 2>&1 | grep -v Warn
}

timeline() {  # where a CTA's time goes: the table's and BALANCE's timelines with phases
  kt table '{}' equal --shape M2 M3 --case 16,2,32,512 16,2,32,1024
  kt table '{}' spread --shape M2 M3
  kt balance '{"BALANCE": 2}' spread --shape M2 M3
  # one request, 2 CTAs: the same CTAs with no other CTA streaming beside them
  kt alone_swapab '{"family": "gluon", "SCHEDULE": "swapab"}' equal --case 16,2,1,512 16,2,1,4096
  kt alone_seesaw '{"family": "gluon", "SCHEDULE": "seesaw", "STAGE_OUT": 1}' equal --case 16,4,1,512 16,4,1,4096
}

splitscores() {  # swap-AB with SPLIT_SCORES: its GPU tests, then one request's CTAs alone (the
  # per-block cost without other CTAs streaming), M2's timeline, and the A/B beside plain
  # swap-AB, the table and the 64-row seesaw at the shapes of <= 32 rows per request
  timeout 240 python3 -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-14}" tests/test_gluon_verify.py \
    -k "swapab or split_scores" 2>&1 | tee "$OUT/gpu_tests_split_scores.txt" | tail -4
  local plain='{"family": "gluon", "SCHEDULE": "swapab"}'
  local split='{"family": "gluon", "SCHEDULE": "swapab", "SPLIT_SCORES": 1}'
  kt alone_swapab "$plain" equal --case 16,2,1,512 16,1,1,512 16,2,1,4096
  kt alone_split "$split" equal --case 16,2,1,512 16,1,1,512 16,2,1,4096
  kt split "$split" equal --shape M2
  timeout 300 python3 benchmarks/ab_decode_verify.py --shape M2 --case 16,2,16,32768 16,1,32,4096 \
    16,1,128,4096 16,2,128,4096 32,1,32,4096 16,2,1,8192 --variant "$plain" "$split" '{}' \
    '{"family": "gluon", "SCHEDULE": "seesaw", "STAGE_PRODUCERS": 1, "STAGE_OUT": 1, "NAMED_EXCHANGE": 1}' \
    --rounds 3 --json "$OUT/ab_split_scores.json" 2>&1 | tail -40
}

fewrows() {  # requests of <= 32 rows (H16 q1 / q2): the schedules' rate per CTA where HBM does
  # not bind (one request in one CTA of 2, 8 and 16 blocks: the slope is a block's period, the
  # intercept the fill; B 8, 16, 24: an H100 CTA of B 24 has the HBM share of an H200 CTA of
  # M2's B 32) and at M2
  local plain='"family": "gluon", "SCHEDULE": "swapab"'
  local split='"family": "gluon", "SCHEDULE": "swapab", "SPLIT_SCORES": 1'
  local blocks='"family": "gluon", "SCHEDULE": "swapab", "SWAPAB_BLOCKS": 1'
  local seesaw='"family": "gluon", "SCHEDULE": "seesaw", "STAGE_PRODUCERS": 1, "NAMED_EXCHANGE": 1'
  local v
  for v in plain split blocks seesaw; do
    kt "one_$v" "{${!v}, \"SPLIT_WORK\": 1000000}" equal --case 16,2,1,128 16,2,1,512 16,2,1,1024
  done
  timeout 300 python3 benchmarks/ab_decode_verify.py --shape M2 --case 16,2,8,4096 16,2,16,4096 16,2,24,4096 \
    16,1,24,4096 --variant "{$plain}" "{$split}" "{$blocks}" "{$seesaw}" "{$seesaw, \"STAGE_OUT\": 1}" \
    --rounds 3 --json "$OUT/ab_fewrows.json" 2>&1 | tail -40
}

lean() {  # the swap-AB softmax's reductions off the block's chain (LEAN_SOFTMAX): the A/B first
  # (it checks each variant against the reference), then the GPU tests, then one request's CTA
  timeout 200 python3 benchmarks/ab_decode_verify.py --shape M2 --case 16,1,32,4096 16,2,128,4096 \
    16,2,16,32768 32,1,32,4096 --variant '{}' '{"LEAN_SOFTMAX": 1}' '{"LEAN_SOFTMAX": 2}' \
    '{"LEAN_SOFTMAX": 2, "SPLIT_SCORES": 1}' --rounds 3 --json "$OUT/ab_lean.json" 2>&1 | tail -30
  timeout 120 python3 -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-14}" tests/test_gluon_verify.py \
    -k "swapab or lean" 2>&1 | tee "$OUT/gpu_tests_lean.txt" | tail -4
  local v
  for v in 0 2; do  # one request, one CTA: the slope over 2, 8, 16 blocks is a block's period
    kt "one_lean$v" "{\"family\": \"gluon\", \"SCHEDULE\": \"swapab\", \"LEAN_SOFTMAX\": $v, \"SPLIT_WORK\": 1000000}" \
      equal --case 16,2,1,128 16,2,1,512 16,2,1,1024
  done
}

leangrid() {  # the table's swap-AB launches (bf16 H16 q1 / q2 from 129 rows, H32 q1) with LEAN_SOFTMAX
  local run
  for run in 1 2; do
    timeout 150 python3 benchmarks/ab_decode_verify.py --shape M2 --case 16,1,32,4096 16,1,128,4096 \
      16,2,128,4096 16,1,16,32768 16,2,16,32768 16,2,8,4096 16,2,16,4096 32,1,32,4096 \
      --variant '{}' '{"LEAN_SOFTMAX": 1}' '{"LEAN_SOFTMAX": 2}' --rounds 3 \
      --json "$OUT/ab_lean_grid_run$run.json" 2>&1 | tail -36
  done
}

leanbw() {  # a CTA's block period where HBM does not set it: on an H100 (3.0 TB/s) 64-96 CTAs
  # get the share per CTA that the H200's 4.3 TB/s gives M2's 128; the table's points after
  timeout 150 python3 benchmarks/ab_decode_verify.py --case 16,2,64,1024 16,2,96,1024 16,2,128,1024 \
    --variant '{"splits": 1}' '{"splits": 1, "LEAN_SOFTMAX": 1}' '{"splits": 1, "LEAN_SOFTMAX": 2}' \
    '{"splits": 1, "LEAN_SOFTMAX": 2, "SPLIT_SCORES": 1}' --rounds 3 --json "$OUT/ab_lean_bw.json" 2>&1 | tail -24
  kt one_lean1 '{"family": "gluon", "SCHEDULE": "swapab", "LEAN_SOFTMAX": 1, "SPLIT_WORK": 1000000}' \
    equal --case 16,2,1,128 16,2,1,512 16,2,1,1024
  kt one_lean2split '{"family": "gluon", "SCHEDULE": "swapab", "LEAN_SOFTMAX": 2, "SPLIT_SCORES": 1, "SPLIT_WORK": 1000000}' \
    equal --case 16,2,1,128 16,2,1,512 16,2,1,1024
  timeout 150 python3 benchmarks/ab_decode_verify.py --shape M2 --case 16,1,32,4096 16,1,128,4096 \
    16,2,128,4096 16,1,16,32768 16,2,16,32768 16,2,8,4096 16,2,16,4096 32,1,32,4096 \
    --variant '{}' '{"LEAN_SOFTMAX": 1}' '{"LEAN_SOFTMAX": 2}' --rounds 3 \
    --json "$OUT/ab_lean_grid_run1.json" 2>&1 | tail -36
}

balance() {  # the A/Bs first (each checks its variants against the reference before timing)
  ab() {  # $1 spread|equal, $2 file tag; PYTHONPATH may put another tree's mla_ops first
    timeout 150 python3 benchmarks/ab_decode_verify.py --shape M2 M3 M4 M7 --case 16,2,16,32768 \
      128,2,16,32768 $([ $1 = spread ] && echo --spread) --variant '{}' '{"BALANCE": 2}' --rounds 3 \
      --json "$OUT/ab_balance_$2.json" 2>&1 | tail -30
  }
  ab spread spread
  kt balance '{"BALANCE": 2}' spread --shape M2 M3 --case 16,2,16,32768
  kt table '{}' spread --shape M2 M3 --case 16,2,16,32768
  if [ -f "${AB_BASE:-.ab_base}/mla_ops/__init__.py" ]; then  # the same A/B on another tree's kernels
    PYTHONPATH="${AB_BASE:-.ab_base}:$PYTHONPATH" ab spread base_spread
  fi
  timeout 150 python3 -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-14}" tests/test_decode_verify.py \
    tests/test_gluon_verify.py -k "balance or balanced" 2>&1 | tee "$OUT/gpu_tests_balance.txt" | tail -4
  kt table '{}' equal --shape M2 M3 M5 --case 16,2,32,512 16,2,32,1024
  ab equal equal
}

merge2() {
  cases="16,1,32,4096 16,1,16,32768 16,2,16,32768 16,2,8,4096 16,2,16,4096 16,2,32,1024 32,1,32,4096"
  timeout 250 python3 -m pytest -q -p no:cacheprovider -n 14 -m gpu tests/test_gluon_verify.py 2>&1 \
    | tail -4 | tee "$OUT/gpu_tests_gluon.txt"
  timeout 200 python3 benchmarks/ab_decode_verify.py --shape M2 --case $cases --variant '{}' \
    '{"S2_BLOCK_S": 4}' '{"S2_BLOCK_DV": 256}' '{"S2_BLOCK_DV": 128}' '{"s2_num_warps": 2}' \
    '{"PDL": 1}' '{"PDL": 1, "S2_BLOCK_DV": 128}' --rounds 3 --json "$OUT/ab_merge2.json" 2>&1 | tail -60
  timeout 120 python3 benchmarks/ab_decode_verify.py --shape M2 --case $cases 16,1,128,4096 \
    16,2,128,4096 --variant '{"LEAN_SOFTMAX": 0}' '{}' --rounds 3 --json "$OUT/ab_lean.json" 2>&1 | tail -24
  flashmla_column
}
flashmla_column() {  # FlashMLA built, then M1-M7 beside it
  flashmla
  timeout 150 python3 benchmarks/benchmark_decode_verify.py --shape all --check \
    --json "$OUT/decode_verify_flashmla.json" 2>&1 | tail -14
}
flashcol() {
  flashmla_column
  timeout 200 python3 benchmarks/serving_step_e2e.py --batches 32 128 --qlens 2 \
    --json "$OUT/serving_step.json" 2>&1 | tail -12
}
grid() {  # the balanced grid (GRID): its GPU tests and the swap-AB / balance ones it shares code
  # with, then A/Bs against the table at serving's ragged lengths and at equal ones, two runs
  timeout 300 python3 -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-14}" -m gpu tests/test_gluon_verify.py \
    tests/test_checked_mode.py tests/test_decode_verify.py -k "grid or swapab or balance or H16-q2-B3" 2>&1 \
    | tee "$OUT/gpu_tests_grid.txt" | tail -6
  local run
  for run in 1 2; do
    timeout 120 python3 benchmarks/ab_decode_verify.py --case 16,2,32,4096 16,2,64,4096 16,2,128,4096 \
      16,1,128,4096 --spread --variant '{}' '{"GRID": 1}' '{"GRID": 1, "REQUEST_COST": 4}' --rounds 3 \
      --json "$OUT/ab_grid_spread_run$run.json" 2>&1 | tail -12
    timeout 120 python3 benchmarks/ab_decode_verify.py --shape M2 --case 16,1,32,4096 16,1,128,4096 \
      16,2,128,4096 16,2,16,32768 16,2,16,4096 --variant '{}' '{"GRID": 1}' --rounds 3 \
      --json "$OUT/ab_grid_equal_run$run.json" 2>&1 | tail -14
  done
}
gridkt() {  # where the balanced grid's time goes: per kernel and CTA timelines beside the table's
  kt table '{}' equal --shape M2 --case 16,2,16,4096 16,2,128,4096
  kt grid '{"GRID": 1}' equal --shape M2 --case 16,2,16,4096 16,2,128,4096
  kt table '{}' spread --case 16,2,64,4096
  kt grid '{"GRID": 1}' spread --case 16,2,64,4096
  local lens
  for lens in spread equal; do  # the request cost and the merge's slots a step
    timeout 120 python3 benchmarks/ab_decode_verify.py --shape M2 --case 16,2,16,4096 16,2,64,4096 16,2,128,4096 \
      16,1,128,4096 $([ $lens = spread ] && echo --spread) --variant '{}' '{"GRID": 1, "REQUEST_COST": 4}' \
      '{"GRID": 1, "REQUEST_COST": 4, "S2_BLOCK_S": 16}' '{"GRID": 1, "REQUEST_COST": 8, "S2_BLOCK_S": 16}' \
      --rounds 3 --json "$OUT/ab_grid_cost_$lens.json" 2>&1 | grep -v Warn | tail -26
  done
}
gridcheck() {  # the balanced grid's GPU tests, then its A/B against the table and its CTA timelines
  # with the segment boundaries marked
  timeout 200 python3 -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-14}" -m gpu tests/test_gluon_verify.py \
    tests/test_checked_mode.py -k "grid or swapab-lean1" 2>&1 | tee "$OUT/gpu_tests_grid.txt" | tail -4
  local lens
  for lens in spread equal; do
    timeout 150 python3 benchmarks/ab_decode_verify.py --shape M2 --case 16,2,16,4096 16,2,64,4096 16,2,128,4096 \
      16,1,128,4096 $([ $lens = spread ] && echo --spread) --variant '{}' '{"GRID": 1, "REQUEST_COST": 4}' \
      --rounds 3 --json "$OUT/ab_grid_$lens.json" 2>&1 | grep -v Warn | tail -15
  done
  kt grid '{"GRID": 1, "REQUEST_COST": 4}' equal --shape M2 --case 16,2,16,4096
  kt grid '{"GRID": 1, "REQUEST_COST": 4}' spread --case 16,2,64,4096 16,2,128,4096
}
wsalign() {  # the split workspace's row width: 513 floats (rows 4-byte aligned) against 528 (32-byte)
  local g='{"GRID": 1, "REQUEST_COST": 4' w='"logits_cols": 528}'
  timeout 150 python3 benchmarks/ab_decode_verify.py --shape M1 M2 M7 --case 16,2,16,4096 \
    --variant '{}' "{$w" "$g}" "$g, $w" --rounds 3 --json "$OUT/ab_wsalign_equal.json" 2>&1 | grep -v Warn | tail -22
  timeout 90 python3 benchmarks/ab_decode_verify.py --shape M2 --case 16,2,64,4096 --spread \
    --variant '{}' "{$w" "$g}" "$g, $w" --rounds 3 --json "$OUT/ab_wsalign_spread.json" 2>&1 | grep -v Warn | tail -11
  kt wsalign_table "{$w" equal --shape M2
  kt wsalign_grid "$g, $w" equal --shape M2
  timeout 120 python3 -m pytest -q -p no:cacheprovider -n 4 -m gpu tests/test_decode_verify.py -k wider 2>&1 \
    | tee "$OUT/gpu_tests_wsalign.txt" | tail -3
}
gridfm() {  # the balanced grid beside FlashMLA: per kernel at ragged and equal lengths (the table
  # and GRID, each with FlashMLA's kernels in its process), then the serving step with a GRID engine
  flashmla
  local v tag
  for tag in table grid; do
    v='{}'; [ $tag = grid ] && v='{"GRID": 1}'
    timeout 100 python3 benchmarks/kernel_times.py --case 16,2,32,4096 16,2,64,4096 16,2,128,4096 16,1,128,4096 \
      --spread --calls 10 --flashmla --variant "$v" --json "$OUT/kt_fm_${tag}_spread.json" 2>&1 | grep -v Warn | tail -14
    timeout 100 python3 benchmarks/kernel_times.py --shape M2 --case 16,2,128,4096 --calls 10 --flashmla \
      --variant "$v" --json "$OUT/kt_fm_${tag}_equal.json" 2>&1 | grep -v Warn | tail -8
  done
  timeout 200 python3 benchmarks/serving_step_e2e.py --batches 32 128 --qlens 2 --variant '{"GRID": 1}' \
    --json "$OUT/serving_step_grid.json" 2>&1 | tail -12
}
fixedcost() {
  flashmla
  timeout 150 python3 benchmarks/kernel_times.py --flashmla --shape M2 M3 M5 M6 --case 16,2,32,1024 \
    16,2,32,2048 16,2,32,8192 16,1,32,4096 --calls 10 --json "$OUT/kt_flashmla.json" 2>&1 | grep -v Warn
  kt table '{}' equal --shape M2
  timeout 150 ncu --clock-control none --kernel-name regex:"verify|flash|mla" --launch-count 14 \
    --metrics gpu__time_duration.sum,sm__cycles_active.avg,sm__cycles_active.min,sm__cycles_active.max,\
sm__cycles_elapsed.max,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,launch__grid_size,\
launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
    --csv --page raw python3 benchmarks/kernel_times.py --flashmla --shape M2 --calls 1 \
    > "$OUT/ncu_m2_gap.csv" 2> "$OUT/ncu.log" || { echo "ncu failed:"; tail -5 "$OUT/ncu.log"; }
  python3 - "$OUT/ncu_m2_gap.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if rows:
    head, body = rows[0], rows[2:]
    want = ("Kernel Name", "gpu__time_duration.sum", "launch__grid_size", "sm__cycles_active.avg",
            "sm__cycles_active.min", "sm__cycles_active.max", "dram__bytes_read.sum", "lts__t_bytes.sum")
    keep = [head.index(w) for w in want if w in head]
    for r in body:
        print(" | ".join(f"{head[i]}={r[i][:40]}" for i in keep))
PY
}
abtree() {
  base=${AB_BASE:-.ab_base}
  [ -f "$base/mla_ops/__init__.py" ] || { echo "no $base/mla_ops: carry it (run tool: carry)"; return 2; }
  timeout 480 python3 benchmarks/ab_tree.py --base-tree "$base" --same \
    --json "$OUT/ab_tree.json" 2>&1 | tail -80
}

case "${1:-test}" in
test) test_ ;;
bench) bench ;;
tune) tune ;;
towers) towers ;;
suite) suite ;;
eager) eager ;;
e2e) e2e ;;
flashmla) flashmla ;;
abtree) abtree ;;
merge2) merge2 ;;
flashcol) flashcol ;;
fixedcost) fixedcost ;;
grid) grid ;;
gridfm) gridfm ;;
gridcheck) gridcheck ;;
wsalign) wsalign ;;
gridkt) gridkt ;;
balance) balance ;;
timeline) timeline ;;
splitscores) splitscores ;;
fewrows) fewrows ;;
lean) lean ;;
leangrid) leangrid ;;
leanbw) leanbw ;;
bound) bound ;;
fp8bound) fp8bound ;;
bf16bound) bf16bound ;;
*) echo "usage: bash benchmarks/h200_session.sh test|bench|tune|towers|suite|eager|e2e|flashmla|abtree|merge2|flashcol|fixedcost|grid|gridfm|gridcheck|wsalign|gridkt|balance|timeline|splitscores|fewrows|lean|leangrid|leanbw|bound|fp8bound|bf16bound" >&2
   exit 2 ;;
esac
# The device returns at most 8 files from $OUT: past that, this mode's files go into one archive
# (results_<mode>.tgz; archives of earlier modes in the same call are kept as they are).
packed=$(find "$OUT" -maxdepth 1 -type f ! -name '*.tgz' | wc -l)
if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 8 ] && [ "$packed" -gt 0 ]; then
  (cd "$OUT" && find . -maxdepth 1 -type f ! -name '*.tgz' -print0 | tar czf "results_${1:-test}.tgz" --null -T - \
    && find . -maxdepth 1 -type f ! -name '*.tgz' -delete)
  echo "$packed files packed into $OUT/results_${1:-test}.tgz (the device returns 8 files at most)"
fi
