#!/bin/bash
# Fifth session's GPU runs. STEPS picks (default "hostbd,ropeab"):
#   tests   kernel/op/drop-in tests at GPU sizes (TESTS; pytest-xdist wheels carried in .wheels/)
#   hostbd  where the host time of a small norm / RoPE step goes (benchmarks/host_breakdown.py)
#   ropeab  gpuparity bench rope, previous code (.ab_prev/src) vs this tree, two alternating
#           rounds, triton only; then this tree's triton beside torch.compile
#   ropesw  the rotary tile sweep (benchmarks/tune_norms_rope.py --only rope)
#   normh   host time per norm step at hidden 128, previous vs this tree, three alternating rounds
# (the full norm / rope benchmarks with every peer: STEPS=norm bash benchmarks/scripts/gpu_session4.sh)
#   OUT=out STEPS=... bash benchmarks/scripts/gpu_session5.sh
set -uo pipefail
source "$(dirname "$0")/lib.sh"
start_run hostbd,ropeab session5.tar.gz
if [[ $STEPS == *,tests,* ]]; then
  gpu_tests "tests/backends/test_triton_rotary.py tests/backends/test_triton_norms.py tests/ops tests/nn"
fi
if [[ $STEPS == *,hostbd,* ]]; then
  step hostbd 120 env PYTHONPATH=src python3 benchmarks/host_breakdown.py --profile
  cp "$W/hostbd.log" "$OUT/hostbd.txt"
fi
ROPE_ARGS="--layouts half,interleaved,varlen --modes fwd,fwd+bwd,fwd+bwd:graph --rep-ms 50"
if [[ $STEPS == *,ropeab,* ]]; then
  for round in 1 2; do
    for side in prev new; do
      src=src; [ $side = prev ] && src=.ab_prev/src
      step "rope_${side}_$round" 150 env PYTHONPATH=$src python3 -m gpuparity bench rope --backends triton $ROPE_ARGS \
          --md "$W/rope_${side}_$round.md"
    done
  done
  step rope_compile 200 env PYTHONPATH=src python3 -m gpuparity bench rope --backends triton,compile $ROPE_ARGS \
      --md "$W/rope_compile.md"
  cat "$W"/rope_*.md > "$OUT/ropeab.md"
fi
if [[ $STEPS == *,ropesw,* ]]; then
  step ropesw 200 env PYTHONPATH=src python3 benchmarks/tune_norms_rope.py --only rope --out "$W/rope_sweep.json"
  cp "$W/rope_sweep.json" "$OUT/rope_sweep.json"; cp "$W/ropesw.log" "$OUT/ropesw.txt"
fi
if [[ $STEPS == *,normh,* ]]; then
  for round in 1 2 3; do
    for side in prev new; do
      src=src; [ $side = prev ] && src=.ab_prev/src
      PYTHONPATH=$src timeout 120 python3 benchmarks/host_overhead.py --norms --label "$side" >> "$W/normh.jsonl" 2>> "$W/normh.err"
    done
  done
  echo "== normh: $(wc -l < "$W/normh.jsonl") lines" | tee -a "$OUT/steps.txt"
  cp "$W/normh.jsonl" "$OUT/normh.jsonl"; tar -czf "$OUT/$TAR" -C "$W" .
fi
