#!/usr/bin/env bash
# gpuparity doctor on a lent GPU (default level), timed twice: a cold run (empty Triton and
# probe caches, as on a fresh machine) and a warm second run, then optionally the
# trace/workload script. Everything lands in $OUT as at most 8 files: doctor.txt, doctor.json,
# doctor.html (the cold run), doctor_warm.txt, versions.txt, tw.tar.gz.
#   OUT=out/gpu bash benchmarks/scripts/gpu_doctor.sh        (SKIP_TW=1 skips trace/workload)
set -u
OUT=${OUT:-out/gpu_doctor}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
# Fresh caches: Triton's compiled kernels and gpuparity's probe verdicts.
export TRITON_CACHE_DIR=$(mktemp -d) GPUPARITY_CACHE_DIR=$(mktemp -d)
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc;
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)"; } > "$OUT/versions.txt" 2>&1
for run in cold warm; do
  start=$(date +%s)
  if [ $run = cold ]; then
    timeout ${DOCTOR_LIMIT:-330} python3 -m gpuparity doctor --json "$OUT/doctor.json" --html "$OUT/doctor.html" \
      --stream /tmp/doctor-stream.jsonl > "$OUT/doctor.txt" 2>&1
    rc=$?; txt="$OUT/doctor.txt"
  else
    timeout ${DOCTOR_LIMIT:-330} python3 -m gpuparity doctor > "$OUT/doctor_warm.txt" 2>&1
    rc=$?; txt="$OUT/doctor_warm.txt"
  fi
  echo "doctor ($run caches) exit code $rc, wall $(( $(date +%s) - start )) s (command: gpuparity doctor)" | tee -a "$txt" "$OUT/versions.txt"
done
if [ ! -s "$OUT/doctor.json" ] && [ -s /tmp/doctor-stream.jsonl ]; then cp /tmp/doctor-stream.jsonl "$OUT/doctor-stream.jsonl"; fi
tail -40 "$OUT/doctor.txt"; tail -8 "$OUT/doctor_warm.txt"
if [ "${SKIP_TW:-0}" != 1 ]; then
  mkdir -p /tmp/tw && OUT=/tmp/tw timeout ${TW_LIMIT:-240} bash benchmarks/scripts/gpu_trace_workload.sh > /dev/null 2>&1
  echo "trace/workload exit $?"; tar -czf "$OUT/tw.tar.gz" -C /tmp tw; cat /tmp/tw/summary.json 2>/dev/null | head -80
fi
