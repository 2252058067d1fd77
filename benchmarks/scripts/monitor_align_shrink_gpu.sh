#!/usr/bin/env bash
# One device call for three records: the monitor with its float64 checks on the GPU (the planted
# Qwen2 still caught; the overhead at every=100 on bench_model.py's Llama step), the reduction of
# SDPA's "CUDA error: misaligned address" (benchmarks/sdpa_misaligned.py, the SDPA-CUDNN-MISALIGNED
# probe, decode's sdpa backend with the alignment fix), and the doctor's shrink + repro on cuDNN's
# pytorch#196678 failure. Writes $OUT. ONLY="demo bench" (any of demo bench align doctor) runs a subset.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src GPUPARITY_CACHE_DIR=/tmp/gpuparity-cache
OUT=${OUT:-out/h5}
mkdir -p "$OUT"
{ python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > "$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"
t0=$(date +%s); step() { echo "=== $1 at +$(( $(date +%s) - t0 )) s"; }
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }

if want demo; then
step "monitor demo (planted Qwen2, checks on the GPU)"
timeout ${LIMIT_demo:-50} python3 benchmarks/monitor_demo.py --out "$OUT/demo" 2>&1 | grep -v USDT | tee "$OUT/demo.txt" | tail -12
[ -f "$OUT/demo/repro/repro.py" ] && { timeout 30 python3 "$OUT/demo/repro/repro.py" > "$OUT/demo/repro-run.txt" 2>&1; echo "repro exit $?" >> "$OUT/demo/repro-run.txt"; tail -4 "$OUT/demo/repro-run.txt"; }
fi

if want bench; then
step "monitor overhead"
timeout ${LIMIT_bench:-130} python3 benchmarks/bench_monitor.py --rounds ${ROUNDS:-8} --steps ${STEPS:-15} --out "$OUT/overhead" 2>&1 | grep -v USDT | tee "$OUT/overhead.txt"
fi

if want align; then
step "SDPA misaligned address: reduction"
timeout ${LIMIT_align:-45} python3 benchmarks/sdpa_misaligned.py > "$OUT/misaligned.jsonl" 2> "$OUT/misaligned.err"
python3 - "$OUT/misaligned.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    print(d.get("backend"), d.get("tensor"), d.get("offset"), d.get("dtype"), "mask" if d.get("mask") else "-",
          "gqa" if d.get("gqa") else "-", "grad" if d.get("grad") else "-", f"Sq{d.get('Sq')} D{d.get('D')}",
          d.get("torch_choice"), d.get("status"), d.get("error", d.get("rel_err", "")))
EOF

step "probe sdpa_misaligned (isolated, as the engine runs it)"
timeout 40 python3 -c "
import json
from gpuparity.known.engine import run_probe
print(json.dumps(run_probe({'probe': 'sdpa_misaligned'}, 'cuda:0', 30), default=str)[:1500])" 2>&1 | tee "$OUT/probe.txt"

step "decode sdpa at an odd q offset, with the alignment fix"
timeout 40 python3 -m gpuparity check --op attention_decode --backend sdpa --dtype bfloat16 --case layouts.q_offset --device cuda:0 2>&1 | grep -v USDT | tail -8 | tee "$OUT/decode-check.txt"

timeout 40 env GPUPARITY_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider tests/known/test_sdpa_misaligned.py 2>&1 | tail -3 | tee "$OUT/align-test.txt"
fi

if want doctor; then
step "doctor shrink + repro (cuDNN)"
timeout ${LIMIT_doctor:-70} python3 -m gpuparity doctor --ops attention --backend sdpa_cudnn --dtype bf16 --no-probes --budget 55 \
    --repro-dir "$OUT/repro" --json "$OUT/doctor.json" > "$OUT/doctor.txt" 2>&1; echo "doctor exit $?" >> "$OUT/doctor.txt"
grep -v USDT "$OUT/doctor.txt" | tail -25
for script in "$OUT"/repro/*.py; do
  [ -f "$script" ] || continue
  echo "--- $script"; timeout 30 python3 "$script" > "$script.out" 2>&1; echo "exit $?" >> "$script.out"; tail -8 "$script.out"
done
fi
step "done"
