#!/bin/bash
# Fleet health check with NCCL on a 2-GPU machine (2x H200) and memory / kernel profiles of the
# aam workload. Run from the repository root on the GPU machine; everything goes under $OUT.
#   kind: nvidia-h200-x2     command: bash benchmarks/scripts/gpu_fleet_profile.sh
# Each step has its own time limit (sum 400 s), so the whole script ends inside 7 minutes
# even if a step hangs; a step's exit status is kept in $OUT/<step>.rc.
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
# The device returns at most 8 files: every step writes into $WORK, packed into $OUT/fleet_profile.tar.gz
# at the end; $OUT also gets summary.txt and steps.txt.
FINAL_OUT=$OUT
WORK=$(mktemp -d)
OUT=$WORK
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# NVLink multicast stays off on these shared machines (see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=python3

step() {  # step NAME LIMIT_S COMMAND...: run with a limit, log to $OUT/NAME.log, keep the status
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/steps.txt"
    local started=$SECONDS
    timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$rc" > "$OUT/$name.rc"
    echo "   exit $rc after $((SECONDS - started)) s" | tee -a "$OUT/steps.txt"
    tail -n 40 "$OUT/$name.log"
}

{ nvidia-smi; nvidia-smi topo -m; } > "$OUT/nvidia-smi.txt" 2>&1
$PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count())' \
    | tee "$OUT/versions.txt"

# (a) the fleet check: 2 ranks, NCCL, 8 B .. 256 MiB, fp32 and bf16, probes; no battery first
# (collective and probe numbers in well under a minute) ...
step fleet 60 $PY -m torch.distributed.run --standalone --nproc-per-node 2 -m gpuparity fleet \
    --no-battery --timeout 30 --all-sizes --json "$OUT/fleet.json"

# (b) memory and kernel profiles of the aam workload (user story 1's model), 20 steps, with the
# triton attention backend named (backend "auto" would first probe every backend on this fresh
# machine, which is the doctor's job, not the profile's).
step aam_memory 120 $PY -m gpuparity profile memory --json "$OUT/aam_memory.json" -- \
    python -m gpuparity workload run aam --attn triton --steps 20 --no-isolate --out "$OUT/aam_run_memory.json"
step aam_kernels 120 $PY -m gpuparity profile kernels --steps 10 --warmup 5 --top 25 --json "$OUT/aam_kernels.json" -- \
    python -m gpuparity workload run aam --attn triton --steps 20 --no-isolate --out "$OUT/aam_run_kernels.json"

# ... then the fleet check with the quick battery on every rank (last: it takes longest; a battery
# that overruns its 60 s is reported as TIMEOUT on that rank, not a stuck script).
step fleet_battery 100 $PY -m torch.distributed.run --standalone --nproc-per-node 2 -m gpuparity fleet \
    --level quick --battery-timeout 60 --timeout 20 --sizes 8,1M,256M --json "$OUT/fleet_battery.json"

$PY - "$OUT" <<'PYEOF' | tee "$OUT/summary.txt"
import json, os, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None
for name in ("fleet.json", "fleet_battery.json"):
    rep = load(name)
    if not rep:
        print(name, "missing"); continue
    s = rep["summary"]
    print(name, s["status"], "exit", s["exit_code"], "suspects", s["suspect_ranks"], "medians", s["medians"])
    for row in rep["ranks"]:
        p = row.get("probes", {})
        print("  rank", row["rank"], row["status"], row.get("device_name"), "battery", row.get("battery", {}).get("status"),
              "matmul TFLOP/s", p.get("matmul", {}).get("tflops"), "copy GB/s", p.get("copy", {}).get("gbps"))
    for c in rep["collectives"]:
        if c["bytes"] >= (1 << 27) or c["wrong"]:
            print("  %-14s %-8s %10d B  wrong %d  algbw %s  busbw %s" % (c["collective"], c["dtype"], c["bytes"], c["wrong"],
                  c["algbw_gbps"] and round(c["algbw_gbps"], 1), c["busbw_gbps"] and round(c["busbw_gbps"], 1)))
mem = load("aam_memory.json")
if mem:
    print("aam memory: peak allocated %.0f MiB, reserved %.0f MiB, utilisation %s" % (
        (mem["peak_allocated_bytes"] or 0) / 2**20, (mem["peak_reserved_bytes"] or 0) / 2**20, mem["utilisation"]))
    for ph in mem["phases"]:
        print("  %-16s calls %4d  peak alloc %8.1f MiB" % (ph["name"], ph["calls"], (ph["peak_allocated_bytes"] or 0) / 2**20))
ker = load("aam_kernels.json")
if ker:
    print("aam kernels:", ker.get("error") or "%d steps, %.3f ms/step (%s)" % (ker["steps_profiled"], ker["total_time_per_step_us"] / 1e3, ker["time_basis"]))
    for k in ker.get("top", [])[:10]:
        print("  %5.1f%%  %8.3f ms/step  %s" % (100 * k["share"], k["time_per_step_us"] / 1e3, k["name"][:90]))
PYEOF
cp "$WORK/summary.txt" "$WORK/steps.txt" "$FINAL_OUT/" 2>/dev/null
tar -czf "$FINAL_OUT/fleet_profile.tar.gz" -C "$WORK" .
