#!/usr/bin/env bash
# gpuparity doctor on a lent GPU (default level, timed), then the trace/workload script.
# Everything lands in $OUT as at most 8 files: doctor.txt, doctor.json, doctor.html,
# tw.tar.gz (the trace/workload outputs), versions.txt.
#   OUT=out/gpu bash benchmarks/scripts/gpu_doctor.sh
set -u
OUT=${OUT:-out/gpu_doctor}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 GPUPARITY_CACHE_DIR=/tmp/gpuparity-cache
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)"; } > "$OUT/versions.txt" 2>&1
start=$(date +%s)
timeout ${DOCTOR_LIMIT:-330} python3 -m gpuparity doctor --json "$OUT/doctor.json" --html "$OUT/doctor.html" \
  --stream /tmp/doctor-stream.jsonl > "$OUT/doctor.txt" 2>&1
rc=$?
echo "doctor exit code $rc, wall $(( $(date +%s) - start )) s (command: gpuparity doctor --json doctor.json --html doctor.html)" | tee -a "$OUT/doctor.txt" "$OUT/versions.txt"
if [ ! -s "$OUT/doctor.json" ] && [ -s /tmp/doctor-stream.jsonl ]; then cp /tmp/doctor-stream.jsonl "$OUT/doctor-stream.jsonl"; fi
tail -60 "$OUT/doctor.txt"
if [ "${SKIP_TW:-0}" != 1 ]; then
  mkdir -p /tmp/tw && OUT=/tmp/tw timeout ${TW_LIMIT:-240} bash benchmarks/scripts/gpu_trace_workload.sh > /dev/null 2>&1
  echo "trace/workload exit $?"; tar -czf "$OUT/tw.tar.gz" -C /tmp tw; cat /tmp/tw/summary.json 2>/dev/null | head -80
fi
