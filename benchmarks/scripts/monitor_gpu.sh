#!/usr/bin/env bash
# The monitor's GPU record in one run: the planted Qwen2 (cuDNN NaN grad_q caught), `gpuparity
# explain` on it, and the overhead at every=100 on bench_model.py's Llama step. Writes $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-out/monitor}
mkdir -p "$OUT"
{ python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; } > "$OUT/versions.txt" 2>&1
timeout 150 python3 benchmarks/monitor_demo.py --out "$OUT/demo" 2>&1 | grep -v USDT | tee "$OUT/demo.txt"
timeout 60 python3 "$OUT/demo/repro/repro.py" > "$OUT/demo/repro-run.txt" 2>&1; echo "repro exit $?" >> "$OUT/demo/repro-run.txt"; cat "$OUT/demo/repro-run.txt"
timeout 120 python3 -m gpuparity explain benchmarks/monitor_demo.py:planted_qwen2 --dtype bfloat16 --json "$OUT/explain.json" 2>&1 | grep -v USDT | tee "$OUT/explain.txt"
timeout 300 python3 benchmarks/bench_monitor.py --out "$OUT/overhead" 2>&1 | grep -v USDT | tee "$OUT/overhead.txt"
