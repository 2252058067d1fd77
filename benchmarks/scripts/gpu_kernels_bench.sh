#!/bin/bash
# Host-overhead diagnosis and the kernel benchmarks (attention short shapes, norms, RoPE) on a
# lent GPU. Each step has its own limit; outputs are packed so that at most 8 files come back.
#   OUT=out/k bash benchmarks/scripts/gpu_kernels_bench.sh        (kind: nvidia-h100-x1)
# ATT_SHAPES picks the attention shapes (default: the host-bound short ones).
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 GPUPARITY_CACHE_DIR=/tmp/gp-cache
W=$(mktemp -d)
step() {  # step NAME LIMIT_S COMMAND...
    local name=$1 limit=$2; shift 2
    local started=$SECONDS
    timeout -k 10 "$limit" "$@" > "$W/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - started)) s: $*" | tee -a "$OUT/steps.txt"
}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)"; } > "$OUT/versions.txt" 2>&1
step diag 150 python3 benchmarks/diag_launch.py
cp "$W/diag.log" "$OUT/diag.txt"
step att 200 python3 -m gpuparity bench attention --shapes "${ATT_SHAPES:-aam-nuc,aam-asv,bert}" --pad 0,0.25 \
    --backends math,efficient,cudnn,flex,triton --json "$W/att.json" --markdown "$W/att.md" --plot "$W/att.png"
step norm 120 python3 -m gpuparity bench norm --json "$W/norm.json" --md "$W/norm.md" --plot "$W/norm.png"
step rope 90 python3 -m gpuparity bench rope --json "$W/rope.json" --md "$W/rope.md" --plot "$W/rope.png"
tar -czf "$OUT/kernels_bench.tar.gz" -C "$W" .
cat "$OUT/diag.txt"; cat "$W"/att.md "$W"/norm.md "$W"/rope.md 2>/dev/null | grep -v "^$" | head -150
