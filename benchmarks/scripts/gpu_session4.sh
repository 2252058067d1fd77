#!/bin/bash
# Fourth session's GPU runs. STEPS picks (default "tests,host,att"):
#   tests  the kernel/op/drop-in tests at GPU sizes (pytest-xdist wheels carried in .wheels/)
#   host   host time per attention fwd+bwd step, previous code (.ab_prev/src) vs this tree,
#          three alternating rounds (benchmarks/host_overhead.py)
#   att    gpuparity bench attention on the short shapes, eager and in CUDA graphs
#   sweep  the norm backward sweep with and without prefetching (benchmarks/tune_norm_bwd.py)
#   normab the shipped norm backward, previous code vs this tree, three alternating rounds
#   norm   gpuparity bench norm and rope
#   tuneatt the attention tile sweep (TUNE_ARGS; default: the backward at head dim 128, llm-8k)
#   OUT=out STEPS=... bash benchmarks/scripts/gpu_session4.sh
set -uo pipefail
source "$(dirname "$0")/lib.sh"
start_run tests,host,att session4.tar.gz
if [[ $STEPS == *,tuneatt,* ]]; then
  step tuneatt "${TUNE_LIMIT:-240}" env PYTHONPATH=src python3 benchmarks/tune_attention.py ${TUNE_ARGS:---buckets 128 --kernels dkdv,dq --recent} \
      --budget-s "${TUNE_BUDGET:-200}" --json "$W/tune_att.json"
  cp "$W/tuneatt.log" "$OUT/tuneatt.txt"
fi
if [[ $STEPS == *,tests,* ]]; then
  gpu_tests "tests/backends/test_triton_attention.py tests/ops/test_attention.py tests/backends/test_triton_norms.py tests/ops/test_cuda_graphs.py tests/nn"
fi
if [[ $STEPS == *,host,* ]]; then
  for round in 1 2 3; do
    for side in prev new; do
      src=src; [ $side = prev ] && src=.ab_prev/src
      PYTHONPATH=$src timeout 120 python3 benchmarks/host_overhead.py --label "$side" --backends triton,cudnn >> "$W/host.jsonl" 2>> "$W/host.err"
    done
  done
  echo "== host: $(wc -l < "$W/host.jsonl") lines" | tee -a "$OUT/steps.txt"
  cp "$W/host.jsonl" "$OUT/host.jsonl"; tar -czf "$OUT/$TAR" -C "$W" .
fi
export PYTHONPATH="$PWD/src"
if [[ $STEPS == *,att,* ]]; then
  step att "${ATT_LIMIT:-220}" python3 -m gpuparity bench attention --shapes "${ATT_SHAPES:-aam-nuc,aam-asv,bert}" --pad 0,0.25 \
      --backends math,cudnn,flex,triton --graph --json "$W/att.json" --markdown "$W/att.md" --plot "$W/att.png"
  cp "$W/att.md" "$OUT/att.md" 2>/dev/null
fi
if [[ $STEPS == *,sweep,* ]]; then
  step sweep "${SWEEP_LIMIT:-300}" python3 benchmarks/tune_norm_bwd.py --warps "${SWEEP_WARPS:-8,16}" --per-sm "${SWEEP_PER_SM:-1,2,3}" --out "$W/bwd_sweep.json"
  cp "$W/sweep.log" "$OUT/sweep.txt"
fi
if [[ $STEPS == *,normab,* ]]; then
  for round in 1 2 3; do
    for side in prev new; do
      src=src; [ $side = prev ] && src=.ab_prev/src
      echo "## $side round $round" >> "$W/normab.txt"
      PYTHONPATH=$src timeout 120 python3 benchmarks/tune_norm_bwd.py --shipped-only \
          --shapes 16384x4096,65536x1024,131072x128,8192x8192,16384x5120,32768x768 >> "$W/normab.txt" 2>&1
    done
  done
  echo "== normab done" | tee -a "$OUT/steps.txt"
  cp "$W/normab.txt" "$OUT/normab.txt"; tar -czf "$OUT/$TAR" -C "$W" .
fi
if [[ $STEPS == *,norm,* ]]; then
  step norm "${NORM_LIMIT:-150}" python3 -m gpuparity bench norm --modes fwd,fwd+bwd,fwd+bwd:graph \
      --json "$W/norm.json" --md "$W/norm.md" --plot "$W/norm.png"
  cp "$W/norm.md" "$OUT/norm.md" 2>/dev/null
  step rope "${ROPE_LIMIT:-100}" python3 -m gpuparity bench rope --modes fwd,fwd+bwd,fwd+bwd:graph \
      --json "$W/rope.json" --md "$W/rope.md" --plot "$W/rope.png"
  cp "$W/rope.md" "$OUT/rope.md" 2>/dev/null
fi
