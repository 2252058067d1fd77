#!/usr/bin/env bash
# The compiled first 3 training steps of the patched Llama against the unpatched one, with the
# switches of the compiled path A/B'd in one call (benchmarks/records/h100/first-steps-2026-12-06.md:
# 28.55 s patched vs 20.73 s unpatched, 1.38x; target 1.2x). The record's model and settings: an
# EMPTY gpuparity cache per run, gpuparity imported after the model was built, one process per run,
# Triton's cache warmed first by one eager patched run; here every compiled run also gets an empty
# inductor cache of its own (--fresh-inductor-cache: each run cold, none warmed by the one before).
# Variants, alternated (the second repeat in reverse order):
#   unpatched   torch.compile(model), transformers' sdpa
#   patched     gpuparity.patch(model) as shipped (the checks a trace waits for queued first)
#   warm        + GPUPARITY_WORKER_WARM=1: the checking workers set the GPU up before READY
#   warm-opaque + GPUPARITY_COMPILED_KERNELS=opaque: the graph calls the opaque ops, whose bodies
#               launch the kernels Triton's cache already holds (inductor compiles none of ours)
# Writes $OUT: versions.txt, bytecode.txt, warm.txt, ab.txt, ab.json. About 400 s on an H100
# (a compiled run takes 40-50 s); a run that would end past BUDGET s is not started (ab.txt says so).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/first-steps-ab}
BUDGET=${BUDGET:-405}
REPEATS=${REPEATS:-2}
VARIANTS=${VARIANTS:-unpatched,patched,warm,warm-opaque}
mkdir -p "$OUT"
export PYTHONPATH=src
START=$(date +%s)
M="--device cuda --dtype bf16 --layers 8 --hidden 2048 --heads 16 --kv-heads 4 --seq 2048 --vocab 32000 --late-import"
{ python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"; nproc; date -u; git log --oneline -1 2>/dev/null; } > "$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"
# whether this machine keeps Python bytecode (a worker's start imports sympy: 3.8 s where it has none)
python3 - > "$OUT/bytecode.txt" 2>&1 <<'EOF'
import importlib.util, os, sys, sympy, torch
for module in (sympy, torch):
    cached = importlib.util.cache_from_source(module.__file__)
    print(module.__name__, "bytecode cached:", os.path.exists(cached), "| package dir writable:",
          os.access(os.path.dirname(module.__file__), os.W_OK))
print("dont_write_bytecode:", sys.flags.dont_write_bytecode, "| pycache_prefix:", sys.pycache_prefix,
      "| TRITON_CACHE_DIR:", os.environ.get("TRITON_CACHE_DIR"), "| TORCHINDUCTOR_CACHE_DIR:",
      os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
EOF
cat "$OUT/bytecode.txt"
# Triton's cache warmed as in the record: one eager patched run whose first calls wait
timeout 170 python3 benchmarks/first_steps_breakdown.py $M --variants patched --repeats 1 --first-calls wait \
  --timeout 160 > "$OUT/warm.txt" 2>&1
tail -3 "$OUT/warm.txt"
LEFT=$((BUDGET - ($(date +%s) - START)))
echo "warm-up done after $(( $(date +%s) - START )) s; $LEFT s left for the compiled runs"
timeout $((LEFT + 30)) python3 benchmarks/first_steps_breakdown.py $M --compile --fresh-inductor-cache \
  --compile-times --repeats "$REPEATS" --variants "$VARIANTS" --timeout 150 --budget-s "$LEFT" \
  --define warm:GPUPARITY_WORKER_WARM=1 \
  --define warm-opaque:GPUPARITY_WORKER_WARM=1,GPUPARITY_COMPILED_KERNELS=opaque \
  --json "$OUT/ab.json" 2>&1 | tee "$OUT/ab.txt" | grep -E "repeat|median|not run|waited|READY|step 0|compile: (_compile|async|aot_trace)"
echo "total $(( $(date +%s) - START )) s"
