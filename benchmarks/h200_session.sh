#!/usr/bin/env bash
# Everything that needs the H200, in the order one device call can afford it.
#   bash benchmarks/h200_session.sh tune   # sweep the verify table, then benchmark both kernels
#   bash benchmarks/h200_session.sh test   # GPU test suite with the extension built, main job
#   bash benchmarks/h200_session.sh all    # sweep, then the suite and the benchmarks on its table
# Env: RESUME=<sweep log> resumes a sweep, SWEEP_BUDGET (s), SUITE_TIMEOUT (s), SKIP_PREFILL=1.
# Run from the repo root on the device (torch and triton of the image, no install: PYTHONPATH=.);
# results land in $OUT. Carry .whl (expecttest) for the test suite.
set -u
source "$(dirname "$0")/_device_env.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

sweep() {
  budget=${SWEEP_BUDGET:-210}
  # RESUME=path/to/sweep_log.json: keep an earlier run's measurements, measure only what is new
  timeout $((budget + 60)) python3 benchmarks/sweep_decode_verify.py --quick --budget-s "$budget" \
    ${RESUME:+--resume "$RESUME"} --write "$OUT/sm_90.json" --log "$OUT/sweep_log.json" 2>&1 | tail -25
  if [ -s "$OUT/sm_90.json" ]; then cp "$OUT/sm_90.json" mla_ops/decode_verify/tables/sm_90.json; fi
}
suite() {
  python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { echo "extension build failed:"; tail -20 /tmp/build.log; }
  python3 -c "import mla_ops.library as L; print('mla_ops._C:', L.EXTENSION)"
  timeout ${SUITE_TIMEOUT:-330} python3 -m pytest -q -p no:cacheprovider -n 8 tests 2>&1 | tee "$OUT/pytest.log" | tail -15
  timeout 90 python3 -m mla_ops 2>&1 | tee "$OUT/main.log"
}
benches() {
  timeout 150 python3 benchmarks/benchmark_decode_verify.py --shape all --check \
    --json "$OUT/decode_verify.json" 2>&1 | tail -12
  if [ -z "${SKIP_PREFILL:-}" ]; then
    timeout 120 python3 benchmarks/benchmark_vit_prefill_attn.py --shape all --ceilings \
      --json "$OUT/prefill.json" 2>&1 | tail -10
  fi
}

case "${1:-test}" in
all)
  sweep
  suite
  benches
  ;;
tune)
  sweep
  benches
  ;;
test)
  suite
  ;;
esac
