#!/bin/bash
# Sixth session's GPU runs. STEPS picks (default "tests,variants,rope"):
#   tests     kernel/op/drop-in tests at GPU sizes (TESTS; default the rotary, norm, op and nn tests)
#   variants  rotary tile sizes A/B in one process beside torch.compile (benchmarks/rope_variants.py)
#   rope      gpuparity bench rope with every peer (the recorded table)
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
