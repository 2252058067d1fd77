#!/bin/bash
# One batched GPU run for issue 46's FlashAttention surface (run from the repository root on the GPU
# machine, with .fa_src/ from fa_triton_prepare.sh and, for step fa_rotary, .fa_tests/ from
# fa_own_tests_prepare.sh carried along):
#   OUT=out STEPS="tests speed fa_rotary" bash benchmarks/scripts/fa_gpu_check.sh
# Steps (default "tests speed"), each under its own time limit, writing under $OUT (at most 6 files):
#   tests      GPU run (GPUPARITY_TEST_DEVICE=cuda: compiled Triton, no interpreter) of
#              tests/ops/test_residual_norm.py and the dynamic-shape compile and deterministic tests
#              of tests/flash_attn -> tests.log                                     (limit 90 s)
#   speed      benchmarks/fa_triton_speed.py (gpuparity.flash_attn vs FlashAttention's Triton kernels)
#              -> fa_triton_speed.md, fa_triton_speed.json, speed.log               (limit 150 s)
#   fa_rotary  FlashAttention's tests/test_rotary.py::test_rotary_emb_qkv (its compiled cases: the
#              dynamic-shape failure) under install(), a covering sample of 12 of its 48 cases
#              (every parameter value, compiled=True among them; needs einops) -> fa_rotary.log
#                                                                                  (limit 150 s)
set -uo pipefail
OUT=${OUT:?set OUT to the output folder}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
for STEP in ${STEPS:-tests speed}; do
  started=$SECONDS
  case $STEP in
  tests)
    GPUPARITY_TEST_DEVICE=cuda timeout -k 10 90 $PY -m pytest -q -p no:cacheprovider -rfE \
      tests/ops/test_residual_norm.py tests/flash_attn/test_flash_attn_dynamic_compile.py \
      tests/flash_attn/test_flash_attn_deterministic.py > "$OUT/tests.log" 2>&1 ;;
  speed)
    timeout -k 10 150 $PY benchmarks/fa_triton_speed.py --fa-src .fa_src --out "$OUT" --rounds 5 --iters 20 \
      > "$OUT/speed.log" 2>&1 ;;
  fa_rotary)
    PYTHONPATH="$PWD/benchmarks/scripts:$PYTHONPATH" timeout -k 10 150 $PY -m pytest -q -p no:cacheprovider \
      -p fa_own_tests_plugin --fa-max-cases-per-test 12 --fa-deadline $(( $(date +%s) + 120 )) --fa-backend triton \
      -c /dev/null --rootdir .fa_tests \
      ".fa_tests/tests/test_rotary.py::test_rotary_emb_qkv" > "$OUT/fa_rotary.log" 2>&1 ;;
  *) echo "fa_gpu_check: unknown step $STEP (tests, speed, fa_rotary)" >&2; exit 2 ;;
  esac
  echo "$STEP rc=$? $((SECONDS - started)) s" | tee -a "$OUT/steps.txt"
done
