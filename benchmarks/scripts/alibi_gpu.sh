#!/bin/bash
# ALiBi in the Triton attention kernels on a GPU: the benchmark (benchmarks/bench_alibi.py), then the
# ALiBi tests and the ALiBi cases of the dense/varlen flash_attn tests on the device. OUT: where logs go.
#   OUT=out bash benchmarks/scripts/alibi_gpu.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 110 python3 benchmarks/bench_alibi.py --rounds 3 --composed \
    --shapes llm-4k,bert,s2k-d128-causal --json "$OUT/alibi.jsonl" 2>&1 | tee "$OUT/bench.log"
pip install -q --no-deps .wheels/*.whl 2>/dev/null
GPUPARITY_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -n 8 -p no:cacheprovider \
    tests/backends/test_triton_attention_alibi.py tests/flash_attn/test_flash_attn_dense.py \
    tests/flash_attn/test_flash_attn_varlen.py -k "alibi or lse" 2>&1 | tail -40 | tee "$OUT/tests.log"
