#!/usr/bin/env bash
# Issue 31 items 3-4 on a GPU in one run: the first auto calls with an empty probe cache
# (bench_first_call.py), then bench_model.py's rounds (eager and compiled, 2048 and 4096, sdpa /
# attn_implementation="gpuparity" / gpuparity.patch / Liger) with the first-steps rows. Writes $OUT.
# Liger-Kernel travels as a wheel in .whl (carry it); without it Liger's rows say it is absent.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/first-call-model}
ROUNDS=${ROUNDS:-2}
DEADLINE=${DEADLINE:-400}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:src || export PYTHONPATH=src
else
  export PYTHONPATH=src
fi
{ python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u; } > "$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"
timeout 150 python3 benchmarks/bench_first_call.py --device cuda --repeats ${FIRST_CALL_REPEATS:-3} --src src \
  --json "$OUT/first-call.json" 2>&1 | tee "$OUT/first-call.txt"
timeout $((DEADLINE + 200)) python3 benchmarks/bench_model.py --out "$OUT/model" --rounds "$ROUNDS" --first-steps \
  --deadline-s "$DEADLINE" --child-timeout 240 ${MODEL_ARGS:-} 2>&1 | tee "$OUT/model.txt" | tail -60
