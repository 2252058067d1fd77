#!/bin/bash
# The kernel benchmarks on a lent GPU: attention (short shapes by default), norms and RoPE,
# each also timed with the step captured in a CUDA graph (the kernels without per-call host
# overhead); optionally gpuparity doctor cold and warm first (DOCTOR_FIRST=1: a fresh
# machine's first run), and the host-overhead diagnosis (DIAG=1). Each step has its own
# limit; the benchmark outputs are packed after every step, so a run cut short still returns
# what it measured (the device returns at most 8 files).
#   OUT=out/k [DOCTOR_FIRST=1] [DIAG=1] bash benchmarks/scripts/gpu_kernels_bench.sh   (kind: nvidia-h100-x1)
# ATT_SHAPES picks the attention shapes (default: the host-bound short ones).
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "${DOCTOR_FIRST:-0}" = 1 ]; then
  OUT="$OUT" SKIP_TW=1 bash benchmarks/scripts/gpu_doctor.sh > /dev/null 2>&1
  gzip -f "$OUT/doctor.json" 2>/dev/null; rm -f "$OUT/doctor.html"
  grep -h "exit code\|time:" "$OUT/doctor.txt" "$OUT/doctor_warm.txt"
fi
export GPUPARITY_CACHE_DIR=/tmp/gp-cache
W=$(mktemp -d)
TAR=kernels_bench.tar.gz
source "$(dirname "$0")/lib.sh"
versions
if [ "${DIAG:-0}" = 1 ]; then
  step diag 150 python3 benchmarks/diag_launch.py
  cp "$W/diag.log" "$OUT/diag.txt"
fi
step att "${ATT_LIMIT:-220}" python3 -m gpuparity bench attention --shapes "${ATT_SHAPES:-aam-nuc,aam-asv,bert}" --pad 0,0.25 \
    --backends math,efficient,cudnn,flex,triton --graph --json "$W/att.json" --markdown "$W/att.md" --plot "$W/att.png"
step norm "${NORM_LIMIT:-150}" python3 -m gpuparity bench norm --modes fwd,fwd+bwd,fwd+bwd:graph \
    --json "$W/norm.json" --md "$W/norm.md" --plot "$W/norm.png"
step rope "${ROPE_LIMIT:-100}" python3 -m gpuparity bench rope --modes fwd,fwd+bwd,fwd+bwd:graph \
    --json "$W/rope.json" --md "$W/rope.md" --plot "$W/rope.png"
cat "$W"/att.md "$W"/norm.md "$W"/rope.md 2>/dev/null | grep -v "^$" | head -150
