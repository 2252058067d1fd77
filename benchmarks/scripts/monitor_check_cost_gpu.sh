#!/usr/bin/env bash
# The monitor's per-check cost on a GPU, then its step overhead (bench_monitor.py) with every due
# sample checked and with the default safety net. Writes $OUT (7 files). PARTS picks what runs
# (default "cost none default"; each bench_monitor.py run takes about 2-3 minutes on an H100).
# SRC: the gpuparity source tree to measure (default src; e.g. an older commit's, unpacked with
# `git archive <commit> src | tar -x -C before/` and SRC=before/src, for a before / after).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=${SRC:-src}
OUT=${OUT:-out/monitor-cost}
PARTS=${PARTS:-cost none default}
mkdir -p "$OUT"
{ python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"; echo "SRC=${SRC:-src}"; git log --oneline -1; date -u; } > "$OUT/versions.txt" 2>&1
for part in $PARTS; do
  case "$part" in
    cost)      # one layer of the benchmark's model at its sizes, the monitor's default slicing
      timeout 200 python3 benchmarks/scripts/monitor_check_cost.py --device cuda --dtype bf16 --layers 1 \
        --hidden 2048 --heads 16 --kv-heads 4 --vocab 32000 --seq 2048 --batch 2 --slice-rows-above 65536 \
        --slice-attention-above 4194304 --repeat 9 --threads 4 --json "$OUT/cost.json" 2>&1 | grep -v USDT | tee "$OUT/cost.txt" ;;
    none|default)
      timeout ${MON_TIMEOUT:-280} python3 benchmarks/bench_monitor.py --rounds "${ROUNDS:-6}" --steps "${STEPS:-15}" \
        --max-overhead "$part" --out "$OUT/$part" 2>&1 | grep -v USDT | tee "$OUT/$part.txt" ;;
    *) echo "unknown part $part" ;;
  esac
done
