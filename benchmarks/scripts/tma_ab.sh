#!/bin/bash
# The dk/dv kernel through tensor descriptors (GPUPARITY_ATTENTION_TMA) against the pointer kernel,
# on the dense suite's shapes that take the two-launch backward, one process per shape:
#   OUT=out bash benchmarks/scripts/tma_ab.sh            -> $OUT/tma_ab.log, $OUT/tma_variants.json
# The first shape (llm-8k) also times the descriptor forward/dk-dv variants of attention_tma.py.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd benchmarks
python3 attention_tma.py --shape 2,16,8192,128 --fwd 128x64x8x3 --dkdv 64x64x4x2,64x64x4x3 \
    --json "$OUT/tma_variants.json" 2>&1 | grep -v Warning | tee "$OUT/tma_ab.log"
# llm-4k (D=64) and a shorter D=128 case (tiles.tma_backward: D >= 64, q_len * k_len >= 1024^2)
for shape in 4,16,4096,64 8,16,1024,128; do
  echo "== $shape" | tee -a "$OUT/tma_ab.log"
  python3 attention_tma.py --shape "$shape" --fwd "" --dkdv "" 2>&1 | grep -v Warning | tee -a "$OUT/tma_ab.log"
done
