#!/bin/bash
# The known-issue base with its probes on a lent GPU machine (written for one H100; not yet run):
#   OUT=out bash benchmarks/scripts/known_probes_gpu.sh [--timeout S] [--device cuda:0]
# Writes under $OUT/:
#   env.json         gpuparity env --json (the platform the probes ran on)
#   known.json       gpuparity known-issues --json (every entry's status, why, and probe outcome)
#   known.txt        the same run's table (--all: also why the others do not apply)
#   probes.txt       one line per entry whose probe ran: id, status, seconds, detail
#   versions.txt     torch / CUDA / cuDNN / NCCL / triton versions and the GPU
# Extra arguments go to `gpuparity known-issues` (default --timeout 120: compile probes get 3x).
# The size probes (conv3d_bf16_large, layer_norm_2pow32, ...) need 8 to 40 GiB free and say
# "not run" otherwise; the whole run takes a few minutes on an H100.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export GPUPARITY_CACHE_DIR=${GPUPARITY_CACHE_DIR:-/tmp/gp-cache}
PY=${PY:-python3}
[ $# -gt 0 ] || set -- --timeout 120

$PY - > "$OUT/versions.txt" 2>&1 <<'EOF'
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "hip", getattr(torch.version, "hip", None))
print("cudnn", torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
try:
    print("nccl", ".".join(map(str, torch.cuda.nccl.version())))
except Exception as exc:  # noqa: BLE001
    print("nccl unknown:", exc)
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton not installed")
for index in range(torch.cuda.device_count()):
    print("device", index, torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index))
EOF
cat "$OUT/versions.txt"

$PY -m gpuparity env --json "$OUT/env.json" > /dev/null
echo "== env: exit $?"

started=$SECONDS
$PY -m gpuparity known-issues --json "$OUT/known.json" --all "$@" > "$OUT/known.txt" 2>&1
rc=$?
echo "== known-issues: exit $rc after $((SECONDS - started)) s"
grep -E "^[0-9]+ known issues:" "$OUT/known.txt"

$PY - "$OUT/known.json" > "$OUT/probes.txt" <<'EOF'
import json, sys
document = json.load(open(sys.argv[1]))
for result in document["results"]:
    outcome = result.get("probe_outcome")
    if outcome:
        print(f"{result['id']:32s} {result['status']:15s} {outcome.get('duration_s', 0):7.1f} s  "
              f"{outcome.get('detail', '')[:300]}")
EOF
cat "$OUT/probes.txt"
exit $rc
