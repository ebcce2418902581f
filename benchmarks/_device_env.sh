# Sourced by the h200_*.sh device scripts: $OUT, PYTHONPATH on the source tree (no install on
# the device), and the carried wheels (.whl: expecttest for the test suite).
OUT=${OUT:-/tmp/mla_out}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1 && [ -z "${MLA_WHEELS_DONE:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site MLA_WHEELS_DONE=1
fi
