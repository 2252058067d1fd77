#!/bin/bash
# Sixth session's GPU runs. STEPS picks (default "tests,variants,rope"):
#   tests     kernel/op/drop-in tests at GPU sizes (TESTS; default the rotary, norm, op and nn tests)
#   variants  rotary tile sizes A/B in one process beside torch.compile (benchmarks/rope_variants.py)
#   rope      gpuparity bench rope with every peer (the recorded table)
#   decode    host time of the small norm / RoPE pieces (benchmarks/host_breakdown.py), previous code
#             (.ab_prev/src) vs this tree, three alternating rounds: int-offset decode calls
#   OUT=out STEPS=... bash benchmarks/scripts/gpu_session6.sh
set -uo pipefail
source "$(dirname "$0")/lib.sh"
start_run tests,variants,rope session6.tar.gz
if [[ $STEPS == *,tests,* ]]; then
  gpu_tests "tests/backends tests/ops tests/nn"
fi
if [[ $STEPS == *,variants,* ]]; then
  step variants 240 env PYTHONPATH=src python3 benchmarks/rope_variants.py --rounds 3 --out "$W/variants.jsonl"
  cp "$W/variants.jsonl" "$OUT/variants.jsonl"; tail -14 "$W/variants.log" > "$OUT/variants.txt"
fi
if [[ $STEPS == *,rope,* ]]; then
  step rope 150 env PYTHONPATH=src python3 -m gpuparity bench rope --modes fwd,fwd+bwd,fwd+bwd:graph \
      --json "$W/rope.json" --md "$W/rope.md" --plot "$W/rope.png"
  cp "$W/rope.md" "$W/rope.json" "$W/rope.png" "$OUT/" 2>/dev/null
fi
if [[ $STEPS == *,decode,* ]]; then
  [ -d .ab_prev/src ] || { echo "== decode: no .ab_prev/src (the previous code to compare)" | tee -a "$OUT/steps.txt"; exit 2; }
  for round in 1 2 3; do
    for side in prev new; do
      src=src; [ $side = prev ] && src=.ab_prev/src
      echo "{\"side\": \"$side\", \"round\": $round}" >> "$W/decode.jsonl"
      PYTHONPATH=$src timeout 120 python3 benchmarks/host_breakdown.py 2>> "$W/decode.err" | head -1 >> "$W/decode.jsonl"
      PYTHONPATH=$src python3 -c "import gpuparity; print('$side', gpuparity.__file__)" >> "$W/decode.err" 2>&1
    done
  done
  echo "== decode: $(wc -l < "$W/decode.jsonl") lines" | tee -a "$OUT/steps.txt"
  cp "$W/decode.jsonl" "$OUT/decode.jsonl"; tar -czf "$OUT/$TAR" -C "$W" .
fi
