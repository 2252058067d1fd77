#!/bin/bash
# On a lent GPU: the kernel and drop-in tests at GPU sizes, the fp32 dot comparison
# (benchmarks/fp32_dot.py, FMA "ieee" vs split-TF32 "tf32x3", each with a fresh Triton cache),
# then gpuparity doctor cold and warm (benchmarks/scripts/gpu_doctor.sh). Outputs: steps.txt,
# versions.txt, pytest.txt, fp32_dot.txt and the doctor files.
#   (SKIP_TESTS=1, SKIP_DOT=1, SKIP_DOCTOR=1 leave a part out)
#   OUT=out/x bash benchmarks/scripts/gpu_tests_fp32dot_doctor.sh      (kind: nvidia-h100-x1)
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
step() {  # step NAME LIMIT_S COMMAND...
    local name=$1 limit=$2; shift 2
    local started=$SECONDS
    timeout -k 10 "$limit" "$@" > "$OUT/$name.txt" 2>&1
    echo "== $name: exit $? after $((SECONDS - started)) s: $*" | tee -a "$OUT/steps.txt"
}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # pytest-xdist, when its wheels were carried in .wheels/ (the lent machines have no network):
  # the kernels' first compiles then run side by side. test_aot compiles for other targets on
  # the CPU: CI runs it; it proves nothing more on a GPU machine.
  XDIST=""
  if ls .wheels/pytest_xdist-*.whl > /dev/null 2>&1 && pip install -q --no-deps .wheels/*.whl > /dev/null 2>&1; then
    XDIST="-n ${TEST_WORKERS:-8}"
  fi
  step pytest "${TEST_LIMIT:-240}" env GPUPARITY_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider $XDIST \
      tests/backends tests/nn tests/ops --ignore=tests/backends/test_aot.py
  tail -3 "$OUT/pytest.txt"
fi
if [ "${SKIP_DOT:-0}" != 1 ]; then
  for choice in ieee tf32x3; do
    TRITON_CACHE_DIR=$(mktemp -d) GPUPARITY_FP32_DOT=$choice timeout -k 10 180 python3 benchmarks/fp32_dot.py \
        >> "$OUT/fp32_dot.txt" 2>&1
    echo "== fp32_dot $choice: exit $?" | tee -a "$OUT/steps.txt"
  done
  cat "$OUT/fp32_dot.txt"
fi
[ "${SKIP_DOCTOR:-0}" = 1 ] && exit 0
OUT="$OUT" SKIP_TW=1 bash benchmarks/scripts/gpu_doctor.sh > "$OUT/gpu_doctor_log.txt" 2>&1
echo "== doctor: exit $?" | tee -a "$OUT/steps.txt"
grep -h "exit code\|time:" "$OUT/versions.txt" "$OUT/doctor.txt" "$OUT/doctor_warm.txt" 2>/dev/null
tail -30 "$OUT/doctor.txt"
gzip -f "$OUT/doctor.json" 2>/dev/null; rm -f "$OUT/doctor.html" "$OUT/gpu_doctor_log.txt"
